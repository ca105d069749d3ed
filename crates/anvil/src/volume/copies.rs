//! Copies of small files in other files' locality sets (Hummingbird let a file be in several
//! clusters). A proxy's shared images (one logo on many pages) are stored in the set of the
//! first page that wrote them, and every other page that embeds them reads them alone,
//! after its own set. When a program names such a file as read with a page
//! (`Volume::copy_near`) and the next commit writes that page's set anyway, the commit
//! writes the file's stored bytes once more at the end of the set, so the next read of the
//! page brings the copy with it.
//!
//! A copy is not an element of the tree and owns no space: its bytes are handed back to the
//! free map as soon as they are written, so space accounting, prune, reblock, mirroring and
//! `check` never see one, and the next-fit allocator leaves them alone until it comes round
//! again. Where each copy lies is kept in memory (`CopyIndex`), by the original extent, and
//! a copy is taken from a cached set only when its bytes verify against the original
//! extent's own checksum, as set members are. So a copy is never wrong: its blocks reused
//! since, or the file written again (a new extent, another checksum), and it simply serves
//! nothing. A restart forgets the index, and with it the copies.

use super::{RootRef, Stored, Volume, CLUSTER_WINDOW_BYTES};
use crate::format::record::{compression, ExtentRef, LocalitySet};
use crate::format::BLOCK_BYTES;
use crate::sync::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Copies requested at most between two commits; past this the requests start over (a
/// request only saves a read later).
const WANTED_MAX: usize = 1 << 15;
/// Original extents whose copies the index keeps at most (88 bytes each); past this it
/// starts over.
const INDEX_MAX: usize = 1 << 15;
/// Copies kept per original extent (an image shared by many pages has one in each page's
/// set written since); a new one replaces the oldest.
const PLACES_MAX: usize = 4;
/// Bytes of copies one commit writes at most.
const COMMIT_BYTES_MAX: u64 = 8 << 20;

/// Where one copy lies: `at` bytes into the set of `blocks` blocks from `set_start`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Place {
    set_start: u64,
    at: u32,
    blocks: u32,
}

impl Place {
    fn set_bytes(&self) -> u64 {
        u64::from(self.blocks) * BLOCK_BYTES
    }
}

/// The copies of one original extent (`checksum` tells it from a later extent at the same
/// offset): `places[..len]`, oldest first.
#[derive(Clone, Copy)]
struct Entry {
    checksum: u64,
    places: [Place; PLACES_MAX],
    len: usize,
}

impl Entry {
    fn places(&self) -> &[Place] {
        &self.places[..self.len]
    }

    fn add(&mut self, place: Place) {
        let mut kept: Vec<Place> = self
            .places()
            .iter()
            .copied()
            .filter(|p| *p != place)
            .collect();
        if kept.len() == PLACES_MAX {
            kept.remove(0);
        }
        kept.push(place);
        self.places[..kept.len()].copy_from_slice(&kept);
        self.len = kept.len();
    }

    fn remove(&mut self, place: &Place) {
        let kept: Vec<Place> = self
            .places()
            .iter()
            .copied()
            .filter(|p| p != place)
            .collect();
        self.places[..kept.len()].copy_from_slice(&kept);
        self.len = kept.len();
    }
}

/// Copy requests for the next commit, and where the copies written so far lie.
#[derive(Default)]
pub(super) struct Copies {
    /// Object -> the object whose set should carry a copy of its data.
    wanted: Mutex<HashMap<u64, u64>>,
    /// Original extent offset -> its copies.
    index: Mutex<HashMap<u64, Entry>>,
}

/// A copy a commit writes: the original's extent, its stored bytes, and the hint group
/// whose set takes it.
pub(super) struct Copy {
    pub group: u64,
    pub of: ExtentRef,
    pub stored: Stored,
}

impl Copies {
    fn want(&self, obj: u64, near: u64) {
        let mut wanted = self.wanted.lock();
        if wanted.len() >= WANTED_MAX {
            wanted.clear();
        }
        if obj != near {
            wanted.insert(obj, near);
        }
    }

    /// Records a copy of `of` written at `offset` in the set `set` (as the copy's own
    /// extent would name it). A copy outside any set serves nothing and is not kept.
    fn register(&self, of: &ExtentRef, offset: u64, set: LocalitySet) {
        let copy = ExtentRef { offset, set, ..*of };
        let Some((set_start, _)) = copy.set_span() else {
            return;
        };
        let Ok(at) = u32::try_from(offset - set_start) else {
            return;
        };
        let place = Place {
            set_start,
            at,
            blocks: set.blocks,
        };
        let mut index = self.index.lock();
        if index.len() >= INDEX_MAX && !index.contains_key(&of.offset) {
            index.clear();
        }
        let fresh = Entry {
            checksum: of.checksum,
            places: [Place::default(); PLACES_MAX],
            len: 0,
        };
        let entry = index.entry(of.offset).or_insert(fresh);
        if entry.checksum != of.checksum {
            // Another extent at the same offset: the old one's copies are not its.
            *entry = fresh;
        }
        entry.add(place);
    }

