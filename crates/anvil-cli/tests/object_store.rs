//! Volumes on a real object store (a three-node Garage cluster started by
//! `scripts/garage.sh`, named by `ANVIL_S3_TEST_ENV`): mount, remount and check; one writer
//! at a time, also when two hosts race; a killed writer taken over; a store node stopped
//! under a workload without the user seeing it.
//!
//! Without a store the tests print SKIPPED, unless `ANVIL_REQUIRE_S3=1` (CI sets it).

mod common;

use common::{s3_address, s3_or_skip, Mount, ANVIL};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn anvil(env: &[(String, String)], args: &[&str]) -> Output {
    Command::new(ANVIL)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn write_synced(path: &Path, bytes: &[u8]) {
    let mut file = fs::File::create(path).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
}

fn umount(dir: &Path) {
    let unmounted = common::umount_waiting_while_busy(dir, |args| {
        let out = Command::new("umount").args(args).output().unwrap();
        common::CommandOutput {
            command: format!("umount {}", dir.display()),
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    });
    assert!(unmounted, "umount {}", dir.display());
    // The daemon releases the volume as it exits.
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::daemon_pid(dir).is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ready(test: &str) -> Option<Vec<(String, String)>> {
    if !common::fuse_or_skip(test) {
        return None;
    }
    s3_or_skip(test)
}

#[test]
fn a_volume_on_the_store_mounts_remounts_and_checks() {
    let Some(env) = ready("a_volume_on_the_store_mounts_remounts_and_checks") else {
        return;
    };
    let mut mount = Mount::on_store("1G", None, env.clone());
    let root = mount.path().to_path_buf();
    fs::create_dir(root.join("d")).unwrap();
    for i in 0..50 {
        write_synced(
            &root.join(format!("d/f{i}")),
            format!("{i}").repeat(3000).as_bytes(),
        );
    }
    let info = mount.anvil(
        "info-mounted",
        &[std::ffi::OsStr::new("info"), root.as_os_str()],
    );
    assert!(info.status.success(), "{info}");
    assert!(info.stdout.contains("object store:"), "{info}");
    // The store can be read while its writer is mounted: what the writer flushed.
    let address = mount.image().to_str().unwrap().to_string();
    let cat = anvil(&env, &["cat", &address, "/d/f7"]);
    assert!(cat.status.success(), "{}", text(&cat));
    assert_eq!(cat.stdout, "7".repeat(3000).as_bytes());
    mount.remount();
    assert_eq!(
        fs::read(mount.path().join("d/f49")).unwrap(),
        "49".repeat(3000).as_bytes()
    );
    mount.unmount();
}

#[test]
fn one_writer_at_a_time_and_a_killed_one_is_taken_over() {
    let Some(env) = ready("one_writer_at_a_time_and_a_killed_one_is_taken_over") else {
        return;
    };
    // No keeper (classic transport): a killed daemon stays dead.
    let mut mount = Mount::on_store("1G", Some("transport=classic,nowriteback"), env.clone());
    write_synced(&mount.path().join("acked"), b"durable");
    let address = mount.image().to_str().unwrap().to_string();
    let other = tempfile::tempdir().unwrap();
    let dir = other.path().to_str().unwrap();
    let refused = anvil(&env, &["mount", &address, dir]);
    assert!(!refused.status.success());
    let said = text(&refused);
    assert!(said.contains("mounted read-write by host"), "{said}");
    assert_eq!(said.trim().lines().count(), 1, "one line: {said}");
    // Read-only mounts are welcome beside the writer.
    let ro = anvil(&env, &["mount", &address, dir, "-o", "ro"]);
    assert!(ro.status.success(), "{}", text(&ro));
    assert_eq!(fs::read(other.path().join("acked")).unwrap(), b"durable");
    umount(other.path());

    mount.kill_daemon("SIGKILL of the writer");
    let started = Instant::now();
    mount.mount_again();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(fs::read(mount.path().join("acked")).unwrap(), b"durable");
    mount.unmount();
}

#[test]
fn racing_mounts_never_give_two_writers() {
    let Some(env) = ready("racing_mounts_never_give_two_writers") else {
        return;
    };
    let address = s3_address(&env);
    let address = address.to_str().unwrap();
    let made = anvil(&env, &["mkfs", address, "--size", "1G"]);
    assert!(made.status.success(), "{}", text(&made));
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    for round in 0..3 {
        let results: Vec<Output> = std::thread::scope(|s| {
            let racers: Vec<_> = dirs
                .iter()
                .map(|d| {
                    let (env, dir) = (&env, d.path().to_str().unwrap().to_string());
                    s.spawn(move || {
                        anvil(env, &["mount", address, &dir, "-o", "transport=classic"])
                    })
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let won: Vec<&Path> = results
            .iter()
            .zip(&dirs)
            .filter(|(out, _)| out.status.success())
            .map(|(_, d)| d.path())
            .collect();
        assert!(won.len() <= 1, "round {round}: two writers mounted");
        for (out, _) in results
            .iter()
            .zip(&dirs)
            .filter(|(o, _)| !o.status.success())
        {
            let said = text(out);
            assert!(
                said.contains("mounted read-write") || said.contains("at the same time"),
                "round {round}: {said}"
            );
        }
        for dir in won {
            write_synced(&dir.join(format!("round{round}")), b"x");
            umount(dir);
        }
    }
    let check = anvil(&env, &["check", address]);
    assert!(check.status.success(), "{}", text(&check));
}

#[test]
fn a_store_node_stopping_under_a_workload_is_not_seen() {
    let Some(env) = ready("a_store_node_stopping_under_a_workload_is_not_seen") else {
        return;
    };
    // The cluster's directory holds the env file; node 3 is not the one we talk to.
    let cluster = PathBuf::from(std::env::var(common::S3_TEST_ENV).unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/garage.sh");
    let garage = |what: &str| {
        let out = Command::new(&script)
            .args([what, cluster.to_str().unwrap(), "3"])
            .output()
            .unwrap();
        assert!(out.status.success(), "garage.sh {what}: {}", text(&out));
    };
    let mount = Mount::on_store("1G", None, env);
    let root = mount.path().to_path_buf();
    let mut node_down = false;
    for i in 0..120 {
        if i == 30 {
            garage("stop-node");
            node_down = true;
        }
        if i == 90 {
            garage("start-node");
            node_down = false;
        }
        let path = root.join(format!("f{i}"));
        write_synced(&path, format!("file {i} ").repeat(500).as_bytes());
        assert_eq!(
            fs::read(&path).unwrap(),
            format!("file {i} ").repeat(500).as_bytes()
        );
    }
    if node_down {
        garage("start-node");
    }
    mount.unmount();
}

/// The `current TID` line of `anvil info DIR`.
fn current_tid(env: &[(String, String)], dir: &Path) -> String {
    let out = anvil(env, &["info", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let info = String::from_utf8_lossy(&out.stdout).into_owned();
    info.lines()
        .find_map(|l| l.strip_prefix("current TID:"))
        .map(|t| t.trim().to_string())
        .unwrap_or_default()
}

/// Every file under `root` with its bytes, by path relative to it.
fn tree(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                todo.push(path);
            } else {
                let bytes = fs::read(&path).unwrap();
                out.push((path.strip_prefix(root).unwrap().to_path_buf(), bytes));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn two_replicas_follow_one_writer_to_identical_trees() {
    let Some(env) = ready("two_replicas_follow_one_writer_to_identical_trees") else {
        return;
    };
    let mount = Mount::on_store("1G", None, env.clone());
    let address = mount.image().to_str().unwrap().to_string();
    let replicas: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    for replica in &replicas {
        let dir = replica.path().to_str().unwrap();
        let out = anvil(
            &env,
            &["mount", &address, dir, "--replica", "-o", "follow_ms=200"],
        );
        assert!(out.status.success(), "{}", text(&out));
    }
    let root = mount.path().to_path_buf();
    for round in 0..3 {
        fs::create_dir_all(root.join(format!("d{round}"))).unwrap();
        for i in 0..20 {
            let bytes = common::pattern(1000 + 997 * i, (round * 100 + i) as u64);
            write_synced(&root.join(format!("d{round}/f{i}")), &bytes);
        }
        if round > 0 {
            fs::remove_dir_all(root.join(format!("d{}", round - 1))).unwrap();
        }
        let sync = anvil(&env, &["synctid", root.to_str().unwrap()]);
        assert!(sync.status.success(), "{}", text(&sync));
        let writer_tid = current_tid(&env, &root);
        let expected = tree(&root);
        for replica in &replicas {
            let deadline = Instant::now() + Duration::from_secs(20);
            while current_tid(&env, replica.path()) != writer_tid {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: the replica lags 20 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            assert_eq!(tree(replica.path()), expected, "round {round}");
        }
    }
    // A replica refuses writes.
    assert!(fs::write(replicas[0].path().join("nope"), b"x").is_err());
    for replica in &replicas {
        umount(replica.path());
    }
    mount.unmount();
}

#[test]
fn bad_stores_and_prefixes_give_one_line_reasons() {
    let Some(env) = s3_or_skip("bad_stores_and_prefixes_give_one_line_reasons") else {
        return;
    };
    let address = s3_address(&env);
    let address = address.to_str().unwrap();
    let one_line_failure = |out: &Output, words: &str| {
        let said = text(out);
        assert!(!out.status.success(), "succeeded: {said}");
        assert!(said.contains(words), "expected {words:?} in: {said}");
        assert_eq!(said.trim().lines().count(), 1, "one line: {said}");
    };
    // Wrong credentials.
    let mut wrong = env.clone();
    for (k, v) in &mut wrong {
        if k == "AWS_SECRET_ACCESS_KEY" {
            v.push('x');
        }
    }
    one_line_failure(
        &anvil(&wrong, &["mkfs", address, "--size", "1G"]),
        "credentials",
    );
    // A bucket that does not exist.
    one_line_failure(
        &anvil(
            &env,
            &["mkfs", "s3://no-such-bucket-here/v", "--size", "1G"],
        ),
        "does not exist",
    );
    // No store at all.
    let mut nowhere = env.clone();
    for (k, v) in &mut nowhere {
        if k == "AWS_ENDPOINT_URL" {
            *v = "http://127.0.0.1:9".to_string();
        }
    }
    one_line_failure(&anvil(&nowhere, &["info", address]), "cannot reach");
    // Nothing there, then something that is not a volume.
    one_line_failure(&anvil(&env, &["check", address]), "holds no anvil volume");
    let made = anvil(&env, &["mkfs", address, "--size", "1G"]);
    assert!(made.status.success(), "{}", text(&made));
    one_line_failure(&anvil(&env, &["mkfs", address, "--size", "1G"]), "--force");
    let inner = format!("{address}/seg");
    one_line_failure(
        &anvil(&env, &["mkfs", &inner, "--size", "1G"]),
        "not an anvil volume",
    );
    one_line_failure(&anvil(&env, &["cat", address, "/missing"]), "No such file");
    // --replica is for object stores only.
    let dir = tempfile::tempdir().unwrap();
    one_line_failure(
        &anvil(
            &env,
            &[
                "mount",
                "/nonexistent.img",
                dir.path().to_str().unwrap(),
                "--replica",
            ],
        ),
        "needs an s3:// volume",
    );
}
