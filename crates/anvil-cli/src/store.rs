//! Volumes on an object store: `s3://BUCKET/PREFIX` wherever a command takes an image.
//!
//! The engine sees a `Device` like any other (`anvil::device::ObjectDevice`); this module
//! connects to the store (`anvil_s3`, configured by the usual AWS environment variables)
//! and turns its failures into the one-line reasons the commands print.

use anvil::device::{BlobStore, Device, ObjectDevice, ObjectOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub const SCHEME: &str = "s3://";

/// Whether `image` names a volume on an object store rather than a file or device.
pub fn is_store(image: &Path) -> bool {
    image.to_str().is_some_and(|s| s.starts_with(SCHEME))
}

/// Connects to the store named by `image` and checks that it answers.
pub fn connect(image: &Path) -> Result<Arc<dyn BlobStore>, String> {
    let url = image
        .to_str()
        .ok_or_else(|| format!("{}: not a valid s3:// address", image.display()))?;
    let store = anvil_s3::S3Store::open(url)?;
    store.check_access().map_err(|e| e.to_string())?;
    Ok(Arc::new(store))
}

/// How long a mount waits on a silent writer before taking the volume over, from
/// `ANVIL_S3_LEASE_MS` (tests shorten it) or 5 s.
fn lease() -> Duration {
    std::env::var("ANVIL_S3_LEASE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis)
}

/// Opens the volume at `image`: as its one writer, or read-only. `takeover`: the previous
/// writer is known dead (a daemon replaced by its keeper), so no lease is waited.
pub fn open(
    image: &Path,
    writable: bool,
    takeover: bool,
    cache_bytes: u64,
    disk_cache: Option<(std::path::PathBuf, u64)>,
) -> Result<Arc<ObjectDevice>, String> {
    let store = connect(image)?;
    let options = ObjectOptions {
        writable,
        takeover,
        lease: lease(),
        cache_bytes,
        disk_cache,
        ..Default::default()
    };
    ObjectDevice::open(store, options)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// `anvil mkfs s3://...`: the marker object, then an empty volume on it.
pub fn create(image: &Path, bytes: u64, force: bool) -> Result<Arc<dyn Device>, String> {
    let store = connect(image)?;
    ObjectDevice::create(&*store, bytes, force).map_err(|e| e.to_string())?;
    let options = ObjectOptions {
        writable: true,
        lease: lease(),
        ..Default::default()
    };
    let device = ObjectDevice::open(store, options).map_err(|e| e.to_string())?;
    Ok(Arc::new(device))
}

/// Where a mount of an object-store volume keeps its crash log: tmpfs, named by the
/// address, so that the daemon that replaces a dead one on this host finds it.
pub fn crash_log_file(image: &Path, dir: Option<&Path>) -> std::path::PathBuf {
    let name = format!(
        "s3-{:016x}.log",
        xxhash_rust::xxh3::xxh3_64(image.as_os_str().as_encoded_bytes())
    );
    match dir {
        Some(dir) => dir.join(name),
        // SAFETY: geteuid has no preconditions and cannot fail.
        None => Path::new(&format!("/dev/shm/anvil-{}", unsafe { libc::geteuid() })).join(name),
    }
}
