//! A regular image file or a block device, read and written with O_DIRECT where the host
//! allows it.
//!
//! With O_DIRECT the host's page cache holds none of the device's blocks: the engine's own
//! cache (`crate::cache`) is the only copy in memory, so under a memory limit the space goes
//! to what is decoded and used, and file data read through a mount is not cached twice (as
//! the mount's pages and as the image's). Direct I/O needs buffers, offsets and lengths
//! aligned to the device's block size; requests that are not are carried through an
//! aligned bounce buffer (reads round out to whole blocks; a write that covers part of a
//! block reads it first). Where the host refuses O_DIRECT (tmpfs, some network file
//! systems), or later fails a direct request with EINVAL, the device says why once in the
//! log and goes on through the page cache.
//!
//! Small direct reads read around: the aligned 128 KiB window that holds them is read
//! whole and kept in a small buffer (8 to 64 windows, 1 to 8 MiB, by the mount's budget:
//! `set_read_around_bytes`), so that nodes and extents written
//! side by side by one commit (a directory's files, a tree path) come in one request, as
//! the page cache's readahead would bring them. Every write drops the windows it overlaps;
//! a window read while any write was in flight is not kept. Windows are read only while
//! they pay: when recent windows served fewer later reads than were windows read (files
//! read in another order than they were written, a working set far larger than the
//! windows), small reads go to the device as they are, but for one probe in sixteen.

