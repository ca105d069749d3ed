//! Object-store volumes: the device's bytes in immutable objects of an S3-compatible store.
//!
//! The engine above writes blocks at offsets and flushes; it never rewrites a committed block
//! except the superblocks and the redo log (the copy-on-write tree sees to that). So the
//! device is a log of *segments*: every flush uploads what was written since the previous
//! one as one object, written once, and a map from device offsets to (segment, offset in
//! it) answers reads. An offset written again lives in the newer segment; a segment none of
//! whose bytes the map still points at is deleted. Every 64 segments a *checkpoint* object
//! holds the whole map, so opening reads one checkpoint and at most 64 segment headers.
//!
//! Objects under the volume's prefix:
//!
//! | key | what |
//! |---|---|
//! | `anvil-volume` | the marker: format version, size, whether the store honours conditional puts |
//! | `seg/<seq>-<epoch>` | a segment: header (ranges of the device it holds), then their bytes, packed in 256 KiB pieces (`packing.rs`) |
//! | `ckpt/<seq>-<epoch>` | the map as of segment `seq` |
//! | `claim/<epoch>-<id>` | a writer's claim of the volume (host, pid, time) |
//! | `fence/<epoch>` | put before the claims of `epoch`: what the writer below looks for |
//! | `beat/<epoch>-<n>` | the newest heartbeat of the writer of `epoch` |
//! | `release/<epoch>` | the writer of `epoch` unmounted cleanly |
//!
//! (numbers are 16 hex digits, so keys sort by number).
//!
//! ## One writer, even on stores that ignore conditional writes
//!
//! A writer first *claims* an epoch one above every claim it lists, by putting
//! `claim/<epoch>-<random id>` and listing the claims again: if it sees any other claim of
//! its epoch or above, it gives up (two hosts racing both may give up; neither proceeds
//! unsafely). Only then does it list the segments, and it names its segments with its
//! epoch. After every segment it puts, it looks for a higher epoch's claim (below: one read of
//! its fence); if there is one, the
//! flush fails and the device refuses every later write.
//!
//! Why an acknowledged flush is never lost to a second writer, assuming only that a listing
//! started after a put returned sees the put (read-after-write, which S3 gives and Garage
//! gives through quorum reads): let writer A put segment S and then list the claims without
//! seeing B's claim. Then B's claim put had not returned when A's listing started, so B's
//! listing of segments, which B starts after its claim put returned, starts after A's put of
//! S returned: B sees S and builds on it. If A's listing does see B's claim, A reports the
//! flush failed (whether or not S survives).
//!
//! Which segments count: a segment `(seq, epoch)` is *void* when some segment of a higher
//! epoch has a sequence number at or below `seq`. B's first act after claiming is to put a
//! segment numbered one past the newest it listed, which voids whatever A put after B listed
//! (A never acknowledged those: its check after each put sees B's claim). A checkpoint is
//! void by the same rule.
//!
//! A mount that finds the newest claim neither released nor expired waits one lease for a
//! sign of life (a new heartbeat or segment of that epoch) and refuses if it sees one; a
//! writer beats every `lease / 5`. A writer that only paused past its lease is fenced by the
//! check above, not by the lease: the lease only keeps a live writer from being deposed by
//! accident.
//!
//! The check after each segment reads one key rather than listing the claims: a claim of
//! epoch `e` is preceded by a put of `fence/<e>`, and every claim above `epoch + 1` was made
//! by a writer that listed a claim of the epoch below it, so `fence/<epoch + 1>` exists
//! before any later writer lists the segments (see `Shared::deposed`). Where the store
//! honours `If-None-Match` (probed once at creation, recorded in the marker), the fence is
//! put conditionally, a second guard against two claims of one epoch.

use super::{out_of_range, BlobStore, Device};
use crate::sync::Mutex;
use parking_lot::RwLock;
use quick_cache::Weighter;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod disk;
mod packing;

const MARKER_KEY: &str = "anvil-volume";
const MARKER_MAGIC: &str = "anvil object volume 1";
const SEGMENT_MAGIC: &[u8; 8] = b"ANVLSEG1";
const CHECKPOINT_MAGIC: &[u8; 8] = b"ANVLCKP2";
/// Checkpoints before segments were packed: no stored sizes (each equals the logical one).
const CHECKPOINT_MAGIC_V1: &[u8; 8] = b"ANVLCKP1";
/// A checkpoint after this many segments bounds what opening reads.
const CHECKPOINT_EVERY: u64 = 64;
/// Every this many segments, sparse ones are repacked (`Shared::repack`)...
const REPACK_EVERY: u64 = 16;
/// ...except the newest this many (their bytes are likely to be rewritten soon)...
const REPACK_SPARE_RECENT: u64 = 16;
/// ...when under half of them is live or they are smaller than this...
const REPACK_SMALL_BYTES: u64 = 1 << 20;
/// ...copying at most this much at a time.
const REPACK_BYTES: u64 = 16 << 20;
/// Segment bytes are fetched and cached in pieces of this size.
const PIECE_BYTES: u64 = 256 << 10;
/// The first read of a segment's header fetches this much.
const HEADER_GUESS: u64 = 64 << 10;

/// How an object-store device is opened.
#[derive(Clone, Debug)]
pub struct ObjectOptions {
    /// Claim the volume for writing (else read what the writer committed).
    pub writable: bool,
    /// How long a writer that stopped showing signs of life is presumed alive.
    pub lease: Duration,
    /// The previous writer is known to be dead (its daemon was replaced): claim at once.
    pub takeover: bool,
    /// Memory for pieces of segments read from the store.
    pub cache_bytes: u64,
    /// Bytes written since the last flush that make the device upload a segment anyway.
    pub segment_bytes: u64,
    /// How long a failing request is retried before the operation fails.
    pub retry_for: Duration,
    /// A local directory for pieces of segments read and uploaded (`cache_dir=`), and the
    /// bytes it may hold; the volume's own subdirectory is made in it.
    pub disk_cache: Option<(std::path::PathBuf, u64)>,
}

impl Default for ObjectOptions {
    fn default() -> Self {
        ObjectOptions {
            writable: false,
            lease: Duration::from_secs(5),
            takeover: false,
            cache_bytes: 64 << 20,
            segment_bytes: 32 << 20,
            retry_for: Duration::from_secs(300),
            disk_cache: None,
        }
    }
}

/// What an object-store device did since it was opened, for `anvil info`.
#[derive(Clone, Debug, Default)]
pub struct ObjectStats {
    pub epoch: u64,
    pub segments: u64,
    pub uploaded_bytes: u64,
    pub uploaded_segments: u64,
    pub pending_bytes: u64,
    pub fetched_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Time spent uploading segments and checking the fence after each (milliseconds).
    pub upload_ms: u64,
    pub fence_ms: u64,
    /// Misses of the memory cache that the disk cache answered, and what it holds.
    pub disk_hits: u64,
    pub disk_bytes: u64,
    pub deleted_objects: u64,
    /// Bytes the engine wrote, and bytes repacks copied (both uploaded in segments).
    pub written_bytes: u64,
    pub repacked_bytes: u64,
    /// Writes that waited for an upload because the store fell behind, and how long.
    pub write_waits: u64,
    pub write_wait_ms: u64,
}

/// An offset or length inside a buffer in memory (or of one about to be).
#[expect(
    clippy::cast_possible_truncation,
    reason = "callers pass offsets and lengths of buffers in memory, which fit a usize"
)]
fn in_memory(v: u64) -> usize {
    v as usize
}

fn le_u64(bytes: &[u8]) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(word)
}

fn le_u32(bytes: &[u8]) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[..4]);
    u32::from_le_bytes(word)
}

