//! B-tree keys, elements and the records they carry.
//!
//! Key order: (obj, rtype, key, create_tid). An element is visible as of TID t iff
//! `create_tid <= t && (delete_tid == 0 || t < delete_tid)`.

use super::coding::{Reader, Writer};
use crate::error::{Error, Result};

/// Record types. Part of the format.
pub mod rtype {
    /// Inode attributes; key 0.
    pub const INODE: u8 = 1;
    /// Directory entry; key = name hash slot.
    pub const DIRENT: u8 = 2;
    /// File data; key = end offset of the chunk slot.
    pub const DATA: u8 = 3;
    /// Symlink target; key 0.
    pub const SYMLINK: u8 = 4;
    /// Extended attribute; key = name hash slot.
    pub const XATTR: u8 = 5;
    /// Snapshot (volume object); key = TID.
    pub const SNAPSHOT: u8 = 6;
    /// Configuration (volume object).
    pub const CONFIG: u8 = 7;
    /// Object unlinked while open (volume object); key = obj id. Destroyed at next mount.
    pub const ORPHAN: u8 = 8;
    /// Commit time (volume object); key = TID, payload = unix time in ns.
    pub const COMMIT: u8 = 9;
    /// Pages of a DATA chunk written after it (format version 2 on); key = chunk index << 16
    /// | page bitmap, payload = those pages back to back (see `patch`).
    pub const PATCH: u8 = 10;
}

/// Object id of volume-wide records.
pub const VOLUME_OBJ: u64 = 0;
/// Object id of the root directory (also its FUSE inode number).
pub const ROOT_OBJ: u64 = 1;

/// (obj, rtype, key): what an element is about, independent of version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogicalKey {
    pub obj: u64,
    pub rtype: u8,
    pub key: u64,
}

/// The full B-tree key: a logical key plus the TID that created this version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub obj: u64,
    pub rtype: u8,
    pub key: u64,
    pub create_tid: u64,
}

impl Key {
    pub const MIN: Key = Key {
        obj: 0,
        rtype: 0,
        key: 0,
        create_tid: 0,
    };
    pub const ENCODED_BYTES: usize = 25;

    pub fn new(lk: LogicalKey, create_tid: u64) -> Key {
        Key {
            obj: lk.obj,
            rtype: lk.rtype,
            key: lk.key,
            create_tid,
        }
    }
    pub fn logical(&self) -> LogicalKey {
        LogicalKey {
            obj: self.obj,
            rtype: self.rtype,
            key: self.key,
        }
    }
    pub fn encode(&self, w: &mut Writer) {
        w.u64(self.obj);
        w.u8(self.rtype);
        w.u64(self.key);
        w.u64(self.create_tid);
    }
    pub fn decode(r: &mut Reader<'_>) -> Result<Key> {
        Ok(Key {
            obj: r.u64()?,
            rtype: r.u8()?,
            key: r.u64()?,
            create_tid: r.u64()?,
        })
    }
}

/// Compression of an extent's stored bytes (its codec).
pub mod compression {
    pub const NONE: u8 = 0;
    pub const LZ4: u8 = 1;
    /// Zstandard frames (format version 2 on).
    pub const ZSTD: u8 = 2;
    /// The codec of new data where no directory chooses one.
    pub const DEFAULT: u8 = LZ4;

    pub fn name(codec: u8) -> &'static str {
        match codec {
            NONE => "none",
            LZ4 => "lz4",
            ZSTD => "zstd",
            _ => "unknown",
        }
    }

    pub fn parse(name: &str) -> Option<u8> {
        match name {
            "none" | "off" => Some(NONE),
            "lz4" => Some(LZ4),
            "zstd" => Some(ZSTD),
            _ => None,
        }
    }
}

/// The locality set an extent was written in: the blocks around it that a commit filled
/// with files named together (`Volume::set_locality`), read whole when any member is
/// read so that its mates come in the same request (format.md section 5). Advisory: each
/// member keeps its own checksum, is freed on its own, and a set whose other blocks were
/// reused only costs the bytes read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LocalitySet {
    /// Blocks of the set before the extent's first block (the block holding its first
    /// byte: since format version 8 a set's members are packed back to back, and one may
    /// begin inside a block).
    pub before_blocks: u32,
    /// Blocks of the whole set; 0: the extent is in no set.
    pub blocks: u32,
}

