//! `nightly-build`: the "nightly build" comparison of ZFS and UFS for building
//! Solaris (Dana Myers, 2005), with a generated C project instead of ON.
//!
//! The source tree is a deterministic C project made from `seed`: `files`
//! modules (`src/<dir>/<module>.c`, about `lines` lines each: a comment
//! header, includes of several headers, a static table, a local struct,
//! static and public functions with loops, switches, string handling and
//! calls into other modules) spread over `dirs` directories, `headers`
//! headers in `include/` (`common.h` plus one per subsystem, each with
//! macros, an enum, a struct, an inline helper and the prototypes of its
//! modules), `src/main.c`, and a `Makefile` with a pattern rule (one object
//! per `.c` under `obj/`, `-MMD` dependency files), one static library per
//! directory under `lib/` and a final link of `bin/nightly`. It builds with
//! gcc without warnings under `-Wall -Wextra`.
//!
//! The tree is generated outside the file system under test, in `source_dir`
//! (default `/var/tmp/anvil-bench-src/nightly-<hash of the generator
//! parameters>`), and reused by later runs: it is written to a temporary
//! directory whose `complete` stamp (holding the generator parameters) is
//! written last, then renamed into place. A `source_dir` whose stamp names
//! other parameters is refused rather than reused.
//!
//! Phases, each after `drop_caches` and timed (wall, user and system CPU of
//! this process and its children, device I/O):
//!
//! 1. `bringover`: copy the tree into `ws1` with our own walker (mkdir, open,
//!    read, write, close; modes preserved; no copy_file_range or reflinks);
//! 2. `build`: `make -j<jobs>` in `ws1`;
//! 3. `clean`: `clean=workspace` (default) removes the whole of `ws1` with
//!    `rm -rf`; `clean=outputs` runs `make clean` (`rm -rf obj lib bin`) and
//!    leaves the sources;
//! 4. `par_bringover`: two walkers in two threads copy the tree into `ws2`
//!    and `ws3`;
//! 5. `par_build`: `make -j<par_jobs>` in `ws2` and `ws3` at the same time.
//!
//! After the copies and builds, the phase records logical bytes (the sum of
//! `st_size` of the workspaces it produced) and physical bytes (the growth of
//! the file system's used bytes, after a sync, since just before those
//! workspaces were created — so the build's physical bytes cover sources and
//! outputs, like its logical bytes). `compression_ratio` is logical /
//! physical after the full build (`1.70x` as ZFS reports it).

use std::fmt::Write as _;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::env::{Metric, Phase, RunEnv, RunOutput};
use crate::error::{fail, BenchError, Context, Result};
use crate::workloads::{apply_overrides, Overrides, Tier, Workload};

/// Where generated source trees are kept between runs (outside every target).
pub(crate) const CACHE_ROOT: &str = "/var/tmp/anvil-bench-src";

/// Bumped whenever the generator's output changes, so stale caches are not reused.
const GENERATOR_VERSION: u32 = 1;

/// Parameters of `nightly-build`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Number of `.c` modules (besides `main.c`).
    pub files: u32,
    /// Directories the modules are spread over (one static library each).
    pub dirs: u32,
    /// Headers, `common.h` included (at least 2).
    pub headers: u32,
    /// Approximate lines per module.
    pub lines: u32,
    /// Seed of the source-tree generator (the same tree for every run and
    /// target, so that results compare).
    pub seed: u64,
    /// `make -j` of the full build.
    pub jobs: u32,
    /// `make -j` of each of the two parallel builds.
    pub par_jobs: u32,
    /// "workspace": `rm -rf ws1`; "outputs": `make clean` in ws1.
    pub clean: String,
    /// CFLAGS written into the Makefile.
    pub cflags: String,
    /// Where the generated tree is cached; empty for the default
    /// `/var/tmp/anvil-bench-src/nightly-<hash>`.
    pub source_dir: String,
}

impl Params {
    pub fn for_tier(tier: Tier) -> Params {
        let (files, dirs, headers, lines) = match tier {
            Tier::Tiny => (6, 2, 2, 200),
            Tier::Quick => (150, 10, 16, 250),
            Tier::Standard => (600, 30, 60, 250),
            Tier::Full => (2000, 100, 200, 2800),
        };
        Params {
            files,
            dirs,
            headers,
            lines,
            seed: 1,
            jobs: 2,
            par_jobs: 1,
            clean: "workspace".into(),
            cflags: "-O2 -g -Wall -Wextra".into(),
            source_dir: String::new(),
        }
    }

    fn check(&self) -> Result<()> {
        if self.files == 0 || self.dirs == 0 || self.lines == 0 {
            return fail("nightly-build: files, dirs and lines must be at least 1");
        }
        if self.headers < 2 {
            return fail("nightly-build: headers must be at least 2 (common.h and one more)");
        }
        if self.jobs == 0 || self.par_jobs == 0 {
            return fail("nightly-build: jobs and par_jobs must be at least 1");
        }
        if self.clean != "workspace" && self.clean != "outputs" {
            return fail(format!(
                "nightly-build: clean must be 'workspace' or 'outputs', not '{}'",
                self.clean
            ));
        }
        Ok(())
    }

    /// The parameters the generated tree depends on.
    fn generator_key(&self) -> String {
        format!(
            "nightly v{GENERATOR_VERSION} files={} dirs={} headers={} lines={} seed={} cflags={}",
            self.files, self.dirs, self.headers, self.lines, self.seed, self.cflags
        )
    }

    fn source_dir(&self) -> PathBuf {
        if self.source_dir.is_empty() {
            PathBuf::from(format!(
                "{CACHE_ROOT}/nightly-{:016x}",
                fnv64(self.generator_key().as_bytes())
            ))
        } else {
            PathBuf::from(&self.source_dir)
        }
    }
}

pub fn workload(tier: Tier, overrides: &Overrides) -> Result<Box<dyn Workload>> {
    let params = apply_overrides(Params::for_tier(tier), overrides)?;
    params.check()?;
    Ok(Box::new(Nightly { params }))
}

pub struct Nightly {
    pub params: Params,
}

