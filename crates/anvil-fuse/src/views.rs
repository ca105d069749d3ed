//! Read-only views in the mount: `name@@<spec>` reaches any object as of a TID, a time or
//! a snapshot label, and everything below it inherits that TID; `.snapshots/<label>` at the
//! root is the whole volume as of each snapshot. Views have their own inode numbers (above
//! `VIEW_INO_BASE`), are immutable (long kernel TTLs are always right), and refuse writes
//! with EROFS.

use super::AnvilFuse;
use anvil::format::record::ROOT_OBJ;
use anvil::sync::Mutex;
use anvil::{Attr, DirEntry, Error, FileKind};
use std::collections::HashMap;

/// Inode numbers from here up are views, never objects (object ids never get this high).
pub const VIEW_INO_BASE: u64 = 1 << 62;
/// The `.snapshots` directory at the mount root.
pub const SNAPDIR_INO: u64 = VIEW_INO_BASE;
pub const SNAPDIR_NAME: &[u8] = b".snapshots";
/// Separates a name from its as-of specification, as in HAMMER.
pub const AS_OF_SEPARATOR: &str = "@@";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Live(u64),
    AsOf { obj: u64, tid: u64 },
    SnapDir,
}

#[derive(Default)]
pub struct Views {
    inner: Mutex<ViewMap>,
    /// Set when the whole mount is a view (`anvil mount --as-of`): inode 1 is the root as of
    /// this TID.
    root_tid: Option<u64>,
}

#[derive(Default)]
struct ViewMap {
    by_key: HashMap<(u64, u64), u64>,
    by_ino: HashMap<u64, (u64, u64)>,
    next: u64,
}

impl Views {
    /// Views for a mount whose root is the volume as of `tid`.
    pub fn as_of(tid: u64) -> Views {
        let views = Views {
            inner: Mutex::default(),
            root_tid: Some(tid),
        };
        {
            let mut map = views.inner.lock();
            map.by_key.insert((ROOT_OBJ, tid), ROOT_OBJ);
            map.by_ino.insert(ROOT_OBJ, (ROOT_OBJ, tid));
        }
        views
    }

    pub fn ino_for(&self, obj: u64, tid: u64) -> u64 {
        let mut map = self.inner.lock();
        if let Some(ino) = map.by_key.get(&(obj, tid)) {
            return *ino;
        }
        map.next += 1;
        let ino = VIEW_INO_BASE + map.next;
        map.by_key.insert((obj, tid), ino);
        map.by_ino.insert(ino, (obj, tid));
        ino
    }

    /// What an inode number stands for; None for a view the kernel has already forgotten.
    pub fn target(&self, ino: u64) -> Option<Target> {
        if let (Some(tid), ROOT_OBJ) = (self.root_tid, ino) {
            return Some(Target::AsOf { obj: ROOT_OBJ, tid });
        }
        if ino < VIEW_INO_BASE {
            return Some(Target::Live(ino));
        }
        if ino == SNAPDIR_INO {
            return Some(Target::SnapDir);
        }
        let map = self.inner.lock();
        map.by_ino
            .get(&ino)
            .map(|&(obj, tid)| Target::AsOf { obj, tid })
    }

    /// Every view inode the kernel may have cached.
    pub fn all_inos(&self) -> Vec<u64> {
        self.inner.lock().by_ino.keys().copied().collect()
    }

    pub fn forget(&self, ino: u64) {
        if ino == ROOT_OBJ {
            return;
        }
        let mut map = self.inner.lock();
        if let Some(key) = map.by_ino.remove(&ino) {
            map.by_key.remove(&key);
        }
    }
}

pub fn is_view(ino: u64) -> bool {
    ino >= VIEW_INO_BASE
}

/// Splits `name@@spec`; None for names without the separator.
pub fn split_as_of(name: &[u8]) -> Option<(&[u8], &str)> {
    let text = std::str::from_utf8(name).ok()?;
    let at = text.rfind(AS_OF_SEPARATOR)?;
    Some((&name[..at], &text[at + AS_OF_SEPARATOR.len()..]))
}

impl AnvilFuse {
    pub(crate) fn target(&self, ino: u64) -> anvil::Result<Target> {
        self.views.target(ino).ok_or(Error::Posix(libc::ESTALE))
    }

    fn view_attr(&self, obj: u64, tid: u64) -> anvil::Result<Attr> {
        let mut attr = self.fs.at(tid)?.getattr(obj)?;
        attr.ino = self.views.ino_for(obj, tid);
        Ok(attr)
    }

    fn snapdir_attr(&self) -> anvil::Result<Attr> {
        let mut attr = self.fs.getattr(ROOT_OBJ)?;
        attr.ino = SNAPDIR_INO;
        attr.mode = libc::S_IFDIR | 0o555;
        attr.nlink = 2;
        attr.size = self.fs.snapshots()?.len() as u64;
        Ok(attr)
    }