impl LocalitySet {
    pub const NONE: LocalitySet = LocalitySet {
        before_blocks: 0,
        blocks: 0,
    };
    /// Longest set (the cluster window of `Volume::write_extents`, with room to grow).
    pub const BLOCKS_MAX: u32 = 64;

    pub fn is_none(&self) -> bool {
        self.blocks == 0
    }
}

/// Where an extent's bytes live on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExtentRef {
    /// Byte offset on the device. Block aligned before format version 8; since then small
    /// extents written together are packed back to back (`space`).
    pub offset: u64,
    /// Bytes stored on the device (after compression).
    pub stored_bytes: u32,
    /// Bytes after decompression.
    pub logical_bytes: u32,
    /// Checksum of the stored bytes.
    pub checksum: u64,
    pub compression: u8,
    /// The locality set the extent lies in (kept in packed leaves only; the fixed form
    /// below, used by the redo log and the mirror stream, carries none).
    pub set: LocalitySet,
}

/// Bytes of an encoded `ExtentRef` (in a leaf's element and in a redo log entry).
pub const EXTENT_REF_BYTES: usize = 8 + 4 + 4 + 8 + 1;

impl ExtentRef {
    /// Bytes of the device this extent owns: its stored bytes, no more. The rest of its
    /// last block is free space that `space` hands out only with the whole block, once
    /// every extent in it is gone.
    pub fn allocated_bytes(&self) -> u64 {
        u64::from(self.stored_bytes)
    }

    /// The whole blocks the extent's bytes touch: their first byte and their length (what
    /// a device read of the extent alone reads).
    pub fn block_span(&self) -> (u64, u64) {
        let block = super::BLOCK_BYTES;
        let start = self.offset / block * block;
        let end = self
            .offset
            .saturating_add(self.allocated_bytes())
            .div_ceil(block)
            * block;
        (start, end - start)
    }

    /// The device range `[start, start + len)` of the extent's locality set, if it is in
    /// one whose bounds are consistent with the extent.
    pub fn set_span(&self) -> Option<(u64, u64)> {
        let set = self.set;
        let block = super::BLOCK_BYTES;
        let before = u64::from(set.before_blocks) * block;
        let len = u64::from(set.blocks) * block;
        let start = (self.offset / block * block).checked_sub(before)?;
        (!set.is_none()
            && set.blocks <= LocalitySet::BLOCKS_MAX
            && self.offset - start + self.allocated_bytes() <= len)
            .then_some((start, len))
    }

    /// offset, stored_bytes, logical_bytes, checksum, compression; little endian.
    pub fn to_bytes(&self) -> [u8; EXTENT_REF_BYTES] {
        let mut out = [0u8; EXTENT_REF_BYTES];
        out[0..8].copy_from_slice(&self.offset.to_le_bytes());
        out[8..12].copy_from_slice(&self.stored_bytes.to_le_bytes());
        out[12..16].copy_from_slice(&self.logical_bytes.to_le_bytes());
        out[16..24].copy_from_slice(&self.checksum.to_le_bytes());
        out[24] = self.compression;
        out
    }

    /// Reads what `to_bytes` wrote.
    pub fn decode(r: &mut Reader<'_>) -> Result<ExtentRef> {
        Ok(ExtentRef {
            offset: r.u64()?,
            stored_bytes: r.u32()?,
            logical_bytes: r.u32()?,
            checksum: r.u64()?,
            compression: r.u8()?,
            set: LocalitySet::NONE,
        })
    }
}

/// An element's payload: small data inline in the leaf, or a reference to an extent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    Inline(Vec<u8>),
    Extent(ExtentRef),
}

/// Largest inline payload; keeps any element well below a quarter of a node.
pub const INLINE_BYTES_MAX: usize = 3 * 1024;
/// Longest symlink target: Linux's PATH_MAX (4096) less the terminating NUL, as the kernel
/// file systems allow. Targets longer than `INLINE_BYTES_MAX` are stored as an extent.
pub const SYMLINK_BYTES_MAX: usize = 4095;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub key: Key,
    /// TID that deleted this version; 0 while live.
    pub delete_tid: u64,
    pub payload: Payload,
}

impl Element {
    pub fn visible_at(&self, tid: u64) -> bool {
        self.key.create_tid <= tid && (self.delete_tid == 0 || tid < self.delete_tid)
    }

    pub fn encoded_bytes(&self) -> usize {
        Key::ENCODED_BYTES
            + 8
            + 1
            + match &self.payload {
                Payload::Inline(bytes) => 2 + bytes.len(),
                Payload::Extent(_) => 25,
            }
    }

