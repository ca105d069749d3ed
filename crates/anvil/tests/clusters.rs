//! Locality clusters on the write side: the small files a commit writes lie side by side in
//! one free range per cluster, hinted files follow the file they were hinted near, and every
//! version of every file reads back byte for byte at every TID while space is freed and
//! reused under them.

use anvil::device::{Device, MemDevice};
use anvil::format::record::rtype;
use anvil::format::record::ROOT_OBJ;
use anvil::fs::Caller;
use anvil::{Filesystem, MountOptions};
use rand::{Rng, RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

fn options(nohistory: bool) -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
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

/// Device offset and allocated bytes of each live file's (single) data extent, by inode.
fn extents(fs: &Filesystem) -> HashMap<u64, (u64, u64)> {
    let mut out = HashMap::new();
    fs.volume()
        .scan(&mut |element| {
            if element.key.rtype == rtype::DATA && element.delete_tid == 0 {
                if let Some(extent) = element.extent() {
                    out.insert(element.key.obj, (extent.offset, extent.allocated_bytes()));
                }
            }
            true
        })
        .unwrap();
    out
}

/// Whether the extents of `inos` lie back to back, in some order.
fn side_by_side(extents: &HashMap<u64, (u64, u64)>, inos: &[u64]) -> bool {
    let mut placed: Vec<(u64, u64)> = inos.iter().map(|ino| extents[ino]).collect();
    placed.sort_unstable();
    placed.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0)
}

/// How `interleaved_pages` names each page's first file.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Hints {
    None,
    /// `set_locality` after the file is written.
    Set,
    /// With the file, in `create_file`.
    AtCreate,
}

/// Two "pages" of 5,000-byte files created interleaved (as a proxy serving two clients
/// does), with or without hints naming each page's first file; returns the inodes.
fn interleaved_pages(fs: &Filesystem, hints: Hints) -> [Vec<u64>; 2] {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(5);
    let mut pages: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..12 {
        for (p, page) in pages.iter_mut().enumerate() {
            let bytes = random_bytes(&mut rng, 5000);
            let name = format!("p{p}-{i:02}");
            let ino = match hints {
                Hints::AtCreate => {
                    let near = page.first().copied();
                    fs.create_file(Caller::ROOT, ROOT_OBJ, name.as_bytes(), 0o644, &bytes, near)
                        .unwrap()
                        .ino
                }
                Hints::None | Hints::Set => fs.write_file(&format!("/{name}"), &bytes).unwrap(),
            };
            if let (Hints::Set, Some(first)) = (hints, page.first()) {
                fs.set_locality(ino, *first);
            }
            page.push(ino);
        }
    }
    fs.sync().unwrap();
    pages
}

#[test]
fn locality_hints_put_a_page_together() {
    for hints in [Hints::Set, Hints::AtCreate, Hints::None] {
        let device = Arc::new(MemDevice::new(0));
        Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
        let fs = Filesystem::open(device as Arc<dyn Device>, options(false)).unwrap();
        let pages = interleaved_pages(&fs, hints);
        let extents = extents(&fs);
        // 12 files of 5,000 bytes, 60,000 packed: one cluster per page when hinted.
        for page in &pages {
            let hinted = hints != Hints::None;
            assert_eq!(side_by_side(&extents, page), hinted, "hints: {hints:?}");
        }
    }
}

