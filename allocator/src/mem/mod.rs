//! All raw memory of the pool: arenas mapped with `mmap`, and runs of contiguous pages handed out of
//! them. This is the only module of the crate with `unsafe` code.
//!
//! # Why arenas, and how memory goes back to the OS
//! The uzram daemon runs under `mlockall(MCL_FUTURE | MCL_ONFAULT)`, so every page of a mapping
//! it touches is locked, and `MADV_DONTNEED` fails on locked ranges. The pool therefore never
//! gives back part of a mapping: it maps memory in arenas of [`ARENA_PAGES`] pages and returns an
//! arena with `munmap` only when no run is allocated in it. Compaction moves runs out of sparse
//! arenas ([`ArenaSet::alloc_run`] with [`Placement::AwayFrom`]) so that they empty. A few empty
//! arenas are kept as a reserve ([`ArenaSet::premap`] maps them up front), so that a pool
//! oscillating around an arena boundary does not map and unmap on every zspage.
//! The number of mappings is bounded by pool size / arena size (8192 for 16 GiB), far below
//! `vm.max_map_count`.
//!
//! # Soundness
//! A [`PageRun`] is an owning handle to `pages` contiguous pages inside one arena, like a
//! `Box<[u8]>` whose memory lives in the arena. The invariants that make the safe API sound:
//! 1. The used-page bitmap of each arena marks exactly the pages of the live `PageRun`s in it, so no
//!    two `PageRun`s overlap (allocation only hands out pages whose bits are clear, and sets them).
//! 2. An arena is unmapped only when its bitmap is empty, i.e. no `PageRun` points into it; a
//!    `PageRun` is returned only by value ([`ArenaSet::free_run`]), so none outlives its pages.
//! 3. `PageRun` is neither `Clone` nor `Copy`; reads go through `&PageRun`, writes through
//!    `&mut PageRun`, so the borrow checker gives writers exclusive access, as with a `Box`.
//!
//! Every `PageRun` must be given back to the `ArenaSet` it came from before that set is dropped
//! (the pool does so in its `Drop`); a run that leaks only leaks memory, never dangles, because an
//! arena with allocated pages is never unmapped while the set lives, and the set unmaps everything when
//! it is dropped, after which the pool holds no runs.

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

mod mapping;
mod region;

pub use mapping::{Mapping, Prefault, Source};

pub use region::{
    in_place_order, AtomicChunk, Chunk, Region, RegionSize, CHUNK_TAG_MAX, CHUNK_WORDS,
    REGION_VERSION, USER_CHUNK_TAG,
};

/// Bytes in a page. uzram serves 4 KiB pages only.
pub const PAGE_SIZE: usize = 4096;
/// Pages in one arena (one `mmap`): 2 MiB.
pub const ARENA_PAGES: usize = 512;
const ARENA_BYTES: usize = ARENA_PAGES * PAGE_SIZE;
const BITMAP_WORDS: usize = ARENA_PAGES / 64;
/// Pages a `madvise(MADV_POPULATE_*)` call makes resident, and so how often a region's arena
/// reports progress while it is mapped: under memory pressure each page can wait tens of
/// milliseconds for reclaim, and a writer waiting for the arena judges the maintenance thread
/// stuck after a second without progress. (A private arena, faulted in a page at a time,
/// reports every page.)
const TOUCH_STRIDE: usize = 8;

/// An owning handle to `pages` contiguous pages of an arena. See the module docs.
#[derive(Debug)]
pub struct PageRun {
    ptr: NonNull<u8>,
    arena: u32,
    first_page: u16,
    pages: u16,
}

// SAFETY: a PageRun owns its pages exclusively (invariant 1), like a Box<[u8]>; moving it to another
// thread moves that ownership.
unsafe impl Send for PageRun {}
// SAFETY: shared references only read (`bytes`); writes need `&mut PageRun` (invariant 3).
unsafe impl Sync for PageRun {}

impl PageRun {
    /// Number of pages in the run.
    pub fn pages(&self) -> usize {
        usize::from(self.pages)
    }

    /// Length of the run in bytes.
    pub fn len_bytes(&self) -> usize {
        self.pages() * PAGE_SIZE
    }

    /// The arena the run lives in.
    pub fn arena(&self) -> u32 {
        self.arena
    }

    /// The run's first page within its arena.
    pub fn first_page(&self) -> usize {
        usize::from(self.first_page)
    }

    /// The whole run as bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the run's pages are mapped and owned by this PageRun (invariants 1 and 2); `&self`
        // guarantees no `&mut` access exists for the slice's lifetime (invariant 3).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes()) }
    }

    /// The whole run as mutable bytes.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only access to the run's pages.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len_bytes()) }
    }
}

struct Arena {
    mapping: Mapping,
    /// Bit set = page allocated to a live PageRun.
    used: [u64; BITMAP_WORDS],
    used_pages: usize,
}

