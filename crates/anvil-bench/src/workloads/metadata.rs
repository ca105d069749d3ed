//! `metadata`: a storm of small-file metadata operations.
//!
//! For each thread count T of `threads`, one round in its own directory
//! `t<T>` runs these phases, each timed as a whole (ops/s = files / seconds):
//!
//! 1. `create`: open(O_CREAT|O_TRUNC|O_WRONLY), write `file_bytes`, close;
//! 2. `stat`: stat every file, right after creating it (warm caches);
//! 3. `stat_cold` (with `cold_stat`): the same after `drop_caches`;
//! 4. `rename`: every file renamed within its directory (`f…` to `r…`);
//! 5. `unlink`: every file removed.
//!
//! The `files` of a round are spread over `dirs` directories (0: one per
//! thread); file k belongs to thread k mod T and directory k mod dirs, so
//! that with `dirs` a multiple of T each thread works in its own
//! directories. Files are created in name order; stat, rename and unlink go
//! through each thread's files in a seeded random order (`shuffle`). Paths
//! and orders are prepared before the timed phases.
//!
//! Everything goes through `env.vfs`, so the workload also runs in-process on
//! anvil (`anvil-lib`). Failed operations are counted (`errors`) and the run
//! goes on. [`overhead_pair`] compares this code with a bare libc loop doing
//! the same system calls.

use std::ffi::CString;
use std::path::Path;
use std::time::Instant;

use indicatif::ProgressBar;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngCore, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::env::{IoCounters, Metric, Phase, Probe, RunEnv, RunOutput, Series};
use crate::error::{fail, Context, Result};
use crate::vfs::{PosixVfs, Vfs};
use crate::workloads::{apply_overrides, Overrides, Tier, Workload};

/// Parameters of the metadata workload (`--set key=value`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Files per round (one round per thread count), over all threads.
    pub files: u64,
    /// Bytes written into each file at creation (0: empty files).
    pub file_bytes: u64,
    /// Directories the files of a round are spread over (0: one per thread).
    pub dirs: u32,
    /// Thread counts, one round each.
    pub threads: Vec<u32>,
    /// Seed of the file contents and the orders (null: the run's seed).
    pub seed: Option<u64>,
    /// Also stat every file after dropping caches.
    pub cold_stat: bool,
    /// Stat, rename and unlink in a random order rather than creation order.
    pub shuffle: bool,
    /// Count directory entries after create and after unlink (untimed).
    pub check_counts: bool,
}

impl Params {
    pub fn for_tier(tier: Tier) -> Params {
        let (files, threads) = match tier {
            Tier::Tiny => (200, vec![1, 2]),
            Tier::Quick => (5_000, vec![1, 4]),
            Tier::Standard => (50_000, vec![1, 4]),
            Tier::Full => (500_000, vec![1, 4, 16]),
        };
        Params {
            files,
            file_bytes: 4096,
            dirs: 0,
            threads,
            seed: None,
            cold_stat: true,
            shuffle: true,
            check_counts: true,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.threads.is_empty() || self.threads.contains(&0) {
            return fail("metadata: threads must be a non-empty list of positive counts");
        }
        if self.file_bytes > 64 << 20 {
            return fail("metadata: file_bytes must be at most 64 MiB");
        }
        Ok(())
    }

    fn dirs_for(&self, threads: u32) -> u32 {
        match self.dirs {
            0 => threads,
            d => d,
        }
    }
}

/// Builds the metadata workload.
pub fn workload(tier: Tier, overrides: &Overrides) -> Result<Box<dyn Workload>> {
    let params = apply_overrides(Params::for_tier(tier), overrides)?;
    params.validate()?;
    Ok(Box::new(Metadata { params }))
}

struct Metadata {
    params: Params,
}

/// The timed operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Create,
    Stat,
    Rename,
    Unlink,
}

/// Phases of a round: (name, operation, drop caches first).
const PHASES: [(&str, Op, bool); 5] = [
    ("create", Op::Create, false),
    ("stat", Op::Stat, false),
    ("stat_cold", Op::Stat, true),
    ("rename", Op::Rename, false),
    ("unlink", Op::Unlink, false),
];

