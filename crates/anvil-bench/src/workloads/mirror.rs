//! `mirror`: the days of the `backup` scenario, each day's snapshot sent to a
//! second file system of the same kind: the first send whole, then one
//! incremental send a day, as an off-site copy would be kept.
//!
//! The trees are the backup workload's (same generator, same cache under
//! `/var/tmp/anvil-bench-src/backup-<hash>`, same deterministic daily
//! mutation), so both workloads see the same sequence of trees. Each day:
//!
//! 1. the day's mutation (day 2 on) of a private working copy of the tree;
//! 2. outside any timing, the day's *changed data*: what a copy has to write
//!    that day, from a comparison with the previous day's tree. For a path that
//!    is new (renamed files included: rsync writes them anew) its whole
//!    content; for a path whose content changed, the bytes from the first to
//!    the last that differ (an overwritten region, an appended tail, or a
//!    rewritten file whole). Its compressed size is the sum over 64 KiB pieces
//!    of each file's changed bytes of lz4 (`lz4_flex` block format, as anvil
//!    stores data), a piece counted raw where lz4 does not make it smaller;
//! 3. `rsync -a --delete --inplace --no-whole-file` of the tree into the
//!    snapshot root `mirror/current` on the source (rsync then writes only the
//!    blocks that changed; `rsync_delta=false` drops `--no-whole-file`, so
//!    every changed file is rewritten whole, as in `backup`), then a read-only
//!    snapshot `day-NN` (btrfs subvolume snapshot, zfs snapshot, anvil
//!    snapshot), then a sync of both file systems;
//! 4. timed: the send. btrfs: `btrfs send [-p .snapshots/day-(N-1)]
//!    .snapshots/day-NN | btrfs receive MNT`; zfs-fuse: `zfs send [-i
//!    POOL/mirror_current@day-(N-1)] POOL/mirror_current@day-NN | zfs recv -F
//!    RPOOL/mirror_current`; anvil: `anvil mirror-status MNT --json` for the TID
//!    the slave holds, then `anvil mirror-read SRC --since TID | anvil
//!    mirror-write MNT` (what `anvil mirror-copy SRC MNT` runs;
//!    `anvil_send=mirror-copy` runs that command instead and takes the byte
//!    count it prints). The stream passes through this process, which counts
//!    its bytes (the *wire bytes*). The time runs from building the pipeline to
//!    both ends having exited; a second time adds a sync of the receiver
//!    (durable on its device);
//! 5. the receiver's used bytes (statfs, or `zfs get used` of its pool), minus
//!    those of the freshly made receiver.
//!
//! At the end, the receiver's copy of the last day is compared with the tree
//! of that day, and its day-01 snapshot with the day-1 tree (where the path of
//! a received snapshot is known).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::env::{CpuTimes, IoCounters, Metric, Phase, Replica, RunEnv, RunOutput, Series};
use crate::error::{fail, BenchError, Context, Result};
use crate::results::median;
use crate::workloads::backup::{
    self, manifest, mutate, rsync, verify, Changes, DayState, Manifest,
};
use crate::workloads::nightly::{cached_tree, check_outside, require_tools, tree_bytes, MB};
use crate::workloads::{apply_overrides, Overrides, Tier, Workload};

/// The snapshot root, relative to the run's directory.
const ROOT: &str = "mirror/current";

/// lz4 is applied to pieces of this size (anvil's data chunk).
const PIECE: usize = 64 << 10;

const SEND_MODES: [&str; 2] = ["pipe", "mirror-copy"];

/// Parameters of `mirror`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Days (day 1 is the full send).
    pub days: u32,
    /// Size of the day-1 tree, MB (10^6 bytes).
    pub tree_mb: f64,
    /// Files in the day-1 tree.
    pub files: u32,
    /// Percentage of the files that change each day.
    pub change_pct: f64,
    /// Percentage of the files with random (incompressible) content.
    pub random_pct: f64,
    /// Seed of the tree generator and the daily changes.
    pub seed: u64,
    /// Where the day-1 tree is cached; empty for the backup workload's cache.
    pub source_dir: String,
    /// rsync writes only the blocks that changed (`--no-whole-file`); false:
    /// every changed file whole (rsync's default for local copies, as in backup).
    pub rsync_delta: bool,
    /// How anvil sends: "pipe" (mirror-read | this process | mirror-write, bytes
    /// counted here) or "mirror-copy" (one `anvil mirror-copy`, bytes as it
    /// prints them). Other file systems always pipe.
    pub anvil_send: String,
}

impl Params {
    pub fn for_tier(tier: Tier) -> Params {
        let b = backup::Params::for_tier(tier);
        Params {
            days: b.days,
            tree_mb: b.tree_mb,
            files: b.files,
            change_pct: b.change_pct,
            random_pct: b.random_pct,
            seed: b.seed,
            source_dir: String::new(),
            rsync_delta: true,
            anvil_send: "pipe".into(),
        }
    }

