//! `backup`: `days` days of a changing tree backed up once a day, with
//! snapshots where the file system has them and with the hard-link trick
//! (`rsync --link-dest`) everywhere.
//!
//! The day-1 tree is generated from `seed` (nested directories, `files` files
//! of log-normally distributed sizes adding up to about `tree_mb` MB: text
//! that compresses, random data that does not, and log files) and cached
//! outside the file system under test, in `source_dir` (default
//! `/var/tmp/anvil-bench-src/backup-<hash of the generator parameters>/tree`).
//! Each method starts from a fresh copy of it (`cp -a` into a private
//! `day-state.<pid>.<n>` next to the cache, removed afterwards) and, before
//! each day after the first, applies that day's deterministic mutation: about
//! `change_pct` percent of the files change (55% of those are modified, most
//! by overwriting a region in place, some rewritten at a new size; 20% are
//! new files; 12% are deleted; 13% are renamed into another directory), every
//! log file gets lines appended, and every touched file gets the day's mtime.
//! So every run and every method sees the same sequence of trees.
//!
//! Methods, run one after the other (hard links first; unless `keep` is set,
//! its copies are deleted before the snapshot method starts):
//!
//! * `hardlink`: each day `rsync -a --delete --link-dest=../day-<N-1>
//!   SRC/ DIR/links/day-NN/` (day 1 without `--link-dest`);
//! * `snapshot`: `make_snapshot_root("snap/current")` once, then each day
//!   `rsync -a --delete --inplace SRC/ DIR/snap/current/` and
//!   `snapshot("snap/current", "day-NN")`. Where the file system has no
//!   snapshots the method is recorded as unsupported (no metrics, a note in
//!   `extra`).
//!
//! A day's time is that of the copy plus the snapshot; its space is the file
//! system's used bytes after the day (after a sync, outside the timing) minus
//! the used bytes just before the method's first day.
//!
//! With `offsite` set, the snapshot method also makes a second file system of
//! the same kind (`Probe::make_replica`) and, after each day, outside the
//! day's timing, sends the day's snapshot to it as the `mirror` workload does
//! (whole on day 1, incrementally after), recording the send's time, wire
//! bytes and the receiver's space.
//!
//! After each method (outside the timing) the last day's copy is compared
//! with the source as it was that day, and the day-1 copy with the manifest
//! (paths, modes, sizes, content hashes) of the day-1 tree: always for
//! `links/day-01`, and for the day-1 snapshot where its path is known (btrfs:
//! `DIR/.snapshots/day-01`; zfs: `snap/current/.zfs/snapshot/day-01`; anvil:
//! `<mount>/.snapshots/day-01/<path of snap/current>`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use rand_distr::{Distribution, LogNormal};
use serde::{Deserialize, Serialize};

use crate::env::{Metric, Phase, RunEnv, RunOutput, Series};
use crate::error::{fail, Context, Result};
use crate::workloads::mirror::{send_snapshot, Sent};
use crate::workloads::nightly::{
    cached_tree, check_outside, fnv64, require_tools, run_checked, tree_bytes, CACHE_ROOT, MB,
};
use crate::workloads::{apply_overrides, Overrides, Tier, Workload};

/// Bumped whenever the generator's or the mutation's output changes.
const GENERATOR_VERSION: u32 = 1;

/// mtime of the day-1 files (2023-11-14); day N's changes are N days later.
const EPOCH: u64 = 1_700_000_000;
const DAY: u64 = 86_400;

const METHODS: [&str; 2] = ["hardlink", "snapshot"];

/// Parameters of `backup`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Days backed up (day 1 is the full copy).
    pub days: u32,
    /// Size of the day-1 tree, MB (10^6 bytes).
    pub tree_mb: f64,
    /// Files in the day-1 tree.
    pub files: u32,
    /// Percentage of the files that change each day.
    pub change_pct: f64,
    /// Percentage of the files with random (incompressible) content.
    pub random_pct: f64,
    /// Comma-separated methods to run: "hardlink", "snapshot" or both.
    pub methods: String,
    /// Seed of the tree generator and the daily changes.
    pub seed: u64,
    /// Keep the hard-link copies while the snapshot method runs.
    pub keep: bool,
    /// Where the day-1 tree is cached; empty for the default
    /// `/var/tmp/anvil-bench-src/backup-<hash>`.
    pub source_dir: String,
    /// Snapshot method: after each day's snapshot, send it to a second file
    /// system of the same kind (as the `mirror` workload does), outside the
    /// day's timing, and record the send's time and bytes.
    #[serde(default)]
    pub offsite: bool,
}

impl Params {
    pub fn for_tier(tier: Tier) -> Params {
        let (days, tree_mb, files, change_pct) = match tier {
            Tier::Tiny => (3, 1.0, 60, 10.0),
            Tier::Quick => (7, 20.0, 800, 5.0),
            Tier::Standard => (30, 60.0, 2000, 5.0),
            Tier::Full => (90, 500.0, 12000, 5.0),
        };
        Params {
            days,
            tree_mb,
            files,
            change_pct,
            random_pct: 25.0,
            methods: METHODS.join(","),
            seed: 1,
            keep: false,
            source_dir: String::new(),
            offsite: false,
        }
    }

