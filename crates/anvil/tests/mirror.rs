//! Mirroring between two volumes: a slave fed full and incremental streams reads the same as
//! its master at every TID of the mirrored range (files, attributes, links, xattrs, with
//! history and without); streams that are damaged, truncated, foreign, out of turn or
//! repeated leave the slave as it was; prune on either side, promotion, and the slave's
//! refusal of ordinary changes.

use anvil::device::{Device, MemDevice};
use anvil::fs::{AsOf, Caller, FileKind};
use anvil::{Error, Filesystem, MountOptions};
use rand::{Rng, RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

fn volume(label: &str) -> (Arc<MemDevice>, Filesystem) {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 256 << 20, label).unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    (device, fs)
}

/// Everything a reader can see in a view, as text: every path with its attributes, file
/// bytes (hashed), link targets and xattrs.
fn fingerprint(view: &AsOf<'_>, path: &str) -> String {
    let mut out = String::new();
    match view.resolve(path) {
        Ok(ino) => walk(view, ino, path, &mut out),
        Err(e) => out.push_str(&format!("{path}: {e}")),
    }
    out
}

fn walk(view: &AsOf<'_>, ino: u64, path: &str, out: &mut String) {
    let attr = view.getattr(ino).unwrap();
    out.push_str(&format!(
        "{path} {:o} n{} s{} u{} g{} m{:?} c{:?} f{}\n",
        attr.mode, attr.nlink, attr.size, attr.uid, attr.gid, attr.mtime, attr.ctime, attr.flags
    ));
    for name in view.listxattr(ino).unwrap() {
        let value = view.getxattr(ino, &name).unwrap();
        out.push_str(&format!("  xattr {name:?}={value:?}\n"));
    }
    match attr.kind {
        FileKind::File => {
            let bytes = view.read(ino, 0, attr.size as u32 + 1).unwrap();
            let hash = xxhash(&bytes);
            out.push_str(&format!("  data {} {hash:x}\n", bytes.len()));
        }
        FileKind::Symlink => {
            out.push_str(&format!("  -> {:?}\n", view.readlink(ino).unwrap()));
        }
        FileKind::Dir => {
            let mut cookie = 0;
            loop {
                let entries = view.readdir(ino, cookie, 256).unwrap();
                let Some(last) = entries.last() else { break };
                cookie = last.cookie;
                for entry in &entries {
                    if entry.name == b"." || entry.name == b".." {
                        continue;
                    }
                    let name = String::from_utf8_lossy(&entry.name);
                    walk(view, entry.ino, &format!("{path}{name}/"), out);
                }
            }
        }
        _ => {}
    }
}

fn xxhash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn view_text(fs: &Filesystem, tid: u64, path: &str) -> String {
    match fs.at(tid) {
        Ok(view) => fingerprint(&view, path),
        Err(e) => format!("no view: {e}"),
    }
}

/// Streams master's changes after `since` into `slave`; returns the stream's bytes.
fn mirror(master: &Filesystem, slave: &Filesystem, since: u64) -> Vec<u8> {
    let mut stream = Vec::new();
    master.mirror_read(since, None, &mut stream).unwrap();
    slave.mirror_write(&mut stream.as_slice()).unwrap();
    stream
}

fn last_tid(slave: &Filesystem) -> u64 {
    slave.mirror_state().unwrap().map_or(0, |s| s.last_tid)
}

/// History directories match at every TID; the whole tree (with its no-history
/// directory, which has only a present) at the newest.
fn assert_same(master: &Filesystem, slave: &Filesystem, from: u64, until: u64) {
    for tid in from..=until {
        assert_eq!(
            view_text(master, tid, "/h/"),
            view_text(slave, tid, "/h/"),
            "TID {tid}"
        );
    }
    assert_eq!(view_text(master, until, "/"), view_text(slave, until, "/"));
}

