//! History commands on a mounted volume: snapshot, snapls, snaprm, history, undo. They talk
//! to the daemon through control attributes and read earlier versions through `@@` paths.

use crate::mount::{get_xattr, set_xattr};
use anvil_fuse::{
    HISTORY_XATTR, POLICY_XATTR, PRUNE_XATTR, SNAPRM_XATTR, SNAPSHOTS_XATTR, SNAPSHOT_XATTR,
};
use std::path::{Path, PathBuf};

fn json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("daemon answered invalid JSON: {e}"))
}

fn format_time(ns: u64) -> String {
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

pub fn history(path: &Path, as_json: bool) -> Result<u8, String> {
    let list = versions(path).map_err(|e| format!("{}: {e}", path.display()))?;
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
