//! The transaction layer: flush groups, commits, the redo log, recovery and as-of reads.
//!
//! Changes collect in the active `Overlay`. A commit freezes it (readers still see it), writes
//! data extents and copy-on-write tree nodes to free space, flushes, writes the superblock
//! copy for the new sequence number, flushes again, and only then publishes the new root.
//! `sync_log` (fsync) appends the pending changes to the redo log instead of committing.
//!
//! Locking: `state` is held only for in-memory work. An operation runs as a `Tx` that reads
//! tree nodes from the cache only; on a miss it stops, the lock is released, the node is
//! read, and the operation is retried with the node pinned. `commit_lock` serializes commits
//! and log appends with each other (it is the only lock held across device I/O, and no
//! ordinary operation takes it).

mod copies;
mod extent;
mod mirror;
mod overlay;
mod shadow;
mod tx;

pub use extent::{decode_extent, encode_extent};
pub use mirror::{MirrorReport, MirrorState, PRUNED_KEY};
pub use overlay::{Dirty, Overlay, Pending, Value};
pub use tx::{Found, Tx};

use crate::btree::commit::{apply, CommitContext, Mutation};
use crate::btree::{self, Loader, Need, Root, Stop};
use crate::cache::BlockCache;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::leaf::ElementView;
use crate::format::log::{
    batch_bytes, encode_batch_into, BatchHead, EntryRef, LogBatch, LogEntry, LogValue, ValueRef,
    LOG_UNIT_BYTES, LOG_UNIT_LEN,
};
use crate::format::manifest;
use crate::format::node::Node;
use crate::format::record::{
    rtype, Element, ExtentRef, Key, LocalitySet, LogicalKey, Payload, Timestamp,
    DATA_INLINE_BYTES_MAX, INLINE_BYTES_MAX, VOLUME_OBJ,
};
use crate::format::spacemap;
use crate::format::superblock::{Superblock, LABEL_BYTES};
use crate::format::{
    VolumeId, BLOCK_BYTES, BLOCK_LEN, LOG_OFFSET, NODE_BYTES, SUPERBLOCK_OFFSETS, VOLUME_BYTES_MIN,
};
use crate::space::{Purpose, Space};
use crate::sync::{Mutex, MutexGuard};
use parking_lot::Condvar;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Log appends write whole pages of this size (the host's page).
const LOG_PAGE_BYTES: u64 = 4096;
/// fsync batches larger than this commit instead (data is then written once, in place).
const LOG_BATCH_BYTES_MAX: u64 = 8 << 20;
/// Longest an extent's stored bytes can be: a chunk, compressed or not, plus any codec's
/// worst-case growth, with room to spare.
const EXTENT_STORED_BYTES_MAX: u64 = 2 * crate::format::record::DATA_CHUNK_BYTES;
/// An append buffer up to this size is kept for the next append.
const SCRATCH_BYTES_MAX: usize = 4 << 20;
/// With a crash log file, the ring uses at most this much of the log region: the file's
/// pages stay allocated while the volume is busy (rewriting them is cheaper than
/// allocating them), so this is the memory it may hold.
const SHADOW_RING_BYTES_MAX: u64 = 64 << 20;
/// With a crash log file, the ring uses at least this much of the log region, however small
/// the cache budget (its largest batch is a quarter of it; larger changes commit instead).
const SHADOW_RING_BYTES_MIN: u64 = 4 << 20;
/// An fsync that would copy at least this much of the crash log into the image's log
/// region commits instead (`sync_log`).
const SYNC_COMMIT_BYTES: u64 = 1 << 20;

/// The part of the log region a writer with a crash log file uses: the file's pages are
/// memory (tmpfs, charged to the daemon's memory cgroup), so the ring takes a quarter of
/// the cache budget, between `SHADOW_RING_BYTES_MIN` and `SHADOW_RING_BYTES_MAX`. Under a
/// 256 MiB limit the 64 MiB ring alone got a proxy replay killed by the OOM killer.
fn shadow_ring_bytes(cache_bytes: u64) -> u64 {
    let bytes = (cache_bytes / 4).clamp(SHADOW_RING_BYTES_MIN, SHADOW_RING_BYTES_MAX);
    bytes / LOG_PAGE_BYTES * LOG_PAGE_BYTES
}

/// The most a commit's manifest covers: mount reads every byte of it (`format::manifest`),
/// so a commit of more writes orders them with a barrier instead. A commit of the proxy
/// replay writes a few MiB; one of a large copy can write hundreds.
const MANIFEST_COVERS_MAX: u64 = 64 << 20;
/// The most ranges a manifest lists (a block of under 2 MiB).
const MANIFEST_RANGES_MAX: usize = 1 << 16;
/// Mount reads a manifest's ranges that lie at most this far apart in one request...
const MANIFEST_READ_GAP_BYTES: u64 = 64 << 10;
/// ...of at most this many bytes.
const MANIFEST_READ_BYTES_MAX: u64 = 8 << 20;

/// Longest merged extent read.
const RUN_BYTES_MAX: u64 = 4 << 20;
/// Longest run of extents a commit writes in one request: two of a device's largest
/// requests (`max_sectors_kb`, 1280 KiB by default), so a run splits into whole ones. The
/// buffer a run is joined in for O_DIRECT then stays allocated between commits; runs of up to
/// 16 MiB allocated and dropped a buffer of 10 MiB at each commit, when its memory peaks (the
/// proxy replay's library run was killed by its 256 MiB cgroup).
const DATA_RUN_BYTES_MAX: u64 = 2560 << 10;
/// Extents of at most this size are placed as clusters (`place_clustered`): the sizes the
/// device reads around (`device::file`), so that one read brings a small file's mates.
const CLUSTER_EXTENT_BYTES_MAX: u64 = 32 << 10;
/// A cluster: the small extents a commit writes one after another, in one free range of at
/// most this size, the device's read-around window. 128 KiB holds a Hummingbird locality set
/// four times out of five (80% of them are at most 128 KB).
const CLUSTER_WINDOW_BYTES: u64 = 128 << 10;

/// Tuning of an open volume.
#[derive(Clone, Debug)]
pub struct VolumeOptions {
    /// Memory budget for cached nodes, cached file data and pending changes.
    pub cache_bytes: u64,
    /// Of the cache's half of that budget, what decoded file data may hold. Small under a
    /// FUSE mount, where the kernel's page cache holds file data. None: the split between
    /// tree nodes and file data follows use (half each to begin with; see `cache.rs`).
    pub data_cache_bytes: Option<u64>,
    /// Overwrites and deletes destroy old versions instead of keeping history.
    pub nohistory: bool,
    pub read_only: bool,
    /// Walk the tree for the free map even where the last commit wrote a space map.
    pub rebuild_space_map: bool,
    /// Every change reaches the redo log (through the host's page cache, without a flush)
    /// before the operation that made it returns, so that a crash of this process loses
    /// nothing it acknowledged. Off: only fsync and commits write the log, and a crash of
    /// the process loses the changes since the last of them (a power loss does either way).
    pub log_every_change: bool,
    /// With `log_every_change`: where the log's shadow lives (a file on tmpfs, see
    /// `shadow.rs`), so that logging a change writes nothing to the device. None: the
    /// changes go to the image's log region through the host's page cache.
    pub crash_log_file: Option<std::path::PathBuf>,
}

impl Default for VolumeOptions {
    fn default() -> VolumeOptions {
        VolumeOptions {
            cache_bytes: 256 << 20,
            data_cache_bytes: None,
            nohistory: false,
            read_only: false,
            rebuild_space_map: false,
            log_every_change: true,
            crash_log_file: None,
        }
    }
}

/// A tree root shared by readers. Space freed by the commit that replaced this root is
/// attached here and returned to the allocator when the last reader lets go.
pub struct RootRef {
    pub root: Root,
    pub tid: u64,
    /// The superblock's next object id when this root was committed: no element of the
    /// tree belongs to an object at or above it (objects are numbered when created and the
    /// commit records the next number after freezing its group; a mirror stream's elements
    /// are held to its header's number, and `check` reports any element above it). A
    /// lookup of a newer object skips the tree.
    pub next_obj: u64,
    release: Mutex<Vec<(u64, u64)>>,
    space: Arc<Space>,
}

impl Drop for RootRef {
    fn drop(&mut self) {
        for (offset, bytes) in self.release.get_mut().drain(..) {
            self.space.release_deferred(offset, bytes);
        }
    }
}

pub(crate) struct State {
    /// Objects with a live inode, pending changes included.
    pub live_objects: u64,
    pub active: Overlay,
    pub frozen: Option<Arc<Overlay>>,
    pub root: Arc<RootRef>,
    pub next_obj: u64,
    pub superblock: Superblock,
    /// What `Tx::tree_live` found under `root` (see `LiveMemo`).
    pub live_memo: std::cell::RefCell<LiveMemo>,
    /// Internal nodes of `root` its walks passed through (see `UpperNodes`).
    pub upper_nodes: std::cell::RefCell<btree::UpperNodes>,
}

/// The committed tree's live versions looked up under one root, kept until the root changes:
/// one request reads the same records several times (a file's inode at lookup, open, each
/// read and release), and each read is a walk from the root. A root's tree never changes
/// (commits write new nodes and a new root), so an answer stays right for as long as the
/// root it was found under is the state's. The memo holds that root weakly: it keeps the
/// allocation's address from being reused, not the root's blocks.
#[derive(Default)]
pub(crate) struct LiveMemo {
    root: std::sync::Weak<RootRef>,
    found: foldhash::HashMap<LogicalKey, Option<(u64, overlay::Value)>>,
}

impl LiveMemo {
    /// At most this many answers (a few hundred KiB): the memo serves repeats within a
    /// moment, not a working set, and is emptied when full.
    const ENTRIES_MAX: usize = 1024;

    /// The answer for `lk` under `root`, if this memo has one.
    pub fn get(
        &mut self,
        root: &Arc<RootRef>,
        lk: &LogicalKey,
    ) -> Option<Option<(u64, overlay::Value)>> {
        if !std::ptr::eq(self.root.as_ptr(), Arc::as_ptr(root)) {
            self.found.clear();
            self.root = Arc::downgrade(root);
            return None;
        }
        self.found.get(lk).cloned()
    }

    /// Keeps the answer for `lk` under the root of the last `get`.
    pub fn put(&mut self, lk: LogicalKey, answer: Option<(u64, overlay::Value)>) {
        if self.found.len() >= Self::ENTRIES_MAX {
            self.found.clear();
        }
        self.found.insert(lk, answer);
    }
}

/// The redo log region as a ring (`format::log`): where the next batch goes, and which
/// batches recovery may still need. Guarded by `Volume::log`; lock order is `commit_lock`,
/// then `log`, then `state`.
struct LogRing {
    /// Bytes in the region.
    size: u64,
    /// This writer's salt, recorded in each superblock it writes.
    salt: u64,
    /// Epoch of the batches written now (the TID the active group applies on top of), and
    /// the next batch's sequence number in it.
    epoch: u64,
    seq: u64,
    /// While a commit is in flight: the epoch of the frozen group's batches and how many
    /// there are, which this epoch's batches continue. 0, 0 otherwise.
    follows: u64,
    follows_count: u64,
    /// Where the next batch goes, and where this epoch's batches began.
    head: u64,
    /// The bytes of the log page that holds `head`, up to `head` (what the last append
    /// wrote there): the next append rewrites the page whole.
    page: Vec<u8>,
    epoch_start: u64,
    /// Start of the oldest batch recovery may need (the durable superblock's `log_start`):
    /// the ring never writes over `tail..head`.
    tail: u64,
    /// The frozen group holds changes no batch has (they did not fit): no operation may
    /// return until its commit is durable.
    frozen_unlogged: bool,
    /// With a shadow: the start of the page where the shadow's appends that the image's
    /// log region lacks begin (they run to `head`). None: the region has them all.
    unsynced_from: Option<u64>,
    /// The last append's buffer, for the next.
    scratch: Vec<u8>,
}

impl LogRing {
    /// Where a batch of `len` bytes can go without overwriting `tail..head`, if anywhere. A
    /// batch that does not fit before the end of the region starts again at 0. Batches are
    /// written as whole pages (`append`), so nothing may be placed in the page that holds
    /// the tail either.
    fn place(&self, len: u64) -> Option<u64> {
        let tail_page = self.tail / LOG_PAGE_BYTES * LOG_PAGE_BYTES;
        let page_end = |end: u64| end.div_ceil(LOG_PAGE_BYTES) * LOG_PAGE_BYTES;
        // Strictly below the tail: a head equal to the tail means an empty ring.
        let before_tail =
            |start: u64| start + len < self.tail && page_end(start + len) <= tail_page;
        if self.head >= self.tail {
            if self.head + len <= self.size {
                Some(self.head)
            } else {
                before_tail(0).then_some(0)
            }
        } else {
            before_tail(self.head).then_some(self.head)
        }
    }

    /// Bytes the batches recovery may need take, from the tail to the head.
    fn used(&self) -> u64 {
        (self.head + self.size - self.tail) % self.size
    }

    /// The fields of the next batch of the current epoch.
    fn batch_head(&self, next_obj: u64) -> BatchHead {
        BatchHead {
            epoch: self.epoch,
            seq: self.seq,
            next_obj,
            salt: self.salt,
            follows: self.follows,
            follows_count: self.follows_count,
        }
    }

    /// Largest batch worth logging: bigger ones (a large write) are made durable by a
    /// commit instead, which writes their data once.
    fn batch_bytes_max(&self) -> u64 {
        (self.size / 4).min(LOG_BATCH_BYTES_MAX)
    }
}

/// A group frozen for its commit: its overlay, the root it applies to, and the superblock
/// its commit starts from.
type Frozen = (Arc<Overlay>, Arc<RootRef>, Superblock);

/// A change taken from an overlay for the log: the key, what it replaces, its value (None:
/// deleted) and which of its bytes changed.
type Unlogged = (LogicalKey, u64, Option<Value>, Dirty);

/// Takes the overlay's changes not yet in the log (cheap: values are shared, not copied).
fn take_unlogged(overlay: &mut Overlay) -> Vec<Unlogged> {
    let dirty = std::mem::take(&mut overlay.log_dirty);
    dirty
        .into_iter()
        .filter_map(|(lk, dirty)| {
            let p = overlay.map.get(&lk)?;
            Some((lk, p.replaces, p.value.clone(), dirty))
        })
        .collect()
}

/// Log entries for changes taken by `take_unlogged`, borrowing their values.
fn log_entries(changes: &[Unlogged]) -> Vec<EntryRef<'_>> {
    changes
        .iter()
        .map(|(lk, replaces, value, dirty)| EntryRef {
            lk: *lk,
            replaces: *replaces,
            value: match (value, dirty) {
                (None, _) => ValueRef::Delete,
                (Some(Value::Extent(extent)), _) => ValueRef::Extent(*extent),
                (Some(Value::Bytes(v)), Dirty::Whole) => ValueRef::Put(v),
                (Some(Value::Bytes(v)), Dirty::Bytes { lo, hi }) => {
                    let hi = (*hi).min(v.len());
                    let lo = (*lo).min(hi);
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "values are at most a 64 KiB chunk (the limits of \
                                  log_entry_is_valid), and lo is at most the length"
                    )]
                    ValueRef::Splice {
                        len: v.len() as u32,
                        at: lo as u32,
                        bytes: &v[lo..hi],
                    }
                }
            },
        })
        .collect()
}

/// Puts changes taken for a batch that was not written back as needing the log, whole.
fn return_unlogged(overlay: &mut Overlay, changes: &[Unlogged]) {
    for (lk, ..) in changes {
        overlay.log_dirty.insert(*lk, Dirty::Whole);
    }
}

pub struct Volume {
    device: Arc<dyn Device>,
    volume_id: VolumeId,
    cache: BlockCache,
    space: Arc<Space>,
    state: Mutex<State>,
    /// Serialises commits (and reblock steps) with each other.
    commit_lock: Mutex<()>,
    log: Mutex<LogRing>,
    options: VolumeOptions,
    read_only: AtomicBool,
    /// Why the volume stopped taking changes, once a failure stopped it (`fail_read_only`).
    stopped: Mutex<Option<String>>,
    /// Signalled after each commit (writers waiting for memory) and to wake the committer.
    commit_signal: (parking_lot::Mutex<u64>, Condvar),
    pending_bytes_max: u64,
    stop_committer: AtomicBool,
    /// Bytes of the frozen group not yet given space by its commit. Space checks count
    /// these, not the whole frozen group, so data being written out is not counted twice
    /// (once as pending, once as allocated).
    frozen_unallocated: AtomicU64,
    /// Whether a background committer runs; without one, writers over budget commit inline.
    committer_running: AtomicBool,
    /// Whether open read the space map the last commit wrote (false: it walked the tree).
    space_map_read: bool,
    /// Log batches written, and how many of them a flush has made durable (fsync skips its
    /// flush when another caller's already covered its batch).
    log_appends: AtomicU64,
    log_flushed: AtomicU64,
    /// What commits cost and how long writers waited for them (`report`).
    counters: Counters,
    /// Where changes are logged between fsyncs, if not in the image (`shadow.rs`).
    shadow: Option<shadow::ShadowLog>,
    /// Locality hints for the next commit: an object's data goes right after the data of
    /// the object named here (`set_locality`).
    locality: Mutex<HashMap<u64, u64>>,
    /// The objects each hint group's data went to in the last commit that wrote some of it
    /// (`order_by_locality`): a later commit that adds to the group takes them along
    /// (`regroup`).
    group_members: Mutex<HashMap<u64, Vec<u64>>>,
    /// The stored bytes of the groups the last commit wrote last, by offset: a visit whose
    /// files straddled that commit finds them here when the next commit adds the rest
    /// (`regroup`), as Hummingbird's clusters waited in memory for their last members.
    recent: Mutex<HashMap<u64, (ExtentRef, Stored)>>,
    /// Whether commits report their clusters (`track_clusters`), and those reported since
    /// the last `take_clusters`: the objects whose data each cluster run holds.
    clusters_wanted: AtomicBool,
    clusters: Mutex<Vec<Vec<u64>>>,
    /// Copies of files requested for other files' sets, and where those written lie
    /// (`copies.rs`).
    copies: copies::Copies,
    /// `request_commit` was called since the last commit.
    commit_requested: AtomicBool,
    /// A mirror slave takes changes only from `mirror_write` (and prune's removals, which
    /// commit without a TID of their own).
    slave: AtomicBool,
}