/// One thread's share of a round, prepared before the timing starts.
struct ThreadWork {
    /// Original names ("t4/d1/f0000005").
    names: Vec<String>,
    /// Names after the rename ("t4/d1/r0000005").
    renamed: Vec<String>,
    /// Index orders of the phases.
    stat_order: Vec<usize>,
    rename_order: Vec<usize>,
    unlink_order: Vec<usize>,
}

/// Directory of a round.
fn round_dir(threads: u32) -> String {
    format!("t{threads}")
}

fn dir_name(threads: u32, d: u32) -> String {
    format!("t{threads}/d{d}")
}

/// Paths and orders of a round with `threads` threads over `dirs` dirs.
fn prepare(files: u64, threads: u32, dirs: u32, shuffle: bool, seed: u64) -> Vec<ThreadWork> {
    (0..threads)
        .map(|t| {
            let mine: Vec<u64> = (t as u64..files).step_by(threads as usize).collect();
            let path = |prefix: char, k: u64| {
                format!(
                    "{}/{prefix}{k:07}",
                    dir_name(threads, (k % dirs as u64) as u32)
                )
            };
            let names = mine.iter().map(|&k| path('f', k)).collect();
            let renamed = mine.iter().map(|&k| path('r', k)).collect();
            let mut rng = StdRng::seed_from_u64(seed ^ ((threads as u64) << 32) ^ t as u64);
            let mut order = || {
                let mut v: Vec<usize> = (0..mine.len()).collect();
                if shuffle {
                    v.shuffle(&mut rng);
                }
                v
            };
            ThreadWork {
                stat_order: order(),
                rename_order: order(),
                unlink_order: order(),
                names,
                renamed,
            }
        })
        .collect()
}

/// Failed operations of a phase.
#[derive(Default)]
struct Failures {
    count: u64,
    first: Option<String>,
}

impl Failures {
    fn add(&mut self, what: &str, path: &str, err: impl std::fmt::Display) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(format!("{what} {path}: {err}"));
        }
    }

    fn merge(&mut self, o: Failures) {
        self.count += o.count;
        if self.first.is_none() {
            self.first = o.first;
        }
    }
}

/// One thread's part of a phase: the loop that is timed.
fn thread_phase(vfs: &dyn Vfs, op: Op, w: &ThreadWork, data: &[u8]) -> Failures {
    let mut f = Failures::default();
    match op {
        Op::Create => {
            for name in &w.names {
                match vfs.create(name, 0o644) {
                    Ok(mut file) => {
                        if !data.is_empty() {
                            if let Err(e) = file.write_all(data) {
                                f.add("write", name, e);
                            }
                        }
                    }
                    Err(e) => f.add("create", name, e),
                }
            }
        }
        Op::Stat => {
            for &i in &w.stat_order {
                match vfs.stat_size(&w.names[i]) {
                    Ok(n) if n == data.len() as u64 => {}
                    Ok(n) => f.add("stat", &w.names[i], format!("size {n}")),
                    Err(e) => f.add("stat", &w.names[i], e),
                }
            }
        }
        Op::Rename => {
            for &i in &w.rename_order {
                if let Err(e) = vfs.rename(&w.names[i], &w.renamed[i]) {
                    f.add("rename", &w.names[i], e);
                }
            }
        }
        Op::Unlink => {
            for &i in &w.unlink_order {
                if let Err(e) = vfs.unlink(&w.renamed[i]) {
                    f.add("unlink", &w.renamed[i], e);
                }
            }
        }
    }
    f
}

/// A phase over all threads (inline when there is one).
fn phase_all(vfs: &dyn Vfs, op: Op, work: &[ThreadWork], data: &[u8]) -> Failures {
    if let [only] = work {
        return thread_phase(vfs, op, only, data);
    }
    let mut total = Failures::default();
    std::thread::scope(|s| {
        let handles: Vec<_> = work
            .iter()
            .map(|w| s.spawn(move || thread_phase(vfs, op, w, data)))
            .collect();
        for h in handles {
            match h.join() {
                Ok(f) => total.merge(f),
                Err(_) => total.add("thread", "", "panicked"),
            }
        }
    });
    total
}

