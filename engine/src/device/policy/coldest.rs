//! Which stored pages go to the backing store when the policy writes back: the coldest, in two
//! queues. Pages swap has not read since they were stored go first, oldest first; pages it has
//! read go only when those are not enough. A page the kernel came back for is in use, and its
//! later reads hit the kernel's own copy (swap keeps the slot, so the page is dropped clean and
//! never written again), which this device never sees: its access time here ages while it is
//! hot. Ordering by age alone wrote such pages to the disk, and swap read them from there again
//! and again. The two queues are 2Q's, as in the kernel's own active and inactive lists: seen
//! once, and seen again. A read protects a page for the cold age (`cold_age_secs`), which the
//! policy's mistakes (early reads) lengthen: a page read once and then left alone for that long
//! is back in the first queue, so pages read long ago cannot hold the pool against new ones.

use std::sync::atomic::Ordering;

use super::{age_bucket, bucket_min_age, buffers, serve_pending, Policy, BUCKETS};
use crate::device::writeback::{BackingStore, BatchStats, BATCH};
use crate::device::{Device, PageIndex, SlotFlags, SlotState};

impl Policy {
    /// Writes back the coldest stored pages at least `min_age` seconds old, those swap has not
    /// read since they were stored first (see the module docs), each queue oldest buckets
    /// first, until `target` stored bytes have gone, the store is full, or the budget or zram's
    /// writeback limit says stop.
    pub(super) fn write_back_coldest(
        &mut self,
        device: &Device,
        target: u64,
        min_age: u32,
        now: u32,
    ) -> BatchStats {
        let mut total = BatchStats::default();
        let Some(backing) = device.backing() else {
            return total;
        };
        let protect = u32::try_from(device.tier.counters.cold_age_secs.load(Ordering::Relaxed))
            .unwrap_or(u32::MAX);
        // The queue of a stored page of age `age`: 1 if read since stored, within the cold age.
        let queue = |s: &SlotState, age: u32| s.flags.contains(SlotFlags::READ) && age < protect;
        // Histograms of stored bytes by age, one per queue (first, second).
        let mut hist = [[0u64; BUCKETS]; 2];
        for i in 0..device.pages() {
            let s = device.peek(PageIndex(i));
            if s.flags.contains(SlotFlags::STORED) {
                let age = now.saturating_sub(s.atime);
                if age >= min_age {
                    hist[usize::from(queue(&s, age))][age_bucket(age).min(BUCKETS - 1)] +=
                        u64::from(s.size);
                }
            }
        }
        for (q, hist) in hist.iter().enumerate() {
            if total.object_bytes >= target {
                break;
            }
            let read = q == 1;
            let left = target - total.object_bytes;
            let mut sum = 0;
            let mut cutoff = 0;
            for b in (0..BUCKETS).rev() {
                sum += hist[b];
                cutoff = b;
                if sum >= left {
                    break;
                }
            }
            if sum == 0 {
                continue;
            }
            // Pages older than the cutoff bucket first, then the cutoff bucket: each pass
            // stops as soon as the target is met, so the coldest pages go first and no more
            // than needed.
            let mut go_on = true;
            let before = total.written;
            for min_bucket in [cutoff + 1, cutoff] {
                if total.object_bytes >= target || min_bucket >= BUCKETS {
                    continue;
                }
                let keep = |s: &SlotState| {
                    let age = now.saturating_sub(s.atime);
                    s.flags.contains(SlotFlags::STORED)
                        && queue(s, age) == read
                        && age >= min_age
                        && age_bucket(age).min(BUCKETS - 1) >= min_bucket
                };
                if !self.write_back_pass(device, backing, target, now, &keep, &mut total) {
                    go_on = false;
                    break;
                }
            }
            self.youngest_written = bucket_min_age(cutoff).max(min_age);
            if read {
                device
                    .tier
                    .counters
                    .read_wb_pages
                    .fetch_add(total.written - before, Ordering::Relaxed);
            }
            if !go_on {
                break;
            }
        }
        total
    }

