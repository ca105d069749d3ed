//! FUSE over io_uring (Linux 6.14+): one queue per CPU, requests served on the CPU that made
//! them, a reply and the fetch of the next request in one io_uring command.
//!
//! The ring ABI, the ring entries and request decoding come from `fractal-fuse`; the session
//! is our own, because `fractal-fuse`'s session negotiates fixed INIT flags
//! (FUSE_ATOMIC_O_TRUNC, which breaks O_TRUNC once the kernel stops sending OPEN, and no
//! FUSE_HANDLE_KILLPRIV_V2) and never reads /dev/fuse after INIT. Here:
//! 1. mount with `fusermount3` (fractal-fuse's helper), which hands back the /dev/fuse fd;
//! 2. answer FUSE_INIT on /dev/fuse with the same capabilities as the classic transport,
//!    plus FUSE_OVER_IO_URING;
//! 3. one worker thread per possible CPU (pinned, a compio runtime each) registers
//!    `queue_depth` entries for its queue and loops: dispatch, commit and fetch;
//! 4. a reader thread keeps serving /dev/fuse for what the kernel still sends there
//!    (interrupts; forgets and requests made before every queue was registered);
//! 5. the mount is reported ready once a request made from this process came back through
//!    the ring.

use crate::{Backend, EntryPlus, Op, Reply};
use anvil::fs::{Caller, SetAttr, TimeSet};
use anvil::{Attr, FileKind};
use compio_runtime::{register_files, unregister_files, Runtime};
use fractal_fuse::abi::*;
use fractal_fuse::ring::{allocate_ring_entries, FuseCommitAndFetch, FuseRegister, RingEntry};
use fractal_fuse::{
    DirectoryEntry, DirectoryEntryPlus, FileAttr, FileHandleId, FileType, FsResult, InodeId,
    ReplyAttr, ReplyCreate, ReplyEntry, ReplyOpen, ReplyReadlink, ReplyStatfs, ReplyXattr, Request,
    SetAttrTime, Timestamp,
};
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the kernel says whether FUSE over io_uring is allowed.
pub const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
/// Largest WRITE the kernel sends (and the payload buffer of every ring entry), unless a
/// small memory budget asks for less (`max_write_for`).
pub const MAX_WRITE: u32 = 1 << 20;
/// The smallest payload buffer a small budget gets: a 64 KiB chunk and then some.
pub const MAX_WRITE_MIN: u32 = 128 << 10;
/// The read-ahead window both transports offer in FUSE_INIT (and set on the mount's
/// backing device, see `raise_readahead`).
pub const MAX_READAHEAD: u32 = 1 << 20;
/// Ring entries per queue by default: requests one CPU can have in flight.
pub const DEFAULT_QUEUE_DEPTH: u16 = 8;

/// Whether this kernel serves FUSE over io_uring now; the reason when it does not.
pub fn availability() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_PARAM) {
        Ok(v) if v.trim() == "Y" || v.trim() == "1" => Ok(()),
        Ok(_) => Err(format!(
            "{ENABLE_PARAM} is off (scripts/setup.sh turns it on: echo Y > {ENABLE_PARAM})"
        )),
        Err(_) => Err("this kernel has no FUSE over io_uring (Linux 6.14+ with \
                       CONFIG_FUSE_IO_URING)"
            .to_string()),
    }
}

