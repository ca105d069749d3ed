//! How a segment object holds its bytes (format.md, section 16).
//!
//! A segment's *logical* bytes are its header followed by the bodies of its ranges (a
//! version-1 object, `ANVLSEG1`, is exactly that). A version-2 object (`ANVLSEG2`) stores
//! them in pieces of `PIECE_BYTES`, each packed with LZ4 when that saves an eighth or more,
//! after a table that says where each piece is stored, how long it is, whether it is packed,
//! and the CRC32C of its stored bytes. A piece is fetched and unpacked alone, so ranged reads
//! still fetch only what they need; the caches (memory and `cache_dir=`) hold logical pieces.
//!
//! Why: what the engine writes packs well even when file data does not (nodes carry free
//! space, extents are padded to whole blocks). blogbench's writes, 158 MB, packed to 11 MB;
//! every byte not sent is a byte the store does not checksum, replicate and write three
//! times, on hosts that may be the ones running the workload.

use super::{in_memory, invalid, le_u32, le_u64, PIECE_BYTES};
use std::io;

pub(super) const PACKED_MAGIC: &[u8; 8] = b"ANVLSEG2";
/// Table: magic, seq, epoch, logical bytes, piece count, then per piece its stored length
/// (top bit: packed) and CRC32C, then the table's own CRC32C.
const TABLE_FIXED: u64 = 8 + 8 + 8 + 8 + 4 + 4;
const PACKED_BIT: u32 = 1 << 31;

/// Where one logical piece is stored.
#[derive(Clone, Copy, Debug)]
pub(super) struct StoredPiece {
    pub at: u64,
    pub len: u32,
    pub packed: bool,
    pub crc: u32,
}

/// A version-2 segment's table.
#[derive(Debug)]
pub(super) struct Packing {
    pub seq: u64,
    pub epoch: u64,
    pub logical: u64,
    pub pieces: Vec<StoredPiece>,
}

/// How many bytes of the object the table takes, once its first 36 bytes are known.
pub(super) fn table_len(prefix: &[u8]) -> Option<u64> {
    let count = le_u32(prefix.get(32..36)?);
    Some(TABLE_FIXED + 8 * u64::from(count))
}

/// The object for logical bytes `logical` of segment `(seq, epoch)`, and its table.
pub(super) fn pack(seq: u64, epoch: u64, logical: &[u8]) -> io::Result<(Vec<u8>, Packing)> {
    let chunks: Vec<&[u8]> = logical.chunks(in_memory(PIECE_BYTES)).collect();
    let count = u32::try_from(chunks.len())
        .map_err(|_| io::Error::other("a segment of too many pieces"))?;
    // Each piece packed, or None where packing saves less than an eighth (stored as is).
    let packed: Vec<Option<Vec<u8>>> = chunks
        .iter()
        .map(|chunk| {
            let packed = lz4_flex::block::compress(chunk);
            (packed.len() + chunk.len() / 8 <= chunk.len()).then_some(packed)
        })
        .collect();
    let bodies: Vec<(&[u8], bool)> = chunks
        .iter()
        .zip(&packed)
        .map(|(chunk, packed)| match packed {
            Some(packed) => (packed.as_slice(), true),
            None => (*chunk, false),
        })
        .collect();
    let table = in_memory(TABLE_FIXED) + 8 * chunks.len();
    let total = table + bodies.iter().map(|(b, _)| b.len()).sum::<usize>();
    let mut out = Vec::with_capacity(total);
    let mut pieces = Vec::with_capacity(bodies.len());
    let mut at = table as u64;
    out.extend_from_slice(PACKED_MAGIC);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&epoch.to_le_bytes());
    out.extend_from_slice(&(logical.len() as u64).to_le_bytes());
    out.extend_from_slice(&count.to_le_bytes());
    for (body, packed) in &bodies {
        // A piece is at most PIECE_BYTES (and LZ4 expands that by under 1%): far below 2^31.
        let len = u32::try_from(body.len()).unwrap_or(u32::MAX) & !PACKED_BIT;
        let flag = if *packed { PACKED_BIT } else { 0 };
        let crc = crc32c::crc32c(body);
        out.extend_from_slice(&(len | flag).to_le_bytes());
        out.extend_from_slice(&crc.to_le_bytes());
        pieces.push(StoredPiece {
            at,
            len,
            packed: *packed,
            crc,
        });
        at += u64::from(len);
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    for (body, _) in &bodies {
        out.extend_from_slice(body);
    }
    let packing = Packing {
        seq,
        epoch,
        logical: logical.len() as u64,
        pieces,
    };
    Ok((out, packing))
}

/// Reads the table at the start of object `key` (`prefix`, at least `table_len` bytes)
/// of `stored` bytes.
pub(super) fn decode_table(prefix: &[u8], key: &str, stored: u64) -> io::Result<Packing> {
    let bad = |what: &str| invalid(format!("segment {key} is damaged ({what})"));
    if prefix.len() < 36 || &prefix[..8] != PACKED_MAGIC {
        return Err(bad("no segment magic"));
    }
    let len = in_memory(table_len(prefix).ok_or_else(|| bad("table truncated"))?);
    if prefix.len() < len {
        return Err(bad("table truncated"));
    }
    if crc32c::crc32c(&prefix[..len - 4]) != le_u32(&prefix[len - 4..]) {
        return Err(bad("table checksum"));
    }
    let (seq, epoch, logical) = (
        le_u64(&prefix[8..]),
        le_u64(&prefix[16..]),
        le_u64(&prefix[24..]),
    );
    let count = le_u32(&prefix[32..]) as usize;
    if logical.div_ceil(PIECE_BYTES) != count as u64 {
        return Err(bad("table does not match its length"));
    }
    let mut at = len as u64;
    let mut pieces = Vec::with_capacity(count);
    for i in 0..count {
        let word = le_u32(&prefix[36 + 8 * i..]);
        let piece = StoredPiece {
            at,
            len: word & !PACKED_BIT,
            packed: word & PACKED_BIT != 0,
            crc: le_u32(&prefix[40 + 8 * i..]),
        };
        at += u64::from(piece.len);
        pieces.push(piece);
    }
    if at != stored {
        return Err(bad(&format!(
            "{stored} bytes where the table describes {at}"
        )));
    }
    Ok(Packing {
        seq,
        epoch,
        logical,
        pieces,
    })
}

