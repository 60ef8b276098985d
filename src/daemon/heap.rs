//! The I/O path's heap: memory that a queue thread's allocation can never fault on.
//!
//! A thread that serves swap must not take a page fault while memory is short (see
//! [`super::pin`]). The request path allocates a little (pool metadata growing: zspage records,
//! fullness lists; the slot table's 4 KiB leaves), and from glibc's malloc that memory may be a
//! page the kernel has not faulted in yet (a fresh `brk`, the untouched top pad), or the top may
//! be held for a moment by whoever extends it. Every hang of the VM's swap check under the old
//! scheme (a resident top of malloc's heap refilled by the memory thread) had a queue thread
//! faulting, or calling `brk`, inside malloc.
//!
//! So the threads that serve I/O (queues, policy, memory: marked with [`serve_from_io_heap`])
//! allocate from a heap of their own: one span of address space reserved up front (no memory;
//! sized from the disksize), committed 1 MiB at a time by the memory thread, which locks and
//! faults in every page before [`talc`] may hand any of it out ([`refill`]). While the host's
//! memory is short the memory thread keeps at least [`RESERVE`] free in one piece at the heap's
//! top, and twice the largest request seen (up to [`MOST_AHEAD`]); otherwise [`CALM_RESERVE`],
//! and what a storm committed beyond that it gives back once memory is no longer short
//! ([`trim`]). An allocation that leaves less than half of it asks for a refill ([`take_low`]).
//! Allocations from this heap take a futex lock (at most a futex wait) and never fault. If it
//! cannot serve a request (it ran dry, or one allocation is bigger than what is free in one
//! piece), the request goes to malloc, and is counted ([`Stats::fallbacks`]): it works, but may
//! fault, as every allocation could before this heap.
//!
//! Any thread may free or grow what any other allocated: a free goes to whichever heap the
//! address is in. Other threads (control, watchdog, the CLI) use malloc alone.
//!
//! The heap is installed as the binary's `#[global_allocator]` ([`DaemonAlloc`], in `main.rs`);
//! without it (the library embedded elsewhere, most tests) the marks do nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use talc::base::Talc;
use talc::source::Manual;
use talc::DefaultBinning;

/// Address space reserved for the heap, per page of disksize: 1.7 times the pool's metadata
/// (22 B a stored page) and the slot table's leaves (16 B a page), and what else the I/O path
/// holds. A bound, not memory.
pub const SPAN_PER_PAGE: usize = 64;

/// The least span, for small devices.
pub const MIN_SPAN: usize = 64 << 20;

/// What one refill step commits.
const STEP: usize = 1 << 20;

/// Free memory the memory thread keeps committed, faulted in and locked in one piece at the
/// heap's top, ahead of the I/O path, while the host's memory is short ([`set_memory_short`]):
/// what the request path may allocate between two of its rounds (woken when half of it is
/// gone). Metadata grows by about 38 B a page written to a fresh part of the device (22 B of the
/// pool's, 16 B of slot table): 4 MiB is 110,000 pages, 430 MiB of swap writes.
pub const RESERVE: usize = 4 << 20;

/// What it keeps free there while memory is not short (or the largest request seen, if more):
/// a fault then waits for no reclaim, and what the heap cannot serve goes to malloc, which has
/// memory to give. 256 KiB is 6,900 pages written; an idle daemon's heap (1.5 MiB in use) then
/// commits 2 MiB, not 3.
pub const CALM_RESERVE: usize = 256 << 10;

/// What a trim leaves free beyond the margin, so that a small block allocated right after a
/// trim does not take the top below the margin and make the next refill commit a step again.
/// (The memory thread also trims only once no refill has committed for a while.)
const TRIM_SLACK: usize = 64 << 10;

/// The most the memory thread keeps ahead for large requests (twice the largest seen).
pub const MOST_AHEAD: usize = 16 << 20;

const _: () = assert!(CALM_RESERVE <= RESERVE && RESERVE <= MOST_AHEAD);

/// The size talc's chunk for an allocation of `size` bytes takes (its tag, rounded up to its
/// 32-byte unit), for [`Stats::in_use`].
fn chunk_size(size: usize) -> usize {
    (size + 8 + 31) & !31
}

thread_local! {
    /// Whether this thread allocates from the I/O heap.
    static ON_IO_PATH: Cell<bool> = const { Cell::new(false) };
}