/// Locality hints kept at most; past this, older ones are dropped (a hint only steers
/// placement, so losing one costs locality, never data).
const LOCALITY_HINTS_MAX: usize = 1 << 16;
/// Most bytes of data one commit moves to join their locality groups (`regroup`).
const REGROUP_BYTES_MAX: u64 = 8 << 20;
/// A group's previous set moves along with the group's new data when it holds at most this
/// many times the new data's bytes (`regroup`): moving it makes one read of what would be
/// two, and the bound keeps what a commit rewrites to a fraction of what it writes anyway.
/// On the proxy replay 2 moves a fifth less than 4 for 2% more reads, and runs faster; 1
/// reads 5% more (docs/benchmarks.md, twenty-second session).
const REGROUP_PREVIOUS_RATIO: u64 = 2;
/// Files remembered per hint group (`group_members`): a cluster window of 4 KiB files.
const GROUP_MEMBERS_MAX: usize = (CLUSTER_WINDOW_BYTES / BLOCK_BYTES) as usize;

/// Clusters kept for `take_clusters` at most; past this, the oldest are dropped (they
/// only group files for eviction).
const CLUSTERS_KEPT_MAX: usize = 1 << 16;

/// Where the redo log is read from in recovery.
#[derive(Clone, Copy)]
enum LogSource {
    Image,
    Shadow,
}

/// What one reblock step did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReblockStep {
    /// Where the next step starts; None when the pass reached the end of the tree.
    pub next: Option<Key>,
    pub extents_moved: u64,
    pub bytes_moved: u64,
    pub nodes_written: u64,
    /// Extents left in place because their checksum failed.
    pub damaged: u64,
}

/// Summary numbers for `anvil info`.
#[derive(Clone, Debug)]
pub struct Usage {
    pub volume_bytes: u64,
    pub data_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    pub committed_tid: u64,
    pub commit_time_ns: u64,
    pub created_time_ns: u64,
    pub next_obj: u64,
    pub live_objects: u64,
    pub pending_bytes: u64,
    pub cache_bytes: u64,
    pub label: String,
    pub volume_id: VolumeId,
}

fn now_ns() -> u64 {
    Timestamp::now().as_ns()
}

/// Event counts and the nanoseconds they took (`Volume::report`).
#[derive(Default)]
struct Counters {
    commits: (AtomicU64, AtomicU64),
    throttled: (AtomicU64, AtomicU64),
    log_waits: (AtomicU64, AtomicU64),
    /// Changes that found the log ring full: those that waited for the commit under way,
    /// and those that committed themselves (`log_changes`).
    log_full: ((AtomicU64, AtomicU64), (AtomicU64, AtomicU64)),
    /// Files commits moved to join their locality group (`regroup`), and their bytes.
    regrouped: (AtomicU64, AtomicU64),
    /// Copies commits wrote into other files' sets (`copies.rs`), their bytes, and reads
    /// served from one.
    copies: (AtomicU64, AtomicU64, AtomicU64),
    /// Commits (and reblock steps, mirrored commits) that put a barrier between their tree
    /// and their superblock, having written no manifest (`publish`).
    barriers: AtomicU64,
    /// Requests' questions about live records of the committed tree (`Tx::tree_live`,
    /// `Tx::span`): those that walked the tree from its root, and those the live memo
    /// answered. A count that does not move with the machine's load, unlike CPU time.
    walks: (AtomicU64, AtomicU64),
    /// Bytes written to the device, by what they hold: file data placed by commits (moved
    /// files included) or written ahead of them, tree nodes, space maps and manifests, and
    /// redo-log batches (not those a crash log file takes, nor what a mirror stream writes).
    /// Each written byte also costs the reads beside it, and a loop device's flush grows
    /// with them.
    written: BytesWritten,
}

#[derive(Default)]
struct BytesWritten {
    data: AtomicU64,
    nodes: AtomicU64,
    maps: AtomicU64,
    manifests: AtomicU64,
    log: AtomicU64,
    /// Of `data`: zeros after extents to the next block.
    padding: AtomicU64,
}

