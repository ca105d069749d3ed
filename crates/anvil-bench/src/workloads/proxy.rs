//! `proxy-cache`: a web-proxy cache replayed against the file system, after
//! the comparison in Shriver, Gabber, Huang and Stein, "Storage Management for
//! Web Proxies" (USENIX 2001), where Hummingbird was measured against UFS,
//! EFS and XFS driven by *wg-Squid*, a generator that behaves towards the file
//! system the way Squid-2.2 does.
//!
//! A run has three parts:
//!
//! 1. **Trace** (untimed). Either a synthetic one (`trace=synth`, the
//!    default), or a native Squid `access.log` (`trace=<path>` or
//!    `trace=squid:<path>`). The synthetic generator is seeded and
//!    deterministic: clients browse pages whose popularity follows a Zipf law;
//!    a page is one HTML object followed by a locality set of embedded objects
//!    (a geometric number of them), some of which drift to new objects each
//!    time the page is visited again; some embedded objects come from a pool
//!    shared by all pages (logos, buttons); some page views are to pages never
//!    seen again (one-timers); HTML and other sizes are lognormal, the others
//!    with a Pareto tail. The per-client streams are interleaved request by
//!    request, as a proxy sees them.
//! 2. **Setup** (untimed). The cache directory tree `cache/XX/YY` (L1 × L2
//!    directories) is made once, as Squid does when it starts, then synced.
//! 3. **Replay** (timed), back to back without pauses, one thread:
//!    * a hit in the in-memory "Squid memory cache" (LRU, `mem_cache_bytes`)
//!      touches no file;
//!    * a disk hit opens, reads (`io_chunk` at a time) and closes the
//!      object's file: the *FS read time*;
//!    * a miss creates, writes and closes a new file named by the next file
//!      number, `cache/%02X/%02X/%08X` with Squid's formula: the *FS write
//!      time*. Objects over `max_cached_object` are not cached. When the
//!      disk cache would go over its high-water mark, least recently used
//!      objects are unlinked until it is under the low-water mark (timed
//!      apart, `fs_unlink_ms`, and part of the run time). Sizes are charged
//!      in whole `block_bytes`, as Squid does.
//!
//! The metrics are the columns of the paper's tables: proxy hit rate, FS read
//! and write times, disk I/Os and their mean time (device counters over the
//! replay plus a final sync, so write-back left in memory is counted too),
//! run time, and throughput in requests per second.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use rand_distr::{Distribution, Geometric, LogNormal, Pareto, Zipf};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::env::{IoCounters, Metric, RunEnv, RunOutput, Series};
use crate::error::{fail, BenchError, Context, Result};
use crate::vfs::Vfs;
use crate::workloads::{apply_overrides, Overrides, Tier, Workload};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
/// Points of the series and steps of the progress bar over a replay.
const STEPS: u64 = 100;
/// Root of the cache tree, below the workload directory.
const CACHE_DIR: &str = "cache";

/// Parameters of the workload, as recorded in the results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// "synth", or the path of a native Squid access.log ("squid:" prefix
    /// optional).
    pub trace: String,
    /// Length of a synthetic trace; for a log, the most requests replayed
    /// (0 = all of them).
    pub requests: u64,
    /// Synthetic: browsing clients whose streams are interleaved.
    pub clients: u32,
    /// Synthetic: distinct (re-visitable) pages.
    pub pages: u64,
    /// Synthetic: Zipf exponent of page popularity (and of the shared pool).
    pub zipf_alpha: f64,
    /// Synthetic: mean number of embedded objects per page (geometric).
    pub embedded_mean: f64,
    /// Synthetic: chance that an embedded (non-shared) object of a page is
    /// replaced by a new one when the page is visited again.
    pub drift: f64,
    /// Synthetic: objects in the shared-image pool.
    pub shared_images: u64,
    /// Synthetic: share of embedded objects taken from the shared pool.
    pub shared_share: f64,
    /// Synthetic: share of page views to pages never visited again.
    pub one_timer_pages: f64,
    /// Synthetic: median HTML size, bytes.
    pub html_median: u64,
    /// Synthetic: sigma of the HTML size lognormal.
    pub html_sigma: f64,
    /// Synthetic: median size of other objects, bytes.
    pub object_median: u64,
    /// Synthetic: sigma of the other objects' size lognormal.
    pub object_sigma: f64,
    /// Synthetic: share of non-HTML objects whose size comes from the Pareto
    /// tail instead.
    pub tail_share: f64,
    /// Synthetic: smallest size of the Pareto tail, bytes.
    pub tail_min: u64,
    /// Synthetic: shape of the Pareto tail.
    pub pareto_alpha: f64,
    /// Synthetic: largest object, bytes.
    pub max_object: u64,
    /// Disk cache capacity, bytes.
    pub cache_bytes: u64,
    /// In-memory Squid cache, bytes (0 = none).
    pub mem_cache_bytes: u64,
    /// Larger objects are not cached (0 = no limit); 64 KiB as in the
    /// paper's Table 2.
    pub max_cached_object: u64,
    /// Eviction starts above this fraction of `cache_bytes` ...
    pub high_water: f64,
    /// ... and goes on until this fraction.
    pub low_water: f64,
    /// Object sizes are charged in whole blocks of this size.
    pub block_bytes: u64,
    /// First-level cache directories.
    pub l1: u32,
    /// Second-level cache directories per first-level one.
    pub l2: u32,
    /// Bytes per read() and write() call (Squid-2.2 used 4 KiB pages).
    pub io_chunk: u64,
    /// Seed of the synthetic trace and of file contents (0 = the run's seed).
    pub seed: u64,
    /// One of Hummingbird's Table 2 configurations ("4g-256m", "4g-1g", "8g-256m",
    /// "8g-1g"; empty: none): sets the disk cache, the memory split (half to the proxy's
    /// memory cache, as the paper did), the 64 KiB object limit and a trace long enough
    /// to be disk-bound. The run must have the configuration's memory as --mem-limit.
    pub config: String,
    /// Scales a configuration's disk cache and trace length (not its memory), for a
    /// shorter run of the same regime; 1 = the paper's sizes.
    pub scale: f64,
    /// Whether anvil keeps history of the cache directory. A proxy's cache is the
    /// textbook case for `anvil nohistory` (evicted objects are never wanted again, and
    /// with history their space never returns); the configurations turn it off, the
    /// tiers keep the volume's default so their figures stay comparable.
    pub cache_history: bool,
    /// wg-Hummingbird's locality hints: each non-HTML object a client fetches is created
    /// with a hint naming the client's latest HTML page (`collocate_files`). Only anvil
    /// takes hints (anvil-lib through the library, a mount through the
    /// `trusted.anvil.near` attribute, one setxattr after the create); other targets
    /// create the file as usual.
    pub hints: bool,
    /// With `hints`, also name the page of every image served from disk, as wg-Hummingbird
    /// called `collocate_files` on hits too: anvil then moves a page's files read apart
    /// into one set at its next commit (design.md, "Packing late"). Off by default: on
    /// `config=8g-256m` it cut reads by 8% but wrote 45% more bytes, and the run was
    /// slower (docs/benchmarks.md, fourteenth session).
    #[serde(default)]
    pub collocate_hits: bool,
    /// With `hints`, name the page of every image served from disk as the page it was
    /// read with: when anvil's next commit writes or moves that page anyway, it stores a
    /// copy of the image in the page's set, and the image stays where it is (design.md,
    /// "Copies in other sets"). A shared image, stored with the first page that wrote it,
    /// then comes with each page that embeds it.
    #[serde(default)]
    pub copy_hits: bool,
    /// Hummingbird's division of labour: on anvil targets the cache directory is an anvil
    /// cache (`anvil evict`), the proxy never deletes for space, and anvil drops the least
    /// recently used clusters when the volume runs low (a file gone is a miss, fetched
    /// again). The disk cache is then the volume (`--size`), not `cache_bytes`. Other
    /// targets run as usual, the proxy evicting.
    #[serde(default)]
    pub fs_evicts: bool,
}

/// Hummingbird's Table 2: (name, disk cache bytes, memory bytes).
pub const HUMMINGBIRD_CONFIGS: [(&str, u64, u64); 4] = [
    ("4g-256m", 4096 * MIB, 256 * MIB),
    ("4g-1g", 4096 * MIB, 1024 * MIB),
    ("8g-256m", 8192 * MIB, 256 * MIB),
    ("8g-1g", 8192 * MIB, 1024 * MIB),
];

/// The paper's trace: 4.8 million requests for 14.3 GB of unique objects.
const HUMMINGBIRD_REQUESTS: f64 = 4_800_000.0;
/// Pages of the synthetic trace per request, for about three unique bytes per byte of a
/// 4 GB cache (as the paper's 14.3 GB were).
const HUMMINGBIRD_PAGES_PER_REQUEST: f64 = 0.2;

impl Params {
    /// The configuration's memory, if one is chosen.
    fn config_memory(&self) -> Result<Option<u64>> {
        if self.config.is_empty() {
            return Ok(None);
        }
        match HUMMINGBIRD_CONFIGS.iter().find(|c| c.0 == self.config) {
            Some(&(_, _, memory)) => Ok(Some(memory)),
            None => fail(format!(
                "unknown config '{}' (known: {})",
                self.config,
                HUMMINGBIRD_CONFIGS.map(|c| c.0).join(", ")
            )),
        }
    }

