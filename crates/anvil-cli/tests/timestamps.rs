//! Times before 1970 survive the mount on both transports (xfstests generic/258: on the
//! io_uring transport they read back as 0), and under the writeback cache the times the
//! kernel showed are the ones the volume keeps.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, UNIX_EPOCH};

#[test]
fn times_before_1970_read_back_on_both_transports() {
    if !common::fuse_or_skip("times_before_1970_read_back_on_both_transports") {
        return;
    }
    // 1960-01-01T01:01:00Z. Whole seconds: on the classic transport a fraction of a second
    // before 1970 comes back one second off (fuser's conversion), not covered here.
    let when = UNIX_EPOCH - Duration::from_secs(315_615_540);
    // The test's options win over ANVIL_TEST_MOUNT_OPTS; writeback needs transport=devfuse.
    for transport in [
        "transport=auto,nowriteback",
        "transport=classic,nowriteback",
    ] {
        let mut m = common::Mount::with_options("128M", Some(transport));
        let file = m.path().join("old");
        std::fs::write(&file, b"x").unwrap();
        let f = std::fs::File::options().write(true).open(&file).unwrap();
        f.set_times(
            std::fs::FileTimes::new()
                .set_accessed(when)
                .set_modified(when),
        )
        .unwrap();
        drop(f);
        let check = |path: &std::path::Path, stage: &str| {
            let md = std::fs::metadata(path).unwrap();
            assert_eq!(
                (md.atime(), md.atime_nsec(), md.mtime(), md.mtime_nsec()),
                (-315_615_540, 0, -315_615_540, 0),
                "{transport}, {stage}"
            );
            assert_eq!(md.modified().unwrap(), when, "{transport}, {stage}");
        };
        check(&file, "as set");
        m.remount();
        check(&m.path().join("old"), "after a remount");
        m.unmount();
    }
}

/// Under the kernel's writeback cache the kernel stamps a file's times when a program
/// writes, shows its own, and sends them with SETATTR when the file is closed; the WRITEs
/// may reach the daemon after that SETATTR. The volume must hold the times the kernel
/// showed: a remount (or a mirror of the volume) shows the same ones.
#[test]
fn the_kernels_times_stand_under_the_writeback_cache() {
    if !common::fuse_or_skip("the_kernels_times_stand_under_the_writeback_cache") {
        return;
    }
    let mut m = common::Mount::with_options("128M", Some("transport=devfuse,writeback"));
    let times = |root: &std::path::Path| -> Vec<(i64, i64, i64, i64, u64)> {
        (0..20)
            .map(|i| {
                let md = std::fs::metadata(root.join(format!("f{i}"))).unwrap();
                (
                    md.mtime(),
                    md.mtime_nsec(),
                    md.ctime(),
                    md.ctime_nsec(),
                    md.len(),
                )
            })
            .collect()
    };
    let write_all = |round: u8| {
        for i in 0..20usize {
            let bytes = vec![i as u8 ^ round; i * 3000 + 7];
            std::fs::write(m.path().join(format!("f{i}")), bytes).unwrap();
        }
    };
    write_all(0);
    // Rewritten in place after a large write: the kernel's flusher is busy meanwhile.
    std::fs::write(m.path().join("big"), vec![1u8; 24 << 20]).unwrap();
    write_all(1);
    let shown = times(m.path());
    m.remount();
    assert_eq!(times(m.path()), shown);
    m.unmount();
}
