//! blogbench 1.1, reimplemented.
//!
//! Blogbench (Frank Denis, 2005-2010) models a busy blog server: writer
//! threads create whole blogs (a directory full of articles and pictures),
//! a rewriter replaces single articles and pictures, commenters rewrite batches
//! of comments and a crowd of readers reads random blogs from start to end.
//! Every file is written to a temporary name and renamed into place. A stats
//! thread wakes up every interval and prints what happened in it; the scores
//! are the blogs written and the blogs read over the whole run. DragonFly's
//! HAMMER-vs-UFS comparisons of 2008/2009 were run with it.
//!
//! This module follows the 1.1 sources operation for operation: the same
//! file names, sizes (`min + r % (max - min)`), descending creation order,
//! 8 KiB write chunks, 64 KiB read chunks, no fsync, the same short-circuit
//! choices in the rewriter and reader, the same choice of random blog (never
//! the newest id; 0 for readers and rewriters means "nothing to do yet") and
//! the same text output, so tools that parse blogbench's output (the Phoronix
//! test profile, for one) parse ours too. Deliberate differences, all recorded
//! in the results:
//!
//! * The original draws from libc's global `rand()`, never seeded. Here all
//!   threads draw from one seeded generator behind one lock, like glibc's
//!   `rand()`, whose lock all 109 threads share; `shared_rng=false` gives each
//!   thread its own generator seeded from the run's seed plus the thread index.
//!   The counters are atomics instead of racy globals.
//! * Like 1.1, all readers read into one shared buffer (the cache-line
//!   ping-pong it causes slows readers and shifts CPU to writers, which the
//!   scores show); `shared_read_buffer=false` (`--private-read-buffers`)
//!   gives each reader its own.
//! * `content` may replace the all-zero data of the original by incompressible
//!   or text-like bytes (zero data flatters compressing file systems).
//! * `compat_1_2` reproduces blogbench 1.2's accidental 8-byte reads.
//! * The one-second sleep after a failure ends early when the run stops, and
//!   failures are counted (the original just prints some of them).
//! * The other threads are started once the first writer has made `blog-0/`,
//!   so commenters (which may pick blog 0 at once) never lose a start-up race
//!   that the C program usually, but not always, wins.
//! * The interval clock is kept against the start time rather than by
//!   sleeping N seconds after each report, so printing does not drift it.
//!
//! Only [`Vfs`] operations touch the file system, so the workload also runs
//! in-process on an anvil volume (`--fs anvil-lib`).

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::env::{IoCounters, Metric, Probe, RunEnv, RunOutput, Series};
use crate::error::{fail, BenchError, Context, Result};
use crate::vfs::{PosixVfs, Vfs};
use crate::workloads::{apply_overrides, Overrides, Tier, Workload};

// ---------------------------------------------------------------------------
// Constants of blogbench 1.1 (src/blogbench.h).

/// Highest article, picture and comment number in a blog.
const MAX_PER_BLOG: u32 = 100;
/// Files are written in chunks of this size ("the default PHP buffer size").
const WRITE_CHUNK: usize = 8192;
/// Files are read in chunks of this size (version 1.1).
const READ_CHUNK: usize = 65536;
/// Version 1.2 reads through `sizeof` of a pointer: 8 bytes at a time.
const COMPAT_1_2_READ_CHUNK: usize = 8;
const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;
const TMP_SUFFIX: &str = ".tmp";
/// Pause after a failed operation.
const FAILURE_PAUSE: Duration = Duration::from_secs(1);

/// Bytes of generated data each writing thread draws its file contents from
/// when the content is not zeros. Each file starts at a random offset, so the
/// 8 KiB chunks of one file are all different.
const POOL_BYTES: usize = 1 << 20;
/// How many failure messages are kept for the results.
const KEPT_ERRORS: usize = 20;

/// The three kinds of files of a blog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Article,
    Picture,
    Comment,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Article => "article-",
            Kind::Picture => "picture-",
            Kind::Comment => "comment-",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Kind::Article | Kind::Comment => ".xml",
            Kind::Picture => ".jpg",
        }
    }

    /// Size range: a file gets `min + r % (max - min)` bytes, so the size is
    /// in `min..max` (`max` itself never occurs).
    fn size_range(self) -> (u64, u64) {
        match self {
            Kind::Article => (1024, 32768),
            Kind::Picture => (8192, 65536),
            Kind::Comment => (2048, 10240),
        }
    }
}

// ---------------------------------------------------------------------------
// Parameters.

/// What the files contain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Content {
    /// All zero bytes, as in the original.
    Zero,
    /// Incompressible bytes from the seeded PRNG.
    Random,
    /// English-like words: compressible roughly like real text.
    Text,
}

impl Content {
    fn name(self) -> &'static str {
        match self {
            Content::Zero => "zero",
            Content::Random => "random",
            Content::Text => "text",
        }
    }
}

/// Parameters of a run, recorded in the results exactly as run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Number of report intervals (`-i`).
    pub iterations: u32,
    /// Length of an interval in seconds (`-s`; fractions allowed).
    pub sleep_secs: f64,
    /// Reader threads (`-r`).
    pub readers: u32,
    /// Writer threads (`-w`).
    pub writers: u32,
    /// Rewriter threads (`-W`).
    pub rewriters: u32,
    /// Commenter threads (`-c`).
    pub commenters: u32,
    /// Data written into the files.
    pub content: Content,
    /// Read 8 bytes at a time, like blogbench 1.2 does by mistake.
    pub compat_1_2: bool,
    /// All readers read into one buffer, as 1.1 does (`static char garbage[65536]`):
    /// the copies contend for the same cache lines, which slows readers and so leaves
    /// writers more CPU. False gives each reader its own buffer.
    #[serde(default = "yes")]
    pub shared_read_buffer: bool,
    /// All threads draw random numbers from one generator behind one lock, as 1.1
    /// does through libc's `rand()`. False gives each thread its own generator.
    #[serde(default = "yes")]
    pub shared_rng: bool,
    /// PRNG seed; 0 takes the run's seed from the harness.
    pub seed: u64,
}

impl Params {
    /// Defaults of a tier.
    ///
    /// The original's defaults are `-i 30 -s 10 -r 100 -w 3 -W 1 -c 5`: that
    /// is the full tier. Dillon's 2008 HAMMER/UFS runs used
    /// `--iterations=100`, which `--set iterations=100` reproduces.
    pub fn for_tier(tier: Tier) -> Params {
        let original = Params {
            iterations: 30,
            sleep_secs: 10.0,
            readers: 100,
            writers: 3,
            rewriters: 1,
            commenters: 5,
            content: Content::Zero,
            compat_1_2: false,
            shared_read_buffer: true,
            shared_rng: true,
            seed: 0,
        };
        match tier {
            Tier::Tiny => Params {
                iterations: 2,
                sleep_secs: 0.5,
                readers: 2,
                writers: 1,
                rewriters: 1,
                commenters: 1,
                ..original
            },
            Tier::Quick => Params {
                iterations: 3,
                sleep_secs: 2.0,
                readers: 10,
                ..original
            },
            Tier::Standard => Params {
                iterations: 12,
                sleep_secs: 5.0,
                ..original
            },
            Tier::Full => original,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.iterations == 0 {
            return fail("blogbench: iterations must be at least 1");
        }
        if !(self.sleep_secs.is_finite() && self.sleep_secs > 0.0 && self.sleep_secs < 1e6) {
            return fail(format!(
                "blogbench: sleep_secs must be a positive number of seconds, not {}",
                self.sleep_secs
            ));
        }
        Ok(())
    }

    fn read_chunk(&self) -> usize {
        if self.compat_1_2 {
            COMPAT_1_2_READ_CHUNK
        } else {
            READ_CHUNK
        }
    }
}

fn yes() -> bool {
    true
}

/// Memory every reader reads into when `shared_read_buffer` is on. Only the kernel
/// writes it (through [`crate::vfs::VFile::read_shared`]) and nothing reads it.
struct SharedBuffer {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is only handed to read(2); Rust never reads or writes through it.
unsafe impl Send for SharedBuffer {}
// SAFETY: as above.
unsafe impl Sync for SharedBuffer {}

impl SharedBuffer {
    fn new(len: usize) -> SharedBuffer {
        let ptr = Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>();
        SharedBuffer { ptr, len }
    }
}

impl Drop for SharedBuffer {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from Box::into_raw of a boxed slice of `len` bytes, and no
        // reader is running any more (threads are joined before `Shared` is dropped).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// Builds blogbench with the tier's defaults and `overrides` applied.
pub fn workload(tier: Tier, overrides: &Overrides) -> Result<Box<dyn Workload>> {
    let params = apply_overrides(Params::for_tier(tier), overrides)?;
    params.validate()?;
    Ok(Box::new(Blogbench { params }))
}

struct Blogbench {
    params: Params,
}

impl Workload for Blogbench {
    fn name(&self) -> &'static str {
        "blogbench"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or(serde_json::Value::Null)
    }

