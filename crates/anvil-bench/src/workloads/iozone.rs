//! `iozone`: a native implementation of iozone's auto-mode test set.
//!
//! For every file size × record size it runs, on one file in the target
//! directory, the tests of iozone `-i 0 -i 1 -i 2 -i 3 -i 4 -i 5` (and, with
//! `stdio`, `-i 6 -i 7`):
//!
//! | test           | what is timed                                                  |
//! |----------------|----------------------------------------------------------------|
//! | write          | a new file written sequentially, record by record              |
//! | rewrite        | the same file written again                                    |
//! | read           | sequential read, after `drop_caches` (cold)                    |
//! | reread         | sequential read again (warm, as in iozone)                     |
//! | random-read    | every record once, in a shuffled order                         |
//! | random-write   | every record once, in another shuffled order                   |
//! | bkwd-read      | the records from last to first                                 |
//! | record-rewrite | the first record, written as many times as there are records   |
//! | stride-read    | records `0, s, 2s, ...`, then `1, 1+s, ...` (s = 17): each once |
//! | fwrite/frewrite| as write/rewrite through a `BufWriter` (C stdio's role)        |
//! | fread/freread  | as read/reread through a `BufReader`                           |
//!
//! I/O is positioned (`pwrite`/`pread`). As with `iozone -e -c`, the time of a
//! writing test includes its `fsync` and every test includes its `close`; the
//! `open` is not timed. Results are kB/s with 1 kB = 1024 bytes, as iozone
//! prints them, in iozone's auto-mode table (`RunOutput::text`), as metrics
//! `<test>@<size>/<record>` (e.g. `write@256m/1m`) and as series of
//! throughput against record size, one per test and file size.
//!
//! File sizes are either absolute (`file_sizes`) or multiples of the memory
//! limit the run is under (`mem_multiples`; `mem_bytes` stands in when there
//! is no limit), capped at `max_file_bytes`. As iozone does, records under
//! 64 KiB are skipped for files over `crossover_bytes` (iozone: 16 MiB)
//! unless `small_records_on_large_files` (iozone `-z`).
//!
//! Data is random (incompressible) by default; `compressibility = P` zeroes
//! the last P% of every 4 KiB block. Every 4 KiB block of the file carries its
//! block number in its first 8 bytes, so that no two blocks are equal (no
//! dedup advantage) and reads can check they got the block they asked for;
//! the first file of a run (or all, with `verify_all`) is read back and
//! compared in full outside the timed tests.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::env::{Metric, Phase, RunEnv, RunOutput, Series};
use crate::error::{fail, BenchError, Context, Result};
use crate::workloads::{apply_overrides, Overrides, Tier, Workload};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
/// Alignment of buffers and granularity of the block stamps.
const BLOCK: usize = 4096;
/// Records come from a random pool this much larger than a record, at
/// shifting offsets, so that consecutive records differ.
const POOL_SPAN: usize = 1 << 20;
/// iozone's LARGE_REC: the smallest record used on files over the crossover.
const LARGE_REC: u64 = 64 * KIB;
/// Buffer of the stdio tests (glibc's BUFSIZ).
const STDIO_BUF: usize = 8192;
const FILE_NAME: &str = "iozone.tmp";

/// Parameters of the iozone workload (`--set key=value`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Absolute file sizes in bytes; when empty, `mem_multiples` is used.
    pub file_sizes: Vec<u64>,
    /// File sizes as multiples of the memory limit.
    pub mem_multiples: Vec<f64>,
    /// Memory size assumed for `mem_multiples` when the run has no limit.
    pub mem_bytes: u64,
    /// Cap on file sizes (0: none).
    pub max_file_bytes: u64,
    /// Record sizes in bytes (multiples of 4 KiB).
    pub record_sizes: Vec<u64>,
    /// Files larger than this skip records under 64 KiB (iozone CROSSOVER).
    pub crossover_bytes: u64,
    /// Keep small records on large files too (iozone `-z`).
    pub small_records_on_large_files: bool,
    /// Percent (0-100) of every 4 KiB block that is zeros; 0 = incompressible.
    pub compressibility: u32,
    /// Open the file with O_DIRECT (iozone `-I`).
    pub o_direct: bool,
    /// Include fsync in the timing of writing tests (iozone `-e`).
    pub fsync: bool,
    /// Also run fwrite/frewrite/fread/freread (iozone `-i 6 -i 7`).
    pub stdio: bool,
    /// Stride of the stride-read test, in records (iozone `-j`).
    pub stride: u64,
    /// Drop caches before random-read, bkwd-read and stride-read too (not
    /// only before read and fread).
    pub drop_caches_each_test: bool,
    /// Read back and compare every file, not only the first of the run.
    pub verify_all: bool,
}

