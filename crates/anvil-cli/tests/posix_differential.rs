//! Differential POSIX test: a seeded random sequence of file system
//! operations runs identically against a tmpfs directory (the reference) and
//! a mounted anvil volume; every result (value or errno) must match, and at
//! checkpoints and at the end so must the whole tree: names, types, sizes,
//! modes, link counts, hard-link groups, symlink targets, xattrs and every
//! byte of every file.
//!
//! Environment:
//! * `ANVIL_DIFF_SEED`     replay a seed (decimal or 0x-hex); random otherwise.
//! * `ANVIL_DIFF_OPS`      number of operations (default 3000).
//! * `ANVIL_DIFF_CHECK_EVERY` compare whole trees every N ops (default 250;
//!   1 finds the exact operation after which a file's contents diverge).
//! * `ANVIL_DIFF_VERBOSE=1` print every operation and its result.
//! * `ANVIL_DIFF_SELFTEST=1` check the harness itself instead: tmpfs against
//!   tmpfs (no FUSE needed), plus replay determinism of seed and results.
//! * `ANVIL_REQUIRE_FUSE=1` fail instead of skipping when FUSE is unavailable.
//!
//! Run: `cargo test -p anvil-cli --test posix_differential -- --nocapture`.

mod common;

use std::collections::{HashMap, VecDeque};
use std::ffi::CString;
use std::fmt;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rand::{Rng, RngCore, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

const DEFAULT_OPS: usize = 3000;
/// Compare the complete trees after every this many operations (by default).
const DEFAULT_CHECK_EVERY: usize = 250;
/// Open file slots; fd operations on an empty slot use fd -1 (EBADF on both).
const SLOTS: usize = 4;
/// The namespace: directories nest up to 3 deep, files sit at depth 0 to 2.
const DIR_NAMES: [&str; 3] = ["d0", "d1", "d2"];
const FILE_NAMES: [&str; 5] = ["f0", "f1", "f2", "f3", "f4"];
const XATTR_NAMES: [&str; 3] = ["user.a", "user.b", "user.a.longer.name"];
/// Largest single read or write.
const MAX_IO: usize = 200 * 1024;
/// Offsets and truncation lengths stay below this (sparse files get this big).
const FAR_LIMIT: u64 = 16 << 20;
/// How many recent operations a failure report shows.
const HISTORY: usize = 12;

#[test]
fn posix_differential() {
    let cfg = Config::from_env();
    if cfg.selftest {
        selftest(&cfg);
        return;
    }
    if !common::fuse_or_skip("posix_differential") {
        return;
    }
    cfg.announce("tmpfs vs anvil");
    let reference = Side::new("tmpfs", Backing::Tmpfs(Tmpfs::new()));
    let anvil = Side::new("anvil", Backing::Anvil(Some(common::Mount::new())));
    let mut harness = Harness::new(&cfg, reference, anvil);
    harness.run();
    harness.finish();
}

/// Tmpfs against tmpfs: whatever differs is a bug in the harness. Runs twice
/// and checks that the same seed gave the same operations and results, so
/// that `ANVIL_DIFF_SEED` replays a failure exactly.
fn selftest(cfg: &Config) {
    cfg.announce("self-test: tmpfs vs tmpfs");
    let mut traces = Vec::new();
    for round in 0..2 {
        let a = Side::new("tmpfs-a", Backing::Tmpfs(Tmpfs::new()));
        let b = Side::new("tmpfs-b", Backing::Tmpfs(Tmpfs::new()));
        let mut harness = Harness::new(cfg, a, b);
        harness.run();
        let stats = harness.stats.clone();
        let trace = harness.trace;
        harness.finish();
        eprintln!(
            "posix_differential: self-test round {round}: trace {trace:016x}, {} errors, \
             {} tree checks, {} file bytes compared",
            stats.errors, stats.tree_checks, stats.bytes_compared
        );
        traces.push(trace);
    }
    assert_eq!(
        traces[0], traces[1],
        "seed {:#x}: operations or results differ between two runs",
        cfg.seed
    );
    selftest_detection(cfg);
}

/// The tree comparison must notice each kind of difference it claims to check.
fn selftest_detection(cfg: &Config) {
    type Mutation = fn(&Path);
    let mutations: [(&str, Mutation); 8] = [
        ("one byte of file data", |r| {
            let p = r.join("probe");
            let mut data = std::fs::read(&p).unwrap();
            data[5000] ^= 0x40;
            std::fs::write(&p, data).unwrap();
        }),
        ("file size", |r| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(r.join("probe"))
                .unwrap();
            f.set_len(8193).unwrap();
        }),
        ("file mode", |r| chmod(&r.join("probe"), 0o640)),
        ("directory mode", |r| chmod(&r.join("probedir"), 0o700)),
        ("an xattr value", |r| {
            set_xattr(&r.join("probedir"), "user.p", b"2")
        }),
        ("an extra name", |r| {
            std::fs::write(r.join("probedir/extra"), b"").unwrap()
        }),
        ("a hard link turned copy", |r| {
            std::fs::remove_file(r.join("probe.link")).unwrap();
            std::fs::copy(r.join("probe"), r.join("probe.link")).unwrap();
        }),
        ("a symlink target", |r| {
            std::fs::remove_file(r.join("probe.sym")).unwrap();
            std::os::unix::fs::symlink("probf", r.join("probe.sym")).unwrap();
        }),
    ];
    let short = Config {
        ops: cfg.ops.min(300),
        ..*cfg
    };
    for (what, mutate) in mutations {
        let a = Side::new("tmpfs-a", Backing::Tmpfs(Tmpfs::new()));
        let b = Side::new("tmpfs-b", Backing::Tmpfs(Tmpfs::new()));
        let mut harness = Harness::new(&short, a, b);
        harness.run();
        for root in [&harness.a.root, &harness.b.root] {
            let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
            std::fs::write(root.join("probe"), data).unwrap();
            std::fs::hard_link(root.join("probe"), root.join("probe.link")).unwrap();
            std::os::unix::fs::symlink("probe", root.join("probe.sym")).unwrap();
            std::fs::create_dir(root.join("probedir")).unwrap();
            set_xattr(&root.join("probedir"), "user.p", b"1");
        }
        harness.compare_trees("detection self-test, before the change");
        mutate(&harness.b.root);
        if expect_mismatch(|| harness.compare_trees("detection self-test")).is_none() {
            panic!("the tree comparison missed a difference in {what}");
        }
    }
    // And an operation's result: the second side starts with a directory at
    // every top-level file name.
    let a = Side::new("tmpfs-a", Backing::Tmpfs(Tmpfs::new()));
    let b = Side::new("tmpfs-b", Backing::Tmpfs(Tmpfs::new()));
    for name in FILE_NAMES {
        std::fs::create_dir(b.root.join(name)).unwrap();
    }
    let mut harness = Harness::new(&short, a, b);
    let message = expect_mismatch(|| harness.run())
        .unwrap_or_else(|| panic!("the harness missed differing operation results"));
    if cfg.verbose {
        eprintln!("posix_differential: self-test: a sample failure report:\n{message}");
    }
    eprintln!(
        "posix_differential: self-test: caught differing results and all {} kinds of tree change",
        mutations.len()
    );
}

