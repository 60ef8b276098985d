//! Writeback: cold pages leave RAM for a backing file (or block device), compressed, packed and
//! encrypted.
//!
//! # On disk
//! The backing store is an array of 512-byte sectors. A written-back page is one record of
//! `12 + n + 16` bytes (nonce, the page's stored bytes encrypted, the Poly1305 tag), starting on a
//! sector boundary; records of one writeback batch lie back to back in one extent, written with
//! one `pwrite`. The stored bytes are what the pool held: the compressed object (its codec priority
//! stays in the slot) or the raw page of a huge one, so a page costs its compressed size on disk,
//! not 4 KiB.
//!
//! # Secrets
//! Swap holds secrets. Every record is sealed with ChaCha20-Poly1305 under a key drawn from the
//! OS at device creation and kept only in the daemon's (locked) memory; the nonce is a counter
//! (never reused under one key), and the additional data binds a record to its page index and
//! sector, so a record copied elsewhere in the file fails to open. A stolen backing file reveals
//! nothing; a flipped byte makes that page's read fail with EIO. The file is created 0600 and
//! refused if others may write it.
//!
//! # Space
//! A bitmap of sectors, first fit from a rotating cursor. Freeing a record (the page overwritten,
//! discarded, or the device reset) clears its sectors and punches a hole for every 4 KiB block
//! that became wholly free, so a regular file gives the space back to its filesystem.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use chacha20poly1305::aead::{AeadInPlace, KeyInit, OsRng};
use chacha20poly1305::{ChaCha20Poly1305, Nonce, Tag};
use parking_lot::Mutex;

use super::{Device, IoContext, PageIndex, SlotFlags, SlotState, PAGE_SIZE};
use crate::Error;

/// Bytes of one sector of the backing store.
pub const SECTOR: u64 = 512;
const NONCE: usize = 12;
const TAG: usize = 16;
/// Largest record: a raw page, sealed.
pub const MAX_RECORD: usize = NONCE + PAGE_SIZE + TAG;
/// Pages per writeback batch (one extent, one write).
const BATCH: usize = 256;

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

