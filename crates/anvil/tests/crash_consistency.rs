//! Crash consistency: every workload is crashed at every device write, and the post-crash
//! image is built four ways (pending writes dropped, a prefix kept, a random subset kept in
//! any order, a random subset torn at sector granularity). After each crash the volume must
//! open without repair, `check` clean, equal the state after some prefix of the workload no
//! older than the last acknowledged sync or fsync, and still read every earlier commit
//! (as-of views) exactly as it was.

use anvil::device::{CrashDevice, CrashMode, Device, MemDevice, Pages};
use anvil::fs::{Caller, RenameFlags, SetAttr};
use anvil::{Error, Filesystem, MountOptions};
use std::collections::BTreeMap;
use std::sync::Arc;

type Dump = BTreeMap<String, String>;
type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;
type Action = Box<dyn Fn(&Filesystem) -> anvil::Result<()> + Send + Sync>;

/// A canonical description of everything visible: paths, kinds, modes, links, contents,
/// symlink targets and xattrs.
fn dump_with(
    list: &dyn Fn(u64) -> anvil::Result<Vec<anvil::DirEntry>>,
    attr: &dyn Fn(u64) -> anvil::Result<anvil::Attr>,
    read: &dyn Fn(u64, u64) -> anvil::Result<Vec<u8>>,
    link: &dyn Fn(u64) -> anvil::Result<Vec<u8>>,
    xattrs: &dyn Fn(u64) -> anvil::Result<Xattrs>,
) -> Dump {
    let mut out = Dump::new();
    let mut stack = vec![(1u64, String::new())];
    while let Some((dir, path)) = stack.pop() {
        for entry in list(dir).unwrap() {
            let child_path = format!("{path}/{}", String::from_utf8_lossy(&entry.name));
            let a = attr(entry.ino).unwrap();
            let mut text = format!("mode={:o} nlink={} size={}", a.mode, a.nlink, a.size);
            match a.kind {
                anvil::FileKind::Dir => stack.push((entry.ino, child_path.clone())),
                anvil::FileKind::File => {
                    let data = read(entry.ino, a.size).unwrap();
                    text += &format!(" data={:016x}", xxhash(&data));
                }
                anvil::FileKind::Symlink => {
                    text += &format!(
                        " target={}",
                        String::from_utf8_lossy(&link(entry.ino).unwrap())
                    )
                }
                _ => {}
            }
            for (name, value) in xattrs(entry.ino).unwrap() {
                text += &format!(" x:{}={}", String::from_utf8_lossy(&name), value.len());
            }
            out.insert(child_path, text);
        }
    }
    out
}

fn xxhash(data: &[u8]) -> u64 {
    anvil::checksum::checksum(data)
}

fn dump(fs: &Filesystem) -> Dump {
    dump_with(
        &|dir| {
            let mut all = Vec::new();
            let mut cookie = 0;
            loop {
                let batch = fs.readdir(dir, cookie, 100)?;
                let Some(last) = batch.last() else { break };
                cookie = last.cookie;
                all.extend(
                    batch
                        .into_iter()
                        .filter(|e| e.name != b"." && e.name != b".."),
                );
            }
            Ok(all)
        },
        &|ino| fs.getattr(ino),
        &|ino, size| fs.read(ino, 0, size as u32),
        &|ino| fs.readlink(ino),
        &|ino| {
            let mut out = Vec::new();
            for name in fs.listxattr(ino)? {
                let value = fs.getxattr(ino, &name)?;
                out.push((name, value));
            }
            Ok(out)
        },
    )
}

fn dump_at(fs: &Filesystem, tid: u64) -> Dump {
    let view = fs.at(tid).unwrap();
    dump_with(
        &|dir| {
            let mut all = Vec::new();
            let mut cookie = 0;
            loop {
                let batch = view.readdir(dir, cookie, 100)?;
                let Some(last) = batch.last() else { break };
                cookie = last.cookie;
                all.extend(
                    batch
                        .into_iter()
                        .filter(|e| e.name != b"." && e.name != b".."),
                );
            }
            Ok(all)
        },
        &|ino| view.getattr(ino),
        &|ino, size| view.read(ino, 0, size as u32),
        &|ino| view.readlink(ino),
        &|ino| {
            let mut out = Vec::new();
            for name in view.listxattr(ino)? {
                let value = view.getxattr(ino, &name)?;
                out.push((name, value));
            }
            Ok(out)
        },
    )
}

