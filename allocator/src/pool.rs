//! The pool: size classes of zspages carved from arenas, handles with one level of indirection,
//! fullness groups, compaction and the memory limit.
//!
//! Lock order: a class lock, then the arena lock. Never two class locks at once; never a class lock
//! taken while the arena lock is held. The reserve signal's lock ([`Growth::Reserve`]) comes after
//! a class lock and before the arena lock; the maintenance side holds it alone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::class::{ClassSpec, ClassTable, MAX_OBJECT};
use crate::mem::{
    ArenaSet, MapError, Mapping, PageRun, Placement, Prefault, ARENA_PAGES, PAGE_SIZE,
};
use crate::table::Table;
use crate::Error;

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
    /// pool is created, so the first growth needs nothing from the kernel.
    pub reserve_arenas: usize,
    /// How the pool gets memory from the OS.
    pub growth: Growth,
}

/// How a [`Pool`] gets memory from the OS and gives it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Growth {
    /// An allocation that finds no room maps a new arena itself (`MAP_POPULATE`); a free that
    /// empties an arena beyond the reserve unmaps it. The right choice for a library user.
    OnDemand,
    /// Allocations and frees never map or unmap: they draw on empty arenas mapped ahead of time by
    /// a maintenance thread that calls [`Pool::maintain`] (woken through
    /// [`Pool::wait_for_maintenance`] as soon as an arena of the reserve is taken). An
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
            growth: Growth::OnDemand,
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
    /// Empty arenas beyond twice the reserve, unmapped.
    pub arenas_unmapped: usize,
}

/// The handshake between allocations and the maintenance thread in [`Growth::Reserve`] mode.
#[derive(Default)]
struct ReserveSignal {
    /// Pages the maintenance thread has faulted in so far: an allocation waiting for a refill
    /// keeps waiting (up to [`RESERVE_WAIT_CAP`] times its wait) while this moves.
    touched: AtomicU64,
    state: Mutex<ReserveState>,
    /// The maintenance thread waits here for `needed`.
    need: Condvar,
    /// Allocations wait here for `refills` to move.
    refilled: Condvar,
}

#[derive(Default)]
struct ReserveState {
    needed: bool,
    refills: u64,
    /// `refills` when a wait last timed out: until the next refill, allocations that find no
    /// room fail at once instead of each waiting out its time (a queue of writes would otherwise
    /// wait one after another).
    starved_at: Option<u64>,
}

impl ReserveSignal {
    fn ask(&self) {
        self.state.lock().needed = true;
        self.need.notify_one();
    }
}

/// An allocation waits at most this many times [`Growth::Reserve`]'s `wait` for a refill, and
/// only as long as the maintenance thread keeps faulting pages in: a refill that is slow (a busy
/// or emulated machine) is waited for; one that is stuck (in reclaim) fails after `wait`.
const RESERVE_WAIT_CAP: u32 = 8;

/// Where an allocation's wait for a refill stands (see [`Pool::wait_for_refill`]).
struct RefillWait {
    /// Fail at this point unless the maintenance thread made progress since `progress`.
    deadline: Instant,
    /// Fail at this point whatever happens.
    cap: Instant,
    progress: u64,
    wait: Duration,
}

/// Partial groups `< 10 %` .. `< 100 %`, then full.
pub const FULLNESS_GROUPS: usize = 11;
const FULL_GROUP: usize = FULLNESS_GROUPS - 1;

/// Objects moved per automatic compaction step (bounds the work a free may do).
const AUTO_COMPACT_MOVES: usize = 64;
/// Zspage moves per automatic arena defragmentation step.
const AUTO_DEFRAG_MOVES: usize = 8;

// Back-pointer words: an allocated slot holds its handle's local index; a free one holds the next
// free slot (or FREE_END) with FREE_TAG set.
const FREE_TAG: u32 = 1 << 31;
const FREE_END: u16 = 0xffff;

// Handle table words. Allocated: bit 63 | size << 43 | slot << 32 | zspage id. Free: next free
// local index + 1 (0 = end).
const ENTRY_LIVE: u64 = 1 << 63;

fn entry_pack(zspage: u32, slot: usize, size: usize) -> u64 {
    ENTRY_LIVE | ((size as u64) << 43) | ((slot as u64) << 32) | u64::from(zspage)
}

fn entry_unpack(e: u64) -> Option<(u32, usize, usize)> {
    (e & ENTRY_LIVE != 0).then_some({
        (
            e as u32,
            ((e >> 32) & 0x7ff) as usize,
            ((e >> 43) & 0x1fff) as usize,
        )
    })
}

