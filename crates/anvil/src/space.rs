//! Space allocation for the data area (tree nodes and data extents).
//!
//! The free map lives in memory as coalesced byte ranges. Each commit writes it out as of that
//! commit (`format::spacemap`), and mount reads it back; a volume without one (written before
//! it existed, or whose map fails its checks) is mapped by walking the tree instead (every
//! node and every extent referenced by any element, history included). Space freed by a
//! commit is handed back only after that commit is durable and no reader still holds the old
//! root (see `volume::RootRef`); until then it is `deferred`, and counts as free in the map
//! a commit writes, since after a restart no such reader exists.
//!
//! Ranges are exact bytes: an extent owns its stored bytes and no more, so a commit packs
//! small extents back to back (format version 8). Space is handed out only as whole blocks
//! that are entirely free, from a block boundary: the rest of an allocation's last block
//! stays in the free map, where no allocation can take it until everything else in its
//! block is free too. So no two writes that are not the same request ever share a block,
//! and a torn write of one (a 4 KiB physical block under 512-byte sectors) never tears
//! another's durable bytes.
//!
//! Debug builds (and the test profile) also keep every range handed out since the map was
//! made, as redb's page allocator does: freeing or deferring part of an allocation, or a
//! range that straddles two, panics at the call that does it, not commits later when the
//! space is handed out twice. Ranges in use when the map was read from a space map have no
//! known boundaries; frees of those are checked against the free map only.

use crate::error::{Error, Result};
use crate::format::BLOCK_BYTES;
use crate::sync::Mutex;
use std::collections::BTreeMap;

pub struct Space {
    inner: Mutex<Inner>,
    data_offset: u64,
    volume_bytes: u64,
    reserve_bytes: u64,
}

struct Inner {
    /// start -> length, coalesced, in bytes (not block aligned: see the module comment).
    /// Changed only through `insert_free` and `remove_free`, which keep `room` and
    /// `whole_bytes` with it.
    free: BTreeMap<u64, u64>,
    /// Bytes of the free ranges, to the byte (what the space map records).
    free_exact: u64,
    /// Bytes of the free ranges' whole blocks: what allocations can take. A range's ends
    /// inside blocks that hold other bytes in use are free but not counted here.
    whole_bytes: u64,
    /// What the free ranges surely hold of pieces up to `PIECE_BYTES_MAX`, however sized
    /// (`room_of`, summed).
    room: u64,
    /// Next-fit cursor: consecutive allocations land side by side.
    cursor: u64,
    /// Freed by a durable commit, waiting for readers of an older root: start -> length.
    deferred: BTreeMap<u64, u64>,
    /// In use by extents written ahead of their commit (`Volume::write_direct`) that no
    /// durable commit references yet: start -> length. A space map counts them free (after
    /// a restart the redo log's replay claims again those it still needs).
    provisional: BTreeMap<u64, u64>,
    /// Debug builds: every range allocated or marked used since the map was made.
    #[cfg(debug_assertions)]
    allocated: Allocations,
}

/// Debug builds: the ranges handed out, start -> length, to check each free against.
#[cfg(debug_assertions)]
#[derive(Default)]
struct Allocations(BTreeMap<u64, u64>);

#[cfg(debug_assertions)]
impl Allocations {
    fn insert(&mut self, start: u64, bytes: u64) {
        assert!(
            self.overlapping(start, bytes).is_none(),
            "space allocated twice at {start}"
        );
        self.0.insert(start, bytes);
    }

    /// The tracked range overlapping `[start, start + bytes)`, if any.
    fn overlapping(&self, start: u64, bytes: u64) -> Option<(u64, u64)> {
        let end = start.saturating_add(bytes);
        self.0
            .range(..end)
            .next_back()
            .map(|(s, l)| (*s, *l))
            .filter(|(s, l)| s + l > start)
    }

    /// Checks that `[start, start + bytes)` is exactly one allocation (or lies in space
    /// whose allocations are not known); `remove` drops it.
    fn check(&mut self, start: u64, bytes: u64, remove: bool) {
        match self.overlapping(start, bytes) {
            Some((s, l)) if (s, l) == (start, bytes) && remove => {
                self.0.remove(&s);
            }
            Some((s, l)) if (s, l) == (start, bytes) => {}
            Some((s, l)) => panic!(
                "freeing bytes {start}..{} of the allocation {s}..{}",
                start + bytes,
                s + l
            ),
            None => {}
        }
    }
}

