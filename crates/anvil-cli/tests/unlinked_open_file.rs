//! A file unlinked while open stays readable and writable through its descriptor, and is
//! destroyed once the kernel lets go of it; across a remount nothing of it remains.

mod common;

use std::fs::{self, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};

#[test]
fn unlinked_open_file_lives_until_closed() {
    if !common::fuse_or_skip("unlinked_open_file_lives_until_closed") {
        return;
    }
    let mut mount = common::Mount::new();
    let path = mount.path().join("victim");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    file.write_all(&vec![7u8; 300_000]).unwrap();
    file.sync_all().unwrap();
    fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    // Still usable through the descriptor, including reads that miss the page cache.
    file.write_all(b"tail").unwrap();
    fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    file.seek(SeekFrom::Start(299_998)).unwrap();
    let mut end = Vec::new();
    file.read_to_end(&mut end).unwrap();
    assert_eq!(end, b"\x07\x07tail");
    drop(file);
    fs::write(mount.path().join("other"), b"x").unwrap();
    mount.remount();
    let names: Vec<_> = fs::read_dir(mount.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("other")]);
    mount.unmount();
}
