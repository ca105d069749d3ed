//! `anvil-bench quick`: one directory, six measurements, several runs.
//!
//! Each run works in a fresh subdirectory `anvil-bench.<pid>.<run>` of `--dir`:
//!
//! 1. `create`: create, write `--file-bytes` and close `--files` files, all
//!    in that one directory (ops/s).
//! 2. `stat`: `stat` every file (ops/s).
//! 3. `reread`: after one unmeasured warm pass (which also checks contents),
//!    open, read and close every file again, from cache (ops/s).
//! 4. `seq_write`: write a `--seq-mib` MiB file in 1 MiB writes, then fsync
//!    (MiB/s, the fsync included).
//! 5. `seq_read`: after `sync` and `echo 3 > /proc/sys/vm/drop_caches`, read it
//!    back in 1 MiB reads, checking contents (MiB/s).
//! 6. `unlink`: remove every small file (ops/s).
//!
//! Data is pseudo-random (incompressible), so file systems that compress do
//! not get an unfair advantage. Contents are verified outside the timed
//! sections, except for the sequential read, where the check is a `memcmp`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;

use crate::error::{fail, BenchError, Context, Result};
use crate::report::{self, Metric, Params, Report};

const MIB: usize = 1 << 20;
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

#[derive(Debug, Args)]
pub struct QuickArgs {
    /// Directory to benchmark in (on the file system under test).
    #[arg(long)]
    dir: PathBuf,
    /// Number of small files (0 skips the small-file metrics).
    #[arg(long, default_value_t = 20_000)]
    files: u64,
    /// Size of each small file, in bytes.
    #[arg(long, default_value_t = 4096)]
    file_bytes: u64,
    /// Size of the sequential file, in MiB (0 skips the sequential metrics).
    #[arg(long, default_value_t = 1024)]
    seq_mib: u64,
    /// Number of runs; the report gives median, min and max over them.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,
    /// A name for the file system, stored in the report (default: its type
    /// from /proc/self/mounts, e.g. "ext4" or "fuse.anvil").
    #[arg(long)]
    label: Option<String>,
}

pub fn run(args: &QuickArgs) -> Result<()> {
    let meta = fs::metadata(&args.dir).ctx(|| format!("{}", args.dir.display()))?;
    if !meta.is_dir() {
        return fail(format!("{} is not a directory", args.dir.display()));
    }
    let dir = fs::canonicalize(&args.dir).ctx(|| format!("canonicalize {}", args.dir.display()))?;
    let file_bytes = usize::try_from(args.file_bytes)
        .ok()
        .filter(|&n| n <= 64 * MIB)
        .ok_or_else(|| BenchError("--file-bytes must be at most 64 MiB".into()))?;
    let fs_type = report::fs_type_of(&dir);
    let label = args
        .label
        .clone()
        .or_else(|| fs_type.clone())
        .unwrap_or_else(|| "unknown".into());
    eprintln!(
        "anvil-bench quick: {} ({label}): {} files x {} B, {} MiB sequential, {} runs",
        dir.display(),
        args.files,
        args.file_bytes,
        args.seq_mib,
        args.runs
    );

    let pool = DataPool::new(file_bytes);
    let mut samples = Samples::default();
    let mut cold_read = true;
    for run in 1..=args.runs {
        let work = dir.join(format!("anvil-bench.{}.{run}", std::process::id()));
        fs::create_dir(&work).ctx(|| format!("mkdir {}", work.display()))?;
        sync_all_filesystems();
        let res = one_run(args, &work, file_bytes, &pool, &mut samples, &mut cold_read);
        if res.is_err() {
            // Leave the tree for inspection; say where it is.
            eprintln!(
                "anvil-bench: run {run} failed; its files are in {}",
                work.display()
            );
        }
        res?;
        fs::remove_dir(&work).ctx(|| format!("rmdir {}", work.display()))?;
        eprintln!("  run {run}/{}: {}", args.runs, samples.last_run_summary());
    }

    let report = Report {
        tool: "anvil-bench quick".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        label,
        dir: dir.display().to_string(),
        fs_type,
        params: Params {
            files: args.files,
            file_bytes: args.file_bytes,
            seq_mib: args.seq_mib,
            runs: args.runs,
        },
        cold_read,
        metrics: samples.into_metrics(),
    };
    report
        .print_table(&mut io::stdout().lock())
        .ctx(|| "write to stdout".into())?;
    if let Some(out) = &args.json {
        report.save(out)?;
        eprintln!("anvil-bench: wrote {}", out.display());
    }
    Ok(())
}

