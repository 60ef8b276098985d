//! Page codecs for uzram: lz4 and zstd, with levels and dictionaries, behind per-thread streams.
//!
//! - [`Codec`]: an [`Algorithm`] with its [`CodecParams`] (level, dictionary), validated and
//!   prepared once; cheap to clone and share between threads (zram's `zcomp`).
//! - [`Stream`]: one thread's contexts and buffers for a codec (zram's `zcomp_strm`), made
//!   with [`Codec::stream`]. [`Stream::compress`] takes a [`PAGE_SIZE`] page and a `dst` of
//!   any length, [`Stream::decompress`] fills exactly one page or fails.
//! - [`GroupStream`]: a run of up to [`MAX_GROUP_PAGES`] neighbouring pages compressed as one
//!   frame (a cold group), with a codec's algorithm and level.
//! - [`AlgorithmParams`]: zram's `algorithm_params` attribute (`algo=zstd level=3 dict=PATH`),
//!   parsed; [`train_dictionary`] makes a dictionary from sample pages.
//!
//! ```
//! use uzram_codecs::{Algorithm, AlgorithmParams, Codec, CodecError, PAGE_SIZE};
//!
//! let algorithm: Algorithm = "zstd".parse()?;
//! let params: AlgorithmParams = "level=-1".parse()?;
//! let codec = Codec::new(algorithm, params.load_codec_params()?)?;
//! let mut stream = codec.stream()?; // one per thread
//!
//! let mut page = [0u8; PAGE_SIZE];
//! page[..13].copy_from_slice(b"hello, world!");
//! // The engine passes a dst just below its huge-page threshold.
//! let mut dst = [0u8; 3 * PAGE_SIZE / 4];
//! let len = match stream.compress(&page, &mut dst) {
//!     Ok(len) => len,
//!     Err(CodecError::DoesNotFit { .. }) => unreachable!("store the page as HUGE"),
//!     Err(err) => return Err(err.into()),
//! };
//!
//! let mut out = [0u8; PAGE_SIZE];
//! stream.decompress(&dst[..len], &mut out)?;
//! assert_eq!(out, page);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Invariants
//!
//! - **No allocation per page.** [`Codec::stream`] allocates the contexts; their calls reuse
//!   them (the one exception, lz4 with a dictionary, is documented on [`Stream`]).
//! - **A decompressed page is whole or absent.** [`Stream::decompress`] succeeds only when
//!   the input decodes to exactly [`PAGE_SIZE`] bytes, and zeroes `dst` when it fails; corrupt
//!   input is an error, never a panic.
//! - **Formats are the kernel's.** lz4 pages are plain LZ4 blocks, zstd pages are plain zstd
//!   frames: what the kernel's `lz4` and `zstd` backends store.
//! - **No unsafe code here.** The unsafe lives in lz4_flex (built with `checked-decode`, which
//!   bounds-checks corrupt input) and in libzstd.
//!
//! This crate knows nothing of allocation or of the device: it turns pages into bytes and back.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod algorithm;
mod backend_lz4;
mod backend_zstd;
mod codec;
mod dict;
mod error;
mod estimate;
#[cfg(feature = "testing")]
pub mod fuzzing;
mod group;
#[cfg(any(test, feature = "testing"))]
pub mod pages;
mod params;
mod warm;

pub use algorithm::{Algorithm, UnknownAlgorithm};
pub use codec::{Codec, Stream};
pub use dict::{train_dictionary, MIN_DICT_LEN};
pub use error::{CodecError, ConfigError};
pub use estimate::looks_incompressible;
pub use group::{
    GroupStream, GROUP_COMPRESS_BOUND, GROUP_ZSTD_LEVEL, GROUP_ZSTD_TABLE_LOG, MAX_GROUP_LEN,
    MAX_GROUP_PAGES,
};
pub use params::{
    param_keys, read_dictionary, AlgorithmParams, CodecParams, ParamsError, MAX_COMPS, MAX_DICT_LEN,
};

/// The backends, at the versions this crate links, for benches that compare against them.
#[doc(hidden)]
pub mod backends {
    pub use lz4_flex;
    pub use zstd;
}

/// The size of a page: what [`Stream::compress`] takes and [`Stream::decompress`] produces.
pub const PAGE_SIZE: usize = 4096;

/// A `dst` at least this long always holds a compressed page, whatever the algorithm (the
/// largest of the algorithms' worst cases, lz4's).
pub const MAX_COMPRESSED_LEN: usize = backend_lz4::COMPRESS_BOUND;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_compressed_len_covers_every_algorithm() {
        assert!(zstd::zstd_safe::compress_bound(PAGE_SIZE) <= MAX_COMPRESSED_LEN);
        assert_eq!(
            lz4_flex::block::get_maximum_output_size(PAGE_SIZE),
            MAX_COMPRESSED_LEN
        );
    }
}
