//! Runs workloads over targets: for each workload and target, `runs` fresh
//! file systems (more, up to `max_runs`, while the primary metric's relative
//! spread is above the threshold, as the Phoronix Test Suite does), each
//! started with dropped caches; then summaries, JSON, tables and charts.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cgroup::{self, MemCgroup};
use crate::env::{RunEnv, RunOutput};
use crate::error::{fail, Context, Result};
use crate::results::{summarize, BenchResults, Host, TargetResult, SCHEMA_VERSION};
use crate::target::{self, Kind, Target, TargetSpec};
use crate::workloads::{self, Tier, Workload};
use crate::{chart, html};

/// Everything `anvil bench run` was asked to do.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub workloads: Vec<String>,
    pub tier: Tier,
    pub overrides: Vec<(String, String)>,
    pub targets: Vec<TargetSpec>,
    pub target: target::Config,
    pub runs: u32,
    pub max_runs: u32,
    /// Relative standard deviation above which more runs are added.
    pub rsd_threshold: f64,
    pub mem_limit: Option<u64>,
    pub baseline: Option<String>,
    pub seed: u64,
    pub out_dir: PathBuf,
    pub charts: bool,
}

/// Where the results of a `run` went.
pub struct RunSummary {
    pub results: Vec<BenchResults>,
    pub json_files: Vec<PathBuf>,
    pub report: Option<PathBuf>,
    /// Targets that failed, as "workload/target: reason".
    pub failures: Vec<String>,
}

/// Prints above the progress bars (or plainly when they are hidden).
struct Log {
    mp: MultiProgress,
    visible: bool,
}

impl Log {
    fn line(&self, msg: impl AsRef<str>) {
        if self.visible {
            let _ = self.mp.println(msg.as_ref());
        } else {
            eprintln!("{}", msg.as_ref());
        }
    }
}

