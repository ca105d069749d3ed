//! Pending changes of one flush group, kept in memory until commit.

use crate::format::record::{ExtentRef, Key, LogicalKey};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::Arc;

/// A record's current content: bytes in memory, or an extent on the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Bytes(Arc<Vec<u8>>),
    Extent(ExtentRef),
}

impl Value {
    /// Bytes of memory the value holds (an extent holds none: it is on the device).
    pub fn memory_bytes(&self) -> u64 {
        match self {
            Value::Bytes(bytes) => bytes.len() as u64,
            Value::Extent(_) => 0,
        }
    }
}

/// One pending change to a logical key.
#[derive(Clone, Debug)]
pub struct Pending {
    /// New content; None deletes the record. An extent here was written before its commit
    /// (`Volume::write_direct`): the commit only links it into the tree.
    pub value: Option<Value>,
    /// create_tid of the committed version this change replaces; 0 when none.
    pub replaces: u64,
    /// Destroy the replaced version instead of keeping it as history.
    pub nohistory: bool,
    /// Codec for the value if it becomes an extent (`format::record::compression`).
    pub codec: u8,
    /// How many earlier values of this group it replaced (set by the overlay).
    pub rewrites: u32,
}

/// What of a pending value changed since the redo log last took it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dirty {
    /// The value (or its deletion) must be logged whole.
    Whole,
    /// The value was logged whole in this group and only bytes `lo..hi` changed since
    /// (besides its length: bytes past the old end are zeros unless in the range).
    Bytes { lo: usize, hi: usize },
}

#[derive(Default)]
pub struct Overlay {
    /// The TID this group commits as.
    pub tid: u64,
    pub map: PendingMap,
    /// Keys changed since the last redo-log batch, and how.
    pub log_dirty: BTreeMap<LogicalKey, Dirty>,
    /// Bytes of pending values (memory held, and an upper bound of space needed).
    pub pending_bytes: u64,
    /// Exact elements (history, or expired volume records) that prune removes at commit.
    pub prune: BTreeSet<Key>,
    /// Live inodes this group adds (negative: removes), for the count a commit records.
    pub objects_delta: i64,
    /// Extents written before the commit whose values this group replaced or deleted
    /// before the commit: never in the tree, freed by the commit.
    pub dead: Vec<ExtentRef>,
    /// Bytes of extents written before the commit that this group holds (host page cache
    /// the commit lets go of).
    pub direct_bytes: u64,
}

impl Overlay {
    pub fn new(tid: u64) -> Overlay {
        Overlay {
            tid,
            ..Overlay::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.prune.is_empty()
    }

    pub fn insert(&mut self, lk: LogicalKey, pending: Pending) {
        self.replace(lk, pending);
        self.log_dirty.insert(lk, Dirty::Whole);
    }

    /// `insert` of a value made from `base` by changing bytes `lo..hi` (and its length):
    /// when `base` is this group's pending value for `lk`, the log needs only those bytes.
    pub fn insert_spliced(
        &mut self,
        lk: LogicalKey,
        pending: Pending,
        base: &Arc<Vec<u8>>,
        lo: usize,
        hi: usize,
    ) {
        let spliceable = matches!(pending.value, Some(Value::Bytes(_)))
            && self
                .map
                .get(&lk)
                .is_some_and(|p| matches!(&p.value, Some(Value::Bytes(v)) if Arc::ptr_eq(v, base)));
        self.replace(lk, pending);
        if !spliceable {
            self.log_dirty.insert(lk, Dirty::Whole);
            return;
        }
        match self.log_dirty.entry(lk) {
            Entry::Vacant(slot) => {
                slot.insert(Dirty::Bytes { lo, hi });
            }
            Entry::Occupied(mut slot) => {
                if let Dirty::Bytes { lo: a, hi: b } = *slot.get() {
                    slot.insert(Dirty::Bytes {
                        lo: a.min(lo),
                        hi: b.max(hi),
                    });
                }
            }
        }
    }

    fn replace(&mut self, lk: LogicalKey, pending: Pending) {
        self.pending_bytes += pending.value.as_ref().map_or(0, Value::memory_bytes) + 64;
        if let Some(Value::Extent(extent)) = &pending.value {
            self.direct_bytes += extent.allocated_bytes();
        }
        let Some(old) = self.map.insert(lk, pending) else {
            return;
        };
        if let Some(new) = self.map.get_mut(&lk) {
            new.rewrites = old.rewrites.saturating_add(1);
        }
        self.pending_bytes -= old.value.as_ref().map_or(0, Value::memory_bytes) + 64;
        if let Some(Value::Extent(extent)) = old.value {
            self.direct_bytes -= extent.allocated_bytes();
            self.dead.push(extent);
        }
    }
}

/// A record's place among its object's records: (rtype, key).
type Slot = (u8, u64);

fn slot(lk: &LogicalKey) -> Slot {
    (lk.rtype, lk.key)
}

/// One object's pending records, in key order: a short sorted vector for the few records
/// most objects change in a group (an inode, a name, a small file's data), a B-tree once
/// there are many (a directory filling up, a large file written).
enum Records {
    Few(Vec<(Slot, Pending)>),
    Many(BTreeMap<Slot, Pending>),
}

impl Records {
    /// Records beyond this many move from the vector to a B-tree (a vector's insert moves
    /// the records after it, which stays cheap only while they are few).
    const FEW_MAX: usize = 32;

