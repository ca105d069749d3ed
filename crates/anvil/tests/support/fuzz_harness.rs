//! Harness shared by the cargo-fuzz targets in `fuzz/fuzz_targets/` (nightly, libFuzzer) and
//! by the stable regression test `tests/fuzz_regressions.rs`: both include this file with
//! `#[path]`, so a crasher found by the fuzzer replays through exactly the same code under
//! `cargo test`. Only the public API of the engine is used.
//!
//! Both entry points are structure-aware: before the engine sees the bytes, the harness
//! rewrites what a random mutation would otherwise almost never get right (the block
//! checksum, the block's own address and volume id), so inputs reach the decoders proper.
//! The contract under test: hostile bytes give `Ok` or `Err`, never a panic, a hang or an
//! unbounded allocation.

use anvil::checksum::checksum;
use anvil::device::{Device, MemDevice, Pages};
use anvil::format::coding::{Reader, Writer};
use anvil::format::log::LogBatch;
use anvil::format::node::Node;
use anvil::format::record::{rtype, Dirent, Element, Inode, Key, Payload, Xattr, ROOT_OBJ};
use anvil::format::superblock::Superblock;
use anvil::format::{
    BlockType, VolumeId, BLOCK_BYTES, BLOCK_MAGIC, HEADER_BYTES, NODE_BYTES, SUPERBLOCK_OFFSETS,
    VOLUME_BYTES_MIN,
};
use anvil::fs::Caller;
use anvil::{FileKind, Filesystem, MountOptions};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::{Arc, Mutex, OnceLock};

const BLOCK: usize = BLOCK_BYTES as usize;
/// Byte offsets inside the block header (see `docs/format.md`).
const VOLUME_ID_AT: usize = 8;
const ADDRESS_AT: usize = 32;
const PAYLOAD_BYTES_AT: usize = 40;
const CHECKSUM_AT: usize = 48;

/// Volume id and addresses the `decode_blocks` harness stamps into every block it decodes.
pub const FUZZ_VOLUME_ID: VolumeId = *b"anvil-fuzz-volid";
pub const FUZZ_NODE_ADDRESS: u64 = 1 << 20;
pub const FUZZ_LOG_ADDRESS: u64 = anvil::format::LOG_OFFSET;
/// A fuzzed redo-log batch spans at most this many blocks.
const LOG_BLOCKS_MAX: usize = 16;

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}

/// Recomputes the checksum of the block at the start of `block`, over the header and the
/// payload length the header claims (clamped to the block). Does nothing to a block without
/// the block magic.
pub fn reseal(block: &mut [u8]) {
    if block.len() < HEADER_BYTES || block[..4] != BLOCK_MAGIC.to_le_bytes() {
        return;
    }
    let payload = u32::from_le_bytes(
        block[PAYLOAD_BYTES_AT..PAYLOAD_BYTES_AT + 4]
            .try_into()
            .unwrap(),
    ) as usize;
    let end = HEADER_BYTES.saturating_add(payload).min(block.len());
    let mut scratch = block[..end].to_vec();
    scratch[CHECKSUM_AT..CHECKSUM_AT + 8].fill(0);
    let sum = checksum(&scratch);
    block[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
}

/// Stamps the volume id and address the decoder will expect, then reseals.
fn fix_header(block: &mut [u8], address: u64) {
    if block.len() < HEADER_BYTES {
        return;
    }
    block[VOLUME_ID_AT..VOLUME_ID_AT + 16].copy_from_slice(&FUZZ_VOLUME_ID);
    block[ADDRESS_AT..ADDRESS_AT + 8].copy_from_slice(&address.to_le_bytes());
    reseal(block);
}

/// `bytes` cut or zero-padded to exactly `len`.
fn framed(bytes: &[u8], len: usize) -> Vec<u8> {
    let mut block = bytes[..bytes.len().min(len)].to_vec();
    block.resize(len, 0);
    block
}

/// What a `decode_blocks` input holds: its first byte (modulo the number of kinds) picks one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Superblock,
    Leaf,
    /// Internal node decoded at the level its payload claims.
    Internal,
    /// Node decoded without an expected level (as `anvil check` and tools do).
    AnyNode,
    Log,
    Inode,
    Dirent,
    Xattr,
    /// A stream of elements (keys, delete TIDs, payloads) read from one `Reader`.
    Elements,
}

