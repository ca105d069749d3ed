//! The mutex every lock on a request's path uses: one that waits without yielding the CPU.
//!
//! `parking_lot`'s mutex, contended, spins a little and then calls `sched_yield` up to seven
//! times before it sleeps. On a busy machine that is the wrong thing for a mount's request
//! workers: a yield tells the scheduler to run every other runnable thread first, so a worker
//! that met a lock held for a microsecond by the other worker or the committer gave its CPU
//! away for a time slice (milliseconds) while the request, and every request queued behind it
//! on that CPU's ring, waited. Measured on blogbench (100 reader threads on 2 CPUs): one
//! request in 190 took 2 ms or more, 6.5 ms on average, and a trace of the workers' context
//! switches found them in that yield.
//! The standard library's futex mutex spins briefly (about a hundred loads), then sleeps until
//! the holder's unlock wakes it. Waking is not free either: the woken worker waits for the
//! scheduler to give it its CPU back, and on blogbench a wait for the volume's state lock
//! took 160-330 us on average although the lock was held for 2-8 us. So a mount's request
//! worker (one per CPU, marked by `spin_when_contended`) that finds a lock taken first looks
//! again for up to `SPIN` (30 us) while the holder, on the other CPU, finishes, and sleeps
//! only after that (and at once on a machine with one CPU, where the holder cannot run while
//! it spins). Other threads sleep at once: where a hundred of a program's threads call the
//! library, the holder is as likely to be waiting for a CPU as running. See docs/design.md,
//! "Locks that do not yield". The workers' waits are counted (`worker_lock_waits`, in
//! `anvil info`'s engine counters): how much of a request's time other threads held it up.
//!
//! Poisoning is ignored, as `parking_lot` ignores it: a panic while holding a lock already
//! fails the request that panicked, and the state it guards is checked by its users.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, TryLockError};
use std::time::{Duration, Instant};

thread_local! {
    /// Whether this thread spins before it sleeps on a contended lock.
    static SPINS: Cell<bool> = const { Cell::new(false) };
    /// Whether this thread is a request worker (marked by `spin_when_contended`, whether or
    /// not it spins): its waits are counted.
    static WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Makes the calling thread try a contended lock again for up to `SPIN` before it sleeps
/// (true), or sleep at once (false, every thread's default). For a mount's request workers,
/// one per CPU, whose locks are mostly held by the worker on the other CPU. On a machine
/// with one CPU the thread sleeps at once all the same: the holder cannot run while it spins.
pub fn spin_when_contended(spins: bool) {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    SPINS.with(|cell| cell.set(spins && cpus >= 2));
    WORKER.with(|cell| cell.set(spins));
}

/// How long a contended `lock` keeps trying before it sleeps: a few times the state lock's
/// usual hold (2-8 us on blogbench), well under what a sleep and wakeup cost (160-330 us).
const SPIN: Duration = Duration::from_micros(30);

/// Tries `attempt` until it succeeds or `SPIN` has passed; None without trying on a thread
/// that `spin_when_contended` did not mark.
fn spin<G>(mut attempt: impl FnMut() -> Option<G>) -> Option<G> {
    if !SPINS.with(Cell::get) {
        return None;
    }
    let started = Instant::now();
    loop {
        for _ in 0..32 {
            std::hint::spin_loop();
        }
        if let Some(guard) = attempt() {
            return Some(guard);
        }
        if started.elapsed() >= SPIN {
            return None;
        }
    }
}

/// Locks that request workers (threads marked by `spin_when_contended`) found taken, and
/// the nanoseconds they waited for them, in this process.
static WORKER_WAITS: AtomicU64 = AtomicU64::new(0);
static WORKER_WAIT_NS: AtomicU64 = AtomicU64::new(0);

/// How many times a request worker found a lock taken, and how long it waited in all:
/// the part of a request's time spent behind other threads (`Volume::report`).
pub fn worker_lock_waits() -> (u64, Duration) {
    (
        WORKER_WAITS.load(Ordering::Relaxed),
        Duration::from_nanos(WORKER_WAIT_NS.load(Ordering::Relaxed)),
    )
}

/// Guard of a [`Mutex`].
pub type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;

/// A mutual-exclusion lock with `parking_lot`'s interface (no poisoning) over the standard
/// library's futex mutex.
#[derive(Default)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    /// Waits for the lock (asleep, after trying again for up to `SPIN` on a thread marked by
    /// `spin_when_contended`; never yielding).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        if let Some(guard) = self.try_lock() {
            return guard;
        }
        self.lock_contended()
    }

    #[cold]
    fn lock_contended(&self) -> MutexGuard<'_, T> {
        let started = WORKER.with(Cell::get).then(Instant::now);
        let guard = match spin(|| self.try_lock()) {
            Some(guard) => guard,
            None => self.0.lock().unwrap_or_else(PoisonError::into_inner),
        };
        if let Some(started) = started {
            WORKER_WAITS.fetch_add(1, Ordering::Relaxed);
            let ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            WORKER_WAIT_NS.fetch_add(ns, Ordering::Relaxed);
        }
        guard
    }

    /// The lock if it is free now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized + std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_lock_held_by_a_thread_that_panicked_is_still_usable() {
        let lock = Arc::new(Mutex::new(1));
        let held = lock.clone();
        let _ = std::thread::spawn(move || {
            let mut guard = held.lock();
            *guard = 2;
            panic!("while holding the lock");
        })
        .join();
        assert_eq!(*lock.lock(), 2);
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn a_lock_held_past_the_spin_is_waited_for_asleep() {
        spin_when_contended(true);
        let lock = Arc::new(Mutex::new(0u32));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                let mut guard = lock.lock();
                held_tx.send(()).expect("send");
                std::thread::sleep(SPIN * 2000);
                *guard = 1;
            })
        };
        held_rx.recv().expect("holder took the lock");
        let (waits, waited) = worker_lock_waits();
        // Taken only once the holder let go, with its change.
        assert_eq!(*lock.lock(), 1);
        holder.join().expect("holder");
        // The wait is counted for this marked thread (other tests may add their own).
        let (waits_after, waited_after) = worker_lock_waits();
        assert!(waits_after > waits);
        assert!(
            waited_after - waited >= SPIN,
            "{waited:?} -> {waited_after:?}"
        );
    }

    #[test]
    fn try_lock_fails_while_the_lock_is_held() {
        let lock = Mutex::new(());
        let guard = lock.lock();
        assert!(lock.try_lock().is_none());
        drop(guard);
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn contended_increments_are_all_counted_also_by_threads_that_spin() {
        let lock = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let spinning = i % 2 == 0;
                let lock = lock.clone();
                std::thread::spawn(move || {
                    spin_when_contended(spinning);
                    for _ in 0..10_000 {
                        *lock.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        assert_eq!(
            Arc::try_unwrap(lock).map(Mutex::into_inner).ok(),
            Some(40_000)
        );
    }
}