    fn get(&self, at: &Slot) -> Option<&Pending> {
        match self {
            Records::Few(few) => few
                .binary_search_by(|(s, _)| s.cmp(at))
                .ok()
                .map(|i| &few[i].1),
            Records::Many(many) => many.get(at),
        }
    }

    fn get_mut(&mut self, at: &Slot) -> Option<&mut Pending> {
        match self {
            Records::Few(few) => match few.binary_search_by(|(s, _)| s.cmp(at)) {
                Ok(i) => Some(&mut few[i].1),
                Err(_) => None,
            },
            Records::Many(many) => many.get_mut(at),
        }
    }

    fn insert(&mut self, at: Slot, pending: Pending) -> Option<Pending> {
        match self {
            Records::Few(few) => match few.binary_search_by(|(s, _)| s.cmp(&at)) {
                Ok(i) => Some(std::mem::replace(&mut few[i].1, pending)),
                Err(i) if few.len() < Self::FEW_MAX => {
                    few.insert(i, (at, pending));
                    None
                }
                Err(_) => {
                    let mut many: BTreeMap<Slot, Pending> =
                        std::mem::take(few).into_iter().collect();
                    many.insert(at, pending);
                    *self = Records::Many(many);
                    None
                }
            },
            Records::Many(many) => many.insert(at, pending),
        }
    }

    /// Calls `f` with the records in `within`, in key order.
    fn each_in<'a>(&'a self, within: RangeInclusive<Slot>, f: &mut impl FnMut(Slot, &'a Pending)) {
        match self {
            Records::Few(few) => {
                let start = few.partition_point(|(s, _)| s < within.start());
                for (at, pending) in &few[start..] {
                    if at > within.end() {
                        break;
                    }
                    f(*at, pending);
                }
            }
            Records::Many(many) => {
                for (at, pending) in many.range(within) {
                    f(*at, pending);
                }
            }
        }
    }
}

/// A group's pending changes by logical key. Operations ask it mostly for single keys (is
/// this record changed in the group?), and a B-tree of every change answered that with a
/// search through thousands of keys; here it is a hash of the object and a search among
/// that object's few records. Ranges (a directory's names in one hash-slot range, a file's
/// data) stay inside one object, and the commit, which wants every change in key order,
/// sorts the objects once.
#[derive(Default)]
pub struct PendingMap {
    objects: foldhash::HashMap<u64, Records>,
    len: usize,
}

impl PendingMap {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, lk: &LogicalKey) -> Option<&Pending> {
        self.objects.get(&lk.obj)?.get(&slot(lk))
    }

    pub fn get_mut(&mut self, lk: &LogicalKey) -> Option<&mut Pending> {
        self.objects.get_mut(&lk.obj)?.get_mut(&slot(lk))
    }

    pub fn contains_key(&self, lk: &LogicalKey) -> bool {
        self.get(lk).is_some()
    }