    fn methods(&self) -> Result<Vec<&'static str>> {
        let mut out = Vec::new();
        for m in self
            .methods
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            match METHODS.iter().find(|k| **k == m) {
                Some(k) => {
                    if !out.contains(k) {
                        out.push(*k)
                    }
                }
                None => {
                    return fail(format!(
                        "backup: unknown method '{m}' (known: {})",
                        METHODS.join(", ")
                    ))
                }
            }
        }
        if out.is_empty() {
            return fail("backup: no methods given");
        }
        // Always hard links first (see the module documentation).
        out.sort_by_key(|m| METHODS.iter().position(|k| k == m));
        Ok(out)
    }

    fn check(&self) -> Result<()> {
        if self.days == 0 || self.files == 0 || self.tree_mb.is_nan() || self.tree_mb <= 0.0 {
            return fail("backup: days, files and tree_mb must be positive");
        }
        if self.days > 999 {
            return fail("backup: at most 999 days");
        }
        if !(0.0..=100.0).contains(&self.change_pct) || !(0.0..=100.0).contains(&self.random_pct) {
            return fail("backup: change_pct and random_pct are percentages (0-100)");
        }
        self.methods().map(|_| ())
    }

    pub(crate) fn generator_key(&self) -> String {
        format!(
            "backup v{GENERATOR_VERSION} tree_mb={} files={} random_pct={} seed={}",
            self.tree_mb, self.files, self.random_pct, self.seed
        )
    }

    pub(crate) fn cache_dir(&self) -> PathBuf {
        if self.source_dir.is_empty() {
            PathBuf::from(format!(
                "{CACHE_ROOT}/backup-{:016x}",
                fnv64(self.generator_key().as_bytes())
            ))
        } else {
            PathBuf::from(&self.source_dir)
        }
    }
}

pub fn workload(tier: Tier, overrides: &Overrides) -> Result<Box<dyn Workload>> {
    let params = apply_overrides(Params::for_tier(tier), overrides)?;
    params.check()?;
    Ok(Box::new(Backup { params }))
}

pub struct Backup {
    pub params: Params,
}

impl Workload for Backup {
    fn name(&self) -> &'static str {
        "backup"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or_default()
    }

    fn min_fs_bytes(&self) -> Option<u64> {
        // The tree once, plus the files each day changes copied whole (the
        // hard-link method's worst case), with some room.
        let p = &self.params;
        let tree = p.tree_mb * MB;
        let daily = tree * p.change_pct / 100.0;
        let per_method = tree * 1.2 + daily * p.days as f64;
        let methods = if p.keep { 2.0 } else { 1.0 };
        Some((per_method * methods * 1.3) as u64 + (64 << 20))
    }

    fn run(&self, env: &RunEnv) -> Result<RunOutput> {
        run(&self.params, env)
    }
}

// ---------------------------------------------------------------------------
// The tree and its daily changes.

const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "backup", "report", "file",
    "data", "server", "invoice", "customer", "project", "meeting", "budget", "quarter", "total",
    "amount", "status", "pending", "approved", "review", "draft", "final", "version", "change",
    "request", "order", "account", "balance", "payment", "schedule", "update", "summary", "monday",
    "tuesday", "january", "february", "north", "south", "system", "network", "disk",
];

const TEXT_EXT: &[&str] = &["txt", "md", "csv", "c", "h", "html", "json", "xml", "conf"];
const RANDOM_EXT: &[&str] = &["jpg", "png", "gz", "zip", "bin", "pdf"];
const DIR_NAMES: &[&str] = &[
    "docs", "src", "photos", "mail", "projects", "archive", "music", "work", "notes", "config",
    "reports", "tmp", "lib", "share", "old", "misc",
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Text,
    Random,
    Log,
}

fn kind_of(path: &str) -> Kind {
    match path.rsplit_once('.').map(|(_, e)| e) {
        Some("log") => Kind::Log,
        Some(e) if RANDOM_EXT.contains(&e) => Kind::Random,
        _ => Kind::Text,
    }
}

/// `len` bytes of content of a kind: words (skewed towards the common ones,
/// so it compresses about like prose), random bytes, or log lines.
fn content(rng: &mut StdRng, kind: Kind, len: usize, day: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 128);
    match kind {
        Kind::Random => {
            out.resize(len, 0);
            rng.fill_bytes(&mut out);
        }
        Kind::Text => {
            let mut col = 0;
            while out.len() < len {
                let u: f64 = rng.gen();
                let w = WORDS[((u * u) * WORDS.len() as f64) as usize % WORDS.len()];
                out.extend_from_slice(w.as_bytes());
                col += w.len() + 1;
                if col > 72 {
                    out.push(b'\n');
                    col = 0;
                } else {
                    out.push(b' ');
                }
            }
            out.truncate(len);
        }
        Kind::Log => {
            while out.len() < len {
                out.extend_from_slice(&log_line(rng, day));
            }
            out.truncate(len);
        }
    }
    out
}

fn log_line(rng: &mut StdRng, day: u32) -> Vec<u8> {
    let t = EPOCH + day as u64 * DAY + rng.gen_range(0..DAY);
    let procs = ["sshd", "cron", "kernel", "backupd", "nginx", "postfix"];
    let mut line = format!(
        "{} {:02}:{:02}:{:02} host {}[{}]:",
        t / DAY,
        (t % DAY) / 3600,
        (t % 3600) / 60,
        t % 60,
        procs[rng.gen_range(0..procs.len())],
        rng.gen_range(100..30000)
    );
    for _ in 0..rng.gen_range(4..12) {
        line.push(' ');
        line.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
    }
    line.push('\n');
    line.into_bytes()
}