struct Zspage {
    run: PageRun,
    inuse: u16,
    /// First free slot, or FREE_END.
    free_head: u16,
    /// Position in `groups[group_of(inuse)]` (the group is implied by `inuse`).
    group_pos: u32,
}

const _: () = assert!(std::mem::size_of::<Option<Zspage>>() <= 24);

struct ClassState {
    spec: ClassSpec,
    index: usize,
    zspages: Table<Option<Zspage>>,
    free_zspage_ids: Vec<u32>,
    /// `objs_per_zspage` words per zspage id.
    backptr: Table<u32>,
    groups: [Vec<u32>; FULLNESS_GROUPS],
    handles: Table<u64>,
    free_handle: u64,
    obj_used: usize,
    object_bytes: usize,
    live_zspages: usize,
}

struct Shared<'a> {
    arenas: &'a Mutex<ArenaSet>,
    /// `Some` in [`Growth::Reserve`] mode: whom to ask for more arenas, and below how many empty
    /// ones to ask.
    reserve: Option<(&'a ReserveSignal, usize)>,
    pages_used: &'a AtomicU64,
    max_pages_used: &'a AtomicU64,
    limit_pages: &'a AtomicU64,
    pages_compacted: &'a AtomicU64,
}

impl ClassState {
    fn new(index: usize, spec: ClassSpec) -> ClassState {
        ClassState {
            spec,
            index,
            // Small fixed segments: a class's slack stays under a KiB or so (many classes hold
            // few objects), and growing never copies.
            zspages: Table::new(1, 4),
            free_zspage_ids: Vec::new(),
            backptr: Table::new(spec.objs_per_zspage, 2),
            groups: Default::default(),
            handles: Table::new(1, 32),
            free_handle: 0,
            obj_used: 0,
            object_bytes: 0,
            live_zspages: 0,
        }
    }

    fn group_of(&self, inuse: usize) -> usize {
        let objs = self.spec.objs_per_zspage;
        if inuse == objs {
            FULL_GROUP
        } else {
            (inuse * 10 / objs).min(9)
        }
    }

    fn group_insert(&mut self, zid: u32) {
        let inuse = self.zspages[zid as usize]
            .as_ref()
            .expect("live zspage")
            .inuse;
        let g = self.group_of(usize::from(inuse));
        let z = self.zspages[zid as usize].as_mut().expect("live zspage");
        z.group_pos = self.groups[g].len() as u32;
        self.groups[g].push(zid);
    }

    /// Takes `zid` out of group `g`, the group its `inuse` implied when it was inserted.
    fn group_remove(&mut self, zid: u32, g: usize) {
        let z = self.zspages[zid as usize].as_ref().expect("live zspage");
        let pos = z.group_pos as usize;
        let removed = self.groups[g].swap_remove(pos);
        debug_assert_eq!(removed, zid);
        if let Some(&moved) = self.groups[g].get(pos) {
            self.zspages[moved as usize]
                .as_mut()
                .expect("grouped zspage is live")
                .group_pos = pos as u32;
        }
    }

    /// Moves `zid` to the group its `inuse` implies, from the one `old_inuse` implied.
    fn regroup(&mut self, zid: u32, old_inuse: u16) {
        let z = self.zspages[zid as usize].as_ref().expect("live zspage");
        let old = self.group_of(usize::from(old_inuse));
        if self.group_of(usize::from(z.inuse)) != old {
            self.group_remove(zid, old);
            self.group_insert(zid);
        }
    }

    /// The fullest zspage with a free slot, other than `except`.
    fn fullest_partial(&self, except: Option<u32>) -> Option<u32> {
        (0..FULL_GROUP)
            .rev()
            .flat_map(|g| self.groups[g].iter().rev())
            .copied()
            .find(|&z| Some(z) != except)
    }

    /// The emptiest zspage.
    fn sparsest(&self) -> Option<u32> {
        (0..FULL_GROUP)
            .flat_map(|g| self.groups[g].iter().rev())
            .copied()
            .next()
    }

