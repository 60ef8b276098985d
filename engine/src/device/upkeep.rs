//! The device's memory upkeep (limit, reserve, compaction) and its reports (zram's `mm_stat`
//! and `io_stat`, figures, the invariants the tests check).

use uzram_allocator::Handle;

use super::stats::Totals;
use super::{
    Device, DeviceStats, Held, IoStat, Maintenance, MmStat, PageIndex, SlotFlags, SlotState,
    PAGE_SIZE,
};
use crate::{Error, IoError};

impl Device {
    /// zram's `mem_limit`: sets (or with `None`/0 clears) the limit.
    pub fn set_mem_limit(&self, bytes: Option<u64>) {
        self.pool.set_limit(bytes.filter(|&b| b > 0));
    }

    /// zram's `mem_used_max` reset.
    pub fn reset_mem_used_max(&self) {
        self.pool.reset_max_used();
    }

    /// The maintenance of a [`Growth::Reserve`] pool: maps arenas into the reserve and unmaps
    /// surplus empty ones, outside the I/O path's locks. Call it from a thread that may wait for
    /// reclaim, after [`Device::wait_for_maintenance`].
    pub fn maintain_memory(&self) -> Result<Maintenance, Error> {
        Ok(self.pool.maintain().map_err(IoError::OutOfMemory)?)
    }

    /// [`Device::maintain_memory`], calling `after_each` after each arena it maps (the daemon
    /// tops up its I/O path's heap there: mapping an arena can take long while memory is
    /// short). The first arena comes first: writes may be waiting for it.
    pub fn maintain_memory_with(&self, after_each: &mut dyn FnMut()) -> Result<Maintenance, Error> {
        Ok(self
            .pool
            .maintain_with(after_each)
            .map_err(IoError::OutOfMemory)?)
    }

    /// Tells writes waiting for the pool's reserve that the thread keeping it is making
    /// progress with other memory the I/O path needs (`pages` faulted in): they keep waiting
    /// for its next arena instead of failing (see [`crate::Growth::Reserve`]).
    pub fn note_upkeep_progress(&self, pages: u64) {
        self.pool.note_progress(pages);
    }

    /// How far the thread that keeps the pool's reserve has come: pages it has faulted in and
    /// arenas it has mapped, both only ever growing (see [`crate::ReserveWait::Slice`]: a
    /// writer that puts off writes judges by these whether that thread is stuck).
    pub fn upkeep_progress(&self) -> (u64, u64) {
        self.pool.upkeep_progress()
    }

    /// The arenas (2 MiB each) the pool's reserve is kept at now: with [`crate::Growth::Reserve`]
    /// it follows demand (see [`Device::maintain_memory`]).
    pub fn pool_reserve_target(&self) -> usize {
        self.pool.reserve_target_arenas()
    }

    /// Tells the pool whether the host's memory is short (see [`crate::Pressure::short`]): with
    /// [`crate::Growth::Reserve`], the reserve is kept at its most while it is, since that is
    /// when swap writes come.
    pub fn set_memory_short(&self, short: bool) {
        self.pool.set_memory_short(short);
    }

    /// Wakes the thread in [`Device::wait_for_maintenance`] for a round now (the daemon's I/O
    /// path does when its own heap runs low).
    pub fn request_maintenance(&self) {
        self.pool.request_maintenance();
    }

    /// Blocks until an I/O asks for pool memory or `timeout` passes.
    pub fn wait_for_maintenance(&self, timeout: std::time::Duration) -> bool {
        self.pool.wait_for_maintenance(timeout)
    }

    /// zram's `compact`: compacts the pool. Returns pages freed.
    pub fn compact(&self) -> u64 {
        self.pool.compact().pages_freed
    }

    /// zram's `orig_data_size` and `mem_used_total`, read without taking any lock (for a
    /// watchdog that must keep reporting while the I/O path is stuck).
    pub fn usage(&self) -> (u64, u64) {
        let page = PAGE_SIZE as u64;
        (
            self.counters.totals().pages_stored * page,
            self.pool.pages_used() * page,
        )
    }

    /// Everything counted, at once.
    pub fn stats(&self) -> DeviceStats {
        let pool = self.pool.stats();
        let c = self.counters.totals();
        let page = PAGE_SIZE as u64;
        DeviceStats {
            mm: MmStat {
                orig_data_size: c.pages_stored * page,
                // A group's bytes once, for all its members (their slots count none).
                compr_data_size: c.compr_data_size.wrapping_add(self.groups.bytes()),
                mem_used_total: pool.pages_used * page,
                mem_limit: pool.limit_pages * page,
                mem_used_max: pool.max_pages_used * page,
                same_pages: c.same_pages,
                pages_compacted: pool.pages_compacted,
                huge_pages: c.huge_pages,
                huge_pages_since: c.huge_pages_since,
            },
            io: IoStat {
                failed_reads: c.failed_reads,
                failed_writes: c.failed_writes,
                notify_free: c.notify_free,
            },
            table_bytes: self.slots.bytes() + pool.metadata_bytes,
            pool_mapped_bytes: pool.pages_mapped * page,
            pool_reserved_bytes: pool.pages_reserved * page,
            pool_reserve_target_bytes: pool.pages_reserve_target * page,
            stored_pages: c.stored_pages,
            notice_freed_pages: c.notice_freed,
            groups: self.groups.figures(),
        }
    }