/// The kernel's number of possible CPUs: it makes one queue for each.
pub fn queue_count() -> usize {
    let parse = |s: &str| -> Option<usize> {
        let mut n = 0;
        for part in s.trim().split(',') {
            n += match part.split_once('-') {
                Some((lo, hi)) => hi.parse::<usize>().ok()? - lo.parse::<usize>().ok()? + 1,
                None => {
                    part.parse::<usize>().ok()?;
                    1
                }
            };
        }
        (n > 0).then_some(n)
    };
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| parse(&s))
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Bytes of ring buffers a mount with this queue depth and payload size may hold (header
/// page and payload per entry, every queue); counted against the daemon's memory budget.
/// Payload pages are resident only once a request has used them (`release_payload_pages`),
/// but a run of large writes or reads uses them all.
pub fn ring_bytes(queue_depth: u16, max_write: u32) -> u64 {
    let per_entry = 4096 + max_write as u64;
    per_entry * queue_depth as u64 * queue_count() as u64
}

/// The payload size for a daemon with `budget_bytes` of memory: `MAX_WRITE`, halved (down
/// to `MAX_WRITE_MIN`) while the rings would take more than a quarter of the budget: under
/// a small memory limit, 1 MiB buffers that large requests fill cost more than the cache
/// they push out (16.5 MiB of rings against a 32 MiB budget, where a proxy replay under
/// 256 MiB was killed for memory).
pub fn max_write_for(queue_depth: u16, budget_bytes: u64) -> u32 {
    let mut max_write = MAX_WRITE;
    while max_write > MAX_WRITE_MIN && ring_bytes(queue_depth, max_write) > budget_bytes / 4 {
        max_write /= 2;
    }
    max_write
}

/// How the mount is made.
pub struct MountConfig {
    pub fs_name: String,
    pub read_only: bool,
    /// Root: mount(2) directly and allow other users, device files and setuid (as the
    /// classic mount does); otherwise `fusermount3`.
    pub privileged: bool,
    pub queue_depth: u16,
    /// Largest WRITE (and READ) the kernel sends, and each ring entry's payload buffer
    /// (`max_write_for`).
    pub max_write: u32,
    /// Workers run under SCHED_IDLE (see `set_idle_policy`).
    pub idle_workers: bool,
    /// The kernel's mount flags `nosuid`, `nodev` and `noexec` (mount(8)'s options).
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

/// A mounted, not yet serving, io_uring session.
pub struct Session {
    fd: Arc<OwnedFd>,
    dir: PathBuf,
    queue_depth: u16,
    max_write: u32,
    idle_workers: bool,
}

impl Session {
    /// Mounts `dir` and negotiates FUSE_INIT over io_uring. On error nothing stays mounted.
    pub fn mount<B: Backend>(adapter: &B, dir: &Path, config: &MountConfig) -> io::Result<Session> {
        let fd = Arc::new(mount(dir, config)?);
        let session = Session {
            fd,
            dir: dir.to_path_buf(),
            queue_depth: config.queue_depth.max(1),
            max_write: config.max_write.clamp(MAX_WRITE_MIN, MAX_WRITE),
            idle_workers: config.idle_workers,
        };
        let over_uring = true;
        if let Err(e) = init(
            session.fd.as_fd(),
            adapter.writeback(),
            session.max_write,
            over_uring,
        ) {
            session.unmount();
            return Err(e);
        }
        adapter.counters().set_transport("uring");
        adapter.set_notifier(crate::Notifier::Uring(fractal_fuse::FuseNotifier::from(
            session.fd.clone(),
        )));
        Ok(session)
    }

    /// Unmounts (lazily, so that a busy mount point cannot keep the daemon alive).
    pub fn unmount(&self) {
        lazy_unmount(&self.dir);
    }

    /// Serves requests until the file system is unmounted. `ready` runs once requests flow
    /// through the rings; if they never do, the mount is undone and an error returned.
    pub fn run<B: Backend>(self, adapter: Arc<B>, ready: impl FnOnce()) -> io::Result<()> {
        let queues = queue_count();
        let failed = Arc::new(AtomicBool::new(false));
        let mut workers = Vec::new();
        for qid in 0..queues {
            let fs = Uring(adapter.clone());
            let fd = self.fd.as_raw_fd();
            let depth = self.queue_depth;
            let max_write = self.max_write;
            let idle = self.idle_workers;
            let failed = failed.clone();
            let handle = std::thread::Builder::new()
                .name(format!("anvil-uring-{qid}"))
                .spawn(move || {
                    if let Err(e) = run_queue(fd, qid, depth, max_write, fs, idle) {
                        log::error!("io_uring queue {qid}: {e}");
                        failed.store(true, Ordering::Relaxed);
                    }
                })?;
            workers.push(handle);
        }
        let reader = {
            let fd = self.fd.clone();
            let adapter = adapter.clone();
            let max_write = self.max_write;
            std::thread::Builder::new()
                .name("anvil-fuse-dev".to_string())
                .spawn(move || serve_dev_fuse(fd.as_fd(), &*adapter, max_write))?
        };
        match self.wait_ready(&failed) {
            Ok(()) => ready(),
            Err(e) => {
                self.unmount();
                for w in workers {
                    let _ = w.join();
                }
                let _ = reader.join();
                return Err(e);
            }
        }
        for w in workers {
            let _ = w.join();
        }
        let _ = reader.join();
        adapter.destroy();
        if failed.load(Ordering::Relaxed) {
            return Err(io::Error::other("an io_uring queue failed (see the log)"));
        }
        Ok(())
    }

    /// Stats the mount point until the answer comes through a ring (until every queue is
    /// registered, the kernel sends requests to /dev/fuse, where the reader answers EIO).
    fn wait_ready(&self, failed: &AtomicBool) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if failed.load(Ordering::Relaxed) {
                return Err(io::Error::other("io_uring queues failed to start"));
            }
            if std::fs::metadata(&self.dir).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(
                    "the kernel sent no request through io_uring within 10 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Detaches the mount on `dir` (a busy mount point cannot keep the daemon alive).
pub fn lazy_unmount(dir: &Path) {
    if let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) {
        // SAFETY: path is a valid NUL-terminated string.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Mounts `dir`: as root with mount(2), otherwise with `fusermount3`. Returns the /dev/fuse
/// descriptor, before FUSE_INIT.
pub(crate) fn mount(dir: &Path, config: &MountConfig) -> io::Result<OwnedFd> {
    if config.privileged {
        return mount_directly(dir, config);
    }
    let options = fractal_fuse::MountOptions::new()
        .fs_name(config.fs_name.replace(',', "_"))
        .default_permissions(true)
        .read_only(config.read_only)
        .custom_options(if config.noexec {
            "subtype=anvil,noexec"
        } else {
            "subtype=anvil"
        });
    fractal_fuse::mount::fusermount(&options, dir)
}

/// Mounts as root with mount(2) on a fresh /dev/fuse descriptor (no `fusermount3`, which
/// needs a PATH that mount(8) does not give its helpers). Device files and setuid are
/// allowed, other users too, as on the classic transport.
fn mount_directly(dir: &Path, config: &MountConfig) -> io::Result<OwnedFd> {
    use std::ffi::CString;
    use std::os::fd::FromRawFd;
    let dev = CString::new("/dev/fuse").map_err(io::Error::other)?;
    // SAFETY: a valid NUL-terminated path; the result is checked before use.
    let raw = unsafe { libc::open(dev.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a descriptor this function just opened and owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let options =
        format!("fd={raw},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions");
    let cstr = |s: &[u8]| CString::new(s).map_err(io::Error::other);
    let source = cstr(config.fs_name.as_bytes())?;
    let target = cstr(dir.as_os_str().as_bytes())?;
    let fstype = cstr(b"fuse.anvil")?;
    let data = cstr(options.as_bytes())?;
    let mut flags = 0;
    for (set, flag) in [
        (config.read_only, libc::MS_RDONLY),
        (config.nosuid, libc::MS_NOSUID),
        (config.nodev, libc::MS_NODEV),
        (config.noexec, libc::MS_NOEXEC),
    ] {
        if set {
            flags |= flag;
        }
    }
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Answers FUSE_INIT: the classic transport's capabilities plus FUSE_OVER_IO_URING.
pub(crate) fn init(
    fd: BorrowedFd<'_>,
    writeback: bool,
    max_write: u32,
    over_uring: bool,
) -> io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let n = read_fd(fd, &mut buf)?;
    let header: fuse_in_header = read_struct(&buf[..n], 0)?;
    if header.opcode != FUSE_INIT {
        return Err(io::Error::other(format!(
            "expected FUSE_INIT, got opcode {}",
            header.opcode
        )));
    }
    let arg: fuse_init_in = read_struct(&buf[..n], std::mem::size_of::<fuse_in_header>())?;
    if arg.major != FUSE_KERNEL_VERSION {
        return Err(io::Error::other(format!(
            "kernel FUSE protocol {}.{} is not 7.x",
            arg.major, arg.minor
        )));
    }
    let kernel = arg.flags as u64 | ((arg.flags2 as u64) << 32);
    if over_uring && kernel & FUSE_OVER_IO_URING == 0 {
        return Err(io::Error::other(
            "the kernel did not offer FUSE_OVER_IO_URING",
        ));
    }
    let mut want = (FUSE_INIT_EXT
        | FUSE_ASYNC_READ
        | FUSE_BIG_WRITES
        | FUSE_DO_READDIRPLUS
        | FUSE_READDIRPLUS_AUTO
        | FUSE_ASYNC_DIO
        | FUSE_PARALLEL_DIROPS
        | FUSE_MAX_PAGES
        | FUSE_NO_OPEN_SUPPORT
        | FUSE_NO_OPENDIR_SUPPORT
        | FUSE_HANDLE_KILLPRIV_V2) as u64;
    if over_uring {
        want |= FUSE_OVER_IO_URING;
    }
    if writeback {
        want |= FUSE_WRITEBACK_CACHE as u64;
    }
    want &= kernel;
    let out = fuse_init_out {
        major: FUSE_KERNEL_VERSION,
        minor: FUSE_KERNEL_MINOR_VERSION.min(arg.minor),
        max_readahead: arg.max_readahead.min(MAX_READAHEAD),
        flags: (want & 0xffff_ffff) as u32,
        max_background: 64,
        congestion_threshold: 48,
        max_write,
        time_gran: 1,
        #[expect(
            clippy::cast_possible_truncation,
            reason = "max_write is at most MAX_WRITE, 1 MiB: 256 pages"
        )]
        max_pages: (max_write / 4096) as u16,
        map_alignment: 0,
        flags2: (want >> 32) as u32,
        max_stack_depth: 0,
        request_timeout: 0,
        unused: [0; 11],
    };
    let header = fuse_out_header {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "two fixed ABI structs, under a hundred bytes"
        )]
        len: (std::mem::size_of::<fuse_out_header>() + std::mem::size_of::<fuse_init_out>()) as u32,
        error: 0,
        unique: header.unique,
    };
    let mut reply = struct_bytes(&header).to_vec();
    reply.extend_from_slice(struct_bytes(&out));
    write_fd(fd, &reply)?;
    log::info!("FUSE_INIT: flags {want:#x}");
    Ok(())
}

/// One queue: a pinned thread with its own compio runtime and `depth` ring entries, each
/// looping register/dispatch/commit until the connection ends.
fn run_queue<B: Backend>(
    fd: i32,
    qid: usize,
    depth: u16,
    max_write: u32,
    fs: Uring<B>,
    idle: bool,
) -> io::Result<()> {
    let queue = u16::try_from(qid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "FUSE queue id beyond u16"))?;
    if idle {
        crate::set_idle_policy(true);
    }
    // The engine's locks are mostly held by the worker on the other CPU: worth a short spin.
    anvil::sync::spin_when_contended(true);
    let cpus = std::collections::HashSet::from([qid]);
    let rt = Runtime::builder().thread_affinity(cpus).build()?;
    rt.block_on(async move {
        register_files(&[fd])?;
        let entries = allocate_ring_entries(depth, max_write as usize)?;
        let fs = Rc::new(fs);
        let mut tasks = FuturesUnordered::new();
        for mut entry in entries {
            crate::release_payload_pages(&mut entry);
            let fs = fs.clone();
            tasks.push(compio_runtime::spawn(async move {
                serve_entry(queue, &mut entry, &fs).await
            }));
        }
        let mut result = Ok(());
        while let Some(done) = tasks.next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(e),
                Err(e) => result = Err(io::Error::other(format!("ring task aborted: {e:?}"))),
            }
        }
        let _ = unregister_files();
        result
    })
}

