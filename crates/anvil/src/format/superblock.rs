//! The superblock: the root of everything durable. Two copies at `SUPERBLOCK_OFFSETS`; commit
//! `seq` goes to copy `seq % 2`, so a torn superblock write leaves the previous one intact.

use super::coding::{Reader, Writer};
use super::log::LOG_UNIT_BYTES;
use super::{
    open_block, seal_block, BlockHeader, BlockType, Expect, VolumeId, BLOCK_BYTES, BLOCK_LEN,
    FORMAT_VERSION, HEADER_BYTES,
};
use crate::error::{Error, Result};

/// "anvilfs!" marks the superblock payload (beyond the generic block magic).
pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"anvilfs!");
pub const LABEL_BYTES: usize = 32;
/// Bound on the sequence number and the id counters (`validate`).
const COUNTER_MAX: u64 = 1 << 62;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub volume_id: VolumeId,
    /// Commit sequence number; increases by one per commit.
    pub seq: u64,
    pub volume_bytes: u64,
    /// Address of the B-tree root node, 0 for an empty tree.
    pub root_address: u64,
    pub root_level: u8,
    /// TID of the last commit: the newest readable point in history.
    pub committed_tid: u64,
    /// Next TID to hand out; never reused.
    pub next_tid: u64,
    /// Next object id to hand out; never reused.
    pub next_obj: u64,
    pub log_offset: u64,
    pub log_bytes: u64,
    pub commit_time_ns: u64,
    pub created_time_ns: u64,
    /// Bytes of the data area in use (nodes and extents), as of this commit.
    pub used_bytes: u64,
    /// Start of the allocatable data area.
    pub data_offset: u64,
    pub label: [u8; LABEL_BYTES],
    /// Where the free-space map as of this commit is (`format::spacemap`), 0 if none was
    /// written (volumes from before it existed): mount then walks the tree instead.
    pub space_map_address: u64,
    pub space_map_bytes: u64,
    /// Live inodes in the committed tree (meaningful only with a space map).
    pub live_objects: u64,
    /// Where in the redo log region this commit's epoch of batches begins (bytes from
    /// `log_offset`; 0 before format version 3).
    pub log_start: u64,
    /// The salt the writer that wrote this superblock gives its log batches (0 before
    /// format version 3: batches then carry none).
    pub log_salt: u64,
    /// Where the manifest of this commit's writes is (`format::manifest`), 0 if the commit
    /// wrote none: it made its tree durable before writing this superblock (format versions
    /// before 9, the writes of a device that orders them, commits too large to check at
    /// mount). With a manifest, mount trusts this superblock only once every range it lists
    /// holds what the commit wrote.
    pub manifest_address: u64,
    pub manifest_bytes: u64,
    /// `checksum` of the manifest's `manifest_bytes` as written.
    pub manifest_checksum: u64,
    /// Set on a superblock that repeats a commit already durable (written by a writer as it
    /// opens or closes the volume): mount need not read the commit's manifest.
    pub proven: bool,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(256);
        w.u64(SUPERBLOCK_MAGIC);
        w.u64(self.seq);
        w.u64(self.volume_bytes);
        w.u64(self.root_address);
        w.u8(self.root_level);
        w.u64(self.committed_tid);
        w.u64(self.next_tid);
        w.u64(self.next_obj);
        w.u64(self.log_offset);
        w.u64(self.log_bytes);
        w.u64(self.commit_time_ns);
        w.u64(self.created_time_ns);
        w.u64(self.used_bytes);
        w.u64(self.data_offset);
        w.raw(&self.label);
        w.u64(self.space_map_address);
        w.u64(self.space_map_bytes);
        w.u64(self.live_objects);
        w.u64(self.log_start);
        w.u64(self.log_salt);
        w.u64(self.manifest_address);
        w.u64(self.manifest_bytes);
        w.u64(self.manifest_checksum);
        w.u8(u8::from(self.proven));
        let header = BlockHeader {
            version: FORMAT_VERSION,
            block_type: BlockType::Superblock,
            volume_id: self.volume_id,
            tid: self.committed_tid,
            address: self.address(),
            payload_bytes: 0, // seal_block writes the payload's length
        };
        seal_block(&header, &w.bytes, BLOCK_LEN)
    }

    pub fn address(&self) -> u64 {
        super::SUPERBLOCK_OFFSETS[(self.seq % 2) as usize]
    }

    /// Decodes and validates one superblock copy read from `address`.
    pub fn decode(bytes: &[u8], address: u64) -> Result<Superblock> {
        let expect = Expect {
            block_type: BlockType::Superblock,
            volume_id: None,
            address,
        };
        let (header, payload) = open_block(bytes, &expect)?;
        let mut r = Reader::new(payload, "superblock");
        if r.u64()? != SUPERBLOCK_MAGIC {
            return Err(Error::corrupt(
                "superblock magic missing",
                format!("byte {address}"),
            ));
        }
        let mut sb = Superblock {
            volume_id: header.volume_id,
            seq: r.u64()?,
            volume_bytes: r.u64()?,
            root_address: r.u64()?,
            root_level: r.u8()?,
            committed_tid: r.u64()?,
            next_tid: r.u64()?,
            next_obj: r.u64()?,
            log_offset: r.u64()?,
            log_bytes: r.u64()?,
            commit_time_ns: r.u64()?,
            created_time_ns: r.u64()?,
            used_bytes: r.u64()?,
            data_offset: r.u64()?,
            label: [0; LABEL_BYTES],
            space_map_address: 0,
            space_map_bytes: 0,
            live_objects: 0,
            log_start: 0,
            log_salt: 0,
            manifest_address: 0,
            manifest_bytes: 0,
            manifest_checksum: 0,
            proven: false,
        };
        sb.label.copy_from_slice(r.take(LABEL_BYTES)?);
        // Superblocks written before the space map existed end here.
        if r.remaining() > 0 {
            sb.space_map_address = r.u64()?;
            sb.space_map_bytes = r.u64()?;
            sb.live_objects = r.u64()?;
        }
        // Superblocks written before the log became a ring end here.
        if r.remaining() > 0 {
            sb.log_start = r.u64()?;
            sb.log_salt = r.u64()?;
        }
        // Superblocks written before commits carried a manifest end here.
        if r.remaining() > 0 {
            sb.manifest_address = r.u64()?;
            sb.manifest_bytes = r.u64()?;
            sb.manifest_checksum = r.u64()?;
            sb.proven = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(Error::corrupt("proven flag neither 0 nor 1", "superblock")),
            };
        }
        sb.validate(address)?;
        Ok(sb)
    }

    /// Invariants every superblock satisfies; checked before writing and after reading.
    pub fn validate(&self, address: u64) -> Result<()> {
        let location = format!("superblock at byte {address}");
        let fail = |what: &str| Err(Error::corrupt(what.to_string(), location.clone()));
        if self.address() != address {
            return fail("sequence number does not match its slot");
        }
        if self.volume_bytes < super::VOLUME_BYTES_MIN || self.volume_bytes % BLOCK_BYTES != 0 {
            return fail("volume size out of range");
        }
        if self.log_offset != super::LOG_OFFSET || self.log_bytes % BLOCK_BYTES != 0 {
            return fail("log region out of range");
        }
        if self.log_start >= self.log_bytes || self.log_start % LOG_UNIT_BYTES != 0 {
            return fail("log start out of range");
        }
        if self.log_offset.checked_add(self.log_bytes) != Some(self.data_offset)
            || self.data_offset >= self.volume_bytes
        {
            return fail("data area out of range");
        }
        let root_ok = self.root_address == 0
            || (self.root_address >= self.data_offset
                && self.root_address % BLOCK_BYTES == 0
                && self
                    .root_address
                    .checked_add(super::NODE_BYTES as u64)
                    .is_some_and(|end| end <= self.volume_bytes));
        if !root_ok || self.root_level > 32 {
            return fail("root pointer out of range");
        }
        if self.next_tid <= self.committed_tid || self.next_obj < 2 {
            return fail("id counters out of order");
        }
        // No volume lives to 2^62 commits or objects: larger counters are damage, and would
        // overflow as they advance.
        if self.seq >= COUNTER_MAX || self.next_tid >= COUNTER_MAX || self.next_obj >= COUNTER_MAX {
            return fail("id counters out of range");
        }
        if self.used_bytes > self.volume_bytes {
            return fail("used bytes exceed volume size");
        }
        let map_end = self.space_map_address.checked_add(self.space_map_bytes);
        let map_ok = (self.space_map_address == 0 && self.space_map_bytes == 0)
            || (self.space_map_address >= self.data_offset
                && self.space_map_address % BLOCK_BYTES == 0
                && self.space_map_bytes > 0
                && self.space_map_bytes % BLOCK_BYTES == 0
                && map_end.is_some_and(|end| end <= self.volume_bytes));
        if !map_ok {
            return fail("space map pointer out of range");
        }
        let manifest_end = self.manifest_address.checked_add(self.manifest_bytes);
        let manifest_ok = (self.manifest_address == 0 && self.manifest_bytes == 0)
            || (self.manifest_address >= self.data_offset
                && self.manifest_address % BLOCK_BYTES == 0
                && self.manifest_bytes > 0
                && self.manifest_bytes % BLOCK_BYTES == 0
                && manifest_end.is_some_and(|end| end <= self.volume_bytes)
                && self.space_map_address != 0);
        if !manifest_ok {
            return fail("commit manifest pointer out of range");
        }
        Ok(())
    }
}

