//! Directories: 100,000 entries with fast lookup, and readdir that stays correct while the
//! directory changes (every entry present throughout is listed exactly once).

use anvil::device::MemDevice;
use anvil::fs::Caller;
use anvil::{Filesystem, MountOptions};
use std::collections::HashMap;
use std::sync::Arc;

fn fresh(bytes: u64) -> Filesystem {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), bytes, "dirs").unwrap();
    Filesystem::open(
        device,
        MountOptions {
            commit_interval_ms: 0,
            ..Default::default()
        },
    )
    .unwrap()
}

#[test]
fn hundred_thousand_entries() {
    let fs = fresh(256 << 20);
    let dir = fs.mkdir_path("/big").unwrap();
    for i in 0..100_000 {
        fs.mknod(
            Caller::ROOT,
            dir,
            format!("entry-{i:06}").as_bytes(),
            0o100644,
            0,
        )
        .unwrap();
        if i % 25_000 == 24_999 {
            fs.sync().unwrap();
        }
    }
    let started = std::time::Instant::now();
    for i in (0..100_000).step_by(997) {
        fs.lookup(dir, format!("entry-{i:06}").as_bytes()).unwrap();
    }
    // Lookups go straight to a hash slot, not through a scan (generous bound for debug builds).
    assert!(started.elapsed().as_secs() < 10);
    let listed = fs.list_dir("/big").unwrap();
    assert_eq!(listed.len(), 100_000);
    assert_eq!(fs.getattr(dir).unwrap().nlink, 2);
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn readdir_stays_correct_while_the_directory_changes() {
    let fs = fresh(64 << 20);
    let dir = fs.mkdir_path("/d").unwrap();
    for i in 0..2000 {
        fs.mknod(
            Caller::ROOT,
            dir,
            format!("stable-{i}").as_bytes(),
            0o100644,
            0,
        )
        .unwrap();
        fs.mknod(
            Caller::ROOT,
            dir,
            format!("doomed-{i}").as_bytes(),
            0o100644,
            0,
        )
        .unwrap();
    }
    fs.sync().unwrap();
    let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut cookie = 0;
    let mut round = 0;
    loop {
        let batch = fs.readdir(dir, cookie, 97).unwrap();
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        for entry in batch {
            *seen.entry(entry.name).or_default() += 1;
        }
        // Between batches: delete some entries, add new ones, commit now and then.
        for i in (round * 40)..(round * 40 + 40).min(2000) {
            fs.unlink(dir, format!("doomed-{i}").as_bytes()).unwrap();
            fs.mknod(
                Caller::ROOT,
                dir,
                format!("new-{round}-{i}").as_bytes(),
                0o100644,
                0,
            )
            .unwrap();
        }
        if round % 5 == 0 {
            fs.sync().unwrap();
        }
        round += 1;
    }
    for i in 0..2000 {
        let name = format!("stable-{i}").into_bytes();
        assert_eq!(
            seen.get(&name),
            Some(&1),
            "{}",
            String::from_utf8_lossy(&name)
        );
    }
    assert!(seen.values().all(|&n| n == 1), "an entry was listed twice");
}
