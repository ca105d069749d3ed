//! A device that separates durable bytes from pending writes, to build the images a power
//! failure could leave behind.
//!
//! Every `write_at` is recorded as pending; `flush` makes all pending writes durable in order.
//! `crash_image` returns the durable image plus some pending writes, chosen by `CrashMode`:
//! dropped, applied as a subset in any order, torn at 512-byte sector granularity, or all but
//! one.
//! `writes_total` counts writes so a test can stop the workload at every write index.

use super::{memory_len, out_of_range, Device, Pages};
use parking_lot::Mutex;
use std::io;

/// What happens to writes that were not yet flushed when the power went.
#[derive(Clone, Copy, Debug)]
pub enum CrashMode {
    /// All pending writes are lost.
    DropAll,
    /// The first `n` pending writes reached the media, the rest are lost.
    Prefix(usize),
    /// A pseudo-random subset (by seed) of pending writes reached the media, in any order.
    Subset(u64),
    /// Like `Subset`, and each surviving write may be torn: only some of its sectors land.
    Torn(u64),
    /// Every pending write but the one at this index reached the media.
    AllBut(usize),
}

struct Inner {
    durable: Pages,
    pending: Vec<(u64, Vec<u8>)>,
    writes_total: u64,
    flushes_total: u64,
    /// When set, writes beyond this index fail as if the power had gone.
    power_cut_after: Option<u64>,
    /// When set, every flush fails as if the power had gone, and writes go on.
    flushes_fail: bool,
}

pub struct CrashDevice {
    inner: Mutex<Inner>,
}

const SECTOR: usize = 512;

/// Small deterministic generator so that crash images replay exactly by seed.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl CrashDevice {
    pub fn new(image: Vec<u8>) -> CrashDevice {
        CrashDevice::from_pages(Pages::from_vec(&image))
    }

    /// A device over `image`, sharing its pages (nothing is copied until written).
    pub fn from_pages(image: Pages) -> CrashDevice {
        CrashDevice {
            inner: Mutex::new(Inner {
                durable: image,
                pending: Vec::new(),
                writes_total: 0,
                flushes_total: 0,
                power_cut_after: None,
                flushes_fail: false,
            }),
        }
    }

    /// After `writes` more writes, every further write and flush fails (the power is gone).
    pub fn cut_power_after(&self, writes: u64) {
        let mut inner = self.inner.lock();
        inner.power_cut_after = Some(inner.writes_total + writes);
    }

    /// From now on every flush fails as if the power went just before it: the writes
    /// issued since the last flush stay pending, whole, for `crash_pages` to choose from.
    pub fn fail_flushes(&self) {
        self.inner.lock().flushes_fail = true;
    }

    /// Where each pending write goes, in the order issued.
    pub fn pending_offsets(&self) -> Vec<u64> {
        self.inner
            .lock()
            .pending
            .iter()
            .map(|(offset, _)| *offset)
            .collect()
    }

    pub fn writes_total(&self) -> u64 {
        self.inner.lock().writes_total
    }

    pub fn flushes_total(&self) -> u64 {
        self.inner.lock().flushes_total
    }

    pub fn pending_writes(&self) -> usize {
        self.inner.lock().pending.len()
    }

    /// The image as it would be found after a power failure now.
    pub fn crash_image(&self, mode: CrashMode) -> Vec<u8> {
        self.crash_pages(mode).to_vec()
    }

    /// `crash_image` as pages shared with the durable image: only the pages the surviving
    /// writes touch are copied.
    pub fn crash_pages(&self, mode: CrashMode) -> Pages {
        let inner = self.inner.lock();
        let mut image = inner.durable.clone();
        let apply = |image: &mut Pages, offset: u64, data: &[u8]| image.write(data, offset);
        match mode {
            CrashMode::DropAll => {}
            CrashMode::Prefix(n) => {
                for (offset, data) in inner.pending.iter().take(n) {
                    apply(&mut image, *offset, data);
                }
            }
            CrashMode::AllBut(lost) => {
                for (index, (offset, data)) in inner.pending.iter().enumerate() {
                    if index != lost {
                        apply(&mut image, *offset, data);
                    }
                }
            }
            CrashMode::Subset(seed) | CrashMode::Torn(seed) => {
                let torn = matches!(mode, CrashMode::Torn(_));
                let mut state = seed;
                let mut order: Vec<usize> = (0..inner.pending.len()).collect();
                for i in (1..order.len()).rev() {
                    #[expect(
                        clippy::cast_possible_truncation,
                        reason = "the remainder is at most i, a usize"
                    )]
                    let j = (splitmix(&mut state) % (i as u64 + 1)) as usize;
                    order.swap(i, j);
                }
                for index in order {
                    if splitmix(&mut state) % 2 == 0 {
                        continue;
                    }
                    let (offset, data) = &inner.pending[index];
                    if !torn {
                        apply(&mut image, *offset, data);
                        continue;
                    }
                    for (sector_index, sector) in data.chunks(SECTOR).enumerate() {
                        if splitmix(&mut state) % 4 != 0 {
                            apply(&mut image, offset + (sector_index * SECTOR) as u64, sector);
                        }
                    }
                }
            }
        }
        image
    }

    fn powered(inner: &Inner) -> io::Result<()> {
        match inner.power_cut_after {
            Some(limit) if inner.writes_total >= limit => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "simulated power loss",
            )),
            _ => Ok(()),
        }
    }
}

impl Device for CrashDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let inner = self.inner.lock();
        let size = inner.durable.len() as u64;
        if !inner.durable.contains(offset, buf.len()) {
            return Err(out_of_range(offset, buf.len(), size));
        }
        let end = offset + buf.len() as u64;
        inner.durable.read(buf, offset);
        // Reads see the newest bytes: overlay pending writes in order.
        for (write_offset, data) in &inner.pending {
            let write_end = write_offset + data.len() as u64;
            let lo = offset.max(*write_offset);
            let hi = end.min(write_end);
            if lo < hi {
                #[expect(
                    clippy::cast_possible_truncation,
                    reason = "lo..hi lies inside both buffers, so the differences are below their usize lengths"
                )]
                buf[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(
                    &data[(lo - write_offset) as usize..(hi - write_offset) as usize],
                );
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut inner = self.inner.lock();
        Self::powered(&inner)?;
        let size = inner.durable.len() as u64;
        if offset
            .checked_add(buf.len() as u64)
            .is_none_or(|e| e > size)
        {
            return Err(out_of_range(offset, buf.len(), size));
        }
        inner.writes_total += 1;
        inner.pending.push((offset, buf.to_vec()));
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut inner = self.inner.lock();
        Self::powered(&inner)?;
        if inner.flushes_fail {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "simulated power loss before a flush",
            ));
        }
        let pending = std::mem::take(&mut inner.pending);
        for (offset, data) in pending {
            inner.durable.write(&data, offset);
        }
        inner.flushes_total += 1;
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.inner.lock().durable.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.lock().durable.resize(memory_len(len)?);
        Ok(())
    }
}
