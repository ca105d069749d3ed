//! POSIX semantics over the tree: inodes, directories, files, symlinks, hard links, rename,
//! xattrs and special files, by object id (the FUSE inode number) or by path.
//!
//! Every operation is one `Volume::run` transaction, so it is atomic with respect to every
//! other operation and lands whole in one flush group.

mod asof;
mod chunk;
mod evict;
mod history;
mod mirror;
mod prefetch;
mod prune;
mod reblock;
mod types;

pub use prune::{config_keys, PruneReport, RetentionPolicy, SpaceSplit};
pub use reblock::{ReblockOptions, ReblockReport};

pub use history::{parse_tid, parse_time, SNAPSHOT_LABEL_BYTES_MAX};

pub use crate::volume::{MirrorReport, MirrorState};
pub use asof::AsOf;
pub use types::*;

use crate::btree::{Step, Stop};
use crate::device::{Device, FileDevice};
use crate::error::{posix, Error, Result};
use crate::format::record::{
    compression, inode_flags, kind, patch, rtype, Dirent, Inode, LogicalKey, Timestamp, Xattr,
    DATA_CHUNK_BYTES, HASH_SLOTS, NAME_BYTES_MAX, ROOT_OBJ, VOLUME_OBJ, XATTR_VALUE_BYTES_MAX,
};
use crate::format::{record::hash_slot_base, BLOCK_BYTES};
use crate::sync::Mutex;
use crate::volume::{Found, Tx, Value, Volume, VolumeOptions};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Largest file size (the last chunk key must fit in u64 with room to spare).
pub const FILE_BYTES_MAX: u64 = 1 << 60;
/// Whole chunks `create_file` sends to the device in one request (1 MiB).
const WRITE_AHEAD_CHUNKS: usize = 16;
pub use crate::format::record::SYMLINK_BYTES_MAX;
const LINKS_MAX: u32 = 65000;

pub struct Filesystem {
    volume: Arc<Volume>,
    committer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Open handles per object: unlinked objects live until the last one closes.
    open_handles: Mutex<foldhash::HashMap<u64, u32>>,
    /// Objects that may have lost their last link while open (every orphan is here, and a
    /// few that kept a link): only their last handle's release looks at the tree.
    maybe_orphans: Mutex<std::collections::HashSet<u64>>,
    /// One prune at a time (its removals must be committed before the next scan).
    prune_lock: Mutex<()>,
    prefetch: prefetch::Prefetcher,
    /// Files of evictable (cache) directories, tracked once one is seen (`evict.rs`).
    evicting: std::sync::atomic::AtomicBool,
    evictable: Mutex<evict::Tracker>,
    /// One eviction at a time.
    evict_lock: Mutex<()>,
    /// Files evicted since the volume was opened, and the space their data held.
    evicted: (std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64),
    /// Told the names each eviction removed (the FUSE mount invalidates the kernel's).
    evict_listener: Mutex<Option<EvictListener>>,
}

/// Called with the (directory, name) pairs an eviction removed.
pub type EvictListener = Box<dyn Fn(Vec<(u64, Vec<u8>)>) + Send + Sync>;

fn fail<T>(errno: i32) -> Step<T> {
    Err(Stop::Fail(Error::Posix(errno)))
}

pub(crate) fn inode_key(obj: u64) -> LogicalKey {
    LogicalKey {
        obj,
        rtype: rtype::INODE,
        key: 0,
    }
}

fn chunk_key(obj: u64, index: u64) -> LogicalKey {
    LogicalKey {
        obj,
        rtype: rtype::DATA,
        key: (index + 1) * DATA_CHUNK_BYTES,
    }
}

fn load_inode(tx: &Tx<'_>, obj: u64) -> Step<Inode> {
    match tx.get_bytes(inode_key(obj))? {
        Some(bytes) => Ok(Inode::decode(&bytes)?),
        None => fail(libc::ENOENT),
    }
}

/// An object `create_in` makes: its name in `parent`, its mode (kind and permissions), its
/// device number, and a symlink's target.
struct New<'a> {
    parent: u64,
    name: &'a [u8],
    mode: u32,
    rdev: u64,
    target: Option<&'a [u8]>,
}

/// Makes object `new` in this operation: its inode, a symlink's target, its entry in the
/// parent, the parent's times and counts. `fill` runs before the inode is stored, with the
/// new object's number and inode (a file created with its data writes it there).
fn create_in(
    tx: &mut Tx<'_>,
    caller: Caller,
    new: &New<'_>,
    fill: &mut dyn FnMut(&mut Tx<'_>, u64, &mut Inode) -> Step<()>,
) -> Step<Attr> {
    let New {
        parent,
        name,
        rdev,
        target,
        ..
    } = *new;
    check_name(name)?;
    let parent_inode = dir_inode(tx, parent)?;
    if parent_inode.nlink == 0 {
        return fail(libc::ENOENT);
    }
    let slot = slot_for_new_entry(tx, parent, name)?;
    let is_dir = new.mode & kind::MASK == kind::DIR;
    let mut mode = new.mode;
    let gid = if parent_inode.mode & libc::S_ISGID != 0 {
        if is_dir {
            mode |= libc::S_ISGID;
        }
        parent_inode.gid
    } else {
        caller.gid
    };
    let now = Timestamp::now();
    let obj = tx.allocate_obj();
    let mut inode = Inode {
        mode,
        uid: caller.uid,
        gid,
        nlink: if is_dir { 2 } else { 1 },
        size: target.map_or(0, |t| t.len() as u64),
        rdev,
        flags: parent_inode.flags & inode_flags::INHERITED,
        atime: now,
        mtime: now,
        ctime: now,
        btime: now,
        parent_hint: parent,
    };
    fill(tx, obj, &mut inode)?;
    store_inode(tx, obj, &inode)?;
    if let Some(target) = target {
        let lk = LogicalKey {
            obj,
            rtype: rtype::SYMLINK,
            key: 0,
        };
        put(tx, lk, Some(Arc::new(target.to_vec())))?;
    }
    let entry = Dirent {
        child: obj,
        kind: mode & kind::MASK,
        name: name.to_vec(),
    };
    // The slot is one the span of `slot_for_new_entry` found free.
    put_found(
        tx,
        dirent_key(parent, slot),
        Some(Arc::new(entry.encode())),
        Found::Absent,
    )?;
    touch_dir(tx, parent, 1, if is_dir { 1 } else { 0 }, now)?;
    Ok(Attr::from_inode(obj, &inode))
}

/// What a read finds under the volume's hold: the file's inode, and the chunks and patches
/// of the range it reads, as (key, value, create_tid).
struct ReadPlan {
    inode: Inode,
    chunks: Vec<(u64, Value, u64)>,
    patches: Vec<(u64, Value, u64)>,
}

/// The records a read of up to `size` bytes of file `ino` at `offset` needs (none past the
/// file's end). Fails with EISDIR for a directory.
fn read_plan(tx: &Tx<'_>, ino: u64, offset: u64, size: u64) -> Step<ReadPlan> {
    let inode = load_inode(tx, ino)?;
    if inode.is_dir() {
        return fail(libc::EISDIR);
    }
    if offset >= inode.size || size == 0 {
        return Ok(ReadPlan {
            inode,
            chunks: Vec::new(),
            patches: Vec::new(),
        });
    }
    let end = inode.size.min(offset.saturating_add(size));
    let lo = (offset / DATA_CHUNK_BYTES + 1) * DATA_CHUNK_BYTES;
    let hi = end.div_ceil(DATA_CHUNK_BYTES) * DATA_CHUNK_BYTES;
    let to_end = end == inode.size;
    let (chunks, patches) = chunk::data_and_patches(tx, ino, (lo, hi), to_end)?;
    Ok(ReadPlan {
        inode,
        chunks,
        patches,
    })
}

/// Puts a record, honouring its object's settings: with no-history set, the replaced version
/// is destroyed at commit instead of kept as history; data takes the object's codec.
/// Directory entries follow their directory's settings.
fn put(tx: &mut Tx<'_>, lk: LogicalKey, value: Option<Arc<Vec<u8>>>) -> Step<()> {
    put_found(tx, lk, value, Found::Unknown)
}

/// `put` of a key a span of this operation covered (`found` says what it saw there), with
/// no walk of the tree for the version it replaces.
fn put_found(
    tx: &mut Tx<'_>,
    lk: LogicalKey,
    value: Option<Arc<Vec<u8>>>,
    found: Found,
) -> Step<()> {
    let (nohistory, codec) = policy(tx, lk.obj)?;
    tx.put_found(lk, value, found, nohistory, codec)
}

/// What `put` takes from `obj`'s inode: whether its old versions are kept out of history
/// (no-history), and the codec of its data.
fn policy(tx: &Tx<'_>, obj: u64) -> Step<(bool, u8)> {
    let inode = match obj {
        VOLUME_OBJ => None,
        obj => match tx.get_bytes(inode_key(obj))? {
            Some(bytes) => Some(Inode::decode(&bytes)?),
            None => None,
        },
    };
    Ok(inode_policy(inode.as_ref()))
}

/// `policy` of an object whose inode (if any) is at hand.
fn inode_policy(inode: Option<&Inode>) -> (bool, u8) {
    inode.map_or((false, compression::DEFAULT), |inode| {
        let policy = chunk::Policy::of(inode);
        (policy.nohistory, policy.codec)
    })
}

fn store_inode(tx: &mut Tx<'_>, obj: u64, inode: &Inode) -> Step<()> {
    put(tx, inode_key(obj), Some(Arc::new(inode.encode())))
}

fn check_name(name: &[u8]) -> Step<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return fail(libc::EINVAL);
    }
    if name.len() > NAME_BYTES_MAX {
        return fail(libc::ENAMETOOLONG);
    }
    if name == b"." || name == b".." {
        return fail(libc::EEXIST);
    }
    Ok(())
}

