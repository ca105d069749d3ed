//! Prune removes exactly the history the policy does not keep: snapshots read back
//! unchanged, unkept versions are gone, the freed space returns, and check stays clean.

use anvil::device::{Device, MemDevice};
use anvil::fs::{ReblockOptions, RetentionPolicy};
use anvil::{Filesystem, MountOptions};
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

fn content(day: usize) -> Vec<u8> {
    (0..150_000)
        .map(|i| ((i * 31 + day * 7) % 251) as u8)
        .collect()
}

#[test]
fn prune_keeps_snapshots_and_frees_the_rest() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 128 << 20, "prune").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let mut days = Vec::new();
    for day in 0..10 {
        fs.write_file("/data.bin", &content(day)).unwrap();
        fs.write_file(&format!("/log-{day}"), format!("day {day}").as_bytes())
            .unwrap();
        let unsnapshotted = fs.sync().unwrap();
        fs.write_file("/data.bin", &content(100 + day)).unwrap();
        let tid = fs.snapshot(&format!("day{day}")).unwrap();
        days.push((day, tid, unsnapshotted));
    }
    // Drop the snapshots of odd days: only even days must survive the prune.
    for (day, _, _) in days.iter().filter(|(d, _, _)| d % 2 == 1) {
        fs.remove_snapshot(&format!("day{day}")).unwrap();
    }
    let before = fs.space_split().unwrap();
    let free_before = fs.statfs().blocks_free;
    let report = fs.prune(Some(RetentionPolicy::NONE), false).unwrap();
    assert!(
        report.elements_removed > 0 && report.extent_bytes_freed > 0,
        "{report:?}"
    );
    let after = fs.space_split().unwrap();
    assert_eq!(
        after.live_bytes, before.live_bytes,
        "prune must not touch the current state"
    );
    assert!(after.history_bytes < before.history_bytes);
    assert!(
        fs.statfs().blocks_free > free_before,
        "freed space shows in statfs"
    );
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());

    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    for (day, tid, unsnapshotted) in &days {
        let view = fs.at(*tid).unwrap();
        if day % 2 == 0 {
            assert_eq!(
                view.read_file("/data.bin").unwrap(),
                content(100 + day),
                "day {day}"
            );
            assert_eq!(
                view.read_file(&format!("/log-{day}")).unwrap(),
                format!("day {day}").as_bytes()
            );
        }
        // The unsnapshotted intermediate versions are gone.
        let old = fs.at(*unsnapshotted).unwrap().read_file("/data.bin");
        assert_ne!(
            old.ok(),
            Some(content(*day)),
            "day {day}: pruned version still readable"
        );
    }
    assert_eq!(fs.read_file("/data.bin").unwrap(), content(109));
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
    // A second prune with nothing left to do removes nothing and changes no snapshot.
    let again = fs.prune(Some(RetentionPolicy::NONE), false).unwrap();
    assert_eq!(again.elements_removed, 0, "{again:?}");
}

#[test]
fn policy_is_stored_in_the_volume() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 32 << 20, "policy").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    assert_eq!(fs.retention_policy().unwrap(), RetentionPolicy::default());
    let weekly = RetentionPolicy::parse("all=0,daily=0,weekly=12").unwrap();
    fs.set_retention_policy(weekly).unwrap();
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    assert_eq!(fs.retention_policy().unwrap(), weekly);
}

#[test]
fn reblock_moves_data_without_changing_any_view_and_resumes() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 128 << 20, "reblock").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    // Interleave two files' writes across commits so their extents are fragmented.
    let mut tids = Vec::new();
    for round in 0..12 {
        for name in ["/a", "/b"] {
            let ino = match fs.resolve(name) {
                Ok(ino) => ino,
                Err(_) => fs.write_file(name, b"").unwrap(),
            };
            fs.write(ino, round * 65536, &content(round as usize)[..65536])
                .unwrap();
        }
        tids.push(fs.sync().unwrap());
    }
    let views_before: Vec<(Vec<u8>, Vec<u8>)> = tids
        .iter()
        .map(|t| {
            let view = fs.at(*t).unwrap();
            (view.read_file("/a").unwrap(), view.read_file("/b").unwrap())
        })
        .collect();
    let mut calls = 0;
    let small_steps = ReblockOptions {
        time_box: Some(std::time::Duration::ZERO),
        step_bytes: 8192,
    };
    let first = fs.reblock(small_steps, &mut |_, _| calls += 1).unwrap();
    assert!(
        !first.finished && calls == 1,
        "a zero time box does one step: {first:?}"
    );
    let whole = ReblockOptions {
        time_box: None,
        step_bytes: 8192,
    };
    let rest = fs
        .reblock(whole, &mut |done, total| assert!(done <= total))
        .unwrap();
    assert!(rest.finished, "{rest:?}");
    assert!(first.extents_moved + rest.extents_moved >= 24);
    for (tid, (a, b)) in tids.iter().zip(&views_before) {
        let view = fs.at(*tid).unwrap();
        assert_eq!(&view.read_file("/a").unwrap(), a);
        assert_eq!(&view.read_file("/b").unwrap(), b);
    }
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    assert_eq!(
        fs.at(tids[5]).unwrap().read_file("/a").unwrap(),
        views_before[5].0
    );
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
}