use std::rc::Rc;

/// One ring entry: hand it to the kernel, then answer each request it brings and fetch the
/// next in the same command. Ends quietly when the file system is unmounted.
async fn serve_entry<B: Backend>(qid: u16, entry: &mut RingEntry, fs: &Uring<B>) -> io::Result<()> {
    if !submit(FuseRegister::new(entry, qid)).await? {
        return Ok(());
    }
    loop {
        let (reply, panicked) = dispatch_timed(fs, entry).await;
        if panicked.is_err() {
            log::error!("a request handler panicked; answered EIO");
        }
        let more = if reply.is_none() {
            // FORGET: no reply; give the entry back to the kernel.
            submit(FuseRegister::new(entry, qid)).await?
        } else {
            submit(FuseCommitAndFetch::new(qid, entry.commit_id())).await?
        };
        if !more {
            return Ok(());
        }
    }
}

/// Answers the request in `entry` (the reply left in it; None for a FORGET), adding the
/// time the daemon took to its opcode's counter when it samples this one (`anvil stats`).
pub(crate) async fn dispatch_timed<B: Backend>(
    fs: &Uring<B>,
    entry: &mut RingEntry,
) -> (Option<()>, std::thread::Result<()>) {
    let opcode = entry.header().in_header().opcode;
    let counters = fs.0.counters();
    let started = counters.times(opcode).then(std::time::Instant::now);
    let answered = fractal_fuse::dispatch::dispatch(fs, entry).await;
    if let Some(started) = started {
        counters.served(opcode, started.elapsed());
    }
    answered
}

