//! The file-system operations a workload may use, behind one trait, so that
//! the same workload code runs on any mounted directory ([`PosixVfs`]: plain
//! system calls relative to a directory descriptor) and on an anvil volume
//! opened as a library in this process ([`AnvilVfs`]: no kernel, no FUSE).
//!
//! Paths are relative to the root of the workload, `/`-separated, without a
//! leading slash. Errors are `io::Error`s that carry the errno, whichever
//! implementation produced them.
//!
//! [`PosixVfs`] is deliberately thin: one `open`/`rename`/... per call on the
//! full path and no allocation beyond its C string, so that a workload
//! written against it issues the same system calls as a hand-written C loop.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anvil::fs::{Caller, FileKind, RenameFlags, SetAttr};
use anvil::Filesystem;

/// An open file. Closed when dropped.
pub trait VFile: Send {
    /// Writes at the current position; returns the bytes written.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize>;
    /// Reads at the current position; 0 means end of file.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Makes the file's data and metadata durable.
    fn fsync(&mut self) -> io::Result<()>;

    /// Reads into memory that other threads may be reading into at the same time, the way
    /// blogbench 1.1's readers all read into one static buffer. Nothing ever looks at the
    /// bytes; what matters is the cost of the copy. The default reads into a private
    /// buffer instead (for implementations that copy in Rust, where sharing would race).
    ///
    /// # Safety
    /// `buf` must be valid for writes of `len` bytes for the whole call, and no Rust
    /// reference to that memory may exist while any thread is in this call.
    unsafe fn read_shared(&mut self, buf: *mut u8, len: usize) -> io::Result<usize> {
        let _ = buf;
        thread_local! {
            /// The private buffer, kept from call to call (this is a reader's hot path).
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SCRATCH.with_borrow_mut(|private| {
            if private.len() < len {
                private.resize(len, 0);
            }
            self.read(&mut private[..len])
        })
    }

    /// Writes all of `buf`.
    fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write(buf)? {
                0 => return Err(io::Error::from_raw_os_error(libc::EIO)),
                n => buf = &buf[n..],
            }
        }
        Ok(())
    }
}

/// File-system operations, relative to the workload's root.
pub trait Vfs: Send + Sync {
    /// "posix" or "anvil-lib".
    fn kind(&self) -> &'static str;
    fn mkdir(&self, path: &str, mode: u32) -> io::Result<()>;
    /// open(O_CREAT | O_TRUNC | O_WRONLY).
    fn create(&self, path: &str, mode: u32) -> io::Result<Box<dyn VFile + '_>>;
    /// `create`, with a hint that the file belongs with `near` (Hummingbird's
    /// `collocate_files`): for anvil targets only (the library's `set_locality`, or a
    /// mount's `trusted.anvil.near` attribute, which elsewhere would be stored as junk).
    fn create_near(&self, path: &str, mode: u32, near: &str) -> io::Result<Box<dyn VFile + '_>>;
    /// Names `near` as the file that the existing file `path` belongs with (Hummingbird's
    /// `collocate_files` on a hit): anvil moves the two into one set at its next commit
    /// when that saves reads. For anvil targets only, as `create_near`.
    fn collocate(&self, path: &str, near: &str) -> io::Result<()>;
    /// Names `path` as just read with `near` (an image served from disk for a client whose
    /// page is `near`): anvil stores a copy of it in `near`'s set when its next commit
    /// writes or moves `near` anyway (the library's `copy_near`, a mount's `trusted.anvil.copy`
    /// attribute). For anvil targets only, as `create_near`.
    fn copy_near(&self, path: &str, near: &str) -> io::Result<()>;
    /// Turns history off below directory `path` on an anvil volume (`anvil nohistory`).
    /// Only for anvil targets: elsewhere the attribute would be stored as junk.
    fn set_anvil_nohistory(&self, path: &str) -> io::Result<()>;
    /// Makes directory `path` of an anvil volume a cache (`anvil evict`): when space runs
    /// low, anvil deletes its least recently used clusters. Only for anvil targets.
    fn set_anvil_evictable(&self, path: &str) -> io::Result<()>;
    /// open(O_RDONLY).
    fn open_read(&self, path: &str) -> io::Result<Box<dyn VFile + '_>>;
    /// Writes file `path` whole, `data`, then closes it (Hummingbird's `write_file`),
    /// stored with `near` when given. By default what a program does: `create` (or
    /// `create_near`), writes of `chunk` bytes, close. The library creates the file with its
    /// data in one call.
    fn write_file(
        &self,
        path: &str,
        mode: u32,
        data: &[u8],
        near: Option<&str>,
        chunk: usize,
    ) -> io::Result<()> {
        write_by_handle(self, path, mode, data, near, chunk)
    }
    /// Reads file `path` whole (Hummingbird's `read_file`) and returns its length. By
    /// default what a program does: `open_read`, reads into `buf` until one returns
    /// nothing, close. The library looks the name up and reads the file in one call.
    fn read_file(&self, path: &str, buf: &mut [u8]) -> io::Result<u64> {
        let mut file = self.open_read(path)?;
        let mut total = 0u64;
        loop {
            match file.read(buf)? {
                0 => return Ok(total),
                k => total += k as u64,
            }
        }
    }
    /// rename(2): atomically replaces `to` if it exists.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    fn unlink(&self, path: &str) -> io::Result<()>;
    fn rmdir(&self, path: &str) -> io::Result<()>;
    /// stat(2); returns the size in bytes.
    fn stat_size(&self, path: &str) -> io::Result<u64>;
    /// Names in a directory, without "." and "..".
    fn read_dir(&self, path: &str) -> io::Result<Vec<String>>;
}

