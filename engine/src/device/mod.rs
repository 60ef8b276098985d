//! The device engine: a table of slots, one per 4 KiB page, over a [`Pool`] of compressed objects.
//!
//! Lock order: slot lock, then the pool's locks (class, then arenas). An operation holds at most
//! one slot lock. Compression happens outside any lock for whole-page writes; a partial-page write
//! holds its slot's lock across its read-modify-write.

mod backing_io;
#[allow(unsafe_code)] // the slot lock's parking, each call with its SAFETY reason
mod park;
pub mod policy;
mod recompress;
pub mod slot;
mod stats;
#[cfg(test)]
mod testutil;
pub mod writeback;

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

pub use policy::{Policy, PolicyConfig, PolicyStats, Pressure, TickReport};
pub use recompress::{RecompressRequest, RecompressStats, RecompressType};
pub use uzram_allocator::{Growth, Maintenance};
use uzram_allocator::{Handle, Pool, PoolConfig};
use uzram_codecs::{Algorithm, AlgorithmParams, Codec, CodecParams, Stream, MAX_COMPRESSED_LEN};

use self::slot::Slot;
pub use self::slot::{SlotFlags, SlotState};
use self::stats::{Counters, Field, Totals};
pub use self::stats::{DeviceStats, IoStat, MmStat};
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

/// How a device compresses and what it may use.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The primary algorithm (zram's `comp_algorithm`).
    pub algorithm: Algorithm,
    /// Its parameters (zram's `algorithm_params`): level, dictionary.
    pub params: CodecParams,
    /// zram's `mem_limit` in bytes; `None` for none.
    pub mem_limit: Option<u64>,
    /// The allocator's tunables.
    pub pool: PoolConfig,
    /// zram's `recomp_algorithm`: the secondary algorithms by priority 1..=3 (`[0]` is
    /// priority 1), each with its parameters.
    pub secondary: [Option<(Algorithm, CodecParams)>; 3],
    /// zram's `backing_dev`: files (created 0600 if missing, sized to the disksize if empty) or
    /// block devices that written-back pages go to; more than one are striped.
    pub backing_devs: Vec<std::path::PathBuf>,
    /// The automatic tiering policy (uzram's `policy` attribute).
    pub policy: PolicyConfig,
}

impl Default for DeviceConfig {
    fn default() -> DeviceConfig {
        DeviceConfig {
            algorithm: Algorithm::Lz4,
            params: CodecParams::default(),
            mem_limit: None,
            pool: PoolConfig::default(),
            secondary: Default::default(),
            backing_devs: Vec::new(),
            policy: PolicyConfig::default(),
        }
    }
}

/// A device before it has a disksize: zram's state after `reset` or hot-add, when the algorithm
/// and its parameters may still change. [`DeviceSetup::init`] turns it into a [`Device`], whose
/// algorithm is fixed for life.
#[derive(Debug, Clone, Default)]
pub struct DeviceSetup {
    config: DeviceConfig,
}

impl DeviceSetup {
    /// A setup with zram's defaults (lz4, no limit).
    pub fn new() -> DeviceSetup {
        DeviceSetup::default()
    }

    /// zram's `comp_algorithm`: picks the primary algorithm by name; resets its parameters.
    pub fn set_comp_algorithm(&mut self, name: &str) -> Result<(), Error> {
        self.config.algorithm = name.trim().parse()?;
        self.config.params = CodecParams::default();
        Ok(())
    }

    /// zram's `algorithm_params` for the primary algorithm: `[algo=NAME] [priority=0] level=N
    /// dict=PATH`. The codec is built once here to check the parameters.
    pub fn set_algorithm_params(&mut self, text: &str) -> Result<(), Error> {
        let p: AlgorithmParams = text.parse()?;
        if let Some(prio) = p.priority.filter(|&p| p != 0) {
            // Parameters of a recompression algorithm, which must be set first (zram's rule).
            let slot = &mut self.config.secondary[usize::from(prio) - 1];
            let Some((algorithm, _)) = slot.clone() else {
                return Err(Error::NoRecompAlgorithm { priority: prio });
            };
            let algorithm = p.algo.unwrap_or(algorithm);
            let params = p.load_codec_params()?;
            Codec::new(algorithm, params.clone())?;
            *slot = Some((algorithm, params));
            return Ok(());
        }
        let algorithm = p.algo.unwrap_or(self.config.algorithm);
        let params = p.load_codec_params()?;
        Codec::new(algorithm, params.clone())?;
        self.config.algorithm = algorithm;
        self.config.params = params;
        Ok(())
    }

