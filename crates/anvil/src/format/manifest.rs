//! The commit manifest: every range a commit wrote, with the checksum of its bytes.
//!
//! A commit whose superblock carries a manifest was made durable by one flush, issued after
//! the superblock: its nodes, extents, space map and superblock went to the device together,
//! and a power cut may have kept any subset of them. Mount reads the manifest the newest
//! superblock names (its checksum is in the superblock) and every range it lists; if one of
//! them does not hold the bytes the commit wrote, that commit never became durable, and
//! mount takes the superblock before it, whose tree is whole (what a commit frees is reused
//! only once that commit is durable) and whose redo log still holds the newer epoch.
//!
//! Ranges are checked by their own bytes, not by the blocks' self-checks: a node left at a
//! reused address by an older commit passes its own checksum, and a reblock step writes its
//! nodes with the TID of the commit before it.
//!
//! Payload: `count: u64`, then per range its address (`u64`), its length (LEB128 varint) and
//! the `checksum` of its bytes (`u64`). The block is a multiple of `BLOCK_BYTES`, sealed like
//! every other block (header, checksum, address); the header's TID is the commit's.

use super::coding::Writer;
use super::{open_listing, seal_listing, BlockType, Expect, Listing, VolumeId};
use crate::error::{Error, Result};

/// One range a commit wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub address: u64,
    pub bytes: u64,
    /// `crate::checksum::checksum` of the range's bytes.
    pub checksum: u64,
}

/// Bytes one range takes in the payload at most (a varint length of up to ten bytes).
const RANGE_BYTES_MAX: usize = 8 + 10 + 8;

/// Bytes of the block holding a manifest of `ranges` ranges, rounded up to whole blocks.
pub fn block_bytes_for(ranges: usize) -> u64 {
    super::listing_block_bytes(8 + ranges * RANGE_BYTES_MAX)
}

/// Seals `ranges` as the manifest block of the commit at `tid`, to be written at `address`,
/// `block_bytes` long (at least `block_bytes_for(ranges.len())`).
pub fn seal(
    ranges: &[Range],
    volume_id: VolumeId,
    tid: u64,
    address: u64,
    block_bytes: u64,
) -> Vec<u8> {
    let mut w = Writer::with_capacity(8 + ranges.len() * 20);
    w.u64(ranges.len() as u64);
    for range in ranges {
        w.u64(range.address);
        w.uvarint(range.bytes);
        w.u64(range.checksum);
    }
    seal_listing(
        BlockType::Manifest,
        &w.bytes,
        volume_id,
        tid,
        address,
        block_bytes,
    )
}

/// Decodes and validates a manifest block read from `address`: written for this volume at
/// `tid`, every range inside `[data_offset, volume_bytes)` and not empty.
pub fn decode(
    bytes: &[u8],
    volume_id: &VolumeId,
    address: u64,
    tid: u64,
    data_offset: u64,
    volume_bytes: u64,
) -> Result<Vec<Range>> {
    let expect = Expect {
        block_type: BlockType::Manifest,
        volume_id: Some(volume_id),
        address,
    };
    // Every range takes at least 17 bytes. Manifests exist since format version 9: any
    // block that decodes is of that version or later.
    let Some(Listing {
        reader: mut r,
        count,
        location,
        ..
    }) = open_listing(bytes, &expect, tid, 0, 17, "commit manifest")?
    else {
        return Err(Error::corrupt("no manifest", format!("byte {address}")));
    };
    let mut ranges = Vec::with_capacity(count);
    for index in 0..count {
        let range = Range {
            address: r.u64()?,
            bytes: r.uvarint()?,
            checksum: r.u64()?,
        };
        let inside = range.address >= data_offset
            && range.bytes > 0
            && range
                .address
                .checked_add(range.bytes)
                .is_some_and(|end| end <= volume_bytes);
        if !inside {
            return Err(Error::corrupt(
                format!("range {index} outside the data area"),
                location,
            ));
        }
        ranges.push(range);
    }
    if r.remaining() != 0 {
        return Err(Error::corrupt("bytes after the last range", location));
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{BLOCK_BYTES, HEADER_BYTES};

    const DATA: u64 = 1 << 20;
    const END: u64 = 64 << 20;
    const AT: u64 = DATA + 8192;

    fn sample() -> Vec<Range> {
        vec![
            Range {
                address: DATA + 16384,
                bytes: 16384,
                checksum: 0x1234_5678_9abc_def0,
            },
            Range {
                address: DATA + 5000,
                bytes: 700,
                checksum: 7,
            },
            Range {
                address: END - 300,
                bytes: 300,
                checksum: u64::MAX,
            },
        ]
    }

    #[test]
    fn round_trips() {
        let ranges = sample();
        let block = seal(&ranges, [3; 16], 9, AT, block_bytes_for(ranges.len()));
        assert_eq!(block.len() as u64 % BLOCK_BYTES, 0);
        assert_eq!(decode(&block, &[3; 16], AT, 9, DATA, END).unwrap(), ranges);
        let empty = seal(&[], [3; 16], 9, AT, block_bytes_for(0));
        assert_eq!(decode(&empty, &[3; 16], AT, 9, DATA, END).unwrap(), vec![]);
    }

    #[test]
    fn a_large_manifest_fits_its_block() {
        let ranges: Vec<Range> = (0..5000)
            .map(|i| Range {
                address: DATA + i * 65536,
                bytes: u64::MAX >> 1,
                checksum: i,
            })
            .collect();
        let bytes = block_bytes_for(ranges.len());
        let block = seal(&ranges, [3; 16], 9, AT, bytes);
        assert_eq!(block.len() as u64, bytes);
    }

    #[test]
    fn refuses_what_a_commit_never_writes() {
        let ranges = sample();
        let bytes = block_bytes_for(ranges.len());
        let block = seal(&ranges, [3; 16], 9, AT, bytes);
        // Another commit's manifest, another volume's, another address's.
        assert!(decode(&block, &[3; 16], AT, 10, DATA, END).is_err());
        assert!(decode(&block, &[4; 16], AT, 9, DATA, END).is_err());
        assert!(decode(&block, &[3; 16], AT + 4096, 9, DATA, END).is_err());
        // A range past the end of the volume, or before the data area.
        assert!(decode(&block, &[3; 16], AT, 9, DATA, END - 1).is_err());
        assert!(decode(&block, &[3; 16], AT, 9, DATA + 8192, END).is_err());
        // An empty range.
        let empty = [Range {
            address: DATA,
            bytes: 0,
            checksum: 0,
        }];
        let block = seal(&empty, [3; 16], 9, AT, bytes);
        assert!(decode(&block, &[3; 16], AT, 9, DATA, END).is_err());
        // A flipped byte.
        let mut block = seal(&ranges, [3; 16], 9, AT, bytes);
        block[HEADER_BYTES + 3] ^= 1;
        assert!(decode(&block, &[3; 16], AT, 9, DATA, END).is_err());
    }
}
