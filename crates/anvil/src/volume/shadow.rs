//! The redo log's shadow: a copy of the log region in a file on tmpfs (by default under
//! /dev/shm), where every acknowledged change goes before its call returns.
//!
//! A file on tmpfs outlives the process that wrote it but not the machine, which is exactly
//! the durability a daemon crash needs and a power loss does not: the host keeps the bytes
//! when the daemon is killed, and nothing is ever written to the volume's device for them.
//! Without a shadow, the same appends go to the image's log region through the host's page
//! cache, and the host writes them back to the device: every byte a program writes then
//! reaches the device twice (once logged, once committed), which halved iozone's rewrite
//! rates on a loop device.
//!
//! The shadow holds the ring at the same positions as the log region. `fsync` copies what
//! the image's region lacks (`Volume::sync_log`) and then lets go of the pages the region
//! now holds. Recovery looks for each batch in the shadow first, then in the region: after
//! a daemon crash the two together hold every acknowledged change, after a power loss (or
//! on another machine) the region alone holds what was fsync'd.
//!
//! Memory: the ring uses a quarter of the cache budget of the region when it has a
//! shadow, 4 to 64 MiB (`shadow_ring_bytes`). Between fsyncs the shadow's pages stay allocated, also those a
//! commit made dead, because tmpfs allocating, zeroing and charging a fresh page for every
//! append cost more than the append's copy (64 KiB rewrites took 67 us each instead of
//! 46 us when every commit punched the dead pages out). An fsync frees what it copied, an
//! idle volume (nothing pending for a commit interval) empties the file, a clean close
//! deletes it.
//!
//! A writer maps the file and appends with a memory copy, no system call: a `pwrite` to
//! tmpfs cost a few microseconds per append, on operations that take tens.

use crate::device::file::punch_hole;
use crate::sync::Mutex;
use memmap2::{MmapMut, MmapOptions};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub(crate) struct ShadowLog {
    file: File,
    path: PathBuf,
    /// The file mapped, once a writer knows its ring's size.
    map: Mutex<Option<MmapMut>>,
}

impl ShadowLog {
    /// Opens the shadow at `path`; a writer creates it (readable by its owner only) and its
    /// directory if missing.
    pub fn open(path: &Path, writable: bool) -> io::Result<ShadowLog> {
        if writable {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
        }
        let file = OpenOptions::new()
            .read(true)
            .write(writable)
            .create(writable)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        Ok(ShadowLog {
            file,
            path: path.to_path_buf(),
            map: Mutex::new(None),
        })
    }

    /// Maps the first `bytes` of the file (growing it, sparse, to that size) for appends.
    pub fn map(&self, bytes: u64) -> io::Result<()> {
        if self.file.metadata()?.len() < bytes {
            self.file.set_len(bytes)?;
        }
        let len = usize::try_from(bytes).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: the file is this writer's alone (mode 0600, named by the image whose lock
        // the writer holds) and is never shortened while mapped (`clear` punches holes
        // instead), so no access through the map can fault past its end.
        let map = unsafe { MmapOptions::new().len(len).map_mut(&self.file)? };
        *self.map.lock() = Some(map);
        Ok(())
    }

    /// Writes the `len` bytes at ring position `pos` that `fill` puts in the slice it is
    /// given: in place, in the map, when the span lies inside it (no copy), or else through
    /// a buffer and a write.
    pub fn write_with<T>(
        &self,
        pos: u64,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> T,
    ) -> io::Result<T> {
        if let Some(map) = self.map.lock().as_mut() {
            let start = usize::try_from(pos).ok();
            let end = start.and_then(|s| s.checked_add(len));
            if let Some(span) = start.zip(end).and_then(|(s, e)| map.get_mut(s..e)) {
                return Ok(fill(span));
            }
        }
        let mut buf = vec![0u8; len];
        let filled = fill(&mut buf);
        self.file.write_all_at(&buf, pos)?;
        Ok(filled)
    }

    /// Reads `buf.len()` bytes at ring position `pos`; past the file's end reads zeros, as
    /// a hole does.
    pub fn read_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], pos + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        buf[done..].fill(0);
        Ok(())
    }

    /// Frees the memory of `[lo, hi)` (whole pages inside it); reads there return zeros.
    pub fn forget(&self, lo: u64, hi: u64) {
        if hi > lo {
            if let Err(e) = punch_hole(&self.file, lo, hi - lo) {
                log::debug!("{}: cannot punch [{lo}, {hi}): {e}", self.path.display());
            }
        }
    }

    /// Empties the shadow (its batches are dead: committed, or of an older writer).
    pub fn clear(&self) -> io::Result<()> {
        match self.map.lock().as_ref() {
            // Mapped: keep the size, or the map would reach past the file's end.
            Some(map) => punch_hole(&self.file, 0, map.len() as u64),
            None => self.file.set_len(0),
        }
    }

    /// Deletes the file: everything it held is committed.
    pub fn remove(&self) {
        match std::fs::remove_file(&self.path) {
            // A second close (a mount closes the volume when the session ends, then again
            // as it exits).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => log::warn!("cannot remove {}: {e}", self.path.display()),
            Ok(()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_in_place_mapped_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let shadow = ShadowLog::open(&dir.path().join("ring.log"), true).unwrap();
        // Not mapped yet: through a buffer and a write.
        let filled = shadow
            .write_with(4096, 8, |span| {
                span.copy_from_slice(b"unmapped");
                7
            })
            .unwrap();
        assert_eq!(filled, 7);
        let mut back = [0u8; 8];
        shadow.read_at(&mut back, 4096).unwrap();
        assert_eq!(&back, b"unmapped");
        // Mapped: in place, and what the map holds is what the file reads.
        shadow.map(1 << 20).unwrap();
        shadow
            .write_with(8192, 6, |span| span.copy_from_slice(b"mapped"))
            .unwrap();
        let mut back = [0u8; 6];
        shadow.read_at(&mut back, 8192).unwrap();
        assert_eq!(&back, b"mapped");
        // A span past the map's end still lands, through the file.
        shadow
            .write_with((1 << 20) - 2, 4, |span| span.copy_from_slice(b"edge"))
            .unwrap();
        let mut back = [0u8; 4];
        shadow.read_at(&mut back, (1 << 20) - 2).unwrap();
        assert_eq!(&back, b"edge");
        // Forgotten pages read as zeros.
        shadow.forget(0, 1 << 20);
        shadow.read_at(&mut back, 8192).unwrap();
        assert_eq!(back, [0; 4]);
    }
}