/// A hinted page is a locality set: every member's extent names blocks of the page's files
/// only (two sets where the page crosses the end of a 128 KiB cluster), and a read of the
/// page from a cold cache reads them once for all twelve files, or twice.
#[test]
fn a_read_of_one_member_brings_its_set() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options(false)).unwrap();
    let pages = interleaved_pages(&fs, Hints::Set);
    let mut sets = HashMap::new();
    fs.volume()
        .scan(&mut |element| {
            if let (rtype::DATA, Some(extent)) = (element.key.rtype, element.extent()) {
                sets.insert(element.key.obj, extent.set_span());
            }
            true
        })
        .unwrap();
    let extents = extents(&fs);
    for page in &pages {
        let lo = page.iter().map(|ino| extents[ino].0).min().unwrap();
        let hi = page
            .iter()
            .map(|ino| extents[ino].0 + extents[ino].1)
            .max()
            .unwrap();
        // Twelve files of 5,000 bytes, packed back to back.
        assert_eq!(hi - lo, 12 * 5000);
        // A set is whole blocks: the page's first and last blocks may hold other files too.
        let (lo, hi) = (lo / 4096 * 4096, hi.next_multiple_of(4096));
        let mut distinct: Vec<(u64, u64)> = page
            .iter()
            .map(|ino| sets[ino].unwrap_or_else(|| panic!("inode {ino} in no set")))
            .collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() <= 2, "{distinct:?}");
        for (ino, (start, len)) in page.iter().map(|ino| (ino, sets[ino].unwrap())) {
            assert!(start >= lo && start + len <= hi, "inode {ino}");
            assert!(start <= extents[ino].0 && extents[ino].0 < start + len);
        }
    }
    for p in 0..2 {
        fs.volume().drop_caches();
        let before = fs.volume().cache_stats();
        for i in 0..12 {
            fs.read_file(&format!("/p{p}-{i:02}")).unwrap();
        }
        let after = fs.volume().cache_stats();
        let misses = after.set_misses - before.set_misses;
        assert!((1..=2).contains(&misses), "page {p}: {misses} sets read");
        assert_eq!(misses + after.set_hits - before.set_hits, 12);
    }
    // Unhinted files written together are in no set.
    let fs_plain = {
        let device = Arc::new(MemDevice::new(0));
        Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
        Filesystem::open(device as Arc<dyn Device>, options(false)).unwrap()
    };
    interleaved_pages(&fs_plain, Hints::None);
    fs_plain
        .volume()
        .scan(&mut |element| {
            if let Some(extent) = element.extent() {
                assert_eq!(extent.set_span(), None);
            }
            true
        })
        .unwrap();
}

/// A cached set whose blocks were written again since serves no stale bytes: an extent
/// in a set of the same blocks is verified against its own checksum, and the set is read
/// again from the device.
#[test]
fn a_set_cached_before_its_blocks_were_reused_serves_nothing_stale() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options(false)).unwrap();
    interleaved_pages(&fs, Hints::Set);
    let mut member = None;
    fs.volume()
        .scan(&mut |element| {
            if let Some(extent) = element.extent() {
                member = member.or(extent.set_span().map(|_| extent));
            }
            true
        })
        .unwrap();
    let old = member.expect("a member of a set");
    fs.volume().drop_caches();
    fs.volume().read_extent(&old).unwrap(); // the set is cached now
                                            // Its blocks reused (as a freed and reallocated range would be): other bytes, and an
                                            // extent with the same place and set.
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(99);
    let bytes = random_bytes(&mut rng, old.stored_bytes as usize);
    device.write_at(&bytes, old.offset).unwrap();
    let new = anvil::format::record::ExtentRef {
        checksum: anvil::checksum::checksum(&bytes),
        compression: anvil::format::record::compression::NONE,
        logical_bytes: old.stored_bytes,
        ..old
    };
    let before = fs.volume().cache_stats();
    assert_eq!(*fs.volume().read_extent(&new).unwrap(), bytes);
    let after = fs.volume().cache_stats();
    assert_eq!(
        after.set_hits - before.set_hits,
        1,
        "the stale set was looked at"
    );
    // The set read again holds the new bytes: a second read is served from it.
    assert_eq!(*fs.volume().read_extent(&new).unwrap(), bytes);
    assert_eq!(fs.volume().cache_stats().set_hits - after.set_hits, 1);
}

