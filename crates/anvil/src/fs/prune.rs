//! Prune: remove history the retention policy no longer keeps.
//!
//! A history element (created at c, deleted at d) is kept iff some kept point t has
//! c <= t < d. Kept points: every snapshot, every commit inside the "all history" window,
//! the last commit of each day / week / 30-day month inside those windows, and the newest
//! commit. Commit-time records are kept for kept points and for every TID a surviving
//! element still names. Removal goes through a commit, so freed space returns to the
//! allocator only once that commit is durable.

use super::Filesystem;
use crate::error::{Error, Result};
use crate::format::record::{rtype, Key, LogicalKey, Payload, Timestamp, VOLUME_OBJ};
use crate::format::NODE_BYTES;
use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

const DAY_NS: u64 = 86_400 * 1_000_000_000;
/// The policy lives in CONFIG record key 1 of the volume object.
const POLICY_KEY: u64 = 1;
/// Elements removed per commit, to bound memory.
const REMOVALS_PER_COMMIT: usize = 200_000;

/// How much history prune keeps (besides snapshots, which stay until removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Keep every commit of the last `all_days` days.
    pub all_days: u32,
    /// Keep the last commit of each day for this many days.
    pub daily_days: u32,
    /// Keep the last commit of each week for this many weeks.
    pub weekly_weeks: u32,
    /// Keep the last commit of each 30-day month for this many months.
    pub monthly_months: u32,
}

impl Default for RetentionPolicy {
    fn default() -> RetentionPolicy {
        RetentionPolicy {
            all_days: 1,
            daily_days: 30,
            weekly_weeks: 0,
            monthly_months: 0,
        }
    }
}

impl RetentionPolicy {
    /// Keeps nothing but snapshots and the current state.
    pub const NONE: RetentionPolicy = RetentionPolicy {
        all_days: 0,
        daily_days: 0,
        weekly_weeks: 0,
        monthly_months: 0,
    };

    /// Parses `all=1d,daily=30d,weekly=8w,monthly=12m` (any subset; units optional).
    pub fn parse(text: &str) -> Result<RetentionPolicy> {
        let mut policy = RetentionPolicy::NONE;
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| Error::Invalid(format!("policy item {part:?} is not name=value")))?;
            let digits = value.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            let number: u32 = digits
                .parse()
                .map_err(|_| Error::Invalid(format!("policy item {part:?}: not a number")))?;
            match name {
                "all" => policy.all_days = number,
                "daily" => policy.daily_days = number,
                "weekly" => policy.weekly_weeks = number,
                "monthly" => policy.monthly_months = number,
                _ => return Err(Error::Invalid(format!("unknown policy item {name:?}"))),
            }
        }
        Ok(policy)
    }
}

impl std::fmt::Display for RetentionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "all={}d,daily={}d,weekly={}w,monthly={}m",
            self.all_days, self.daily_days, self.weekly_weeks, self.monthly_months
        )
    }
}

/// What a prune did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub elements_removed: u64,
    pub extent_bytes_freed: u64,
    pub kept_points: u64,
}

/// Space split for `anvil info`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpaceSplit {
    /// Extents and inline data of the current state.
    pub live_bytes: u64,
    /// Extents and inline data only history reaches.
    pub history_bytes: u64,
    /// Tree nodes.
    pub tree_bytes: u64,
    /// Bytes the live data extents hold once decoded, and the device space they take:
    /// their quotient is the compression ratio achieved.
    pub extent_logical_bytes: u64,
    pub extent_allocated_bytes: u64,
    /// Live data extents per codec (none, lz4, zstd).
    pub extents_by_codec: [u64; 3],
}

fn policy_key() -> LogicalKey {
    LogicalKey {
        obj: VOLUME_OBJ,
        rtype: rtype::CONFIG,
        key: POLICY_KEY,
    }
}

fn element_bytes(payload: &Payload) -> u64 {
    match payload {
        Payload::Inline(bytes) => bytes.len() as u64,
        Payload::Extent(extent) => extent.allocated_bytes(),
    }
}

