//! A flipped bit is never returned as data: a damaged extent makes reads of that range fail
//! (EIO at the FUSE edge) while other ranges still read, `check` names the object and file
//! offset, and a damaged tree node turns the volume read-only.

use anvil::device::{Device, MemDevice};
use anvil::format::record::rtype;
use anvil::{Error, Filesystem, MountOptions};
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

fn volume_with_file() -> (Arc<MemDevice>, u64, Vec<u8>) {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 32 << 20, "bits").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let ino = fs.write_file("/file", &data).unwrap();
    fs.close().unwrap();
    (device, ino, data)
}

/// (device offset, file offset) of the extents of `ino`.
fn extents_of(fs: &Filesystem, ino: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    fs.volume()
        .scan(&mut |e| {
            if e.key.obj == ino && e.key.rtype == rtype::DATA {
                if let Some(extent) = e.extent() {
                    out.push((extent.offset, e.key.key - 65536));
                }
            }
            true
        })
        .unwrap();
    out
}

#[test]
fn flipped_data_bit_fails_only_that_range_and_check_names_it() {
    let (device, ino, data) = volume_with_file();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let extents = extents_of(&fs, ino);
    assert!(extents.len() >= 3);
    let (device_offset, file_offset) = extents[1];
    drop(fs);
    let mut image = device.to_bytes();
    image[device_offset as usize + 100] ^= 0x10;
    let fs = Filesystem::open(
        Arc::new(MemDevice::from_bytes(image)) as Arc<dyn Device>,
        options(),
    )
    .unwrap();
    let damaged = fs.read(ino, file_offset, 4096);
    assert!(
        matches!(&damaged, Err(Error::Corrupt { .. })),
        "{damaged:?}"
    );
    assert_eq!(damaged.unwrap_err().errno(), libc::EIO);
    // The chunks around it are intact and still read.
    assert_eq!(fs.read(ino, 0, 4096).unwrap(), &data[..4096]);
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(!report.is_clean());
    let named = format!("object {ino} at file offset {file_offset}");
    assert!(
        report.problems.iter().any(|p| p.contains(&named)),
        "{:?}",
        report.problems
    );
}

#[test]
fn damaged_tree_node_turns_volume_read_only() {
    let (device, _ino, _) = volume_with_file();
    let root_address = {
        let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
        fs.volume().root().root.address
    };
    let mut image = device.to_bytes();
    image[root_address as usize + 200] ^= 0x01;
    let damaged = Arc::new(MemDevice::from_bytes(image));
    // Mount walks the tree to rebuild the space map: a damaged node is refused there.
    let opened = Filesystem::open(damaged.clone() as Arc<dyn Device>, options());
    assert!(
        matches!(opened, Err(Error::Corrupt { .. })),
        "mount must refuse a damaged tree"
    );
}

#[test]
fn corruption_found_while_mounted_turns_volume_read_only() {
    let (device, ino, _) = volume_with_file();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let root_address = fs.volume().root().root.address;
    // Damage the root node behind the mounted volume's back, then force a re-read.
    let mut node = vec![0u8; 16384];
    device.read_at(&mut node, root_address).unwrap();
    node[300] ^= 0x40;
    device.write_at(&node, root_address).unwrap();
    fs.volume().drop_caches();
    let failed = fs.getattr(ino);
    assert!(matches!(failed, Err(Error::Corrupt { .. })), "{failed:?}");
    assert!(fs.volume().is_read_only());
    let write = fs.write(ino, 0, b"x");
    // Not the error of an `ro` mount: the write says why the volume stopped.
    let Err(Error::Stopped(why)) = &write else {
        panic!("{write:?}")
    };
    assert!(why.contains("corruption detected"), "{why}");
    assert_eq!(write.unwrap_err().errno(), libc::EROFS);
}

/// Every element's object lies below the superblock's next object id: lookups of newer
/// objects do not read the tree. A superblock that says otherwise is damage `check` names.
#[test]
fn check_names_an_object_above_the_next_object_id() {
    let (device, ino, _) = volume_with_file();
    let mut sb = anvil::internals::Volume::read_superblock(&*device).unwrap();
    assert!(sb.next_obj > ino);
    sb.next_obj = ino;
    device.write_at(&sb.encode(), sb.address()).unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    let report = anvil::check::check(fs.volume()).unwrap();
    let named = format!("obj: {ino}");
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("next object id") && p.contains(&named)),
        "{:?}",
        report.problems
    );
}
