//! The free-space map as of a commit: every free byte range of the data area.
//!
//! Each commit writes one, beside its nodes, and points the superblock at it, so mount reads
//! a few blocks instead of walking every node and extent of the tree. The map describes the
//! volume as a mount would find it: ranges still held for readers of older roots in memory
//! count as free, since after a restart no such reader exists.
//!
//! Payload: `count: u64`, then per range two LEB128 varints in bytes: the gap from the end
//! of the previous range (from `data_offset` for the first; at least one byte after the
//! first, since ranges are coalesced) and the length (at least one byte). Ranges are exact
//! bytes since format version 8, which packs small extents back to back (`space`). Maps of
//! older versions counted in whole blocks, and counted the rest of each extent's last block
//! as used: `decode` gives `None` for them, and mount maps such a volume by walking its
//! tree once. The block is a multiple of `BLOCK_BYTES`, sealed like every other block
//! (header, checksum, address).

use super::coding::Writer;
use super::HEADER_BYTES;
use super::{open_listing, seal_listing, BlockType, Expect, Listing, VolumeId};
use crate::error::{Error, Result};

/// The first format version whose maps count bytes, not blocks.
const BYTE_RANGES_SINCE: u16 = 8;

/// The encoded payload of `ranges` (sorted, disjoint, coalesced).
pub fn encode_payload(ranges: &[(u64, u64)], data_offset: u64) -> Vec<u8> {
    let mut w = Writer::with_capacity(8 + ranges.len() * 6);
    w.u64(ranges.len() as u64);
    let mut end = data_offset;
    for &(start, bytes) in ranges {
        debug_assert!(start >= end && bytes > 0);
        w.uvarint(start - end);
        w.uvarint(bytes);
        end = start + bytes;
    }
    w.bytes
}

/// Bytes of the block holding `payload_bytes` of payload, rounded up to whole blocks.
pub fn block_bytes_for(payload_bytes: usize) -> u64 {
    super::listing_block_bytes(payload_bytes)
}

/// Seals `payload` as the map block at `address`, `block_bytes` long.
pub fn seal(
    payload: &[u8],
    volume_id: VolumeId,
    tid: u64,
    address: u64,
    block_bytes: u64,
) -> Vec<u8> {
    seal_listing(
        BlockType::SpaceMap,
        payload,
        volume_id,
        tid,
        address,
        block_bytes,
    )
}

/// Decodes and validates a map block read from `address`: written for this volume at `tid`,
/// every range inside `[data_offset, volume_bytes)`, sorted and coalesced. `None` for a map
/// an older format version wrote in whole blocks (see the module comment).
pub fn decode(
    bytes: &[u8],
    volume_id: &VolumeId,
    address: u64,
    tid: u64,
    data_offset: u64,
    volume_bytes: u64,
) -> Result<Option<Vec<(u64, u64)>>> {
    let expect = Expect {
        block_type: BlockType::SpaceMap,
        volume_id: Some(volume_id),
        address,
    };
    // Every range takes at least two bytes.
    let Some(Listing {
        header,
        reader: mut r,
        count,
        location,
    }) = open_listing(bytes, &expect, tid, BYTE_RANGES_SINCE, 2, "space map")?
    else {
        return Ok(None);
    };
    let payload_bytes = header.payload_bytes as usize;
    let mut ranges = Vec::with_capacity(count);
    let mut end = data_offset;
    for index in 0..count {
        let gap = r.uvarint()?;
        let bytes = r.uvarint()?;
        let start = end.checked_add(gap);
        let range_end = start.and_then(|s| s.checked_add(bytes));
        match (start, range_end) {
            (Some(start), Some(range_end))
                if bytes > 0 && (gap > 0 || index == 0) && range_end <= volume_bytes =>
            {
                ranges.push((start, bytes));
                end = range_end;
            }
            _ => {
                return Err(Error::corrupt(
                    format!("range {index} out of order or outside the data area"),
                    location,
                ))
            }
        }
    }
    if r.remaining() != 0 {
        return Err(Error::corrupt("bytes after the last range", location));
    }
    // The block's length comes from the superblock, and the commit after this one frees
    // that many bytes at `address`: a length that reaches past the map's own blocks must
    // not be believed. The map counts its own blocks as used, and pads them with zeros.
    let padding = bytes
        .get(HEADER_BYTES + payload_bytes..)
        .unwrap_or_default();
    if padding.iter().any(|&b| b != 0) {
        return Err(Error::corrupt(
            "block longer than the map (its padding is not zeros)",
            location,
        ));
    }
    let block_end = address.saturating_add(bytes.len() as u64);
    if ranges
        .iter()
        .any(|&(s, l)| s < block_end && s + l > address)
    {
        return Err(Error::corrupt(
            "the map's own blocks are marked free",
            location,
        ));
    }
    Ok(Some(ranges))
}

#[cfg(test)]
mod tests {
    use super::super::coding::Reader;
    use super::super::{seal_block, BlockHeader};
    use super::*;