/// Submits one FUSE io_uring command; false once the connection is gone (unmounted).
async fn submit<T: compio_driver::OpCode + 'static>(op: T) -> io::Result<bool> {
    match compio_runtime::submit(op).await.0 {
        Ok(_) => Ok(true),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED)
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// How long the /dev/fuse thread waits after a FORGET before it reads again.
const FORGET_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Serves /dev/fuse beside the rings: FORGETs and INTERRUPTs, and EIO for any request made
/// before every queue was registered (only the readiness probe makes those).
fn serve_dev_fuse<B: Backend>(fd: BorrowedFd<'_>, adapter: &B, max_write: u32) {
    let mut buf = vec![0u8; max_write as usize + 4096];
    loop {
        let n = match read_fd(fd, &mut buf) {
            Ok(n) => n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            // ENODEV: unmounted.
            Err(_) => return,
        };
        let Ok(header) = read_struct::<fuse_in_header>(&buf[..n], 0) else {
            continue;
        };
        let body = std::mem::size_of::<fuse_in_header>();
        if matches!(header.opcode, FUSE_FORGET | FUSE_BATCH_FORGET) {
            // Nothing waits for a FORGET. Pausing after one lets the next ones collect, so
            // that the kernel hands them over as one BATCH_FORGET instead of waking this
            // thread for each (a proxy replay sends half a million).
            std::thread::sleep(FORGET_PAUSE);
        }
        match header.opcode {
            FUSE_INTERRUPT => {} // Requests are short and not interruptible; no reply.
            FUSE_FORGET => {
                adapter.counters().count(Op::Forget);
                if let Ok(arg) = read_struct::<fuse_forget_in>(&buf[..n], body) {
                    adapter.forget(header.nodeid, arg.nlookup);
                }
            }
            FUSE_BATCH_FORGET => {
                let Ok(arg) = read_struct::<fuse_batch_forget_in>(&buf[..n], body) else {
                    continue;
                };
                let first = body + std::mem::size_of::<fuse_batch_forget_in>();
                let one = std::mem::size_of::<fuse_forget_one>();
                for i in 0..arg.count as usize {
                    let Ok(f) = read_struct::<fuse_forget_one>(&buf[..n], first + i * one) else {
                        break;
                    };
                    adapter.counters().count(Op::Forget);
                    adapter.forget(f.nodeid, f.nlookup);
                }
            }
            _ => {
                adapter.counters().count(Op::Other);
                let reply = fuse_out_header {
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "a fixed ABI struct of 16 bytes"
                    )]
                    len: std::mem::size_of::<fuse_out_header>() as u32,
                    error: -libc::EIO,
                    unique: header.unique,
                };
                let _ = write_fd(fd, struct_bytes(&reply));
            }
        }
    }
}