/// A count written as 32 bits that the writer keeps below 2^32.
fn count32(n: usize) -> io::Result<u32> {
    u32::try_from(n).map_err(|_| io::Error::other(format!("{n} entries do not fit a segment")))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

// ---------------------------------------------------------------------------------------
// A map of byte ranges.

/// A value that describes bytes from some position on, and can describe them from further on.
trait Piece: Clone {
    fn advance(&self, by: u64) -> Self;
    /// Whether `next` continues `self` (which covers `len` bytes) with no gap.
    fn continues(&self, _len: u64, _next: &Self) -> bool {
        false
    }
}

/// Non-overlapping ranges `[start, end)` of the device, each with a value; inserting a range
/// replaces what it overlaps.
#[derive(Clone)]
struct RangeMap<V> {
    map: BTreeMap<u64, (u64, V)>,
}

impl<V: Piece> RangeMap<V> {
    fn new() -> Self {
        RangeMap {
            map: BTreeMap::new(),
        }
    }

    fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Sets `[start, end)` to `value`; calls `replaced` with every piece it covers.
    fn insert(&mut self, start: u64, end: u64, value: V, mut replaced: impl FnMut(u64, u64, &V)) {
        debug_assert!(start < end);
        let overlapping: Vec<u64> = self
            .map
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(s, _)| *s)
            .collect();
        for s in overlapping {
            let Some((e, v)) = self.map.remove(&s) else {
                continue;
            };
            if s < start {
                self.map.insert(s, (start, v.clone()));
            }
            if e > end {
                self.map.insert(end, (e, v.advance(end - s)));
            }
            let (lo, hi) = (s.max(start), e.min(end));
            replaced(lo, hi, &v.advance(lo - s));
        }
        let (mut start, mut value) = (start, value);
        // Join the piece before when this one continues it (one entry per sequential run).
        if let Some((&s, (e, v))) = self.map.range(..start).next_back() {
            if *e == start && v.continues(start - s, &value) {
                value = v.clone();
                self.map.remove(&s);
                start = s;
            }
        }
        let mut end = end;
        if let Some((e, v)) = self.map.get(&end).cloned() {
            if value.continues(end - start, &v) {
                self.map.remove(&end);
                end = e;
            }
        }
        self.map.insert(start, (end, value));
    }

    /// The pieces overlapping `[start, end)`, clipped to it, in order.
    fn pieces(&self, start: u64, end: u64) -> Vec<(u64, u64, V)> {
        let mut out = Vec::new();
        let first = self
            .map
            .range(..=start)
            .next_back()
            .filter(|(_, (e, _))| *e > start)
            .map(|(s, _)| *s)
            .unwrap_or(start);
        for (&s, (e, v)) in self.map.range(first..end) {
            let (lo, hi) = (s.max(start), (*e).min(end));
            if lo < hi {
                out.push((lo, hi, v.advance(lo - s)));
            }
        }
        out
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64, &V)> {
        self.map.iter().map(|(s, (e, v))| (*s, *e, v))
    }
}

/// Where bytes of the device live: segment `seg` (an index into the device's table), from
/// byte `at` of its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    seg: usize,
    at: u64,
}

impl Piece for Loc {
    fn advance(&self, by: u64) -> Self {
        Loc {
            seg: self.seg,
            at: self.at + by,
        }
    }
    fn continues(&self, len: u64, next: &Self) -> bool {
        next.seg == self.seg && next.at == self.at + len
    }
}

/// Bytes written and not yet uploaded: a shared buffer from position `at`.
#[derive(Clone)]
struct Written {
    bytes: Arc<Vec<u8>>,
    at: usize,
}

impl Piece for Written {
    fn advance(&self, by: u64) -> Self {
        Written {
            bytes: self.bytes.clone(),
            at: self.at + in_memory(by),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Keys, segments and checkpoints.

fn segment_key(seq: u64, epoch: u64) -> String {
    format!("seg/{seq:016x}-{epoch:016x}")
}

fn checkpoint_key(seq: u64, epoch: u64) -> String {
    format!("ckpt/{seq:016x}-{epoch:016x}")
}

fn claim_key(epoch: u64, id: u64) -> String {
    format!("claim/{epoch:016x}-{id:016x}")
}

fn beat_key(epoch: u64, n: u64) -> String {
    format!("beat/{epoch:016x}-{n:016x}")
}

fn fence_key(epoch: u64) -> String {
    format!("fence/{epoch:016x}")
}

fn release_key(epoch: u64) -> String {
    format!("release/{epoch:016x}")
}

/// `<dir>/<hex>-<hex>` → the two numbers.
fn parse_pair(key: &str, dir: &str) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(dir)?.strip_prefix('/')?;
    let (a, b) = rest.split_once('-')?;
    if a.len() != 16 || b.len() != 16 {
        return None;
    }
    Some((
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ))
}

fn parse_single(key: &str, dir: &str) -> Option<u64> {
    let rest = key.strip_prefix(dir)?.strip_prefix('/')?;
    (rest.len() == 16).then_some(())?;
    u64::from_str_radix(rest, 16).ok()
}

struct Marker {
    size: u64,
    conditional: bool,
    /// Made at mkfs: a disk cache's pieces belong to this volume, not to one made again
    /// under the same prefix.
    id: u64,
}

impl Marker {
    fn encode(&self) -> Vec<u8> {
        format!(
            "{MARKER_MAGIC}\nsize={}\nconditional={}\nid={:016x}\n",
            self.size,
            if self.conditional { "yes" } else { "no" },
            self.id
        )
        .into_bytes()
    }

    fn decode(bytes: &[u8], store: &str) -> io::Result<Marker> {
        let bad = || {
            invalid(format!(
                "{store}: the volume marker {MARKER_KEY} is damaged"
            ))
        };
        let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
        let mut lines = text.lines();
        match lines.next() {
            Some(MARKER_MAGIC) => {}
            Some(first) if first.starts_with("anvil object volume ") => {
                return Err(invalid(format!(
                    "{store}: made by a newer anvil ({first}); this one reads version 1"
                )))
            }
            _ => return Err(bad()),
        }
        let (mut size, mut conditional, mut id) = (None, None, None);
        for line in lines {
            match line.split_once('=') {
                Some(("size", v)) => size = v.parse().ok(),
                Some(("conditional", v)) => conditional = Some(v == "yes"),
                Some(("id", v)) => id = u64::from_str_radix(v, 16).ok(),
                _ => {}
            }
        }
        Ok(Marker {
            size: size.ok_or_else(bad)?,
            conditional: conditional.ok_or_else(bad)?,
            id: id.ok_or_else(bad)?,
        })
    }
}

/// A segment's header: where on the device each range of its body goes.
struct SegmentHeader {
    seq: u64,
    epoch: u64,
    /// (device offset, length); the bodies follow the header back to back.
    ranges: Vec<(u64, u32)>,
}

impl SegmentHeader {
    fn len_for(count: usize) -> u64 {
        8 + 8 + 8 + 4 + 12 * count as u64 + 4
    }

    fn header_len(&self) -> u64 {
        Self::len_for(self.ranges.len())
    }
    fn encode(&self, out: &mut Vec<u8>) -> io::Result<()> {
        let start = out.len();
        out.extend_from_slice(SEGMENT_MAGIC);
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&count32(self.ranges.len())?.to_le_bytes());
        for (offset, len) in &self.ranges {
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// How many header bytes `prefix` (the start of the object) says there are.
    fn needed(prefix: &[u8]) -> Option<u64> {
        Some(Self::len_for(le_u32(prefix.get(24..28)?) as usize))
    }

    fn decode(bytes: &[u8], key: &str, object_bytes: u64) -> io::Result<SegmentHeader> {
        let bad = |what: &str| invalid(format!("segment {key} is damaged ({what})"));
        if bytes.len() < 28 || &bytes[..8] != SEGMENT_MAGIC {
            return Err(bad("no segment magic"));
        }
        let (seq, epoch) = (le_u64(&bytes[8..]), le_u64(&bytes[16..]));
        let count = le_u32(&bytes[24..]) as usize;
        let header_len = in_memory(Self::len_for(count));
        if bytes.len() < header_len {
            return Err(bad("header truncated"));
        }
        let crc = le_u32(&bytes[header_len - 4..]);
        if crc32c::crc32c(&bytes[..header_len - 4]) != crc {
            return Err(bad("header checksum"));
        }
        let mut ranges = Vec::with_capacity(count);
        let mut body = 0u64;
        for i in 0..count {
            let at = 28 + 12 * i;
            let offset = le_u64(&bytes[at..]);
            let len = le_u32(&bytes[at + 8..]);
            body += u64::from(len);
            ranges.push((offset, len));
        }
        if header_len as u64 + body != object_bytes {
            return Err(bad(&format!(
                "{object_bytes} bytes where the header describes {}",
                header_len as u64 + body
            )));
        }
        Ok(SegmentHeader { seq, epoch, ranges })
    }
}

/// One segment the map may point into.
#[derive(Clone, Debug)]
struct Segment {
    seq: u64,
    epoch: u64,
    /// Logical bytes (header and bodies), and the object's own size (packed, they differ).
    bytes: u64,
    stored: u64,
    /// Bytes of the device the map still finds here.
    live: u64,
    /// The object is gone (reclaimed, or missing from a checkpoint's listing).
    gone: bool,
}

impl Segment {
    fn key(&self) -> String {
        segment_key(self.seq, self.epoch)
    }
}

/// The map and the segment table, as a checkpoint object.
fn encode_checkpoint(
    seq: u64,
    epoch: u64,
    segments: &[Segment],
    map: &RangeMap<Loc>,
) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64 + segments.len() * 16 + map.map.len() * 28);
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&count32(segments.len())?.to_le_bytes());
    for s in segments {
        out.extend_from_slice(&s.seq.to_le_bytes());
        out.extend_from_slice(&s.epoch.to_le_bytes());
        out.extend_from_slice(&s.bytes.to_le_bytes());
        out.extend_from_slice(&s.stored.to_le_bytes());
    }
    out.extend_from_slice(&(map.map.len() as u64).to_le_bytes());
    for (start, end, loc) in map.iter() {
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&(end - start).to_le_bytes());
        out.extend_from_slice(&count32(loc.seg)?.to_le_bytes());
        out.extend_from_slice(&loc.at.to_le_bytes());
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(out)
}