/// Runs `f`, which should fail with a mismatch report; returns the report.
fn expect_mismatch(f: impl FnOnce()) -> Option<String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    match caught {
        Ok(()) => None,
        Err(e) => {
            let text = panic_text(&e);
            assert!(text.contains("MISMATCH"), "unexpected panic: {text}");
            Some(text)
        }
    }
}

fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    // SAFETY: valid strings and a value buffer of the given length.
    let r = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

// ---------------------------------------------------------------------------
// Configuration

#[derive(Clone, Copy)]
struct Config {
    seed: u64,
    ops: usize,
    check_every: usize,
    verbose: bool,
    selftest: bool,
}

impl Config {
    fn from_env() -> Config {
        let seed = match std::env::var("ANVIL_DIFF_SEED") {
            Ok(s) => parse_u64(&s).unwrap_or_else(|| panic!("bad ANVIL_DIFF_SEED {s:?}")),
            Err(_) => random_seed(),
        };
        let ops = match std::env::var("ANVIL_DIFF_OPS") {
            Ok(s) => parse_u64(&s).unwrap_or_else(|| panic!("bad ANVIL_DIFF_OPS {s:?}")) as usize,
            Err(_) => DEFAULT_OPS,
        };
        let check_every = match std::env::var("ANVIL_DIFF_CHECK_EVERY") {
            Ok(s) => parse_u64(&s)
                .filter(|&n| n > 0)
                .unwrap_or_else(|| panic!("bad ANVIL_DIFF_CHECK_EVERY {s:?}"))
                as usize,
            Err(_) => DEFAULT_CHECK_EVERY,
        };
        let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        Config {
            seed,
            ops,
            check_every,
            verbose: flag("ANVIL_DIFF_VERBOSE"),
            selftest: flag("ANVIL_DIFF_SELFTEST"),
        }
    }

    fn announce(&self, what: &str) {
        eprintln!(
            "posix_differential: {what}: seed={:#x} ops={} (replay: {})",
            self.seed,
            self.ops,
            self.replay()
        );
    }

