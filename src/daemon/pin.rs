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
/// request path (`io::handle`: lz4 and zstd up to level 19, whole and partial pages) and a write
/// that evicts grouped pages inline (each decompressed from its zstd group, compressed alone,
/// sealed) on a thread whose whole stack is 32 KiB less than this in a release build, the
/// 32 KiB for libublk's frames above it. Held by every queue thread of the worker and of its
/// standby, so kept as small as the deepest request needs.
pub const STACK_PREFAULT: usize = 128 << 10;

/// Stack the memory and policy threads fault in before their first round: `tests/pin.rs` runs
/// their rounds (the pool's maintenance with the I/O heap's refill and a region's prefault,
/// freed slots, the host's memory figures, a trim; the policy's idle recompression to zstd,
/// its cold groups, writeback by age, encrypted, eviction above the watermark, the evictions
/// writes hand it, compaction) on a thread whose whole stack is 32 KiB less than this in a
/// release build: it is held by two threads of every daemon, so kept as small as the deepest
/// round needs.
pub const UPKEEP_STACK_PREFAULT: usize = 96 << 10;

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

/// Makes malloc's heap (the `[heap]` mappings of /proc/self/maps) resident whole, as
/// `mlockall(MCL_CURRENT)` would have: what was allocated after the process locked its memory
/// with `MCL_ONFAULT` (a device adopted by a successor: its records, vectors with room to grow)
/// is otherwise faulted in by whichever thread first writes it, an I/O thread included.
pub(crate) fn populate_heap() -> std::io::Result<()> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    for line in maps.lines().filter(|l| l.ends_with("[heap]")) {
        let entry = crate::common::maps::parse_maps_line(line)
            .map_err(|e| std::io::Error::other(format!("/proc/self/maps: {e}")))?;
        if entry.pathname == "[heap]" {
            crate::sys::populate_write(entry.start, entry.len_bytes())?;
        }
    }
    Ok(())
}

/// Starts a thread and waits for it to end, so that the kernel allocates the process's task
/// statistics now (it does when the first thread of a process ends): otherwise the first thread
/// to end when a worker is killed allocates them, and with memory short and the device's I/O
/// held by the dying worker that allocation can wait for good (the worker never ends, and no
/// successor can take the device over).
pub(crate) fn end_a_thread() {
    let ended = std::thread::Builder::new()
        .name("uzram-start".into())
        .stack_size(64 << 10)
        .spawn(|| {})
        .map(|t| t.join());
    if ended.is_err() {
        super::log("warning: could not start a thread at startup");
    }
}

/// Locks the daemon's memory and keeps the OOM killer away from it.
pub(crate) fn pin_memory() -> Result<(), super::ServeError> {
    crate::sys::lock_all_memory().map_err(|source| super::ServeError::Setup {
        what: "lock the daemon's memory (mlockall); raise RLIMIT_MEMLOCK or run as root",
        source,
    })?;
    std::fs::write("/proc/self/oom_score_adj", "-1000").map_err(|source| super::ServeError::Setup {
        what: "set oom_score_adj to -1000",
        source,
    })
}