pub const BLOCK_KINDS: [BlockKind; 9] = [
    BlockKind::Superblock,
    BlockKind::Leaf,
    BlockKind::Internal,
    BlockKind::AnyNode,
    BlockKind::Log,
    BlockKind::Inode,
    BlockKind::Dirent,
    BlockKind::Xattr,
    BlockKind::Elements,
];

fn kind_byte(kind: BlockKind) -> u8 {
    BLOCK_KINDS.iter().position(|&k| k == kind).unwrap() as u8
}

/// The `decode_blocks` target: decodes the input as the kind its first byte picks, after
/// fixing the block header, and checks that whatever decodes re-encodes to the same value.
/// Returns whether the decoder accepted the input.
pub fn decode_block(data: &[u8]) -> bool {
    let Some((&selector, bytes)) = data.split_first() else {
        return false;
    };
    match BLOCK_KINDS[selector as usize % BLOCK_KINDS.len()] {
        BlockKind::Superblock => {
            let mut block = framed(bytes, BLOCK);
            // The copy a superblock belongs in follows from its sequence number.
            let seq = u64_at(&block, HEADER_BYTES + 8);
            let address = SUPERBLOCK_OFFSETS[(seq % 2) as usize];
            fix_header(&mut block, address);
            let Ok(sb) = Superblock::decode(&block, address) else {
                return false;
            };
            let again = Superblock::decode(&sb.encode(), address).expect("re-encoded superblock");
            assert_eq!(again, sb);
            true
        }
        kind @ (BlockKind::Leaf | BlockKind::Internal | BlockKind::AnyNode) => {
            let mut block = framed(bytes, NODE_BYTES);
            fix_header(&mut block, FUZZ_NODE_ADDRESS);
            let level = match kind {
                BlockKind::Leaf => Some(0),
                BlockKind::Internal => Some(block[HEADER_BYTES].max(1)),
                _ => None,
            };
            let Ok((node, tid)) = Node::decode(&block, &FUZZ_VOLUME_ID, FUZZ_NODE_ADDRESS, level)
            else {
                return false;
            };
            if let Node::Leaf(leaf) = &node {
                for element in leaf.iter() {
                    decode_record(&element);
                }
            }
            let encoded = node.encode(FUZZ_VOLUME_ID, tid, FUZZ_NODE_ADDRESS);
            let again = Node::decode(&encoded, &FUZZ_VOLUME_ID, FUZZ_NODE_ADDRESS, level)
                .expect("re-encoded node");
            assert_eq!(again, (node, tid));
            true
        }
        BlockKind::Log => {
            let blocks = bytes.len().div_ceil(BLOCK).clamp(1, LOG_BLOCKS_MAX);
            let mut block = framed(bytes, blocks * BLOCK);
            fix_header(&mut block, FUZZ_LOG_ADDRESS);
            let Ok(batch) = LogBatch::decode(&block, &FUZZ_VOLUME_ID, FUZZ_LOG_ADDRESS) else {
                return false;
            };
            let encoded = batch.encode(FUZZ_VOLUME_ID, FUZZ_LOG_ADDRESS);
            let claimed = LogBatch::claimed_bytes(&encoded, u64::MAX);
            assert_eq!(claimed, Some(encoded.len() as u64));
            let again =
                LogBatch::decode(&encoded, &FUZZ_VOLUME_ID, FUZZ_LOG_ADDRESS).expect("re-encoded");
            assert_eq!(again, batch);
            true
        }
        BlockKind::Inode => decode_inode(bytes),
        BlockKind::Dirent => decode_dirent(bytes),
        BlockKind::Xattr => decode_xattr(bytes),
        BlockKind::Elements => {
            let mut reader = Reader::new(bytes, "fuzz elements");
            let mut decoded = 0;
            while let Ok(element) = Element::decode(&mut reader) {
                let mut w = Writer::default();
                element.encode(&mut w);
                assert_eq!(w.len(), element.encoded_bytes());
                let again = Element::decode(&mut Reader::new(&w.bytes, "again")).unwrap();
                assert_eq!(again, element);
                let key = Key::decode(&mut Reader::new(&w.bytes, "key")).unwrap();
                assert_eq!(key, element.key);
                decode_record(&element);
                decoded += 1;
            }
            decoded > 0
        }
    }
}

