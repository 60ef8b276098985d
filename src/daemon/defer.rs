//! Writes put off while the pool's reserve is dry. A write that finds no arena waits
//! [`DEFER_SLICE`] for one; if none came, its queue thread keeps it (the kernel's request
//! stays in flight, its data with the kernel) and serves the requests behind it, trying it
//! again each round until it is stored. No error reaches swap or a file system, and the queue
//! thread, which serves one request at a time, holds no read behind a wait longer than a
//! slice. (A write is never completed short instead: Linux 6.18's ublk requeues the rest of a
//! short write, but 7.3's ends the whole request as written, and the rest would be lost.)
//!
//! A write is put off only while the memory thread is getting somewhere: it fails with ENOMEM,
//! as before, once the thread has faulted in no page for the writer's patience
//! ([`super::SWAP_RESERVE_WAIT`] for swap, which keeps the page and tries again;
//! [`super::RESERVE_WAIT`] for others), or mapped
//! no arena for [`PATIENCE_CAP`] times that, counted from when the reserve ran dry. Kernel zram
//! takes its memory from the kernel's reserves in the same case; a thread that cannot get
//! pages at all must not leave writes waiting for ever (a file system's writer waits on them
//! in D state, and the hung-task watchdog fires at 120 s).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a write waits for an arena before it is put off, and how long a queue thread with
/// writes put off waits for one each round before it serves what came meanwhile.
pub(super) const DEFER_SLICE: Duration = Duration::from_millis(20);

/// A write is put off until no arena came for this many times its patience.
const PATIENCE_CAP: u32 = 8;

/// Writes put off so far (each once, however many rounds it waited), for the progress log.
pub(super) static DEFERRED: AtomicU64 = AtomicU64::new(0);

/// The memory thread's progress since the reserve ran dry.
#[derive(Debug, Clone, Copy)]
struct Episode {
    /// Pages faulted in and arenas mapped, as `Device::upkeep_progress` last told them.
    touched: u64,
    refills: u64,
    /// When each last moved (or the episode began).
    touched_at: Instant,
    refilled_at: Instant,
}

impl Episode {
    fn new(progress: (u64, u64), now: Instant) -> Episode {
        Episode {
            touched: progress.0,
            refills: progress.1,
            touched_at: now,
            refilled_at: now,
        }
    }

    /// Whether a write that found no room at `now`, the memory thread having come to
    /// `progress`, is put off (else it fails) by a writer of `patience`.
    fn put_off(&mut self, progress: (u64, u64), now: Instant, patience: Duration) -> bool {
        if progress.0 != self.touched {
            self.touched = progress.0;
            self.touched_at = now;
        }
        if progress.1 != self.refills {
            self.refills = progress.1;
            self.refilled_at = now;
        }
        now.duration_since(self.touched_at) < patience
            && now.duration_since(self.refilled_at) < patience * PATIENCE_CAP
    }
}

/// A queue thread's account of the memory thread while writes of its own are put off.
#[derive(Debug, Default)]
pub struct Deferral {
    /// Since the reserve ran dry for this thread; `None` while none of its writes is put off.
    episode: Option<Episode>,
    /// The memory thread's progress when this thread last failed a write for want of it, and
    /// when that progress was made: until it moves, a write that finds the reserve dry fails
    /// at once, even in a new episode (a stuck thread is not waited for again by each batch).
    refused: Option<((u64, u64), Instant)>,
}

impl Deferral {
    /// Whether a write that found the reserve dry (after its slice) is put off (`Ok`): see the
    /// module's comment. `progress` is `Device::upkeep_progress`; `patience` the writer's;
    /// `first`: the write's first time (counted in [`DEFERRED`]). `Err`: it fails, the memory
    /// thread having made no progress for that many milliseconds.
    pub fn put_off(
        &mut self,
        progress: (u64, u64),
        patience: Duration,
        first: bool,
    ) -> Result<(), u64> {
        let now = Instant::now();
        let since_ms = |t: Instant| now.duration_since(t).as_millis() as u64;
        if let Some((at, when)) = self.refused {
            if at == progress {
                return Err(since_ms(when));
            }
            self.refused = None;
        }
        let episode = self
            .episode
            .get_or_insert_with(|| Episode::new(progress, now));
        if episode.put_off(progress, now, patience) {
            if first {
                DEFERRED.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        }
        self.refused = Some((progress, episode.touched_at));
        Err(since_ms(episode.touched_at))
    }

    /// None of this thread's writes is put off any more: a reserve that runs dry again starts
    /// a new count (unless the memory thread has not moved since a write failed for it).
    pub fn over(&mut self) {
        self.episode = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_write_is_put_off_while_the_memory_thread_moves_and_fails_once_it_stops() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut e = Episode::new((100, 3), t0);
        // No progress yet, but within the patience: put off.
        assert!(e.put_off((100, 3), at(900), SEC));
        // A page at 950 ms: the patience counts from there.
        assert!(e.put_off((101, 3), at(950), SEC));
        assert!(e.put_off((101, 3), at(1900), SEC));
        // A second without a page: fails, and keeps failing until one comes.
        assert!(!e.put_off((101, 3), at(1950), SEC));
        assert!(!e.put_off((101, 3), at(2500), SEC));
        assert!(e.put_off((102, 3), at(2600), SEC));
    }

    #[test]
    fn a_memory_thread_that_failed_a_write_is_not_waited_for_again_until_it_moves() {
        let mut d = Deferral::default();
        // Dry, and the thread never moves: put off for the patience, then refused.
        assert_eq!(d.put_off((5, 1), Duration::from_millis(30), true), Ok(()));
        std::thread::sleep(Duration::from_millis(40));
        let stalled = d
            .put_off((5, 1), Duration::from_millis(30), false)
            .unwrap_err();
        assert!(stalled >= 40, "{stalled}");
        // Its writes all failed, a new one finds the reserve dry: refused at once.
        d.over();
        assert!(d.put_off((5, 1), Duration::from_millis(30), true).is_err());
        // The thread faults a page in: put off again.
        assert_eq!(d.put_off((6, 1), Duration::from_millis(30), true), Ok(()));
    }

    #[test]
    fn a_memory_thread_that_faults_pages_in_but_maps_no_arena_is_waited_for_only_so_long() {
        let t0 = Instant::now();
        let mut e = Episode::new((0, 0), t0);
        let mut put_off = 0;
        // A page every 100 ms and never a whole arena: put off for 8 s (8 x the patience).
        for ms in (100..=9000).step_by(100) {
            if e.put_off((ms, 0), t0 + Duration::from_millis(ms), SEC) {
                put_off += 1;
            }
        }
        assert_eq!(put_off, 79, "put off from 0.1 s to 7.9 s");
        // An arena: put off again.
        assert!(e.put_off((9100, 1), t0 + Duration::from_millis(9100), SEC));
    }
}
