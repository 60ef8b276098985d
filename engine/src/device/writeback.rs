//! Writeback: cold pages leave RAM for a backing file (or block device), compressed, packed and
//! encrypted.
//!
//! # On disk
//! The backing store is one file (or block device), or several striped: an array of 512-byte
//! sectors each. A written-back page is one record of `12 + n + 16` bytes (nonce, the page's
//! stored bytes encrypted, the Poly1305 tag), starting on a sector boundary; records of one batch
//! lie back to back in one extent that starts on a 4 KiB boundary, written with one `pwrite`. The
//! stored bytes are what the pool held: the compressed object (its codec priority stays in the
//! slot) or the raw page of a huge one, so a page costs its compressed size on disk, not 4 KiB.
//! A slot names its record by a location word: the file's number in the top byte, the sector
//! below.
//!
//! Files are opened `O_DIRECT` where the filesystem allows it: written-back pages must leave RAM,
//! not move into the page cache (and a write under memory pressure must not need page cache
//! memory). Batches are written and records read in 4 KiB-aligned windows from aligned buffers,
//! which satisfies any device's logical block size.
//!
//! # Striping
//! With several files, each batch goes to the file with the most free space (ties in turn), so
//! two files on two disks share the writes and the reads.
//!
//! # Secrets
//! Swap holds secrets. Every record is sealed with ChaCha20-Poly1305 under a key drawn from the
//! OS at device creation and kept only in the daemon's (locked) memory; the nonce is a counter
//! (never reused under one key), and the additional data binds a record to its page index and
//! location, so a record copied elsewhere fails to open. A stolen backing file reveals
//! nothing; a flipped byte makes that page's read fail with EIO. A file is created 0600 and
//! refused if others may write it.
//!
//! # Space
//! A bitmap of sectors per file, first fit from a rotating cursor. Freeing a record (the page
//! overwritten, discarded, or the device reset) clears its sectors for reuse.
//!
//! A regular file is allocated in full when opened (`fallocate`), as a swap file must be, and
//! no hole is ever punched in it: a write into a hole allocates blocks, and both that and hole
//! punching take the inode's lock exclusively and start journal transactions, which under memory
//! pressure can wait for a task that waits for swap, that is, for this device. With every block
//! allocated, a direct write is an overwrite under the inode's shared lock, and a direct read
//! never waits for it. (The I/O threads still never write to a regular file: see
//! `Device::make_room`.)

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use chacha20poly1305::aead::{AeadInPlace, KeyInit, OsRng};
use chacha20poly1305::{ChaCha20Poly1305, Nonce, Tag};
use parking_lot::Mutex;

pub use super::backing_io::BackingIo;
#[cfg(any(test, feature = "testing"))]
use super::backing_io::FaultyFile;
use super::{Device, IoContext, PageIndex, SlotFlags, SlotState, PAGE_SIZE};
use crate::{Error, IoError};

/// Bytes of one sector of the backing store.
pub const SECTOR: u64 = 512;
const NONCE: usize = 12;
const TAG: usize = 16;
/// Largest record: a raw page, sealed.
pub const MAX_RECORD: usize = NONCE + PAGE_SIZE + TAG;
/// Pages per writeback batch of a pass (one extent, one write).
pub(super) const BATCH: usize = 256;
/// Alignment of direct I/O: offsets, lengths and buffers.
const ALIGN: usize = 4096;
const ALIGN_SECTORS: u64 = ALIGN as u64 / SECTOR;
/// Bytes a record read may span: a record of at most 9 sectors starting anywhere in a 4 KiB
/// block covers two blocks.
pub(super) const READ_WINDOW: usize = 2 * ALIGN;
/// Most files a store stripes over (the location word keeps the file in its top byte).
pub const MAX_FILES: usize = 16;
const FILE_SHIFT: u32 = 56;

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

/// The sector bitmap of one file.
struct Space {
    used: Vec<u64>,
    sectors: u64,
    cursor: u64,
    free: u64,
}

