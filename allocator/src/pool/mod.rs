//! The pool: size classes of zspages carved from arenas, handles with one level of indirection,
//! fullness groups, compaction and the memory limit.
//!
//! Lock order: a class lock, then the arena lock. Never two class locks at once; never a class lock
//! taken while the arena lock is held. The reserve signal's lock ([`Growth::Reserve`]) comes after
//! a class lock and before the arena lock; the maintenance side holds it alone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::class::{ClassSpec, ClassTable, MAX_OBJECT};
use crate::mem::{ArenaSet, Prefault, Region, Source, ARENA_PAGES, PAGE_SIZE};
use crate::Error;

mod adopt;
mod class_state;
mod compact;
mod persist;
mod reserve;

pub use self::class_state::FULLNESS_GROUPS;
use self::class_state::{ClassState, Shared, AUTO_COMPACT_MOVES};
use self::reserve::{Demand, RefillPatience, RefillWait, ReserveSignal, RESERVE_WAIT_CAP};

/// Largest zspage the pool accepts in its configuration.
pub const MAX_PAGES_PER_ZSPAGE: usize = 16;

/// An opaque reference to an object in a [`Pool`]. Never 0, so `Option<Handle>` is one word.
///
/// Only the low 48 bits of [`Handle::to_raw`] are ever set, so an embedder may keep flags in the
/// top 16 bits of the word it stores a handle in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle(std::num::NonZeroU64);

const HANDLE_CLASS_SHIFT: u32 = 32;

impl Handle {
    fn new(class: usize, local: u32) -> Handle {
        let raw = ((class as u64) << HANDLE_CLASS_SHIFT) | (u64::from(local) + 1);
        Handle(std::num::NonZeroU64::new(raw).expect("local + 1 is never 0"))
    }

    /// The handle as a word (never 0, at most 48 bits).
    pub fn to_raw(self) -> u64 {
        self.0.get()
    }

    /// A handle from a word made by [`Handle::to_raw`]. The pool validates handles on use, so a
    /// wrong word gives [`Error::InvalidHandle`], never undefined behaviour.
    pub fn from_raw(raw: u64) -> Option<Handle> {
        std::num::NonZeroU64::new(raw).map(Handle)
    }

    fn class(self) -> usize {
        (self.0.get() >> HANDLE_CLASS_SHIFT) as usize
    }

    fn local(self) -> Option<u32> {
        let low = (self.0.get() & 0xffff_ffff) as u32;
        low.checked_sub(1)
    }
}

/// Tunables of a [`Pool`].
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Longest zspage, in pages (1..=16). Longer zspages waste less per class but hold memory in
    /// larger units.
    pub max_pages_per_zspage: usize,
    /// Memory limit in bytes of zspage pages (zram's `mem_limit`); `None` for no limit.
    pub limit_bytes: Option<u64>,
    /// Compact a class by itself, a bounded step at a time, when frees leave it fragmented.
    pub auto_compact: bool,
    /// Empty arenas kept mapped instead of returned to the OS; this many are mapped when the
    /// pool is created, so the first growth needs nothing from the kernel. In
    /// [`Growth::Reserve`] mode the most the reserve grows to under a burst of allocations.
    pub reserve_arenas: usize,
    /// [`Growth::Reserve`] mode: the reserve a pool starts with and shrinks back to when
    /// allocations stop taking arenas (at most `reserve_arenas`); between the two it follows
    /// demand (see [`Pool::maintain`]). With 0 a fresh or idle pool maps nothing: the first
    /// allocation that finds no room in the arenas there waits for the maintenance thread to
    /// map one (a wait, not a failure, unless that thread is stuck). Unused on demand.
    pub reserve_min_arenas: usize,
    /// How the pool gets memory from the OS.
    pub growth: Growth,
    /// Arenas in this memfd region instead of anonymous memory, so that a successor process can
    /// adopt the pool (see [`Region`]); `None` for anonymous arenas.
    pub region: Option<Region>,
}

