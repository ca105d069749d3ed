//! FUSE adapter: serves an `anvil::Filesystem` to the kernel.
//!
//! The adapter has one transport-neutral core (this file: every request as a method that
//! returns attributes, bytes or an errno) and two transports that decode requests and
//! encode replies:
//! - `classic`: the /dev/fuse channel through `fuser`, one read and one write per request;
//! - `uring`: FUSE over io_uring (Linux 6.14+), one ring per CPU, a request served on the
//!   CPU that made it (see docs/design.md, "FUSE transports").
//!
//! Kernel caching is on (long entry/attr TTLs, keep_cache, readdirplus, parallel dirops; the
//! writeback cache only with `-o writeback`): every change goes through this mount, so the
//! kernel's caches stay coherent without invalidation. Permission checks are the kernel's
//! (`default_permissions`). The daemon clears setuid/setgid itself (FUSE_HANDLE_KILLPRIV_V2),
//! so the kernel does not look up `security.capability` before every write.

// As in the engine: narrowing casts and `expect` outside tests carry a written reason.
#![cfg_attr(
    not(test),
    deny(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap,
        clippy::expect_used
    )
)]

pub mod classic;
pub mod control;
mod counters;
pub mod devfuse;
pub mod memfs;
pub mod mirror;
pub mod sched;
pub mod uring;
mod views;

use anvil::format::record::compression;
use anvil::fs::{Caller, RenameFlags as AnvilRename, SetAttr};
use anvil::sync::Mutex;
use anvil::{Attr, DirEntry, Error, FileKind, Filesystem};
use control::Control;
pub use counters::{Counters, Op};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use views::{is_view, Target, Views, AS_OF_SEPARATOR, SNAPDIR_INO};

pub use fuser;

/// An errno, as the kernel receives it.
pub type Errno = i32;
/// What a request handler answers: a value or an errno.
pub type Reply<T> = std::result::Result<T, Errno>;

/// Read-only control attribute, on any object of the mount, that reports volume info.
pub const INFO_XATTR: &str = "trusted.anvil.info";
/// Writing any value to this attribute on the root commits now (like `sync`).
pub const SYNC_XATTR: &str = "trusted.anvil.sync";
/// Writing anything to this attribute on the root commits, then empties the daemon's node
/// cache, so that the next reads go to the device (for benchmarks; the kernel's caches are
/// dropped separately through /proc/sys/vm/drop_caches).
pub const DROPCACHE_XATTR: &str = "trusted.anvil.dropcache";
/// Writing a label (possibly empty) to this attribute on the root takes a snapshot.
pub const SNAPSHOT_XATTR: &str = "trusted.anvil.snapshot";
/// Writing a TID or label to this attribute on the root removes that snapshot.
pub const SNAPRM_XATTR: &str = "trusted.anvil.snaprm";
/// Reading this attribute on the root lists the snapshots (JSON).
pub const SNAPSHOTS_XATTR: &str = "trusted.anvil.snapshots";
/// Writing a policy (or "" for the stored one, or "everything") to this attribute on the
/// root prunes history; reading it returns the report of the last prune (JSON).
pub const PRUNE_XATTR: &str = "trusted.anvil.prune";
/// Reading or writing this attribute on the root gets or sets the retention policy.
pub const POLICY_XATTR: &str = "trusted.anvil.policy";
/// Reading this attribute on the root splits used space into live, history and tree (JSON;
/// scans the whole tree).
pub const SPACE_XATTR: &str = "trusted.anvil.space";
/// Writing a number of seconds to this attribute on the root reblocks for that long
/// (resuming where the last run stopped); reading it returns the last run's progress (JSON).
pub const REBLOCK_XATTR: &str = "trusted.anvil.reblock";
/// Reading or writing this attribute on the root gets or sets the `anvil cleanup` schedule.
pub const CLEANUP_XATTR: &str = "trusted.anvil.cleanup";
/// "1" or "0" on any object: history off or on for it (new children inherit it).
pub const NOHISTORY_XATTR: &str = "trusted.anvil.nohistory";
/// "1" or "0" on a directory: a cache (files created in it are deleted, least recently
/// used cluster first, when space runs low; history off) or an ordinary directory.
pub const EVICT_XATTR: &str = "trusted.anvil.evict";
/// "none", "lz4", "zstd" or "default" on any object: the codec for its new data (new
/// children inherit it; "default" follows the volume default).
pub const COMPRESSION_XATTR: &str = "trusted.anvil.compression";
/// Writing an object's inode number to this attribute on a file asks that the file's data
/// be written right after that object's, as one locality set (`Filesystem::set_locality`,
/// Hummingbird's `collocate_files`): a proxy names the page an image belongs to. A hint,
/// kept in memory until the commit that writes the file, never stored.
pub const NEAR_XATTR: &str = "trusted.anvil.near";
/// Writing an object's inode number to this attribute on a file names the file as read
/// together with that object: the next commit that writes the object's data stores a copy
/// of the file's data in its locality set too (`Filesystem::copy_near`): a proxy names the
/// page an image it served was read with. A request kept in memory until the next commit.
pub const COPY_XATTR: &str = "trusted.anvil.copy";
/// Reading this attribute on any object lists its versions (JSON, newest last).
pub const HISTORY_XATTR: &str = "trusted.anvil.history";
/// Reading this attribute on the root gives the requests received per opcode and the
/// transport (JSON); writing anything to it sets the counts back to zero.
pub const REQUESTS_XATTR: &str = "trusted.anvil.requests";
/// Reading this attribute on the root reports the volume's mirror role (master, or slave
/// of which volume up to which TID) and the last mirror job (JSON).
pub const MIRROR_XATTR: &str = "trusted.anvil.mirror";
/// Writing "SINCE UNTIL FIFO" (UNTIL "-" for the newest commit) to this attribute on the
/// root starts writing a mirror stream into the FIFO (`mirror.rs`).
pub const MIRROR_READ_XATTR: &str = "trusted.anvil.mirror-read";
/// Writing "FIFO" to this attribute on the root starts applying the mirror stream that
/// comes through the FIFO.
pub const MIRROR_WRITE_XATTR: &str = "trusted.anvil.mirror-write";
/// Writing anything to this attribute on the root promotes a slave to a master.
pub const MIRROR_PROMOTE_XATTR: &str = "trusted.anvil.mirror-promote";
/// Writing "MASTER_ID TID COMMIT_NS" to this attribute on the root makes a master the slave
/// of the volume that was promoted in its place, from their common TID.
pub const MIRROR_ATTACH_XATTR: &str = "trusted.anvil.mirror-attach";
/// Versions listed through HISTORY_XATTR at most (an xattr value is at most 64 KiB).
const HISTORY_VERSIONS_MAX: usize = 600;

