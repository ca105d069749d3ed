//! Read-only views of the filesystem as of a committed TID. They read the committed tree only
//! (no pending changes) and never take the state lock across I/O.

use super::{inode_key, list_all, read_all, Attr, DirEntry, FileKind, Filesystem, HASH_SLOT_COUNT};
use crate::error::{posix, Error, Result};
use crate::format::record::{
    hash_slot_base, kind, patch, rtype, Dirent, Inode, LogicalKey, Xattr, DATA_CHUNK_BYTES,
    HASH_SLOTS, ROOT_OBJ,
};
use crate::volume::{RootRef, Value};
use std::sync::Arc;

/// Holds the root it reads from, so nothing it can reach is freed while it exists.
pub struct AsOf<'a> {
    fs: &'a Filesystem,
    tid: u64,
    root: Arc<RootRef>,
}

impl<'a> AsOf<'a> {
    pub(super) fn new(fs: &'a Filesystem, tid: u64) -> Result<AsOf<'a>> {
        let committed = fs.volume.committed_tid();
        if tid == 0 || tid > committed {
            return Err(Error::Invalid(format!(
                "TID {tid:#018x} is not a committed point (last commit {committed:#018x})"
            )));
        }
        Ok(AsOf {
            fs,
            tid,
            root: fs.volume.root(),
        })
    }

    pub fn tid(&self) -> u64 {
        self.tid
    }

    fn records(
        &self,
        obj: u64,
        record_type: u8,
        lo: u64,
        hi: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Value)>> {
        let lo = LogicalKey {
            obj,
            rtype: record_type,
            key: lo,
        };
        let hi = LogicalKey {
            obj,
            rtype: record_type,
            key: hi,
        };
        Ok(self
            .fs
            .volume
            .range_at(&self.root, self.tid, lo, hi, limit)?
            .into_iter()
            .map(|(lk, v)| (lk.key, v))
            .collect())
    }

    fn bytes(&self, value: &Value) -> Result<Arc<Vec<u8>>> {
        match value {
            Value::Bytes(bytes) => Ok(bytes.clone()),
            Value::Extent(extent) => self.fs.volume.read_extent(extent),
        }
    }

    fn inode(&self, ino: u64) -> Result<Inode> {
        let lk = inode_key(ino);
        match self
            .fs
            .volume
            .range_at(&self.root, self.tid, lk, lk, 1)?
            .first()
        {
            Some((_, value)) => Inode::decode(&self.bytes(value)?),
            None => posix(libc::ENOENT),
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        Ok(Attr::from_inode(ino, &self.inode(ino)?))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        if !self.inode(parent)?.is_dir() {
            return posix(libc::ENOTDIR);
        }
        let base = hash_slot_base(name);
        for (_, value) in self.records(
            parent,
            rtype::DIRENT,
            base,
            base + HASH_SLOTS - 1,
            HASH_SLOT_COUNT,
        )? {
            let entry = Dirent::decode(&self.bytes(&value)?)?;
            if entry.name == name {
                return self.getattr(entry.child);
            }
        }
        posix(libc::ENOENT)
    }

    pub fn readdir(&self, ino: u64, cookie: u64, limit: usize) -> Result<Vec<DirEntry>> {
        let inode = self.inode(ino)?;
        if !inode.is_dir() {
            return posix(libc::ENOTDIR);
        }
        let mut out = Vec::new();
        if cookie < 1 {
            out.push(DirEntry {
                name: b".".to_vec(),
                ino,
                kind: FileKind::Dir,
                cookie: 1,
            });
        }
        if cookie < 2 {
            out.push(DirEntry {
                name: b"..".to_vec(),
                ino: inode.parent_hint,
                kind: FileKind::Dir,
                cookie: 2,
            });
        }
        let want = limit.saturating_sub(out.len());
        // A damaged entry may carry the largest key as its cookie: nothing follows it.
        let Some(from) = cookie.max(2).checked_add(1) else {
            return Ok(out);
        };
        for (key, value) in self.records(ino, rtype::DIRENT, from, u64::MAX, want)? {
            let entry = Dirent::decode(&self.bytes(&value)?)?;
            out.push(DirEntry {
                name: entry.name,
                ino: entry.child,
                kind: FileKind::from_mode(entry.kind),
                cookie: key,
            });
        }
        Ok(out)
    }

    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if inode.is_dir() {
            return posix(libc::EISDIR);
        }
        let end = inode.size.min(offset.saturating_add(size as u64));
        if offset >= end {
            return Ok(Vec::new());
        }
        let lo = (offset / DATA_CHUNK_BYTES + 1) * DATA_CHUNK_BYTES;
        let hi = end.div_ceil(DATA_CHUNK_BYTES) * DATA_CHUNK_BYTES;
        #[expect(
            clippy::cast_possible_truncation,
            reason = "end is at most offset + size, and size is a u32"
        )]
        let mut out = vec![0u8; (end - offset) as usize];
        let (patch_lo, patch_hi) =
            patch::key_range(lo / DATA_CHUNK_BYTES - 1, hi / DATA_CHUNK_BYTES - 1);
        let lk = |rtype, key| LogicalKey {
            obj: ino,
            rtype,
            key,
        };
        let mut patches = super::chunk::PatchesByChunk::new();
        for (lk, value, create_tid) in self.fs.volume.range_versions_at(
            &self.root,
            self.tid,
            lk(rtype::PATCH, patch_lo),
            lk(rtype::PATCH, patch_hi),
            usize::MAX,
        )? {
            let index = patch::split(lk.key).0;
            let bytes = self.bytes(&value)?;
            patches
                .entry(index)
                .or_default()
                .push((lk.key, bytes, create_tid));
        }
        for (key, value) in self.records(ino, rtype::DATA, lo, hi, usize::MAX)? {
            let chunk_start = key - DATA_CHUNK_BYTES;
            let mut bytes = self.bytes(&value)?;
            if let Some(found) = patches.get_mut(&(key / DATA_CHUNK_BYTES - 1)) {
                let mut patched = bytes.to_vec();
                super::chunk::apply_patches(&mut patched, found, ino)?;
                bytes = Arc::new(patched);
            }
            let from = offset.max(chunk_start);
            let to = end.min(chunk_start + bytes.len() as u64);
            if from < to {
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "from..to lies inside out and inside the chunk, both in memory"
                )]
                out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                    &bytes[(from - chunk_start) as usize..(to - chunk_start) as usize],
                );
            }
        }
        Ok(out)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        if self.inode(ino)?.kind() != kind::SYMLINK {
            return posix(libc::EINVAL);
        }
        match self.records(ino, rtype::SYMLINK, 0, 0, 1)?.first() {
            Some((_, value)) => self.bytes(value).map(|b| b.to_vec()),
            None => Err(Error::corrupt(
                "symlink without target",
                format!("object {ino}"),
            )),
        }
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.inode(ino)?;
        let mut names = Vec::new();
        for (_, value) in self.records(ino, rtype::XATTR, 0, u64::MAX, usize::MAX)? {
            names.push(Xattr::decode(&self.bytes(&value)?)?.name);
        }
        Ok(names)
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.inode(ino)?;
        let base = hash_slot_base(name);
        for (_, value) in self.records(
            ino,
            rtype::XATTR,
            base,
            base + HASH_SLOTS - 1,
            HASH_SLOT_COUNT,
        )? {
            let xattr = Xattr::decode(&self.bytes(&value)?)?;
            if xattr.name == name {
                return Ok(xattr.value);
            }
        }
        posix(libc::ENODATA)
    }

    pub fn resolve(&self, path: &str) -> Result<u64> {
        let mut ino = ROOT_OBJ;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            ino = self.lookup(ino, part.as_bytes())?.ino;
        }
        Ok(ino)
    }

    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let ino = self.resolve(path)?;
        read_all(|offset, size| self.read(ino, offset, size))
    }

    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let ino = self.resolve(path)?;
        list_all(|cookie| self.readdir(ino, cookie, 1024))
    }
}