    fn new_zspage(&mut self, shared: &Shared<'_>) -> Result<u32, Error> {
        let pages = self.spec.pages_per_zspage as u64;
        // Reserve the pages only if they fit: a compare-and-swap, so neither a reader nor a
        // racing allocation in another class ever sees the pool past its limit.
        let limit = shared.limit_pages.load(Ordering::Relaxed);
        let reserve =
            shared
                .pages_used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                    (limit == 0 || used + pages <= limit).then_some(used + pages)
                });
        let before = match reserve {
            Ok(before) => before,
            Err(used) => {
                return Err(Error::LimitExceeded {
                    limit_bytes: limit * PAGE_SIZE as u64,
                    used_bytes: used * PAGE_SIZE as u64,
                })
            }
        };
        shared
            .max_pages_used
            .fetch_max(before + pages, Ordering::Relaxed);
        let zid = match self.free_zspage_ids.pop() {
            Some(id) => id,
            None => {
                let id = self.zspages.push_row();
                let row = self.backptr.push_row();
                debug_assert_eq!(id, row);
                id as u32
            }
        };
        let (run, empty_left) = {
            let mut arenas = shared.arenas.lock();
            let run = arenas.alloc_run(self.spec.pages_per_zspage, Placement::Any);
            (run, arenas.empty_arenas())
        };
        if let Some((signal, low)) = shared.reserve {
            if empty_left < low || run.is_err() {
                signal.ask();
            }
        }
        let run = match run {
            Ok(run) => run,
            Err(e) => {
                shared.pages_used.fetch_sub(pages, Ordering::Relaxed);
                self.free_zspage_ids.push(zid);
                return Err(match e {
                    MapError::Map(errno) => Error::OutOfMemory {
                        bytes: (ARENA_PAGES * PAGE_SIZE) as u64,
                        errno,
                    },
                    MapError::NoRoom => Error::ReserveExhausted { waited_ms: 0 },
                });
            }
        };
        let objs = self.spec.objs_per_zspage;
        for (i, w) in self
            .backptr
            .row_mut(zid as usize)
            .expect("row of a zspage id")
            .iter_mut()
            .enumerate()
        {
            *w = FREE_TAG
                | if i + 1 < objs {
                    (i + 1) as u32
                } else {
                    u32::from(FREE_END)
                };
        }
        self.zspages[zid as usize] = Some(Zspage {
            run,
            inuse: 0,
            free_head: 0,
            group_pos: 0,
        });
        self.live_zspages += 1;
        self.group_insert(zid);
        Ok(zid)
    }

    fn free_zspage(&mut self, zid: u32, shared: &Shared<'_>) -> u64 {
        // An empty zspage sits in the group of 0 objects in use.
        self.group_remove(zid, self.group_of(0));
        let z = self.zspages[zid as usize].take().expect("live zspage");
        debug_assert_eq!(z.inuse, 0);
        self.free_zspage_ids.push(zid);
        self.live_zspages -= 1;
        let pages = z.run.pages() as u64;
        shared.pages_used.fetch_sub(pages, Ordering::Relaxed);
        shared.arenas.lock().free_run(z.run);
        pages
    }

    /// Takes a free slot of `zid` and points it at handle `local`.
    fn take_slot(&mut self, zid: u32, local: u32) -> usize {
        let objs = self.spec.objs_per_zspage;
        let z = self.zspages[zid as usize].as_mut().expect("live zspage");
        let slot = z.free_head as usize;
        debug_assert!(slot < objs, "zspage with a free slot");
        let w = &mut self.backptr.row_mut(zid as usize).expect("row")[slot];
        z.free_head = (*w & !FREE_TAG) as u16;
        *w = local;
        let old = z.inuse;
        z.inuse += 1;
        self.regroup(zid, old);
        slot
    }

    /// Gives back slot `slot` of `zid`; returns whether the zspage is now empty.
    fn put_slot(&mut self, zid: u32, slot: usize) -> bool {
        let z = self.zspages[zid as usize].as_mut().expect("live zspage");
        self.backptr.row_mut(zid as usize).expect("row")[slot] = FREE_TAG | u32::from(z.free_head);
        z.free_head = slot as u16;
        let old = z.inuse;
        z.inuse -= 1;
        let empty = z.inuse == 0;
        self.regroup(zid, old);
        empty
    }

    fn alloc(&mut self, size: usize, shared: &Shared<'_>) -> Result<Handle, Error> {
        let zid = match self.fullest_partial(None) {
            Some(z) => z,
            None => self.new_zspage(shared)?,
        };
        let local = match self.free_handle.checked_sub(1) {
            Some(l) => {
                self.free_handle = self.handles[l as usize];
                l as u32
            }
            None => self.handles.push_row() as u32,
        };
        let slot = self.take_slot(zid, local);
        self.handles[local as usize] = entry_pack(zid, slot, size);
        self.obj_used += 1;
        self.object_bytes += size;
        Ok(Handle::new(self.index, local))
    }

    fn lookup(&self, h: Handle) -> Result<(u32, usize, usize), Error> {
        h.local()
            .and_then(|l| self.handles.get(l as usize))
            .and_then(|&e| entry_unpack(e))
            .ok_or(Error::InvalidHandle { raw: h.to_raw() })
    }

    fn object(&self, h: Handle) -> Result<&[u8], Error> {
        let (zid, slot, size) = self.lookup(h)?;
        let z = self.zspages[zid as usize]
            .as_ref()
            .expect("a live handle's zspage is live");
        let off = slot * self.spec.size;
        Ok(&z.run.bytes()[off..off + size])
    }

    fn object_mut(&mut self, h: Handle) -> Result<&mut [u8], Error> {
        let (zid, slot, size) = self.lookup(h)?;
        let z = self.zspages[zid as usize]
            .as_mut()
            .expect("a live handle's zspage is live");
        let off = slot * self.spec.size;
        Ok(&mut z.run.bytes_mut()[off..off + size])
    }

    /// Frees the object; returns the zspage pages freed (0 unless its zspage emptied).
    fn free(&mut self, h: Handle, shared: &Shared<'_>) -> Result<u64, Error> {
        let (zid, slot, size) = self.lookup(h)?;
        let local = h.local().expect("looked up");
        self.handles[local as usize] = self.free_handle;
        self.free_handle = u64::from(local) + 1;
        self.obj_used -= 1;
        self.object_bytes -= size;
        if self.put_slot(zid, slot) {
            return Ok(self.free_zspage(zid, shared));
        }
        Ok(0)
    }

    /// Zspages' worth of free slots: what compaction could free at best.
    fn freeable(&self) -> usize {
        let allocated = self.live_zspages * self.spec.objs_per_zspage;
        (allocated - self.obj_used) / self.spec.objs_per_zspage
    }

    fn fragmented(&self) -> bool {
        let f = self.freeable();
        f >= 2 && f * 8 >= self.live_zspages
    }

    /// Moves objects from the sparsest zspages into the fullest until no zspage can be freed or
    /// `max_moves` objects moved. Returns zspage pages freed.
    fn compact(&mut self, max_moves: usize, shared: &Shared<'_>) -> u64 {
        let mut freed = 0;
        let mut moves = 0;
        while moves < max_moves && self.freeable() > 0 {
            let Some(src) = self.sparsest() else { break };
            while moves < max_moves {
                let Some(src_slot) = self.first_used_slot(src) else {
                    break;
                };
                let Some(dst) = self.fullest_partial(Some(src)) else {
                    break;
                };
                let local = self.backptr.row(src as usize).expect("row")[src_slot];
                let (_, _, size) = entry_unpack(self.handles[local as usize]).expect("live");
                let dst_slot = self.take_slot(dst, local);
                self.copy_object(src, src_slot, dst, dst_slot, size);
                self.handles[local as usize] = entry_pack(dst, dst_slot, size);
                moves += 1;
                if self.put_slot(src, src_slot) {
                    freed += self.free_zspage(src, shared);
                    break;
                }
            }
            if self.zspages[src as usize].is_some() {
                // No destination left (or out of moves): the class is as compact as it gets.
                break;
            }
        }
        shared.pages_compacted.fetch_add(freed, Ordering::Relaxed);
        freed
    }

    fn first_used_slot(&self, zid: u32) -> Option<usize> {
        self.backptr
            .row(zid as usize)
            .expect("row")
            .iter()
            .position(|w| w & FREE_TAG == 0)
    }

    fn copy_object(&mut self, src: u32, src_slot: usize, dst: u32, dst_slot: usize, size: usize) {
        let s = self.spec.size;
        let (src_off, dst_off) = (src_slot * s, dst_slot * s);
        // Take the destination out of the table for a moment to hold both at once.
        let mut b = self.zspages[dst as usize].take().expect("live");
        let a = self.zspages[src as usize].as_ref().expect("live");
        b.run.bytes_mut()[dst_off..dst_off + size]
            .copy_from_slice(&a.run.bytes()[src_off..src_off + size]);
        self.zspages[dst as usize] = Some(b);
    }

    /// Moves every zspage of this class out of arena `victim` into other arenas, at most
    /// `max_moves`. Returns the zspages moved, or `None` when some zspage found no room elsewhere.
    fn evacuate(&mut self, victim: u32, max_moves: usize, shared: &Shared<'_>) -> Option<usize> {
        let mut moved = 0;
        for z in self.zspages.iter_mut().flatten() {
            if moved >= max_moves {
                break;
            }
            if z.run.arena() != victim {
                continue;
            }
            let mut arenas = shared.arenas.lock();
            let mut dst = arenas
                .alloc_run(z.run.pages(), Placement::AwayFrom(victim))
                .ok()?;
            dst.bytes_mut().copy_from_slice(z.run.bytes());
            arenas.free_run(std::mem::replace(&mut z.run, dst));
            moved += 1;
        }
        Some(moved)
    }

    fn metadata_bytes(&self) -> usize {
        self.zspages.bytes()
            + self.free_zspage_ids.capacity() * 4
            + self.backptr.bytes()
            + self.groups.iter().map(|g| g.capacity() * 4).sum::<usize>()
            + self.handles.bytes()
    }

    fn stats(&self) -> ClassStats {
        let mut by_fullness = [0u64; FULLNESS_GROUPS];
        for (g, n) in self.groups.iter().zip(by_fullness.iter_mut()) {
            *n = g.len() as u64;
        }
        ClassStats {
            index: self.index,
            size: self.spec.size,
            by_fullness,
            obj_allocated: (self.live_zspages * self.spec.objs_per_zspage) as u64,
            obj_used: self.obj_used as u64,
            pages_used: (self.live_zspages * self.spec.pages_per_zspage) as u64,
            pages_per_zspage: self.spec.pages_per_zspage,
            freeable: self.freeable() as u64,
        }
    }

    fn check(&self, arenas: &ArenaSet) -> Result<(), String> {
        let objs = self.spec.objs_per_zspage;
        let ctx = |m: String| format!("class {} (size {}): {m}", self.index, self.spec.size);
        let mut live = 0;
        let mut used_total = 0;
        for (zid, z) in self.zspages.iter().enumerate() {
            let Some(z) = z else { continue };
            live += 1;
            if z.run.pages() != self.spec.pages_per_zspage || !arenas.run_is_marked(&z.run) {
                return Err(ctx(format!(
                    "zspage {zid}: run not marked used in its arena"
                )));
            }
            let words = self.backptr.row(zid).expect("row of a live zspage");
            let used = words.iter().filter(|w| *w & FREE_TAG == 0).count();
            if used != usize::from(z.inuse) || used == 0 {
                return Err(ctx(format!(
                    "zspage {zid}: inuse {} but {used} slots used",
                    z.inuse
                )));
            }
            used_total += used;
            // The free list visits exactly the free slots.
            let mut seen = 0;
            let mut cur = z.free_head;
            while cur != FREE_END {
                let w = words.get(cur as usize).copied().unwrap_or(0);
                if w & FREE_TAG == 0 || seen > objs {
                    return Err(ctx(format!("zspage {zid}: free list broken at {cur}")));
                }
                seen += 1;
                cur = (w & !FREE_TAG) as u16;
            }
            if seen != objs - used {
                return Err(ctx(format!(
                    "zspage {zid}: free list has {seen} of {} free",
                    objs - used
                )));
            }
            for (slot, &local) in words.iter().enumerate().filter(|(_, w)| *w & FREE_TAG == 0) {
                match self
                    .handles
                    .get(local as usize)
                    .and_then(|&e| entry_unpack(e))
                {
                    Some((hz, hs, size))
                        if hz as usize == zid && hs == slot && size <= self.spec.size => {}
                    other => {
                        return Err(ctx(format!(
                            "zspage {zid} slot {slot}: handle {local} -> {other:?}"
                        )))
                    }
                }
            }
            let group = self.group_of(usize::from(z.inuse));
            if self.groups[group].get(z.group_pos as usize) != Some(&(zid as u32)) {
                return Err(ctx(format!(
                    "zspage {zid}: not at {} of group {group}",
                    z.group_pos
                )));
            }
        }
        let grouped: usize = self.groups.iter().map(Vec::len).sum();
        if live != self.live_zspages || grouped != live || used_total != self.obj_used {
            return Err(ctx(format!(
                "counters: live {} (found {live}), grouped {grouped}, obj_used {} (found {used_total})",
                self.live_zspages, self.obj_used
            )));
        }
        let live_handles = self
            .handles
            .iter()
            .filter(|&&e| e & ENTRY_LIVE != 0)
            .count();
        if live_handles != self.obj_used {
            return Err(ctx(format!(
                "{live_handles} live handles for {} objects",
                self.obj_used
            )));
        }
        let sizes: usize = self
            .handles
            .iter()
            .filter_map(|&e| entry_unpack(e))
            .map(|(_, _, s)| s)
            .sum();
        if sizes != self.object_bytes {
            return Err(ctx(format!(
                "object bytes {} but handles sum to {sizes}",
                self.object_bytes
            )));
        }
        Ok(())
    }
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
    auto_compact: AtomicBool,
    defrag_running: AtomicBool,
    growth: Growth,
    reserve_arenas: usize,
    signal: ReserveSignal,
}