    /// Sets the fields a configuration names.
    fn apply_config(&mut self) -> Result<()> {
        let Some(memory) = self.config_memory()? else {
            return Ok(());
        };
        if !(self.scale > 0.0 && self.scale <= 4.0) {
            return fail("scale must be in (0, 4]");
        }
        let disk = HUMMINGBIRD_CONFIGS
            .iter()
            .find(|c| c.0 == self.config)
            .map_or(0, |c| c.1);
        self.cache_bytes = (disk as f64 * self.scale) as u64;
        self.mem_cache_bytes = memory / 2;
        self.max_cached_object = 64 * KIB;
        self.requests = (HUMMINGBIRD_REQUESTS * self.scale) as u64;
        self.pages = (self.requests as f64 * HUMMINGBIRD_PAGES_PER_REQUEST) as u64;
        self.shared_images = (self.pages / 20).max(50);
        self.clients = 200;
        self.cache_history = false;
        Ok(())
    }
}

impl Params {
    pub fn for_tier(tier: Tier) -> Params {
        // (requests, clients, pages, cache, memory)
        let (requests, clients, pages, cache_bytes, mem_cache_bytes) = match tier {
            Tier::Tiny => (2_000, 20, 400, 2560 * KIB, 160 * KIB),
            Tier::Quick => (20_000, 100, 4_000, 24 * MIB, 1536 * KIB),
            Tier::Standard => (150_000, 200, 30_000, 192 * MIB, 12 * MIB),
            Tier::Full => (1_000_000, 200, 200_000, 1280 * MIB, 128 * MIB),
        };
        Params {
            trace: "synth".into(),
            requests,
            clients,
            pages,
            zipf_alpha: 0.75,
            embedded_mean: 6.0,
            drift: 0.1,
            shared_images: (pages / 20).max(50),
            shared_share: 0.25,
            one_timer_pages: 0.05,
            html_median: 6 * KIB,
            html_sigma: 0.7,
            object_median: 4 * KIB,
            object_sigma: 0.6,
            tail_share: 0.008,
            tail_min: 16 * KIB,
            pareto_alpha: 1.1,
            max_object: MIB,
            cache_bytes,
            mem_cache_bytes,
            max_cached_object: 64 * KIB,
            high_water: 0.95,
            low_water: 0.90,
            block_bytes: 4096,
            // Squid's defaults; a smaller tree for the tiny tier, whose run
            // would otherwise be mostly mkdir.
            l1: if tier == Tier::Tiny { 4 } else { 16 },
            l2: if tier == Tier::Tiny { 16 } else { 256 },
            io_chunk: 64 * KIB,
            seed: 0,
            config: String::new(),
            scale: 1.0,
            cache_history: true,
            hints: true,
            collocate_hits: false,
            copy_hits: false,
            fs_evicts: false,
        }
    }

    fn check(&self) -> Result<()> {
        if self.cache_bytes == 0 {
            return fail("cache_bytes must be > 0");
        }
        if !(0.0 < self.low_water && self.low_water <= self.high_water && self.high_water <= 1.0) {
            return fail("need 0 < low_water <= high_water <= 1");
        }
        if self.l1 == 0 || self.l2 == 0 || self.l1 > 256 || self.l2 > 256 {
            return fail("l1 and l2 must be 1..=256");
        }
        if self.block_bytes == 0 || self.io_chunk == 0 || self.io_chunk > 64 * MIB {
            return fail("block_bytes must be > 0 and io_chunk 1..=64 MiB");
        }
        if let Some(path) = self.log_path() {
            if !Path::new(path).is_file() {
                return fail(format!("trace {path}: no such file"));
            }
            return Ok(());
        }
        if self.requests == 0 || self.clients == 0 || self.pages == 0 {
            return fail("a synthetic trace needs requests, clients and pages > 0");
        }
        let finite_non_negative = |x: f64| x.is_finite() && x >= 0.0;
        if !finite_non_negative(self.zipf_alpha) || !finite_non_negative(self.embedded_mean) {
            return fail("zipf_alpha and embedded_mean must be >= 0");
        }
        for (name, v) in [
            ("drift", self.drift),
            ("shared_share", self.shared_share),
            ("one_timer_pages", self.one_timer_pages),
            ("tail_share", self.tail_share),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return fail(format!("{name} must be in 0..=1"));
            }
        }
        if self.html_median == 0 || self.object_median == 0 || self.tail_min == 0 {
            return fail("html_median, object_median and tail_min must be > 0");
        }
        if !(self.html_sigma >= 0.0 && self.object_sigma >= 0.0 && self.pareto_alpha > 0.0) {
            return fail("sigmas must be >= 0 and pareto_alpha > 0");
        }
        if self.max_object == 0 || self.max_object > u64::from(u32::MAX) {
            return fail("max_object must be 1..4 GiB");
        }
        Ok(())
    }

    /// The access.log to replay, or None for a synthetic trace.
    fn log_path(&self) -> Option<&str> {
        match self.trace.as_str() {
            "synth" | "" => None,
            t => Some(t.strip_prefix("squid:").unwrap_or(t)),
        }
    }
}

/// Builds the workload from the tier's defaults and `key=value` overrides.
pub fn workload(tier: Tier, overrides: &Overrides) -> Result<Box<dyn Workload>> {
    let mut params = apply_overrides(Params::for_tier(tier), overrides)?;
    if !params.config.is_empty() {
        // The configuration's values, then what the command line set beside it.
        params.apply_config()?;
        params = apply_overrides(params, overrides)?;
    }
    params.check()?;
    Ok(Box::new(ProxyCache { params }))
}

/// The proxy-cache replay with fixed parameters.
pub struct ProxyCache {
    params: Params,
}

impl Workload for ProxyCache {
    fn name(&self) -> &'static str {
        "proxy-cache"
    }

    fn params(&self) -> serde_json::Value {
        serde_json::to_value(&self.params).unwrap_or_default()
    }

    fn lib_capable(&self) -> bool {
        true
    }

    fn min_fs_bytes(&self) -> Option<u64> {
        let p = &self.params;
        // The cache with slack for metadata and the directory tree (a block
        // or so per directory).
        let dirs = u64::from(p.l1) * (1 + u64::from(p.l2)) + 1;
        // With `fs_evicts` the volume is the cache, whatever its size (run the targets
        // whose proxy evicts separately, on devices that hold `cache_bytes`).
        let cache = if p.fs_evicts {
            32 * MIB
        } else {
            p.cache_bytes / 10 * 13
        };
        Some(cache + dirs * 4096 + 16 * MIB)
    }

    fn anvil_daemon_cache(&self, mem_limit: u64, default: u64) -> Option<u64> {
        Some(daemon_cache(&self.params, mem_limit, default))
    }

    fn run(&self, env: &RunEnv) -> Result<RunOutput> {
        run(&self.params, env)
    }
}

/// anvil's daemon cache under `mem_limit`: three eighths of what the proxy's own memory
/// cache leaves, at least 16 MiB and no more than the bench's `default` (a quarter of the
/// limit, at most 256 MiB). The daemon
/// holds about 1.35 times its cache (its crash log ring, the data waiting for a commit, the
/// ring buffers), and the kernel's dentries, inodes and pages of the mount's files need
/// the rest. Hummingbird's configurations give the proxy half the memory: at 8g-256m that is
/// 48 MiB, where 64 MiB got the daemon killed by the OOM killer in 1-3 runs of 9 and ran no
/// faster (docs/benchmarks.md, thirty-ninth session).
fn daemon_cache(p: &Params, mem_limit: u64, default: u64) -> u64 {
    let left = mem_limit.saturating_sub(p.mem_cache_bytes);
    (left / 8 * 3).max(16 * MIB).min(default)
}

// ---------------------------------------------------------------------------
// Traces

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Dense object id (0..objects).
    pub object: u32,
    /// Size in bytes (> 0).
    pub size: u32,
    /// Dense client id.
    pub client: u32,
    /// Whether the object is an HTML page (for a log: its type or URL says so).
    pub html: bool,
}

/// A trace held in memory.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub requests: Vec<Request>,
    /// Number of distinct object ids; every id below it is requested.
    pub objects: u32,
}

/// What a trace looks like, for the results.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TraceSummary {
    pub requests: u64,
    pub unique_objects: u64,
    /// Sum of object sizes, each object counted once at its first size.
    pub unique_bytes: u64,
    pub requested_bytes: u64,
    pub mean_request_bytes: f64,
    /// Share of distinct objects requested exactly once.
    pub one_timer_fraction: f64,
    /// Share of requests that go to the most requested 10% of objects.
    pub top10_request_share: f64,
    /// Share of requests small enough to be cached.
    pub cacheable_request_share: f64,
    /// Share of requests for HTML objects.
    pub html_request_share: f64,
}

impl Trace {
    pub fn summary(&self, max_cached_object: u64) -> TraceSummary {
        let n = self.requests.len() as u64;
        let mut counts = vec![0u32; self.objects as usize];
        let mut unique_bytes = 0u64;
        let mut requested_bytes = 0u64;
        let mut cacheable = 0u64;
        let mut html = 0u64;
        for r in &self.requests {
            let c = &mut counts[r.object as usize];
            if *c == 0 {
                unique_bytes += u64::from(r.size);
            }
            *c += 1;
            requested_bytes += u64::from(r.size);
            if max_cached_object == 0 || u64::from(r.size) <= max_cached_object {
                cacheable += 1;
            }
            html += u64::from(r.html);
        }
        let unique = counts.iter().filter(|&&c| c > 0).count() as u64;
        let once = counts.iter().filter(|&&c| c == 1).count() as u64;
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let top = counts.len().div_ceil(10);
        let top_requests: u64 = counts[..top].iter().map(|&c| u64::from(c)).sum();
        let share = |x: u64, of: u64| if of == 0 { 0.0 } else { x as f64 / of as f64 };
        TraceSummary {
            requests: n,
            unique_objects: unique,
            unique_bytes,
            requested_bytes,
            mean_request_bytes: share(requested_bytes, n),
            one_timer_fraction: share(once, unique),
            top10_request_share: share(top_requests, n),
            cacheable_request_share: share(cacheable, n),
            html_request_share: share(html, n),
        }
    }
}

