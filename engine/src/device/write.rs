//! The write path: [`Device::write`] and its relatives (a write that stops short, discard,
//! write-zeroes), and the store of one page ([`Device::encode`]).

use uzram_codecs::Stream;

use super::stats::Field;
use super::{
    same_filled, segments, writeback, Device, IoContext, PageIndex, ReserveWait, SlotFlags,
    SlotState, PAGE_SIZE,
};
use crate::IoError;

/// A write that failed part way: see [`Device::write_prefix`].
#[derive(Debug)]
pub struct ShortWrite {
    /// Bytes stored from the start of the write (a multiple of 512).
    pub written: usize,
    /// Why the rest was not.
    pub error: IoError,
}

impl Device {
    /// Writes `buf` at byte `offset` (both multiples of 512). On failure the pages not yet
    /// written keep their old contents, and so does the page that failed.
    pub fn write(&self, ctx: &mut IoContext, offset: u64, buf: &[u8]) -> Result<(), IoError> {
        self.write_prefix(ctx, offset, buf).map_err(|short| {
            self.count_failed_write(ctx);
            short.error
        })
    }

    /// [`Device::write`], telling how far a write that failed got: its first
    /// [`ShortWrite::written`] bytes (whole pages, or the partial page it began with) are
    /// stored, the rest keeps its old contents. Counts no failure: a caller that puts the write
    /// off and goes on from there later has not failed it; one that fails it calls
    /// [`Device::count_failed_write`].
    pub fn write_prefix(
        &self,
        ctx: &mut IoContext,
        offset: u64,
        buf: &[u8],
    ) -> Result<(), ShortWrite> {
        let mut written = 0;
        self.write_inner(ctx, offset, buf, &mut written)
            .map_err(|error| ShortWrite { written, error })
    }

    /// A write is storing new data at page `index` (its slot locked): takes its freed mark, if
    /// it has one (see [`FreedPages`](super::FreedPages)); it counts in `notify_free`.
    fn take_freed(&self, index: PageIndex) {
        if self.tier.take_freed(index) {
            self.bump(index, Field::NotifyFree);
        }
    }

    /// Counts a failed write in zram's `io_stat` (see [`Device::write_prefix`]).
    pub fn count_failed_write(&self, ctx: &IoContext) {
        self.counters.bump(ctx.shard, Field::FailedWrites);
    }

    /// Sets `written` to the bytes of the segments stored before each one it starts.
    fn write_inner(
        &self,
        ctx: &mut IoContext,
        offset: u64,
        buf: &[u8],
        written: &mut usize,
    ) -> Result<(), IoError> {
        self.check_range(offset, buf.len() as u64)?;
        self.fit_context(ctx)?;
        let mut done = 0;
        for (index, in_page, len) in segments(offset, buf.len()) {
            *written = done;
            let chunk = &buf[done..done + len];
            done += len;
            let slot = self.slot_for_write(index)?;
            if let Ok(page) = <&[u8; PAGE_SIZE]>::try_from(chunk) {
                // A page swap read back from the backing store and wrote again unchanged
                // takes its old record over: written there once (see `writeback::reuse`).
                if let Some(new) = self.tier.take_kept(self, page) {
                    let mut g = slot.lock();
                    self.replace(index, &mut g, new);
                    self.take_freed(index);
                    continue;
                }
                // Compress and allocate before taking the slot lock.
                let new = self.encode(
                    &mut ctx.streams,
                    &mut ctx.group,
                    &mut ctx.buf,
                    ctx.evict.as_mut(),
                    ctx.reserve_wait,
                    index,
                    page,
                )?;
                let flags = new.flags;
                let mut g = slot.lock();
                self.replace(index, &mut g, new);
                self.take_freed(index);
                drop(g);
                self.tier.stored(index, flags);
            } else {
                // Read-modify-write under the slot lock, so no other write slips in between.
                // Decoded, not loaded: the page is rewritten at once, so neither its access
                // time nor a promotion of a written-back page would last.
                let mut g = slot.lock();
                let old = g.get();
                let (mut scratch, page) = ctx.scratch_and_page();
                self.decode(&mut scratch, index, &old, page)?;
                ctx.page[in_page..in_page + len].copy_from_slice(chunk);
                let new = self.encode(
                    &mut ctx.streams,
                    &mut ctx.group,
                    &mut ctx.buf,
                    ctx.evict.as_mut(),
                    ctx.reserve_wait,
                    index,
                    &ctx.page,
                )?;
                let flags = new.flags;
                self.replace(index, &mut g, new);
                self.take_freed(index);
                drop(g);
                self.tier.stored(index, flags);
            }
        }
        Ok(())
    }

