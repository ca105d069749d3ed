//! Extent encoding: LZ4 when it saves at least an eighth, raw otherwise.

use crate::error::{Error, Result};
use crate::format::record::{compression, ExtentRef, DATA_CHUNK_BYTES};

/// Compressed bytes, or None when the data should be stored as it is.
pub fn encode_extent(bytes: &[u8]) -> Option<Vec<u8>> {
    // Probe a sample first: data that does not shrink (media, encrypted, random) is common
    // and compressing all of it is wasted work.
    const SAMPLE_BYTES: usize = 4096;
    if bytes.len() > 2 * SAMPLE_BYTES {
        let sample = &bytes[..SAMPLE_BYTES];
        if lz4_flex::block::compress(sample).len() > SAMPLE_BYTES - SAMPLE_BYTES / 16 {
            return None;
        }
    }
    let compressed = lz4_flex::block::compress(bytes);
    (compressed.len() <= bytes.len() - bytes.len() / 8).then_some(compressed)
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
    match extent.compression {
        compression::NONE if stored.len() == extent.logical_bytes as usize => Ok(stored.to_vec()),
        compression::LZ4 => {
            let out = lz4_flex::block::decompress(stored, extent.logical_bytes as usize).map_err(
                |e| Error::corrupt(format!("extent does not decompress: {e}"), location()),
            )?;
            if out.len() != extent.logical_bytes as usize {
                return Err(Error::corrupt(
                    "extent decompressed to the wrong length",
                    location(),
                ));
            }
            Ok(out)
        }
        other => Err(Error::corrupt(
            format!("unknown compression {other}"),
            location(),
        )),
    }
}