    /// zram's `mem_limit` (0 or `None` for none).
    pub fn set_mem_limit(&mut self, bytes: Option<u64>) {
        self.config.mem_limit = bytes.filter(|&b| b > 0);
    }

    /// zram's `backing_dev`: where `writeback` puts pages. Opened (and checked) at init.
    /// Replaces any file given before.
    pub fn set_backing_dev(&mut self, path: &std::path::Path) {
        self.config.backing_devs = vec![path.to_path_buf()];
    }

    /// Adds a backing file to stripe over (at most [`writeback::MAX_FILES`]).
    pub fn add_backing_dev(&mut self, path: &std::path::Path) {
        self.config.backing_devs.push(path.to_path_buf());
    }

    /// The tiering policy (see [`PolicyConfig`]): `key=value ...` as the `policy` attribute
    /// takes it.
    pub fn set_policy(&mut self, text: &str) -> Result<(), Error> {
        self.config.policy.update(text)
    }

    /// zram's `recomp_algorithm`: `algo=NAME [priority=1..3] [level=N] [dict=PATH]` adds (or
    /// replaces) the secondary algorithm of that priority (1 when not given); a bare `NAME` is
    /// `algo=NAME`.
    pub fn set_recomp_algorithm(&mut self, text: &str) -> Result<(), Error> {
        // A bare name is shorthand for algo=NAME (priority 1).
        let text = if text.contains('=') {
            text.to_string()
        } else {
            format!("algo={}", text.trim())
        };
        let text = text.as_str();
        let p: AlgorithmParams = text.parse()?;
        let algorithm = p.algo.ok_or(Error::InvalidRequest {
            text: text.to_string(),
            why: "algo=NAME is required",
        })?;
        let prio = p.priority.unwrap_or(1);
        if prio == 0 {
            return Err(Error::InvalidRequest {
                text: text.to_string(),
                why: "priority 0 is the primary algorithm (comp_algorithm)",
            });
        }
        let params = p.load_codec_params()?;
        Codec::new(algorithm, params.clone())?;
        self.config.secondary[usize::from(prio) - 1] = Some((algorithm, params));
        Ok(())
    }

    /// Pool memory (bytes, rounded up to 2 MiB arenas) mapped at init and kept mapped.
    pub fn set_pool_reserve(&mut self, bytes: u64) {
        let arena = (uzram_allocator::ARENA_PAGES * PAGE_SIZE) as u64;
        self.config.pool.reserve_arenas = bytes.div_ceil(arena).max(1) as usize;
    }

    /// How the pool gets memory: on demand (the default, for embedders), or from a reserve that
    /// a maintenance thread keeps filled ([`Device::maintain_memory`]), so that the I/O path never
    /// maps memory itself: what a swap device's daemon needs.
    pub fn set_pool_growth(&mut self, growth: Growth) {
        self.config.pool.growth = growth;
    }

    /// The configuration so far.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// zram's `disksize`: initialises the device. The size is rounded up to whole pages, as zram
    /// does; 0 is refused.
    pub fn init(self, disksize: u64) -> Result<Device, Error> {
        Device::new(self.config, disksize)
    }
}

/// Per-thread state for I/O: the codec streams (zram's per-CPU zcomp streams) and scratch
/// buffers, reused for every page. Make one per I/O thread with [`Device::context`].
pub struct IoContext {
    device: u64,
    /// The counter shard this context's event counters (failed I/O) go to.
    shard: usize,
    /// By codec priority; `None` where the device has no codec of that priority.
    streams: Vec<Option<Stream>>,
    /// Compressed bytes, and written-back records read by direct I/O: aligned.
    buf: writeback::AlignedBuf,
    page: Box<[u8; PAGE_SIZE]>,
    /// Eviction's batch buffers (devices with a backing store only).
    evict: Option<writeback::WbBuffers>,
}

