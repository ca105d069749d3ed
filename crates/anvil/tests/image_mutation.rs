//! Structure-aware corruption: bytes inside superblocks, tree nodes and log blocks of a
//! valid image are changed and the block checksum recomputed, so decoding goes past the
//! checksum into the structures. Opening, listing, reading every file and checking must
//! then fail cleanly or succeed; never panic, hang or allocate without bound.

use anvil::device::{Device, MemDevice};
use anvil::{Filesystem, MountOptions};
use std::sync::Arc;

const BLOCK: usize = 4096;

fn seed_image() -> Vec<u8> {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 16 << 20, "fuzz").unwrap();
    let fs = Filesystem::open(
        device.clone() as Arc<dyn Device>,
        MountOptions {
            commit_interval_ms: 0,
            ..Default::default()
        },
    )
    .unwrap();
    fs.mkdir_path("/d").unwrap();
    for i in 0..300 {
        fs.write_file(&format!("/d/f{i}"), &vec![i as u8; 300 + (i % 40) * 500])
            .unwrap();
    }
    fs.symlink(anvil::fs::Caller::ROOT, 1, b"link", b"d/f1")
        .unwrap();
    fs.sync().unwrap();
    fs.write_file("/d/f2", b"logged").unwrap();
    fs.fsync(1).unwrap();
    drop(fs);
    device.to_bytes()
}

/// Recomputes the checksum of the block starting at `start` if it has a block header.
fn reseal(image: &mut [u8], start: usize) {
    if image[start..start + 4] != *b"ANVL" {
        return;
    }
    let payload = u32::from_le_bytes(image[start + 40..start + 44].try_into().unwrap()) as usize;
    let end = (start + 64 + payload).min(image.len());
    let mut scratch = image[start..end].to_vec();
    scratch[48..56].fill(0);
    let sum = anvil::checksum::checksum(&scratch);
    image[start + 48..start + 56].copy_from_slice(&sum.to_le_bytes());
}

fn exercise(image: Vec<u8>) {
    let device = Arc::new(MemDevice::from_bytes(image));
    let options = MountOptions {
        commit_interval_ms: 0,
        read_only: true,
        ..Default::default()
    };
    let Ok(fs) = Filesystem::open(device as Arc<dyn Device>, options) else {
        return;
    };
    let _ = anvil::check::check(fs.volume());
    if let Ok(entries) = fs.list_dir("/d") {
        for entry in entries.iter().take(100) {
            let _ = fs.read(entry.ino, 0, 1 << 20);
            let _ = fs.getattr(entry.ino);
        }
    }
    let _ = fs.readlink(fs.resolve("/link").unwrap_or(0));
    let _ = fs.history(1);
}

#[test]
fn mutated_blocks_never_panic() {
    let seed = seed_image();
    // Blocks worth mutating: those that start with a block header.
    let headed: Vec<usize> = (0..seed.len() / BLOCK)
        .map(|b| b * BLOCK)
        .filter(|&s| seed[s..s + 4] == *b"ANVL")
        .collect();
    assert!(headed.len() > 5);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let cases: u64 = std::env::var("ANVIL_MUTATION_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    for _ in 0..cases {
        let mut image = seed.clone();
        let start = headed[next(headed.len() as u64) as usize];
        for _ in 0..1 + next(4) {
            // Mostly inside the first bytes after the header, where counts and lengths live.
            let near_header = next(2) == 0;
            let span = if near_header {
                64
            } else {
                (BLOCK * 4 - 64) as u64
            };
            let offset = start + 64 + next(span) as usize;
            if offset < image.len() {
                image[offset] ^= 1 << next(8);
            }
        }
        reseal(&mut image, start);
        exercise(image);
    }
}
