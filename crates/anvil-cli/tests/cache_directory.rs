//! `anvil evict DIR on` through a real mount: a proxy-style writer fills a cache directory
//! with three times the volume's size and never sees ENOSPC; the oldest files are gone, the
//! newest read back, files outside the cache stay, and the setting is refused on a file.

mod common;

use std::process::{Command, Output};

const ANVIL: &str = env!("CARGO_BIN_EXE_anvil");

fn run(args: &[&str]) -> Output {
    Command::new(ANVIL).args(args).output().unwrap()
}

#[test]
fn a_cache_directory_through_the_mount() {
    if !common::fuse_or_skip("a_cache_directory_through_the_mount") {
        return;
    }
    let mut mount = common::Mount::with_size("64M");
    let root = mount.path().to_path_buf();
    let cache = root.join("cache");
    std::fs::create_dir(&cache).unwrap();
    let kept = common::pattern(4 << 20, 99);
    std::fs::write(root.join("kept"), &kept).unwrap();

    // On a file: refused, with the reason.
    let out = run(&["evict", root.join("kept").to_str().unwrap(), "on"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("only a directory"), "{stderr}");

    let out = run(&["evict", cache.to_str().unwrap(), "on"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(&["evict", cache.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(": a cache"), "{shown}");
    let out = run(&["evict", root.to_str().unwrap()]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains(": not a cache"), "{shown}");
    let out = run(&["nohistory", cache.to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("history off"));

    let count = 192u64;
    for i in 0..count {
        std::fs::write(cache.join(format!("f{i}")), common::pattern(1 << 20, i))
            .unwrap_or_else(|e| panic!("file {i}: {e}"));
    }
    let present: Vec<u64> = (0..count)
        .filter(|i| cache.join(format!("f{i}")).exists())
        .collect();
    assert!(!present.contains(&0), "the oldest file stayed");
    assert!(present.contains(&(count - 1)), "the newest file went");
    for &i in present.iter().rev().take(8) {
        assert_eq!(
            std::fs::read(cache.join(format!("f{i}"))).unwrap(),
            common::pattern(1 << 20, i),
            "f{i}"
        );
    }
    assert_eq!(std::fs::read(root.join("kept")).unwrap(), kept);
    let out = run(&["info", root.to_str().unwrap()]);
    let info = String::from_utf8_lossy(&out.stdout);
    let evicted = info
        .lines()
        .find_map(|l| l.strip_prefix("evicted:"))
        .unwrap_or_else(|| panic!("no evictions in `anvil info`: {info}"));
    let files: u64 = evicted.split_whitespace().next().unwrap().parse().unwrap();
    assert!(files >= count - present.len() as u64, "{evicted}");
    mount.unmount_keep_image();
    let check = mount.check();
    assert!(check.status.success(), "{check}");
}
