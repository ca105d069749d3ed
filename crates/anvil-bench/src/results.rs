//! The results file: every raw sample, the exact parameters and conditions,
//! and per-metric summaries (median and spread) for each target.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::env::{IoCounters, Metric, RunOutput};
use crate::error::{BenchError, Context, Result};

/// Bumped when the JSON layout changes incompatibly.
pub const SCHEMA_VERSION: u32 = 1;

/// One `anvil bench run` of one workload over several targets.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchResults {
    pub schema_version: u32,
    pub suite_version: String,
    pub workload: String,
    pub tier: String,
    /// The workload's parameters exactly as run.
    pub params: serde_json::Value,
    pub runs_per_target: u32,
    pub seed: u64,
    /// Label of the target ratios are computed against.
    pub baseline: String,
    pub host: Host,
    /// Unix time the run started.
    pub started_unix: u64,
    pub targets: Vec<TargetResult>,
}

/// The machine and conditions.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Host {
    pub kernel: String,
    pub cpus: usize,
    pub mem_bytes: u64,
    /// Memory limit of the cgroup the workload and daemons ran in.
    pub mem_limit_bytes: Option<u64>,
    /// "v1", "v2" or "none".
    pub cgroup: String,
    /// Whether caches were dropped between phases.
    pub drop_caches: bool,
}

/// How a target was built.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FsInfo {
    /// e.g. "btrfs-zstd".
    pub label: String,
    /// e.g. "btrfs".
    pub fs_type: String,
    /// The mkfs command, if the harness made the file system.
    pub mkfs: Option<String>,
    pub mount_opts: Option<String>,
    /// Block device(s) sampled for I/O counts, e.g. ["loop3"].
    pub devices: Vec<String>,
    pub size_bytes: u64,
    pub path: Option<String>,
    /// How an anvil mount's daemon talks to the kernel ("uring" or "classic"), as
    /// `anvil stats` reports it: FUSE over io_uring is used only where the kernel allows
    /// it (`/sys/module/fuse/parameters/enable_uring`), so two runs of one command on two
    /// machines may differ here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
}

/// All runs on one target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetResult {
    pub fs: FsInfo,
    pub runs: Vec<RunOutput>,
    pub summary: Vec<MetricSummary>,
    /// Set when the target could not be set up or a run failed; runs so far are kept.
    pub error: Option<String>,
}

/// One metric over the runs of one target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricSummary {
    pub name: String,
    pub unit: String,
    pub higher_is_better: bool,
    pub n: usize,
    pub median: f64,
    pub mean: f64,
    pub stddev: f64,
    pub min: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl MetricSummary {
    /// Relative standard deviation (stddev / mean), 0 when the mean is 0.
    pub fn rsd(&self) -> f64 {
        if self.mean == 0.0 {
            0.0
        } else {
            self.stddev / self.mean.abs()
        }
    }
}

/// Median of unsorted values (NaN when empty).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Geometric mean of positive values (NaN when there are none).
pub fn geomean(values: &[f64]) -> f64 {
    let logs: Vec<f64> = values
        .iter()
        .filter(|v| v.is_finite() && **v > 0.0)
        .map(|v| v.ln())
        .collect();
    if logs.is_empty() {
        f64::NAN
    } else {
        (logs.iter().sum::<f64>() / logs.len() as f64).exp()
    }
}

/// Summarises each metric over runs, in the order metrics first appear.
pub fn summarize(runs: &[RunOutput]) -> Vec<MetricSummary> {
    let mut order: Vec<&Metric> = Vec::new();
    for run in runs {
        for m in &run.metrics {
            if !order.iter().any(|o| o.name == m.name) {
                order.push(m);
            }
        }
    }
    order
        .into_iter()
        .map(|first| {
            let samples: Vec<f64> = runs
                .iter()
                .filter_map(|r| r.metrics.iter().find(|m| m.name == first.name))
                .map(|m| m.value)
                .collect();
            let n = samples.len();
            let mean = samples.iter().sum::<f64>() / n as f64;
            let var = if n > 1 {
                samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
            } else {
                0.0
            };
            MetricSummary {
                name: first.name.clone(),
                unit: first.unit.clone(),
                higher_is_better: first.higher_is_better,
                n,
                median: median(&samples),
                mean,
                stddev: var.sqrt(),
                min: samples.iter().copied().fold(f64::INFINITY, f64::min),
                max: samples.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                samples,
            }
        })
        .collect()
}

