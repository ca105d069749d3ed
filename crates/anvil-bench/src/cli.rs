//! The `anvil bench` command line (also the `anvil-bench` binary).

use std::path::PathBuf;

use clap::{Args, Subcommand};

use crate::error::{fail, BenchError, Result};
use crate::results::BenchResults;
use crate::runner::{self, RunConfig};
use crate::target::{self, FS_NAMES};
use crate::workloads::{self, parse_override, Tier, NAMES};
use crate::{chart, html, quick, report};

#[derive(Debug, Args)]
#[command(about = "Benchmark anvil and other file systems side by side")]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Run workloads on file systems built on identical loop devices (or on --dir).
    Run(RunArgs),
    /// Turn saved results (JSON) into one HTML page with charts, and print their tables.
    Report(ReportArgs),
    /// List the workloads and their parameters for a tier.
    List {
        /// Tier whose defaults to show.
        #[arg(long, value_enum, default_value = "standard")]
        tier: Tier,
    },
    /// blogbench 1.1 on one directory, with its original options and output.
    Blogbench(workloads::blogbench::BlogbenchArgs),
    /// Show that the harness is not the bottleneck: each workload's own code
    /// path against a minimal loop of the same system calls, on DIR (use tmpfs).
    Overhead {
        /// An empty directory, ideally on tmpfs.
        #[arg(long)]
        dir: PathBuf,
        /// Files (metadata) and blogs (blogbench) per measurement.
        #[arg(long, default_value_t = 20_000)]
        files: u32,
        #[arg(long, default_value_t = 30)]
        blogs: u32,
        /// Repetitions; the median is reported.
        #[arg(long, default_value_t = 5)]
        runs: u32,
    },
    /// Small-file and sequential I/O micro-benchmark on one directory.
    Quick(quick::QuickArgs),
    /// Compare two `quick --json` reports: candidate / baseline per metric.
    Compare {
        baseline: PathBuf,
        candidate: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Workloads, comma-separated, or "all": metadata, blogbench, iozone,
    /// proxy-cache, nightly-build, backup, mirror.
    #[arg(value_name = "WORKLOADS")]
    pub workloads: String,
    /// File systems to build, each on its own loop device of --size:
    /// anvil, anvil-lib (in-process library), anvil-s3 (on the object store that the AWS_* variables and ANVIL_S3_BUCKET name), ext4, xfs, btrfs, btrfs-zstd, zfs-fuse, tmpfs.
    #[arg(long = "fs", value_name = "LIST")]
    pub fs: Option<String>,
    /// Also (or only) run in a fresh subdirectory of this mounted directory.
    #[arg(long, value_name = "PATH")]
    pub dir: Vec<PathBuf>,
    /// Size tier of every workload.
    #[arg(long, value_enum, default_value = "quick")]
    pub tier: Tier,
    /// Override a workload parameter (see `anvil bench list`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_override)]
    pub set: Vec<(String, String)>,
    /// Runs per target (each on a freshly made file system).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Add runs up to this many while the first metric's relative spread exceeds --max-rsd.
    #[arg(long)]
    pub max_runs: Option<u32>,
    /// Relative standard deviation (percent) that triggers extra runs.
    #[arg(long, default_value_t = 3.5)]
    pub max_rsd: f64,
    /// Memory limit (cgroup) for the workload and the file-system daemons, e.g. 1G.
    #[arg(long, value_parser = parse_size)]
    pub mem_limit: Option<u64>,
    /// Size of every loop device.
    #[arg(long, value_parser = parse_size, default_value = "8G")]
    pub size: u64,
    /// Target that ratios are computed against (default: ext4 if present, else the first).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Directory for results.json, charts and report.html (default: bench-results/<time>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Seed of every random choice (run i uses seed + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where loop-device backing files and mount points go.
    #[arg(long, default_value = "/var/tmp/anvil-bench")]
    pub work_dir: PathBuf,
    /// The anvil binary for mkfs and mount (default: this program, or `anvil` next to it).
    #[arg(long)]
    pub anvil_bin: Option<PathBuf>,
    /// anvil's cache budget (-o cache=), e.g. 256M. Under --mem-limit it defaults to a
    /// quarter of the limit, or to less for an anvil mount's daemon where the workload keeps
    /// much of the limit itself (proxy-cache's memory cache).
    #[arg(long, value_parser = parse_size)]
    pub anvil_cache: Option<u64>,
    /// Do not drop caches between phases.
    #[arg(long)]
    pub no_drop_caches: bool,
    /// Skip SVG/PNG charts.
    #[arg(long)]
    pub no_charts: bool,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Results files written by `anvil bench run`.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// The HTML page to write.
    #[arg(short, long, default_value = "report.html")]
    pub output: PathBuf,
    /// Also write SVG and PNG charts into this directory.
    #[arg(long)]
    pub charts: Option<PathBuf>,
    /// Target that ratios are computed against (default: each file's own baseline).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Write the (merged) results as <workload>.json into this directory.
    #[arg(long)]
    pub save: Option<PathBuf>,
}