/// Files created, rewritten and deleted at random, some with hints, with commits in between
/// and cache drops now and then; with history, every file reads back as it was at every
/// TID; without, freed space is reused by later clusters.
fn model_run(nohistory: bool, seed: u64) {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 128 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options(nohistory)).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut live: BTreeMap<u32, (u64, Vec<u8>)> = BTreeMap::new();
    let mut at_tid: Vec<(u64, BTreeMap<u32, Vec<u8>>)> = Vec::new();
    for round in 0..40 {
        for _ in 0..rng.gen_range(4..24) {
            let name = rng.gen_range(0..48u32);
            let path = format!("/f{name}");
            match rng.gen_range(0..10) {
                0..=5 => {
                    let len = rng.gen_range(2100..40_000);
                    let bytes = random_bytes(&mut rng, len);
                    let ino = fs.write_file(&path, &bytes).unwrap();
                    if let Some((near, _)) = live.values().nth(rng.gen_range(0..=live.len())) {
                        fs.set_locality(ino, *near);
                    }
                    live.insert(name, (ino, bytes));
                }
                6..=7 if live.contains_key(&name) => {
                    fs.remove_path(&path).unwrap();
                    live.remove(&name);
                }
                _ => {
                    if let Some((ino, bytes)) = live.get(&name) {
                        assert_eq!(&fs.read_file(&path).unwrap(), bytes, "round {round}");
                        // A hint on a hit, as a proxy gives: the next commit may move the
                        // file (and its group's first file) into one set.
                        if let Some((near, _)) = live.values().nth(rng.gen_range(0..live.len())) {
                            fs.set_locality(*ino, *near);
                        }
                    }
                }
            }
        }
        let tid = fs.sync().unwrap();
        at_tid.push((
            tid,
            live.iter().map(|(n, (_, b))| (*n, b.clone())).collect(),
        ));
        if round % 7 == 3 {
            fs.volume().drop_caches();
        }
        for (name, (_, bytes)) in &live {
            assert_eq!(&fs.read_file(&format!("/f{name}")).unwrap(), bytes);
        }
    }
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
fn every_version_of_hinted_files_reads_back_at_every_tid() {
    model_run(false, 11);
}

#[test]
fn clusters_reuse_freed_space_cleanly() {
    for seed in [21, 22, 23] {
        model_run(true, seed);
    }
}

/// The set of each file's data extent (None: in no set), by inode.
fn sets(fs: &Filesystem) -> HashMap<u64, Option<(u64, u64)>> {
    let mut out = HashMap::new();
    fs.volume()
        .scan(&mut |element| {
            if let (rtype::DATA, 0, Some(extent)) =
                (element.key.rtype, element.delete_tid, element.extent())
            {
                out.insert(element.key.obj, extent.set_span());
            }
            true
        })
        .unwrap();
    out
}

