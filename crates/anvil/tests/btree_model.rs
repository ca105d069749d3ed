//! Property test of the B-tree and its flush groups against an in-memory model.
//!
//! Random puts and deletes of logical keys run through `Volume::run` transactions, with
//! commits, redo-log syncs and reopens in between. After every step the live view must equal
//! the model, and every committed TID must still read back exactly the model as it was at
//! that commit (as-of reads), including across reopen.

use anvil::device::{Device, MemDevice};
use anvil::format::record::LogicalKey;
use anvil::internals::Step;
use anvil::internals::{Value, Volume, VolumeOptions};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Clone, Debug)]
enum Op {
    Put {
        obj: u64,
        key: u64,
        len: usize,
        fill: u8,
    },
    Delete {
        obj: u64,
        key: u64,
    },
    Commit,
    SyncLog,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        40 => (1u64..6, 0u64..400, 0usize..1200, any::<u8>())
            .prop_map(|(obj, key, len, fill)| Op::Put { obj, key, len, fill }),
        15 => (1u64..6, 0u64..400).prop_map(|(obj, key)| Op::Delete { obj, key }),
        4 => Just(Op::Commit),
        2 => Just(Op::SyncLog),
        1 => Just(Op::Reopen),
    ]
}

type Model = BTreeMap<(u64, u64), Vec<u8>>;

fn lk(obj: u64, key: u64) -> LogicalKey {
    // rtype 7 (config) keeps the payloads inline and the semantics plain key/value.
    LogicalKey { obj, rtype: 7, key }
}

fn bytes(volume: &Volume, value: &Value) -> Vec<u8> {
    match value {
        Value::Bytes(b) => b.to_vec(),
        Value::Extent(e) => volume.read_extent(e).unwrap().to_vec(),
    }
}

fn live_view(volume: &Volume) -> Model {
    let mut out = Model::new();
    for obj in 1..6 {
        let records: Vec<(u64, Value)> = volume
            .run(false, |tx| -> Step<_> {
                tx.range(obj, 7, 0, u64::MAX, usize::MAX)
            })
            .unwrap();
        for (key, value) in records {
            out.insert((obj, key), bytes(volume, &value));
        }
    }
    out
}

fn view_at(volume: &Volume, tid: u64) -> Model {
    let mut out = Model::new();
    let records = volume
        .range_at(&volume.root(), tid, lk(1, 0), lk(5, u64::MAX), usize::MAX)
        .unwrap();
    for (key, value) in records {
        out.insert((key.obj, key.key), bytes(volume, &value));
    }
    out
}

/// Describes how two views differ, briefly (values by length and first byte).
fn diff(got: &Model, want: &Model) -> Option<String> {
    let keys: std::collections::BTreeSet<_> = got.keys().chain(want.keys()).collect();
    let brief = |v: Option<&Vec<u8>>| v.map(|v| (v.len(), v.first().copied()));
    let differences: Vec<String> = keys
        .into_iter()
        .filter(|k| got.get(k) != want.get(k))
        .take(5)
        .map(|k| {
            format!(
                "{k:?}: got {:?} want {:?}",
                brief(got.get(k)),
                brief(want.get(k))
            )
        })
        .collect();
    (!differences.is_empty()).then(|| differences.join("; "))
}

fn open(device: &Arc<MemDevice>, nohistory: bool) -> Arc<Volume> {
    let options = VolumeOptions {
        nohistory,
        ..VolumeOptions::default()
    };
    Volume::open(device.clone() as Arc<dyn Device>, options).unwrap()
}

/// Runs `ops` against a volume and the model. Without history, deletes remove elements, so
/// nodes shrink and merge; as-of views of old TIDs are then not kept and not compared. The
/// live view is compared with the model after every step.
fn run_ops(ops: Vec<Op>, nohistory: bool) {
    run_ops_checking(ops, nohistory, 1);
}