/// Merges results of the same workload from several files into one, so that
/// targets run at different times can be compared side by side. A target that
/// failed in one file is replaced by a successful run of it from another.
pub fn merge_results(all: Vec<BenchResults>) -> Vec<BenchResults> {
    let mut out: Vec<BenchResults> = Vec::new();
    for r in all {
        let Some(m) = out.iter_mut().find(|m| m.workload == r.workload) else {
            out.push(r);
            continue;
        };
        if m.params != r.params || m.tier != r.tier {
            eprintln!(
                "note: merging {} results with different parameters ({} and {} tier)",
                r.workload, m.tier, r.tier
            );
        }
        for t in r.targets {
            match m.targets.iter().position(|x| x.fs.label == t.fs.label) {
                Some(i) if m.targets[i].error.is_some() && t.error.is_none() => m.targets[i] = t,
                Some(_) => eprintln!(
                    "note: {} on {} appears twice; keeping the first",
                    r.workload, t.fs.label
                ),
                None => m.targets.push(t),
            }
        }
    }
    out
}

/// Parses sizes like 512M, 8G, 1GiB, 4096 (bytes).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: f64 = num.parse().map_err(|_| format!("bad size '{s}'"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("bad size unit in '{s}' (use K, M, G or T)")),
    };
    let bytes = n * mult as f64;
    if !(1.0..=(u64::MAX as f64)).contains(&bytes) {
        return Err(format!("size '{s}' out of range"));
    }
    Ok(bytes as u64)
}

