//! `anvil replay-check`: replays a device log (from `anvil mount --device-log`) onto the
//! image as it was when the mount started, and checks the volume at flush points. A crash
//! can leave the device as it was at any flush point, so each must open without repair and
//! check clean. Between two flushes a device may persist the writes in any order, so with
//! `--reorder K` each checked interval is also crashed K ways: a random subset of its writes
//! applied in random order, some torn at a 512-byte sector boundary, on top of the previous
//! flush point. With `--kills`, the state after every write is checked too: what a crash of
//! the daemon (not of the machine) leaves on the device, since the host keeps every write it
//! was given. (The daemon's crash log file, on tmpfs, is not in the device log: these states
//! are the image without it, which must open and check clean like any other.)
//!
//! The images live in memory as copy-on-write pages (`anvil::device::Pages`): a crash state
//! copies only the pages its writes touch, and states are checked on every CPU. Most of a
//! state's extents lie on pages it shares with states checked before, so an extent that
//! verified clean is remembered with the pages it was read from (`Verified`), and a state
//! holding those very pages under it skips reading, verifying and decoding it again (its
//! space is still accounted for): the same check, without repeating identical work.

use anvil::check::KnownExtents;
use anvil::device::{Device, LogReader, LogRecord, MemDevice, PageSpan, Pages};
use anvil::format::record::ExtentRef;
use anvil::{Filesystem, MountOptions};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// Remembered extents at most; past it the memory starts over (it only saves work).
const VERIFIED_MAX: usize = 500_000;

/// Extents that verified clean in some crash state, with the pages they were read from.
#[derive(Default)]
struct Verified(RwLock<HashMap<ExtentRef, PageSpan>>);

/// `Verified` as seen from one crash state's image.
struct KnownIn<'a> {
    verified: &'a Verified,
    image: &'a MemDevice,
}

impl KnownExtents for KnownIn<'_> {
    fn verified(&self, extent: &ExtentRef) -> bool {
        let map = self
            .verified
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        map.get(extent).is_some_and(|span| {
            self.image
                .holds(extent.offset, extent.stored_bytes as usize, span)
        })
    }

    fn record(&self, extent: &ExtentRef) {
        let Some(span) = self.image.span(extent.offset, extent.stored_bytes as usize) else {
            return;
        };
        let mut map = self
            .verified
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if map.len() >= VERIFIED_MAX {
            map.clear();
        }
        map.insert(*extent, span);
    }
}

/// Reads an image file into pages (all-zero stretches stay shared zero pages).
fn load_image(path: &Path) -> Result<Pages, String> {
    let mut input = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = input.metadata().map_err(|e| e.to_string())?.len();
    let mut pages = Pages::zeroed(len as usize);
    let mut buf = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    loop {
        let n = input
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            return Ok(pages);
        }
        if buf[..n].iter().any(|&b| b != 0) {
            pages.write(&buf[..n], offset);
        }
        offset += n as u64;
    }
}

