//! The library API end to end on an in-memory device: create, read, write, list, rename,
//! delete, reopen, and read as of an earlier TID.

use anvil::device::{Device, MemDevice};
use anvil::format::record::LogicalKey;
use anvil::fs::Caller;
use anvil::{Filesystem, MountOptions};
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

/// Nodes asked of the cache so far, found or not.
fn node_lookups(fs: &Filesystem) -> u64 {
    let stats = fs.volume().cache_stats();
    stats.node_hits + stats.node_misses
}

/// `anvil check` finds nothing wrong.
fn assert_clean(fs: &Filesystem) {
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

fn fresh(bytes: u64) -> Arc<MemDevice> {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), bytes, "test").unwrap();
    device
}

#[test]
fn files_survive_reopen_and_history_reads_back() {
    let device = fresh(64 << 20);
    let fs = Filesystem::open(device.clone(), options()).unwrap();
    fs.mkdir_path("/docs").unwrap();
    fs.write_file("/docs/a.txt", b"first version").unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    fs.write_file("/docs/big.bin", &big).unwrap();
    let tid1 = fs.sync().unwrap();

    fs.write_file("/docs/a.txt", b"second").unwrap();
    fs.rename_path("/docs/big.bin", "/big.bin").unwrap();
    fs.remove_path("/docs/a.txt").ok();
    fs.write_file("/docs/a.txt", b"third").unwrap();
    let tid2 = fs.sync().unwrap();
    assert!(tid2 > tid1);
    fs.close().unwrap();
    drop(fs);

    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    assert_eq!(fs.read_file("/docs/a.txt").unwrap(), b"third");
    assert_eq!(fs.read_file("/big.bin").unwrap(), big);
    assert!(fs.resolve("/docs/big.bin").is_err());
    let old = fs.at(tid1).unwrap();
    assert_eq!(old.read_file("/docs/a.txt").unwrap(), b"first version");
    assert_eq!(old.read_file("/docs/big.bin").unwrap(), big);
    let names: Vec<_> = old
        .list_dir("/docs")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 2);
    assert!(fs.at(tid2 + 100).is_err());
    assert_clean(&fs);
}

#[test]
fn large_directory_lists_every_entry_once() {
    let device = fresh(128 << 20);
    let fs = Filesystem::open(device, options()).unwrap();
    fs.mkdir_path("/d").unwrap();
    for i in 0..5000 {
        fs.write_file(&format!("/d/file-{i}"), format!("{i}").as_bytes())
            .unwrap();
        if i == 2500 {
            fs.sync().unwrap();
        }
    }
    let mut names: Vec<_> = fs
        .list_dir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 5000);
    fs.sync().unwrap();
    assert_eq!(fs.list_dir("/d").unwrap().len(), 5000);
    assert_eq!(fs.read_file("/d/file-4321").unwrap(), b"4321");
    assert_clean(&fs);
}

#[test]
fn info_counts_live_objects_through_deletes_reopen_and_replay() {
    let device = fresh(64 << 20);
    let fs = Filesystem::open(device.clone(), options()).unwrap();
    assert_eq!(fs.info().objects, 1, "the root directory");
    fs.mkdir_path("/d").unwrap();
    for i in 0..10 {
        fs.write_file(&format!("/d/{i}"), b"x").unwrap();
    }
    fs.sync().unwrap();
    fs.remove_path("/d/3").unwrap();
    fs.write_file("/d/3", b"again").unwrap();
    fs.remove_path("/d/4").unwrap();
    assert_eq!(fs.info().objects, 11);
    // Through the redo log only: a crash after fsync must count the same after replay.
    fs.fsync(1).unwrap();
    let image = device.to_bytes();
    drop(fs);
    let replayed = Arc::new(MemDevice::from_bytes(image));
    let fs = Filesystem::open(replayed, options()).unwrap();
    assert_eq!(fs.info().objects, 11);
    fs.close().unwrap();
    let reopened = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    assert_eq!(
        reopened.info().objects,
        11,
        "replayed on the original device too"
    );
}