/// How a [`Pool`] gets memory from the OS and gives it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// An allocation that finds no room maps a new arena itself (`MAP_POPULATE`); a free that
    /// empties an arena beyond the reserve unmaps it. The right choice for a library user.
    OnDemand,
    /// Allocations and frees never map or unmap: they draw on empty arenas mapped ahead of time by
    /// a maintenance thread that calls [`Pool::maintain`] (woken through
    /// [`Pool::wait_for_maintenance`] as soon as an arena of the reserve is taken, or, with a
    /// reserve kept at 0, when an allocation finds no room). An
    /// allocation that finds no room waits for a refill as long as the maintenance thread keeps
    /// faulting pages in, giving up after `wait` without progress (or 8 times `wait` in all),
    /// and then fails with [`Error::ReserveExhausted`]. For a swap device's I/O threads, which
    /// must never wait for reclaim (the memory they would wait for is what their own writes
    /// free).
    Reserve {
        /// Longest an allocation waits for the maintenance thread.
        wait: Duration,
    },
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            max_pages_per_zspage: 8,
            limit_bytes: None,
            auto_compact: true,
            reserve_arenas: 1,
            reserve_min_arenas: 1,
            growth: Growth::OnDemand,
            region: None,
        }
    }
}

/// Pool-wide figures. Pages are 4 KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pages held by zspages (zram's `mem_used_total` / 4096).
    pub pages_used: u64,
    /// Highest `pages_used` since creation or the last [`Pool::reset_max_used`].
    pub max_pages_used: u64,
    /// Pages in mapped arenas: the pool's real cost in RAM (>= `pages_used`).
    pub pages_mapped: u64,
    /// Pages of `pages_mapped` in arenas with nothing in them: the reserve.
    pub pages_reserved: u64,
    /// Pages the reserve is kept at now ([`Growth::Reserve`] follows demand between its least
    /// and its most; on demand, the configured reserve).
    pub pages_reserve_target: u64,
    /// Zspage pages freed by compaction (zram's `pages_compacted`).
    pub pages_compacted: u64,
    /// Arena pages returned to the OS by compaction moving zspages out of sparse arenas.
    pub pages_released: u64,
    /// Live objects.
    pub objects: u64,
    /// Sum of the live objects' sizes as allocated.
    pub object_bytes: u64,
    /// Bookkeeping outside the pool's pages: handle tables, back-pointers, zspage and arena records.
    pub metadata_bytes: u64,
    /// The memory limit in pages (0 = none).
    pub limit_pages: u64,
}

/// One row of the per-class table, like zsmalloc's debugfs `classes` file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Index of the class.
    pub index: usize,
    /// Slot size.
    pub size: usize,
    /// Zspages by fill ratio: `[0]` < 10 %, ..., `[9]` < 100 %, `[10]` full.
    pub by_fullness: [u64; FULLNESS_GROUPS],
    /// Object slots in this class's zspages.
    pub obj_allocated: u64,
    /// Live objects.
    pub obj_used: u64,
    /// Pages held by this class's zspages.
    pub pages_used: u64,
    /// Pages in one zspage.
    pub pages_per_zspage: usize,
    /// Zspages that compaction could free.
    pub freeable: u64,
}

/// Result of a compaction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// Zspage pages freed by moving objects together.
    pub pages_freed: u64,
    /// Arena pages returned to the OS by moving zspages together.
    pub pages_released: u64,
}

/// What one [`Pool::maintain`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Maintenance {
    /// Arenas mapped into the reserve.
    pub arenas_mapped: usize,
    /// Empty arenas unmapped: those beyond twice the reserve, or beyond the reserve in a round
    /// that shrank it.
    pub arenas_unmapped: usize,
    /// The reserve's size in arenas after this round.
    pub reserve_target: usize,
}

