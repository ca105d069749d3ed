//! `anvil mount`: the FUSE daemon, its background start-up handshake, and clean shutdown.
//!
//! In the background mode the command re-runs itself in the foreground as a detached
//! daemon and waits until the daemon reports "ready" (mounted and serving) or an error on
//! its stdout; only then does it exit. SIGINT/SIGTERM or `umount DIR` end the daemon after
//! a final commit.

use anvil::device::FileDevice;
use anvil::{Filesystem, MountOptions};
use anvil_fuse::{classic::Classic, devfuse, fuser, uring, AnvilFuse, Backend};
use std::ffi::{CString, OsString};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) const READY_ENV: &str = "ANVIL_DAEMON_READY";

struct Config {
    mount: MountOptions,
    ttl: Duration,
    /// How long a missing name stays known missing (`negative_ttl_ms`; the TTL unless set).
    negative_ttl: Option<Duration>,
    /// Worker threads (`threads=N`); unset, each transport's default.
    threads: Option<usize>,
    writeback: bool,
    as_of: Option<String>,
    device_log: Option<std::path::PathBuf>,
    transport: Transport,
    queue_depth: u16,
    /// io_uring: the largest request and each ring entry's buffer (from the budget).
    max_write: u32,
    idle_workers: bool,
    /// O_DIRECT on the device (`device_io=direct`, the default) or the host's page cache.
    direct_io: bool,
    /// The kernel's mount flags `nosuid`, `nodev`, `noexec` (off by default: a root mount
    /// honours setuid bits and device files, as other file systems do).
    nosuid: bool,
    nodev: bool,
    noexec: bool,
    /// Where the crash log's file goes (`crash_log_dir=`); None: the default.
    crash_log_dir: Option<std::path::PathBuf>,
    /// A replica following another host's writer (`--replica`), and how often it looks.
    replica: bool,
    follow: Duration,
    /// An object-store volume's local cache of segment pieces (`cache_dir=`, `cache_size=`).
    store_cache_dir: Option<std::path::PathBuf>,
    store_cache_bytes: u64,
}

/// How requests reach the daemon: `auto` takes io_uring when the kernel offers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Auto,
    Uring,
    Classic,
    /// Our own /dev/fuse loop (`anvil_fuse::devfuse`).
    Devfuse,
}

/// A mount gives the device's read-around windows this fraction of `cache=` (1 to 8 MiB).
const READ_AROUND_SHARE: u64 = 16;
/// A mount gives decoded file data this fraction of `cache=` unless `data_cache=` says.
const DATA_CACHE_SHARE: u64 = 16;

/// CPUs this process may run on.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

