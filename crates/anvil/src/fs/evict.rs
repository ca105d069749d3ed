//! Directories that are caches: when space runs low, the least recently used clusters of
//! their files are deleted whole, as Hummingbird dropped whole clusters, instead of
//! writes failing with ENOSPC.
//!
//! A directory marked evictable (`Filesystem::set_evictable`) passes the mark to what is
//! created in it, with history off (the files of a cache have no past worth keeping, and
//! a deleted file's space must come back at the next commit). The tracker below remembers
//! the regular files of such directories that this mount created or looked up, with the
//! time of their last use, and which of them a commit wrote into one cluster
//! (`Volume::take_clusters`). Eviction ranks clusters by their most recent use (a file
//! alone is a cluster of one) and deletes the oldest ones, every member, until the free
//! space is back above the high mark; the commit that follows returns their space.
//!
//! Nothing of this is on the device but the mark: after a remount the first eviction
//! finds the files by walking the tree (and ranks them by their modification or access
//! time, whichever is later), and clusters are known again as commits write them.

use super::{dir_inode, find_entry_version, load_inode, unlink_entry, Attr, FileKind, Filesystem};
use crate::error::{Error, Result};
use crate::format::record::{inode_flags, kind, rtype, Timestamp, ROOT_OBJ};
use crate::volume::Value;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Eviction starts when the space left for writes falls under this share of the data area
/// (1/LOW_MARK) and stops when it is back over 1/HIGH_MARK: Hummingbird's watermarks.
const LOW_MARK: u64 = 20;
const HIGH_MARK: u64 = 10;

/// How long space that evicted files held stays counted as coming back (the kernel forgets
/// them as soon as their names are invalidated, unless a process keeps one open), and how
/// long a write that needs it waits for it, in rounds.
const RETURN_EXPECTED: std::time::Duration = std::time::Duration::from_secs(2);
const RETURN_WAIT: std::time::Duration = std::time::Duration::from_millis(10);
const RETURN_WAIT_ROUNDS: u32 = 50;

/// Evictions one write may run before it fails with ENOSPC: the space of evicted files can
/// come back in holes too short for a chunk, until their neighbours go too.
const EVICT_ATTEMPTS: u32 = 8;

/// Node space one eviction may take at its commit: the leaves of the directory entry, of
/// the file's records and of the directory's inode, each copied whole.
const EVICT_NODE_BYTES: u64 = 3 * crate::format::NODE_BYTES as u64;

impl Filesystem {
    /// Calls `listener` with the names each eviction removed, after its commit.
    pub fn on_evict(&self, listener: super::EvictListener) {
        *self.evict_listener.lock() = Some(listener);
    }

    /// Turns tracking on: the volume has a cache directory (the root's `CACHES` mark says
    /// so at mount, `set_evictable` when one is made).
    pub(crate) fn start_evicting(&self) {
        if !self.evicting.swap(true, Ordering::Relaxed) {
            self.volume.track_clusters();
        }
    }

    /// Tracks `attr` if it is a regular file of a cache directory, named `parent`/`name`.
    pub(crate) fn note_evictable(&self, attr: &Attr, parent: u64, name: &[u8]) {
        if attr.flags & inode_flags::EVICTABLE == 0 || attr.kind != FileKind::File {
            return;
        }
        self.start_evicting();
        self.evictable.lock().note(attr.ino, parent, name, None);
    }

    /// A use of `ino` (a read or a write).
    pub(crate) fn touch_evictable(&self, ino: u64) {
        if self.evicting.load(Ordering::Relaxed) {
            self.evictable.lock().touch(ino);
        }
    }

    /// The last handle of `ino` closed (the kernel forgot it): if an eviction deleted it
    /// while it was held, its space comes back with the next commit.
    pub(crate) fn released_evictable(&self, ino: u64) {
        if self.evicting.load(Ordering::Relaxed) && self.evictable.lock().returned(ino) {
            self.volume.request_commit();
        }
    }

