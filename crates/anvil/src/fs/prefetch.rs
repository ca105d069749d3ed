//! The engine's background threads: read-ahead of files read in sequence, and folds of
//! chunks whose patches passed their soft bounds.
//!
//! With O_DIRECT on the device nothing below the engine reads ahead, so a file read front to
//! back would wait for the device on every request. `Filesystem::read` reports each read
//! here; when a file's reads move forward, the threads read, verify and decode the extents
//! ahead of the reader into the engine's cache, overlapping device I/O with the transport.
//! The window starts at four times the request and doubles with every request that
//! continues the stream, up to 4 MiB, as the kernel's own read-ahead ramps up. The window
//! is read in pieces of at most 1 MiB (ending on 1 MiB file offsets) by a small pool of
//! threads, so that the device has a second request while the first one's bytes are
//! verified and copied, and a new piece is asked for as soon as the reader has used one. A
//! read that reaches a piece asked for or being read waits for that piece (briefly) instead
//! of reading the same extents from the device a second time. Random reads (anything that
//! jumps back or far ahead) start nothing.
//!
//! A small write that leaves a chunk with many patches asks for a fold (`chunk::fold`):
//! reading the chunk and its patches back from the device is done here, not while the
//! writer waits. Both kinds of job are dropped, never waited for, when the queue is full:
//! a skipped read-ahead costs a wait later, a skipped fold is done by the write that
//! reaches the hard bound.

use super::chunk;
use crate::format::record::{rtype, Inode, LogicalKey, DATA_CHUNK_BYTES};
use crate::sync::Mutex;
use crate::volume::{Value, Volume};
use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::sync::Condvar;
use std::thread::JoinHandle;

/// Reads this far ahead of a sequential reader at most, and at least this far.
const AHEAD_BYTES_MAX: u64 = 4 << 20;
const AHEAD_BYTES_MIN: u64 = 256 << 10;
/// A read-ahead job covers at most this much of a file, ending on a multiple of it.
const PIECE_BYTES: u64 = 1 << 20;
/// Threads reading ahead (and folding, one fold at a time): two keep the device busy while
/// one verifies.
const THREADS: usize = 2;
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

/// The read-ahead pieces asked for and not yet done: object, byte range.
#[derive(Default)]
struct InFlight {
    pieces: Mutex<Vec<(u64, u64, u64)>>,
    done: Condvar,
}

impl InFlight {
    fn finish(&self, piece: (u64, u64, u64)) {
        let mut pieces = self.pieces.lock();
        if let Some(at) = pieces.iter().position(|&p| p == piece) {
            pieces.swap_remove(at);
        }
        drop(pieces);
        self.done.notify_all();
    }
}

enum Job {
    /// Read `[offset, end)` of object `ino` into the cache.
    ReadAhead { ino: u64, offset: u64, end: u64 },
    /// Fold chunk `index` of object `ino`.
    Fold { ino: u64, index: u64 },
}

pub(super) struct Prefetcher {
    sender: Mutex<Option<SyncSender<Job>>>,
    streams: Mutex<HashMap<u64, Stream>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    in_flight: Arc<InFlight>,
}

impl Prefetcher {
    pub fn start(volume: Arc<Volume>, thread_start: Option<fn()>) -> Prefetcher {
        let (sender, receiver) = sync_channel::<Job>(256);
        let receiver = Arc::new(Mutex::new(receiver));
        let in_flight = Arc::new(InFlight::default());
        let folding = Arc::new(Mutex::new(()));
        let threads: Vec<JoinHandle<()>> = (0..THREADS)
            .filter_map(|i| {
                let (volume, receiver, flight, folding) = (
                    volume.clone(),
                    receiver.clone(),
                    in_flight.clone(),
                    folding.clone(),
                );
                std::thread::Builder::new()
                    .name(format!("anvil-prefetch-{i}"))
                    .spawn(move || {
                        if let Some(start) = thread_start {
                            start();
                        }
                        work(&volume, &receiver, &flight, &folding);
                    })
                    .ok()
            })
            .collect();
        Prefetcher {
            sender: Mutex::new((!threads.is_empty()).then_some(sender)),
            streams: Mutex::new(HashMap::new()),
            threads: Mutex::new(threads),
            in_flight,
        }
    }