/// Results of one round.
struct Round {
    threads: u32,
    dirs: u32,
    /// (phase name, ops/s, Phase).
    phases: Vec<(&'static str, f64, Phase)>,
    failures: Failures,
}

/// Entries in the directories of a round (untimed check).
fn count_entries(vfs: &dyn Vfs, threads: u32, dirs: u32) -> Result<u64> {
    let mut n = 0;
    for d in 0..dirs {
        let path = dir_name(threads, d);
        n += vfs
            .read_dir(&path)
            .ctx(|| format!("metadata: read_dir {path}"))?
            .len() as u64;
    }
    Ok(n)
}

/// One round: `threads` threads through all phases; the round's directories
/// are made before and removed after, untimed.
fn round(env: &RunEnv, p: &Params, threads: u32, seed: u64) -> Result<Round> {
    let vfs = env.vfs;
    let dirs = p.dirs_for(threads);
    let root = round_dir(threads);
    vfs.mkdir(&root, 0o755)
        .ctx(|| format!("metadata: mkdir {root}"))?;
    for d in 0..dirs {
        let path = dir_name(threads, d);
        vfs.mkdir(&path, 0o755)
            .ctx(|| format!("metadata: mkdir {path}"))?;
    }
    let work = prepare(p.files, threads, dirs, p.shuffle, seed);
    let mut data = vec![0u8; p.file_bytes as usize];
    StdRng::seed_from_u64(seed).fill_bytes(&mut data);

    let mut out = Round {
        threads,
        dirs,
        phases: Vec::new(),
        failures: Failures::default(),
    };
    for (name, op, cold) in PHASES {
        if cold && !p.cold_stat {
            continue;
        }
        if cold {
            env.probe.drop_caches()?;
        }
        env.progress
            .set_message(format!("metadata {name}@{threads}"));
        let (failures, phase) = env.phase(&format!("{name}@{threads}"), || {
            Ok(phase_all(vfs, op, &work, &data))
        })?;
        out.failures.merge(failures);
        let ops = p.files as f64 / phase.wall_s.max(1e-9);
        out.phases.push((name, ops, phase));
        if p.check_counts && (op == Op::Create || op == Op::Unlink) {
            let want = if op == Op::Create { p.files } else { 0 };
            let have = count_entries(vfs, threads, dirs)?;
            if have != want {
                out.failures.add(
                    "count",
                    &root,
                    format!("{have} entries after {name}, expected {want}"),
                );
            }
        }
        env.progress.inc(1);
    }
    for d in 0..dirs {
        let path = dir_name(threads, d);
        vfs.rmdir(&path).ctx(|| format!("metadata: rmdir {path}"))?;
    }
    vfs.rmdir(&root).ctx(|| format!("metadata: rmdir {root}"))?;
    Ok(out)
}

impl Workload for Metadata {
    fn name(&self) -> &'static str {
        "metadata"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or_default()
    }

    fn lib_capable(&self) -> bool {
        true
    }

    fn min_fs_bytes(&self) -> Option<u64> {
        let per_file = self.params.file_bytes.div_ceil(4096) * 4096 + 4096;
        Some(self.params.files * per_file + (64 << 20))
    }

