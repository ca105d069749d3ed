//! Redo log batches. An fsync appends one batch holding every pending change since the last
//! batch; recovery replays batches of the current epoch (the superblock's committed TID) in
//! sequence order and stops at the first invalid one. A batch occupies whole blocks.

use super::coding::{Reader, Writer};
use super::record::LogicalKey;
use super::{
    open_block, seal_block, BlockHeader, BlockType, Expect, VolumeId, BLOCK_BYTES, FORMAT_VERSION,
    HEADER_BYTES,
};
use crate::error::{Error, Result};

/// obj, rtype, key, replaces, value kind: the size of an entry that deletes.
const LOG_ENTRY_BYTES_MIN: usize = 8 + 1 + 8 + 8 + 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    pub lk: LogicalKey,
    /// create_tid of the committed version this change replaces; 0 when none.
    pub replaces: u64,
    /// New value; None deletes the record.
    pub value: Option<Vec<u8>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogBatch {
    /// The committed TID this batch applies on top of.
    pub epoch: u64,
    /// Position in the epoch, from 0.
    pub seq: u64,
    pub next_obj: u64,
    pub entries: Vec<LogEntry>,
}

impl LogBatch {
    /// Encodes to whole blocks, addressed at `address`.
    pub fn encode(&self, volume_id: VolumeId, address: u64) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.seq);
        w.u64(self.next_obj);
        w.u32(self.entries.len() as u32);
        for entry in &self.entries {
            w.u64(entry.lk.obj);
            w.u8(entry.lk.rtype);
            w.u64(entry.lk.key);
            w.u64(entry.replaces);
            match &entry.value {
                None => w.u8(0),
                Some(bytes) => {
                    w.u8(1);
                    w.u32(bytes.len() as u32);
                    w.raw(bytes);
                }
            }
        }
        let header = BlockHeader {
            version: FORMAT_VERSION,
            block_type: BlockType::Log,
            volume_id,
            tid: self.epoch,
            address,
            payload_bytes: w.len() as u32,
        };
        let total = ((HEADER_BYTES + w.len()) as u64).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        seal_block(&header, &w.bytes, total as usize)
    }

    /// Total bytes a batch with this header claims, bounded by `space_bytes`.
    pub fn claimed_bytes(first_block: &[u8], space_bytes: u64) -> Option<u64> {
        if first_block.len() < HEADER_BYTES {
            return None;
        }
        let payload = u32::from_le_bytes(first_block[40..44].try_into().ok()?) as u64;
        let total = (HEADER_BYTES as u64 + payload).div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        (total <= space_bytes).then_some(total)
    }

    pub fn decode(bytes: &[u8], volume_id: &VolumeId, address: u64) -> Result<LogBatch> {
        let expect = Expect {
            block_type: BlockType::Log,
            volume_id: Some(volume_id),
            address,
        };
        let (header, payload) = open_block(bytes, &expect)?;
        let mut r = Reader::new(payload, "log batch");
        let seq = r.u64()?;
        let next_obj = r.u64()?;
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
                0 => None,
                1 => {
                    let len = r.u32()? as usize;
                    Some(r.take(len)?.to_vec())
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
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let batch = LogBatch {
            epoch: 9,
            seq: 2,
            next_obj: 44,
            entries: vec![
                LogEntry {
                    lk: LogicalKey {
                        obj: 3,
                        rtype: 1,
                        key: 0,
                    },
                    replaces: 4,
                    value: None,
                },
                LogEntry {
                    lk: LogicalKey {
                        obj: 3,
                        rtype: 3,
                        key: 65536,
                    },
                    replaces: 0,
                    value: Some(vec![7; 10000]),
                },
            ],
        };
        let bytes = batch.encode([3; 16], 8192);
        assert_eq!(bytes.len() % BLOCK_BYTES as usize, 0);
        assert_eq!(
            LogBatch::claimed_bytes(&bytes, 1 << 20),
            Some(bytes.len() as u64)
        );
        assert_eq!(LogBatch::decode(&bytes, &[3; 16], 8192).unwrap(), batch);
    }
}
