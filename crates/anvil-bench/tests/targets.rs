//! Every kind of target can be made, used through its Vfs, measured, snapshotted
//! (where the file system has snapshots) and torn down without leaving mounts or
//! loop devices behind. Needs root (loop devices, mount); says so and skips otherwise,
//! unless ANVIL_REQUIRE_FUSE=1 (as in CI), where skipping is a failure.

use std::path::PathBuf;

use anvil_bench::env::Probe;
use anvil_bench::target::{parse_targets, Config, Kind, Target};

fn root_or_skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(
            std::env::var("ANVIL_REQUIRE_FUSE").is_err(),
            "ANVIL_REQUIRE_FUSE is set but the test is not running as root"
        );
        eprintln!("SKIP: target tests need root (loop devices and mounts)");
    }
    root
}

fn anvil_bin() -> PathBuf {
    // Built by cargo for this test run (anvil-cli is in the workspace).
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap();
    let bin = dir.join("anvil");
    if !bin.exists() {
        let status = std::process::Command::new(env!("CARGO"))
            .args(["build", "-q", "-p", "anvil-cli"])
            .status()
            .unwrap();
        assert!(status.success(), "cargo build -p anvil-cli failed");
    }
    bin
}

fn loops() -> String {
    String::from_utf8(
        std::process::Command::new("losetup")
            .arg("-a")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
}

#[test]
fn every_target_kind_builds_measures_and_tears_down() {
    if !root_or_skip() {
        return;
    }
    let work = tempfile::Builder::new()
        .prefix("anvil-bench-targets")
        .tempdir_in("/var/tmp")
        .unwrap();
    let cfg = Config {
        size_bytes: 512 << 20,
        work_dir: work.path().to_path_buf(),
        anvil_bin: anvil_bin(),
        anvil_cache: Some(64 << 20),
        anvil_cache_given: true,
        drop_caches: true,
    };
    let have = |cmd: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {cmd}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    let mut list = vec!["anvil", "anvil-lib", "ext4", "tmpfs"];
    for (fs, tool) in [
        ("xfs", "mkfs.xfs"),
        ("btrfs", "mkfs.btrfs"),
        ("btrfs-zstd", "mkfs.btrfs"),
        ("zfs-fuse", "zpool"),
    ] {
        if have(tool) {
            list.push(fs);
        } else {
            eprintln!("note: {tool} missing, not testing {fs} (scripts/setup.sh installs it)");
        }
    }
    let specs = parse_targets(Some(&list.join(",")), &[]).unwrap();
    for spec in &specs {
        eprintln!("target {}", spec.label);
        let t = Target::setup(spec, &cfg, 0).unwrap_or_else(|e| panic!("{}: {e}", spec.label));
        if spec.kind == Kind::Anvil {
            // The results say which transport the mount served over: io_uring exactly when
            // the kernel allows it.
            let uring = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
                .is_ok_and(|v| v.trim() == "Y");
            let expect = if uring { "uring" } else { "classic" };
            assert_eq!(t.info.transport.as_deref(), Some(expect), "anvil transport");
        } else {
            assert_eq!(t.info.transport, None, "{}: no anvil transport", spec.label);
        }
        {
            let vfs = t.vfs().unwrap();
            vfs.mkdir("d", 0o755).unwrap();
            let data = vec![0x5a_u8; 1 << 20];
            let mut f = vfs.create("d/f", 0o644).unwrap();
            f.write_all(&data).unwrap();
            f.fsync().unwrap();
            drop(f);
            let before = t.io();
            t.drop_caches().unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let mut f = vfs.open_read("d/f").unwrap();
            let mut got = 0;
            loop {
                let n = f.read(&mut buf[got..]).unwrap();
                if n == 0 {
                    break;
                }
                got += n;
            }
            assert_eq!(got, data.len(), "{}", spec.label);
            assert_eq!(buf, data, "{}", spec.label);
            assert_eq!(vfs.stat_size("d/f").unwrap(), 1 << 20);
            assert_eq!(vfs.read_dir("d").unwrap(), vec!["f".to_string()]);
            if spec.kind != Kind::Tmpfs {
                let io = t.io().since(&before);
                assert!(
                    io.reads > 0,
                    "{}: a cold read after drop_caches reached no device: {io:?}",
                    spec.label
                );
            }
            assert!(t.used_bytes().unwrap() > 0, "{}", spec.label);
            if spec.kind != Kind::AnvilLib {
                t.make_snapshot_root("snaproot").unwrap();
                let has = t.snapshot("snaproot", "day-01").unwrap();
                let expect = matches!(
                    spec.kind,
                    Kind::Anvil | Kind::Btrfs | Kind::BtrfsZstd | Kind::ZfsFuse
                );
                assert_eq!(has, expect, "{}: snapshot support", spec.label);
            }
            vfs.unlink("d/f").unwrap();
            vfs.rmdir("d").unwrap();
        }
        let img = work.path().join(format!("{}.img", spec.label));
        t.teardown()
            .unwrap_or_else(|e| panic!("{}: teardown: {e}", spec.label));
        assert!(!img.exists(), "{}: backing file left behind", spec.label);
        assert!(
            !loops().contains(&img.display().to_string()),
            "{}: loop device left behind",
            spec.label
        );
        let mnt = work.path().join(format!("mnt-{}", spec.label));
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        assert!(
            !mounts.contains(&mnt.display().to_string()),
            "{}: still mounted",
            spec.label
        );
    }
}

#[test]
fn bad_target_lists_are_refused_with_a_reason() {
    let err = parse_targets(Some("ext4,ntfs"), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown file system 'ntfs'"), "{err}");
    let err = parse_targets(Some("ext4,ext4"), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("twice"), "{err}");
    let err = parse_targets(None, &[]).unwrap_err().to_string();
    assert!(err.contains("no targets"), "{err}");
    let err = parse_targets(None, &[PathBuf::from("/nonexistent/x")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/x"), "{err}");
}