    fn run(&self, env: &RunEnv) -> Result<RunOutput> {
        let p = &self.params;
        let seed = p.seed.unwrap_or(env.seed);
        let per_round = PHASES.len() as u64 - u64::from(!p.cold_stat);
        env.progress.set_length(per_round * p.threads.len() as u64);
        env.progress.set_position(0);
        let mut rounds = Vec::new();
        for &t in &p.threads {
            rounds.push(round(env, p, t, seed)?);
        }

        let mut metrics = Vec::new();
        let mut phases = Vec::new();
        let mut errors = 0;
        let mut first_error = None;
        let mut json_rounds = Vec::new();
        for r in rounds {
            let mut ops = serde_json::Map::new();
            for (name, v, phase) in r.phases.iter() {
                metrics.push(Metric::higher(format!("{name}@{}", r.threads), "ops/s", *v));
                ops.insert(name.to_string(), (*v).into());
                phases.push(phase.clone());
            }
            json_rounds.push(serde_json::json!({
                "threads": r.threads,
                "dirs": r.dirs,
                "files": p.files,
                "ops_per_s": ops,
                "errors": r.failures.count,
            }));
            errors += r.failures.count;
            if first_error.is_none() {
                first_error = r.failures.first;
            }
        }

        let names: Vec<&str> = PHASES
            .iter()
            .map(|ph| ph.0)
            .filter(|n| *n != "stat_cold" || p.cold_stat)
            .collect();
        let value = |name: &str, t: u32| {
            metrics
                .iter()
                .find(|m| m.name == format!("{name}@{t}"))
                .map(|m| m.value)
        };
        let mut text = format!(
            "metadata: {} files of {} bytes per round, {} (ops/s)\n",
            p.files,
            p.file_bytes,
            match p.dirs {
                0 => "one directory per thread".to_string(),
                d => format!("{d} directories"),
            }
        );
        text.push_str(&format!("{:<10}", "phase"));
        for &t in &p.threads {
            text.push_str(&format!("{:>12}", format!("{t} thr")));
        }
        text.push('\n');
        let mut series = Vec::new();
        for name in &names {
            text.push_str(&format!("{name:<10}"));
            let mut points = Vec::new();
            for &t in &p.threads {
                let v = value(name, t).unwrap_or(0.0);
                text.push_str(&format!("{:>12.0}", v));
                points.push((t as f64, v));
            }
            text.push('\n');
            series.push(Series {
                name: name.to_string(),
                x_label: "threads".into(),
                y_label: "ops/s".into(),
                points,
            });
        }
        text.push_str(&format!("errors: {errors}\n"));
        if let Some(e) = &first_error {
            text.push_str(&format!("first error: {e}\n"));
        }
        Ok(RunOutput {
            metrics,
            phases,
            series,
            text,
            errors,
            extra: serde_json::json!({ "rounds": json_rounds, "first_error": first_error }),
            ..Default::default()
        })
    }
}

/// A probe that does nothing (for [`overhead_pair`] on tmpfs).
struct NullProbe;