    pub fn encode(&self, w: &mut Writer) {
        self.key.encode(w);
        w.u64(self.delete_tid);
        match &self.payload {
            Payload::Inline(bytes) => {
                debug_assert!(bytes.len() <= INLINE_BYTES_MAX);
                w.u8(0);
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "inline payloads are at most INLINE_BYTES_MAX (3 KiB), asserted above"
                )]
                w.u16(bytes.len() as u16);
                w.raw(bytes);
            }
            Payload::Extent(e) => {
                w.u8(1);
                w.raw(&e.to_bytes());
            }
        }
    }

    pub fn decode(r: &mut Reader<'_>) -> Result<Element> {
        let key = Key::decode(r)?;
        let delete_tid = r.u64()?;
        let payload = match r.u8()? {
            0 => {
                let len = r.u16()? as usize;
                if len > INLINE_BYTES_MAX {
                    return Err(bad("inline payload too long", &key));
                }
                Payload::Inline(r.take(len)?.to_vec())
            }
            1 => Payload::Extent(ExtentRef::decode(r)?),
            other => return Err(bad(&format!("unknown payload kind {other}"), &key)),
        };
        if delete_tid != 0 && delete_tid <= key.create_tid {
            return Err(bad("deleted before created", &key));
        }
        Ok(Element {
            key,
            delete_tid,
            payload,
        })
    }
}

fn bad(what: &str, key: &Key) -> Error {
    Error::corrupt(what.to_string(), format!("element {key:?}"))
}

/// File type bits as stored in `Inode::mode` (same values as POSIX S_IF*).
pub mod kind {
    pub const MASK: u32 = 0o170000;
    pub const FILE: u32 = 0o100000;
    pub const DIR: u32 = 0o040000;
    pub const SYMLINK: u32 = 0o120000;
    pub const FIFO: u32 = 0o010000;
    pub const SOCKET: u32 = 0o140000;
    pub const CHAR: u32 = 0o020000;
    pub const BLOCK: u32 = 0o060000;
}

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

impl Timestamp {
    pub fn now() -> Timestamp {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        }
    }
    pub fn as_ns(&self) -> u64 {
        // Before the epoch reads as the epoch.
        u64::try_from(self.sec)
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            + u64::from(self.nsec)
    }
    fn encode(&self, w: &mut Writer) {
        w.i64(self.sec);
        w.u32(self.nsec);
    }
    fn decode(r: &mut Reader<'_>) -> Result<Timestamp> {
        let t = Timestamp {
            sec: r.i64()?,
            nsec: r.u32()?,
        };
        if t.nsec >= 1_000_000_000 {
            return Err(Error::corrupt(
                "timestamp nanoseconds out of range",
                "inode",
            ));
        }
        Ok(t)
    }
}

/// Inode flags. Part of the format.
pub mod inode_flags {
    /// Overwrites and deletes of this object destroy the old version (no history).
    pub const NOHISTORY: u32 = 1;
    /// A cache: when space runs low, the least recently used clusters of files created in
    /// this directory are deleted instead of writes failing (see `fs/evict.rs`). Set on
    /// directories with `NOHISTORY`; new children inherit both.
    pub const EVICTABLE: u32 = 2;
    /// On the root directory only: the volume has (or had) a cache directory, so a mount
    /// tracks cache files from the start. Not inherited.
    pub const CACHES: u32 = 4;
    /// Bits 8-11: the codec for this object's new data plus one (see `compression`); 0 means
    /// the volume default. New children inherit it.
    pub const CODEC_SHIFT: u32 = 8;
    pub const CODEC_MASK: u32 = 0xf << CODEC_SHIFT;
    /// What a new object takes from the directory it is created in.
    pub const INHERITED: u32 = NOHISTORY | EVICTABLE | CODEC_MASK;
}

/// The attributes of an object (record INODE, key 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inode {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub rdev: u64,
    pub flags: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub btime: Timestamp,
    /// Directory the object was created in; used to place small files together.
    pub parent_hint: u64,
}

/// Bytes of an inode as `Inode::encode` writes it.
pub const INODE_BYTES: usize = 92;

impl Inode {
    /// The codec chosen for this object, if any (None: the volume default).
    pub fn codec_setting(&self) -> Option<u8> {
        match (self.flags & inode_flags::CODEC_MASK) >> inode_flags::CODEC_SHIFT {
            0 => None,
            // CODEC_MASK is four bits wide, so this always fits.
            stored => u8::try_from(stored - 1).ok(),
        }
    }

