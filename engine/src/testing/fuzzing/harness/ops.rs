//! The harness's operations: each request applied to the device and to the model, and the
//! results compared.

use super::*;

impl Harness {
    pub(in crate::testing::fuzzing) fn write(&mut self, r: Span, buf: &[u8]) {
        if span_error(r, self.device.disksize()).is_some() {
            let slots = self.slots();
            let ctx = &mut self.ctxs[self.current];
            let got = self.device.write(ctx, r.offset, buf);
            self.io.failed_writes += 1;
            return self.refused(r, got, &slots, "write");
        }
        let mut plan = Vec::new();
        let mut done = 0;
        for (index, in_page, n) in r.pieces() {
            let mut data = self.data(index);
            data[in_page..in_page + n].copy_from_slice(&buf[done..done + n]);
            done += n;
            plan.push((index, Some(self.page(data))));
        }
        let first_must_fail = self.first_must_fail(&plan);
        let ctx = &mut self.ctxs[self.current];
        let got = self.device.write(ctx, r.offset, buf);
        self.settle("write", r, got, plan, first_must_fail);
    }

    pub(in crate::testing::fuzzing) fn discard(&mut self, r: Span) {
        let slots = self.slots();
        let got = self.device.discard(r.offset, r.len_bytes);
        if span_error(r, self.device.disksize()).is_some() {
            return self.refused(r, got, &slots, "discard");
        }
        got.unwrap_or_else(|e| panic!("step {}: discard {r:?}: {e}", self.step));
        for (index, _, n) in r.pieces() {
            if n == PAGE_SIZE {
                // zram counts every whole page discarded, held data or not.
                self.io.notify_free += 1;
                if self.pages.remove(&index).is_some() {
                    self.tally.freed_pages += 1;
                }
            }
        }
        self.check_pages(r);
    }

    pub(in crate::testing::fuzzing) fn write_zeroes(&mut self, r: Span) {
        if span_error(r, self.device.disksize()).is_some() {
            let slots = self.slots();
            let ctx = &mut self.ctxs[self.current];
            let got = self.device.write_zeroes(ctx, r.offset, r.len_bytes);
            return self.refused(r, got, &slots, "write_zeroes");
        }
        let mut plan = Vec::new();
        for (index, in_page, n) in r.pieces() {
            let page = if n == PAGE_SIZE {
                None
            } else {
                let mut data = self.data(index);
                data[in_page..in_page + n].fill(0);
                Some(self.page(data))
            };
            plan.push((index, page));
        }
        let first_must_fail = self.first_must_fail(&plan);
        let ctx = &mut self.ctxs[self.current];
        let got = self.device.write_zeroes(ctx, r.offset, r.len_bytes);
        self.settle("write_zeroes", r, got, plan, first_must_fail);
    }

    /// [`Device::reclaim_freed`]: every marked page is freed and counted.
    pub(in crate::testing::fuzzing) fn reclaim_freed(&mut self) {
        let before = self.device.stats().notice_freed_pages;
        let taken = self.device.reclaim_freed();
        assert_eq!(
            taken,
            self.marked.len() as u64,
            "step {}: marks taken by reclaim_freed",
            self.step
        );
        let mut freed = 0;
        for index in std::mem::take(&mut self.marked) {
            self.io.notify_free += 1;
            if self.pages.remove(&index).is_some() {
                freed += 1;
            }
            self.check_page(index);
        }
        assert_eq!(
            self.device.stats().notice_freed_pages - before,
            freed,
            "step {}: pages whose data reclaim_freed freed",
            self.step
        );
        self.tally.notice_freed_pages += freed;
    }

    pub(in crate::testing::fuzzing) fn compact(&mut self) {
        let before = self.device.stats();
        let freed = self.device.compact();
        let after = self.device.stats();
        assert_eq!(
            after.mm.pages_compacted,
            before.mm.pages_compacted + freed,
            "pages_compacted counts what compact() freed"
        );
        assert_eq!(
            after.mm.mem_used_total,
            before.mm.mem_used_total - freed * PAGE_SIZE as u64,
            "compaction frees the pages it reports"
        );
        self.tally.compacted_pages += freed;
        self.check_all();
    }

