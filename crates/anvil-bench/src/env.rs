//! What a workload sees of the target it runs on ([`RunEnv`]) and what it
//! gives back ([`RunOutput`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::vfs::Vfs;

/// Counters of `/sys/block/<dev>/stat`, summed over the target's devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IoCounters {
    pub reads: u64,
    pub read_sectors: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub write_sectors: u64,
    pub write_ms: u64,
    /// Flush requests (cache flushes sent to the device).
    pub flushes: u64,
}

impl IoCounters {
    /// Parses one `/sys/block/<dev>/stat` line (see Documentation/block/stat.rst).
    pub fn parse(line: &str) -> Option<IoCounters> {
        let f: Vec<u64> = line
            .split_whitespace()
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        if f.len() < 11 {
            return None;
        }
        Some(IoCounters {
            reads: f[0],
            read_sectors: f[2],
            read_ms: f[3],
            writes: f[4],
            write_sectors: f[6],
            write_ms: f[7],
            flushes: f.get(15).copied().unwrap_or(0),
        })
    }

    /// Reads the counters of a block device, e.g. "loop3" or "vda".
    pub fn of_device(dev: &str) -> Option<IoCounters> {
        let text = std::fs::read_to_string(format!("/sys/block/{dev}/stat")).ok()?;
        IoCounters::parse(&text)
    }

    pub fn add(&self, o: &IoCounters) -> IoCounters {
        IoCounters {
            reads: self.reads + o.reads,
            read_sectors: self.read_sectors + o.read_sectors,
            read_ms: self.read_ms + o.read_ms,
            writes: self.writes + o.writes,
            write_sectors: self.write_sectors + o.write_sectors,
            write_ms: self.write_ms + o.write_ms,
            flushes: self.flushes + o.flushes,
        }
    }

    /// `self - earlier`, saturating (counters may reset when a device is recreated).
    pub fn since(&self, earlier: &IoCounters) -> IoCounters {
        IoCounters {
            reads: self.reads.saturating_sub(earlier.reads),
            read_sectors: self.read_sectors.saturating_sub(earlier.read_sectors),
            read_ms: self.read_ms.saturating_sub(earlier.read_ms),
            writes: self.writes.saturating_sub(earlier.writes),
            write_sectors: self.write_sectors.saturating_sub(earlier.write_sectors),
            write_ms: self.write_ms.saturating_sub(earlier.write_ms),
            flushes: self.flushes.saturating_sub(earlier.flushes),
        }
    }

    /// Completed device I/Os.
    pub fn ios(&self) -> u64 {
        self.reads + self.writes
    }

    /// Mean time per I/O in ms, as iostat computes it (0 when there were none).
    pub fn mean_io_ms(&self) -> f64 {
        match self.ios() {
            0 => 0.0,
            n => (self.read_ms + self.write_ms) as f64 / n as f64,
        }
    }

    pub fn bytes_read(&self) -> u64 {
        self.read_sectors * 512
    }

    pub fn bytes_written(&self) -> u64 {
        self.write_sectors * 512
    }
}

/// Target-specific services a workload may call.
pub trait Probe: Send + Sync {
    /// Writes everything back and empties the caches that sit between the
    /// workload and the device: the kernel's page, dentry and inode caches and,
    /// for anvil, the daemon's (or the library's) own cache.
    fn drop_caches(&self) -> Result<()>;
    /// sync(2) for a kernel file system, a commit for anvil.
    fn sync(&self) -> Result<()>;
    /// Current device counters of the target (zero for `--dir` targets with no
    /// known device).
    fn io(&self) -> IoCounters;
    /// Bytes in use on the file system (statfs: blocks - free).
    fn used_bytes(&self) -> Result<u64>;
    /// Makes `path` (relative to the workload root) a directory that can be
    /// snapshotted: a btrfs subvolume, a zfs dataset, or a plain directory.
    fn make_snapshot_root(&self, path: &str) -> Result<()>;
    /// Takes a read-only snapshot of the snapshot root `path` named `name`.
    /// Returns false when the file system has no snapshots.
    fn snapshot(&self, path: &str, name: &str) -> Result<bool>;
    /// Makes a second, empty file system of the same kind and size that the
    /// snapshots of the snapshot root `path` can be sent to (`btrfs send |
    /// btrfs receive`, `zfs send | zfs recv`, `anvil mirror-read | anvil
    /// mirror-write`). None when the file system cannot send snapshots.
    fn make_replica(&self, _path: &str) -> Result<Option<Box<dyn Replica>>> {
        Ok(None)
    }
}

/// The two commands of one send: the sender writes the stream to its
/// stdout, the receiver reads it from its stdin.
pub struct SendReceive {
    pub send: std::process::Command,
    pub receive: std::process::Command,
    /// The pipeline as a shell would show it, for the results.
    pub shown: String,
}

/// The receiving side of a mirror: a second file system of the target's kind
/// and size, made by [`Probe::make_replica`], removed by `teardown` (or when
/// dropped).
pub trait Replica: Send {
    /// How the replica was built (mkfs, mount options, device, mount point).
    fn info(&self) -> crate::results::FsInfo;
    /// The commands that bring the replica to snapshot `name` of the source's
    /// snapshot root: incrementally from snapshot `prev` (which it holds), or
    /// the whole snapshot when `prev` is None. May ask the replica what it
    /// holds (anvil's mirror-status), so callers time this call too.
    fn pipeline(&self, name: &str, prev: Option<&str>) -> Result<SendReceive>;
    /// A single command that does the whole send, where the file system has
    /// one (`anvil mirror-copy SRC DST`).
    fn copy_command(&self) -> Option<std::process::Command> {
        None
    }
    /// Makes what the replica received durable (sync(2), or a commit for anvil).
    fn sync(&self) -> Result<()>;
    /// Bytes in use on the replica's file system (as [`Probe::used_bytes`]).
    fn used_bytes(&self) -> Result<u64>;
    /// Device counters of the replica.
    fn io(&self) -> IoCounters;
    /// Where the replica's copy of the snapshot root as of snapshot `name` can
    /// be read, if known (`latest`: `name` is the newest snapshot it received).
    fn snapshot_dir(&self, name: &str, latest: bool) -> Option<PathBuf>;
    /// Unmounts and removes the replica.
    fn teardown(self: Box<Self>) -> Result<()>;
}