/// Decodes an inline record payload as the record type of its key says.
fn decode_record(element: &Element) {
    let Payload::Inline(bytes) = &element.payload else {
        return;
    };
    match element.key.rtype {
        rtype::INODE => {
            decode_inode(bytes);
        }
        rtype::DIRENT => {
            decode_dirent(bytes);
        }
        rtype::XATTR => {
            decode_xattr(bytes);
        }
        _ => {}
    }
}

fn decode_inode(bytes: &[u8]) -> bool {
    let Ok(inode) = Inode::decode(bytes) else {
        return false;
    };
    assert_eq!(Inode::decode(&inode.encode()).unwrap(), inode);
    true
}

fn decode_dirent(bytes: &[u8]) -> bool {
    let Ok(dirent) = Dirent::decode(bytes) else {
        return false;
    };
    assert_eq!(Dirent::decode(&dirent.encode()).unwrap(), dirent);
    true
}

fn decode_xattr(bytes: &[u8]) -> bool {
    let Ok(xattr) = Xattr::decode(bytes) else {
        return false;
    };
    let again = Xattr::decode(&xattr.encode()).unwrap();
    assert_eq!((again.name, again.value), (xattr.name, xattr.value));
    true
}

fn options(read_only: bool) -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        read_only,
        cache_bytes: 16 << 20,
        ..Default::default()
    }
}

/// A small volume with every kind of structure: a two-level tree, inline and extent data
/// (compressed and raw), a multi-chunk file, subdirectories, a symlink, a hard link, xattrs,
/// history (an overwrite, a delete, a snapshot) and a redo-log batch after the last commit.
pub fn build_seed_image() -> Vec<u8> {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 16 << 20, "fuzz").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options(false)).unwrap();
    fs.mkdir_path("/d").unwrap();
    fs.mkdir_path("/d/sub").unwrap();
    for i in 0..60usize {
        let len = 100 + (i % 12) * 700;
        fs.write_file(&format!("/d/f{i}"), &vec![i as u8; len])
            .unwrap();
    }
    fs.write_file("/d/sub/big", &noise(100_000)).unwrap();
    let root = ROOT_OBJ;
    fs.symlink(Caller::ROOT, root, b"link", b"d/f1").unwrap();
    let f3 = fs.resolve("/d/f3").unwrap();
    let sub = fs.resolve("/d/sub").unwrap();
    fs.link(f3, sub, b"hard").unwrap();
    fs.setxattr(f3, b"user.colour", b"blue", false, false)
        .unwrap();
    fs.sync().unwrap();
    fs.snapshot("first").unwrap();
    fs.write_file("/d/f5", b"overwritten").unwrap();
    fs.remove_path("/d/f6").unwrap();
    fs.sync().unwrap();
    fs.write_file("/d/f2", b"logged").unwrap();
    fs.write_file("/d/sub/late", &[7u8; 3000]).unwrap();
    fs.fsync(1).unwrap();
    drop(fs);
    device.to_bytes()
}

