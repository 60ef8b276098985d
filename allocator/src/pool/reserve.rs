//! [`Growth::Reserve`]: the handshake between allocations, which take pre-mapped arenas and
//! never map, and the maintenance thread, which keeps the reserve filled.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{Growth, Maintenance, Pool};
use crate::mem::{Prefault, ARENA_PAGES, PAGE_SIZE};
use crate::Error;

/// The handshake between allocations and the maintenance thread in [`Growth::Reserve`] mode.
pub(super) struct ReserveSignal {
    /// Empty arenas the maintenance thread keeps: an allocation that leaves fewer asks for more.
    target: AtomicUsize,
    /// Pages the maintenance thread has faulted in so far: an allocation waiting for a refill
    /// keeps waiting (up to [`RESERVE_WAIT_CAP`] times its wait) while this moves.
    pub(super) touched: AtomicU64,
    /// An allocation found no room since the last round (set where it found none, before it
    /// asks): a draw even on a reserve kept at 0.
    pub(super) dry: AtomicBool,
    pub(super) state: Mutex<ReserveState>,
    /// The maintenance thread waits here for `needed`.
    pub(super) need: Condvar,
    /// Allocations wait here for `refills` to move.
    pub(super) refilled: Condvar,
}

#[derive(Default)]
pub(super) struct ReserveState {
    pub(super) needed: bool,
    pub(super) refills: u64,
    /// Set when a wait last ran out: until it no longer holds, allocations that find no room
    /// fail at once instead of each waiting out its time (a queue of writes would otherwise
    /// wait one after another behind a stuck maintenance thread).
    pub(super) starved: Option<Starved>,
}

/// When a wait for a refill ran out (see [`ReserveState::starved`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Starved {
    /// `refills` then: any refill since ends it.
    pub(super) refills: u64,
    /// [`ReserveSignal::touched`] then, if the wait ran out for want of progress: any page the
    /// maintenance thread faults in since ends it too (it was held up, say by one slow fault,
    /// and is moving again, so the next write waits for it). `None` if the wait ran out at its
    /// cap while the thread was moving: a refill that slow is not waited for again.
    pub(super) touched: Option<u64>,
    /// The wait (without progress) that ran out: an allocation willing to wait longer
    /// ([`Pool::store_within`] with a longer wait, or the pool's own) waits out its own.
    pub(super) wait: Duration,
}

impl Starved {
    /// Whether an allocation that finds no room now, and would wait `wait`, fails at once.
    pub(super) fn holds(&self, refills: u64, touched: u64, wait: Duration) -> bool {
        self.refills == refills && self.touched.map_or(true, |t| t == touched) && wait <= self.wait
    }
}

impl ReserveSignal {
    pub(super) fn with_target(target: usize) -> ReserveSignal {
        ReserveSignal {
            target: AtomicUsize::new(target),
            touched: AtomicU64::new(0),
            dry: AtomicBool::new(false),
            state: Mutex::default(),
            need: Condvar::new(),
            refilled: Condvar::new(),
        }
    }

    /// Empty arenas the reserve is kept at now.
    pub(super) fn target(&self) -> usize {
        self.target.load(Ordering::Relaxed)
    }

    pub(super) fn ask(&self) {
        self.state.lock().needed = true;
        self.need.notify_one();
    }
}

/// Two refills closer together than this mean a burst: the reserve doubles (up to its most),
/// so the maintenance thread stays a whole reserve ahead of the writes.
pub(super) const BURST_GAP: Duration = Duration::from_secs(1);

/// A reserve that no allocation has drawn on for this long halves (down to its least), and the
/// empty arenas beyond it are unmapped: memory held against a burst goes back once the burst
/// is over.
pub(super) const IDLE_DECAY: Duration = Duration::from_secs(10);

/// What the maintenance thread knows of demand: when the last round that filled the reserve
/// ended, when allocations last drew the reserve down, when the host's memory was last short,
/// and when the reserve's size last changed.
#[derive(Default)]
pub(super) struct Demand {
    last_filled: Option<Instant>,
    last_draw: Option<Instant>,
    last_short: Option<Instant>,
    last_change: Option<Instant>,
}