/// Everything a workload gets for one run.
pub struct RunEnv<'a> {
    /// The directory to work in, on the file system under test; empty when
    /// the run starts. None for `anvil-lib`, which has no kernel path.
    pub dir: Option<PathBuf>,
    /// The same directory as a [`Vfs`].
    pub vfs: &'a dyn Vfs,
    pub probe: &'a dyn Probe,
    /// Target label, e.g. "ext4" or "btrfs-zstd".
    pub fs_label: String,
    /// File-system type: "anvil", "ext4", "xfs", "btrfs", "zfs", "tmpfs", ...
    pub fs_type: String,
    /// Seed for this run (the suite's seed plus the run index).
    pub seed: u64,
    /// Run index, from 0.
    pub run: u32,
    /// Memory limit the workload and the file system run under, if any.
    pub mem_limit: Option<u64>,
    /// A bar the workload may set the length, position and message of.
    pub progress: &'a ProgressBar,
}

impl RunEnv<'_> {
    /// The working directory, or an error naming the workload that needs one.
    pub fn posix_dir(&self, workload: &str) -> Result<&Path> {
        match &self.dir {
            Some(d) => Ok(d),
            None => crate::error::fail(format!(
                "{workload} needs a mounted directory; it cannot run on {}",
                self.fs_label
            )),
        }
    }

    /// Times `f` as one phase: wall clock, user and system CPU of this process
    /// and its children, and device I/O.
    pub fn phase<T>(&self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<(T, Phase)> {
        let cpu0 = CpuTimes::now();
        let io0 = self.probe.io();
        let t0 = Instant::now();
        let value = f()?;
        let wall_s = t0.elapsed().as_secs_f64();
        let io = self.probe.io().since(&io0);
        let cpu = CpuTimes::now().since(&cpu0);
        Ok((
            value,
            Phase {
                name: name.to_string(),
                wall_s,
                user_s: cpu.user_s,
                sys_s: cpu.sys_s,
                io,
                logical_bytes: None,
                physical_bytes: None,
            },
        ))
    }
}

/// User and system CPU time of this process plus its waited-for children.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuTimes {
    pub user_s: f64,
    pub sys_s: f64,
}

impl CpuTimes {
    pub fn now() -> CpuTimes {
        fn get(who: libc::c_int) -> (f64, f64) {
            let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
            // SAFETY: getrusage fills the provided struct.
            unsafe { libc::getrusage(who, ru.as_mut_ptr()) };
            // SAFETY: zero-initialised and possibly filled by getrusage.
            let ru = unsafe { ru.assume_init() };
            let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
            (t(ru.ru_utime), t(ru.ru_stime))
        }
        let (su, ss) = get(libc::RUSAGE_SELF);
        let (cu, cs) = get(libc::RUSAGE_CHILDREN);
        CpuTimes {
            user_s: su + cu,
            sys_s: ss + cs,
        }
    }

    pub fn since(&self, earlier: &CpuTimes) -> CpuTimes {
        CpuTimes {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            sys_s: (self.sys_s - earlier.sys_s).max(0.0),
        }
    }
}

/// One measured number of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Stable key, e.g. "final_reads" or "write_kBps@1m/256m".
    pub name: String,
    /// e.g. "ops/s", "kB/s", "s", "blogs".
    pub unit: String,
    pub value: f64,
    pub higher_is_better: bool,
}

impl Metric {
    pub fn higher(name: impl Into<String>, unit: &str, value: f64) -> Metric {
        Metric {
            name: name.into(),
            unit: unit.into(),
            value,
            higher_is_better: true,
        }
    }

    pub fn lower(name: impl Into<String>, unit: &str, value: f64) -> Metric {
        Metric {
            name: name.into(),
            unit: unit.into(),
            value,
            higher_is_better: false,
        }
    }
}

/// A timed step of a run (a nightly-build phase, a backup day, ...).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    pub name: String,
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    pub io: IoCounters,
    /// Bytes as the application sees them (sum of file sizes), if measured.
    pub logical_bytes: Option<u64>,
    /// Bytes the file system used for them, if measured.
    pub physical_bytes: Option<u64>,
}

/// A curve over the run, e.g. blogbench's articles read per interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Stable key, e.g. "articles_read".
    pub name: String,
    pub x_label: String,
    pub y_label: String,
    pub points: Vec<(f64, f64)>,
}

/// What one run of a workload produced.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunOutput {
    pub metrics: Vec<Metric>,
    pub phases: Vec<Phase>,
    pub series: Vec<Series>,
    /// The workload's own text report (blogbench's table, iozone's table).
    pub text: String,
    /// Failed operations the workload counted and went on after.
    pub errors: u64,
    /// Anything else worth keeping, e.g. per-interval blogbench rows.
    pub extra: serde_json::Value,
    /// Device I/O of the whole run, from just before the workload started to after a
    /// sync at its end (set by the harness; phases alone miss write-back after them).
    #[serde(default)]
    pub io_total: Option<IoCounters>,
    /// Wall-clock seconds of the whole run (set by the harness).
    #[serde(default)]
    pub wall_s: Option<f64>,
}
