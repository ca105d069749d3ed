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

pub mod btree;
pub mod cache;
pub mod check;
pub mod checksum;
pub mod device;
pub mod error;
pub mod format;
pub mod fs;
pub mod space;
pub mod volume;

pub use error::{Error, Result};
pub use fs::{Attr, DirEntry, FileKind, Filesystem, MountOptions, SetAttr, VolumeInfo};
