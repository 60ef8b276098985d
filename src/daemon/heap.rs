//! The I/O path's heap: memory that a queue thread's allocation can never fault on.
//!
//! A thread that serves swap must not take a page fault while memory is short (see
//! [`super::pin`]). The request path allocates a little (pool metadata growing: zspage records,
//! fullness lists, slot-table segments), and from glibc's malloc that memory may be a page the
//! kernel has not faulted in yet (a fresh `brk`, the untouched top pad), or the top may be held
//! for a moment by whoever extends it. Every hang of the VM's swap check under the old scheme (a
//! resident top of malloc's heap refilled by the memory thread) had a queue thread faulting, or
//! calling `brk`, inside malloc.
//!
//! So the threads that serve I/O (queues, policy, memory: marked with [`serve_from_io_heap`])
//! allocate from a heap of their own: one span of address space reserved up front (no memory),
//! committed 1 MiB at a time by the memory thread, which faults in and so locks every page before
//! [`talc`] may hand any of it out ([`refill`]). The memory thread keeps [`RESERVE`] of it free.
//! Allocations from this heap take a futex lock and never a system call. If it cannot serve a
//! request (it ran dry, or one allocation is bigger than what is free in one piece), the request
//! goes to malloc as it did before, and is counted ([`Stats::fallbacks`]); so the heap never
//! makes anything fail that worked before.
//!
//! Any thread may free or grow what any other allocated: a free goes to whichever heap the
//! address is in. Other threads (control, watchdog, the CLI) use malloc alone.
//!
//! The heap is installed as the binary's `#[global_allocator]` ([`DaemonAlloc`], in `main.rs`);
//! without it (the library embedded elsewhere, most tests) the marks do nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use talc::base::Talc;
use talc::source::Manual;
use talc::DefaultBinning;

/// Address space reserved for the heap: a bound, never memory (untouched `PROT_NONE` costs
/// nothing). Metadata of the biggest device fits many times over.
const SPAN: usize = 64 << 30;

/// What one refill step commits.
const STEP: usize = 1 << 20;

/// Free memory the memory thread keeps committed, faulted in and locked ahead of the I/O path:
/// what the request path may allocate between two of its rounds (a second apart at most, and
/// woken sooner by the pool's reserve running low). Metadata grows by a few bytes per page
/// written: 4 MiB outlasts hundreds of MiB of swap writes.
pub const RESERVE: usize = 4 << 20;

/// What the heap's own bookkeeping adds to each allocation, counted so that "free" is not
/// overstated.
const PER_ALLOCATION: usize = 16;

thread_local! {
    /// Whether this thread allocates from the I/O heap.
    static ON_IO_PATH: Cell<bool> = const { Cell::new(false) };
}

/// Start of the reserved span; 0 until [`init`].
static BASE: AtomicUsize = AtomicUsize::new(0);
/// Bytes of the span committed and handed to the allocator.
static COMMITTED: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated from the heap now (sizes asked for, plus [`PER_ALLOCATION`] each).
static IN_USE: AtomicUsize = AtomicUsize::new(0);
/// Allocations of marked threads that went to malloc.
static FALLBACKS: AtomicU64 = AtomicU64::new(0);
/// The allocator, and the end of its heap once the first step is claimed.
static HEAP: Mutex<Inner> = Mutex::new(Inner {
    talc: Talc::new(Manual),
    end: None,
});
/// One refill at a time.
static REFILL: Mutex<()> = Mutex::new(());

struct Inner {
    talc: Talc<Manual, DefaultBinning>,
    end: Option<NonNull<u8>>,
}

// SAFETY: the allocator's pointers are into the reserved span, which belongs to the process for
// its whole life (never unmapped); every access to them goes through `HEAP`'s lock.
unsafe impl Send for Inner {}

/// The heap's figures, for the progress log and `uzram_stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Bytes committed (faulted in and locked).
    pub committed: usize,
    /// Bytes allocated now (with the per-allocation overhead).
    pub in_use: usize,
    /// Allocations of the I/O path that the heap could not serve and malloc did.
    pub fallbacks: u64,
}

/// The heap's figures now.
pub fn stats() -> Stats {
    Stats {
        committed: COMMITTED.load(Ordering::Relaxed),
        in_use: IN_USE.load(Ordering::Relaxed),
        fallbacks: FALLBACKS.load(Ordering::Relaxed),
    }
}

/// Reserves the heap's address space (no memory). Call once, before the threads that use it
/// start and after `mlockall`, so that what is committed later is locked as it is faulted in.
pub fn init() -> std::io::Result<()> {
    if BASE.load(Ordering::Acquire) != 0 {
        return Ok(());
    }
    let base = crate::sys::reserve_address_space(SPAN)?;
    if BASE
        .compare_exchange(0, base as usize, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread won the race; this span is simply never used.
    }
    Ok(())
}

/// Marks the calling thread as one that serves I/O: from now on it allocates from the I/O heap.
pub fn serve_from_io_heap() {
    let _ = ON_IO_PATH.try_with(|on| on.set(true));
}

