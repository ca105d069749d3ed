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

/// One pending change to a logical key.
#[derive(Clone, Debug)]
pub struct Pending {
    /// New content; None deletes the record.
    pub value: Option<Arc<Vec<u8>>>,
    /// create_tid of the committed version this change replaces; 0 when none.
    pub replaces: u64,
    /// Destroy the replaced version instead of keeping it as history.
    pub nohistory: bool,
    /// Codec for the value if it becomes an extent (`format::record::compression`).
    pub codec: u8,
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
        let spliceable = pending.value.is_some()
            && self
                .map
                .get(&lk)
                .and_then(|p| p.value.as_ref())
                .is_some_and(|v| Arc::ptr_eq(v, base));
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
        let new_bytes = pending.value.as_ref().map_or(0, |v| v.len() as u64) + 64;
        if let Some(old) = self.map.insert(lk, pending) {
            self.pending_bytes -= old.value.as_ref().map_or(0, |v| v.len() as u64) + 64;
        }
        self.pending_bytes += new_bytes;
    }
}
