//! `mount -t fuse.anvil` and /etc/fstab: the binary acts as mount(8)'s helper when called
//! `mount.fuse.anvil`, drops mount(8)'s own options and passes the rest to `anvil mount`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

fn mkfs(image: &Path) {
    let out = Command::new(ANVIL)
        .args(["mkfs", image.to_str().unwrap(), "--size", "128M"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A scratch directory holding a fresh volume `v.img` and an empty mount point `mnt`.
fn fresh_volume() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("v.img");
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    mkfs(&image);
    (tmp, image, dir)
}

/// Whether `dir` is a FUSE mount (the classic transport's mount shows "fuse", the
/// io_uring one "fuse.anvil" in /proc/self/mounts).
fn is_fuse_mount(dir: &Path) -> bool {
    fs_type(dir).is_some_and(|t| t == "fuse" || t == "fuse.anvil")
}

fn fs_type(dir: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let dir = dir.canonicalize().ok()?;
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(1) == Some(&dir.to_str()?)).then(|| f[2].to_string())
    })
}

fn unmount_and_check(image: &Path, dir: &Path) {
    // Another process's statfs or lookup in flight (df walking every mount on a loaded
    // machine) holds the mount until the daemon answers: umount says busy, so try again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Command::new("umount").arg(dir).status().unwrap().success() {
        assert!(
            Instant::now() < deadline,
            "umount {} kept failing",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    common::wait_until_released(image, Duration::from_secs(30));
    let out = Command::new(ANVIL)
        .args(["check", image.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn called_as_mount_fuse_anvil() {
    if !common::fuse_or_skip("called_as_mount_fuse_anvil") {
        return;
    }
    let (tmp, image, dir) = fresh_volume();
    let helper = tmp.path().join("mount.fuse.anvil");
    std::os::unix::fs::symlink(ANVIL, &helper).unwrap();
    let out = Command::new(&helper)
        .arg(&image)
        .arg(&dir)
        .args(["-o", "defaults,noauto,_netdev,x-systemd.automount,ro"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // Silent on success, as mount(8) is: xfstests compares the output of every mount.
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert!(is_fuse_mount(&dir), "{:?}", fs_type(&dir));
    // `ro` reached the daemon; mount(8)'s own options did not (they would be refused).
    let err = std::fs::write(dir.join("f"), b"through the helper").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    unmount_and_check(&image, &dir);

    let bad = Command::new(&helper).arg(&image).output().unwrap();
    assert!(!bad.status.success());
    assert_eq!(String::from_utf8_lossy(&bad.stderr).lines().count(), 1);
}

#[test]
fn mount_t_fuse_anvil_and_fstab() {
    if !common::fuse_or_skip("mount_t_fuse_anvil_and_fstab") {
        return;
    }
    if !Path::new("/sbin/mount.fuse.anvil").exists() {
        let why = "/sbin/mount.fuse.anvil is not installed (scripts/setup.sh installs it)";
        if std::env::var(common::REQUIRE_FUSE_ENV).is_ok_and(|v| v == "1") {
            panic!("mount_t_fuse_anvil_and_fstab: {why}");
        }
        eprintln!("SKIPPED: mount_t_fuse_anvil_and_fstab: {why}");
        return;
    }
    let (tmp, image, dir) = fresh_volume();

    let out = Command::new("mount")
        .args(["-t", "fuse.anvil", "-o", "nohistory"])
        .arg(&image)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(is_fuse_mount(&dir), "{:?}", fs_type(&dir));
    std::fs::write(dir.join("a"), b"mount -t").unwrap();
    unmount_and_check(&image, &dir);

    // An fstab line, from a private fstab file (mount --fstab).
    let fstab = tmp.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{} {} fuse.anvil defaults,noauto,cache=64M 0 0\n",
            image.display(),
            dir.display()
        ),
    )
    .unwrap();
    let out = Command::new("mount")
        .arg("--fstab")
        .arg(&fstab)
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let start = Instant::now();
    while !is_fuse_mount(&dir) && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"mount -t");
    unmount_and_check(&image, &dir);
}

fn mount_options(dir: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    let dir = dir.canonicalize().unwrap();
    mounts
        .lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&dir.to_str()?)).then(|| f[3].to_string())
        })
        .map(|o| o.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

/// mount(8)'s `nosuid`, `nodev` and `noexec` reach the kernel (xfstests generic/128 runs a
/// setuid copy of ls from a `-o nosuid` mount); without them a root mount allows all three.
#[test]
fn nosuid_nodev_noexec_reach_the_kernel() {
    if !common::fuse_or_skip("nosuid_nodev_noexec_reach_the_kernel") {
        return;
    }
    let root = unsafe { libc::geteuid() } == 0;
    let (tmp, image, dir) = fresh_volume();
    let helper = tmp.path().join("mount.fuse.anvil");
    std::os::unix::fs::symlink(ANVIL, &helper).unwrap();
    for transport in ["auto", "classic"] {
        for flags in ["nosuid,nodev,noexec", "suid,dev,exec"] {
            let out = Command::new(&helper)
                .arg(&image)
                .arg(&dir)
                .args(["-o", &format!("{flags},transport={transport}")])
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let options = mount_options(&dir);
            for flag in ["nosuid", "nodev", "noexec"] {
                let want = flags.starts_with("no") || (flag != "noexec" && !root);
                assert_eq!(
                    options.iter().any(|o| o == flag),
                    want,
                    "{flag} with -o {flags},transport={transport}: {options:?}"
                );
            }
            unmount_and_check(&image, &dir);
        }
    }
}

/// `mount -o remount,ro` reaches the helper (mount(8) runs it for remounts too): the live
/// mount turns read-only and back without a new daemon (xfstests remounts read-only often).
#[test]
fn remount_read_only_and_back() {
    if !common::fuse_or_skip("remount_read_only_and_back") {
        return;
    }
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: remount_read_only_and_back: remounting needs root");
        return;
    }
    let (tmp, image, dir) = fresh_volume();
    let helper = tmp.path().join("mount.fuse.anvil");
    std::os::unix::fs::symlink(ANVIL, &helper).unwrap();
    let run = |options: &str| {
        let out = Command::new(&helper)
            .arg(&image)
            .arg(&dir)
            .args(["-o", options])
            .output()
            .unwrap();
        assert!(out.status.success(), "-o {options}: {out:?}");
    };
    run("rw");
    std::fs::write(dir.join("a"), b"before").unwrap();
    run("rw,remount,ro");
    assert!(mount_options(&dir).iter().any(|o| o == "ro"));
    let err = std::fs::write(dir.join("b"), b"read-only").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    assert_eq!(std::fs::read(dir.join("a")).unwrap(), b"before");
    run("remount,rw");
    std::fs::write(dir.join("b"), b"writable again").unwrap();
    unmount_and_check(&image, &dir);
}