use super::Device;
use crate::sync::Mutex;
use lru::LruCache;
use std::fs::{File, OpenOptions};
use std::io;
use std::num::NonZeroUsize;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Alignment of direct requests: the largest logical block size in use (4096; a multiple of
/// 512-byte sectors).
const DIRECT_ALIGN: usize = 4096;
/// Runs of file data written ahead of their commit at least this long are written with
/// O_DIRECT (`write_staged_vectored_at`); shorter ones through the page cache.
const DIRECT_STAGED_MIN: usize = 512 << 10;
/// Size and alignment of a read-around window.
const WINDOW_BYTES: u64 = 128 << 10;
/// Windows kept, at most (8 MiB) and at least (1 MiB); `set_read_around_bytes` chooses.
const WINDOWS: NonZeroUsize = match NonZeroUsize::new(64) {
    Some(n) => n,
    None => panic!("at least one window"),
};
const WINDOWS_MIN: usize = 8;
/// Reads at least this long go to the device as they are. Read-around pays for small
/// neighbours written together (nodes, small files' extents, patches); a data chunk is
/// read whole, and widening it to a window or two only adds bytes to read and copy.
const AROUND_BYTES_MAX: usize = 32 << 10;

pub struct FileDevice {
    file: File,
    /// The same file opened with O_DIRECT, while direct I/O works.
    direct: Option<File>,
    direct_failed: AtomicBool,
    is_block_device: bool,
    windows: ReadAround,
    /// Runs of data written ahead (`write_staged_vectored_at`) in flight now.
    staged_in_flight: AtomicU64,
    /// Whether the writers of file data keep several runs in flight (`set_writers_pipelined`).
    writers_pipelined: AtomicBool,
    read_times: ReadTimes,
}

/// Reads of the device since it was opened (not those read-around windows in memory
/// served), and those of them that met a write of this device in flight (one was in flight
/// when the read began, or one began before it ended), each with their time: how long
/// reads wait behind the engine's own writes (`report`). A read beside a long write takes
/// ten times as long on a loop device (docs/benchmarks.md, nineteenth session). Reads
/// that met a flush (`fdatasync`) are counted the same way, apart: a loop device's flush
/// syncs its backing file on the host, and a read beside one waited 7-8 ms on the proxy
/// benchmark (twentieth session).
#[derive(Default)]
struct ReadTimes {
    reads: AtomicU64,
    read_ns: AtomicU64,
    behind_writes: AtomicU64,
    behind_writes_ns: AtomicU64,
    behind_flushes: AtomicU64,
    behind_flushes_ns: AtomicU64,
    /// Flushes begun, and in flight now.
    flushes: AtomicU64,
    flushing: AtomicU64,
}

/// Recently read windows of a direct device, by window index.
struct ReadAround {
    windows: Mutex<LruCache<u64, Arc<Vec<u8>>>>,
    /// Writes begun, and writes in flight: a window read while either changed or any
    /// write was in flight is not kept.
    writes: AtomicU64,
    in_flight: AtomicU64,
    /// Windows read and the small reads served from windows since, both halved now and
    /// then so that they describe the recent past (`windows_pay`).
    recent_windows: AtomicU64,
    recent_hits: AtomicU64,
    /// Small reads that missed the windows.
    misses: AtomicU64,
}

/// Window reads `windows_pay` looks back over (about; halved past twice this).
const WINDOW_HISTORY: u64 = 512;
/// While windows do not pay, one small read in this many that misses still reads its
/// window, so that a change in the workload is noticed.
const WINDOW_PROBE_EVERY: u64 = 16;

impl ReadAround {
    fn new() -> ReadAround {
        ReadAround {
            windows: Mutex::new(LruCache::new(WINDOWS)),
            writes: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            recent_windows: AtomicU64::new(0),
            recent_hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// Whether a small read that missed should read its whole window: yes while recent
    /// windows served at least one later read each. (A proxy-cache replay whose windows
    /// served one read for every two saved a quarter of its device requests and lost a
    /// fifth of its time reading six times the bytes; see docs/design.md.)
    fn windows_pay(&self) -> bool {
        let windows = self.recent_windows.load(Ordering::Relaxed);
        let hits = self.recent_hits.load(Ordering::Relaxed);
        windows < 32
            || hits >= windows
            || self.misses.fetch_add(1, Ordering::Relaxed) % WINDOW_PROBE_EVERY == 0
    }

    /// Counts a window read (or `hit`: a small read served from windows).
    fn count(&self, hit: bool) {
        if hit {
            self.recent_hits.fetch_add(1, Ordering::Relaxed);
        } else if self.recent_windows.fetch_add(1, Ordering::Relaxed) >= 2 * WINDOW_HISTORY {
            // Racy halving is fine: these steer a heuristic, nothing else counts on them.
            self.recent_windows.store(WINDOW_HISTORY, Ordering::Relaxed);
            let hits = self.recent_hits.load(Ordering::Relaxed);
            self.recent_hits.store(hits / 2, Ordering::Relaxed);
        }
    }

    /// Drops the windows `[offset, offset + len)` touches.
    fn invalidate(&self, offset: u64, len: usize) {
        if len == 0 {
            return;
        }
        let first = offset / WINDOW_BYTES;
        let last = (offset + len as u64 - 1) / WINDOW_BYTES;
        let mut windows = self.windows.lock();
        if last - first >= windows.cap().get() as u64 {
            windows.clear();
            return;
        }
        for index in first..=last {
            windows.pop(&index);
        }
    }
}

/// How a device ended up being accessed, for the mount's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoMode {
    Direct,
    /// Through the host's page cache, with the reason.
    Buffered(String),
}

impl FileDevice {
    /// Opens an existing image or block device through the host's page cache.
    pub fn open(path: &Path, writable: bool) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let is_block_device = file.metadata()?.file_type().is_block_device();
        Ok(FileDevice {
            file,
            direct: None,
            direct_failed: AtomicBool::new(false),
            is_block_device,
            windows: ReadAround::new(),
            staged_in_flight: AtomicU64::new(0),
            writers_pipelined: AtomicBool::new(false),
            read_times: ReadTimes::default(),
        })
    }

    /// Opens an existing image or block device for direct I/O, falling back to the page
    /// cache (with the reason in `io_mode`) where the host refuses it.
    pub fn open_direct(path: &Path, writable: bool) -> io::Result<FileDevice> {
        let mut device = FileDevice::open(path, writable)?;
        match OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(direct) => device.direct = Some(direct),
            Err(e) => {
                log::info!(
                    "{}: O_DIRECT refused ({e}); using the page cache",
                    path.display()
                );
                device.direct_failed.store(true, Ordering::Relaxed);
            }
        }
        Ok(device)
    }

    /// Creates (or opens) an image file for mkfs.
    pub fn create(path: &Path) -> io::Result<FileDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let is_block_device = file.metadata()?.file_type().is_block_device();
        Ok(FileDevice {
            file,
            direct: None,
            direct_failed: AtomicBool::new(false),
            is_block_device,
            windows: ReadAround::new(),
            staged_in_flight: AtomicU64::new(0),
            writers_pipelined: AtomicBool::new(false),
            read_times: ReadTimes::default(),
        })
    }

    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    /// The underlying file, for advisory locking.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Runs `write` of `len` bytes at `offset` as a write the read-around windows know of:
    /// windows it overlaps are dropped, and none read meanwhile is kept.
    fn tracked_write(
        &self,
        offset: u64,
        len: usize,
        write: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        self.windows.in_flight.fetch_add(1, Ordering::AcqRel);
        self.windows.writes.fetch_add(1, Ordering::AcqRel);
        self.windows.invalidate(offset, len);
        let result = write();
        self.windows.in_flight.fetch_sub(1, Ordering::AcqRel);
        result
    }

    /// Says whether the writers of file data keep several runs in flight without waiting
    /// for each (the kernel's writeback cache sends a file's dirty pages as many WRITEs at
    /// once). Then long runs written ahead go straight to the device even when alone;
    /// otherwise a run goes direct only while another is in flight.
    pub fn set_writers_pipelined(&self, pipelined: bool) {
        self.writers_pipelined.store(pipelined, Ordering::Relaxed);
    }

    /// Memory for read-around windows: `bytes` rounded to whole windows, 1 to 8 MiB. A
    /// mount gives it a share of its `cache=` budget (8 MiB was a quarter of a 32 MiB one).
    pub fn set_read_around_bytes(&self, bytes: u64) {
        let windows = usize::try_from(bytes / WINDOW_BYTES)
            .unwrap_or(usize::MAX)
            .clamp(WINDOWS_MIN, WINDOWS.get());
        if let Some(windows) = NonZeroUsize::new(windows) {
            self.windows.windows.lock().resize(windows);
        }
    }

    pub fn io_mode(&self) -> IoMode {
        match self.direct_file() {
            Some(_) => IoMode::Direct,
            None if self.direct.is_some() => {
                IoMode::Buffered("a direct request failed with EINVAL".to_string())
            }
            None if self.direct_failed.load(Ordering::Relaxed) => {
                IoMode::Buffered("the host refused O_DIRECT".to_string())
            }
            None => IoMode::Buffered("opened without O_DIRECT".to_string()),
        }
    }

    /// A direct read, through the read-around windows when it is small. Says whether
    /// windows in memory served it, with no request to the device.
    fn read_around(&self, direct: &File, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        let Some(end) = offset.checked_add(buf.len() as u64) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        if buf.is_empty() || buf.len() >= AROUND_BYTES_MAX {
            return direct_read(direct, buf, offset).map(|()| false);
        }
        let first = offset / WINDOW_BYTES;
        let last = (end - 1) / WINDOW_BYTES;
        let mut found: Vec<Arc<Vec<u8>>> = Vec::with_capacity(2);
        {
            let mut windows = self.windows.windows.lock();
            for index in first..=last {
                match windows.get(&index) {
                    Some(window) => found.push(window.clone()),
                    None => break,
                }
            }
        }
        let hit = found.len() as u64 == last - first + 1;
        if !hit && !self.windows.windows_pay() {
            return direct_read(direct, buf, offset).map(|()| false);
        }
        self.windows.count(hit);
        if !hit {
            let before = self.windows.writes.load(Ordering::Acquire);
            let quiet = self.windows.in_flight.load(Ordering::Acquire) == 0;
            #[expect(
                clippy::cast_possible_truncation,
                reason = "a read below AROUND_BYTES_MAX spans one or two 128 KiB windows"
            )]
            let span = ((last - first + 1) * WINDOW_BYTES) as usize;
            let mut read = AlignedBuf::new(span);
            let got = read_full(direct, read.as_mut_slice(), first * WINDOW_BYTES)?;
            let bytes = &read.as_slice()[..got];
            #[expect(clippy::cast_possible_truncation, reason = "a window is 128 KiB")]
            let window_bytes = WINDOW_BYTES as usize;
            found = bytes
                .chunks(window_bytes)
                .map(|w| Arc::new(w.to_vec()))
                .collect();
            // Kept only if no write was in flight or began meanwhile.
            let after = self.windows.writes.load(Ordering::Acquire);
            if quiet && before == after && self.windows.in_flight.load(Ordering::Acquire) == 0 {
                let mut windows = self.windows.windows.lock();
                for (i, window) in found.iter().enumerate() {
                    windows.put(first + i as u64, window.clone());
                }
            }
        }
        let mut at = offset;
        let mut filled = 0;
        for (i, window) in found.iter().enumerate() {
            let window_start = (first + i as u64) * WINDOW_BYTES;
            let Some(from) = usize::try_from(at - window_start)
                .ok()
                .filter(|&from| from < window.len())
            else {
                break;
            };
            let take = (window.len() - from).min(buf.len() - filled);
            buf[filled..filled + take].copy_from_slice(&window[from..from + take]);
            filled += take;
            at += take as u64;
            if filled == buf.len() {
                return Ok(hit);
            }
        }
        Err(io::Error::from(io::ErrorKind::UnexpectedEof))
    }

    fn direct_file(&self) -> Option<&File> {
        self.direct
            .as_ref()
            .filter(|_| !self.direct_failed.load(Ordering::Relaxed))
    }

    /// `read_untimed`, counted in `read_times` unless windows in memory served it.
    fn read(&self, buf: &mut [u8], offset: u64, around: bool) -> io::Result<()> {
        let t = &self.read_times;
        let writing = self.windows.in_flight.load(Ordering::Acquire) > 0;
        let writes = self.windows.writes.load(Ordering::Acquire);
        let flushing = t.flushing.load(Ordering::Acquire) > 0;
        let flushes = t.flushes.load(Ordering::Acquire);
        let start = std::time::Instant::now();
        let from_windows = self.read_untimed(buf, offset, around)?;
        if from_windows {
            return Ok(());
        }
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        t.reads.fetch_add(1, Ordering::Relaxed);
        t.read_ns.fetch_add(ns, Ordering::Relaxed);
        if writing || self.windows.writes.load(Ordering::Acquire) != writes {
            t.behind_writes.fetch_add(1, Ordering::Relaxed);
            t.behind_writes_ns.fetch_add(ns, Ordering::Relaxed);
        }
        if flushing || t.flushes.load(Ordering::Acquire) != flushes {
            t.behind_flushes.fetch_add(1, Ordering::Relaxed);
            t.behind_flushes_ns.fetch_add(ns, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A read, direct (through the read-around windows if `around`) while direct I/O works.
    /// Says whether windows in memory served it.
    fn read_untimed(&self, buf: &mut [u8], offset: u64, around: bool) -> io::Result<bool> {
        let direct_done = match self.direct_file() {
            Some(direct) => self.direct_or_fallback(
                |_| match around {
                    true => self.read_around(direct, buf, offset).map(Some),
                    false => direct_read(direct, buf, offset).map(|()| Some(false)),
                },
                |_| Ok(None),
            )?,
            None => None,
        };
        match direct_done {
            Some(from_windows) => Ok(from_windows),
            None => self.file.read_exact_at(buf, offset).map(|()| false),
        }
    }

    /// Runs a direct request; on EINVAL (the host accepted O_DIRECT at open but not for
    /// this file) switches to the page cache for good and reports it once.
    fn direct_or_fallback<T>(
        &self,
        direct: impl FnOnce(&File) -> io::Result<T>,
        buffered: impl FnOnce(&File) -> io::Result<T>,
    ) -> io::Result<T> {
        let Some(file) = self.direct_file() else {
            return buffered(&self.file);
        };
        match direct(file) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if !self.direct_failed.swap(true, Ordering::Relaxed) {
                    log::warn!("direct I/O failed ({e}); using the page cache from now on");
                }
                buffered(&self.file)
            }
            other => other,
        }
    }
}

