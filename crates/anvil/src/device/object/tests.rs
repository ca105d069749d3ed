use super::*;
use crate::device::MemStore;
use crate::{Filesystem, MountOptions};

fn writer() -> ObjectOptions {
    ObjectOptions {
        writable: true,
        lease: Duration::from_millis(300),
        retry_for: Duration::from_millis(200),
        ..Default::default()
    }
}

fn reader() -> ObjectOptions {
    ObjectOptions {
        writable: false,
        ..writer()
    }
}

fn volume(size: u64) -> (MemStore, Arc<dyn BlobStore>) {
    let store = MemStore::new();
    ObjectDevice::create(&store, size, false).unwrap();
    let shared: Arc<dyn BlobStore> = Arc::new(store.clone());
    (store, shared)
}

fn read(device: &ObjectDevice, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xee; len];
    device.read_at(&mut buf, offset).unwrap();
    buf
}

fn segment_count(store: &MemStore) -> usize {
    store
        .keys()
        .iter()
        .filter(|(k, _)| k.starts_with("seg/"))
        .count()
}

impl ObjectDevice {
    /// A crash: the heartbeat stops, nothing is released.
    fn abandon(self) {
        {
            let (lock, wake) = &self.shared.stop;
            *lock.lock().unwrap() = true;
            wake.notify_all();
        }
        self.shared.wake_uploader.1.notify_all();
        for thread in self.threads.lock().drain(..) {
            thread.join().unwrap();
        }
    }
}

#[test]
fn a_range_map_splits_joins_and_reports_what_it_replaces() {
    let mut map: RangeMap<Loc> = RangeMap::new();
    map.insert(0, 100, Loc { seg: 1, at: 0 }, |_, _, _| panic!("empty"));
    map.insert(100, 200, Loc { seg: 1, at: 100 }, |_, _, _| panic!("empty"));
    assert_eq!(map.map.len(), 1, "a continuation joins its predecessor");
    let mut replaced = Vec::new();
    map.insert(50, 150, Loc { seg: 2, at: 7 }, |lo, hi, v| {
        replaced.push((lo, hi, *v))
    });
    assert_eq!(replaced, vec![(50, 150, Loc { seg: 1, at: 50 })]);
    let pieces = map.pieces(40, 160);
    assert_eq!(
        pieces,
        vec![
            (40, 50, Loc { seg: 1, at: 40 }),
            (50, 150, Loc { seg: 2, at: 7 }),
            (150, 160, Loc { seg: 1, at: 150 }),
        ]
    );
    assert!(map.pieces(200, 300).is_empty());
}

#[test]
fn void_segments_are_those_a_higher_epoch_numbered_at_or_below() {
    // Epoch 1 wrote 1..=4; epoch 2 listed up to 2 and fenced with 3.
    let valid = valid_pairs(&[(1, 1), (2, 1), (3, 1), (4, 1), (3, 2), (4, 2)]);
    assert!(valid(1, 1) && valid(2, 1));
    assert!(!valid(3, 1) && !valid(4, 1));
    assert!(valid(3, 2) && valid(4, 2));
}

#[test]
fn writes_read_back_before_and_after_flush_and_from_a_reader() {
    let (_store, shared) = volume(64 << 20);
    let device = ObjectDevice::open(shared.clone(), writer()).unwrap();
    assert_eq!(
        read(&device, 1000, 10),
        vec![0; 10],
        "never written reads zero"
    );
    device.write_at(&[1; 5000], 4096).unwrap();
    device.write_at(&[2; 100], 5000).unwrap();
    let mut expect = vec![0u8; 12000];
    expect[4096..9096].fill(1);
    expect[5000..5100].fill(2);
    assert_eq!(read(&device, 0, 12000), expect);
    let before = ObjectDevice::open(shared.clone(), reader()).unwrap();
    assert_eq!(
        read(&before, 4096, 10),
        vec![0; 10],
        "unflushed writes stay private"
    );
    device.flush().unwrap();
    assert_eq!(
        read(&device, 0, 12000),
        expect,
        "the writer reads the store"
    );
    assert!(before.refresh().unwrap());
    assert_eq!(read(&before, 0, 12000), expect, "a reader sees the flush");
    assert!(device.read_at(&mut [0; 10], (64 << 20) - 5).is_err());
    assert!(before.write_at(&[1], 0).is_err(), "readers do not write");
}