    /// The backup workload's parameters for the same trees.
    fn backup(&self) -> backup::Params {
        backup::Params {
            days: self.days,
            tree_mb: self.tree_mb,
            files: self.files,
            change_pct: self.change_pct,
            random_pct: self.random_pct,
            methods: "snapshot".into(),
            seed: self.seed,
            keep: false,
            source_dir: self.source_dir.clone(),
            offsite: false,
        }
    }

    fn check(&self) -> Result<()> {
        if self.days == 0 || self.files == 0 || self.tree_mb.is_nan() || self.tree_mb <= 0.0 {
            return fail("mirror: days, files and tree_mb must be positive");
        }
        if self.days > 999 {
            return fail("mirror: at most 999 days");
        }
        if !(0.0..=100.0).contains(&self.change_pct) || !(0.0..=100.0).contains(&self.random_pct) {
            return fail("mirror: change_pct and random_pct are percentages (0-100)");
        }
        if !SEND_MODES.contains(&self.anvil_send.as_str()) {
            return fail(format!(
                "mirror: anvil_send is one of {}, not '{}'",
                SEND_MODES.join(", "),
                self.anvil_send
            ));
        }
        Ok(())
    }

    fn rsync_args(&self) -> Vec<&'static str> {
        let mut args = vec!["-a", "--delete", "--inplace"];
        if self.rsync_delta {
            args.push("--no-whole-file");
        }
        args
    }
}

pub fn workload(tier: Tier, overrides: &Overrides) -> Result<Box<dyn Workload>> {
    let params = apply_overrides(Params::for_tier(tier), overrides)?;
    params.check()?;
    Ok(Box::new(Mirror { params }))
}

pub struct Mirror {
    pub params: Params,
}

impl Workload for Mirror {
    fn name(&self) -> &'static str {
        "mirror"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or_default()
    }

    fn min_fs_bytes(&self) -> Option<u64> {
        // The tree once plus every day's changes whole, with some room (the
        // receiver is a second device of the same size and holds the same).
        let p = &self.params;
        let tree = p.tree_mb * MB;
        let daily = tree * p.change_pct / 100.0;
        Some(((tree * 1.2 + daily * p.days as f64) * 1.3) as u64 + (64 << 20))
    }

    fn run(&self, env: &RunEnv) -> Result<RunOutput> {
        run(&self.params, env)
    }
}

// ---------------------------------------------------------------------------
// Changed data.

/// What one day's copy has to write, as defined in the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ChangedData {
    /// Files new or with changed content.
    pub files: u64,
    /// Their changed bytes, and those compressed.
    pub bytes: u64,
    pub lz4_bytes: u64,
    /// The same files whole, and compressed.
    pub file_bytes: u64,
    pub file_lz4_bytes: u64,
}

/// The range of `new` that differs from `old`: after their common prefix and
/// before their common suffix (empty when they are equal, or when `new` only
/// lost bytes).
pub fn changed_span(old: &[u8], new: &[u8]) -> std::ops::Range<usize> {
    let prefix = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let room = old.len().min(new.len()) - prefix;
    let suffix = old
        .iter()
        .rev()
        .zip(new.iter().rev())
        .take(room)
        .take_while(|(a, b)| a == b)
        .count();
    prefix..new.len() - suffix
}

/// Size of `data` compressed with lz4 in 64 KiB pieces, each at most its raw size.
pub fn lz4_size(data: &[u8]) -> u64 {
    data.chunks(PIECE)
        .map(|piece| lz4_flex::block::compress(piece).len().min(piece.len()) as u64)
        .sum()
}

