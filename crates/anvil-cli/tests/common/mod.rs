//! Helpers shared by the integration tests that mount an anvil volume.
//!
//! * [`fuse_available`] tells whether this process can mount FUSE file systems.
//! * [`fuse_or_skip`] applies the skip policy: without FUSE a test prints
//!   `SKIPPED: <test>: <reason>` and returns, unless `ANVIL_REQUIRE_FUSE=1`
//!   is set (CI sets it), in which case the test panics instead.
//! * [`Mount`] makes an image with `anvil mkfs`, mounts it with `anvil mount`
//!   and, on [`Mount::unmount`], unmounts it, waits for the daemon to finish
//!   and asserts that `anvil check` finds the volume clean. Dropping a `Mount`
//!   that was not unmounted lazily detaches it so that a failing test leaves
//!   no mount behind.

// Every test crate includes this module but uses only part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// The `anvil` binary built for this test run.
pub const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

/// Environment variable that turns a missing FUSE into a test failure.
pub const REQUIRE_FUSE_ENV: &str = "ANVIL_REQUIRE_FUSE";
/// Extra mount options for every test mount (the test script runs the mount tests once
/// per transport with `transport=classic` and `transport=uring`).
pub const TEST_MOUNT_OPTS_ENV: &str = "ANVIL_TEST_MOUNT_OPTS";

/// An env file written by `scripts/garage.sh start` (`export NAME=value` lines): the
/// object store the store tests use.
pub const S3_TEST_ENV: &str = "ANVIL_S3_TEST_ENV";
/// Environment variable that turns a missing object store into a test failure.
pub const REQUIRE_S3_ENV: &str = "ANVIL_REQUIRE_S3";
/// With `1`, every [`Mount`] makes its volume on the object store instead of an image
/// (the test script runs the POSIX differential suite so).
pub const TEST_ON_STORE_ENV: &str = "ANVIL_TEST_ON_STORE";

/// The variables of the [`S3_TEST_ENV`] file, or why there are none.
pub fn s3_env() -> Result<Vec<(String, String)>, String> {
    let path = std::env::var(S3_TEST_ENV)
        .map_err(|_| format!("no object store ({S3_TEST_ENV} names no env file)"))?;
    let text = fs::read_to_string(&path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let mut vars: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches(['"', '\'']).to_string()))
        .collect();
    // A writer that vanished is taken over after a second, not five.
    vars.push(("ANVIL_S3_LEASE_MS".to_string(), "1000".to_string()));
    Ok(vars)
}

/// The skip policy for tests that need the object store: its variables, or `None` after
/// printing `SKIPPED` (a panic with `ANVIL_REQUIRE_S3=1`, which CI sets).
pub fn s3_or_skip(test: &str) -> Option<Vec<(String, String)>> {
    match s3_env() {
        Ok(vars) => Some(vars),
        Err(reason) => {
            if std::env::var(REQUIRE_S3_ENV).is_ok_and(|v| v == "1") {
                panic!("{test}: an object store is required ({REQUIRE_S3_ENV}=1): {reason}");
            }
            eprintln!("SKIPPED: {test}: {reason}");
            None
        }
    }
}

/// A fresh address on the test bucket: `s3://BUCKET/test-...`.
pub fn s3_address(vars: &[(String, String)]) -> PathBuf {
    let bucket = vars
        .iter()
        .find(|(k, _)| k == "ANVIL_S3_BUCKET")
        .map_or("anvil", |(_, v)| v.as_str());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    PathBuf::from(format!(
        "s3://{bucket}/test-{}-{nanos:x}",
        std::process::id()
    ))
}

/// Image size used by [`Mount::new`].
pub const DEFAULT_IMAGE_SIZE: &str = "2G";

/// How long `unmount` waits for the daemon to commit and exit.
const DAEMON_EXIT_TIMEOUT: Duration = Duration::from_secs(20);
/// Upper bound for one `anvil mkfs`, `anvil mount`, `anvil check` or `umount`.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);
/// Words in `anvil check`'s output that mean "the volume is still in use".
const BUSY_WORDS: &[&str] = &["busy", "locked", "in use"];