/// The `open_image_fast` seed image: every kind of structure `build_seed_image` makes, with
/// few objects and little data so that opening, checking and walking it is quick. A
/// two-level tree (inline data overfills one leaf), inline data, an LZ4 extent, a raw
/// extent, a sparse two-chunk file, a small-write patch over an extent, subdirectories, a
/// symlink, a hard link, xattrs, history (an overwrite, a delete, a snapshot) and a
/// redo-log batch after the last commit.
pub fn build_small_image() -> Vec<u8> {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), VOLUME_BYTES_MIN, "fuzz").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options(false)).unwrap();
    fs.mkdir_path("/d").unwrap();
    fs.mkdir_path("/d/sub").unwrap();
    // Inline (incompressible, at most 1,980 bytes each) and more than a leaf holds: the
    // tree splits.
    let noise = noise(12_000);
    for i in 0..9usize {
        let len = 1800 + (i % 3) * 90;
        fs.write_file(&format!("/d/f{i}"), &noise[i * 500..i * 500 + len])
            .unwrap();
    }
    let text: Vec<u8> = b"anvil keeps history. ".repeat(400);
    fs.write_file("/d/text", &text).unwrap();
    fs.write_file("/d/sub/raw", &noise[..6000]).unwrap();
    let big = fs.write_file("/d/sub/big", &noise[6000..]).unwrap();
    fs.write(big, 70_000, &noise[..2000]).unwrap();
    let root = ROOT_OBJ;
    fs.symlink(Caller::ROOT, root, b"link", b"d/f1").unwrap();
    let f3 = fs.resolve("/d/f3").unwrap();
    let sub = fs.resolve("/d/sub").unwrap();
    fs.link(f3, sub, b"hard").unwrap();
    fs.setxattr(f3, b"user.colour", b"blue", false, false)
        .unwrap();
    fs.setxattr(sub, b"user.long", &[b'x'; 600], false, false)
        .unwrap();
    fs.sync().unwrap();
    fs.snapshot("first").unwrap();
    fs.write_file("/d/f5", b"overwritten").unwrap();
    fs.remove_path("/d/f6").unwrap();
    let text_ino = fs.resolve("/d/text").unwrap();
    fs.write(text_ino, 100, b"patched").unwrap();
    fs.sync().unwrap();
    fs.write_file("/d/f2", b"logged").unwrap();
    fs.write_file("/d/sub/late", &[7u8; 3000]).unwrap();
    fs.fsync(1).unwrap();
    drop(fs);
    device.to_bytes()
}

/// `len` bytes of xorshift noise (incompressible, always the same).
fn noise(len: usize) -> Vec<u8> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// A block of the seed image that starts with a block header: where it starts and how many
/// bytes it spans.
#[derive(Clone, Copy, Debug)]
pub struct HeadedBlock {
    pub start: usize,
    pub span: usize,
    pub block_type: u16,
}

/// The seed image of `open_image` (or `open_image_fast`) and the headed blocks in it.
pub struct SeedImage {
    pub image: Vec<u8>,
    pub headed: Vec<HeadedBlock>,
    /// The same bytes as copy-on-write pages: a `MemDevice` over a clone of them costs a
    /// reference per 64 KiB page, and a patch copies only the pages it touches.
    pub pages: Pages,
}

impl SeedImage {
    fn new(image: Vec<u8>) -> SeedImage {
        let headed = headed_blocks(&image);
        let pages = Pages::from_vec(&image);
        SeedImage {
            image,
            headed,
            pages,
        }
    }
}

fn headed_blocks(image: &[u8]) -> Vec<HeadedBlock> {
    let mut out = Vec::new();
    let mut start = 0;
    while start + BLOCK <= image.len() {
        let block = &image[start..];
        if block[..4] != BLOCK_MAGIC.to_le_bytes() {
            start += BLOCK;
            continue;
        }
        let block_type = u16::from_le_bytes([block[6], block[7]]);
        let span =
            if block_type == BlockType::Leaf as u16 || block_type == BlockType::Internal as u16 {
                NODE_BYTES
            } else if block_type == BlockType::Log as u16 {
                LogBatch::claimed_bytes(block, (LOG_BLOCKS_MAX * BLOCK) as u64)
                    .map_or(BLOCK, |b| b as usize)
            } else {
                BLOCK
            };
        let span = span.min(image.len() - start);
        out.push(HeadedBlock {
            start,
            span,
            block_type,
        });
        start += span.div_ceil(BLOCK) * BLOCK;
    }
    out
}