pub fn host_info(mem_limit: Option<u64>, cgroup: &str, drop_caches: bool) -> Host {
    let mem_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024;
    Host {
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        mem_bytes,
        mem_limit_bytes: mem_limit,
        cgroup: cgroup.to_string(),
        drop_caches,
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn run(cfg: &RunConfig) -> Result<RunSummary> {
    if cfg.targets.iter().any(TargetSpec::needs_root) && !is_root() {
        return fail(
            "--fs targets are built on loop devices and need root; run as root, or use --dir PATH",
        );
    }
    let built: Vec<Box<dyn Workload>> = cfg
        .workloads
        .iter()
        .map(|w| workloads::by_name(w, cfg.tier, &cfg.overrides))
        .collect::<Result<_>>()?;
    for w in &built {
        if let Some(need) = w.min_fs_bytes() {
            let made = cfg.targets.iter().any(TargetSpec::needs_root);
            if made && need > cfg.target.size_bytes {
                return fail(format!(
                    "{} needs a file system of at least {} MiB with these parameters; --size is {} MiB",
                    w.name(),
                    need >> 20,
                    cfg.target.size_bytes >> 20
                ));
            }
        }
    }
    // Targets built here live in the work directory, one run at a time.
    let _work_dir = match cfg.targets.iter().any(TargetSpec::needs_root) {
        true => Some(target::lock_work_dir(&cfg.target.work_dir)?),
        false => None,
    };
    std::fs::create_dir_all(&cfg.out_dir).ctx(|| format!("mkdir {}", cfg.out_dir.display()))?;
    let group = match cfg.mem_limit {
        Some(limit) => Some(MemCgroup::join_new(limit)?),
        None => None,
    };
    let cgroup_name = match &group {
        Some(g) => g.version(),
        None => "none",
    };
    let host = host_info(cfg.mem_limit, cgroup_name, cfg.target.drop_caches);

    let visible = std::io::stderr().is_terminal();
    let mp = MultiProgress::with_draw_target(if visible {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    let log = Log {
        mp: mp.clone(),
        visible,
    };
    let total: u64 = built.len() as u64 * cfg.targets.len() as u64 * cfg.runs as u64;
    let overall = mp.add(ProgressBar::new(total));
    overall.set_style(
        ProgressStyle::with_template(
            "{prefix:>12.bold} [{bar:30}] {pos}/{len} runs  {elapsed_precise}  {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    overall.set_prefix("anvil bench");
    let step = mp.add(ProgressBar::new(0));
    step.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len}  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );

    let mut summary = RunSummary {
        results: Vec::new(),
        json_files: Vec::new(),
        report: None,
        failures: Vec::new(),
    };
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for w in &built {
        let baseline = cfg
            .baseline
            .clone()
            .or_else(|| {
                cfg.targets
                    .iter()
                    .find(|t| t.label == "ext4")
                    .map(|t| t.label.clone())
            })
            .unwrap_or_else(|| cfg.targets[0].label.clone());
        let mut results = BenchResults {
            schema_version: SCHEMA_VERSION,
            suite_version: env!("CARGO_PKG_VERSION").into(),
            workload: w.name().into(),
            tier: cfg.tier.name().into(),
            params: w.params(),
            runs_per_target: cfg.runs,
            seed: cfg.seed,
            baseline,
            host: host.clone(),
            started_unix,
            targets: Vec::new(),
        };
        for spec in &cfg.targets {
            if spec.kind == Kind::AnvilLib && !w.lib_capable() {
                log.line(format!(
                    "{}: skipping anvil-lib (this workload needs a mounted directory)",
                    w.name()
                ));
                overall.inc(cfg.runs as u64);
                continue;
            }
            let t0 = Instant::now();
            let kills = group.as_ref().map_or(0, MemCgroup::oom_kills);
            let mut tr = run_target(w.as_ref(), spec, cfg, &overall, &step, &log);
            let killed = group
                .as_ref()
                .map_or(0, MemCgroup::oom_kills)
                .saturating_sub(kills);
            // A daemon the OOM killer took shows first as the errors of what followed.
            if let (Some(e), 1..) = (&mut tr.error, killed) {
                *e =
                    format!("the memory limit's OOM killer killed {killed} process(es); then: {e}");
            }
            match &tr.error {
                Some(e) => {
                    log.line(format!("{} on {}: FAILED: {e}", w.name(), spec.label));
                    summary
                        .failures
                        .push(format!("{}/{}: {e}", w.name(), spec.label));
                }
                None => log.line(format!(
                    "{} on {}: {} runs in {:.0} s",
                    w.name(),
                    spec.label,
                    tr.runs.len(),
                    t0.elapsed().as_secs_f64()
                )),
            }
            results.targets.push(tr);
        }
        let json = cfg.out_dir.join(format!("{}.json", w.name()));
        results.save(&json)?;
        summary.json_files.push(json);
        print_tables(&results);
        if cfg.charts {
            match chart::render_all(&results, &cfg.out_dir) {
                Ok(files) => log.line(format!(
                    "{}: {} chart files in {}",
                    w.name(),
                    files.len(),
                    cfg.out_dir.display()
                )),
                Err(e) => log.line(format!("{}: charts: {e}", w.name())),
            }
        }
        summary.results.push(results);
    }
    step.finish_and_clear();
    overall.finish_and_clear();
    let report = cfg.out_dir.join("report.html");
    html::write_report(&summary.results, &report)?;
    summary.report = Some(report);
    if let Some(g) = &group {
        if let Some(peak) = g.peak_bytes() {
            eprintln!(
                "memory cgroup ({}): peak {} MiB of {} MiB",
                g.version(),
                peak >> 20,
                cfg.mem_limit.unwrap_or(0) >> 20
            );
        }
    }
    drop(group);
    if cgroup::memory_controller().is_none() && cfg.mem_limit.is_some() {
        eprintln!("note: no memory controller; the limit was not applied");
    }
    Ok(summary)
}

/// All runs of one workload on one target. Failures end the target's runs
/// and are recorded in the result, keeping the runs that completed.
fn run_target(
    w: &dyn Workload,
    spec: &TargetSpec,
    cfg: &RunConfig,
    overall: &ProgressBar,
    step: &ProgressBar,
    log: &Log,
) -> TargetResult {
    let mut tr = TargetResult {
        fs: Default::default(),
        runs: Vec::new(),
        summary: Vec::new(),
        error: None,
    };
    let mut run = 0u32;
    loop {
        let enough = run >= cfg.runs
            && (run >= cfg.max_runs || {
                let s = summarize(&tr.runs);
                s.first().is_none_or(|m| m.rsd() <= cfg.rsd_threshold)
            });
        if enough {
            break;
        }
        if run >= cfg.runs {
            overall.inc_length(1);
            log.line(format!(
                "{} on {}: spread above {:.1}%, adding run {}",
                w.name(),
                spec.label,
                cfg.rsd_threshold * 100.0,
                run + 1
            ));
        }
        overall.set_message(format!("{} on {} (run {})", w.name(), spec.label, run + 1));
        step.reset();
        step.set_length(0);
        step.set_prefix(spec.label.clone());
        step.set_message("setting up");
        match one_run(w, spec, cfg, run, step) {
            Ok((out, info)) => {
                tr.fs = info;
                tr.runs.push(out);
            }
            Err(e) => {
                tr.error = Some(e.to_string());
                overall.inc(cfg.runs.saturating_sub(run) as u64);
                break;
            }
        }
        overall.inc(1);
        run += 1;
    }
    if tr.fs.label.is_empty() {
        tr.fs.label = spec.label.clone();
    }
    tr.summary = summarize(&tr.runs);
    tr
}

/// How `spec` is built for workload `w`: the run's settings, with the workload's cache for
/// anvil's FUSE daemon under the memory limit unless `--anvil-cache` named one.
fn target_config(w: &dyn Workload, spec: &TargetSpec, cfg: &RunConfig) -> target::Config {
    let daemon = matches!(
        spec.kind,
        Kind::Anvil | Kind::AnvilNoHistory | Kind::AnvilZstd | Kind::AnvilS3
    );
    let given = cfg.target.anvil_cache_given;
    let cache = match (daemon, given, cfg.mem_limit, cfg.target.anvil_cache) {
        (true, false, Some(limit), Some(default)) => w.anvil_daemon_cache(limit, default),
        _ => None,
    };
    target::Config {
        anvil_cache: cache.or(cfg.target.anvil_cache),
        ..cfg.target.clone()
    }
}

fn one_run(
    w: &dyn Workload,
    spec: &TargetSpec,
    cfg: &RunConfig,
    run: u32,
    step: &ProgressBar,
) -> Result<(RunOutput, crate::results::FsInfo)> {
    let target = Target::setup(spec, &target_config(w, spec, cfg), run)?;
    let vfs = target.vfs()?;
    use crate::env::Probe;
    target.drop_caches()?;
    step.set_message(w.name());
    let env = RunEnv {
        dir: target.workdir().map(|p| p.to_path_buf()),
        vfs: vfs.as_ref(),
        probe: &target,
        fs_label: spec.label.clone(),
        fs_type: target.info.fs_type.clone(),
        seed: cfg.seed.wrapping_add(run as u64),
        run,
        mem_limit: cfg.mem_limit,
        progress: step,
    };
    let io0 = target.io();
    let t0 = Instant::now();
    let out = w.run(&env).and_then(|mut out| {
        target.sync()?;
        out.wall_s = Some(t0.elapsed().as_secs_f64());
        out.io_total = Some(target.io().since(&io0));
        Ok(out)
    });
    drop(vfs);
    let info = target.info.clone();
    let torn = target.teardown();
    let out = out?;
    torn?;
    Ok((out, info))
}

/// The terminal tables of one workload: the workload's own text for each
/// target (blogbench's, iozone's), then the summary and disk I/O tables.
pub fn print_tables(results: &BenchResults) {
    println!();
    println!(
        "=== {} ({} tier, {} run(s) per target, baseline {}) ===",
        results.workload, results.tier, results.runs_per_target, results.baseline
    );
    for t in &results.targets {
        if let Some(run) = t.runs.first() {
            if !run.text.trim().is_empty() {
                println!("--- {} (run 1) ---", t.fs.label);
                println!("{}", run.text.trim_end());
            }
        }
    }
    println!();
    print!("{}", chart::summary_table_text(results));
    println!();
    print!("{}", chart::io_table_text(results));
    for t in &results.targets {
        if let Some(e) = &t.error {
            println!("{}: FAILED: {e}", t.fs.label);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workload_sizes_the_daemons_cache_unless_told() {
        let overrides = vec![("config".to_string(), "8g-256m".to_string())];
        let w = crate::workloads::by_name("proxy-cache", Tier::Quick, &overrides).unwrap();
        let targets = target::parse_targets(Some("anvil,anvil-lib,ext4"), &[]).unwrap();
        let mut cfg = RunConfig {
            workloads: vec!["proxy-cache".into()],
            tier: Tier::Quick,
            overrides,
            targets: targets.clone(),
            target: target::Config {
                size_bytes: 3 << 30,
                work_dir: PathBuf::from("/nonexistent"),
                anvil_bin: PathBuf::from("anvil"),
                anvil_cache: Some(64 << 20),
                anvil_cache_given: false,
                drop_caches: false,
            },
            runs: 1,
            max_runs: 1,
            rsd_threshold: 0.1,
            mem_limit: Some(256 << 20),
            baseline: None,
            seed: 1,
            out_dir: PathBuf::from("/nonexistent"),
            charts: false,
        };
        let cache =
            |cfg: &RunConfig, i: usize| target_config(w.as_ref(), &targets[i], cfg).anvil_cache;
        // The mount's daemon gets the workload's share; the library keeps the default.
        assert_eq!(cache(&cfg, 0), Some(48 << 20));
        assert_eq!(cache(&cfg, 1), Some(64 << 20));
        assert_eq!(cache(&cfg, 2), Some(64 << 20));
        // `--anvil-cache` wins.
        cfg.target.anvil_cache_given = true;
        assert_eq!(cache(&cfg, 0), Some(64 << 20));
    }
}