    /// Makes sure `new_bytes` can be written (for `writer`, 0 for a create, whose inode
    /// needs node space only; a write's data needs room for whole chunks): on a volume with
    /// cache directories, evicts when space runs low (under the low mark, or not enough for
    /// this write), and fails with ENOSPC only when that does not make room.
    pub(crate) fn ensure_space(&self, writer: u64, new_bytes: u64) -> Result<()> {
        let check = |bytes| match writer {
            0 => self.volume.check_space(bytes),
            _ => self.volume.check_data_space(bytes),
        };
        if !self.evicting.load(Ordering::Relaxed) {
            return check(new_bytes);
        }
        let left = self.volume.data_space_left();
        let low = self.volume.data_area_bytes() / LOW_MARK;
        // Above the low mark (every write but a few): nothing more to look at.
        if left >= new_bytes && left >= low {
            return Ok(());
        }
        let coming = self
            .evictable
            .lock()
            .coming_bytes(self.volume.committed_tid());
        if left >= new_bytes && left + coming >= low {
            return Ok(());
        }
        for attempt in 0..EVICT_ATTEMPTS {
            let evicted = match self.evict(writer, new_bytes) {
                Ok(evicted) => evicted,
                // Room for this write is what matters; a failed eviction is reported by the
                // commit that follows, if it matters there.
                Err(e) if left >= new_bytes => {
                    log::warn!("eviction failed: {e}");
                    0
                }
                Err(e) => return Err(e),
            };
            // Evicted files come back with the next commit (the committer was asked for
            // one soon), those the kernel held once it forgets them (at once: their names
            // were invalidated) and a commit follows. A write that needs their space now
            // commits, and waits for held ones, briefly.
            for round in 0..=RETURN_WAIT_ROUNDS {
                match check(new_bytes) {
                    Err(Error::NoSpace) => {}
                    other => return other,
                }
                let waiting = !self.evictable.lock().held.is_empty();
                if round == RETURN_WAIT_ROUNDS || (round > 0 && !waiting) {
                    break;
                }
                if waiting {
                    std::thread::sleep(RETURN_WAIT);
                }
                self.volume.commit()?;
            }
            // The space came back in holes too short for whole chunks (evicted files
            // whose neighbours stay): evict more, until their holes join. (A first
            // eviction may delete nothing, counting on space still to come back that then
            // came back in such holes: the next one counts without it.)
            if evicted == 0 && attempt > 0 {
                break;
            }
            log::debug!("eviction {attempt} made too little room for chunks; evicting more");
        }
        Err(Error::NoSpace)
    }

    /// Deletes cache files, least recently used cluster first (never `writer`'s), until the
    /// space left is back over the high mark with `new_bytes` written (counting the space
    /// their data holds, and what earlier evictions will return), and asks for a commit,
    /// which returns their space. Returns the files deleted.
    pub(crate) fn evict(&self, writer: u64, new_bytes: u64) -> Result<u64> {
        let _one = self.evict_lock.lock();
        // Counted under the lock: another writer may have made room while this one waited.
        let left = self.volume.data_space_left()
            + self
                .evictable
                .lock()
                .coming_bytes(self.volume.committed_tid());
        let wanted = (self.volume.data_area_bytes() / HIGH_MARK + new_bytes).saturating_sub(left);
        if wanted == 0 {
            return Ok(0);
        }
        log::debug!("evicting: {left} bytes left for writes or coming back, {wanted} wanted");
        if !self.evictable.lock().scanned {
            self.scan_evictable()?;
        }
        let victims = {
            let mut tracker = self.evictable.lock();
            tracker.add_clusters(self.volume.take_clusters());
            tracker.victims()
        };
        let mut freed = 0u64;
        let mut removed: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut result = Ok(());
        'victims: for victim in victims {
            if freed >= wanted {
                break;
            }
            if victim.files.contains(&writer) {
                continue;
            }
            for ino in victim.files {
                // Where the tracker has it now (a rename since the ranking moves it).
                let Some((parent, name)) = self.evictable.lock().name_of(ino) else {
                    continue;
                };
                // Deletes copy the leaves they touch at the commit, into space the reserve
                // holds for it: commit before they could need more than half of it.
                let batch = self.evictable.lock().uncommitted_files();
                if batch * EVICT_NODE_BYTES >= self.volume.reserve_bytes() / 2 {
                    if let Err(e) = self.volume.commit() {
                        result = Err(e);
                        break 'victims;
                    }
                }
                let evicted = self.evict_file(ino, parent, &name);
                let committed = self.volume.committed_tid();
                let mut tracker = self.evictable.lock();
                tracker.forget(ino);
                match evicted {
                    Ok(Some((bytes, held))) => {
                        freed += bytes;
                        removed.push((parent, name));
                        if held {
                            tracker.evicted_while_held(ino, bytes);
                        } else {
                            tracker.coming_bytes(committed);
                            tracker.uncommitted.0 += bytes;
                            tracker.uncommitted.1 += 1;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        result = Err(e);
                        break 'victims;
                    }
                }
            }
        }
        let deleted = removed.len() as u64;
        self.evicted.0.fetch_add(deleted, Ordering::Relaxed);
        self.evicted.1.fetch_add(freed, Ordering::Relaxed);
        if deleted > 0 {
            log::debug!("evicted {deleted} cache files ({freed} bytes)");
            self.volume.request_commit();
            // Deleted, whatever happens next: the kernel must forget the names.
            if let Some(listener) = &*self.evict_listener.lock() {
                listener(removed);
            }
        }
        result.map(|()| deleted)
    }

