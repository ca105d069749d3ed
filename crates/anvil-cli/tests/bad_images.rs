//! Bad input to the command line: a foreign file, a truncated image, a zeroed superblock and
//! a newer format version each give one line on stderr and a non-zero exit from mount,
//! check and info, never a panic; mkfs refuses to overwrite a filesystem without --force.

use std::path::Path;
use std::process::Command;

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

fn anvil(args: &[&str]) -> (i32, String) {
    let out = Command::new(ANVIL).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_refused(image: &Path, what: &str, expect: &str) {
    let image = image.to_str().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    for args in [
        vec!["check", image],
        vec!["info", image],
        vec!["mount", image, mnt.path().to_str().unwrap(), "-f"],
    ] {
        let (code, stderr) = anvil(&args);
        assert_ne!(code, 0, "{what}: {args:?} succeeded");
        assert!(
            !stderr.contains("panicked"),
            "{what}: {args:?} panicked: {stderr}"
        );
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{what}: {args:?} said: {stderr}"
        );
        assert!(
            stderr.contains(expect),
            "{what}: {args:?} said {stderr:?}, expected {expect:?}"
        );
    }
}

fn fresh_image(dir: &Path) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let image = dir.join(format!("vol-{n}.img"));
    let (code, stderr) = anvil(&["mkfs", image.to_str().unwrap(), "--size", "64M"]);
    assert_eq!(code, 0, "{stderr}");
    image
}

#[test]
fn foreign_truncated_zeroed_and_newer_images_are_refused() {
    let dir = tempfile::tempdir().unwrap();

    let foreign = dir.path().join("foreign.img");
    std::fs::write(&foreign, vec![0x5a; 1 << 20]).unwrap();
    assert_refused(&foreign, "foreign file", "not an anvil volume");

    let truncated = fresh_image(dir.path());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&truncated)
        .unwrap();
    file.set_len(8 << 20).unwrap();
    assert_refused(&truncated, "truncated image", "truncated");

    let zeroed = fresh_image(dir.path());
    let bytes = std::fs::read(&zeroed).unwrap();
    let mut bytes = bytes;
    bytes[..8192].fill(0);
    std::fs::write(&zeroed, &bytes).unwrap();
    assert_refused(&zeroed, "zeroed superblocks", "not an anvil volume");

    let newer = fresh_image(dir.path());
    let mut bytes = std::fs::read(&newer).unwrap();
    for slot in [0usize, 4096] {
        // Bump the version and re-seal the checksum, as a future anvil would write it.
        let future = anvil::format::FORMAT_VERSION + 1;
        bytes[slot + 4..slot + 6].copy_from_slice(&future.to_le_bytes());
        let payload = u32::from_le_bytes(bytes[slot + 40..slot + 44].try_into().unwrap()) as usize;
        let mut scratch = bytes[slot..slot + 64 + payload].to_vec();
        scratch[48..56].fill(0);
        let sum = anvil::checksum::checksum(&scratch);
        bytes[slot + 48..slot + 56].copy_from_slice(&sum.to_le_bytes());
    }
    std::fs::write(&newer, &bytes).unwrap();
    assert_refused(&newer, "newer version", "newer than this anvil supports");
}

/// A crash log left by a killed daemon belongs to the volume it logged: `mkfs --force`
/// over that volume removes it (tmpfs memory, otherwise held until the image is mounted
/// again).
#[test]
fn mkfs_drops_the_crash_log_of_the_volume_it_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("vol.img");
    let path = image.to_str().unwrap();
    assert_eq!(anvil(&["mkfs", path, "--size", "64M"]).0, 0);
    let log = anvil::crash_log_file(&image, None).unwrap();
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    std::fs::write(&log, vec![7u8; 64 << 10]).unwrap();
    let (code, stderr) = anvil(&["mkfs", path, "--size", "64M", "--force"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!log.exists(), "{} is still there", log.display());
}

#[test]
fn mkfs_refuses_existing_filesystems_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let image = fresh_image(dir.path());
    let path = image.to_str().unwrap();
    let (code, stderr) = anvil(&["mkfs", path, "--size", "64M"]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("already holds a filesystem (anvil)"),
        "{stderr}"
    );
    let (code, _) = anvil(&["mkfs", path, "--size", "64M", "--force"]);
    assert_eq!(code, 0);
    let (code, stderr) = anvil(&["mkfs", path, "--size", "lots"]);
    assert_ne!(code, 0);
    assert!(stderr.contains("invalid size"), "{stderr}");
}
