//! Requests received per opcode, so that every round trip the kernel makes is visible
//! (`anvil stats DIR`): the way to find requests the daemon could make unnecessary. The
//! io_uring and devfuse transports also add up how long the daemon took over each opcode
//! (from the request's arrival to its answer), which tells the daemon's share of a round
//! trip from the transport's.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! opcodes {
    ($($op:ident => $name:literal $(| $code:literal)+),* $(,)?) => {
        /// The FUSE requests the daemon counts.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op { $($op),* }

        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$op),*];

            /// The kernel's name for the opcode (FUSE_<name>).
            pub fn name(self) -> &'static str {
                match self { $(Op::$op => $name),* }
            }

            /// The counter for the kernel's opcode number (`fuse_in_header::opcode`).
            pub fn from_opcode(opcode: u32) -> Op {
                match opcode {
                    $($($code)|* => Op::$op,)*
                    _ => Op::Other,
                }
            }
        }
    };
}

// Opcode numbers from the kernel's include/uapi/linux/fuse.h (RENAME2 counts as RENAME,
// BATCH_FORGET as FORGET; no request has opcode 0).
opcodes! {
    Lookup => "LOOKUP" | 1, Forget => "FORGET" | 2 | 42, Getattr => "GETATTR" | 3,
    Setattr => "SETATTR" | 4, Readlink => "READLINK" | 5, Symlink => "SYMLINK" | 6,
    Mknod => "MKNOD" | 8, Mkdir => "MKDIR" | 9, Unlink => "UNLINK" | 10, Rmdir => "RMDIR" | 11,
    Rename => "RENAME" | 12 | 45, Link => "LINK" | 13, Open => "OPEN" | 14, Read => "READ" | 15,
    Write => "WRITE" | 16, Statfs => "STATFS" | 17, Release => "RELEASE" | 18,
    Fsync => "FSYNC" | 20, Setxattr => "SETXATTR" | 21, Getxattr => "GETXATTR" | 22,
    Listxattr => "LISTXATTR" | 23, Removexattr => "REMOVEXATTR" | 24, Flush => "FLUSH" | 25,
    Opendir => "OPENDIR" | 27, Readdir => "READDIR" | 28, Releasedir => "RELEASEDIR" | 29,
    Fsyncdir => "FSYNCDIR" | 30, Access => "ACCESS" | 34, Create => "CREATE" | 35,
    Readdirplus => "READDIRPLUS" | 44, Fallocate => "FALLOCATE" | 43, Other => "OTHER" | 0,
}

/// Requests of an opcode timed each, before `Counters::times` samples them.
const TIMED_ALWAYS: u64 = 256;
/// After those, one request in this many of the opcode is timed.
const TIMED_EVERY: u64 = 16;

/// One counter per opcode, updated with relaxed atomics (no lock on the request path).
pub struct Counters {
    counts: Vec<AtomicU64>,
    /// Per opcode: requests timed, and the nanoseconds they took in the daemon.
    served: Vec<(AtomicU64, AtomicU64)>,
    transport: std::sync::OnceLock<&'static str>,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            counts: Op::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
            served: Op::ALL
                .iter()
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
            transport: std::sync::OnceLock::new(),
        }
    }
}

