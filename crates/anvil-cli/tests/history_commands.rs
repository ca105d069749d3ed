//! The history commands on a real mount: undo (by TID, label and default; to a file, to
//! stdout, as a diff; of a deleted file), history with a byte range, snaprm updating the
//! kernel's view of `.snapshots` at once, cleanup's schedule, nohistory, and
//! `mount --as-of` serving a read-only past.

mod common;

use std::process::{Command, Output};

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

#[test]
fn history_commands_on_a_mount() {
    if !common::fuse_or_skip("history_commands_on_a_mount") {
        return;
    }
    let mut mount = common::Mount::new();
    let root = mount.path().to_path_buf();
    let dir = root.to_str().unwrap().to_string();
    let file = root.join("notes.txt");
    let file_text = file.to_str().unwrap().to_string();

    std::fs::write(&file, vec![b'a'; 10_000]).unwrap();
    let first = ok(&["snapshot", &dir, "--label", "v1"]).trim().to_string();
    let mut changed = vec![b'a'; 10_000];
    changed[9_000] = b'b';
    std::fs::write(&file, &changed).unwrap();
    ok(&["synctid", &dir]);
    ok(&["drop-caches", &dir]);
    assert_eq!(std::fs::read(&file).unwrap().len(), 10_000);
    changed[10] = b'c';
    std::fs::write(&file, &changed).unwrap();
    ok(&["synctid", &dir]);

    // History: three versions; only two of them touched the first 4 KiB.
    let all = ok(&["history", &file_text]);
    assert_eq!(all.lines().count(), 1 + 3, "{all}");
    let head = ok(&["history", &file_text, "--range", "0:4096"]);
    assert_eq!(head.lines().count(), 1 + 2, "{head}");
    assert!(!run(&["history", &file_text, "--range", "nope"])
        .status
        .success());

    // Undo: by label to stdout, by TID to a file, default version, and as a diff.
    assert_eq!(
        ok(&["undo", &file_text, "-t", "v1", "-o", "-"]).as_bytes(),
        &vec![b'a'; 10_000][..]
    );
    let out = root.join("restored");
    ok(&[
        "undo",
        &file_text,
        "-t",
        &first,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read(&out).unwrap(), vec![b'a'; 10_000]);
    ok(&["undo", &file_text]);
    let diff = run(&["undo", &file_text, "-t", "v1", "--diff"]);
    assert!(
        String::from_utf8_lossy(&diff.stdout).contains("@@"),
        "a diff was expected"
    );
    assert!(!run(&["undo", &file_text, "-t", "no-such-label"])
        .status
        .success());

    // A deleted file is found through its directory's history.
    std::fs::write(root.join("gone.txt"), b"was here").unwrap();
    ok(&["synctid", &dir]);
    std::fs::remove_file(root.join("gone.txt")).unwrap();
    ok(&["synctid", &dir]);
    let gone = root.join("gone.txt");
    assert_eq!(ok(&["undo", gone.to_str().unwrap(), "-o", "-"]), "was here");

    // snaprm: the kernel's view of .snapshots changes at once.
    ok(&["snapshot", &dir, "--label", "temp"]);
    assert!(root.join(".snapshots/temp").exists());
    ok(&["snaprm", &dir, "temp"]);
    assert!(!root.join(".snapshots/temp").exists());
    let names: Vec<String> = std::fs::read_dir(root.join(".snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["v1".to_string()]);

    // Cleanup: a due snapshot is taken and the schedule remembered.
    let report = ok(&["cleanup", &dir, "--config", "prune=0 reblock=0"]);
    assert!(report.contains("snapshot: 0x"), "{report}");
    assert!(ok(&["cleanup", &dir]).contains("snapshot: not due"));

    // nohistory below a directory, inherited by new children.
    std::fs::create_dir(root.join("scratch")).unwrap();
    ok(&["nohistory", root.join("scratch").to_str().unwrap(), "on"]);
    std::fs::create_dir(root.join("scratch/sub")).unwrap();
    assert!(ok(&["nohistory", root.join("scratch/sub").to_str().unwrap()]).contains("history off"));

    // mount --as-of: the whole volume as of snapshot v1, read-only.
    let image = mount.image().to_str().unwrap().to_string();
    mount.unmount_keep_image();
    let past = tempfile::tempdir().unwrap();
    let past_dir = past.path().to_str().unwrap();
    ok(&["mount", &image, past_dir, "--as-of", "v1"]);
    let seen = std::fs::read(past.path().join("notes.txt"));
    let write = std::fs::write(past.path().join("new"), b"x");
    let _ = Command::new("umount").arg(past_dir).status();
    // Wait for that daemon to let go of the image.
    for _ in 0..100 {
        if run(&["check", &image]).status.success() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(seen.unwrap(), vec![b'a'; 10_000]);
    assert_eq!(write.unwrap_err().raw_os_error(), Some(libc::EROFS));
    let bad = run(&["mount", &image, past_dir, "--as-of", "no-such-label"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no-such-label"));
}