/// Symlink targets as long as Linux allows (4,095 bytes) work, in history and across
/// reopen; longer ones fail with ENAMETOOLONG.
#[test]
fn symlink_targets_up_to_path_max() {
    let device = fresh(64 << 20);
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let caller = anvil::fs::Caller::ROOT;
    let target = |len: usize, seed: u8| -> Vec<u8> {
        (0..len)
            .map(|i| {
                if i % 50 == 49 {
                    b'/'
                } else {
                    b'a' + (i as u8 ^ seed) % 26
                }
            })
            .collect()
    };
    let lengths = [1usize, 3000, 3001, 3072, 3073, 4000, 4095];
    for (i, len) in lengths.iter().enumerate() {
        let attr = fs
            .symlink(caller, 1, format!("l{i}").as_bytes(), &target(*len, 1))
            .unwrap();
        assert_eq!(attr.size, *len as u64);
    }
    let err = fs
        .symlink(caller, 1, b"too-long", &target(4096, 1))
        .unwrap_err();
    assert_eq!(err.errno(), libc::ENAMETOOLONG);
    let tid = fs.sync().unwrap();
    // Replace each link with another long target; the old ones stay readable as of `tid`.
    for i in 0..lengths.len() {
        fs.remove_path(&format!("/l{i}")).unwrap();
        fs.symlink(caller, 1, format!("l{i}").as_bytes(), &target(4095, 2))
            .unwrap();
    }
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    let old = fs.at(tid).unwrap();
    for (i, len) in lengths.iter().enumerate() {
        let path = format!("/l{i}");
        assert_eq!(
            fs.readlink(fs.resolve(&path).unwrap()).unwrap(),
            target(4095, 2)
        );
        assert_eq!(
            old.readlink(old.resolve(&path).unwrap()).unwrap(),
            target(*len, 1)
        );
    }
    assert_clean(&fs);
    // Prune drops the old targets, extents included, and the volume stays clean.
    fs.prune(None, true).unwrap();
    assert_clean(&fs);
}

/// A read-only mount refuses changes with `ReadOnly`, not with the error of a volume that a
/// failure stopped.
#[test]
fn read_only_mount_refuses_changes_as_read_only() {
    let device = fresh(32 << 20);
    let fs = Filesystem::open(
        device as Arc<dyn Device>,
        MountOptions {
            read_only: true,
            ..options()
        },
    )
    .unwrap();
    let result = fs.write_file("/x", b"x");
    assert!(matches!(result, Err(anvil::Error::ReadOnly)), "{result:?}");
    assert_eq!(result.unwrap_err().errno(), libc::EROFS);
}

/// A file's inode read again and again between commits comes from what the first walk of
/// the tree found (no node is looked up again); a commit, or dropping the caches, sends the
/// next read back to the tree, which then sees what the commit changed.
#[test]
fn repeated_reads_of_a_record_walk_the_tree_once_per_root() {
    let device = fresh(64 << 20);
    let fs = Filesystem::open(device, options()).unwrap();
    fs.write_file("/f", b"one").unwrap();
    fs.sync().unwrap();
    let ino = fs.lookup(1, b"f").unwrap().ino;
    fs.getattr(ino).unwrap();
    let before = node_lookups(&fs);
    for _ in 0..10 {
        assert_eq!(fs.getattr(ino).unwrap().size, 3);
    }
    assert_eq!(node_lookups(&fs), before, "the memo answers repeats");
    fs.volume().drop_caches();
    let cold = fs.volume().cache_stats().node_misses;
    fs.getattr(ino).unwrap();
    assert!(
        fs.volume().cache_stats().node_misses > cold,
        "dropped with the caches"
    );
    // A commit that changes the file: the next read sees the new size.
    fs.write_file("/f", b"three").unwrap();
    fs.sync().unwrap();
    let before = node_lookups(&fs);
    assert_eq!(fs.getattr(ino).unwrap().size, 5);
    assert!(node_lookups(&fs) > before, "a new root is walked again");
}

