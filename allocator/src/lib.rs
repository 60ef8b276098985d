//! `uzram-allocator`: a zsmalloc-like allocator for compressed pages, in userspace.
//!
//! A [`Pool`] stores objects of 1 to 4096 bytes. Objects are grouped by size into size classes
//! (32 B to 4 KiB in 16-byte steps, neighbours with identical layouts merged); each class packs its
//! objects into zspages of 1 to 8 contiguous 4 KiB pages, and zspages are carved from 2 MiB arenas
//! mapped with `mmap`. Callers get an opaque [`Handle`] (never 0) and read and write objects through
//! it; the handle is indirect, so compaction can move an object, or a whole zspage, without telling
//! the owner.
//!
//! ```
//! use uzram_allocator::{Pool, PoolConfig};
//!
//! let pool = Pool::new(PoolConfig::default())?;
//! let h = pool.store(b"compressed bytes")?;
//! assert_eq!(pool.read(h, |obj| obj.to_vec())?, b"compressed bytes");
//! pool.free(h)?;
//! assert_eq!(pool.stats().objects, 0);
//! # Ok::<(), uzram_allocator::Error>(())
//! ```
//!
//! # Lock order
//! `class -> arenas`. Each class has its own mutex (no global lock on the alloc/free/read path); the
//! arena set has one mutex, taken only when a zspage is created, freed or moved. A thread never holds
//! two class locks, and never takes a class lock while holding the arena lock. Background work
//! ([`Pool::compact`]) takes one class lock at a time.
//!
//! # Memory and `mlockall`
//! See the `mem` module: memory goes back to the OS one whole arena at a time (`munmap`), never by
//! `MADV_DONTNEED`, which fails on memory locked by the daemon's `mlockall`.
//!
//! # Surviving the process
//! A pool made with [`PoolConfig::region`] keeps its arenas, handle tables and zspage locations in
//! a memfd ([`Region`]). Another process given that memfd adopts the pool with [`Pool::adopt`]:
//! every handle names the same bytes, whether the first process died at any instruction or
//! handed the pool over with [`Pool::leave`]. Anything that does not add up is refused, and a
//! refusal writes nothing.
//!
//! All `unsafe` code is in the `mem` module.

#![warn(missing_docs)]
#![deny(unsafe_code)]

mod class;
#[cfg(feature = "testing")]
pub mod fuzzing;
#[allow(unsafe_code)] // the pool's raw memory: every block cites an invariant of `mem`
mod mem;
mod pool;
mod table;

pub use class::{ClassSpec, CLASS_STEP, MAX_OBJECT, MIN_OBJECT};
pub use mem::{
    in_place_order, AtomicChunk, Chunk, Region, RegionSize, ARENA_PAGES, CHUNK_TAG_MAX,
    CHUNK_WORDS, PAGE_SIZE, REGION_VERSION, USER_CHUNK_TAG,
};
pub use pool::{
    ClassStats, CompactStats, Growth, Handle, Maintenance, Pool, PoolConfig, PoolStats,
    FULLNESS_GROUPS, MAX_PAGES_PER_ZSPAGE,
};

/// Errors of the pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An object size outside 1..=4096.
    #[error("object size {size} is outside 1..={max} bytes")]
    InvalidSize {
        /// The size asked for.
        size: usize,
        /// The largest object.
        max: usize,
    },
    /// Allocating would take the pool past its memory limit; nothing was allocated.
    #[error("memory limit of {limit_bytes} bytes reached ({used_bytes} bytes in use)")]
    LimitExceeded {
        /// The limit.
        limit_bytes: u64,
        /// Bytes of zspage pages in use.
        used_bytes: u64,
    },
    /// The OS refused memory for a new arena.
    #[error("cannot map a {bytes}-byte arena: {}", std::io::Error::from_raw_os_error(*errno))]
    OutOfMemory {
        /// The arena size.
        bytes: u64,
        /// The errno of `mmap`.
        errno: i32,
    },
    /// [`Growth::Reserve`] mode: no pre-mapped arena had room, and the maintenance thread did not
    /// map one in time; nothing was allocated.
    #[error(
        "no pre-mapped pool memory left after waiting {waited_ms} ms for the maintenance thread"
    )]
    ReserveExhausted {
        /// How long the allocation waited.
        waited_ms: u64,
    },
    /// The handle does not name a live object of this pool.
    #[error("handle {raw:#x} does not name a live object")]
    InvalidHandle {
        /// The handle's word.
        raw: u64,
    },
    /// A write longer than the object.
    #[error("write of {len} bytes does not fit an object of {size} bytes")]
    WriteTooLong {
        /// Bytes to write.
        len: usize,
        /// The object's size.
        size: usize,
    },
    /// A read buffer shorter than the object.
    #[error("buffer of {len} bytes cannot hold an object of {size} bytes")]
    BufferTooSmall {
        /// The buffer's length.
        len: usize,
        /// The object's size.
        size: usize,
    },
    /// A region a predecessor left was not adopted: the reason names the value that was wrong.
    /// Nothing was written to it.
    #[error("pool memory region refused: {reason}")]
    RegionRefused {
        /// What was wrong, with the value found.
        reason: String,
    },
    /// A region has no room left for more of what it holds.
    #[error("pool memory region is full: all {count} {what} are in use")]
    RegionFull {
        /// What ran out.
        what: &'static str,
        /// How many the region holds.
        count: u64,
    },
    /// A system call on a region failed.
    #[error("pool memory region: {what} failed: {}", std::io::Error::from_raw_os_error(*errno))]
    RegionIo {
        /// The call.
        what: &'static str,
        /// Its errno.
        errno: i32,
    },
    /// A configuration value out of range.
    #[error("invalid pool configuration: {what} = {value}")]
    InvalidConfig {
        /// The field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
}