impl Params {
    pub fn for_tier(tier: Tier) -> Params {
        let base = Params {
            file_sizes: vec![],
            mem_multiples: vec![0.25, 0.5, 1.0, 2.0],
            mem_bytes: GIB,
            max_file_bytes: 0,
            record_sizes: vec![4 * KIB, 64 * KIB, MIB],
            crossover_bytes: 16 * MIB,
            small_records_on_large_files: false,
            compressibility: 0,
            o_direct: false,
            fsync: true,
            stdio: false,
            stride: 17,
            drop_caches_each_test: false,
            verify_all: false,
        };
        match tier {
            Tier::Tiny => Params {
                file_sizes: vec![MIB],
                record_sizes: vec![4 * KIB, 64 * KIB],
                ..base
            },
            Tier::Quick => Params {
                file_sizes: vec![64 * MIB],
                record_sizes: vec![64 * KIB, MIB],
                ..base
            },
            Tier::Standard => Params {
                mem_multiples: vec![0.25, 1.0],
                max_file_bytes: GIB,
                // 4 KiB records on the 256 MiB file but not on the 1 GiB one.
                crossover_bytes: 256 * MIB,
                ..base
            },
            Tier::Full => Params {
                max_file_bytes: 4 * GIB,
                record_sizes: (0..7).map(|i| (4 * KIB) << (2 * i)).collect(),
                ..base
            },
        }
    }

    fn validate(&self) -> Result<()> {
        if self.record_sizes.is_empty() {
            return fail("iozone: record_sizes is empty");
        }
        if let Some(r) = self
            .record_sizes
            .iter()
            .find(|&&r| r == 0 || r % BLOCK as u64 != 0 || r > 1 << 30)
        {
            return fail(format!(
                "iozone: record size {r} is not a multiple of 4 KiB between 4 KiB and 1 GiB"
            ));
        }
        if self.file_sizes.is_empty() && self.mem_multiples.is_empty() {
            return fail("iozone: neither file_sizes nor mem_multiples is set");
        }
        if self.mem_multiples.iter().any(|m| m.is_nan() || *m <= 0.0) {
            return fail("iozone: mem_multiples must be positive");
        }
        if self.compressibility > 100 {
            return fail("iozone: compressibility is a percentage (0-100)");
        }
        if self.stride == 0 {
            return fail("iozone: stride must be at least 1");
        }
        Ok(())
    }

    /// The file sizes of a run under `mem_limit`, ascending, capped and
    /// rounded down (to 1 MiB, or 4 KiB for smaller files).
    pub fn resolved_sizes(&self, mem_limit: Option<u64>) -> Vec<u64> {
        let mem = mem_limit.unwrap_or(self.mem_bytes);
        let raw: Vec<u64> = if self.file_sizes.is_empty() {
            self.mem_multiples
                .iter()
                .map(|m| (m * mem as f64) as u64)
                .collect()
        } else {
            self.file_sizes.clone()
        };
        let mut sizes: Vec<u64> = raw
            .into_iter()
            .map(|s| match self.max_file_bytes {
                0 => s,
                cap => s.min(cap),
            })
            .map(|s| {
                if s >= MIB {
                    s / MIB * MIB
                } else {
                    s / BLOCK as u64 * BLOCK as u64
                }
            })
            .filter(|&s| s > 0)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }

    /// The record sizes used on a file of `size` bytes.
    pub fn records_for(&self, size: u64) -> Vec<u64> {
        let mut recs: Vec<u64> = self
            .record_sizes
            .iter()
            .copied()
            .filter(|&r| r <= size)
            .filter(|&r| {
                self.small_records_on_large_files || size <= self.crossover_bytes || r >= LARGE_REC
            })
            .collect();
        recs.sort_unstable();
        recs.dedup();
        recs
    }

    /// (file size, record size) pairs of a run, in iozone's order.
    pub fn plan(&self, mem_limit: Option<u64>) -> Vec<(u64, u64)> {
        self.resolved_sizes(mem_limit)
            .into_iter()
            .flat_map(|s| self.records_for(s).into_iter().map(move |r| (s, r)))
            .collect()
    }
}

/// Builds the iozone workload.
pub fn workload(tier: Tier, overrides: &Overrides) -> Result<Box<dyn Workload>> {
    let params = apply_overrides(Params::for_tier(tier), overrides)?;
    params.validate()?;
    Ok(Box::new(Iozone { params }))
}

struct Iozone {
    params: Params,
}

/// The tests, in iozone's column order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Test {
    Write,
    Rewrite,
    Read,
    Reread,
    RandomRead,
    RandomWrite,
    BkwdRead,
    RecordRewrite,
    StrideRead,
    Fwrite,
    Frewrite,
    Fread,
    Freread,
}