/// An object unlinked or renamed over while a handle holds it stays readable until its
/// last handle goes, and is destroyed then; releasing a file that keeps its name reads
/// nothing (a mount releases every file the kernel forgets).
#[test]
fn unlinked_open_files_live_until_released_and_linked_ones_release_for_free() {
    let device = fresh(64 << 20);
    let fs = Filesystem::open(device, options()).unwrap();
    for name in ["a", "b", "c", "d", "kept"] {
        fs.write_file(&format!("/{name}"), name.as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    let ino = |name: &str| fs.lookup(1, name.as_bytes()).unwrap().ino;
    let (a, b, c, d, kept) = (ino("a"), ino("b"), ino("c"), ino("d"), ino("kept"));
    for obj in [a, a, b, kept] {
        fs.open_handle(obj).unwrap();
    }
    fs.unlink(1, b"a").unwrap();
    fs.rename(1, b"c", 1, b"b", Default::default()).unwrap();
    fs.unlink(1, b"d").unwrap();
    assert!(
        fs.getattr(d).is_err(),
        "unlinked with no handle: gone at once"
    );
    assert_eq!(fs.read(a, 0, 10).unwrap(), b"a");
    assert_eq!(fs.read(b, 0, 10).unwrap(), b"b");
    fs.release_handle(a).unwrap();
    assert_eq!(fs.read(a, 0, 10).unwrap(), b"a", "one handle left");
    fs.release_handle(a).unwrap();
    fs.release_handle(b).unwrap();
    assert!(fs.getattr(a).is_err() && fs.getattr(b).is_err());
    assert_eq!(fs.read(c, 0, 10).unwrap(), b"c");

    fs.volume().drop_caches();
    let before = node_lookups(&fs);
    fs.release_handle(kept).unwrap();
    assert_eq!(
        node_lookups(&fs),
        before,
        "a linked file's release reads nothing"
    );
    assert_eq!(fs.read(kept, 0, 10).unwrap(), b"kept");
    fs.sync().unwrap();
    assert_clean(&fs);
}

/// Orphans a volume went down with stay while it is opened without reaping them (a daemon
/// that takes over from a dead one: the kernel may still hold them) and go when the last
/// handle on them does.
#[test]
fn orphans_kept_at_open_go_with_their_last_handle() {
    let device = fresh(64 << 20);
    let fs = Filesystem::open(device.clone(), options()).unwrap();
    fs.write_file("/o", b"orphan").unwrap();
    let o = fs.lookup(1, b"o").unwrap().ino;
    fs.open_handle(o).unwrap();
    fs.unlink(1, b"o").unwrap();
    fs.sync().unwrap();
    drop(fs); // Down with the handle open.

    let keep = MountOptions {
        reap_orphans: false,
        ..options()
    };
    let fs = Filesystem::open(device.clone(), keep).unwrap();
    assert_eq!(fs.read(o, 0, 10).unwrap(), b"orphan", "kept at open");
    fs.open_handle(o).unwrap();
    fs.release_handle(o).unwrap();
    assert!(fs.getattr(o).is_err(), "destroyed with its last handle");
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device, options()).unwrap();
    assert_clean(&fs);
}

/// Walks under one root take its internal nodes from the state, not the cache: once they
/// were passed, a walk asks the cache for its leaf alone. A commit's new root starts over,
/// and what it changed is read back.
#[test]
fn walks_ask_the_cache_for_leaves_once_internal_nodes_were_passed() {
    let device = fresh(256 << 20);
    let fs = Filesystem::open(device, options()).unwrap();
    fs.mkdir_path("/d").unwrap();
    let dir = fs.resolve("/d").unwrap();
    let files: Vec<u64> = (0..6000)
        .map(|i| {
            let name = format!("file-{i:05}");
            fs.write_file(&format!("/d/{name}"), name.as_bytes())
                .unwrap();
            fs.lookup(dir, name.as_bytes()).unwrap().ino
        })
        .collect();
    fs.sync().unwrap();
    // Every inode once (the memo answers nothing twice here): the first walks pass the
    // internal nodes, every later one asks for a leaf only.
    let before = node_lookups(&fs);
    for &ino in &files {
        assert_eq!(fs.getattr(ino).unwrap().size, 10);
    }
    let asked = node_lookups(&fs) - before;
    let walks = files.len() as u64;
    assert!(asked >= walks, "one leaf a walk: {asked} for {walks}");
    assert!(
        asked < walks + 64,
        "internal nodes from the state: {asked} for {walks}"
    );
    // A commit publishes a new root: walks see its changes.
    fs.write_file("/d/file-00007", b"changed after the commit")
        .unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.getattr(files[7]).unwrap().size, 24);
    assert_eq!(
        fs.read(files[7], 0, 64).unwrap(),
        b"changed after the commit"
    );
}

