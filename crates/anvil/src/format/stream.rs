//! The mirror stream: a volume's tree changes over a TID range, with the data they need, as
//! a self-describing sequence of checksummed, compressed blocks (`docs/format.md`,
//! "Mirror stream").
//!
//! A stream is `Block*`. Every block has a 40-byte header (magic, sequence number, the
//! stream's random id, codec, raw and stored lengths, checksum over header and payload)
//! and a payload of at most `BLOCK_RAW_MAX` bytes before compression. Block 0 carries the
//! `StreamHeader`; the rest carry `Item`s in key order, the last of which is `Item::End`.
//! A reader that sees a bad checksum, a sequence gap, another stream's id, or the input end
//! before `End` rejects the stream, so a truncated, corrupted, reordered or spliced stream
//! is never applied.

use super::coding::{Reader, Writer};
use super::record::{Element, Key};
use super::VolumeId;
use crate::checksum::checksum;
use crate::error::{Error, Result};
use std::io::{Read, Write};

/// "AMS1" in little-endian.
pub const STREAM_MAGIC: u32 = u32::from_le_bytes(*b"AMS1");
/// Version of the stream format this build writes, and the newest it reads. Version 2
/// streams may carry PATCH records that extend their chunk (format version 4); version 1
/// streams never do and read the same.
pub const STREAM_VERSION: u16 = 2;
/// Bytes of a block header.
pub const BLOCK_HEADER_BYTES: usize = 40;
/// Payload bytes of a block before compression, at most.
pub const BLOCK_RAW_MAX: usize = 4 << 20;
/// Payload a writer collects before it closes a block.
const BLOCK_TARGET: usize = 1 << 20;
/// zstd level of block payloads (zstd's own default).
const ZSTD_LEVEL: i32 = 3;

const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;

/// What a stream covers: block 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamHeader {
    /// The volume the stream was read from.
    pub master: VolumeId,
    /// Changes after this TID (0: everything)...
    pub since: u64,
    /// ...up to and including this one.
    pub until: u64,
    /// Whether `until` was the master's newest commit when the stream was read. Only then
    /// does an element the stream does not mention in a changed key range mean that the
    /// master destroyed it (history off, or prune); see `Item::Keep`.
    pub exact: bool,
    /// The master's next object id and live inode count at `until`.
    pub next_obj: u64,
    pub live_objects: u64,
    /// Commit time of `until` on the master (unix ns).
    pub commit_time_ns: u64,
}

/// One element of a stream after its header, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// The master's elements with keys in `lo..=hi` did not change in the range: the slave
    /// keeps its own there untouched.
    Skip { lo: Key, hi: Key },
    /// A live element the master still holds unchanged in a changed key range (unchanged
    /// history is not named: a slave keeps its history either way).
    Keep(Key),
    /// An element created in the range, with inline payload.
    Insert(Element),
    /// An element created in the range whose payload is an extent: the stored bytes as the
    /// master keeps them (compressed by `compression`), and their checksum.
    InsertExtent {
        key: Key,
        delete_tid: u64,
        compression: u8,
        logical_bytes: u32,
        checksum: u64,
        stored: Vec<u8>,
    },
    /// An element created before the range and deleted inside it.
    Delete { key: Key, delete_tid: u64 },
    /// The last item: counts the reader checks, and, if the master pruned history of the
    /// range before it was read, the newest TID that prune may have dropped points at or
    /// before (0: none; history between `since` and it is incomplete).
    End {
        items: u64,
        extent_bytes: u64,
        pruned_through: u64,
    },
}

mod tag {
    pub const SKIP: u8 = 1;
    pub const KEEP: u8 = 2;
    pub const INSERT: u8 = 3;
    pub const INSERT_EXTENT: u8 = 4;
    pub const DELETE: u8 = 5;
    pub const END: u8 = 9;
}

impl Item {
    /// The key an item is ordered by (a skip by its low end).
    pub fn key(&self) -> Option<Key> {
        match self {
            Item::Skip { lo, .. } => Some(*lo),
            Item::Keep(key) | Item::Delete { key, .. } | Item::InsertExtent { key, .. } => {
                Some(*key)
            }
            Item::Insert(element) => Some(element.key),
            Item::End { .. } => None,
        }
    }

    /// The highest key an item covers.
    pub fn last_key(&self) -> Option<Key> {
        match self {
            Item::Skip { hi, .. } => Some(*hi),
            other => other.key(),
        }
    }