    /// Deletes one tracked file if it is still what was tracked: the only name of a regular
    /// file without history in a directory that is still a cache. Returns the space its
    /// data holds and whether something holds the file: then it is unlinked as by
    /// unlink(2) (an open file stays readable through its handle) and its space returns
    /// when the last handle closes.
    fn evict_file(&self, ino: u64, parent: u64, name: &[u8]) -> Result<Option<(u64, bool)>> {
        let result = self.volume.run(true, |tx| {
            let dir = dir_inode(tx, parent)?;
            if dir.flags & inode_flags::EVICTABLE == 0 || dir.nlink == 0 {
                return Ok(None);
            }
            let Some((slot, entry, version)) = find_entry_version(tx, parent, name)? else {
                return Ok(None);
            };
            if entry.child != ino || entry.kind != kind::FILE {
                return Ok(None);
            }
            let inode = load_inode(tx, ino)?;
            // With history on, deleting frees nothing.
            let mark = inode_flags::EVICTABLE | inode_flags::NOHISTORY;
            if inode.nlink != 1 || inode.flags & mark != mark {
                return Ok(None);
            }
            let mut bytes = 0;
            for record_type in [rtype::DATA, rtype::PATCH] {
                for (_, value) in tx.range(ino, record_type, 0, u64::MAX, usize::MAX)? {
                    bytes += match value {
                        Value::Extent(extent) => extent.allocated_bytes(),
                        Value::Bytes(inline) => inline.len() as u64,
                    };
                }
            }
            let held = self.held_for_unlink(ino);
            unlink_entry(tx, parent, (slot, &entry, version), held)?;
            Ok(Some((bytes, held)))
        });
        match result {
            // The directory went away or changed kind since: nothing to evict there.
            Err(Error::Posix(_)) => Ok(None),
            other => other,
        }
    }

    /// Finds the files of cache directories by walking the tree (the first eviction after
    /// the volume was opened): ranked by their last modification or access.
    fn scan_evictable(&self) -> Result<()> {
        let mut dirs = vec![ROOT_OBJ];
        let mut found = Vec::new();
        while let Some(dir) = dirs.pop() {
            let evictable = self.getattr(dir)?.flags & inode_flags::EVICTABLE != 0;
            let mut cookie = 0;
            loop {
                let entries = match self.readdir(dir, cookie, 1024) {
                    Ok(entries) => entries,
                    // Removed while the walk ran.
                    Err(Error::Posix(_)) => break,
                    Err(e) => return Err(e),
                };
                let Some(last) = entries.last() else {
                    break;
                };
                cookie = last.cookie;
                for entry in entries {
                    if entry.name == b"." || entry.name == b".." {
                        continue;
                    }
                    match entry.kind {
                        FileKind::Dir => dirs.push(entry.ino),
                        FileKind::File if evictable => found.push((entry.ino, dir, entry.name)),
                        _ => {}
                    }
                }
            }
        }
        let mut noted = Vec::with_capacity(found.len());
        for (ino, dir, name) in found {
            let Ok(attr) = self.getattr(ino) else {
                continue;
            };
            if attr.flags & inode_flags::EVICTABLE != 0 && attr.nlink == 1 {
                let used = nanos(attr.mtime).max(nanos(attr.atime));
                noted.push((ino, dir, name, used));
            }
        }
        let mut tracker = self.evictable.lock();
        tracker.scanned = true;
        for (ino, dir, name, used) in noted {
            tracker.note(ino, dir, &name, Some(used));
        }
        Ok(())
    }
}