    /// The codec new data of this object is written with.
    pub fn codec(&self) -> u8 {
        match self.codec_setting() {
            Some(codec @ (compression::NONE | compression::LZ4 | compression::ZSTD)) => codec,
            _ => compression::DEFAULT,
        }
    }

    /// Chooses the codec (None: the volume default).
    pub fn set_codec(&mut self, codec: Option<u8>) {
        let stored = codec.map_or(0, |c| u32::from(c) + 1);
        self.flags = (self.flags & !inode_flags::CODEC_MASK)
            | ((stored << inode_flags::CODEC_SHIFT) & inode_flags::CODEC_MASK);
    }

    pub fn kind(&self) -> u32 {
        self.mode & kind::MASK
    }
    pub fn is_dir(&self) -> bool {
        self.kind() == kind::DIR
    }
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(96);
        w.u32(self.mode);
        w.u32(self.uid);
        w.u32(self.gid);
        w.u32(self.nlink);
        w.u64(self.size);
        w.u64(self.rdev);
        w.u32(self.flags);
        self.atime.encode(&mut w);
        self.mtime.encode(&mut w);
        self.ctime.encode(&mut w);
        self.btime.encode(&mut w);
        w.u64(self.parent_hint);
        w.bytes
    }
    pub fn decode(bytes: &[u8]) -> Result<Inode> {
        match bytes.first_chunk::<INODE_BYTES>() {
            Some(whole) => Inode::decode_whole(whole),
            None => Inode::decode_short(bytes),
        }
    }

    /// `decode` of bytes long enough: every field at its fixed place, one length check for
    /// all (inodes are decoded several times a request; field by field through a reader,
    /// each with its own check, was most of that time).
    fn decode_whole(b: &[u8; INODE_BYTES]) -> Result<Inode> {
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let le8 = |at: usize| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&b[at..at + 8]);
            le
        };
        let u64_at = |at: usize| u64::from_le_bytes(le8(at));
        let time_at = |at: usize| {
            let t = Timestamp {
                sec: i64::from_le_bytes(le8(at)),
                nsec: u32_at(at + 8),
            };
            match t.nsec < 1_000_000_000 {
                true => Ok(t),
                false => Err(Error::corrupt(
                    "timestamp nanoseconds out of range",
                    "inode",
                )),
            }
        };
        Ok(Inode {
            mode: u32_at(0),
            uid: u32_at(4),
            gid: u32_at(8),
            nlink: u32_at(12),
            size: u64_at(16),
            rdev: u64_at(24),
            flags: u32_at(32),
            atime: time_at(36)?,
            mtime: time_at(48)?,
            ctime: time_at(60)?,
            btime: time_at(72)?,
            parent_hint: u64_at(84),
        })
    }

    /// `decode` of bytes too short for an inode: fails where they end, as a reader says.
    fn decode_short(bytes: &[u8]) -> Result<Inode> {
        let mut r = Reader::new(bytes, "inode");
        Ok(Inode {
            mode: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            nlink: r.u32()?,
            size: r.u64()?,
            rdev: r.u64()?,
            flags: r.u32()?,
            atime: Timestamp::decode(&mut r)?,
            mtime: Timestamp::decode(&mut r)?,
            ctime: Timestamp::decode(&mut r)?,
            btime: Timestamp::decode(&mut r)?,
            parent_hint: r.u64()?,
        })
    }
}

/// A directory entry (record DIRENT): child object, its type bits, and the name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirent {
    pub child: u64,
    pub kind: u32,
    pub name: Vec<u8>,
}

pub const NAME_BYTES_MAX: usize = 255;

impl Dirent {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(16 + self.name.len());
        w.u64(self.child);
        w.u32(self.kind);
        debug_assert!(!self.name.is_empty() && self.name.len() <= NAME_BYTES_MAX);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "names are at most NAME_BYTES_MAX (255) bytes, asserted above"
        )]
        w.u16(self.name.len() as u16);
        w.raw(&self.name);
        w.bytes
    }
    pub fn decode(bytes: &[u8]) -> Result<Dirent> {
        let mut r = Reader::new(bytes, "directory entry");
        let child = r.u64()?;
        let kind = r.u32()?;
        let len = r.u16()? as usize;
        if len == 0 || len > NAME_BYTES_MAX {
            return Err(Error::corrupt(
                "directory entry name length out of range",
                "dirent",
            ));
        }
        Ok(Dirent {
            child,
            kind,
            name: r.take(len)?.to_vec(),
        })
    }
}