fn set_mtime(path: &Path, secs: u64) -> Result<()> {
    let f = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .ctx(|| format!("open {}", path.display()))?;
    f.set_modified(UNIX_EPOCH + Duration::from_secs(secs))
        .ctx(|| format!("set mtime of {}", path.display()))
}

fn write_file(path: &Path, data: &[u8], mode: u32, mtime: u64) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).ctx(|| format!("mkdir {}", parent.display()))?;
    }
    fs::write(path, data).ctx(|| format!("write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .ctx(|| format!("chmod {}", path.display()))?;
    set_mtime(path, mtime)
}

/// File sizes: log-normal, scaled so that they add up to `total`.
fn sizes(rng: &mut StdRng, n: usize, total: f64) -> Vec<usize> {
    let dist = LogNormal::new(0.0, 1.5).unwrap_or_else(|_| unreachable!("valid parameters"));
    let w: Vec<f64> = (0..n).map(|_| dist.sample(rng)).collect();
    let sum: f64 = w.iter().sum();
    w.iter()
        .map(|x| ((x / sum * total) as usize).max(16))
        .collect()
}

fn random_ext(rng: &mut StdRng, kind: Kind) -> &'static str {
    match kind {
        Kind::Text => TEXT_EXT[rng.gen_range(0..TEXT_EXT.len())],
        Kind::Random => RANDOM_EXT[rng.gen_range(0..RANDOM_EXT.len())],
        Kind::Log => "log",
    }
}

/// Writes the day-1 tree into the new directory `root`.
pub fn generate_tree(p: &Params, root: &Path) -> Result<()> {
    p.check()?;
    let mut rng = StdRng::seed_from_u64(p.seed ^ 0x6261_636b_7570_0001);
    let n = p.files as usize;
    // Nested directories: each under the root or under an earlier one.
    let ndirs = (n / 16).max(1);
    let mut dirs: Vec<String> = vec![String::new()];
    for i in 1..ndirs {
        let parent = dirs[rng.gen_range(0..dirs.len())].clone();
        let depth = parent.matches('/').count();
        let parent = if depth >= 4 { String::new() } else { parent };
        let name = format!("{}{i}", DIR_NAMES[rng.gen_range(0..DIR_NAMES.len())]);
        dirs.push(if parent.is_empty() {
            name
        } else {
            format!("{parent}/{name}")
        });
    }
    fs::create_dir_all(root).ctx(|| format!("mkdir {}", root.display()))?;
    let logs = (n / 50).max(1);
    let sz = sizes(&mut rng, n, p.tree_mb * MB);
    for (i, size) in sz.into_iter().enumerate() {
        let kind = if i < logs {
            Kind::Log
        } else if rng.gen_bool(p.random_pct / 100.0) {
            Kind::Random
        } else {
            Kind::Text
        };
        let dir = &dirs[rng.gen_range(0..dirs.len())];
        let ext = random_ext(&mut rng, kind);
        let word = DIR_NAMES[rng.gen_range(0..DIR_NAMES.len())];
        let rel = if dir.is_empty() {
            format!("{word}-{i}.{ext}")
        } else {
            format!("{dir}/{word}-{i}.{ext}")
        };
        let mode = if kind == Kind::Text && rng.gen_bool(0.05) {
            0o755
        } else if rng.gen_bool(0.1) {
            0o600
        } else {
            0o644
        };
        let data = content(&mut rng, kind, size, 0);
        write_file(&root.join(rel), &data, mode, EPOCH + i as u64)?;
    }
    // Directories that got no file still exist, as in real trees.
    for d in &dirs {
        fs::create_dir_all(root.join(d)).ctx(|| format!("mkdir {d}"))?;
    }
    Ok(())
}

