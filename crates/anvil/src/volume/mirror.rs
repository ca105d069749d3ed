//! Mirroring, the volume's side: reading the tree's changes over a TID range into a stream
//! (`format::stream`), and applying such a stream to a slave in one commit.
//!
//! Reading: `btree::changes_since` reports subtrees no commit after `since` rewrote as
//! skipped key ranges, and every element of a rewritten leaf as an item: inserted (created
//! in the range, with its extent's stored bytes), deleted (created before, deleted in the
//! range), or kept (unchanged). Applying: the slave leaves skipped ranges alone; elsewhere
//! it inserts, marks deleted, and, when the stream was read at the master's newest commit
//! (`exact`), ends its live elements the master no longer has (history off or prune
//! destroyed them there). A slave destroys nothing itself: what it holds as history stays
//! until its own prune, so a slave can keep history its master pruned.
//!
//! A slave's elements carry the master's TIDs, and the slave's committed TID becomes the
//! stream's `until`: every as-of view of the range reads the same on both. Its mirror
//! state (master, last TID held) is a CONFIG record no stream carries.

use super::{max_key, State, Volume, Written};
use crate::btree::commit::{apply, CommitContext, Mutation};
use crate::btree::{self, Change, Root};
use crate::error::{Error, Result};
use crate::format::record::{
    compression, inode_flags, rtype, Element, ExtentRef, Inode, Key, LocalitySet, LogicalKey,
    Payload, DATA_CHUNK_BYTES, ROOT_OBJ, VOLUME_OBJ,
};
use crate::format::stream::{Item, StreamHeader, StreamReader, StreamWriter};
use crate::format::superblock::Superblock;
use crate::format::{VolumeId, BLOCK_LEN};
use crate::space::Purpose;
use std::collections::BTreeMap;
use std::collections::HashSet;
use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// CONFIG record key of a slave's mirror state (keys 1-3: retention policy, reblock
/// cursor, cleanup schedule).
pub const MIRROR_STATE_KEY: u64 = 4;
/// CONFIG record key of the TID the last prune that removed history ran at: history
/// before it may have gaps a mirror stream has to report.
pub const PRUNED_KEY: u64 = 5;
const MIRROR_STATE_BYTES: usize = 16 + 3 * 8;
/// Extents written to the device in one request while a stream is applied, at most.
const WRITE_RUN_BYTES_MAX: usize = 4 << 20;

/// CONFIG record key of what a promoted slave was a slave of, and up to which TID (the
/// common TID from which its old master can be attached as its slave).
pub const PROMOTED_KEY: u64 = 6;

/// Records about this volume's own mirror role, which no stream carries or touches.
fn is_state_key(key: &Key) -> bool {
    key.obj == VOLUME_OBJ
        && key.rtype == rtype::CONFIG
        && matches!(key.key, MIRROR_STATE_KEY | PROMOTED_KEY)
}

fn config_lk(key: u64) -> LogicalKey {
    LogicalKey {
        obj: VOLUME_OBJ,
        rtype: rtype::CONFIG,
        key,
    }
}

fn state_lk() -> LogicalKey {
    config_lk(MIRROR_STATE_KEY)
}

/// What a slave records about its master.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorState {
    pub master: VolumeId,
    /// The newest master TID the slave holds (streams continue from here).
    pub last_tid: u64,
    /// The master's commit time of `last_tid` (unix ns).
    pub last_commit_ns: u64,
    /// When the slave applied it (unix ns).
    pub applied_ns: u64,
}

impl MirrorState {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MIRROR_STATE_BYTES);
        out.extend_from_slice(&self.master);
        out.extend_from_slice(&self.last_tid.to_le_bytes());
        out.extend_from_slice(&self.last_commit_ns.to_le_bytes());
        out.extend_from_slice(&self.applied_ns.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<MirrorState> {
        if bytes.len() != MIRROR_STATE_BYTES {
            return Err(Error::corrupt(
                "mirror state record of the wrong size",
                "volume config",
            ));
        }
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let mut master = [0u8; 16];
        master.copy_from_slice(&bytes[..16]);
        Ok(MirrorState {
            master,
            last_tid: u64_at(16),
            last_commit_ns: u64_at(24),
            applied_ns: u64_at(32),
        })
    }
}