fn decode_checkpoint(bytes: &[u8], key: &str) -> io::Result<(Vec<Segment>, RangeMap<Loc>)> {
    let bad = |what: &str| invalid(format!("checkpoint {key} is damaged ({what})"));
    let stored_sizes = match bytes.get(..8) {
        Some(magic) if bytes.len() >= 36 && magic == CHECKPOINT_MAGIC => true,
        Some(magic) if bytes.len() >= 36 && magic == CHECKPOINT_MAGIC_V1 => false,
        _ => return Err(bad("no checkpoint magic")),
    };
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != le_u32(crc) {
        return Err(bad("checksum"));
    }
    let mut at = 24usize;
    let mut take = |n: usize| -> io::Result<&[u8]> {
        let piece = body.get(at..at + n).ok_or_else(|| bad("truncated"))?;
        at += n;
        Ok(piece)
    };
    let u64_of = le_u64;
    let count = le_u32(take(4)?) as usize;
    let mut segments = Vec::with_capacity(count.min(1 << 20));
    for _ in 0..count {
        let (seq, epoch, size) = (u64_of(take(8)?), u64_of(take(8)?), u64_of(take(8)?));
        let stored = match stored_sizes {
            true => u64_of(take(8)?),
            false => size,
        };
        segments.push(Segment {
            seq,
            epoch,
            bytes: size,
            stored,
            live: 0,
            gone: false,
        });
    }
    let entries = u64_of(take(8)?);
    let mut map = RangeMap::new();
    for _ in 0..entries {
        let (start, len) = (u64_of(take(8)?), u64_of(take(8)?));
        let seg = le_u32(take(4)?) as usize;
        let loc_at = u64_of(take(8)?);
        if seg >= segments.len() || len == 0 {
            return Err(bad("entry names no segment"));
        }
        map.map
            .insert(start, (start + len, Loc { seg, at: loc_at }));
    }
    Ok((segments, map))
}

/// Which listed (seq, epoch) pairs count: not voided by a higher epoch at or below `seq`.
fn valid_pairs(segments: &[(u64, u64)]) -> impl Fn(u64, u64) -> bool {
    let mut sorted: Vec<(u64, u64)> = segments.to_vec();
    sorted.sort_unstable();
    // The highest epoch among segments numbered at or below each listed seq.
    let mut highest = Vec::with_capacity(sorted.len());
    let mut max = 0;
    for &(seq, epoch) in &sorted {
        max = max.max(epoch);
        highest.push((seq, max));
    }
    move |seq, epoch| {
        let at = highest.partition_point(|&(s, _)| s <= seq);
        at == 0 || highest[at - 1].1 <= epoch
    }
}

// ---------------------------------------------------------------------------------------
// The device.

#[derive(Clone)]
struct PieceBytes;

/// A piece of a segment: (seq, epoch, piece number).
type PieceId = (u64, u64, u64);

impl Weighter<PieceId, Arc<Vec<u8>>> for PieceBytes {
    fn weight(&self, _key: &PieceId, bytes: &Arc<Vec<u8>>) -> u64 {
        64 + bytes.len() as u64
    }
}

struct State {
    map: RangeMap<Loc>,
    segments: Vec<Segment>,
    /// Written since the last upload began.
    dirty: RangeMap<Written>,
    dirty_bytes: u64,
    /// Being uploaded now (reads still see it).
    uploading: RangeMap<Written>,
    next_seq: u64,
    last_checkpoint: u64,
    /// The highest epoch among the segments the map was built from (a reader reloads when
    /// a higher one voids what it applied).
    top_epoch: u64,
    /// How each segment's object holds its bytes, where known: segments uploaded or whose
    /// header was read since open; others are looked up on their first read (`layout`).
    layouts: HashMap<(u64, u64), Arc<Layout>>,
}

/// How a segment's object holds its logical bytes.
#[derive(Debug)]
enum Layout {
    /// As they are (`ANVLSEG1`).
    Plain,
    /// In pieces, each packed or not, after a table (`ANVLSEG2`, `packing.rs`).
    Packed(packing::Packing),
}

impl State {
    /// Points the map at segment `(seq, epoch)` of `bytes` logical bytes in an object of
    /// `stored` bytes laid out as `layout`, whose header is `header`. Returns the segment's
    /// index.
    fn apply(
        &mut self,
        epoch: u64,
        (bytes, stored, layout): (u64, u64, Arc<Layout>),
        header: &SegmentHeader,
    ) -> usize {
        let ix = self.segments.len();
        self.layouts.insert((header.seq, epoch), layout);
        self.segments.push(Segment {
            seq: header.seq,
            epoch,
            bytes,
            stored,
            live: 0,
            gone: false,
        });
        let State { map, segments, .. } = self;
        let mut at = header.header_len();
        for &(offset, len) in &header.ranges {
            if len > 0 {
                map.insert(
                    offset,
                    offset + u64::from(len),
                    Loc { seg: ix, at },
                    |lo, hi, old| {
                        segments[old.seg].live -= hi - lo;
                    },
                );
                segments[ix].live += u64::from(len);
            }
            at += u64::from(len);
        }
        self.next_seq = header.seq + 1;
        self.top_epoch = self.top_epoch.max(epoch);
        ix
    }
}

#[derive(Default)]
struct Counters {
    uploaded_bytes: AtomicU64,
    uploaded_segments: AtomicU64,
    fetched_bytes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    disk_hits: AtomicU64,
    upload_nanos: AtomicU64,
    fence_nanos: AtomicU64,
    deleted: AtomicU64,
    written_bytes: AtomicU64,
    repacked_bytes: AtomicU64,
    write_waits: AtomicU64,
    write_wait_nanos: AtomicU64,
}

struct Shared {
    store: Arc<dyn BlobStore>,
    options: ObjectOptions,
    size: u64,
    epoch: u64,
    state: RwLock<State>,
    /// One upload at a time, in sequence order.
    upload: Mutex<()>,
    cache: quick_cache::sync::Cache<PieceId, Arc<Vec<u8>>, PieceBytes>,
    disk: Option<disk::DiskCache>,
    /// Another writer claimed the volume: nothing more may be written.
    fenced: AtomicBool,
    counters: Counters,
    /// When this writer last showed a sign of life (a segment or a heartbeat).
    last_sign: Mutex<Instant>,
    stop: (std::sync::Mutex<bool>, Condvar),
    /// Wakes the uploader (`Shared::upload_ahead`) when writes pile up.
    wake_uploader: (std::sync::Mutex<bool>, Condvar),
}