/// Commits, faults in (and so, under `mlockall`, locks) and hands to the allocator steps of the
/// span until [`RESERVE`] is free. The memory thread's job: the faults may wait for reclaim.
/// Returns the bytes committed; 0 without [`init`] or when the kernel refuses (the next round
/// tries again).
pub fn refill() -> usize {
    let base = BASE.load(Ordering::Acquire);
    if base == 0 {
        return 0;
    }
    let _one = REFILL.lock().unwrap_or_else(|e| e.into_inner());
    let mut added = 0;
    loop {
        let committed = COMMITTED.load(Ordering::Acquire);
        let free = committed.saturating_sub(IN_USE.load(Ordering::Relaxed));
        if free >= RESERVE || committed + STEP > SPAN {
            break;
        }
        let at = base + committed;
        // SAFETY: the span's next step: inside it (checked above), and not yet committed, so
        // nothing uses it.
        if unsafe { crate::sys::commit_and_touch(at as *mut u8, STEP) }.is_err() {
            break;
        }
        let mut heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *heap;
        // SAFETY: `at..at + STEP` is committed, writable, and no one else's: it is the span's
        // next step, past everything claimed so far, and only this (serialised) refill hands
        // out steps. The `Manual` source allows claim and extend.
        inner.end = unsafe {
            match inner.end {
                None => inner.talc.claim(at as *mut u8, STEP),
                Some(end) => Some(inner.talc.extend(end, (at + STEP) as *mut u8)),
            }
        };
        drop(heap);
        COMMITTED.store(committed + STEP, Ordering::Release);
        added += STEP;
    }
    added
}

/// Whether `ptr` is in the I/O heap (allocated from it, or could be).
pub fn owns<T>(ptr: *const T) -> bool {
    in_heap(ptr.cast::<u8>().cast_mut())
}

/// Whether `ptr` is in the I/O heap's span.
fn in_heap(ptr: *mut u8) -> bool {
    let base = BASE.load(Ordering::Relaxed);
    base != 0 && (ptr as usize).wrapping_sub(base) < SPAN
}

fn on_io_path() -> bool {
    ON_IO_PATH.try_with(Cell::get).unwrap_or(false)
}

/// An allocation from the I/O heap, if it has room.
fn heap_alloc(layout: Layout) -> Option<*mut u8> {
    if COMMITTED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let mut heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: `layout`'s size is nonzero (GlobalAlloc's contract).
    let ptr = unsafe { heap.talc.allocate(layout) }?;
    drop(heap);
    IN_USE.fetch_add(layout.size() + PER_ALLOCATION, Ordering::Relaxed);
    Some(ptr.as_ptr())
}

/// Frees an allocation of the I/O heap.
///
/// # Safety
/// `ptr` was allocated from the I/O heap with `layout`.
unsafe fn heap_free(ptr: *mut u8, layout: Layout) {
    let mut heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the caller's contract.
    unsafe { heap.talc.deallocate(ptr, layout) };
    drop(heap);
    IN_USE.fetch_sub(layout.size() + PER_ALLOCATION, Ordering::Relaxed);
}

/// The daemon's global allocator: the I/O heap for threads marked with [`serve_from_io_heap`]
/// (falling back to malloc when it has no room), malloc for the rest; a free goes to the heap
/// its address is in.
pub struct DaemonAlloc;

// SAFETY: every block handed out is either malloc's (System) or talc's from the committed part
// of the span, of at least the layout's size and alignment; each free and realloc goes back to
// the allocator that owns the address (the span's bounds tell which), with the layout it was
// allocated with.
unsafe impl GlobalAlloc for DaemonAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if on_io_path() {
            if let Some(ptr) = heap_alloc(layout) {
                return ptr;
            }
            FALLBACKS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: GlobalAlloc's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if on_io_path() {
            if let Some(ptr) = heap_alloc(layout) {
                // SAFETY: `ptr` is a fresh block of `layout.size()` bytes.
                unsafe { ptr.write_bytes(0, layout.size()) };
                return ptr;
            }
            FALLBACKS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: GlobalAlloc's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if in_heap(ptr) {
            // SAFETY: the address is the I/O heap's, so it allocated it, with `layout`.
            unsafe { heap_free(ptr, layout) }
        } else {
            // SAFETY: not the I/O heap's, so malloc's, with `layout`.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let heap_block = in_heap(ptr);
        if heap_block {
            let mut heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the heap allocated `ptr` with `layout`; `new_size` is nonzero.
            if unsafe { heap.talc.try_realloc_in_place(ptr, layout, new_size) } {
                drop(heap);
                IN_USE.fetch_add(new_size, Ordering::Relaxed);
                IN_USE.fetch_sub(layout.size(), Ordering::Relaxed);
                return ptr;
            }
        } else if !on_io_path() {
            // SAFETY: malloc's block, staying malloc's.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // Moves between the heaps (or within the I/O heap): allocate, copy, free.
        // SAFETY: `new_size` with `layout`'s alignment is a valid layout (GlobalAlloc's
        // contract for realloc).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        // SAFETY: nonzero size, as `new_size` is.
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least this long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: `ptr` was allocated with `layout`, by whichever heap owns it.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}
