//! The device engine: a table of slots, one per 4 KiB page, over a [`Pool`] of compressed objects.
//! Tiering (the policy, the backing store, the marks of freed pages) is one component the device
//! owns, called through the hooks in `tier.rs`.
//!
//! Lock order: slot lock, then the pool's locks (class, then arenas). An operation holds at most
//! one slot lock. Compression happens outside any lock for whole-page writes; a partial-page write
//! holds its slot's lock across its read-modify-write.

mod backing_io;
mod context;
mod freed;
mod group;
#[allow(unsafe_code)] // the slot lock's parking, each call with its SAFETY reason
mod park;
pub mod policy;
mod recompress;
mod setup;
pub mod slot;
mod stats;
mod survive;
#[cfg(test)]
mod testutil;
mod tier;
mod upkeep;
mod write;
pub mod writeback;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

pub use policy::{Policy, PolicyConfig, PolicyStats, Pressure, TickReport};
pub use recompress::{RecompressRequest, RecompressStats, RecompressType};
pub use uzram_allocator::{Growth, Maintenance, Region, RegionSize};
use uzram_allocator::{Pool, PoolConfig};
use uzram_codecs::{Algorithm, Codec, Stream};

use self::context::Scratch;
pub use self::context::{IoContext, ReserveWait};
pub use self::freed::{FreeMarks, FreedPages};
pub use self::group::{GroupEstimate, GroupPass, MIN_GROUP_PAGES};
pub use self::setup::{DeviceConfig, DeviceSetup};
use self::slot::{Held, Slot, SlotRef, SlotTable};
pub use self::slot::{SlotFlags, SlotState};
use self::stats::{Counters, Field};
pub use self::stats::{DeviceStats, GroupFigures, IoStat, MmStat};
pub use self::survive::Adopted;
pub use self::write::ShortWrite;
pub use self::writeback::BackingKey;
use crate::{Error, IoError};

/// Bytes in a page.
pub const PAGE_SIZE: usize = 4096;
/// Bytes in a sector, the unit of I/O offsets and lengths.
pub const SECTOR_SIZE: u64 = 512;

/// A page's index on the device (byte offset / 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageIndex(pub u64);

impl std::fmt::Display for PageIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// A compressed RAM device: see the crate docs.
pub struct Device {
    id: u64,
    disksize: u64,
    slots: SlotTable,
    pool: Pool,
    /// By priority; `[0]` is the primary (always there), 1..=3 the recompression algorithms.
    codecs: Vec<Option<Codec>>,
    /// Pages that compress to this many bytes or more are stored raw.
    huge_threshold: usize,
    epoch: Instant,
    /// Seconds added to the clock (feature `testing`: `Device::advance_clock`).
    #[cfg(any(test, feature = "testing"))]
    clock_skew: std::sync::atomic::AtomicU32,
    /// The tiering component: the policy, the backing store, the freed-page marks.
    tier: tier::Tiering,
    /// The live cold groups (see `group.rs`).
    groups: group::Groups,
    /// The grouping pass's codec state, kept from its first pass; its lock makes one pass at a
    /// time (taken before any slot lock).
    grouper: parking_lot::Mutex<Option<group::Grouper>>,
    counters: Counters,
    next_shard: AtomicUsize,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("disksize", &self.disksize)
            .field("algorithm", &self.codec().algorithm())
            .finish_non_exhaustive()
    }
}

