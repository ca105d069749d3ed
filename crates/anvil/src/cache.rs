//! One memory-bounded cache for everything the engine decodes from the device: tree nodes,
//! keyed by address, and data extents after verification and decompression, keyed by their
//! whole reference.
//!
//! Nodes and extents have budgets of their own: a FUSE mount gives file data a small one,
//! because the kernel's page cache already holds what was read or written through the
//! mount, and a copy here would take its memory (both count against the same cgroup).
//!
//! The policy is quick_cache's CLOCK-Pro variant: new entries start cold and are promoted
//! only when used again, so one sequential scan of a large file cannot push out the nodes
//! and chunks that are in use (a plain LRU, which this replaces, could). Weights are bytes.
//!
//! Extent entries need no invalidation: the key holds the device address, the stored and
//! logical lengths, the codec and the checksum of the stored bytes, so a block reused for
//! other data has another key. Node entries are keyed by address alone and removed by the
//! commit that frees the node.

use crate::format::node::Node;
use crate::format::record::ExtentRef;
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bookkeeping per entry beyond its payload (map slot, key, Arc header), for the budget.
const ENTRY_OVERHEAD_BYTES: u64 = 96;
/// Smallest budget: every shard must hold a few whole 64 KiB chunks.
const BUDGET_BYTES_MIN: u64 = 4 << 20;

#[derive(Clone)]
struct Bytes;

/// A decoded node and the TID of the commit that wrote it (from its block header).
type TidNode = (Arc<Node>, u64);

impl Weighter<u64, TidNode> for Bytes {
    fn weight(&self, _address: &u64, node: &TidNode) -> u64 {
        ENTRY_OVERHEAD_BYTES + node.0.memory_bytes() as u64
    }
}

impl Weighter<ExtentRef, Arc<Vec<u8>>> for Bytes {
    fn weight(&self, _extent: &ExtentRef, bytes: &Arc<Vec<u8>>) -> u64 {
        ENTRY_OVERHEAD_BYTES + bytes.len() as u64
    }
}

/// Hits and misses since the cache was made, for `anvil info`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub bytes: u64,
    pub budget_bytes: u64,
    pub node_hits: u64,
    pub node_misses: u64,
    pub extent_hits: u64,
    pub extent_misses: u64,
}

pub struct BlockCache {
    nodes: Cache<u64, TidNode, Bytes>,
    extents: Cache<ExtentRef, Arc<Vec<u8>>, Bytes>,
    budget_bytes: u64,
    node_hits: AtomicU64,
    node_misses: AtomicU64,
    extent_hits: AtomicU64,
    extent_misses: AtomicU64,
}

impl BlockCache {
    /// A cache of `node_bytes` for nodes and `extent_bytes` for decoded extents.
    pub fn new(node_bytes: u64, extent_bytes: u64) -> BlockCache {
        let node_bytes = node_bytes.max(BUDGET_BYTES_MIN);
        let extent_bytes = extent_bytes.max(BUDGET_BYTES_MIN);
        // Estimated entries: 16 KiB nodes, 64 KiB chunks.
        let nodes = (node_bytes / (16 << 10)).max(64) as usize;
        let extents = (extent_bytes / (64 << 10)).max(64) as usize;
        BlockCache {
            nodes: Cache::with_weighter(nodes, node_bytes, Bytes),
            extents: Cache::with_weighter(extents, extent_bytes, Bytes),
            budget_bytes: node_bytes + extent_bytes,
            node_hits: AtomicU64::new(0),
            node_misses: AtomicU64::new(0),
            extent_hits: AtomicU64::new(0),
            extent_misses: AtomicU64::new(0),
        }
    }

    pub fn node(&self, address: u64) -> Option<Arc<Node>> {
        self.node_with_tid(address).map(|(node, _)| node)
    }

    /// The node at `address` and the TID it was written with, if cached.
    pub fn node_with_tid(&self, address: u64) -> Option<TidNode> {
        let found = self.nodes.get(&address);
        count(&self.node_hits, &self.node_misses, found.is_some());
        found
    }

    pub fn insert_node(&self, address: u64, node: Arc<Node>, tid: u64) {
        self.nodes.insert(address, (node, tid));
    }

    pub fn remove_node(&self, address: u64) {
        self.nodes.remove(&address);
    }

    /// The decoded bytes of `extent`, if cached.
    pub fn extent(&self, extent: &ExtentRef) -> Option<Arc<Vec<u8>>> {
        let found = self.extents.get(extent);
        count(&self.extent_hits, &self.extent_misses, found.is_some());
        found
    }

    /// Caches the decoded (verified) bytes of `extent`.
    pub fn insert_extent(&self, extent: ExtentRef, bytes: Arc<Vec<u8>>) {
        debug_assert_eq!(bytes.len(), extent.logical_bytes as usize);
        self.extents.insert(extent, bytes);
    }

    pub fn remove_extent(&self, extent: &ExtentRef) {
        self.extents.remove(extent);
    }

    pub fn clear(&self) {
        self.nodes.clear();
        self.extents.clear();
    }

    pub fn memory_bytes(&self) -> u64 {
        self.nodes.weight() + self.extents.weight()
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            bytes: self.memory_bytes(),
            budget_bytes: self.budget_bytes,
            node_hits: self.node_hits.load(Ordering::Relaxed),
            node_misses: self.node_misses.load(Ordering::Relaxed),
            extent_hits: self.extent_hits.load(Ordering::Relaxed),
            extent_misses: self.extent_misses.load(Ordering::Relaxed),
        }
    }
}

fn count(hits: &AtomicU64, misses: &AtomicU64, hit: bool) {
    if hit { hits } else { misses }.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::compression;

    fn extent(offset: u64, checksum: u64) -> ExtentRef {
        ExtentRef {
            offset,
            stored_bytes: 4096,
            logical_bytes: 4096,
            checksum,
            compression: compression::NONE,
        }
    }

    #[test]
    fn extents_are_keyed_by_their_whole_reference() {
        let cache = BlockCache::new(4 << 20, 16 << 20);
        cache.insert_extent(extent(8192, 1), Arc::new(vec![1; 4096]));
        assert_eq!(cache.extent(&extent(8192, 1)).unwrap()[0], 1);
        // The same block holding other bytes (another checksum) is another entry.
        assert!(cache.extent(&extent(8192, 2)).is_none());
        let stats = cache.stats();
        assert_eq!((stats.extent_hits, stats.extent_misses), (1, 1));
    }

    #[test]
    fn the_budget_holds_under_a_scan() {
        let budget = 8 << 20;
        let cache = BlockCache::new(4 << 20, budget);
        for i in 0..1000u64 {
            cache.insert_extent(extent(i * 65536, i), Arc::new(vec![0; 4096]));
        }
        assert!(cache.memory_bytes() <= budget, "{}", cache.memory_bytes());
        assert!(cache.memory_bytes() > 0);
    }

    #[test]
    fn a_used_entry_survives_a_scan() {
        let cache = BlockCache::new(4 << 20, 8 << 20);
        let hot = extent(1 << 40, 7);
        cache.insert_extent(hot, Arc::new(vec![9; 4096]));
        for _ in 0..4 {
            assert!(cache.extent(&hot).is_some());
        }
        for i in 0..20_000u64 {
            cache.insert_extent(extent(i * 65536, i), Arc::new(vec![0; 4096]));
        }
        assert!(cache.extent(&hot).is_some(), "a scan evicted a hot entry");
    }
}
