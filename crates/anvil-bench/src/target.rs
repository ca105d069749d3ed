//! Targets: the file systems a workload runs on. Each kernel file system,
//! zfs-fuse and anvil gets its own loop device over a fresh sparse file of the
//! same size, made and mounted before a run and torn down after it, so every
//! target starts empty and its device I/O can be counted in `/sys/block`.
//! `--dir PATH` targets run in a fresh subdirectory of a mounted directory.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anvil::fs::Caller;
use anvil::{Filesystem, MountOptions};

use crate::env::{IoCounters, Probe, Replica, SendReceive};
use crate::error::{fail, BenchError, Context, Result};
use crate::results::FsInfo;
use crate::vfs::{AnvilVfs, PosixVfs, Vfs};

const ZFS_PIDFILE: &str = "/run/anvil-bench-zfs-fuse.pid";

/// Names accepted by `--fs`.
pub const FS_NAMES: &[&str] = &[
    "anvil",
    "anvil-nohistory",
    "anvil-zstd",
    "anvil-lib",
    "anvil-s3",
    "ext4",
    "xfs",
    "btrfs",
    "btrfs-zstd",
    "zfs-fuse",
    "tmpfs",
];

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Ext4,
    Xfs,
    Btrfs,
    BtrfsZstd,
    ZfsFuse,
    Anvil,
    /// anvil mounted with `-o nohistory`: overwrites and deletes free space at once.
    AnvilNoHistory,
    /// anvil made with `mkfs --compression zstd`.
    AnvilZstd,
    AnvilLib,
    /// anvil mounted from an S3-compatible object store: the one the AWS_* environment
    /// names (endpoint, credentials), in bucket ANVIL_S3_BUCKET (`scripts/garage.sh`).
    AnvilS3,
    Tmpfs,
    Dir(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetSpec {
    pub label: String,
    pub kind: Kind,
}

impl TargetSpec {
    /// Whether the harness makes (and so needs root for) this target.
    pub fn needs_root(&self) -> bool {
        !matches!(self.kind, Kind::Dir(_))
    }
}

/// Holds `work_dir` for this run: its loop devices' backing files and mount points are
/// named by target, so a second run there would unmount, delete and remake the first one's
/// under it (its files vanish with ENOENT, a build finds its output gone). The lock is an
/// exclusive `flock` on `work_dir/lock`, released when the returned file is dropped (or
/// the process dies); a run that finds it held fails at once, naming the holder.
pub fn lock_work_dir(work_dir: &Path) -> Result<fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    fs::create_dir_all(work_dir).ctx(|| format!("mkdir {}", work_dir.display()))?;
    let path = work_dir.join("lock");
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .ctx(|| format!("open {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = match holder.trim() {
            "" => String::new(),
            pid => format!(" (pid {pid})"),
        };
        return fail(format!(
            "another anvil bench run{holder} is using {}: wait for it, or give this one \
             another --work-dir",
            work_dir.display()
        ));
    }
    file.set_len(0)
        .ctx(|| format!("truncate {}", path.display()))?;
    file.rewind().ctx(|| format!("rewind {}", path.display()))?;
    writeln!(file, "{}", std::process::id()).ctx(|| format!("write {}", path.display()))?;
    Ok(file)
}

/// Parses `--fs a,b,c` and `--dir PATH...` into targets, in that order.
pub fn parse_targets(fs_list: Option<&str>, dirs: &[PathBuf]) -> Result<Vec<TargetSpec>> {
    let mut out = Vec::new();
    for name in fs_list
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let kind = match name {
            "ext4" => Kind::Ext4,
            "xfs" => Kind::Xfs,
            "btrfs" => Kind::Btrfs,
            "btrfs-zstd" => Kind::BtrfsZstd,
            "zfs-fuse" | "zfs" => Kind::ZfsFuse,
            "anvil" => Kind::Anvil,
            "anvil-nohistory" => Kind::AnvilNoHistory,
            "anvil-zstd" => Kind::AnvilZstd,
            "anvil-lib" => Kind::AnvilLib,
            "anvil-s3" => Kind::AnvilS3,
            "tmpfs" => Kind::Tmpfs,
            _ => {
                return fail(format!(
                    "unknown file system '{name}' in --fs (known: {})",
                    FS_NAMES.join(", ")
                ))
            }
        };
        let label = if kind == Kind::ZfsFuse {
            "zfs-fuse"
        } else {
            name
        };
        if out.iter().any(|t: &TargetSpec| t.label == label) {
            return fail(format!("--fs lists '{name}' twice"));
        }
        out.push(TargetSpec {
            label: label.to_string(),
            kind,
        });
    }
    for dir in dirs {
        let meta = fs::metadata(dir).ctx(|| format!("--dir {}", dir.display()))?;
        if !meta.is_dir() {
            return fail(format!("--dir {} is not a directory", dir.display()));
        }
        let dir = fs::canonicalize(dir).ctx(|| format!("--dir {}", dir.display()))?;
        let mut label = format!(
            "{}:{}",
            fs_type_of(&dir).unwrap_or_else(|| "dir".into()),
            dir.display()
        );
        while out.iter().any(|t| t.label == label) {
            label.push('\'');
        }
        out.push(TargetSpec {
            label,
            kind: Kind::Dir(dir),
        });
    }
    if out.is_empty() {
        return fail("no targets: give --fs (e.g. --fs anvil,ext4) and/or --dir PATH");
    }
    Ok(out)
}

/// How targets are built.
#[derive(Clone, Debug)]
pub struct Config {
    /// Size of every loop device.
    pub size_bytes: u64,
    /// Where backing files and mount points go (must not be on a file system under test).
    pub work_dir: PathBuf,
    /// The `anvil` binary used for mkfs and mount.
    pub anvil_bin: PathBuf,
    /// anvil's cache budget (`-o cache=`), if not the default.
    pub anvil_cache: Option<u64>,
    /// Whether `anvil_cache` was given (`--anvil-cache`), rather than derived from the
    /// memory limit; a derived one yields to the workload's `anvil_daemon_cache`.
    pub anvil_cache_given: bool,
    /// Whether to drop caches (needs root).
    pub drop_caches: bool,
}

