//! A cold group's object in the pool: one compressed frame of up to 16 neighbouring pages (see
//! `docs/design/cold-groups.md` and [`uzram_codecs::GroupStream`]), cut into chunks of at most a
//! page so that the allocator needs no object larger than it has (full chunks cost exactly a
//! page in the huge class, the last its own class).
//!
//! The head chunk starts with a header that names the rest:
//!
//! | bytes | what |
//! |---|---|
//! | 0 | `b'G'` |
//! | 1 | format version, 1 |
//! | 2 | pages in the group (1..=16) |
//! | 3 | chunks (1..=[`MAX_CHUNKS`]) |
//! | 4 | the device's codec that made the frame (its index, as a slot's priority) |
//! | 5..8 | 0 |
//! | 8..12 | the frame's length, little-endian |
//! | 12..16 | a stamp: tells a decompressed copy of this group from one of an earlier group whose head had the same handle |
//! | 16.. | the raw handles of chunks 2.., 8 bytes each, little-endian |
//!
//! and the frame follows the header, then goes on in each further chunk in order. Handles are
//! stable across compaction (the pool moves objects, never renames them), so the head may hold
//! them.

use uzram_allocator::{Handle, Pool, MAX_OBJECT};
use uzram_codecs::{GROUP_COMPRESS_BOUND, MAX_GROUP_PAGES};

const MAGIC: u8 = b'G';
const VERSION: u8 = 1;
const FIXED: usize = 16;

/// The most chunks a group takes: its longest frame and its header (18).
pub(crate) const MAX_CHUNKS: usize = chunks_for(GROUP_COMPRESS_BOUND);

/// What a group's head says about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    /// Pages in the group.
    pub(crate) pages: u8,
    /// The codec that made the frame (an index into the device's codecs).
    pub(crate) codec: u8,
    /// The frame's length in bytes.
    pub(crate) frame_len: u32,
    /// Tells this group's decompressed copy from an earlier group's with the same head handle.
    pub(crate) stamp: u32,
    pub(crate) chunks: u8,
    rest: [u64; MAX_CHUNKS - 1],
}

impl Header {
    fn len_bytes(chunks: usize) -> usize {
        FIXED + 8 * (chunks - 1)
    }

    /// The chunks after the head.
    fn rest(&self) -> &[u64] {
        &self.rest[..usize::from(self.chunks) - 1]
    }

    /// The pool bytes a group of `frame_len` bytes asks for (header included), chunk by chunk:
    /// what [`store`] will allocate, for a caller weighing a group against its pages alone.
    pub(crate) fn chunk_sizes(frame_len: usize) -> impl Iterator<Item = usize> {
        let chunks = chunks_for(frame_len);
        let total = Self::len_bytes(chunks) + frame_len;
        (0..chunks).map(move |i| (total - i * MAX_OBJECT).min(MAX_OBJECT))
    }
}

/// A group's object could not be stored, read or freed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GroupError {
    /// The pool refused an allocation, a read or a free.
    #[error(transparent)]
    Pool(#[from] uzram_allocator::Error),
    /// The head does not hold a group's header, or its chunks do not match it.
    #[error("group at handle {head:#x} is damaged: {reason}")]
    Damaged {
        /// The head's raw handle.
        head: u64,
        /// What is wrong.
        reason: &'static str,
    },
    /// The frame does not fit the buffer given, or has no bytes, or the group no pages.
    #[error(
        "a group of {pages} pages with a {frame_len}-byte frame cannot be stored or read here"
    )]
    Shape {
        /// Pages asked for.
        pages: usize,
        /// The frame's length.
        frame_len: usize,
    },
}

/// The fewest chunks of at most [`MAX_OBJECT`] bytes that hold a frame of `frame_len` bytes and
/// its header: the least k with `FIXED + 8 (k - 1) + frame_len <= k MAX_OBJECT`, as each chunk
/// past the head costs the head 8 bytes of its table.
const fn chunks_for(frame_len: usize) -> usize {
    (frame_len + FIXED - 8).div_ceil(MAX_OBJECT - 8)
}