/// Adds `n` to a counter of `Counters`.
fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    fn waited(&self, counter: &(AtomicU64, AtomicU64), since: std::time::Instant) {
        let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.0.fetch_add(1, Ordering::Relaxed);
        counter.1.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl Volume {
    /// Writes a new, empty volume (the tree holds nothing; the filesystem layer adds the root
    /// directory in its first commit).
    pub fn format(device: &dyn Device, volume_bytes: u64, label: &str) -> Result<Superblock> {
        let volume_bytes = volume_bytes / BLOCK_BYTES * BLOCK_BYTES;
        if volume_bytes < VOLUME_BYTES_MIN {
            return Err(Error::Invalid(format!(
                "volume size {volume_bytes} is below the minimum of {VOLUME_BYTES_MIN} bytes"
            )));
        }
        if label.len() > LABEL_BYTES {
            return Err(Error::Invalid(format!(
                "label longer than {LABEL_BYTES} bytes"
            )));
        }
        // Every change passes through the log before its operation returns: it holds what
        // changed since the last commit, and a commit needs room for the next group's too.
        let log_bytes = (volume_bytes / 32).clamp(2 << 20, 128 << 20) / BLOCK_BYTES * BLOCK_BYTES;
        let mut label_bytes = [0u8; LABEL_BYTES];
        label_bytes[..label.len()].copy_from_slice(label.as_bytes());
        let volume_id: VolumeId = rand::random();
        let now = now_ns();
        let sb = Superblock {
            volume_id,
            seq: 0,
            volume_bytes,
            root_address: 0,
            root_level: 0,
            committed_tid: 1,
            next_tid: 2,
            next_obj: 2,
            log_offset: LOG_OFFSET,
            log_bytes,
            commit_time_ns: now,
            created_time_ns: now,
            used_bytes: 0,
            data_offset: LOG_OFFSET + log_bytes,
            label: label_bytes,
            // An empty tree: mount maps it by walking nothing.
            space_map_address: 0,
            space_map_bytes: 0,
            live_objects: 0,
            // The first writer to open the volume picks a salt and writes a superblock.
            log_start: 0,
            log_salt: 0,
            manifest_address: 0,
            manifest_bytes: 0,
            manifest_checksum: 0,
            proven: false,
        };
        sb.validate(sb.address())?;
        device.set_len(volume_bytes)?;
        // Clear the other superblock slot and the first log block so stale bytes of a
        // previous filesystem are never mistaken for ours.
        let zero = vec![0u8; BLOCK_LEN];
        device.write_at(&zero, SUPERBLOCK_OFFSETS[1])?;
        device.write_at(&zero, LOG_OFFSET)?;
        device.write_at(&sb.encode(), sb.address())?;
        device.flush()?;
        Ok(sb)
    }

    /// Reads the newest valid superblock whose commit reached the device whole: one that
    /// names a manifest is taken only once every range it lists holds what the commit
    /// wrote, else the one before it (`format::manifest`).
    pub fn read_superblock(device: &dyn Device) -> Result<Superblock> {
        let device_bytes = device.len()?;
        if device_bytes < 2 * BLOCK_BYTES {
            return Err(Error::NotAnvil(format!(
                "image is only {device_bytes} bytes"
            )));
        }
        let mut found: Vec<Superblock> = Vec::with_capacity(2);
        let mut first_error = None;
        for offset in SUPERBLOCK_OFFSETS {
            let mut buf = vec![0u8; BLOCK_LEN];
            device.read_at(&mut buf, offset)?;
            match Superblock::decode(&buf, offset) {
                Ok(sb) => found.push(sb),
                Err(e) => {
                    let has_magic = buf[..4] == crate::format::BLOCK_MAGIC.to_le_bytes();
                    if has_magic && first_error.is_none() {
                        first_error = Some(e);
                    }
                }
            }
        }
        found.sort_by_key(|sb| std::cmp::Reverse(sb.seq));
        let Some(newest) = found.first() else {
            return Err(match first_error {
                Some(e @ Error::Version { .. }) => e,
                Some(e) => Error::corrupt(
                    format!("no valid superblock ({e})"),
                    "superblocks at bytes 0 and 4096",
                ),
                None => Error::NotAnvil("no anvil superblock found".to_string()),
            });
        };
        if device_bytes < newest.volume_bytes {
            return Err(Error::corrupt(
                format!(
                    "image truncated: {device_bytes} bytes, volume needs {}",
                    newest.volume_bytes
                ),
                "device end",
            ));
        }
        let mut incomplete = None;
        for sb in found {
            match commit_is_whole(device, &sb)? {
                Ok(()) => {
                    if let Some(reason) = incomplete {
                        log::warn!(
                            "the commit of superblock {} did not reach the device whole \
                             ({reason}); opening the one before it, TID {:#x}",
                            sb.seq + 1,
                            sb.committed_tid
                        );
                    }
                    return Ok(sb);
                }
                Err(reason) if incomplete.is_none() => incomplete = Some(reason),
                Err(reason) => {
                    return Err(Error::corrupt(
                        format!("neither superblock's commit is whole ({reason})"),
                        "superblocks at bytes 0 and 4096",
                    ))
                }
            }
        }
        Err(Error::corrupt(
            format!(
                "the newest commit did not reach the device whole ({}) and no superblock \
                 precedes it",
                incomplete.unwrap_or_default()
            ),
            "superblocks at bytes 0 and 4096",
        ))
    }

    /// Opens a volume: newest superblock, the space map its commit wrote (or one rebuilt from
    /// the tree), redo log replayed.
    pub fn open(device: Arc<dyn Device>, options: VolumeOptions) -> Result<Arc<Volume>> {
        let mut sb = Self::read_superblock(&*device)?;
        let cached_bytes = options.cache_bytes / 2;
        let cache = match options.data_cache_bytes {
            Some(data_bytes) => {
                let data_bytes = data_bytes.min(cached_bytes);
                BlockCache::new(cached_bytes - data_bytes, data_bytes)
            }
            None => BlockCache::adaptive(cached_bytes),
        };
        let root = Root {
            address: sb.root_address,
            level: sb.root_level,
        };
        let mut space_map_read = true;
        let found = if options.rebuild_space_map {
            Ok(None)
        } else {
            load_space_map(&*device, &sb)
        };
        let space = match found {
            Ok(Some(space)) => space,
            found => {
                if let Err(e) = found {
                    log::warn!("space map unusable ({e}); rebuilding it from the tree");
                }
                let space = Space::new(sb.data_offset, sb.volume_bytes);
                let loader = Loader {
                    device: &*device,
                    cache: &cache,
                    volume_id: sb.volume_id,
                };
                sb.live_objects = walk_space(&loader, &space, root)?;
                // The old map's blocks are free in the walked map: the next commit must
                // not free them again.
                sb.space_map_address = 0;
                sb.space_map_bytes = 0;
                sb.manifest_address = 0;
                sb.manifest_bytes = 0;
                sb.manifest_checksum = 0;
                space_map_read = false;
                space
            }
        };
        let space = Arc::new(space);
        let live_objects = sb.live_objects;
        let pending_bytes_max = (options.cache_bytes / 4).max(4 << 20);
        let shadow = match &options.crash_log_file {
            Some(path) if options.log_every_change => {
                match shadow::ShadowLog::open(path, !options.read_only) {
                    Ok(shadow) => Some(shadow),
                    Err(e) if options.read_only => {
                        log::debug!("no crash log at {}: {e}", path.display());
                        None
                    }
                    Err(e) => {
                        log::warn!(
                            "crash log {}: {e}; logging changes in the image instead",
                            path.display()
                        );
                        None
                    }
                }
            }
            _ => None,
        };
        let ring = LogRing {
            size: match shadow {
                Some(_) => sb.log_bytes.min(shadow_ring_bytes(options.cache_bytes)),
                None => sb.log_bytes,
            },
            // Never 0: a salt of 0 marks batches of format version 2.
            salt: rand::random::<u64>() | 1,
            epoch: sb.committed_tid,
            seq: 0,
            follows: 0,
            follows_count: 0,
            head: sb.log_start,
            page: Vec::new(),
            epoch_start: sb.log_start,
            tail: sb.log_start,
            frozen_unlogged: false,
            unsynced_from: None,
            scratch: Vec::new(),
        };
        let root_ref = Arc::new(RootRef {
            root,
            tid: sb.committed_tid,
            next_obj: sb.next_obj,
            release: Mutex::new(Vec::new()),
            space: space.clone(),
        });
        let volume = Arc::new(Volume {
            device,
            volume_id: sb.volume_id,
            cache,
            space,
            state: Mutex::new(State {
                live_objects,
                active: Overlay::new(sb.next_tid),
                frozen: None,
                root: root_ref,
                next_obj: sb.next_obj,
                superblock: sb,
                live_memo: Default::default(),
                upper_nodes: Default::default(),
            }),
            commit_lock: Mutex::new(()),
            log: Mutex::new(ring),
            read_only: AtomicBool::new(options.read_only),
            stopped: Mutex::new(None),
            options,
            commit_signal: (parking_lot::Mutex::new(0), Condvar::new()),
            pending_bytes_max,
            stop_committer: AtomicBool::new(false),
            frozen_unallocated: AtomicU64::new(0),
            committer_running: AtomicBool::new(false),
            space_map_read,
            log_appends: AtomicU64::new(0),
            log_flushed: AtomicU64::new(0),
            counters: Counters::default(),
            shadow,
            locality: Mutex::new(HashMap::new()),
            group_members: Mutex::new(HashMap::new()),
            recent: Mutex::new(HashMap::new()),
            clusters_wanted: AtomicBool::new(false),
            commit_requested: AtomicBool::new(false),
            clusters: Mutex::new(Vec::new()),
            copies: copies::Copies::default(),
            slave: AtomicBool::new(false),
        });
        if let (Some(shadow), false) = (&volume.shadow, volume.is_read_only()) {
            let size = volume.log.lock().size;
            if let Err(e) = shadow.map(size) {
                log::warn!("cannot map the crash log file ({e}); appending with pwrite");
            }
        }
        let replayed = volume.replay_log()?;
        if !volume.is_read_only() {
            // A writer records its salt before it writes a batch: batches a previous writer
            // left in the ring can then never be taken for this one's.
            if replayed > 0 {
                volume.commit()?;
            } else {
                volume.begin_log()?;
            }
            if let Some(shadow) = &volume.shadow {
                // What it held is committed now, or was another writer's: a fresh start.
                shadow.clear()?;
            }
        }
        Ok(volume)
    }

    /// A read-only volume whose writer is elsewhere (a replica of an object-store volume):
    /// moves to the writer's newest commit and replays what it logged since, after the
    /// device picked up what the writer flushed (`Device::refresh`). Returns the committed
    /// TID when it moved, None when nothing changed.
    ///
    /// Reads in flight finish on the root they started with; the writer may reuse the space
    /// of nodes its newer commits freed, so such a read can fail its checksum (an error for
    /// that read, never wrong bytes).
    pub fn follow(&self) -> Result<Option<u64>> {
        if !self.is_read_only() {
            return Err(Error::Invalid(
                "only a read-only volume follows another writer".to_string(),
            ));
        }
        if !self.device.refresh()? {
            return Ok(None);
        }
        let sb = Self::read_superblock(&*self.device)?;
        // Addresses the writer freed may hold other nodes and extents now: what the cache
        // holds from before the device moved goes, before and after readers see the root.
        self.cache.clear();
        {
            // Logged changes are replayed below on a fresh overlay, also when only they moved.
            let mut state = self.state.lock();
            state.root = Arc::new(RootRef {
                root: Root {
                    address: sb.root_address,
                    level: sb.root_level,
                },
                tid: sb.committed_tid,
                next_obj: sb.next_obj,
                release: Mutex::new(Vec::new()),
                space: self.space.clone(),
            });
            state.active = Overlay::new(sb.next_tid);
            state.next_obj = sb.next_obj;
            state.live_objects = sb.live_objects;
            state.superblock = sb;
        }
        self.cache.clear();
        self.replay_log()?;
        Ok(Some(self.state.lock().superblock.committed_tid))
    }

    /// Replays the redo log into the active overlay: from the superblock's `log_start`, the
    /// batches of its epoch and salt in sequence order, then those of an epoch that was being
    /// committed if its first batch follows exactly the ones replayed. Stops at the first
    /// batch that does not fit. Returns the number of batches replayed.
    ///
    /// With a crash log file, each batch is looked for there first, then in the image's
    /// region: the file holds what was acknowledged since the last fsync, the region what
    /// fsync copied (the file lets go of those pages), and after a power loss only the region
    /// is left.
    fn replay_log(&self) -> Result<usize> {
        let sb = self.state.lock().superblock.clone();
        // Format version 2 batches start at 0 and never wrap.
        let wraps = sb.log_salt != 0;
        let mut pos = sb.log_start;
        let mut epoch = sb.committed_tid;
        let mut seq = 0u64;
        let mut replayed = 0;
        let mut from_file = 0;
        loop {
            let next = |batch: &LogBatch| {
                batch.salt == sb.log_salt
                    && ((batch.epoch == epoch && batch.seq == seq)
                        || (batch.seq == 0
                            && batch.epoch > epoch
                            && batch.follows == epoch
                            && batch.follows_count == seq))
            };
            let at = |pos: u64| {
                let in_file = match self.shadow {
                    Some(_) => self.read_batch(&sb, pos, LogSource::Shadow),
                    None => None,
                };
                match in_file.filter(|(b, _)| next(b)) {
                    Some((batch, total)) => Some((batch, total, true)),
                    None => self
                        .read_batch(&sb, pos, LogSource::Image)
                        .filter(|(b, _)| next(b))
                        .map(|(batch, total)| (batch, total, false)),
                }
            };
            let mut found = at(pos);
            if found.is_none() && wraps && pos != 0 {
                found = at(0);
                if found.is_some() {
                    pos = 0;
                }
            }
            let Some((batch, total, in_file)) = found else {
                break;
            };
            from_file += in_file as usize;
            if let Some(bad) = batch.entries.iter().find(|e| !log_entry_is_valid(e)) {
                log::warn!(
                    "redo log batch {} of epoch {} holds an invalid entry {:?}; replay stops",
                    batch.seq,
                    batch.epoch,
                    bad.lk
                );
                break;
            }
            if batch.epoch != epoch {
                epoch = batch.epoch;
                seq = 0;
            }
            if !self.apply_batch(batch) {
                break;
            }
            replayed += 1;
            seq += 1;
            pos += total;
        }
        if replayed > 0 {
            log::info!(
                "replayed {replayed} redo log batches ({from_file} from the crash log file)"
            );
        }
        let mut ring = self.log.lock();
        ring.epoch = epoch;
        ring.seq = seq;
        // A writer starts on a page of its own (appends rewrite their page whole); the
        // batches replayed stay intact until the next commit makes them dead (a writable
        // open commits them before any append). The batches replayed may lie beyond the
        // part of the region this writer's ring uses (`shadow_ring_bytes`).
        ring.head = pos.div_ceil(LOG_PAGE_BYTES) * LOG_PAGE_BYTES % ring.size;
        ring.page.clear();
        Ok(replayed)
    }

    /// The batch at `pos` in the log region (or its shadow) with its size, if a valid one
    /// is there.
    fn read_batch(&self, sb: &Superblock, pos: u64, source: LogSource) -> Option<(LogBatch, u64)> {
        if pos + LOG_UNIT_BYTES > sb.log_bytes {
            return None;
        }
        let read = |buf: &mut [u8]| match (source, &self.shadow) {
            (LogSource::Shadow, Some(shadow)) => shadow.read_at(buf, pos),
            _ => self.device.read_at(buf, sb.log_offset + pos),
        };
        let mut first = vec![0u8; LOG_UNIT_LEN];
        read(&mut first).ok()?;
        let total = LogBatch::claimed_bytes(&first, sb.log_bytes - pos)?;
        let mut bytes = vec![0u8; usize::try_from(total).ok()?];
        read(&mut bytes).ok()?;
        let batch = LogBatch::decode(&bytes, &self.volume_id, sb.log_offset + pos).ok()?;
        Some((batch, total))
    }

    /// Applies a replayed batch to the active overlay (the changes are in the log already).
    /// False if an entry does not apply (a splice of a value the replay does not hold).
    fn apply_batch(&self, batch: LogBatch) -> bool {
        // Extents written ahead of their commit must be there, intact, before any entry of
        // the batch applies (a batch holds whole operations): a power loss can keep a
        // batch whose fsync never returned without the data it names.
        let extents: Vec<ExtentRef> = batch
            .entries
            .iter()
            .filter_map(|e| match e.value {
                LogValue::Extent(extent) => Some(extent),
                _ => None,
            })
            .collect();
        for (claimed, extent) in extents.iter().enumerate() {
            if let Err(e) = self.claim_logged_extent(extent) {
                log::warn!(
                    "redo log batch {} of epoch {} names an extent written ahead of its \
                     commit that is not intact ({e}); replay stops",
                    batch.seq,
                    batch.epoch,
                );
                for extent in &extents[..claimed] {
                    self.space
                        .release_provisional(extent.offset, extent.allocated_bytes());
                }
                return false;
            }
        }
        let mut st = self.state.lock();
        st.next_obj = st.next_obj.max(batch.next_obj);
        for entry in batch.entries {
            let current = st.active.map.get(&entry.lk);
            let replaces = current.map_or(entry.replaces, |p| p.replaces);
            let value = match entry.value {
                LogValue::Delete => None,
                LogValue::Put(bytes) => Some(Value::Bytes(Arc::new(bytes))),
                LogValue::Extent(extent) => Some(Value::Extent(extent)),
                LogValue::Splice { len, at, bytes } => {
                    let Some(Value::Bytes(base)) = current.and_then(|p| p.value.as_ref()) else {
                        log::warn!(
                            "redo log batch {} of epoch {} changes bytes of {:?}, which it \
                             never set; replay stops",
                            batch.seq,
                            batch.epoch,
                            entry.lk
                        );
                        return false;
                    };
                    let mut value = base.to_vec();
                    value.resize(len as usize, 0);
                    value[at as usize..at as usize + bytes.len()].copy_from_slice(&bytes);
                    Some(Value::Bytes(Arc::new(value)))
                }
            };
            if entry.lk.rtype == rtype::INODE {
                let existed = match current {
                    Some(pending) => pending.value.is_some(),
                    None => entry.replaces != 0,
                };
                let exists = value.is_some();
                st.live_objects = st
                    .live_objects
                    .saturating_add(u64::from(exists))
                    .saturating_sub(u64::from(existed));
                st.active.objects_delta += i64::from(exists) - i64::from(existed);
            }
            let pending = Pending {
                value,
                replaces,
                // The log does not record per-object settings: replayed changes take
                // the volume's (history as mounted, the default codec).
                nohistory: self.options.nohistory,
                codec: crate::format::record::compression::DEFAULT,
                rewrites: 0,
            };
            st.active.insert(entry.lk, pending);
        }
        // What was replayed is in the log already.
        st.active.log_dirty.clear();
        true
    }

    /// Checks an extent a replayed batch names (in the data area, its checksum right) and
    /// takes its space from the free map, where the last commit's map left it.
    fn claim_logged_extent(&self, extent: &ExtentRef) -> Result<()> {
        self.read_extent_uncached(extent)?;
        self.space
            .mark_provisional(extent.offset, extent.allocated_bytes())
    }

    /// Writes a superblock that records this writer's salt and where its batches start,
    /// before the first of them.
    fn begin_log(&self) -> Result<()> {
        let _commit = self.commit_lock.lock();
        let mut ring = self.log.lock();
        let mut sb = self.state.lock().superblock.clone();
        sb.seq += 1;
        sb.log_salt = ring.salt;
        sb.log_start = ring.head % ring.size;
        // Open read it whole (`read_superblock`).
        sb.proven = true;
        self.write_superblock_now(&sb)?;
        ring.epoch = sb.committed_tid;
        ring.seq = 0;
        ring.head = sb.log_start;
        ring.epoch_start = sb.log_start;
        ring.tail = sb.log_start;
        self.state.lock().superblock = sb;
        Ok(())
    }

    /// Writes `sb` in its slot and makes it durable.
    fn write_superblock_now(&self, sb: &Superblock) -> Result<()> {
        sb.validate(sb.address())?;
        self.device.write_at(&sb.encode(), sb.address())?;
        self.device.flush()?;
        Ok(())
    }

    /// Marks the last commit durable for the next mount, which then need not read its
    /// manifest (`Superblock::proven`): a superblock that repeats it. For a writer that
    /// closes the volume; does nothing if the last commit wrote no manifest.
    pub fn prove_last_commit(&self) -> Result<()> {
        if self.is_read_only() {
            return Ok(());
        }
        let _commit = self.commit_lock.lock();
        let mut sb = self.state.lock().superblock.clone();
        if sb.manifest_address == 0 || sb.proven {
            return Ok(());
        }
        sb.seq += 1;
        sb.proven = true;
        self.write_superblock_now(&sb)?;
        self.state.lock().superblock = sb;
        Ok(())
    }

    pub fn volume_id(&self) -> VolumeId {
        self.volume_id
    }
    pub fn options(&self) -> &VolumeOptions {
        &self.options
    }
    /// Whether open found the free map in the last commit's space map (true) or had to
    /// walk the tree for it (a volume from before space maps, or a damaged map).
    pub fn space_map_was_read(&self) -> bool {
        self.space_map_read
    }
    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }
    pub fn device(&self) -> &dyn Device {
        &*self.device
    }

    /// The engine's counters since open, for `anvil info`: commits and the time they took,
    /// and writers that waited for a commit (over the memory budget, or for a group that
    /// was frozen before its changes reached the log), with the time they waited.
    pub fn report(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        let millis = |a: &(AtomicU64, AtomicU64)| a.1.load(Ordering::Relaxed) / 1_000_000;
        let mib = |a: &AtomicU64| a.load(Ordering::Relaxed) >> 20;
        let (lock_waits, lock_waited) = crate::sync::worker_lock_waits();
        vec![
            ("commits", c.commits.0.load(Ordering::Relaxed)),
            ("commit_ms", millis(&c.commits)),
            ("throttled_writers", c.throttled.0.load(Ordering::Relaxed)),
            ("throttled_ms", millis(&c.throttled)),
            ("log_waits", c.log_waits.0.load(Ordering::Relaxed)),
            ("log_wait_ms", millis(&c.log_waits)),
            ("log_full_waits", c.log_full.0 .0.load(Ordering::Relaxed)),
            ("log_full_wait_ms", millis(&c.log_full.0)),
            ("log_full_commits", c.log_full.1 .0.load(Ordering::Relaxed)),
            ("log_full_commit_ms", millis(&c.log_full.1)),
            ("regrouped_files", c.regrouped.0.load(Ordering::Relaxed)),
            ("regrouped_mib", c.regrouped.1.load(Ordering::Relaxed) >> 20),
            ("copies_written", c.copies.0.load(Ordering::Relaxed)),
            (
                "copies_written_mib",
                c.copies.1.load(Ordering::Relaxed) >> 20,
            ),
            ("copies_read", c.copies.2.load(Ordering::Relaxed)),
            ("data_written_mib", mib(&c.written.data)),
            ("data_padding_mib", mib(&c.written.padding)),
            ("nodes_written_mib", mib(&c.written.nodes)),
            ("maps_written_mib", mib(&c.written.maps)),
            (
                "manifests_written_kib",
                c.written.manifests.load(Ordering::Relaxed) >> 10,
            ),
            ("commit_barriers", c.barriers.load(Ordering::Relaxed)),
            ("tree_walks", c.walks.0.load(Ordering::Relaxed)),
            ("memo_answers", c.walks.1.load(Ordering::Relaxed)),
            ("log_written_mib", mib(&c.written.log)),
            // Process-wide: every volume of the process reports the same two.
            ("worker_lock_waits", lock_waits),
            (
                "worker_lock_wait_ms",
                u64::try_from(lock_waited.as_millis()).unwrap_or(u64::MAX),
            ),
        ]
    }

    /// Counts a question about the committed tree's live records: walked from the root,
    /// or answered by the live memo.
    pub(crate) fn count_walk(&self, walked: bool) {
        let (walks, answers) = &self.counters.walks;
        bump(if walked { walks } else { answers }, 1);
    }

    /// Counts `nodes` tree nodes a commit (or a reblock step) wrote.
    fn count_nodes_written(&self, nodes: u64) {
        bump(&self.counters.written.nodes, nodes * NODE_BYTES as u64);
    }

    pub(crate) fn loader(&self) -> Loader<'_> {
        Loader {
            device: &*self.device,
            cache: &self.cache,
            volume_id: self.volume_id,
        }
    }

    /// Switches the volume to read-only after a failure that may have left metadata unwritten.
    pub fn fail_read_only(&self, why: &Error) {
        let mut stopped = self.stopped.lock();
        if stopped.is_none() && !self.options.read_only {
            *stopped = Some(why.to_string());
        }
        if !self.read_only.swap(true, Ordering::AcqRel) {
            log::error!("switching volume to read-only: {why}");
        }
    }

    /// The error a change gets on a volume that takes none: `Stopped` with the first
    /// failure's reason if a failure stopped it, else `ReadOnly`.
    pub fn read_only_error(&self) -> Error {
        match &*self.stopped.lock() {
            Some(why) => Error::Stopped(why.clone()),
            None => Error::ReadOnly,
        }
    }

    /// Whether changes are waiting in memory for a commit.
    pub fn has_pending(&self) -> bool {
        let st = self.state.lock();
        !st.active.is_empty() || st.frozen.is_some()
    }

    /// TID of the newest commit: the newest point history can be read at.
    pub fn committed_tid(&self) -> u64 {
        self.state.lock().superblock.committed_tid
    }

    pub fn usage(&self) -> Usage {
        let st = self.state.lock();
        let sb = &st.superblock;
        let label_end = sb.label.iter().position(|&b| b == 0).unwrap_or(LABEL_BYTES);
        Usage {
            volume_bytes: sb.volume_bytes,
            data_bytes: self.space.data_bytes(),
            used_bytes: self.space.used_bytes(),
            free_bytes: self.space.free_bytes(),
            reserve_bytes: self.space.reserve_bytes(),
            committed_tid: sb.committed_tid,
            commit_time_ns: sb.commit_time_ns,
            created_time_ns: sb.created_time_ns,
            next_obj: st.next_obj,
            live_objects: st.live_objects,
            pending_bytes: st.active.pending_bytes
                + self.frozen_unallocated.load(Ordering::Acquire),
            cache_bytes: self.cache.memory_bytes(),
            label: String::from_utf8_lossy(&sb.label[..label_end]).into_owned(),
            volume_id: sb.volume_id,
        }
    }

    /// Runs `op` as a transaction: atomic with respect to every other operation, and never
    /// holding the state lock across device I/O (misses are loaded outside and retried).
    pub fn run<T>(&self, write: bool, mut op: impl FnMut(&mut Tx<'_>) -> Step<T>) -> Result<T> {
        if write && self.is_read_only() {
            return Err(self.read_only_error());
        }
        if write && self.is_slave() {
            return Err(Error::Slave);
        }
        if write {
            self.metadata_floor()?;
        }
        let mut pinned_nodes: HashMap<u64, Arc<Node>> = HashMap::new();
        let mut pinned_extents: HashMap<ExtentRef, Arc<Vec<u8>>> = HashMap::new();
        // Pins are only valid for the root they were read under; holding that root keeps
        // its blocks from being reused while a retry loads more.
        let mut pinned_root: Option<Arc<RootRef>> = None;
        loop {
            let need = {
                let mut st = self.state.lock();
                if !pinned_root
                    .as_ref()
                    .is_some_and(|r| Arc::ptr_eq(r, &st.root))
                {
                    pinned_nodes.clear();
                    pinned_extents.clear();
                    pinned_root = Some(st.root.clone());
                }
                let mut tx = Tx::new(self, &mut st, &pinned_nodes, &pinned_extents);
                match op(&mut tx) {
                    Ok(value) => {
                        tx.finish();
                        let pending_entries = st.active.map.len() + st.active.prune.len();
                        drop(st);
                        if write {
                            self.commit_if_tight(pending_entries);
                            if self.options.log_every_change {
                                self.log_changes()?;
                            }
                        }
                        return Ok(value);
                    }
                    Err(Stop::Fail(e)) => {
                        // A broken invariant met in the tree is metadata damage: stop
                        // changing the volume before a write builds on it.
                        if matches!(e, Error::Corrupt { .. }) {
                            self.fail_read_only(&e);
                        }
                        return Err(e);
                    }
                    Err(Stop::Need(need)) => need,
                }
            };
            match need {
                Need::Node { address, level } => {
                    let node = self.loader().load(address, level).inspect_err(|e| {
                        if matches!(e, Error::Corrupt { .. }) {
                            self.fail_read_only(e);
                        }
                    })?;
                    pinned_nodes.insert(address, node);
                }
                Need::Extent(extent) => {
                    let bytes = self.read_extent(&extent)?;
                    pinned_extents.insert(extent, bytes);
                }
            }
        }
    }

    /// Changes stop with ENOSPC once free space falls below half the reserve: the rest is
    /// kept for commits (copy-on-write needs new nodes even for deletes, which with history
    /// on add versions) and for prune, which is how a full volume gets space back.
    fn metadata_floor(&self) -> Result<()> {
        let floor = self.space.reserve_bytes() / 2;
        if self.space.free_bytes() >= floor {
            return Ok(());
        }
        // Space freed by the last commits may be waiting for it.
        let _ = self.commit();
        if self.space.free_bytes() >= floor {
            return Ok(());
        }
        log::warn!(
            "volume full: {} bytes free; deletes keep history until `anvil prune` frees it",
            self.space.free_bytes()
        );
        Err(Error::NoSpace)
    }

    /// When free space runs low, commits before the pending group grows past what its
    /// copy-on-write can be given: every changed leaf (and its ancestors) needs a new node
    /// until the commit is durable, even when the change frees space. Small groups near a
    /// full volume keep deletes and prune working from the reserve.
    fn commit_if_tight(&self, pending_entries: usize) {
        let needed = (pending_entries as u64 + 8) * 2 * NODE_BYTES as u64;
        if self.space.free_bytes() >= self.space.reserve_bytes() + needed {
            return;
        }
        if let Err(e) = self.commit() {
            log::error!("commit on a nearly full volume failed: {e}");
        }
    }

    /// Copy-on-write node space the next commit can count on (free space above what a
    /// commit of `pending` entries needs), for sizing maintenance batches.
    pub fn node_budget_bytes(&self) -> u64 {
        self.space.free_bytes()
    }

    /// Reads and verifies several extents, from the cache where it holds them, merging
    /// neighbours on the device into single reads (extents written together lie side by
    /// side), and keeps them in the cache. Results are in input order.
    pub fn read_extents(&self, extents: &[ExtentRef]) -> Vec<Result<Arc<Vec<u8>>>> {
        self.read_extents_keeping(extents, &|_| true)
    }

    /// `read_extents`, keeping in the cache only the extents `keep` names (by index): the
    /// others are handed over whole to a reader that caches them itself (the kernel's page
    /// cache holds a chunk a read covered entirely), and a cached copy is dropped.
    pub fn read_extents_keeping(
        &self,
        extents: &[ExtentRef],
        keep: &dyn Fn(usize) -> bool,
    ) -> Vec<Result<Arc<Vec<u8>>>> {
        let mut out: Vec<Option<Result<Arc<Vec<u8>>>>> = extents
            .iter()
            .enumerate()
            .map(|(i, extent)| {
                if !self.extent_in_bounds(extent) {
                    // Never sized into a read buffer: its claimed length may be anything.
                    return Some(Err(Error::corrupt(
                        "extent outside the data area or longer than any chunk",
                        extent_location(extent),
                    )));
                }
                let Some(found) = self.cache.extent(extent) else {
                    return self.read_from_set(extent).map(|bytes| Ok(Arc::new(bytes)));
                };
                if !keep(i) {
                    self.cache.remove_extent(extent);
                }
                Some(Ok(found))
            })
            .collect();
        let mut order: Vec<usize> = (0..extents.len()).filter(|&i| out[i].is_none()).collect();
        order.sort_by_key(|&i| extents[i].offset);
        let mut start = 0;
        while start < order.len() {
            // A run: each extent begins where the previous one ends, or in the next block.
            let mut end = start + 1;
            while end < order.len() {
                let previous = &extents[order[end - 1]];
                let next = &extents[order[end]];
                let contiguous = previous
                    .offset
                    .checked_add(previous.allocated_bytes())
                    .is_some_and(|e| (e..=e.next_multiple_of(BLOCK_BYTES)).contains(&next.offset));
                if !contiguous || next.offset - extents[order[start]].offset > RUN_BYTES_MAX {
                    break;
                }
                end += 1;
            }
            let first = &extents[order[start]];
            let last = &extents[order[end - 1]];
            // Whole blocks, into a reused block-aligned buffer: an O_DIRECT device reads
            // straight into it, with no zeroing, no bounce buffer and no copy out of one.
            let in_bounds = self.extent_in_bounds(first) && self.extent_in_bounds(last);
            // A damaged extent never sizes a buffer: out of bounds, the run reads nothing.
            #[expect(
                clippy::cast_possible_truncation,
                reason = "a run in bounds is at most RUN_BYTES_MAX plus one extent of at most \
                          a chunk"
            )]
            let (run_start, run_bytes) = if in_bounds {
                let (run_start, _) = first.block_span();
                let (last_start, last_bytes) = last.block_span();
                (run_start, (last_start + last_bytes - run_start) as usize)
            } else {
                (first.offset, 0)
            };
            let mut scratch = RUN_BUFFER.take();
            let buffer = crate::device::file::aligned_scratch(&mut scratch, run_bytes);
            let read = if in_bounds {
                self.device.read_at(buffer, run_start).map_err(Error::from)
            } else {
                Err(Error::corrupt(
                    "extent outside the data area",
                    extent_location(first),
                ))
            };
            for &index in &order[start..end] {
                let extent = &extents[index];
                out[index] = Some(match &read {
                    Ok(()) => {
                        #[expect(
                            clippy::cast_possible_truncation,
                            reason = "the extent lies inside the run, so below run_bytes"
                        )]
                        let at = (extent.offset - run_start) as usize;
                        let stored = &buffer[at..at + extent.stored_bytes as usize];
                        decode_extent(extent, stored).map(|bytes| {
                            let bytes = Arc::new(bytes);
                            if keep(index) {
                                self.cache.insert_extent(*extent, bytes.clone());
                            }
                            bytes
                        })
                    }
                    Err(_) => self.read_extent(extent),
                });
            }
            RUN_BUFFER.set(scratch);
            start = end;
        }
        #[expect(
            clippy::expect_used,
            reason = "the runs cover order, which holds every index once"
        )]
        out.into_iter()
            .map(|r| r.expect("every extent was read"))
            .collect()
    }

    /// Whether an extent lies in the data area, with a stored length no chunk can exceed
    /// (so a damaged length is never used to size a buffer).
    fn extent_in_bounds(&self, extent: &ExtentRef) -> bool {
        let end = extent.offset.checked_add(extent.allocated_bytes());
        end.is_some_and(|e| e <= self.space.volume_bytes())
            && extent.offset >= self.space.data_offset()
            && u64::from(extent.stored_bytes) <= EXTENT_STORED_BYTES_MAX
    }

    /// The verified, decoded bytes of one extent, from the cache or the device. A checksum
    /// mismatch is an error, never data.
    pub fn read_extent(&self, extent: &ExtentRef) -> Result<Arc<Vec<u8>>> {
        if let Some(bytes) = self.cache.extent(extent) {
            return Ok(bytes);
        }
        if let Some(bytes) = self.read_from_set(extent) {
            return Ok(Arc::new(bytes));
        }
        let bytes = Arc::new(self.read_extent_uncached(extent)?);
        self.cache.insert_extent(*extent, bytes.clone());
        Ok(bytes)
    }

    /// The verified, decoded bytes of an extent in a locality set, taken from the set's
    /// bytes: cached, or read whole in one request and kept in the cache's data share, so
    /// that the set's other members are read from memory (Hummingbird's cluster reads).
    /// The decoded member is not cached beside its set. A copy of the extent in another
    /// file's cached set serves as well (`copies.rs`) when its own set is not cached. None
    /// where no set serves: the extent is in none, the set lies outside the data area, or
    /// the extent's bytes in it fail its checksum (blocks of a cached set reused since, or
    /// damage); the caller reads the extent alone, which reports damage as such.
    fn read_from_set(&self, extent: &ExtentRef) -> Option<Vec<u8>> {
        let own = extent.set_span().filter(|&(start, len)| {
            start >= self.space.data_offset()
                && start
                    .checked_add(len)
                    .is_some_and(|end| end <= self.space.volume_bytes())
        });
        let member =
            |start, set: &[u8]| decode_extent(extent, set_member(extent, start, set)?).ok();
        if let Some((start, len)) = own {
            if let Some(set) = self.cache.set(start, len) {
                if let Some(bytes) = member(start, &set) {
                    return Some(bytes);
                }
                self.cache.remove_set(start, len);
            }
        }
        // A copy in another file's set, read with that file (`copies.rs`).
        if let Some(bytes) = self.read_copy(extent) {
            return Some(bytes);
        }
        let (start, len) = own?;
        let mut scratch = RUN_BUFFER.take();
        let buffer = crate::device::file::aligned_scratch(&mut scratch, usize::try_from(len).ok()?);
        let read = self.device.read_whole_at(buffer, start);
        let set = read.is_ok().then(|| Arc::new(buffer.to_vec()));
        RUN_BUFFER.set(scratch);
        let set = set?;
        let bytes = member(start, &set)?;
        self.cache.insert_set(start, set);
        Some(bytes)
    }

    /// Reads and verifies one extent from the device, bypassing the cache (for `check`).
    pub fn read_extent_uncached(&self, extent: &ExtentRef) -> Result<Vec<u8>> {
        if !self.extent_in_bounds(extent) {
            return Err(Error::corrupt(
                "extent outside the data area",
                extent_location(extent),
            ));
        }
        let mut stored = vec![0u8; extent.stored_bytes as usize];
        self.device.read_at(&mut stored, extent.offset)?;
        decode_extent(extent, &stored)
    }

    /// Current root for lock-free readers (as-of views, `check`).
    pub fn root(&self) -> Arc<RootRef> {
        self.state.lock().root.clone()
    }

    /// Elements of the committed tree with `lo <= key <= hi`, visible as of `tid`.
    pub fn range_at(
        &self,
        root: &RootRef,
        tid: u64,
        lo: LogicalKey,
        hi: LogicalKey,
        limit: usize,
    ) -> Result<Vec<(LogicalKey, Value)>> {
        let versions = self.range_versions_at(root, tid, lo, hi, limit)?;
        Ok(versions.into_iter().map(|(lk, v, _)| (lk, v)).collect())
    }

    /// Like `range_at`, also giving each element's create_tid.
    pub fn range_versions_at(
        &self,
        root: &RootRef,
        tid: u64,
        lo: LogicalKey,
        hi: LogicalKey,
        limit: usize,
    ) -> Result<Vec<(LogicalKey, Value, u64)>> {
        if tid > root.tid {
            return Err(Error::Invalid(format!(
                "TID {tid:#018x} is newer than the last commit {:#018x}",
                root.tid
            )));
        }
        let mut out = Vec::new();
        let lo_key = Key::new(lo, 0);
        let hi_key = Key::new(hi, u64::MAX);
        let loader = self.loader();
        let result = btree::range(&loader, root.root, &lo_key, &hi_key, &mut |e| {
            if e.visible_at(tid) {
                out.push((
                    e.key.logical(),
                    payload_value(&e.payload()),
                    e.key.create_tid,
                ));
            }
            out.len() < limit
        });
        btree::loaded(result).map(|_| out)
    }

    /// Blocks a writer while pending changes exceed the memory budget.
    pub fn throttle(&self) {
        loop {
            let pending = self.state.lock().active.pending_bytes;
            if pending <= self.pending_bytes_max {
                return;
            }
            if !self.committer_running.load(Ordering::Acquire) {
                if let Err(e) = self.commit() {
                    log::error!("commit under memory pressure failed: {e}");
                }
                return;
            }
            self.wake_committer();
            let started = std::time::Instant::now();
            let mut generation = self.commit_signal.0.lock();
            let seen = *generation;
            self.commit_signal.1.wait_while_for(
                &mut generation,
                |g| *g == seen,
                Duration::from_millis(100),
            );
            drop(generation);
            self.counters.waited(&self.counters.throttled, started);
        }
    }

    /// True when pending changes should be committed soon: memory pressure, or a log ring
    /// more than half full (a full one makes the operation that finds it so commit).
    pub fn wants_commit(&self) -> bool {
        if self.commit_requested.load(Ordering::Acquire) {
            return true;
        }
        {
            // Data written ahead of its commit holds host memory until the commit too.
            let st = self.state.lock();
            if st.active.pending_bytes > self.pending_bytes_max / 2
                || st.active.direct_bytes > self.pending_bytes_max
            {
                return true;
            }
        }
        let ring = self.log.lock();
        ring.used() > ring.size / 2
    }

    /// Bytes of new data the active group may still hold before writes get ENOSPC.
    pub fn check_space(&self, new_bytes: u64) -> Result<()> {
        if new_bytes > self.space_left() {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// `check_space` for `new_bytes` of file data, which the commit places as extents of up
    /// to a chunk each: fails also when the free space, however many bytes it has, is in
    /// holes too short to take them (`data_space_left`).
    pub fn check_data_space(&self, new_bytes: u64) -> Result<()> {
        if new_bytes > self.data_space_left() {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// Bytes ordinary writes may still take: free space less the reserve and what pending
    /// changes will need when they are committed.
    pub fn space_left(&self) -> u64 {
        // Pending bytes also bound the node space a commit needs (~64 bytes per change,
        // counted in `pending_bytes`, copied up the tree).
        self.space
            .free_bytes()
            .saturating_sub(self.space.reserve_bytes())
            .saturating_sub(self.pending_bytes())
    }

    /// Bytes of file data writes may still take: `space_left` counted in what the free
    /// space surely holds of pieces as long as a chunk (`Space::room_bytes`, never more
    /// than the free bytes), so that the reserve and every pending change's pieces are
    /// placed too. Where deletes have left the free space in short holes, a write that
    /// passed on free bytes alone would fail its commit, which stops the volume.
    pub fn data_space_left(&self) -> u64 {
        self.space
            .room_bytes()
            .saturating_sub(self.space.reserve_bytes())
            .saturating_sub(self.pending_bytes())
    }

    /// What pending changes will need when they are committed, as counted for space.
    fn pending_bytes(&self) -> u64 {
        let st = self.state.lock();
        st.active.pending_bytes + self.frozen_unallocated.load(Ordering::Acquire)
    }

    /// Bytes kept back from ordinary writes so that deletes and commits work when full.
    pub fn reserve_bytes(&self) -> u64 {
        self.space.reserve_bytes()
    }

    /// Bytes of the volume's data area (where nodes and extents live).
    pub fn data_area_bytes(&self) -> u64 {
        self.space.data_bytes()
    }

    pub fn wake_committer(&self) {
        self.commit_signal.1.notify_all();
    }

    /// Starts the background committer: commits every `interval`, or sooner under memory
    /// pressure. Stops when `stop_committer` is called. Fails if the thread cannot be
    /// started.
    pub fn start_committer(
        self: &Arc<Self>,
        interval: Duration,
    ) -> Result<std::thread::JoinHandle<()>> {
        let volume = self.clone();
        self.committer_running.store(true, Ordering::Release);
        let spawned = std::thread::Builder::new()
            .name("anvil-commit".into())
            .spawn(move || {
                let mut last = std::time::Instant::now();
                while !volume.stop_committer.load(Ordering::Acquire) {
                    {
                        let mut generation = volume.commit_signal.0.lock();
                        volume
                            .commit_signal
                            .1
                            .wait_for(&mut generation, Duration::from_millis(50));
                    }
                    let due = last.elapsed() >= interval || volume.wants_commit();
                    let dirty = !volume.state.lock().active.is_empty();
                    if due && dirty && !volume.is_read_only() {
                        if let Err(e) = volume.commit() {
                            log::error!("background commit failed: {e}");
                        }
                        last = std::time::Instant::now();
                    } else if due {
                        volume.release_idle_log();
                        last = std::time::Instant::now();
                    }
                }
            });
        if spawned.is_err() {
            self.committer_running.store(false, Ordering::Release);
        }
        Ok(spawned?)
    }

    pub fn stop_committer(&self) {
        self.committer_running.store(false, Ordering::Release);
        self.stop_committer.store(true, Ordering::Release);
        self.wake_committer();
    }

    /// Commits the active flush group now. Returns the durable TID.
    pub fn commit(&self) -> Result<u64> {
        self.commit_holding(self.commit_lock.lock())
    }

    /// `commit`, for a caller that took the commit lock.
    fn commit_holding(&self, _commit: MutexGuard<'_, ()>) -> Result<u64> {
        self.commit_requested.store(false, Ordering::Release);
        self.commit_locked()
    }

    /// Asks the background committer to commit soon (deletes whose space is wanted).
    pub fn request_commit(&self) {
        self.commit_requested.store(true, Ordering::Release);
        self.wake_committer();
    }

    /// Freezes the active group for a commit. Its changes not yet in the log join its
    /// epoch's batches first (or, if they do not fit, no operation returns until the commit
    /// is durable), and the log moves on to the next epoch, whose batches follow them: a
    /// crash before the commit's superblock is written replays both. None if nothing is
    /// pending.
    fn freeze(&self) -> Result<Option<Frozen>> {
        let mut ring = self.log.lock();
        let (frozen, old_root, mut sb, unlogged, next_obj) = {
            let mut st = self.state.lock();
            if st.active.is_empty() {
                return Ok(None);
            }
            let tid = st.active.tid;
            let mut overlay = std::mem::replace(&mut st.active, Overlay::new(tid + 1));
            let unlogged = take_unlogged(&mut overlay);
            self.frozen_unallocated
                .store(overlay.pending_bytes, Ordering::Release);
            let frozen = Arc::new(overlay);
            st.frozen = Some(frozen.clone());
            let mut sb = st.superblock.clone();
            sb.next_obj = st.next_obj;
            (frozen, st.root.clone(), sb, unlogged, st.next_obj)
        };
        if !unlogged.is_empty() && !self.append(&mut ring, next_obj, &log_entries(&unlogged))? {
            ring.frozen_unlogged = true;
        }
        ring.follows = ring.epoch;
        ring.follows_count = ring.seq;
        ring.epoch = frozen.tid;
        ring.seq = 0;
        ring.epoch_start = ring.head;
        sb.log_start = ring.head % ring.size;
        sb.log_salt = ring.salt;
        Ok(Some((frozen, old_root, sb)))
    }

    fn commit_locked(&self) -> Result<u64> {
        if self.is_read_only() {
            return Err(self.read_only_error());
        }
        let (frozen, old_root, superblock) = match self.freeze() {
            Ok(Some(frozen)) => frozen,
            Ok(None) => return Ok(self.committed_tid()),
            Err(e) => {
                self.fail_read_only(&e);
                return Err(e);
            }
        };
        let started = std::time::Instant::now();
        let written = self.write_commit(&frozen, &old_root, superblock);
        self.counters.waited(&self.counters.commits, started);
        match written {
            Ok((new_root, freed, sb, ahead)) => {
                let tid = sb.committed_tid;
                {
                    let mut st = self.state.lock();
                    self.retire(&old_root, freed);
                    self.space.settle(ahead.iter().map(|e| e.offset));
                    st.root = Arc::new(RootRef {
                        root: new_root,
                        tid,
                        next_obj: sb.next_obj,
                        release: Mutex::new(Vec::new()),
                        space: self.space.clone(),
                    });
                    st.frozen = None;
                    self.frozen_unallocated.store(0, Ordering::Release);
                    st.superblock = sb;
                }
                // Before the old root goes: the extents the group replaced are still
                // held for its readers, so no new extent is in their place yet.
                self.forget_direct(&ahead, &frozen.dead);
                drop(old_root);
                {
                    // The previous epoch's batches are dead: the ring may reuse their space.
                    let mut ring = self.log.lock();
                    let old_tail = ring.tail;
                    ring.tail = ring.epoch_start;
                    self.forget_dead_shadow(&mut ring, old_tail);
                    ring.follows = 0;
                    ring.follows_count = 0;
                    ring.frozen_unlogged = false;
                }
                *self.commit_signal.0.lock() += 1;
                self.commit_signal.1.notify_all();
                Ok(tid)
            }
            Err(e) => {
                // The frozen group stays visible in memory, but nothing more can be made
                // durable safely: stop accepting changes.
                self.fail_read_only(&e);
                self.commit_signal.1.notify_all();
                Err(e)
            }
        }
    }

    fn write_commit(
        &self,
        frozen: &Overlay,
        old_root: &RootRef,
        previous: Superblock,
    ) -> Result<CommitOutcome> {
        // A slave's elements carry its master's TIDs: its own commits (prune's removals)
        // take none, so the next stream's TIDs stay free. (A change that raced with the
        // volume becoming a slave still gets a TID of its own; mirror-write's or attach's
        // commit removes it.)
        let slave = self.is_slave() && frozen.map.is_empty();
        let tid = match slave {
            true => previous.committed_tid,
            false => frozen.tid,
        };
        let mut mutations: Vec<Mutation> = Vec::with_capacity(frozen.map.len() * 2 + 1);
        let mut data: Vec<(usize, Stored)> = Vec::new();
        // Extents written ahead that this commit links, then those the group replaced.
        let mut ahead: Vec<ExtentRef> = Vec::new();
        for (lk, pending) in frozen.map.sorted() {
            if pending.replaces != 0 {
                let old = Key::new(lk, pending.replaces);
                mutations.push(if pending.nohistory || self.options.nohistory {
                    Mutation::Remove(old)
                } else {
                    Mutation::MarkDeleted(old)
                });
            }
            let value = match &pending.value {
                None => continue,
                Some(Value::Extent(extent)) => {
                    // Written ahead of the commit: linked as it is.
                    ahead.push(*extent);
                    mutations.push(Mutation::Insert(Element {
                        key: Key::new(lk, tid),
                        delete_tid: 0,
                        payload: Payload::Extent(*extent),
                    }));
                    continue;
                }
                Some(Value::Bytes(value)) => value,
            };
            let is_data = lk.rtype == rtype::DATA || lk.rtype == rtype::PATCH;
            // Data beyond a small size, and a symlink target too long for a leaf, live in an
            // extent; everything else fits inline by its record's own limits.
            let out_of_line = if is_data {
                value.len() > DATA_INLINE_BYTES_MAX
            } else {
                lk.rtype == rtype::SYMLINK && value.len() > INLINE_BYTES_MAX
            };
            let payload = if out_of_line {
                let stored = Stored {
                    encoded: encode_extent(value, pending.codec),
                    value: value.clone(),
                };
                data.push((mutations.len(), stored));
                Payload::Inline(Vec::new()) // replaced below once the extent is placed
            } else {
                Payload::Inline(value.to_vec())
            };
            mutations.push(Mutation::Insert(Element {
                key: Key::new(lk, tid),
                delete_tid: 0,
                payload,
            }));
        }
        for key in &frozen.prune {
            mutations.push(Mutation::Remove(*key));
        }
        let commit_time = match slave {
            true => previous.commit_time_ns,
            false => now_ns(),
        };
        if !slave {
            mutations.push(Mutation::Insert(Element {
                key: Key {
                    obj: VOLUME_OBJ,
                    rtype: rtype::COMMIT,
                    key: tid,
                    create_tid: tid,
                },
                delete_tid: 0,
                payload: Payload::Inline(commit_time.to_le_bytes().to_vec()),
            }));
        }
        let mut copies = Vec::new();
        if !slave {
            self.regroup(old_root, frozen, &mut mutations, &mut data);
            copies = self.gather_copies(old_root, &mutations, &data);
        }
        self.write_extents(&mut mutations, data, copies)?;
        mutations.sort_by_key(Mutation::key);

        let mut ctx = CommitContext::new(self.loader(), &self.space, tid);
        let new_root = apply(&mut ctx, old_root.root, &mutations)?;
        let tail = ctx.write_out_but_tail()?;
        self.count_nodes_written(ctx.nodes_written);
        // Extents written ahead of the commit that the group replaced before it: never in
        // any tree, free once this commit is durable (a reader may hold one, as any freed
        // extent, until it lets go of the root it read under).
        ctx.freed
            .extend(frozen.dead.iter().map(|e| (e.offset, e.allocated_bytes())));
        ahead.extend_from_slice(&frozen.dead);
        let committing = ahead.iter().map(|e| e.offset).collect();
        let ranges = written_ranges(&mut ctx, &mutations);
        let sb = self.publish(
            &mut ctx.freed,
            &previous,
            new_root,
            tid,
            Written {
                committing: &committing,
                tail,
                ranges: Some(ranges),
            },
            |sb| Superblock {
                committed_tid: tid,
                next_tid: previous.next_tid.max(tid + 1),
                commit_time_ns: commit_time,
                live_objects: previous
                    .live_objects
                    .saturating_add_signed(frozen.objects_delta),
                ..sb
            },
        )?;
        Ok((new_root, std::mem::take(&mut ctx.freed), sb, ahead))
    }

    /// Makes a written tree durable: the space map as of after this commit, then the
    /// superblock `make` finishes from the previous one with the new root and map filled in,
    /// and a flush. Between the two, a commit that lists what it wrote (`Written::ranges`)
    /// writes that list as its manifest, which the superblock names, and mount checks it
    /// (`format::manifest`); any other commit, and one too large to check at mount or on a
    /// device whose barrier costs nothing, puts a barrier there: the tree and map before the
    /// superblock, a flush where the device orders no other way.
    /// `written` says what the map must know of the commit's writes (`Written`).
    fn publish(
        &self,
        freed: &mut Vec<(u64, u64)>,
        previous: &Superblock,
        new_root: Root,
        tid: u64,
        mut written: Written<'_>,
        make: impl FnOnce(Superblock) -> Superblock,
    ) -> Result<Superblock> {
        let checked = written.ranges.as_ref().is_some_and(|ranges| {
            !self.device.orders_writes()
                && ranges.len() <= MANIFEST_RANGES_MAX
                && ranges.iter().map(|r| r.bytes).sum::<u64>() <= MANIFEST_COVERS_MAX
        });
        if !checked {
            written.ranges = None;
        }
        let map = self.write_space_map(previous, freed, tid, written)?;
        bump(&self.counters.written.maps, map.bytes);
        let (manifest_address, manifest_bytes, manifest_checksum) = match map.manifest {
            Some(manifest) => {
                bump(&self.counters.written.manifests, manifest.1);
                manifest
            }
            None => {
                self.counters.barriers.fetch_add(1, Ordering::Relaxed);
                self.device.barrier()?;
                (0, 0, 0)
            }
        };
        let sb = make(Superblock {
            seq: previous.seq + 1,
            root_address: new_root.address,
            root_level: new_root.level,
            used_bytes: map.used_bytes,
            space_map_address: map.address,
            space_map_bytes: map.bytes,
            manifest_address,
            manifest_bytes,
            manifest_checksum,
            proven: false,
            ..previous.clone()
        });
        self.write_superblock_now(&sb)?;
        Ok(sb)
    }

    /// Lets the host drop the pages of the extents a durable commit linked (or freed) that
    /// were written ahead of it: they are on the device, and reads bypass the host's cache.
    fn forget_direct(&self, ahead: &[ExtentRef], dead: &[ExtentRef]) {
        for extent in dead {
            self.cache.remove_extent(extent);
        }
        // Whole blocks: the host drops only whole pages, and packed extents share theirs.
        let mut ranges: Vec<(u64, u64)> = ahead.iter().map(ExtentRef::block_span).collect();
        ranges.sort_unstable();
        let mut run: Option<(u64, u64)> = None;
        for (offset, bytes) in ranges {
            run = match run {
                Some((start, len)) if offset <= start + len => {
                    Some((start, len.max(offset + bytes - start)))
                }
                Some((start, len)) => {
                    self.device.forget_staged(start, len);
                    Some((offset, bytes))
                }
                None => Some((offset, bytes)),
            };
        }
        if let Some((start, len)) = run {
            self.device.forget_staged(start, len);
        }
    }

    /// Hands what a durable commit freed to the root it replaced: the space returns to the
    /// allocator when that root's last reader lets go, and counts as free in every space map
    /// written until then.
    ///
    /// Called under the state lock, as the new root replaces `old_root`: from here on no
    /// operation walks the nodes the commit replaced, so they leave the cache now. (Dropped
    /// while the commit was written, every writer that walked a changed path during it read
    /// the old node back from the device.) Their blocks hold them until the old root's last
    /// reader lets go, and a node later written at a reused address replaces the entry.
    fn retire(&self, old_root: &RootRef, freed: Vec<(u64, u64)>) {
        for &(address, bytes) in &freed {
            if bytes == NODE_BYTES as u64 {
                self.cache.remove_node(address);
            }
        }
        self.space.defer(&freed);
        old_root.release.lock().extend(freed);
    }

    /// Writes the free map as it will be once this commit is durable, into space it
    /// allocates for itself (so the map counts its own blocks as used), and frees the
    /// previous commit's map and manifest with the rest of `freed`. With `written.ranges`,
    /// writes the commit's manifest too: those ranges and the map's own, in space allocated
    /// with the map's.
    fn write_space_map(
        &self,
        previous: &Superblock,
        freed: &mut Vec<(u64, u64)>,
        tid: u64,
        written: Written<'_>,
    ) -> Result<SpaceMapPlace> {
        let Written {
            committing,
            tail,
            ranges,
        } = written;
        if previous.space_map_address != 0 {
            freed.push((previous.space_map_address, previous.space_map_bytes));
        }
        if previous.manifest_address != 0 {
            freed.push((previous.manifest_address, previous.manifest_bytes));
        }
        // Whole nodes, the map and the manifest both: they move at every commit, and one of
        // a few blocks would leave holes smaller than a node behind it, free space that no
        // commit can use for the nodes it copies (a full volume then fails the commit of a
        // delete, with hundreds of KiB free in 4 KiB pieces; the manifest's holes did that
        // to one run in three of `tests/full_volume.rs` on a loaded machine).
        let node_round = |b: u64| b.div_ceil(NODE_BYTES as u64) * NODE_BYTES as u64;
        let manifest_bytes = ranges
            .as_ref()
            .map(|r| node_round(manifest::block_bytes_for(r.len() + 1)));
        let mut bytes = node_round(previous.space_map_bytes.max(BLOCK_BYTES));
        // Right after the commit's last nodes where that is free, written with them, and
        // the manifest right after the map.
        let tail_end = tail.as_ref().map(|(start, run)| start + run.len() as u64);
        loop {
            let address = match tail_end {
                Some(end) if self.space.allocate_at(end, bytes) => end,
                _ => self.space.allocate(bytes, Purpose::Metadata)?,
            };
            let manifest_at = match manifest_bytes {
                Some(m) if self.space.allocate_at(address + bytes, m) => Some(address + bytes),
                Some(m) => match self.space.allocate(m, Purpose::Metadata) {
                    Ok(at) => Some(at),
                    Err(e) => {
                        self.space.release(address, bytes);
                        return Err(e);
                    }
                },
                None => None,
            };
            let release = || {
                self.space.release(address, bytes);
                if let (Some(at), Some(m)) = (manifest_at, manifest_bytes) {
                    self.space.release(at, m);
                }
            };
            let free = match self.space.persisted_free(freed, committing) {
                Ok(free) => free,
                Err(e) => {
                    release();
                    return Err(e);
                }
            };
            let payload = spacemap::encode_payload(&free, self.space.data_offset());
            let needed = spacemap::block_bytes_for(payload.len());
            if needed > bytes {
                // Too small: give the blocks back (nothing refers to them) and retry with
                // room to grow, so a slowly growing map is not reallocated by every commit.
                release();
                bytes = node_round(needed + needed / 8 + BLOCK_BYTES);
                continue;
            }
            let block = spacemap::seal(&payload, self.volume_id, tid, address, bytes);
            let mut pieces = Vec::with_capacity(3);
            let mut manifest = None;
            if let (Some(at), Some(m), Some(mut ranges)) = (manifest_at, manifest_bytes, ranges) {
                ranges.push(manifest::Range {
                    address,
                    bytes,
                    checksum: crate::checksum::checksum(&block),
                });
                let sealed = manifest::seal(&ranges, self.volume_id, tid, at, m);
                manifest = Some((at, m, crate::checksum::checksum(&sealed)));
                pieces.push((at, sealed));
            }
            pieces.push((address, block));
            if let Some(tail) = tail {
                pieces.push(tail);
            }
            self.write_joined(pieces)?;
            let free: u64 = free.iter().map(|(_, l)| l).sum();
            return Ok(SpaceMapPlace {
                address,
                bytes,
                used_bytes: self.space.data_bytes() - free,
                manifest,
            });
        }
    }

    /// Writes `pieces` (address, bytes), each piece that begins where another ends in the
    /// same request: one buffer, as the nodes alone were written (the thread's join buffer,
    /// sized for data runs, would grow for this and stay grown).
    fn write_joined(&self, mut pieces: Vec<(u64, Vec<u8>)>) -> Result<()> {
        pieces.sort_unstable_by_key(|(address, _)| *address);
        let mut run: Option<(u64, Vec<u8>)> = None;
        for (address, bytes) in pieces {
            run = match run {
                Some((start, mut joined)) if start + joined.len() as u64 == address => {
                    // Exactly: a run of a few MiB doubled for a map of a few KiB would hold
                    // twice its memory at the moment the commit peaks.
                    joined.reserve_exact(bytes.len());
                    joined.extend_from_slice(&bytes);
                    Some((start, joined))
                }
                Some((start, joined)) => {
                    self.device.write_at(&joined, start)?;
                    Some((address, bytes))
                }
                None => Some((address, bytes)),
            };
        }
        if let Some((start, joined)) = run {
            self.device.write_at(&joined, start)?;
        }
        Ok(())
    }

    /// Places extents side by side, packed back to back, and writes each contiguous run as
    /// one request, straight from the chunk buffers. `copies` go at the end of their
    /// groups' sets (`copies.rs`).
    fn write_extents(
        &self,
        mutations: &mut [Mutation],
        data: Vec<(usize, Stored)>,
        copies: Vec<copies::Copy>,
    ) -> Result<()> {
        // A copy's index in `data` is past the mutations'.
        let originals: Vec<ExtentRef> = copies.iter().map(|c| c.of).collect();
        let first_copy = mutations.len();
        let copy_of = |index: usize| index.checked_sub(first_copy).map(|k| originals[k]);
        let (data, groups, keep) = self.order_by_locality(mutations, data, copies);
        let mut recent = HashMap::new();
        let mut placed: Vec<(u64, &[u8])> = Vec::with_capacity(data.len());
        let mut copied = Vec::with_capacity(originals.len());
        let sizes: Vec<u64> = data.iter().map(|(_, s)| s.allocated_bytes()).collect();
        let (offsets, runs) = self.place_clustered(&sizes)?;
        if self.clusters_wanted.load(Ordering::Relaxed) {
            self.report_clusters(mutations, &data, &runs);
        }
        let sets = locality_sets(&offsets, &sizes, &groups, &runs);
        for ((((index, stored), offset), set), keep) in data.iter().zip(offsets).zip(sets).zip(keep)
        {
            let bytes = stored.bytes();
            if let Some(of) = copy_of(*index) {
                copied.push((of, offset, bytes.len() as u64, set));
                placed.push((offset, bytes));
                continue;
            }
            // A moved extent was never counted as pending.
            if !matches!(mutations[*index], Mutation::Relocate(..)) {
                let counted = stored.logical_bytes() as u64 + 64;
                let _ = self.frozen_unallocated.fetch_update(
                    Ordering::AcqRel,
                    Ordering::Acquire,
                    |v| Some(v.saturating_sub(counted)),
                );
            }
            #[expect(
                clippy::cast_possible_truncation,
                reason = "values are at most a 64 KiB chunk (the limits of log_entry_is_valid), \
                          stored compressed only when smaller"
            )]
            let stored_bytes = bytes.len() as u32;
            let extent = ExtentRef {
                offset,
                stored_bytes,
                logical_bytes: stored.logical_bytes(),
                checksum: crate::checksum::checksum(bytes),
                compression: stored.compression(),
                set,
            };
            match &mut mutations[*index] {
                Mutation::Insert(element) => element.payload = Payload::Extent(extent),
                Mutation::Relocate(_, payload) => *payload = Payload::Extent(extent),
                _ => {}
            }
            // The chunk is at hand decoded: a read or a partial overwrite soon after the
            // commit (the common case) finds it without reading the device.
            self.cache.insert_extent(extent, stored.value.clone());
            if keep {
                recent.insert(offset, (extent, stored.clone()));
            }
            placed.push((offset, bytes));
        }
        *self.recent.lock() = recent;
        let written = self.write_placed(&placed, |slices, at| {
            self.device.write_vectored_at(slices, at)
        });
        // Written or not, nothing refers to a copy's space.
        self.copies_written(&copied, written.is_ok());
        written
    }

    /// Writes data placed by `space` (`(offset, bytes)` in device order) in as few requests
    /// as `write` can take: pieces that lie back to back go together, and so does a piece
    /// that begins the block after the run's last one (an allocation of its own), with zeros
    /// over the free end of that block. A run is cut after `DATA_RUN_BYTES_MAX` only where
    /// a piece begins a block, and each request ends with zeros up to its last block's end,
    /// so every request covers whole blocks that no other allocation shares. Counts the
    /// bytes of each request that succeeds.
    fn write_placed(
        &self,
        placed: &[(u64, &[u8])],
        mut write: impl FnMut(&[&[u8]], u64) -> std::io::Result<()>,
    ) -> Result<()> {
        static ZEROS: [u8; BLOCK_LEN] = [0; BLOCK_LEN];
        #[expect(
            clippy::cast_possible_truncation,
            reason = "zeros only up to a block's end"
        )]
        let zeros = |from: u64, to: u64| &ZEROS[..(to - from) as usize];
        let mut start = 0;
        while start < placed.len() {
            let first = placed[start].0;
            debug_assert!(first % BLOCK_BYTES == 0, "a write request begins a block");
            let mut slices: Vec<&[u8]> = vec![placed[start].1];
            let mut run_end = first + placed[start].1.len() as u64;
            let mut padding = 0;
            let mut end = start + 1;
            while let Some(&(next, bytes)) = placed.get(end) {
                let joins = next >= run_end && next <= run_end.next_multiple_of(BLOCK_BYTES);
                let long = run_end - first >= DATA_RUN_BYTES_MAX && next % BLOCK_BYTES == 0;
                if !joins || long {
                    break;
                }
                if next > run_end {
                    slices.push(zeros(run_end, next));
                    padding += next - run_end;
                }
                slices.push(bytes);
                run_end = next + bytes.len() as u64;
                end += 1;
            }
            let block_end = run_end.next_multiple_of(BLOCK_BYTES);
            if block_end > run_end {
                slices.push(zeros(run_end, block_end));
                padding += block_end - run_end;
            }
            write(&slices, first)?;
            bump(&self.counters.written.data, block_end - first);
            bump(&self.counters.written.padding, padding);
            start = end;
        }
        Ok(())
    }

    /// Writes whole chunks ahead of their commit, as HAMMER wrote file data: each is
    /// compressed with `codec` (when that pays), checksummed and written once to the place
    /// it will have in the tree (with O_DIRECT where the device takes it, else through the
    /// host's page cache: either way the bytes survive this process as soon as the call
    /// returns, as the crash log does), and the operation that takes them logs only their
    /// addresses (`Tx::put_extent`). The commit links them and writes nothing of them
    /// again; after its flush the host may drop what it cached of them.
    /// Extents an operation does not take must go back through `release_direct`.
    pub fn write_direct(&self, chunks: &[&[u8]], codec: u8) -> Result<Vec<ExtentRef>> {
        if self.is_read_only() {
            return Err(self.read_only_error());
        }
        if self.is_slave() {
            return Err(Error::Slave);
        }
        let encoded: Vec<Option<(u8, Vec<u8>)>> =
            chunks.iter().map(|c| encode_extent(c, codec)).collect();
        let stored = |i: usize| -> &[u8] {
            match &encoded[i] {
                Some((_, compressed)) => compressed,
                None => chunks[i],
            }
        };
        let sizes: Vec<u64> = (0..chunks.len()).map(|i| stored(i).len() as u64).collect();
        let offsets = match self.space.allocate_provisional(&sizes) {
            Ok(offsets) => offsets,
            // No free range holds them all: each where it fits.
            Err(Error::NoSpace) if sizes.len() > 1 => {
                let mut offsets = Vec::with_capacity(sizes.len());
                for size in &sizes {
                    match self.space.allocate_provisional(&[*size]) {
                        Ok(one) => offsets.extend(one),
                        Err(e) => {
                            for (offset, size) in offsets.iter().zip(&sizes) {
                                self.space.release_provisional(*offset, *size);
                            }
                            return Err(e);
                        }
                    }
                }
                offsets
            }
            Err(e) => return Err(e),
        };
        let extents: Vec<ExtentRef> = (0..chunks.len())
            .map(|i| {
                let bytes = stored(i);
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "a chunk is at most 64 KiB, stored compressed only when smaller"
                )]
                ExtentRef {
                    offset: offsets[i],
                    stored_bytes: bytes.len() as u32,
                    logical_bytes: chunks[i].len() as u32,
                    checksum: crate::checksum::checksum(bytes),
                    compression: encoded[i]
                        .as_ref()
                        .map_or(crate::format::record::compression::NONE, |(c, _)| *c),
                    set: LocalitySet::NONE,
                }
            })
            .collect();
        // Neighbours on the device go in one request.
        let mut placed: Vec<(u64, &[u8])> =
            (0..chunks.len()).map(|i| (offsets[i], stored(i))).collect();
        placed.sort_unstable_by_key(|(offset, _)| *offset);
        if let Err(e) = self.write_placed(&placed, |slices, at| {
            self.device.write_staged_vectored_at(slices, at)
        }) {
            self.release_direct(&extents);
            return Err(e);
        }
        // What was just written is what is read next (a file read back, or a chunk
        // written in part soon after): one copy into the cache, as a commit leaves the
        // chunks it wrote there.
        for (extent, chunk) in extents.iter().zip(chunks) {
            self.cache.insert_extent(*extent, Arc::new(chunk.to_vec()));
        }
        Ok(extents)
    }

    /// Frees extents `write_direct` wrote that no operation took.
    pub fn release_direct(&self, extents: &[ExtentRef]) {
        for extent in extents {
            self.space
                .release_provisional(extent.offset, extent.allocated_bytes());
        }
    }

    /// Asks the next commit to place `obj`'s data right after `near`'s (when both are in
    /// it), as Hummingbird's `collocate_files` did: a proxy names the page an embedded
    /// image belongs to, and a later visit of the page reads both in one cluster window.
    /// A hint lives until the commit that writes `obj`'s data.
    pub fn set_locality(&self, obj: u64, near: u64) {
        let mut hints = self.locality.lock();
        if hints.len() >= LOCALITY_HINTS_MAX {
            hints.clear();
        }
        // Chains resolve to the first object: images of a page all follow the page.
        let near = hints.get(&near).copied().unwrap_or(near);
        if near != obj {
            hints.insert(obj, near);
        }
    }

    /// Packs late, as Hummingbird did: the files of a hint group whose data is already on
    /// the device, split over several sets (or alone), join this commit's set for the
    /// group when their stored bytes are in the cache, which they are when the hints came
    /// with reads of them (a proxy names the page of every image it serves). Each moves
    /// as reblock moves an extent (`Mutation::Relocate`: same element, same TIDs, the old
    /// extent freed), so history and as-of reads see nothing new. Files this commit
    /// changes are left alone (their own changes place them), as are files of several
    /// chunks, and a group already read in one request. A file named by a hint before it
    /// has data keeps its hint for the commit that writes it.
    ///
    /// A group this commit adds data to also takes along the files its earlier commits
    /// placed (`group_members`: a page whose first visit straddled two commits, or whose
    /// images changed since), when those are cached and hold at most
    /// `REGROUP_PREVIOUS_RATIO` times the new bytes, all within one cluster window: the
    /// group is read in one request again, for a bounded share of rewritten bytes.
    fn regroup(
        &self,
        old_root: &RootRef,
        frozen: &Overlay,
        mutations: &mut Vec<Mutation>,
        data: &mut Vec<(usize, Stored)>,
    ) {
        // Room for the copies until the commit is durable, with a wide margin: a commit must
        // not fail for want of space because of a move, and a volume that runs nearly full
        // (a cache directory evicting) has its free space in pieces.
        let free = self.space.free_bytes();
        if free < self.space.data_bytes() / 4
            || (self.locality.lock().is_empty() && self.group_members.lock().is_empty())
        {
            return;
        }
        // Files whose data this commit changes (an inode's times changing moves nothing).
        let is_data = |rtype: u8| rtype == rtype::DATA || rtype == rtype::PATCH;
        let changed: HashSet<u64> = frozen
            .map
            .keys()
            .into_iter()
            .filter(|lk| is_data(lk.rtype))
            .map(|lk| lk.obj)
            .chain(
                frozen
                    .prune
                    .iter()
                    .filter(|key| is_data(key.rtype))
                    .map(|key| key.obj),
            )
            .collect();
        let hints = self.locality.lock();
        let group_of = |obj: u64| hints.get(&obj).copied().unwrap_or(obj);
        // Each group's hinted files on the device, and the bytes of its data in this commit.
        let mut groups: HashMap<u64, (Vec<u64>, u64)> = HashMap::new();
        for (index, stored) in data.iter() {
            let group = group_of(mutations[*index].key().obj);
            groups.entry(group).or_default().1 += stored.allocated_bytes();
        }
        for (&obj, &group) in hints.iter() {
            if !changed.contains(&obj) {
                groups.entry(group).or_default().0.push(obj);
            }
        }
        drop(hints);
        let mut previous = self.group_members.lock();
        let mut room = (free / 16).min(REGROUP_BYTES_MAX);
        let mut settled: Vec<u64> = Vec::new();
        let mut joined: Vec<(u64, u64)> = Vec::new();
        // A group's first file may be hinted into another group: it moves once.
        let mut seen: HashSet<u64> = HashSet::new();
        for (group, (mut members, fresh)) in groups {
            if !changed.contains(&group) {
                members.push(group);
            }
            let mut found = self.movable_extents(old_root, &members, &mut seen, &mut settled);
            let mut along = Vec::new();
            if fresh > 0 {
                if let Some(earlier) = previous.get_mut(&group) {
                    earlier.retain(|obj| !changed.contains(obj));
                    along = self.movable_extents(old_root, earlier, &mut seen, &mut Vec::new());
                    // Files deleted, grown past one extent or claimed by another group's
                    // hint leave the group's record.
                    *earlier = along.iter().map(|(key, _)| key.obj).collect();
                    let bytes = |found: &[(Key, ExtentRef)]| -> u64 {
                        found.iter().map(|(_, e)| e.allocated_bytes()).sum()
                    };
                    let moved = bytes(&along);
                    if moved > fresh * REGROUP_PREVIOUS_RATIO
                        || fresh + moved + bytes(&found) > CLUSTER_WINDOW_BYTES
                    {
                        along.clear();
                    }
                }
            }
            let reads: HashSet<(u64, u64)> = found
                .iter()
                .chain(&along)
                .map(|(_, e)| e.set_span().unwrap_or((e.offset, e.allocated_bytes())))
                .collect();
            if reads.len() + usize::from(fresh > 0) < 2 {
                settled.extend(found.iter().map(|(key, _)| key.obj));
                continue;
            }
            let hinted = found.len();
            found.append(&mut along);
            // A moved file's hint places it in the group (`order_by_locality` drops it).
            for (at, (key, extent)) in found.into_iter().enumerate() {
                let stored = match extent.allocated_bytes() <= room {
                    true => self.cached_stored(&extent),
                    false => None,
                };
                let Some(stored) = stored else {
                    if at < hinted {
                        settled.push(key.obj);
                    }
                    continue;
                };
                room -= extent.allocated_bytes();
                self.counters.regrouped.0.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .regrouped
                    .1
                    .fetch_add(extent.allocated_bytes(), Ordering::Relaxed);
                if at >= hinted {
                    joined.push((key.obj, group));
                }
                data.push((mutations.len(), stored));
                // The payload is filled in once the extent is placed.
                mutations.push(Mutation::Relocate(key, Payload::Inline(Vec::new())));
            }
        }
        drop(previous);
        let mut hints = self.locality.lock();
        for obj in settled {
            hints.remove(&obj);
        }
        hints.extend(joined);
    }

    /// The extents of `objects` (each the one movable extent of an object not yet `seen`)
    /// in the committed tree. Objects found with no data are left out, as are objects
    /// whose data is not one movable extent or cannot be read; those two also go to
    /// `unmovable`.
    fn movable_extents(
        &self,
        root: &RootRef,
        objects: &[u64],
        seen: &mut HashSet<u64>,
        unmovable: &mut Vec<u64>,
    ) -> Vec<(Key, ExtentRef)> {
        let mut found = Vec::with_capacity(objects.len());
        for &obj in objects {
            if !seen.insert(obj) {
                continue;
            }
            match self.lone_extent(root, obj) {
                // Not written yet: the hint waits for the commit that writes it.
                Ok(None) => {}
                Ok(Some(extent)) => {
                    if extent.is_none() {
                        unmovable.push(obj);
                    }
                    found.extend(extent);
                }
                Err(e) => {
                    log::debug!("regroup: object {obj}: {e}");
                    unmovable.push(obj);
                }
            }
        }
        found
    }

    /// The one extent holding all of `obj`'s data in the committed tree, if its data is
    /// one small chunk in an extent: Ok(None) when it has no data, Ok(Some(None)) when its
    /// data is not one movable extent.
    fn lone_extent(&self, root: &RootRef, obj: u64) -> Result<Option<Option<(Key, ExtentRef)>>> {
        let lo = Key::new(
            LogicalKey {
                obj,
                rtype: rtype::DATA,
                key: 0,
            },
            0,
        );
        let hi = Key::new(
            LogicalKey {
                obj,
                rtype: rtype::PATCH,
                key: u64::MAX,
            },
            u64::MAX,
        );
        let mut live = 0usize;
        let mut one = None;
        let walk = btree::range(&self.loader(), root.root, &lo, &hi, &mut |e| {
            if e.delete_tid != 0 || (e.key.rtype != rtype::DATA && e.key.rtype != rtype::PATCH) {
                return true;
            }
            live += 1;
            one = match (e.key.rtype, e.payload()) {
                (rtype::DATA, Payload::Extent(extent)) => Some((e.key, extent)),
                _ => None,
            };
            live < 2
        });
        btree::loaded(walk)?;
        Ok(match live {
            0 => None,
            1 => Some(one.filter(|(_, e)| e.allocated_bytes() <= CLUSTER_EXTENT_BYTES_MAX)),
            _ => Some(None),
        })
    }

    /// An extent's stored bytes from the cache (its set's bytes, or its decoded bytes
    /// encoded again), verified; None when neither is cached. Never reads the device.
    fn cached_stored(&self, extent: &ExtentRef) -> Option<Stored> {
        if let Some((written, stored)) = self.recent.lock().get(&extent.offset) {
            if written == extent {
                return Some(stored.clone());
            }
        }
        if let Some((start, len)) = extent.set_span() {
            if let Some(set) = self.cache.peek_set(start, len) {
                let stored = set_member(extent, start, &set)?;
                if let Ok(value) = decode_extent(extent, stored) {
                    let encoded = (extent.compression != crate::format::record::compression::NONE)
                        .then(|| (extent.compression, stored.to_vec()));
                    return Some(Stored {
                        value: Arc::new(value),
                        encoded,
                    });
                }
            }
        }
        let value = self.cache.peek_extent(extent)?;
        Some(Stored {
            encoded: encode_extent(&value, extent.compression),
            value,
        })
    }

    /// Asks commits to report which objects' data they write into one cluster
    /// (`take_clusters`); eviction of cache directories drops such files together.
    pub fn track_clusters(&self) {
        self.clusters_wanted.store(true, Ordering::Relaxed);
    }

    /// The clusters commits wrote since the last call: the objects of each.
    pub fn take_clusters(&self) -> Vec<Vec<u64>> {
        std::mem::take(&mut *self.clusters.lock())
    }

    fn report_clusters(
        &self,
        mutations: &[Mutation],
        data: &[(usize, Stored)],
        runs: &[Range<usize>],
    ) {
        let mut reported = self.clusters.lock();
        for run in runs {
            let mut objects: Vec<u64> = data[run.clone()]
                .iter()
                .filter_map(|(index, _)| mutations.get(*index).map(|m| m.key().obj))
                .collect();
            objects.dedup();
            if objects.len() > 1 {
                reported.push(objects);
            }
        }
        if reported.len() > CLUSTERS_KEPT_MAX {
            let excess = reported.len() - CLUSTERS_KEPT_MAX;
            reported.drain(..excess);
        }
    }

    /// Orders the extents a commit writes by (locality group, key): without hints, key
    /// order (objects in creation order, each object's chunks in file order); a hinted
    /// object's data follows its group's first object. Beside each extent, its group when
    /// that holds more than one object named together by hints (0: none), and whether it
    /// belongs to one of the groups written last (the newest objects), which the next
    /// commit may add to (`recent`).
    ///
    /// `copies` follow the last member of their group, each with the index
    /// `mutations.len()` plus its position in `copies`; a group with a copy is a set.
    fn order_by_locality(
        &self,
        mutations: &[Mutation],
        data: Vec<(usize, Stored)>,
        copies: Vec<copies::Copy>,
    ) -> (Vec<(usize, Stored)>, Vec<u64>, Vec<bool>) {
        let mut hints = self.locality.lock();
        if hints.is_empty() && copies.is_empty() {
            let groups = vec![0; data.len()];
            let recent = vec![false; data.len()];
            return (data, groups, recent);
        }
        // (group, object, position) beside each extent; a copy's object is `COPY`, after
        // every object of its group.
        const COPY: u64 = u64::MAX;
        type Keyed = ((u64, u64, usize), (usize, Stored));
        let mut keyed: Vec<Keyed> = data
            .into_iter()
            .enumerate()
            .map(|(at, (index, stored))| {
                let obj = mutations[index].key().obj;
                let group = hints.get(&obj).copied().unwrap_or(obj);
                ((group, obj, at), (index, stored))
            })
            .collect();
        for ((_, obj, _), _) in &keyed {
            hints.remove(obj);
        }
        drop(hints);
        let first_copy = keyed.len();
        keyed.extend(copies.into_iter().enumerate().map(|(k, copy)| {
            (
                (copy.group, COPY, first_copy + k),
                (mutations.len() + k, copy.stored),
            )
        }));
        keyed.sort_unstable_by_key(|(order, _)| *order);
        // A group is a locality set where a hint joined two objects in it.
        let mut groups: Vec<u64> = keyed.iter().map(|((group, _, _), _)| *group).collect();
        let mut members = self.group_members.lock();
        let mut start = 0;
        while start < keyed.len() {
            let group = groups[start];
            let end = start + groups[start..].iter().take_while(|&&g| g == group).count();
            let run = &keyed[start..end];
            let hinted = run.iter().any(|((group, obj, _), _)| obj != group);
            let named = hinted && run.iter().any(|((_, obj, _), _)| *obj != run[0].0 .1);
            if hinted || members.contains_key(&group) {
                let objects = run.iter().map(|((_, obj, _), _)| *obj);
                remember_members(&mut members, group, objects.filter(|&obj| obj != COPY));
            }
            if !named {
                groups[start..end].fill(0);
            }
            start = end;
        }
        drop(members);
        // The groups of the newest objects (ids grow with creation), newest first, whole.
        let mut newest: Vec<(u64, u64)> = Vec::new(); // (newest object, group)
        for ((group, obj, _), _) in keyed.iter().filter(|((_, obj, _), _)| *obj != COPY) {
            match newest.last_mut() {
                Some((top, g)) if g == group => *top = (*top).max(*obj),
                _ => newest.push((*obj, *group)),
            }
        }
        newest.sort_unstable_by(|a, b| b.cmp(a));
        let mut bytes_of: HashMap<u64, u64> = HashMap::new();
        for ((group, _, _), (_, stored)) in &keyed {
            *bytes_of.entry(*group).or_default() += stored.allocated_bytes();
        }
        let mut kept: HashSet<u64> = HashSet::new();
        // As much as a commit gathers before it is due (`wants_commit`): the pending
        // budget's scale, which a deployment sizes with the cache.
        let mut room = self.pending_bytes_max / 2;
        for (_, group) in newest {
            let bytes = bytes_of.get(&group).copied().unwrap_or(0);
            if bytes > room {
                break;
            }
            room -= bytes;
            kept.insert(group);
        }
        let recent = keyed
            .iter()
            .map(|((group, obj, _), _)| *obj != COPY && kept.contains(group))
            .collect();
        let data = keyed.into_iter().map(|(_, extent)| extent).collect();
        (data, groups, recent)
    }

    /// Allocates space for extents of `sizes` (whole blocks, in the order they are written):
    /// small ones that follow each other go into one free range per cluster window, so
    /// that files written together lie together even where free space is fragmented (a
    /// next-fit allocator would otherwise scatter them over the holes after the cursor).
    /// Returns the offsets and the clusters (ranges of `sizes`, two or more extents each).
    /// On failure (no room left for some extent) nothing stays allocated.
    fn place_clustered(&self, sizes: &[u64]) -> Result<(Vec<u64>, Vec<Range<usize>>)> {
        let mut offsets = Vec::with_capacity(sizes.len());
        let mut runs = Vec::new();
        if let Err(e) = self.place_runs(sizes, &mut offsets, &mut runs) {
            self.release_placed(&offsets, sizes);
            return Err(e);
        }
        Ok((offsets, runs))
    }

    /// Gives back space `place_clustered` allocated that nothing refers to yet.
    fn release_placed(&self, offsets: &[u64], sizes: &[u64]) {
        for (&offset, &size) in offsets.iter().zip(sizes) {
            self.space.release(offset, size);
        }
    }

    /// `place_clustered`'s allocations, into `offsets` and `runs`.
    fn place_runs(
        &self,
        sizes: &[u64],
        offsets: &mut Vec<u64>,
        runs: &mut Vec<Range<usize>>,
    ) -> Result<()> {
        let mut start = 0;
        while start < sizes.len() {
            let mut end = start + 1;
            let mut bytes = sizes[start];
            if sizes[start] <= CLUSTER_EXTENT_BYTES_MAX {
                while end < sizes.len()
                    && sizes[end] <= CLUSTER_EXTENT_BYTES_MAX
                    && bytes + sizes[end] <= CLUSTER_WINDOW_BYTES
                {
                    bytes += sizes[end];
                    end += 1;
                }
            }
            match self
                .space
                .allocate_run(&sizes[start..end], Purpose::Metadata)
            {
                Ok(run) => {
                    offsets.extend(run);
                    if end > start + 1 {
                        runs.push(start..end);
                    }
                }
                // No free range holds the whole cluster: its members go where they fit.
                Err(Error::NoSpace) if end > start + 1 => {
                    for &size in &sizes[start..end] {
                        offsets.push(self.space.allocate(size, Purpose::Metadata)?);
                    }
                }
                Err(e) => return Err(e),
            }
            start = end;
        }
        Ok(())
    }

    /// Makes every change made so far survive a crash of this process: appends the changes
    /// not yet in the redo log as one batch, through the host's page cache (a power loss
    /// needs `sync_log` as well). Concurrent callers share batches: a caller whose changes
    /// another caller's batch took returns without writing. A batch too large for the log
    /// is made durable by a commit instead.
    pub fn log_changes(&self) -> Result<()> {
        loop {
            let mut ring = self.log.lock();
            if self.is_read_only() {
                // A failure stopped the volume: changes waiting in memory (this caller's
                // among them, perhaps in a group whose commit failed) will not be durable.
                return match self.has_pending() {
                    true => Err(self.read_only_error()),
                    false => Ok(()),
                };
            }
            if ring.frozen_unlogged {
                // This caller's changes may be in the group being committed without a batch:
                // they are safe once that commit is. (It clears the flag under this lock
                // before it counts a generation, so the count read here is older.)
                let generation = *self.commit_signal.0.lock();
                drop(ring);
                self.wait_for_commit(generation);
                continue;
            }
            let (unlogged, next_obj) = {
                let mut st = self.state.lock();
                if st.active.log_dirty.is_empty() {
                    return Ok(());
                }
                (take_unlogged(&mut st.active), st.next_obj)
            };
            if self.append(&mut ring, next_obj, &log_entries(&unlogged))? {
                return Ok(());
            }
            return_unlogged(&mut self.state.lock().active, &unlogged);
            drop(ring);
            // No room until a commit, or too large. A commit under way frees the ring when
            // it is durable: wait for it and try again. Committing here instead waited for
            // that commit and then made one more on this caller's time, of a group the
            // committer would have taken. With none under way, commit (which makes these
            // changes durable and frees the ring), then log whatever came after.
            let started = std::time::Instant::now();
            match self.commit_lock.try_lock() {
                Some(commit) => {
                    self.commit_holding(commit)?;
                    self.counters.waited(&self.counters.log_full.1, started);
                }
                None => {
                    drop(self.commit_lock.lock());
                    self.counters.waited(&self.counters.log_full.0, started);
                }
            }
        }
    }

    /// Writes `batch` (of the ring's current epoch and sequence number) where the ring has
    /// room. False if it is too large or there is no room (nothing written).
    ///
    /// The write covers whole pages: the start of the page the batch begins in (as the last
    /// append left it), the batch, zeros to the page's end. A write of part of a page that
    /// the host no longer caches would first read the page from the device: measured, that
    /// read doubled the cost of a small create on a loop device.
    fn append(&self, ring: &mut LogRing, next_obj: u64, entries: &[EntryRef<'_>]) -> Result<bool> {
        let len = batch_bytes(entries);
        if len > ring.batch_bytes_max() {
            return Ok(false);
        }
        let Some(pos) = ring.place(len) else {
            return Ok(false);
        };
        // The page's start as the last append left it; it becomes the new head's page.
        let mut page = std::mem::take(&mut ring.page);
        if pos != ring.head {
            page.clear();
        }
        let start = pos - page.len() as u64;
        debug_assert_eq!(start % LOG_PAGE_BYTES, 0);
        let end = (pos + len).div_ceil(LOG_PAGE_BYTES) * LOG_PAGE_BYTES;
        let head = pos + len;
        let head_page = head / LOG_PAGE_BYTES * LOG_PAGE_BYTES;
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a batch is at most LOG_BATCH_BYTES_MAX (8 MiB), with under a page on \
                      either side; start <= head_page <= head <= end"
        )]
        let (span, batch_at, batch_end, page_at, page_end) = (
            (end - start) as usize,
            (pos - start) as usize,
            (head - start) as usize,
            (head_page - start) as usize,
            (head - start) as usize,
        );
        let fields = ring.batch_head(next_obj);
        let volume_id = self.volume_id;
        // Encodes the batch where it is written: the page's old start, the batch, zeros to
        // the page's end. Keeps the new head page's start in `page`.
        let mut fill = |pages: &mut [u8]| -> Option<()> {
            pages[..batch_at].copy_from_slice(&page);
            encode_batch_into(
                &mut pages[batch_at..batch_end],
                volume_id,
                LOG_OFFSET + pos,
                &fields,
                entries,
            )?;
            pages[batch_end..].fill(0);
            page.clear();
            page.extend_from_slice(&pages[page_at..page_end]);
            Some(())
        };
        let written = match &self.shadow {
            // Straight into the shadow's map: no copy of the batch.
            Some(shadow) => shadow.write_with(start, span, fill),
            None => {
                // A buffer kept from the last append: a fresh one costs a page fault per page.
                let mut pages = std::mem::take(&mut ring.scratch);
                pages.clear();
                pages.resize(span, 0);
                let encoded = fill(&mut pages);
                let written = self
                    .device
                    .write_staged_at(&pages, LOG_OFFSET + start)
                    .map(|()| encoded);
                if written.is_ok() {
                    bump(&self.counters.written.log, span as u64);
                }
                if pages.capacity() <= SCRATCH_BYTES_MAX {
                    ring.scratch = pages;
                }
                written
            }
        };
        let written = match written {
            Ok(Some(())) => Ok(()),
            Ok(None) => Err(std::io::Error::other(
                "a log batch did not fit the size computed for it",
            )),
            Err(e) => Err(e),
        };
        ring.page = page;
        if let Err(e) = written {
            let e = Error::Io(e);
            self.fail_read_only(&e);
            return Err(e);
        }
        if self.shadow.is_some() && ring.unsynced_from.is_none() {
            ring.unsynced_from = Some(start);
        }
        ring.head = head;
        ring.seq += 1;
        self.log_appends.fetch_add(1, Ordering::AcqRel);
        if ring.used() > ring.size / 2 && ring.follows == 0 {
            // No commit in flight: start one while the ring still has room.
            self.wake_committer();
        }
        Ok(true)
    }

    /// Waits until a commit newer than `generation` ends (or a while, so that callers
    /// re-check a volume that a failed commit stopped).
    fn wait_for_commit(&self, generation: u64) {
        let started = std::time::Instant::now();
        let mut current = self.commit_signal.0.lock();
        self.commit_signal.1.wait_while_for(
            &mut current,
            |g| *g == generation,
            Duration::from_millis(100),
        );
        drop(current);
        self.counters.waited(&self.counters.log_waits, started);
    }

    /// Makes every change made so far durable through the redo log (fsync): `log_changes`,
    /// then one flush, shared by callers that come together.
    pub fn sync_log(&self) -> Result<()> {
        if self.is_read_only() {
            // Nothing pending can be made durable; if nothing is pending, fsync succeeds.
            return match self.has_pending() {
                true => Err(self.read_only_error()),
                false => Ok(()),
            };
        }
        self.log_changes()?;
        if self.unsynced_log_bytes() >= SYNC_COMMIT_BYTES {
            // Mostly file data: copied to the image's log region, the same bytes would be
            // written again by the next commit, so commit now and write them once (a
            // 256 MiB file written and fsync'd spent a sixth of the daemon's time copying
            // the crash log to the image). Every change made before this call is in the
            // group this commit freezes, or in one committed before it.
            self.commit()?;
            return Ok(());
        }
        // Counted before the shadow is copied: every batch counted is in the copy.
        let written = self.log_appends.load(Ordering::Acquire);
        if self.log_flushed.load(Ordering::Acquire) >= written {
            return Ok(());
        }
        self.copy_shadow()?;
        let flushed = self.device.flush();
        if let Err(e) = flushed {
            let e = Error::Io(e);
            self.fail_read_only(&e);
            return Err(e);
        }
        self.log_flushed.fetch_max(written, Ordering::AcqRel);
        self.forget_synced_shadow();
        Ok(())
    }

    /// Bytes of the crash log (the shadow) that the image's log region lacks.
    fn unsynced_log_bytes(&self) -> u64 {
        if self.shadow.is_none() {
            return 0;
        }
        let ring = self.log.lock();
        match ring.unsynced_from {
            None => 0,
            Some(from) => (ring.head + ring.size - from) % ring.size,
        }
    }

    /// After an fsync: the shadow lets go of the pages the image's region holds (recovery
    /// reads them there), keeping those no fsync has copied yet and the head's page (the
    /// next append rewrites it whole). Pages another fsync copied but has not flushed yet
    /// may go too: a killed daemon's writes are on the device, and until that fsync returns
    /// a power loss may lose them.
    fn forget_synced_shadow(&self) {
        let Some(shadow) = &self.shadow else {
            return;
        };
        let ring = self.log.lock();
        let head_page = ring.head / LOG_PAGE_BYTES * LOG_PAGE_BYTES;
        let keep_from = ring.unsynced_from.unwrap_or(head_page);
        let keep_to = (head_page + LOG_PAGE_BYTES).min(ring.size);
        if keep_from <= head_page {
            shadow.forget(0, keep_from);
            shadow.forget(keep_to, ring.size);
        } else {
            // The pages not yet copied wrap round the end of the ring.
            shadow.forget(keep_to, keep_from);
        }
    }

    /// Copies the shadow's batches that the image's log region lacks into it (not yet
    /// durable: `sync_log` flushes after). Under the log lock, so that no append reuses the
    /// ring's space while its old bytes are on their way to the image.
    fn copy_shadow(&self) -> Result<()> {
        let Some(shadow) = &self.shadow else {
            return Ok(());
        };
        let mut ring = self.log.lock();
        let Some(from) = ring.unsynced_from else {
            return Ok(());
        };
        let end = ring.head.div_ceil(LOG_PAGE_BYTES) * LOG_PAGE_BYTES;
        let spans = match from <= ring.head {
            true => [(from, end.min(ring.size)), (0, 0)],
            false => [(from, ring.size), (0, end)],
        };
        for (lo, hi) in spans.into_iter().filter(|(lo, hi)| hi > lo) {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "a span of the shadow's ring, at most 64 MiB (shadow_ring_bytes)"
            )]
            let mut bytes = vec![0u8; (hi - lo) as usize];
            let copied = shadow
                .read_at(&mut bytes, lo)
                .and_then(|()| self.device.write_at(&bytes, LOG_OFFSET + lo));
            if let Err(e) = copied {
                let e = Error::Io(e);
                self.fail_read_only(&e);
                return Err(e);
            }
        }
        ring.unsynced_from = None;
        Ok(())
    }

    /// After a commit moved the ring's tail from `old_tail`: the shadow's pages now dead
    /// need no copy at the next fsync. (Their memory is kept for the appends to come; see
    /// `release_idle_log`.)
    fn forget_dead_shadow(&self, ring: &mut LogRing, old_tail: u64) {
        if self.shadow.is_none() {
            return;
        }
        let floor = |p: u64| p / LOG_PAGE_BYTES * LOG_PAGE_BYTES;
        let (base, limit) = (floor(old_tail), floor(ring.tail));
        let distance = |p: u64| (p + ring.size - base) % ring.size;
        if let Some(from) = ring.unsynced_from {
            if distance(from) < distance(limit) {
                ring.unsynced_from = (ring.head != ring.tail).then_some(limit);
            }
        }
    }

    /// On a volume with nothing pending and nothing live in the log (the committer found
    /// it idle for a whole interval): the shadow gives its memory back. Under load its
    /// pages are kept and rewritten: tmpfs allocating, zeroing and charging a fresh page for
    /// every append cost more than the append's copy.
    pub fn release_idle_log(&self) {
        let Some(shadow) = &self.shadow else {
            return;
        };
        let mut ring = self.log.lock();
        if ring.used() == 0 && !self.has_pending() {
            ring.unsynced_from = None;
            if let Err(e) = shadow.clear() {
                log::debug!("cannot empty the crash log: {e}");
            }
        }
    }

    /// After a clean close: deletes the shadow, whose batches the last commit made dead.
    pub fn close_log(&self) {
        if let Some(shadow) = &self.shadow {
            if !self.is_read_only() && !self.has_pending() {
                shadow.remove();
            }
        }
    }

    /// One step of reblock: moves the extents of elements from `from` on (up to about
    /// `budget_bytes`) side by side into fresh space in key order and rewrites the leaves
    /// they live in, then makes the new layout durable. Contents, keys and TIDs do not
    /// change, so as-of views and pending changes are unaffected. Runs under the commit lock.
    pub fn reblock_step(&self, from: Key, budget_bytes: u64) -> Result<ReblockStep> {
        if self.is_read_only() {
            return Err(self.read_only_error());
        }
        let _commit = self.commit_lock.lock();
        // Moving data needs room for the copy until the step is durable.
        let budget_bytes = budget_bytes.min(self.space.free_bytes() / 4);
        let old_root = self.root();
        let loader = self.loader();
        let mut batch: Vec<(Key, ExtentRef)> = Vec::new();
        let mut touched: Vec<Mutation> = Vec::new();
        let mut budget_used = 0u64;
        let mut next = None;
        let walk = btree::range(&loader, old_root.root, &from, &max_key(), &mut |e| {
            if budget_used >= budget_bytes {
                next = Some(e.key);
                return false;
            }
            match e.payload() {
                Payload::Extent(extent) => {
                    budget_used += extent.allocated_bytes();
                    batch.push((e.key, extent));
                }
                // Inline elements are touched too, so every leaf is rewritten in order.
                payload @ Payload::Inline(_) => {
                    budget_used += e.to_element().encoded_bytes() as u64;
                    touched.push(Mutation::Relocate(e.key, payload));
                }
            }
            true
        });
        crate::btree::loaded(walk)?;
        let mut step = ReblockStep {
            next,
            ..ReblockStep::default()
        };
        // Read what moves; an extent that fails its checksum stays where it is.
        let mut moving: Vec<(Key, ExtentRef, Vec<u8>)> = Vec::with_capacity(batch.len());
        for (key, extent) in batch {
            // A damaged length never sizes a buffer.
            let in_bounds = self.extent_in_bounds(&extent);
            let mut stored = vec![
                0u8;
                if in_bounds {
                    extent.stored_bytes as usize
                } else {
                    0
                }
            ];
            let readable = in_bounds
                && self.device.read_at(&mut stored, extent.offset).is_ok()
                && crate::checksum::checksum(&stored) == extent.checksum;
            if readable {
                moving.push((key, extent, stored));
            } else {
                log::error!(
                    "reblock: {} of {key:?} is damaged; left in place",
                    extent_location(&extent)
                );
                step.damaged += 1;
            }
        }
        let mut mutations = touched;
        // Packed back to back in key order, as a commit packs what it writes: the holes
        // that dead members left in blocks shared with live ones close up.
        let sizes: Vec<u64> = moving.iter().map(|(_, e, _)| e.allocated_bytes()).collect();
        let (offsets, _) = self.place_clustered(&sizes)?;
        let mut placed: Vec<(u64, &[u8])> = Vec::with_capacity(moving.len());
        for ((key, extent, stored), &offset) in moving.iter().zip(&offsets) {
            let allocated = extent.allocated_bytes();
            placed.push((offset, stored));
            // Moved out of its set: the blocks around the new place are other data.
            let moved = ExtentRef {
                offset,
                set: LocalitySet::NONE,
                ..*extent
            };
            mutations.push(Mutation::Relocate(*key, Payload::Extent(moved)));
            step.extents_moved += 1;
            step.bytes_moved += allocated;
        }
        let written = self.write_placed(&placed, |slices, at| {
            self.device.write_vectored_at(slices, at)
        });
        if let Err(e) = written {
            // Nothing refers to the copies: the step did not happen.
            self.release_placed(&offsets, &sizes);
            return Err(e);
        }
        mutations.sort_by_key(Mutation::key);
        let previous = self.state.lock().superblock.clone();
        let mut ctx = CommitContext::new(self.loader(), &self.space, previous.committed_tid);
        // Past here a failure stops the volume, as a failed commit does: the new tree's nodes
        // were allocated one by one and are not given back, and once the superblock may be
        // written nothing more must be. The copies go back (a stopped volume allocates no
        // more; a remount starts from the last superblock and its map).
        let stop = |e: Error| {
            self.release_placed(&offsets, &sizes);
            self.fail_read_only(&e);
            e
        };
        let new_root = apply(&mut ctx, old_root.root, &mutations).map_err(stop)?;
        let tail = ctx.write_out_but_tail().map_err(stop)?;
        step.nodes_written = ctx.nodes_written;
        self.count_nodes_written(ctx.nodes_written);
        let tid = previous.committed_tid;
        let ranges = written_ranges(&mut ctx, &mutations);
        let sb = self
            .publish(
                &mut ctx.freed,
                &previous,
                new_root,
                tid,
                Written {
                    committing: &HashSet::new(),
                    tail,
                    ranges: Some(ranges),
                },
                |sb| sb,
            )
            .map_err(stop)?;
        let freed = std::mem::take(&mut ctx.freed);
        let mut st = self.state.lock();
        self.retire(&old_root, freed);
        st.root = Arc::new(RootRef {
            root: new_root,
            tid: sb.committed_tid,
            next_obj: sb.next_obj,
            release: Mutex::new(Vec::new()),
            space: self.space.clone(),
        });
        st.superblock = sb;
        Ok(step)
    }

    /// Schedules exact elements for removal in the next commit (prune). The caller must
    /// commit before scheduling again, so an element is never removed twice.
    pub fn schedule_removals(&self, keys: impl IntoIterator<Item = Key>) -> Result<()> {
        if self.is_read_only() {
            return Err(self.read_only_error());
        }
        self.state.lock().active.prune.extend(keys);
        Ok(())
    }

    /// Hits, misses and size of the node and extent cache.
    pub fn cache_stats(&self) -> crate::cache::CacheStats {
        self.cache.stats()
    }

    /// Drops cached nodes and extents (for benchmarks that want cold caches).
    pub fn drop_caches(&self) {
        self.cache.clear();
        // What walks of the tree found goes too: the next read walks from the root.
        let mut st = self.state.lock();
        *st.live_memo.get_mut() = LiveMemo::default();
        st.upper_nodes.get_mut().clear();
        drop(st);
        // And the bytes the last commit wrote, kept for the next one's moves.
        self.recent.lock().clear();
    }

    /// Visits every element of the committed tree (for `check` and tools).
    pub fn scan(&self, visit: &mut dyn FnMut(&ElementView<'_>) -> bool) -> Result<()> {
        let root = self.root();
        let loader = self.loader();
        btree::loaded(btree::range(
            &loader,
            root.root,
            &Key::MIN,
            &max_key(),
            visit,
        ))
        .map(|_| ())
    }
}