/// Start of the reserved span; 0 until [`init`].
static BASE: AtomicUsize = AtomicUsize::new(0);
/// Its length.
static SPAN: AtomicUsize = AtomicUsize::new(0);
/// The host's memory is short: the memory thread keeps [`RESERVE`] ahead, not [`CALM_RESERVE`].
static SHORT: AtomicBool = AtomicBool::new(false);
/// The largest request a marked thread made.
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// The free piece at the heap's top fell below half of what the memory thread keeps.
static LOW: AtomicBool = AtomicBool::new(false);
/// Whether committed steps are locked.
static LOCK: AtomicBool = AtomicBool::new(false);
/// Refill steps the kernel refused (`mprotect` or `mlock2` failed), and trims it failed to give
/// back (`munlock`, `madvise` or `mprotect`: the memory stays, out of the heap until a refill).
static REFUSED: AtomicU64 = AtomicU64::new(0);
/// Bytes of the span committed and handed to the allocator.
static COMMITTED: AtomicUsize = AtomicUsize::new(0);
/// Bytes allocated from the heap now (talc's chunks).
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

/// The heap's figures, for the progress log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Bytes committed (faulted in and locked).
    pub committed: usize,
    /// Bytes allocated now (talc's chunks).
    pub in_use: usize,
    /// Allocations of the I/O path that the heap could not serve and malloc did.
    pub fallbacks: u64,
    /// Refill steps the kernel refused, and trims it failed.
    pub refused: u64,
    /// The largest block the I/O path asked for (the margin follows it).
    pub largest: usize,
}

/// The heap's figures now.
pub fn stats() -> Stats {
    Stats {
        committed: COMMITTED.load(Ordering::Relaxed),
        in_use: IN_USE.load(Ordering::Relaxed),
        fallbacks: FALLBACKS.load(Ordering::Relaxed),
        refused: REFUSED.load(Ordering::Relaxed),
        largest: LARGEST.load(Ordering::Relaxed),
    }
}

/// What the memory thread keeps free at the top: while memory is short [`RESERVE`], or twice
/// the largest request seen, up to [`MOST_AHEAD`]; otherwise [`CALM_RESERVE`], or the largest
/// request seen.
fn ahead() -> usize {
    ahead_for(SHORT.load(Ordering::Relaxed))
}

/// [`ahead`] as it would be were memory short or not.
fn ahead_for(short: bool) -> usize {
    let largest = LARGEST.load(Ordering::Relaxed);
    if short {
        (2 * largest).clamp(RESERVE, MOST_AHEAD)
    } else {
        CALM_RESERVE.max(largest.min(MOST_AHEAD))
    }
}

/// Tells the heap whether the host's memory is short (the memory thread's judgement, as it
/// tells the pool): the next [`refill`] keeps [`RESERVE`] ahead while it is, and [`trim`] gives
/// nothing back.
pub fn set_memory_short(short: bool) {
    SHORT.store(short, Ordering::Relaxed);
}

/// Whether the memory thread last found the host's memory short.
pub fn memory_short() -> bool {
    SHORT.load(Ordering::Relaxed)
}

/// Whether an allocation found the heap low since the last call (the I/O path then asks the
/// memory thread for a round).
pub fn take_low() -> bool {
    LOW.load(Ordering::Relaxed) && LOW.swap(false, Ordering::Relaxed)
}

/// Reserves the heap's address space for a device of `disksize` bytes (no memory, not
/// locked). With `lock`, every step committed later is locked (`mlock2`, as the daemon's
/// `mlockall` would have). Call once, before the threads that use it start; later calls do
/// nothing.
pub fn init(disksize: u64, lock: bool) -> std::io::Result<()> {
    static ONCE: Mutex<()> = Mutex::new(());
    let _once = ONCE.lock().unwrap_or_else(|e| e.into_inner());
    if BASE.load(Ordering::Acquire) != 0 {
        return Ok(());
    }
    let pages = usize::try_from(disksize / 4096).unwrap_or(usize::MAX);
    let span = pages
        .saturating_mul(SPAN_PER_PAGE)
        .clamp(MIN_SPAN, 64 << 30)
        .next_multiple_of(STEP);
    let base = crate::sys::reserve_address_space(span)?;
    SPAN.store(span, Ordering::Relaxed);
    LOCK.store(lock, Ordering::Relaxed);
    BASE.store(base as usize, Ordering::Release);
    Ok(())
}