/// What reading or applying a stream did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MirrorReport {
    pub since: u64,
    pub until: u64,
    /// Items carried (elements inserted, deleted, kept, ranges skipped).
    pub items: u64,
    pub inserted: u64,
    pub deleted: u64,
    /// Live elements the slave ended because the master no longer has them (or, on a new
    /// slave, its own records it dropped).
    pub ended: u64,
    /// Stored bytes of the extents carried.
    pub extent_bytes: u64,
    /// Bytes of the stream.
    pub stream_bytes: u64,
    /// If the master pruned history of the range before it was read: the newest TID whose
    /// history may be incomplete (0: none).
    pub pruned_through: u64,
    /// The slave already held the range: nothing was applied.
    pub already_held: bool,
}

/// What the slave knows of one key while a stream is applied.
enum Mention {
    Keep,
    Insert(Element),
    Delete(u64),
}

impl Volume {
    /// Whether this volume is a mirror slave (changed only by `mirror_write`).
    pub fn is_slave(&self) -> bool {
        self.slave.load(Ordering::Acquire)
    }

    /// Reads the mirror state record and takes the volume's role from it (at open).
    pub(crate) fn load_mirror_state(&self) -> Result<Option<MirrorState>> {
        let state = self.mirror_state()?;
        self.slave.store(state.is_some(), Ordering::Release);
        Ok(state)
    }

    /// The mirror state, if this volume is a slave.
    pub fn mirror_state(&self) -> Result<Option<MirrorState>> {
        let bytes = self.run(false, |tx| tx.get_bytes(state_lk()))?;
        bytes.map(|b| MirrorState::decode(&b)).transpose()
    }

    /// If this volume was a slave and was promoted: its master then and the last TID it
    /// held (`last_tid`), from which that master can be attached as a slave of this one.
    pub fn promoted_from(&self) -> Result<Option<MirrorState>> {
        let bytes = self.run(false, |tx| tx.get_bytes(config_lk(PROMOTED_KEY)))?;
        bytes.map(|b| MirrorState::decode(&b)).transpose()
    }

    /// Writes the changes committed after `since` up to `until` (default: the newest
    /// commit) as a stream to `out`.
    pub fn mirror_read(
        &self,
        since: u64,
        until: Option<u64>,
        out: &mut dyn Write,
    ) -> Result<MirrorReport> {
        let root = self.root();
        let head = root.tid;
        let until = until.unwrap_or(head);
        if until > head {
            return Err(Error::Invalid(format!(
                "TID {until} is not committed yet (the newest is {head})"
            )));
        }
        if until < since {
            return Err(Error::Invalid(format!(
                "the range ends (TID {until}) before it starts (TID {since})"
            )));
        }
        let (next_obj, live_objects, head_time) = {
            let st = self.state.lock();
            (
                st.superblock.next_obj,
                st.superblock.live_objects,
                st.superblock.commit_time_ns,
            )
        };
        let commit_time_ns = match until == head {
            true => head_time,
            false => self.commit_time(until)?.unwrap_or(0),
        };
        let header = StreamHeader {
            master: self.volume_id,
            since,
            until,
            exact: until == head,
            next_obj,
            live_objects,
            commit_time_ns,
        };
        let mut report = MirrorReport {
            since,
            until,
            ..MirrorReport::default()
        };
        let mut writer = StreamWriter::new(out, &header)?;
        let loader = self.loader();
        btree::changes_since(&loader, root.root, since, &mut |change| {
            let item = match change {
                Change::Unchanged { lo, hi } => Item::Skip { lo, hi },
                Change::Element(e) if is_state_key(&e.key) || e.key.create_tid > until => {
                    return Ok(())
                }
                Change::Element(e) if e.key.create_tid > since => {
                    report.inserted += 1;
                    let delete_tid = match e.delete_tid <= until {
                        true => e.delete_tid,
                        false => 0,
                    };
                    match &e.payload {
                        Payload::Inline(_) => Item::Insert(Element {
                            delete_tid,
                            ..e.clone()
                        }),
                        Payload::Extent(extent) => {
                            let stored = self.read_stored(extent)?;
                            report.extent_bytes += stored.len() as u64;
                            Item::InsertExtent {
                                key: e.key,
                                delete_tid,
                                compression: extent.compression,
                                logical_bytes: extent.logical_bytes,
                                checksum: extent.checksum,
                                stored,
                            }
                        }
                    }
                }
                Change::Element(e) if e.delete_tid > since && e.delete_tid <= until => {
                    report.deleted += 1;
                    Item::Delete {
                        key: e.key,
                        delete_tid: e.delete_tid,
                    }
                }
                // Unchanged history says nothing a slave needs: it keeps what it holds
                // as history whether or not a stream names it.
                Change::Element(e) if e.delete_tid != 0 && e.delete_tid <= since => return Ok(()),
                Change::Element(e) => Item::Keep(e.key),
            };
            report.items += 1;
            writer.push(&item)
        })?;
        let pruned_at = self.config_u64(PRUNED_KEY)?.unwrap_or(0);
        if pruned_at > since {
            report.pruned_through = pruned_at.min(until);
        }
        let (_, bytes) = writer.finish(report.pruned_through)?;
        report.stream_bytes = bytes;
        Ok(report)
    }

