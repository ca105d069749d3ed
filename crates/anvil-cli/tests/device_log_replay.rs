//! A run on the real mount recorded with `--device-log` replays to every flush point, and
//! each point mounts and checks clean, as do reordered states inside flush intervals and
//! the state after every write (a killed daemon); a log with a damaged write is reported.

mod common;

use std::process::Command;

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

/// The number before `label` in replay-check's summary line.
fn count(report: &str, label: &str) -> u64 {
    let before = report.split(label).next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn every_flush_point_of_a_real_run_checks_clean() {
    if !common::fuse_or_skip("every_flush_point_of_a_real_run_checks_clean") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("vol.img");
    let base = dir.path().join("base.img");
    let log = dir.path().join("device.log");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let run = |args: &[&std::ffi::OsStr]| {
        let out = Command::new(ANVIL).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run(&[
        "mkfs".as_ref(),
        image.as_os_str(),
        "--size".as_ref(),
        "128M".as_ref(),
    ]);
    std::fs::copy(&image, &base).unwrap();
    run(&[
        "mount".as_ref(),
        image.as_os_str(),
        mnt.as_os_str(),
        "--device-log".as_ref(),
        log.as_os_str(),
    ]);
    std::fs::create_dir(mnt.join("d")).unwrap();
    for i in 0..20u32 {
        let data: Vec<u8> = (0..i * 9000).map(|j| (j * 7 + i) as u8).collect();
        let path = mnt.join(format!("d/f{i}"));
        std::fs::write(&path, &data).unwrap();
        if i % 4 == 0 {
            std::fs::File::open(&path).unwrap().sync_all().unwrap();
        }
    }
    // Bytes that do not compress: extents stored as written, checksummed end to end.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let noise: Vec<u8> = (0..300_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(mnt.join("d/noise"), &noise).unwrap();
    std::fs::rename(mnt.join("d/f1"), mnt.join("moved")).unwrap();
    run(&["synctid".as_ref(), mnt.as_os_str()]);
    assert!(Command::new("umount").arg(&mnt).status().unwrap().success());
    for _ in 0..100 {
        if common::daemon_pid(&image).is_none() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let report = run(&["replay-check".as_ref(), base.as_os_str(), log.as_os_str()]);
    assert!(report.contains(" 0 violations"), "{report}");
    let points = count(&report, " flush points");
    assert!(points >= 6, "{report}");

    // Crashes inside flush intervals: random subsets of each interval's writes, in
    // random order, some torn; every such state must open and check clean.
    let report = run(&[
        "replay-check".as_ref(),
        base.as_os_str(),
        log.as_os_str(),
        "--reorder".as_ref(),
        "4".as_ref(),
        "--seed".as_ref(),
        "7".as_ref(),
        "--kills".as_ref(),
    ]);
    assert!(report.contains(" 0 violations"), "{report}");
    let killed = count(&report, " daemon-kill states");
    assert!(killed >= 20, "{report}");
    let reordered = count(&report, " reordered crash states");
    assert!(reordered >= 4 * 6, "{report}");

    // Damage a logged tree-node write (a block starting with the header magic and a leaf or
    // internal block type); the commit that wrote it references it, so replay-check must
    // notice. (A damaged redo-log batch, by contrast, is a torn fsync and is skipped.)
    let mut bytes = std::fs::read(&log).unwrap();
    let mut at = 0usize;
    let mut target = None;
    // And a data extent (a write that is not a block with a header): damaged, the states
    // that reference it report its checksum, although states before them verified extents
    // on the same pages (replay-check remembers those by the pages they were read from).
    let mut data_targets = Vec::new();
    while at < bytes.len() {
        if bytes[at] == b'F' {
            at += 1;
            continue;
        }
        let len = u32::from_le_bytes(bytes[at + 9..at + 13].try_into().unwrap()) as usize;
        let data = &bytes[at + 13..at + 13 + len];
        if target.is_none() && len >= 16384 && data.starts_with(b"ANVL") && matches!(data[6], 2 | 3)
        {
            target = Some(at + 13 + 200);
        }
        if len >= 65536 && !data.starts_with(b"ANVL") {
            // The first bytes of a run of extents (the first extent's, always checksummed)
            // or of the redo log's pages (a torn fsync to replay, which skips it).
            data_targets.push(at + 13);
        }
        at += 13 + len;
    }
    assert!(!data_targets.is_empty(), "a data write in the log");
    let mut damaged = bytes.clone();
    for at in data_targets {
        damaged[at] ^= 0x55;
    }
    let damaged_log = dir.path().join("damaged-data.log");
    std::fs::write(&damaged_log, &damaged).unwrap();
    let out = Command::new(ANVIL)
        .args([
            "replay-check".as_ref(),
            base.as_os_str(),
            damaged_log.as_os_str(),
            "--kills".as_ref(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "a damaged data write went unnoticed: {stdout}"
    );
    assert!(stdout.contains("checksum"), "{stdout}");

    let target = target.expect("a node write in the log");
    bytes[target] ^= 0x55;
    std::fs::write(&log, &bytes).unwrap();
    let out = Command::new(ANVIL)
        .args(["replay-check".as_ref(), base.as_os_str(), log.as_os_str()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a damaged write went unnoticed");
    assert!(String::from_utf8_lossy(&out.stdout).contains("flush point"));
}