/// The fill word if `page` is one 8-byte word repeated (zeros included): first and last words
/// first, since most pages differ there.
fn same_filled(page: &[u8; PAGE_SIZE]) -> Option<u64> {
    let word = |i: usize| u64::from_ne_bytes(page[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let first = word(0);
    if word(PAGE_SIZE / 8 - 1) != first {
        return None;
    }
    page.chunks_exact(8)
        .all(|w| w == &page[..8])
        .then_some(first)
}

fn fill(page: &mut [u8; PAGE_SIZE], word: u64) {
    for w in page.chunks_exact_mut(8) {
        w.copy_from_slice(&word.to_ne_bytes());
    }
}

/// Decompresses page `index`'s stored bytes `src` into `out` with the stream of codec priority
/// `prio` (the one its slot records).
fn decompress_with(
    streams: &mut [Option<Stream>],
    index: PageIndex,
    prio: u8,
    src: &[u8],
    out: &mut [u8; PAGE_SIZE],
) -> Result<(), IoError> {
    streams
        .get_mut(usize::from(prio))
        .and_then(Option::as_mut)
        .ok_or(IoError::NoCodec {
            index,
            priority: prio,
        })?
        .decompress(src, out)
        .map_err(|source| IoError::Corrupt { index, source })
}

impl Device {
    /// The slot table's bytes once a device of `disksize` is full (one [`Slot`], 16 bytes, a
    /// page): what [`Device::new`] refuses past this machine's memory.
    pub fn full_table_bytes(disksize: u64) -> u64 {
        disksize
            .div_ceil(PAGE_SIZE as u64)
            .saturating_mul(std::mem::size_of::<Slot>() as u64)
    }

    /// A device of `disksize` bytes (rounded up to whole pages).
    pub fn new(config: DeviceConfig, disksize: u64) -> Result<Device, Error> {
        if disksize == 0 {
            return Err(Error::InvalidSize { text: "0".into() });
        }
        let disksize = disksize.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
        let pages = disksize / PAGE_SIZE as u64;
        let table_bytes = Device::full_table_bytes(disksize);
        let too_large = || Error::TableTooLarge {
            disksize,
            table_bytes,
        };
        // The table's leaves come as pages are written; a table that could not be whole in
        // this machine's memory is refused now (as zram's allocation of it would fail), rather
        // than a mistyped size costing its directory (16 B a MiB) and failing writes later.
        let mem_total = policy::Pressure::read().mem_total;
        if mem_total > 0 && table_bytes > mem_total {
            return Err(too_large());
        }
        let slots = match &config.region {
            None => SlotTable::new(pages).ok_or_else(too_large)?,
            Some(region) => {
                // The journal's and the settings' chunks, and the first tables', resident
                // before anything takes them (see `Device::prefault_region`).
                region.prefault_chunks(64);
                SlotTable::in_region(pages, region.clone())?
            }
        };
        let codecs = Self::codecs(&config)?;
        let backing = if config.backing_devs.is_empty() {
            None
        } else {
            let key = match (&config.backing_key, &config.region) {
                (Some(key), _) => key.clone(),
                (None, None) => writeback::BackingKey::generate(),
                (None, Some(_)) => {
                    return Err(Error::Region {
                        reason: "a device in a region with a backing store needs its key given \
                                 (a successor could not read its written-back pages without it)"
                            .into(),
                    })
                }
            };
            Some(writeback::BackingStore::open_keyed(
                &config.backing_devs,
                disksize,
                config.backing_force,
                &key,
                None,
            )?)
        };
        let pool = Pool::new(PoolConfig {
            region: config.region.clone(),
            ..config.pool.clone()
        })
        .map_err(IoError::OutOfMemory)?;
        pool.set_limit(config.mem_limit);
        if let Some(region) = &config.region {
            survive::write_settings(region, &config, disksize)?;
            if let Some(store) = &backing {
                survive::write_backing(region, store)?;
            }
        }
        Ok(Self::assemble(
            &config,
            disksize,
            slots,
            pool,
            codecs,
            backing,
            Instant::now(),
        ))
    }

    /// The codecs of `config`, by priority.
    fn codecs(config: &DeviceConfig) -> Result<Vec<Option<Codec>>, Error> {
        let mut codecs = vec![Some(Codec::new(config.algorithm, config.params.clone())?)];
        for secondary in &config.secondary {
            codecs.push(
                secondary
                    .as_ref()
                    .map(|(a, p)| Codec::new(*a, p.clone()))
                    .transpose()?,
            );
        }
        Ok(codecs)
    }

    /// A device of its parts; `epoch` is the instant its slots' access times count from.
    fn assemble(
        config: &DeviceConfig,
        disksize: u64,
        slots: SlotTable,
        pool: Pool,
        codecs: Vec<Option<Codec>>,
        backing: Option<writeback::BackingStore>,
        epoch: Instant,
    ) -> Device {
        // zram's rule: an object in the class of whole pages costs a page anyway, so store the
        // page raw (and skip decompression on read).
        let huge_threshold = (1..=PAGE_SIZE)
            .find(|&s| pool.class_size(s) == Ok(PAGE_SIZE))
            .unwrap_or(PAGE_SIZE);
        Device {
            id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
            disksize,
            slots,
            pool,
            codecs,
            huge_threshold,
            epoch,
            #[cfg(any(test, feature = "testing"))]
            clock_skew: std::sync::atomic::AtomicU32::new(0),
            tier: tier::Tiering::new(config.policy, backing),
            groups: group::Groups::default(),
            grouper: parking_lot::Mutex::new(None),
            next_shard: AtomicUsize::new(0),
            counters: Counters::new(
                (std::thread::available_parallelism().map_or(1, |n| n.get()) * 4)
                    .next_power_of_two()
                    .max(16),
            ),
        }
    }

    /// The device size in bytes.
    pub fn disksize(&self) -> u64 {
        self.disksize
    }

    /// The number of pages.
    pub fn pages(&self) -> u64 {
        self.slots.len()
    }

    /// The primary algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.codec().algorithm()
    }

    /// The primary codec (algorithm and parameters).
    pub fn codec(&self) -> &Codec {
        self.codecs[0]
            .as_ref()
            .expect("the primary codec is always there")
    }

    /// Compressed sizes from this one up are stored as raw pages.
    pub fn huge_threshold(&self) -> usize {
        self.huge_threshold
    }

    /// The pool (for its statistics and class table).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    fn now(&self) -> u32 {
        let now = self.epoch.elapsed().as_secs() as u32;
        #[cfg(any(test, feature = "testing"))]
        let now = now.wrapping_add(self.clock_skew.load(Ordering::Relaxed));
        now
    }

    /// Feature `testing`: moves the device's clock (the one page access times use) `secs`
    /// forward.
    #[cfg(any(test, feature = "testing"))]
    pub fn advance_clock(&self, secs: u32) {
        self.clock_skew.fetch_add(secs, Ordering::Relaxed);
    }

    /// The slot table.
    fn slots(&self) -> &SlotTable {
        &self.slots
    }

    /// Counts one event of page `index` in the device's counters.
    fn bump(&self, index: PageIndex, field: Field) {
        self.counters.bump(gauge_shard(index), field);
    }

    /// Page `index`'s slot, if it was ever written (its leaf is there).
    fn slot(&self, index: PageIndex) -> Option<SlotRef<'_>> {
        self.slots.get(index.0)
    }

    /// Page `index`'s slot, for a write: its leaf is allocated if need be.
    fn slot_for_write(&self, index: PageIndex) -> Result<SlotRef<'_>, IoError> {
        self.slots
            .get_or_alloc(index.0)
            .ok_or(IoError::TableOutOfMemory { index })
    }

    /// Page `index`'s state without its lock (empty if never written).
    fn peek(&self, index: PageIndex) -> SlotState {
        self.slots.peek(index.0)
    }

    /// Checks that `[offset, offset + len)` is sector-aligned and inside the device.
    fn check_range(&self, offset: u64, len_bytes: u64) -> Result<(), IoError> {
        if offset % SECTOR_SIZE != 0 || len_bytes % SECTOR_SIZE != 0 {
            return Err(IoError::Misaligned { offset, len_bytes });
        }
        match offset.checked_add(len_bytes) {
            Some(end) if end <= self.disksize => Ok(()),
            _ => Err(IoError::OutOfRange {
                offset,
                len_bytes,
                disksize: self.disksize,
            }),
        }
    }

    /// Reads `buf.len()` bytes at byte `offset` (both multiples of 512). Fills all of `buf` or
    /// fails; on failure `buf` is zeroed, never left with stale or partial data.
    pub fn read(&self, ctx: &mut IoContext, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        let result = self.read_inner(ctx, offset, buf);
        if result.is_err() {
            buf.fill(0);
            self.counters.bump(ctx.shard, Field::FailedReads);
        }
        result
    }

    fn read_inner(&self, ctx: &mut IoContext, offset: u64, buf: &mut [u8]) -> Result<(), IoError> {
        self.check_range(offset, buf.len() as u64)?;
        self.fit_context(ctx)?;
        let mut done = 0;
        for (index, in_page, len) in segments(offset, buf.len()) {
            let chunk = &mut buf[done..done + len];
            done += len;
            let Some(slot) = self.slot(index) else {
                // Never written: zeros, and nothing to mark accessed.
                chunk.fill(0);
                continue;
            };
            if let Ok(page) = <&mut [u8; PAGE_SIZE]>::try_from(&mut *chunk) {
                let mut g = slot.lock();
                self.load(ctx.scratch(), index, &mut g, page)?;
            } else {
                let mut g = slot.lock();
                let (scratch, page) = ctx.scratch_and_page();
                self.load(scratch, index, &mut g, page)?;
                chunk.copy_from_slice(&ctx.page[in_page..in_page + len]);
            }
        }
        Ok(())
    }

    /// Seconds since the device was created: the clock of the slots' access times.
    pub fn clock_secs(&self) -> u32 {
        self.now()
    }

    /// Frees every page from `first` on whose last access (write or read) was before
    /// `before_secs` ([`Device::clock_secs`]); pages touched since then are kept. For freeing a
    /// swap area's old pages after a swapoff without touching anything written after it. Returns
    /// the pages freed.
    pub fn free_pages_older_than(&self, first: PageIndex, before_secs: u32) -> u64 {
        let mut freed = 0;
        for i in first.0..self.pages() {
            let index = PageIndex(i);
            let peek = self.peek(index);
            if peek.is_empty() || peek.atime >= before_secs {
                continue;
            }
            let Some(slot) = self.slot(index) else {
                continue;
            };
            let mut g = slot.lock();
            let s = g.get();
            if !s.is_empty() && s.atime < before_secs {
                self.replace(index, &mut g, SlotState::default());
                self.counters.bump(gauge_shard(index), Field::NotifyFree);
                freed += 1;
            }
        }
        freed
    }

    fn free_page(&self, index: PageIndex) {
        if let Some(slot) = self.slot(index) {
            let mut g = slot.lock();
            if !g.get().is_empty() {
                self.replace(index, &mut g, SlotState::default());
            }
        }
        // zram counts every whole page of a discard or write-zeroes, held data or not.
        self.counters.bump(gauge_shard(index), Field::NotifyFree);
    }

    /// Fills `out` with page `index`, whose slot `g` holds locked, and marks it accessed.
    fn load(
        &self,
        mut scratch: Scratch<'_>,
        index: PageIndex,
        g: &mut slot::SlotGuard<'_>,
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), IoError> {
        let mut s = g.get();
        self.decode(&mut scratch, index, &s, out)?;
        let now = self.now();
        if s.flags.contains(SlotFlags::WB) {
            self.tier
                .after_read_back(self, scratch.buf, index, g, s, now);
            return Ok(());
        }
        // A promoted page is judged by its next read in a later second: the other parts of a
        // page read piecemeal are the same read.
        if s.atime != now {
            if s.flags.contains(SlotFlags::PROMOTED) {
                self.tier.promoted_read(now.saturating_sub(s.atime));
            }
            s.flags = s.flags.difference(SlotFlags::PROMOTED);
        }
        if s.atime != now || s.flags.contains(SlotFlags::IDLE) {
            s.atime = now;
            s.flags = s.flags.difference(SlotFlags::IDLE);
            g.set(s);
        }
        Ok(())
    }

    /// Fills `out` with the page slot state `s` (locked by the caller) names.
    fn decode(
        &self,
        scratch: &mut Scratch<'_>,
        index: PageIndex,
        s: &SlotState,
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), IoError> {
        let lost = |source| IoError::Lost { index, source };
        match s.held() {
            Held::Same(word) => fill(out, word),
            Held::Object(handle) if s.flags.contains(SlotFlags::HUGE) => {
                self.pool.read_into(handle, out).map_err(lost)?;
            }
            Held::Object(handle) => {
                // Copy the object out and decompress outside the pool's class lock, so threads
                // reading pages of the same size class do not wait on each other's codec.
                let n = self
                    .pool
                    .read_into(handle, &mut *scratch.buf)
                    .map_err(lost)?;
                decompress_with(scratch.streams, index, s.prio, &scratch.buf[..n], out)?;
            }
            Held::Member { head, member } => {
                self.read_member(scratch.group, index, head, member, out)?;
            }
            Held::WrittenBack => {
                self.tier
                    .load_written_back(scratch.streams, scratch.buf, index, s, out)?;
            }
            Held::Broken => {
                return Err(lost(uzram_allocator::Error::InvalidHandle { raw: 0 }));
            }
            Held::Nothing => out.fill(0),
        }
        Ok(())
    }

    /// Puts `new` in the locked slot, frees what it held, and keeps the counters.
    fn replace(&self, index: PageIndex, g: &mut slot::SlotGuard<'_>, new: SlotState) {
        let shard = gauge_shard(index);
        let old = g.set(new);
        // Out before in: a shard's gauges never exceed what its pages hold.
        self.counters.remove(shard, &old);
        self.counters.add(shard, &new);
        self.tier.replaced(index, &old);
        // What the slot held is live; failing here would be a bug, and the page is already
        // replaced, so count it rather than fail the write.
        let freed = match old.held() {
            Held::Object(h) => self.pool.free(h).is_ok(),
            Held::Member { head, member } => self.drop_member(head, member),
            Held::Same(_) | Held::WrittenBack | Held::Nothing | Held::Broken => true,
        };
        if !freed {
            self.counters.bump(shard, Field::FreeErrors);
        }
    }
}

/// The counter shard a page's gauges (pages stored, bytes, same and huge pages) live in. Always
/// the same for a page, and a page's old state is counted out before its new one is counted in, so
/// every shard stays between zero and what its pages hold, and so does a snapshot's sum. Groups of 64 pages share a
/// shard, so threads working on different parts of the device rarely share a cache line.
fn gauge_shard(index: PageIndex) -> usize {
    (index.0 >> 6) as usize
}

/// Splits `[offset, offset + len)` into per-page pieces: (page, offset in page, length).
fn segments(offset: u64, len: usize) -> impl Iterator<Item = (PageIndex, usize, usize)> {
    let end = offset + len as u64;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let index = pos / PAGE_SIZE as u64;
        let in_page = (pos % PAGE_SIZE as u64) as usize;
        let n = (PAGE_SIZE - in_page).min((end - pos) as usize);
        pos += n as u64;
        Some((PageIndex(index), in_page, n))
    })
}

#[cfg(test)]
mod tests;