/// Built once per process (it takes a moment) and shared by every run.
pub fn seed_image() -> &'static SeedImage {
    static SEED: OnceLock<SeedImage> = OnceLock::new();
    SEED.get_or_init(|| SeedImage::new(build_seed_image()))
}

/// The `open_image_fast` seed image, built once per process.
pub fn small_seed_image() -> &'static SeedImage {
    static SEED: OnceLock<SeedImage> = OnceLock::new();
    SEED.get_or_init(|| SeedImage::new(build_small_image()))
}

/// A copy-on-write view of the seed image: reads fall through to the shared image, writes
/// (the input's patches, and whatever a read-write mount commits) land in private copies of
/// the blocks they touch. Saves copying (and faulting in) the 16 MiB image on every run.
pub struct PatchedDevice {
    base: &'static [u8],
    blocks: Mutex<HashMap<u64, Box<[u8]>>>,
}

impl PatchedDevice {
    pub fn new(base: &'static [u8]) -> PatchedDevice {
        PatchedDevice {
            base,
            blocks: Mutex::new(HashMap::new()),
        }
    }

    /// Calls `f(block, range in block, range in buf)` for each block `offset..offset+len`
    /// covers, or fails if the range goes past the end.
    fn split(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(u64, std::ops::Range<usize>, std::ops::Range<usize>),
    ) -> io::Result<()> {
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > self.base.len() as u64) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("access at {offset}+{len} beyond device end"),
            ));
        }
        let mut done = 0;
        while done < len {
            let at = offset as usize + done;
            let (block, within) = (at / BLOCK, at % BLOCK);
            let n = (BLOCK - within).min(len - done);
            f(block as u64, within..within + n, done..done + n);
            done += n;
        }
        Ok(())
    }
}

impl Device for PatchedDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let blocks = self.blocks.lock().unwrap();
        self.split(offset, buf.len(), |block, inner, outer| {
            let source = match blocks.get(&block) {
                Some(copy) => &copy[inner],
                None => {
                    let start = block as usize * BLOCK;
                    &self.base[start + inner.start..start + inner.end]
                }
            };
            buf[outer].copy_from_slice(source);
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut blocks = self.blocks.lock().unwrap();
        self.split(offset, buf.len(), |block, inner, outer| {
            let copy = blocks.entry(block).or_insert_with(|| {
                let start = block as usize * BLOCK;
                self.base[start..start + BLOCK].into()
            });
            copy[inner].copy_from_slice(&buf[outer]);
        })
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.base.len() as u64)
    }

    fn set_len(&self, _len: u64) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// Flags in the first byte of an `open_image` input.
pub const OPEN_READ_WRITE: u8 = 1;
/// Patch selectors with this bit address raw 4 KiB blocks (extents, log continuation
/// blocks, free space) instead of headed blocks; such patches are not resealed.
pub const RAW_BLOCK: u16 = 0x8000;

/// Applies the patches of an `open_image` input to a copy-on-write view of the seed image.
/// The input is a flags byte, then patches: `selector: u16 LE, offset: u16 LE, len: u8,
/// bytes[len]`. The selector picks a headed block (modulo their number) or, with
/// `RAW_BLOCK`, a raw block; the offset is taken modulo the block's span. Every patched
/// headed block is resealed afterwards.
pub fn patched_image(data: &[u8]) -> (PatchedDevice, u8) {
    let seed = seed_image();
    let device = PatchedDevice::new(&seed.image);
    let flags = apply_patches(seed, &device, data);
    (device, flags)
}