/// A pool of compressed objects: see the crate docs.
pub struct Pool {
    table: ClassTable,
    /// Not cache-padded: a `ClassState` spans several cache lines, so neighbouring classes' locks
    /// never share one.
    classes: Box<[Mutex<ClassState>]>,
    arenas: Mutex<ArenaSet>,
    pages_used: AtomicU64,
    max_pages_used: AtomicU64,
    limit_pages: AtomicU64,
    pages_compacted: AtomicU64,
    pages_released: AtomicU64,
    /// Compact a class as its frees fragment it (`PoolConfig::auto_compact`).
    auto_compact: bool,
    defrag_running: AtomicBool,
    growth: Growth,
    /// On demand: the reserve. In reserve mode: its most (the target lives in `signal`).
    reserve_arenas: usize,
    /// Reserve mode: the least the reserve shrinks back to.
    reserve_min: usize,
    signal: ReserveSignal,
    /// Reserve mode: the maintenance thread's record of demand.
    demand: Mutex<Demand>,
    /// Reserve mode: the host's memory is short ([`Pool::set_memory_short`]).
    memory_short: AtomicBool,
    /// The memfd the pool lives in, when it does (see [`Region`]).
    region: Option<Region>,
    /// Handed over ([`Pool::leave`]): dropping it leaves the region whole.
    left: bool,
}

impl Pool {
    /// A pool with the given configuration.
    pub fn new(config: PoolConfig) -> Result<Pool, Error> {
        let (pool, premapped, prefault) = Pool::build(&config)?;
        pool.premap(premapped, prefault)?;
        Ok(pool)
    }

    fn premap(&self, premapped: usize, prefault: Prefault) -> Result<(), Error> {
        self.arenas
            .lock()
            .premap(premapped, prefault)
            .map_err(|errno| Error::OutOfMemory {
                bytes: (premapped * ARENA_PAGES * PAGE_SIZE) as u64,
                errno,
            })
    }

    /// A pool with no memory yet, the reserve to map and how.
    fn build(config: &PoolConfig) -> Result<(Pool, usize, Prefault), Error> {
        if !(1..=MAX_PAGES_PER_ZSPAGE).contains(&config.max_pages_per_zspage) {
            return Err(Error::InvalidConfig {
                what: "max_pages_per_zspage",
                value: config.max_pages_per_zspage as u64,
            });
        }
        let table = ClassTable::new(config.max_pages_per_zspage);
        let classes = table
            .classes()
            .iter()
            .enumerate()
            .map(|(i, &spec)| Mutex::new(ClassState::new(i, spec, config.region.as_ref())))
            .collect();
        let on_demand = config.growth == Growth::OnDemand;
        let reserve_arenas = if on_demand {
            config.reserve_arenas
        } else {
            config.reserve_arenas.max(1)
        };
        let reserve_min = config.reserve_min_arenas.min(reserve_arenas.max(1));
        let premapped = if on_demand {
            reserve_arenas
        } else {
            reserve_min
        };
        let pool = Pool {
            table,
            classes,
            arenas: Mutex::new(ArenaSet::with_source(
                reserve_arenas,
                on_demand,
                config
                    .region
                    .clone()
                    .map(Source::region)
                    .unwrap_or_default(),
            )),
            pages_used: AtomicU64::new(0),
            max_pages_used: AtomicU64::new(0),
            limit_pages: AtomicU64::new(0),
            pages_compacted: AtomicU64::new(0),
            pages_released: AtomicU64::new(0),
            auto_compact: config.auto_compact,
            defrag_running: AtomicBool::new(false),
            growth: config.growth,
            reserve_arenas,
            reserve_min,
            signal: ReserveSignal::with_target(premapped),
            demand: Mutex::new(Demand::default()),
            memory_short: AtomicBool::new(false),
            region: config.region.clone(),
            left: false,
        };
        pool.set_limit(config.limit_bytes);
        let prefault = if on_demand {
            Prefault::Populate
        } else {
            Prefault::Touch
        };
        Ok((pool, premapped, prefault))
    }

