//! What the device counts, and zram's formats for it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam::utils::CachePadded;

use super::slot::{SlotFlags, SlotState};

/// Counter values summed over the shards.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Pages holding data (same-filled included): zram's `pages_stored`.
    pub pages_stored: u64,
    /// Pages with an object in the pool.
    pub stored_pages: u64,
    pub compr_data_size: u64,
    pub same_pages: u64,
    pub huge_pages: u64,
    pub huge_pages_since: u64,
    pub failed_reads: u64,
    pub failed_writes: u64,
    pub notify_free: u64,
    /// Pool frees that failed (would be a pool bug); kept visible rather than hidden.
    pub free_errors: u64,
    /// Pages whose data was freed because their user marked them freed (`FreedPages`).
    pub notice_freed: u64,
}

impl Totals {
    fn apply(&mut self, s: &SlotState, add: bool) {
        let op = |c: &mut u64, n: u64| {
            *c = if add {
                c.wrapping_add(n)
            } else {
                c.wrapping_sub(n)
            };
        };
        // Written-back pages have left RAM: zram counts them in bd_stat, not here.
        if s.is_empty() || s.flags.contains(SlotFlags::WB) {
            return;
        }
        op(&mut self.pages_stored, 1);
        if s.flags.contains(SlotFlags::SAME) {
            op(&mut self.same_pages, 1);
        }
        if s.flags.contains(SlotFlags::STORED) {
            op(&mut self.stored_pages, 1);
            op(&mut self.compr_data_size, u64::from(s.size));
        }
        if s.flags.contains(SlotFlags::HUGE) {
            op(&mut self.huge_pages, 1);
            if add {
                self.huge_pages_since += 1;
            }
        }
    }

    /// Counts a slot state (for recounting a table from scratch).
    pub fn add(&mut self, s: &SlotState) {
        self.apply(s, true);
    }
}

/// One shard: the same fields as [`Totals`], atomically updated.
#[derive(Debug, Default)]
struct Shard([AtomicU64; FIELDS]);

const FIELDS: usize = 11;

/// A counter of [`Counters`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Field {
    FailedReads = 6,
    FailedWrites = 7,
    NotifyFree = 8,
    FreeErrors = 9,
    NoticeFreed = 10,
}

/// Running counters, sharded so that I/O threads do not fight over one cache line. A page's
/// gauges always go to the same shard (see `gauge_shard`), so no shard sums below zero; event
/// counters go to the shard of the I/O context that saw the event.
#[derive(Debug)]
pub(crate) struct Counters {
    shards: Box<[CachePadded<Shard>]>,
}

impl Counters {
    /// Counters with `shards` shards (at least 1).
    pub fn new(shards: usize) -> Counters {
        Counters {
            shards: (0..shards.max(1))
                .map(|_| CachePadded::new(Shard::default()))
                .collect(),
        }
    }

    fn shard(&self, shard: usize) -> &Shard {
        &self.shards[shard % self.shards.len()]
    }

