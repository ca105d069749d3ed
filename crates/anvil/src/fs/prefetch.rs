//! The engine's background thread: read-ahead of files read in sequence, and folds of
//! chunks whose patches passed their soft bounds.
//!
//! With O_DIRECT on the device nothing below the engine reads ahead, so a file read front to
//! back would wait for the device on every request. `Filesystem::read` reports each read
//! here; when a file's reads move forward, the thread reads, verifies and decodes the
//! extents ahead of the reader into the engine's cache, overlapping device I/O with the
//! transport. The window starts at four times the request and doubles with every request
//! that continues the stream, up to 4 MiB, as the kernel's own read-ahead ramps up. A read
//! that reaches the range the thread is reading waits for it (briefly) instead of reading
//! the same extents from the device a second time. Random reads (anything that jumps back
//! or far ahead) start nothing.
//!
//! A small write that leaves a chunk with many patches asks for a fold (`chunk::fold`):
//! reading the chunk and its patches back from the device is done here, not while the
//! writer waits. Both kinds of job are dropped, never waited for, when the queue is full:
//! a skipped read-ahead costs a wait later, a skipped fold is done by the write that
//! reaches the hard bound.

use super::chunk;
use crate::format::record::{rtype, Inode, LogicalKey, DATA_CHUNK_BYTES};
use crate::volume::{Value, Volume};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Reads this far ahead of a sequential reader at most, and at least this far.
const AHEAD_BYTES_MAX: u64 = 4 << 20;
const AHEAD_BYTES_MIN: u64 = 256 << 10;
/// A read counts as sequential if it starts within this distance after the previous end
/// (the kernel's read-ahead requests can arrive slightly out of order).
const SLACK_BYTES: u64 = 1 << 20;
/// Files followed at once; more forget them all.
const STREAMS_MAX: usize = 1024;
/// Longest a read waits for the read-ahead of its range.
const WAIT_MAX: std::time::Duration = std::time::Duration::from_millis(50);

struct Stream {
    /// End of the last read.
    next: u64,
    /// Where read-ahead has been asked up to.
    ahead: u64,
    /// How far ahead of the reader to read.
    window: u64,
}

/// The read-ahead being done now: object, byte range.
#[derive(Default)]
struct InFlight {
    job: Mutex<Option<(u64, u64, u64)>>,
    done: Condvar,
}

enum Job {
    /// Read `len` bytes of object `ino` from `offset` into the cache.
    ReadAhead { ino: u64, offset: u64, len: u64 },
    /// Fold chunk `index` of object `ino`.
    Fold { ino: u64, index: u64 },
}

pub(super) struct Prefetcher {
    sender: Mutex<Option<SyncSender<Job>>>,
    streams: Mutex<HashMap<u64, Stream>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    in_flight: Arc<InFlight>,
}

impl Prefetcher {
    pub fn start(volume: Arc<Volume>, thread_start: Option<fn()>) -> Prefetcher {
        let (sender, receiver) = sync_channel::<Job>(256);
        let in_flight = Arc::new(InFlight::default());
        let flight = in_flight.clone();
        let thread = std::thread::Builder::new()
            .name("anvil-prefetch".into())
            .spawn(move || {
                if let Some(start) = thread_start {
                    start();
                }
                while let Ok(job) = receiver.recv() {
                    match job {
                        Job::ReadAhead { ino, offset, len } => {
                            *flight.job.lock() = Some((ino, offset, offset + len));
                            if let Err(e) = prefetch(&volume, ino, offset, len) {
                                log::debug!("read-ahead of object {ino} at {offset} stopped: {e}");
                            }
                            *flight.job.lock() = None;
                            flight.done.notify_all();
                        }
                        Job::Fold { ino, index } => {
                            if let Err(e) = super::Filesystem::fold_chunk(&volume, ino, index) {
                                log::debug!("fold of object {ino} chunk {index} failed: {e}");
                            }
                        }
                    }
                }
            })
            .ok();
        Prefetcher {
            sender: Mutex::new(thread.as_ref().map(|_| sender)),
            streams: Mutex::new(HashMap::new()),
            thread: Mutex::new(thread),
            in_flight,
        }
    }