    /// zram's `mm_stat` line.
    pub fn mm_stat(&self) -> String {
        self.stats().mm.to_string()
    }

    /// zram's `io_stat` line.
    pub fn io_stat(&self) -> String {
        self.stats().io.to_string()
    }

    /// The state of page `index`'s slot (racy: for tests and tools).
    pub fn slot_state(&self, index: PageIndex) -> Option<SlotState> {
        (index.0 < self.slots.len()).then(|| self.peek(index))
    }

    /// Checks the slot table against the pool and the counters: every stored slot's handle is
    /// live with the recorded size, and the counters add up. Needs a quiescent device.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut expect = Totals::default();
        let mut members = super::group::Members::default();
        for (i, slot) in self.slots.iter() {
            let s = slot.peek();
            expect.add(&s);
            if let Held::Member { head, member } = s.held() {
                members.note(i, &s, head, member)?;
            } else if s.flags.contains(SlotFlags::STORED) {
                let h =
                    Handle::from_raw(s.word).ok_or(format!("page {i}: stored with handle 0"))?;
                let size = self
                    .pool
                    .object_size(h)
                    .map_err(|e| format!("page {i}: {e}"))?;
                if size != usize::from(s.size) {
                    return Err(format!("page {i}: slot says {} bytes, pool {size}", s.size));
                }
                if s.flags.contains(SlotFlags::HUGE) != (size == PAGE_SIZE) {
                    return Err(format!("page {i}: HUGE flag disagrees with size {size}"));
                }
            } else if s.flags.contains(SlotFlags::HUGE) && !s.flags.contains(SlotFlags::WB) {
                return Err(format!("page {i}: HUGE without STORED"));
            }
            // IDLE on a stored page, READ_BACK (the same bit) on a written-back one.
            if s.flags.contains(SlotFlags::IDLE)
                && !s.flags.intersects(SlotFlags::STORED | SlotFlags::WB)
            {
                return Err(format!(
                    "page {i}: IDLE on a page neither stored nor written back"
                ));
            }
            // PROMOTED on a stored page, ADOPTED (the same bit) on a written-back one.
            if s.flags.contains(SlotFlags::PROMOTED)
                && !s.flags.intersects(SlotFlags::STORED | SlotFlags::WB)
            {
                return Err(format!(
                    "page {i}: PROMOTED on a page neither stored nor written back"
                ));
            }
        }
        let c = self.counters.totals();
        let pairs = [
            ("pages_stored", expect.pages_stored, c.pages_stored),
            ("stored_pages", expect.stored_pages, c.stored_pages),
            ("compr_data_size", expect.compr_data_size, c.compr_data_size),
            ("same_pages", expect.same_pages, c.same_pages),
            ("huge_pages", expect.huge_pages, c.huge_pages),
        ];
        for (name, want, got) in pairs {
            if want != got {
                return Err(format!("{name}: counter {got}, slots add up to {want}"));
            }
        }
        // A free that failed (a handle the pool did not know, a group member the table did not
        // know live) is a bug the counters would otherwise hide.
        if c.free_errors != 0 {
            return Err(format!("{} frees failed", c.free_errors));
        }
        let chunks = self.check_groups(&members)?;
        let grouped = self.groups.figures().pages;
        let objects = self.pool.stats().objects;
        if Some(objects) != c.stored_pages.checked_sub(grouped).map(|n| n + chunks) {
            return Err(format!(
                "pool holds {objects} objects for {} stored pages ({grouped} of them in groups of {chunks} chunks)",
                c.stored_pages
            ));
        }
        self.check_backing_space()
    }

    /// The backing store's figures against the slots: its page count is the written-back
    /// slots', and the bytes it has in use are their records' plus the records kept for reuse.
    fn check_backing_space(&self) -> Result<(), String> {
        let Some(b) = self.backing() else {
            return Ok(());
        };
        let (mut pages, mut bytes) = (0u64, 0u64);
        for (_, slot) in self.slots.iter() {
            let s = slot.peek();
            if s.flags.contains(SlotFlags::WB) {
                pages += 1;
                bytes += super::writeback::record_bytes(usize::from(s.size));
            }
        }
        let used: u64 = b.files().iter().map(|f| f.used_bytes).sum();
        let kept = b.kept().1;
        if b.pages() != pages || used != bytes + kept {
            return Err(format!(
                "backing store: {} pages and {used} bytes in use; the slots name {pages} records of {bytes} bytes, {kept} bytes kept for reuse",
                b.pages()
            ));
        }
        Ok(())
    }
}
