//! Reads of a grouped page: the group is decompressed once into the I/O context's copy, which
//! is kept, so the neighbours that swap readahead asks for next cost a copy.
//!
//! A grouped page written back goes on its own ([`Device::member_alone`]): its group is
//! decompressed (once for the neighbours a batch takes with it) and the page compressed alone
//! with its group's codec, so that its record on the store is what a recompression of the page
//! alone would have left there, and its read back needs no group.

use uzram_allocator::Handle;
use uzram_codecs::{
    CodecError, ConfigError, GroupStream, Stream, GROUP_COMPRESS_BOUND, MAX_GROUP_LEN,
};

use super::GroupError;
use crate::device::{Device, Held, PageIndex, SlotState, PAGE_SIZE};
use crate::IoError;

/// One I/O context's state for reading groups. Holds nothing until its first grouped page:
/// then the frame and the pages (136 KiB) and a decompression-only stream per codec it meets.
#[derive(Default)]
pub(crate) struct ReadCache {
    /// The head's raw handle and the stamp of the group `pages` holds.
    key: Option<(u64, u32)>,
    frame: Vec<u8>,
    pages: Vec<u8>,
    streams: Vec<Option<GroupStream>>,
}

impl ReadCache {
    /// Forgets the copy (a test seam: the next read decompresses).
    #[cfg(test)]
    pub(crate) fn forget(&mut self) {
        self.key = None;
    }

    /// A test seam: holds a copy of bytes `fill` as the group at `head` with `stamp`.
    #[cfg(test)]
    pub(crate) fn pretend(&mut self, head: Handle, stamp: u32, fill: u8) {
        self.pages.clear();
        self.pages.resize(MAX_GROUP_LEN, fill);
        self.key = Some((head.to_raw(), stamp));
    }
}

fn damaged(index: PageIndex, head: Handle, e: GroupError) -> IoError {
    match e {
        GroupError::Pool(source) => IoError::Lost { index, source },
        GroupError::Damaged { reason, .. } => IoError::Group {
            index,
            head: head.to_raw(),
            reason,
        },
        GroupError::Shape { .. } => IoError::Group {
            index,
            head: head.to_raw(),
            reason: "frame longer than any group's",
        },
    }
}

impl Device {
    /// Fills `out` with page `member` of the group at `head`; the caller holds the page's slot
    /// locked, so the member is live and the group with it.
    pub(in crate::device) fn read_member(
        &self,
        cache: &mut ReadCache,
        index: PageIndex,
        head: Handle,
        member: u8,
        out: &mut [u8; PAGE_SIZE],
    ) -> Result<(), IoError> {
        out.copy_from_slice(self.member_page(cache, index, head, member)?);
        Ok(())
    }

    /// Page `member` of the group at `head`, in `cache` (decompressed there unless it holds
    /// the group already); the caller holds the page's slot locked.
    fn member_page<'c>(
        &self,
        cache: &'c mut ReadCache,
        index: PageIndex,
        head: Handle,
        member: u8,
    ) -> Result<&'c [u8; PAGE_SIZE], IoError> {
        let header = super::header(&self.pool, head).map_err(|e| damaged(index, head, e))?;
        let at = usize::from(member) * PAGE_SIZE;
        let len = usize::from(header.pages) * PAGE_SIZE;
        if at >= len {
            return Err(IoError::Group {
                index,
                head: head.to_raw(),
                reason: "the page's place is past the group's end",
            });
        }
        let key = (head.to_raw(), header.stamp);
        if cache.key != Some(key) {
            cache.key = None;
            self.decompress_group(cache, index, head, header.codec)?;
            cache.key = Some(key);
            self.groups
                .decompressions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        cache.pages[at..at + PAGE_SIZE]
            .try_into()
            .map_err(|_| IoError::Group {
                index,
                head: head.to_raw(),
                reason: "the group's copy is shorter than its pages",
            })
    }

    fn decompress_group(
        &self,
        cache: &mut ReadCache,
        index: PageIndex,
        head: Handle,
        codec: u8,
    ) -> Result<(), IoError> {
        cache.frame.resize(GROUP_COMPRESS_BOUND, 0);
        cache.pages.resize(MAX_GROUP_LEN, 0);
        let header =
            super::load(&self.pool, head, &mut cache.frame).map_err(|e| damaged(index, head, e))?;
        let prio = usize::from(codec);
        let no_codec = IoError::NoCodec {
            index,
            priority: codec,
        };
        if cache.streams.len() <= prio {
            cache.streams.resize_with(prio + 1, || None);
        }
        let slot = &mut cache.streams[prio];
        if slot.is_none() {
            let c = self.codecs.get(prio).and_then(Option::as_ref);
            let c = c.ok_or(IoError::NoCodec {
                index,
                priority: codec,
            })?;
            *slot = Some(GroupStream::for_reads(c).map_err(IoError::Context)?);
        }
        let Some(stream) = slot.as_mut() else {
            return Err(no_codec);
        };
        let len = usize::from(header.pages) * PAGE_SIZE;
        stream
            .decompress(
                &cache.frame[..header.frame_len as usize],
                &mut cache.pages[..len],
            )
            .map_err(|source| IoError::Corrupt { index, source })
    }
}

