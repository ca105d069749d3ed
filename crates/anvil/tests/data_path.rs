//! The data path: codecs chosen per directory and recorded per extent, every version
//! readable byte for byte after small overwrites, and the extent cache serving repeated
//! reads, through the library.

use anvil::device::{Device, MemDevice};
use anvil::format::record::compression;
use anvil::{Filesystem, MountOptions};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::sync::Arc;

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

fn text(bytes: usize, seed: u64) -> Vec<u8> {
    let words: [&[u8]; 6] = [
        b"anvil ",
        b"keeps ",
        b"history ",
        b"of ",
        b"every ",
        b"file\n",
    ];
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut out = Vec::with_capacity(bytes + 16);
    while out.len() < bytes {
        out.extend_from_slice(words[rng.gen_range(0..words.len())]);
    }
    out.truncate(bytes);
    out
}

fn assert_clean(fs: &Filesystem) {
    let report = anvil::check::check(fs.volume()).unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn codecs_per_directory_and_mixed_volumes() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "codecs").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let zdir = fs.mkdir_path("/z").unwrap();
    fs.set_compression(zdir, Some(compression::ZSTD)).unwrap();
    let raw_dir = fs.mkdir_path("/raw").unwrap();
    fs.set_compression(raw_dir, Some(compression::NONE))
        .unwrap();
    assert_eq!(fs.compression(zdir).unwrap(), Some(compression::ZSTD));
    assert_eq!(
        fs.compression(anvil::format::record::ROOT_OBJ).unwrap(),
        None
    );

    let a = text(256 << 10, 1);
    let b = text(256 << 10, 2);
    let zfile = fs.write_file("/z/f", &a).unwrap();
    fs.mkdir_path("/z/sub").unwrap();
    fs.write_file("/z/sub/g", &a).unwrap();
    fs.write_file("/l", &a).unwrap();
    fs.write_file("/raw/f", &a).unwrap();
    assert_eq!(
        fs.compression(zfile).unwrap(),
        Some(compression::ZSTD),
        "inherited"
    );
    let first = fs.sync().unwrap();

    let split = fs.space_split().unwrap();
    let [raw, lz4, zstd] = split.extents_by_codec;
    assert_eq!((raw, lz4, zstd), (4, 4, 8), "{split:?}");
    assert!(split.extent_logical_bytes > split.extent_allocated_bytes);

    // Switch the directory to LZ4: new data takes it, old data keeps zstd and stays readable.
    fs.set_compression(zdir, Some(compression::LZ4)).unwrap();
    fs.write_file("/z/h", &b).unwrap();
    let file = fs.resolve("/z/f").unwrap();
    fs.write(file, 65536, &b[..65536]).unwrap();
    let second = fs.sync().unwrap();
    let mut expected = a.clone();
    expected[65536..131072].copy_from_slice(&b[..65536]);

    let check_all = |fs: &Filesystem| {
        assert_eq!(fs.read_file("/z/f").unwrap(), expected);
        assert_eq!(fs.read_file("/z/h").unwrap(), b);
        assert_eq!(fs.read_file("/raw/f").unwrap(), a);
        assert_eq!(fs.at(first).unwrap().read_file("/z/f").unwrap(), a);
        assert_eq!(fs.at(second).unwrap().read_file("/z/f").unwrap(), expected);
        assert_clean(fs);
    };
    check_all(&fs);
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    check_all(&fs);
    assert_eq!(fs.compression(zdir).unwrap(), Some(compression::LZ4));
}

#[test]
fn every_version_reads_back_after_small_overwrites() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "small").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(11);
    let mut content = text(1 << 20, 3);
    let ino = fs.write_file("/f", &content).unwrap();
    let mut versions = vec![(fs.sync().unwrap(), content.clone())];
    for round in 0..40 {
        // One to three 4 KiB writes per commit, some across a chunk boundary, some past the
        // end of the file.
        for _ in 0..rng.gen_range(1..=3) {
            let at = rng.gen_range(0..content.len() as u64 + 8192);
            let piece = text(4096, 100 + round);
            fs.write(ino, at, &piece).unwrap();
            let end = at as usize + piece.len();
            if content.len() < end {
                content.resize(end, 0);
            }
            content[at as usize..end].copy_from_slice(&piece);
        }
        versions.push((fs.sync().unwrap(), content.clone()));
    }
    let check_all = |fs: &Filesystem| {
        for (tid, bytes) in &versions {
            assert_eq!(
                &fs.at(*tid).unwrap().read_file("/f").unwrap(),
                bytes,
                "TID {tid}"
            );
        }
        assert_eq!(&fs.read_file("/f").unwrap(), &versions.last().unwrap().1);
    };
    check_all(&fs);
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    check_all(&fs);
    assert_clean(&fs);
}