/// A zeroed buffer of `len` bytes whose start is aligned for direct I/O (no unsafe: a
/// larger vector, used from its first aligned byte).
struct AlignedBuf {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let bytes = vec![0u8; len + DIRECT_ALIGN];
        let start = bytes.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { bytes, start, len }
    }
    fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

thread_local! {
    /// The aligned buffer a run of direct writes is joined in, kept per thread.
    static JOIN_BUFFER: std::cell::RefCell<Option<JoinBuffer>> =
        const { std::cell::RefCell::new(None) };
}
/// A join buffer larger than this is dropped after its run.
const JOIN_KEEP_MAX: usize = 8 << 20;
/// Transparent huge pages are this large (x86-64; arm64 with 4 KiB pages).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// The memory a run of direct writes is joined in: anonymous pages the host may back with
/// huge pages (`MADV_HUGEPAGE`, which hosts in THP's `madvise` mode need). A device request
/// carries at most `max_segments` pieces of physically contiguous memory: a loop device
/// (128 segments) cut the 4 KiB pages of a heap buffer into requests of 512 KiB or less,
/// where huge pages fill its largest request (`max_sectors_kb`, 1280 KiB). The advice is
/// only advice: a host that refuses it gives ordinary pages, and the writes are the same.
struct JoinBuffer {
    map: memmap2::MmapMut,
    /// Where the first huge page boundary lies in `map`.
    start: usize,
}