fn snapshots_json(list: &[anvil::fs::SnapshotInfo]) -> String {
    let items: Vec<serde_json::Value> = list
        .iter()
        .map(|s| serde_json::json!({"tid": s.tid, "label": s.label, "time_ns": s.time_ns}))
        .collect();
    serde_json::Value::Array(items).to_string()
}

fn history_json(versions: &[anvil::fs::Version]) -> String {
    let skip = versions.len().saturating_sub(HISTORY_VERSIONS_MAX);
    let items: Vec<serde_json::Value> = versions[skip..]
        .iter()
        .map(|v| {
            serde_json::json!({"tid": v.tid, "time_ns": v.time_ns, "size": v.size, "exists": v.exists})
        })
        .collect();
    serde_json::Value::Array(items).to_string()
}

/// Sends invalidations to the kernel, whichever transport serves the mount.
pub enum Notifier {
    Classic(fuser::Notifier),
    Uring(fractal_fuse::FuseNotifier),
}

impl Notifier {
    fn inval_inode(&self, ino: u64) {
        // ENOENT for inodes the kernel already dropped is expected and harmless.
        let _ = match self {
            Notifier::Classic(n) => n.inval_inode(fuser::INodeNo(ino), 0, 0),
            Notifier::Uring(n) => n.inval_inode(ino, 0, 0),
        };
    }

    fn inval_entry(&self, parent: u64, name: &str) {
        self.inval_entry_bytes(parent, name.as_bytes());
    }

    fn inval_entry_bytes(&self, parent: u64, name: &[u8]) {
        use std::os::unix::ffi::OsStrExt;
        let _ = match self {
            Notifier::Classic(n) => {
                n.inval_entry(fuser::INodeNo(parent), std::ffi::OsStr::from_bytes(name))
            }
            Notifier::Uring(n) => n.inval_entry(parent, name),
        };
    }
}

/// Whether a file made by CREATE with open `flags` is answered FOPEN_DIRECT_IO. A
/// descriptor only written through (O_WRONLY) goes direct: its writes skip the page cache,
/// and with it the check for `security.capability` that a cached write makes once per
/// inode (a GETXATTR round trip for every new file). Nothing can read or map through such a
/// descriptor, so nothing is lost but the written pages, which a later open reads from the
/// daemon. Under the writeback cache every file stays cached: buffering writes is that
/// cache's point.
pub(crate) fn create_goes_direct(flags: u32, writeback: bool) -> bool {
    !writeback && flags & libc::O_ACCMODE.unsigned_abs() == libc::O_WRONLY.unsigned_abs()
}

/// One directory entry with its attributes, for READDIRPLUS.
pub struct EntryPlus {
    pub entry: DirEntry,
    pub attr: Attr,
    /// Entry TTL: zero for "." and "..", which the kernel does not count as lookups.
    pub ttl: Duration,
}

/// What a transport serves: one method per request, each answering attributes, bytes or an
/// errno. `AnvilFuse` is the volume; `memfs::MemFs` a trivial in-memory file system served
/// through the same transports to measure what they cost by themselves.
pub trait Backend: Send + Sync + 'static {
    /// Requests received, per opcode.
    fn counters(&self) -> &Counters;
    /// Gives the backend its way to invalidate kernel caches (once the session exists).
    fn set_notifier(&self, notifier: Notifier);
    /// Entry and attribute TTL given to the kernel.
    fn ttl(&self) -> Duration;
    /// How long the kernel may remember that `name` is missing from `parent` (a LOOKUP
    /// answered "no such entry" with a timeout, FUSE's negative entry); zero: it asks again
    /// every time. Only names nothing but a request through the kernel can create may be
    /// remembered missing: the kernel replaces a negative entry itself when it creates,
    /// renames or links the name.
    fn negative_ttl(&self, parent: u64, name: &[u8]) -> Duration;
    /// Whether the kernel caches writes (FUSE_WRITEBACK_CACHE).
    fn writeback(&self) -> bool;
    /// LOOKUP; every entry reply gives the kernel one reference, dropped by FORGET.
    fn lookup(&self, parent: u64, name: &[u8]) -> Reply<Attr>;
    fn forget(&self, ino: u64, nlookup: u64);
    fn getattr(&self, ino: u64) -> Reply<Attr>;
    /// SETATTR; `uid` is the caller's (setuid/setgid clearing, KILLPRIV_V2).
    fn setattr(&self, uid: u32, ino: u64, changes: &SetAttr) -> Reply<Attr>;
    fn readlink(&self, ino: u64) -> Reply<Vec<u8>>;
    /// MKNOD, and CREATE's creation (regular files): `mode` carries the type.
    fn mknod(&self, caller: Caller, parent: u64, name: &[u8], mode: u32, rdev: u64) -> Reply<Attr>;
    fn mkdir(&self, caller: Caller, parent: u64, name: &[u8], mode: u32) -> Reply<Attr>;
    fn unlink(&self, parent: u64, name: &[u8]) -> Reply<()>;
    fn rmdir(&self, parent: u64, name: &[u8]) -> Reply<()>;
    fn symlink(&self, caller: Caller, parent: u64, name: &[u8], target: &[u8]) -> Reply<Attr>;
    /// RENAME2; `flags` are renameat2's.
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Reply<()>;
    fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Reply<Attr>;
    fn read(&self, ino: u64, offset: u64, size: u32) -> Reply<Vec<u8>>;
    /// WRITE; `kill_suidgid` is FUSE_WRITE_KILL_SUIDGID.
    fn write(&self, ino: u64, offset: u64, data: &[u8], kill_suidgid: bool) -> Reply<usize>;
    fn fsync(&self, ino: u64) -> Reply<()>;
    fn readdir(&self, ino: u64, offset: u64) -> Reply<Vec<DirEntry>>;
    fn readdirplus(&self, ino: u64, offset: u64) -> Reply<Vec<EntryPlus>>;
    /// Counts the kernel's reference for a READDIRPLUS entry that was sent.
    fn remember_entry(&self, entry: &EntryPlus);
    fn statfs(&self) -> anvil::fs::StatFs;
    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Reply<()>;
    /// The whole value; the transport answers size probes and ERANGE.
    fn getxattr(&self, ino: u64, name: &[u8]) -> Reply<Vec<u8>>;
    /// NUL-separated names.
    fn listxattr(&self, ino: u64) -> Reply<Vec<u8>>;
    fn removexattr(&self, ino: u64, name: &[u8]) -> Reply<()>;
    fn access(&self, ino: u64) -> Reply<()>;
    fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: i32) -> Reply<()>;
    /// Unmount: the final commit.
    fn destroy(&self);
}

