//! As-of views through the mount: `name@@<tid|time|label>` and `.snapshots/<label>` read
//! earlier versions (deleted files included), refuse writes with EROFS, and `tar` of a
//! snapshot hashes the same before and after the live tree changes, prune, reblock and a
//! remount.

mod common;

use std::process::Command;

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

fn tar_sha256(dir: &std::path::Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("tar -C '{}' -cf - . | sha256sum", dir.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tar failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn anvil(args: &[&str]) -> String {
    let out = Command::new(ANVIL).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "anvil {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn as_of_paths_and_snapshots() {
    if !common::fuse_or_skip("as_of_paths_and_snapshots") {
        return;
    }
    let mut mount = common::Mount::new();
    let root = mount.path().to_path_buf();
    let root_text = root.to_str().unwrap().to_string();
    std::fs::create_dir(root.join("docs")).unwrap();
    std::fs::write(root.join("docs/a.txt"), b"first").unwrap();
    std::fs::write(root.join("docs/b.bin"), vec![9u8; 300_000]).unwrap();
    std::os::unix::fs::symlink("a.txt", root.join("docs/link")).unwrap();
    let tid = anvil(&["snapshot", &root_text, "--label", "day1"]);
    let snapshot_dir = root.join(".snapshots/day1");
    let before = tar_sha256(&snapshot_dir);

    std::fs::write(root.join("docs/a.txt"), b"second").unwrap();
    std::fs::remove_file(root.join("docs/b.bin")).unwrap();
    anvil(&["synctid", &root_text]);

    let at = |p: &str| root.join(format!("{p}@@{tid}"));
    assert_eq!(std::fs::read(at("docs/a.txt")).unwrap(), b"first");
    assert_eq!(
        std::fs::read(at("docs/b.bin")).unwrap().len(),
        300_000,
        "deleted file"
    );
    assert_eq!(
        std::fs::read(root.join("docs@@day1/a.txt")).unwrap(),
        b"first"
    );
    assert_eq!(
        std::fs::read_link(root.join(format!("docs@@{tid}/link")))
            .unwrap()
            .to_str(),
        Some("a.txt")
    );
    assert_eq!(std::fs::read(root.join("docs/a.txt")).unwrap(), b"second");

    let write = std::fs::write(root.join(format!("docs@@{tid}/new")), b"x");
    assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
    let write = std::fs::write(at("docs/a.txt"), b"x");
    assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
    assert!(std::fs::metadata(root.join("docs/a.txt@@0x00000000ffffffff")).is_err());
    assert!(std::fs::metadata(root.join("docs/a.txt@@not-a-label")).is_err());

    assert_eq!(
        tar_sha256(&snapshot_dir),
        before,
        "snapshot changed with the live tree"
    );
    anvil(&["prune-everything", &root_text]);
    assert_eq!(
        tar_sha256(&snapshot_dir),
        before,
        "snapshot changed by prune"
    );
    anvil(&["reblock", &root_text]);
    assert_eq!(
        tar_sha256(&snapshot_dir),
        before,
        "snapshot changed by reblock"
    );
    assert_eq!(std::fs::read(root.join("docs/a.txt")).unwrap(), b"second");
    mount.remount();
    assert_eq!(
        tar_sha256(&root.join(".snapshots/day1")),
        before,
        "snapshot changed across remount"
    );
    let listing = anvil(&["snapls", &root_text]);
    assert!(listing.contains("day1"), "{listing}");
    let history = anvil(&["history", root.join("docs/a.txt").to_str().unwrap()]);
    assert!(history.lines().count() >= 3, "{history}");
    mount.unmount();
}
