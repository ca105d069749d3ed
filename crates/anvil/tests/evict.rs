//! Cache directories: files written into an evictable directory far past the volume's size
//! never fail with ENOSPC; the least recently used clusters go first and whole (a read of
//! one member keeps its cluster-mates), files elsewhere are never touched, what stays reads
//! back byte for byte, the volume checks clean, and after a reopen the files are found
//! again by walking the tree.

use anvil::device::{Device, MemDevice};
use anvil::format::record::inode_flags;
use anvil::{Error, Filesystem, MountOptions};
use rand::{RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::collections::BTreeMap;
use std::sync::Arc;

const VOLUME_BYTES: u64 = 64 << 20;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

fn random_bytes(rng: &mut Xoshiro256PlusPlus, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill_bytes(&mut bytes);
    bytes
}

/// A fresh volume with `/keep` (ordinary, 4 MiB in it) and `/cache` (evictable).
fn volume() -> (Arc<MemDevice>, Filesystem, Vec<u8>) {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), VOLUME_BYTES, "evict").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    let kept = random_bytes(&mut rng, 4 << 20);
    fs.mkdir_path("/keep").unwrap();
    fs.write_file("/keep/data", &kept).unwrap();
    let cache = fs.mkdir_path("/cache").unwrap();
    fs.set_evictable(cache, true).unwrap();
    fs.sync().unwrap();
    (device, fs, kept)
}

fn exists(fs: &Filesystem, path: &str) -> bool {
    match fs.resolve(path) {
        Ok(_) => true,
        Err(Error::Posix(libc::ENOENT)) => false,
        Err(e) => panic!("{path}: {e:?}"),
    }
}

#[test]
fn a_cache_directory_never_fills_the_volume() {
    let (_device, fs, kept) = volume();
    let cache = fs.resolve("/cache").unwrap();
    let flags = fs.getattr(cache).unwrap().flags;
    assert_ne!(flags & inode_flags::EVICTABLE, 0);
    assert_ne!(
        flags & inode_flags::NOHISTORY,
        0,
        "a cache keeps no history"
    );
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1);
    let mut contents: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
    // Three times the volume in 256 KiB files; /cache/f0 is read often and must stay.
    let count = (3 * VOLUME_BYTES / (256 << 10)) as usize;
    for i in 0..count {
        let bytes = random_bytes(&mut rng, 256 << 10);
        let ino = fs
            .write_file(&format!("/cache/f{i}"), &bytes)
            .unwrap_or_else(|e| panic!("file {i}: {e:?}"));
        assert_ne!(fs.getattr(ino).unwrap().flags & inode_flags::EVICTABLE, 0);
        contents.insert(i, bytes);
        if i % 16 == 0 {
            assert_eq!(fs.read_file("/cache/f0").unwrap(), contents[&0]);
            fs.sync().unwrap();
        }
    }
    fs.sync().unwrap();
    let present: Vec<usize> = (0..count)
        .filter(|i| exists(&fs, &format!("/cache/f{i}")))
        .collect();
    assert!(present.len() < count / 2, "nothing was evicted");
    assert!(present.contains(&0), "the file in use was evicted");
    // Least recently used first: apart from f0, what stays is the newest files.
    let oldest_kept = present[1];
    assert!(
        (oldest_kept..count).all(|i| present.contains(&i)),
        "a newer file went before an older one: {present:?}"
    );
    for &i in &present {
        assert_eq!(fs.read_file(&format!("/cache/f{i}")).unwrap(), contents[&i]);
    }
    assert_eq!(fs.read_file("/keep/data").unwrap(), kept);
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
    // Outside the cache, a full volume is still ENOSPC.
    let ino = fs.write_file("/keep/big", b"").unwrap();
    let mut at = 0u64;
    let error = loop {
        match fs.write(ino, at, &random_bytes(&mut rng, 1 << 20)) {
            Ok(n) => at += n as u64,
            Err(e) => break e,
        }
        assert!(at < VOLUME_BYTES, "wrote past the volume");
    };
    assert!(matches!(error, Error::NoSpace), "{error:?}");
    assert_eq!(fs.read_file("/keep/data").unwrap(), kept);
}

