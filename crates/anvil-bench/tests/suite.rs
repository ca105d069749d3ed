//! The whole suite at the tiny tier: every workload runs against a temporary
//! directory through the real command line, and the JSON, charts and HTML
//! report it writes are checked (never timings). As root (always in CI), the
//! same runs on file systems the harness builds: anvil over FUSE, the
//! in-process library, and ext4.

use std::path::Path;
use std::process::Command;

use anvil_bench::results::BenchResults;
use anvil_bench::workloads::NAMES;

const BENCH: &str = env!("CARGO_BIN_EXE_anvil-bench");

fn run_ok(args: &[&str]) -> String {
    let out = Command::new(BENCH).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "anvil-bench {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn check_outputs(out: &Path, workloads: &[&str], targets: &[&str]) {
    for w in workloads {
        let r = BenchResults::load(&out.join(format!("{w}.json"))).unwrap();
        assert_eq!(r.workload, *w);
        assert_eq!(r.tier, "tiny");
        assert!(r.params.is_object(), "{w}: params recorded");
        assert!(
            r.host.cpus > 0 && !r.host.kernel.is_empty(),
            "{w}: host recorded"
        );
        let labels: Vec<&str> = r.targets.iter().map(|t| t.fs.label.as_str()).collect();
        for t in targets {
            let Some(tr) = r.targets.iter().find(|x| x.fs.label.starts_with(t)) else {
                // anvil-lib skips workloads that need a mounted directory.
                assert!(*t == "anvil-lib", "{w}: target {t} missing from {labels:?}");
                continue;
            };
            assert!(tr.error.is_none(), "{w} on {t}: {:?}", tr.error);
            assert_eq!(tr.runs.len(), 1, "{w} on {t}");
            let run = &tr.runs[0];
            assert!(!run.metrics.is_empty(), "{w} on {t}: no metrics");
            assert!(
                run.metrics.iter().all(|m| m.value.is_finite()),
                "{w} on {t}: {:?}",
                run.metrics
            );
            assert_eq!(
                run.errors, 0,
                "{w} on {t}: {} errors: {}",
                run.errors, run.extra
            );
            assert!(!tr.summary.is_empty(), "{w} on {t}: no summary");
            assert_eq!(
                tr.summary.len(),
                run.metrics.len(),
                "{w} on {t}: one summary per metric"
            );
        }
        let svg = out.join(format!("{w}-io.svg"));
        let text =
            std::fs::read_to_string(&svg).unwrap_or_else(|e| panic!("{}: {e}", svg.display()));
        assert!(text.contains("<svg"), "{}", svg.display());
        let ratio = std::fs::read_dir(out)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("{w}-ratio")) && n.ends_with(".png"))
            .count();
        assert!(ratio > 0, "{w}: no ratio chart PNG in {}", out.display());
        let png = std::fs::read(out.join(format!("{w}-io.png"))).unwrap();
        assert!(
            png.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{w}-io.png is not a PNG"
        );
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for w in workloads {
        assert!(html.contains(w), "report.html lacks {w}");
    }
    assert!(html.contains("<svg"), "report.html has no charts");
}

#[test]
fn every_workload_runs_tiny_on_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let out = dir.path().join("out");
    std::fs::create_dir(&work).unwrap();
    let stdout = run_ok(&[
        "run",
        "all",
        "--dir",
        work.to_str().unwrap(),
        "--tier",
        "tiny",
        "--runs",
        "1",
        "--out",
        out.to_str().unwrap(),
    ]);
    // blogbench's own table is printed, so its parsers work on our output.
    assert!(stdout.contains("Final score for writes:"), "{stdout}");
    assert!(stdout.contains("geomean"), "{stdout}");
    check_outputs(&out, NAMES, &[""]);
    // The work directory is left as it was found.
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);

    // `report` rebuilds the page from saved results.
    let page = dir.path().join("again.html");
    let jsons: Vec<String> = NAMES
        .iter()
        .map(|w| out.join(format!("{w}.json")).display().to_string())
        .collect();
    let mut args = vec!["report"];
    args.extend(jsons.iter().map(String::as_str));
    args.extend(["-o", page.to_str().unwrap()]);
    run_ok(&args);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("proxy-cache") && html.contains("<svg"));
}

#[test]
fn wrong_arguments_get_one_line_and_a_failure() {
    for (args, want) in [
        (
            vec!["run", "nosuch", "--dir", "/tmp"],
            "unknown workload 'nosuch'",
        ),
        (
            vec!["run", "metadata", "--fs", "ntfs"],
            "unknown file system 'ntfs'",
        ),
        (
            vec!["run", "metadata", "--dir", "/tmp", "--set", "bogus=1"],
            "unknown parameter 'bogus'",
        ),
        (
            vec!["run", "metadata", "--dir", "/nonexistent/dir"],
            "/nonexistent/dir",
        ),
        (vec!["report", "/nonexistent.json"], "/nonexistent.json"),
    ] {
        let out = Command::new(BENCH).args(&args).output().unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn lib_capable_workloads_run_on_built_file_systems() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var("ANVIL_REQUIRE_FUSE").is_err(),
            "ANVIL_REQUIRE_FUSE is set but the test is not running as root"
        );
        eprintln!("SKIP: building file systems needs root");
        return;
    }
    let exe = Path::new(BENCH);
    let anvil = exe.with_file_name("anvil");
    if !anvil.exists() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "anvil-cli"])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let dir = tempfile::Builder::new()
        .prefix("anvil-bench-suite")
        .tempdir_in("/var/tmp")
        .unwrap();
    let out = dir.path().join("out");
    let stdout = run_ok(&[
        "run",
        "metadata,blogbench,proxy-cache,backup",
        "--fs",
        "anvil,anvil-lib,ext4",
        "--tier",
        "tiny",
        "--runs",
        "1",
        "--size",
        "1G",
        "--work-dir",
        dir.path().join("work").to_str().unwrap(),
        "--anvil-bin",
        anvil.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(stdout.contains("anvil-lib"), "{stdout}");
    check_outputs(
        &out,
        &["metadata", "blogbench", "proxy-cache", "backup"],
        &["anvil", "anvil-lib", "ext4"],
    );
    // Snapshots were taken on anvil, and hard links used everywhere.
    let backup = BenchResults::load(&out.join("backup.json")).unwrap();
    let anvil_run = &backup.target("anvil").unwrap().runs[0];
    assert!(
        anvil_run
            .metrics
            .iter()
            .any(|m| m.name.starts_with("snapshot_")),
        "{:?}",
        anvil_run.metrics
    );
    let ext4_run = &backup.target("ext4").unwrap().runs[0];
    assert!(!ext4_run
        .metrics
        .iter()
        .any(|m| m.name.starts_with("snapshot_")));
    assert!(ext4_run
        .metrics
        .iter()
        .any(|m| m.name.starts_with("hardlink_")));
    // Device I/O was counted on the loop devices.
    let meta = BenchResults::load(&out.join("metadata.json")).unwrap();
    for t in ["anvil", "ext4"] {
        assert!(meta.io_total(t).writes > 0, "{t}: no device writes counted");
    }
}
