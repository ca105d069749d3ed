//! Commits that rewrite more nodes than a commit holds in memory (`FRESH_NODES_MAX`): the
//! nodes written out early are read back, merged and freed like any other, and every state
//! reads back across a reopen with `check` clean.

use anvil::device::{Device, MemDevice};
use anvil::{Filesystem, MountOptions};
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        // A small node budget: nodes written early are read back from the device.
        cache_bytes: 16 << 20,
        ..Default::default()
    }
}

fn content(dir: u32, file: u32, round: u32) -> Vec<u8> {
    format!("{dir}/{file} round {round}\n")
        .repeat(1 + (file % 7) as usize)
        .into_bytes()
}

#[test]
fn commits_larger_than_memory_write_out_early_and_read_back() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 512 << 20, "large").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let (dirs, files) = (100u32, 400u32);
    for d in 0..dirs {
        fs.mkdir_path(&format!("/d{d}")).unwrap();
    }
    // One commit: 40,000 files (their names, inodes and inline data), thousands of leaves.
    for f in 0..files {
        for d in 0..dirs {
            fs.write_file(&format!("/d{d}/f{f}"), &content(d, f, 0))
                .unwrap();
        }
    }
    let first = fs.sync().unwrap();
    // One commit touching a file in every leaf, and one deleting nine files in ten (the
    // leaves shrink and merge with neighbours, some of them written by the same commit).
    for f in (0..files).step_by(9) {
        for d in 0..dirs {
            fs.write_file(&format!("/d{d}/f{f}"), &content(d, f, 1))
                .unwrap();
        }
    }
    let second = fs.sync().unwrap();
    for f in (0..files).filter(|f| f % 10 != 0) {
        for d in 0..dirs {
            fs.remove_path(&format!("/d{d}/f{f}")).unwrap();
        }
    }
    fs.sync().unwrap();
    fs.close().unwrap();
    drop(fs);

    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let (at_first, at_second) = (fs.at(first).unwrap(), fs.at(second).unwrap());
    for d in (0..dirs).step_by(7) {
        for f in 0..files {
            let path = format!("/d{d}/f{f}");
            assert_eq!(at_first.read_file(&path).unwrap(), content(d, f, 0));
            let round = u32::from(f % 9 == 0);
            assert_eq!(at_second.read_file(&path).unwrap(), content(d, f, round));
            match f % 10 {
                0 => assert_eq!(fs.read_file(&path).unwrap(), content(d, f, round)),
                _ => assert!(fs.read_file(&path).is_err(), "{path} was deleted"),
            }
        }
    }
}