impl Probe for NullProbe {
    fn drop_caches(&self) -> Result<()> {
        Ok(())
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn io(&self) -> IoCounters {
        IoCounters::default()
    }
    fn used_bytes(&self) -> Result<u64> {
        Ok(0)
    }
    fn make_snapshot_root(&self, _path: &str) -> Result<()> {
        Ok(())
    }
    fn snapshot(&self, _path: &str, _name: &str) -> Result<bool> {
        Ok(false)
    }
}

/// Parameters of the single-threaded pass of [`overhead_pair`].
fn pair_params(files: u32) -> Params {
    Params {
        files: u64::from(files),
        file_bytes: 4096,
        dirs: 1,
        threads: vec![1],
        seed: Some(1),
        cold_stat: false,
        shuffle: true,
        check_counts: false,
    }
}

fn fresh_dir(path: &Path) -> Result<()> {
    std::fs::create_dir(path).ctx(|| format!("metadata: mkdir {}", path.display()))
}

/// The workload's own code, single-threaded, over [`PosixVfs`] in `dir`:
/// (phase, ops/s) for create, stat, rename and unlink.
fn harness_pass(dir: &Path, files: u32) -> Result<Vec<(String, f64)>> {
    let vfs = PosixVfs::open(dir).ctx(|| format!("metadata: open {}", dir.display()))?;
    let bar = ProgressBar::hidden();
    let env = RunEnv {
        dir: Some(dir.to_path_buf()),
        vfs: &vfs,
        probe: &NullProbe,
        fs_label: "overhead".into(),
        fs_type: "unknown".into(),
        seed: 1,
        run: 0,
        mem_limit: None,
        progress: &bar,
    };
    let p = pair_params(files);
    let r = round(&env, &p, 1, 1)?;
    if r.failures.count > 0 {
        return fail(format!(
            "metadata: {} failures in the harness pass, first: {}",
            r.failures.count,
            r.failures.first.unwrap_or_default()
        ));
    }
    Ok(r.phases
        .into_iter()
        .map(|(n, v, _)| (n.to_string(), v))
        .collect())
}

/// The same system calls as [`harness_pass`] (same paths, orders, flags and
/// data), as a straight libc loop: (phase, ops/s).
fn raw_pass(dir: &Path, files: u32) -> Result<Vec<(String, f64)>> {
    let p = pair_params(files);
    // The same full paths as `PosixVfs` uses, so the kernel walks the same components.
    let Some(prefix) = dir
        .to_str()
        .map(|d| format!("{}/", d.trim_end_matches('/')))
    else {
        return fail(format!("metadata: bad path {}", dir.display()));
    };
    raw_loops(&prefix, &p)
}

fn raw_loops(prefix: &str, p: &Params) -> Result<Vec<(String, f64)>> {
    // Full paths, like `PosixVfs`: the *at calls take them relative to nothing.
    let dfd = libc::AT_FDCWD;
    let c = |s: &str| CString::new(format!("{prefix}{s}")).unwrap_or_default();
    let check = |ret: libc::c_int, what: &str| -> Result<()> {
        if ret < 0 {
            Err(std::io::Error::last_os_error()).ctx(|| format!("metadata raw: {what}"))
        } else {
            Ok(())
        }
    };
    for d in [round_dir(1), dir_name(1, 0)] {
        // SAFETY: valid directory fd and NUL-terminated path.
        check(
            unsafe { libc::mkdirat(dfd, c(&d).as_ptr(), 0o755) },
            "mkdir",
        )?;
    }
    let seed = 1;
    let w = prepare(p.files, 1, 1, p.shuffle, seed).remove(0);
    let names: Vec<CString> = w.names.iter().map(|n| c(n)).collect();
    let renamed: Vec<CString> = w.renamed.iter().map(|n| c(n)).collect();
    let mut data = vec![0u8; p.file_bytes as usize];
    StdRng::seed_from_u64(seed).fill_bytes(&mut data);
    let n = p.files as f64;
    let mut out = Vec::new();
    let mut bad = 0u64;

    let t0 = Instant::now();
    for name in &names {
        // SAFETY: valid fd, path, flags and mode.
        let fd = unsafe {
            libc::openat(
                dfd,
                name.as_ptr(),
                libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY | libc::O_CLOEXEC,
                0o644 as libc::c_uint,
            )
        };
        if fd < 0 {
            bad += 1;
            continue;
        }
        // SAFETY: `data` is valid for its length; `fd` is open.
        if unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) } != data.len() as isize {
            bad += 1;
        }
        // SAFETY: `fd` is open and closed once.
        unsafe { libc::close(fd) };
    }
    out.push(("create".to_string(), n / t0.elapsed().as_secs_f64()));

    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    let t0 = Instant::now();
    for &i in &w.stat_order {
        // SAFETY: valid fd, path and output buffer.
        if unsafe { libc::fstatat(dfd, names[i].as_ptr(), st.as_mut_ptr(), 0) } < 0 {
            bad += 1;
        }
    }
    out.push(("stat".to_string(), n / t0.elapsed().as_secs_f64()));

    let t0 = Instant::now();
    for &i in &w.rename_order {
        // SAFETY: valid fds and paths.
        if unsafe { libc::renameat(dfd, names[i].as_ptr(), dfd, renamed[i].as_ptr()) } < 0 {
            bad += 1;
        }
    }
    out.push(("rename".to_string(), n / t0.elapsed().as_secs_f64()));

    let t0 = Instant::now();
    for &i in &w.unlink_order {
        // SAFETY: valid fd and path.
        if unsafe { libc::unlinkat(dfd, renamed[i].as_ptr(), 0) } < 0 {
            bad += 1;
        }
    }
    out.push(("unlink".to_string(), n / t0.elapsed().as_secs_f64()));

    for d in [dir_name(1, 0), round_dir(1)] {
        // SAFETY: valid directory fd and NUL-terminated path.
        check(
            unsafe { libc::unlinkat(dfd, c(&d).as_ptr(), libc::AT_REMOVEDIR) },
            "rmdir",
        )?;
    }
    if bad > 0 {
        return fail(format!("metadata raw: {bad} failed system calls"));
    }
    Ok(out)
}