/// Changed data of the tree `new_root` (manifest `new`) against the tree of the
/// day before at `old_root` (manifest `old`; empty for the first day).
pub fn changed_data(
    old_root: &Path,
    old: &Manifest,
    new_root: &Path,
    new: &Manifest,
) -> Result<ChangedData> {
    let mut out = ChangedData::default();
    for (path, entry) in new {
        let before = old.get(path);
        if before.is_some_and(|b| b.size == entry.size && b.hash == entry.hash) {
            continue;
        }
        let file = new_root.join(path);
        let data = fs::read(&file).ctx(|| format!("read {}", file.display()))?;
        let span = match before {
            Some(_) => {
                let file = old_root.join(path);
                let prev = fs::read(&file).ctx(|| format!("read {}", file.display()))?;
                changed_span(&prev, &data)
            }
            None => 0..data.len(),
        };
        out.files += 1;
        out.bytes += span.len() as u64;
        out.lz4_bytes += lz4_size(&data[span]);
        out.file_bytes += data.len() as u64;
        out.file_lz4_bytes += lz4_size(&data);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Sending.

/// One send of a snapshot to a replica.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sent {
    /// Wall time of the send, from building the pipeline to both ends exiting.
    pub wall_s: f64,
    /// The same, plus a sync of the receiver.
    pub synced_s: f64,
    /// Bytes of the stream, counted as they passed through this process (with
    /// `anvil_send=mirror-copy`: as `anvil mirror-copy` printed them).
    pub wire_bytes: u64,
    /// Whether `wire_bytes` were counted here (false: the tool's figure).
    pub counted: bool,
    /// The stream size the receiver reported, where it does (anvil).
    pub receiver_bytes: Option<u64>,
    /// CPU of this process and its children (not of file-system daemons).
    pub user_s: f64,
    pub sys_s: f64,
    /// Device I/O of the source and of the receiver during the send and sync.
    pub source_io: IoCounters,
    pub receiver_io: IoCounters,
    /// The commands, as a shell line.
    pub command: String,
    /// What the sender and receiver printed (last lines).
    pub log: String,
}

/// Copies `from` into `to` until end of input; returns the bytes copied.
pub fn pump(from: &mut impl Read, to: &mut impl Write) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
    to.flush()?;
    Ok(total)
}

/// The stream bytes in anvil's `mirror-write: TIDs a..b: ..., N stream bytes` line.
pub fn receiver_stream_bytes(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .filter(|l| l.starts_with("mirror-write:"))
        .find_map(|l| {
            let head = l.strip_suffix(" stream bytes")?;
            head.rsplit(' ').next()?.parse().ok()
        })
}

/// What `anvil mirror-copy` printed: `mirror-copy SRC -> DST: TIDs A..B, N
/// bytes on the wire, S s`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CopyLine {
    pub since: u64,
    pub until: u64,
    pub wire_bytes: u64,
    pub seconds: f64,
}

pub fn parse_copy_line(text: &str) -> Option<CopyLine> {
    let line = text.lines().find(|l| l.starts_with("mirror-copy "))?;
    let rest = &line[line.rfind(": TIDs ")? + ": TIDs ".len()..];
    let mut parts = rest.split(", ");
    let (since, until) = parts.next()?.split_once("..")?;
    let wire = parts.next()?.strip_suffix(" bytes on the wire")?;
    let seconds = parts.next()?.strip_suffix(" s")?;
    Some(CopyLine {
        since: since.parse().ok()?,
        until: until.parse().ok()?,
        wire_bytes: wire.parse().ok()?,
        seconds: seconds.parse().ok()?,
    })
}

fn drain(from: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut f) = from {
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    })
}

/// The last `n` non-empty lines of `text`, joined with " | ".
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// Runs `send | (count) | receive`; returns the bytes and what both printed.
fn run_pipeline(mut send: Command, mut receive: Command, shown: &str) -> Result<(u64, String)> {
    let mut sender = send
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ctx(|| format!("run {shown}"))?;
    let mut receiver = match receive
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = sender.kill();
            let _ = sender.wait();
            return Err(BenchError(format!("run {shown}: {e}")));
        }
    };
    let send_err = drain(sender.stderr.take());
    let recv_out = drain(receiver.stdout.take());
    let recv_err = drain(receiver.stderr.take());
    let copied = match (sender.stdout.take(), receiver.stdin.take()) {
        // Both ends are dropped here: the receiver sees the end of the stream,
        // and a sender still writing gets EPIPE if the receiver stopped.
        (Some(mut from), Some(mut to)) => pump(&mut from, &mut to),
        _ => Err(std::io::Error::other("no pipes")),
    };
    let send_status = sender.wait().ctx(|| format!("wait for {shown}"))?;
    let recv_status = receiver.wait().ctx(|| format!("wait for {shown}"))?;
    let send_text = send_err.join().unwrap_or_default();
    let recv_text = format!(
        "{}{}",
        recv_out.join().unwrap_or_default(),
        recv_err.join().unwrap_or_default()
    );
    let log = format!("{}\n{}", send_text.trim_end(), recv_text.trim_end())
        .trim()
        .to_string();
    if !send_status.success() || !recv_status.success() {
        return fail(format!(
            "{shown}: sender {send_status}, receiver {recv_status}: {}",
            tail(&log, 4)
        ));
    }
    let bytes = copied.map_err(|e| BenchError(format!("{shown}: stream: {e}")))?;
    Ok((bytes, log))
}

