//! A byte-budgeted LRU of decoded nodes, keyed by device address. The mutex is held only for
//! map operations, never across I/O.

use crate::format::node::Node;
use lru::LruCache;
use parking_lot::Mutex;
use std::sync::Arc;

pub struct NodeCache {
    inner: Mutex<Inner>,
    budget_bytes: usize,
}

struct Inner {
    map: LruCache<u64, Arc<Node>>,
    bytes: usize,
}

impl NodeCache {
    pub fn new(budget_bytes: usize) -> NodeCache {
        NodeCache {
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                bytes: 0,
            }),
            budget_bytes: budget_bytes.max(1 << 20),
        }
    }

    pub fn get(&self, address: u64) -> Option<Arc<Node>> {
        self.inner.lock().map.get(&address).cloned()
    }

    pub fn insert(&self, address: u64, node: Arc<Node>) {
        let mut inner = self.inner.lock();
        inner.bytes += node.memory_bytes();
        if let Some(old) = inner.map.put(address, node) {
            inner.bytes -= old.memory_bytes();
        }
        while inner.bytes > self.budget_bytes {
            let Some((_, evicted)) = inner.map.pop_lru() else {
                break;
            };
            inner.bytes -= evicted.memory_bytes();
        }
    }

    pub fn remove(&self, address: u64) {
        let mut inner = self.inner.lock();
        if let Some(old) = inner.map.pop(&address) {
            inner.bytes -= old.memory_bytes();
        }
    }

    pub fn clear(&self) {
        let mut inner = self.inner.lock();
        inner.map.clear();
        inner.bytes = 0;
    }

    pub fn memory_bytes(&self) -> usize {
        self.inner.lock().bytes
    }
}
