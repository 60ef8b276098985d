//! The daemon's memory thread (keeps the pool's reserve and the I/O heap filled) and its
//! policy thread (the tiering policy's rounds, and the evictions writes hand it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uzram_engine::{Device, Policy, Pressure};

use super::{heap, io_flusher, log, pin, ServeError};

/// How often the memory thread reads the host's memory figures at most (it is woken by every
/// write that draws on the reserve).
const PRESSURE_EVERY: Duration = Duration::from_millis(250);

/// How long memory must not have been short, and no refill have committed, before the memory
/// thread trims the I/O heap (the pool's reserve shrinks after as long).
const HEAP_TRIM_AFTER: Duration = Duration::from_secs(10);

/// How long the memory thread frees swap's freed slots before it sees to the pool's reserve
/// (and the I/O heap) again: well under the 1 s a swap write put off waits for its progress.
const FREED_STEP: Duration = Duration::from_millis(50);

/// What the memory thread read of the host's memory last time: swap's writes so far and
/// `MemAvailable`.
#[derive(Debug, Default)]
pub(super) struct LastReading {
    swap_outs: Option<u64>,
    available: Option<u64>,
    /// `MemTotal` (0 before the first reading).
    total: u64,
}

/// Whether a swap storm is near, for a swap device: `MemAvailable` under half of `MemTotal`, or
/// fallen by an eighth of it since the last reading (a quarter of a second ago, or a round of
/// the memory thread's: longer while it maps arenas slowly, when memory is short anyway). The reserve must be
/// mapped before the storm, not in it: once swap writes wait for an arena, the memory thread
/// maps it from free memory under the kernel's minimum, which its reclaim (an I/O flusher's:
/// it cannot write swap) cannot raise, and in the VM it then waited for minutes while every
/// swap write failed. Half leaves it the memory of a sixth of the machine to map in.
pub(super) fn storm_near(p: &Pressure, last_available: Option<u64>) -> bool {
    let total = p.mem_total;
    let fell = last_available.map_or(0, |a| a.saturating_sub(p.mem_available));
    total > 0 && (p.mem_available.saturating_mul(2) < total || fell.saturating_mul(8) >= total)
}

/// Whether the host's memory is short, for the pool's reserve and the I/O heap's margin:
/// [`Pressure::short`], swap writing since the `last` reading, or, for a swap device (`swap`),
/// a storm near ([`storm_near`]). Tells both, updates `last`, and returns it.
pub(super) fn note_pressure(device: &Device, last: &mut LastReading, swap: bool) -> bool {
    let now = Pressure::swap_outs();
    let swapping = matches!((last.swap_outs, now), (Some(a), Some(b)) if b != a);
    last.swap_outs = now;
    let p = Pressure::read();
    let near = swap && storm_near(&p, last.available);
    last.available = Some(p.mem_available);
    last.total = p.mem_total;
    let short = swapping || near || p.short();
    device.set_memory_short(short);
    heap::set_memory_short(short);
    short
}

/// Arenas the memory thread has mapped into the pool's reserve, and the longest one took (ms):
/// how close a write burst came to outrunning it, in the progress log.
pub(super) static REFILLED_ARENAS: AtomicU64 = AtomicU64::new(0);
pub(super) static SLOWEST_REFILL_MS: AtomicU64 = AtomicU64::new(0);

/// What the memory thread is doing (a [`Phase`]) and since when, packed in one word (the phase
/// in the top byte, the milliseconds since [`clock_ms`]'s start below): read, without a lock,
/// by a write that found the reserve dry and by the progress log, so that a write failed for
/// want of an arena says what held the thread that maps them.
static MEMORY_PHASE: AtomicU64 = AtomicU64::new(0);

/// What the memory thread can be doing, for [`memory_phase`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum Phase {
    Waiting = 0,
    ReclaimingFreed,
    ReadingPressure,
    RefillingHeap,
    PrefaultingRegion,
    MappingArena,
    TrimmingHeap,
}

