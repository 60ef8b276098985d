//! What cold groups would store on a device now, measured on its own pages without changing
//! it: the runs a grouping pass would take, compressed as groups, against what those pages
//! take alone. `uzram bench` reports it; the pass that makes groups takes the same runs.

use uzram_codecs::{GroupStream, GROUP_COMPRESS_BOUND, MAX_GROUP_LEN, MAX_GROUP_PAGES};

use super::Header;
use crate::device::{Device, IoContext, PageIndex, SlotFlags, SlotState};
use crate::Error;

/// Runs shorter than this stay single pages: a group's header and its read cost are not worth
/// it for two or three pages (they gained 1-12 % on a real heap where 16 gained 30 %).
pub const MIN_GROUP_PAGES: usize = 4;

/// What grouping a device's idle runs would store, against what their pages store alone.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupEstimate {
    /// Groups made: runs of [`MIN_GROUP_PAGES`] or more that store fewer pool bytes grouped.
    pub groups: u64,
    /// Pages in those groups.
    pub pages: u64,
    /// Runs long enough that would take as much pool grouped as alone (left single).
    pub runs_left_single: u64,
    /// The grouped pages' compressed bytes alone, as stored now (their `compr_data_size`).
    pub compr_alone: u64,
    /// The pool their objects take now (each object's size class).
    pub pool_alone: u64,
    /// The groups' frames.
    pub compr_grouped: u64,
    /// The pool the groups' chunks would take, headers included (each chunk's size class).
    pub pool_grouped: u64,
}

/// Whether a grouping pass takes this page: stored compressed, marked idle, not written back.
/// (A page the slot-free probe marked freed is left out by the caller: its data is garbage
/// waiting for the next reclaim.)
fn groupable(s: &SlotState) -> bool {
    s.flags.contains(SlotFlags::STORED | SlotFlags::IDLE)
        && !s
            .flags
            .intersects(SlotFlags::HUGE | SlotFlags::WB | SlotFlags::INCOMPRESSIBLE)
}

/// A run being gathered: its pages back to back, their objects' sizes, and its first index.
struct Run {
    pages: Vec<u8>,
    sizes: Vec<u16>,
    first: u64,
}

impl Run {
    /// The index that would go on this run (none while it is empty).
    fn next(&self) -> Option<u64> {
        (!self.sizes.is_empty()).then(|| self.first + self.sizes.len() as u64)
    }
}

impl Device {
    /// What compressing every run of neighbouring idle stored pages (zram's IDLE marks, as
    /// `recompress type=idle` takes them; not pages the slot-free probe marked freed) as groups
    /// of at most `max_pages` (taken between [`MIN_GROUP_PAGES`] and [`MAX_GROUP_PAGES`]) with
    /// the codec at priority `prio` would store, against what those pages store now. Reads each
    /// page under its lock as recompression does; changes nothing.
    pub fn estimate_groups(
        &self,
        ctx: &mut IoContext,
        prio: u8,
        max_pages: usize,
    ) -> Result<GroupEstimate, Error> {
        self.fit_context(ctx)?;
        let codec = ctx
            .streams
            .get(usize::from(prio))
            .and_then(Option::as_ref)
            .map(|s| s.codec().clone())
            .ok_or_else(|| Error::InvalidRequest {
                text: format!("group estimate with priority {prio}"),
                why: "the device has no codec at that priority",
            })?;
        let mut groups = GroupStream::new(&codec)?;
        let max_pages = max_pages.clamp(MIN_GROUP_PAGES, MAX_GROUP_PAGES);
        let freed = self.freed_pages();
        let mut run = Run {
            pages: Vec::with_capacity(MAX_GROUP_LEN),
            sizes: Vec::with_capacity(MAX_GROUP_PAGES),
            first: 0,
        };
        let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
        let mut est = GroupEstimate::default();
        for (i, slot) in self.slots.iter() {
            if run.next() != Some(i) || run.sizes.len() == max_pages {
                self.close_run(&mut groups, &mut run, &mut frame, &mut est)?;
            }
            if !groupable(&slot.peek()) || freed.is_some_and(|f| f.is_marked(PageIndex(i))) {
                continue;
            }
            let g = slot.lock();
            let s = g.get();
            if !groupable(&s)
                || self
                    .decode(
                        &mut ctx.streams,
                        &mut ctx.buf,
                        PageIndex(i),
                        &s,
                        &mut ctx.page,
                    )
                    .is_err()
            {
                continue;
            }
            drop(g);
            if run.sizes.is_empty() {
                run.first = i;
            }
            run.pages.extend_from_slice(&ctx.page[..]);
            run.sizes.push(s.size);
        }
        self.close_run(&mut groups, &mut run, &mut frame, &mut est)?;
        Ok(est)
    }

    fn close_run(
        &self,
        groups: &mut GroupStream,
        run: &mut Run,
        frame: &mut [u8],
        est: &mut GroupEstimate,
    ) -> Result<(), Error> {
        let pages = run.sizes.len();
        if pages >= MIN_GROUP_PAGES {
            let n =
                groups
                    .compress(&run.pages, frame)
                    .map_err(|source| crate::IoError::Compress {
                        index: PageIndex(run.first),
                        source,
                    })?;
            let class = |size: usize| self.pool.class_size(size).unwrap_or(size);
            let alone: usize = run.sizes.iter().map(|&s| class(usize::from(s))).sum();
            let grouped: usize = Header::chunk_sizes(n).map(class).sum();
            if grouped < alone {
                est.groups += 1;
                est.pages += pages as u64;
                est.compr_alone += run.sizes.iter().map(|&s| u64::from(s)).sum::<u64>();
                est.pool_alone += alone as u64;
                est.compr_grouped += n as u64;
                est.pool_grouped += grouped as u64;
            } else {
                est.runs_left_single += 1;
            }
        }
        run.pages.clear();
        run.sizes.clear();
        Ok(())
    }
}