#[test]
fn clusters_are_evicted_whole_least_recently_used_first() {
    let (_device, fs, _) = volume();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(2);
    // Groups of eight 8 KiB files, each group written by one commit (one cluster), in a
    // directory of its own under the cache (inherited).
    let groups = 12;
    for g in 0..groups {
        fs.mkdir_path(&format!("/cache/g{g}")).unwrap();
        for f in 0..8 {
            let bytes = random_bytes(&mut rng, 8 << 10);
            fs.write_file(&format!("/cache/g{g}/{f}"), &bytes).unwrap();
        }
        fs.sync().unwrap();
    }
    // Fill the rest of the volume through the cache in large files, using one member of
    // the oldest group all along: that keeps the group.
    let mut i = 0;
    while exists(&fs, "/cache/g1/0") {
        fs.read_file("/cache/g0/3").unwrap();
        let bytes = random_bytes(&mut rng, 1 << 20);
        fs.write_file(&format!("/cache/big{i}"), &bytes).unwrap();
        fs.sync().unwrap();
        i += 1;
        assert!(i < 200, "nothing was evicted");
    }
    for g in 0..groups {
        let present = (0..8)
            .filter(|f| exists(&fs, &format!("/cache/g{g}/{f}")))
            .count();
        assert!(
            present == 0 || present == 8,
            "group {g}: {present} of 8 left"
        );
    }
    assert!(exists(&fs, "/cache/g0/0"), "the group in use was evicted");
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
}

#[test]
fn after_a_reopen_the_cache_is_found_by_walking_the_tree() {
    let (device, fs, kept) = volume();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(3);
    for i in 0..40 {
        fs.write_file(&format!("/cache/a{i}"), &random_bytes(&mut rng, 1 << 20))
            .unwrap();
    }
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    // Nothing of the cache was looked up since the reopen: the writes below are to a
    // directory that is not a cache, until the walk finds the cache's files.
    fs.mkdir_path("/other").unwrap();
    for i in 0..60 {
        fs.write_file(&format!("/other/b{i}"), &random_bytes(&mut rng, 512 << 10))
            .unwrap_or_else(|e| panic!("file {i}: {e:?}"));
    }
    fs.sync().unwrap();
    assert!(!exists(&fs, "/cache/a0"), "the oldest cache file stayed");
    assert_eq!(fs.read_file("/keep/data").unwrap(), kept);
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
}

#[test]
fn what_is_not_the_caches_to_drop_stays() {
    let (_device, fs, _) = volume();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(4);
    let mut kept: Vec<(&str, Vec<u8>)> = Vec::new();
    // Moved out of the cache.
    let moved = random_bytes(&mut rng, 1 << 20);
    fs.write_file("/cache/moved", &moved).unwrap();
    fs.rename_path("/cache/moved", "/keep/moved").unwrap();
    kept.push(("/keep/moved", moved));
    // With a second name outside the cache.
    let linked = random_bytes(&mut rng, 1 << 20);
    let ino = fs.write_file("/cache/linked", &linked).unwrap();
    let keep = fs.resolve("/keep").unwrap();
    fs.link(ino, keep, b"linked").unwrap();
    kept.push(("/cache/linked", linked));
    // Created after history was turned back on below the cache: deleting it would free
    // nothing.
    let with_history = fs.mkdir_path("/cache/history").unwrap();
    fs.set_nohistory(with_history, false).unwrap();
    let historic = random_bytes(&mut rng, 1 << 20);
    fs.write_file("/cache/history/file", &historic).unwrap();
    kept.push(("/cache/history/file", historic));
    // Renamed inside the cache: still the cache's (and its oldest file).
    fs.write_file("/cache/old", &random_bytes(&mut rng, 1 << 20))
        .unwrap();
    fs.rename_path("/cache/old", "/cache/renamed").unwrap();
    fs.sync().unwrap();
    for i in 0..40 {
        fs.write_file(&format!("/cache/f{i}"), &random_bytes(&mut rng, 1 << 20))
            .unwrap();
    }
    // A file written in 64 KiB pieces through a full cache: its own writes never evict it.
    let stream = random_bytes(&mut rng, 24 << 20);
    let ino = fs.write_file("/cache/stream", b"").unwrap();
    for (i, piece) in stream.chunks(64 << 10).enumerate() {
        fs.write(ino, (i * (64 << 10)) as u64, piece)
            .unwrap_or_else(|e| panic!("piece {i}: {e:?}"));
    }
    fs.sync().unwrap();
    assert_eq!(fs.read_file("/cache/stream").unwrap(), stream);
    assert!(!exists(&fs, "/cache/renamed"), "the renamed file stayed");
    assert!(!exists(&fs, "/cache/f0"), "nothing was evicted");
    for (path, bytes) in &kept {
        assert_eq!(&fs.read_file(path).unwrap(), bytes, "{path}");
    }
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
}