const TESTS: [Test; 13] = [
    Test::Write,
    Test::Rewrite,
    Test::Read,
    Test::Reread,
    Test::RandomRead,
    Test::RandomWrite,
    Test::BkwdRead,
    Test::RecordRewrite,
    Test::StrideRead,
    Test::Fwrite,
    Test::Frewrite,
    Test::Fread,
    Test::Freread,
];

impl Test {
    fn key(self) -> &'static str {
        match self {
            Test::Write => "write",
            Test::Rewrite => "rewrite",
            Test::Read => "read",
            Test::Reread => "reread",
            Test::RandomRead => "random-read",
            Test::RandomWrite => "random-write",
            Test::BkwdRead => "bkwd-read",
            Test::RecordRewrite => "record-rewrite",
            Test::StrideRead => "stride-read",
            Test::Fwrite => "fwrite",
            Test::Frewrite => "frewrite",
            Test::Fread => "fread",
            Test::Freread => "freread",
        }
    }

    /// Width of the column in iozone's table.
    fn width(self) -> usize {
        match self {
            Test::RecordRewrite | Test::StrideRead => 10,
            _ => 9,
        }
    }
}

/// Results of one (file size, record size) pair.
#[derive(Clone, Debug)]
struct Row {
    size: u64,
    reclen: u64,
    /// kB/s per test, indexed like [`TESTS`].
    kbps: [Option<f64>; 13],
}

/// "256m", "1g", "64k", "1000b".
pub fn size_label(bytes: u64) -> String {
    if bytes > 0 && bytes % GIB == 0 {
        format!("{}g", bytes / GIB)
    } else if bytes > 0 && bytes % MIB == 0 {
        format!("{}m", bytes / MIB)
    } else if bytes > 0 && bytes % KIB == 0 {
        format!("{}k", bytes / KIB)
    } else {
        format!("{bytes}b")
    }
}

/// Record indices from last to first.
pub fn backward_order(n: u64) -> Vec<u64> {
    (0..n).rev().collect()
}

/// Every record index once, in a shuffled order.
pub fn random_order(n: u64, rng: &mut StdRng) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    v.shuffle(rng);
    v
}

/// Stride order: `0, s, 2s, ...` while below `n`, then `1, 1+s, ...`, and so
/// on up to `s-1`: each record once, jumping `s` records between reads except
/// when it wraps to the next start.
pub fn stride_order(n: u64, stride: u64) -> Vec<u64> {
    let stride = stride.max(1);
    let mut v = Vec::with_capacity(n as usize);
    for start in 0..stride.min(n) {
        v.extend((start..n).step_by(stride as usize));
    }
    v
}

/// A heap buffer aligned to [`BLOCK`] (for O_DIRECT).
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + BLOCK];
        let start = (BLOCK - raw.as_ptr() as usize % BLOCK) % BLOCK;
        AlignedBuf { raw, start, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// The data written: record `i` is a slice of a random pool, with the file
/// block number stamped into the first 8 bytes of each 4 KiB block.
struct Data {
    pool: AlignedBuf,
    reclen: usize,
}

impl Data {
    fn new(reclen: usize, compressibility: u32, rng: &mut StdRng) -> Data {
        let mut pool = AlignedBuf::new(reclen + POOL_SPAN);
        let random = BLOCK - BLOCK * compressibility as usize / 100;
        for block in pool.as_mut_slice().chunks_mut(BLOCK) {
            let r = random.min(block.len());
            rng.fill_bytes(&mut block[..r]);
        }
        Data { pool, reclen }
    }

    fn blocks_per_record(&self) -> u64 {
        (self.reclen / BLOCK) as u64
    }

    fn pool_offset(&self, rec: u64) -> usize {
        let slots = (POOL_SPAN / BLOCK) as u64;
        ((rec * self.blocks_per_record()) % slots) as usize * BLOCK
    }

    /// Record `rec`, stamped, ready to write.
    fn record(&mut self, rec: u64) -> &[u8] {
        let off = self.pool_offset(rec);
        let bpr = self.blocks_per_record();
        let buf = &mut self.pool.as_mut_slice()[off..off + self.reclen];
        for (b, block) in buf.chunks_mut(BLOCK).enumerate() {
            block[..8].copy_from_slice(&(rec * bpr + b as u64).to_le_bytes());
        }
        buf
    }

    /// Whether `buf` starts with the stamp of record `rec`.
    fn stamp_ok(&self, buf: &[u8], rec: u64) -> bool {
        buf[..8] == (rec * self.blocks_per_record()).to_le_bytes()
    }
}

fn kbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / 1024.0 / secs.max(1e-9)
}

/// One file of the sweep: how to open it and which data goes in it.
struct Subject<'a> {
    path: &'a Path,
    numrecs: u64,
    reclen: u64,
    o_direct: bool,
    fsync: bool,
}