/// `patched_image` for `open_image_fast`: the input's patches applied to a `MemDevice`
/// sharing the small seed image's pages (copy-on-write).
pub fn patched_small_image(data: &[u8]) -> (MemDevice, u8) {
    let seed = small_seed_image();
    let device = MemDevice::from_pages(seed.pages.clone());
    let flags = apply_patches(seed, &device, data);
    (device, flags)
}

/// Writes the patches of `data` (see `patched_image`) to `device`, a copy of `seed`;
/// returns the flags byte.
fn apply_patches(seed: &SeedImage, device: &dyn Device, data: &[u8]) -> u8 {
    let Some((&flags, mut rest)) = data.split_first() else {
        return 0;
    };
    let mut touched = Vec::new();
    while rest.len() >= 5 {
        let selector = u16::from_le_bytes([rest[0], rest[1]]);
        let offset = u16::from_le_bytes([rest[2], rest[3]]) as usize;
        let len = (rest[4] as usize).min(rest.len() - 5);
        let bytes = &rest[5..5 + len];
        rest = &rest[5 + len..];
        let (start, span) = if selector & RAW_BLOCK != 0 {
            let blocks = seed.image.len() / BLOCK;
            (((selector & !RAW_BLOCK) as usize % blocks) * BLOCK, BLOCK)
        } else {
            let block = seed.headed[selector as usize % seed.headed.len()];
            touched.push(block);
            (block.start, block.span)
        };
        let at = start + offset % span;
        let len = len.min(seed.image.len() - at);
        device.write_at(&bytes[..len], at as u64).unwrap();
    }
    for block in touched {
        let mut bytes = vec![0u8; block.span];
        device.read_at(&mut bytes, block.start as u64).unwrap();
        reseal(&mut bytes);
        device.write_at(&bytes, block.start as u64).unwrap();
    }
    flags
}

/// How much of a volume one run looks at: keeps a run short whatever the image claims.
struct Limits {
    /// Directory entries visited.
    entries: usize,
    /// Bytes read from the start of each file (plus one 4 KiB read at 70,000).
    read_bytes: u32,
    /// Objects whose history is looked at (each history reads many views: the slow part).
    histories: usize,
}

const LIMITS: Limits = Limits {
    entries: 2000,
    read_bytes: 256 << 10,
    histories: 16,
};

/// The small image holds about 25 objects: the fast target visits them all, and looks at
/// the history of the first 8.
const FAST_LIMITS: Limits = Limits {
    entries: 200,
    read_bytes: 128 << 10,
    histories: 8,
};

/// The `open_image` target: patches the seed image, opens it, lists every directory, reads
/// every file, symlink and xattr, looks at history, runs `anvil check` and, with
/// `OPEN_READ_WRITE`, writes and commits. Returns whether the image opened.
pub fn open_image(data: &[u8]) -> bool {
    let (device, flags) = patched_image(data);
    explore(Arc::new(device), flags, &LIMITS)
}

/// The `open_image_fast` target: `open_image` over the small seed image (every kind of
/// structure the big one has, a sixth of the objects), cloned copy-on-write for each input.
/// Same input format. Returns whether the image opened.
pub fn open_image_fast(data: &[u8]) -> bool {
    let (device, flags) = patched_small_image(data);
    explore(Arc::new(device), flags, &FAST_LIMITS)
}

