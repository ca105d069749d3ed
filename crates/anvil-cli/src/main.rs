//! `anvil`: make, mount, inspect and verify anvil volumes.

mod helper;
mod history;
mod keeper;
mod mirror;
mod mount;
mod replay;
mod store;

use anvil::device::{Device, FileDevice};
use anvil::internals::Volume;
use anvil::{Error, Filesystem, MountOptions};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "anvil",
    version,
    about = "anvil: a filesystem that never forgets"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a volume in an image file (sparse) or on a block device.
    Mkfs {
        /// Image file, block device, or s3://BUCKET/PREFIX (endpoint and credentials from
        /// the AWS_* environment variables).
        image: PathBuf,
        /// Volume size, e.g. 8G, 512M (default: the block device's size).
        #[arg(long)]
        size: Option<String>,
        /// Overwrite an existing filesystem.
        #[arg(long)]
        force: bool,
        /// Volume label (up to 32 bytes).
        #[arg(long, default_value = "")]
        label: String,
        /// Codec for new data everywhere no directory chooses another: lz4 (the default),
        /// zstd (smaller, slower to write) or none.
        #[arg(long)]
        compression: Option<String>,
    },
    /// Mount a volume (in the background unless -f).
    Mount {
        /// Image, block device, or s3://BUCKET/PREFIX (endpoint and credentials from the
        /// AWS_* environment variables).
        image: PathBuf,
        dir: PathBuf,
        /// Options: ro, nohistory, cache=SIZE, commit_interval_ms=N, ttl_ms=N, threads=N,
        /// crash_log=on|off (off: a crash of the daemon loses changes since the last fsync).
        #[arg(short = 'o', value_delimiter = ',')]
        options: Vec<String>,
        /// Stay in the foreground.
        #[arg(short = 'f', long)]
        foreground: bool,
        /// Write the daemon's log to this file.
        #[arg(long)]
        log: Option<PathBuf>,
        /// Mount the volume read-only as of a TID, a time (YYYY-MM-DDTHH:MM[:SS], UTC) or a
        /// snapshot label.
        #[arg(long)]
        as_of: Option<String>,
        /// Record every device write and flush to this file, for `anvil replay-check`.
        #[arg(long)]
        device_log: Option<PathBuf>,
        /// A read-only replica of an s3:// volume that another host writes: follows the
        /// writer's commits (every second, `-o follow_ms=N`), or stays at `--as-of`.
        #[arg(long)]
        replica: bool,
        /// Take over this FUSE connection descriptor from a daemon that died (the keeper
        /// passes it; see keeper.rs).
        #[arg(long, hide = true)]
        resume_fd: Option<i32>,
    },
    /// Hold a FUSE connection for its daemon and start a new daemon on it if the daemon
    /// dies (started by the daemon itself; see keeper.rs).
    #[command(hide = true)]
    Keeper { fd: i32, pipe: i32 },
    /// Serve a trivial in-memory file system on DIR through the same transports and options
    /// as `mount` (nothing is kept): measures what a transport costs by itself.
    #[command(hide = true)]
    Memfs {
        dir: PathBuf,
        #[arg(short = 'o', value_delimiter = ',')]
        options: Vec<String>,
        #[arg(short = 'f', long)]
        foreground: bool,
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// Replay a device log onto a copy of the image as it was at mount, and check the volume
    /// at every flush point; exit 0 only when every point is clean.
    ReplayCheck {
        /// A copy of the image taken before the mount that wrote the log.
        base: PathBuf,
        log: PathBuf,
        /// Check every Nth flush point (default: every one).
        #[arg(long, default_value_t = 1)]
        every: u64,
        /// At each checked flush point, also check this many crash states in which only a
        /// random subset of the writes since the previous flush reached the device, in a
        /// random order, some torn at 512 bytes (a device may reorder within a flush).
        #[arg(long, default_value_t = 0)]
        reorder: u32,
        /// Seed for the subsets chosen by --reorder.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Also check the state after every write: what a crash of the daemon leaves (the
        /// host keeps every write it was given).
        #[arg(long)]
        kills: bool,
        /// Threads checking crash states (default: one per CPU).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Show size, usage, object counts, current TID and last commit time.
    Info {
        /// Image, block device, or the directory an anvil volume is mounted on.
        target: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Verify every checksum and tree invariant; exit 0 only when clean.
    Check {
        image: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Commit a mounted volume now and print the durable TID.
    Synctid {
        /// The directory the volume is mounted on.
        dir: PathBuf,
    },
    /// Commit a mounted volume and empty the daemon's cache, so that the next reads come
    /// from the device (for benchmarks; also `echo 3 > /proc/sys/vm/drop_caches` for the
    /// kernel's caches).
    DropCaches {
        /// The directory the volume is mounted on.
        dir: PathBuf,
    },
    /// Requests the kernel sent the mount's daemon, per opcode, and the transport serving it.
    Stats {
        /// The directory the volume is mounted on.
        dir: PathBuf,
        #[arg(long)]
        json: bool,
        /// Set the counts back to zero (after printing them).
        #[arg(long)]
        reset: bool,
    },
    /// Take a snapshot of a mounted volume: commit now and keep that TID until removed.
    Snapshot {
        dir: PathBuf,
        #[arg(long, default_value = "")]
        label: String,
    },
    /// List the snapshots of a mounted volume.
    Snapls {
        dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Remove a snapshot (by TID or label); its history becomes prunable.
    Snaprm { dir: PathBuf, snapshot: String },
    /// List every committed version of a file or directory on a mounted volume.
    History {
        path: PathBuf,
        #[arg(long)]
        json: bool,
        /// Only versions in which this byte range changed, as START:LENGTH (e.g. 0:4096).
        #[arg(long)]
        range: Option<String>,
    },
    /// Recover an earlier version of a file (also one deleted since), or diff it.
    Undo {
        path: PathBuf,
        /// Version to recover: a TID, a time (YYYY-MM-DDTHH:MM[:SS], UTC) or a snapshot
        /// label. Default: the newest version that differs from the current one.
        #[arg(short = 't', long = "tid")]
        tid: Option<String>,
        /// Where to write it ("-" for standard output). Default: PATH.undo-<TID>.
        #[arg(short = 'o', long = "output")]
        output: Option<PathBuf>,
        /// Show a unified diff from that version to the current file instead.
        #[arg(long)]
        diff: bool,
    },
    /// Remove the history the retention policy no longer keeps (snapshots always stay).
    Prune {
        dir: PathBuf,
        /// Use this policy instead of the stored one, e.g. all=1d,daily=30d,weekly=8w.
        #[arg(long)]
        policy: Option<String>,
    },
    /// Remove all history except snapshots.
    PruneEverything { dir: PathBuf },
    /// Rewrite data and tree in order (defragment); time-boxed and resumable.
    Reblock {
        dir: PathBuf,
        /// Stop after this many seconds; the next run resumes where this one stopped.
        #[arg(long)]
        seconds: Option<u64>,
    },
    /// Run the snapshot, prune and reblock schedule stored in the volume (from cron).
    Cleanup {
        dir: PathBuf,
        /// Change the schedule, e.g. "snapshot=1d prune=1d reblock=7d reblock_minutes=5"
        /// (0 disables an action).
        #[arg(long)]
        config: Option<String>,
    },
    /// Show or set whether a file or directory keeps history (new children inherit it).
    Nohistory {
        path: PathBuf,
        /// "on" (keep no history) or "off" (keep history).
        setting: Option<String>,
    },
    /// Show or set whether a directory is a cache: when space runs low, the least recently
    /// used clusters of files created in it are deleted instead of writes failing with
    /// ENOSPC. A cache keeps no history; subdirectories created in it are caches too.
    Evict {
        dir: PathBuf,
        /// "on" (a cache) or "off" (an ordinary directory; history stays off).
        setting: Option<String>,
    },
    /// Show or set the codec for new data of a file or directory (new children inherit it):
    /// none, lz4, zstd, or default (the volume's, set at mkfs). Written data keeps its codec.
    Compression {
        path: PathBuf,
        setting: Option<String>,
    },
    /// Show or set the retention policy stored in the volume.
    Policy {
        dir: PathBuf,
        /// New policy, e.g. all=1d,daily=30d,weekly=8w,monthly=12m.
        policy: Option<String>,
    },
    /// Print a file of an unmounted volume, now or as of an earlier TID.
    Cat {
        image: PathBuf,
        /// Path inside the volume, e.g. /notes.txt.
        path: String,
        /// Read as of this committed TID (hex 0x... or decimal).
        #[arg(long)]
        at: Option<String>,
    },
    /// List a directory of an unmounted volume, now or as of an earlier TID.
    Ls {
        image: PathBuf,
        #[arg(default_value = "/")]
        path: String,
        #[arg(long)]
        at: Option<String>,
    },
    /// Write the changes committed after --since (up to --until) as a mirror stream to
    /// stdout: every tree change with its TIDs, history included, and the data it needs.
    MirrorRead {
        /// Mount point, or an unmounted image or block device.
        target: PathBuf,
        /// Changes after this TID or snapshot label (0: the whole volume).
        #[arg(long, default_value = "0")]
        since: String,
        /// Up to this TID or label (default: the newest commit, after committing).
        #[arg(long)]
        until: Option<String>,
    },
    /// Apply a mirror stream from stdin to a slave (or to a new, empty volume, which becomes
    /// one). All or nothing: a refused stream leaves the slave as it was.
    MirrorWrite {
        /// Mount point, or an unmounted image or block device.
        target: PathBuf,
    },
    /// Bring DST up to date with SRC (mount points, images, or host:path through ssh):
    /// from what DST holds, or everything for a new slave.
    MirrorCopy {
        src: String,
        dst: String,
        /// How to reach host:path endpoints.
        #[arg(long, default_value = "ssh")]
        via: String,
    },
    /// Keep DST following SRC: mirror-copy every --interval-ms, resuming from what DST
    /// holds after a broken connection.
    MirrorStream {
        src: String,
        dst: String,
        #[arg(long, default_value = "ssh")]
        via: String,
        #[arg(long, default_value_t = 500)]
        interval_ms: u64,
        /// Stop after this many rounds (default: run until killed).
        #[arg(long)]
        rounds: Option<u64>,
    },
    /// Show a volume's mirror role: master, or slave of which volume, up to which TID.
    MirrorStatus {
        /// Mount point, image, or host:path.
        target: String,
        #[arg(long)]
        json: bool,
        #[arg(long, default_value = "ssh")]
        via: String,
    },
    /// Turn a slave into a master (disaster recovery): it takes changes again, from the
    /// TID after the last one it holds.
    MirrorPromote { target: PathBuf },
    /// Make an old master (OLD: mount point or image) the slave of the slave that was
    /// promoted in its place (NEW), from the TID NEW was promoted at. Changes OLD took after
    /// that TID are undone; refused if files without history changed since.
    MirrorAttach {
        old: PathBuf,
        new: String,
        #[arg(long, default_value = "ssh")]
        via: String,
    },
    /// Benchmarks: blogbench, nightly build, proxy cache, iozone, backup and metadata
    /// workloads on anvil and other file systems side by side (see `anvil bench run --help`).
    Bench(anvil_bench::cli::BenchArgs),
}

/// Exit codes: 0 success, 1 operation failed, 2 usage error, 3 volume damaged (check).
const EXIT_FAILED: u8 = 1;
const EXIT_DAMAGED: u8 = 3;

/// The binary allocates through jemalloc, not glibc's malloc. The engine's data path
/// allocates buffers of 4-128 KiB by the hundred thousand (file data held until its commit,
/// locality sets read, extents decoded), freed on other threads; glibc searched its bins
/// for them through cold memory, 17% of the library replay's request thread against 7%
/// with jemalloc (docs/design.md, "One cache").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts (the `_rjem_` prefix is the embedded build's).
/// One arena: the commit thread frees what the request threads allocated, and separate
/// arenas would each hold freed pages of their own. Freed pages go back to the kernel 200 ms
/// after they were last used, from jemalloc's own thread: a FUSE daemon shares its memory
/// cgroup with the programs using the mount, and with jemalloc's defaults (ten seconds of
/// dirty pages, four arenas per CPU) the proxy replay was killed by its 256 MiB cgroup.
/// Thread caches keep their default reach (32 KiB): at 4 KiB, cold reads through the mount
/// were a fifth slower.
#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: MallocConf =
    MallocConf(c"narenas:1,dirty_decay_ms:200,muzzy_decay_ms:0,background_thread:true".as_ptr());

/// A C string's address that may sit in a `static` (jemalloc reads `const char *`).
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a string literal, never written.
unsafe impl Sync for MallocConf {}

fn main() -> ExitCode {
    let mut argv = std::env::args_os();
    let called_as = argv
        .next()
        .map(|a| Path::new(&a).file_name().map(|n| n.to_os_string()));
    let result = if called_as.flatten().is_some_and(|n| n == helper::NAME) {
        helper::run(&argv.collect::<Vec<_>>())
    } else {
        run(Cli::parse())
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("anvil: {message}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn run(cli: Cli) -> Result<u8, String> {
    match cli.command {
        Command::Mkfs {
            image,
            size,
            force,
            label,
            compression,
        } => mkfs(
            &image,
            size.as_deref(),
            force,
            &label,
            compression.as_deref(),
        ),
        Command::Mount {
            image,
            dir,
            options,
            foreground,
            log,
            as_of,
            device_log,
            resume_fd,
            replica,
        } => mount::run(
            &image,
            &dir,
            &options,
            mount::Extras {
                foreground,
                log: log.as_deref(),
                as_of: as_of.as_deref(),
                device_log: device_log.as_deref(),
                resume_fd,
                replica,
            },
        ),
        Command::Keeper { fd, pipe } => keeper::run(fd, pipe),
        Command::Memfs {
            dir,
            options,
            foreground,
            log,
        } => mount::run_memfs(&dir, &options, foreground, log.as_deref()),
        Command::ReplayCheck {
            base,
            log,
            every,
            reorder,
            seed,
            kills,
            threads,
        } => replay::replay_check(
            &base,
            &log,
            &replay::ReplayOptions {
                every,
                reorder,
                seed,
                kills,
                threads: threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            },
        ),
        Command::Info { target, json } => info(&target, json),
        Command::Check { image, json } => check(&image, json),
        Command::Synctid { dir } => mount::synctid(&dir).map(|tid| {
            println!("{tid:#018x}");
            0
        }),
        Command::DropCaches { dir } => mount::drop_caches(&dir).map(|()| 0),
        Command::Stats { dir, json, reset } => mount::stats(&dir, json, reset).map(|()| 0),
        Command::Snapshot { dir, label } => history::snapshot(&dir, &label),
        Command::Snapls { dir, json } => history::snapls(&dir, json),
        Command::Snaprm { dir, snapshot } => history::snaprm(&dir, &snapshot),
        Command::History { path, json, range } => history::history(&path, json, range.as_deref()),
        Command::Undo {
            path,
            tid,
            output,
            diff,
        } => history::undo(&path, tid.as_deref(), output.as_deref(), diff),
        Command::Prune { dir, policy } => history::prune(&dir, policy.as_deref().unwrap_or("")),
        Command::PruneEverything { dir } => history::prune(&dir, "everything"),
        Command::Reblock { dir, seconds } => history::reblock(&dir, seconds),
        Command::Cleanup { dir, config } => history::cleanup(&dir, config.as_deref()),
        Command::Nohistory { path, setting } => history::nohistory(&path, setting.as_deref()),
        Command::Evict { dir, setting } => history::evict(&dir, setting.as_deref()),
        Command::Compression { path, setting } => history::compression(&path, setting.as_deref()),
        Command::Policy { dir, policy } => history::policy(&dir, policy.as_deref()),
        Command::Cat { image, path, at } => cat(&image, &path, at.as_deref()),
        Command::Ls { image, path, at } => ls(&image, &path, at.as_deref()),
        Command::MirrorRead {
            target,
            since,
            until,
        } => mirror::read(&target, &since, until.as_deref()),
        Command::MirrorWrite { target } => mirror::write(&target),
        Command::MirrorCopy { src, dst, via } => mirror::copy(&src, &dst, &via),
        Command::MirrorStream {
            src,
            dst,
            via,
            interval_ms,
            rounds,
        } => mirror::stream(
            &src,
            &dst,
            &via,
            std::time::Duration::from_millis(interval_ms),
            rounds,
        ),
        Command::MirrorStatus { target, json, via } => mirror::status(&target, json, &via),
        Command::MirrorPromote { target } => mirror::promote(&target),
        Command::MirrorAttach { old, new, via } => mirror::attach(&old, &new, &via),
        Command::Bench(args) => anvil_bench::cli::run(args)
            .map(|()| 0)
            .map_err(|e| format!("bench: {e}")),
    }
}

pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("invalid size {text:?}"))?;
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(format!("invalid size unit in {text:?} (use K, M, G or T)")),
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// Names a filesystem found at the start of a device, if any.
fn existing_filesystem(device: &dyn Device) -> std::io::Result<Option<&'static str>> {
    let len = device.len()?;
    let probe = len.min(128 * 1024) as usize;
    let mut head = vec![0u8; probe];
    device.read_at(&mut head, 0)?;
    let at = |offset: usize, magic: &[u8]| head.get(offset..offset + magic.len()) == Some(magic);
    Ok(
        if Volume::read_superblock(device).is_ok() || at(0, b"ANVL") {
            Some("anvil")
        } else if at(1080, &[0x53, 0xEF]) {
            Some("ext2/3/4")
        } else if at(0, b"XFSB") {
            Some("xfs")
        } else if at(65600, b"_BHRfS_M") {
            Some("btrfs")
        } else if head.iter().any(|&b| b != 0) {
            Some("unknown data")
        } else {
            None
        },
    )
}

fn mkfs(
    image: &Path,
    size: Option<&str>,
    force: bool,
    label: &str,
    compression: Option<&str>,
) -> Result<u8, String> {
    let requested = size.map(parse_size).transpose()?;
    let codec = compression
        .map(|name| {
            anvil::format::record::compression::parse(name)
                .ok_or_else(|| format!("--compression: expected none, lz4 or zstd, not {name:?}"))
        })
        .transpose()?;
    if store::is_store(image) {
        let bytes = requested.ok_or("--size is required for an object-store volume")?;
        let device = store::create(image, bytes, force)?;
        return format_volume(image, device, bytes, label, codec);
    }
    let existed = image.exists();
    let device =
        FileDevice::create(image).map_err(|e| format!("cannot open {}: {e}", image.display()))?;
    if existed && !force {
        if let Some(found) = existing_filesystem(&device).map_err(|e| e.to_string())? {
            return Err(format!(
                "{} already holds a filesystem ({found}); use --force to overwrite it",
                image.display()
            ));
        }
    }
    let bytes = match requested {
        Some(bytes) => bytes,
        None if device.is_block_device() => device.len().map_err(|e| e.to_string())?,
        None => return Err("--size is required for an image file".to_string()),
    };
    if device.is_block_device() && bytes > device.len().map_err(|e| e.to_string())? {
        return Err(format!("{} is smaller than {bytes} bytes", image.display()));
    }
    // No daemon serves the image (its lock is not held).
    let unmounted = mount::try_lock_shared(device.file());
    let code = format_volume(image, Arc::new(device), bytes, label, codec)?;
    // The crash log a killed daemon left for the volume this one replaces is of no use to
    // any mount (a mount skips another volume's batches), but it keeps its memory: tmpfs,
    // up to 64 MiB an image, until the next mount of the same image overwrites it.
    if let Some(log) = anvil::crash_log_file(image, None).filter(|_| unmounted) {
        match std::fs::remove_file(&log) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                eprintln!(
                    "anvil: cannot remove the old crash log {}: {e}",
                    log.display()
                );
            }
            _ => {}
        }
    }
    Ok(code)
}

/// Writes an empty volume on `device` (and the root's codec when one was asked for).
fn format_volume(
    image: &Path,
    device: Arc<dyn Device>,
    bytes: u64,
    label: &str,
    codec: Option<u8>,
) -> Result<u8, String> {
    Filesystem::mkfs(device.clone(), bytes, label).map_err(|e| e.to_string())?;
    if let Some(codec) = codec {
        let options = MountOptions {
            commit_interval_ms: 0,
            ..Default::default()
        };
        let fs = Filesystem::open(device, options).map_err(|e| describe(image, &e))?;
        fs.set_compression(anvil::format::record::ROOT_OBJ, Some(codec))
            .and_then(|()| fs.close())
            .map_err(|e| describe(image, &e))?;
    }
    println!(
        "created anvil volume on {} ({bytes} bytes)",
        image.display()
    );
    Ok(0)
}

/// Opens an image read-only for inspection; refuses one a daemon has mounted. A volume on
/// an object store is read as its writer last flushed it, mounted or not.
fn open_for_inspection(image: &Path) -> Result<Filesystem, String> {
    if store::is_store(image) {
        let device = store::open(image, false, false, 64 << 20, None)?;
        let options = MountOptions {
            read_only: true,
            commit_interval_ms: 0,
            ..Default::default()
        };
        return Filesystem::open(device, options).map_err(|e| describe(image, &e));
    }
    let device = FileDevice::open(image, false)
        .map_err(|e| format!("cannot open {}: {e}", image.display()))?;
    if !mount::try_lock_shared(device.file()) {
        return Err(format!(
            "{} is mounted (busy); run `anvil info` on the mount point, or unmount it first",
            image.display()
        ));
    }
    // What a crashed daemon acknowledged is in its crash log: show it too.
    let options = MountOptions {
        read_only: true,
        commit_interval_ms: 0,
        crash_log_file: anvil::crash_log_file(image, None),
        ..Default::default()
    };
    Filesystem::open(Arc::new(device), options).map_err(|e| describe(image, &e))
}

fn describe(image: &Path, e: &Error) -> String {
    format!("{}: {e}", image.display())
}

fn info(target: &Path, json: bool) -> Result<u8, String> {
    let (info_json, split) = if target.is_dir() {
        let split = mount::get_xattr(target, anvil_fuse::SPACE_XATTR)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
        (mount::query_info(target)?, split)
    } else {
        let fs = open_for_inspection(target)?;
        let split = fs.space_split().ok().map(|s| {
            serde_json::json!({"live_bytes": s.live_bytes, "history_bytes": s.history_bytes,
                "tree_bytes": s.tree_bytes, "extent_logical_bytes": s.extent_logical_bytes,
                "extent_allocated_bytes": s.extent_allocated_bytes,
                "extents_by_codec": s.extents_by_codec})
        });
        (fs.info().to_json(), split)
    };
    let mut value: serde_json::Value =
        serde_json::from_str(&info_json).map_err(|e| e.to_string())?;
    if let (Some(split), Some(object)) = (&split, value.as_object_mut()) {
        for key in [
            "live_bytes",
            "history_bytes",
            "tree_bytes",
            "extent_logical_bytes",
            "extent_allocated_bytes",
            "extents_by_codec",
        ] {
            object.insert(key.to_string(), split[key].clone());
        }
    }
    if json {
        println!("{value}");
        return Ok(0);
    }
    let num = |k: &str| value[k].as_u64().unwrap_or(0);
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
    println!("label:          {}", value["label"].as_str().unwrap_or(""));
    println!(
        "volume id:      {}",
        value["volume_id"].as_str().unwrap_or("")
    );
    println!("size:           {}", mib(num("volume_bytes")));
    println!("used:           {}", mib(num("used_bytes")));
    if split.is_some() {
        println!("  live data:    {}", mib(num("live_bytes")));
        println!(
            "  history:      {} (freed by `anvil prune`)",
            mib(num("history_bytes"))
        );
        println!("  tree:         {}", mib(num("tree_bytes")));
        let logical = num("extent_logical_bytes");
        let allocated = num("extent_allocated_bytes");
        if allocated > 0 {
            let codecs = &value["extents_by_codec"];
            let count = |i: usize| codecs[i].as_u64().unwrap_or(0);
            println!(
                "compression:    {:.2}x ({} of live data in {}; extents: {} lz4, {} zstd, {} raw)",
                logical as f64 / allocated as f64,
                mib(logical),
                mib(allocated),
                count(1),
                count(2),
                count(0)
            );
        }
    }
    println!(
        "free:           {} (of which {} reserved)",
        mib(num("free_bytes")),
        mib(num("reserve_bytes"))
    );
    println!(
        "objects:        {} ({} ids used)",
        num("objects"),
        num("objects_allocated")
    );
    println!("current TID:    {:#018x}", num("committed_tid"));
    println!(
        "last commit:    {}",
        history::format_time(num("commit_time_ns"))
    );
    if num("created_time_ns") > 0 {
        println!(
            "created:        {}",
            history::format_time(num("created_time_ns"))
        );
    }
    if num("pending_bytes") > 0 {
        println!("pending:        {}", mib(num("pending_bytes")));
    }
    let store = |name: &str| value["device"][name].as_u64().unwrap_or(0);
    if value["device"].get("store_segments").is_some() {
        let (hits, misses) = (store("store_cache_hits"), store("store_cache_misses"));
        let disk_hits = store("store_disk_hits");
        let share = |n: u64| 100.0 * n as f64 / (hits + misses).max(1) as f64;
        println!(
            "object store:   {} segments; {} written, {} uploaded (packed) in {} segments, {} pending; read {} (cache hits: memory {:.1}%, disk {:.1}%)",
            store("store_segments"),
            mib(store("store_written_bytes")),
            mib(store("store_uploaded_bytes")),
            store("store_uploaded_segments"),
            mib(store("store_pending_bytes")),
            mib(store("store_fetched_bytes")),
            share(hits),
            share(disk_hits),
        );
        if store("store_write_waits") > 0 {
            println!(
                "                writes waited for the store {} times ({} ms)",
                store("store_write_waits"),
                store("store_write_wait_ms")
            );
        }
    }
    let engine = |name: &str| value["engine"][name].as_u64().unwrap_or(0);
    if engine("commits") > 0 {
        let waits = engine("throttled_writers") + engine("log_waits");
        println!(
            "commits:        {} since open, {} ms each on average; writers waited for one {} times ({} ms)",
            engine("commits"),
            engine("commit_ms") / engine("commits"),
            waits,
            engine("throttled_ms") + engine("log_wait_ms")
        );
    }
    let cache = |name: &str| value["cache"][name].as_u64().unwrap_or(0);
    let lookups = cache("node_hits") + cache("node_misses");
    if lookups + cache("extent_hits") + cache("extent_misses") > 0 {
        let rate = |hits: &str, misses: &str| {
            100.0 * cache(hits) as f64 / (cache(hits) + cache(misses)).max(1) as f64
        };
        println!(
            "cache:          {} of {} ({} for nodes); hits: nodes {:.1}% ({} misses), extents {:.1}% ({} misses), locality sets {:.1}% ({} misses)",
            mib(cache("bytes")),
            mib(cache("budget_bytes")),
            mib(cache("node_bytes")),
            rate("node_hits", "node_misses"),
            cache("node_misses"),
            rate("extent_hits", "extent_misses"),
            cache("extent_misses"),
            rate("set_hits", "set_misses"),
            cache("set_misses"),
        );
    }
    if num("evicted_files") > 0 {
        println!(
            "evicted:        {} cache files ({}) since the volume was mounted",
            num("evicted_files"),
            mib(num("evicted_bytes"))
        );
    }
    // Nearly full: less than 2% (at least 1 MiB) left above the reserve.
    let available = num("free_bytes").saturating_sub(num("reserve_bytes"));
    if available < (num("volume_bytes") / 50).max(1 << 20) {
        let what = if target.is_dir() {
            target.display().to_string()
        } else {
            "MOUNTPOINT".to_string()
        };
        print!("volume full:    {} left for writes", mib(available));
        if split.is_none() || num("history_bytes") > 0 {
            println!(
                "; deleting frees nothing while history keeps the old versions: \
                 run `anvil prune {what}` (stored policy) or `anvil prune-everything {what}`"
            );
        } else {
            println!("; delete files to make room");
        }
    }
    Ok(0)
}

fn check(image: &Path, json: bool) -> Result<u8, String> {
    let fs = open_for_inspection(image)?;
    let report = anvil::check::check(fs.volume()).map_err(|e| describe(image, &e))?;
    if json {
        let problems: Vec<serde_json::Value> = report
            .problems
            .iter()
            .map(|p| serde_json::Value::String(p.clone()))
            .collect();
        let out = serde_json::json!({
            "clean": report.is_clean(),
            "problems": problems,
            "nodes": report.nodes,
            "elements": report.elements,
            "live_elements": report.live_elements,
            "history_elements": report.history_elements,
            "underfull_nodes": report.underfull_nodes,
            "extents": report.extents,
            "objects": report.objects,
        });
        println!("{out}");
    } else {
        if report.is_clean() {
            println!(
                "clean: {} objects, {} nodes ({} under a third full), {} elements ({} history), \
                 {} extents verified",
                report.objects,
                report.nodes,
                report.underfull_nodes,
                report.elements,
                report.history_elements,
                report.extents
            );
        } else {
            println!("damaged: {} problems found", report.problems.len());
        }
        for problem in &report.problems {
            println!("  {problem}");
        }
    }
    Ok(if report.is_clean() { 0 } else { EXIT_DAMAGED })
}

/// Parses a TID given as 0x-prefixed hex (the form anvil prints) or decimal.
fn parse_tid(text: &str) -> Result<u64, String> {
    anvil::fs::parse_tid(text).map_err(|e| e.to_string())
}

fn cat(image: &Path, path: &str, at: Option<&str>) -> Result<u8, String> {
    let fs = open_for_inspection(image)?;
    let bytes = match at {
        Some(tid) => fs.at(parse_tid(tid)?).and_then(|view| view.read_file(path)),
        None => fs.read_file(path),
    }
    .map_err(|e| format!("{path}: {e}"))?;
    use std::io::Write;
    std::io::stdout()
        .write_all(&bytes)
        .map_err(|e| e.to_string())?;
    Ok(0)
}

fn ls(image: &Path, path: &str, at: Option<&str>) -> Result<u8, String> {
    let fs = open_for_inspection(image)?;
    let entries = match at {
        Some(tid) => fs.at(parse_tid(tid)?).and_then(|view| view.list_dir(path)),
        None => fs.list_dir(path),
    }
    .map_err(|e| format!("{path}: {e}"))?;
    let mut names: Vec<String> = entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .collect();
    names.sort();
    for name in names {
        println!("{name}");
    }
    Ok(0)
}