/// `Vfs::write_file` as a program does it: create (with the hint, if any), writes of
/// `chunk` bytes, close.
fn write_by_handle<V: Vfs + ?Sized>(
    vfs: &V,
    path: &str,
    mode: u32,
    data: &[u8],
    near: Option<&str>,
    chunk: usize,
) -> io::Result<()> {
    let mut file = match near {
        Some(near) => vfs.create_near(path, mode, near)?,
        None => vfs.create(path, mode)?,
    };
    for piece in data.chunks(chunk.max(1)) {
        file.write_all(piece)?;
    }
    Ok(())
}

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// System calls on paths below a directory. No descriptor of the directory
/// is held open, so the file system can be unmounted and remounted between
/// phases (zfs-fuse drops its cache that way).
pub struct PosixVfs {
    /// The directory with a trailing '/'.
    root: Vec<u8>,
}

impl PosixVfs {
    pub fn open(dir: &Path) -> io::Result<PosixVfs> {
        if !std::fs::metadata(dir)?.is_dir() {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        let mut root = dir.as_os_str().as_bytes().to_vec();
        if root.last() != Some(&b'/') {
            root.push(b'/');
        }
        Ok(PosixVfs { root })
    }

    fn c_path(&self, path: &str) -> io::Result<CString> {
        let mut full = Vec::with_capacity(self.root.len() + path.len() + 1);
        full.extend_from_slice(&self.root);
        full.extend_from_slice(path.as_bytes());
        CString::new(full).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn stat(&self, path: &str) -> io::Result<libc::stat> {
        let c = self.c_path(path)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: valid path and output buffer.
        check(unsafe { libc::stat(c.as_ptr(), st.as_mut_ptr()) })?;
        // SAFETY: stat succeeded and filled `st`.
        Ok(unsafe { st.assume_init() })
    }

    fn ino(&self, path: &str) -> io::Result<u64> {
        Ok(self.stat(path)?.st_ino)
    }

    /// Sets attribute `name` of `path` to the inode number of `near`.
    fn name_ino(&self, path: &str, name: &std::ffi::CStr, near: &str) -> io::Result<()> {
        let c = self.c_path(path)?;
        let value = self.ino(near)?.to_string();
        // SAFETY: NUL-terminated path and name; the value outlives the call.
        check(unsafe {
            libc::setxattr(
                c.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        })
        .map(|_| ())
    }

    /// Writes "1" to the anvil control attribute `name` of `path`.
    fn switch_on(&self, path: &str, name: &std::ffi::CStr) -> io::Result<()> {
        let c = self.c_path(path)?;
        // SAFETY: NUL-terminated path and name; the value is one byte that outlives the call.
        check(unsafe { libc::setxattr(c.as_ptr(), name.as_ptr(), b"1".as_ptr().cast(), 1, 0) })
            .map(|_| ())
    }

    fn open_at(&self, path: &str, flags: libc::c_int, mode: u32) -> io::Result<Box<dyn VFile>> {
        let c = self.c_path(path)?;
        // SAFETY: NUL-terminated path.
        let fd = check(unsafe {
            libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint)
        })?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        Ok(Box::new(PosixFile(unsafe { OwnedFd::from_raw_fd(fd) })))
    }
}

struct PosixFile(OwnedFd);

impl VFile for PosixFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for `buf.len()` bytes.
        let n = unsafe { libc::write(self.0.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes and borrowed mutably, so
        // nothing else refers to it during the call.
        unsafe { self.read_shared(buf.as_mut_ptr(), buf.len()) }
    }

    fn fsync(&mut self) -> io::Result<()> {
        // SAFETY: plain syscall on an owned fd.
        check(unsafe { libc::fsync(self.0.as_raw_fd()) }).map(|_| ())
    }

    unsafe fn read_shared(&mut self, buf: *mut u8, len: usize) -> io::Result<usize> {
        // SAFETY: the caller guarantees `buf` is writable for `len` bytes; only the
        // kernel writes it, and Rust never reads it.
        let n = unsafe { libc::read(self.0.as_raw_fd(), buf.cast(), len) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl Vfs for PosixVfs {
    fn kind(&self) -> &'static str {
        "posix"
    }

    fn mkdir(&self, path: &str, mode: u32) -> io::Result<()> {
        let c = self.c_path(path)?;
        // SAFETY: NUL-terminated path.
        check(unsafe { libc::mkdir(c.as_ptr(), mode as libc::mode_t) }).map(|_| ())
    }

    fn create(&self, path: &str, mode: u32) -> io::Result<Box<dyn VFile + '_>> {
        self.open_at(path, libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY, mode)
    }

    fn create_near(&self, path: &str, mode: u32, near: &str) -> io::Result<Box<dyn VFile + '_>> {
        let c = self.c_path(path)?;
        // SAFETY: NUL-terminated path.
        let fd = check(unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY | libc::O_CLOEXEC,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let file = unsafe { OwnedFd::from_raw_fd(fd) };
        // A hint about a file that is gone (evicted) is no hint.
        if let Ok(ino) = self.ino(near) {
            let value = ino.to_string();
            // SAFETY: an open fd, a NUL-terminated name, and a value that outlives the call.
            check(unsafe {
                libc::fsetxattr(
                    file.as_raw_fd(),
                    c"trusted.anvil.near".as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            })?;
        }
        Ok(Box::new(PosixFile(file)))
    }

    fn collocate(&self, path: &str, near: &str) -> io::Result<()> {
        self.name_ino(path, c"trusted.anvil.near", near)
    }

    fn copy_near(&self, path: &str, near: &str) -> io::Result<()> {
        self.name_ino(path, c"trusted.anvil.copy", near)
    }

    fn set_anvil_nohistory(&self, path: &str) -> io::Result<()> {
        self.switch_on(path, c"trusted.anvil.nohistory")
    }

    fn set_anvil_evictable(&self, path: &str) -> io::Result<()> {
        self.switch_on(path, c"trusted.anvil.evict")
    }

    fn open_read(&self, path: &str) -> io::Result<Box<dyn VFile + '_>> {
        self.open_at(path, libc::O_RDONLY, 0)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (f, t) = (self.c_path(from)?, self.c_path(to)?);
        // SAFETY: NUL-terminated paths.
        check(unsafe { libc::rename(f.as_ptr(), t.as_ptr()) }).map(|_| ())
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let c = self.c_path(path)?;
        // SAFETY: NUL-terminated path.
        check(unsafe { libc::unlink(c.as_ptr()) }).map(|_| ())
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        let c = self.c_path(path)?;
        // SAFETY: NUL-terminated path.
        check(unsafe { libc::rmdir(c.as_ptr()) }).map(|_| ())
    }

    fn stat_size(&self, path: &str) -> io::Result<u64> {
        Ok(self.stat(path)?.st_size as u64)
    }

    fn read_dir(&self, path: &str) -> io::Result<Vec<String>> {
        let dir = std::ffi::OsStr::from_bytes(&self.root);
        let mut names = Vec::new();
        for entry in std::fs::read_dir(Path::new(dir).join(path))? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }
}

/// An anvil volume opened in this process.
pub struct AnvilVfs {
    fs: Arc<Filesystem>,
    /// Inode of the workload's root directory.
    root: u64,
    /// Directories resolved so far, by path below the root: what the kernel's dentry cache
    /// is to a mounted file system, and what a program embedding the library keeps (the
    /// inode numbers of the directories it works in). Emptied by every rmdir and rename.
    dirs: Mutex<HashMap<String, u64>>,
    /// Files named as locality hints (`create_near`'s `near`), by path: a proxy names its
    /// clients' current pages over and over, one hint per embedded image, and a program
    /// embedding the library keeps the inode numbers of the files it names (Hummingbird's
    /// proxy named them through its own in-memory table). Forgotten by an unlink of the
    /// path, emptied by every rmdir and rename and past `NAMED_MAX` entries. A stale entry
    /// (a file the volume evicted) names a file that is gone, and the volume drops a hint
    /// about a file that is gone.
    named: Mutex<HashMap<String, u64>>,
    /// The last file opened for reading and its inode: a program that names a file it has
    /// just read (`collocate`, `copy_near`) holds it open, and has its inode at hand.
    /// Forgotten by an unlink of the path and by every rmdir and rename.
    opened: Mutex<(String, u64)>,
}

/// Hint targets `AnvilVfs` keeps at most (a proxy's 200 clients name about 200 pages).
const NAMED_MAX: usize = 4096;

fn anvil_err(err: anvil::Error) -> io::Error {
    io::Error::from_raw_os_error(err.errno())
}

impl AnvilVfs {
    /// Works under directory `root` (an inode number) of `fs`.
    pub fn new(fs: Arc<Filesystem>, root: u64) -> AnvilVfs {
        AnvilVfs {
            fs,
            root,
            dirs: Mutex::default(),
            named: Mutex::default(),
            opened: Mutex::default(),
        }
    }

    pub fn filesystem(&self) -> &Arc<Filesystem> {
        &self.fs
    }

    /// Resolves a directory path below the root.
    fn dir_ino(&self, path: &str) -> io::Result<u64> {
        if let Some(&ino) = self.dirs().get(path) {
            return Ok(ino);
        }
        let mut ino = self.root;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            ino = self.fs.lookup(ino, part.as_bytes()).map_err(anvil_err)?.ino;
        }
        self.dirs().insert(path.to_string(), ino);
        Ok(ino)
    }

    fn dirs(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn named(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.named.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The inode of `path`, a file named as a hint: from `named`, or looked up and kept.
    fn named_ino(&self, path: &str) -> io::Result<u64> {
        if let Some(&ino) = self.named().get(path) {
            return Ok(ino);
        }
        let ino = self.ino_of(path)?;
        let mut named = self.named();
        if named.len() >= NAMED_MAX {
            named.clear();
        }
        named.insert(path.to_string(), ino);
        Ok(ino)
    }

    fn opened(&self) -> std::sync::MutexGuard<'_, (String, u64)> {
        self.opened.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The inode of `path`: the file last opened for reading if it is that, else looked up.
    fn opened_ino(&self, path: &str) -> io::Result<u64> {
        let opened = self.opened();
        if opened.0 == path {
            return Ok(opened.1);
        }
        drop(opened);
        self.ino_of(path)
    }

    fn forget_opened(&self, path: &str) {
        let mut opened = self.opened();
        if opened.0 == path {
            opened.0.clear();
        }
    }

    /// Notes that `path` was made anew as `ino`.
    fn created(&self, path: &str, ino: u64) {
        // A name the volume dropped (an evicting cache directory) made again.
        if let Some(named) = self.named().get_mut(path) {
            *named = ino;
        }
        self.forget_opened(path);
    }

    /// Remembers `path` as the file last opened for reading, `ino` (`opened_ino`).
    fn note_opened(&self, path: &str, ino: u64) {
        let mut opened = self.opened();
        opened.0.clear();
        opened.0.push_str(path);
        opened.1 = ino;
    }

    /// Forgets every path below the root (a rename or rmdir moved or removed some).
    fn forget_paths(&self) {
        self.dirs().clear();
        self.named().clear();
        self.opened().0.clear();
    }

    /// Creates `path` (or truncates it if it is a file) and returns its inode. The create
    /// comes first, as open(O_CREAT) makes a new name in one step: a lookup before it
    /// would walk the directory once more for every new file.
    fn create_ino(&self, path: &str, mode: u32) -> io::Result<u64> {
        let (parent, name) = self.parent_of(path)?;
        match self
            .fs
            .mknod(Caller::ROOT, parent, name.as_bytes(), mode & 0o7777, 0)
        {
            Ok(attr) => {
                self.created(path, attr.ino);
                return Ok(attr.ino);
            }
            Err(err) if err.errno() == libc::EEXIST => {}
            Err(err) => return Err(anvil_err(err)),
        }
        let attr = self.fs.lookup(parent, name.as_bytes()).map_err(anvil_err)?;
        if attr.kind == FileKind::Dir {
            return Err(io::Error::from_raw_os_error(libc::EISDIR));
        }
        let truncate = SetAttr {
            size: Some(0),
            ..Default::default()
        };
        self.fs.setattr(attr.ino, &truncate).map_err(anvil_err)?;
        Ok(attr.ino)
    }

    fn parent_of<'p>(&self, path: &'p str) -> io::Result<(u64, &'p str)> {
        let (dir, name) = match path.rfind('/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => ("", path),
        };
        if name.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok((self.dir_ino(dir)?, name))
    }

    fn ino_of(&self, path: &str) -> io::Result<u64> {
        let (parent, name) = self.parent_of(path)?;
        Ok(self
            .fs
            .lookup(parent, name.as_bytes())
            .map_err(anvil_err)?
            .ino)
    }

    fn handle(&self, ino: u64) -> io::Result<Box<dyn VFile + '_>> {
        self.fs.open_handle(ino).map_err(anvil_err)?;
        Ok(Box::new(AnvilFile {
            fs: &self.fs,
            ino,
            pos: 0,
        }))
    }
}

struct AnvilFile<'a> {
    fs: &'a Filesystem,
    ino: u64,
    pos: u64,
}

impl VFile for AnvilFile<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.fs.write(self.ino, self.pos, buf).map_err(anvil_err)?;
        self.pos += n as u64;
        Ok(n)
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let data = self.fs.read(self.ino, self.pos, want).map_err(anvil_err)?;
        buf[..data.len()].copy_from_slice(&data);
        self.pos += data.len() as u64;
        Ok(data.len())
    }

    fn fsync(&mut self) -> io::Result<()> {
        self.fs.fsync(self.ino).map_err(anvil_err)
    }
}

