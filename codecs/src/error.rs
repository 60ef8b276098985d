//! Errors of setting a codec up ([`ConfigError`]) and of the I/O path ([`CodecError`]).

use crate::{Algorithm, PAGE_SIZE};

/// A page could not be compressed or decompressed. This is the I/O path's error: it is `Copy`
/// and carries no heap data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The compressed page is longer than the `dst` the caller passed. Not a failure: the engine
    /// passes a `dst` just below its huge-page threshold and stores the page uncompressed
    /// (`HUGE`) when it gets this.
    #[error("{algorithm} output does not fit in {dst_len} bytes")]
    DoesNotFit {
        /// The algorithm that was compressing.
        algorithm: Algorithm,
        /// The length of the `dst` that was too short.
        dst_len: usize,
    },
    /// The compressor failed for a reason other than the size of `dst` (zstd out of memory).
    #[error("{algorithm} compression failed: {reason}")]
    Compress {
        /// The algorithm that failed.
        algorithm: Algorithm,
        /// The backend's reason, e.g. zstd's error name.
        reason: &'static str,
    },
    /// The compressed data is not valid for this codec: corrupt, truncated, made with another
    /// dictionary, or longer than one page once decompressed.
    #[error("{algorithm} data is corrupt: {reason}")]
    Corrupt {
        /// The algorithm that was decompressing.
        algorithm: Algorithm,
        /// The backend's reason, e.g. zstd's error name.
        reason: &'static str,
    },
    /// The compressed data is valid but decompresses to less than one page.
    #[error(
        "{algorithm} data decompresses to {len_bytes} bytes instead of a {PAGE_SIZE}-byte page"
    )]
    ShortPage {
        /// The algorithm that was decompressing.
        algorithm: Algorithm,
        /// How many bytes it decompressed to.
        len_bytes: usize,
    },
    /// A group's run of pages is not 1 to 16 whole pages (see
    /// [`GroupStream`](crate::GroupStream)).
    #[error("{algorithm} group of {len_bytes} bytes is not a run of 1 to 16 whole pages")]
    NotARun {
        /// The group stream's algorithm.
        algorithm: Algorithm,
        /// The length given.
        len_bytes: usize,
    },
    /// A group's frame is valid but holds fewer bytes than the run it is read into.
    #[error("{algorithm} group decompresses to {len_bytes} bytes instead of {want}")]
    ShortRun {
        /// The group stream's algorithm.
        algorithm: Algorithm,
        /// How many bytes it decompressed to.
        len_bytes: usize,
        /// The run's length.
        want: usize,
    },
    /// A context made at its first use could not be allocated.
    #[error("{algorithm} could not allocate a decompression context: out of memory")]
    NoContext {
        /// The codec.
        algorithm: Algorithm,
    },
}

/// A codec could not be set up: a level out of range, a dictionary the backend rejects, a
/// context that could not be allocated, or dictionary training that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `level=` is outside what the algorithm accepts.
    #[error("{algorithm} level {level} is out of range: use {min} to {max}")]
    LevelOutOfRange {
        /// The algorithm the level was given for.
        algorithm: Algorithm,
        /// The level asked for.
        level: i32,
        /// The lowest accepted level.
        min: i32,
        /// The highest accepted level.
        max: i32,
    },
    /// A dictionary of zero bytes: give none instead.
    #[error("the dictionary is empty")]
    EmptyDictionary,
    /// The backend rejected the dictionary (zstd: it starts with the zstd dictionary magic
    /// number but its header is corrupt), or ran out of memory preparing it.
    #[error("{algorithm} rejected the {len_bytes}-byte dictionary: corrupt header or no memory")]
    InvalidDictionary {
        /// The algorithm that rejected it.
        algorithm: Algorithm,
        /// The dictionary's length.
        len_bytes: usize,
    },
    /// The backend could not allocate its compression or decompression context.
    #[error("{algorithm} could not allocate a stream context: out of memory")]
    OutOfMemory {
        /// The algorithm whose context failed.
        algorithm: Algorithm,
    },
    /// [`train_dictionary`](crate::train_dictionary) was given no samples, or only empty ones.
    #[error("dictionary training needs at least one non-empty sample")]
    NoSamples,
    /// [`train_dictionary`](crate::train_dictionary) was asked for a dictionary below zstd's
    /// minimum size.
    #[error(
        "a dictionary of at most {max_size} bytes is too small: zstd needs at least {min} bytes"
    )]
    DictionaryTooSmall {
        /// The size asked for.
        max_size: usize,
        /// zstd's minimum (`ZDICT_DICTSIZE_MIN`).
        min: usize,
    },
    /// zstd's trainer failed, typically because there are too few or too uniform samples.
    #[error("dictionary training on {samples} samples ({len_bytes} bytes) failed: {reason}")]
    Training {
        /// How many samples were given.
        samples: usize,
        /// Their total length.
        len_bytes: usize,
        /// zstd's error name.
        reason: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_errors_are_small_and_copy() {
        const _: () = assert!(std::mem::size_of::<CodecError>() <= 32);
        let err = CodecError::DoesNotFit {
            algorithm: Algorithm::Lz4,
            dst_len: 3000,
        };
        let copy = err;
        assert_eq!(err, copy);
    }

    #[test]
    fn messages_are_lowercase_and_name_the_values() {
        let messages = [
            CodecError::DoesNotFit {
                algorithm: Algorithm::Zstd,
                dst_len: 3000,
            }
            .to_string(),
            CodecError::ShortPage {
                algorithm: Algorithm::Lz4,
                len_bytes: 12,
            }
            .to_string(),
            ConfigError::LevelOutOfRange {
                algorithm: Algorithm::Zstd,
                level: 99,
                min: -7,
                max: 22,
            }
            .to_string(),
            ConfigError::EmptyDictionary.to_string(),
        ];
        assert_eq!(messages[0], "zstd output does not fit in 3000 bytes");
        assert_eq!(
            messages[1],
            "lz4 data decompresses to 12 bytes instead of a 4096-byte page"
        );
        assert_eq!(messages[2], "zstd level 99 is out of range: use -7 to 22");
        for message in messages {
            assert!(message.starts_with(|c: char| c.is_lowercase()), "{message}");
        }
    }
}
