//! Object stores: what an object-store volume (`ObjectDevice`) needs from S3 or anything
//! like it, and an in-memory store for tests.
//!
//! The trait is small on purpose: whole-object puts, ranged gets, sorted listings and
//! deletes. Nothing here assumes conditional writes, because some stores accept and
//! ignore them (Garage 2.5.0 overwrites on `If-None-Match: *`); `put_if_absent` reports
//! what the store did, and `ObjectDevice` probes it once before trusting it.
//!
//! Consistency assumed of every store: a `get` or `list` that starts after a `put` returned
//! sees the object (read-after-write, as S3 gives since 2020 and Garage gives with its
//! default quorum reads and writes), and a `get` after a `delete` returned does not. The
//! writer fencing in `object.rs` rests on the first. A `list` may still show a deleted
//! object for a moment (Garage 2.5.0 drops deleted entries on each node before merging the
//! replies of two), so nothing relies on a listing to show a delete.

use crate::sync::Mutex;
use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// An object store under one key prefix (a volume's home). Keys given to these methods
/// are relative to that prefix and use `/` as a separator.
pub trait BlobStore: Send + Sync {
    /// Stores `bytes` as object `key`, replacing any object of that name.
    fn put(&self, key: &str, bytes: &[u8]) -> io::Result<()>;
    /// Stores `bytes` as object `key` only if no object of that name exists, where the
    /// store honours the condition: `Ok(true)` created, `Ok(false)` refused because the
    /// object exists. A store that ignores the condition returns `Ok(true)` either way
    /// (which is why callers probe it before relying on it).
    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> io::Result<bool>;
    /// The whole object. An absent object is `ErrorKind::NotFound`.
    fn get(&self, key: &str) -> io::Result<Vec<u8>>;
    /// Exactly `len` bytes of object `key` from `offset`. An absent object is
    /// `ErrorKind::NotFound`; a short one is `ErrorKind::UnexpectedEof`.
    fn get_range(&self, key: &str, offset: u64, len: usize) -> io::Result<Vec<u8>>;
    /// Every object whose key starts with `prefix`, as (key, size), sorted by key.
    fn list(&self, prefix: &str) -> io::Result<Vec<(String, u64)>>;
    /// Removes object `key`; removing an absent object is not an error.
    fn delete(&self, key: &str) -> io::Result<()>;
    /// Where the objects live, for messages: `s3://bucket/prefix`, `memory`.
    fn describe(&self) -> String;
}

/// Counters of a `MemStore`, for tests that assert what reached the store.
#[derive(Default, Debug)]
pub struct MemStoreStats {
    pub puts: AtomicU64,
    pub gets: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
}

/// An object store in memory. Clones share the objects, like two clients of one bucket.
/// `fail_after` makes every request after the given number fail, as a store that went
/// away, and `fail_next` the next few (an outage); `honour_conditions(false)` makes `put_if_absent` overwrite, as Garage does.
#[derive(Clone)]
pub struct MemStore {
    inner: Arc<MemInner>,
}

struct MemInner {
    objects: Mutex<BTreeMap<String, Arc<Vec<u8>>>>,
    conditional: std::sync::atomic::AtomicBool,
    fail_after: AtomicU64,
    fail_next: AtomicU64,
    requests: AtomicU64,
    stats: MemStoreStats,
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore::new()
    }
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore {
            inner: Arc::new(MemInner {
                objects: Mutex::new(BTreeMap::new()),
                conditional: std::sync::atomic::AtomicBool::new(true),
                fail_after: AtomicU64::new(u64::MAX),
                fail_next: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                stats: MemStoreStats::default(),
            }),
        }
    }

    /// Whether `put_if_absent` refuses to overwrite (true, the default) or overwrites.
    pub fn honour_conditions(&self, honour: bool) {
        self.inner.conditional.store(honour, Ordering::SeqCst);
    }

    /// Every request after the next `n` fails (`u64::MAX`: none fails).
    pub fn fail_after(&self, n: u64) {
        let done = self.inner.requests.load(Ordering::SeqCst);
        self.inner
            .fail_after
            .store(done.saturating_add(n), Ordering::SeqCst);
    }

    /// The next `n` requests fail, then the store answers again (an outage); also ends a
    /// `fail_after`.
    pub fn fail_next(&self, n: u64) {
        self.inner.fail_after.store(u64::MAX, Ordering::SeqCst);
        self.inner.fail_next.store(n, Ordering::SeqCst);
    }

    pub fn stats(&self) -> &MemStoreStats {
        &self.inner.stats
    }

    /// The keys and sizes of every object (all prefixes).
    pub fn keys(&self) -> Vec<(String, u64)> {
        let objects = self.inner.objects.lock();
        objects
            .iter()
            .map(|(k, v)| (k.clone(), v.len() as u64))
            .collect()
    }

    /// Replaces object `key` with `bytes` behind the device's back (damage for tests).
    pub fn tamper(&self, key: &str, bytes: Vec<u8>) {
        self.inner
            .objects
            .lock()
            .insert(key.to_string(), Arc::new(bytes));
    }

    fn request(&self) -> io::Result<()> {
        let n = self.inner.requests.fetch_add(1, Ordering::SeqCst);
        let outage = self
            .inner
            .fail_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if outage || n >= self.inner.fail_after.load(Ordering::SeqCst) {
            return Err(io::Error::other("the object store refused the request"));
        }
        Ok(())
    }
}