pub(crate) fn read_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of buf.len() bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    // Negative: failed, with errno set.
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

pub(crate) fn write_fd(fd: BorrowedFd<'_>, data: &[u8]) -> io::Result<()> {
    // SAFETY: data is valid for reads of data.len() bytes.
    let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Plain-old-data kernel ABI structs (repr(C), integer fields only).
pub(crate) trait Abi: Copy {}
impl Abi for fuse_in_header {}
impl Abi for fuse_out_header {}
impl Abi for fuse_init_in {}
impl Abi for fuse_init_out {}
impl Abi for fuse_forget_in {}
impl Abi for fuse_batch_forget_in {}
impl Abi for fuse_forget_one {}

/// Reads an ABI struct at `offset`, bounds checked.
pub(crate) fn read_struct<T: Abi>(buf: &[u8], offset: usize) -> io::Result<T> {
    let end = offset
        .checked_add(std::mem::size_of::<T>())
        .filter(|&end| end <= buf.len())
        .ok_or_else(|| io::Error::other("short FUSE message"))?;
    let bytes = &buf[offset..end];
    // SAFETY: `bytes` holds size_of::<T>() bytes; T is a repr(C) struct of integers, for
    // which every bit pattern is valid; read_unaligned makes no alignment assumption.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

pub(crate) fn struct_bytes<T: Abi>(value: &T) -> &[u8] {
    // SAFETY: T is a repr(C) struct of integers without padding bytes the kernel reads;
    // the slice covers exactly the value and lives as long as the borrow.
    unsafe {
        std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>())
    }
}

/// The adapter as a `fractal_fuse::Filesystem`, for its request decoder.
pub struct Uring<B: Backend>(pub Arc<B>);

fn timestamp(t: anvil::fs::Time) -> Timestamp {
    // FUSE's seconds field is a u64 that the kernel reads back as a signed time64_t: times
    // before 1970 travel as two's complement (as they do on the classic path through fuser).
    #[expect(
        clippy::cast_sign_loss,
        reason = "two's complement on purpose: the kernel reads the u64 back as time64_t"
    )]
    Timestamp::new(t.sec as u64, t.nsec)
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: attr.ino,
        size: attr.size,
        blocks: attr.blocks,
        atime: timestamp(attr.atime),
        mtime: timestamp(attr.mtime),
        ctime: timestamp(attr.ctime),
        mode: file_type(attr.kind).to_mode() | (attr.mode & 0o7777),
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        #[expect(
            clippy::cast_possible_truncation,
            reason = "rdev is stored from mknod's 32-bit device number"
        )]
        rdev: attr.rdev as u32,
        blksize: 4096,
    }
}

fn time_set(t: SetAttrTime) -> TimeSet {
    match t {
        SetAttrTime::Now => TimeSet::Now,
        SetAttrTime::Specific(t) => TimeSet::At(anvil::fs::Time {
            #[expect(
                clippy::cast_possible_wrap,
                reason = "two's complement on purpose: FUSE carries time64_t in a u64"
            )]
            sec: t.sec as i64,
            nsec: t.nsec,
        }),
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid,
        gid: req.gid,
    }
}

