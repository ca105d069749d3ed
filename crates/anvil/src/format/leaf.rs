//! Leaves as version-6 nodes store them, and as the cache holds them: elements packed
//! into as few bytes as their values need, back to back in one buffer.
//!
//! A leaf used to be decoded into a `Vec<Element>`: about 72 bytes of struct per element
//! plus an allocation for each inline payload, half again the block's own bytes, and the
//! encoding spent 25 bytes on a key whose fields mostly fit in a few. A volume holding a
//! proxy's 170,000 small files then needed 56 MB of leaves, and a 256 MiB machine could
//! not keep its own metadata in memory. Packed (format.md section 5), an element takes
//! what its values need (a directory entry about 28 bytes, an inode about 40, an extent
//! reference about 27), and the cache keeps exactly the bytes a node holds on the device,
//! plus two bytes per element saying where it starts. Elements are unpacked when a walk
//! visits them; a search unpacks only the keys it compares.
//!
//! Every packed element of a leaf is validated when the leaf is built from a block, so
//! the accessors below cannot fail on it afterwards.

use super::coding::{Reader, Writer};
use super::record::{
    rtype, Dirent, Element, ExtentRef, Inode, Key, LocalitySet, Payload, Timestamp,
    INLINE_BYTES_MAX, INODE_BYTES, NAME_BYTES_MAX,
};
use crate::error::{Error, Result};
use std::fmt;

/// Flag bits of a packed element's first byte.
mod flag {
    /// Bits 0-1: how the payload is packed.
    pub const FORM_MASK: u8 = 0b11;
    /// Inline bytes as they are: length, then the bytes.
    pub const RAW: u8 = 0;
    /// An extent reference.
    pub const EXTENT: u8 = 1;
    /// An inode payload (92 bytes inline), field by field.
    pub const INODE: u8 = 2;
    /// A directory entry payload, field by field.
    pub const DIRENT: u8 = 3;
    /// The element has a `delete_tid` (stored as its distance from `create_tid`).
    pub const DELETED: u8 = 1 << 2;
    /// The key field is a little-endian u64 (hashed-name slots), not a varint.
    pub const KEY_FIXED: u8 = 1 << 3;
    /// (extent) The offset is stored in 4 KiB blocks.
    pub const OFFSET_BLOCKS: u8 = 1 << 4;
    /// (extent, format version 7) The extent lies in a locality set: its blocks before the
    /// extent and its length in blocks follow the compression byte.
    pub const IN_SET: u8 = 1 << 5;
    /// Bits that must be zero.
    pub const UNUSED: u8 = 0b1100_0000;
}

/// Keys from here up are stored as a fixed u64 (a varint would take 9 or 10 bytes).
const KEY_FIXED_FROM: u64 = 1 << 56;
/// Bytes of a directory entry payload before its name.
const DIRENT_HEAD_BYTES: usize = 14;
/// Smallest packed element: flags, obj, rtype, key, create_tid, a raw payload's length.
pub const PACKED_BYTES_MIN: usize = 6;

/// Where packed bytes go: a buffer, or a count of them (so that a size is always the
/// size the encoder writes).
trait Sink {
    fn raw(&mut self, bytes: &[u8]);
    fn u8(&mut self, v: u8) {
        self.raw(&[v]);
    }
    fn u64(&mut self, v: u64) {
        self.raw(&v.to_le_bytes());
    }
    fn uvarint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.u8((v & 0x7f) as u8 | 0x80);
            v >>= 7;
        }
        #[expect(clippy::cast_possible_truncation, reason = "below 0x80 here")]
        self.u8(v as u8);
    }
}

impl Sink for Writer {
    fn raw(&mut self, bytes: &[u8]) {
        Writer::raw(self, bytes);
    }
}

struct Count(usize);

impl Sink for Count {
    fn raw(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

fn zigzag(v: i64) -> u64 {
    #[expect(
        clippy::cast_sign_loss,
        reason = "zigzag encoding: the bits are reinterpreted on purpose"
    )]
    let out = ((v << 1) ^ (v >> 63)) as u64;
    out
}

fn unzigzag(v: u64) -> i64 {
    #[expect(
        clippy::cast_possible_wrap,
        reason = "zigzag decoding: the bits are reinterpreted on purpose"
    )]
    let out = ((v >> 1) as i64) ^ -((v & 1) as i64);
    out
}

