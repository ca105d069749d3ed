//! Types of the filesystem API.

use crate::format::record::{kind, Inode, Timestamp};

pub use crate::format::record::Timestamp as Time;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & kind::MASK {
            kind::DIR => FileKind::Dir,
            kind::SYMLINK => FileKind::Symlink,
            kind::FIFO => FileKind::Fifo,
            kind::SOCKET => FileKind::Socket,
            kind::CHAR => FileKind::CharDevice,
            kind::BLOCK => FileKind::BlockDevice,
            _ => FileKind::File,
        }
    }
}

/// Attributes of an object, as stat reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub kind: FileKind,
    /// Full mode: type and permission bits.
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    pub rdev: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    pub btime: Timestamp,
    pub flags: u32,
}

impl Attr {
    pub(crate) fn from_inode(ino: u64, inode: &Inode) -> Attr {
        Attr {
            ino,
            kind: FileKind::from_mode(inode.mode),
            mode: inode.mode,
            nlink: inode.nlink,
            uid: inode.uid,
            gid: inode.gid,
            size: inode.size,
            blocks: inode.size.div_ceil(4096) * 8,
            rdev: inode.rdev,
            atime: inode.atime,
            mtime: inode.mtime,
            ctime: inode.ctime,
            btime: inode.btime,
            flags: inode.flags,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: u64,
    pub kind: FileKind,
    /// Resume a listing after this entry by passing this cookie.
    pub cookie: u64,
}

/// A time to set: now, or a given time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(Timestamp),
}

/// Attribute changes for `setattr`; None leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<Timestamp>,
}

/// Who is asking: owner of anything created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
}

impl Caller {
    pub const ROOT: Caller = Caller { uid: 0, gid: 0 };
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

#[derive(Clone, Debug)]
pub struct StatFs {
    pub block_bytes: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_available: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_bytes_max: u32,
}

/// How a volume is opened.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Memory for cached nodes, cached file data and pending changes.
    pub cache_bytes: u64,
    /// At most this much of it holds decoded file data. A FUSE mount keeps it small: the
    /// kernel's page cache holds what was read or written through it. None: the split
    /// between tree nodes and file data follows use (a quarter of the budget each to begin
    /// with, the other half bounding pending changes).
    pub data_cache_bytes: Option<u64>,
    /// Overwrites and deletes destroy old versions instead of keeping history.
    pub nohistory: bool,
    pub read_only: bool,
    /// Background commit interval.
    pub commit_interval_ms: u64,
    /// Run first by the engine's opportunistic background threads (read-ahead), for
    /// example to give them the daemon's workers' scheduling policy. Not the committer.
    pub background_thread_start: Option<fn()>,
    /// Ignore the space map the last commit wrote and rebuild the free map by walking the
    /// whole tree (slow on large volumes; for timing the walk, or distrust of the map).
    pub rebuild_space_map: bool,
    /// Every change reaches the redo log before the call that made it returns, so a crash
    /// of the process (kill -9, OOM) loses nothing acknowledged. Off (`-o crash_log=off`):
    /// such a crash loses what changed since the last fsync or commit, as a power loss does.
    pub crash_log: bool,
    /// With `crash_log`: a file on tmpfs that takes the logged changes between fsyncs
    /// instead of the image (nothing then reaches the device until fsync or a commit).
    /// The same image must be opened with the same file to recover from a crash.
    pub crash_log_file: Option<std::path::PathBuf>,
    /// Destroy at open the objects that were unlinked while open when the volume last went
    /// down. Off when a new daemon takes over a FUSE connection whose kernel still holds
    /// them open (they go when the kernel forgets them, or at the next mount).
    pub reap_orphans: bool,
}

impl Default for MountOptions {
    fn default() -> MountOptions {
        MountOptions {
            cache_bytes: 256 << 20,
            data_cache_bytes: None,
            nohistory: false,
            read_only: false,
            commit_interval_ms: 5000,
            background_thread_start: None,
            rebuild_space_map: false,
            crash_log: true,
            crash_log_file: None,
            reap_orphans: true,
        }
    }
}

