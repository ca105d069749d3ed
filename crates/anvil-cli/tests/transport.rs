//! Both transports serve the mount, say which one they are, and a small file costs only
//! the round trips it must: no OPEN, RELEASE or FLUSH per file, no `security.capability`
//! lookup before every write (FUSE_HANDLE_KILLPRIV_V2), none at all for a file created
//! write-only (CREATE answered with FOPEN_DIRECT_IO); a missing name is asked for once.

mod common;

use std::io::Write;
use std::process::Command;

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");
const FILES: u64 = 40;

/// Held by every test here, so they run one at a time. A child that another test thread
/// spawns gets a copy of this thread's open files, and its exec closes them: each close
/// sends the kernel's FLUSH, which can race the first one and be counted before the kernel
/// has learned from its ENOSYS (seen once in CI: two FLUSHes for forty files).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `anvil stats DIR --json`, then the counts set back to zero.
fn stats(dir: &std::path::Path) -> serde_json::Value {
    let out = Command::new(ANVIL)
        .args(["stats", dir.to_str().unwrap(), "--json", "--reset"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn count(stats: &serde_json::Value, op: &str) -> u64 {
    stats["requests"][op].as_u64().unwrap_or(0)
}

fn round_trips(transport: &str) {
    let _serial = serial();
    // The test's options win over ANVIL_TEST_MOUNT_OPTS; writeback needs transport=devfuse.
    let options = format!("transport={transport},nowriteback");
    let mount = common::Mount::with_options("256M", Some(&options));
    // The kernel learns "no OPEN" and "no FLUSH" from the first of each; until then a
    // created file would also cost a RELEASE when closed.
    std::fs::write(mount.path().join("first"), b"x").unwrap();
    assert_eq!(std::fs::read(mount.path().join("first")).unwrap(), b"x");
    stats(mount.path());

    for i in 0..FILES {
        std::fs::write(mount.path().join(format!("f{i}")), [7u8; 4096]).unwrap();
    }
    let text = Command::new(ANVIL)
        .args(["stats", mount.path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let create_row = text
        .lines()
        .find(|l| l.starts_with("CREATE "))
        .unwrap_or_else(|| panic!("no CREATE row in:\n{text}"));
    // Count, and the daemon's microseconds where timed.
    let columns = if transport == "classic" { 2 } else { 3 };
    assert_eq!(create_row.split_whitespace().count(), columns, "{text}");
    let s = stats(mount.path());
    assert_eq!(s["transport"], transport, "{s}");
    assert_eq!(count(&s, "WRITE"), FILES, "{s}");
    assert_eq!(count(&s, "OPEN"), 0, "{s}");
    assert_eq!(count(&s, "FLUSH"), 0, "{s}");
    assert_eq!(count(&s, "RELEASE"), 0, "{s}");
    // CREATE, and a write-only descriptor that goes direct: no security.capability
    // lookup per new file (only the two `anvil stats` above make two each).
    assert_eq!(count(&s, "CREATE"), FILES, "{s}");
    assert_eq!(count(&s, "MKNOD"), 0, "{s}");
    assert!(count(&s, "GETXATTR") <= 4, "{s}");
    // The daemon's own time per request, where the transport times it (over io_uring and
    // devfuse: the daemon's loop calls the handlers; fuser's does not say when it answers).
    let served = |op: &str| s["served_us"][op].as_f64();
    match transport {
        "classic" => assert_eq!(served("CREATE"), None, "{s}"),
        _ => {
            let create = served("CREATE").unwrap_or_else(|| panic!("no time for CREATE: {s}"));
            let write = served("WRITE").unwrap_or_else(|| panic!("no time for WRITE: {s}"));
            assert!(create > 0.0 && create < 1e6, "{s}");
            assert!(write > 0.0 && write < 1e6, "{s}");
            assert_eq!(served("MKNOD"), None, "{s}");
        }
    }
    // The volume's cache counts its hits and misses (`anvil info`).
    let info = Command::new(ANVIL)
        .args(["info", mount.path().to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(info.status.success(), "{info:?}");
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let cache = |name: &str| info["cache"][name].as_u64();
    assert!(cache("node_hits").unwrap_or(0) > 0, "{info}");
    assert!(cache("budget_bytes").unwrap_or(0) > 0, "{info}");
    assert!(cache("set_misses").is_some(), "{info}");
    // A file created for reading and writing stays in the page cache: read back and
    // mapped through the descriptor that made it.
    let path = mount.path().join("rw");
    let mut rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    rw.write_all(&[5u8; 8192]).unwrap();
    let mut back = vec![0u8; 8192];
    std::os::unix::fs::FileExt::read_exact_at(&rw, &mut back, 0).unwrap();
    assert_eq!(back, vec![5u8; 8192]);
    // SAFETY: a shared mapping of 8 KiB of an open file, unmapped before the file closes.
    unsafe {
        use std::os::fd::AsRawFd;
        let p = libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            rw.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        let bytes = std::slice::from_raw_parts_mut(p.cast::<u8>(), 8192);
        assert!(bytes.iter().all(|&b| b == 5));
        bytes[100] = 9;
        assert_eq!(libc::msync(p, 8192, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(p, 8192), 0);
    }
    drop(rw);
    let mut want = vec![5u8; 8192];
    want[100] = 9;
    assert_eq!(std::fs::read(&path).unwrap(), want);
    // A write-only file reads back whole through a later descriptor.
    assert_eq!(
        std::fs::read(mount.path().join("f5")).unwrap(),
        vec![7u8; 4096]
    );

    stats(mount.path());
    let mut file = std::fs::File::create(mount.path().join("many-writes")).unwrap();
    for _ in 0..FILES {
        file.write_all(&[1u8; 4096]).unwrap();
    }
    drop(file);
    let s = stats(mount.path());
    assert_eq!(count(&s, "WRITE"), FILES, "{s}");
    // Without KILLPRIV_V2 every write would be preceded by a GETXATTR.
    assert!(count(&s, "GETXATTR") <= 4, "{s}");
    assert_eq!(
        std::fs::read(mount.path().join("f3")).unwrap(),
        vec![7u8; 4096]
    );

    // A missing name is asked for once and then known missing (a negative entry); the
    // kernel replaces that entry itself when the name is created or renamed onto.
    let (missing, renamed) = (mount.path().join("missing"), mount.path().join("renamed"));
    stats(mount.path());
    for _ in 0..5 {
        assert!(std::fs::metadata(&missing).is_err());
        assert!(std::fs::metadata(&renamed).is_err());
    }
    let s = stats(mount.path());
    assert_eq!(count(&s, "LOOKUP"), 2, "{s}");
    std::fs::write(&missing, b"here").unwrap();
    assert_eq!(std::fs::read(&missing).unwrap(), b"here");
    std::fs::rename(&missing, &renamed).unwrap();
    assert!(std::fs::metadata(&missing).is_err());
    assert_eq!(std::fs::read(&renamed).unwrap(), b"here");
    // A view's name may come to exist without a request (its TID, time or snapshot label
    // does): never known missing.
    let view = mount.path().join("f1@@no-such-label");
    stats(mount.path());
    for _ in 0..3 {
        assert!(std::fs::metadata(&view).is_err());
    }
    assert_eq!(count(&stats(mount.path()), "LOOKUP"), 3);
    mount.unmount();
}

#[test]
fn classic_transport_round_trips() {
    if !common::fuse_or_skip("classic_transport_round_trips") {
        return;
    }
    round_trips("classic");
}

#[test]
fn uring_transport_round_trips() {
    if !common::fuse_or_skip("uring_transport_round_trips") {
        return;
    }
    if !uring_or_skip("uring_transport_round_trips") {
        return;
    }
    round_trips("uring");
}

/// Whether this kernel serves FUSE over io_uring; says so when a test skips for it.
fn uring_or_skip(test: &str) -> bool {
    let enabled = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y");
    if !enabled {
        eprintln!(
            "SKIPPED: {test}: this kernel does not offer FUSE over io_uring \
             (/sys/module/fuse/parameters/enable_uring)"
        );
    }
    enabled
}

/// The resident anonymous memory of process `pid`, in bytes.
fn anon_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .unwrap_or_else(|| panic!("no RssAnon in /proc/{pid}/status"));
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

#[test]
fn ring_buffers_hold_memory_only_once_used() {
    if !common::fuse_or_skip("ring_buffers_hold_memory_only_once_used")
        || !uring_or_skip("ring_buffers_hold_memory_only_once_used")
    {
        return;
    }
    let _serial = serial();
    // A budget that leaves max_write at 1 MiB: every queue's eight entries map 8 MiB of
    // payload, which the daemon used to hold resident from the mount on.
    let mount = common::Mount::with_options("256M", Some("transport=uring,nowriteback,cache=1G"));
    let pid = common::daemon_pid(mount.image()).expect("the daemon's pid");
    let at_mount = anon_bytes(pid);
    assert!(
        at_mount < 6 << 20,
        "the daemon holds {at_mount} bytes right after mounting: its rings' payload pages \
         are resident before any request used them"
    );
    // Requests as large as the buffers fault their pages in and come back whole.
    let data = common::pattern(4 << 20, 11);
    std::fs::write(mount.path().join("big"), &data).unwrap();
    let out = Command::new(ANVIL)
        .args(["drop-caches", mount.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let file = std::fs::File::open(mount.path().join("big")).unwrap();
    // Drop the kernel's pages of this file so that the read below reaches the daemon.
    // SAFETY: posix_fadvise on a descriptor this test owns.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    drop(file);
    assert!(std::fs::read(mount.path().join("big")).unwrap() == data);
    let s = stats(mount.path());
    assert_eq!(s["transport"], "uring", "{s}");
    assert!(count(&s, "WRITE") >= 4, "{s}");
    assert!(count(&s, "READ") >= 1, "{s}");
    mount.unmount();
}

#[test]
fn stats_refuses_a_plain_directory() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(ANVIL)
        .args(["stats", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).lines().count(),
        1,
        "{out:?}"
    );
}