impl Packing {
    /// The logical length of piece `ix`.
    pub fn piece_len(&self, ix: usize) -> usize {
        let from = ix as u64 * PIECE_BYTES;
        in_memory(PIECE_BYTES.min(self.logical.saturating_sub(from)))
    }

    /// The object's bytes `[at, at + len)` that hold pieces `first..=last`.
    pub fn span(&self, first: usize, last: usize) -> (u64, usize) {
        let start = self.pieces[first].at;
        let end = self.pieces[last].at + u64::from(self.pieces[last].len);
        (start, in_memory(end - start))
    }

    /// Piece `ix`'s logical bytes from its stored bytes, checked.
    pub fn unpack(&self, ix: usize, stored: &[u8], key: &str) -> io::Result<Vec<u8>> {
        let bad = |what: &str| invalid(format!("segment {key} is damaged ({what} of piece {ix})"));
        let piece = &self.pieces[ix];
        if stored.len() != piece.len as usize || crc32c::crc32c(stored) != piece.crc {
            return Err(bad("checksum"));
        }
        let want = self.piece_len(ix);
        let bytes = match piece.packed {
            true => lz4_flex::block::decompress(stored, want).map_err(|_| bad("packing"))?,
            false => stored.to_vec(),
        };
        if bytes.len() != want {
            return Err(bad("length"));
        }
        Ok(bytes)
    }

    /// Logical bytes of pieces `first..=last`, unpacked from `stored` (the object's bytes
    /// from `self.span(first, last).0`).
    pub fn unpack_span(
        &self,
        first: usize,
        last: usize,
        stored: &[u8],
        key: &str,
    ) -> io::Result<Vec<u8>> {
        let base = self.pieces[first].at;
        let mut out = Vec::new();
        for ix in first..=last {
            let piece = &self.pieces[ix];
            let from = in_memory(piece.at - base);
            let body = stored
                .get(from..from + piece.len as usize)
                .ok_or_else(|| invalid(format!("segment {key} is damaged (short read)")))?;
            out.extend_from_slice(&self.unpack(ix, body, key)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_round_trip_packed_or_plain() {
        // Three pieces and a tail: zeros (pack), noise (stays plain), text (packs).
        let mut logical = vec![0u8; in_memory(PIECE_BYTES)];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        logical.extend((0..PIECE_BYTES).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        }));
        logical.extend(b"anvil ".iter().cycle().take(in_memory(PIECE_BYTES) + 1000));
        let (object, packed) = pack(7, 3, &logical).unwrap();
        assert!(object.len() < logical.len() / 2 + 4096);
        let table = decode_table(&object, "seg/x", object.len() as u64).unwrap();
        assert_eq!(
            (table.seq, table.epoch, table.logical),
            (7, 3, logical.len() as u64)
        );
        let flags: Vec<bool> = table.pieces.iter().map(|p| p.packed).collect();
        let same: Vec<(u64, u32, u32)> =
            packed.pieces.iter().map(|p| (p.at, p.len, p.crc)).collect();
        let read: Vec<(u64, u32, u32)> =
            table.pieces.iter().map(|p| (p.at, p.len, p.crc)).collect();
        assert_eq!(same, read);
        assert_eq!(flags, [true, false, true, true]);
        let (at, len) = table.span(0, 3);
        let whole = table
            .unpack_span(0, 3, &object[in_memory(at)..in_memory(at) + len], "seg/x")
            .unwrap();
        assert_eq!(whole, logical);
        let (at, len) = table.span(1, 1);
        let one = table
            .unpack(1, &object[in_memory(at)..in_memory(at) + len], "seg/x")
            .unwrap();
        assert_eq!(
            one,
            &logical[in_memory(PIECE_BYTES)..in_memory(2 * PIECE_BYTES)]
        );
    }

    #[test]
    fn damage_is_named() {
        let logical = vec![5u8; 300_000];
        let (object, _) = pack(1, 1, &logical).unwrap();
        let short = decode_table(&object, "seg/x", object.len() as u64 + 1).unwrap_err();
        assert!(short.to_string().contains("is damaged"), "{short}");
        let mut flipped = object.clone();
        flipped[12] ^= 1;
        let table = decode_table(&flipped, "seg/x", object.len() as u64).unwrap_err();
        assert!(table.to_string().contains("table checksum"), "{table}");
        let table = decode_table(&object, "seg/x", object.len() as u64).unwrap();
        let (at, len) = table.span(0, 0);
        let mut body = object[in_memory(at)..in_memory(at) + len].to_vec();
        body[len / 2] ^= 0x40;
        let err = table.unpack(0, &body, "seg/x").unwrap_err();
        assert!(err.to_string().contains("checksum of piece 0"), "{err}");
    }
}
