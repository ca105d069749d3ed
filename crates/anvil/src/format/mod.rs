//! On-media structures. Every block starts with a `BlockHeader` carrying magic, format
//! version, block type, volume id, writing TID, its own address and a checksum; see
//! `docs/format.md` for the byte-by-byte layout.

pub mod coding;
pub mod leaf;
pub mod log;
pub mod manifest;
pub mod node;
pub mod record;
pub mod spacemap;
pub mod stream;
pub mod superblock;

use crate::checksum::{checksum, checksum_parts};
use crate::error::{Error, Result};
use coding::{Reader, SliceWriter, Writer};

/// The format version this build writes and the newest it reads.
pub const FORMAT_VERSION: u16 = 9;
/// Allocation unit of the volume.
pub const BLOCK_BYTES: u64 = 4096;
/// `BLOCK_BYTES` as a length in memory.
pub const BLOCK_LEN: usize = 4096;
const _: () = assert!(BLOCK_LEN as u64 == BLOCK_BYTES);
/// Size of every B-tree node.
pub const NODE_BYTES: usize = 16384;
/// Size of the header at the start of every block.
pub const HEADER_BYTES: usize = 64;
/// "ANVL" in little-endian.
pub const BLOCK_MAGIC: u32 = u32::from_le_bytes(*b"ANVL");
/// Byte offsets of the two superblock copies.
pub const SUPERBLOCK_OFFSETS: [u64; 2] = [0, BLOCK_BYTES];
/// The redo log region starts right after the superblocks.
pub const LOG_OFFSET: u64 = 2 * BLOCK_BYTES;
/// Smallest volume mkfs accepts.
pub const VOLUME_BYTES_MIN: u64 = 16 * 1024 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum BlockType {
    Superblock = 1,
    Leaf = 2,
    Internal = 3,
    Log = 4,
    SpaceMap = 5,
    Manifest = 6,
}

impl BlockType {
    fn from_u16(v: u16) -> Option<BlockType> {
        match v {
            1 => Some(BlockType::Superblock),
            2 => Some(BlockType::Leaf),
            3 => Some(BlockType::Internal),
            4 => Some(BlockType::Log),
            5 => Some(BlockType::SpaceMap),
            6 => Some(BlockType::Manifest),
            _ => None,
        }
    }
}

pub type VolumeId = [u8; 16];

/// The 64-byte header of every block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub version: u16,
    pub block_type: BlockType,
    pub volume_id: VolumeId,
    pub tid: u64,
    pub address: u64,
    pub payload_bytes: u32,
}

const CHECKSUM_AT: usize = 48;
const PAYLOAD_BYTES_AT: usize = 40;

/// Builds a block: header, then payload; the checksum covers both (checksum field as zero).
pub fn seal_block(header: &BlockHeader, payload: &[u8], block_bytes: usize) -> Vec<u8> {
    debug_assert!(HEADER_BYTES + payload.len() <= block_bytes);
    let mut out = Vec::with_capacity(block_bytes);
    append_block(&mut out, header, block_bytes, |w| w.raw(payload));
    out
}

/// Appends a block to `out`: header, the payload `write` produces, zeros up to a multiple
/// of `unit` bytes. The header's `payload_bytes` is what `write` wrote. Returns the bytes
/// appended.
pub fn append_block(
    out: &mut Vec<u8>,
    header: &BlockHeader,
    unit: usize,
    write: impl FnOnce(&mut Writer),
) -> usize {
    let start = out.len();
    let mut w = Writer {
        bytes: std::mem::take(out),
    };
    w.raw(&header_bytes(header));
    write(&mut w);
    let mut bytes = w.bytes;
    let payload = bytes.len() - start - HEADER_BYTES;
    seal_in_place(&mut bytes[start..], payload);
    let total = (HEADER_BYTES + payload).div_ceil(unit) * unit;
    bytes.resize(start + total, 0);
    *out = bytes;
    total
}

/// Writes a block of exactly `dst.len()` bytes into `dst` (which the caller sized as
/// header, payload and padding to its unit): header, the payload `write` produces, zeros to
/// the end. None, with `dst` in an unspecified state, if the payload did not fit.
pub fn write_block_into(
    dst: &mut [u8],
    header: &BlockHeader,
    write: impl FnOnce(&mut SliceWriter<'_>),
) -> Option<()> {
    let (head, body) = dst.split_at_mut_checked(HEADER_BYTES)?;
    head.copy_from_slice(&header_bytes(header));
    let mut w = SliceWriter::new(body);
    write(&mut w);
    if w.overflowed() {
        return None;
    }
    let payload = w.len();
    body[payload..].fill(0);
    seal_in_place(&mut dst[..HEADER_BYTES + payload], payload);
    Some(())
}

/// The header's 64 bytes with the payload length and checksum as zero (`seal_in_place`
/// fills them once the payload is written).
fn header_bytes(header: &BlockHeader) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    let mut w = SliceWriter::new(&mut out);
    w.u32(BLOCK_MAGIC);
    w.u16(header.version);
    w.u16(header.block_type as u16);
    w.raw(&header.volume_id);
    w.u64(header.tid);
    w.u64(header.address);
    // The payload length (at PAYLOAD_BYTES_AT), a reserved word, the checksum (at
    // CHECKSUM_AT) and reserved bytes stay zero here.
    debug_assert_eq!(w.len(), PAYLOAD_BYTES_AT);
    out
}

/// Fills in the payload length and the checksum of `block`: a header and `payload` bytes,
/// without padding (the checksum covers exactly those).
fn seal_in_place(block: &mut [u8], payload: usize) {
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a payload is a node or superblock (16 KiB at most), a log batch (8 MiB at \
                  most) or a space map (two bytes a free range)"
    )]
    let payload_bytes = payload as u32;
    block[PAYLOAD_BYTES_AT..PAYLOAD_BYTES_AT + 4].copy_from_slice(&payload_bytes.to_le_bytes());
    let sum = checksum(&block[..HEADER_BYTES + payload]);
    block[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
}

