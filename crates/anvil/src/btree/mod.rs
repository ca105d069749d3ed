//! The one index: a copy-on-write B+tree of `Element`s ordered by
//! (obj, rtype, key, create_tid). Readers walk an immutable root; a commit writes new nodes
//! for every changed path and publishes a new root (see `commit`).

pub mod commit;

use crate::cache::BlockCache;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::leaf::ElementView;
use crate::format::node::Node;
use crate::format::record::{Element, Key};
use crate::format::{VolumeId, NODE_BYTES};
use std::collections::HashMap;
use std::sync::Arc;

/// A tree root: address of the root node (0 = empty tree) and its level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Root {
    pub address: u64,
    pub level: u8,
}

impl Root {
    pub const EMPTY: Root = Root {
        address: 0,
        level: 0,
    };
}

/// Something an operation needs from the device before it can go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Need {
    Node { address: u64, level: u8 },
    Extent(crate::format::record::ExtentRef),
}

/// Why an operation stopped: it needs I/O first (retry after loading), or it failed.
#[derive(Debug)]
pub enum Stop {
    Need(Need),
    Fail(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Fail(e)
    }
}

pub type Step<T> = std::result::Result<T, Stop>;

/// The result of a walk through a `Loader`, which reads misses itself and so never stops
/// with `Need`.
pub fn loaded<T>(step: Step<T>) -> Result<T> {
    match step {
        Ok(value) => Ok(value),
        Err(Stop::Fail(e)) => Err(e),
        Err(Stop::Need(need)) => unreachable!("a loader reported a miss: {need:?}"),
    }
}

/// Where tree walks get nodes from.
pub trait NodeSource {
    fn node(&self, address: u64, level: u8) -> Step<Arc<Node>>;
}

/// Reads nodes from the device on a cache miss. Used where no lock is held.
pub struct Loader<'a> {
    pub device: &'a dyn Device,
    pub cache: &'a BlockCache,
    pub volume_id: VolumeId,
}

impl Loader<'_> {
    pub fn load(&self, address: u64, level: u8) -> Result<Arc<Node>> {
        if let Some(node) = self.cache.node(address) {
            if node.level() != level {
                return Err(Error::corrupt(
                    "node level differs from parent's",
                    address_of(address),
                ));
            }
            return Ok(node);
        }
        let mut buf = vec![0u8; NODE_BYTES];
        self.device.read_at(&mut buf, address)?;
        let (node, tid) = Node::decode(&buf, &self.volume_id, address, Some(level))?;
        let node = Arc::new(node);
        self.cache.insert_node(address, node.clone(), tid);
        Ok(node)
    }
}

impl Loader<'_> {
    /// A node with the TID of the commit that wrote it.
    pub fn load_with_tid(&self, address: u64, level: u8) -> Result<(Arc<Node>, u64)> {
        if let Some((node, tid)) = self.cache.node_with_tid(address) {
            if node.level() == level {
                return Ok((node, tid));
            }
        }
        let mut buf = vec![0u8; NODE_BYTES];
        self.device.read_at(&mut buf, address)?;
        let (node, tid) = Node::decode(&buf, &self.volume_id, address, Some(level))?;
        let node = Arc::new(node);
        self.cache.insert_node(address, node.clone(), tid);
        Ok((node, tid))
    }
}

impl NodeSource for Loader<'_> {
    fn node(&self, address: u64, level: u8) -> Step<Arc<Node>> {
        Ok(self.load(address, level)?)
    }
}

/// Serves only what is in memory (cache, or nodes pinned for this operation); reports a miss
/// as `Stop::Need` so the caller can drop its locks, load, and retry.
pub struct CacheOnly<'a> {
    pub cache: &'a BlockCache,
    pub pinned: &'a HashMap<u64, Arc<Node>>,
    /// Internal nodes of the root being walked, kept out of the cache's way.
    pub upper: &'a std::cell::RefCell<UpperNodes>,
}