/// A writeback batch's own means to write grouped pages back, for a thread that lends none
/// (the policy thread): a group copy and the group codecs' page streams, each made at its
/// first use. An eviction inside a write, and zram's `writeback`, lend their I/O context's.
#[derive(Default)]
pub(crate) struct AloneScratch {
    cache: ReadCache,
    streams: Vec<Option<Stream>>,
}

impl AloneScratch {
    /// The streams (codec `prio`'s made) and the group copy to write back a grouped page of
    /// `dev` whose group codec is `prio`.
    pub(in crate::device) fn lend(
        &mut self,
        dev: &Device,
        prio: u8,
    ) -> Result<(&mut [Option<Stream>], &mut ReadCache), ConfigError> {
        let p = usize::from(prio);
        if self.streams.len() < dev.codecs.len() {
            self.streams.resize_with(dev.codecs.len(), || None);
        }
        if let (Some(slot @ None), Some(Some(codec))) = (self.streams.get_mut(p), dev.codecs.get(p))
        {
            *slot = Some(codec.stream()?);
        }
        Ok((&mut self.streams, &mut self.cache))
    }
}

/// A grouped page compressed alone: its stored size, and whether it is stored raw (it did not
/// compress below the device's huge threshold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Alone {
    pub(crate) size: u16,
    pub(crate) huge: bool,
}

impl Device {
    /// Compresses grouped page `index` (state `s`, its slot locked by the caller, so its group
    /// is live) alone into `dst` (at least a page long) with its group's codec, the one its
    /// slot names (`streams` holds that codec's stream; `cache` is the group copy to read it
    /// from): what a recompression of the page alone would have made of it. Raw from the huge
    /// threshold on, as a write stores a page.
    pub(in crate::device) fn member_alone(
        &self,
        streams: &mut [Option<Stream>],
        cache: &mut ReadCache,
        index: PageIndex,
        s: &SlotState,
        dst: &mut [u8],
    ) -> Result<Alone, IoError> {
        let Held::Member { head, member } = s.held() else {
            return Err(IoError::Group {
                index,
                head: s.word,
                reason: "not a grouped page",
            });
        };
        let page = self.member_page(cache, index, head, member)?;
        let stream = streams
            .get_mut(usize::from(s.prio))
            .and_then(Option::as_mut)
            .ok_or(IoError::NoCodec {
                index,
                priority: s.prio,
            })?;
        match stream.compress(page, &mut dst[..PAGE_SIZE]) {
            Ok(n) if n < self.huge_threshold() => Ok(Alone {
                size: n as u16,
                huge: false,
            }),
            Ok(_) | Err(CodecError::DoesNotFit { .. }) => {
                dst[..PAGE_SIZE].copy_from_slice(page);
                Ok(Alone {
                    size: PAGE_SIZE as u16,
                    huge: true,
                })
            }
            Err(source) => Err(IoError::Compress { index, source }),
        }
    }
}