pub struct AnvilFuse {
    fs: Arc<Filesystem>,
    ttl: Duration,
    /// How long a missing name may stay known missing (`negative_ttl`).
    negative_ttl: Duration,
    writeback: bool,
    /// Kernel lookup counts. The kernel keeps a reference for every open file, so an object
    /// unlinked while known to the kernel lives (as an orphan) until its count drops to 0.
    /// This replaces OPEN/RELEASE tracking, which the kernel skips (FUSE_NO_OPEN_SUPPORT).
    lookups: Arc<Mutex<foldhash::HashMap<u64, u64>>>,
    views: Views,
    last_prune: Mutex<Option<anvil::fs::PruneReport>>,
    /// Last reblock run and its progress (done, total bytes).
    last_reblock: Mutex<Option<(anvil::fs::ReblockReport, u64, u64)>>,
    /// Set once the session exists; used to invalidate kernel caches of changed views.
    notifier: Arc<std::sync::OnceLock<Notifier>>,
    /// The last mirror job (`mirror.rs`).
    mirror_jobs: Arc<mirror::MirrorJobs>,
    /// Requests received, per opcode.
    pub counters: Counters,
    /// This daemon took over a connection from one that died (`devfuse`): the kernel may
    /// hold objects it looked up from the dead daemon, which `lookups` does not count.
    resumed: bool,
    /// A replica of a volume written elsewhere: its tree changes under the kernel.
    replica: bool,
}

/// A thread that runs a task every interval until it is dropped (the drop waits for it to
/// end): a replica's follower (`AnvilFuse::follow_every`), the workers' guard (`sched`).
pub struct Periodic {
    stop: Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>,
    handle: Option<std::thread::JoinHandle<()>>,
}

/// A replica's follower (`AnvilFuse::follow_every`): stops when dropped.
pub type Follower = Periodic;

