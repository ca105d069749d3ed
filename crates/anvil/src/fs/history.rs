//! History a user can reach: snapshots (named TIDs that prune keeps), commit times, the
//! versions of one object, and resolving "as of" specifications (TID, time, label).

use super::{Filesystem, SnapshotInfo, Version};
use crate::error::{Error, Result};
use crate::format::record::{rtype, LogicalKey, Timestamp, VOLUME_OBJ};
use crate::volume::Value;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Snapshot record payload: created time (ns, LE u64), then the label bytes.
fn encode_snapshot(label: &str, time_ns: u64) -> Vec<u8> {
    let mut out = time_ns.to_le_bytes().to_vec();
    out.extend_from_slice(label.as_bytes());
    out
}

fn decode_snapshot(tid: u64, bytes: &[u8]) -> Result<SnapshotInfo> {
    let Some((time_ns, label)) = bytes
        .split_first_chunk::<8>()
        .filter(|(_, label)| label.len() <= SNAPSHOT_LABEL_BYTES_MAX)
    else {
        return Err(Error::corrupt(
            "snapshot record length",
            format!("snapshot {tid:#018x}"),
        ));
    };
    let time_ns = u64::from_le_bytes(*time_ns);
    let label = String::from_utf8_lossy(label).into_owned();
    Ok(SnapshotInfo {
        tid,
        label,
        time_ns,
    })
}

pub const SNAPSHOT_LABEL_BYTES_MAX: usize = 200;

fn snapshot_key(tid: u64) -> LogicalKey {
    LogicalKey {
        obj: VOLUME_OBJ,
        rtype: rtype::SNAPSHOT,
        key: tid,
    }
}

fn value_bytes(fs: &Filesystem, value: &Value) -> Result<Arc<Vec<u8>>> {
    match value {
        Value::Bytes(bytes) => Ok(bytes.clone()),
        Value::Extent(extent) => fs.volume.read_extent(extent),
    }
}

impl Filesystem {
    /// Commits, then records the committed TID as a snapshot. Returns its TID.
    pub fn snapshot(&self, label: &str) -> Result<u64> {
        let label = label.trim();
        // A label names a directory under .snapshots and is printed by every listing:
        // no '/', no control characters, not hidden.
        if label.len() > SNAPSHOT_LABEL_BYTES_MAX
            || label.contains('/')
            || label.starts_with('.')
            || label.chars().any(char::is_control)
        {
            return Err(Error::Invalid(format!(
                "snapshot label {label:?}: at most {SNAPSHOT_LABEL_BYTES_MAX} bytes, no '/' \
                 or control characters, not starting with '.'"
            )));
        }
        if !label.is_empty() && self.snapshots()?.iter().any(|s| s.label == label) {
            return Err(Error::Invalid(format!(
                "a snapshot labelled {label:?} exists"
            )));
        }
        let tid = self.sync()?;
        let record = encode_snapshot(label, Timestamp::now().as_ns());
        self.volume.run(true, |tx| {
            tx.put(snapshot_key(tid), Some(Arc::new(record.clone())))
        })?;
        self.sync()?;
        Ok(tid)
    }

    /// Snapshots, oldest first.
    pub fn snapshots(&self) -> Result<Vec<SnapshotInfo>> {
        let records = self.volume.run(false, |tx| {
            let mut out = Vec::new();
            for (tid, value) in tx.range(VOLUME_OBJ, rtype::SNAPSHOT, 0, u64::MAX, usize::MAX)? {
                out.push((tid, tx.resolve(&value)?));
            }
            Ok(out)
        })?;
        records
            .into_iter()
            .map(|(tid, bytes)| decode_snapshot(tid, &bytes))
            .collect()
    }

    /// Removes a snapshot by TID or label; the history it pinned becomes prunable.
    pub fn remove_snapshot(&self, spec: &str) -> Result<u64> {
        let snapshots = self.snapshots()?;
        let found = snapshots
            .iter()
            .find(|s| s.label == spec && !spec.is_empty())
            .or_else(|| {
                parse_tid(spec)
                    .ok()
                    .and_then(|t| snapshots.iter().find(|s| s.tid == t))
            });
        let Some(snapshot) = found else {
            return Err(Error::Invalid(format!("no snapshot {spec:?}")));
        };
        let tid = snapshot.tid;
        self.volume
            .run(true, |tx| tx.put(snapshot_key(tid), None))?;
        self.sync()?;
        Ok(tid)
    }

