//! Real programs on the mount: SQLite in both journal modes (integrity and every row after
//! remounts, and after kill -9 of the daemon mid-transaction: every transaction whose
//! commit returned is there), git (clone, commits, gc, fsck, and kill -9 during gc) and a
//! parallel make whose result is compared with the same build on tmpfs.

mod common;

use std::path::Path;
use std::process::{Command, Output};

fn run(dir: &Path, program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program} could not start: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} in {} failed: {}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Whether `program` is installed. Where mount tests must not skip (CI), a missing one
/// fails the test instead.
fn have(program: &str) -> bool {
    let found = Command::new(program).arg("--version").output().is_ok();
    if !found {
        assert!(
            std::env::var_os("ANVIL_REQUIRE_FUSE").is_none(),
            "{program} is not installed; scripts/setup.sh installs it"
        );
        eprintln!("SKIP: {program} is not installed (scripts/setup.sh installs it)");
    }
    found
}

/// One SQLite transaction in its own process, as an application commit is: it returns
/// success only once SQLite's commit returned.
fn sqlite(dir: &Path, db: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("sqlite3")
        .args(["-bail", db, sql])
        .current_dir(dir)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(text(&out))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// Journal modes and sync settings. A kill of the daemon is a crash of what is, for
/// SQLite, the kernel: nothing a system call acknowledged may be lost, so every setting
/// keeps every committed transaction, even synchronous=OFF (which only a power loss may
/// hurt), and rollback-journal FULL, which does not sync the directory after deleting the
/// journal (its commit point).
const MODES: [(&str, &str); 4] = [
    ("wal", "FULL"),
    ("delete", "FULL"),
    ("delete", "OFF"),
    ("wal", "OFF"),
];

fn pragmas(mode: &str, sync: &str) -> String {
    format!("PRAGMA journal_mode={mode}; PRAGMA synchronous={sync}; PRAGMA busy_timeout=5000;")
}

#[test]
fn sqlite_keeps_every_committed_row_across_remounts_and_kills() {
    if !common::fuse_or_skip("sqlite_keeps_every_committed_row_across_remounts_and_kills")
        || !have("sqlite3")
    {
        return;
    }
    let rounds: u32 = std::env::var("ANVIL_SQLITE_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut mount = common::Mount::new();
    for (mode, sync) in MODES {
        let db = format!("{mode}-{sync}.db");
        let setup = format!(
            "{} CREATE TABLE t(txn INTEGER, row INTEGER, body TEXT, PRIMARY KEY(txn, row));",
            pragmas(mode, sync)
        );
        sqlite(mount.path(), &db, &setup).unwrap();
        let mut committed = 0u32;
        for round in 0..rounds {
            // Transactions of 20 rows, some updating and deleting earlier ones, until the
            // daemon is killed under them (after a different number each round).
            let kill_after = 15 + round % 5 * 7;
            let mut txn = committed;
            loop {
                let sql = format!(
                    "{} BEGIN; INSERT INTO t SELECT {txn}, value, hex(randomblob(200)) FROM \
                     generate_series(1, 20); UPDATE t SET body = 'x' WHERE txn = {txn} / 2; \
                     DELETE FROM t WHERE txn = {txn} AND row > 18; COMMIT;",
                    pragmas(mode, sync)
                );
                if txn == committed + kill_after {
                    // Kill while this transaction runs: it may or may not have committed.
                    let dir = mount.path().to_path_buf();
                    let db = db.clone();
                    let client = std::thread::spawn(move || sqlite(&dir, &db, &sql));
                    std::thread::sleep(std::time::Duration::from_millis(3));
                    mount.kill_daemon_and_remount(&format!("{mode} round {round}"));
                    let _ = client.join();
                    break;
                }
                sqlite(mount.path(), &db, &sql)
                    .unwrap_or_else(|e| panic!("{mode}: transaction {txn}: {e}"));
                txn += 1;
            }
            committed = txn;
            let check = sqlite(mount.path(), &db, "PRAGMA integrity_check;").unwrap();
            assert_eq!(check, "ok", "{mode} round {round}");
            // Every committed transaction is there, whole; the one killed is whole or absent.
            let counts = sqlite(
                mount.path(),
                &db,
                &format!("SELECT count(DISTINCT txn), count(*) FROM t WHERE txn < {committed};"),
            )
            .unwrap();
            assert_eq!(
                counts,
                format!("{committed}|{}", committed * 18),
                "{mode} round {round}: committed transactions lost"
            );
            let torn = sqlite(
                mount.path(),
                &db,
                &format!("SELECT count(*) FROM t WHERE txn = {committed};"),
            )
            .unwrap();
            assert!(
                torn == "0" || torn == "18",
                "{mode}: torn transaction ({torn} rows)"
            );
            if torn == "18" {
                committed += 1;
            }
        }
        mount.remount();
        let check = sqlite(mount.path(), &db, "PRAGMA integrity_check;").unwrap();
        assert_eq!(check, "ok", "{mode} after remount");
        let count = sqlite(mount.path(), &db, "SELECT count(*) FROM t;").unwrap();
        assert_eq!(count, (committed * 18).to_string(), "{mode} after remount");
    }
    mount.unmount();
}

fn git(dir: &Path, args: &[&str]) -> Output {
    let mut all = vec!["-c", "user.name=anvil", "-c", "user.email=anvil@test"];
    all.extend_from_slice(args);
    run(dir, "git", &all)
}

/// A repository of 30 commits to clone from.
fn source_repo() -> tempfile::TempDir {
    let source = tempfile::tempdir().unwrap();
    git(source.path(), &["init", "-q", "-b", "main"]);
    for i in 0..30 {
        std::fs::write(
            source.path().join(format!("file{}.txt", i % 7)),
            format!("revision {i}\n").repeat(50 + i),
        )
        .unwrap();
        git(source.path(), &["add", "-A"]);
        git(
            source.path(),
            &["commit", "-q", "-m", &format!("commit {i}")],
        );
    }
    source
}

/// Commits `count` new files in `repo`, numbered from `first`.
fn commit_files(repo: &Path, first: usize, count: usize) {
    for i in first..first + count {
        std::fs::create_dir_all(repo.join(format!("dir{}", i % 4))).unwrap();
        std::fs::write(
            repo.join(format!("dir{}/new{i}.txt", i % 4)),
            format!("on anvil {i}\n").repeat(100),
        )
        .unwrap();
        git(repo, &["add", "-A"]);
        git(repo, &["commit", "-q", "-m", &format!("anvil commit {i}")]);
    }
}

/// kill -9 of the daemon while `git gc --aggressive` repacks: after each kill and remount
/// the repository passes `fsck --full --strict` and holds every commit that returned.
#[test]
fn git_survives_daemon_kills_during_gc() {
    if !common::fuse_or_skip("git_survives_daemon_kills_during_gc") || !have("git") {
        return;
    }
    let rounds: usize = std::env::var("ANVIL_GIT_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let mut mount = common::Mount::new();
    let source = source_repo();
    git(
        mount.path(),
        &["clone", "-q", source.path().to_str().unwrap(), "repo"],
    );
    let repo = mount.path().join("repo");
    for round in 0..rounds {
        commit_files(&repo, round * 10, 10);
        let head = text(&git(&repo, &["rev-parse", "HEAD"]));
        let mut gc = Command::new("git")
            .args(["gc", "-q", "--aggressive", "--prune=now"])
            .current_dir(&repo)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(40 + 53 * round as u64));
        mount.kill_daemon_and_remount(&format!("git gc round {round}"));
        let _ = gc.wait();
        // What a user does after a crash: remove the locks the killed gc held (its reflog
        // expiry locks HEAD: CI once killed it holding HEAD.lock).
        for stale in [
            "gc.pid",
            "packed-refs.lock",
            "index.lock",
            "shallow.lock",
            "HEAD.lock",
        ] {
            let _ = std::fs::remove_file(repo.join(".git").join(stale));
        }
        git(&repo, &["fsck", "--full", "--strict"]);
        assert_eq!(
            text(&git(&repo, &["rev-parse", "HEAD"])),
            head,
            "round {round}"
        );
        let count = text(&git(&repo, &["rev-list", "--count", "HEAD"]));
        assert_eq!(count, (30 + 10 * (round + 1)).to_string(), "round {round}");
    }
    mount.unmount();
}

#[test]
fn git_clone_commit_gc_and_fsck() {
    if !common::fuse_or_skip("git_clone_commit_gc_and_fsck") || !have("git") {
        return;
    }
    let mount = common::Mount::new();
    let source = source_repo();
    let origin = source.path().to_str().unwrap();
    git(mount.path(), &["clone", "-q", origin, "repo"]);
    let repo = mount.path().join("repo");
    commit_files(&repo, 0, 20);
    git(&repo, &["gc", "-q", "--aggressive", "--prune=now"]);
    git(&repo, &["fsck", "--full", "--strict"]);
    let count = text(&git(&repo, &["rev-list", "--count", "HEAD"]));
    assert_eq!(count, "50");
    // The history the clone started from is the source's, object for object.
    let theirs = text(&git(source.path(), &["rev-parse", "HEAD"]));
    let ours = text(&git(&repo, &["rev-parse", "HEAD~20"]));
    assert_eq!(ours, theirs);
    mount.unmount();
}

/// A small C project: `files` sources, each a function that the program sums.
fn write_project(dir: &Path, files: usize) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let mut main = String::from("#include <stdio.h>\n");
    let mut calls = String::new();
    for i in 0..files {
        std::fs::write(
            dir.join(format!("src/f{i}.c")),
            format!(
                "unsigned long f{i}(unsigned long x) {{ unsigned long s = {i}; \
                 for (unsigned long k = 0; k < x; k++) s = s * 31 + k ^ {i}; return s; }}\n"
            ),
        )
        .unwrap();
        main.push_str(&format!("unsigned long f{i}(unsigned long);\n"));
        calls.push_str(&format!("    s += f{i}({});\n", 1000 + i));
    }
    main.push_str(&format!(
        "int main(void) {{\n    unsigned long s = 0;\n{calls}    printf(\"%lu\\n\", s);\n    return 0;\n}}\n"
    ));
    std::fs::write(dir.join("src/main.c"), main).unwrap();
    std::fs::write(
        dir.join("Makefile"),
        "SRC := $(wildcard src/*.c)\nOBJ := $(patsubst src/%.c,obj/%.o,$(SRC))\n\
         prog: $(OBJ)\n\tcc -o $@ $(OBJ)\n\
         obj/%.o: src/%.c | obj\n\tcc -O2 -c $< -o $@\n\
         obj:\n\tmkdir -p obj\n",
    )
    .unwrap();
}

#[test]
fn parallel_make_builds_what_tmpfs_builds() {
    if !common::fuse_or_skip("parallel_make_builds_what_tmpfs_builds") || !have("make") {
        return;
    }
    let mount = common::Mount::new();
    let reference =
        tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let ours = mount.path().join("project");
    let mut outputs = Vec::new();
    for dir in [reference.path(), ours.as_path()] {
        write_project(dir, 60);
        run(dir, "make", &["-j4", "-s"]);
        // Touch one source: make rebuilds exactly it (timestamps work) and relinks.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(
            dir.join("src/f3.c"),
            "unsigned long f3(unsigned long x) { return x * 3; }\n",
        )
        .unwrap();
        let rebuilt = text(&run(dir, "make", &["-j4"]));
        assert!(
            rebuilt.contains("f3.c") && !rebuilt.contains("f4.c"),
            "make rebuilt the wrong objects in {}: {rebuilt}",
            dir.display()
        );
        let result = text(&run(dir, "./prog", &[]));
        let binary = std::fs::read(dir.join("prog")).unwrap();
        outputs.push((result, binary));
    }
    assert_eq!(
        outputs[0].0, outputs[1].0,
        "the programs print different results"
    );
    assert!(outputs[0].1 == outputs[1].1, "the binaries differ");
    mount.unmount();
}