/// A device whose bytes live in an object store (see the module's documentation).
pub struct ObjectDevice {
    shared: Arc<Shared>,
    /// The writer's heartbeat and uploader threads.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl ObjectDevice {
    /// Makes an empty volume of `size` bytes under the store's prefix. Refuses a prefix that
    /// holds anything unless `force`, which deletes what is there first.
    pub fn create(store: &dyn BlobStore, size: u64, force: bool) -> io::Result<()> {
        let found = store.list("")?;
        if !found.is_empty() {
            let ours = found.iter().any(|(k, _)| k == MARKER_KEY);
            if !force {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    match ours {
                        true => format!(
                            "{} already holds an anvil volume; use --force to overwrite it",
                            store.describe()
                        ),
                        false => format!(
                            "{} holds {} objects that are not an anvil volume; choose an empty prefix (or --force to delete them)",
                            store.describe(),
                            found.len()
                        ),
                    },
                ));
            }
            for (key, _) in &found {
                store.delete(key)?;
            }
        }
        // Does the store refuse a second conditional put? (Garage 2.5.0 does not.)
        let probe = format!("probe/{:016x}", rand::random::<u64>());
        let first = store.put_if_absent(&probe, b"1")?;
        let second = store.put_if_absent(&probe, b"2")?;
        store.delete(&probe)?;
        let marker = Marker {
            size,
            conditional: first && !second,
            id: rand::random(),
        };
        store.put(MARKER_KEY, &marker.encode())
    }

    /// Opens the volume under the store's prefix: as its one writer (claiming it, see the
    /// module's documentation) or to read what its writer committed.
    pub fn open(store: Arc<dyn BlobStore>, options: ObjectOptions) -> io::Result<ObjectDevice> {
        let marker = match store.get(MARKER_KEY) {
            Ok(bytes) => Marker::decode(&bytes, &store.describe())?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let found = store.list("")?;
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    match found.is_empty() {
                        true => {
                            format!("{} holds no anvil volume (nothing there)", store.describe())
                        }
                        false => format!(
                            "{} holds {} objects but no anvil volume",
                            store.describe(),
                            found.len()
                        ),
                    },
                ));
            }
            Err(e) => return Err(e),
        };
        let epoch = match options.writable {
            true => claim(&*store, &options, marker.conditional)?,
            false => 0,
        };
        let disk = match &options.disk_cache {
            Some((dir, bytes)) => Some(disk::DiskCache::open(
                &dir.join(format!("{:016x}", marker.id)),
                *bytes,
            )?),
            None => None,
        };
        let state = load(&*store)?;
        let shared = Arc::new(Shared {
            disk,
            cache: quick_cache::sync::Cache::with_weighter(
                (options.cache_bytes / PIECE_BYTES).max(16) as usize,
                options.cache_bytes.max(4 * PIECE_BYTES),
                PieceBytes,
            ),
            store,
            size: marker.size,
            epoch,
            state: RwLock::new(state),
            upload: Mutex::new(()),
            fenced: AtomicBool::new(false),
            counters: Counters::default(),
            last_sign: Mutex::new(Instant::now()),
            stop: (std::sync::Mutex::new(false), Condvar::new()),
            wake_uploader: (std::sync::Mutex::new(false), Condvar::new()),
            options,
        });
        let device = ObjectDevice {
            shared: shared.clone(),
            threads: Mutex::new(Vec::new()),
        };
        if shared.options.writable {
            // The fence: a segment one past the newest listed voids whatever an earlier
            // writer puts after our listing.
            shared.upload_pending(true)?;
            shared.tidy_after_claim();
            let (beating, uploading) = (shared.clone(), shared.clone());
            let mut threads = device.threads.lock();
            threads.push(
                std::thread::Builder::new()
                    .name("anvil-beat".into())
                    .spawn(move || beating.beat())?,
            );
            threads.push(
                std::thread::Builder::new()
                    .name("anvil-upload".into())
                    .spawn(move || uploading.upload_ahead())?,
            );
        }
        Ok(device)
    }

    /// Picks up segments the writer uploaded since this (read-only) device was opened.
    /// Returns whether anything changed.
    pub fn refresh(&self) -> io::Result<bool> {
        let shared = &self.shared;
        if shared.options.writable {
            return Ok(false);
        }
        let store = &*shared.store;
        let listed = list_segments(store)?;
        let pairs: Vec<(u64, u64)> = listed.iter().map(|&(s, e, _)| (s, e)).collect();
        let valid = valid_pairs(&pairs);
        let (next_seq, top_epoch) = {
            let state = shared.state.read();
            (state.next_seq, state.top_epoch)
        };
        // A new writer voided segments this map holds: read the map again.
        if listed
            .iter()
            .any(|&(s, e, _)| e > top_epoch && s < next_seq)
        {
            let fresh = load(store)?;
            *shared.state.write() = fresh;
            return Ok(true);
        }
        let mut fresh: Vec<(u64, u64, u64)> = listed
            .into_iter()
            .filter(|&(s, e, _)| s >= next_seq && valid(s, e))
            .collect();
        fresh.sort_unstable();
        let mut headers = Vec::with_capacity(fresh.len());
        for &(seq, epoch, size) in &fresh {
            match read_segment_header(store, seq, epoch, size) {
                Ok((header, sizes)) => headers.push((epoch, sizes, header)),
                // Listed after the writer deleted it (a listing may lag a delete): dead.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        let mut state = shared.state.write();
        if state.next_seq != next_seq {
            return Ok(false);
        }
        for (epoch, sizes, header) in headers.iter() {
            state.apply(*epoch, sizes.clone(), header);
        }
        Ok(!headers.is_empty())
    }

    pub fn stats(&self) -> ObjectStats {
        let shared = &self.shared;
        let state = shared.state.read();
        let c = &shared.counters;
        ObjectStats {
            epoch: shared.epoch,
            segments: state.segments.iter().filter(|s| !s.gone).count() as u64,
            uploaded_bytes: c.uploaded_bytes.load(Ordering::Relaxed),
            uploaded_segments: c.uploaded_segments.load(Ordering::Relaxed),
            pending_bytes: state.dirty_bytes,
            fetched_bytes: c.fetched_bytes.load(Ordering::Relaxed),
            cache_hits: c.hits.load(Ordering::Relaxed),
            cache_misses: c.misses.load(Ordering::Relaxed),
            disk_hits: c.disk_hits.load(Ordering::Relaxed),
            upload_ms: c.upload_nanos.load(Ordering::Relaxed) / 1_000_000,
            fence_ms: c.fence_nanos.load(Ordering::Relaxed) / 1_000_000,
            disk_bytes: shared.disk.as_ref().map_or(0, |d| d.bytes()),
            deleted_objects: c.deleted.load(Ordering::Relaxed),
            written_bytes: c.written_bytes.load(Ordering::Relaxed),
            repacked_bytes: c.repacked_bytes.load(Ordering::Relaxed),
            write_waits: c.write_waits.load(Ordering::Relaxed),
            write_wait_ms: c.write_wait_nanos.load(Ordering::Relaxed) / 1_000_000,
        }
    }

    /// Ends the claim: stops the heartbeat and, when the writer was not fenced and nothing
    /// is left unflushed, records a clean release so that the next writer need not wait a
    /// lease. Called by drop too.
    pub fn release(&self) {
        let shared = &self.shared;
        {
            let (lock, wake) = &shared.stop;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            wake.notify_all();
        }
        shared.wake_uploader.1.notify_all();
        for thread in self.threads.lock().drain(..) {
            let _ = thread.join();
        }
        if !shared.options.writable || shared.fenced.load(Ordering::SeqCst) {
            return;
        }
        // Writes left over (a repack's copies, writes the engine never flushed) go up first:
        // a device may make any write durable early.
        for _ in 0..3 {
            if shared.state.read().dirty_bytes == 0 {
                break;
            }
            if let Err(e) = shared.upload_pending(false) {
                log::warn!("{}: {e}", shared.describe());
                break;
            }
        }
        if shared.state.read().dirty_bytes > 0 {
            log::warn!(
                "{}: released with unflushed writes; the next writer waits a lease",
                shared.store.describe()
            );
            return;
        }
        let released = shared.retry("release the volume", || {
            shared.store.put(&release_key(shared.epoch), b"")
        });
        if let Err(e) = released {
            log::warn!("{}: {e}", shared.store.describe());
        }
    }
}

impl Drop for ObjectDevice {
    fn drop(&mut self) {
        if !self.threads.lock().is_empty() {
            self.release();
        }
    }
}

/// Claims the volume for writing; returns the epoch (see the module's documentation).
fn claim(store: &dyn BlobStore, options: &ObjectOptions, conditional: bool) -> io::Result<u64> {
    let claims = || -> io::Result<Vec<(u64, u64)>> {
        Ok(store
            .list("claim/")?
            .iter()
            .filter_map(|(k, _)| parse_pair(k, "claim"))
            .collect())
    };
    let listed = claims()?;
    let latest = listed.iter().map(|&(e, _)| e).max().unwrap_or(0);
    if latest > 0 && !options.takeover {
        let released = store.list(&release_key(latest))?.len() == 1;
        if !released {
            // A writer that did not release: alive, or gone without a word. Watch it.
            // Its newest heartbeat and segment, and the newest claim: maxima, because a
            // listing may still show an object for a moment after its delete (Garage).
            let signs = || -> io::Result<(u64, u64, u64)> {
                let beats = store.list("beat/")?;
                let beat = beats
                    .iter()
                    .filter_map(|(k, _)| parse_pair(k, "beat"))
                    .filter(|&(e, _)| e == latest)
                    .map(|(_, n)| n)
                    .max();
                let segment = list_segments(store)?
                    .iter()
                    .filter(|&&(_, e, _)| e == latest)
                    .map(|&(s, _, _)| s)
                    .max();
                let claim = claims()?.iter().map(|&(e, _)| e).max();
                Ok((beat.unwrap_or(0), segment.unwrap_or(0), claim.unwrap_or(0)))
            };
            let before = signs()?;
            std::thread::sleep(options.lease);
            if signs()? != before {
                let owner = listed
                    .iter()
                    .filter(|(e, _)| *e == latest)
                    .find_map(|&(e, id)| store.get(&claim_key(e, id)).ok())
                    .map(|b| describe_claim(&String::from_utf8_lossy(&b)))
                    .unwrap_or_else(|| "another host".to_string());
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "{} is mounted read-write by {owner}; unmount it there first (or mount it with -o ro)",
                        store.describe()
                    ),
                ));
            }
        }
    }
    let epoch = latest + 1;
    let id = rand::random::<u64>() | 1;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".to_string());
    let about = format!(
        "host={host} pid={} since={}",
        std::process::id(),
        now_secs()
    );
    let racing = || {
        io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "another host is mounting {} read-write at the same time; try again",
                store.describe()
            ),
        )
    };
    // The fence first: the writer of `epoch - 1` looks for it after every segment.
    let fence = fence_key(epoch);
    match conditional {
        true if !store.put_if_absent(&fence, &id.to_le_bytes())? => return Err(racing()),
        true => {}
        false => store.put(&fence, &id.to_le_bytes())?,
    }
    store.put(&claim_key(epoch, id), about.as_bytes())?;
    if claims()?.iter().any(|&(e, i)| e >= epoch && i != id) {
        return Err(racing());
    }
    Ok(epoch)
}

