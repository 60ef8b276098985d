//! Keeping a swap server's memory resident and its I/O path free of page faults.
//!
//! A daemon that serves swap must never wait for the memory it is asked to free: its I/O threads
//! are `PR_SET_IO_FLUSHER` (their allocations cannot start I/O), so a page fault on one of them
//! while memory is short can only wait for other reclaimers' swap writes, which wait for the I/O
//! threads. This module removes the faults: memory is locked (`mlockall`), I/O threads fault in
//! their stacks before they serve, and malloc's heap keeps resident free space that a background
//! thread tops up ([`refill_heap`]), so the I/O path's few allocations (pool metadata growing)
//! reuse memory the process already holds. See ARCHITECTURE.md, "Safe to hold swap".

use std::sync::atomic::{AtomicU64, Ordering};

/// Free heap memory the memory thread keeps resident for the I/O path's allocations, per arena
/// of the pool's reserve: more than the pool metadata that filling one 2 MiB arena allocates
/// (handles, back-pointers, zspage records: 12 B an object and a few bytes a zspage, so this
/// covers objects down to 24 B on average; real pages are 20 to 40 times that).
pub const HEAP_PER_ARENA: usize = 1 << 20;

/// The least and the most free heap kept resident (see [`heap_reserve`]). The I/O path's
/// allocations have no safe way to wait or fail when the heap runs out (the pool's reserve has
/// one: a write waits for the refill, then fails with ENOMEM), so the least must outlast the
/// memory thread's slowest round under pressure: with 2 MiB (and 1, and 4 while the refill
/// touched its blocks) the VM's swap workloads hung on an I/O thread faulting in malloc; 8 MiB
/// is what the daemon always kept before and has never been seen to run out. Moving the pool's
/// metadata into its arenas would give it the pool's safe path and let this go.
pub const HEAP_RESERVE_MIN: usize = 8 << 20;
pub const HEAP_RESERVE_MAX: usize = 16 << 20;

/// The free heap to keep resident while the pool's reserve is `pool_reserve_arenas` arenas:
/// it follows the pool's reserve, which follows demand.
pub fn heap_reserve(pool_reserve_arenas: usize) -> usize {
    pool_reserve_arenas
        .saturating_mul(HEAP_PER_ARENA)
        .clamp(HEAP_RESERVE_MIN, HEAP_RESERVE_MAX)
}

/// Stack an I/O thread faults in (and so locks) before it serves: the I/O path (lz4 and zstd up
/// to level 19, whole and partial pages) runs on a thread whose whole stack is this large in
/// `tests/pin.rs`, so nothing it touches is beyond it.
pub const STACK_PREFAULT: usize = 128 << 10;

/// Tunes glibc's malloc for a locked, fault-free heap: one arena (memory freed by any thread is
/// reusable by all, and the memory thread's refills reach the I/O threads), no trimming (giving
/// memory back is a syscall that takes the `mmap_lock` on whichever thread frees), no `mmap`
/// for allocations below 32 MiB (a fresh mapping would fault on first touch), and no top
/// padding: the heap grows only as [`refill_heap`] grows it.
pub fn tune_malloc() {
    crate::sys::tune_malloc();
}

/// The size of malloc's top chunk (the free end of the heap that requests no free chunk can
/// serve are carved from, and where a heap extension would land untouched), if the C library
/// says.
pub fn heap_top_bytes() -> Option<usize> {
    crate::sys::malloc_top_bytes()
}

/// Keeps malloc's top chunk (the free end of the heap, where allocations no free chunk can
/// serve are carved from) at least half of `reserve` (see [`heap_reserve`]) and every page of it
/// resident: an I/O thread's allocation then never lands on a page not yet faulted in, nor has to
/// extend the heap itself (a fault there, under PR_SET_IO_FLUSHER and memory pressure, can wait
/// forever: an I/O thread in reclaim inside malloc, holding malloc's lock; and `brk` waits for
/// the `mmap_lock`, which the memory thread's own faults hold while it maps arenas).
///
/// The heap grows by a block just larger than the top, allocated and freed at once and never
/// written, so the top is the I/O threads' all the while; then the whole top is faulted in
/// with `MADV_POPULATE_WRITE`, which writes nothing (other threads may be carving from the top
/// meanwhile; they carve from its low end, which is resident already). Returns how much of the
/// top is resident: less than its size when the kernel could not fault it all in (memory short;
/// the next call tries again). For the memory thread, never an I/O thread.
pub fn refill_heap(reserve: usize) -> usize {
    let Some(top) = heap_top_bytes() else {
        return 0;
    };
    if top < reserve / 2 {
        let block: Vec<u8> = Vec::with_capacity(top + reserve);
        std::hint::black_box(&block);
    }
    let top = heap_top_bytes().unwrap_or(0);
    let resident = crate::sys::populate_heap_top(top);
    LAST_HEAP_TOP.store(resident as u64, Ordering::Relaxed);
    resident
}

/// Gives the heap's top beyond `reserve` back to the kernel, once a burst is over (the pool's
/// reserve shrank). Takes malloc's lock for one `brk`: for the memory thread, never an I/O
/// thread.
pub fn trim_heap(reserve: usize) {
    if heap_top_bytes().is_some_and(|top| top > reserve + (1 << 20)) {
        crate::sys::trim_malloc(reserve);
    }
}

/// The top chunk's size as [`refill_heap`] last saw it (read without the allocator's lock).
pub fn last_heap_top() -> u64 {
    LAST_HEAP_TOP.load(Ordering::Relaxed)
}

static LAST_HEAP_TOP: AtomicU64 = AtomicU64::new(0);

/// Faults in [`STACK_PREFAULT`] bytes of the calling thread's stack.
#[inline(never)]
pub fn prefault_stack() {
    let probe = [1u8; STACK_PREFAULT];
    std::hint::black_box(&probe);
}