/// Hummingbird packed late: the files a proxy reads for one page, written by three commits
/// into three sets, are moved into one set by the commit after the reads that name them
/// together, and read back in one request, at every TID as before.
#[test]
fn a_page_read_apart_is_packed_into_one_set() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options(false)).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
    let mut files: Vec<(String, u64, Vec<u8>)> = Vec::new();
    let mut tids = Vec::new();
    for commit in 0..3 {
        for i in 0..3 {
            let path = format!("/c{commit}-{i}");
            let bytes = random_bytes(&mut rng, 5000);
            let ino = fs.write_file(&path, &bytes).unwrap();
            if let Some((_, page, _)) = files.first() {
                fs.set_locality(ino, *page);
            }
            files.push((path, ino, bytes));
        }
        tids.push(fs.sync().unwrap());
        // Out of memory before the next commit adds to the page, as after a long pause:
        // the commit cannot take the page's files along, so each commit is a set.
        fs.volume().drop_caches();
    }
    let inos: Vec<u64> = files.iter().map(|(_, ino, _)| *ino).collect();
    let distinct = |sets: &HashMap<u64, Option<(u64, u64)>>| {
        let mut spans: Vec<Option<(u64, u64)>> = inos.iter().map(|ino| sets[ino]).collect();
        spans.sort_unstable();
        spans.dedup();
        spans
    };
    let before = sets(&fs);
    assert_eq!(distinct(&before).len(), 3, "{before:?}");

    // Hints without the bytes in memory move nothing: the commit never reads to move.
    fs.volume().drop_caches();
    for ino in &inos[1..] {
        fs.set_locality(*ino, inos[0]);
    }
    fs.write_file("/other", b"w").unwrap();
    fs.sync().unwrap();
    assert_eq!(sets(&fs), before);

    // A visit of the page reads three sets and names every file with the page.
    fs.volume().drop_caches();
    let stats = fs.volume().cache_stats();
    for (path, ino, bytes) in &files {
        assert_eq!(&fs.read_file(path).unwrap(), bytes);
        fs.set_locality(*ino, inos[0]);
    }
    assert_eq!(fs.volume().cache_stats().set_misses - stats.set_misses, 3);
    // Hints alone are no change to commit: they ride on the next commit of anything.
    fs.write_file("/other", b"x").unwrap();
    fs.sync().unwrap();
    let after = sets(&fs);
    let spans = distinct(&after);
    assert_eq!(spans.len(), 1, "{after:?}");
    assert!(spans[0].is_some());

    // The next visit reads one set, and every version reads back as it was.
    fs.volume().drop_caches();
    let stats = fs.volume().cache_stats();
    for (path, _, bytes) in &files {
        assert_eq!(&fs.read_file(path).unwrap(), bytes);
    }
    assert_eq!(fs.volume().cache_stats().set_misses - stats.set_misses, 1);
    for (commit, tid) in tids.iter().enumerate() {
        let view = fs.at(*tid).unwrap();
        for (path, _, bytes) in &files[..3 * (commit + 1)] {
            assert_eq!(&view.read_file(path).unwrap(), bytes, "{path} at {tid}");
        }
    }
    // Visited again, the page is in one set already: nothing moves.
    for (path, ino, _) in &files {
        fs.read_file(path).unwrap();
        fs.set_locality(*ino, inos[0]);
    }
    fs.write_file("/other", b"y").unwrap();
    fs.sync().unwrap();
    assert_eq!(sets(&fs), after);
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A file the commit changes is placed by its own change, not moved: a hint on a file
/// rewritten since its read leaves the new version where the commit writes it, whole.
#[test]
fn a_file_changed_in_the_commit_is_not_moved() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options(true)).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(4);
    let page = fs
        .write_file("/page", &random_bytes(&mut rng, 5000))
        .unwrap();
    fs.sync().unwrap();
    let image = fs
        .write_file("/image", &random_bytes(&mut rng, 5000))
        .unwrap();
    fs.sync().unwrap();
    fs.read_file("/page").unwrap();
    fs.read_file("/image").unwrap();
    fs.set_locality(image, page);
    let new = random_bytes(&mut rng, 7000);
    fs.write_file("/image", &new).unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.read_file("/image").unwrap(), new);
    fs.volume().drop_caches();
    assert_eq!(fs.read_file("/image").unwrap(), new);
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A page whose first visit straddles a commit: the commit that writes the later images
/// takes the page and its first images along (still in memory from the commit before), so
/// the page is one set, read in one request, and every version reads back at every TID.
/// A group's earlier set much larger than what joins it stays where it is, and a member
/// deleted in between is simply not there to move.
#[test]
fn a_page_written_over_two_commits_is_one_set() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options(false)).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    let mut files: Vec<(String, u64, Vec<u8>)> = Vec::new();
    let mut tids = Vec::new();
    for commit in 0..2 {
        for i in 0..3 {
            let path = format!("/p{commit}-{i}");
            let bytes = random_bytes(&mut rng, 5000);
            let ino = fs.write_file(&path, &bytes).unwrap();
            if let Some((_, page, _)) = files.first() {
                fs.set_locality(ino, *page);
            }
            files.push((path, ino, bytes));
        }
        // Deleted before the next commit could move it: nothing to move, no error.
        if commit == 0 {
            let (path, _, _) = files.pop().unwrap();
            fs.unlink(ROOT_OBJ, &path.as_bytes()[1..]).unwrap();
        }
        tids.push(fs.sync().unwrap());
    }
    let inos: Vec<u64> = files.iter().map(|(_, ino, _)| *ino).collect();
    let placed = sets(&fs);
    let mut spans: Vec<Option<(u64, u64)>> = inos.iter().map(|ino| placed[ino]).collect();
    spans.dedup();
    assert_eq!(spans.len(), 1, "{placed:?}");
    assert!(spans[0].is_some());
    assert!(side_by_side(&extents(&fs), &inos));
    let report = fs.volume().report();
    assert!(report.contains(&("regrouped_files", 2)), "{report:?}");

    fs.volume().drop_caches();
    let stats = fs.volume().cache_stats();
    for (path, _, bytes) in &files {
        assert_eq!(&fs.read_file(path).unwrap(), bytes);
    }
    assert_eq!(fs.volume().cache_stats().set_misses - stats.set_misses, 1);
    let view = fs.at(tids[0]).unwrap();
    for (path, _, bytes) in &files[..2] {
        assert_eq!(&view.read_file(path).unwrap(), bytes, "{path}");
    }
    assert!(view.read_file(&files[2].0).is_err());

    // Three large images, then one small one: the large ones stay, the page joins the
    // small one (the page is the group's first file, named by the hint itself).
    let page = fs
        .write_file("/big-page", &random_bytes(&mut rng, 5000))
        .unwrap();
    let mut big = Vec::new();
    for i in 0..3 {
        let ino = fs
            .write_file(&format!("/big-{i}"), &random_bytes(&mut rng, 30000))
            .unwrap();
        fs.set_locality(ino, page);
        big.push(ino);
    }
    fs.sync().unwrap();
    let before = extents(&fs);
    let small = fs
        .write_file("/small", &random_bytes(&mut rng, 5000))
        .unwrap();
    fs.set_locality(small, page);
    fs.sync().unwrap();
    let after = extents(&fs);
    for ino in &big {
        assert_eq!(before[ino], after[ino]);
    }
    assert!(side_by_side(&after, &[page, small]));
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// What the device is given is counted by what it holds: 1,000 files of 5,000 bytes
/// (incompressible) are 1,000 extents of two blocks, 3,192 bytes of each zeros, and
/// their 4.8 MiB went through the redo log first.
#[test]
fn bytes_written_are_counted_by_what_they_hold() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options(false)).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(12);
    for i in 0..1000 {
        fs.write_file(&format!("/f{i}"), &random_bytes(&mut rng, 5000))
            .unwrap();
    }
    fs.sync().unwrap();
    let report = fs.volume().report();
    let mib = |name: &str| report.iter().find(|c| c.0 == name).unwrap().1;
    // 5,000,000 bytes of extents, packed back to back in runs of whole blocks: less than a
    // block of padding a run. (Each extent took two whole blocks before format version 8:
    // 8,192,000 bytes, 3,192,000 of them padding.)
    assert_eq!((mib("data_written_mib"), mib("data_padding_mib")), (4, 0));
    // Every change reaches the redo log first (no crash log file here), data included.
    assert!(mib("log_written_mib") >= 4, "{report:?}");
    assert!(report.iter().any(|c| c.0 == "nodes_written_mib"));
    assert!(report.iter().any(|c| c.0 == "maps_written_mib"));
}

