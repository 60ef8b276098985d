//! Automatic tiering: what zram leaves to one-shot manual triggers, done by a policy.
//!
//! - Pages not accessed for `recompress_after` are recompressed with the secondary algorithms.
//! - Pages not accessed for `writeback_after` are written back to the backing store.
//! - When the pool passes `high_watermark` percent of `mem_limit`, the coldest pages are written
//!   back until it is under `low_watermark`; likewise a slice of the coldest pages per tick when
//!   the host runs short (`MemAvailable` under `min_free` percent of `MemTotal`, or memory PSI
//!   `some avg10` at or above `psi`). Compaction follows each pass.
//! - Under host pressure with the pool at 9/10 of its `pool_share`, what swap writes next goes
//!   straight through to the backing store (`spill`, see [`spill`]): the kernel swaps out its
//!   least recently used pages, so the newest arrival is colder than what the pool holds. While
//!   it does, host pressure writes none of the pool's pages back for being above the share (see
//!   `Policy::host_want`).
//! - A write that finds no room (the limit, or no pool memory) evicts cold pages to the backing
//!   store and retries, instead of failing: a bounded batch, with buffers made when the I/O
//!   context was, on the I/O thread itself (see [`Tiering::evict`]); or, in hand-off mode (the
//!   daemon with a regular file as backing store, whose writes may wait on the filesystem's
//!   journal), by the policy thread while the write waits at most [`EVICT_WAIT`] (see
//!   [`Tiering::make_room`]).
//! - A budget of bytes per day (`budget`) caps everything the policy and eviction write, to
//!   spare flash; when it is spent, the device behaves as zram does at its limit (writes fail)
//!   until the budget refills.
//!
//! [`Policy::tick`] does one round; the daemon calls it every second from its `uzram-policy`
//! thread with [`Pressure::read`]'s figures. Tests call it with a fake clock
//! (`Device::advance_clock`, feature `testing`) and fake [`Pressure`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

mod budget;
mod config;
mod evict;
mod read_back;
mod spill;
mod stats;

use self::budget::Budget;
pub use self::config::{PolicyConfig, Pressure};
use self::stats::Counters;
pub use self::stats::PolicyStats;

use super::tier::Tiering;
use super::writeback::{BackingStore, Batch, BatchStats, WbBuffers, BATCH};
use super::{Device, IoContext, PageIndex, SlotFlags, SlotState, PAGE_SIZE};
use crate::{Error, RecompressRequest};

/// Longest a write waits for the policy thread to make room (hand-off mode) before it fails
/// with ENOMEM as zram's would (swap keeps the page and retries). A policy thread stuck in its
/// filesystem thus slows swap-out down but cannot stop it.
pub const EVICT_WAIT: Duration = Duration::from_secs(2);
/// After a wait timed out, how long further writes that find no room fail at once (unless
/// the policy makes progress first).
const EVICT_FAST_FAIL: Duration = Duration::from_millis(250);
/// Pages one eviction writes at most (one batch, one `pwrite`).
pub const EVICT_BATCH: usize = 32;
/// Slots one eviction looks at, from a clock hand that goes round the device.
const EVICT_SCAN: u64 = 16 * 1024;
/// Rounds of eviction one page's store may take before the write fails.
pub(super) const EVICT_TRIES: usize = 8;
/// Most object bytes one tick writes back (the policy yields between ticks).
const TICK_BYTES: u64 = 64 << 20;
/// Most pages one tick recompresses (a tick should not keep evictions waiting long).
const TICK_RECOMPRESS: u64 = 2 * 1024;
/// Seconds between the age scans (recompression, age writeback and the promote age's measure
/// look at every slot).
const AGE_SCAN_SECS: u32 = 10;
/// Histogram buckets of page age (log-scaled, see [`age_bucket`]).
const BUCKETS: usize = 136;
/// A written-back page read within this many seconds of its writeback is an early read: the
/// policy's mistake (`early_reads`).
pub(super) const EARLY_READ_SECS: u32 = 60;
/// The cold age host pressure starts with below `pool_share`, and its bounds.
const COLD_AGE_START: u32 = 60;
const COLD_AGE_MIN: u32 = 10;
const COLD_AGE_MAX: u32 = 3600;
/// Writebacks (or early reads) a cold-age adjustment waits for: less is no evidence.
const COLD_AGE_EVIDENCE: u64 = 32;