/// How an inline payload is packed: an inode or a directory entry field by field when it
/// is one that unpacks to exactly the same bytes, anything else as it is.
enum Form {
    Raw,
    Inode(Inode),
    Dirent(Dirent),
}

fn form_of(element: &Element) -> Form {
    let Payload::Inline(bytes) = &element.payload else {
        return Form::Raw;
    };
    match element.key.rtype {
        rtype::INODE if bytes.len() == INODE_BYTES => match Inode::decode(bytes) {
            Ok(inode) => Form::Inode(inode),
            Err(_) => Form::Raw,
        },
        rtype::DIRENT => match Dirent::decode(bytes) {
            Ok(d)
                if bytes.len() == DIRENT_HEAD_BYTES + d.name.len()
                    && d.kind & 0o7777 == 0
                    && d.kind >> 12 <= 0xff =>
            {
                Form::Dirent(d)
            }
            _ => Form::Raw,
        },
        _ => Form::Raw,
    }
}

fn pack_time(sink: &mut dyn Sink, t: &Timestamp) {
    sink.uvarint(zigzag(t.sec));
    sink.uvarint(u64::from(t.nsec));
}

fn pack(element: &Element, sink: &mut dyn Sink) {
    let key = &element.key;
    let form = form_of(element);
    let mut flags = match (&element.payload, &form) {
        (Payload::Extent(e), _) if e.offset % super::BLOCK_BYTES == 0 => {
            flag::EXTENT | flag::OFFSET_BLOCKS
        }
        (Payload::Extent(_), _) => flag::EXTENT,
        (_, Form::Raw) => flag::RAW,
        (_, Form::Inode(_)) => flag::INODE,
        (_, Form::Dirent(_)) => flag::DIRENT,
    };
    if element.delete_tid != 0 {
        flags |= flag::DELETED;
    }
    if let Payload::Extent(e) = &element.payload {
        if e.set_span().is_some() {
            flags |= flag::IN_SET;
        }
    }
    if key.key >= KEY_FIXED_FROM {
        flags |= flag::KEY_FIXED;
    }
    sink.u8(flags);
    sink.uvarint(key.obj);
    sink.u8(key.rtype);
    if flags & flag::KEY_FIXED != 0 {
        sink.u64(key.key);
    } else {
        sink.uvarint(key.key);
    }
    sink.uvarint(key.create_tid);
    if element.delete_tid != 0 {
        // Decoding rejects a delete_tid at or before create_tid, so the distance is > 0.
        sink.uvarint(element.delete_tid.wrapping_sub(key.create_tid));
    }
    match (&element.payload, form) {
        (Payload::Extent(e), _) => {
            if flags & flag::OFFSET_BLOCKS != 0 {
                sink.uvarint(e.offset / super::BLOCK_BYTES);
            } else {
                sink.uvarint(e.offset);
            }
            sink.uvarint(u64::from(e.stored_bytes));
            sink.uvarint(u64::from(e.logical_bytes));
            sink.u64(e.checksum);
            sink.u8(e.compression);
            // A set inconsistent with the extent (none is written) is dropped, not stored.
            if flags & flag::IN_SET != 0 {
                sink.uvarint(u64::from(e.set.before_blocks));
                sink.uvarint(u64::from(e.set.blocks));
            }
        }
        (Payload::Inline(bytes), Form::Raw) => {
            sink.uvarint(bytes.len() as u64);
            sink.raw(bytes);
        }
        (_, Form::Inode(inode)) => {
            for v in [inode.mode, inode.uid, inode.gid, inode.nlink] {
                sink.uvarint(u64::from(v));
            }
            sink.uvarint(inode.size);
            sink.uvarint(inode.rdev);
            sink.uvarint(u64::from(inode.flags));
            // Bit i: time i+1 equals time i (atime, mtime, ctime, btime), so not stored.
            let times = [inode.atime, inode.mtime, inode.ctime, inode.btime];
            let mut same = 0u8;
            for i in 1..times.len() {
                if times[i] == times[i - 1] {
                    same |= 1 << (i - 1);
                }
            }
            sink.u8(same);
            pack_time(sink, &times[0]);
            for (i, time) in times.iter().enumerate().skip(1) {
                if same & (1 << (i - 1)) == 0 {
                    pack_time(sink, time);
                }
            }
            sink.uvarint(inode.parent_hint);
        }
        (_, Form::Dirent(d)) => {
            sink.uvarint(d.child);
            #[expect(
                clippy::cast_possible_truncation,
                reason = "form_of chose this form only for kinds whose bits above 12 fit a byte"
            )]
            sink.u8((d.kind >> 12) as u8);
            #[expect(
                clippy::cast_possible_truncation,
                reason = "Dirent::decode accepted the name, so it is at most 255 bytes"
            )]
            sink.u8(d.name.len() as u8);
            sink.raw(&d.name);
        }
    }
}