    /// (TID, commit time in ns) of every commit, oldest first.
    pub fn commits(&self) -> Result<Vec<(u64, u64)>> {
        let root = self.volume.root();
        let lo = LogicalKey {
            obj: VOLUME_OBJ,
            rtype: rtype::COMMIT,
            key: 0,
        };
        let hi = LogicalKey {
            obj: VOLUME_OBJ,
            rtype: rtype::COMMIT,
            key: u64::MAX,
        };
        let records = self.volume.range_at(&root, root.tid, lo, hi, usize::MAX)?;
        let mut out = Vec::with_capacity(records.len());
        for (lk, value) in records {
            let bytes = value_bytes(self, &value)?;
            let time: [u8; 8] =
                bytes
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| {
                        Error::corrupt("commit record length", format!("commit {:#018x}", lk.key))
                    })?;
            out.push((lk.key, u64::from_le_bytes(time)));
        }
        Ok(out)
    }

    /// Resolves an as-of specification: `0x<hex TID>`, a time `YYYY-MM-DDTHH:MM[:SS]` (UTC;
    /// the newest commit at or before it), or a snapshot label.
    pub fn resolve_as_of(&self, spec: &str) -> Result<u64> {
        if let Ok(tid) = parse_tid(spec) {
            self.at(tid)?;
            return Ok(tid);
        }
        if let Some(time_ns) = parse_time(spec) {
            let commits = self.commits()?;
            return commits
                .iter()
                .filter(|(_, t)| *t <= time_ns)
                .map(|(tid, _)| *tid)
                .max()
                .ok_or_else(|| Error::Invalid(format!("no commit at or before {spec}")));
        }
        self.snapshots()?
            .into_iter()
            .find(|s| s.label == spec)
            .map(|s| s.tid)
            .ok_or_else(|| {
                Error::Invalid(format!("{spec:?} is not a TID, a time or a snapshot label"))
            })
    }

    /// Every committed version of an object: the TIDs at which its attributes or data
    /// changed, with commit time and size, oldest first. Includes its deletion, if any.
    pub fn history(&self, ino: u64) -> Result<Vec<Version>> {
        let root = self.volume.root();
        let mut changes: BTreeMap<u64, bool> = BTreeMap::new();
        let lo = crate::format::record::Key {
            obj: ino,
            rtype: 0,
            key: 0,
            create_tid: 0,
        };
        let hi = crate::format::record::Key {
            obj: ino,
            rtype: u8::MAX,
            key: u64::MAX,
            create_tid: u64::MAX,
        };
        let loader = self.volume.loader();
        let mut deleted_at = None;
        let walk = crate::btree::range(&loader, root.root, &lo, &hi, &mut |e| {
            changes.insert(e.key.create_tid, true);
            if e.key.rtype == rtype::INODE && e.delete_tid != 0 {
                changes.entry(e.delete_tid).or_insert(false);
                deleted_at = Some(deleted_at.map_or(e.delete_tid, |d: u64| d.max(e.delete_tid)));
            }
            if e.delete_tid != 0 && e.key.rtype != rtype::INODE {
                changes.entry(e.delete_tid).or_insert(true);
            }
            true
        });
        crate::btree::loaded(walk)?;
        let times: BTreeMap<u64, u64> = self.commits()?.into_iter().collect();
        let mut out = Vec::new();
        for (tid, _) in changes {
            if tid > root.tid {
                continue;
            }
            let view = self.at(tid)?;
            let (exists, size) = match view.getattr(ino) {
                Ok(attr) => (true, attr.size),
                Err(Error::Posix(libc::ENOENT)) => (false, 0),
                Err(e) => return Err(e),
            };
            out.push(Version {
                tid,
                time_ns: times.get(&tid).copied().unwrap_or(0),
                size,
                exists,
            });
        }
        Ok(out)
    }
}

/// Parses `0x<hex>` (the form anvil prints) or a decimal TID.
pub fn parse_tid(text: &str) -> Result<u64> {
    let parsed = match text.strip_prefix("0x") {
        Some(hex) if !hex.is_empty() && hex.len() <= 16 => u64::from_str_radix(hex, 16).ok(),
        Some(_) => None,
        None if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => text.parse().ok(),
        None => None,
    };
    parsed.ok_or_else(|| Error::Invalid(format!("invalid TID {text:?}")))
}

/// Parses `YYYY-MM-DDTHH:MM[:SS]` (UTC) into ns since the epoch.
pub fn parse_time(text: &str) -> Option<u64> {
    let (date, time) = text.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (d.next()??, d.next()??, d.next()??);
    if d.next().is_some() {
        return None;
    }
    let mut t = time.split(':').map(|p| p.parse::<i64>().ok());
    let (hour, minute) = (t.next()??, t.next()??);
    let second = t.next().map_or(Some(0), |s| s)?;
    if t.next().is_some()
        || !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || !(0..24).contains(&hour)
        || !(0..60).contains(&minute)
        || !(0..61).contains(&second)
    {
        return None;
    }
    // Days since the epoch (proleptic Gregorian), Howard Hinnant's algorithm.
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    u64::try_from(secs)
        .ok()
        .map(|s| s.saturating_mul(1_000_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_tids_parse() {
        assert_eq!(parse_time("1970-01-01T00:00:00"), Some(0));
        assert_eq!(
            parse_time("2026-11-21T10:00"),
            Some(1_795_255_200 * 1_000_000_000)
        );
        assert_eq!(parse_time("2026-13-01T00:00"), None);
        assert_eq!(parse_tid("0x0000000000000010").unwrap(), 16);
        assert_eq!(parse_tid("16").unwrap(), 16);
        assert!(parse_tid("0x").is_err() && parse_tid("banana").is_err());
    }
}