/// The largest piece a commit places whole: a data chunk (nodes are smaller; a cluster or
/// the node arena that finds no range that long falls back to pieces).
pub const PIECE_BYTES_MAX: u64 = crate::format::record::DATA_CHUNK_BYTES;

/// Bytes of pieces of at most `PIECE_BYTES_MAX` that the free range `[start, start + len)`
/// holds whatever their sizes: only its whole blocks can be handed out, and placed back to
/// back there, pieces are turned away only when less than a piece is left, so they waste
/// less than `PIECE_BYTES_MAX` (in whole blocks).
fn room_of(start: u64, len: u64) -> u64 {
    whole_blocks(start, len).map_or(0, |(_, blocks)| {
        blocks.saturating_sub(PIECE_BYTES_MAX - BLOCK_BYTES)
    })
}

/// The whole blocks of `[start, start + len)`: their first byte and their length, if any.
fn whole_blocks(start: u64, len: u64) -> Option<(u64, u64)> {
    let first = start.next_multiple_of(BLOCK_BYTES);
    let end = (start + len) / BLOCK_BYTES * BLOCK_BYTES;
    (end > first).then(|| (first, end - first))
}

/// `bytes` rounded up to whole blocks.
fn blocks_for(bytes: u64) -> u64 {
    bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES
}

impl Inner {
    fn insert_free(&mut self, start: u64, len: u64) {
        self.room += room_of(start, len);
        self.whole_bytes += whole_blocks(start, len).map_or(0, |(_, l)| l);
        self.free.insert(start, len);
    }

    fn remove_free(&mut self, start: u64) {
        if let Some(len) = self.free.remove(&start) {
            self.room -= room_of(start, len);
            self.whole_bytes -= whole_blocks(start, len).map_or(0, |(_, l)| l);
        }
    }

    /// Whether one free range holds all of `[start, end)`.
    fn holds(&self, start: u64, end: u64) -> bool {
        self.free
            .range(..=start)
            .next_back()
            .is_some_and(|(s, l)| *s <= start && end <= s + l)
    }
}

/// Who is asking: ordinary writes stop at the reserve, commits and maintenance may use it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Purpose {
    Data,
    Metadata,
}

impl Space {
    /// A space map with the whole data area free.
    pub fn new(data_offset: u64, volume_bytes: u64) -> Space {
        debug_assert!(data_offset % BLOCK_BYTES == 0);
        let data_bytes = volume_bytes - data_offset;
        let mut free = BTreeMap::new();
        free.insert(data_offset, data_bytes);
        Space {
            inner: Mutex::new(Inner {
                free,
                free_exact: data_bytes,
                whole_bytes: data_bytes,
                room: room_of(data_offset, data_bytes),
                cursor: data_offset,
                deferred: BTreeMap::new(),
                provisional: BTreeMap::new(),
                #[cfg(debug_assertions)]
                allocated: Allocations::default(),
            }),
            data_offset,
            volume_bytes,
            reserve_bytes: (data_bytes / 20)
                .clamp(BLOCK_BYTES * 64, 256 << 20)
                .min(data_bytes / 4),
        }
    }

    /// A space map with exactly `free` free, as read from a commit's map. Ranges must be
    /// sorted, disjoint and inside the data area.
    pub fn with_free_ranges(
        data_offset: u64,
        volume_bytes: u64,
        free: &[(u64, u64)],
    ) -> Result<Space> {
        let space = Space::new(data_offset, volume_bytes);
        {
            let mut inner = space.inner.lock();
            inner.free.clear();
            inner.free_exact = 0;
            inner.whole_bytes = 0;
            inner.room = 0;
            let mut end = data_offset;
            for &(start, bytes) in free {
                if start < end
                    || bytes == 0
                    || start.checked_add(bytes).is_none_or(|e| e > volume_bytes)
                {
                    return Err(Error::corrupt(
                        "free range out of order or outside the data area",
                        format!("bytes {start}..{}", start + bytes),
                    ));
                }
                inner.insert_free(start, bytes);
                inner.free_exact += bytes;
                end = start + bytes;
            }
        }
        Ok(space)
    }