/// Bytes `element` takes packed in a leaf.
pub fn packed_bytes(element: &Element) -> usize {
    let mut count = Count(0);
    pack(element, &mut count);
    count.0
}

fn bad(what: &str) -> Error {
    Error::corrupt(what.to_string(), "packed leaf element")
}

fn unpack_key(r: &mut Reader<'_>) -> Result<(u8, Key)> {
    let flags = r.u8()?;
    if flags & flag::UNUSED != 0
        || (flags & flag::IN_SET != 0 && flags & flag::FORM_MASK != flag::EXTENT)
    {
        return Err(bad("unknown flag bits"));
    }
    let obj = r.uvarint()?;
    let rtype = r.u8()?;
    let key = if flags & flag::KEY_FIXED != 0 {
        r.u64()?
    } else {
        r.uvarint()?
    };
    let create_tid = r.uvarint()?;
    Ok((
        flags,
        Key {
            obj,
            rtype,
            key,
            create_tid,
        },
    ))
}

fn unpack_u32(r: &mut Reader<'_>) -> Result<u32> {
    u32::try_from(r.uvarint()?).map_err(|_| bad("field wider than 32 bits"))
}

fn unpack_time(r: &mut Reader<'_>) -> Result<Timestamp> {
    let sec = unzigzag(r.uvarint()?);
    let nsec = unpack_u32(r)?;
    if nsec >= 1_000_000_000 {
        return Err(bad("timestamp nanoseconds out of range"));
    }
    Ok(Timestamp { sec, nsec })
}

/// Reads a packed element's head: flags, key, delete_tid (0 while live).
fn unpack_head(r: &mut Reader<'_>) -> Result<(u8, Key, u64)> {
    let (flags, key) = unpack_key(r)?;
    let delete_tid = if flags & flag::DELETED != 0 {
        key.create_tid
            .checked_add(r.uvarint()?)
            .filter(|&d| d > key.create_tid)
            .ok_or_else(|| bad("deleted before created"))?
    } else {
        0
    };
    Ok((flags, key, delete_tid))
}

/// Reads a packed element's payload, in the form `flags` gives.
fn unpack_payload(flags: u8, r: &mut Reader<'_>) -> Result<Payload> {
    Ok(match flags & flag::FORM_MASK {
        flag::EXTENT => Payload::Extent(unpack_extent(flags, r)?),
        flag::RAW => {
            let len = usize::try_from(r.uvarint()?).unwrap_or(usize::MAX);
            if len > INLINE_BYTES_MAX {
                return Err(bad("inline payload too long"));
            }
            Payload::Inline(r.take(len)?.to_vec())
        }
        flag::INODE => {
            let mode = unpack_u32(r)?;
            let uid = unpack_u32(r)?;
            let gid = unpack_u32(r)?;
            let nlink = unpack_u32(r)?;
            let size = r.uvarint()?;
            let rdev = r.uvarint()?;
            let flags = unpack_u32(r)?;
            let same = r.u8()?;
            if same > 0b111 {
                return Err(bad("unknown inode time bits"));
            }
            let mut times = [unpack_time(r)?; 4];
            for i in 1..times.len() {
                times[i] = if same & (1 << (i - 1)) != 0 {
                    times[i - 1]
                } else {
                    unpack_time(r)?
                };
            }
            let inode = Inode {
                mode,
                uid,
                gid,
                nlink,
                size,
                rdev,
                flags,
                atime: times[0],
                mtime: times[1],
                ctime: times[2],
                btime: times[3],
                parent_hint: r.uvarint()?,
            };
            Payload::Inline(inode.encode())
        }
        _ => {
            let child = r.uvarint()?;
            let kind = u32::from(r.u8()?) << 12;
            let len = usize::from(r.u8()?);
            if len == 0 || len > NAME_BYTES_MAX {
                return Err(bad("directory entry name length out of range"));
            }
            let dirent = Dirent {
                child,
                kind,
                name: r.take(len)?.to_vec(),
            };
            Payload::Inline(dirent.encode())
        }
    })
}