    fn resolve_spec(&self, spec: &str) -> anvil::Result<u64> {
        self.fs
            .resolve_as_of(spec)
            .inspect_err(|e| log::info!("as-of {spec:?}: {e}"))
    }

    /// Attributes of any target.
    pub(crate) fn attr_of(&self, target: Target) -> anvil::Result<Attr> {
        match target {
            Target::Live(ino) => self.fs.getattr(ino),
            Target::AsOf { obj, tid } => self.view_attr(obj, tid),
            Target::SnapDir => self.snapdir_attr(),
        }
    }

    /// Lookup in any directory, handling `@@` and `.snapshots`.
    pub(crate) fn lookup_any(&self, parent: u64, name: &[u8]) -> anvil::Result<Attr> {
        match self.target(parent)? {
            Target::Live(dir) => {
                if dir == ROOT_OBJ && name == SNAPDIR_NAME {
                    return self.snapdir_attr();
                }
                match self.fs.lookup(dir, name) {
                    Err(Error::Posix(libc::ENOENT)) => {}
                    other => return other,
                }
                let Some((base, spec)) = split_as_of(name) else {
                    return Err(Error::Posix(libc::ENOENT));
                };
                let tid = self
                    .resolve_spec(spec)
                    .map_err(|_| Error::Posix(libc::ENOENT))?;
                let view = self.fs.at(tid)?;
                let obj = if base.is_empty() {
                    dir
                } else {
                    view.lookup(dir, base)?.ino
                };
                self.view_attr(obj, tid)
            }
            Target::AsOf { obj, tid } => {
                let (base, tid) = match split_as_of(name) {
                    Some((base, spec)) => (
                        base,
                        self.resolve_spec(spec)
                            .map_err(|_| Error::Posix(libc::ENOENT))?,
                    ),
                    None => (name, tid),
                };
                let child = self.fs.at(tid)?.lookup(obj, base)?.ino;
                self.view_attr(child, tid)
            }
            Target::SnapDir => {
                let text = String::from_utf8_lossy(name);
                let snapshot = self
                    .fs
                    .snapshots()?
                    .into_iter()
                    .find(|s| snapshot_name(s) == text)
                    .ok_or(Error::Posix(libc::ENOENT))?;
                self.view_attr(ROOT_OBJ, snapshot.tid)
            }
        }
    }

    /// Directory listing of a view (entries carry view inode numbers).
    pub(crate) fn readdir_view(
        &self,
        target: Target,
        cookie: u64,
        limit: usize,
    ) -> anvil::Result<Vec<DirEntry>> {
        match target {
            Target::Live(ino) => self.fs.readdir(ino, cookie, limit),
            Target::AsOf { obj, tid } => {
                let mut entries = self.fs.at(tid)?.readdir(obj, cookie, limit)?;
                for entry in &mut entries {
                    entry.ino = self.views.ino_for(entry.ino, tid);
                }
                Ok(entries)
            }
            Target::SnapDir => {
                let mut out = Vec::new();
                let dots: [(&[u8], u64); 2] = [(b".", SNAPDIR_INO), (b"..", ROOT_OBJ)];
                for (i, (name, ino)) in dots.into_iter().enumerate() {
                    if cookie <= i as u64 {
                        out.push(DirEntry {
                            name: name.to_vec(),
                            ino,
                            kind: FileKind::Dir,
                            cookie: i as u64 + 1,
                        });
                    }
                }
                for (i, snapshot) in self.fs.snapshots()?.into_iter().enumerate() {
                    let entry_cookie = i as u64 + 3;
                    if entry_cookie > cookie && out.len() < limit {
                        out.push(DirEntry {
                            name: snapshot_name(&snapshot).into_bytes(),
                            ino: self.views.ino_for(ROOT_OBJ, snapshot.tid),
                            kind: FileKind::Dir,
                            cookie: entry_cookie,
                        });
                    }
                }
                Ok(out)
            }
        }
    }
}

/// A snapshot's name in `.snapshots/`: its label, or its TID when it has none.
pub fn snapshot_name(snapshot: &anvil::fs::SnapshotInfo) -> String {
    if snapshot.label.is_empty() {
        format!("{:#018x}", snapshot.tid)
    } else {
        snapshot.label.clone()
    }
}

impl AnvilFuse {
    /// Tells the kernel that views changed (a snapshot came or went, history was pruned):
    /// the snapshot directory's listing, the removed names, and, after a prune, every
    /// view's attributes and cached pages. Done before the request that changed them is
    /// answered, so the caller never sees stale views. Safe inside a request: these
    /// notifications lock only `.snapshots` and view inodes, never the root the control
    /// request holds.
    pub(crate) fn invalidate_views(&self, removed_names: Vec<String>, all_views: bool) {
        let Some(notifier) = self.notifier.get() else {
            return;
        };
        notifier.inval_inode(SNAPDIR_INO);
        for name in removed_names {
            notifier.inval_entry(SNAPDIR_INO, &name);
        }
        if all_views {
            for ino in self.views.all_inos() {
                notifier.inval_inode(ino);
            }
        }
    }
}