/// A page of the synthetic web: its HTML and its current locality set.
struct Page {
    html: u32,
    /// Embedded objects; `true` marks an object of the shared pool.
    embedded: Vec<(u32, bool)>,
}

/// The synthetic generator's state.
struct Synth<'p> {
    p: &'p Params,
    rng: StdRng,
    sizes: Vec<u32>,
    pages: Vec<Option<Page>>,
    pool: Vec<Option<u32>>,
    page_rank: Zipf<f64>,
    pool_rank: Zipf<f64>,
    embedded: Geometric,
    html_size: LogNormal<f64>,
    object_size: LogNormal<f64>,
    tail_size: Pareto<f64>,
}

impl Synth<'_> {
    fn new(p: &Params, seed: u64) -> Result<Synth<'_>> {
        let bad = |what: &str| BenchError(format!("synthetic trace: bad {what}"));
        let ln_median = |m: u64| (m as f64).ln();
        Ok(Synth {
            p,
            rng: StdRng::seed_from_u64(seed),
            sizes: Vec::new(),
            pages: (0..p.pages).map(|_| None).collect(),
            pool: vec![None; p.shared_images as usize],
            page_rank: Zipf::new(p.pages, p.zipf_alpha).map_err(|_| bad("zipf_alpha"))?,
            pool_rank: Zipf::new(p.shared_images.max(1), p.zipf_alpha)
                .map_err(|_| bad("zipf_alpha"))?,
            embedded: Geometric::new(1.0 / (1.0 + p.embedded_mean))
                .map_err(|_| bad("embedded_mean"))?,
            html_size: LogNormal::new(ln_median(p.html_median), p.html_sigma)
                .map_err(|_| bad("html_sigma"))?,
            object_size: LogNormal::new(ln_median(p.object_median), p.object_sigma)
                .map_err(|_| bad("object_sigma"))?,
            tail_size: Pareto::new(p.tail_min as f64, p.pareto_alpha)
                .map_err(|_| bad("pareto_alpha"))?,
        })
    }

    fn clamp_size(&self, x: f64) -> u32 {
        x.round().clamp(32.0, self.p.max_object as f64) as u32
    }

    fn new_object(&mut self, html: bool) -> u32 {
        let x = if html {
            self.html_size.sample(&mut self.rng)
        } else if self.rng.gen_bool(self.p.tail_share) {
            self.tail_size.sample(&mut self.rng)
        } else {
            self.object_size.sample(&mut self.rng)
        };
        let size = self.clamp_size(x);
        self.sizes.push(size);
        (self.sizes.len() - 1) as u32
    }

    fn shared_image(&mut self) -> u32 {
        let rank = self.pool_rank.sample(&mut self.rng) as usize - 1;
        match self.pool[rank] {
            Some(id) => id,
            None => {
                let id = self.new_object(false);
                self.pool[rank] = Some(id);
                id
            }
        }
    }

    /// A page seen for the first time: its primordial locality set.
    fn new_page(&mut self) -> Page {
        let html = self.new_object(true);
        let k = self.embedded.sample(&mut self.rng).min(256);
        let mut embedded = Vec::with_capacity(k as usize);
        for _ in 0..k {
            if !self.pool.is_empty() && self.rng.gen_bool(self.p.shared_share) {
                embedded.push((self.shared_image(), true));
            } else {
                embedded.push((self.new_object(false), false));
            }
        }
        Page { html, embedded }
    }

    /// The requests of one page view, in order.
    fn page_view(&mut self, client: u32, out: &mut VecDeque<Request>) {
        if self.rng.gen_bool(self.p.one_timer_pages) {
            let page = self.new_page();
            self.emit(&page, client, out);
            return;
        }
        let rank = self.page_rank.sample(&mut self.rng) as usize - 1;
        let page = match self.pages[rank].take() {
            None => self.new_page(),
            Some(mut page) => {
                for i in 0..page.embedded.len() {
                    if !page.embedded[i].1 && self.rng.gen_bool(self.p.drift) {
                        page.embedded[i].0 = self.new_object(false);
                    }
                }
                page
            }
        };
        self.emit(&page, client, out);
        self.pages[rank] = Some(page);
    }

    fn emit(&self, page: &Page, client: u32, out: &mut VecDeque<Request>) {
        let req = |object: u32, html: bool| Request {
            object,
            size: self.sizes[object as usize],
            client,
            html,
        };
        out.push_back(req(page.html, true));
        for &(object, _) in &page.embedded {
            out.push_back(req(object, false));
        }
    }
}

/// Generates a synthetic trace of `p.requests` requests, deterministically
/// from `seed`.
pub fn synth_trace(p: &Params, seed: u64) -> Result<Trace> {
    let mut g = Synth::new(p, seed)?;
    let mut queues: Vec<VecDeque<Request>> = (0..p.clients).map(|_| VecDeque::new()).collect();
    let mut requests = Vec::with_capacity(p.requests as usize);
    while (requests.len() as u64) < p.requests {
        let client = g.rng.gen_range(0..p.clients);
        let queue = &mut queues[client as usize];
        if queue.is_empty() {
            g.page_view(client, queue);
        }
        if let Some(r) = queue.pop_front() {
            requests.push(r);
        }
    }
    // Objects made for page views cut off by the end of the trace were never
    // requested: renumber densely in order of first request.
    let mut ids = vec![u32::MAX; g.sizes.len()];
    let mut objects = 0u32;
    for r in &mut requests {
        let id = &mut ids[r.object as usize];
        if *id == u32::MAX {
            *id = objects;
            objects += 1;
        }
        r.object = *id;
    }
    Ok(Trace { requests, objects })
}

/// What the access.log parser kept and dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ParseStats {
    pub lines: u64,
    pub kept: u64,
    /// Lines that are not `timestamp elapsed client code/status bytes method URL ...`.
    pub malformed: u64,
    pub not_get: u64,
    /// GETs without a size (0 bytes).
    pub no_size: u64,
    /// GETs Squid would not have cached: denied, an uncacheable status, or a
    /// query/cgi-bin URL (Squid-2's default `no_cache deny QUERY`).
    pub uncacheable: u64,
}

/// HTTP statuses whose replies Squid-2 caches without an explicit expiry.
fn cacheable_status(status: u32) -> bool {
    matches!(status, 200 | 203 | 300 | 301 | 410)
}

/// Reads a native Squid access.log: `timestamp elapsed client code/status
/// bytes method URL [ident hierarchy/peer type]`. Keeps cacheable GETs with
/// a size; each URL becomes an object whose size is the logged byte count.
/// `limit` > 0 keeps only the first `limit` requests.
pub fn parse_squid_log(text: &str, limit: u64) -> (Trace, ParseStats) {
    let mut stats = ParseStats::default();
    let mut urls: HashMap<&str, u32> = HashMap::new();
    let mut clients: HashMap<&str, u32> = HashMap::new();
    let mut requests = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if limit > 0 && requests.len() as u64 >= limit {
            break;
        }
        stats.lines += 1;
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = (|| {
            if f.len() < 7 {
                return None;
            }
            f[0].parse::<f64>().ok()?;
            f[1].parse::<i64>().ok()?;
            let (code, status) = f[3].split_once('/')?;
            let status: u32 = status.parse().ok()?;
            let bytes: u64 = f[4].parse().ok()?;
            Some((code, status, bytes, f[5], f[6]))
        })();
        let Some((code, status, bytes, method, url)) = parsed else {
            stats.malformed += 1;
            continue;
        };
        if method != "GET" {
            stats.not_get += 1;
            continue;
        }
        if bytes == 0 {
            stats.no_size += 1;
            continue;
        }
        if code.contains("DENIED")
            || !cacheable_status(status)
            || url.contains('?')
            || url.contains("cgi-bin")
            || bytes > u64::from(u32::MAX)
        {
            stats.uncacheable += 1;
            continue;
        }
        let next = urls.len() as u32;
        let object = *urls.entry(url).or_insert(next);
        let next = clients.len() as u32;
        let client = *clients.entry(f[2]).or_insert(next);
        let html = f.get(9).is_some_and(|t| t.starts_with("text/html"))
            || url.ends_with('/')
            || url.ends_with(".html")
            || url.ends_with(".htm");
        requests.push(Request {
            object,
            size: bytes as u32,
            client,
            html,
        });
        stats.kept += 1;
    }
    let objects = urls.len() as u32;
    (Trace { requests, objects }, stats)
}

// ---------------------------------------------------------------------------
// The Squid store model: which objects are where. No I/O here.

const NIL: u32 = u32::MAX;

/// LRU list over dense object ids with a byte count.
struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Bytes charged for each object; 0 = not in the list.
    charged: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    used: u64,
    len: u64,
}

impl Lru {
    fn new(objects: u32) -> Lru {
        let n = objects as usize;
        Lru {
            prev: vec![NIL; n],
            next: vec![NIL; n],
            charged: vec![0; n],
            head: NIL,
            tail: NIL,
            used: 0,
            len: 0,
        }
    }

    fn contains(&self, id: u32) -> bool {
        self.charged[id as usize] != 0
    }