impl JoinBuffer {
    fn with_capacity(len: usize) -> io::Result<JoinBuffer> {
        let capacity = len.max(1).next_multiple_of(HUGE_PAGE_BYTES);
        let map = memmap2::MmapMut::map_anon(capacity + HUGE_PAGE_BYTES)?;
        let start = map.as_ptr().align_offset(HUGE_PAGE_BYTES);
        if let Err(e) = map.advise_range(memmap2::Advice::HugePage, start, capacity) {
            log::debug!("no huge pages for direct writes: {e}");
        }
        Ok(JoinBuffer { map, start })
    }

    fn capacity(&self) -> usize {
        self.map.len() - HUGE_PAGE_BYTES
    }

    fn slice(&mut self, len: usize) -> &mut [u8] {
        &mut self.map[self.start..self.start + len]
    }
}

/// A `len`-byte, `DIRECT_ALIGN`-aligned slice of `scratch`, which grows as needed (a
/// buffer kept between direct requests: the volume's run reads; joined writes have their
/// own, `JoinBuffer`).
pub(crate) fn aligned_scratch(scratch: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if scratch.len() < len + DIRECT_ALIGN {
        *scratch = vec![0u8; len + DIRECT_ALIGN];
    }
    let start = scratch.as_ptr().align_offset(DIRECT_ALIGN);
    &mut scratch[start..start + len]
}