/// Relative paths of the files under `root`, sorted.
fn file_list(root: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).ctx(|| format!("read {}", d.display()))? {
            let e = e.ctx(|| format!("read {}", d.display()))?;
            let ft = e
                .file_type()
                .ctx(|| format!("stat {}", e.path().display()))?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if let Ok(rel) = e.path().strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

fn dir_list(root: &Path) -> Result<Vec<String>> {
    let mut out = vec![String::new()];
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).ctx(|| format!("read {}", d.display()))? {
            let e = e.ctx(|| format!("read {}", d.display()))?;
            if e.file_type().ctx(|| "stat".into())?.is_dir() {
                if let Ok(rel) = e.path().strip_prefix(root) {
                    out.push(rel.to_string_lossy().into_owned());
                }
                stack.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// What one day's mutation did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Changes {
    pub modified: u64,
    pub added: u64,
    pub deleted: u64,
    pub renamed: u64,
    pub appended: u64,
}

impl Changes {
    pub(crate) fn total(&self) -> u64 {
        self.modified + self.added + self.deleted + self.renamed + self.appended
    }
}

/// Applies day `day`'s changes (day >= 2) to the tree at `root`.
pub fn mutate(p: &Params, root: &Path, day: u32) -> Result<Changes> {
    let mut rng = StdRng::seed_from_u64(p.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ day as u64);
    let mut files = file_list(root)?;
    let dirs = dir_list(root)?;
    let mut ch = Changes::default();
    let mut stamp = 0u64;
    let mut touch = |path: &Path| -> Result<()> {
        stamp += 1;
        set_mtime(path, EPOCH + day as u64 * DAY + stamp)
    };

    // Logs grow every day.
    for f in files.iter().filter(|f| kind_of(f) == Kind::Log) {
        let path = root.join(f);
        let mut text = Vec::new();
        for _ in 0..rng.gen_range(1..40) {
            text.extend_from_slice(&log_line(&mut rng, day));
        }
        fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .and_then(|mut fh| fh.write_all(&text))
            .ctx(|| format!("append to {}", path.display()))?;
        touch(&path)?;
        ch.appended += 1;
    }
    files.retain(|f| kind_of(f) != Kind::Log);
    files.shuffle(&mut rng);

    let budget = ((files.len() as f64 * p.change_pct / 100.0).round() as usize).max(1);
    let share = |pct: usize| (budget * pct + 50) / 100;
    let n_mod = share(55).max(1).min(files.len());
    let n_add = share(20);
    let n_del = share(12).min(files.len() - n_mod);
    let n_ren = share(13).min(files.len() - n_mod - n_del);
    let mean = (p.tree_mb * MB / p.files as f64).max(64.0);

    let mut iter = files.iter();
    for f in iter.by_ref().take(n_mod) {
        let path = root.join(f);
        let kind = kind_of(f);
        let size = fs::metadata(&path)
            .ctx(|| format!("stat {}", path.display()))?
            .len() as usize;
        if size > 0 && rng.gen_bool(0.7) {
            // Overwrite a region in place, size unchanged.
            let len = rng.gen_range(1024..=65536).min(size);
            let off = rng.gen_range(0..=size - len);
            let data = content(&mut rng, kind, len, day);
            let mut fh = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .ctx(|| format!("open {}", path.display()))?;
            fh.seek(SeekFrom::Start(off as u64))
                .and_then(|_| fh.write_all(&data))
                .ctx(|| format!("write {}", path.display()))?;
        } else {
            // Rewrite at a new size.
            let new = ((size as f64 * rng.gen_range(0.8..1.25)) as usize).max(16);
            let data = content(&mut rng, kind, new, day);
            fs::write(&path, data).ctx(|| format!("write {}", path.display()))?;
        }
        touch(&path)?;
        ch.modified += 1;
    }
    for f in iter.by_ref().take(n_del) {
        let path = root.join(f);
        fs::remove_file(&path).ctx(|| format!("remove {}", path.display()))?;
        ch.deleted += 1;
    }
    for f in iter.by_ref().take(n_ren) {
        let from = root.join(f);
        let dir = &dirs[rng.gen_range(0..dirs.len())];
        let name = Path::new(f)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let to = root.join(dir).join(format!("r{day}-{name}"));
        fs::rename(&from, &to).ctx(|| format!("rename {} to {}", from.display(), to.display()))?;
        ch.renamed += 1;
    }
    for k in 0..n_add {
        let mut dir = dirs[rng.gen_range(0..dirs.len())].clone();
        if rng.gen_bool(0.2) {
            let sub = format!("new{day}-{k}");
            dir = if dir.is_empty() {
                sub
            } else {
                format!("{dir}/{sub}")
            };
        }
        let kind = if rng.gen_bool(p.random_pct / 100.0) {
            Kind::Random
        } else {
            Kind::Text
        };
        let ext = random_ext(&mut rng, kind);
        let size = (mean * LogNormal::new(-1.0, 1.5).map_or(1.0, |d| d.sample(&mut rng))) as usize;
        let data = content(&mut rng, kind, size.max(16), day);
        let path = root.join(dir).join(format!("day{day}-{k}.{ext}"));
        stamp += 1;
        write_file(&path, &data, 0o644, EPOCH + day as u64 * DAY + stamp)?;
        ch.added += 1;
    }
    Ok(ch)
}

/// One file of a manifest: mode, size and content hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub mode: u32,
    pub size: u64,
    pub hash: u64,
}

pub type Manifest = BTreeMap<String, Entry>;

/// 64-bit hash of a file's content, 8 bytes at a time.
fn hash_file(path: &Path, buf: &mut [u8]) -> Result<u64> {
    let mut f = fs::File::open(path).ctx(|| format!("open {}", path.display()))?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = f.read(buf).ctx(|| format!("read {}", path.display()))?;
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
        let whole = pending.len() / 8 * 8;
        for c in pending[..whole].chunks_exact(8) {
            let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            h = (h ^ w).wrapping_mul(0x0100_0000_01b3).rotate_left(29);
        }
        pending.drain(..whole);
    }
    for &b in &pending {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    Ok(h)
}

pub fn manifest(root: &Path) -> Result<Manifest> {
    let mut buf = vec![0u8; 256 << 10];
    let mut out = Manifest::new();
    for rel in file_list(root)? {
        let path = root.join(&rel);
        let m = fs::symlink_metadata(&path).ctx(|| format!("stat {}", path.display()))?;
        let hash = hash_file(&path, &mut buf)?;
        out.insert(
            rel,
            Entry {
                mode: m.mode() & 0o7777,
                size: m.len(),
                hash,
            },
        );
    }
    Ok(out)
}

/// Compares a copy with the manifest it should have; the error names the
/// first difference.
pub(crate) fn verify(what: &str, copy: &Path, want: &Manifest) -> Result<()> {
    let got = manifest(copy)?;
    if got == *want {
        return Ok(());
    }
    let missing = want.keys().find(|k| !got.contains_key(*k));
    let extra = got.keys().find(|k| !want.contains_key(*k));
    let differs = want
        .iter()
        .find(|(k, v)| got.get(*k).is_some_and(|g| g != *v))
        .map(|(k, _)| k);
    fail(format!(
        "{what} ({}) differs from the source: {} files instead of {}{}{}{}",
        copy.display(),
        got.len(),
        want.len(),
        missing.map_or(String::new(), |k| format!(", missing {k}")),
        extra.map_or(String::new(), |k| format!(", extra {k}")),
        differs.map_or(String::new(), |k| format!(", {k} differs")),
    ))
}

// ---------------------------------------------------------------------------
// The run.

/// The private working copy of the source, removed when dropped.
pub(crate) struct DayState(pub(crate) PathBuf);

impl DayState {
    pub(crate) fn fresh(cache: &Path, tree: &Path) -> Result<DayState> {
        // Remove working copies left by runs that died.
        if let Ok(rd) = fs::read_dir(cache) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(rest) = name.strip_prefix("day-state.") {
                    let pid = rest.split('.').next().unwrap_or("");
                    if !Path::new(&format!("/proc/{pid}")).exists() {
                        let _ = fs::remove_dir_all(e.path());
                    }
                }
            }
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let path = cache.join(format!("day-state.{}.{nanos}", std::process::id()));
        let state = DayState(path);
        run_checked(Command::new("cp").arg("-a").arg(tree).arg(&state.0))?;
        Ok(state)
    }
}