    fn unlink_node(&mut self, id: u32) {
        let (p, n) = (self.prev[id as usize], self.next[id as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_front(&mut self, id: u32) {
        self.prev[id as usize] = NIL;
        self.next[id as usize] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = id;
        }
        self.head = id;
        if self.tail == NIL {
            self.tail = id;
        }
    }

    fn touch(&mut self, id: u32) {
        if self.contains(id) && self.head != id {
            self.unlink_node(id);
            self.push_front(id);
        }
    }

    /// Inserts `id` (not in the list) as most recently used.
    fn insert(&mut self, id: u32, charged: u32) {
        debug_assert!(!self.contains(id) && charged > 0);
        self.charged[id as usize] = charged;
        self.used += u64::from(charged);
        self.len += 1;
        self.push_front(id);
    }

    fn remove(&mut self, id: u32) -> bool {
        let c = self.charged[id as usize];
        if c == 0 {
            return false;
        }
        self.unlink_node(id);
        self.charged[id as usize] = 0;
        self.used -= u64::from(c);
        self.len -= 1;
        true
    }

    fn pop_lru(&mut self) -> Option<u32> {
        let id = self.tail;
        if id == NIL {
            return None;
        }
        self.remove(id);
        Some(id)
    }
}

/// Where a request was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lookup {
    /// In the memory cache: no file-system work.
    Memory,
    /// On disk, in file `filn`.
    Disk { filn: u32 },
    /// Not cached; `stale` is the file of an older version of the object
    /// (different size), which has been dropped from the store and must be
    /// unlinked.
    Miss { stale: Option<u32> },
}

/// A miss the store takes in: the new file, and the files of the objects
/// evicted to make room.
#[derive(Debug, Default, PartialEq, Eq)]
struct Admission {
    filn: u32,
    victims: Vec<u32>,
}

/// Squid's view of its store: a disk cache (the files) and a memory cache
/// of hot objects (always also on disk), both LRU.
struct Store {
    disk: Lru,
    mem: Lru,
    filn: Vec<u32>,
    size: Vec<u32>,
    next_filn: u32,
    high: u64,
    low: u64,
    max_object: u64,
    mem_capacity: u64,
    block: u64,
}

impl Store {
    /// `fs_evicts`: the file system keeps the disk cache within the volume; the store
    /// never evicts for space.
    fn new(p: &Params, objects: u32, fs_evicts: bool) -> Store {
        let n = objects as usize;
        let mark = |fraction: f64| match fs_evicts {
            true => u64::MAX / 2,
            false => (p.cache_bytes as f64 * fraction) as u64,
        };
        Store {
            disk: Lru::new(objects),
            mem: Lru::new(objects),
            filn: vec![0; n],
            size: vec![0; n],
            next_filn: 0,
            high: mark(p.high_water),
            low: mark(p.low_water),
            max_object: p.max_cached_object,
            mem_capacity: p.mem_cache_bytes,
            block: p.block_bytes,
        }
    }

    /// Bytes charged on disk for an object of `size` bytes.
    fn charge(&self, size: u32) -> u64 {
        u64::from(size).div_ceil(self.block) * self.block
    }

    fn lookup(&mut self, object: u32, size: u32) -> Lookup {
        if !self.disk.contains(object) {
            return Lookup::Miss { stale: None };
        }
        if self.size[object as usize] != size {
            self.forget(object);
            return Lookup::Miss {
                stale: Some(self.filn[object as usize]),
            };
        }
        self.disk.touch(object);
        if self.mem.contains(object) {
            self.mem.touch(object);
            Lookup::Memory
        } else {
            Lookup::Disk {
                filn: self.filn[object as usize],
            }
        }
    }

    /// The file of an object in the disk cache.
    fn file_of(&self, object: u32) -> Option<u32> {
        self.disk
            .contains(object)
            .then(|| self.filn[object as usize])
    }

    /// Drops an object from the store (its file is the caller's business).
    fn forget(&mut self, object: u32) {
        self.disk.remove(object);
        self.mem.remove(object);
    }

    /// Takes in a missed object if it is cacheable, evicting LRU objects
    /// from the high-water to the low-water mark first.
    fn admit(&mut self, object: u32, size: u32) -> Option<Admission> {
        let charged = self.charge(size);
        if size == 0
            || (self.max_object > 0 && u64::from(size) > self.max_object)
            || charged > self.low
            || charged > u64::from(u32::MAX)
        {
            return None;
        }
        let mut victims = Vec::new();
        if self.disk.used + charged > self.high {
            while self.disk.used + charged > self.low {
                let Some(v) = self.disk.pop_lru() else { break };
                self.mem.remove(v);
                victims.push(self.filn[v as usize]);
            }
        }
        let filn = self.next_filn;
        self.next_filn = self.next_filn.wrapping_add(1);
        self.filn[object as usize] = filn;
        self.size[object as usize] = size;
        self.disk.insert(object, charged as u32);
        Some(Admission { filn, victims })
    }

    /// Keeps an object (on disk) in the memory cache too.
    fn remember(&mut self, object: u32, size: u32) {
        let size64 = u64::from(size);
        if size64 > self.mem_capacity || !self.disk.contains(object) {
            return;
        }
        self.mem.remove(object);
        while self.mem.used + size64 > self.mem_capacity {
            if self.mem.pop_lru().is_none() {
                break;
            }
        }
        self.mem.insert(object, size);
    }
}

/// Squid's cache file path of file number `filn` (`UFSSwapDir::fullPath`): what
/// `format!("{CACHE_DIR}/{:02X}/{:02X}/{filn:08X}", ..)` gives, written digit by digit (the
/// replay makes one or two a request, and `format!` cost the library's replay a twentieth
/// of its instructions).
pub fn squid_path(filn: u32, l1: u32, l2: u32) -> String {
    let mut path = String::with_capacity(CACHE_DIR.len() + 16);
    path.push_str(CACHE_DIR);
    path.push('/');
    push_hex(&mut path, ((filn / l2) / l2) % l1, 2);
    path.push('/');
    push_hex(&mut path, (filn / l2) % l2, 2);
    path.push('/');
    push_hex(&mut path, filn, 8);
    path
}

/// `value` in upper-case hex, at least `width` digits, as `{:0width$X}` writes it.
fn push_hex(out: &mut String, value: u32, width: usize) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    let significant = (32 - value.leading_zeros() as usize).div_ceil(4);
    for i in (0..significant.max(width)).rev() {
        let digit = value.checked_shr(4 * i as u32).unwrap_or(0) & 15;
        out.push(char::from(DIGITS[digit as usize]));
    }
}

// ---------------------------------------------------------------------------
// The replay

/// Durations of one kind of operation, in ms.
#[derive(Default)]
struct Times(Vec<f32>);

impl Times {
    fn add(&mut self, t0: Instant) {
        self.0.push((t0.elapsed().as_secs_f64() * 1e3) as f32);
    }

    fn mean(&self) -> f64 {
        if self.0.is_empty() {
            0.0
        } else {
            self.0.iter().map(|&x| f64::from(x)).sum::<f64>() / self.0.len() as f64
        }
    }

    /// The q-quantile (nearest rank).
    fn quantile(&mut self, q: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.sort_unstable_by(f32::total_cmp);
        let i = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len()) - 1;
        f64::from(self.0[i])
    }
}

/// Counts of a replay.
#[derive(Default)]
struct Replay {
    requests: u64,
    mem_hits: u64,
    disk_hits: u64,
    /// Misses of objects not cached (too large).
    uncached: u64,
    errors: u64,
    reads: Times,
    writes: Times,
    unlinks: Times,
    /// Disk hits whose file the file system had evicted (`fs_evicts`).
    fs_evicted: u64,
    read_bytes: u64,
    written_bytes: u64,
    hit_series: Vec<(f64, f64)>,
    throughput_series: Vec<(f64, f64)>,
    first_error: Option<String>,
    /// The error that showed the file system gone (see `is_gone`): the replay stops there.
    gone: Option<String>,
}

impl Replay {
    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(what);
        }
    }

    /// `error`, for a failed call: one that says the file system is gone also ends the
    /// replay, which would otherwise fail every request left, quickly, and be timed.
    fn failed(&mut self, what: &str, e: &std::io::Error) {
        let what = format!("{what}: {e}");
        if is_gone(e) && self.gone.is_none() {
            self.gone = Some(what.clone());
        }
        self.error(what);
    }
}

/// Whether an error says that no later request can succeed: the FUSE daemon died
/// (ENOTCONN, ECONNABORTED) or the volume stopped taking changes (EROFS: anvil stops
/// writing when it finds damage).
fn is_gone(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN | libc::ECONNABORTED | libc::EROFS)
    )
}

/// Incompressible file contents: each file is a window of this buffer
/// starting at an offset that depends on its file number.
struct Content(Vec<u8>);

const CONTENT_WINDOW: usize = MIB as usize;
const CONTENT_SKEW: usize = 64 * KIB as usize;

impl Content {
    fn new(seed: u64) -> Content {
        let mut buf = vec![0u8; CONTENT_WINDOW + CONTENT_SKEW];
        StdRng::seed_from_u64(seed ^ 0x5eed_c0de).fill_bytes(&mut buf);
        Content(buf)
    }

    /// The `size` bytes of file `filn`: the buffer from an offset its number picks, over
    /// again from that offset for a file longer than the rest of the buffer.
    fn bytes(&self, filn: u32, size: usize) -> std::borrow::Cow<'_, [u8]> {
        let start = (filn as usize).wrapping_mul(2_654_435_761) % CONTENT_SKEW;
        let window = &self.0[start..];
        match window.get(..size) {
            Some(bytes) => std::borrow::Cow::Borrowed(bytes),
            None => window.iter().copied().cycle().take(size).collect(),
        }
    }
}

