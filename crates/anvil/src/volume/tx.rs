//! One operation's view of the volume: pending writes of this operation, then the active
//! group, then the group being committed, then the committed tree (cache only).

use super::overlay::{Overlay, Pending, Value};
use super::{payload_value, RootRef, State, Volume};
use crate::btree::{self, CacheOnly, Need, Step, Stop};
use crate::format::node::Node;
use crate::format::record::{ExtentRef, Key, LogicalKey};
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::Arc;

/// What an operation already knows of a key's live version, from a `span` (or
/// `range_versions`) of its own that covered the key. A put told so takes no walk of the
/// tree for the version it replaces; a record a pending layer holds is found there again,
/// whatever this says, so only the committed tree's answer is taken from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// Not looked for: the put walks the tree.
    Unknown,
    /// The span saw no live record at the key.
    Absent,
    /// The span gave the live record with this create_tid.
    Live(u64),
}

pub struct Tx<'a> {
    volume: &'a Volume,
    state: &'a mut State,
    pinned_nodes: &'a HashMap<u64, Arc<Node>>,
    pinned_extents: &'a HashMap<ExtentRef, Arc<Vec<u8>>>,
    writes: BTreeMap<LogicalKey, Pending>,
    /// Writes made by changing a few bytes of the value they replace (`put_spliced`): the
    /// value changed and the byte range, so the redo log can take only those bytes.
    splices: HashMap<LogicalKey, (Arc<Vec<u8>>, usize, usize)>,
    /// Live objects created minus destroyed by this operation.
    objects_delta: i64,
    /// Extents written before the commit that this operation set and then replaced.
    dead: Vec<ExtentRef>,
}