fn one_run(
    args: &QuickArgs,
    work: &Path,
    file_bytes: usize,
    pool: &DataPool,
    samples: &mut Samples,
    cold_read: &mut bool,
) -> Result<()> {
    let files = args.files;
    samples.start_run();
    if files > 0 {
        let elapsed = create_files(work, files, file_bytes, pool)?;
        samples.push("create", rate(files as f64, elapsed));

        let elapsed = stat_files(work, files, file_bytes)?;
        samples.push("stat", rate(files as f64, elapsed));

        read_files(work, files, file_bytes, Some(pool))?; // warm pass, verifies contents
        let elapsed = read_files(work, files, file_bytes, None)?;
        samples.push("reread", rate(files as f64, elapsed));
    }
    if args.seq_mib > 0 {
        let seq = work.join("seq.dat");
        let elapsed = seq_write(&seq, args.seq_mib, pool)?;
        samples.push("seq_write", rate(args.seq_mib as f64, elapsed));

        if let Err(err) = drop_caches() {
            if *cold_read {
                eprintln!("anvil-bench: warning: cannot drop caches ({err}); seq_read is warm");
            }
            *cold_read = false;
        }
        let elapsed = seq_read(&seq, args.seq_mib, pool)?;
        samples.push("seq_read", rate(args.seq_mib as f64, elapsed));
        fs::remove_file(&seq).ctx(|| format!("unlink {}", seq.display()))?;
    }
    if files > 0 {
        let elapsed = unlink_files(work, files)?;
        samples.push("unlink", rate(files as f64, elapsed));
    }
    Ok(())
}

fn rate(amount: f64, elapsed: Duration) -> f64 {
    amount / elapsed.as_secs_f64().max(1e-9)
}

fn small_file(dir: &Path, i: u64) -> PathBuf {
    dir.join(format!("f{i:07}"))
}

fn create_files(dir: &Path, files: u64, file_bytes: usize, pool: &DataPool) -> Result<Duration> {
    let start = Instant::now();
    for i in 0..files {
        let path = small_file(dir, i);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .ctx(|| format!("create {}", path.display()))?;
        file.write_all(pool.small(i, file_bytes))
            .ctx(|| format!("write {}", path.display()))?;
    }
    Ok(start.elapsed())
}

fn stat_files(dir: &Path, files: u64, file_bytes: usize) -> Result<Duration> {
    let start = Instant::now();
    for i in 0..files {
        let path = small_file(dir, i);
        let meta = fs::metadata(&path).ctx(|| format!("stat {}", path.display()))?;
        if meta.len() != file_bytes as u64 {
            return fail(format!(
                "{}: size {} != {file_bytes}",
                path.display(),
                meta.len()
            ));
        }
    }
    Ok(start.elapsed())
}

/// Open, read to EOF and close every file. With `verify`, also compares the
/// contents with what `create_files` wrote.
fn read_files(
    dir: &Path,
    files: u64,
    file_bytes: usize,
    verify: Option<&DataPool>,
) -> Result<Duration> {
    let mut buf = vec![0u8; file_bytes + 1];
    let start = Instant::now();
    for i in 0..files {
        let path = small_file(dir, i);
        let mut file = File::open(&path).ctx(|| format!("open {}", path.display()))?;
        let n = read_full(&mut file, &mut buf).ctx(|| format!("read {}", path.display()))?;
        if n != file_bytes {
            return fail(format!(
                "{}: read {n} bytes, expected {file_bytes}",
                path.display()
            ));
        }
        if let Some(pool) = verify {
            if buf[..n] != *pool.small(i, file_bytes) {
                return fail(format!(
                    "{}: contents differ from what was written",
                    path.display()
                ));
            }
        }
    }
    Ok(start.elapsed())
}

