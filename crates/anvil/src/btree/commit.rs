//! Applying one flush group's mutations to the tree, copy-on-write.
//!
//! Every node on a changed path is rewritten at a newly allocated address; the old addresses
//! are collected in `freed` and returned to the allocator by the caller once the new root is
//! durable and unreferenced. Nodes are split evenly when they overflow (a split leaf
//! sharing with a neighbour when the two fit, see `spill`), dropped when they become empty,
//! and merged with a neighbour when a commit leaves them less than a third full, so all
//! leaves stay at the same depth and space held by deleted elements comes back as whole
//! nodes (see `rebalance`).

use super::{child_index, Loader, NodeSource, Root};
use crate::error::{Error, Result};
use crate::format::leaf::{Item, Leaf};
use crate::format::manifest;
use crate::format::node::{Node, CHILD_ENTRY_BYTES, LEVEL_MAX, NODE_PAYLOAD_BYTES};
use crate::format::record::{Element, Key, Payload};
use crate::format::NODE_BYTES;
use crate::space::{Purpose, Space};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Arc;

/// Longest single device write of node blocks.
const WRITE_RUN_BYTES_MAX: usize = 4 << 20;
/// Nodes a commit builds before it writes them out (8 MiB of blocks).
const FRESH_NODES_MAX: usize = 512;
/// A node rewritten by a commit with less payload than this is merged with a neighbour.
/// Two merged nodes hold at most 4/3 of a node, so a merge that overflows splits into two
/// nodes at least half full: merging never cascades into splits that merge again.
pub const MERGE_BELOW_BYTES: usize = NODE_PAYLOAD_BYTES / 3;
/// A split leaf and its neighbour are redistributed when they fill their leaves to at most
/// this: full leaves would split again at the next insert.
const SPILL_FILL_BYTES: usize = NODE_PAYLOAD_BYTES * 7 / 8;

/// A child in a node being rebuilt: its first key, address, and its payload bytes when this
/// commit wrote it (`None` for an untouched child, which is not read just to be measured).
#[derive(Clone, Copy, Debug)]
struct Child {
    first: Key,
    address: u64,
    fill: Option<usize>,
}

/// One change to the tree.
#[derive(Clone, Debug)]
pub enum Mutation {
    /// Insert a new element; its key must not exist.
    Insert(Element),
    /// Set `delete_tid` of an existing live element (history kept).
    MarkDeleted(Key),
    /// Remove an existing element and free its extent (history off, or prune).
    Remove(Key),
    /// Give an existing element a new payload with the same content (reblock moved its
    /// extent); its key and TIDs stay, the old extent is freed.
    Relocate(Key, Payload),
    /// Put an element whether or not one with its key exists; an existing one's extent is
    /// freed unless the new element keeps it (mirror-write: the stream sets TIDs itself).
    Replace(Element),
}

impl Mutation {
    pub fn key(&self) -> Key {
        match self {
            Mutation::Insert(e) | Mutation::Replace(e) => e.key,
            Mutation::MarkDeleted(k) | Mutation::Remove(k) | Mutation::Relocate(k, _) => *k,
        }
    }
}

pub struct CommitContext<'a> {
    pub loader: Loader<'a>,
    pub space: &'a Space,
    pub tid: u64,
    /// Ranges (offset, bytes) no longer referenced by the new tree.
    pub freed: Vec<(u64, u64)>,
    /// Addresses of the nodes to write (in `fresh`, encoded only by `write_out`, so that a
    /// commit holds each node once, decoded, however many it rewrites).
    pub writes: Vec<u64>,
    /// Node blocks written so far.
    pub nodes_written: u64,
    /// Each node block written so far, with the checksum of its bytes: the commit's manifest
    /// lists them (`format::manifest`).
    pub written: Vec<manifest::Range>,
    /// Nodes this commit built and has not written yet, by address: the bounded cache may
    /// already have dropped them.
    fresh: HashMap<u64, Arc<Node>>,
    /// Addresses of nodes this commit built and dropped before writing them: no tree refers
    /// to them and they stay out of the allocator until the commit is durable (they go with
    /// `freed`), so `write_runs` may write filler over them to join the runs on each side.
    dropped: HashSet<u64>,
    /// Addresses taken in one free range for the nodes this commit builds next, highest
    /// first (`node_address`): a commit's nodes then lie side by side and go out in one
    /// request, where nodes taken one by one filled the small holes that deleted files
    /// leave near the allocation cursor, one request each.
    arena: Vec<u64>,
}