fn unpack_extent(flags: u8, r: &mut Reader<'_>) -> Result<ExtentRef> {
    let offset = r.uvarint()?;
    let offset = if flags & flag::OFFSET_BLOCKS != 0 {
        offset
            .checked_mul(super::BLOCK_BYTES)
            .ok_or_else(|| bad("extent offset out of range"))?
    } else {
        offset
    };
    let mut extent = ExtentRef {
        offset,
        stored_bytes: unpack_u32(r)?,
        logical_bytes: unpack_u32(r)?,
        checksum: r.u64()?,
        compression: r.u8()?,
        set: LocalitySet::NONE,
    };
    if flags & flag::IN_SET != 0 {
        extent.set = LocalitySet {
            before_blocks: unpack_u32(r)?,
            blocks: unpack_u32(r)?,
        };
        if extent.set_span().is_none() {
            return Err(bad("extent outside its locality set"));
        }
    }
    Ok(extent)
}

/// Reads one packed element.
fn unpack(r: &mut Reader<'_>) -> Result<Element> {
    let (flags, key, delete_tid) = unpack_head(r)?;
    Ok(Element {
        key,
        delete_tid,
        payload: unpack_payload(flags, r)?,
    })
}

/// An element of a packed leaf as a walk visits it: its key and TIDs, and its payload
/// unpacked only when asked for (a scan that looks at keys allocates nothing).
pub struct ElementView<'a> {
    pub key: Key,
    /// TID that deleted this version; 0 while live.
    pub delete_tid: u64,
    flags: u8,
    /// The leaf's bytes from this element's payload on.
    payload: &'a [u8],
}

impl ElementView<'_> {
    pub fn visible_at(&self, tid: u64) -> bool {
        self.key.create_tid <= tid && (self.delete_tid == 0 || tid < self.delete_tid)
    }

    /// The payload, unpacked.
    pub fn payload(&self) -> Payload {
        #[expect(
            clippy::expect_used,
            reason = "every element was validated when the leaf was built"
        )]
        unpack_payload(
            self.flags,
            &mut Reader::new(self.payload, "packed leaf element"),
        )
        .expect("validated leaf")
    }

    /// The extent the element refers to, if it is an extent reference.
    pub fn extent(&self) -> Option<ExtentRef> {
        if self.flags & flag::FORM_MASK != flag::EXTENT {
            return None;
        }
        #[expect(
            clippy::expect_used,
            reason = "every element was validated when the leaf was built"
        )]
        let extent = unpack_extent(self.flags, &mut Reader::new(self.payload, "packed extent"))
            .expect("validated leaf");
        Some(extent)
    }

    pub fn is_inline(&self) -> bool {
        self.flags & flag::FORM_MASK != flag::EXTENT
    }

    pub fn to_element(&self) -> Element {
        Element {
            key: self.key,
            delete_tid: self.delete_tid,
            payload: self.payload(),
        }
    }
}

impl fmt::Debug for ElementView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_element().fmt(f)
    }
}

/// An element on its way into a leaf a commit builds: one an old leaf holds, copied as
/// it is packed there (an unchanged element is not unpacked and packed again), or a new
/// or changed one.
pub enum Item<'a> {
    Packed(&'a [u8]),
    New(Element),
}

/// Room a commit leaves in a leaf for each live element's `delete_tid` (a varint of its
/// distance from `create_tid`, four bytes up to 2^28 commits): a delete with history grows
/// its element by that much, and a full leaf that a commit of deletes split in two would
/// take space from a full volume just when deleting is how it gets space back.
pub const DELETE_ROOM_BYTES: usize = 4;

