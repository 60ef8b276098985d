//! A region's metadata area: chunks of [`CHUNK_WORDS`] words, each with a descriptor word
//! tagged by its owner, so that a successor finds its tables again.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use super::{bytemuck_words, errno, io, populate, Layout, Region, PAGE_SIZE};
use crate::Error;

/// Words in one metadata chunk.
pub const CHUNK_WORDS: usize = 32;
pub(super) const CHUNK_BYTES: usize = CHUNK_WORDS * 8;
/// A chunk's descriptor: set when the chunk is handed out, with the caller's tag below.
const CHUNK_LIVE: u64 = 1 << 63;
/// The most a tag may carry.
pub const CHUNK_TAG_MAX: u64 = CHUNK_LIVE - 1;
/// Chunk tags from this one up are the region's user's (the engine's); the pool's are below.
pub const USER_CHUNK_TAG: u64 = 1 << 62;

/// Chunks in a metadata area of `bytes`: a descriptor word each, then the chunks.
pub(super) fn chunks_in(bytes: usize) -> u32 {
    u32::try_from(bytes / (CHUNK_BYTES + 8)).unwrap_or(u32::MAX)
}

/// Chunks of an area of `bytes` that fit beside their descriptors (rounded up to a chunk).
fn usable_chunks_in(bytes: usize) -> u32 {
    let n = chunks_in(bytes) as usize;
    let first = n.div_ceil(CHUNK_WORDS) * CHUNK_WORDS;
    ((bytes / 8).saturating_sub(first) / CHUNK_WORDS).min(n) as u32
}

/// [`CHUNK_WORDS`] words of a region's metadata area, owned like a `Box<[u64]>`: handed out
/// once (by [`Region::claim_chunk`] or [`Region::take_adopted_chunks`]), tagged in the area by its
/// owner's tag so that a successor finds it again.
pub struct Chunk {
    ptr: NonNull<u64>,
    index: u32,
    /// Keeps the metadata mapping alive.
    _region: Region,
}

// SAFETY: a Chunk owns its words exclusively (each index is handed out once per process), like a
// Box<[u64]>; moving it moves that ownership.
unsafe impl Send for Chunk {}
// SAFETY: shared references only read; writes need `&mut Chunk`.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// The chunk's number in its area.
    pub fn index(&self) -> u32 {
        self.index
    }
}

impl Chunk {
    /// The chunk as atomics, for words several threads share (a journal).
    pub fn into_atomic(self) -> AtomicChunk {
        AtomicChunk(self)
    }
}

/// A table's chunks in place order, from `(place, chunk)` pairs as a predecessor tagged them;
/// `Err((found, expected))` names the first place that is missing or taken twice.
pub fn in_place_order(mut chunks: Vec<(usize, Chunk)>) -> Result<Vec<Chunk>, (usize, usize)> {
    chunks.sort_by_key(|(place, _)| *place);
    if let Some((i, (place, _))) = chunks.iter().enumerate().find(|(i, (p, _))| p != i) {
        return Err((*place, i));
    }
    Ok(chunks.into_iter().map(|(_, c)| c).collect())
}

/// A [`Chunk`] whose words are only ever reached as atomics, so threads may share it.
#[derive(Debug)]
pub struct AtomicChunk(Chunk);

impl AtomicChunk {
    /// The chunk's number in its area.
    pub fn index(&self) -> u32 {
        self.0.index
    }

    /// The words.
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: the chunk's CHUNK_WORDS aligned words are inside the live metadata mapping and
        // owned by this value alone; AtomicU64 has u64's size and alignment, and through this
        // type they are only ever reached as atomics (the `Chunk` inside is never handed back),
        // so sharing `&self` between threads races nothing.
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr().cast::<AtomicU64>(), CHUNK_WORDS) }
    }
}

impl std::ops::Deref for Chunk {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        // SAFETY: `ptr` points at CHUNK_WORDS aligned words inside the live metadata mapping,
        // owned by this chunk alone; `&self` rules out a `&mut` meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), CHUNK_WORDS) }
    }
}

impl std::ops::DerefMut for Chunk {
    fn deref_mut(&mut self) -> &mut [u64] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), CHUNK_WORDS) }
    }
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Chunk({})", self.index)
    }
}

impl Region {
    pub(super) fn descriptor(&self, index: u32) -> *mut u64 {
        debug_assert!(index < self.inner.chunks);
        // SAFETY: descriptors are the area's first `chunks` words, inside the mapping.
        unsafe { self.inner.meta.as_ptr().add(index as usize) }
    }

    fn chunk_ptr(&self, index: u32) -> NonNull<u64> {
        let first = (self.inner.chunks as usize).div_ceil(CHUNK_WORDS) * CHUNK_WORDS;
        debug_assert!(index < self.usable_chunks());
        // SAFETY: callers pass `index < usable_chunks()`, which counts only the chunks that end
        // within the area after the descriptors (`a_full_metadata_area_refuses_another_chunk`
        // writes the last word of the last one).
        unsafe { self.inner.meta.add(first + index as usize * CHUNK_WORDS) }
    }