/// `Ok(())` when this process can mount FUSE file systems, otherwise why not.
pub fn fuse_available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err(format!("not running as root (euid {euid})"));
    }
    let dev = Path::new("/dev/fuse");
    if !dev.exists() {
        return Err("/dev/fuse does not exist".to_string());
    }
    if let Err(e) = fs::OpenOptions::new().read(true).write(true).open(dev) {
        return Err(format!("cannot open /dev/fuse: {e}"));
    }
    match fs::read_to_string("/proc/filesystems") {
        Ok(list)
            if list
                .lines()
                .any(|l| l.split_whitespace().last() == Some("fuse")) => {}
        Ok(_) => return Err("the kernel does not list fuse in /proc/filesystems".to_string()),
        Err(e) => return Err(format!("cannot read /proc/filesystems: {e}")),
    }
    if find_in_path("umount").is_none() {
        return Err("no umount binary in PATH".to_string());
    }
    Ok(())
}

/// The skip policy. Returns `true` when `test` can go on and mount.
///
/// Without FUSE it prints `SKIPPED: <test>: <reason>` to stderr and returns
/// `false`, so the test should simply return; but with `ANVIL_REQUIRE_FUSE=1`
/// in the environment it panics instead, so CI never skips silently.
pub fn fuse_or_skip(test: &str) -> bool {
    match fuse_available() {
        Ok(()) => true,
        Err(reason) => {
            if std::env::var(REQUIRE_FUSE_ENV).is_ok_and(|v| v == "1") {
                panic!("{test}: FUSE is required ({REQUIRE_FUSE_ENV}=1) but unavailable: {reason}");
            }
            eprintln!("SKIPPED: {test}: {reason}");
            false
        }
    }
}

/// A mounted anvil volume in a private temporary directory.
pub struct Mount {
    tmp: tempfile::TempDir,
    image: PathBuf,
    mountpoint: PathBuf,
    options: Option<String>,
    /// The object store's variables when the volume lives there (`image` is its address).
    env: Vec<(String, String)>,
    mounted: bool,
    /// How many times the volume has been mounted, for log file names.
    generation: u32,
}

impl Mount {
    /// A fresh [`DEFAULT_IMAGE_SIZE`] volume, mounted with default options.
    pub fn new() -> Mount {
        Mount::with_options(DEFAULT_IMAGE_SIZE, None)
    }

    /// A fresh volume of `size` (as `anvil mkfs --size` takes it, e.g. "512M").
    pub fn with_size(size: &str) -> Mount {
        Mount::with_options(size, None)
    }

    /// A fresh volume of `size`, mounted with `anvil mount -o options`.
    pub fn with_options(size: &str, options: Option<&str>) -> Mount {
        let env = match std::env::var(TEST_ON_STORE_ENV).is_ok_and(|v| v == "1") {
            true => s3_env().unwrap_or_else(|e| panic!("{TEST_ON_STORE_ENV}=1: {e}")),
            false => Vec::new(),
        };
        Mount::make(size, options, env)
    }

    /// A fresh volume of `size` on the object store whose variables `env` holds.
    pub fn on_store(size: &str, options: Option<&str>, env: Vec<(String, String)>) -> Mount {
        Mount::make(size, options, env)
    }

    fn make(size: &str, options: Option<&str>, env: Vec<(String, String)>) -> Mount {
        let tmp = tempfile::Builder::new()
            .prefix("anvil-test-")
            .tempdir()
            .expect("create temporary directory");
        let image = match env.is_empty() {
            true => tmp.path().join("volume.img"),
            false => s3_address(&env),
        };
        let mountpoint = tmp.path().join("mnt");
        fs::create_dir(&mountpoint).expect("create mount point");
        let mut mount = Mount {
            tmp,
            image,
            mountpoint,
            options: options.map(str::to_string),
            env,
            mounted: false,
            generation: 0,
        };
        let args = [
            OsStr::new("mkfs"),
            mount.image.as_os_str(),
            "--size".as_ref(),
            size.as_ref(),
        ];
        let out = mount.run("mkfs", ANVIL, &args);
        if !out.status.success() {
            panic!(
                "anvil mkfs {} --size {size} failed: {out}",
                mount.image.display()
            );
        }
        mount.mount();
        mount
    }

    /// Where the volume is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The image file backing the volume (or its address on the object store).
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// Whether the volume lives on the object store.
    pub fn on_a_store(&self) -> bool {
        !self.env.is_empty()
    }

    /// The object store's variables (empty for an image).
    pub fn store_env(&self) -> &[(String, String)] {
        &self.env
    }

    /// Runs `anvil args` with the volume's environment, as the harness runs its commands.
    pub fn anvil<S: AsRef<OsStr>>(&self, label: &str, args: &[S]) -> CommandOutput {
        self.run(label, ANVIL, args)
    }

