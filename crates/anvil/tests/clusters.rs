//! Locality clusters: small files written together are read with one device request and
//! their cluster-mates come from the cache; every version of every file in a cluster reads
//! back byte for byte at every TID, while space is freed and reused under the cached slabs.

use anvil::device::{Device, MemDevice};
use anvil::{Filesystem, MountOptions};
use rand::{Rng, RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::collections::BTreeMap;
use std::sync::Arc;

fn options(cluster_cache_bytes: Option<u64>, nohistory: bool) -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        cluster_cache_bytes,
        nohistory,
        ..Default::default()
    }
}

/// Random (incompressible) bytes: each file's extent is as large as the file.
fn random_bytes(rng: &mut Xoshiro256PlusPlus, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill_bytes(&mut bytes);
    bytes
}

/// Writes `count` files of 3-8 KiB into /page in one commit; returns their contents.
fn write_page(fs: &Filesystem, count: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    fs.mkdir_path("/page").unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..count)
        .map(|i| {
            let len = rng.gen_range(3 << 10..8 << 10);
            (format!("/page/{i:04}"), random_bytes(&mut rng, len))
        })
        .collect();
    for (path, bytes) in &files {
        fs.write_file(path, bytes).unwrap();
    }
    fs.sync().unwrap();
    files
}

#[test]
fn small_files_written_together_are_read_with_one_request() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options(None, false)).unwrap();
    let files = write_page(&fs, 64, 1);
    fs.volume().drop_caches();
    let before = fs.volume().cache_stats();
    for (path, bytes) in &files {
        assert_eq!(&fs.read_file(path).unwrap(), bytes, "{path}");
    }
    let after = fs.volume().cache_stats();
    let reads = after.cluster_reads - before.cluster_reads;
    let hits = after.cluster_hits - before.cluster_hits;
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    // A 128 KiB window per request, and the files lie back to back (rounded to blocks).
    let windows = (total + files.len() * 4096).div_ceil(96 << 10);
    assert!(
        reads <= windows as u64,
        "{reads} cluster reads for {total} bytes"
    );
    assert_eq!(
        hits + reads,
        files.len() as u64,
        "every file: a read or a hit"
    );
    assert!(after.bytes <= after.budget_bytes);
}

#[test]
fn without_a_cluster_cache_every_file_is_its_own_request() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options(Some(0), false)).unwrap();
    let files = write_page(&fs, 16, 2);
    fs.volume().drop_caches();
    for (path, bytes) in &files {
        assert_eq!(&fs.read_file(path).unwrap(), bytes, "{path}");
    }
    let stats = fs.volume().cache_stats();
    assert_eq!((stats.cluster_reads, stats.cluster_hits), (0, 0));
    assert_eq!(stats.extent_misses, 16);
}

/// Files created, rewritten and deleted at random, with commits in between and reads that
/// fill the cluster cache all along; with history, every file reads back as it was at every
/// TID; without, freed space is reused under slabs that were cached before.
fn model_run(nohistory: bool, seed: u64) {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 128 << 20, "clusters").unwrap();
    let opts = MountOptions {
        cache_bytes: 16 << 20,
        ..options(Some(4 << 20), nohistory)
    };
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, opts.clone()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut live: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut at_tid: Vec<(u64, BTreeMap<u32, Vec<u8>>)> = Vec::new();
    for round in 0..40 {
        for _ in 0..rng.gen_range(4..24) {
            let name = rng.gen_range(0..48u32);
            let path = format!("/f{name}");
            match rng.gen_range(0..10) {
                0..=5 => {
                    let len = rng.gen_range(2100..20_000);
                    let bytes = random_bytes(&mut rng, len);
                    fs.write_file(&path, &bytes).unwrap();
                    live.insert(name, bytes);
                }
                6..=7 if live.contains_key(&name) => {
                    fs.remove_path(&path).unwrap();
                    live.remove(&name);
                }
                _ => {
                    if let Some(bytes) = live.get(&name) {
                        assert_eq!(&fs.read_file(&path).unwrap(), bytes, "round {round}");
                    }
                }
            }
        }
        let tid = fs.sync().unwrap();
        at_tid.push((tid, live.clone()));
        if round % 7 == 3 {
            // Only the decoded extents go: the next reads come from slabs or the device.
            fs.volume().drop_caches();
        }
        for (name, bytes) in &live {
            assert_eq!(&fs.read_file(&format!("/f{name}")).unwrap(), bytes);
        }
    }
    let stats = fs.volume().cache_stats();
    assert!(
        stats.cluster_reads > 0 && stats.cluster_hits > 0,
        "{stats:?}"
    );
    assert_eq!(stats.cluster_stale, 0, "a slab outlived a write under it");
    if !nohistory {
        for (tid, files) in &at_tid {
            let view = fs.at(*tid).unwrap();
            for (name, bytes) in files {
                let path = format!("/f{name}");
                assert_eq!(&view.read_file(&path).unwrap(), bytes, "{path} at {tid}");
            }
        }
    }
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn every_version_in_a_cluster_reads_back_at_every_tid() {
    model_run(false, 11);
}

#[test]
fn reused_space_is_never_read_from_a_stale_cluster() {
    for seed in [21, 22, 23] {
        model_run(true, seed);
    }
}