/// Nodes taken at once for a commit's arena: a commit of a few thousand changes builds
/// 40-60.
const ARENA_NODES: usize = 64;

impl<'a> CommitContext<'a> {
    pub fn new(loader: Loader<'a>, space: &'a Space, tid: u64) -> CommitContext<'a> {
        CommitContext {
            loader,
            space,
            tid,
            freed: Vec::new(),
            writes: Vec::new(),
            nodes_written: 0,
            written: Vec::new(),
            fresh: HashMap::new(),
            dropped: HashSet::new(),
            arena: Vec::new(),
        }
    }
}

impl Drop for CommitContext<'_> {
    fn drop(&mut self) {
        self.release_arena();
    }
}

impl CommitContext<'_> {
    fn fetch(&self, address: u64, level: u8) -> Result<Arc<Node>> {
        if let Some(node) = self.fresh.get(&address) {
            debug_assert_eq!(node.level(), level);
            return Ok(node.clone());
        }
        super::loaded(self.loader.node(address, level))
    }

    fn write_node(&mut self, node: Node) -> Result<Child> {
        #[expect(
            clippy::expect_used,
            reason = "nodes are written from non-empty groups of a split or merge"
        )]
        let first = node.first_key().expect("written nodes are never empty");
        let fill = node.payload_bytes();
        let address = self.node_address()?;
        self.writes.push(address);
        let node = Arc::new(node);
        self.fresh.insert(address, node.clone());
        self.loader.cache.insert_node(address, node, self.tid);
        if self.writes.len() >= FRESH_NODES_MAX {
            // A commit that rewrites thousands of leaves (new names in many directories)
            // would otherwise hold them all; written, they are read back like any node.
            self.write_out()?;
        }
        Ok(Child {
            first,
            address,
            fill: Some(fill),
        })
    }

    /// Takes a child out of the tree being built: a node written by this commit is dropped
    /// before it reaches the device, an older one is freed with the old root.
    fn discard(&mut self, child: &Child) {
        if self.fresh.remove(&child.address).is_some() {
            self.writes.retain(|address| *address != child.address);
            self.dropped.insert(child.address);
        }
        // Cached until the new root is published (`Volume::retire`): readers of the old
        // root still walk it.
        self.freed.push((child.address, NODE_BYTES as u64));
    }

    /// Where the next node goes: the arena's next address, from a new arena when free
    /// space is plentiful. A volume with less than a quarter of its data area free places
    /// its nodes one by one, wherever a block is free, as before: a cache directory keeps
    /// its volume about a tenth free, in pieces, where an arena would take the few long
    /// ranges a later commit's chunks need.
    fn node_address(&mut self) -> Result<u64> {
        if let Some(address) = self.arena.pop() {
            return Ok(address);
        }
        let arena_bytes = (ARENA_NODES * NODE_BYTES) as u64;
        let free = self.space.free_bytes();
        if free >= self.space.data_bytes() / 4 && free / 8 > arena_bytes {
            if let Ok(mut run) = self
                .space
                .allocate_run(&[NODE_BYTES as u64; ARENA_NODES], Purpose::Metadata)
            {
                run.reverse();
                if let Some(address) = run.pop() {
                    self.arena = run;
                    return Ok(address);
                }
            }
        }
        self.space.allocate(NODE_BYTES as u64, Purpose::Metadata)
    }

    /// Gives back the arena's addresses no node took.
    fn release_arena(&mut self) {
        for address in self.arena.drain(..) {
            self.space.release(address, NODE_BYTES as u64);
        }
    }

    /// Writes all pending node blocks, merging adjacent ones into single device writes of
    /// at most `WRITE_RUN_BYTES_MAX` (across the blocks of nodes dropped unwritten, which
    /// get zeros: a commit whose merges drop nodes it built would otherwise write its run
    /// in as many pieces as it dropped nodes), and lets go of them: from here on they are
    /// read through the cache or the device. Called when `FRESH_NODES_MAX` are pending and at
    /// the end of the commit; a node written early and then discarded by the same commit
    /// is freed with the rest (nothing refers to it).
    pub fn write_out(&mut self) -> Result<()> {
        self.write_runs(false).map(|_| ())
    }

    /// `write_out` at the end of a commit, but the last run of nodes is handed back
    /// unwritten, (its address, its bytes): the commit writes its space map in the same
    /// request when the map can go right after it.
    pub fn write_out_but_tail(&mut self) -> Result<Option<(u64, Vec<u8>)>> {
        self.write_runs(true)
    }

    fn write_runs(&mut self, keep_tail: bool) -> Result<Option<(u64, Vec<u8>)>> {
        // What the arena holds beyond the nodes built so far goes back before the commit
        // records its free space (this is called once more at the end of every commit).
        self.release_arena();
        let mut addresses = std::mem::take(&mut self.writes);
        addresses.sort_unstable();
        let mut run_start = 0u64;
        let mut run: Vec<u8> = Vec::new();
        let dropped = std::mem::take(&mut self.dropped);
        for address in addresses {
            if !run.is_empty() && run.len() < WRITE_RUN_BYTES_MAX {
                // Join across dropped nodes: their blocks are this commit's alone.
                let mut end = run_start + run.len() as u64;
                while end < address && dropped.contains(&end) {
                    end += NODE_BYTES as u64;
                }
                let joined = usize::try_from(address - run_start).unwrap_or(usize::MAX);
                if end == address && joined < WRITE_RUN_BYTES_MAX {
                    run.resize(joined, 0);
                }
            }
            let contiguous = run_start + run.len() as u64 == address;
            if !run.is_empty() && (!contiguous || run.len() >= WRITE_RUN_BYTES_MAX) {
                self.loader.device.write_at(&run, run_start)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = address;
            }
            #[expect(
                clippy::expect_used,
                reason = "writes and fresh gain and lose an address together (write_node, discard)"
            )]
            let node = self
                .fresh
                .remove(&address)
                .expect("every node to write was built by this commit");
            let block = node.encode(self.loader.volume_id, self.tid, address);
            self.written.push(manifest::Range {
                address,
                bytes: block.len() as u64,
                checksum: crate::checksum::checksum(&block),
            });
            run.extend_from_slice(&block);
            self.nodes_written += 1;
        }
        if run.is_empty() {
            return Ok(None);
        }
        if keep_tail {
            return Ok(Some((run_start, run)));
        }
        self.loader.device.write_at(&run, run_start)?;
        Ok(None)
    }
}