fn clean(fs: &Filesystem) {
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// One round of random changes: files written whole and in part (inline and extents),
/// removed, renamed, linked, symlinked, xattrs, in a history directory and in a no-history
/// one, then a commit.
fn random_round(fs: &Filesystem, rng: &mut Xoshiro256PlusPlus) -> u64 {
    let root = Caller { uid: 0, gid: 0 };
    for _ in 0..rng.gen_range(3..20) {
        let dir = ["/h", "/n"][rng.gen_range(0..2)];
        let name = format!("{dir}/f{}", rng.gen_range(0..24));
        match rng.gen_range(0..12) {
            0..=4 => {
                let len = [10, 3000, 70_000, 200_000][rng.gen_range(0..4)];
                let mut bytes = vec![0u8; len];
                if rng.gen_bool(0.5) {
                    rng.fill_bytes(&mut bytes);
                } else {
                    bytes.fill(rng.gen());
                }
                fs.write_file(&name, &bytes).unwrap();
            }
            5 => {
                if let Ok(ino) = fs.resolve(&name) {
                    let at = rng.gen_range(0..100_000);
                    fs.write(ino, at, b"a small overwrite").unwrap();
                }
            }
            6 => {
                let _ = fs.remove_path(&name);
            }
            7 => {
                let to = format!("{dir}/f{}", rng.gen_range(0..24));
                let _ = fs.rename_path(&name, &to);
            }
            8 => {
                if let (Ok(ino), Ok(parent)) = (fs.resolve(&name), fs.resolve(dir)) {
                    let link = format!("l{}", rng.gen_range(0..8));
                    let _ = fs.link(ino, parent, link.as_bytes());
                }
            }
            9 => {
                let parent = fs.resolve(dir).unwrap();
                let link = format!("s{}", rng.gen_range(0..8));
                let target = "t".repeat(rng.gen_range(1..300));
                let _ = fs.symlink(root, parent, link.as_bytes(), target.as_bytes());
            }
            _ => {
                if let Ok(ino) = fs.resolve(&name) {
                    let value = vec![b'v'; rng.gen_range(0..100)];
                    let _ = fs.setxattr(ino, b"user.tag", &value, false, false);
                }
            }
        }
    }
    fs.sync().unwrap()
}

fn populated_master(seed: u64) -> (Arc<MemDevice>, Filesystem, Xoshiro256PlusPlus) {
    let (device, fs) = volume("master");
    fs.mkdir_path("/h").unwrap();
    let nohistory = fs.mkdir_path("/n").unwrap();
    fs.set_nohistory(nohistory, true).unwrap();
    fs.sync().unwrap();
    (device, fs, Xoshiro256PlusPlus::seed_from_u64(seed))
}

#[test]
fn a_slave_reads_like_its_master_at_every_tid() {
    for seed in [1, 2] {
        let (_, master, mut rng) = populated_master(seed);
        let (_, slave) = volume("slave");
        for _ in 0..6 {
            random_round(&master, &mut rng);
        }
        mirror(&master, &slave, 0);
        let mut held = last_tid(&slave);
        assert_eq!(held, master.volume().committed_tid());
        assert_same(&master, &slave, 1, held);
        clean(&slave);
        for round in 0..12 {
            for _ in 0..rng.gen_range(1..4) {
                random_round(&master, &mut rng);
            }
            if round == 5 {
                master.snapshot("weekly").unwrap();
            }
            let stream = mirror(&master, &slave, held);
            let until = last_tid(&slave);
            assert!(until > held);
            // Incremental streams carry what changed, not the volume.
            assert!(stream.len() < 3 << 20, "{} bytes", stream.len());
            assert_same(&master, &slave, held + 1, until);
            held = until;
            clean(&slave);
        }
        assert_eq!(
            slave
                .snapshots()
                .unwrap()
                .iter()
                .map(|s| &s.label)
                .collect::<Vec<_>>(),
            master
                .snapshots()
                .unwrap()
                .iter()
                .map(|s| &s.label)
                .collect::<Vec<_>>()
        );
    }
}

/// The slave's whole state, to compare before and after a refused stream.
fn slave_state(slave: &Filesystem) -> (Option<u64>, u64, String) {
    let tid = slave.volume().committed_tid();
    (
        slave.mirror_state().unwrap().map(|s| s.last_tid),
        tid,
        view_text(slave, tid, "/"),
    )
}

#[test]
fn refused_streams_leave_the_slave_as_it_was() {
    let (_, master, mut rng) = populated_master(3);
    let (_, slave) = volume("slave");
    random_round(&master, &mut rng);
    let held = {
        mirror(&master, &slave, 0);
        last_tid(&slave)
    };
    for _ in 0..3 {
        random_round(&master, &mut rng);
    }
    let mut stream = Vec::new();
    master.mirror_read(held, None, &mut stream).unwrap();
    let before = slave_state(&slave);
    let free_before = slave.info().free_bytes;
    let mut refusals: Vec<(String, Vec<u8>)> = Vec::new();
    for cut in [0, 10, 40, stream.len() / 3, stream.len() - 1] {
        refusals.push((format!("truncated at {cut}"), stream[..cut].to_vec()));
    }
    for at in [45, stream.len() / 2, stream.len() - 20] {
        let mut damaged = stream.clone();
        damaged[at] ^= 0x40;
        refusals.push((format!("byte {at} flipped"), damaged));
    }
    // Out of turn: a stream that starts before (or after) what the slave holds.
    let mut early = Vec::new();
    master.mirror_read(held - 1, None, &mut early).unwrap();
    refusals.push(("out of turn".into(), early));
    // Foreign: a full stream of another volume.
    let (_, other, mut other_rng) = populated_master(9);
    random_round(&other, &mut other_rng);
    let mut foreign = Vec::new();
    other.mirror_read(held, None, &mut foreign).unwrap();
    refusals.push(("from another master".into(), foreign));
    for (what, bytes) in &refusals {
        let err = slave.mirror_write(&mut bytes.as_slice()).unwrap_err();
        assert!(matches!(err, Error::Stream(_)), "{what}: {err}");
        assert!(!err.to_string().contains('\n'), "{what}: one line");
        assert_eq!(slave_state(&slave), before, "{what}");
        assert_eq!(
            slave.info().free_bytes,
            free_before,
            "{what}: space given back"
        );
    }
    clean(&slave);
    // The right stream still applies, and applying it again is a no-op.
    slave.mirror_write(&mut stream.as_slice()).unwrap();
    let after = slave_state(&slave);
    assert!(after.0 > before.0);
    let again = slave.mirror_write(&mut stream.as_slice()).unwrap();
    assert!(again.already_held);
    assert_eq!(slave_state(&slave), after);
    assert_same(&master, &slave, held, last_tid(&slave));
}

#[test]
fn a_slave_takes_no_changes_but_mirrored_ones_until_promoted() {
    let (_, master, mut rng) = populated_master(4);
    let (device, slave) = volume("slave");
    slave.write_file("/own", b"mine").unwrap();
    slave.sync().unwrap();
    // A volume with files of its own does not become a slave.
    let err = master
        .mirror_read(0, None, &mut Vec::new())
        .and_then(|_| {
            let mut stream = Vec::new();
            master.mirror_read(0, None, &mut stream)?;
            slave.mirror_write(&mut stream.as_slice())
        })
        .unwrap_err();
    assert!(err.to_string().contains("holds files"), "{err}");
    slave.remove_path("/own").unwrap();
    slave.sync().unwrap();
    random_round(&master, &mut rng);
    mirror(&master, &slave, 0);
    let err = slave.write_file("/h/new", b"x").unwrap_err();
    assert!(matches!(err, Error::Slave), "{err}");
    assert_eq!(err.errno(), libc::EROFS);
    // The role survives a remount.
    slave.close().unwrap();
    drop(slave);
    let slave = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    assert!(slave.mirror_state().unwrap().is_some());
    assert!(matches!(slave.mkdir_path("/x"), Err(Error::Slave)));
    let held = last_tid(&slave);
    // Promoted, it continues from the master's TIDs with its own.
    let tid = slave.mirror_promote().unwrap();
    assert_eq!(tid, held);
    slave
        .write_file("/h/after-promotion", b"new master")
        .unwrap();
    let next = slave.sync().unwrap();
    assert!(next > held);
    assert_eq!(
        slave
            .at(held)
            .unwrap()
            .read_file("/h/after-promotion")
            .unwrap_err()
            .errno(),
        libc::ENOENT
    );
    assert_same(&master, &slave, 1, held);
    clean(&slave);
}

#[test]
fn prune_on_either_side_keeps_the_slave_whole() {
    let (_, master, mut rng) = populated_master(5);
    let (_, slave) = volume("slave");
    for _ in 0..4 {
        random_round(&master, &mut rng);
    }
    mirror(&master, &slave, 0);
    let first = last_tid(&slave);
    let old_view = view_text(&slave, first - 2, "/h/");
    // The master drops all its history, then changes on: the slave keeps the history it
    // has, takes the new changes, and is told how many commits it will never see.
    for _ in 0..3 {
        random_round(&master, &mut rng);
    }
    master
        .prune(Some(anvil::fs::RetentionPolicy::NONE), false)
        .unwrap();
    random_round(&master, &mut rng);
    let mut stream = Vec::new();
    let read = master.mirror_read(first, None, &mut stream).unwrap();
    assert!(read.pruned_through > 0, "{read:?}");
    let applied = slave.mirror_write(&mut stream.as_slice()).unwrap();
    assert_eq!(applied.pruned_through, read.pruned_through);
    let held = last_tid(&slave);
    assert_same(&master, &slave, held, held);
    assert_eq!(view_text(&slave, first - 2, "/h/"), old_view);
    clean(&slave);
    // The slave prunes by its own policy and reblocks, without taking a TID of its own,
    // and still follows its master; so does a reblocked master.
    slave
        .prune(Some(anvil::fs::RetentionPolicy::NONE), false)
        .unwrap();
    let moved = slave
        .reblock(anvil::fs::ReblockOptions::default(), &mut |_, _| {})
        .unwrap();
    assert!(moved.finished && moved.extents_moved > 0, "{moved:?}");
    master
        .reblock(anvil::fs::ReblockOptions::default(), &mut |_, _| {})
        .unwrap();
    assert_eq!(slave.volume().committed_tid(), held);
    random_round(&master, &mut rng);
    mirror(&master, &slave, held);
    let held = last_tid(&slave);
    assert_same(&master, &slave, held, held);
    clean(&slave);
}

#[test]
fn a_stream_can_end_before_the_newest_commit() {
    let (_, master, mut rng) = populated_master(6);
    let (_, slave) = volume("slave");
    let mut tids = Vec::new();
    for _ in 0..8 {
        tids.push(random_round(&master, &mut rng));
    }
    // Mirror in steps that stop short of the head: each step's views match.
    let mut held = 0;
    for until in [tids[2], tids[5], tids[7]] {
        let mut stream = Vec::new();
        master.mirror_read(held, Some(until), &mut stream).unwrap();
        slave.mirror_write(&mut stream.as_slice()).unwrap();
        assert_eq!(last_tid(&slave), until);
        for tid in held.max(1)..=until {
            assert_eq!(
                view_text(&master, tid, "/h/"),
                view_text(&slave, tid, "/h/"),
                "TID {tid}"
            );
        }
        held = until;
    }
    assert_same(&master, &slave, held, held);
    clean(&slave);
}

#[test]
fn an_old_master_follows_its_promoted_slave_from_the_common_tid() {
    let (_, master, mut rng) = populated_master(7);
    let (_, slave) = volume("slave");
    for _ in 0..3 {
        random_round(&master, &mut rng);
    }
    mirror(&master, &slave, 0);
    let common = last_tid(&slave);
    // The master goes on alone for a while (its later changes will be lost), and the
    // slave is promoted and takes changes of its own.
    master
        .write_file("/h/alone", b"lost when attached")
        .unwrap();
    master.remove_path("/h/f3").ok();
    master.sync().unwrap();
    slave.mirror_promote().unwrap();
    let promoted = slave.promoted_from().unwrap().unwrap();
    assert_eq!(promoted.last_tid, common);
    for _ in 0..3 {
        random_round(&slave, &mut rng);
    }
    // The old master becomes the new master's slave from the common TID on.
    let new_id = slave.mirror_state().unwrap();
    assert!(new_id.is_none());
    let mut stream = Vec::new();
    slave.mirror_read(common, None, &mut stream).unwrap();
    let err = master.mirror_write(&mut stream.as_slice()).unwrap_err();
    assert!(err.to_string().contains("not a slave"), "{err}");
    let new_master_id = {
        let info = slave.info();
        let mut id = [0u8; 16];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&info.volume_id[2 * i..2 * i + 2], 16).unwrap();
        }
        id
    };
    master
        .mirror_attach(new_master_id, common, promoted.last_commit_ns)
        .unwrap();
    assert!(matches!(master.write_file("/h/x", b"x"), Err(Error::Slave)));
    master.mirror_write(&mut stream.as_slice()).unwrap();
    let held = last_tid(&master);
    assert_eq!(held, slave.volume().committed_tid());
    assert_same(&slave, &master, 1, held);
    clean(&master);
}