    fn replay(&self) -> String {
        format!(
            "{}ANVIL_DIFF_SEED={:#x} ANVIL_DIFF_OPS={} cargo test -p anvil-cli \
             --test posix_differential -- --nocapture",
            if self.selftest {
                "ANVIL_DIFF_SELFTEST=1 "
            } else {
                ""
            },
            self.seed,
            self.ops
        )
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // One splitmix64 step so that nearby times give unrelated seeds.
    let mut z = nanos ^ (u64::from(std::process::id()) << 32);
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------
// Operations

#[derive(Clone, Debug)]
enum Op {
    /// Opens `path`; on success the slot's previous file (if any) is closed.
    Open {
        slot: usize,
        path: String,
        flags: i32,
        mode: u32,
    },
    Close {
        slot: usize,
    },
    Pwrite {
        slot: usize,
        off: u64,
        len: usize,
        fill: u64,
    },
    Write {
        slot: usize,
        len: usize,
        fill: u64,
    },
    Pread {
        slot: usize,
        off: u64,
        len: usize,
    },
    Read {
        slot: usize,
        len: usize,
    },
    Lseek {
        slot: usize,
        off: i64,
        whence: i32,
    },
    Ftruncate {
        slot: usize,
        len: u64,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Fsync {
        slot: usize,
        data_only: bool,
    },
    Fstat {
        slot: usize,
    },
    Stat {
        path: String,
        follow: bool,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    Rename {
        from: String,
        to: String,
        flags: u32,
    },
    Link {
        from: String,
        to: String,
    },
    Symlink {
        target: String,
        path: String,
    },
    Readlink {
        path: String,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    SetXattr {
        path: String,
        name: &'static str,
        len: usize,
        fill: u64,
        flags: i32,
        follow: bool,
    },
    GetXattr {
        path: String,
        name: &'static str,
        size: usize,
        follow: bool,
    },
    ListXattr {
        path: String,
        size: usize,
        follow: bool,
    },
    RemoveXattr {
        path: String,
        name: &'static str,
        follow: bool,
    },
    /// Lists a directory ("" is the root).
    Readdir {
        path: String,
    },
}

impl Op {
    /// The bytes a write-like operation writes.
    fn payload(&self) -> Vec<u8> {
        match *self {
            Op::Pwrite { len, fill, .. }
            | Op::Write { len, fill, .. }
            | Op::SetXattr { len, fill, .. } => fill_bytes(fill, len),
            _ => Vec::new(),
        }
    }
}

fn fill_bytes(fill: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0; len];
    Xoshiro256PlusPlus::seed_from_u64(fill).fill_bytes(&mut buf);
    buf
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = |follow: bool| if follow { "" } else { "l" };
        match self {
            Op::Open {
                slot,
                path,
                flags,
                mode,
            } => {
                write!(
                    f,
                    "open(slot{slot}, {path:?}, {}, {mode:#o})",
                    open_flags(*flags)
                )
            }
            Op::Close { slot } => write!(f, "close(slot{slot})"),
            Op::Pwrite {
                slot,
                off,
                len,
                fill,
            } => {
                write!(
                    f,
                    "pwrite(slot{slot}, off={off}, len={len}, fill={fill:#x})"
                )
            }
            Op::Write { slot, len, fill } => {
                write!(f, "write(slot{slot}, len={len}, fill={fill:#x})")
            }
            Op::Pread { slot, off, len } => write!(f, "pread(slot{slot}, off={off}, len={len})"),
            Op::Read { slot, len } => write!(f, "read(slot{slot}, len={len})"),
            Op::Lseek { slot, off, whence } => {
                let w = match *whence {
                    libc::SEEK_SET => "SEEK_SET",
                    libc::SEEK_CUR => "SEEK_CUR",
                    _ => "SEEK_END",
                };
                write!(f, "lseek(slot{slot}, {off}, {w})")
            }
            Op::Ftruncate { slot, len } => write!(f, "ftruncate(slot{slot}, {len})"),
            Op::Truncate { path, len } => write!(f, "truncate({path:?}, {len})"),
            Op::Fsync { slot, data_only } => {
                write!(
                    f,
                    "{}(slot{slot})",
                    if *data_only { "fdatasync" } else { "fsync" }
                )
            }
            Op::Fstat { slot } => write!(f, "fstat(slot{slot})"),
            Op::Stat { path, follow } => write!(f, "{}stat({path:?})", l(*follow)),
            Op::Unlink { path } => write!(f, "unlink({path:?})"),
            Op::Mkdir { path, mode } => write!(f, "mkdir({path:?}, {mode:#o})"),
            Op::Rmdir { path } => write!(f, "rmdir({path:?})"),
            Op::Rename { from, to, flags } => {
                let flags = match *flags {
                    0 => "0",
                    libc::RENAME_NOREPLACE => "RENAME_NOREPLACE",
                    _ => "RENAME_EXCHANGE",
                };
                write!(f, "renameat2({from:?}, {to:?}, {flags})")
            }
            Op::Link { from, to } => write!(f, "link({from:?}, {to:?})"),
            Op::Symlink { target, path } => write!(f, "symlink({target:?}, {path:?})"),
            Op::Readlink { path } => write!(f, "readlink({path:?})"),
            Op::Chmod { path, mode } => write!(f, "chmod({path:?}, {mode:#o})"),
            Op::SetXattr {
                path,
                name,
                len,
                fill,
                flags,
                follow,
            } => {
                let flags = match *flags {
                    0 => "0",
                    libc::XATTR_CREATE => "XATTR_CREATE",
                    _ => "XATTR_REPLACE",
                };
                write!(
                    f,
                    "{}setxattr({path:?}, {name:?}, len={len}, fill={fill:#x}, {flags})",
                    l(*follow)
                )
            }
            Op::GetXattr {
                path,
                name,
                size,
                follow,
            } => {
                write!(f, "{}getxattr({path:?}, {name:?}, size={size})", l(*follow))
            }
            Op::ListXattr { path, size, follow } => {
                write!(f, "{}listxattr({path:?}, size={size})", l(*follow))
            }
            Op::RemoveXattr { path, name, follow } => {
                write!(f, "{}removexattr({path:?}, {name:?})", l(*follow))
            }
            Op::Readdir { path } => write!(f, "readdir({path:?})"),
        }
    }
}

fn open_flags(flags: i32) -> String {
    let mut parts = vec![match flags & libc::O_ACCMODE {
        libc::O_RDONLY => "O_RDONLY",
        libc::O_WRONLY => "O_WRONLY",
        _ => "O_RDWR",
    }];
    for (bit, name) in [
        (libc::O_CREAT, "O_CREAT"),
        (libc::O_EXCL, "O_EXCL"),
        (libc::O_TRUNC, "O_TRUNC"),
        (libc::O_APPEND, "O_APPEND"),
        (libc::O_NOFOLLOW, "O_NOFOLLOW"),
        (libc::O_DIRECTORY, "O_DIRECTORY"),
    ] {
        if flags & bit != 0 {
            parts.push(name);
        }
    }
    parts.join("|")
}

// ---------------------------------------------------------------------------
// Generation. Paths come partly from a fixed small namespace and partly from
// the names that exist right now on the reference side, so that operations
// meet existing objects often; the sequence is still a function of the seed,
// since the reference side's state is.

/// The names in the reference tree, in walk order.
#[derive(Default)]
struct Existing {
    /// Regular files and symlinks.
    files: Vec<String>,
    dirs: Vec<String>,
}

impl Existing {
    fn scan(root: &Path) -> Existing {
        let mut ex = Existing::default();
        ex.scan_dir(root, "");
        ex
    }

    fn scan_dir(&mut self, root: &Path, rel: &str) {
        let dir = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        let Ok(children) = read_dir_sorted(&dir) else {
            return;
        };
        for (name, kind) in children {
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if kind == 'd' {
                self.dirs.push(path.clone());
                self.scan_dir(root, &path);
            } else {
                self.files.push(path);
            }
        }
    }
}

type R = Xoshiro256PlusPlus;

/// What kind of object an operation is mostly meant for.
#[derive(Clone, Copy, PartialEq)]
enum Want {
    File,
    /// A file path for an operation that creates a name: crosses over to a
    /// directory name rarely, since a file there blocks a whole subtree.
    NewFile,
    Dir,
    /// Likewise for a directory-creating operation.
    NewDir,
    Any,
}

/// A path for `want`: often an existing one of the right kind, otherwise a
/// random one from the namespace, where directories are 1 to 3 of [`DIR_NAMES`], other paths
/// end in one of [`FILE_NAMES`]. Now and then the kinds are swapped, so that
/// operations also meet the wrong kind of object (EISDIR, ENOTDIR, ...).
fn gen_path(rng: &mut R, ex: &Existing, want: Want) -> String {
    let dir = match want {
        Want::Any => rng.gen_bool(0.4),
        Want::Dir => !rng.gen_bool(0.15),
        Want::NewDir => !rng.gen_bool(0.03),
        Want::File => rng.gen_bool(0.15),
        Want::NewFile => rng.gen_bool(0.03),
    };
    let reuse = match want {
        Want::NewFile | Want::NewDir => 0.2,
        _ => 0.6,
    };
    let existing = if dir { &ex.dirs } else { &ex.files };
    if !existing.is_empty() && rng.gen_bool(reuse) {
        return existing[rng.gen_range(0..existing.len())].clone();
    }
    if dir {
        let depth = match rng.gen_range(0..100) {
            0..55 => 1,
            55..90 => 2,
            _ => 3,
        };
        gen_dir(rng, depth)
    } else {
        let leaf = pick(rng, &FILE_NAMES);
        match rng.gen_range(0..100) {
            0..35 => leaf.to_string(),
            35..85 => format!("{}/{leaf}", gen_dir(rng, 1)),
            _ => format!("{}/{leaf}", gen_dir(rng, 2)),
        }
    }
}

fn gen_dir(rng: &mut R, depth: usize) -> String {
    (0..depth)
        .map(|_| pick(rng, &DIR_NAMES))
        .collect::<Vec<_>>()
        .join("/")
}

fn gen_offset(rng: &mut R) -> u64 {
    match rng.gen_range(0..100) {
        0..10 => 0,
        10..45 => rng.gen_range(0..8192),
        45..75 => rng.gen_range(0..1 << 20),
        75..90 => rng.gen_range(0..256u64) * 4096 + rng.gen_range(0..4),
        _ => rng.gen_range(1 << 20..FAR_LIMIT),
    }
}

fn gen_len(rng: &mut R) -> usize {
    match rng.gen_range(0..100) {
        0..5 => 0,
        5..35 => rng.gen_range(1..=512),
        35..65 => rng.gen_range(1..=16384),
        65..85 => rng.gen_range(1..=16usize) * 4096 + rng.gen_range(0..3) - 1,
        _ => rng.gen_range(1..=MAX_IO),
    }
}

fn gen_truncate_len(rng: &mut R) -> u64 {
    match rng.gen_range(0..100) {
        0..25 => 0,
        25..60 => rng.gen_range(0..8192),
        60..90 => rng.gen_range(0..1 << 20),
        _ => rng.gen_range(1 << 20..FAR_LIMIT),
    }
}

fn pick<T: Copy>(rng: &mut R, items: &[T]) -> T {
    items[rng.gen_range(0..items.len())]
}

fn gen_op(rng: &mut R, ex: &Existing) -> Op {
    use Want::{Any, Dir, File, NewDir, NewFile};
    let slot = rng.gen_range(0..SLOTS);
    let follow = rng.gen_bool(0.7);
    match rng.gen_range(0..100) {
        0..13 => {
            let access = [
                libc::O_RDONLY,
                libc::O_WRONLY,
                libc::O_RDWR,
                libc::O_RDWR,
                libc::O_RDWR,
            ];
            let mut flags = pick(rng, &access);
            for (bit, p) in [
                (libc::O_CREAT, 0.7),
                (libc::O_EXCL, 0.15),
                (libc::O_TRUNC, 0.15),
                (libc::O_APPEND, 0.15),
                (libc::O_NOFOLLOW, 0.05),
                (libc::O_DIRECTORY, 0.03),
            ] {
                if rng.gen_bool(p) {
                    flags |= bit;
                }
            }
            let mode = pick(rng, &[0o644, 0o644, 0o600, 0o755, 0o666, 0o400, 0o000]);
            Op::Open {
                slot,
                path: gen_path(rng, ex, NewFile),
                flags,
                mode,
            }
        }
        13..14 => Op::Close { slot },
        14..27 => Op::Pwrite {
            slot,
            off: gen_offset(rng),
            len: gen_len(rng),
            fill: rng.gen(),
        },
        27..31 => Op::Write {
            slot,
            len: gen_len(rng),
            fill: rng.gen(),
        },
        31..38 => Op::Pread {
            slot,
            off: gen_offset(rng),
            len: gen_len(rng),
        },
        38..41 => Op::Read {
            slot,
            len: gen_len(rng),
        },
        41..43 => {
            let whence = pick(rng, &[libc::SEEK_SET, libc::SEEK_CUR, libc::SEEK_END]);
            let off = if whence == libc::SEEK_SET {
                gen_offset(rng) as i64
            } else {
                rng.gen_range(-8192..8192)
            };
            Op::Lseek { slot, off, whence }
        }
        43..46 => Op::Ftruncate {
            slot,
            len: gen_truncate_len(rng),
        },
        46..49 => Op::Truncate {
            path: gen_path(rng, ex, File),
            len: gen_truncate_len(rng),
        },
        49..51 => Op::Fsync {
            slot,
            data_only: rng.gen_bool(0.3),
        },
        51..53 => Op::Fstat { slot },
        53..57 => Op::Stat {
            path: gen_path(rng, ex, Any),
            follow,
        },
        57..62 => Op::Unlink {
            path: gen_path(rng, ex, File),
        },
        62..66 => {
            let mode = pick(rng, &[0o755, 0o755, 0o700, 0o777, 0o1777, 0o2755]);
            Op::Mkdir {
                path: gen_path(rng, ex, NewDir),
                mode,
            }
        }
        66..69 => Op::Rmdir {
            path: gen_path(rng, ex, Dir),
        },
        69..78 => {
            let flags = match rng.gen_range(0..10) {
                0..6 => 0,
                6..8 => libc::RENAME_NOREPLACE,
                _ => libc::RENAME_EXCHANGE,
            };
            let (from, to) = match rng.gen_range(0..4) {
                0 | 1 => (File, NewFile),
                2 => (Dir, Dir),
                _ => (Any, Any),
            };
            Op::Rename {
                from: gen_path(rng, ex, from),
                to: gen_path(rng, ex, to),
                flags,
            }
        }
        78..81 => Op::Link {
            from: gen_path(rng, ex, File),
            to: gen_path(rng, ex, NewFile),
        },
        81..84 => {
            // Targets are relative and never contain "..", so a link renamed
            // elsewhere can never point outside the test root.
            let target = if rng.gen_bool(0.5) {
                pick(rng, &[FILE_NAMES.as_slice(), DIR_NAMES.as_slice()].concat()).to_string()
            } else {
                gen_path(rng, ex, Any)
            };
            Op::Symlink {
                target,
                path: gen_path(rng, ex, NewFile),
            }
        }
        84..86 => Op::Readlink {
            path: gen_path(rng, ex, File),
        },
        86..89 => {
            let modes = [
                0o644, 0o600, 0o755, 0o700, 0o777, 0o000, 0o444, 0o4755, 0o2755, 0o1777,
            ];
            Op::Chmod {
                path: gen_path(rng, ex, Any),
                mode: pick(rng, &modes),
            }
        }
        89..96 => {
            let path = gen_path(rng, ex, Any);
            let name = pick(rng, &XATTR_NAMES);
            match rng.gen_range(0..10) {
                0..4 => {
                    let len = if rng.gen_bool(0.9) {
                        rng.gen_range(0..=64)
                    } else {
                        rng.gen_range(65..=2000)
                    };
                    let flags = pick(rng, &[0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE]);
                    Op::SetXattr {
                        path,
                        name,
                        len,
                        fill: rng.gen(),
                        flags,
                        follow,
                    }
                }
                4..7 => {
                    let size = pick(rng, &[0, 4, 65536, 65536]);
                    Op::GetXattr {
                        path,
                        name,
                        size,
                        follow,
                    }
                }
                7..9 => Op::ListXattr {
                    path,
                    size: pick(rng, &[0, 8, 65536, 65536]),
                    follow,
                },
                _ => Op::RemoveXattr { path, name, follow },
            }
        }
        _ => {
            let path = if rng.gen_bool(0.2) {
                String::new()
            } else {
                gen_path(rng, ex, Dir)
            };
            Op::Readdir { path }
        }
    }
}

// ---------------------------------------------------------------------------
// Results

#[derive(Clone, Debug, PartialEq, Eq)]
struct StatSum {
    kind: char,
    mode: u32,
    nlink: u64,
    /// `None` for directories: their size is file-system specific.
    size: Option<u64>,
}

impl StatSum {
    fn from_stat(st: &libc::stat) -> StatSum {
        let kind = kind_of(st.st_mode);
        StatSum {
            kind,
            mode: st.st_mode,
            nlink: st.st_nlink,
            size: (kind != 'd').then_some(st.st_size as u64),
        }
    }
}

fn kind_of(mode: u32) -> char {
    match mode & libc::S_IFMT {
        libc::S_IFREG => 'f',
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        _ => '?',
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Val {
    Unit,
    Num(i64),
    Data(Vec<u8>),
    Stat(StatSum),
    Names(Vec<String>),
    Dir(Vec<(String, char)>),
    /// Not compared: the behaviour is file-system specific.
    Skipped(&'static str),
}

/// An operation's result: a value or an errno.
type Outcome = Result<Val, i32>;

struct Show<'a>(&'a Outcome);

impl fmt::Display for Show<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Err(e) => write!(f, "Err({})", errno_name(*e)),
            Ok(Val::Unit) => write!(f, "Ok"),
            Ok(Val::Num(n)) => write!(f, "Ok({n})"),
            Ok(Val::Data(d)) => {
                let head: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
                write!(
                    f,
                    "Ok({} bytes, fnv {:016x}, head {head})",
                    d.len(),
                    fnv(FNV_INIT, d)
                )
            }
            Ok(Val::Stat(s)) => write!(
                f,
                "Ok(type {} mode {:o} nlink {} size {})",
                s.kind,
                s.mode,
                s.nlink,
                s.size.map_or("-".into(), |s| s.to_string())
            ),
            Ok(Val::Names(n)) => write!(f, "Ok({n:?})"),
            Ok(Val::Dir(d)) => {
                let items: Vec<String> = d.iter().map(|(n, k)| format!("{n}:{k}")).collect();
                write!(f, "Ok([{}])", items.join(", "))
            }
            Ok(Val::Skipped(why)) => write!(f, "Skipped({why})"),
        }
    }
}

fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

const FNV_INIT: u64 = 0xcbf2_9ce4_8422_2325;

fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn unit(ret: libc::c_int) -> Outcome {
    if ret < 0 {
        Err(errno())
    } else {
        Ok(Val::Unit)
    }
}

fn num(ret: isize) -> Result<usize, i32> {
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret as usize)
    }
}