fn is_aligned(buf: &[u8], offset: u64) -> bool {
    (buf.as_ptr() as usize) % DIRECT_ALIGN == 0
        && buf.len() % DIRECT_ALIGN == 0
        && offset % DIRECT_ALIGN as u64 == 0
}

/// Reads as much of `buf` as the file holds at `offset`; returns the bytes read (short only
/// at the end of the file).
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// The whole blocks around `[offset, offset + len)`.
fn block_span(offset: u64, len: usize) -> (u64, usize) {
    let align = DIRECT_ALIGN as u64;
    let start = offset / align * align;
    let end = (offset + len as u64).div_ceil(align) * align;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the span is len, a usize, plus less than two alignments"
    )]
    let span = (end - start) as usize;
    (start, span)
}

fn direct_read(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    if is_aligned(buf, offset) {
        if read_full(file, buf, offset)? < buf.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        return Ok(());
    }
    let (start, span) = block_span(offset, buf.len());
    let mut bounce = AlignedBuf::new(span);
    let got = read_full(file, bounce.as_mut_slice(), start)?;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "below DIRECT_ALIGN: start is offset rounded down to it"
    )]
    let from = (offset - start) as usize;
    if got < from + buf.len() {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    buf.copy_from_slice(&bounce.as_slice()[from..from + buf.len()]);
    Ok(())
}