/// Marks the calling thread as one that serves I/O: from now on it allocates from the I/O heap.
pub fn serve_from_io_heap() {
    // A thread's first call into malloc sets up its cache (an allocation of its own): done
    // now, so that a free of malloc's memory on the I/O path later does not.
    // SAFETY: a valid, nonzero layout; the block is freed at once with the same layout.
    unsafe {
        let layout = Layout::new::<u64>();
        let p = System.alloc(layout);
        if !p.is_null() {
            System.dealloc(p, layout);
        }
    }
    let _ = ON_IO_PATH.try_with(|on| on.set(true));
}

/// Commits, locks, faults in and hands to the allocator steps of the span until the free piece
/// at the heap's top is what [`ahead`] says. The memory thread's job: the faults may wait for
/// reclaim. Returns the bytes committed; 0 without [`init`] or when the kernel refuses (counted;
/// the next round tries again).
pub fn refill() -> usize {
    refill_with(Margin::Whole, &mut |_| {})
}

/// How much free a refill leaves at the heap's top.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Margin {
    /// What the heap keeps while memory is not short ([`CALM_RESERVE`], or the largest request
    /// seen), whether it is or not: what the I/O path needs for its next blocks; and, while
    /// memory is short, at most one step more toward the whole margin, so that a round of many
    /// arenas catches up step by step. The memory thread fills only this far between the
    /// pool's arenas, while writes may be waiting for the next one: with memory short each
    /// fault may wait in reclaim, and the whole margin (megabytes) at once can take over a
    /// second, time the waiting writes do not have.
    Calm,
    /// All of what the heap keeps now: [`RESERVE`] or more while memory is short.
    Whole,
}