// ---------------------------------------------------------------------------
// The two sides

/// A fresh tmpfs: its own mount when we are root, else a directory in /dev/shm.
struct Tmpfs {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl Tmpfs {
    fn new() -> Tmpfs {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let dir = tempfile::Builder::new()
                .prefix("anvil-diff-tmpfs-")
                .tempdir()
                .unwrap();
            let mounted = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=4g,mode=0755", "tmpfs"])
                .arg(dir.path())
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if mounted {
                return Tmpfs { dir, mounted };
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("anvil-diff-")
            .tempdir_in("/dev/shm")
            .expect("create a directory in /dev/shm");
        Tmpfs {
            dir,
            mounted: false,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        } else {
            // Without root, directories chmod-ed to 0 would stop the removal.
            let _ = Command::new("chmod")
                .args(["-R", "u+rwx"])
                .arg(self.dir.path())
                .stderr(Stdio::null())
                .status();
        }
    }
}

enum Backing {
    Tmpfs(Tmpfs),
    /// `None` once unmounted at the end.
    Anvil(Option<common::Mount>),
}

struct Side {
    label: &'static str,
    root: PathBuf,
    slots: [RawFd; SLOTS],
    backing: Backing,
}

impl Drop for Side {
    fn drop(&mut self) {
        for fd in &mut self.slots {
            if *fd >= 0 {
                // SAFETY: the fd is ours and is not used again.
                unsafe { libc::close(*fd) };
                *fd = -1;
            }
        }
    }
}

impl Side {
    fn new(label: &'static str, backing: Backing) -> Side {
        let root = match &backing {
            Backing::Tmpfs(t) => t.path().to_path_buf(),
            Backing::Anvil(m) => m.as_ref().expect("mounted").path().to_path_buf(),
        };
        Side {
            label,
            root,
            slots: [-1; SLOTS],
            backing,
        }
    }