impl Subject<'_> {
    fn bytes(&self) -> u64 {
        self.numrecs * self.reclen
    }

    fn open(&self, write: bool, create: bool) -> Result<File> {
        let mut o = OpenOptions::new();
        o.read(true);
        if write {
            o.write(true);
        }
        if create {
            o.create(true).truncate(true);
        }
        if self.o_direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(self.path)
            .ctx(|| format!("iozone: open {}", self.path.display()))
    }

    fn io_err(&self, what: &str, e: io::Error) -> BenchError {
        BenchError(format!("iozone: {what} {}: {e}", self.path.display()))
    }

    /// Writes the records in `order` (None: sequentially); returns seconds.
    fn write(&self, data: &mut Data, order: Option<&[u64]>, create: bool) -> Result<f64> {
        let f = self.open(true, create)?;
        let t0 = Instant::now();
        let mut put = |rec: u64| -> Result<()> {
            f.write_all_at(data.record(rec), rec * self.reclen)
                .map_err(|e| self.io_err("write", e))
        };
        match order {
            None => (0..self.numrecs).try_for_each(&mut put)?,
            Some(o) => o.iter().try_for_each(|&r| put(r))?,
        }
        self.finish_write(f, t0)
    }

    /// Writes record 0 `numrecs` times.
    fn record_rewrite(&self, data: &mut Data) -> Result<f64> {
        let f = self.open(true, false)?;
        let t0 = Instant::now();
        for _ in 0..self.numrecs {
            f.write_all_at(data.record(0), 0)
                .map_err(|e| self.io_err("write", e))?;
        }
        self.finish_write(f, t0)
    }

    fn finish_write(&self, f: File, t0: Instant) -> Result<f64> {
        if self.fsync {
            f.sync_all().map_err(|e| self.io_err("fsync", e))?;
        }
        close(f).map_err(|e| self.io_err("close", e))?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Reads the records in `order` (None: sequentially), checking each
    /// record's stamp; returns seconds.
    fn read(&self, data: &Data, buf: &mut AlignedBuf, order: Option<&[u64]>) -> Result<f64> {
        let f = self.open(false, false)?;
        let buf = buf.as_mut_slice();
        let mut bad = None;
        let t0 = Instant::now();
        let mut get = |rec: u64| -> Result<()> {
            f.read_exact_at(buf, rec * self.reclen)
                .map_err(|e| self.io_err("read", e))?;
            if !data.stamp_ok(buf, rec) {
                bad = Some(rec);
            }
            Ok(())
        };
        match order {
            None => (0..self.numrecs).try_for_each(&mut get)?,
            Some(o) => o.iter().try_for_each(|&r| get(r))?,
        }
        close(f).map_err(|e| self.io_err("close", e))?;
        let secs = t0.elapsed().as_secs_f64();
        match bad {
            Some(rec) => fail(format!(
                "iozone: {}: record {rec} read back with the wrong contents",
                self.path.display()
            )),
            None => Ok(secs),
        }
    }

    /// Reads the whole file and compares it with what was written (untimed).
    fn verify(&self, data: &mut Data, buf: &mut AlignedBuf) -> Result<()> {
        let f = self.open(false, false)?;
        let len = f.metadata().ctx(|| "iozone: fstat".into())?.len();
        if len != self.bytes() {
            return fail(format!(
                "iozone: {} is {len} bytes, expected {}",
                self.path.display(),
                self.bytes()
            ));
        }
        for rec in 0..self.numrecs {
            f.read_exact_at(buf.as_mut_slice(), rec * self.reclen)
                .map_err(|e| self.io_err("read", e))?;
            if buf.as_slice() != data.record(rec) {
                return fail(format!(
                    "iozone: {}: record {rec} differs from what was written",
                    self.path.display()
                ));
            }
        }
        Ok(())
    }

    /// fwrite: sequential writes through a user-space buffer.
    fn fwrite(&self, data: &mut Data, create: bool) -> Result<f64> {
        let mut o = OpenOptions::new();
        o.write(true);
        if create {
            o.create(true).truncate(true);
        }
        let f = o
            .open(self.path)
            .ctx(|| format!("iozone: open {}", self.path.display()))?;
        let t0 = Instant::now();
        let mut w = BufWriter::with_capacity(STDIO_BUF, f);
        for rec in 0..self.numrecs {
            w.write_all(data.record(rec))
                .map_err(|e| self.io_err("fwrite", e))?;
        }
        let f = w
            .into_inner()
            .map_err(|e| self.io_err("fflush", e.into_error()))?;
        self.finish_write(f, t0)
    }

    /// fread: sequential reads through a user-space buffer.
    fn fread(&self, data: &Data, buf: &mut AlignedBuf) -> Result<f64> {
        let f = File::open(self.path).ctx(|| format!("iozone: open {}", self.path.display()))?;
        let buf = buf.as_mut_slice();
        let mut bad = None;
        let t0 = Instant::now();
        let mut r = BufReader::with_capacity(STDIO_BUF, f);
        for rec in 0..self.numrecs {
            r.read_exact(buf).map_err(|e| self.io_err("fread", e))?;
            if bad.is_none() && !data.stamp_ok(buf, rec) {
                bad = Some(rec);
            }
        }
        close(r.into_inner()).map_err(|e| self.io_err("close", e))?;
        let secs = t0.elapsed().as_secs_f64();
        match bad {
            Some(rec) => fail(format!(
                "iozone: {}: record {rec} read back with the wrong contents",
                self.path.display()
            )),
            None => Ok(secs),
        }
    }
}