impl Periodic {
    /// Starts thread `name`, which calls `tick` every `interval` (first after one interval)
    /// and drops it when stopped.
    pub fn spawn(
        name: &str,
        interval: Duration,
        mut tick: impl FnMut() + Send + 'static,
    ) -> std::io::Result<Periodic> {
        let stop = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
        let stopping = stop.clone();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                {
                    let (lock, wake) = &*stopping;
                    let stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
                    let (stopped, _) = wake
                        .wait_timeout_while(stopped, interval, |s| !*s)
                        .unwrap_or_else(|e| e.into_inner());
                    if *stopped {
                        return;
                    }
                }
                tick();
            })?;
        Ok(Periodic {
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for Periodic {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
        wake.notify_all();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

impl AnvilFuse {
    /// `writeback`: let the kernel cache writes (fewer, larger writes reach us; the kernel
    /// then owns mtime and pushes it with SETATTR).
    pub fn new(fs: Arc<Filesystem>, ttl: Duration, writeback: bool) -> AnvilFuse {
        let notifier: Arc<std::sync::OnceLock<Notifier>> = Arc::new(std::sync::OnceLock::new());
        // Files a cache directory evicted: the kernel forgets their names, then the objects
        // (pinned while it knows them, they are orphans until its FORGET). From a thread of
        // its own: the request that evicted may hold the directory's lock (a CREATE), which
        // the invalidation takes.
        let evicted = notifier.clone();
        fs.on_evict(Box::new(move |names: Vec<(u64, Vec<u8>)>| {
            let notifier = evicted.clone();
            let spawned = std::thread::Builder::new()
                .name("anvil-evict".into())
                .spawn(move || {
                    if let Some(notifier) = notifier.get() {
                        for (dir, name) in names {
                            notifier.inval_entry_bytes(dir, &name);
                        }
                    }
                });
            if let Err(e) = spawned {
                log::warn!("evicted names stay in the kernel's cache until they expire: {e}");
            }
        }));
        AnvilFuse {
            fs,
            ttl,
            negative_ttl: ttl,
            writeback,
            lookups: Arc::new(Mutex::new(foldhash::HashMap::default())),
            views: Views::default(),
            last_prune: Mutex::new(None),
            last_reblock: Mutex::new(None),
            notifier,
            mirror_jobs: Arc::default(),
            counters: Counters::default(),
            resumed: false,
            replica: false,
        }
    }

    /// Serves a connection taken over from a daemon that died: every object a name leads
    /// to may be one the kernel looked up from the dead daemon (an open file among them),
    /// so unlinking or renaming over it pins it first, as a lookup would have; it becomes
    /// an orphan and goes when the kernel forgets it (its FORGET counts every lookup, the
    /// dead daemon's too) or at the next mount.
    pub fn resumed(mut self) -> AnvilFuse {
        self.resumed = true;
        self
    }

    /// After a takeover: pins the object `name` leads to unless the kernel's lookups of it
    /// are counted already.
    fn pin_victim(&self, parent: u64, name: &[u8]) {
        if !self.resumed {
            return;
        }
        if let Ok(attr) = self.fs.lookup(parent, name) {
            if !self.lookups.lock().contains_key(&attr.ino) {
                self.remember(attr.ino);
            }
        }
    }

    /// How long the kernel may remember a name as missing (the entry TTL unless set).
    pub fn with_negative_ttl(mut self, ttl: Duration) -> AnvilFuse {
        self.negative_ttl = ttl;
        self
    }

    /// Serves the volume as of `tid` (read-only) instead of its current state.
    /// A read-only replica of a volume another host writes (`follow_every` moves it).
    pub fn replica(mut self) -> AnvilFuse {
        self.replica = true;
        self
    }

    /// Every `interval`, moves the replica to its writer's newest commit and, when it moved,
    /// drops what the kernel caches of every object it knows (names expire within the
    /// replica's short TTL).
    pub fn follow_every(&self, interval: Duration) -> std::io::Result<Follower> {
        let (fs, lookups, notifier) =
            (self.fs.clone(), self.lookups.clone(), self.notifier.clone());
        Periodic::spawn("anvil-follow", interval, move || match fs.follow() {
            Ok(Some(tid)) => {
                log::debug!("replica at TID {tid:#x}");
                mirror::forget_cached_tree(&lookups, &notifier);
            }
            Ok(None) => {}
            Err(e) => log::warn!("replica cannot follow its writer yet: {e}"),
        })
    }

    pub fn as_of(mut self, tid: u64) -> AnvilFuse {
        self.views = Views::as_of(tid);
        self
    }

    /// Records one more kernel reference to `ino` (every entry reply gives one).
    fn remember(&self, ino: u64) {
        let first = {
            let mut lookups = self.lookups.lock();
            let count = lookups.entry(ino).or_insert(0);
            *count += 1;
            *count == 1
        };
        if first && !is_view(ino) {
            // Pins the object: unlink keeps it as an orphan while the kernel knows it. Every
            // caller has just looked the object up or made it.
            self.fs.hold(ino);
        }
    }

    /// An entry reply: gives the kernel one more reference to the object.
    fn entry(&self, result: anvil::Result<Attr>) -> Reply<Attr> {
        let attr = result.map_err(|e| errno(&e))?;
        self.remember(attr.ino);
        Ok(attr)
    }

    /// Clears setuid, and setgid when group-executable, on a regular file (Linux's
    /// `should_remove_suid`). Costs nothing when neither bit is set.
    fn kill_suidgid(&self, attr: Attr) -> Reply<Attr> {
        let mut mode = attr.mode;
        if attr.kind != FileKind::File {
            return Ok(attr);
        }
        mode &= !libc::S_ISUID;
        if mode & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
            mode &= !libc::S_ISGID;
        }
        if mode == attr.mode {
            return Ok(attr);
        }
        let changes = SetAttr {
            mode: Some(mode & 0o7777),
            ..Default::default()
        };
        self.fs.setattr(attr.ino, &changes).map_err(|e| errno(&e))
    }

    /// Writes to the control attributes (`trusted.anvil.*`).
    fn control_set(&self, ino: u64, name: &[u8], value: &[u8]) -> Reply<()> {
        let text = String::from_utf8_lossy(value).into_owned();
        let control = Control::parse(name)
            .filter(|c| c.writable() && c.applies_to(ino))
            .ok_or(libc::EPERM)?;
        let result = match control {
            Control::Snapshot => self.fs.snapshot(&text).map(|_| {
                self.invalidate_views(Vec::new(), false);
            }),
            Control::Prune => {
                let result = match text.trim() {
                    "everything" => self.fs.prune(None, true),
                    "" => self.fs.prune(None, false),
                    policy => anvil::fs::RetentionPolicy::parse(policy)
                        .and_then(|p| self.fs.prune(Some(p), false)),
                };
                result.map(|report| {
                    *self.last_prune.lock() = Some(report);
                    self.invalidate_views(Vec::new(), true);
                })
            }
            Control::NoHistory => self.fs.set_nohistory(ino, on_off(value)?),
            Control::Evict => self.fs.set_evictable(ino, on_off(value)?),
            Control::Near => {
                let near = text.trim().parse::<u64>().map_err(|_| libc::EINVAL)?;
                self.fs.set_locality(ino, near);
                Ok(())
            }
            Control::Copy => {
                let near = text.trim().parse::<u64>().map_err(|_| libc::EINVAL)?;
                self.fs.copy_near(ino, near);
                Ok(())
            }
            Control::Compression => {
                let codec = match text.trim() {
                    "default" => None,
                    name => Some(compression::parse(name).ok_or(libc::EINVAL)?),
                };
                self.fs.set_compression(ino, codec)
            }
            Control::Reblock => {
                let seconds: f64 = text.trim().parse().unwrap_or(1.0);
                let options = anvil::fs::ReblockOptions {
                    time_box: Some(Duration::from_secs_f64(seconds.clamp(0.0, 3600.0))),
                    ..Default::default()
                };
                let mut progress = (0, 0);
                self.fs
                    .reblock(options, &mut |d, t| progress = (d, t))
                    .map(|report| {
                        *self.last_reblock.lock() = Some((report, progress.0, progress.1));
                    })
            }
            Control::Cleanup => self
                .fs
                .set_config_text(anvil::fs::config_keys::CLEANUP, &text),
            Control::Policy => anvil::fs::RetentionPolicy::parse(&text)
                .and_then(|p| self.fs.set_retention_policy(p)),
            Control::SnapRm => {
                let names: Vec<String> = self
                    .fs
                    .snapshots()
                    .unwrap_or_default()
                    .iter()
                    .filter(|s| s.label == text || format!("{:#018x}", s.tid) == text)
                    .map(views::snapshot_name)
                    .collect();
                self.fs
                    .remove_snapshot(&text)
                    .map(|_| self.invalidate_views(names, false))
            }
            Control::Sync => self.fs.sync().map(|_| ()),
            Control::DropCache => self.fs.sync().map(|_| self.fs.volume().drop_caches()),
            Control::Requests => {
                self.counters.reset();
                Ok(())
            }
            Control::MirrorWrite if self.writeback => {
                log::error!(
                    "mirror-write refused: with -o writeback the kernel keeps its own sizes \
                     and times of cached files, and would not see what the stream changes"
                );
                return Err(libc::EOPNOTSUPP);
            }
            Control::MirrorRead | Control::MirrorWrite => {
                let read = control == Control::MirrorRead;
                let job = mirror::MirrorJob::parse(read, text.trim_end_matches('\n'))
                    .ok_or(libc::EINVAL)?;
                return self.start_mirror_job(job);
            }
            Control::MirrorPromote => self.fs.mirror_promote().map(|_| ()),
            Control::MirrorAttach => return self.mirror_attach(&text),
            // Filtered out above: reports only.
            Control::Info
            | Control::Snapshots
            | Control::Space
            | Control::History
            | Control::Mirror => return Err(libc::EPERM),
        };
        result.map_err(|e| errno(&e))
    }

    /// Reads of the control attributes; `None` for a name that is not one of them here.
    fn control_get(&self, ino: u64, name: &[u8]) -> Reply<Option<Vec<u8>>> {
        let Some(control) = Control::parse(name)
            .filter(|c| c.readable() && c.applies_to(ino))
            .filter(|c| !(c.per_object() && is_view(ino)))
        else {
            return Ok(None);
        };
        let text = match control {
            Control::Info => {
                let mut info: serde_json::Value =
                    serde_json::from_str(&self.fs.info().to_json()).map_err(|_| libc::EIO)?;
                info["writeback"] = self.writeback.into();
                info.to_string()
            }
            Control::Snapshots => snapshots_json(&self.fs.snapshots().map_err(|e| errno(&e))?),
            Control::Prune => match &*self.last_prune.lock() {
                Some(r) => serde_json::json!({
                    "elements_removed": r.elements_removed,
                    "extent_bytes_freed": r.extent_bytes_freed,
                    "kept_points": r.kept_points,
                })
                .to_string(),
                None => "{}".to_string(),
            },
            Control::Compression => match self.fs.compression(ino).map_err(|e| errno(&e))? {
                Some(codec) => compression::name(codec).to_string(),
                None => "default".to_string(),
            },
            Control::NoHistory => {
                let attr = self.fs.getattr(ino).map_err(|e| errno(&e))?;
                let on = attr.flags & anvil::format::record::inode_flags::NOHISTORY != 0;
                (if on { "1" } else { "0" }).to_string()
            }
            Control::Evict => {
                let attr = self.fs.getattr(ino).map_err(|e| errno(&e))?;
                let on = attr.flags & anvil::format::record::inode_flags::EVICTABLE != 0;
                (if on { "1" } else { "0" }).to_string()
            }
            Control::Reblock => match &*self.last_reblock.lock() {
                Some((r, done, total)) => serde_json::json!({
                    "extents_moved": r.extents_moved,
                    "bytes_moved": r.bytes_moved,
                    "bytes_freed": r.bytes_freed,
                    "damaged": r.damaged,
                    "finished": r.finished,
                    "done": done,
                    "total": total,
                })
                .to_string(),
                None => "{}".to_string(),
            },
            Control::Cleanup => self
                .fs
                .config_text(anvil::fs::config_keys::CLEANUP)
                .map_err(|e| errno(&e))?
                .unwrap_or_default(),
            Control::Policy => self
                .fs
                .retention_policy()
                .map_err(|e| errno(&e))?
                .to_string(),
            Control::Space => {
                let split = self.fs.space_split().map_err(|e| errno(&e))?;
                serde_json::json!({
                    "live_bytes": split.live_bytes,
                    "history_bytes": split.history_bytes,
                    "tree_bytes": split.tree_bytes,
                    "extent_logical_bytes": split.extent_logical_bytes,
                    "extent_allocated_bytes": split.extent_allocated_bytes,
                    "extents_by_codec": split.extents_by_codec,
                })
                .to_string()
            }
            Control::History => history_json(&self.fs.history(ino).map_err(|e| errno(&e))?),
            Control::Requests => self.counters.to_json(),
            Control::Mirror => self.mirror_json()?,
            // Filtered out above: actions only.
            Control::Sync
            | Control::DropCache
            | Control::Snapshot
            | Control::SnapRm
            | Control::Near
            | Control::Copy
            | Control::MirrorRead
            | Control::MirrorWrite
            | Control::MirrorPromote
            | Control::MirrorAttach => return Ok(None),
        };
        Ok(Some(text.into_bytes()))
    }
}

impl Backend for AnvilFuse {
    fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Gives the adapter its way to invalidate kernel caches (once the session exists).
    fn set_notifier(&self, notifier: Notifier) {
        let _ = self.notifier.set(notifier);
    }

    fn ttl(&self) -> Duration {
        // A slave's tree changes under the kernel with each mirrored stream: names must
        // not stay cached for long (attributes and pages are invalidated explicitly).
        match self.replica || self.fs.volume().is_slave() {
            true => self.ttl.min(Duration::from_secs(1)),
            false => self.ttl,
        }
    }

    /// Names appear under the kernel on a replica or a mirror slave (its writer's commits),
    /// in `.snapshots` (a snapshot taken through a control attribute) and as `name@@spec`
    /// (a spec that resolves once its TID, time or label exists): those are never
    /// remembered missing. Everywhere else a name appears only through a request, so a
    /// missing one is remembered as long as a found one.
    fn negative_ttl(&self, parent: u64, name: &[u8]) -> Duration {
        let changes_under_kernel = self.replica || self.fs.volume().is_slave();
        let view_name = parent == SNAPDIR_INO
            || name
                .windows(AS_OF_SEPARATOR.len())
                .any(|w| w == AS_OF_SEPARATOR.as_bytes());
        match changes_under_kernel || view_name {
            true => Duration::ZERO,
            false => self.negative_ttl,
        }
    }

    fn writeback(&self) -> bool {
        self.writeback
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Reply<Attr> {
        self.entry(self.lookup_any(parent, name))
    }

    fn forget(&self, ino: u64, nlookup: u64) {
        let last = {
            let mut lookups = self.lookups.lock();
            match lookups.get_mut(&ino) {
                Some(count) if *count > nlookup => {
                    *count -= nlookup;
                    false
                }
                Some(_) => {
                    lookups.remove(&ino);
                    true
                }
                None => false,
            }
        };
        if last && is_view(ino) {
            self.views.forget(ino);
        } else if last {
            if let Err(e) = self.fs.release_handle(ino) {
                log::error!("releasing object {ino}: {e}");
            }
        }
    }

    fn getattr(&self, ino: u64) -> Reply<Attr> {
        self.target(ino)
            .and_then(|t| self.attr_of(t))
            .map_err(|e| errno(&e))
    }

    /// SETATTR. `uid` is the caller's: with KILLPRIV_V2 the daemon clears setuid/setgid on
    /// a truncate by a caller without CAP_FSETID (approximated as not root, since requests
    /// carry no capabilities) and on any chown of a non-directory, as the kernel would.
    fn setattr(&self, uid: u32, ino: u64, changes: &SetAttr) -> Reply<Attr> {
        if is_view(ino) {
            return Err(libc::EROFS);
        }
        let chown = changes.uid.is_some() || changes.gid.is_some();
        let truncate_kills = changes.size.is_some() && uid != 0;
        let attr = self.fs.setattr(ino, changes).map_err(|e| errno(&e))?;
        if (chown || truncate_kills) && changes.mode.is_none() {
            return self.kill_suidgid(attr);
        }
        Ok(attr)
    }

    fn readlink(&self, ino: u64) -> Reply<Vec<u8>> {
        self.target(ino)
            .and_then(|t| match t {
                Target::AsOf { obj, tid } => self.fs.at(tid)?.readlink(obj),
                Target::Live(ino) => self.fs.readlink(ino),
                Target::SnapDir => Err(Error::Posix(libc::EINVAL)),
            })
            .map_err(|e| errno(&e))
    }

    /// MKNOD, and CREATE's creation: `mode` carries the file type, umask already applied.
    fn mknod(&self, caller: Caller, parent: u64, name: &[u8], mode: u32, rdev: u64) -> Reply<Attr> {
        if is_view(parent) {
            return Err(libc::EROFS);
        }
        self.entry(self.fs.mknod(caller, parent, name, mode, rdev))
    }

    fn mkdir(&self, caller: Caller, parent: u64, name: &[u8], mode: u32) -> Reply<Attr> {
        if is_view(parent) {
            return Err(libc::EROFS);
        }
        self.entry(self.fs.mkdir(caller, parent, name, mode & 0o7777))
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> Reply<()> {
        if is_view(parent) {
            return Err(libc::EROFS);
        }
        self.pin_victim(parent, name);
        self.fs.unlink(parent, name).map_err(|e| errno(&e))
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> Reply<()> {
        if is_view(parent) {
            return Err(libc::EROFS);
        }
        self.pin_victim(parent, name);
        self.fs.rmdir(parent, name).map_err(|e| errno(&e))
    }

    fn symlink(&self, caller: Caller, parent: u64, name: &[u8], target: &[u8]) -> Reply<Attr> {
        if is_view(parent) {
            return Err(libc::EROFS);
        }
        self.entry(self.fs.symlink(caller, parent, name, target))
    }

    /// RENAME2; `flags` are renameat2's (RENAME_NOREPLACE, RENAME_EXCHANGE, ...).
    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Reply<()> {
        if is_view(parent) || is_view(new_parent) {
            return Err(libc::EROFS);
        }
        if flags & libc::RENAME_WHITEOUT != 0 {
            return Err(libc::EINVAL);
        }
        self.pin_victim(new_parent, new_name);
        let flags = AnvilRename {
            noreplace: flags & libc::RENAME_NOREPLACE != 0,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        };
        self.fs
            .rename(parent, name, new_parent, new_name, flags)
            .map_err(|e| errno(&e))
    }

    fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Reply<Attr> {
        if is_view(ino) || is_view(new_parent) {
            return Err(libc::EROFS);
        }
        self.entry(self.fs.link(ino, new_parent, new_name))
    }

    fn read(&self, ino: u64, offset: u64, size: u32) -> Reply<Vec<u8>> {
        self.target(ino)
            .and_then(|t| match t {
                Target::AsOf { obj, tid } => self.fs.at(tid)?.read(obj, offset, size),
                Target::Live(ino) => self.fs.read(ino, offset, size),
                Target::SnapDir => Err(Error::Posix(libc::EISDIR)),
            })
            .map_err(|e| errno(&e))
    }

    /// WRITE; `kill_suidgid` is the kernel's FUSE_WRITE_KILL_SUIDGID (the writer lacks
    /// CAP_FSETID).
    fn write(&self, ino: u64, offset: u64, data: &[u8], kill_suidgid: bool) -> Reply<usize> {
        if is_view(ino) {
            return Err(libc::EROFS);
        }
        // Under the writeback cache the kernel owns a file's times: it sends them with
        // SETATTR, and its WRITEs may come after that SETATTR.
        let written = match self.writeback {
            true => self.fs.write_leaving_times(ino, offset, data),
            false => self.fs.write(ino, offset, data),
        }
        .map_err(|e| errno(&e))?;
        if kill_suidgid {
            let attr = self.fs.getattr(ino).map_err(|e| errno(&e))?;
            if attr.mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
                self.kill_suidgid(attr)?;
            }
        }
        Ok(written)
    }

    fn fsync(&self, ino: u64) -> Reply<()> {
        if is_view(ino) {
            return Ok(());
        }
        self.fs.fsync(ino).map_err(|e| errno(&e))
    }

    fn readdir(&self, ino: u64, offset: u64) -> Reply<Vec<DirEntry>> {
        self.target(ino)
            .and_then(|t| self.readdir_view(t, offset, 256))
            .map_err(|e| errno(&e))
    }

    /// READDIRPLUS: entries with attributes. The transport calls `remember_entry` for each
    /// entry it actually sends (the kernel counts a lookup for each, "." and ".." aside).
    fn readdirplus(&self, ino: u64, offset: u64) -> Reply<Vec<EntryPlus>> {
        let entries = self
            .target(ino)
            .and_then(|t| self.readdir_view(t, offset, 128))
            .map_err(|e| errno(&e))?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            let attr = match self.target(entry.ino).and_then(|t| self.attr_of(t)) {
                Ok(attr) => attr,
                // "." and ".." or a racing unlink: list the name without attributes.
                Err(_) => continue,
            };
            let ttl = if is_dot(&entry.name) {
                Duration::ZERO
            } else {
                self.ttl
            };
            out.push(EntryPlus { entry, attr, ttl });
        }
        Ok(out)
    }

    /// Counts the kernel's reference for a READDIRPLUS entry that was sent.
    fn remember_entry(&self, entry: &EntryPlus) {
        if !is_dot(&entry.entry.name) {
            self.remember(entry.entry.ino);
        }
    }

    fn statfs(&self) -> anvil::fs::StatFs {
        self.fs.statfs()
    }

    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: i32) -> Reply<()> {
        if is_view(ino) {
            return Err(libc::EROFS);
        }
        if name.starts_with(b"trusted.anvil.") {
            return self.control_set(ino, name, value);
        }
        let create = flags & libc::XATTR_CREATE != 0;
        let replace = flags & libc::XATTR_REPLACE != 0;
        self.fs
            .setxattr(ino, name, value, create, replace)
            .map_err(|e| errno(&e))
    }

    /// GETXATTR: the whole value (the transport answers size probes and ERANGE).
    fn getxattr(&self, ino: u64, name: &[u8]) -> Reply<Vec<u8>> {
        if name.starts_with(b"trusted.anvil.") {
            if let Some(value) = self.control_get(ino, name)? {
                return Ok(value);
            }
        }
        self.target(ino)
            .and_then(|t| match t {
                Target::AsOf { obj, tid } => self.fs.at(tid)?.getxattr(obj, name),
                Target::Live(ino) => self.fs.getxattr(ino, name),
                Target::SnapDir => Err(Error::Posix(libc::ENODATA)),
            })
            .map_err(|e| errno(&e))
    }

    /// LISTXATTR: NUL-separated names.
    fn listxattr(&self, ino: u64) -> Reply<Vec<u8>> {
        let names = self
            .target(ino)
            .and_then(|t| match t {
                Target::AsOf { obj, tid } => self.fs.at(tid)?.listxattr(obj),
                Target::Live(ino) => self.fs.listxattr(ino),
                Target::SnapDir => Ok(Vec::new()),
            })
            .map_err(|e| errno(&e))?;
        let mut data = Vec::new();
        for name in names {
            data.extend_from_slice(&name);
            data.push(0);
        }
        Ok(data)
    }

    fn removexattr(&self, ino: u64, name: &[u8]) -> Reply<()> {
        if is_view(ino) {
            return Err(libc::EROFS);
        }
        self.fs.removexattr(ino, name).map_err(|e| errno(&e))
    }

    /// ACCESS: the kernel checks permissions (`default_permissions`); this only says
    /// whether the object exists.
    fn access(&self, ino: u64) -> Reply<()> {
        self.getattr(ino).map(|_| ())
    }

    fn fallocate(&self, ino: u64, offset: u64, length: u64, mode: i32) -> Reply<()> {
        if is_view(ino) {
            return Err(libc::EROFS);
        }
        // Plain allocation extends the file; space is not reserved ahead (copy-on-write
        // allocates at commit), so only the size effect is provided, and a request for more
        // than the volume has free fails as allocating it would.
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let end = offset.saturating_add(length);
        let attr = self.fs.getattr(ino).map_err(|e| errno(&e))?;
        let statfs = self.fs.statfs();
        let available = statfs.blocks_available * u64::from(statfs.block_bytes);
        if end.saturating_sub(attr.size.max(offset)) > available {
            return Err(libc::ENOSPC);
        }
        if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > attr.size {
            let changes = SetAttr {
                size: Some(end),
                ..Default::default()
            };
            self.fs.setattr(ino, &changes).map_err(|e| errno(&e))?;
        }
        Ok(())
    }

    /// The final commit at unmount.
    fn destroy(&self) {
        if let Err(e) = self.fs.close() {
            log::error!("final commit failed: {e}");
        }
    }
}

/// Puts the calling thread under SCHED_IDLE (or back under SCHED_OTHER) at the daemon's
/// nice value; threads it creates inherit the policy. For the daemon's request workers (`-o worker_sched=idle`,
/// the default).
///
/// Why: a reply wakes the caller from the worker's CPU. While the worker counts as
/// running there, the scheduler wakes the caller on another, idle CPU, and waking an idle
/// vCPU costs tens of microseconds in a VM, twice per request. A CPU that runs only
/// SCHED_IDLE tasks counts as idle, so the caller is woken on the worker's CPU and the
/// request never crosses CPUs. Measured on the 2-vCPU test VM (docs/design.md): a round
/// trip over io_uring takes 10 us instead of 30 us, and busy CPUs (spinning hogs on both)
/// did not starve the workers (15 us against 13.5 us under SCHED_OTHER).
pub fn set_idle_policy(idle: bool) {
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a system call on the calling thread with a valid parameter block.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        log::warn!(
            "cannot set the workers' scheduling policy: {}",
            std::io::Error::last_os_error()
        );
    }
    // A thread started by a worker the guard raised inherited its nice -10.
    if let Some(nice) = sched::base_nice() {
        // SAFETY: setpriority on the calling thread (PRIO_PROCESS 0 is this thread on Linux).
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    }
}

/// Gives back the pages of a new ring entry's payload buffer, which `fractal-fuse` maps
/// populated (`RingEntry::new`): they come back one by one as requests fill them. A small
/// file's request touches a page or two of a 128 KiB-1 MiB buffer, so the rings, budgeted
/// whole (`uring::ring_bytes`), hold only what the largest requests so far needed: right
/// after a mount with `cache=1G`, under 6 MiB for the daemon instead of 18.6 MiB (large
/// READs and WRITEs fill the buffers again as they come). The kernel copies requests into
/// the buffers as the daemon's user memory (io_uring task work, or read(2) on /dev/fuse),
/// so a missing page is an ordinary fault; requests of a whole buffer in both directions
/// come back intact (test `ring_buffers_hold_memory_only_once_used`). Called before the
/// entry is registered; a failure only leaves the pages resident.
pub fn release_payload_pages(entry: &mut fractal_fuse::ring::RingEntry) {
    let payload = entry.payload_mut();
    // SAFETY: the range is the entry's own anonymous private mapping (page-aligned, its
    // length rounded to pages by `RingEntry::new`); MADV_DONTNEED only drops its pages,
    // which read back as zeros, and nothing refers to their contents yet.
    let done = unsafe {
        libc::madvise(
            payload.as_mut_ptr().cast(),
            payload.len(),
            libc::MADV_DONTNEED,
        )
    };
    if done != 0 {
        log::debug!(
            "ring buffer pages stay resident: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Raises the read-ahead window of the FUSE mount on `dir` (absolute, resolved before it
/// was mounted) to `bytes`, where the kernel leaves it at its default of 128 KiB whatever
/// FUSE_INIT offers (it takes the smaller of the two). With 128 KiB a cold sequential read
/// reaches the daemon as one 128 KiB READ at a time, each waiting for the device; with
/// 1 MiB, measured on the test VM, a cold 256 MiB read by 4 KiB records went from 358 to
/// 469 MB/s and by 64 KiB records from 409 to 945 MB/s. Needs root (sysfs); returns why
/// not otherwise. Reads /proc/self/mountinfo rather than stat'ing the mount, which would
/// wait for a daemon that may not serve yet.
pub fn raise_readahead(dir: &std::path::Path, bytes: u32) -> std::result::Result<(), String> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
    let want = dir.to_string_lossy();
    // Fields: id parent major:minor root mountpoint ...; the last match is the newest mount.
    let device = mountinfo
        .lines()
        .rev()
        .find_map(|line| {
            let mut fields = line.split(' ');
            let device = fields.nth(2)?;
            let point = fields.nth(1)?;
            (unescape_mountinfo(point) == want).then(|| device.to_string())
        })
        .ok_or_else(|| format!("{want} is not in /proc/self/mountinfo"))?;
    let path = format!("/sys/class/bdi/{device}/read_ahead_kb");
    std::fs::write(&path, format!("{}\n", bytes >> 10)).map_err(|e| format!("{path}: {e}"))
}

/// A mountinfo path with its octal escapes (`\040` for a space) undone.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| {
                let value = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                u8::try_from(value).ok()
            });
        match octal {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A switch's value: "1" on, "0" off.
fn on_off(value: &[u8]) -> Result<bool, Errno> {
    match value {
        b"1" => Ok(true),
        b"0" => Ok(false),
        _ => Err(libc::EINVAL),
    }
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

/// The errno for an engine error; logs the ones a user must see.
fn errno(e: &Error) -> Errno {
    if matches!(e, Error::Corrupt { .. } | Error::Io(_)) {
        log::error!("{e}");
    }
    if matches!(e, Error::NoSpace) {
        warn_full();
    }
    e.errno()
}

/// Says once a minute, in the daemon's log, why writes fail and what frees space.
fn warn_full() {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let last = LAST.load(std::sync::atomic::Ordering::Relaxed);
    if now >= last + 60
        && LAST
            .compare_exchange(
                last,
                now,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    {
        log::warn!(
            "volume full: writes get ENOSPC; deleting frees nothing while history keeps old \
             versions: run `anvil prune MOUNTPOINT` or `anvil prune-everything MOUNTPOINT` \
             (`anvil info MOUNTPOINT` shows how much is history)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{unescape_mountinfo, AnvilFuse, Backend};
    use anvil::device::{Device, MemDevice};
    use anvil::fs::{Caller, SetAttr, Time as Timestamp, TimeSet};
    use anvil::{Filesystem, MountOptions};
    use std::sync::Arc;
    use std::time::Duration;

    /// A WRITE stamps the file's times, except under the writeback cache, where the kernel
    /// sends its own (a SETATTR that may come before the WRITEs it covers).
    #[test]
    fn writes_leave_the_times_to_a_writeback_kernel() {
        for writeback in [false, true] {
            let bytes = 64 << 20;
            let dev: Arc<dyn Device> = Arc::new(MemDevice::new(bytes));
            Filesystem::mkfs(dev.clone(), bytes, "wb").unwrap();
            let options = MountOptions {
                commit_interval_ms: 0,
                ..Default::default()
            };
            let fs = Arc::new(Filesystem::open(dev, options).unwrap());
            let ino = fs.mknod(Caller::ROOT, 1, b"f", 0o644, 0).unwrap().ino;
            let set = Timestamp {
                sec: 1_000_000_000,
                nsec: 0,
            };
            let times = SetAttr {
                mtime: Some(TimeSet::At(set)),
                ctime: Some(set),
                ..Default::default()
            };
            fs.setattr(ino, &times).unwrap();
            let adapter = AnvilFuse::new(fs.clone(), Duration::from_secs(1), writeback);
            assert_eq!(adapter.write(ino, 0, b"data", false).unwrap(), 4);
            let attr = fs.getattr(ino).unwrap();
            assert_eq!(attr.size, 4);
            assert_eq!(
                (attr.mtime == set, attr.ctime == set),
                (writeback, writeback),
                "writeback {writeback}"
            );
        }
    }

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape_mountinfo("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo("/x\\134y\\011"), "/x\\y\t");
        // Not an escape: left as it is.
        assert_eq!(unescape_mountinfo("/a\\9zz\\777"), "/a\\9zz\\777");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }
}
