//! A device wrapper that records every write and flush to a log file, like dm-log-writes,
//! so a run on the real mount can later be replayed to each flush point and checked
//! (`anvil replay-check`).
//!
//! Log records, little-endian: `b'W'`, offset u64, length u32, the bytes; or `b'F'` for a
//! completed flush. A record is appended after the inner device accepted the write (or
//! finished the flush), so the log never claims more than the device saw.

use super::Device;
use crate::sync::Mutex;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::sync::Arc;

pub struct LogDevice<D: Device + ?Sized> {
    inner: Arc<D>,
    log: Mutex<BufWriter<File>>,
}

impl<D: Device + ?Sized> LogDevice<D> {
    pub fn new(inner: Arc<D>, log: File) -> LogDevice<D> {
        LogDevice {
            inner,
            log: Mutex::new(BufWriter::with_capacity(1 << 20, log)),
        }
    }
}

impl<D: Device + ?Sized> LogDevice<D> {
    /// Runs a write on the inner device and, once it is accepted, records it.
    fn record_write(
        &self,
        buf: &[u8],
        offset: u64,
        write: impl FnOnce(&D) -> io::Result<()>,
    ) -> io::Result<()> {
        let len = u32::try_from(buf.len()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "write too long for the device log",
            )
        })?;
        let mut log = self.log.lock();
        write(&self.inner)?;
        log.write_all(b"W")?;
        log.write_all(&offset.to_le_bytes())?;
        log.write_all(&len.to_le_bytes())?;
        log.write_all(buf)
    }
}

impl<D: Device + ?Sized> Device for LogDevice<D> {
    fn report(&self) -> Vec<(&'static str, u64)> {
        self.inner.report()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.record_write(buf, offset, |inner| inner.write_at(buf, offset))
    }

    fn write_staged_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.record_write(buf, offset, |inner| inner.write_staged_at(buf, offset))
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs {
            self.write_at(buf, at)?;
            at += buf.len() as u64;
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut log = self.log.lock();
        self.inner.flush()?;
        log.write_all(b"F")?;
        log.flush()
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

/// One record of a device log.
#[derive(Debug, PartialEq, Eq)]
pub enum LogRecord {
    Write { offset: u64, data: Vec<u8> },
    Flush,
}

/// Reads device-log records; stops cleanly at a truncated tail (the run may have been
/// killed mid-record).
pub struct LogReader<R: Read> {
    input: R,
}

impl<R: Read> LogReader<R> {
    pub fn new(input: R) -> LogReader<R> {
        LogReader { input }
    }
}

/// Longest write a log record may claim (a bound before allocating).
const LOG_WRITE_BYTES_MAX: u32 = 64 << 20;

impl<R: Read> Iterator for LogReader<R> {
    type Item = io::Result<LogRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut kind = [0u8; 1];
        match self.input.read_exact(&mut kind) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return None,
            Err(e) => return Some(Err(e)),
        }
        match kind[0] {
            b'F' => Some(Ok(LogRecord::Flush)),
            b'W' => {
                let (mut offset, mut len) = ([0u8; 8], [0u8; 4]);
                if self.input.read_exact(&mut offset).is_err()
                    || self.input.read_exact(&mut len).is_err()
                {
                    return None;
                }
                let (offset, len) = (u64::from_le_bytes(offset), u32::from_le_bytes(len));
                if len > LOG_WRITE_BYTES_MAX {
                    return Some(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "log record too long",
                    )));
                }
                let mut data = vec![0u8; len as usize];
                if self.input.read_exact(&mut data).is_err() {
                    return None;
                }
                Some(Ok(LogRecord::Write { offset, data }))
            }
            other => Some(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unknown device-log record {other:#x}"),
            ))),
        }
    }
}
