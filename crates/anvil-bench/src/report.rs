//! Benchmark reports: statistics, the text table, JSON, and comparison.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{fail, Context, Result};

/// Parameters of a `quick` run, as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Params {
    pub files: u64,
    pub file_bytes: u64,
    pub seq_mib: u64,
    pub runs: u32,
}

/// One measured quantity over all runs. Larger is better for every metric.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Metric {
    /// Stable key: create, stat, reread, seq_write, seq_read, unlink.
    pub name: String,
    pub label: String,
    /// "ops/s" or "MiB/s".
    pub unit: String,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: Vec<f64>,
}

impl Metric {
    pub fn from_runs(name: &str, runs: Vec<f64>) -> Metric {
        let (label, unit) = describe(name);
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        Metric {
            name: name.to_string(),
            label: label.to_string(),
            unit: unit.to_string(),
            median: median(&sorted),
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            runs,
        }
    }
}

/// Human label and unit of a metric key.
pub fn describe(name: &str) -> (&'static str, &'static str) {
    match name {
        "create" => ("small-file create+write+close", "ops/s"),
        "stat" => ("stat", "ops/s"),
        "reread" => ("cached open+read+close", "ops/s"),
        "seq_write" => ("1 MiB seq write + fsync", "MiB/s"),
        "seq_read" => ("1 MiB seq read, cold", "MiB/s"),
        "unlink" => ("unlink", "ops/s"),
        _ => ("?", "?"),
    }
}

/// Median of sorted values.
fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The result of one `anvil-bench quick` invocation.
#[derive(Debug, Serialize, Deserialize)]
pub struct Report {
    pub tool: String,
    pub version: String,
    /// Name of the file system under test (`--label`, or its type).
    pub label: String,
    pub dir: String,
    /// Type from /proc/self/mounts, e.g. "ext4" or "fuse.anvil".
    pub fs_type: Option<String>,
    pub params: Params,
    /// False if the page cache could not be dropped before `seq_read`.
    pub cold_read: bool,
    pub metrics: Vec<Metric>,
}

impl Report {
    pub fn print_table(&self, out: &mut impl Write) -> io::Result<()> {
        writeln!(
            out,
            "{} on {} ({} runs; median, min..max)",
            self.label, self.dir, self.params.runs
        )?;
        writeln!(
            out,
            "{:<32} {:>6} {:>12} {:>12} {:>12}",
            "metric", "unit", "median", "min", "max"
        )?;
        for m in &self.metrics {
            writeln!(
                out,
                "{:<32} {:>6} {:>12} {:>12} {:>12}",
                m.label,
                m.unit,
                fmt_value(m.median),
                fmt_value(m.min),
                fmt_value(m.max)
            )?;
        }
        if !self.cold_read {
            writeln!(
                out,
                "note: caches were not dropped; seq read was served from the page cache"
            )?;
        }
        Ok(())
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let mut text = serde_json::to_string_pretty(self).expect("report serializes");
        text.push('\n');
        fs::write(path, text).ctx(|| format!("write {}", path.display()))
    }

    pub fn load(path: &Path) -> Result<Report> {
        let text = fs::read_to_string(path).ctx(|| format!("read {}", path.display()))?;
        match serde_json::from_str(&text) {
            Ok(report) => Ok(report),
            Err(err) => fail(format!(
                "{}: not an anvil-bench report: {err}",
                path.display()
            )),
        }
    }
}

