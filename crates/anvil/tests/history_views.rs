//! History through the library: snapshots (create, list, remove, labels unique), commit
//! times, per-object version lists including deletion, and as-of resolution by TID, time
//! and label, all stable across reopen.

use anvil::device::{Device, MemDevice};
use anvil::{Error, Filesystem, MountOptions};
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

#[test]
fn snapshots_history_and_as_of_resolution() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "hist").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let ino = fs.write_file("/f", b"version one").unwrap();
    let first = fs.snapshot("first").unwrap();
    assert!(fs.snapshot("first").is_err(), "labels are unique");
    assert!(fs.snapshot("a/b").is_err());
    assert!(
        fs.snapshot("a\tb").is_err(),
        "control characters are refused"
    );
    assert!(fs.snapshot("tab\u{7f}").is_err());
    fs.write_file("/f", b"version two, longer").unwrap();
    let second = fs.sync().unwrap();
    fs.remove_path("/f").unwrap();
    let gone = fs.sync().unwrap();

    let versions = fs.history(ino).unwrap();
    let tids: Vec<u64> = versions.iter().map(|v| v.tid).collect();
    assert!(
        tids.contains(&first) && tids.contains(&second) && tids.contains(&gone),
        "{tids:?}"
    );
    let last = versions.last().unwrap();
    assert_eq!((last.tid, last.exists), (gone, false));
    assert_eq!(versions.iter().find(|v| v.tid == second).unwrap().size, 19);
    assert!(versions.iter().all(|v| v.time_ns > 0));

    assert_eq!(fs.resolve_as_of("first").unwrap(), first);
    assert_eq!(
        fs.resolve_as_of(&format!("{second:#018x}")).unwrap(),
        second
    );
    assert!(matches!(
        fs.resolve_as_of("no-such-label"),
        Err(Error::Invalid(_))
    ));
    assert!(fs.resolve_as_of("0xffffffffffff").is_err());
    assert!(fs.resolve_as_of("1970-01-01T00:00").is_err());
    let far_future = fs.resolve_as_of("2999-01-01T00:00").unwrap();
    assert_eq!(far_future, fs.volume().committed_tid());

    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    assert_eq!(
        fs.at(first).unwrap().read_file("/f").unwrap(),
        b"version one"
    );
    assert_eq!(
        fs.at(second).unwrap().read_file("/f").unwrap(),
        b"version two, longer"
    );
    assert!(fs.at(gone).unwrap().read_file("/f").is_err());
    let snapshots = fs.snapshots().unwrap();
    assert_eq!(snapshots.len(), 1);
    assert_eq!(
        (snapshots[0].tid, snapshots[0].label.as_str()),
        (first, "first")
    );
    fs.remove_snapshot("first").unwrap();
    assert!(fs.snapshots().unwrap().is_empty());
    assert!(fs.remove_snapshot("first").is_err());
}

#[test]
fn nohistory_per_object_is_inherited_and_keeps_no_versions() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "nohist").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    let scratch = fs.mkdir_path("/scratch").unwrap();
    fs.set_nohistory(scratch, true).unwrap();
    // Incompressible, so stored sizes show which versions survive.
    let noise = |seed: u64| {
        let mut x = seed | 1;
        (0..500_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    };
    let big = noise(1);
    fs.write_file("/scratch/tmp", &big).unwrap();
    fs.write_file("/kept", &big).unwrap();
    let first = fs.sync().unwrap();
    fs.write_file("/scratch/tmp", &noise(2)).unwrap();
    fs.write_file("/kept", &noise(3)).unwrap();
    fs.sync().unwrap();
    let split = fs.space_split().unwrap();
    // Only /kept's first version is history; /scratch/tmp's was destroyed.
    assert!(
        (500_000..900_000).contains(&split.history_bytes),
        "one 500 kB version of history expected: {split:?}"
    );
    assert_eq!(fs.at(first).unwrap().read_file("/kept").unwrap(), big);
    assert_ne!(
        fs.at(first).unwrap().read_file("/scratch/tmp").ok(),
        Some(big.clone())
    );
    fs.set_nohistory(scratch, false).unwrap();
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
}
