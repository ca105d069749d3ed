//! A daemon on the /dev/fuse transport has a keeper: when the daemon is killed, a new one
//! takes over the same FUSE connection. Nothing on the mount notices: system calls wait
//! instead of failing, the kernel's dirty pages (`-o writeback`) reach the new daemon,
//! requests the dead one had read are sent again, and files open across the takeover stay
//! usable, unlinked or not.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const OPTIONS: &str = "transport=devfuse,writeback";

use common::pattern;

/// Kills the daemon serving `mount` and waits until another one serves it.
fn kill_and_wait_for_takeover(mount: &common::Mount) {
    let old = common::daemon_pid(mount.image()).expect("a daemon serves the mount");
    // SAFETY: killing the daemon this test started for its own image.
    unsafe { libc::kill(old, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(new) = common::daemon_pid(mount.image()) {
            if new != old {
                // The new daemon answers once it has replayed the crash log; a stat waits.
                std::fs::metadata(mount.path()).expect("the mount answers after a takeover");
                return;
            }
        }
        assert!(Instant::now() < deadline, "no daemon took over from {old}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn dirty_pages_survive_a_killed_daemon() {
    if !common::fuse_or_skip("dirty_pages_survive_a_killed_daemon") {
        return;
    }
    let mut mount = common::Mount::with_options("1G", Some(OPTIONS));
    let big = pattern(24 << 20, 1);
    std::fs::write(mount.path().join("big"), &big).unwrap();
    for i in 0..100u64 {
        std::fs::write(mount.path().join(format!("s{i}")), pattern(3000, i + 2)).unwrap();
    }
    // No fsync: the bytes are the kernel's dirty pages and the daemon's crash log.
    kill_and_wait_for_takeover(&mount);
    let check = |mount: &common::Mount, when: &str| {
        assert!(
            std::fs::read(mount.path().join("big")).unwrap() == big,
            "{when}: big differs"
        );
        for i in 0..100u64 {
            let got = std::fs::read(mount.path().join(format!("s{i}"))).unwrap();
            assert!(got == pattern(3000, i + 2), "{when}: s{i} differs");
        }
    };
    check(&mount, "after the takeover");
    mount.remount();
    check(&mount, "after a remount");
    mount.unmount();
}

/// What step `n` of a writer in `requests_in_flight_are_answered_by_the_next_daemon`
/// writes: small files, and among the first 2,000 every eleventh one of three whole
/// chunks and a part (written ahead of their commit when the kernel flushes them; the
/// whole run of a long soak would fill the volume with them, history being kept).
fn content(n: u64) -> Vec<u8> {
    let len = match n % 11 {
        0 if n < 2_000 => 3 * 65_536 + 5_000,
        _ => 1000 + (n % 7) as usize * 900,
    };
    pattern(len, n)
}

#[test]
fn requests_in_flight_are_answered_by_the_next_daemon() {
    if !common::fuse_or_skip("requests_in_flight_are_answered_by_the_next_daemon") {
        return;
    }
    let mut mount = common::Mount::with_options("1G", Some(OPTIONS));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            let (root, stop) = (mount.path().to_path_buf(), stop.clone());
            std::thread::spawn(move || {
                let mut errors = Vec::new();
                let mut kept = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let (f, g) = (
                        root.join(format!("f{w}-{n}")),
                        root.join(format!("g{w}-{n}")),
                    );
                    let d = root.join(format!("d{w}-{n}"));
                    let step = (|| -> std::io::Result<()> {
                        std::fs::write(&f, content(n))?;
                        std::fs::metadata(&f)?;
                        std::fs::rename(&f, &g)?;
                        std::fs::create_dir(&d)?;
                        std::fs::remove_dir(&d)?;
                        if std::fs::read(&g)? != content(n) {
                            return Err(std::io::Error::other("read back differs"));
                        }
                        if n % 2 == 0 {
                            std::fs::remove_file(&g)?;
                        } else {
                            kept.push(n);
                        }
                        Ok(())
                    })();
                    if let Err(e) = step {
                        errors.push(format!("worker {w}, step {n}: {e}"));
                    }
                    n += 1;
                }
                (n, errors, kept)
            })
        })
        .collect();
    // More kills (scripts/takeover-soak.sh) need ANVIL_TAKEOVER_LIMIT above them in the
    // environment: the keeper gives up after 3 takeovers within a minute.
    let kills: u64 = std::env::var("ANVIL_TAKEOVER_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(3);
    for kill in 0..kills {
        std::thread::sleep(Duration::from_millis(300 + kill * 7919 % 500));
        kill_and_wait_for_takeover(&mount);
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    let mut steps = 0;
    let mut kept = Vec::new();
    for (w, worker) in workers.into_iter().enumerate() {
        let (n, errors, files) = worker.join().unwrap();
        assert!(errors.is_empty(), "errors across takeovers: {errors:?}");
        steps += n;
        kept.extend(files.into_iter().map(|n| (w, n)));
    }
    // What the kernel's cache held across the kills reached the volume.
    mount.remount();
    for (w, n) in &kept {
        let got = std::fs::read(mount.path().join(format!("g{w}-{n}"))).unwrap();
        assert!(got == content(*n), "g{w}-{n} differs after the remount");
    }
    eprintln!(
        "{steps} steps across {kills} takeovers, no error; {} files read back after a remount",
        kept.len()
    );
    mount.unmount();
}

#[test]
fn a_file_open_across_a_takeover_stays_usable_when_unlinked() {
    if !common::fuse_or_skip("a_file_open_across_a_takeover_stays_usable_when_unlinked") {
        return;
    }
    let mut mount = common::Mount::with_options("1G", Some(OPTIONS));
    let path = mount.path().join("open");
    let mut file = std::fs::File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let first = pattern(200_000, 9);
    file.write_all(&first).unwrap();
    kill_and_wait_for_takeover(&mount);
    // The new daemon never saw this file looked up; unlinking its last name must keep it
    // for the open descriptor.
    std::fs::remove_file(&path).unwrap();
    file.write_all(b"tail").unwrap();
    file.sync_all().unwrap();
    file.seek(SeekFrom::Start(0)).unwrap();
    let mut got = Vec::new();
    file.read_to_end(&mut got).unwrap();
    assert!(got.len() == first.len() + 4 && got[..first.len()] == first[..]);
    drop(file);
    assert!(!path.exists());
    // The orphan goes when the kernel forgets it, or at this mount at the latest; either
    // way `anvil check` finds the volume clean.
    mount.remount();
    mount.unmount();
}

#[test]
fn writeback_is_refused_where_a_daemon_cannot_be_replaced() {
    if !common::fuse_or_skip("writeback_is_refused_where_a_daemon_cannot_be_replaced") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("v.img");
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let mkfs = std::process::Command::new(common::ANVIL)
        .args(["mkfs", image.to_str().unwrap(), "--size", "128M"])
        .output()
        .unwrap();
    assert!(mkfs.status.success());
    for transport in ["uring", "classic"] {
        let out = std::process::Command::new(common::ANVIL)
            .args(["mount", image.to_str().unwrap(), dir.to_str().unwrap()])
            .args(["-o", &format!("writeback,transport={transport}")])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{transport}: {stderr}");
        assert!(
            stderr.contains("writeback needs transport=devfuse"),
            "{transport}: {stderr}"
        );
        assert!(!common::is_mount_point(&dir));
    }
}
