//! What the policy has done, counted: uzram's `policy_stat`. One table below defines each
//! counter, its snapshot field and its `policy_stat` key.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Defines the live counters ([`Counters`]), their snapshot ([`PolicyStats`]) and the
/// `policy_stat` rows from one list of `field => "key"` with the field's doc.
macro_rules! policy_counters {
    ($($(#[doc = $doc:literal])+ $field:ident => $key:literal,)+) => {
        /// What the policy has done, counted (uzram's `policy_stat`).
        #[derive(Debug, Default)]
        pub(super) struct Counters {
            $(pub(super) $field: AtomicU64,)+
        }

        /// A snapshot of the policy's counters.
        #[derive(Debug, Clone, Default, PartialEq, Eq)]
        pub struct PolicyStats {
            $($(#[doc = $doc])+ pub $field: u64,)+
            /// Bytes the budget has left (`None`: no budget).
            pub budget_left: Option<u64>,
        }

        impl Counters {
            /// The counters now, with the budget's figure.
            pub(super) fn snapshot(&self, budget_left: Option<u64>) -> PolicyStats {
                PolicyStats {
                    $($field: self.$field.load(Ordering::Relaxed),)+
                    budget_left,
                }
            }
        }

        impl PolicyStats {
            /// `policy_stat`'s counter rows, in order: key and value.
            fn rows(&self) -> impl Iterator<Item = (&'static str, u64)> {
                [$(($key, self.$field),)+].into_iter()
            }
        }
    };
}

policy_counters! {
    /// Rounds of the policy.
    ticks => "ticks",
    /// Pages recompressed because they were idle.
    recompressed_pages => "recompressed_pages",
    /// Bytes recompression saved.
    recompress_saved => "recompress_saved_bytes",
    /// Pages written back because they were idle (`writeback_after`).
    age_wb_pages => "age_writeback_pages",
    /// Their stored bytes.
    age_wb_bytes => "age_writeback_bytes",
    /// Pages written back because the pool passed the high watermark of `mem_limit`.
    watermark_wb_pages => "watermark_writeback_pages",
    /// Their stored bytes.
    watermark_wb_bytes => "watermark_writeback_bytes",
    /// Pages written back because the host was short of memory.
    host_wb_pages => "host_writeback_pages",
    /// Their stored bytes.
    host_wb_bytes => "host_writeback_bytes",
    /// Writes that found no room and evicted pages.
    evictions => "evictions",
    /// Pages those evictions wrote back.
    evicted_pages => "evicted_pages",
    /// Their stored bytes.
    evicted_bytes => "evicted_bytes",
    /// Pages swap wrote while the pool was at its share, stored straight through to the
    /// backing store (`spill`).
    spilled_pages => "spill_pages",
    /// Their stored bytes.
    spilled_bytes => "spill_bytes",
    /// Writes that failed although eviction was tried.
    evict_failed => "evict_failed",
    /// Of those, waits for the policy thread that timed out (hand-off mode).
    evict_timeouts => "evict_timeouts",
    /// And writes that failed at once because a wait had just timed out.
    evict_fast_fails => "evict_fast_fails",
    /// Writebacks the budget (or zram's spent `writeback_limit`) held back.
    budget_denied => "budget_denied",
    /// Records kept after swap read their page back and freed it (`reuse`), for the page's
    /// next swap-out to take over instead of writing it again.
    kept_pages => "reuse_kept_pages",
    /// Whole-page writes that took a kept record over: pages not written to the backing
    /// store a second time.
    reused_pages => "reuse_pages",
    /// Kept records dropped unused (the oldest of a full bucket, or the store needed the room).
    kept_dropped => "reuse_dropped_pages",
    /// Pool pages the policy's compaction freed.
    pages_compacted => "pages_compacted",
    /// Written-back pages read within `EARLY_READ_SECS` of their writeback: the policy's
    /// mistakes, each counted once.
    early_reads => "early_reads",
    /// A gauge, not a counter: the idle age host pressure writes back at below `pool_share`,
    /// which the early reads push up and a clean round brings down.
    cold_age_secs => "cold_age_secs",
    /// Written-back pages read a second time since their writeback, sooner than the pool's
    /// coldest pages had gone untouched, and so brought back into the pool.
    promoted_pages => "promoted_pages",
    /// A gauge: how long the pool's coldest pages have gone untouched (the idle age of the
    /// youngest pages the last round for room wrote back, or of the youngest of the pool's
    /// coldest quarter at the last age scan); a written-back page read again within it is
    /// promoted.
    promote_age_secs => "promote_age_secs",
    /// Of the promoted pages, those brought back on their first read since their writeback,
    /// while promotions were paying.
    promoted_first => "promoted_first_pages",
    /// Promoted pages read again from the pool within the promote age: promotions that paid.
    promote_hits => "promote_hits",
    /// Promoted pages read again later than that, or written back again unread.
    promote_misses => "promote_misses",
    /// Cold groups made on the device (by the policy or zram's `recompress`).
    groups_made => "groups_made",
    /// A gauge: pages held in cold groups now.
    grouped_pages => "grouped_pages",
    /// Pool bytes the policy's groups took less than their pages had alone, when made.
    group_saved => "group_saved_bytes",
    /// Reads that decompressed a group (a neighbour read next from the I/O thread's copy is
    /// not one).
    group_reads => "group_reads",
    /// Groups split back into single pages once fewer than half their pages were left.
    groups_split => "groups_split",
}

/// Adds what a batch (or a pass of batches) wrote back to a pair of counters: its pages and
/// their stored bytes.
pub(super) fn count_written(
    pages: &AtomicU64,
    bytes: &AtomicU64,
    b: &crate::device::writeback::BatchStats,
) {
    pages.fetch_add(b.written, Ordering::Relaxed);
    bytes.fetch_add(b.object_bytes, Ordering::Relaxed);
}

impl fmt::Display for PolicyStats {
    /// One `key value` per line, as `uzram_stat`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, v) in self.rows() {
            writeln!(f, "{k} {v}")?;
        }
        match self.budget_left {
            Some(b) => writeln!(f, "budget_left_bytes {b}"),
            None => writeln!(f, "budget_left_bytes off"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_stat_prints_every_counter_once_in_order_then_the_budget() {
        let c = Counters::default();
        c.evictions.store(7, Ordering::Relaxed);
        c.pages_compacted.store(3, Ordering::Relaxed);
        let text = c.snapshot(Some(42)).to_string();
        let keys: Vec<&str> = text.lines().map(|l| l.split(' ').next().unwrap()).collect();
        assert_eq!(keys.len(), 35);
        assert_eq!(keys.first(), Some(&"ticks"));
        assert_eq!(
            keys[21..],
            [
                "pages_compacted",
                "early_reads",
                "cold_age_secs",
                "promoted_pages",
                "promote_age_secs",
                "promoted_first_pages",
                "promote_hits",
                "promote_misses",
                "groups_made",
                "grouped_pages",
                "group_saved_bytes",
                "group_reads",
                "groups_split",
                "budget_left_bytes"
            ]
        );
        assert!(text.contains("\nevictions 7\n"), "{text}");
        assert!(text.contains("\npages_compacted 3\n"), "{text}");
        assert!(text.ends_with("budget_left_bytes 42\n"), "{text}");
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "a key twice: {text}");
        assert!(Counters::default()
            .snapshot(None)
            .to_string()
            .ends_with("budget_left_bytes off\n"));
    }
}
