//! Broken invariants fail loudly: a damaged link count, entry count or parent chain is
//! reported as corruption (EIO), never clamped or walked around, and the volume stops taking
//! changes (read-only) while what it holds stays readable.

use anvil::device::{Device, MemDevice};
use anvil::format::record::{rtype, Inode, LogicalKey};
use anvil::fs::RenameFlags;
use anvil::{Error, Filesystem, MountOptions};
use std::sync::Arc;

fn open() -> Filesystem {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 32 << 20, "inv").unwrap();
    let options = MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    };
    Filesystem::open(device as Arc<dyn Device>, options).unwrap()
}

/// Rewrites object `obj`'s inode with `edit` applied, below the POSIX layer.
fn damage_inode(fs: &Filesystem, obj: u64, edit: impl Fn(&mut Inode)) {
    let lk = LogicalKey {
        obj,
        rtype: rtype::INODE,
        key: 0,
    };
    fs.volume()
        .run(true, |tx| {
            let bytes = tx.get_bytes(lk)?.expect("inode exists");
            let mut inode = Inode::decode(&bytes)?;
            edit(&mut inode);
            tx.put(lk, Some(Arc::new(inode.encode())))
        })
        .unwrap();
}

fn assert_corrupt<T: std::fmt::Debug>(fs: &Filesystem, result: anvil::Result<T>, what: &str) {
    assert!(fs.volume().is_read_only(), "the volume still takes changes");
    match result {
        Err(e @ Error::Corrupt { .. }) => {
            assert_eq!(e.errno(), libc::EIO);
            assert!(e.to_string().contains(what), "{e}");
        }
        other => panic!("expected corruption ({what}), got {other:?}"),
    }
}

#[test]
fn a_zero_link_count_under_a_name_is_corruption() {
    let fs = open();
    let ino = fs.write_file("/f", b"x").unwrap();
    damage_inode(&fs, ino, |inode| inode.nlink = 0);
    let result = fs.unlink(1, b"f");
    assert_corrupt(&fs, result, "link count already zero");
    // Nothing was changed by the failed unlink.
    assert_eq!(fs.read_file("/f").unwrap(), b"x");
}

#[test]
fn a_directory_entry_count_below_zero_is_corruption() {
    let fs = open();
    let dir = fs.mkdir_path("/d").unwrap();
    fs.write_file("/d/f", b"x").unwrap();
    damage_inode(&fs, dir, |inode| inode.size = 0);
    let result = fs.unlink(dir, b"f");
    assert_corrupt(&fs, result, "entry count would fall below zero");
    assert_eq!(fs.read_file("/d/f").unwrap(), b"x");
}

#[test]
fn a_directory_link_count_below_zero_is_corruption() {
    let fs = open();
    let dir = fs.mkdir_path("/d").unwrap();
    fs.mkdir_path("/d/sub").unwrap();
    // Removing /d/sub takes the link its ".." gave /d: none is left to take.
    damage_inode(&fs, dir, |inode| inode.nlink = 0);
    let result = fs.rmdir(dir, b"sub");
    assert_corrupt(&fs, result, "link count would fall below zero");
    assert!(fs.lookup(dir, b"sub").is_ok());
}

#[test]
fn a_looping_parent_chain_is_corruption_not_a_bound() {
    let fs = open();
    let a = fs.mkdir_path("/a").unwrap();
    let b = fs.mkdir_path("/a/b").unwrap();
    fs.mkdir_path("/x").unwrap();
    // /a's parent now points below itself: walking up from /a/b never reaches the root.
    damage_inode(&fs, a, |inode| inode.parent_hint = b);
    let result = fs.rename(1, b"x", b, b"x", RenameFlags::default());
    assert_corrupt(&fs, result, "parent chain loops");
}

#[test]
fn deep_trees_are_not_mistaken_for_loops() {
    // Deeper than the old 4,096-hop bound: moving a directory under the deepest one walks
    // the whole chain and succeeds.
    let fs = open();
    let mut dir = 1;
    for _ in 0..5000 {
        dir = fs
            .mkdir(anvil::fs::Caller::ROOT, dir, b"d", 0o755)
            .unwrap()
            .ino;
    }
    let x = fs.mkdir_path("/x").unwrap();
    fs.rename(1, b"x", dir, b"x", RenameFlags::default())
        .unwrap();
    // And the deepest directory cannot be moved below itself through its ancestors.
    assert_eq!(
        fs.rename(1, b"d", x, b"d", RenameFlags::default())
            .unwrap_err()
            .errno(),
        libc::EINVAL
    );
    assert!(!fs.volume().is_read_only());
}
