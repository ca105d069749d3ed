//! Redo log batches. The log is a ring: every change is appended as part of a batch before
//! the operation that made it returns (through the host's page cache; fsync adds a flush),
//! and recovery replays, from the superblock's `log_start`, the batches of the superblock's
//! epoch (its committed TID) and salt in sequence order, then the batches of an epoch that
//! was being committed when the writer stopped, if that epoch's first batch says it follows
//! exactly the batches replayed. Replay stops at the first batch that does not fit.
//!
//! Format version 3 batches occupy whole 512-byte units and carry the salt and the link to
//! the epoch they follow; version 2 batches (whole 4096-byte blocks, no salt, no splices)
//! are still read, for volumes last written by an older build.

use super::coding::Reader;
use super::record::{ExtentRef, LogicalKey, EXTENT_REF_BYTES};
use super::{
    open_block, write_block_into, BlockHeader, BlockType, Expect, VolumeId, BLOCK_BYTES,
    FORMAT_VERSION, HEADER_BYTES,
};
use crate::error::{Error, Result};

/// obj, rtype, key, replaces, value kind: the size of an entry that deletes.
const LOG_ENTRY_BYTES_MIN: usize = 8 + 1 + 8 + 8 + 1;
/// Unit of a version-3 batch: a batch occupies a whole number of these, and starts at a
/// multiple of it. Small, so that a batch per operation costs about what it holds.
pub const LOG_UNIT_BYTES: u64 = 512;
/// `LOG_UNIT_BYTES` as a length in memory.
pub const LOG_UNIT_LEN: usize = 512;
const _: () = assert!(LOG_UNIT_LEN as u64 == LOG_UNIT_BYTES);
/// The first format version whose batches have the layout of this file.
const RING_VERSION: u16 = 3;
/// The first format version whose entries may name an extent written before its commit.
const DIRECT_VERSION: u16 = 5;

/// What an entry does to its record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogValue {
    /// The record is deleted.
    Delete,
    /// The record's whole new value.
    Put(Vec<u8>),
    /// The record's value, already set earlier in the same epoch, changes: it takes length
    /// `len` (cut, or grown with zeros) and `bytes` are written at `at`.
    Splice { len: u32, at: u32, bytes: Vec<u8> },
    /// The record's whole new value is this extent, written to the device (through the
    /// host's page cache) before the batch: only its address is logged (format version 5).
    Extent(ExtentRef),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub lk: LogicalKey,
    /// create_tid of the committed version this change replaces; 0 when none.
    pub replaces: u64,
    pub value: LogValue,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBatch {
    /// The committed TID this batch applies on top of.
    pub epoch: u64,
    /// Position in the epoch, from 0.
    pub seq: u64,
    pub next_obj: u64,
    /// Chosen at random each time a writer opens the volume and recorded in the superblock:
    /// batches a previous writer left in the ring never match it. 0 in version-2 batches.
    pub salt: u64,
    /// The epoch whose batches this epoch's batches continue (when it is being committed and
    /// its superblock is not yet written), and how many of them there are; 0, 0 if none.
    pub follows: u64,
    pub follows_count: u64,
    pub entries: Vec<LogEntry>,
}

/// A batch's fields besides its entries.
#[derive(Clone, Copy, Debug)]
pub struct BatchHead {
    pub epoch: u64,
    pub seq: u64,
    pub next_obj: u64,
    pub salt: u64,
    pub follows: u64,
    pub follows_count: u64,
}

/// An entry to encode, borrowing its bytes (`LogEntry` owns them).
#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a> {
    pub lk: LogicalKey,
    pub replaces: u64,
    pub value: ValueRef<'a>,
}

#[derive(Clone, Copy, Debug)]
pub enum ValueRef<'a> {
    Delete,
    Put(&'a [u8]),
    Splice { len: u32, at: u32, bytes: &'a [u8] },
    Extent(ExtentRef),
}

/// Fixed payload fields: seq, next_obj, salt, follows, follows_count, count.
const BATCH_FIELDS_BYTES: usize = 5 * 8 + 4;

impl ValueRef<'_> {
    fn encoded_bytes(&self) -> usize {
        match self {
            ValueRef::Delete => 0,
            ValueRef::Put(bytes) => 4 + bytes.len(),
            ValueRef::Splice { bytes, .. } => 12 + bytes.len(),
            ValueRef::Extent(_) => EXTENT_REF_BYTES,
        }
    }
}

