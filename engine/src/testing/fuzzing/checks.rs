//! The harness's slow paths (writeback, recompression) and its whole-device checks (every
//! page, every slot, every counter).

use std::collections::HashMap;

use super::harness::{Harness, Span, Stored};
use super::DEVICE_PAGES;
use crate::{PageIndex, SlotFlags, SlotState, PAGE_SIZE};

impl Harness {
    /// Writes back pages `first..first + n` (clamped to the device) and checks the model: every
    /// stored page of the range is on the backing file afterwards, with its stored size (a
    /// grouped page's alone), unless the writes fail, when every page stays as it was.
    pub(super) fn writeback(&mut self, first: u8, n: u8, fail: bool) {
        let step = self.step;
        let first = u64::from(first) % DEVICE_PAGES;
        let last = (first + u64::from(n.max(1)) - 1).min(DEVICE_PAGES - 1);
        let backing = self
            .device
            .backing()
            .expect("the harness device has a backing file");
        backing.set_fail_writes(fail);
        let stats = self
            .device
            .writeback(
                &mut self.ctxs[self.current],
                crate::device::writeback::WritebackRequest::Pages { first, last },
            )
            .expect("writeback");
        backing.set_fail_writes(false);
        let threshold = self.device.huge_threshold();
        let (mut expected, mut grouped) = (0, 0);
        for i in first..=last {
            let index = PageIndex(i);
            // Marked freed: not written back (it is freed on the next reclaim).
            if self.marked.contains(&index) {
                continue;
            }
            let Some(page) = self.pages.get_mut(&index) else {
                continue;
            };
            let len = match page.stored {
                Stored::Compressed(n) => n,
                Stored::Huge => PAGE_SIZE,
                // Out of its group, compressed alone with its group's codec (the secondary;
                // raw from the huge threshold on).
                Stored::Grouped => {
                    grouped += 1;
                    let n = self
                        .sizer2
                        .compress(&page.data, &mut self.scratch)
                        .expect("a page compresses into MAX_COMPRESSED_LEN");
                    if n < threshold {
                        n
                    } else {
                        PAGE_SIZE
                    }
                }
                _ => continue,
            };
            expected += 1;
            if !fail {
                page.stored = Stored::Backing(len);
            }
        }
        if fail {
            assert_eq!(
                (stats.written, stats.failed),
                (0, expected),
                "step {step}: {stats:?}"
            );
        } else {
            assert_eq!(
                (stats.written, stats.failed),
                (expected, 0),
                "step {step}: {stats:?}"
            );
            self.tally.written_back_pages += expected;
            self.tally.grouped_written_back += grouped;
        }
        self.check_all();
    }

    /// Recompresses, then checks every page against the model: a page the pass could take
    /// (stored, never tried, huge when only huge ones are asked for) is recompressed exactly
    /// when the secondary codec's size lands in a smaller size class (or, with a memory limit,
    /// stays as it was), and then holds exactly that many bytes.
    pub(super) fn recompress(&mut self, huge_only: bool) {
        let step = self.step;
        let before = self.slot_states();
        let req = crate::RecompressRequest {
            kind: huge_only.then_some(crate::RecompressType::Huge),
            ..Default::default()
        };
        let stats = self
            .device
            .recompress(&mut self.ctxs[self.current], &req)
            .expect("recompress");
        let pool = self.device.pool();
        let class = |n: usize| pool.class_size(n).expect("a class");
        let threshold = self.device.huge_threshold();
        let mut recompressed = 0;
        let indexes: Vec<PageIndex> = self.pages.keys().copied().collect();
        for index in indexes {
            let page = self.pages.get(&index).expect("listed");
            let old = before[&index];
            let now = self.device.slot_state(index).expect("in range");
            let len = match page.stored {
                Stored::Same(_) => {
                    assert_eq!(
                        now, old,
                        "step {step}: page {index}: same-filled page changed"
                    );
                    continue;
                }
                Stored::Backing(_) => {
                    assert_eq!(
                        now, old,
                        "step {step}: page {index}: written-back page changed"
                    );
                    continue;
                }
                Stored::Grouped => {
                    assert_eq!(now, old, "step {step}: page {index}: grouped page changed");
                    continue;
                }
                Stored::Compressed(n) => n,
                Stored::Huge => PAGE_SIZE,
            };
            let candidate = old.prio == 0
                && !old.flags.contains(SlotFlags::INCOMPRESSIBLE)
                && (!huge_only || page.stored == Stored::Huge);
            let n2 = self
                .sizer2
                .compress(&page.data, &mut self.scratch)
                .expect("a page compresses into MAX_COMPRESSED_LEN");
            let shrinks = n2 < threshold && class(n2) < class(len);
            if now.prio == 1 && old.prio == 0 {
                assert!(
                    candidate && shrinks,
                    "step {step}: page {index} recompressed: {old:?} -> {now:?}"
                );
                assert_eq!(
                    usize::from(now.size),
                    n2,
                    "step {step}: page {index}: recompressed size"
                );
                recompressed += 1;
                self.pages.get_mut(&index).expect("listed").stored = Stored::Compressed(n2);
            } else {
                assert_eq!(now.prio, old.prio, "step {step}: page {index}");
                assert!(
                    !(candidate && shrinks) || self.limit_pages > 0,
                    "step {step}: page {index} ({len} -> {n2} bytes) was not recompressed: {now:?}"
                );
                if candidate && !shrinks {
                    assert!(
                        now.flags.contains(SlotFlags::INCOMPRESSIBLE),
                        "step {step}: page {index} no codec shrinks is not marked: {now:?}"
                    );
                }
            }
        }
        assert_eq!(stats.recompressed, recompressed, "step {step}: {stats:?}");
        self.tally.recompressed_pages += recompressed;
        self.check_all();
    }