impl Drop for DayState {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One day of one method.
struct Day {
    phase: Phase,
    used: u64,
    changes: Changes,
    /// The off-site send of the day's snapshot and the receiver's growth.
    offsite: Option<(Sent, u64)>,
}

enum Outcome {
    Done(Vec<Day>),
    Unsupported,
}

fn with_slash(p: &Path) -> String {
    format!("{}/", p.display())
}

pub(crate) fn rsync(args: &[&str], src: &Path, dst: &Path) -> Result<()> {
    run_checked(
        Command::new("rsync")
            .args(args)
            .arg(with_slash(src))
            .arg(with_slash(dst)),
    )
    .map(|_| ())
}

/// Where the day-1 snapshot of `DIR/snap/current` can be read, if known.
fn day1_snapshot_path(env: &RunEnv, dir: &Path) -> Option<PathBuf> {
    let current = dir.join("snap/current");
    let mut candidates = vec![
        dir.join(".snapshots/day-01"),
        current.join(".zfs/snapshot/day-01"),
    ];
    if env.fs_type.contains("anvil") {
        // The mount point: the topmost ancestor on the same device.
        let dev = fs::metadata(dir).ok()?.dev();
        let mut mount = dir.to_path_buf();
        while let Some(parent) = mount.parent() {
            match fs::metadata(parent) {
                Ok(m) if m.dev() == dev => mount = parent.to_path_buf(),
                _ => break,
            }
        }
        if let Ok(rel) = current.strip_prefix(&mount) {
            candidates.push(mount.join(".snapshots/day-01").join(rel));
        }
    }
    candidates.into_iter().find(|p| p.is_dir())
}

struct Ctx<'a> {
    p: &'a Params,
    env: &'a RunEnv<'a>,
    dir: &'a Path,
    cache: &'a Path,
    tree: &'a Path,
    day1: &'a Manifest,
    notes: &'a mut Vec<String>,
}

fn used(env: &RunEnv) -> Result<u64> {
    env.probe.sync()?;
    env.probe.used_bytes()
}