/// Room asked of the policy thread by writes that found none (hand-off mode).
#[derive(Debug, Default)]
struct Requests {
    /// Object sizes asked for (distinct; more are dropped, the round frees room anyway).
    sizes: [u16; 8],
    n: usize,
    /// Rounds that took the sizes asked so far; a request pushed now is taken by round
    /// `taken + 1`.
    taken: u64,
    /// The last round finished.
    done: u64,
    /// A write timed out waiting: until then, or until the policy makes progress, the next
    /// ones fail at once instead of each waiting.
    starved_until: Option<Instant>,
}

/// The policy's shared state, part of every [`Device`].
#[derive(Debug, Default)]
pub(super) struct Tier {
    config: Mutex<PolicyConfig>,
    budget: Mutex<Budget>,
    counters: Counters,
    /// The eviction clock hand.
    hand: AtomicU64,
    /// Writes hand eviction to the policy thread instead of doing it themselves.
    hand_off: AtomicBool,
    requests: Mutex<Requests>,
    /// The policy thread waits here for requests.
    wake: Condvar,
    /// Writes wait here for a round.
    served: Condvar,
    /// Pages queued to go straight through to the backing store.
    spill: spill::Spill,
    /// Whether a written-back page's first read brings it back.
    first_read: read_back::FirstRead,
}

impl Tier {
    /// Whether the budget allows writing back now; a refusal is counted in `budget_denied`.
    fn budget_allows(&self, now: u32) -> bool {
        let allowed = self.budget.lock().allows(now);
        if !allowed {
            self.counters.budget_denied.fetch_add(1, Ordering::Relaxed);
        }
        allowed
    }

    pub(super) fn new(config: PolicyConfig) -> Tier {
        let t = Tier {
            config: Mutex::new(config),
            ..Tier::default()
        };
        t.budget.lock().set(config.budget, 0);
        t.counters
            .cold_age_secs
            .store(u64::from(COLD_AGE_START), Ordering::Relaxed);
        // Until a round has written back for room, the policy's own idea of cold.
        t.set_promote_age(COLD_AGE_START);
        t
    }

    /// Pages written back so far, for every reason.
    fn written_back(&self) -> u64 {
        let c = &self.counters;
        [
            &c.age_wb_pages,
            &c.watermark_wb_pages,
            &c.host_wb_pages,
            &c.evicted_pages,
            &c.spilled_pages,
        ]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum()
    }
}

/// The age histogram's bucket of `age` seconds: exact below 4 s, then four buckets per doubling.
/// Grows with the age.
fn age_bucket(age: u32) -> usize {
    let a = u64::from(age) + 1;
    let l = a.ilog2();
    if l < 2 {
        a as usize
    } else {
        (l * 4 + ((a >> (l - 2)) & 3) as u32) as usize
    }
}

/// The stored bytes of the pages idle for at least `min_age` seconds at `now`, by
/// [`age_bucket`], and their sum.
fn stored_by_age(device: &Device, now: u32, min_age: u32) -> ([u64; BUCKETS], u64) {
    let mut hist = [0u64; BUCKETS];
    let mut total = 0u64;
    for (_, slot) in device.slots().iter() {
        let s = slot.peek();
        if s.flags.contains(SlotFlags::STORED) {
            let age = now.saturating_sub(s.atime);
            if age >= min_age {
                let bytes = device.pool_bytes_of(&s);
                hist[age_bucket(age).min(BUCKETS - 1)] += bytes;
                total += bytes;
            }
        }
    }
    (hist, total)
}

/// The youngest bucket of `hist` that the oldest `target` bytes reach into (bucket 0 when
/// they are fewer), and the bytes from it up.
fn coldest_cutoff(hist: &[u64; BUCKETS], target: u64) -> (usize, u64) {
    let mut sum = 0;
    let mut cutoff = 0;
    for b in (0..BUCKETS).rev() {
        sum += hist[b];
        cutoff = b;
        if sum >= target {
            break;
        }
    }
    (cutoff, sum)
}

