//! Pool memory that outlives the process: one memfd a successor can adopt (issue 15).
//!
//! # Layout
//! ```text
//! offset 0              header page: fixed fields, then their checksum (FNV-1a 64)
//! offset PAGE_SIZE      metadata area: `meta_bytes` of chunk descriptors and chunks
//! offset table_offset   table area: `table_bytes` of words its user lays out (the slot table)
//! offset arena_offset   arena 0, arena 1, ... (ARENA_BYTES each, `arenas` of them)
//! ```
//! The memfd is sized once and sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`), so no holder
//! of its descriptor can cut a page from under a mapping (which would make the next access a
//! `SIGBUS`). It is sparse: a page costs memory once written. An arena is mapped at its own
//! offset (`MAP_SHARED`), so its number is its place in the file; giving it back unmaps it and
//! punches its range out of the file (`FALLOC_FL_PUNCH_HOLE`), as `munmap` of an anonymous arena
//! returns its pages.
//!
//! What survives is only what was written: a successor that [`Region::adopt`]s the descriptor
//! checks the header (magic, format version, page and arena sizes, the file's size and seals,
//! the checksum) and refuses, naming the bad value, on any doubt. It maps the arenas the pool
//! says are live with [`Region::map_existing`], which reads each page in (never writes: the bytes
//! are the predecessor's objects).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Mapping, Prefault, ARENA_BYTES, PAGE_SIZE};
use crate::Error;

/// "uzrampol", little endian.
const MAGIC: u64 = u64::from_le_bytes(*b"uzrampol");
/// The region's format. A successor refuses any other.
pub const REGION_VERSION: u64 = 1;

// Header words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_PAGE: usize = 2;
const H_ARENA: usize = 3;
const H_ARENAS: usize = 4;
const H_META_BYTES: usize = 5;
const H_TABLE_OFFSET: usize = 6;
const H_TABLE_BYTES: usize = 7;
const H_ARENA_OFFSET: usize = 8;
const H_TOTAL: usize = 9;
/// Words covered by the checksum.
const H_FIXED: usize = 10;
const H_CHECKSUM: usize = H_FIXED;
/// Not checksummed, written after creation: [`STATE_CLOSED`] once the owner gave the pool up.
const H_STATE: usize = 16;
const STATE_CLOSED: u64 = u64::from_le_bytes(*b"closed!!");

/// What a region holds: asked of [`Region::create`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSize {
    /// Arena places (2 MiB each): the most the pool can map at once.
    pub arenas: u32,
    /// Bytes of the metadata area (chunks and their descriptors), rounded up to pages.
    pub meta_bytes: usize,
    /// Bytes of the table area, rounded up to pages.
    pub table_bytes: usize,
}

/// Where everything is in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    arenas: u32,
    meta_bytes: usize,
    table_offset: usize,
    table_bytes: usize,
    arena_offset: usize,
    total: usize,
}

impl Layout {
    fn of(size: RegionSize) -> Option<Layout> {
        let page = |b: usize| b.checked_next_multiple_of(PAGE_SIZE);
        let meta_bytes = page(size.meta_bytes)?;
        let table_bytes = page(size.table_bytes)?;
        let table_offset = PAGE_SIZE.checked_add(meta_bytes)?;
        let arena_offset = table_offset
            .checked_add(table_bytes)?
            .checked_next_multiple_of(ARENA_BYTES)?;
        let total = (size.arenas as usize)
            .checked_mul(ARENA_BYTES)?
            .checked_add(arena_offset)?;
        // Offsets must fit the file API's off_t.
        libc::off_t::try_from(total).ok()?;
        Some(Layout {
            arenas: size.arenas,
            meta_bytes,
            table_offset,
            table_bytes,
            arena_offset,
            total,
        })
    }