/// Drops reclaimed segments from the table (renumbering the map's references), so that a
/// long-lived writer's table holds only segments that exist.
fn compact(state: &mut State) {
    let mut renumbered = vec![usize::MAX; state.segments.len()];
    let mut kept = Vec::with_capacity(state.segments.len());
    for (ix, segment) in state.segments.iter().enumerate() {
        if !segment.gone {
            renumbered[ix] = kept.len();
            kept.push(segment.clone());
        }
    }
    for (_, (_, loc)) in state.map.map.iter_mut() {
        loc.seg = renumbered[loc.seg];
    }
    state.segments = kept;
}

/// A claim's `host=H pid=P since=T` as `host H, pid P, for N s`.
fn describe_claim(text: &str) -> String {
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or("?")
    };
    let age = field("since").parse::<u64>().map_or("?".to_string(), |t| {
        now_secs().saturating_sub(t).to_string()
    });
    format!("host {}, pid {}, for {age} s", field("host"), field("pid"))
}

/// Reads the volume's map (`load_once`), again if the writer deleted the checkpoint it
/// listed meanwhile (it keeps the newest two).
fn load(store: &dyn BlobStore) -> io::Result<State> {
    let mut tries = 0;
    loop {
        match load_once(store) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && tries < 5 => tries += 1,
            done => return done,
        }
    }
}