#[test]
fn repeated_reads_come_from_the_extent_cache() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "cache").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    let content = text(1 << 20, 5);
    let ino = fs.write_file("/f", &content).unwrap();
    fs.sync().unwrap();
    fs.volume().drop_caches();
    let before = fs.volume().cache_stats();
    // Sixteen 4 KiB reads inside each of the file's chunks, back to front (so read-ahead,
    // which follows forward reads, stays out): one miss per chunk.
    for offset in (0..content.len() as u64 / 4096)
        .rev()
        .map(|page| page * 4096)
    {
        let got = fs.read(ino, offset, 4096).unwrap();
        assert_eq!(got, &content[offset as usize..offset as usize + 4096]);
    }
    let after = fs.volume().cache_stats();
    let misses = after.extent_misses - before.extent_misses;
    let hits = after.extent_hits - before.extent_hits;
    assert_eq!(misses, 16, "one miss per 64 KiB chunk");
    assert_eq!(hits, 256 - 16);
    assert!(after.bytes <= after.budget_bytes);
}

/// A read inside one chunk is served from that chunk's bytes, whether this read holds the
/// only reference to them (a chunk read whole, which the cache does not keep) or shares
/// them (a chunk the cache keeps, or one still in memory), at its start or inside it.
#[test]
fn reads_inside_one_chunk_return_exactly_their_bytes() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "single").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    let content = text(3 * 65536 + 5000, 11);
    let small = text(3000, 12);
    let ino = fs.write_file("/f", &content).unwrap();
    let small_ino = fs.write_file("/small", &small).unwrap();
    // In memory first (pending), then from the device with the caches dropped.
    for cold in [false, true] {
        if cold {
            fs.sync().unwrap();
            fs.volume().drop_caches();
        }
        for (at, len) in [
            (0u64, 65536u32), // a whole chunk: read whole, not kept
            (65536, 65536),
            (3 * 65536, 65536),   // the last chunk, past the end of the file
            (65536 + 100, 65436), // to a chunk's end from inside it
            (2 * 65536 + 7, 10),  // inside a chunk, now kept by the cache
            (2 * 65536, 1),
            (65000, 1000), // across two chunks
        ] {
            let want = &content[at as usize..(at as usize + len as usize).min(content.len())];
            assert_eq!(fs.read(ino, at, len).unwrap(), want, "{len} at {at}");
        }
        assert_eq!(fs.read(small_ino, 0, 65536).unwrap(), small);
        assert_eq!(fs.read(small_ino, 1000, 10).unwrap(), &small[1000..1010]);
        assert_eq!(fs.read(small_ino, 2999, 10).unwrap(), &small[2999..]);
        assert!(fs.read(small_ino, 3000, 10).unwrap().is_empty());
    }
}

/// Random writes (mostly small overwrites, which become patches), truncations and commits
/// against a byte-vector model; every committed version must read back exactly, across a
/// reopen, and `check` must find every patch over its chunk.
fn random_writes_match_the_model(nohistory: bool, seed: u64) {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 256 << 20, "model").unwrap();
    let opts = MountOptions {
        nohistory,
        ..options()
    };
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, opts.clone()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut model = text(600 << 10, seed);
    let ino = fs.write_file("/f", &model).unwrap();
    let mut versions = vec![(fs.sync().unwrap(), model.clone())];
    for step in 0..400u64 {
        match rng.gen_range(0..100) {
            0..=69 => {
                // A small write, page-aligned or not, mostly inside the file.
                let len = if rng.gen_bool(0.7) {
                    4096
                } else {
                    rng.gen_range(1..9000)
                };
                let at = if rng.gen_bool(0.25) {
                    model.len() as u64 // an append
                } else if rng.gen_bool(0.6) {
                    rng.gen_range(0..model.len() as u64 / 4096 + 1) * 4096
                } else {
                    rng.gen_range(0..model.len() as u64 + 5000)
                };
                let piece = text(len, step);
                fs.write(ino, at, &piece).unwrap();
                let end = at as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[at as usize..end].copy_from_slice(&piece);
            }
            70..=79 => {
                let len = rng.gen_range(60_000..200_000);
                let at = rng.gen_range(0..model.len() as u64);
                let piece = text(len, step + 1000);
                fs.write(ino, at, &piece).unwrap();
                let end = at as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[at as usize..end].copy_from_slice(&piece);
            }
            80..=84 => {
                let size = rng.gen_range(0..model.len() as u64 + 70_000);
                let changes = anvil::SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                fs.setattr(ino, &changes).unwrap();
                model.resize(size as usize, 0);
            }
            _ => versions.push((fs.sync().unwrap(), model.clone())),
        }
        if step % 50 == 0 {
            assert_eq!(
                fs.read_file("/f").unwrap(),
                model,
                "step {step}, pending state"
            );
        }
        // A read of a few bytes to a few chunks, often inside one chunk (from memory, the
        // cache or the device), at its start or not, past the end sometimes.
        let at = rng.gen_range(0..model.len() as u64 + 100);
        let len = match rng.gen_range(0..3) {
            0 => rng.gen_range(1..4096),
            1 => 65536 - (at % 65536) as u32,
            _ => rng.gen_range(1..200_000),
        };
        let want = model
            .get(at as usize..)
            .map_or(&[][..], |rest| &rest[..rest.len().min(len as usize)]);
        assert_eq!(
            fs.read(ino, at, len).unwrap(),
            want,
            "step {step}: {len} at {at}"
        );
    }
    versions.push((fs.sync().unwrap(), model.clone()));
    if nohistory {
        versions.clear();
    }
    assert_every_version(fs, device, opts, "/f", &model, &versions);
}