/// Node lookups of `f` (each walk under one root asks the cache for its leaf once).
fn lookups_of(fs: &Filesystem, f: impl FnOnce()) -> u64 {
    let before = node_lookups(fs);
    f();
    node_lookups(fs) - before
}

/// A create, an unlink and a whole-file read each take the versions their spans found
/// instead of walking the tree again for them: a create one walk (the name's slots), an
/// unlink two (the name's slots; the inode with the records after it), a read from the
/// start to the end of a file one (data and patches). What the walks found still decides
/// the result: a file with more records than that walk takes, a file keeping another link,
/// an object's xattrs, and history all come out as they should.
#[test]
fn creates_unlinks_and_whole_reads_reuse_what_their_walks_found() {
    let device = fresh(256 << 20);
    let fs = Filesystem::open(device, options()).unwrap();
    fs.mkdir_path("/d").unwrap();
    let dir = fs.resolve("/d").unwrap();
    for i in 0..200 {
        fs.write_file(&format!("/d/f{i}"), format!("file {i}").as_bytes())
            .unwrap();
    }
    // A file of 80 chunks and a few attributes: more records than the first walk takes.
    let big: Vec<u8> = (0..80 * 65536u32).map(|i| (i % 253) as u8).collect();
    fs.write_file("/d/big", &big).unwrap();
    let big_ino = fs.lookup(dir, b"big").unwrap().ino;
    for i in 0..3 {
        fs.setxattr(big_ino, format!("user.a{i}").as_bytes(), b"v", true, false)
            .unwrap();
    }
    // A patched file: a small overwrite after the commit leaves a PATCH record.
    let patched: Vec<u8> = (0..100_000u32).map(|i| (i % 241) as u8).collect();
    fs.write_file("/d/patched", &patched).unwrap();
    let patched_ino = fs.lookup(dir, b"patched").unwrap().ino;
    fs.link(fs.lookup(dir, b"f1").unwrap().ino, dir, b"f1-link")
        .unwrap();
    let before = fs.sync().unwrap();
    fs.write(patched_ino, 70_000, b"PATCHED").unwrap();
    let mut expected = patched.clone();
    expected[70_000..70_007].copy_from_slice(b"PATCHED");
    let after_patch = fs.sync().unwrap();

    // Reads: from the start to the end in one walk, with the patch applied.
    fs.getattr(patched_ino).unwrap();
    let mut got = Vec::new();
    let walks = lookups_of(&fs, || got = fs.read(patched_ino, 0, 1 << 20).unwrap());
    assert_eq!(got, expected);
    assert_eq!(walks, 1, "data and patches from one walk");
    assert_eq!(
        fs.read(patched_ino, 69_998, 10).unwrap(),
        &expected[69_998..70_008]
    );
    assert_eq!(
        fs.read(patched_ino, 65_536, 1 << 20).unwrap(),
        &expected[65_536..]
    );

    // Creates: one walk (the name's slots) into a free slot.
    let mknod = |name: &[u8]| fs.mknod(Caller::ROOT, dir, name, 0o644, 0).unwrap().ino;
    let mut new = 0;
    fs.getattr(dir).unwrap();
    assert_eq!(lookups_of(&fs, || new = mknod(b"new")), 1);
    fs.write(new, 0, b"new").unwrap();
    fs.sync().unwrap();

    // Unlinks: two walks for a small file nothing holds (the directory's inode read just
    // before, as a mount's GETATTR of it is; a lookup that finds its name does not read it).
    fs.getattr(dir).unwrap();
    fs.lookup(dir, b"f7").unwrap();
    let walks = lookups_of(&fs, || fs.unlink(dir, b"f7").unwrap());
    assert_eq!(
        walks, 2,
        "the name's slots, then the inode with its records"
    );
    // Held: the inode stays, as an orphan (no walk for an orphan record it cannot have),
    // which cannot be linked again.
    let f8 = fs.lookup(dir, b"f8").unwrap().ino;
    fs.open_handle(f8).unwrap();
    let walks = lookups_of(&fs, || fs.unlink(dir, b"f8").unwrap());
    assert_eq!(
        walks, 1,
        "the name's slots (the lookup's inode is remembered)"
    );
    let relinked = fs.link(f8, dir, b"f8-again").unwrap_err();
    assert_eq!(relinked.errno(), libc::ENOENT, "{relinked}");
    assert_eq!(fs.read(f8, 0, 100).unwrap(), b"file 8");
    fs.release_handle(f8).unwrap();
    assert!(fs.getattr(f8).is_err(), "destroyed with its last handle");
    fs.unlink(dir, b"big").unwrap();
    fs.unlink(dir, b"f1").unwrap();
    assert_eq!(fs.read_file("/d/f1-link").unwrap(), b"file 1");
    let kept = fs.lookup(dir, b"f1-link").unwrap();
    assert_eq!(kept.nlink, 1, "one link left");
    // Made again where a name was deleted in this group and where one was committed.
    fs.unlink(dir, b"new").unwrap();
    let again = mknod(b"new");
    fs.write(again, 0, b"again").unwrap();
    fs.unlink(dir, b"f9").unwrap();
    fs.sync().unwrap();
    fs.write(mknod(b"f9"), 0, b"nine").unwrap();
    let now = fs.sync().unwrap();
    assert!(fs.resolve("/d/big").is_err());
    assert!(fs.getattr(big_ino).is_err(), "destroyed with its last link");
    // Every record of it went, also those past the first span's 64.
    let at = |rtype, key| LogicalKey {
        obj: big_ino,
        rtype,
        key,
    };
    let volume = fs.volume();
    let left = volume
        .range_at(
            &volume.root(),
            now,
            at(0, 0),
            at(u8::MAX, u64::MAX),
            usize::MAX,
        )
        .unwrap();
    assert!(left.is_empty(), "{} records left", left.len());
    assert_eq!(fs.read_file("/d/new").unwrap(), b"again");
    assert_eq!(fs.read_file("/d/f9").unwrap(), b"nine");
    assert_eq!(fs.read_file("/d/f1-link").unwrap(), b"file 1");
    fs.unlink(dir, b"f1-link").unwrap();
    fs.sync().unwrap();
    assert!(fs.resolve("/d/f1").is_err() && fs.resolve("/d/f1-link").is_err());

    // History keeps every version the unlinks and creates replaced.
    let old = fs.at(before).unwrap();
    assert_eq!(old.read_file("/d/big").unwrap(), big);
    assert_eq!(old.read_file("/d/f7").unwrap(), b"file 7");
    assert_eq!(old.read_file("/d/f9").unwrap(), b"file 9");
    assert_eq!(old.read_file("/d/f8").unwrap(), b"file 8");
    assert_eq!(old.read_file("/d/f1").unwrap(), b"file 1");
    assert_eq!(old.read_file("/d/patched").unwrap(), patched);
    assert_eq!(
        fs.at(after_patch).unwrap().read_file("/d/patched").unwrap(),
        expected
    );
    assert_eq!(fs.at(now).unwrap().read_file("/d/new").unwrap(), b"again");
    assert_clean(&fs);
}