#[test]
fn attach_refuses_when_files_without_history_changed() {
    let (_, master, mut rng) = populated_master(8);
    let at = random_round(&master, &mut rng);
    master.write_file("/n/changed", b"no history").unwrap();
    master.sync().unwrap();
    let err = master.mirror_attach([1; 16], at, 0).unwrap_err();
    assert!(err.to_string().contains("keeps no history"), "{err}");
    assert!(master.mirror_state().unwrap().is_none());
    master.write_file("/h/still-a-master", b"yes").unwrap();
}

/// A mirror-write killed at any point of a stream is, for the slave, a stream that ends
/// there: cut a recorded multi-block stream at many points, each leaves the slave as it was
/// (and its space free), and the whole stream still applies after all of them.
#[test]
fn a_stream_cut_anywhere_leaves_the_slave_as_it_was() {
    let (_, master, mut rng) = populated_master(10);
    let (_, slave) = volume("slave");
    random_round(&master, &mut rng);
    mirror(&master, &slave, 0);
    let held = last_tid(&slave);
    for _ in 0..4 {
        random_round(&master, &mut rng);
    }
    // Incompressible data so the stream spans several blocks.
    let mut big = vec![0u8; 3 << 20];
    rng.fill_bytes(&mut big);
    master.write_file("/h/big", &big).unwrap();
    master.sync().unwrap();
    let mut stream = Vec::new();
    master.mirror_read(held, None, &mut stream).unwrap();
    assert!(stream.len() > 3 << 20);
    let before = slave_state(&slave);
    let free = slave.info().free_bytes;
    let cuts = (0..64)
        .map(|i| stream.len() * i / 64)
        .chain([stream.len() - 1]);
    for cut in cuts {
        let err = slave.mirror_write(&mut &stream[..cut]).unwrap_err();
        assert!(matches!(err, Error::Stream(_)), "cut at {cut}: {err}");
        assert_eq!(slave.info().free_bytes, free, "cut at {cut}");
    }
    assert_eq!(slave_state(&slave), before);
    slave.mirror_write(&mut stream.as_slice()).unwrap();
    assert_eq!(slave.read_file("/h/big").unwrap(), big);
    assert_same(&master, &slave, held, last_tid(&slave));
    clean(&slave);
}