fn nanos(t: Timestamp) -> u64 {
    u64::try_from(t.sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::from(t.nsec))
}

/// What a cache directory's file needs for its eviction: the name to unlink and its use.
#[derive(Clone, Debug)]
struct Tracked {
    parent: u64,
    name: Box<[u8]>,
    /// Nanoseconds since the epoch of the last read, write, create or lookup.
    last_use: u64,
    cluster: Option<u64>,
}

/// The tracked files of evictable directories and their clusters (in memory only).
#[derive(Default)]
pub(crate) struct Tracker {
    files: HashMap<u64, Tracked>,
    /// Members of each cluster of two or more tracked files.
    clusters: HashMap<u64, Vec<u64>>,
    next_cluster: u64,
    /// The tree was walked for evictable files since the volume was opened.
    pub(crate) scanned: bool,
    /// Files evicted while something held them: the space their data holds, and when.
    held: HashMap<u64, (u64, Instant)>,
    /// Space of files evicted since the commit of this TID (free after the next one), and
    /// how many files.
    uncommitted: (u64, u64),
    uncommitted_since: u64,
}

/// A unit of eviction: the files of one cluster (or one file alone), with its last use.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Victim {
    pub(crate) last_use: u64,
    pub(crate) files: Vec<u64>,
}

pub(crate) fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

impl Tracker {
    /// Remembers a file of an evictable directory under `parent`/`name`, last used at
    /// `last_use` (None: now, for a file not tracked yet; a lookup is not a use).
    pub(crate) fn note(&mut self, ino: u64, parent: u64, name: &[u8], last_use: Option<u64>) {
        match self.files.get_mut(&ino) {
            Some(t) => {
                t.parent = parent;
                t.name = name.into();
                if let Some(last_use) = last_use {
                    t.last_use = t.last_use.max(last_use);
                }
            }
            None => {
                self.files.insert(
                    ino,
                    Tracked {
                        parent,
                        name: name.into(),
                        last_use: last_use.unwrap_or_else(now_nanos),
                        cluster: None,
                    },
                );
            }
        }
    }

    /// Marks a use of `ino` (nothing if it is not tracked).
    pub(crate) fn touch(&mut self, ino: u64) {
        if let Some(t) = self.files.get_mut(&ino) {
            t.last_use = now_nanos();
        }
    }

    /// Forgets `ino` if its tracked name is `parent`/`name` (it was unlinked or replaced).
    pub(crate) fn forget_name(&mut self, parent: u64, name: &[u8], ino: u64) {
        let named = self
            .files
            .get(&ino)
            .is_some_and(|t| t.parent == parent && *t.name == *name);
        if named {
            self.forget(ino);
        }
    }

    pub(crate) fn forget(&mut self, ino: u64) {
        self.leave_cluster(ino);
        self.files.remove(&ino);
    }

    /// Takes `ino` out of its cluster; a cluster left with one member is dissolved.
    fn leave_cluster(&mut self, ino: u64) {
        let Some(cluster) = self.files.get_mut(&ino).and_then(|t| t.cluster.take()) else {
            return;
        };
        let Some(members) = self.clusters.get_mut(&cluster) else {
            return;
        };
        members.retain(|&m| m != ino);
        if members.len() < 2 {
            for m in std::mem::take(members) {
                if let Some(t) = self.files.get_mut(&m) {
                    t.cluster = None;
                }
            }
            self.clusters.remove(&cluster);
        }
    }

    /// `ino` was evicted while held: its `bytes` come back when it is let go.
    pub(crate) fn evicted_while_held(&mut self, ino: u64, bytes: u64) {
        self.held.insert(ino, (bytes, Instant::now()));
    }