    /// One pass over the slots for [`Policy::write_back_coldest`]: batches of the pages `keep`
    /// accepts, until `total` reaches `target`. Returns false when writeback must stop (the
    /// store full, a write failed, the budget or the writeback limit spent).
    fn write_back_pass(
        &mut self,
        device: &Device,
        backing: &BackingStore,
        target: u64,
        now: u32,
        keep: &dyn Fn(&SlotState) -> bool,
        total: &mut BatchStats,
    ) -> bool {
        self.pages.clear();
        let mut i = 0;
        while i < device.pages() && total.object_bytes < target {
            // Fill a batch of candidates (no more than the target still needs), then write it.
            let mut batch_bytes = 0;
            while i < device.pages()
                && self.pages.len() < BATCH
                && total.object_bytes + batch_bytes < target
            {
                let s = device.peek(PageIndex(i));
                if keep(&s) {
                    self.pages.push(PageIndex(i));
                    batch_bytes += u64::from(s.size);
                }
                i += 1;
            }
            if self.pages.is_empty() {
                break;
            }
            if !device.tier.budget_allows(now) {
                return false;
            }
            let allowed = backing.limit_allows(self.pages.len());
            if allowed == 0 {
                return false;
            }
            let b = device.write_batch(
                backing,
                buffers(&mut self.bufs),
                &self.pages[..allowed],
                keep,
                true,
            );
            device.tier.budget.lock().charge(b.bytes);
            self.pages.clear();
            // Writes waiting for room come first (hand-off mode).
            serve_pending(&mut self.bufs, device);
            total.written += b.written;
            total.object_bytes += b.object_bytes;
            total.bytes += b.bytes;
            total.failed += b.failed;
            if b.full || b.failed > 0 {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{check_all, device};
    use super::super::COLD_AGE_START;
    use super::*;
    use crate::device::testutil::{noise_page, tempdir};
    use crate::device::PAGE_SIZE;
    use crate::Pressure;

    /// Whether page `i` of `d` is written back.
    fn wb(d: &Device, i: u64) -> bool {
        d.slot_state(PageIndex(i))
            .unwrap()
            .flags
            .contains(SlotFlags::WB)
    }

    #[test]
    fn pages_read_since_stored_go_after_unread_ones_for_the_cold_age() {
        let dir = tempdir("policy-2q");
        let d = device(
            &dir,
            4096,
            "recompress_after=off writeback_after=off min_free=0 psi=off evict=0",
        );
        d.set_mem_limit(Some(400 * PAGE_SIZE as u64));
        let mut ctx = d.context().unwrap();
        let mut policy = Policy::new();
        let mut model = Vec::new();
        let mut write = |d: &Device, ctx: &mut _, range: std::ops::Range<u64>| {
            for i in range {
                let p = noise_page(i);
                d.write(ctx, i * PAGE_SIZE as u64, &p).unwrap();
                model.push((i, p));
            }
        };
        // A (0..120) is written, then read 10 s later; B (1000..1120) written 10 s after
        // that: A's access time is older than B's, and A was read, B never.
        write(&d, &mut ctx, 0..120);
        d.advance_clock(10);
        let mut page = [0u8; PAGE_SIZE];
        for i in 0..120 {
            d.read(&mut ctx, i * PAGE_SIZE as u64, &mut page).unwrap();
        }
        d.advance_clock(10);
        write(&d, &mut ctx, 1000..1120);
        d.advance_clock(10);
        // C (2000..2150) takes the pool past the high watermark: 70 pages must go.
        write(&d, &mut ctx, 2000..2150);
        let r = policy.tick(&d, &mut ctx, &Pressure::none()).unwrap();
        assert!(r.written_back >= 70, "{r:?}");
        assert!(
            !(0..120).any(|i| wb(&d, i)),
            "a page read since stored stayed"
        );
        assert!((1000..1120).any(|i| wb(&d, i)), "an unread one went");
        assert_eq!(d.policy_stats().read_wb_pages, 0);
        // Past the cold age, a read protects no more: A, now the oldest, goes first.
        d.advance_clock(COLD_AGE_START);
        d.set_mem_limit(Some(300 * PAGE_SIZE as u64));
        let r = policy.tick(&d, &mut ctx, &Pressure::none()).unwrap();
        assert!(r.written_back > 0, "{r:?}");
        assert!((0..120).any(|i| wb(&d, i)), "A goes once its read is old");
        assert!(!(2000..2150).any(|i| wb(&d, i)), "the newest stay");
        assert_eq!(
            d.policy_stats().read_wb_pages,
            0,
            "A is in the first queue now"
        );
        check_all(&d, &mut ctx, &model);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn read_pages_go_when_unread_ones_are_not_enough() {
        let dir = tempdir("policy-2q-both");
        let d = device(
            &dir,
            4096,
            "recompress_after=off writeback_after=off min_free=0 psi=off evict=0",
        );
        d.set_mem_limit(Some(400 * PAGE_SIZE as u64));
        let mut ctx = d.context().unwrap();
        let mut policy = Policy::new();
        let model: Vec<(u64, [u8; PAGE_SIZE])> = (0..380).map(|i| (i, noise_page(i))).collect();
        for (i, p) in &model {
            d.write(&mut ctx, i * PAGE_SIZE as u64, p).unwrap();
        }
        // All but the last 20 are read: 60 pages must go, the 20 unread ones first.
        let mut page = [0u8; PAGE_SIZE];
        for i in 0..360 {
            d.read(&mut ctx, i * PAGE_SIZE as u64, &mut page).unwrap();
        }
        d.advance_clock(5);
        let r = policy.tick(&d, &mut ctx, &Pressure::none()).unwrap();
        assert!(r.written_back >= 60, "{r:?}");
        assert!((360..380).all(|i| wb(&d, i)), "every unread page went");
        let read_wb = d.policy_stats().read_wb_pages;
        assert_eq!(read_wb, r.written_back - 20);
        assert_eq!(
            (0..360).filter(|&i| wb(&d, i)).count() as u64,
            read_wb,
            "the rest from the read ones"
        );
        check_all(&d, &mut ctx, &model);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
