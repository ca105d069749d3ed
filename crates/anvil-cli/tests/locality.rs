//! Locality hints through a real mount (`trusted.anvil.near`): a page's images, created
//! interleaved with other files, name the page, and the commit writes the page and its
//! images as one locality set; the attribute is never stored, and a bad value is refused.

mod common;

use anvil::format::record::rtype;
use anvil::{Filesystem, MountOptions};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const NEAR: &std::ffi::CStr = c"trusted.anvil.near";
const COPY: &std::ffi::CStr = c"trusted.anvil.copy";

fn set_near(path: &Path, value: &[u8]) -> std::io::Result<()> {
    set_attr(path, NEAR, value)
}

fn set_attr(path: &Path, name: &std::ffi::CStr, value: &[u8]) -> std::io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: NUL-terminated path and name; the value outlives the call.
    let ret = unsafe {
        libc::setxattr(
            c.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    match ret {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// Commits everything written to the mount so far.
fn synctid(mount: &common::Mount) {
    let dir = mount.path().to_str().unwrap().to_string();
    let out = mount.anvil("synctid", &["synctid", &dir]);
    assert!(out.status.success(), "{out}");
}

fn open_read_only(image: &Path) -> Filesystem {
    let options = MountOptions {
        read_only: true,
        ..Default::default()
    };
    Filesystem::open_path(image, options).unwrap()
}

/// The locality set of each live file's data extent (None: in no set), by inode.
fn sets(fs: &Filesystem) -> HashMap<u64, Option<(u64, u64)>> {
    let mut sets = HashMap::new();
    fs.volume()
        .scan(&mut |element| {
            if let (rtype::DATA, Some(extent), 0) =
                (element.key.rtype, element.extent(), element.delete_tid)
            {
                sets.insert(element.key.obj, extent.set_span());
            }
            true
        })
        .unwrap();
    sets
}

#[test]
fn a_page_named_through_the_mount_is_one_set() {
    if !common::fuse_or_skip("a_page_named_through_the_mount_is_one_set") {
        return;
    }
    // No timed commit in between: the page and its images go to the unmount's commit.
    let mut mount = common::Mount::with_options("64M", Some("commit_interval_ms=600000"));
    let root = mount.path().to_path_buf();
    let page = root.join("page.html");
    std::fs::write(&page, common::pattern(3000, 1)).unwrap();
    let page_ino = std::fs::metadata(&page).unwrap().ino();
    let mut images = Vec::new();
    for i in 0..4u64 {
        // Another client's file between each of this page's images.
        std::fs::write(
            root.join(format!("other{i}")),
            common::pattern(5000, 50 + i),
        )
        .unwrap();
        let image = root.join(format!("img{i}"));
        std::fs::write(&image, common::pattern(5000, 10 + i)).unwrap();
        set_near(&image, page_ino.to_string().as_bytes()).unwrap();
        images.push(std::fs::metadata(&image).unwrap().ino());
    }
    // Not a number: refused. Not stored: nothing to read back.
    let refused = set_near(&root.join("img0"), b"page.html").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EINVAL));
    let c = CString::new(root.join("img0").as_os_str().as_bytes()).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: NUL-terminated path and name, and a buffer of the length given.
    let got = unsafe { libc::getxattr(c.as_ptr(), NEAR.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert!(got < 0, "the hint was stored");
    for i in 0..4u64 {
        assert_eq!(
            std::fs::read(root.join(format!("img{i}"))).unwrap(),
            common::pattern(5000, 10 + i)
        );
    }
    mount.unmount_keep_image();
    let check = mount.check();
    assert!(check.status.success(), "{check}");
    if mount.on_a_store() {
        return;
    }
    let fs = open_read_only(mount.image());
    let sets = sets(&fs);
    let set = sets[&page_ino].expect("the page is in a set");
    for ino in &images {
        assert_eq!(sets[ino], Some(set), "image {ino}");
    }
    // Page (3,000 bytes, or fewer compressed) and four images of 5,000 bytes, packed back to
    // back: 20-23 KB over 5 to 7 blocks (the set begins at the block of its first byte).
    assert!(set.1 >= 5 * 4096 && set.1 <= 7 * 4096, "{set:?}");
}

/// Packing late through a mount: a page's files written by three commits, read back cold and
/// each named with the page (`trusted.anvil.near` on a file that exists), lie in one set
/// after the next commit, and read back as written.
#[test]
fn files_read_apart_are_packed_into_one_set_through_the_mount() {
    if !common::fuse_or_skip("files_read_apart_are_packed_into_one_set_through_the_mount") {
        return;
    }
    let mut mount = common::Mount::with_options("64M", Some("commit_interval_ms=600000"));
    let root = mount.path().to_path_buf();
    let dir = root.to_str().unwrap().to_string();
    let mut files: Vec<(std::path::PathBuf, u64, Vec<u8>)> = Vec::new();
    for commit in 0..3u64 {
        for i in 0..3u64 {
            let path = root.join(format!("c{commit}-{i}"));
            let bytes = common::pattern(5000, 100 + 3 * commit + i);
            std::fs::write(&path, &bytes).unwrap();
            if let Some((_, page, _)) = files.first() {
                set_near(&path, page.to_string().as_bytes()).unwrap();
            }
            let ino = std::fs::metadata(&path).unwrap().ino();
            files.push((path, ino, bytes));
        }
        synctid(&mount);
    }
    // Cold: neither the kernel's caches nor anvil's hold the files.
    let out = mount.anvil("drop-caches", &["drop-caches", &dir]);
    assert!(out.status.success(), "{out}");
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let page = files[0].1.to_string();
    for (path, _, bytes) in &files {
        assert_eq!(&std::fs::read(path).unwrap(), bytes);
        set_near(path, page.as_bytes()).unwrap();
    }
    // Hints ride on the next commit of anything.
    std::fs::write(root.join("other"), b"x").unwrap();
    mount.unmount_keep_image();
    let check = mount.check();
    assert!(check.status.success(), "{check}");
    if mount.on_a_store() {
        return;
    }
    let fs = open_read_only(mount.image());
    let sets = sets(&fs);
    let set = sets[&files[0].1].expect("the page is in a set");
    for (path, ino, bytes) in &files {
        assert_eq!(sets[ino], Some(set), "{}", path.display());
        let name = format!("/{}", path.file_name().unwrap().to_str().unwrap());
        assert_eq!(&fs.read_file(&name).unwrap(), bytes);
    }
}

/// A copy requested through the mount (`trusted.anvil.copy` naming a page): the commit that
/// writes the page writes a copy of the shared file into the page's set (the engine counts
/// it), the attribute takes only an inode number and is never stored, and the volume checks
/// clean after the unmount with the copy's space free.
#[test]
fn a_copy_named_through_the_mount_is_written_with_the_page() {
    if !common::fuse_or_skip("a_copy_named_through_the_mount_is_written_with_the_page") {
        return;
    }
    let set_copy = |path: &Path, value: &[u8]| set_attr(path, COPY, value);
    let mut mount = common::Mount::with_options("64M", Some("commit_interval_ms=600000"));
    let root = mount.path().to_path_buf();
    let dir = root.to_str().unwrap().to_string();
    let copies_written = |mount: &common::Mount| -> u64 {
        let out = mount.anvil("info", &["info", &dir, "--json"]);
        assert!(out.status.success(), "{out}");
        let info: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        info["engine"]["copies_written"]
            .as_u64()
            .expect("the counter")
    };
    let logo = root.join("logo.png");
    std::fs::write(&logo, common::pattern(3000, 7)).unwrap();
    synctid(&mount);
    let page = root.join("page.html");
    std::fs::write(&page, common::pattern(4000, 8)).unwrap();
    let page_ino = std::fs::metadata(&page).unwrap().ino();
    let image = root.join("img");
    std::fs::write(&image, common::pattern(5000, 9)).unwrap();
    set_near(&image, page_ino.to_string().as_bytes()).unwrap();
    // (Not read before the request: a read of a whole file through the mount leaves its
    // bytes to the kernel's cache, and a commit copies only what anvil's cache holds.)
    // Not a number: refused. Not stored: nothing to read back.
    let refused = set_copy(&logo, b"page.html").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EINVAL));
    set_copy(&logo, page_ino.to_string().as_bytes()).unwrap();
    let c = CString::new(logo.as_os_str().as_bytes()).unwrap();
    let mut buf = [0u8; 64];
    // SAFETY: NUL-terminated path and name, and a buffer of the length given.
    let got = unsafe { libc::getxattr(c.as_ptr(), COPY.as_ptr(), buf.as_mut_ptr().cast(), 64) };
    assert!(got < 0, "the request was stored");
    assert_eq!(copies_written(&mount), 0);
    synctid(&mount);
    assert_eq!(copies_written(&mount), 1);
    assert_eq!(std::fs::read(&logo).unwrap(), common::pattern(3000, 7));
    mount.unmount_keep_image();
    let check = mount.check();
    assert!(check.status.success(), "{check}");
}
