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
//! The standard library's futex mutex spins briefly, then sleeps until the holder's unlock
//! wakes it, and the woken worker (nice -10 under load) runs at once. See docs/design.md,
//! "Locks that do not yield".
//!
//! Poisoning is ignored, as `parking_lot` ignores it: a panic while holding a lock already
//! fails the request that panicked, and the state it guards is checked by its users.

use std::sync::{PoisonError, TryLockError};

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
    /// Waits for the lock (spinning briefly, then asleep; never yielding).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
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
    fn try_lock_fails_while_the_lock_is_held() {
        let lock = Mutex::new(());
        let guard = lock.lock();
        assert!(lock.try_lock().is_none());
        drop(guard);
        assert!(lock.try_lock().is_some());
    }

    #[test]
    fn contended_increments_are_all_counted() {
        let lock = Arc::new(Mutex::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let lock = lock.clone();
                std::thread::spawn(move || {
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
