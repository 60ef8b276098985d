//! The backing store's seam: the positioned I/O a backing file gets, behind a trait, so tests
//! can put a file that fails on demand where the real one is (as redb's `StorageBackend` or
//! cloud-hypervisor's `DiskFile`). The real backend is a [`File`].

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// What the backing store does with one of its files.
pub trait BackingIo: Send + Sync + std::fmt::Debug {
    /// The open file (its metadata, its kind).
    fn file(&self) -> &File;

    /// Writes all of `data` at byte `offset`.
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self.file(), data, offset)
    }

    /// Fills `buf` from byte `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self.file(), buf, offset)
    }
}

impl BackingIo for File {
    fn file(&self) -> &File {
        self
    }
}

/// A backing file whose writes fail with EIO while its switch is on (feature `testing`): the
/// fault drill that proves a failed writeback keeps the pages in RAM.
#[cfg(any(test, feature = "testing"))]
#[derive(Debug)]
pub struct FaultyFile {
    file: File,
    fail_writes: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[cfg(any(test, feature = "testing"))]
impl FaultyFile {
    /// `file`, failing its writes whenever `fail_writes` is set.
    pub fn new(file: File, fail_writes: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Self {
        FaultyFile { file, fail_writes }
    }
}

#[cfg(any(test, feature = "testing"))]
impl BackingIo for FaultyFile {
    fn file(&self) -> &File {
        &self.file
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if self.fail_writes.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        FileExt::write_all_at(&self.file, data, offset)
    }
}