    fn lib_capable(&self) -> bool {
        true
    }

    fn run(&self, env: &RunEnv) -> Result<RunOutput> {
        let scratch = match &env.dir {
            Some(d) => d.display().to_string(),
            None => format!("{}:{}", env.vfs.kind(), env.fs_label),
        };
        execute(&self.params, env, &scratch, &mut |_| {})
    }
}

// ---------------------------------------------------------------------------
// State shared by the threads of a run.

/// An atomic counter on a cache line of its own, so that threads bumping
/// different counters do not contend for one line.
#[derive(Default)]
#[repr(align(64))]
struct Padded(AtomicU64);

/// Per-interval counters, named after the columns of the report.
#[derive(Default)]
struct Counters {
    articles_read: Padded,
    articles_written: Padded,
    pictures_read: Padded,
    pictures_written: Padded,
    comments_read: Padded,
    comments_written: Padded,
    blogs_read: Padded,
    blogs_written: Padded,
}

/// The counters of one interval, taken (and zeroed) by the stats loop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
struct Counts {
    articles_read: u64,
    articles_written: u64,
    pictures_read: u64,
    pictures_written: u64,
    comments_read: u64,
    comments_written: u64,
    blogs_read: u64,
    blogs_written: u64,
}

impl Counters {
    fn bump(c: &Padded) {
        c.0.fetch_add(1, Ordering::Relaxed);
    }

    fn take(&self) -> Counts {
        let t = |c: &Padded| c.0.swap(0, Ordering::Relaxed);
        Counts {
            articles_read: t(&self.articles_read),
            articles_written: t(&self.articles_written),
            pictures_read: t(&self.pictures_read),
            pictures_written: t(&self.pictures_written),
            comments_read: t(&self.comments_read),
            comments_written: t(&self.comments_written),
            blogs_read: t(&self.blogs_read),
            blogs_written: t(&self.blogs_written),
        }
    }
}

/// A flag that is set once, with a sleep that its setting interrupts: the
/// end of the run, and the creation of the first blog's directory.
#[derive(Default)]
struct Event {
    flag: AtomicBool,
    lock: Mutex<bool>,
    cond: Condvar,
}

impl Event {
    fn is_set(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.flag.store(true, Ordering::Release);
        let mut set = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        *set = true;
        self.cond.notify_all();
    }

    /// Sleeps for `d`, or less if the event happens meanwhile.
    fn wait(&self, d: Duration) {
        let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .cond
            .wait_timeout_while(guard, d, |set| !*set)
            .unwrap_or_else(|e| e.into_inner());
    }
}

struct Shared<'a> {
    vfs: &'a dyn Vfs,
    content: Content,
    read_chunk: usize,
    /// The one buffer of 1.1's readers, when `shared_read_buffer` is on.
    shared_buf: Option<SharedBuffer>,
    /// The one generator of all threads, when `shared_rng` is on.
    shared_rng: Option<Mutex<StdRng>>,
    /// Id the next new blog gets (a mutex-protected counter in the original).
    next_blog_id: AtomicU64,
    counters: Counters,
    /// Failed operations (each followed by a pause), plus read errors.
    errors: AtomicU64,
    /// Readers' and rewriters' "no blog to pick yet" (also followed by a
    /// pause in the original, but not an error).
    idle: AtomicU64,
    first_errors: Mutex<Vec<String>>,
    /// Renames whose temporary file another thread had renamed first (see
    /// [`Failure::Collision`]).
    collisions: AtomicU64,
    first_collisions: Mutex<Vec<String>>,
    /// The run is over: threads finish their current operation and end.
    stop: Event,
    /// A writer has tried to make the directory of blog 0.
    first_blog: Event,
}

impl<'a> Shared<'a> {
    fn new(vfs: &'a dyn Vfs, content: Content, read_chunk: usize) -> Shared<'a> {
        Shared {
            vfs,
            content,
            read_chunk,
            shared_buf: None,
            shared_rng: None,
            next_blog_id: AtomicU64::new(0),
            counters: Counters::default(),
            errors: AtomicU64::new(0),
            idle: AtomicU64::new(0),
            first_errors: Mutex::new(Vec::new()),
            collisions: AtomicU64::new(0),
            first_collisions: Mutex::new(Vec::new()),
            stop: Event::default(),
            first_blog: Event::default(),
        }
    }

    fn note_error(&self, msg: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.first_errors.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < KEPT_ERRORS {
            kept.push(msg);
        }
    }
}

/// Picks an existing blog the way blogbench does: with `next` ids handed out
/// so far, the newest is `next - 1`; the result is uniform in `0..next - 1`,
/// which leaves out the newest blog (it may still be being written, as may
/// others), and it is 0 when there is at most one blog. Readers and rewriters
/// take 0 to mean "nothing to do yet", so they never touch blog 0; commenters
/// take it as a blog like any other.
fn random_blog_id(next: u64, rng: &mut impl RngCore) -> u64 {
    let newest = next.saturating_sub(1);
    if newest == 0 {
        0
    } else {
        // Four draws, combined as the original combines four `rand()`s.
        let mut r = || u64::from(rand31(rng));
        (r() ^ (r() << 16) ^ (r() << 32) ^ (r() << 48)) % newest
    }
}

/// A thread's random numbers: its own generator, or the one all threads share
/// (locked for every draw, as glibc locks `rand()`).
enum Draw<'a> {
    Own(Box<StdRng>),
    Shared(&'a Mutex<StdRng>),
}

impl Draw<'_> {
    fn with<T>(&mut self, f: impl FnOnce(&mut StdRng) -> T) -> T {
        match self {
            Draw::Own(rng) => f(rng),
            Draw::Shared(m) => f(&mut m.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }
}

impl RngCore for Draw<'_> {
    fn next_u32(&mut self) -> u32 {
        self.with(|r| r.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        self.with(|r| r.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.with(|r| r.fill_bytes(dest))
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> std::result::Result<(), rand::Error> {
        self.with(|r| r.try_fill_bytes(dest))
    }
}

/// Like libc's `rand()`: 31 random bits.
fn rand31(rng: &mut impl RngCore) -> u32 {
    rng.next_u32() >> 1
}

/// How many articles, pictures or comments: `1 + r % 100`.
fn count_per_blog(rng: &mut impl RngCore) -> u32 {
    1 + rand31(rng) % MAX_PER_BLOG
}

fn file_size(kind: Kind, rng: &mut impl RngCore) -> u64 {
    let (min, max) = kind.size_range();
    min + u64::from(rand31(rng)) % (max - min)
}

/// Where file data comes from.
enum Source {
    Zero,
    Pool(Vec<u8>),
}

static ZEROS: [u8; WRITE_CHUNK] = [0; WRITE_CHUNK];

/// Words for the "text" content; common English words, so the generated
/// text compresses somewhat like prose does.
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "blog", "post", "comment",
    "picture", "article", "file", "system", "disk", "write", "read", "time", "people", "new",
    "first", "about", "into", "some", "could", "them", "other", "than", "then", "now", "only",
    "these", "two", "may", "any", "over", "after", "most", "through", "where", "much", "before",
    "right", "because", "same", "good", "very", "still", "should", "between", "never",
];

fn text_pool(rng: &mut impl RngCore, len: usize) -> Vec<u8> {
    let mut s = String::with_capacity(len + 64);
    let mut sentence_words = 0;
    let mut sentences = 0;
    while s.len() < len {
        let word = WORDS[rng.gen_range(0..WORDS.len())];
        if sentence_words == 0 {
            let mut chars = word.chars();
            if let Some(c) = chars.next() {
                s.push(c.to_ascii_uppercase());
                s.push_str(chars.as_str());
            }
        } else {
            s.push_str(word);
        }
        sentence_words += 1;
        if sentence_words >= 4 && rng.gen_range(0..8) == 0 {
            sentence_words = 0;
            sentences += 1;
            s.push('.');
            s.push(if sentences % 6 == 0 { '\n' } else { ' ' });
        } else if rng.gen_range(0..12) == 0 {
            s.push_str(", ");
        } else {
            s.push(' ');
        }
    }
    let mut bytes = s.into_bytes();
    bytes.truncate(len);
    bytes
}

impl Source {
    fn new(content: Content, rng: &mut impl RngCore) -> Source {
        match content {
            Content::Zero => Source::Zero,
            Content::Random => {
                let mut pool = vec![0; POOL_BYTES];
                rng.fill_bytes(&mut pool);
                Source::Pool(pool)
            }
            Content::Text => Source::Pool(text_pool(rng, POOL_BYTES)),
        }
    }

    /// Start offset of a new file's data.
    fn start(&self, rng: &mut impl RngCore) -> usize {
        match self {
            Source::Zero => 0,
            Source::Pool(pool) => rng.gen_range(0..pool.len() - READ_CHUNK),
        }
    }

    /// `len` (at most [`WRITE_CHUNK`]) bytes at `offset` past the file's start.
    fn chunk(&self, start: usize, offset: usize, len: usize) -> &[u8] {
        match self {
            Source::Zero => &ZEROS[..len],
            Source::Pool(pool) => {
                // Files are smaller than 64 KiB; wrap just in case.
                let at = (start + offset) % (pool.len() - len);
                &pool[at..at + len]
            }
        }
    }
}

/// Why an operation of a thread failed; either way the thread pauses.
enum Failure {
    /// No blog to pick yet (readers and rewriters).
    NoBlog,
    /// A file-system operation failed.
    Io(String),
    /// A rename found its temporary file gone: another thread of the benchmark wrote the
    /// same `.tmp` name at the same time and renamed it first (two commenters on one
    /// blog, or the rewriter and a writer). blogbench's own race, which the original has
    /// too; counted apart from errors, followed by the same pause.
    Collision(String),
}

type Step = std::result::Result<(), Failure>;

fn io_failure(op: &str, path: &str, err: &io::Error) -> Failure {
    Failure::Io(format!("{op} {path}: {err}"))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Writer,
    Rewriter,
    Commenter,
    Reader,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Writer => "writer",
            Role::Rewriter => "rewriter",
            Role::Commenter => "commenter",
            Role::Reader => "reader",
        }
    }
}

/// One thread's private state.
struct Worker<'a> {
    sh: &'a Shared<'a>,
    rng: Draw<'a>,
    source: Source,
    read_buf: Vec<u8>,
    /// Path buffers, reused from file to file.
    name: String,
    tmp: String,
}

impl<'a> Worker<'a> {
    fn new(sh: &'a Shared<'a>, role: Role, seed: u64) -> Worker<'a> {
        let mut rng = StdRng::seed_from_u64(seed);
        let source = match role {
            Role::Reader => Source::Zero,
            _ => Source::new(sh.content, &mut rng),
        };
        let read_buf = match role {
            Role::Reader => vec![0; sh.read_chunk],
            _ => Vec::new(),
        };
        // The data pool above always comes from the thread's own generator: it is
        // not part of the original, and drawing it should not contend.
        let rng = match &sh.shared_rng {
            Some(shared) => Draw::Shared(shared),
            None => Draw::Own(Box::new(rng)),
        };
        Worker {
            sh,
            rng,
            source,
            read_buf,
            name: String::with_capacity(64),
            tmp: String::with_capacity(64),
        }
    }