/// The youngest age in bucket `b` of [`age_bucket`].
fn bucket_min_age(b: usize) -> u32 {
    let b = b as u32;
    if b < 8 {
        // 0 and 4..=7 are never a bucket.
        return b.min(4).saturating_sub(1);
    }
    let (l, q) = (u64::from(b / 4), u64::from(b % 4));
    u32::try_from(((4 + q) << (l - 2).min(40)) - 1).unwrap_or(u32::MAX)
}

/// Why a tick writes pages back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Age,
    Watermark,
    Host,
}

/// What one [`Policy::tick`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TickReport {
    /// Pages recompressed.
    pub recompressed: u64,
    /// Pages put in cold groups.
    pub grouped: u64,
    /// Pages written back (all reasons).
    pub written_back: u64,
    /// The tick wanted to write back but the budget said no.
    pub budget_denied: bool,
}

/// The policy thread's own state: its writeback buffers and when it last scanned.
pub struct Policy {
    /// Made at the first batch written back or eviction (see [`buffers`]): a device without a
    /// backing store never needs them, and the daemon's I/O heap would keep their 1.2 MiB
    /// committed ahead.
    bufs: Option<WbBuffers>,
    pages: Vec<PageIndex>,
    /// Recompression's candidate list, kept between rounds.
    candidates: Vec<(u16, u64)>,
    last_age_scan: Option<u32>,
    /// Early reads and pages written back when the cold age was last adjusted.
    seen_early: u64,
    seen_written: u64,
    /// Pages spilled since the pool was last compacted.
    spilled_since_compact: u64,
    /// The idle age of the youngest pages the last round of [`Policy::write_back_coldest`]
    /// would write (its cutoff bucket's least age).
    youngest_written: u32,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy::new()
    }
}

impl Policy {
    /// A policy with no rounds run yet. Its writeback buffers (about 1.2 MiB) are made when it
    /// first writes back or evicts, or by [`Policy::make_buffers`].
    pub fn new() -> Policy {
        Policy {
            bufs: None,
            pages: Vec::with_capacity(BATCH),
            candidates: Vec::new(),
            last_age_scan: None,
            seen_early: 0,
            seen_written: 0,
            spilled_since_compact: 0,
            youngest_written: 0,
        }
    }

    /// Makes the writeback buffers now, for a device with a backing store: a caller that keeps
    /// its memory resident (the daemon) makes them while memory is still there to make them.
    pub fn make_buffers(&mut self) {
        buffers(&mut self.bufs);
    }

    /// Waits up to `timeout` for writes that ask for room (hand-off mode), and serves them:
    /// evicts for each object size asked with the policy's buffers, then wakes the writers.
    /// Returns whether any asked.
    pub fn serve_evictions(&mut self, device: &Device, timeout: Duration) -> bool {
        {
            let tier = &device.tiering().policy;
            let mut r = tier.requests.lock();
            if r.n == 0 {
                let _ = tier.wake.wait_for(&mut r, timeout);
            }
        }
        let asked = evict::serve_pending(&mut self.bufs, device);
        // Between ticks, keep the margin under the limit too: the second between ticks is
        // long under a swap storm.
        self.relieve(device);
        self.drain_spill(device);
        asked
    }

    /// Above the high watermark of `mem_limit`, writes back the coldest pages until the pool
    /// is under the low one. Returns pages written back.
    fn relieve(&mut self, device: &Device) -> u64 {
        if device.backing().is_none() {
            return 0;
        }
        let cfg = *device.tiering().policy.config.lock();
        let Some(bytes) = watermark_excess(device, &cfg) else {
            return 0;
        };
        let now = device.now();
        if !device.tiering().policy.budget_allows(now) {
            return 0;
        }
        let done = self.write_back_coldest(device, bytes.min(TICK_BYTES), 0, now);
        self.note_round_for_room(device, &done);
        let c = &device.tiering().policy.counters;
        stats::count_written(&c.watermark_wb_pages, &c.watermark_wb_bytes, &done);
        if done.written > 0 {
            c.pages_compacted
                .fetch_add(device.compact(), Ordering::Relaxed);
            device.tiering().policy.progress();
        }
        done.written
    }

