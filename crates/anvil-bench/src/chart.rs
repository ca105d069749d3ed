//! Charts of one workload run over several targets, and the terminal tables.
//!
//! Charts, each written as `<workload>-<chart>.svg` and `.png`:
//! * `-ratio` (or `-ratio-1`, `-ratio-2`, ... when there are many metrics):
//!   grouped bars of each target's median over the baseline's, inverted for
//!   lower-is-better metrics so that above 1 is always better, on a log2 axis
//!   with a line at 1, min..max whiskers and a final geometric-mean group;
//! * `-series-<name>`: one line per target for each curve of the run
//!   (blogbench's per-interval counters, iozone's throughput per record size);
//! * `-io`: the device I/O table (reads, writes, MB, mean I/O time);
//! * `-disk-ios`: for workloads that report `disk_ios` (proxy-cache), one bar per target
//!   with its median and min..max, as Hummingbird's comparison counted them.
//!
//! Layout is computed here, never measured through a font, so SVG needs no
//! font file; PNG text needs a TrueType font, registered at run time.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::env::IoCounters;
use crate::error::{BenchError, Context, Result};
use crate::results::{ratio, BenchResults, TargetResult};

// ---------------------------------------------------------------------------
// Fonts

/// Regular and bold font files tried in order for PNG text.
const FONT_FILES: &[(&str, &str)] = &[
    (
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
    ),
    (
        "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans-Bold.ttf",
    ),
    (
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans-Bold.ttf",
    ),
    (
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans-Bold.ttf",
    ),
    (
        "/usr/local/share/fonts/DejaVuSans.ttf",
        "/usr/local/share/fonts/DejaVuSans-Bold.ttf",
    ),
    (
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Bold.ttf",
    ),
    (
        "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
        "/usr/share/fonts/liberation-sans/LiberationSans-Bold.ttf",
    ),
    (
        "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
        "/usr/share/fonts/truetype/freefont/FreeSansBold.ttf",
    ),
];

/// Environment variable naming a .ttf file to use before the usual places.
pub const FONT_ENV: &str = "ANVIL_BENCH_FONT";

static FONT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();

/// Registers a TrueType font for PNG text (once per process) and returns its
/// path, or a one-line error saying which package to install.
pub fn ensure_font() -> Result<PathBuf> {
    FONT.get_or_init(register_first_font)
        .clone()
        .map_err(BenchError)
}

fn leak(bytes: Vec<u8>) -> &'static [u8] {
    Box::leak(bytes.into_boxed_slice())
}

fn register_first_font() -> std::result::Result<PathBuf, String> {
    let mut candidates: Vec<(PathBuf, Option<PathBuf>)> = Vec::new();
    if let Some(p) = std::env::var_os(FONT_ENV) {
        candidates.push((PathBuf::from(p), None));
    }
    candidates.extend(
        FONT_FILES
            .iter()
            .map(|(r, b)| (PathBuf::from(r), Some(PathBuf::from(b)))),
    );
    for (regular, bold) in candidates {
        let Ok(bytes) = fs::read(&regular) else {
            continue;
        };
        let bytes = leak(bytes);
        if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_err() {
            continue;
        }
        let bold_ok = bold
            .and_then(|b| fs::read(b).ok())
            .map(leak)
            .is_some_and(|b| {
                plotters::style::register_font("sans-serif", FontStyle::Bold, b).is_ok()
            });
        if !bold_ok {
            // Bold falls back to the regular face.
            let _ = plotters::style::register_font("sans-serif", FontStyle::Bold, bytes);
        }
        return Ok(regular);
    }
    Err(format!(
        "PNG charts need a TrueType font: install fonts-dejavu-core (or set {FONT_ENV} to a .ttf file)"
    ))
}

// ---------------------------------------------------------------------------
// Number formatting

/// A measured value with about four significant digits ("1234.5", "0.00123").
pub fn fmt_value(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e5 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        let digits = ((2.0 - a.log10().floor()) as usize).min(9);
        format!("{v:.digits$}")
    }
}

/// A ratio such as "1.23x".
pub fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() {
        "-".into()
    } else if r >= 10.0 {
        format!("{r:.1}x")
    } else if r >= 0.1 {
        format!("{r:.2}x")
    } else {
        format!("{r:.3}x")
    }
}

/// An axis label: short, with k/M/G for large values.
fn fmt_axis(v: f64) -> String {
    let trim = |s: String| {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    let a = v.abs();
    for (scale, suffix) in [(1e9, "G"), (1e6, "M"), (1e4, "k")] {
        if a >= scale {
            let div = if suffix == "k" { 1e3 } else { scale };
            return trim(format!("{:.2}", v / div)) + suffix;
        }
    }
    if a == 0.0 {
        "0".into()
    } else if a >= 1.0 {
        trim(format!("{v:.2}"))
    } else {
        trim(format!("{v:.4}"))
    }
}

// ---------------------------------------------------------------------------
// What to draw

/// One bar of a ratio chart: a target's ratio to the baseline (above 1 is
/// better) and the ratios of its smallest and largest samples (NaN if none).
#[derive(Clone, Debug, PartialEq)]
pub struct RatioBar {
    pub target: String,
    pub ratio: f64,
    pub low: f64,
    pub high: f64,
}

/// The bars of one metric (or of the geometric mean).
#[derive(Clone, Debug, PartialEq)]
pub struct RatioGroup {
    pub label: String,
    pub bars: Vec<RatioBar>,
}

/// Per metric of the baseline, the ratio of each target that has it, with
/// whiskers from its samples ratioed to the baseline median the same way.
pub fn ratio_groups(results: &BenchResults) -> Vec<RatioGroup> {
    let Some(base) = results.target(&results.baseline) else {
        return Vec::new();
    };
    let usable = |r: f64| r.is_finite() && r > 0.0;
    base.summary
        .iter()
        .map(|bm| {
            let bars = results
                .targets
                .iter()
                .filter_map(|t| {
                    let m = t.summary.iter().find(|m| m.name == bm.name)?;
                    let r = ratio(m.median, bm.median, bm.higher_is_better);
                    if !usable(r) {
                        return None;
                    }
                    let samples: Vec<f64> = m
                        .samples
                        .iter()
                        .map(|s| ratio(*s, bm.median, bm.higher_is_better))
                        .filter(|r| usable(*r))
                        .collect();
                    let low = samples.iter().copied().fold(f64::NAN, f64::min);
                    let high = samples.iter().copied().fold(f64::NAN, f64::max);
                    Some(RatioBar {
                        target: t.fs.label.clone(),
                        ratio: r,
                        low,
                        high,
                    })
                })
                .collect();
            RatioGroup {
                label: bm.name.clone(),
                bars,
            }
        })
        .filter(|g: &RatioGroup| !g.bars.is_empty())
        .collect()
}

/// Index of the run whose primary (first) metric is closest to its median.
pub fn representative_run(t: &TargetResult) -> usize {
    let Some(m) = t.summary.first() else {
        return 0;
    };
    t.runs
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let v = r.metrics.iter().find(|x| x.name == m.name)?.value;
            Some((i, (v - m.median).abs()))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(0, |x| x.0)
}

/// Most groups (metrics plus the geomean) in one ratio chart.
pub const MAX_GROUPS: usize = 12;

struct Chart {
    /// File name without extension.
    stem: String,
    title: String,
    size: (u32, u32),
    kind: Kind,
}

enum Kind {
    Ratio(RatioChart),
    Series(SeriesChart),
    Table(TableChart),
    Bars(BarChart),
}

/// Absolute values of one metric, one bar per target.
struct BarChart {
    y_label: String,
    /// (target, colour index, median, min, max).
    bars: Vec<(String, usize, f64, f64, f64)>,
}

/// The metric drawn as absolute bars, where a workload reports it.
const BAR_METRIC: &str = "disk_ios";

struct RatioChart {
    baseline: String,
    /// Target labels with their colour index, in legend order.
    targets: Vec<(String, usize)>,
    /// Metric groups, the last one the geometric mean.
    groups: Vec<RatioGroup>,
}

struct SeriesChart {
    x_label: String,
    y_label: String,
    /// Plot log2(x) (x labelled in the original values).
    log_x: bool,
    lines: Vec<Line>,
}

/// (legend, colour index, points).
type Line = (String, usize, Vec<(f64, f64)>);

struct TableChart {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Right-align the column (numbers).
    right: Vec<bool>,
    note: String,
}

const WIDTH: u32 = 1000;

/// A file-name-safe version of `s`.
fn file_part(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        "chart".into()
    } else {
        out
    }
}