#[test]
fn segments_are_packed_and_plain_ones_still_read() {
    let (store, shared) = volume(64 << 20);
    let device = ObjectDevice::open(shared.clone(), writer()).unwrap();
    // A node-like block (mostly zeros) and noise, which stays plain.
    let mut noise = vec![0u8; 300_000];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in noise.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut node = vec![0u8; 16384];
    node[..64].fill(9);
    device.write_at(&node, 1 << 20).unwrap();
    device.flush().unwrap();
    device.write_at(&noise, 4 << 20).unwrap();
    device.flush().unwrap();
    let stats = device.stats();
    assert_eq!(stats.written_bytes, 16384 + 300_000);
    assert!(
        stats.uploaded_bytes < 300_000 + 4096,
        "the node packs, the noise is not inflated: {stats:?}"
    );
    device.release();
    let check = |label: &str| {
        let reader = ObjectDevice::open(shared.clone(), reader()).unwrap();
        assert_eq!(read(&reader, 1 << 20, 16384), node, "{label}");
        assert_eq!(read(&reader, 4 << 20, 300_000), noise, "{label}");
    };
    check("packed");
    // Segments as an earlier anvil wrote them: the logical bytes as they are.
    for (key, _) in store
        .keys()
        .into_iter()
        .filter(|(k, _)| k.starts_with("seg/"))
    {
        let object = shared.get(&key).unwrap();
        let table = packing::decode_table(&object, &key, object.len() as u64).unwrap();
        let last = table.pieces.len() - 1;
        let (at, len) = table.span(0, last);
        let logical = table
            .unpack_span(0, last, &object[in_memory(at)..in_memory(at) + len], &key)
            .unwrap();
        assert!(logical.starts_with(SEGMENT_MAGIC));
        store.tamper(&key, logical);
    }
    check("plain");
}

#[test]
fn overwritten_segments_are_deleted_and_checkpoints_bound_opening() {
    let (store, shared) = volume(64 << 20);
    let device = ObjectDevice::open(shared.clone(), writer()).unwrap();
    for round in 0..200u32 {
        device.write_at(&round.to_le_bytes(), 0).unwrap();
        device
            .write_at(&[round as u8; 8192], 65536 * u64::from(round % 3))
            .unwrap();
        device.flush().unwrap();
    }
    assert!(
        segment_count(&store) <= 5,
        "{} segments left",
        segment_count(&store)
    );
    let checkpoints = store
        .keys()
        .iter()
        .filter(|(k, _)| k.starts_with("ckpt/"))
        .count();
    assert!((1..=2).contains(&checkpoints));
    drop(device);
    let gets = store.stats().gets.load(Ordering::Relaxed);
    let again = ObjectDevice::open(shared, reader()).unwrap();
    assert!(store.stats().gets.load(Ordering::Relaxed) - gets <= 2 + CHECKPOINT_EVERY);
    assert_eq!(read(&again, 0, 4), 199u32.to_le_bytes());
    assert_eq!(read(&again, 65536, 8192), vec![199; 8192]);
    assert_eq!(read(&again, 131072, 10), vec![197; 10]);
}

#[test]
fn a_second_writer_is_refused_while_the_first_lives_and_takes_over_after() {
    let (_store, shared) = volume(64 << 20);
    let first = ObjectDevice::open(shared.clone(), writer()).unwrap();
    first.write_at(b"durable", 0).unwrap();
    first.flush().unwrap();
    let refused = ObjectDevice::open(shared.clone(), writer()).err().unwrap();
    assert!(
        refused.to_string().contains("mounted read-write by host"),
        "{refused}"
    );
    // A clean release lets the next writer in at once.
    first.release();
    drop(first);
    let start = Instant::now();
    let second = ObjectDevice::open(shared.clone(), writer()).unwrap();
    assert!(start.elapsed() < Duration::from_millis(300));
    assert_eq!(read(&second, 0, 7), b"durable");
    second.write_at(b"crashed", 0).unwrap();
    second.flush().unwrap();
    second.write_at(b"lost!!!", 0).unwrap();
    second.abandon();
    // A writer gone without a word: the next waits one lease and takes over.
    let third = ObjectDevice::open(shared, writer()).unwrap();
    assert_eq!(
        read(&third, 0, 7),
        b"crashed",
        "flushed survives, unflushed does not"
    );
}