/// Where an image's crash log goes (`MountOptions::crash_log_file`) when it is opened as
/// `anvil mount` opens it: on tmpfs (`/dev/shm/anvil-<uid>`, or `dir`), named by the image's
/// identity (device and inode, or the block device's number), so that the next open of the
/// same image after a crash finds it and no other does. None when `image` cannot be
/// examined.
pub fn crash_log_file(
    image: &std::path::Path,
    dir: Option<&std::path::Path>,
) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(image).ok()?;
    let name = match meta.file_type().is_block_device() {
        true => format!("blk-{:x}.log", meta.rdev()),
        false => format!("file-{:x}-{:x}.log", meta.dev(), meta.ino()),
    };
    let dir = match dir {
        Some(dir) => dir.to_path_buf(),
        // /dev/shm is tmpfs on every Linux with systemd or udev; per user, since one
        // user's directory is not writable by another.
        // SAFETY: geteuid has no preconditions and cannot fail.
        None => format!("/dev/shm/anvil-{}", unsafe { libc::geteuid() }).into(),
    };
    Some(dir.join(name))
}

/// Summary of a volume for `anvil info`.
#[derive(Clone, Debug)]
pub struct VolumeInfo {
    pub label: String,
    pub volume_id: String,
    pub volume_bytes: u64,
    pub data_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub reserve_bytes: u64,
    pub committed_tid: u64,
    pub commit_time_ns: u64,
    pub created_time_ns: u64,
    pub objects_allocated: u64,
    /// Files, directories and other objects that exist now.
    pub objects: u64,
    pub pending_bytes: u64,
    pub cache_bytes: u64,
    pub read_only: bool,
    /// Files of cache directories evicted since the volume was opened, and the space
    /// their data held.
    pub evicted_files: u64,
    pub evicted_bytes: u64,
    /// The device's own counters (`Device::report`): an object store's uploads and cache,
    /// a local file's reads and those that met a write in flight.
    pub device: Vec<(&'static str, u64)>,
    /// The engine's counters (`Volume::report`): commits and writers that waited for them.
    pub engine: Vec<(&'static str, u64)>,
    /// The node and extent cache's size and hits (`CacheStats::report`).
    pub cache: Vec<(&'static str, u64)>,
}

impl VolumeInfo {
    /// One JSON object, for `anvil info --json` and the mount's info attribute.
    pub fn to_json(&self) -> String {
        let escape = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        format!(
            concat!(
                "{{\"label\":\"{}\",\"volume_id\":\"{}\",\"volume_bytes\":{},",
                "\"data_bytes\":{},\"used_bytes\":{},\"free_bytes\":{},\"reserve_bytes\":{},",
                "\"committed_tid\":{},\"commit_time_ns\":{},\"created_time_ns\":{},",
                "\"objects_allocated\":{},\"objects\":{},\"pending_bytes\":{},\"cache_bytes\":{},",
                "\"read_only\":{},\"evicted_files\":{},\"evicted_bytes\":{},\"device\":{{{}}},\"engine\":{{{}}},",
                "\"cache\":{{{}}}}}"
            ),
            escape(&self.label),
            self.volume_id,
            self.volume_bytes,
            self.data_bytes,
            self.used_bytes,
            self.free_bytes,
            self.reserve_bytes,
            self.committed_tid,
            self.commit_time_ns,
            self.created_time_ns,
            self.objects_allocated,
            self.objects,
            self.pending_bytes,
            self.cache_bytes,
            self.read_only,
            self.evicted_files,
            self.evicted_bytes,
            counters_json(&self.device),
            counters_json(&self.engine),
            counters_json(&self.cache),
        )
    }
}

fn counters_json(counters: &[(&str, u64)]) -> String {
    counters
        .iter()
        .map(|(name, value)| format!("\"{name}\":{value}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A snapshot: a committed TID kept by prune, with a label and creation time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub tid: u64,
    pub label: String,
    pub time_ns: u64,
}

/// One committed version of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub tid: u64,
    /// Commit time, ns since the epoch.
    pub time_ns: u64,
    pub size: u64,
    /// False for the TID that deleted the object.
    pub exists: bool,
}