/// Bytes that hold the superblock payload; everything else in the block is zero.
pub const SUPERBLOCK_PAYLOAD_MAX: usize = BLOCK_LEN - HEADER_BYTES;

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            volume_id: [7; 16],
            seq: 3,
            volume_bytes: 64 << 20,
            root_address: 0,
            root_level: 0,
            committed_tid: 5,
            next_tid: 6,
            next_obj: 10,
            log_offset: super::super::LOG_OFFSET,
            log_bytes: 1 << 20,
            commit_time_ns: 1,
            created_time_ns: 1,
            used_bytes: 0,
            data_offset: super::super::LOG_OFFSET + (1 << 20),
            label: [0; LABEL_BYTES],
            space_map_address: super::super::LOG_OFFSET + (2 << 20),
            space_map_bytes: 8192,
            live_objects: 4,
            log_start: 4096,
            log_salt: 0xfeed,
            manifest_address: super::super::LOG_OFFSET + (3 << 20),
            manifest_bytes: 4096,
            manifest_checksum: 0xabcd,
            proven: true,
        }
    }

    /// `sample` as a superblock of format version 8 holds it: no manifest.
    fn without_manifest() -> Superblock {
        Superblock {
            manifest_address: 0,
            manifest_bytes: 0,
            manifest_checksum: 0,
            proven: false,
            ..sample()
        }
    }

    /// `sb` encoded as an older build of format `version` wrote it: its payload without
    /// the last `dropped` bytes (fields that build did not have).
    fn as_written_by_older(sb: &Superblock, dropped: usize, version: u16) -> Vec<u8> {
        let bytes = sb.encode();
        let (mut header, payload) = super::super::open_block(
            &bytes,
            &super::super::Expect {
                block_type: BlockType::Superblock,
                volume_id: None,
                address: sb.address(),
            },
        )
        .unwrap();
        let short = payload[..payload.len() - dropped].to_vec();
        header.payload_bytes = short.len() as u32;
        header.version = version;
        seal_block(&header, &short, BLOCK_BYTES as usize)
    }

    #[test]
    fn reads_superblocks_without_a_space_map() {
        let mut sb = without_manifest();
        sb.space_map_address = 0;
        sb.space_map_bytes = 0;
        sb.live_objects = 0;
        sb.log_start = 0;
        sb.log_salt = 0;
        // The payload ends after the label.
        let bytes = as_written_by_older(&sb, 65, 2);
        assert_eq!(Superblock::decode(&bytes, sb.address()).unwrap(), sb);
    }

    #[test]
    fn reads_superblocks_from_before_the_log_ring() {
        let mut sb = without_manifest();
        sb.log_start = 0;
        sb.log_salt = 0;
        let bytes = as_written_by_older(&sb, 41, 2);
        assert_eq!(Superblock::decode(&bytes, sb.address()).unwrap(), sb);
    }

    #[test]
    fn reads_superblocks_from_before_the_manifest() {
        let sb = without_manifest();
        let bytes = as_written_by_older(&sb, 25, 8);
        assert_eq!(Superblock::decode(&bytes, sb.address()).unwrap(), sb);
    }

    #[test]
    fn refuses_a_manifest_out_of_range() {
        for (address, bytes) in [(4096, 4096), (5 << 20, 100), (5 << 20, 0), (u64::MAX, 4096)] {
            let mut sb = sample();
            sb.manifest_address = address;
            sb.manifest_bytes = bytes;
            assert!(sb.validate(sb.address()).is_err(), "{address} {bytes}");
        }
        // A manifest without a space map (the map is one of the ranges it lists).
        let mut sb = sample();
        sb.space_map_address = 0;
        sb.space_map_bytes = 0;
        assert!(sb.validate(sb.address()).is_err());
    }

    #[test]
    fn refuses_pointers_whose_end_does_not_fit_a_u64() {
        // Found by fuzzing: `root_address + NODE_BYTES` overflowed before the bound check.
        let mut sb = sample();
        sb.root_address = u64::MAX - 4095;
        assert!(sb.validate(sb.address()).is_err());
        let mut sb = sample();
        sb.log_bytes = u64::MAX - 4095;
        assert!(sb.validate(sb.address()).is_err());
    }

    #[test]
    fn round_trips_and_detects_flips() {
        let sb = sample();
        let bytes = sb.encode();
        assert_eq!(Superblock::decode(&bytes, sb.address()).unwrap(), sb);
        for i in [0usize, 10, 70, 100] {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(
                Superblock::decode(&bad, sb.address()).is_err(),
                "flip at {i}"
            );
        }
    }
}
