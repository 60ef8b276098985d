//! Runs of neighbouring pages compressed as one frame: what a cold group stores.
//!
//! A page compressed alone cannot refer to its neighbours; a run of them compressed together
//! can, and a heap's neighbouring pages repeat each other's strings, layouts and pointers (zstd
//! over 16-page runs stored 30 % fewer bytes than page by page on a dumped `cargo` heap, see
//! `docs/design/cold-groups.md`). One frame per run, in the codec's own format (an lz4 block, a
//! zstd frame); a codec's dictionary is trained for single pages and is not used here. zstd
//! groups take the level the codec was given, or [`GROUP_ZSTD_LEVEL`] where it was given none:
//! a group is made once, from pages that have gone cold, and read rarely, and zstd's
//! decompression costs the same at every level.
//!
//! A [`GroupStream`] has its own contexts: zstd sizes a context's workspace from the source
//! length, so a page [`Stream`](crate::Stream) that compressed a group would allocate on its
//! next page, and its page-sized state would not hold a group's. Made once per thread that
//! groups or reads groups. lz4 never allocates after [`GroupStream::new`]; zstd sizes its
//! workspace for the longest run at `new`, but may shrink it after many shorter runs and grow
//! it again on the next long one.

use lz4_flex::block::{self, CompressTable};
use zstd::zstd_safe::{self, CCtx, DCtx};

use crate::{Algorithm, Codec, CodecError, ConfigError, PAGE_SIZE};

/// The most pages one group holds: 16 stored 30 % fewer bytes than page by page on a real heap
/// (zstd) for about ten times one page's decompression; 32 gained 4 % more for twice the read.
pub const MAX_GROUP_PAGES: usize = 16;

/// The zstd level of a group whose codec was given no level (zstd's own default, 3, is for
/// pages compressed as they are written). Measured on the checked-in sample and three dumped
/// heaps (docs/design/cold-groups.md): against level 3, groups at 6 stored 4.6-6.6 % fewer
/// bytes and at 9 5.4-8.4 % fewer, for 2-5 times the compression time.
pub const GROUP_ZSTD_LEVEL: i32 = 9;

/// The size (log2 of entries) of zstd's match-finder tables for groups at [`GROUP_ZSTD_LEVEL`]:
/// level 9 sizes them for its 64 KiB input at 2^16 and 2^17 entries, a context of 973 KiB that
/// the thread that makes groups keeps; at 2^15 it is 493 KiB, for 0.13 % more bytes on the
/// checked-in sample. A level given explicitly keeps zstd's own tables.
pub const GROUP_ZSTD_TABLE_LOG: u32 = 15;

/// The longest run, in bytes.
pub const MAX_GROUP_LEN: usize = MAX_GROUP_PAGES * PAGE_SIZE;

/// A `dst` this long always holds a compressed group of any codec (lz4's worst case is the
/// larger: zstd's for 64 KiB is 64 KiB + 256 + 32).
pub const GROUP_COMPRESS_BOUND: usize = block::get_maximum_output_size(MAX_GROUP_LEN);

/// One thread's state for compressing and decompressing groups with one codec's algorithm and
/// level.
pub struct GroupStream {
    algorithm: Algorithm,
    state: GroupState,
}

enum GroupState {
    /// The compression table (`None` in a stream made for reads).
    Lz4(Option<Box<CompressTable>>),
    Zstd {
        /// `None` in a stream made for reads: a context sized for 64 KiB runs costs hundreds of
        /// KiB, and only the thread that makes groups needs one.
        cctx: Option<CCtx<'static>>,
        /// Made at once in a stream for reads (a read allocates nothing), at its first frame in
        /// one that compresses (93 KiB the thread that makes groups does not need).
        dctx: Option<DCtx<'static>>,
    },
}

impl GroupStream {
    /// A stream for `codec`'s algorithm, at the level it was given (for zstd without one,
    /// [`GROUP_ZSTD_LEVEL`]). zstd's workspace is allocated here, by compressing a whole group
    /// of zeros once.
    /// zstd's frames carry its checksum (4 bytes a group), so that a frame put together from
    /// the wrong chunks fails its read instead of decoding to other bytes.
    pub fn new(codec: &Codec) -> Result<Self, ConfigError> {
        let algorithm = codec.algorithm();
        let out_of_memory = ConfigError::OutOfMemory { algorithm };
        let state = match algorithm {
            Algorithm::Lz4 => GroupState::Lz4(Some(Box::new(CompressTable::large()))),
            Algorithm::Zstd => {
                let mut cctx = CCtx::try_create().ok_or(out_of_memory.clone())?;
                let tables = match codec.params().level {
                    Some(_) => vec![],
                    None => vec![
                        zstd_safe::CParameter::HashLog(GROUP_ZSTD_TABLE_LOG),
                        zstd_safe::CParameter::ChainLog(GROUP_ZSTD_TABLE_LOG),
                    ],
                };
                [
                    zstd_safe::CParameter::ChecksumFlag(true),
                    zstd_safe::CParameter::CompressionLevel(Self::level(codec)),
                ]
                .into_iter()
                .chain(tables)
                .try_for_each(|p| cctx.set_parameter(p).map(drop))
                .map_err(|_| out_of_memory.clone())?;
                GroupState::Zstd {
                    cctx: Some(cctx),
                    dctx: None,
                }
            }
        };
        let mut stream = Self { algorithm, state };
        let mut warm_up = vec![0u8; GROUP_COMPRESS_BOUND];
        stream
            .compress(&vec![0u8; MAX_GROUP_LEN], &mut warm_up)
            .map_err(|_| out_of_memory)?;
        Ok(stream)
    }