/// `path` reads `current` and, as of each TID of `versions`, what it held then; the volume
/// checks clean; and all of it again after a close and a reopen.
fn assert_every_version(
    fs: Filesystem,
    device: Arc<MemDevice>,
    opts: MountOptions,
    path: &str,
    current: &[u8],
    versions: &[(u64, Vec<u8>)],
) {
    let check_all = |fs: &Filesystem| {
        assert!(
            fs.read_file(path).unwrap() == current,
            "current contents differ"
        );
        for (tid, bytes) in versions {
            let got = fs.at(*tid).unwrap().read_file(path).unwrap();
            assert!(&got == bytes, "TID {tid}: as-of read differs");
        }
        assert_clean(fs);
    };
    check_all(&fs);
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, opts).unwrap();
    check_all(&fs);
}

#[test]
fn random_writes_with_history_match_the_model() {
    for seed in 0..3 {
        random_writes_match_the_model(false, seed);
    }
}

#[test]
fn random_writes_without_history_match_the_model() {
    for seed in 10..13 {
        random_writes_match_the_model(true, seed);
    }
}

#[test]
fn a_small_overwrite_stores_only_its_pages() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "patch").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(9);
    // Incompressible, so stored sizes are what was written.
    let content: Vec<u8> = (0..(1 << 20)).map(|_| rng.gen()).collect();
    let ino = fs.write_file("/f", &content).unwrap();
    fs.sync().unwrap();
    let before = fs.space_split().unwrap();
    for round in 0..4u64 {
        let page: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
        fs.write(ino, round * 65536 * 3 + 8192, &page).unwrap();
        fs.sync().unwrap();
    }
    let after = fs.space_split().unwrap();
    // Four 4 KiB patches, where rewriting chunks would have cost four 64 KiB extents (the
    // chunks themselves stay live, under their patches).
    let grown = after.extent_allocated_bytes - before.extent_allocated_bytes;
    assert_eq!(grown, 4 * 4096, "{before:?} -> {after:?}");
    assert_eq!(after.extents_by_codec.iter().sum::<u64>(), 16 + 4);
    assert_clean(&fs);
}

