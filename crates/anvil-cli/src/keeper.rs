//! The keeper: a small process that holds a FUSE connection's descriptor while the daemon
//! serving it runs, and when the daemon dies (kill -9, the OOM killer, an abort) becomes a
//! new daemon on the same connection.
//!
//! A FUSE connection lives while any process holds a descriptor of it. Without the keeper,
//! a daemon's death closes the last one: the kernel aborts the connection, every system
//! call on the mount fails with ENOTCONN until it is unmounted, and the kernel drops the
//! dirty pages its writeback cache held, which write() had acknowledged. With the keeper
//! the connection stays: system calls wait, the dirty pages stay, and the new daemon
//! (`anvil mount ... --resume-fd N`, the dead one's own arguments) replays the crash log,
//! asks the kernel to send again the requests the dead daemon had read but not answered
//! (FUSE_NOTIFY_RESEND) and serves on. Only the /dev/fuse transport can be taken over
//! (see `anvil_fuse::devfuse`).
//!
//! The daemon and its keeper share a pipe: the daemon holds the write end and writes one
//! byte when it ends on purpose (unmounted); the keeper then exits. End of file without
//! that byte means the daemon died.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

/// The daemon's arguments for its successor (hex, one argument per comma).
const ARGS_ENV: &str = "ANVIL_KEEPER_ARGS";
/// Unix times of the last takeovers of this mount (comma-separated).
const TAKEOVERS_ENV: &str = "ANVIL_TAKEOVERS";
/// A daemon that died more than this many times within `CRASH_LOOP_SECS` is not started
/// again: the keeper exits, and the kernel aborts the connection. `ANVIL_TAKEOVER_LIMIT`
/// (in the mount's environment) changes it, for soak tests that kill on purpose.
const CRASH_LOOP_TAKEOVERS: usize = 3;
const LIMIT_ENV: &str = "ANVIL_TAKEOVER_LIMIT";
const CRASH_LOOP_SECS: u64 = 60;
/// The hidden argument that gives a new daemon the connection's descriptor.
pub const RESUME_ARG: &str = "--resume-fd";

/// The daemon's end: dropping it (the daemon ends on purpose) tells the keeper to exit.
pub struct Keeper {
    pipe: Option<OwnedFd>,
}

impl Drop for Keeper {
    fn drop(&mut self) {
        if let Some(pipe) = self.pipe.take() {
            // SAFETY: writes one byte from a valid buffer to a descriptor owned here.
            let _ = unsafe { libc::write(pipe.as_raw_fd(), b"c".as_ptr().cast(), 1) };
        }
    }
}

/// Starts the keeper of the connection `fuse` for this daemon.
pub fn spawn(fuse: BorrowedFd<'_>) -> io::Result<Keeper> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors into a valid array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just created and are owned here.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut own = std::env::args_os().skip(1);
    let mut args = Vec::new();
    while let Some(arg) = own.next() {
        if arg == RESUME_ARG {
            own.next();
        } else {
            args.push(arg);
        }
    }
    let encoded: Vec<String> = args.iter().map(|a| hex(a.as_bytes())).collect();
    let (fuse_raw, pipe_raw) = (fuse.as_raw_fd(), read_end.as_raw_fd());
    let mut command = Command::new(std::env::current_exe()?);
    command
        .arg("keeper")
        .arg(fuse_raw.to_string())
        .arg(pipe_raw.to_string())
        .env(ARGS_ENV, encoded.join(","))
        .env_remove(crate::mount::READY_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: fcntl is async-signal-safe and touches only the two descriptors.
    unsafe {
        command.pre_exec(move || {
            for fd in [fuse_raw, pipe_raw] {
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command.spawn()?;
    Ok(Keeper {
        pipe: Some(write_end),
    })
}

/// `anvil keeper FD PIPE` (hidden): waits for the daemon to end; if it died, becomes its
/// successor. Returns only if it does not (the daemon ended on purpose, or is crashing in
/// a loop), and then the connection goes with this process.
pub fn run(fuse: RawFd, pipe: RawFd) -> Result<u8, String> {
    let mut byte = [0u8; 1];
    loop {
        // SAFETY: reads at most one byte into a valid buffer.
        let n = unsafe { libc::read(pipe, byte.as_mut_ptr().cast(), 1) };
        match n {
            1 => return Ok(0), // Unmounted: nothing to keep.
            0 => break,        // The daemon died.
            _ if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => continue,
            _ => return Err(format!("keeper: {}", io::Error::last_os_error())),
        }
    }
    // SAFETY: closes the pipe's read end, which this process owns.
    unsafe { libc::close(pipe) };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut takeovers: Vec<u64> = std::env::var(TAKEOVERS_ENV)
        .unwrap_or_default()
        .split(',')
        .filter_map(|t| t.parse().ok())
        .filter(|&t| now.saturating_sub(t) < CRASH_LOOP_SECS)
        .collect();
    takeovers.push(now);
    let limit = std::env::var(LIMIT_ENV)
        .ok()
        .and_then(|l| l.parse().ok())
        .unwrap_or(CRASH_LOOP_TAKEOVERS);
    if takeovers.len() > limit {
        return Err(format!(
            "the daemon died {} times within {CRASH_LOOP_SECS} s; not starting it again",
            takeovers.len()
        ));
    }
    let args: Option<Vec<OsString>> = std::env::var(ARGS_ENV)
        .map_err(|_| format!("keeper: {ARGS_ENV} is not set"))?
        .split(',')
        .map(|a| unhex(a).map(OsString::from_vec))
        .collect();
    let args = args.ok_or_else(|| format!("keeper: {ARGS_ENV} is malformed"))?;
    let stamps: Vec<String> = takeovers.iter().map(u64::to_string).collect();
    let error = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
        .args(args)
        .arg(RESUME_ARG)
        .arg(fuse.to_string())
        .env_remove(ARGS_ENV)
        .env(TAKEOVERS_ENV, stamps.join(","))
        .exec();
    Err(format!("keeper: cannot start a new daemon: {error}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{hex, unhex};

    #[test]
    fn arguments_survive_the_encoding() {
        for arg in [&b""[..], b"/tmp/a b,c", b"\xff\x00-o", b"mount"] {
            assert_eq!(unhex(&hex(arg)).as_deref(), Some(arg));
        }
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
