//! lz4 through lz4_flex's block format: what the kernel's `lz4` backend stores (no frame, no
//! size header; the engine knows every page is [`PAGE_SIZE`] bytes).
//!
//! Per page, without a dictionary: no allocation; the stream's hash table is cleared (8 KiB).
//! With a dictionary, lz4_flex's `compress_into_with_dict` allocates a hash table and hashes the
//! dictionary's last 64 KiB on every call, as the kernel's `LZ4_loadDict()` per page does; zstd
//! is the better choice for dictionaries.

use lz4_flex::block::{self, CompressTable, DecompressError};

use crate::{Algorithm, CodecError, PAGE_SIZE};

/// What lz4_flex demands of every output buffer: the worst case for one page.
pub(crate) const COMPRESS_BOUND: usize = block::get_maximum_output_size(PAGE_SIZE);

/// Per-stream lz4 state.
pub(crate) struct Lz4Stream {
    table: CompressTable,
}

impl Lz4Stream {
    pub(crate) fn new() -> Self {
        Self {
            table: CompressTable::small(),
        }
    }

    /// Compresses into `dst`, which is at least [`COMPRESS_BOUND`] bytes (lz4_flex refuses a
    /// shorter output up front, whatever the input).
    pub(crate) fn compress(
        &mut self,
        dict: Option<&[u8]>,
        src: &[u8; PAGE_SIZE],
        dst: &mut [u8],
    ) -> Result<usize, CodecError> {
        let result = match dict {
            None => block::compress_into_with_table(src, dst, &mut self.table),
            Some(dict) => block::compress_into_with_dict(src, dst, dict),
        };
        // lz4_flex's only compression error is an output below the bound.
        result.map_err(|_| CodecError::Compress {
            algorithm: Algorithm::Lz4,
            reason: "output too small",
        })
    }

    #[inline]
    pub(crate) fn decompress(
        dict: Option<&[u8]>,
        src: &[u8],
        dst: &mut [u8; PAGE_SIZE],
    ) -> Result<(), CodecError> {
        let result = match dict {
            None => block::decompress_into(src, dst),
            Some(dict) => block::decompress_into_with_dict(src, dst, dict),
        };
        match result {
            Ok(PAGE_SIZE) => Ok(()),
            Ok(len_bytes) => Err(CodecError::ShortPage {
                algorithm: Algorithm::Lz4,
                len_bytes,
            }),
            Err(err) => Err(CodecError::Corrupt {
                algorithm: Algorithm::Lz4,
                reason: reason(&err),
            }),
        }
    }
}

fn reason(err: &DecompressError) -> &'static str {
    match err {
        DecompressError::OutputTooSmall { .. } => "decompresses to more than one page",
        DecompressError::LiteralOutOfBounds => "literal runs past the end of the input",
        DecompressError::ExpectedAnotherByte => "input ends in the middle of a sequence",
        DecompressError::OffsetZero => "match offset is 0",
        DecompressError::OffsetOutOfBounds => "match offset reaches before the start of the page",
        _ => "invalid block",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_page() -> Box<[u8; PAGE_SIZE]> {
        Box::new(crate::pages::text_page(0))
    }

    #[test]
    fn bound_is_what_lz4_flex_demands_for_a_page() {
        assert_eq!(COMPRESS_BOUND, 16 + 4 + PAGE_SIZE * 110 / 100);
        let mut stream = Lz4Stream::new();
        let mut dst = vec![0u8; COMPRESS_BOUND];
        let len = stream.compress(None, &text_page(), &mut dst).unwrap();
        assert!(len < PAGE_SIZE / 2);
        // Even a page that compresses well is refused a dst below the bound.
        assert!(stream
            .compress(None, &text_page(), &mut dst[..COMPRESS_BOUND - 1])
            .is_err());
    }

    #[test]
    fn output_is_plain_lz4_block_format() {
        let mut stream = Lz4Stream::new();
        let mut dst = vec![0u8; COMPRESS_BOUND];
        let len = stream.compress(None, &text_page(), &mut dst).unwrap();
        let raw = block::decompress(&dst[..len], PAGE_SIZE).unwrap();
        assert_eq!(raw[..], text_page()[..]);
    }

    #[test]
    fn every_decompress_error_has_a_reason() {
        let mut page = Box::new([0u8; PAGE_SIZE]);
        for src in [
            &[][..],
            &[0xf0][..],
            &[0x10, 0x41, 0, 0][..],
            &[0x1f, 0x41, 0xff, 0xff][..],
        ] {
            let err = Lz4Stream::decompress(None, src, &mut page).unwrap_err();
            assert!(
                matches!(
                    err,
                    CodecError::Corrupt {
                        algorithm: Algorithm::Lz4,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }
}
