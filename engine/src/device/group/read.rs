//! Reads of a grouped page: the group is decompressed once into the I/O context's copy, which
//! is kept, so the neighbours that swap readahead asks for next cost a copy.
//!
//! A grouped page written back goes on its own ([`Device::member_alone`]): its group is
//! decompressed (once for the neighbours a batch takes with it) and the page compressed alone
//! with the primary codec, so that its record on the store is what it would have been had it
//! never been grouped: the same bytes on disk, and a read back that needs no group.

use uzram_allocator::Handle;
use uzram_codecs::{CodecError, GroupStream, Stream, GROUP_COMPRESS_BOUND, MAX_GROUP_LEN};

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
        out.copy_from_slice(&cache.pages[at..at + PAGE_SIZE]);
        Ok(())
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

/// What a batch needs to write grouped pages back: made at the first one, then kept with the
/// batch's buffers (a batch that meets no grouped page allocates nothing for them).
#[derive(Default)]
pub(crate) struct AloneScratch {
    cache: ReadCache,
    primary: Option<Stream>,
    page: Option<Box<[u8; PAGE_SIZE]>>,
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
    /// is live) alone with the primary codec into `dst` (at least a page long).
    pub(in crate::device) fn member_alone(
        &self,
        m: &mut AloneScratch,
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
        let page = m.page.get_or_insert_with(|| Box::new([0; PAGE_SIZE]));
        self.read_member(&mut m.cache, index, head, member, page)?;
        if m.primary.is_none() {
            let codec = self.codecs[0]
                .as_ref()
                .ok_or(IoError::NoCodec { index, priority: 0 })?;
            m.primary = Some(codec.stream().map_err(IoError::Context)?);
        }
        let stream = m
            .primary
            .as_mut()
            .ok_or(IoError::NoCodec { index, priority: 0 })?;
        // As a write stores it: compressed, or raw from the huge threshold on.
        match stream.compress(page, &mut dst[..PAGE_SIZE]) {
            Ok(n) if n < self.huge_threshold() => Ok(Alone {
                size: n as u16,
                huge: false,
            }),
            Ok(_) | Err(CodecError::DoesNotFit { .. }) => {
                dst[..PAGE_SIZE].copy_from_slice(&page[..]);
                Ok(Alone {
                    size: PAGE_SIZE as u16,
                    huge: true,
                })
            }
            Err(source) => Err(IoError::Compress { index, source }),
        }
    }
}
