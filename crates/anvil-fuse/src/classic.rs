//! The classic transport: requests read from /dev/fuse by `fuser`, one system call per
//! request and one per reply, a daemon thread woken for each.

use crate::{Backend, EntryPlus, Op, Reply};
use anvil::fs::{Caller, SetAttr, TimeSet};
use anvil::{Attr, FileKind};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The adapter as a `fuser::Filesystem`.
pub struct Classic<B: Backend>(pub Arc<B>);

impl<B: Backend> Classic<B> {
    fn entry(&self, reply: ReplyEntry, result: Reply<Attr>) {
        match result {
            Ok(attr) => reply.entry(&self.0.ttl(), &file_attr(&attr), Generation(0)),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn attr(&self, reply: ReplyAttr, result: Reply<Attr>) {
        match result {
            Ok(attr) => reply.attr(&self.0.ttl(), &file_attr(&attr)),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }
}

/// The mode of a new node: its type, and its permission bits without the caller's umask
/// (which the kernel applied already without FUSE_DONT_MASK; again, it changes nothing).
fn masked(mode: u32, umask: u32) -> u32 {
    (mode & libc::S_IFMT) | (mode & 0o7777 & !umask)
}

fn empty(reply: ReplyEmpty, result: Reply<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn xattr(reply: ReplyXattr, size: u32, result: Reply<Vec<u8>>) {
    match result {
        Ok(data) if size == 0 => match u32::try_from(data.len()) {
            Ok(len) => reply.size(len),
            Err(_) => reply.error(Errno::from_i32(libc::E2BIG)),
        },
        Ok(data) if data.len() > size as usize => reply.error(Errno::from_i32(libc::ERANGE)),
        Ok(data) => reply.data(&data),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn system_time(t: anvil::fs::Time) -> SystemTime {
    match u64::try_from(t.sec) {
        Ok(sec) => UNIX_EPOCH + Duration::new(sec, t.nsec),
        Err(_) => {
            UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs())
                + Duration::from_nanos(u64::from(t.nsec))
        }
    }
}

fn timestamp(t: SystemTime) -> anvil::fs::Time {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => anvil::fs::Time {
            sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            nsec: d.subsec_nanos(),
        },
        Err(e) => {
            let d = e.duration();
            let mut sec = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
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
        #[expect(
            clippy::cast_possible_truncation,
            reason = "rdev is stored from mknod's 32-bit device number"
        )]
        rdev: attr.rdev as u32,
        blksize: 4096,
        flags: 0,
    }
}

/// The attributes of a negative entry: node 0, nothing else read.
fn missing_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
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

impl<B: Backend> fuser::Filesystem for Classic<B> {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // No ATOMIC_O_TRUNC: OPEN is not sent (NO_OPEN_SUPPORT), so the kernel truncates
        // through SETATTR itself. HANDLE_KILLPRIV_V2: the daemon clears setuid/setgid, and
        // the kernel marks the superblock SB_NOSEC (no security.capability lookup before
        // each write).
        let mut wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_ASYNC_DIO
            | InitFlags::FUSE_NO_OPEN_SUPPORT
            | InitFlags::FUSE_NO_OPENDIR_SUPPORT
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if self.0.writeback() {
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        let available = config.capabilities() & wanted;
        let _ = config.add_capabilities(available);
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(crate::uring::MAX_READAHEAD);
        let _ = config.set_max_background(64);
        let _ = config.set_time_granularity(Duration::from_nanos(1));
        self.0.counters().set_transport("classic");
        Ok(())
    }

    fn destroy(&mut self) {
        self.0.destroy();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.0.counters().count(Op::Lookup);
        match self.0.lookup(parent.0, name.as_bytes()) {
            // A negative entry: node 0, remembered for the timeout.
            Err(libc::ENOENT) => match self.0.negative_ttl(parent.0, name.as_bytes()) {
                ttl if ttl.is_zero() => reply.error(Errno::ENOENT),
                ttl => reply.entry(&ttl, &missing_attr(), Generation(0)),
            },
            found => self.entry(reply, found),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0.counters().count(Op::Forget);
        self.0.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.0.counters().count(Op::Getattr);
        self.attr(reply, self.0.getattr(ino.0));
    }

    fn setattr(
        &self,
        req: &Request,
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
        self.0.counters().count(Op::Setattr);
        let changes = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime: ctime.map(timestamp),
        };
        self.attr(reply, self.0.setattr(req.uid(), ino.0, &changes));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.0.counters().count(Op::Readlink);
        match self.0.readlink(ino.0) {
            Ok(target) => reply.data(&target),
            Err(e) => reply.error(Errno::from_i32(e)),
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
        self.0.counters().count(Op::Mknod);
        let mode = masked(mode, umask);
        let result = self
            .0
            .mknod(caller(req), parent.0, name.as_bytes(), mode, rdev as u64);
        self.entry(reply, result);
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
        self.0.counters().count(Op::Mkdir);
        let result = self
            .0
            .mkdir(caller(req), parent.0, name.as_bytes(), mode & !umask);
        self.entry(reply, result);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.0.counters().count(Op::Unlink);
        empty(reply, self.0.unlink(parent.0, name.as_bytes()));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.0.counters().count(Op::Rmdir);
        empty(reply, self.0.rmdir(parent.0, name.as_bytes()));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        self.0.counters().count(Op::Symlink);
        let target = target.as_os_str().as_bytes();
        let result = self
            .0
            .symlink(caller(req), parent.0, link_name.as_bytes(), target);
        self.entry(reply, result);
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
        self.0.counters().count(Op::Rename);
        let result = self.0.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        );
        empty(reply, result);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.0.counters().count(Op::Link);
        self.entry(reply, self.0.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // With FUSE_NO_OPEN_SUPPORT, ENOSYS tells the kernel to stop sending OPEN and
        // RELEASE and to keep its page cache across opens.
        self.0.counters().count(Op::Open);
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
        self.0.counters().count(Op::Read);
        match self.0.read(ino.0, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.0.counters().count(Op::Write);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        match self.0.write(ino.0, offset, data, kill) {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "at most data.len(), one FUSE write request, whose size is a u32"
            )]
            Ok(written) => reply.written(written as u32),
            Err(e) => reply.error(Errno::from_i32(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0.counters().count(Op::Release);
        reply.ok();
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
        self.0.counters().count(Op::Flush);
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
        self.0.counters().count(Op::Fsync);
        empty(reply, self.0.fsync(ino.0));
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // FUSE_NO_OPENDIR_SUPPORT: no OPENDIR/RELEASEDIR round trips; the kernel checks
        // directory-ness itself and caches listings (FOPEN_CACHE_DIR is implied).
        self.0.counters().count(Op::Opendir);
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
        self.0.counters().count(Op::Readdir);
        match self.0.readdir(ino.0, offset) {
            Ok(entries) => {
                for entry in entries {
                    let name = OsStr::from_bytes(&entry.name);
                    let kind = file_type(entry.kind);
                    if reply.add(INodeNo(entry.ino), entry.cookie, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(Errno::from_i32(e)),
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
        self.0.counters().count(Op::Readdirplus);
        let entries: Vec<EntryPlus> = match self.0.readdirplus(ino.0, offset) {
            Ok(entries) => entries,
            Err(e) => return reply.error(Errno::from_i32(e)),
        };
        for e in entries {
            let full = reply.add(
                INodeNo(e.entry.ino),
                e.entry.cookie,
                OsStr::from_bytes(&e.entry.name),
                &e.ttl,
                &file_attr(&e.attr),
                Generation(0),
            );
            if full {
                break;
            }
            self.0.remember_entry(&e);
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
        self.0.counters().count(Op::Fsyncdir);
        empty(reply, self.0.fsync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.0.counters().count(Op::Statfs);
        let s = self.0.statfs();
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
        self.0.counters().count(Op::Setxattr);
        empty(reply, self.0.setxattr(ino.0, name.as_bytes(), value, flags));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.0.counters().count(Op::Getxattr);
        xattr(reply, size, self.0.getxattr(ino.0, name.as_bytes()));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.0.counters().count(Op::Listxattr);
        xattr(reply, size, self.0.listxattr(ino.0));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.0.counters().count(Op::Removexattr);
        empty(reply, self.0.removexattr(ino.0, name.as_bytes()));
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        self.0.counters().count(Op::Access);
        empty(reply, self.0.access(ino.0));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.0.counters().count(Op::Create);
        let mode = masked(mode, umask);
        let result = self
            .0
            .mknod(caller(req), parent.0, name.as_bytes(), mode, 0);
        match result {
            Ok(attr) => {
                #[expect(clippy::cast_sign_loss, reason = "open(2) flags, a bit set")]
                let direct = crate::create_goes_direct(flags as u32, self.0.writeback());
                let open = match direct {
                    true => FopenFlags::FOPEN_DIRECT_IO,
                    false => FopenFlags::empty(),
                };
                reply.created(
                    &self.0.ttl(),
                    &file_attr(&attr),
                    Generation(0),
                    FileHandle(0),
                    open,
                );
            }
            Err(e) => reply.error(Errno::from_i32(e)),
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
        self.0.counters().count(Op::Fallocate);
        empty(reply, self.0.fallocate(ino.0, offset, length, mode));
    }
}