    /// An extent's bytes as stored (still compressed), checked against its checksum.
    fn read_stored(&self, extent: &ExtentRef) -> Result<Vec<u8>> {
        let mut stored = vec![0u8; extent.stored_bytes as usize];
        if !self.extent_in_bounds(extent) {
            return Err(Error::corrupt(
                "extent outside the volume",
                super::extent_location(extent),
            ));
        }
        self.device.read_at(&mut stored, extent.offset)?;
        if crate::checksum::checksum(&stored) != extent.checksum {
            return Err(Error::corrupt(
                "extent checksum mismatch",
                super::extent_location(extent),
            ));
        }
        Ok(stored)
    }

    /// A volume CONFIG record holding one number, if set.
    pub(crate) fn config_u64(&self, key: u64) -> Result<Option<u64>> {
        let lk = LogicalKey {
            obj: VOLUME_OBJ,
            rtype: rtype::CONFIG,
            key,
        };
        let bytes = self.run(false, |tx| tx.get_bytes(lk))?;
        Ok(bytes.and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?))))
    }

    /// Commit time of `tid` from its COMMIT record, if kept.
    fn commit_time(&self, tid: u64) -> Result<Option<u64>> {
        let lk = LogicalKey {
            obj: VOLUME_OBJ,
            rtype: rtype::COMMIT,
            key: tid,
        };
        let bytes = self.run(false, |tx| tx.get_bytes(lk))?;
        Ok(bytes.and_then(|b| Some(u64::from_le_bytes(b.get(..8)?.try_into().ok()?))))
    }

    /// Applies a stream read from `input` in one commit: afterwards the slave holds the
    /// master's tree as of the stream's `until`, or, on any failure (a damaged, truncated,
    /// foreign or out-of-turn stream, no space, an I/O error), exactly what it held before.
    pub fn mirror_write(&self, input: &mut dyn Read) -> Result<MirrorReport> {
        if self.is_read_only() {
            return Err(self.read_only_error());
        }
        let (mut reader, header) = StreamReader::open(input)?;
        let state = self.mirror_state()?;
        let mut report = MirrorReport {
            since: header.since,
            until: header.until,
            ..MirrorReport::default()
        };
        match &state {
            None => {
                if header.since != 0 {
                    return Err(Error::Stream(format!(
                        "this volume is not a slave yet: it needs a full stream \
                         (--since 0), and this one starts after TID {}",
                        header.since
                    )));
                }
                self.check_empty()?;
            }
            Some(state) => {
                if state.master != header.master {
                    return Err(Error::Stream(format!(
                        "the stream comes from volume {}, and this slave mirrors {}",
                        hex(&header.master),
                        hex(&state.master)
                    )));
                }
                if header.until <= state.last_tid && header.since <= state.last_tid {
                    report.already_held = true;
                    return Ok(report);
                }
                if header.since != state.last_tid {
                    return Err(Error::Stream(format!(
                        "the stream holds changes after TID {}, and this slave holds up \
                         to TID {}: read it with --since {}",
                        header.since, state.last_tid, state.last_tid
                    )));
                }
            }
        }
        let mut written = ExtentWriter::new(self);
        let plan = match self.read_plan(&header, &mut reader, &mut written, &mut report) {
            Ok(plan) => plan,
            Err(e) => {
                written.release();
                return Err(e);
            }
        };
        report.stream_bytes = reader.bytes_in;
        if let Err(e) = written.finish() {
            written.release();
            return Err(e);
        }
        let new_state = MirrorState {
            master: header.master,
            last_tid: header.until,
            last_commit_ns: header.commit_time_ns,
            applied_ns: super::now_ns(),
        };
        // From here on the volume takes no changes but these (a new slave included).
        let fresh = state.is_none();
        self.slave.store(true, Ordering::Release);
        let committed = self.commit_mirrored(
            |volume| volume.mirror_mutations(&header, fresh, plan, &mut report),
            Some(&header),
            Some(new_state),
        );
        if let Err(e) = committed {
            written.release();
            self.slave.store(!fresh, Ordering::Release);
            return Err(e);
        }
        Ok(report)
    }

    /// A volume becomes a slave only while it holds nothing but an empty root directory.
    fn check_empty(&self) -> Result<()> {
        let mut holds_files = false;
        self.scan(&mut |e| {
            let user = e.key.obj != VOLUME_OBJ && e.key.obj != ROOT_OBJ;
            let entry = e.key.obj == ROOT_OBJ && e.key.rtype == rtype::DIRENT;
            holds_files |= e.delete_tid == 0 && (user || entry);
            !holds_files
        })?;
        match holds_files {
            true => Err(Error::Invalid(
                "the volume holds files: mirror-write starts a slave only on an empty, \
                 new volume"
                    .into(),
            )),
            false => Ok(()),
        }
    }

    /// Reads every item of the stream: skipped ranges, and what it says of each key.
    /// Extents go to the device as they come (into space no commit refers to yet).
    fn read_plan(
        &self,
        header: &StreamHeader,
        reader: &mut StreamReader<&mut dyn Read>,
        written: &mut ExtentWriter<'_>,
        report: &mut MirrorReport,
    ) -> Result<Plan> {
        let mut plan = Plan::default();
        let mut last: Option<Key> = None;
        loop {
            let item = reader.next_item()?;
            if let (Some(key), Some(previous)) = (item.key(), last) {
                if key <= previous {
                    return Err(Error::Stream(format!(
                        "items out of order at {key:?} (reordered or damaged stream)"
                    )));
                }
            }
            last = item.last_key().or(last);
            check_item(&item, header)?;
            report.items += 1;
            match item {
                Item::Skip { lo, hi } => plan.skips.push((lo, hi)),
                Item::Keep(key) => {
                    plan.mentioned.insert(key, Mention::Keep);
                }
                Item::Delete { key, delete_tid } => {
                    report.deleted += 1;
                    plan.mentioned.insert(key, Mention::Delete(delete_tid));
                }
                Item::Insert(element) => {
                    report.inserted += 1;
                    plan.mentioned.insert(element.key, Mention::Insert(element));
                }
                Item::InsertExtent {
                    key,
                    delete_tid,
                    compression: codec,
                    logical_bytes,
                    checksum,
                    stored,
                } => {
                    if crate::checksum::checksum(&stored) != checksum {
                        return Err(Error::Stream(format!(
                            "the extent of {key:?} fails its checksum"
                        )));
                    }
                    if compression::name(codec) == "unknown"
                        || logical_bytes as u64 > DATA_CHUNK_BYTES
                        || (codec == compression::NONE && logical_bytes as usize != stored.len())
                    {
                        return Err(Error::Stream(format!(
                            "the extent of {key:?} has an impossible size or codec"
                        )));
                    }
                    let Ok(stored_bytes) = u32::try_from(stored.len()) else {
                        return Err(Error::Stream(format!(
                            "the extent of {key:?} has an impossible size or codec"
                        )));
                    };
                    report.inserted += 1;
                    report.extent_bytes += stored.len() as u64;
                    let offset = written.write(&stored)?;
                    let element = Element {
                        key,
                        delete_tid,
                        payload: Payload::Extent(ExtentRef {
                            offset,
                            stored_bytes,
                            logical_bytes,
                            checksum,
                            compression: codec,
                            // The stream carries no sets; the receiver's blocks are its own.
                            set: LocalitySet::NONE,
                        }),
                    };
                    plan.mentioned.insert(key, Mention::Insert(element));
                }
                Item::End { pruned_through, .. } => {
                    report.items -= 1;
                    report.pruned_through = pruned_through;
                    return Ok(plan);
                }
            }
        }
    }

    /// Turns a read plan into the commit's mutations by walking the slave's own elements
    /// in every key range the stream did not skip.
    fn mirror_mutations(
        &self,
        header: &StreamHeader,
        fresh: bool,
        mut plan: Plan,
        report: &mut MirrorReport,
    ) -> Result<Vec<Mutation>> {
        let root = self.root();
        let loader = self.loader();
        let mut mutations: Vec<Mutation> = Vec::new();
        // Newest inserted version per logical key, for streams that are not `exact`.
        let newest: BTreeMap<LogicalKey, u64> = plan
            .mentioned
            .iter()
            .filter(|(_, m)| matches!(m, Mention::Insert(_)))
            .map(|(k, _)| (k.logical(), k.create_tid))
            .collect();
        let mut gaps: Vec<(Option<Key>, Option<Key>)> = Vec::with_capacity(plan.skips.len() + 1);
        let mut previous = None;
        for (lo, hi) in &plan.skips {
            gaps.push((previous, Some(*lo)));
            previous = Some(*hi);
        }
        gaps.push((previous, None));
        let mut failure: Option<Error> = None;
        for (after, before) in gaps {
            let lo = after.unwrap_or(Key::MIN);
            let hi = before.unwrap_or_else(max_key);
            let walk = btree::range(&loader, root.root, &lo, &hi, &mut |e| {
                if after.is_some_and(|a| e.key <= a) || before.is_some_and(|b| e.key >= b) {
                    return true;
                }
                if is_state_key(&e.key) {
                    return true;
                }
                match plan.mentioned.remove(&e.key) {
                    Some(Mention::Keep) => {}
                    Some(Mention::Insert(new)) if fresh => mutations.push(Mutation::Replace(new)),
                    Some(Mention::Insert(_)) => {
                        failure = Some(diverged(
                            &e.key,
                            "already holds an element the stream inserts",
                        ));
                        return false;
                    }
                    Some(Mention::Delete(tid)) if e.delete_tid == 0 => {
                        mutations.push(Mutation::Replace(Element {
                            delete_tid: tid,
                            ..e.to_element()
                        }));
                    }
                    Some(Mention::Delete(tid)) if e.delete_tid == tid => {}
                    Some(Mention::Delete(_)) => {
                        failure = Some(diverged(&e.key, "deleted the element at another TID"));
                        return false;
                    }
                    // What the slave holds and the master does not mention: a fresh
                    // volume's own records go; history stays (the master may have pruned
                    // it). A live element the master no longer has was destroyed there
                    // (history off, or deleted and pruned before this read): the slave
                    // ends it, at the TID of the version that replaced it if the stream
                    // has one, else at the stream's last TID, keeping its past readable.
                    // A stream read before the master's newest commit ends only what it
                    // replaces: the rest may have gone after its last TID.
                    None if fresh => {
                        report.ended += 1;
                        mutations.push(Mutation::Remove(e.key));
                    }
                    None if e.delete_tid != 0 => {}
                    None => {
                        let replaced = newest
                            .get(&e.key.logical())
                            .copied()
                            .filter(|tid| *tid > e.key.create_tid);
                        let end = match (replaced, header.exact) {
                            (Some(tid), _) => Some(tid),
                            (None, true) => Some(header.until.max(e.key.create_tid + 1)),
                            (None, false) => None,
                        };
                        if let Some(tid) = end {
                            report.ended += 1;
                            mutations.push(Mutation::Replace(Element {
                                delete_tid: tid,
                                ..e.to_element()
                            }));
                        }
                    }
                }
                true
            });
            btree::loaded(walk)?;
            if let Some(e) = failure.take() {
                return Err(e);
            }
        }
        for (key, mention) in plan.mentioned {
            match mention {
                Mention::Insert(element) => mutations.push(Mutation::Insert(element)),
                // History the slave pruned itself.
                Mention::Keep => {}
                Mention::Delete(_) => {
                    return Err(diverged(&key, "lacks an element the stream deletes"));
                }
            }
        }
        mutations.sort_by_key(Mutation::key);
        Ok(mutations)
    }

    /// Turns a slave into a master: the mirror state goes, and the volume takes changes
    /// from its next TID on. Returns the TID it continues from.
    pub fn mirror_promote(&self) -> Result<u64> {
        let Some(state) = self.mirror_state()? else {
            return Err(Error::Invalid("the volume is not a mirror slave".into()));
        };
        self.commit_mirrored(
            |volume| {
                let key = Key::new(config_lk(PROMOTED_KEY), volume.committed_tid());
                let mut mutations: Vec<Mutation> = volume
                    .record_versions(PROMOTED_KEY)?
                    .into_iter()
                    .filter(|k| *k != key)
                    .map(Mutation::Remove)
                    .collect();
                mutations.push(Mutation::Replace(Element {
                    key,
                    delete_tid: 0,
                    payload: Payload::Inline(state.encode()),
                }));
                Ok(mutations)
            },
            None,
            None,
        )?;
        self.slave.store(false, Ordering::Release);
        Ok(self.committed_tid())
    }

    /// Makes this volume a slave of `master` holding its history up to `at`, the TID up to
    /// which both hold the same history (the TID a promoted slave was promoted at, when
    /// this volume was its master): every change after `at` is undone (elements created
    /// after it go, elements deleted after it live again), as `zfs recv -F` rolls back.
    /// Changes after `at` to objects without history cannot be undone (their old versions
    /// were destroyed): attach refuses then, and a new slave is the way. (A volume mounted
    /// with `-o nohistory` after `at` is not detected: it must not be attached.)
    pub fn mirror_attach(&self, master: VolumeId, at: u64, at_commit_ns: u64) -> Result<()> {
        if self.is_slave() {
            return Err(Error::Invalid("the volume is a slave already".into()));
        }
        if at > self.committed_tid() {
            return Err(Error::Invalid(format!(
                "TID {at} is newer than this volume's newest ({})",
                self.committed_tid()
            )));
        }
        // Changes made so far commit as usual; from here on the volume takes none but
        // the attach's own.
        let _ = self.commit()?;
        self.slave.store(true, Ordering::Release);
        let state = MirrorState {
            master,
            last_tid: at,
            last_commit_ns: at_commit_ns,
            applied_ns: super::now_ns(),
        };
        let attached = self.commit_mirrored(|volume| volume.rollback(at), None, Some(state));
        if attached.is_err() {
            self.slave.store(false, Ordering::Release);
        }
        attached
    }

    /// The mutations that undo every change after `at` (see `mirror_attach`).
    fn rollback(&self, at: u64) -> Result<Vec<Mutation>> {
        let mut mutations = Vec::new();
        // Objects without history that changed after `at`: their versions at `at` may be
        // gone, so undoing the changes cannot bring them back.
        let mut nohistory = std::collections::HashSet::new();
        let mut changed = std::collections::HashSet::new();
        self.scan(&mut |e| {
            if is_state_key(&e.key) {
                return true;
            }
            if e.key.rtype == rtype::INODE && e.delete_tid == 0 {
                if let Payload::Inline(bytes) = &e.payload() {
                    if Inode::decode(bytes).is_ok_and(|i| i.flags & inode_flags::NOHISTORY != 0) {
                        nohistory.insert(e.key.obj);
                    }
                }
            }
            if e.key.create_tid > at && e.key.obj != VOLUME_OBJ {
                changed.insert(e.key.obj);
            }
            if e.key.create_tid > at {
                mutations.push(Mutation::Remove(e.key));
            } else if e.delete_tid > at {
                mutations.push(Mutation::Replace(Element {
                    delete_tid: 0,
                    ..e.to_element()
                }));
            }
            true
        })?;
        if let Some(obj) = nohistory.intersection(&changed).min() {
            return Err(Error::Invalid(format!(
                "object {obj} keeps no history and changed after TID {at}: its state then \
                 is gone, so this volume cannot follow from there; start a new slave instead"
            )));
        }
        mutations.extend(
            self.record_versions(PROMOTED_KEY)?
                .into_iter()
                .map(Mutation::Remove),
        );
        Ok(mutations)
    }

    /// The keys of every version of a volume CONFIG record.
    fn record_versions(&self, key: u64) -> Result<Vec<Key>> {
        let mut out = Vec::new();
        btree::loaded(btree::range(
            &self.loader(),
            self.root().root,
            &Key::new(config_lk(key), 0),
            &Key::new(config_lk(key), u64::MAX),
            &mut |e| {
                out.push(e.key);
                true
            },
        ))?;
        Ok(out)
    }

    /// Commits the mutations `build` makes (called under the commit lock, after anything
    /// pending is committed) without a TID of its own: the tree becomes the master's
    /// as of `header.until` (or, with no header, stays at its TID), and the mirror state
    /// record is replaced by `state` (or removed).
    fn commit_mirrored(
        &self,
        build: impl FnOnce(&Volume) -> Result<Vec<Mutation>>,
        header: Option<&StreamHeader>,
        state: Option<MirrorState>,
    ) -> Result<()> {
        let _commit = self.commit_lock.lock();
        // A new slave may have changes of its own pending (its root directory's times).
        self.commit_locked()?;
        // Built under the commit lock: no reblock step moves an extent under them.
        let mut mutations = build(self)?;
        let old_root = self.root();
        let previous: Superblock = self.state.lock().superblock.clone();
        let tid = header.map_or(previous.committed_tid, |h| {
            h.until.max(previous.committed_tid)
        });
        let old_state: Option<Key> = self.record_versions(MIRROR_STATE_KEY)?.last().copied();
        let state_key = Key::new(state_lk(), tid);
        if let Some(key) = old_state.filter(|k| *k != state_key || state.is_none()) {
            mutations.push(Mutation::Remove(key));
        }
        if let Some(state) = state {
            mutations.push(Mutation::Replace(Element {
                key: state_key,
                delete_tid: 0,
                payload: Payload::Inline(state.encode()),
            }));
        }
        mutations.sort_by_key(Mutation::key);
        let mut ctx = CommitContext::new(self.loader(), &self.space, tid);
        let written = (|| {
            let new_root = apply(&mut ctx, old_root.root, &mutations)?;
            ctx.write_out()?;
            Ok::<Root, Error>(new_root)
        })();
        let new_root = match written {
            Ok(root) => root,
            Err(e) => {
                self.fail_read_only(&e);
                return Err(e);
            }
        };
        let mut ring = self.log.lock();
        let sb = self
            .publish_mirrored(&mut ctx, &previous, new_root, tid, header, &ring)
            .inspect_err(|e| self.fail_read_only(e))?;
        // Batches written from here on apply on top of this TID.
        ring.epoch = tid;
        ring.seq = 0;
        ring.epoch_start = ring.head;
        ring.tail = ring.head;
        drop(ring);
        let freed = std::mem::take(&mut ctx.freed);
        let mut st = self.state.lock();
        self.retire(&old_root, freed);
        st.root = Arc::new(super::RootRef {
            root: new_root,
            tid,
            next_obj: sb.next_obj,
            release: crate::sync::Mutex::new(Vec::new()),
            space: self.space.clone(),
        });
        publish_counts(&mut st, &sb);
        st.superblock = sb;
        Ok(())
    }

    /// Writes the space map and the superblock of a mirrored commit.
    fn publish_mirrored(
        &self,
        ctx: &mut CommitContext<'_>,
        previous: &Superblock,
        new_root: Root,
        tid: u64,
        header: Option<&StreamHeader>,
        ring: &super::LogRing,
    ) -> Result<Superblock> {
        self.publish(
            &mut ctx.freed,
            previous,
            new_root,
            tid,
            Written {
                committing: &HashSet::new(),
                tail: None,
                // Its extents went out with the stream's other writes: a barrier orders them.
                ranges: None,
            },
            |sb| Superblock {
                committed_tid: tid,
                next_tid: previous.next_tid.max(tid + 1),
                next_obj: header.map_or(previous.next_obj, |h| h.next_obj.max(previous.next_obj)),
                commit_time_ns: header.map_or(previous.commit_time_ns, |h| h.commit_time_ns),
                live_objects: header.map_or(previous.live_objects, |h| h.live_objects),
                log_start: ring.head % ring.size,
                log_salt: ring.salt,
                ..sb
            },
        )
    }
}