/// What a reader expects of a block it is about to trust.
pub struct Expect<'a> {
    pub block_type: BlockType,
    pub volume_id: Option<&'a VolumeId>,
    pub address: u64,
}

/// A block a commit writes beside its superblock that lists items (its space map, its
/// manifest), opened: its header, a reader of its payload past the count, the count, and
/// where it is, for errors.
pub(crate) struct Listing<'a> {
    pub header: BlockHeader,
    pub reader: Reader<'a>,
    pub count: usize,
    pub location: String,
}

/// Bytes of a listing block (`Listing`) holding `payload_bytes` of payload, in whole blocks.
pub(crate) fn listing_block_bytes(payload_bytes: usize) -> u64 {
    ((HEADER_BYTES + payload_bytes) as u64).div_ceil(BLOCK_BYTES) * BLOCK_BYTES
}

/// Seals `payload` as a listing block (`Listing`) of `block_type` for the commit at `tid`,
/// to be written at `address`, `block_bytes` long.
pub(crate) fn seal_listing(
    block_type: BlockType,
    payload: &[u8],
    volume_id: VolumeId,
    tid: u64,
    address: u64,
    block_bytes: u64,
) -> Vec<u8> {
    let header = BlockHeader {
        version: FORMAT_VERSION,
        block_type,
        volume_id,
        tid,
        address,
        payload_bytes: 0, // seal_block writes the payload's length
    };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a listing block is sized by its kind's block_bytes_for a payload in memory"
    )]
    let block_bytes = block_bytes as usize;
    debug_assert!(HEADER_BYTES + payload.len() <= block_bytes);
    seal_block(&header, payload, block_bytes)
}

/// Opens a listing block (`Listing`) that the commit at `tid` wrote: the checks of
/// `open_block`, then `None` for a block of a format version before `since` (which lists in
/// a way this build no longer reads), then the header's TID, then the count of items, each
/// at least `item_bytes_min` long (a count beyond what the payload holds is damage, not a
/// reason to reserve memory). `what` names the block in errors.
pub(crate) fn open_listing<'a>(
    bytes: &'a [u8],
    expect: &Expect<'_>,
    tid: u64,
    since: u16,
    item_bytes_min: usize,
    what: &'static str,
) -> Result<Option<Listing<'a>>> {
    let (header, payload) = open_block(bytes, expect)?;
    let location = format!("{what} at byte {}", expect.address);
    if header.version < since {
        return Ok(None);
    }
    if header.tid != tid {
        return Err(Error::corrupt(
            format!(
                "written at TID {:#x}, superblock is at {tid:#x}",
                header.tid
            ),
            location,
        ));
    }
    let mut reader = Reader::new(payload, what);
    let count = reader.u64()?;
    let Some(count) = usize::try_from(count)
        .ok()
        .filter(|&count| count <= reader.remaining() / item_bytes_min)
    else {
        return Err(Error::corrupt("item count exceeds the block", location));
    };
    Ok(Some(Listing {
        header,
        reader,
        count,
        location,
    }))
}

/// Validates a block read from media and returns its header and payload.
pub fn open_block<'a>(bytes: &'a [u8], expect: &Expect<'_>) -> Result<(BlockHeader, &'a [u8])> {
    let location = format!("block at byte {}", expect.address);
    let mut r = Reader::new(bytes, "block header");
    let magic = r.u32()?;
    if magic != BLOCK_MAGIC {
        return Err(Error::corrupt(format!("bad magic {magic:#010x}"), location));
    }
    let version = r.u16()?;
    let block_type_raw = r.u16()?;
    let mut volume_id = [0u8; 16];
    volume_id.copy_from_slice(r.take(16)?);
    let tid = r.u64()?;
    let address = r.u64()?;
    let payload_bytes = r.u32()?;
    let _reserved = r.u32()?;
    let stored_sum = r.u64()?;
    if HEADER_BYTES + payload_bytes as usize > bytes.len() {
        return Err(Error::corrupt(
            format!("payload length {payload_bytes} too large"),
            location,
        ));
    }
    // The checksum covers the block with its own field zeroed.
    let end = HEADER_BYTES + payload_bytes as usize;
    let parts = [
        &bytes[..CHECKSUM_AT],
        &[0u8; 8],
        &bytes[CHECKSUM_AT + 8..end],
    ];
    if checksum_parts(&parts) != stored_sum {
        return Err(Error::corrupt("checksum mismatch", location));
    }
    if version == 0 {
        return Err(Error::corrupt("format version 0", location));
    }
    if version > FORMAT_VERSION {
        return Err(Error::Version {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let Some(block_type) = BlockType::from_u16(block_type_raw) else {
        return Err(Error::corrupt(
            format!("unknown block type {block_type_raw}"),
            location,
        ));
    };
    if block_type != expect.block_type {
        return Err(Error::corrupt(
            format!(
                "expected {:?} block, found {block_type:?}",
                expect.block_type
            ),
            location,
        ));
    }
    if let Some(id) = expect.volume_id {
        if *id != volume_id {
            return Err(Error::corrupt("block belongs to another volume", location));
        }
    }
    if address != expect.address {
        return Err(Error::corrupt(
            format!("misdirected block (written for {address})"),
            location,
        ));
    }
    let header = BlockHeader {
        version,
        block_type,
        volume_id,
        tid,
        address,
        payload_bytes,
    };
    Ok((
        header,
        &bytes[HEADER_BYTES..HEADER_BYTES + payload_bytes as usize],
    ))
}