/// Appends to a file whose last chunk is stored store only the pages they touch, as
/// patches that extend the chunk; every version reads back, also after a reopen, and a
/// truncate in between leaves nothing of the cut bytes behind.
#[test]
fn appends_store_only_the_pages_they_touch() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "append").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(33);
    // Random bytes: the chunk is one extent of its own size, not compressed away.
    let mut content: Vec<u8> = (0..(65536 + 30_000)).map(|_| rng.gen()).collect();
    let ino = fs.write_file("/log", &content).unwrap();
    let mut versions = vec![(fs.sync().unwrap(), content.clone())];
    let before = fs.space_split().unwrap();
    for round in 0..6u64 {
        // A few appends per commit, as a log gets lines.
        for _ in 0..3 {
            let line: Vec<u8> = (0..rng.gen_range(100..1500)).map(|_| rng.gen()).collect();
            fs.write(ino, content.len() as u64, &line).unwrap();
            content.extend_from_slice(&line);
        }
        if round == 3 {
            // Cut into the appended bytes, then write past the cut: zeros in between.
            let cut = content.len() as u64 - 700;
            let changes = anvil::SetAttr {
                size: Some(cut),
                ..Default::default()
            };
            fs.setattr(ino, &changes).unwrap();
            content.truncate(cut as usize);
            fs.write(ino, cut + 300, b"after the hole").unwrap();
            content.resize(cut as usize + 300, 0);
            content.extend_from_slice(b"after the hole");
        }
        versions.push((fs.sync().unwrap(), content.clone()));
        assert_eq!(fs.read_file("/log").unwrap(), content, "round {round}");
    }
    let after = fs.space_split().unwrap();
    // Rewriting the 30 KB chunk at every commit would have cost 6 new extents of 30 KB or
    // more; the patches take a few pages in all.
    let grown = after.extent_allocated_bytes - before.extent_allocated_bytes;
    assert!(grown <= 8 * 4096, "{before:?} -> {after:?}");
    assert!(live_patches(&fs, ino, 1).0 > 0);
    assert_every_version(fs, device, options(), "/log", &content, &versions);
}

/// A patch that covers older patches of its chunk whole ends them in its own TID: a page
/// rewritten with its neighbour, and a log appended to a line at a time, keep one live
/// patch instead of heading for a fold, and every TID still reads what it held.
#[test]
fn a_patch_covering_older_ones_ends_them() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "supersede").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(41);
    let mut content: Vec<u8> = (0..(65536 + 30_000)).map(|_| rng.gen()).collect();
    let ino = fs.write_file("/f", &content).unwrap();
    let mut versions = vec![(fs.sync().unwrap(), content.clone())];
    let mut write = |content: &mut Vec<u8>, at: usize, len: usize| {
        let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        fs.write(ino, at as u64, &bytes).unwrap();
        if content.len() < at + len {
            content.resize(at + len, 0);
        }
        content[at..at + len].copy_from_slice(&bytes);
    };
    // Page 1 of chunk 1, then pages 1 and 2: the second covers the first.
    write(&mut content, 65536 + 4096, 4096);
    versions.push((fs.sync().unwrap(), content.clone()));
    write(&mut content, 65536 + 4096, 8192);
    versions.push((fs.sync().unwrap(), content.clone()));
    assert_eq!(live_patches(&fs, ino, 1).0, 1);
    // Lines appended, a commit after each, from byte 30,000 of the chunk (page 7) into
    // page 9: the patch that crosses into a page covers the one before it, which ends.
    for _ in 0..12 {
        let at = content.len();
        write(&mut content, at, 700);
        versions.push((fs.sync().unwrap(), content.clone()));
    }
    let (live, _) = live_patches(&fs, ino, 1);
    eprintln!("live patches after the appends: {live}");
    assert!(live <= 4, "{live} live patches");
    assert_every_version(fs, device, options(), "/f", &content, &versions);
}

/// Live PATCH records of chunk `index` of `ino`, and the pages they cover together.
fn live_patches(fs: &Filesystem, ino: u64, index: u64) -> (usize, u32) {
    use anvil::format::record::{patch, rtype};
    let (lo, hi) = patch::key_range(index, index);
    let found = fs
        .volume()
        .run(false, |tx| {
            tx.range_versions(ino, rtype::PATCH, lo, hi, usize::MAX)
        })
        .unwrap();
    let pages = found
        .iter()
        .map(|(key, _, _)| patch::split(*key).1.count_ones())
        .sum();
    (found.len(), pages)
}

/// A volume whose file "/f" (128 KiB) has chunk 1 damaged on the device and then rewritten
/// in two halves, in two commits, as the kernel's writeback sends 1 MiB writes that start
/// inside a chunk: two patches that cover it whole. Returns the file system, the file and
/// its contents.
fn damaged_chunk_rewritten_in_halves(
    seed: u64,
    thread_start: Option<fn()>,
) -> (Filesystem, u64, Vec<u8>) {
    let (fs, ino, mut content, mut rng) = damaged_chunk(seed, thread_start);
    let new_half: Vec<u8> = (0..32768).map(|_| rng.gen()).collect();
    fs.write(ino, 65536 + 32768, &new_half).unwrap();
    content[65536 + 32768..].copy_from_slice(&new_half);
    // Committed in between: in one group the second half would widen the first half's
    // patch into the whole chunk, which replaces the chunk at once.
    fs.sync().unwrap();
    let new_half: Vec<u8> = (0..32768).map(|_| rng.gen()).collect();
    fs.write(ino, 65536, &new_half).unwrap();
    content[65536..65536 + 32768].copy_from_slice(&new_half);
    (fs, ino, content)
}