impl Pool {
    /// A pool with the given configuration.
    pub fn new(config: PoolConfig) -> Result<Pool, Error> {
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
            .map(|(i, &spec)| Mutex::new(ClassState::new(i, spec)))
            .collect();
        let on_demand = config.growth == Growth::OnDemand;
        let reserve_arenas = if on_demand {
            config.reserve_arenas
        } else {
            config.reserve_arenas.max(1)
        };
        let pool = Pool {
            table,
            classes,
            arenas: Mutex::new(ArenaSet::new(reserve_arenas, on_demand)),
            pages_used: AtomicU64::new(0),
            max_pages_used: AtomicU64::new(0),
            limit_pages: AtomicU64::new(0),
            pages_compacted: AtomicU64::new(0),
            pages_released: AtomicU64::new(0),
            auto_compact: AtomicBool::new(config.auto_compact),
            defrag_running: AtomicBool::new(false),
            growth: config.growth,
            reserve_arenas,
            signal: ReserveSignal::default(),
        };
        pool.set_limit(config.limit_bytes);
        let prefault = if on_demand {
            Prefault::Populate
        } else {
            Prefault::Touch
        };
        pool.arenas
            .lock()
            .premap(reserve_arenas, prefault)
            .map_err(|errno| Error::OutOfMemory {
                bytes: (reserve_arenas * ARENA_PAGES * PAGE_SIZE) as u64,
                errno,
            })?;
        Ok(pool)
    }