    /// `ino` was let go; whether it was an evicted file (its space returns at the next
    /// commit).
    pub(crate) fn returned(&mut self, ino: u64) -> bool {
        self.held.remove(&ino).is_some()
    }

    /// Space of evicted files expected back soon, the volume's last commit being
    /// `committed`: deleted since it, or held when deleted (held ones are forgotten after a
    /// while: a process may keep one open for as long as it likes).
    pub(crate) fn coming_bytes(&mut self, committed: u64) -> u64 {
        if committed != self.uncommitted_since {
            self.uncommitted = (0, 0);
            self.uncommitted_since = committed;
        }
        if !self.held.is_empty() {
            self.held
                .retain(|_, (_, when)| when.elapsed() < RETURN_EXPECTED);
        }
        self.uncommitted.0 + self.held.values().map(|(bytes, _)| bytes).sum::<u64>()
    }

    /// Files evicted since the last commit (their deletes are in memory).
    fn uncommitted_files(&self) -> u64 {
        self.uncommitted.1
    }

    /// Records clusters a commit wrote (the objects whose data share one run); those of
    /// their members that are tracked become one unit of eviction.
    pub(crate) fn add_clusters(&mut self, clusters: Vec<Vec<u64>>) {
        for objects in clusters {
            let members: Vec<u64> = objects
                .into_iter()
                .filter(|o| self.files.contains_key(o))
                .collect();
            if members.len() < 2 {
                continue;
            }
            // A file rewritten later belongs to its latest cluster only.
            for &m in &members {
                self.leave_cluster(m);
            }
            let id = self.next_cluster;
            self.next_cluster += 1;
            for &m in &members {
                if let Some(t) = self.files.get_mut(&m) {
                    t.cluster = Some(id);
                }
            }
            self.clusters.insert(id, members);
        }
    }

    /// The directory and name `ino` is tracked under.
    pub(crate) fn name_of(&self, ino: u64) -> Option<(u64, Vec<u8>)> {
        self.files.get(&ino).map(|t| (t.parent, t.name.to_vec()))
    }

    /// Every unit of eviction, least recently used first.
    pub(crate) fn victims(&self) -> Vec<Victim> {
        let mut out: Vec<Victim> = Vec::with_capacity(self.files.len());
        for (&ino, t) in &self.files {
            if t.cluster.is_none() {
                out.push(Victim {
                    last_use: t.last_use,
                    files: vec![ino],
                });
            }
        }
        for members in self.clusters.values() {
            let last_use = members
                .iter()
                .filter_map(|m| self.files.get(m).map(|t| t.last_use))
                .max()
                .unwrap_or(0);
            out.push(Victim {
                last_use,
                files: members.clone(),
            });
        }
        out.sort_unstable_by(|a, b| a.last_use.cmp(&b.last_use).then(a.files.cmp(&b.files)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_go_whole_and_the_least_recently_used_first() {
        let mut t = Tracker::default();
        for ino in 10..16 {
            t.note(ino, 1, format!("f{ino}").as_bytes(), Some(ino * 100));
        }
        // 10, 11, 12 written together; 99 is not tracked and is left out.
        t.add_clusters(vec![vec![10, 11, 12, 99], vec![13]]);
        // A use of 12 keeps its whole cluster: 13 goes first, then 14, 15, then the cluster.
        t.touch(12);
        let order: Vec<Vec<u64>> = t.victims().iter().map(|v| v.files.clone()).collect();
        assert_eq!(order, vec![vec![13], vec![14], vec![15], vec![10, 11, 12]]);
        // A file deleted leaves its cluster; a cluster of one is a file alone again.
        t.forget_name(1, b"f10", 10);
        t.forget_name(1, b"other", 11); // another name: kept
        t.forget(12);
        assert!(t.victims().iter().all(|v| v.files.len() == 1));
        assert_eq!(t.files.len(), 4);
        // Rewritten into a new cluster: it leaves the old one.
        t.add_clusters(vec![vec![13, 14], vec![14, 15]]);
        let sizes: Vec<usize> = t.victims().iter().map(|v| v.files.len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 4);
        assert!(sizes.contains(&2), "{sizes:?}");
        assert_eq!(t.clusters.values().map(Vec::len).sum::<usize>(), 2);
    }
}