/// Runs create, stat, rename and unlink of `files` files single-threaded in
/// `dir` through this workload's code over [`PosixVfs`] and as a minimal libc
/// loop issuing the same system calls (same paths, orders, flags and data;
/// `strace -c -f` shows identical counts of openat, write, close, newfstatat,
/// renameat and unlinkat). Returns (phase, harness ops/s, raw ops/s).
///
/// To be fair on a busy machine, each side runs twice in the order harness,
/// raw, raw, harness (so that warm-up and drift hit both alike), each time in
/// a fresh subdirectory of `dir`, and the better of its two runs counts.
pub fn overhead_pair(dir: &Path, files: u32) -> Result<Vec<(String, f64, f64)>> {
    let mut best: Vec<(String, f64, f64)> = Vec::new();
    for (i, harness) in [true, false, false, true].into_iter().enumerate() {
        let sub = dir.join(format!("{}{i}", if harness { "harness" } else { "raw" }));
        fresh_dir(&sub)?;
        let res = if harness {
            harness_pass(&sub, files)
        } else {
            raw_pass(&sub, files)
        };
        let _ = std::fs::remove_dir(&sub);
        for (k, (name, v)) in res?.into_iter().enumerate() {
            if best.len() <= k {
                best.push((name, 0.0, 0.0));
            }
            let slot = if harness {
                &mut best[k].1
            } else {
                &mut best[k].2
            };
            *slot = slot.max(v);
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::with_env;

    #[test]
    fn metadata_prepare_splits_files_over_threads_and_dirs() {
        let w = prepare(10, 2, 4, true, 3);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].names.len(), 5);
        assert_eq!(w[0].names[0], "t2/d0/f0000000");
        assert_eq!(w[0].names[1], "t2/d2/f0000002");
        assert_eq!(w[1].renamed[0], "t2/d1/r0000001");
        for t in &w {
            for o in [&t.stat_order, &t.rename_order, &t.unlink_order] {
                let mut s = o.clone();
                s.sort_unstable();
                assert_eq!(s, (0..5).collect::<Vec<_>>());
            }
        }
        // One directory per thread: each thread stays in its own.
        let w = prepare(9, 3, 3, false, 1);
        for (t, tw) in w.iter().enumerate() {
            assert!(tw.names.iter().all(|n| n.starts_with(&format!("t3/d{t}/"))));
        }
    }

    #[test]
    fn metadata_tiny_run_counts_and_cleans_up() {
        let tmp = tempfile::tempdir().unwrap();
        let w = workload(Tier::Tiny, &[]).unwrap();
        assert!(w.lib_capable());
        let out = with_env(tmp.path(), |env| w.run(env)).unwrap();
        assert_eq!(out.errors, 0, "{}", out.text);
        let names: Vec<&str> = out.metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "create@1",
                "stat@1",
                "stat_cold@1",
                "rename@1",
                "unlink@1",
                "create@2",
                "stat@2",
                "stat_cold@2",
                "rename@2",
                "unlink@2"
            ]
        );
        assert!(out
            .metrics
            .iter()
            .all(|m| m.value > 0.0 && m.unit == "ops/s"));
        assert_eq!(out.phases.len(), 10);
        assert_eq!(out.phases[0].name, "create@1");
        assert_eq!(out.series.len(), 5);
        assert_eq!(out.extra["rounds"][1]["files"], 200);
        assert!(out.text.contains("create"), "{}", out.text);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn metadata_setup_failure_fails_and_dirs_spread_files() {
        // A file where a round directory should go: the round cannot start.
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("t1"), b"x").unwrap();
        let w = workload(Tier::Tiny, &[("threads".into(), "[1]".into())]).unwrap();
        assert!(with_env(tmp.path(), |env| w.run(env)).is_err());
        // Multi-dir spread with empty files.
        let tmp = tempfile::tempdir().unwrap();
        let ov = [
            ("dirs".to_string(), "3".to_string()),
            ("file_bytes".to_string(), "0".to_string()),
            ("files".to_string(), "50".to_string()),
        ];
        let w = workload(Tier::Tiny, &ov).unwrap();
        let out = with_env(tmp.path(), |env| w.run(env)).unwrap();
        assert_eq!(out.errors, 0, "{}", out.text);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn metadata_overhead_pair_reports_four_phases() {
        let tmp = tempfile::tempdir().unwrap();
        let pairs = overhead_pair(tmp.path(), 100).unwrap();
        let names: Vec<&str> = pairs.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(names, ["create", "stat", "rename", "unlink"]);
        assert!(pairs.iter().all(|p| p.1 > 0.0 && p.2 > 0.0));
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