/// Splits `n` metrics into parts that leave room for the geomean group.
fn split_metrics(n: usize) -> Vec<std::ops::Range<usize>> {
    let per_chart = MAX_GROUPS - 1;
    let parts = n.div_ceil(per_chart).max(1);
    let per = n.div_ceil(parts);
    (0..parts)
        .map(|i| i * per..((i + 1) * per).min(n))
        .filter(|r| !r.is_empty())
        .collect()
}

fn charts(results: &BenchResults) -> Vec<Chart> {
    let prefix = file_part(&results.workload);
    let mut out = Vec::new();
    let colour = |label: &str| {
        results
            .targets
            .iter()
            .position(|t| t.fs.label == label)
            .unwrap_or(0)
    };

    // Ratio bars.
    let groups = ratio_groups(results);
    if !groups.is_empty() {
        let targets: Vec<(String, usize)> = results
            .targets
            .iter()
            .map(|t| t.fs.label.clone())
            .filter(|l| groups.iter().any(|g| g.bars.iter().any(|b| &b.target == l)))
            .map(|l| {
                let c = colour(&l);
                (l, c)
            })
            .collect();
        let geo: Vec<RatioBar> = results
            .geomeans()
            .into_iter()
            .filter(|(l, g)| g.is_finite() && *g > 0.0 && targets.iter().any(|t| &t.0 == l))
            .map(|(target, ratio)| RatioBar {
                target,
                ratio,
                low: f64::NAN,
                high: f64::NAN,
            })
            .collect();
        let parts = split_metrics(groups.len());
        for (i, range) in parts.iter().enumerate() {
            let mut gs = groups[range.clone()].to_vec();
            gs.push(RatioGroup {
                label: if parts.len() > 1 {
                    "geomean (all)".into()
                } else {
                    "geomean".into()
                },
                bars: geo.clone(),
            });
            let mut title = format!(
                "{}: ratio to {} (higher is better)",
                results.workload, results.baseline
            );
            let stem = if parts.len() > 1 {
                title += &format!(" [{}/{}]", i + 1, parts.len());
                format!("{prefix}-ratio-{}", i + 1)
            } else {
                format!("{prefix}-ratio")
            };
            let chart = RatioChart {
                baseline: results.baseline.clone(),
                targets: targets.clone(),
                groups: gs,
            };
            let height = 480 + ratio_label_height(&chart) + legend_height(&ratio_legend(&chart));
            out.push(Chart {
                stem,
                title,
                size: (WIDTH, height),
                kind: Kind::Ratio(chart),
            });
        }
    }

    // Time series, in the order they first appear in run 0.
    let mut names: Vec<&crate::env::Series> = Vec::new();
    for t in &results.targets {
        for s in t.runs.first().map(|r| &r.series[..]).unwrap_or(&[]) {
            if !names.iter().any(|n| n.name == s.name) {
                names.push(s);
            }
        }
    }
    for first in names {
        let mut lines = Vec::new();
        for (ti, t) in results.targets.iter().enumerate() {
            let rep = representative_run(t);
            let found = t
                .runs
                .get(rep)
                .and_then(|r| r.series.iter().find(|s| s.name == first.name))
                .map(|s| (rep, s))
                .or_else(|| {
                    t.runs
                        .first()
                        .and_then(|r| r.series.iter().find(|s| s.name == first.name))
                        .map(|s| (0, s))
                });
            let Some((run, s)) = found else { continue };
            let points: Vec<(f64, f64)> = s
                .points
                .iter()
                .copied()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            if points.len() < 2 {
                continue;
            }
            let legend = if t.runs.len() > 1 {
                format!("{} (run {})", t.fs.label, run + 1)
            } else {
                t.fs.label.clone()
            };
            lines.push((legend, ti, points));
        }
        if lines.is_empty() {
            continue;
        }
        let xs = lines.iter().flat_map(|l| l.2.iter().map(|p| p.0));
        let (xmin, xmax) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(x), b.max(x))
        });
        let log_x = xmin > 0.0 && xmax / xmin >= 32.0;
        let chart = SeriesChart {
            x_label: first.x_label.clone(),
            y_label: first.y_label.clone(),
            log_x,
            lines,
        };
        let legend: Vec<(String, usize)> = chart.lines.iter().map(|l| (l.0.clone(), l.1)).collect();
        out.push(Chart {
            stem: format!("{prefix}-series-{}", file_part(&first.name)),
            title: format!("{}: {}", results.workload, first.name),
            size: (WIDTH, 480 + legend_height(&legend)),
            kind: Kind::Series(chart),
        });
    }

    // Disk I/Os per target.
    let bars: Vec<(String, usize, f64, f64, f64)> = results
        .targets
        .iter()
        .filter_map(|t| {
            let m = t.summary.iter().find(|m| m.name == BAR_METRIC)?;
            m.median.is_finite().then(|| {
                (
                    t.fs.label.clone(),
                    colour(&t.fs.label),
                    m.median,
                    m.min,
                    m.max,
                )
            })
        })
        .collect();
    if !bars.is_empty() {
        out.push(Chart {
            stem: format!("{prefix}-disk-ios"),
            title: format!(
                "{}: disk I/Os per target (median, min..max; lower is better)",
                results.workload
            ),
            size: (WIDTH, 480),
            kind: Kind::Bars(BarChart {
                y_label: "disk I/Os (reads + writes)".into(),
                bars,
            }),
        });
    }

    // Device I/O table.
    if !results.targets.is_empty() {
        let (header, rows) = io_rows(results);
        let table = TableChart {
            right: (0..header.len()).map(|i| i >= 2).collect(),
            header,
            rows,
            note: format!(
                "Sum over all runs and phases ({} per target). Mean I/O time = (read ms + write ms) / I/Os.",
                results.runs_per_target
            ),
        };
        let (w, h) = table_size(&table);
        out.push(Chart {
            stem: format!("{prefix}-io"),
            title: format!("{}: device I/O per target", results.workload),
            size: (w, h),
            kind: Kind::Table(table),
        });
    }
    out
}