fn fmt_value(v: f64) -> String {
    if !v.is_finite() {
        "-".to_string()
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Prints candidate/baseline for each metric present in both reports.
pub fn compare(baseline: &Path, candidate: &Path) -> Result<()> {
    let base = Report::load(baseline)?;
    let cand = Report::load(candidate)?;
    if base.params != cand.params {
        eprintln!(
            "anvil-bench: warning: the reports used different parameters ({:?} vs {:?})",
            base.params, cand.params
        );
    }
    let out = &mut io::stdout().lock();
    write_comparison(out, &base, &cand).ctx(|| "write to stdout".into())
}

fn write_comparison(out: &mut impl Write, base: &Report, cand: &Report) -> io::Result<()> {
    let (bl, cl) = (short(&base.label), short(&cand.label));
    writeln!(
        out,
        "{:<32} {:>6} {:>12} {:>12} {:>8}  {}",
        "metric (median of runs)",
        "unit",
        bl,
        cl,
        "ratio",
        format_args!("{cl}/{bl} range")
    )?;
    for b in &base.metrics {
        let Some(c) = cand.metrics.iter().find(|c| c.name == b.name) else {
            continue;
        };
        // Range of the ratio: worst candidate over best baseline, and the reverse.
        writeln!(
            out,
            "{:<32} {:>6} {:>12} {:>12} {:>8}  {}..{}",
            b.label,
            b.unit,
            fmt_value(b.median),
            fmt_value(c.median),
            fmt_ratio(c.median / b.median),
            fmt_ratio(c.min / b.max),
            fmt_ratio(c.max / b.min)
        )?;
    }
    for (name, r) in [(bl, base), (cl, cand)] {
        if !r.cold_read {
            writeln!(
                out,
                "note: {name}: caches were not dropped; its seq read is warm"
            )?;
        }
    }
    Ok(())
}

/// The label cut to a 12-character column.
fn short(label: &str) -> &str {
    match label.char_indices().nth(12) {
        Some((end, _)) => &label[..end],
        None => label,
    }
}

fn fmt_ratio(r: f64) -> String {
    if r.is_finite() {
        format!("{r:.2}x")
    } else {
        "-".to_string()
    }
}

/// Type of the file system that holds `dir` (canonical path), from
/// /proc/self/mounts: the entry with the longest mount point that is a
/// prefix of `dir`.
pub fn fs_type_of(dir: &Path) -> Option<String> {
    let mounts = fs::read_to_string("/proc/self/mounts").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let mut fields = line.split(' ');
        let (Some(_src), Some(mnt), Some(fstype)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let mnt = unescape_mount_field(mnt);
        if dir.starts_with(&mnt) && best.as_ref().is_none_or(|(len, _)| mnt.len() >= *len) {
            best = Some((mnt.len(), fstype.to_string()));
        }
    }
    best.map(|(_, fstype)| fstype)
}

/// /proc/self/mounts writes space, tab, newline and backslash as \ooo.
fn unescape_mount_field(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = bytes[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&[1.0, 2.0, 9.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), 3.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn metric_stats() {
        let m = Metric::from_runs("create", vec![30.0, 10.0, 20.0]);
        assert_eq!((m.median, m.min, m.max), (20.0, 10.0, 30.0));
        assert_eq!(m.runs, vec![30.0, 10.0, 20.0]);
        assert_eq!(m.unit, "ops/s");
    }

    #[test]
    fn unescapes_mount_points() {
        assert_eq!(unescape_mount_field("/mnt/a\\040b"), "/mnt/a b");
        assert_eq!(unescape_mount_field("/plain"), "/plain");
        assert_eq!(unescape_mount_field("/end\\04"), "/end\\04");
    }

    #[test]
    fn root_is_a_mount() {
        assert!(fs_type_of(Path::new("/")).is_some());
    }

    #[test]
    fn report_round_trips_through_json() {
        let report = Report {
            tool: "anvil-bench quick".into(),
            version: "0".into(),
            label: "ext4".into(),
            dir: "/x".into(),
            fs_type: Some("ext4".into()),
            params: Params {
                files: 1,
                file_bytes: 2,
                seq_mib: 3,
                runs: 1,
            },
            cold_read: true,
            metrics: vec![Metric::from_runs("seq_read", vec![5.0])],
        };
        let text = serde_json::to_string(&report).unwrap();
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back.params, report.params);
        assert_eq!(back.metrics[0].median, 5.0);
        let mut table = Vec::new();
        write_comparison(&mut table, &report, &back).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.contains("1.00x"), "{table}");
    }
}
