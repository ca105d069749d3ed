//! The workers' guard against starvation.
//!
//! Workers wait under SCHED_IDLE (`set_idle_policy`): on a quiet machine the caller is then
//! woken on the worker's CPU and a round trip takes 10 us instead of 30. But a SCHED_IDLE
//! thread runs only when nothing else wants its CPU. When other programs keep every CPU
//! busy (blogbench's hundred readers, each re-reading the page cache), requests wait for
//! the workers behind them: blogbench's writers, each file five round trips, wrote a third of
//! the blogs they wrote when the readers still blocked now and then.
//!
//! So a thread watches how busy the machine's CPUs are (`/proc/stat`, every 100 ms). When
//! they were busy almost all of two windows in a row, every thread of the daemon under
//! SCHED_IDLE moves to SCHED_OTHER at nice -10 (0 where the daemon may not raise its
//! priority): a request is then served ahead of the programs that keep the CPUs busy, as a
//! kernel file system's work would be, in the caller's own time. After a second with idle
//! time on the CPUs again they go back to SCHED_IDLE. Threads started while the guard has
//! them raised (read-ahead threads start under SCHED_IDLE) are raised at its next look.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

/// How often the guard looks.
const WINDOW: Duration = Duration::from_millis(100);
/// The CPUs' busy share over a window from which the workers are starved.
const BUSY: f64 = 0.9;
/// Windows in a row that raise the workers.
const BUSY_WINDOWS: u32 = 2;
/// The busy share below which a window counts as quiet, and quiet windows in a row that
/// put the workers back under SCHED_IDLE.
const QUIET: f64 = 0.75;
const QUIET_WINDOWS: u32 = 10;
/// The nice value of raised workers.
const RAISED_NICE: i32 = -10;

/// The nice value of the thread that started the guard (the daemon's own), which a thread
/// that sets its policy takes back: one started by a raised worker inherits nice -10, and a
/// mirror job that leaves the workers' SCHED_IDLE for SCHED_OTHER must not keep it.
static BASE_NICE: AtomicI32 = AtomicI32::new(i32::MIN);

/// The daemon's nice value once a guard runs.
pub(crate) fn base_nice() -> Option<i32> {
    Some(BASE_NICE.load(Ordering::Relaxed)).filter(|&n| n != i32::MIN)
}

/// The running guard; stops when dropped, and puts back under SCHED_IDLE what it raised.
pub type Guard = crate::Periodic;

/// Starts the guard over this process's threads.
pub fn guard() -> std::io::Result<Guard> {
    // SAFETY: gettid has no preconditions.
    if let Ok(nice) = thread_nice(unsafe { libc::gettid() }) {
        BASE_NICE.store(nice, Ordering::Relaxed);
    }
    let mut watch = Watch {
        judge: Judge::default(),
        last: cpu_times(),
        raised: HashMap::new(),
        nice: RAISED_NICE,
    };
    crate::Periodic::spawn("anvil-sched", WINDOW, move || watch.window())
}

/// Whether the guard should raise the workers, from the busy share of each window.
#[derive(Default)]
struct Judge {
    raised: bool,
    run: u32,
}

impl Judge {
    /// Takes a window's busy share; says whether the workers should be raised now.
    fn window(&mut self, busy: f64) -> bool {
        let toward = match self.raised {
            false => busy >= BUSY,
            true => busy < QUIET,
        };
        self.run = if toward { self.run + 1 } else { 0 };
        let needed = if self.raised {
            QUIET_WINDOWS
        } else {
            BUSY_WINDOWS
        };
        if self.run >= needed {
            self.raised = !self.raised;
            self.run = 0;
        }
        self.raised
    }
}

/// The guard's state between windows.
struct Watch {
    judge: Judge,
    last: Option<(u64, u64)>,
    /// Threads raised, by id, with the nice value they had and the one they were given.
    raised: HashMap<i32, (i32, i32)>,
    /// The nice value raised threads get (0 once -10 was refused).
    nice: i32,
}