fn damaged(head: Handle, reason: &'static str) -> GroupError {
    GroupError::Damaged {
        head: head.to_raw(),
        reason,
    }
}

/// Stores `frame` (a [`uzram_codecs::GroupStream`] frame of `pages` pages, made by the device's
/// codec `codec`) as a group; returns the head chunk's handle. On error nothing stays allocated.
pub(crate) fn store(
    pool: &Pool,
    frame: &[u8],
    pages: usize,
    codec: u8,
    stamp: u32,
) -> Result<Handle, GroupError> {
    let shape = || GroupError::Shape {
        pages,
        frame_len: frame.len(),
    };
    if frame.is_empty()
        || frame.len() > GROUP_COMPRESS_BOUND
        || !(1..=MAX_GROUP_PAGES).contains(&pages)
    {
        return Err(shape());
    }
    let chunks = chunks_for(frame.len());
    let head_room = MAX_OBJECT - Header::len_bytes(chunks);
    let (first, later) = frame.split_at(head_room.min(frame.len()));
    let mut rest = Vec::with_capacity(chunks - 1);
    for part in later.chunks(MAX_OBJECT) {
        match pool.store(part) {
            Ok(h) => rest.push(h),
            Err(e) => {
                free_all(pool, &rest);
                return Err(e.into());
            }
        }
    }
    let mut head = Vec::with_capacity(Header::len_bytes(chunks) + first.len());
    head.extend_from_slice(&[MAGIC, VERSION, pages as u8, chunks as u8, codec, 0, 0, 0]);
    head.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    head.extend_from_slice(&stamp.to_le_bytes());
    for h in &rest {
        head.extend_from_slice(&h.to_raw().to_le_bytes());
    }
    head.extend_from_slice(first);
    pool.store(&head).map_err(|e| {
        free_all(pool, &rest);
        GroupError::from(e)
    })
}

fn free_all(pool: &Pool, handles: &[Handle]) {
    for &h in handles {
        // Just allocated by this module: a free cannot find it invalid.
        let _ = pool.free(h);
    }
}

/// Reads and checks the header at `head`.
pub(crate) fn header(pool: &Pool, head: Handle) -> Result<Header, GroupError> {
    pool.read(head, |obj| {
        let fixed = obj
            .get(..FIXED)
            .ok_or(damaged(head, "shorter than a header"))?;
        if fixed[0] != MAGIC || fixed[1] != VERSION {
            return Err(damaged(head, "no group header (magic or version)"));
        }
        let (pages, chunks) = (fixed[2], usize::from(fixed[3]));
        if !(1..=MAX_GROUP_PAGES).contains(&usize::from(pages))
            || !(1..=MAX_CHUNKS).contains(&chunks)
        {
            return Err(damaged(head, "page or chunk count out of range"));
        }
        let frame_len = u32::from_le_bytes(fixed[8..12].try_into().expect("4 bytes"));
        if frame_len == 0
            || frame_len as usize > GROUP_COMPRESS_BOUND
            || chunks_for(frame_len as usize) != chunks
        {
            return Err(damaged(head, "frame length and chunk count disagree"));
        }
        let mut rest = [0u64; MAX_CHUNKS - 1];
        let table = obj
            .get(FIXED..Header::len_bytes(chunks))
            .ok_or(damaged(head, "head shorter than its chunk table"))?;
        for (slot, raw) in rest.iter_mut().zip(table.chunks_exact(8)) {
            *slot = u64::from_le_bytes(raw.try_into().expect("8 bytes"));
        }
        Ok(Header {
            pages,
            codec: fixed[4],
            frame_len,
            stamp: u32::from_le_bytes(fixed[12..16].try_into().expect("4 bytes")),
            chunks: chunks as u8,
            rest,
        })
    })?
}

