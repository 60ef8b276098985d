//! Pool memory that outlives the process: one memfd a successor can adopt.
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

use super::{ARENA_BYTES, PAGE_SIZE};
use crate::Error;

mod arenas;
mod chunks;

use chunks::chunks_in;
pub use chunks::{in_place_order, AtomicChunk, Chunk, CHUNK_TAG_MAX, CHUNK_WORDS, USER_CHUNK_TAG};

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

// Not under Miri: a region is a memfd, which Miri cannot make.
#[cfg(all(test, not(miri)))]
mod tests;
