//! Mirror jobs on a mounted volume. `anvil mirror-read DIR` and `anvil mirror-write DIR`
//! make a FIFO, name it in a control attribute, and move the stream through it; the daemon
//! runs the job on a thread of its own (a stream can take minutes, and a request handler
//! must not), and reports it through `trusted.anvil.mirror` until the next job starts.

use crate::{AnvilFuse, Notifier};
use anvil::fs::MirrorReport;
use anvil::sync::Mutex;
use anvil::Filesystem;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

/// What a job is asked to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MirrorJob {
    /// Write the changes after `since` (up to `until`) into the FIFO at `path`.
    Read {
        since: String,
        until: Option<String>,
        path: PathBuf,
    },
    /// Apply the stream that comes through the FIFO at `path`.
    Write { path: PathBuf },
}

impl MirrorJob {
    /// Parses the value written to `trusted.anvil.mirror-read` ("SINCE UNTIL PATH", UNTIL
    /// "-" for the newest commit) or `trusted.anvil.mirror-write` ("PATH").
    pub fn parse(read: bool, text: &str) -> Option<MirrorJob> {
        if read {
            let mut parts = text.splitn(3, ' ');
            let since = parts.next()?.to_string();
            let until = match parts.next()? {
                "-" => None,
                until => Some(until.to_string()),
            };
            let path = PathBuf::from(parts.next()?);
            Some(MirrorJob::Read { since, until, path })
        } else {
            (!text.is_empty()).then(|| MirrorJob::Write {
                path: PathBuf::from(text),
            })
        }
    }

    fn path(&self) -> &PathBuf {
        match self {
            MirrorJob::Read { path, .. } | MirrorJob::Write { path } => path,
        }
    }
}

/// The last job and how it went.
#[derive(Default)]
pub struct MirrorJobs {
    last: Mutex<Option<JobStatus>>,
}

#[derive(Clone)]
struct JobStatus {
    path: PathBuf,
    running: bool,
    outcome: Option<Result<MirrorReport, String>>,
}

/// What a job's thread holds of the adapter.
struct Worker {
    fs: Arc<Filesystem>,
    jobs: Arc<MirrorJobs>,
    lookups: Arc<Mutex<foldhash::HashMap<u64, u64>>>,
    notifier: Arc<OnceLock<Notifier>>,
}

impl AnvilFuse {
    /// Starts a job unless one runs (EBUSY).
    pub(crate) fn start_mirror_job(&self, job: MirrorJob) -> Result<(), i32> {
        {
            let mut last = self.mirror_jobs.last.lock();
            if last.as_ref().is_some_and(|j| j.running) {
                return Err(libc::EBUSY);
            }
            *last = Some(JobStatus {
                path: job.path().clone(),
                running: true,
                outcome: None,
            });
        }
        let worker = Worker {
            fs: self.fs.clone(),
            jobs: self.mirror_jobs.clone(),
            lookups: self.lookups.clone(),
            notifier: self.notifier.clone(),
        };
        std::thread::Builder::new()
            .name("anvil-mirror".into())
            .spawn(move || {
                // Started from a request worker, this thread would inherit SCHED_IDLE and
                // all but stop whenever anything else wants the CPU.
                crate::set_idle_policy(false);
                let outcome = worker.run(&job);
                if let Err(e) = &outcome {
                    log::warn!("mirror job on {}: {e}", job.path().display());
                }
                *worker.jobs.last.lock() = Some(JobStatus {
                    path: job.path().clone(),
                    running: false,
                    outcome: Some(outcome),
                });
            })
            .map(|_| ())
            .map_err(|_| libc::EAGAIN)
    }

    /// `trusted.anvil.mirror`: the volume's mirror role and the last job (JSON).
    pub(crate) fn mirror_json(&self) -> Result<String, i32> {
        let mut json = status_json(&self.fs).map_err(|e| e.errno())?;
        if let Some(job) = &*self.mirror_jobs.last.lock() {
            let mut j = serde_json::json!({
                "path": job.path.display().to_string(),
                "running": job.running,
            });
            match &job.outcome {
                Some(Ok(report)) => j["report"] = report_json(report),
                Some(Err(e)) => j["error"] = e.clone().into(),
                None => {}
            }
            json["job"] = j;
        }
        Ok(json.to_string())
    }
}