/// Sends snapshot `name` of the source to `replica` (incrementally from
/// `prev`), timed, then syncs the receiver; see the module documentation.
pub(crate) fn send_snapshot(
    env: &RunEnv,
    replica: &dyn Replica,
    name: &str,
    prev: Option<&str>,
    use_copy_command: bool,
) -> Result<Sent> {
    let cpu0 = CpuTimes::now();
    let (src0, dst0) = (env.probe.io(), replica.io());
    let t0 = Instant::now();
    let copy = if use_copy_command {
        replica.copy_command()
    } else {
        None
    };
    let (wire_bytes, counted, command, log) = match copy {
        Some(mut cmd) => {
            let shown = format!("{cmd:?}").replace('"', "");
            let out = cmd
                .stdin(Stdio::null())
                .output()
                .ctx(|| format!("run {shown}"))?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if !out.status.success() {
                return fail(format!(
                    "{shown} failed ({}): {}",
                    out.status,
                    tail(&text, 3)
                ));
            }
            let Some(line) = parse_copy_line(&text) else {
                return fail(format!("{shown}: no summary line in: {}", tail(&text, 3)));
            };
            (line.wire_bytes, false, shown, text)
        }
        None => {
            let sr = replica.pipeline(name, prev)?;
            let (bytes, log) = run_pipeline(sr.send, sr.receive, &sr.shown)?;
            (bytes, true, sr.shown, log)
        }
    };
    let wall_s = t0.elapsed().as_secs_f64();
    replica.sync()?;
    let synced_s = t0.elapsed().as_secs_f64();
    let (source_io, receiver_io) = (env.probe.io().since(&src0), replica.io().since(&dst0));
    let cpu = CpuTimes::now().since(&cpu0);
    Ok(Sent {
        wall_s,
        synced_s,
        wire_bytes,
        counted,
        receiver_bytes: receiver_stream_bytes(&log),
        user_s: cpu.user_s,
        sys_s: cpu.sys_s,
        source_io,
        receiver_io,
        command,
        log: tail(&log, 6),
    })
}

// ---------------------------------------------------------------------------
// The run.

/// One day of the run.
#[derive(Clone, Debug, Serialize)]
struct Day {
    day: u32,
    changes: Changes,
    changed: ChangedData,
    /// rsync into the source plus its snapshot.
    copy_s: f64,
    sent: Sent,
    /// Growth of the receiver's and the source's used bytes since they were made.
    target_used: u64,
    source_used: u64,
}

impl Day {
    /// Wire bytes per compressed changed byte.
    fn wire_ratio(&self) -> Option<f64> {
        ratio(self.sent.wire_bytes, self.changed.lz4_bytes)
    }

    fn wire_ratio_files(&self) -> Option<f64> {
        ratio(self.sent.wire_bytes, self.changed.file_lz4_bytes)
    }
}

/// `num / den`, None when there is nothing to divide by.
pub fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// Median of the values that exist (None when none do).
fn median_of(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.flatten().collect();
    (!v.is_empty()).then(|| median(&v))
}

fn day_name(day: u32) -> String {
    format!("day-{day:02}")
}

/// The run's metrics from its days (the first day is the full send).
fn metrics(days: &[Day]) -> Vec<Metric> {
    let mut out = Vec::new();
    let Some(first) = days.first() else {
        return out;
    };
    let incr = &days[1..];
    if let Some(m) = median_of(incr.iter().map(|d| Some(d.sent.wall_s))) {
        out.push(Metric::lower("incr_median_s", "s", m));
    }
    out.push(Metric::lower("full_s", "s", first.sent.wall_s));
    if let Some(m) = median_of(incr.iter().map(|d| Some(d.sent.synced_s))) {
        out.push(Metric::lower("incr_median_synced_s", "s", m));
    }
    out.push(Metric::lower("full_synced_s", "s", first.sent.synced_s));
    let wire: u64 = days.iter().map(|d| d.sent.wire_bytes).sum();
    out.push(Metric::lower("wire_total_mb", "MB", wire as f64 / MB));
    if !incr.is_empty() {
        let w: u64 = incr.iter().map(|d| d.sent.wire_bytes).sum();
        out.push(Metric::lower("incr_wire_total_mb", "MB", w as f64 / MB));
    }
    if let Some(m) = median_of(incr.iter().map(Day::wire_ratio)) {
        out.push(Metric::lower("wire_per_changed", "x", m));
    }
    if let Some(m) = median_of(incr.iter().map(Day::wire_ratio_files)) {
        out.push(Metric::lower("wire_per_changed_files", "x", m));
    }
    if let Some(r) = first.wire_ratio() {
        out.push(Metric::lower("full_wire_per_changed", "x", r));
    }
    if let Some(last) = days.last() {
        out.push(Metric::lower(
            "target_used_mb",
            "MB",
            last.target_used as f64 / MB,
        ));
        out.push(Metric::lower(
            "source_used_mb",
            "MB",
            last.source_used as f64 / MB,
        ));
    }
    out
}