    fn cpath(&self, rel: &str) -> CString {
        let path = if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        };
        CString::new(path.as_os_str().as_bytes()).expect("no NUL in paths")
    }

    fn close_slot(&mut self, slot: usize) -> Outcome {
        let fd = std::mem::replace(&mut self.slots[slot], -1);
        // SAFETY: closing an fd we own (or -1, which fails with EBADF).
        unit(unsafe { libc::close(fd) })
    }

    /// Closes every slot; the results, per slot, for comparison.
    fn close_all(&mut self) -> Vec<Outcome> {
        let open: Vec<usize> = (0..SLOTS).filter(|&s| self.slots[s] >= 0).collect();
        open.into_iter().map(|s| self.close_slot(s)).collect()
    }

    /// Unmounts (asserting a clean check) and mounts again; tmpfs is left be.
    fn remount(&mut self) {
        if let Backing::Anvil(Some(mount)) = &mut self.backing {
            mount.remount();
        }
    }

    fn is_anvil(&self) -> bool {
        matches!(self.backing, Backing::Anvil(_))
    }

    /// Unmounts an anvil side, asserting `anvil check` is clean.
    fn finish(mut self) {
        let _ = self.close_all();
        if let Backing::Anvil(mount) = &mut self.backing {
            if let Some(mount) = mount.take() {
                mount.unmount();
            }
        }
    }