/// close(2) with its error (dropping a File ignores it).
fn close(f: File) -> io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` came from into_raw_fd and is closed exactly once here.
    if unsafe { libc::close(fd) } < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => fail(format!("iozone: remove {}: {e}", path.display())),
    }
}

/// Bytes available to an unprivileged user on the file system of `dir`.
#[allow(clippy::unnecessary_cast)] // the field types differ between targets
fn available_bytes(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid path and output buffer.
    if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded and filled `st`.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// Fails clearly when the file system refuses O_DIRECT.
fn probe_o_direct(dir: &Path) -> Result<()> {
    let path = dir.join("iozone.odirect-probe");
    let res = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let _ = std::fs::remove_file(&path);
    match res {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => fail(format!(
            "iozone: o_direct: the file system at {} does not support O_DIRECT \
             (open returned EINVAL); run without o_direct",
            dir.display()
        )),
        Err(e) => fail(format!("iozone: o_direct probe {}: {e}", path.display())),
    }
}

impl Iozone {
    /// All tests on one (size, record) pair; the file is removed afterwards,
    /// also on failure.
    fn one(
        &self,
        env: &RunEnv,
        path: &Path,
        size: u64,
        reclen: u64,
        rng: &mut StdRng,
        verify: bool,
    ) -> Result<(Row, Option<u64>)> {
        let res = self.one_inner(env, path, size, reclen, rng, verify);
        let rm = remove(path);
        let out = res?;
        rm?;
        Ok(out)
    }

    fn one_inner(
        &self,
        env: &RunEnv,
        path: &Path,
        size: u64,
        reclen: u64,
        rng: &mut StdRng,
        verify: bool,
    ) -> Result<(Row, Option<u64>)> {
        let p = &self.params;
        let s = Subject {
            path,
            numrecs: size / reclen,
            reclen,
            o_direct: p.o_direct,
            fsync: p.fsync,
        };
        let bytes = s.bytes();
        let mut data = Data::new(reclen as usize, p.compressibility, rng);
        let mut buf = AlignedBuf::new(reclen as usize);
        let mut row = Row {
            size,
            reclen,
            kbps: [None; 13],
        };
        let mut set = |t: Test, secs: f64| {
            let i = TESTS.iter().position(|&x| x == t).unwrap_or(0);
            row.kbps[i] = Some(kbps(bytes, secs));
        };
        let cold = |each: bool| -> Result<()> {
            if each {
                env.probe.drop_caches()?;
            }
            Ok(())
        };

        remove(path)?;
        let used0 = env.probe.used_bytes().ok();
        set(Test::Write, s.write(&mut data, None, true)?);
        let used = env.probe.used_bytes().ok();
        let physical = match (used0, used) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        set(Test::Rewrite, s.write(&mut data, None, false)?);
        cold(true)?;
        set(Test::Read, s.read(&data, &mut buf, None)?);
        set(Test::Reread, s.read(&data, &mut buf, None)?);
        cold(p.drop_caches_each_test)?;
        let order = random_order(s.numrecs, rng);
        set(Test::RandomRead, s.read(&data, &mut buf, Some(&order))?);
        let order = random_order(s.numrecs, rng);
        set(Test::RandomWrite, s.write(&mut data, Some(&order), false)?);
        cold(p.drop_caches_each_test)?;
        let order = backward_order(s.numrecs);
        set(Test::BkwdRead, s.read(&data, &mut buf, Some(&order))?);
        set(Test::RecordRewrite, s.record_rewrite(&mut data)?);
        cold(p.drop_caches_each_test)?;
        let order = stride_order(s.numrecs, p.stride);
        set(Test::StrideRead, s.read(&data, &mut buf, Some(&order))?);
        drop(order);
        if verify {
            s.verify(&mut data, &mut buf)?;
        }
        if p.stdio {
            let s = Subject {
                o_direct: false,
                ..s
            };
            remove(path)?;
            set(Test::Fwrite, s.fwrite(&mut data, true)?);
            set(Test::Frewrite, s.fwrite(&mut data, false)?);
            cold(true)?;
            set(Test::Fread, s.fread(&data, &mut buf)?);
            set(Test::Freread, s.fread(&data, &mut buf)?);
            if verify {
                s.verify(&mut data, &mut buf)?;
            }
        }
        Ok((row, physical))
    }

    fn header(&self, sizes: &[u64]) -> String {
        let p = &self.params;
        let mut t = String::new();
        t.push_str(
            "\tIozone: Performance Test of File I/O (anvil bench native implementation)\n\n",
        );
        t.push_str("\tAuto Mode\n");
        if p.fsync {
            t.push_str("\tInclude fsync in write timing\n");
        }
        t.push_str("\tInclude close in write timing\n");
        if p.o_direct {
            t.push_str("\tO_DIRECT feature enabled\n");
        }
        if p.small_records_on_large_files {
            t.push_str("\tCross over of record size disabled.\n");
        }
        let list = |v: &[u64]| -> String {
            v.iter()
                .map(|&x| format!("{} kB", x / KIB))
                .collect::<Vec<_>>()
                .join(", ")
        };
        t.push_str(&format!("\tFile sizes: {}\n", list(sizes)));
        t.push_str(&format!("\tRecord sizes: {}\n", list(&p.record_sizes)));
        match p.compressibility {
            0 => t.push_str("\tData: random (incompressible)\n"),
            c => t.push_str(&format!("\tData: {c}% of every 4 kB block zero-filled\n")),
        }
        t.push_str("\tOutput is in kBytes/sec\n");
        t.push_str("\tTime Resolution = 0.000001 seconds.\n");
        t.push_str(&format!(
            "\tFile stride size set to {} * record size.\n",
            p.stride
        ));
        let mut l1 = format!("{:>16}{:>8}", "", "");
        let mut l2 = format!("{:>16}{:>8}", "kB", "reclen");
        for test in TESTS {
            let (top, bottom) = match test {
                Test::RandomRead => ("random", "read"),
                Test::RandomWrite => ("random", "write"),
                Test::BkwdRead => ("bkwd", "read"),
                Test::RecordRewrite => ("record", "rewrite"),
                Test::StrideRead => ("stride", "read"),
                t => ("", t.key()),
            };
            l1.push_str(&format!("{top:>w$}", w = test.width()));
            l2.push_str(&format!("{bottom:>w$}", w = test.width()));
        }
        t.push_str(l1.trim_end());
        t.push('\n');
        t.push_str(&l2);
        t.push('\n');
        t
    }

    fn row_text(row: &Row) -> String {
        let mut s = format!("{:>16}{:>8}", row.size / KIB, row.reclen / KIB);
        for (i, test) in TESTS.iter().enumerate() {
            match row.kbps[i] {
                Some(v) => s.push_str(&format!("{:>w$}", v.round() as u64, w = test.width())),
                None => s.push_str(&" ".repeat(test.width())),
            }
        }
        s.trim_end().to_string()
    }
}

impl Workload for Iozone {
    fn name(&self) -> &'static str {
        "iozone"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or_default()
    }

    fn min_fs_bytes(&self) -> Option<u64> {
        let largest = self.params.resolved_sizes(None).into_iter().max()?;
        Some(largest + largest / 5)
    }

    fn run(&self, env: &RunEnv) -> Result<RunOutput> {
        let p = &self.params;
        let dir = env.posix_dir("iozone")?;
        let sizes = p.resolved_sizes(env.mem_limit);
        let plan = p.plan(env.mem_limit);
        if plan.is_empty() {
            return fail(format!(
                "iozone: no (file size, record size) pair to run: sizes {sizes:?}, records {:?}",
                p.record_sizes
            ));
        }
        let largest = sizes.iter().copied().max().unwrap_or(0);
        if let Some(avail) = available_bytes(dir) {
            if avail < largest + largest / 20 {
                return fail(format!(
                    "iozone: {} has {} MiB free, the largest file needs {} MiB",
                    dir.display(),
                    avail / MIB,
                    largest / MIB
                ));
            }
        }
        if p.o_direct {
            probe_o_direct(dir)?;
        }
        let path: PathBuf = dir.join(FILE_NAME);
        let mut rng = StdRng::seed_from_u64(env.seed ^ 0x10_20_0e);
        env.progress.set_length(plan.len() as u64);
        env.progress.set_position(0);

        let mut rows = Vec::new();
        let mut phases: Vec<Phase> = Vec::new();
        for (i, &(size, reclen)) in plan.iter().enumerate() {
            let label = format!("{}/{}", size_label(size), size_label(reclen));
            env.progress.set_message(format!("iozone {label}"));
            let verify = i == 0 || p.verify_all;
            let ((row, physical), mut phase) = env.phase(&label, || {
                self.one(env, &path, size, reclen, &mut rng, verify)
            })?;
            phase.logical_bytes = Some(size / reclen * reclen);
            phase.physical_bytes = physical;
            phases.push(phase);
            rows.push(row);
            env.progress.inc(1);
        }

        let mut text = self.header(&sizes);
        for row in &rows {
            text.push_str(&Self::row_text(row));
            text.push('\n');
        }
        text.push_str("\niozone test complete.\n");

        let mut metrics = Vec::new();
        let mut series = Vec::new();
        for (ti, test) in TESTS.iter().enumerate() {
            for row in &rows {
                if let Some(v) = row.kbps[ti] {
                    metrics.push(Metric::higher(
                        format!(
                            "{}@{}/{}",
                            test.key(),
                            size_label(row.size),
                            size_label(row.reclen)
                        ),
                        "kB/s",
                        v,
                    ));
                }
            }
            for &size in &sizes {
                let points: Vec<(f64, f64)> = rows
                    .iter()
                    .filter(|r| r.size == size)
                    .filter_map(|r| Some(((r.reclen / KIB) as f64, r.kbps[ti]?)))
                    .collect();
                if !points.is_empty() {
                    series.push(Series {
                        name: format!("{}@{}", test.key(), size_label(size)),
                        x_label: "record size (KiB)".into(),
                        y_label: "kB/s".into(),
                        points,
                    });
                }
            }
        }

        let json_rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                let mut m = serde_json::Map::new();
                m.insert("kB".into(), (r.size / KIB).into());
                m.insert("reclen_kB".into(), (r.reclen / KIB).into());
                for (ti, test) in TESTS.iter().enumerate() {
                    if let Some(v) = r.kbps[ti] {
                        m.insert(test.key().into(), v.into());
                    }
                }
                serde_json::Value::Object(m)
            })
            .collect();
        let extra = serde_json::json!({
            "file_sizes": sizes,
            "mem_basis": env.mem_limit.unwrap_or(p.mem_bytes),
            "mem_limited": env.mem_limit.is_some(),
            "data": match p.compressibility {
                0 => "random".to_string(),
                c => format!("{c}% zero per 4 KiB block"),
            },
            "rows": json_rows,
        });
        Ok(RunOutput {
            metrics,
            phases,
            series,
            text,
            errors: 0,
            extra,
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::with_env;

    fn ov(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn iozone_offset_generators_cover_each_record_once() {
        let mut rng = StdRng::seed_from_u64(7);
        for n in [0u64, 1, 2, 16, 17, 18, 100, 1000] {
            let all: Vec<u64> = (0..n).collect();
            let mut r = random_order(n, &mut rng);
            r.sort_unstable();
            assert_eq!(r, all, "random n={n}");
            let b = backward_order(n);
            assert_eq!(b.iter().rev().copied().collect::<Vec<_>>(), all);
            for stride in [1u64, 3, 17] {
                let s = stride_order(n, stride);
                let mut sorted = s.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, all, "stride n={n} s={stride}");
                // Jumps are `stride` records except at the wraps, which go to
                // the next start.
                let (mut wraps, mut start) = (0, 0);
                for w in s.windows(2) {
                    if w[1] != w[0] + stride {
                        wraps += 1;
                        assert_eq!(w[1], start + 1, "{w:?}");
                        start = w[1];
                    }
                }
                assert_eq!(wraps, stride.min(n).saturating_sub(1));
            }
        }
        assert_eq!(stride_order(5, 17), vec![0, 1, 2, 3, 4]);
        assert_eq!(stride_order(40, 17)[..4], [0, 17, 34, 1]);
        // The random order is a real shuffle.
        assert_ne!(random_order(100, &mut rng), (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn iozone_sweep_follows_memory_cap_and_crossover() {
        let p = Params::for_tier(Tier::Standard);
        assert_eq!(p.resolved_sizes(None), vec![256 * MIB, GIB]);
        assert_eq!(
            p.resolved_sizes(Some(512 * MIB)),
            vec![128 * MIB, 512 * MIB]
        );
        assert_eq!(p.resolved_sizes(Some(8 * GIB)), vec![GIB]);
        assert_eq!(p.records_for(256 * MIB), vec![4 * KIB, 64 * KIB, MIB]);
        assert_eq!(p.records_for(GIB), vec![64 * KIB, MIB]);
        let full = Params::for_tier(Tier::Full);
        assert_eq!(
            full.resolved_sizes(None),
            vec![256 * MIB, 512 * MIB, GIB, 2 * GIB]
        );
        assert_eq!(full.record_sizes.len(), 7);
        assert_eq!(*full.record_sizes.last().unwrap(), 16 * MIB);
        assert_eq!(full.records_for(256 * MIB)[0], 64 * KIB);
        let z = Params {
            small_records_on_large_files: true,
            ..full
        };
        assert_eq!(z.records_for(256 * MIB)[0], 4 * KIB);
        assert_eq!(Params::for_tier(Tier::Tiny).plan(Some(GIB)).len(), 2);
        let w = workload(Tier::Standard, &[]).unwrap();
        assert_eq!(w.min_fs_bytes(), Some(GIB + GIB / 5));
        assert!(workload(Tier::Tiny, &ov(&[("record_sizes", "[1000]")])).is_err());
        assert!(workload(Tier::Tiny, &ov(&[("compressibility", "101")])).is_err());
        assert_eq!(size_label(256 * MIB), "256m");
        assert_eq!(size_label(GIB), "1g");
        assert_eq!(size_label(4 * KIB), "4k");
    }

    #[test]
    fn iozone_data_blocks_are_distinct_and_compressibility_zeroes() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut d = Data::new(8192, 0, &mut rng);
        let a = d.record(3).to_vec();
        let b = d.record(4).to_vec();
        assert_ne!(a[8..4096], b[8..4096]);
        assert!(d.stamp_ok(&a, 3) && !d.stamp_ok(&a, 4));
        assert_eq!(a[..8], 6u64.to_le_bytes());
        assert_eq!(a[4096..4104], 7u64.to_le_bytes());
        let mut d = Data::new(4096, 50, &mut rng);
        let r = d.record(1);
        assert!(r[2048..].iter().all(|&x| x == 0));
        assert!(r[8..2048].iter().any(|&x| x != 0));
    }

    #[test]
    fn iozone_tiny_run_produces_table_metrics_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let w = workload(
            Tier::Tiny,
            &ov(&[("stdio", "true"), ("verify_all", "true")]),
        )
        .unwrap();
        assert!(!w.lib_capable());
        let out = with_env(tmp.path(), |env| w.run(env)).unwrap();
        // 13 tests x 2 records.
        assert_eq!(out.metrics.len(), 26);
        assert!(out
            .metrics
            .iter()
            .all(|m| m.value > 0.0 && m.unit == "kB/s"));
        assert!(out.metrics.iter().any(|m| m.name == "write@1m/4k"));
        assert!(out.metrics.iter().any(|m| m.name == "stride-read@1m/64k"));
        assert_eq!(out.phases.len(), 2);
        assert_eq!(out.phases[0].name, "1m/4k");
        assert_eq!(out.series.len(), 13);
        assert_eq!(out.series[0].name, "write@1m");
        assert_eq!(out.series[0].points.len(), 2);
        let lines: Vec<&str> = out.text.lines().collect();
        let head = lines
            .iter()
            .position(|l| l.trim_start().starts_with("kB  reclen"))
            .unwrap();
        let cols: Vec<&str> = lines[head].split_whitespace().collect();
        assert_eq!(
            cols[..11],
            [
                "kB", "reclen", "write", "rewrite", "read", "reread", "read", "write", "read",
                "rewrite", "read"
            ]
        );
        let top: Vec<&str> = lines[head - 1].split_whitespace().collect();
        assert_eq!(top, ["random", "random", "bkwd", "record", "stride"]);
        let rows: Vec<Vec<&str>> = lines[head + 1..]
            .iter()
            .take_while(|l| !l.trim().is_empty())
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][..2], ["1024", "4"]);
        assert_eq!(rows[1][..2], ["1024", "64"]);
        assert!(rows.iter().all(|r| r.len() == 15));
        // Columns line up with the header.
        let end_of = |l: &str, col: usize| {
            let mut n = 0;
            let mut in_word = false;
            for (i, c) in l.char_indices() {
                if c != ' ' && !in_word {
                    in_word = true;
                } else if c == ' ' && in_word {
                    in_word = false;
                    n += 1;
                    if n == col + 1 {
                        return i;
                    }
                }
            }
            l.len()
        };
        for col in 0..15 {
            assert_eq!(end_of(lines[head], col), end_of(lines[head + 1], col));
        }
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn iozone_o_direct_runs_or_fails_clearly() {
        let tmp = tempfile::tempdir().unwrap();
        let w = workload(
            Tier::Tiny,
            &ov(&[("o_direct", "true"), ("record_sizes", "[65536]")]),
        )
        .unwrap();
        match with_env(tmp.path(), |env| w.run(env)) {
            Ok(out) => assert!(out.metrics.iter().all(|m| m.value > 0.0)),
            Err(e) => assert!(e.to_string().contains("O_DIRECT"), "{e}"),
        }
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