    /// The age scan's recompression: pages idle `after` seconds, in cold groups of neighbours
    /// first (where the `groups` setting is on), the rest one by one.
    fn recompress_idle(
        &mut self,
        device: &Device,
        ctx: &mut IoContext,
        after: u32,
        report: &mut TickReport,
    ) -> Result<(), Error> {
        if device.recomp_algorithms().is_empty() {
            return Ok(());
        }
        let counters = &device.tiering().policy.counters;
        let req = RecompressRequest {
            max_pages: Some(TICK_RECOMPRESS),
            ..RecompressRequest::default()
        };
        let s = device.recompress_older(ctx, &req, after, &mut self.candidates)?;
        let add = |c: &AtomicU64, n: u64| c.fetch_add(n, Ordering::Relaxed);
        add(&counters.recompressed_pages, s.recompressed);
        add(
            &counters.recompress_saved,
            s.bytes_before.saturating_sub(s.bytes_after),
        );
        add(&counters.group_saved, s.group_saved);
        add(&counters.pages_compacted, s.pages_compacted);
        report.recompressed = s.recompressed;
        report.grouped = s.grouped_pages;
        Ok(())
    }

    /// One round of the policy on `device`, with `ctx`'s codec streams and the host's
    /// `pressure`: recompression and writeback of idle pages (every few seconds), writeback of
    /// the coldest pages above the watermark or under host pressure (every tick).
    pub fn tick(
        &mut self,
        device: &Device,
        ctx: &mut IoContext,
        pressure: &Pressure,
    ) -> Result<TickReport, Error> {
        device.fit_context(ctx)?;
        let tier = &device.tiering().policy;
        let cfg = *tier.config.lock();
        let now = device.now();
        tier.counters.ticks.fetch_add(1, Ordering::Relaxed);
        let mut report = TickReport::default();
        let age_scan = self
            .last_age_scan
            .map_or(true, |t| now.saturating_sub(t) >= AGE_SCAN_SECS);
        if age_scan {
            self.last_age_scan = Some(now);
            self.measure_promote_age(device, now);
            if let Some(after) = cfg.recompress_after {
                self.recompress_idle(device, ctx, after, &mut report)?;
            }
            // Groups whose pages were mostly rewritten hold dead bytes, however they were made
            // (the policy, zram's `recompress`): what is left of them is stored singly.
            if device.split_sparse_groups(ctx)? > 0 {
                tier.counters
                    .pages_compacted
                    .fetch_add(device.compact(), Ordering::Relaxed);
            }
        }
        let Some(_) = device.backing() else {
            return Ok(report);
        };
        // How many stored bytes to move out, and why: the most pressing reason first.
        let used = device.pool().pages_used();
        let mut want: Option<(Reason, u64, u32)> =
            watermark_excess(device, &cfg).map(|bytes| (Reason::Watermark, bytes, 0));
        let host_short = pressure.mem_total > 0
            && cfg.min_free > 0
            && pressure.mem_available * 100 < pressure.mem_total * u64::from(cfg.min_free);
        let psi_high = matches!((cfg.psi, pressure.psi_some_avg10), (Some(t), Some(v)) if v >= t);
        let pressed = host_short || psi_high;
        let share = pressure.mem_total / 100 * u64::from(cfg.pool_share);
        tier.spill.decide(
            used * PAGE_SIZE as u64,
            (pressed && cfg.spill && cfg.pool_share > 0).then_some(share),
            cfg.evict,
        );
        if self.spilled_since_compact > 0 {
            self.spilled_since_compact = 0;
            tier.counters
                .pages_compacted
                .fetch_add(device.compact(), Ordering::Relaxed);
        }
        if want.is_none() && pressed && used > 0 {
            want = self.host_want(device, &cfg, pressure, used * PAGE_SIZE as u64);
        }
        if want.is_none() && age_scan {
            if let Some(after) = cfg.writeback_after {
                want = Some((Reason::Age, TICK_BYTES, after));
            }
        }
        let Some((reason, bytes, min_age)) = want else {
            return Ok(report);
        };
        if !tier.budget_allows(now) {
            report.budget_denied = true;
            return Ok(report);
        }
        let done = self.write_back_coldest(device, bytes.min(TICK_BYTES), min_age, now);
        if reason != Reason::Age {
            self.note_round_for_room(device, &done);
        }
        let (pages, bytes_c) = match reason {
            Reason::Age => (&tier.counters.age_wb_pages, &tier.counters.age_wb_bytes),
            Reason::Watermark => (
                &tier.counters.watermark_wb_pages,
                &tier.counters.watermark_wb_bytes,
            ),
            Reason::Host => (&tier.counters.host_wb_pages, &tier.counters.host_wb_bytes),
        };
        stats::count_written(pages, bytes_c, &done);
        report.written_back = done.written;
        if done.written > 0 {
            let freed = device.compact();
            tier.counters
                .pages_compacted
                .fetch_add(freed, Ordering::Relaxed);
            tier.progress();
        }
        Ok(report)
    }

