//! Mirroring at the file-system level: HAMMER's mirror-read and mirror-write over one
//! volume each (the stream and its application live in `volume::mirror`).

use super::Filesystem;
use crate::error::{Error, Result};
use crate::volume::{MirrorReport, MirrorState};
use std::io::{Read, Write};

impl Filesystem {
    /// Writes every change committed after `since` up to `until` (default: the newest
    /// commit, after committing what is pending) to `out` as a mirror stream.
    pub fn mirror_read(
        &self,
        since: u64,
        until: Option<u64>,
        out: &mut dyn Write,
    ) -> Result<MirrorReport> {
        if !self.volume.is_read_only() && !self.volume.is_slave() {
            self.sync()?;
        }
        self.volume.mirror_read(since, until, out)
    }

    /// Applies a mirror stream: the volume becomes (or stays) a slave of the stream's
    /// master, holding its history up to the stream's last TID. All or nothing.
    pub fn mirror_write(&self, input: &mut dyn Read) -> Result<MirrorReport> {
        self.volume.mirror_write(input)
    }

    /// The master and last TID this slave holds; None on a volume that is no slave.
    pub fn mirror_state(&self) -> Result<Option<MirrorState>> {
        self.volume.mirror_state()
    }

    /// Turns this slave into a master that takes changes from its next TID on; returns the
    /// TID it continues from.
    pub fn mirror_promote(&self) -> Result<u64> {
        let tid = self.volume.mirror_promote()?;
        self.reap_orphans()?;
        Ok(tid)
    }

    /// What this volume was a slave of, and up to which TID, if it was promoted.
    pub fn promoted_from(&self) -> Result<Option<MirrorState>> {
        self.volume.promoted_from()
    }

    /// Makes this volume (a master) a slave of `master` from `at` on, undoing every change
    /// after `at`: how an old master follows the slave that was promoted in its place
    /// (`promoted_from` on that one gives both). See `Volume::mirror_attach`.
    pub fn mirror_attach(&self, master: [u8; 16], at: u64, at_commit_ns: u64) -> Result<()> {
        self.volume.mirror_attach(master, at, at_commit_ns)
    }

    /// A TID given as a number (decimal, or hex with 0x) or as a snapshot's label.
    pub fn tid_of(&self, spec: &str) -> Result<u64> {
        let spec = spec.trim();
        if let Ok(tid) = super::parse_tid(spec) {
            return Ok(tid);
        }
        self.snapshots()?
            .into_iter()
            .find(|s| s.label == spec)
            .map(|s| s.tid)
            .ok_or_else(|| {
                Error::Invalid(format!("{spec:?} is neither a TID nor a snapshot label"))
            })
    }
}