/// Keys in one name's slot range (`HASH_SLOTS`), as a count of records to read.
const HASH_SLOT_COUNT: usize = 1 << 16;
const _: () = assert!(HASH_SLOT_COUNT as u64 == HASH_SLOTS);

/// Slot, value and create_tid of the live records (dirents or xattrs) in `name`'s slot
/// range under `obj`, in slot order, and the range's first slot.
type Slots = (u64, Vec<(u64, Value, u64)>);

fn name_slots(tx: &Tx<'_>, obj: u64, rtype: u8, name: &[u8]) -> Step<Slots> {
    let base = hash_slot_base(name);
    let used = tx.range_versions(obj, rtype, base, base + HASH_SLOTS - 1, HASH_SLOT_COUNT)?;
    Ok((base, used))
}

/// A hashed record found by name: its slot, its bytes and its create_tid.
type Hashed = (u64, Arc<Vec<u8>>, u64);

/// Finds the hashed record (dirent or xattr) named `name` under `obj`.
fn find_hashed(
    tx: &Tx<'_>,
    obj: u64,
    rtype: u8,
    name: &[u8],
    name_of: impl Fn(&[u8]) -> Result<Vec<u8>>,
) -> Step<Option<Hashed>> {
    for (slot, value, create_tid) in name_slots(tx, obj, rtype, name)?.1 {
        let bytes = tx.resolve(&value)?;
        if name_of(&bytes)? == name {
            return Ok(Some((slot, bytes, create_tid)));
        }
    }
    Ok(None)
}

fn free_slot(tx: &Tx<'_>, obj: u64, rtype: u8, name: &[u8]) -> Step<u64> {
    let (base, used) = name_slots(tx, obj, rtype, name)?;
    first_free(base, used.iter().map(|(key, ..)| *key))
}

/// The first slot from `base` that `used` (slots in ascending order) does not hold.
fn first_free(base: u64, used: impl Iterator<Item = u64>) -> Step<u64> {
    let mut slot = base;
    for key in used {
        if key != slot {
            break;
        }
        slot += 1;
    }
    if slot >= base + HASH_SLOTS {
        return fail(libc::ENOSPC);
    }
    Ok(slot)
}

/// For a new directory entry named `name` in `dir`: EEXIST if the name is taken, else the
/// slot it goes in. One walk of the name's slots where `find_entry` and `free_slot` take
/// one each.
fn slot_for_new_entry(tx: &Tx<'_>, dir: u64, name: &[u8]) -> Step<u64> {
    if name.len() > NAME_BYTES_MAX {
        return fail(libc::ENAMETOOLONG);
    }
    let (base, used) = name_slots(tx, dir, rtype::DIRENT, name)?;
    for (_, value, _) in &used {
        if Dirent::decode(&tx.resolve(value)?)?.name == name {
            return fail(libc::EEXIST);
        }
    }
    first_free(base, used.iter().map(|(key, ..)| *key))
}

/// The entry named `name` in `dir`: its slot and what it says.
fn find_entry(tx: &Tx<'_>, dir: u64, name: &[u8]) -> Step<Option<(u64, Dirent)>> {
    Ok(find_entry_version(tx, dir, name)?.map(|(slot, entry, _)| (slot, entry)))
}

/// `find_entry` with the entry's create_tid, for removing it without another walk.
fn find_entry_version(tx: &Tx<'_>, dir: u64, name: &[u8]) -> Step<Option<(u64, Dirent, u64)>> {
    if name.len() > NAME_BYTES_MAX {
        return fail(libc::ENAMETOOLONG);
    }
    let found = find_hashed(tx, dir, rtype::DIRENT, name, |bytes| {
        Ok(Dirent::decode(bytes)?.name)
    })?;
    match found {
        Some((slot, bytes, create_tid)) => Ok(Some((slot, Dirent::decode(&bytes)?, create_tid))),
        None => Ok(None),
    }
}

fn dir_inode(tx: &Tx<'_>, dir: u64) -> Step<Inode> {
    let inode = load_inode(tx, dir)?;
    if !inode.is_dir() {
        return fail(libc::ENOTDIR);
    }
    Ok(inode)
}

fn is_empty_dir(tx: &Tx<'_>, dir: u64) -> Step<bool> {
    Ok(tx.range(dir, rtype::DIRENT, 0, u64::MAX, 1)?.is_empty())
}

/// The records `destroy` deletes, at most this many from the walk that finds an object's
/// inode (`ObjectRecords`); an object with more has the rest found when it is destroyed.
const OBJECT_RECORDS_FIRST: usize = 64;

/// An object's live records from its inode to its patches (the types between are
/// directory entries, data, symlink targets and attributes), each with its create_tid, as
/// one `span` gives them: the inode and, for most files, everything deleting it deletes.
struct ObjectRecords {
    obj: u64,
    /// The inode's bytes and create_tid, if the object has one.
    inode: Option<(Arc<Vec<u8>>, u64)>,
    /// The records after the inode.
    rest: Vec<(LogicalKey, Value, u64)>,
    /// Whether `rest` holds every record after the inode, or only the first ones.
    complete: bool,
}

impl ObjectRecords {
    fn read(tx: &Tx<'_>, obj: u64, limit: usize) -> Step<ObjectRecords> {
        let at = |rtype, key| LogicalKey { obj, rtype, key };
        let mut rest = tx.span(at(rtype::INODE, 0), at(rtype::PATCH, u64::MAX), limit)?;
        let complete = rest.len() < limit;
        let inode = match rest.first() {
            Some((lk, value, create_tid)) if lk.rtype == rtype::INODE => {
                Some((tx.resolve(value)?, *create_tid))
            }
            _ => None,
        };
        if inode.is_some() {
            rest.remove(0);
        }
        Ok(ObjectRecords {
            obj,
            inode,
            rest,
            complete,
        })
    }

    fn inode(&self) -> Step<Inode> {
        match &self.inode {
            Some((bytes, _)) => Ok(Inode::decode(bytes)?),
            None => fail(libc::ENOENT),
        }
    }
}

/// Deletes every record of an object (history keeps the versions).
fn destroy(tx: &mut Tx<'_>, obj: u64) -> Step<()> {
    let records = ObjectRecords::read(tx, obj, usize::MAX)?;
    destroy_records(tx, records, true)
}

/// `destroy` of the object `records` came from (this operation's span of it): every record
/// goes as `put` would delete it, under the inode's settings, with no walk to find its
/// version. `orphaned`: the object may have an orphan record (it was unlinked while open),
/// which goes too.
fn destroy_records(tx: &mut Tx<'_>, records: ObjectRecords, orphaned: bool) -> Step<()> {
    let obj = records.obj;
    let inode = match &records.inode {
        Some((bytes, _)) => Some(Inode::decode(bytes)?),
        None => None,
    };
    let (nohistory, codec) = inode_policy(inode.as_ref());
    let rest = match records.complete {
        true => records.rest,
        false => {
            let at = |rtype, key| LogicalKey { obj, rtype, key };
            tx.span(at(rtype::DIRENT, 0), at(rtype::PATCH, u64::MAX), usize::MAX)?
        }
    };
    for (lk, _, create_tid) in rest {
        if matches!(
            lk.rtype,
            rtype::DATA | rtype::PATCH | rtype::XATTR | rtype::SYMLINK
        ) {
            tx.delete_found(lk, create_tid, nohistory, codec)?;
        }
    }
    if let Some((_, create_tid)) = records.inode {
        tx.delete_found(inode_key(obj), create_tid, nohistory, codec)?;
    }
    if !orphaned {
        return Ok(());
    }
    put(
        tx,
        LogicalKey {
            obj: VOLUME_OBJ,
            rtype: rtype::ORPHAN,
            key: obj,
        },
        None,
    )
}

/// Drops one link to `obj`; destroys it when no link and no open handle remains.
/// `is_open` says whether anything (the kernel, a library handle) still holds `obj`.
fn drop_link(tx: &mut Tx<'_>, obj: u64, is_open: bool, now: Timestamp) -> Step<()> {
    // An object nothing holds usually loses its last link here: one walk then finds the
    // inode and what destroying it deletes.
    let records = match is_open {
        true => None,
        false => Some(ObjectRecords::read(tx, obj, OBJECT_RECORDS_FIRST)?),
    };
    let mut inode = match &records {
        Some(records) => records.inode()?,
        None => load_inode(tx, obj)?,
    };
    inode.nlink = if inode.is_dir() {
        0
    } else {
        // An entry named it, so it had a link: zero here is a damaged count, not a clamp.
        inode.nlink.checked_sub(1).ok_or_else(|| {
            Error::corrupt(
                "link count already zero while an entry names the object",
                format!("object {obj}"),
            )
        })?
    };
    inode.ctime = now;
    let records = match records {
        Some(records) if inode.nlink == 0 => records,
        Some(records) => {
            // Another link remains: the inode changes where the walk found it.
            let (nohistory, codec) = inode_policy(Some(&inode));
            let found = records
                .inode
                .map_or(Found::Absent, |(_, tid)| Found::Live(tid));
            let bytes = Some(Arc::new(inode.encode()));
            return tx.put_found(inode_key(obj), bytes, found, nohistory, codec);
        }
        None if inode.nlink > 0 => return store_inode(tx, obj, &inode),
        None => {
            store_inode(tx, obj, &inode)?;
            let orphan = LogicalKey {
                obj: VOLUME_OBJ,
                rtype: rtype::ORPHAN,
                key: obj,
            };
            // It had a link until now, so it has no orphan record yet (`link` does not
            // link an orphan).
            return put_found(tx, orphan, Some(Arc::new(Vec::new())), Found::Absent);
        }
    };
    // It had a link until now and nothing holds it: it was never an orphan.
    destroy_records(tx, records, false)
}