/// Header and rows of the device I/O table.
fn io_rows(results: &BenchResults) -> (Vec<String>, Vec<Vec<String>>) {
    let header = [
        "target",
        "devices",
        "reads",
        "writes",
        "MB read",
        "MB written",
        "flushes",
        "mean I/O ms",
    ]
    .map(String::from)
    .to_vec();
    let rows = results
        .targets
        .iter()
        .map(|t| {
            let io: IoCounters = results.io_total(&t.fs.label);
            let devices = if t.fs.devices.is_empty() {
                "-".to_string()
            } else {
                t.fs.devices.join(",")
            };
            let label = if t.error.is_some() {
                format!("{} (failed)", t.fs.label)
            } else {
                t.fs.label.clone()
            };
            vec![
                label,
                devices,
                io.reads.to_string(),
                io.writes.to_string(),
                format!("{:.1}", io.bytes_read() as f64 / 1e6),
                format!("{:.1}", io.bytes_written() as f64 / 1e6),
                io.flushes.to_string(),
                format!("{:.2}", io.mean_io_ms()),
            ]
        })
        .collect();
    (header, rows)
}

// ---------------------------------------------------------------------------
// Terminal tables

/// Lays out rows as fixed-width columns (first `left` columns left-aligned).
fn text_table(rows: &[Vec<String>], left: usize) -> String {
    let ncols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, w) in widths.iter().enumerate() {
            let cell = row.get(c).map_or("", String::as_str);
            if c > 0 {
                line.push_str("  ");
            }
            if c < left {
                line.push_str(&format!("{cell:<w$}"));
            } else {
                line.push_str(&format!("{cell:>w$}"));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The device I/O table for the terminal.
pub fn io_table_text(results: &BenchResults) -> String {
    let (header, rows) = io_rows(results);
    let mut all = vec![header];
    all.extend(rows);
    text_table(&all, 2)
}

/// One row per metric, one column per target: median ± relative stddev and,
/// in parentheses, the ratio to the baseline (above 1 is better); then the
/// geometric mean of the ratios, and the errors of failed targets.
pub fn summary_table_text(results: &BenchResults) -> String {
    let mut metrics: Vec<(String, String, bool)> = Vec::new();
    for t in &results.targets {
        for m in &t.summary {
            if !metrics.iter().any(|x| x.0 == m.name) {
                metrics.push((m.name.clone(), m.unit.clone(), m.higher_is_better));
            }
        }
    }
    let base = results.target(&results.baseline);
    let mut header = vec!["metric".to_string(), "unit".into(), "better".into()];
    for t in &results.targets {
        if t.fs.label == results.baseline {
            header.push(format!("{} (baseline)", t.fs.label));
        } else {
            header.push(t.fs.label.clone());
        }
    }
    let mut rows = vec![header];
    for (name, unit, hib) in &metrics {
        let bm = base.and_then(|b| b.summary.iter().find(|m| &m.name == name));
        let mut row = vec![
            name.clone(),
            unit.clone(),
            if *hib { "higher" } else { "lower" }.to_string(),
        ];
        for t in &results.targets {
            let cell = match t.summary.iter().find(|m| &m.name == name) {
                None => "-".to_string(),
                Some(m) => {
                    let mut s = format!("{} ±{:.0}%", fmt_value(m.median), m.rsd() * 100.0);
                    if let Some(bm) = bm {
                        if t.fs.label != results.baseline {
                            let r = ratio(m.median, bm.median, bm.higher_is_better);
                            s += &format!(" ({})", fmt_ratio(r));
                        }
                    }
                    s
                }
            };
            row.push(cell);
        }
        rows.push(row);
    }
    if base.is_some() {
        let geo = results.geomeans();
        let mut row = vec![
            "geomean of ratios".to_string(),
            String::new(),
            "higher".into(),
        ];
        for t in &results.targets {
            let g = geo
                .iter()
                .find(|g| g.0 == t.fs.label)
                .map_or(f64::NAN, |g| g.1);
            row.push(if g.is_finite() {
                format!("({})", fmt_ratio(g))
            } else {
                "-".into()
            });
        }
        rows.push(row);
    }
    let mut out = text_table(&rows, 3);
    for t in &results.targets {
        if let Some(e) = &t.error {
            out.push_str(&format!("{}: FAILED: {}\n", t.fs.label, e.trim()));
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Rendering

/// Renders every chart of `results` as SVG text: (title, svg).
pub fn render_svgs(results: &BenchResults) -> Result<Vec<(String, String)>> {
    charts(results)
        .iter()
        .map(|c| Ok((c.title.clone(), render_svg(c)?)))
        .collect()
}

fn render_svg(chart: &Chart) -> Result<String> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, chart.size).into_drawing_area();
        draw(chart, &root)
            .and_then(|()| root.present())
            .map_err(|e| BenchError(format!("chart {}: {e}", chart.stem)))?;
    }
    Ok(buf)
}

fn render_png(chart: &Chart, path: &Path) -> Result<()> {
    let root = BitMapBackend::new(path, chart.size).into_drawing_area();
    draw(chart, &root)
        .and_then(|()| root.present())
        .map_err(|e| BenchError(format!("{}: {e}", path.display())))
}

/// Renders every chart of `results` into `out_dir`, all as SVG and then as
/// PNG; returns the files written. Without a font the SVGs are still written
/// and the error says which package to install.
pub fn render_all(results: &BenchResults, out_dir: &Path) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(out_dir).ctx(|| format!("create {}", out_dir.display()))?;
    let charts = charts(results);
    let mut written = Vec::new();
    for c in &charts {
        let path = out_dir.join(format!("{}.svg", c.stem));
        fs::write(&path, render_svg(c)?).ctx(|| format!("write {}", path.display()))?;
        written.push(path);
    }
    ensure_font()
        .map_err(|e| BenchError(format!("{e}; the SVG charts are in {}", out_dir.display())))?;
    for c in &charts {
        let path = out_dir.join(format!("{}.png", c.stem));
        render_png(c, &path)?;
        written.push(path);
    }
    Ok(written)
}

// ---------------------------------------------------------------------------
// Drawing primitives

type DResult<DB> = std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0xba, 0xb0, 0xac),
];
const INK: RGBColor = RGBColor(0x22, 0x22, 0x22);
const MUTED: RGBColor = RGBColor(0x55, 0x55, 0x55);
const GRID: RGBColor = RGBColor(0xe0, 0xe0, 0xe0);
const STRIPE: RGBColor = RGBColor(0xf3, 0xf3, 0xf3);
const HEAD: RGBColor = RGBColor(0xdd, 0xe3, 0xea);

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Estimated width of `s` in pixels at plotters font `size` (plotters
/// draws size / 1.24 pixels per em; DejaVu Sans averages about 0.6 em per
/// character, digits 0.64).
fn text_width(s: &str, size: f64) -> f64 {
    s.chars().count() as f64 * size * 0.54
}

fn ellipsize(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

struct Label {
    size: f64,
    bold: bool,
    colour: RGBColor,
    h: HPos,
    v: VPos,
    vertical: bool,
}

impl Label {
    fn new(size: f64) -> Label {
        Label {
            size,
            bold: false,
            colour: INK,
            h: HPos::Left,
            v: VPos::Top,
            vertical: false,
        }
    }
    fn bold(mut self) -> Label {
        self.bold = true;
        self
    }
    fn colour(mut self, c: RGBColor) -> Label {
        self.colour = c;
        self
    }
    fn at(mut self, h: HPos, v: VPos) -> Label {
        self.h = h;
        self.v = v;
        self
    }
    /// Reads bottom to top.
    fn vertical(mut self) -> Label {
        self.vertical = true;
        self
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        text: &str,
        pos: (i32, i32),
    ) -> DResult<DB> {
        let font = FontDesc::new(
            FontFamily::SansSerif,
            self.size,
            if self.bold {
                FontStyle::Bold
            } else {
                FontStyle::Normal
            },
        );
        let mut style = TextStyle::from(font)
            .color(&self.colour)
            .pos(Pos::new(self.h, self.v));
        if self.vertical {
            style = style.transform(FontTransform::Rotate270);
        }
        root.draw(&Text::new(text.to_string(), pos, style))
    }
}

fn line<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    points: Vec<(i32, i32)>,
    c: RGBColor,
    width: u32,
) -> DResult<DB> {
    root.draw(&PathElement::new(points, c.stroke_width(width)))
}

fn rect<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    a: (i32, i32),
    b: (i32, i32),
    c: RGBColor,
) -> DResult<DB> {
    root.draw(&Rectangle::new([a, b], c.filled()))
}