    /// Sets `lk`'s change, giving back the one it replaces.
    pub fn insert(&mut self, lk: LogicalKey, pending: Pending) -> Option<Pending> {
        let old = self
            .objects
            .entry(lk.obj)
            .or_insert_with(|| Records::Few(Vec::new()))
            .insert(slot(&lk), pending);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// The objects with changes in `lo..=hi`, in order.
    fn objects_in(&self, lo: u64, hi: u64) -> Vec<u64> {
        let mut objs: Vec<u64> = match hi - lo < 64 {
            // A few ids: ask for each.
            true => (lo..=hi).filter(|o| self.objects.contains_key(o)).collect(),
            false => {
                let ids = self.objects.keys().copied();
                ids.filter(|o| (lo..=hi).contains(o)).collect()
            }
        };
        objs.sort_unstable();
        objs
    }

    /// Calls `f` with every change with `lo <= key <= hi`, in key order. (A callback, not
    /// an iterator: the nested iterators a range over objects and records makes were
    /// copied about at every step, a twentieth of a proxy replay's time.)
    pub fn each_in<'a>(
        &'a self,
        lo: LogicalKey,
        hi: LogicalKey,
        mut f: impl FnMut(LogicalKey, &'a Pending),
    ) {
        if lo > hi {
            return;
        }
        let mut in_object = |obj: u64, within: RangeInclusive<Slot>| {
            if let Some(records) = self.objects.get(&obj) {
                records.each_in(within, &mut |(rtype, key), pending| {
                    f(LogicalKey { obj, rtype, key }, pending)
                });
            }
        };
        if lo.obj == hi.obj {
            // What every caller asks: one object's records, with no list of objects.
            return in_object(lo.obj, slot(&lo)..=slot(&hi));
        }
        for obj in self.objects_in(lo.obj, hi.obj) {
            let first = if obj == lo.obj { slot(&lo) } else { (0, 0) };
            let last = if obj == hi.obj {
                slot(&hi)
            } else {
                (u8::MAX, u64::MAX)
            };
            in_object(obj, first..=last);
        }
    }

    /// Every change, in key order.
    pub fn sorted(&self) -> Vec<(LogicalKey, &Pending)> {
        let mut all = Vec::with_capacity(self.len);
        let first = LogicalKey {
            obj: 0,
            rtype: 0,
            key: 0,
        };
        let last = LogicalKey {
            obj: u64::MAX,
            rtype: u8::MAX,
            key: u64::MAX,
        };
        self.each_in(first, last, |lk, pending| all.push((lk, pending)));
        all
    }

    /// Every changed key, in no particular order.
    pub fn keys(&self) -> Vec<LogicalKey> {
        let mut keys = Vec::with_capacity(self.len);
        for (&obj, records) in &self.objects {
            let all = (0, 0)..=(u8::MAX, u64::MAX);
            records.each_in(all, &mut |(rtype, key), _| {
                keys.push(LogicalKey { obj, rtype, key })
            });
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_xoshiro::Xoshiro256PlusPlus;

    fn change(n: u64) -> Pending {
        Pending {
            value: Some(Value::Bytes(Arc::new(n.to_le_bytes().to_vec()))),
            replaces: n,
            nohistory: false,
            codec: 0,
            rewrites: 0,
        }
    }

    fn lk(obj: u64, rtype: u8, key: u64) -> LogicalKey {
        LogicalKey { obj, rtype, key }
    }

    /// The pending map answers every question as a B-tree of all changes does, across the
    /// move of a busy object's records from the vector to a B-tree.
    #[test]
    fn pending_map_agrees_with_a_btree() {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
        let mut map = PendingMap::default();
        let mut model: BTreeMap<LogicalKey, u64> = BTreeMap::new();
        let random_key = |rng: &mut Xoshiro256PlusPlus| {
            // Object 3 gets far more records than the vector holds; keys cluster so
            // that inserts land before, between and after existing ones.
            let obj = if rng.gen_bool(0.3) {
                3
            } else {
                rng.gen_range(0..40)
            };
            lk(obj, rng.gen_range(0..4), rng.gen_range(0..200))
        };
        for step in 0..20_000u64 {
            let key = random_key(&mut rng);
            match rng.gen_range(0..4) {
                0 | 1 => {
                    let old = map.insert(key, change(step)).map(|p| p.replaces);
                    assert_eq!(old, model.insert(key, step), "insert {key:?}");
                }
                2 => {
                    let got = map.get(&key).map(|p| p.replaces);
                    assert_eq!(got, model.get(&key).copied(), "get {key:?}");
                    assert_eq!(map.contains_key(&key), model.contains_key(&key));
                }
                _ => {
                    let other = random_key(&mut rng);
                    let (lo, hi) = (key.min(other), key.max(other));
                    let mut got: Vec<(LogicalKey, u64)> = Vec::new();
                    map.each_in(lo, hi, |k, p| got.push((k, p.replaces)));
                    let want: Vec<(LogicalKey, u64)> =
                        model.range(lo..=hi).map(|(k, v)| (*k, *v)).collect();
                    assert_eq!(got, want, "range {lo:?}..={hi:?}");
                }
            }
            assert_eq!(map.len(), model.len());
        }
        let all: Vec<(LogicalKey, u64)> =
            map.sorted().iter().map(|(k, p)| (*k, p.replaces)).collect();
        let want: Vec<(LogicalKey, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(all, want);
        let mut keys = map.keys();
        keys.sort();
        assert!(keys.iter().eq(model.keys()));
        assert!(matches!(map.objects.get(&3), Some(Records::Many(_))));
    }

    /// A change that replaces one of the group's counts the rewrite, and an extent written
    /// ahead that it replaces is freed by the commit.
    #[test]
    fn a_replaced_change_counts_its_rewrites_and_frees_its_extent() {
        let mut overlay = Overlay::new(5);
        let key = lk(9, 1, 0);
        let extent = ExtentRef {
            offset: 4096,
            stored_bytes: 100,
            logical_bytes: 100,
            checksum: 1,
            compression: 0,
            set: crate::format::record::LocalitySet::NONE,
        };
        let mut ahead = change(0);
        ahead.value = Some(Value::Extent(extent));
        overlay.insert(key, ahead);
        assert_eq!(overlay.direct_bytes, extent.allocated_bytes());
        overlay.insert(key, change(1));
        overlay.insert(key, change(2));
        assert_eq!(overlay.map.get(&key).map(|p| p.rewrites), Some(2));
        assert_eq!(overlay.dead, vec![extent]);
        assert_eq!(overlay.direct_bytes, 0);
        assert_eq!(overlay.pending_bytes, 8 + 64);
    }
}