fn run_method(c: &mut Ctx, method: &str) -> Result<Outcome> {
    let (p, env, dir) = (c.p, c.env, c.dir);
    let state = DayState::fresh(c.cache, c.tree)?;
    let src = state.0.clone();
    let links = dir.join("links");
    let current = dir.join("snap/current");
    if method == "hardlink" {
        fs::create_dir(&links).ctx(|| format!("mkdir {}", links.display()))?;
    } else {
        let snap = dir.join("snap");
        fs::create_dir(&snap).ctx(|| format!("mkdir {}", snap.display()))?;
        env.probe.make_snapshot_root("snap/current")?;
    }
    let replica = match method == "snapshot" && p.offsite {
        true => {
            env.progress
                .set_message("backup: making the off-site receiver");
            let r = env.probe.make_replica("snap/current")?;
            if r.is_none() {
                c.notes.push(format!(
                    "offsite: unsupported on {} ({})",
                    env.fs_label, env.fs_type
                ));
            }
            r
        }
        false => None,
    };
    let replica_base = match &replica {
        Some(r) => {
            r.sync()?;
            r.used_bytes()?
        }
        None => 0,
    };
    env.probe.drop_caches()?;
    let base = used(env)?;
    let mut days = Vec::new();
    for day in 1..=p.days {
        env.progress
            .set_message(format!("backup: {method} day {day}/{}", p.days));
        let changes = if day > 1 {
            mutate(p, &src, day)?
        } else {
            Changes::default()
        };
        let logical = tree_bytes(&src)?.1;
        let name = format!("day-{day:02}");
        let (supported, mut phase) = env.phase(&format!("{method}/{name}"), || {
            if method == "hardlink" {
                let dst = links.join(&name);
                if day == 1 {
                    rsync(&["-a", "--delete"], &src, &dst)?;
                } else {
                    let link = format!("--link-dest=../day-{:02}", day - 1);
                    rsync(&["-a", "--delete", &link], &src, &dst)?;
                }
                Ok(true)
            } else {
                rsync(&["-a", "--delete", "--inplace"], &src, &current)?;
                env.probe.snapshot("snap/current", &name)
            }
        })?;
        if !supported {
            c.notes.push(format!(
                "snapshot: unsupported on {} ({}): no snapshots",
                env.fs_label, env.fs_type
            ));
            let _ = run_checked(Command::new("rm").arg("-rf").arg(dir.join("snap")));
            env.progress.inc((p.days - day + 1) as u64);
            return Ok(Outcome::Unsupported);
        }
        let now = used(env)?;
        let grown = now.saturating_sub(base);
        phase.logical_bytes = Some(logical);
        phase.physical_bytes = Some(grown);
        let offsite = match &replica {
            Some(r) => {
                r.sync()?;
                let prev = (day > 1).then(|| format!("day-{:02}", day - 1));
                let sent = send_snapshot(env, r.as_ref(), &name, prev.as_deref(), false)?;
                r.sync()?;
                let held = r.used_bytes()?.saturating_sub(replica_base);
                Some((sent, held))
            }
            None => None,
        };
        days.push(Day {
            phase,
            used: grown,
            changes,
            offsite,
        });
        env.progress.inc(1);
    }

    // Verification, outside the timing.
    env.progress
        .set_message(format!("backup: {method}: verifying"));
    let last = manifest(&src)?;
    if method == "hardlink" {
        let last_copy = links.join(format!("day-{:02}", p.days));
        verify("the last hard-link copy", &last_copy, &last)?;
        verify("links/day-01", &links.join("day-01"), c.day1)?;
        c.notes
            .push("hardlink: last day and day 1 verified".to_string());
        if !p.keep {
            run_checked(Command::new("rm").arg("-rf").arg(&links))?;
        }
    } else {
        verify("snap/current", &current, &last)?;
        if let Some(r) = replica {
            let name = format!("day-{:02}", p.days);
            match r.snapshot_dir(&name, true) {
                Some(path) => {
                    verify("the off-site copy of the last day", &path, &last)?;
                    c.notes.push(format!(
                        "offsite: {name} on the receiver ({}) verified",
                        path.display()
                    ));
                }
                None => c.notes.push(format!(
                    "offsite: {name} on the receiver not verified (path unknown on {})",
                    env.fs_type
                )),
            }
            r.teardown()?;
        }
        match day1_snapshot_path(env, dir) {
            Some(path) => {
                verify("the day-01 snapshot", &path, c.day1)?;
                c.notes.push(format!(
                    "snapshot: last day and day-01 snapshot ({}) verified",
                    path.display()
                ));
            }
            None => c.notes.push(format!(
                "snapshot: last day verified; day-01 snapshot not verified (path unknown on {})",
                env.fs_type
            )),
        }
    }
    Ok(Outcome::Done(days))
}

fn run(p: &Params, env: &RunEnv) -> Result<RunOutput> {
    let dir = env.posix_dir("backup")?.to_path_buf();
    require_tools(
        "backup",
        &[("rsync", "rsync"), ("cp", "coreutils"), ("rm", "coreutils")],
    )?;
    let methods = p.methods()?;
    let cache = p.cache_dir();
    check_outside("backup", &cache, &dir)?;
    env.progress
        .set_message("backup: generating the source tree");
    let tree = cached_tree(&cache, &p.generator_key(), |root| generate_tree(p, root))?;
    let (src_files, src_bytes) = tree_bytes(&tree)?;
    let day1 = manifest(&tree)?;
    env.progress
        .set_length(p.days as u64 * methods.len() as u64);
    env.progress.set_position(0);

    let mut notes = Vec::new();
    let mut results: Vec<(&str, Option<Vec<Day>>)> = Vec::new();
    for m in &methods {
        let mut c = Ctx {
            p,
            env,
            dir: &dir,
            cache: &cache,
            tree: &tree,
            day1: &day1,
            notes: &mut notes,
        };
        match run_method(&mut c, m)? {
            Outcome::Done(days) => results.push((m, Some(days))),
            Outcome::Unsupported => results.push((m, None)),
        }
    }

    let mut out = RunOutput::default();
    out.metrics
        .push(Metric::lower("source_mb", "MB", src_bytes as f64 / MB));
    let mut summary = serde_json::Map::new();
    for (m, days) in &results {
        let Some(days) = days else {
            summary.insert(m.to_string(), serde_json::json!({"supported": false}));
            continue;
        };
        let total: f64 = days.iter().map(|d| d.phase.wall_s).sum();
        let mean = total / days.len().max(1) as f64;
        let incr: Vec<f64> = days.iter().skip(1).map(|d| d.phase.wall_s).collect();
        let mean_incr = if incr.is_empty() {
            None
        } else {
            Some(incr.iter().sum::<f64>() / incr.len() as f64)
        };
        let final_mb = days.last().map_or(0.0, |d| d.used as f64 / MB);
        out.metrics
            .push(Metric::lower(format!("{m}_total_s"), "s", total));
        out.metrics
            .push(Metric::lower(format!("{m}_mean_day_s"), "s", mean));
        out.metrics
            .push(Metric::lower(format!("{m}_final_used_mb"), "MB", final_mb));
        let sent: Vec<(&Sent, u64)> = days
            .iter()
            .filter_map(|d| d.offsite.as_ref().map(|(s, u)| (s, *u)))
            .collect();
        if let Some(((first, _), (_, held))) = sent.first().zip(sent.last()) {
            out.metrics
                .push(Metric::lower("offsite_full_s", "s", first.wall_s));
            let incr: Vec<f64> = sent.iter().skip(1).map(|(s, _)| s.wall_s).collect();
            if !incr.is_empty() {
                out.metrics.push(Metric::lower(
                    "offsite_incr_median_s",
                    "s",
                    crate::results::median(&incr),
                ));
            }
            let wire: u64 = sent.iter().map(|(s, _)| s.wire_bytes).sum();
            out.metrics.push(Metric::lower(
                "offsite_wire_total_mb",
                "MB",
                wire as f64 / MB,
            ));
            out.metrics
                .push(Metric::lower("offsite_used_mb", "MB", *held as f64 / MB));
            out.series.push(Series {
                name: "offsite_wire_mb".into(),
                x_label: "day".into(),
                y_label: "MB on the wire".into(),
                points: sent
                    .iter()
                    .enumerate()
                    .map(|(i, (s, _))| ((i + 1) as f64, s.wire_bytes as f64 / MB))
                    .collect(),
            });
        }
        out.series.push(Series {
            name: format!("{m}_used_mb"),
            x_label: "day".into(),
            y_label: "MB used".into(),
            points: days
                .iter()
                .enumerate()
                .map(|(i, d)| ((i + 1) as f64, d.used as f64 / MB))
                .collect(),
        });
        out.series.push(Series {
            name: format!("{m}_day_s"),
            x_label: "day".into(),
            y_label: "s".into(),
            points: days
                .iter()
                .enumerate()
                .map(|(i, d)| ((i + 1) as f64, d.phase.wall_s))
                .collect(),
        });
        out.phases.extend(days.iter().map(|d| d.phase.clone()));
        summary.insert(
            m.to_string(),
            serde_json::json!({
                "supported": true,
                "mean_incremental_day_s": mean_incr,
                "used_bytes": days.iter().map(|d| d.used).collect::<Vec<_>>(),
                "offsite": days.iter().filter_map(|d| d.offsite.as_ref()).map(|(s, used)| {
                    serde_json::json!({"sent": s, "receiver_used_bytes": used})
                }).collect::<Vec<_>>(),
            }),
        );
    }
    let changes: Vec<Changes> = results
        .iter()
        .find_map(|(_, d)| d.as_ref())
        .map(|d| d.iter().map(|d| d.changes).collect())
        .unwrap_or_default();
    out.text = text_report(p, env, src_files, src_bytes, &results);
    out.extra = serde_json::json!({
        "source_dir": tree.display().to_string(),
        "source_files": src_files,
        "source_bytes": src_bytes,
        "methods": summary,
        "daily_changes": changes,
        "notes": notes,
    });
    Ok(out)
}

