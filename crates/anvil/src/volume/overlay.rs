//! Pending changes of one flush group, kept in memory until commit.

use crate::format::record::{ExtentRef, Key, LogicalKey};
use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};
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
    pub map: BTreeMap<LogicalKey, Pending>,
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

    fn replace(&mut self, lk: LogicalKey, mut pending: Pending) {
        self.pending_bytes += pending.value.as_ref().map_or(0, Value::memory_bytes) + 64;
        if let Some(Value::Extent(extent)) = &pending.value {
            self.direct_bytes += extent.allocated_bytes();
        }
        let old = match self.map.entry(lk) {
            Entry::Vacant(slot) => {
                slot.insert(pending);
                return;
            }
            Entry::Occupied(mut slot) => {
                pending.rewrites = slot.get().rewrites.saturating_add(1);
                slot.insert(pending)
            }
        };
        self.pending_bytes -= old.value.as_ref().map_or(0, Value::memory_bytes) + 64;
        if let Some(Value::Extent(extent)) = old.value {
            self.direct_bytes -= extent.allocated_bytes();
            self.dead.push(extent);
        }
    }
}