/// `run_ops`, comparing the live view after every commit, sync and reopen but after only
/// every `every`th put or delete: each comparison reads the whole tree, and the deep trees'
/// thousands of steps made that quadratic (over a minute a test).
fn run_ops_checking(ops: Vec<Op>, nohistory: bool, every: usize) {
    let device = Arc::new(MemDevice::new(0));
    Volume::format(&*device, 64 << 20, "model").unwrap();
    let mut volume = open(&device, nohistory);
    let mut model = Model::new();
    let mut history: Vec<(u64, Model)> = Vec::new();
    for (index, op) in ops.into_iter().enumerate() {
        let op_text = format!("{op:?}");
        let compare = index % every == 0 || !matches!(op, Op::Put { .. } | Op::Delete { .. });
        match op {
            Op::Put {
                obj,
                key,
                len,
                fill,
            } => {
                let value: Vec<u8> = (0..len).map(|i| fill.wrapping_add(i as u8)).collect();
                let stored = Arc::new(value.clone());
                volume
                    .run(true, |tx| tx.put(lk(obj, key), Some(stored.clone())))
                    .unwrap();
                model.insert((obj, key), value);
            }
            Op::Delete { obj, key } => {
                volume.run(true, |tx| tx.put(lk(obj, key), None)).unwrap();
                model.remove(&(obj, key));
            }
            Op::Commit => {
                let tid = volume.commit().unwrap();
                if history.last().is_none_or(|(t, _)| *t != tid) {
                    history.push((tid, model.clone()));
                }
            }
            Op::SyncLog => volume.sync_log().unwrap(),
            Op::Reopen => {
                // Whatever was logged or committed survives; the rest is lost.
                volume.sync_log().unwrap();
                drop(volume);
                volume = open(&device, nohistory);
                let tid = volume.committed_tid();
                if history.last().is_none_or(|(t, _)| *t != tid) {
                    history.push((tid, model.clone()));
                }
            }
        }
        if !compare {
            continue;
        }
        if let Some(d) = diff(&live_view(&volume), &model) {
            panic!("live view after step {index} ({op_text}): {d}");
        }
    }
    if let Some(d) = diff(&live_view(&volume), &model) {
        panic!("live view at the end: {d}");
    }
    if nohistory {
        history.clear();
    }
    for (tid, expected) in &history {
        if let Some(d) = diff(&view_at(&volume, *tid), expected) {
            panic!("as-of view at TID {tid}: {d}");
        }
    }
    volume.commit().unwrap();
    let report = anvil::check::check(&volume).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    // Every node a commit writes is at least a third full or merged with a neighbour.
    assert_eq!(report.underfull_nodes, 0, "{report:?}");
}

proptest! {
    // ANVIL_MODEL_CASES raises the case count for long runs.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("ANVIL_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        ..ProptestConfig::default()
    })]
    #[test]
    fn tree_matches_model(ops in prop::collection::vec(op(), 1..1500)) {
        run_ops(ops, false);
    }

    #[test]
    fn tree_without_history_matches_model_and_stays_packed(
        ops in prop::collection::vec(op(), 1..1500)
    ) {
        run_ops(ops, true);
    }
}

#[test]
fn deep_tree_with_many_versions() {
    // Enough elements for a three-level tree, every key rewritten several times.
    let mut ops = Vec::new();
    for round in 0..4u8 {
        for key in 0..3000u64 {
            ops.push(Op::Put {
                obj: 1 + key % 5,
                key,
                len: 300,
                fill: round,
            });
        }
        ops.push(Op::Commit);
        for key in (0..3000u64).step_by(7) {
            ops.push(Op::Delete {
                obj: 1 + key % 5,
                key,
            });
        }
        ops.push(Op::Commit);
    }
    ops.push(Op::Reopen);
    run_ops_checking(ops, false, 250);
}

#[test]
fn deep_tree_emptied_without_history_merges_at_every_level() {
    // A three-level tree loses 19 keys in 20 in two commits: leaves and internal nodes
    // shrink far under the merge threshold and must be merged, not kept nearly empty.
    let mut ops = Vec::new();
    for key in 0..6000u64 {
        ops.push(Op::Put {
            obj: 1 + key % 3,
            key,
            len: 600,
            fill: key as u8,
        });
    }
    ops.push(Op::Commit);
    for half in 0..2u64 {
        for key in (0..6000u64).filter(|k| k % 20 != 0 && k % 2 == half) {
            ops.push(Op::Delete {
                obj: 1 + key % 3,
                key,
            });
        }
        ops.push(Op::Commit);
    }
    ops.push(Op::Reopen);
    run_ops_checking(ops, true, 250);
}

#[test]
fn regression_log_replay_then_overwrite() {
    let put = |key, len| Op::Put {
        obj: 1,
        key,
        len,
        fill: 1,
    };
    run_ops(
        vec![
            put(2, 6),
            put(0, 7),
            Op::Commit,
            put(1, 26),
            Op::Delete { obj: 1, key: 0 },
            put(3, 41),
            Op::Commit,
            put(3, 2),
            Op::Reopen,
            put(1, 35),
        ],
        false,
    );
}
