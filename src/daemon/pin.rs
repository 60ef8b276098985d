//! Keeping a swap server's memory resident and its I/O path free of page faults.
//!
//! A daemon that serves swap must never wait for the memory it is asked to free: its I/O threads
//! are `PR_SET_IO_FLUSHER` (their allocations cannot start I/O), so a page fault on one of them
//! while memory is short can only wait for other reclaimers' swap writes, which wait for the I/O
//! threads. This module removes the faults: memory is locked (`mlockall`) and I/O threads fault in
//! their stacks before they serve; their allocations come from a heap of their own whose every
//! page is faulted in before it is handed out ([`super::heap`]). See ARCHITECTURE.md, "Safe to
//! hold swap".

/// Stack a thread that serves I/O (queues, policy, memory) faults in (and so locks) before it
/// serves: `tests/pin.rs` runs the request path (`io::handle`: lz4 and zstd up to level 19,
/// whole and partial pages) on a thread whose whole stack is 32 KiB less than this, the 32 KiB
/// for libublk's frames above it. The request path passes at 128 KiB too; 256 KiB is kept for
/// the policy thread's rounds (writeback with encryption, recompression, eviction for writes),
/// which are deeper and not measured.
pub const STACK_PREFAULT: usize = 256 << 10;

/// Tunes glibc's malloc for the threads that still use it (control, watchdog; the I/O path has
/// its own heap, [`super::heap`]): one arena, no trimming and no `mmap` below 32 MiB (giving
/// memory back is a syscall that takes the `mmap_lock` on whichever thread frees, an I/O thread
/// freeing malloc's memory included).
pub fn tune_malloc() {
    crate::sys::tune_malloc();
}

/// Faults in [`STACK_PREFAULT`] bytes of the calling thread's stack.
#[inline(never)]
pub fn prefault_stack() {
    let probe = [1u8; STACK_PREFAULT];
    std::hint::black_box(&probe);
}