/// Applies `mutations` (sorted by key, unique keys) to the tree under `root`.
pub fn apply(ctx: &mut CommitContext<'_>, root: Root, mutations: &[Mutation]) -> Result<Root> {
    // Two changes to one record version (a damaged redo log replayed into the commit can
    // name one the commit also writes): refuse rather than build a tree holding both.
    if let Some(w) = mutations.windows(2).find(|w| w[0].key() >= w[1].key()) {
        return Err(Error::corrupt(
            "two changes to one record version in a commit",
            format!("{:?} twice", w[1].key()),
        ));
    }
    if mutations.is_empty() {
        return Ok(root);
    }
    let mut level = root.level;
    let mut nodes = if root.address == 0 {
        level = 0;
        apply_leaf(ctx, &Leaf::from_elements(&[]), mutations)?
    } else {
        apply_node(ctx, root.address, root.level, mutations, (None, None))?
    };
    if nodes.is_empty() {
        return Ok(Root::EMPTY);
    }
    while nodes.len() > 1 {
        if level >= LEVEL_MAX {
            return Err(Error::corrupt("tree too deep", "commit"));
        }
        level += 1;
        let entries = nodes.iter().map(|c| (c.first, c.address)).collect();
        nodes = build_internal(ctx, level, entries)?;
    }
    let mut address = nodes[0].address;
    // A root with a single child is redundant: descend.
    while level > 0 {
        let node = ctx.fetch(address, level)?;
        let Node::Internal { children, .. } = &*node else {
            break;
        };
        if children.len() != 1 {
            break;
        }
        ctx.freed.push((address, NODE_BYTES as u64));
        address = children[0].1;
        level -= 1;
    }
    let new_root = Root { address, level };
    #[cfg(debug_assertions)]
    check_applied(ctx, new_root, mutations)?;
    Ok(new_root)
}

