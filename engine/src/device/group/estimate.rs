//! What cold groups would store on a device now, measured on its own pages without changing
//! it: the runs a grouping pass would take, compressed as groups, against what those pages
//! take alone. `uzram bench` reports it; the pass that makes groups takes the same runs.

use uzram_codecs::{GroupStream, GROUP_COMPRESS_BOUND};

use super::make::Run;
use crate::device::{Device, IoContext, SlotFlags, SlotState};
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
        let mut groups = self.group_stream(prio, "group estimate")?;
        let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
        let mut est = GroupEstimate::default();
        let idle = |s: &SlotState| s.flags.contains(SlotFlags::IDLE);
        self.for_each_run(ctx, max_pages, u64::MAX, &idle, &mut |run| {
            self.price_run(&mut groups, run, &mut frame, &mut est)
        })?;
        Ok(est)
    }

    fn price_run(
        &self,
        groups: &mut GroupStream,
        run: &Run,
        frame: &mut [u8],
        est: &mut GroupEstimate,
    ) -> Result<(), Error> {
        let pages = run.taken.len();
        let n = self.compress_run(groups, run, frame)?;
        let (alone, grouped) = self.pool_cost(run, n);
        if grouped < alone {
            est.groups += 1;
            est.pages += pages as u64;
            est.compr_alone += run.taken.iter().map(|t| u64::from(t.0.size)).sum::<u64>();
            est.pool_alone += alone as u64;
            est.compr_grouped += n as u64;
            est.pool_grouped += grouped as u64;
        } else {
            est.runs_left_single += 1;
        }
        Ok(())
    }
}