/// A made and mounted target, ready for one run.
pub struct Target {
    pub spec: TargetSpec,
    pub info: FsInfo,
    drop: bool,
    /// Mount point (or the `--dir` directory).
    mount: Option<PathBuf>,
    /// Directory this run works in.
    workdir: Option<PathBuf>,
    loop_dev: Option<String>,
    backing: Option<PathBuf>,
    daemon: Option<Child>,
    lib: Option<Arc<Filesystem>>,
    lib_root: u64,
    zfs_pool: Option<String>,
    zfs_datasets: std::sync::Mutex<Vec<String>>,
    zfs_devdir: Option<PathBuf>,
    started_zfs_daemon: bool,
    /// How it was built, for making a replica of the same kind and size.
    cfg: Option<Config>,
    /// The receiving side of a mirror: mounted as made, nothing created in it.
    replica: bool,
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .ctx(|| format!("run {shown}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let err = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return fail(format!("{shown} failed ({}): {}", out.status, err.trim()));
    }
    Ok(())
}

fn output_of(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .ctx(|| format!("run {shown}"))?;
    if !out.status.success() {
        return fail(format!(
            "{shown} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The transport an anvil mount serves over, from `anvil stats --json`; None if it cannot
/// be asked (the run goes on without it).
fn mount_transport(bin: &Path, mnt: &Path) -> Option<String> {
    let out = output_of(Command::new(bin).arg("stats").arg("--json").arg(mnt)).ok()?;
    let stats: serde_json::Value = serde_json::from_str(&out).ok()?;
    stats["transport"].as_str().map(str::to_string)
}

fn have(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
        .unwrap_or(false)
}

fn need(cmd: &str, package: &str) -> Result<()> {
    if have(cmd) {
        Ok(())
    } else {
        fail(format!(
            "{cmd} not found; install {package} (scripts/setup.sh does)"
        ))
    }
}

fn is_mountpoint(path: &Path) -> bool {
    let Ok(text) = fs::read_to_string("/proc/self/mounts") else {
        return false;
    };
    let want = path.to_string_lossy();
    text.lines()
        .filter_map(|l| l.split(' ').nth(1))
        .any(|m| unescape(m) == want)
}

fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// File-system type of the mount holding `dir`, from /proc/self/mounts.
pub fn fs_type_of(dir: &Path) -> Option<String> {
    let text = fs::read_to_string("/proc/self/mounts").ok()?;
    let dir = dir.to_string_lossy();
    let mut best: Option<(usize, String)> = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 3 {
            continue;
        }
        let m = unescape(f[1]);
        let inside = dir == m.as_str()
            || m == "/"
            || dir.starts_with(&format!("{}/", m.trim_end_matches('/')));
        if inside && best.as_ref().is_none_or(|(len, _)| m.len() >= *len) {
            best = Some((m.len(), f[2].to_string()));
        }
    }
    best.map(|(_, t)| t)
}

/// Block device name (as in /sys/class/block) holding `dir`, if any.
fn device_of(dir: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let dev = fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let link = fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    Some(link.file_name()?.to_string_lossy().into_owned())
}

fn statvfs_used(dir: &Path) -> Result<u64> {
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| BenchError("bad path".into()))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid path and output buffer.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).ctx(|| format!("statvfs {}", dir.display()));
    }
    // SAFETY: statvfs succeeded.
    let st = unsafe { st.assume_init() };
    Ok((st.f_blocks - st.f_bfree) * st.f_frsize)
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| BenchError("bad path".into()))?;
    let n = CString::new(name).map_err(|_| BenchError("bad name".into()))?;
    // SAFETY: valid strings and buffer.
    let ret = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if ret != 0 {
        return Err(std::io::Error::last_os_error())
            .ctx(|| format!("setxattr {name} on {}", path.display()));
    }
    Ok(())
}

/// Mount points strictly below `dir`, from /proc/self/mounts.
/// A fresh volume address for an anvil-s3 target: `s3://$ANVIL_S3_BUCKET/bench-LABEL-TIME`.
fn s3_address(label: &str) -> Result<String> {
    let bucket = std::env::var("ANVIL_S3_BUCKET").unwrap_or_default();
    if bucket.is_empty() || std::env::var_os("AWS_ENDPOINT_URL").is_none() {
        return fail(
            "anvil-s3 needs an object store: `scripts/garage.sh start DIR` and `. DIR/env` \
             first (ANVIL_S3_BUCKET and AWS_ENDPOINT_URL are not set)",
        );
    }
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(format!("s3://{bucket}/bench-{label}-{secs}"))
}

fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    let prefix = format!("{}/", dir.to_string_lossy().trim_end_matches('/'));
    text.lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(unescape)
        .filter(|m| m.starts_with(&prefix))
        .map(PathBuf::from)
        .collect()
}