/// Opens `device`, runs `anvil check`, lists every directory, reads every file, symlink and
/// xattr, looks at history and as-of views and, with `OPEN_READ_WRITE`, writes and commits.
fn explore(device: Arc<dyn Device>, flags: u8, limits: &Limits) -> bool {
    let read_only = flags & OPEN_READ_WRITE == 0;
    let Ok(fs) = Filesystem::open(device, options(read_only)) else {
        return false;
    };
    let _ = anvil::check::check(fs.volume());
    let _ = fs.info();
    let _ = fs.statfs();
    let mut queue = VecDeque::from([ROOT_OBJ]);
    let mut seen = HashSet::from([ROOT_OBJ]);
    let mut entries = 0;
    while let Some(dir) = queue.pop_front() {
        let mut cookie = 0;
        'listing: while let Ok(batch) = fs.readdir(dir, cookie, 64) {
            let Some(last) = batch.last() else {
                break;
            };
            cookie = last.cookie;
            for entry in batch {
                entries += 1;
                if entries > limits.entries {
                    break 'listing;
                }
                if entry.name == b"." || entry.name == b".." || !seen.insert(entry.ino) {
                    continue;
                }
                let _ = fs.lookup(dir, &entry.name);
                visit(&fs, entry.ino, entry.kind, &mut queue, limits.read_bytes);
                if seen.len() <= limits.histories {
                    let _ = fs.history(entry.ino);
                }
            }
        }
    }
    if let Ok(commits) = fs.commits() {
        // The oldest and the newest commit, as read-only views.
        for (tid, _) in commits.first().into_iter().chain(commits.last()) {
            if let Ok(view) = fs.at(*tid) {
                if let Ok(names) = view.readdir(ROOT_OBJ, 0, 64) {
                    for entry in names.iter().take(8) {
                        let _ = view.getattr(entry.ino);
                        let _ = view.read(entry.ino, 0, limits.read_bytes);
                        let _ = view.readlink(entry.ino);
                        let _ = view.listxattr(entry.ino);
                    }
                }
            }
        }
    }
    let _ = fs.snapshots();
    if !read_only {
        let _ = fs.write_file("/fuzz-new", b"new file");
        let _ = fs.write(ROOT_OBJ, 0, b"not a file");
        let _ = fs.remove_path("/d/f7");
        let _ = fs.rename_path("/d/f8", "/d/sub/f8");
        let _ = fs.sync();
    }
    let _ = fs.close();
    true
}

fn visit(fs: &Filesystem, ino: u64, kind: FileKind, queue: &mut VecDeque<u64>, read_bytes: u32) {
    let _ = fs.getattr(ino);
    match kind {
        FileKind::Dir => queue.push_back(ino),
        FileKind::Symlink => {
            let _ = fs.readlink(ino);
        }
        _ => {
            let _ = fs.read(ino, 0, read_bytes);
            let _ = fs.read(ino, 70_000, 4096);
        }
    }
    if let Ok(names) = fs.listxattr(ino) {
        for name in names.iter().take(8) {
            let _ = fs.getxattr(ino, name);
        }
    }
}

