//! Explicit little-endian encoding. The reader bounds-checks every access, so hostile bytes
//! produce `Error::Corrupt`, never a panic.

use crate::error::{Error, Result};

#[derive(Default)]
pub struct Writer {
    pub bytes: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(capacity: usize) -> Writer {
        Writer {
            bytes: Vec::with_capacity(capacity),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.bytes.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.bytes.extend_from_slice(&v.to_le_bytes());
    }
    /// LEB128: seven bits per byte, low bits first.
    pub fn uvarint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.bytes.push((v & 0x7f) as u8 | 0x80);
            v >>= 7;
        }
        self.bytes.push((v & 0x7f) as u8);
    }
    pub fn raw(&mut self, v: &[u8]) {
        self.bytes.extend_from_slice(v);
    }
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// Writes into a slice whose size the caller computed (a log batch encoded straight into
/// its place in a mapped file). Bytes past the end are not written: `overflowed` says so.
pub struct SliceWriter<'a> {
    bytes: &'a mut [u8],
    at: usize,
    overflowed: bool,
}

impl<'a> SliceWriter<'a> {
    pub fn new(bytes: &'a mut [u8]) -> SliceWriter<'a> {
        SliceWriter {
            bytes,
            at: 0,
            overflowed: false,
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.raw(&[v]);
    }
    pub fn u16(&mut self, v: u16) {
        self.raw(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.raw(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.raw(&v.to_le_bytes());
    }
    pub fn raw(&mut self, v: &[u8]) {
        let end = self.at.saturating_add(v.len());
        match self.bytes.get_mut(self.at..end) {
            Some(dst) => {
                dst.copy_from_slice(v);
                self.at = end;
            }
            None => self.overflowed = true,
        }
    }
    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.at
    }
    pub fn is_empty(&self) -> bool {
        self.at == 0
    }
    /// Whether a write did not fit.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }
}

pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], what: &'static str) -> Reader<'a> {
        Reader {
            bytes,
            position: 0,
            what,
        }
    }
    #[inline]
    pub fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        match self.position.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let slice = &self.bytes[self.position..end];
                self.position = end;
                Ok(slice)
            }
            _ => Err(self.truncated(n)),
        }
    }
    #[cold]
    fn truncated(&self, n: usize) -> Error {
        Error::corrupt(
            format!("{} truncated", self.what),
            format!("byte {} (+{n} of {})", self.position, self.bytes.len()),
        )
    }
    #[inline]
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }
    #[inline]
    pub fn u8(&mut self) -> Result<u8> {
        match self.bytes.get(self.position) {
            Some(&byte) => {
                self.position += 1;
                Ok(byte)
            }
            None => Err(self.truncated(1)),
        }
    }
    pub fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    #[inline]
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub fn i64(&mut self) -> Result<i64> {
        Ok(i64::from_le_bytes(self.array()?))
    }
    #[inline]
    pub fn uvarint(&mut self) -> Result<u64> {
        // One byte: the common case (small counts, lengths, flags).
        if let Some(&byte) = self.bytes.get(self.position) {
            if byte < 0x80 {
                self.position += 1;
                return Ok(u64::from(byte));
            }
        }
        self.uvarint_long()
    }
    fn uvarint_long(&mut self) -> Result<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                break;
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Error::corrupt(
            format!("{}: varint longer than 64 bits", self.what),
            format!("byte {}", self.position),
        ))
    }
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }
    pub fn position(&self) -> usize {
        self.position
    }
}