    fn words(&self) -> [u64; H_FIXED] {
        let mut w = [0u64; H_FIXED];
        w[H_MAGIC] = MAGIC;
        w[H_VERSION] = REGION_VERSION;
        w[H_PAGE] = PAGE_SIZE as u64;
        w[H_ARENA] = ARENA_BYTES as u64;
        w[H_ARENAS] = u64::from(self.arenas);
        w[H_META_BYTES] = self.meta_bytes as u64;
        w[H_TABLE_OFFSET] = self.table_offset as u64;
        w[H_TABLE_BYTES] = self.table_bytes as u64;
        w[H_ARENA_OFFSET] = self.arena_offset as u64;
        w[H_TOTAL] = self.total as u64;
        w
    }
}

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Faults in, readable, the pages from `first` to `last + last_len` of a shared mapping
/// (`MADV_POPULATE_READ`, Linux 5.14; on an older kernel nothing is done, and the first
/// write faults as before).
fn populate(first: *const u8, last: *const u8, last_len: usize) {
    let start = first as usize & !(PAGE_SIZE - 1);
    let end = (last as usize + last_len).next_multiple_of(PAGE_SIZE);
    // SAFETY: the range lies within one live mapping of the region (callers pass two addresses
    // of it, the second at least the first), page-aligned here; madvise changes no byte.
    unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            end - start,
            libc::MADV_POPULATE_READ,
        );
    }
}

/// A word buffer as bytes (native order, as the descriptors are written).
fn bytemuck_words(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: u64 has no padding and any byte pattern is a valid u64; the byte slice covers
    // exactly the words' memory and borrows it mutably for its life.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u8>(), words.len() * 8) }
}

/// FNV-1a over the header's fixed words: catches a flipped bit, not an adversary (whoever can
/// write the memfd can write the pool's objects too).
fn checksum(words: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Pool memory in a memfd: see the module docs. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Region {
    inner: Arc<Inner>,
}

struct Inner {
    fd: OwnedFd,
    /// The header page, mapped shared and read-write.
    header: NonNull<u64>,
    layout: Layout,
    /// Bit set = the arena's place in the file is mapped by this process.
    slots: Mutex<Vec<u64>>,
    /// The metadata area, mapped shared (dangling when it is empty).
    meta: NonNull<u64>,
    /// The table area, mapped shared (dangling when it is empty).
    table: NonNull<AtomicU64>,
    /// Chunks the metadata area holds.
    chunks: u32,
    /// The next chunk never handed out in this process, and those below it that are free.
    chunk_state: Mutex<(u32, Vec<u32>)>,
    /// Chunks a predecessor tagged, not yet taken (tag, index).
    adopted: Mutex<Vec<(u64, u32)>>,
    /// Chunks below this one (and their descriptors) are resident.
    ready: std::sync::atomic::AtomicU32,
    /// Chunks handed out before they were made resident (their first write faulted).
    unready: AtomicU64,
}

// SAFETY: the pointers are into shared mappings owned by `Inner` for its whole life. Through
// `&Inner` the header's fixed words are only read, its state word is written by its owner alone,
// each chunk descriptor by the one thread that took its chunk (atomically), the table area is only
// reached as atomics, and each chunk's words by the one `Chunk` that owns them; the rest is
// behind mutexes. Nothing in `Inner` is tied to a thread.
unsafe impl Send for Inner {}
// SAFETY: as for Send.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: `header` came from a successful mmap of one page, `meta` and `table` (when
        // their areas are not empty) from mmaps of their areas; each is unmapped once, here.
        // Every `Chunk` and every borrow of the table holds the `Region`, so none outlives them.
        unsafe {
            libc::munmap(self.header.as_ptr().cast(), PAGE_SIZE);
            if self.layout.meta_bytes > 0 {
                libc::munmap(self.meta.as_ptr().cast(), self.layout.meta_bytes);
            }
            if self.layout.table_bytes > 0 {
                libc::munmap(self.table.as_ptr().cast(), self.layout.table_bytes);
            }
        }
    }
}

/// Words in one metadata chunk.
pub const CHUNK_WORDS: usize = 32;
const CHUNK_BYTES: usize = CHUNK_WORDS * 8;
/// A chunk's descriptor: set when the chunk is handed out, with the caller's tag below.
const CHUNK_LIVE: u64 = 1 << 63;
/// The most a tag may carry.
pub const CHUNK_TAG_MAX: u64 = CHUNK_LIVE - 1;
/// Chunk tags from this one up are the region's user's (the engine's); the pool's are below.
pub const USER_CHUNK_TAG: u64 = 1 << 62;