fn series(days: &[Day]) -> Vec<Series> {
    let line = |name: &str, y: &str, f: &dyn Fn(&Day) -> Option<f64>| Series {
        name: name.into(),
        x_label: "day".into(),
        y_label: y.into(),
        points: days
            .iter()
            .filter_map(|d| Some((d.day as f64, f(d)?)))
            .collect(),
    };
    vec![
        line("send_s", "s (send | receive)", &|d| Some(d.sent.wall_s)),
        line("wire_mb", "MB on the wire", &|d| {
            Some(d.sent.wire_bytes as f64 / MB)
        }),
        line("changed_lz4_mb", "MB changed (lz4)", &|d| {
            Some(d.changed.lz4_bytes as f64 / MB)
        }),
        line("wire_per_changed", "wire / changed (lz4)", &Day::wire_ratio),
        line("target_used_mb", "MB used on the receiver", &|d| {
            Some(d.target_used as f64 / MB)
        }),
    ]
}

fn used(env: &RunEnv) -> Result<u64> {
    env.probe.sync()?;
    env.probe.used_bytes()
}

fn replica_used(replica: &dyn Replica) -> Result<u64> {
    replica.sync()?;
    replica.used_bytes()
}

/// Runs the days against a made replica.
fn run_days(
    p: &Params,
    env: &RunEnv,
    dir: &Path,
    cache: &Path,
    tree: &Path,
    replica: &dyn Replica,
    notes: &mut Vec<String>,
) -> Result<Vec<Day>> {
    let bp = p.backup();
    let state = DayState::fresh(cache, tree)?;
    let src = state.0.clone();
    // The tree of the day before, for the changed data.
    let before = DayState::fresh(cache, tree)?;
    let mut old = Manifest::new();
    let day1 = manifest(tree)?;
    let current = dir.join(ROOT);
    let rsync_args = p.rsync_args();
    let use_copy = p.anvil_send == "mirror-copy";

    env.probe.drop_caches()?;
    let source_base = used(env)?;
    let target_base = replica_used(replica)?;
    let mut days: Vec<Day> = Vec::new();
    for day in 1..=p.days {
        let name = day_name(day);
        env.progress
            .set_message(format!("mirror: {name} of {}", p.days));
        let changes = if day > 1 {
            mutate(&bp, &src, day)?
        } else {
            Changes::default()
        };
        let new = manifest(&src)?;
        let changed = changed_data(&before.0, &old, &src, &new)?;
        if day > 1 {
            rsync(&["-a", "--delete"], &src, &before.0)?;
        }
        old = new;

        let t0 = Instant::now();
        rsync(&rsync_args, &src, &current)?;
        if !env.probe.snapshot(ROOT, &name)? {
            return fail(format!("mirror: no snapshots on {}", env.fs_label));
        }
        let copy_s = t0.elapsed().as_secs_f64();
        env.probe.sync()?;
        replica.sync()?;

        let prev = (day > 1).then(|| day_name(day - 1));
        let sent = send_snapshot(env, replica, &name, prev.as_deref(), use_copy)?;
        if let Some(r) = sent.receiver_bytes {
            if sent.counted && r != sent.wire_bytes {
                notes.push(format!(
                    "{name}: the receiver reported {r} stream bytes, {} were counted",
                    sent.wire_bytes
                ));
            }
        }
        let target_used = replica_used(replica)?.saturating_sub(target_base);
        let source_used = used(env)?.saturating_sub(source_base);
        days.push(Day {
            day,
            changes,
            changed,
            copy_s,
            sent,
            target_used,
            source_used,
        });
        env.progress.inc(1);
    }

    // Verification, outside the timing.
    env.progress.set_message("mirror: verifying the receiver");
    let last = day_name(p.days);
    match replica.snapshot_dir(&last, true) {
        Some(path) => {
            verify("the receiver's last day", &path, &old)?;
            notes.push(format!(
                "receiver: {last} ({}) verified against the source tree",
                path.display()
            ));
        }
        None => notes.push(format!(
            "receiver: {last} not verified (its path is unknown on {})",
            env.fs_type
        )),
    }
    match replica.snapshot_dir("day-01", p.days == 1) {
        Some(path) => {
            verify("the receiver's day-01", &path, &day1)?;
            notes.push(format!(
                "receiver: day-01 ({}) verified against the day-1 tree",
                path.display()
            ));
        }
        None => notes.push(format!(
            "receiver: day-01 not verified (no path to received snapshots on {})",
            env.fs_type
        )),
    }
    Ok(days)
}