fn parse_options(options: &[String]) -> Result<Config, String> {
    let mut config = Config {
        mount: MountOptions::default(),
        ttl: Duration::from_secs(10),
        negative_ttl: None,
        threads: None,
        writeback: false,
        as_of: None,
        device_log: None,
        transport: Transport::Auto,
        queue_depth: uring::DEFAULT_QUEUE_DEPTH,
        max_write: uring::MAX_WRITE,
        idle_workers: true,
        direct_io: true,
        nosuid: false,
        nodev: false,
        noexec: false,
        crash_log_dir: None,
        replica: false,
        follow: Duration::from_secs(1),
        store_cache_dir: None,
        store_cache_bytes: 4 << 30,
    };
    for option in options.iter().filter(|o| !o.is_empty()) {
        let (name, value) = match option.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (option.as_str(), None),
        };
        let number = |v: Option<&str>| -> Result<u64, String> {
            v.ok_or_else(|| format!("option {name} needs a value"))?
                .parse()
                .map_err(|_| format!("option {name}: not a number"))
        };
        match name {
            "ro" => config.mount.read_only = true,
            "rw" => config.mount.read_only = false,
            "nohistory" => config.mount.nohistory = true,
            "history" => config.mount.nohistory = false,
            "cache" => {
                let bytes = crate::parse_size(value.ok_or("option cache needs a size")?)?;
                if bytes < 16 << 20 {
                    return Err("option cache: at least 16M".to_string());
                }
                config.mount.cache_bytes = bytes;
            }
            "crash_log_dir" => {
                let dir = value.filter(|v| !v.is_empty());
                let dir = dir.ok_or("option crash_log_dir needs a directory")?;
                config.crash_log_dir = Some(dir.into());
            }
            "data_cache" => {
                let bytes = crate::parse_size(value.ok_or("option data_cache needs a size")?)?;
                config.mount.data_cache_bytes = Some(bytes);
            }
            "commit_interval_ms" => config.mount.commit_interval_ms = number(value)?.max(1),
            "ttl_ms" => config.ttl = Duration::from_millis(number(value)?),
            "negative_ttl_ms" => {
                config.negative_ttl = Some(Duration::from_millis(number(value)?));
            }
            "follow_ms" => config.follow = Duration::from_millis(number(value)?.max(10)),
            "cache_dir" => {
                let dir = value.filter(|v| !v.is_empty());
                config.store_cache_dir =
                    Some(dir.ok_or("option cache_dir needs a directory")?.into());
            }
            "cache_size" => {
                config.store_cache_bytes =
                    crate::parse_size(value.ok_or("option cache_size needs a size")?)?;
            }
            "writeback" => config.writeback = true,
            "nowriteback" => config.writeback = false,
            "threads" => config.threads = Some(number(value)?.clamp(1, 64) as usize),
            "transport" => {
                config.transport = match value {
                    Some("auto") => Transport::Auto,
                    Some("uring") => Transport::Uring,
                    Some("classic") => Transport::Classic,
                    Some("devfuse") => Transport::Devfuse,
                    _ => {
                        return Err("option transport: auto, uring, classic or devfuse".to_string())
                    }
                }
            }
            "worker_sched" => {
                config.idle_workers = match value {
                    Some("idle") => true,
                    Some("normal") => false,
                    _ => return Err("option worker_sched: idle or normal".to_string()),
                }
            }
            "crash_log" => {
                config.mount.crash_log = match value {
                    Some("on") => true,
                    Some("off") => false,
                    _ => return Err("option crash_log: on or off".to_string()),
                }
            }
            "queue_depth" => config.queue_depth = number(value)?.clamp(1, 256) as u16,
            "device_io" => {
                config.direct_io = match value {
                    Some("direct") => true,
                    Some("buffered") => false,
                    _ => return Err("option device_io: direct or buffered".to_string()),
                }
            }
            "nosuid" => config.nosuid = true,
            "suid" => config.nosuid = false,
            "nodev" => config.nodev = true,
            "dev" => config.nodev = false,
            "noexec" => config.noexec = true,
            "exec" => config.noexec = false,
            // Always on: accepted for compatibility with fstab habits.
            "allow_other" | "default_permissions" | "defaults" => {}
            _ => return Err(format!("unknown mount option {option:?}")),
        }
    }
    // File data read or written through the mount stays in the kernel's page cache (the
    // mount keeps it across opens), in the same memory cgroup as this daemon: a large copy
    // here would only push the kernel's out. Enough remains for partial-chunk reads,
    // read-ahead and folds.
    let data_cache = config.mount.cache_bytes / DATA_CACHE_SHARE;
    config.mount.data_cache_bytes = Some(config.mount.data_cache_bytes.unwrap_or(data_cache));
    Ok(config)
}

/// What `anvil mount` takes besides the image, the directory and `-o`.
#[derive(Default)]
pub struct Extras<'a> {
    pub foreground: bool,
    pub log: Option<&'a Path>,
    pub as_of: Option<&'a str>,
    pub device_log: Option<&'a Path>,
    /// A connection to take over (see keeper.rs).
    pub resume_fd: Option<i32>,
    /// A read-only replica of an object-store volume, following its writer.
    pub replica: bool,
}

