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
//!
//! The third part holds *clusters*: raw device bytes around a small extent that was read,
//! in aligned slabs of `SLAB_BYTES`. A commit places the extents it writes side by side in
//! key order, so the files created together (a page and its images, a directory unpacked
//! at once) lie in one stretch of the device; reading the stretch in one request when one
//! of them is wanted brings its cluster-mates with it, and their reads then cost no device
//! I/O (Hummingbird's locality sets, read as a unit). Slabs are raw and unverified: an
//! extent decoded from them is checked against its checksum like any other, and every
//! device write into the data area forgets the slabs it overlaps (`forget_raw`), with an
//! epoch that keeps a read racing the write from caching what it replaced.

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

impl Weighter<u64, Arc<Node>> for Bytes {
    fn weight(&self, _address: &u64, node: &Arc<Node>) -> u64 {
        ENTRY_OVERHEAD_BYTES + node.memory_bytes() as u64
    }
}

#[derive(Clone)]
struct SlabBytes;

impl Weighter<u64, Arc<Vec<u8>>> for SlabBytes {
    fn weight(&self, _slab: &u64, bytes: &Arc<Vec<u8>>) -> u64 {
        ENTRY_OVERHEAD_BYTES + bytes.len() as u64
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
    /// Extents decoded from cached cluster slabs, without a device read.
    pub cluster_hits: u64,
    /// Cluster windows read from the device.
    pub cluster_reads: u64,
    /// Extents whose cached slabs did not verify (read again from the device): zero
    /// unless a write into the data area was not forgotten, or memory is damaged.
    pub cluster_stale: u64,
}

/// Size of a cluster slab: the unit raw device bytes are cached and forgotten in.
pub const SLAB_BYTES: u64 = 32 << 10;

pub struct BlockCache {
    nodes: Cache<u64, Arc<Node>, Bytes>,
    extents: Cache<ExtentRef, Arc<Vec<u8>>, Bytes>,
    /// Raw device slabs by index (`offset / SLAB_BYTES`); None when clusters are off.
    slabs: Option<Cache<u64, Arc<Vec<u8>>, SlabBytes>>,
    /// Bumped by every `forget_raw`, after the write it follows.
    raw_epoch: AtomicU64,
    budget_bytes: u64,
    node_hits: AtomicU64,
    node_misses: AtomicU64,
    extent_hits: AtomicU64,
    extent_misses: AtomicU64,
    cluster_hits: AtomicU64,
    cluster_reads: AtomicU64,
    cluster_stale: AtomicU64,
}

impl BlockCache {
    /// A cache of `node_bytes` for nodes and `extent_bytes` for decoded extents, without
    /// clusters.
    #[cfg(test)]
    pub fn new(node_bytes: u64, extent_bytes: u64) -> BlockCache {
        Self::with_clusters(node_bytes, extent_bytes, 0)
    }

    /// A cache with `cluster_bytes` more for raw cluster slabs (0: clusters off).
    pub fn with_clusters(node_bytes: u64, extent_bytes: u64, cluster_bytes: u64) -> BlockCache {
        let node_bytes = node_bytes.max(BUDGET_BYTES_MIN);
        let extent_bytes = extent_bytes.max(BUDGET_BYTES_MIN);
        // Estimated entries: 16 KiB nodes, 64 KiB chunks.
        let nodes = (node_bytes / (16 << 10)).max(64) as usize;
        let extents = (extent_bytes / (64 << 10)).max(64) as usize;
        let cluster_bytes = if cluster_bytes == 0 {
            0
        } else {
            cluster_bytes.max(BUDGET_BYTES_MIN)
        };
        let slabs = (cluster_bytes > 0).then(|| {
            let entries = (cluster_bytes / SLAB_BYTES).max(64) as usize;
            Cache::with_weighter(entries, cluster_bytes, SlabBytes)
        });
        BlockCache {
            nodes: Cache::with_weighter(nodes, node_bytes, Bytes),
            extents: Cache::with_weighter(extents, extent_bytes, Bytes),
            slabs,
            raw_epoch: AtomicU64::new(0),
            budget_bytes: node_bytes + extent_bytes + cluster_bytes,
            node_hits: AtomicU64::new(0),
            node_misses: AtomicU64::new(0),
            extent_hits: AtomicU64::new(0),
            extent_misses: AtomicU64::new(0),
            cluster_hits: AtomicU64::new(0),
            cluster_reads: AtomicU64::new(0),
            cluster_stale: AtomicU64::new(0),
        }
    }

    /// Whether small extents are read with their cluster.
    pub fn clusters_on(&self) -> bool {
        self.slabs.is_some()
    }

    /// The raw device bytes `[offset, offset + len)` if every slab they touch is cached.
    pub fn raw(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let slabs = self.slabs.as_ref()?;
        let end = offset + len as u64;
        let mut out = Vec::with_capacity(len);
        let mut at = offset;
        while at < end {
            let slab = slabs.get(&(at / SLAB_BYTES))?;
            let from = (at % SLAB_BYTES) as usize;
            let to = ((end - at) as usize + from).min(slab.len());
            if to <= from {
                return None;
            }
            out.extend_from_slice(&slab[from..to]);
            at += (to - from) as u64;
        }
        Some(out)
    }