/// Postcondition of `apply`, in debug builds: a sample of the mutations (about 16, the
/// first and the last among them) reads back from the new tree as applied: inserted and
/// replaced elements present as given, marked ones deleted at this TID, relocated ones
/// with their new payload, removed ones gone.
#[cfg(debug_assertions)]
fn check_applied(ctx: &CommitContext<'_>, root: Root, mutations: &[Mutation]) -> Result<()> {
    let step = (mutations.len() / 16).max(1);
    for mutation in mutations.iter().step_by(step).chain(mutations.last()) {
        let found = find(ctx, root, mutation.key())?;
        let applied = match (mutation, &found) {
            (Mutation::Insert(e) | Mutation::Replace(e), Some(f)) => f == e,
            (Mutation::MarkDeleted(_), Some(f)) => f.delete_tid == ctx.tid,
            (Mutation::Relocate(_, payload), Some(f)) => f.payload == *payload,
            (Mutation::Remove(_), None) => true,
            _ => false,
        };
        assert!(
            applied,
            "commit postcondition: {mutation:?} reads back as {found:?}"
        );
    }
    Ok(())
}

/// The element with exactly `key` in the tree at `root`, through the commit's own nodes.
#[cfg(debug_assertions)]
fn find(ctx: &CommitContext<'_>, root: Root, key: Key) -> Result<Option<Element>> {
    if root.address == 0 {
        return Ok(None);
    }
    let (mut address, mut level) = (root.address, root.level);
    loop {
        match &*ctx.fetch(address, level)? {
            Node::Leaf(leaf) => return Ok(leaf.find(&key)),
            Node::Internal { children, .. } => {
                let Some((_, child)) = children.get(child_index(children, &key)) else {
                    return Ok(None);
                };
                address = *child;
                level -= 1;
            }
        }
    }
}

/// The keys a node may hold, as its ancestors give them: from the first key its parent
/// records for it (none for a first child: its parent's own bound), up to the next
/// sibling's first key (none for a last child: its parent's own bound), exclusive.
type Bounds = (Option<Key>, Option<Key>);

