//! A regular image file or a block device.

use super::Device;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;

pub struct FileDevice {
    file: File,
    is_block_device: bool,
}

impl FileDevice {
    /// Opens an existing image or block device.
    pub fn open(path: &Path, writable: bool) -> io::Result<FileDevice> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        let is_block_device = file.metadata()?.file_type().is_block_device();
        Ok(FileDevice {
            file,
            is_block_device,
        })
    }

    /// Creates (or opens) an image file for mkfs.
    pub fn create(path: &Path) -> io::Result<FileDevice> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let is_block_device = file.metadata()?.file_type().is_block_device();
        Ok(FileDevice {
            file,
            is_block_device,
        })
    }

    pub fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    /// The underlying file, for advisory locking.
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Device for FileDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        use std::os::unix::io::AsRawFd;
        const IOV_MAX: usize = 1024;
        let mut offset = offset;
        let mut slices: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
        let mut first = 0;
        while first < slices.len() {
            let batch = &slices[first..slices.len().min(first + IOV_MAX)];
            let iov: Vec<libc::iovec> = batch
                .iter()
                .map(|b| libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                })
                .collect();
            // SAFETY: every iovec points into a live borrowed slice of the stated length, and
            // pwritev only reads from them.
            let written = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as i32,
                    offset as i64,
                )
            };
            if written < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if written == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "pwritev wrote nothing",
                ));
            }
            // Skip what was written; a partial slice is shortened in place.
            let mut left = written as usize;
            offset += left as u64;
            while left > 0 {
                let len = slices[first].len();
                if left >= len {
                    left -= len;
                    first += 1;
                } else {
                    slices[first] = &slices[first][left..];
                    left = 0;
                }
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        if self.is_block_device {
            use std::io::{Seek, SeekFrom};
            let mut file = &self.file;
            file.seek(SeekFrom::End(0))
        } else {
            Ok(self.file.metadata()?.len())
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if self.is_block_device {
            if self.len()? >= len {
                return Ok(());
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "block device is too small",
            ));
        }
        self.file.set_len(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_writes_land_back_to_back() {
        let dir = tempfile::tempdir().unwrap();
        let device = FileDevice::create(&dir.path().join("image")).unwrap();
        device.set_len(1 << 20).unwrap();
        // More slices than one pwritev takes, of uneven sizes, some empty.
        let pieces: Vec<Vec<u8>> = (0..3000).map(|i| vec![(i % 251) as u8; i % 7]).collect();
        let slices: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        device.write_vectored_at(&slices, 4096).unwrap();
        let expected: Vec<u8> = pieces.concat();
        let mut back = vec![0u8; expected.len()];
        device.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, expected);
    }
}