/// The internal nodes of one root that walks under it passed through. Every walk passes the
/// root and a node or two below it, and a few dozen such nodes lead to every leaf of a large
/// tree; asking the shared cache for each (a hash, a shard's lock, the entry's use bit, a
/// counter) was a twentieth of a proxy request's time. Holding their `Arc`s here costs no
/// memory (the cache holds the same nodes) and keeps no block from reuse: the set is
/// emptied when the root changes, and only its owner's lock reaches it.
#[derive(Default)]
pub struct UpperNodes {
    /// The root these belong to, by address and TID (a root's nodes never change).
    root: (u64, u64),
    nodes: foldhash::HashMap<u64, Arc<Node>>,
}

impl UpperNodes {
    /// At most this many nodes (a tree of ten million elements has about as many).
    const NODES_MAX: usize = 64;

    /// Starts over unless the set is `root`'s.
    pub fn follow(&mut self, root: Root, tid: u64) {
        if self.root != (root.address, tid) {
            self.root = (root.address, tid);
            self.nodes.clear();
        }
    }

    /// Forgets every node (the caches were dropped).
    pub fn clear(&mut self) {
        self.nodes.clear();
    }
}

impl NodeSource for CacheOnly<'_> {
    fn node(&self, address: u64, level: u8) -> Step<Arc<Node>> {
        if level > 0 {
            if let Some(node) = self.upper.borrow().nodes.get(&address) {
                // Kept at this level by the walk that put it here.
                return Ok(node.clone());
            }
        }
        let node = self
            .pinned
            .get(&address)
            .cloned()
            .or_else(|| self.cache.node(address));
        match node {
            Some(node) if node.level() == level => {
                if level > 0 {
                    let mut upper = self.upper.borrow_mut();
                    if upper.nodes.len() < UpperNodes::NODES_MAX {
                        upper.nodes.insert(address, node.clone());
                    }
                }
                Ok(node)
            }
            Some(_) => Err(Stop::Fail(Error::corrupt(
                "node level differs from parent's",
                address_of(address),
            ))),
            None => Err(Stop::Need(Need::Node { address, level })),
        }
    }
}

pub fn address_of(address: u64) -> String {
    format!("node at byte {address}")
}

/// Index of the child whose subtree may hold `key`.
fn child_index(children: &[(Key, u64)], key: &Key) -> usize {
    children
        .partition_point(|(first, _)| first <= key)
        .saturating_sub(1)
}