fn publish_counts(st: &mut State, sb: &Superblock) {
    st.next_obj = sb.next_obj;
    st.live_objects = sb.live_objects;
    if st.active.is_empty() {
        st.active.tid = sb.next_tid;
    }
}

/// An item whose TIDs do not fit the stream's range, or that names this volume's own
/// mirror records, is refused (no master writes one).
fn check_item(item: &Item, header: &StreamHeader) -> Result<()> {
    let (since, until) = (header.since, header.until);
    if let Item::InsertExtent {
        key,
        logical_bytes,
        stored,
        ..
    } = item
    {
        // What the read path would refuse as damage later must not be written now.
        let stored_max = super::EXTENT_STORED_BYTES_MAX;
        if stored.is_empty()
            || stored.len() as u64 > stored_max
            || u64::from(*logical_bytes) > crate::format::record::DATA_CHUNK_BYTES
        {
            return Err(Error::Stream(format!(
                "{key:?}: an extent of {} stored and {logical_bytes} logical bytes \
                 (at most {stored_max} and {})",
                stored.len(),
                crate::format::record::DATA_CHUNK_BYTES
            )));
        }
    }
    let (key, fits) = match item {
        Item::Skip { .. } | Item::End { .. } => return Ok(()),
        Item::Keep(key) => (key, key.create_tid <= since),
        Item::Delete { key, delete_tid } => (
            key,
            key.create_tid <= since && since < *delete_tid && *delete_tid <= until,
        ),
        Item::Insert(Element {
            key, delete_tid, ..
        })
        | Item::InsertExtent {
            key, delete_tid, ..
        } => (
            key,
            since < key.create_tid
                && key.create_tid <= until
                && (*delete_tid == 0 || *delete_tid <= until),
        ),
    };
    if key.obj >= header.next_obj {
        // The receiver's lookups take the header's number as a bound (`RootRef::next_obj`).
        return Err(Error::Stream(format!(
            "{key:?} belongs to object {}, at or above the stream's next object id {}",
            key.obj, header.next_obj
        )));
    }
    match fits && !is_state_key(key) {
        true => Ok(()),
        false => Err(Error::Stream(format!(
            "{key:?} does not belong in a stream of TIDs {since}..{until}"
        ))),
    }
}