impl Phase {
    fn from_u8(n: u8) -> Phase {
        [
            Phase::Waiting,
            Phase::ReclaimingFreed,
            Phase::ReadingPressure,
            Phase::RefillingHeap,
            Phase::PrefaultingRegion,
            Phase::MappingArena,
            Phase::TrimmingHeap,
        ]
        .get(usize::from(n))
        .copied()
        .unwrap_or(Phase::Waiting)
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Phase::Waiting => "waiting to be asked",
            Phase::ReclaimingFreed => "freeing swap's freed slots",
            Phase::ReadingPressure => "reading the host's memory figures",
            Phase::RefillingHeap => "committing the I/O heap",
            Phase::PrefaultingRegion => "faulting in the region's next leaves and chunks",
            Phase::MappingArena => "mapping an arena (or unmapping surplus ones)",
            Phase::TrimmingHeap => "trimming the I/O heap",
        }
    }
}

/// Milliseconds on the daemon's own clock (from its first call; no allocation).
pub(super) fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

fn enter(phase: Phase) {
    MEMORY_PHASE.store(
        (phase as u64) << 56 | (clock_ms() & ((1 << 56) - 1)),
        Ordering::Relaxed,
    );
}

/// What the memory thread is doing, and for how many milliseconds it has been. Never blocks
/// or allocates (the I/O path calls it).
pub(super) fn memory_phase() -> (Phase, u64) {
    let word = MEMORY_PHASE.load(Ordering::Relaxed);
    let since = word & ((1 << 56) - 1);
    (
        Phase::from_u8((word >> 56) as u8),
        clock_ms().saturating_sub(since),
    )
}

