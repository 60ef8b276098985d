//! Eviction: a write that finds no room writes cold pages back and retries, on its own I/O
//! thread or, in hand-off mode, by asking the policy thread.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{EVICT_FAST_FAIL, EVICT_SCAN, EVICT_WAIT};
use crate::device::tier::Tiering;
use crate::device::writeback::{Batch, BatchStats, WbBuffers};
use crate::device::{Device, PageIndex, SlotFlags, PAGE_SIZE};

impl super::Requests {
    /// Asks for room for an object of `size` bytes (sizes asked already count once; past
    /// eight, the round frees room anyway).
    fn push(&mut self, size: usize) {
        let size = size.min(PAGE_SIZE) as u16;
        if !self.sizes[..self.n].contains(&size) && self.n < self.sizes.len() {
            self.sizes[self.n] = size;
            self.n += 1;
        }
    }
}

impl super::Tier {
    /// Hand-off mode (see [`Device::set_evict_hand_off`]).
    pub(in crate::device) fn set_hand_off(&self, on: bool) {
        self.hand_off.store(on, Ordering::Relaxed);
    }

    /// Counts a write that failed although eviction was tried.
    pub(in crate::device) fn count_evict_failed(&self) {
        self.counters.evict_failed.fetch_add(1, Ordering::Relaxed);
    }
}

