//! FUSE adapter: serves an `anvil::Filesystem` to the kernel through `fuser`.
//!
//! Kernel caching is on (long entry/attr TTLs, keep_cache, writeback cache, readdirplus,
//! parallel dirops): every change goes through this mount, so the kernel's caches stay
//! coherent without invalidation. Permission checks are the kernel's (`default_permissions`).

mod views;

use anvil::fs::{Caller, RenameFlags as AnvilRename, SetAttr, TimeSet};
use anvil::{Attr, Error, FileKind, Filesystem};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use views::{is_view, Target, Views};

pub use fuser;

/// Read-only control attribute, on any object of the mount, that reports volume info.
pub const INFO_XATTR: &str = "trusted.anvil.info";
/// Writing any value to this attribute on the root commits now (like `sync`).
pub const SYNC_XATTR: &str = "trusted.anvil.sync";
/// Writing anything to this attribute on the root commits, then empties the daemon's node
/// cache, so that the next reads go to the device (for benchmarks; the kernel's caches are
/// dropped separately through /proc/sys/vm/drop_caches).
pub const DROPCACHE_XATTR: &str = "trusted.anvil.dropcache";
/// Writing a label (possibly empty) to this attribute on the root takes a snapshot.
pub const SNAPSHOT_XATTR: &str = "trusted.anvil.snapshot";
/// Writing a TID or label to this attribute on the root removes that snapshot.
pub const SNAPRM_XATTR: &str = "trusted.anvil.snaprm";
/// Reading this attribute on the root lists the snapshots (JSON).
pub const SNAPSHOTS_XATTR: &str = "trusted.anvil.snapshots";
/// Writing a policy (or "" for the stored one, or "everything") to this attribute on the
/// root prunes history; reading it returns the report of the last prune (JSON).
pub const PRUNE_XATTR: &str = "trusted.anvil.prune";
/// Reading or writing this attribute on the root gets or sets the retention policy.
pub const POLICY_XATTR: &str = "trusted.anvil.policy";
/// Reading this attribute on the root splits used space into live, history and tree (JSON;
/// scans the whole tree).
pub const SPACE_XATTR: &str = "trusted.anvil.space";
/// Writing a number of seconds to this attribute on the root reblocks for that long
/// (resuming where the last run stopped); reading it returns the last run's progress (JSON).
pub const REBLOCK_XATTR: &str = "trusted.anvil.reblock";
/// Reading or writing this attribute on the root gets or sets the `anvil cleanup` schedule.
pub const CLEANUP_XATTR: &str = "trusted.anvil.cleanup";
/// "1" or "0" on any object: history off or on for it (new children inherit it).
pub const NOHISTORY_XATTR: &str = "trusted.anvil.nohistory";
/// Reading this attribute on any object lists its versions (JSON, newest last).
pub const HISTORY_XATTR: &str = "trusted.anvil.history";
/// Versions listed through HISTORY_XATTR at most (an xattr value is at most 64 KiB).
const HISTORY_VERSIONS_MAX: usize = 600;

