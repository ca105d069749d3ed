//! `anvil replay-check`: replays a device log (from `anvil mount --device-log`) onto a copy
//! of the image as it was when the mount started, and checks the volume at flush points.
//! A crash can leave the device as it was at any flush point, so each must open without
//! repair and check clean. Between two flushes a device may persist the writes in any
//! order, so with `--reorder K` each checked interval is also crashed K ways: a random
//! subset of its writes applied in random order, some torn at a 512-byte sector boundary,
//! on top of the previous flush point; each of those states must open and check clean too.

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

/// xorshift64*: a small seeded generator, enough to pick subsets reproducibly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// Applies a random subset of `pending` (random order, some writes torn at a sector
/// boundary) to `device`, verifies the image, and restores what was overwritten.
fn check_reordered(
    device: &FileDevice,
    image: &Path,
    pending: &[(u64, Vec<u8>)],
    rng: &mut Rng,
) -> Result<Option<String>, String> {
    let mut order: Vec<usize> = (0..pending.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let keep = rng.below(pending.len() as u64 + 1) as usize;
    let mut undo: Vec<(u64, Vec<u8>)> = Vec::with_capacity(keep);
    for &i in &order[..keep] {
        let (offset, data) = &pending[i];
        let mut len = data.len();
        // One write in four is torn: only its first sectors arrive.
        if data.len() > 512 && rng.below(4) == 0 {
            len = 512 * (1 + rng.below((data.len() / 512) as u64 - 1) as usize);
        }
        let mut old = vec![0u8; len];
        device
            .read_at(&mut old, *offset)
            .map_err(|e| format!("reading for undo: {e}"))?;
        device
            .write_at(&data[..len], *offset)
            .map_err(|e| e.to_string())?;
        undo.push((*offset, old));
    }
    let problem = verify(image);
    for (offset, old) in undo.iter().rev() {
        device.write_at(old, *offset).map_err(|e| e.to_string())?;
    }
    Ok(problem.map(|p| format!("{keep} of {} writes in random order: {p}", pending.len())))
}

pub fn replay_check(
    base: &Path,
    log: &Path,
    every: u64,
    reorder: u32,
    seed: u64,
) -> Result<u8, String> {
    let work_dir = tempfile_dir()?;
    let work = work_dir.join("replay.img");
    sparse_copy(base, &work)?;
    let device = FileDevice::open(&work, true).map_err(|e| e.to_string())?;
    let input = std::fs::File::open(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let (mut flushes, mut checked, mut violations, mut writes) = (0u64, 0u64, 0u64, 0u64);
    let mut reordered = 0u64;
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // Writes since the last flush, not yet applied (only kept when reordering).
    let mut pending: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut result = Ok(());
    for record in LogReader::new(std::io::BufReader::with_capacity(1 << 20, input)) {
        match record {
            Ok(LogRecord::Write { offset, data }) => {
                writes += 1;
                if reorder > 0 {
                    pending.push((offset, data));
                } else if let Err(e) = device.write_at(&data, offset) {
                    result = Err(format!("replaying write {writes}: {e}"));
                    break;
                }
            }
            Ok(LogRecord::Flush) => {
                flushes += 1;
                let due = flushes % every.max(1) == 0;
                if due && !pending.is_empty() {
                    for _ in 0..reorder {
                        reordered += 1;
                        match check_reordered(&device, &work, &pending, &mut rng) {
                            Ok(None) => {}
                            Ok(Some(problem)) => {
                                violations += 1;
                                println!(
                                    "crash before flush point {flushes} (after {writes} writes): {problem}"
                                );
                            }
                            Err(e) => result = Err(e),
                        }
                    }
                }
                if result.is_err() {
                    break;
                }
                for (offset, data) in pending.drain(..) {
                    if let Err(e) = device.write_at(&data, offset) {
                        result = Err(format!("replaying a write before flush {flushes}: {e}"));
                        break;
                    }
                }
                if result.is_err() || !due {
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
        "replay-check: {writes} writes, {flushes} flush points, {checked} checked, \
         {reordered} reordered crash states, {violations} violations"
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