impl Item<'_> {
    pub fn packed_bytes(&self) -> usize {
        match self {
            Item::Packed(bytes) => bytes.len(),
            Item::New(element) => packed_bytes(element),
        }
    }

    /// What the item counts for when a commit fills leaves: its bytes, and for a live
    /// element the room its deletion will take (`DELETE_ROOM_BYTES`).
    pub fn fill_bytes(&self) -> usize {
        let live = match self {
            Item::Packed(bytes) => bytes.first().is_some_and(|f| f & flag::DELETED == 0),
            Item::New(element) => element.delete_tid == 0,
        };
        self.packed_bytes() + if live { DELETE_ROOM_BYTES } else { 0 }
    }
}

/// The elements of one leaf, packed, in strictly ascending key order.
#[derive(Clone, PartialEq, Eq)]
pub struct Leaf {
    bytes: Box<[u8]>,
    /// Where each element starts in `bytes`.
    starts: Box<[u16]>,
}

/// A leaf's packed bytes stay below this (a node's payload is 16 KiB; an old-format leaf
/// packed again is never larger than this either).
const PACKED_LEAF_BYTES_MAX: usize = u16::MAX as usize;

/// The varint at the start of `bytes` and the bytes after it, for reading a validated
/// leaf: one pass over a slice, no check per byte (a varint cut short reads as what it has).
#[inline]
fn varint_in(bytes: &[u8]) -> (u64, &[u8]) {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().take(10).enumerate() {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return (value, bytes.get(i + 1..).unwrap_or_default());
        }
    }
    (value, bytes.get(10..).unwrap_or_default())
}

impl Leaf {
    /// Packs `elements` (in ascending key order).
    pub fn from_elements(elements: &[Element]) -> Leaf {
        let items: Vec<Item<'_>> = elements.iter().cloned().map(Item::New).collect();
        Leaf::from_items(&items)
    }

