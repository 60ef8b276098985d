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
use std::sync::atomic::{AtomicU64, Ordering};

mod region;

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

/// How a new arena's pages are made resident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefault {
    /// `MAP_POPULATE`: fastest, but the kernel holds the process's `mmap_lock` (read) while it
    /// allocates the pages, so a thread that waits for reclaim in there blocks every `mmap`,
    /// `munmap` and `mprotect` of the process meanwhile.
    Populate,
    /// Map, then write one byte per page: each page fault takes only the new mapping's own lock
    /// (per-VMA locking, Linux >= 6.4), so a refill thread stuck in reclaim blocks nobody else.
    Touch,
}

/// One mapping of `ARENA_BYTES`: an arena's memory, mapped but not yet in an [`ArenaSet`] (see
/// [`ArenaSet::insert`]). Anonymous and private, or a place of a [`Region`] (shared).
pub struct Mapping {
    ptr: NonNull<u8>,
    /// The region and the arena's place in it, for a shared mapping.
    place: Option<(Region, u32)>,
    /// Whether dropping the mapping punches its pages out of the region: not for an arena a
    /// predecessor left until the adoption succeeded (a refused one destroys nothing).
    punch: bool,
}

/// Where a pool's arenas come from: anonymous memory, or a [`Region`] a successor can adopt.
#[derive(Debug, Clone, Default)]
pub struct Source(Option<Region>);

impl Source {
    /// Arenas in `region`.
    pub fn region(region: Region) -> Source {
        Source(Some(region))
    }

    /// The region, if the arenas live in one.
    pub fn as_region(&self) -> Option<&Region> {
        self.0.as_ref()
    }

    /// A new empty arena: see [`Mapping::new_counted`].
    pub fn map(&self, prefault: Prefault, touched: &AtomicU64) -> Result<Mapping, i32> {
        match &self.0 {
            None => Mapping::new_counted(prefault, touched),
            Some(r) => r.map_new(prefault, touched),
        }
    }
}

impl Mapping {
    /// Maps an arena and makes its pages resident. Returns the errno of a failed `mmap`.
    pub fn new(prefault: Prefault) -> Result<Mapping, i32> {
        Mapping::new_counted(prefault, &AtomicU64::new(0))
    }

    /// [`Mapping::new`], adding to `touched` as [`Prefault::Touch`] faults pages in (each
    /// page), so that a waiter can tell a slow refill from a stuck one.
    pub fn new_counted(prefault: Prefault, touched: &AtomicU64) -> Result<Mapping, i32> {
        let populate = match prefault {
            Prefault::Populate => libc::MAP_POPULATE,
            Prefault::Touch => 0,
        };
        // SAFETY: an anonymous private mapping with no address hint has no preconditions; the result
        // is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ARENA_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | populate,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::ENOMEM));
        }
        let mapping = NonNull::new(ptr.cast::<u8>())
            .map(|ptr| Mapping {
                ptr,
                place: None,
                punch: false,
            })
            .ok_or(libc::ENOMEM)?;
        if prefault == Prefault::Touch {
            mapping.touch(touched);
        }
        Ok(mapping)
    }

    /// A fresh shared mapping of a region's arena place (its pages read as zeros).
    fn from_region(
        ptr: NonNull<u8>,
        prefault: Prefault,
        touched: &AtomicU64,
        region: Region,
        place: u32,
    ) -> Mapping {
        let mapping = Mapping {
            ptr,
            place: Some((region, place)),
            punch: true,
        };
        // A shared mapping is made resident either way (`MAP_POPULATE` was not asked of the
        // `mmap`): by the kernel, a stride at a time (`MADV_POPULATE_WRITE`: a page fault each
        // is several times slower for shared memory, and a swap storm needs the reserve fast),
        // or, where the kernel cannot (before Linux 5.14), by writing each page.
        let _ = prefault;
        if !mapping.populate(libc::MADV_POPULATE_WRITE, touched) {
            mapping.touch(touched);
        }
        mapping
    }

    /// Makes the arena resident with `advice` (`MADV_POPULATE_READ` or `_WRITE`),
    /// [`TOUCH_STRIDE`] pages a call, adding to `touched` as it goes; false if the kernel does
    /// not take the advice (the caller faults the pages in itself).
    fn populate(&self, advice: libc::c_int, touched: &AtomicU64) -> bool {
        for first in (0..ARENA_PAGES).step_by(TOUCH_STRIDE) {
            // SAFETY: the range is inside this mapping of ARENA_BYTES (TOUCH_STRIDE divides
            // ARENA_PAGES); populating changes no byte of it.
            let rc = unsafe {
                libc::madvise(
                    self.ptr.as_ptr().add(first * PAGE_SIZE).cast(),
                    TOUCH_STRIDE * PAGE_SIZE,
                    advice,
                )
            };
            if rc != 0 {
                return false;
            }
            touched.fetch_add(TOUCH_STRIDE as u64, Ordering::Relaxed);
        }
        true
    }

    /// A shared mapping of an arena a predecessor left: each page is read in, never written.
    fn from_existing(ptr: NonNull<u8>, region: Region, place: u32) -> Mapping {
        let mapping = Mapping {
            ptr,
            place: Some((region, place)),
            punch: false,
        };
        if mapping.populate(libc::MADV_POPULATE_READ, &AtomicU64::new(0)) {
            return mapping;
        }
        for page in 0..ARENA_PAGES {
            // SAFETY: the offset is inside the fresh mapping of ARENA_BYTES; a volatile read so
            // the fault is not optimised away.
            unsafe { mapping.ptr.as_ptr().add(page * PAGE_SIZE).read_volatile() };
        }
        mapping
    }

    /// Writes one byte of each page, adding to `touched` after each. Only for
    /// a mapping whose bytes are all zeros (fresh).
    fn touch(&self, touched: &AtomicU64) {
        for page in 0..ARENA_PAGES {
            // SAFETY: the offset is inside the fresh mapping of ARENA_BYTES, which nothing else
            // references yet; a volatile write (of the zero already there) so the fault is not
            // optimised away.
            unsafe { self.ptr.as_ptr().add(page * PAGE_SIZE).write_volatile(0) };
            touched.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The arena's place in its region, for a shared mapping.
    pub fn place(&self) -> Option<u32> {
        self.place.as_ref().map(|(_, p)| *p)
    }

    /// The whole arena (tests only: in a set, arenas are reached through `PageRun`s).
    #[cfg(test)]
    fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is ARENA_BYTES long and owned by this value; tests use it alone.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), ARENA_BYTES) }
    }

    /// The whole arena, mutable (tests only).
    #[cfg(test)]
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), ARENA_BYTES) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from a successful mmap of ARENA_BYTES and is unmapped exactly once, here.
        // Invariant 2 of the module guarantees no PageRun points into it any more.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), ARENA_BYTES);
        }
        if let Some((region, place)) = self.place.take() {
            // The pool gave the arena back: its bytes leave the file, as an anonymous arena's
            // leave the process (unless it is a predecessor's arena not yet adopted).
            region.release(place, self.punch);
        }
    }
}