    /// The places of `extent`'s copies, newest first.
    fn places(&self, extent: &ExtentRef) -> Vec<Place> {
        let index = self.index.lock();
        match index.get(&extent.offset) {
            Some(entry) if entry.checksum == extent.checksum => {
                entry.places().iter().rev().copied().collect()
            }
            _ => Vec::new(),
        }
    }

    /// Forgets a place whose bytes no longer verify.
    fn forget(&self, extent: &ExtentRef, place: &Place) {
        let mut index = self.index.lock();
        if let Some(entry) = index.get_mut(&extent.offset) {
            entry.remove(place);
            if entry.len == 0 {
                index.remove(&extent.offset);
            }
        }
    }
}

impl Volume {
    /// Asks the next commit to store a copy of `obj`'s data in `near`'s locality set when
    /// it writes or moves `near`'s data anyway (Hummingbird: a file in several clusters):
    /// a proxy names the page an image it served from disk was read with. Only a file
    /// whose data is one small extent, with its stored bytes still in the cache at the
    /// commit, is copied; the request lasts until the next commit.
    pub fn copy_near(&self, obj: u64, near: u64) {
        // Chains resolve as hints do: a page's images follow the page.
        let near = self.locality.lock().get(&near).copied().unwrap_or(near);
        self.copies.want(obj, near);
    }

    /// The copies this commit writes: for each request whose group's first object is in
    /// the commit's `data` (written or moved: its set is written anyway), the requested
    /// file's one extent in the committed tree, from its stored bytes in the cache (its
    /// own set, its decoded bytes, or a copy of it; never read from the device for this),
    /// while the group with its copies stays within one cluster window. Files the commit
    /// writes or places in the group anyway are not copied.
    pub(super) fn gather_copies(
        &self,
        root: &RootRef,
        mutations: &[crate::btree::commit::Mutation],
        data: &[(usize, Stored)],
    ) -> Vec<Copy> {
        let wanted = std::mem::take(&mut *self.copies.wanted.lock());
        let free = self.space.free_bytes();
        if wanted.is_empty() || free < self.space.data_bytes() / 4 {
            return Vec::new();
        }
        let hints = self.locality.lock();
        let group_of = |obj: u64| hints.get(&obj).copied().unwrap_or(obj);
        let mut fresh: HashMap<u64, u64> = HashMap::new();
        let mut written: HashSet<u64> = HashSet::new();
        for (index, stored) in data {
            let obj = mutations[*index].key().obj;
            written.insert(obj);
            *fresh.entry(group_of(obj)).or_default() += stored.allocated_bytes();
        }
        let hinted: HashMap<u64, u64> = wanted
            .keys()
            .filter_map(|obj| hints.get(obj).map(|g| (*obj, *g)))
            .collect();
        drop(hints);
        let mut room = (free / 16).min(COMMIT_BYTES_MAX);
        let mut copies = Vec::new();
        let mut requests: Vec<(u64, u64)> = wanted.into_iter().collect();
        requests.sort_unstable();
        for (obj, group) in requests {
            let Some(bytes) = fresh.get_mut(&group).filter(|_| written.contains(&group)) else {
                continue;
            };
            if written.contains(&obj) || hinted.get(&obj) == Some(&group) {
                continue;
            }
            let Ok(Some(Some((_, of)))) = self.lone_extent(root, obj) else {
                continue;
            };
            let size = of.allocated_bytes();
            if size > room || *bytes + size > CLUSTER_WINDOW_BYTES {
                continue;
            }
            // The exact stored bytes: a copy is verified against the original's checksum.
            let Some(stored) = self.cached_stored(&of).or_else(|| self.copy_stored(&of)) else {
                continue;
            };
            if crate::checksum::checksum(stored.bytes()) != of.checksum {
                continue;
            }
            room -= size;
            *bytes += size;
            copies.push(Copy { group, of, stored });
        }
        copies
    }

    /// Hands the space of the copies a commit placed (`(original, offset, bytes, set)`)
    /// back to the free map, since nothing on the device refers to them, and records where
    /// they lie once `written`.
    pub(super) fn copies_written(
        &self,
        copies: &[(ExtentRef, u64, u64, LocalitySet)],
        written: bool,
    ) {
        for (of, offset, bytes, set) in copies {
            self.space.release(*offset, *bytes);
            if !written {
                continue;
            }
            self.copies.register(of, *offset, *set);
            self.counters.copies.0.fetch_add(1, Ordering::Relaxed);
            self.counters
                .copies
                .1
                .fetch_add(of.allocated_bytes(), Ordering::Relaxed);
        }
    }