/// An extended attribute (record XATTR): name and value.
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

pub const XATTR_VALUE_BYTES_MAX: usize = INLINE_BYTES_MAX - NAME_BYTES_MAX - 8;

impl Xattr {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(4 + self.name.len() + self.value.len());
        debug_assert!(self.name.len() <= NAME_BYTES_MAX);
        debug_assert!(self.value.len() <= XATTR_VALUE_BYTES_MAX);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "names are at most NAME_BYTES_MAX (255) bytes, asserted above"
        )]
        w.u16(self.name.len() as u16);
        w.raw(&self.name);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "values are at most XATTR_VALUE_BYTES_MAX (under 3 KiB), asserted above"
        )]
        w.u16(self.value.len() as u16);
        w.raw(&self.value);
        w.bytes
    }
    pub fn decode(bytes: &[u8]) -> Result<Xattr> {
        let mut r = Reader::new(bytes, "xattr");
        let name_len = r.u16()? as usize;
        let name = r.take(name_len)?.to_vec();
        let value_len = r.u16()? as usize;
        Ok(Xattr {
            name,
            value: r.take(value_len)?.to_vec(),
        })
    }
}

/// Keys of hashed records (dirents, xattrs): the name hash picks a slot range of 65536 keys;
/// collisions take the next free slot. Keys stay below 2^62 and above 2, so readdir cookies
/// 0..=2 stay free for the start, "." and "..".
pub fn hash_slot_base(name: &[u8]) -> u64 {
    ((crate::checksum::name_hash(name) >> 18) + 1) << 16
}
pub const HASH_SLOTS: u64 = 1 << 16;

/// File data is kept in aligned chunks of this size; record DATA key = chunk end offset.
pub const DATA_CHUNK_BYTES: u64 = 64 * 1024;
/// File data up to this size is stored inline in the leaf rather than as an extent.
pub const DATA_INLINE_BYTES_MAX: usize = 512;

/// PATCH records: small writes into a committed chunk, stored without rewriting it.
///
/// A PATCH holds pages of one chunk: its key is `chunk index << 16 | bitmap` (bit p set:
/// page p, bytes `[p * 4096, (p + 1) * 4096)` of the chunk), its payload those pages in
/// ascending order. Every page is whole but the last, which holds 1 to 4096 bytes: the
/// patch ends at `last page * 4096 + its length` (`end`). Applying a patch to a chunk
/// shorter than that end first extends the chunk with zeros, so an append to a chunk is a
/// patch too (format version 4 on; earlier patches never extend their chunk and read the
/// same under this rule). The chunk as of TID t is the DATA record visible at t with every
/// PATCH of that chunk visible at t applied in create_tid order. The operation that
/// replaces or removes the DATA record removes the chunk's patches.
pub mod patch {
    use super::DATA_CHUNK_BYTES;

    pub const PAGE_BYTES: u64 = 4096;
    pub const PAGES: u32 = 16;
    /// `PAGE_BYTES` as a length in memory.
    pub(crate) const PAGE: usize = 4096;
    const _: () = assert!(PAGES as u64 * PAGE_BYTES == DATA_CHUNK_BYTES);
    const _: () = assert!(PAGE as u64 == PAGE_BYTES);

    pub fn key(chunk_index: u64, bitmap: u16) -> u64 {
        (chunk_index << 16) | u64::from(bitmap)
    }

    /// (chunk index, page bitmap) of a PATCH key.
    pub fn split(key: u64) -> (u64, u16) {
        (key >> 16, (key & 0xffff) as u16)
    }

    /// Keys of every possible PATCH of chunks `first..=last`.
    pub fn key_range(first: u64, last: u64) -> (u64, u64) {
        (key(first, 1), key(last, u16::MAX))
    }

    /// The highest page a bitmap names (None for an empty bitmap).
    fn last_page(bitmap: u16) -> Option<usize> {
        (bitmap != 0).then(|| 15 - bitmap.leading_zeros() as usize)
    }

    /// The byte range of `page` in a patch (or chunk) that ends at byte `end`, if the page
    /// holds any of it.
    pub fn page_range(page: u32, end: usize) -> Option<std::ops::Range<usize>> {
        let start = page as usize * PAGE;
        (start < end).then(|| start..(start + PAGE).min(end))
    }