impl Drop for AnvilFile<'_> {
    fn drop(&mut self) {
        let _ = self.fs.release_handle(self.ino);
    }
}

impl Vfs for AnvilVfs {
    fn kind(&self) -> &'static str {
        "anvil-lib"
    }

    fn mkdir(&self, path: &str, mode: u32) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        self.fs
            .mkdir(Caller::ROOT, parent, name.as_bytes(), mode)
            .map(|_| ())
            .map_err(anvil_err)
    }

    fn create(&self, path: &str, mode: u32) -> io::Result<Box<dyn VFile + '_>> {
        let ino = self.create_ino(path, mode)?;
        self.handle(ino)
    }

    fn create_near(&self, path: &str, mode: u32, near: &str) -> io::Result<Box<dyn VFile + '_>> {
        let ino = self.create_ino(path, mode)?;
        // A hint about a file that is gone (evicted) is no hint.
        if let Ok(near) = self.named_ino(near) {
            self.fs.set_locality(ino, near);
        }
        self.handle(ino)
    }

    fn open_read(&self, path: &str) -> io::Result<Box<dyn VFile + '_>> {
        let ino = self.ino_of(path)?;
        let handle = self.handle(ino)?;
        self.note_opened(path, ino);
        Ok(handle)
    }

    fn write_file(
        &self,
        path: &str,
        mode: u32,
        data: &[u8],
        near: Option<&str>,
        chunk: usize,
    ) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        // A hint about a file that is gone (evicted) is no hint.
        let near_ino = near.and_then(|near| self.named_ino(near).ok());
        let created = self.fs.create_file(
            Caller::ROOT,
            parent,
            name.as_bytes(),
            mode & 0o7777,
            data,
            near_ino,
        );
        match created {
            Ok(attr) => {
                self.created(path, attr.ino);
                Ok(())
            }
            // The name exists: replaced as open(O_TRUNC) and writes replace it.
            Err(err) if err.errno() == libc::EEXIST => {
                write_by_handle(self, path, mode, data, near, chunk)
            }
            Err(err) => Err(anvil_err(err)),
        }
    }

    fn read_file(&self, path: &str, _buf: &mut [u8]) -> io::Result<u64> {
        let (parent, name) = self.parent_of(path)?;
        let (ino, data) = self
            .fs
            .read_whole(parent, name.as_bytes())
            .map_err(anvil_err)?;
        self.note_opened(path, ino);
        Ok(data.len() as u64)
    }

    fn collocate(&self, path: &str, near: &str) -> io::Result<()> {
        self.fs
            .set_locality(self.opened_ino(path)?, self.named_ino(near)?);
        Ok(())
    }

    fn copy_near(&self, path: &str, near: &str) -> io::Result<()> {
        self.fs
            .copy_near(self.opened_ino(path)?, self.named_ino(near)?);
        Ok(())
    }

    fn set_anvil_nohistory(&self, path: &str) -> io::Result<()> {
        let ino = self.ino_of(path)?;
        self.fs.set_nohistory(ino, true).map_err(anvil_err)
    }

    fn set_anvil_evictable(&self, path: &str) -> io::Result<()> {
        let ino = self.ino_of(path)?;
        self.fs.set_evictable(ino, true).map_err(anvil_err)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (from_parent, from_name) = self.parent_of(from)?;
        let (to_parent, to_name) = self.parent_of(to)?;
        self.fs
            .rename(
                from_parent,
                from_name.as_bytes(),
                to_parent,
                to_name.as_bytes(),
                RenameFlags::default(),
            )
            .map_err(anvil_err)?;
        // A directory moved, or one replaced: paths below it name other inodes now.
        self.forget_paths();
        Ok(())
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        self.named().remove(path);
        self.forget_opened(path);
        self.fs.unlink(parent, name.as_bytes()).map_err(anvil_err)
    }

    fn rmdir(&self, path: &str) -> io::Result<()> {
        let (parent, name) = self.parent_of(path)?;
        self.fs.rmdir(parent, name.as_bytes()).map_err(anvil_err)?;
        self.forget_paths();
        Ok(())
    }

    fn stat_size(&self, path: &str) -> io::Result<u64> {
        let (parent, name) = self.parent_of(path)?;
        Ok(self
            .fs
            .lookup(parent, name.as_bytes())
            .map_err(anvil_err)?
            .size)
    }

    fn read_dir(&self, path: &str) -> io::Result<Vec<String>> {
        let ino = self.dir_ino(path)?;
        let mut names = Vec::new();
        let mut cookie = 0;
        loop {
            let batch = self.fs.readdir(ino, cookie, 1024).map_err(anvil_err)?;
            let Some(last) = batch.last() else { break };
            cookie = last.cookie;
            for entry in &batch {
                if entry.name != b"." && entry.name != b".." {
                    names.push(String::from_utf8_lossy(&entry.name).into_owned());
                }
            }
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anvil::device::{Device, MemDevice};
    use anvil::MountOptions;

    fn vfs() -> AnvilVfs {
        let bytes = 64 << 20;
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new(bytes));
        Filesystem::mkfs(dev.clone(), bytes, "vfs").unwrap();
        let options = MountOptions {
            commit_interval_ms: 0,
            ..Default::default()
        };
        let fs = Arc::new(Filesystem::open(dev, options).unwrap());
        AnvilVfs::new(fs, 1)
    }

    #[test]
    fn resolved_directories_follow_rmdir_and_rename() {
        let vfs = vfs();
        vfs.mkdir("a", 0o755).unwrap();
        vfs.mkdir("a/b", 0o755).unwrap();
        vfs.create("a/b/f", 0o644).unwrap().write(b"one").unwrap();
        assert_eq!(vfs.stat_size("a/b/f").unwrap(), 3);
        // A directory removed and made again under the same path is another inode.
        vfs.unlink("a/b/f").unwrap();
        vfs.rmdir("a/b").unwrap();
        vfs.mkdir("a/b", 0o755).unwrap();
        vfs.create("a/b/g", 0o644).unwrap().write(b"two!").unwrap();
        assert_eq!(vfs.stat_size("a/b/g").unwrap(), 4);
        // A directory moved: its old path names nothing, its new one what it holds.
        vfs.rename("a", "c").unwrap();
        assert!(vfs.stat_size("a/b/g").is_err());
        assert_eq!(vfs.stat_size("c/b/g").unwrap(), 4);
        vfs.mkdir("a", 0o755).unwrap();
        assert_eq!(vfs.read_dir("a").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn create_truncates_an_existing_file_and_refuses_a_directory() {
        let vfs = vfs();
        vfs.create("f", 0o644).unwrap().write(b"three").unwrap();
        let ino = vfs.ino_of("f").unwrap();
        vfs.create("f", 0o644).unwrap().write(b"x").unwrap();
        assert_eq!(vfs.ino_of("f").unwrap(), ino, "the same file, truncated");
        assert_eq!(vfs.stat_size("f").unwrap(), 1);
        vfs.mkdir("d", 0o755).unwrap();
        let err = vfs.create("d", 0o644).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::EISDIR));
    }

    #[test]
    fn named_files_follow_unlink_create_and_rename() {
        let vfs = vfs();
        let named = |path: &str| vfs.named().get(path).copied();
        vfs.create("page", 0o644).unwrap();
        vfs.create_near("img", 0o644, "page").unwrap();
        let first = vfs.ino_of("page").unwrap();
        assert_eq!(named("page"), Some(first));
        // The page removed and written again is another inode, named as such.
        vfs.unlink("page").unwrap();
        assert_eq!(named("page"), None);
        vfs.create("page", 0o644).unwrap();
        vfs.create_near("img2", 0o644, "page").unwrap();
        let second = vfs.ino_of("page").unwrap();
        assert_ne!(second, first);
        assert_eq!(named("page"), Some(second));
        // A name the volume dropped by itself (an evicting cache directory) and the proxy
        // made again: the create updates what was named.
        let fs = vfs.filesystem().clone();
        fs.unlink(1, b"page").unwrap();
        vfs.create("page", 0o644).unwrap();
        let third = vfs.ino_of("page").unwrap();
        assert_eq!(named("page"), Some(third));
        // A rename may replace a named file: nothing named survives it.
        vfs.create("other", 0o644).unwrap();
        vfs.rename("other", "page").unwrap();
        assert_eq!(named("page"), None);
        vfs.create_near("img3", 0o644, "page").unwrap();
        assert_eq!(named("page"), Some(vfs.ino_of("page").unwrap()));
        // A hint naming a file that is gone is no hint, and no error.
        vfs.create_near("img4", 0o644, "gone").unwrap();
        assert_eq!(named("gone"), None);
    }
}