fn direct_write(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    if is_aligned(buf, offset) {
        return file.write_all_at(buf, offset);
    }
    let (start, span) = block_span(offset, buf.len());
    let mut bounce = AlignedBuf::new(span);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "below DIRECT_ALIGN: start is offset rounded down to it"
    )]
    let from = (offset - start) as usize;
    let align = DIRECT_ALIGN;
    // Blocks the write covers only in part keep their other bytes (zeros past the end).
    if from != 0 {
        read_full(file, &mut bounce.as_mut_slice()[..align], start)?;
    }
    if (from + buf.len()) % align != 0 && (span > align || from == 0) {
        let last = span - align;
        read_full(
            file,
            &mut bounce.as_mut_slice()[last..],
            start + last as u64,
        )?;
    }
    bounce.as_mut_slice()[from..from + buf.len()].copy_from_slice(buf);
    file.write_all_at(bounce.as_slice(), start)
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read(buf, offset, true)
    }

    /// Reads and their time in milliseconds: all of them, those that met a write of this
    /// device in flight, and those that met a flush.
    fn report(&self) -> Vec<(&'static str, u64)> {
        let t = &self.read_times;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        vec![
            ("reads", get(&t.reads)),
            ("read_ms", get(&t.read_ns) / 1_000_000),
            ("reads_behind_writes", get(&t.behind_writes)),
            ("behind_writes_ms", get(&t.behind_writes_ns) / 1_000_000),
            ("reads_behind_flushes", get(&t.behind_flushes)),
            ("behind_flushes_ms", get(&t.behind_flushes_ns) / 1_000_000),
        ]
    }

    fn read_whole_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read(buf, offset, false)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.tracked_write(offset, buf.len(), || {
            self.direct_or_fallback(
                |direct| direct_write(direct, buf, offset),
                |file| file.write_all_at(buf, offset),
            )
        })
    }

    fn write_staged_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // The buffered descriptor: the host keeps the bytes if this process dies, and a
        // later direct read of the range writes them back first (the kernel keeps the two
        // paths coherent). `flush` (fdatasync) covers them like any other write.
        self.tracked_write(offset, buf.len(), || self.file.write_all_at(buf, offset))
    }

    fn write_staged_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        // File data written ahead of its commit comes in runs of whole chunks: where the
        // device takes O_DIRECT, long runs go straight to it (from the request's own pages
        // when they are aligned, else copied once into an aligned buffer). Through the page cache they were copied there, written back by a kernel
        // thread and dropped after the commit, all on the CPUs the writers need. A short
        // run still goes through the page cache: a copy costs it less than waiting for
        // the device (64 KiB random writes ran a third slower written directly).
        // Direct only where nobody waits for this run alone: a writer that waits for each
        // run (a FUSE mount without the kernel's writeback cache, one writing thread) gets
        // the page cache's copy, which costs it less than the device's round trip (1 MiB
        // rewrites on such a mount: 0.59-0.86 GB/s direct, 0.77-1.04 through the cache).
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let others = self.staged_in_flight.fetch_add(1, Ordering::AcqRel);
        let pipelined = others > 0 || self.writers_pipelined.load(Ordering::Relaxed);
        let result = if len >= DIRECT_STAGED_MIN && pipelined && self.direct_file().is_some() {
            self.write_vectored_at(bufs, offset)
        } else {
            self.tracked_write(offset, len, || pwritev_all(&self.file, bufs, offset))
        };
        self.staged_in_flight.fetch_sub(1, Ordering::AcqRel);
        result
    }

    fn forget_staged(&self, offset: u64, len: u64) {
        use std::os::unix::io::AsRawFd;
        // Only when reads bypass the host's cache: otherwise it is the only cache.
        if self.direct_file().is_none() {
            return;
        }
        let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len))
        else {
            return;
        };
        // SAFETY: posix_fadvise takes a descriptor this device owns and plain integers;
        // it reads and writes no memory of ours.
        let rc = unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset,
                len,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        if rc != 0 {
            log::debug!(
                "posix_fadvise(DONTNEED) failed: {}",
                io::Error::from_raw_os_error(rc)
            );
        }
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        if self.direct_file().is_some() && bufs.iter().all(|b| is_aligned(b, offset)) {
            // Every piece already sits on aligned memory (whole chunks of a WRITE's payload,
            // which both transports receive page-aligned): straight from there, no copy.
            let len = bufs.iter().map(|b| b.len()).sum();
            return self.tracked_write(offset, len, || {
                self.direct_or_fallback(
                    |direct| pwritev_all(direct, bufs, offset),
                    |file| pwritev_all(file, bufs, offset),
                )
            });
        }
        if self.direct_file().is_some() {
            // One aligned buffer for the run: one request, as pwritev would make. The buffer
            // is the thread's, kept between runs: allocated per run, each megabyte came
            // fresh from the kernel, zeroed and faulted in page by page.
            let total: usize = bufs.iter().map(|b| b.len()).sum();
            let mut scratch = match JOIN_BUFFER.take() {
                Some(kept) if kept.capacity() >= total => kept,
                _ => JoinBuffer::with_capacity(total)?,
            };
            let joined = scratch.slice(total);
            let mut at = 0;
            for buf in bufs {
                joined[at..at + buf.len()].copy_from_slice(buf);
                at += buf.len();
            }
            let result = self.write_at(joined, offset);
            if scratch.capacity() <= JOIN_KEEP_MAX {
                JOIN_BUFFER.set(Some(scratch));
            }
            return result;
        }
        pwritev_all(&self.file, bufs, offset)
    }

    fn flush(&self) -> io::Result<()> {
        let t = &self.read_times;
        t.flushing.fetch_add(1, Ordering::AcqRel);
        t.flushes.fetch_add(1, Ordering::AcqRel);
        let result = self.file.sync_data();
        t.flushing.fetch_sub(1, Ordering::AcqRel);
        result
    }

    fn len(&self) -> io::Result<u64> {
        if self.is_block_device {
            use std::io::{Seek, SeekFrom};
            let mut file = &self.file;
            file.seek(SeekFrom::End(0))
        } else {
            Ok(self.file.metadata()?.len())
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.is_block_device {
            if self.len()? >= len {
                return Ok(());
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "block device is too small",
            ));
        }
        self.file.set_len(len)
    }
}