/// Removes entry `slot` of `parent` (naming `entry`) and drops the link it held: what
/// unlink(2), rmdir(2) and eviction share. `held`: something still holds the object.
/// `version` is the entry's create_tid, as `find_entry_version` gave it.
fn unlink_entry(
    tx: &mut Tx<'_>,
    parent: u64,
    (slot, entry, version): (u64, &Dirent, u64),
    held: bool,
) -> Step<()> {
    let now = Timestamp::now();
    let dir_links = if entry.kind == kind::DIR { -1 } else { 0 };
    put_found(tx, dirent_key(parent, slot), None, Found::Live(version))?;
    touch_dir(tx, parent, -1, dir_links, now)?;
    drop_link(tx, entry.child, held, now)
}

/// Whether directory `ancestor` is `dir` or lies on its parent chain up to the root. The
/// chain is followed through each directory's `parent_hint`; a chain that comes back to a
/// directory it already passed is damage, reported as such (no depth bound: POSIX sets
/// none, and a legitimately deep tree must not read as a cycle).
fn is_ancestor(tx: &Tx<'_>, ancestor: u64, dir: u64) -> Step<bool> {
    let mut seen = std::collections::HashSet::new();
    let mut at = dir;
    while at != ROOT_OBJ {
        if at == ancestor {
            return Ok(true);
        }
        if !seen.insert(at) {
            return Err(Stop::Fail(Error::corrupt(
                "directory parent chain loops",
                format!("directory {dir}, at {at}"),
            )));
        }
        at = load_inode(tx, at)?.parent_hint;
    }
    Ok(ancestor == ROOT_OBJ)
}

/// The entry a rename moves: `entry` at `slot` of `parent`, going to `new_name` in
/// `new_parent`.
struct Moving<'a> {
    parent: u64,
    slot: u64,
    entry: Dirent,
    new_parent: u64,
    new_name: &'a [u8],
    now: Timestamp,
}

fn dirent_key(dir: u64, slot: u64) -> LogicalKey {
    LogicalKey {
        obj: dir,
        rtype: rtype::DIRENT,
        key: slot,
    }
}

/// RENAME_EXCHANGE: the two entries swap objects; both stay, link counts follow the
/// directories that moved.
fn exchange_entries(
    tx: &mut Tx<'_>,
    m: &Moving<'_>,
    name: &[u8],
    target_slot: u64,
    target_entry: Dirent,
) -> Step<()> {
    let src_is_dir = m.entry.kind == kind::DIR;
    let target_is_dir = target_entry.kind == kind::DIR;
    if target_is_dir && m.parent != m.new_parent && is_ancestor(tx, target_entry.child, m.parent)? {
        return fail(libc::EINVAL);
    }
    let a = Dirent {
        child: target_entry.child,
        kind: target_entry.kind,
        name: name.to_vec(),
    };
    let b = Dirent {
        child: m.entry.child,
        kind: m.entry.kind,
        name: m.new_name.to_vec(),
    };
    put(tx, dirent_key(m.parent, m.slot), Some(Arc::new(a.encode())))?;
    put(
        tx,
        dirent_key(m.new_parent, target_slot),
        Some(Arc::new(b.encode())),
    )?;
    let links = |moving_in: bool, moving_out: bool| (moving_in as i32) - (moving_out as i32);
    if m.parent != m.new_parent {
        touch_dir(tx, m.parent, 0, links(target_is_dir, src_is_dir), m.now)?;
        touch_dir(tx, m.new_parent, 0, links(src_is_dir, target_is_dir), m.now)?;
    } else {
        touch_dir(tx, m.parent, 0, 0, m.now)?;
    }
    for (child, new_home) in [
        (m.entry.child, m.new_parent),
        (target_entry.child, m.parent),
    ] {
        let mut inode = load_inode(tx, child)?;
        inode.ctime = m.now;
        if inode.is_dir() {
            inode.parent_hint = new_home;
        }
        store_inode(tx, child, &inode)?;
    }
    Ok(())
}

/// An ordinary rename: the entry moves, replacing `target` (its slot reused, its object
/// losing a link) unless `noreplace`.
fn move_entry(
    tx: &mut Tx<'_>,
    m: &Moving<'_>,
    target: Option<(u64, Dirent)>,
    noreplace: bool,
    target_open: bool,
) -> Step<()> {
    let src_is_dir = m.entry.kind == kind::DIR;
    let mut target_slot = None;
    if let Some((existing_slot, target_entry)) = target {
        if noreplace {
            return fail(libc::EEXIST);
        }
        if target_entry.child == m.entry.child {
            return Ok(()); // Two links to the same object: POSIX says do nothing.
        }
        let target_is_dir = target_entry.kind == kind::DIR;
        if src_is_dir && !target_is_dir {
            return fail(libc::ENOTDIR);
        }
        if !src_is_dir && target_is_dir {
            return fail(libc::EISDIR);
        }
        if target_is_dir && !is_empty_dir(tx, target_entry.child)? {
            return fail(libc::ENOTEMPTY);
        }
        drop_link(tx, target_entry.child, target_open, m.now)?;
        touch_dir(
            tx,
            m.new_parent,
            -1,
            if target_is_dir { -1 } else { 0 },
            m.now,
        )?;
        target_slot = Some(existing_slot);
    }
    put(tx, dirent_key(m.parent, m.slot), None)?;
    let new_slot = match target_slot {
        Some(s) => s,
        None => free_slot(tx, m.new_parent, rtype::DIRENT, m.new_name)?,
    };
    let moved = Dirent {
        child: m.entry.child,
        kind: m.entry.kind,
        name: m.new_name.to_vec(),
    };
    put(
        tx,
        dirent_key(m.new_parent, new_slot),
        Some(Arc::new(moved.encode())),
    )?;
    let dir_links = if src_is_dir { 1 } else { 0 };
    touch_dir(tx, m.parent, -1, -dir_links, m.now)?;
    touch_dir(tx, m.new_parent, 1, dir_links, m.now)?;
    let mut inode = load_inode(tx, m.entry.child)?;
    inode.ctime = m.now;
    if src_is_dir {
        inode.parent_hint = m.new_parent;
    }
    store_inode(tx, m.entry.child, &inode)
}

fn touch_dir(
    tx: &mut Tx<'_>,
    dir: u64,
    entries_delta: i64,
    links_delta: i32,
    now: Timestamp,
) -> Step<()> {
    let mut inode = load_inode(tx, dir)?;
    let damaged = |what: &str| Error::corrupt(what.to_string(), format!("directory {dir}"));
    inode.size = inode
        .size
        .checked_add_signed(entries_delta)
        .ok_or_else(|| damaged("entry count would fall below zero"))?;
    inode.nlink = inode
        .nlink
        .checked_add_signed(links_delta)
        .ok_or_else(|| damaged("link count would fall below zero"))?;
    inode.mtime = now;
    inode.ctime = now;
    store_inode(tx, dir, &inode)
}

/// Truncates or extends a file's data to `size` (the inode is updated by the caller).
fn resize_data(tx: &mut Tx<'_>, obj: u64, old_size: u64, size: u64) -> Step<()> {
    if size >= old_size {
        return Ok(());
    }
    let keep_chunk = size / DATA_CHUNK_BYTES;
    let within = size % DATA_CHUNK_BYTES;
    let first_dropped = if within == 0 {
        keep_chunk
    } else {
        keep_chunk + 1
    };
    let doomed = tx.range(
        obj,
        rtype::DATA,
        (first_dropped + 1) * DATA_CHUNK_BYTES,
        u64::MAX,
        usize::MAX,
    )?;
    for (key, _) in doomed {
        put(
            tx,
            LogicalKey {
                obj,
                rtype: rtype::DATA,
                key,
            },
            None,
        )?;
    }
    chunk::drop_patches(tx, obj, first_dropped, FILE_BYTES_MAX / DATA_CHUNK_BYTES)?;
    if within != 0 {
        let lk = chunk_key(obj, keep_chunk);
        if let Some(bytes) = chunk::chunk_bytes(tx, obj, keep_chunk)? {
            if bytes.len() as u64 > within {
                chunk::drop_patches(tx, obj, keep_chunk, keep_chunk)?;
                put(tx, lk, Some(Arc::new(bytes[..within as usize].to_vec())))?;
            }
        }
    }
    Ok(())
}

impl Filesystem {
    /// Creates a new volume with an empty root directory.
    pub fn mkfs(device: Arc<dyn Device>, volume_bytes: u64, label: &str) -> Result<()> {
        Volume::format(&*device, volume_bytes, label)?;
        let fs = Filesystem::open(
            device,
            MountOptions {
                commit_interval_ms: 0,
                ..Default::default()
            },
        )?;
        fs.volume.run(true, |tx| {
            let now = Timestamp::now();
            let root = Inode {
                mode: kind::DIR | 0o755,
                uid: 0,
                gid: 0,
                nlink: 2,
                size: 0,
                rdev: 0,
                flags: 0,
                atime: now,
                mtime: now,
                ctime: now,
                btime: now,
                parent_hint: ROOT_OBJ,
            };
            store_inode(tx, ROOT_OBJ, &root)
        })?;
        fs.close()
    }