impl Arena {
    fn is_free(&self, page: usize) -> bool {
        self.used[page / 64] & (1 << (page % 64)) == 0
    }

    fn set_range(&mut self, first: usize, n: usize, used: bool) {
        for p in first..first + n {
            let bit = 1u64 << (p % 64);
            if used {
                self.used[p / 64] |= bit;
            } else {
                self.used[p / 64] &= !bit;
            }
        }
    }

    /// First fit of `n` contiguous free pages.
    fn find_free(&self, n: usize) -> Option<usize> {
        if ARENA_PAGES - self.used_pages < n {
            return None;
        }
        let mut run_start = 0;
        let mut run_len = 0;
        let mut page = 0;
        while page < ARENA_PAGES {
            if page % 64 == 0 && self.used[page / 64] == u64::MAX {
                run_len = 0;
                page += 64;
                continue;
            }
            if self.is_free(page) {
                if run_len == 0 {
                    run_start = page;
                }
                run_len += 1;
                if run_len == n {
                    return Some(run_start);
                }
            } else {
                run_len = 0;
            }
            page += 1;
        }
        None
    }
}

/// Why a run could not be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapError {
    /// `mmap` failed with this errno (ENOMEM, or EAGAIN under a memlock limit).
    Map(i32),
    /// No arena other than the excluded one has room, and mapping was not allowed.
    NoRoom,
}

/// Where [`ArenaSet::alloc_run`] may put a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Anywhere, mapping a new arena if needed.
    Any,
    /// Compaction: in an already used arena other than this one.
    AwayFrom(u32),
}

/// The set of arenas of one pool. Not internally synchronised: the pool keeps it under a mutex.
#[derive(Default)]
pub struct ArenaSet {
    arenas: Vec<Option<Arena>>,
    free_ids: Vec<u32>,
    /// The arena the last allocation came from: tried first.
    cursor: usize,
    mapped: usize,
    used_pages: usize,
    /// Arenas mapped and later unmapped, over the pool's life.
    released: u64,
    /// Empty arenas to keep mapped rather than unmap.
    reserve: usize,
    /// Arenas with no page in use.
    empty: usize,
    /// Whether [`ArenaSet::alloc_run`] may map and [`ArenaSet::free_run`] may unmap. Off in reserve
    /// mode, where only [`ArenaSet::insert`] and [`ArenaSet::take_empty`] change the mappings.
    on_demand: bool,
    /// Where new arenas come from. In a region an arena's id is its place in the file.
    source: Source,
}

impl ArenaSet {
    /// A set that keeps up to `reserve` empty arenas mapped. With `on_demand` false the set never
    /// maps or unmaps by itself: growth fails with [`MapError::NoRoom`] when no arena has room, and
    /// empty arenas stay until [`ArenaSet::take_empty`] takes them.
    #[cfg(test)]
    pub fn new(reserve: usize, on_demand: bool) -> ArenaSet {
        ArenaSet::with_source(reserve, on_demand, Source::default())
    }

    /// [`ArenaSet::new`], its arenas from `source`.
    pub fn with_source(reserve: usize, on_demand: bool, source: Source) -> ArenaSet {
        ArenaSet {
            reserve,
            on_demand,
            source,
            ..ArenaSet::default()
        }
    }

    /// Where the set's arenas come from (to map one outside the set's lock).
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Adds an empty arena mapped outside the set's lock.
    pub fn insert(&mut self, mapping: Mapping) -> u32 {
        let place = mapping.place();
        let arena = Arena {
            mapping,
            used: [0; BITMAP_WORDS],
            used_pages: 0,
        };
        self.mapped += 1;
        self.empty += 1;
        if let Some(id) = place {
            // A region's place is claimed once, so it is free here too.
            let id_us = id as usize;
            if self.arenas.len() <= id_us {
                self.arenas.resize_with(id_us + 1, || None);
            }
            debug_assert!(self.arenas[id_us].is_none());
            self.arenas[id_us] = Some(arena);
            return id;
        }
        match self.free_ids.pop() {
            Some(id) => {
                self.arenas[id as usize] = Some(arena);
                id
            }
            None => {
                self.arenas.push(Some(arena));
                (self.arenas.len() - 1) as u32
            }
        }
    }

    /// Takes arena `id` out of the set (its bitmap is empty): its id is free again.
    fn retire(&mut self, id: usize) -> Option<Arena> {
        let arena = self.arenas[id].take()?;
        if self.source.as_region().is_none() {
            // A region's arena frees its place when its mapping drops.
            self.free_ids.push(id as u32);
        }
        self.mapped -= 1;
        self.empty -= 1;
        self.released += 1;
        Some(arena)
    }

    /// Arenas with no page in use.
    pub fn empty_arenas(&self) -> usize {
        self.empty
    }