    fn encode(&self, w: &mut Writer) {
        match self {
            Item::Skip { lo, hi } => {
                w.u8(tag::SKIP);
                lo.encode(w);
                hi.encode(w);
            }
            Item::Keep(key) => {
                w.u8(tag::KEEP);
                key.encode(w);
            }
            Item::Insert(element) => {
                w.u8(tag::INSERT);
                element.encode(w);
            }
            Item::InsertExtent {
                key,
                delete_tid,
                compression,
                logical_bytes,
                checksum,
                stored,
            } => {
                w.u8(tag::INSERT_EXTENT);
                key.encode(w);
                w.u64(*delete_tid);
                w.u8(*compression);
                w.u32(*logical_bytes);
                w.u64(*checksum);
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "stored is one extent, read back by its stored_bytes, a u32"
                )]
                w.u32(stored.len() as u32);
                w.raw(stored);
            }
            Item::Delete { key, delete_tid } => {
                w.u8(tag::DELETE);
                key.encode(w);
                w.u64(*delete_tid);
            }
            Item::End {
                items,
                extent_bytes,
                pruned_through,
            } => {
                w.u8(tag::END);
                w.u64(*items);
                w.u64(*extent_bytes);
                w.u64(*pruned_through);
            }
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Item> {
        Ok(match r.u8()? {
            tag::SKIP => {
                let lo = Key::decode(r)?;
                let hi = Key::decode(r)?;
                if hi < lo {
                    return Err(invalid("a skipped range ends before it starts"));
                }
                Item::Skip { lo, hi }
            }
            tag::KEEP => Item::Keep(Key::decode(r)?),
            tag::INSERT => {
                let element = Element::decode(r)?;
                if !matches!(element.payload, super::record::Payload::Inline(_)) {
                    return Err(invalid("an inserted element refers to the master's device"));
                }
                Item::Insert(element)
            }
            tag::INSERT_EXTENT => {
                let key = Key::decode(r)?;
                let delete_tid = r.u64()?;
                let compression = r.u8()?;
                let logical_bytes = r.u32()?;
                let checksum = r.u64()?;
                let len = r.u32()? as usize;
                if len > BLOCK_RAW_MAX || logical_bytes as usize > BLOCK_RAW_MAX {
                    return Err(invalid("an extent larger than a stream block"));
                }
                let stored = r.take(len)?.to_vec();
                if delete_tid != 0 && delete_tid <= key.create_tid {
                    return Err(invalid("an element deleted before it was created"));
                }
                Item::InsertExtent {
                    key,
                    delete_tid,
                    compression,
                    logical_bytes,
                    checksum,
                    stored,
                }
            }
            tag::DELETE => {
                let key = Key::decode(r)?;
                let delete_tid = r.u64()?;
                if delete_tid <= key.create_tid {
                    return Err(invalid("an element deleted before it was created"));
                }
                Item::Delete { key, delete_tid }
            }
            tag::END => Item::End {
                items: r.u64()?,
                extent_bytes: r.u64()?,
                pruned_through: r.u64()?,
            },
            other => return Err(invalid(&format!("unknown item type {other}"))),
        })
    }
}

impl StreamHeader {
    fn encode(&self, w: &mut Writer) {
        w.u16(STREAM_VERSION);
        w.raw(&self.master);
        w.u64(self.since);
        w.u64(self.until);
        w.u8(u8::from(self.exact));
        w.u64(self.next_obj);
        w.u64(self.live_objects);
        w.u64(self.commit_time_ns);
    }

    fn decode(r: &mut Reader<'_>) -> Result<StreamHeader> {
        let version = r.u16()?;
        if version == 0 || version > STREAM_VERSION {
            return Err(invalid(&format!(
                "stream format version {version}; this anvil reads versions 1 to {STREAM_VERSION}"
            )));
        }
        let mut master = [0u8; 16];
        master.copy_from_slice(r.take(16)?);
        let header = StreamHeader {
            master,
            since: r.u64()?,
            until: r.u64()?,
            exact: r.u8()? != 0,
            next_obj: r.u64()?,
            live_objects: r.u64()?,
            commit_time_ns: r.u64()?,
        };
        if header.until < header.since {
            return Err(invalid("the stream's range ends before it starts"));
        }
        Ok(header)
    }
}