    /// The level groups of `codec` are compressed at: the one it was given, or for zstd
    /// [`GROUP_ZSTD_LEVEL`] (lz4's block format has no level).
    pub fn level(codec: &Codec) -> i32 {
        match (codec.algorithm(), codec.params().level) {
            (_, Some(level)) => level,
            (Algorithm::Zstd, None) => GROUP_ZSTD_LEVEL,
            (Algorithm::Lz4, None) => codec.level(),
        }
    }

    /// A stream that only decompresses (its [`GroupStream::compress`] fails): what a thread
    /// that reads grouped pages needs, without a compression context's memory.
    pub fn for_reads(codec: &Codec) -> Result<Self, ConfigError> {
        let algorithm = codec.algorithm();
        let state = match algorithm {
            Algorithm::Lz4 => GroupState::Lz4(None),
            Algorithm::Zstd => GroupState::Zstd {
                cctx: None,
                dctx: Some(DCtx::try_create().ok_or(ConfigError::OutOfMemory { algorithm })?),
            },
        };
        Ok(Self { algorithm, state })
    }

    /// Bytes its contexts hold (zstd's; lz4's table is fixed), for tests and accounting.
    pub fn context_bytes(&self) -> usize {
        match &self.state {
            GroupState::Lz4(t) => t
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<CompressTable>()),
            GroupState::Zstd { cctx, dctx } => {
                cctx.as_ref().map_or(0, |c| c.sizeof()) + dctx.as_ref().map_or(0, |d| d.sizeof())
            }
        }
    }

    /// The algorithm the groups are compressed with.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Compresses `pages` (1 to [`MAX_GROUP_PAGES`] whole pages, back to back) into `dst`, which
    /// must be at least [`GROUP_COMPRESS_BOUND`] bytes; returns the frame's length.
    pub fn compress(&mut self, pages: &[u8], dst: &mut [u8]) -> Result<usize, CodecError> {
        let algorithm = self.algorithm;
        if !whole_run(pages.len()) {
            return Err(CodecError::NotARun {
                algorithm,
                len_bytes: pages.len(),
            });
        }
        if dst.len() < GROUP_COMPRESS_BOUND {
            return Err(CodecError::DoesNotFit {
                algorithm,
                dst_len: dst.len(),
            });
        }
        let reads_only = CodecError::Compress {
            algorithm,
            reason: "a stream made for reads",
        };
        match &mut self.state {
            GroupState::Lz4(None) | GroupState::Zstd { cctx: None, .. } => Err(reads_only),
            GroupState::Lz4(Some(table)) => block::compress_into_with_table(pages, dst, table)
                .map_err(|_| CodecError::Compress {
                    algorithm,
                    reason: "output too small",
                }),
            // Level and checksum flag as `new` set them.
            GroupState::Zstd {
                cctx: Some(cctx), ..
            } => cctx
                .compress2(dst, pages)
                .map_err(|code| CodecError::Compress {
                    algorithm,
                    reason: zstd_safe::get_error_name(code),
                }),
        }
    }

    /// Decompresses the frame `src` into `dst`, which is exactly as long as the run it was made
    /// from (1 to [`MAX_GROUP_PAGES`] whole pages). A frame that is corrupt, or that holds
    /// more or fewer bytes than `dst`, is an error, never a panic; on error `dst` is zeroed.
    pub fn decompress(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let algorithm = self.algorithm;
        if !whole_run(dst.len()) {
            return Err(CodecError::NotARun {
                algorithm,
                len_bytes: dst.len(),
            });
        }
        let want = dst.len();
        let result = match &mut self.state {
            GroupState::Lz4(_) => block::decompress_into(src, dst).map_err(|_| "invalid block"),
            GroupState::Zstd { dctx, .. } => {
                if dctx.is_none() {
                    *dctx = DCtx::try_create();
                }
                let Some(dctx) = dctx.as_mut() else {
                    dst.fill(0);
                    return Err(CodecError::NoContext { algorithm });
                };
                dctx.decompress(&mut *dst, src)
                    .map_err(zstd_safe::get_error_name)
            }
        };
        let result = match result {
            Ok(len_bytes) if len_bytes == want => Ok(()),
            Ok(len_bytes) => Err(CodecError::ShortRun {
                algorithm,
                len_bytes,
                want,
            }),
            Err(reason) => Err(CodecError::Corrupt { algorithm, reason }),
        };
        if result.is_err() {
            dst.fill(0);
        }
        result
    }
}

fn whole_run(len_bytes: usize) -> bool {
    len_bytes > 0 && len_bytes <= MAX_GROUP_LEN && len_bytes % PAGE_SIZE == 0
}

#[cfg(test)]
mod tests;