/// Plot rectangle in pixels and the data ranges it shows.
struct Frame {
    x0: i32,
    y0: i32,
    x1: i32,
    y1: i32,
    xr: (f64, f64),
    yr: (f64, f64),
}

impl Frame {
    fn px(&self, x: f64) -> i32 {
        let f = (x - self.xr.0) / (self.xr.1 - self.xr.0);
        self.x0 + (f * f64::from(self.x1 - self.x0)).round() as i32
    }
    fn py(&self, y: f64) -> i32 {
        let f = (y - self.yr.0) / (self.yr.1 - self.yr.0);
        self.y1 - (f * f64::from(self.y1 - self.y0)).round() as i32
    }
}

/// Round tick values covering [lo, hi], at most about `max_n` of them.
fn nice_ticks(lo: f64, hi: f64, max_n: usize) -> Vec<f64> {
    if hi.is_nan() || lo.is_nan() || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / max_n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// Ticks of a log2 ratio axis spanning [lo, hi] (in log2 units): round
/// ratios when the span is small, powers of two otherwise.
fn ratio_ticks(lo: f64, hi: f64) -> Vec<(f64, String)> {
    if hi - lo <= 2.5 {
        let ticks = nice_ticks(lo.exp2(), hi.exp2(), 7);
        ticks
            .into_iter()
            .filter(|t| *t > 0.0)
            .map(|t| (t.log2(), fmt_axis(t)))
            .collect()
    } else {
        let step = ((hi - lo) / 8.0).ceil().max(1.0);
        let first = (lo / step).ceil() as i64;
        let last = (hi / step).floor() as i64;
        (first..=last)
            .map(|k| {
                let e = k as f64 * step;
                (e, fmt_axis(e.exp2()))
            })
            .collect()
    }
}

const LEGEND_TOP: i32 = 46;
const LEGEND_ROW: i32 = 24;
const LEGEND_SIZE: f64 = 15.0;

fn legend_rows(entries: &[(String, usize)], width: u32) -> Vec<Vec<(String, usize, i32)>> {
    let mut rows: Vec<Vec<(String, usize, i32)>> = vec![Vec::new()];
    let mut x = 60;
    for (label, c) in entries {
        let w = 18 + text_width(label, LEGEND_SIZE) as i32 + 22;
        if x + w > width as i32 - 20 && x > 60 {
            rows.push(Vec::new());
            x = 60;
        }
        if let Some(r) = rows.last_mut() {
            r.push((label.clone(), *c, x));
        }
        x += w;
    }
    rows
}

/// Height of the title and legend block.
fn legend_height(entries: &[(String, usize)]) -> u32 {
    let rows = legend_rows(entries, WIDTH).len() as u32;
    LEGEND_TOP as u32 + rows * LEGEND_ROW as u32 + 6
}

/// Draws the title and a legend of coloured squares; returns the height used.
fn draw_header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    entries: &[(String, usize)],
) -> std::result::Result<i32, DrawingAreaErrorKind<DB::ErrorType>> {
    let (w, _) = root.dim_in_pixel();
    Label::new(22.0)
        .bold()
        .at(HPos::Center, VPos::Top)
        .draw(root, title, (w as i32 / 2, 12))?;
    let rows = legend_rows(entries, w);
    for (i, row) in rows.iter().enumerate() {
        let y = LEGEND_TOP + i as i32 * LEGEND_ROW;
        for (label, c, x) in row {
            rect(root, (*x, y + 2), (*x + 12, y + 14), colour(*c))?;
            Label::new(LEGEND_SIZE).at(HPos::Left, VPos::Center).draw(
                root,
                label,
                (*x + 18, y + 8),
            )?;
        }
    }
    Ok(LEGEND_TOP + rows.len() as i32 * LEGEND_ROW + 6)
}

fn draw<DB: DrawingBackend>(chart: &Chart, root: &DrawingArea<DB, Shift>) -> DResult<DB> {
    root.fill(&WHITE)?;
    match &chart.kind {
        Kind::Ratio(c) => draw_ratio(root, &chart.title, c),
        Kind::Series(c) => draw_series(root, &chart.title, c),
        Kind::Table(c) => draw_table(root, &chart.title, c),
        Kind::Bars(c) => draw_bars(root, &chart.title, c),
    }
}

