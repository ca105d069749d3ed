//! A full volume: writes fill it to within the reserve (pending data is never counted twice
//! while a commit writes it out), then fail with ENOSPC; with history on, deleting frees
//! nothing until prune, after which writes resume; the volume checks clean throughout.

use anvil::device::{Device, MemDevice};
use anvil::{Error, Filesystem, MountOptions};
use std::sync::Arc;

fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn fills_to_the_reserve_then_recovers_through_prune() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "full").unwrap();
    // Commits run in the background while the file is written, each holding up to a
    // quarter of the budget: a large share of this small volume.
    let options = MountOptions {
        cache_bytes: 128 << 20,
        commit_interval_ms: 60_000,
        ..Default::default()
    };
    let fs = Filesystem::open(device as Arc<dyn Device>, options).unwrap();
    let ino = fs.write_file("/big", b"").unwrap();
    let data_bytes = fs.info().data_bytes;
    let mut written = 0u64;
    let error = loop {
        match fs.write(ino, written, &noise(1 << 20, written)) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
        assert!(written < data_bytes, "wrote past the volume size");
    };
    assert!(matches!(error, Error::NoSpace), "{error:?}");
    assert_eq!(error.errno(), libc::ENOSPC);
    assert!(
        written * 100 >= data_bytes * 90,
        "only {written} of {data_bytes} bytes fit"
    );
    fs.sync().unwrap();
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());

    // History on: the delete succeeds but frees nothing until prune.
    fs.remove_path("/big").unwrap();
    fs.sync().unwrap();
    assert!(matches!(
        fs.write_file("/next", &noise(8 << 20, 9)),
        Err(Error::NoSpace)
    ));
    let report = fs.prune(None, true).unwrap();
    assert!(report.extent_bytes_freed >= written * 9 / 10, "{report:?}");
    fs.write_file("/next", &noise(8 << 20, 9)).unwrap();
    fs.sync().unwrap();
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
}

#[test]
fn fills_with_metadata_then_deletes_and_prunes_without_failed_commits() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 16 << 20, "meta").unwrap();
    let options = MountOptions {
        cache_bytes: 32 << 20,
        commit_interval_ms: 60_000,
        ..Default::default()
    };
    let fs = Filesystem::open(device as Arc<dyn Device>, options).unwrap();
    let dir = fs.mkdir_path("/many").unwrap();
    let mut created = 0u32;
    let error = loop {
        let name = format!("file-with-a-longish-name-{created:08}");
        match fs.mknod(anvil::fs::Caller::ROOT, dir, name.as_bytes(), 0o100644, 0) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
        assert!(created < 1_000_000, "never ran out of space");
    };
    assert!(matches!(error, Error::NoSpace), "{error:?}");
    assert!(created > 1000, "only {created} files fit");
    fs.sync().unwrap();
    assert!(
        !fs.volume().is_read_only(),
        "filling with metadata must not break commits"
    );
    // With history on a delete adds versions and frees nothing until prune: deletes may
    // run into ENOSPC, never into a failed commit, and prune runs without failing either.
    // (Node space of pruned inline records comes back only when leaves empty: leaves are
    // not merged yet.)
    let mut unlinked = 0;
    for i in 0..created / 2 {
        match fs.unlink(dir, format!("file-with-a-longish-name-{i:08}").as_bytes()) {
            Ok(()) => unlinked += 1,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("unlink {i}: {e}"),
        }
    }
    assert!(unlinked > 0);
    fs.sync().unwrap();
    assert!(
        !fs.volume().is_read_only(),
        "deleting on a full volume must not break commits"
    );
    fs.prune(None, true).unwrap();
    assert!(
        !fs.volume().is_read_only(),
        "prune on a full volume must not break commits"
    );
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}
