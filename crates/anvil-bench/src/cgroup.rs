//! A memory cgroup that the benchmark process joins, so that everything it
//! runs afterwards — the workload, gcc, rsync, the anvil and zfs-fuse daemons
//! — shares one memory limit, page cache included ("system caches blown
//! out"). cgroup v1 (`memory.limit_in_bytes`) and v2 (`memory.max`) are both
//! handled; the group is removed when dropped.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{fail, Context, Result};

const V1_ROOT: &str = "/sys/fs/cgroup/memory";
const V2_ROOT: &str = "/sys/fs/cgroup";
/// A run's group is this and its PID.
const GROUP_PREFIX: &str = "anvil-bench-";

/// The cgroup version in use for memory, or None when there is no memory controller.
pub fn memory_controller() -> Option<&'static str> {
    if Path::new(V1_ROOT).join("memory.limit_in_bytes").exists() {
        Some("v1")
    } else if fs::read_to_string(Path::new(V2_ROOT).join("cgroup.controllers"))
        .map(|c| c.split_whitespace().any(|x| x == "memory"))
        .unwrap_or(false)
    {
        Some("v2")
    } else {
        None
    }
}

pub struct MemCgroup {
    path: PathBuf,
    v1: bool,
    /// Where this process was before joining.
    origin: PathBuf,
}

impl MemCgroup {
    /// Creates a child cgroup limited to `limit` bytes and moves this process into it.
    pub fn join_new(limit: u64) -> Result<MemCgroup> {
        let version = match memory_controller() {
            Some(v) => v,
            None => return fail("--mem-limit needs a cgroup memory controller; none is mounted"),
        };
        let v1 = version == "v1";
        let root = Path::new(if v1 { V1_ROOT } else { V2_ROOT });
        let origin = own_cgroup(root, v1)?;
        let swept = sweep_stale(root);
        if swept > 0 {
            eprintln!("removed {swept} memory cgroups left by benchmark runs that were killed");
        }
        let path = root.join(format!("{GROUP_PREFIX}{}", std::process::id()));
        if !v1 {
            // Delegate the memory controller to children of the root.
            let _ = fs::write(root.join("cgroup.subtree_control"), "+memory");
        }
        fs::create_dir(&path).ctx(|| format!("create cgroup {}", path.display()))?;
        let group = MemCgroup { path, v1, origin };
        let file = if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        fs::write(group.path.join(file), limit.to_string())
            .ctx(|| format!("set {}/{file}", group.path.display()))?;
        if !v1 {
            // Without swap limits the cgroup would swap instead of dropping caches.
            let _ = fs::write(group.path.join("memory.swap.max"), "0");
        }
        fs::write(
            group.path.join("cgroup.procs"),
            std::process::id().to_string(),
        )
        .ctx(|| format!("join cgroup {}", group.path.display()))?;
        Ok(group)
    }

    pub fn version(&self) -> &'static str {
        if self.v1 {
            "v1"
        } else {
            "v2"
        }
    }

    /// Processes of the group the kernel's OOM killer has killed so far (0 where the kernel
    /// does not say).
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        fs::read_to_string(self.path.join(file))
            .ok()
            .and_then(|text| oom_kills_in(&text))
            .unwrap_or(0)
    }

    /// Highest memory use of the group so far, if the kernel reports it.
    pub fn peak_bytes(&self) -> Option<u64> {
        let file = if self.v1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        };
        fs::read_to_string(self.path.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// The `oom_kill` count of a v1 `memory.oom_control` or a v2 `memory.events`.
fn oom_kills_in(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("oom_kill "))
        .and_then(|count| count.trim().parse().ok())
}

/// Makes `pid` the process the kernel's OOM killer takes first (an `oom_score_adj` of 500):
/// a file-system daemon the bench started, so that a daemon that does not fit the memory
/// limit fails its own target instead of the harness, which holds the other targets'
/// results (it is the largest process of the group while a proxy replay runs). Best
/// effort: without it the limit still holds.
pub fn prefer_as_oom_victim(pid: u32) {
    let path = format!("/proc/{pid}/oom_score_adj");
    if let Err(e) = fs::write(&path, "500") {
        eprintln!("note: could not write {path}: {e}");
    }
}

/// Removes the groups under `root` of runs that are gone: a run killed by the OOM killer
/// (or any signal) never drops its group. A group that still holds a process stays (the
/// kernel refuses to remove it). Returns how many went.
fn sweep_stale(root: &Path) -> usize {
    let Ok(entries) = fs::read_dir(root) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.strip_prefix(GROUP_PREFIX))
                .and_then(|pid| pid.parse::<u32>().ok());
            pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
                && fs::remove_dir(entry.path()).is_ok()
        })
        .count()
}

/// The cgroup directory this process is in, under `root`.
fn own_cgroup(root: &Path, v1: bool) -> Result<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup").ctx(|| "read /proc/self/cgroup".into())?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
        let (Some(controllers), Some(path)) = (controllers, path) else {
            continue;
        };
        let matches = if v1 {
            controllers.split(',').any(|c| c == "memory")
        } else {
            controllers.is_empty()
        };
        if matches {
            return Ok(root.join(path.trim_start_matches('/')));
        }
    }
    Ok(root.to_path_buf())
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        let _ = fs::write(
            self.origin.join("cgroup.procs"),
            std::process::id().to_string(),
        );
        // Children (daemons that outlived their run) keep the group busy; move them too.
        if let Ok(procs) = fs::read_to_string(self.path.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = fs::write(self.origin.join("cgroup.procs"), pid);
            }
        }
        let _ = fs::remove_dir(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_of_runs_that_are_gone_are_swept() {
        let root = std::env::temp_dir().join(format!("anvil-cgroup-sweep-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        // No process has a PID this high (pid_max is at most 2^22).
        let gone = root.join(format!("{GROUP_PREFIX}4000000000"));
        let alive = root.join(format!("{GROUP_PREFIX}{}", std::process::id()));
        let other = root.join("system.slice");
        let busy = root.join(format!("{GROUP_PREFIX}4000000001"));
        for dir in [&gone, &alive, &other, &busy] {
            fs::create_dir(dir).unwrap();
        }
        // A directory that is not empty cannot be removed, as a group with a process.
        fs::write(busy.join("cgroup.procs"), "1").unwrap();
        assert_eq!(sweep_stale(&root), 1);
        assert!(!gone.exists());
        assert!(alive.exists() && other.exists() && busy.exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn oom_kills_are_read_from_either_version() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        let v2 = "low 0\nhigh 0\nmax 31\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kills_in(v1), Some(2));
        assert_eq!(oom_kills_in(v2), Some(1));
        assert_eq!(oom_kills_in("oom_kill_disable 0\n"), None);
    }

    #[test]
    fn a_daemon_is_made_the_first_victim() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        prefer_as_oom_victim(child.id());
        let adj = fs::read_to_string(format!("/proc/{}/oom_score_adj", child.id())).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(adj.trim(), "500");
    }
}
