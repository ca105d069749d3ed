//! A trivial in-memory file system served through the same transports as the volume
//! (`anvil memfs DIR`). It does the least a backend can: one map under one lock, no
//! history, no durability. What it reaches through a transport is that transport's
//! ceiling, the figure anvil's own cost is measured against (docs/benchmarks.md).

use crate::{Backend, Counters, EntryPlus, Notifier, Reply};
use anvil::fs::{Caller, SetAttr, StatFs, Time as Timestamp, TimeSet};
use anvil::sync::Mutex;
use anvil::{Attr, DirEntry, FileKind};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const ROOT: u64 = 1;

struct Node {
    attr: Attr,
    data: Vec<u8>,
    children: Children,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

struct State {
    nodes: HashMap<u64, Node>,
    next: u64,
}

/// A directory's entries. A listing resumes at a cookie that stays valid while entries
/// come and go (each entry's cookie is its insertion sequence), so a program that removes
/// what it lists, as `rm -r` does, sees every entry once.
#[derive(Default)]
struct Children {
    by_name: HashMap<Vec<u8>, (u64, u64)>,
    by_seq: BTreeMap<u64, Vec<u8>>,
    next_seq: u64,
}

impl Children {
    fn get(&self, name: &[u8]) -> Option<&u64> {
        self.by_name.get(name).map(|(_, ino)| ino)
    }

    fn contains_key(&self, name: &[u8]) -> bool {
        self.by_name.contains_key(name)
    }

    fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// Adds or replaces `name`; returns the inode it named before.
    fn insert(&mut self, name: Vec<u8>, ino: u64) -> Option<u64> {
        let old = self.remove(&name);
        self.next_seq += 1;
        self.by_seq.insert(self.next_seq, name.clone());
        self.by_name.insert(name, (self.next_seq, ino));
        old
    }

    fn remove(&mut self, name: &[u8]) -> Option<u64> {
        let (seq, ino) = self.by_name.remove(name)?;
        self.by_seq.remove(&seq);
        Some(ino)
    }

    /// The entries after `cookie` (0: from the start), each with its own cookie.
    fn after(&self, cookie: u64) -> impl Iterator<Item = (u64, &Vec<u8>, u64)> {
        self.by_seq
            .range(cookie.saturating_add(1)..)
            .map(|(&seq, name)| (seq, name, self.by_name[name].1))
    }
}

pub struct MemFs {
    state: Mutex<State>,
    counters: Counters,
    ttl: Duration,
    writeback: bool,
}

fn kind_of(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::File,
    }
}

fn new_attr(ino: u64, caller: Caller, mode: u32, rdev: u64) -> Attr {
    let now = Timestamp::now();
    Attr {
        ino,
        kind: kind_of(mode),
        mode,
        nlink: if mode & libc::S_IFMT == libc::S_IFDIR {
            2
        } else {
            1
        },
        uid: caller.uid,
        gid: caller.gid,
        size: 0,
        blocks: 0,
        rdev,
        atime: now,
        mtime: now,
        ctime: now,
        btime: now,
        flags: 0,
    }
}

impl MemFs {
    pub fn new(ttl: Duration, writeback: bool) -> MemFs {
        let root = Node {
            attr: new_attr(ROOT, Caller { uid: 0, gid: 0 }, libc::S_IFDIR | 0o755, 0),
            data: Vec::new(),
            children: Children::default(),
            xattrs: BTreeMap::new(),
        };
        MemFs {
            state: Mutex::new(State {
                nodes: HashMap::from([(ROOT, root)]),
                next: ROOT + 1,
            }),
            counters: Counters::default(),
            ttl,
            writeback,
        }
    }

