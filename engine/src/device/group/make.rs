//! The pass that makes cold groups from runs of neighbouring idle pages, and the split that
//! stores a sparse group's pages singly again.
//!
//! A run is read page by page under each slot's lock, its state and generation noted; the
//! group is compressed and stored unlocked; then each member is committed under its slot's lock
//! only if the slot still holds what was read (a page written meanwhile stays as it is, and its
//! member is dead in the group from the start). The group enters the table with every member
//! live before any slot names it, so it cannot be freed while members are still to commit.

use std::sync::atomic::Ordering;

use uzram_codecs::{GroupStream, GROUP_COMPRESS_BOUND, MAX_GROUP_LEN, MAX_GROUP_PAGES};

use super::{Dropped, Header, MIN_GROUP_PAGES};
use crate::device::{Device, Field, Held, IoContext, PageIndex, SlotFlags, SlotState, PAGE_SIZE};
use crate::{Error, IoError};

/// What a grouping pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupPass {
    /// Groups made.
    pub groups: u64,
    /// Pages now held in them.
    pub pages: u64,
    /// Pages of a run that changed between the read and the commit: left as they were.
    pub changed: u64,
    /// Runs that would take as much pool grouped as alone, or that the pool had no room for.
    pub runs_left_single: u64,
    /// The pool the grouped pages' objects took (each object's size class).
    pub pool_before: u64,
    /// The pool the groups' chunks take.
    pub pool_after: u64,
}

/// Whether a grouping pass may take this page: stored compressed on its own, not written
/// back (which pages it does take, idle ones, is the caller's). A page the slot-free probe
/// marked freed is left out too: its data is garbage waiting for the next reclaim.
/// (INCOMPRESSIBLE says no codec shrinks the page alone; with its neighbours one may.)
fn groupable(s: &SlotState) -> bool {
    s.flags.contains(SlotFlags::STORED)
        && !s.flags.intersects(SlotFlags::HUGE | SlotFlags::WB)
        && matches!(s.held(), Held::Object(_))
}

/// What the grouping pass keeps between passes (`Device::grouper`).
pub(crate) struct Grouper {
    /// The codec priority `stream` compresses with.
    prio: u8,
    stream: GroupStream,
    frame: Vec<u8>,
}

/// A run being gathered: its pages back to back, each one's state and generation as read,
/// and its first index.
pub(super) struct Run {
    pub(super) pages: Vec<u8>,
    pub(super) taken: Vec<(SlotState, u8)>,
    pub(super) first: u64,
}

impl Run {
    /// The index that would go on this run (none while it is empty).
    fn next(&self) -> Option<u64> {
        (!self.taken.is_empty()).then(|| self.first + self.taken.len() as u64)
    }
}