/// Reads the volume's map: the newest valid checkpoint, then every valid segment after it.
fn load_once(store: &dyn BlobStore) -> io::Result<State> {
    let listed = list_segments(store)?;
    let pairs: Vec<(u64, u64)> = listed.iter().map(|&(s, e, _)| (s, e)).collect();
    let valid = valid_pairs(&pairs);
    let newest = store
        .list("ckpt/")?
        .iter()
        .filter_map(|(k, _)| parse_pair(k, "ckpt"))
        .filter(|&(s, e)| valid(s, e))
        .max();
    let (mut segments, map, base, top_epoch) = match newest {
        Some((seq, epoch)) => {
            let key = checkpoint_key(seq, epoch);
            let (segments, map) = decode_checkpoint(&store.get(&key)?, &key)?;
            (segments, map, seq, epoch)
        }
        None => (Vec::new(), RangeMap::new(), 0, 0),
    };
    // Segments the checkpoint names that the listing lacks were reclaimed: every byte the
    // map finds in them was written again later, by segments read below.
    let present: HashMap<(u64, u64), u64> = listed.iter().map(|&(s, e, z)| ((s, e), z)).collect();
    for s in &mut segments {
        s.gone = !present.contains_key(&(s.seq, s.epoch));
    }
    let mut after: Vec<(u64, u64, u64)> = listed
        .iter()
        .copied()
        .filter(|&(s, e, _)| s > base && valid(s, e))
        .collect();
    after.sort_unstable();
    for (start, end, loc) in map.iter() {
        segments[loc.seg].live += end - start;
    }
    let mut state = State {
        map,
        segments,
        dirty: RangeMap::new(),
        dirty_bytes: 0,
        uploading: RangeMap::new(),
        next_seq: base + 1,
        last_checkpoint: base,
        top_epoch,
        layouts: HashMap::new(),
    };
    for (seq, epoch, size) in after {
        let (header, sizes) = match read_segment_header(store, seq, epoch, size) {
            Ok(read) => read,
            // Listed after the writer deleted it (a listing may lag a delete): a segment is
            // deleted only once later ones hold everything it held.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        state.apply(epoch, sizes, &header);
    }
    // Numbers past the newest valid segment were used by void ones: never again.
    let listed_next = listed.iter().map(|&(s, _, _)| s + 1).max().unwrap_or(1);
    state.next_seq = state.next_seq.max(listed_next);
    Ok(state)
}

/// Every segment listed, as (seq, epoch, object bytes).
fn list_segments(store: &dyn BlobStore) -> io::Result<Vec<(u64, u64, u64)>> {
    Ok(store
        .list("seg/")?
        .iter()
        .filter_map(|(k, size)| parse_pair(k, "seg").map(|(s, e)| (s, e, *size)))
        .collect())
}

/// Logical bytes, stored bytes and layout of a segment, as `State::apply` takes them.
type Sizes = (u64, u64, Arc<Layout>);

/// Segment `(seq, epoch)`'s header, checked against its name, with its sizes and layout.
fn read_segment_header(
    store: &dyn BlobStore,
    seq: u64,
    epoch: u64,
    size: u64,
) -> io::Result<(SegmentHeader, Sizes)> {
    let key = segment_key(seq, epoch);
    let (header, sizes) = read_header(store, &key, size)?;
    if header.seq != seq || header.epoch != epoch {
        return Err(invalid(format!(
            "segment {key} names itself {}-{}",
            header.seq, header.epoch
        )));
    }
    Ok((header, sizes))
}

/// The first `HEADER_GUESS` bytes of object `key` (of `size` bytes), or more if a table
/// or header they start says it is longer.
fn read_prefix(store: &dyn BlobStore, key: &str, size: u64) -> io::Result<Vec<u8>> {
    let bytes = store.get_range(key, 0, in_memory(HEADER_GUESS.min(size)))?;
    let needed = match bytes.starts_with(packing::PACKED_MAGIC) {
        true => packing::table_len(&bytes),
        false => SegmentHeader::needed(&bytes),
    };
    match needed {
        Some(needed) if needed > bytes.len() as u64 && needed <= size => {
            store.get_range(key, 0, in_memory(needed))
        }
        _ => Ok(bytes),
    }
}

fn read_header(store: &dyn BlobStore, key: &str, size: u64) -> io::Result<(SegmentHeader, Sizes)> {
    let prefix = read_prefix(store, key, size)?;
    if !prefix.starts_with(packing::PACKED_MAGIC) {
        let header = SegmentHeader::decode(&prefix, key, size)?;
        return Ok((header, (size, size, Arc::new(Layout::Plain))));
    }
    let table = packing::decode_table(&prefix, key, size)?;
    if table.pieces.is_empty() {
        return Err(invalid(format!("segment {key} is damaged (no pieces)")));
    }
    // The header is the start of the logical bytes: unpack pieces until it is whole.
    let mut last = 0;
    let logical = loop {
        let (at, len) = table.span(0, last);
        let stored = match prefix.get(in_memory(at)..in_memory(at) + len) {
            Some(bytes) => bytes.to_vec(),
            None => store.get_range(key, at, len)?,
        };
        let logical = table.unpack_span(0, last, &stored, key)?;
        match SegmentHeader::needed(&logical) {
            Some(needed) if needed > logical.len() as u64 => {
                let want = in_memory((needed - 1) / PIECE_BYTES);
                if want <= last || want >= table.pieces.len() {
                    return Err(invalid(format!(
                        "segment {key} is damaged (header truncated)"
                    )));
                }
                last = want;
            }
            _ => break logical,
        }
    };
    let header = SegmentHeader::decode(&logical, key, table.logical)?;
    if (header.seq, header.epoch) != (table.seq, table.epoch) {
        return Err(invalid(format!(
            "segment {key} is damaged (table and header differ)"
        )));
    }
    Ok((
        header,
        (table.logical, size, Arc::new(Layout::Packed(table))),
    ))
}

impl Shared {
    fn describe(&self) -> String {
        self.store.describe()
    }

    /// Runs `request` until it succeeds, fails for good, or `retry_for` has passed.
    fn retry<T>(&self, what: &str, mut request: impl FnMut() -> io::Result<T>) -> io::Result<T> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(50);
        let mut warned = false;
        loop {
            match request() {
                Ok(value) => {
                    if warned {
                        log::warn!("{}: the store answers again ({what})", self.describe());
                    }
                    return Ok(value);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::NotFound
                            | io::ErrorKind::UnexpectedEof
                            | io::ErrorKind::InvalidData
                            | io::ErrorKind::PermissionDenied
                    ) =>
                {
                    return Err(e)
                }
                Err(e) if start.elapsed() >= self.options.retry_for => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "{}: cannot {what} after {:?}: {e}",
                            self.describe(),
                            start.elapsed()
                        ),
                    ))
                }
                Err(e) => {
                    if !warned {
                        log::warn!("{}: cannot {what} yet, retrying: {e}", self.describe());
                        warned = true;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    fn check_fence(&self) -> io::Result<()> {
        if self.fenced.load(Ordering::SeqCst) {
            return Err(io::Error::other(format!(
                "{}: another writer claimed the volume; this mount can no longer write",
                self.describe()
            )));
        }
        Ok(())
    }

    /// Whether a writer of a higher epoch has claimed the volume (and if so, fences us).
    ///
    /// One read of `fence/<epoch + 1>`, not a listing of the claims: every claim of a higher
    /// epoch was made by a writer that listed one of the epoch below, down to one of
    /// `epoch + 1`, whose fence was put before its claim. So the fence was put before any
    /// later writer listed the segments, and not seeing it is as good as not seeing a claim.
    fn deposed(&self) -> io::Result<bool> {
        self.deposed_after(true)
    }

    /// `deposed`, with the store's failures retried (`retry_for`) or given up at once (the
    /// heartbeat's look, which must not hold an unmount up while the store is away).
    fn deposed_after(&self, retrying: bool) -> io::Result<bool> {
        let fence = fence_key(self.epoch + 1);
        let found = match retrying {
            true => self.retry("look for a newer writer", || self.store.get(&fence)),
            false => self.store.get(&fence),
        };
        let higher = match found {
            Ok(_) => true,
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if higher {
            self.fenced.store(true, Ordering::SeqCst);
            log::error!(
                "{}: another writer claimed the volume (epoch above {}); refusing further writes",
                self.describe(),
                self.epoch
            );
        }
        Ok(higher)
    }

    /// Uploads what was written since the last upload as one segment (or, with `always`,
    /// an empty one when nothing was), and points the map at it once the fence check passes.
    fn upload_pending(&self, always: bool) -> io::Result<()> {
        let _one = self.upload.lock();
        self.check_fence()?;
        let (seq, pieces) = {
            let mut state = self.state.write();
            if state.dirty.is_empty() && !always {
                return Ok(());
            }
            let dirty = std::mem::replace(&mut state.dirty, RangeMap::new());
            state.dirty_bytes = 0;
            state.uploading = dirty;
            let pieces: Vec<(u64, u64, Written)> = state
                .uploading
                .iter()
                .map(|(s, e, w)| (s, e, w.clone()))
                .collect();
            (state.next_seq, pieces)
        };
        let result = self.put_segment(seq, &pieces);
        let mut state = self.state.write();
        match result {
            Ok((header, sizes)) => {
                let stored = sizes.1;
                let ix = state.apply(self.epoch, sizes, &header);
                state.uploading = RangeMap::new();
                let counters = &self.counters;
                counters.uploaded_bytes.fetch_add(stored, Ordering::Relaxed);
                counters.uploaded_segments.fetch_add(1, Ordering::Relaxed);
                *self.last_sign.lock() = Instant::now();
                let dead = self.dead_segments(&mut state, ix);
                let checkpoint = (seq - state.last_checkpoint >= CHECKPOINT_EVERY).then(|| {
                    compact(&mut state);
                    encode_checkpoint(seq, self.epoch, &state.segments, &state.map)
                });
                drop(state);
                self.reclaim(dead);
                match checkpoint {
                    Some(Ok(bytes)) => self.put_checkpoint(seq, bytes),
                    Some(Err(e)) => log::warn!("{}: no checkpoint: {e}", self.describe()),
                    None => {}
                }
                if seq % REPACK_EVERY == 0 {
                    if let Err(e) = self.repack() {
                        log::warn!(
                            "{}: repacking segments failed (tried again later): {e}",
                            self.describe()
                        );
                    }
                }
                Ok(())
            }
            Err(e) => {
                // Put the writes back under anything written since (which is newer).
                let uploading = std::mem::replace(&mut state.uploading, RangeMap::new());
                let newer = std::mem::replace(&mut state.dirty, uploading);
                for (s, e, w) in newer.iter() {
                    state.dirty.insert(s, e, w.clone(), |_, _, _| {});
                }
                state.dirty_bytes = state.dirty.iter().map(|(s, e, _)| e - s).sum();
                Err(e)
            }
        }
    }

    /// Puts segment `seq` holding `pieces` (adjacent ones joined), then checks the fence.
    fn put_segment(
        &self,
        seq: u64,
        pieces: &[(u64, u64, Written)],
    ) -> io::Result<(SegmentHeader, Sizes)> {
        let mut ranges: Vec<(u64, u32)> = Vec::new();
        for &(start, end, _) in pieces {
            let too_long = || io::Error::other(format!("a write of {} bytes", end - start));
            let len = u32::try_from(end - start).map_err(|_| too_long())?;
            match ranges.last_mut() {
                Some((s, joined))
                    if *s + u64::from(*joined) == start && joined.checked_add(len).is_some() =>
                {
                    *joined += len
                }
                _ => ranges.push((start, len)),
            }
        }
        let header = SegmentHeader {
            seq,
            epoch: self.epoch,
            ranges,
        };
        let body: u64 = pieces.iter().map(|(s, e, _)| e - s).sum();
        let mut object = Vec::with_capacity(in_memory(header.header_len() + body));
        header.encode(&mut object)?;
        for (start, end, written) in pieces {
            object
                .extend_from_slice(&written.bytes[written.at..written.at + in_memory(end - start)]);
        }
        let key = segment_key(seq, self.epoch);
        let (packed, table) = packing::pack(seq, self.epoch, &object)?;
        let sizes = (
            object.len() as u64,
            packed.len() as u64,
            Arc::new(Layout::Packed(table)),
        );
        let started = Instant::now();
        self.retry("upload a segment", || self.store.put(&key, &packed))?;
        let uploaded = Instant::now();
        if self.deposed()? {
            self.check_fence()?;
        }
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let counters = &self.counters;
        counters
            .upload_nanos
            .fetch_add(nanos(uploaded - started), Ordering::Relaxed);
        counters
            .fence_nanos
            .fetch_add(nanos(uploaded.elapsed()), Ordering::Relaxed);
        // What was just written is what is read next: keep it on disk too.
        if let Some(disk) = &self.disk {
            for (piece, bytes) in object.chunks(in_memory(PIECE_BYTES)).enumerate() {
                disk.put((seq, self.epoch, piece as u64), bytes);
            }
        }
        Ok((header, sizes))
    }

    /// Copies what the map still finds in sparse segments (under half live, or small) into
    /// the writes of the next upload, which makes them dead and so deleted: space the
    /// engine rewrote elsewhere comes back, and many small segments become one. Runs after
    /// an upload, outside the upload lock's critical work: a piece the engine wrote again
    /// meanwhile is left alone.
    fn repack(&self) -> io::Result<()> {
        let (victims, segments) = {
            let state = self.state.read();
            let recent = state.next_seq.saturating_sub(REPACK_SPARE_RECENT);
            let mut sparse: Vec<(u64, usize)> = state
                .segments
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.gone && s.live > 0 && s.seq < recent)
                .filter(|(_, s)| s.live * 2 < s.bytes || s.bytes < REPACK_SMALL_BYTES)
                .map(|(ix, s)| (s.live, ix))
                .collect();
            sparse.sort_unstable();
            let mut budget = REPACK_BYTES;
            let chosen: std::collections::HashSet<usize> = sparse
                .into_iter()
                .take_while(|&(live, _)| match budget.checked_sub(live) {
                    Some(left) => {
                        budget = left;
                        true
                    }
                    None => false,
                })
                .map(|(_, ix)| ix)
                .collect();
            // One small segment alone gains nothing from being copied.
            if chosen.len() < 2 {
                return Ok(());
            }
            let victims: Vec<(u64, u64, Loc)> = state
                .map
                .iter()
                .filter(|(_, _, loc)| chosen.contains(&loc.seg))
                .map(|(s, e, loc)| (s, e, *loc))
                .collect();
            let segments: Vec<Segment> = victims
                .iter()
                .map(|(_, _, loc)| state.segments[loc.seg].clone())
                .collect();
            (victims, segments)
        };
        let mut copies = Vec::with_capacity(victims.len());
        for (piece, segment) in victims.iter().zip(&segments) {
            let (start, end, _) = *piece;
            let mut bytes = vec![0u8; in_memory(end - start)];
            self.read_stored(
                &mut bytes,
                start,
                std::slice::from_ref(piece),
                std::slice::from_ref(segment),
            )?;
            copies.push(bytes);
        }
        let mut state = self.state.write();
        for ((start, end, loc), bytes) in victims.into_iter().zip(copies) {
            let unchanged = state.map.pieces(start, end) == [(start, end, loc)]
                && state.dirty.pieces(start, end).is_empty()
                && state.uploading.pieces(start, end).is_empty();
            if unchanged {
                let written = Written {
                    bytes: Arc::new(bytes),
                    at: 0,
                };
                state.dirty.insert(start, end, written, |_, _, _| {});
                state.dirty_bytes += end - start;
                self.counters
                    .repacked_bytes
                    .fetch_add(end - start, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Segments none of whose bytes the map points at any more (never the newest).
    fn dead_segments(&self, state: &mut State, newest: usize) -> Vec<String> {
        let mut dead = Vec::new();
        for (ix, s) in state.segments.iter_mut().enumerate() {
            if s.live == 0 && !s.gone && ix != newest {
                s.gone = true;
                dead.push(s.key());
                state.layouts.remove(&(s.seq, s.epoch));
            }
        }
        dead
    }

    /// Deletes segments that no map can need (the fence check of the segment that made them
    /// dead passed, so every later writer's chain holds that segment too).
    fn reclaim(&self, keys: Vec<String>) {
        for key in keys {
            match self.store.delete(&key) {
                Ok(()) => {
                    self.counters.deleted.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => log::warn!(
                    "{}: cannot delete {key} (left for later): {e}",
                    self.describe()
                ),
            }
        }
    }

    fn put_checkpoint(&self, seq: u64, bytes: Vec<u8>) {
        let key = checkpoint_key(seq, self.epoch);
        if let Err(e) = self.retry("write a checkpoint", || self.store.put(&key, &bytes)) {
            log::warn!(
                "{}: {e} (opening reads more segments until the next one)",
                self.describe()
            );
            return;
        }
        self.state.write().last_checkpoint = seq;
        // Keep the two newest checkpoints.
        if let Ok(listed) = self.store.list("ckpt/") {
            let mut own: Vec<String> = listed.into_iter().map(|(k, _)| k).collect();
            own.sort();
            let old = own.len().saturating_sub(2);
            self.reclaim(own.into_iter().take(old).collect());
        }
    }

    /// After a successful claim: removes what earlier writers left (void segments, their
    /// claims, heartbeats and releases, segments no map needs).
    fn tidy_after_claim(&self) {
        let mut garbage = Vec::new();
        if let Ok(listed) = self.store.list("seg/") {
            let pairs: Vec<(u64, u64)> = listed
                .iter()
                .filter_map(|(k, _)| parse_pair(k, "seg"))
                .collect();
            let valid = valid_pairs(&pairs);
            garbage.extend(
                pairs
                    .iter()
                    .filter(|&&(s, e)| !valid(s, e))
                    .map(|&(s, e)| segment_key(s, e)),
            );
        }
        // Fences stay, every one: a writer deposed long ago still looks for the fence of the
        // epoch above its own, and must find it.
        for dir in ["claim", "beat"] {
            if let Ok(listed) = self.store.list(&format!("{dir}/")) {
                garbage.extend(
                    listed
                        .into_iter()
                        .filter(|(k, _)| parse_pair(k, dir).is_some_and(|(e, _)| e < self.epoch))
                        .map(|(k, _)| k),
                );
            }
        }
        if let Ok(listed) = self.store.list("release/") {
            garbage.extend(
                listed
                    .into_iter()
                    .filter(|(k, _)| parse_single(k, "release").is_some_and(|e| e < self.epoch))
                    .map(|(k, _)| k),
            );
        }
        let dead = {
            let mut state = self.state.write();
            let newest = state.segments.len().saturating_sub(1);
            self.dead_segments(&mut state, newest)
        };
        garbage.extend(dead);
        self.reclaim(garbage);
    }

    /// Waits `interval`, or less when the device is released; whether it was.
    fn stopped_within(&self, interval: Duration) -> bool {
        let (lock, wake) = &self.stop;
        let stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
        let (stopped, _) = wake
            .wait_timeout_while(stopped, interval, |s| !*s)
            .unwrap_or_else(|e| e.into_inner());
        *stopped
    }

    /// The writer's uploader: sends what was written as a segment whenever a quarter of a
    /// segment piled up, ahead of the flush that will need it.
    fn upload_ahead(self: Arc<Self>) {
        loop {
            {
                let (lock, wake) = &self.wake_uploader;
                let mut woken = lock.lock().unwrap_or_else(|e| e.into_inner());
                if !*woken {
                    woken = wake
                        .wait_timeout(woken, Duration::from_millis(500))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                *woken = false;
            }
            if *self.stop.0.lock().unwrap_or_else(|e| e.into_inner()) {
                return;
            }
            if self.fenced.load(Ordering::SeqCst)
                || self.state.read().dirty_bytes < self.options.segment_bytes / 4
            {
                continue;
            }
            if let Err(e) = self.upload_pending(false) {
                // The next flush tries again and reports it.
                log::warn!("{}: uploading ahead: {e}", self.describe());
            }
        }
    }

    /// The writer's heartbeat: a new `beat/` object whenever nothing else showed it alive
    /// for a fifth of the lease, and a look at the claims.
    fn beat(self: Arc<Self>) {
        let interval = (self.options.lease / 5).max(Duration::from_millis(100));
        let mut n = 0u64;
        while !self.stopped_within(interval) {
            if self.fenced.load(Ordering::SeqCst) {
                continue;
            }
            if self.last_sign.lock().elapsed() >= interval {
                n += 1;
                if self.store.put(&beat_key(self.epoch, n), b"").is_ok() {
                    *self.last_sign.lock() = Instant::now();
                    if n > 1 {
                        let _ = self.store.delete(&beat_key(self.epoch, n - 1));
                    }
                }
            }
            if let Err(e) = self.deposed_after(false) {
                log::warn!("{}: cannot look for a newer writer: {e}", self.describe());
            }
        }
    }

    /// Fills `buf` from the map's pieces of `[offset, offset + buf.len())`.
    fn read_stored(
        &self,
        buf: &mut [u8],
        offset: u64,
        pieces: &[(u64, u64, Loc)],
        segments: &[Segment],
    ) -> io::Result<()> {
        for (&(start, end, loc), segment) in pieces.iter().zip(segments) {
            let mut at = loc.at;
            let mut into = in_memory(start - offset);
            let mut left = end - start;
            while left > 0 {
                let piece = at / PIECE_BYTES;
                let piece_len = PIECE_BYTES.min(segment.bytes.saturating_sub(piece * PIECE_BYTES));
                let from = in_memory(at - piece * PIECE_BYTES);
                let n = in_memory(left).min(in_memory(piece_len).saturating_sub(from));
                if n == 0 {
                    return Err(invalid(format!(
                        "segment {} is shorter than its map says",
                        segment.key()
                    )));
                }
                let out = &mut buf[into..into + n];
                let id = (segment.seq, segment.epoch, piece);
                // Memory, then just the bytes asked for from the disk cache, then the store.
                if let Some(bytes) = self.cache.get(&id) {
                    self.counters.hits.fetch_add(1, Ordering::Relaxed);
                    out.copy_from_slice(&bytes[from..from + n]);
                } else if self
                    .disk
                    .as_ref()
                    .is_some_and(|d| d.read_at(id, piece_len, from as u64, out))
                {
                    self.counters.misses.fetch_add(1, Ordering::Relaxed);
                    self.counters.disk_hits.fetch_add(1, Ordering::Relaxed);
                } else {
                    let bytes = self.piece(segment, piece)?;
                    out.copy_from_slice(&bytes[from..from + n]);
                }
                at += n as u64;
                into += n;
                left -= n as u64;
            }
        }
        Ok(())
    }
    /// How `segment`'s object holds its bytes: known since its upload or header read, or
    /// read once now from the start of the object (segments a checkpoint named).
    fn layout(&self, segment: &Segment) -> io::Result<Arc<Layout>> {
        let id = (segment.seq, segment.epoch);
        if let Some(layout) = self.state.read().layouts.get(&id) {
            return Ok(layout.clone());
        }
        let key = segment.key();
        let prefix = self.retry("read a segment", || {
            read_prefix(&*self.store, &key, segment.stored)
        })?;
        let layout = match prefix.starts_with(packing::PACKED_MAGIC) {
            true => {
                let table = packing::decode_table(&prefix, &key, segment.stored)?;
                if (table.seq, table.epoch, table.logical)
                    != (segment.seq, segment.epoch, segment.bytes)
                {
                    return Err(invalid(format!(
                        "segment {key} is damaged (its table does not match the checkpoint)"
                    )));
                }
                Layout::Packed(table)
            }
            false => Layout::Plain,
        };
        let layout = Arc::new(layout);
        self.state.write().layouts.insert(id, layout.clone());
        Ok(layout)
    }

    fn piece(&self, segment: &Segment, piece: u64) -> io::Result<Arc<Vec<u8>>> {
        let id = (segment.seq, segment.epoch, piece);
        if let Some(bytes) = self.cache.get(&id) {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(bytes);
        }
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let from = piece * PIECE_BYTES;
        let len = in_memory(PIECE_BYTES.min(segment.bytes.saturating_sub(from)));
        if let Some(bytes) = self.disk.as_ref().and_then(|d| d.get(id, len)) {
            self.counters.disk_hits.fetch_add(1, Ordering::Relaxed);
            let bytes = Arc::new(bytes);
            self.cache.insert(id, bytes.clone());
            return Ok(bytes);
        }
        let key = segment.key();
        let gone = |e: io::Error| match e.kind() {
            io::ErrorKind::NotFound => io::Error::new(
                e.kind(),
                format!(
                    "{}: segment {key} is gone (the writer reclaimed it; open the volume again)",
                    self.describe()
                ),
            ),
            _ => e,
        };
        let layout = self.layout(segment).map_err(gone)?;
        let (bytes, fetched) = match &*layout {
            Layout::Plain => {
                let bytes = self
                    .retry("read a segment", || self.store.get_range(&key, from, len))
                    .map_err(gone)?;
                (bytes, len)
            }
            Layout::Packed(table) => {
                let ix = in_memory(piece);
                if ix >= table.pieces.len() {
                    return Err(invalid(format!(
                        "segment {key} is shorter than its map says"
                    )));
                }
                let (at, stored_len) = table.span(ix, ix);
                let stored = self
                    .retry("read a segment", || {
                        self.store.get_range(&key, at, stored_len)
                    })
                    .map_err(gone)?;
                (table.unpack(ix, &stored, &key)?, stored_len)
            }
        };
        self.counters
            .fetched_bytes
            .fetch_add(fetched as u64, Ordering::Relaxed);
        if let Some(disk) = &self.disk {
            disk.put(id, &bytes);
        }
        let bytes = Arc::new(bytes);
        self.cache.insert(id, bytes.clone());
        Ok(bytes)
    }
}

impl ObjectDevice {
    /// `read_at` from the map as it stands.
    fn read_mapped(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let shared = &self.shared;
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&end| end <= shared.size)
            .ok_or_else(|| out_of_range(offset, buf.len(), shared.size))?;
        let (stored, segments, overlay) = {
            let state = shared.state.read();
            let stored = state.map.pieces(offset, end);
            let segments: Vec<Segment> = stored
                .iter()
                .map(|(_, _, loc)| state.segments[loc.seg].clone())
                .collect();
            let mut overlay = state.uploading.pieces(offset, end);
            overlay.extend(state.dirty.pieces(offset, end));
            (stored, segments, overlay)
        };
        buf.fill(0);
        shared.read_stored(buf, offset, &stored, &segments)?;
        for (start, end, written) in overlay {
            let into = in_memory(start - offset);
            let n = in_memory(end - start);
            buf[into..into + n].copy_from_slice(&written.bytes[written.at..written.at + n]);
        }
        Ok(())
    }
}

impl Device for ObjectDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match self.read_mapped(buf, offset) {
            // A reader's map can name a segment its writer has since reclaimed (every byte
            // of it written again later): the writer's newer segments say where they went.
            // The writer's own map moves on too while a read is between the map and the
            // store (a repack copies a sparse segment's bytes and deletes it): read again.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !self.shared.options.writable {
                    self.refresh()?;
                }
                self.read_mapped(buf, offset)
            }
            done => done,
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let shared = &self.shared;
        if !shared.options.writable {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{} is open read-only", shared.describe()),
            ));
        }
        shared.check_fence()?;
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&end| end <= shared.size)
            .ok_or_else(|| out_of_range(offset, buf.len(), shared.size))?;
        let full = {
            let mut state = shared.state.write();
            let mut replaced = 0;
            state.dirty.insert(
                offset,
                end,
                Written {
                    bytes: Arc::new(buf.to_vec()),
                    at: 0,
                },
                |lo, hi, _| replaced += hi - lo,
            );
            state.dirty_bytes = state.dirty_bytes + buf.len() as u64 - replaced;
            state.dirty_bytes
        };
        // Durable early is allowed (a crash may keep any subset of unflushed writes): the
        // uploader sends what piles up, so a flush has only the tail left to wait for.
        if full >= shared.options.segment_bytes / 4 {
            let (lock, wake) = &shared.wake_uploader;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            wake.notify_one();
        }
        // Past twice a segment, the writer waits: the store is slower than the writes.
        shared
            .counters
            .written_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        if full >= 2 * shared.options.segment_bytes {
            let started = Instant::now();
            shared.upload_pending(false)?;
            let c = &shared.counters;
            c.write_waits.fetch_add(1, Ordering::Relaxed);
            c.write_wait_nanos.fetch_add(
                u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
        }
        Ok(())
    }

    fn refresh(&self) -> io::Result<bool> {
        ObjectDevice::refresh(self)
    }

    fn report(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("store_epoch", s.epoch),
            ("store_segments", s.segments),
            ("store_uploaded_bytes", s.uploaded_bytes),
            ("store_uploaded_segments", s.uploaded_segments),
            ("store_pending_bytes", s.pending_bytes),
            ("store_fetched_bytes", s.fetched_bytes),
            ("store_cache_hits", s.cache_hits),
            ("store_cache_misses", s.cache_misses),
            ("store_disk_hits", s.disk_hits),
            ("store_upload_ms", s.upload_ms),
            ("store_fence_ms", s.fence_ms),
            ("store_disk_bytes", s.disk_bytes),
            ("store_deleted_objects", s.deleted_objects),
            ("store_written_bytes", s.written_bytes),
            ("store_repacked_bytes", s.repacked_bytes),
            ("store_write_waits", s.write_waits),
            ("store_write_wait_ms", s.write_wait_ms),
        ]
    }

    /// Nothing to wait for: what was written before goes up in this segment or an earlier
    /// one, and segments count in order (a crash keeps a prefix of them).
    fn barrier(&self) -> io::Result<()> {
        self.shared.check_fence()
    }

    fn orders_writes(&self) -> bool {
        true
    }

    fn flush(&self) -> io::Result<()> {
        if !self.shared.options.writable {
            return Ok(());
        }
        self.shared.upload_pending(false)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.shared.size)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if len == self.shared.size {
            return Ok(());
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "{}: an object-store volume keeps the size it was made with ({} bytes)",
                self.shared.describe(),
                self.shared.size
            ),
        ))
    }
}

#[cfg(test)]
mod tests;