/// [`refill`] to `margin`, calling `progress` with the pages faulted in as it goes, every
/// [`crate::sys::TOUCH_REPORT`] of them (the memory thread tells writes waiting for the pool's
/// reserve that it is not stuck: under pressure a whole step can take longer than they wait).
pub fn refill_with(margin: Margin, progress: &mut dyn FnMut(u64)) -> usize {
    let base = BASE.load(Ordering::Acquire);
    if base == 0 {
        return 0;
    }
    let span = SPAN.load(Ordering::Relaxed);
    let _one = REFILL.lock().unwrap_or_else(|e| e.into_inner());
    let mut added = 0;
    // Steps beyond the calm margin this refill may still commit.
    let mut beyond = match margin {
        Margin::Calm => 1,
        Margin::Whole => usize::MAX,
    };
    loop {
        let committed = COMMITTED.load(Ordering::Acquire);
        let free = top_free();
        if free >= ahead() || committed + STEP > span {
            break;
        }
        if free >= ahead_for(false) {
            if beyond == 0 {
                break;
            }
            beyond -= 1;
        }
        let at = base + committed;
        let lock = LOCK.load(Ordering::Relaxed);
        // SAFETY: the span's next step: inside it (checked above), and not yet committed, so
        // nothing uses it.
        if unsafe { crate::sys::commit_and_touch(at as *mut u8, STEP, lock, progress) }.is_err() {
            REFUSED.fetch_add(1, Ordering::Relaxed);
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

/// Gives back the committed steps at the heap's top beyond what [`ahead`] keeps free there
/// and [`TRIM_SLACK`], while memory is not short: what a swap storm committed is returned once
/// it is over. What stays free is at least what a refill fills to, so a refill and a trim do
/// not alternate. The memory thread's job, like [`refill`]. Returns the bytes given back.
pub fn trim() -> usize {
    let base = BASE.load(Ordering::Acquire);
    if base == 0 || SHORT.load(Ordering::Relaxed) {
        return 0;
    }
    let _one = REFILL.lock().unwrap_or_else(|e| e.into_inner());
    let committed = COMMITTED.load(Ordering::Acquire);
    let keep = ahead();
    let released = {
        let mut heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
        let free = top_of(&heap);
        let (Some(end), true) = (heap.end, free >= keep + TRIM_SLACK + STEP) else {
            return 0;
        };
        // Steps are claimed whole and talc's unit divides them, so its end is the committed end.
        debug_assert_eq!(end.as_ptr() as usize, base + committed);
        let steps = (free - keep - TRIM_SLACK) / STEP;
        let new_end = end.as_ptr() as usize - steps * STEP;
        // SAFETY: `end` is the heap's current end (updated under this lock by every claim,
        // extend and truncate), and `new_end` lies inside its free top piece: no allocation is
        // above it.
        heap.end = unsafe { heap.talc.truncate(end, new_end as *mut u8) };
        // talc may leave its end a little below `new_end` (its chunk unit): the step that
        // end is in stays committed, and the next refill extends talc from there. It keeps
        // the heap (at least `keep` and a step stay free above what is reserved); if it ever
        // did not, nothing is given back (a refill then claims a heap from the next step up).
        let Some(e) = heap.end else {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            return 0;
        };
        committed.saturating_sub((e.as_ptr() as usize - base).next_multiple_of(STEP))
    };
    if released == 0 {
        return 0;
    }
    COMMITTED.store(committed - released, Ordering::Release);
    let at = base + committed - released;
    // SAFETY: `at..at + released` was committed and is no longer talc's (truncated away under
    // the heap's lock), and only this (serialised) thread commits or decommits steps; a refill
    // commits it again before talc gets it back.
    if unsafe { crate::sys::decommit(at as *mut u8, released) }.is_err() {
        REFUSED.fetch_add(1, Ordering::Relaxed);
    }
    released
}

/// The free piece at the heap's top: what one allocation can surely have.
fn top_free() -> usize {
    top_of(&HEAP.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The free piece at the top of `heap` (its lock held).
fn top_of(heap: &Inner) -> usize {
    match heap.end {
        Some(end) => {
            // SAFETY: `end` is the heap's end as talc last returned it (claim, extend and
            // truncate are the only calls that change it, and each updates `end` under the
            // heap's lock).
            let reserved = unsafe { heap.talc.reserved(end) };
            end.as_ptr() as usize - reserved.up_to.as_ptr() as usize
        }
        None => 0,
    }
}

/// Whether `ptr` is in the I/O heap (allocated from it, or could be).
pub fn owns<T>(ptr: *const T) -> bool {
    in_heap(ptr.cast::<u8>().cast_mut())
}

/// Whether `ptr` is in the I/O heap's span.
fn in_heap(ptr: *mut u8) -> bool {
    let base = BASE.load(Ordering::Relaxed);
    base != 0 && (ptr as usize).wrapping_sub(base) < SPAN.load(Ordering::Relaxed)
}

fn on_io_path() -> bool {
    ON_IO_PATH.try_with(Cell::get).unwrap_or(false)
}

/// An allocation from the I/O heap, if it has room.
fn heap_alloc(layout: Layout) -> Option<*mut u8> {
    if layout.size() > LARGEST.load(Ordering::Relaxed) {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
    }
    let ptr = {
        let mut heap = HEAP.lock().unwrap_or_else(|e| e.into_inner());
        heap.end?;
        // SAFETY: `layout`'s size is nonzero (GlobalAlloc's contract).
        let ptr = unsafe { heap.talc.allocate(layout) };
        let top = top_of(&heap);
        if top < ahead() / 2 {
            LOW.store(true, Ordering::Relaxed);
        }
        ptr
    };
    let ptr = ptr.or_else(|| {
        LOW.store(true, Ordering::Relaxed);
        None
    })?;
    IN_USE.fetch_add(chunk_size(layout.size()), Ordering::Relaxed);
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
    IN_USE.fetch_sub(chunk_size(layout.size()), Ordering::Relaxed);
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
                IN_USE.fetch_add(chunk_size(new_size), Ordering::Relaxed);
                IN_USE.fetch_sub(chunk_size(layout.size()), Ordering::Relaxed);
                return ptr;
            }
        }
        let io = on_io_path();
        // SAFETY: `new_size` with `layout`'s alignment is a valid layout (GlobalAlloc's
        // contract for realloc).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let new = match (heap_block, io.then(|| heap_alloc(new_layout)).flatten()) {
            (_, Some(new)) => new,
            (false, None) => {
                if io {
                    FALLBACKS.fetch_add(1, Ordering::Relaxed);
                }
                // SAFETY: malloc's block, staying malloc's.
                return unsafe { System.realloc(ptr, layout, new_size) };
            }
            (true, None) => {
                if io {
                    FALLBACKS.fetch_add(1, Ordering::Relaxed);
                }
                // SAFETY: nonzero size, as `new_size` is.
                unsafe { System.alloc(new_layout) }
            }
        };
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least this long.
            unsafe { std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size)) };
            // SAFETY: `ptr` was allocated with `layout`, by whichever heap owns it.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}