impl Space {
    fn new(sectors: u64) -> Space {
        Space {
            used: vec![0; sectors.div_ceil(64) as usize],
            sectors,
            cursor: 0,
            free: sectors,
        }
    }

    fn is_used(&self, s: u64) -> bool {
        self.used[(s / 64) as usize] & (1 << (s % 64)) != 0
    }

    fn set(&mut self, start: u64, n: u64, used: bool) {
        for s in start..start + n {
            let (w, b) = ((s / 64) as usize, s % 64);
            if used {
                self.used[w] |= 1 << b;
            } else {
                self.used[w] &= !(1 << b);
            }
        }
        if used {
            self.free -= n;
        } else {
            self.free += n;
        }
    }

    /// First fit of `n` contiguous sectors starting on a multiple of `align`, from the cursor
    /// round to it.
    fn alloc(&mut self, n: u64, align: u64) -> Option<u64> {
        if n == 0 || n > self.free {
            return None;
        }
        let mut start = self.cursor.next_multiple_of(align);
        let mut scanned = 0;
        while scanned < self.sectors + n + align {
            if start + n > self.sectors {
                scanned += self.sectors.saturating_sub(start);
                start = 0;
                continue;
            }
            // The last used sector in the window: the next start is past it.
            match (start..start + n).rev().find(|&s| self.is_used(s)) {
                None => {
                    self.set(start, n, true);
                    self.cursor = start + n;
                    return Some(start);
                }
                Some(busy) => {
                    let next = (busy + 1).next_multiple_of(align);
                    scanned += next - start;
                    start = next;
                }
            }
        }
        None
    }
}

/// Counters of the backing store (zram's `bd_stat`, and what uzram adds).
#[derive(Debug, Default)]
struct BdCounters {
    /// Pages on the store now.
    count: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_written: AtomicU64,
    failed_writes: AtomicU64,
    failed_reads: AtomicU64,
}

/// One file of the store.
struct BackingFile {
    io: Box<dyn BackingIo>,
    path: PathBuf,
    /// Opened `O_DIRECT`.
    direct: bool,
    space: Mutex<Space>,
    writes: AtomicU64,
}

impl BackingFile {
    /// Opens (creating it 0600 if need be) `path`. A regular file of size 0 is sized to
    /// `default_bytes` (sparse); an existing file or block device keeps its size.
    fn open(
        path: &Path,
        default_bytes: u64,
        wrap: &dyn Fn(File) -> Box<dyn BackingIo>,
    ) -> Result<BackingFile, BackingError> {
        let open_err = |source| BackingError::Open {
            path: path.to_path_buf(),
            source,
        };
        let open = |direct: bool| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(
                    libc::O_CLOEXEC | libc::O_NOFOLLOW | if direct { libc::O_DIRECT } else { 0 },
                )
                .open(path)
        };
        // A filesystem without direct I/O (tmpfs before Linux 6.6) refuses O_DIRECT with EINVAL.
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (open(false).map_err(open_err)?, false)
            }
            Err(e) => return Err(open_err(e)),
        };
        let meta = file.metadata().map_err(open_err)?;
        // A block device belongs to group disk, which may write it (0660); a file must be ours.
        let forbidden = if meta.file_type().is_file() {
            0o022
        } else {
            0o002
        };
        if meta.mode() & forbidden != 0 {
            return Err(BackingError::Unsafe {
                path: path.to_path_buf(),
                mode: meta.mode() & 0o7777,
            });
        }
        let mut bytes = if meta.file_type().is_file() {
            meta.len()
        } else {
            use std::io::{Seek, SeekFrom};
            (&file).seek(SeekFrom::End(0)).map_err(open_err)?
        };
        if bytes == 0 && meta.file_type().is_file() {
            bytes = default_bytes.next_multiple_of(ALIGN as u64);
            file.set_len(bytes).map_err(open_err)?;
        }
        // Reads must not dirty the inode (an atime update is a journal transaction). Needs the
        // file's owner or CAP_FOWNER; without it, atime updates stay.
        crate::sys::set_noatime(&file);
        if meta.file_type().is_file() {
            // Allocate every block now (see the module docs). A filesystem without fallocate
            // keeps a sparse file; one without room for it is an error now, not at swap-out.
            if let Err(e) = crate::sys::allocate(&file, bytes) {
                if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
                    return Err(open_err(e));
                }
            }
        }
        Ok(BackingFile {
            io: wrap(file),
            path: path.to_path_buf(),
            direct,
            space: Mutex::new(Space::new(bytes / SECTOR)),
            writes: AtomicU64::new(0),
        })
    }
}