// SAFETY: a Mapping is plain memory owned by this value; it is only touched through PageRuns, whose
// own access rules (see the module docs) keep threads apart.
unsafe impl Send for Mapping {}

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
mod tests {
    use super::*;

    #[test]
    fn runs_do_not_overlap_and_hold_their_bytes() {
        let mut set = ArenaSet::new(0, true);
        let mut runs: Vec<PageRun> = (0..40)
            .map(|i| set.alloc_run(1 + i % 8, Placement::Any).unwrap())
            .collect();
        for (i, r) in runs.iter_mut().enumerate() {
            r.bytes_mut().fill(i as u8);
        }
        for (i, r) in runs.iter().enumerate() {
            assert!(r.bytes().iter().all(|&b| b == i as u8));
        }
        set.check().unwrap();
        for r in runs {
            set.free_run(r);
        }
        assert_eq!(set.used_pages(), 0);
        assert_eq!(
            set.mapped_arenas(),
            0,
            "empty arenas beyond the reserve are unmapped"
        );
        set.check().unwrap();
    }

    #[test]
    fn reserve_keeps_one_empty_arena() {
        let mut set = ArenaSet::new(1, true);
        let r = set.alloc_run(4, Placement::Any).unwrap();
        assert_eq!(set.free_run(r), 0);
        assert_eq!(set.mapped_arenas(), 1);
    }

    #[test]
    fn exclude_and_no_map_report_no_room() {
        let mut set = ArenaSet::new(0, true);
        let r = set.alloc_run(8, Placement::Any).unwrap();
        assert_eq!(
            set.alloc_run(8, Placement::AwayFrom(r.arena()))
                .unwrap_err(),
            MapError::NoRoom
        );
        let r2 = set.alloc_run(8, Placement::Any).unwrap();
        assert_eq!(r2.arena(), r.arena());
        set.free_run(r);
        set.free_run(r2);
    }

    #[test]
    fn allocation_prefers_the_fullest_arena() {
        let mut set = ArenaSet::new(2, true);
        let a: Vec<PageRun> = (0..ARENA_PAGES)
            .map(|_| set.alloc_run(1, Placement::Any).unwrap())
            .collect();
        let b: Vec<PageRun> = (0..ARENA_PAGES)
            .map(|_| set.alloc_run(1, Placement::Any).unwrap())
            .collect();
        assert_ne!(a[0].arena(), b[0].arena());
        let (a_id, b_id) = (a[0].arena(), b[0].arena());
        // Free 20 pages in a, 500 in b: the next allocation after a miss goes to a (fuller), and b
        // is the arena to empty.
        let mut a = a;
        let mut b = b;
        for r in a.drain(..20) {
            set.free_run(r);
        }
        for r in b.drain(..500) {
            set.free_run(r);
        }
        let r = set.alloc_run(1, Placement::AwayFrom(b_id)).unwrap();
        assert_eq!(r.arena(), a_id);
        assert_eq!(set.sparsest(), Some(b_id));
        for r in a.into_iter().chain(b).chain([r]) {
            set.free_run(r);
        }
    }
}