    fn random_blog(&mut self) -> u64 {
        let next = self.sh.next_blog_id.load(Ordering::Relaxed);
        random_blog_id(next, &mut self.rng)
    }

    fn set_name(&mut self, blog: u64, kind: Kind, n: u32) {
        self.name.clear();
        let _ = write!(
            self.name,
            "blog-{blog}/{}{n}{}",
            kind.prefix(),
            kind.suffix()
        );
    }

    /// Writes `size` bytes to a new file at the path in `self.tmp`, in
    /// chunks of at most 8 KiB. The file is removed again if a write fails.
    fn create_file(&mut self, size: u64) -> Step {
        let vfs = self.sh.vfs;
        let mut file = match vfs.create(&self.tmp, FILE_MODE) {
            Ok(f) => f,
            Err(e) => return Err(io_failure("create", &self.tmp, &e)),
        };
        let start = self.source.start(&mut self.rng);
        let mut done = 0usize;
        let mut left = size as usize;
        while left > 0 {
            let n = left.min(WRITE_CHUNK);
            match file.write(self.source.chunk(start, done, n)) {
                Ok(0) => {
                    drop(file);
                    let _ = vfs.unlink(&self.tmp);
                    return Err(Failure::Io(format!("write {}: wrote nothing", self.tmp)));
                }
                Ok(w) => {
                    done += w;
                    left -= w;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    drop(file);
                    let _ = vfs.unlink(&self.tmp);
                    return Err(io_failure("write", &self.tmp, &e));
                }
            }
        }
        drop(file);
        Ok(())
    }

    /// Creates or replaces a file of the blog atomically: write it under a
    /// temporary name, then rename it over the final one. As in the original,
    /// a failed rename removes both names.
    fn create_atomic(&mut self, blog: u64, kind: Kind, n: u32) -> Step {
        self.set_name(blog, kind, n);
        self.tmp.clear();
        self.tmp.push_str(&self.name);
        self.tmp.push_str(TMP_SUFFIX);
        let size = file_size(kind, &mut self.rng);
        self.create_file(size)?;
        let vfs = self.sh.vfs;
        if let Err(e) = vfs.rename(&self.tmp, &self.name) {
            let _ = vfs.unlink(&self.tmp);
            let _ = vfs.unlink(&self.name);
            let msg = format!("rename {} to {}: {e}", self.tmp, self.name);
            return Err(if e.raw_os_error() == Some(libc::ENOENT) {
                Failure::Collision(msg)
            } else {
                Failure::Io(msg)
            });
        }
        Ok(())
    }