fn text_report(
    p: &Params,
    env: &RunEnv,
    files: u64,
    bytes: u64,
    results: &[(&str, Option<Vec<Day>>)],
) -> String {
    let mut s = format!(
        "backup: {} days of a {:.1} MB tree ({} files), about {}% of the files changing daily, on {}\n",
        p.days,
        bytes as f64 / MB,
        files,
        p.change_pct,
        env.fs_label
    );
    for (m, d) in results {
        if d.is_none() {
            let _ = writeln!(s, "{m}: unsupported on this file system");
        }
    }
    let done: Vec<(&str, &Vec<Day>)> = results
        .iter()
        .filter_map(|(m, d)| d.as_ref().map(|d| (*m, d)))
        .collect();
    if done.is_empty() {
        return s;
    }
    let _ = write!(s, "{:>4} {:>8}", "day", "changes");
    for (m, _) in &done {
        let _ = write!(
            s,
            " {:>12} {:>10} {:>14}",
            format!("{m} s"),
            "MB written",
            "MB used"
        );
    }
    s.push('\n');
    for day in 0..p.days as usize {
        let changes = done[0].1.get(day).map_or(0, |d| d.changes.total());
        let _ = write!(s, "{:>4} {:>8}", day + 1, changes);
        for (_, days) in &done {
            match days.get(day) {
                Some(d) => {
                    let _ = write!(
                        s,
                        " {:>12.3} {:>10.1} {:>14.1}",
                        d.phase.wall_s,
                        d.phase.io.bytes_written() as f64 / MB,
                        d.used as f64 / MB
                    );
                }
                None => {
                    let _ = write!(s, " {:>12} {:>10} {:>14}", "-", "-", "-");
                }
            }
        }
        s.push('\n');
    }
    for (m, days) in &done {
        let total: f64 = days.iter().map(|d| d.phase.wall_s).sum();
        let _ = writeln!(
            s,
            "{m}: total {:.2} s, mean {:.3} s/day, final used {:.1} MB",
            total,
            total / days.len().max(1) as f64,
            days.last().map_or(0.0, |d| d.used as f64 / MB)
        );
        let sent: Vec<&(Sent, u64)> = days.iter().filter_map(|d| d.offsite.as_ref()).collect();
        if let Some((first, _)) = sent.first() {
            let incr: Vec<f64> = sent.iter().skip(1).map(|(s, _)| s.wall_s).collect();
            let _ = writeln!(
                s,
                "{m} off-site: full send {:.3} s and {:.1} MB, incremental median {} s, {:.1} MB on the wire in all, receiver used {:.1} MB ({})",
                first.wall_s,
                first.wire_bytes as f64 / MB,
                if incr.is_empty() { "-".to_string() } else { format!("{:.3}", crate::results::median(&incr)) },
                sent.iter().map(|(s, _)| s.wire_bytes).sum::<u64>() as f64 / MB,
                sent.last().map_or(0.0, |(_, u)| *u as f64 / MB),
                first.command
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::with_env;

    fn tiny(cache: &Path) -> Params {
        Params {
            source_dir: cache.join("backup").display().to_string(),
            keep: true,
            ..Params::for_tier(Tier::Tiny)
        }
    }

    #[test]
    fn backup_generator_and_mutation_are_deterministic() {
        let t = tempfile::TempDir::new().unwrap();
        let p = Params::for_tier(Tier::Tiny);
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        generate_tree(&p, &a).unwrap();
        generate_tree(&p, &b).unwrap();
        assert_eq!(manifest(&a).unwrap(), manifest(&b).unwrap());
        let day1 = manifest(&a).unwrap();
        assert_eq!(day1.len(), p.files as usize);
        let total: u64 = day1.values().map(|e| e.size).sum();
        assert!(
            (total as f64 - p.tree_mb * MB).abs() < 0.05 * p.tree_mb * MB,
            "{total}"
        );
        for day in 2..=3 {
            let ca = mutate(&p, &a, day).unwrap();
            let cb = mutate(&p, &b, day).unwrap();
            assert_eq!(ca, cb);
            assert!(ca.modified > 0 && ca.appended > 0 && ca.added > 0, "{ca:?}");
            assert!(ca.deleted > 0 && ca.renamed > 0, "{ca:?}");
        }
        let after = manifest(&a).unwrap();
        assert_eq!(after, manifest(&b).unwrap());
        assert_ne!(after, day1);
        let c = t.path().join("c");
        generate_tree(&Params { seed: 9, ..p }, &c).unwrap();
        assert_ne!(manifest(&c).unwrap(), day1);
    }

    #[test]
    fn backup_tiny_runs_hardlinks_and_records_snapshots_unsupported() {
        let cache = tempfile::TempDir::new().unwrap();
        let work = tempfile::TempDir::new().unwrap();
        let p = tiny(cache.path());
        let out = with_env(work.path(), |env| run(&p, env)).unwrap();
        assert_eq!(out.errors, 0);
        let names: Vec<&str> = out.metrics.iter().map(|m| m.name.as_str()).collect();
        for n in [
            "source_mb",
            "hardlink_total_s",
            "hardlink_mean_day_s",
            "hardlink_final_used_mb",
        ] {
            assert!(names.contains(&n), "missing {n} in {names:?}");
        }
        assert!(
            !names.iter().any(|n| n.starts_with("snapshot_")),
            "{names:?}"
        );
        assert_eq!(out.extra["methods"]["snapshot"]["supported"], false);
        assert!(out.text.contains("snapshot: unsupported"), "{}", out.text);
        let used = out
            .series
            .iter()
            .find(|s| s.name == "hardlink_used_mb")
            .unwrap();
        assert_eq!(used.points.len(), p.days as usize);
        assert_eq!(out.phases.len(), p.days as usize);
        assert!(!work.path().join("snap").exists());

        // Day 1 of the backup is the generated day-1 tree.
        let links = work.path().join("links");
        let tree = cache.path().join("backup/tree");
        assert_eq!(
            manifest(&links.join("day-01")).unwrap(),
            manifest(&tree).unwrap()
        );
        // Unchanged files are shared between days.
        let day1 = manifest(&links.join("day-01")).unwrap();
        let last = manifest(&links.join(format!("day-{:02}", p.days))).unwrap();
        let same: Vec<&String> = day1
            .iter()
            .filter(|(k, v)| last.get(*k) == Some(*v))
            .map(|(k, _)| k)
            .collect();
        assert!(!same.is_empty());
        for f in &same {
            let a = fs::metadata(links.join("day-01").join(f)).unwrap();
            let b = fs::metadata(links.join(format!("day-{:02}", p.days)).join(f)).unwrap();
            assert_eq!(a.ino(), b.ino(), "{f}");
            assert!(a.nlink() > 1, "{f}");
        }
        // Changed files are not.
        assert!(day1
            .iter()
            .any(|(k, v)| last.get(k).is_some_and(|l| l != v)));
        // The working copy of the source is gone.
        let left: Vec<_> = fs::read_dir(cache.path().join("backup"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("day-state"))
            .collect();
        assert!(left.is_empty());
    }

    #[test]
    fn backup_offsite_without_snapshots_is_noted() {
        let cache = tempfile::TempDir::new().unwrap();
        let work = tempfile::TempDir::new().unwrap();
        let p = Params {
            methods: "snapshot".into(),
            offsite: true,
            ..tiny(cache.path())
        };
        let out = with_env(work.path(), |env| run(&p, env)).unwrap();
        let notes = out.extra["notes"].to_string();
        assert!(notes.contains("offsite: unsupported"), "{notes}");
        assert!(!out.metrics.iter().any(|m| m.name.starts_with("offsite")));
        // Older results have no `offsite`: it reads as false.
        let mut v = serde_json::to_value(Params::for_tier(Tier::Tiny)).unwrap();
        v.as_object_mut().unwrap().remove("offsite");
        let old: Params = serde_json::from_value(v).unwrap();
        assert!(!old.offsite);
    }

    #[test]
    fn backup_params_methods() {
        let ov = vec![("methods".to_string(), "hardlink".to_string())];
        let w = workload(Tier::Tiny, &ov).unwrap();
        assert_eq!(w.params()["methods"], "hardlink");
        let ov = vec![("methods".to_string(), "snapshot, bogus".to_string())];
        assert!(workload(Tier::Tiny, &ov).is_err());
        let p = Params {
            methods: "snapshot,hardlink".into(),
            ..Params::for_tier(Tier::Tiny)
        };
        assert_eq!(p.methods().unwrap(), ["hardlink", "snapshot"]);
    }
}