fn apply_node(
    ctx: &mut CommitContext<'_>,
    address: u64,
    level: u8,
    mutations: &[Mutation],
    (lo, hi): Bounds,
) -> Result<Vec<Child>> {
    let node = ctx.fetch(address, level)?;
    // A damaged node whose keys lie outside its range would be rebuilt with keys that no
    // search reaches (they route to a sibling): refuse to write that tree.
    let keys = match &*node {
        Node::Leaf(leaf) => leaf.first_key().zip(leaf.last_key()),
        Node::Internal { children, .. } => children
            .get(1)
            .map(|c| c.0)
            .zip(children.last().map(|c| c.0)),
    };
    if let Some((first, last)) = keys {
        if lo.is_some_and(|lo| first < lo) || hi.is_some_and(|hi| last >= hi) {
            return Err(Error::corrupt(
                "a node's keys lie outside the range its parent gives it",
                format!("node at byte {address}"),
            ));
        }
    }
    // Still cached: the old root is the one readers walk until this commit is published.
    ctx.freed.push((address, NODE_BYTES as u64));
    match &*node {
        Node::Leaf(leaf) => apply_leaf(ctx, leaf, mutations),
        Node::Internal { children, .. } => {
            let untouched = |(first, address): &(Key, u64)| Child {
                first: *first,
                address: *address,
                fill: None,
            };
            let mut new_children: Vec<Child> = Vec::with_capacity(children.len() + 4);
            // Leaves this commit split, as ranges of `new_children`.
            let mut splits: Vec<Range<usize>> = Vec::new();
            let mut rest = mutations;
            let mut index = 0;
            while index < children.len() {
                // Mutations for child `index` are those below the next child's first key.
                let upper = children.get(index + 1).map(|c| c.0);
                let take = match upper {
                    Some(upper) => rest.partition_point(|m| m.key() < upper),
                    None => rest.len(),
                };
                let (mine, others) = rest.split_at(take);
                rest = others;
                if mine.is_empty() {
                    new_children.push(untouched(&children[index]));
                } else {
                    let bounds = (
                        if index == 0 {
                            lo
                        } else {
                            Some(children[index].0)
                        },
                        upper.or(hi),
                    );
                    let at = new_children.len();
                    new_children.extend(apply_node(
                        ctx,
                        children[index].1,
                        level - 1,
                        mine,
                        bounds,
                    )?);
                    if level == 1 && new_children.len() - at >= 2 {
                        splits.push(at..new_children.len());
                    }
                }
                index += 1;
                // Skip straight to the child holding the next mutation.
                if let Some(next) = rest.first() {
                    let jump = child_index(children, &next.key()).max(index);
                    new_children.extend(children[index..jump].iter().map(untouched));
                    index = jump;
                } else {
                    new_children.extend(children[index..].iter().map(untouched));
                    break;
                }
            }
            // A damaged child (keys outside the range its parent gives it) rebuilds with a
            // first key out of order with its siblings: refuse to write that tree.
            if !new_children.windows(2).all(|w| w[0].first < w[1].first) {
                return Err(Error::corrupt(
                    "a child's keys lie outside the range its parent gives it",
                    format!("internal node at byte {address}"),
                ));
            }
            if new_children.is_empty() {
                return Ok(Vec::new());
            }
            // From the last, so that the ranges before stay where they are.
            for split in splits.into_iter().rev() {
                spill(ctx, &mut new_children, split)?;
            }
            rebalance(ctx, level - 1, &mut new_children)?;
            let entries = new_children.iter().map(|c| (c.first, c.address)).collect();
            build_internal(ctx, level, entries)
        }
    }
}

/// A leaf that overflowed shares its elements with a neighbour this commit did not touch
/// when together they fit in as many leaves as the split made, each at most
/// `SPILL_FILL_BYTES` full (a B*-tree's redistribution): names inserted at random split
/// leaves that are then half empty, and a tree filled that way held a tenth fewer files
/// than one filled in order. The neighbour is rewritten in place of the split's second
/// half, so the commit writes no more nodes than the split alone.
fn spill(
    ctx: &mut CommitContext<'_>,
    children: &mut Vec<Child>,
    split: Range<usize>,
) -> Result<()> {
    let split_fill: usize = children[split.clone()]
        .iter()
        .map(|c| c.fill.unwrap_or(NODE_PAYLOAD_BYTES))
        .sum();
    let room = split.len() * SPILL_FILL_BYTES;
    for neighbour in [split.end, split.start.wrapping_sub(1)] {
        if neighbour >= children.len() || children[neighbour].fill.is_some() {
            continue;
        }
        let node = ctx.fetch(children[neighbour].address, 0)?;
        if split_fill + node.payload_bytes() > room {
            continue;
        }
        let span = split.start.min(neighbour)..split.end.max(neighbour + 1);
        let nodes = children[span.clone()]
            .iter()
            .map(|c| ctx.fetch(c.address, 0))
            .collect::<Result<Vec<_>>>()?;
        let mut items = Vec::new();
        for node in &nodes {
            let Node::Leaf(leaf) = &**node else {
                return Err(Error::corrupt(
                    "an internal node among leaves",
                    "commit, redistributing a split leaf",
                ));
            };
            items.extend(leaf.items(0));
        }
        for child in &children[span.clone()] {
            ctx.discard(child);
        }
        let written = write_leaves(ctx, items)?;
        children.splice(span, written);
        return Ok(());
    }
    Ok(())
}

