//! The backing store: its files (each with a sector bitmap), the key that seals records, and
//! its counters (zram's `bd_stat`). The record format is in docs/design.md.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use chacha20poly1305::aead::AeadInPlace;
use chacha20poly1305::{ChaCha20Poly1305, Nonce, Tag};
use parking_lot::Mutex;

use super::super::backing_io::BackingIo;
#[cfg(any(test, feature = "testing"))]
use super::super::backing_io::FaultyFile;
use super::key::BackingKey;
use super::space::Space;
use super::{ALIGN, ALIGN_SECTORS, FILE_SHIFT, MAX_FILES, NONCE, SECTOR, TAG};
use crate::device::PageIndex;

/// A byte buffer whose start is aligned for direct I/O: an over-long `Vec` and the aligned
/// window inside it (no `unsafe`; the heap block never moves).
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeroed bytes starting on a 4 KiB boundary.
    pub fn new(len: usize) -> AlignedBuf {
        let raw = vec![0u8; len + ALIGN];
        let start = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
        AlignedBuf { raw, start, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

/// Why the backing store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackingError {
    /// The file could not be opened or sized.
    #[error("backing device {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Others may write the file: it could be tampered with or swapped for another.
    #[error("backing device {path}: mode {mode:o} lets others write it (chmod go-w)")]
    Unsafe {
        /// The file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// Not a file uzram may use as it is.
    #[error("backing device {path}: {why}")]
    NotUsable {
        /// The file.
        path: PathBuf,
        /// Why.
        why: &'static str,
    },
    /// Too small to hold the label and a batch.
    #[error("backing device {path}: {bytes} bytes is too small (at least {min})")]
    TooSmall {
        /// The file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The least.
        min: u64,
    },
    /// Holds data uzram did not write.
    #[error(
        "backing device {path} holds data uzram did not write (the first non-zero byte at offset {offset}: a filesystem, swap area or partition table?); \
         wipe it (wipefs -a, or zeros) or give --force to overwrite it"
    )]
    Foreign {
        /// The file.
        path: PathBuf,
        /// Where its data starts.
        offset: u64,
    },
    /// No file, or more than [`MAX_FILES`], or one named twice.
    #[error("backing devices: {0}")]
    Config(&'static str),
    /// A read or write of the store failed.
    #[error("backing device I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A record failed its authentication: tampered with or corrupt.
    #[error(
        "backing device record at sector {sector} failed authentication (tampered or corrupt)"
    )]
    Tampered {
        /// Where.
        sector: u64,
    },
    /// No room left in the store.
    #[error("backing device full")]
    Full,
}

/// Counters of the backing store (zram's `bd_stat`, and what uzram adds).
#[derive(Debug, Default)]
pub(super) struct BdCounters {
    /// Pages on the store now.
    pub(super) count: AtomicU64,
    pub(super) reads: AtomicU64,
    pub(super) writes: AtomicU64,
    pub(super) bytes_written: AtomicU64,
    pub(super) bytes_read: AtomicU64,
    pub(super) failed_writes: AtomicU64,
    pub(super) failed_reads: AtomicU64,
}

/// One file of the store.
pub(super) struct BackingFile {
    pub(super) io: Box<dyn BackingIo>,
    pub(super) path: PathBuf,
    /// Opened `O_DIRECT`.
    pub(super) direct: bool,
    /// Alignment of a record read's offset and length: the file's direct I/O alignment (a
    /// sector on most disks, so a record is read as the sectors it takes, not the 4 KiB
    /// blocks around it), a sector for buffered I/O.
    pub(super) read_align: usize,
    /// Its size in bytes (the sector map covers the whole sectors of it).
    pub(super) bytes: u64,
    pub(super) space: Mutex<Space>,
    pub(super) writes: AtomicU64,
}

/// What identifies one backing file across a restart: a regular file by its filesystem and
/// inode, a block device by its device number, and either by its size. A successor reopens
/// the files by their paths and refuses one that is not the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileIdentity {
    /// 1: a regular file; 2: a block device.
    pub(crate) kind: u64,
    /// `st_dev` of a file, `st_rdev` of a block device.
    pub(crate) dev: u64,
    /// `st_ino` of a file; 0 for a block device.
    pub(crate) ino: u64,
    /// Its size in bytes.
    pub(crate) bytes: u64,
}

impl FileIdentity {
    pub(crate) fn words(&self) -> [u64; 4] {
        [self.kind, self.dev, self.ino, self.bytes]
    }

    pub(crate) fn from_words(w: &[u64]) -> FileIdentity {
        FileIdentity {
            kind: w[0],
            dev: w[1],
            ino: w[2],
            bytes: w[3],
        }
    }

