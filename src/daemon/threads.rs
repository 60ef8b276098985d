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

/// Whether the host's memory is short, for the pool's reserve and the I/O heap's margin:
/// [`Pressure::short`], or swap writing since `swap_outs` (the last reading, updated). Tells
/// both, and returns it.
pub(super) fn note_pressure(device: &Device, swap_outs: &mut Option<u64>) -> bool {
    let now = Pressure::swap_outs();
    let swapping = matches!((*swap_outs, now), (Some(a), Some(b)) if b != a);
    *swap_outs = now;
    let short = swapping || Pressure::read().short();
    device.set_memory_short(short);
    heap::set_memory_short(short);
    short
}

/// Arenas the memory thread has mapped into the pool's reserve, and the longest one took (ms):
/// how close a write burst came to outrunning it, in the progress log.
pub(super) static REFILLED_ARENAS: AtomicU64 = AtomicU64::new(0);
pub(super) static SLOWEST_REFILL_MS: AtomicU64 = AtomicU64::new(0);

/// The thread that keeps the pool's reserve filled: it maps memory the I/O threads then use
/// without asking the kernel. An I/O flusher too: its page faults may wait for reclaim, but never
/// write to swap themselves: as a plain thread, a refill's fault could start swap writes to this
/// very device and wait for a tag held by writes that wait for the refill, so the reserve would
/// stay empty.
pub(super) fn memory_thread(device: Arc<Device>) -> Result<(), ServeError> {
    std::thread::Builder::new()
        .name("uzram-memory".into())
        .spawn(move || {
            if let Err(e) = io_flusher() {
                log(&format!("memory: {e}"));
            }
            heap::serve_from_io_heap();
            // It takes the I/O heap's lock and the pool's: a fault on its stack while holding
            // either would stall the I/O threads behind reclaim.
            pin::prefault_stack();
            let mut last_report: Option<Instant> = None;
            let mut last_pressure: Option<Instant> = None;
            let mut calm_since: Option<Instant> = Some(Instant::now());
            let mut last_commit: Option<Instant> = None;
            let mut swap_outs = Pressure::swap_outs();
            let mut short = false;
            loop {
                device.wait_for_maintenance(Duration::from_secs(1));
                // Pages of swap's freed slots first: what they free may spare the refill.
                device.reclaim_freed();
                let t = Instant::now();
                // The pool's reserve is kept whole while memory is short or swap is writing:
                // swap writes then come in a storm, and each arena is slow to map.
                if !last_pressure.is_some_and(|p| t.duration_since(p) < PRESSURE_EVERY) {
                    short = note_pressure(&device, &mut swap_outs);
                    last_pressure = Some(t);
                    calm_since = if short { None } else { calm_since.or(Some(t)) };
                }
                if heap::refill() > 0 {
                    last_commit = Some(t);
                }
                // What a storm committed to the I/O heap goes back once memory has not been
                // short for a while, as the pool's reserve does, and no refill has committed
                // meanwhile (so that a large block that comes and goes does not make each
                // round commit and give back a step).
                let quiet = |since: Option<Instant>| {
                    since.map_or(true, |s| t.duration_since(s) >= HEAP_TRIM_AFTER)
                };
                if calm_since.is_some() && quiet(calm_since) && quiet(last_commit) {
                    heap::trim();
                }
                // Between arenas too: under pressure each one is slow to map, and the I/O
                // path's metadata keeps drawing on its heap meanwhile.
                // In a region (a device that outlives its worker) the next slot-table leaves
                // and metadata chunks are shared memory: faulted in here, not by a write (a
                // write that found one not resident would wait for reclaim). Between arenas, to
                // the calm margin (a few pages: the arenas a storm waits for come first); after
                // them, to the whole margin.
                let mut committed = false;
                let mut top_up = || {
                    committed |= heap::refill() > 0;
                    device.prefault_region(false);
                };
                let maintained = device.maintain_memory_with(&mut top_up);
                device.prefault_region(short);
                if committed {
                    last_commit = Some(Instant::now());
                }
                match maintained {
                    Ok(m) => {
                        if m.arenas_mapped > 0 {
                            let per = t.elapsed().as_millis() as u64 / m.arenas_mapped as u64;
                            REFILLED_ARENAS.fetch_add(m.arenas_mapped as u64, Ordering::Relaxed);
                            SLOWEST_REFILL_MS.fetch_max(per, Ordering::Relaxed);
                        }
                    }
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
/// backing file: see `Device::make_room`). An I/O flusher, like the queue threads: its writes to
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
            pin::prefault_stack();
            let mut ctx = match device.context() {
                Ok(ctx) => ctx,
                Err(e) => return log(&format!("policy: {e}")),
            };
            let mut policy = Policy::new();
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
