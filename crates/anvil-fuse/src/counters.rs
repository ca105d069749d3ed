//! Requests received per opcode, so that every round trip the kernel makes is visible
//! (`anvil stats DIR`): the way to find requests the daemon could make unnecessary.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! opcodes {
    ($($op:ident => $name:literal),* $(,)?) => {
        /// The FUSE requests the daemon counts.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Op { $($op),* }

        impl Op {
            pub const ALL: &'static [Op] = &[$(Op::$op),*];

            /// The kernel's name for the opcode (FUSE_<name>).
            pub fn name(self) -> &'static str {
                match self { $(Op::$op => $name),* }
            }
        }
    };
}

opcodes! {
    Lookup => "LOOKUP", Forget => "FORGET", Getattr => "GETATTR", Setattr => "SETATTR",
    Readlink => "READLINK", Symlink => "SYMLINK", Mknod => "MKNOD", Mkdir => "MKDIR",
    Unlink => "UNLINK", Rmdir => "RMDIR", Rename => "RENAME", Link => "LINK", Open => "OPEN",
    Read => "READ", Write => "WRITE", Statfs => "STATFS", Release => "RELEASE",
    Fsync => "FSYNC", Setxattr => "SETXATTR", Getxattr => "GETXATTR",
    Listxattr => "LISTXATTR", Removexattr => "REMOVEXATTR", Flush => "FLUSH",
    Opendir => "OPENDIR", Readdir => "READDIR", Releasedir => "RELEASEDIR",
    Fsyncdir => "FSYNCDIR", Access => "ACCESS", Create => "CREATE",
    Readdirplus => "READDIRPLUS", Fallocate => "FALLOCATE", Other => "OTHER",
}

/// One counter per opcode, updated with relaxed atomics (no lock on the request path).
pub struct Counters {
    counts: Vec<AtomicU64>,
    transport: std::sync::OnceLock<&'static str>,
}

impl Default for Counters {
    fn default() -> Counters {
        Counters {
            counts: Op::ALL.iter().map(|_| AtomicU64::new(0)).collect(),
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

    pub fn reset(&self) {
        for count in &self.counts {
            count.store(0, Ordering::Relaxed);
        }
    }

    /// Records which transport serves the mount ("classic" or "uring").
    pub fn set_transport(&self, name: &'static str) {
        let _ = self.transport.set(name);
    }

    /// `{"transport": "...", "requests": {"LOOKUP": n, ...}}`, opcodes never seen left out.
    pub fn to_json(&self) -> String {
        let mut requests = serde_json::Map::new();
        for &op in Op::ALL {
            let n = self.get(op);
            if n > 0 {
                requests.insert(op.name().to_string(), n.into());
            }
        }
        serde_json::json!({
            "transport": self.transport.get().copied().unwrap_or("unknown"),
            "requests": requests,
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
        c.reset();
        assert_eq!(c.get(Op::Lookup), 0);
    }
}
