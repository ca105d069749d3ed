//! File data as chunks: one DATA record per 64 KiB chunk, and PATCH records for small
//! overwrites of a committed chunk (`format::record::patch`).
//!
//! A write of a few pages into a chunk that is already on the device stores only those
//! pages, as a PATCH of the chunk, instead of a new copy of the whole chunk; so does a
//! write that extends the chunk (an append to a file whose last chunk is stored). Reads apply a
//! chunk's patches over it in create_tid order. Patches are bounded per chunk (count and
//! pages) twice: past the soft bounds the write still stores a patch and asks for the chunk
//! to be folded in the background (`fold`: the chunk written anew with its patches applied,
//! the patches removed, in one operation), so the device reads a fold needs are not on the
//! writer's path; the write that would pass a hard bound folds the chunk itself. Patches
//! that together write every byte of the chunk are folded at once, from themselves alone;
//! one patch of this group that does is the chunk, and replaces its DATA record right
//! away. Either way a patch always lies over the DATA record it was written against, at
//! every TID.

use super::{chunk_key, put};
use crate::btree::{Step, Stop};
use crate::error::{Error, Result};
use crate::format::record::{
    compression, inode_flags, patch, rtype, Inode, LogicalKey, DATA_CHUNK_BYTES,
};
use crate::volume::{Tx, Value};
use std::collections::HashSet;
use std::sync::Arc;

/// Live patches of a chunk past which a background fold is asked for.
const PATCHES_SOFT: usize = 8;
/// Live patches a chunk may have; the next small write folds the chunk itself.
const PATCHES_HARD: usize = 16;
/// Pages the live patches of a chunk may hold together (a page counted once per patch that
/// holds it) before a background fold is asked for (a chunk's worth), and at most (two):
/// what a read of the chunk reads beside the chunk itself.
const PAGES_SOFT: u32 = patch::PAGES;
const PAGES_HARD: u32 = 2 * patch::PAGES;

/// What `try_patch` did.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Patched {
    /// Not a patch: the caller writes the whole chunk.
    No,
    /// Stored as a patch.
    Yes,
    /// Stored as a patch past the soft bounds: the chunk should be folded soon.
    FoldSoon,
}

/// A patch with its bytes: (key, bytes, create_tid).
pub(crate) type ResolvedPatch = (u64, Arc<Vec<u8>>, u64);
/// Resolved patches by chunk index.
pub(crate) type PatchesByChunk = std::collections::HashMap<u64, Vec<ResolvedPatch>>;

/// How an object's records are written: keep history or not, and the codec of its data.
#[derive(Clone, Copy)]
pub(super) struct Policy {
    pub nohistory: bool,
    pub codec: u8,
}

impl Policy {
    /// The settings an object's inode gives its data.
    pub fn of(inode: &Inode) -> Policy {
        Policy {
            nohistory: inode.flags & inode_flags::NOHISTORY != 0,
            codec: inode.codec(),
        }
    }
}

pub(super) fn patch_lk(obj: u64, key: u64) -> LogicalKey {
    LogicalKey {
        obj,
        rtype: rtype::PATCH,
        key,
    }
}

/// Live patches of chunks `first..=last` as (key, value, create_tid), in key order.
pub(super) fn patches(
    tx: &Tx<'_>,
    obj: u64,
    first: u64,
    last: u64,
) -> Step<Vec<(u64, Value, u64)>> {
    let (lo, hi) = patch::key_range(first, last);
    tx.range_versions(obj, rtype::PATCH, lo, hi, usize::MAX)
}

/// Records as (key, value, create_tid), in key order.
pub(super) type Versions = Vec<(u64, Value, u64)>;

/// Live DATA records with keys `lo..=hi` (chunk end offsets) and the patches of those
/// chunks. A read that runs to the file's end (`to_end`) from its first chunk takes both
/// from one walk: no chunk lies past the last, and none before the first has patches that
/// the span would gather. Any other read takes one walk each, so that a short read of a
/// large file walks none of its other chunks.
pub(super) fn data_and_patches(
    tx: &Tx<'_>,
    obj: u64,
    (lo, hi): (u64, u64),
    to_end: bool,
) -> Step<(Versions, Versions)> {
    let (first, last) = (lo / DATA_CHUNK_BYTES - 1, hi / DATA_CHUNK_BYTES - 1);
    if !to_end || first > 0 {
        let chunks = tx.range_versions(obj, rtype::DATA, lo, hi, usize::MAX)?;
        return Ok((chunks, patches(tx, obj, first, last)?));
    }
    let (patch_lo, patch_hi) = patch::key_range(first, last);
    let at = |rtype, key| LogicalKey { obj, rtype, key };
    let mut chunks = Vec::new();
    let mut patches = Vec::new();
    for (lk, value, create_tid) in
        tx.span(at(rtype::DATA, lo), at(rtype::PATCH, patch_hi), usize::MAX)?
    {
        match lk.rtype {
            rtype::DATA if lk.key <= hi => chunks.push((lk.key, value, create_tid)),
            rtype::PATCH if lk.key >= patch_lo => patches.push((lk.key, value, create_tid)),
            _ => {}
        }
    }
    Ok((chunks, patches))
}