/// Seed inputs for both targets, as (target, name, bytes). `decode_blocks` seeds are the
/// headed blocks and inline records of the seed image (trailing zeros trimmed: the harness
/// pads them back); `open_image` seeds are a few small patches.
pub fn seed_corpus() -> Vec<(&'static str, String, Vec<u8>)> {
    let seed = seed_image();
    let mut out = Vec::new();
    let trimmed = |bytes: &[u8]| -> Vec<u8> {
        let end = bytes.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        bytes[..end].to_vec()
    };
    let mut per_type = [0usize; 8];
    let mut records = [0usize; 8];
    for block in &seed.headed {
        let bytes = &seed.image[block.start..block.start + block.span];
        let kind = match block.block_type {
            t if t == BlockType::Superblock as u16 => BlockKind::Superblock,
            t if t == BlockType::Leaf as u16 => BlockKind::Leaf,
            t if t == BlockType::Internal as u16 => BlockKind::Internal,
            t if t == BlockType::Log as u16 => BlockKind::Log,
            _ => continue,
        };
        let count = &mut per_type[block.block_type as usize % 8];
        if *count >= 4 {
            continue;
        }
        *count += 1;
        let mut input = vec![kind_byte(kind)];
        input.extend(trimmed(bytes));
        out.push((
            "decode_blocks",
            format!("{kind:?}-{count}").to_lowercase(),
            input,
        ));
        if kind == BlockKind::Leaf {
            let mut any = vec![kind_byte(BlockKind::AnyNode)];
            any.extend(trimmed(bytes));
            out.push(("decode_blocks", format!("anynode-{count}"), any));
            let Ok((Node::Leaf(leaf), _)) =
                Node::decode(bytes, &volume_id_of(bytes), block.start as u64, Some(0))
            else {
                continue;
            };
            let elements = leaf.to_vec();
            let mut stream = vec![kind_byte(BlockKind::Elements)];
            let mut w = Writer::default();
            for element in elements.iter().take(6) {
                element.encode(&mut w);
            }
            stream.extend(w.bytes);
            out.push(("decode_blocks", format!("elements-{count}"), stream));
            for element in &elements {
                let (Payload::Inline(value), kind) = (&element.payload, element.key.rtype) else {
                    continue;
                };
                let block_kind = match kind {
                    rtype::INODE => BlockKind::Inode,
                    rtype::DIRENT => BlockKind::Dirent,
                    rtype::XATTR => BlockKind::Xattr,
                    _ => continue,
                };
                let n = &mut records[kind as usize % 8];
                if *n >= 3 {
                    continue;
                }
                *n += 1;
                let mut input = vec![kind_byte(block_kind)];
                input.extend_from_slice(value);
                out.push((
                    "decode_blocks",
                    format!("{block_kind:?}-{n}").to_lowercase(),
                    input,
                ));
            }
        }
    }
    // open_image: no patch (the image as built), a read-write mount, and one small patch
    // into each kind of headed block (its first payload bytes: counts and lengths).
    // open_image_fast: the same over the small image, with a patch into every headed block.
    for (target, image, every_block) in [
        ("open_image", seed, false),
        ("open_image_fast", small_seed_image(), true),
    ] {
        out.push((target, "unpatched".into(), vec![0]));
        out.push((target, "read-write".into(), vec![OPEN_READ_WRITE]));
        let mut patched_types = HashSet::new();
        for (index, block) in image.headed.iter().enumerate() {
            let first = patched_types.insert(block.block_type);
            if !first && !every_block {
                continue;
            }
            let mut input = vec![0];
            input.extend((index as u16).to_le_bytes());
            input.extend((HEADER_BYTES as u16 + 2).to_le_bytes());
            input.extend([1, 0x01]);
            let name = if every_block {
                format!("patch-type{}-block{index}", block.block_type)
            } else {
                format!("patch-type{}", block.block_type)
            };
            out.push((target, name, input));
        }
    }
    out
}

fn volume_id_of(block: &[u8]) -> VolumeId {
    block[VOLUME_ID_AT..VOLUME_ID_AT + 16].try_into().unwrap()
}

/// One allocation larger than this aborts: hostile bytes must not make the engine allocate
/// without bound. Under AddressSanitizer libFuzzer's `-malloc_limit_mb` checks the same,
/// but `scripts/fuzz-count.sh` builds without a sanitizer (see `docs/fuzzing.md`), where
/// nothing else would notice a huge allocation that is never touched.
pub const ALLOCATION_BYTES_MAX: usize = 256 << 20;

/// The system allocator with a size check: an allocation over `ALLOCATION_BYTES_MAX` calls
/// the function given (which reports and aborts). The fuzz targets and the regression test
/// each install one as their global allocator.
pub struct Capped(pub fn(usize) -> !);

// SAFETY: forwards to the system allocator unchanged, after a size check.
unsafe impl std::alloc::GlobalAlloc for Capped {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_BYTES_MAX {
            (self.0)(layout.size());
        }
        // SAFETY: the caller's contract is System's.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        if layout.size() > ALLOCATION_BYTES_MAX {
            (self.0)(layout.size());
        }
        // SAFETY: as above.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOCATION_BYTES_MAX {
            (self.0)(new_size);
        }
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}
