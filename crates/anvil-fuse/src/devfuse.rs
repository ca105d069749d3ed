//! The /dev/fuse transport of our own: worker threads read requests from their own clones
//! of the connection's descriptor and answer them with one `writev` each, through the same
//! request decoding and adapter as the io_uring transport (`fractal-fuse`'s `dispatch` over
//! a `RingEntry` filled by hand).
//!
//! Why not `fuser`, which the `classic` transport uses: `fuser` insists on answering
//! FUSE_INIT itself, so a daemon started on a connection that another process kept open
//! (to take over after a crash) could not serve it; and a request read here goes to the
//! same code as one taken from a ring, so both transports decode and answer alike.
//!
//! A request read from /dev/fuse is the in-header, then the operation's own header (its
//! "first argument", e.g. `fuse_write_in`), then the rest (names, data). A ring entry holds
//! the three apart: the in-header, `op_in`, and the payload. Each read is scattered into an
//! 80-byte head (in-header and `fuse_write_in`) and the entry's payload, so that a WRITE's
//! data lands at the start of the payload without a copy; for other operations the few
//! bytes of names or values are moved into place.

use crate::uring::{read_struct, struct_bytes, MountConfig, Uring, MAX_WRITE, MAX_WRITE_MIN};
use crate::Backend;
use fractal_fuse::abi::*;
use fractal_fuse::ring::RingEntry;
use std::future::Future;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// In-header and the largest first argument that precedes data (`fuse_write_in`).
const HEAD_BYTES: usize = size_of::<fuse_in_header>() + size_of::<fuse_write_in>();
const IN_HEADER_BYTES: usize = size_of::<fuse_in_header>();
#[expect(
    clippy::cast_possible_truncation,
    reason = "a fixed ABI struct of 16 bytes"
)]
const OUT_HEADER_LEN: u32 = size_of::<fuse_out_header>() as u32;
/// FUSE_NOTIFY_RESEND (linux/fuse.h, protocol 7.40): the kernel queues again every request
/// read from the descriptor and not answered yet.
const FUSE_NOTIFY_RESEND: i32 = 7;
/// FUSE_SETXATTR's first argument without FUSE_SETXATTR_EXT (not negotiated).
const SETXATTR_IN_COMPAT_BYTES: usize = 8;

/// A mounted /dev/fuse session whose FUSE_INIT is answered.
pub struct Session {
    fd: Arc<OwnedFd>,
    dir: PathBuf,
    max_write: u32,
    threads: usize,
    idle_workers: bool,
}

impl Session {
    /// Mounts `dir` and answers FUSE_INIT. On error nothing stays mounted.
    pub fn mount<B: Backend>(
        adapter: &B,
        dir: &Path,
        config: &MountConfig,
        threads: usize,
    ) -> io::Result<Session> {
        let fd = Arc::new(crate::uring::mount(dir, config)?);
        let session = Session {
            fd,
            dir: dir.to_path_buf(),
            max_write: config.max_write.clamp(MAX_WRITE_MIN, MAX_WRITE),
            threads: threads.max(1),
            idle_workers: config.idle_workers,
        };
        let over_uring = false;
        if let Err(e) = crate::uring::init(
            session.fd.as_fd(),
            adapter.writeback(),
            session.max_write,
            over_uring,
        ) {
            session.unmount();
            return Err(e);
        }
        session.attach(adapter);
        Ok(session)
    }

    /// Takes over the connection `fd` of a mount on `dir` whose daemon died (kept open by
    /// the keeper process, see `anvil mount`): no mount and no FUSE_INIT (the kernel keeps
    /// what the first daemon negotiated; the caller passes the same options), and a
    /// FUSE_NOTIFY_RESEND, so that the requests the dead daemon had read but not answered
    /// come again (with bit 63 set in their unique). Those it had answered do not.
    pub fn resume<B: Backend>(
        adapter: &B,
        fd: OwnedFd,
        dir: &Path,
        config: &MountConfig,
        threads: usize,
    ) -> io::Result<Session> {
        let session = Session {
            fd: Arc::new(fd),
            dir: dir.to_path_buf(),
            max_write: config.max_write.clamp(MAX_WRITE_MIN, MAX_WRITE),
            threads: threads.max(1),
            idle_workers: config.idle_workers,
        };
        let resend = fuse_out_header {
            len: OUT_HEADER_LEN,
            error: FUSE_NOTIFY_RESEND,
            unique: 0,
        };
        crate::uring::write_fd(session.fd.as_fd(), struct_bytes(&resend))?;
        session.attach(adapter);
        Ok(session)
    }

