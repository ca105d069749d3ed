//! The daemon's life: a second mount of the same image is refused, SIGTERM commits and
//! unmounts cleanly, and what was written is there after the next mount; `info` and
//! `synctid` answer on the mount point.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

#[test]
fn second_mount_refused_and_sigterm_commits() {
    if !common::fuse_or_skip("second_mount_refused_and_sigterm_commits") {
        return;
    }
    let mut mount = common::Mount::new();
    std::fs::write(mount.path().join("kept"), b"written before SIGTERM").unwrap();

    let other = tempfile::tempdir().unwrap();
    let out = Command::new(ANVIL)
        .args([
            "mount",
            mount.image().to_str().unwrap(),
            other.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a second mount of the same image must be refused"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("already mounted or in use"), "{stderr}");

    let tid = Command::new(ANVIL)
        .args(["synctid", mount.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(tid.status.success());
    assert!(String::from_utf8_lossy(&tid.stdout)
        .trim()
        .starts_with("0x"));
    let info = Command::new(ANVIL)
        .args(["info", mount.path().to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains("\"objects\":2"), "{info}");

    std::fs::write(mount.path().join("late"), b"written just before SIGTERM").unwrap();
    let pid = common::daemon_pid(mount.image()).expect("daemon process");
    // SAFETY: sending a signal to the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let started = Instant::now();
    while common::is_mount_point(mount.path()) || common::daemon_pid(mount.image()).is_some() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "daemon did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        common::wait_until_released(mount.image(), Duration::from_secs(10)),
        "the stopped daemon still holds the image"
    );
    assert!(
        mount.check().status.success(),
        "volume not clean after SIGTERM"
    );
    mount.mount_again();
    assert_eq!(
        std::fs::read(mount.path().join("late")).unwrap(),
        b"written just before SIGTERM"
    );
    assert_eq!(
        std::fs::read(mount.path().join("kept")).unwrap(),
        b"written before SIGTERM"
    );
    mount.unmount();
}

/// fallocate reserves nothing ahead (copy-on-write allocates at commit), but it does not
/// promise space the volume lacks: asking for more than is free fails with ENOSPC and
/// leaves the file as it was (xfstests generic/213).
#[test]
fn fallocate_beyond_free_space_is_enospc() {
    if !common::fuse_or_skip("fallocate_beyond_free_space_is_enospc") {
        return;
    }
    use std::os::fd::AsRawFd;
    let mount = common::Mount::with_size("64M");
    let path = mount.path().join("f");
    let file = std::fs::File::create(&path).unwrap();
    // SAFETY: fallocate on a descriptor this test owns.
    let too_much = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 1 << 30) };
    assert_eq!(too_much, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOSPC)
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
    // SAFETY: as above.
    let fits = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 1 << 20) };
    assert_eq!(fits, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1 << 20);
    drop(file);
    mount.unmount();
}
