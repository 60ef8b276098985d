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
//! OS at device creation ([`BackingKey`]) and kept only in memory (the daemon's, locked; for a
//! device that outlives its process, also a sealed memfd its supervisor holds, never a file);
//! the nonce is a counter and an epoch, one more for each process that adopted the device, so
//! it is never reused under one key; the additional data binds a record to its page index and
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
//! `Tiering::make_room`.)

use std::str::FromStr;
use std::sync::atomic::Ordering;

mod key;
mod label;
mod open;
mod reuse;
mod space;
mod store;

pub use self::key::{BackingKey, KEY_LEN};
pub use self::label::check as check_backing;
pub(in crate::device) use self::reuse::record_of;
use self::store::Extent;
pub(crate) use self::store::FileIdentity;
pub use self::store::{AlignedBuf, BackingError, BackingStore, FileUsage};
pub use super::backing_io::BackingIo;
use super::tier::Tiering;
use super::{slot, Device, IoContext, PageIndex, SlotFlags, SlotState, PAGE_SIZE};
use crate::{Error, IoError};

/// Bytes of one sector of the backing store.
pub const SECTOR: u64 = 512;
const NONCE: usize = 12;
const TAG: usize = 16;
/// Largest record: a raw page, sealed.
pub const MAX_RECORD: usize = NONCE + PAGE_SIZE + TAG;
/// Pages per writeback batch of a pass (one extent, one write); the default of the device's
/// `writeback_batch_size` (zram's is 32 writes in flight; uzram's pass writes each batch with
/// one write).
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

/// Bytes a record of `len` stored bytes takes on the store (whole sectors).
pub(in crate::device) fn record_bytes(len: usize) -> u64 {
    BackingStore::sectors_for(len) * SECTOR
}

/// The buffers of one writeback batch, made once and reused: eviction inside a write must not
/// allocate (but for the first grouped page it writes back: see `Device::member_alone`).
pub(super) struct WbBuffers {
    out: AlignedBuf,
    taken: Vec<Taken>,
    /// Candidates, for callers that pick pages without allocating (eviction).
    pub(super) pages: Vec<PageIndex>,
    members: super::group::AloneScratch,
    capacity: usize,
}

/// What an I/O thread lends a batch it writes (an eviction inside a write) so that a grouped
/// page goes back without anything made for it: its context's codec streams and the group
/// copy it reads with.
pub(in crate::device) struct Lend<'a> {
    pub(in crate::device) streams: &'a mut [Option<uzram_codecs::Stream>],
    pub(in crate::device) group: &'a mut super::group::ReadCache,
}

/// A batch about to be written: its buffers, and what the thread writing it lends (without a
/// loan, a grouped page goes back with the buffers' own streams and copy, made at the first).
pub(in crate::device) struct Batch<'a> {
    pub(in crate::device) bufs: &'a mut WbBuffers,
    pub(in crate::device) lend: Option<Lend<'a>>,
}

