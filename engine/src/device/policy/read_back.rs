//! Reads of written-back pages: the first read since a writeback judges it (an early read is
//! the policy's mistake) and stamps the page; a second read soon after brings it back into the
//! pool (`promote`). The first read brings it back too while promotions pay ([`FirstRead`]):
//! each promotion is a bet of one credit, which a hit (the promoted page read again from the
//! pool within the promote age, sooner than the pool's coldest pages go untouched) pays back
//! twice and a miss (read later than that, or written back again unread) not at all; first
//! reads promote while the credit lasts. The promote age is how long the pool's coldest pages
//! have gone untouched: set by each round for room (the age of the youngest it wrote) and
//! measured at each age scan (the youngest of the coldest quarter the pool holds), since
//! writes that evict or spill press the pool without a round. The bet is taken when the page
//! is promoted, not when it is judged (a miss may show only a pass of a cyclic walk later): so
//! first-read promotions go on only as fast as hits come back. Where the pages read from the
//! backing store are hot (a hot set the fill's order left there) promotions pay and each such
//! page costs one read, not two; where the next page read is the one longest untouched (a
//! cyclic walk larger than the pool) a promoted page is no hotter than those its room pushes
//! out, and the layout stays as it is.

use std::sync::atomic::{AtomicI64, Ordering};

use super::{
    bucket_min_age, coldest_cutoff, stored_by_age, BatchStats, Policy, Tier, COLD_AGE_START,
    EARLY_READ_SECS,
};
use crate::device::tier::Tiering;
use crate::device::{slot, Device, PageIndex, SlotFlags, SlotState};

/// Bound of [`FirstRead`]'s credit either way: the most first-read promotions awaiting their
/// judgement (a hit may come minutes after its promotion), and how much past evidence a change
/// of workload has to outweigh.
const CREDIT_BOUND: i64 = 16 * 1024;

/// Credit below which first reads do not promote: fewer hits than that are no evidence.
const CREDIT_EVIDENCE: i64 = 32;

/// Whether the first read of a written-back page brings it back: a credit every promotion
/// spends one of and every hit pays two back to, bounded. Second reads keep promoting whatever
/// it says (and so keep judging), so the evidence can turn both ways.
#[derive(Debug, Default)]
pub(super) struct FirstRead {
    credit: AtomicI64,
}

impl FirstRead {
    fn add(&self, delta: i64) {
        let _ = self
            .credit
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some((c + delta).clamp(-CREDIT_BOUND, CREDIT_BOUND))
            });
    }

    /// Whether a first read promotes: while the credit is past [`CREDIT_EVIDENCE`], spending
    /// one (given back by [`FirstRead::refund`] if the promotion does not happen).
    fn take(&self) -> bool {
        self.credit
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                (c > CREDIT_EVIDENCE).then_some(c - 1)
            })
            .is_ok()
    }

    fn refund(&self) {
        self.add(1);
    }

    #[cfg(test)]
    pub(super) fn credit(&self) -> i64 {
        self.credit.load(Ordering::Relaxed)
    }
}

/// The part of the pool's stored bytes, the oldest first, whose youngest idle age the age scan
/// takes for the promote age: a quarter.
const COLDEST_PART: u64 = 4;

impl Policy {
    /// A round that wrote back for room (the watermark, host pressure) sets the promote age
    /// to the idle age of the youngest pages it wrote: the pool's coldest.
    pub(super) fn note_round_for_room(&self, device: &Device, done: &BatchStats) {
        if done.written > 0 {
            device
                .tiering()
                .policy
                .set_promote_age(self.youngest_written);
        }
    }

    /// At each age scan (promotion on, a backing store, the pool not empty), the promote age
    /// becomes what the pool holds now: the idle age of the youngest of its coldest quarter of
    /// stored bytes. A round for room says how cold the pool's coldest were when it ran (and a
    /// round later in the same tick, or in the ticks between scans, sets it so again); writes
    /// that evict or spill keep the pool pressed without a round, and its pages go on ageing,
    /// so a last round's age grows stale. The quarter, not the oldest page: in a cyclic walk
    /// every page in the pool is read once a pass, their ages spread over the pass, and a page
    /// read twice a pass apart must stay older than the age (as a hit must come within it); a
    /// hot set beside a cold one leaves the cold pages' age.
    pub(super) fn measure_promote_age(&self, device: &Device, now: u32) {
        if device.tiering().policy.promote_age() == 0 || device.backing().is_none() {
            return;
        }
        let (hist, total) = stored_by_age(device, now, 0);
        if total > 0 {
            let (b, _) = coldest_cutoff(&hist, total.div_ceil(COLDEST_PART));
            device.tiering().policy.set_promote_age(bucket_min_age(b));
        }
    }
}