#[test]
fn a_deposed_writer_cannot_flush_and_its_late_segments_are_void() {
    let (store, shared) = volume(64 << 20);
    store.honour_conditions(false);
    let old = ObjectDevice::open(shared.clone(), writer()).unwrap();
    old.write_at(b"acked", 0).unwrap();
    old.flush().unwrap();
    // A new writer that believes the old one dead (as a replaced daemon does).
    let takeover = ObjectOptions {
        takeover: true,
        ..writer()
    };
    let new = ObjectDevice::open(shared.clone(), takeover).unwrap();
    old.write_at(b"late!", 0).unwrap();
    let refused = old.flush().unwrap_err();
    assert!(refused.to_string().contains("another writer"), "{refused}");
    assert!(old.write_at(b"x", 0).is_err());
    assert_eq!(read(&new, 0, 5), b"acked");
    new.write_at(b"newer", 0).unwrap();
    new.flush().unwrap();
    drop(new);
    drop(old);
    let check = ObjectDevice::open(shared, reader()).unwrap();
    assert_eq!(read(&check, 0, 5), b"newer");
}

#[test]
fn racing_claims_never_give_two_writers() {
    for round in 0..20 {
        let (store, shared) = volume(64 << 20);
        store.honour_conditions(round % 2 == 0);
        let takeover = ObjectOptions {
            takeover: true,
            ..writer()
        };
        let opened: Vec<io::Result<ObjectDevice>> = std::thread::scope(|s| {
            let racers: Vec<_> = (0..3)
                .map(|_| {
                    let (shared, options) = (shared.clone(), takeover.clone());
                    s.spawn(move || ObjectDevice::open(shared, options))
                })
                .collect();
            racers.into_iter().map(|r| r.join().unwrap()).collect()
        });
        let mut winners = 0;
        for (i, result) in opened.iter().enumerate() {
            let Ok(device) = result else { continue };
            // A writer that won keeps writing only while no one deposed it.
            if device.write_at(&[i as u8], 0).is_ok() && device.flush().is_ok() {
                winners += 1;
            }
        }
        assert!(winners <= 1, "round {round}: {winners} writers flushed");
    }
}

#[test]
fn a_store_outage_delays_a_flush_and_loses_nothing() {
    let (store, shared) = volume(64 << 20);
    let patient = ObjectOptions {
        retry_for: Duration::from_secs(30),
        ..writer()
    };
    let device = ObjectDevice::open(shared.clone(), patient).unwrap();
    device.write_at(b"kept", 0).unwrap();
    store.fail_next(5);
    device.flush().unwrap();
    drop(device);
    let impatient = ObjectDevice::open(shared.clone(), writer()).unwrap();
    impatient.write_at(b"also", 8).unwrap();
    store.fail_after(0);
    assert!(
        impatient.flush().is_err(),
        "a store that stays away fails the flush"
    );
    store.fail_next(0);
    impatient.flush().unwrap();
    impatient.release();
    let check = ObjectDevice::open(shared, reader()).unwrap();
    assert_eq!(read(&check, 0, 12), b"kept\0\0\0\0also");
}

#[test]
fn damaged_and_foreign_prefixes_give_one_line_reasons() {
    let empty: Arc<dyn BlobStore> = Arc::new(MemStore::new());
    let none = ObjectDevice::open(empty.clone(), reader()).err().unwrap();
    assert!(none.to_string().contains("holds no anvil volume"), "{none}");
    empty.put("photos/cat.jpg", b"meow").unwrap();
    let foreign = ObjectDevice::open(empty.clone(), reader()).err().unwrap();
    assert!(foreign
        .to_string()
        .contains("holds 1 objects but no anvil volume"));
    let refused = ObjectDevice::create(&*empty, 64 << 20, false).unwrap_err();
    assert!(
        refused.to_string().contains("not an anvil volume"),
        "{refused}"
    );

    let (store, shared) = volume(64 << 20);
    let again = ObjectDevice::create(&store, 64 << 20, false).unwrap_err();
    assert!(again.to_string().contains("--force"));
    let device = ObjectDevice::open(shared.clone(), writer()).unwrap();
    device.write_at(&[7; 4096], 0).unwrap();
    device.flush().unwrap();
    device.release();
    let (key, _) = store
        .keys()
        .into_iter()
        .rfind(|(k, _)| k.starts_with("seg/"))
        .unwrap();
    let mut bytes = shared.get(&key).unwrap();
    bytes.truncate(bytes.len() - 100);
    store.tamper(&key, bytes);
    let damaged = ObjectDevice::open(shared.clone(), reader()).err().unwrap();
    assert!(damaged.to_string().contains("is damaged"), "{damaged}");
    assert!(!damaged.to_string().contains('\n'));
    store.tamper(MARKER_KEY, b"anvil object volume 9\n".to_vec());
    let newer = ObjectDevice::open(shared, reader()).err().unwrap();
    assert!(newer.to_string().contains("newer anvil"), "{newer}");
}