fn run(p: &Params, env: &RunEnv) -> Result<RunOutput> {
    let dir = env.posix_dir("mirror")?.to_path_buf();
    require_tools(
        "mirror",
        &[("rsync", "rsync"), ("cp", "coreutils"), ("rm", "coreutils")],
    )?;
    let bp = p.backup();
    let cache = bp.cache_dir();
    check_outside("mirror", &cache, &dir)?;
    env.progress
        .set_message("mirror: generating the source tree");
    let tree = cached_tree(&cache, &bp.generator_key(), |root| {
        backup::generate_tree(&bp, root)
    })?;
    let (src_files, src_bytes) = tree_bytes(&tree)?;
    env.progress.set_length(p.days as u64);
    env.progress.set_position(0);

    let parent = dir.join(ROOT).parent().map(Path::to_path_buf);
    if let Some(parent) = parent {
        fs::create_dir_all(&parent).ctx(|| format!("mkdir {}", parent.display()))?;
    }
    env.probe.make_snapshot_root(ROOT)?;
    env.progress.set_message("mirror: making the receiver");
    let Some(replica) = env.probe.make_replica(ROOT)? else {
        let out = RunOutput {
            text: format!(
                "mirror: unsupported on {} ({}): no snapshots to send\n",
                env.fs_label, env.fs_type
            ),
            // As backup does: the one figure every target has.
            metrics: vec![Metric::lower("source_mb", "MB", src_bytes as f64 / MB)],
            extra: serde_json::json!({"supported": false}),
            ..Default::default()
        };
        env.progress.inc(p.days as u64);
        return Ok(out);
    };
    let info = replica.info();
    let mut notes = Vec::new();
    let days = run_days(p, env, &dir, &cache, &tree, replica.as_ref(), &mut notes);
    let torn = replica.teardown();
    let days = days?;
    torn?;

    let mut out = RunOutput {
        metrics: metrics(&days)
            .into_iter()
            .chain([Metric::lower("source_mb", "MB", src_bytes as f64 / MB)])
            .collect(),
        series: series(&days),
        ..Default::default()
    };
    for d in &days {
        out.phases.push(Phase {
            name: format!("send/{}", day_name(d.day)),
            wall_s: d.sent.wall_s,
            user_s: d.sent.user_s,
            sys_s: d.sent.sys_s,
            // Both volumes' devices.
            io: d.sent.source_io.add(&d.sent.receiver_io),
            logical_bytes: Some(d.changed.bytes),
            physical_bytes: None,
        });
    }
    let mut commands: BTreeMap<&str, &str> = BTreeMap::new();
    if let Some(d) = days.first() {
        commands.insert("full", &d.sent.command);
    }
    if let Some(d) = days.get(1) {
        commands.insert("incremental", &d.sent.command);
    }
    out.text = text_report(p, env, src_files, src_bytes, &days);
    out.extra = serde_json::json!({
        "supported": true,
        "source_dir": tree.display().to_string(),
        "source_files": src_files,
        "source_bytes": src_bytes,
        "rsync": format!("rsync {} SRC/ {}/", p.rsync_args().join(" "), ROOT),
        "receiver": info,
        "commands": commands,
        "used_bytes": "statfs (blocks - free) of the mount; zfs: `zfs get used` of the pool",
        "days": days,
        "notes": notes,
    });
    Ok(out)
}

