//! Mirroring between real mounts: mirror-copy to a mounted slave and to an unmounted image,
//! `tar` of every `@@TID` path equal on both sides, incremental copies, a slave that refuses
//! ordinary writes, refused streams (truncated, from another master) that leave the slave
//! as it was, a slave daemon killed in the middle of a stream, a "remote" endpoint through
//! `--via`, and promotion.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

fn run(args: &[&str]) -> Output {
    Command::new(ANVIL).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "anvil {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A mount that receives mirror streams: never with the kernel's writeback cache, which
/// keeps its own sizes and times of cached files (`anvil mirror-write` refuses such a mount).
fn receiver() -> common::Mount {
    common::Mount::with_options(common::DEFAULT_IMAGE_SIZE, Some("nowriteback"))
}

fn text(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

fn status(target: &str) -> serde_json::Value {
    serde_json::from_str(&ok(&["mirror-status", target, "--json"])).unwrap()
}

/// sha256 of `tar -c` of `name@@TID` under `dir` (or of `name` now): bytes and metadata.
fn tar_sum(dir: &Path, name: &str, tid: Option<u64>) -> String {
    let entry = match tid {
        Some(tid) => format!("{name}@@{tid:#018x}"),
        None => name.to_string(),
    };
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -c --sort=name --numeric-owner -C '{}' '{entry}' | sha256sum",
            dir.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `data` the same on both mounts (by `tar_sum`); if not, fails listing each side's
/// entries with their sizes, modes, times and contents' sums, so that a rare difference
/// says what it was.
fn assert_same_data(master: &Path, slave: &Path) {
    if tar_sum(master, "data", None) == tar_sum(slave, "data", None) {
        return;
    }
    let listing = |dir: &Path| {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "cd '{}' && find data -printf '%p %y %s %m %T@ %l\\n' | sort && \
                 find data -type f -exec md5sum {{}} + | sort -k2",
                dir.display()
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let (a, b) = (listing(master), listing(slave));
    // Once more after a pause: a difference that goes away was a stale kernel cache.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let later = tar_sum(master, "data", None) == tar_sum(slave, "data", None);
    panic!("data differs (same after 2 s: {later})\nmaster:\n{a}\nslave:\n{b}");
}

fn write_tree(root: &Path, round: u32) {
    let dir = root.join("data");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    for i in 0..20 {
        let bytes: Vec<u8> = (0..(i * 3000 + round as usize * 7))
            .map(|b| (b as u32 * 31 + round * 17 + i as u32) as u8)
            .collect();
        std::fs::write(dir.join(format!("f{i}")), bytes).unwrap();
    }
    std::fs::write(dir.join("sub/note"), format!("round {round}\n")).unwrap();
    let _ = std::fs::remove_file(dir.join(format!("f{}", round % 20)));
    let _ = std::os::unix::fs::symlink("sub/note", dir.join(format!("link{round}")));
}

#[test]
fn mirror_copy_between_mounts_keeps_every_tid() {
    if !common::fuse_or_skip("mirror_copy_between_mounts_keeps_every_tid") {
        return;
    }
    // The master too: promoted in its place, the slave streams back to it at the end.
    let master = receiver();
    let slave = receiver();
    let (m, s) = (text(master.path()), text(slave.path()));
    let mut tids = Vec::new();
    for round in 0..3 {
        write_tree(master.path(), round);
        tids.push(ok(&["synctid", &m]).trim().to_string());
    }
    ok(&["snapshot", &m, "--label", "first"]);
    ok(&["mirror-copy", &m, &s]);
    let held = status(&s)["last_tid"].as_u64().unwrap();
    assert_eq!(held, status(&m)["committed_tid"].as_u64().unwrap());
    for tid in 2..=held {
        assert_eq!(
            tar_sum(master.path(), "data", Some(tid)),
            tar_sum(slave.path(), "data", Some(tid)),
            "TID {tid}"
        );
    }
    assert!(slave.path().join(".snapshots/first").exists());
    // The slave takes no writes of its own.
    let err = std::fs::write(slave.path().join("data/mine"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));

    // Incremental copies: only what changed crosses, and the live tree follows.
    for round in 3..6 {
        write_tree(master.path(), round);
        let line = ok(&["mirror-copy", &m, &s]);
        let wire: u64 = line
            .split(", ")
            .find_map(|p| p.strip_suffix(" bytes on the wire"))
            .unwrap()
            .parse()
            .unwrap();
        assert!(wire < 400_000, "{line}");
        assert_same_data(master.path(), slave.path());
    }
    let newest = status(&s)["last_tid"].as_u64().unwrap();
    for tid in held..=newest {
        assert_eq!(
            tar_sum(master.path(), "data", Some(tid)),
            tar_sum(slave.path(), "data", Some(tid)),
            "TID {tid}"
        );
    }
    // Nothing new: a copy moves no changes.
    ok(&["mirror-copy", &m, &s]);
    assert_eq!(status(&s)["last_tid"].as_u64().unwrap(), newest);

    // Promoted, the slave takes writes and continues the master's TIDs.
    ok(&["mirror-promote", &s]);
    std::fs::write(slave.path().join("data/mine"), b"x").unwrap();
    let after: u64 = {
        let t = ok(&["synctid", &s]);
        u64::from_str_radix(t.trim().trim_start_matches("0x"), 16).unwrap()
    };
    assert!(after > newest);
    assert_eq!(status(&s)["slave"], false);
    assert_eq!(status(&s)["promoted_at"].as_u64(), Some(newest));

    // The old master follows the new one from there: its own later change is undone.
    std::fs::write(master.path().join("data/alone"), b"undone").unwrap();
    ok(&["synctid", &m]);
    ok(&["mirror-attach", &m, &s]);
    assert_eq!(status(&m)["slave"], true);
    ok(&["mirror-copy", &s, &m]);
    assert!(!master.path().join("data/alone").exists());
    assert_eq!(
        std::fs::read(master.path().join("data/mine")).unwrap(),
        b"x"
    );
    assert_same_data(master.path(), slave.path());
    master.unmount();
    slave.unmount();
}

#[test]
fn refused_and_interrupted_streams_leave_the_slave_as_it_was() {
    if !common::fuse_or_skip("refused_and_interrupted_streams_leave_the_slave_as_it_was") {
        return;
    }
    let master = common::Mount::new();
    let other = receiver();
    let mut slave = receiver();
    let (m, s) = (text(master.path()), text(slave.path()));
    write_tree(master.path(), 0);
    ok(&["mirror-copy", &m, &s]);
    let held = status(&s)["last_tid"].as_u64().unwrap();
    let before = tar_sum(slave.path(), "data", None);

    // A large change, read into a file.
    let big = master.path().join("big");
    let bytes: Vec<u8> = (0..24u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&big, &bytes).unwrap();
    write_tree(master.path(), 1);
    let stream_file = master.image().with_extension("stream");
    let out = Command::new(ANVIL)
        .args(["mirror-read", &m, "--since", &held.to_string()])
        .stdout(std::fs::File::create(&stream_file).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success());
    let stream = std::fs::read(&stream_file).unwrap();

    let feed = |bytes: &[u8]| -> Output {
        let mut child = Command::new(ANVIL)
            .args(["mirror-write", &s])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(bytes);
        child.wait_with_output().unwrap()
    };
    for cut in [0, 100, stream.len() / 2, stream.len() - 1] {
        let out = feed(&stream[..cut]);
        assert!(!out.status.success(), "truncated at {cut} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert_eq!(status(&s)["last_tid"].as_u64().unwrap(), held);
    }
    // A stream of another volume.
    write_tree(other.path(), 0);
    let out = Command::new(ANVIL)
        .args([
            "mirror-read",
            &text(other.path()),
            "--since",
            &held.to_string(),
        ])
        .output()
        .unwrap();
    let out = feed(&out.stdout);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("comes from volume"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tar_sum(slave.path(), "data", None), before);

    // The slave's daemon killed while it applies the big stream: after the remount the
    // slave holds what it held, checks clean, and the copy resumes from there.
    let mut child = Command::new(ANVIL)
        .args(["mirror-write", &s])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pipe = child.stdin.take().unwrap();
    let _ = pipe.write_all(&stream[..stream.len() * 3 / 4]);
    slave.kill_daemon_and_remount("mirror-write in flight");
    drop(pipe);
    // It ends, with an error, whether it saw the mount without a daemon or only the new
    // daemon (which knows nothing of its job).
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("mirror-write did not end after its daemon was replaced");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(!child.wait().unwrap().success());
    let s = text(slave.path());
    assert_eq!(status(&s)["last_tid"].as_u64().unwrap(), held);
    assert_eq!(tar_sum(slave.path(), "data", None), before);
    ok(&["mirror-copy", &m, &s]);
    assert_eq!(
        std::fs::read(slave.path().join("big")).unwrap().len(),
        bytes.len()
    );
    assert_same_data(master.path(), slave.path());
    master.unmount();
    other.unmount();
    slave.unmount();
}

/// A `--via` command standing in for ssh: drops the host and runs the command line in a
/// shell here, as ssh would there.
fn fake_ssh(dir: &Path) -> PathBuf {
    let path = dir.join("fake-ssh");
    let bin = Path::new(ANVIL).parent().unwrap().display().to_string();
    std::fs::write(
        &path,
        format!("#!/bin/sh\nshift\nPATH=\"{bin}:$PATH\" exec sh -c \"$*\"\n"),
    )
    .unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    path
}

#[test]
fn mirror_copy_to_an_image_through_a_remote_command() {
    if !common::fuse_or_skip("mirror_copy_to_an_image_through_a_remote_command") {
        return;
    }
    let master = common::Mount::new();
    let m = text(master.path());
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("slave with space.img");
    ok(&["mkfs", &text(&image), "--size", "256M"]);
    let via = text(&fake_ssh(tmp.path()));
    let remote = format!("backuphost:{}", image.display());
    for round in 0..3 {
        write_tree(master.path(), round);
        ok(&["mirror-copy", &m, &remote, "--via", &via]);
        let st: serde_json::Value =
            serde_json::from_str(&ok(&["mirror-status", &remote, "--json", "--via", &via]))
                .unwrap();
        assert_eq!(st["slave"], true);
        assert_eq!(st["last_tid"], status(&m)["committed_tid"]);
    }
    // Two rounds of mirror-stream with nothing new: no change, no failure.
    ok(&[
        "mirror-stream",
        &m,
        &remote,
        "--via",
        &via,
        "--rounds",
        "2",
        "--interval-ms",
        "50",
    ]);
    let check = ok(&["check", &text(&image)]);
    assert!(check.contains("clean"), "{check}");
    let listing = ok(&["ls", &text(&image), "/data"]);
    assert!(listing.contains("sub"), "{listing}");
    master.unmount();
}