/// Reads until `buf` is full or EOF; returns the byte count.
fn read_full(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(n)
}

fn seq_write(path: &Path, mib: u64, pool: &DataPool) -> Result<Duration> {
    let start = Instant::now();
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .ctx(|| format!("create {}", path.display()))?;
    for k in 0..mib {
        file.write_all(pool.chunk(k))
            .ctx(|| format!("write {} at {k} MiB", path.display()))?;
    }
    file.sync_all()
        .ctx(|| format!("fsync {}", path.display()))?;
    drop(file);
    Ok(start.elapsed())
}

fn seq_read(path: &Path, mib: u64, pool: &DataPool) -> Result<Duration> {
    let mut buf = vec![0u8; MIB];
    let start = Instant::now();
    let mut file = File::open(path).ctx(|| format!("open {}", path.display()))?;
    for k in 0..mib {
        let n =
            read_full(&mut file, &mut buf).ctx(|| format!("read {} at {k} MiB", path.display()))?;
        if n != MIB {
            return fail(format!(
                "{}: short read at {k} MiB ({n} bytes)",
                path.display()
            ));
        }
        if buf != pool.chunk(k) {
            return fail(format!("{}: contents differ at {k} MiB", path.display()));
        }
    }
    let n =
        read_full(&mut file, &mut buf[..1]).ctx(|| format!("read {} at EOF", path.display()))?;
    if n != 0 {
        return fail(format!("{}: longer than {mib} MiB", path.display()));
    }
    Ok(start.elapsed())
}

fn unlink_files(dir: &Path, files: u64) -> Result<Duration> {
    let start = Instant::now();
    for i in 0..files {
        let path = small_file(dir, i);
        fs::remove_file(&path).ctx(|| format!("unlink {}", path.display()))?;
    }
    Ok(start.elapsed())
}

fn sync_all_filesystems() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

/// Writes back dirty data, then drops the page, dentry and inode caches
/// (needs root). For a FUSE file system this empties the kernel's caches;
/// whatever the daemon caches itself stays.
fn drop_caches() -> io::Result<()> {
    sync_all_filesystems();
    fs::write(DROP_CACHES, "3\n")
}

/// Pseudo-random bytes from which every file's contents are sliced.
struct DataPool {
    bytes: Vec<u8>,
}

impl DataPool {
    fn new(file_bytes: usize) -> Self {
        let len = (8 * MIB).max(2 * file_bytes + MIB);
        let mut bytes = Vec::with_capacity(len + 8);
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        while bytes.len() < len {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            bytes.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        bytes.truncate(len);
        DataPool { bytes }
    }

    /// Contents of small file `i`.
    fn small(&self, i: u64, file_bytes: usize) -> &[u8] {
        let span = (self.bytes.len() - file_bytes) as u64;
        let off = (i.wrapping_mul(4099) % span) as usize;
        &self.bytes[off..off + file_bytes]
    }

    /// Contents of MiB `k` of the sequential file.
    fn chunk(&self, k: u64) -> &[u8] {
        let span = (self.bytes.len() - MIB) as u64;
        let off = (k.wrapping_mul(7919 * 61) % span) as usize;
        &self.bytes[off..off + MIB]
    }
}

/// Per-metric samples, one per run.
#[derive(Default)]
struct Samples {
    metrics: Vec<(&'static str, Vec<f64>)>,
    this_run: Vec<(&'static str, f64)>,
}

impl Samples {
    fn start_run(&mut self) {
        self.this_run.clear();
    }

    fn push(&mut self, name: &'static str, value: f64) {
        self.this_run.push((name, value));
        match self.metrics.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => values.push(value),
            None => self.metrics.push((name, vec![value])),
        }
    }

    fn last_run_summary(&self) -> String {
        let parts: Vec<String> = self
            .this_run
            .iter()
            .map(|(name, value)| {
                let (_, unit) = report::describe(name);
                format!("{name} {value:.0} {unit}")
            })
            .collect();
        parts.join(", ")
    }

    fn into_metrics(self) -> Vec<Metric> {
        self.metrics
            .into_iter()
            .map(|(name, runs)| Metric::from_runs(name, runs))
            .collect()
    }
}