    fn shared(&self) -> Shared<'_> {
        Shared {
            arenas: &self.arenas,
            reserve: match self.growth {
                Growth::OnDemand => None,
                // Asked as soon as an arena of the reserve is taken: the maintenance thread
                // then has the whole reserve's worth of writes to map the next one in.
                Growth::Reserve { .. } => Some(&self.signal),
            },
            pages_used: &self.pages_used,
            max_pages_used: &self.max_pages_used,
            limit_pages: &self.limit_pages,
            pages_compacted: &self.pages_compacted,
        }
    }

    fn check_size(size: usize) -> Result<(), Error> {
        if (1..=MAX_OBJECT).contains(&size) {
            Ok(())
        } else {
            Err(Error::InvalidSize {
                size,
                max: MAX_OBJECT,
            })
        }
    }

    fn class(&self, h: Handle) -> Result<&Mutex<ClassState>, Error> {
        self.classes
            .get(h.class())
            .ok_or(Error::InvalidHandle { raw: h.to_raw() })
    }

    /// Allocates an object of `size` bytes (1..=4096). Its contents are unspecified until written.
    pub fn alloc(&self, size: usize) -> Result<Handle, Error> {
        Self::check_size(size)?;
        Ok(self.alloc_locked(size, RefillPatience::Own)?.1)
    }

    /// Allocates an object holding `data` (1..=4096 bytes) under one lock acquisition.
    pub fn store(&self, data: &[u8]) -> Result<Handle, Error> {
        self.store_with(data, RefillPatience::Own)
    }

    /// [`Pool::store`], but in [`Growth::Reserve`] mode a wait for the maintenance thread runs
    /// out after `wait` without progress (at most [`RESERVE_WAIT_CAP`] times it) instead of the
    /// pool's own: for a writer that keeps what failed and tries again later, so it is better
    /// told at once than held.
    pub fn store_within(&self, data: &[u8], wait: Duration) -> Result<Handle, Error> {
        self.store_with(data, RefillPatience::For(wait))
    }

    /// [`Pool::store`], but in [`Growth::Reserve`] mode an allocation that finds no room waits
    /// at most `wait` in all for the maintenance thread to map an arena, then fails with
    /// [`Error::ReserveExhausted`], whatever earlier waits did. For a caller that can put the
    /// write off and try again shortly (a block device's server keeps the request and serves
    /// others meanwhile) and judges by [`Pool::upkeep_progress`] when to give up.
    pub fn store_for(&self, data: &[u8], wait: Duration) -> Result<Handle, Error> {
        self.store_with(data, RefillPatience::Slice(wait))
    }

    /// [`Pool::store`], but in [`Growth::Reserve`] mode it never waits for the maintenance
    /// thread: with no room in the mapped arenas it fails at once with
    /// [`Error::ReserveExhausted`] (and asks for a refill). For an optional store, such as a
    /// copy kept to spare a later read, that must not hold up the caller.
    pub fn try_store(&self, data: &[u8]) -> Result<Handle, Error> {
        self.store_with(data, RefillPatience::None)
    }

    fn store_with(&self, data: &[u8], wait: RefillPatience) -> Result<Handle, Error> {
        Self::check_size(data.len())?;
        let (mut class, h) = self.alloc_locked(data.len(), wait)?;
        class
            .object_mut(h)
            .expect("just allocated")
            .copy_from_slice(data);
        Ok(h)
    }

    /// Allocates in `size`'s class and returns the class still locked. In reserve mode, with
    /// `wait`, waits (without the class lock) for the maintenance
    /// thread when no arena has room.
    fn alloc_locked(
        &self,
        size: usize,
        wait_for_refill: RefillPatience,
    ) -> Result<(parking_lot::MutexGuard<'_, ClassState>, Handle), Error> {
        let class = &self.classes[self.table.class_of(size)];
        let mut started: Option<(Instant, RefillWait)> = None;
        let mut slice_start: Option<Instant> = None;
        loop {
            let mut c = class.lock();
            match c.alloc(size, &self.shared()) {
                Ok(h) => return Ok((c, h)),
                Err(e @ Error::ReserveExhausted { .. })
                    if wait_for_refill == RefillPatience::None =>
                {
                    return Err(e)
                }
                Err(Error::ReserveExhausted { .. }) => {
                    drop(c);
                    if let RefillPatience::Slice(slice) = wait_for_refill {
                        let start = *slice_start.get_or_insert_with(Instant::now);
                        if !self.wait_for_refill_until(start + slice) {
                            return Err(Error::ReserveExhausted {
                                waited_ms: start.elapsed().as_millis() as u64,
                            });
                        }
                        continue;
                    }
                    let Growth::Reserve { wait: own } = self.growth else {
                        unreachable!("only reserve mode runs out of reserve")
                    };
                    let wait = match wait_for_refill {
                        RefillPatience::For(w) => w,
                        _ => own,
                    };
                    let (start, w) = started.get_or_insert_with(|| {
                        let now = Instant::now();
                        let w = RefillWait {
                            deadline: now + wait,
                            cap: now + wait * RESERVE_WAIT_CAP,
                            progress: self.signal.touched.load(Ordering::Relaxed),
                            wait,
                        };
                        (now, w)
                    });
                    if !self.wait_for_refill(w) {
                        return Err(Error::ReserveExhausted {
                            waited_ms: start.elapsed().as_millis() as u64,
                        });
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Frees an object. May compact its class by a bounded step when frees have fragmented it.
    pub fn free(&self, h: Handle) -> Result<(), Error> {
        let zspage_freed = {
            let mut class = self.class(h)?.lock();
            let shared = self.shared();
            let freed = class.free(h, &shared)?;
            if self.auto_compact && class.fragmented() {
                class.compact(AUTO_COMPACT_MOVES, &shared);
            }
            freed
        };
        if zspage_freed > 0 && self.auto_compact {
            self.maybe_defrag();
        }
        Ok(())
    }

    /// Calls `f` with the object's bytes (exactly the size it was allocated with). The class lock is
    /// held meanwhile, so keep `f` short (a memcpy or one decompression).
    pub fn read<R>(&self, h: Handle, f: impl FnOnce(&[u8]) -> R) -> Result<R, Error> {
        let class = self.class(h)?.lock();
        Ok(f(class.object(h)?))
    }

    /// Copies the object into the start of `dst` and returns its size; `dst` must be large enough.
    pub fn read_into(&self, h: Handle, dst: &mut [u8]) -> Result<usize, Error> {
        let class = self.class(h)?.lock();
        let obj = class.object(h)?;
        let len = dst.len();
        let dst = dst.get_mut(..obj.len()).ok_or(Error::BufferTooSmall {
            len,
            size: obj.len(),
        })?;
        dst.copy_from_slice(obj);
        Ok(obj.len())
    }

    /// Overwrites the start of the object with `data` (at most the object's size).
    pub fn write(&self, h: Handle, data: &[u8]) -> Result<(), Error> {
        let mut class = self.class(h)?.lock();
        let obj = class.object_mut(h)?;
        let size = obj.len();
        obj.get_mut(..data.len())
            .ok_or(Error::WriteTooLong {
                len: data.len(),
                size,
            })?
            .copy_from_slice(data);
        Ok(())
    }

    /// The size an object was allocated with.
    pub fn object_size(&self, h: Handle) -> Result<usize, Error> {
        Ok(self.class(h)?.lock().lookup(h)?.2)
    }

    /// The slot size an object of `size` bytes would occupy (its class's size).
    pub fn class_size(&self, size: usize) -> Result<usize, Error> {
        Self::check_size(size)?;
        Ok(self.table.classes()[self.table.class_of(size)].size)
    }

    /// Whether an object of `size` bytes would fit in a zspage the pool has (false: storing it
    /// would take new pages). A moment's answer: another store may take the room meanwhile.
    pub fn has_room_for(&self, size: usize) -> bool {
        Self::check_size(size).is_ok()
            && self.classes[self.table.class_of(size)]
                .lock()
                .fullest_partial(None)
                .is_some()
    }

    /// The size classes, smallest first.
    pub fn classes(&self) -> &[ClassSpec] {
        self.table.classes()
    }

    /// Sets (or with `None` clears) the memory limit, in bytes of zspage pages, rounded down to
    /// pages. Lowering it below current use frees nothing; it only makes further growth fail.
    pub fn set_limit(&self, limit_bytes: Option<u64>) {
        let pages = limit_bytes.map_or(0, |b| (b / PAGE_SIZE as u64).max(1));
        self.limit_pages.store(pages, Ordering::Relaxed);
    }

    /// Resets the high watermark of pages used to the current use (zram's `mem_used_max` reset).
    pub fn reset_max_used(&self) {
        self.max_pages_used
            .store(self.pages_used.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Pool-wide figures.
    pub fn stats(&self) -> PoolStats {
        let mut objects = 0;
        let mut object_bytes = 0;
        let mut metadata = std::mem::size_of::<Pool>()
            + self.classes.len() * std::mem::size_of::<Mutex<ClassState>>();
        for class in self.classes.iter() {
            let c = class.lock();
            objects += c.obj_used as u64;
            object_bytes += c.object_bytes as u64;
            metadata += c.metadata_bytes();
        }
        let (pages_mapped, pages_reserved, arena_meta) = {
            let a = self.arenas.lock();
            (
                a.mapped_pages() as u64,
                (a.empty_arenas() * ARENA_PAGES) as u64,
                a.metadata_bytes(),
            )
        };
        PoolStats {
            pages_used: self.pages_used.load(Ordering::Relaxed),
            max_pages_used: self.max_pages_used.load(Ordering::Relaxed),
            pages_mapped,
            pages_reserved,
            pages_reserve_target: (self.reserve_target() * ARENA_PAGES) as u64,
            pages_compacted: self.pages_compacted.load(Ordering::Relaxed),
            pages_released: self.pages_released.load(Ordering::Relaxed),
            objects,
            object_bytes,
            metadata_bytes: (metadata + arena_meta) as u64,
            limit_pages: self.limit_pages.load(Ordering::Relaxed),
        }
    }

    /// Lets go of a pool in a region without giving its memory back: its arenas are unmapped
    /// from this process but stay in the region, whole, with the tables, for a successor's
    /// [`Pool::adopt`] (a handover; a process that dies leaves the same). A pool not in a
    /// region is dropped.
    pub fn leave(mut self) {
        self.arenas.lock().keep_in_region();
        self.left = true;
        drop(self);
    }

    /// Every live object's handle (for a successor that collects the objects nobody names).
    pub fn handles(&self) -> Vec<Handle> {
        let mut out = Vec::new();
        for class in self.classes.iter() {
            class.lock().live_handles(&mut out);
        }
        out
    }

    /// The region the pool lives in, if it is in one.
    pub fn region(&self) -> Option<&Region> {
        self.region.as_ref()
    }

    /// Pages held by zspages (cheap: one atomic load).
    pub fn pages_used(&self) -> u64 {
        self.pages_used.load(Ordering::Relaxed)
    }

    /// One row per class, like zsmalloc's debugfs `classes`.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        self.classes.iter().map(|c| c.lock().stats()).collect()
    }

    /// Verifies every internal invariant (free lists, fullness groups, handle back-pointers, page
    /// counts, arena bitmaps). Takes every lock in order; meant for tests and fuzzing.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut pages = 0;
        for class in self.classes.iter() {
            let c = class.lock();
            c.check(&self.arenas.lock())?;
            pages += (c.live_zspages * c.spec.pages_per_zspage) as u64;
        }
        let a = self.arenas.lock();
        a.check()?;
        let used = self.pages_used.load(Ordering::Relaxed);
        if pages != used || a.used_pages() as u64 != used {
            return Err(format!(
                "pages_used {used}, zspages hold {pages}, arenas mark {}",
                a.used_pages()
            ));
        }
        if self.max_pages_used.load(Ordering::Relaxed) < used {
            return Err("max_pages_used below pages_used".into());
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Some(region) = &self.region {
            if !self.left {
                // Before any arena goes: a successor must not adopt tables whose objects are
                // being given back.
                region.close();
            }
        }
        // Give every run back before the arena set unmaps (see mem's soundness notes).
        let arenas = self.arenas.get_mut();
        for class in self.classes.iter_mut() {
            for z in class.get_mut().zspages.iter_mut().filter_map(Option::take) {
                arenas.free_run(z.run);
            }
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests;