/// Questions about the committed tree are counted: a lookup under a new root walks the tree
/// (the name's slots, the file's inode; a name that is there needs no look at the
/// directory's inode), and the same lookup again finds the inode in the live memo; only the
/// slots are walked again.
#[test]
fn walks_of_the_tree_are_counted() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "walks").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options(false)).unwrap();
    fs.write_file("/f", b"walked").unwrap();
    fs.sync().unwrap();
    let counts = || {
        let report = fs.volume().report();
        let count = |name: &str| report.iter().find(|c| c.0 == name).unwrap().1;
        (count("tree_walks"), count("memo_answers"))
    };
    let before = counts();
    let ino = fs.lookup(ROOT_OBJ, b"f").unwrap().ino;
    let first = counts();
    assert_eq!(fs.lookup(ROOT_OBJ, b"f").unwrap().ino, ino);
    let second = counts();
    assert!(first.0 - before.0 >= 2, "{before:?} {first:?}");
    assert_eq!(first.1, before.1, "{before:?} {first:?}");
    assert_eq!(second.0 - first.0, 1, "{first:?} {second:?}");
    assert!(second.1 - first.1 >= 1, "{first:?} {second:?}");
}

/// The engine's counter `name` (`Volume::report`).
fn counter(fs: &Filesystem, name: &str) -> u64 {
    fs.volume()
        .report()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no counter {name}"))
}