pub(crate) type Step<T> = btree::Step<T>;

/// An extent as it goes to the device: the pending chunk, and its compressed form if any.
#[derive(Clone)]
struct Stored {
    value: Arc<Vec<u8>>,
    /// (codec, compressed bytes); None stores `value` itself, with no copy.
    encoded: Option<(u8, Vec<u8>)>,
}

impl Stored {
    fn bytes(&self) -> &[u8] {
        match &self.encoded {
            Some((_, compressed)) => compressed,
            None => &self.value,
        }
    }
    /// The bytes the extent will own on the device: its stored bytes (packed, not padded).
    fn allocated_bytes(&self) -> u64 {
        self.bytes().len() as u64
    }
    #[expect(
        clippy::cast_possible_truncation,
        reason = "values are at most a 64 KiB chunk (the limits of log_entry_is_valid)"
    )]
    fn logical_bytes(&self) -> u32 {
        self.value.len() as u32
    }
    fn compression(&self) -> u8 {
        self.encoded
            .as_ref()
            .map_or(crate::format::record::compression::NONE, |(codec, _)| {
                *codec
            })
    }
}

/// What a written commit produced: the new root, the ranges it freed, its superblock, and
/// the extents written ahead of it that it linked or freed.
type CommitOutcome = (Root, Vec<(u64, u64)>, Superblock, Vec<ExtentRef>);

