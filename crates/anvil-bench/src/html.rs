//! The HTML report: one self-contained page (inline CSS, charts as inline
//! SVG) with a section per workload: parameters, host and conditions,
//! targets, the summary table, charts, device I/O, each run's own text
//! output, and the errors of targets that failed.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use crate::chart;
use crate::error::{Context, Result};
use crate::results::{ratio, BenchResults, FsInfo, TargetResult};

/// Escapes text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const CSS: &str = r#"
body { font-family: system-ui, -apple-system, "DejaVu Sans", sans-serif; margin: 2em auto; max-width: 1100px; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { font-size: 1.7em; margin-bottom: .2em; }
h2 { border-bottom: 2px solid #4e79a7; padding-bottom: .2em; margin-top: 2.5em; }
h3 { margin-top: 1.6em; }
table { border-collapse: collapse; margin: .5em 0 1em; font-size: .92em; }
th, td { border: 1px solid #d4d4d4; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #dde3ea; }
tr:nth-child(even) td { background: #f6f6f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.better { color: #1a7f37; font-weight: 600; }
td.worse { color: #b42318; font-weight: 600; }
tr.geomean td { border-top: 2px solid #888; font-weight: 600; }
pre { background: #f6f8fa; border: 1px solid #ddd; padding: .6em; overflow-x: auto; font-size: .85em; }
code { font-size: .9em; }
details { margin: .4em 0; }
summary { cursor: pointer; }
figure { margin: 1em 0 2em; }
figure svg { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: .9em; }
.error { background: #fdecea; border: 1px solid #f5c2c0; color: #7a1c16; padding: .5em .8em; margin: .5em 0; }
.meta { color: #555; }
nav ul { columns: 2; }
"#;

/// Writes one HTML page with the tables and charts of all `results`.
pub fn write_report(results: &[BenchResults], out: &Path) -> Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).ctx(|| format!("create {}", dir.display()))?;
    }
    fs::write(out, report_html(results)).ctx(|| format!("write {}", out.display()))
}

/// The HTML page of [`write_report`].
pub fn report_html(results: &[BenchResults]) -> String {
    let mut h = String::new();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    h.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let names: Vec<&str> = results.iter().map(|r| r.workload.as_str()).collect();
    let _ = writeln!(
        h,
        "<title>anvil bench: {}</title>\n<style>{CSS}</style>\n</head>\n<body>",
        escape(&names.join(", "))
    );
    h.push_str("<h1>anvil bench report</h1>\n");
    if let Some(first) = results.first() {
        let _ = writeln!(
            h,
            "<p class=\"meta\">suite {} &middot; {} workload(s). Ratios are to the baseline and above 1 is better \
             (target/baseline when higher is better, baseline/target when lower is better); \
             &plusmn; is the relative standard deviation over runs.</p>",
            escape(&first.suite_version),
            results.len()
        );
    }
    if results.len() > 1 {
        h.push_str("<nav><ul>\n");
        for (i, r) in results.iter().enumerate() {
            let _ = writeln!(
                h,
                "<li><a href=\"#w{i}\">{}</a> ({})</li>",
                escape(&r.workload),
                escape(&geomean_line(r))
            );
        }
        h.push_str("</ul></nav>\n");
    }
    for (i, r) in results.iter().enumerate() {
        section(&mut h, i, r);
    }
    h.push_str("</body>\n</html>\n");
    h
}

/// "btrfs 0.91x, anvil 1.20x" (geometric means of ratios, baseline left out).
fn geomean_line(r: &BenchResults) -> String {
    let parts: Vec<String> = r
        .geomeans()
        .into_iter()
        .filter(|(l, g)| *l != r.baseline && g.is_finite())
        .map(|(l, g)| format!("{l} {}", chart::fmt_ratio(g)))
        .collect();
    if parts.is_empty() {
        format!("baseline {}", r.baseline)
    } else {
        format!("vs {}: {}", r.baseline, parts.join(", "))
    }
}

fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Unix time as "YYYY-MM-DD hh:mm:ss UTC".
fn utc(t: u64) -> String {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// Mount options, and an anvil mount's transport after them.
fn mount_opts(fs: &FsInfo) -> String {
    match &fs.transport {
        Some(t) => {
            let opts = fs
                .mount_opts
                .as_deref()
                .map(|o| format!("{o}, "))
                .unwrap_or_default();
            format!("<code>{}transport: {}</code>", escape(&opts), escape(t))
        }
        None => opt(&fs.mount_opts),
    }
}

fn opt(s: &Option<String>) -> String {
    s.as_deref().map_or_else(
        || "&ndash;".to_string(),
        |v| format!("<code>{}</code>", escape(v)),
    )
}

fn row(h: &mut String, cells: &[(String, &str)]) {
    h.push_str("<tr>");
    for (text, class) in cells {
        if class.is_empty() {
            let _ = write!(h, "<td>{text}</td>");
        } else {
            let _ = write!(h, "<td class=\"{class}\">{text}</td>");
        }
    }
    h.push_str("</tr>\n");
}

fn header(h: &mut String, cols: &[&str]) {
    h.push_str("<tr>");
    for c in cols {
        let _ = write!(h, "<th>{}</th>", escape(c));
    }
    h.push_str("</tr>\n");
}

fn section(h: &mut String, i: usize, r: &BenchResults) {
    let _ = writeln!(h, "<section id=\"w{i}\">\n<h2>{}</h2>", escape(&r.workload));
    let _ = writeln!(
        h,
        "<p class=\"meta\">tier {} &middot; {} run(s) per target &middot; seed {} &middot; baseline <b>{}</b> \
         &middot; started {} &middot; suite {} (results schema {})</p>",
        escape(&r.tier),
        r.runs_per_target,
        r.seed,
        escape(&r.baseline),
        utc(r.started_unix),
        escape(&r.suite_version),
        r.schema_version
    );

    // Parameters.
    let params = serde_json::to_string_pretty(&r.params).unwrap_or_else(|e| e.to_string());
    let _ = writeln!(
        h,
        "<details><summary>Parameters</summary>\n<pre>{}</pre>\n</details>",
        escape(&params)
    );

    // Host and conditions.
    h.push_str("<h3>Host and conditions</h3>\n<table>\n");
    let host = &r.host;
    let rows = [
        ("kernel", escape(&host.kernel)),
        ("CPUs", host.cpus.to_string()),
        ("memory", bytes(host.mem_bytes)),
        (
            "memory limit",
            host.mem_limit_bytes
                .map_or_else(|| "none".to_string(), bytes),
        ),
        ("cgroup", escape(&host.cgroup)),
        (
            "caches dropped between phases",
            if host.drop_caches { "yes" } else { "no" }.to_string(),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(h, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    h.push_str("</table>\n");

    // Targets.
    h.push_str("<h3>Targets</h3>\n<table>\n");
    header(
        h,
        &[
            "label",
            "fs type",
            "mkfs",
            "mount options",
            "devices",
            "size",
            "path",
            "runs",
            "status",
        ],
    );
    for t in &r.targets {
        let mut label = escape(&t.fs.label);
        if t.fs.label == r.baseline {
            label += " (baseline)";
        }
        let status = if t.error.is_some() { "failed" } else { "ok" };
        row(
            h,
            &[
                (label, ""),
                (escape(&t.fs.fs_type), ""),
                (opt(&t.fs.mkfs), ""),
                (mount_opts(&t.fs), ""),
                (escape(&t.fs.devices.join(", ")), ""),
                (
                    if t.fs.size_bytes > 0 {
                        bytes(t.fs.size_bytes)
                    } else {
                        "&ndash;".into()
                    },
                    "num",
                ),
                (opt(&t.fs.path), ""),
                (t.runs.len().to_string(), "num"),
                (status.into(), if t.error.is_some() { "worse" } else { "" }),
            ],
        );
    }
    h.push_str("</table>\n");
    for t in &r.targets {
        if let Some(e) = &t.error {
            let _ = writeln!(
                h,
                "<div class=\"error\"><b>{} failed:</b> {}</div>",
                escape(&t.fs.label),
                escape(e)
            );
        }
    }

    summary(h, r);

    // Charts.
    h.push_str("<h3>Charts</h3>\n");
    match chart::render_svgs(r) {
        Ok(svgs) if svgs.is_empty() => h.push_str("<p>No data to chart.</p>\n"),
        Ok(svgs) => {
            for (title, svg) in svgs {
                let svg = svg.trim_start();
                let svg = match svg.strip_prefix("<?xml") {
                    Some(rest) => rest.split_once("?>").map_or(rest, |x| x.1),
                    None => svg,
                };
                let _ = writeln!(
                    h,
                    "<figure>\n{}\n<figcaption>{}</figcaption>\n</figure>",
                    svg.trim(),
                    escape(&title)
                );
            }
        }
        Err(e) => {
            let _ = writeln!(h, "<div class=\"error\">charts: {}</div>", escape(&e.0));
        }
    }

    // Device I/O.
    h.push_str("<h3>Device I/O</h3>\n<table>\n");
    header(
        h,
        &[
            "target",
            "devices",
            "reads",
            "writes",
            "MB read",
            "MB written",
            "flushes",
            "mean I/O ms",
        ],
    );
    for t in &r.targets {
        let io = r.io_total(&t.fs.label);
        row(
            h,
            &[
                (escape(&t.fs.label), ""),
                (escape(&t.fs.devices.join(", ")), ""),
                (io.reads.to_string(), "num"),
                (io.writes.to_string(), "num"),
                (format!("{:.1}", io.bytes_read() as f64 / 1e6), "num"),
                (format!("{:.1}", io.bytes_written() as f64 / 1e6), "num"),
                (io.flushes.to_string(), "num"),
                (format!("{:.2}", io.mean_io_ms()), "num"),
            ],
        );
    }
    h.push_str(
        "</table>\n<p class=\"meta\">Summed over all runs and phases. Mean I/O time = (read ms + write ms) / I/Os, as iostat computes it.</p>\n",
    );

    runs(h, r);
    h.push_str("</section>\n");
}

/// The summary table: a row per metric and target.
fn summary(h: &mut String, r: &BenchResults) {
    h.push_str("<h3>Summary</h3>\n");
    let base = r.target(&r.baseline);
    let mut names: Vec<(String, String, bool)> = Vec::new();
    for t in &r.targets {
        for m in &t.summary {
            if !names.iter().any(|n| n.0 == m.name) {
                names.push((m.name.clone(), m.unit.clone(), m.higher_is_better));
            }
        }
    }
    if names.is_empty() {
        h.push_str("<p>No metrics.</p>\n");
        return;
    }
    h.push_str("<table>\n");
    header(
        h,
        &[
            "metric", "unit", "better", "target", "median", "stddev", "min", "max", "n", "ratio",
        ],
    );
    let fmt = chart::fmt_value;
    for (name, unit, hib) in &names {
        let bm = base.and_then(|b| b.summary.iter().find(|m| &m.name == name));
        let with: Vec<(&TargetResult, _)> = r
            .targets
            .iter()
            .filter_map(|t| Some((t, t.summary.iter().find(|m| &m.name == name)?)))
            .collect();
        for (k, (t, m)) in with.iter().enumerate() {
            let (rtext, class) = match bm {
                Some(bm) if t.fs.label != r.baseline => {
                    let x = ratio(m.median, bm.median, bm.higher_is_better);
                    let class = if x > 1.02 {
                        "num better"
                    } else if x < 0.98 {
                        "num worse"
                    } else {
                        "num"
                    };
                    (chart::fmt_ratio(x), class)
                }
                Some(_) => ("baseline".to_string(), "num"),
                None => ("&ndash;".to_string(), "num"),
            };
            h.push_str("<tr>");
            if k == 0 {
                let span = with.len();
                let _ = write!(
                    h,
                    "<td rowspan=\"{span}\"><b>{}</b></td><td rowspan=\"{span}\">{}</td><td rowspan=\"{span}\">{}</td>",
                    escape(name),
                    escape(unit),
                    if *hib { "higher" } else { "lower" }
                );
            }
            let _ = writeln!(
                h,
                "<td>{}</td><td class=\"num\">{}</td><td class=\"num\">{} ({:.1}%)</td><td class=\"num\">{}</td>\
                 <td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"{class}\">{rtext}</td></tr>",
                escape(&t.fs.label),
                fmt(m.median),
                fmt(m.stddev),
                m.rsd() * 100.0,
                fmt(m.min),
                fmt(m.max),
                m.n,
            );
        }
    }
    if base.is_some() {
        let geo = r.geomeans();
        let shown: Vec<&(String, f64)> = geo.iter().filter(|g| g.1.is_finite()).collect();
        for (k, (label, g)) in shown.iter().enumerate() {
            h.push_str("<tr class=\"geomean\">");
            if k == 0 {
                let _ = write!(
                    h,
                    "<td rowspan=\"{}\" colspan=\"3\">geometric mean of ratios</td>",
                    shown.len()
                );
            }
            let class = if *g > 1.02 {
                "num better"
            } else if *g < 0.98 {
                "num worse"
            } else {
                "num"
            };
            let _ = writeln!(
                h,
                "<td>{}</td><td colspan=\"5\"></td><td class=\"{class}\">{}</td></tr>",
                escape(label),
                chart::fmt_ratio(*g)
            );
        }
    }
    h.push_str("</table>\n");
    let _ = writeln!(
        h,
        "<details><summary>Terminal table</summary>\n<pre>{}</pre>\n</details>",
        escape(&chart::summary_table_text(r))
    );
}

/// Each run's phases and its own text report.
fn runs(h: &mut String, r: &BenchResults) {
    if r.targets.iter().all(|t| t.runs.is_empty()) {
        return;
    }
    h.push_str("<h3>Runs</h3>\n");
    for t in &r.targets {
        for (i, run) in t.runs.iter().enumerate() {
            let _ = writeln!(
                h,
                "<details><summary>{} &middot; run {}{}</summary>",
                escape(&t.fs.label),
                i + 1,
                if run.errors > 0 {
                    format!(" &middot; {} failed operations", run.errors)
                } else {
                    String::new()
                }
            );
            if !run.phases.is_empty() {
                h.push_str("<table>\n");
                header(
                    h,
                    &[
                        "phase",
                        "wall s",
                        "user s",
                        "sys s",
                        "I/Os",
                        "MB read",
                        "MB written",
                        "mean I/O ms",
                    ],
                );
                for p in &run.phases {
                    row(
                        h,
                        &[
                            (escape(&p.name), ""),
                            (format!("{:.3}", p.wall_s), "num"),
                            (format!("{:.3}", p.user_s), "num"),
                            (format!("{:.3}", p.sys_s), "num"),
                            (p.io.ios().to_string(), "num"),
                            (format!("{:.1}", p.io.bytes_read() as f64 / 1e6), "num"),
                            (format!("{:.1}", p.io.bytes_written() as f64 / 1e6), "num"),
                            (format!("{:.2}", p.io.mean_io_ms()), "num"),
                        ],
                    );
                }
                h.push_str("</table>\n");
            }
            if !run.text.trim().is_empty() {
                let _ = writeln!(h, "<pre>{}</pre>", escape(run.text.trim_end()));
            }
            h.push_str("</details>\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chart::tests::fixture;

    #[test]
    fn html_report_has_everything() {
        let mut a = fixture();
        a.targets[1].fs.label = "btrfs<zstd>".into();
        a.targets[1].runs[0].text = "a < b & c".into();
        let mut b = fixture();
        b.workload = "proxy-cache".into();
        let dir = tempfile::TempDir::new().unwrap();
        let out = dir.path().join("report.html");
        write_report(&[a, b], &out).unwrap();
        let html = fs::read_to_string(&out).unwrap();
        for s in [
            "blogbench",
            "proxy-cache",
            "ext4",
            "anvil",
            "xfs",
            "<svg",
            "final_reads",
            "geometric mean of ratios",
            "mkfs.xfs: command not found",
            "Frequency = 10 secs",
            "&quot;iterations&quot;: 30",
            "6.18.0",
            "1.0 GiB",
            "2025-10-09 08:53:20 UTC",
        ] {
            assert!(html.contains(s), "{s} missing");
        }
        assert!(html.contains("btrfs&lt;zstd&gt;"));
        assert!(!html.contains("btrfs<zstd>"));
        assert!(html.contains("a &lt; b &amp; c"));
        assert_eq!(html.matches("<section").count(), 2);
        assert!(!html.contains("<?xml"));
    }

    #[test]
    fn html_escape_and_helpers() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(bytes(1 << 30), "1.0 GiB");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
    }
}