impl Tier {
    /// A written-back page was first read `age` seconds after its writeback: counts an early
    /// read when that is under [`EARLY_READ_SECS`].
    fn note_read_back(&self, age: u32) {
        if age < EARLY_READ_SECS {
            self.counters.early_reads.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A promoted page was read from the pool `age` seconds after its promotion (the first
    /// read since): a hit within the promote age (its bet paid back twice), a miss after it.
    pub(in crate::device) fn note_promoted_read(&self, age: u32) {
        if age < self.promote_age() {
            self.counters.promote_hits.fetch_add(1, Ordering::Relaxed);
            self.first_read.add(2);
        } else {
            self.note_promote_miss();
        }
    }

    /// A promoted page was written back again before any read from the pool, or read after
    /// the promote age: a miss (its bet is lost).
    pub(in crate::device) fn note_promote_miss(&self) {
        self.counters.promote_misses.fetch_add(1, Ordering::Relaxed);
    }

    /// A written-back page read again within this many seconds of its last read is brought
    /// back into the pool (0: never, `promote=0`).
    fn promote_age(&self) -> u32 {
        u32::try_from(self.counters.promote_age_secs.load(Ordering::Relaxed)).unwrap_or(u32::MAX)
    }

    /// Sets the promote age to how long the pool's coldest pages have gone untouched (what a
    /// round for room wrote back, or what the age scan measured; at least 2 s: 0 means off,
    /// and a read is judged a second after the last at the soonest), or to 0 with promotion
    /// off. Under the settings' lock, so that a
    /// change of `promote` meanwhile is not undone.
    pub(super) fn set_promote_age(&self, secs: u32) {
        let cfg = self.config.lock();
        let secs = if cfg.promote { secs.max(2) } else { 0 };
        self.counters
            .promote_age_secs
            .store(u64::from(secs), Ordering::Relaxed);
    }

    /// The `promote` setting changed (its caller holds the settings' lock): off sets the
    /// promote age to 0, on from off to [`COLD_AGE_START`] until the next round for room or
    /// age scan.
    pub(super) fn follow_promote_setting(&self, on: bool) {
        let age = &self.counters.promote_age_secs;
        if !on {
            age.store(0, Ordering::Relaxed);
        } else if age.load(Ordering::Relaxed) == 0 {
            age.store(u64::from(COLD_AGE_START), Ordering::Relaxed);
        }
    }
}

impl Tiering {
    /// After written-back page `index` (state `s`, its slot locked in `g`) was read from the
    /// store through `buf`, which still holds its object: the first read since the writeback
    /// judges it (a read soon after is the policy's mistake, an early read, counted once) and
    /// stamps the page read back; a second one within the promote age brings the page back
    /// into the pool, if the pool has room at once, since a page read again sooner than the
    /// pool's coldest pages have gone untouched is hotter than they are; so does the first,
    /// while promotions pay ([`FirstRead`]). The record is then freed, or kept for reuse, as
    /// on any free. An adopted record was not the policy's choice, and second 0 is before any
    /// writeback worth judging: neither is an early read.
    pub(in crate::device) fn after_read_back(
        &self,
        dev: &Device,
        buf: &[u8],
        index: PageIndex,
        g: &mut slot::SlotGuard<'_>,
        mut s: SlotState,
        now: u32,
    ) {
        let age = now.saturating_sub(s.atime);
        let window = self.policy.promote_age();
        if !s.flags.contains(SlotFlags::READ_BACK) {
            if s.atime != 0 && !s.flags.contains(SlotFlags::ADOPTED) {
                self.policy.note_read_back(age);
            }
            if window > 0 && self.policy.first_read.take() {
                if self.promote(dev, buf, index, g, &s, now) {
                    self.policy
                        .counters
                        .promoted_first
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                self.policy.first_read.refund();
            }
        } else if (1..window).contains(&age) && self.promote(dev, buf, index, g, &s, now) {
            // A second-read promotion bets too: its hit or miss is evidence like any other.
            self.policy.first_read.add(-1);
            return;
        }
        if !s.flags.contains(SlotFlags::READ_BACK) || s.atime != now {
            s.flags = s.flags | SlotFlags::READ_BACK;
            s.atime = now;
            g.set(s);
        }
    }

    /// Brings written-back page `index` (state `s`, whose object `buf` holds) back into the
    /// pool if the pool has room at once, marked promoted; whether it did.
    fn promote(
        &self,
        dev: &Device,
        buf: &[u8],
        index: PageIndex,
        g: &mut slot::SlotGuard<'_>,
        s: &SlotState,
        now: u32,
    ) -> bool {
        let Ok(h) = dev.pool().try_store(&buf[..usize::from(s.size)]) else {
            return false;
        };
        let stored = SlotState {
            word: h.to_raw(),
            flags: s
                .flags
                .intersection(SlotFlags::HUGE | SlotFlags::INCOMPRESSIBLE)
                | SlotFlags::STORED
                | SlotFlags::PROMOTED,
            prio: s.prio,
            size: s.size,
            atime: now,
        };
        dev.replace(index, g, stored);
        self.policy
            .counters
            .promoted_pages
            .fetch_add(1, Ordering::Relaxed);
        true
    }
}