impl Device {
    /// A group stream for the codec at priority `prio`, or an error that names `what` asked.
    pub(super) fn group_stream(&self, prio: u8, what: &str) -> Result<GroupStream, Error> {
        let codec = self
            .codecs
            .get(usize::from(prio))
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::InvalidRequest {
                text: format!("{what} with priority {prio}"),
                why: "the device has no codec at that priority",
            })?;
        Ok(GroupStream::new(codec)?)
    }

    /// Calls `on_run` with every run of [`MIN_GROUP_PAGES`] to `max_pages` (taken between that
    /// and [`MAX_GROUP_PAGES`]) neighbouring groupable pages that `take` accepts, each read
    /// under its lock, until runs of `limit` pages in all have been offered.
    pub(super) fn for_each_run(
        &self,
        ctx: &mut IoContext,
        max_pages: usize,
        limit: u64,
        take: &dyn Fn(&SlotState) -> bool,
        on_run: &mut dyn FnMut(&Run) -> Result<(), Error>,
    ) -> Result<(), Error> {
        self.fit_context(ctx)?;
        let max_pages = max_pages.clamp(MIN_GROUP_PAGES, MAX_GROUP_PAGES);
        let freed = self.freed_pages();
        let mut run = Run {
            pages: Vec::with_capacity(MAX_GROUP_LEN),
            taken: Vec::with_capacity(MAX_GROUP_PAGES),
            first: 0,
        };
        let offered = std::cell::Cell::new(0u64);
        // Offers a run long enough; returns the pages offered so far.
        let mut close = |run: &mut Run| -> Result<u64, Error> {
            if run.taken.len() >= MIN_GROUP_PAGES {
                offered.set(offered.get() + run.taken.len() as u64);
                on_run(run)?;
            }
            run.pages.clear();
            run.taken.clear();
            Ok(offered.get())
        };
        let ok = |s: &SlotState| groupable(s) && take(s);
        for (i, slot) in self.slots.iter() {
            // A run ends at a gap, at its most pages, or where it would pass the limit.
            let room = limit.saturating_sub(offered.get());
            let full = run.taken.len() == max_pages || run.taken.len() as u64 >= room;
            // Done once the room left cannot hold the least group.
            if (run.next() != Some(i) || full) && close(&mut run)? + MIN_GROUP_PAGES as u64 > limit
            {
                return Ok(());
            }
            if !ok(&slot.peek()) || freed.is_some_and(|f| f.is_marked(PageIndex(i))) {
                continue;
            }
            let g = slot.lock();
            let s = g.get();
            let (mut scratch, page) = ctx.scratch_and_page();
            if !ok(&s) || self.decode(&mut scratch, PageIndex(i), &s, page).is_err() {
                continue;
            }
            let gen = g.generation();
            drop(g);
            if run.taken.is_empty() {
                run.first = i;
            }
            run.pages.extend_from_slice(&ctx.page[..]);
            run.taken.push((s, gen));
        }
        close(&mut run).map(|_| ())
    }

    pub(super) fn compress_run(
        &self,
        groups: &mut GroupStream,
        run: &Run,
        frame: &mut [u8],
    ) -> Result<usize, Error> {
        groups.compress(&run.pages, frame).map_err(|source| {
            Error::from(IoError::Compress {
                index: PageIndex(run.first),
                source,
            })
        })
    }

    /// The pool bytes page state `s` stands for: its object's size, or for a grouped page its
    /// share of its group's frame (on average over the groups live now).
    pub(in crate::device) fn pool_bytes_of(&self, s: &SlotState) -> u64 {
        if s.is_grouped() {
            self.groups.member_share()
        } else {
            u64::from(s.size)
        }
    }

    /// The pool a run's pages take alone and would take as a group with an `n`-byte frame,
    /// each object at its size class.
    pub(super) fn pool_cost(&self, run: &Run, n: usize) -> (usize, usize) {
        let class = |size: usize| self.pool.class_size(size).unwrap_or(size);
        let alone = run.taken.iter().map(|t| class(usize::from(t.0.size))).sum();
        (alone, Header::chunk_sizes(n).map(class).sum())
    }

    /// Compresses every run of neighbouring pages marked idle (as [`Device::estimate_groups`]
    /// finds them) that stores in less pool as one group, with the codec at priority `prio`,
    /// in groups of at most `max_pages`. A read of a grouped page decompresses its group; a
    /// write or discard takes the page out of it.
    pub fn make_groups(
        &self,
        ctx: &mut IoContext,
        prio: u8,
        max_pages: usize,
    ) -> Result<GroupPass, Error> {
        self.make_groups_of(ctx, prio, max_pages, u64::MAX, &|s| {
            s.flags.contains(SlotFlags::IDLE)
        })
    }

    /// [`Device::make_groups`] of the pages `take` accepts, offering runs of at most `limit`
    /// pages in all.
    pub(in crate::device) fn make_groups_of(
        &self,
        ctx: &mut IoContext,
        prio: u8,
        max_pages: usize,
        limit: u64,
        take: &dyn Fn(&SlotState) -> bool,
    ) -> Result<GroupPass, Error> {
        // One pass at a time, with the device's grouping state, made at the first pass and
        // kept: a zstd context for 64 KiB runs is 650 KiB, which a pass every few seconds
        // would otherwise allocate and free each time.
        let mut kept = self.grouper.lock();
        if kept.as_ref().map(|g| g.prio) != Some(prio) {
            *kept = None;
            *kept = Some(Grouper {
                prio,
                stream: self.group_stream(prio, "grouping")?,
                frame: vec![0u8; GROUP_COMPRESS_BOUND],
            });
        }
        let Some(Grouper {
            stream: groups,
            frame,
            ..
        }) = kept.as_mut()
        else {
            return Ok(GroupPass::default());
        };
        let mut pass = GroupPass::default();
        let class = |size: u16| self.pool.class_size(usize::from(size)).unwrap_or(PAGE_SIZE);
        self.for_each_run(ctx, max_pages, limit, take, &mut |run| {
            let n = self.compress_run(groups, run, frame)?;
            let (alone, grouped) = self.pool_cost(run, n);
            if grouped >= alone {
                pass.runs_left_single += 1;
                return Ok(());
            }
            let stamp = self.groups.next_stamp();
            let pages = run.taken.len();
            let Ok(head) = super::store(&self.pool, &frame[..n], pages, prio, stamp) else {
                pass.runs_left_single += 1;
                return Ok(());
            };
            self.groups.insert(head, run.first, pages as u8, n as u32);
            let committed = self.commit_run(run, head, prio);
            pass.pages += committed.len() as u64;
            pass.changed += (pages - committed.len()) as u64;
            // (If every page changed, the group was freed with its last member.)
            if !committed.is_empty() {
                self.groups.made.fetch_add(1, Ordering::Relaxed);
                pass.groups += 1;
                pass.pool_before += committed.iter().map(|&s| class(s)).sum::<usize>() as u64;
                pass.pool_after += grouped as u64;
            }
            Ok(())
        })?;
        Ok(pass)
    }

    /// Points each page of `run` that still holds what was read at its member of the group at
    /// `head`; drops the others' members. Returns the sizes of the objects the committed pages
    /// held alone.
    fn commit_run(&self, run: &Run, head: uzram_allocator::Handle, prio: u8) -> Vec<u16> {
        let mut committed = Vec::with_capacity(run.taken.len());
        for (m, &(s, gen)) in run.taken.iter().enumerate() {
            let index = PageIndex(run.first + m as u64);
            let word = SlotState::member_word(head, m as u8);
            let done = match (word, self.slot(index)) {
                (Some(word), Some(slot)) => {
                    let mut g = slot.lock();
                    let same = g.get() == s && g.generation() == gen;
                    if same {
                        let member = SlotState {
                            word,
                            flags: s.flags,
                            prio,
                            size: 0,
                            // Not an access: a grouped page stays as cold as it was.
                            atime: s.atime,
                        };
                        self.replace(index, &mut g, member);
                    }
                    same
                }
                _ => false,
            };
            if done {
                committed.push(s.size);
            } else if !self.drop_member(head, m as u8) {
                self.counters
                    .bump(super::super::gauge_shard(index), Field::FreeErrors);
            }
        }
        committed
    }

    /// Member `member` of the group at `head` has left it; at the last member the group's
    /// chunks are freed. False if the table did not know the member live, or the chunks would
    /// not free (a bug either way, counted by the caller).
    pub(in crate::device) fn drop_member(&self, head: uzram_allocator::Handle, member: u8) -> bool {
        match self.groups.drop_member(head, member) {
            Dropped::Kept => true,
            Dropped::Last => super::free(&self.pool, head).is_ok(),
            Dropped::Unknown => false,
        }
    }

    /// Stores the pages of every group that has fewer than half its pages left singly again
    /// (compressed with the group's codec), which frees the group. Returns the groups split.
    pub fn split_sparse_groups(&self, ctx: &mut IoContext) -> Result<u64, Error> {
        let sparse = self.groups.sparse();
        if sparse.is_empty() {
            return Ok(0);
        }
        self.fit_context(ctx)?;
        // Its pages are compressed under their slot locks: zstd's workspace is made first.
        ctx.warm_compression().map_err(IoError::Context)?;
        let mut split = 0;
        for head in sparse {
            let Some(head) = uzram_allocator::Handle::from_raw(head) else {
                continue;
            };
            // A group that cannot be read (damaged) stays as it is, and its readers get the
            // error; the other groups are split all the same.
            if self.split_group(ctx, head).unwrap_or(false) {
                split += 1;
                self.groups.split.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(split)
    }

    /// Stores each live member of the group at `head` as a page of its own, compressed with the
    /// group's codec (raw if that does not shrink it below the huge threshold). True once the
    /// group is gone; false if the pool had no room (its other pages stay grouped), or the
    /// group was already gone.
    fn split_group(
        &self,
        ctx: &mut IoContext,
        head: uzram_allocator::Handle,
    ) -> Result<bool, Error> {
        let Some(e) = self.groups.get(head) else {
            return Ok(false);
        };
        for m in 0..e.pages {
            if e.live & (1 << m) == 0 {
                continue;
            }
            let index = PageIndex(e.first + u64::from(m));
            let Some(slot) = self.slot(index) else {
                continue;
            };
            let mut g = slot.lock();
            let s = g.get();
            if s.held() != (Held::Member { head, member: m }) {
                continue;
            }
            self.read_member(&mut ctx.group, index, head, m, &mut ctx.page)?;
            let stream = ctx
                .streams
                .get_mut(usize::from(s.prio))
                .and_then(Option::as_mut);
            let n = match stream.map(|st| st.compress(&ctx.page, &mut ctx.buf)) {
                Some(Ok(n)) if n < self.huge_threshold => n,
                _ => PAGE_SIZE,
            };
            let (bytes, flags) = if n == PAGE_SIZE {
                (&ctx.page[..], s.flags | SlotFlags::HUGE)
            } else {
                (&ctx.buf[..n], s.flags)
            };
            let Ok(h) = self.pool.store(bytes) else {
                return Ok(false);
            };
            let single = SlotState {
                word: h.to_raw(),
                flags,
                prio: if n == PAGE_SIZE { 0 } else { s.prio },
                size: n as u16,
                atime: s.atime,
            };
            self.replace(index, &mut g, single);
        }
        Ok(self.groups.get(head).is_none())
    }
}