fn apply_leaf(
    ctx: &mut CommitContext<'_>,
    leaf: &Leaf,
    mutations: &[Mutation],
) -> Result<Vec<Child>> {
    // Elements no mutation touches are copied as they are packed; only the ones that
    // change are unpacked.
    let mut merged: Vec<Item<'_>> = Vec::with_capacity(leaf.len() + mutations.len());
    let mut index = 0;
    for mutation in mutations {
        let key = mutation.key();
        let below = leaf.lower_bound(&key).max(index);
        merged.extend(leaf.items(index).take(below - index));
        index = below;
        let existing = (index < leaf.len() && leaf.compare(index, &key).is_eq()).then(|| {
            index += 1;
            leaf.get(index - 1)
        });
        match (mutation, existing) {
            (Mutation::Insert(element), None) => merged.push(Item::New(element.clone())),
            (Mutation::MarkDeleted(_), Some(mut element)) if element.delete_tid == 0 => {
                element.delete_tid = ctx.tid;
                merged.push(Item::New(element));
            }
            (Mutation::Relocate(_, payload), Some(mut element)) => {
                if let Payload::Extent(old) = element.payload {
                    if element.payload != *payload {
                        ctx.freed.push((old.offset, old.allocated_bytes()));
                    }
                }
                element.payload = payload.clone();
                merged.push(Item::New(element));
            }
            (Mutation::Replace(new), existing) => {
                if let Some(Element {
                    payload: Payload::Extent(old),
                    ..
                }) = existing
                {
                    if new.payload != Payload::Extent(old) {
                        ctx.freed.push((old.offset, old.allocated_bytes()));
                    }
                }
                merged.push(Item::New(new.clone()));
            }
            (Mutation::Remove(_), Some(element)) => {
                if let Payload::Extent(extent) = element.payload {
                    ctx.freed.push((extent.offset, extent.allocated_bytes()));
                }
            }
            (mutation, existing) => {
                return Err(Error::corrupt(
                    format!("commit cannot apply {mutation:?} to {existing:?}"),
                    format!("key {key:?}"),
                ))
            }
        }
    }
    merged.extend(leaf.items(index));
    write_leaves(ctx, merged)
}

fn write_leaves(ctx: &mut CommitContext<'_>, items: Vec<Item<'_>>) -> Result<Vec<Child>> {
    let mut out = Vec::new();
    for group in split_even(items, Item::fill_bytes, NODE_PAYLOAD_BYTES) {
        out.push(ctx.write_node(Node::Leaf(Leaf::from_items(&group)))?);
    }
    Ok(out)
}

fn build_internal(
    ctx: &mut CommitContext<'_>,
    level: u8,
    children: Vec<(Key, u64)>,
) -> Result<Vec<Child>> {
    let mut out = Vec::new();
    for group in split_even(children, |_| CHILD_ENTRY_BYTES, NODE_PAYLOAD_BYTES) {
        out.push(ctx.write_node(Node::Internal {
            level,
            children: group,
        })?);
    }
    Ok(out)
}

/// Merges every child this commit left under `MERGE_BELOW_BYTES` with a neighbour (the left
/// one where there is one), re-splitting the pair evenly if it does not fit one node. Only
/// rewritten children are measured, so a commit reads at most one untouched neighbour per
/// underfull node; nodes a commit never touches keep their fill. Merging two internal
/// nodes rebalances their children again, for an underfull child that was the only one.
fn rebalance(ctx: &mut CommitContext<'_>, level: u8, children: &mut Vec<Child>) -> Result<()> {
    let mut index = 0;
    while index < children.len() && children.len() > 1 {
        let underfull = children[index]
            .fill
            .is_some_and(|fill| fill < MERGE_BELOW_BYTES);
        if !underfull {
            index += 1;
            continue;
        }
        let left = index.saturating_sub(1);
        let (a, b) = (children[left], children[left + 1]);
        let node_a = ctx.fetch(a.address, level)?;
        let node_b = ctx.fetch(b.address, level)?;
        ctx.discard(&a);
        ctx.discard(&b);
        let merged = match (&*node_a, &*node_b) {
            (Node::Leaf(x), Node::Leaf(y)) => {
                write_leaves(ctx, x.items(0).chain(y.items(0)).collect())?
            }
            (Node::Internal { children: x, .. }, Node::Internal { children: y, .. }) => {
                // A child this commit left under the threshold as its parent's only child
                // could not be merged there; next to its new siblings it can.
                let mut grandchildren: Vec<Child> = x
                    .iter()
                    .chain(y.iter())
                    .map(|&(first, address)| Child {
                        first,
                        address,
                        fill: ctx.fresh.get(&address).map(|n| n.payload_bytes()),
                    })
                    .collect();
                rebalance(ctx, level - 1, &mut grandchildren)?;
                let entries = grandchildren.iter().map(|c| (c.first, c.address)).collect();
                build_internal(ctx, level, entries)?
            }
            _ => {
                return Err(Error::corrupt(
                    "sibling nodes of different kinds",
                    super::address_of(a.address),
                ))
            }
        };
        let count = merged.len();
        children.splice(left..left + 2, merged);
        // One merged node may still be underfull (two small neighbours): look at it again.
        // Two nodes from a split are each at least half full: move past them.
        index = if count == 1 { left } else { left + count };
    }
    Ok(())
}