/// Bytes a batch of `entries` occupies (header, payload, padding to whole units).
pub fn batch_bytes(entries: &[EntryRef<'_>]) -> u64 {
    let payload: usize = BATCH_FIELDS_BYTES
        + entries
            .iter()
            .map(|e| LOG_ENTRY_BYTES_MIN + e.value.encoded_bytes())
            .sum::<usize>();
    units(HEADER_BYTES + payload, FORMAT_VERSION)
}

/// Encodes the batch, addressed at `address`, into `dst`, which must be exactly
/// `batch_bytes(entries)` long (no intermediate copy of the values: a batch is written
/// straight into its place in the crash log's map). None if it is not.
pub fn encode_batch_into(
    dst: &mut [u8],
    volume_id: VolumeId,
    address: u64,
    head: &BatchHead,
    entries: &[EntryRef<'_>],
) -> Option<()> {
    if dst.len() as u64 != batch_bytes(entries) {
        return None;
    }
    let header = BlockHeader {
        version: FORMAT_VERSION,
        block_type: BlockType::Log,
        volume_id,
        tid: head.epoch,
        address,
        payload_bytes: 0,
    };
    write_block_into(dst, &header, |w| {
        w.u64(head.seq);
        w.u64(head.next_obj);
        w.u64(head.salt);
        w.u64(head.follows);
        w.u64(head.follows_count);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "a batch is at most LOG_BATCH_BYTES_MAX (8 MiB) and every entry takes bytes"
        )]
        w.u32(entries.len() as u32);
        for entry in entries {
            w.u64(entry.lk.obj);
            w.u8(entry.lk.rtype);
            w.u64(entry.lk.key);
            w.u64(entry.replaces);
            match entry.value {
                ValueRef::Delete => w.u8(0),
                ValueRef::Put(bytes) => {
                    w.u8(1);
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "a value is one record's payload, at most a 64 KiB chunk"
                    )]
                    w.u32(bytes.len() as u32);
                    w.raw(bytes);
                }
                ValueRef::Splice { len, at, bytes } => {
                    w.u8(2);
                    w.u32(len);
                    w.u32(at);
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "a splice is part of a value of len bytes, itself a u32"
                    )]
                    w.u32(bytes.len() as u32);
                    w.raw(bytes);
                }
                ValueRef::Extent(extent) => {
                    w.u8(3);
                    w.raw(&extent.to_bytes());
                }
            }
        }
    })
}

impl LogEntry {
    pub fn as_ref(&self) -> EntryRef<'_> {
        EntryRef {
            lk: self.lk,
            replaces: self.replaces,
            value: match &self.value {
                LogValue::Delete => ValueRef::Delete,
                LogValue::Put(bytes) => ValueRef::Put(bytes),
                LogValue::Splice { len, at, bytes } => ValueRef::Splice {
                    len: *len,
                    at: *at,
                    bytes,
                },
                LogValue::Extent(extent) => ValueRef::Extent(*extent),
            },
        }
    }
}

impl LogBatch {
    /// Encodes to whole log units, addressed at `address`.
    pub fn encode(&self, volume_id: VolumeId, address: u64) -> Vec<u8> {
        let head = BatchHead {
            epoch: self.epoch,
            seq: self.seq,
            next_obj: self.next_obj,
            salt: self.salt,
            follows: self.follows,
            follows_count: self.follows_count,
        };
        let entries: Vec<EntryRef<'_>> = self.entries.iter().map(LogEntry::as_ref).collect();
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the entries are in memory, so their encoding is a usize plus a header"
        )]
        let mut out = vec![0u8; batch_bytes(&entries) as usize];
        let encoded = encode_batch_into(&mut out, volume_id, address, &head, &entries);
        debug_assert!(encoded.is_some(), "batch_bytes sized the batch");
        out
    }

    /// Total bytes a batch with this header claims, bounded by `space_bytes`.
    pub fn claimed_bytes(first_unit: &[u8], space_bytes: u64) -> Option<u64> {
        if first_unit.len() < HEADER_BYTES {
            return None;
        }
        let version = u16::from_le_bytes(first_unit[4..6].try_into().ok()?);
        let payload = u32::from_le_bytes(first_unit[40..44].try_into().ok()?) as usize;
        let total = units(HEADER_BYTES + payload, version);
        (total <= space_bytes).then_some(total)
    }

    pub fn decode(bytes: &[u8], volume_id: &VolumeId, address: u64) -> Result<LogBatch> {
        let expect = Expect {
            block_type: BlockType::Log,
            volume_id: Some(volume_id),
            address,
        };
        let (header, payload) = open_block(bytes, &expect)?;
        let ring = header.version >= RING_VERSION;
        let mut r = Reader::new(payload, "log batch");
        let seq = r.u64()?;
        let next_obj = r.u64()?;
        let (salt, follows, follows_count) = if ring {
            (r.u64()?, r.u64()?, r.u64()?)
        } else {
            (0, 0, 0)
        };
        let count = r.u32()? as usize;
        // Every entry takes at least LOG_ENTRY_BYTES_MIN bytes.
        if count > r.remaining() / LOG_ENTRY_BYTES_MIN {
            return Err(Error::corrupt(
                "log entry count out of range",
                format!("byte {address}"),
            ));
        }
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let lk = LogicalKey {
                obj: r.u64()?,
                rtype: r.u8()?,
                key: r.u64()?,
            };
            let replaces = r.u64()?;
            let value = match r.u8()? {
                0 => LogValue::Delete,
                1 => {
                    let len = r.u32()? as usize;
                    LogValue::Put(r.take(len)?.to_vec())
                }
                2 if ring => {
                    let len = r.u32()?;
                    let at = r.u32()?;
                    let count = r.u32()? as usize;
                    LogValue::Splice {
                        len,
                        at,
                        bytes: r.take(count)?.to_vec(),
                    }
                }
                3 if header.version >= DIRECT_VERSION => {
                    LogValue::Extent(ExtentRef::decode(&mut r)?)
                }
                other => {
                    return Err(Error::corrupt(
                        format!("log value kind {other}"),
                        format!("byte {address}"),
                    ))
                }
            };
            entries.push(LogEntry {
                lk,
                replaces,
                value,
            });
        }
        Ok(LogBatch {
            epoch: header.tid,
            seq,
            next_obj,
            salt,
            follows,
            follows_count,
            entries,
        })
    }
}

