//! The space map each commit writes: mount reads it instead of walking the tree, it always
//! agrees with the tree (check compares them), and a damaged or lying map is never trusted
//! blindly: mount falls back to the walk, check reports it, nothing is lost.

use anvil::device::{Device, MemDevice};
use anvil::format::spacemap;
use anvil::internals::{read_space_map, Volume};
use anvil::{Filesystem, MountOptions};
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

/// A volume with files, deletes, history and a prune behind it, closed cleanly.
fn populated() -> Arc<MemDevice> {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "map").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    fs.mkdir_path("/d").unwrap();
    for i in 0..300u32 {
        let body: Vec<u8> = (0..(i * 997 % 150_000)).map(|b| (b * i) as u8).collect();
        fs.write_file(&format!("/d/f{i}"), &body).unwrap();
        if i % 50 == 49 {
            fs.sync().unwrap();
        }
    }
    for i in (0..300u32).step_by(3) {
        fs.remove_path(&format!("/d/f{i}")).unwrap();
    }
    fs.sync().unwrap();
    fs.prune(None, true).unwrap();
    fs.write_file("/after-prune", b"still here").unwrap();
    fs.close().unwrap();
    device
}

fn open(device: &Arc<MemDevice>) -> Filesystem {
    Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap()
}

fn assert_contents(fs: &Filesystem) {
    for i in 0..300u32 {
        let path = format!("/d/f{i}");
        if i % 3 == 0 {
            assert!(fs.read_file(&path).is_err(), "{path} came back");
        } else {
            let body: Vec<u8> = (0..(i * 997 % 150_000)).map(|b| (b * i) as u8).collect();
            assert_eq!(fs.read_file(&path).unwrap(), body, "{path}");
        }
    }
    assert_eq!(fs.read_file("/after-prune").unwrap(), b"still here");
}

#[test]
fn mount_reads_the_map_and_it_matches_the_tree() {
    let device = populated();
    let fs = open(&device);
    assert!(fs.volume().space_map_was_read(), "mount walked the tree");
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    assert_contents(&fs);
    // The counts a walk would give, without the walk.
    let info = fs.info();
    assert_eq!(info.objects, report.objects);
    // New writes allocate from the map that was read and the result checks clean.
    fs.write_file("/new", &vec![7u8; 300_000]).unwrap();
    fs.sync().unwrap();
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// Rewrites the map the superblock points to with `edit` applied to its ranges, keeping the
/// block well formed; `fix_used` also rewrites the superblock's used count to match.
fn rewrite_map(device: &Arc<MemDevice>, edit: impl Fn(&mut Vec<(u64, u64)>), fix_used: bool) {
    let mut sb = Volume::read_superblock(&**device).unwrap();
    let mut ranges = read_space_map(&**device, &sb).unwrap().unwrap();
    edit(&mut ranges);
    let payload = spacemap::encode_payload(&ranges, sb.data_offset);
    let block = spacemap::seal(
        &payload,
        sb.volume_id,
        sb.committed_tid,
        sb.space_map_address,
        sb.space_map_bytes,
    );
    device.write_at(&block, sb.space_map_address).unwrap();
    if fix_used {
        let free: u64 = ranges.iter().map(|(_, l)| l).sum();
        sb.used_bytes = sb.volume_bytes - sb.data_offset - free;
        device.write_at(&sb.encode(), sb.address()).unwrap();
    }
}

#[test]
fn a_map_that_lies_is_reported_by_check() {
    let device = populated();
    // Claim the largest free range is in use: a leak, which the used count then agrees with.
    rewrite_map(
        &device,
        |ranges| {
            let largest = (0..ranges.len()).max_by_key(|&i| ranges[i].1).unwrap();
            ranges.remove(largest);
        },
        true,
    );
    let fs = open(&device);
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.contains("disagrees with the tree")),
        "{:?}",
        report.problems
    );
    assert_contents(&fs);
}

#[test]
fn a_map_that_disagrees_with_the_superblock_is_not_used() {
    // Hand out all space as free without touching the superblock's count: mount must
    // notice and walk, or it would allocate over live data.
    let device = populated();
    let sb = Volume::read_superblock(&*device).unwrap();
    rewrite_map(
        &device,
        |ranges| {
            ranges.clear();
            ranges.push((sb.data_offset, sb.volume_bytes - sb.data_offset));
        },
        false,
    );
    let fs = open(&device);
    assert!(!fs.volume().space_map_was_read());
    fs.write_file("/new", &vec![9u8; 2 << 20]).unwrap();
    fs.sync().unwrap();
    assert_contents(&fs);
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

#[test]
fn a_damaged_map_is_walked_around_and_replaced_by_the_next_commit() {
    let device = populated();
    let sb = Volume::read_superblock(&*device).unwrap();
    let mut block = vec![0u8; 4096];
    device.read_at(&mut block, sb.space_map_address).unwrap();
    block[100] ^= 0x40;
    device.write_at(&block, sb.space_map_address).unwrap();
    // Read-only, nothing is written: check sees the damaged map the superblock names.
    let read_only = MountOptions {
        read_only: true,
        ..options()
    };
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, read_only).unwrap();
    assert!(!fs.volume().space_map_was_read());
    assert_contents(&fs);
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(
        report.problems.iter().any(|p| p.contains("space map")),
        "{:?}",
        report.problems
    );
    drop(fs);
    // A writer walks around it, and its first superblock no longer names it.
    let fs = open(&device);
    assert!(!fs.volume().space_map_was_read());
    assert_contents(&fs);
    fs.write_file("/new", b"x").unwrap();
    fs.sync().unwrap();
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    fs.close().unwrap();
    drop(fs);
    let fs = open(&device);
    assert!(fs.volume().space_map_was_read());
    assert_contents(&fs);
}