/// Whether a target takes anvil's directory attributes and hints: anvil's own targets, and
/// a `--dir` on a mount served by anvil's daemon (`anvil mount`, or `anvil memfs`, which
/// keeps them as plain attributes, so that the transport's ceiling is measured with the
/// same requests).
fn is_anvil(fs_type: &str) -> bool {
    matches!(fs_type, "anvil" | "fuse.anvil")
}

fn make_tree(vfs: &dyn Vfs, p: &Params, fs_type: &str) -> Result<()> {
    vfs.mkdir(CACHE_DIR, 0o755)
        .ctx(|| format!("mkdir {CACHE_DIR}"))?;
    if !p.cache_history && is_anvil(fs_type) {
        vfs.set_anvil_nohistory(CACHE_DIR)
            .ctx(|| format!("anvil nohistory {CACHE_DIR}"))?;
    }
    // Before the subdirectories, which inherit it.
    if p.fs_evicts && is_anvil(fs_type) {
        vfs.set_anvil_evictable(CACHE_DIR)
            .ctx(|| format!("anvil evict {CACHE_DIR}"))?;
    }
    for a in 0..p.l1 {
        let d1 = format!("{CACHE_DIR}/{a:02X}");
        vfs.mkdir(&d1, 0o755).ctx(|| format!("mkdir {d1}"))?;
        for b in 0..p.l2 {
            let d2 = format!("{d1}/{b:02X}");
            vfs.mkdir(&d2, 0o755).ctx(|| format!("mkdir {d2}"))?;
        }
    }
    Ok(())
}

fn replay(
    env: &RunEnv,
    p: &Params,
    trace: &Trace,
    store: &mut Store,
    content: &Content,
    fs_evicts: bool,
) -> Replay {
    let vfs = env.vfs;
    let hints = p.hints && is_anvil(&env.fs_type);
    let collocate = hints && p.collocate_hits;
    let copy = hints && p.copy_hits;
    let chunk = p.io_chunk as usize;
    let mut buf = vec![0u8; chunk];
    let mut r = Replay::default();
    // wg-Hummingbird: each client's latest HTML page written, by file number.
    let mut client_page: Vec<Option<u32>> = Vec::new();

    let n = trace.requests.len() as u64;
    let step = n.div_ceil(STEPS).max(1);
    let t_start = Instant::now();
    let mut t_step = t_start;
    let mut since_step = 0u64;

    for req in &trace.requests {
        r.requests += 1;
        let mut lookup = store.lookup(req.object, req.size);
        // The client's latest page, wherever it is served from (a page in the memory cache
        // is on disk too); none until a page missed is written.
        if req.html {
            remember_page(&mut client_page, req.client, store.file_of(req.object));
        }
        if let Lookup::Disk { filn } = lookup {
            let path = squid_path(filn, p.l1, p.l2);
            let t0 = Instant::now();
            let got = vfs.read_file(&path, &mut buf);
            match got {
                Ok(len) if len == u64::from(req.size) => {
                    r.reads.add(t0);
                    r.read_bytes += len;
                    r.disk_hits += 1;
                    store.remember(req.object, req.size);
                    // wg-Hummingbird collocates every image with its client's page, hit or
                    // miss: anvil packs a page's files read apart into one set.
                    let page = client_page.get(req.client as usize).copied().flatten();
                    if let (true, false, Some(page)) = (collocate, req.html, page) {
                        // A hint about a page that is gone (evicted) is no hint.
                        let _ = vfs.collocate(&path, &squid_path(page, p.l1, p.l2));
                    }
                    if let (true, false, Some(page)) = (copy, req.html, page) {
                        let _ = vfs.copy_near(&path, &squid_path(page, p.l1, p.l2));
                    }
                }
                Ok(len) => {
                    r.error(format!("read {path}: {len} bytes, expected {}", req.size));
                    store.forget(req.object);
                }
                // The file system dropped it for space: a miss, fetched again. (A
                // copy in the memory cache still serves, as Squid's would.)
                Err(e) if fs_evicts && e.kind() == std::io::ErrorKind::NotFound => {
                    r.fs_evicted += 1;
                    store.forget(req.object);
                    lookup = Lookup::Miss { stale: None };
                }
                Err(e) => {
                    r.failed(&format!("read {path}"), &e);
                    store.forget(req.object);
                }
            }
        }
        match lookup {
            Lookup::Memory => r.mem_hits += 1,
            Lookup::Disk { .. } => {}
            Lookup::Miss { stale } => {
                if let Some(filn) = stale {
                    unlink(vfs, &mut r, filn, p);
                }
                match store.admit(req.object, req.size) {
                    None => r.uncached += 1,
                    Some(adm) => {
                        for &v in &adm.victims {
                            unlink(vfs, &mut r, v, p);
                        }
                        let path = squid_path(adm.filn, p.l1, p.l2);
                        let page = client_page.get(req.client as usize).copied().flatten();
                        let near = match page {
                            Some(page) if hints && !req.html => Some(squid_path(page, p.l1, p.l2)),
                            _ => None,
                        };
                        let data = content.bytes(adm.filn, req.size as usize);
                        let t0 = Instant::now();
                        let res = vfs.write_file(&path, 0o600, &data, near.as_deref(), chunk);
                        if req.html {
                            remember_page(&mut client_page, req.client, Some(adm.filn));
                        }
                        match res {
                            Ok(()) => {
                                r.writes.add(t0);
                                r.written_bytes += u64::from(req.size);
                                store.remember(req.object, req.size);
                            }
                            Err(e) => {
                                r.failed(&format!("write {path}"), &e);
                                store.forget(req.object);
                                let _ = vfs.unlink(&path);
                            }
                        }
                    }
                }
            }
        }
        if r.gone.is_some() {
            break;
        }
        since_step += 1;
        if since_step == step || r.requests == n {
            let now = Instant::now();
            let dt = now.duration_since(t_step).as_secs_f64();
            let x = r.requests as f64;
            let hit = (r.mem_hits + r.disk_hits) as f64 / x;
            r.hit_series.push((x, hit));
            r.throughput_series.push((
                x,
                if dt > 0.0 {
                    since_step as f64 / dt
                } else {
                    0.0
                },
            ));
            env.progress.inc(since_step);
            env.progress.set_message(format!("hit rate {hit:.3}"));
            t_step = now;
            since_step = 0;
        }
    }
    r
}

/// Records `filn` as the client's latest HTML page (wg-Hummingbird's hash by client); None
/// for a page not in the cache.
fn remember_page(pages: &mut Vec<Option<u32>>, client: u32, filn: Option<u32>) {
    let client = client as usize;
    if pages.len() <= client {
        pages.resize(client + 1, None);
    }
    pages[client] = filn;
}

fn unlink(vfs: &dyn Vfs, r: &mut Replay, filn: u32, p: &Params) {
    let path = squid_path(filn, p.l1, p.l2);
    let t0 = Instant::now();
    match vfs.unlink(&path) {
        Ok(()) => r.unlinks.add(t0),
        Err(e) => r.failed(&format!("unlink {path}"), &e),
    }
}

fn load_trace(p: &Params, seed: u64) -> Result<(Trace, Option<ParseStats>)> {
    match p.log_path() {
        None => Ok((synth_trace(p, seed)?, None)),
        Some(path) => {
            let text = std::fs::read_to_string(path).ctx(|| format!("read trace {path}"))?;
            let (trace, stats) = parse_squid_log(&text, p.requests);
            if trace.requests.is_empty() {
                return fail(format!("trace {path}: no cacheable GET with a size"));
            }
            Ok((trace, Some(stats)))
        }
    }
}