/// Copies the group's frame at `head` into the start of `frame` (at least the header's
/// `frame_len` bytes) and returns its header. Every chunk's size is checked against the header.
pub(crate) fn load(pool: &Pool, head: Handle, frame: &mut [u8]) -> Result<Header, GroupError> {
    let header = header(pool, head)?;
    let frame_len = header.frame_len as usize;
    let out = frame.get_mut(..frame_len).ok_or(GroupError::Shape {
        pages: header.pages.into(),
        frame_len,
    })?;
    let mut sizes = Header::chunk_sizes(frame_len);
    let (head_size, start) = (
        sizes.next().unwrap_or(0),
        Header::len_bytes(header.chunks.into()),
    );
    let mut at = pool.read(head, |obj| {
        if obj.len() != head_size {
            return Err(damaged(head, "head chunk of the wrong size"));
        }
        out[..obj.len() - start].copy_from_slice(&obj[start..]);
        Ok(obj.len() - start)
    })??;
    for (h, size) in chunk_handles(&header, head)?
        .into_iter()
        .flatten()
        .zip(sizes)
    {
        let n = pool.read(h, |obj| {
            let dst = out
                .get_mut(at..at + obj.len())
                .filter(|_| obj.len() == size);
            dst.map(|dst| dst.copy_from_slice(obj)).map(|()| obj.len())
        })?;
        at += n.ok_or(damaged(head, "a chunk of the wrong size"))?;
    }
    Ok(header)
}

/// The chunks after the head as handles (`None` past the last), or why one is not a handle.
fn chunk_handles(
    header: &Header,
    head: Handle,
) -> Result<[Option<Handle>; MAX_CHUNKS - 1], GroupError> {
    let mut handles = [None; MAX_CHUNKS - 1];
    for (slot, &raw) in handles.iter_mut().zip(header.rest()) {
        *slot = Some(Handle::from_raw(raw).ok_or(damaged(head, "a chunk handle of 0"))?);
    }
    Ok(handles)
}

/// Checks every chunk of the group at `head`: distinct (the head included), live, and of the
/// size the header gives it. Returns the header and the chunks after the head.
pub(crate) fn verify(
    pool: &Pool,
    head: Handle,
) -> Result<(Header, [Option<Handle>; MAX_CHUNKS - 1]), GroupError> {
    let header = header(pool, head)?;
    let handles = chunk_handles(&header, head)?;
    let all = || std::iter::once(head).chain(handles.into_iter().flatten());
    // A table naming one object twice (or the head) would pass the size check and free it twice.
    if all()
        .enumerate()
        .any(|(i, h)| all().skip(i + 1).any(|o| o == h))
    {
        return Err(damaged(head, "a chunk named twice"));
    }
    for (h, size) in all().zip(Header::chunk_sizes(header.frame_len as usize)) {
        if pool.object_size(h)? != size {
            return Err(damaged(head, "a chunk of the wrong size"));
        }
    }
    Ok((header, handles))
}

/// Frees every chunk of the group at `head`, the head last; returns the pool bytes its objects
/// asked for. Every chunk is [`verify`]d first, so a damaged table that those checks see frees
/// nothing. (A table naming another live object of exactly a chunk's size cannot be told from
/// a good one here: adoption, once it learns groups, must check that no object is named twice
/// across the slots and the groups.)
pub(crate) fn free(pool: &Pool, head: Handle) -> Result<usize, GroupError> {
    let (header, handles) = verify(pool, head)?;
    for h in handles.into_iter().flatten() {
        pool.free(h)?;
    }
    pool.free(head)?;
    Ok(Header::chunk_sizes(header.frame_len as usize).sum())
}

mod check;
#[cfg(test)]
mod device_tests;
mod estimate;
mod make;
mod read;
mod table;
#[cfg(test)]
mod tests;

pub(crate) use check::{Adopted, Members};
pub use estimate::{GroupEstimate, MIN_GROUP_PAGES};
pub use make::GroupPass;
pub(crate) use make::Grouper;
pub(crate) use read::{Alone, AloneScratch, ReadCache};
pub(crate) use table::{Dropped, Groups};