/// A well-formed stream that no master writes (TIDs outside its range, the slave's own
/// mirror record, an object its header does not count) is refused like a damaged one.
#[test]
fn items_outside_the_range_are_refused() {
    use anvil::format::record::{rtype, Element, Key, Payload};
    use anvil::format::stream::{Item, StreamHeader, StreamWriter};
    let (_, master, mut rng) = populated_master(11);
    let (_, slave) = volume("slave");
    random_round(&master, &mut rng);
    mirror(&master, &slave, 0);
    let state = slave.mirror_state().unwrap().unwrap();
    let header = StreamHeader {
        master: state.master,
        since: state.last_tid,
        until: state.last_tid + 2,
        exact: true,
        next_obj: 100,
        live_objects: 3,
        commit_time_ns: 1,
    };
    let insert = |obj: u64, rtype: u8, key: u64, create_tid: u64| {
        Item::Insert(Element {
            key: Key {
                obj,
                rtype,
                key,
                create_tid,
            },
            delete_tid: 0,
            payload: Payload::Inline(vec![1; 8]),
        })
    };
    let before = slave_state(&slave);
    for item in [
        insert(50, rtype::INODE, 0, state.last_tid),
        insert(50, rtype::INODE, 0, state.last_tid + 3),
        insert(0, rtype::CONFIG, 4, state.last_tid + 1),
        // An object at or above the header's next object id (the slave's lookups take
        // that number as a bound).
        insert(100, rtype::INODE, 0, state.last_tid + 1),
        Item::Keep(Key {
            obj: 50,
            rtype: rtype::INODE,
            key: 0,
            create_tid: state.last_tid + 1,
        }),
        // An extent the read path would refuse as damage: larger than any stored chunk.
        Item::InsertExtent {
            key: Key {
                obj: 50,
                rtype: rtype::DATA,
                key: 65536,
                create_tid: state.last_tid + 1,
            },
            delete_tid: 0,
            compression: 0,
            logical_bytes: 65536,
            checksum: anvil::checksum::checksum(&[7; 200_000]),
            stored: vec![7; 200_000],
        },
    ] {
        let mut writer = StreamWriter::new(Vec::new(), &header).unwrap();
        writer.push(&item).unwrap();
        let (bytes, _) = writer.finish(0).unwrap();
        let err = slave.mirror_write(&mut bytes.as_slice()).unwrap_err();
        assert!(matches!(err, Error::Stream(_)), "{item:?}: {err}");
        if matches!(&item, Item::Insert(e) if e.key.obj == 100) {
            assert!(err.to_string().contains("next object id 100"), "{err}");
        }
        if matches!(item, Item::InsertExtent { .. }) {
            assert!(err.to_string().contains("200000 stored"), "{err}");
        }
        assert_eq!(slave_state(&slave), before);
    }
    assert!(!slave.volume().is_read_only());
    clean(&slave);
}