    /// Removes one empty arena if more than `keep` are empty, so the caller can unmap it (drop
    /// it) outside the set's lock.
    pub fn take_empty(&mut self, keep: usize) -> Option<Mapping> {
        if self.empty <= keep {
            return None;
        }
        // The highest ids first: arenas are reused lowest id first, so the set stays dense.
        let id = (0..self.arenas.len())
            .rev()
            .find(|&id| self.arenas[id].as_ref().is_some_and(|a| a.used_pages == 0))?;
        // Invariant 2: the arena's bitmap is empty, no PageRun points into it.
        self.retire(id).map(|a| a.mapping)
    }

    /// Maps empty arenas until `count` are empty, so that later growth takes memory already
    /// held instead of asking the kernel on the I/O path (where, under memory pressure, a swap
    /// device's daemon must not wait for reclaim). Returns the errno of a failed `mmap`.
    pub fn premap(&mut self, count: usize, prefault: Prefault) -> Result<(), i32> {
        while self.empty < count {
            let mapping = self.source.map(prefault, &AtomicU64::new(0))?;
            self.insert(mapping);
        }
        Ok(())
    }

    /// Pages in mapped arenas (what the pool really costs in RAM).
    pub fn mapped_pages(&self) -> usize {
        self.mapped * ARENA_PAGES
    }

    /// Pages allocated to live runs.
    pub fn used_pages(&self) -> usize {
        self.used_pages
    }

    /// Arenas currently mapped.
    #[cfg(test)]
    pub fn mapped_arenas(&self) -> usize {
        self.mapped
    }

    /// Arenas unmapped so far.
    pub fn released_arenas(&self) -> u64 {
        self.released
    }

    /// Bytes of bookkeeping (not pool memory) the set holds.
    pub fn metadata_bytes(&self) -> usize {
        self.arenas.capacity() * std::mem::size_of::<Option<Arena>>() + self.free_ids.capacity() * 4
    }

    /// Allocates `n` contiguous pages. With [`Placement::Any`] it tries the
    /// arena of the last allocation, then the fullest arena with room (so sparse arenas drain), then
    /// maps a new one. With [`Placement::AwayFrom`] it takes the fullest non-empty arena other than
    /// the victim, and never maps.
    pub fn alloc_run(&mut self, n: usize, place: Placement) -> Result<PageRun, MapError> {
        assert!((1..=ARENA_PAGES).contains(&n), "run of {n} pages");
        let (excluded, may_map) = match place {
            Placement::Any => (None, self.on_demand),
            Placement::AwayFrom(victim) => (Some(victim), false),
        };
        let mut found = None;
        if let (Placement::Any, Some(Some(a))) = (place, self.arenas.get(self.cursor)) {
            if let Some(first) = a.find_free(n) {
                found = Some((self.cursor, first));
            }
        }
        if found.is_none() {
            let mut best: Option<(usize, usize, usize)> = None; // (id, first, used_pages)
            for (id, a) in self.arenas.iter().enumerate() {
                let Some(a) = a else { continue };
                // Moving a run into an empty arena would only swap which arena is sparse.
                let useless = excluded.is_some() && a.used_pages == 0;
                if excluded == Some(id as u32)
                    || useless
                    || best.is_some_and(|(_, _, u)| u >= a.used_pages)
                {
                    continue;
                }
                if let Some(first) = a.find_free(n) {
                    best = Some((id, first, a.used_pages));
                }
            }
            found = best.map(|(id, first, _)| (id, first));
        }
        let (id, first) = match found {
            Some(f) => f,
            None if may_map => {
                let mapping = self
                    .source
                    .map(Prefault::Populate, &AtomicU64::new(0))
                    .map_err(MapError::Map)?;
                (self.insert(mapping) as usize, 0)
            }
            None => return Err(MapError::NoRoom),
        };
        self.cursor = id;
        // find_free only returns runs of free pages inside the arena.
        Ok(self.take_run(id, first, n))
    }

    /// Marks pages `first..first + n` of arena `id` used and hands them out. The caller checked
    /// that the arena is mapped, that `first + n <= ARENA_PAGES` and that the pages are free.
    fn take_run(&mut self, id: usize, first: usize, n: usize) -> PageRun {
        assert!(
            first + n <= ARENA_PAGES,
            "run {first}+{n} outside its arena"
        );
        let arena = self.arenas[id].as_mut().expect("a mapped arena");
        debug_assert!((first..first + n).all(|p| arena.is_free(p)));
        if arena.used_pages == 0 {
            self.empty -= 1;
        }
        arena.set_range(first, n, true);
        arena.used_pages += n;
        self.used_pages += n;
        // SAFETY: `first + n <= ARENA_PAGES` (asserted above), so the offset stays inside the
        // mapping of ARENA_BYTES; the pages were free, so no other PageRun holds them
        // (invariant 1).
        let ptr = unsafe { arena.mapping.ptr.add(first * PAGE_SIZE) };
        PageRun {
            ptr,
            arena: id as u32,
            first_page: first as u16,
            pages: n as u16,
        }
    }