    fn exec(&mut self, op: &Op, payload: &[u8]) -> Outcome {
        // SAFETY (all unsafe blocks below): plain system calls on NUL-terminated
        // paths that live across the call and on buffers of the stated length.
        match op {
            Op::Open {
                slot,
                path,
                flags,
                mode,
            } => {
                let p = self.cpath(path);
                let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, *mode) };
                if fd < 0 {
                    return Err(errno());
                }
                if self.slots[*slot] >= 0 {
                    // Its result shows in explicit close() operations only.
                    let _ = self.close_slot(*slot);
                }
                self.slots[*slot] = fd;
                Ok(Val::Unit)
            }
            Op::Close { slot } => self.close_slot(*slot),
            Op::Pwrite { slot, off, .. } => {
                let fd = self.slots[*slot];
                let n = unsafe {
                    libc::pwrite(fd, payload.as_ptr().cast(), payload.len(), *off as i64)
                };
                num(n).map(|n| Val::Num(n as i64))
            }
            Op::Write { slot, .. } => {
                let fd = self.slots[*slot];
                let n = unsafe { libc::write(fd, payload.as_ptr().cast(), payload.len()) };
                num(n).map(|n| Val::Num(n as i64))
            }
            Op::Pread { slot, off, len } => {
                let mut buf = vec![0u8; *len];
                let fd = self.slots[*slot];
                let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), *len, *off as i64) };
                num(n).map(|n| {
                    buf.truncate(n);
                    Val::Data(buf)
                })
            }
            Op::Read { slot, len } => {
                let mut buf = vec![0u8; *len];
                let n = unsafe { libc::read(self.slots[*slot], buf.as_mut_ptr().cast(), *len) };
                num(n).map(|n| {
                    buf.truncate(n);
                    Val::Data(buf)
                })
            }
            Op::Lseek { slot, off, whence } => {
                let fd = self.slots[*slot];
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                if unsafe { libc::fstat(fd, &mut st) } == 0 && kind_of(st.st_mode) == 'd' {
                    // Directory offsets are file-system specific cookies.
                    return Ok(Val::Skipped("lseek on a directory"));
                }
                let r = unsafe { libc::lseek(fd, *off, *whence) };
                if r < 0 {
                    Err(errno())
                } else {
                    Ok(Val::Num(r))
                }
            }
            Op::Ftruncate { slot, len } => {
                unit(unsafe { libc::ftruncate(self.slots[*slot], *len as i64) })
            }
            Op::Truncate { path, len } => {
                unit(unsafe { libc::truncate(self.cpath(path).as_ptr(), *len as i64) })
            }
            Op::Fsync { slot, data_only } => {
                let fd = self.slots[*slot];
                unit(unsafe {
                    if *data_only {
                        libc::fdatasync(fd)
                    } else {
                        libc::fsync(fd)
                    }
                })
            }
            Op::Fstat { slot } => {
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                unit(unsafe { libc::fstat(self.slots[*slot], &mut st) })
                    .map(|_| Val::Stat(StatSum::from_stat(&st)))
            }
            Op::Stat { path, follow } => lstat_or_stat(&self.cpath(path), *follow)
                .map(|st| Val::Stat(StatSum::from_stat(&st))),
            Op::Unlink { path } => unit(unsafe { libc::unlink(self.cpath(path).as_ptr()) }),
            Op::Mkdir { path, mode } => {
                unit(unsafe { libc::mkdir(self.cpath(path).as_ptr(), *mode) })
            }
            Op::Rmdir { path } => unit(unsafe { libc::rmdir(self.cpath(path).as_ptr()) }),
            Op::Rename { from, to, flags } => {
                let (from, to) = (self.cpath(from), self.cpath(to));
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_renameat2,
                        libc::AT_FDCWD,
                        from.as_ptr(),
                        libc::AT_FDCWD,
                        to.as_ptr(),
                        *flags,
                    )
                };
                unit(if r < 0 { -1 } else { 0 })
            }
            Op::Link { from, to } => {
                let (from, to) = (self.cpath(from), self.cpath(to));
                unit(unsafe { libc::link(from.as_ptr(), to.as_ptr()) })
            }
            Op::Symlink { target, path } => {
                let target = CString::new(target.as_str()).expect("no NUL");
                unit(unsafe { libc::symlink(target.as_ptr(), self.cpath(path).as_ptr()) })
            }
            Op::Readlink { path } => read_link(&self.cpath(path)).map(Val::Data),
            Op::Chmod { path, mode } => {
                unit(unsafe { libc::chmod(self.cpath(path).as_ptr(), *mode) })
            }
            Op::SetXattr {
                path,
                name,
                flags,
                follow,
                ..
            } => {
                let (p, n) = (self.cpath(path), CString::new(*name).expect("no NUL"));
                let (value, len) = (payload.as_ptr().cast(), payload.len());
                unit(unsafe {
                    if *follow {
                        libc::setxattr(p.as_ptr(), n.as_ptr(), value, len, *flags)
                    } else {
                        libc::lsetxattr(p.as_ptr(), n.as_ptr(), value, len, *flags)
                    }
                })
            }
            Op::GetXattr {
                path,
                name,
                size,
                follow,
            } => {
                let n = CString::new(*name).expect("no NUL");
                get_xattr(&self.cpath(path), &n, *size, *follow)
            }
            Op::ListXattr { path, size, follow } => {
                let p = self.cpath(path);
                let mut buf = vec![0u8; *size];
                let r = num(unsafe {
                    if *follow {
                        libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), *size)
                    } else {
                        libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), *size)
                    }
                })?;
                if *size == 0 {
                    return Ok(Val::Num(r as i64));
                }
                Ok(Val::Names(split_names(&buf[..r])))
            }
            Op::RemoveXattr { path, name, follow } => {
                let (p, n) = (self.cpath(path), CString::new(*name).expect("no NUL"));
                unit(unsafe {
                    if *follow {
                        libc::removexattr(p.as_ptr(), n.as_ptr())
                    } else {
                        libc::lremovexattr(p.as_ptr(), n.as_ptr())
                    }
                })
            }
            Op::Readdir { path } => {
                let dir = if path.is_empty() {
                    self.root.clone()
                } else {
                    self.root.join(path)
                };
                read_dir_sorted(&dir).map(Val::Dir)
            }
        }
    }
}

fn lstat_or_stat(path: &CString, follow: bool) -> Result<libc::stat, i32> {
    // SAFETY: a valid path and a stat buffer that outlives the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe {
        if follow {
            libc::stat(path.as_ptr(), &mut st)
        } else {
            libc::lstat(path.as_ptr(), &mut st)
        }
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(st)
    }
}

fn read_link(path: &CString) -> Result<Vec<u8>, i32> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: the buffer is valid for its length.
    let n = num(unsafe { libc::readlink(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(n);
    Ok(buf)
}

fn get_xattr(path: &CString, name: &CString, size: usize, follow: bool) -> Outcome {
    let mut buf = vec![0u8; size];
    // SAFETY: valid strings; the buffer is valid for `size` bytes.
    let n = num(unsafe {
        if follow {
            libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), size)
        } else {
            libc::lgetxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), size)
        }
    })?;
    if size == 0 {
        return Ok(Val::Num(n as i64));
    }
    buf.truncate(n);
    Ok(Val::Data(buf))
}

/// A listxattr buffer as sorted names (the order is file-system specific).
fn split_names(buf: &[u8]) -> Vec<String> {
    let mut names: Vec<String> = buf
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    names
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<(String, char)>, i32> {
    let os_err = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EIO);
    let mut items = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(os_err)? {
        let entry = entry.map_err(os_err)?;
        let ft = entry.file_type().map_err(os_err)?;
        let kind = if ft.is_file() {
            'f'
        } else if ft.is_dir() {
            'd'
        } else if ft.is_symlink() {
            'l'
        } else {
            '?'
        };
        items.push((entry.file_name().to_string_lossy().into_owned(), kind));
    }
    items.sort();
    Ok(items)
}