/// One step of a workload. `Sync` commits, `Fsync` goes through the redo log.
enum Step {
    Op(Action),
    Sync,
    /// A snapshot: a commit that is also kept under this label.
    Snapshot(String),
    Fsync,
}

fn op(f: impl Fn(&Filesystem) -> anvil::Result<()> + Send + Sync + 'static) -> Step {
    Step::Op(Box::new(f))
}

/// A file written as a program writes it, two calls (create or truncate, then write), one
/// step each: every step is one change the engine logs on its own, so a crash may leave the
/// state between them. (`Filesystem::write_file` makes a new file in one step.) POSIX refusals are tolerated in random workloads.
fn write_file(path: impl Into<String>, data: Vec<u8>, tolerant: bool) -> [Step; 2] {
    let path: Arc<str> = path.into().into();
    let keep = move |r: anvil::Result<()>| if tolerant { tolerate(r) } else { r };
    let create = {
        let path = path.clone();
        op(move |fs| {
            keep((|| {
                let (dir, name) = path.rsplit_once('/').expect("absolute path");
                let parent = fs.resolve(if dir.is_empty() { "/" } else { dir })?;
                match fs.lookup(parent, name.as_bytes()) {
                    Ok(attr) => {
                        let truncate = SetAttr {
                            size: Some(0),
                            ..Default::default()
                        };
                        fs.setattr(attr.ino, &truncate).map(|_| ())
                    }
                    Err(Error::Posix(libc::ENOENT)) => fs
                        .mknod(Caller::ROOT, parent, name.as_bytes(), 0o100644, 0)
                        .map(|_| ()),
                    Err(e) => Err(e),
                }
            })())
        })
    };
    let write = op(move |fs| {
        keep(
            fs.resolve(&path)
                .and_then(|ino| fs.write(ino, 0, &data).map(|_| ())),
        )
    });
    [create, write]
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn workloads() -> Vec<(String, Vec<Step>)> {
    let mut all: Vec<(String, Vec<Step>)> = fixed_workloads()
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
    let seeds: u64 = std::env::var("ANVIL_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    for seed in 0..seeds {
        all.push((format!("random seed {seed}"), random_workload(seed)));
    }
    all
}

fn fixed_workloads() -> Vec<(&'static str, Vec<Step>)> {
    vec![
        (
            // Whole chunks are written ahead of their commit and logged by address: written,
            // overwritten and cut within one group (extents that never reach the tree), and
            // across commits.
            "whole_chunks_ahead_of_commit",
            write_file("/w", pattern(300_000, 11), false)
                .into_iter()
                .chain([
                    Step::Fsync,
                    op(|fs| {
                        let ino = fs.resolve("/w")?;
                        fs.write(ino, 65_536, &pattern(131_072, 12)).map(|_| ())
                    }),
                    op(|fs| {
                        let ino = fs.resolve("/w")?;
                        fs.write(ino, 60_000, &pattern(140_000, 13)).map(|_| ())
                    }),
                    op(|fs| {
                        let ino = fs.resolve("/w")?;
                        fs.setattr(
                            ino,
                            &SetAttr {
                                size: Some(100_000),
                                ..Default::default()
                            },
                        )
                        .map(|_| ())
                    }),
                    Step::Fsync,
                    op(|fs| {
                        let ino = fs.resolve("/w")?;
                        fs.write(ino, 196_608, &pattern(262_144, 14)).map(|_| ())
                    }),
                    Step::Sync,
                    op(|fs| {
                        let ino = fs.resolve("/w")?;
                        fs.write(ino, 0, &pattern(196_608, 15)).map(|_| ())
                    }),
                    op(|fs| fs.remove_path("/w")),
                    Step::Fsync,
                ])
                .collect(),
        ),
        (
            "files_and_renames",
            vec![op(|fs| fs.mkdir_path("/a").map(|_| ()))]
                .into_iter()
                .chain(write_file("/a/one", b"hello".to_vec(), false))
                .chain([Step::Fsync])
                .chain(write_file("/a/two", pattern(5000, 1), false))
                .chain([
                    op(|fs| fs.rename_path("/a/one", "/one")),
                    Step::Sync,
                    op(|fs| fs.remove_path("/a/two")),
                ])
                .chain(write_file("/a/three", pattern(70_000, 2), false))
                .chain([
                    Step::Fsync,
                    op(|fs| fs.rename_path("/a/three", "/one")),
                    Step::Fsync,
                ])
                .collect(),
        ),
        (
            "links_xattrs_truncate",
            write_file("/f", pattern(200_000, 3), false)
                .into_iter()
                .chain([
                    op(|fs| {
                        let ino = fs.resolve("/f")?;
                        fs.link(ino, 1, b"g").map(|_| ())
                    }),
                    op(|fs| {
                        let ino = fs.resolve("/f")?;
                        fs.setxattr(ino, b"user.k", b"value", false, false)
                    }),
                    Step::Sync,
                    op(|fs| {
                        let ino = fs.resolve("/g")?;
                        fs.setattr(
                            ino,
                            &SetAttr {
                                size: Some(65_000),
                                ..Default::default()
                            },
                        )
                        .map(|_| ())
                    }),
                    op(|fs| {
                        let ino = fs.resolve("/f")?;
                        fs.write(ino, 100_000, &pattern(3000, 4)).map(|_| ())
                    }),
                    Step::Fsync,
                    op(|fs| fs.symlink(Caller::ROOT, 1, b"s", b"f").map(|_| ())),
                    op(|fs| fs.remove_path("/f")),
                    op(|fs| {
                        fs.rename(
                            1,
                            b"g",
                            1,
                            b"s",
                            RenameFlags {
                                exchange: true,
                                ..Default::default()
                            },
                        )
                    }),
                    Step::Sync,
                ])
                .collect(),
        ),
        ("many_small_files", {
            let mut steps = vec![op(|fs| fs.mkdir_path("/d").map(|_| ()))];
            for i in 0..150 {
                let data = pattern(100 + i * 40, i as u8);
                steps.extend(write_file(format!("/d/small-{i}"), data, false));
            }
            steps.push(Step::Sync);
            for i in (0..150).step_by(3) {
                steps.push(op(move |fs| fs.remove_path(&format!("/d/small-{i}"))));
            }
            steps.push(Step::Fsync);
            steps.extend(write_file("/d/small-7", pattern(9000, 9), false));
            steps.push(Step::Sync);
            // Packed beside the holes the deletes left: whole free blocks only, so a torn
            // write of this commit's run cannot reach the durable files around the holes.
            for i in 0..8 {
                steps.extend(write_file(
                    format!("/d/later-{i}"),
                    pattern(700 + i * 900, 40 + i as u8),
                    false,
                ));
            }
            steps.push(Step::Sync);
            steps
        }),
        (
            // `create_file`: the entry, the inode and the data logged as one change (whole
            // chunks written ahead of it and logged by address), with and without a
            // locality hint, so a crash leaves each file whole or absent, never empty.
            "whole_files_in_one_step",
            {
                let mut steps = vec![op(|fs| fs.mkdir_path("/h").map(|_| ()))];
                for (i, len) in [5_000usize, 0, 200_000, 131_072, 700, 3_000]
                    .iter()
                    .enumerate()
                {
                    let data = pattern(*len, 60 + i as u8);
                    steps.push(op(move |fs| {
                        let dir = fs.resolve("/h")?;
                        let near = fs.lookup(dir, b"f0").ok().map(|attr| attr.ino);
                        let name = format!("f{i}");
                        fs.create_file(Caller::ROOT, dir, name.as_bytes(), 0o644, &data, near)
                            .map(|_| ())
                    }));
                    if i == 2 {
                        steps.push(Step::Fsync);
                    }
                }
                steps.push(Step::Sync);
                steps.push(op(|fs| fs.remove_path("/h/f2")));
                steps.push(op(|fs| {
                    let dir = fs.resolve("/h")?;
                    let data = pattern(70_000, 77);
                    fs.create_file(Caller::ROOT, dir, b"f2", 0o600, &data, None)
                        .map(|_| ())
                }));
                steps.push(Step::Fsync);
                steps
            },
        ),
        (
            // Small overwrites of committed chunks become patches: through the log, across
            // commits, widened within a group, then folded back into their chunk.
            "patches",
            ({
                let mut steps: Vec<Step> = write_file("/p", pattern(300_000, 5), false).into();
                steps.extend([
                    Step::Sync,
                    op(|fs| {
                        let ino = fs.resolve("/p")?;
                        fs.write(ino, 8192, &pattern(4096, 6)).map(|_| ())
                    }),
                    // The same page again, same group: the log takes only these bytes.
                    op(|fs| {
                        let ino = fs.resolve("/p")?;
                        fs.write(ino, 9000, &pattern(50, 16)).map(|_| ())
                    }),
                    Step::Fsync,
                    op(|fs| {
                        let ino = fs.resolve("/p")?;
                        fs.write(ino, 12_000, &pattern(5000, 7)).map(|_| ())
                    }),
                    op(|fs| {
                        let ino = fs.resolve("/p")?;
                        fs.write(ino, 70_000, &pattern(100, 8)).map(|_| ())
                    }),
                    Step::Sync,
                ]);
                // More patches of one chunk than it may hold: the last write folds them in.
                for i in 0..10u64 {
                    steps.push(op(move |fs| {
                        let ino = fs.resolve("/p")?;
                        fs.write(ino, i * 6000, &pattern(3000, 9 + i as u8))
                            .map(|_| ())
                    }));
                    steps.push(Step::Sync);
                }
                steps.extend([
                    op(|fs| {
                        let ino = fs.resolve("/p")?;
                        fs.setattr(
                            ino,
                            &SetAttr {
                                size: Some(10_000),
                                ..Default::default()
                            },
                        )
                        .map(|_| ())
                    }),
                    Step::Fsync,
                ]);
                steps
            }),
        ),
    ]
}

/// POSIX refusals (ENOENT, EEXIST, ...) are part of a random workload; only I/O failures
/// stop it.
fn tolerate(result: anvil::Result<()>) -> anvil::Result<()> {
    match result {
        Err(Error::Posix(_)) => Ok(()),
        other => other,
    }
}

/// A seeded random workload over a small namespace.
fn random_workload(seed: u64) -> Vec<Step> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let names = ["/a", "/b", "/d/a", "/d/b", "/d/e/c"];
    let mut steps = vec![
        op(|fs| tolerate(fs.mkdir_path("/d").map(|_| ()))),
        op(|fs| tolerate(fs.mkdir_path("/d/e").map(|_| ()))),
    ];
    for _ in 0..14 {
        let path = names[next(names.len() as u64) as usize];
        let other = names[next(names.len() as u64) as usize];
        let len = [10usize, 3000, 70_000, 140_000][next(4) as usize];
        let fill = next(256) as u8;
        let offset = next(200_000);
        let step = match next(10) {
            0..=2 => {
                let [create, write] = write_file(path, pattern(len, fill), true);
                steps.push(create);
                write
            }
            3 => op(move |fs| {
                tolerate(fs.resolve(path).and_then(|ino| {
                    fs.write(ino, offset, &pattern(len / 4 + 1, fill))
                        .map(|_| ())
                }))
            }),
            4 => op(move |fs| tolerate(fs.remove_path(path))),
            5 => op(move |fs| tolerate(fs.rename_path(path, other))),
            6 => op(move |fs| {
                tolerate(fs.resolve(path).and_then(|ino| {
                    fs.setattr(
                        ino,
                        &SetAttr {
                            size: Some(offset / 2),
                            ..Default::default()
                        },
                    )
                    .map(|_| ())
                }))
            }),
            7 => op(move |fs| {
                tolerate(
                    fs.resolve(path)
                        .and_then(|ino| fs.setxattr(ino, b"user.x", &[fill; 40], false, false)),
                )
            }),
            8 if next(2) == 0 => Step::Sync,
            8 => Step::Snapshot(format!("s{}", steps.len())),
            _ => Step::Fsync,
        };
        steps.push(step);
    }
    steps.push(Step::Fsync);
    steps
}

