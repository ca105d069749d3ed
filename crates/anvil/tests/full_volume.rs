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

fn fill_with_files(fs: &Filesystem, dir: u64, round: u32) -> u32 {
    let mut created = 0u32;
    loop {
        let name = format!("r{round}-file-with-a-longish-name-{created:08}");
        match fs.mknod(anvil::fs::Caller::ROOT, dir, name.as_bytes(), 0o100644, 0) {
            Ok(_) => created += 1,
            Err(Error::NoSpace) => return created,
            Err(e) => panic!("create {created}: {e}"),
        }
        assert!(created < 1_000_000, "never ran out of space");
    }
}

/// Leaves that prune leaves nearly empty merge with their neighbours: after a metadata-only
/// fill, deleting nine files in ten and pruning gives back the node space the deleted files
/// and their history held, and the same fill fits again.
#[test]
fn metadata_fill_then_prune_everything_gives_the_space_back() {
    // The smallest volume: half the files of 32 MiB, and half the time (45 s against 88).
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 16 << 20, "meta").unwrap();
    let options = MountOptions {
        cache_bytes: 32 << 20,
        commit_interval_ms: 60_000,
        ..Default::default()
    };
    let fs = Filesystem::open(device as Arc<dyn Device>, options).unwrap();
    let empty_used = fs.volume().usage().used_bytes;
    let dir = fs.mkdir_path("/many").unwrap();
    let created = fill_with_files(&fs, dir, 0);
    assert!(created > 1000, "only {created} files fit");
    fs.sync().unwrap();
    let full_used = fs.volume().usage().used_bytes;
    // Deleting with history on adds versions: delete what fits, prune, go on.
    let doomed: Vec<u32> = (0..created).filter(|i| i % 10 != 0).collect();
    let mut next = 0;
    while next < doomed.len() {
        let start = next;
        while next < doomed.len() {
            let name = format!("r0-file-with-a-longish-name-{:08}", doomed[next]);
            match fs.unlink(dir, name.as_bytes()) {
                Ok(()) => next += 1,
                Err(Error::NoSpace) => break,
                Err(e) => panic!("unlink {}: {e}", doomed[next]),
            }
        }
        assert!(next > start, "no delete fits even after prune");
        fs.sync().unwrap();
        fs.prune(None, true).unwrap();
    }
    fs.prune(None, true).unwrap();
    fs.sync().unwrap();
    let pruned_used = fs.volume().usage().used_bytes;
    // The deleted files held nine tenths of what the fill used.
    let held = (full_used - empty_used) * 9 / 10;
    let returned = full_used.saturating_sub(pruned_used);
    assert!(
        returned * 10 >= held * 9,
        "prune returned {returned} of the {held} bytes the deleted files held \
         (empty {empty_used}, full {full_used}, after prune {pruned_used})"
    );
    // The second fill inserts among the kept entries, into merged leaves that split as they
    // fill; a split leaf shares with its neighbour (`spill`), so the tree holds as many
    // files as after the first fill to within a few percent (on 32 MiB, 95%: 230,700 beside
    // 27,100 of 270,900; 89% before leaves shared, when the first fill held 219,000).
    let again = fill_with_files(&fs, dir, 1);
    assert!(
        (again + created / 10) * 100 >= created * 90,
        "first fill {created} files, the second only {again} beside {} kept",
        created / 10
    );
    assert!(!fs.volume().is_read_only());
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Free space in holes shorter than a chunk: small files fill the volume and every other
/// one is deleted, so half the space comes back in holes between the rest. Data writes that
/// the commit could not place whole fail with ENOSPC at the write (counted in what the holes
/// surely hold), not at a commit that would stop the volume; the volume checks clean, and
/// once the neighbours go too, a file of whole chunks fits.
#[test]
fn free_space_in_short_holes_refuses_chunks_at_the_write() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 16 << 20, "holes").unwrap();
    let options = MountOptions {
        cache_bytes: 32 << 20,
        commit_interval_ms: 60_000,
        ..Default::default()
    };
    let fs = Filesystem::open(device as Arc<dyn Device>, options).unwrap();
    let mut files = 0u32;
    loop {
        match fs.write_file(&format!("/f{files:05}"), &noise(12 << 10, u64::from(files))) {
            Ok(_) => files += 1,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("file {files}: {e}"),
        }
    }
    assert!(files > 500, "only {files} small files fit");
    fs.sync().unwrap();
    for i in (0..files).step_by(2) {
        fs.remove_path(&format!("/f{i:05}")).unwrap();
    }
    fs.sync().unwrap();
    fs.prune(None, true).unwrap();
    fs.sync().unwrap();
    let info = fs.info();
    assert!(
        info.data_bytes - info.used_bytes > 4 << 20,
        "deletes freed too little: {info:?}"
    );

    // Files of less than a chunk wait in memory for the commit to place them.
    let mut large = 0u32;
    let error = loop {
        match fs.write_file(&format!("/l{large:05}"), &noise(48 << 10, u64::from(large))) {
            Ok(_) => large += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(error, Error::NoSpace), "{error:?}");
    fs.sync().unwrap();
    assert!(
        !fs.volume().is_read_only(),
        "a write the holes cannot take must not fail its commit"
    );
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());

    // The neighbours go: the holes join and whole chunks fit again.
    for i in 0..large {
        fs.remove_path(&format!("/l{i:05}")).unwrap();
    }
    for i in (1..files).step_by(2) {
        fs.remove_path(&format!("/f{i:05}")).unwrap();
    }
    fs.sync().unwrap();
    fs.prune(None, true).unwrap();
    fs.sync().unwrap();
    fs.write_file("/again", &noise(4 << 20, 7)).unwrap();
    fs.sync().unwrap();
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
}