    const DATA: u64 = 1 << 20;
    const END: u64 = 64 << 20;

    fn round_trip(ranges: &[(u64, u64)]) -> Result<Vec<(u64, u64)>> {
        let payload = encode_payload(ranges, DATA);
        let bytes = block_bytes_for(payload.len());
        let block = seal(&payload, [3; 16], 9, DATA + 8192, bytes);
        decode(&block, &[3; 16], DATA + 8192, 9, DATA, END)
            .map(|ranges| ranges.expect("a map of this version counts bytes"))
    }

    #[test]
    fn round_trips() {
        let ranges = vec![
            (DATA, 4096),
            (DATA + 3 * 4096, 40960),
            (END - 4096 * 1000, 4096 * 1000),
        ];
        assert_eq!(round_trip(&ranges).unwrap(), ranges);
        assert_eq!(round_trip(&[]).unwrap(), vec![]);
    }

    #[test]
    fn packed_ranges_round_trip_to_the_byte() {
        let ranges = vec![(DATA + 5000, 3192), (DATA + 4096 * 7 + 1, 1)];
        assert_eq!(round_trip(&ranges).unwrap(), ranges);
    }

    #[test]
    fn a_map_in_blocks_is_left_to_the_tree_walk() {
        // Format version 7 counted blocks, and the rest of each extent's last block as used.
        let header = BlockHeader {
            version: BYTE_RANGES_SINCE - 1,
            block_type: BlockType::SpaceMap,
            volume_id: [3; 16],
            tid: 9,
            address: DATA + 8192,
            payload_bytes: 0,
        };
        let block = seal_block(&header, &encode_payload(&[(DATA, 1)], DATA), 4096);
        assert_eq!(
            decode(&block, &[3; 16], DATA + 8192, 9, DATA, END).unwrap(),
            None
        );
    }

    #[test]
    fn refuses_what_a_commit_never_writes() {
        // Ranges past the end of the volume.
        assert!(round_trip(&[(END - 4096, 8192)]).is_err());
        // A stale block: written at another TID, or for another volume, or elsewhere.
        let payload = encode_payload(&[(DATA, 4096)], DATA);
        let block = seal(&payload, [3; 16], 9, DATA + 8192, 4096);
        assert!(decode(&block, &[3; 16], DATA + 8192, 10, DATA, END).is_err());
        assert!(decode(&block, &[4; 16], DATA + 8192, 9, DATA, END).is_err());
        assert!(decode(&block, &[3; 16], DATA + 4096, 9, DATA, END).is_err());
        // Adjacent ranges that were not coalesced (gap 0 after the first).
        let mut w = Writer::with_capacity(32);
        w.u64(2);
        for v in [0, 1, 0, 1] {
            w.uvarint(v);
        }
        let block = seal(&w.bytes, [3; 16], 9, DATA + 8192, 4096);
        assert!(decode(&block, &[3; 16], DATA + 8192, 9, DATA, END).is_err());
        // A count larger than the payload could hold.
        let mut w = Writer::with_capacity(32);
        w.u64(u64::MAX);
        let block = seal(&w.bytes, [3; 16], 9, DATA + 8192, 4096);
        assert!(decode(&block, &[3; 16], DATA + 8192, 9, DATA, END).is_err());
    }

    #[test]
    fn refuses_a_length_past_the_maps_own_blocks() {
        // The map at DATA + 8192 says DATA + 12288.. is free; read with a damaged length of
        // three blocks, its "own" blocks would reach into that free space, and the next
        // commit would free space another allocation holds.
        let at = DATA + 8192;
        let payload = encode_payload(&[(DATA, 4096), (DATA + 12288, 8192)], DATA);
        let mut block = seal(&payload, [3; 16], 9, at, 4096);
        assert!(decode(&block, &[3; 16], at, 9, DATA, END).is_ok());
        block.resize(3 * 4096, 0);
        assert!(decode(&block, &[3; 16], at, 9, DATA, END).is_err());
        // Reaching into used blocks instead: they are not the map's padding.
        let payload = encode_payload(&[(DATA, 4096)], DATA);
        let mut block = seal(&payload, [3; 16], 9, at, 4096);
        block.resize(2 * 4096, 0x5a);
        assert!(decode(&block, &[3; 16], at, 9, DATA, END).is_err());
        // A block grown by an earlier commit, zeros to its end, is fine.
        block.truncate(4096);
        block.resize(2 * 4096, 0);
        assert!(decode(&block, &[3; 16], at, 9, DATA, END).is_ok());
    }

    #[test]
    fn varints_round_trip_and_refuse_overlong() {
        let mut w = Writer::with_capacity(64);
        for v in [0, 1, 127, 128, 300, u64::MAX] {
            w.uvarint(v);
        }
        let mut r = Reader::new(&w.bytes, "test");
        for v in [0, 1, 127, 128, 300, u64::MAX] {
            assert_eq!(r.uvarint().unwrap(), v);
        }
        let mut r = Reader::new(&[0xff; 11], "test");
        assert!(r.uvarint().is_err());
    }
}