    /// Applies one operation and checks it.
    pub(in crate::testing::fuzzing) fn apply(&mut self, op: DeviceOp) {
        match op {
            DeviceOp::Write {
                sector,
                sectors,
                kind,
                seed,
            } => {
                let r = Span::sectors(sector, sectors);
                self.write(r, &kind.content(seed, r.len_bytes as usize));
            }
            DeviceOp::Read { sector, sectors } => {
                // Each read request a second after the last: a page is judged by its next read
                // in a later second (promotion), not by the rest of the same read.
                self.device.advance_clock(1);
                self.read(Span::sectors(sector, sectors));
            }
            DeviceOp::Discard { sector, sectors } => {
                self.discard(Span::sectors(sector, sectors));
            }
            DeviceOp::WriteZeroes { sector, sectors } => {
                self.write_zeroes(Span::sectors(sector, sectors));
            }
            DeviceOp::Wild {
                op,
                offset,
                len_bytes,
            } => {
                let r = Span {
                    offset,
                    len_bytes: u64::from(len_bytes),
                };
                match op {
                    WildOp::Read => self.read(r),
                    WildOp::Write => {
                        self.write(r, &PageKind::Noise.content(0, usize::from(len_bytes)));
                    }
                    WildOp::Discard => self.discard(r),
                    WildOp::WriteZeroes => self.write_zeroes(r),
                }
            }
            DeviceOp::Compact => self.compact(),
            DeviceOp::SetMemLimit { pages } => {
                let pages = pages.map_or(0, u64::from);
                self.device
                    .set_mem_limit((pages > 0).then_some(pages * PAGE_SIZE as u64));
                self.limit_pages = pages;
            }
            DeviceOp::ResetMemUsedMax => {
                self.device.reset_mem_used_max();
                let mm = self.device.stats().mm;
                assert_eq!(mm.mem_used_max, mm.mem_used_total, "reset mem_used_max");
                self.last.mm.mem_used_max = mm.mem_used_max;
            }
            DeviceOp::SwitchContext { foreign } => {
                self.current ^= 1;
                if foreign {
                    self.ctxs[self.current] = self.foreign.context().expect("context");
                }
            }
            DeviceOp::MarkIdle { all } => {
                let marked = self
                    .device
                    .mark_idle(if all { None } else { Some(u32::MAX) });
                let stored = self
                    .pages
                    .values()
                    .filter(|p| {
                        matches!(
                            p.stored,
                            Stored::Compressed(_) | Stored::Huge | Stored::Grouped
                        )
                    })
                    .count() as u64;
                assert_eq!(
                    marked,
                    if all { stored } else { 0 },
                    "step {}: mark_idle(all={all})",
                    self.step
                );
            }
            DeviceOp::Recompress { huge_only } => self.recompress(huge_only),
            DeviceOp::Group { max, split } => self.group(max, split),
            DeviceOp::Writeback { page, pages, fail } => self.writeback(page, pages, fail),
            DeviceOp::FreeSlots { page, pages } => {
                let first = u64::from(page) % DEVICE_PAGES;
                let n = u64::from(pages % 17);
                let freed = self
                    .device
                    .freed_pages()
                    .expect("the harness's device has marks");
                freed.mark(PageIndex(first), n);
                self.marked
                    .extend((first..(first + n).min(DEVICE_PAGES)).map(PageIndex));
                // Marked pages keep their data until taken.
                for i in first..(first + n).min(DEVICE_PAGES) {
                    self.check_page(PageIndex(i));
                }
            }
            DeviceOp::ReclaimFreed => self.reclaim_freed(),
            DeviceOp::Restart => self.restart(),
        }
    }
}
