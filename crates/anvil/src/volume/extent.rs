//! Extent encoding: the object's codec (LZ4 or zstd) when it saves at least an eighth, raw
//! otherwise.

use crate::error::{Error, Result};
use crate::format::record::{compression, ExtentRef, DATA_CHUNK_BYTES};
use std::cell::RefCell;

/// zstd level: 3 is zstd's own default, the knee of its ratio/speed curve.
const ZSTD_LEVEL: i32 = 3;

thread_local! {
    static ZSTD_COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { RefCell::new(None) };
    static ZSTD_DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { RefCell::new(None) };
}

/// (codec, compressed bytes), or None when the data should be stored as it is.
pub fn encode_extent(bytes: &[u8], codec: u8) -> Option<(u8, Vec<u8>)> {
    if codec == compression::NONE {
        return None;
    }
    // Data that does not shrink (media, encrypted, random) is common, and compressing all
    // of it is wasted work. A large extent probes a sample with LZ4 first, whatever the
    // codec; a small one, where the probe would cost about what compressing it does, is
    // judged by how evenly its byte values spread.
    const SAMPLE_BYTES: usize = 4096;
    if bytes.len() > 2 * SAMPLE_BYTES {
        let sample = &bytes[..SAMPLE_BYTES];
        if lz4_flex::block::compress(sample).len() > SAMPLE_BYTES - SAMPLE_BYTES / 16 {
            return None;
        }
    } else if looks_random(bytes) {
        return None;
    }
    let (codec, compressed) = match codec {
        compression::ZSTD => (compression::ZSTD, zstd_compress(bytes)?),
        _ => (compression::LZ4, lz4_flex::block::compress(bytes)),
    };
    (compressed.len() <= bytes.len() - bytes.len() / 8).then_some((codec, compressed))
}

/// Whether `bytes` look like random bytes: the byte values of a sample (up to 512 bytes,
/// in 64-byte pieces spread over the data) spread as evenly as random bytes' would, by
/// their collision count (the sum of squared counts over the 256 values: at most twice
/// what random bytes give, which is 1,534 for 512 bytes, with a standard deviation near
/// 120). Text, markup, code and runs of zeros collide far more often; they and anything
/// too short to judge are compressed. Data that repeats a random pattern is called
/// random, and is stored as it is.
fn looks_random(bytes: &[u8]) -> bool {
    const PIECE: usize = 64;
    const PIECES: usize = 8;
    if bytes.len() < 4 * PIECE {
        return false;
    }
    let mut counts = [0u32; 256];
    let stride = (bytes.len() / PIECES).max(PIECE);
    let mut sampled = 0u64;
    for piece in bytes.chunks(stride).take(PIECES) {
        let taken = &piece[..piece.len().min(PIECE)];
        for &b in taken {
            counts[usize::from(b)] += 1;
        }
        sampled += taken.len() as u64;
    }
    let collisions: u64 = counts.iter().map(|&c| u64::from(c) * u64::from(c)).sum();
    // Random bytes: sampled + sampled * (sampled - 1) / 256 expected.
    let random = sampled + sampled * (sampled - 1) / 256;
    collisions <= 2 * random
}

fn zstd_compress(bytes: &[u8]) -> Option<Vec<u8>> {
    ZSTD_COMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL).ok()?);
        }
        cell.as_mut()?.compress(bytes).ok()
    })
}

fn zstd_decompress(stored: &[u8], logical_bytes: usize) -> std::io::Result<Vec<u8>> {
    ZSTD_DECOMPRESSOR.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = Some(zstd::bulk::Decompressor::new()?);
        }
        match cell.as_mut() {
            Some(decompressor) => decompressor.decompress(stored, logical_bytes),
            None => Err(std::io::Error::other("no zstd decompressor")),
        }
    })
}