    /// The pool is left for a successor: dropping the set unmaps its arenas but leaves their
    /// pages in the region.
    pub fn keep_in_region(&mut self) {
        for a in self.arenas.iter_mut().flatten() {
            a.mapping.punch = false;
        }
    }

    /// Adoption succeeded: the arenas a predecessor left are this set's own, their pages
    /// punched out of the region when they are given back.
    pub fn own_adopted(&mut self) {
        for a in self.arenas.iter_mut().flatten() {
            a.mapping.punch = true;
        }
    }

    /// Adoption: the run of `n` pages at `first` of arena `id` (mapped by [`Region::map_existing`]
    /// and inserted), which a predecessor's pool held. Refuses a run outside the arena or over
    /// pages already taken, so two zspages never share a page (invariant 1).
    pub fn adopt_run(&mut self, id: u32, first: usize, n: usize) -> Result<PageRun, String> {
        let Some(Some(arena)) = self.arenas.get_mut(id as usize) else {
            return Err(format!("arena {id} is not mapped"));
        };
        if n == 0 || first + n > ARENA_PAGES {
            return Err(format!(
                "pages {first}..{} are outside arena {id}",
                first + n
            ));
        }
        if (first..first + n).any(|p| !arena.is_free(p)) {
            return Err(format!(
                "pages {first}..{} of arena {id} are held twice",
                first + n
            ));
        }
        Ok(self.take_run(id as usize, first, n))
    }

    /// Returns a run's pages; unmaps its arena if that leaves it empty and the reserve is full.
    /// Returns the number of pages unmapped (0 or ARENA_PAGES).
    pub fn free_run(&mut self, run: PageRun) -> usize {
        let id = run.arena as usize;
        let arena = self.arenas[id]
            .as_mut()
            .expect("a live run's arena is mapped");
        debug_assert!((0..run.pages()).all(|p| !arena.is_free(run.first_page() + p)));
        arena.set_range(run.first_page(), run.pages(), false);
        arena.used_pages -= run.pages();
        self.used_pages -= run.pages();
        if arena.used_pages == 0 {
            self.empty += 1;
            if self.on_demand && self.empty > self.reserve {
                // Invariant 2: the bitmap is empty, no PageRun points into this arena.
                self.retire(id);
                return ARENA_PAGES;
            }
        }
        0
    }

    /// The arena with the fewest used pages (> 0), if moving its runs into the other arenas' free
    /// pages could empty it.
    pub fn sparsest(&self) -> Option<u32> {
        let (id, a) = self
            .arenas
            .iter()
            .enumerate()
            .filter_map(|(id, a)| a.as_ref().map(|a| (id, a)))
            .filter(|(_, a)| a.used_pages > 0)
            .min_by_key(|(_, a)| a.used_pages)?;
        let free_elsewhere = self.mapped_pages() - self.used_pages - (ARENA_PAGES - a.used_pages);
        if free_elsewhere < a.used_pages {
            return None;
        }
        Some(id as u32)
    }

    /// Checks the set's own counters against its bitmaps.
    pub fn check(&self) -> Result<(), String> {
        let mut used = 0;
        let mut mapped = 0;
        let mut empty = 0;
        for (id, a) in self.arenas.iter().enumerate() {
            let Some(a) = a else { continue };
            mapped += 1;
            empty += usize::from(a.used_pages == 0);
            let bits: usize = a.used.iter().map(|w| w.count_ones() as usize).sum();
            if bits != a.used_pages {
                return Err(format!(
                    "arena {id}: bitmap has {bits} pages, counter {}",
                    a.used_pages
                ));
            }
            used += bits;
        }
        if used != self.used_pages || mapped != self.mapped || empty != self.empty {
            return Err(format!(
                "arena set counters: used {} (bitmaps {used}), mapped {} (arenas {mapped}), empty {} (arenas {empty})",
                self.used_pages, self.mapped, self.empty
            ));
        }
        Ok(())
    }

    /// Pages used in arena `id` (0 when it is not mapped).
    pub fn arena_used_pages(&self, id: u32) -> usize {
        self.arenas
            .get(id as usize)
            .and_then(Option::as_ref)
            .map_or(0, |a| a.used_pages)
    }

    /// Whether `run`'s pages are marked used in its arena (for the pool's invariant check).
    pub fn run_is_marked(&self, run: &PageRun) -> bool {
        match self.arenas.get(run.arena as usize) {
            Some(Some(a)) => (0..run.pages()).all(|p| !a.is_free(run.first_page() + p)),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
