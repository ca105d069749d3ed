//! Reblock: rewrite data and tree in key order so each file's extents and the leaves that
//! index them lie side by side again. Time-boxed and resumable: the position of an
//! unfinished pass is kept in the volume (CONFIG record 2) and the next run continues there.

use super::Filesystem;
use crate::error::Result;
use crate::format::coding::{Reader, Writer};
use crate::format::record::{rtype, Key, LogicalKey, VOLUME_OBJ};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CURSOR_KEY: u64 = 2;
/// How a reblock run is bounded.
#[derive(Clone, Copy, Debug)]
pub struct ReblockOptions {
    /// Stop (resumably) after this long; None runs the pass to the end.
    pub time_box: Option<Duration>,
    /// Bytes moved per step: one step is one durable layout change.
    pub step_bytes: u64,
}

impl Default for ReblockOptions {
    fn default() -> ReblockOptions {
        ReblockOptions {
            time_box: None,
            step_bytes: 16 << 20,
        }
    }
}

/// What a reblock run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReblockReport {
    pub extents_moved: u64,
    pub bytes_moved: u64,
    pub nodes_written: u64,
    /// Free space after the run minus before (tree nodes packed tighter free space).
    pub bytes_freed: i64,
    /// Extents left in place because their checksum failed (see `anvil check`).
    pub damaged: u64,
    /// False when the time box ended the run; the next run resumes.
    pub finished: bool,
}

fn cursor_key() -> LogicalKey {
    LogicalKey {
        obj: VOLUME_OBJ,
        rtype: rtype::CONFIG,
        key: CURSOR_KEY,
    }
}

impl Filesystem {
    /// Where the last unfinished pass stopped. A slave keeps none (its CONFIG records are
    /// its master's, and it takes no changes but mirrored ones): each run starts over.
    fn reblock_cursor(&self) -> Result<Option<Key>> {
        if self.volume.is_slave() {
            return Ok(None);
        }
        let stored = self.volume.run(false, |tx| tx.get_bytes(cursor_key()))?;
        let Some(bytes) = stored else { return Ok(None) };
        let mut r = Reader::new(&bytes, "reblock cursor");
        Ok(Some(Key::decode(&mut r)?))
    }

    /// Reblocks within `options.time_box` (None: until done), resuming an unfinished pass.
    /// `progress(done_bytes, total_bytes)` is called after each step.
    pub fn reblock(
        &self,
        options: ReblockOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ReblockReport> {
        let started = Instant::now();
        let free_before = self.volume.usage().free_bytes;
        let split = self.space_split()?;
        let total = split.live_bytes + split.history_bytes + split.tree_bytes;
        let mut cursor = self.reblock_cursor()?.unwrap_or(Key::MIN);
        let mut report = ReblockReport::default();
        let mut done = 0u64;
        loop {
            let step = self
                .volume
                .reblock_step(cursor, options.step_bytes.max(1))?;
            report.extents_moved += step.extents_moved;
            report.bytes_moved += step.bytes_moved;
            report.nodes_written += step.nodes_written;
            report.damaged += step.damaged;
            done += step.bytes_moved.min(total.saturating_sub(done));
            progress(done.min(total), total);
            if step.bytes_moved == 0 && step.next.is_some() && step.next == Some(cursor) {
                // No room to move anything: stop here and resume later.
                break;
            }
            match step.next {
                None => {
                    report.finished = true;
                    if !self.volume.is_slave() {
                        self.volume.run(true, |tx| tx.put(cursor_key(), None))?;
                    }
                    break;
                }
                Some(next) => cursor = next,
            }
            if options
                .time_box
                .is_some_and(|limit| started.elapsed() >= limit)
            {
                if self.volume.is_slave() {
                    break;
                }
                let mut w = Writer::default();
                cursor.encode(&mut w);
                let bytes = Arc::new(w.bytes);
                self.volume
                    .run(true, |tx| tx.put(cursor_key(), Some(bytes.clone())))?;
                break;
            }
        }
        self.sync()?;
        let freed = i128::from(self.volume.usage().free_bytes) - i128::from(free_before);
        report.bytes_freed =
            i64::try_from(freed).unwrap_or(if freed < 0 { i64::MIN } else { i64::MAX });
        Ok(report)
    }
}