    /// Whether the volume is mounted right now.
    pub fn is_mounted(&self) -> bool {
        self.mounted
    }

    /// Unmounts (asserting a clean `anvil check`) and mounts the image again.
    /// Every file in the mount must be closed first.
    pub fn remount(&mut self) {
        self.unmount_and_check();
        self.mount();
    }

    /// Mounts again after the daemon went away on its own (a signal, a kill).
    pub fn mount_again(&mut self) {
        self.mounted = false;
        self.mount();
    }

    /// Unmounts, waits for the daemon to commit and exit, then asserts that
    /// `anvil check` finds the volume clean.
    pub fn unmount(mut self) {
        self.unmount_and_check();
    }

    /// Like `unmount`, but keeps the image (and its directory) for further use.
    pub fn unmount_keep_image(&mut self) {
        self.unmount_and_check();
    }

    /// Kills the daemon with SIGKILL (if it still runs), detaches the dead mount, waits for
    /// the image to be released, asserts `anvil check` finds the volume clean, and mounts
    /// it again.
    #[allow(dead_code)]
    pub fn kill_daemon_and_remount(&mut self, what: &str) {
        self.kill_daemon(what);
        self.mount_again();
    }

    /// `kill_daemon_and_remount` without the mount: the image as the killed daemon left it
    /// (its crash log file, on tmpfs, still holds what it logged since the last fsync).
    #[allow(dead_code)]
    pub fn kill_daemon(&mut self, what: &str) {
        let mut detach = true;
        if let Some(pid) = daemon_pid(self.image()) {
            let keeper = keeper_of(pid);
            // SAFETY: killing the daemon this test started for its own image.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // On the devfuse transport the keeper starts a new daemon on the same mount:
            // the kill is then a takeover (nothing acknowledged may be lost, the kernel's
            // dirty pages included), and the new daemon is unmounted cleanly.
            if keeper.is_some() && self.wait_for_takeover(pid) {
                detach = !self.unmount_waiting_while_busy();
            }
        }
        if detach {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mountpoint)
                .status();
        }
        for _ in 0..100 {
            if daemon_pid(self.image()).is_none() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            self.on_a_store() || wait_until_released(self.image(), Duration::from_secs(10)),
            "{what}: the killed daemon still holds the image"
        );
        let check = self.check();
        assert!(
            check.status.success(),
            "{what}: volume not clean after the kill: {check}\nprocesses: {}",
            anvil_processes()
        );
        self.mounted = false;
    }

    /// After a kill with a keeper: waits for the new daemon to serve the mount. False if
    /// none came within 15 s.
    fn wait_for_takeover(&self, old: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if daemon_pid(self.image()).is_some_and(|new| new != old) {
                // Answered once the new daemon has replayed the crash log.
                return fs::metadata(&self.mountpoint).is_ok();
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `umount`, retried for 5 s while the mount is busy (a client finishing a call).
    fn unmount_waiting_while_busy(&self) -> bool {
        umount_waiting_while_busy(&self.mountpoint, |args| self.run("umount", "umount", args))
    }

    /// Runs `anvil check IMAGE` once (the volume should not be mounted).
    pub fn check(&self) -> CommandOutput {
        let args = [OsStr::new("check"), self.image.as_os_str()];
        self.run("check", ANVIL, &args)
    }

    fn mount(&mut self) {
        assert!(
            !self.mounted,
            "{} is already mounted",
            self.mountpoint.display()
        );
        self.generation += 1;
        let mut args = vec![
            OsStr::new("mount").to_os_string(),
            self.image.clone().into_os_string(),
            self.mountpoint.clone().into_os_string(),
        ];
        // ANVIL_TEST_MOUNT_OPTS (e.g. transport=classic) applies to every test mount.
        let extra = std::env::var(TEST_MOUNT_OPTS_ENV).unwrap_or_default();
        // The test's own options come last, so they win over the environment's.
        let opts: Vec<&str> = [extra.as_str(), self.options.as_deref().unwrap_or("")]
            .into_iter()
            .filter(|o| !o.is_empty())
            .collect();
        if !opts.is_empty() {
            args.push("-o".into());
            args.push(opts.join(",").into());
        }
        let label = format!("mount{}", self.generation);
        let out = self.run(&label, ANVIL, &args);
        if !out.status.success() {
            panic!(
                "anvil mount {} {} failed: {out}{}",
                self.image.display(),
                self.mountpoint.display(),
                self.daemon_logs()
            );
        }
        if !is_mount_point(&self.mountpoint) {
            panic!(
                "anvil mount exited 0 but {} is not a mount point: {out}{}",
                self.mountpoint.display(),
                self.daemon_logs()
            );
        }
        self.mounted = true;
    }

    fn unmount_and_check(&mut self) {
        assert!(self.mounted, "{} is not mounted", self.mountpoint.display());
        // umount fails with EBUSY while something still has a file open;
        // give transient users (a closing test thread) a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let out = self.run("umount", "umount", &[self.mountpoint.as_os_str()]);
            if out.status.success() {
                break;
            }
            if Instant::now() >= deadline || !out.mentions_busy() {
                panic!(
                    "umount {} failed: {out}{}",
                    self.mountpoint.display(),
                    self.daemon_logs()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
        self.mounted = false;

        // Wait for the daemon: first for every process serving this image to
        // exit (found through /proc, since `anvil mount` need not print its
        // pid), then for `anvil check` to stop reporting the volume as busy.
        let deadline = Instant::now() + DAEMON_EXIT_TIMEOUT;
        loop {
            let daemons = daemon_pids(&self.image);
            if daemons.is_empty() {
                let out = self.check();
                if out.status.success() {
                    return;
                }
                if !out.mentions_busy() {
                    panic!(
                        "anvil check {} after unmount found the volume unclean: {out}{}",
                        self.image.display(),
                        self.daemon_logs()
                    );
                }
                if Instant::now() >= deadline {
                    panic!(
                        "anvil check {} still reports the volume busy {}s after umount: {out}{}",
                        self.image.display(),
                        DAEMON_EXIT_TIMEOUT.as_secs(),
                        self.daemon_logs()
                    );
                }
            } else if Instant::now() >= deadline {
                panic!(
                    "anvil daemon(s) {daemons:?} for {} still running {}s after umount{}",
                    self.image.display(),
                    DAEMON_EXIT_TIMEOUT.as_secs(),
                    self.daemon_logs()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs `program args` with a timeout, its output going to log files in
    /// the temporary directory (a daemon that keeps them open cannot block
    /// us, and its later messages stay readable for failure reports).
    fn run<S: AsRef<OsStr>>(&self, label: &str, program: &str, args: &[S]) -> CommandOutput {
        let stdout_path = self.tmp.path().join(format!("{label}.stdout"));
        let stderr_path = self.tmp.path().join(format!("{label}.stderr"));
        let mut child = Command::new(program)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(File::create(&stdout_path).expect("create stdout log"))
            .stderr(File::create(&stderr_path).expect("create stderr log"))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {program}: {e}"));
        let started = Instant::now();
        let status = loop {
            match child.try_wait().expect("wait for child") {
                Some(status) => break status,
                None if started.elapsed() > COMMAND_TIMEOUT => {
                    // Only the child we spawned, by its pid.
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "{program} {:?} did not finish within {}s",
                        args.iter()
                            .map(|a| a.as_ref().to_owned())
                            .collect::<Vec<_>>(),
                        COMMAND_TIMEOUT.as_secs()
                    );
                }
                None => thread::sleep(Duration::from_millis(20)),
            }
        };
        CommandOutput {
            command: format!(
                "{program} {}",
                args.iter()
                    .map(|a| a.as_ref().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            status,
            stdout: read_lossy(&stdout_path),
            stderr: read_lossy(&stderr_path),
        }
    }

    /// The mount daemons' output so far, for failure messages.
    fn daemon_logs(&self) -> String {
        let mut text = String::new();
        for generation in 1..=self.generation {
            for stream in ["stdout", "stderr"] {
                let path = self.tmp.path().join(format!("mount{generation}.{stream}"));
                let log = read_lossy(&path);
                if !log.trim().is_empty() {
                    text.push_str(&format!("\n--- anvil mount #{generation} {stream} ---\n"));
                    text.push_str(tail(&log, 4000));
                }
            }
        }
        text
    }
}

impl Default for Mount {
    fn default() -> Mount {
        Mount::new()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if !self.mounted {
            return;
        }
        // Best effort, never panic here: detach the mount lazily, then give
        // the daemon a moment to exit, and end it (by pid) if it does not.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.mounted = false;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !daemon_pids(&self.image).is_empty() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(50));
        }
        for pid in daemon_pids(&self.image) {
            kill_with_keeper(pid);
        }
    }
}

/// `umount DIR` through `run`, retried for 5 s while the mount is busy (a client finishing
/// a call; under load, a process of another test forked while it held a file of the mount
/// open, before its exec closed it). True once it succeeds.
pub fn umount_waiting_while_busy(dir: &Path, run: impl Fn(&[&OsStr]) -> CommandOutput) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let out = run(&[dir.as_os_str()]);
        if out.status.success() {
            return true;
        }
        if Instant::now() >= deadline || !out.mentions_busy() {
            eprintln!("{out}");
            return false;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// What a helper command did.
pub struct CommandOutput {
    pub command: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl CommandOutput {
    fn mentions_busy(&self) -> bool {
        let text = format!("{}\n{}", self.stdout, self.stderr).to_lowercase();
        BUSY_WORDS.iter().any(|w| text.contains(w))
    }
}

impl std::fmt::Display for CommandOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` exited with {}", self.command, self.status)?;
        if !self.stdout.trim().is_empty() {
            write!(f, "\n--- stdout ---\n{}", tail(&self.stdout, 4000))?;
        }
        if !self.stderr.trim().is_empty() {
            write!(f, "\n--- stderr ---\n{}", tail(&self.stderr, 4000))?;
        }
        Ok(())
    }
}

/// Whether `dir` is a mount point, according to /proc/self/mountinfo.
pub fn is_mount_point(dir: &Path) -> bool {
    let dir = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|mp| Path::new(&unescape_mountinfo(mp)) == dir)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() {
            let digits = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(digits, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Pids of live processes (other than this one) whose command line names
/// `image`: the mount daemons serving it.
fn daemon_pids(image: &Path) -> Vec<libc::pid_t> {
    let me = std::process::id();
    let image = image.as_os_str().as_encoded_bytes();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline.split(|&b| b == 0).any(|arg| arg == image) && !is_zombie(pid) {
            pids.push(pid as libc::pid_t);
        }
    }
    pids
}

fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // The state follows the parenthesised command name.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_none_or(|state| state == "Z" || state == "X")
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

fn read_lossy(path: &Path) -> String {
    let mut bytes = Vec::new();
    if let Ok(mut f) = File::open(path) {
        let _ = f.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// Waits until no process holds the lock a mounted image carries, so that `anvil check`
/// and a new mount can open it. A killed daemon's command line disappears from /proc
/// (its memory is released first) before its files are closed, so the pid alone is not
/// enough. False if the lock is still held after `timeout`.
pub fn wait_until_released(image: &Path, timeout: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let started = Instant::now();
    loop {
        if let Ok(file) = File::open(image) {
            // SAFETY: flock on a descriptor owned by `file`; closing it drops the lock.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return true;
            }
        }
        if started.elapsed() >= timeout {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The pid of the `anvil mount` daemon serving `image`, if one runs.
pub fn daemon_pid(image: &std::path::Path) -> Option<i32> {
    let needle = image.to_str()?.to_string();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.iter().any(|a| a == "mount") && args.iter().any(|a| a == &needle) {
            return Some(pid);
        }
    }
    None
}

/// `len` pseudo-random bytes (xorshift) from `seed`: file contents a test can regenerate.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// SIGKILL to a daemon and to its keeper (on the devfuse transport a keeper would start a
/// new daemon in its place; `tests/takeover.rs` kills the daemon alone on purpose). A daemon
/// leads its own session and process group, and its keeper (and a daemon the keeper
/// started) stays in it.
pub fn kill_with_keeper(pid: i32) {
    // SAFETY: getpgid and kill have no memory-safety preconditions; the pid is a daemon
    // this test started for its own private image.
    unsafe {
        let group = libc::getpgid(pid);
        if group > 1 && group != libc::getpgid(0) {
            libc::kill(-group, libc::SIGKILL);
        } else {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// `ps` lines of every anvil process (pid, parent, group, state, command), for messages.
pub fn anvil_processes() -> String {
    let out = Command::new("ps")
        .args(["-eo", "pid,ppid,pgid,stat,args"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter(|l| l.contains("anvil"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The keeper process of daemon `pid` (its child running `anvil keeper`), if any.
pub fn keeper_of(pid: i32) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the command may hold spaces and parentheses.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if parent != Some(pid) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if cmdline.split(|&b| b == 0).nth(1) == Some(b"keeper".as_slice()) {
            return Some(child);
        }
    }
    None
}
