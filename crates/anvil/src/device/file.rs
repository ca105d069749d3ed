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
