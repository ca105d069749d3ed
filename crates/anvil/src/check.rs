//! `anvil check`: verifies every block checksum and every tree invariant of a volume.
//!
//! Checked: both superblocks (at least one valid), every node (header, checksum, address,
//! level, key order, separator bounds), every extent (bounds, checksum, decompression), no
//! block referenced twice, at most one live version per logical key, visibility intervals
//! well formed, every live directory entry pointing at a live inode, link counts matching
//! the entries that name each object, the redo log epoch, and that the space map the last
//! commit wrote records exactly the blocks the tree leaves free. Nodes under the merge
//! threshold are counted (`underfull_nodes`), not reported as problems.

use crate::btree::Loader;
use crate::error::{Error, Result};
use crate::format::node::Node;
use crate::format::record::{
    kind, rtype, Dirent, Element, ExtentRef, Inode, LogicalKey, Payload, ROOT_OBJ,
};
use crate::format::superblock::Superblock;
use crate::format::NODE_BYTES;
use crate::space::Space;
use crate::volume::{decode_extent, extent_location, read_space_map, Volume};
use std::collections::HashMap;

/// The result of a check: problems found, and what was looked at.
#[derive(Debug, Default)]
pub struct Report {
    pub problems: Vec<String>,
    pub nodes: u64,
    pub elements: u64,
    pub live_elements: u64,
    pub extents: u64,
    pub extent_bytes: u64,
    pub objects: u64,
    pub history_elements: u64,
    /// Nodes other than the root with less payload than a commit leaves in a node it writes
    /// (`MERGE_BELOW_BYTES`). Not a problem: volumes written before commits merged nodes
    /// have them, and reblock packs them; a volume written since has none.
    pub underfull_nodes: u64,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

const PROBLEMS_MAX: usize = 1000;

fn note(report: &mut Report, problem: String) {
    if report.problems.len() < PROBLEMS_MAX {
        report.problems.push(problem);
    }
}

/// What a caller that checks many images sharing most of their bytes (crash states of one
/// run) already verified: extents whose stored bytes it knows verified and decoded clean
/// and have not changed since. The check still accounts for such an extent's space; it
/// only skips reading, verifying and decoding its bytes again.
pub trait KnownExtents: Sync {
    /// True if `extent`'s stored bytes verified and decoded clean before and are unchanged.
    fn verified(&self, extent: &ExtentRef) -> bool;
    /// `extent`'s stored bytes verified and decoded clean.
    fn record(&self, extent: &ExtentRef);
}

/// Checks the committed state of an open volume.
pub fn check(volume: &Volume) -> Result<Report> {
    check_with(volume, None)
}

/// `check`, skipping the bytes of extents `known` says verified clean before.
pub fn check_with(volume: &Volume, known: Option<&dyn KnownExtents>) -> Result<Report> {
    let mut report = Report::default();
    let root = volume.root();
    let loader: Loader<'_> = volume.loader();
    let sb = Volume::read_superblock(volume.device())?;
    let space = Space::new(sb.data_offset, sb.volume_bytes);
    let mut live: HashMap<LogicalKey, Element> = HashMap::new();
    // Walk nodes depth first, checking separators bound their subtrees.
    let mut stack = Vec::new();
    if root.root.address != 0 {
        stack.push((
            root.root.address,
            root.root.level,
            None::<crate::format::record::Key>,
            None,
        ));
    }
    while let Some((address, level, low, high)) = stack.pop() {
        report.nodes += 1;
        if let Err(e) = space.mark_used(address, NODE_BYTES as u64) {
            note(&mut report, format!("node at byte {address}: {e}"));
            continue;
        }
        let node = match loader.load(address, level) {
            Ok(node) => node,
            Err(e) => {
                note(&mut report, format!("{e}"));
                continue;
            }
        };
        let first = node.first_key();
        let last = match &*node {
            Node::Leaf(leaf) => leaf.last_key(),
            Node::Internal { children, .. } => children.last().map(|c| c.0),
        };
        if let (Some(low), Some(first)) = (low, first) {
            if first < low {
                note(
                    &mut report,
                    format!("node at byte {address}: first key below parent's separator"),
                );
            }
        }
        if let (Some(high), Some(last)) = (high, last) {
            if last >= high {
                note(
                    &mut report,
                    format!("node at byte {address}: key beyond next separator"),
                );
            }
        }
        if address != root.root.address
            && node.payload_bytes() < crate::btree::commit::MERGE_BELOW_BYTES
        {
            report.underfull_nodes += 1;
        }
        match &*node {
            Node::Leaf(leaf) => {
                if leaf.is_empty() && address != root.root.address {
                    note(&mut report, format!("node at byte {address}: empty leaf"));
                }
                for element in leaf.iter() {
                    check_element(
                        volume,
                        known,
                        &space,
                        &element,
                        &mut report,
                        &mut live,
                        root.next_obj,
                    );
                }
            }
            Node::Internal { children, .. } => {
                for (i, (key, child)) in children.iter().enumerate() {
                    let next = children.get(i + 1).map(|c| c.0).or(high);
                    let low = if i == 0 { low } else { Some(*key) };
                    stack.push((*child, level - 1, low, next));
                }
            }
        }
    }
    check_namespace(volume, &live, &mut report);
    if sb.root_address == root.root.address {
        check_space_map(volume, &sb, &space, &mut report);
    }
    Ok(report)
}

/// The space map the commit wrote must say exactly what the walk found: every block used
/// by the tree, its extents, the map itself or the commit's manifest is used, every other
/// block free; and the live object count must match.
fn check_space_map(volume: &Volume, sb: &Superblock, walked: &Space, report: &mut Report) {
    if sb.space_map_address == 0 {
        return;
    }
    let location = format!("space map at byte {}", sb.space_map_address);
    if let Err(e) = walked.mark_used(sb.space_map_address, sb.space_map_bytes) {
        note(report, format!("{location} overlaps the tree: {e}"));
        return;
    }
    if sb.manifest_address != 0 {
        if let Err(e) = walked.mark_used(sb.manifest_address, sb.manifest_bytes) {
            note(
                report,
                format!(
                    "commit manifest at byte {} overlaps the tree or the map: {e}",
                    sb.manifest_address
                ),
            );
            return;
        }
    }
    let recorded = match read_space_map(volume.device(), sb) {
        Ok(Some(ranges)) => ranges,
        Ok(None) => return,
        Err(e) => {
            note(
                report,
                format!("{location}: {e} (mount will walk the tree)"),
            );
            return;
        }
    };
    let actual = walked.free_ranges();
    if recorded != actual {
        let total = |ranges: &[(u64, u64)]| ranges.iter().map(|(_, l)| l).sum::<u64>();
        note(
            report,
            format!(
                "{location} disagrees with the tree: it records {} free bytes in {} ranges, \
                 the tree leaves {} free bytes in {} ranges",
                total(&recorded),
                recorded.len(),
                total(&actual),
                actual.len()
            ),
        );
    }
    if sb.live_objects != report.objects {
        note(
            report,
            format!(
                "superblock counts {} live objects, the tree holds {}",
                sb.live_objects, report.objects
            ),
        );
    }
}

fn check_element(
    volume: &Volume,
    known: Option<&dyn KnownExtents>,
    space: &Space,
    element: &Element,
    report: &mut Report,
    live: &mut HashMap<LogicalKey, Element>,
    next_obj: u64,
) {
    report.elements += 1;
    let key = element.key;
    let committed = volume.committed_tid();
    if key.create_tid > committed || element.delete_tid > committed {
        note(
            report,
            format!("element {key:?}: TID newer than the last commit"),
        );
    }
    if key.obj >= next_obj {
        note(
            report,
            format!(
                "element {key:?}: object at or above the superblock's next object id \
                 {next_obj} (lookups do not see it)"
            ),
        );
    }
    if element.delete_tid == 0 {
        report.live_elements += 1;
        if let Some(previous) = live.insert(key.logical(), element.clone()) {
            note(
                report,
                format!(
                    "object {} record {}/{}: two live versions ({} and {})",
                    key.obj, key.rtype, key.key, previous.key.create_tid, key.create_tid
                ),
            );
        }
    } else {
        report.history_elements += 1;
    }
    if let Payload::Extent(extent) = &element.payload {
        report.extents += 1;
        report.extent_bytes += extent.allocated_bytes();
        if let Err(e) = space.mark_used(extent.offset, extent.allocated_bytes()) {
            note(
                report,
                format!(
                    "object {} offset {}: {} ({e})",
                    key.obj,
                    key.key
                        .saturating_sub(crate::format::record::DATA_CHUNK_BYTES),
                    extent_location(extent)
                ),
            );
            return;
        }
        if known.is_some_and(|k| k.verified(extent)) {
            return;
        }
        let mut stored = vec![0u8; extent.stored_bytes as usize];
        let result = volume
            .device()
            .read_at(&mut stored, extent.offset)
            .map_err(Error::from)
            .and_then(|_| decode_extent(extent, &stored));
        if result.is_ok() {
            if let Some(known) = known {
                known.record(extent);
            }
        }
        if let Err(e) = result {
            let offset = key
                .key
                .saturating_sub(crate::format::record::DATA_CHUNK_BYTES);
            note(
                report,
                format!(
                    "object {} at file offset {offset} (TID {:#018x}): {e}",
                    key.obj, key.create_tid
                ),
            );
        }
    }
}

fn check_namespace(volume: &Volume, live: &HashMap<LogicalKey, Element>, report: &mut Report) {
    let bytes_of = |element: &Element| -> Option<Vec<u8>> {
        match &element.payload {
            Payload::Inline(bytes) => Some(bytes.clone()),
            Payload::Extent(extent) => volume.read_extent_uncached(extent).ok(),
        }
    };
    let mut inodes: HashMap<u64, Inode> = HashMap::new();
    for (lk, element) in live {
        if lk.rtype == rtype::INODE {
            match bytes_of(element).map(|b| Inode::decode(&b)) {
                Some(Ok(inode)) => {
                    inodes.insert(lk.obj, inode);
                }
                _ => note(report, format!("object {}: inode does not decode", lk.obj)),
            }
        }
    }
    report.objects = inodes.len() as u64;
    if !inodes.is_empty() && !inodes.contains_key(&ROOT_OBJ) {
        note(report, "root directory missing".to_string());
    }
    let mut links: HashMap<u64, u32> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    for (lk, element) in live {
        if lk.rtype != rtype::DIRENT {
            continue;
        }
        let Some(Ok(entry)) = bytes_of(element).map(|b| Dirent::decode(&b)) else {
            note(
                report,
                format!("directory {}: entry {} does not decode", lk.obj, lk.key),
            );
            continue;
        };
        if !inodes.get(&lk.obj).is_some_and(Inode::is_dir) {
            note(
                report,
                format!(
                    "directory entry {:?} in object {} which is not a live directory",
                    String::from_utf8_lossy(&entry.name),
                    lk.obj
                ),
            );
        }
        match inodes.get(&entry.child) {
            None => note(
                report,
                format!(
                    "directory {}: entry {:?} names missing object {}",
                    lk.obj,
                    String::from_utf8_lossy(&entry.name),
                    entry.child
                ),
            ),
            Some(child) if child.kind() != entry.kind => note(
                report,
                format!(
                    "directory {}: entry {:?} type differs from object {}",
                    lk.obj,
                    String::from_utf8_lossy(&entry.name),
                    entry.child
                ),
            ),
            Some(_) => {}
        }
        *links.entry(entry.child).or_default() += 1;
        if entry.kind == kind::DIR {
            *subdirs.entry(lk.obj).or_default() += 1;
        }
    }
    check_patches(live, report);
    let orphans: std::collections::HashSet<u64> = live
        .keys()
        .filter(|lk| lk.rtype == rtype::ORPHAN)
        .map(|lk| lk.key)
        .collect();
    for (obj, inode) in &inodes {
        let named = links.get(obj).copied().unwrap_or(0);
        let expected = if inode.is_dir() {
            if named == 0 && *obj != ROOT_OBJ {
                0
            } else {
                2 + subdirs.get(obj).copied().unwrap_or(0)
            }
        } else {
            named
        };
        if inode.nlink != expected && !(inode.nlink == 0 && orphans.contains(obj)) {
            note(
                report,
                format!(
                    "object {obj}: link count {} but {expected} expected",
                    inode.nlink
                ),
            );
        }
        if named == 0 && *obj != ROOT_OBJ && !orphans.contains(obj) {
            note(report, format!("object {obj}: not named by any directory"));
        }
    }
}

/// Every live PATCH lies over the live DATA record of its chunk, written no later than the
/// patch, with a payload that fits its bitmap; a patch whose last page is short ends at or
/// past the end of the chunk it applies to (the writer cuts pages short only there).
fn check_patches(live: &HashMap<LogicalKey, Element>, report: &mut Report) {
    use crate::format::record::{patch, DATA_CHUNK_BYTES};
    let logical_len = |element: &Element| match &element.payload {
        Payload::Inline(bytes) => bytes.len(),
        Payload::Extent(extent) => extent.logical_bytes as usize,
    };
    // Patches by chunk (its DATA key), each as (create_tid, bitmap, payload length, where).
    let mut by_chunk: HashMap<LogicalKey, Vec<(u64, u16, usize, String)>> = HashMap::new();
    for (lk, element) in live {
        if lk.rtype != rtype::PATCH {
            continue;
        }
        let (index, bitmap) = patch::split(lk.key);
        let at = format!(
            "object {} at file offset {} (patch TID {:#018x})",
            lk.obj,
            index.saturating_mul(DATA_CHUNK_BYTES),
            element.key.create_tid
        );
        // A damaged patch key can name a chunk index past any file: no such chunk.
        let data = LogicalKey {
            obj: lk.obj,
            rtype: rtype::DATA,
            key: index.saturating_add(1).saturating_mul(DATA_CHUNK_BYTES),
        };
        let Some(base) = live.get(&data) else {
            note(
                report,
                format!("{at}: patch of a chunk that does not exist"),
            );
            continue;
        };
        if base.key.create_tid > element.key.create_tid {
            note(report, format!("{at}: patch older than its chunk"));
        }
        by_chunk.entry(data).or_default().push((
            element.key.create_tid,
            bitmap,
            logical_len(element),
            at,
        ));
    }
    for (data, mut patches) in by_chunk {
        let mut chunk_len = live.get(&data).map_or(0, logical_len);
        patches.sort_by_key(|p| p.0);
        for (_, bitmap, len, at) in patches {
            let Some(end) = patch::end(bitmap, len) else {
                note(report, format!("{at}: patch does not fit its bitmap"));
                continue;
            };
            if end % patch::PAGE != 0 && end < chunk_len {
                note(
                    report,
                    format!("{at}: patch ends inside its chunk of {chunk_len} bytes"),
                );
            }
            chunk_len = chunk_len.max(end);
        }
    }
}