/// Records where a hint group's data went in a commit: `objects` (in commit order, an
/// object once per chunk) first, then the group's earlier files this commit left where
/// they were, up to `GROUP_MEMBERS_MAX`. Past `LOCALITY_HINTS_MAX` groups, the record
/// starts over (it only steers placement).
fn remember_members(
    members: &mut HashMap<u64, Vec<u64>>,
    group: u64,
    objects: impl Iterator<Item = u64>,
) {
    if members.len() >= LOCALITY_HINTS_MAX && !members.contains_key(&group) {
        members.clear();
    }
    let mut now: Vec<u64> = Vec::new();
    for obj in objects {
        if now.last() != Some(&obj) {
            now.push(obj);
        }
    }
    now.truncate(GROUP_MEMBERS_MAX);
    members.insert(group, now);
}

/// The stored bytes of `extent` in the bytes of its set, which begins at `start`; None when
/// the set does not reach them.
fn set_member<'a>(extent: &ExtentRef, start: u64, set: &'a [u8]) -> Option<&'a [u8]> {
    let at = usize::try_from(extent.offset.checked_sub(start)?).ok()?;
    set.get(at..at.checked_add(extent.stored_bytes as usize)?)
}

/// The locality set of each extent a commit places: inside each cluster `place_clustered`
/// made (back to back in one free range), the two or more extents of one group named by
/// hints (`groups` nonzero, consecutive in commit order) are a set, each member told where
/// the set begins and how long it is. Placement itself does not cut clusters at sets:
/// cutting them put more, smaller clusters into the holes between used blocks, and a
/// cache directory's volume, fragmented by evictions, then had no range left for a whole
/// chunk (a commit failed with 3 MiB free in ranges of at most 60 KiB).
fn locality_sets(
    offsets: &[u64],
    sizes: &[u64],
    groups: &[u64],
    runs: &[Range<usize>],
) -> Vec<LocalitySet> {
    let mut sets = vec![LocalitySet::NONE; offsets.len()];
    for run in runs {
        let mut first = run.start;
        while first < run.end {
            let group = groups[first];
            let end = first
                + groups[first..run.end]
                    .iter()
                    .take_while(|&&g| g == group)
                    .count();
            let members = first..end;
            first = end;
            if group == 0 || members.len() < 2 {
                continue;
            }
            // Whole blocks: the first member may begin, and the last end, inside one.
            let start = offsets[members.start] / BLOCK_BYTES * BLOCK_BYTES;
            let last = members.end - 1;
            let end = (offsets[last] + sizes[last]).next_multiple_of(BLOCK_BYTES);
            let Ok(blocks) = u32::try_from((end - start) / BLOCK_BYTES) else {
                continue;
            };
            for at in members {
                let first_block = offsets[at] / BLOCK_BYTES * BLOCK_BYTES;
                let Ok(before_blocks) = u32::try_from((first_block - start) / BLOCK_BYTES) else {
                    continue;
                };
                sets[at] = LocalitySet {
                    before_blocks,
                    blocks,
                };
            }
        }
    }
    sets
}

