//! An in-memory device for tests: every write is immediately "durable".
//!
//! Bytes live in copy-on-write pages (`Pages`), so a copy of a device (`snapshot`) costs a
//! reference per 64 KiB, not the image: crash tests make thousands of images that differ
//! from one base in a few blocks.

use super::{memory_len, out_of_range, Device};
use parking_lot::RwLock;
use std::io;
use std::sync::{Arc, OnceLock};

const PAGE_BYTES: usize = 64 << 10;

fn zero_page() -> Arc<Vec<u8>> {
    static ZERO: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    ZERO.get_or_init(|| Arc::new(vec![0; PAGE_BYTES])).clone()
}

/// Bytes in shared, copy-on-write pages. Cloning shares every page; a write copies only
/// the pages it touches.
#[derive(Clone, Default)]
pub struct Pages {
    len: usize,
    pages: Vec<Arc<Vec<u8>>>,
}

impl Pages {
    pub fn zeroed(len: usize) -> Pages {
        let mut pages = Pages::default();
        pages.resize(len);
        pages
    }

    pub fn from_vec(bytes: &[u8]) -> Pages {
        let mut pages = Pages::zeroed(bytes.len());
        pages.write(bytes, 0);
        pages
    }

    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.len];
        self.read(&mut out, 0);
        out
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[offset, offset + len)` lies inside.
    pub fn contains(&self, offset: u64, len: usize) -> bool {
        offset
            .checked_add(len as u64)
            .is_some_and(|end| end <= self.len as u64)
    }

    /// Copies `buf.len()` bytes from `offset`; the range must lie inside.
    pub fn read(&self, buf: &mut [u8], offset: u64) {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the range lies inside, so offset is below self.len, a usize"
        )]
        let mut at = offset as usize;
        let mut done = 0;
        while done < buf.len() {
            let (page, within) = (at / PAGE_BYTES, at % PAGE_BYTES);
            let take = (PAGE_BYTES - within).min(buf.len() - done);
            buf[done..done + take].copy_from_slice(&self.pages[page][within..within + take]);
            done += take;
            at += take;
        }
    }

    /// Writes `buf` at `offset`, copying the pages it touches if they are shared; the range
    /// must lie inside.
    pub fn write(&mut self, buf: &[u8], offset: u64) {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the range lies inside, so offset is below self.len, a usize"
        )]
        let mut at = offset as usize;
        let mut done = 0;
        while done < buf.len() {
            let (page, within) = (at / PAGE_BYTES, at % PAGE_BYTES);
            let take = (PAGE_BYTES - within).min(buf.len() - done);
            Arc::make_mut(&mut self.pages[page])[within..within + take]
                .copy_from_slice(&buf[done..done + take]);
            done += take;
            at += take;
        }
    }

    /// The pages under `[offset, offset + len)`, None if the range does not lie inside.
    pub fn span(&self, offset: u64, len: usize) -> Option<PageSpan> {
        if !self.contains(offset, len) || len == 0 {
            return None;
        }
        let start = usize::try_from(offset).ok()?;
        let first = start / PAGE_BYTES;
        let last = (start + len - 1) / PAGE_BYTES;
        Some(PageSpan(self.pages[first..=last].to_vec()))
    }

    /// Whether the pages under `[offset, offset + len)` are the very pages `span` holds
    /// (compared without taking hold of them).
    pub fn holds(&self, offset: u64, len: usize, span: &PageSpan) -> bool {
        if !self.contains(offset, len) || len == 0 {
            return false;
        }
        let Ok(start) = usize::try_from(offset) else {
            return false;
        };
        let ours = &self.pages[start / PAGE_BYTES..=(start + len - 1) / PAGE_BYTES];
        ours.len() == span.0.len() && ours.iter().zip(&span.0).all(|(a, b)| Arc::ptr_eq(a, b))
    }

    pub fn resize(&mut self, len: usize) {
        if len < self.len {
            // Bytes past the new end read as zeros if the pages grow back.
            let keep = len.div_ceil(PAGE_BYTES);
            self.pages.truncate(keep);
            if len % PAGE_BYTES != 0 {
                if let Some(last) = self.pages.last_mut() {
                    Arc::make_mut(last)[len % PAGE_BYTES..].fill(0);
                }
            }
        }
        self.pages.resize(len.div_ceil(PAGE_BYTES), zero_page());
        self.len = len;
    }
}

/// The pages under a byte range of a `Pages`, held. Two spans are equal when they hold the
/// very same pages, and then the bytes under them are equal: a page is never changed in
/// place while a span holds it (a write copies a shared page first), and a held page is
/// never freed, so its address cannot come back as another page. Callers that check many
/// images sharing pages use this to skip bytes they have verified before.
#[derive(Clone)]
pub struct PageSpan(Vec<Arc<Vec<u8>>>);

impl PartialEq for PageSpan {
    fn eq(&self, other: &PageSpan) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|(a, b)| Arc::ptr_eq(a, b))
    }
}

impl Eq for PageSpan {}

#[derive(Default)]
pub struct MemDevice {
    bytes: RwLock<Pages>,
}

impl MemDevice {
    pub fn new(len: u64) -> MemDevice {
        // A length past the address space saturates, so the allocation fails loudly
        // instead of making a smaller device.
        MemDevice::from_pages(Pages::zeroed(usize::try_from(len).unwrap_or(usize::MAX)))
    }

    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        MemDevice::from_pages(Pages::from_vec(&bytes))
    }

    pub fn from_pages(pages: Pages) -> MemDevice {
        MemDevice {
            bytes: RwLock::new(pages),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.read().to_vec()
    }

    /// The current bytes, sharing pages with this device (copy-on-write both ways).
    pub fn pages(&self) -> Pages {
        self.bytes.read().clone()
    }

    /// `Pages::span` of the current bytes.
    pub fn span(&self, offset: u64, len: usize) -> Option<PageSpan> {
        self.bytes.read().span(offset, len)
    }

    /// `Pages::holds` of the current bytes.
    pub fn holds(&self, offset: u64, len: usize, span: &PageSpan) -> bool {
        self.bytes.read().holds(offset, len, span)
    }
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = self.bytes.read();
        if !bytes.contains(offset, buf.len()) {
            return Err(out_of_range(offset, buf.len(), bytes.len() as u64));
        }
        bytes.read(buf, offset);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = self.bytes.write();
        if !bytes.contains(offset, buf.len()) {
            return Err(out_of_range(offset, buf.len(), bytes.len() as u64));
        }
        bytes.write(buf, offset);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.read().len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.bytes.write().resize(memory_len(len)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_read_write_resize_and_share() {
        let mut a = Pages::from_vec(&(0..200_000u32).map(|i| i as u8).collect::<Vec<_>>());
        let b = a.clone();
        a.write(&[7; 70_000], 60_000); // spans three pages
        let mut got = vec![0; 200_000];
        a.read(&mut got, 0);
        for (i, byte) in got.iter().enumerate() {
            let want = if (60_000..130_000).contains(&i) {
                7
            } else {
                i as u8
            };
            assert_eq!(*byte, want, "byte {i}");
        }
        // The clone kept its own bytes.
        assert_eq!(
            b.to_vec(),
            (0..200_000u32).map(|i| i as u8).collect::<Vec<_>>()
        );
        a.resize(100_001);
        a.resize(150_000);
        let mut tail = vec![1; 49_999];
        a.read(&mut tail, 100_001);
        assert!(
            tail.iter().all(|&x| x == 0),
            "bytes past a shrink come back as zeros"
        );
        assert!(!a.contains(149_999, 2) && a.contains(149_999, 1));
    }
}
