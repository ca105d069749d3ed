//! Committed format fixtures: small images written by earlier builds, checked in with a
//! manifest of what every file held at every TID. Each is opened, read at every TID and
//! compared with its manifest, checked, then written to and checked again. Encode/decode
//! round trips cannot catch a change made to both sides; these images can.
//!
//! Fixtures (`tests/fixtures/NAME.img.zst` and `NAME.manifest`):
//! - `format-v2-nomap`: format version 2 as written before space maps (superblock payload
//!   ends at the label; mount walks the tree).
//! - `format-v2`: format version 2 with a space map per commit.
//! - `format-v3-killed`: format version 3 (the log a ring of per-operation batches), taken
//!   from a writer that was never closed: after the three commits, changes that only the
//!   redo log holds (a new directory and file, a small write that the log holds as a
//!   splice, a rename and a delete). Its manifest adds the state recovery must rebuild.
//! - `format-v4-killed`: format version 4 (a PATCH may extend its chunk), taken as
//!   `format-v3-killed` was, with appends to a stored chunk in two commits and one that
//!   only the redo log holds.
//!
//! - `format-v5-killed`: format version 5 (whole chunks written ahead of their commit, the
//!   log naming their extents), taken as `format-v4-killed` was, with a file of whole
//!   chunks, one of them rewritten in part, that only the redo log names.
//! - `format-v6-killed`: format version 6 (leaves hold packed elements, data inline up to
//!   512 bytes), taken as `format-v5-killed` was.
//! - `format-v7-killed`: format version 7 (extents in a locality set name it), taken as
//!   `format-v6-killed` was, with a page and two images named together by hints.
//! - `format-v8-killed`: format version 8 (small extents packed back to back at byte
//!   offsets, the space map in bytes), taken as `format-v7-killed` was.
//! - `format-v9-killed`: format version 9 (a commit's superblock names the manifest of its
//!   writes, which mount checks), taken as `format-v8-killed` was: its last superblock is
//!   not `proven`, so opening it reads and checks the last commit's manifest.
//!
//! Each later format change adds its own pair. To write one with the current build:
//! `ANVIL_WRITE_FIXTURE=NAME cargo test --release -p anvil --test format_fixture -- --ignored`

use anvil::device::{Device, MemDevice};
use anvil::fs::{AsOf, Caller, FileKind, RenameFlags, SetAttr};
use anvil::{Filesystem, MountOptions};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

const FIXTURES: [&str; 9] = [
    "format-v2-nomap",
    "format-v2",
    "format-v3-killed",
    "format-v4-killed",
    "format-v5-killed",
    "format-v6-killed",
    "format-v7-killed",
    "format-v8-killed",
    "format-v9-killed",
];
const VOLUME_BYTES: u64 = 16 << 20;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

/// Seeded bytes; `zero_percent` of every 4 KiB block is zeros (compressible).
fn bytes(len: usize, seed: u64, zero_percent: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 4096 < 4096 * zero_percent / 100 {
                0
            } else {
                x as u8
            }
        })
        .collect()
}

/// The history every fixture holds: files inline and in extents, compressible and not, a
/// patch, renames, hard links, symlinks, xattrs, a truncate, deletes and a snapshot, over
/// three commits. Returns the TIDs to read at.
fn populate(fs: &Filesystem) -> Vec<u64> {
    let root = Caller::ROOT;
    let docs = fs.mkdir_path("/docs").unwrap();
    let a = fs.write_file("/docs/a.txt", b"hello, history\n").unwrap();
    fs.setxattr(a, b"user.note", b"first", true, false).unwrap();
    fs.write_file("/big.bin", &bytes(200_000, 1, 75)).unwrap();
    fs.write_file("/zero.bin", &bytes(131_072, 2, 90)).unwrap();
    fs.symlink(root, 1, b"link", b"docs/a.txt").unwrap();
    let log = fs.write_file("/log.txt", &bytes(20_000, 4, 40)).unwrap();
    // A page and its images named together: a locality set (format version 7).
    let page = fs
        .write_file("/docs/page.html", &bytes(3000, 7, 50))
        .unwrap();
    for (i, len) in [2000, 6000].into_iter().enumerate() {
        let image = fs
            .write_file(&format!("/docs/img{i}"), &bytes(len, 8 + i as u64, 0))
            .unwrap();
        fs.set_locality(image, page);
    }
    let tid1 = fs.sync().unwrap();

    let big = fs.resolve("/big.bin").unwrap();
    fs.write(big, 70_000, &bytes(4096, 3, 0)).unwrap();
    fs.write(a, 15, b"second line\n").unwrap();
    // Appends to a stored chunk: patches that extend it (format version 4).
    fs.write(log, 20_000, &bytes(1500, 5, 0)).unwrap();
    fs.rename(docs, b"a.txt", docs, b"b.txt", RenameFlags::default())
        .unwrap();
    fs.link(a, 1, b"hard").unwrap();
    fs.setxattr(a, b"user.note", b"second", false, true)
        .unwrap();
    let tid2 = fs.sync().unwrap();
    fs.snapshot("before-delete").unwrap();

    fs.remove_path("/zero.bin").unwrap();
    let truncate = SetAttr {
        mode: None,
        uid: None,
        gid: None,
        size: Some(100_000),
        atime: None,
        mtime: None,
        ctime: None,
    };
    fs.setattr(big, &truncate).unwrap();
    let deep = fs.mkdir_path("/deep").unwrap();
    let x = fs.mkdir(root, deep, b"x", 0o750).unwrap().ino;
    fs.mknod(root, x, b"empty", 0o100600, 0).unwrap();
    let long_target: Vec<u8> = (0..2500).map(|i| b'a' + (i % 26) as u8).collect();
    fs.symlink(root, x, b"long", &long_target).unwrap();
    fs.write(log, 21_500, &bytes(2600, 6, 20)).unwrap();
    let tid3 = fs.sync().unwrap();
    vec![tid1, tid2, tid3]
}