/// Bytes a batch of `bytes` header and payload occupies: whole 512-byte units from format
/// version 3, whole blocks before.
fn units(bytes: usize, version: u16) -> u64 {
    let unit = if version >= RING_VERSION {
        LOG_UNIT_BYTES
    } else {
        BLOCK_BYTES
    };
    (bytes as u64).div_ceil(unit) * unit
}

#[cfg(test)]
mod tests {
    use super::super::coding::Writer;
    use super::super::seal_block;
    use super::*;

    #[test]
    fn round_trip() {
        let batch = LogBatch {
            epoch: 9,
            seq: 2,
            next_obj: 44,
            salt: 0x1234_5678_9abc,
            follows: 8,
            follows_count: 3,
            entries: vec![
                LogEntry {
                    lk: LogicalKey {
                        obj: 3,
                        rtype: 1,
                        key: 0,
                    },
                    replaces: 4,
                    value: LogValue::Delete,
                },
                LogEntry {
                    lk: LogicalKey {
                        obj: 3,
                        rtype: 3,
                        key: 65536,
                    },
                    replaces: 0,
                    value: LogValue::Put(vec![7; 10000]),
                },
                LogEntry {
                    lk: LogicalKey {
                        obj: 3,
                        rtype: 3,
                        key: 65536,
                    },
                    replaces: 0,
                    value: LogValue::Splice {
                        len: 12288,
                        at: 8192,
                        bytes: vec![9; 4096],
                    },
                },
                LogEntry {
                    lk: LogicalKey {
                        obj: 3,
                        rtype: 3,
                        key: 131072,
                    },
                    replaces: 7,
                    value: LogValue::Extent(ExtentRef {
                        offset: 1 << 40,
                        stored_bytes: 40000,
                        logical_bytes: 65536,
                        checksum: 0xfeed_f00d_1234_5678,
                        compression: 2,
                        set: super::super::record::LocalitySet::NONE,
                    }),
                },
            ],
        };
        let bytes = batch.encode([3; 16], 8192);
        assert_eq!(bytes.len() % LOG_UNIT_BYTES as usize, 0);
        assert_eq!(
            LogBatch::claimed_bytes(&bytes, 1 << 20),
            Some(bytes.len() as u64)
        );
        assert_eq!(LogBatch::decode(&bytes, &[3; 16], 8192).unwrap(), batch);
    }

    #[test]
    fn reads_version_2_batches() {
        // As format version 2 wrote them: seq, next_obj, count, entries; whole blocks.
        let mut w = Writer::default();
        w.u64(4);
        w.u64(77);
        w.u32(1);
        w.u64(3);
        w.u8(1);
        w.u64(0);
        w.u64(5);
        w.u8(1);
        w.u32(3);
        w.raw(b"abc");
        let header = BlockHeader {
            version: 2,
            block_type: BlockType::Log,
            volume_id: [3; 16],
            tid: 9,
            address: 8192,
            payload_bytes: w.len() as u32,
        };
        let bytes = seal_block(&header, &w.bytes, BLOCK_BYTES as usize);
        assert_eq!(LogBatch::claimed_bytes(&bytes, 1 << 20), Some(BLOCK_BYTES));
        let batch = LogBatch::decode(&bytes, &[3; 16], 8192).unwrap();
        assert_eq!(
            batch,
            LogBatch {
                epoch: 9,
                seq: 4,
                next_obj: 77,
                salt: 0,
                follows: 0,
                follows_count: 0,
                entries: vec![LogEntry {
                    lk: LogicalKey {
                        obj: 3,
                        rtype: 1,
                        key: 0,
                    },
                    replaces: 5,
                    value: LogValue::Put(b"abc".to_vec()),
                }],
            }
        );
        // Splices did not exist in version 2.
        let mut spliced = w.bytes.clone();
        spliced[20 + 25] = 2;
        let bytes = seal_block(&header, &spliced, BLOCK_BYTES as usize);
        assert!(LogBatch::decode(&bytes, &[3; 16], 8192).is_err());
    }

    #[test]
    fn small_batches_take_one_unit() {
        let batch = LogBatch {
            epoch: 9,
            seq: 0,
            next_obj: 44,
            salt: 1,
            follows: 0,
            follows_count: 0,
            entries: vec![LogEntry {
                lk: LogicalKey {
                    obj: 3,
                    rtype: 1,
                    key: 0,
                },
                replaces: 0,
                value: LogValue::Put(vec![1; 200]),
            }],
        };
        assert_eq!(batch.encode([3; 16], 8192).len(), LOG_UNIT_BYTES as usize);
    }
}