    /// Packs `items` (in ascending key order): elements copied from other leaves as they
    /// are packed there, and new ones packed here.
    pub fn from_items(items: &[Item<'_>]) -> Leaf {
        let mut w = Writer::with_capacity(items.iter().map(Item::packed_bytes).sum());
        let mut starts = Vec::with_capacity(items.len());
        for item in items {
            starts.push(w.len());
            match item {
                Item::Packed(bytes) => w.raw(bytes),
                Item::New(element) => pack(element, &mut w),
            }
        }
        assert!(
            w.len() <= PACKED_LEAF_BYTES_MAX,
            "packed leaf overflow: {} bytes",
            w.len()
        );
        Leaf {
            bytes: w.bytes.into_boxed_slice(),
            starts: starts
                .into_iter()
                .map(|s| u16::try_from(s).unwrap_or(u16::MAX))
                .collect(),
        }
    }

    /// The elements from `index` on, as they are packed here.
    pub fn items(&self, index: usize) -> impl Iterator<Item = Item<'_>> + '_ {
        (index..self.len()).map(|i| Item::Packed(self.packed_element(i)))
    }

    /// Element `index` as it is packed here.
    pub fn packed_element(&self, index: usize) -> &[u8] {
        let start = usize::from(self.starts[index]);
        let end = self
            .starts
            .get(index + 1)
            .map_or(self.bytes.len(), |&s| usize::from(s));
        &self.bytes[start..end]
    }

    /// Takes `count` packed elements from `bytes` (a version-6 leaf's entries), validating
    /// every one and their order; the bytes must end with the last element.
    pub fn from_packed(bytes: &[u8], count: usize) -> Result<Leaf> {
        if count > bytes.len() / PACKED_BYTES_MIN || bytes.len() > PACKED_LEAF_BYTES_MAX {
            return Err(bad("element count out of range"));
        }
        let mut r = Reader::new(bytes, "packed leaf element");
        let mut starts = Vec::with_capacity(count);
        let mut previous: Option<Key> = None;
        for _ in 0..count {
            starts.push(u16::try_from(r.position()).map_err(|_| bad("leaf too long"))?);
            let element = unpack(&mut r)?;
            if previous.is_some_and(|p| p >= element.key) {
                return Err(bad("keys out of order"));
            }
            previous = Some(element.key);
        }
        if r.remaining() != 0 {
            return Err(bad("bytes after the last element"));
        }
        Ok(Leaf {
            bytes: bytes.into(),
            starts: starts.into_boxed_slice(),
        })
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// The packed bytes, as a version-6 node stores them after its count.
    pub fn packed(&self) -> &[u8] {
        &self.bytes
    }

    /// Memory the leaf holds.
    pub fn memory_bytes(&self) -> usize {
        self.bytes.len() + 2 * self.starts.len() + std::mem::size_of::<Leaf>()
    }

    fn reader(&self, index: usize) -> Reader<'_> {
        let mut r = Reader::new(&self.bytes, "packed leaf element");
        let _ = r.take(usize::from(self.starts[index]));
        r
    }

    /// The key of element `index`.
    pub fn key(&self, index: usize) -> Key {
        #[expect(
            clippy::expect_used,
            reason = "every element was validated when the leaf was built"
        )]
        let (_, key) = unpack_key(&mut self.reader(index)).expect("validated leaf");
        key
    }

    /// Element `index`, its payload unpacked when asked for.
    pub fn view(&self, index: usize) -> ElementView<'_> {
        let mut r = self.reader(index);
        #[expect(
            clippy::expect_used,
            reason = "every element was validated when the leaf was built"
        )]
        let (flags, key, delete_tid) = unpack_head(&mut r).expect("validated leaf");
        ElementView {
            key,
            delete_tid,
            flags,
            payload: &self.bytes[r.position()..],
        }
    }

    /// Element `index`, unpacked.
    pub fn get(&self, index: usize) -> Element {
        #[expect(
            clippy::expect_used,
            reason = "every element was validated when the leaf was built"
        )]
        unpack(&mut self.reader(index)).expect("validated leaf")
    }

    /// How element `index`'s key compares with `key`, decoding its fields only as far as
    /// they decide (most comparisons in a search end at `obj`). The leaf was validated when
    /// built, so every field lies inside it; a byte past the end (which cannot happen)
    /// reads as zero rather than panicking.
    pub fn compare(&self, index: usize, key: &Key) -> std::cmp::Ordering {
        let start = usize::from(self.starts[index]);
        let element = self.bytes.get(start..).unwrap_or_default();
        let flags = element.first().copied().unwrap_or(0);
        let (obj, rest) = varint_in(element.get(1..).unwrap_or_default());
        let order = obj.cmp(&key.obj);
        if order.is_ne() {
            return order;
        }
        let order = rest.first().copied().unwrap_or(0).cmp(&key.rtype);
        if order.is_ne() {
            return order;
        }
        let rest = rest.get(1..).unwrap_or_default();
        let (element_key, rest) = if flags & flag::KEY_FIXED != 0 {
            let le: [u8; 8] = rest
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .unwrap_or_default();
            (u64::from_le_bytes(le), rest.get(8..).unwrap_or_default())
        } else {
            varint_in(rest)
        };
        let order = element_key.cmp(&key.key);
        if order.is_ne() {
            return order;
        }
        varint_in(rest).0.cmp(&key.create_tid)
    }

    /// Index of the first element whose key is not below `key`.
    pub fn lower_bound(&self, key: &Key) -> usize {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.compare(mid, key).is_lt() {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// The element with exactly `key`.
    pub fn find(&self, key: &Key) -> Option<Element> {
        let index = self.lower_bound(key);
        (index < self.len() && self.compare(index, key).is_eq()).then(|| self.get(index))
    }

    pub fn first_key(&self) -> Option<Key> {
        (!self.is_empty()).then(|| self.key(0))
    }

    pub fn last_key(&self) -> Option<Key> {
        self.len().checked_sub(1).map(|last| self.key(last))
    }

    /// Every element, unpacked in order.
    pub fn iter(&self) -> impl Iterator<Item = Element> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// Every element from `index` on.
    pub fn iter_from(&self, index: usize) -> impl Iterator<Item = Element> + '_ {
        (index..self.len()).map(|i| self.get(i))
    }

    pub fn to_vec(&self) -> Vec<Element> {
        self.iter().collect()
    }
}