/// One line per object reachable from the root at this view, in path order.
fn describe(view: &AsOf<'_>) -> String {
    let mut lines = BTreeMap::new();
    let mut stack = vec![(1u64, String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        for entry in view.readdir(dir, 0, usize::MAX).unwrap() {
            if entry.name == b"." || entry.name == b".." {
                continue;
            }
            let path = format!("{prefix}/{}", String::from_utf8_lossy(&entry.name));
            let attr = view.getattr(entry.ino).unwrap();
            let content = match attr.kind {
                FileKind::Dir => {
                    stack.push((entry.ino, path.clone()));
                    String::new()
                }
                FileKind::Symlink => {
                    let target = view.readlink(entry.ino).unwrap();
                    format!("{:016x}", anvil::checksum::checksum(&target))
                }
                _ => {
                    let data = view.read(entry.ino, 0, attr.size as u32).unwrap();
                    assert_eq!(data.len() as u64, attr.size, "{path}");
                    format!("{:016x}", anvil::checksum::checksum(&data))
                }
            };
            let mut xattrs = String::new();
            for name in view.listxattr(entry.ino).unwrap() {
                let value = view.getxattr(entry.ino, &name).unwrap();
                let _ = write!(
                    xattrs,
                    " {}={}",
                    String::from_utf8_lossy(&name),
                    String::from_utf8_lossy(&value)
                );
            }
            lines.insert(
                path.clone(),
                format!(
                    "{path} {:?} mode={:o} nlink={} size={} {content}{xattrs}",
                    attr.kind, attr.mode, attr.nlink, attr.size
                ),
            );
        }
    }
    lines.into_values().map(|l| l + "\n").collect()
}

fn manifest(fs: &Filesystem, tids: &[u64]) -> String {
    let mut out = String::new();
    for tid in tids {
        let _ = writeln!(out, "tid {tid:#x}");
        out.push_str(&describe(&fs.at(*tid).unwrap()));
    }
    out
}

fn open_fixture(name: &str) -> (Arc<MemDevice>, String) {
    let dir = fixture_dir();
    let packed = std::fs::read(dir.join(format!("{name}.img.zst"))).unwrap();
    let image = zstd::decode_all(&packed[..]).unwrap();
    assert_eq!(image.len() as u64, VOLUME_BYTES);
    let manifest = std::fs::read_to_string(dir.join(format!("{name}.manifest"))).unwrap();
    (Arc::new(MemDevice::from_bytes(image)), manifest)
}

#[test]
fn every_fixture_reads_back_at_every_tid_and_checks_clean() {
    for name in FIXTURES {
        let (device, expected) = open_fixture(name);
        // The last commit of a version-9 writer killed after it names its manifest, and
        // nothing proved it: open checks every range it lists.
        let sb = anvil::internals::Volume::read_superblock(&*device).unwrap();
        assert_eq!(
            sb.manifest_address != 0 && !sb.proven,
            name >= "format-v9",
            "{name}: a commit to check at mount"
        );
        let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
        // Maps before format version 8 count whole blocks (and each extent's last block
        // whole): mount walks the tree instead, and the next commit writes one in bytes.
        assert_eq!(
            fs.volume().space_map_was_read(),
            name >= "format-v8",
            "{name}: how mount found the free space"
        );
        let tids: Vec<u64> = expected
            .lines()
            .filter_map(|l| l.strip_prefix("tid 0x"))
            .map(|t| u64::from_str_radix(t, 16).unwrap())
            .collect();
        assert_eq!(tids.len(), 3, "{name}: manifest lists its TIDs");
        let got = manifest(&fs, &tids) + &recovered(&fs, name);
        assert_eq!(got, expected, "{name}: contents differ from the manifest");
        let labels: Vec<String> = fs
            .snapshots()
            .unwrap()
            .into_iter()
            .map(|s| s.label)
            .collect();
        assert_eq!(labels, ["before-delete"], "{name}");
        let (mut in_sets, mut packed) = (0, 0);
        fs.volume()
            .scan(&mut |element| {
                in_sets += usize::from(element.extent().and_then(|e| e.set_span()).is_some());
                packed += usize::from(element.extent().is_some_and(|e| e.offset % 4096 != 0));
                true
            })
            .unwrap();
        assert_eq!(in_sets > 0, name >= "format-v7", "{name}: extents in sets");
        assert_eq!(
            packed > 0,
            name >= "format-v8",
            "{name}: extents inside a block"
        );
        let report = anvil::check::check(fs.volume()).unwrap();
        assert!(report.is_clean(), "{name}: {:?}", report.problems);
        // The current build writes on top, and the result still reads and checks.
        fs.write_file("/docs/new", b"written by this build")
            .unwrap();
        fs.sync().unwrap();
        fs.close().unwrap();
        drop(fs);
        let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
        assert!(
            fs.volume().space_map_was_read(),
            "{name}: no map after a commit"
        );
        let got = manifest(&fs, &tids);
        assert!(expected.starts_with(&got), "{name} after a write");
        let report = anvil::check::check(fs.volume()).unwrap();
        assert!(report.is_clean(), "{name}: {:?}", report.problems);
    }
}

/// For a fixture taken from a killed writer: the state its redo log rebuilt, which the
/// open that replayed it committed as the newest TID.
fn recovered(fs: &Filesystem, name: &str) -> String {
    if !name.ends_with("-killed") {
        return String::new();
    }
    let view = fs.at(fs.volume().committed_tid()).unwrap();
    format!("recovered\n{}", describe(&view))
}

/// Changes the log alone holds in a `-killed` fixture.
fn unlogged_changes(fs: &Filesystem) {
    fs.mkdir_path("/after").unwrap();
    fs.write_file("/after/log-only", &bytes(70_000, 9, 50))
        .unwrap();
    let ino = fs.resolve("/after/log-only").unwrap();
    fs.write(ino, 100, b"spliced").unwrap();
    fs.rename_path("/docs/b.txt", "/after/b.txt").unwrap();
    fs.remove_path("/deep/x/empty").unwrap();
    let log = fs.resolve("/log.txt").unwrap();
    fs.write(log, 24_100, b"a line only the log holds\n")
        .unwrap();
    // Whole chunks written ahead (format version 5): the log holds their addresses, and
    // the second is then rewritten in part (its first extent never reaches a tree).
    let ahead = fs
        .write_file("/after/ahead", &bytes(3 * 65_536, 10, 0))
        .unwrap();
    fs.write(ahead, 65_536 + 300, b"over a chunk written ahead")
        .unwrap();
}

/// Writes `tests/fixtures/$ANVIL_WRITE_FIXTURE.{img.zst,manifest}` with this build; a name
/// ending in `-killed` also makes changes after the last commit and takes the image without
/// closing (as a killed daemon leaves it).
#[test]
#[ignore = "writes a fixture; run by hand for a new format version"]
fn write_fixture() {
    let Ok(name) = std::env::var("ANVIL_WRITE_FIXTURE") else {
        eprintln!("set ANVIL_WRITE_FIXTURE=NAME to write a fixture");
        return;
    };
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), VOLUME_BYTES, "fixture").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let tids = populate(&fs);
    let mut text = manifest(&fs, &tids);
    let killed = name.ends_with("-killed");
    if killed {
        unlogged_changes(&fs);
    } else {
        fs.close().unwrap();
    }
    let mut image = vec![0u8; VOLUME_BYTES as usize];
    device.read_at(&mut image, 0).unwrap();
    drop(fs);
    if killed {
        let replayed = Arc::new(MemDevice::from_bytes(image.clone()));
        let fs = Filesystem::open(replayed as Arc<dyn Device>, options()).unwrap();
        text += &recovered(&fs, &name);
    }
    let packed = zstd::encode_all(&image[..], 19).unwrap();
    let dir = fixture_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.img.zst")), packed).unwrap();
    std::fs::write(dir.join(format!("{name}.manifest")), text).unwrap();
}