fn options() -> MountOptions {
    MountOptions {
        commit_interval_ms: 0,
        ..Default::default()
    }
}

fn fresh_image() -> Pages {
    let device = Arc::new(MemDevice::new(0));
    Filesystem::mkfs(device.clone(), 32 << 20, "crash").unwrap();
    device.pages()
}

struct Reference {
    /// State after each step (index 0: before the first step).
    dumps: Vec<Dump>,
    /// (TID, state) of every sync and snapshot.
    commits: Vec<(u64, Dump)>,
    /// (label, TID, step index) of every snapshot.
    snapshots: Vec<(String, u64, usize)>,
    writes_total: u64,
}

/// Runs a workload until done or the first failure. Returns (steps completed, the highest
/// step index whose durability was acknowledged).
fn run(fs: &Filesystem, steps: &[Step]) -> (usize, usize) {
    let mut durable = 0;
    for (index, step) in steps.iter().enumerate() {
        let result = match step {
            Step::Op(f) => f(fs),
            Step::Sync => fs.sync().map(|_| ()),
            Step::Snapshot(label) => fs.snapshot(label).map(|_| ()),
            Step::Fsync => fs.fsync(1),
        };
        if result.is_err() {
            return (index, durable);
        }
        if !matches!(step, Step::Op(_)) {
            durable = index + 1;
        }
    }
    (steps.len(), durable)
}

