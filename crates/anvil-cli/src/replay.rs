//! `anvil replay-check`: replays a device log (from `anvil mount --device-log`) onto a copy
//! of the image as it was when the mount started, and checks the volume at flush points.
//! A crash can leave the device as it was at any flush point, so each must open without
//! repair and check clean.

use anvil::device::{Device, FileDevice, LogReader, LogRecord};
use anvil::{Filesystem, MountOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

/// Copies `from` to `to` leaving holes where `from` has all-zero megabytes.
fn sparse_copy(from: &Path, to: &Path) -> Result<(), String> {
    let mut input = std::fs::File::open(from).map_err(|e| format!("{}: {e}", from.display()))?;
    let len = input.metadata().map_err(|e| e.to_string())?.len();
    let output = std::fs::File::create(to).map_err(|e| format!("{}: {e}", to.display()))?;
    output.set_len(len).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    use std::os::unix::fs::FileExt;
    loop {
        let n = input.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        if buf[..n].iter().any(|&b| b != 0) {
            output
                .write_all_at(&buf[..n], offset)
                .map_err(|e| e.to_string())?;
        }
        offset += n as u64;
    }
}

/// Opens the image as it stands and checks it; None when clean.
fn verify(image: &Path) -> Option<String> {
    let device = match FileDevice::open(image, false) {
        Ok(device) => device,
        Err(e) => return Some(format!("cannot open: {e}")),
    };
    let options = MountOptions {
        read_only: true,
        commit_interval_ms: 0,
        ..Default::default()
    };
    let fs = match Filesystem::open(Arc::new(device), options) {
        Ok(fs) => fs,
        Err(e) => return Some(format!("does not mount: {e}")),
    };
    match anvil::check::check(fs.volume()) {
        Ok(report) if report.is_clean() => None,
        Ok(report) => Some(report.problems.join("; ")),
        Err(e) => Some(format!("check failed: {e}")),
    }
}

pub fn replay_check(base: &Path, log: &Path, every: u64) -> Result<u8, String> {
    let work_dir = tempfile_dir()?;
    let work = work_dir.join("replay.img");
    sparse_copy(base, &work)?;
    let device = FileDevice::open(&work, true).map_err(|e| e.to_string())?;
    let input = std::fs::File::open(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let (mut flushes, mut checked, mut violations, mut writes) = (0u64, 0u64, 0u64, 0u64);
    let mut result = Ok(());
    for record in LogReader::new(std::io::BufReader::with_capacity(1 << 20, input)) {
        match record {
            Ok(LogRecord::Write { offset, data }) => {
                writes += 1;
                if let Err(e) = device.write_at(&data, offset) {
                    result = Err(format!("replaying write {writes}: {e}"));
                    break;
                }
            }
            Ok(LogRecord::Flush) => {
                flushes += 1;
                if flushes % every.max(1) != 0 {
                    continue;
                }
                checked += 1;
                if let Some(problem) = verify(&work) {
                    violations += 1;
                    println!("flush point {flushes} (after {writes} writes): {problem}");
                }
            }
            Err(e) => {
                result = Err(format!("{}: {e}", log.display()));
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work_dir);
    result?;
    println!(
        "replay-check: {writes} writes, {flushes} flush points, {checked} checked, {violations} violations"
    );
    let _ = std::io::stdout().flush();
    Ok(if violations == 0 { 0 } else { 3 })
}

fn tempfile_dir() -> Result<std::path::PathBuf, String> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let dir = base.join(format!("anvil-replay-{}-{attempt}", std::process::id()));
        if std::fs::create_dir(&dir).is_ok() {
            return Ok(dir);
        }
    }
    Err("cannot create a scratch directory".to_string())
}
