//! Keeping a swap server's memory resident and its I/O path free of page faults.
//!
//! A daemon that serves swap must never wait for the memory it is asked to free: its I/O threads
//! are `PR_SET_IO_FLUSHER` (their allocations cannot start I/O), so a page fault on one of them
//! while memory is short can only wait for other reclaimers' swap writes, which wait for the I/O
//! threads. This module removes the faults: memory is locked (`mlockall`) and I/O threads fault in
//! their stacks before they serve; their allocations come from a heap of their own whose every
//! page is faulted in before it is handed out ([`super::heap`]). See
//! docs/design/safe-to-hold-swap.md.

/// Stack a queue thread faults in (and so locks) before it serves: `tests/pin.rs` runs the
/// request path (`io::handle`: lz4 and zstd up to level 19, whole and partial pages) on a
/// thread whose whole stack is 32 KiB less than this, the 32 KiB for libublk's frames above it.
/// The request path passes at 128 KiB too; 256 KiB is kept because a queue thread also evicts
/// for its writes to a backing device (a batch written back, encrypted), which is not measured
/// on a queue thread.
pub const STACK_PREFAULT: usize = 256 << 10;

/// Stack the memory and policy threads fault in before their first round: `tests/pin.rs` runs
/// their rounds (the pool's maintenance with the I/O heap's refill and a region's prefault,
/// freed slots, the host's memory figures, a trim; the policy's idle recompression to zstd,
/// writeback by age, encrypted, eviction above the watermark, the evictions writes hand it,
/// compaction) on a thread whose whole stack is 32 KiB less than this: it is held by two
/// threads of every daemon, so kept as small as the deepest round needs.
pub const UPKEEP_STACK_PREFAULT: usize = 128 << 10;

/// Tunes glibc's malloc for the threads that still use it (control, watchdog; the I/O path has
/// its own heap, [`super::heap`]): one arena, no trimming and no `mmap` below 32 MiB (giving
/// memory back is a syscall that takes the `mmap_lock` on whichever thread frees, an I/O thread
/// freeing malloc's memory included).
pub fn tune_malloc() {
    crate::sys::tune_malloc();
}

/// Faults in `BYTES` bytes of the calling thread's stack: [`STACK_PREFAULT`] on a queue thread,
/// [`UPKEEP_STACK_PREFAULT`] on the memory and policy threads.
#[inline(never)]
pub fn prefault_stack<const BYTES: usize>() {
    let probe = [1u8; BYTES];
    std::hint::black_box(&probe);
}
