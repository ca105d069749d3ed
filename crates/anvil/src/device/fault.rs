//! A device wrapper that injects faults: EIO on the n-th read, write or flush, and bit flips
//! on reads of chosen ranges.

use super::Device;
use parking_lot::Mutex;
use std::io;
use std::sync::Arc;

/// One injected fault.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The n-th read from now (0-based) and all later reads fail with EIO.
    ReadErrorAfter(u64),
    /// The n-th write from now and all later writes fail with EIO.
    WriteErrorAfter(u64),
    /// The n-th flush from now and all later flushes fail with EIO.
    FlushErrorAfter(u64),
    /// Every read covering `offset` returns the byte xor `mask`.
    FlipOnRead { offset: u64, mask: u8 },
}

pub struct FaultDevice<D: Device> {
    inner: Arc<D>,
    faults: Mutex<(Vec<Fault>, [u64; 3])>,
}

impl<D: Device> FaultDevice<D> {
    pub fn new(inner: Arc<D>) -> FaultDevice<D> {
        FaultDevice {
            inner,
            faults: Mutex::new((Vec::new(), [0; 3])),
        }
    }

    /// Arms a fault; counters restart from the moment it is armed.
    pub fn inject(&self, fault: Fault) {
        let mut faults = self.faults.lock();
        faults.1 = [0; 3];
        faults.0.push(fault);
    }

    pub fn clear(&self) {
        self.faults.lock().0.clear();
    }

    fn count(&self, which: usize) -> io::Result<()> {
        let mut guard = self.faults.lock();
        let seen = guard.1[which];
        guard.1[which] += 1;
        for fault in &guard.0 {
            let limit = match (which, fault) {
                (0, Fault::ReadErrorAfter(n)) | (1, Fault::WriteErrorAfter(n)) => n,
                (2, Fault::FlushErrorAfter(n)) => n,
                _ => continue,
            };
            if seen >= *limit {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        Ok(())
    }
}

impl<D: Device> Device for FaultDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.count(0)?;
        self.inner.read_at(buf, offset)?;
        for fault in &self.faults.lock().0 {
            if let Fault::FlipOnRead { offset: at, mask } = fault {
                let within = at.checked_sub(offset).and_then(|d| usize::try_from(d).ok());
                if let Some(byte) = within.and_then(|d| buf.get_mut(d)) {
                    *byte ^= mask;
                }
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.count(1)?;
        self.inner.write_at(buf, offset)
    }

    fn write_staged_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.count(1)?;
        self.inner.write_staged_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.count(2)?;
        self.inner.flush()
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}