impl std::fmt::Debug for IoContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoContext")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// A compressed RAM device: see the crate docs.
pub struct Device {
    id: u64,
    disksize: u64,
    slots: Box<[Slot]>,
    pool: Pool,
    /// By priority; `[0]` is the primary (always there), 1..=3 the recompression algorithms.
    codecs: Vec<Option<Codec>>,
    /// Pages that compress to this many bytes or more are stored raw.
    huge_threshold: usize,
    /// Where written-back pages live.
    backing: Option<writeback::BackingStore>,
    epoch: Instant,
    /// Seconds added to the clock (feature `testing`: `Device::advance_clock`).
    clock_skew: AtomicU32,
    /// The tiering policy's settings, budget and counters.
    tier: policy::Tier,
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
    /// A device of `disksize` bytes (rounded up to whole pages).
    pub fn new(config: DeviceConfig, disksize: u64) -> Result<Device, Error> {
        if disksize == 0 {
            return Err(Error::InvalidSize { text: "0".into() });
        }
        let disksize = disksize.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64;
        let pages = disksize / PAGE_SIZE as u64;
        let table_bytes = pages.saturating_mul(std::mem::size_of::<Slot>() as u64);
        let too_large = || Error::TableTooLarge {
            disksize,
            table_bytes,
        };
        let n = usize::try_from(pages).map_err(|_| too_large())?;
        let mut slots = Vec::new();
        slots.try_reserve_exact(n).map_err(|_| too_large())?;
        slots.resize_with(n, Slot::default);
        let mut codecs = vec![Some(Codec::new(config.algorithm, config.params.clone())?)];
        for secondary in &config.secondary {
            codecs.push(
                secondary
                    .as_ref()
                    .map(|(a, p)| Codec::new(*a, p.clone()))
                    .transpose()?,
            );
        }
        let backing = (!config.backing_devs.is_empty())
            .then(|| writeback::BackingStore::open_all(&config.backing_devs, disksize))
            .transpose()?;
        let pool = Pool::new(config.pool.clone()).map_err(IoError::OutOfMemory)?;
        pool.set_limit(config.mem_limit);
        // zram's rule: an object in the class of whole pages costs a page anyway, so store the
        // page raw (and skip decompression on read).
        let huge_threshold = (1..=PAGE_SIZE)
            .find(|&s| pool.class_size(s) == Ok(PAGE_SIZE))
            .unwrap_or(PAGE_SIZE);
        Ok(Device {
            id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
            disksize,
            slots: slots.into_boxed_slice(),
            pool,
            codecs,
            huge_threshold,
            backing,
            epoch: Instant::now(),
            clock_skew: AtomicU32::new(0),
            tier: policy::Tier::new(config.policy),
            next_shard: AtomicUsize::new(0),
            counters: Counters::new(
                (std::thread::available_parallelism().map_or(1, |n| n.get()) * 4)
                    .next_power_of_two()
                    .max(16),
            ),
        })
    }

    /// The device size in bytes.
    pub fn disksize(&self) -> u64 {
        self.disksize
    }

    /// The number of pages.
    pub fn pages(&self) -> u64 {
        self.slots.len() as u64
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

    /// A context for one I/O thread. Every stream compresses and decompresses one page before
    /// it is returned, so that codecs that allocate their work memory lazily (zstd) have done so:
    /// the I/O path then runs on memory it already holds.
    pub fn context(&self) -> Result<IoContext, Error> {
        Ok(self.new_context()?)
    }

    fn new_context(&self) -> Result<IoContext, uzram_codecs::ConfigError> {
        let streams = self
            .codecs
            .iter()
            .map(|c| c.as_ref().map(Codec::stream).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let mut ctx = IoContext {
            device: self.id,
            shard: self.next_shard.fetch_add(1, Ordering::Relaxed),
            streams,
            buf: writeback::AlignedBuf::new(MAX_COMPRESSED_LEN.max(writeback::READ_WINDOW)),
            page: Box::new([0; PAGE_SIZE]),
            evict: self
                .backing
                .as_ref()
                .map(|_| writeback::WbBuffers::new(policy::EVICT_BATCH)),
        };
        let sample: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7 % 251 / 3) as u8).collect();
        for stream in ctx.streams.iter_mut().flatten() {
            ctx.page.copy_from_slice(&sample);
            if let Ok(n) = stream.compress(&ctx.page, &mut ctx.buf) {
                let _ = stream.decompress(&ctx.buf[..n], &mut ctx.page);
            }
        }
        Ok(ctx)
    }

    /// Gives `ctx` streams for this device if it was made for another one.
    fn adopt(&self, ctx: &mut IoContext) -> Result<(), IoError> {
        if ctx.device != self.id {
            *ctx = self.new_context().map_err(IoError::Context)?;
        }
        Ok(())
    }

    fn now(&self) -> u32 {
        (self.epoch.elapsed().as_secs() as u32)
            .wrapping_add(self.clock_skew.load(Ordering::Relaxed))
    }

