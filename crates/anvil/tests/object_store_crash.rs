//! Crash consistency on an object-store volume: a workload runs until the store stops
//! answering at a random request (the host is gone: nothing more reaches the store), and a
//! new writer takes the volume over. It must open without repair, `check` clean, hold the
//! state after some prefix of the workload no older than the last acknowledged sync, and
//! read every acknowledged sync's TID exactly as it was.

use anvil::device::{BlobStore, Device, MemStore, ObjectDevice, ObjectOptions};
use anvil::{Filesystem, MountOptions};
use rand::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

type Model = BTreeMap<String, Vec<u8>>;

const DIRS: usize = 3;
const VOLUME_BYTES: u64 = 256 << 20;

fn options(takeover: bool) -> ObjectOptions {
    ObjectOptions {
        writable: true,
        takeover,
        lease: Duration::from_millis(50),
        // A store that stops answering fails the operation at once.
        retry_for: Duration::ZERO,
        // Small segments: uploads ahead of the flush, and repacks, happen too.
        segment_bytes: 256 << 10,
        ..Default::default()
    }
}

fn mount_options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        crash_log: false,
        ..Default::default()
    }
}

fn dump(list: impl Fn(&str) -> Vec<String>, read: impl Fn(&str) -> Vec<u8>) -> Model {
    let mut out = Model::new();
    for d in 0..DIRS {
        for name in list(&format!("/d{d}")) {
            let path = format!("/d{d}/{name}");
            let bytes = read(&path);
            out.insert(path, bytes);
        }
    }
    out
}

fn names(entries: Vec<anvil::DirEntry>) -> Vec<String> {
    entries
        .into_iter()
        .map(|e| String::from_utf8_lossy(&e.name).into_owned())
        .filter(|n| n != "." && n != "..")
        .collect()
}

fn dump_now(fs: &Filesystem) -> Model {
    dump(
        |dir| names(fs.list_dir(dir).unwrap()),
        |path| fs.read_file(path).unwrap(),
    )
}

fn dump_at(fs: &Filesystem, tid: u64) -> Model {
    let view = fs.at(tid).unwrap();
    dump(
        |dir| names(view.list_dir(dir).unwrap()),
        |path| view.read_file(path).unwrap(),
    )
}

/// One step of the workload, applied to the model if `fs` took it (and returned with the
/// model as it would be either way, for a step that failed half way).
fn step(
    fs: &Filesystem,
    model: &Model,
    rng: &mut Xoshiro256PlusPlus,
) -> (anvil::Result<()>, Model) {
    let mut next = model.clone();
    let path = format!("/d{}/f{}", rng.gen_range(0..DIRS), rng.gen_range(0..12));
    let done = match rng.gen_range(0..10) {
        0..=5 => {
            let len = [10, 3000, 70_000, 300_000][rng.gen_range(0..4)];
            let bytes: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            next.insert(path.clone(), bytes.clone());
            fs.write_file(&path, &bytes).map(|_| ())
        }
        6..=7 if model.contains_key(&path) => {
            next.remove(&path);
            fs.remove_path(&path)
        }
        8 if model.contains_key(&path) => {
            let to = format!("/d{}/g{}", rng.gen_range(0..DIRS), rng.gen_range(0..12));
            if model.contains_key(&to) || to == path {
                return (Ok(()), next);
            }
            let bytes = next.remove(&path).unwrap_or_default();
            next.insert(to.clone(), bytes);
            fs.rename_path(&path, &to)
        }
        _ => return (Ok(()), next),
    };
    (done, next)
}

#[test]
fn a_store_that_goes_away_at_any_request_loses_no_acknowledged_sync() {
    let mut crashed = 0;
    let mut after_a_sync = 0;
    for seed in 0..24u64 {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
        let store = MemStore::new();
        store.honour_conditions(seed % 2 == 0);
        ObjectDevice::create(&store, VOLUME_BYTES, false).unwrap();
        let shared: Arc<dyn BlobStore> = Arc::new(store.clone());
        let device = Arc::new(ObjectDevice::open(shared.clone(), options(false)).unwrap());
        Filesystem::mkfs(device.clone(), VOLUME_BYTES, "crash").unwrap();
        let fs = Filesystem::open(device.clone() as Arc<dyn Device>, mount_options()).unwrap();
        for d in 0..DIRS {
            fs.mkdir_path(&format!("/d{d}")).unwrap();
        }
        let mut model = Model::new();
        let mut acked: Vec<(u64, Model)> = vec![(fs.sync().unwrap(), model.clone())];
        // Every state the volume may come back in: after each step from the last sync.
        let mut states: Vec<Model> = vec![model.clone()];
        store.fail_after(rng.gen_range(2..160));
        for _ in 0..120 {
            let (done, next) = match rng.gen_range(0..6) {
                0 => match fs.sync() {
                    Ok(tid) => {
                        acked.push((tid, model.clone()));
                        states = vec![model.clone()];
                        continue;
                    }
                    Err(e) => (Err(e), model.clone()),
                },
                _ => step(&fs, &model, &mut rng),
            };
            states.push(next.clone());
            if done.is_err() {
                crashed += 1;
                after_a_sync += usize::from(acked.len() > 1);
                break;
            }
            model = next;
        }
        // The host is gone: nothing it still holds reaches the store.
        drop(fs);
        drop(device);
        store.fail_next(0);

        let device = Arc::new(ObjectDevice::open(shared, options(true)).unwrap());
        let fs = Filesystem::open(device as Arc<dyn Device>, mount_options())
            .unwrap_or_else(|e| panic!("seed {seed}: the volume does not open: {e}"));
        let report = anvil::check::check(fs.volume()).unwrap();
        assert!(
            report.problems.is_empty(),
            "seed {seed}: {:?}",
            report.problems
        );
        let now = dump_now(&fs);
        assert!(
            states.contains(&now),
            "seed {seed}: the volume holds a state no prefix of the workload left ({} files)",
            now.len()
        );
        for (tid, expected) in &acked {
            assert_eq!(
                &dump_at(&fs, *tid),
                expected,
                "seed {seed}: TID {tid:#x} changed"
            );
        }
        fs.close().unwrap();
    }
    // The crash must have come mid-workload, also after syncs that were acknowledged.
    eprintln!("{crashed} of 24 crashed mid-workload, {after_a_sync} after a sync");
    assert!(
        crashed >= 16 && after_a_sync >= 8,
        "{crashed} crashed, {after_a_sync} after a sync"
    );
}