/// Hummingbird's whole-file calls: `create_file` makes a file with its data in one
/// operation (one log record for the entry, the inode and the data, whole chunks written
/// ahead and logged by address), and `read_whole` looks a name up and reads the file under
/// one hold of the volume. Both give what `mknod`, `write`, `lookup` and `read` would, with
/// history, a locality hint, and every refusal of the calls they replace.
#[test]
fn whole_files_are_created_and_read_in_one_step() {
    let device = fresh(256 << 20);
    let fs = Filesystem::open(device.clone(), options()).unwrap();
    fs.mkdir_path("/d").unwrap();
    let dir = fs.resolve("/d").unwrap();
    let before = fs.sync().unwrap();
    let data = |len: usize, seed: u32| -> Vec<u8> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
            .collect()
    };
    // Small, empty, whole chunks with a shorter last one, whole chunks only.
    let files = [
        ("page", data(5_000, 1)),
        ("empty", Vec::new()),
        ("large", data(200_000, 2)),
        ("even", data(131_072, 3)),
    ];
    let page = fs
        .create_file(Caller::ROOT, dir, b"page", 0o640, &files[0].1, None)
        .unwrap();
    assert_eq!((page.size, page.mode & 0o7777), (5_000, 0o640));
    assert_eq!(page.kind, anvil::FileKind::File);
    for (name, bytes) in &files[1..] {
        let attr = fs
            .create_file(
                Caller::ROOT,
                dir,
                name.as_bytes(),
                0o600,
                bytes,
                Some(page.ino),
            )
            .unwrap();
        assert_eq!(attr.size, bytes.len() as u64, "{name}");
    }
    // Readable before any commit, through either call.
    for (name, bytes) in &files {
        let (ino, got) = fs.read_whole(dir, name.as_bytes()).unwrap();
        assert_eq!(&got, bytes, "{name}");
        assert_eq!(fs.lookup(dir, name.as_bytes()).unwrap().ino, ino);
        assert_eq!(&fs.read(ino, 0, 1 << 20).unwrap(), bytes, "{name}");
    }
    // The name exists: refused, the file unchanged.
    let again = fs
        .create_file(Caller::ROOT, dir, b"page", 0o600, b"other", None)
        .unwrap_err();
    assert_eq!(again.errno(), libc::EEXIST, "{again}");
    let missing = fs.read_whole(dir, b"nothing").unwrap_err();
    assert_eq!(missing.errno(), libc::ENOENT, "{missing}");
    let is_dir = fs.read_whole(1, b"d").unwrap_err();
    assert_eq!(is_dir.errno(), libc::EISDIR, "{is_dir}");
    let not_dir = fs.read_whole(page.ino, b"x").unwrap_err();
    assert_eq!(not_dir.errno(), libc::ENOTDIR, "{not_dir}");
    let bad_name = fs
        .create_file(Caller::ROOT, dir, b"a/b", 0o600, b"x", None)
        .unwrap_err();
    assert_eq!(bad_name.errno(), libc::EINVAL, "{bad_name}");

    let created = fs.sync().unwrap();
    assert_eq!(fs.read_whole(dir, b"page").unwrap().1, files[0].1);
    // One hold and one walk fewer than a lookup and a read: the name's slots and the
    // file's records, against those and the inode walked again.
    fs.getattr(dir).unwrap();
    let whole = lookups_of(&fs, || {
        fs.read_whole(dir, b"large").unwrap();
    });
    let apart = lookups_of(&fs, || {
        let ino = fs.lookup(dir, b"even").unwrap().ino;
        fs.read(ino, 0, 1 << 20).unwrap();
    });
    assert!(
        whole <= apart,
        "read_whole {whole} node lookups, apart {apart}"
    );
    fs.close().unwrap();
    drop(fs);

    // After a reopen, and as of the commits before and after.
    let fs = Filesystem::open(device, options()).unwrap();
    for (name, bytes) in &files {
        assert_eq!(&fs.read_whole(dir, name.as_bytes()).unwrap().1, bytes);
        let path = format!("/d/{name}");
        assert_eq!(&fs.at(created).unwrap().read_file(&path).unwrap(), bytes);
        assert!(fs.at(before).unwrap().read_file(&path).is_err());
    }
    assert_clean(&fs);
}