fn snapshots_json(list: &[anvil::fs::SnapshotInfo]) -> String {
    let items: Vec<String> = list
        .iter()
        .map(|s| {
            let label = s.label.replace('\\', "\\\\").replace('"', "\\\"");
            format!(
                "{{\"tid\":{},\"label\":\"{label}\",\"time_ns\":{}}}",
                s.tid, s.time_ns
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

fn history_json(versions: &[anvil::fs::Version]) -> String {
    let skip = versions.len().saturating_sub(HISTORY_VERSIONS_MAX);
    let items: Vec<String> = versions[skip..]
        .iter()
        .map(|v| {
            format!(
                "{{\"tid\":{},\"time_ns\":{},\"size\":{},\"exists\":{}}}",
                v.tid, v.time_ns, v.size, v.exists
            )
        })
        .collect();
    format!("[{}]", items.join(","))
}

pub struct AnvilFuse {
    fs: Arc<Filesystem>,
    ttl: Duration,
    writeback: bool,
    /// Kernel lookup counts. The kernel keeps a reference for every open file, so an object
    /// unlinked while known to the kernel lives (as an orphan) until its count drops to 0.
    /// This replaces OPEN/RELEASE tracking, which the kernel skips (FUSE_NO_OPEN_SUPPORT).
    lookups: Mutex<HashMap<u64, u64>>,
    views: Views,
    last_prune: Mutex<Option<anvil::fs::PruneReport>>,
    /// Last reblock run and its progress (done, total bytes).
    last_reblock: Mutex<Option<(anvil::fs::ReblockReport, u64, u64)>>,
    /// Set once the session exists; used to invalidate kernel caches of changed views.
    notifier: Arc<std::sync::OnceLock<fuser::Notifier>>,
}

impl AnvilFuse {
    /// `writeback`: let the kernel cache writes (fewer, larger writes reach us; the kernel
    /// then owns mtime and pushes it with SETATTR).
    /// Where the session's notifier goes once the session exists.
    pub fn notifier_slot(&self) -> Arc<std::sync::OnceLock<fuser::Notifier>> {
        self.notifier.clone()
    }

    /// Serves the volume as of `tid` (read-only) instead of its current state.
    pub fn as_of(mut self, tid: u64) -> AnvilFuse {
        self.views = Views::as_of(tid);
        self
    }

    pub fn new(fs: Arc<Filesystem>, ttl: Duration, writeback: bool) -> AnvilFuse {
        AnvilFuse {
            fs,
            ttl,
            writeback,
            lookups: Mutex::new(HashMap::new()),
            views: Views::default(),
            last_prune: Mutex::new(None),
            last_reblock: Mutex::new(None),
            notifier: Arc::new(std::sync::OnceLock::new()),
        }
    }

    /// Replies with an entry, which gives the kernel one more reference, or the error.
    fn reply_entry(&self, reply: ReplyEntry, result: anvil::Result<Attr>) {
        match result {
            Ok(attr) => {
                self.remember(attr.ino);
                reply.entry(&self.ttl, &file_attr(&attr), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Records one more kernel reference to `ino` (every entry reply gives one).
    fn remember(&self, ino: u64) {
        let first = {
            let mut lookups = self.lookups.lock();
            let count = lookups.entry(ino).or_insert(0);
            *count += 1;
            *count == 1
        };
        if first && !is_view(ino) {
            // Pins the object: unlink keeps it as an orphan while the kernel knows it.
            let _ = self.fs.open_handle(ino);
        }
    }
}

fn errno(e: &Error) -> Errno {
    if matches!(e, Error::Corrupt { .. } | Error::Io(_)) {
        log::error!("{e}");
    }
    if matches!(e, Error::NoSpace) {
        warn_full();
    }
    Errno::from_i32(e.errno())
}

/// Says once a minute, in the daemon's log, why writes fail and what frees space.
fn warn_full() {
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let last = LAST.load(std::sync::atomic::Ordering::Relaxed);
    if now >= last + 60
        && LAST
            .compare_exchange(
                last,
                now,
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
            )
            .is_ok()
    {
        log::warn!(
            "volume full: writes get ENOSPC; deleting frees nothing while history keeps old \
             versions: run `anvil prune MOUNTPOINT` or `anvil prune-everything MOUNTPOINT` \
             (`anvil info MOUNTPOINT` shows how much is history)"
        );
    }
}

fn system_time(t: anvil::fs::Time) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

fn timestamp(t: SystemTime) -> anvil::fs::Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => anvil::fs::Time {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let mut sec = -(d.as_secs() as i64);
            let mut nsec = d.subsec_nanos();
            if nsec > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - nsec;
            }
            anvil::fs::Time { sec, nsec }
        }
    }
}

fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn file_attr(attr: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(attr.ino),
        size: attr.size,
        blocks: attr.blocks,
        atime: system_time(attr.atime),
        mtime: system_time(attr.mtime),
        ctime: system_time(attr.ctime),
        crtime: system_time(attr.btime),
        kind: file_type(attr.kind),
        perm: (attr.mode & 0o7777) as u16,
        nlink: attr.nlink,
        uid: attr.uid,
        gid: attr.gid,
        rdev: attr.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(timestamp(t)),
    }
}

fn reply_xattr(reply: ReplyXattr, size: u32, data: &[u8]) {
    if size == 0 {
        reply.size(data.len() as u32);
    } else if (data.len() as u32) > size {
        reply.error(Errno::from_i32(libc::ERANGE));
    } else {
        reply.data(data);
    }
}

impl fuser::Filesystem for AnvilFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // No ATOMIC_O_TRUNC: OPEN is not sent (NO_OPEN_SUPPORT), so the kernel truncates
        // through SETATTR itself.
        let mut wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_NO_OPEN_SUPPORT
            | InitFlags::FUSE_NO_OPENDIR_SUPPORT;
        if self.writeback {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        let available = config.capabilities() & wanted;
        let _ = config.add_capabilities(available);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        let _ = config.set_max_background(64);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        Ok(())
    }

    fn destroy(&mut self) {
        if let Err(e) = self.fs.close() {
            log::error!("final commit failed: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.reply_entry(reply, self.lookup_any(parent.0, name.as_bytes()));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let last = {
            let mut lookups = self.lookups.lock();
            match lookups.get_mut(&ino.0) {
                Some(count) if *count > nlookup => {
                    *count -= nlookup;
                    false
                }
                Some(_) => {
                    lookups.remove(&ino.0);
                    true
                }
                None => false,
            }
        };
        if last && is_view(ino.0) {
            self.views.forget(ino.0);
        } else if last {
            if let Err(e) = self.fs.release_handle(ino.0) {
                log::error!("releasing object {}: {e}", ino.0);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.target(ino.0).and_then(|t| self.attr_of(t)) {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if is_view(ino.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        let changes = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime: ctime.map(timestamp),
        };
        match self.fs.setattr(ino.0, &changes) {
            Ok(attr) => reply.attr(&self.ttl, &file_attr(&attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let target = self.target(ino.0).and_then(|t| match t {
            Target::AsOf { obj, tid } => self.fs.at(tid)?.readlink(obj),
            Target::Live(ino) => self.fs.readlink(ino),
            Target::SnapDir => Err(Error::Posix(libc::EINVAL)),
        });
        match target {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        if is_view(parent.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        let mode = (mode & libc::S_IFMT) | (mode & 0o7777 & !umask);
        self.reply_entry(
            reply,
            self.fs
                .mknod(caller(req), parent.0, name.as_bytes(), mode, rdev as u64),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        if is_view(parent.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        self.reply_entry(
            reply,
            self.fs.mkdir(
                caller(req),
                parent.0,
                name.as_bytes(),
                mode & 0o7777 & !umask,
            ),
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if is_view(parent.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        match self.fs.unlink(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if is_view(parent.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        match self.fs.rmdir(parent.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        if is_view(parent.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        let target = target.as_os_str().as_bytes();
        self.reply_entry(
            reply,
            self.fs
                .symlink(caller(req), parent.0, link_name.as_bytes(), target),
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if is_view(parent.0) || is_view(newparent.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::from_i32(libc::EINVAL));
        }
        let flags = AnvilRename {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        match self.fs.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags,
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        if is_view(ino.0) || is_view(newparent.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        self.reply_entry(reply, self.fs.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // With FUSE_NO_OPEN_SUPPORT, ENOSYS tells the kernel to stop sending OPEN and
        // RELEASE and to keep its page cache across opens.
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let data = self.target(ino.0).and_then(|t| match t {
            Target::AsOf { obj, tid } => self.fs.at(tid)?.read(obj, offset, size),
            Target::Live(ino) => self.fs.read(ino, offset, size),
            Target::SnapDir => Err(Error::Posix(libc::EISDIR)),
        });
        match data {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if is_view(ino.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        match self.fs.write(ino.0, offset, data) {
            Ok(written) => reply.written(written as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to do on close; ENOSYS stops the kernel from sending FLUSH at all.
        reply.error(Errno::ENOSYS);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        if is_view(ino.0) {
            return reply.ok();
        }
        match self.fs.fsync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // FUSE_NO_OPENDIR_SUPPORT: no OPENDIR/RELEASEDIR round trips; the kernel checks
        // directory-ness itself and caches listings (FOPEN_CACHE_DIR is implied).
        reply.error(Errno::ENOSYS);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self
            .target(ino.0)
            .and_then(|t| self.readdir_view(t, offset, 256))
        {
            Ok(entries) => {
                for entry in entries {
                    let name = OsStr::from_bytes(&entry.name);
                    if reply.add(
                        INodeNo(entry.ino),
                        entry.cookie,
                        file_type(entry.kind),
                        name,
                    ) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self
            .target(ino.0)
            .and_then(|t| self.readdir_view(t, offset, 128))
        {
            Ok(entries) => entries,
            Err(e) => return reply.error(errno(&e)),
        };
        for entry in entries {
            let attr = match self.target(entry.ino).and_then(|t| self.attr_of(t)) {
                Ok(attr) => attr,
                // "." and ".." or a racing unlink: list the name without attributes.
                Err(_) => continue,
            };
            let name = OsStr::from_bytes(&entry.name);
            let ttl = if entry.name == b"." || entry.name == b".." {
                Duration::ZERO
            } else {
                self.ttl
            };
            if reply.add(
                INodeNo(entry.ino),
                entry.cookie,
                name,
                &ttl,
                &file_attr(&attr),
                Generation(0),
            ) {
                break;
            }
            // The kernel counts a lookup for every entry it was given, except "." and "..".
            if entry.name != b"." && entry.name != b".." {
                self.remember(entry.ino);
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.fs.fsync(ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.blocks,
            s.blocks_free,
            s.blocks_available,
            s.files,
            s.files_free,
            s.block_bytes,
            s.name_bytes_max,
            s.block_bytes,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        if is_view(ino.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        if name.as_bytes().starts_with(b"trusted.anvil.") {
            if ino.0 == 1 && name == SNAPSHOT_XATTR {
                let label = String::from_utf8_lossy(value).into_owned();
                return match self.fs.snapshot(&label) {
                    Ok(_) => {
                        self.invalidate_views(Vec::new(), false);
                        reply.ok()
                    }
                    Err(e) => reply.error(errno(&e)),
                };
            }
            if ino.0 == 1 && name == PRUNE_XATTR {
                let text = String::from_utf8_lossy(value).trim().to_string();
                let result = match text.as_str() {
                    "everything" => self.fs.prune(None, true),
                    "" => self.fs.prune(None, false),
                    policy => anvil::fs::RetentionPolicy::parse(policy)
                        .and_then(|p| self.fs.prune(Some(p), false)),
                };
                return match result {
                    Ok(report) => {
                        *self.last_prune.lock() = Some(report);
                        self.invalidate_views(Vec::new(), true);
                        reply.ok()
                    }
                    Err(e) => reply.error(errno(&e)),
                };
            }
            if name == NOHISTORY_XATTR {
                let on = match value {
                    b"1" => true,
                    b"0" => false,
                    _ => return reply.error(Errno::from_i32(libc::EINVAL)),
                };
                return match self.fs.set_nohistory(ino.0, on) {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno(&e)),
                };
            }
            if ino.0 == 1 && name == REBLOCK_XATTR {
                let seconds: f64 = String::from_utf8_lossy(value).trim().parse().unwrap_or(1.0);
                let options = anvil::fs::ReblockOptions {
                    time_box: Some(Duration::from_secs_f64(seconds.clamp(0.0, 3600.0))),
                    ..Default::default()
                };
                let mut progress = (0, 0);
                return match self.fs.reblock(options, &mut |d, t| progress = (d, t)) {
                    Ok(report) => {
                        *self.last_reblock.lock() = Some((report, progress.0, progress.1));
                        reply.ok()
                    }
                    Err(e) => reply.error(errno(&e)),
                };
            }
            if ino.0 == 1 && name == CLEANUP_XATTR {
                let text = String::from_utf8_lossy(value).into_owned();
                let key = anvil::fs::config_keys::CLEANUP;
                return match self.fs.set_config_text(key, &text) {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno(&e)),
                };
            }
            if ino.0 == 1 && name == POLICY_XATTR {
                let text = String::from_utf8_lossy(value).into_owned();
                let result = anvil::fs::RetentionPolicy::parse(&text)
                    .and_then(|p| self.fs.set_retention_policy(p));
                return match result {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno(&e)),
                };
            }
            if ino.0 == 1 && name == SNAPRM_XATTR {
                let spec = String::from_utf8_lossy(value).into_owned();
                let names: Vec<String> = self
                    .fs
                    .snapshots()
                    .unwrap_or_default()
                    .iter()
                    .filter(|s| s.label == spec || format!("{:#018x}", s.tid) == spec)
                    .map(views::snapshot_name)
                    .collect();
                return match self.fs.remove_snapshot(&spec) {
                    Ok(_) => {
                        self.invalidate_views(names, false);
                        reply.ok()
                    }
                    Err(e) => reply.error(errno(&e)),
                };
            }
            if ino.0 == 1 && name == SYNC_XATTR {
                return match self.fs.sync() {
                    Ok(_) => reply.ok(),
                    Err(e) => reply.error(errno(&e)),
                };
            }
            if ino.0 == 1 && name == DROPCACHE_XATTR {
                return match self.fs.sync() {
                    Ok(_) => {
                        self.fs.volume().drop_caches();
                        reply.ok()
                    }
                    Err(e) => reply.error(errno(&e)),
                };
            }
            return reply.error(Errno::from_i32(libc::EPERM));
        }
        let create = flags & libc::XATTR_CREATE != 0;
        let replace = flags & libc::XATTR_REPLACE != 0;
        match self
            .fs
            .setxattr(ino.0, name.as_bytes(), value, create, replace)
        {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if name == INFO_XATTR {
            let json = self.fs.info().to_json();
            return reply_xattr(reply, size, json.as_bytes());
        }
        if ino.0 == 1 && name == SNAPSHOTS_XATTR {
            return match self.fs.snapshots() {
                Ok(list) => reply_xattr(reply, size, snapshots_json(&list).as_bytes()),
                Err(e) => reply.error(errno(&e)),
            };
        }
        if ino.0 == 1 && name == PRUNE_XATTR {
            let text = match &*self.last_prune.lock() {
                Some(r) => format!(
                    "{{\"elements_removed\":{},\"extent_bytes_freed\":{},\"kept_points\":{}}}",
                    r.elements_removed, r.extent_bytes_freed, r.kept_points
                ),
                None => "{}".to_string(),
            };
            return reply_xattr(reply, size, text.as_bytes());
        }
        if name == NOHISTORY_XATTR && !is_view(ino.0) {
            return match self.fs.getattr(ino.0) {
                Ok(attr) => {
                    let on = attr.flags & anvil::format::record::inode_flags::NOHISTORY != 0;
                    reply_xattr(reply, size, if on { b"1" } else { b"0" })
                }
                Err(e) => reply.error(errno(&e)),
            };
        }
        if ino.0 == 1 && name == REBLOCK_XATTR {
            let text = match &*self.last_reblock.lock() {
                Some((r, done, total)) => format!(
                    concat!(
                        "{{\"extents_moved\":{},\"bytes_moved\":{},\"bytes_freed\":{},",
                        "\"damaged\":{},\"finished\":{},\"done\":{},\"total\":{}}}"
                    ),
                    r.extents_moved,
                    r.bytes_moved,
                    r.bytes_freed,
                    r.damaged,
                    r.finished,
                    done,
                    total
                ),
                None => "{}".to_string(),
            };
            return reply_xattr(reply, size, text.as_bytes());
        }
        if ino.0 == 1 && name == CLEANUP_XATTR {
            return match self.fs.config_text(anvil::fs::config_keys::CLEANUP) {
                Ok(text) => reply_xattr(reply, size, text.unwrap_or_default().as_bytes()),
                Err(e) => reply.error(errno(&e)),
            };
        }
        if ino.0 == 1 && name == POLICY_XATTR {
            return match self.fs.retention_policy() {
                Ok(policy) => reply_xattr(reply, size, policy.to_string().as_bytes()),
                Err(e) => reply.error(errno(&e)),
            };
        }
        if ino.0 == 1 && name == SPACE_XATTR {
            return match self.fs.space_split() {
                Ok(split) => {
                    let text = format!(
                        "{{\"live_bytes\":{},\"history_bytes\":{},\"tree_bytes\":{}}}",
                        split.live_bytes, split.history_bytes, split.tree_bytes
                    );
                    reply_xattr(reply, size, text.as_bytes())
                }
                Err(e) => reply.error(errno(&e)),
            };
        }
        if name == HISTORY_XATTR && !is_view(ino.0) {
            return match self.fs.history(ino.0) {
                Ok(versions) => reply_xattr(reply, size, history_json(&versions).as_bytes()),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let value = self.target(ino.0).and_then(|t| match t {
            Target::AsOf { obj, tid } => self.fs.at(tid)?.getxattr(obj, name.as_bytes()),
            Target::Live(ino) => self.fs.getxattr(ino, name.as_bytes()),
            Target::SnapDir => Err(Error::Posix(libc::ENODATA)),
        });
        match value {
            Ok(value) => reply_xattr(reply, size, &value),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = self.target(ino.0).and_then(|t| match t {
            Target::AsOf { obj, tid } => self.fs.at(tid)?.listxattr(obj),
            Target::Live(ino) => self.fs.listxattr(ino),
            Target::SnapDir => Ok(Vec::new()),
        });
        match names {
            Ok(names) => {
                let mut data = Vec::new();
                for name in names {
                    data.extend_from_slice(&name);
                    data.push(0);
                }
                reply_xattr(reply, size, &data);
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if is_view(ino.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        match self.fs.removexattr(ino.0, name.as_bytes()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        match self.target(ino.0).and_then(|t| self.attr_of(t)) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if is_view(parent.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        let mode = (mode & libc::S_IFMT) | (mode & 0o7777 & !umask);
        match self
            .fs
            .mknod(caller(req), parent.0, name.as_bytes(), mode, 0)
        {
            Ok(attr) => {
                self.remember(attr.ino);
                reply.created(
                    &self.ttl,
                    &file_attr(&attr),
                    Generation(0),
                    FileHandle(0),
                    FopenFlags::FOPEN_KEEP_CACHE,
                )
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if is_view(ino.0) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        // Plain allocation extends the file; space is not reserved ahead (copy-on-write
        // allocates at commit), so only the size effect is provided.
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let end = offset.saturating_add(length);
        let result = self.fs.getattr(ino.0).and_then(|attr| {
            if mode & libc::FALLOC_FL_KEEP_SIZE == 0 && end > attr.size {
                self.fs.setattr(
                    ino.0,
                    &SetAttr {
                        size: Some(end),
                        ..Default::default()
                    },
                )?;
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }
}