    /// The free ranges, in order.
    pub fn free_ranges(&self) -> Vec<(u64, u64)> {
        let inner = self.inner.lock();
        inner.free.iter().map(|(s, l)| (*s, *l)).collect()
    }

    /// The free map as a restart would find it once `also_free` (space the commit being
    /// written frees) is freed: free ranges, deferred ranges and `also_free`, coalesced. Fails
    /// if any of them overlap, which would be a double free: better a failed commit than a
    /// map that hands out space twice.
    ///
    /// Provisional ranges count as free too, except those in `committing` (by start): the
    /// extents the commit being written links into its tree or frees itself.
    pub fn persisted_free(
        &self,
        also_free: &[(u64, u64)],
        committing: &std::collections::HashSet<u64>,
    ) -> Result<Vec<(u64, u64)>> {
        let inner = self.inner.lock();
        let mut all: Vec<(u64, u64)> = inner
            .free
            .iter()
            .chain(inner.deferred.iter())
            .chain(
                inner
                    .provisional
                    .iter()
                    .filter(|(s, _)| !committing.contains(s)),
            )
            .map(|(s, l)| (*s, *l))
            .collect();
        drop(inner);
        all.extend(also_free.iter().copied());
        all.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
        for (start, bytes) in all {
            match out.last_mut() {
                Some((s, l)) if *s + *l > start => {
                    return Err(Error::corrupt(
                        "space freed twice",
                        format!("bytes {start}..{}", start + bytes),
                    ))
                }
                Some((s, l)) if *s + *l == start => *l += bytes,
                _ => out.push((start, bytes)),
            }
        }
        Ok(out)
    }

    /// Records ranges a durable commit freed while readers may still use them.
    pub fn defer(&self, ranges: &[(u64, u64)]) {
        let mut inner = self.inner.lock();
        for &(start, bytes) in ranges {
            // An extent written ahead of a commit that replaced it before it was committed.
            inner.provisional.remove(&start);
            #[cfg(debug_assertions)]
            inner.allocated.check(start, bytes, false);
            let previous = inner.deferred.insert(start, bytes);
            debug_assert!(previous.is_none(), "deferred twice at {start}");
        }
    }