    /// Reads the file at `self.name` to the end. False if it cannot be
    /// opened (normally: it does not exist). A read error ends the file
    /// early, is counted, and still counts as a file read, as in 1.1.
    fn read_file(&mut self) -> bool {
        let vfs = self.sh.vfs;
        let mut file = match vfs.open_read(&self.name) {
            Ok(f) => f,
            Err(_) => return false,
        };
        loop {
            let got = match &self.sh.shared_buf {
                // SAFETY: the shared buffer lives as long as `Shared` and is only ever
                // written by read(2), never referenced from Rust.
                Some(b) => unsafe { file.read_shared(b.ptr, b.len) },
                None => file.read(&mut self.read_buf),
            };
            match got {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.sh.note_error(format!("read {}: {e}", self.name));
                    break;
                }
            }
        }
        true
    }

    // --- the writer -------------------------------------------------------

    /// A new blog: its directory, articles n..1, then pictures m..1.
    fn create_blog(&mut self) -> Step {
        let sh = self.sh;
        let id = sh.next_blog_id.fetch_add(1, Ordering::Relaxed);
        self.name.clear();
        let _ = write!(self.name, "blog-{id}");
        let made = sh.vfs.mkdir(&self.name, DIR_MODE);
        if id == 0 {
            sh.first_blog.set();
        }
        if let Err(e) = made {
            if e.raw_os_error() != Some(libc::EEXIST) {
                // The original pauses here and once more in its loop.
                sh.stop.wait(FAILURE_PAUSE);
                return Err(io_failure("mkdir", &self.name, &e));
            }
        }
        let articles = count_per_blog(&mut self.rng);
        for n in (1..=articles).rev() {
            self.create_atomic(id, Kind::Article, n)?;
            Counters::bump(&sh.counters.articles_written);
        }
        let pictures = count_per_blog(&mut self.rng);
        for n in (1..=pictures).rev() {
            self.create_atomic(id, Kind::Picture, n)?;
            Counters::bump(&sh.counters.pictures_written);
        }
        Counters::bump(&sh.counters.blogs_written);
        Ok(())
    }

    // --- the rewriter -----------------------------------------------------

    fn replace_random(&mut self, blog: u64, kind: Kind) -> Step {
        let n = count_per_blog(&mut self.rng);
        self.create_atomic(blog, kind, n)?;
        let c = &self.sh.counters;
        Counters::bump(match kind {
            Kind::Article => &c.articles_written,
            Kind::Picture => &c.pictures_written,
            Kind::Comment => &c.comments_written,
        });
        Ok(())
    }

    /// Half the time a picture and then an article, otherwise an article (the
    /// effect of the original's `if (coin && picture() fails) ... else if`).
    fn rewrite_blog(&mut self) -> Step {
        let blog = self.random_blog();
        if blog == 0 {
            return Err(Failure::NoBlog);
        }
        if rand31(&mut self.rng) & 1 == 0 {
            self.replace_random(blog, Kind::Picture)?;
        }
        self.replace_random(blog, Kind::Article)
    }

    // --- the commenter ----------------------------------------------------

    /// Comments n..1 of a random blog, replacing those that exist. Blog 0 is
    /// a valid choice here.
    fn comment_blog(&mut self) -> Step {
        let blog = self.random_blog();
        let comments = count_per_blog(&mut self.rng);
        for n in (1..=comments).rev() {
            self.create_atomic(blog, Kind::Comment, n)?;
            Counters::bump(&self.sh.counters.comments_written);
        }
        Ok(())
    }

    // --- the reader -------------------------------------------------------

    /// Comments 1, 2, ... up to the first missing one.
    fn read_comments(&mut self, blog: u64) {
        for n in 1.. {
            self.set_name(blog, Kind::Comment, n);
            if !self.read_file() {
                break;
            }
            Counters::bump(&self.sh.counters.comments_read);
        }
    }

    /// For n = 1, 2, ...: picture n if it exists, then article n; stops at
    /// the first missing article.
    fn read_articles(&mut self, blog: u64) {
        for n in 1.. {
            self.set_name(blog, Kind::Picture, n);
            if self.read_file() {
                Counters::bump(&self.sh.counters.pictures_read);
            }
            self.set_name(blog, Kind::Article, n);
            if !self.read_file() {
                break;
            }
            Counters::bump(&self.sh.counters.articles_read);
        }
    }

    /// Half the time the comments and then the articles, otherwise the
    /// articles only.
    fn read_blog(&mut self) -> Step {
        let blog = self.random_blog();
        if blog == 0 {
            return Err(Failure::NoBlog);
        }
        if rand31(&mut self.rng) & 1 == 0 {
            self.read_comments(blog);
        }
        self.read_articles(blog);
        Counters::bump(&self.sh.counters.blogs_read);
        Ok(())
    }

    /// The thread's loop: one operation, a pause after a failure, and again
    /// until the run stops (at least once, like the original's do-while).
    fn run(mut self, role: Role) {
        loop {
            let step = match role {
                Role::Writer => self.create_blog(),
                Role::Rewriter => self.rewrite_blog(),
                Role::Commenter => self.comment_blog(),
                Role::Reader => self.read_blog(),
            };
            match step {
                Ok(()) => {}
                Err(Failure::NoBlog) => {
                    self.sh.idle.fetch_add(1, Ordering::Relaxed);
                    self.sh.stop.wait(FAILURE_PAUSE);
                }
                Err(Failure::Io(msg)) => {
                    self.sh.note_error(msg);
                    self.sh.stop.wait(FAILURE_PAUSE);
                }
                Err(Failure::Collision(msg)) => {
                    self.sh.collisions.fetch_add(1, Ordering::Relaxed);
                    let mut kept = self
                        .sh
                        .first_collisions
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if kept.len() < KEPT_ERRORS {
                        kept.push(msg);
                    }
                    drop(kept);
                    self.sh.stop.wait(FAILURE_PAUSE);
                }
            }
            if self.sh.stop.is_set() {
                break;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The run: spawn the threads, report every interval, stop, join.

/// One reported interval.
#[derive(Clone, Debug, Serialize)]
struct Interval {
    /// End of the interval, seconds since the threads were started.
    t_end: f64,
    /// Blogs completed up to the end of the interval ("Nb blogs").
    nb_blogs: u64,
    articles_read: u64,
    articles_written: u64,
    pictures_read: u64,
    pictures_written: u64,
    comments_read: u64,
    comments_written: u64,
    blogs_read: u64,
    blogs_written: u64,
    /// Bytes in use on the file system at the end of the interval.
    bytes_on_disk: Option<u64>,
    /// Device I/O during the interval.
    io: IoCounters,
    /// Errors during the interval.
    errors: u64,
}

/// The text of the run, kept and passed to a callback as it is produced.
struct TextOut<'f> {
    text: String,
    emit: &'f mut dyn FnMut(&str),
}

impl TextOut<'_> {
    fn put(&mut self, s: &str) {
        self.text.push_str(s);
        (self.emit)(s);
    }
}

/// Seconds as the original prints them (an integer there).
fn secs_text(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{}", s as u64)
    } else {
        format!("{s}")
    }
}

const COLUMN_HEADER: &str =
    "  Nb blogs   R articles    W articles    R pictures    W pictures    R comments    W comments";

fn row_text(nb_blogs: u64, c: &Counts) -> String {
    format!(
        "{:>10} {:>12} {:>13} {:>13} {:>13} {:>13} {:>13}\n",
        nb_blogs,
        c.articles_read,
        c.articles_written,
        c.pictures_read,
        c.pictures_written,
        c.comments_read,
        c.comments_written
    )
}