fn run(p: &Params, env: &RunEnv) -> Result<RunOutput> {
    if let Some(memory) = p.config_memory()? {
        if env.mem_limit != Some(memory) {
            return fail(format!(
                "config={} is Hummingbird's {} MiB of memory for proxy, file system and \
                 daemon together: run it with --mem-limit {}M",
                p.config,
                memory / MIB,
                memory / MIB
            ));
        }
    }
    let seed = if p.seed == 0 { env.seed } else { p.seed };
    env.progress.set_message("generating trace");
    let (trace, parse) = load_trace(p, seed)?;
    let summary = trace.summary(p.max_cached_object);
    let content = Content::new(seed);
    let fs_evicts = p.fs_evicts && is_anvil(&env.fs_type);
    let mut store = Store::new(p, trace.objects, fs_evicts);

    env.progress.set_message("making the cache tree");
    let ((), setup) = env.phase("setup", || {
        make_tree(env.vfs, p, &env.fs_type)?;
        env.probe.sync()
    })?;

    // The proxy's memory cache is memory, charged to the run's cgroup as Squid's was to
    // the machine (Hummingbird's Table 2 split 256 MB into 128 MB for it and 128 MB of
    // buffer cache): the replay only tracks which objects it holds, so the bytes are
    // allocated and touched here and kept until the replay ends.
    let squid_memory = vec![1u8; p.mem_cache_bytes as usize];
    env.progress.set_length(trace.requests.len() as u64);
    env.progress.set_position(0);
    let (mut r, replay_phase) = env.phase("replay", || {
        Ok(replay(env, p, &trace, &mut store, &content, fs_evicts))
    })?;
    drop(std::hint::black_box(squid_memory));
    if let Some(gone) = &r.gone {
        return fail(format!(
            "the file system stopped answering at request {} of {} ({gone})",
            r.requests,
            trace.requests.len()
        ));
    }
    let ((), sync) = env.phase("sync", || env.probe.sync())?;

    let io: IoCounters = replay_phase.io.add(&sync.io);
    let run_time = replay_phase.wall_s;
    let n = r.requests.max(1) as f64;
    let hit_rate = (r.mem_hits + r.disk_hits) as f64 / n;
    let disk_hit_rate = r.disk_hits as f64 / n;
    let throughput = if run_time > 0.0 {
        r.requests as f64 / run_time
    } else {
        0.0
    };
    let (read_mean, write_mean, unlink_mean) = (r.reads.mean(), r.writes.mean(), r.unlinks.mean());
    let (read_p50, read_p99) = (r.reads.quantile(0.5), r.reads.quantile(0.99));
    let (write_p50, write_p99) = (r.writes.quantile(0.5), r.writes.quantile(0.99));

    let mean_io_kib = match io.ios() {
        0 => 0.0,
        n => (io.bytes_read() + io.bytes_written()) as f64 / 1024.0 / n as f64,
    };
    let metrics = vec![
        Metric::higher("hit_rate", "ratio", hit_rate),
        Metric::higher("disk_hit_rate", "ratio", disk_hit_rate),
        Metric::lower("fs_read_ms", "ms", read_mean),
        Metric::lower("fs_read_p50_ms", "ms", read_p50),
        Metric::lower("fs_read_p99_ms", "ms", read_p99),
        Metric::lower("fs_write_ms", "ms", write_mean),
        Metric::lower("fs_write_p50_ms", "ms", write_p50),
        Metric::lower("fs_write_p99_ms", "ms", write_p99),
        Metric::lower("fs_unlink_ms", "ms", unlink_mean),
        Metric::lower("disk_ios", "I/Os", io.ios() as f64),
        Metric::lower("mean_disk_io_ms", "ms", io.mean_io_ms()),
        Metric::higher("mean_disk_io_kib", "KiB", mean_io_kib),
        Metric::lower("run_time_s", "s", run_time),
        Metric::higher("throughput", "requests/s", throughput),
    ];
    let mut metrics = metrics;
    if fs_evicts {
        metrics.push(Metric::lower("fs_evicted", "requests", r.fs_evicted as f64));
    }
    let series = vec![
        Series {
            name: "hit_rate".into(),
            x_label: "requests".into(),
            y_label: "cumulative hit rate".into(),
            points: std::mem::take(&mut r.hit_series),
        },
        Series {
            name: "throughput".into(),
            x_label: "requests".into(),
            y_label: "requests/s".into(),
            points: std::mem::take(&mut r.throughput_series),
        },
    ];

    let mb = |b: u64| b as f64 / MIB as f64;
    let limit = if p.max_cached_object == 0 {
        "all objects cached".to_string()
    } else {
        format!("objects > {} KiB not cached", p.max_cached_object / KIB)
    };
    let mut text = format!(
        "wg-squid replay of {} requests ({} objects, {:.1} MiB unique, {:.1} MiB requested); \
         disk cache {:.0} MiB, memory cache {:.1} MiB, {limit}\n\n",
        summary.requests,
        summary.unique_objects,
        mb(summary.unique_bytes),
        mb(summary.requested_bytes),
        mb(p.cache_bytes),
        mb(p.mem_cache_bytes),
    );
    text += &format!(
        "{:<14} {:>9} {:>8} {:>8} {:>12} {:>13} {:>10} {:>13} {:>12} {:>10} {:>11}\n",
        "file system",
        "disk MiB",
        "mem MiB",
        "hit rate",
        "FS read ms",
        "FS write ms",
        "disk I/Os",
        "mean I/O ms",
        "mean I/O KiB",
        "run time s",
        "requests/s"
    );
    text += &format!(
        "{:<14} {:>9.0} {:>8.1} {:>8.3} {:>12.3} {:>13.3} {:>10} {:>13.2} {:>12.1} {:>10.2} {:>11.0}\n",
        env.fs_label,
        mb(p.cache_bytes),
        mb(p.mem_cache_bytes),
        hit_rate,
        read_mean,
        write_mean,
        io.ios(),
        io.mean_io_ms(),
        mean_io_kib,
        run_time,
        throughput
    );
    if let Some(e) = &r.first_error {
        text += &format!("\n{} errors; first: {e}\n", r.errors);
    }

    let extra = json!({
        "trace": summary,
        "parse": parse,
        "counts": {
            "requests": r.requests,
            "memory_hits": r.mem_hits,
            "disk_hits": r.disk_hits,
            "misses": r.requests - r.mem_hits - r.disk_hits,
            "uncached_misses": r.uncached,
            "fs_reads": r.reads.0.len(),
            "fs_writes": r.writes.0.len(),
            "unlinks": r.unlinks.0.len(),
            "read_bytes": r.read_bytes,
            "written_bytes": r.written_bytes,
            "cached_files": store.disk.len,
            "cached_bytes": store.disk.used,
            "memory_objects": store.mem.len,
            "memory_bytes": store.mem.used,
            "first_error": r.first_error,
        },
        "seed": seed,
    });

    Ok(RunOutput {
        metrics,
        phases: vec![setup, replay_phase, sync],
        series,
        text,
        errors: r.errors,
        extra,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Params {
        Params::for_tier(Tier::Tiny)
    }

    const FIXTURE: &str = include_str!("../../tests/fixtures/squid_access.log");

    fn fixture_path() -> String {
        format!(
            "{}/tests/fixtures/squid_access.log",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    fn metric(out: &RunOutput, name: &str) -> f64 {
        out.metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no metric {name}"))
            .value
    }

    /// (files, bytes) under `dir`.
    fn files_under(dir: &Path) -> (u64, u64) {
        let (mut n, mut bytes) = (0, 0);
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap();
                let m = e.metadata().unwrap();
                if m.is_dir() {
                    stack.push(e.path());
                } else {
                    n += 1;
                    bytes += m.len();
                }
            }
        }
        (n, bytes)
    }

    pub(super) fn ov(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn tiny_run_gives_sane_metrics_and_keeps_the_cache_bounded() {
        let dir = tempfile::TempDir::new().unwrap();
        let w = workload(Tier::Tiny, &[]).unwrap();
        assert_eq!(w.name(), "proxy-cache");
        assert!(w.lib_capable());
        let p = tiny();
        assert!(w.min_fs_bytes().unwrap() > p.cache_bytes);
        let out = crate::testkit::with_env(dir.path(), |env| w.run(env)).unwrap();
        assert_eq!(out.errors, 0, "{}", out.text);
        let hit = metric(&out, "hit_rate");
        let disk_hit = metric(&out, "disk_hit_rate");
        assert!((0.0..=1.0).contains(&hit), "{hit}");
        assert!(
            hit > 0.0 && disk_hit > 0.0 && disk_hit <= hit,
            "{hit} {disk_hit}"
        );
        for name in [
            "fs_read_ms",
            "fs_write_ms",
            "run_time_s",
            "throughput",
            "disk_ios",
        ] {
            assert!(metric(&out, name) >= 0.0, "{name}");
        }
        assert_eq!(out.series.len(), 2);
        let hits = &out.series[0].points;
        assert!(hits.len() >= 50 && hits.last().unwrap().0 == p.requests as f64);
        assert!((hits.last().unwrap().1 - hit).abs() < 1e-9);
        assert_eq!(out.phases.len(), 3);
        assert!(
            out.text.contains("hit rate") && out.text.contains("test"),
            "{}",
            out.text
        );

        // What is left on disk is what the store holds, within capacity.
        let (files, bytes) = files_under(&dir.path().join(CACHE_DIR));
        let counts = &out.extra["counts"];
        assert_eq!(files, counts["cached_files"].as_u64().unwrap());
        assert!(bytes <= p.cache_bytes, "{bytes} > {}", p.cache_bytes);
        assert!(counts["cached_bytes"].as_u64().unwrap() <= p.cache_bytes);
        assert!(
            counts["unlinks"].as_u64().unwrap() > 0,
            "the tiny cache must evict"
        );
        assert_eq!(out.extra["trace"]["requests"].as_u64(), Some(p.requests));
    }

    #[test]
    fn replays_a_squid_log() {
        let dir = tempfile::TempDir::new().unwrap();
        let w = workload(
            Tier::Tiny,
            &ov(&[
                ("trace", &format!("squid:{}", fixture_path())),
                ("l1", "2"),
                ("l2", "4"),
            ]),
        )
        .unwrap();
        let out = crate::testkit::with_env(dir.path(), |env| w.run(env)).unwrap();
        assert_eq!(out.errors, 0, "{}", out.text);
        let c = &out.extra["counts"];
        assert_eq!(c["requests"], 8);
        // Hits: the HTML and the logo the second time (memory); the changed
        // photo is a miss that replaces the old file; the PDF is too large.
        assert_eq!(c["memory_hits"], 2);
        assert_eq!(c["uncached_misses"], 1);
        assert_eq!(c["unlinks"], 1);
        assert_eq!(c["cached_files"], 4);
        assert_eq!(files_under(&dir.path().join(CACHE_DIR)).0, 4);
        assert_eq!(out.extra["parse"]["kept"], 8);
    }

    /// The workload through `AnvilVfs` on an in-memory anvil volume, as
    /// `--fs anvil-lib` runs it (no kernel path).
    /// Runs the workload with `overrides` on a fresh in-memory anvil volume of `bytes`,
    /// in process; returns the output and the volume.
    fn run_in_process(
        bytes: u64,
        overrides: &[(String, String)],
    ) -> (RunOutput, std::sync::Arc<anvil::Filesystem>, u64) {
        let (fs, root) = in_memory_volume(bytes);
        let vfs = crate::vfs::AnvilVfs::new(fs.clone(), root);
        let out = run_on(&vfs, &fs, overrides).unwrap();
        (out, fs, root)
    }

    /// A fresh in-memory anvil volume of `bytes` and the inode of a directory in it.
    fn in_memory_volume(bytes: u64) -> (std::sync::Arc<anvil::Filesystem>, u64) {
        use anvil::device::MemDevice;
        use anvil::fs::Caller;
        use anvil::{Filesystem, MountOptions};
        use std::sync::Arc;

        let dev: Arc<dyn anvil::device::Device> = Arc::new(MemDevice::new(bytes));
        Filesystem::mkfs(dev.clone(), bytes, "bench").unwrap();
        let options = MountOptions {
            commit_interval_ms: 0,
            ..Default::default()
        };
        let fs = Arc::new(Filesystem::open(dev, options).unwrap());
        let root = fs.mkdir(Caller::ROOT, 1, b"bench", 0o755).unwrap().ino;
        (fs, root)
    }

    /// Runs the workload with `overrides` through `vfs`, over `fs`, in process.
    fn run_on(
        vfs: &dyn crate::vfs::Vfs,
        fs: &std::sync::Arc<anvil::Filesystem>,
        overrides: &[(String, String)],
    ) -> Result<RunOutput> {
        use anvil::Filesystem;
        use std::sync::Arc;

        struct LibProbe(Arc<Filesystem>);
        impl crate::env::Probe for LibProbe {
            fn drop_caches(&self) -> Result<()> {
                self.sync()
            }
            fn sync(&self) -> Result<()> {
                self.0
                    .sync()
                    .map(|_| ())
                    .map_err(|e| BenchError(e.to_string()))
            }
            fn io(&self) -> IoCounters {
                IoCounters::default()
            }
            fn used_bytes(&self) -> Result<u64> {
                Ok(0)
            }
            fn make_snapshot_root(&self, _: &str) -> Result<()> {
                Ok(())
            }
            fn snapshot(&self, _: &str, _: &str) -> Result<bool> {
                Ok(false)
            }
        }

        let probe = LibProbe(fs.clone());
        let bar = indicatif::ProgressBar::hidden();
        let env = RunEnv {
            dir: None,
            vfs,
            probe: &probe,
            fs_label: "anvil-lib".into(),
            fs_type: "anvil".into(),
            seed: 3,
            run: 0,
            mem_limit: None,
            progress: &bar,
        };
        workload(Tier::Tiny, overrides)?.run(&env)
    }

    #[test]
    fn runs_on_an_anvil_volume_in_process() {
        // With hints on hits too: files move between sets under the replay.
        let (out, fs, root) = run_in_process(64 * MIB, &ov(&[("collocate_hits", "true")]));
        let vfs = crate::vfs::AnvilVfs::new(fs, root);
        let p = tiny();
        assert_eq!(out.errors, 0, "{}", out.text);
        assert!(metric(&out, "hit_rate") > 0.0);
        let counts = &out.extra["counts"];
        let mut files = 0;
        for a in vfs.read_dir(CACHE_DIR).unwrap() {
            for b in vfs.read_dir(&format!("{CACHE_DIR}/{a}")).unwrap() {
                files += vfs.read_dir(&format!("{CACHE_DIR}/{a}/{b}")).unwrap().len() as u64;
            }
        }
        assert_eq!(files, counts["cached_files"].as_u64().unwrap());
        assert!(counts["cached_bytes"].as_u64().unwrap() <= p.cache_bytes);
    }

    #[test]
    fn copies_of_images_go_into_their_pages_sets() {
        let (out, fs, _) = run_in_process(64 * MIB, &ov(&[("copy_hits", "true")]));
        assert_eq!(out.errors, 0, "{}", out.text);
        let report = fs.volume().report();
        let count = |name: &str| report.iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(count("copies_written") > 0, "{report:?}");
        let check = anvil::check::check(fs.volume()).unwrap();
        assert!(check.is_clean(), "{check:?}");
    }

    /// A file system that dies under the replay (a FUSE daemon killed: every call fails
    /// with ENOTCONN from then on) ends the run at that request with the reason, instead
    /// of timing hundreds of thousands of quick failures.
    #[test]
    fn a_file_system_that_dies_ends_the_replay() {
        use crate::vfs::{AnvilVfs, VFile, Vfs};
        use std::io;
        use std::sync::atomic::{AtomicU64, Ordering};

        /// Dies at its `lives`-th create.
        struct Dying {
            inner: AnvilVfs,
            lives: AtomicU64,
            calls_after: AtomicU64,
        }
        impl Dying {
            fn alive(&self) -> io::Result<()> {
                if self.lives.load(Ordering::Relaxed) > 0 {
                    return Ok(());
                }
                self.calls_after.fetch_add(1, Ordering::Relaxed);
                Err(io::Error::from_raw_os_error(libc::ENOTCONN))
            }
            fn create_one(&self) -> io::Result<()> {
                self.alive()?;
                if self.lives.fetch_sub(1, Ordering::Relaxed) == 1 {
                    return Err(io::Error::from_raw_os_error(libc::ENOTCONN));
                }
                Ok(())
            }
        }
        impl Vfs for Dying {
            fn kind(&self) -> &'static str {
                self.inner.kind()
            }
            fn mkdir(&self, path: &str, mode: u32) -> io::Result<()> {
                self.alive()?;
                self.inner.mkdir(path, mode)
            }
            fn create(&self, path: &str, mode: u32) -> io::Result<Box<dyn VFile + '_>> {
                self.create_one()?;
                self.inner.create(path, mode)
            }
            fn create_near(
                &self,
                path: &str,
                mode: u32,
                near: &str,
            ) -> io::Result<Box<dyn VFile + '_>> {
                self.create_one()?;
                self.inner.create_near(path, mode, near)
            }
            fn collocate(&self, path: &str, near: &str) -> io::Result<()> {
                self.alive()?;
                self.inner.collocate(path, near)
            }
            fn copy_near(&self, path: &str, near: &str) -> io::Result<()> {
                self.alive()?;
                self.inner.copy_near(path, near)
            }
            fn set_anvil_nohistory(&self, path: &str) -> io::Result<()> {
                self.alive()?;
                self.inner.set_anvil_nohistory(path)
            }
            fn set_anvil_evictable(&self, path: &str) -> io::Result<()> {
                self.alive()?;
                self.inner.set_anvil_evictable(path)
            }
            fn open_read(&self, path: &str) -> io::Result<Box<dyn VFile + '_>> {
                self.alive()?;
                self.inner.open_read(path)
            }
            fn rename(&self, from: &str, to: &str) -> io::Result<()> {
                self.alive()?;
                self.inner.rename(from, to)
            }
            fn unlink(&self, path: &str) -> io::Result<()> {
                self.alive()?;
                self.inner.unlink(path)
            }
            fn rmdir(&self, path: &str) -> io::Result<()> {
                self.alive()?;
                self.inner.rmdir(path)
            }
            fn stat_size(&self, path: &str) -> io::Result<u64> {
                self.alive()?;
                self.inner.stat_size(path)
            }
            fn read_dir(&self, path: &str) -> io::Result<Vec<String>> {
                self.alive()?;
                self.inner.read_dir(path)
            }
        }

        let (fs, root) = in_memory_volume(64 * MIB);
        let vfs = Dying {
            inner: AnvilVfs::new(fs.clone(), root),
            lives: AtomicU64::new(500),
            calls_after: AtomicU64::new(0),
        };
        let err = run_on(&vfs, &fs, &[]).unwrap_err().to_string();
        assert!(err.contains("stopped answering at request"), "{err}");
        assert!(err.contains("not connected"), "{err}");
        // The request that met the dead file system, and the unlink of its half-made file.
        let after = vfs.calls_after.load(Ordering::Relaxed);
        assert!(after <= 1, "{after} calls after the file system died");
    }

    /// `fs_evicts`: a trace whose unique bytes are several times the volume runs without
    /// an error on anvil, which drops files for space (the proxy never unlinks), and the
    /// proxy sees some of its disk hits gone.
    #[test]
    fn anvil_evicts_for_the_proxy() {
        let overrides = ov(&[
            ("fs_evicts", "true"),
            ("requests", "30000"),
            ("pages", "12000"),
            ("cache_bytes", "1073741824"),
        ]);
        let (out, fs, _) = run_in_process(32 * MIB, &overrides);
        assert_eq!(out.errors, 0, "{}", out.text);
        assert!(metric(&out, "fs_evicted") > 0.0, "{}", out.text);
        assert!(metric(&out, "hit_rate") > 0.0);
        let info = fs.info();
        assert!(info.evicted_files > 0);
        assert!(metric(&out, "fs_unlink_ms") == 0.0, "the proxy unlinked");
    }

    #[test]
    fn parses_the_squid_log_fixture() {
        let (trace, stats) = parse_squid_log(FIXTURE, 0);
        assert_eq!(
            stats,
            ParseStats {
                lines: 19,
                kept: 8,
                malformed: 1,
                not_get: 3,
                no_size: 1,
                uncacheable: 6,
            }
        );
        let got: Vec<(u32, u32, u32)> = trace
            .requests
            .iter()
            .map(|r| (r.object, r.size, r.client))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 5062, 0),
                (1, 1543, 0),
                (2, 8812, 0),
                (0, 5062, 1),
                (1, 1543, 1),
                (3, 120000, 2),
                (4, 402, 2),
                (2, 9001, 0),
            ]
        );
        assert_eq!(trace.objects, 5);
        let s = trace.summary(64 * 1024);
        assert_eq!(s.unique_objects, 5);
        assert_eq!(s.unique_bytes, 5062 + 1543 + 8812 + 120000 + 402);
        assert!((s.one_timer_fraction - 0.4).abs() < 1e-9);
        // HTML by type or URL: the front page twice and the 301.
        assert_eq!(s.html_request_share, 3.0 / 8.0);
        let (limited, _) = parse_squid_log(FIXTURE, 3);
        assert_eq!(limited.requests.len(), 3);
    }

    #[test]
    fn synthetic_trace_is_deterministic_and_shaped() {
        let p = Params::for_tier(Tier::Quick);
        let a = synth_trace(&p, 42).unwrap();
        let b = synth_trace(&p, 42).unwrap();
        let c = synth_trace(&p, 43).unwrap();
        assert_eq!(a.requests, b.requests);
        assert_ne!(a.requests, c.requests);
        assert_eq!(a.requests.len() as u64, p.requests);
        let s = a.summary(p.max_cached_object);
        // Every id is requested and ids are dense.
        assert_eq!(s.unique_objects, u64::from(a.objects));
        // Mean request near 5.75 KB (the paper's 27.6 GB / 4.8 M).
        assert!((4_800.0..7_000.0).contains(&s.mean_request_bytes), "{s:?}");
        // Zipf skew: the top 10% of objects get far more than 10% of requests.
        assert!(s.top10_request_share > 0.3, "{s:?}");
        assert!((0.5..0.8).contains(&s.one_timer_fraction), "{s:?}");
        assert!((0.1..0.2).contains(&s.html_request_share), "{s:?}");
        // Unique bytes about twice the cache.
        let ratio = s.unique_bytes as f64 / p.cache_bytes as f64;
        assert!((1.5..3.0).contains(&ratio), "{ratio}");
        // Requests of a client start with an HTML page.
        let first = a.requests.iter().find(|r| r.client == 3).unwrap();
        assert!(first.html);
    }

    #[test]
    fn eviction_keeps_the_disk_cache_between_the_water_marks() {
        let p = Params {
            cache_bytes: MIB,
            mem_cache_bytes: 64 * KIB,
            ..tiny()
        };
        let objects = 5_000u32;
        let mut store = Store::new(&p, objects, false);
        let mut rng = StdRng::seed_from_u64(5);
        let max_charged = 64 * KIB;
        let (low, high) = (store.low, store.high);
        assert_eq!((low, high), (MIB * 9 / 10, (MIB as f64 * 0.95) as u64));
        let mut evicted = false;
        let mut files = std::collections::HashSet::new();
        for obj in 0..objects {
            let size = rng.gen_range(1..=64 * 1024u32);
            assert_eq!(store.lookup(obj, size), Lookup::Miss { stale: None });
            let adm = store.admit(obj, size).expect("cacheable");
            assert!(files.insert(adm.filn), "file numbers are not reused");
            for v in &adm.victims {
                assert!(files.remove(v), "victim {v} was not cached");
            }
            evicted |= !adm.victims.is_empty();
            assert!(store.disk.used <= high, "{} > {high}", store.disk.used);
            if evicted {
                assert!(store.disk.used + max_charged > low, "{}", store.disk.used);
            }
            assert_eq!(files.len() as u64, store.disk.len);
            store.remember(obj, size);
            assert!(store.mem.used <= p.mem_cache_bytes);
            // Keep object 0 hot: it must never be evicted.
            assert_ne!(store.lookup(0, store.size[0]), Lookup::Miss { stale: None });
        }
        assert!(evicted);
        // Too large, or changed size.
        assert!(store.admit(objects - 1, 64 * 1024 + 1).is_none());
        let last = objects - 1;
        let size = store.size[last as usize];
        assert!(matches!(
            store.lookup(last, size + 1),
            Lookup::Miss { stale: Some(_) }
        ));
        assert!(!store.disk.contains(last));
    }

    #[test]
    fn lru_orders_by_last_use() {
        let mut lru = Lru::new(4);
        for id in 0..4 {
            lru.insert(id, 10);
        }
        lru.touch(0);
        lru.touch(2);
        assert!(lru.remove(3));
        assert!(!lru.remove(3));
        assert_eq!(lru.used, 30);
        assert_eq!(lru.pop_lru(), Some(1));
        assert_eq!(lru.pop_lru(), Some(0));
        assert_eq!(lru.pop_lru(), Some(2));
        assert_eq!(lru.pop_lru(), None);
        assert_eq!((lru.used, lru.len), (0, 0));
    }

    #[test]
    fn cache_paths_follow_squid() {
        assert_eq!(squid_path(0, 16, 256), "cache/00/00/00000000");
        assert_eq!(squid_path(255, 16, 256), "cache/00/00/000000FF");
        assert_eq!(squid_path(256, 16, 256), "cache/00/01/00000100");
        assert_eq!(squid_path(0x12345, 16, 256), "cache/01/23/00012345");
        assert_eq!(squid_path(0x10_0000, 16, 256), "cache/00/00/00100000");
        // Any geometry, as format! writes it (a level may need more than two digits).
        for (filn, l1, l2) in [(u32::MAX, 4096, 7), (0xABCD_EF01, 1 << 20, 3), (9, 1, 1)] {
            let want = format!(
                "{CACHE_DIR}/{:02X}/{:02X}/{filn:08X}",
                ((filn / l2) / l2) % l1,
                (filn / l2) % l2
            );
            assert_eq!(squid_path(filn, l1, l2), want);
        }
    }

    #[test]
    fn parameters_are_checked() {
        assert!(workload(Tier::Quick, &ov(&[("zipf_alpha", "0.9")])).is_ok());
        assert!(workload(Tier::Quick, &ov(&[("nope", "1")])).is_err());
        assert!(workload(Tier::Quick, &ov(&[("trace", "/no/such/access.log")])).is_err());
        assert!(workload(Tier::Quick, &ov(&[("low_water", "0.99")])).is_err());
        let w = workload(Tier::Full, &[]).unwrap();
        assert_eq!(w.params()["cache_bytes"], 1280 * MIB);
    }

    /// Prints the trace statistics of every tier (run with --ignored --nocapture).
    #[test]
    #[ignore]
    fn calibrate_tiers() {
        for tier in [Tier::Tiny, Tier::Quick, Tier::Standard, Tier::Full] {
            let ov: Vec<(String, String)> = std::env::var("PROXY_SET")
                .unwrap_or_default()
                .split(',')
                .filter_map(|kv| crate::workloads::parse_override(kv).ok())
                .collect();
            let p = apply_overrides(Params::for_tier(tier), &ov).unwrap();
            let t0 = Instant::now();
            let trace = synth_trace(&p, 1).unwrap();
            let s = trace.summary(p.max_cached_object);
            println!(
                "{tier:?}: {:.2}s unique/cache {:.2} unique/requested {:.2} {s:?}",
                t0.elapsed().as_secs_f64(),
                s.unique_bytes as f64 / p.cache_bytes as f64,
                s.unique_bytes as f64 / s.requested_bytes as f64
            );
        }
    }
}