    fn attach<B: Backend>(&self, adapter: &B) {
        adapter.counters().set_transport("devfuse");
        adapter.set_notifier(crate::Notifier::Uring(fractal_fuse::FuseNotifier::from(
            self.fd.clone(),
        )));
    }

    /// The connection's descriptor, for the keeper process to hold.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Unmounts lazily.
    pub fn unmount(&self) {
        crate::uring::lazy_unmount(&self.dir);
    }

    /// Serves requests until the file system is unmounted. `ready` runs once a request made
    /// from this process has been answered.
    pub fn run<B: Backend>(self, adapter: Arc<B>, ready: impl FnOnce()) -> io::Result<()> {
        // Reads do not block: a worker polls for a moment before it sleeps (`serve`).
        let raw = self.fd.as_raw_fd();
        // SAFETY: fcntl on a descriptor this session owns, with integer arguments.
        let set = unsafe {
            let flags = libc::fcntl(raw, libc::F_GETFL);
            flags >= 0 && libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
        };
        if !set {
            return Err(io::Error::last_os_error());
        }
        let mut workers = Vec::new();
        for index in 0..self.threads {
            // Every worker reads the same descriptor, not a clone of it: the requests being
            // answered are kept per open descriptor, and when a daemon dies the kernel
            // fails those of its clones (ECONNABORTED) but keeps those of the descriptor
            // the keeper holds for a new daemon to have resent.
            let fd = self.fd.clone();
            let fs = Uring(adapter.clone());
            let max_write = self.max_write;
            let idle = self.idle_workers;
            let handle = std::thread::Builder::new()
                .name(format!("anvil-fuse-{index}"))
                .spawn(move || {
                    if idle {
                        crate::set_idle_policy(true);
                    }
                    anvil::sync::spin_when_contended(true);
                    if let Err(e) = serve(fd.as_fd(), &fs, max_write) {
                        log::error!("/dev/fuse worker {index}: {e}");
                    }
                })?;
            workers.push(handle);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&self.dir).is_err() {
            if Instant::now() > deadline {
                self.unmount();
                for w in workers {
                    let _ = w.join();
                }
                return Err(io::Error::other(
                    "the mount answered no request within 10 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        ready();
        for w in workers {
            let _ = w.join();
        }
        adapter.destroy();
        Ok(())
    }
}

/// The size of an operation's first argument as the kernel sends it on /dev/fuse (what
/// FUSE over io_uring puts in `op_in`); 0 for operations that start with names or carry
/// nothing.
fn first_argument_bytes(opcode: u32) -> usize {
    match opcode {
        FUSE_FORGET => size_of::<fuse_forget_in>(),
        FUSE_GETATTR => size_of::<fuse_getattr_in>(),
        FUSE_SETATTR => size_of::<fuse_setattr_in>(),
        FUSE_MKNOD => size_of::<fuse_mknod_in>(),
        FUSE_MKDIR => size_of::<fuse_mkdir_in>(),
        FUSE_RENAME => size_of::<fuse_rename_in>(),
        FUSE_RENAME2 => size_of::<fuse_rename2_in>(),
        FUSE_LINK => size_of::<fuse_link_in>(),
        FUSE_OPEN | FUSE_OPENDIR => size_of::<fuse_open_in>(),
        FUSE_READ | FUSE_READDIR | FUSE_READDIRPLUS => size_of::<fuse_read_in>(),
        FUSE_WRITE => size_of::<fuse_write_in>(),
        FUSE_RELEASE | FUSE_RELEASEDIR => size_of::<fuse_release_in>(),
        FUSE_FSYNC | FUSE_FSYNCDIR => size_of::<fuse_fsync_in>(),
        FUSE_SETXATTR => SETXATTR_IN_COMPAT_BYTES,
        FUSE_GETXATTR | FUSE_LISTXATTR => size_of::<fuse_getxattr_in>(),
        FUSE_FLUSH => size_of::<fuse_flush_in>(),
        FUSE_GETLK | FUSE_SETLK | FUSE_SETLKW => size_of::<fuse_lk_in>(),
        FUSE_ACCESS => size_of::<fuse_access_in>(),
        FUSE_CREATE | FUSE_TMPFILE => size_of::<fuse_create_in>(),
        FUSE_INTERRUPT => 8, // fuse_interrupt_in: the unique of the request to interrupt
        FUSE_BATCH_FORGET => size_of::<fuse_batch_forget_in>(),
        FUSE_FALLOCATE => size_of::<fuse_fallocate_in>(),
        FUSE_LSEEK => size_of::<fuse_lseek_in>(),
        FUSE_COPY_FILE_RANGE => size_of::<fuse_copy_file_range_in>(),
        FUSE_STATX => size_of::<fuse_statx_in>(),
        // LOOKUP, UNLINK, RMDIR, SYMLINK, REMOVEXATTR: names only; READLINK, STATFS,
        // DESTROY: nothing; anything else goes to the payload whole.
        _ => 0,
    }
}

/// Lays out a request read as `head[..n.min(HEAD_BYTES)]` followed by `payload[..]` the
/// way a ring entry holds it. Returns the opcode, or None if the request is malformed.
fn unpack(entry: &mut RingEntry, head: &[u8; HEAD_BYTES], n: usize) -> Option<u32> {
    if n < IN_HEADER_BYTES {
        return None;
    }
    entry.header_mut().in_out[..IN_HEADER_BYTES].copy_from_slice(&head[..IN_HEADER_BYTES]);
    let opcode = entry.header().in_header().opcode;
    let body = n - IN_HEADER_BYTES;
    let arg0 = first_argument_bytes(opcode).min(body);
    let rest = body - arg0;
    let in_head = (n.min(HEAD_BYTES)) - IN_HEADER_BYTES; // body bytes that are in `head`
    {
        let header = entry.header_mut();
        header.op_in.fill(0);
        let from_head = arg0.min(in_head);
        header.op_in[..from_head]
            .copy_from_slice(&head[IN_HEADER_BYTES..IN_HEADER_BYTES + from_head]);
    }
    let payload_capacity = entry.payload_len();
    if arg0 > in_head {
        // A first argument longer than the head (SETATTR, COPY_FILE_RANGE, LK): its tail is
        // at the start of the payload, the rest after it.
        let tail = arg0 - in_head;
        let mut op_tail = [0u8; 128];
        op_tail[..tail].copy_from_slice(&entry.payload_mut()[..tail]);
        entry.header_mut().op_in[in_head..arg0].copy_from_slice(&op_tail[..tail]);
        entry.payload_mut().copy_within(tail..tail + rest, 0);
    } else {
        // The rest starts inside the head (names after a short first argument): move what
        // the payload holds up, and put the head's part in front.
        let from_head = in_head - arg0;
        if from_head > 0 {
            let in_payload = rest - from_head;
            if rest > payload_capacity {
                return None;
            }
            let payload = entry.payload_mut();
            payload.copy_within(..in_payload, from_head);
            let start = IN_HEADER_BYTES + arg0;
            payload[..from_head].copy_from_slice(&head[start..start + from_head]);
        }
    }
    entry.header_mut().ring_ent_in_out.payload_sz = u32::try_from(rest).ok()?;
    Some(opcode)
}

/// One worker: read, dispatch, answer, until the connection ends.
fn serve<B: Backend>(fd: BorrowedFd<'_>, fs: &Uring<B>, max_write: u32) -> io::Result<()> {
    // Room for the 40 bytes a request of names may be moved up by (`unpack`).
    let mut entry = RingEntry::new(max_write as usize + 4096)?;
    crate::release_payload_pages(&mut entry);
    let mut head = [0u8; HEAD_BYTES];
    let mut last_request = Instant::now();
    loop {
        let n = {
            let payload = entry.payload_mut();
            let iov = [
                libc::iovec {
                    iov_base: head.as_mut_ptr().cast(),
                    iov_len: HEAD_BYTES,
                },
                libc::iovec {
                    iov_base: payload.as_mut_ptr().cast(),
                    iov_len: payload.len(),
                },
            ];
            // SAFETY: both buffers are valid for writes of their lengths.
            let n = unsafe { libc::readv(fd.as_raw_fd(), iov.as_ptr(), 2) };
            match usize::try_from(n) {
                Ok(n) => n,
                Err(_) => match io::Error::last_os_error().raw_os_error() {
                    // Nothing queued (the descriptor does not block): look again for a
                    // moment after a request, then sleep until one comes.
                    Some(libc::EAGAIN) => {
                        if last_request.elapsed() < SPIN {
                            std::hint::spin_loop();
                        } else {
                            wait_readable(fd);
                        }
                        continue;
                    }
                    // ENOENT: the request was interrupted while being read.
                    Some(libc::EINTR | libc::ENOENT) => continue,
                    // Unmounted, or the connection was aborted.
                    Some(libc::ENODEV | libc::ECONNABORTED) => return Ok(()),
                    _ => return Err(io::Error::last_os_error()),
                },
            }
        };
        last_request = Instant::now();
        let Some(opcode) = unpack(&mut entry, &head, n) else {
            log::warn!("a malformed request of {n} bytes from the kernel: answered EIO");
            // Whoever waits for it gets an error instead of waiting for ever.
            let header = read_struct::<fuse_in_header>(&head, 0).ok();
            if let Some(header) = header.filter(|_| n >= IN_HEADER_BYTES) {
                let reply = fuse_out_header {
                    len: OUT_HEADER_LEN,
                    error: -libc::EIO,
                    unique: header.unique,
                };
                let _ = crate::uring::write_fd(fd, struct_bytes(&reply));
            }
            continue;
        };
        if opcode == FUSE_INTERRUPT {
            continue; // Requests are short and not interruptible; no reply.
        }
        let (reply, panicked) = block_on(crate::uring::dispatch_timed(fs, &mut entry));
        if panicked.is_err() {
            log::error!("a request handler panicked; answered EIO");
        }
        if reply.is_none() {
            continue; // FORGET
        }
        answer(fd, &entry)?;
    }
}

/// How long a worker keeps looking for the next request before it sleeps: a request that
/// finds a worker awake skips a wake-up across CPUs.
const SPIN: Duration = Duration::from_micros(50);

/// Sleeps until the descriptor has a request (or the connection ends).
fn wait_readable(fd: BorrowedFd<'_>) {
    let mut pollfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the length given.
    unsafe { libc::poll(&mut pollfd, 1, -1) };
}

/// Writes the reply a dispatch left in `entry` (its out-header's length counts the payload
/// only, as on a ring).
fn answer(fd: BorrowedFd<'_>, entry: &RingEntry) -> io::Result<()> {
    let mut out: fuse_out_header = read_struct(&entry.header().in_out, 0)?;
    let payload = entry.payload();
    out.len = u32::try_from(payload.len())
        .ok()
        .and_then(|len| len.checked_add(OUT_HEADER_LEN))
        .ok_or_else(|| io::Error::other("a reply longer than 4 GiB"))?;
    let out = struct_bytes(&out);
    let iov = [
        libc::iovec {
            iov_base: out.as_ptr().cast_mut().cast(),
            iov_len: out.len(),
        },
        libc::iovec {
            iov_base: payload.as_ptr().cast_mut().cast(),
            iov_len: payload.len(),
        },
    ];
    // SAFETY: both buffers are valid for reads of their lengths; writev does not write.
    let n = unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), 2) };
    if n < 0 {
        return match io::Error::last_os_error().raw_os_error() {
            // ENOENT: the request was interrupted or aborted meanwhile; ENODEV: unmounted.
            Some(libc::ENOENT | libc::EINTR | libc::ENODEV | libc::ECONNABORTED) => Ok(()),
            _ => Err(io::Error::last_os_error()),
        };
    }
    Ok(())
}

/// Runs a future whose handlers do not wait on anything asynchronous (the adapter's are
/// synchronous bodies in async functions): polled until ready, yielding between polls.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as /dev/fuse gives it: the in-header, the first argument, the rest.
    fn request(opcode: u32, arg0: &[u8], rest: &[u8]) -> Vec<u8> {
        let len = IN_HEADER_BYTES + arg0.len() + rest.len();
        let header = fuse_in_header {
            len: u32::try_from(len).unwrap(),
            opcode,
            unique: 42,
            nodeid: 7,
            ..Default::default()
        };
        let mut bytes = struct_bytes(&header).to_vec();
        bytes.extend_from_slice(arg0);
        bytes.extend_from_slice(rest);
        bytes
    }