/// Applies patches to a chunk's bytes, oldest first. `patches` holds (key, bytes,
/// create_tid) of this chunk only.
pub(crate) fn apply_patches(
    chunk: &mut Vec<u8>,
    patches: &mut [ResolvedPatch],
    obj: u64,
) -> Result<()> {
    patches.sort_by_key(|p| p.2);
    for (key, bytes, tid) in patches.iter() {
        let (index, bitmap) = patch::split(*key);
        if !patch::apply(chunk, bitmap, bytes) {
            return Err(Error::corrupt(
                format!(
                    "patch {bitmap:#06x} of {} bytes does not fit its chunk of {} bytes",
                    bytes.len(),
                    chunk.len()
                ),
                format!(
                    "object {obj} at file offset {} (TID {tid:#018x})",
                    index * DATA_CHUNK_BYTES
                ),
            ));
        }
    }
    Ok(())
}

/// The current bytes of chunk `index`: its DATA record with its patches applied. None for
/// a hole.
pub(super) fn chunk_bytes(tx: &Tx<'_>, obj: u64, index: u64) -> Step<Option<Arc<Vec<u8>>>> {
    let found = patches(tx, obj, index, index)?;
    if found.is_empty() {
        return tx.get_bytes(chunk_key(obj, index));
    }
    let Some(data) = tx.get(chunk_key(obj, index))? else {
        return Err(Stop::Fail(Error::corrupt(
            "patch of a chunk that does not exist",
            format!("object {obj} at file offset {}", index * DATA_CHUNK_BYTES),
        )));
    };
    // Patches that write every byte leave nothing of the DATA record to read: the kernel's
    // writeback sends 1 MiB writes that begin anywhere a page does, so a chunk rewritten
    // across two of them is a patch over a chunk it replaces whole.
    let mut bytes = match patches_cover(&found, value_len(&data)) {
        true => vec![0u8; value_len(&data)],
        false => tx.resolve(&data)?.to_vec(),
    };
    let mut resolved = Vec::with_capacity(found.len());
    for (key, value, tid) in found {
        resolved.push((key, tx.resolve(&value)?, tid));
    }
    apply_patches(&mut bytes, &mut resolved, obj)?;
    Ok(Some(Arc::new(bytes)))
}

/// Of `chunks` (DATA records as (key, value, create_tid)), the indexes of those whose
/// patches among `patches` (in key order) write every byte: a read needs only the patches.
pub(super) fn covered_by_patches(
    chunks: &[(u64, Value, u64)],
    patches: &[(u64, Value, u64)],
) -> HashSet<u64> {
    let mut covered = HashSet::new();
    let mut rest = patches;
    for (key, value, _) in chunks {
        let index = key / DATA_CHUNK_BYTES - 1;
        let start = rest.partition_point(|(k, _, _)| patch::split(*k).0 < index);
        let len = rest[start..].partition_point(|(k, _, _)| patch::split(*k).0 == index);
        let found = &rest[start..start + len];
        if !found.is_empty() && patches_cover(found, value_len(value)) {
            covered.insert(index);
        }
        rest = &rest[start + len..];
    }
    covered
}

/// Whether `found` (patches of one chunk) write every byte of the chunk: of its DATA
/// record's `data_len` bytes and of whatever they extend it by.
fn patches_cover(found: &[(u64, Value, u64)], data_len: usize) -> bool {
    let mut spans = Vec::with_capacity(found.len());
    for (key, value, _) in found {
        let bitmap = patch::split(*key).1;
        let Some(end) = patch::end(bitmap, value_len(value)) else {
            return false; // damaged: the slow path names it
        };
        spans.push((bitmap, end));
    }
    spans_cover(&spans, data_len)
}