#[test]
fn a_filesystem_lives_on_an_object_store_across_a_crash() {
    let (store, shared) = volume(256 << 20);
    let options = || MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    };
    let device = Arc::new(ObjectDevice::open(shared.clone(), writer()).unwrap());
    Filesystem::mkfs(device.clone(), 256 << 20, "s3").unwrap();
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    fs.mkdir_path("/d").unwrap();
    for i in 0..200 {
        fs.write_file(
            &format!("/d/f{i}"),
            format!("file {i}").repeat(50).as_bytes(),
        )
        .unwrap();
    }
    let first = fs.sync().unwrap();
    fs.write_file("/d/f0", b"changed").unwrap();
    fs.sync().unwrap();
    fs.write_file("/d/unsynced", b"gone").unwrap();
    drop(fs);
    Arc::into_inner(device).unwrap().abandon();
    assert!(segment_count(&store) > 0);

    let device = Arc::new(ObjectDevice::open(shared, writer()).unwrap());
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    assert_eq!(fs.read_file("/d/f0").unwrap(), b"changed");
    assert_eq!(
        fs.read_file("/d/f7").unwrap(),
        "file 7".repeat(50).as_bytes()
    );
    assert_eq!(
        fs.at(first).unwrap().read_file("/d/f0").unwrap(),
        "file 0".repeat(50).as_bytes()
    );
    let report = crate::check::check(fs.volume()).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    fs.close().unwrap();
}

#[test]
fn a_replica_follows_its_writer_commit_by_commit() {
    let (_store, shared) = volume(256 << 20);
    let writer_options = MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    };
    let device = Arc::new(ObjectDevice::open(shared.clone(), writer()).unwrap());
    Filesystem::mkfs(device.clone(), 256 << 20, "s3").unwrap();
    let fs = Filesystem::open(device as Arc<dyn Device>, writer_options).unwrap();
    fs.write_file("/a", b"first").unwrap();
    fs.sync().unwrap();
    let replica_options = MountOptions {
        read_only: true,
        commit_interval_ms: 0,
        ..Default::default()
    };
    let replica_device = Arc::new(ObjectDevice::open(shared, reader()).unwrap());
    let replica = Filesystem::open(replica_device as Arc<dyn Device>, replica_options).unwrap();
    assert_eq!(replica.read_file("/a").unwrap(), b"first");
    assert_eq!(replica.follow().unwrap(), None, "nothing new");
    for round in 0..20u32 {
        // Files replaced every round: the writer frees and reuses space the replica read.
        fs.remove_path("/a").unwrap();
        fs.write_file("/a", format!("round {round}").repeat(100).as_bytes())
            .unwrap();
        fs.write_file(&format!("/r{round}"), &round.to_le_bytes())
            .unwrap();
        let tid = fs.sync().unwrap();
        assert_eq!(replica.follow().unwrap(), Some(tid));
        assert_eq!(
            replica.read_file("/a").unwrap(),
            format!("round {round}").repeat(100).as_bytes()
        );
        assert_eq!(
            replica.read_file(&format!("/r{round}")).unwrap(),
            round.to_le_bytes()
        );
    }
    assert!(replica.write_file("/x", b"no").is_err());
    fs.close().unwrap();
}