impl Filesystem {
    pub fn retention_policy(&self) -> Result<RetentionPolicy> {
        let stored = self.volume.run(false, |tx| tx.get_bytes(policy_key()))?;
        match stored {
            Some(bytes) => RetentionPolicy::parse(&String::from_utf8_lossy(&bytes)),
            None => Ok(RetentionPolicy::default()),
        }
    }

    pub fn set_retention_policy(&self, policy: RetentionPolicy) -> Result<()> {
        let text = Arc::new(policy.to_string().into_bytes());
        self.volume
            .run(true, |tx| tx.put(policy_key(), Some(text.clone())))?;
        self.sync().map(|_| ())
    }

    /// TIDs the policy keeps as of now.
    fn kept_points(&self, policy: RetentionPolicy) -> Result<BTreeSet<u64>> {
        let now = Timestamp::now().as_ns();
        let commits = self.commits()?;
        let mut kept: BTreeSet<u64> = self.snapshots()?.into_iter().map(|s| s.tid).collect();
        kept.insert(self.volume.committed_tid());
        let all_since = now.saturating_sub(policy.all_days as u64 * DAY_NS);
        let windows = [
            (policy.daily_days as u64, DAY_NS),
            (policy.weekly_weeks as u64 * 7, 7 * DAY_NS),
            (policy.monthly_months as u64 * 30, 30 * DAY_NS),
        ];
        for (tid, time) in &commits {
            if policy.all_days > 0 && *time >= all_since {
                kept.insert(*tid);
            }
        }
        for (days, bucket_ns) in windows {
            if days == 0 {
                continue;
            }
            let since = now.saturating_sub(days * DAY_NS);
            // The last commit of each bucket (day, week, month) in the window.
            let mut last_of_bucket: std::collections::BTreeMap<u64, u64> = Default::default();
            for (tid, time) in commits.iter().filter(|(_, t)| *t >= since) {
                let bucket = time / bucket_ns;
                let entry = last_of_bucket.entry(bucket).or_insert(*tid);
                *entry = (*entry).max(*tid);
            }
            kept.extend(last_of_bucket.into_values());
        }
        Ok(kept)
    }

    /// Removes the history `policy` does not keep (the stored policy when None). With
    /// `everything`, keeps only snapshots and the current state.
    pub fn prune(&self, policy: Option<RetentionPolicy>, everything: bool) -> Result<PruneReport> {
        let _one_at_a_time = self.prune_lock.lock();
        let policy = if everything {
            RetentionPolicy::NONE
        } else {
            match policy {
                Some(p) => p,
                None => self.retention_policy()?,
            }
        };
        let pruned_at = self.sync()?;
        let kept = self.kept_points(policy)?;
        let mut report = PruneReport {
            kept_points: kept.len() as u64,
            ..PruneReport::default()
        };
        let is_kept = |create_tid: u64, delete_tid: u64| {
            kept.range(create_tid..)
                .next()
                .is_some_and(|&t| t < delete_tid)
        };
        // One pass over the committed tree: history elements no kept point sees go, and
        // so do commit-time records nobody needs any more.
        let mut doomed: Vec<Key> = Vec::new();
        let mut needed_tids: HashSet<u64> = kept.iter().copied().collect();
        let mut commit_records: Vec<Key> = Vec::new();
        self.volume.scan(&mut |e| {
            if e.key.obj == VOLUME_OBJ && e.key.rtype == rtype::COMMIT {
                commit_records.push(e.key);
                return true;
            }
            if e.delete_tid != 0 && !is_kept(e.key.create_tid, e.delete_tid) {
                report.elements_removed += 1;
                if let Some(extent) = e.extent() {
                    report.extent_bytes_freed += extent.allocated_bytes();
                }
                doomed.push(e.key);
            } else {
                needed_tids.insert(e.key.create_tid);
                if e.delete_tid != 0 {
                    needed_tids.insert(e.delete_tid);
                }
            }
            true
        })?;
        doomed.extend(
            commit_records
                .into_iter()
                .filter(|k| !needed_tids.contains(&k.key)),
        );
        // Removals free space only once committed, but every leaf they touch needs a new
        // node first, and history keys (directory entries above all) spread over many
        // leaves: size each batch for one new leaf and its ancestors per removal, growing
        // as earlier batches free space.
        let mut rest = doomed.as_slice();
        while !rest.is_empty() {
            let node_room = self.volume.node_budget_bytes() / (4 * NODE_BYTES as u64);
            let batch = usize::try_from(node_room)
                .unwrap_or(usize::MAX)
                .clamp(1, REMOVALS_PER_COMMIT)
                .min(rest.len());
            let (now, later) = rest.split_at(batch);
            self.volume.schedule_removals(now.iter().copied())?;
            self.sync()?;
            rest = later;
        }
        // Mirror streams over this range say that its history is incomplete. A slave
        // records nothing: its own pruning is its own.
        if report.elements_removed > 0 && !self.volume.is_slave() {
            let lk = LogicalKey {
                obj: VOLUME_OBJ,
                rtype: rtype::CONFIG,
                key: crate::volume::PRUNED_KEY,
            };
            let value = Arc::new(pruned_at.to_le_bytes().to_vec());
            self.volume
                .run(true, |tx| tx.put(lk, Some(value.clone())))?;
            self.sync()?;
        }
        Ok(report)
    }