/// Whether patches given as (bitmap, end) write every byte of a chunk whose DATA record
/// holds `data_len` bytes, and of whatever they extend it by.
fn spans_cover(spans: &[(u16, usize)], data_len: usize) -> bool {
    let mut ranges = Vec::new();
    let mut len = data_len;
    for &(bitmap, end) in spans {
        len = len.max(end);
        ranges.extend(
            (0..patch::PAGES)
                .filter(|p| bitmap & (1 << p) != 0)
                .filter_map(|p| patch::page_range(p, end)),
        );
    }
    ranges.sort_unstable_by_key(|r| r.start);
    let mut covered = 0;
    for range in ranges {
        if range.start > covered {
            return false;
        }
        covered = covered.max(range.end);
    }
    covered >= len
}

/// Removes the patches of chunks `first..=last` (their DATA records are being replaced or
/// removed).
pub(super) fn drop_patches(tx: &mut Tx<'_>, obj: u64, first: u64, last: u64) -> Step<()> {
    for (key, _, _) in patches(tx, obj, first, last)? {
        put(tx, patch_lk(obj, key), None)?;
    }
    Ok(())
}

/// Bytes a value holds.
pub(super) fn value_len(value: &Value) -> usize {
    match value {
        Value::Bytes(bytes) => bytes.len(),
        Value::Extent(extent) => extent.logical_bytes as usize,
    }
}

/// Writes `src` at byte `at` of chunk `index` as a patch, if the chunk is committed as an
/// extent and the chunk's patch bounds allow it. The write may extend the chunk when the
/// chunk holds nothing past the file's end (`valid`, the file's end inside the chunk);
/// otherwise it must end at or before `valid`. Returns `Patched::No` when the caller must
/// rewrite the chunk instead.
pub(super) fn try_patch(
    tx: &mut Tx<'_>,
    obj: u64,
    index: u64,
    at: usize,
    src: &[u8],
    valid: u64,
    policy: Policy,
) -> Step<Patched> {
    let Policy { nohistory, codec } = policy;
    let lk = chunk_key(obj, index);
    if tx.is_pending_active(&lk) {
        return Ok(Patched::No); // the chunk is in memory anyway and commits once
    }
    let (data_len, stored_raw) = match tx.get(lk)? {
        Some(Value::Extent(extent)) => (
            extent.logical_bytes as usize,
            extent.compression == compression::NONE,
        ),
        _ => return Ok(Patched::No), // a hole, or inline bytes: rewriting costs little
    };
    // Pages of a chunk that did not compress are not compressed either: the commit would
    // try every 4 KiB patch whole (no sample probe at that size), a tenth of a random
    // small-write load's time for nothing.
    let codec = match stored_raw {
        true => compression::NONE,
        false => codec,
    };
    let live = patches(tx, obj, index, index)?;
    // The chunk's length now: its DATA record extended by any patch that ends past it.
    let mut chunk_len = data_len;
    let mut ends = Vec::with_capacity(live.len());
    for (key, value, _) in &live {
        let bitmap = patch::split(*key).1;
        let Some(end) = patch::end(bitmap, value_len(value)) else {
            return Err(Stop::Fail(Error::corrupt(
                format!("patch {bitmap:#06x} of {} bytes", value_len(value)),
                format!("object {obj} at file offset {}", index * DATA_CHUNK_BYTES),
            )));
        };
        chunk_len = chunk_len.max(end);
        ends.push((*key, end));
    }
    let end = at + src.len();
    let fits = if end > chunk_len {
        chunk_len as u64 <= valid // nothing stale past the file's end to leave behind
    } else {
        end as u64 <= valid
    };
    if !fits {
        return Ok(Patched::No);
    }
    let chunk_len = chunk_len.max(end);
    // This group's own patch of the chunk, if any, is widened instead of adding another.
    let mut own = None;
    let mut own_payload = None;
    let mut others = 0;
    let mut pages = 0;
    for (key, value, _) in &live {
        if tx.is_pending_active(&patch_lk(obj, *key)) {
            own = Some(*key);
            own_payload = Some(tx.resolve(value)?);
        } else {
            others += 1;
            pages += patch::split(*key).1.count_ones();
        }
    }
    let own_bitmap = own.map_or(0, |key| patch::split(key).1);
    let bitmap = own_bitmap | patch::pages_of(at as u64, end as u64);
    let key = patch::key(index, bitmap);
    let layout_end = patch::layout_end(bitmap, chunk_len);
    // Older patches this one covers whole add nothing to the chunk any more: they end with
    // this TID (history keeps them for the TIDs before), so a page rewritten or a log
    // appended to day after day keeps one or two live patches instead of growing a fold.
    let superseded: Vec<u64> = ends
        .iter()
        .filter(|&&(old, old_end)| {
            let old_bitmap = patch::split(old).1;
            Some(old) != own && old != key && old_bitmap & !bitmap == 0 && old_end <= layout_end
        })
        .map(|&(old, _)| old)
        .collect();
    let superseded_pages: u32 = superseded
        .iter()
        .map(|&old| patch::split(old).1.count_ones())
        .sum();
    let count = others - superseded.len() + 1;
    let held = pages - superseded_pages + bitmap.count_ones();
    if count > PATCHES_HARD || held > PAGES_HARD {
        return Ok(Patched::No);
    }
    // The patches that stay, this one with them: do they write the whole chunk? Then a
    // fold reads nothing of the chunk.
    let mut spans: Vec<(u16, usize)> = ends
        .iter()
        .filter(|&&(old, _)| Some(old) != own && old != key && !superseded.contains(&old))
        .map(|&(old, end)| (patch::split(old).1, end))
        .collect();
    let alone = spans.is_empty();
    spans.push((bitmap, layout_end));
    let covers = spans_cover(&spans, data_len);
    let outcome = match needs_fold(count, held, covers) {
        true => Patched::FoldSoon,
        false => Patched::Yes,
    };
    // Whole pages need nothing of the chunk: only a page written in part is read first.
    let own_pages = own_payload.as_deref().map(|p| (own_bitmap, p.as_slice()));
    let payload = match patch::compose(bitmap, chunk_len, at, src, own_pages) {
        Some(payload) => payload,
        None => {
            let Some(current) = chunk_bytes(tx, obj, index)? else {
                return Ok(Patched::No);
            };
            let mut current = current.to_vec();
            current.resize(chunk_len, 0);
            current[at..end].copy_from_slice(src);
            patch::extract(&current, bitmap)
        }
    };
    if covers && alone {
        // This patch alone is the whole chunk (its pages in order are the chunk's bytes):
        // it replaces the DATA record now, as a sequential writer's chunk would, instead
        // of waiting for a fold. The patches it covers go with the chunk they patched.
        drop_patches(tx, obj, index, index)?;
        let chunk = Some(Arc::new(payload));
        tx.put_with(chunk_key(obj, index), chunk, nohistory, policy.codec)?;
        return Ok(Patched::Yes);
    }
    if let Some(old) = own.filter(|&old| old != key) {
        // The wider patch covers every page of the narrower one.
        tx.put_with(patch_lk(obj, old), None, nohistory, codec)?;
    }
    let lk = patch_lk(obj, key);
    // Rewriting bytes of this group's own patch, pages unchanged: the log needs only them.
    let spliced = own.filter(|&old| old == key).and(own_payload.as_ref()).zip(
        patch::payload_offset(bitmap, layout_end, at).zip(patch::payload_offset(
            bitmap,
            layout_end,
            end - 1,
        )),
    );
    match spliced {
        Some((base, (lo, last))) => {
            let payload = Arc::new(payload);
            tx.put_spliced(lk, payload, (nohistory, codec), base, lo, last + 1)?
        }
        None => tx.put_with(lk, Some(Arc::new(payload)), nohistory, codec)?,
    }
    for old in superseded {
        tx.put_with(patch_lk(obj, old), None, nohistory, codec)?;
    }
    Ok(outcome)
}