/// Runs blogbench in `env` and returns its output. `emit` gets the text
/// report piece by piece as it is produced (the header, then each interval's
/// row when the interval ends, then the final scores); `scratch` is the
/// directory name the header shows.
fn execute(
    params: &Params,
    env: &RunEnv,
    scratch: &str,
    emit: &mut dyn FnMut(&str),
) -> Result<RunOutput> {
    params.validate()?;
    let seed = if params.seed != 0 {
        params.seed
    } else {
        env.seed
    };
    let mut out = TextOut {
        text: String::new(),
        emit,
    };
    let mut shared = Shared::new(env.vfs, params.content, params.read_chunk());
    if params.shared_read_buffer {
        shared.shared_buf = Some(SharedBuffer::new(params.read_chunk()));
    }
    if params.shared_rng {
        shared.shared_rng = Some(Mutex::new(StdRng::seed_from_u64(seed)));
    }
    let interval = Duration::from_secs_f64(params.sleep_secs);
    let progress: &ProgressBar = env.progress;
    progress.set_length(u64::from(params.iterations));
    progress.set_position(0);
    progress.set_message("0 blogs");

    let (intervals, phase) = env.phase("run", || {
        out.put(&format!(
            "\nFrequency = {} secs\nScratch dir = [{}]\n",
            secs_text(params.sleep_secs),
            scratch
        ));
        // The original syncs once before it starts; a failure is not fatal.
        let _ = env.probe.sync();
        std::thread::scope(|scope| -> Result<Vec<Interval>> {
            let groups = [
                (Role::Writer, params.writers),
                (Role::Rewriter, params.rewriters),
                (Role::Commenter, params.commenters),
                (Role::Reader, params.readers),
            ];
            let mut index = 0u64;
            for (role, count) in groups {
                out.put(&format!("Spawning {count} {}s...\n", role.name()));
                if role == Role::Rewriter && params.writers > 0 {
                    // Commenters write into blog 0 from the start. The C
                    // program starts them a little after the writers, which
                    // usually but not always have made blog-0/ by then; the
                    // losers fail and count an error. Waiting for that first
                    // mkdir (microseconds) removes the race.
                    shared.first_blog.wait(FAILURE_PAUSE);
                }
                for i in 0..count {
                    // The worker (and its data pool) is made here, so that a
                    // thread starts working as soon as it runs, as in C.
                    let worker = Worker::new(&shared, role, seed.wrapping_add(index));
                    index += 1;
                    let spawned = std::thread::Builder::new()
                        .name(format!("bb-{}-{i}", role.name()))
                        .spawn_scoped(scope, move || worker.run(role));
                    if let Err(e) = spawned {
                        shared.stop.set();
                        return fail(format!("blogbench: cannot start a {}: {e}", role.name()));
                    }
                }
            }
            out.put(&format!(
                "Benchmarking for {} iterations.\nThe test will run during {} minutes.\n",
                params.iterations,
                (f64::from(params.iterations) * params.sleep_secs / 60.0).floor() as u64
            ));
            out.put(&format!("\n{COLUMN_HEADER}\n"));

            let start = Instant::now();
            let mut nb_blogs = 0u64;
            let mut io_before = env.probe.io();
            let mut errors_before = 0u64;
            let mut rows = Vec::with_capacity(params.iterations as usize);
            for k in 1..=params.iterations {
                let deadline = start + interval * k;
                loop {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    std::thread::sleep(deadline - now);
                }
                let t_end = start.elapsed().as_secs_f64();
                let counts = shared.counters.take();
                nb_blogs += counts.blogs_written;
                out.put(&row_text(nb_blogs, &counts));
                let io_now = env.probe.io();
                let errors_now = shared.errors.load(Ordering::Relaxed);
                rows.push(Interval {
                    t_end,
                    nb_blogs,
                    articles_read: counts.articles_read,
                    articles_written: counts.articles_written,
                    pictures_read: counts.pictures_read,
                    pictures_written: counts.pictures_written,
                    comments_read: counts.comments_read,
                    comments_written: counts.comments_written,
                    blogs_read: counts.blogs_read,
                    blogs_written: counts.blogs_written,
                    bytes_on_disk: env.probe.used_bytes().ok(),
                    io: io_now.since(&io_before),
                    errors: errors_now - errors_before,
                });
                io_before = io_now;
                errors_before = errors_now;
                progress.inc(1);
                progress.set_message(format!("{nb_blogs} blogs"));
            }
            // Threads finish what they are doing; the scope joins them.
            shared.stop.set();
            Ok(rows)
        })
    })?;

    // What the threads completed after the last report: counted nowhere in
    // the scores, as in the original, but kept for the record.
    let after_stop = shared.counters.take();
    let final_writes: u64 = intervals.iter().map(|r| r.blogs_written).sum();
    let final_reads: u64 = intervals.iter().map(|r| r.blogs_read).sum();
    out.put(&format!(
        "\nFinal score for writes:{final_writes:>14}\nFinal score for reads :{final_reads:>14}\n\n"
    ));

    let errors = shared.errors.load(Ordering::Relaxed);
    let first_errors = shared
        .first_errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();

    let mut metrics = vec![
        Metric::higher("final_writes", "blogs", final_writes as f64),
        Metric::higher("final_reads", "blogs", final_reads as f64),
    ];
    type Get = fn(&Interval) -> u64;
    let columns: [(&str, Get); 6] = [
        ("articles_read", |r| r.articles_read),
        ("articles_written", |r| r.articles_written),
        ("pictures_read", |r| r.pictures_read),
        ("pictures_written", |r| r.pictures_written),
        ("comments_read", |r| r.comments_read),
        ("comments_written", |r| r.comments_written),
    ];
    let mut series = Vec::new();
    for (name, get) in columns {
        let mut t_prev = 0.0;
        let mut rate_sum = 0.0;
        for r in &intervals {
            let len = (r.t_end - t_prev).max(1e-9);
            rate_sum += get(r) as f64 / len;
            t_prev = r.t_end;
        }
        metrics.push(Metric::higher(
            format!("{name}/s"),
            "files/s",
            rate_sum / intervals.len().max(1) as f64,
        ));
        series.push(Series {
            name: name.to_string(),
            x_label: "seconds".into(),
            y_label: "files per interval".into(),
            points: intervals.iter().map(|r| (r.t_end, get(r) as f64)).collect(),
        });
    }
    series.push(Series {
        name: "nb_blogs".into(),
        x_label: "seconds".into(),
        y_label: "blogs written".into(),
        points: intervals
            .iter()
            .map(|r| (r.t_end, r.nb_blogs as f64))
            .collect(),
    });
    for (name, get) in columns {
        series.push(Series {
            name: format!("{name}_vs_blogs"),
            x_label: "Nb blogs".into(),
            y_label: "files per interval".into(),
            points: intervals
                .iter()
                .map(|r| (r.nb_blogs as f64, get(r) as f64))
                .collect(),
        });
    }

    let extra = json!({
        "version": "1.1",
        "params": params,
        "seed": seed,
        "content": params.content.name(),
        "read_chunk": params.read_chunk(),
        "intervals": intervals,
        "after_stop": after_stop,
        "no_blog_pauses": shared.idle.load(Ordering::Relaxed),
        "first_errors": first_errors,
        "collisions": shared.collisions.load(Ordering::Relaxed),
        "first_collisions": shared
            .first_collisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone(),
    });

    Ok(RunOutput {
        metrics,
        phases: vec![phase],
        series,
        text: out.text,
        errors,
        extra,
        ..Default::default()
    })
}

// ---------------------------------------------------------------------------
// The standalone command.

/// `anvil bench blogbench`-style standalone run with the original's options.
#[derive(clap::Args, Clone, Debug)]
pub struct BlogbenchArgs {
    /// Scratch directory; must exist and be empty.
    #[arg(short = 'd', long = "directory", value_name = "DIR")]
    pub directory: PathBuf,
    /// Number of report intervals.
    #[arg(short = 'i', long = "iterations", default_value_t = 30)]
    pub iterations: u32,
    /// Seconds per interval.
    #[arg(short = 's', long = "sleep", default_value_t = 10.0)]
    pub sleep: f64,
    /// Reader threads.
    #[arg(short = 'r', long = "readers", default_value_t = 100)]
    pub readers: u32,
    /// Writer threads.
    #[arg(short = 'w', long = "writers", default_value_t = 3)]
    pub writers: u32,
    /// Rewriter threads.
    #[arg(short = 'W', long = "rewriters", default_value_t = 1)]
    pub rewriters: u32,
    /// Commenter threads.
    #[arg(short = 'c', long = "commenters", default_value_t = 5)]
    pub commenters: u32,
    /// File contents (the original writes zeros).
    #[arg(long, value_enum, default_value_t = Content::Zero)]
    pub content: Content,
    /// Read 8 bytes at a time, like blogbench 1.2.
    #[arg(long = "compat-1-2", visible_alias = "compat-1.2")]
    pub compat_1_2: bool,
    /// Give each reader its own read buffer (1.1 shares one between all readers).
    #[arg(long)]
    pub private_read_buffers: bool,
    /// Give each thread its own random generator (1.1 shares libc's `rand()`, and its
    /// lock, between all threads).
    #[arg(long)]
    pub private_rng: bool,
    /// PRNG seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the results as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

impl BlogbenchArgs {
    fn params(&self) -> Params {
        Params {
            iterations: self.iterations,
            sleep_secs: self.sleep,
            readers: self.readers,
            writers: self.writers,
            rewriters: self.rewriters,
            commenters: self.commenters,
            content: self.content,
            compat_1_2: self.compat_1_2,
            shared_read_buffer: !self.private_read_buffers,
            shared_rng: !self.private_rng,
            seed: self.seed,
        }
    }
}

/// A probe for a plain directory: sync, and statfs for the space used.
struct StandaloneProbe {
    dir: PathBuf,
}

impl Probe for StandaloneProbe {
    fn drop_caches(&self) -> Result<()> {
        self.sync()
    }