    fn slot(&self, index: PageIndex) -> &Slot {
        &self.slots[index.0 as usize]
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
        self.adopt(ctx)?;
        let mut done = 0;
        for (index, in_page, len) in segments(offset, buf.len()) {
            let chunk = &mut buf[done..done + len];
            done += len;
            if let Ok(page) = <&mut [u8; PAGE_SIZE]>::try_from(&mut *chunk) {
                let mut g = self.slot(index).lock();
                self.load(&mut ctx.streams, &mut ctx.buf, index, &mut g, page)?;
            } else {
                let mut g = self.slot(index).lock();
                self.load(&mut ctx.streams, &mut ctx.buf, index, &mut g, &mut ctx.page)?;
                chunk.copy_from_slice(&ctx.page[in_page..in_page + len]);
            }
        }
        Ok(())
    }

    /// Writes `buf` at byte `offset` (both multiples of 512). On failure the pages not yet
    /// written keep their old contents, and so does the page that failed.
    pub fn write(&self, ctx: &mut IoContext, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        let result = self.write_inner(ctx, offset, buf);
        if result.is_err() {
            self.counters.bump(ctx.shard, Field::FailedWrites);
        }
        result
    }

    fn write_inner(&self, ctx: &mut IoContext, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        self.check_range(offset, buf.len() as u64)?;
        self.adopt(ctx)?;
        let mut done = 0;
        for (index, in_page, len) in segments(offset, buf.len()) {
            let chunk = &buf[done..done + len];
            done += len;
            if let Ok(page) = <&[u8; PAGE_SIZE]>::try_from(chunk) {
                // Compress and allocate before taking the slot lock.
                let new = self.encode(
                    &mut ctx.streams,
                    &mut ctx.buf,
                    ctx.evict.as_mut(),
                    index,
                    page,
                )?;
                let mut g = self.slot(index).lock();
                self.replace(index, &mut g, new);
            } else {
                // Read-modify-write under the slot lock, so no other write slips in between.
                let mut g = self.slot(index).lock();
                self.load(&mut ctx.streams, &mut ctx.buf, index, &mut g, &mut ctx.page)?;
                ctx.page[in_page..in_page + len].copy_from_slice(chunk);
                let new = self.encode(
                    &mut ctx.streams,
                    &mut ctx.buf,
                    ctx.evict.as_mut(),
                    index,
                    &ctx.page,
                )?;
                self.replace(index, &mut g, new);
            }
        }
        Ok(())
    }

    /// Discards `len_bytes` at byte `offset`: whole pages in the range are freed and read back
    /// as zeros; partial pages at the ends are left as they are (a discard is a hint), as zram
    /// does. Counts each whole page in `notify_free`, as zram does.
    pub fn discard(&self, offset: u64, len_bytes: u64) -> Result<(), IoError> {
        self.check_range(offset, len_bytes)?;
        for (index, _, len) in segments(offset, len_bytes as usize) {
            if len == PAGE_SIZE {
                self.free_page(index);
            }
        }
        Ok(())
    }