    /// What host pressure asks of a tick, for a pool of `used` bytes: the pool keeps its share
    /// of RAM (`pool_share`), the compressed tier that relieves the pressure. Above the share,
    /// while spill is on and writes may evict, only what is past the ceiling (the share and a
    /// sixteenth: a pool that was larger when the pressure came), since what arrives goes
    /// through to the backing store and writes past the ceiling make room first. The page swap
    /// writes last is colder than any the pool holds (the kernel swaps out its least recently
    /// used), while the pool's least recently used pages are the ones a cyclic walk reads next:
    /// written back, they come back within a minute. Otherwise above the share the coldest
    /// pages go, down to 90 % of it (the gap keeps it from oscillating). Up to that bound, only
    /// pages idle for the cold age, and never below `share_floor` percent of the share (100:
    /// none). Either way at most a thirty-second of the pool per tick (at least 4 MiB), so
    /// pressure that lasts moves pages out steadily rather than the whole pool at once.
    fn host_want(
        &mut self,
        device: &Device,
        cfg: &PolicyConfig,
        pressure: &Pressure,
        used: u64,
    ) -> Option<(Reason, u64, u32)> {
        let slice = (used / 32).max(4 << 20);
        let share = pressure.mem_total / 100 * u64::from(cfg.pool_share);
        let cold_age = self.adapt_cold_age(&device.tiering().policy);
        // Spill on with its ceiling (writes may evict): the pool keeps its pages up to the
        // ceiling; those within it are judged by their age, as within the share.
        let keep = device
            .tiering()
            .policy
            .spill
            .keeping_to()
            .unwrap_or(share / 10 * 9);
        if used > share && used > keep {
            return Some((Reason::Host, (used - keep).min(slice), 0));
        }
        let floor = share / 100 * u64::from(cfg.share_floor.min(100));
        let room = used.saturating_sub(floor);
        (room > 0).then_some((Reason::Host, room.min(slice), cold_age))
    }

    /// The cold age, adjusted by what happened since the last adjustment: doubled when more
    /// than a tenth of the pages written back were read back early (the policy moved pages
    /// that were still in use), brought down by a quarter when none was. Waits for
    /// [`COLD_AGE_EVIDENCE`] writebacks or early reads before it judges.
    fn adapt_cold_age(&mut self, tier: &Tier) -> u32 {
        let gauge = &tier.counters.cold_age_secs;
        let mut age = u32::try_from(gauge.load(Ordering::Relaxed)).unwrap_or(COLD_AGE_MAX);
        let early = tier.counters.early_reads.load(Ordering::Relaxed);
        let written = tier.written_back();
        // Saturating: a `Policy` may be moved to another device, whose counters start lower.
        let (de, dw) = (
            early.saturating_sub(self.seen_early),
            written.saturating_sub(self.seen_written),
        );
        if de + dw >= COLD_AGE_EVIDENCE {
            if de * 10 > dw {
                age = age.saturating_mul(2);
            } else if de == 0 {
                age -= age / 4;
            }
            age = age.clamp(COLD_AGE_MIN, COLD_AGE_MAX);
            gauge.store(u64::from(age), Ordering::Relaxed);
            (self.seen_early, self.seen_written) = (early, written);
        }
        age
    }