/// Runs `op` until it succeeds, for up to 30 s (a file system that was just
/// used may stay busy for a moment).
fn retry(mut op: impl FnMut() -> Result<()>) -> Result<()> {
    let t0 = Instant::now();
    loop {
        let res = op();
        if res.is_ok() || t0.elapsed() > Duration::from_secs(30) {
            return res;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Unmounts `mnt` if it is mounted, retrying while busy, lazily as a last resort.
fn unmount(mnt: &Path) -> Result<()> {
    if !is_mountpoint(mnt) {
        return Ok(());
    }
    let res = retry(|| run_cmd(Command::new("umount").arg(mnt)));
    if res.is_err() && is_mountpoint(mnt) {
        return run_cmd(Command::new("umount").arg("-l").arg(mnt));
    }
    Ok(())
}

fn drop_kernel_caches() -> Result<()> {
    // SAFETY: sync(2) has no arguments.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", "3").ctx(|| "write /proc/sys/vm/drop_caches".into())
}

impl Target {
    /// Makes and mounts a fresh target for run `run`.
    pub fn setup(spec: &TargetSpec, cfg: &Config, run: u32) -> Result<Target> {
        Target::setup_as(spec, cfg, run, false)
    }

    fn setup_as(spec: &TargetSpec, cfg: &Config, run: u32, replica: bool) -> Result<Target> {
        let mut t = Target {
            spec: spec.clone(),
            info: FsInfo {
                label: spec.label.clone(),
                size_bytes: cfg.size_bytes,
                ..Default::default()
            },
            drop: cfg.drop_caches,
            mount: None,
            workdir: None,
            loop_dev: None,
            backing: None,
            daemon: None,
            lib: None,
            lib_root: 0,
            zfs_pool: None,
            zfs_datasets: std::sync::Mutex::new(Vec::new()),
            zfs_devdir: None,
            started_zfs_daemon: false,
            cfg: Some(cfg.clone()),
            replica,
        };
        // On failure, `t` is dropped, which undoes whatever was done.
        t.build(cfg, run)?;
        Ok(t)
    }

    fn build(&mut self, cfg: &Config, run: u32) -> Result<()> {
        if let Kind::Dir(dir) = &self.spec.kind {
            let dir = dir.clone();
            self.info.fs_type = fs_type_of(&dir).unwrap_or_else(|| "unknown".into());
            self.info.devices = device_of(&dir).into_iter().collect();
            self.info.path = Some(dir.display().to_string());
            self.info.size_bytes = 0;
            let work = dir.join(format!("anvil-bench.{}.{run}", std::process::id()));
            fs::create_dir(&work).ctx(|| format!("mkdir {}", work.display()))?;
            self.workdir = Some(work);
            self.mount = Some(dir);
            return Ok(());
        }
        fs::create_dir_all(&cfg.work_dir).ctx(|| format!("mkdir {}", cfg.work_dir.display()))?;
        let mnt = cfg.work_dir.join(format!("mnt-{}", self.spec.label));
        fs::create_dir_all(&mnt).ctx(|| format!("mkdir {}", mnt.display()))?;
        if is_mountpoint(&mnt) {
            // Left over from an interrupted run of ours: nothing in it is worth keeping.
            let _ = unmount(&mnt);
            if is_mountpoint(&mnt) {
                return fail(format!(
                    "{} is still mounted from an earlier run and cannot be unmounted",
                    mnt.display()
                ));
            }
        }
        if self.spec.kind == Kind::Tmpfs {
            run_cmd(
                Command::new("mount")
                    .args(["-t", "tmpfs", "-o"])
                    .arg(format!("size={}", cfg.size_bytes))
                    .arg("tmpfs")
                    .arg(&mnt),
            )?;
            self.info.fs_type = "tmpfs".into();
            self.info.mount_opts = Some(format!("size={}", cfg.size_bytes));
            return self.finish_mount(mnt);
        }
        if self.spec.kind == Kind::AnvilS3 {
            let address = s3_address(&self.spec.label)?;
            self.info.devices = Vec::new();
            self.info.path = Some(mnt.display().to_string());
            return self.build_anvil(cfg, &address, mnt);
        }

        let backing = cfg.work_dir.join(format!("{}.img", self.spec.label));
        // Loop devices still attached to this file (an interrupted run) go first.
        if backing.exists() {
            if let Ok(list) = output_of(Command::new("losetup").arg("-j").arg(&backing)) {
                for dev in list.lines().filter_map(|l| l.split(':').next()) {
                    let _ = run_cmd(Command::new("losetup").args(["-d", dev]));
                }
            }
        }
        let _ = fs::remove_file(&backing);
        let f = fs::File::create(&backing).ctx(|| format!("create {}", backing.display()))?;
        f.set_len(cfg.size_bytes)
            .ctx(|| format!("size {}", backing.display()))?;
        drop(f);
        self.backing = Some(backing.clone());
        need("losetup", "mount")?;
        let dev = output_of(
            Command::new("losetup")
                .args(["--direct-io=on", "--find", "--show"])
                .arg(&backing),
        )?;
        let dev_name = dev.trim_start_matches("/dev/").to_string();
        self.loop_dev = Some(dev.clone());
        self.info.devices = vec![dev_name];
        self.info.path = Some(mnt.display().to_string());

        let mkfs_mount = |fs_type: &str, mkfs: &str, args: &[&str], opts: Option<&str>| {
            (
                fs_type.to_string(),
                format!("{mkfs} {} {dev}", args.join(" ")),
                opts.map(str::to_string),
            )
        };
        let (fs_type, mkfs, opts) = match &self.spec.kind {
            Kind::Ext4 => mkfs_mount("ext4", "mkfs.ext4", &["-q", "-F"], None),
            Kind::Xfs => mkfs_mount("xfs", "mkfs.xfs", &["-q", "-f"], None),
            Kind::Btrfs => mkfs_mount("btrfs", "mkfs.btrfs", &["-q", "-f"], None),
            Kind::BtrfsZstd => {
                mkfs_mount("btrfs", "mkfs.btrfs", &["-q", "-f"], Some("compress=zstd"))
            }
            Kind::ZfsFuse => return self.build_zfs(&dev, mnt),
            Kind::Anvil | Kind::AnvilNoHistory | Kind::AnvilZstd | Kind::AnvilLib => {
                return self.build_anvil(cfg, &dev, mnt)
            }
            Kind::Tmpfs | Kind::AnvilS3 | Kind::Dir(_) => unreachable!("handled above"),
        };
        let mut words = mkfs.split(' ');
        let prog = words.next().unwrap_or_default();
        need(
            prog,
            if fs_type == "ext4" {
                "e2fsprogs"
            } else {
                &fs_type
            },
        )?;
        run_cmd(Command::new(prog).args(words))?;
        let mut mount = Command::new("mount");
        if let Some(o) = &opts {
            mount.args(["-o", o]);
        }
        run_cmd(mount.arg(&dev).arg(&mnt))?;
        self.info.fs_type = fs_type;
        self.info.mkfs = Some(mkfs);
        self.info.mount_opts = opts;
        self.finish_mount(mnt)
    }

    fn finish_mount(&mut self, mnt: PathBuf) -> Result<()> {
        if self.replica {
            // A new anvil slave must be empty, and btrfs receive and zfs recv make
            // their own subvolumes and datasets.
            self.workdir = Some(mnt.clone());
            self.mount = Some(mnt);
            return Ok(());
        }
        let work = mnt.join("bench");
        self.mount = Some(mnt);
        fs::create_dir(&work).ctx(|| format!("mkdir {}", work.display()))?;
        self.workdir = Some(work);
        Ok(())
    }

    fn build_zfs(&mut self, dev: &str, mnt: PathBuf) -> Result<()> {
        need("zpool", "zfs-fuse")?;
        if Command::new("zpool")
            .arg("list")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| !s.success())
            .unwrap_or(true)
        {
            need("zfs-fuse", "zfs-fuse")?;
            // A stale pid file (from a killed run) makes zfs-fuse refuse to start.
            let _ = fs::remove_file(ZFS_PIDFILE);
            // No /zfs-kstat mount: nothing reads it, and a daemon that is killed leaves it.
            run_cmd(Command::new("zfs-fuse").args(["--pidfile", ZFS_PIDFILE, "--no-kstat-mount"]))?;
            self.started_zfs_daemon = true;
            let t0 = Instant::now();
            while Command::new("zpool")
                .arg("list")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| !s.success())
                .unwrap_or(true)
            {
                if t0.elapsed() > Duration::from_secs(20) {
                    return fail("zfs-fuse did not start within 20 s");
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            if let Some(pid) = fs::read_to_string(ZFS_PIDFILE)
                .ok()
                .and_then(|pid| pid.trim().parse().ok())
            {
                crate::cgroup::prefer_as_oom_victim(pid);
            }
        }
        // Pools of earlier runs whose process is gone (interrupted) hold loop devices.
        if let Ok(pools) = output_of(Command::new("zpool").args(["list", "-H", "-o", "name"])) {
            for old in pools.lines().filter_map(|p| p.strip_prefix("anvilbench")) {
                // "anvilbench<pid>", or "anvilbench<pid>recv" for a replica.
                let pid = old.trim_end_matches(|c: char| !c.is_ascii_digit());
                let alive = pid
                    .parse::<u32>()
                    .is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
                if !alive {
                    let _ = run_cmd(Command::new("zpool").args([
                        "destroy",
                        "-f",
                        &format!("anvilbench{old}"),
                    ]));
                }
            }
        }
        let pool = format!(
            "anvilbench{}{}",
            std::process::id(),
            if self.replica { "recv" } else { "" }
        );
        // `zpool import -d DIR` scans DIR for devices: give it one holding only ours.
        let devdir = mnt.with_file_name(format!("zdev-{}", self.spec.label));
        let _ = fs::remove_dir_all(&devdir);
        fs::create_dir_all(&devdir).ctx(|| format!("mkdir {}", devdir.display()))?;
        std::os::unix::fs::symlink(dev, devdir.join(dev.trim_start_matches("/dev/")))
            .ctx(|| format!("symlink in {}", devdir.display()))?;
        self.zfs_devdir = Some(devdir);
        run_cmd(
            Command::new("zpool")
                .args(["create", "-f", "-m"])
                .arg(&mnt)
                .arg(&pool)
                .arg(dev),
        )?;
        self.zfs_pool = Some(pool.clone());
        self.info.fs_type = "zfs".into();
        self.info.mkfs = Some(format!("zpool create -f -m {} {pool} {dev}", mnt.display()));
        self.finish_mount(mnt)
    }

    fn build_anvil(&mut self, cfg: &Config, dev: &str, mnt: PathBuf) -> Result<()> {
        let bin = &cfg.anvil_bin;
        if !bin.is_file() {
            return fail(format!("anvil binary {} not found", bin.display()));
        }
        let mut mkfs = Command::new(bin);
        mkfs.arg("mkfs").arg(dev);
        if self.spec.kind == Kind::AnvilZstd {
            mkfs.args(["--compression", "zstd"]);
        }
        if self.spec.kind == Kind::AnvilS3 {
            mkfs.args(["--size", &cfg.size_bytes.to_string()]);
        }
        run_cmd(&mut mkfs)?;
        self.info.fs_type = "anvil".into();
        self.info.mkfs = Some(match self.spec.kind {
            Kind::AnvilZstd => format!("anvil mkfs {dev} --compression zstd"),
            _ => format!("anvil mkfs {dev}"),
        });
        if self.spec.kind == Kind::AnvilLib {
            let mut options = MountOptions::default();
            if let Some(c) = cfg.anvil_cache {
                options.cache_bytes = c;
            }
            // As the mount's daemon does: the volume's freed memory goes back to the
            // kernel, within the run's memory cgroup.
            static TRIMMER: std::sync::Once = std::sync::Once::new();
            TRIMMER.call_once(anvil::heap::start_heap_trimmer);
            let extra = std::env::var("ANVIL_MOUNT_OPTS").unwrap_or_default();
            lib_options(&mut options, &extra)?;
            // As `anvil mount` keeps it: the crash log on tmpfs, so that what the library
            // acknowledges survives the process and no log page is written to the device
            // before an fsync or a commit (the durability the FUSE target runs with).
            if options.crash_log {
                options.crash_log_file = anvil::crash_log_file(Path::new(dev), None);
            }
            let fs = Filesystem::open_path(Path::new(dev), options)
                .map_err(|e| BenchError(format!("open {dev}: {e}")))?;
            let attr = fs
                .mkdir(Caller::ROOT, 1, b"bench", 0o755)
                .map_err(|e| BenchError(format!("mkdir bench on {dev}: {e}")))?;
            self.lib = Some(Arc::new(fs));
            self.lib_root = attr.ino;
            self.info.mount_opts = cfg.anvil_cache.map(|c| format!("cache={c}"));
            self.info.path = None;
            return Ok(());
        }
        let mut cmd = Command::new(bin);
        cmd.arg("mount").arg(dev).arg(&mnt).arg("-f");
        let mut opts: Vec<String> = Vec::new();
        if let Some(c) = cfg.anvil_cache {
            opts.push(format!("cache={c}"));
        }
        if self.spec.kind == Kind::AnvilNoHistory {
            opts.push("nohistory".into());
        }
        if self.spec.kind == Kind::AnvilS3 {
            // A warm local cache of the store's segments, as a user gives one: what this
            // mount uploads or reads is read from here again (a fresh one per run).
            let dir = cfg.work_dir.join(format!("s3cache-{}", self.spec.label));
            let _ = fs::remove_dir_all(&dir);
            opts.push(format!(
                "cache_dir={},cache_size={}",
                dir.display(),
                cfg.size_bytes
            ));
        }
        // Extra mount options for every anvil mount, e.g. ANVIL_MOUNT_OPTS=transport=classic.
        if let Ok(extra) = std::env::var("ANVIL_MOUNT_OPTS") {
            opts.extend(extra.split(',').filter(|o| !o.is_empty()).map(String::from));
        }
        if !opts.is_empty() {
            cmd.args(["-o", &opts.join(",")]);
            self.info.mount_opts = Some(opts.join(","));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .ctx(|| format!("run {} mount", bin.display()))?;
        crate::cgroup::prefer_as_oom_victim(child.id());
        self.daemon = Some(child);
        let t0 = Instant::now();
        while !is_mountpoint(&mnt) {
            if let Some(child) = self.daemon.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        use std::io::Read;
                        let _ = e.read_to_string(&mut err);
                    }
                    self.daemon = None;
                    return fail(format!(
                        "anvil mount exited ({status}): {}",
                        err.lines().last().unwrap_or("").trim()
                    ));
                }
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return fail("anvil mount did not appear within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.info.transport = mount_transport(bin, &mnt);
        if let Some(transport) = &self.info.transport {
            eprintln!(
                "{}: anvil mount serves over the {transport} transport",
                self.spec.label
            );
        }
        self.finish_mount(mnt)
    }

    /// The run's working directory (None for anvil-lib).
    pub fn workdir(&self) -> Option<&Path> {
        self.workdir.as_deref()
    }

    /// The working directory as a [`Vfs`].
    pub fn vfs(&self) -> Result<Box<dyn Vfs>> {
        if let Some(fs) = &self.lib {
            return Ok(Box::new(AnvilVfs::new(fs.clone(), self.lib_root)));
        }
        let dir = self.workdir.as_deref().unwrap_or(Path::new("."));
        Ok(Box::new(
            PosixVfs::open(dir).ctx(|| format!("open {}", dir.display()))?,
        ))
    }

    /// Unmounts and removes everything `setup` made. Errors are reported, but
    /// teardown goes as far as it can.
    pub fn teardown(mut self) -> Result<()> {
        self.undo()
    }

    fn undo(&mut self) -> Result<()> {
        let mut first_err: Option<BenchError> = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        };
        if let Kind::Dir(_) = self.spec.kind {
            if let Some(work) = self.workdir.take() {
                note(fs::remove_dir_all(&work).ctx(|| format!("remove {}", work.display())));
            }
            self.mount = None;
        }
        if let Some(fs) = self.lib.take() {
            let c = fs.volume().cache_stats();
            let rate = |hits: u64, misses: u64| hits as f64 / (hits + misses).max(1) as f64;
            eprintln!(
                "anvil-lib cache: {} of {} MiB ({} of {} MiB for nodes); nodes {:.3} hits ({} misses), \
                 extents {:.3} hits ({} misses), locality sets {:.3} hits ({} misses; {} of {} MiB)",
                c.bytes >> 20,
                c.budget_bytes >> 20,
                c.node_bytes >> 20,
                c.node_budget_bytes >> 20,
                rate(c.node_hits, c.node_misses),
                c.node_misses,
                rate(c.extent_hits, c.extent_misses),
                c.extent_misses,
                rate(c.set_hits, c.set_misses),
                c.set_misses,
                c.set_bytes >> 20,
                c.set_budget_bytes >> 20,
            );
            // Where the writers waited for the device: commits, and writers held back
            // while one was in flight.
            let counters = |list: Vec<(&str, u64)>| {
                let named: Vec<String> = list
                    .iter()
                    .map(|(name, value)| format!("{name} {value}"))
                    .collect();
                named.join(", ")
            };
            eprintln!("anvil-lib engine: {}", counters(fs.volume().report()));
            // Device reads, and those that met one of the engine's writes or flushes.
            eprintln!(
                "anvil-lib device: {}",
                counters(fs.volume().device().report())
            );
            note(
                fs.close()
                    .map_err(|e| BenchError(format!("close anvil volume: {e}"))),
            );
            drop(fs);
            // The volume's caches were this process's heap: hand it back, or the next
            // target starts with it charged to the same memory cgroup.
            // SAFETY: malloc_trim only releases free heap pages; no pointer is touched.
            unsafe {
                libc::malloc_trim(0);
            }
        }
        if let Some(mnt) = self.mount.take() {
            // Mounts below ours first (zfs datasets of snapshot roots), deepest first,
            // then ours. For zfs this also makes the kernel let go of every inode, which
            // zfs-fuse needs before it can destroy the pool.
            let mut below = mounts_below(&mnt);
            below.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
            below.push(mnt);
            for m in below {
                note(unmount(&m));
            }
        }
        let datasets: Vec<String> = self
            .zfs_datasets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .rev()
            .collect();
        for ds in datasets {
            note(retry(|| {
                run_cmd(Command::new("zfs").args(["destroy", "-r", &ds]))
            }));
        }
        if let Some(pool) = self.zfs_pool.take() {
            // The daemon may still be finishing with files closed just before.
            note(retry(|| {
                run_cmd(Command::new("zpool").args(["destroy", "-f", &pool]))
            }));
        }
        if let Some(mut child) = self.daemon.take() {
            let t0 = Instant::now();
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        if !status.success() {
                            note(fail(format!("anvil daemon exited with {status}")));
                        }
                        break;
                    }
                    Ok(None) if t0.elapsed() < Duration::from_secs(120) => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        note(fail("anvil daemon did not exit within 120 s of umount"));
                        break;
                    }
                }
            }
        }
        if self.started_zfs_daemon {
            self.started_zfs_daemon = false;
            if let Ok(pid) = fs::read_to_string(ZFS_PIDFILE) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    // SAFETY: plain kill(2).
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                    let t0 = Instant::now();
                    while t0.elapsed() < Duration::from_secs(10) {
                        let stat =
                            fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                        if stat.is_empty() || stat.contains(") Z ") {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            let _ = fs::remove_file(ZFS_PIDFILE);
        }
        if let Some(dev) = self.loop_dev.take() {
            let mut ok = false;
            for _ in 0..20 {
                if run_cmd(Command::new("losetup").args(["-d", &dev])).is_ok() {
                    ok = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            if !ok {
                note(fail(format!("could not detach {dev}")));
            }
        }
        if let Some(b) = self.backing.take() {
            note(fs::remove_file(&b).ctx(|| format!("remove {}", b.display())));
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn path_of(&self, rel: &str) -> Result<PathBuf> {
        match &self.workdir {
            Some(w) => Ok(w.join(rel)),
            None => fail("this target has no directory"),
        }
    }

    /// The zfs dataset of the snapshot root `rel` (see `make_snapshot_root`).
    fn zfs_dataset(&self, rel: &str) -> Option<String> {
        self.zfs_pool
            .as_ref()
            .map(|pool| format!("{pool}/{}", rel.replace('/', "_")))
    }
}

/// The receiving side of a mirror of a [`Target`]: a second target of the same
/// kind and size (its own sparse file, loop device and mount point, labelled
/// `<label>-recv`; for zfs-fuse its own pool in the same daemon).
pub struct TargetReplica {
    target: Target,
    /// The source's mount point and snapshot root (absolute).
    source_mount: PathBuf,
    source_root: PathBuf,
    /// Where the source keeps its btrfs snapshots.
    source_snaps: PathBuf,
    /// The source's dataset of the snapshot root (zfs).
    source_dataset: Option<String>,
    anvil_bin: PathBuf,
}

/// Shows a command as a shell line (without Debug's quotes).
fn shown(cmd: &Command) -> String {
    format!("{cmd:?}").replace('"', "")
}

/// From `anvil mirror-status --json`: the TID a slave holds, or None for a
/// volume that is no slave (a new, empty one takes a full stream).
pub fn slave_holds(status_json: &str) -> Result<Option<u64>> {
    let v: serde_json::Value = serde_json::from_str(status_json.trim())
        .map_err(|e| BenchError(format!("mirror-status: not JSON ({e}): {status_json}")))?;
    if v["slave"] != true {
        return Ok(None);
    }
    match v["last_tid"].as_u64() {
        Some(t) => Ok(Some(t)),
        None => fail(format!(
            "mirror-status: a slave without last_tid: {status_json}"
        )),
    }
}

impl TargetReplica {
    fn mount(&self) -> &Path {
        self.target.mount.as_deref().unwrap_or(Path::new("/"))
    }

    /// The received dataset (zfs): the source's dataset name under the replica's pool.
    fn dataset(&self) -> Option<(String, String)> {
        let pool = self.target.zfs_pool.as_ref()?;
        let src = self.source_dataset.as_ref()?;
        let name = src.rsplit('/').next().unwrap_or(src).to_string();
        Some((format!("{pool}/{name}"), name))
    }
}

impl Replica for TargetReplica {
    fn info(&self) -> FsInfo {
        self.target.info.clone()
    }

    fn pipeline(&self, name: &str, prev: Option<&str>) -> Result<SendReceive> {
        let (send, receive) = match &self.target.spec.kind {
            Kind::Btrfs | Kind::BtrfsZstd => {
                let mut send = Command::new("btrfs");
                send.arg("send");
                if let Some(p) = prev {
                    send.arg("-p").arg(self.source_snaps.join(p));
                }
                send.arg(self.source_snaps.join(name));
                let mut receive = Command::new("btrfs");
                receive.arg("receive").arg(self.mount());
                (send, receive)
            }
            Kind::ZfsFuse => {
                let (Some(src), Some((dst, _))) = (&self.source_dataset, self.dataset()) else {
                    return fail("zfs replica without datasets");
                };
                let mut send = Command::new("zfs");
                send.arg("send");
                if let Some(p) = prev {
                    send.arg("-i").arg(format!("{src}@{p}"));
                }
                send.arg(format!("{src}@{name}"));
                let mut receive = Command::new("zfs");
                receive.args(["recv", "-F", &dst]);
                (send, receive)
            }
            Kind::Anvil | Kind::AnvilZstd => {
                // As `anvil mirror-copy` does: from the TID the slave holds.
                let status = output_of(
                    Command::new(&self.anvil_bin)
                        .arg("mirror-status")
                        .arg(self.mount())
                        .arg("--json"),
                )?;
                let holds = slave_holds(&status)?;
                match (prev, holds) {
                    (Some(p), None) => {
                        return fail(format!(
                            "{} is no slave, but should hold snapshot {p}",
                            self.mount().display()
                        ))
                    }
                    (None, Some(t)) => {
                        return fail(format!(
                            "{} already holds TID {t} before the first send",
                            self.mount().display()
                        ))
                    }
                    _ => {}
                }
                let mut send = Command::new(&self.anvil_bin);
                send.arg("mirror-read")
                    .arg(&self.source_mount)
                    .arg("--since")
                    .arg(holds.unwrap_or(0).to_string());
                let mut receive = Command::new(&self.anvil_bin);
                receive.arg("mirror-write").arg(self.mount());
                (send, receive)
            }
            other => return fail(format!("no mirroring on {other:?}")),
        };
        let shown = format!("{} | {}", shown(&send), shown(&receive));
        Ok(SendReceive {
            send,
            receive,
            shown,
        })
    }

    fn copy_command(&self) -> Option<Command> {
        match self.target.spec.kind {
            Kind::Anvil | Kind::AnvilZstd => {
                let mut cmd = Command::new(&self.anvil_bin);
                cmd.arg("mirror-copy")
                    .arg(&self.source_mount)
                    .arg(self.mount());
                Some(cmd)
            }
            _ => None,
        }
    }

    fn sync(&self) -> Result<()> {
        self.target.sync()
    }

    fn used_bytes(&self) -> Result<u64> {
        self.target.used_bytes()
    }

    fn io(&self) -> IoCounters {
        self.target.io()
    }

    fn snapshot_dir(&self, name: &str, latest: bool) -> Option<PathBuf> {
        let mnt = self.mount();
        let mut candidates = Vec::new();
        match &self.target.spec.kind {
            Kind::Btrfs | Kind::BtrfsZstd => candidates.push(mnt.join(name)),
            Kind::ZfsFuse => {
                let (dataset, ds) = self.dataset()?;
                candidates.push(mnt.join(&ds).join(".zfs/snapshot").join(name));
                if latest {
                    candidates.push(mnt.join(&ds));
                } else if !candidates[0].is_dir() {
                    // zfs-fuse shows no .zfs directory: read a clone of the snapshot
                    // (destroyed with the pool).
                    let clone = format!("{dataset}-{name}");
                    let made = run_cmd(
                        Command::new("zfs")
                            .arg("clone")
                            .arg(format!("{dataset}@{name}"))
                            .arg(&clone),
                    );
                    if made.is_ok() {
                        candidates.push(mnt.join(format!("{ds}-{name}")));
                    }
                }
            }
            _ => {
                let rel = self.source_root.strip_prefix(&self.source_mount).ok()?;
                candidates.push(mnt.join(".snapshots").join(name).join(rel));
                if latest {
                    candidates.push(mnt.join(rel));
                }
            }
        }
        candidates.into_iter().find(|p| p.is_dir())
    }

    fn teardown(self: Box<Self>) -> Result<()> {
        self.target.teardown()
    }
}

/// The mount options of ANVIL_MOUNT_OPTS that mean something to the library, applied to
/// an anvil-lib target (the transport's are ignored).
fn lib_options(options: &mut MountOptions, extra: &str) -> Result<()> {
    for option in extra.split(',').filter(|o| !o.is_empty()) {
        let size = |v: &str| crate::cli::parse_size(v).map_err(BenchError);
        match option.split_once('=') {
            None if option == "nohistory" => options.nohistory = true,
            Some(("cache", v)) => options.cache_bytes = size(v)?,
            Some(("data_cache", v)) => options.data_cache_bytes = Some(size(v)?),
            Some(("crash_log", v)) => options.crash_log = v != "off",
            _ => {}
        }
    }
    Ok(())
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.undo();
    }
}

impl Probe for Target {
    fn make_replica(&self, rel: &str) -> Result<Option<Box<dyn Replica>>> {
        let Some(cfg) = &self.cfg else {
            return Ok(None);
        };
        if self.replica
            || !matches!(
                self.spec.kind,
                Kind::Btrfs | Kind::BtrfsZstd | Kind::ZfsFuse | Kind::Anvil | Kind::AnvilZstd
            )
        {
            return Ok(None);
        }
        let spec = TargetSpec {
            label: format!("{}-recv", self.spec.label),
            kind: self.spec.kind.clone(),
        };
        let source_mount = match &self.mount {
            Some(m) => m.clone(),
            None => return fail("the source is not mounted"),
        };
        let target = Target::setup_as(&spec, cfg, 0, true)?;
        Ok(Some(Box::new(TargetReplica {
            target,
            source_mount,
            source_root: self.path_of(rel)?,
            source_snaps: self.path_of(".snapshots")?,
            source_dataset: self.zfs_dataset(rel),
            anvil_bin: cfg.anvil_bin.clone(),
        })))
    }

    fn drop_caches(&self) -> Result<()> {
        self.sync()?;
        if let Some(fs) = &self.lib {
            fs.volume().drop_caches();
        }
        if self.daemon.is_some() {
            if let Some(mnt) = &self.mount {
                set_xattr(mnt, "trusted.anvil.dropcache", b"1")?;
            }
        }
        if let (Some(pool), Some(devdir)) = (&self.zfs_pool, &self.zfs_devdir) {
            // zfs-fuse caches in the daemon (its ARC), which drop_caches does not reach;
            // exporting and importing the pool empties it. Needs no open files in the pool.
            retry(|| run_cmd(Command::new("zpool").args(["export", pool])))?;
            run_cmd(
                Command::new("zpool")
                    .arg("import")
                    .arg("-d")
                    .arg(devdir)
                    .arg(pool),
            )?;
        }
        if self.drop {
            drop_kernel_caches()?;
        }
        Ok(())
    }

    fn sync(&self) -> Result<()> {
        if let Some(fs) = &self.lib {
            return fs
                .sync()
                .map(|_| ())
                .map_err(|e| BenchError(format!("commit: {e}")));
        }
        if self.daemon.is_some() {
            if let Some(mnt) = &self.mount {
                return set_xattr(mnt, "trusted.anvil.sync", b"1");
            }
        }
        // SAFETY: sync(2) has no arguments.
        unsafe { libc::sync() };
        Ok(())
    }

    fn io(&self) -> IoCounters {
        self.info
            .devices
            .iter()
            .filter_map(|d| IoCounters::of_device(d))
            .fold(IoCounters::default(), |a, b| a.add(&b))
    }

    fn used_bytes(&self) -> Result<u64> {
        if let Some(fs) = &self.lib {
            let s = fs.statfs();
            return Ok((s.blocks - s.blocks_free) * s.block_bytes as u64);
        }
        if let Some(pool) = &self.zfs_pool {
            // statvfs of a zfs mount counts only that dataset; the pool's `used`
            // includes child datasets and snapshots.
            let text =
                output_of(Command::new("zfs").args(["get", "-Hp", "-o", "value", "used", pool]))?;
            return text
                .trim()
                .parse()
                .map_err(|_| BenchError(format!("zfs get used {pool}: unexpected '{text}'")));
        }
        match &self.mount {
            Some(m) => statvfs_used(m),
            None => fail("target is not mounted"),
        }
    }

    fn make_snapshot_root(&self, rel: &str) -> Result<()> {
        if self.lib.is_some() {
            return fail("snapshot roots need a mounted directory");
        }
        let path = self.path_of(rel)?;
        match (&self.spec.kind, &self.zfs_pool) {
            (Kind::Btrfs | Kind::BtrfsZstd, _) => run_cmd(
                Command::new("btrfs")
                    .args(["subvolume", "create"])
                    .arg(&path),
            ),
            (_, Some(_)) => {
                let ds = self.zfs_dataset(rel).unwrap_or_default();
                run_cmd(
                    Command::new("zfs")
                        .arg("create")
                        .arg("-o")
                        .arg(format!("mountpoint={}", path.display()))
                        .arg(&ds),
                )?;
                self.zfs_datasets
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(ds);
                Ok(())
            }
            _ => fs::create_dir(&path).ctx(|| format!("mkdir {}", path.display())),
        }
    }

    fn snapshot(&self, rel: &str, name: &str) -> Result<bool> {
        let path = self.path_of(rel)?;
        match (&self.spec.kind, &self.zfs_pool) {
            (Kind::Btrfs | Kind::BtrfsZstd, _) => {
                let snaps = self.path_of(".snapshots")?;
                if !snaps.exists() {
                    fs::create_dir(&snaps).ctx(|| format!("mkdir {}", snaps.display()))?;
                }
                run_cmd(
                    Command::new("btrfs")
                        .args(["subvolume", "snapshot", "-r"])
                        .arg(&path)
                        .arg(snaps.join(name)),
                )?;
                Ok(true)
            }
            (_, Some(_)) => {
                let ds = self.zfs_dataset(rel).unwrap_or_default();
                run_cmd(
                    Command::new("zfs")
                        .arg("snapshot")
                        .arg(format!("{ds}@{name}")),
                )?;
                Ok(true)
            }
            // With history off, a snapshot would keep nothing: unsupported.
            (Kind::Anvil | Kind::AnvilZstd | Kind::AnvilS3, _) => {
                let mnt = self.mount.as_deref().unwrap_or(Path::new("/"));
                set_xattr(mnt, "trusted.anvil.snapshot", name.as_bytes())?;
                Ok(true)
            }
            (Kind::Dir(_), _) if fs_type_of(&path).as_deref() == Some("fuse.anvil") => {
                let mut root = path.clone();
                while let Some(parent) = root.parent() {
                    if fs_type_of(parent).as_deref() != Some("fuse.anvil") {
                        break;
                    }
                    root = parent.to_path_buf();
                }
                set_xattr(&root, "trusted.anvil.snapshot", name.as_bytes())?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirror_status_says_what_a_slave_holds() {
        let slave =
            r#"{"committed_tid":4,"last_tid":4,"master":"03","slave":true,"volume_id":"40"}"#;
        assert_eq!(slave_holds(slave).unwrap(), Some(4));
        let master = r#"{"committed_tid":9,"slave":false,"volume_id":"40"}"#;
        assert_eq!(slave_holds(master).unwrap(), None);
        assert!(slave_holds(r#"{"slave":true}"#).is_err());
        assert!(slave_holds("mirror-status: no such file").is_err());
    }

    /// A second run in a work directory fails at once, naming the first; it may start once
    /// the first lets go.
    #[test]
    fn one_run_at_a_time_in_a_work_directory() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let first = lock_work_dir(&work).unwrap();
        let pid = std::process::id().to_string();
        assert_eq!(fs::read_to_string(work.join("lock")).unwrap().trim(), pid);
        let second = lock_work_dir(&work).unwrap_err().to_string();
        assert!(second.contains("another anvil bench run"), "{second}");
        assert!(second.contains(&format!("(pid {pid})")), "{second}");
        assert!(second.contains(&work.display().to_string()), "{second}");
        // Another directory is free.
        let other = lock_work_dir(&dir.path().join("other")).unwrap();
        drop(first);
        let again = lock_work_dir(&work).unwrap();
        drop((again, other));
    }
}