fn invalid(why: &str) -> Error {
    Error::Stream(why.to_string())
}

/// Stream decoding errors name the stream, not the volume (`Reader` reports `Corrupt`).
fn in_stream(e: Error) -> Error {
    match e {
        Error::Corrupt { what, .. } => Error::Stream(what),
        other => other,
    }
}

/// Writes a stream: the header block, then items, cut into blocks.
pub struct StreamWriter<W: Write> {
    out: W,
    stream_id: u64,
    seq: u32,
    block: Writer,
    items: u64,
    extent_bytes: u64,
    /// Bytes written to `out` so far.
    pub bytes_out: u64,
    last_key: Option<Key>,
}

impl<W: Write> StreamWriter<W> {
    pub fn new(out: W, header: &StreamHeader) -> Result<StreamWriter<W>> {
        let mut writer = StreamWriter {
            out,
            stream_id: rand::random(),
            seq: 0,
            block: Writer::with_capacity(BLOCK_TARGET + 128 * 1024),
            items: 0,
            extent_bytes: 0,
            bytes_out: 0,
            last_key: None,
        };
        header.encode(&mut writer.block);
        writer.close_block()?;
        Ok(writer)
    }

    /// Appends an item; items must come in increasing key order.
    pub fn push(&mut self, item: &Item) -> Result<()> {
        debug_assert!(
            item.key()
                .is_some_and(|k| self.last_key.is_none_or(|l| l < k)),
            "stream items out of order: {item:?} after {:?}",
            self.last_key
        );
        self.last_key = item.last_key();
        if let Item::InsertExtent { stored, .. } = item {
            self.extent_bytes += stored.len() as u64;
        }
        item.encode(&mut self.block);
        self.items += 1;
        if self.block.len() >= BLOCK_TARGET {
            self.close_block()?;
        }
        Ok(())
    }

    /// Writes the `End` item and the last block; returns the output and bytes written.
    pub fn finish(mut self, pruned_through: u64) -> Result<(W, u64)> {
        let end = Item::End {
            items: self.items,
            extent_bytes: self.extent_bytes,
            pruned_through,
        };
        end.encode(&mut self.block);
        self.close_block()?;
        self.out.flush()?;
        Ok((self.out, self.bytes_out))
    }

    fn close_block(&mut self) -> Result<()> {
        let raw = std::mem::replace(&mut self.block, Writer::with_capacity(BLOCK_TARGET));
        let raw = raw.bytes;
        let (codec, stored) = match zstd::bulk::compress(&raw, ZSTD_LEVEL) {
            Ok(compressed) if compressed.len() < raw.len() => (CODEC_ZSTD, compressed),
            _ => (CODEC_RAW, raw.clone()),
        };
        let header = block_header(self.seq, self.stream_id, codec, raw.len(), &stored);
        self.out.write_all(&header)?;
        self.out.write_all(&stored)?;
        self.bytes_out += (header.len() + stored.len()) as u64;
        self.seq += 1;
        Ok(())
    }
}

fn block_header(seq: u32, stream_id: u64, codec: u8, raw_len: usize, stored: &[u8]) -> Vec<u8> {
    let mut w = Writer::with_capacity(BLOCK_HEADER_BYTES + stored.len());
    w.u32(STREAM_MAGIC);
    w.u32(seq);
    w.u64(stream_id);
    w.u8(codec);
    w.raw(&[0; 7]);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "a block closes once it passes BLOCK_TARGET (1 MiB), so it holds less than \
                  that plus one item, and is stored compressed only when smaller"
    )]
    let (raw_len, stored_len) = (raw_len as u32, stored.len() as u32);
    w.u32(raw_len);
    w.u32(stored_len);
    let mut covered = w.bytes;
    let prefix = covered.len();
    covered.extend_from_slice(stored);
    let sum = checksum(&covered);
    covered.truncate(prefix);
    covered.extend_from_slice(&sum.to_le_bytes());
    covered
}

/// Reads a stream block by block, checking each one, and hands out its items.
pub struct StreamReader<R: Read> {
    input: R,
    stream_id: u64,
    seq: u32,
    block: Vec<u8>,
    position: usize,
    items: u64,
    extent_bytes: u64,
    ended: bool,
    /// Bytes read from the input so far.
    pub bytes_in: u64,
}