/// A log entry the engine could have written: known record type, value within its limits.
fn log_entry_is_valid(entry: &LogEntry) -> bool {
    let len = match &entry.value {
        // Only whole chunks are written ahead of their commit.
        LogValue::Extent(extent) => {
            return entry.lk.rtype == rtype::DATA
                && u64::from(extent.logical_bytes) <= crate::format::record::DATA_CHUNK_BYTES
                && u64::from(extent.stored_bytes) <= EXTENT_STORED_BYTES_MAX
                && entry.replaces < u64::MAX;
        }
        LogValue::Delete => 0,
        LogValue::Put(bytes) => bytes.len(),
        LogValue::Splice { len, at, bytes } => {
            let end = *at as usize + bytes.len();
            if end > *len as usize {
                return false;
            }
            *len as usize
        }
    };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "DATA_CHUNK_BYTES is 64 KiB"
    )]
    let limit = match entry.lk.rtype {
        rtype::DATA | rtype::PATCH => crate::format::record::DATA_CHUNK_BYTES as usize,
        rtype::SYMLINK => crate::format::record::SYMLINK_BYTES_MAX,
        rtype::INODE..=rtype::COMMIT => INLINE_BYTES_MAX,
        _ => return false,
    };
    len <= limit && entry.replaces < u64::MAX
}