    /// `extent`'s stored bytes in a copy in a cached set, verified.
    fn copy_bytes<T>(&self, extent: &ExtentRef, take: impl Fn(&[u8]) -> Option<T>) -> Option<T> {
        for place in self.copies.places(extent) {
            let taken = self
                .cache
                .peek_set(place.set_start, place.set_bytes())
                .and_then(|set| {
                    let at = place.at as usize;
                    let stored = set.get(at..at.checked_add(extent.stored_bytes as usize)?)?;
                    take(stored)
                });
            match taken {
                Some(taken) => return Some(taken),
                // Not cached: the place may serve later. Cached but not verifying: its
                // blocks were reused before the set was read.
                None if self
                    .cache
                    .peek_set(place.set_start, place.set_bytes())
                    .is_some() =>
                {
                    self.copies.forget(extent, &place);
                }
                None => {}
            }
        }
        None
    }

    /// `extent`'s verified, decoded bytes from a copy in a cached set, if one is there.
    pub(super) fn read_copy(&self, extent: &ExtentRef) -> Option<Vec<u8>> {
        let bytes = self.copy_bytes(extent, |stored| {
            super::extent::decode_extent(extent, stored).ok()
        })?;
        self.counters.copies.2.fetch_add(1, Ordering::Relaxed);
        Some(bytes)
    }

    /// `extent`'s stored bytes from a copy in a cached set (to copy again when the set
    /// that holds it moves).
    fn copy_stored(&self, extent: &ExtentRef) -> Option<Stored> {
        self.copy_bytes(extent, |stored| {
            let value = super::extent::decode_extent(extent, stored).ok()?;
            let encoded = (extent.compression != compression::NONE)
                .then(|| (extent.compression, stored.to_vec()));
            Some(Stored {
                value: Arc::new(value),
                encoded,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(offset: u64, checksum: u64) -> ExtentRef {
        ExtentRef {
            offset,
            stored_bytes: 100,
            logical_bytes: 100,
            checksum,
            compression: crate::format::record::compression::NONE,
            set: LocalitySet::NONE,
        }
    }

    fn set(before_blocks: u32, blocks: u32) -> LocalitySet {
        LocalitySet {
            before_blocks,
            blocks,
        }
    }

    #[test]
    fn the_index_keeps_the_newest_places_of_each_extent() {
        let copies = Copies::default();
        let of = extent(1 << 20, 7);
        for k in 0..6u64 {
            copies.register(&of, (2 << 20) + k * 8192, set(0, 1));
        }
        let places = copies.places(&of);
        assert_eq!(places.len(), PLACES_MAX);
        assert_eq!(places[0].set_start, (2 << 20) + 5 * 8192, "newest first");
        assert_eq!(places[PLACES_MAX - 1].set_start, (2 << 20) + 2 * 8192);
        // The same copy registered again is not kept twice.
        copies.register(&of, (2 << 20) + 5 * 8192, set(0, 1));
        assert_eq!(copies.places(&of).len(), PLACES_MAX);
        copies.forget(&of, &places[0]);
        assert_eq!(copies.places(&of).len(), PLACES_MAX - 1);
        // Another file at the same offset (the original freed and its space reused) has
        // another checksum: none of the copies is its, and its own replace them.
        let other = extent(1 << 20, 8);
        assert!(copies.places(&other).is_empty());
        copies.register(&other, 3 << 20, set(0, 1));
        assert_eq!(copies.places(&other).len(), 1);
        assert!(copies.places(&of).is_empty());
    }

    #[test]
    fn a_copy_is_kept_only_inside_a_set() {
        let copies = Copies::default();
        let of = extent(1 << 20, 7);
        copies.register(&of, 2 << 20, LocalitySet::NONE);
        assert!(copies.places(&of).is_empty());
        // A set that does not hold the copy's bytes is no set either.
        copies.register(&of, (2 << 20) + 4000, set(0, 1));
        assert!(copies.places(&of).is_empty());
        copies.register(&of, (2 << 20) + 4100, set(1, 2));
        let places = copies.places(&of);
        assert_eq!(places.len(), 1);
        assert_eq!(
            (places[0].set_start, places[0].at, places[0].set_bytes()),
            (2 << 20, 4100, 2 * BLOCK_BYTES)
        );
    }

    #[test]
    fn requests_name_another_object() {
        let copies = Copies::default();
        copies.want(5, 5);
        copies.want(6, 5);
        assert_eq!(copies.wanted.lock().len(), 1);
    }
}