    /// Waits (at most `WAIT_MAX`) while the thread reads ahead a range that overlaps
    /// `[offset, offset + len)` of `ino`: the read then finds its extents in the cache.
    pub fn wait_for(&self, ino: u64, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        let overlaps = |job: &Option<(u64, u64, u64)>| {
            job.is_some_and(|(i, lo, hi)| i == ino && lo < end && offset < hi)
        };
        let mut job = self.in_flight.job.lock();
        if overlaps(&job) {
            self.in_flight
                .done
                .wait_while_for(&mut job, |job| overlaps(job), WAIT_MAX);
        }
    }

    /// Notes a read of `[offset, offset + len)` of `ino` (a file of `size` bytes) and asks
    /// for read-ahead if the file is being read in sequence.
    pub fn note_read(&self, ino: u64, offset: u64, len: u64, size: u64) {
        let request = {
            let mut streams = self.streams.lock();
            if streams.len() >= STREAMS_MAX && !streams.contains_key(&ino) {
                streams.clear();
            }
            let stream = streams.entry(ino).or_insert(Stream {
                next: u64::MAX,
                ahead: 0,
                window: 0,
            });
            let sequential = offset >= stream.next.saturating_sub(len)
                && offset <= stream.next.saturating_add(SLACK_BYTES);
            stream.next = stream.next.max(offset + len);
            if !sequential {
                stream.next = offset + len;
                stream.ahead = 0;
                stream.window = 0;
                return;
            }
            stream.window = match stream.window {
                0 => (4 * len).clamp(AHEAD_BYTES_MIN, AHEAD_BYTES_MAX),
                window => (2 * window).min(AHEAD_BYTES_MAX),
            };
            let window = stream.window;
            let want = stream.next.saturating_add(window).min(size);
            let from = stream.ahead.max(stream.next);
            // Ask again once the reader has used half of what was read ahead.
            if want <= from || stream.ahead > stream.next + window / 2 {
                return;
            }
            stream.ahead = want;
            Job::ReadAhead {
                ino,
                offset: from,
                len: want - from,
            }
        };
        self.send(request);
    }

    /// Asks for chunk `index` of `ino` to be folded.
    pub fn fold_soon(&self, ino: u64, index: u64) {
        self.send(Job::Fold { ino, index });
    }

    fn send(&self, job: Job) {
        if let Some(sender) = self.sender.lock().as_ref() {
            let _ = sender.try_send(job); // a busy thread skips the job, never blocks
        }
    }

    pub fn stop(&self) {
        self.sender.lock().take();
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads the extents of `[offset, offset + len)` of `ino` into the cache.
fn prefetch(volume: &Volume, ino: u64, offset: u64, len: u64) -> crate::Result<()> {
    let (extents, _root) = volume.run(false, |tx| {
        let Some(bytes) = tx.get_bytes(LogicalKey {
            obj: ino,
            rtype: rtype::INODE,
            key: 0,
        })?
        else {
            return Ok((Vec::new(), tx.root()));
        };
        let inode = Inode::decode(&bytes)?;
        let end = inode.size.min(offset.saturating_add(len));
        if offset >= end {
            return Ok((Vec::new(), tx.root()));
        }
        let lo = (offset / DATA_CHUNK_BYTES + 1) * DATA_CHUNK_BYTES;
        let hi = end.div_ceil(DATA_CHUNK_BYTES) * DATA_CHUNK_BYTES;
        let mut found = tx.range_versions(ino, rtype::DATA, lo, hi, usize::MAX)?;
        found.extend(chunk::patches(
            tx,
            ino,
            lo / DATA_CHUNK_BYTES - 1,
            hi / DATA_CHUNK_BYTES - 1,
        )?);
        let extents: Vec<_> = found
            .into_iter()
            .filter_map(|(_, value, _)| match value {
                Value::Extent(extent) => Some(extent),
                Value::Bytes(_) => None,
            })
            .collect();
        // The root keeps the extents from being freed while they are read.
        Ok((extents, tx.root()))
    })?;
    for result in volume.read_extents(&extents) {
        result?;
    }
    Ok(())
}