    fn sync(&self) -> Result<()> {
        // SAFETY: sync(2) takes no arguments.
        unsafe { libc::sync() };
        Ok(())
    }

    fn io(&self) -> IoCounters {
        IoCounters::default()
    }

    fn used_bytes(&self) -> Result<u64> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(self.dir.as_os_str().as_bytes())
            .map_err(|_| BenchError("path with a NUL byte".into()))?;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
        // SAFETY: valid path and output buffer.
        if unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) } != 0 {
            return Err(io::Error::last_os_error())
                .ctx(|| format!("statvfs {}", self.dir.display()));
        }
        // SAFETY: statvfs succeeded and filled `st`.
        let st = unsafe { st.assume_init() };
        Ok(st.f_blocks.saturating_sub(st.f_bfree) * st.f_frsize)
    }

    fn make_snapshot_root(&self, path: &str) -> Result<()> {
        let p = self.dir.join(path);
        std::fs::create_dir(&p).ctx(|| format!("mkdir {}", p.display()))
    }

    fn snapshot(&self, _path: &str, _name: &str) -> Result<bool> {
        Ok(false)
    }
}

/// Runs blogbench on `args.directory` like the original program: the text
/// report goes to stdout as it is produced, and the results to `--json`.
pub fn standalone(args: &BlogbenchArgs) -> Result<()> {
    standalone_to(args, &mut io::stdout())
}

/// [`standalone`] with the text going to `sink`.
fn standalone_to(args: &BlogbenchArgs, sink: &mut dyn io::Write) -> Result<()> {
    let params = args.params();
    params.validate()?;
    let dir = &args.directory;
    let mut entries = std::fs::read_dir(dir)
        .ctx(|| format!("blogbench: cannot use scratch dir {}", dir.display()))?;
    if entries.next().is_some() {
        return fail(format!(
            "blogbench: scratch dir {} is not empty",
            dir.display()
        ));
    }
    // Like the original, work relative to the scratch dir: chdir into it and open
    // "blog-N/..." names, so the kernel walks the same short paths.
    let dir = &std::fs::canonicalize(dir).ctx(|| format!("blogbench: {}", dir.display()))?;
    let previous = std::env::current_dir().ok();
    std::env::set_current_dir(dir).ctx(|| format!("blogbench: chdir {}", dir.display()))?;
    // Back to where we were once the run is over (tests share the process).
    struct Restore(Option<std::path::PathBuf>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(p) = self.0.take() {
                let _ = std::env::set_current_dir(p);
            }
        }
    }
    let _restore = Restore(previous);
    let vfs =
        PosixVfs::open(Path::new(".")).ctx(|| format!("blogbench: open {}", dir.display()))?;
    let probe = StandaloneProbe { dir: dir.clone() };
    let bar = ProgressBar::hidden();
    let env = RunEnv {
        dir: Some(dir.clone()),
        vfs: &vfs,
        probe: &probe,
        fs_label: "dir".into(),
        fs_type: "dir".into(),
        seed: 0,
        run: 0,
        mem_limit: None,
        progress: &bar,
    };
    let output = execute(&params, &env, &dir.display().to_string(), &mut |s| {
        let _ = sink.write_all(s.as_bytes());
        let _ = sink.flush();
    })?;
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&output)
            .map_err(|e| BenchError(format!("blogbench: encode results: {e}")))?;
        std::fs::write(path, text + "\n").ctx(|| format!("write {}", path.display()))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Harness overhead.

/// Files per second for `blogs` blogs written and read back single-threaded,
/// (a) through this workload's own writer and reader code over [`PosixVfs`]
/// and (b) through a straight loop of libc calls. Both issue the same system
/// calls with the same sizes (the same seed drives both), so the ratio shows
/// what the harness costs. Each is run five times alternately in fresh
/// subdirectories of `dir` (removed afterwards) and the best rate is kept.
pub fn overhead_pair(dir: &Path, blogs: u32) -> Result<(f64, f64)> {
    const REPS: u32 = 5;
    const SEED: u64 = 0xb109;
    let mut best = (0.0f64, 0.0f64);
    for rep in 0..REPS {
        for raw in [false, true] {
            let sub = dir.join(format!(
                "blogbench-overhead-{}-{rep}",
                if raw { "raw" } else { "harness" }
            ));
            std::fs::create_dir(&sub).ctx(|| format!("mkdir {}", sub.display()))?;
            let result = if raw {
                raw_pass(&sub, blogs, SEED)
            } else {
                harness_pass(&sub, blogs, SEED)
            };
            std::fs::remove_dir_all(&sub).ctx(|| format!("remove {}", sub.display()))?;
            let (files, secs) = result?;
            let rate = files as f64 / secs.max(1e-9);
            if raw {
                best.1 = best.1.max(rate);
            } else {
                best.0 = best.0.max(rate);
            }
        }
    }
    Ok(best)
}

/// The workload's code path: `Worker::create_blog` then `read_articles`.
fn harness_pass(dir: &Path, blogs: u32, seed: u64) -> Result<(u64, f64)> {
    let vfs = PosixVfs::open(dir).ctx(|| format!("open {}", dir.display()))?;
    let shared = Shared::new(&vfs, Content::Zero, READ_CHUNK);
    let mut writer = Worker::new(&shared, Role::Writer, seed);
    let mut reader = Worker::new(&shared, Role::Reader, seed);
    let t0 = Instant::now();
    for _ in 0..blogs {
        if let Err(Failure::Io(msg)) = writer.create_blog() {
            return fail(format!("blogbench overhead: {msg}"));
        }
    }
    for blog in 0..u64::from(blogs) {
        reader.read_articles(blog);
    }
    let secs = t0.elapsed().as_secs_f64();
    let c = shared.counters.take();
    if let Some(msg) = shared
        .first_errors
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .first()
    {
        return fail(format!("blogbench overhead: {msg}"));
    }
    let files = c.articles_written + c.pictures_written + c.articles_read + c.pictures_read;
    Ok((files, secs))
}

