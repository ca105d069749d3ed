//! History commands on a mounted volume: snapshot, snapls, snaprm, history, undo. They talk
//! to the daemon through control attributes and read earlier versions through `@@` paths.

use crate::mount::{get_xattr, set_xattr};
use anvil_fuse::{
    CLEANUP_XATTR, COMPRESSION_XATTR, EVICT_XATTR, HISTORY_XATTR, NOHISTORY_XATTR, POLICY_XATTR,
    PRUNE_XATTR, REBLOCK_XATTR, SNAPRM_XATTR, SNAPSHOTS_XATTR, SNAPSHOT_XATTR,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("daemon answered invalid JSON: {e}"))
}

pub fn format_time(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn snapshots(dir: &Path) -> Result<Vec<serde_json::Value>, String> {
    let text = get_xattr(dir, SNAPSHOTS_XATTR)?;
    Ok(json(&text)?.as_array().cloned().unwrap_or_default())
}

pub fn snapshot(dir: &Path, label: &str) -> Result<u8, String> {
    set_xattr(dir, SNAPSHOT_XATTR, label.as_bytes())
        .map_err(|e| format!("snapshot of {}: {e}", dir.display()))?;
    let newest = snapshots(dir)?
        .into_iter()
        .max_by_key(|s| s["tid"].as_u64().unwrap_or(0));
    let tid = newest
        .and_then(|s| s["tid"].as_u64())
        .ok_or("snapshot not listed")?;
    println!("{tid:#018x}");
    Ok(0)
}

pub fn snapls(dir: &Path, as_json: bool) -> Result<u8, String> {
    let list = snapshots(dir)?;
    if as_json {
        println!("{}", serde_json::Value::Array(list));
        return Ok(0);
    }
    println!("{:<18}  {:<20}  label", "TID", "time (UTC)");
    for s in list {
        let tid = s["tid"].as_u64().unwrap_or(0);
        let time = format_time(s["time_ns"].as_u64().unwrap_or(0));
        println!(
            "{tid:#018x}  {time:<20}  {}",
            s["label"].as_str().unwrap_or("")
        );
    }
    Ok(0)
}

pub fn snaprm(dir: &Path, spec: &str) -> Result<u8, String> {
    set_xattr(dir, SNAPRM_XATTR, spec.as_bytes())
        .map_err(|e| format!("no snapshot {spec:?} on {} ({e})", dir.display()))?;
    Ok(0)
}

/// (tid, time_ns, size, exists) of every version, oldest first.
fn versions(path: &Path) -> Result<Vec<(u64, u64, u64, bool)>, String> {
    let text = get_xattr(path, HISTORY_XATTR)?;
    let list = json(&text)?;
    Ok(list
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|v| {
                    (
                        v["tid"].as_u64().unwrap_or(0),
                        v["time_ns"].as_u64().unwrap_or(0),
                        v["size"].as_u64().unwrap_or(0),
                        v["exists"].as_bool().unwrap_or(false),
                    )
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The bytes of `path` in [start, start+len) as of `spec`; None if it did not exist.
fn range_as_of(path: &Path, spec: &str, start: u64, len: u64) -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(as_of_path(path, spec)).ok()?;
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut out = Vec::new();
    file.take(len).read_to_end(&mut out).ok()?;
    Some(out)
}

pub fn history(path: &Path, as_json: bool, range: Option<&str>) -> Result<u8, String> {
    let mut list = versions(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(range) = range {
        let (start, len) = range
            .split_once(':')
            .and_then(|(s, l)| Some((s.parse::<u64>().ok()?, l.parse::<u64>().ok()?)))
            .ok_or_else(|| format!("invalid range {range:?}; expected START:LENGTH"))?;
        // Keep the versions in which the range's bytes differ from the version before.
        let mut previous: Option<Option<Vec<u8>>> = None;
        list.retain(|(tid, _, _, _)| {
            let now = range_as_of(path, &format!("{tid:#018x}"), start, len);
            let changed = previous.as_ref() != Some(&now);
            previous = Some(now);
            changed
        });
    }
    if as_json {
        let items: Vec<serde_json::Value> = list
            .iter()
            .map(|(tid, time, size, exists)| {
                serde_json::json!({"tid": tid, "time_ns": time, "size": size, "exists": exists})
            })
            .collect();
        println!("{}", serde_json::Value::Array(items));
        return Ok(0);
    }
    println!("{:<18}  {:<20}  {:>12}", "TID", "time (UTC)", "size");
    for (tid, time, size, exists) in list {
        let size = if exists {
            size.to_string()
        } else {
            "deleted".to_string()
        };
        println!("{tid:#018x}  {:<20}  {size:>12}", format_time(time));
    }
    Ok(0)
}

fn as_of_path(path: &Path, spec: &str) -> PathBuf {
    let mut text = path.as_os_str().to_os_string();
    text.push("@@");
    text.push(spec);
    PathBuf::from(text)
}

/// The version `undo` recovers when no TID is given: for an existing file the newest earlier
/// version whose content differs; for a deleted file the newest version of its directory
/// that still held it.
fn default_version(path: &Path) -> Result<String, String> {
    if path.exists() {
        let current = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let list = versions(path)?;
        for (tid, _, _, exists) in list.iter().rev() {
            let spec = format!("{tid:#018x}");
            if *exists {
                if let Ok(old) = std::fs::read(as_of_path(path, &spec)) {
                    if old != current {
                        return Ok(spec);
                    }
                }
            }
        }
        return Err(format!(
            "{}: no earlier version differs from the current one",
            path.display()
        ));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let list = versions(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    for (tid, _, _, _) in list.iter().rev() {
        let spec = format!("{tid:#018x}");
        if as_of_path(path, &spec).exists() {
            return Ok(spec);
        }
    }
    Err(format!(
        "{}: not found in the history of {}",
        path.display(),
        parent.display()
    ))
}

pub fn undo(
    path: &Path,
    tid: Option<&str>,
    output: Option<&Path>,
    diff: bool,
) -> Result<u8, String> {
    let spec = match tid {
        Some(spec) => spec.to_string(),
        None => default_version(path)?,
    };
    let source = as_of_path(path, &spec);
    let old = std::fs::read(&source).map_err(|e| {
        format!(
            "{} as of {spec}: {e} (check the TID, time or label with `anvil history`)",
            path.display()
        )
    })?;
    if diff {
        let status = std::process::Command::new("diff")
            .arg("-u")
            .arg("--label")
            .arg(format!("{}@@{spec}", path.display()))
            .arg("--label")
            .arg(path.display().to_string())
            .arg(&source)
            .arg(if path.exists() {
                path
            } else {
                Path::new("/dev/null")
            })
            .status()
            .map_err(|e| format!("cannot run diff: {e}"))?;
        return Ok(if status.success() { 0 } else { 1 });
    }
    let target = match output {
        Some(out) if out == Path::new("-") => {
            use std::io::Write;
            std::io::stdout()
                .write_all(&old)
                .map_err(|e| e.to_string())?;
            return Ok(0);
        }
        Some(out) => out.to_path_buf(),
        None => {
            let mut name = path.as_os_str().to_os_string();
            name.push(format!(".undo-{spec}"));
            PathBuf::from(name)
        }
    };
    std::fs::write(&target, &old).map_err(|e| format!("{}: {e}", target.display()))?;
    eprintln!(
        "recovered {} as of {spec} into {}",
        path.display(),
        target.display()
    );
    Ok(0)
}

pub fn prune(dir: &Path, policy: &str) -> Result<u8, String> {
    set_xattr(dir, PRUNE_XATTR, policy.as_bytes())
        .map_err(|e| format!("prune of {}: {e} (policy {policy:?})", dir.display()))?;
    let report = json(&get_xattr(dir, PRUNE_XATTR)?)?;
    let freed = report["extent_bytes_freed"].as_u64().unwrap_or(0);
    println!(
        "pruned {} history records, freed {:.1} MiB of data ({} points in time kept)",
        report["elements_removed"].as_u64().unwrap_or(0),
        freed as f64 / (1 << 20) as f64,
        report["kept_points"].as_u64().unwrap_or(0)
    );
    Ok(0)
}

pub fn policy(dir: &Path, policy: Option<&str>) -> Result<u8, String> {
    if let Some(policy) = policy {
        set_xattr(dir, POLICY_XATTR, policy.as_bytes())
            .map_err(|e| format!("invalid policy {policy:?} ({e})"))?;
    }
    println!("{}", get_xattr(dir, POLICY_XATTR)?);
    Ok(0)
}

pub fn reblock(dir: &Path, seconds: Option<u64>) -> Result<u8, String> {
    let started = Instant::now();
    let limit = seconds.map(Duration::from_secs);
    let bar = indicatif::ProgressBar::new(1);
    bar.set_style(
        indicatif::ProgressStyle::with_template("reblock {bar:40} {bytes}/{total_bytes} {msg}")
            .map_err(|e| e.to_string())?,
    );
    let (mut moved, mut bytes, mut freed, mut damaged) = (0u64, 0u64, 0i64, 0u64);
    loop {
        // One second per request keeps the daemon responsive and the bar moving.
        let slice = limit.map_or(1.0, |l| {
            l.saturating_sub(started.elapsed()).as_secs_f64().min(1.0)
        });
        set_xattr(dir, REBLOCK_XATTR, format!("{slice:.3}").as_bytes())
            .map_err(|e| format!("reblock of {}: {e}", dir.display()))?;
        let report = json(&get_xattr(dir, REBLOCK_XATTR)?)?;
        let num = |k: &str| report[k].as_u64().unwrap_or(0);
        moved += num("extents_moved");
        bytes += num("bytes_moved");
        freed += report["bytes_freed"].as_i64().unwrap_or(0);
        damaged += num("damaged");
        bar.set_length(num("total").max(1));
        bar.set_position(num("done"));
        bar.set_message(format!("{moved} extents moved"));
        let finished = report["finished"].as_bool().unwrap_or(false);
        if finished || limit.is_some_and(|l| started.elapsed() >= l) {
            bar.finish_and_clear();
            println!(
                "reblock {}: moved {moved} extents ({:.1} MiB), freed {:.1} MiB{}",
                if finished {
                    "finished"
                } else {
                    "paused (run again to resume)"
                },
                bytes as f64 / (1 << 20) as f64,
                freed as f64 / (1 << 20) as f64,
                if damaged > 0 {
                    format!(", {damaged} damaged extents left in place")
                } else {
                    String::new()
                }
            );
            return Ok(0);
        }
    }
}

/// "1d", "12h", "30m", "45s" or plain seconds; 0 means never.
fn parse_period(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("invalid period {text:?}"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => {
            return Err(format!(
                "invalid period unit in {text:?} (use s, m, h, d or w)"
            ))
        }
    };
    Ok(number * scale)
}

fn parse_config(text: &str) -> BTreeMap<String, String> {
    text.split([' ', ',', '\n'])
        .filter_map(|item| item.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

pub fn cleanup(dir: &Path, config: Option<&str>) -> Result<u8, String> {
    let mut settings: BTreeMap<String, String> = [
        ("snapshot", "1d"),
        ("prune", "1d"),
        ("reblock", "7d"),
        ("reblock_minutes", "5"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    settings.extend(parse_config(&get_xattr(dir, CLEANUP_XATTR)?));
    if let Some(changes) = config {
        for (key, value) in parse_config(changes) {
            if !matches!(
                key.as_str(),
                "snapshot" | "prune" | "reblock" | "reblock_minutes"
            ) {
                return Err(format!("unknown cleanup setting {key:?}"));
            }
            parse_period(&value)?;
            settings.insert(key, value);
        }
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    for action in ["snapshot", "prune", "reblock"] {
        let period = parse_period(&settings[action])?;
        let last_key = format!("last_{action}");
        let last: u64 = settings
            .get(&last_key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if period == 0 {
            println!("{action}: disabled");
            continue;
        }
        if now < last + period {
            println!("{action}: not due for {} s", last + period - now);
            continue;
        }
        match action {
            "snapshot" => {
                let label = format!("cleanup-{}", format_time(now * 1_000_000_000));
                print!("snapshot: ");
                snapshot(dir, &label)?;
            }
            "prune" => {
                print!("prune: ");
                prune(dir, "")?;
            }
            _ => {
                let minutes = parse_period(&settings["reblock_minutes"])?;
                print!("reblock: ");
                reblock(dir, Some(minutes * 60))?;
            }
        }
        settings.insert(last_key, now.to_string());
    }
    let text: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    set_xattr(dir, CLEANUP_XATTR, text.join(" ").as_bytes())
        .map_err(|e| format!("saving the cleanup schedule: {e}"))?;
    Ok(0)
}

pub fn compression(path: &Path, setting: Option<&str>) -> Result<u8, String> {
    if let Some(setting) = setting {
        if setting != "default" && anvil::format::record::compression::parse(setting).is_none() {
            return Err(format!(
                "expected none, lz4, zstd or default, not {setting:?}"
            ));
        }
        set_xattr(path, COMPRESSION_XATTR, setting.as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let codec = get_xattr(path, COMPRESSION_XATTR)?;
    println!("{}: compression {codec}", path.display());
    Ok(0)
}

/// The control attribute value of an "on" or "off" argument.
fn on_off(setting: &str) -> Result<&'static [u8], String> {
    match setting {
        "on" => Ok(b"1"),
        "off" => Ok(b"0"),
        _ => Err(format!("expected on or off, not {setting:?}")),
    }
}

pub fn evict(path: &Path, setting: Option<&str>) -> Result<u8, String> {
    if let Some(setting) = setting {
        let value = on_off(setting)?;
        if !path.is_dir() {
            return Err(format!(
                "{}: not a directory (only a directory can be a cache)",
                path.display()
            ));
        }
        set_xattr(path, EVICT_XATTR, value).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let on = get_xattr(path, EVICT_XATTR)? == "1";
    println!(
        "{}: {}",
        path.display(),
        if on {
            "a cache (least recently used files deleted when space runs low; no history)"
        } else {
            "not a cache"
        }
    );
    Ok(0)
}

pub fn nohistory(path: &Path, setting: Option<&str>) -> Result<u8, String> {
    if let Some(setting) = setting {
        let value = on_off(setting)?;
        set_xattr(path, NOHISTORY_XATTR, value).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let on = get_xattr(path, NOHISTORY_XATTR)? == "1";
    println!(
        "{}: history {}",
        path.display(),
        if on { "off (nohistory)" } else { "on" }
    );
    Ok(0)
}