// ---------------------------------------------------------------------------
// Whole-tree snapshots

#[derive(Debug, PartialEq, Eq)]
struct Entry {
    /// Relative path; "" is the root.
    path: String,
    /// `Err` when even lstat fails (only without root: an unsearchable parent).
    stat: Result<StatSum, i32>,
    /// For non-directories with several links: the first path (in walk order)
    /// of the same inode, so hard-link groups compare without inode numbers.
    link_group: Option<String>,
    symlink_target: Option<Result<Vec<u8>, i32>>,
    xattrs: Result<Vec<(String, Vec<u8>)>, i32>,
    /// Why a directory could not be listed.
    list_error: Option<i32>,
}

/// The fields in which two entries for the same path differ, one a line.
fn entry_differences(a: &Entry, b: &Entry, la: &str, lb: &str) -> String {
    let mut out = format!("{:?} differs:", a.path);
    let mut field = |name: &str, x: String, y: String| {
        if x != y {
            out.push_str(&format!(
                "\n  {name}: {la}: {x}\n  {:w$}  {lb}: {y}",
                "",
                w = name.len()
            ));
        }
    };
    let stat = |e: &Entry| Show(&e.stat.clone().map(Val::Stat)).to_string();
    field("stat", stat(a), stat(b));
    field(
        "hard-link group",
        format!("{:?}", a.link_group),
        format!("{:?}", b.link_group),
    );
    let target = |e: &Entry| match &e.symlink_target {
        None => "-".to_string(),
        Some(Ok(t)) => format!("{:?}", String::from_utf8_lossy(t)),
        Some(Err(e)) => errno_name(*e),
    };
    field("symlink target", target(a), target(b));
    let xattrs = |e: &Entry| match &e.xattrs {
        Ok(list) => list
            .iter()
            .map(|(n, v)| format!("{n}={}", Show(&Ok(Val::Data(v.clone())))))
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => errno_name(*e),
    };
    field("xattrs", xattrs(a), xattrs(b));
    let listing = |e: &Entry| e.list_error.map_or("-".to_string(), errno_name);
    field("listing error", listing(a), listing(b));
    out
}

fn snapshot(root: &Path) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut inodes = HashMap::new();
    walk(root, String::new(), &mut out, &mut inodes);
    out
}

fn walk(root: &Path, rel: String, out: &mut Vec<Entry>, inodes: &mut HashMap<(u64, u64), String>) {
    let full = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(&rel)
    };
    let cpath = CString::new(full.as_os_str().as_bytes()).expect("no NUL");
    let st = match lstat_or_stat(&cpath, false) {
        Ok(st) => st,
        Err(e) => {
            out.push(Entry {
                path: rel,
                stat: Err(e),
                link_group: None,
                symlink_target: None,
                xattrs: Ok(Vec::new()),
                list_error: None,
            });
            return;
        }
    };
    let mut stat = StatSum::from_stat(&st);
    if rel.is_empty() {
        // The roots themselves differ (mount options); only their link counts
        // (number of subdirectories) are comparable.
        stat.mode = 0;
    }
    let link_group = (stat.kind != 'd' && stat.nlink > 1).then(|| {
        inodes
            .entry((st.st_dev, st.st_ino))
            .or_insert_with(|| rel.clone())
            .clone()
    });
    let symlink_target = (stat.kind == 'l').then(|| read_link(&cpath));
    let xattrs = all_xattrs(&cpath);
    let children = (stat.kind == 'd').then(|| read_dir_sorted(&full));
    out.push(Entry {
        path: rel.clone(),
        stat: Ok(stat),
        link_group,
        symlink_target,
        xattrs,
        list_error: children.as_ref().and_then(|c| c.as_ref().err().copied()),
    });
    if let Some(Ok(children)) = children {
        for (name, _) in children {
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            walk(root, child, out, inodes);
        }
    }
}