/// Speed-up of `value` over `base`: above 1 is better, whichever way the
/// metric points (value/base when higher is better, base/value otherwise).
pub fn ratio(value: f64, base: f64, higher_is_better: bool) -> f64 {
    if higher_is_better {
        value / base
    } else {
        base / value
    }
}

impl BenchResults {
    pub fn target(&self, label: &str) -> Option<&TargetResult> {
        self.targets.iter().find(|t| t.fs.label == label)
    }

    /// Ratio of each target's median to the baseline's, per metric, for
    /// metrics both have: (metric, [(target label, ratio)]).
    pub fn ratios(&self) -> Vec<(String, Vec<(String, f64)>)> {
        let Some(base) = self.target(&self.baseline) else {
            return Vec::new();
        };
        base.summary
            .iter()
            .map(|bm| {
                let row = self
                    .targets
                    .iter()
                    .filter_map(|t| {
                        let m = t.summary.iter().find(|m| m.name == bm.name)?;
                        let r = ratio(m.median, bm.median, bm.higher_is_better);
                        r.is_finite().then(|| (t.fs.label.clone(), r))
                    })
                    .collect();
                (bm.name.clone(), row)
            })
            .collect()
    }

    /// Geometric mean of each target's ratios over all metrics.
    pub fn geomeans(&self) -> Vec<(String, f64)> {
        let ratios = self.ratios();
        self.targets
            .iter()
            .map(|t| {
                let rs: Vec<f64> = ratios
                    .iter()
                    .filter_map(|(_, row)| row.iter().find(|(l, _)| *l == t.fs.label).map(|x| x.1))
                    .collect();
                (t.fs.label.clone(), geomean(&rs))
            })
            .collect()
    }

    /// Device I/O summed over all runs of a target: each run's total when the
    /// harness measured it (including the sync at its end), else its phases.
    pub fn io_total(&self, label: &str) -> IoCounters {
        let mut total = IoCounters::default();
        if let Some(t) = self.target(label) {
            for run in &t.runs {
                match &run.io_total {
                    Some(io) => total = total.add(io),
                    None => {
                        for p in &run.phases {
                            total = total.add(&p.io);
                        }
                    }
                }
            }
        }
        total
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| BenchError(e.to_string()))?;
        fs::write(path, text + "\n").ctx(|| format!("write {}", path.display()))
    }

    pub fn load(path: &Path) -> Result<BenchResults> {
        let text = fs::read_to_string(path).ctx(|| format!("read {}", path.display()))?;
        let r: BenchResults = serde_json::from_str(&text).map_err(|e| {
            BenchError(format!(
                "{}: not an anvil bench results file: {e}",
                path.display()
            ))
        })?;
        if r.schema_version != SCHEMA_VERSION {
            return crate::error::fail(format!(
                "{}: results schema {} (this anvil reads {SCHEMA_VERSION})",
                path.display(),
                r.schema_version
            ));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(v: f64) -> RunOutput {
        RunOutput {
            metrics: vec![
                Metric::higher("ops", "ops/s", v),
                Metric::lower("time", "s", v),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn summary_and_ratios() {
        let s = summarize(&[run(1.0), run(3.0), run(2.0)]);
        assert_eq!(s[0].median, 2.0);
        assert_eq!(s[0].min, 1.0);
        assert_eq!(s[0].max, 3.0);
        assert!((s[0].stddev - 1.0).abs() < 1e-12);
        assert_eq!(ratio(4.0, 2.0, true), 2.0);
        assert_eq!(ratio(4.0, 2.0, false), 0.5);
        assert!((geomean(&[2.0, 8.0]) - 4.0).abs() < 1e-12);
        assert!(median(&[]).is_nan());
    }
}