    /// Groups (or splits groups), then checks every page against the model: a page is grouped
    /// only if it was stored compressed on its own and marked idle, and then holds no bytes of
    /// its own; a page split out of its group holds what the secondary codec makes of it alone
    /// (raw if that is not below the huge threshold); every other page is as it was.
    pub(super) fn group(&mut self, max: u8, split: bool) {
        let step = self.step;
        let before = self.slot_states();
        let ctx = &mut self.ctxs[self.current];
        let grouped = if split {
            self.device.split_sparse_groups(ctx).expect("split");
            0
        } else {
            let pass = self.device.make_groups(ctx, 1, usize::from(max % 17));
            pass.expect("make_groups").pages
        };
        let threshold = self.device.huge_threshold();
        let mut now_grouped = 0;
        for (&index, page) in self.pages.iter_mut() {
            let (old, now) = (
                before[&index],
                self.device.slot_state(index).expect("in range"),
            );
            if now == old {
                continue;
            }
            if now.is_grouped() {
                assert!(
                    !split
                        && matches!(page.stored, Stored::Compressed(_))
                        && old.flags.contains(SlotFlags::IDLE),
                    "step {step}: page {index} grouped: {old:?} -> {now:?}"
                );
                now_grouped += 1;
                self.tally.grouped_pages += 1;
                page.stored = Stored::Grouped;
            } else {
                assert!(
                    split && page.stored == Stored::Grouped,
                    "step {step}: page {index} changed: {old:?} -> {now:?}"
                );
                let n = self
                    .sizer2
                    .compress(&page.data, &mut self.scratch)
                    .expect("a page compresses into MAX_COMPRESSED_LEN");
                self.tally.split_pages += 1;
                page.stored = if n < threshold {
                    Stored::Compressed(n)
                } else {
                    // Stored raw: one more huge page since the device was made.
                    self.huge_pages_since += 1;
                    self.tally.huge_pages += 1;
                    Stored::Huge
                };
            }
        }
        assert_eq!(now_grouped, grouped, "step {step}: pages grouped");
        self.check_all();
    }

    /// The slot of every page the model holds, as it is now.
    fn slot_states(&self) -> HashMap<PageIndex, SlotState> {
        self.pages
            .keys()
            .map(|&i| (i, self.device.slot_state(i).expect("in range")))
            .collect()
    }