/// Frees the storage of `[offset, offset + len)` in a regular file, keeping its size
/// (whole pages or blocks inside the range; reads there return zeros).
pub(crate) fn punch_hole(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: a system call on an open descriptor with plain integer arguments.
    let done = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    };
    if done != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn pwritev_all(file: &File, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    const IOV_MAX: usize = 1024;
    let mut offset = offset;
    let mut slices: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
    let mut first = 0;
    while first < slices.len() {
        let batch = &slices[first..slices.len().min(first + IOV_MAX)];
        let iov: Vec<libc::iovec> = batch
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_possible_wrap,
            reason = "a batch holds at most IOV_MAX (1024) iovecs"
        )]
        let iov_count = iov.len() as libc::c_int;
        let at = libc::off_t::try_from(offset).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "write offset beyond off_t")
        })?;
        // SAFETY: every iovec points into a live borrowed slice of the stated length, and
        // pwritev only reads from them.
        let written = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), iov_count, at) };
        // Negative: failed, with errno set.
        let Ok(written) = usize::try_from(written) else {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        };
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        // Skip what was written; a partial slice is shortened in place.
        let mut left = written;
        offset += left as u64;
        while left > 0 {
            let len = slices[first].len();
            if left >= len {
                left -= len;
                first += 1;
            } else {
                slices[first] = &slices[first][left..];
                left = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_writes_land_back_to_back() {
        let dir = tempfile::tempdir().unwrap();
        let device = FileDevice::create(&dir.path().join("image")).unwrap();
        device.set_len(1 << 20).unwrap();
        // More slices than one pwritev takes, of uneven sizes, some empty.
        let pieces: Vec<Vec<u8>> = (0..3000).map(|i| vec![(i % 251) as u8; i % 7]).collect();
        let slices: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        device.write_vectored_at(&slices, 4096).unwrap();
        let expected: Vec<u8> = pieces.concat();
        let mut back = vec![0u8; expected.len()];
        device.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, expected);
    }

    /// Unaligned reads and writes through O_DIRECT land exactly where a plain file puts them.
    #[test]
    fn direct_io_matches_buffered_io_at_any_alignment() {
        use rand::{Rng, SeedableRng};
        // /var/tmp, not /tmp: tmpfs refuses O_DIRECT.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("image");
        FileDevice::create(&path).unwrap().set_len(1 << 20).unwrap();
        let device = FileDevice::open_direct(&path, true).unwrap();
        if device.io_mode() != IoMode::Direct {
            eprintln!(
                "skipped: the host refuses O_DIRECT here ({:?})",
                device.io_mode()
            );
            return;
        }
        let mut model = vec![0u8; 1 << 20];
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for round in 0..300 {
            let len = rng.gen_range(1..20_000usize);
            let offset = rng.gen_range(0..(1u64 << 20) - len as u64);
            if round % 3 == 0 {
                let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                device.write_at(&bytes, offset).unwrap();
                model[offset as usize..offset as usize + len].copy_from_slice(&bytes);
            } else {
                let mut back = vec![0u8; len];
                device.read_at(&mut back, offset).unwrap();
                assert_eq!(
                    back,
                    &model[offset as usize..offset as usize + len],
                    "round {round}"
                );
            }
        }
        let pieces: Vec<Vec<u8>> = (0..5).map(|i| vec![i as u8 + 1; 4096 * (i + 1)]).collect();
        let slices: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        device.write_vectored_at(&slices, 8192).unwrap();
        let joined = pieces.concat();
        model[8192..8192 + joined.len()].copy_from_slice(&joined);
        // Data written ahead of a commit, by pipelined writers: a long run (direct, through
        // the join buffer kept between runs, so twice) and a short one (through the page
        // cache); then, for a writer that waits for each run, a long run through the page
        // cache.
        device.set_writers_pipelined(true);
        for (at, chunks) in [(65536u64, 10usize), (393_216, 9), (131_072, 1), (0, 12)] {
            device.set_writers_pipelined(at != 0);
            let run: Vec<Vec<u8>> = (0..chunks)
                .map(|_| (0..65536).map(|_| rng.gen()).collect())
                .collect();
            let slices: Vec<&[u8]> = run.iter().map(Vec::as_slice).collect();
            device.write_staged_vectored_at(&slices, at).unwrap();
            let run = run.concat();
            model[at as usize..at as usize + run.len()].copy_from_slice(&run);
            let mut back = vec![0u8; run.len()];
            device.read_at(&mut back, at).unwrap();
            assert!(back == run, "run at {at} reads back different");
        }
        // A run whose chunks lie on aligned memory (a request's payload) goes to the
        // device from there, without the join buffer.
        device.set_writers_pipelined(true);
        let mut aligned = AlignedBuf::new(8 * 65536);
        rng.fill(aligned.as_mut_slice());
        let slices: Vec<&[u8]> = aligned.as_slice().chunks(65536).collect();
        device.write_staged_vectored_at(&slices, 196_608).unwrap();
        model[196_608..196_608 + 8 * 65536].copy_from_slice(aligned.as_slice());
        let mut all = vec![0u8; 1 << 20];
        FileDevice::open(&path, false)
            .unwrap()
            .read_at(&mut all, 0)
            .unwrap();
        assert!(all == model, "the file differs from the model");
        let mut past_end = vec![0u8; 100];
        assert!(device.read_at(&mut past_end, (1 << 20) - 50).is_err());
    }

    #[test]
    fn reads_are_counted_and_those_beside_a_write_apart() {
        let dir = tempfile::tempdir().unwrap();
        let device = FileDevice::create(&dir.path().join("image")).unwrap();
        device.set_len(1 << 20).unwrap();
        let count = |name: &str| device.report().iter().find(|c| c.0 == name).unwrap().1;
        let mut buf = [0u8; 4096];
        device.read_at(&mut buf, 0).unwrap();
        device.read_whole_at(&mut buf, 8192).unwrap();
        assert_eq!((count("reads"), count("reads_behind_writes")), (2, 0));
        // A write in flight while a read runs.
        device.windows.in_flight.fetch_add(1, Ordering::AcqRel);
        device.read_at(&mut buf, 4096).unwrap();
        device.windows.in_flight.fetch_sub(1, Ordering::AcqRel);
        assert_eq!((count("reads"), count("reads_behind_writes")), (3, 1));
        // A write done before the read is not in its way.
        device.write_at(&[1u8; 4096], 0).unwrap();
        device.read_at(&mut buf, 0).unwrap();
        assert_eq!((count("reads"), count("reads_behind_writes")), (4, 1));
        assert_eq!(buf, [1u8; 4096]);
        // Flushes are counted apart: one in flight, then one that has ended.
        device.read_times.flushing.fetch_add(1, Ordering::AcqRel);
        device.read_at(&mut buf, 4096).unwrap();
        device.read_times.flushing.fetch_sub(1, Ordering::AcqRel);
        device.flush().unwrap();
        device.read_at(&mut buf, 4096).unwrap();
        let apart = ["reads", "reads_behind_writes", "reads_behind_flushes"].map(count);
        assert_eq!(apart, [6, 1, 1]);
    }

    #[test]
    fn read_around_memory_follows_the_budget_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let device = FileDevice::create(&dir.path().join("image")).unwrap();
        let cap = |d: &FileDevice| d.windows.windows.lock().cap().get();
        assert_eq!(cap(&device), 64);
        device.set_read_around_bytes(2 << 20);
        assert_eq!(cap(&device), 16);
        device.set_read_around_bytes(0);
        assert_eq!(cap(&device), WINDOWS_MIN);
        device.set_read_around_bytes(u64::MAX);
        assert_eq!(cap(&device), 64);
        // Fewer windows still serve reads and invalidations.
        device.set_read_around_bytes(1 << 20);
        device.set_len(4 << 20).unwrap();
        device.write_at(&[7u8; 4096], 3 << 20).unwrap();
        let mut back = [0u8; 4096];
        device.read_at(&mut back, 3 << 20).unwrap();
        assert_eq!(back, [7u8; 4096]);
    }

    #[test]
    fn windows_stop_when_nothing_reads_from_them() {
        let around = ReadAround::new();
        // Windows that serve a read each: they keep being read.
        for _ in 0..200 {
            assert!(around.windows_pay());
            around.count(false);
            around.count(true);
        }
        // Windows nobody reads from again: after a while only the probes read one.
        for _ in 0..3000 {
            if around.windows_pay() {
                around.count(false);
            }
        }
        let asked: u32 = (0..160).map(|_| u32::from(around.windows_pay())).sum();
        assert!(
            (8..=12).contains(&asked),
            "{asked} of 160 misses read a window"
        );
        // Reads served again: windows come back.
        for _ in 0..3000 {
            around.count(true);
        }
        assert!(around.windows_pay());
    }
}