pub fn run(image: &Path, dir: &Path, options: &[String], extras: Extras<'_>) -> Result<u8, String> {
    let Extras {
        foreground,
        log,
        as_of,
        device_log,
        resume_fd,
        replica,
    } = extras;
    let mut config = parse_options(options)?;
    if replica {
        if !crate::store::is_store(image) {
            return Err(format!(
                "--replica follows a writer on another host: it needs an s3:// volume, not {}",
                image.display()
            ));
        }
        config.mount.read_only = true;
        config.replica = true;
    }
    if config.store_cache_dir.is_some() && !crate::store::is_store(image) {
        return Err(
            "option cache_dir is for s3:// volumes (an image is read directly)".to_string(),
        );
    }
    if let Some(spec) = as_of {
        config.mount.read_only = true;
        config.as_of = Some(spec.to_string());
    }
    config.device_log = device_log.map(Path::to_path_buf);
    // A daemon taking over must not look at its mount point: nothing would answer.
    if resume_fd.is_none() && !dir.is_dir() {
        return Err(format!("mount point {} is not a directory", dir.display()));
    }
    if !image.exists() && !crate::store::is_store(image) {
        return Err(format!("{} does not exist", image.display()));
    }
    if config.writeback {
        // The kernel's dirty pages must outlive a daemon that dies: only a /dev/fuse
        // connection can be taken over by a new daemon (see keeper.rs).
        match config.transport {
            Transport::Auto | Transport::Devfuse => config.transport = Transport::Devfuse,
            Transport::Uring | Transport::Classic => {
                return Err(
                    "option writeback needs transport=devfuse (or auto): on another \
                            transport a daemon that dies loses the kernel's dirty pages"
                        .to_string(),
                )
            }
        }
    }
    if resume_fd.is_some() && config.transport != Transport::Devfuse {
        return Err("--resume-fd needs transport=devfuse".to_string());
    }
    if foreground || resume_fd.is_some() {
        return serve(image, dir, config, log, resume_fd);
    }
    let mut args: Vec<OsString> = vec!["mount".into(), image.into(), dir.into()];
    daemon_args(&mut args, options, log);
    if let Some(spec) = as_of {
        args.extend(["--as-of".into(), spec.into()]);
    }
    if let Some(path) = device_log {
        args.extend(["--device-log".into(), path.into()]);
    }
    if replica {
        args.push("--replica".into());
    }
    spawn_daemon(&image.display().to_string(), dir, args)
}

/// The daemon's `-o`, `--log` and `-f` arguments.
fn daemon_args(args: &mut Vec<OsString>, options: &[String], log: Option<&Path>) {
    if !options.is_empty() {
        args.extend(["-o".into(), options.join(",").into()]);
    }
    if let Some(path) = log {
        args.extend(["--log".into(), path.into()]);
    }
    args.push("-f".into());
}

/// Set by mount(8)'s helper: a successful mount prints nothing, as mount(8) does (scripts
/// that compare a mount's output, xfstests among them, see any line as a difference).
static QUIET: AtomicBool = AtomicBool::new(false);

/// Mounts print nothing on success from now on.
pub fn set_quiet() {
    QUIET.store(true, Ordering::Relaxed);
}