impl<R: Read> StreamReader<R> {
    /// Reads and checks the header block.
    pub fn open(input: R) -> Result<(StreamReader<R>, StreamHeader)> {
        let mut reader = StreamReader {
            input,
            stream_id: 0,
            seq: 0,
            block: Vec::new(),
            position: 0,
            items: 0,
            extent_bytes: 0,
            ended: false,
            bytes_in: 0,
        };
        if !reader.next_block(true)? {
            return Err(invalid("empty input: no mirror stream"));
        }
        let mut r = Reader::new(&reader.block, "stream header");
        let header = StreamHeader::decode(&mut r).map_err(in_stream)?;
        reader.position = reader.block.len();
        Ok((reader, header))
    }

    /// The next item; `End` is returned once, after its counts were checked and the input
    /// was found to end right after it.
    pub fn next_item(&mut self) -> Result<Item> {
        if self.ended {
            return Err(invalid("read past the end of the stream"));
        }
        while self.position >= self.block.len() {
            if !self.next_block(false)? {
                return Err(invalid("truncated: the input ended before the stream did"));
            }
        }
        let mut r = Reader::new(&self.block[self.position..], "stream item");
        let item = Item::decode(&mut r).map_err(in_stream)?;
        self.position += r.position();
        match &item {
            Item::End {
                items,
                extent_bytes,
                ..
            } => {
                if *items != self.items || *extent_bytes != self.extent_bytes {
                    return Err(invalid("the stream's counts do not match what it carried"));
                }
                if self.position != self.block.len() || self.next_block(false)? {
                    return Err(invalid("data follows the end of the stream"));
                }
                self.ended = true;
            }
            Item::InsertExtent { stored, .. } => {
                self.items += 1;
                self.extent_bytes += stored.len() as u64;
            }
            _ => self.items += 1,
        }
        Ok(item)
    }

    /// Reads the next block; false at a clean end of input (no byte of a next block).
    fn next_block(&mut self, first: bool) -> Result<bool> {
        let mut header = [0u8; BLOCK_HEADER_BYTES];
        let got = read_full(&mut self.input, &mut header)?;
        if got == 0 {
            return Ok(false);
        }
        if got < header.len() {
            return Err(invalid("truncated: the input ends inside a block header"));
        }
        let mut r = Reader::new(&header, "stream block header");
        let magic = r.u32().map_err(in_stream)?;
        if magic != STREAM_MAGIC {
            return Err(invalid(if first {
                "not an anvil mirror stream (bad magic)"
            } else {
                "bad block magic: the stream is damaged"
            }));
        }
        let seq = r.u32().map_err(in_stream)?;
        let stream_id = r.u64().map_err(in_stream)?;
        let codec = r.u8().map_err(in_stream)?;
        r.take(7).map_err(in_stream)?;
        let raw_len = r.u32().map_err(in_stream)? as usize;
        let stored_len = r.u32().map_err(in_stream)? as usize;
        let sum = r.u64().map_err(in_stream)?;
        if raw_len > BLOCK_RAW_MAX || stored_len > BLOCK_RAW_MAX + BLOCK_RAW_MAX / 8 {
            return Err(invalid("a block longer than the format allows"));
        }
        let mut stored = vec![0u8; stored_len];
        if read_full(&mut self.input, &mut stored)? < stored_len {
            return Err(invalid("truncated: the input ends inside a block"));
        }
        let mut covered = header[..BLOCK_HEADER_BYTES - 8].to_vec();
        covered.extend_from_slice(&stored);
        if checksum(&covered) != sum {
            return Err(invalid(&format!("block {seq} fails its checksum")));
        }
        if first {
            if seq != 0 {
                return Err(invalid("the stream does not start at its first block"));
            }
            self.stream_id = stream_id;
        } else if stream_id != self.stream_id {
            return Err(invalid(&format!(
                "block {seq} belongs to another stream (spliced input)"
            )));
        } else if seq != self.seq + 1 {
            return Err(invalid(&format!(
                "block {seq} where block {} was expected (reordered or lost blocks)",
                self.seq + 1
            )));
        }
        self.seq = seq;
        self.bytes_in += (BLOCK_HEADER_BYTES + stored_len) as u64;
        self.block = match codec {
            CODEC_RAW if stored_len == raw_len => stored,
            CODEC_ZSTD => zstd::bulk::decompress(&stored, raw_len)
                .ok()
                .filter(|raw| raw.len() == raw_len)
                .ok_or_else(|| invalid(&format!("block {seq} does not decompress")))?,
            _ => return Err(invalid(&format!("block {seq} has an unknown codec"))),
        };
        self.position = 0;
        Ok(true)
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match input.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::Payload;

    fn key(obj: u64, create_tid: u64) -> Key {
        Key {
            obj,
            rtype: 1,
            key: 0,
            create_tid,
        }
    }

    fn sample() -> (StreamHeader, Vec<Item>) {
        let header = StreamHeader {
            master: [7; 16],
            since: 3,
            until: 9,
            exact: true,
            next_obj: 42,
            live_objects: 17,
            commit_time_ns: 1_700_000_000_000_000_000,
        };
        let mut items = vec![Item::Skip {
            lo: key(1, 1),
            hi: key(2, 2),
        }];
        items.push(Item::Keep(key(3, 2)));
        items.push(Item::Delete {
            key: key(3, 3),
            delete_tid: 5,
        });
        items.push(Item::Insert(Element {
            key: key(3, 6),
            delete_tid: 0,
            payload: Payload::Inline(b"attrs".to_vec()),
        }));
        // Enough incompressible extents to need several blocks.
        for obj in 4..40u64 {
            let stored: Vec<u8> = (0..100_000u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> (obj % 7 + 8)) as u8)
                .collect();
            items.push(Item::InsertExtent {
                key: key(obj, 7),
                delete_tid: 8,
                compression: 0,
                logical_bytes: stored.len() as u32,
                checksum: checksum(&stored),
                stored,
            });
        }
        (header, items)
    }