pub(crate) fn max_key() -> Key {
    Key {
        obj: u64::MAX,
        rtype: u8::MAX,
        key: u64::MAX,
        create_tid: u64::MAX,
    }
}

pub(crate) fn payload_value(payload: &Payload) -> Value {
    match payload {
        Payload::Inline(bytes) => Value::Bytes(Arc::new(bytes.clone())),
        Payload::Extent(extent) => Value::Extent(*extent),
    }
}

pub fn extent_location(extent: &ExtentRef) -> String {
    format!(
        "extent at byte {} ({} bytes)",
        extent.offset, extent.stored_bytes
    )
}

thread_local! {
    /// The buffer merged extent runs are read into, kept per thread between reads.
    static RUN_BUFFER: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// What a commit has written that its space map must know of: the extents written ahead of
/// it that it links or frees (by offset; the map counts every other such extent free), and
/// its last run of nodes, not yet written, (address, bytes): the map goes right after it
/// where that is free, in the same request.
pub(crate) struct Written<'a> {
    pub committing: &'a HashSet<u64>,
    pub tail: Option<(u64, Vec<u8>)>,
    /// Every other range the commit wrote (its nodes, the extents it links), for its
    /// manifest; `None` for a commit that orders its writes with a barrier instead.
    pub ranges: Option<Vec<manifest::Range>>,
}

