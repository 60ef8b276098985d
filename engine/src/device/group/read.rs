//! Reads of a grouped page: the group is decompressed once into the I/O context's copy, which
//! is kept, so the neighbours that swap readahead asks for next cost a copy.

use uzram_allocator::Handle;
use uzram_codecs::{GroupStream, GROUP_COMPRESS_BOUND, MAX_GROUP_LEN};

use super::GroupError;
use crate::device::{Device, PageIndex, PAGE_SIZE};
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