fn default_anvil_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("anvil"));
    if exe.file_name().is_some_and(|n| n == "anvil") {
        exe
    } else {
        exe.with_file_name("anvil")
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run_cmd(args: &RunArgs) -> Result<()> {
    let workloads: Vec<String> = if args.workloads == "all" {
        NAMES.iter().map(|s| s.to_string()).collect()
    } else {
        args.workloads
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
    };
    for w in &workloads {
        if !NAMES.contains(&w.as_str()) {
            return fail(format!(
                "unknown workload '{w}' (known: {}, or all)",
                NAMES.join(", ")
            ));
        }
    }
    let targets = target::parse_targets(args.fs.as_deref(), &args.dir)?;
    if let Some(b) = &args.baseline {
        if !targets.iter().any(|t| &t.label == b) {
            return fail(format!(
                "--baseline {b} is not one of the targets ({})",
                targets
                    .iter()
                    .map(|t| t.label.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    let out_dir = args.out.clone().unwrap_or_else(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        PathBuf::from(format!("bench-results/{secs}"))
    });
    let drop_caches = !args.no_drop_caches && is_root();
    if !args.no_drop_caches && !is_root() {
        eprintln!("note: not root, so caches are not dropped between phases");
    }
    let cfg = RunConfig {
        workloads,
        tier: args.tier,
        overrides: args.set.clone(),
        targets,
        target: target::Config {
            size_bytes: args.size,
            work_dir: args.work_dir.clone(),
            anvil_bin: args.anvil_bin.clone().unwrap_or_else(default_anvil_bin),
            anvil_cache: args
                .anvil_cache
                .or_else(|| args.mem_limit.map(anvil_cache_for)),
            anvil_cache_given: args.anvil_cache.is_some(),
            drop_caches,
        },
        runs: args.runs,
        max_runs: args.max_runs.unwrap_or(args.runs).max(args.runs),
        rsd_threshold: args.max_rsd / 100.0,
        mem_limit: args.mem_limit,
        baseline: args.baseline.clone(),
        seed: args.seed,
        out_dir,
        charts: !args.no_charts,
    };
    let summary = runner::run(&cfg)?;
    println!();
    for f in &summary.json_files {
        println!("results: {}", f.display());
    }
    if let Some(r) = &summary.report {
        println!("report:  {}", r.display());
    }
    if !summary.failures.is_empty() {
        return fail(format!(
            "{} target run(s) failed: {}",
            summary.failures.len(),
            summary.failures.join("; ")
        ));
    }
    Ok(())
}

fn report_cmd(args: &ReportArgs) -> Result<()> {
    let loaded: Vec<BenchResults> = args
        .results
        .iter()
        .map(|p| BenchResults::load(p))
        .collect::<Result<_>>()?;
    let mut results = merge_results(loaded);
    if let Some(b) = &args.baseline {
        for r in &mut results {
            if r.target(b).is_none() {
                return fail(format!("--baseline {b} is not a target of {}", r.workload));
            }
            r.baseline = b.clone();
        }
    }
    if let Some(dir) = &args.save {
        std::fs::create_dir_all(dir).map_err(|e| BenchError(format!("{}: {e}", dir.display())))?;
        for r in &results {
            r.save(&dir.join(format!("{}.json", r.workload)))?;
        }
    }
    for r in &results {
        runner::print_tables(r);
        if let Some(dir) = &args.charts {
            std::fs::create_dir_all(dir)
                .map_err(|e| BenchError(format!("{}: {e}", dir.display())))?;
            let files = chart::render_all(r, dir)?;
            eprintln!(
                "{}: {} chart files in {}",
                r.workload,
                files.len(),
                dir.display()
            );
        }
    }
    html::write_report(&results, &args.output)?;
    println!("report: {}", args.output.display());
    Ok(())
}

/// anvil's cache budget under a memory limit when `--anvil-cache` does not say: a quarter
/// of the limit, between 16 MiB and the mount's default of 256 MiB (the limit also holds
/// the workload, the kernel's page cache and, for anvil-lib, the process itself). A
/// workload may give a mount's daemon less (`Workload::anvil_daemon_cache`).
fn anvil_cache_for(mem_limit: u64) -> u64 {
    (mem_limit / 4).clamp(16 << 20, 256 << 20)
}

fn list_cmd(tier: Tier) -> Result<()> {
    println!(
        "workloads ({} tier defaults; override with --set KEY=VALUE):",
        tier.name()
    );
    for name in NAMES {
        let w = workloads::by_name(name, tier, &[])?;
        let lib = if w.lib_capable() {
            ", also anvil-lib"
        } else {
            ""
        };
        println!("\n{name}{lib}");
        if let Some(obj) = w.params().as_object() {
            for (k, v) in obj {
                println!("  {k:<28} {v}");
            }
        }
    }
    println!(
        "\nhummingbird (proxy-cache in the regimes of Hummingbird's Table 2: disk-bound, \
         files over 64 KiB not cached; --set scale=F shrinks disk and trace, not memory)"
    );
    for (name, disk, memory) in workloads::proxy::HUMMINGBIRD_CONFIGS {
        println!(
            "  {name:<8} anvil bench run proxy-cache --set config={name} --mem-limit {}M \
             --size {}G --fs ext4,xfs,btrfs,zfs-fuse,anvil,anvil-lib",
            memory >> 20,
            // Three times the cache: ext4 makes one inode per 16 KiB, and a cache of
            // 6 KB objects needs one per 6 KB.
            (disk >> 30) * 3
        );
    }
    println!("\nfile systems (--fs): {}", FS_NAMES.join(", "));
    Ok(())
}

fn overhead_cmd(dir: &std::path::Path, files: u32, blogs: u32, runs: u32) -> Result<()> {
    use crate::results::median;
    let mut rows: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    let mut add = |name: String, h: f64, r: f64| match rows.iter_mut().find(|x| x.0 == name) {
        Some(row) => {
            row.1.push(h);
            row.2.push(r);
        }
        None => rows.push((name, vec![h], vec![r])),
    };
    for _ in 0..runs.max(1) {
        for (phase, h, r) in workloads::metadata::overhead_pair(dir, files)? {
            add(format!("metadata {phase}"), h, r);
        }
        let (h, r) = workloads::blogbench::overhead_pair(dir, blogs)?;
        add("blogbench files".into(), h, r);
    }
    println!(
        "{:<24} {:>14} {:>14} {:>8}",
        "operation", "harness ops/s", "raw ops/s", "ratio"
    );
    for (name, h, r) in rows {
        let (h, r) = (median(&h), median(&r));
        println!("{name:<24} {h:>14.0} {r:>14.0} {:>7.2}x", h / r);
    }
    Ok(())
}

/// Runs one `anvil bench` subcommand.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Run(a) => run_cmd(&a),
        BenchCommand::Report(a) => report_cmd(&a),
        BenchCommand::List { tier } => list_cmd(tier),
        BenchCommand::Blogbench(a) => workloads::blogbench::standalone(&a),
        BenchCommand::Overhead {
            dir,
            files,
            blogs,
            runs,
        } => overhead_cmd(&dir, files, blogs, runs),
        BenchCommand::Quick(a) => quick::run(&a),
        BenchCommand::Compare {
            baseline,
            candidate,
        } => report::compare(&baseline, &candidate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(workload: &str, targets: &[(&str, bool)]) -> BenchResults {
        use crate::results::{FsInfo, TargetResult};
        BenchResults {
            schema_version: crate::results::SCHEMA_VERSION,
            suite_version: "t".into(),
            workload: workload.into(),
            tier: "tiny".into(),
            params: serde_json::json!({}),
            runs_per_target: 1,
            seed: 1,
            baseline: targets[0].0.into(),
            host: Default::default(),
            started_unix: 0,
            targets: targets
                .iter()
                .map(|(label, ok)| TargetResult {
                    fs: FsInfo {
                        label: label.to_string(),
                        ..Default::default()
                    },
                    runs: Vec::new(),
                    summary: Vec::new(),
                    error: (!ok).then(|| "failed".to_string()),
                })
                .collect(),
        }
    }

    #[test]
    fn merging_fills_in_failed_and_missing_targets() {
        let merged = merge_results(vec![
            result("metadata", &[("ext4", true), ("zfs-fuse", false)]),
            result("iozone", &[("ext4", true)]),
            result(
                "metadata",
                &[("zfs-fuse", true), ("ext4", false), ("xfs", true)],
            ),
        ]);
        assert_eq!(merged.len(), 2);
        let m = &merged[0];
        let labels: Vec<_> = m
            .targets
            .iter()
            .map(|t| (t.fs.label.as_str(), t.error.is_none()))
            .collect();
        assert_eq!(
            labels,
            vec![("ext4", true), ("zfs-fuse", true), ("xfs", true)]
        );
        assert_eq!(m.baseline, "ext4");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }
}