/// Opens the image as it stands and checks it; None when clean.
fn verify(image: Pages, verified: &Verified) -> Option<String> {
    let options = MountOptions {
        read_only: true,
        commit_interval_ms: 0,
        ..Default::default()
    };
    let device = Arc::new(MemDevice::from_pages(image));
    let fs = match Filesystem::open(device.clone() as Arc<dyn Device>, options) {
        Ok(fs) => fs,
        Err(e) => return Some(format!("does not mount: {e}")),
    };
    // The pages the check reads, as it reads them (a read-only open writes nothing, but the
    // memory must not depend on that).
    let known = KnownIn {
        verified,
        image: &device,
    };
    match anvil::check::check_with(fs.volume(), Some(&known)) {
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

/// One crash state to check.
enum Job {
    /// The device at a flush point.
    Flush { image: Pages },
    /// A random subset of the interval's writes (random order, some torn) on top of the
    /// previous flush point.
    Reordered {
        durable: Pages,
        pending: Arc<Vec<(u64, Vec<u8>)>>,
        seed: u64,
    },
    /// Every write so far, in order: a crash of the process.
    Killed { image: Pages },
}

/// What a `Job` found: where it was, and the problem if any.
struct Finding {
    order: u64,
    place: String,
    problem: Option<String>,
}

fn run_job(job: Job, verified: &Verified) -> Option<String> {
    match job {
        Job::Flush { image } | Job::Killed { image } => verify(image, verified),
        Job::Reordered {
            mut durable,
            pending,
            seed,
        } => {
            let mut rng = Rng(seed);
            let mut order: Vec<usize> = (0..pending.len()).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let keep = rng.below(pending.len() as u64 + 1) as usize;
            for &i in &order[..keep] {
                let (offset, data) = &pending[i];
                let mut len = data.len();
                // One write in four is torn: only its first sectors arrive.
                if data.len() > 512 && rng.below(4) == 0 {
                    len = 512 * (1 + rng.below((data.len() / 512) as u64 - 1) as usize);
                }
                durable.write(&data[..len], *offset);
            }
            verify(durable, verified)
                .map(|p| format!("{keep} of {} writes in random order: {p}", pending.len()))
        }
    }
}

/// What to check besides every `every`-th flush point.
pub struct ReplayOptions {
    pub every: u64,
    pub reorder: u32,
    pub seed: u64,
    /// Check the state after every write (a crash of the daemon).
    pub kills: bool,
    pub threads: usize,
}

pub fn replay_check(base: &Path, log: &Path, options: &ReplayOptions) -> Result<u8, String> {
    let mut image = load_image(base)?;
    let mut durable = image.clone();
    let input = std::fs::File::open(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let (mut flushes, mut checked, mut writes, mut reordered, mut killed) = (0u64, 0, 0, 0, 0);
    let mut rng = Rng(options.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // Writes since the last flush.
    let mut pending: Vec<(u64, Vec<u8>)> = Vec::new();
    let findings: Mutex<Vec<Finding>> = Mutex::new(Vec::new());
    let verified = Verified::default();
    let threads = options.threads.max(1);
    let (sender, receiver) = mpsc::sync_channel::<(u64, String, Job)>(threads * 4);
    let receiver = Mutex::new(receiver);
    let started = std::time::Instant::now();
    let result = std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let Ok((order, place, job)) = receiver
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .recv()
                else {
                    return;
                };
                let problem = run_job(job, &verified);
                let mut findings = findings.lock().unwrap_or_else(PoisonError::into_inner);
                findings.push(Finding {
                    order,
                    place,
                    problem,
                });
                if findings.len() % 20_000 == 0 {
                    let seconds = started.elapsed().as_secs_f64();
                    eprintln!(
                        "replay-check: {} states checked in {seconds:.0} s",
                        findings.len()
                    );
                }
            });
        }
        let mut order = 0u64;
        let mut send = |place: String, job: Job| {
            order += 1;
            sender.send((order, place, job)).map_err(|e| e.to_string())
        };
        // The workers stop once the sender is gone, on every path out of the feeding.
        let feed = || -> Result<(), String> {
            for record in LogReader::new(std::io::BufReader::with_capacity(1 << 20, input)) {
                match record.map_err(|e| format!("{}: {e}", log.display()))? {
                    LogRecord::Write { offset, data } => {
                        writes += 1;
                        if offset + data.len() as u64 > image.len() as u64 {
                            return Err(format!("write {writes} lies beyond the image"));
                        }
                        image.write(&data, offset);
                        pending.push((offset, data));
                        if options.kills {
                            killed += 1;
                            let place = format!("daemon killed after write {writes}");
                            send(
                                place,
                                Job::Killed {
                                    image: image.clone(),
                                },
                            )?;
                        }
                    }
                    LogRecord::Flush => {
                        flushes += 1;
                        let due = flushes % options.every.max(1) == 0;
                        if due && !pending.is_empty() && options.reorder > 0 {
                            let pending = Arc::new(std::mem::take(&mut pending));
                            for _ in 0..options.reorder {
                                reordered += 1;
                                let place = format!(
                                    "crash before flush point {flushes} (after {writes} writes)"
                                );
                                let job = Job::Reordered {
                                    durable: durable.clone(),
                                    pending: pending.clone(),
                                    seed: rng.next() | 1,
                                };
                                send(place, job)?;
                            }
                        }
                        pending.clear();
                        durable = image.clone();
                        if due {
                            checked += 1;
                            let place = format!("flush point {flushes} (after {writes} writes)");
                            send(
                                place,
                                Job::Flush {
                                    image: durable.clone(),
                                },
                            )?;
                        }
                    }
                }
            }
            Ok(())
        };
        let fed = feed();
        drop(sender);
        fed
    });
    result?;
    let mut findings = findings
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    findings.sort_by_key(|f| f.order);
    let mut violations = 0u64;
    for finding in &findings {
        if let Some(problem) = &finding.problem {
            violations += 1;
            println!("{}: {problem}", finding.place);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "replay-check: {writes} writes, {flushes} flush points, {checked} checked, \
         {reordered} reordered crash states, {killed} daemon-kill states, {violations} \
         violations ({} states in {seconds:.1} s on {threads} threads)",
        findings.len()
    );
    let _ = std::io::stdout().flush();
    Ok(if violations == 0 { 0 } else { 3 })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(offset: u64, stored_bytes: u32) -> ExtentRef {
        ExtentRef {
            offset,
            stored_bytes,
            logical_bytes: stored_bytes,
            checksum: 7,
            compression: 0,
            set: Default::default(),
        }
    }

    /// An extent counts as verified only while the very pages it was read from lie under
    /// it: a write to one of them, in place or copied, makes it be read again.
    #[test]
    fn verified_extents_are_tied_to_their_pages() {
        const PAGE: u64 = 64 << 10; // `Pages` holds 64 KiB pages
        let verified = Verified::default();
        let mut first = Pages::zeroed(8 * PAGE as usize);
        first.write(&vec![1u8; 2 * PAGE as usize], PAGE);
        let e = extent(PAGE + 4096, 90_000); // on pages 1 and 2
        let elsewhere = extent(5 * PAGE, 4096);
        let known = KnownIn {
            verified: &verified,
            image: &MemDevice::from_pages(first.clone()),
        };
        assert!(!known.verified(&e));
        known.record(&e);
        assert!(known.verified(&e));
        assert!(!known.verified(&elsewhere));
        let moved = extent(PAGE + 4096, 90_001);
        assert!(!known.verified(&moved), "another extent at the same place");

        // A later state sharing the pages; a write beside the extent changes nothing.
        let mut later = first.clone();
        later.write(&[2u8; 100], 4 * PAGE);
        let known = KnownIn {
            verified: &verified,
            image: &MemDevice::from_pages(later.clone()),
        };
        assert!(known.verified(&e));
        // One byte under the extent, on its last page: read it again.
        let mut torn = later.clone();
        torn.write(&[9u8], PAGE + 4096 + 89_999);
        let known = KnownIn {
            verified: &verified,
            image: &MemDevice::from_pages(torn.clone()),
        };
        assert!(!known.verified(&e));
        // The same bytes written again are still other pages: read again, to be safe.
        drop(first);
        let mut rewritten = later.clone();
        rewritten.write(&[1u8; 4096], PAGE);
        let known = KnownIn {
            verified: &verified,
            image: &MemDevice::from_pages(rewritten.clone()),
        };
        assert!(!known.verified(&e));
    }
}