    /// Scatters `bytes` as `readv` would (head first, then the payload) and unpacks it.
    fn scatter_and_unpack(entry: &mut RingEntry, bytes: &[u8]) -> Option<u32> {
        let mut head = [0u8; HEAD_BYTES];
        let in_head = bytes.len().min(HEAD_BYTES);
        head[..in_head].copy_from_slice(&bytes[..in_head]);
        let rest = &bytes[in_head..];
        entry.payload_mut()[..rest.len()].copy_from_slice(rest);
        unpack(entry, &head, bytes.len())
    }

    #[test]
    fn requests_are_laid_out_as_a_ring_entry_holds_them() {
        let mut entry = RingEntry::new(64 << 10).unwrap();
        let cases: Vec<(u32, usize, Vec<u8>)> = vec![
            (FUSE_LOOKUP, 0, b"a-name\0".to_vec()),
            (FUSE_SYMLINK, 0, b"link\0target/of/some/length\0".to_vec()),
            (
                FUSE_WRITE,
                size_of::<fuse_write_in>(),
                (0..9000u32).map(|i| i as u8).collect(),
            ),
            (FUSE_SETATTR, size_of::<fuse_setattr_in>(), Vec::new()),
            (FUSE_MKNOD, size_of::<fuse_mknod_in>(), b"file\0".to_vec()),
            (
                FUSE_SETXATTR,
                SETXATTR_IN_COMPAT_BYTES,
                b"user.k\0value".to_vec(),
            ),
            (FUSE_BATCH_FORGET, 8, (0..160u32).map(|i| i as u8).collect()),
            (FUSE_GETATTR, size_of::<fuse_getattr_in>(), Vec::new()),
            (FUSE_READLINK, 0, Vec::new()),
            (
                FUSE_COPY_FILE_RANGE,
                size_of::<fuse_copy_file_range_in>(),
                Vec::new(),
            ),
        ];
        for (opcode, arg0_len, rest) in cases {
            let arg0: Vec<u8> = (0..arg0_len)
                .map(|i| (i as u8).wrapping_mul(7) | 1)
                .collect();
            // Something left over from an earlier request must not show through.
            entry.header_mut().op_in.fill(0xee);
            let bytes = request(opcode, &arg0, &rest);
            assert_eq!(scatter_and_unpack(&mut entry, &bytes), Some(opcode));
            let header = entry.header();
            assert_eq!(header.in_header().opcode, opcode);
            assert_eq!(header.in_header().unique, 42);
            assert_eq!(&header.op_in[..arg0_len], &arg0[..], "opcode {opcode}");
            assert!(
                header.op_in[arg0_len..].iter().all(|&b| b == 0),
                "opcode {opcode}"
            );
            assert_eq!(entry.payload(), &rest[..], "opcode {opcode}");
        }
    }

    #[test]
    fn a_request_shorter_than_its_header_is_refused_or_cut() {
        let mut entry = RingEntry::new(64 << 10).unwrap();
        assert_eq!(scatter_and_unpack(&mut entry, &[0u8; 20]), None);
        // A GETATTR whose argument is cut short: what came is the argument, nothing more.
        let bytes = request(FUSE_GETATTR, &[1, 2, 3], &[]);
        assert_eq!(scatter_and_unpack(&mut entry, &bytes), Some(FUSE_GETATTR));
        assert_eq!(&entry.header().op_in[..3], &[1, 2, 3]);
        assert!(entry.payload().is_empty());
    }
}