    fn create(
        &self,
        caller: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Reply<Attr> {
        let mut st = self.state.lock();
        let dir = st.nodes.get(&parent).ok_or(libc::ENOENT)?;
        if dir.attr.kind != FileKind::Dir {
            return Err(libc::ENOTDIR);
        }
        if dir.children.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = st.next;
        st.next += 1;
        let attr = new_attr(ino, caller, mode, rdev);
        let node = Node {
            attr: attr.clone(),
            data: Vec::new(),
            children: Children::default(),
            xattrs: BTreeMap::new(),
        };
        st.nodes.insert(ino, node);
        let dir = st.nodes.get_mut(&parent).ok_or(libc::ENOENT)?;
        dir.children.insert(name.to_vec(), ino);
        dir.attr.mtime = Timestamp::now();
        dir.attr.ctime = dir.attr.mtime;
        if attr.kind == FileKind::Dir {
            dir.attr.nlink += 1;
        }
        Ok(attr)
    }

    fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Reply<()> {
        let mut st = self.state.lock();
        let ino = *st
            .nodes
            .get(&parent)
            .and_then(|d| d.children.get(name))
            .ok_or(libc::ENOENT)?;
        let node = st.nodes.get(&ino).ok_or(libc::ENOENT)?;
        match (dir, node.attr.kind == FileKind::Dir) {
            (true, false) => return Err(libc::ENOTDIR),
            (false, true) => return Err(libc::EISDIR),
            (true, true) if !node.children.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        let node = st.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
        node.attr.nlink = node.attr.nlink.saturating_sub(if dir { 2 } else { 1 });
        if node.attr.nlink == 0 {
            st.nodes.remove(&ino);
        }
        let parent = st.nodes.get_mut(&parent).ok_or(libc::ENOENT)?;
        parent.children.remove(name);
        if dir {
            parent.attr.nlink -= 1;
        }
        Ok(())
    }

    fn with<T>(&self, ino: u64, f: impl FnOnce(&mut Node) -> Reply<T>) -> Reply<T> {
        let mut st = self.state.lock();
        f(st.nodes.get_mut(&ino).ok_or(libc::ENOENT)?)
    }
}

fn set_time(t: TimeSet) -> Timestamp {
    match t {
        TimeSet::Now => Timestamp::now(),
        TimeSet::At(t) => t,
    }
}

impl Backend for MemFs {
    fn counters(&self) -> &Counters {
        &self.counters
    }

    fn set_notifier(&self, _notifier: Notifier) {}

    fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Every name appears through a request.
    fn negative_ttl(&self, _parent: u64, _name: &[u8]) -> Duration {
        self.ttl
    }

    fn writeback(&self) -> bool {
        self.writeback
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Reply<Attr> {
        let st = self.state.lock();
        let ino = st
            .nodes
            .get(&parent)
            .ok_or(libc::ENOENT)?
            .children
            .get(name)
            .ok_or(libc::ENOENT)?;
        Ok(st.nodes.get(ino).ok_or(libc::ENOENT)?.attr.clone())
    }

    fn forget(&self, _ino: u64, _nlookup: u64) {}

    fn getattr(&self, ino: u64) -> Reply<Attr> {
        self.with(ino, |n| Ok(n.attr.clone()))
    }

    fn setattr(&self, _uid: u32, ino: u64, c: &SetAttr) -> Reply<Attr> {
        self.with(ino, |n| {
            if let Some(mode) = c.mode {
                n.attr.mode = (n.attr.mode & libc::S_IFMT) | (mode & 0o7777);
            }
            if let Some(uid) = c.uid {
                n.attr.uid = uid;
            }
            if let Some(gid) = c.gid {
                n.attr.gid = gid;
            }
            if let Some(size) = c.size {
                n.data
                    .resize(usize::try_from(size).map_err(|_| libc::EFBIG)?, 0);
                n.attr.size = size;
                n.attr.mtime = Timestamp::now();
            }
            if let Some(t) = c.atime {
                n.attr.atime = set_time(t);
            }
            if let Some(t) = c.mtime {
                n.attr.mtime = set_time(t);
            }
            n.attr.ctime = c.ctime.unwrap_or_else(Timestamp::now);
            Ok(n.attr.clone())
        })
    }

    fn readlink(&self, ino: u64) -> Reply<Vec<u8>> {
        self.with(ino, |n| Ok(n.data.clone()))
    }

    fn mknod(&self, caller: Caller, parent: u64, name: &[u8], mode: u32, rdev: u64) -> Reply<Attr> {
        self.create(caller, parent, name, mode, rdev)
    }

    fn mkdir(&self, caller: Caller, parent: u64, name: &[u8], mode: u32) -> Reply<Attr> {
        self.create(caller, parent, name, libc::S_IFDIR | (mode & 0o7777), 0)
    }

    fn unlink(&self, parent: u64, name: &[u8]) -> Reply<()> {
        self.remove(parent, name, false)
    }

    fn rmdir(&self, parent: u64, name: &[u8]) -> Reply<()> {
        self.remove(parent, name, true)
    }

    fn symlink(&self, caller: Caller, parent: u64, name: &[u8], target: &[u8]) -> Reply<Attr> {
        let attr = self.create(caller, parent, name, libc::S_IFLNK | 0o777, 0)?;
        self.with(attr.ino, |n| {
            n.data = target.to_vec();
            n.attr.size = target.len() as u64;
            Ok(n.attr.clone())
        })
    }

    fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Reply<()> {
        if flags != 0 {
            return Err(libc::EINVAL);
        }
        let mut st = self.state.lock();
        let ino = st
            .nodes
            .get_mut(&parent)
            .ok_or(libc::ENOENT)?
            .children
            .remove(name)
            .ok_or(libc::ENOENT)?;
        let target = st.nodes.get_mut(&new_parent).ok_or(libc::ENOENT)?;
        if let Some(old) = target.children.insert(new_name.to_vec(), ino) {
            st.nodes.remove(&old);
        }
        Ok(())
    }

    fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Reply<Attr> {
        let mut st = self.state.lock();
        let dir = st.nodes.get_mut(&new_parent).ok_or(libc::ENOENT)?;
        if dir.children.contains_key(new_name) {
            return Err(libc::EEXIST);
        }
        dir.children.insert(new_name.to_vec(), ino);
        let node = st.nodes.get_mut(&ino).ok_or(libc::ENOENT)?;
        node.attr.nlink += 1;
        Ok(node.attr.clone())
    }

    fn read(&self, ino: u64, offset: u64, size: u32) -> Reply<Vec<u8>> {
        self.with(ino, |n| {
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(n.data.len());
            let end = start.saturating_add(size as usize).min(n.data.len());
            Ok(n.data[start..end].to_vec())
        })
    }

    fn write(&self, ino: u64, offset: u64, data: &[u8], _kill_suidgid: bool) -> Reply<usize> {
        self.with(ino, |n| {
            let start = usize::try_from(offset).map_err(|_| libc::EFBIG)?;
            let end = start.checked_add(data.len()).ok_or(libc::EFBIG)?;
            if n.data.len() < end {
                n.data.resize(end, 0);
            }
            n.data[start..end].copy_from_slice(data);
            n.attr.size = n.data.len() as u64;
            n.attr.blocks = n.attr.size.div_ceil(512);
            n.attr.mtime = Timestamp::now();
            n.attr.ctime = n.attr.mtime;
            Ok(data.len())
        })
    }

    fn fsync(&self, _ino: u64) -> Reply<()> {
        Ok(())
    }

    fn readdir(&self, ino: u64, offset: u64) -> Reply<Vec<DirEntry>> {
        let st = self.state.lock();
        let dir = st.nodes.get(&ino).ok_or(libc::ENOENT)?;
        Ok(dir
            .children
            .after(offset)
            .take(256)
            .filter_map(|(cookie, name, child)| {
                let kind = st.nodes.get(&child)?.attr.kind;
                Some(DirEntry {
                    name: name.clone(),
                    ino: child,
                    kind,
                    cookie,
                })
            })
            .collect())
    }

    fn readdirplus(&self, ino: u64, offset: u64) -> Reply<Vec<EntryPlus>> {
        let entries = self.readdir(ino, offset)?;
        let st = self.state.lock();
        Ok(entries
            .into_iter()
            .filter_map(|entry| {
                let attr = st.nodes.get(&entry.ino)?.attr.clone();
                Some(EntryPlus {
                    entry,
                    attr,
                    ttl: self.ttl,
                })
            })
            .collect())
    }

    fn remember_entry(&self, _entry: &EntryPlus) {}

    fn statfs(&self) -> StatFs {
        StatFs {
            block_bytes: 4096,
            blocks: 1 << 20,
            blocks_free: 1 << 20,
            blocks_available: 1 << 20,
            files: 1 << 20,
            files_free: 1 << 20,
            name_bytes_max: 255,
        }
    }

    fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], _flags: i32) -> Reply<()> {
        if name == crate::REQUESTS_XATTR.as_bytes() {
            self.counters.reset();
            return Ok(());
        }
        self.with(ino, |n| {
            n.xattrs.insert(name.to_vec(), value.to_vec());
            Ok(())
        })
    }

    fn getxattr(&self, ino: u64, name: &[u8]) -> Reply<Vec<u8>> {
        if name == crate::REQUESTS_XATTR.as_bytes() {
            return Ok(self.counters.to_json().into_bytes());
        }
        self.with(ino, |n| n.xattrs.get(name).cloned().ok_or(libc::ENODATA))
    }

    fn listxattr(&self, ino: u64) -> Reply<Vec<u8>> {
        self.with(ino, |n| {
            let mut out = Vec::new();
            for name in n.xattrs.keys() {
                out.extend_from_slice(name);
                out.push(0);
            }
            Ok(out)
        })
    }

    fn removexattr(&self, ino: u64, name: &[u8]) -> Reply<()> {
        self.with(ino, |n| {
            n.xattrs.remove(name).map(|_| ()).ok_or(libc::ENODATA)
        })
    }

    fn access(&self, ino: u64) -> Reply<()> {
        self.getattr(ino).map(|_| ())
    }

    fn fallocate(&self, _ino: u64, _offset: u64, _length: u64, _mode: i32) -> Reply<()> {
        Err(libc::EOPNOTSUPP)
    }

    fn destroy(&self) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;

    #[test]
    fn a_listing_that_removes_what_it_lists_sees_every_entry() {
        let fs = MemFs::new(Duration::ZERO, false);
        let caller = Caller { uid: 0, gid: 0 };
        for i in 0..1000 {
            let name = format!("f{i:04}");
            fs.mknod(caller, ROOT, name.as_bytes(), libc::S_IFREG | 0o644, 0)
                .unwrap();
        }
        // As `rm -r` does: list a batch, remove it, go on from the last cookie.
        let (mut cookie, mut seen) = (0, 0);
        loop {
            let batch = fs.readdir(ROOT, cookie).unwrap();
            let Some(last) = batch.last() else { break };
            cookie = last.cookie;
            for entry in &batch {
                fs.unlink(ROOT, &entry.name).unwrap();
                seen += 1;
            }
        }
        assert_eq!(seen, 1000);
        assert!(fs.readdir(ROOT, 0).unwrap().is_empty());
        // A name removed and made again is listed once, after the others.
        fs.mknod(caller, ROOT, b"a", libc::S_IFREG | 0o644, 0)
            .unwrap();
        fs.mknod(caller, ROOT, b"b", libc::S_IFREG | 0o644, 0)
            .unwrap();
        fs.unlink(ROOT, b"a").unwrap();
        fs.mknod(caller, ROOT, b"a", libc::S_IFREG | 0o644, 0)
            .unwrap();
        let names: Vec<_> = fs
            .readdir(ROOT, 0)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, [b"b".to_vec(), b"a".to_vec()]);
    }
}