/// Runs this executable with `args` (a foreground mount) as a detached daemon and waits
/// until it reports "ready" or an error.
fn spawn_daemon(name: &str, dir: &Path, args: Vec<OsString>) -> Result<u8, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own executable: {e}"))?;
    let mut command = Command::new(exe);
    command
        .args(args)
        .env(READY_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: setsid is async-signal-safe and touches no memory of this process.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start the mount daemon: {e}"))?;
    let stdout = child.stdout.take().ok_or("daemon has no stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let line = line.trim_end();
    if line == "ready" {
        if !QUIET.load(Ordering::Relaxed) {
            println!(
                "mounted {name} on {} (daemon pid {})",
                dir.display(),
                child.id()
            );
        }
        return Ok(0);
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    match line.strip_prefix("error: ") {
        Some(message) => Err(message.to_string()),
        None => Err(format!(
            "mount daemon exited before the mount was ready ({status})"
        )),
    }
}

/// Reports a start-up failure to the waiting parent (if any) and returns it.
fn startup_error(message: String) -> Result<u8, String> {
    if std::env::var_os(READY_ENV).is_some() {
        println!("error: {message}");
        let _ = std::io::stdout().flush();
    }
    Err(message)
}

pub fn try_lock_shared(file: &File) -> bool {
    // SAFETY: flock on a valid descriptor owned by `file`.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) == 0 }
}

pub fn try_lock_exclusive(file: &File) -> bool {
    // SAFETY: flock on a valid descriptor owned by `file`.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

fn init_logging(log: Option<&Path>) -> Result<(), String> {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if let Some(path) = log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("cannot open log {}: {e}", path.display()))?;
        builder.target(env_logger::Target::Pipe(Box::new(file)));
    }
    let _ = builder.try_init();
    Ok(())
}

/// Picks the transport: (use io_uring, the one-line reason).
fn choose_transport(config: &Config) -> Result<(bool, String), String> {
    match (config.transport, uring::availability()) {
        (Transport::Classic | Transport::Devfuse, _) => Ok((
            false,
            format!("transport={:?}", config.transport).to_lowercase(),
        )),
        (Transport::Uring, Ok(())) => Ok((true, "transport=uring".to_string())),
        (Transport::Uring, Err(why)) => Err(format!("transport=uring: {why}")),
        (Transport::Auto, Ok(())) => Ok((true, "the kernel offers FUSE over io_uring".to_string())),
        (Transport::Auto, Err(why)) => Ok((false, why)),
    }
}

/// The device a daemon serves: an image (locked against a second daemon) or a volume on an
/// object store (claimed against a second writer anywhere); with its I/O mode (images) or
/// itself (object stores, released at unmount). Sets the crash log's place.
#[allow(clippy::type_complexity)]
fn open_device(
    image: &Path,
    config: &mut Config,
    resumed: bool,
) -> Result<
    (
        Arc<dyn anvil::device::Device>,
        Option<anvil::device::IoMode>,
        Option<Arc<anvil::device::ObjectDevice>>,
    ),
    String,
> {
    let writable = !config.mount.read_only;
    if crate::store::is_store(image) {
        // Segments already read are cached by the device; the engine's cache holds the rest.
        let cache = config.mount.cache_bytes / READ_AROUND_SHARE;
        let disk = config
            .store_cache_dir
            .clone()
            .map(|dir| (dir, config.store_cache_bytes));
        let device = crate::store::open(image, writable, resumed, cache, disk)?;
        // A read-only mount reads what the writer flushed, not another daemon's crash log.
        if config.mount.crash_log && writable {
            let dir = config.crash_log_dir.as_deref();
            config.mount.crash_log_file = Some(crate::store::crash_log_file(image, dir));
        }
        return Ok((device.clone(), None, Some(device)));
    }
    let opened = match config.direct_io {
        true => FileDevice::open_direct(image, writable),
        false => FileDevice::open(image, writable),
    };
    let device = opened.map_err(|e| format!("cannot open {}: {e}", image.display()))?;
    let io_mode = device.io_mode();
    device.set_read_around_bytes(config.mount.cache_bytes / READ_AROUND_SHARE);
    device.set_writers_pipelined(config.writeback);
    // A daemon that died may not have released the image yet (its files close last).
    let deadline = Instant::now() + Duration::from_secs(if resumed { 10 } else { 0 });
    while !try_lock_exclusive(device.file()) {
        if Instant::now() >= deadline {
            return Err(format!("{} is already mounted or in use", image.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if config.mount.crash_log {
        config.mount.crash_log_file = anvil::crash_log_file(image, config.crash_log_dir.as_deref());
    }
    Ok((Arc::new(device), Some(io_mode), None))
}

fn serve(
    image: &Path,
    dir: &Path,
    mut config: Config,
    log: Option<&Path>,
    resume_fd: Option<i32>,
) -> Result<u8, String> {
    if let Err(e) = init_logging(log) {
        return startup_error(e);
    }
    let resume = match resume_fd {
        Some(raw) => {
            log::warn!(
                "the daemon of {} died: taking over its connection",
                dir.display()
            );
            // SAFETY: the keeper passed this descriptor, open and ours alone from now on.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
            // SAFETY: fcntl on a descriptor owned here; no child needs it but the keeper.
            unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
            config.mount.reap_orphans = false;
            Some(fd)
        }
        None => None,
    };
    let (use_uring, why) = match choose_transport(&config) {
        Ok(choice) => choice,
        Err(e) => return startup_error(e),
    };
    if use_uring {
        // The rings' buffers come out of the memory budget, and a small budget gets smaller
        // buffers.
        config.max_write = uring::max_write_for(config.queue_depth, config.mount.cache_bytes);
        let rings = uring::ring_bytes(config.queue_depth, config.max_write);
        config.mount.cache_bytes = config.mount.cache_bytes.saturating_sub(rings).max(16 << 20);
    }
    if config.idle_workers {
        // Read-ahead must not take the CPU from workers that wait under SCHED_IDLE.
        config.mount.background_thread_start = Some(|| anvil_fuse::set_idle_policy(true));
    }
    let read_only = config.mount.read_only;
    let (device, io_mode, on_store) = match open_device(image, &mut config, resume.is_some()) {
        Ok(opened) => opened,
        Err(e) => return startup_error(e),
    };
    let device: Arc<dyn anvil::device::Device> = match &config.device_log {
        None => device,
        Some(path) => match File::create(path) {
            Ok(file) => Arc::new(anvil::device::LogDevice::new(device, file)),
            Err(e) => return startup_error(format!("cannot create {}: {e}", path.display())),
        },
    };
    let fs = match Filesystem::open(device, config.mount.clone()) {
        Ok(fs) => Arc::new(fs),
        Err(e) => return startup_error(format!("{}: {e}", image.display())),
    };
    match io_mode {
        None => log::info!("device I/O: segments of an object store"),
        Some(anvil::device::IoMode::Direct) => log::info!("device I/O: direct (O_DIRECT)"),
        Some(anvil::device::IoMode::Buffered(why)) => {
            log::info!("device I/O: through the host page cache ({why})")
        }
    }
    // No heap trimmer (`anvil::heap`): this binary allocates through jemalloc, which hands
    // freed pages back itself (main.rs).
    if config.writeback && fs.volume().is_slave() {
        // Its files change under the kernel (mirror streams): the kernel must take sizes
        // and times from the daemon.
        log::warn!(
            "{} is a mirror slave: mounted without writeback",
            image.display()
        );
        config.writeback = false;
    }
    let mut adapter = AnvilFuse::new(fs.clone(), config.ttl, config.writeback)
        .with_negative_ttl(config.negative_ttl.unwrap_or(config.ttl));
    if resume.is_some() {
        adapter = adapter.resumed();
    }
    if config.replica {
        adapter = adapter.replica();
    }
    if let Some(spec) = &config.as_of {
        match fs.resolve_as_of(spec) {
            Ok(tid) => adapter = adapter.as_of(tid),
            Err(e) => return startup_error(format!("--as-of {spec}: {e}")),
        }
    }
    let adapter = Arc::new(adapter);
    // A replica follows its writer unless it stays at a TID.
    let follower = match (config.replica, &config.as_of) {
        (true, None) => match adapter.follow_every(config.follow) {
            Ok(follower) => Some(follower),
            Err(e) => return startup_error(format!("cannot start following the writer: {e}")),
        },
        _ => None,
    };
    let fs_name = image.display().to_string();
    let served = match serve_backend(
        adapter,
        dir,
        &fs_name,
        read_only,
        &config,
        (use_uring, why),
        resume,
    ) {
        Ok(served) => served,
        Err(e) => {
            let _ = fs.close();
            return startup_error(e);
        }
    };
    drop(follower);
    let closed = fs.close();
    drop(fs);
    if let Some(device) = on_store {
        // The next writer need not wait a lease.
        device.release();
    }
    log::info!("unmounted {}", dir.display());
    if let Err(e) = served {
        return Err(format!("FUSE session ended with an error: {e}"));
    }
    closed.map_err(|e| format!("final commit failed: {e}"))?;
    Ok(0)
}

/// Mounts `dir` with the chosen transport (io_uring falls back to classic under `auto`),
/// announces readiness and serves until unmounted. Err: the mount could not be made.
fn serve_backend<B: Backend>(
    backend: Arc<B>,
    dir: &Path,
    fs_name: &str,
    read_only: bool,
    config: &Config,
    (mut use_uring, mut why): (bool, String),
    resume: Option<std::os::fd::OwnedFd>,
) -> Result<std::io::Result<()>, String> {
    let root = unsafe { libc::geteuid() } == 0;
    let announce = || announce_ready(fs_name, dir);
    // Workers under SCHED_IDLE are raised while other programs keep the CPUs busy; held
    // until the session ends.
    let _guard = match config.idle_workers {
        true => anvil_fuse::sched::guard()
            .map_err(|e| log::warn!("workers stay under SCHED_IDLE on busy CPUs: {e}"))
            .ok(),
        false => None,
    };
    // Resolved now: once mounted, resolving the path would ask the daemon (and after a
    // takeover nothing would answer yet; the setting stays from the first daemon).
    let taking_over = resume.is_some();
    let absolute = match taking_over {
        true => dir.to_path_buf(),
        false => std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()),
    };
    let readahead = |max_readahead: u32| {
        if root && !taking_over {
            match anvil_fuse::raise_readahead(&absolute, max_readahead) {
                Ok(()) => log::info!("read-ahead: {} KiB", max_readahead >> 10),
                Err(e) => log::warn!("read-ahead stays at the kernel's default: {e}"),
            }
        }
    };
    let mount_config = uring::MountConfig {
        fs_name: fs_name.to_string(),
        read_only,
        privileged: root,
        queue_depth: config.queue_depth,
        max_write: config.max_write,
        idle_workers: config.idle_workers,
        nosuid: config.nosuid,
        nodev: config.nodev,
        noexec: config.noexec,
    };
    if use_uring {
        match uring::Session::mount(&*backend, dir, &mount_config) {
            Ok(session) => {
                readahead(uring::MAX_READAHEAD);
                log::info!(
                    "transport: io_uring ({why}; {} queues x {} entries of {} KiB)",
                    uring::queue_count(),
                    config.queue_depth,
                    config.max_write >> 10
                );
                on_signal_unmount(dir, None);
                return Ok(session.run(backend, announce));
            }
            Err(e) if config.transport == Transport::Auto => {
                why = format!("io_uring mount failed: {e}");
                use_uring = false;
            }
            Err(e) => return Err(format!("cannot mount on {}: {e}", dir.display())),
        }
    }
    debug_assert!(!use_uring);
    if config.transport == Transport::Devfuse {
        // Twice the cores: with `-o writeback` the kernel queues many WRITEs at once, and a
        // worker waits for the device while its chunks are written ahead (iozone's large
        // writes 5-15% faster with four workers than with two on two cores).
        let threads = config.threads.unwrap_or_else(|| (2 * cores()).clamp(4, 64));
        let session = match resume {
            Some(fd) => devfuse::Session::resume(&*backend, fd, dir, &mount_config, threads),
            None => devfuse::Session::mount(&*backend, dir, &mount_config, threads),
        }
        .map_err(|e| format!("cannot mount on {}: {e}", dir.display()))?;
        log::info!("transport: /dev/fuse, {threads} workers ({why})");
        readahead(uring::MAX_READAHEAD);
        // Held until this function returns: then the keeper exits with it.
        let _keeper = match crate::keeper::spawn(session.fd()) {
            Ok(keeper) => Some(keeper),
            Err(e) => {
                log::warn!("no keeper (a crash of this daemon will end the mount): {e}");
                None
            }
        };
        on_signal_unmount(dir, None);
        return Ok(session.run(backend, announce));
    }
    log::info!("transport: classic /dev/fuse ({why})");
    let mut session = classic_session(backend, dir, fs_name, read_only, root, config)
        .map_err(|e| format!("cannot mount on {}: {e}", dir.display()))?;
    readahead(uring::MAX_READAHEAD);
    on_signal_unmount(dir, Some(session.unmount_callable()));
    announce();
    // fuser's worker threads inherit the policy of this thread.
    if config.idle_workers {
        anvil_fuse::set_idle_policy(true);
    }
    let served = session.run();
    if config.idle_workers {
        anvil_fuse::set_idle_policy(false);
    }
    Ok(served)
}

/// `anvil memfs DIR`: a trivial in-memory file system on the same transports and options,
/// to measure what a transport costs by itself (the ceiling for the volume's figures).
pub fn run_memfs(
    dir: &Path,
    options: &[String],
    foreground: bool,
    log: Option<&Path>,
) -> Result<u8, String> {
    let config = parse_options(options)?;
    if !dir.is_dir() {
        return Err(format!("mount point {} is not a directory", dir.display()));
    }
    if !foreground {
        let mut args: Vec<OsString> = vec!["memfs".into(), dir.into()];
        daemon_args(&mut args, options, log);
        return spawn_daemon("memfs", dir, args);
    }
    if let Err(e) = init_logging(log) {
        return startup_error(e);
    }
    let (use_uring, why) = match choose_transport(&config) {
        Ok(choice) => choice,
        Err(e) => return startup_error(e),
    };
    let memfs = Arc::new(anvil_fuse::memfs::MemFs::new(config.ttl, config.writeback));
    match serve_backend(memfs, dir, "memfs", false, &config, (use_uring, why), None) {
        Ok(served) => served
            .map(|()| 0)
            .map_err(|e| format!("FUSE session ended with an error: {e}")),
        Err(e) => startup_error(e),
    }
}

fn classic_session<B: Backend>(
    adapter: Arc<B>,
    dir: &Path,
    fs_name: &str,
    read_only: bool,
    root: bool,
    config: &Config,
) -> std::io::Result<fuser::Session<Classic<B>>> {
    let threads = config.threads.unwrap_or_else(cores);
    let mut mount_options = vec![
        fuser::MountOption::FSName(fs_name.to_string()),
        fuser::MountOption::Subtype("anvil".to_string()),
        fuser::MountOption::DefaultPermissions,
    ];
    if read_only {
        mount_options.push(fuser::MountOption::RO);
    }
    // Unprivileged mounts are nosuid and nodev whatever is asked (fusermount3's rule).
    mount_options.push(if root && !config.nodev {
        fuser::MountOption::Dev
    } else {
        fuser::MountOption::NoDev
    });
    mount_options.push(if root && !config.nosuid {
        fuser::MountOption::Suid
    } else {
        fuser::MountOption::NoSuid
    });
    if config.noexec {
        mount_options.push(fuser::MountOption::NoExec);
    }
    let mut fuse_config = fuser::Config::default();
    fuse_config.mount_options = mount_options;
    fuse_config.acl = if root {
        fuser::SessionACL::All
    } else {
        fuser::SessionACL::Owner
    };
    fuse_config.n_threads = Some(threads);
    fuse_config.clone_fd = true;
    let session = fuser::Session::new(Classic(adapter.clone()), dir, &fuse_config)?;
    adapter.set_notifier(anvil_fuse::Notifier::Classic(session.notifier()));
    Ok(session)
}

/// SIGINT and SIGTERM unmount, which ends the session after the final commit.
fn on_signal_unmount(dir: &Path, mut unmounter: Option<fuser::SessionUnmounter>) {
    let dir = dir.to_path_buf();
    match signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                if signals.forever().next().is_some() {
                    log::info!("signal received: unmounting {}", dir.display());
                    let done = match unmounter.as_mut() {
                        Some(u) => u.unmount().is_ok(),
                        None => plain_unmount(&dir),
                    };
                    if !done {
                        uring::lazy_unmount(&dir);
                    }
                }
            });
        }
        Err(e) => log::warn!("cannot install signal handlers: {e}"),
    }
}

