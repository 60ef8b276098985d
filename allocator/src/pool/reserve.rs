//! [`Growth::Reserve`]: the handshake between allocations, which take pre-mapped arenas and
//! never map, and the maintenance thread, which keeps the reserve filled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{Growth, Maintenance, Pool};
use crate::mem::{Mapping, Prefault, ARENA_PAGES, PAGE_SIZE};
use crate::Error;

/// The handshake between allocations and the maintenance thread in [`Growth::Reserve`] mode.
#[derive(Default)]
pub(super) struct ReserveSignal {
    /// Pages the maintenance thread has faulted in so far: an allocation waiting for a refill
    /// keeps waiting (up to [`RESERVE_WAIT_CAP`] times its wait) while this moves.
    pub(super) touched: AtomicU64,
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
    /// `refills` when a wait last timed out: until the next refill, allocations that find no
    /// room fail at once instead of each waiting out its time (a queue of writes would otherwise
    /// wait one after another).
    pub(super) starved_at: Option<u64>,
}

impl ReserveSignal {
    pub(super) fn ask(&self) {
        self.state.lock().needed = true;
        self.need.notify_one();
    }
}

/// An allocation waits at most this many times [`Growth::Reserve`]'s `wait` for a refill, and
/// only as long as the maintenance thread keeps faulting pages in: a refill that is slow (a busy
/// or emulated machine) is waited for; one that is stuck (in reclaim) fails after `wait`.
pub(super) const RESERVE_WAIT_CAP: u32 = 8;

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
    /// Waits until an empty arena is there; false if `w` ran out first (no progress by the
    /// maintenance thread for `w.wait`, or `w.cap` passed), or if an earlier wait ran out and
    /// no refill came since.
    pub(super) fn wait_for_refill(&self, w: &mut RefillWait) -> bool {
        let mut st = self.signal.state.lock();
        loop {
            // Checked under the signal's lock: a refill that lands after this check notifies
            // only after the wait below has released it, so no wakeup is lost.
            if self.arenas.lock().empty_arenas() > 0 {
                return true;
            }
            st.needed = true;
            self.signal.need.notify_one();
            if st.starved_at == Some(st.refills) {
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
            st.starved_at = Some(st.refills);
            return false;
        }
    }

    /// [`Growth::Reserve`] mode's maintenance: maps arenas (outside every lock, touching their
    /// pages) until `reserve_arenas` are empty, wakes the allocations waiting for them, and
    /// unmaps empty arenas beyond twice the reserve. Call it from a thread that may wait for
    /// reclaim (not an I/O thread of a swap device). A no-op in [`Growth::OnDemand`] mode.
    pub fn maintain(&self) -> Result<Maintenance, Error> {
        let mut done = Maintenance::default();
        if self.growth == Growth::OnDemand {
            return Ok(done);
        }
        while self.arenas.lock().empty_arenas() < self.reserve_arenas {
            let mapping =
                Mapping::new_counted(Prefault::Touch, &self.signal.touched).map_err(|errno| {
                    Error::OutOfMemory {
                        bytes: (ARENA_PAGES * PAGE_SIZE) as u64,
                        errno,
                    }
                })?;
            self.arenas.lock().insert(mapping);
            done.arenas_mapped += 1;
            self.signal.state.lock().refills += 1;
            self.signal.refilled.notify_all();
        }
        done.arenas_unmapped = self.unmap_empty(2 * self.reserve_arenas);
        Ok(done)
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