/// The backing files (or block devices), with the key and the space maps.
pub struct BackingStore {
    files: Vec<BackingFile>,
    cipher: ChaCha20Poly1305,
    nonce: AtomicU64,
    counters: BdCounters,
    /// zram's `writeback_limit_enable` and `writeback_limit` (4 KiB units).
    limit: Mutex<(bool, u64)>,
    /// Which file a tie of free space goes to next.
    turn: AtomicUsize,
    /// Feature `testing`: while set, every write fails (the files are [`FaultyFile`]s).
    #[cfg(any(test, feature = "testing"))]
    fail_writes: std::sync::Arc<std::sync::atomic::AtomicBool>,
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
struct Extent {
    file: usize,
    start: u64,
    /// Sectors the records use (the write is rounded up to 4 KiB).
    sectors: u64,
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
}

impl BackingStore {
    /// Opens one backing file: see [`BackingStore::open_all`].
    pub fn open(path: &Path, default_bytes: u64) -> Result<BackingStore, BackingError> {
        BackingStore::open_all(&[path.to_path_buf()], default_bytes)
    }

    /// Opens (creating them 0600 if need be) the files to stripe over. A regular file of size 0
    /// is sized to `default_bytes` (sparse); an existing file or block device keeps its size.
    pub fn open_all(paths: &[PathBuf], default_bytes: u64) -> Result<BackingStore, BackingError> {
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
        let files = paths
            .iter()
            .map(|p| BackingFile::open(p, default_bytes, &wrap))
            .collect::<Result<Vec<_>, _>>()?;
        for (i, a) in files.iter().enumerate() {
            let ma = a.io.file().metadata()?;
            if files[..i].iter().any(|b| {
                b.io.file().metadata().is_ok_and(|mb| {
                    (mb.dev(), mb.ino(), mb.rdev()) == (ma.dev(), ma.ino(), ma.rdev())
                })
            }) {
                return Err(BackingError::Config("the same file named twice"));
            }
        }
        let key = ChaCha20Poly1305::generate_key(&mut OsRng);
        Ok(BackingStore {
            files,
            cipher: ChaCha20Poly1305::new(&key),
            nonce: AtomicU64::new(1),
            counters: BdCounters::default(),
            limit: Mutex::new((false, 0)),
            turn: AtomicUsize::new(0),
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
                    used_bytes: (s.sectors - s.free) * SECTOR,
                    size_bytes: s.sectors * SECTOR,
                    writes: f.writes.load(Ordering::Relaxed),
                    direct: f.direct,
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

    fn sectors_for(len: usize) -> u64 {
        ((NONCE + len + TAG) as u64).div_ceil(SECTOR)
    }

    fn location(file: usize, sector: u64) -> u64 {
        (file as u64) << FILE_SHIFT | sector
    }

    fn split(location: u64) -> (usize, u64) {
        (
            (location >> FILE_SHIFT) as usize,
            location & ((1 << FILE_SHIFT) - 1),
        )
    }

    fn aad(index: PageIndex, location: u64) -> [u8; 16] {
        let mut aad = [0u8; 16];
        aad[..8].copy_from_slice(&index.0.to_le_bytes());
        aad[8..].copy_from_slice(&location.to_le_bytes());
        aad
    }

    /// Seals `data` (page `index`'s stored bytes) into `out` as the record at `location`.
    fn seal(&self, index: PageIndex, location: u64, data: &[u8], out: &mut [u8]) {
        let n = self.nonce.fetch_add(1, Ordering::Relaxed);
        let mut nonce = [0u8; NONCE];
        nonce[..8].copy_from_slice(&n.to_le_bytes());
        out[..NONCE].copy_from_slice(&nonce);
        let body = &mut out[NONCE..NONCE + data.len()];
        body.copy_from_slice(data);
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &Self::aad(index, location), body)
            .expect("a page is far below the AEAD's length limit");
        out[NONCE + data.len()..NONCE + data.len() + TAG].copy_from_slice(&tag);
    }

    /// Reserves an extent for `sectors` of records on the file with the most free space, its
    /// start 4 KiB-aligned and its length rounded up to 4 KiB (the rounding is given back by
    /// [`BackingStore::release_padding`] once written).
    fn reserve(&self, sectors: u64) -> Option<Extent> {
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

    /// Frees the rounding at the end of a written extent.
    fn release_padding(&self, e: &Extent) {
        let rounded = e.sectors.next_multiple_of(ALIGN_SECTORS);
        if rounded > e.sectors {
            self.files[e.file]
                .space
                .lock()
                .set(e.start + e.sectors, rounded - e.sectors, false);
        }
    }

    /// Writes `data` (4 KiB-rounded) at the extent; on failure gives the extent back.
    fn write_extent(&self, e: &Extent, data: &[u8]) -> Result<(), std::io::Error> {
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
    fn read(
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
        let window_start = byte / ALIGN as u64 * ALIGN as u64;
        let skip = (byte - window_start) as usize;
        let window = (skip + total).next_multiple_of(ALIGN);
        if window > buf.len() {
            return Err(BackingError::Tampered { sector });
        }
        f.io.read_exact_at(&mut buf[..window], window_start)
            .inspect_err(|_| {
                self.counters.failed_reads.fetch_add(1, Ordering::Relaxed);
            })?;
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
    fn free(&self, location: u64, len: usize) {
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
    pub(super) fn limit_allows(&self, want: usize) -> usize {
        let (on, left) = self.limit();
        if on {
            usize::try_from(left).unwrap_or(usize::MAX).min(want)
        } else {
            want
        }
    }

    fn charge_limit(&self, pages: u64) {
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

/// The buffers of one writeback batch, made once and reused: eviction inside a write must not
/// allocate.
pub(super) struct WbBuffers {
    plain: Box<[u8; PAGE_SIZE]>,
    out: AlignedBuf,
    /// Page, its state when picked, its record's sector offset in the batch, and whether its
    /// record was sealed (only sealed records are committed).
    taken: Vec<(PageIndex, SlotState, u64, bool)>,
    /// Candidates, for callers that pick pages without allocating (eviction).
    pub(super) pages: Vec<PageIndex>,
    capacity: usize,
}

impl WbBuffers {
    pub(super) fn new(capacity: usize) -> WbBuffers {
        WbBuffers {
            plain: Box::new([0; PAGE_SIZE]),
            out: AlignedBuf::new(
                (capacity * MAX_RECORD.next_multiple_of(SECTOR as usize)).next_multiple_of(ALIGN),
            ),
            taken: Vec::with_capacity(capacity),
            pages: Vec::with_capacity(capacity),
            capacity,
        }
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }
}

/// What one batch did.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BatchStats {
    /// Pages now on the store.
    pub written: u64,
    /// Their stored bytes (what left the pool).
    pub object_bytes: u64,
    /// Bytes written to the file.
    pub bytes: u64,
    /// Pages left in RAM because the write failed.
    pub failed: u64,
    /// No room on the store.
    pub full: bool,
}

/// Which pages a writeback pass takes (zram's `writeback` syntax).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WritebackRequest {
    /// `idle`: pages marked idle.
    Idle,
    /// `huge`: pages stored raw.
    Huge,
    /// `huge_idle`: both.
    HugeIdle,
    /// `incompressible`: pages recompression found no codec for.
    Incompressible,
    /// `page_index=N` / `page_indexes=LO-HI`: these pages, whatever their state.
    Pages {
        /// First page.
        first: u64,
        /// Last page (inclusive).
        last: u64,
    },
}

impl FromStr for WritebackRequest {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let bad = |why| Error::InvalidRequest {
            text: text.to_string(),
            why,
        };
        let t = text.trim();
        let t = t.strip_prefix("type=").unwrap_or(t);
        Ok(match t {
            "idle" => WritebackRequest::Idle,
            "huge" => WritebackRequest::Huge,
            "huge_idle" => WritebackRequest::HugeIdle,
            "incompressible" => WritebackRequest::Incompressible,
            _ => {
                if let Some(n) = t.strip_prefix("page_index=") {
                    let n = n.parse().map_err(|_| bad("page_index is a number"))?;
                    WritebackRequest::Pages { first: n, last: n }
                } else if let Some(r) = t.strip_prefix("page_indexes=") {
                    let (lo, hi) = r.split_once('-').ok_or(bad("page_indexes is LO-HI"))?;
                    let first = lo.parse().map_err(|_| bad("page_indexes is LO-HI"))?;
                    let last: u64 = hi.parse().map_err(|_| bad("page_indexes is LO-HI"))?;
                    if last < first {
                        return Err(bad("page_indexes is LO-HI with LO <= HI"));
                    }
                    WritebackRequest::Pages { first, last }
                } else {
                    return Err(bad(
                        "writeback takes idle, huge, huge_idle, incompressible, page_index=N or page_indexes=LO-HI",
                    ));
                }
            }
        })
    }
}

/// What a writeback pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WritebackStats {
    /// Pages that matched.
    pub candidates: u64,
    /// Pages now on the backing store.
    pub written: u64,
    /// Bytes written (sealed records, sector-rounded).
    pub bytes: u64,
    /// Pages left in RAM because a write failed.
    pub failed: u64,
    /// The pass stopped at the writeback limit or a full store.
    pub stopped: bool,
}

impl Device {
    /// The backing store, if the device has one.
    pub fn backing(&self) -> Option<&BackingStore> {
        self.backing.as_ref()
    }

    /// Reads page `s` (written back) into `out` through `buf`.
    pub(super) fn load_written_back(
        &self,
        streams: &mut [Option<uzram_codecs::Stream>],
        buf: &mut [u8],
        index: PageIndex,
        s: &SlotState,
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), IoError> {
        let backing = self.backing.as_ref().ok_or(IoError::Backing {
            index,
            source: BackingError::Full,
        })?;
        let len = usize::from(s.size);
        backing
            .read(index, s.word, len, buf)
            .map_err(|source| IoError::Backing { index, source })?;
        if s.flags.contains(SlotFlags::HUGE) {
            out.copy_from_slice(&buf[..PAGE_SIZE]);
            return Ok(());
        }
        super::decompress_with(streams, index, s.prio, &buf[..len], out)
    }

    /// Frees the backing space of a written-back slot state.
    pub(super) fn free_written_back(&self, s: &SlotState) {
        if let Some(b) = &self.backing {
            b.free(s.word, usize::from(s.size));
        }
    }

    fn wb_eligible(s: &SlotState, req: WritebackRequest, index: u64) -> bool {
        match req {
            WritebackRequest::Pages { first, last } => {
                (first..=last).contains(&index) && s.flags.contains(SlotFlags::STORED)
            }
            _ => Self::wb_eligible_flags(s, req),
        }
    }

    /// The flag part of [`Device::wb_eligible`] (a page range is checked by the caller).
    fn wb_eligible_flags(s: &SlotState, req: WritebackRequest) -> bool {
        let f = s.flags;
        if !f.contains(SlotFlags::STORED) {
            return false;
        }
        match req {
            WritebackRequest::Idle => f.contains(SlotFlags::IDLE),
            WritebackRequest::Huge => f.contains(SlotFlags::HUGE),
            WritebackRequest::HugeIdle => f.contains(SlotFlags::HUGE | SlotFlags::IDLE),
            WritebackRequest::Incompressible => f.contains(SlotFlags::INCOMPRESSIBLE),
            WritebackRequest::Pages { .. } => true,
        }
    }

    /// Writes back, as one batch, those of `pages` (at most the buffers' capacity) whose state
    /// `keep` accepts under their lock, and swaps their slots over to the records. With `wait`
    /// false a page whose lock is busy is skipped (eviction inside a write, which may hold a slot
    /// lock itself). Allocates nothing.
    pub(super) fn write_batch(
        &self,
        backing: &BackingStore,
        bufs: &mut WbBuffers,
        pages: &[PageIndex],
        keep: &dyn Fn(&SlotState) -> bool,
        wait: bool,
    ) -> BatchStats {
        let mut stats = BatchStats::default();
        bufs.taken.clear();
        let mut sectors = 0u64;
        for &index in pages {
            if bufs.taken.len() == bufs.capacity {
                break;
            }
            let slot = self.slot(index);
            let g = if wait {
                slot.lock()
            } else {
                match slot.try_lock() {
                    Some(g) => g,
                    None => continue,
                }
            };
            let s = g.get();
            drop(g);
            if !s.flags.contains(SlotFlags::STORED) || !keep(&s) {
                continue;
            }
            bufs.taken.push((index, s, sectors, false));
            sectors += BackingStore::sectors_for(usize::from(s.size));
        }
        if bufs.taken.is_empty() {
            return stats;
        }
        let Some(extent) = backing.reserve(sectors) else {
            stats.full = true;
            return stats;
        };
        let bytes = (sectors * SECTOR) as usize;
        let out = &mut bufs.out[..bytes.next_multiple_of(ALIGN)];
        out.fill(0);
        for (index, s, off, sealed) in bufs.taken.iter_mut() {
            let (index, s, off) = (*index, *s, *off);
            // Read the object under its lock; a page that changed since, or that was busy, is
            // left out at commit (its record stays zeros, which never open).
            let slot = self.slot(index);
            let Some(g) = (if wait {
                Some(slot.lock())
            } else {
                slot.try_lock()
            }) else {
                continue;
            };
            let n = usize::from(s.size);
            let ok = g.get() == s
                && uzram_allocator::Handle::from_raw(s.word)
                    .is_some_and(|h| self.pool.read_into(h, &mut bufs.plain[..]).is_ok());
            drop(g);
            if ok {
                let at = (off * SECTOR) as usize;
                let location = BackingStore::location(extent.file, extent.start + off);
                backing.seal(index, location, &bufs.plain[..n], &mut out[at..]);
                *sealed = true;
            }
        }
        if backing.write_extent(&extent, out).is_err() {
            stats.failed = bufs.taken.len() as u64;
            return stats;
        }
        stats.bytes = out.len() as u64;
        let mut written = 0;
        for &(index, s, off, sealed) in &bufs.taken {
            let sector = extent.start + off;
            let n = BackingStore::sectors_for(usize::from(s.size));
            let slot = self.slot(index);
            let g = match (sealed, wait) {
                (false, _) => None,
                (true, true) => Some(slot.lock()),
                (true, false) => slot.try_lock(),
            };
            let Some(mut g) = g.filter(|g| g.get() == s) else {
                backing.files[extent.file]
                    .space
                    .lock()
                    .set(sector, n, false);
                continue;
            };
            let wb = SlotState {
                word: BackingStore::location(extent.file, sector),
                flags: s
                    .flags
                    .difference(SlotFlags::STORED)
                    .difference(SlotFlags::IDLE)
                    | SlotFlags::WB,
                prio: s.prio,
                size: s.size,
                atime: s.atime,
            };
            backing.counters.count.fetch_add(1, Ordering::Relaxed);
            backing.counters.writes.fetch_add(1, Ordering::Relaxed);
            self.replace(index, &mut g, wb);
            written += 1;
            stats.object_bytes += u64::from(s.size);
        }
        stats.written = written;
        backing.charge_limit(written);
        stats
    }

    /// zram's `writeback`: moves the pages `req` selects to the backing store, compressed and
    /// sealed, in batches written with one `pwrite` each; then compacts the pool. A failed write
    /// leaves its pages in RAM; a full store or the writeback limit ends the pass cleanly.
    pub fn writeback(
        &self,
        ctx: &mut IoContext,
        req: WritebackRequest,
    ) -> Result<WritebackStats, Error> {
        let Some(backing) = self.backing.as_ref() else {
            return Err(Error::InvalidRequest {
                text: "writeback".into(),
                why: "the device has no backing device (create it with --backing-dev FILE)",
            });
        };
        self.adopt(ctx)?;
        if let WritebackRequest::Pages { last, .. } = req {
            if last >= self.pages() {
                return Err(Error::InvalidRequest {
                    text: format!("{req:?}"),
                    why: "page index beyond the device",
                });
            }
        }
        let range = match req {
            WritebackRequest::Pages { first, last } => first..=last,
            _ => 0..=self.pages() - 1,
        };
        let candidates: Vec<PageIndex> = range
            .filter(|&i| Self::wb_eligible(&self.slot(PageIndex(i)).peek(), req, i))
            .map(PageIndex)
            .collect();
        let mut stats = WritebackStats {
            candidates: candidates.len() as u64,
            ..WritebackStats::default()
        };
        let mut bufs = WbBuffers::new(BATCH);
        for chunk in candidates.chunks(BATCH) {
            let allowed = backing.limit_allows(chunk.len());
            if allowed == 0 {
                stats.stopped = true;
                break;
            }
            let keep = |s: &SlotState| Self::wb_eligible_flags(s, req);
            let b = self.write_batch(backing, &mut bufs, &chunk[..allowed], &keep, true);
            stats.written += b.written;
            stats.bytes += b.bytes;
            stats.failed += b.failed;
            if b.full {
                stats.stopped = true;
                break;
            }
        }
        if stats.written > 0 {
            self.compact();
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{tempdir, text_page};
    use super::*;
    use crate::DeviceSetup;

    fn setup(dir: &Path) -> (Device, PathBuf) {
        let path = dir.join("backing");
        let mut setup = DeviceSetup::new();
        setup.set_backing_dev(&path);
        (setup.init(4 << 20).unwrap(), path)
    }

    #[test]
    fn written_back_pages_read_back_sealed_and_packed() {
        let dir = tempdir("wb-rt");
        let (d, path) = setup(&dir);
        let mut ctx = d.context().unwrap();
        let pages: Vec<[u8; PAGE_SIZE]> = (0..300).map(text_page).collect();
        for (i, p) in pages.iter().enumerate() {
            d.write(&mut ctx, i as u64 * 4096, p).unwrap();
        }
        let before = d.stats().mm;
        d.mark_idle(None);
        let s = d.writeback(&mut ctx, WritebackRequest::Idle).unwrap();
        assert_eq!((s.candidates, s.written, s.failed), (300, 300, 0), "{s:?}");
        assert!(
            s.bytes * 2 <= 300 * 4096,
            "{} bytes for 300 pages: not packed",
            s.bytes
        );
        let after = d.stats().mm;
        assert_eq!(after.compr_data_size, 0, "{after:?}");
        assert!(after.mem_used_total < before.mem_used_total);
        assert_eq!(
            d.backing().unwrap().bd_stat(),
            "     300        0      300\n"
        );
        let mut back = vec![0u8; PAGE_SIZE];
        for (i, p) in pages.iter().enumerate() {
            d.read(&mut ctx, i as u64 * 4096, &mut back).unwrap();
            assert_eq!(&back, p, "page {i}");
        }
        // Nothing of the plain text is in the file: every line of a text page starts with
        // "uzram: ", which compression keeps as a literal at least once per page.
        let file = std::fs::read(&path).unwrap();
        assert!(pages[0].starts_with(b"uzram: "));
        assert!(
            !file.windows(7).any(|w| w == b"uzram: "),
            "plain text in the backing file"
        );
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        d.check_invariants().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_flipped_byte_fails_that_read_with_an_error() {
        let dir = tempdir("wb-flip");
        let (d, path) = setup(&dir);
        let mut ctx = d.context().unwrap();
        d.write(&mut ctx, 0, &text_page(1)).unwrap();
        d.write(&mut ctx, 4096, &text_page(2)).unwrap();
        d.writeback(&mut ctx, WritebackRequest::Pages { first: 0, last: 1 })
            .unwrap();
        let sector = d.slot_state(PageIndex(0)).unwrap().word;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, sector * SECTOR + 40).unwrap();
        b[0] ^= 0x20;
        f.write_all_at(&b, sector * SECTOR + 40).unwrap();
        let mut back = vec![0u8; PAGE_SIZE];
        assert!(matches!(
            d.read(&mut ctx, 0, &mut back),
            Err(IoError::Backing {
                source: BackingError::Tampered { .. },
                ..
            })
        ));
        assert!(
            back.iter().all(|&x| x == 0),
            "a failed read returns no stale bytes"
        );
        d.read(&mut ctx, 4096, &mut back).unwrap();
        assert_eq!(back, text_page(2), "the neighbour is intact");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn failed_writes_keep_pages_in_ram_and_frees_return_space() {
        let dir = tempdir("wb-fail");
        let (d, _path) = setup(&dir);
        let mut ctx = d.context().unwrap();
        for i in 0..20u64 {
            d.write(&mut ctx, i * 4096, &text_page(i)).unwrap();
        }
        d.backing().unwrap().set_fail_writes(true);
        let s = d
            .writeback(&mut ctx, WritebackRequest::Pages { first: 0, last: 19 })
            .unwrap();
        assert_eq!((s.written, s.failed), (0, 20), "{s:?}");
        assert_eq!(d.stats().mm.pages_compacted, 0);
        d.backing().unwrap().set_fail_writes(false);
        let s = d
            .writeback(&mut ctx, WritebackRequest::Pages { first: 0, last: 19 })
            .unwrap();
        assert_eq!(s.written, 20);
        let free_before = d.backing().unwrap().free_bytes();
        d.discard(0, 10 * 4096).unwrap();
        d.write(&mut ctx, 10 * 4096, &text_page(99)).unwrap();
        let free_after = d.backing().unwrap().free_bytes();
        assert!(
            free_after > free_before,
            "discard and overwrite free backing space"
        );
        assert_eq!(
            d.backing().unwrap().bd_stat().split_whitespace().next(),
            Some("9")
        );
        let mut back = vec![0u8; PAGE_SIZE];
        for i in 11..20u64 {
            d.read(&mut ctx, i * 4096, &mut back).unwrap();
            assert_eq!(back, text_page(i));
        }
        // The writeback limit stops a pass.
        let b = d.backing().unwrap();
        b.set_limit_enable(true);
        b.set_limit(2);
        let s = d
            .writeback(
                &mut ctx,
                WritebackRequest::Pages {
                    first: 10,
                    last: 10,
                },
            )
            .unwrap();
        assert_eq!(s.written, 1);
        assert_eq!(b.limit(), (true, 1));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_others_may_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempdir("wb-mode");
        let path = dir.join("open");
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(
            BackingStore::open(&path, 1 << 20),
            Err(BackingError::Unsafe { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn writeback_syntax_is_zrams() {
        assert_eq!(
            "idle".parse::<WritebackRequest>().unwrap(),
            WritebackRequest::Idle
        );
        assert_eq!(
            "type=huge_idle".parse::<WritebackRequest>().unwrap(),
            WritebackRequest::HugeIdle
        );
        assert_eq!(
            "page_indexes=3-9".parse::<WritebackRequest>().unwrap(),
            WritebackRequest::Pages { first: 3, last: 9 }
        );
        for bad in ["cold", "page_index=x", "page_indexes=9-3", "page_indexes=4"] {
            assert!(bad.parse::<WritebackRequest>().is_err(), "{bad}");
        }
    }
}
