//! Times before 1970 survive the mount on both transports (xfstests generic/258: on the
//! io_uring transport they read back as 0).

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