/// The same operations as [`harness_pass`] as a plain loop of libc calls
/// (openat/write/close/renameat, openat/read/close, mkdirat) on the same full
/// paths that [`PosixVfs`] uses, with the same flags and sizes.
fn raw_pass(dir: &Path, blogs: u32, seed: u64) -> Result<(u64, f64)> {
    use std::os::unix::ffi::OsStrExt;
    fn os_err(what: &str) -> BenchError {
        BenchError(format!(
            "blogbench overhead (raw): {what}: {}",
            io::Error::last_os_error()
        ))
    }
    /// Puts `{dir}/blog-{blog}/{prefix}{n}{suffix}` plus an optional ".tmp"
    /// and a NUL into `buf`.
    fn path(buf: &mut Vec<u8>, dir: &[u8], blog: u64, kind: Kind, n: u32, tmp: bool) {
        buf.clear();
        buf.extend_from_slice(dir);
        let _ = write!(buf, "blog-{blog}/{}{n}{}", kind.prefix(), kind.suffix());
        if tmp {
            buf.extend_from_slice(TMP_SUFFIX.as_bytes());
        }
        buf.push(0);
    }

    let mut prefix = dir.as_os_str().as_bytes().to_vec();
    if prefix.last() != Some(&b'/') {
        prefix.push(b'/');
    }
    let root = libc::AT_FDCWD;
    let mut rng = StdRng::seed_from_u64(seed);
    let zeros = [0u8; WRITE_CHUNK];
    let mut rbuf = vec![0u8; READ_CHUNK];
    let mut name = Vec::with_capacity(64);
    let mut tmp = Vec::with_capacity(64);
    let mut files = 0u64;
    let t0 = Instant::now();
    let result = (|| -> Result<()> {
        for blog in 0..u64::from(blogs) {
            name.clear();
            name.extend_from_slice(&prefix);
            let _ = write!(name, "blog-{blog}\0");
            // SAFETY: valid fd and NUL-terminated path.
            if unsafe { libc::mkdirat(root, name.as_ptr().cast(), DIR_MODE as libc::mode_t) } != 0 {
                return Err(os_err("mkdirat"));
            }
            for kind in [Kind::Article, Kind::Picture] {
                let count = count_per_blog(&mut rng);
                for n in (1..=count).rev() {
                    path(&mut name, &prefix, blog, kind, n, false);
                    path(&mut tmp, &prefix, blog, kind, n, true);
                    let mut left = file_size(kind, &mut rng) as usize;
                    // SAFETY: valid fd and NUL-terminated path.
                    let fd = unsafe {
                        libc::openat(
                            root,
                            tmp.as_ptr().cast(),
                            libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY | libc::O_CLOEXEC,
                            FILE_MODE as libc::c_uint,
                        )
                    };
                    if fd < 0 {
                        return Err(os_err("openat for writing"));
                    }
                    while left > 0 {
                        let n = left.min(WRITE_CHUNK);
                        // SAFETY: `zeros` holds at least `n` bytes.
                        let w = unsafe { libc::write(fd, zeros.as_ptr().cast(), n) };
                        if w <= 0 {
                            return Err(os_err("write"));
                        }
                        left -= w as usize;
                    }
                    // SAFETY: `fd` is open and ours.
                    unsafe { libc::close(fd) };
                    // SAFETY: valid fd and NUL-terminated paths.
                    if unsafe {
                        libc::renameat(root, tmp.as_ptr().cast(), root, name.as_ptr().cast())
                    } != 0
                    {
                        return Err(os_err("renameat"));
                    }
                    files += 1;
                }
            }
        }
        // Reads in the reader's order: picture n if present, article n, stop
        // at the first missing article.
        for blog in 0..u64::from(blogs) {
            for n in 1.. {
                let mut article_found = false;
                for kind in [Kind::Picture, Kind::Article] {
                    path(&mut name, &prefix, blog, kind, n, false);
                    // SAFETY: valid fd and NUL-terminated path.
                    let fd = unsafe {
                        libc::openat(root, name.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC)
                    };
                    if fd < 0 {
                        continue;
                    }
                    loop {
                        // SAFETY: `rbuf` is valid for its length.
                        let r = unsafe { libc::read(fd, rbuf.as_mut_ptr().cast(), rbuf.len()) };
                        if r <= 0 {
                            break;
                        }
                    }
                    // SAFETY: `fd` is open and ours.
                    unsafe { libc::close(fd) };
                    files += 1;
                    article_found = kind == Kind::Article;
                }
                if !article_found {
                    break;
                }
            }
        }
        Ok(())
    })();
    let secs = t0.elapsed().as_secs_f64();
    result.map(|()| (files, secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::with_env;
    use clap::Parser;

    /// Tests that run threads of writers are run one at a time, so that a
    /// tiny run is not starved of CPU and disk by another one.
    static IO_TESTS: Mutex<()> = Mutex::new(());

    fn io_lock() -> std::sync::MutexGuard<'static, ()> {
        IO_TESTS.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A scratch directory, in memory when /dev/shm exists (the tests check
    /// shapes, not speeds, and a busy disk should not starve them).
    fn scratch() -> tempfile::TempDir {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            if let Ok(d) = tempfile::TempDir::new_in(shm) {
                return d;
            }
        }
        tempfile::TempDir::new().unwrap()
    }

    fn tiny() -> Params {
        Params::for_tier(Tier::Tiny)
    }

    fn run_params(dir: &Path, params: &Params) -> RunOutput {
        with_env(dir, |env| {
            execute(params, env, &dir.display().to_string(), &mut |_| {}).expect("run")
        })
    }

    fn numbers(line: &str) -> Vec<u64> {
        line.split_whitespace()
            .map(|w| w.parse().expect("numeric column"))
            .collect()
    }

    fn final_score(text: &str, prefix: &str) -> u64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no '{prefix}' line in\n{text}"));
        line[prefix.len()..].trim().parse().expect("score")
    }

    #[test]
    fn blogbench_tiny_run_has_the_original_shape_and_files() {
        let _io = io_lock();
        let tmp = scratch();
        let w = workload(Tier::Tiny, &[]).unwrap();
        assert!(w.lib_capable());
        let out = with_env(tmp.path(), |env| w.run(env)).expect("run");
        let text = &out.text;

        // Header, in the original's order.
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "");
        assert_eq!(lines[1], "Frequency = 0.5 secs");
        assert_eq!(
            lines[2],
            format!("Scratch dir = [{}]", tmp.path().display())
        );
        assert_eq!(lines[3], "Spawning 1 writers...");
        assert_eq!(lines[4], "Spawning 1 rewriters...");
        assert_eq!(lines[5], "Spawning 1 commenters...");
        assert_eq!(lines[6], "Spawning 2 readers...");
        assert_eq!(lines[7], "Benchmarking for 2 iterations.");
        assert_eq!(lines[8], "The test will run during 0 minutes.");
        assert_eq!(lines[9], "");
        assert_eq!(lines[10], COLUMN_HEADER);
        // One row per iteration, 7 numeric columns, laid out like %10llu %12llu ...
        let rows = &lines[11..13];
        let mut prev_blogs = 0;
        for row in rows {
            let cols = numbers(row);
            assert_eq!(cols.len(), 7, "{row}");
            assert!(row.len() >= 10 + 13 + 5 * 14, "{row}");
            assert!(cols[0] >= prev_blogs);
            prev_blogs = cols[0];
        }
        assert_eq!(lines[13], "");
        assert!(text.ends_with("\n\n"));
        let writes = final_score(text, "Final score for writes:");
        let reads = final_score(text, "Final score for reads :");
        assert_eq!(writes, prev_blogs);

        let metric = |n: &str| out.metrics.iter().find(|m| m.name == n).unwrap().value;
        assert_eq!(metric("final_writes"), writes as f64);
        assert_eq!(metric("final_reads"), reads as f64);
        assert!(writes > 0, "{text}");
        assert_eq!(out.errors, 0, "{:?}", out.extra["first_errors"]);
        assert_eq!(out.phases.len(), 1);
        assert_eq!(out.phases[0].name, "run");
        assert_eq!(out.extra["intervals"].as_array().unwrap().len(), 2);
        let names: Vec<&str> = out.series.iter().map(|s| s.name.as_str()).collect();
        for n in ["articles_read", "nb_blogs", "comments_written_vs_blogs"] {
            assert!(names.contains(&n), "{names:?}");
        }
        assert_eq!(out.series.len(), 13);

        // Every blog that was reported complete is on disk, sizes in range,
        // and no temporary file is left behind.
        let mut blogs = 0;
        for entry in std::fs::read_dir(tmp.path()).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            assert!(name.starts_with("blog-"), "{name}");
            blogs += 1;
            for f in std::fs::read_dir(entry.path()).unwrap() {
                let f = f.unwrap();
                let fname = f.file_name().into_string().unwrap();
                assert!(!fname.ends_with(TMP_SUFFIX), "left over: {name}/{fname}");
                let size = f.metadata().unwrap().len();
                let kind = [Kind::Article, Kind::Picture, Kind::Comment]
                    .into_iter()
                    .find(|k| fname.starts_with(k.prefix()) && fname.ends_with(k.suffix()))
                    .unwrap_or_else(|| panic!("unexpected file {name}/{fname}"));
                let (min, max) = kind.size_range();
                assert!((min..max).contains(&size), "{name}/{fname}: {size}");
            }
        }
        assert!(blogs as u64 >= writes);
        let blog0: Vec<_> = std::fs::read_dir(tmp.path().join("blog-0"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(blog0.contains(&"article-1.xml".to_string()));
        assert!(blog0.contains(&"picture-1.jpg".to_string()));
    }

    #[test]
    fn blogbench_random_content_and_compat_reads() {
        let _io = io_lock();
        let tmp = scratch();
        let params = Params {
            iterations: 1,
            sleep_secs: 0.3,
            content: Content::Random,
            compat_1_2: true,
            // The defaults (shared generator and buffer) run in the tiny-run test.
            shared_rng: false,
            shared_read_buffer: false,
            seed: 42,
            ..tiny()
        };
        let out = run_params(tmp.path(), &params);
        assert_eq!(out.errors, 0, "{:?}", out.extra["first_errors"]);
        assert_eq!(out.extra["content"], "random");
        assert_eq!(out.extra["read_chunk"], 8);
        assert_eq!(out.extra["seed"], 42);
        let data = std::fs::read(tmp.path().join("blog-0/article-1.xml")).unwrap();
        let zeros = data.iter().filter(|&&b| b == 0).count();
        assert!(zeros < data.len() / 50, "{zeros} zeros of {}", data.len());
    }

    #[test]
    fn blogbench_text_content_is_text() {
        let mut rng = StdRng::seed_from_u64(3);
        let source = Source::new(Content::Text, &mut rng);
        let start = source.start(&mut rng);
        let chunk = source.chunk(start, 0, 4096).to_vec();
        let s = std::str::from_utf8(&chunk).unwrap();
        assert!(s.contains(' ') && s.contains('.'), "{s}");
        assert!(s
            .bytes()
            .all(|b| b.is_ascii_graphic() || b == b' ' || b == b'\n'));
        if let Source::Pool(p) = &source {
            assert_eq!(p.len(), POOL_BYTES);
        }
    }

    #[test]
    fn blogbench_random_blog_id_never_picks_the_newest() {
        let mut rng = StdRng::seed_from_u64(7);
        assert_eq!(random_blog_id(0, &mut rng), 0);
        assert_eq!(random_blog_id(1, &mut rng), 0);
        for next in 2..40u64 {
            let mut seen = vec![false; next as usize];
            for _ in 0..2000 {
                let id = random_blog_id(next, &mut rng);
                assert!(id < next - 1, "next {next} gave {id}");
                seen[id as usize] = true;
            }
            // All the older blogs come up.
            assert!(seen[..next as usize - 1].iter().all(|&s| s), "next {next}");
        }
    }

    #[test]
    fn blogbench_sizes_follow_the_formula() {
        let mut rng = StdRng::seed_from_u64(9);
        for kind in [Kind::Article, Kind::Picture, Kind::Comment] {
            let (min, max) = kind.size_range();
            for _ in 0..1000 {
                assert!((min..max).contains(&file_size(kind, &mut rng)));
                assert!((1..=100).contains(&count_per_blog(&mut rng)));
            }
        }
    }

    #[test]
    fn blogbench_tier_defaults_and_overrides() {
        let p = Params::for_tier(Tier::Full);
        assert_eq!(
            (
                p.iterations,
                p.sleep_secs,
                p.readers,
                p.writers,
                p.rewriters,
                p.commenters
            ),
            (30, 10.0, 100, 3, 1, 5)
        );
        assert_eq!(p.content, Content::Zero);
        let q = Params::for_tier(Tier::Quick);
        assert_eq!(
            (q.iterations, q.sleep_secs, q.readers, q.writers),
            (3, 2.0, 10, 3)
        );
        let s = Params::for_tier(Tier::Standard);
        assert_eq!((s.iterations, s.sleep_secs, s.readers), (12, 5.0, 100));

        let ov = vec![
            ("iterations".to_string(), "100".to_string()),
            ("readers".to_string(), "7".to_string()),
            ("content".to_string(), "text".to_string()),
            ("compat-1-2".to_string(), "true".to_string()),
            ("sleep_secs".to_string(), "0.25".to_string()),
        ];
        let w = workload(Tier::Standard, &ov).unwrap();
        let v = w.params();
        assert_eq!(v["iterations"], 100);
        assert_eq!(v["readers"], 7);
        assert_eq!(v["content"], "text");
        assert_eq!(v["compat_1_2"], true);
        assert_eq!(v["sleep_secs"], 0.25);
        assert_eq!(v["writers"], 3);

        let err = |k: &str, v: &str| {
            workload(Tier::Tiny, &[(k.to_string(), v.to_string())])
                .err()
                .expect("should fail")
                .to_string()
        };
        assert!(err("nope", "1").contains("unknown parameter"));
        assert!(err("content", "lz4").contains("bad parameter value"));
        assert!(err("iterations", "0").contains("iterations"));
        assert!(err("sleep_secs", "0").contains("sleep_secs"));
    }

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: BlogbenchArgs,
    }

    #[test]
    fn blogbench_standalone_options_and_empty_dir_check() {
        let cmd = Cmd::try_parse_from(["x", "-d", "/nonexistent"]).unwrap();
        assert_eq!(cmd.args.params(), Params::for_tier(Tier::Full));
        let cmd = Cmd::try_parse_from([
            "x",
            "-d",
            "/d",
            "-i",
            "2",
            "-s",
            "0.5",
            "-r",
            "4",
            "-w",
            "2",
            "-W",
            "3",
            "-c",
            "1",
            "--content",
            "random",
            "--compat-1.2",
            "--seed",
            "5",
            "--private-rng",
            "--private-read-buffers",
            "--json",
            "/o.json",
        ])
        .unwrap();
        let p = cmd.args.params();
        assert_eq!((p.iterations, p.sleep_secs, p.readers), (2, 0.5, 4));
        assert_eq!((p.writers, p.rewriters, p.commenters), (2, 3, 1));
        assert_eq!(
            (p.content, p.compat_1_2, p.seed),
            (Content::Random, true, 5)
        );
        assert!(!p.shared_rng && !p.shared_read_buffer);
        assert_eq!(cmd.args.json.as_deref(), Some(Path::new("/o.json")));

        let tmp = tempfile::TempDir::new().unwrap();
        std::fs::write(tmp.path().join("x"), b"").unwrap();
        let args = BlogbenchArgs {
            directory: tmp.path().to_path_buf(),
            ..cmd.args
        };
        let err = standalone(&args).unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
    }

    #[test]
    fn blogbench_standalone_prints_progressively_and_writes_json() {
        let _io = io_lock();
        let tmp = scratch();
        let dir = tmp.path().join("scratch");
        std::fs::create_dir(&dir).unwrap();
        let json = tmp.path().join("out.json");
        let cmd = Cmd::try_parse_from([
            "x",
            "-d",
            dir.to_str().unwrap(),
            "-i",
            "1",
            "-s",
            "0.3",
            "-r",
            "1",
            "-c",
            "1",
            "-w",
            "1",
            "--json",
            json.to_str().unwrap(),
        ])
        .unwrap();
        let mut printed = Vec::new();
        standalone_to(&cmd.args, &mut printed).unwrap();
        let printed = String::from_utf8(printed).unwrap();
        assert!(printed.starts_with("\nFrequency = 0.3 secs\n"), "{printed}");
        assert!(printed.contains("Final score for reads :"), "{printed}");
        let out: RunOutput =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(out.text, printed);
        assert_eq!(out.extra["intervals"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn blogbench_overhead_pair_runs() {
        let _io = io_lock();
        let tmp = scratch();
        let (harness, raw) = overhead_pair(tmp.path(), 2).unwrap();
        assert!(harness > 0.0 && raw > 0.0);
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn blogbench_both_overhead_paths_touch_the_same_files() {
        let _io = io_lock();
        let a = scratch();
        let b = scratch();
        let (fa, _) = harness_pass(a.path(), 3, 11).unwrap();
        let (fb, _) = raw_pass(b.path(), 3, 11).unwrap();
        assert_eq!(fa, fb);
        let listing = |d: &Path| {
            let mut v = Vec::new();
            for blog in std::fs::read_dir(d).unwrap() {
                let blog = blog.unwrap();
                for f in std::fs::read_dir(blog.path()).unwrap() {
                    let f = f.unwrap();
                    v.push((
                        format!("{:?}/{:?}", blog.file_name(), f.file_name()),
                        f.metadata().unwrap().len(),
                    ));
                }
            }
            v.sort();
            v
        };
        assert_eq!(listing(a.path()), listing(b.path()));
    }
}