fn reference(image: &Pages, steps: &[Step]) -> Reference {
    reference_with(image, steps, None)
}

fn reference_with(image: &Pages, steps: &[Step], log: Option<&CrashLog>) -> Reference {
    let device = Arc::new(CrashDevice::from_pages(image.clone()));
    let opened = log.map_or_else(options, CrashLog::options);
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, opened).unwrap();
    let mut dumps = vec![dump(&fs)];
    let mut commits = Vec::new();
    let mut snapshots = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        match step {
            Step::Op(f) => f(&fs).unwrap(),
            Step::Sync => {
                let tid = fs.sync().unwrap();
                commits.push((tid, dump(&fs)));
            }
            Step::Snapshot(label) => {
                let tid = fs.snapshot(label).unwrap();
                commits.push((tid, dump(&fs)));
                snapshots.push((label.clone(), tid, index));
            }
            Step::Fsync => fs.fsync(1).unwrap(),
        }
        dumps.push(dump(&fs));
    }
    let writes_total = device.writes_total();
    Reference {
        dumps,
        commits,
        snapshots,
        writes_total,
    }
}

/// Threads crash states are checked on: `ANVIL_CRASH_THREADS`, else every CPU.
fn threads() -> usize {
    std::env::var("ANVIL_CRASH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

#[test]
fn crash_at_every_write() {
    crash_at_every_write_of(false);
}

/// The same with a crash log file: power losses recover without it (tmpfs does not survive
/// them), a killed process with the file as it left it.
#[test]
fn crash_at_every_write_with_a_crash_log_file() {
    crash_at_every_write_of(true);
}

fn crash_at_every_write_of(with_file: bool) {
    let image = fresh_image();
    let started = std::time::Instant::now();
    let crash_states = std::sync::atomic::AtomicUsize::new(0);
    let threads = threads();
    for (name, steps) in workloads() {
        let log = with_file.then(CrashLog::new);
        let reference = reference_with(&image, &steps, log.as_ref());
        // Cuts are independent: each thread takes every `threads`-th one.
        std::thread::scope(|scope| {
            for first in 0..threads as u64 {
                let (name, steps, reference, image) = (&name, &steps, &reference, &image);
                let crash_states = &crash_states;
                scope.spawn(move || {
                    let mut cut = first;
                    while cut <= reference.writes_total {
                        let states = crash_at(name, steps, reference, image, cut, with_file);
                        crash_states.fetch_add(states, std::sync::atomic::Ordering::Relaxed);
                        cut += threads as u64;
                    }
                });
            }
        });
    }
    let crash_states = crash_states.into_inner();
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "crash states checked: {crash_states} in {seconds:.1} s ({:.0}/s, {threads} threads)",
        crash_states as f64 / seconds
    );
    assert!(crash_states > 500);
}

/// Runs `steps` with the power cut after device write `cut`, then checks the image built
/// each way a crash can leave it. Returns the number of crash states checked.
fn crash_at(
    name: &str,
    steps: &[Step],
    reference: &Reference,
    image: &Pages,
    cut: u64,
    with_file: bool,
) -> usize {
    let log = with_file.then(CrashLog::new);
    let device = Arc::new(CrashDevice::from_pages(image.clone()));
    device.cut_power_after(cut);
    // Opening writes a superblock (the writer's log salt): the power may go even then.
    let opened = log.as_ref().map_or_else(options, CrashLog::options);
    let (done, durable) = match Filesystem::open(device.clone() as Arc<dyn Device>, opened) {
        Ok(fs) => run(&fs, steps),
        Err(_) => (0, 0),
    };
    // The last mode is a crash of the process, not of the machine: every write issued
    // survives (the host kernel has it), so every acknowledged step must too.
    let killed = CrashMode::Prefix(device.pending_writes());
    let modes = [
        CrashMode::DropAll,
        CrashMode::Prefix(device.pending_writes() / 2),
        CrashMode::Subset(cut * 7 + 1),
        CrashMode::Subset(cut * 7 + 2),
        CrashMode::Torn(cut * 13 + 5),
        CrashMode::Torn(cut * 13 + 6),
        killed,
    ];
    for (index, mode) in modes.into_iter().enumerate() {
        let process_crash = index == modes.len() - 1;
        let crashed = device.crash_pages(mode);
        let context = match process_crash {
            true => format!("{name}: process killed after write {cut}"),
            false => format!("{name}: power cut after write {cut}, {mode:?}"),
        };
        let recovered = Arc::new(MemDevice::from_pages(crashed));
        let reopened = match (&log, process_crash) {
            (Some(log), true) => log.killed(),
            _ => options(),
        };
        let fs = match Filesystem::open(recovered as Arc<dyn Device>, reopened) {
            Ok(fs) => fs,
            Err(e) => panic!("{context}: volume does not open: {e}"),
        };
        let report = anvil::check::check(fs.volume()).unwrap();
        assert!(report.is_clean(), "{context}: check: {:?}", report.problems);
        let state = dump(&fs);
        // After a power loss, any state from the last durable step on; after a crash of
        // the process, the state after the last acknowledged step (or after the step that
        // failed, if its change was logged before a later write of it failed).
        let first = if process_crash { done } else { durable };
        let matches: Vec<usize> = (first..=(done + 1).min(steps.len()))
            .filter(|&i| reference.dumps[i] == state)
            .collect();
        assert!(
            !matches.is_empty(),
            "{context}: state matches no step in {first}..={done} (it is the state before steps \
             {:?}): {state:#?}",
            (0..reference.dumps.len())
                .filter(|&i| reference.dumps[i] == state)
                .collect::<Vec<_>>()
        );
        let committed = fs.volume().committed_tid();
        for (tid, expected) in &reference.commits {
            if *tid < committed {
                assert_eq!(&dump_at(&fs, *tid), expected, "{context}: as-of view {tid}");
            }
        }
        // Every snapshot acknowledged before the power cut is listed, at its TID.
        let listed = fs.snapshots().unwrap();
        for (label, tid, index) in &reference.snapshots {
            if *index < durable {
                assert!(
                    listed.iter().any(|s| &s.label == label && s.tid == *tid),
                    "{context}: snapshot {label} at {tid} lost: {listed:?}"
                );
            }
        }
        // The recovered volume keeps working.
        fs.write_file("/after-crash", b"ok").unwrap();
        fs.sync().unwrap();
        assert!(
            anvil::check::check(fs.volume()).unwrap().is_clean(),
            "{context}: after write"
        );
    }
    modes.len()
}

/// Where a test's process keeps its crash log, if it has one (the mount's default), and
/// how a crash leaves it: the file as it was when the process died.
struct CrashLog {
    dir: tempfile::TempDir,
    kills: std::cell::Cell<usize>,
}

impl CrashLog {
    fn new() -> CrashLog {
        CrashLog {
            dir: tempfile::tempdir().unwrap(),
            kills: std::cell::Cell::new(0),
        }
    }

    fn options(&self) -> MountOptions {
        MountOptions {
            crash_log_file: Some(self.dir.path().join("live.log")),
            ..options()
        }
    }

    /// Options that recover from a kill now: a copy of the live file as the process left it.
    fn killed(&self) -> MountOptions {
        let kills = self.kills.get() + 1;
        self.kills.set(kills);
        let copy = self.dir.path().join(format!("killed-{kills}.log"));
        std::fs::copy(self.dir.path().join("live.log"), &copy).unwrap();
        MountOptions {
            crash_log_file: Some(copy),
            ..options()
        }
    }
}

/// A crash of the process (kill -9, OOM) between any two steps loses nothing: every write
/// it issued reaches the host, and the volume recovers to the state after the last step.
#[test]
fn process_crash_after_every_step_loses_nothing() {
    process_crash_after_every_step(None);
}

/// The same, with the changes between fsyncs in a crash log file (as a mount keeps them).
#[test]
fn process_crash_after_every_step_loses_nothing_with_a_crash_log_file() {
    process_crash_after_every_step(Some(&CrashLog::new()));
}

fn process_crash_after_every_step(log: Option<&CrashLog>) {
    let image = fresh_image();
    let mut checked = 0;
    // Kills after which the image alone lacks acknowledged changes: the file held them.
    let mut only_in_the_file = 0;
    for (name, steps) in workloads() {
        let reference = reference(&image, &steps);
        let device = Arc::new(CrashDevice::from_pages(image.clone()));
        let opened = log.map_or_else(options, CrashLog::options);
        let fs = Filesystem::open(device.clone() as Arc<dyn Device>, opened).unwrap();
        for (index, step) in steps.iter().enumerate() {
            assert_eq!(
                run(&fs, std::slice::from_ref(step)).0,
                1,
                "{name}: step {index}"
            );
            let killed = device.crash_pages(CrashMode::Prefix(device.pending_writes()));
            if log.is_some() {
                let alone = Arc::new(MemDevice::from_pages(killed.clone()));
                let alone = Filesystem::open(alone as Arc<dyn Device>, options()).unwrap();
                only_in_the_file += (dump(&alone) != reference.dumps[index + 1]) as usize;
            }
            let recovered = Arc::new(MemDevice::from_pages(killed));
            let reopened = log.map_or_else(options, CrashLog::killed);
            let fs = Filesystem::open(recovered as Arc<dyn Device>, reopened).unwrap();
            let context = format!("{name}: process killed after step {index}");
            assert_eq!(dump(&fs), reference.dumps[index + 1], "{context}");
            let report = anvil::check::check(fs.volume()).unwrap();
            assert!(report.is_clean(), "{context}: check: {:?}", report.problems);
            checked += 1;
        }
    }
    assert!(checked > 300, "{checked} process crashes checked");
    if log.is_some() {
        assert!(
            only_in_the_file > checked / 2,
            "{only_in_the_file} of {checked}"
        );
    }
}

/// The redo log is a ring: thousands of small operations without a commit go round it
/// several times (a full ring commits to free itself). Killed at any point, the process
/// loses nothing; after a power loss, everything up to the last fsync is there.
#[test]
fn the_log_ring_wraps_and_loses_nothing() {
    the_log_ring_wraps(None);
}

/// The same with a crash log file: its ring wraps too, fsync copies it to the image's.
#[test]
fn the_log_ring_wraps_and_loses_nothing_with_a_crash_log_file() {
    the_log_ring_wraps(Some(&CrashLog::new()));
}

fn the_log_ring_wraps(log: Option<&CrashLog>) {
    let device = Arc::new(CrashDevice::from_pages(fresh_image()));
    let opened = log.map_or_else(options, CrashLog::options);
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, opened).unwrap();
    let ring_bytes = anvil::internals::Volume::read_superblock(&*device)
        .unwrap()
        .log_bytes;
    let mut logged = 0u64;
    let mut fsynced = 0usize;
    for i in 0..6000usize {
        let path = format!("/f{}", i % 700);
        fs.write_file(&path, &pattern(300 + i % 1500, i as u8))
            .unwrap();
        logged += 1;
        if i % 97 == 0 {
            fs.fsync(1).unwrap();
            fsynced = i;
        }
        if i % 701 == 350 {
            let expected = dump(&fs);
            let killed = device.crash_pages(CrashMode::Prefix(device.pending_writes()));
            let recovered = Filesystem::open(
                Arc::new(MemDevice::from_pages(killed)) as Arc<dyn Device>,
                log.map_or_else(options, CrashLog::killed),
            )
            .unwrap();
            assert_eq!(dump(&recovered), expected, "killed after {i} writes");
            let lost = device.crash_pages(CrashMode::DropAll);
            let recovered = Filesystem::open(
                Arc::new(MemDevice::from_pages(lost)) as Arc<dyn Device>,
                options(),
            )
            .unwrap();
            let name = format!("/f{}", fsynced % 700);
            assert_eq!(
                recovered.read_file(&name).unwrap(),
                pattern(300 + fsynced % 1500, fsynced as u8),
                "power lost after {i} writes: {name}, fsync'd at {fsynced}"
            );
        }
    }
    // Each write_file logs two batches of at least 512 bytes.
    assert!(
        logged * 1024 > 2 * ring_bytes,
        "the ring went round only once"
    );
}