    /// Where a patch with `bitmap` and a payload of `payload_len` bytes ends in its chunk:
    /// every page whole but the last, which holds 1 to 4096 bytes. None if no such layout
    /// exists (a corrupt record).
    pub fn end(bitmap: u16, payload_len: usize) -> Option<usize> {
        let last = last_page(bitmap)?;
        let whole = (bitmap.count_ones() as usize - 1) * PAGE;
        let last_len = payload_len.checked_sub(whole)?;
        (1..=PAGE)
            .contains(&last_len)
            .then_some(last * PAGE + last_len)
    }

    /// The end of a patch with `bitmap` cut from a chunk of `chunk_len` bytes: its last
    /// page clipped to the chunk.
    pub fn layout_end(bitmap: u16, chunk_len: usize) -> usize {
        last_page(bitmap).map_or(0, |last| ((last + 1) * PAGE).min(chunk_len))
    }

    /// Applies one patch to a chunk, extending it with zeros to the patch's end first.
    /// False if the payload does not fit the bitmap (a corrupt record).
    pub fn apply(chunk: &mut Vec<u8>, bitmap: u16, payload: &[u8]) -> bool {
        let Some(end) = end(bitmap, payload.len()) else {
            return false;
        };
        if chunk.len() < end {
            chunk.resize(end, 0);
        }
        let mut at = 0;
        for page in (0..PAGES).filter(|p| bitmap & (1 << p) != 0) {
            if let Some(range) = page_range(page, end) {
                let len = range.len();
                chunk[range].copy_from_slice(&payload[at..at + len]);
                at += len;
            }
        }
        true
    }

    /// The payload of a patch with `bitmap`, cut from the chunk's current bytes (every
    /// page of `bitmap` holds some of them).
    pub fn extract(chunk: &[u8], bitmap: u16) -> Vec<u8> {
        let end = layout_end(bitmap, chunk.len());
        let mut out = Vec::new();
        for page in (0..PAGES).filter(|p| bitmap & (1 << p) != 0) {
            if let Some(range) = page_range(page, end) {
                out.extend_from_slice(&chunk[range]);
            }
        }
        out
    }

    /// The payload of a patch with `bitmap` over a chunk that will be `chunk_len` bytes
    /// long, made of `src` written at `at` over this group's earlier patch of the chunk
    /// (`own`: its bitmap and payload; the chunk's newest patch, so the chunk ends where it
    /// does if its last page is short), without reading the chunk: None if some page of
    /// `bitmap` is neither wholly written by `src` nor held by `own`.
    pub fn compose(
        bitmap: u16,
        chunk_len: usize,
        at: usize,
        src: &[u8],
        own: Option<(u16, &[u8])>,
    ) -> Option<Vec<u8>> {
        let write_end = at + src.len();
        let end = layout_end(bitmap, chunk_len);
        let mut out = Vec::with_capacity(bitmap.count_ones() as usize * PAGE);
        for page in (0..PAGES).filter(|p| bitmap & (1 << p) != 0) {
            let range = page_range(page, end)?;
            if range.start >= at && range.end <= write_end {
                out.extend_from_slice(&src[range.start - at..range.end - at]);
                continue;
            }
            let (own_bitmap, own_payload) = own?;
            if own_bitmap & (1 << page) == 0 {
                return None;
            }
            let own_end = self::end(own_bitmap, own_payload.len())?;
            let from = payload_offset(own_bitmap, own_end, range.start)?;
            let held = page_range(page, own_end)?.len();
            let mut bytes = own_payload.get(from..from + held)?.to_vec();
            // Past the end of the newest patch's short last page the chunk holds nothing.
            bytes.resize(range.len(), 0);
            let lo = range.start.max(at);
            let hi = range.end.min(write_end);
            if lo < hi {
                bytes[lo - range.start..hi - range.start].copy_from_slice(&src[lo - at..hi - at]);
            }
            out.extend_from_slice(&bytes);
        }
        Some(out)
    }

    /// Where chunk byte `at` lies in the payload of a patch with `bitmap` that ends at
    /// `end`: the lengths of the patch's pages before its page, plus its place in that
    /// page. None if its page is not in the patch or past its end.
    pub fn payload_offset(bitmap: u16, end: usize, at: usize) -> Option<usize> {
        let page = u32::try_from(at / PAGE).ok()?;
        if page >= PAGES || bitmap & (1 << page) == 0 {
            return None;
        }
        let mut from = 0;
        for before in (0..page).filter(|p| bitmap & (1 << p) != 0) {
            from += page_range(before, end)?.len();
        }
        let range = page_range(page, end)?;
        (at < range.end).then(|| from + at - range.start)
    }