fn all_xattrs(path: &CString) -> Result<Vec<(String, Vec<u8>)>, i32> {
    let mut buf = vec![0u8; 65536];
    // SAFETY: the buffer is valid for its length.
    let n = num(unsafe { libc::llistxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    let mut out = Vec::new();
    for name in split_names(&buf[..n]) {
        let cname = CString::new(name.as_str()).expect("no NUL");
        let value = match get_xattr(path, &cname, 65536, false) {
            Ok(Val::Data(d)) => d,
            Ok(other) => unreachable!("getxattr gave {other:?}"),
            Err(e) => format!("<{}>", errno_name(e)).into_bytes(),
        };
        out.push((name, value));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// The harness

#[derive(Clone, Default)]
struct Stats {
    errors: usize,
    tree_checks: usize,
    bytes_compared: u64,
}

struct Harness<'a> {
    cfg: &'a Config,
    a: Side,
    b: Side,
    /// A hash of every operation and its result, to check reproducibility.
    trace: u64,
    stats: Stats,
    history: VecDeque<String>,
}

impl<'a> Harness<'a> {
    fn new(cfg: &'a Config, a: Side, b: Side) -> Harness<'a> {
        Harness {
            cfg,
            a,
            b,
            trace: FNV_INIT,
            stats: Stats::default(),
            history: VecDeque::new(),
        }
    }

    /// Runs the configured number of operations, generated from the seed
    /// and the reference side's current names.
    fn run(&mut self) {
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(self.cfg.seed);
        let count = self.cfg.ops;
        let remount_at = count / 2;
        for i in 0..count {
            let op = &gen_op(&mut rng, &Existing::scan(&self.a.root));
            let payload = op.payload();
            let ra = self.a.exec(op, &payload);
            let rb = self.b.exec(op, &payload);
            if self.cfg.verbose {
                eprintln!("#{i} {op} -> {}", Show(&ra));
            }
            if ra != rb {
                let detail = data_difference(&ra, &rb);
                self.fail(
                    &format!("op #{i}: {op}"),
                    &format!(
                        "{:>8}: {}\n{:>8}: {}{detail}",
                        self.a.label,
                        Show(&ra),
                        self.b.label,
                        Show(&rb)
                    ),
                );
            }
            self.record(&format!("#{i} {op} -> {}", Show(&ra)), &ra);
            if (i + 1) % self.cfg.check_every == 0 {
                self.compare_trees(&format!("checkpoint after op #{i}"));
            }
            if i + 1 == remount_at && (self.a.is_anvil() || self.b.is_anvil()) {
                self.close_all(&format!(
                    "closing all files before the remount after op #{i}"
                ));
                self.a.remount();
                self.b.remount();
                self.compare_trees(&format!("after the remount after op #{i}"));
            }
        }
        self.close_all("closing all files at the end");
        self.compare_trees("the end");
    }

    /// Final checks: an anvil side is remounted and compared once more, then
    /// unmounted (which asserts a clean `anvil check`).
    fn finish(mut self) {
        if self.a.is_anvil() || self.b.is_anvil() {
            self.a.remount();
            self.b.remount();
            self.compare_trees("the end, after a remount");
        }
        eprintln!(
            "posix_differential: {} vs {}: {} ops matched ({} of them errors), {} tree checks, \
             {} file bytes compared",
            self.a.label,
            self.b.label,
            self.cfg.ops,
            self.stats.errors,
            self.stats.tree_checks,
            self.stats.bytes_compared
        );
        let Harness { a, b, .. } = self;
        a.finish();
        b.finish();
    }

    fn record(&mut self, line: &str, outcome: &Outcome) {
        if outcome.is_err() {
            self.stats.errors += 1;
        }
        // The line names the operation and its result (data as length+hash).
        self.trace = fnv(self.trace, line.as_bytes());
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(line.to_string());
    }

    fn close_all(&mut self, what: &str) {
        let ra = self.a.close_all();
        let rb = self.b.close_all();
        if ra != rb {
            let show = |rs: &[Outcome]| rs.iter().map(|r| Show(r).to_string()).collect::<Vec<_>>();
            self.fail(what, &format!("{:?}\nvs\n{:?}", show(&ra), show(&rb)));
        }
    }

    fn compare_trees(&mut self, when: &str) {
        self.stats.tree_checks += 1;
        let ta = snapshot(&self.a.root);
        let tb = snapshot(&self.b.root);
        if self.cfg.verbose {
            eprintln!("tree at {when}:");
            for e in &ta {
                eprintln!(
                    "  {:<16} {}",
                    format!("{:?}", e.path),
                    Show(&e.stat.clone().map(Val::Stat))
                );
            }
        }
        let paths = |t: &[Entry]| t.iter().map(|e| e.path.clone()).collect::<Vec<_>>();
        let (pa, pb) = (paths(&ta), paths(&tb));
        if pa != pb {
            let only_a: Vec<_> = pa.iter().filter(|p| !pb.contains(p)).collect();
            let only_b: Vec<_> = pb.iter().filter(|p| !pa.contains(p)).collect();
            self.fail(
                &format!("tree comparison at {when}"),
                &format!(
                    "the trees hold different names\nonly in {}: {only_a:?}\nonly in {}: {only_b:?}",
                    self.a.label, self.b.label
                ),
            );
        }
        let mut diffs = Vec::new();
        for (ea, eb) in ta.iter().zip(&tb) {
            if ea != eb {
                diffs.push(entry_differences(ea, eb, self.a.label, self.b.label));
            }
        }
        if !diffs.is_empty() {
            diffs.truncate(10);
            self.fail(&format!("tree comparison at {when}"), &diffs.join("\n"));
        }
        for entry in ta
            .iter()
            .filter(|e| e.stat.as_ref().is_ok_and(|s| s.kind == 'f'))
        {
            if let Err(msg) = self.compare_contents(&entry.path) {
                self.fail(
                    &format!("tree comparison at {when}"),
                    &format!("{:?}: {msg}", entry.path),
                );
            }
        }
    }

    fn compare_contents(&mut self, rel: &str) -> Result<(), String> {
        const CHUNK: usize = 1 << 20;
        let open = |side: &Side| {
            let p = side.cpath(rel);
            // SAFETY: a valid path.
            let fd = unsafe {
                libc::open(
                    p.as_ptr(),
                    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                Err(errno())
            } else {
                Ok(fd)
            }
        };
        let (fa, fb) = match (open(&self.a), open(&self.b)) {
            (Ok(fa), Ok(fb)) => (fa, fb),
            (ra, rb) => {
                for fd in [ra, rb].into_iter().flatten() {
                    // SAFETY: our own fd.
                    unsafe { libc::close(fd) };
                }
                return if ra.err() == rb.err() {
                    Ok(())
                } else {
                    Err(format!(
                        "opening for reading: {:?} vs {:?}",
                        ra.err(),
                        rb.err()
                    ))
                };
            }
        };
        let (mut ba, mut bb) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
        let mut off = 0u64;
        let result = loop {
            // SAFETY: buffers valid for CHUNK bytes; our own fds.
            let na = num(unsafe { libc::pread(fa, ba.as_mut_ptr().cast(), CHUNK, off as i64) });
            let nb = num(unsafe { libc::pread(fb, bb.as_mut_ptr().cast(), CHUNK, off as i64) });
            match (na, nb) {
                (Ok(na), Ok(nb)) => {
                    if ba[..na] != bb[..nb] {
                        let first = ba[..na].iter().zip(&bb[..nb]).position(|(x, y)| x != y);
                        break Err(match first {
                            Some(i) => format!(
                                "contents differ at byte {} ({:#04x} vs {:#04x})",
                                off + i as u64,
                                ba[i],
                                bb[i]
                            ),
                            None => format!("reading at {off} gave {na} vs {nb} bytes"),
                        });
                    }
                    self.stats.bytes_compared += na as u64;
                    if na == 0 {
                        break Ok(());
                    }
                    off += na as u64;
                }
                (na, nb) => break Err(format!("reading at {off}: {na:?} vs {nb:?}")),
            }
        };
        // SAFETY: our own fds.
        unsafe {
            libc::close(fa);
            libc::close(fb);
        }
        result
    }

    fn fail(&self, what: &str, detail: &str) -> ! {
        let history: Vec<&str> = self.history.iter().map(String::as_str).collect();
        panic!(
            "posix_differential MISMATCH (seed {:#x}, {} ops) at {what}\n{detail}\n\
             recent ops ({} result shown):\n  {}\nreplay: {}",
            self.cfg.seed,
            self.cfg.ops,
            self.a.label,
            history.join("\n  "),
            self.cfg.replay()
        );
    }
}

/// Where two data results first differ, if both are data.
fn data_difference(a: &Outcome, b: &Outcome) -> String {
    if let (Ok(Val::Data(x)), Ok(Val::Data(y))) = (a, b) {
        if let Some(i) = x.iter().zip(y).position(|(p, q)| p != q) {
            return format!(
                "\nfirst difference at byte {i}: {:#04x} vs {:#04x}",
                x[i], y[i]
            );
        }
        return format!("\nlengths differ: {} vs {}", x.len(), y.len());
    }
    String::new()
}
