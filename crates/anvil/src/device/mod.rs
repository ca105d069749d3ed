//! The device layer: the one trait through which every persistent byte flows.
//!
//! `write_at` is volatile until `flush` returns: a crash may drop, reorder or tear any write
//! issued since the previous flush. Everything above this layer is written to survive that.

mod crash;
mod fault;
pub(crate) mod file;
mod log;
mod memory;
mod object;
pub mod store;

pub use crash::{CrashDevice, CrashMode};
pub use fault::{Fault, FaultDevice};
pub use file::{FileDevice, IoMode};
pub use log::{LogDevice, LogReader, LogRecord};
pub use memory::{MemDevice, PageSpan, Pages};
pub use object::{ObjectDevice, ObjectOptions, ObjectStats};
pub use store::{BlobStore, MemStore};

use std::io;

/// Persistent byte storage with an explicit durability barrier.
#[allow(clippy::len_without_is_empty)] // a device's length is its size, never "empty"
pub trait Device: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`. Reading past the end is an error.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// `read_at` of a range the caller knows belongs together (a locality set): one
    /// request for exactly these bytes, with nothing read around them.
    fn read_whole_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset)
    }
    /// Writes all of `buf` at `offset`. Not durable until the next `flush` returns.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes the buffers back to back starting at `offset` (one request where the device
    /// supports it). Same durability as `write_at`.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut joined = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
        for buf in bufs {
            joined.extend_from_slice(buf);
        }
        self.write_at(&joined, offset)
    }
    /// `write_at` for bytes that must survive a crash of this process as soon as the call
    /// returns (the redo log): through the host's page cache where the device otherwise
    /// bypasses it, so the call costs a copy, not a device round trip. Durable, like any
    /// write, only after the next `flush`.
    fn write_staged_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)
    }
    /// Buffers back to back from `offset` (one request where the device supports it): file
    /// data written ahead of its commit, in runs of whole chunks. Like `write_staged_at`,
    /// the bytes survive a crash of this process once the call returns; a device that
    /// bypasses the host's cache may write such large runs to the device directly.
    fn write_staged_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            self.write_staged_at(buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    /// A hint after a `flush`: the host may drop what it caches of staged writes to
    /// `[offset, offset + len)` (they are durable; reads of them go to the device).
    fn forget_staged(&self, _offset: u64, _len: u64) {}
    /// What the device did since it was opened, as named counters for `anvil info` (an
    /// object store's uploads and cache; a local file's reads, and how many of them met a
    /// write in flight).
    fn report(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
    /// A read-only device whose writer is elsewhere (an object store's replica): picks up
    /// what that writer flushed since. Returns whether anything changed.
    fn refresh(&self) -> io::Result<bool> {
        Ok(false)
    }
    /// Ordering only: every write that returned before this call becomes durable no later
    /// than any write issued after it (a commit's tree before the superblock that points at
    /// it). A flush is such a barrier, and the default; a device whose writes become
    /// durable in the order issued, such as an object store's segments, need not wait.
    fn barrier(&self) -> io::Result<()> {
        self.flush()
    }
    /// Whether `barrier` costs nothing: writes become durable in the order issued. A commit
    /// on such a device orders its tree before its superblock with a barrier; elsewhere it
    /// writes both together with a manifest of the tree's writes, and makes all of them
    /// durable with the one flush it needs anyway (`format::manifest`).
    fn orders_writes(&self) -> bool {
        false
    }
    /// Barrier: every write that returned before this call is durable when it returns.
    fn flush(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Grows or shrinks the device (files only; block devices refuse).
    fn set_len(&self, len: u64) -> io::Result<()>;
}

/// `len` as the length of an in-memory image, or an error if it exceeds the address space.
pub(crate) fn memory_len(len: u64) -> io::Result<usize> {
    usize::try_from(len).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{len} bytes do not fit in memory"),
        )
    })
}

pub(crate) fn out_of_range(offset: u64, len: usize, size: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("access at {offset}+{len} beyond device end {size}"),
    )
}