#[test]
fn small_and_sparse_segments_are_repacked_into_fewer() {
    let (store, shared) = volume(64 << 20);
    let device = ObjectDevice::open(shared.clone(), writer()).unwrap();
    // 200 fsyncs of one block each: 200 small segments, unless repacked.
    for round in 0..200u64 {
        device.write_at(&[round as u8; 4096], round * 4096).unwrap();
        if round % 3 == 0 && round > 0 {
            // Half-dead segments too: a block written again elsewhere.
            device.write_at(&[0xaa; 4096], (round - 1) * 4096).unwrap();
        }
        device.flush().unwrap();
    }
    let segments = segment_count(&store);
    assert!(segments < 60, "{segments} segments after 200 flushes");
    device.release();
    drop(device);
    let again = ObjectDevice::open(shared, reader()).unwrap();
    for round in 0..200u64 {
        let rewritten = round % 3 == 2 && round + 1 < 200;
        let expect = if rewritten { 0xaa } else { round as u8 };
        assert_eq!(
            read(&again, round * 4096, 4096),
            vec![expect; 4096],
            "block {round}"
        );
    }
}

#[test]
fn a_disk_cache_answers_what_was_uploaded_and_read_and_survives_reopening() {
    let (store, shared) = volume(64 << 20);
    let dir = tempfile::tempdir().unwrap();
    let cached = |writable: bool| ObjectOptions {
        writable,
        disk_cache: Some((dir.path().to_path_buf(), 8 << 20)),
        ..writer()
    };
    let device = ObjectDevice::open(shared.clone(), cached(true)).unwrap();
    for i in 0..8u64 {
        device.write_at(&[i as u8 + 1; 65536], i << 20).unwrap();
    }
    device.flush().unwrap();
    device.release();
    drop(device);
    // A new reader with an empty memory cache: every piece comes from the disk.
    let gets = store.stats().gets.load(Ordering::Relaxed);
    let reader = ObjectDevice::open(shared.clone(), cached(false)).unwrap();
    let opening = store.stats().gets.load(Ordering::Relaxed) - gets;
    for i in 0..8u64 {
        assert_eq!(read(&reader, i << 20, 65536), vec![i as u8 + 1; 65536]);
    }
    assert_eq!(
        store.stats().gets.load(Ordering::Relaxed) - gets,
        opening,
        "no piece read from the store"
    );
    assert!(reader.stats().disk_hits > 0);
    // A damaged or lost directory only costs reads from the store again.
    for entry in std::fs::read_dir(dir.path()).unwrap().flatten() {
        std::fs::remove_dir_all(entry.path()).unwrap();
    }
    let again = ObjectDevice::open(shared, cached(false)).unwrap();
    assert_eq!(read(&again, 3 << 20, 65536), vec![4; 65536]);
}

#[test]
fn a_writer_deposed_twice_over_still_finds_its_fence() {
    let (_store, shared) = volume(64 << 20);
    let takeover = ObjectOptions {
        takeover: true,
        ..writer()
    };
    let first = ObjectDevice::open(shared.clone(), writer()).unwrap();
    let second = ObjectDevice::open(shared.clone(), takeover.clone()).unwrap();
    // The third tidies what the first two left: it must not take the first one's fence.
    let third = ObjectDevice::open(shared.clone(), takeover).unwrap();
    for (name, device) in [("first", &first), ("second", &second)] {
        device.write_at(b"late", 0).unwrap_or(());
        assert!(
            device.flush().is_err(),
            "the {name} writer flushed after being deposed"
        );
    }
    third.write_at(b"kept", 0).unwrap();
    third.flush().unwrap();
}

#[test]
fn a_reader_whose_segment_was_reclaimed_reads_where_the_bytes_went() {
    let (_store, shared) = volume(64 << 20);
    let device = ObjectDevice::open(shared.clone(), writer()).unwrap();
    device.write_at(&[1; 4096], 0).unwrap();
    device.flush().unwrap();
    let reader = ObjectDevice::open(shared, reader()).unwrap();
    // Written again twice over: the segment the reader's map names is deleted.
    for byte in [2u8, 3] {
        device.write_at(&[byte; 4096], 0).unwrap();
        device.flush().unwrap();
    }
    assert!(device.stats().deleted_objects > 0);
    assert_eq!(read(&reader, 0, 4096), vec![3; 4096]);
}