    /// Bytes of live data, history-only data and tree nodes (a full scan of the tree).
    pub fn space_split(&self) -> Result<SpaceSplit> {
        let mut split = SpaceSplit::default();
        self.volume.scan(&mut |e| {
            if e.key.obj == VOLUME_OBJ {
                return true; // volume metadata (commit times, snapshots): counted as tree
            }
            let payload = e.payload();
            if e.delete_tid == 0 {
                split.live_bytes += element_bytes(&payload);
                if let Payload::Extent(extent) = &payload {
                    split.extent_logical_bytes += u64::from(extent.logical_bytes);
                    split.extent_allocated_bytes += extent.allocated_bytes();
                    if let Some(n) = split.extents_by_codec.get_mut(extent.compression as usize) {
                        *n += 1;
                    }
                }
            } else {
                split.history_bytes += element_bytes(&payload);
            }
            true
        })?;
        let usage = self.volume.usage();
        let data = split.live_bytes + split.history_bytes;
        split.tree_bytes = usage.used_bytes.saturating_sub(data);
        Ok(split)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_round_trips() {
        let policy = RetentionPolicy::parse("all=2d,daily=30d,weekly=8w").unwrap();
        assert_eq!(
            policy,
            RetentionPolicy {
                all_days: 2,
                daily_days: 30,
                weekly_weeks: 8,
                monthly_months: 0
            }
        );
        assert_eq!(RetentionPolicy::parse(&policy.to_string()).unwrap(), policy);
        assert!(RetentionPolicy::parse("hourly=3").is_err());
        assert!(RetentionPolicy::parse("daily").is_err());
    }
}

/// Free-form configuration texts kept in the volume (CONFIG records of the volume object).
pub mod config_keys {
    /// The `anvil cleanup` schedule and its last-run times.
    pub const CLEANUP: u64 = 3;
}

impl Filesystem {
    /// A configuration text stored in the volume, if set.
    pub fn config_text(&self, key: u64) -> Result<Option<String>> {
        let lk = LogicalKey {
            obj: VOLUME_OBJ,
            rtype: rtype::CONFIG,
            key,
        };
        let stored = self.volume.run(false, |tx| tx.get_bytes(lk))?;
        Ok(stored.map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    pub fn set_config_text(&self, key: u64, text: &str) -> Result<()> {
        if matches!(key, POLICY_KEY | 2 | 4 | 5 | 6) {
            return Err(Error::Invalid(format!(
                "configuration key {key} is reserved"
            )));
        }
        if text.len() > 2048 {
            return Err(Error::Invalid(
                "configuration text longer than 2048 bytes".into(),
            ));
        }
        let lk = LogicalKey {
            obj: VOLUME_OBJ,
            rtype: rtype::CONFIG,
            key,
        };
        let bytes = Arc::new(text.as_bytes().to_vec());
        self.volume
            .run(true, |tx| tx.put(lk, Some(bytes.clone())))?;
        self.sync().map(|_| ())
    }
}