    fn apply(&self, shard: usize, s: &SlotState, add: bool) {
        let mut delta = Totals::default();
        delta.apply(s, add);
        let sh = self.shard(shard);
        let values = [
            delta.pages_stored,
            delta.stored_pages,
            delta.compr_data_size,
            delta.same_pages,
            delta.huge_pages,
            delta.huge_pages_since,
        ];
        for (counter, v) in sh.0.iter().zip(values) {
            if v != 0 {
                counter.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    /// Counts a slot state that came into the table.
    pub fn add(&self, shard: usize, s: &SlotState) {
        self.apply(shard, s, true);
    }

    /// Uncounts a slot state that left the table.
    pub fn remove(&self, shard: usize, s: &SlotState) {
        self.apply(shard, s, false);
    }

    /// Adds one to `field`.
    pub fn bump(&self, shard: usize, field: Field) {
        self.shard(shard).0[field as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The sums over all shards.
    pub fn totals(&self) -> Totals {
        let mut v = [0u64; FIELDS];
        for sh in self.shards.iter() {
            for (sum, c) in v.iter_mut().zip(sh.0.iter()) {
                *sum = sum.wrapping_add(c.load(Ordering::Relaxed));
            }
        }
        Totals {
            pages_stored: v[0],
            stored_pages: v[1],
            compr_data_size: v[2],
            same_pages: v[3],
            huge_pages: v[4],
            huge_pages_since: v[5],
            failed_reads: v[6],
            failed_writes: v[7],
            notify_free: v[8],
            free_errors: v[9],
            notice_freed: v[10],
        }
    }
}

/// zram's `mm_stat`, field for field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MmStat {
    /// Uncompressed bytes of the pages stored (same-filled included).
    pub orig_data_size: u64,
    /// Compressed bytes stored (huge pages count 4096).
    pub compr_data_size: u64,
    /// Pool pages in use, in bytes.
    pub mem_used_total: u64,
    /// The memory limit in bytes (0 = none).
    pub mem_limit: u64,
    /// Highest `mem_used_total` since creation or reset.
    pub mem_used_max: u64,
    /// Same-filled pages.
    pub same_pages: u64,
    /// Pool pages freed by compaction.
    pub pages_compacted: u64,
    /// Pages stored uncompressed.
    pub huge_pages: u64,
    /// Pages stored uncompressed since creation.
    pub huge_pages_since: u64,
}

impl fmt::Display for MmStat {
    /// The line zram prints: nine right-aligned columns of at least 8 characters.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
            self.orig_data_size,
            self.compr_data_size,
            self.mem_used_total,
            self.mem_limit,
            self.mem_used_max,
            self.same_pages,
            self.pages_compacted,
            self.huge_pages,
            self.huge_pages_since
        )
    }
}

/// zram's `io_stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoStat {
    /// Reads that failed.
    pub failed_reads: u64,
    /// Writes that failed.
    pub failed_writes: u64,
    /// Pages freed by discard.
    pub notify_free: u64,
}

impl fmt::Display for IoStat {
    /// The line Linux 6.12 prints: the third column (`invalid_io`) is always a literal 0.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:>8} {:>8} 0 {:>8}",
            self.failed_reads, self.failed_writes, self.notify_free
        )
    }
}

/// All of a device's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// zram's `mm_stat`.
    pub mm: MmStat,
    /// zram's `io_stat`.
    pub io: IoStat,
    /// Every byte of metadata outside the pool's pages: the slot table (16 B per page in the
    /// leaves written, 1 MiB of the device a leaf, and 16 B a leaf of directory) and the pool's
    /// handle tables, back-pointers and records.
    pub table_bytes: u64,
    /// Pool memory really mapped (arenas), >= `mm.mem_used_total`.
    pub pool_mapped_bytes: u64,
    /// Of `pool_mapped_bytes`, the empty arenas kept for the next writes.
    pub pool_reserved_bytes: u64,
    /// What the reserve is kept at now (it follows demand with `Growth::Reserve`).
    pub pool_reserve_target_bytes: u64,
    /// Pages with an object in the pool.
    pub stored_pages: u64,
    /// Pages whose data was freed because their user marked them freed (swap's freed slots,
    /// through [`FreedPages`](super::FreedPages)), as zram frees on `swap_slot_free_notify`.
    pub notice_freed_pages: u64,
    /// Cold groups: neighbouring idle pages compressed together.
    pub groups: GroupFigures,
}

/// What a device's cold groups hold and have done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupFigures {
    /// Groups live now.
    pub live: u64,
    /// Pages held in them (members still holding their page).
    pub pages: u64,
    /// Their frames' bytes (in `compr_data_size`).
    pub bytes: u64,
    /// Groups made since the device was created.
    pub made: u64,
    /// Reads that decompressed a group.
    pub decompressions: u64,
    /// Groups split back into single pages.
    pub split: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mm_stat_matches_zram_layout() {
        let m = MmStat {
            orig_data_size: 1_234_567_890,
            compr_data_size: 4096,
            mem_used_total: 8192,
            mem_limit: 0,
            mem_used_max: 8192,
            same_pages: 3,
            pages_compacted: 0,
            huge_pages: 1,
            huge_pages_since: 2,
        };
        assert_eq!(
            m.to_string(),
            "1234567890     4096     8192        0     8192        3        0        1        2\n"
        );
    }

    #[test]
    fn io_stat_matches_linux_6_12() {
        let io = IoStat {
            failed_reads: 1,
            failed_writes: 22,
            notify_free: 333,
        };
        assert_eq!(io.to_string(), "       1       22 0      333\n");
    }
}