impl Tiering {
    /// Makes room for an object of `size` bytes: inline with `batch` ([`Tiering::evict`]), or
    /// in hand-off mode by asking the policy thread and waiting at most [`EVICT_WAIT`] for its
    /// round. Returns whether room was made (the store is worth retrying).
    pub(in crate::device) fn make_room(
        &self,
        dev: &Device,
        batch: Option<&mut Batch<'_>>,
        size: usize,
    ) -> bool {
        let tier = &self.policy;
        if !tier.hand_off.load(Ordering::Relaxed) {
            return batch.is_some_and(|b| self.evict(dev, b, size));
        }
        if self.backing.is_none() || !tier.config.lock().evict {
            return false;
        }
        let mut r = tier.requests.lock();
        r.push(size);
        tier.wake.notify_one();
        let now = Instant::now();
        if r.starved_until.is_some_and(|t| now < t) {
            tier.counters
                .evict_fast_fails
                .fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // The round that takes this request (pushed above, or by another write for the same
        // size since the last take) is the next one.
        let ticket = r.taken + 1;
        let deadline = now + EVICT_WAIT;
        while r.done < ticket {
            if tier.served.wait_until(&mut r, deadline).timed_out() {
                break;
            }
        }
        if r.done < ticket {
            tier.counters.evict_timeouts.fetch_add(1, Ordering::Relaxed);
            r.starved_until = Some(Instant::now() + EVICT_FAST_FAIL);
            return false;
        }
        // Retry the store even if the round found nothing to evict: room may have been made
        // meanwhile (the watermark, another round); the caller's rounds are bounded.
        true
    }

    /// Makes room for an object of `size` bytes without waiting for it, for a write past the
    /// pool's ceiling (a soft bound, unlike a limit): inline with `batch` as
    /// [`Tiering::make_room`] does, or in hand-off mode by asking the policy thread's next
    /// round.
    pub(in crate::device) fn ask_room(
        &self,
        dev: &Device,
        batch: Option<&mut Batch<'_>>,
        size: usize,
    ) {
        let tier = &self.policy;
        if !tier.hand_off.load(Ordering::Relaxed) {
            if let Some(b) = batch {
                self.evict(dev, b, size);
            }
            return;
        }
        tier.requests.lock().push(size);
        tier.wake.notify_one();
    }

    /// Makes room for an object of `size` bytes by writing cold pages back: first pages whose
    /// objects share its size class (each one written back frees a slot the new object can
    /// take, without a new zspage), else huge pages (each frees a pool page), else any cold
    /// pages, after which the pool is compacted. A
    /// bounded scan from a clock hand, one batch, one `pwrite`, no allocation; busy slots are
    /// skipped. Returns whether the store is worth retrying: pages were written back, or there
    /// were none to write (room was made meanwhile).
    pub(in crate::device) fn evict(
        &self,
        dev: &Device,
        batch: &mut Batch<'_>,
        size: usize,
    ) -> bool {
        let Some(backing) = self.backing.as_ref() else {
            return false;
        };
        let tier = &self.policy;
        let cfg = *tier.config.lock();
        if !cfg.evict {
            return false;
        }
        let now = dev.now();
        // Spent budgets lift the pool's ceiling too, until the next tick (as a full store does).
        if !tier.budget_allows(now) {
            tier.spill.stop();
            return false;
        }
        let allowed = backing.limit_allows(batch.bufs.capacity());
        if allowed == 0 {
            // zram's writeback_limit is spent.
            tier.counters.budget_denied.fetch_add(1, Ordering::Relaxed);
            tier.spill.stop();
            return false;
        }
        let pool = dev.pool();
        let Ok(class) = pool.class_size(size) else {
            return false;
        };
        let n = dev.pages();
        let scan = EVICT_SCAN.min(n);
        let start = tier.hand.fetch_add(scan, Ordering::Relaxed) % n;
        let mut pages = std::mem::take(&mut batch.bufs.pages);
        let mut any_class = false;
        // Passes: same class and not touched for 10 s; same class; huge pages (each one written
        // back frees a whole pool page at once) and grouped ones; any class (then compaction
        // frees zspages).
        for pass in 0..4 {
            pages.clear();
            any_class = pass == 3;
            for k in 0..scan {
                if pages.len() >= allowed {
                    break;
                }
                let i = PageIndex((start + k) % n);
                let s = dev.peek(i);
                if !s.flags.contains(SlotFlags::STORED) {
                    continue;
                }
                let same = !s.is_grouped() && pool.class_size(usize::from(s.size)) == Ok(class);
                let cold = now.saturating_sub(s.atime) >= 10;
                if match pass {
                    0 => same && cold,
                    1 => same,
                    // Huge pages, and grouped ones: a group's last member gives its chunks
                    // (whole pool pages mostly) back.
                    2 => usize::from(s.size) == PAGE_SIZE || s.is_grouped(),
                    _ => true,
                } {
                    pages.push(i);
                }
            }
            if !pages.is_empty() {
                break;
            }
        }
        let b = if pages.is_empty() {
            BatchStats::default()
        } else {
            self.write_batch(
                dev,
                backing,
                batch,
                &pages,
                &|s| s.flags.contains(SlotFlags::STORED),
                false,
            )
        };
        if b.full {
            // No room on the store: the pool's ceiling is lifted until the next tick.
            tier.spill.stop();
        }
        tier.budget.lock().charge(b.bytes);
        if any_class && b.written > 0 {
            // Objects of other classes went: compact so their zspages free up. Rare (the
            // watermark keeps a margin), and bounded by the pool's size.
            tier.counters
                .pages_compacted
                .fetch_add(pool.compact().pages_freed, Ordering::Relaxed);
        }
        let found = !pages.is_empty();
        batch.bufs.pages = pages;
        if b.written > 0 {
            tier.counters.evictions.fetch_add(1, Ordering::Relaxed);
            let c = &tier.counters;
            super::stats::count_written(&c.evicted_pages, &c.evicted_bytes, &b);
        }
        // Nothing stored to evict means the pool is (nearly) empty: room was made meanwhile.
        b.written > 0 || !found
    }
}

/// Serves the evictions writes have asked for (hand-off mode), without waiting for any: evicts
/// for each object size asked, then wakes the writers. Returns whether any asked.
pub(super) fn serve_pending(bufs: &mut Option<WbBuffers>, device: &Device) -> bool {
    let tiering = device.tiering();
    let tier = &tiering.policy;
    let (sizes, n, round) = {
        let mut r = tier.requests.lock();
        if r.n == 0 {
            return false;
        }
        r.taken += 1;
        let taken = (r.sizes, r.n, r.taken);
        r.n = 0;
        taken
    };
    let mut served = 0;
    let mut batch = Batch::own(super::buffers(bufs));
    for &size in &sizes[..n] {
        // A class with room now (writes past the ceiling ask without waiting, several sizes of
        // one class may be pending, and an eviction for one made room for all) needs none.
        let size = usize::from(size);
        if device.pool().has_room_for(size) || tiering.evict(device, &mut batch, size) {
            served += 1;
        }
    }
    let mut r = tier.requests.lock();
    r.done = round;
    if served > 0 {
        r.starved_until = None;
    }
    tier.served.notify_all();
    true
}