    /// Opens a volume on a device. A background committer runs unless `commit_interval_ms`
    /// is 0 or the volume is read-only.
    pub fn open(device: Arc<dyn Device>, options: MountOptions) -> Result<Filesystem> {
        let volume = Volume::open(
            device,
            VolumeOptions {
                cache_bytes: options.cache_bytes,
                data_cache_bytes: options.data_cache_bytes,
                nohistory: options.nohistory,
                read_only: options.read_only,
                rebuild_space_map: options.rebuild_space_map,
                log_every_change: options.crash_log,
                crash_log_file: options.crash_log_file.clone(),
            },
        )?;
        let fs = Filesystem {
            prefetch: prefetch::Prefetcher::start(volume.clone(), options.background_thread_start),
            volume,
            committer: Mutex::new(None),
            open_handles: Mutex::new(foldhash::HashMap::default()),
            maybe_orphans: Mutex::default(),
            prune_lock: Mutex::new(()),
            evicting: std::sync::atomic::AtomicBool::new(false),
            evictable: Mutex::new(evict::Tracker::default()),
            evict_lock: Mutex::new(()),
            evict_listener: Mutex::new(None),
            evicted: Default::default(),
        };
        // (No root yet while mkfs makes one.)
        if let Ok(root) = fs.getattr(ROOT_OBJ) {
            if root.flags & inode_flags::CACHES != 0 {
                fs.start_evicting();
            }
        }
        // A slave's orphans are its master's: they go when the master reaps them.
        let slave = fs.volume.load_mirror_state()?.is_some();
        if !fs.volume.is_read_only() {
            if !slave && options.reap_orphans {
                fs.reap_orphans()?;
            } else if !slave {
                // Kept for the kernel, which may still hold them (a replaced daemon).
                let orphans = fs.volume.run(false, |tx| {
                    tx.range(VOLUME_OBJ, rtype::ORPHAN, 0, u64::MAX, usize::MAX)
                })?;
                fs.maybe_orphans
                    .lock()
                    .extend(orphans.into_iter().map(|(obj, _)| obj));
            }
            if options.commit_interval_ms > 0 {
                let handle = fs
                    .volume
                    .start_committer(Duration::from_millis(options.commit_interval_ms))?;
                *fs.committer.lock() = Some(handle);
            }
        }
        Ok(fs)
    }

    /// Opens an image file or block device by path.
    pub fn open_path(path: &Path, options: MountOptions) -> Result<Filesystem> {
        let device = FileDevice::open_direct(path, !options.read_only)?;
        device.set_read_around_bytes(options.cache_bytes / 16);
        Filesystem::open(Arc::new(device), options)
    }

    /// Destroys objects that were unlinked while open when the volume last went down.
    fn reap_orphans(&self) -> Result<()> {
        let orphans = self.volume.run(false, |tx| {
            tx.range(VOLUME_OBJ, rtype::ORPHAN, 0, u64::MAX, usize::MAX)
        })?;
        if orphans.is_empty() {
            return Ok(());
        }
        for (obj, _) in orphans {
            self.volume.run(true, |tx| destroy(tx, obj))?;
        }
        self.volume.commit()?;
        Ok(())
    }

    /// A locality hint (Hummingbird's `collocate_files`): store file `ino`'s data next to
    /// `near`'s, so that reading one brings the other into the cache with the same device
    /// request. It steers the next commit's placement only: files already on the device
    /// stay where they are, and a hint about a file that is not written is dropped.
    pub fn set_locality(&self, ino: u64, near: u64) {
        self.volume.set_locality(ino, near);
    }

    /// Names file `ino` as read together with `near` (a proxy's image served with its
    /// page): when the next commit writes `near`'s data anyway, it stores a copy of `ino`'s
    /// data in `near`'s locality set as well, so that reading `near` brings it along. The
    /// file stays where it is; the copy owns no space and is used only while its bytes
    /// verify against the file's own checksum (Hummingbird: a file in several clusters).
    pub fn copy_near(&self, ino: u64, near: u64) {
        self.volume.copy_near(ino, near);
    }

    pub fn volume(&self) -> &Arc<Volume> {
        &self.volume
    }

    /// Commits and stops the background committer. The volume stays readable.
    pub fn close(&self) -> Result<()> {
        self.prefetch.stop();
        self.volume.stop_committer();
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
        if self.volume.is_read_only() {
            return Ok(());
        }
        self.volume.commit()?;
        self.volume.prove_last_commit()?;
        self.volume.close_log();
        Ok(())
    }

    /// Commits everything now; returns the durable TID.
    pub fn sync(&self) -> Result<u64> {
        if self.volume.is_read_only() {
            // Changes a failure stopped from becoming durable make sync fail.
            return match self.volume.has_pending() {
                true => Err(self.volume.read_only_error()),
                false => Ok(self.volume.committed_tid()),
            };
        }
        self.volume.commit()
    }

    /// Makes every change so far durable (through the redo log).
    pub fn fsync(&self, _ino: u64) -> Result<()> {
        self.volume.sync_log()
    }

    pub fn info(&self) -> VolumeInfo {
        let usage = self.volume.usage();
        VolumeInfo {
            label: usage.label,
            volume_id: usage.volume_id.iter().map(|b| format!("{b:02x}")).collect(),
            volume_bytes: usage.volume_bytes,
            data_bytes: usage.data_bytes,
            used_bytes: usage.used_bytes,
            free_bytes: usage.free_bytes,
            reserve_bytes: usage.reserve_bytes,
            committed_tid: usage.committed_tid,
            commit_time_ns: usage.commit_time_ns,
            created_time_ns: usage.created_time_ns,
            objects_allocated: usage.next_obj.saturating_sub(1),
            objects: usage.live_objects,
            pending_bytes: usage.pending_bytes,
            cache_bytes: usage.cache_bytes,
            read_only: self.volume.is_read_only(),
            evicted_files: self.evicted.0.load(Ordering::Relaxed),
            evicted_bytes: self.evicted.1.load(Ordering::Relaxed),
            device: self.volume.device().report(),
            engine: self.volume.report(),
            cache: self.volume.cache_stats().report(),
        }
    }

    /// A read-only replica of a volume another host writes (on an object store): moves to
    /// that writer's newest commit. Returns the committed TID when it moved.
    pub fn follow(&self) -> Result<Option<u64>> {
        self.volume.follow()
    }

    pub fn statfs(&self) -> StatFs {
        let usage = self.volume.usage();
        let blocks = usage.data_bytes / BLOCK_BYTES;
        let free = usage.free_bytes.saturating_sub(usage.pending_bytes) / BLOCK_BYTES;
        // What writes of file data can still take (ENOSPC comes at that point), which
        // counts free space in holes shorter than a chunk for less than its bytes.
        let available = self.volume.data_space_left() / BLOCK_BYTES;
        #[expect(clippy::cast_possible_truncation, reason = "BLOCK_BYTES is 4 KiB")]
        let block_bytes = BLOCK_BYTES as u32;
        #[expect(clippy::cast_possible_truncation, reason = "NAME_BYTES_MAX is 255")]
        let name_bytes_max = NAME_BYTES_MAX as u32;
        StatFs {
            block_bytes,
            blocks,
            blocks_free: free,
            blocks_available: available,
            // next_obj comes from the superblock: a damaged one must not overflow this.
            files: usage.next_obj.saturating_add(free * 16),
            files_free: free * 16,
            name_bytes_max,
        }
    }