/// Whether a chunk with `count` live patches holding `pages` pages together, which
/// `covers` the chunk whole or not, is to be folded: past a soft bound, or as soon as the
/// patches write every byte (the fold then reads nothing of the chunk). Half a chunk of
/// patches is left as it is: folding it would read the whole chunk and write it again, a
/// random writer's every page twice over, for reads that need one more extent.
fn needs_fold(count: usize, pages: u32, covers: bool) -> bool {
    covers || count > PATCHES_SOFT || pages > PAGES_SOFT
}

/// Folds chunk `index` of `obj` if its patches are still past the soft bounds: writes it
/// anew with its patches applied and removes them, as the write that passes a hard bound
/// does. Contents are unchanged at every TID, so the inode's times are left alone.
pub(super) fn fold(tx: &mut Tx<'_>, obj: u64, index: u64, policy: Policy) -> Step<bool> {
    let live = patches(tx, obj, index, index)?;
    let pages: u32 = live
        .iter()
        .map(|(key, _, _)| patch::split(*key).1.count_ones())
        .sum();
    let covers = match tx.get(chunk_key(obj, index))? {
        Some(data) => !live.is_empty() && patches_cover(&live, value_len(&data)),
        None => false,
    };
    if !needs_fold(live.len(), pages, covers) {
        return Ok(false);
    }
    let Some(bytes) = chunk_bytes(tx, obj, index)? else {
        return Ok(false);
    };
    drop_patches(tx, obj, index, index)?;
    tx.put_with(
        chunk_key(obj, index),
        Some(bytes),
        policy.nohistory,
        policy.codec,
    )?;
    Ok(true)
}