/// A committed volume holding "/f" (128 KiB): its image, the file, its contents, the
/// device offset of the file's chunk 1, and the random source.
fn two_chunk_file(seed: u64) -> (Vec<u8>, u64, Vec<u8>, u64, Xoshiro256PlusPlus) {
    use anvil::format::record::rtype;
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "cover").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let content: Vec<u8> = (0..(128 << 10)).map(|_| rng.gen()).collect();
    let ino = fs.write_file("/f", &content).unwrap();
    fs.sync().unwrap();
    let mut old_chunk = None;
    fs.volume()
        .scan(&mut |e| {
            if e.key.obj == ino && e.key.rtype == rtype::DATA && e.key.key == 2 * 65536 {
                if let Some(extent) = e.extent() {
                    old_chunk = Some(extent.offset);
                }
            }
            true
        })
        .unwrap();
    let old_chunk = old_chunk.expect("chunk 1 is an extent");
    fs.close().unwrap();
    drop(fs);
    (device.to_bytes(), ino, content, old_chunk, rng)
}

/// A volume whose file "/f" (128 KiB) has chunk 1 damaged on the device: any read of the
/// old chunk fails its checksum. Returns the file system, the file, its contents (chunk 1
/// as it was written) and the random source.
fn damaged_chunk(
    seed: u64,
    thread_start: Option<fn()>,
) -> (Filesystem, u64, Vec<u8>, Xoshiro256PlusPlus) {
    let (mut image, ino, content, old_chunk, rng) = two_chunk_file(seed);
    image[old_chunk as usize + 1000] ^= 0x20;
    let fs = Filesystem::open(
        Arc::new(MemDevice::from_bytes(image)) as Arc<dyn Device>,
        MountOptions {
            background_thread_start: thread_start,
            ..options()
        },
    )
    .unwrap();
    (fs, ino, content, rng)
}

/// A test device over memory that counts the reads touching `watch` (every read when
/// None) and all write requests, and whose next flush, once `armed`, waits for `release`
/// (a commit held after it wrote its nodes, before it is published).
#[derive(Default)]
struct Probe {
    inner: MemDevice,
    watch: Option<std::ops::Range<u64>>,
    reads: std::sync::atomic::AtomicU64,
    writes: std::sync::atomic::AtomicU64,
    armed: std::sync::atomic::AtomicBool,
    state: std::sync::Mutex<(bool, bool)>, // (a flush is held, released)
    changed: std::sync::Condvar,
}

impl Probe {
    fn watching(image: Vec<u8>, watch: std::ops::Range<u64>) -> Probe {
        Probe {
            inner: MemDevice::from_bytes(image),
            watch: Some(watch),
            ..Probe::default()
        }
    }

    /// Waits until the armed flush is held.
    fn wait_held(&self) {
        let mut state = self.state.lock().unwrap();
        while !state.0 {
            state = self.changed.wait(state).unwrap();
        }
    }

    fn release(&self) {
        self.state.lock().unwrap().1 = true;
        self.changed.notify_all();
    }
}

