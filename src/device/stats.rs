//! What the device counts, and zram's formats for it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::slot::{SlotFlags, SlotState};

/// Running counters, updated as slots change.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Pages holding data (same-filled included): zram's `pages_stored`.
    pub pages_stored: AtomicU64,
    /// Pages with an object in the pool.
    pub stored_pages: AtomicU64,
    pub compr_data_size: AtomicU64,
    pub same_pages: AtomicU64,
    pub huge_pages: AtomicU64,
    pub huge_pages_since: AtomicU64,
    pub failed_reads: AtomicU64,
    pub failed_writes: AtomicU64,
    pub notify_free: AtomicU64,
    /// Pool frees that failed (would be a pool bug); kept visible rather than hidden.
    pub free_errors: AtomicU64,
}

impl Counters {
    fn apply(&self, s: &SlotState, add: bool) {
        let op = |c: &AtomicU64, n: u64| {
            if add {
                c.fetch_add(n, Ordering::Relaxed);
            } else {
                c.fetch_sub(n, Ordering::Relaxed);
            }
        };
        if s.is_empty() {
            return;
        }
        op(&self.pages_stored, 1);
        if s.flags.contains(SlotFlags::SAME) {
            op(&self.same_pages, 1);
        }
        if s.flags.contains(SlotFlags::STORED) {
            op(&self.stored_pages, 1);
            op(&self.compr_data_size, u64::from(s.size));
        }
        if s.flags.contains(SlotFlags::HUGE) {
            op(&self.huge_pages, 1);
            if add {
                self.huge_pages_since.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Counts a slot state that came into the table.
    pub fn add(&self, s: &SlotState) {
        self.apply(s, true);
    }

    /// Uncounts a slot state that left the table.
    pub fn remove(&self, s: &SlotState) {
        self.apply(s, false);
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
    /// Every byte of metadata outside the pool's pages: the slot table (16 B per page) and the
    /// pool's handle tables, back-pointers and records.
    pub table_bytes: u64,
    /// Pool memory really mapped (arenas), >= `mm.mem_used_total`.
    pub pool_mapped_bytes: u64,
    /// Pages with an object in the pool.
    pub stored_pages: u64,
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