    /// Returns a deferred range to the free map once its last reader is gone.
    pub fn release_deferred(&self, start: u64, bytes: u64) {
        // One lock for both steps: a map written in between must see the range somewhere.
        let mut inner = self.inner.lock();
        inner.deferred.remove(&start);
        self.free_locked(&mut inner, start, bytes);
    }

    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }
    pub fn volume_bytes(&self) -> u64 {
        self.volume_bytes
    }
    pub fn data_bytes(&self) -> u64 {
        self.volume_bytes - self.data_offset
    }
    /// Free bytes that allocations can take: those of whole free blocks. What every guard
    /// of the volume's space compares with (the reserve, commits when tight, statfs).
    pub fn free_bytes(&self) -> u64 {
        self.inner.lock().whole_bytes
    }
    /// Bytes of pieces of at most `PIECE_BYTES_MAX` (extents and nodes) that the free space
    /// surely takes, however it is cut up: less than `free_bytes` by up to a piece a free
    /// range. A commit that places no more than this cannot fail for want of a long enough
    /// range, where free bytes alone promise nothing once deletes have left them in holes.
    pub fn room_bytes(&self) -> u64 {
        self.inner.lock().room
    }
    /// Bytes that nodes, extents and maps hold, to the byte (what the space map leaves
    /// used). The free ends of blocks that hold used bytes are in neither this nor
    /// `free_bytes`.
    pub fn used_bytes(&self) -> u64 {
        self.data_bytes() - self.inner.lock().free_exact
    }
    /// Bytes kept back from ordinary writes so that deletes and commits still work when full.
    pub fn reserve_bytes(&self) -> u64 {
        self.reserve_bytes
    }

    /// Allocates `bytes` at the start of whole free blocks; the rest of the last block stays
    /// free (see the module comment).
    pub fn allocate(&self, bytes: u64, purpose: Purpose) -> Result<u64> {
        let mut inner = self.inner.lock();
        let start = self.take_next_fit(&mut inner, bytes, purpose)?;
        #[cfg(debug_assertions)]
        inner.allocated.insert(start, bytes);
        Ok(start)
    }

    /// Allocates one run of whole blocks for all of `sizes` and hands it out as pieces
    /// packed back to back, byte to byte, each its own allocation (freed on its own later).
    /// NoSpace when no free range holds them all, even if each would fit somewhere.
    pub fn allocate_run(&self, sizes: &[u64], purpose: Purpose) -> Result<Vec<u64>> {
        let bytes: u64 = sizes.iter().sum();
        let mut inner = self.inner.lock();
        let mut at = self.take_next_fit(&mut inner, bytes, purpose)?;
        let mut offsets = Vec::with_capacity(sizes.len());
        for &size in sizes {
            #[cfg(debug_assertions)]
            inner.allocated.insert(at, size);
            offsets.push(at);
            at += size;
        }
        Ok(offsets)
    }

    /// Allocates `bytes` (whole blocks) exactly at `start` if that range is free: metadata
    /// that should lie right after something just written (a commit's space map after its
    /// last nodes, written in the same request). False, changing nothing, when any of it
    /// is in use.
    pub fn allocate_at(&self, start: u64, bytes: u64) -> bool {
        debug_assert!(bytes % BLOCK_BYTES == 0);
        let mut inner = self.inner.lock();
        let Some(end) = start.checked_add(bytes) else {
            return false;
        };
        if !inner.holds(start, end) || start % BLOCK_BYTES != 0 {
            return false;
        }
        Self::take(&mut inner, start, bytes);
        inner.cursor = end;
        #[cfg(debug_assertions)]
        inner.allocated.insert(start, bytes);
        true
    }

    /// Takes `bytes` from the free map at the start of whole free blocks that hold them,
    /// next fit from the cursor: the range the cursor is in if it has room, else the first
    /// range after it that fits, else the first that fits anywhere. The rest of the last
    /// block stays free, and the cursor moves past it.
    fn take_next_fit(&self, inner: &mut Inner, bytes: u64, purpose: Purpose) -> Result<u64> {
        let floor = if purpose == Purpose::Data {
            self.reserve_bytes
        } else {
            0
        };
        let blocks = blocks_for(bytes).max(BLOCK_BYTES);
        if inner.whole_bytes < blocks + floor {
            return Err(Error::NoSpace);
        }
        // Where the whole blocks of a free range hold `blocks`, the first such block.
        let fits = |(s, l): (&u64, &u64)| {
            whole_blocks(*s, *l)
                .filter(|(_, len)| *len >= blocks)
                .map(|(first, _)| first)
        };
        let cursor = inner.cursor;
        let found = inner
            .free
            .range(..=cursor)
            .next_back()
            .filter(|(s, l)| **s + **l >= cursor + blocks)
            .map(|_| cursor)
            .or_else(|| inner.free.range(cursor + 1..).find_map(fits))
            .or_else(|| inner.free.iter().find_map(fits));
        let Some(start) = found else {
            return Err(Error::NoSpace);
        };
        Self::take(inner, start, bytes);
        inner.cursor = start + blocks;
        Ok(start)
    }

    /// Allocates space for extents written ahead of their commit, as one run (see
    /// `allocate_run`): provisional until `settle` (a durable commit references them),
    /// `defer` (a commit frees them) or `release_provisional` (nothing ever did).
    pub fn allocate_provisional(&self, sizes: &[u64]) -> Result<Vec<u64>> {
        let offsets = self.allocate_run(sizes, Purpose::Data)?;
        let mut inner = self.inner.lock();
        for (&start, &size) in offsets.iter().zip(sizes) {
            inner.provisional.insert(start, size);
        }
        Ok(offsets)
    }

    /// `mark_used` for a provisional extent a replayed redo log batch names.
    pub fn mark_provisional(&self, start: u64, bytes: u64) -> Result<()> {
        self.mark_used(start, bytes)?;
        self.inner.lock().provisional.insert(start, bytes);
        Ok(())
    }

    /// Provisional ranges a durable commit now references: in use like any other.
    pub fn settle(&self, starts: impl IntoIterator<Item = u64>) {
        let mut inner = self.inner.lock();
        for start in starts {
            inner.provisional.remove(&start);
        }
    }

    /// Returns a provisional range that no operation took (it failed) to the free map.
    pub fn release_provisional(&self, start: u64, bytes: u64) {
        let mut inner = self.inner.lock();
        inner.provisional.remove(&start);
        self.free_locked(&mut inner, start, bytes);
    }

    /// Marks a range in use (mount-time rebuild). Fails if any part is already in use.
    pub fn mark_used(&self, start: u64, bytes: u64) -> Result<()> {
        // A hostile extent address near u64::MAX must fail here, not wrap past the check.
        let end = start.checked_add(bytes);
        let mut inner = self.inner.lock();
        let contains = end.is_some_and(|end| inner.holds(start, end));
        if !contains {
            return Err(Error::corrupt(
                "space referenced twice or outside the data area",
                format!("bytes {start}..{}", start.saturating_add(bytes)),
            ));
        }
        Self::take(&mut inner, start, bytes);
        #[cfg(debug_assertions)]
        inner.allocated.insert(start, bytes);
        Ok(())
    }

    fn take(inner: &mut Inner, start: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        #[expect(
            clippy::expect_used,
            reason = "callers check that a free range holds [start, start + bytes)"
        )]
        let (&range_start, &range_len) = inner
            .free
            .range(..=start)
            .next_back()
            .expect("caller checked containment");
        debug_assert!(range_start <= start && start + bytes <= range_start + range_len);
        inner.remove_free(range_start);
        if start > range_start {
            inner.insert_free(range_start, start - range_start);
        }
        let end = start + bytes;
        if end < range_start + range_len {
            inner.insert_free(end, range_start + range_len - end);
        }
        inner.free_exact -= bytes;
    }

    /// Returns a range to the free map, coalescing with neighbours.
    pub fn release(&self, start: u64, bytes: u64) {
        let mut inner = self.inner.lock();
        self.free_locked(&mut inner, start, bytes);
    }

    fn free_locked(&self, inner: &mut Inner, start: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        debug_assert!(start >= self.data_offset && start + bytes <= self.volume_bytes);
        #[cfg(debug_assertions)]
        inner.allocated.check(start, bytes, true);
        let mut new_start = start;
        let mut new_len = bytes;
        if let Some((&s, &l)) = inner.free.range(..start).next_back() {
            assert!(s + l <= start, "double free at {start}");
            if s + l == start {
                inner.remove_free(s);
                new_start = s;
                new_len += l;
            }
        }
        if let Some((&s, &l)) = inner.free.range(start..).next() {
            assert!(start + bytes <= s, "double free at {start}");
            if start + bytes == s {
                inner.remove_free(s);
                new_len += l;
            }
        }
        inner.insert_free(new_start, new_len);
        inner.free_exact += bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_contiguous_and_coalesce() {
        let space = Space::new(8192, 8192 + 1024 * 4096);
        let a = space.allocate(4096, Purpose::Data).unwrap();
        let b = space.allocate(10000, Purpose::Data).unwrap();
        assert_eq!(b, a + 4096);
        space.release(a, 4096);
        space.release(b, 10000);
        assert_eq!(space.free_bytes(), 1024 * 4096);
        space.mark_used(8192 + 4096, 4096).unwrap();
        assert!(space.mark_used(8192 + 4096, 4096).is_err());
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "freeing bytes")]
    fn freeing_part_of_an_allocation_panics() {
        let space = Space::new(8192, 8192 + 1024 * 4096);
        let a = space.allocate(3 * 4096, Purpose::Data).unwrap();
        space.release(a + 4096, 4096);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "freeing bytes")]
    fn deferring_a_range_across_two_allocations_panics() {
        let space = Space::new(8192, 8192 + 1024 * 4096);
        let a = space.allocate(4096, Purpose::Data).unwrap();
        space.allocate(4096, Purpose::Data).unwrap();
        space.defer(&[(a, 2 * 4096)]);
    }

    #[test]
    fn space_of_unknown_allocations_frees_in_any_pieces() {
        // As read from a space map: what is not free has no known boundaries.
        let space = Space::with_free_ranges(0, 64 * 4096, &[(32 * 4096, 32 * 4096)]).unwrap();
        space.release(0, 4096);
        space.release(4096, 8 * 4096);
        assert_eq!(space.free_bytes(), 41 * 4096);
    }

    #[test]
    fn provisional_space_is_free_in_maps_until_settled() {
        let space = Space::new(0, 64 * 4096);
        let none = std::collections::HashSet::new();
        let ahead = space.allocate_provisional(&[4096, 5000]).unwrap();
        assert_eq!(ahead, vec![0, 4096]);
        assert_eq!(space.free_bytes(), 61 * 4096, "whole blocks only");
        assert_eq!(space.used_bytes(), 9096);
        // In use in memory, free in a map written by a commit that does not link them.
        assert_eq!(
            space.persisted_free(&[], &none).unwrap(),
            vec![(0, 64 * 4096)]
        );
        // A commit that links the first counts it used; the second is still free there.
        let first: std::collections::HashSet<u64> = [ahead[0]].into();
        let map = space.persisted_free(&[], &first).unwrap();
        assert_eq!(map, vec![(4096, 63 * 4096)]);
        space.settle([ahead[0]]);
        assert_eq!(space.persisted_free(&[], &none).unwrap(), map);
        // One nothing took goes back; one a commit freed is deferred, not free twice.
        space.release_provisional(ahead[1], 5000);
        assert_eq!(space.free_bytes(), 63 * 4096);
        let again = space.allocate_provisional(&[4096]).unwrap();
        space.defer(&[(again[0], 4096)]);
        assert_eq!(
            space.persisted_free(&[], &none).unwrap(),
            map,
            "deferred once, not also provisional"
        );
    }

    /// The room counter follows the free map through allocations, frees and merges, and
    /// promises no more than a chunk-sized piece at a time can take.
    #[test]
    fn room_is_what_chunks_can_take() {
        let block = BLOCK_BYTES;
        let space = Space::new(0, 256 * block);
        let expect = |space: &Space| {
            let sum: u64 = space
                .free_ranges()
                .iter()
                .map(|(s, l)| room_of(*s, *l))
                .sum();
            assert_eq!(space.room_bytes(), sum);
        };
        assert_eq!(space.room_bytes(), 256 * block - (PIECE_BYTES_MAX - block));
        // Every other block in use: as many free bytes as used, no room for a chunk.
        let taken: Vec<u64> = (0..256)
            .map(|_| space.allocate(block, Purpose::Metadata).unwrap())
            .collect();
        assert_eq!(space.room_bytes(), 0);
        for &at in taken.iter().step_by(2) {
            space.release(at, block);
        }
        expect(&space);
        assert_eq!(space.free_bytes(), 128 * block);
        assert_eq!(space.room_bytes(), 0);
        assert!(space.allocate(PIECE_BYTES_MAX, Purpose::Metadata).is_err());
        // Their neighbours go: the holes join, and chunks fit as promised.
        for &at in taken.iter().skip(1).step_by(2).take(64) {
            space.release(at, block);
        }
        expect(&space);
        let room = space.room_bytes();
        assert!(room > 0);
        let mut placed = 0;
        while placed + PIECE_BYTES_MAX <= room {
            space.allocate(PIECE_BYTES_MAX, Purpose::Metadata).unwrap();
            placed += PIECE_BYTES_MAX;
            expect(&space);
        }
        let again = Space::with_free_ranges(0, 256 * block, &space.free_ranges()).unwrap();
        assert_eq!(again.room_bytes(), space.room_bytes());
    }

    #[test]
    fn a_run_packs_its_pieces_and_owns_whole_blocks() {
        let block = BLOCK_BYTES;
        let space = Space::new(0, 64 * block);
        let run = space
            .allocate_run(&[5000, 3000, 100], Purpose::Data)
            .unwrap();
        assert_eq!(run, vec![0, 5000, 8000]);
        // The rest of the run's last block is free, but only whole blocks are handed out.
        assert_eq!(space.used_bytes(), 8100);
        assert_eq!(space.free_bytes(), 62 * block, "whole blocks only");
        assert_eq!(space.free_ranges()[0], (8100, 64 * block - 8100));
        assert_eq!(space.allocate(1, Purpose::Data).unwrap(), 2 * block);
        // A dead member leaves a hole no allocation takes while its block has live bytes.
        space.release(5000, 3000);
        assert_eq!(space.allocate(1000, Purpose::Data).unwrap(), 3 * block);
        space.release(0, 5000);
        space.release(8000, 100);
        space.release(2 * block, 1);
        space.release(3 * block, 1000);
        assert_eq!(space.free_ranges(), vec![(0, 64 * block)]);
        let again = space.allocate_run(&[4096, 4096], Purpose::Data).unwrap();
        assert_eq!(
            again,
            vec![4 * block, 5 * block],
            "next fit from the cursor"
        );
    }

    /// Whatever is allocated and freed, no two allocations share a block unless one run
    /// handed both out, and the free map is exactly what no allocation holds.
    #[test]
    fn allocations_never_share_a_block_with_another() {
        use rand::{Rng, SeedableRng};
        let block = BLOCK_BYTES;
        let blocks = 256;
        let space = Space::new(0, blocks * block);
        let mut rng = rand_xoshiro::Xoshiro256PlusPlus::seed_from_u64(8);
        // (start, bytes, run number)
        let mut live: Vec<(u64, u64, usize)> = Vec::new();
        for round in 0..4000 {
            if live.is_empty() || rng.gen_bool(0.55) {
                let sizes: Vec<u64> = (0..rng.gen_range(1..6))
                    .map(|_| rng.gen_range(1..3 * block))
                    .collect();
                let Ok(offsets) = space.allocate_run(&sizes, Purpose::Metadata) else {
                    continue;
                };
                live.extend(offsets.into_iter().zip(sizes).map(|(o, s)| (o, s, round)));
            } else {
                let (start, bytes, _) = live.swap_remove(rng.gen_range(0..live.len()));
                space.release(start, bytes);
            }
            let mut owner = vec![None; blocks as usize];
            let mut used = vec![false; (blocks * block) as usize];
            for &(start, bytes, run) in &live {
                for b in start / block..(start + bytes).div_ceil(block) {
                    let other = owner[b as usize].replace(run);
                    assert!(
                        other.is_none_or(|o| o == run),
                        "block {b} shared by two runs"
                    );
                }
                used[start as usize..(start + bytes) as usize].fill(true);
            }
            let free: u64 = space.free_ranges().iter().map(|(_, l)| l).sum();
            assert_eq!(free, used.iter().filter(|u| !**u).count() as u64);
            assert_eq!(space.used_bytes(), blocks * block - free);
            let whole = (0..blocks)
                .filter(|b| !used[(b * block) as usize..((b + 1) * block) as usize].contains(&true))
                .count() as u64;
            assert_eq!(
                space.free_bytes(),
                whole * block,
                "free bytes are whole free blocks"
            );
            for (start, len) in space.free_ranges() {
                assert!(!used[start as usize..(start + len) as usize].contains(&true));
            }
        }
    }

    #[test]
    fn data_stops_at_reserve_metadata_does_not() {
        let space = Space::new(0, 256 * 4096);
        let reserve = space.reserve_bytes();
        let data_total = 256 * 4096 - reserve;
        space.allocate(data_total, Purpose::Data).unwrap();
        assert!(matches!(
            space.allocate(4096, Purpose::Data),
            Err(Error::NoSpace)
        ));
        space.allocate(4096, Purpose::Metadata).unwrap();
    }

    #[test]
    fn a_run_is_one_range_freed_in_its_pieces() {
        let space = Space::new(0, 64 * 4096);
        // Holes of one and two blocks, then room after the cursor.
        let a = space.allocate(4096, Purpose::Data).unwrap();
        space.allocate(4096, Purpose::Data).unwrap();
        let b = space.allocate(2 * 4096, Purpose::Data).unwrap();
        space.allocate(4096, Purpose::Data).unwrap();
        space.release(a, 4096);
        space.release(b, 2 * 4096);
        let run = space
            .allocate_run(&[4096, 100, 2 * 4096], Purpose::Data)
            .unwrap();
        // Not in the holes: one range, its pieces packed back to back.
        assert_eq!(run, vec![run[0], run[0] + 4096, run[0] + 4196]);
        assert!(run[0] > b);
        for (offset, bytes) in run.iter().zip([4096, 100, 2 * 4096]) {
            space.release(*offset, bytes);
        }
        assert_eq!(space.free_bytes(), 64 * 4096 - 2 * 4096);
        // A run larger than any free range is refused whole, though the space is there.
        assert!(matches!(
            space.allocate_run(&[30 * 4096, 30 * 4096], Purpose::Metadata),
            Err(Error::NoSpace)
        ));
    }
}