impl Device for Probe {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset + buf.len() as u64;
        if self
            .watch
            .as_ref()
            .is_none_or(|w| offset < w.end && end > w.start)
        {
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> std::io::Result<()> {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> std::io::Result<()> {
        if self.armed.swap(false, std::sync::atomic::Ordering::AcqRel) {
            let mut state = self.state.lock().unwrap();
            state.0 = true;
            self.changed.notify_all();
            while !state.1 {
                state = self.changed.wait(state).unwrap();
            }
        }
        self.inner.flush()
    }
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.inner.set_len(len)
    }
}

/// While a commit is being written, readers still walk the tree it replaces: the nodes it
/// rewrites stay in the cache until the new root is published, so a lookup made meanwhile
/// reads nothing from the device. (Dropped as the commit rewrote them, every writer that
/// walked a changed path during a commit read the old node back.)
#[test]
fn nodes_a_commit_replaces_stay_cached_until_it_is_published() {
    use std::sync::atomic::Ordering;
    let device = Arc::new(Probe::default());
    Filesystem::mkfs(device.clone(), 64 << 20, "gate").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    fs.mkdir_path("/d").unwrap();
    let names: Vec<String> = (0..3000).map(|i| format!("/d/file-{i:05}")).collect();
    let inos: Vec<u64> = names
        .iter()
        .map(|name| fs.write_file(name, name.as_bytes()).unwrap())
        .collect();
    fs.sync().unwrap();
    // Every leaf of inodes gets a change.
    for &ino in inos.iter().step_by(7) {
        fs.write(ino, 0, b"changed").unwrap();
    }
    // Everything the lookups below walk is cached before the commit starts.
    for name in &names {
        fs.getattr(fs.resolve(name).unwrap()).unwrap();
    }
    device.armed.store(true, Ordering::Release);
    std::thread::scope(|scope| {
        let commit = scope.spawn(|| fs.sync().unwrap());
        device.wait_held();
        device.reads.store(0, Ordering::Relaxed);
        for name in &names {
            fs.getattr(fs.resolve(name).unwrap()).unwrap();
        }
        let reads = device.reads.load(Ordering::Relaxed);
        device.release();
        commit.join().unwrap();
        assert_eq!(reads, 0, "lookups during the commit read the device");
    });
    for name in &names {
        fs.getattr(fs.resolve(name).unwrap()).unwrap();
    }
    fs.close().unwrap();
}

/// A commit that empties most of its leaves merges them, dropping nodes it has just built
/// beside the ones it keeps; its nodes still go to the device in one request, with its
/// space map (then the superblock: two requests, three if its nodes took two arenas). The
/// blocks of the dropped nodes are written over instead of splitting the run into a
/// request per piece.
#[test]
fn a_commit_that_drops_nodes_it_built_writes_them_in_one_run() {
    use std::sync::atomic::Ordering;
    let device = Arc::new(Probe::default());
    Filesystem::mkfs(device.clone(), 64 << 20, "runs").unwrap();
    let fs = Filesystem::open(
        device.clone() as Arc<dyn Device>,
        MountOptions {
            nohistory: true,
            ..options()
        },
    )
    .unwrap();
    fs.mkdir_path("/d").unwrap();
    let names: Vec<String> = (0..3000).map(|i| format!("/d/file-{i:05}")).collect();
    for name in &names {
        fs.write_file(name, name.as_bytes()).unwrap();
    }
    fs.sync().unwrap();
    // Four of every five names go: every leaf is left under a third full.
    for (i, name) in names.iter().enumerate() {
        if i % 5 != 0 {
            fs.remove_path(name).unwrap();
        }
    }
    let before = device.writes.load(Ordering::Relaxed);
    fs.sync().unwrap();
    let requests = device.writes.load(Ordering::Relaxed) - before;
    assert!(requests <= 3, "{requests} write requests for one commit");
    for (i, name) in names.iter().enumerate() {
        assert_eq!(fs.resolve(name).is_ok(), i % 5 == 0, "{name}");
    }
    assert_clean(&fs);
    fs.close().unwrap();
}

/// Writes 4 KiB pages of chunk 1 of `ino`, in `order`, into `content` as well.
fn write_pages(
    fs: &Filesystem,
    ino: u64,
    content: &mut [u8],
    order: &[usize],
    rng: &mut Xoshiro256PlusPlus,
) {
    for &page in order {
        let bytes: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
        let at = 65536 + page * 4096;
        fs.write(ino, at as u64, &bytes).unwrap();
        content[at..at + 4096].copy_from_slice(&bytes);
    }
}

/// Random 4 KiB overwrites that end up rewriting a chunk whole never read the old chunk:
/// in one group the pages become the chunk as the last one arrives (no patch left, nothing
/// to fold); over several commits, the patches are left alone until together they cover
/// the chunk, and the fold that asks for then reads only them. (Folding at half a chunk,
/// as before, read the old chunk and wrote it again.) Every committed version reads back.
#[test]
fn a_chunk_rewritten_page_by_page_never_reads_the_old_chunk() {
    use rand::seq::SliceRandom;
    for (seed, pages_per_commit) in [(7, 16), (8, 4), (9, 3)] {
        let (image, ino, mut content, old_chunk, mut rng) = two_chunk_file(seed);
        let device = Arc::new(Probe::watching(image, old_chunk..old_chunk + 65536));
        let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
        fs.volume().drop_caches();
        let mut versions = Vec::new();
        let mut order: Vec<usize> = (0..16).collect();
        order.shuffle(&mut rng);
        for (i, pages) in order.chunks(pages_per_commit).enumerate() {
            write_pages(&fs, ino, &mut content, pages, &mut rng);
            if i == 0 && pages_per_commit == 16 {
                assert_eq!(live_patches(&fs, ino, 1), (0, 0), "the chunk, replaced");
            }
            versions.push((fs.sync().unwrap(), content.clone()));
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while live_patches(&fs, ino, 1).0 > 0 {
            assert!(std::time::Instant::now() < deadline, "not folded");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        fs.volume().drop_caches();
        assert_eq!(fs.read_file("/f").unwrap(), content);
        let reads = device.reads.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            reads, 0,
            "{pages_per_commit} pages a commit: the old chunk was read"
        );
        // Versions in between need the old chunk under their patches.
        for (tid, bytes) in &versions {
            assert_eq!(&fs.at(*tid).unwrap().read_file("/f").unwrap(), bytes);
        }
        fs.close().unwrap();
    }
}

/// The fold makes a chunk its patches cover whole from the patches alone, without reading
/// the old chunk (made unreadable on purpose).
#[test]
fn a_chunk_its_patches_cover_is_folded_without_reading_it() {
    let (fs, ino, content) = damaged_chunk_rewritten_in_halves(5, None);
    fs.sync().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while live_patches(&fs, ino, 1).0 > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "not folded (the fold read the damaged chunk?)"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(fs.read_file("/f").unwrap(), content);
    fs.close().unwrap();
}

/// Holds the engine's background threads (folds, read-ahead) until `BACKGROUND_GO`, at
/// most five seconds.
static BACKGROUND_GO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
fn background_waits() {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !BACKGROUND_GO.load(std::sync::atomic::Ordering::Acquire)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A read of a chunk its patches cover whole, before any fold, needs only the patches: the
/// old chunk (unreadable here) is not read, while the patches are in memory and once they
/// are committed.
#[test]
fn a_chunk_its_patches_cover_is_read_without_reading_it() {
    let (fs, ino, content) = damaged_chunk_rewritten_in_halves(6, Some(background_waits));
    assert_eq!(live_patches(&fs, ino, 1).1, 16, "not folded yet");
    assert_eq!(fs.read_file("/f").unwrap(), content);
    fs.sync().unwrap();
    fs.volume().drop_caches();
    assert_eq!(live_patches(&fs, ino, 1).1, 16, "not folded yet");
    assert_eq!(fs.read_file("/f").unwrap(), content);
    BACKGROUND_GO.store(true, std::sync::atomic::Ordering::Release);
    fs.close().unwrap();
}

/// Past the soft bounds a small write still stores a patch and the chunk is folded in the
/// background; contents stay exact at every TID; the hard bound is never passed.
#[test]
fn patched_chunks_are_folded_in_the_background() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 64 << 20, "fold").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(21);
    let mut content: Vec<u8> = (0..(256 << 10)).map(|_| rng.gen()).collect();
    let ino = fs.write_file("/f", &content).unwrap();
    let mut versions = vec![(fs.sync().unwrap(), content.clone())];
    // One page of chunk 1 per commit, cycling through all 16: unfolded, the patches would
    // cover the whole chunk after 16 rounds. When folds run (in the background, so how
    // many patches a check sees depends on timing) is not asserted; that they run, and
    // that the hard bound holds at every step, is.
    for round in 0..40u64 {
        let page: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
        let at = 65536 + (round * 5 % 16) * 4096;
        fs.write(ino, at, &page).unwrap();
        content[at as usize..at as usize + 4096].copy_from_slice(&page);
        versions.push((fs.sync().unwrap(), content.clone()));
        let (live, _) = live_patches(&fs, ino, 1);
        assert!(
            live <= 16,
            "round {round}: {live} patches, past the hard bound"
        );
    }
    // Folded back under the soft bounds soon after the last write.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (live, pages) = live_patches(&fs, ino, 1);
        if live <= 8 && pages <= 8 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not folded: {live} patches over {pages} pages"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(fs.read_file("/f").unwrap(), content);
    fs.close().unwrap();
    drop(fs);
    let fs = Filesystem::open(device as Arc<dyn Device>, options()).unwrap();
    for (tid, bytes) in &versions {
        assert_eq!(
            &fs.at(*tid).unwrap().read_file("/f").unwrap(),
            bytes,
            "TID {tid}"
        );
    }
    assert_clean(&fs);
}

/// With a crash log file, an fsync copies what the image's log region lacks into it, unless
/// that is more than 1 MiB: then it commits, and the data is written once, in place. (Whole
/// chunks are written ahead and logged by address, so it takes writes of parts of chunks
/// to log that much.)
#[test]
fn a_large_fsync_commits_and_a_small_one_copies_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let options = MountOptions {
        crash_log_file: Some(dir.path().join("crash.log")),
        ..options()
    };
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 1 << 30, "fsync").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, options).unwrap();
    let before = fs.info().committed_tid;
    fs.write_file("/small", b"a few bytes").unwrap();
    let ino = fs.resolve("/small").unwrap();
    fs.fsync(ino).unwrap();
    assert_eq!(
        fs.info().committed_tid,
        before,
        "a small fsync copies the log"
    );
    assert!(fs.info().pending_bytes > 0);
    let commits = |fs: &Filesystem| {
        let info = fs.info();
        let count = |name: &str| info.engine.iter().find(|(n, _)| *n == name).unwrap().1;
        count("commits")
    };
    assert_eq!(commits(&fs), 0, "anvil info counts no commit yet");
    fs.write_file("/big", b"").unwrap();
    let ino = fs.resolve("/big").unwrap();
    let big = text(1_500_000, 1);
    for (i, piece) in big.chunks(40_000).enumerate() {
        fs.write(ino, i as u64 * 40_000, piece).unwrap();
    }
    fs.fsync(ino).unwrap();
    assert!(fs.info().committed_tid > before, "a large fsync commits");
    assert!(commits(&fs) >= 1, "and anvil info counts it");
    assert!(fs.info().to_json().contains("\"engine\":{\"commits\":"));
    assert_eq!(fs.info().pending_bytes, 0);
    assert_eq!(fs.read_file("/big").unwrap(), text(1_500_000, 1));
    assert_clean(&fs);
}