impl Demand {
    /// The reserve's next size from its size `target` now (in `min..=max`), given whether the
    /// allocations drew it below `target` since the last round and whether the host's memory is
    /// `short` (see [`Pool::set_memory_short`]), at `now` (the round's start).
    /// While memory is short the reserve is at its most: that is when swap writes come, in a
    /// storm, and when every arena is slowest to map (each of its pages is reclaimed for), so a
    /// reserve that only began to grow then would run dry. A burst is a draw within
    /// [`BURST_GAP`] of the end of the last round that filled the reserve: measured from the
    /// end, so a round that is slow to map (memory short) does not hide the burst; and only
    /// after a round that filled it, so rounds that fail to map (and are retried at once) do not
    /// count as draws.
    pub(super) fn next_target(
        &mut self,
        target: usize,
        drawn: bool,
        short: bool,
        min: usize,
        max: usize,
        now: Instant,
    ) -> usize {
        let since =
            |t: Option<Instant>| t.map_or(Duration::MAX, |t| now.saturating_duration_since(t));
        if short {
            self.last_short = Some(now);
            if drawn {
                self.last_draw = Some(now);
            }
            if target < max {
                self.last_change = Some(now);
            }
            return max;
        }
        if drawn {
            let burst = since(self.last_filled) < BURST_GAP;
            self.last_draw = Some(now);
            // One doubling per filled round.
            self.last_filled = None;
            // A reserve kept at 0 that an allocation found dry holds one arena from now on.
            let next = (if burst { target * 2 } else { target }).clamp(1, max.max(1));
            if next != target {
                self.last_change = Some(now);
            }
            return next;
        }
        if target > min
            && since(self.last_draw) >= IDLE_DECAY
            && since(self.last_short) >= IDLE_DECAY
            && since(self.last_change) >= IDLE_DECAY
        {
            self.last_change = Some(now);
            return (target / 2).max(min);
        }
        target
    }

    /// A round filled the reserve; it ended at `end`.
    pub(super) fn filled(&mut self, end: Instant) {
        self.last_filled = Some(end);
    }
}

/// An allocation waits at most this many times [`Growth::Reserve`]'s `wait` for a refill, and
/// only as long as the maintenance thread keeps faulting pages in: a refill that is slow (a busy
/// or emulated machine) is waited for; one that is stuck (in reclaim) fails after `wait`.
pub(super) const RESERVE_WAIT_CAP: u32 = 8;

/// How long an allocation in [`Growth::Reserve`] mode waits for a refill without progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RefillPatience {
    /// Not at all: it fails at once.
    None,
    /// The pool's own `wait`.
    Own,
    /// This long.
    For(Duration),
    /// At most this long in all for a refill, however the maintenance thread fares, and never
    /// at once for an earlier wait's running out: the caller, not the pool, judges whether
    /// the thread is stuck (see [`Pool::store_for`]).
    Slice(Duration),
}

/// Where an allocation's wait for a refill stands (see [`Pool::wait_for_refill`]).
pub(super) struct RefillWait {
    /// Fail at this point unless the maintenance thread made progress since `progress`.
    pub(super) deadline: Instant,
    /// Fail at this point whatever happens.
    pub(super) cap: Instant,
    pub(super) progress: u64,
    pub(super) wait: Duration,
}

impl Pool {
    /// Whether an empty arena is there; if not, asks the maintenance thread for one. Called
    /// under the signal's lock (`st`): a refill that lands after this check notifies only after
    /// the caller's wait has released it, so no wakeup is lost.
    fn arena_or_ask(&self, st: &mut ReserveState) -> bool {
        if self.arenas.lock().empty_arenas() > 0 {
            return true;
        }
        st.needed = true;
        self.signal.need.notify_one();
        false
    }