fn xattr(size: u32, result: Reply<Vec<u8>>) -> FsResult<ReplyXattr> {
    let data = result?;
    if size == 0 {
        Ok(ReplyXattr::Size(
            u32::try_from(data.len()).map_err(|_| libc::E2BIG)?,
        ))
    } else if data.len() > size as usize {
        Err(libc::ERANGE)
    } else {
        Ok(ReplyXattr::Data(data))
    }
}

/// FUSE_UNIQUE_RESEND: the kernel sets it on a request it sends again after
/// FUSE_NOTIFY_RESEND (a daemon that died had read it; see `devfuse::Session::resume`).
const UNIQUE_RESEND: u64 = 1 << 63;

/// A resent UNLINK, RMDIR or RENAME that finds its name gone was most likely done by the
/// daemon that died before answering: success, as the first answer would have been.
fn removed(req: &Request, result: Reply<()>) -> Reply<()> {
    match result {
        Err(libc::ENOENT) if req.unique & UNIQUE_RESEND != 0 => Ok(()),
        other => other,
    }
}

impl<B: Backend> Uring<B> {
    fn count(&self, op: Op) {
        self.0.counters().count(op);
    }

    /// A resent MKNOD, MKDIR, SYMLINK or LINK that finds its name taken was most likely
    /// done by the daemon that died before answering: the entry it would have answered.
    fn created(
        &self,
        req: &Request,
        parent: InodeId,
        name: &OsStr,
        result: Reply<Attr>,
    ) -> Reply<Attr> {
        match result {
            Err(libc::EEXIST) if req.unique & UNIQUE_RESEND != 0 => {
                self.0.lookup(parent.0, name.as_bytes())
            }
            other => other,
        }
    }

    fn entry(&self, result: Reply<Attr>) -> FsResult<ReplyEntry> {
        result.map(|attr| ReplyEntry {
            ttl: self.0.ttl(),
            attr: file_attr(&attr),
            generation: 0,
        })
    }

    fn attr(&self, result: Reply<Attr>) -> FsResult<ReplyAttr> {
        result.map(|attr| ReplyAttr {
            ttl: self.0.ttl(),
            attr: file_attr(&attr),
        })
    }
}

impl<B: Backend> fractal_fuse::Filesystem for Uring<B> {
    async fn lookup(&self, _req: Request, parent: InodeId, name: &OsStr) -> FsResult<ReplyEntry> {
        self.count(Op::Lookup);
        match self.0.lookup(parent.0, name.as_bytes()) {
            // A negative entry: node 0, remembered for the timeout.
            Err(libc::ENOENT) => match self.0.negative_ttl(parent.0, name.as_bytes()) {
                ttl if ttl.is_zero() => Err(libc::ENOENT),
                ttl => Ok(ReplyEntry {
                    ttl,
                    attr: FileAttr::default(),
                    generation: 0,
                }),
            },
            found => self.entry(found),
        }
    }

    fn forget(&self, _req: Request, inode: InodeId, nlookup: u64) {
        self.count(Op::Forget);
        self.0.forget(inode.0, nlookup);
    }

    async fn getattr(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: Option<FileHandleId>,
        _flags: u32,
    ) -> FsResult<ReplyAttr> {
        self.count(Op::Getattr);
        self.attr(self.0.getattr(inode.0))
    }

