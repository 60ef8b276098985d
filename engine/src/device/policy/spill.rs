//! Spill: under host pressure, once the pool holds 90 % of its share of RAM, the pages swap
//! writes next go straight through to the backing store, as zram + disk swap spills to the
//! disk. The kernel swaps out the pages it used least recently, so a page that arrives while
//! the pool is full is colder than those already in it: moving the pool's oldest pages out
//! instead moves the ones a cyclic workload reads next, so while spill is on host pressure
//! writes none of them back for the pool being above its share.
//!
//! The I/O path only queues the page's index ([`Tier::note_stored`](super::Tier::note_stored):
//! no lock, no allocation, no I/O); the policy thread writes the queued pages back in batches
//! ([`Policy::drain_spill`]), so a write does not wait for the backing store while the policy
//! thread keeps up. When it does not (several programs swapping out at once), the pool would
//! grow past its share into the memory the host is short of, and it is locked: so past a
//! ceiling (the share and a sixteenth) a write whose object would take a new pool page makes
//! room first (inline as a write at `mem_limit` does, or in hand-off mode by asking the policy
//! thread without waiting: the ceiling is soft, a limit is not; [`Tiering::past_ceiling`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam::queue::ArrayQueue;

use super::{Policy, BATCH};
use crate::device::tier::Tiering;
use crate::device::writeback::Batch;
use crate::device::{Device, PageIndex, SlotFlags, SlotState, PAGE_SIZE};

/// Page indexes the queue holds; a page that finds it full stays in the pool (host pressure
/// writes it back later if it gets old).
const QUEUE: usize = 4096;
/// Pages queued before a write wakes the policy thread (it also looks every 100 ms).
const WAKE: usize = 64;
/// Batches one [`Policy::drain_spill`] writes at most, so evictions asked for meanwhile are
/// not kept waiting.
const ROUND: usize = 4;

/// Spill's state, part of the policy's [`super::Tier`].
#[derive(Debug)]
pub(super) struct Spill {
    /// Set by the policy's tick; read by every write.
    on: AtomicBool,
    queue: ArrayQueue<u64>,
    /// Pool pages past which a write makes room first (0: none), set with `on`.
    ceiling_pages: AtomicU64,
}

impl Default for Spill {
    fn default() -> Spill {
        Spill {
            on: AtomicBool::new(false),
            queue: ArrayQueue::new(QUEUE),
            ceiling_pages: AtomicU64::new(0),
        }
    }
}

impl Spill {
    /// Whether writes spill now.
    pub(super) fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Nothing more may go (the store is full or failing, the budget or the writeback limit
    /// is spent): spill stops, and the ceiling with it, until the next tick decides again, and
    /// the queued pages stay in the pool.
    pub(super) fn stop(&self) {
        self.on.store(false, Ordering::Relaxed);
        self.ceiling_pages.store(0, Ordering::Relaxed);
        while self.queue.pop().is_some() {}
    }

    /// Decides for the next tick, from the pool's `used` bytes and its `share` of RAM under
    /// host pressure (`None`: no pressure, or spill is off): on at 90 % of the share, off
    /// below 80 % (the gap keeps it from flapping) or when the pressure is gone; and the
    /// ceiling, the share and a sixteenth, while there is pressure and writes may `evict`.
    pub(super) fn decide(&self, used: u64, share: Option<u64>, evict: bool) {
        let on = share.is_some_and(|share| {
            let at = if self.is_on() { 8 } else { 9 };
            share > 0 && used >= share / 10 * at
        });
        self.on.store(on, Ordering::Relaxed);
        let ceiling = share
            .filter(|_| evict)
            .map_or(0, |s| (s + s / 16) / PAGE_SIZE as u64);
        self.ceiling_pages.store(ceiling, Ordering::Relaxed);
    }

    /// The ceiling in bytes while writes spill and make room past it (`None` otherwise): up to
    /// it, host pressure leaves the pool's pages to their age (see `Policy::host_want`).
    pub(super) fn keeping_to(&self) -> Option<u64> {
        let ceiling = self.ceiling_pages.load(Ordering::Relaxed);
        (self.is_on() && ceiling > 0).then_some(ceiling * PAGE_SIZE as u64)
    }
}

impl Tiering {
    /// On the I/O path, before a page is stored: whether the pool is past its ceiling (see
    /// the module docs), so that the write makes room first.
    pub(in crate::device) fn past_ceiling(&self, dev: &Device) -> bool {
        let ceiling = self.policy.spill.ceiling_pages.load(Ordering::Relaxed);
        ceiling > 0 && dev.pool().pages_used() > ceiling
    }
}

impl super::Tier {
    /// On the I/O path, after page `index` was stored with `flags`: while spill is on, queues
    /// a stored (compressed or huge) page for the policy thread to write through.
    pub(in crate::device) fn note_stored(&self, index: PageIndex, flags: SlotFlags) {
        let tier = self;
        if !tier.spill.is_on() || !flags.contains(SlotFlags::STORED) {
            return;
        }
        // Full: the page stays in the pool. The policy thread is woken once per WAKE pages
        // queued (it also looks every 100 ms), not by every write.
        if tier.spill.queue.push(index.0).is_ok() && tier.spill.queue.len() % WAKE == 0 {
            tier.wake.notify_one();
        }
    }
}

impl Policy {
    /// Writes the pages spill queued through to the backing store, in batches (at most
    /// [`ROUND`]); a page rewritten or freed since is written as it is now, or skipped. Returns
    /// the pages written.
    pub(super) fn drain_spill(&mut self, device: &Device) -> u64 {
        let tiering = device.tiering();
        let tier = &tiering.policy;
        let Some(backing) = device.backing() else {
            return 0;
        };
        let mut written = 0;
        for _ in 0..ROUND {
            if tier.spill.queue.is_empty() {
                break;
            }
            if !tier.budget_allows(device.now()) {
                tier.spill.stop();
                break;
            }
            self.pages.clear();
            while self.pages.len() < BATCH {
                match tier.spill.queue.pop() {
                    Some(i) if i < device.pages() => self.pages.push(PageIndex(i)),
                    Some(_) => {}
                    None => break,
                }
            }
            let allowed = backing.limit_allows(self.pages.len());
            if allowed == 0 {
                tier.counters.budget_denied.fetch_add(1, Ordering::Relaxed);
                tier.spill.stop();
                break;
            }
            let keep = |s: &SlotState| s.flags.contains(SlotFlags::STORED);
            let b = tiering.write_batch(
                device,
                backing,
                &mut Batch::own(super::buffers(&mut self.bufs)),
                &self.pages[..allowed],
                &keep,
                true,
            );
            self.pages.clear();
            tier.budget.lock().charge(b.bytes);
            let c = &tier.counters;
            super::stats::count_written(&c.spilled_pages, &c.spilled_bytes, &b);
            written += b.written;
            if b.full || b.failed > 0 {
                tier.spill.stop();
                break;
            }
        }
        self.spilled_since_compact += written;
        written
    }
}

#[cfg(test)]
#[path = "spill_tests.rs"]
mod tests;