    /// Discards `len_bytes` at byte `offset`: whole pages in the range are freed and read back
    /// as zeros; partial pages at the ends are left as they are (a discard is a hint), as zram
    /// does. Counts each whole page in `notify_free`, as zram does.
    pub fn discard(&self, offset: u64, len_bytes: u64) -> Result<(), IoError> {
        self.check_range(offset, len_bytes)?;
        for (index, _, len) in segments(offset, len_bytes as usize) {
            if len == PAGE_SIZE {
                self.free_page(index);
            }
        }
        Ok(())
    }

    /// Zeroes `len_bytes` at byte `offset`: whole pages are freed (they read as zeros at no
    /// cost), partial pages at the ends are zeroed by read-modify-write.
    pub fn write_zeroes(
        &self,
        ctx: &mut IoContext,
        offset: u64,
        len_bytes: u64,
    ) -> Result<(), IoError> {
        self.check_range(offset, len_bytes)?;
        let zeros = [0u8; PAGE_SIZE];
        let mut pos = offset;
        for (index, _, len) in segments(offset, len_bytes as usize) {
            if len == PAGE_SIZE {
                self.free_page(index);
            } else {
                self.write(ctx, pos, &zeros[..len])?;
            }
            pos += len as u64;
        }
        Ok(())
    }

    /// Stores `page` (same-filled in the slot, else compressed or raw in the pool) and returns
    /// the slot state that names it. When the pool has no room (its limit, or no memory), cold
    /// pages are evicted to the backing store with `evict`'s buffers and the store retried, a
    /// few rounds at most. Nothing changes on error.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn encode(
        &self,
        streams: &mut [Option<Stream>],
        group: &mut super::group::ReadCache,
        buf: &mut [u8],
        evict: Option<&mut writeback::WbBuffers>,
        reserve_wait: ReserveWait,
        index: PageIndex,
        page: &[u8; PAGE_SIZE],
    ) -> Result<SlotState, IoError> {
        let atime = self.now();
        if let Some(word) = same_filled(page) {
            return Ok(SlotState {
                word,
                flags: SlotFlags::SAME,
                prio: 0,
                size: 0,
                atime,
            });
        }
        let primary = streams[0]
            .as_mut()
            .expect("the primary codec is always there");
        // A page that looks incompressible is stored whole without a costly compression.
        let n = if primary.worth_compressing(page) {
            primary
                .compress(page, buf)
                .map_err(|source| IoError::Compress { index, source })?
        } else {
            PAGE_SIZE
        };
        let (bytes, flags) = if n >= self.huge_threshold {
            (&page[..], SlotFlags::STORED | SlotFlags::HUGE)
        } else {
            (&buf[..n], SlotFlags::STORED)
        };
        // Eviction writes grouped pages back alone with this context's streams and group copy.
        let mut batch = evict.map(|bufs| writeback::Batch {
            bufs,
            lend: Some(writeback::Lend { streams, group }),
        });
        self.tier.over_ceiling(self, batch.as_mut(), bytes.len());
        let mut rounds = 0;
        let handle = loop {
            let stored = match reserve_wait {
                ReserveWait::Pool => self.pool.store(bytes),
                ReserveWait::Within(wait) => self.pool.store_within(bytes, wait),
                ReserveWait::Slice(wait) => self.pool.store_for(bytes, wait),
            };
            let e = match stored {
                Ok(h) => break h,
                Err(e) => e,
            };
            let no_room = matches!(
                e,
                uzram_allocator::Error::LimitExceeded { .. }
                    | uzram_allocator::Error::ReserveExhausted { .. }
                    | uzram_allocator::Error::OutOfMemory { .. }
            );
            if no_room
                && self
                    .tier
                    .no_room(self, batch.as_mut(), bytes.len(), &mut rounds)
            {
                continue;
            }
            if rounds > 0 {
                self.tier.evict_failed();
            }
            return Err(match e {
                uzram_allocator::Error::LimitExceeded { limit_bytes, .. } => {
                    IoError::MemLimit { index, limit_bytes }
                }
                e => IoError::OutOfMemory(e),
            });
        };
        Ok(SlotState {
            word: handle.to_raw(),
            flags,
            prio: 0,
            size: bytes.len() as u16,
            atime,
        })
    }
}