fn text_report(p: &Params, env: &RunEnv, files: u64, bytes: u64, days: &[Day]) -> String {
    let mut s = format!(
        "mirror: {} days of a {:.1} MB tree ({} files), about {}% of the files changing daily, {} to a second {}\n",
        p.days,
        bytes as f64 / MB,
        files,
        p.change_pct,
        if p.rsync_delta { "rsync --no-whole-file" } else { "rsync whole files" },
        env.fs_label
    );
    let _ = writeln!(
        s,
        "{:>4} {:>7} {:>10} {:>10} {:>10} {:>8} {:>9} {:>9} {:>9} {:>10}",
        "day",
        "changes",
        "chg MB",
        "chg lz4 MB",
        "wire MB",
        "wire/chg",
        "send s",
        "+sync s",
        "copy s",
        "target MB"
    );
    for d in days {
        let _ = writeln!(
            s,
            "{:>4} {:>7} {:>10.3} {:>10.3} {:>10.3} {:>8} {:>9.3} {:>9.3} {:>9.3} {:>10.1}",
            d.day,
            d.changes.total(),
            d.changed.bytes as f64 / MB,
            d.changed.lz4_bytes as f64 / MB,
            d.sent.wire_bytes as f64 / MB,
            d.wire_ratio().map_or("-".into(), |r| format!("{r:.2}x")),
            d.sent.wall_s,
            d.sent.synced_s,
            d.copy_s,
            d.target_used as f64 / MB
        );
    }
    for m in metrics(days) {
        let _ = writeln!(s, "{}: {:.3} {}", m.name, m.value, m.unit);
    }
    if let Some(d) = days.first() {
        let _ = writeln!(s, "full: {}", d.sent.command);
    }
    if let Some(d) = days.get(1) {
        let _ = writeln!(s, "incremental: {}", d.sent.command);
        if !d.sent.log.is_empty() {
            let _ = writeln!(s, "incremental output: {}", d.sent.log);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::backup::Entry;

    #[test]
    fn mirror_changed_span_finds_the_differing_bytes() {
        assert_eq!(changed_span(b"abcdef", b"abcdef"), 6..6);
        assert_eq!(changed_span(b"abcdef", b"abXYef"), 2..4);
        assert_eq!(changed_span(b"abcdef", b"abcdefgh"), 6..8);
        assert_eq!(changed_span(b"abcdef", b"abc"), 3..3);
        assert_eq!(changed_span(b"", b"xyz"), 0..3);
        assert_eq!(changed_span(b"abcdef", b"zzzzzzzz"), 0..8);
        // A repeated byte at the seam counts once: prefix and suffix do not overlap.
        assert_eq!(changed_span(b"aaaa", b"aaaaaa"), 4..6);
        assert_eq!(changed_span(b"abab", b"ababab"), 4..6);
    }

    #[test]
    fn mirror_lz4_size_compresses_per_piece_and_never_grows() {
        assert_eq!(lz4_size(b""), 0);
        let zeros = vec![0u8; 3 * PIECE];
        let z = lz4_size(&zeros);
        assert!(z > 0 && z < 3 * 1024, "{z}");
        // Random data does not compress: counted raw.
        let mut x = 0x1234_5678_9abc_def0u64;
        let random: Vec<u8> = (0..PIECE + 100)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert_eq!(lz4_size(&random), random.len() as u64);
        // Pieces are independent: two copies cost twice one.
        let one = lz4_size(&zeros[..PIECE]);
        assert_eq!(lz4_size(&zeros[..2 * PIECE]), 2 * one);
    }

    fn entry(data: &[u8]) -> Entry {
        Entry {
            mode: 0o644,
            size: data.len() as u64,
            hash: crate::workloads::nightly::fnv64(data),
        }
    }

    #[test]
    fn mirror_changed_data_of_new_modified_and_unchanged_files() {
        let t = tempfile::TempDir::new().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        fs::create_dir_all(&a).unwrap();
        fs::create_dir_all(&b).unwrap();
        let text = b"hello world, hello world, hello world\n".repeat(100);
        let mut edited = text.clone();
        edited[100..110].copy_from_slice(b"0123456789");
        type Case<'a> = (&'a str, Option<&'a [u8]>, &'a [u8]);
        let files: [Case; 4] = [
            ("same", Some(b"unchanged"), b"unchanged"),
            ("edit", Some(&text), &edited),
            ("grow", Some(b"log 1\n"), b"log 1\nlog 2\n"),
            ("new", None, b"brand new"),
        ];
        let (mut old, mut new) = (Manifest::new(), Manifest::new());
        for (name, before, after) in files {
            if let Some(before) = before {
                fs::write(a.join(name), before).unwrap();
                old.insert(name.into(), entry(before));
            }
            fs::write(b.join(name), after).unwrap();
            new.insert(name.into(), entry(after));
        }
        let c = changed_data(&a, &old, &b, &new).unwrap();
        assert_eq!(c.files, 3);
        assert_eq!(c.bytes, 10 + 6 + 9);
        assert_eq!(
            c.file_bytes,
            edited.len() as u64 + b"log 1\nlog 2\n".len() as u64 + 9
        );
        assert_eq!(
            c.lz4_bytes,
            lz4_size(b"0123456789") + lz4_size(b"log 2\n") + lz4_size(b"brand new")
        );
        assert!(c.file_lz4_bytes < c.file_bytes);
        // The first day: everything is new.
        let all = changed_data(&a, &Manifest::new(), &b, &new).unwrap();
        assert_eq!(all.files, 4);
        assert_eq!(all.bytes, all.file_bytes);
    }

    #[test]
    fn mirror_pump_counts_every_byte() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut out = Vec::new();
        let n = pump(&mut &data[..], &mut out).unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(out, data);
        assert_eq!(pump(&mut &b""[..], &mut Vec::new()).unwrap(), 0);
    }

    #[test]
    fn mirror_pipeline_counts_the_stream_and_reports_failures() {
        let mut send = Command::new("sh");
        send.args(["-c", "head -c 2500000 /dev/zero; echo sent >&2"]);
        let mut receive = Command::new("sh");
        receive.args(["-c", "wc -c >&2"]);
        let (n, log) = run_pipeline(send, receive, "test").unwrap();
        assert_eq!(n, 2_500_000);
        assert!(log.contains("sent") && log.contains("2500000"), "{log}");

        let mut send = Command::new("sh");
        send.args(["-c", "head -c 100000000 /dev/zero"]);
        let mut receive = Command::new("sh");
        receive.args(["-c", "head -c 10 >/dev/null; echo refused >&2; exit 3"]);
        let err = run_pipeline(send, receive, "test").unwrap_err().to_string();
        assert!(err.contains("refused"), "{err}");
    }

    #[test]
    fn mirror_parses_anvil_output() {
        let err = "mirror-read: TIDs 4..6: 3 inserted, 1 deleted, 9 items, 4096 extent bytes, 5310 stream bytes\n\
                   mirror-write: TIDs 4..6: 3 inserted, 1 deleted, 9 items, 4096 extent bytes, 5301 stream bytes\n";
        assert_eq!(receiver_stream_bytes(err), Some(5301));
        assert_eq!(receiver_stream_bytes("At snapshot day-02\n"), None);
        let line = "mirror-copy /mnt/a: b -> /mnt/s: TIDs 4..6, 1258 bytes on the wire, 0.04 s\n";
        assert_eq!(
            parse_copy_line(line),
            Some(CopyLine {
                since: 4,
                until: 6,
                wire_bytes: 1258,
                seconds: 0.04
            })
        );
        assert_eq!(parse_copy_line("mirror-copy a -> b: nothing"), None);
    }

    fn day(n: u32, wall: f64, wire: u64, lz4: u64) -> Day {
        Day {
            day: n,
            changes: Changes::default(),
            changed: ChangedData {
                lz4_bytes: lz4,
                file_lz4_bytes: lz4 * 2,
                ..Default::default()
            },
            copy_s: 0.0,
            sent: Sent {
                wall_s: wall,
                synced_s: wall + 1.0,
                wire_bytes: wire,
                ..Default::default()
            },
            target_used: n as u64 * 1_000_000,
            source_used: 0,
        }
    }

    #[test]
    fn mirror_metrics_take_medians_of_incremental_days() {
        let days = vec![
            day(1, 10.0, 50_000_000, 40_000_000),
            day(2, 1.0, 1_100_000, 1_000_000),
            day(3, 3.0, 3_000_000, 1_000_000),
            day(4, 2.0, 1_000_000, 0),
        ];
        let m: BTreeMap<String, f64> = metrics(&days)
            .into_iter()
            .map(|m| (m.name, m.value))
            .collect();
        assert_eq!(m["incr_median_s"], 2.0);
        assert_eq!(m["full_s"], 10.0);
        assert_eq!(m["incr_median_synced_s"], 3.0);
        assert_eq!(m["full_synced_s"], 11.0);
        assert_eq!(m["wire_total_mb"], 55.1);
        assert_eq!(m["incr_wire_total_mb"], 5.1);
        // Day 4 changed nothing: no ratio; the median of 1.1 and 3.0.
        assert!((m["wire_per_changed"] - 2.05).abs() < 1e-9);
        assert!((m["wire_per_changed_files"] - 1.025).abs() < 1e-9);
        assert_eq!(m["full_wire_per_changed"], 1.25);
        assert_eq!(m["target_used_mb"], 4.0);
        // The first metric is the headline: the incremental time.
        assert_eq!(metrics(&days)[0].name, "incr_median_s");
        // One day only: no incremental metrics.
        let one = metrics(&days[..1]);
        assert!(one.iter().all(|m| !m.name.starts_with("incr")));
        assert!(metrics(&[]).is_empty());
        assert_eq!(ratio(3, 0), None);
        assert_eq!(ratio(3, 2), Some(1.5));
    }

    #[test]
    fn mirror_params() {
        let w = workload(Tier::Tiny, &[]).unwrap();
        assert_eq!(w.params()["anvil_send"], "pipe");
        let ov = vec![("anvil_send".to_string(), "scp".to_string())];
        assert!(workload(Tier::Tiny, &ov).is_err());
        // The same trees as backup's.
        let p = Params::for_tier(Tier::Standard);
        let b = backup::Params::for_tier(Tier::Standard);
        assert_eq!(p.backup().generator_key(), b.generator_key());
        assert_eq!(p.backup().cache_dir(), b.cache_dir());
        assert!(p.rsync_args().contains(&"--no-whole-file"));
    }

    #[test]
    fn mirror_is_unsupported_without_snapshots() {
        let cache = tempfile::TempDir::new().unwrap();
        let work = tempfile::TempDir::new().unwrap();
        let p = Params {
            source_dir: cache.path().join("backup").display().to_string(),
            ..Params::for_tier(Tier::Tiny)
        };
        let out = crate::testkit::with_env(work.path(), |env| run(&p, env)).unwrap();
        let names: Vec<&str> = out.metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["source_mb"]);
        assert_eq!(out.extra["supported"], false);
        assert!(out.text.contains("unsupported"), "{}", out.text);
    }
}
