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

/// Free heap memory the memory thread keeps resident for the I/O path's allocations.
pub const HEAP_RESERVE: usize = 8 << 20;

/// Stack an I/O thread faults in (and so locks) before it serves.
pub const STACK_PREFAULT: usize = 256 << 10;

/// Tunes glibc's malloc for a locked, fault-free heap: one arena (memory freed by any thread is
/// reusable by all, and the memory thread's refills reach the I/O threads), no trimming (giving
/// memory back is a syscall that takes the `mmap_lock` on whichever thread frees), and no
/// `mmap` for allocations below 32 MiB (a fresh mapping would fault on first touch).
pub fn tune_malloc() {
    crate::sys::tune_malloc();
}

/// The size of malloc's top chunk (the free end of the heap that requests no free chunk can
/// serve are carved from, and where a heap extension would land untouched), if the C library
/// says.
pub fn heap_top_bytes() -> Option<usize> {
    crate::sys::malloc_top_bytes()
}

/// Keeps malloc's top chunk resident and at least half of [`HEAP_RESERVE`]: allocates a block
/// that the free chunks cannot serve (so it comes from the top, extending the heap if need be),
/// touches every page of it (faulting it in and, under `mlockall`, locking it) and frees it back
/// into the top. An I/O thread's allocation then never lands on a page not yet faulted in: a
/// fault there, under PR_SET_IO_FLUSHER and memory pressure, can wait forever (an I/O thread
/// spinning in reclaim inside malloc, holding malloc's lock). Returns bytes touched. For the memory thread, never an I/O thread.
pub fn refill_heap() -> usize {
    let mut touched = 0;
    for _ in 0..4 {
        let top = heap_top_bytes();
        LAST_HEAP_TOP.store(top.unwrap_or(0) as u64, Ordering::Relaxed);
        match top {
            Some(top) if top < HEAP_RESERVE / 2 => {
                let block = vec![1u8; HEAP_RESERVE];
                std::hint::black_box(&block);
                touched += HEAP_RESERVE;
            }
            _ => break,
        }
    }
    touched
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