    /// Waits (at most `WAIT_MAX`) while a read-ahead piece that overlaps
    /// `[offset, offset + len)` of `ino` is asked for or being read: the read then finds
    /// its extents in the cache.
    pub fn wait_for(&self, ino: u64, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        let overlaps = |pieces: &Vec<(u64, u64, u64)>| {
            pieces
                .iter()
                .any(|&(i, lo, hi)| i == ino && lo < end && offset < hi)
        };
        let pieces = self.in_flight.pieces.lock();
        if overlaps(&pieces) {
            let _ = self
                .in_flight
                .done
                .wait_timeout_while(pieces, WAIT_MAX, |pieces| overlaps(pieces));
        }
    }

    /// Notes a read of `[offset, offset + len)` of `ino` (a file of `size` bytes) and asks
    /// for read-ahead if the file is being read in sequence.
    pub fn note_read(&self, ino: u64, offset: u64, len: u64, size: u64) {
        let mut jobs = Vec::new();
        {
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
            let want = stream.next.saturating_add(stream.window).min(size);
            let mut from = stream.ahead.max(stream.next);
            // Whole pieces only (a short one at the end of the file): the rest of the
            // window is asked for with the next read.
            while from < want {
                let piece_end = ((from / PIECE_BYTES + 1) * PIECE_BYTES).min(size);
                if piece_end > want && want < size {
                    break;
                }
                jobs.push(Job::ReadAhead {
                    ino,
                    offset: from,
                    end: piece_end,
                });
                from = piece_end;
            }
            stream.ahead = stream.ahead.max(from);
        }
        for job in jobs {
            self.send(job);
        }
    }

    /// Asks for chunk `index` of `ino` to be folded.
    pub fn fold_soon(&self, ino: u64, index: u64) {
        self.send(Job::Fold { ino, index });
    }

    fn send(&self, job: Job) {
        let piece = match job {
            Job::ReadAhead { ino, offset, end } => Some((ino, offset, end)),
            Job::Fold { .. } => None,
        };
        // A piece counts as in flight from the moment it is asked for: a read that reaches
        // it before a thread takes it up waits rather than reading it a second time.
        if let Some(piece) = piece {
            self.in_flight.pieces.lock().push(piece);
        }
        let sent = match self.sender.lock().as_ref() {
            // A busy pool skips the job, never blocks.
            Some(sender) => !matches!(
                sender.try_send(job),
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_))
            ),
            None => false,
        };
        if let (false, Some(piece)) = (sent, piece) {
            self.in_flight.finish(piece);
        }
    }

    pub fn stop(&self) {
        self.sender.lock().take();
        for thread in std::mem::take(&mut *self.threads.lock()) {
            let _ = thread.join();
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One thread of the pool: takes jobs until the sender is dropped. Folds run one at a time
/// (`folding`), as on one thread: each takes the volume's write lock, and two at once held
/// up the requests that wait for it.
fn work(volume: &Volume, receiver: &Mutex<Receiver<Job>>, flight: &InFlight, folding: &Mutex<()>) {
    loop {
        // The lock is held while waiting: the next job goes to one idle thread.
        let Ok(job) = receiver.lock().recv() else {
            return;
        };
        match job {
            Job::ReadAhead { ino, offset, end } => {
                if let Err(e) = prefetch(volume, ino, offset, end - offset) {
                    log::debug!("read-ahead of object {ino} at {offset} stopped: {e}");
                }
                flight.finish((ino, offset, end));
            }
            Job::Fold { ino, index } => {
                let _one_at_a_time = folding.lock();
                if let Err(e) = super::Filesystem::fold_chunk(volume, ino, index) {
                    log::debug!("fold of object {ino} chunk {index} failed: {e}");
                }
            }
        }
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
