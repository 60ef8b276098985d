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

/// Free heap memory the memory thread keeps resident for the I/O path's allocations (pool
/// metadata). Fixed, as before this daemon's reserves followed demand: the I/O path's
/// allocations have no safe way to wait or fail when the heap runs dry (the pool's reserve has
/// one), and every smaller or demand-sized heap reserve tried (1, 2 and 4 MiB; a refill that
/// faulted the top in with `MADV_POPULATE_WRITE`, which fails under pressure) hung a VM swap
/// workload on an I/O thread faulting or calling `brk` inside malloc. Moving the pool's metadata
/// into its arenas would give it the pool's safe path and let this go.
pub const HEAP_RESERVE: usize = 8 << 20;

/// malloc's top padding: what each extension of the heap adds beyond the request, so that
/// extensions are rare. Left untouched by the refill, so it is not counted as resident: a refill
/// comes while half the reserve is left above the pad.
pub const TOP_PAD: usize = 4 << 20;

/// Stack a queue thread faults in (and so locks) before it serves: `tests/pin.rs` runs the
/// request path (`io::handle`: lz4 and zstd up to level 19, whole and partial pages) on a thread
/// whose whole stack is 32 KiB less than this, the 32 KiB for libublk's frames above it. It
/// passes at 128 KiB too; 256 KiB is kept until the VM's swap check is understood (see
/// `daemon::configure`).
pub const STACK_PREFAULT: usize = 256 << 10;

/// Stack the policy thread faults in: its rounds (writeback with encryption, recompression,
/// eviction for writes) are deeper and not measured, so it keeps what every thread had before.
pub const POLICY_STACK_PREFAULT: usize = 256 << 10;

/// Tunes glibc's malloc for a locked, fault-free heap: one arena (memory freed by any thread is
/// reusable by all, and the memory thread's refills reach the I/O threads), no trimming (giving
/// memory back is a syscall that takes the `mmap_lock` on whichever thread frees), and no
/// `mmap` for allocations below 32 MiB (a fresh mapping would fault on first touch), and
/// [`TOP_PAD`] of top padding.
pub fn tune_malloc() {
    crate::sys::tune_malloc(TOP_PAD);
}

/// The size of malloc's top chunk (the free end of the heap that requests no free chunk can
/// serve are carved from, and where a heap extension would land untouched), if the C library
/// says.
pub fn heap_top_bytes() -> Option<usize> {
    crate::sys::malloc_top_bytes()
}

/// Keeps at least half of [`HEAP_RESERVE`] of malloc's top chunk resident below its untouched
/// pad ([`TOP_PAD`]): allocates a block
/// that the free chunks cannot serve (so it comes from the top, extending the heap if need be),
/// touches every page of it (faulting it in and, under `mlockall`, locking it) and frees it back
/// into the top. An I/O thread's allocation then never lands on a page not yet faulted in: a
/// fault there, under PR_SET_IO_FLUSHER and memory pressure, can wait forever (an I/O thread
/// spinning in reclaim inside malloc, holding malloc's lock). The block is reserved with
/// `try_reserve_exact`: an allocation that fails must not abort a daemon holding swap. Returns
/// bytes touched. For the memory thread, never an I/O thread.
pub fn refill_heap() -> usize {
    let mut touched = 0;
    for _ in 0..4 {
        let top = heap_top_bytes();
        LAST_HEAP_TOP.store(top.unwrap_or(0) as u64, Ordering::Relaxed);
        match top {
            // The last extension's pad, at the top's high end, was never touched.
            Some(top) if top < HEAP_RESERVE / 2 + TOP_PAD => {
                let mut block: Vec<u8> = Vec::new();
                if block.try_reserve_exact(HEAP_RESERVE).is_err() {
                    break;
                }
                block.resize(HEAP_RESERVE, 1);
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

/// Faults in [`POLICY_STACK_PREFAULT`] bytes of the calling thread's stack.
#[inline(never)]
pub fn prefault_policy_stack() {
    let probe = [1u8; POLICY_STACK_PREFAULT];
    std::hint::black_box(&probe);
}
