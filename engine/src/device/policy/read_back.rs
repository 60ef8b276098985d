//! Reads of written-back pages: the first read since a writeback judges it (an early read is
//! the policy's mistake) and stamps the page; a second read soon after brings it back into the
//! pool (`promote`). The first read brings it back too while promotions pay ([`FirstRead`]):
//! each promotion is a bet of one credit, which a hit (the promoted page read again while it is
//! still in the pool: a read of the backing store saved, however long after) pays back twice
//! and a miss (written back again unread) not at all; first reads promote while the credit
//! lasts. The bet is taken when the page is promoted, not when it is judged (a miss may show
//! only a pass of a cyclic walk later): so first-read promotions go on only as fast as hits
//! come back. Where the pages read from the backing store are hot (a hot set the fill's order
//! left there) promotions pay and each such page costs one read, not one a fault; where the
//! next page read is the one longest untouched (a cyclic walk larger than the pool) a promoted
//! page is pushed out again before the walk comes back to it, and the layout stays as it is.
//! A hit is not bounded by the promote age: a hot page the kernel keeps in RAM between faults
//! is read from the device less often than the pool's coldest pages go untouched, and it is
//! still the page to keep.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::{BatchStats, Policy, Tier, COLD_AGE_START, EARLY_READ_SECS};
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

/// When the last round for room set the promote age (device clock plus one; 0: no round yet):
/// the pool's coldest pages go on ageing until the next round moves some out.
#[derive(Debug, Default)]
pub(super) struct PromoteClock {
    since: AtomicU64,
}

impl Policy {
    /// A round that wrote back for room (the watermark, host pressure) sets the promote age
    /// to the idle age of the youngest pages it wrote: the pool's coldest.
    pub(super) fn note_round_for_room(&self, device: &Device, done: &BatchStats) {
        if done.written > 0 {
            device.tier.set_promote_age(self.youngest_written);
            device
                .tier
                .promote_clock
                .since
                .store(u64::from(device.now()) + 1, Ordering::Relaxed);
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

    /// A promoted page was read from the pool (the first read since its promotion): a hit,
    /// its bet paid back twice.
    pub(in crate::device) fn note_promoted_read(&self) {
        self.counters.promote_hits.fetch_add(1, Ordering::Relaxed);
        self.first_read.add(2);
    }

    /// A promoted page was written back again before any read from the pool: a miss (its bet
    /// is lost).
    pub(in crate::device) fn note_promote_miss(&self) {
        self.counters.promote_misses.fetch_add(1, Ordering::Relaxed);
    }

    /// A written-back page read again within this many seconds of its last read is brought
    /// back into the pool (0: never, `promote=0`): the idle age of the pool's coldest pages
    /// when the last round for room wrote back, and the seconds since, as those pages have
    /// gone on ageing. A pool that no round has pressed for a while keeps pages idle that long,
    /// and a page read twice within that is the hotter one; a fixed age would leave a hot set
    /// on the store that the kernel, keeping it in RAM between faults, reads from the device
    /// less often than the last round's age.
    pub(in crate::device) fn promote_age(&self, now: u32) -> u32 {
        let base = u32::try_from(self.counters.promote_age_secs.load(Ordering::Relaxed))
            .unwrap_or(u32::MAX);
        let since = self.promote_clock.since.load(Ordering::Relaxed);
        if base == 0 || since == 0 {
            return base;
        }
        let since = u32::try_from(since - 1).unwrap_or(u32::MAX);
        base.saturating_add(now.saturating_sub(since))
    }

    /// Sets the promote age to the idle age of the youngest pages a round wrote back for room
    /// (the pool's coldest; at least 2 s: 0 means off, and a read is judged a second after the
    /// last at the soonest), or to 0 with promotion off. Under the settings' lock, so that a
    /// change of `promote` meanwhile is not undone.
    pub(super) fn set_promote_age(&self, secs: u32) {
        let cfg = self.config.lock();
        let secs = if cfg.promote { secs.max(2) } else { 0 };
        self.counters
            .promote_age_secs
            .store(u64::from(secs), Ordering::Relaxed);
    }

    /// The `promote` setting changed (its caller holds the settings' lock): off sets the
    /// promote age to 0, on from off to [`COLD_AGE_START`] until the next round for room.
    pub(super) fn follow_promote_setting(&self, on: bool) {
        let age = &self.counters.promote_age_secs;
        if !on {
            age.store(0, Ordering::Relaxed);
        } else if age.load(Ordering::Relaxed) == 0 {
            age.store(u64::from(COLD_AGE_START), Ordering::Relaxed);
            self.promote_clock.since.store(0, Ordering::Relaxed);
        }
    }
}

impl Device {
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
        buf: &[u8],
        index: PageIndex,
        g: &mut slot::SlotGuard<'_>,
        mut s: SlotState,
        now: u32,
    ) {
        let age = now.saturating_sub(s.atime);
        let window = self.tier.promote_age(now);
        if !s.flags.contains(SlotFlags::READ_BACK) {
            if s.atime != 0 && !s.flags.contains(SlotFlags::ADOPTED) {
                self.tier.note_read_back(age);
            }
            if window > 0 && self.tier.first_read.take() {
                if self.promote(buf, index, g, &s, now) {
                    self.tier
                        .counters
                        .promoted_first
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                self.tier.first_read.refund();
            }
        } else if (1..window).contains(&age) && self.promote(buf, index, g, &s, now) {
            // A second-read promotion bets too: its hit or miss is evidence like any other.
            self.tier.first_read.add(-1);
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
        buf: &[u8],
        index: PageIndex,
        g: &mut slot::SlotGuard<'_>,
        s: &SlotState,
        now: u32,
    ) -> bool {
        let Ok(h) = self.pool.try_store(&buf[..usize::from(s.size)]) else {
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
        self.replace(index, g, stored);
        self.tier
            .counters
            .promoted_pages
            .fetch_add(1, Ordering::Relaxed);
        true
    }
}