impl Watch {
    fn window(&mut self) {
        let now = cpu_times();
        let (Some(before), Some(after)) = (self.last, now) else {
            self.last = now;
            return;
        };
        self.last = now;
        if self.judge.window(busy_share(before, after)) {
            // Forget threads that ended, so that an id the kernel gives again is never
            // taken for one raised here.
            let live = threads();
            self.raised.retain(|tid, _| live.contains(tid));
            for tid in live.into_iter().filter(|&tid| is_idle(tid)) {
                if let std::collections::hash_map::Entry::Vacant(slot) = self.raised.entry(tid) {
                    match raise(tid, self.nice) {
                        Ok(old) => {
                            slot.insert((old, self.nice));
                        }
                        Err(e) if self.nice < 0 && e.raw_os_error() == Some(libc::EACCES) => {
                            log::info!("workers raised at nice 0 only: {e}");
                            self.nice = 0;
                        }
                        Err(e) => log::debug!("thread {tid} stays under SCHED_IDLE: {e}"),
                    }
                }
            }
        } else if !self.raised.is_empty() {
            log::debug!(
                "CPUs quiet again: {} threads back under SCHED_IDLE",
                self.raised.len()
            );
            self.lower_all();
        }
    }

    fn lower_all(&mut self) {
        for (tid, (old, given)) in self.raised.drain() {
            lower(tid, old, given);
        }
    }
}

/// The guard stopped (its thread drops the state as it ends).
impl Drop for Watch {
    fn drop(&mut self) {
        self.lower_all();
    }
}

/// Busy and total jiffies of all CPUs since boot (the first line of /proc/stat).
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(stat.lines().next()?)
}

/// `cpu  user nice system idle iowait irq softirq steal ...`: (busy, total), idle and
/// iowait being the not-busy part.
fn parse_cpu_line(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    let values: Vec<u64> = fields
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let total: u64 = values.iter().sum();
    let idle = values.get(3)? + values.get(4)?;
    Some((total - idle, total))
}

fn busy_share(before: (u64, u64), after: (u64, u64)) -> f64 {
    let total = after.1.saturating_sub(before.1);
    if total == 0 {
        return 0.0;
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "jiffies of 100 ms windows are small"
    )]
    let share = after.0.saturating_sub(before.0) as f64 / total as f64;
    share
}

/// This process's threads.
fn threads() -> std::collections::HashSet<i32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return std::collections::HashSet::new();
    };
    tasks
        .filter_map(|t| t.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .collect()
}

fn is_idle(tid: i32) -> bool {
    // SAFETY: a query of a thread by id; an id that is gone gives -1.
    unsafe { libc::sched_getscheduler(tid) == libc::SCHED_IDLE }
}

/// Moves thread `tid` from SCHED_IDLE to SCHED_OTHER at `nice`; returns the nice value it
/// had.
fn raise(tid: i32, nice: i32) -> std::io::Result<i32> {
    let old = thread_nice(tid)?;
    set_nice(tid, nice)?;
    set_policy(tid, libc::SCHED_OTHER)?;
    Ok(old)
}

/// Puts a raised thread back under SCHED_IDLE with its old nice value, unless it changed
/// its policy or nice value itself meanwhile (or is gone).
fn lower(tid: i32, old_nice: i32, given_nice: i32) {
    // SAFETY: a query of a thread by id; an id that is gone gives -1.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy != libc::SCHED_OTHER || thread_nice(tid).ok() != Some(given_nice) {
        return;
    }
    let _ = set_policy(tid, libc::SCHED_IDLE);
    let _ = set_nice(tid, old_nice);
}