    fn of(meta: &std::fs::Metadata, bytes: u64) -> FileIdentity {
        if meta.file_type().is_block_device() {
            FileIdentity {
                kind: 2,
                dev: meta.rdev(),
                ino: 0,
                bytes,
            }
        } else {
            FileIdentity {
                kind: 1,
                dev: meta.dev(),
                ino: meta.ino(),
                bytes,
            }
        }
    }

    /// The identity of what `path` names now, checked as a successor's open will check it
    /// (its mode, and uzram's label at its start), read without opening it for writing:
    /// `None` when it does not exist.
    pub(crate) fn at(path: &Path) -> Result<Option<FileIdentity>, BackingError> {
        let Some(target) = super::label::resolve(path)? else {
            return Ok(None);
        };
        let open_err = |source| BackingError::Open {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(&target.path).map_err(open_err)?;
        super::label::check_mode(&meta, path)?;
        let f = File::open(&target.path).map_err(open_err)?;
        super::label::check_label(&f, path)?;
        let bytes = if target.block {
            use std::io::{Seek, SeekFrom};
            (&f).seek(SeekFrom::End(0)).map_err(open_err)?
        } else {
            meta.len()
        };
        Ok(Some(FileIdentity::of(&meta, bytes)))
    }
}

/// The backing files (or block devices), with the key and the space maps.
pub struct BackingStore {
    pub(super) files: Vec<BackingFile>,
    pub(super) cipher: ChaCha20Poly1305,
    /// The key's check value ([`BackingKey::check_value`]).
    pub(super) key_check: [u64; 2],
    /// The nonce's last four bytes: how many processes sealed records under this key before
    /// this one (a successor counts one more), so that a successor's counter, which starts
    /// again at 1, never repeats a predecessor's nonce.
    pub(super) epoch: u32,
    pub(super) nonce: AtomicU64,
    pub(super) counters: BdCounters,
    /// zram's `writeback_limit_enable` and `writeback_limit` (4 KiB units).
    pub(super) limit: Mutex<(bool, u64)>,
    /// Which file a tie of free space goes to next.
    pub(super) turn: AtomicUsize,
    /// Records kept after their page was freed, for a write of the same content to take over.
    pub(super) reuse: super::reuse::Reuse,
    /// Feature `testing`: while set, every write fails (the files are [`FaultyFile`]s).
    #[cfg(any(test, feature = "testing"))]
    pub(super) fail_writes: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for BackingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackingStore")
            .field(
                "paths",
                &self.files.iter().map(|f| &f.path).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Where one batch landed.
pub(super) struct Extent {
    pub(super) file: usize,
    pub(super) start: u64,
    /// Sectors the records use (the write is rounded up to 4 KiB).
    pub(super) sectors: u64,
}

/// One file's figures, for `policy_stat` and the listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileUsage {
    /// The file.
    pub path: PathBuf,
    /// Bytes its records use (sector-rounded).
    pub used_bytes: u64,
    /// Its size.
    pub size_bytes: u64,
    /// Batches written to it.
    pub writes: u64,
    /// Opened with `O_DIRECT`.
    pub direct: bool,
    /// Alignment of its record reads (bytes).
    pub read_align: usize,
}

impl BackingStore {
    /// Opens one backing file: see [`BackingStore::open_all`].
    pub fn open(
        path: &Path,
        default_bytes: u64,
        force: bool,
    ) -> Result<BackingStore, BackingError> {
        BackingStore::open_all(&[path.to_path_buf()], default_bytes, force)
    }

    /// Opens (creating them 0600 if need be) the files to stripe over. A regular file of size 0
    /// is sized to `default_bytes`; an existing file or block device keeps its size. Each must
    /// start with uzram's label or zeros, unless `force` (see [`super::label`]).
    pub fn open_all(
        paths: &[PathBuf],
        default_bytes: u64,
        force: bool,
    ) -> Result<BackingStore, BackingError> {
        BackingStore::open_keyed(paths, default_bytes, force, &BackingKey::generate(), None)
    }