impl Workload for Nightly {
    fn name(&self) -> &'static str {
        "nightly-build"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or_default()
    }

    fn min_fs_bytes(&self) -> Option<u64> {
        // About 45 bytes per source line; objects with -g are about 1.5 times
        // the source; three workspaces exist at most (ws1 is cleaned first).
        let p = &self.params;
        let source = p.files as u64 * p.lines as u64 * 45 + p.headers as u64 * 4096;
        Some(source * 3 * 3 + (64 << 20))
    }

    fn run(&self, env: &RunEnv) -> Result<RunOutput> {
        run(&self.params, env)
    }
}

// ---------------------------------------------------------------------------
// Helpers shared with the backup workload.

/// Fails with one line naming the package when a program is missing from PATH.
pub(crate) fn require_tools(workload: &str, tools: &[(&str, &str)]) -> Result<()> {
    for (prog, package) in tools {
        if find_in_path(prog).is_none() {
            return fail(format!(
                "{workload} needs '{prog}' (package {package}), which is not installed"
            ));
        }
    }
    Ok(())
}

fn find_in_path(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Runs a command with its output captured; a failure names the command and
/// gives the last lines of its error output.
pub(crate) fn run_checked(cmd: &mut Command) -> Result<Output> {
    let shown = format!("{cmd:?}").replace('"', "");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .ctx(|| format!("run {shown}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .take(3)
            .collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return fail(format!(
            "{shown} failed ({}): {}",
            out.status,
            tail.join(" | ")
        ));
    }
    Ok(out)
}

/// FNV-1a, 64 bits: a stable hash for cache keys and manifests.
pub(crate) fn fnv64(data: &[u8]) -> u64 {
    fnv64_update(0xcbf2_9ce4_8422_2325, data)
}

pub(crate) fn fnv64_update(mut h: u64, data: &[u8]) -> u64 {
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Files and the sum of their `st_size` under `dir` (symlinks not followed).
pub(crate) fn tree_bytes(dir: &Path) -> Result<(u64, u64)> {
    let mut files = 0;
    let mut bytes = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).ctx(|| format!("read {}", d.display()))? {
            let e = e.ctx(|| format!("read {}", d.display()))?;
            let m =
                fs::symlink_metadata(e.path()).ctx(|| format!("stat {}", e.path().display()))?;
            if m.is_dir() {
                stack.push(e.path());
            } else {
                files += 1;
                bytes += m.len();
            }
        }
    }
    Ok((files, bytes))
}

/// Copies the tree `src` to the new directory `dst` with plain system calls
/// (mkdir, open, read, write, close), keeping modes. Returns files and bytes.
pub(crate) fn copy_tree(src: &Path, dst: &Path) -> Result<(u64, u64)> {
    let mut buf = vec![0u8; 128 << 10];
    let mut counts = (0, 0);
    copy_dir(src, dst, &mut buf, &mut counts)?;
    Ok(counts)
}

fn copy_dir(src: &Path, dst: &Path, buf: &mut [u8], counts: &mut (u64, u64)) -> Result<()> {
    let meta = fs::metadata(src).ctx(|| format!("stat {}", src.display()))?;
    fs::create_dir(dst).ctx(|| format!("mkdir {}", dst.display()))?;
    let mut names: Vec<_> = fs::read_dir(src)
        .ctx(|| format!("read {}", src.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .ctx(|| format!("read {}", src.display()))?;
    names.sort();
    for name in names {
        let s = src.join(&name);
        let d = dst.join(&name);
        let m = fs::symlink_metadata(&s).ctx(|| format!("stat {}", s.display()))?;
        let ft = m.file_type();
        if ft.is_dir() {
            copy_dir(&s, &d, buf, counts)?;
        } else if ft.is_symlink() {
            let target = fs::read_link(&s).ctx(|| format!("readlink {}", s.display()))?;
            std::os::unix::fs::symlink(&target, &d).ctx(|| format!("symlink {}", d.display()))?;
        } else if ft.is_file() {
            counts.1 += copy_file(&s, &d, m.mode() & 0o7777, buf)?;
            counts.0 += 1;
        }
    }
    fs::set_permissions(dst, fs::Permissions::from_mode(meta.mode() & 0o7777))
        .ctx(|| format!("chmod {}", dst.display()))
}

fn copy_file(src: &Path, dst: &Path, mode: u32, buf: &mut [u8]) -> Result<u64> {
    let mut input = fs::File::open(src).ctx(|| format!("open {}", src.display()))?;
    let mut output = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(dst)
        .ctx(|| format!("create {}", dst.display()))?;
    let mut total = 0u64;
    loop {
        let n = input.read(buf).ctx(|| format!("read {}", src.display()))?;
        if n == 0 {
            break;
        }
        output
            .write_all(&buf[..n])
            .ctx(|| format!("write {}", dst.display()))?;
        total += n as u64;
    }
    // The umask may have cleared bits of `mode`.
    output
        .set_permissions(fs::Permissions::from_mode(mode))
        .ctx(|| format!("chmod {}", dst.display()))?;
    Ok(total)
}

/// Returns the cached tree `dir/tree`, generating it first unless `dir/complete`
/// exists. Generation goes to a private temporary directory that is renamed
/// into place, so concurrent runs never see (or reuse) a partial tree.
pub(crate) fn cached_tree(
    dir: &Path,
    key: &str,
    generate: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    let stamp = dir.join("complete");
    if let Ok(made_with) = fs::read_to_string(&stamp) {
        if made_with.trim_end() != key {
            return fail(format!(
                "{} holds a tree generated with other parameters ({}); remove it or choose another source_dir",
                dir.display(),
                made_with.trim_end()
            ));
        }
        return Ok(dir.join("tree"));
    }
    let parent = dir.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(parent).ctx(|| format!("mkdir {}", parent.display()))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let tmp = parent.join(format!(".{name}.tmp.{}.{nanos}", std::process::id()));
    let result = (|| {
        fs::create_dir(&tmp).ctx(|| format!("mkdir {}", tmp.display()))?;
        generate(&tmp.join("tree"))?;
        fs::write(tmp.join("complete"), format!("{key}\n"))
            .ctx(|| format!("write {}", tmp.display()))?;
        if dir.exists() && !stamp.exists() {
            // Left over from an interrupted generation of an older version.
            let _ = fs::remove_dir_all(dir);
        }
        match fs::rename(&tmp, dir) {
            Ok(()) => Ok(()),
            Err(_) if stamp.exists() => Ok(()), // another run was quicker
            Err(e) => Err(BenchError(format!(
                "rename {} to {}: {e}",
                tmp.display(),
                dir.display()
            ))),
        }
    })();
    let _ = fs::remove_dir_all(&tmp);
    result?;
    Ok(dir.join("tree"))
}

/// Refuses a cache directory inside the directory under test.
pub(crate) fn check_outside(workload: &str, source: &Path, dir: &Path) -> Result<()> {
    let canon = |p: &Path| fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (s, d) = (canon(source), canon(dir));
    if s.starts_with(&d) {
        return fail(format!(
            "{workload}: source_dir {} is inside the directory under test {}",
            s.display(),
            d.display()
        ));
    }
    Ok(())
}

pub(crate) const MB: f64 = 1e6;

// ---------------------------------------------------------------------------
// The C project generator.

const WORDS: &[&str] = &[
    "buf", "node", "page", "cache", "inode", "block", "extent", "queue", "table", "entry", "lock",
    "map", "list", "tree", "hash", "slot", "zone", "pool", "arena", "vnode", "mount", "log", "txn",
    "io", "dev", "disk", "ring", "frame", "seg", "chunk", "bucket", "cursor", "index", "key",
    "range", "stat", "attr", "path", "name", "dir", "file", "link", "sock", "pipe", "timer",
    "clock", "task", "proc", "thread", "signal", "event", "msg", "port", "heap", "stack", "trace",
    "config", "param", "policy", "quota", "limit", "reg",
];

const VERBS: &[&str] = &[
    "alloc", "free", "lookup", "insert", "remove", "scan", "flush", "sync", "merge", "split",
    "resize", "rehash", "check", "verify", "update", "commit", "reset", "walk", "count", "encode",
    "decode", "pack", "unpack", "grow", "shrink", "trim", "copy", "move", "swap", "open", "close",
    "attach", "detach", "enter", "leave", "retire",
];

const PROSE: &[&str] = &[
    "the",
    "a",
    "each",
    "every",
    "this",
    "that",
    "when",
    "before",
    "after",
    "unless",
    "while",
    "caller",
    "holds",
    "must",
    "may",
    "returns",
    "zero",
    "count",
    "entry",
    "lock",
    "table",
    "buffer",
    "record",
    "state",
    "flag",
    "value",
    "request",
    "reference",
    "pending",
    "current",
    "previous",
    "next",
    "walks",
    "updates",
    "releases",
    "acquires",
    "checks",
    "invalid",
    "valid",
    "is",
    "are",
    "not",
    "of",
    "to",
    "in",
    "on",
    "with",
    "without",
    "for",
    "from",
    "and",
    "or",
    "only",
    "once",
    "again",
    "later",
    "first",
    "last",
    "queue",
    "cache",
    "page",
    "block",
    "consistent",
    "stable",
    "hint",
    "slot",
    "generation",
    "interrupt",
    "context",
    "path",
];

const DIR_WORDS: &[&str] = &[
    "fs", "vm", "net", "io", "sched", "lib", "cmd", "common", "kern", "dev", "ipc", "crypto",
];

fn sentence(rng: &mut StdRng) -> String {
    let n = rng.gen_range(6..15);
    let mut s = String::new();
    for i in 0..n {
        let w = PROSE[rng.gen_range(0..PROSE.len())];
        if i == 0 {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                s.extend(f.to_uppercase());
                s.push_str(c.as_str());
            }
        } else {
            s.push(' ');
            s.push_str(w);
        }
    }
    s.push('.');
    s
}

/// A block comment of `sentences` sentences, wrapped at 72 columns.
fn comment(
    rng: &mut StdRng,
    indent: &str,
    title: &str,
    sentences: std::ops::Range<usize>,
) -> String {
    let mut text = String::from(title);
    for _ in 0..rng.gen_range(sentences) {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(&sentence(rng));
    }
    let mut out = format!("{indent}/*\n");
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.len() + word.len() + 1 > 70 {
            let _ = writeln!(out, "{indent} * {line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{indent} * {line}");
    }
    let _ = writeln!(out, "{indent} */");
    out
}

struct HeaderPlan {
    file: String,
    /// Prefix of its types and macros ("" for common.h).
    prefix: String,
    /// Prototypes it declares: (module index, function name).
    decls: Vec<(usize, String)>,
}

struct ModulePlan {
    dir: String,
    prefix: String,
    header: usize,
    includes: Vec<usize>,
    /// Public functions other than `<prefix>_init`.
    publics: Vec<String>,
    statics: Vec<String>,
}

struct Plan {
    dirs: Vec<String>,
    headers: Vec<HeaderPlan>,
    modules: Vec<ModulePlan>,
}

/// Lines a generated function takes on average (used to size modules).
const LINES_PER_FUNCTION: u32 = 36;
/// Lines of a module outside its functions (comment, includes, table, init).
const MODULE_OVERHEAD_LINES: u32 = 40;

fn plan(p: &Params) -> Plan {
    let mut rng = StdRng::seed_from_u64(p.seed ^ 0x6e69_6768_746c_7901);
    let dirs: Vec<String> = (0..p.dirs)
        .map(|d| format!("{}{:02}", DIR_WORDS[d as usize % DIR_WORDS.len()], d))
        .collect();
    let mut headers = vec![HeaderPlan {
        file: "common.h".into(),
        prefix: String::new(),
        decls: Vec::new(),
    }];
    for h in 1..p.headers {
        let w1 = WORDS[rng.gen_range(0..WORDS.len())];
        let w2 = WORDS[rng.gen_range(0..WORDS.len())];
        headers.push(HeaderPlan {
            file: format!("{w1}_{w2}{h}.h"),
            prefix: format!("{w1}_{w2}{h}"),
            decls: Vec::new(),
        });
    }
    let nh = p.headers as usize;
    let mut modules = Vec::new();
    for i in 0..p.files as usize {
        let w1 = WORDS[rng.gen_range(0..WORDS.len())];
        let w2 = WORDS[rng.gen_range(0..WORDS.len())];
        let prefix = format!("{w1}_{w2}{i}");
        let header = 1 + i % (nh - 1);
        let mut includes = vec![0, header];
        let extra = rng.gen_range(2..=4).min(nh - 2);
        while includes.len() < 2 + extra {
            let h = rng.gen_range(1..nh);
            if !includes.contains(&h) {
                includes.push(h);
            }
        }
        let nfun =
            (p.lines.saturating_sub(MODULE_OVERHEAD_LINES) / LINES_PER_FUNCTION).max(2) as usize;
        let npub = (1 + nfun / 4).min(nfun - 1);
        let mut verbs: Vec<&str> = VERBS.to_vec();
        verbs.shuffle(&mut rng);
        let names: Vec<String> = (0..nfun)
            .map(|k| {
                let v = verbs[k % verbs.len()];
                match k / verbs.len() {
                    0 => format!("{prefix}_{v}"),
                    n => format!("{prefix}_{v}{n}"),
                }
            })
            .collect();
        let publics = names[..npub].to_vec();
        let statics = names[npub..].to_vec();
        headers[header].decls.push((i, format!("{prefix}_init")));
        for f in &publics {
            headers[header].decls.push((i, f.clone()));
        }
        modules.push(ModulePlan {
            dir: dirs[i % dirs.len()].clone(),
            prefix,
            header,
            includes,
            publics,
            statics,
        });
    }
    Plan {
        dirs,
        headers,
        modules,
    }
}

fn common_h(rng: &mut StdRng) -> String {
    let mut s = comment(
        rng,
        "",
        "common.h: definitions shared by every module.",
        3..3 + 1,
    );
    s.push_str(
        "\n#ifndef COMMON_H\n#define COMMON_H\n\n\
         #include <stddef.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n\n\
         #define REC_NAME_MAX\t32\n\n\
         struct rec {\n\tint id;\n\tint depth;\n\tunsigned long count;\n\tdouble weight;\n\
         \tunsigned flags;\n\tchar name[REC_NAME_MAX];\n};\n\n",
    );
    s.push_str(&comment(
        rng,
        "",
        "rec_mix: fold two values into one.",
        1..1 + 1,
    ));
    s.push_str(
        "static inline unsigned long\nrec_mix(unsigned long a, unsigned long b)\n{\n\
         \treturn (a * 31UL) ^ (b + 0x9e37UL);\n}\n\n#endif /* COMMON_H */\n",
    );
    s
}

fn header_h(rng: &mut StdRng, h: &HeaderPlan) -> String {
    let hp = &h.prefix;
    let up = hp.to_uppercase();
    let mut s = comment(
        rng,
        "",
        &format!("{}: interfaces of the {hp} subsystem.", h.file),
        3..8,
    );
    let _ = write!(
        s,
        "\n#ifndef {up}_H\n#define {up}_H\n\n#include \"common.h\"\n\n\
         #define {up}_LIMIT\t{}UL\n#define {up}_SHIFT\t{}\n#define {up}_MASK\t0x{:x}u\n\n",
        rng.gen_range(1000..100000),
        rng.gen_range(1..9),
        rng.gen_range(1u32..0xffff),
    );
    s.push_str(&comment(rng, "", "Kinds of state.", 1..1 + 1));
    let _ = write!(
        s,
        "enum {hp}_kind {{\n\t{up}_KIND_A,\n\t{up}_KIND_B,\n\t{up}_KIND_C,\n\t{up}_KIND_D,\n\
         \t{up}_KIND_COUNT\n}};\n\n"
    );
    s.push_str(&comment(rng, "", "Per-subsystem state.", 2..2 + 1));
    let _ = write!(
        s,
        "struct {hp}_state {{\n\tint kind;\n\tunsigned long total;\n\tunsigned mask;\n\
         \tdouble ratio;\n\tchar tag[16];\n}};\n\n\
         static inline int\n{hp}_valid(const struct {hp}_state *s)\n{{\n\
         \treturn s->kind >= 0 && s->mask != 0u;\n}}\n\n"
    );
    let mut last = usize::MAX;
    for (m, f) in &h.decls {
        if *m != last {
            let _ = writeln!(s, "\n/* module {m} */");
            last = *m;
        }
        let _ = writeln!(s, "unsigned long {f}(struct rec *r, int depth);");
    }
    let _ = writeln!(s, "\n#endif /* {up}_H */");
    s
}

/// One statement group of a function body; `k` tells which kind.
fn body_part(rng: &mut StdRng, k: u32, m: &ModulePlan, plan: &Plan) -> String {
    let pre = &m.prefix;
    let pu = pre.to_uppercase();
    let hp = &plan.headers[m.header].prefix;
    let hu = hp.to_uppercase();
    let a = rng.gen_range(2u32..97);
    let b = rng.gen_range(3u32..1000);
    let mask = rng.gen_range(1u32..0xff);
    match k {
        0 => format!(
            "\tfor (int i = 0; i < {b}; i++) {{\n\
             \t\tunsigned v = {pre}_tbl[i % {pu}_TBL_N];\n\n\
             \t\tif ((v & 0x{mask:x}u) != 0u)\n\t\t\tcontinue;\n\
             \t\tacc += (unsigned long)v * (unsigned long)(i + {a});\n\t}}\n"
        ),
        1 => format!(
            "\tswitch ((enum {hp}_kind)(r->flags % {hu}_KIND_COUNT)) {{\n\
             \tcase {hu}_KIND_A:\n\t\tacc += {b}UL;\n\t\tbreak;\n\
             \tcase {hu}_KIND_B:\n\t\tacc -= {a}UL;\n\t\tbreak;\n\
             \tcase {hu}_KIND_C:\n\t\tacc *= 3UL;\n\t\tbreak;\n\
             \tdefault:\n\t\tacc ^= {hu}_MASK;\n\t\tbreak;\n\t}}\n"
        ),
        2 => format!(
            "\tsnprintf(r->name, sizeof(r->name), \"%s-%d\", \"{}\", r->id % 1000);\n\
             \tacc += (unsigned long)strlen(r->name);\n",
            WORDS[rng.gen_range(0..WORDS.len())]
        ),
        3 => format!(
            "\tunsigned bits_v = r->flags | 0x{mask:x}u;\n\tint bits = 0;\n\n\
             \twhile (bits_v != 0u) {{\n\t\tbits += (int)(bits_v & 1u);\n\t\tbits_v >>= 1;\n\t}}\n\
             \tacc += (unsigned long)bits * {a}UL;\n"
        ),
        4 => format!(
            "\tstruct {hp}_state st;\n\n\tmemset(&st, 0, sizeof(st));\n\
             \tst.kind = r->id % {hu}_KIND_COUNT;\n\tst.total = acc;\n\
             \tst.mask = r->flags ^ 0x{mask:x}u;\n\tst.ratio = r->weight / 2.0;\n\
             \tif ({hp}_valid(&st))\n\t\tacc = st.total + (unsigned long)st.mask;\n"
        ),
        5 => format!(
            "\tdouble w = r->weight;\n\n\tfor (int i = 0; i < {b}; i++)\n\
             \t\tw = w * 0.5 + (double)i / {a}.0;\n\tr->weight = w;\n\
             \tif (w > 0.0 && w < 1e9)\n\t\tacc += (unsigned long)w;\n"
        ),
        6 => {
            let n = rng.gen_range(8..33);
            format!(
                "\tint vals[{n}];\n\n\tfor (int i = 0; i < {n}; i++)\n\
                 \t\tvals[i] = (int)((acc + (unsigned long)i * {a}UL) % {b}UL);\n\
                 \tfor (int i = 1; i < {n}; i++) {{\n\t\tint x = vals[i];\n\t\tint j = i - 1;\n\n\
                 \t\twhile (j >= 0 && vals[j] > x) {{\n\t\t\tvals[j + 1] = vals[j];\n\t\t\tj--;\n\t\t}}\n\
                 \t\tvals[j + 1] = x;\n\t}}\n\
                 \tacc += (unsigned long)vals[0] + (unsigned long)vals[{n} - 1];\n"
            )
        }
        7 => format!(
            "\tstruct rec copy = *r;\n\n\tcopy.id += {a};\n\tcopy.flags ^= 0x{mask:x}u;\n\
             \tacc += rec_mix((unsigned long)copy.id, (unsigned long)copy.flags);\n"
        ),
        8 => format!(
            "\tunsigned long lim = {hu}_LIMIT;\n\n\tif (acc > lim)\n\
             \t\tacc = lim - (acc % {b}UL);\n\telse\n\t\tacc <<= {hu}_SHIFT;\n"
        ),
        _ => format!(
            "\tint err = 0;\n\n\tif (r->id < 0) {{\n\t\terr = {a};\n\t\tgoto out;\n\t}}\n\
             \tacc += (unsigned long)r->id * {b}UL;\n\
             \tif ((r->flags & 0x{mask:x}u) == 0u)\n\t\terr = 1;\nout:\n\
             \tif (err != 0)\n\t\tacc -= (unsigned long)err;\n"
        ),
    }
}

const BODY_KINDS: u32 = 10;

fn function(
    rng: &mut StdRng,
    name: &str,
    is_static: bool,
    m: &ModulePlan,
    plan: &Plan,
    callees: &[&str],
) -> String {
    let mut s = comment(rng, "", &format!("{name}:"), 1..4);
    let _ = write!(
        s,
        "{}unsigned long\n{name}(struct rec *r, int depth)\n{{\n\tunsigned long acc = r->count;\n\n",
        if is_static { "static " } else { "" }
    );
    // One to three different statement groups (never the same one twice, so
    // their local names never clash).
    let mut kinds: Vec<u32> = (0..BODY_KINDS).collect();
    kinds.shuffle(rng);
    let parts = rng.gen_range(1..=3);
    for (n, k) in kinds[..parts].iter().enumerate() {
        if n > 0 && rng.gen_bool(0.5) {
            s.push_str(&comment(rng, "\t", "", 1..1 + 1));
        }
        s.push_str(&body_part(rng, *k, m, plan));
    }
    let calls = if callees.is_empty() {
        0
    } else {
        rng.gen_range(0..=2)
    };
    if calls > 0 {
        s.push_str("\tif (depth > 0) {\n");
        for _ in 0..calls {
            let c = callees[rng.gen_range(0..callees.len())];
            let _ = writeln!(s, "\t\tacc += {c}(r, depth - 1);");
        }
        s.push_str("\t}\n");
    } else {
        s.push_str("\tacc ^= (unsigned long)depth;\n");
    }
    s.push_str("\tr->count = acc;\n\treturn acc;\n}\n\n");
    s
}

fn module_c(rng: &mut StdRng, i: usize, plan: &Plan) -> String {
    let m = &plan.modules[i];
    let pre = &m.prefix;
    let pu = pre.to_uppercase();
    let mut s = comment(
        rng,
        "",
        &format!("Generated by anvil bench (nightly-build). {pre}.c:"),
        4..10,
    );
    s.push('\n');
    for h in &m.includes {
        let _ = writeln!(s, "#include \"{}\"", plan.headers[*h].file);
    }
    let ntbl: usize = rng.gen_range(8..33);
    let _ = write!(
        s,
        "\n#define {pu}_TBL_N\t{ntbl}\n\nstatic const unsigned {pre}_tbl[{pu}_TBL_N] = {{\n"
    );
    for row in 0..ntbl.div_ceil(6) {
        s.push('\t');
        for c in 0..6 {
            if row * 6 + c < ntbl {
                let _ = write!(s, "0x{:08x}u, ", rng.gen::<u32>());
            }
        }
        s.truncate(s.trim_end().len());
        s.push('\n');
    }
    s.push_str("};\n\n");
    s.push_str(&comment(rng, "", &format!("struct {pre}_ctx:"), 1..4));
    let _ = write!(
        s,
        "struct {pre}_ctx {{\n\tint refs;\n\tunsigned long hits;\n\tunsigned long misses;\n}};\n\n\
         static struct {pre}_ctx {pre}_global;\n\n"
    );
    for f in &m.statics {
        let _ = writeln!(s, "static unsigned long {f}(struct rec *r, int depth);");
    }
    s.push('\n');
    // Functions of other modules this one may call (never their _init, so
    // the call graph from main stays small).
    let mut callees: Vec<&str> = Vec::new();
    for h in &m.includes {
        for (mi, f) in &plan.headers[*h].decls {
            if *mi != i && !f.ends_with("_init") {
                callees.push(f);
            }
        }
    }
    let mut own: Vec<&str> = m.statics.iter().map(String::as_str).collect();
    own.extend(m.publics.iter().map(String::as_str));
    let mut all: Vec<(&str, bool)> = m.publics.iter().map(|f| (f.as_str(), false)).collect();
    all.extend(m.statics.iter().map(|f| (f.as_str(), true)));
    for (f, is_static) in all {
        s.push_str(&function(rng, f, is_static, m, plan, &callees));
    }
    s.push_str(&comment(
        rng,
        "",
        &format!("{pre}_init: set the module up and run each of its functions once."),
        1..2,
    ));
    let _ = write!(
        s,
        "unsigned long\n{pre}_init(struct rec *r, int depth)\n{{\n\
         \tunsigned long acc = {pre}_tbl[0];\n\n\t{pre}_global.refs++;\n\
         \t{pre}_global.hits += (unsigned long){pre}_global.refs;\n\tacc += {pre}_global.hits;\n"
    );
    for f in own {
        let _ = writeln!(s, "\tacc += {f}(r, depth);");
    }
    s.push_str("\treturn acc;\n}\n");
    s
}

fn main_c(rng: &mut StdRng, plan: &Plan) -> String {
    let mut s = comment(rng, "", "main.c: initialise every module once.", 2..2 + 1);
    s.push('\n');
    for h in &plan.headers {
        let _ = writeln!(s, "#include \"{}\"", h.file);
    }
    s.push_str(
        "\nint\nmain(void)\n{\n\tstruct rec r;\n\tunsigned long total = 0;\n\n\
         \tmemset(&r, 0, sizeof(r));\n\tr.id = 1;\n\tr.flags = 0x5u;\n\tr.weight = 1.0;\n",
    );
    for m in &plan.modules {
        let _ = writeln!(s, "\ttotal += {}_init(&r, 2);", m.prefix);
    }
    s.push_str("\tprintf(\"%lu\\n\", total);\n\treturn 0;\n}\n");
    s
}

fn makefile(p: &Params, plan: &Plan) -> String {
    let mut s = format!(
        "# Generated by anvil bench (nightly-build): {} modules in {} directories.\n\n\
         CC = gcc\nAR = ar\nCFLAGS = {}\nCPPFLAGS = -Iinclude -MMD -MP\n\n",
        plan.modules.len(),
        plan.dirs.len(),
        p.cflags
    );
    for d in &plan.dirs {
        let _ = write!(s, "OBJS_{d} =");
        for m in plan.modules.iter().filter(|m| &m.dir == d) {
            let _ = write!(s, " \\\n\tobj/{d}/{}.o", m.prefix);
        }
        s.push_str("\n\n");
    }
    s.push_str("LIBS =");
    for d in &plan.dirs {
        let _ = write!(s, " lib/lib{d}.a");
    }
    s.push_str("\nALL_OBJS = obj/main.o");
    for d in &plan.dirs {
        let _ = write!(s, " $(OBJS_{d})");
    }
    s.push_str(
        "\n\nall: bin/nightly\n\n\
         obj/%.o: src/%.c\n\t@mkdir -p $(@D)\n\t$(CC) $(CPPFLAGS) $(CFLAGS) -c -o $@ $<\n\n",
    );
    for d in &plan.dirs {
        let _ = write!(
            s,
            "lib/lib{d}.a: $(OBJS_{d})\n\t@mkdir -p $(@D)\n\trm -f $@\n\t$(AR) rcs $@ $^\n\n"
        );
    }
    s.push_str(
        "bin/nightly: obj/main.o $(LIBS)\n\t@mkdir -p $(@D)\n\
         \t$(CC) $(CFLAGS) -o $@ obj/main.o -Wl,--start-group $(LIBS) -Wl,--end-group\n\n\
         clean:\n\trm -rf obj lib bin\n\n.PHONY: all clean\n\n-include $(ALL_OBJS:.o=.d)\n",
    );
    s
}

/// Writes the generated project into the new directory `root`.
pub fn generate_tree(p: &Params, root: &Path) -> Result<()> {
    p.check()?;
    let plan = plan(p);
    let write = |rel: &str, text: &str| -> Result<()> {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).ctx(|| format!("mkdir {}", parent.display()))?;
        }
        fs::write(&path, text).ctx(|| format!("write {}", path.display()))
    };
    // Each file has its own random stream, derived from the seed and its index.
    let rng_for = |n: u64| StdRng::seed_from_u64(p.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ n);
    write("include/common.h", &common_h(&mut rng_for(0)))?;
    for (h, hp) in plan.headers.iter().enumerate().skip(1) {
        write(
            &format!("include/{}", hp.file),
            &header_h(&mut rng_for(h as u64), hp),
        )?;
    }
    for (i, m) in plan.modules.iter().enumerate() {
        let text = module_c(&mut rng_for(1_000_000 + i as u64), i, &plan);
        write(&format!("src/{}/{}.c", m.dir, m.prefix), &text)?;
    }
    write("src/main.c", &main_c(&mut rng_for(999_999), &plan))?;
    write("Makefile", &makefile(p, &plan))?;
    Ok(())
}