/// A shared file named as read with a page (`copy_near`) is copied into the page's set by
/// the commit that writes the page: a cold read of the page, then of the shared file, reads
/// the device once. The copy serves only while its bytes verify against the file's own
/// checksum: overwritten on the device, or the file written again, the file reads as it is.
#[test]
fn a_shared_file_comes_with_each_page_it_was_read_with() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "clusters").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options(false)).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(17);
    let logo = random_bytes(&mut rng, 3000);
    let shared = fs.write_file("/logo", &logo).unwrap();
    fs.sync().unwrap();
    // Two pages, each written with two images of its own, read with the logo.
    let mut pages = Vec::new();
    for p in 0..2 {
        let page = fs
            .write_file(&format!("/page{p}"), &random_bytes(&mut rng, 5000))
            .unwrap();
        for i in 0..2 {
            let image = fs
                .write_file(&format!("/page{p}-{i}"), &random_bytes(&mut rng, 4000))
                .unwrap();
            fs.set_locality(image, page);
        }
        fs.copy_near(shared, page);
        fs.sync().unwrap();
        pages.push(page);
    }
    assert_eq!(counter(&fs, "copies_written"), 2);
    // The copies own no space: the space map the commit wrote says exactly what the tree
    // uses.
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
    let sets = sets(&fs);
    let page_set = |p: usize| sets[&pages[p]].expect("the page is in a set");
    // The logo's own place made unreadable: after either page, it reads from the copy.
    let (at, bytes) = extents(&fs)[&shared];
    let mut original = vec![0u8; bytes as usize];
    device.read_at(&mut original, at).unwrap();
    device.write_at(&vec![0xa5; bytes as usize], at).unwrap();
    for p in 0..2 {
        fs.volume().drop_caches();
        let before = fs.volume().cache_stats();
        let copies_read = counter(&fs, "copies_read");
        fs.read_file(&format!("/page{p}")).unwrap();
        assert_eq!(fs.read_file("/logo").unwrap(), logo, "page {p}");
        assert_eq!(counter(&fs, "copies_read"), copies_read + 1, "page {p}");
        assert_eq!(fs.volume().cache_stats().set_misses - before.set_misses, 1);
    }
    // Without a page read first, the damage shows.
    fs.volume().drop_caches();
    assert!(fs.read_file("/logo").is_err());
    device.write_at(&original, at).unwrap();
    // The first page's copy overwritten on the device (its blocks are free space, which a
    // later commit may take): it no longer verifies, and the logo is read from its place.
    let (start, len) = page_set(0);
    let members_end = [pages[0]]
        .iter()
        .chain(&[pages[0] + 1, pages[0] + 2])
        .map(|ino| extents(&fs)[ino])
        .map(|(offset, bytes)| offset + bytes)
        .max()
        .unwrap();
    assert!(members_end < start + len);
    let junk = random_bytes(&mut rng, (start + len - members_end) as usize);
    device.write_at(&junk, members_end).unwrap();
    fs.volume().drop_caches();
    let copies_read = counter(&fs, "copies_read");
    fs.read_file("/page0").unwrap();
    assert_eq!(fs.read_file("/logo").unwrap(), logo);
    assert_eq!(counter(&fs, "copies_read"), copies_read);
    // The logo written again: the second page's copy is of its old extent, never read.
    let new_logo = random_bytes(&mut rng, 3000);
    fs.write_file("/logo", &new_logo).unwrap();
    fs.sync().unwrap();
    fs.volume().drop_caches();
    fs.read_file("/page1").unwrap();
    assert_eq!(fs.read_file("/logo").unwrap(), new_logo);
    assert_eq!(counter(&fs, "copies_read"), copies_read);
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}