fn not_found(key: &str) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no object {key}"))
}

impl BlobStore for MemStore {
    fn put(&self, key: &str, bytes: &[u8]) -> io::Result<()> {
        self.request()?;
        self.inner.stats.puts.fetch_add(1, Ordering::Relaxed);
        self.inner
            .objects
            .lock()
            .insert(key.to_string(), Arc::new(bytes.to_vec()));
        Ok(())
    }

    fn put_if_absent(&self, key: &str, bytes: &[u8]) -> io::Result<bool> {
        self.request()?;
        self.inner.stats.puts.fetch_add(1, Ordering::Relaxed);
        let mut objects = self.inner.objects.lock();
        if objects.contains_key(key) && self.inner.conditional.load(Ordering::SeqCst) {
            return Ok(false);
        }
        objects.insert(key.to_string(), Arc::new(bytes.to_vec()));
        Ok(true)
    }

    fn get(&self, key: &str) -> io::Result<Vec<u8>> {
        self.request()?;
        self.inner.stats.gets.fetch_add(1, Ordering::Relaxed);
        let objects = self.inner.objects.lock();
        objects
            .get(key)
            .map(|v| v.to_vec())
            .ok_or_else(|| not_found(key))
    }

    fn get_range(&self, key: &str, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.request()?;
        self.inner.stats.gets.fetch_add(1, Ordering::Relaxed);
        let objects = self.inner.objects.lock();
        let object = objects.get(key).ok_or_else(|| not_found(key))?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start.checked_add(len) {
            Some(end) if end <= object.len() => Ok(object[start..end].to_vec()),
            _ => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "object {key} holds {} bytes, not {offset}+{len}",
                    object.len()
                ),
            )),
        }
    }

    fn list(&self, prefix: &str) -> io::Result<Vec<(String, u64)>> {
        self.request()?;
        self.inner.stats.lists.fetch_add(1, Ordering::Relaxed);
        let objects = self.inner.objects.lock();
        Ok(objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.len() as u64))
            .collect())
    }

    fn delete(&self, key: &str) -> io::Result<()> {
        self.request()?;
        self.inner.stats.deletes.fetch_add(1, Ordering::Relaxed);
        self.inner.objects.lock().remove(key);
        Ok(())
    }

    fn describe(&self) -> String {
        "memory".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_store_lists_in_key_order_and_reads_ranges() {
        let store = MemStore::new();
        store.put("seg/2", b"bb").unwrap();
        store.put("seg/1", b"a").unwrap();
        store.put("other", b"x").unwrap();
        let listed = store.list("seg/").unwrap();
        assert_eq!(listed, vec![("seg/1".into(), 1), ("seg/2".into(), 2)]);
        assert_eq!(store.get_range("seg/2", 1, 1).unwrap(), b"b");
        let short = store.get_range("seg/2", 1, 2).unwrap_err();
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(
            store.get("seg/3").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        assert!(!store.put_if_absent("seg/1", b"z").unwrap());
        store.honour_conditions(false);
        assert!(store.put_if_absent("seg/1", b"z").unwrap());
        assert_eq!(store.get("seg/1").unwrap(), b"z");
        store.fail_after(0);
        assert!(store.get("seg/1").is_err());
    }
}