    /// Writes back the coldest stored pages at least `min_age` seconds old, oldest buckets
    /// first, until `target` stored bytes have gone, the store is full, or the budget or
    /// zram's writeback limit says stop.
    fn write_back_coldest(
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
        // The cutoff bucket is the youngest one needed.
        let (hist, _) = stored_by_age(device, now, min_age);
        let (cutoff, sum) = coldest_cutoff(&hist, target);
        if sum == 0 {
            return total;
        }
        // Pages older than the cutoff bucket first, then the cutoff bucket: each pass stops as
        // soon as the target is met, so the coldest pages go first and no more than needed.
        for min_bucket in [cutoff + 1, cutoff] {
            if total.object_bytes >= target || min_bucket >= BUCKETS {
                continue;
            }
            let keep = |s: &SlotState| {
                s.flags.contains(SlotFlags::STORED) && {
                    let age = now.saturating_sub(s.atime);
                    age >= min_age && age_bucket(age).min(BUCKETS - 1) >= min_bucket
                }
            };
            if !self.write_back_pass(device, backing, target, now, &keep, &mut total) {
                break;
            }
        }
        self.youngest_written = bucket_min_age(cutoff).max(min_age);
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
                    batch_bytes += device.pool_bytes_of(&s);
                }
                i += 1;
            }
            if self.pages.is_empty() {
                break;
            }
            if !device.tiering().policy.budget_allows(now) {
                return false;
            }
            let allowed = backing.limit_allows(self.pages.len());
            if allowed == 0 {
                return false;
            }
            let b = device.tiering().write_batch(
                device,
                backing,
                &mut Batch::own(buffers(&mut self.bufs)),
                &self.pages[..allowed],
                keep,
                true,
            );
            device.tiering().policy.budget.lock().charge(b.bytes);
            self.pages.clear();
            // Writes waiting for room come first (hand-off mode).
            evict::serve_pending(&mut self.bufs, device);
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

/// Bytes above the low watermark when the pool is above the high watermark of `mem_limit`.
fn watermark_excess(device: &Device, cfg: &PolicyConfig) -> Option<u64> {
    let used = device.pool().pages_used();
    let limit = device.pool().stats().limit_pages;
    (limit > 0 && used * 100 > limit * u64::from(cfg.high_watermark)).then(|| {
        let target = limit * u64::from(cfg.low_watermark) / 100;
        used.saturating_sub(target) * PAGE_SIZE as u64
    })
}

/// The policy's writeback buffers, made on first use.
fn buffers(bufs: &mut Option<WbBuffers>) -> &mut WbBuffers {
    bufs.get_or_insert_with(|| WbBuffers::new(BATCH))
}

impl Tier {
    /// Records kept for reuse, taken over by writes, dropped unused (`writeback::reuse`).
    pub(in crate::device) fn count_kept(&self, n: u64) {
        self.counters.kept_pages.fetch_add(n, Ordering::Relaxed);
    }

    pub(in crate::device) fn count_reused(&self, n: u64) {
        self.counters.reused_pages.fetch_add(n, Ordering::Relaxed);
    }

    pub(in crate::device) fn count_kept_dropped(&self, n: u64) {
        self.counters.kept_dropped.fetch_add(n, Ordering::Relaxed);
    }

    /// The policy made room: writes that find none wait for it again.
    fn progress(&self) {
        self.requests.lock().starved_until = None;
    }
}

impl Tier {
    /// The settings ([`Device::policy`]).
    pub(in crate::device) fn config(&self) -> PolicyConfig {
        *self.config.lock()
    }

    /// What the policy and eviction have done ([`Device::policy_stats`]).
    pub(in crate::device) fn stats(&self) -> PolicyStats {
        self.counters.snapshot(self.budget.lock().left())
    }
}

impl Tiering {
    /// [`Device::set_policy`] on `dev`.
    pub(in crate::device) fn set_policy(&self, dev: &Device, text: &str) -> Result<(), Error> {
        let mut cfg = self.policy.config.lock();
        cfg.update(text)?;
        self.policy.budget.lock().set(cfg.budget, dev.now());
        // Under the settings' lock, so that two changes at once leave reuse as the last says.
        self.set_reuse(cfg.reuse);
        self.policy.follow_promote_setting(cfg.promote);
        Ok(())
    }
}

#[cfg(test)]
mod read_back_tests;
#[cfg(test)]
mod tests;