fn announce_ready(name: &str, dir: &Path) {
    if std::env::var_os(READY_ENV).is_some() {
        println!("ready");
        let _ = std::io::stdout().flush();
        detach_stdout();
    } else {
        eprintln!(
            "mounted {} on {}; Ctrl-C or `umount {}` to unmount",
            name,
            dir.display(),
            dir.display()
        );
    }
}

fn plain_unmount(dir: &Path) -> bool {
    match CString::new(dir.as_os_str().as_bytes()) {
        // SAFETY: path is a valid NUL-terminated string.
        Ok(path) => unsafe { libc::umount2(path.as_ptr(), 0) == 0 },
        Err(_) => false,
    }
}

fn detach_stdout() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: both descriptors are valid; dup2 replaces stdout atomically.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

/// `anvil stats DIR`: requests per opcode since mount (or the last `--reset`), and the
/// daemon's mean time over each where the transport times them (io_uring, devfuse).
pub fn stats(dir: &Path, json: bool, reset: bool) -> Result<(), String> {
    query_info(dir)?; // A clear error when DIR is not an anvil mount.
    let text = get_xattr(dir, anvil_fuse::REQUESTS_XATTR)?;
    if json {
        println!("{text}");
    } else {
        let value: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| format!("daemon answered invalid JSON: {e}"))?;
        println!(
            "transport: {}",
            value["transport"].as_str().unwrap_or("unknown")
        );
        let mut rows: Vec<(String, u64)> = value["requests"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                    .collect()
            })
            .unwrap_or_default();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: u64 = rows.iter().map(|r| r.1).sum();
        // The daemon's mean time per request, where the transport timed it.
        let served = &value["served_us"];
        let timed = served.as_object().is_some_and(|m| !m.is_empty());
        if timed {
            println!("{:<12} {:>12} {:>14}", "request", "count", "daemon us");
        }
        for (op, n) in &rows {
            match served[op.as_str()].as_f64() {
                Some(us) => println!("{op:<12} {n:>12} {us:>14.1}"),
                None => println!("{op:<12} {n:>12}"),
            }
        }
        println!("{:<12} {total:>12}", "total");
    }
    if reset {
        set_xattr(dir, anvil_fuse::REQUESTS_XATTR, b"0")?;
    }
    Ok(())
}