    /// Zeroes `len_bytes` at byte `offset`: whole pages are freed (they read as zeros at no
    /// cost), partial pages at the ends are zeroed by read-modify-write.
    pub fn write_zeroes(
        &self,
        ctx: &mut IoContext,
        offset: u64,
        len_bytes: u64,
    ) -> Result<(), IoError> {
        self.check_range(offset, len_bytes)?;
        let zeros = [0u8; PAGE_SIZE];
        let mut pos = offset;
        for (index, _, len) in segments(offset, len_bytes as usize) {
            if len == PAGE_SIZE {
                self.free_page(index);
            } else {
                self.write(ctx, pos, &zeros[..len])?;
            }
            pos += len as u64;
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
            let peek = self.slot(index).peek();
            if peek.is_empty() || peek.atime >= before_secs {
                continue;
            }
            let mut g = self.slot(index).lock();
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
        let mut g = self.slot(index).lock();
        if !g.get().is_empty() {
            self.replace(index, &mut g, SlotState::default());
        }
        // zram counts every whole page of a discard or write-zeroes, held data or not.
        self.counters.bump(gauge_shard(index), Field::NotifyFree);
    }

    /// Fills `out` with page `index`, whose slot `g` holds locked, and marks it accessed.
    fn load(
        &self,
        streams: &mut [Option<Stream>],
        buf: &mut [u8],
        index: PageIndex,
        g: &mut slot::SlotGuard<'_>,
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), IoError> {
        let mut s = g.get();
        self.decode(streams, buf, index, &s, out)?;
        let now = self.now();
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
        streams: &mut [Option<Stream>],
        buf: &mut [u8],
        index: PageIndex,
        s: &SlotState,
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), IoError> {
        if s.flags.contains(SlotFlags::SAME) {
            fill(out, s.word);
        } else if s.flags.contains(SlotFlags::STORED) {
            let lost = |source| IoError::Lost { index, source };
            let handle = Handle::from_raw(s.word)
                .ok_or(uzram_allocator::Error::InvalidHandle { raw: 0 })
                .map_err(lost)?;
            if s.flags.contains(SlotFlags::HUGE) {
                self.pool.read_into(handle, out).map_err(lost)?;
            } else {
                // Copy the object out and decompress outside the pool's class lock, so threads
                // reading pages of the same size class do not wait on each other's codec.
                let n = self.pool.read_into(handle, buf).map_err(lost)?;
                decompress_with(streams, index, s.prio, &buf[..n], out)?;
            }
        } else if s.flags.contains(SlotFlags::WB) {
            self.load_written_back(streams, buf, index, s, out)?;
        } else {
            out.fill(0);
        }
        Ok(())
    }

    /// Stores `page` (same-filled in the slot, else compressed or raw in the pool) and returns
    /// the slot state that names it. When the pool has no room (its limit, or no memory), cold
    /// pages are evicted to the backing store with `evict`'s buffers and the store retried, a
    /// few rounds at most. Nothing changes on error.
    fn encode(
        &self,
        streams: &mut [Option<Stream>],
        buf: &mut [u8],
        mut evict: Option<&mut writeback::WbBuffers>,
        index: PageIndex,
        page: &[u8; PAGE_SIZE],
    ) -> Result<SlotState, IoError> {
        let atime = self.now();
        if let Some(word) = same_filled(page) {
            return Ok(SlotState {
                word,
                flags: SlotFlags::SAME,
                prio: 0,
                size: 0,
                atime,
            });
        }
        let n = streams[0]
            .as_mut()
            .expect("the primary codec is always there")
            .compress(page, buf)
            .map_err(|source| IoError::Compress { index, source })?;
        let (bytes, flags) = if n >= self.huge_threshold {
            (&page[..], SlotFlags::STORED | SlotFlags::HUGE)
        } else {
            (&buf[..n], SlotFlags::STORED)
        };
        let mut rounds = 0;
        let handle = loop {
            let e = match self.pool.store(bytes) {
                Ok(h) => break h,
                Err(e) => e,
            };
            let no_room = matches!(
                e,
                uzram_allocator::Error::LimitExceeded { .. }
                    | uzram_allocator::Error::ReserveExhausted { .. }
                    | uzram_allocator::Error::OutOfMemory { .. }
            );
            if no_room && rounds < policy::EVICT_TRIES && self.backing.is_some() {
                rounds += 1;
                if self.make_room(evict.as_deref_mut(), bytes.len()) {
                    continue;
                }
            }
            if rounds > 0 {
                self.count_evict_failed();
            }
            return Err(match e {
                uzram_allocator::Error::LimitExceeded { limit_bytes, .. } => {
                    IoError::MemLimit { index, limit_bytes }
                }
                e => IoError::OutOfMemory(e),
            });
        };
        Ok(SlotState {
            word: handle.to_raw(),
            flags,
            prio: 0,
            size: bytes.len() as u16,
            atime,
        })
    }

    /// Puts `new` in the locked slot, frees what it held, and keeps the counters.
    fn replace(&self, index: PageIndex, g: &mut slot::SlotGuard<'_>, new: SlotState) {
        let shard = gauge_shard(index);
        let old = g.set(new);
        // Out before in: a shard's gauges never exceed what its pages hold.
        self.counters.remove(shard, &old);
        self.counters.add(shard, &new);
        if old.flags.contains(SlotFlags::WB) {
            self.free_written_back(&old);
        }
        if old.flags.contains(SlotFlags::STORED) {
            if let Some(h) = Handle::from_raw(old.word) {
                // A handle the slot held is live; failing here would be a pool bug, and the
                // page is already replaced, so count it rather than fail the write.
                if self.pool.free(h).is_err() {
                    self.counters.bump(shard, Field::FreeErrors);
                }
            }
        }
    }

    /// zram's `mem_limit`: sets (or with `None`/0 clears) the limit.
    pub fn set_mem_limit(&self, bytes: Option<u64>) {
        self.pool.set_limit(bytes.filter(|&b| b > 0));
    }

    /// zram's `mem_used_max` reset.
    pub fn reset_mem_used_max(&self) {
        self.pool.reset_max_used();
    }

    /// The maintenance of a [`Growth::Reserve`] pool: maps arenas into the reserve and unmaps
    /// surplus empty ones, outside the I/O path's locks. Call it from a thread that may wait for
    /// reclaim, after [`Device::wait_for_maintenance`].
    pub fn maintain_memory(&self) -> Result<Maintenance, Error> {
        Ok(self.pool.maintain().map_err(IoError::OutOfMemory)?)
    }

    /// Blocks until an I/O asks for pool memory or `timeout` passes.
    pub fn wait_for_maintenance(&self, timeout: std::time::Duration) -> bool {
        self.pool.wait_for_maintenance(timeout)
    }

    /// zram's `compact`: compacts the pool. Returns pages freed.
    pub fn compact(&self) -> u64 {
        self.pool.compact().pages_freed
    }

    /// zram's `orig_data_size` and `mem_used_total`, read without taking any lock (for a
    /// watchdog that must keep reporting while the I/O path is stuck).
    pub fn usage(&self) -> (u64, u64) {
        let page = PAGE_SIZE as u64;
        (
            self.counters.totals().pages_stored * page,
            self.pool.pages_used() * page,
        )
    }

    /// Everything counted, at once.
    pub fn stats(&self) -> DeviceStats {
        let pool = self.pool.stats();
        let c = self.counters.totals();
        let page = PAGE_SIZE as u64;
        DeviceStats {
            mm: MmStat {
                orig_data_size: c.pages_stored * page,
                compr_data_size: c.compr_data_size,
                mem_used_total: pool.pages_used * page,
                mem_limit: pool.limit_pages * page,
                mem_used_max: pool.max_pages_used * page,
                same_pages: c.same_pages,
                pages_compacted: pool.pages_compacted,
                huge_pages: c.huge_pages,
                huge_pages_since: c.huge_pages_since,
            },
            io: IoStat {
                failed_reads: c.failed_reads,
                failed_writes: c.failed_writes,
                notify_free: c.notify_free,
            },
            table_bytes: (self.slots.len() * std::mem::size_of::<Slot>()) as u64
                + pool.metadata_bytes,
            pool_mapped_bytes: pool.pages_mapped * page,
            stored_pages: c.stored_pages,
        }
    }

    /// zram's `mm_stat` line.
    pub fn mm_stat(&self) -> String {
        self.stats().mm.to_string()
    }

    /// zram's `io_stat` line.
    pub fn io_stat(&self) -> String {
        self.stats().io.to_string()
    }

    /// The state of page `index`'s slot (racy: for tests and tools).
    pub fn slot_state(&self, index: PageIndex) -> Option<SlotState> {
        self.slots.get(index.0 as usize).map(Slot::peek)
    }

    /// Checks the slot table against the pool and the counters: every stored slot's handle is
    /// live with the recorded size, and the counters add up. Needs a quiescent device.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut expect = Totals::default();
        for (i, slot) in self.slots.iter().enumerate() {
            let s = slot.peek();
            expect.add(&s);
            if s.flags.contains(SlotFlags::STORED) {
                let h =
                    Handle::from_raw(s.word).ok_or(format!("page {i}: stored with handle 0"))?;
                let size = self
                    .pool
                    .object_size(h)
                    .map_err(|e| format!("page {i}: {e}"))?;
                if size != usize::from(s.size) {
                    return Err(format!("page {i}: slot says {} bytes, pool {size}", s.size));
                }
                if s.flags.contains(SlotFlags::HUGE) != (size == PAGE_SIZE) {
                    return Err(format!("page {i}: HUGE flag disagrees with size {size}"));
                }
            } else if s.flags.contains(SlotFlags::HUGE) && !s.flags.contains(SlotFlags::WB) {
                return Err(format!("page {i}: HUGE without STORED"));
            }
        }
        let c = self.counters.totals();
        let pairs = [
            ("pages_stored", expect.pages_stored, c.pages_stored),
            ("stored_pages", expect.stored_pages, c.stored_pages),
            ("compr_data_size", expect.compr_data_size, c.compr_data_size),
            ("same_pages", expect.same_pages, c.same_pages),
            ("huge_pages", expect.huge_pages, c.huge_pages),
        ];
        for (name, want, got) in pairs {
            if want != got {
                return Err(format!("{name}: counter {got}, slots add up to {want}"));
            }
        }
        let objects = self.pool.stats().objects;
        if objects != c.stored_pages {
            return Err(format!(
                "pool holds {objects} objects for {} stored pages",
                c.stored_pages
            ));
        }
        Ok(())
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
mod tests {
    use super::testutil::noise_page;
    use super::*;

    fn device(pages: u64) -> (Device, IoContext) {
        let d = DeviceSetup::new().init(pages * PAGE_SIZE as u64).unwrap();
        let ctx = d.context().unwrap();
        (d, ctx)
    }

    fn text_page(seed: u8) -> [u8; PAGE_SIZE] {
        crate::testing::pages::text_page(seed.into())
    }

    /// Compares pages without printing 4 KiB arrays on failure.
    fn assert_page(got: &[u8], want: &[u8]) {
        if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!("pages differ first at byte {i}: {} != {}", got[i], want[i]);
        }
        assert_eq!(got.len(), want.len());
    }

    #[test]
    fn segments_cover_the_range_page_by_page() {
        let s: Vec<_> = segments(3584, 5120).collect();
        assert_eq!(
            s,
            vec![
                (PageIndex(0), 3584, 512),
                (PageIndex(1), 0, 4096),
                (PageIndex(2), 0, 512)
            ]
        );
        assert_eq!(segments(0, 0).count(), 0);
    }

    #[test]
    fn same_filled_detection() {
        assert_eq!(same_filled(&[0; PAGE_SIZE]), Some(0));
        let mut p = [0u8; PAGE_SIZE];
        fill(&mut p, 0x0102_0304_0506_0708);
        assert_eq!(same_filled(&p), Some(0x0102_0304_0506_0708));
        p[2000] ^= 1;
        assert_eq!(same_filled(&p), None);
    }

    #[test]
    fn pages_round_trip_by_kind() {
        let (d, mut ctx) = device(8);
        let text = text_page(1);
        let noise = crate::testing::pages::noise_page(0x9e37_79b9_7f4a_7c15);
        let mut same = [0u8; PAGE_SIZE];
        fill(&mut same, 0xabab_abab_abab_abab);
        d.write(&mut ctx, 0, &text).unwrap();
        d.write(&mut ctx, 4096, &noise).unwrap();
        d.write(&mut ctx, 8192, &same).unwrap();
        let mut out = [0u8; PAGE_SIZE];
        for (i, want) in [text, noise, same, [0; PAGE_SIZE]].iter().enumerate() {
            d.read(&mut ctx, i as u64 * 4096, &mut out).unwrap();
            assert_page(&out, want);
        }
        let st = d.stats().mm;
        assert_eq!(
            (st.same_pages, st.huge_pages, st.huge_pages_since),
            (1, 1, 1)
        );
        assert_eq!(st.orig_data_size, 3 * 4096);
        assert!(d
            .slot_state(PageIndex(1))
            .unwrap()
            .flags
            .contains(SlotFlags::HUGE));
        d.check_invariants().unwrap();
    }

    #[test]
    fn partial_writes_read_modify_write() {
        let (d, mut ctx) = device(4);
        let text = text_page(3);
        d.write(&mut ctx, 0, &text).unwrap();
        d.write(&mut ctx, 512, &[7u8; 1024]).unwrap();
        let mut out = [0u8; PAGE_SIZE];
        d.read(&mut ctx, 0, &mut out).unwrap();
        let mut want = text;
        want[512..1536].fill(7);
        assert_page(&out, &want);
        let mut part = [0u8; 512];
        d.read(&mut ctx, 1024, &mut part).unwrap();
        assert_eq!(part[..], want[1024..1536]);
        d.check_invariants().unwrap();
    }

    #[test]
    fn discard_and_write_zeroes_free_pages() {
        let (d, mut ctx) = device(4);
        for i in 0..4u8 {
            d.write(&mut ctx, u64::from(i) * 4096, &text_page(i))
                .unwrap();
        }
        d.discard(2048, 4096 + 2048).unwrap();
        assert_eq!(
            d.stats().io.notify_free,
            1,
            "only the whole page 1 is freed"
        );
        d.write_zeroes(&mut ctx, 8192 + 512, 4096 + 512).unwrap();
        let mut out = [0u8; PAGE_SIZE];
        d.read(&mut ctx, 4096, &mut out).unwrap();
        assert_eq!(out, [0; PAGE_SIZE]);
        d.read(&mut ctx, 8192, &mut out).unwrap();
        let mut want = text_page(2);
        want[512..].fill(0);
        assert_page(&out, &want);
        d.read(&mut ctx, 3 * 4096, &mut out).unwrap();
        let mut want = text_page(3);
        want[..1024].fill(0);
        assert_page(&out, &want);
        d.check_invariants().unwrap();
        assert_eq!(
            d.stats().mm.orig_data_size,
            3 * 4096,
            "pages 0, 2 and 3 hold data"
        );
    }

    #[test]
    fn bad_ranges_are_errors_and_count() {
        let (d, mut ctx) = device(2);
        let mut buf = [1u8; 512];
        assert!(matches!(
            d.read(&mut ctx, 8192, &mut buf),
            Err(IoError::OutOfRange { .. })
        ));
        assert_eq!(buf, [0; 512], "a failed read leaves no stale bytes");
        assert!(matches!(
            d.read(&mut ctx, 100, &mut buf),
            Err(IoError::Misaligned { .. })
        ));
        assert!(matches!(
            d.write(&mut ctx, u64::MAX - 511, &buf),
            Err(IoError::OutOfRange { .. })
        ));
        assert!(matches!(
            d.discard(4096, 8192),
            Err(IoError::OutOfRange { .. })
        ));
        let io = d.stats().io;
        assert_eq!((io.failed_reads, io.failed_writes), (2, 1));
    }

    #[test]
    fn algorithm_is_fixed_once_initialised() {
        let mut setup = DeviceSetup::new();
        setup.set_comp_algorithm("zstd").unwrap();
        setup.set_algorithm_params("level=5").unwrap();
        let err = setup.set_comp_algorithm("lzo").unwrap_err();
        assert!(err.to_string().contains("lz4"), "{err}");
        assert!(setup.set_algorithm_params("level=99").is_err());
        let d = setup.init(10_000).unwrap();
        assert_eq!(d.algorithm(), Algorithm::Zstd);
        assert_eq!(d.codec().level(), 5);
        assert_eq!(d.disksize(), 12_288, "rounded up to pages");
        assert!(DeviceSetup::new().init(0).is_err());
    }

    #[test]
    fn memory_limit_refuses_writes_and_keeps_old_contents() {
        let (d, mut ctx) = device(1024);
        d.set_mem_limit(Some(64 * 4096));
        // Incompressible pages take one pool page each: the 65th does not fit.
        for i in 0..64 {
            d.write(&mut ctx, i * 4096, &noise_page(i)).unwrap();
        }
        let err = d.write(&mut ctx, 64 * 4096, &noise_page(64)).unwrap_err();
        assert!(
            matches!(err, IoError::MemLimit { index, limit_bytes } if limit_bytes == 64 * 4096 && index == PageIndex(64)),
            "{err}"
        );
        // Overwriting a page past the limit fails too, and the old page survives.
        assert!(matches!(
            d.write(&mut ctx, 0, &noise_page(99)),
            Err(IoError::MemLimit { .. })
        ));
        let mut out = [0u8; PAGE_SIZE];
        d.read(&mut ctx, 0, &mut out).unwrap();
        assert_page(&out, &noise_page(0));
        let st = d.stats();
        assert_eq!(st.mm.mem_used_total, 64 * 4096);
        assert_eq!(st.mm.orig_data_size, 64 * 4096);
        assert_eq!(st.io.failed_writes, 2);
        // Same-filled pages cost no pool memory and still go through.
        d.write(&mut ctx, 100 * 4096, &[0u8; PAGE_SIZE]).unwrap();
        // Freeing makes room again.
        d.discard(0, 4096).unwrap();
        d.write(&mut ctx, 64 * 4096, &noise_page(64)).unwrap();
        d.check_invariants().unwrap();
    }

    #[test]
    fn free_pages_older_than_keeps_newer_pages_and_page_zero() {
        let d = DeviceSetup::new().init(64 * PAGE_SIZE as u64).unwrap();
        let mut ctx = d.context().unwrap();
        for i in 0..8u64 {
            d.write(&mut ctx, i * PAGE_SIZE as u64, &[i as u8 + 1; PAGE_SIZE])
                .unwrap();
        }
        // Everything was written in second 0: a cutoff of 0 frees nothing, 1 frees all but page 0.
        assert_eq!(d.free_pages_older_than(PageIndex(1), 0), 0);
        assert_eq!(d.free_pages_older_than(PageIndex(1), d.clock_secs() + 1), 7);
        let mut back = vec![0u8; PAGE_SIZE];
        d.read(&mut ctx, 0, &mut back).unwrap();
        assert_eq!(back, vec![1u8; PAGE_SIZE]);
        d.read(&mut ctx, PAGE_SIZE as u64, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0));
        assert_eq!(d.stats().mm.orig_data_size, PAGE_SIZE as u64);
        d.check_invariants().unwrap();
    }
}