/// Verifies and decodes stored extent bytes.
pub fn decode_extent(extent: &ExtentRef, stored: &[u8]) -> Result<Vec<u8>> {
    let location = || super::extent_location(extent);
    if crate::checksum::checksum(stored) != extent.checksum {
        return Err(Error::corrupt("extent checksum mismatch", location()));
    }
    if extent.logical_bytes as u64 > DATA_CHUNK_BYTES {
        return Err(Error::corrupt("extent longer than a chunk", location()));
    }
    let logical = extent.logical_bytes as usize;
    let out = match extent.compression {
        compression::NONE if stored.len() == logical => return Ok(stored.to_vec()),
        compression::LZ4 => lz4_flex::block::decompress(stored, logical).map_err(|e| {
            Error::corrupt(format!("extent does not decompress (lz4): {e}"), location())
        })?,
        compression::ZSTD => zstd_decompress(stored, logical).map_err(|e| {
            Error::corrupt(
                format!("extent does not decompress (zstd): {e}"),
                location(),
            )
        })?,
        other => {
            return Err(Error::corrupt(
                format!("unknown compression {other}"),
                location(),
            ))
        }
    };
    if out.len() != logical {
        return Err(Error::corrupt(
            "extent decompressed to the wrong length",
            location(),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(codec: u8, bytes: &[u8]) -> (ExtentRef, Vec<u8>) {
        let (compression, stored) = match encode_extent(bytes, codec) {
            Some(pair) => pair,
            None => (compression::NONE, bytes.to_vec()),
        };
        let extent = ExtentRef {
            offset: 0,
            stored_bytes: stored.len() as u32,
            logical_bytes: bytes.len() as u32,
            checksum: crate::checksum::checksum(&stored),
            compression,
            set: crate::format::record::LocalitySet::NONE,
        };
        (extent, stored)
    }

    #[test]
    fn every_codec_round_trips() {
        let text: Vec<u8> = (0..65536u32)
            .map(|i| b"anvil keeps history "[i as usize % 20])
            .collect();
        for codec in [compression::NONE, compression::LZ4, compression::ZSTD] {
            let (extent, bytes) = stored(codec, &text);
            assert_eq!(extent.compression, codec);
            assert_eq!(decode_extent(&extent, &bytes).unwrap(), text);
        }
    }

    #[test]
    fn incompressible_data_is_stored_raw() {
        use rand::{RngCore, SeedableRng};
        let mut random = vec![0u8; 65536];
        rand::rngs::StdRng::seed_from_u64(7).fill_bytes(&mut random);
        for codec in [compression::LZ4, compression::ZSTD] {
            assert!(encode_extent(&random, codec).is_none());
        }
    }

    #[test]
    fn small_random_data_is_judged_without_compressing_it() {
        use rand::{RngCore, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for len in [256, 1000, 4096, 6000, 8192] {
            let mut random = vec![0u8; len];
            rng.fill_bytes(&mut random);
            assert!(looks_random(&random), "{len} random bytes");
            assert!(encode_extent(&random, compression::LZ4).is_none());
        }
        // Markup, a compressible header before random bytes, zeros, and what is too short
        // to judge are compressed (and shrink).
        let html: Vec<u8> = (0..6000u32)
            .map(|i| b"<li><a href=\"/p/17\">anvil</a></li>\n"[i as usize % 35])
            .collect();
        let mut half = vec![b'a'; 3000];
        let mut tail = vec![0u8; 3000];
        rng.fill_bytes(&mut tail);
        half.extend_from_slice(&tail);
        for (name, data) in [
            ("markup", html),
            ("half text", half),
            ("zeros", vec![0u8; 4096]),
            ("short", vec![7u8; 200]),
        ] {
            assert!(!looks_random(&data), "{name}");
            assert!(encode_extent(&data, compression::LZ4).is_some(), "{name}");
        }
    }

    #[test]
    fn zstd_is_smaller_than_lz4_on_text() {
        use rand::{Rng, SeedableRng};
        let words: [&[u8]; 8] = [
            b"fn ",
            b"main",
            b"() ",
            b"{ ",
            b"let x = ",
            b"42; ",
            b"}\n",
            b"// ",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut text = Vec::new();
        while text.len() < 65536 {
            text.extend_from_slice(words[rng.gen_range(0..words.len())]);
        }
        text.truncate(65536);
        let lz4 = encode_extent(&text, compression::LZ4).unwrap().1.len();
        let zstd = encode_extent(&text, compression::ZSTD).unwrap().1.len();
        assert!(zstd < lz4, "zstd {zstd} vs lz4 {lz4}");
    }

    #[test]
    fn a_zstd_frame_of_the_wrong_length_is_corrupt() {
        let text = vec![b'a'; 65536];
        let (mut extent, bytes) = stored(compression::ZSTD, &text);
        extent.logical_bytes = 4096;
        assert!(decode_extent(&extent, &bytes).is_err());
    }
}