impl<'a> Tx<'a> {
    pub(super) fn new(
        volume: &'a Volume,
        state: &'a mut State,
        pinned_nodes: &'a HashMap<u64, Arc<Node>>,
        pinned_extents: &'a HashMap<ExtentRef, Arc<Vec<u8>>>,
    ) -> Tx<'a> {
        let root = &state.root;
        state.upper_nodes.get_mut().follow(root.root, root.tid);
        Tx {
            volume,
            state,
            pinned_nodes,
            pinned_extents,
            writes: BTreeMap::new(),
            splices: HashMap::new(),
            objects_delta: 0,
            dead: Vec::new(),
        }
    }

    pub(super) fn finish(self) {
        self.state.live_objects = self
            .state
            .live_objects
            .saturating_add_signed(self.objects_delta);
        self.state.active.objects_delta += self.objects_delta;
        self.state.active.dead.extend(self.dead);
        let mut splices = self.splices;
        for (lk, pending) in self.writes {
            // `remove` hashes the key even when the map is empty, as it mostly is.
            let splice = match splices.is_empty() {
                true => None,
                false => splices.remove(&lk),
            };
            match splice {
                Some((base, lo, hi)) => {
                    self.state.active.insert_spliced(lk, pending, &base, lo, hi)
                }
                None => self.state.active.insert(lk, pending),
            }
        }
    }

    fn source(&self) -> CacheOnly<'_> {
        CacheOnly {
            cache: &self.volume.cache,
            pinned: self.pinned_nodes,
            upper: &self.state.upper_nodes,
        }
    }

    /// The root the committed part of this view comes from; holding it keeps its extents.
    pub fn root(&self) -> Arc<RootRef> {
        self.state.root.clone()
    }

    pub fn volume(&self) -> &Volume {
        self.volume
    }

    /// Allocates a new object id (never reused, even if this operation is retried).
    pub fn allocate_obj(&mut self) -> u64 {
        let obj = self.state.next_obj;
        self.state.next_obj += 1;
        obj
    }

    /// The live committed version of `lk`: (create_tid, value). Looked for newest first.
    fn tree_live(&self, lk: LogicalKey) -> Step<Option<(u64, Value)>> {
        if !self.in_tree(lk.obj) {
            return Ok(None);
        }
        if let Some(found) = self.state.live_memo.borrow_mut().get(&self.state.root, &lk) {
            self.volume.count_walk(false);
            return Ok(found);
        }
        self.volume.count_walk(true);
        let mut found = None;
        btree::range_rev(
            &self.source(),
            self.state.root.root,
            &Key::new(lk, 0),
            &Key::new(lk, u64::MAX),
            &mut |e| {
                if e.delete_tid == 0 {
                    found = Some((e.key.create_tid, payload_value(&e.payload())));
                    return false;
                }
                true
            },
        )?;
        self.state.live_memo.borrow_mut().put(lk, found.clone());
        Ok(found)
    }

    /// Whether the committed tree may hold records of `obj` (an object created since its
    /// root was committed has none: `RootRef::next_obj`).
    fn in_tree(&self, obj: u64) -> bool {
        obj < self.state.root.next_obj
    }

    /// The pending change to `lk`, newest first: this operation, active group, frozen group.
    fn pending(&self, lk: &LogicalKey) -> Option<(&Pending, Option<&Overlay>)> {
        if let Some(p) = self.writes.get(lk) {
            return Some((p, None));
        }
        if let Some(p) = self.state.active.map.get(lk) {
            return Some((p, None));
        }
        let frozen = self.state.frozen.as_deref()?;
        frozen.map.get(lk).map(|p| (p, Some(frozen)))
    }

    pub fn get(&self, lk: LogicalKey) -> Step<Option<Value>> {
        if let Some((pending, _)) = self.pending(&lk) {
            return Ok(pending.value.clone());
        }
        Ok(self.tree_live(lk)?.map(|(_, value)| value))
    }

    /// Like `get`, with extents read (through a retry) into memory.
    pub fn get_bytes(&self, lk: LogicalKey) -> Step<Option<Arc<Vec<u8>>>> {
        match self.get(lk)? {
            None => Ok(None),
            Some(value) => self.resolve(&value).map(Some),
        }
    }

    pub fn resolve(&self, value: &Value) -> Step<Arc<Vec<u8>>> {
        match value {
            Value::Bytes(bytes) => Ok(bytes.clone()),
            Value::Extent(extent) => match self.pinned_extents.get(extent) {
                Some(bytes) => Ok(bytes.clone()),
                None => match self.volume.cache.extent(extent) {
                    Some(bytes) => Ok(bytes),
                    None => Err(Stop::Need(Need::Extent(*extent))),
                },
            },
        }
    }

    /// Sets (Some) or deletes (None) the record at `lk`.
    pub fn put(&mut self, lk: LogicalKey, value: Option<Arc<Vec<u8>>>) -> Step<()> {
        self.put_with(
            lk,
            value,
            false,
            crate::format::record::compression::DEFAULT,
        )
    }

    /// `put` with the object's settings: destroy the old version instead of keeping it
    /// (`nohistory`), and the codec for the value if it is stored as an extent.
    pub fn put_with(
        &mut self,
        lk: LogicalKey,
        value: Option<Arc<Vec<u8>>>,
        nohistory: bool,
        codec: u8,
    ) -> Step<()> {
        self.put_value(lk, value.map(Value::Bytes), nohistory, codec)
    }

    /// `put_with` of an extent `Volume::write_direct` wrote for this record: the commit
    /// links it into the tree as it is. The operation owns it from here on (a failed
    /// operation's caller frees it).
    pub fn put_extent(&mut self, lk: LogicalKey, extent: ExtentRef, nohistory: bool) -> Step<()> {
        self.put_value(
            lk,
            Some(Value::Extent(extent)),
            nohistory,
            extent.compression,
        )
    }

    /// Deletes `lk`, a live record that `span` (or `range_versions`) just gave with its
    /// `create_tid`: `put_with(lk, None, ..)` without a second walk of the tree for the
    /// version it replaces. (A record a pending layer gave is found there again.)
    pub fn delete_found(
        &mut self,
        lk: LogicalKey,
        create_tid: u64,
        nohistory: bool,
        codec: u8,
    ) -> Step<()> {
        self.put_found(lk, None, Found::Live(create_tid), nohistory, codec)
    }

    /// `put_with` of a key a `span` (or `range_versions`) of this operation just covered:
    /// `found` says what it saw there, so the put takes no walk of the tree for the version
    /// it replaces.
    pub fn put_found(
        &mut self,
        lk: LogicalKey,
        value: Option<Arc<Vec<u8>>>,
        found: Found,
        nohistory: bool,
        codec: u8,
    ) -> Step<()> {
        self.put_known(lk, value.map(Value::Bytes), nohistory, codec, found)
    }

    fn put_value(
        &mut self,
        lk: LogicalKey,
        value: Option<Value>,
        nohistory: bool,
        codec: u8,
    ) -> Step<()> {
        self.put_known(lk, value, nohistory, codec, Found::Unknown)
    }

    /// `put_value`, told what a span saw at `lk` (`Found::Unknown`: nothing).
    fn put_known(
        &mut self,
        lk: LogicalKey,
        value: Option<Value>,
        nohistory: bool,
        codec: u8,
        found: Found,
    ) -> Step<()> {
        let (replaces, existed) = match self.pending(&lk) {
            Some((pending, None)) => (pending.replaces, pending.value.is_some()),
            Some((pending, Some(frozen))) => {
                if pending.value.is_some() {
                    (frozen.tid, true)
                } else {
                    (0, false)
                }
            }
            None => match found {
                Found::Live(create_tid) => (create_tid, true),
                Found::Absent => (0, false),
                Found::Unknown => match self.tree_live(lk)? {
                    Some((create_tid, _)) => (create_tid, true),
                    None => (0, false),
                },
            },
        };
        if lk.obj >= self.state.next_obj {
            // A record of an object this volume did not number (the volume's own API takes
            // any object id): numbers stay above every object in the tree, which
            // `RootRef::next_obj` relies on.
            self.state.next_obj = lk.obj.saturating_add(1);
        }
        if lk.rtype == crate::format::record::rtype::INODE {
            self.objects_delta += value.is_some() as i64 - existed as i64;
        }
        if value.is_none() && replaces == 0 {
            // Deleting something that never reached the tree: forget it entirely, unless the
            // active group holds it (then record the deletion over it).
            if !self.state.active.map.contains_key(&lk) && !self.writes.contains_key(&lk) {
                return Ok(());
            }
        }
        let nohistory = nohistory || self.volume.options.nohistory;
        // A map's `get` skips hashing when it is empty, `remove` does not; most operations
        // splice nothing.
        if !self.splices.is_empty() {
            self.splices.remove(&lk);
        }
        let old = self.writes.insert(
            lk,
            Pending {
                value,
                replaces,
                nohistory,
                codec,
                rewrites: 0,
            },
        );
        if let Some(Pending {
            value: Some(Value::Extent(extent)),
            ..
        }) = old
        {
            self.dead.push(extent);
        }
        Ok(())
    }

    /// `put_with` of a value made from `base` (the value `get_bytes` returned for `lk`) by
    /// writing bytes `lo..hi` and perhaps changing its length; bytes past `base`'s end
    /// outside `lo..hi` must be zeros. Same effect as `put_with`; the redo log may record
    /// only the changed bytes.
    pub fn put_spliced(
        &mut self,
        lk: LogicalKey,
        value: Arc<Vec<u8>>,
        policy: (bool, u8),
        base: &Arc<Vec<u8>>,
        lo: usize,
        hi: usize,
    ) -> Step<()> {
        let first_write = !self.writes.contains_key(&lk);
        self.put_with(lk, Some(value), policy.0, policy.1)?;
        if first_write {
            self.splices.insert(lk, (base.clone(), lo, hi));
        }
        Ok(())
    }

    /// Live records of (obj, rtype) with `lo <= key <= hi`, in key order, at most `limit`.
    pub fn range(
        &self,
        obj: u64,
        rtype: u8,
        lo: u64,
        hi: u64,
        limit: usize,
    ) -> Step<Vec<(u64, Value)>> {
        Ok(self
            .range_versions(obj, rtype, lo, hi, limit)?
            .into_iter()
            .map(|(k, v, _)| (k, v))
            .collect())
    }

    /// Whether `lk` has a change pending in the active group (or this operation), that is, a
    /// change that will commit with this operation's TID.
    pub fn is_pending_active(&self, lk: &LogicalKey) -> bool {
        self.writes.contains_key(lk) || self.state.active.map.contains_key(lk)
    }

    /// Whether a write of `lk`'s whole value should go to memory rather than be written
    /// ahead of the commit (`Volume::write_direct`): when the active group holds it in
    /// memory already, or wrote it ahead and rewrote it since. A value rewritten over and
    /// over within one commit interval (a record rewritten in place) is kept in memory,
    /// and the commit writes its last version only; a file rewritten once is written ahead
    /// both times.
    pub fn keeps_in_memory(&self, lk: &LogicalKey) -> bool {
        let pending = self
            .writes
            .get(lk)
            .or_else(|| self.state.active.map.get(lk));
        match pending {
            None => false,
            Some(p) => match &p.value {
                None => false,
                Some(Value::Extent(_)) => p.rewrites > 0,
                Some(Value::Bytes(_)) => true,
            },
        }
    }

    /// Like `range`, also giving each record's create_tid; a pending record gives the TID
    /// its group will commit as, so create_tids order every version visible here.
    pub fn range_versions(
        &self,
        obj: u64,
        rtype: u8,
        lo: u64,
        hi: u64,
        limit: usize,
    ) -> Step<Vec<(u64, Value, u64)>> {
        let at = |key| LogicalKey { obj, rtype, key };
        Ok(self
            .span(at(lo), at(hi), limit)?
            .into_iter()
            .map(|(lk, value, tid)| (lk.key, value, tid))
            .collect())
    }

    /// Live records with `lo <= logical key <= hi` (of any record types between), in key
    /// order, at most `limit`, each with its create_tid as `range_versions` gives it: one
    /// walk of the tree where a record type at a time would take one each.
    pub fn span(
        &self,
        lo: LogicalKey,
        hi: LogicalKey,
        limit: usize,
    ) -> Step<Vec<(LogicalKey, Value, u64)>> {
        let mut out = Vec::new();
        let mut cursor = lo;
        loop {
            // A batch of live tree records from `cursor`.
            let mut batch: Vec<(LogicalKey, Value, u64)> = Vec::new();
            if self.in_tree(cursor.obj) {
                self.volume.count_walk(true);
                btree::range(
                    &self.source(),
                    self.state.root.root,
                    &Key::new(cursor, 0),
                    &Key::new(hi, u64::MAX),
                    &mut |e| {
                        if e.delete_tid == 0 {
                            batch.push((
                                e.key.logical(),
                                payload_value(&e.payload()),
                                e.key.create_tid,
                            ));
                        }
                        batch.len() < limit
                    },
                )?;
            }
            let batch_end = if batch.len() < limit {
                hi
            } else {
                batch.last().map_or(hi, |b| b.0)
            };
            // Pending changes in [cursor, batch_end], newest layer winning.
            let mut layered: Vec<(LogicalKey, u8, &Pending, u64)> = Vec::new();
            let active_tid = self.state.active.tid;
            if let Some(frozen) = self.state.frozen.as_deref() {
                let tid = frozen.tid;
                frozen
                    .map
                    .each_in(cursor, batch_end, |lk, p| layered.push((lk, 0, p, tid)));
            }
            let active = &self.state.active.map;
            active.each_in(cursor, batch_end, |lk, p| {
                layered.push((lk, 1, p, active_tid))
            });
            let changes = self
                .writes
                .range((Bound::Included(cursor), Bound::Included(batch_end)));
            layered.extend(changes.map(|(lk, p)| (*lk, 2, p, active_tid)));
            // Each key once, from its newest layer: keys ascending, newest layer first.
            layered.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            layered.dedup_by_key(|change| change.0);
            let layered = layered
                .into_iter()
                .map(|(lk, _, pending, tid)| (lk, (pending.value.clone(), tid)));
            let mut tree = batch.into_iter().peekable();
            let mut pend = layered.into_iter().peekable();
            loop {
                let next_tree = tree.peek().map(|t| t.0);
                let next_pend = pend.peek().map(|p| p.0);
                let item = match (next_tree, next_pend) {
                    (None, None) => break,
                    (Some(t), Some(p)) if p <= t => {
                        if p == t {
                            tree.next();
                        }
                        pend.next()
                            .and_then(|(lk, (value, tid))| value.map(|v| (lk, v, tid)))
                    }
                    (Some(_), _) => tree.next(),
                    (None, Some(_)) => pend
                        .next()
                        .and_then(|(lk, (value, tid))| value.map(|v| (lk, v, tid))),
                };
                if let Some(item) = item {
                    out.push(item);
                    if out.len() >= limit {
                        return Ok(out);
                    }
                }
            }
            if batch_end >= hi {
                return Ok(out);
            }
            // The key after `batch_end` (below `hi`, so it exists).
            cursor = match batch_end.key.checked_add(1) {
                Some(key) => LogicalKey { key, ..batch_end },
                None => match batch_end.rtype.checked_add(1) {
                    Some(rtype) => LogicalKey {
                        rtype,
                        key: 0,
                        ..batch_end
                    },
                    None => LogicalKey {
                        obj: batch_end.obj + 1,
                        rtype: 0,
                        key: 0,
                    },
                },
            };
        }
    }
}