/// Whether every range the manifest of `sb`'s commit lists holds what the commit wrote:
/// `Err` with the first that does not (a superblock without a manifest was written after its
/// tree was durable, and a proven one after the commit it repeats). Reads each range, those
/// near each other together.
fn commit_is_whole(
    device: &dyn Device,
    sb: &Superblock,
) -> Result<std::result::Result<(), String>> {
    if sb.manifest_address == 0 || sb.proven {
        return Ok(Ok(()));
    }
    let location = format!("commit manifest at byte {}", sb.manifest_address);
    let Ok(bytes) = usize::try_from(sb.manifest_bytes) else {
        return Err(Error::corrupt("manifest larger than memory", location));
    };
    let mut block = vec![0u8; bytes];
    device.read_at(&mut block, sb.manifest_address)?;
    if crate::checksum::checksum(&block) != sb.manifest_checksum {
        return Ok(Err(format!("{location} is not the one it wrote")));
    }
    let decoded = manifest::decode(
        &block,
        &sb.volume_id,
        sb.manifest_address,
        sb.committed_tid,
        sb.data_offset,
        sb.volume_bytes,
    );
    let mut ranges = match decoded {
        Ok(ranges) => ranges,
        Err(e) => return Ok(Err(e.to_string())),
    };
    // A commit lists that many bytes at most (`publish`): more is not worth reading.
    if ranges.iter().map(|r| r.bytes).sum::<u64>() > MANIFEST_COVERS_MAX {
        return Ok(Err(format!("{location} lists more than a commit writes")));
    }
    ranges.sort_unstable_by_key(|range| range.address);
    let mut buf = Vec::new();
    let mut next = 0;
    while next < ranges.len() {
        // One read for the ranges that lie within a gap of each other, up to a bound.
        let start = ranges[next].address;
        let mut end = start + ranges[next].bytes;
        let mut last = next + 1;
        while let Some(range) = ranges.get(last) {
            let range_end = range.address + range.bytes;
            if range.address > end + MANIFEST_READ_GAP_BYTES
                || range_end.max(end) - start > MANIFEST_READ_BYTES_MAX
            {
                break;
            }
            end = end.max(range_end);
            last += 1;
        }
        buf.resize(usize::try_from(end - start).unwrap_or(usize::MAX), 0);
        device.read_at(&mut buf, start)?;
        for range in &ranges[next..last] {
            let at = usize::try_from(range.address - start).unwrap_or(usize::MAX);
            let len = usize::try_from(range.bytes).unwrap_or(usize::MAX);
            let bytes = buf.get(at..at.saturating_add(len)).unwrap_or_default();
            if crate::checksum::checksum(bytes) != range.checksum {
                return Ok(Err(format!(
                    "the {} bytes it wrote at byte {} differ",
                    range.bytes, range.address
                )));
            }
        }
        next = last;
    }
    Ok(Ok(()))
}

/// What a commit (or a reblock step) wrote besides its space map, for its manifest: the
/// nodes `ctx` wrote, and every extent `mutations` link, written by it or ahead of it.
fn written_ranges(ctx: &mut CommitContext<'_>, mutations: &[Mutation]) -> Vec<manifest::Range> {
    let mut ranges = std::mem::take(&mut ctx.written);
    ranges.extend(mutations.iter().filter_map(|mutation| {
        let payload = match mutation {
            Mutation::Insert(element) | Mutation::Replace(element) => &element.payload,
            Mutation::Relocate(_, payload) => payload,
            Mutation::MarkDeleted(_) | Mutation::Remove(_) => return None,
        };
        match payload {
            Payload::Extent(extent) => Some(manifest::Range {
                address: extent.offset,
                bytes: u64::from(extent.stored_bytes),
                checksum: extent.checksum,
            }),
            _ => None,
        }
    }));
    // An empty extent holds no bytes to check.
    ranges.retain(|range| range.bytes > 0);
    ranges
}

/// Where a commit put its space map, and its manifest (address, bytes, checksum) if it
/// wrote one.
struct SpaceMapPlace {
    address: u64,
    bytes: u64,
    /// Data-area bytes the map counts as used.
    used_bytes: u64,
    manifest: Option<(u64, u64, u64)>,
}

/// The free ranges recorded by the space map the superblock's commit wrote, or `None` if it
/// wrote none or one in whole blocks (before format version 8: the tree is walked instead).
/// The map is checked as a block and for order and bounds, not against the tree.
pub fn read_space_map(device: &dyn Device, sb: &Superblock) -> Result<Option<Vec<(u64, u64)>>> {
    if sb.space_map_address == 0 {
        return Ok(None);
    }
    let Ok(map_bytes) = usize::try_from(sb.space_map_bytes) else {
        return Err(Error::corrupt(
            "space map larger than memory",
            format!("space map at byte {}", sb.space_map_address),
        ));
    };
    let mut block = vec![0u8; map_bytes];
    device.read_at(&mut block, sb.space_map_address)?;
    let ranges = spacemap::decode(
        &block,
        &sb.volume_id,
        sb.space_map_address,
        sb.committed_tid,
        sb.data_offset,
        sb.volume_bytes,
    )?;
    Ok(ranges)
}

/// The free map as the superblock's commit recorded it, or `None` without a map.
fn load_space_map(device: &dyn Device, sb: &Superblock) -> Result<Option<Space>> {
    let Some(ranges) = read_space_map(device, sb)? else {
        return Ok(None);
    };
    let space = Space::with_free_ranges(sb.data_offset, sb.volume_bytes, &ranges)?;
    if space.used_bytes() != sb.used_bytes {
        return Err(Error::corrupt(
            format!(
                "space map counts {} bytes used, superblock {}",
                space.used_bytes(),
                sb.used_bytes
            ),
            format!("space map at byte {}", sb.space_map_address),
        ));
    }
    Ok(Some(space))
}

/// Marks every node and extent reachable from `root` as used.
/// Also returns the number of live objects (inodes) met on the way.
fn walk_space(loader: &Loader<'_>, space: &Space, root: Root) -> Result<u64> {
    let mut live_objects = 0;
    if root.address == 0 {
        return Ok(live_objects);
    }
    let mut stack = vec![(root.address, root.level)];
    while let Some((address, level)) = stack.pop() {
        space.mark_used(address, NODE_BYTES as u64)?;
        let node = loader.load(address, level)?;
        match &*node {
            Node::Leaf(leaf) => {
                for element in leaf.iter() {
                    if element.key.rtype == rtype::INODE && element.delete_tid == 0 {
                        live_objects += 1;
                    }
                    if let Payload::Extent(extent) = &element.payload {
                        space
                            .mark_used(extent.offset, extent.allocated_bytes())
                            .map_err(|_| {
                                Error::corrupt(
                                    "extent overlaps other data",
                                    format!("{} of {:?}", extent_location(extent), element.key),
                                )
                            })?;
                    }
                }
            }
            Node::Internal { children, .. } => {
                for (_, child) in children {
                    stack.push((*child, level - 1));
                }
            }
        }
    }
    // Walked nodes need not stay cached.
    loader.cache.clear();
    Ok(live_objects)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(space: &Arc<Space>, node: u64, tid: u64) -> Arc<RootRef> {
        Arc::new(RootRef {
            root: crate::btree::Root {
                address: node,
                level: 0,
            },
            tid,
            next_obj: u64::MAX,
            release: Mutex::new(Vec::new()),
            space: space.clone(),
        })
    }

    #[test]
    fn the_live_memo_answers_only_under_the_root_it_was_filled_under() {
        let space = Arc::new(Space::new(1 << 20, 16 << 20));
        let lk = LogicalKey {
            obj: 7,
            rtype: 1,
            key: 0,
        };
        let answer = Some((3, overlay::Value::Bytes(Arc::new(vec![1, 2, 3]))));
        let mut memo = LiveMemo::default();
        let first = root(&space, 4096, 3);
        assert_eq!(memo.get(&first, &lk), None);
        memo.put(lk, answer.clone());
        assert_eq!(memo.get(&first, &lk), Some(answer.clone()));
        // "Not there" is an answer too.
        let other = LogicalKey { obj: 8, ..lk };
        memo.put(other, None);
        assert_eq!(memo.get(&first, &other), Some(None));
        // A new root (a commit) empties it, also when it names the same node and TID.
        let second = root(&space, 4096, 3);
        assert_eq!(memo.get(&second, &lk), None);
        assert_eq!(memo.get(&first, &lk), None);
        // A root dropped and another made: the memo's weak hold keeps the dropped root's
        // address from being given to the new one.
        memo.put(lk, answer.clone());
        drop(second);
        let third = root(&space, 8192, 4);
        assert_eq!(memo.get(&third, &lk), None);
        // Full: emptied, then filled again.
        for obj in 0..LiveMemo::ENTRIES_MAX as u64 + 1 {
            memo.put(LogicalKey { obj, ..lk }, None);
        }
        assert!(memo.found.len() <= LiveMemo::ENTRIES_MAX);
    }

    /// A placement that runs out of room part way gives back what it took: with free space
    /// only in holes of one block, a cluster's one-block member fits and its 32 KiB one
    /// does not (reblock met this on a fragmented volume, and the block stayed used).
    #[test]
    fn a_placement_that_fails_part_way_keeps_nothing() {
        let device = Arc::new(crate::device::MemDevice::new(0));
        crate::fs::Filesystem::mkfs(device.clone(), 32 << 20, "t").unwrap();
        let options = crate::fs::MountOptions {
            commit_interval_ms: 0,
            ..Default::default()
        };
        let fs = crate::fs::Filesystem::open(device, options).unwrap();
        let volume = fs.volume();
        let mut taken = Vec::new();
        while let Ok(at) = volume.space.allocate(BLOCK_BYTES, Purpose::Metadata) {
            taken.push(at);
        }
        for &at in taken.iter().step_by(2) {
            volume.space.release(at, BLOCK_BYTES);
        }
        let free = volume.space.free_bytes();
        assert!(free >= 1 << 20, "{free}");
        let failed = volume.place_clustered(&[BLOCK_BYTES, 32 << 10]);
        assert!(matches!(failed, Err(Error::NoSpace)), "{failed:?}");
        assert_eq!(volume.space.free_bytes(), free);
        let (offsets, _) = volume.place_clustered(&[BLOCK_BYTES, BLOCK_BYTES]).unwrap();
        assert_eq!(offsets.len(), 2);
        assert_eq!(volume.space.free_bytes(), free - 2 * BLOCK_BYTES);
    }
}