/// Splits `items` into the fewest groups that fit `capacity`, of roughly equal size.
fn split_even<T>(items: Vec<T>, size: impl Fn(&T) -> usize, capacity: usize) -> Vec<Vec<T>> {
    if items.is_empty() {
        return Vec::new();
    }
    let total: usize = items.iter().map(&size).sum();
    let groups = total.div_ceil(capacity).max(1);
    let target = total.div_ceil(groups);
    let mut out = Vec::with_capacity(groups + 1);
    let mut current = Vec::new();
    let mut current_bytes = 0;
    for item in items {
        let bytes = size(&item);
        let full = current_bytes + bytes > capacity || current_bytes >= target;
        if full && !current.is_empty() {
            out.push(std::mem::take(&mut current));
            current_bytes = 0;
        }
        current_bytes += bytes;
        current.push(item);
    }
    if !current.is_empty() {
        out.push(current);
    }
    // Greedy grouping of large items can leave a small last group (a group closed early
    // because the next item did not fit pushes the remainder into one more group): share
    // the last two evenly instead, so no group of several is under a third full.
    if out.len() >= 2 {
        let last_bytes: usize = out[out.len() - 1].iter().map(&size).sum();
        if last_bytes * 3 < capacity {
            let mut pair: Vec<T> = out.split_off(out.len() - 2).into_iter().flatten().collect();
            let half = pair.iter().map(&size).sum::<usize>() / 2;
            let mut bytes = 0;
            let cut = pair
                .iter()
                .position(|item| {
                    let reached = bytes >= half;
                    bytes += size(item);
                    reached
                })
                .unwrap_or(pair.len())
                .max(1); // never an empty first group, whatever the sizes
            let second = pair.split_off(cut);
            out.push(pair);
            if !second.is_empty() {
                out.push(second);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::split_even;

    #[test]
    fn split_even_fits_capacity() {
        for n in [1usize, 5, 100, 1000] {
            let items: Vec<usize> = (0..n).map(|i| 10 + i % 90).collect();
            let groups = split_even(items.clone(), |x| *x, 1000);
            assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), n);
            for g in &groups {
                assert!(g.iter().sum::<usize>() <= 1000);
            }
        }
    }

    #[test]
    fn split_even_leaves_no_small_group_among_several() {
        // Large items (up to a tenth of a group) in every count and mix: every group fits,
        // and when there are several none is under a third full.
        for n in 1..400usize {
            for seed in 0..4usize {
                let items: Vec<usize> = (0..n).map(|i| 20 + (i * 37 + seed * 11) % 81).collect();
                let groups = split_even(items, |x| *x, 1000);
                assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), n);
                for g in &groups {
                    let bytes: usize = g.iter().sum();
                    assert!(bytes <= 1000, "n {n} seed {seed}: {bytes}");
                    assert!(
                        groups.len() == 1 || bytes * 3 >= 1000,
                        "n {n} seed {seed}: a group of {bytes} among {}",
                        groups.len()
                    );
                }
            }
        }
    }
}
