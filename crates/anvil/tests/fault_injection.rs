//! I/O faults at every position of a workload: an EIO on the n-th read, write or flush gives
//! the caller a clean error (never a panic, never a hidden failed fsync), the volume stops
//! accepting changes when metadata cannot be written, and reopening the device afterwards
//! finds a volume that checks clean and holds everything that was durable.

use anvil::device::{Device, Fault, FaultDevice, MemDevice};
use anvil::{Filesystem, MountOptions};
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

/// A workload; returns how many of its durability points (sync/fsync) were acknowledged.
fn workload(fs: &Filesystem) -> (usize, anvil::Result<()>) {
    let mut durable = 0;
    let result = (|| {
        fs.mkdir_path("/d")?;
        fs.write_file("/d/a", &vec![1u8; 100_000])?;
        fs.sync()?;
        durable += 1;
        fs.write_file("/d/b", b"small")?;
        fs.rename_path("/d/a", "/a")?;
        fs.fsync(1)?;
        durable += 1;
        fs.remove_path("/d/b")?;
        fs.write_file("/c", &vec![2u8; 200_000])?;
        fs.sync()?;
        durable += 1;
        Ok(())
    })();
    (durable, result)
}

#[test]
fn eio_at_every_position_is_clean_and_loses_nothing_durable() {
    let base = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(base.clone(), 32 << 20, "faults").unwrap();
    let image = base.to_bytes();
    let mut positions = 0;
    for kind in 0..3 {
        for n in 0..40u64 {
            let inner = Arc::new(MemDevice::from_bytes(image.clone()));
            let device = Arc::new(FaultDevice::new(inner.clone()));
            let fs = match Filesystem::open(device.clone() as Arc<dyn Device>, options()) {
                Ok(fs) => fs,
                Err(_) => continue,
            };
            device.inject(match kind {
                0 => Fault::ReadErrorAfter(n),
                1 => Fault::WriteErrorAfter(n),
                _ => Fault::FlushErrorAfter(n),
            });
            fs.volume().drop_caches();
            let (durable, result) = workload(&fs);
            positions += 1;
            drop(fs);
            // Whatever happened, the device as it stands must open clean.
            let fs = Filesystem::open(inner as Arc<dyn Device>, options())
                .unwrap_or_else(|e| panic!("fault {kind}/{n}: volume does not reopen: {e}"));
            let report = anvil::check::check(fs.volume()).unwrap();
            assert!(report.is_clean(), "fault {kind}/{n}: {:?}", report.problems);
            if durable >= 1 {
                assert_eq!(
                    fs.read_file("/d/a")
                        .or_else(|_| fs.read_file("/a"))
                        .unwrap()
                        .len(),
                    100_000
                );
            }
            if durable >= 2 {
                assert_eq!(
                    fs.read_file("/a").unwrap().len(),
                    100_000,
                    "fault {kind}/{n}"
                );
            }
            if result.is_ok() {
                assert_eq!(fs.read_file("/c").unwrap(), vec![2u8; 200_000]);
            }
        }
    }
    assert!(positions > 60);
}