    /// A zeroed chunk of the metadata area, tagged `tag` (below `1 << 63`) for a
    /// successor. The tag is written after the zeros, with a release fence between: a successor
    /// that sees the tag sees the zeros.
    pub fn claim_chunk(&self, tag: u64) -> Result<Chunk, Error> {
        assert!(tag <= CHUNK_TAG_MAX, "chunk tag {tag:#x}");
        let index = {
            let mut st = self.inner.chunk_state.lock();
            match st.1.pop() {
                Some(i) => i,
                None if st.0 < self.usable_chunks() => {
                    st.0 += 1;
                    if st.0 > self.inner.ready.load(std::sync::atomic::Ordering::Relaxed) {
                        self.inner
                            .unready
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    st.0 - 1
                }
                None => {
                    return Err(Error::RegionFull {
                        what: "metadata chunks",
                        count: u64::from(self.usable_chunks()),
                    })
                }
            }
        };
        let mut chunk = Chunk {
            ptr: self.chunk_ptr(index),
            index,
            _region: self.clone(),
        };
        chunk.fill(0);
        // SAFETY: the descriptor of a chunk this thread owns alone (handed out once, above), an
        // aligned word inside the metadata mapping; it is only ever written as an atomic.
        let descriptor = unsafe { AtomicU64::from_ptr(self.descriptor(index)) };
        // Release: the zeros land before the tag that makes a successor read them.
        descriptor.store(CHUNK_LIVE | tag, std::sync::atomic::Ordering::Release);
        Ok(chunk)
    }

    /// Makes the next `ahead` chunks never handed out (and their descriptors) resident, each
    /// page read once (which faults it in without changing it), so that the allocations that
    /// take them do not fault: the first write of a page of shared memory is a page fault,
    /// which an I/O thread must not take while memory is short. Returns the chunks made ready
    /// now.
    pub fn prefault_chunks(&self, ahead: u32) -> u32 {
        use std::sync::atomic::Ordering::Relaxed;
        let next = self.inner.chunk_state.lock().0;
        let from = self.inner.ready.load(Relaxed).max(next);
        let to = next.saturating_add(ahead).min(self.usable_chunks());
        if to > from {
            // The kernel faults the pages in (`MADV_POPULATE_READ`): no load of ours touches
            // words another thread may be writing meanwhile.
            let last = to - 1;
            populate(
                self.descriptor(from).cast(),
                self.descriptor(last).cast(),
                8,
            );
            populate(
                self.chunk_ptr(from).as_ptr().cast(),
                self.chunk_ptr(last).as_ptr().cast(),
                CHUNK_BYTES,
            );
        }
        self.inner.ready.fetch_max(to, Relaxed);
        to.saturating_sub(from)
    }

    /// Chunks handed out before [`Region::prefault_chunks`] made them resident.
    pub fn unready_chunks(&self) -> u64 {
        self.inner
            .unready
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Chunks that fit beside their descriptors.
    pub(super) fn usable_chunks(&self) -> u32 {
        usable_chunks_in(self.inner.layout.meta_bytes)
    }

    /// The chunks a predecessor tagged that `want` picks by their tag, in chunk order; each is
    /// handed out once, the others stay for another call. A fresh region has none.
    pub fn take_adopted_chunks(&self, mut want: impl FnMut(u64) -> bool) -> Vec<(u64, Chunk)> {
        let mut adopted = self.inner.adopted.lock();
        let mut taken = Vec::new();
        adopted.retain(|&(tag, index)| {
            if !want(tag) {
                return true;
            }
            taken.push((
                tag,
                Chunk {
                    ptr: self.chunk_ptr(index),
                    index,
                    _region: self.clone(),
                },
            ));
            false
        });
        // The tags were read before the chunks' words: the acquire pairs with the release
        // between a chunk's zeros and its tag.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        taken
    }

    /// The tagged chunks' (tag, index), read from the descriptors with `pread`, not through a
    /// mapping: a read fault on a hole of a memfd allocates a page, and most of the area is
    /// holes. A read that fails or stops short is an error: a chunk missed would be a table
    /// cut short.
    pub(super) fn scan_descriptors(
        fd: BorrowedFd<'_>,
        layout: &Layout,
    ) -> Result<Vec<(u64, u32)>, Error> {
        let usable = usable_chunks_in(layout.meta_bytes);
        let mut descriptors = vec![0u64; usable as usize];
        let raw: &mut [u8] = bytemuck_words(&mut descriptors);
        let mut done = 0;
        while done < raw.len() {
            let off = (PAGE_SIZE + done) as libc::off_t;
            // SAFETY: reads into the rest of a buffer we own, of the length given.
            let n = unsafe {
                libc::pread(
                    fd.as_raw_fd(),
                    raw[done..].as_mut_ptr().cast(),
                    raw.len() - done,
                    off,
                )
            };
            if n < 0 {
                let e = errno();
                if e == libc::EINTR {
                    continue;
                }
                return Err(io("pread of the chunk descriptors", e));
            }
            if n == 0 {
                return Err(io("pread of the chunk descriptors", libc::ENODATA));
            }
            done += n as usize;
        }
        Ok((0..usable)
            .zip(descriptors)
            .filter(|(_, d)| d & CHUNK_LIVE != 0)
            .map(|(i, d)| (d & CHUNK_TAG_MAX, i))
            .collect())
    }
}
