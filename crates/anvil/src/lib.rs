//! anvil: a filesystem that never forgets.
//!
//! Layers, bottom up (nothing reaches up):
//! - [`device`]: persistent byte storage with an explicit flush barrier;
//! - [`format`]: on-media structures, explicitly encoded and checksummed;
//! - [`space`]: extent allocation; freed space is reused only after its commit is durable;
//! - [`cache`]: one memory-bounded cache of decoded nodes and data extents;
//! - [`btree`]: the one copy-on-write B-tree, keyed by (obj, rtype, key, create_tid);
//! - [`volume`]: flush-group commits, the redo log, recovery, as-of reads;
//! - [`fs`]: POSIX semantics over the tree;
//! - [`check`]: verification of every checksum and invariant.
//!
//! The library's interface is [`Filesystem`] (with its history views in [`fs`]), a
//! [`device::Device`] to open it on, [`check`], and [`Error`]. The tree, the allocator and
//! the transaction layer are crate-private; what tests, fuzzing and tools that look below
//! the file system need of them is re-exported, on purpose and in one place, by
//! [`internals`], which makes no promise of stability.

// Narrowing casts and `expect` fail loudly in review: every remaining site carries an
// `#[expect(..., reason = "...")]` saying why it cannot truncate, lose a sign or panic.
// Tests are free to use them.
#![cfg_attr(
    not(test),
    deny(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap,
        clippy::expect_used
    )
)]

pub(crate) mod btree;
pub(crate) mod cache;
pub mod check;
pub mod checksum;
pub mod device;
pub mod error;
pub mod format;
pub mod fs;
pub mod heap;
pub(crate) mod space;
pub mod sync;
pub(crate) mod volume;

/// Below the file system: the transaction layer and what its operations return, for tests,
/// fuzzing and inspection tools. Not a stable interface.
pub mod internals {
    pub use crate::btree::{Need, Step, Stop};
    pub use crate::cache::CacheStats;
    pub use crate::volume::{
        decode_extent, encode_extent, read_space_map, Tx, Usage, Value, Volume, VolumeOptions,
    };
}

pub use error::{Error, Result};
pub use fs::{
    crash_log_file, Attr, DirEntry, FileKind, Filesystem, MountOptions, SetAttr, VolumeInfo,
};