    async fn setattr(
        &self,
        req: Request,
        inode: InodeId,
        _fh: Option<FileHandleId>,
        set: fractal_fuse::SetAttr,
    ) -> FsResult<ReplyAttr> {
        self.count(Op::Setattr);
        let changes = SetAttr {
            mode: set.mode,
            uid: set.uid,
            gid: set.gid,
            size: set.size,
            atime: set.atime.map(time_set),
            mtime: set.mtime.map(time_set),
            ctime: set.ctime.map(|t| anvil::fs::Time {
                #[expect(
                    clippy::cast_possible_wrap,
                    reason = "two's complement on purpose: FUSE carries time64_t in a u64"
                )]
                sec: t.sec as i64,
                nsec: t.nsec,
            }),
        };
        self.attr(self.0.setattr(req.uid, inode.0, &changes))
    }

    async fn readlink(&self, _req: Request, inode: InodeId) -> FsResult<ReplyReadlink> {
        self.count(Op::Readlink);
        self.0.readlink(inode.0).map(|data| ReplyReadlink { data })
    }

    async fn symlink(
        &self,
        req: Request,
        parent: InodeId,
        name: &OsStr,
        link: &OsStr,
    ) -> FsResult<ReplyEntry> {
        self.count(Op::Symlink);
        let result = self
            .0
            .symlink(caller(&req), parent.0, name.as_bytes(), link.as_bytes());
        self.entry(self.created(&req, parent, name, result))
    }

    async fn mknod(
        &self,
        req: Request,
        parent: InodeId,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> FsResult<ReplyEntry> {
        // The kernel applied the umask already (no FUSE_DONT_MASK).
        self.count(Op::Mknod);
        let result = self
            .0
            .mknod(caller(&req), parent.0, name.as_bytes(), mode, rdev as u64);
        self.entry(self.created(&req, parent, name, result))
    }

    async fn mkdir(
        &self,
        req: Request,
        parent: InodeId,
        name: &OsStr,
        mode: u32,
        umask: u32,
    ) -> FsResult<ReplyEntry> {
        self.count(Op::Mkdir);
        let result = self
            .0
            .mkdir(caller(&req), parent.0, name.as_bytes(), mode & !umask);
        self.entry(self.created(&req, parent, name, result))
    }

    async fn unlink(&self, req: Request, parent: InodeId, name: &OsStr) -> FsResult<()> {
        self.count(Op::Unlink);
        removed(&req, self.0.unlink(parent.0, name.as_bytes()))
    }

    async fn rmdir(&self, req: Request, parent: InodeId, name: &OsStr) -> FsResult<()> {
        self.count(Op::Rmdir);
        removed(&req, self.0.rmdir(parent.0, name.as_bytes()))
    }

    async fn rename(
        &self,
        req: Request,
        parent: InodeId,
        name: &OsStr,
        new_parent: InodeId,
        new_name: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        self.count(Op::Rename);
        let result = self.0.rename(
            parent.0,
            name.as_bytes(),
            new_parent.0,
            new_name.as_bytes(),
            flags,
        );
        removed(&req, result)
    }

    async fn link(
        &self,
        req: Request,
        inode: InodeId,
        new_parent: InodeId,
        new_name: &OsStr,
    ) -> FsResult<ReplyEntry> {
        self.count(Op::Link);
        let result = self.0.link(inode.0, new_parent.0, new_name.as_bytes());
        self.entry(self.created(&req, new_parent, new_name, result))
    }

    async fn open(&self, _req: Request, _inode: InodeId, _flags: u32) -> FsResult<ReplyOpen> {
        // FUSE_NO_OPEN_SUPPORT: ENOSYS stops OPEN and RELEASE for good.
        self.count(Op::Open);
        Err(libc::ENOSYS)
    }

    async fn read(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: FileHandleId,
        offset: u64,
        buf: &mut [u8],
    ) -> FsResult<usize> {
        self.count(Op::Read);
        let data = self.0.read(
            inode.0,
            offset,
            u32::try_from(buf.len()).unwrap_or(u32::MAX),
        )?;
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        Ok(n)
    }

    async fn write(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: FileHandleId,
        offset: u64,
        data: &[u8],
        write_flags: u32,
        _flags: u32,
    ) -> FsResult<usize> {
        self.count(Op::Write);
        let kill = write_flags & FUSE_WRITE_KILL_SUIDGID != 0;
        self.0.write(inode.0, offset, data, kill)
    }

    async fn flush(
        &self,
        _req: Request,
        _inode: InodeId,
        _fh: FileHandleId,
        _lock_owner: u64,
    ) -> FsResult<()> {
        self.count(Op::Flush);
        Err(libc::ENOSYS)
    }

    async fn release(
        &self,
        _req: Request,
        _inode: InodeId,
        _fh: FileHandleId,
        _flags: u32,
        _lock_owner: u64,
        _flush: bool,
        _flock_release: bool,
    ) -> FsResult<()> {
        self.count(Op::Release);
        Ok(())
    }

    async fn fsync(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: FileHandleId,
        _datasync: bool,
    ) -> FsResult<()> {
        self.count(Op::Fsync);
        self.0.fsync(inode.0)
    }

    async fn opendir(&self, _req: Request, _inode: InodeId, _flags: u32) -> FsResult<ReplyOpen> {
        self.count(Op::Opendir);
        Err(libc::ENOSYS)
    }

    async fn readdir(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: FileHandleId,
        offset: u64,
        size: u32,
    ) -> FsResult<Vec<DirectoryEntry>> {
        self.count(Op::Readdir);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for e in self.0.readdir(inode.0, offset)? {
            // fuse_dirent: 24 bytes and the name, padded to 8.
            bytes += (24 + e.name.len()).next_multiple_of(8);
            if bytes > size as usize {
                break;
            }
            out.push(DirectoryEntry {
                ino: e.ino,
                offset: e.cookie,
                kind: file_type(e.kind),
                name: e.name,
            });
        }
        Ok(out)
    }

    async fn readdirplus(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: FileHandleId,
        offset: u64,
        size: u32,
    ) -> FsResult<Vec<DirectoryEntryPlus>> {
        self.count(Op::Readdirplus);
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let entries: Vec<EntryPlus> = self.0.readdirplus(inode.0, offset)?;
        for e in entries {
            // fuse_direntplus: entry_out (128) + dirent (24) and the name, padded to 8.
            bytes += (152 + e.entry.name.len()).next_multiple_of(8);
            if bytes > size as usize {
                break;
            }
            self.0.remember_entry(&e);
            out.push(DirectoryEntryPlus {
                ino: e.entry.ino,
                offset: e.entry.cookie,
                kind: file_type(e.entry.kind),
                name: e.entry.name,
                entry_ttl: e.ttl,
                attr: file_attr(&e.attr),
                generation: 0,
            });
        }
        Ok(out)
    }

    async fn fsyncdir(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: FileHandleId,
        _datasync: bool,
    ) -> FsResult<()> {
        self.count(Op::Fsyncdir);
        self.0.fsync(inode.0)
    }

    async fn statfs(&self, _req: Request, _inode: InodeId) -> FsResult<ReplyStatfs> {
        self.count(Op::Statfs);
        let s = self.0.statfs();
        Ok(ReplyStatfs {
            blocks: s.blocks,
            bfree: s.blocks_free,
            bavail: s.blocks_available,
            files: s.files,
            ffree: s.files_free,
            bsize: s.block_bytes,
            namelen: s.name_bytes_max,
            frsize: s.block_bytes,
        })
    }

    async fn access(&self, _req: Request, inode: InodeId, _mask: u32) -> FsResult<()> {
        self.count(Op::Access);
        self.0.access(inode.0)
    }

    async fn create(
        &self,
        req: Request,
        parent: InodeId,
        name: &OsStr,
        mode: u32,
        flags: u32,
    ) -> FsResult<ReplyCreate> {
        // The kernel applied the umask already; `mode` carries S_IFREG.
        self.count(Op::Create);
        let result = self
            .0
            .mknod(caller(&req), parent.0, name.as_bytes(), mode, 0);
        let attr = self.created(&req, parent, name, result)?;
        Ok(ReplyCreate {
            ttl: self.0.ttl(),
            attr: file_attr(&attr),
            generation: 0,
            fh: FileHandleId(0),
            flags: if crate::create_goes_direct(flags, self.0.writeback()) {
                FOPEN_DIRECT_IO
            } else {
                0
            },
        })
    }

    async fn fallocate(
        &self,
        _req: Request,
        inode: InodeId,
        _fh: FileHandleId,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> FsResult<()> {
        self.count(Op::Fallocate);
        #[expect(
            clippy::cast_possible_wrap,
            reason = "flag bits, passed on as the C int the adapter takes"
        )]
        self.0.fallocate(inode.0, offset, length, mode as i32)
    }

    async fn setxattr(
        &self,
        _req: Request,
        inode: InodeId,
        name: &OsStr,
        value: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        self.count(Op::Setxattr);
        #[expect(
            clippy::cast_possible_wrap,
            reason = "flag bits, passed on as the C int the adapter takes"
        )]
        let flags = flags as i32;
        self.0.setxattr(inode.0, name.as_bytes(), value, flags)
    }

    async fn getxattr(
        &self,
        _req: Request,
        inode: InodeId,
        name: &OsStr,
        size: u32,
    ) -> FsResult<ReplyXattr> {
        self.count(Op::Getxattr);
        xattr(size, self.0.getxattr(inode.0, name.as_bytes()))
    }

    async fn listxattr(&self, _req: Request, inode: InodeId, size: u32) -> FsResult<ReplyXattr> {
        self.count(Op::Listxattr);
        xattr(size, self.0.listxattr(inode.0))
    }

    async fn removexattr(&self, _req: Request, inode: InodeId, name: &OsStr) -> FsResult<()> {
        self.count(Op::Removexattr);
        self.0.removexattr(inode.0, name.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_budget_gets_smaller_ring_buffers() {
        let depth = DEFAULT_QUEUE_DEPTH;
        // The default budget keeps 1 MiB requests.
        assert_eq!(max_write_for(depth, 256 << 20), MAX_WRITE);
        // Smaller budgets halve it until the rings take at most a quarter...
        let mut last = MAX_WRITE;
        for budget in [128u64 << 20, 64 << 20, 32 << 20, 16 << 20, 4 << 20, 0] {
            let max_write = max_write_for(depth, budget);
            assert!(max_write <= last, "{budget}: {max_write} > {last}");
            assert!(max_write.is_power_of_two() && max_write >= MAX_WRITE_MIN);
            assert!(
                max_write == MAX_WRITE_MIN || ring_bytes(depth, max_write) <= budget / 4,
                "{budget}: rings of {max_write} take more than a quarter"
            );
            last = max_write;
        }
        // ...and never below what a chunk needs.
        assert_eq!(max_write_for(depth, 0), MAX_WRITE_MIN);
    }
}