    /// The pages a byte range `[from, to)` of a chunk touches.
    pub fn pages_of(from: u64, to: u64) -> u16 {
        debug_assert!(from < to && to <= DATA_CHUNK_BYTES);
        let first = from / PAGE_BYTES;
        let last = (to - 1) / PAGE_BYTES;
        let mut bitmap = 0u16;
        for page in first..=last {
            bitmap |= 1 << page;
        }
        bitmap
    }
}

#[cfg(test)]
mod tests {
    use super::patch;

    /// `compose` gives what cutting the pages from the written chunk gives, whenever it
    /// can answer without the chunk.
    #[test]
    fn patch_compose_matches_extract() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let mut answered = 0;
        for _ in 0..2000 {
            let chunk_len = if rng.gen_bool(0.5) {
                65536
            } else {
                rng.gen_range(1..65536)
            };
            let chunk: Vec<u8> = (0..chunk_len).map(|_| rng.gen()).collect();
            // An earlier patch written over the chunk, then a new write.
            let mut current = chunk.clone();
            let own = if rng.gen_bool(0.5) {
                let at = rng.gen_range(0..chunk_len);
                let end = rng.gen_range(at + 1..=chunk_len.min(at + 9000));
                for b in &mut current[at..end] {
                    *b = rng.gen();
                }
                let bits = patch::pages_of(at as u64, end as u64);
                Some((bits, patch::extract(&current, bits)))
            } else {
                None
            };
            let (at, end) = if rng.gen_bool(0.5) {
                // Whole pages (the common case the writer meets).
                let at = rng.gen_range(0..chunk_len.div_ceil(4096)) * 4096;
                (at, chunk_len.min(at + 4096 * rng.gen_range(1..4)))
            } else {
                let at = rng.gen_range(0..chunk_len);
                (at, rng.gen_range(at + 1..=chunk_len.min(at + 12_000)))
            };
            let src: Vec<u8> = (0..end - at).map(|_| rng.gen()).collect();
            current[at..end].copy_from_slice(&src);
            let own_bits = own.as_ref().map_or(0, |o| o.0);
            let bitmap = own_bits | patch::pages_of(at as u64, end as u64);
            let own_ref = own.as_ref().map(|(b, p)| (*b, p.as_slice()));
            if let Some(payload) = patch::compose(bitmap, chunk_len, at, &src, own_ref) {
                answered += 1;
                assert_eq!(payload, patch::extract(&current, bitmap));
            }
        }
        assert!(answered > 200, "compose answered only {answered} times");
    }

    /// A run of writes into a chunk, past its end too, stored as the writer stores them
    /// (a group's own patch widened, else a new patch), replays to the written bytes.
    #[test]
    fn patches_replay_writes_that_extend_the_chunk() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut composed = 0;
        for _ in 0..400 {
            let base_len = rng.gen_range(1..60_000);
            let base: Vec<u8> = (0..base_len).map(|_| rng.gen()).collect();
            let mut want = base.clone();
            let mut stored: Vec<(u16, Vec<u8>)> = Vec::new();
            let mut own: Option<(u16, Vec<u8>)> = None;
            for _ in 0..rng.gen_range(1..12) {
                if rng.gen_bool(0.4) {
                    stored.extend(own.take());
                }
                let at = if rng.gen_bool(0.5) {
                    want.len().min(65_535) // an append
                } else {
                    rng.gen_range(0..(want.len() + 6000).min(65_536))
                };
                let end = rng.gen_range(at + 1..=(at + 9000).min(65_536));
                let src: Vec<u8> = (0..end - at).map(|_| rng.gen()).collect();
                let new_len = want.len().max(end);
                want.resize(new_len, 0);
                want[at..end].copy_from_slice(&src);
                let own_bits = own.as_ref().map_or(0, |o| o.0);
                let bitmap = own_bits | patch::pages_of(at as u64, end as u64);
                let own_ref = own.as_ref().map(|(b, p)| (*b, p.as_slice()));
                let expected = patch::extract(&want, bitmap);
                if let Some(payload) = patch::compose(bitmap, new_len, at, &src, own_ref) {
                    composed += 1;
                    assert_eq!(payload, expected);
                }
                assert_eq!(
                    patch::end(bitmap, expected.len()),
                    Some(patch::layout_end(bitmap, new_len))
                );
                own = Some((bitmap, expected));
            }
            stored.extend(own.take());
            let mut chunk = base.clone();
            for (bitmap, payload) in &stored {
                assert!(patch::apply(&mut chunk, *bitmap, payload));
            }
            assert_eq!(chunk, want);
        }
        assert!(composed > 100, "compose answered only {composed} times");
    }

    #[test]
    fn patch_layouts_that_cannot_be_are_refused() {
        assert_eq!(patch::end(0, 10), None);
        assert_eq!(patch::end(0b1, 0), None);
        assert_eq!(patch::end(0b1, 4097), None);
        assert_eq!(patch::end(0b11, 4096), None);
        assert_eq!(patch::end(0b101, 4096 + 10), Some(2 * 4096 + 10));
        let mut chunk = vec![1u8; 100];
        assert!(!patch::apply(&mut chunk, 0b1, &[]));
        assert!(patch::apply(&mut chunk, 0b10, &[7u8; 5]));
        assert_eq!(chunk.len(), 4096 + 5);
        assert!(chunk[100..4096].iter().all(|&b| b == 0) && chunk[4096..] == [7u8; 5]);
    }
    use super::*;

    #[test]
    fn element_round_trip() {
        for payload in [
            Payload::Inline(b"hello".to_vec()),
            Payload::Extent(ExtentRef {
                offset: 8192,
                stored_bytes: 100,
                logical_bytes: 200,
                checksum: 9,
                compression: compression::LZ4,
                set: LocalitySet::NONE,
            }),
        ] {
            let e = Element {
                key: Key {
                    obj: 5,
                    rtype: rtype::DATA,
                    key: 65536,
                    create_tid: 3,
                },
                delete_tid: 7,
                payload,
            };
            let mut w = Writer::default();
            e.encode(&mut w);
            assert_eq!(w.len(), e.encoded_bytes());
            let mut r = Reader::new(&w.bytes, "test");
            assert_eq!(Element::decode(&mut r).unwrap(), e);
        }
    }

    #[test]
    fn inode_round_trip() {
        let inode = Inode {
            mode: kind::FILE | 0o644,
            uid: 1,
            gid: 2,
            nlink: 1,
            size: 12345,
            rdev: 0,
            flags: 0,
            atime: Timestamp { sec: 1, nsec: 2 },
            mtime: Timestamp { sec: 3, nsec: 4 },
            ctime: Timestamp { sec: 5, nsec: 6 },
            btime: Timestamp {
                sec: -7,
                nsec: 999_999_999,
            },
            parent_hint: u64::MAX - 1,
        };
        let bytes = inode.encode();
        assert_eq!(bytes.len(), INODE_BYTES);
        assert_eq!(Inode::decode(&bytes).unwrap(), inode);
        // Bytes after an inode are not part of it.
        let mut longer = bytes.clone();
        longer.push(0xff);
        assert_eq!(Inode::decode(&longer).unwrap(), inode);
        // Too short: the reader's message, at the field that runs out.
        let short = Inode::decode(&bytes[..90]).unwrap_err().to_string();
        assert!(short.contains("inode truncated"), "{short}");
        assert!(short.contains("byte 84"), "{short}");
        // Nanoseconds out of range, in each of the four times.
        for at in [44, 56, 68, 80] {
            let mut bad = bytes.clone();
            bad[at..at + 4].copy_from_slice(&1_000_000_000u32.to_le_bytes());
            let e = Inode::decode(&bad).unwrap_err().to_string();
            assert!(e.contains("nanoseconds out of range"), "{e}");
        }
    }

    #[test]
    fn payload_offset_refuses_a_byte_far_past_the_chunk() {
        // Page 2^32 + 3 once truncated to page 3, which the patch holds.
        let page: usize = 4096;
        assert_eq!(
            patch::payload_offset(0b1000, 4 * page, 3 * page + 5),
            Some(5)
        );
        assert_eq!(
            patch::payload_offset(0b1000, 4 * page, ((1 << 32) + 3) * page + 5),
            None
        );
    }

    #[test]
    fn timestamps_before_the_epoch_read_as_the_epoch() {
        assert_eq!(Timestamp { sec: -5, nsec: 7 }.as_ns(), 7);
        assert_eq!(Timestamp { sec: 2, nsec: 7 }.as_ns(), 2_000_000_007);
    }

    #[test]
    fn hash_slots_leave_cookie_space() {
        for name in [&b"a"[..], b"zzzz", b""] {
            let base = hash_slot_base(name);
            assert!(base >= HASH_SLOTS && base + HASH_SLOTS < (1 << 63));
        }
    }
}
