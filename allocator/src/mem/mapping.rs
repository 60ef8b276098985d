//! An arena's mapping: anonymous, or a place of a region; made resident as [`Prefault`] says,
//! unmapped (and for a region's place, punched out) on drop. Its `unsafe` blocks cite the
//! numbered invariants of the `mem` module.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Region, ARENA_BYTES, ARENA_PAGES, PAGE_SIZE, TOUCH_STRIDE};

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
    pub(super) ptr: NonNull<u8>,
    /// The region and the arena's place in it, for a shared mapping.
    place: Option<(Region, u32)>,
    /// Whether dropping the mapping punches its pages out of the region: not for an arena a
    /// predecessor left until the adoption succeeded (a refused one destroys nothing).
    pub(super) punch: bool,
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
        // Miri maps only plain private anonymous memory: the hints go (the bytes are the same).
        let flags = if cfg!(miri) {
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS
        } else {
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | populate
        };
        // SAFETY: an anonymous private mapping with no address hint has no preconditions; the result
        // is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ARENA_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
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
    pub(super) fn from_region(
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
    pub(super) fn from_existing(ptr: NonNull<u8>, region: Region, place: u32) -> Mapping {
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
    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is ARENA_BYTES long and owned by this value; tests use it alone.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), ARENA_BYTES) }
    }

    /// The whole arena, mutable (tests only).
    #[cfg(test)]
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
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