/// Chunks in a metadata area of `bytes`: a descriptor word each, then the chunks.
fn chunks_in(bytes: usize) -> u32 {
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

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("fd", &self.inner.fd.as_raw_fd())
            .field("layout", &self.inner.layout)
            .finish()
    }
}

fn refused(reason: String) -> Error {
    Error::RegionRefused { reason }
}

fn io(what: &'static str, errno: i32) -> Error {
    Error::RegionIo { what, errno }
}

/// Maps `len` bytes of `fd` at `offset`, shared, read-write.
fn map_shared(fd: BorrowedFd<'_>, offset: usize, len: usize) -> Result<NonNull<u8>, i32> {
    let offset = libc::off_t::try_from(offset).map_err(|_| libc::EOVERFLOW)?;
    // SAFETY: a shared mapping of a descriptor we hold, with no address hint; the result is checked
    // against MAP_FAILED before use. The file is sealed against shrinking, so every page of the
    // range stays backed while it is mapped.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            offset,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(errno());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or(libc::ENOMEM)
}

impl Region {
    /// A new, empty region of `size`. `name` shows in `/proc/PID/maps` and `/proc/PID/fd`
    /// (`memfd:NAME`).
    pub fn create(name: &str, size: RegionSize) -> Result<Region, Error> {
        if size.arenas == 0 {
            return Err(Error::InvalidConfig {
                what: "arenas",
                value: 0,
            });
        }
        let layout = Layout::of(size).ok_or(Error::InvalidConfig {
            what: "region size",
            value: u64::from(size.arenas),
        })?;
        let cname = CString::new(name).map_err(|_| refused(format!("name {name:?} has a NUL")))?;
        // SAFETY: a valid C string and flags; the result is checked before use.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io("memfd_create", errno()));
        }
        // SAFETY: `raw` is a fresh descriptor this function owns from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // `Layout::of` checked that the total fits an off_t.
        let len = layout.total as libc::off_t;
        // SAFETY: plain calls on a descriptor we own; results checked.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(io("ftruncate", errno()));
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(io("F_ADD_SEALS", errno()));
        }
        let header = map_shared(fd.as_fd(), 0, PAGE_SIZE).map_err(|e| io("mmap", e))?;
        let words = layout.words();
        let sum = checksum(&words);
        let header = header.cast::<u64>();
        for (i, w) in words.iter().chain([&sum]).enumerate() {
            // SAFETY: the header mapping is one page, 8-byte aligned, and H_FIXED + 1 words fit
            // in it; nothing else maps it yet.
            unsafe { header.as_ptr().add(i).write(*w) };
        }
        Region::from_parts(fd, header, layout, Vec::new())
    }

    /// The region over `fd` laid out as `layout`, its areas mapped; unmaps `header` on failure.
    fn from_parts(
        fd: OwnedFd,
        header: NonNull<u64>,
        layout: Layout,
        adopted: Vec<(u64, u32)>,
    ) -> Result<Region, Error> {
        let unmap_header = || {
            // SAFETY: the header mapping made by the caller, unmapped once on a failure path.
            unsafe { libc::munmap(header.as_ptr().cast(), PAGE_SIZE) };
        };
        let meta = if layout.meta_bytes == 0 {
            NonNull::dangling()
        } else {
            match map_shared(fd.as_fd(), PAGE_SIZE, layout.meta_bytes) {
                Ok(p) => p.cast::<u64>(),
                Err(e) => {
                    unmap_header();
                    return Err(io("mmap", e));
                }
            }
        };
        let table = if layout.table_bytes == 0 {
            NonNull::dangling()
        } else {
            match map_shared(fd.as_fd(), layout.table_offset, layout.table_bytes) {
                Ok(p) => p.cast::<AtomicU64>(),
                Err(e) => {
                    unmap_header();
                    if layout.meta_bytes > 0 {
                        // SAFETY: the metadata mapping made above, unmapped once here.
                        unsafe { libc::munmap(meta.as_ptr().cast(), layout.meta_bytes) };
                    }
                    return Err(io("mmap", e));
                }
            }
        };
        let chunks = chunks_in(layout.meta_bytes);
        let top = adopted.iter().map(|&(_, i)| i + 1).max().unwrap_or(0);
        let free = (0..top)
            .rev()
            .filter(|i| !adopted.iter().any(|&(_, a)| a == *i))
            .collect();
        Ok(Region {
            inner: Arc::new(Inner {
                fd,
                header,
                layout,
                slots: Mutex::new(vec![0; (layout.arenas as usize).div_ceil(64)]),
                meta,
                table,
                chunks,
                chunk_state: Mutex::new((top, free)),
                adopted: Mutex::new(adopted),
                ready: std::sync::atomic::AtomicU32::new(top),
                unready: AtomicU64::new(0),
            }),
        })
    }

    fn descriptor(&self, index: u32) -> *mut u64 {
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
    fn usable_chunks(&self) -> u32 {
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
    fn scan_descriptors(fd: BorrowedFd<'_>, layout: &Layout) -> Result<Vec<(u64, u32)>, Error> {
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

    /// Whether this build could take over the region in `fd`: its seals, its header (magic,
    /// format version, checksum, sizes, layout) and its state, as [`Region::adopt`] checks them
    /// first. Reads the header only; maps and writes nothing. For a new binary asked to take a
    /// device over from a running one (an upgrade): a refusal here leaves the old one serving.
    pub fn check(fd: BorrowedFd<'_>) -> Result<(), Error> {
        // SAFETY: an fstat into a zeroed struct on a borrowed descriptor; result checked.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io("fstat", errno()));
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        // SAFETY: plain call on a borrowed descriptor; result checked.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0
            || seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
                != libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
        {
            return Err(refused(format!(
                "not a memfd sealed against resizing (seals {seals:#x})"
            )));
        }
        let mut words = [0u64; H_STATE + 1];
        let bytes = bytemuck_words(&mut words);
        // SAFETY: a pread into the buffer just made, of its length, on a borrowed descriptor.
        let n = unsafe { libc::pread(fd.as_raw_fd(), bytes.as_mut_ptr().cast(), bytes.len(), 0) };
        if usize::try_from(n).ok() != Some(bytes.len()) {
            return Err(refused(format!(
                "its header cannot be read ({size} bytes in the file)"
            )));
        }
        let mut fixed = [0u64; H_FIXED + 1];
        fixed.copy_from_slice(&words[..=H_FIXED]);
        Self::check_header(&fixed, size)?;
        if words[H_STATE] == STATE_CLOSED {
            return Err(refused(
                "its owner closed it (the pool was dropped, not left): nothing to adopt".into(),
            ));
        }
        Ok(())
    }

    /// Takes over a region a predecessor made, after checking everything its header says against
    /// this build and the file. Any doubt is a refusal that names the value; nothing is written.
    pub fn adopt(fd: OwnedFd) -> Result<Region, Error> {
        // SAFETY: an fstat into a zeroed struct on a descriptor we own; result checked.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io("fstat", errno()));
        }
        let size = u64::try_from(st.st_size).unwrap_or(0);
        if size < PAGE_SIZE as u64 {
            return Err(refused(format!(
                "the file is {size} bytes, shorter than its header"
            )));
        }
        // SAFETY: plain call on a descriptor we own; result checked.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(refused(format!(
                "not a memfd (F_GET_SEALS: {})",
                std::io::Error::from_raw_os_error(errno())
            )));
        }
        if seals & (libc::F_SEAL_SHRINK | libc::F_SEAL_GROW)
            != libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
        {
            return Err(refused(format!(
                "its size is not sealed (seals {seals:#x}): it could shrink under a mapping"
            )));
        }
        let header = map_shared(fd.as_fd(), 0, PAGE_SIZE)
            .map_err(|e| io("mmap", e))?
            .cast::<u64>();
        let mut words = [0u64; H_FIXED + 1];
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: the header mapping is one page, aligned, and holds H_FIXED + 1 words.
            *w = unsafe { header.as_ptr().add(i).read_volatile() };
        }
        // SAFETY: word H_STATE is inside the one-page header mapping, aligned.
        let state = unsafe { header.as_ptr().add(H_STATE).read_volatile() };
        let checked = Self::check_header(&words, size).and_then(|l| {
            if state == STATE_CLOSED {
                Err(refused(
                    "its owner closed it (the pool was dropped, not left): nothing to adopt".into(),
                ))
            } else {
                Ok(l)
            }
        });
        let layout = match checked {
            Ok(l) => l,
            Err(e) => {
                // SAFETY: the header mapping made above, unmapped once on this refusal path.
                unsafe { libc::munmap(header.as_ptr().cast(), PAGE_SIZE) };
                return Err(e);
            }
        };
        let adopted = match Self::scan_descriptors(fd.as_fd(), &layout) {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the header mapping made above, unmapped once on this failure path.
                unsafe { libc::munmap(header.as_ptr().cast(), PAGE_SIZE) };
                return Err(e);
            }
        };
        Region::from_parts(fd, header, layout, adopted)
    }

    fn check_header(words: &[u64; H_FIXED + 1], file_size: u64) -> Result<Layout, Error> {
        let expect = |what: &str, at: usize, want: u64| {
            if words[at] == want {
                Ok(())
            } else {
                Err(refused(format!(
                    "{what} is {:#x}, expected {want:#x}",
                    words[at]
                )))
            }
        };
        expect("the magic", H_MAGIC, MAGIC)?;
        expect("the format version", H_VERSION, REGION_VERSION)?;
        let sum = checksum(&words[..H_FIXED]);
        if sum != words[H_CHECKSUM] {
            return Err(refused(format!(
                "the header's checksum is {:#x}, its fields sum to {sum:#x}",
                words[H_CHECKSUM]
            )));
        }
        expect("the page size", H_PAGE, PAGE_SIZE as u64)?;
        expect("the arena size", H_ARENA, ARENA_BYTES as u64)?;
        // The layout must be the one these sizes give: recompute it, compare every word.
        let size = |at: usize| usize::try_from(words[at]).ok();
        let recomputed = match (
            u32::try_from(words[H_ARENAS]).ok(),
            size(H_META_BYTES),
            size(H_TABLE_BYTES),
        ) {
            (Some(arenas), Some(meta_bytes), Some(table_bytes)) if arenas > 0 => {
                Layout::of(RegionSize {
                    arenas,
                    meta_bytes,
                    table_bytes,
                })
            }
            _ => None,
        };
        let layout = match recomputed {
            Some(l) if l.words()[..] == words[..H_FIXED] => l,
            _ => {
                return Err(refused(format!(
                    "its layout does not add up: {} arenas at offset {}, {} bytes of metadata, {} bytes of table at {}, {} bytes in all",
                    words[H_ARENAS],
                    words[H_ARENA_OFFSET],
                    words[H_META_BYTES],
                    words[H_TABLE_BYTES],
                    words[H_TABLE_OFFSET],
                    words[H_TOTAL]
                )))
            }
        };
        if layout.total as u64 != file_size {
            return Err(refused(format!(
                "the header says {} bytes, the file has {file_size}",
                layout.total
            )));
        }
        Ok(layout)
    }

    /// The table area's words: its user's layout, kept for a successor. A page of it costs
    /// memory once written (a read fault on an unwritten page allocates one too, so its user
    /// keeps its own record of which pages it wrote).
    pub fn table(&self) -> &[AtomicU64] {
        let len = self.inner.layout.table_bytes / 8;
        if len == 0 {
            return &[];
        }
        // SAFETY: `table` maps `table_bytes` of the file, 8-byte aligned, for as long as `Inner`
        // lives, and the borrow of `self` keeps it alive. Every access is atomic, so shared
        // access, from this process or another, is no data race.
        unsafe { std::slice::from_raw_parts(self.inner.table.as_ptr(), len) }
    }

    /// Marks the region as given up by its owner: [`Region::adopt`] refuses it from now on. A
    /// pool does this as it is dropped (not left), before it gives its arenas back, so that no
    /// successor adopts tables whose objects are gone.
    pub fn close(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: word H_STATE is inside the one-page header mapping, aligned; only the owner
        // writes it.
        unsafe {
            self.inner
                .header
                .as_ptr()
                .add(H_STATE)
                .write_volatile(STATE_CLOSED)
        };
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }

    /// The memfd, to hand to a successor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// Bytes of the table area.
    pub fn table_bytes(&self) -> usize {
        self.inner.layout.table_bytes
    }

    /// The most arenas the region holds.
    pub fn max_arenas(&self) -> u32 {
        self.inner.layout.arenas
    }

    /// Bytes of the metadata area.
    pub fn meta_bytes(&self) -> usize {
        self.inner.layout.meta_bytes
    }

    fn arena_offset(&self, slot: u32) -> usize {
        self.inner.layout.arena_offset + slot as usize * ARENA_BYTES
    }

    /// Claims the lowest free arena place, or `None` when all are mapped.
    fn claim(&self) -> Option<u32> {
        let mut slots = self.inner.slots.lock();
        for (w, word) in slots.iter_mut().enumerate() {
            if *word != u64::MAX {
                let bit = (!*word).trailing_zeros();
                let slot = w as u32 * 64 + bit;
                if slot >= self.inner.layout.arenas {
                    return None;
                }
                *word |= 1 << bit;
                return Some(slot);
            }
        }
        None
    }

    /// Claims arena place `slot` (one the predecessor used); false if it is taken or out of range.
    fn claim_at(&self, slot: u32) -> bool {
        if slot >= self.inner.layout.arenas {
            return false;
        }
        let mut slots = self.inner.slots.lock();
        let (w, bit) = (slot as usize / 64, slot % 64);
        if slots[w] & (1 << bit) != 0 {
            return false;
        }
        slots[w] |= 1 << bit;
        true
    }

    /// Maps a new arena at the lowest free place, its pages emptied and made resident as
    /// `prefault` says. ENOSPC when every place is mapped.
    pub(super) fn map_new(
        &self,
        prefault: Prefault,
        touched: &std::sync::atomic::AtomicU64,
    ) -> Result<Mapping, i32> {
        let slot = self.claim().ok_or(libc::ENOSPC)?;
        // A place is punched out when it is given back, and a predecessor's leftovers once its
        // pool is adopted, so it usually reads as zeros. Where it does not (a punch that failed,
        // a place taken before the leftovers went), its old bytes are as harmless as an
        // anonymous arena's free pages: the pool reads only objects it wrote.
        match self.map_slot(slot) {
            Ok(ptr) => Ok(Mapping::from_region(
                ptr,
                prefault,
                touched,
                self.clone(),
                slot,
            )),
            Err(e) => {
                self.release(slot, false);
                Err(e)
            }
        }
    }

    /// Maps arena `slot` as the predecessor left it, reading each page in (never writing).
    pub fn map_existing(&self, slot: u32) -> Result<Mapping, Error> {
        if !self.claim_at(slot) {
            return Err(refused(format!(
                "arena {slot} is taken or past the region's {} arenas",
                self.inner.layout.arenas
            )));
        }
        let ptr = match self.map_slot(slot) {
            Ok(p) => p,
            Err(e) => {
                self.release(slot, false);
                return Err(io("mmap", e));
            }
        };
        Ok(Mapping::from_existing(ptr, self.clone(), slot))
    }

    fn map_slot(&self, slot: u32) -> Result<NonNull<u8>, i32> {
        map_shared(self.fd(), self.arena_offset(slot), ARENA_BYTES)
    }

    /// Gives arena place `slot` back; with `punch`, its pages leave the file first (the caller
    /// has unmapped them).
    pub(super) fn release(&self, slot: u32, punch: bool) {
        if punch {
            self.punch(slot);
        }
        let mut slots = self.inner.slots.lock();
        slots[slot as usize / 64] &= !(1 << (slot % 64));
    }

    /// Punches arena place `slot` out of the file. A failure leaves the pages held, never wrong:
    /// a place is only reused through [`Region::map_new`], whose pages are then written anyway.
    fn punch(&self, slot: u32) {
        let (Ok(off), Ok(len)) = (
            libc::off_t::try_from(self.arena_offset(slot)),
            libc::off_t::try_from(ARENA_BYTES),
        ) else {
            return;
        };
        // SAFETY: a plain call on a descriptor we own; a failure only leaves memory held.
        unsafe {
            libc::fallocate(
                self.inner.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                len,
            );
        }
    }

    /// Punches every arena place this process has not mapped: what a predecessor left in places
    /// the adopted pool does not use. Call once, after adopting the live arenas.
    pub fn punch_unclaimed(&self) {
        for slot in 0..self.inner.layout.arenas {
            let taken = {
                let slots = self.inner.slots.lock();
                slots[slot as usize / 64] & (1 << (slot % 64)) != 0
            };
            if !taken {
                self.punch(slot);
            }
        }
    }

    /// Bytes of the file that hold memory (`st_blocks`), header and metadata included.
    pub fn resident_bytes(&self) -> Result<u64, Error> {
        // SAFETY: an fstat into a zeroed struct on a descriptor we own; result checked.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(self.inner.fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io("fstat", errno()));
        }
        Ok(u64::try_from(st.st_blocks).unwrap_or(0) * 512)
    }

    /// Test hook: flips one bit of header word `word`, as a corrupted state would.
    #[cfg(any(test, feature = "testing"))]
    pub fn corrupt_header(&self, word: usize, bit: u32) {
        assert!(word <= H_CHECKSUM);
        // SAFETY: the header mapping holds H_FIXED + 1 aligned words; a test does this with no
        // other user of the region.
        unsafe {
            let p = self.inner.header.as_ptr().add(word);
            p.write_volatile(p.read_volatile() ^ (1 << bit));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn size(arenas: u32, meta_bytes: usize) -> RegionSize {
        RegionSize {
            arenas,
            meta_bytes,
            table_bytes: 0,
        }
    }

    fn dup(r: &Region) -> OwnedFd {
        r.fd().try_clone_to_owned().unwrap()
    }

    #[test]
    fn a_region_is_adopted_with_its_arenas_bytes() {
        let r = Region::create("uzram-test", size(8, 10_000)).unwrap();
        assert_eq!(r.meta_bytes(), 12_288);
        let mut m = r.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
        assert_eq!(m.place(), Some(0));
        m.bytes_mut()[..5].copy_from_slice(b"hello");
        m.bytes_mut()[ARENA_BYTES - 1] = 7;
        let fd = dup(&r);
        // The predecessor dies without unmapping: its mapping is leaked, not dropped.
        std::mem::forget(m);
        drop(r);

        let r2 = Region::adopt(fd).unwrap();
        assert_eq!(r2.max_arenas(), 8);
        let m2 = r2.map_existing(0).unwrap();
        assert_eq!(&m2.bytes()[..5], b"hello");
        assert_eq!(m2.bytes()[ARENA_BYTES - 1], 7);
        assert!(r2.map_existing(0).is_err(), "a place is claimed once");
        assert!(r2.map_existing(8).is_err(), "past the end");
        // A new arena takes the next free place and starts empty.
        let m3 = r2.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
        assert_eq!(m3.place(), Some(1));
        assert!(m3.bytes().iter().all(|&b| b == 0));
    }

    #[test]
    fn giving_an_arena_back_punches_its_pages_out() {
        let r = Region::create("uzram-test", size(4, 0)).unwrap();
        let base = r.resident_bytes().unwrap();
        let mut m = r.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
        m.bytes_mut().fill(0xa5);
        assert_eq!(r.resident_bytes().unwrap(), base + ARENA_BYTES as u64);
        drop(m);
        assert_eq!(r.resident_bytes().unwrap(), base);
        let m = r.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
        assert_eq!(m.place(), Some(0), "the place is free again");
        assert!(m.bytes().iter().all(|&b| b == 0));
    }

    #[test]
    fn chunks_keep_their_tags_and_words_across_an_adoption() {
        let r = Region::create("uzram-test", size(1, 4 * PAGE_SIZE)).unwrap();
        let mut a = r.claim_chunk(7).unwrap();
        let mut b = r.claim_chunk(9).unwrap();
        let c = r.claim_chunk(7).unwrap();
        a[0] = 11;
        b[CHUNK_WORDS - 1] = 22;
        let fd = dup(&r);
        let c_index = c.index();
        std::mem::forget((a, b));
        drop(c); // dropped, not given back: still tagged
        drop(r);
        let r2 = Region::adopt(fd).unwrap();
        let found = r2.take_adopted_chunks(|_| true);
        let tags: Vec<u64> = found.iter().map(|(t, _)| *t).collect();
        assert_eq!(tags, [7, 9, 7]);
        assert_eq!(found[0].1[0], 11);
        assert_eq!(found[1].1[CHUNK_WORDS - 1], 22);
        assert_eq!(found[2].1.index(), c_index);
        let d = r2.claim_chunk(1).unwrap();
        assert_eq!(d.index(), 3, "a new chunk comes after the adopted ones");
        assert!(d.iter().all(|&w| w == 0));
    }

    #[test]
    fn a_full_metadata_area_refuses_another_chunk() {
        for bytes in [PAGE_SIZE, 3 * PAGE_SIZE, 64 * PAGE_SIZE] {
            let r = Region::create("uzram-test", size(1, bytes)).unwrap();
            let n = r.usable_chunks();
            assert!(n as usize >= bytes / (CHUNK_BYTES + 8) - 1, "{bytes}: {n}");
            let all: Vec<Chunk> = (0..n)
                .map(|i| r.claim_chunk(u64::from(i)).unwrap())
                .collect();
            // The last chunk's last word is inside the area (a fault past it would be SIGBUS
            // or a segfault here).
            let mut last = all.into_iter().last().unwrap();
            last[CHUNK_WORDS - 1] = 1;
            assert!(matches!(r.claim_chunk(0), Err(Error::RegionFull { .. })));
        }
    }

    #[test]
    fn the_table_area_keeps_its_words() {
        use std::sync::atomic::Ordering::Relaxed;
        let r = Region::create(
            "uzram-test",
            RegionSize {
                arenas: 1,
                meta_bytes: 0,
                table_bytes: 64 * PAGE_SIZE,
            },
        )
        .unwrap();
        let t = r.table();
        assert_eq!(t.len(), 64 * PAGE_SIZE / 8);
        t[0].store(1, Relaxed);
        t[5 * 512 + 7].store(2, Relaxed);
        t[t.len() - 1].store(4, Relaxed);
        let fd = dup(&r);
        drop(r);
        let r = Region::adopt(fd).unwrap();
        let t = r.table();
        assert_eq!(
            [
                t[0].load(Relaxed),
                t[5 * 512 + 7].load(Relaxed),
                t[1].load(Relaxed)
            ],
            [1, 2, 0]
        );
        assert_eq!(t[t.len() - 1].load(Relaxed), 4);
    }

    #[test]
    fn a_full_region_refuses_another_arena() {
        let r = Region::create("uzram-test", size(1, 0)).unwrap();
        let _m = r.map_new(Prefault::Touch, &AtomicU64::new(0)).unwrap();
        assert_eq!(
            r.map_new(Prefault::Touch, &AtomicU64::new(0)).err(),
            Some(libc::ENOSPC)
        );
    }

    #[test]
    fn a_corrupted_header_is_refused_with_the_reason() {
        for (word, bit, says) in [
            (H_MAGIC, 3, "magic"),
            (H_VERSION, 1, "format version"),
            (H_ARENAS, 0, "checksum"),
            (H_CHECKSUM, 63, "checksum"),
        ] {
            let r = Region::create("uzram-test", size(2, 0)).unwrap();
            assert!(Region::check(r.fd()).is_ok());
            r.corrupt_header(word, bit);
            let checked = Region::check(r.fd()).unwrap_err().to_string();
            assert!(checked.contains(says), "word {word}: {checked}");
            let err = Region::adopt(dup(&r)).unwrap_err().to_string();
            assert!(err.contains(says), "word {word}: {err}");
        }
    }

    #[test]
    fn check_refuses_a_closed_region_and_a_file_that_is_not_one() {
        let r = Region::create("uzram-test", size(2, 0)).unwrap();
        r.close();
        let err = Region::check(r.fd()).unwrap_err().to_string();
        assert!(err.contains("closed"), "{err}");
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let err = Region::check(f.as_fd()).unwrap_err().to_string();
        assert!(err.contains("memfd"), "{err}");
    }

    #[test]
    fn a_file_that_is_not_a_sealed_region_is_refused() {
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let err = Region::adopt(OwnedFd::from(f)).unwrap_err().to_string();
        assert!(err.contains("memfd"), "{err}");
        // A memfd whose size was never sealed.
        let name = CString::new("uzram-test").unwrap();
        // SAFETY: valid name and flags; checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: fresh descriptor owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain call on our descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 1 << 22) }, 0);
        let err = Region::adopt(fd).unwrap_err().to_string();
        assert!(err.contains("sealed"), "{err}");
    }
}