    fn shared(&self) -> Shared<'_> {
        Shared {
            arenas: &self.arenas,
            reserve: match self.growth {
                Growth::OnDemand => None,
                // Asked as soon as an arena of the reserve is taken: the maintenance thread
                // then has the whole reserve's worth of writes to map the next one in.
                Growth::Reserve { .. } => Some((&self.signal, self.reserve_arenas)),
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
        Ok(self.alloc_locked(size)?.1)
    }

    /// Allocates an object holding `data` (1..=4096 bytes) under one lock acquisition.
    pub fn store(&self, data: &[u8]) -> Result<Handle, Error> {
        Self::check_size(data.len())?;
        let (mut class, h) = self.alloc_locked(data.len())?;
        class
            .object_mut(h)
            .expect("just allocated")
            .copy_from_slice(data);
        Ok(h)
    }

    /// Allocates in `size`'s class and returns the class still locked. In reserve mode, waits
    /// (without the class lock) for the maintenance thread when no arena has room.
    fn alloc_locked(
        &self,
        size: usize,
    ) -> Result<(parking_lot::MutexGuard<'_, ClassState>, Handle), Error> {
        let class = &self.classes[self.table.class_of(size)];
        let mut started: Option<(Instant, RefillWait)> = None;
        loop {
            let mut c = class.lock();
            match c.alloc(size, &self.shared()) {
                Ok(h) => return Ok((c, h)),
                Err(Error::ReserveExhausted { .. }) => {
                    drop(c);
                    let Growth::Reserve { wait } = self.growth else {
                        unreachable!("only reserve mode runs out of reserve")
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

    /// Waits until an empty arena is there; false if `w` ran out first (no progress by the
    /// maintenance thread for `w.wait`, or `w.cap` passed), or if an earlier wait ran out and
    /// no refill came since.
    fn wait_for_refill(&self, w: &mut RefillWait) -> bool {
        let mut st = self.signal.state.lock();
        loop {
            // Checked under the signal's lock: a refill that lands after this check notifies
            // only after the wait below has released it, so no wakeup is lost.
            if self.arenas.lock().empty_arenas() > 0 {
                return true;
            }
            st.needed = true;
            self.signal.need.notify_one();
            if st.starved_at == Some(st.refills) {
                return false;
            }
            if !self
                .signal
                .refilled
                .wait_until(&mut st, w.deadline.min(w.cap))
                .timed_out()
            {
                continue;
            }
            if self.arenas.lock().empty_arenas() > 0 {
                return true;
            }
            let progress = self.signal.touched.load(Ordering::Relaxed);
            let now = Instant::now();
            if progress != w.progress && now < w.cap {
                // Slow, not stuck: the maintenance thread is faulting the next arena in.
                w.progress = progress;
                w.deadline = now + w.wait;
                continue;
            }
            st.starved_at = Some(st.refills);
            return false;
        }
    }

    /// [`Growth::Reserve`] mode's maintenance: maps arenas (outside every lock, touching their
    /// pages) until `reserve_arenas` are empty, wakes the allocations waiting for them, and
    /// unmaps empty arenas beyond twice the reserve. Call it from a thread that may wait for
    /// reclaim (not an I/O thread of a swap device). A no-op in [`Growth::OnDemand`] mode.
    pub fn maintain(&self) -> Result<Maintenance, Error> {
        let mut done = Maintenance::default();
        if self.growth == Growth::OnDemand {
            return Ok(done);
        }
        while self.arenas.lock().empty_arenas() < self.reserve_arenas {
            let mapping =
                Mapping::new_counted(Prefault::Touch, &self.signal.touched).map_err(|errno| {
                    Error::OutOfMemory {
                        bytes: (ARENA_PAGES * PAGE_SIZE) as u64,
                        errno,
                    }
                })?;
            self.arenas.lock().insert(mapping);
            done.arenas_mapped += 1;
            self.signal.state.lock().refills += 1;
            self.signal.refilled.notify_all();
        }
        done.arenas_unmapped = self.unmap_empty(2 * self.reserve_arenas);
        Ok(done)
    }

    /// Blocks until an allocation asks for arenas or `timeout` passes, for the thread that calls
    /// [`Pool::maintain`]. Returns whether it was asked.
    pub fn wait_for_maintenance(&self, timeout: Duration) -> bool {
        let mut st = self.signal.state.lock();
        if !st.needed {
            let _ = self.signal.need.wait_for(&mut st, timeout);
        }
        std::mem::take(&mut st.needed)
    }

    /// Unmaps empty arenas beyond `keep`, each outside the arena lock. Returns how many.
    fn unmap_empty(&self, keep: usize) -> usize {
        let mut n = 0;
        while let Some(mapping) = {
            let taken = self.arenas.lock().take_empty(keep);
            taken
        } {
            drop(mapping);
            n += 1;
        }
        n
    }

    /// Frees an object. May compact its class by a bounded step when frees have fragmented it.
    pub fn free(&self, h: Handle) -> Result<(), Error> {
        let zspage_freed = {
            let mut class = self.class(h)?.lock();
            let shared = self.shared();
            let freed = class.free(h, &shared)?;
            if self.auto_compact.load(Ordering::Relaxed) && class.fragmented() {
                class.compact(AUTO_COMPACT_MOVES, &shared);
            }
            freed
        };
        if zspage_freed > 0 && self.auto_compact.load(Ordering::Relaxed) {
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

    /// Turns automatic compaction on or off.
    pub fn set_auto_compact(&self, on: bool) {
        self.auto_compact.store(on, Ordering::Relaxed);
    }

    /// Compacts every class (moving objects out of the sparsest zspages), then moves zspages out of
    /// sparse arenas so that whole arenas go back to the OS. Takes one class lock at a time.
    pub fn compact(&self) -> CompactStats {
        let shared = self.shared();
        let mut pages_freed = 0;
        for class in self.classes.iter() {
            pages_freed += class.lock().compact(usize::MAX, &shared);
        }
        let mut pages_released = self.defrag(usize::MAX);
        if self.growth != Growth::OnDemand {
            // In reserve mode frees leave empty arenas mapped; a compaction gives them back.
            let unmapped = (self.unmap_empty(self.reserve_arenas) * ARENA_PAGES) as u64;
            self.pages_released.fetch_add(unmapped, Ordering::Relaxed);
            pages_released += unmapped;
        }
        CompactStats {
            pages_freed,
            pages_released,
        }
    }

    fn maybe_defrag(&self) {
        let fragmented = {
            let a = self.arenas.lock();
            // Free pages inside partly used arenas; empty ones are the reserve, not fragmentation.
            let in_use = a.mapped_pages() - a.empty_arenas() * ARENA_PAGES;
            let slack = in_use - a.used_pages();
            slack >= 2 * ARENA_PAGES && slack * 8 >= in_use
        };
        if fragmented {
            self.defrag(AUTO_DEFRAG_MOVES);
        }
    }

    /// Empties the sparsest arenas into the others, moving at most `max_moves` zspages. Returns arena
    /// pages unmapped.
    fn defrag(&self, max_moves: usize) -> u64 {
        if self.defrag_running.swap(true, Ordering::Acquire) {
            return 0;
        }
        let shared = self.shared();
        let released_before = self.arenas.lock().released_arenas();
        let mut moves = 0;
        // Each round empties one arena or stops, so this bounds the rounds.
        let mut rounds = self.arenas.lock().mapped_pages() / ARENA_PAGES;
        'outer: while moves < max_moves && rounds > 0 {
            rounds -= 1;
            let Some(victim) = self.arenas.lock().sparsest() else {
                break;
            };
            // Zspages do not record back to arenas: scan each class for the victim's zspages.
            for class in self.classes.iter() {
                if self.arenas.lock().arena_used_pages(victim) == 0 {
                    break;
                }
                match class.lock().evacuate(victim, max_moves - moves, &shared) {
                    Some(n) => moves += n,
                    None => break 'outer,
                }
                if moves >= max_moves {
                    break 'outer;
                }
            }
            if self.arenas.lock().arena_used_pages(victim) > 0 {
                // The victim did not empty (new runs landed in it): stop rather than spin.
                break;
            }
        }
        let released =
            (self.arenas.lock().released_arenas() - released_before) * ARENA_PAGES as u64;
        self.pages_released.fetch_add(released, Ordering::Relaxed);
        self.defrag_running.store(false, Ordering::Release);
        released
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
            pages_compacted: self.pages_compacted.load(Ordering::Relaxed),
            pages_released: self.pages_released.load(Ordering::Relaxed),
            objects,
            object_bytes,
            metadata_bytes: (metadata + arena_meta) as u64,
            limit_pages: self.limit_pages.load(Ordering::Relaxed),
        }
    }

    /// Pages held by zspages (cheap: one atomic load).
    pub fn pages_used(&self) -> u64 {
        self.pages_used.load(Ordering::Relaxed)
    }

    /// One row per class, like zsmalloc's debugfs `classes`.
    pub fn class_stats(&self) -> Vec<ClassStats> {
        self.classes.iter().map(|c| c.lock().stats()).collect()
    }

    /// The class table as text, in the layout of zsmalloc's debugfs `classes` file.
    pub fn format_class_stats(&self) -> String {
        use std::fmt::Write;
        let mut out = String::from(" class  size   10%   20%   30%   40%   50%   60%   70%   80%   90%   99%  100% obj_allocated   obj_used pages_used pages_per_zspage freeable\n");
        for s in self.class_stats() {
            let _ = write!(out, "{:>6} {:>5}", s.index, s.size);
            for n in s.by_fullness {
                let _ = write!(out, " {n:>5}");
            }
            let _ = writeln!(
                out,
                " {:>13} {:>10} {:>10} {:>16} {:>8}",
                s.obj_allocated, s.obj_used, s.pages_used, s.pages_per_zspage, s.freeable
            );
        }
        out
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
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(300);

    /// A reserve-mode pool of one arena, filled with 3000-byte objects until a store finds no
    /// room. Returns the pool and the objects it holds.
    fn full_pool() -> (Pool, Vec<Handle>) {
        let pool = Pool::new(PoolConfig {
            reserve_arenas: 1,
            growth: Growth::Reserve { wait: WAIT },
            ..Default::default()
        })
        .unwrap();
        let mut live = Vec::new();
        // Fill without waiting: maintenance would refill; here nobody maintains, so the first
        // store that fails has waited WAIT, and the pool is now starved.
        while let Ok(h) = pool.store(&[7u8; 3000]) {
            live.push(h);
        }
        (pool, live)
    }

    /// Bumps the maintenance progress counter every 50 ms while `going()`, as a slow refill
    /// does.
    fn slow_refill(pool: &Pool, going: impl Fn() -> bool) {
        while going() {
            pool.signal.touched.fetch_add(32, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn a_store_waits_for_a_slow_refill_and_gives_up_on_a_stuck_one() {
        let (pool, live) = full_pool();
        // Objects of one size: each arena holds as many.
        let per_arena = live.len();
        assert!(per_arena > 600, "{per_arena}");
        // Starved: the next store fails at once until a refill lands.
        let t = Instant::now();
        assert!(matches!(
            pool.store(&[7u8; 3000]),
            Err(Error::ReserveExhausted { .. })
        ));
        assert!(t.elapsed() < WAIT / 2, "{:?}", t.elapsed());
        pool.maintain().unwrap();
        for _ in 0..per_arena {
            pool.store(&[8u8; 3000]).unwrap();
        }

        // The second arena is full. A refill that makes progress for 3 waits, then lands, is
        // waited for.
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                slow_refill(&pool, || t.elapsed() < WAIT * 3);
                pool.maintain().unwrap();
            });
            let h = pool.store(&[10u8; 3000]).unwrap();
            assert_eq!(pool.read(h, |o| o[0]).unwrap(), 10);
        });
        assert!(t.elapsed() >= WAIT * 3, "waited {:?}", t.elapsed());
        for _ in 1..per_arena {
            pool.store(&[10u8; 3000]).unwrap();
        }

        // The third is full. A refill that never ends: progress all along, but the store
        // gives up at the cap.
        let stop = AtomicBool::new(false);
        let (stored, waited) = std::thread::scope(|s| {
            s.spawn(|| slow_refill(&pool, || !stop.load(Ordering::Relaxed)));
            let t = Instant::now();
            let stored = pool.store(&[11u8; 3000]);
            stop.store(true, Ordering::Relaxed);
            (stored, t.elapsed())
        });
        assert!(
            matches!(stored, Err(Error::ReserveExhausted { .. })),
            "{stored:?}"
        );
        assert!(
            waited >= WAIT * RESERVE_WAIT_CAP && waited < WAIT * RESERVE_WAIT_CAP * 2,
            "waited {waited:?}"
        );
        assert_eq!(pool.stats().pages_mapped, 3 * ARENA_PAGES as u64);
        pool.check_invariants().unwrap();
    }
}