fn set_policy(tid: i32, policy: i32) -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: a system call on a thread id with a valid parameter block.
    match unsafe { libc::sched_setscheduler(tid, policy, &param) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn thread_nice(tid: i32) -> std::io::Result<i32> {
    let id = libc::id_t::try_from(tid).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // getpriority returns -1 both as a nice value and as an error: errno tells them apart.
    // SAFETY: errno is this thread's own.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: reads a thread's nice value by id.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, id) };
    let error = std::io::Error::last_os_error();
    match nice == -1 && error.raw_os_error() != Some(0) {
        true => Err(error),
        false => Ok(nice),
    }
}

fn set_nice(tid: i32, nice: i32) -> std::io::Result<()> {
    let id = libc::id_t::try_from(tid).map_err(|_| std::io::ErrorKind::InvalidInput)?;
    // SAFETY: setpriority on a thread by id (Linux: PRIO_PROCESS names one thread).
    match unsafe { libc::setpriority(libc::PRIO_PROCESS, id, nice) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_windows_raise_and_quiet_ones_lower() {
        let mut judge = Judge::default();
        assert!(!judge.window(0.95), "one busy window is not enough");
        assert!(!judge.window(0.5));
        assert!(!judge.window(0.95));
        assert!(judge.window(0.99), "two in a row raise");
        for _ in 0..QUIET_WINDOWS - 1 {
            assert!(judge.window(0.5));
        }
        assert!(
            judge.window(0.8),
            "a window above QUIET starts the count again"
        );
        for _ in 0..QUIET_WINDOWS - 1 {
            assert!(judge.window(0.1));
        }
        assert!(!judge.window(0.1), "a second of quiet lowers");
    }

    #[test]
    fn cpu_lines_give_busy_and_total() {
        let line = "cpu  100 5 50 800 40 3 2 0 0 0";
        assert_eq!(parse_cpu_line(line), Some((160, 1000)));
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(parse_cpu_line("cpu  1 2"), None);
        assert!((busy_share((160, 1000), (250, 1100)) - 0.9).abs() < 1e-9);
        assert!(busy_share((5, 5), (5, 5)).abs() < 1e-9);
    }

    #[test]
    fn a_thread_leaving_the_workers_policy_takes_the_daemons_nice() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!(
                "SKIPPED: a_thread_leaving_the_workers_policy_takes_the_daemons_nice: raising \
                 a thread's priority needs root"
            );
            return;
        }
        // SAFETY: gettid has no preconditions.
        let base = thread_nice(unsafe { libc::gettid() }).unwrap();
        BASE_NICE.store(base, Ordering::Relaxed);
        let worker = std::thread::spawn(|| {
            // SAFETY: as above.
            set_nice(unsafe { libc::gettid() }, RAISED_NICE).unwrap();
            let started = std::thread::spawn(|| {
                // SAFETY: as above.
                let inherited = thread_nice(unsafe { libc::gettid() }).unwrap();
                crate::set_idle_policy(false);
                // SAFETY: as above.
                (inherited, thread_nice(unsafe { libc::gettid() }).unwrap())
            });
            started.join().unwrap()
        });
        assert_eq!(worker.join().unwrap(), (RAISED_NICE, base));
    }

    #[test]
    fn a_raised_thread_goes_back_under_sched_idle() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            crate::set_idle_policy(true);
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        // /proc/self/task is listed by position, so a listing taken while other threads
        // exit (other tests' threads here) can miss one: look again before failing.
        assert!((0..100).any(|_| threads().contains(&tid)));
        assert!(is_idle(tid));
        let old = raise(tid, 0).unwrap();
        // SAFETY: a query of a live thread.
        assert_eq!(unsafe { libc::sched_getscheduler(tid) }, libc::SCHED_OTHER);
        assert!(!is_idle(tid));
        // A thread whose nice value is not the one it was given is not the raised one.
        lower(tid, old, 5);
        assert!(!is_idle(tid));
        lower(tid, old, 0);
        assert!(is_idle(tid));
        done_tx.send(()).unwrap();
        worker.join().unwrap();
    }
}