// ---------------------------------------------------------------------------
// The run.

struct PhaseRun {
    phase: Phase,
    warnings: u64,
}

fn make(dir: &Path, jobs: u32, target: Option<&str>) -> Result<u64> {
    let mut cmd = Command::new("make");
    cmd.arg(format!("-j{jobs}")).arg("-C").arg(dir);
    if let Some(t) = target {
        cmd.arg(t);
    }
    let out = run_checked(&mut cmd)?;
    let text = String::from_utf8_lossy(&out.stderr);
    Ok(text.lines().filter(|l| l.contains("warning:")).count() as u64)
}

fn check_binary(ws: &Path) -> Result<()> {
    let bin = ws.join("bin/nightly");
    let found = match fs::metadata(&bin) {
        Ok(m) if m.is_file() && m.len() > 0 => return Ok(()),
        Ok(m) if m.is_file() => "an empty file".to_string(),
        Ok(_) => "something that is not a file".to_string(),
        Err(e) => e.to_string(),
    };
    fail(format!(
        "nightly-build: the build did not produce {} ({found})",
        bin.display()
    ))
}

fn run(p: &Params, env: &RunEnv) -> Result<RunOutput> {
    let dir = env.posix_dir("nightly-build")?.to_path_buf();
    require_tools(
        "nightly-build",
        &[
            ("gcc", "gcc"),
            ("make", "make"),
            ("ar", "binutils"),
            ("rm", "coreutils"),
        ],
    )?;
    let source_dir = p.source_dir();
    check_outside("nightly-build", &source_dir, &dir)?;
    env.progress
        .set_message("nightly-build: generating the source tree");
    let src = cached_tree(&source_dir, &p.generator_key(), |root| {
        generate_tree(p, root)
    })?;
    let (src_files, src_bytes) = tree_bytes(&src)?;

    let ws1 = dir.join("ws1");
    let ws2 = dir.join("ws2");
    let ws3 = dir.join("ws3");
    let probe = env.probe;
    let used = || -> Result<u64> {
        probe.sync()?;
        probe.used_bytes()
    };
    env.progress.set_length(5);
    env.progress.set_position(0);

    let mut runs: Vec<PhaseRun> = Vec::new();
    let begin = |name: &str| -> Result<()> {
        env.progress.set_message(format!("nightly-build: {name}"));
        probe.drop_caches()
    };

    // 1. bringover
    begin("bringover")?;
    let base1 = probe.used_bytes()?;
    let (_, mut ph) = env.phase("bringover", || copy_tree(&src, &ws1))?;
    ph.logical_bytes = Some(tree_bytes(&ws1)?.1);
    ph.physical_bytes = Some(used()?.saturating_sub(base1));
    runs.push(PhaseRun {
        phase: ph,
        warnings: 0,
    });
    env.progress.inc(1);

    // 2. build
    begin("build")?;
    let (warnings, mut ph) = env.phase("build", || make(&ws1, p.jobs, None))?;
    check_binary(&ws1)?;
    ph.logical_bytes = Some(tree_bytes(&ws1)?.1);
    ph.physical_bytes = Some(used()?.saturating_sub(base1));
    let ratio = match (ph.logical_bytes, ph.physical_bytes) {
        (Some(l), Some(phys)) if phys > 0 => Some(l as f64 / phys as f64),
        _ => None,
    };
    runs.push(PhaseRun {
        phase: ph,
        warnings,
    });
    env.progress.inc(1);

    // 3. clean
    begin("clean")?;
    let (_, ph) = if p.clean == "workspace" {
        env.phase("clean", || {
            run_checked(Command::new("rm").arg("-rf").arg(&ws1)).map(|_| ())
        })?
    } else {
        env.phase("clean", || make(&ws1, 1, Some("clean")).map(|_| ()))?
    };
    runs.push(PhaseRun {
        phase: ph,
        warnings: 0,
    });
    env.progress.inc(1);

    // 4. two bringovers at once
    begin("par_bringover")?;
    let base2 = probe.used_bytes()?;
    let (_, mut ph) = env.phase("par_bringover", || {
        std::thread::scope(|s| {
            let a = s.spawn(|| copy_tree(&src, &ws2));
            let b = s.spawn(|| copy_tree(&src, &ws3));
            let ra = a
                .join()
                .map_err(|_| BenchError("bringover thread panicked".into()))?;
            let rb = b
                .join()
                .map_err(|_| BenchError("bringover thread panicked".into()))?;
            ra.and(rb)
        })
    })?;
    ph.logical_bytes = Some(tree_bytes(&ws2)?.1 + tree_bytes(&ws3)?.1);
    ph.physical_bytes = Some(used()?.saturating_sub(base2));
    runs.push(PhaseRun {
        phase: ph,
        warnings: 0,
    });
    env.progress.inc(1);

    // 5. two builds at once
    begin("par_build")?;
    let (warnings, mut ph) = env.phase("par_build", || {
        std::thread::scope(|s| {
            let a = s.spawn(|| make(&ws2, p.par_jobs, None));
            let b = s.spawn(|| make(&ws3, p.par_jobs, None));
            let ra = a
                .join()
                .map_err(|_| BenchError("build thread panicked".into()))?;
            let rb = b
                .join()
                .map_err(|_| BenchError("build thread panicked".into()))?;
            Ok::<u64, BenchError>(ra? + rb?)
        })
    })?;
    check_binary(&ws2)?;
    check_binary(&ws3)?;
    ph.logical_bytes = Some(tree_bytes(&ws2)?.1 + tree_bytes(&ws3)?.1);
    ph.physical_bytes = Some(used()?.saturating_sub(base2));
    runs.push(PhaseRun {
        phase: ph,
        warnings,
    });
    env.progress.inc(1);

    // Results.
    let mut out = RunOutput::default();
    let mut total = 0.0;
    for r in &runs {
        out.metrics.push(Metric::lower(
            format!("{}_s", r.phase.name),
            "s",
            r.phase.wall_s,
        ));
        total += r.phase.wall_s;
    }
    out.metrics.push(Metric::lower("total_s", "s", total));
    if let Some(r) = ratio {
        out.metrics
            .push(Metric::higher("compression_ratio", "x", r));
    }
    out.text = text_report(p, src_files, src_bytes, &runs, total, ratio);
    out.phases = runs.iter().map(|r| r.phase.clone()).collect();
    let warnings: u64 = runs.iter().map(|r| r.warnings).sum();
    out.extra = serde_json::json!({
        "source_dir": src.display().to_string(),
        "source_files": src_files,
        "source_bytes": src_bytes,
        "clean": p.clean,
        "compiler_warnings": warnings,
    });
    Ok(out)
}