#[cfg(test)]
mod config_tests {
    use super::tests::ov;
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> Result<Params> {
        let mut p = apply_overrides(Params::for_tier(Tier::Quick), &ov(pairs))?;
        p.apply_config()?;
        apply_overrides(p, &ov(pairs))
    }

    #[test]
    fn hummingbird_configurations_set_the_regime() {
        let p = params(&[("config", "8g-256m")]).unwrap();
        assert_eq!(p.cache_bytes, 8192 * MIB);
        assert_eq!(
            p.mem_cache_bytes,
            128 * MIB,
            "half the memory, as in the paper"
        );
        assert_eq!(p.max_cached_object, 64 * KIB);
        assert_eq!(p.requests, 4_800_000);
        assert_eq!(p.config_memory().unwrap(), Some(256 * MIB));
        // Scaled: disk and trace shrink, memory does not; explicit keys still win.
        let p = params(&[("config", "4g-1g"), ("scale", "0.25"), ("seed", "9")]).unwrap();
        assert_eq!(p.cache_bytes, 1024 * MIB);
        assert_eq!(p.mem_cache_bytes, 512 * MIB);
        assert_eq!(p.requests, 1_200_000);
        assert_eq!(p.seed, 9);
        let e = params(&[("config", "2g-64m")]).unwrap_err().to_string();
        assert!(e.contains("unknown config") && e.contains("8g-256m"), "{e}");
        assert!(params(&[("config", "4g-256m"), ("scale", "0")]).is_err());
    }

    #[test]
    fn the_daemon_gets_what_the_proxy_leaves() {
        // Three eighths of the half the proxy leaves: 48 MiB of 256, 192 MiB of 1 GiB.
        let p = params(&[("config", "8g-256m")]).unwrap();
        assert_eq!(daemon_cache(&p, 256 * MIB, 64 * MIB), 48 * MIB);
        let p = params(&[("config", "4g-1g")]).unwrap();
        assert_eq!(daemon_cache(&p, 1024 * MIB, 256 * MIB), 192 * MIB);
        // A proxy that keeps little memory leaves the bench's default; a tiny limit still
        // gives the daemon what the bench's default would.
        let p = params(&[]).unwrap();
        assert_eq!(daemon_cache(&p, 1024 * MIB, 256 * MIB), 256 * MIB);
        assert_eq!(daemon_cache(&p, 4096 * MIB, 256 * MIB), 256 * MIB);
        assert_eq!(daemon_cache(&p, 32 * MIB, 16 * MIB), 16 * MIB);
    }
}