impl<'a> Batch<'a> {
    /// A batch in `bufs` with nothing lent.
    pub(in crate::device) fn own(bufs: &'a mut WbBuffers) -> Batch<'a> {
        Batch { bufs, lend: None }
    }
}

/// A page a batch took.
#[derive(Debug, Clone, Copy)]
struct Taken {
    index: PageIndex,
    /// Its state and its slot's generation when picked.
    state: SlotState,
    gen: u8,
    /// Its record's sector offset in the batch.
    off: u64,
    /// A grouped page: compressed alone when picked, its bytes already at its record's body
    /// in the batch's buffer.
    alone: Option<super::group::Alone>,
    /// Its record was sealed (only sealed records are committed).
    sealed: bool,
}

impl Taken {
    /// The bytes its record holds.
    fn stored_len(&self) -> usize {
        self.alone
            .map_or(usize::from(self.state.size), |a| usize::from(a.size))
    }
}

impl WbBuffers {
    pub(super) fn new(capacity: usize) -> WbBuffers {
        WbBuffers {
            out: AlignedBuf::new(
                (capacity * MAX_RECORD.next_multiple_of(SECTOR as usize)).next_multiple_of(ALIGN),
            ),
            taken: Vec::with_capacity(capacity),
            pages: Vec::with_capacity(capacity),
            members: super::group::AloneScratch::default(),
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
    /// Their stored bytes (what left the pool; for a grouped page its share of the groups'
    /// bytes: its group's room is given back with its last member).
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

impl WritebackRequest {
    /// A whole write to zram's `writeback` (Linux 6.16 and later): `page_index=N` and
    /// `page_indexes=LO-HI`, as many as given, each select pages; `type=MODE` or a bare mode
    /// (as before 6.16) ends the list, and selects by mode over the whole device only when it
    /// comes first (after page indexes zram applies it to the last range, whose pages are all
    /// taken already: it adds nothing). A key zram does not know is refused (zram skips it).
    pub fn parse_list(text: &str) -> Result<Vec<WritebackRequest>, Error> {
        let mut list = Vec::new();
        for word in text.split_ascii_whitespace() {
            let req: WritebackRequest = word.parse()?;
            if !matches!(req, WritebackRequest::Pages { .. }) {
                if list.is_empty() {
                    list.push(req);
                }
                break;
            }
            list.push(req);
        }
        if list.is_empty() {
            return Err(Error::InvalidRequest {
                text: text.to_string(),
                why: "writeback takes idle, huge, huge_idle, incompressible, page_index=N or page_indexes=LO-HI",
            });
        }
        Ok(list)
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

impl Tiering {
    /// Reads page `s` (written back) into `out` through `buf`.
    pub(in crate::device) fn load_written_back(
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
        let (sealed_for, location) = record_of(index, s);
        backing
            .read(sealed_for, location, len, buf)
            .map_err(|source| IoError::Backing { index, source })?;
        if s.flags.contains(SlotFlags::HUGE) {
            out.copy_from_slice(&buf[..PAGE_SIZE]);
        } else {
            super::decompress_with(streams, index, s.prio, &buf[..len], out)?;
        }
        self.note_read_back(index, s, out);
        Ok(())
    }

    fn wb_eligible(s: &SlotState, req: WritebackRequest, index: u64) -> bool {
        match req {
            WritebackRequest::Pages { first, last } => {
                (first..=last).contains(&index) && Self::wb_eligible_flags(s, req)
            }
            _ => Self::wb_eligible_flags(s, req),
        }
    }

    /// The flag part of [`Tiering::wb_eligible`] (a page range is checked by the caller).
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
    /// lock itself). A grouped page is written back alone with the batch's loan, or without one
    /// with the buffers' own streams and copy (made at the first grouped page); nothing else is
    /// allocated.
    pub(super) fn write_batch(
        &self,
        dev: &Device,
        backing: &BackingStore,
        batch: &mut Batch<'_>,
        pages: &[PageIndex],
        keep: &dyn Fn(&SlotState) -> bool,
        wait: bool,
    ) -> BatchStats {
        let mut stats = BatchStats::default();
        let bufs = &mut *batch.bufs;
        let sectors = self.pick(dev, bufs, batch.lend.as_mut(), pages, keep, wait);
        if bufs.taken.is_empty() {
            return stats;
        }
        // Records kept for reuse give their room up before a batch goes without.
        let Some(extent) = backing
            .reserve(sectors)
            .or_else(|| (self.drop_kept() > 0).then(|| backing.reserve(sectors))?)
        else {
            stats.full = true;
            return stats;
        };
        let len = ((sectors * SECTOR) as usize).next_multiple_of(ALIGN);
        self.seal_taken(dev, backing, bufs, &extent, len, wait);
        if backing.write_extent(&extent, &bufs.out[..len]).is_err() {
            stats.failed = bufs.taken.len() as u64;
            return stats;
        }
        stats.bytes = len as u64;
        self.commit(dev, backing, bufs, &extent, wait, &mut stats);
        backing.charge_limit(stats.written);
        stats
    }

    /// Locks page `index`'s slot, or with `wait` false only if nobody holds it.
    fn lock_for_writeback(
        dev: &Device,
        index: PageIndex,
        wait: bool,
    ) -> Option<slot::SlotGuard<'_>> {
        let slot = dev.slot(index)?;
        if wait {
            Some(slot.lock())
        } else {
            slot.try_lock()
        }
    }

    /// Takes into `bufs.taken` those of `pages` that are stored, not marked freed, and that
    /// `keep` accepts, with their records' sector offsets in the batch; returns the batch's
    /// sectors. A grouped page is compressed alone here, under its lock, into its record's place
    /// in `bufs.out` (its record's length depends on it).
    fn pick(
        &self,
        dev: &Device,
        bufs: &mut WbBuffers,
        mut lend: Option<&mut Lend<'_>>,
        pages: &[PageIndex],
        keep: &dyn Fn(&SlotState) -> bool,
        wait: bool,
    ) -> u64 {
        bufs.taken.clear();
        let mut sectors = 0u64;
        for &index in pages {
            if bufs.taken.len() == bufs.capacity {
                break;
            }
            let Some(g) = Self::lock_for_writeback(dev, index, wait) else {
                continue;
            };
            let (s, gen) = (g.get(), g.generation());
            if !s.flags.contains(SlotFlags::STORED) || !keep(&s) {
                continue;
            }
            // A page its user freed (marked, not yet reclaimed) is not worth a write to the
            // backing store: it is freed within the memory thread's next round.
            if self.freed.get().is_some_and(|f| f.is_marked(index)) {
                continue;
            }
            let alone = if s.is_grouped() {
                let at = (sectors * SECTOR) as usize + NONCE;
                let dst = &mut bufs.out[at..];
                let done = match lend.as_deref_mut() {
                    Some(l) => dev.member_alone(l.streams, l.group, index, &s, dst),
                    None => match bufs.members.lend(dev, s.prio) {
                        Ok((streams, group)) => dev.member_alone(streams, group, index, &s, dst),
                        Err(_) => continue,
                    },
                };
                match done {
                    Ok(a) => Some(a),
                    // Left in RAM, where its read reports the same error.
                    Err(_) => continue,
                }
            } else {
                None
            };
            drop(g);
            let t = Taken {
                index,
                state: s,
                gen,
                off: sectors,
                alone,
                sealed: false,
            };
            sectors += BackingStore::sectors_for(t.stored_len());
            bufs.taken.push(t);
        }
        sectors
    }

    /// Seals each taken page's object into `bufs.out[..len]` at its offset. A page that changed
    /// since it was picked, or that was busy, is left out (its record is zeros, which never
    /// open) and not committed. Every byte of `bufs.out[..len]` outside the sealed records is
    /// zeroed: no plain byte of a page reaches the store.
    fn seal_taken(
        &self,
        dev: &Device,
        backing: &BackingStore,
        bufs: &mut WbBuffers,
        extent: &Extent,
        len: usize,
        wait: bool,
    ) {
        let out = &mut bufs.out[..len];
        let mut end = 0;
        for t in bufs.taken.iter_mut() {
            let (index, s, n) = (t.index, t.state, t.stored_len());
            let at = (t.off * SECTOR) as usize;
            let record = at..at + record_bytes(n) as usize;
            end = record.end;
            // The object is copied to its record's body under its lock (a grouped page's bytes
            // alone are there since it was picked), then sealed in place.
            let body = at + NONCE..at + NONCE + n;
            let g = Self::lock_for_writeback(dev, index, wait);
            let ok = g.as_ref().is_some_and(|g| {
                g.get() == s
                    && g.generation() == t.gen
                    && (t.alone.is_some()
                        || uzram_allocator::Handle::from_raw(s.word).is_some_and(|h| {
                            dev.pool()
                                .read_into(h, &mut out[body])
                                .is_ok_and(|len| len == n)
                        }))
            });
            drop(g);
            if !ok {
                out[record].fill(0);
                continue;
            }
            let location = BackingStore::location(extent.file, extent.start + t.off);
            backing.seal(index, location, n, &mut out[at..]);
            out[at + NONCE + n + TAG..record.end].fill(0);
            t.sealed = true;
        }
        out[end..].fill(0);
    }

    /// After the extent is written: swaps each sealed page whose slot still holds what was
    /// sealed over to its record; frees the records of the others.
    fn commit(
        &self,
        dev: &Device,
        backing: &BackingStore,
        bufs: &WbBuffers,
        extent: &Extent,
        wait: bool,
        stats: &mut BatchStats,
    ) {
        // A written-back slot's atime is its writeback's time (see `Device::load`).
        let now = dev.now();
        for t in &bufs.taken {
            let (index, s, gen) = (t.index, t.state, t.gen);
            let sector = extent.start + t.off;
            let g = if t.sealed {
                Self::lock_for_writeback(dev, index, wait)
            } else {
                None
            };
            // The state and the generation: a page freed and written again meanwhile may hold
            // an equal state (its handle reused, the same size and second), never the same
            // generation.
            let Some(mut g) = g.filter(|g| g.get() == s && g.generation() == gen) else {
                backing.release(
                    extent.file,
                    sector,
                    BackingStore::sectors_for(t.stored_len()),
                );
                continue;
            };
            if s.flags.contains(SlotFlags::PROMOTED) {
                self.policy.note_promote_miss();
            }
            let flags = s
                .flags
                .difference(SlotFlags::STORED)
                .difference(SlotFlags::IDLE)
                .difference(SlotFlags::PROMOTED)
                | SlotFlags::WB;
            // A grouped page's record holds it alone, with its group's codec, or raw (priority
            // 0, as a page stored raw always has).
            let (flags, prio, size) = match t.alone {
                Some(a) if a.huge => (flags | SlotFlags::HUGE, 0, a.size),
                Some(a) => (flags, s.prio, a.size),
                None => (flags, s.prio, s.size),
            };
            let wb = SlotState {
                word: BackingStore::location(extent.file, sector),
                flags,
                prio,
                size,
                atime: now,
            };
            backing.counters.count.fetch_add(1, Ordering::Relaxed);
            backing.counters.writes.fetch_add(1, Ordering::Relaxed);
            // (A grouped page's share, taken before it leaves its group.)
            stats.object_bytes += dev.pool_bytes_of(&s);
            dev.replace(index, &mut g, wb);
            stats.written += 1;
        }
    }

    /// [`Device::writeback`] on `dev`.
    pub(super) fn writeback(
        &self,
        dev: &Device,
        ctx: &mut IoContext,
        req: WritebackRequest,
    ) -> Result<WritebackStats, Error> {
        let Some(backing) = self.backing.as_ref() else {
            return Err(Error::InvalidRequest {
                text: "writeback".into(),
                why: "the device has no backing device (create it with --backing-dev FILE)",
            });
        };
        dev.fit_context(ctx)?;
        if let WritebackRequest::Pages { last, .. } = req {
            if last >= dev.pages() {
                return Err(Error::InvalidRequest {
                    text: format!("{req:?}"),
                    why: "page index beyond the device",
                });
            }
        }
        let range = match req {
            WritebackRequest::Pages { first, last } => first..=last,
            _ => 0..=dev.pages() - 1,
        };
        let candidates: Vec<PageIndex> = range
            .filter(|&i| Self::wb_eligible(&dev.peek(PageIndex(i)), req, i))
            .map(PageIndex)
            .collect();
        let mut stats = WritebackStats {
            candidates: candidates.len() as u64,
            ..WritebackStats::default()
        };
        let mut bufs = WbBuffers::new(BATCH);
        let batch = self.wb_batch.load(Ordering::Relaxed);
        for chunk in candidates.chunks(batch.min(BATCH)) {
            let allowed = backing.limit_allows(chunk.len());
            if allowed == 0 {
                stats.stopped = true;
                break;
            }
            let keep = |s: &SlotState| Self::wb_eligible_flags(s, req);
            let s = ctx.scratch();
            let mut batch = Batch {
                bufs: &mut bufs,
                lend: Some(Lend {
                    streams: s.streams,
                    group: s.group,
                }),
            };
            let b = self.write_batch(dev, backing, &mut batch, &chunk[..allowed], &keep, true);
            stats.written += b.written;
            stats.bytes += b.bytes;
            stats.failed += b.failed;
            if b.full {
                stats.stopped = true;
                break;
            }
        }
        if stats.written > 0 {
            dev.compact();
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests;