/// Waits until the worker serves the device. A successor takes over a device whose I/O the
/// kernel holds; memory it faulted in before then (an arena of the pool's reserve, a
/// recompression buffer) would come from reclaim, and in a swap storm reclaim waits for swap
/// writes to this very device: the memory thread spun in reclaim holding the address space's
/// lock, and the thread taking the device over waited for that lock, for good. Served, the
/// device takes reclaim's writes (a write that finds the reserve dry is put off until the
/// memory thread maps an arena).
fn wait_until_serving() {
    while !super::watchdog::SERVING.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The thread that keeps the pool's reserve filled: it maps memory the I/O threads then use
/// without asking the kernel. An I/O flusher too: its page faults may wait for reclaim, but never
/// write to swap themselves: as a plain thread, a refill's fault could start swap writes to this
/// very device and wait for a tag held by writes that wait for the refill, so the reserve would
/// stay empty.
pub(super) fn memory_thread(device: Arc<Device>) -> Result<(), ServeError> {
    std::thread::Builder::new()
        .name("uzram-memory".into())
        .spawn(move || {
            super::stallstack::note_memory_thread();
            if let Err(e) = io_flusher() {
                log(&format!("memory: {e}"));
            }
            heap::serve_from_io_heap();
            // It takes the I/O heap's lock and the pool's: a fault on its stack while holding
            // either would stall the I/O threads behind reclaim.
            pin::prefault_stack::<{ pin::UPKEEP_STACK_PREFAULT }>();
            wait_until_serving();
            let mut last_report: Option<Instant> = None;
            let mut last_pressure: Option<Instant> = None;
            let mut calm_since: Option<Instant> = Some(Instant::now());
            let mut last_commit: Option<Instant> = None;
            let mut last = LastReading {
                swap_outs: Pressure::swap_outs(),
                available: None,
                total: 0,
            };
            let mut short = false;
            let mut more_freed = false;
            loop {
                enter(Phase::Waiting);
                // A swap device reads the host's memory four times a second: a storm that
                // starts at once must find the reserve mapped (see `storm_near`).
                let swap = super::swapwatch::in_use_as_swap();
                if !more_freed {
                    device.wait_for_maintenance(if swap {
                        PRESSURE_EVERY
                    } else {
                        Duration::from_secs(1)
                    });
                }
                // Pages of swap's freed slots first: what they free may spare the refill. At
                // most FREED_STEP of them a round: a program that exits frees its whole swap at
                // once, and freeing it all took 1.3 s in the VM, longer than a write waits for
                // the reserve (the rest is freed in the rounds that follow, without a wait).
                enter(Phase::ReclaimingFreed);
                let step = Instant::now();
                more_freed = device
                    .reclaim_freed_until(|| step.elapsed() >= FREED_STEP)
                    .1;
                let t = Instant::now();
                // The pool's reserve is kept whole while memory is short or swap is writing:
                // swap writes then come in a storm, and each arena is slow to map.
                if !last_pressure.is_some_and(|p| t.duration_since(p) < PRESSURE_EVERY) {
                    enter(Phase::ReadingPressure);
                    short = note_pressure(&device, &mut last, swap);
                    last_pressure = Some(t);
                    calm_since = if short { None } else { calm_since.or(Some(t)) };
                }
                // Arenas first: writes may be waiting for one (they give up after a second
                // without progress here). Between arenas, and after them, the I/O heap is
                // topped up (under pressure each arena is slow to map, and the I/O path's
                // metadata keeps drawing on the heap meanwhile) and, in a region (a device
                // that outlives its worker), the next slot-table leaves and metadata chunks are
                // faulted in here, not by a write (a write that found one not resident would
                // wait for reclaim): between arenas to the calm margin, after them to the
                // whole one. Each step of that counts as progress for the waiting writes. At
                // a storm's start this order matters: the heap's margin grows by 3 MiB and
                // the region's by 2 MiB when memory turns short, and a memory thread that
                // faulted those in before the first arena would leave writes failing.
                let mut committed = false;
                // A swap device's whole slot table while memory is short, up to 1/64 of the
                // host's memory (see `Device::prefault_table`).
                let table_most = if swap { last.total / 64 } else { 0 };
                let mut progress = |pages: u64| device.note_upkeep_progress(pages);
                let mut top_up = |memory_short: bool| {
                    enter(Phase::RefillingHeap);
                    let margin = if memory_short {
                        heap::Margin::Whole
                    } else {
                        heap::Margin::Calm
                    };
                    committed |= heap::refill_with(margin, &mut progress) > 0;
                    enter(Phase::PrefaultingRegion);
                    // A swap device keeps the margin whole from its swapon on: a storm starts
                    // within a second, and a leaf faulted in then waits for reclaim, which
                    // waits for swap writes to this very device (the memory thread and a queue
                    // thread would both wait in shmem_fault, swap's bios all held).
                    device.prefault_region(memory_short || swap);
                    if memory_short {
                        device.prefault_table(table_most);
                    }
                };
                enter(Phase::MappingArena);
                // Counted per arena, not per round: a storm's round maps dozens, and the
                // progress log should show them as they come.
                let mut arena_start = Instant::now();
                let maintained = device.maintain_memory_with(&mut || {
                    let took = arena_start.elapsed().as_millis() as u64;
                    REFILLED_ARENAS.fetch_add(1, Ordering::Relaxed);
                    SLOWEST_REFILL_MS.fetch_max(took, Ordering::Relaxed);
                    top_up(false);
                    enter(Phase::MappingArena);
                    arena_start = Instant::now();
                });
                top_up(short);
                if committed {
                    last_commit = Some(Instant::now());
                }
                // What a storm committed to the I/O heap goes back once memory has not been
                // short for a while, as the pool's reserve does, and no refill has committed
                // meanwhile (so that a large block that comes and goes does not make each
                // round commit and give back a step).
                let quiet = |since: Option<Instant>| {
                    since.map_or(true, |s| t.duration_since(s) >= HEAP_TRIM_AFTER)
                };
                if calm_since.is_some() && quiet(calm_since) && quiet(last_commit) {
                    enter(Phase::TrimmingHeap);
                    heap::trim();
                }
                match maintained {
                    Ok(_) => {}
                    Err(e) => {
                        if !matches!(last_report, Some(t) if t.elapsed().as_secs() < 10) {
                            log(&format!("cannot refill the pool's reserve: {e}"));
                            last_report = Some(Instant::now());
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        })
        .map(drop)
        .map_err(|source| ServeError::Setup {
            what: "start the memory thread",
            source,
        })
}

/// The tiering policy's thread: once a second, a round of [`Policy::tick`] with the
/// host's memory figures; in between, it serves the evictions that writes hand it (a regular
/// backing file: see `Tiering::make_room`). An I/O flusher, like the queue threads: its writes to
/// the backing file (and its filesystem's journal) must not wait for swap, which may be this
/// device; a write it serves waits for it at most `EVICT_WAIT`.
pub(super) fn policy_thread(device: Arc<Device>) -> Result<(), ServeError> {
    std::thread::Builder::new()
        .name("uzram-policy".into())
        .spawn(move || {
            if let Err(e) = io_flusher() {
                return log(&format!("policy: {e}"));
            }
            heap::serve_from_io_heap();
            pin::prefault_stack::<{ pin::UPKEEP_STACK_PREFAULT }>();
            wait_until_serving();
            let mut ctx = match device.context() {
                Ok(ctx) => ctx,
                Err(e) => return log(&format!("policy: {e}")),
            };
            let mut policy = Policy::new();
            // Its writeback buffers only where it will write back: made now, on the I/O heap's
            // thread, they would keep 1.2 MiB of that heap committed on every idle daemon.
            if device.backing().is_some() {
                policy.make_buffers();
                // Larger than the heap's margin, they come from malloc, zeroed by the kernel
                // and not yet faulted in: made resident now, not by the first batch, which
                // may come with memory short.
                if let Err(e) = super::pin::populate_heap() {
                    log(&format!(
                        "policy: malloc's heap could not be made resident ({e}): its first writeback may wait for memory"
                    ));
                }
            }
            let mut last_report: Option<Instant> = None;
            let second = Duration::from_secs(1);
            let mut next_tick = Instant::now() + second;
            loop {
                let now = Instant::now();
                if now < next_tick {
                    // Wake at least every 100 ms: between ticks it also keeps the pool under
                    // the high watermark.
                    let wait = (next_tick - now).min(Duration::from_millis(100));
                    policy.serve_evictions(&device, wait);
                    continue;
                }
                next_tick = now + second;
                if let Err(e) = policy.tick(&device, &mut ctx, &Pressure::read()) {
                    if !matches!(last_report, Some(t) if t.elapsed().as_secs() < 60) {
                        log(&format!("policy: {e}"));
                        last_report = Some(Instant::now());
                    }
                }
            }
        })
        .map(drop)
        .map_err(|source| ServeError::Setup {
            what: "start the policy thread",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(total_mib: u64, available_mib: u64) -> Pressure {
        Pressure {
            mem_total: total_mib << 20,
            mem_available: available_mib << 20,
            psi_some_avg10: None,
        }
    }

    #[test]
    fn a_storm_is_near_under_half_of_memory_available_or_after_a_fast_fall() {
        // Plenty, and steady or falling slowly: not near.
        assert!(!storm_near(&reading(800, 600), None));
        assert!(!storm_near(&reading(800, 600), Some(650 << 20)));
        assert!(!storm_near(&reading(800, 401), Some(420 << 20)));
        // Under half: near, whatever the fall.
        assert!(storm_near(&reading(800, 399), None));
        assert!(storm_near(&reading(800, 399), Some(300 << 20)));
        // An eighth of the machine gone since the last reading: near, with most still free.
        assert!(storm_near(&reading(800, 600), Some(700 << 20)));
        assert!(!storm_near(&reading(800, 600), Some(699 << 20)));
        // Unknown total (no MemTotal): never.
        assert!(!storm_near(&reading(0, 0), Some(100 << 20)));
    }
}