fn text_report(
    p: &Params,
    files: u64,
    bytes: u64,
    runs: &[PhaseRun],
    total: f64,
    ratio: Option<f64>,
) -> String {
    let mut s = format!(
        "nightly build: {} modules, {} headers, {} dirs; tree {} files, {:.2} MB; make -j{} / 2 x -j{}; clean={}\n",
        p.files,
        p.headers,
        p.dirs,
        files,
        bytes as f64 / MB,
        p.jobs,
        p.par_jobs,
        p.clean
    );
    let _ = writeln!(
        s,
        "{:<14} {:>9} {:>9} {:>9} {:>11} {:>9} {:>8} {:>11} {:>12}",
        "phase",
        "wall s",
        "user s",
        "sys s",
        "MB written",
        "dev I/Os",
        "I/O ms",
        "logical MB",
        "physical MB"
    );
    let opt_mb = |v: Option<u64>| v.map_or("-".to_string(), |b| format!("{:.1}", b as f64 / MB));
    for r in runs {
        let ph = &r.phase;
        let _ = writeln!(
            s,
            "{:<14} {:>9.2} {:>9.2} {:>9.2} {:>11.1} {:>9} {:>8.2} {:>11} {:>12}",
            ph.name,
            ph.wall_s,
            ph.user_s,
            ph.sys_s,
            ph.io.bytes_written() as f64 / MB,
            ph.io.ios(),
            ph.io.mean_io_ms(),
            opt_mb(ph.logical_bytes),
            opt_mb(ph.physical_bytes)
        );
    }
    let _ = writeln!(s, "{:<14} {:>9.2}", "total", total);
    if let Some(r) = ratio {
        let _ = writeln!(s, "compression ratio after the build: {r:.2}x");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::with_env;

    fn tiny(source: &Path) -> Params {
        Params {
            source_dir: source.join("src").display().to_string(),
            ..Params::for_tier(Tier::Tiny)
        }
    }

    fn listing(root: &Path) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    let rel = e.path().strip_prefix(root).unwrap().display().to_string();
                    out.push((rel, fs::read(e.path()).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    #[test]
    fn nightly_generator_is_deterministic_for_a_seed() {
        let t = tempfile::TempDir::new().unwrap();
        let p = Params::for_tier(Tier::Tiny);
        generate_tree(&p, &t.path().join("a")).unwrap();
        generate_tree(&p, &t.path().join("b")).unwrap();
        let other = Params {
            seed: 2,
            ..p.clone()
        };
        generate_tree(&other, &t.path().join("c")).unwrap();
        let a = listing(&t.path().join("a"));
        assert_eq!(a, listing(&t.path().join("b")));
        assert_ne!(a, listing(&t.path().join("c")));
        let c_files = a.iter().filter(|(n, _)| n.ends_with(".c")).count();
        assert_eq!(c_files, p.files as usize + 1, "modules plus main.c");
        let headers = a.iter().filter(|(n, _)| n.ends_with(".h")).count();
        assert_eq!(headers, p.headers as usize);
        assert!(a.iter().any(|(n, _)| n == "Makefile"));
    }

    #[test]
    fn nightly_tiny_builds_the_binary() {
        let src = tempfile::TempDir::new().unwrap();
        let work = tempfile::TempDir::new().unwrap();
        let p = tiny(src.path());
        let out = with_env(work.path(), |env| run(&p, env)).unwrap();
        assert_eq!(out.errors, 0);
        assert_eq!(out.extra["compiler_warnings"], 0, "{}", out.text);
        for name in [
            "bringover_s",
            "build_s",
            "clean_s",
            "par_bringover_s",
            "par_build_s",
            "total_s",
            "compression_ratio",
        ] {
            assert!(out.metrics.iter().any(|m| m.name == name), "missing {name}");
        }
        let names: Vec<&str> = out.phases.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["bringover", "build", "clean", "par_bringover", "par_build"]
        );
        assert!(out.phases[1].logical_bytes.unwrap() > out.phases[0].logical_bytes.unwrap());
        // ws1 was removed; ws2 and ws3 hold working binaries.
        assert!(!work.path().join("ws1").exists());
        for ws in ["ws2", "ws3"] {
            let bin = work.path().join(ws).join("bin/nightly");
            let run = Command::new(&bin).output().unwrap();
            assert!(run.status.success(), "{}", bin.display());
            assert!(!run.stdout.is_empty());
        }
        // Modes survive the bringover; the cached tree is reused.
        let mk = work.path().join("ws2/Makefile");
        let orig = src.path().join("src/tree/Makefile");
        assert_eq!(
            fs::metadata(mk).unwrap().mode() & 0o777,
            fs::metadata(&orig).unwrap().mode() & 0o777
        );
        let stamp = src.path().join("src/complete");
        let t0 = fs::metadata(&stamp).unwrap().modified().unwrap();
        cached_tree(&src.path().join("src"), &p.generator_key(), |_| {
            fail("regenerated")
        })
        .unwrap();
        assert_eq!(fs::metadata(&stamp).unwrap().modified().unwrap(), t0);
        let other = Params { seed: 7, ..p };
        let err = cached_tree(&src.path().join("src"), &other.generator_key(), |_| Ok(()));
        assert!(err.unwrap_err().to_string().contains("other parameters"));
    }

    #[test]
    fn nightly_params_overrides_and_checks() {
        let ov = vec![("clean".to_string(), "bogus".to_string())];
        assert!(workload(Tier::Tiny, &ov).is_err());
        let ov = vec![("clean".to_string(), "outputs".to_string())];
        let w = workload(Tier::Quick, &ov).unwrap();
        assert_eq!(w.params()["clean"], "outputs");
        assert_eq!(w.params()["files"], 150);
        assert!(require_tools("x", &[("no-such-program-xyz", "nopkg")])
            .unwrap_err()
            .to_string()
            .contains("package nopkg"));
    }
}