    /// A read-only view of the volume as of a committed TID.
    pub fn at(&self, tid: u64) -> Result<AsOf<'_>> {
        AsOf::new(self, tid)
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.volume
            .run(false, |tx| Ok(Attr::from_inode(ino, &load_inode(tx, ino)?)))
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let attr = self
            .volume
            .run(false, |tx| match find_entry(tx, parent, name)? {
                // Only a directory has entries: no need to read it to know.
                Some((_, entry)) => {
                    Ok(Attr::from_inode(entry.child, &load_inode(tx, entry.child)?))
                }
                None => {
                    dir_inode(tx, parent)?; // ENOENT or ENOTDIR, as the parent says.
                    fail(libc::ENOENT)
                }
            })?;
        self.note_evictable(&attr, parent, name);
        Ok(attr)
    }

    /// Creates any kind of object except directories and symlinks (mknod(2), creat(2)).
    pub fn mknod(
        &self,
        caller: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
    ) -> Result<Attr> {
        let mode = if mode & kind::MASK == 0 {
            mode | kind::FILE
        } else {
            mode
        };
        if matches!(mode & kind::MASK, kind::DIR | kind::SYMLINK) {
            return posix(libc::EINVAL);
        }
        self.create_object(caller, parent, name, mode, rdev, None)
    }

    /// Hummingbird's `write_file`: creates regular file `name` in `parent` (permission bits
    /// `mode`) holding `data`, in one operation. The entry, the inode and the data are
    /// logged together, so a crash leaves either no file or all of it, and a small file
    /// costs one hold of the volume and one log record where `mknod` and `write` take two.
    /// `near` names a file the new one is stored with (`set_locality`). Fails with EEXIST
    /// if the name exists.
    pub fn create_file(
        &self,
        caller: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        data: &[u8],
        near: Option<u64>,
    ) -> Result<Attr> {
        let len = data.len() as u64;
        if len > FILE_BYTES_MAX {
            return posix(libc::EFBIG);
        }
        self.volume.throttle();
        self.ensure_space(0, 4096)?;
        if len > 0 {
            // No file of its own yet: the directory stands for the writer (eviction, which
            // spares the writer, takes only files).
            self.ensure_space(parent, len)?;
        }
        #[expect(clippy::cast_possible_truncation, reason = "64 KiB")]
        let chunk_len = DATA_CHUNK_BYTES as usize;
        let chunks = data.chunks_exact(chunk_len);
        let tail = chunks.remainder();
        let whole: Vec<&[u8]> = chunks.collect();
        // Whole chunks go to the device first, as `write` sends them, a megabyte at a time:
        // only their addresses are logged. The bytes of a last, shorter chunk are copied
        // before the volume is held.
        let mut extents = Vec::with_capacity(whole.len());
        if !whole.is_empty() {
            let codec = self
                .volume
                .run(false, |tx| Ok(dir_inode(tx, parent)?.codec()))?;
            for batch in whole.chunks(WRITE_AHEAD_CHUNKS) {
                match self.volume.write_direct(batch, codec) {
                    Ok(written) => extents.extend(written),
                    Err(e) => {
                        self.volume.release_direct(&extents);
                        return Err(e);
                    }
                }
            }
        }
        let tail = (!tail.is_empty()).then(|| Arc::new(tail.to_vec()));
        let new = New {
            parent,
            name,
            mode: kind::FILE | (mode & 0o7777),
            rdev: 0,
            target: None,
        };
        let created = self.volume.run(true, |tx| {
            let attr = create_in(tx, caller, &new, &mut |tx, obj, inode| {
                let policy = chunk::Policy::of(inode);
                for (index, extent) in (0u64..).zip(&extents) {
                    tx.put_extent(chunk_key(obj, index), *extent, policy.nohistory)?;
                }
                if let Some(tail) = &tail {
                    let lk = chunk_key(obj, extents.len() as u64);
                    tx.put_with(lk, Some(tail.clone()), policy.nohistory, policy.codec)?;
                }
                inode.size = len;
                Ok(())
            })?;
            if let Some(near) = near {
                self.volume.set_locality(attr.ino, near);
            }
            Ok(attr)
        });
        let attr = created.inspect_err(|_| self.volume.release_direct(&extents))?;
        self.note_evictable(&attr, parent, name);
        Ok(attr)
    }

    pub fn mkdir(&self, caller: Caller, parent: u64, name: &[u8], mode: u32) -> Result<Attr> {
        self.create_object(caller, parent, name, kind::DIR | (mode & 0o7777), 0, None)
    }

    pub fn symlink(&self, caller: Caller, parent: u64, name: &[u8], target: &[u8]) -> Result<Attr> {
        if target.is_empty() || target.len() > SYMLINK_BYTES_MAX {
            return posix(if target.is_empty() {
                libc::ENOENT
            } else {
                libc::ENAMETOOLONG
            });
        }
        self.create_object(caller, parent, name, kind::SYMLINK | 0o777, 0, Some(target))
    }

    fn create_object(
        &self,
        caller: Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        rdev: u64,
        target: Option<&[u8]>,
    ) -> Result<Attr> {
        self.ensure_space(0, 4096)?;
        let new = New {
            parent,
            name,
            mode,
            rdev,
            target,
        };
        let attr = self.volume.run(true, |tx| {
            create_in(tx, caller, &new, &mut |_, _, _| Ok(()))
        })?;
        self.note_evictable(&attr, parent, name);
        Ok(attr)
    }

    pub fn link(&self, ino: u64, new_parent: u64, new_name: &[u8]) -> Result<Attr> {
        self.volume.run(true, |tx| {
            check_name(new_name)?;
            let mut inode = load_inode(tx, ino)?;
            if inode.is_dir() {
                return fail(libc::EPERM);
            }
            // An object unlinked while open stays unlinked, as on Linux (no O_TMPFILE here):
            // so an object with a link never has an orphan record (`drop_link`).
            if inode.nlink == 0 {
                return fail(libc::ENOENT);
            }
            if inode.nlink >= LINKS_MAX {
                return fail(libc::EMLINK);
            }
            let parent_inode = dir_inode(tx, new_parent)?;
            if parent_inode.nlink == 0 {
                return fail(libc::ENOENT);
            }
            if find_entry(tx, new_parent, new_name)?.is_some() {
                return fail(libc::EEXIST);
            }
            let now = Timestamp::now();
            inode.nlink += 1;
            inode.ctime = now;
            store_inode(tx, ino, &inode)?;
            let slot = free_slot(tx, new_parent, rtype::DIRENT, new_name)?;
            let entry = Dirent {
                child: ino,
                kind: inode.kind(),
                name: new_name.to_vec(),
            };
            put(
                tx,
                dirent_key(new_parent, slot),
                Some(Arc::new(entry.encode())),
            )?;
            touch_dir(tx, new_parent, 1, 0, now)?;
            Ok(Attr::from_inode(ino, &inode))
        })
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_entry(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_entry(parent, name, true)
    }

    fn remove_entry(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<()> {
        if name == b"." {
            return posix(libc::EINVAL);
        }
        if name == b".." {
            return posix(libc::ENOTEMPTY);
        }
        let child = self.volume.run(true, |tx| {
            dir_inode(tx, parent)?;
            let Some((slot, entry, version)) = find_entry_version(tx, parent, name)? else {
                return fail(libc::ENOENT);
            };
            let is_dir = entry.kind == kind::DIR;
            if want_dir && !is_dir {
                return fail(libc::ENOTDIR);
            }
            if !want_dir && is_dir {
                return fail(libc::EISDIR);
            }
            if is_dir && !is_empty_dir(tx, entry.child)? {
                return fail(libc::ENOTEMPTY);
            }
            let held = self.held_for_unlink(entry.child);
            unlink_entry(tx, parent, (slot, &entry, version), held)?;
            Ok(entry.child)
        })?;
        if self.evicting.load(Ordering::Relaxed) {
            self.evictable.lock().forget_name(parent, name, child);
        }
        Ok(())
    }

    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        if flags.noreplace && flags.exchange {
            return posix(libc::EINVAL);
        }
        let tracking = self.evicting.load(Ordering::Relaxed);
        let moved = self.volume.run(true, |tx| {
            if name == b"." || name == b".." {
                return fail(libc::EINVAL);
            }
            check_name(new_name).or_else(|e| match e {
                Stop::Fail(Error::Posix(libc::EEXIST)) => fail(libc::EINVAL),
                other => Err(other),
            })?;
            let parent_inode = dir_inode(tx, parent)?;
            let new_parent_inode = dir_inode(tx, new_parent)?;
            let Some((slot, entry)) = find_entry(tx, parent, name)? else {
                return fail(libc::ENOENT);
            };
            let target = find_entry(tx, new_parent, new_name)?;
            let src_is_dir = entry.kind == kind::DIR;
            // A directory may not move below itself.
            if src_is_dir && parent != new_parent && is_ancestor(tx, entry.child, new_parent)? {
                return fail(libc::EINVAL);
            }
            if new_parent_inode.nlink == 0 {
                return fail(libc::ENOENT);
            }
            let moving = Moving {
                parent,
                slot,
                entry,
                new_parent,
                new_name,
                now: Timestamp::now(),
            };
            // Only while the volume has cache directories.
            let cache = |flags: u32| tracking && flags & inode_flags::EVICTABLE != 0;
            // Where each file now is, if a cache directory: (file, directory, name).
            let mut moved = Vec::new();
            if moving.entry.kind == kind::FILE && cache(new_parent_inode.flags) {
                moved.push((moving.entry.child, new_parent, new_name.to_vec()));
            }
            let mut gone = Vec::new();
            if tracking {
                gone.push(moving.entry.child);
            }
            if flags.exchange {
                let Some((target_slot, target_entry)) = target else {
                    return fail(libc::ENOENT);
                };
                if tracking {
                    gone.push(target_entry.child);
                }
                if target_entry.kind == kind::FILE && cache(parent_inode.flags) {
                    moved.push((target_entry.child, parent, name.to_vec()));
                }
                exchange_entries(tx, &moving, name, target_slot, target_entry)?;
            } else {
                if let (Some((_, replaced)), true) = (&target, tracking) {
                    gone.push(replaced.child);
                }
                let target_open = target
                    .as_ref()
                    .is_some_and(|(_, t)| self.held_for_unlink(t.child));
                move_entry(tx, &moving, target, flags.noreplace, target_open)?;
            }
            Ok((gone, moved))
        })?;
        if tracking {
            // Forgotten where they left (a file moved out of a cache, or replaced, is not
            // the cache's to drop), noted where they are if that is a cache (a rename
            // counts as a use).
            let (gone, moved) = moved;
            let mut tracker = self.evictable.lock();
            for ino in gone {
                tracker.forget(ino);
            }
            for (ino, dir, name) in moved {
                tracker.note(ino, dir, &name, None);
            }
        }
        Ok(())
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.volume.run(false, |tx| {
            let inode = load_inode(tx, ino)?;
            if inode.kind() != kind::SYMLINK {
                return fail(libc::EINVAL);
            }
            match tx.get_bytes(LogicalKey {
                obj: ino,
                rtype: rtype::SYMLINK,
                key: 0,
            })? {
                Some(target) => Ok(target.to_vec()),
                None => Err(Stop::Fail(Error::corrupt(
                    "symlink without target",
                    format!("object {ino}"),
                ))),
            }
        })
    }

    /// Lists a directory after `cookie` (0 = from the start, including "." and "..").
    pub fn readdir(&self, ino: u64, cookie: u64, limit: usize) -> Result<Vec<DirEntry>> {
        self.volume.run(false, |tx| {
            let inode = dir_inode(tx, ino)?;
            let mut out = Vec::new();
            if cookie < 1 {
                out.push(DirEntry {
                    name: b".".to_vec(),
                    ino,
                    kind: FileKind::Dir,
                    cookie: 1,
                });
            }
            if cookie < 2 {
                let parent = inode.parent_hint;
                out.push(DirEntry {
                    name: b"..".to_vec(),
                    ino: parent,
                    kind: FileKind::Dir,
                    cookie: 2,
                });
            }
            let want = limit.saturating_sub(out.len());
            // A damaged entry may carry the largest key as its cookie: nothing follows it.
            let Some(from) = cookie.max(2).checked_add(1) else {
                return Ok(out);
            };
            for (key, value) in tx.range(ino, rtype::DIRENT, from, u64::MAX, want)? {
                let entry = Dirent::decode(&tx.resolve(&value)?)?;
                out.push(DirEntry {
                    name: entry.name,
                    ino: entry.child,
                    kind: FileKind::from_mode(entry.kind),
                    cookie: key,
                });
            }
            Ok(out)
        })
    }

    /// Reads up to `size` bytes at `offset`. Holes read as zeros.
    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>> {
        self.touch_evictable(ino);
        let (plan, root) = self.volume.run(false, |tx| {
            Ok((read_plan(tx, ino, offset, u64::from(size))?, tx.root()))
        })?;
        self.read_planned(ino, offset, u64::from(size), plan, root)
    }

    /// Hummingbird's `read_file`: the whole contents of file `name` in directory `parent`,
    /// with its inode number. The name is looked up and the file's records found under one
    /// hold of the volume, where a lookup and a read take two (and a reader that reads to
    /// its end, a third to find it). Files over 4 GiB fail with EFBIG: `read` takes them
    /// in pieces.
    pub fn read_whole(&self, parent: u64, name: &[u8]) -> Result<(u64, Vec<u8>)> {
        let (attr, plan, root) = self.volume.run(false, |tx| {
            dir_inode(tx, parent)?;
            let Some((_, entry)) = find_entry(tx, parent, name)? else {
                return fail(libc::ENOENT);
            };
            let plan = read_plan(tx, entry.child, 0, u64::MAX)?;
            if plan.inode.size > u64::from(u32::MAX) {
                return fail(libc::EFBIG);
            }
            let attr = Attr::from_inode(entry.child, &plan.inode);
            Ok((attr, plan, tx.root()))
        })?;
        self.note_evictable(&attr, parent, name);
        self.touch_evictable(attr.ino);
        let data = self.read_planned(attr.ino, 0, attr.size, plan, root)?;
        Ok((attr.ino, data))
    }

    /// The part of a read after the volume's hold: the extents `plan` found, read from the
    /// cache or the device, patched and cut to `offset..offset + size`.
    fn read_planned(
        &self,
        ino: u64,
        offset: u64,
        size: u64,
        plan: ReadPlan,
        root: Arc<crate::volume::RootRef>,
    ) -> Result<Vec<u8>> {
        let ReadPlan {
            inode,
            chunks,
            patches,
        } = plan;
        let file_size = inode.size;
        let end = file_size.min(offset.saturating_add(size));
        if offset >= end {
            return Ok(Vec::new());
        }
        // Read-ahead is asked for before this read's own extents are read (beyond them), and
        // this read waits for any piece of its range already asked for.
        self.prefetch
            .note_read(ino, offset, end - offset, file_size);
        self.prefetch.wait_for(ino, offset, end - offset);
        // A chunk its patches write whole is not read (the kernel's writeback cuts 1 MiB
        // writes anywhere a page starts, so a rewritten chunk is often two patches).
        let patched_whole = chunk::covered_by_patches(&chunks, &patches);
        let is_patched_whole = |key: u64| patched_whole.contains(&(key / DATA_CHUNK_BYTES - 1));
        // Every extent, of chunks and of patches, read in one pass (neighbours merged). A
        // chunk this read covers whole goes to the kernel's page cache whole: the engine's
        // cache keeps no second copy of it.
        let mut extents = Vec::new();
        let mut covered = Vec::new();
        let tagged = chunks
            .iter()
            .filter(|(key, _, _)| !is_patched_whole(*key))
            .map(|c| (c, true));
        for ((key, value, _), is_chunk) in tagged.chain(patches.iter().map(|p| (p, false))) {
            if let Value::Extent(extent) = value {
                let chunk_start = key.saturating_sub(DATA_CHUNK_BYTES);
                let chunk_end = chunk_start + u64::from(extent.logical_bytes);
                covered.push(is_chunk && offset <= chunk_start && chunk_end.min(end) == chunk_end);
                extents.push(*extent);
            }
        }
        let keep = |i: usize| !covered[i];
        let mut loaded = self
            .volume
            .read_extents_keeping(&extents, &keep)
            .into_iter();
        let mut resolve = |value: &Value, chunk_start: u64, create_tid: u64| match value {
            Value::Bytes(bytes) => Ok(bytes.clone()),
            Value::Extent(_) => {
                #[expect(
                    clippy::expect_used,
                    reason = "read_extents_keeping returns one result per extent, in order"
                )]
                let result = loaded.next().expect("one result per extent");
                result.inspect_err(|e| {
                    log::error!(
                        "read of object {ino} at offset {chunk_start} \
                         (TID {create_tid:#018x}) failed: {e}"
                    );
                })
            }
        };
        let mut chunk_bytes = Vec::with_capacity(chunks.len());
        for (key, value, create_tid) in &chunks {
            let bytes = match is_patched_whole(*key) {
                // Every byte comes from the patches, applied below.
                true => Arc::new(vec![0u8; chunk::value_len(value)]),
                false => resolve(value, key - DATA_CHUNK_BYTES, *create_tid)?,
            };
            chunk_bytes.push((*key, bytes));
        }
        let mut patch_bytes = chunk::PatchesByChunk::new();
        for (key, value, create_tid) in &patches {
            let index = patch::split(*key).0;
            let bytes = resolve(value, index * DATA_CHUNK_BYTES, *create_tid)?;
            patch_bytes
                .entry(index)
                .or_default()
                .push((*key, bytes, *create_tid));
        }
        // One chunk holds the whole range (a small file read whole, most often): its bytes
        // are the answer, with no zeroed buffer to copy them into, and none copied at all
        // when this read holds the only reference.
        let single = match &chunk_bytes[..] {
            [(key, bytes)] if patch_bytes.is_empty() => {
                let chunk_start = key - DATA_CHUNK_BYTES;
                let covers = chunk_start <= offset && end <= chunk_start + bytes.len() as u64;
                covers.then_some(chunk_start)
            }
            _ => None,
        };
        if let Some(chunk_start) = single {
            if let Some((_, bytes)) = chunk_bytes.pop() {
                drop(root);
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "offset..end lies inside the chunk, which is in memory"
                )]
                let (from, to) = (
                    (offset - chunk_start) as usize,
                    (end - chunk_start) as usize,
                );
                return Ok(match Arc::try_unwrap(bytes) {
                    Ok(mut whole) if from == 0 => {
                        whole.truncate(to);
                        whole
                    }
                    Ok(whole) => whole[from..to].to_vec(),
                    Err(shared) => shared[from..to].to_vec(),
                });
            }
        }
        #[expect(
            clippy::cast_possible_truncation,
            reason = "end - offset is at most a u32: `read` asks for a u32, and `read_whole` \
                      for a file of at most u32::MAX bytes"
        )]
        let mut out = vec![0u8; (end - offset) as usize];
        for (key, bytes) in chunk_bytes {
            let chunk_start = key - DATA_CHUNK_BYTES;
            let bytes = match patch_bytes.get_mut(&(key / DATA_CHUNK_BYTES - 1)) {
                Some(found) => {
                    // A chunk its patches cover whole was made here, zeroed, and is not
                    // shared: patched in place. A cached chunk is copied first.
                    let mut patched = Arc::try_unwrap(bytes).unwrap_or_else(|b| b.to_vec());
                    chunk::apply_patches(&mut patched, found, ino)?;
                    Arc::new(patched)
                }
                None => bytes,
            };
            let from = offset.max(chunk_start);
            let to = end.min(chunk_start + bytes.len() as u64);
            if from < to {
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "from..to lies inside out and inside the chunk, both in memory"
                )]
                out[(from - offset) as usize..(to - offset) as usize].copy_from_slice(
                    &bytes[(from - chunk_start) as usize..(to - chunk_start) as usize],
                );
            }
        }
        drop(root);
        Ok(out)
    }

    /// Writes `data` at `offset`, extending the file as needed, and stamps the file's
    /// modification and change times. Returns bytes written.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_timed(ino, offset, data, true)
    }

    /// `write`, leaving the file's times as they are: for a writer that keeps them itself
    /// and sets them with `setattr`, as the kernel does under FUSE's writeback cache (it
    /// stamps a write when the program makes it and sends the time on its own, and its
    /// WRITEs come later, in any order with that SETATTR).
    pub fn write_leaving_times(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_timed(ino, offset, data, false)
    }

    fn write_timed(&self, ino: u64, offset: u64, data: &[u8], stamp: bool) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|&e| e <= FILE_BYTES_MAX);
        let Some(end) = end else {
            return posix(libc::EFBIG);
        };
        self.volume.throttle();
        self.touch_evictable(ino);
        self.ensure_space(ino, data.len() as u64)?;
        // The chunks this write covers whole go to the device now, before the volume's lock
        // is taken (`Volume::write_direct`): written once, to their place, and only their
        // addresses logged. (They were copied into memory, copied again into the redo log
        // and written by the commit: three copies and two checksums of every byte.) Not a
        // chunk this group rewrote already (`Tx::keeps_in_memory`): that one is being
        // rewritten over and over (a record rewritten in place), and the memory path keeps
        // only its last version, which the commit writes once; written ahead, every
        // version went to the device (record rewrites of 1 MiB: 2.3 to 0.9 GB/s).
        let first_whole = offset.div_ceil(DATA_CHUNK_BYTES);
        let chunk_of = |index: u64| {
            #[expect(
                clippy::cast_possible_truncation,
                reason = "the chunk lies inside offset..end, and end - offset is data.len()"
            )]
            let from = (index * DATA_CHUNK_BYTES - offset) as usize;
            #[expect(clippy::cast_possible_truncation, reason = "64 KiB")]
            let len = DATA_CHUNK_BYTES as usize;
            &data[from..from + len]
        };
        let whole_indexes: Vec<u64> = (first_whole..end / DATA_CHUNK_BYTES).collect();
        let (codec, held) = match whole_indexes.is_empty() {
            true => (0, Vec::new()),
            false => self.volume.run(false, |tx| {
                let codec = chunk::Policy::of(&load_inode(tx, ino)?).codec;
                let held: Vec<bool> = whole_indexes
                    .iter()
                    .map(|&index| tx.keeps_in_memory(&chunk_key(ino, index)))
                    .collect();
                Ok((codec, held))
            })?,
        };
        let ahead: Vec<&[u8]> = whole_indexes
            .iter()
            .zip(&held)
            .filter(|(_, &held)| !held)
            .map(|(&index, _)| chunk_of(index))
            .collect();
        let extents = match ahead.is_empty() {
            true => Vec::new(),
            false => self.volume.write_direct(&ahead, codec)?,
        };
        let mut written_ahead = extents.iter().copied();
        let whole_chunks: Vec<WholeChunk> = whole_indexes
            .iter()
            .zip(&held)
            .map(|(&index, &held)| {
                let ahead = if held { None } else { written_ahead.next() };
                match ahead {
                    Some(extent) => WholeChunk::Extent(extent),
                    // The copy is made before the lock too: under it, it held up every other
                    // request for as long.
                    None => WholeChunk::Bytes(Arc::new(chunk_of(index).to_vec())),
                }
            })
            .collect();
        let mut fold_soon: Vec<u64> = Vec::new();
        let written = self.volume.run(true, |tx| {
            fold_soon.clear();
            let mut inode = load_inode(tx, ino)?;
            if inode.is_dir() {
                return fail(libc::EISDIR);
            }
            let policy = chunk::Policy::of(&inode);
            let first = offset / DATA_CHUNK_BYTES;
            let last = (end - 1) / DATA_CHUNK_BYTES;
            for index in first..=last {
                let chunk_start = index * DATA_CHUNK_BYTES;
                let from = offset.max(chunk_start);
                let to = end.min(chunk_start + DATA_CHUNK_BYTES);
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "from..to lies inside offset..end, and end - offset is data.len()"
                )]
                let src = &data[(from - offset) as usize..(to - offset) as usize];
                let lk = chunk_key(ino, index);
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "from lies in the chunk, so this is below DATA_CHUNK_BYTES (64 KiB)"
                )]
                let at = (from - chunk_start) as usize;
                let valid = inode.size.saturating_sub(chunk_start);
                let whole = at == 0 && src.len() as u64 == DATA_CHUNK_BYTES;
                if !whole {
                    match chunk::try_patch(tx, ino, index, at, src, valid, policy)? {
                        chunk::Patched::No => {}
                        chunk::Patched::Yes => continue,
                        chunk::Patched::FoldSoon => {
                            fold_soon.push(index);
                            continue;
                        }
                    }
                }
                if whole {
                    chunk::drop_patches(tx, ino, index, index)?;
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "a whole chunk lies inside the write: index - first_whole is \
                                  below data.len() / 64 KiB"
                    )]
                    let whole = &whole_chunks[(index - first_whole) as usize];
                    // The inode is at hand: no need for `put` to look the flag up per chunk.
                    match whole {
                        WholeChunk::Extent(extent) => {
                            tx.put_extent(lk, *extent, policy.nohistory)?
                        }
                        WholeChunk::Bytes(bytes) => {
                            tx.put_with(lk, Some(bytes.clone()), policy.nohistory, policy.codec)?
                        }
                    }
                    continue;
                }
                let existing = chunk::chunk_bytes(tx, ino, index)?;
                let old_len = existing.as_ref().map_or(0, |e| e.len());
                // Bytes past the old end of file inside this chunk are a hole: zeros.
                let valid = usize::try_from(inode.size.saturating_sub(chunk_start))
                    .map_or(old_len, |valid| valid.min(old_len));
                // The bytes that change: those written, and any cut off past the end.
                let changed_from = if valid < old_len { at.min(valid) } else { at };
                // One copy of the bytes that stay, into a buffer of the chunk's new size
                // (an append into a chunk grows it: copied and then grown, it was copied
                // twice, a third of the daemon's time on 4 KiB appends).
                let mut chunk = Vec::with_capacity(valid.max(at + src.len()));
                if let Some(existing) = &existing {
                    chunk.extend_from_slice(&existing[..valid]);
                }
                // Zeros only for a hole before the bytes written, not under them.
                if chunk.len() < at {
                    chunk.resize(at, 0);
                }
                let overlap = (chunk.len() - at).min(src.len());
                chunk[at..at + overlap].copy_from_slice(&src[..overlap]);
                chunk.extend_from_slice(&src[overlap..]);
                // The chunk is rewritten whole: its patches are part of it now.
                chunk::drop_patches(tx, ino, index, index)?;
                let chunk = Arc::new(chunk);
                match &existing {
                    Some(base) => tx.put_spliced(
                        lk,
                        chunk,
                        (policy.nohistory, policy.codec),
                        base,
                        changed_from,
                        at + src.len(),
                    )?,
                    None => tx.put_with(lk, Some(chunk), policy.nohistory, policy.codec)?,
                }
            }
            inode.size = inode.size.max(end);
            if stamp {
                let now = Timestamp::now();
                inode.mtime = now;
                inode.ctime = now;
            }
            store_inode(tx, ino, &inode)?;
            Ok(data.len())
        });
        let written = written.inspect_err(|_| self.volume.release_direct(&extents))?;
        for index in fold_soon {
            self.prefetch.fold_soon(ino, index);
        }
        Ok(written)
    }

    /// Folds chunk `index` of `ino` if its patches passed the soft bounds (see
    /// `chunk::fold`). Returns whether it did. Run by the background thread.
    pub(super) fn fold_chunk(volume: &Volume, ino: u64, index: u64) -> Result<bool> {
        volume.run(true, |tx| {
            let inode = match load_inode(tx, ino) {
                Ok(inode) if inode.kind() == kind::FILE => inode,
                // Gone, or no longer a file: nothing to fold.
                Ok(_) | Err(Stop::Fail(Error::Posix(_))) => return Ok(false),
                Err(stop) => return Err(stop),
            };
            chunk::fold(tx, ino, index, chunk::Policy::of(&inode))
        })
    }

    pub fn setattr(&self, ino: u64, changes: &SetAttr) -> Result<Attr> {
        if let Some(size) = changes.size {
            if size > FILE_BYTES_MAX {
                return posix(libc::EFBIG);
            }
        }
        self.volume.run(true, |tx| {
            let mut inode = load_inode(tx, ino)?;
            let now = Timestamp::now();
            if let Some(mode) = changes.mode {
                inode.mode = (inode.mode & kind::MASK) | (mode & 0o7777);
            }
            if let Some(uid) = changes.uid {
                inode.uid = uid;
            }
            if let Some(gid) = changes.gid {
                inode.gid = gid;
            }
            if let Some(size) = changes.size {
                if inode.is_dir() {
                    return fail(libc::EISDIR);
                }
                if inode.kind() != kind::FILE {
                    return fail(libc::EINVAL);
                }
                resize_data(tx, ino, inode.size, size)?;
                inode.size = size;
                inode.mtime = now;
            }
            let resolve = |t: TimeSet| match t {
                TimeSet::Now => now,
                TimeSet::At(t) => t,
            };
            if let Some(atime) = changes.atime {
                inode.atime = resolve(atime);
            }
            if let Some(mtime) = changes.mtime {
                inode.mtime = resolve(mtime);
            }
            inode.ctime = changes.ctime.unwrap_or(now);
            store_inode(tx, ino, &inode)?;
            Ok(Attr::from_inode(ino, &inode))
        })
    }

    /// Turns history off (or back on) for one object; new children of a directory inherit
    /// the setting. With history off, overwrites and deletes destroy the old version.
    pub fn set_nohistory(&self, ino: u64, nohistory: bool) -> Result<()> {
        self.volume.run(true, |tx| {
            let mut inode = load_inode(tx, ino)?;
            if nohistory {
                inode.flags |= inode_flags::NOHISTORY;
            } else {
                inode.flags &= !inode_flags::NOHISTORY;
            }
            inode.ctime = Timestamp::now();
            store_inode(tx, ino, &inode)
        })
    }

    /// Makes a directory a cache (or an ordinary directory again): files created in it
    /// afterwards, and directories with theirs, are deleted least recently used cluster
    /// first when space runs low, instead of writes failing with ENOSPC. Such a directory
    /// keeps no history (turning eviction off leaves history off; `set_nohistory` turns
    /// it back on). Files already in the directory keep their own setting.
    pub fn set_evictable(&self, ino: u64, evictable: bool) -> Result<()> {
        self.volume.run(true, |tx| {
            let mut inode = dir_inode(tx, ino)?;
            if evictable {
                inode.flags |= inode_flags::EVICTABLE | inode_flags::NOHISTORY;
            } else {
                inode.flags &= !inode_flags::EVICTABLE;
            }
            inode.ctime = Timestamp::now();
            store_inode(tx, ino, &inode)?;
            let mut root = load_inode(tx, ROOT_OBJ)?;
            if evictable && root.flags & inode_flags::CACHES == 0 {
                root.flags |= inode_flags::CACHES;
                store_inode(tx, ROOT_OBJ, &root)?;
            }
            Ok(())
        })?;
        if evictable {
            self.start_evicting();
        }
        Ok(())
    }

    /// Chooses the codec for new data of one object (None: the volume default); new children
    /// of a directory inherit it. Data already written keeps the codec it was stored with.
    pub fn set_compression(&self, ino: u64, codec: Option<u8>) -> Result<()> {
        if let Some(codec) = codec {
            if compression::name(codec) == "unknown" {
                return posix(libc::EINVAL);
            }
        }
        self.volume.run(true, |tx| {
            let mut inode = load_inode(tx, ino)?;
            inode.set_codec(codec);
            inode.ctime = Timestamp::now();
            store_inode(tx, ino, &inode)
        })
    }

    /// The codec chosen for one object (None: the volume default).
    pub fn compression(&self, ino: u64) -> Result<Option<u8>> {
        self.volume
            .run(false, |tx| Ok(load_inode(tx, ino)?.codec_setting()))
    }

    /// Whether an open handle holds `ino` (then unlinking its last name makes it an orphan).
    fn is_open(&self, ino: u64) -> bool {
        self.open_handles.lock().get(&ino).is_some_and(|&n| n > 0)
    }

    /// `is_open`, asked by a change that may take `ino`'s last link (inside its
    /// transaction). The object is noted as a possible orphan first, so that a release of
    /// its last handle that comes after this look finds it noted and settles it; if no
    /// handle holds it, the change destroys it and the note goes again.
    pub(crate) fn held_for_unlink(&self, ino: u64) -> bool {
        let mut noted = self.maybe_orphans.lock();
        noted.insert(ino);
        let open = self.is_open(ino);
        if !open {
            noted.remove(&ino);
        }
        open
    }

    /// Registers an open handle; an unlinked object lives until its last handle closes.
    pub fn open_handle(&self, ino: u64) -> Result<Attr> {
        let attr = self.getattr(ino)?;
        self.hold(ino);
        Ok(attr)
    }

    /// Registers a handle on an object the caller has just found or made, without reading
    /// it again (`open_handle` does): a mount pins every object the kernel learns of, at each
    /// positive LOOKUP and create, where the inode was read a moment before.
    pub fn hold(&self, ino: u64) {
        *self.open_handles.lock().entry(ino).or_insert(0) += 1;
    }

    pub fn release_handle(&self, ino: u64) -> Result<()> {
        let last = {
            let mut handles = self.open_handles.lock();
            match handles.get_mut(&ino) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    false
                }
                Some(_) => {
                    handles.remove(&ino);
                    true
                }
                None => false,
            }
        };
        if !last || self.volume.is_read_only() {
            return Ok(());
        }
        self.released_evictable(ino);
        // Most objects keep their links: no transaction (a FORGET per file on a mount).
        if !self.maybe_orphans.lock().contains(&ino) {
            return Ok(());
        }
        self.volume.run(true, |tx| {
            if self.open_handles.lock().contains_key(&ino) {
                return Ok(()); // Reopened meanwhile.
            }
            if let Some(bytes) = tx.get_bytes(inode_key(ino))? {
                if Inode::decode(&bytes)?.nlink == 0 {
                    destroy(tx, ino)?;
                }
            }
            // Settled (under the volume's lock, as the notes of `held_for_unlink` are).
            self.maybe_orphans.lock().remove(&ino);
            Ok(())
        })
    }

    pub fn setxattr(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        create: bool,
        replace: bool,
    ) -> Result<()> {
        if name.is_empty() || name.len() > NAME_BYTES_MAX {
            return posix(libc::ERANGE);
        }
        if value.len() > XATTR_VALUE_BYTES_MAX {
            return posix(libc::E2BIG);
        }
        self.volume.run(true, |tx| {
            let mut inode = load_inode(tx, ino)?;
            let existing =
                find_hashed(tx, ino, rtype::XATTR, name, |b| Ok(Xattr::decode(b)?.name))?;
            let (slot, found) = match (existing, create, replace) {
                (Some(_), true, _) => return fail(libc::EEXIST),
                (None, _, true) => return fail(libc::ENODATA),
                (Some((slot, _, create_tid)), _, _) => (slot, Found::Live(create_tid)),
                (None, _, _) => (free_slot(tx, ino, rtype::XATTR, name)?, Found::Absent),
            };
            let record = Xattr {
                name: name.to_vec(),
                value: value.to_vec(),
            };
            put_found(
                tx,
                LogicalKey {
                    obj: ino,
                    rtype: rtype::XATTR,
                    key: slot,
                },
                Some(Arc::new(record.encode())),
                found,
            )?;
            inode.ctime = Timestamp::now();
            store_inode(tx, ino, &inode)
        })
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.volume.run(false, |tx| {
            load_inode(tx, ino)?;
            match find_hashed(tx, ino, rtype::XATTR, name, |b| Ok(Xattr::decode(b)?.name))? {
                Some((_, bytes, _)) => Ok(Xattr::decode(&bytes)?.value),
                None => fail(libc::ENODATA),
            }
        })
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.volume.run(false, |tx| {
            load_inode(tx, ino)?;
            let mut names = Vec::new();
            for (_, value) in tx.range(ino, rtype::XATTR, 0, u64::MAX, usize::MAX)? {
                names.push(Xattr::decode(&tx.resolve(&value)?)?.name);
            }
            Ok(names)
        })
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.volume.run(true, |tx| {
            let mut inode = load_inode(tx, ino)?;
            match find_hashed(tx, ino, rtype::XATTR, name, |b| Ok(Xattr::decode(b)?.name))? {
                Some((slot, _, create_tid)) => {
                    put_found(
                        tx,
                        LogicalKey {
                            obj: ino,
                            rtype: rtype::XATTR,
                            key: slot,
                        },
                        None,
                        Found::Live(create_tid),
                    )?;
                    inode.ctime = Timestamp::now();
                    store_inode(tx, ino, &inode)
                }
                None => fail(libc::ENODATA),
            }
        })
    }

    // ---- Paths -------------------------------------------------------------------------

    /// Resolves an absolute or root-relative path (no symlink following) to an object id.
    pub fn resolve(&self, path: &str) -> Result<u64> {
        let mut ino = ROOT_OBJ;
        for part in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
            ino = self.lookup(ino, part.as_bytes())?.ino;
        }
        Ok(ino)
    }

    fn split_parent<'p>(&self, path: &'p str) -> Result<(u64, &'p str)> {
        let trimmed = path.trim_end_matches('/');
        let (dir, name) = match trimmed.rfind('/') {
            Some(i) => (&trimmed[..i], &trimmed[i + 1..]),
            None => ("", trimmed),
        };
        if name.is_empty() {
            return Err(Error::Invalid(format!("path {path:?} names no entry")));
        }
        Ok((self.resolve(dir)?, name))
    }

    /// Creates or replaces a regular file with `bytes`. A new file is made with its bytes
    /// in one operation (`create_file`); an existing one is cut to nothing and written.
    pub fn write_file(&self, path: &str, bytes: &[u8]) -> Result<u64> {
        let (parent, name) = self.split_parent(path)?;
        let ino = match self.lookup(parent, name.as_bytes()) {
            Err(Error::Posix(libc::ENOENT)) => {
                let new =
                    self.create_file(Caller::ROOT, parent, name.as_bytes(), 0o644, bytes, None);
                return Ok(new?.ino);
            }
            Ok(attr) => {
                self.setattr(
                    attr.ino,
                    &SetAttr {
                        size: Some(0),
                        ..Default::default()
                    },
                )?;
                attr.ino
            }
            Err(e) => return Err(e),
        };
        let mut offset = 0;
        for piece in bytes.chunks(1 << 20) {
            self.write(ino, offset, piece)?;
            offset += piece.len() as u64;
        }
        Ok(ino)
    }

    pub fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        let ino = self.resolve(path)?;
        read_all(|offset, size| self.read(ino, offset, size))
    }

    pub fn mkdir_path(&self, path: &str) -> Result<u64> {
        let (parent, name) = self.split_parent(path)?;
        Ok(self
            .mkdir(Caller::ROOT, parent, name.as_bytes(), 0o755)?
            .ino)
    }

    /// Removes a file, symlink or empty directory.
    pub fn remove_path(&self, path: &str) -> Result<()> {
        let (parent, name) = self.split_parent(path)?;
        match self.unlink(parent, name.as_bytes()) {
            Err(Error::Posix(libc::EISDIR)) => self.rmdir(parent, name.as_bytes()),
            other => other,
        }
    }

    pub fn rename_path(&self, from: &str, to: &str) -> Result<()> {
        let (parent, name) = self.split_parent(from)?;
        let (new_parent, new_name) = self.split_parent(to)?;
        self.rename(
            parent,
            name.as_bytes(),
            new_parent,
            new_name.as_bytes(),
            RenameFlags::default(),
        )
    }

    /// Names in a directory, without "." and "..", in cookie order.
    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>> {
        let ino = self.resolve(path)?;
        list_all(|cookie| self.readdir(ino, cookie, 1024))
    }
}

/// Reads a whole file through a positional reader.
pub(crate) fn read_all(mut read: impl FnMut(u64, u32) -> Result<Vec<u8>>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let piece = read(out.len() as u64, 1 << 20)?;
        if piece.is_empty() {
            return Ok(out);
        }
        out.extend_from_slice(&piece);
    }
}

pub(crate) fn list_all(
    mut readdir: impl FnMut(u64) -> Result<Vec<DirEntry>>,
) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    let mut cookie = 0;
    loop {
        let batch = readdir(cookie)?;
        let Some(last) = batch.last() else {
            return Ok(out);
        };
        cookie = last.cookie;
        out.extend(
            batch
                .into_iter()
                .filter(|e| e.name != b"." && e.name != b".."),
        );
    }
}

impl Drop for Filesystem {
    fn drop(&mut self) {
        self.volume.stop_committer();
        if let Some(handle) = self.committer.lock().take() {
            let _ = handle.join();
        }
    }
}

/// A chunk a write covers whole: written ahead of its commit, or kept in memory.
enum WholeChunk {
    Extent(crate::format::record::ExtentRef),
    Bytes(Arc<Vec<u8>>),
}
