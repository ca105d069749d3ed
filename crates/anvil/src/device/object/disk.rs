//! A local directory of segment pieces (`cache_dir=`): what was read from the store, and what
//! was uploaded to it, kept on disk so that a remount or a read past the memory cache does
//! not go to the store again. Segments never change, so a piece is valid as long as its file
//! is whole; losing the directory loses nothing. Bounded by bytes, oldest piece out first.

use super::PieceId;
use crate::sync::Mutex;
use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub(super) struct DiskCache {
    dir: PathBuf,
    capacity: u64,
    index: Mutex<Index>,
}

#[derive(Default)]
struct Index {
    sizes: HashMap<PieceId, u64>,
    order: VecDeque<PieceId>,
    bytes: u64,
}

fn name((seq, epoch, piece): PieceId) -> String {
    format!("{seq:016x}-{epoch:016x}-{piece:08x}")
}

fn parse(name: &str) -> Option<PieceId> {
    let mut parts = name.split('-');
    let mut next = || u64::from_str_radix(parts.next()?, 16).ok();
    let id = (next()?, next()?, next()?);
    parts.next().is_none().then_some(id)
}

impl DiskCache {
    /// Opens (or makes) the directory and takes stock of the pieces in it.
    pub(super) fn open(dir: &Path, capacity: u64) -> io::Result<DiskCache> {
        fs::create_dir_all(dir).map_err(|e| {
            io::Error::new(e.kind(), format!("cache directory {}: {e}", dir.display()))
        })?;
        let mut found = Vec::new();
        for entry in fs::read_dir(dir)?.flatten() {
            let file_name = entry.file_name();
            let file_name = file_name.to_string_lossy();
            match parse(&file_name) {
                Some(id) => {
                    let meta = entry.metadata()?;
                    found.push((meta.modified().ok(), id, meta.len()));
                }
                // Half-written pieces of a daemon that died, and strangers.
                None => {
                    let _ = fs::remove_file(entry.path());
                }
            }
        }
        found.sort();
        let cache = DiskCache {
            dir: dir.to_path_buf(),
            capacity,
            index: Mutex::new(Index::default()),
        };
        {
            let mut index = cache.index.lock();
            for (_, id, len) in found {
                index.sizes.insert(id, len);
                index.order.push_back(id);
                index.bytes += len;
            }
        }
        cache.evict();
        Ok(cache)
    }

    /// Piece `id`, if a whole copy of its `len` bytes is here.
    pub(super) fn get(&self, id: PieceId, len: usize) -> Option<Vec<u8>> {
        if self.index.lock().sizes.get(&id) != Some(&(len as u64)) {
            return None;
        }
        match fs::read(self.dir.join(name(id))) {
            Ok(bytes) if bytes.len() == len => Some(bytes),
            _ => {
                self.forget(id);
                None
            }
        }
    }

    /// Bytes `[from, from + out.len())` of piece `id` (of `len` bytes), if a whole copy of
    /// it is here.
    pub(super) fn read_at(&self, id: PieceId, len: u64, from: u64, out: &mut [u8]) -> bool {
        use std::os::unix::fs::FileExt;
        if self.index.lock().sizes.get(&id) != Some(&len) {
            return false;
        }
        let read = fs::File::open(self.dir.join(name(id))).and_then(|f| f.read_exact_at(out, from));
        if read.is_err() {
            self.forget(id);
        }
        read.is_ok()
    }

    /// Keeps a copy of piece `id` (best effort: a full or failing disk only costs reads).
    pub(super) fn put(&self, id: PieceId, bytes: &[u8]) {
        if self.index.lock().sizes.contains_key(&id) || bytes.len() as u64 > self.capacity {
            return;
        }
        let path = self.dir.join(name(id));
        let partial = self.dir.join(format!("{}.partial", name(id)));
        let written = fs::write(&partial, bytes).and_then(|()| fs::rename(&partial, &path));
        if let Err(e) = written {
            log::debug!("cache directory {}: {e}", self.dir.display());
            let _ = fs::remove_file(&partial);
            return;
        }
        {
            let mut index = self.index.lock();
            index.sizes.insert(id, bytes.len() as u64);
            index.order.push_back(id);
            index.bytes += bytes.len() as u64;
        }
        self.evict();
    }

    fn forget(&self, id: PieceId) {
        let mut index = self.index.lock();
        if let Some(len) = index.sizes.remove(&id) {
            index.bytes -= len;
            let _ = fs::remove_file(self.dir.join(name(id)));
        }
    }

    fn evict(&self) {
        let mut index = self.index.lock();
        while index.bytes > self.capacity {
            let Some(id) = index.order.pop_front() else {
                break;
            };
            if let Some(len) = index.sizes.remove(&id) {
                index.bytes -= len;
                let _ = fs::remove_file(self.dir.join(name(id)));
            }
        }
    }

    pub(super) fn bytes(&self) -> u64 {
        self.index.lock().bytes
    }
}