/// Whole chunks go to the device when they are written, and the log names them: an fsync
/// copies a few addresses, the commit links the extents without writing them again, and a
/// process killed before the commit loses none of them.
#[test]
fn whole_chunks_are_written_once_ahead_of_their_commit() {
    let dir = tempfile::tempdir().unwrap();
    let options = MountOptions {
        crash_log_file: Some(dir.path().join("crash.log")),
        ..options()
    };
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 1 << 30, "ahead").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options.clone()).unwrap();
    let before = fs.info().committed_tid;
    let content = text(4 << 20, 7);
    fs.write_file("/f", &content).unwrap();
    assert!(
        fs.info().pending_bytes < 64 * 1024,
        "the chunks are not held in memory: {}",
        fs.info().pending_bytes
    );
    let ino = fs.resolve("/f").unwrap();
    fs.fsync(ino).unwrap();
    assert_eq!(
        fs.info().committed_tid,
        before,
        "the fsync copies addresses"
    );
    assert_eq!(fs.read_file("/f").unwrap(), content);
    // Overwrite half of it in the same group: the first extents never reach the tree.
    let half = text(2 << 20, 8);
    fs.write(ino, 1 << 20, &half).unwrap();
    let mut expected = content.clone();
    expected[1 << 20..3 << 20].copy_from_slice(&half);
    // Killed: the image and the crash log file as the process left them.
    let image = device.pages();
    let killed = dir.path().join("killed.log");
    std::fs::copy(dir.path().join("crash.log"), &killed).unwrap();
    drop(fs);
    let device = Arc::new(MemDevice::from_pages(image));
    let options = MountOptions {
        crash_log_file: Some(killed),
        ..options
    };
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options).unwrap();
    assert_eq!(fs.read_file("/f").unwrap(), expected);
    assert_clean(&fs);
    let used = fs.info().used_bytes;
    let tid = fs.sync().unwrap();
    assert_eq!(fs.at(tid).unwrap().read_file("/f").unwrap(), expected);
    assert!(
        fs.info().used_bytes < used + (5 << 20),
        "replaced extents are freed: {} then {}",
        used,
        fs.info().used_bytes
    );
    assert_clean(&fs);
}

/// Extents written ahead of a commit that does not link them count as free in the space
/// map that commit writes: after a power loss nothing refers to them.
#[test]
fn extents_written_ahead_are_free_in_other_commits_maps() {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 1 << 30, "ahead").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let chunk = text(65_536, 3);
    let extents = fs
        .volume()
        .write_direct(&[&chunk, &chunk], anvil::format::record::compression::LZ4)
        .unwrap();
    fs.write_file("/other", b"commits without them").unwrap();
    fs.sync().unwrap();
    // `check` compares the map the commit wrote with the blocks the tree uses.
    assert_clean(&fs);
    let free = fs.volume().usage().free_bytes;
    fs.volume().release_direct(&extents);
    assert!(fs.volume().usage().free_bytes > free);
    fs.sync().unwrap();
    assert_clean(&fs);
}
