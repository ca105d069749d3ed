//! An in-memory device for tests: every write is immediately "durable".

use super::{out_of_range, Device};
use parking_lot::RwLock;
use std::io;

#[derive(Default)]
pub struct MemDevice {
    bytes: RwLock<Vec<u8>>,
}

impl MemDevice {
    pub fn new(len: u64) -> MemDevice {
        MemDevice {
            bytes: RwLock::new(vec![0; len as usize]),
        }
    }

    pub fn from_bytes(bytes: Vec<u8>) -> MemDevice {
        MemDevice {
            bytes: RwLock::new(bytes),
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.bytes.read().clone()
    }
}

impl Device for MemDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let bytes = self.bytes.read();
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= bytes.len() as u64);
        let Some(end) = end else {
            return Err(out_of_range(offset, buf.len(), bytes.len() as u64));
        };
        buf.copy_from_slice(&bytes[offset as usize..end as usize]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut bytes = self.bytes.write();
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= bytes.len() as u64);
        let Some(end) = end else {
            return Err(out_of_range(offset, buf.len(), bytes.len() as u64));
        };
        bytes[offset as usize..end as usize].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes.read().len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.bytes.write().resize(len as usize, 0);
        Ok(())
    }
}