fn draw_bars<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    c: &BarChart,
) -> DResult<DB> {
    let (w, h) = root.dim_in_pixel();
    let top = draw_header(root, title, &[])? + 8;
    let ymax = c
        .bars
        .iter()
        .map(|b| b.4.max(b.2))
        .fold(0f64, f64::max)
        .max(1.0);
    let ticks = nice_ticks(0.0, ymax * 1.04, 8);
    let step = if ticks.len() > 1 {
        ticks[1] - ticks[0]
    } else {
        ymax
    };
    let yhi = (ymax * 1.04 / step).ceil() * step;
    let frame = Frame {
        x0: 84,
        y0: top,
        x1: w as i32 - 28,
        y1: h as i32 - 56,
        xr: (0.0, c.bars.len() as f64),
        yr: (0.0, yhi),
    };
    draw_y_grid(root, &frame)?;
    for (i, (label, ci, median, low, high)) in c.bars.iter().enumerate() {
        let (left, right) = (frame.px(i as f64 + 0.2), frame.px(i as f64 + 0.8));
        let middle = (left + right) / 2;
        rect(
            root,
            (left, frame.py(*median)),
            (right, frame.y1),
            colour(*ci),
        )?;
        if high > low {
            line(
                root,
                vec![(middle, frame.py(*low)), (middle, frame.py(*high))],
                INK,
                1,
            )?;
        }
        Label::new(14.0).at(HPos::Center, VPos::Bottom).draw(
            root,
            &format!("{median:.0}"),
            (middle, frame.py(*high) - 4),
        )?;
        Label::new(14.0).at(HPos::Center, VPos::Top).draw(
            root,
            &ellipsize(label, 24),
            (middle, frame.y1 + 7),
        )?;
    }
    draw_axes(root, &frame, &c.y_label)
}

/// Horizontal grid lines with their values at the frame's y ticks.
fn draw_y_grid<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, frame: &Frame) -> DResult<DB> {
    for t in nice_ticks(frame.yr.0, frame.yr.1, 8) {
        let y = frame.py(t);
        line(root, vec![(frame.x0, y), (frame.x1, y)], GRID, 1)?;
        Label::new(14.0).at(HPos::Right, VPos::Center).draw(
            root,
            &fmt_axis(t),
            (frame.x0 - 6, y),
        )?;
    }
    Ok(())
}

/// The y label, and the frame's left and bottom axes.
fn draw_axes<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    frame: &Frame,
    y_label: &str,
) -> DResult<DB> {
    Label::new(15.0)
        .colour(MUTED)
        .at(HPos::Center, VPos::Top)
        .vertical()
        .draw(root, y_label, (10, (frame.y0 + frame.y1) / 2))?;
    line(
        root,
        vec![
            (frame.x0, frame.y0),
            (frame.x0, frame.y1),
            (frame.x1, frame.y1),
        ],
        INK,
        1,
    )
}

// ---------------------------------------------------------------------------
// Ratio bars

const GROUP_LABEL_SIZE: f64 = 14.0;
const RATIO_LEFT: i32 = 84;
const RATIO_RIGHT: i32 = 84;

fn ratio_legend(c: &RatioChart) -> Vec<(String, usize)> {
    let geo = c.groups.last();
    c.targets
        .iter()
        .map(|(label, ci)| {
            let text = if *label == c.baseline {
                format!("{label} (baseline)")
            } else {
                match geo.and_then(|g| g.bars.iter().find(|b| &b.target == label)) {
                    Some(b) => format!("{label}: geomean {}", fmt_ratio(b.ratio)),
                    None => label.clone(),
                }
            };
            (text, *ci)
        })
        .collect()
}

fn group_labels(c: &RatioChart) -> (Vec<String>, bool) {
    let labels: Vec<String> = c.groups.iter().map(|g| ellipsize(&g.label, 34)).collect();
    let group_px = f64::from(WIDTH as i32 - RATIO_LEFT - RATIO_RIGHT) / labels.len().max(1) as f64;
    let widest = labels
        .iter()
        .map(|l| text_width(l, GROUP_LABEL_SIZE))
        .fold(0.0, f64::max);
    let vertical = widest > group_px - 8.0;
    (labels, vertical)
}

/// Height below the plot for the group labels.
fn ratio_label_height(c: &RatioChart) -> u32 {
    let (labels, vertical) = group_labels(c);
    if vertical {
        let widest = labels
            .iter()
            .map(|l| text_width(l, GROUP_LABEL_SIZE))
            .fold(0.0, f64::max);
        widest as u32 + 18
    } else {
        34
    }
}

