//! kill -9 of the daemon at seeded random moments while a writer creates and fsyncs files,
//! under stress-ng load (directory, rename, hdd and xattr stressors, when stress-ng is
//! installed): after every kill the volume checks clean and mounts again, and every file
//! whose writes returned before the kill is there with exactly its contents, fsync'd or
//! not: a crash of the daemon loses nothing it acknowledged (only a power loss needs fsync).
//! A copy of the image as the kill left it, without the daemon's crash log file (as a power
//! loss leaves it: the file is on tmpfs), still holds every file that was fsync'd.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn contents(name: u64) -> Vec<u8> {
    common::pattern(1000 + (name % 7) as usize * 30_000, name)
}

/// Copies the image (not the crash log file, which is keyed by the image's inode) and reads
/// the files fsync'd before the kill from the copy.
fn power_loss_keeps_fsynced_files(
    image: &std::path::Path,
    files: &BTreeMap<String, u64>,
    round: u64,
) {
    let copy = image.with_extension("power-lost");
    let copied = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(image)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(copied.success(), "cp of the image failed");
    let fsynced: Vec<_> = files.iter().filter(|(_, name)| *name % 3 == 0).collect();
    let listed = std::process::Command::new(common::ANVIL)
        .arg("ls")
        .arg(&copy)
        .arg("/")
        .output()
        .unwrap();
    assert!(listed.status.success(), "anvil ls of the copy failed");
    let listed = String::from_utf8_lossy(&listed.stdout);
    for (file, _) in &fsynced {
        assert!(
            listed
                .lines()
                .any(|l| l.split_whitespace().any(|w| w == file.as_str())),
            "round {round}: fsync'd {file} lost with the crash log file"
        );
    }
    // The newest few, byte for byte.
    for (file, name) in fsynced.iter().rev().take(3) {
        let out = std::process::Command::new(common::ANVIL)
            .arg("cat")
            .arg(&copy)
            .arg(format!("/{file}"))
            .output()
            .unwrap();
        assert!(
            out.status.success() && out.stdout == contents(**name),
            "round {round}: fsync'd {file} differs without the crash log file"
        );
    }
    std::fs::remove_file(&copy).unwrap();
    eprintln!(
        "round {round}: {} fsync'd files there without the crash log file",
        fsynced.len()
    );
}

#[test]
fn acknowledged_files_survive_kill_dash_nine() {
    if !common::fuse_or_skip("acknowledged_files_survive_kill_dash_nine") {
        return;
    }
    let seed: u64 = std::env::var("ANVIL_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let rounds: u64 = std::env::var("ANVIL_KILL_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    eprintln!(
        "daemon kill test: seed {seed}, {rounds} rounds (ANVIL_KILL_SEED, ANVIL_KILL_ROUNDS)"
    );
    let mut mount = common::Mount::new();
    let acknowledged: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let mut next_name = 0u64;
    let stress_ng = std::process::Command::new("stress-ng")
        .arg("--version")
        .output()
        .is_ok();
    if !stress_ng {
        eprintln!("note: stress-ng not installed; kills happen without background load");
    }
    for round in 0..rounds {
        let root = mount.path().to_path_buf();
        let stop = Arc::new(AtomicBool::new(false));
        let load = stress_ng.then(|| {
            use std::os::unix::process::CommandExt;
            let dir = root.join(format!("stress{round}"));
            std::fs::create_dir(&dir).unwrap();
            std::process::Command::new("stress-ng")
                .arg("--temp-path")
                .arg(&dir)
                .args([
                    "--dir",
                    "1",
                    "--rename",
                    "1",
                    "--hdd",
                    "1",
                    "--hdd-bytes",
                    "8M",
                ])
                .args(["--xattr", "1", "-t", "60s", "--quiet"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .process_group(0)
                .spawn()
                .expect("start stress-ng")
        });
        let writer = {
            let (root, stop, acknowledged) = (root.clone(), stop.clone(), acknowledged.clone());
            let first = next_name;
            std::thread::spawn(move || {
                let mut name = first;
                while !stop.load(Ordering::Acquire) {
                    let path = root.join(format!("f{name}"));
                    let written = std::fs::File::create(&path).and_then(|mut f| {
                        f.write_all(&contents(name))?;
                        if name % 3 == 0 {
                            f.sync_all()?;
                            return Ok(true);
                        }
                        Ok(false)
                    });
                    match written {
                        Ok(_) => {
                            acknowledged
                                .lock()
                                .unwrap()
                                .insert(format!("f{name}"), name);
                        }
                        Err(_) => break, // the daemon is gone
                    }
                    name += 1;
                }
                name
            })
        };
        let delay = 150 + (seed.wrapping_mul(31).wrapping_add(round * 97) % 600);
        std::thread::sleep(Duration::from_millis(delay));
        let pid = common::daemon_pid(mount.image()).expect("daemon running");
        // SAFETY: killing the daemon this test started for its own image.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        stop.store(true, Ordering::Release);
        next_name = writer.join().unwrap() + 1;
        if let Some(mut load) = load {
            // SAFETY: the stress-ng process group this test started.
            unsafe { libc::kill(-(load.id() as i32), libc::SIGKILL) };
            let _ = load.wait();
        }
        // Already dead: this only detaches, waits and checks.
        mount.kill_daemon(&format!("round {round}"));
        power_loss_keeps_fsynced_files(mount.image(), &acknowledged.lock().unwrap(), round);
        mount.mount_again();
        for (file, name) in acknowledged.lock().unwrap().iter() {
            let got = std::fs::read(mount.path().join(file))
                .unwrap_or_else(|e| panic!("round {round}: acknowledged {file} lost: {e}"));
            assert!(
                got == contents(*name),
                "round {round}: acknowledged {file} differs"
            );
        }
        eprintln!(
            "round {round}: killed after {delay} ms, {} acknowledged files verified",
            acknowledged.lock().unwrap().len()
        );
    }
    mount.unmount();
}