    /// Compares every figure of [`Device::stats`] with the model.
    pub(super) fn check_stats(&mut self) {
        let s = self.device.stats();
        let step = self.step;
        let mut same = 0;
        let mut huge = 0;
        let mut stored = 0;
        let mut compr = 0;
        let mut written_back = 0u64;
        for p in self.pages.values() {
            match p.stored {
                Stored::Same(_) => same += 1,
                Stored::Compressed(n) => {
                    stored += 1;
                    compr += n as u64;
                }
                Stored::Huge => {
                    stored += 1;
                    huge += 1;
                    compr += PAGE_SIZE as u64;
                }
                // Off RAM: counted in bd_stat, not in mm_stat (zram's rule).
                Stored::Backing(_) => written_back += 1,
                // Its bytes are its group's, counted once for all its members (below).
                Stored::Grouped => stored += 1,
            }
        }
        let mm = &s.mm;
        let want = (
            (self.pages.len() as u64 - written_back) * PAGE_SIZE as u64,
            compr + s.groups.bytes,
            same,
            huge,
            self.huge_pages_since,
            stored,
            self.limit_pages * PAGE_SIZE as u64,
        );
        let got = (
            mm.orig_data_size,
            mm.compr_data_size,
            mm.same_pages,
            mm.huge_pages,
            mm.huge_pages_since,
            s.stored_pages,
            mm.mem_limit,
        );
        assert_eq!(
            got, want,
            "step {step}: (orig_data_size, compr_data_size, same_pages, huge_pages, \
             huge_pages_since, stored_pages, mem_limit)"
        );
        assert_eq!(s.io, self.io, "step {step}: io_stat");
        let last = &self.last.mm;
        assert!(
            mm.mem_used_max >= mm.mem_used_total && mm.mem_used_max >= last.mem_used_max,
            "step {step}: mem_used_max {} (was {}) below mem_used_total {}",
            mm.mem_used_max,
            last.mem_used_max,
            mm.mem_used_total
        );
        assert!(
            mm.pages_compacted >= last.pages_compacted,
            "step {step}: pages_compacted went down"
        );
        if mm.mem_limit != 0 && mm.mem_used_total > last.mem_used_total {
            assert!(
                mm.mem_used_total <= mm.mem_limit,
                "step {step}: pool grew to {} past the limit {}",
                mm.mem_used_total,
                mm.mem_limit
            );
        }
        assert!(
            mm.compr_data_size <= mm.mem_used_total,
            "step {step}: {} compressed bytes in {} bytes of pool",
            mm.compr_data_size,
            mm.mem_used_total
        );
        if stored == 0 {
            assert_eq!(
                mm.mem_used_total, 0,
                "step {step}: an empty pool holds pages"
            );
        }
        assert!(s.pool_mapped_bytes >= mm.mem_used_total);
        // Every page the model holds was written, so its leaf of the slot table is there (and
        // stays): each such leaf is counted, 4 KiB, and so is the table's directory.
        let leaves: std::collections::HashSet<u64> = self.pages.keys().map(|p| p.0 / 256).collect();
        let directory = DEVICE_PAGES.div_ceil(256) * 16;
        assert!(
            s.table_bytes >= leaves.len() as u64 * 4096 + directory,
            "step {step}: the slot table's {} leaves are not all counted in {} bytes",
            leaves.len(),
            s.table_bytes
        );
        self.last = s;
    }

    /// Reads back every page, one by one and in one request; checks slots and invariants.
    pub(super) fn check_all(&mut self) {
        if let Err(e) = self.device.check_invariants() {
            panic!("step {}: invariants: {e}", self.step);
        }
        for i in 0..DEVICE_PAGES {
            self.check_page(PageIndex(i));
        }
        self.read(Span {
            offset: 0,
            len_bytes: self.device.disksize(),
        });
    }
}

/// Checks a slot against how the model says its page is stored (None: empty).
pub(super) fn check_slot(s: SlotState, want: Option<Stored>) -> Result<(), String> {
    let ok = match want {
        None => s.is_empty(),
        Some(Stored::Same(word)) => s.flags.contains(SlotFlags::SAME) && s.word == word,
        Some(Stored::Compressed(n)) => {
            s.flags.contains(SlotFlags::STORED)
                && !s.flags.intersects(SlotFlags::SAME | SlotFlags::HUGE)
                && usize::from(s.size) == n
        }
        Some(Stored::Huge) => {
            s.flags.contains(SlotFlags::STORED | SlotFlags::HUGE)
                && usize::from(s.size) == PAGE_SIZE
        }
        Some(Stored::Grouped) => s.is_grouped() && s.size == 0,
        Some(Stored::Backing(n)) => {
            s.flags.contains(SlotFlags::WB)
                && !s.flags.intersects(SlotFlags::STORED | SlotFlags::SAME)
                && usize::from(s.size) == n
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!("slot {s:?}, model {want:?}"))
    }
}
