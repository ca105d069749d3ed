//! Test support: a [`RunEnv`] over a temporary directory, with a probe that
//! only syncs (no root needed, no device to count).

use std::path::Path;

use indicatif::ProgressBar;

use crate::env::{IoCounters, Probe, RunEnv};
use crate::error::{Context, Result};
use crate::vfs::PosixVfs;

/// A probe for a plain directory: sync only; snapshots unsupported.
pub struct DirProbe {
    pub dir: std::path::PathBuf,
}

impl Probe for DirProbe {
    fn drop_caches(&self) -> Result<()> {
        self.sync()
    }
    fn sync(&self) -> Result<()> {
        // SAFETY: sync(2) has no arguments.
        unsafe { libc::sync() };
        Ok(())
    }
    fn io(&self) -> IoCounters {
        IoCounters::default()
    }
    fn used_bytes(&self) -> Result<u64> {
        let mut total = 0;
        let mut stack = vec![self.dir.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).ctx(|| format!("read {}", d.display()))? {
                let e = e.ctx(|| "readdir".into())?;
                let m = e.metadata().ctx(|| "stat".into())?;
                if m.is_dir() {
                    stack.push(e.path());
                } else {
                    total += m.len();
                }
            }
        }
        Ok(total)
    }
    fn make_snapshot_root(&self, path: &str) -> Result<()> {
        let p = self.dir.join(path);
        std::fs::create_dir(&p).ctx(|| format!("mkdir {}", p.display()))
    }
    fn snapshot(&self, _path: &str, _name: &str) -> Result<bool> {
        Ok(false)
    }
}

/// Runs `f` with a [`RunEnv`] over `dir` (which must exist and be empty).
pub fn with_env<T>(dir: &Path, f: impl FnOnce(&RunEnv) -> T) -> T {
    let vfs = PosixVfs::open(dir).expect("open test dir");
    let probe = DirProbe {
        dir: dir.to_path_buf(),
    };
    let bar = ProgressBar::hidden();
    let env = RunEnv {
        dir: Some(dir.to_path_buf()),
        vfs: &vfs,
        probe: &probe,
        fs_label: "test".into(),
        fs_type: "test".into(),
        seed: 1,
        run: 0,
        mem_limit: None,
        progress: &bar,
    };
    f(&env)
}