    /// Waits until an empty arena is there; false if `w` ran out first (no progress by the
    /// maintenance thread for `w.wait`, or `w.cap` passed), or at once while an earlier wait's
    /// running out still holds (see [`Starved`]).
    pub(super) fn wait_for_refill(&self, w: &mut RefillWait) -> bool {
        let mut st = self.signal.state.lock();
        loop {
            if self.arena_or_ask(&mut st) {
                return true;
            }
            let touched = self.signal.touched.load(Ordering::Relaxed);
            if st
                .starved
                .is_some_and(|s| s.holds(st.refills, touched, w.wait))
            {
                return false;
            }
            if !self
                .signal
                .refilled
                .wait_until(&mut st, w.deadline.min(w.cap))
                .timed_out()
            {
                continue;
            }
            if self.arenas.lock().empty_arenas() > 0 {
                return true;
            }
            let progress = self.signal.touched.load(Ordering::Relaxed);
            let now = Instant::now();
            if progress != w.progress && now < w.cap {
                // Slow, not stuck: the maintenance thread is faulting the next arena in.
                w.progress = progress;
                w.deadline = now + w.wait;
                continue;
            }
            let ran_out = Starved {
                refills: st.refills,
                touched: (progress == w.progress).then_some(progress),
                wait: w.wait,
            };
            // A longer wait's running out that still holds is kept: it covers this one too.
            let keep = st
                .starved
                .is_some_and(|s| s.holds(st.refills, progress, w.wait) && s.wait > w.wait);
            if !keep {
                st.starved = Some(ran_out);
            }
            return false;
        }
    }

    /// Waits until an empty arena is there or `deadline` passes (false then). Neither honours
    /// nor sets [`ReserveState::starved`]: a [`RefillPatience::Slice`] wait is short, and its
    /// caller keeps its own account of the maintenance thread's progress.
    pub(super) fn wait_for_refill_until(&self, deadline: Instant) -> bool {
        let mut st = self.signal.state.lock();
        loop {
            if self.arena_or_ask(&mut st) {
                return true;
            }
            if self
                .signal
                .refilled
                .wait_until(&mut st, deadline)
                .timed_out()
            {
                return self.arenas.lock().empty_arenas() > 0;
            }
        }
    }

    /// How far the maintenance thread has come: pages it has faulted in (arenas and what
    /// [`Pool::note_progress`] reports) and arenas it has mapped, both only ever growing.
    /// For a caller of [`Pool::store_for`] that judges whether the thread is stuck.
    pub fn upkeep_progress(&self) -> (u64, u64) {
        (
            self.signal.touched.load(Ordering::Relaxed),
            self.signal.state.lock().refills,
        )
    }

    /// Empty arenas the reserve is kept at now: on demand the configured reserve; in
    /// [`Growth::Reserve`] mode what [`Pool::maintain`] sized from demand.
    pub fn reserve_target_arenas(&self) -> usize {
        self.reserve_target()
    }

    pub(super) fn reserve_target(&self) -> usize {
        match self.growth {
            Growth::OnDemand => self.reserve_arenas,
            Growth::Reserve { .. } => self.signal.target(),
        }
    }

    /// [`Growth::Reserve`] mode's maintenance: sizes the reserve from demand, maps arenas
    /// (outside every lock, touching their pages) until that many are empty, wakes the
    /// allocations waiting for them, and unmaps empty arenas beyond twice the reserve. Call it
    /// from a thread that may wait for reclaim (not an I/O thread of a swap device), at least
    /// once a second. A no-op in [`Growth::OnDemand`] mode.
    ///
    /// The reserve follows demand between `reserve_min_arenas` and `reserve_arenas`: two
    /// rounds that find it drawn down within [`BURST_GAP`] double it (a burst: the maintenance
    /// thread then has a whole reserve's worth of allocations to map the next arenas), an
    /// allocation that found none takes a reserve kept at 0 to one arena, memory
    /// short on the host ([`Pool::set_memory_short`]) takes it to its most, and [`IDLE_DECAY`]
    /// without either halves it, unmapping what is beyond it.
    pub fn maintain(&self) -> Result<Maintenance, Error> {
        self.maintain_at(Instant::now(), &mut || {})
    }

    /// [`Pool::maintain`], calling `after_each` after each arena it maps (once the allocations
    /// waiting for it are woken): mapping an arena while memory is short can take long (every
    /// page is reclaimed for), and a caller that keeps other memory ready for the allocations
    /// (malloc's heap) tops it up in between. The first arena comes first: allocations may be
    /// waiting for it.
    pub fn maintain_with(&self, after_each: &mut dyn FnMut()) -> Result<Maintenance, Error> {
        self.maintain_at(Instant::now(), after_each)
    }