/// The sector bitmap.
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

    /// First fit of `n` contiguous sectors, from the cursor round to it.
    fn alloc(&mut self, n: u64) -> Option<u64> {
        if n == 0 || n > self.free {
            return None;
        }
        let mut start = self.cursor;
        let mut scanned = 0;
        while scanned < self.sectors + n {
            if start + n > self.sectors {
                scanned += self.sectors - start;
                start = 0;
                continue;
            }
            match (start..start + n).find(|&s| self.is_used(s)) {
                None => {
                    self.set(start, n, true);
                    self.cursor = start + n;
                    return Some(start);
                }
                Some(busy) => {
                    scanned += busy + 1 - start;
                    start = busy + 1;
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

/// A backing file or block device, with its key and its space map.
pub struct BackingStore {
    file: File,
    path: PathBuf,
    cipher: ChaCha20Poly1305,
    nonce: AtomicU64,
    space: Mutex<Space>,
    counters: BdCounters,
    /// zram's `writeback_limit_enable` and `writeback_limit` (4 KiB units).
    limit: Mutex<(bool, u64)>,
    /// Tests: every write fails.
    fail_writes: AtomicBool,
}

impl std::fmt::Debug for BackingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackingStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl BackingStore {
    /// Opens (creating it 0600 if need be) `path`. A regular file of size 0 is sized to
    /// `default_bytes` (sparse); an existing file or block device keeps its size.
    pub fn open(path: &Path, default_bytes: u64) -> Result<BackingStore, BackingError> {
        let open_err = |source| BackingError::Open {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if meta.mode() & 0o022 != 0 {
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
            file.set_len(default_bytes).map_err(open_err)?;
            bytes = default_bytes;
        }
        let key = ChaCha20Poly1305::generate_key(&mut OsRng);
        Ok(BackingStore {
            file,
            path: path.to_path_buf(),
            cipher: ChaCha20Poly1305::new(&key),
            nonce: AtomicU64::new(1),
            space: Mutex::new(Space::new(bytes / SECTOR)),
            counters: BdCounters::default(),
            limit: Mutex::new((false, 0)),
            fail_writes: AtomicBool::new(false),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sectors_for(len: usize) -> u64 {
        ((NONCE + len + TAG) as u64).div_ceil(SECTOR)
    }

    fn aad(index: PageIndex, sector: u64) -> [u8; 16] {
        let mut aad = [0u8; 16];
        aad[..8].copy_from_slice(&index.0.to_le_bytes());
        aad[8..].copy_from_slice(&sector.to_le_bytes());
        aad
    }

    /// Seals `data` (page `index`'s stored bytes) into `out` as the record at `sector`.
    fn seal(&self, index: PageIndex, sector: u64, data: &[u8], out: &mut [u8]) {
        let n = self.nonce.fetch_add(1, Ordering::Relaxed);
        let mut nonce = [0u8; NONCE];
        nonce[..8].copy_from_slice(&n.to_le_bytes());
        out[..NONCE].copy_from_slice(&nonce);
        let body = &mut out[NONCE..NONCE + data.len()];
        body.copy_from_slice(data);
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &Self::aad(index, sector), body)
            .expect("a page is far below the AEAD's length limit");
        out[NONCE + data.len()..NONCE + data.len() + TAG].copy_from_slice(&tag);
    }

    /// Reads and opens page `index`'s record of `len` stored bytes at `sector` into
    /// `buf[..len]`; `buf` is at least [`MAX_RECORD`] bytes.
    fn read(
        &self,
        index: PageIndex,
        sector: u64,
        len: usize,
        buf: &mut [u8],
    ) -> Result<(), BackingError> {
        let total = NONCE + len + TAG;
        let record = &mut buf[..total];
        self.file
            .read_exact_at(record, sector * SECTOR)
            .inspect_err(|_| {
                self.counters.failed_reads.fetch_add(1, Ordering::Relaxed);
            })?;
        let nonce = *Nonce::from_slice(&record[..NONCE]);
        let tag = *Tag::from_slice(&record[NONCE + len..total]);
        let body = &mut record[NONCE..NONCE + len];
        self.cipher
            .decrypt_in_place_detached(&nonce, &Self::aad(index, sector), body, &tag)
            .map_err(|_| {
                self.counters.failed_reads.fetch_add(1, Ordering::Relaxed);
                BackingError::Tampered { sector }
            })?;
        buf.copy_within(NONCE..NONCE + len, 0);
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Frees the record of `len` stored bytes at `sector`, punching holes where whole 4 KiB
    /// blocks became free.
    fn free(&self, sector: u64, len: usize) {
        let n = Self::sectors_for(len);
        let mut space = self.space.lock();
        space.set(sector, n, false);
        // The 4 KiB blocks the record touched that are now wholly free.
        let per_block = PAGE_SIZE as u64 / SECTOR;
        let first = sector / per_block;
        let last = (sector + n - 1) / per_block;
        for block in first..=last {
            let start = block * per_block;
            if start + per_block <= space.sectors
                && (start..start + per_block).all(|s| !space.is_used(s))
            {
                // SAFETY: fallocate on our own fd with plain integers; a failure (e.g. a block
                // device or a filesystem without hole punching) only leaves the space allocated.
                unsafe {
                    libc::fallocate(
                        std::os::fd::AsRawFd::as_raw_fd(&self.file),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        (start * SECTOR) as libc::off_t,
                        PAGE_SIZE as libc::off_t,
                    );
                }
            }
        }
        drop(space);
        self.counters.count.fetch_sub(1, Ordering::Relaxed);
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

    /// Bytes written to the store so far (sealed records, sector-rounded).
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

    /// Tests and fault drills: make every write fail (the pages must stay in RAM).
    pub fn set_fail_writes(&self, on: bool) {
        self.fail_writes.store(on, Ordering::Relaxed);
    }
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
    ) -> Result<(), Error> {
        let backing = self.backing.as_ref().ok_or(Error::Backing {
            index,
            source: BackingError::Full,
        })?;
        let len = usize::from(s.size);
        backing
            .read(index, s.word, len, buf)
            .map_err(|source| Error::Backing { index, source })?;
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
        let f = s.flags;
        if !f.contains(SlotFlags::STORED) {
            return false;
        }
        match req {
            WritebackRequest::Idle => f.contains(SlotFlags::IDLE),
            WritebackRequest::Huge => f.contains(SlotFlags::HUGE),
            WritebackRequest::HugeIdle => f.contains(SlotFlags::HUGE | SlotFlags::IDLE),
            WritebackRequest::Incompressible => f.contains(SlotFlags::INCOMPRESSIBLE),
            WritebackRequest::Pages { first, last } => (first..=last).contains(&index),
        }
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
        let candidates: Vec<u64> = range
            .filter(|&i| Self::wb_eligible(&self.slot(PageIndex(i)).peek(), req, i))
            .collect();
        let mut stats = WritebackStats {
            candidates: candidates.len() as u64,
            ..WritebackStats::default()
        };
        let mut plain = vec![0u8; PAGE_SIZE];
        let mut batch_buf = vec![0u8; BATCH * MAX_RECORD.next_multiple_of(SECTOR as usize)];
        for chunk in candidates.chunks(BATCH) {
            // Within the writeback limit.
            let allowed = {
                let (on, left) = backing.limit();
                if on {
                    usize::try_from(left).unwrap_or(usize::MAX).min(chunk.len())
                } else {
                    chunk.len()
                }
            };
            if allowed == 0 {
                stats.stopped = true;
                break;
            }
            // Copy the objects out (slot by slot) and seal them back to back.
            let mut taken: Vec<(PageIndex, SlotState, u64)> = Vec::with_capacity(allowed);
            let mut offset_sectors = 0u64;
            for &i in &chunk[..allowed] {
                let index = PageIndex(i);
                let g = self.slot(index).lock();
                let s = g.get();
                if !Self::wb_eligible(&s, req, i) {
                    continue;
                }
                let Some(h) = uzram_allocator::Handle::from_raw(s.word) else {
                    continue;
                };
                let Ok(n) = self.pool.read_into(h, &mut plain) else {
                    continue;
                };
                drop(g);
                taken.push((index, s, offset_sectors));
                offset_sectors += BackingStore::sectors_for(n);
                debug_assert_eq!(n, usize::from(s.size));
            }
            if taken.is_empty() {
                continue;
            }
            let Some(start) = backing.space.lock().alloc(offset_sectors) else {
                stats.stopped = true;
                break;
            };
            let bytes = (offset_sectors * SECTOR) as usize;
            let out = &mut batch_buf[..bytes];
            out.fill(0);
            for &(index, s, off) in &taken {
                // Read the object again under its lock: sealing binds the final sector.
                let g = self.slot(index).lock();
                let now = g.get();
                let n = usize::from(s.size);
                let ok = now == s
                    && uzram_allocator::Handle::from_raw(s.word)
                        .is_some_and(|h| self.pool.read_into(h, &mut plain).is_ok());
                drop(g);
                let at = (off * SECTOR) as usize;
                if ok {
                    backing.seal(index, start + off, &plain[..n], &mut out[at..]);
                }
            }
            let written = if backing.fail_writes.load(Ordering::Relaxed) {
                Err(std::io::Error::from_raw_os_error(libc::EIO))
            } else {
                backing.file.write_all_at(out, start * SECTOR)
            };
            if written.is_err() {
                backing
                    .counters
                    .failed_writes
                    .fetch_add(1, Ordering::Relaxed);
                backing.space.lock().set(start, offset_sectors, false);
                stats.failed += taken.len() as u64;
                continue;
            }
            stats.bytes += bytes as u64;
            backing
                .counters
                .bytes_written
                .fetch_add(bytes as u64, Ordering::Relaxed);
            // Swap each slot over to its record, unless the page changed meanwhile.
            for &(index, s, off) in &taken {
                let sector = start + off;
                let n = BackingStore::sectors_for(usize::from(s.size));
                let mut g = self.slot(index).lock();
                if g.get() != s {
                    drop(g);
                    backing.space.lock().set(sector, n, false);
                    continue;
                }
                let wb = SlotState {
                    word: sector,
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
                stats.written += 1;
            }
            {
                let mut limit = backing.limit.lock();
                if limit.0 {
                    limit.1 = limit.1.saturating_sub(taken.len() as u64);
                }
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
    use super::*;
    use crate::DeviceSetup;

    fn text_page(i: u64) -> Vec<u8> {
        let mut page = Vec::with_capacity(PAGE_SIZE);
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        while page.len() < PAGE_SIZE {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            page.extend_from_slice(format!("secret-{} token {} ", i, x % 977).as_bytes());
        }
        page.truncate(PAGE_SIZE);
        page
    }

    fn setup(dir: &Path) -> (Device, PathBuf) {
        let path = dir.join("backing");
        let mut setup = DeviceSetup::new();
        setup.set_backing_dev(&path);
        (setup.init(4 << 20).unwrap(), path)
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("uzram-wb-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn written_back_pages_read_back_sealed_and_packed() {
        let dir = tempdir("rt");
        let (d, path) = setup(&dir);
        let mut ctx = d.context().unwrap();
        let pages: Vec<Vec<u8>> = (0..300).map(text_page).collect();
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
        // Nothing of the plain text is in the file.
        let file = std::fs::read(&path).unwrap();
        assert!(
            !file.windows(7).any(|w| w == b"secret-"),
            "plain text in the backing file"
        );
        let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        d.check_invariants().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_flipped_byte_fails_that_read_with_an_error() {
        let dir = tempdir("flip");
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
            Err(Error::Backing {
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
        let dir = tempdir("fail");
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
        let free_before = d.backing().unwrap().space.lock().free;
        d.discard(0, 10 * 4096).unwrap();
        d.write(&mut ctx, 10 * 4096, &text_page(99)).unwrap();
        let free_after = d.backing().unwrap().space.lock().free;
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
        let dir = tempdir("mode");
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