    fn encode(header: &StreamHeader, items: &[Item]) -> Vec<u8> {
        let mut writer = StreamWriter::new(Vec::new(), header).unwrap();
        for item in items {
            writer.push(item).unwrap();
        }
        writer.finish(2).unwrap().0
    }

    fn decode(bytes: &[u8]) -> Result<(StreamHeader, Vec<Item>)> {
        let (mut reader, header) = StreamReader::open(bytes)?;
        let mut items = Vec::new();
        loop {
            match reader.next_item()? {
                Item::End { .. } => return Ok((header, items)),
                item => items.push(item),
            }
        }
    }

    #[test]
    fn a_stream_reads_back_as_written() {
        let (header, items) = sample();
        let bytes = encode(&header, &items);
        let (read_header, read_items) = decode(&bytes).unwrap();
        assert_eq!(read_header, header);
        assert_eq!(read_items, items);
    }

    #[test]
    fn every_truncation_and_every_flipped_byte_is_refused() {
        let (header, items) = sample();
        let bytes = encode(&header, &items[..6]);
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len]).is_err(),
                "truncated at {len} accepted"
            );
        }
        for at in (0..bytes.len()).step_by(7) {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(decode(&damaged).is_err(), "flip at {at} accepted");
        }
    }

    #[test]
    fn reordered_spliced_and_foreign_input_is_refused() {
        let (header, items) = sample();
        let bytes = encode(&header, &items);
        let blocks = split_blocks(&bytes);
        assert!(blocks.len() > 3, "the sample spans several blocks");
        let mut swapped = blocks.clone();
        swapped.swap(1, 2);
        let err = decode(&swapped.concat()).unwrap_err().to_string();
        assert!(err.contains("reordered"), "{err}");
        let mut dropped = blocks.clone();
        dropped.remove(2);
        assert!(decode(&dropped.concat()).is_err());
        // The same items written again form another stream: its blocks do not fit in.
        let other = split_blocks(&encode(&header, &items));
        let mut spliced = blocks.clone();
        spliced[2] = other[2].clone();
        let err = decode(&spliced.concat()).unwrap_err().to_string();
        assert!(err.contains("another stream"), "{err}");
        let mut trailing = bytes.clone();
        trailing.extend_from_slice(&other[1]);
        assert!(decode(&trailing).is_err());
        let err = decode(b"SQLite format 3\0 and then some more bytes of it")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not an anvil mirror stream"), "{err}");
    }

    fn split_blocks(bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut blocks = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let stored = u32::from_le_bytes(bytes[at + 28..at + 32].try_into().unwrap()) as usize;
            let end = at + BLOCK_HEADER_BYTES + stored;
            blocks.push(bytes[at..end].to_vec());
            at = end;
        }
        blocks
    }
}