    /// Tells allocations waiting for a refill that the maintenance thread is making progress
    /// with other memory of the caller's, `pages` faulted in (between arenas, see
    /// [`Pool::maintain_with`]): they keep waiting for the arena that follows (up to
    /// [`RESERVE_WAIT_CAP`] times their wait) rather than give up while it works.
    pub fn note_progress(&self, pages: u64) {
        self.signal.touched.fetch_add(pages, Ordering::Relaxed);
    }

    pub(super) fn maintain_at(
        &self,
        now: Instant,
        after_each: &mut dyn FnMut(),
    ) -> Result<Maintenance, Error> {
        let mut done = Maintenance::default();
        if self.growth == Growth::OnDemand {
            done.reserve_target = self.reserve_arenas;
            return Ok(done);
        }
        let old = self.signal.target();
        let target = {
            let dry = self.signal.dry.swap(false, Ordering::Relaxed);
            let drawn = dry || self.arenas.lock().empty_arenas() < old;
            let short = self.memory_short.load(Ordering::Relaxed);
            self.demand.lock().next_target(
                old,
                drawn,
                short,
                self.reserve_min,
                self.reserve_arenas,
                now,
            )
        };
        self.signal.target.store(target, Ordering::Relaxed);
        done.reserve_target = target;
        while self.arenas.lock().empty_arenas() < target {
            let source = self.arenas.lock().source().clone();
            let mapping = source
                .map(Prefault::Touch, &self.signal.touched)
                .map_err(|errno| Error::OutOfMemory {
                    bytes: (ARENA_PAGES * PAGE_SIZE) as u64,
                    errno,
                })?;
            self.arenas.lock().insert(mapping);
            done.arenas_mapped += 1;
            self.signal.state.lock().refills += 1;
            self.signal.refilled.notify_all();
            after_each();
        }
        // The round's end: later than its start by the time mapping took (a test's clock, ahead
        // of the real one, is its own).
        self.demand.lock().filled(now.max(Instant::now()));
        // A shrink gives back what is beyond the new size at once; otherwise up to twice the
        // reserve stays, so frees and allocations that alternate do not map and unmap.
        let keep = if target < old { target } else { 2 * target };
        done.arenas_unmapped = self.unmap_empty(keep);
        Ok(done)
    }

    /// Tells a [`Growth::Reserve`] pool whether the host's memory is short now (the caller's
    /// judgement: the daemon's is `Pressure::short` of the engine). While it is, the reserve is
    /// kept at its most, and it shrinks only [`IDLE_DECAY`] after memory stopped being short;
    /// the change to short asks for a round at once. A no-op in [`Growth::OnDemand`] mode.
    pub fn set_memory_short(&self, short: bool) {
        if self.growth == Growth::OnDemand {
            return;
        }
        let was = self.memory_short.swap(short, Ordering::Relaxed);
        if short && !was {
            self.signal.ask();
        }
    }

    /// Wakes the thread blocked in [`Pool::wait_for_maintenance`] for a round now, as an
    /// allocation that takes the reserve down does: for a caller that keeps other memory ready
    /// for the allocations and found it low. Never blocks beyond the signal's short lock.
    pub fn request_maintenance(&self) {
        self.signal.ask();
    }

    /// Blocks until an allocation asks for arenas or `timeout` passes, for the thread that calls
    /// [`Pool::maintain`]. Returns whether it was asked.
    pub fn wait_for_maintenance(&self, timeout: Duration) -> bool {
        let mut st = self.signal.state.lock();
        if !st.needed {
            let _ = self.signal.need.wait_for(&mut st, timeout);
        }
        std::mem::take(&mut st.needed)
    }

    /// Unmaps empty arenas beyond `keep`, each outside the arena lock. Returns how many.
    pub(super) fn unmap_empty(&self, keep: usize) -> usize {
        let mut n = 0;
        while let Some(mapping) = {
            let taken = self.arenas.lock().take_empty(keep);
            taken
        } {
            drop(mapping);
            n += 1;
        }
        n
    }
}