    /// [`BackingStore::open_all`] with `key`. `adopting`: the files of a device a successor
    /// takes over, sealing under nonces of that epoch (see [`BackingStore::epoch`]); each must
    /// be uzram's already, and is opened without anything sized, allocated or written (see
    /// `BackingFile::open`). Otherwise a new device's, in epoch 0.
    pub(crate) fn open_keyed(
        paths: &[PathBuf],
        default_bytes: u64,
        force: bool,
        key: &BackingKey,
        adopting: Option<u32>,
    ) -> Result<BackingStore, BackingError> {
        let epoch = adopting.unwrap_or(0);
        if paths.is_empty() || paths.len() > MAX_FILES {
            return Err(BackingError::Config("between 1 and 16 files"));
        }
        #[cfg(any(test, feature = "testing"))]
        let fail_writes = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        #[cfg(any(test, feature = "testing"))]
        let wrap = |f: File| -> Box<dyn BackingIo> {
            Box::new(FaultyFile::new(f, std::sync::Arc::clone(&fail_writes)))
        };
        #[cfg(not(any(test, feature = "testing")))]
        let wrap = |f: File| -> Box<dyn BackingIo> { Box::new(f) };
        // Judged before any file is opened: the second opening of one file would find the
        // first one's lock, after the first had sized and labelled it.
        super::open::check_distinct(paths)?;
        let mut files = Vec::with_capacity(paths.len());
        let mut made = Vec::with_capacity(paths.len());
        let opened = paths.iter().try_for_each(|p| {
            let (file, undo) =
                BackingFile::open(p, default_bytes, force, adopting.is_some(), &wrap)?;
            files.push(file);
            made.push(undo);
            Ok(())
        });
        // A store that is not made leaves its files as they were: what opening the ones before
        // the failure created, sized or labelled is undone.
        let distinct = opened.and_then(|()| super::open::check_distinct_files(&files));
        if let Err(e) = distinct {
            // Last opened first: an undo puts back what the opening found.
            for (file, undo) in files.iter().zip(made).rev() {
                undo.undo(file.io.file());
            }
            return Err(e);
        }
        Ok(BackingStore {
            files,
            cipher: key.cipher(),
            key_check: key.check_value(),
            epoch,
            nonce: AtomicU64::new(1),
            counters: BdCounters::default(),
            limit: Mutex::new((false, 0)),
            turn: AtomicUsize::new(0),
            reuse: super::reuse::Reuse::new(),
            #[cfg(any(test, feature = "testing"))]
            fail_writes,
        })
    }

    /// The first file's path (zram's `backing_dev` shows one).
    pub fn path(&self) -> &Path {
        &self.files[0].path
    }

    /// Every file's figures.
    pub fn files(&self) -> Vec<FileUsage> {
        self.files
            .iter()
            .map(|f| {
                let s = f.space.lock();
                FileUsage {
                    path: f.path.clone(),
                    // Records only: the label is not the pages'.
                    used_bytes: (s.sectors - s.free)
                        .saturating_sub(super::label::LABEL_LEN / SECTOR)
                        * SECTOR,
                    size_bytes: s.sectors * SECTOR,
                    writes: f.writes.load(Ordering::Relaxed),
                    direct: f.direct,
                    read_align: f.read_align,
                }
            })
            .collect()
    }

    /// Free bytes over all files.
    pub fn free_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|f| f.space.lock().free * SECTOR)
            .sum()
    }

    pub(super) fn sectors_for(len: usize) -> u64 {
        ((NONCE + len + TAG) as u64).div_ceil(SECTOR)
    }

    pub(super) fn location(file: usize, sector: u64) -> u64 {
        (file as u64) << FILE_SHIFT | sector
    }

    pub(super) fn split(location: u64) -> (usize, u64) {
        (
            (location >> FILE_SHIFT) as usize,
            location & ((1 << FILE_SHIFT) - 1),
        )
    }

    pub(super) fn aad(index: PageIndex, location: u64) -> [u8; 16] {
        let mut aad = [0u8; 16];
        aad[..8].copy_from_slice(&index.0.to_le_bytes());
        aad[8..].copy_from_slice(&location.to_le_bytes());
        aad
    }