fn draw_ratio<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    c: &RatioChart,
) -> DResult<DB> {
    let (w, h) = root.dim_in_pixel();
    let top = draw_header(root, title, &ratio_legend(c))? + 8;
    let bottom = ratio_label_height(c) as i32;
    let n = c.groups.len().max(1);
    let nslots = c.targets.len().max(1);

    let mut lo = 0f64;
    let mut hi = 0f64;
    for b in c.groups.iter().flat_map(|g| &g.bars) {
        for v in [b.ratio, b.low, b.high] {
            if v.is_finite() && v > 0.0 {
                lo = lo.min(v.log2());
                hi = hi.max(v.log2());
            }
        }
    }
    lo = lo.min(-0.33);
    hi = hi.max(0.33);
    let pad = (hi - lo) * 0.1;
    let frame = Frame {
        x0: RATIO_LEFT,
        y0: top,
        x1: w as i32 - RATIO_RIGHT,
        y1: h as i32 - bottom,
        xr: (0.0, n as f64),
        yr: (lo - pad, hi + pad),
    };

    // Grid and y labels.
    for (t, label) in ratio_ticks(frame.yr.0, frame.yr.1) {
        let y = frame.py(t);
        line(root, vec![(frame.x0, y), (frame.x1, y)], GRID, 1)?;
        Label::new(14.0)
            .at(HPos::Right, VPos::Center)
            .draw(root, &label, (frame.x0 - 6, y))?;
    }
    Label::new(15.0)
        .at(HPos::Center, VPos::Top)
        .vertical()
        .colour(MUTED)
        .draw(
            root,
            &format!("ratio to {} (log scale)", c.baseline),
            (10, (frame.y0 + frame.y1) / 2),
        )?;
    // Separator before the geomean group.
    if n > 1 {
        let x = frame.px((n - 1) as f64);
        line(root, vec![(x, frame.y0), (x, frame.y1)], GRID, 2)?;
    }

    let zero = frame.py(0.0);
    line(root, vec![(frame.x0, zero), (frame.x1, zero)], INK, 2)?;

    // Bars, whiskers and values.
    let slot = 0.8 / nslots as f64;
    let slot_px = f64::from(frame.x1 - frame.x0) / n as f64 * slot;
    for (gi, g) in c.groups.iter().enumerate() {
        for b in &g.bars {
            let Some(si) = c.targets.iter().position(|t| t.0 == b.target) else {
                continue;
            };
            let col = colour(c.targets[si].1);
            let left = gi as f64 + 0.1 + si as f64 * slot;
            let (x0, x1) = (frame.px(left + slot * 0.08), frame.px(left + slot * 0.92));
            let y = b.ratio.log2();
            let py = frame.py(y);
            if (py - zero).abs() < 2 {
                rect(root, (x0, py - 2), (x1, py + 2), col)?;
            } else {
                rect(root, (x0, py.min(zero)), (x1, py.max(zero)), col)?;
            }
            let xc = (x0 + x1) / 2;
            if b.low.is_finite() && b.high.is_finite() && b.high > b.low {
                let (ylo, yhi) = (frame.py(b.low.log2()), frame.py(b.high.log2()));
                let cap = ((x1 - x0) / 4).max(2);
                line(root, vec![(xc, ylo), (xc, yhi)], INK, 1)?;
                line(root, vec![(xc - cap, ylo), (xc + cap, ylo)], INK, 1)?;
                line(root, vec![(xc - cap, yhi), (xc + cap, yhi)], INK, 1)?;
            }
            if slot_px >= 34.0 {
                let label = Label::new(12.0).colour(MUTED);
                let text = fmt_ratio(b.ratio);
                if y >= 0.0 {
                    let top = if b.high.is_finite() {
                        py.min(frame.py(b.high.log2()))
                    } else {
                        py
                    };
                    label
                        .at(HPos::Center, VPos::Bottom)
                        .draw(root, &text, (xc, top - 2))?;
                } else {
                    let bot = if b.low.is_finite() {
                        py.max(frame.py(b.low.log2()))
                    } else {
                        py
                    };
                    label
                        .at(HPos::Center, VPos::Top)
                        .draw(root, &text, (xc, bot + 3))?;
                }
            }
        }
    }

    // The 1.0 line, the axes.
    Label::new(14.0)
        .colour(MUTED)
        .at(HPos::Left, VPos::Center)
        .draw(root, &ellipsize(&c.baseline, 10), (frame.x1 + 5, zero))?;
    line(
        root,
        vec![
            (frame.x0, frame.y0),
            (frame.x0, frame.y1),
            (frame.x1, frame.y1),
        ],
        INK,
        1,
    )?;

    // Group labels.
    let (labels, vertical) = group_labels(c);
    for (gi, label) in labels.iter().enumerate() {
        let x = frame.px(gi as f64 + 0.5);
        let mut style = Label::new(GROUP_LABEL_SIZE);
        if gi + 1 == labels.len() {
            style = style.bold();
        }
        if vertical {
            style
                .vertical()
                .at(HPos::Right, VPos::Center)
                .draw(root, label, (x, frame.y1 + 6))?;
        } else {
            style
                .at(HPos::Center, VPos::Top)
                .draw(root, label, (x, frame.y1 + 8))?;
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Time series

fn draw_series<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    c: &SeriesChart,
) -> DResult<DB> {
    let (w, h) = root.dim_in_pixel();
    let legend: Vec<(String, usize)> = c.lines.iter().map(|l| (l.0.clone(), l.1)).collect();
    let top = draw_header(root, title, &legend)? + 8;
    let tx = |x: f64| if c.log_x { x.log2() } else { x };
    let pts = || c.lines.iter().flat_map(|l| l.2.iter());
    let (mut xmin, mut xmax, mut ymin, mut ymax) =
        (f64::INFINITY, f64::NEG_INFINITY, 0f64, f64::NEG_INFINITY);
    for (x, y) in pts() {
        xmin = xmin.min(tx(*x));
        xmax = xmax.max(tx(*x));
        ymin = ymin.min(*y);
        ymax = ymax.max(*y);
    }
    if xmax.is_nan() || xmax <= xmin {
        xmax = xmin + 1.0;
    }
    if ymax.is_nan() || ymax <= ymin {
        ymax = ymin + 1.0;
    }
    let yticks = nice_ticks(ymin, ymax + (ymax - ymin) * 0.04, 8);
    let ystep = if yticks.len() > 1 {
        yticks[1] - yticks[0]
    } else {
        ymax - ymin
    };
    let ylo = (ymin / ystep).floor() * ystep;
    let yhi = ((ymax + (ymax - ymin) * 0.04) / ystep).ceil() * ystep;
    let frame = Frame {
        x0: 84,
        y0: top,
        x1: w as i32 - 28,
        y1: h as i32 - 56,
        xr: (xmin, xmax),
        yr: (ylo, yhi),
    };

    draw_y_grid(root, &frame)?;
    let xticks: Vec<(f64, String)> = if c.log_x {
        let step = ((xmax - xmin) / 10.0).ceil().max(1.0);
        let first = (xmin / step).ceil() as i64;
        let last = (xmax / step).floor() as i64;
        (first..=last)
            .map(|k| {
                let e = k as f64 * step;
                (e, fmt_axis(e.exp2()))
            })
            .collect()
    } else {
        nice_ticks(xmin, xmax, 10)
            .into_iter()
            .map(|t| (t, fmt_axis(t)))
            .collect()
    };
    for (t, label) in xticks {
        let x = frame.px(t);
        line(root, vec![(x, frame.y0), (x, frame.y1)], GRID, 1)?;
        line(root, vec![(x, frame.y1), (x, frame.y1 + 4)], INK, 1)?;
        Label::new(14.0)
            .at(HPos::Center, VPos::Top)
            .draw(root, &label, (x, frame.y1 + 7))?;
    }
    let x_desc = if c.log_x {
        format!("{} (log scale)", c.x_label)
    } else {
        c.x_label.clone()
    };
    Label::new(15.0)
        .colour(MUTED)
        .at(HPos::Center, VPos::Bottom)
        .draw(root, &x_desc, ((frame.x0 + frame.x1) / 2, h as i32 - 8))?;
    draw_axes(root, &frame, &c.y_label)?;

    for (_, ci, points) in &c.lines {
        let col = colour(*ci);
        let px: Vec<(i32, i32)> = points
            .iter()
            .map(|(x, y)| (frame.px(tx(*x)), frame.py(*y)))
            .collect();
        line(root, px.clone(), col, 2)?;
        if points.len() <= 60 {
            for p in px {
                root.draw(&Circle::new(p, 3, col.filled()))?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Tables as images

const CELL_SIZE: f64 = 15.0;
const ROW_H: i32 = 26;
const TABLE_TOP: i32 = 50;

fn table_columns(t: &TableChart) -> Vec<i32> {
    (0..t.header.len())
        .map(|c| {
            std::iter::once(&t.header[c])
                .chain(t.rows.iter().filter_map(|r| r.get(c)))
                .map(|s| text_width(s, CELL_SIZE) as i32)
                .max()
                .unwrap_or(0)
                + 24
        })
        .collect()
}

fn table_size(t: &TableChart) -> (u32, u32) {
    let width: i32 = table_columns(t).iter().sum::<i32>() + 40;
    let note_w = text_width(&t.note, 12.0) as i32 + 40;
    let height = TABLE_TOP + ROW_H * (t.rows.len() as i32 + 1) + 40;
    (width.max(note_w).max(640) as u32, height as u32)
}

fn draw_table<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    t: &TableChart,
) -> DResult<DB> {
    let (w, _) = root.dim_in_pixel();
    Label::new(22.0)
        .bold()
        .at(HPos::Center, VPos::Top)
        .draw(root, title, (w as i32 / 2, 12))?;
    let cols = table_columns(t);
    let total: i32 = cols.iter().sum();
    let x0 = (w as i32 - total) / 2;
    let all = std::iter::once(&t.header).chain(&t.rows);
    for (ri, row) in all.enumerate() {
        let y = TABLE_TOP + ri as i32 * ROW_H;
        if ri == 0 {
            rect(root, (x0, y), (x0 + total, y + ROW_H), HEAD)?;
        } else if ri % 2 == 0 {
            rect(root, (x0, y), (x0 + total, y + ROW_H), STRIPE)?;
        }
        let mut x = x0;
        for (ci, width) in cols.iter().enumerate() {
            let cell = row.get(ci).map_or("", String::as_str);
            let mut style = Label::new(CELL_SIZE);
            if ri == 0 {
                style = style.bold();
            }
            let right = t.right.get(ci).copied().unwrap_or(false);
            if right {
                style.at(HPos::Right, VPos::Center).draw(
                    root,
                    cell,
                    (x + width - 12, y + ROW_H / 2),
                )?;
            } else {
                style
                    .at(HPos::Left, VPos::Center)
                    .draw(root, cell, (x + 12, y + ROW_H / 2))?;
            }
            x += width;
        }
    }
    let bottom = TABLE_TOP + ROW_H * (t.rows.len() as i32 + 1);
    line(root, vec![(x0, bottom), (x0 + total, bottom)], INK, 1)?;
    Label::new(14.0)
        .colour(MUTED)
        .at(HPos::Left, VPos::Top)
        .draw(root, &t.note, (x0.min(20), bottom + 10))?;
    Ok(())
}

// ---------------------------------------------------------------------------

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::env::{Metric, Phase, RunOutput, Series};
    use crate::results::{summarize, FsInfo, Host, SCHEMA_VERSION};

    fn run(scale: f64, i: u32) -> RunOutput {
        let k = 1.0 + f64::from(i) * 0.04;
        RunOutput {
            metrics: vec![
                Metric::higher("final_reads", "reads", 120_000.0 * scale * k),
                Metric::higher("final_writes", "writes", 900.0 * scale / k),
                Metric::lower("wall", "s", 12.5 / scale * k),
            ],
            phases: vec![Phase {
                name: "write".into(),
                wall_s: 12.5,
                io: IoCounters {
                    reads: 100,
                    read_sectors: 20480,
                    read_ms: 50,
                    writes: 300,
                    write_sectors: 81920,
                    write_ms: 350,
                    flushes: 7,
                },
                ..Default::default()
            }],
            series: vec![Series {
                name: "articles_read".into(),
                x_label: "time (s)".into(),
                y_label: "articles read per interval".into(),
                points: (0..12)
                    .map(|t| {
                        (
                            f64::from(t) * 10.0,
                            1000.0 * scale * (1.0 + f64::from(t) * 0.1) * k,
                        )
                    })
                    .collect(),
            }],
            text: format!(
                "Frequency = 10 secs\nFinal score for reads : {}\n",
                120_000.0 * scale
            ),
            errors: 0,
            extra: serde_json::Value::Null,
            ..Default::default()
        }
    }

    fn target(label: &str, scale: f64) -> TargetResult {
        let runs = vec![run(scale, 0), run(scale, 1)];
        TargetResult {
            fs: FsInfo {
                label: label.into(),
                fs_type: label.split('-').next().unwrap_or(label).into(),
                mkfs: Some(format!("mkfs.{label} /dev/loop3")),
                mount_opts: Some("noatime".into()),
                devices: vec!["loop3".into()],
                size_bytes: 8 << 30,
                path: Some("/mnt/bench".into()),
                transport: None,
            },
            summary: summarize(&runs),
            runs,
            error: None,
        }
    }

    /// Two targets with two runs each, and one target that failed.
    pub(crate) fn fixture() -> BenchResults {
        BenchResults {
            schema_version: SCHEMA_VERSION,
            suite_version: "0.1.0".into(),
            workload: "blogbench".into(),
            tier: "quick".into(),
            params: serde_json::json!({"iterations": 30, "writers": 3}),
            runs_per_target: 2,
            seed: 42,
            baseline: "ext4".into(),
            host: Host {
                kernel: "6.18.0".into(),
                cpus: 2,
                mem_bytes: 24 << 30,
                mem_limit_bytes: Some(1 << 30),
                cgroup: "v1".into(),
                drop_caches: true,
            },
            started_unix: 1_760_000_000,
            targets: vec![
                target("ext4", 1.0),
                target("btrfs-zstd", 0.8),
                target("anvil", 1.3),
                TargetResult {
                    fs: FsInfo {
                        label: "xfs".into(),
                        fs_type: "xfs".into(),
                        ..Default::default()
                    },
                    runs: Vec::new(),
                    summary: Vec::new(),
                    error: Some("mkfs.xfs: command not found".into()),
                },
            ],
        }
    }

    #[test]
    fn baseline_ratio_is_one_and_lower_is_better_inverts() {
        let r = fixture();
        let groups = ratio_groups(&r);
        assert_eq!(groups.len(), 3);
        for g in &groups {
            let base = g.bars.iter().find(|b| b.target == "ext4").unwrap();
            assert!((base.ratio - 1.0).abs() < 1e-12, "{g:?}");
            let anvil = g.bars.iter().find(|b| b.target == "anvil").unwrap();
            assert!(anvil.ratio > 1.0, "{g:?}");
            assert!(anvil.low <= anvil.ratio && anvil.ratio <= anvil.high);
            assert!(!g.bars.iter().any(|b| b.target == "xfs"));
        }
        // Consistent with BenchResults::ratios.
        for ((name, row), g) in r.ratios().iter().zip(&groups) {
            assert_eq!(name, &g.label);
            for (label, v) in row {
                let b = g.bars.iter().find(|b| &b.target == label).unwrap();
                assert!((b.ratio - v).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn chart_render_all_writes_svg_and_png() {
        let r = fixture();
        let dir = tempfile::TempDir::new().unwrap();
        let result = render_all(&r, dir.path());
        let svgs = [
            "blogbench-ratio.svg",
            "blogbench-series-articles_read.svg",
            "blogbench-io.svg",
        ];
        for name in svgs {
            let text = fs::read_to_string(dir.path().join(name)).unwrap();
            assert!(text.contains("<svg"), "{name}");
        }
        let ratio_svg = fs::read_to_string(dir.path().join(svgs[0])).unwrap();
        assert!(ratio_svg.contains("geomean"));
        assert!(ratio_svg.contains("btrfs-zstd"));
        match ensure_font() {
            Err(e) => {
                eprintln!("note: no font, PNG checks skipped: {e}");
                assert!(result.unwrap_err().0.contains("fonts-dejavu-core"));
            }
            Ok(_) => {
                let files = result.unwrap();
                assert_eq!(files.len(), 2 * svgs.len());
                for name in svgs {
                    let png = dir.path().join(name.replace(".svg", ".png"));
                    let bytes = fs::read(&png).unwrap();
                    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", png.display());
                    assert!(files.contains(&png));
                }
            }
        }
    }

    #[test]
    fn disk_io_bars_appear_where_a_workload_counts_disk_ios() {
        use crate::results::MetricSummary;
        let mut r = fixture();
        assert!(!charts(&r).iter().any(|c| c.stem.ends_with("-disk-ios")));
        for (i, t) in r.targets.iter_mut().enumerate() {
            t.summary.push(MetricSummary {
                name: "disk_ios".into(),
                unit: "I/Os".into(),
                higher_is_better: false,
                n: 2,
                median: 1000.0 * (i + 1) as f64,
                mean: 1000.0 * (i + 1) as f64,
                stddev: 0.0,
                min: 900.0 * (i + 1) as f64,
                max: 1100.0 * (i + 1) as f64,
                samples: vec![1000.0 * (i + 1) as f64; 2],
            });
        }
        r.workload = "proxy-cache".into();
        let all = charts(&r);
        let chart = all
            .iter()
            .find(|c| c.stem == "proxy-cache-disk-ios")
            .expect("a disk I/O chart");
        let Kind::Bars(bars) = &chart.kind else {
            panic!("not bars")
        };
        // Every target with a median, the failed one too (it has a summary here).
        assert_eq!(bars.bars.len(), r.targets.len());
        assert_eq!(bars.bars[1].2, 2000.0);
        let svg = render_svg(chart).unwrap();
        assert!(svg.contains("btrfs-zstd") && svg.contains("2000"), "{svg}");
    }

    /// Renders the fixture into $TMPDIR/anvil-bench-chart-preview to look at.
    #[test]
    #[ignore]
    fn chart_preview() {
        let dir = std::env::temp_dir().join("anvil-bench-chart-preview");
        let mut r = fixture();
        for f in render_all(&r, &dir).unwrap() {
            println!("{}", f.display());
        }
        r.workload = "iozone".into();
        for t in &mut r.targets {
            for (i, run) in t.runs.iter_mut().enumerate() {
                for m in 0..14 {
                    let v = 100.0 + (m * 7 % 5) as f64 * t.fs.label.len() as f64 + i as f64 * 3.0;
                    run.metrics
                        .push(Metric::higher(format!("write_kBps@{m}k/256m"), "kB/s", v));
                }
                run.series = vec![Series {
                    name: "write_kBps_vs_record".into(),
                    x_label: "record size (kB)".into(),
                    y_label: "write kB/s".into(),
                    points: (2..14)
                        .map(|k| {
                            (
                                f64::from(1 << k),
                                50_000.0 * f64::from(k) * t.fs.label.len() as f64,
                            )
                        })
                        .collect(),
                }];
            }
            t.summary = summarize(&t.runs);
        }
        for f in render_all(&r, &dir).unwrap() {
            println!("{}", f.display());
        }
    }

    #[test]
    fn chart_many_metrics_split() {
        let mut r = fixture();
        for t in &mut r.targets {
            for (i, run) in t.runs.iter_mut().enumerate() {
                for m in 0..30 {
                    let v = 100.0 + m as f64 + i as f64 + t.fs.label.len() as f64;
                    run.metrics
                        .push(Metric::higher(format!("write_kBps@{m}k/256m"), "kB/s", v));
                }
            }
            t.summary = summarize(&t.runs);
        }
        let charts = charts(&r);
        let ratio: Vec<&RatioChart> = charts
            .iter()
            .filter_map(|c| match &c.kind {
                Kind::Ratio(rc) => Some(rc),
                _ => None,
            })
            .collect();
        assert!(ratio.len() >= 3);
        let metrics: usize = ratio.iter().map(|c| c.groups.len() - 1).sum();
        assert_eq!(metrics, 33);
        for c in &ratio {
            assert!(c.groups.len() <= MAX_GROUPS);
            assert!(c.groups.last().unwrap().label.starts_with("geomean"));
        }
        assert!(charts.iter().any(|c| c.stem == "blogbench-ratio-2"));
        let svgs = render_svgs(&r).unwrap();
        assert!(svgs.iter().all(|(_, s)| s.contains("<svg")));
    }

    #[test]
    fn chart_summary_and_io_text() {
        let r = fixture();
        let text = summary_table_text(&r);
        for name in [
            "final_reads",
            "final_writes",
            "wall",
            "geomean",
            "ext4 (baseline)",
            "anvil",
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
        assert!(text.contains("xfs: FAILED: mkfs.xfs"));
        assert!(text.contains('±') && text.contains("x)"));
        let io = io_table_text(&r);
        assert!(io.contains("mean I/O ms") && io.contains("loop3"));
        // 2 runs x 100 reads, 2 x 20480 sectors = 20.97 MB.
        assert!(io.contains(" 200 ") && io.contains("21.0"), "{io}");
        let cols: Vec<usize> = io.lines().filter_map(|l| l.find("loop3")).collect();
        assert_eq!(cols.len(), 3);
        assert!(cols.iter().all(|c| *c == cols[0]), "{io}");
    }

    #[test]
    fn chart_formatting_and_ticks() {
        assert_eq!(fmt_value(1234.54), "1234.5");
        assert_eq!(fmt_value(0.00123), "0.00123");
        assert_eq!(fmt_ratio(1.0), "1.00x");
        assert_eq!(fmt_axis(25_000.0), "25k");
        assert_eq!(fmt_axis(1_500_000.0), "1.5M");
        assert_eq!(
            nice_ticks(0.0, 10.0, 5),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        let t = ratio_ticks(-1.0, 1.0);
        assert!(t.iter().any(|(v, l)| *v == 0.0 && l == "1"));
        let t = ratio_ticks(-4.0, 4.0);
        assert!(t.iter().any(|(_, l)| l == "0.0625" || l == "0.25"));
        assert_eq!(split_metrics(11), vec![0..11]);
        assert_eq!(split_metrics(12).len(), 2);
        assert_eq!(file_part("a/b c"), "a_b_c");
    }
}