/// Commits a mounted volume through the root's control attribute; returns the durable TID.
pub fn synctid(dir: &Path) -> Result<u64, String> {
    set_xattr(dir, anvil_fuse::SYNC_XATTR, b"1")?;
    let info: serde_json::Value =
        serde_json::from_str(&query_info(dir)?).map_err(|e| format!("bad info: {e}"))?;
    info["committed_tid"]
        .as_u64()
        .ok_or_else(|| "info has no committed_tid".to_string())
}

/// Commits a mounted volume and empties the daemon's node cache.
pub fn drop_caches(dir: &Path) -> Result<(), String> {
    query_info(dir)?;
    set_xattr(dir, anvil_fuse::DROPCACHE_XATTR, b"1")
}

/// Asks a mounted volume for its info through the root's control attribute.
pub fn query_info(dir: &Path) -> Result<String, String> {
    get_xattr(dir, anvil_fuse::INFO_XATTR).map_err(|_| {
        format!(
            "{} is not the root of a mounted anvil volume",
            dir.display()
        )
    })
}

/// Reads a control attribute of an anvil mount (up to 64 KiB).
pub fn get_xattr(path: &Path, name: &str) -> Result<String, String> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| "path contains NUL")?;
    let c_name = CString::new(name).map_err(|_| "bad attribute name")?;
    let mut buf = vec![0u8; 65536];
    // SAFETY: valid strings and a buffer of the stated length.
    let n = unsafe {
        libc::getxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!("{}: {e}; is it on an anvil mount?", path.display()));
    }
    buf.truncate(n as usize);
    String::from_utf8(buf).map_err(|_| "daemon returned invalid text".to_string())
}

/// Writes a control attribute of an anvil mount. Checks first that `path` is on one, so
/// nothing is ever written to another filesystem.
pub fn set_xattr(path: &Path, name: &str, value: &[u8]) -> Result<(), String> {
    if get_xattr(path, anvil_fuse::INFO_XATTR).is_err() {
        return Err(format!(
            "{} is not on a mounted anvil volume",
            path.display()
        ));
    }
    // What the kernel's writeback cache holds (`-o writeback`) reaches the daemon first: a
    // sync, snapshot or mirror copy covers every write made before it, as on btrfs.
    if let Ok(file) = File::open(path) {
        // SAFETY: syncfs on a descriptor owned by `file`.
        unsafe { libc::syncfs(file.as_raw_fd()) };
    }
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| "path contains NUL")?;
    let c_name = CString::new(name).map_err(|_| "bad attribute name")?;
    // SAFETY: valid strings and a value buffer of the stated length.
    let rc = unsafe {
        libc::setxattr(
            c_path.as_ptr(),
            c_name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}
