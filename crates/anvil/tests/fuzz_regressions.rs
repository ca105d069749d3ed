//! Replays the inputs kept under `tests/fuzz-regressions/<target>/` (minimised crashers the
//! fuzzers found, plus a few corpus entries) through the same harness the cargo-fuzz targets
//! in `fuzz/` use, on stable Rust as part of `cargo test`. Each input must run without a
//! panic. See `fuzz/README.md` for running the fuzzers themselves.

#[path = "support/fuzz_harness.rs"]
mod fuzz_harness;

use anvil::device::Device;
use fuzz_harness::{Capped, ALLOCATION_BYTES_MAX};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Mutex;

/// The input being replayed, for `too_big` to name.
static REPLAYING: Mutex<String> = Mutex::new(String::new());

#[cold]
fn too_big(bytes: usize) -> ! {
    // Straight to the file descriptor: the test harness's output capture is lost on abort.
    let trace = std::backtrace::Backtrace::force_capture();
    let input = REPLAYING.try_lock().map(|p| p.clone()).unwrap_or_default();
    let _ = writeln!(
        std::io::stderr(),
        "allocation of {bytes} bytes (over {ALLOCATION_BYTES_MAX}) replaying {input}\n{trace}"
    );
    std::process::abort()
}

#[global_allocator]
static ALLOCATOR: Capped = Capped(too_big);

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fuzz-regressions")
        .join(target);
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .map(|path| {
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no inputs in {}", dir.display());
    out
}

/// Runs every input, then fails naming each one that panicked. (An input that allocates
/// without bound aborts the binary instead, naming itself.)
fn replay(target: &str, run: impl Fn(&[u8]) -> bool) {
    let mut panicked = Vec::new();
    for (path, bytes) in inputs(target) {
        *REPLAYING.lock().unwrap() = path.display().to_string();
        if catch_unwind(AssertUnwindSafe(|| run(&bytes))).is_err() {
            panicked.push(path.display().to_string());
        }
    }
    assert!(panicked.is_empty(), "inputs that panic: {panicked:#?}");
}

#[test]
fn decode_blocks_regressions() {
    replay("decode_blocks", fuzz_harness::decode_block);
}

#[test]
fn open_image_regressions() {
    replay("open_image", fuzz_harness::open_image);
}

/// The fast target's own crashers, and the `open_image` inputs replayed over its small image
/// (same input format, different blocks behind the selectors).
#[test]
fn open_image_fast_regressions() {
    replay("open_image_fast", fuzz_harness::open_image_fast);
    replay("open_image", fuzz_harness::open_image_fast);
}

/// The small image has what the big one has: a two-level tree (leaves and internal nodes),
/// every kind of headed block (a redo-log batch, space maps), and it opens both ways.
#[test]
fn small_seed_image_has_every_structure() {
    let types = |image: &fuzz_harness::SeedImage| {
        let mut types: Vec<u16> = image.headed.iter().map(|b| b.block_type).collect();
        types.sort();
        types.dedup();
        types
    };
    let small = fuzz_harness::small_seed_image();
    assert_eq!(types(small), types(fuzz_harness::seed_image()));
    assert!(fuzz_harness::open_image_fast(&[0]));
    assert!(fuzz_harness::open_image_fast(&[
        fuzz_harness::OPEN_READ_WRITE
    ]));
}

/// The generated seed corpus is what the fuzzers start from: every block seed must get past
/// the harness's header fix-up and decode, or the fuzzer would start from dead inputs; the
/// unpatched image must open (patched ones may fail cleanly).
#[test]
fn seed_corpus_is_accepted() {
    let seeds = fuzz_harness::seed_corpus();
    for target in ["decode_blocks", "open_image", "open_image_fast"] {
        assert!(seeds.iter().filter(|s| s.0 == target).count() >= 3);
    }
    for (target, name, bytes) in &seeds {
        let accepted = match *target {
            "decode_blocks" => fuzz_harness::decode_block(bytes),
            "open_image_fast" => fuzz_harness::open_image_fast(bytes) || name.starts_with("patch"),
            _ => fuzz_harness::open_image(bytes) || name.starts_with("patch"),
        };
        assert!(accepted, "seed {target}/{name} rejected");
    }
    // A patch selector with RAW_BLOCK writes without resealing.
    let mut raw = vec![0u8];
    raw.extend((fuzz_harness::RAW_BLOCK | 3).to_le_bytes());
    raw.extend([0, 0, 2, 0xff, 0xff]);
    let (device, flags) = fuzz_harness::patched_image(&raw);
    let (pristine, _) = fuzz_harness::patched_image(&[0]);
    let mut bytes = [0u8; 4];
    device.read_at(&mut bytes, 3 * 4096 - 2).unwrap();
    let mut before = [0u8; 2];
    pristine.read_at(&mut before, 3 * 4096 - 2).unwrap();
    assert_eq!((flags, bytes), (0, [before[0], before[1], 0xff, 0xff]));
    let _ = fuzz_harness::build_seed_image;
}
