//! zstd through libzstd's one-shot context calls, as the kernel's `zstd` backend does.
//!
//! A dictionary is prepared once per [`Codec`](crate::Codec) as a `ZSTD_CDict` (which bakes in
//! the level) and a `ZSTD_DDict`, shared by all streams; each call passes them by reference
//! (`ZSTD_compress_usingCDict`, `ZSTD_decompress_usingDDict`), so nothing is reloaded per page.
//!
//! Per page: no allocation. A `ZSTD_CCtx` sizes its workspace from the level, the dictionary and
//! the source size, all fixed for a stream, so the warm-up compression in [`ZstdStream::new`]
//! allocates it once and later calls reuse it. A one-shot `ZSTD_decompressDCtx` writes straight
//! into `dst` and does not allocate (legacy format support, which would, is not built).

use zstd::zstd_safe::zstd_sys::ZSTD_ErrorCode;
use zstd::zstd_safe::{self, CCtx, CDict, DCtx, DDict};

use crate::{Algorithm, CodecError, ConfigError, PAGE_SIZE};

/// `ZSTD_COMPRESSBOUND(PAGE_SIZE)`: a `dst` this long always holds a compressed page. A shorter
/// one may be refused even when the output would fit, because zstd's entropy coders want some
/// slack at the end of `dst`.
pub(crate) const COMPRESS_BOUND: usize =
    PAGE_SIZE + (PAGE_SIZE >> 8) + (((128 << 10) - PAGE_SIZE) >> 11);

/// A dictionary prepared for compression at one level, and for decompression.
pub(crate) struct ZstdDicts {
    cdict: CDict<'static>,
    ddict: DDict<'static>,
}

impl ZstdDicts {
    pub(crate) fn new(dict: &[u8], level: i32) -> Result<Self, ConfigError> {
        let invalid = || ConfigError::InvalidDictionary {
            algorithm: Algorithm::Zstd,
            len_bytes: dict.len(),
        };
        let cdict = CDict::try_create(dict, level).ok_or_else(invalid)?;
        let ddict = DDict::try_create(dict).ok_or_else(invalid)?;
        Ok(Self { cdict, ddict })
    }
}

/// Per-stream zstd state: one context each way.
pub(crate) struct ZstdStream {
    cctx: CCtx<'static>,
    dctx: DCtx<'static>,
    level: i32,
}

impl ZstdStream {
    pub(crate) fn new(level: i32, dicts: Option<&ZstdDicts>) -> Result<Self, ConfigError> {
        let mut stream = Self::unwarmed(level)?;
        // Allocate the compression workspace now rather than on the first page.
        stream.warm_compression(dicts)?;
        Ok(stream)
    }

    /// Its contexts, the compression workspace not yet made (zstd makes it at the first
    /// compression, or at [`ZstdStream::warm_compression`]).
    pub(crate) fn unwarmed(level: i32) -> Result<Self, ConfigError> {
        let out_of_memory = ConfigError::OutOfMemory {
            algorithm: Algorithm::Zstd,
        };
        let cctx = CCtx::try_create().ok_or(out_of_memory.clone())?;
        let dctx = DCtx::try_create().ok_or(out_of_memory)?;
        Ok(Self { cctx, dctx, level })
    }

    /// Writes the decompression context (its entropy tables among it) by decoding the warm-up
    /// frame, which uses them (`warm.rs`).
    pub(crate) fn warm_decompression(&mut self) -> Result<(), ConfigError> {
        let mut page = [0u8; PAGE_SIZE];
        self.dctx
            .decompress(&mut page[..], crate::warm::WARM_FRAME)
            .map(drop)
            .map_err(|_| ConfigError::OutOfMemory {
                algorithm: Algorithm::Zstd,
            })
    }

    /// Makes the compression workspace and faults it in, by compressing a page (once it is
    /// made, a page costs the same).
    pub(crate) fn warm_compression(
        &mut self,
        dicts: Option<&ZstdDicts>,
    ) -> Result<(), ConfigError> {
        let mut warm_up = [0u8; COMPRESS_BOUND];
        self.compress(dicts, &crate::warm::WARM_PAGE, &mut warm_up)
            .map(drop)
            .map_err(|_| ConfigError::OutOfMemory {
                algorithm: Algorithm::Zstd,
            })
    }

    /// Bytes its two contexts hold.
    pub(crate) fn context_bytes(&self) -> usize {
        self.cctx.sizeof() + self.dctx.sizeof()
    }

    /// Compresses into `dst`, which is at least [`COMPRESS_BOUND`] bytes.
    pub(crate) fn compress(
        &mut self,
        dicts: Option<&ZstdDicts>,
        src: &[u8; PAGE_SIZE],
        dst: &mut [u8],
    ) -> Result<usize, CodecError> {
        let result = match dicts {
            None => self.cctx.compress(dst, src, self.level),
            Some(dicts) => self.cctx.compress_using_cdict(dst, src, &dicts.cdict),
        };
        result.map_err(|code| CodecError::Compress {
            algorithm: Algorithm::Zstd,
            reason: zstd_safe::get_error_name(code),
        })
    }

    pub(crate) fn decompress(
        &mut self,
        dicts: Option<&ZstdDicts>,
        src: &[u8],
        dst: &mut [u8; PAGE_SIZE],
    ) -> Result<(), CodecError> {
        let dst = &mut dst[..];
        let result = match dicts {
            None => self.dctx.decompress(dst, src),
            Some(dicts) => self.dctx.decompress_using_ddict(dst, src, &dicts.ddict),
        };
        match result {
            Ok(PAGE_SIZE) => Ok(()),
            Ok(len_bytes) => Err(CodecError::ShortPage {
                algorithm: Algorithm::Zstd,
                len_bytes,
            }),
            Err(code) => {
                let reason = if zstd_safe::is_error_kind(
                    code,
                    ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall,
                ) {
                    "decompresses to more than one page"
                } else {
                    zstd_safe::get_error_name(code)
                };
                Err(CodecError::Corrupt {
                    algorithm: Algorithm::Zstd,
                    reason,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_a_plain_zstd_frame() {
        let mut stream = ZstdStream::new(3, None).unwrap();
        let page = [b'z'; PAGE_SIZE];
        let mut dst = [0u8; 64];
        let len = stream.compress(None, &page, &mut dst).unwrap();
        assert_eq!(zstd::decode_all(&dst[..len]).unwrap(), page);
    }

    #[test]
    fn bound_is_zstds() {
        assert_eq!(COMPRESS_BOUND, zstd_safe::compress_bound(PAGE_SIZE));
    }

    #[test]
    fn zstd_wants_slack_beyond_the_output() {
        // Why Stream compresses through a scratch buffer when dst is short: a text page whose
        // output would fit exactly is refused.
        let mut stream = ZstdStream::new(3, None).unwrap();
        let page = crate::pages::text_page(9);
        let mut dst = [0u8; COMPRESS_BOUND];
        let len = stream.compress(None, &page, &mut dst).unwrap();
        assert!(stream.compress(None, &page, &mut dst[..len]).is_err());
    }

    #[test]
    fn corrupt_dictionary_header_is_rejected() {
        // The zstd dictionary magic number followed by garbage.
        let mut dict = vec![0x37, 0xa4, 0x30, 0xec];
        dict.extend([0xff; 60]);
        assert!(matches!(
            ZstdDicts::new(&dict, 3),
            Err(ConfigError::InvalidDictionary {
                algorithm: Algorithm::Zstd,
                len_bytes: 64
            })
        ));
    }
}