fn diverged(key: &Key, what: &str) -> Error {
    Error::Stream(format!(
        "this slave {what} ({key:?}): it no longer matches its master; \
         start a new slave from a full stream"
    ))
}

pub fn hex(id: &VolumeId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Default)]
struct Plan {
    skips: Vec<(Key, Key)>,
    mentioned: BTreeMap<Key, Mention>,
}

/// Writes a stream's extents into fresh space, batching neighbours into one request, and
/// remembers what it allocated so a refused stream gives it all back.
struct ExtentWriter<'a> {
    volume: &'a Volume,
    allocated: Vec<(u64, u64)>,
    run_start: u64,
    run: Vec<u8>,
}

impl<'a> ExtentWriter<'a> {
    fn new(volume: &'a Volume) -> ExtentWriter<'a> {
        ExtentWriter {
            volume,
            allocated: Vec::new(),
            run_start: 0,
            run: Vec::new(),
        }
    }

    fn write(&mut self, stored: &[u8]) -> Result<u64> {
        // The extent owns its stored bytes; the rest of its last block is written as zeros
        // but stays free (`space`), and the next allocation begins at the next block.
        let bytes = stored.len() as u64;
        let offset = self.volume.space.allocate(bytes, Purpose::Data)?;
        self.allocated.push((offset, bytes));
        if !self.run.is_empty()
            && (self.run_start + self.run.len() as u64 != offset
                || self.run.len() >= WRITE_RUN_BYTES_MAX)
        {
            self.flush()?;
        }
        if self.run.is_empty() {
            self.run_start = offset;
        }
        self.run.extend_from_slice(stored);
        let padding = stored.len().next_multiple_of(BLOCK_LEN) - stored.len();
        self.run.resize(self.run.len() + padding, 0);
        Ok(offset)
    }

    fn flush(&mut self) -> Result<()> {
        if !self.run.is_empty() {
            self.volume.device.write_at(&self.run, self.run_start)?;
            self.run.clear();
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<()> {
        self.flush()
    }

    /// Gives back everything written: no commit refers to it.
    fn release(&mut self) {
        for (offset, bytes) in self.allocated.drain(..) {
            self.volume.space.release(offset, bytes);
        }
        self.run.clear();
    }
}