    /// The epoch to pass to `insert_raw` for a device read that starts now.
    pub fn raw_epoch(&self) -> u64 {
        self.raw_epoch.load(Ordering::Acquire)
    }

    /// Caches `bytes`, read from the device at slab-aligned `offset` (whole slabs), unless
    /// a write into the data area was forgotten since `epoch`: the read may have seen the
    /// device before that write.
    pub fn insert_raw(&self, offset: u64, bytes: &[u8], epoch: u64) {
        let Some(slabs) = &self.slabs else { return };
        debug_assert_eq!(offset % SLAB_BYTES, 0);
        debug_assert_eq!(bytes.len() as u64 % SLAB_BYTES, 0);
        self.cluster_reads.fetch_add(1, Ordering::Relaxed);
        let first = offset / SLAB_BYTES;
        for (i, slab) in bytes.chunks_exact(SLAB_BYTES as usize).enumerate() {
            slabs.insert(first + i as u64, Arc::new(slab.to_vec()));
        }
        // A write that landed between the read and these inserts removed nothing of ours
        // if it came first: take them out again. One that comes later removes them itself.
        if self.raw_epoch() != epoch {
            self.forget_slabs(offset, bytes.len() as u64);
        }
    }

    /// Forgets cached raw bytes overlapping `[offset, offset + len)`: called after every
    /// device write into the data area.
    pub fn forget_raw(&self, offset: u64, len: u64) {
        if self.slabs.is_none() {
            return;
        }
        self.raw_epoch.fetch_add(1, Ordering::AcqRel);
        self.forget_slabs(offset, len);
    }

    fn forget_slabs(&self, offset: u64, len: u64) {
        let Some(slabs) = &self.slabs else { return };
        if len == 0 {
            return;
        }
        for slab in offset / SLAB_BYTES..=(offset + len - 1) / SLAB_BYTES {
            slabs.remove(&slab);
        }
    }

    /// Counts an extent decoded from cached slabs, or one they failed to verify.
    pub fn count_cluster(&self, verified: bool) {
        if verified {
            &self.cluster_hits
        } else {
            &self.cluster_stale
        }
        .fetch_add(1, Ordering::Relaxed);
    }

    pub fn node(&self, address: u64) -> Option<Arc<Node>> {
        let found = self.nodes.get(&address);
        count(&self.node_hits, &self.node_misses, found.is_some());
        found
    }

    pub fn insert_node(&self, address: u64, node: Arc<Node>) {
        self.nodes.insert(address, node);
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
        if let Some(slabs) = &self.slabs {
            slabs.clear();
        }
    }

    pub fn memory_bytes(&self) -> u64 {
        self.nodes.weight()
            + self.extents.weight()
            + self.slabs.as_ref().map_or(0, |slabs| slabs.weight())
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            bytes: self.memory_bytes(),
            budget_bytes: self.budget_bytes,
            node_hits: self.node_hits.load(Ordering::Relaxed),
            node_misses: self.node_misses.load(Ordering::Relaxed),
            extent_hits: self.extent_hits.load(Ordering::Relaxed),
            extent_misses: self.extent_misses.load(Ordering::Relaxed),
            cluster_hits: self.cluster_hits.load(Ordering::Relaxed),
            cluster_reads: self.cluster_reads.load(Ordering::Relaxed),
            cluster_stale: self.cluster_stale.load(Ordering::Relaxed),
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
    fn raw_slabs_are_read_back_across_their_boundaries() {
        let cache = BlockCache::with_clusters(4 << 20, 4 << 20, 4 << 20);
        let window: Vec<u8> = (0..4 * SLAB_BYTES).map(|i| (i % 251) as u8).collect();
        let base = 10 * SLAB_BYTES;
        cache.insert_raw(base, &window, cache.raw_epoch());
        let at = SLAB_BYTES - 100;
        let got = cache.raw(base + at, 5000).unwrap();
        assert_eq!(got, window[at as usize..at as usize + 5000]);
        // Past the window: not cached.
        assert!(cache.raw(base + 4 * SLAB_BYTES - 10, 20).is_none());
        // A write into the second slab forgets it, and only it.
        cache.forget_raw(base + SLAB_BYTES + 5, 10);
        assert!(cache.raw(base + at, 5000).is_none());
        assert!(cache.raw(base, 4096).is_some());
        assert!(cache.raw(base + 2 * SLAB_BYTES, 4096).is_some());
    }

    #[test]
    fn a_read_that_raced_a_write_is_not_cached() {
        let cache = BlockCache::with_clusters(4 << 20, 4 << 20, 4 << 20);
        let epoch = cache.raw_epoch();
        // The write lands (elsewhere, even) while the read is in flight.
        cache.forget_raw(1 << 30, 4096);
        cache.insert_raw(0, &vec![7; SLAB_BYTES as usize], epoch);
        assert!(cache.raw(0, 10).is_none());
        cache.insert_raw(0, &vec![7; SLAB_BYTES as usize], cache.raw_epoch());
        assert_eq!(cache.raw(0, 10).unwrap(), vec![7; 10]);
    }

    #[test]
    fn without_clusters_nothing_raw_is_kept() {
        let cache = BlockCache::new(4 << 20, 4 << 20);
        assert!(!cache.clusters_on());
        cache.insert_raw(0, &vec![7; SLAB_BYTES as usize], cache.raw_epoch());
        assert!(cache.raw(0, 10).is_none());
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