impl fmt::Debug for Leaf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{compression, kind};

    fn key(obj: u64, rtype: u8, key: u64, create_tid: u64) -> Key {
        Key {
            obj,
            rtype,
            key,
            create_tid,
        }
    }

    fn inode(times: [i64; 4]) -> Inode {
        let t = |sec| Timestamp {
            sec,
            nsec: 123_456_789,
        };
        Inode {
            mode: kind::FILE | 0o644,
            uid: 1000,
            gid: 1000,
            nlink: 1,
            size: 6144,
            rdev: 0,
            flags: 5,
            atime: t(times[0]),
            mtime: t(times[1]),
            ctime: t(times[2]),
            btime: t(times[3]),
            parent_hint: 4097,
        }
    }

    fn samples() -> Vec<Element> {
        let dirent = Dirent {
            child: 300_000,
            kind: kind::FILE,
            name: b"0001A2B3".to_vec(),
        };
        let odd_dirent = Dirent {
            child: 7,
            kind: kind::FILE | 0o644, // permission bits: not the packed form
            name: b"x".to_vec(),
        };
        let mut elements = vec![
            Element {
                key: key(1, rtype::DIRENT, (0x3_ffff_ffff_ffff << 16) + 3, 9),
                delete_tid: 0,
                payload: Payload::Inline(dirent.encode()),
            },
            Element {
                key: key(2, rtype::DIRENT, 70_000, 9),
                delete_tid: 12,
                payload: Payload::Inline(odd_dirent.encode()),
            },
            Element {
                key: key(300_000, rtype::INODE, 0, 9),
                delete_tid: 0,
                payload: Payload::Inline(inode([1_795_000_000; 4]).encode()),
            },
            Element {
                key: key(300_000, rtype::INODE, 0, 10),
                delete_tid: u64::MAX,
                payload: Payload::Inline(inode([-5, 0, 1_795_000_000, i64::MAX]).encode()),
            },
            Element {
                key: key(300_000, rtype::DATA, 65536, 9),
                delete_tid: 0,
                payload: Payload::Extent(ExtentRef {
                    offset: 5 << 30,
                    stored_bytes: 4000,
                    logical_bytes: 65536,
                    checksum: 0xdead_beef_0123_4567,
                    compression: compression::ZSTD,
                    set: LocalitySet {
                        before_blocks: 3,
                        blocks: 8,
                    },
                }),
            },
            Element {
                key: key(300_000, rtype::DATA, 131_072, 9),
                delete_tid: 0,
                payload: Payload::Extent(ExtentRef {
                    offset: 12345, // not block aligned (a damaged or foreign value)
                    stored_bytes: u32::MAX,
                    logical_bytes: 0,
                    checksum: 0,
                    compression: 0,
                    set: LocalitySet::NONE,
                }),
            },
            Element {
                key: key(300_001, rtype::INODE, 0, 9),
                delete_tid: 0,
                payload: Payload::Inline(vec![1, 2, 3]), // short: not an inode to pack
            },
            Element {
                key: key(u64::MAX, u8::MAX, u64::MAX, u64::MAX - 1),
                delete_tid: u64::MAX,
                payload: Payload::Inline(vec![0xab; INLINE_BYTES_MAX]),
            },
        ];
        elements.sort_by_key(|e| e.key);
        elements
    }

    #[test]
    fn elements_round_trip_in_their_packed_forms() {
        let elements = samples();
        let leaf = Leaf::from_elements(&elements);
        assert_eq!(leaf.to_vec(), elements);
        let sizes: usize = elements.iter().map(packed_bytes).sum();
        assert_eq!(
            leaf.packed().len(),
            sizes,
            "packed_bytes is what pack writes"
        );
        let again = Leaf::from_packed(leaf.packed(), elements.len()).unwrap();
        assert_eq!(again, leaf);
        for (i, e) in elements.iter().enumerate() {
            assert_eq!(leaf.key(i), e.key);
            assert_eq!(leaf.find(&e.key).as_ref(), Some(e));
            assert_eq!(leaf.lower_bound(&e.key), i);
        }
        assert_eq!(leaf.find(&key(3, 0, 0, 0)), None);
        // Every key, and keys one off it in each field (each branch of `compare`).
        let near = |k: Key| {
            let f = |v: u64, d: i8| {
                if d < 0 {
                    v.saturating_sub(1)
                } else {
                    v.saturating_add(1)
                }
            };
            [-1i8, 1].into_iter().flat_map(move |d| {
                [
                    key(f(k.obj, d), k.rtype, k.key, k.create_tid),
                    key(k.obj, k.rtype.saturating_add_signed(d), k.key, k.create_tid),
                    key(k.obj, k.rtype, f(k.key, d), k.create_tid),
                    key(k.obj, k.rtype, k.key, f(k.create_tid, d)),
                ]
            })
        };
        let probes = elements.iter().flat_map(|e| near(e.key).chain([e.key]));
        for probe in probes.chain([
            key(0, 0, 0, 0),
            key(2, rtype::DIRENT, 70_000, 10),
            key(300_000, rtype::DATA, 65536, 8),
            key(u64::MAX, u8::MAX, u64::MAX, u64::MAX),
        ]) {
            for i in 0..leaf.len() {
                assert_eq!(
                    leaf.compare(i, &probe),
                    leaf.key(i).cmp(&probe),
                    "{i} {probe:?}"
                );
            }
        }
        // The common records take a fraction of their old encoding.
        let dirent = &elements[0];
        assert!(packed_bytes(dirent) < dirent.encoded_bytes() / 2 + 4);
        let inode = &elements[2];
        assert_eq!(inode.key.rtype, rtype::INODE);
        assert!(
            packed_bytes(inode) * 3 < inode.encoded_bytes(),
            "inode packs"
        );
        let extent = &elements[4];
        assert!(
            packed_bytes(extent) * 2 < extent.encoded_bytes(),
            "extent packs"
        );
    }

    #[test]
    fn a_locality_set_packs_only_where_it_holds_its_extent() {
        let mut elements = samples();
        let at = elements
            .iter()
            .position(|e| matches!(&e.payload, Payload::Extent(x) if !x.set.is_none()))
            .unwrap();
        let Payload::Extent(extent) = elements[at].payload.clone() else {
            unreachable!()
        };
        let packed = Leaf::from_elements(&elements);
        assert_eq!(packed.to_vec()[at], elements[at], "a set round trips");
        // Sets that cannot hold their extent (ahead of the volume's start, too short, too
        // long) are not written.
        for set in [
            LocalitySet {
                before_blocks: u32::MAX,
                blocks: 8,
            },
            LocalitySet {
                before_blocks: 3,
                blocks: 3,
            },
            LocalitySet {
                before_blocks: 0,
                blocks: LocalitySet::BLOCKS_MAX + 1,
            },
        ] {
            elements[at].payload = Payload::Extent(ExtentRef { set, ..extent });
            let leaf = Leaf::from_elements(&elements);
            assert_eq!(
                leaf.view(at).extent().map(|e| e.set),
                Some(LocalitySet::NONE)
            );
        }
        // The set flag on anything but an extent is refused.
        let mut w = Writer::default();
        pack(&elements[0], &mut w);
        assert_ne!(w.bytes[0] & flag::FORM_MASK, flag::EXTENT);
        w.bytes[0] |= flag::IN_SET;
        assert!(Leaf::from_packed(&w.bytes, 1).is_err());
    }

    #[test]
    fn damaged_packed_leaves_are_refused() {
        let elements = samples();
        let leaf = Leaf::from_elements(&elements);
        let bytes = leaf.packed();
        // Any truncation, and any count that does not match, is an error, not a panic.
        for cut in 0..bytes.len() {
            assert!(Leaf::from_packed(&bytes[..cut], elements.len()).is_err());
        }
        assert!(Leaf::from_packed(bytes, elements.len() - 1).is_err());
        assert!(Leaf::from_packed(bytes, elements.len() + 1).is_err());
        // Every single-byte change either is refused or still decodes in key order.
        for at in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.to_vec();
                damaged[at] ^= 1 << bit;
                if let Ok(leaf) = Leaf::from_packed(&damaged, elements.len()) {
                    let keys: Vec<Key> = (0..leaf.len()).map(|i| leaf.key(i)).collect();
                    assert!(keys.windows(2).all(|w| w[0] < w[1]));
                    let _ = leaf.to_vec();
                }
            }
        }
        // Keys out of order.
        let mut swapped = elements.clone();
        swapped.swap(0, 1);
        let mut w = Writer::default();
        for e in &swapped {
            pack(e, &mut w);
        }
        assert!(Leaf::from_packed(&w.bytes, swapped.len()).is_err());
    }
}