/// Visits every element with `lo <= key <= hi` in key order until `visit` returns false.
pub fn range(
    source: &dyn NodeSource,
    root: Root,
    lo: &Key,
    hi: &Key,
    visit: &mut dyn FnMut(&ElementView<'_>) -> bool,
) -> Step<bool> {
    if root.address == 0 {
        return Ok(true);
    }
    walk(source, root.address, root.level, lo, hi, visit)
}

fn walk(
    source: &dyn NodeSource,
    address: u64,
    level: u8,
    lo: &Key,
    hi: &Key,
    visit: &mut dyn FnMut(&ElementView<'_>) -> bool,
) -> Step<bool> {
    let node = source.node(address, level)?;
    match &*node {
        Node::Leaf(leaf) => {
            for index in leaf.lower_bound(lo)..leaf.len() {
                if leaf.compare(index, hi).is_gt() {
                    return Ok(false);
                }
                if !visit(&leaf.view(index)) {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Internal { children, .. } => {
            let start = child_index(children, lo);
            for (first, child) in &children[start..] {
                if first > hi {
                    return Ok(false);
                }
                if !walk(source, *child, level - 1, lo, hi, visit)? {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

/// Visits every element with `lo <= key <= hi` in descending key order until `visit`
/// returns false (the newest versions of a record first: a record's live version is its
/// newest, and one rewritten at every commit may have thousands of old ones before it).
pub fn range_rev(
    source: &dyn NodeSource,
    root: Root,
    lo: &Key,
    hi: &Key,
    visit: &mut dyn FnMut(&ElementView<'_>) -> bool,
) -> Step<bool> {
    if root.address == 0 {
        return Ok(true);
    }
    walk_rev(source, root.address, root.level, lo, hi, visit)
}

fn walk_rev(
    source: &dyn NodeSource,
    address: u64,
    level: u8,
    lo: &Key,
    hi: &Key,
    visit: &mut dyn FnMut(&ElementView<'_>) -> bool,
) -> Step<bool> {
    let node = source.node(address, level)?;
    match &*node {
        Node::Leaf(leaf) => {
            // Elements at or below `hi`: those before the first one above it.
            let end = leaf.lower_bound(hi);
            let end = if end < leaf.len() && leaf.compare(end, hi).is_eq() {
                end + 1
            } else {
                end
            };
            for index in (0..end).rev() {
                if leaf.compare(index, lo).is_lt() {
                    return Ok(false);
                }
                if !visit(&leaf.view(index)) {
                    return Ok(false);
                }
            }
            Ok(true)
        }
        Node::Internal { children, .. } => {
            let last = child_index(children, hi);
            for index in (0..=last).rev() {
                if !walk_rev(source, children[index].1, level - 1, lo, hi, visit)? {
                    return Ok(false);
                }
                // Children before this one hold keys below its first key.
                if children[index].0 <= *lo {
                    return Ok(false);
                }
            }
            Ok(true)
        }
    }
}

/// What `changes_since` reports, in key order.
pub enum Change<'a> {
    /// A subtree no commit after the TID rewrote: its elements are the ones that were
    /// there at the TID, and their keys lie in `lo..=hi`.
    Unchanged { lo: Key, hi: Key },
    /// An element of a node some commit after the TID rewrote.
    Element(&'a Element),
}

/// Walks the tree under `root`, reporting subtrees unchanged since `since` as ranges and
/// the elements of every other leaf one by one. Every node carries the TID of the commit
/// that wrote it, and copy-on-write rewrites all ancestors of a change, so a node written
/// at or before `since` heads a subtree that is exactly as it was then (what a mirror
/// slave at `since` holds), and only the rewritten nodes and their children are read.
pub fn changes_since(
    loader: &Loader<'_>,
    root: Root,
    since: u64,
    visit: &mut dyn FnMut(Change<'_>) -> Result<()>,
) -> Result<()> {
    if root.address == 0 {
        return Ok(());
    }
    let (node, tid) = loader.load_with_tid(root.address, root.level)?;
    changed_node(loader, &node, tid, since, visit)
}

fn changed_node(
    loader: &Loader<'_>,
    node: &Node,
    tid: u64,
    since: u64,
    visit: &mut dyn FnMut(Change<'_>) -> Result<()>,
) -> Result<()> {
    if tid <= since {
        // The bounds are the keys of the subtree's own first and last elements, not the
        // range its parent gives it: a neighbour removed later can widen that range over
        // keys this subtree never held.
        let lo = edge_key(loader, node, false)?;
        let hi = edge_key(loader, node, true)?;
        if let (Some(lo), Some(hi)) = (lo, hi) {
            visit(Change::Unchanged { lo, hi })?;
        }
        return Ok(());
    }
    match node {
        Node::Leaf(leaf) => leaf.iter().try_for_each(|e| visit(Change::Element(&e))),
        Node::Internal { level, children } => {
            for (_, child) in children {
                let (child_node, child_tid) = loader.load_with_tid(*child, level - 1)?;
                changed_node(loader, &child_node, child_tid, since, visit)?;
            }
            Ok(())
        }
    }
}

/// The first (or last) element key of the subtree under `node`.
fn edge_key(loader: &Loader<'_>, node: &Node, last: bool) -> Result<Option<Key>> {
    match node {
        Node::Leaf(leaf) => Ok(if last {
            leaf.last_key()
        } else {
            leaf.first_key()
        }),
        Node::Internal { level, children } => {
            let child = if last {
                children.last()
            } else {
                children.first()
            };
            match child {
                Some((_, address)) => edge_key(loader, &*loader.load(*address, level - 1)?, last),
                None => Ok(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{rtype, Payload};

    /// Nodes by address, for walks over trees built by hand.
    struct Nodes(HashMap<u64, Arc<Node>>);

    impl NodeSource for Nodes {
        fn node(&self, address: u64, _level: u8) -> Step<Arc<Node>> {
            Ok(self.0[&address].clone())
        }
    }

    fn key(obj: u64, create_tid: u64) -> Key {
        Key {
            obj,
            rtype: rtype::INODE,
            key: 0,
            create_tid,
        }
    }

    /// A two-level tree of `objs` objects with `versions` versions each, `per_leaf` elements
    /// a leaf, and (as a third level) one root over internal nodes of four leaves.
    fn tree(objs: u64, versions: u64, per_leaf: usize) -> (Nodes, Root) {
        let elements: Vec<Element> = (0..objs)
            .flat_map(|obj| (1..=versions).map(move |tid| (obj, tid)))
            .map(|(obj, tid)| Element {
                key: key(obj, tid),
                delete_tid: if tid == versions { 0 } else { tid + 1 },
                payload: Payload::Inline(vec![1; 3]),
            })
            .collect();
        let mut nodes = HashMap::new();
        let mut next = 1u64;
        let mut level: Vec<(Key, u64)> = Vec::new();
        for group in elements.chunks(per_leaf) {
            nodes.insert(next, Arc::new(Node::leaf(group)));
            level.push((group[0].key, next));
            next += 1;
        }
        let mut height = 0;
        while level.len() > 1 {
            height += 1;
            let mut up = Vec::new();
            for group in level.chunks(4) {
                nodes.insert(
                    next,
                    Arc::new(Node::Internal {
                        level: height,
                        children: group.to_vec(),
                    }),
                );
                up.push((group[0].0, next));
                next += 1;
            }
            level = up;
        }
        let root = Root {
            address: level[0].1,
            level: height,
        };
        (Nodes(nodes), root)
    }

    fn collect(source: &Nodes, root: Root, lo: Key, hi: Key, rev: bool) -> Vec<Key> {
        let mut out = Vec::new();
        let mut visit = |e: &ElementView<'_>| {
            out.push(e.key);
            true
        };
        if rev {
            range_rev(source, root, &lo, &hi, &mut visit).unwrap();
        } else {
            range(source, root, &lo, &hi, &mut visit).unwrap();
        }
        out
    }

    #[test]
    fn reverse_ranges_visit_what_forward_ranges_visit_backwards() {
        let (nodes, root) = tree(40, 7, 5);
        assert!(root.level >= 2);
        for (lo, hi) in [
            (key(0, 0), key(u64::MAX, u64::MAX)),
            (key(3, 0), key(3, u64::MAX)),
            (key(3, 2), key(3, 5)),
            (key(9, 7), key(10, 1)),
            (key(17, 3), key(31, 6)),
            (key(39, 7), key(39, 7)),
            (key(40, 0), key(50, 0)),
            (key(5, 4), key(5, 3)),
        ] {
            let mut forward = collect(&nodes, root, lo, hi, false);
            forward.reverse();
            assert_eq!(
                collect(&nodes, root, lo, hi, true),
                forward,
                "{lo:?}..={hi:?}"
            );
        }
        // Stopping early: the newest version of object 12 is the first one visited.
        let mut first = None;
        range_rev(&nodes, root, &key(12, 0), &key(12, u64::MAX), &mut |e| {
            first = Some((e.key, e.delete_tid));
            false
        })
        .unwrap();
        assert_eq!(first, Some((key(12, 7), 0)));
    }
}
