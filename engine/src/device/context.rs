//! [`IoContext`]: what one I/O thread brings to each request (codec streams, scratch buffers,
//! how long its writes wait for the pool's reserve).

use std::sync::atomic::Ordering;
use std::time::Duration;

use uzram_codecs::{Stream, MAX_COMPRESSED_LEN};

use super::{policy, writeback, Device, PAGE_SIZE};
use crate::{Error, IoError};

/// Per-thread state for I/O: the codec streams (zram's per-CPU zcomp streams) and scratch
/// buffers, reused for every page. Make one per I/O thread with [`Device::context`].
pub struct IoContext {
    pub(super) device: u64,
    /// The counter shard this context's event counters (failed I/O) go to.
    pub(super) shard: usize,
    /// By codec priority; `None` where the device has no codec of that priority.
    pub(super) streams: Vec<Option<Stream>>,
    /// Compressed bytes, and written-back records read by direct I/O: aligned.
    pub(super) buf: writeback::AlignedBuf,
    pub(super) page: Box<[u8; PAGE_SIZE]>,
    /// Grouped pages' reads: the last group decompressed.
    pub(super) group: super::group::ReadCache,
    /// Eviction's batch buffers (devices with a backing store only).
    pub(super) evict: Option<writeback::WbBuffers>,
    /// How a write waits for the pool's reserve to be refilled: see
    /// [`IoContext::set_reserve_wait`].
    pub(super) reserve_wait: ReserveWait,
}

/// How a context's writes wait for a [`crate::Growth::Reserve`] pool's maintenance thread when
/// the pool has no room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReserveWait {
    /// The pool's own wait.
    #[default]
    Pool,
    /// As long as the maintenance thread makes progress, but at most this long without (and 8
    /// times it in all); at once, while an earlier write's wait running out still holds.
    Within(Duration),
    /// At most this long in all, however the maintenance thread fares; then the write stops
    /// short ([`crate::ShortWrite`]), and its caller decides by [`Device::upkeep_progress`]
    /// whether to fail it or put it off.
    Slice(Duration),
}

/// What decoding a page needs from its I/O context, borrowed apart from the context's page
/// buffer (which may be the output).
pub(super) struct Scratch<'a> {
    pub(super) streams: &'a mut [Option<Stream>],
    pub(super) buf: &'a mut [u8],
    pub(super) group: &'a mut super::group::ReadCache,
}

impl IoContext {
    /// Makes the compression workspace of each recompression stream now, before a pass that
    /// compresses with them under slot locks (a stream made for reads has none yet; one that
    /// has one compresses a page).
    pub(super) fn warm_compression(&mut self) -> Result<(), uzram_codecs::ConfigError> {
        self.streams
            .iter_mut()
            .skip(1)
            .flatten()
            .try_for_each(Stream::warm_compression)
    }

    pub(super) fn scratch(&mut self) -> Scratch<'_> {
        self.scratch_and_page().0
    }

    /// [`IoContext::scratch`] and the context's page buffer.
    pub(super) fn scratch_and_page(&mut self) -> (Scratch<'_>, &mut [u8; PAGE_SIZE]) {
        (
            Scratch {
                streams: &mut self.streams,
                buf: &mut self.buf,
                group: &mut self.group,
            },
            &mut self.page,
        )
    }

    /// How this context's next writes wait for the pool's reserve to be refilled. A writer
    /// that keeps a page whose write failed and tries it again later (swap) is better told
    /// soon than held: held, it reclaims nothing else meanwhile.
    pub fn set_reserve_wait(&mut self, wait: ReserveWait) {
        self.reserve_wait = wait;
    }
}

impl std::fmt::Debug for IoContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoContext")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// A context for one I/O thread. Its primary stream has compressed and decompressed a page
    /// that uses zstd's entropy tables ([`uzram_codecs::Codec::stream`]), so that the work
    /// memory zstd allocates lazily is made and written: the I/O path then runs on memory it
    /// already holds. The recompression streams are made so too where the device has a
    /// backing store (an eviction compresses a grouped page alone with its group's codec on
    /// the thread that writes). Without one, an I/O thread only decompresses with them: they
    /// are made for reads ([`uzram_codecs::Codec::stream_for_reads`]: a decompression), and
    /// the threads that recompress make zstd's compression workspace (about 90 KiB a context)
    /// at the start of their pass ([`IoContext::warm_compression`]), so that no I/O thread
    /// holds one it never uses.
    pub fn context(&self) -> Result<IoContext, Error> {
        Ok(self.new_context()?)
    }

    pub(super) fn new_context(&self) -> Result<IoContext, uzram_codecs::ConfigError> {
        let backing = self.backing().is_some();
        let streams = self
            .codecs
            .iter()
            .enumerate()
            .map(|(p, c)| {
                c.as_ref()
                    .map(|c| {
                        if p == 0 || backing {
                            c.stream()
                        } else {
                            c.stream_for_reads()
                        }
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ctx = IoContext {
            device: self.id,
            shard: self.next_shard.fetch_add(1, Ordering::Relaxed),
            streams,
            buf: writeback::AlignedBuf::new(MAX_COMPRESSED_LEN.max(writeback::READ_WINDOW)),
            page: Box::new([0; PAGE_SIZE]),
            group: super::group::ReadCache::default(),
            evict: self
                .backing()
                .map(|_| writeback::WbBuffers::new(policy::EVICT_BATCH)),
            reserve_wait: ReserveWait::Pool,
        };
        Ok(ctx)
    }

    /// Gives `ctx` streams for this device if it was made for another one.
    pub(super) fn fit_context(&self, ctx: &mut IoContext) -> Result<(), IoError> {
        if ctx.device != self.id {
            let reserve_wait = ctx.reserve_wait;
            *ctx = self.new_context().map_err(IoError::Context)?;
            ctx.reserve_wait = reserve_wait;
        }
        Ok(())
    }
}