    /// Seals the `len` bytes at `out[NONCE..]` (page `index`'s stored bytes) in place, as the
    /// record at `location` that `out` starts.
    pub(super) fn seal(&self, index: PageIndex, location: u64, len: usize, out: &mut [u8]) {
        let n = self.nonce.fetch_add(1, Ordering::Relaxed);
        let mut nonce = [0u8; NONCE];
        nonce[..8].copy_from_slice(&n.to_le_bytes());
        nonce[8..].copy_from_slice(&self.epoch.to_le_bytes());
        out[..NONCE].copy_from_slice(&nonce);
        let body = &mut out[NONCE..NONCE + len];
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &Self::aad(index, location), body)
            .expect("a page is far below the AEAD's length limit");
        out[NONCE + len..NONCE + len + TAG].copy_from_slice(&tag);
    }

    /// Reserves an extent for `sectors` of records on the file with the most free space, its
    /// start 4 KiB-aligned and its length rounded up to 4 KiB (the rounding is given back by
    /// [`BackingStore::release_padding`] once written).
    pub(super) fn reserve(&self, sectors: u64) -> Option<Extent> {
        let rounded = sectors.next_multiple_of(ALIGN_SECTORS);
        let n = self.files.len();
        let first = self.turn.fetch_add(1, Ordering::Relaxed) % n;
        // A fixed array, not a Vec, and an unstable sort (a stable one may allocate): eviction
        // on an I/O thread allocates nothing. Entries are (free sectors, place in the turn).
        let mut order = [(0u64, 0usize); MAX_FILES];
        for (k, slot) in order.iter_mut().enumerate().take(n) {
            *slot = (self.files[(first + k) % n].space.lock().free, k);
        }
        let order = &mut order[..n];
        // Most free first; among equals, the turn's order.
        order.sort_unstable_by_key(|&(free, k)| (std::cmp::Reverse(free), k));
        for file in order.iter().map(|&(_, k)| (first + k) % n) {
            if let Some(start) = self.files[file].space.lock().alloc(rounded, ALIGN_SECTORS) {
                return Some(Extent {
                    file,
                    start,
                    sectors,
                });
            }
        }
        None
    }

    /// The files' identities, in stripe order (a successor checks its files against them).
    pub(crate) fn identities(&self) -> Result<Vec<FileIdentity>, BackingError> {
        self.files
            .iter()
            .map(|f| {
                let meta = f.io.file().metadata()?;
                Ok(FileIdentity::of(&meta, f.bytes))
            })
            .collect()
    }

    /// Takes the record of `len` stored bytes at `location` as a predecessor's (a successor
    /// rebuilds the space maps from the slots that name records): its sectors are marked used
    /// and counted. Refuses, naming it, a record outside its file or over another's sectors.
    pub(crate) fn adopt_record(&self, location: u64, len: usize) -> Result<(), String> {
        let (file, sector) = Self::split(location);
        let f = self.files.get(file).ok_or_else(|| {
            format!(
                "a record names backing file {file}; the store has {}",
                self.files.len()
            )
        })?;
        let n = Self::sectors_for(len);
        let mut space = f.space.lock();
        let label = super::label::LABEL_LEN / SECTOR;
        if sector < label
            || sector
                .checked_add(n)
                .map_or(true, |end| end > space.sectors)
        {
            return Err(format!(
                "a record at sector {sector} of {} ({n} sectors) lies outside its {} sectors of records",
                f.path.display(),
                space.sectors
            ));
        }
        if (sector..sector + n).any(|s| space.is_used(s)) {
            return Err(format!(
                "two records overlap at sector {sector} of {}",
                f.path.display()
            ));
        }
        space.set(sector, n, true);
        self.counters.count.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The nonce epoch this store seals under.
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The key's check value.
    pub(crate) fn key_check(&self) -> [u64; 2] {
        self.key_check
    }

    /// Frees `n` sectors from `sector` of `file`: a record reserved but not committed.
    pub(super) fn release(&self, file: usize, sector: u64, n: u64) {
        self.files[file].space.lock().set(sector, n, false);
    }

    /// Frees the rounding at the end of a written extent.
    pub(super) fn release_padding(&self, e: &Extent) {
        let rounded = e.sectors.next_multiple_of(ALIGN_SECTORS);
        if rounded > e.sectors {
            self.files[e.file]
                .space
                .lock()
                .set(e.start + e.sectors, rounded - e.sectors, false);
        }
    }

    /// Writes `data` (4 KiB-rounded) at the extent; on failure gives the extent back.
    pub(super) fn write_extent(&self, e: &Extent, data: &[u8]) -> Result<(), std::io::Error> {
        let f = &self.files[e.file];
        match f.io.write_all_at(data, e.start * SECTOR) {
            Ok(()) => {
                f.writes.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bytes_written
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                self.release_padding(e);
                Ok(())
            }
            Err(err) => {
                self.counters.failed_writes.fetch_add(1, Ordering::Relaxed);
                let rounded = e.sectors.next_multiple_of(ALIGN_SECTORS);
                f.space.lock().set(e.start, rounded, false);
                Err(err)
            }
        }
    }

    /// Reads and opens page `index`'s record of `len` stored bytes at `location` into
    /// `buf[..len]`. `buf` starts 4 KiB-aligned and holds at least [`READ_WINDOW`] bytes.
    pub(super) fn read(
        &self,
        index: PageIndex,
        location: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<(), BackingError> {
        let (file, sector) = Self::split(location);
        let f = self
            .files
            .get(file)
            .ok_or(BackingError::Tampered { sector })?;
        let total = NONCE + len + TAG;
        let byte = sector * SECTOR;
        let align = f.read_align;
        let window_start = byte / align as u64 * align as u64;
        let skip = (byte - window_start) as usize;
        let window = (skip + total).next_multiple_of(align);
        if window > buf.len() {
            return Err(BackingError::Tampered { sector });
        }
        f.io.read_exact_at(&mut buf[..window], window_start)
            .inspect_err(|_| {
                self.counters.failed_reads.fetch_add(1, Ordering::Relaxed);
            })?;
        self.counters
            .bytes_read
            .fetch_add(window as u64, Ordering::Relaxed);
        let record = &mut buf[skip..skip + total];
        let nonce = *Nonce::from_slice(&record[..NONCE]);
        let tag = *Tag::from_slice(&record[NONCE + len..total]);
        let body = &mut record[NONCE..NONCE + len];
        self.cipher
            .decrypt_in_place_detached(&nonce, &Self::aad(index, location), body, &tag)
            .map_err(|_| {
                self.counters.failed_reads.fetch_add(1, Ordering::Relaxed);
                BackingError::Tampered { sector }
            })?;
        buf.copy_within(skip + NONCE..skip + NONCE + len, 0);
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Frees the record of `len` stored bytes at `location` for reuse (no hole is punched:
    /// see the module docs).
    pub(super) fn free(&self, location: u64, len: usize) {
        let (file, sector) = Self::split(location);
        let Some(f) = self.files.get(file) else {
            return;
        };
        f.space.lock().set(sector, Self::sectors_for(len), false);
        self.counters.count.fetch_sub(1, Ordering::Relaxed);
    }

    /// Whether every file is a block device: then an I/O thread may write to the store itself
    /// (a block device has no journal or inode lock to wait behind).
    pub fn all_block_devices(&self) -> bool {
        use std::os::unix::fs::FileTypeExt;
        self.files.iter().all(|f| {
            f.io.file()
                .metadata()
                .is_ok_and(|m| m.file_type().is_block_device())
        })
    }

    /// zram's `bd_stat`: pages on the store, pages read, pages written.
    pub fn bd_stat(&self) -> String {
        let c = &self.counters;
        format!(
            "{:>8} {:>8} {:>8}\n",
            c.count.load(Ordering::Relaxed),
            c.reads.load(Ordering::Relaxed),
            c.writes.load(Ordering::Relaxed)
        )
    }

    /// Pages on the store now.
    pub fn pages(&self) -> u64 {
        self.counters.count.load(Ordering::Relaxed)
    }

    /// Bytes written to the store so far (4 KiB-rounded extents).
    pub fn bytes_written(&self) -> u64 {
        self.counters.bytes_written.load(Ordering::Relaxed)
    }

    /// Bytes read from the store so far (each record read with the file's alignment).
    pub fn bytes_read(&self) -> u64 {
        self.counters.bytes_read.load(Ordering::Relaxed)
    }

    /// Batches whose write failed (their pages stayed in RAM), and reads that failed (I/O error
    /// or a record that failed authentication).
    pub fn failures(&self) -> (u64, u64) {
        (
            self.counters.failed_writes.load(Ordering::Relaxed),
            self.counters.failed_reads.load(Ordering::Relaxed),
        )
    }

    /// zram's `writeback_limit_enable` and `writeback_limit` (4 KiB units).
    pub fn limit(&self) -> (bool, u64) {
        *self.limit.lock()
    }

    /// Sets zram's `writeback_limit_enable`.
    pub fn set_limit_enable(&self, on: bool) {
        self.limit.lock().0 = on;
    }

    /// Sets zram's `writeback_limit` (4 KiB units).
    pub fn set_limit(&self, pages: u64) {
        self.limit.lock().1 = pages;
    }

    /// How many of `want` pages zram's writeback limit lets through now.
    pub(in crate::device) fn limit_allows(&self, want: usize) -> usize {
        let (on, left) = self.limit();
        if on {
            usize::try_from(left).unwrap_or(usize::MAX).min(want)
        } else {
            want
        }
    }

    pub(super) fn charge_limit(&self, pages: u64) {
        let mut limit = self.limit.lock();
        if limit.0 {
            limit.1 = limit.1.saturating_sub(pages);
        }
    }

    /// Feature `testing`: make every write fail (the pages must stay in RAM).
    #[cfg(any(test, feature = "testing"))]
    pub fn set_fail_writes(&self, on: bool) {
        self.fail_writes.store(on, Ordering::Relaxed);
    }
}