impl Counters {
    pub fn count(&self, op: Op) {
        self.counts[op as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, op: Op) -> u64 {
        self.counts[op as usize].load(Ordering::Relaxed)
    }

    /// Whether to time a request of kernel opcode `opcode`: each of an opcode's first
    /// `TIMED_ALWAYS`, then one in `TIMED_EVERY`. Two clock reads and two more counters
    /// shared by the workers, for every request, cost a `make -j4` through the mount about
    /// 2% (nightly-build, benchmarks.md, forty-first session).
    pub fn times(&self, opcode: u32) -> bool {
        let n = self.get(Op::from_opcode(opcode));
        n < TIMED_ALWAYS || n % TIMED_EVERY == 0
    }

    /// Adds one request of kernel opcode `opcode` that the daemon took `took` to answer. A
    /// request counted before a `reset` (the reset's own, for one) is not timed after it.
    pub fn served(&self, opcode: u32, took: std::time::Duration) {
        let op = Op::from_opcode(opcode);
        if self.get(op) == 0 {
            return;
        }
        let (count, nanos) = &self.served[op as usize];
        count.fetch_add(1, Ordering::Relaxed);
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        nanos.fetch_add(took, Ordering::Relaxed);
    }

    /// Mean time the daemon took over a request of `op`, if any was timed.
    pub fn mean_served(&self, op: Op) -> Option<std::time::Duration> {
        let (count, nanos) = &self.served[op as usize];
        let count = count.load(Ordering::Relaxed);
        (count > 0).then(|| std::time::Duration::from_nanos(nanos.load(Ordering::Relaxed) / count))
    }

    pub fn reset(&self) {
        for count in &self.counts {
            count.store(0, Ordering::Relaxed);
        }
        for (count, nanos) in &self.served {
            count.store(0, Ordering::Relaxed);
            nanos.store(0, Ordering::Relaxed);
        }
    }

    /// Records which transport serves the mount ("classic" or "uring").
    pub fn set_transport(&self, name: &'static str) {
        let _ = self.transport.set(name);
    }

    /// `{"transport": "...", "requests": {"LOOKUP": n, ...}, "served_us": {"LOOKUP": mean,
    /// ...}}`, opcodes never seen left out (and `served_us` where nothing was timed).
    pub fn to_json(&self) -> String {
        let mut requests = serde_json::Map::new();
        let mut served = serde_json::Map::new();
        for &op in Op::ALL {
            let n = self.get(op);
            if n > 0 {
                requests.insert(op.name().to_string(), n.into());
            }
            if let Some(mean) = self.mean_served(op) {
                let micros = (mean.as_secs_f64() * 1e7).round() / 10.0;
                served.insert(op.name().to_string(), micros.into());
            }
        }
        serde_json::json!({
            "transport": self.transport.get().copied().unwrap_or("unknown"),
            "requests": requests,
            "served_us": served,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_resets() {
        let c = Counters::default();
        c.count(Op::Lookup);
        c.count(Op::Lookup);
        c.count(Op::Write);
        c.set_transport("classic");
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(v["transport"], "classic");
        assert_eq!(v["requests"]["LOOKUP"], 2);
        assert_eq!(v["requests"]["WRITE"], 1);
        assert!(v["requests"].get("READ").is_none());
        assert!(v["served_us"].as_object().unwrap().is_empty());
        c.count(Op::Rename);
        c.count(Op::Other);
        c.served(1, std::time::Duration::from_micros(3));
        c.served(1, std::time::Duration::from_micros(5));
        c.served(45, std::time::Duration::from_micros(7));
        c.served(9999, std::time::Duration::from_micros(1));
        // Never counted (or counted before a reset): not timed.
        c.served(21, std::time::Duration::from_micros(2));
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(v["served_us"]["LOOKUP"], 4.0);
        assert_eq!(v["served_us"]["RENAME"], 7.0);
        assert_eq!(v["served_us"]["OTHER"], 1.0);
        assert!(v["served_us"].get("SETXATTR").is_none());
        c.reset();
        assert_eq!(c.get(Op::Lookup), 0);
        assert_eq!(c.mean_served(Op::Lookup), None);
        // The first requests of an opcode are all timed, then one in TIMED_EVERY.
        assert!(c.times(1));
        for _ in 0..TIMED_ALWAYS {
            c.count(Op::Lookup);
        }
        let timed = (0..TIMED_EVERY * 4)
            .filter(|_| {
                c.count(Op::Lookup);
                c.times(1)
            })
            .count();
        assert_eq!(timed, 4);
    }

    #[test]
    fn opcode_numbers_name_their_counters() {
        assert_eq!(Op::from_opcode(1), Op::Lookup);
        assert_eq!(Op::from_opcode(42), Op::Forget);
        assert_eq!(Op::from_opcode(15), Op::Read);
        assert_eq!(Op::from_opcode(16), Op::Write);
        assert_eq!(Op::from_opcode(35), Op::Create);
        assert_eq!(Op::from_opcode(44), Op::Readdirplus);
        assert_eq!(Op::from_opcode(26), Op::Other); // INIT
    }
}