impl Worker {
    fn run(&self, job: &MirrorJob) -> Result<MirrorReport, String> {
        match job {
            MirrorJob::Read { since, until, path } => {
                // Open first, so the reader at the other end never waits for nothing.
                let fifo = File::options()
                    .write(true)
                    .open(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let since = self.fs.tid_of(since).map_err(|e| e.to_string())?;
                let until = match until {
                    Some(spec) => Some(self.fs.tid_of(spec).map_err(|e| e.to_string())?),
                    None => None,
                };
                let mut out = BufWriter::with_capacity(1 << 20, fifo);
                self.fs
                    .mirror_read(since, until, &mut out)
                    .map_err(|e| e.to_string())
            }
            MirrorJob::Write { path } => {
                let fifo = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
                let mut input = BufReader::with_capacity(1 << 20, fifo);
                let report = self
                    .fs
                    .mirror_write(&mut input)
                    .map_err(|e| e.to_string())?;
                self.forget_cached_tree();
                Ok(report)
            }
        }
    }

    fn forget_cached_tree(&self) {
        forget_cached_tree(&self.lookups, &self.notifier);
    }
}

impl AnvilFuse {
    /// `trusted.anvil.mirror-attach`: this master becomes the slave of the volume
    /// promoted in its place. Undoing its changes since `at` can give a name the kernel
    /// caches another object (both volumes handed out the same new object ids), so every
    /// name the kernel may hold in a directory it knows is dropped too, on a thread of its
    /// own: the kernel takes a directory's lock to drop a name, and this request holds the
    /// root's.
    pub(crate) fn mirror_attach(&self, text: &str) -> Result<(), i32> {
        let (master, at, at_ns) = parse_attach(text).ok_or(libc::EINVAL)?;
        let known: Vec<u64> = self.lookups.lock().keys().copied().collect();
        let mut names: Vec<(u64, String)> = Vec::new();
        for dir in known.iter().copied().chain([1]) {
            let mut cookie = 0;
            while let Ok(entries) = self.fs.readdir(dir, cookie, 1024) {
                let Some(last) = entries.last() else { break };
                cookie = last.cookie;
                names.extend(
                    entries
                        .iter()
                        .filter(|e| e.name != b"." && e.name != b"..")
                        .filter_map(|e| Some((dir, String::from_utf8(e.name.clone()).ok()?))),
                );
            }
        }
        self.fs
            .mirror_attach(master, at, at_ns)
            .map_err(|e| e.errno())?;
        let (lookups, notifier) = (self.lookups.clone(), self.notifier.clone());
        let _ = std::thread::Builder::new()
            .name("anvil-attach".into())
            .spawn(move || {
                crate::set_idle_policy(false);
                forget_cached_tree(&lookups, &notifier);
                if let Some(notifier) = notifier.get() {
                    for (dir, name) in names {
                        notifier.inval_entry(dir, &name);
                    }
                }
            });
        Ok(())
    }
}

/// After a mirrored commit changed the tree under the kernel: drop what the kernel caches
/// of every object it knows (entries expire within the slave's short TTL).
pub(crate) fn forget_cached_tree(
    lookups: &Mutex<foldhash::HashMap<u64, u64>>,
    notifier: &OnceLock<Notifier>,
) {
    let Some(notifier) = notifier.get() else {
        return;
    };
    let known: Vec<u64> = lookups.lock().keys().copied().collect();
    notifier.inval_inode(1);
    for ino in known {
        notifier.inval_inode(ino);
    }
}

/// A volume's mirror role: its id and newest commit, and, on a slave, its master and the
/// last master TID it holds (what `anvil mirror-status` prints).
pub fn status_json(fs: &Filesystem) -> anvil::Result<serde_json::Value> {
    let state = fs.mirror_state()?;
    let info = fs.info();
    let mut json = serde_json::json!({
        "volume_id": info.volume_id,
        "committed_tid": info.committed_tid,
        "commit_time_ns": info.commit_time_ns,
        "slave": state.is_some(),
    });
    if let Some(state) = state {
        json["master"] = hex(&state.master).into();
        json["last_tid"] = state.last_tid.into();
        json["last_commit_ns"] = state.last_commit_ns.into();
        json["applied_ns"] = state.applied_ns.into();
    }
    if let Some(promoted) = fs.promoted_from()? {
        json["promoted_from"] = hex(&promoted.master).into();
        json["promoted_at"] = promoted.last_tid.into();
        json["promoted_at_commit_ns"] = promoted.last_commit_ns.into();
    }
    Ok(json)
}

pub fn report_json(r: &MirrorReport) -> serde_json::Value {
    serde_json::json!({
        "since": r.since,
        "until": r.until,
        "items": r.items,
        "inserted": r.inserted,
        "deleted": r.deleted,
        "ended": r.ended,
        "extent_bytes": r.extent_bytes,
        "stream_bytes": r.stream_bytes,
        "pruned_through": r.pruned_through,
        "already_held": r.already_held,
    })
}

/// Parses the value written to `trusted.anvil.mirror-attach`: "MASTER_ID TID COMMIT_NS"
/// (the id in hex, as `status_json` prints it).
pub fn parse_attach(text: &str) -> Option<([u8; 16], u64, u64)> {
    let mut parts = text.split_whitespace();
    let id = parts.next()?;
    let tid = parts.next()?.parse().ok()?;
    let commit_ns = parts.next()?.parse().ok()?;
    if id.len() != 32 || parts.next().is_some() {
        return None;
    }
    let mut master = [0u8; 16];
    for (i, byte) in master.iter_mut().enumerate() {
        *byte = u8::from_str_radix(id.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some((master, tid, commit_ns))
}

fn hex(id: &[u8]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::MirrorJob;
    use std::path::PathBuf;

    #[test]
    fn job_values_parse() {
        assert_eq!(
            MirrorJob::parse(true, "12 - /tmp/x y/fifo"),
            Some(MirrorJob::Read {
                since: "12".into(),
                until: None,
                path: PathBuf::from("/tmp/x y/fifo")
            })
        );
        assert_eq!(
            MirrorJob::parse(true, "weekly 0x20 /f"),
            Some(MirrorJob::Read {
                since: "weekly".into(),
                until: Some("0x20".into()),
                path: PathBuf::from("/f")
            })
        );
        assert_eq!(MirrorJob::parse(true, "12"), None);
        let id = "00112233445566778899aabbccddeeff";
        let (master, tid, ns) = super::parse_attach(&format!("{id} 42 7")).unwrap();
        assert_eq!((master[1], master[15], tid, ns), (0x11, 0xff, 42, 7));
        assert_eq!(super::parse_attach("0011 42 7"), None);
        assert_eq!(super::parse_attach(&format!("{id} x 7")), None);
        assert_eq!(MirrorJob::parse(false, ""), None);
        assert_eq!(
            MirrorJob::parse(false, "/f"),
            Some(MirrorJob::Write {
                path: PathBuf::from("/f")
            })
        );
    }
}