/// Changes that find the ring full, with no commit under way (no committer here), commit
/// themselves to free it; killed right after, the process loses none of them.
#[test]
fn a_full_log_ring_commits_and_loses_nothing() {
    let device = Arc::new(CrashDevice::from_pages(fresh_image()));
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    let ring_bytes = anvil::internals::Volume::read_superblock(&*device)
        .unwrap()
        .log_bytes;
    // Files under a chunk are logged whole: the ring holds a few dozen.
    let files = usize::try_from(3 * ring_bytes / 60_000).unwrap();
    for i in 0..files {
        fs.write_file(&format!("/f{i}"), &pattern(60_000, i as u8))
            .unwrap();
    }
    let report = fs.volume().report();
    let count = |name: &str| {
        report
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, v)| *v)
    };
    assert!(count("log_full_commits") > 0, "{report:?}");
    let expected = dump(&fs);
    let killed = device.crash_pages(CrashMode::Prefix(device.pending_writes()));
    let recovered = Filesystem::open(
        Arc::new(MemDevice::from_pages(killed)) as Arc<dyn Device>,
        options(),
    )
    .unwrap();
    assert_eq!(dump(&recovered), expected);
}

/// A commit makes its tree durable with the one flush after its superblock, and a power cut
/// before that flush may keep any of its writes. Mount takes that superblock only if every
/// range the commit's manifest lists is whole; with any one of them lost it opens the commit
/// before, replays the log, and loses nothing acknowledged.
#[test]
fn a_superblock_whose_commit_did_not_land_whole_is_passed_over() {
    use anvil::internals::Volume;
    let device = Arc::new(CrashDevice::from_pages(fresh_image()));
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    fs.write_file("/a", &pattern(200_000, 1)).unwrap();
    fs.sync().unwrap();
    let before = Volume::read_superblock(&*device).unwrap();
    // Whole chunks written ahead, a small tail and a directory for the commit to write;
    // fsync puts them in the log.
    fs.write_file("/b", &pattern(150_000, 2)).unwrap();
    fs.mkdir_path("/d").unwrap();
    fs.write_file("/d/c", &pattern(3000, 3)).unwrap();
    fs.fsync(1).unwrap();
    let expected = dump(&fs);
    device.fail_flushes();
    assert!(fs.sync().is_err());
    let offsets = device.pending_offsets();
    let sb_at = *offsets.last().unwrap();
    assert!(sb_at < 8192, "the superblock is written last: {offsets:?}");
    let mut passed_over = 0;
    for lost in 0..offsets.len() - 1 {
        let image = device.crash_pages(CrashMode::AllBut(lost));
        let recovered = Arc::new(MemDevice::from_pages(image));
        let sb = Volume::read_superblock(&*recovered).unwrap();
        let context = format!("write {lost} of {offsets:?} lost");
        if offsets[lost] >= before.data_offset {
            // A node, an extent, the map or the manifest: the commit is not whole.
            assert_eq!(sb.seq, before.seq, "{context}");
            passed_over += 1;
        } else {
            // The log's last batch: the commit holds its changes.
            assert_eq!(sb.seq, before.seq + 1, "{context}");
        }
        let fs = Filesystem::open(recovered as Arc<dyn Device>, options()).unwrap();
        assert_eq!(dump(&fs), expected, "{context}");
        let report = anvil::check::check(fs.volume()).unwrap();
        assert!(report.is_clean(), "{context}: {:?}", report.problems);
    }
    // The extents in one request, the nodes, map and manifest in another.
    assert!(passed_over >= 2, "{offsets:?}");
    // With every write, the new superblock is taken.
    let whole = device.crash_pages(CrashMode::Prefix(offsets.len()));
    let sb = Volume::read_superblock(&MemDevice::from_pages(whole)).unwrap();
    assert_eq!(sb.seq, before.seq + 1);
    assert_ne!(sb.manifest_address, 0);
}

#[test]
fn failed_fsync_is_reported_and_volume_goes_read_only() {
    use anvil::device::{Fault, FaultDevice};
    let image = fresh_image();
    let inner = Arc::new(MemDevice::from_pages(image));
    let device = Arc::new(FaultDevice::new(inner.clone()));
    let fs = Filesystem::open(device.clone() as Arc<dyn Device>, options()).unwrap();
    fs.write_file("/kept", b"durable").unwrap();
    fs.sync().unwrap();
    fs.write_file("/lost", b"pending").unwrap();
    device.inject(Fault::FlushErrorAfter(0));
    assert!(fs.fsync(1).is_err(), "a failed flush must fail fsync");
    let more = fs.write_file("/more", b"x");
    assert!(matches!(more, Err(Error::Stopped(_))), "{more:?}");
    assert!(more
        .unwrap_err()
        .to_string()
        .contains("stopped taking changes"));
    drop(fs);
    let fs = Filesystem::open(inner as Arc<dyn Device>, options()).unwrap();
    assert_eq!(fs.read_file("/kept").unwrap(), b"durable");
    assert!(anvil::check::check(fs.volume()).unwrap().is_clean());
}
