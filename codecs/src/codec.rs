//! [`Codec`]: an algorithm with its parameters, shared; [`Stream`]: its per-thread state.

use std::fmt;
use std::sync::Arc;

use crate::backend_lz4::{self, Lz4Stream};
use crate::backend_zstd::{self, ZstdDicts, ZstdStream};
use crate::{Algorithm, CodecError, CodecParams, ConfigError, MAX_COMPRESSED_LEN, PAGE_SIZE};

/// An algorithm with its level and dictionary, validated and prepared: zram's `zcomp`.
///
/// Cloning is cheap (one `Arc`), and a `Codec` is `Send + Sync`: build it once and make one
/// [`Stream`] per thread with [`Codec::stream`].
#[derive(Clone)]
pub struct Codec {
    inner: Arc<Inner>,
}

struct Inner {
    algorithm: Algorithm,
    params: CodecParams,
    level: i32,
    /// zstd's prepared dictionaries; lz4 uses `params.dict` as it is.
    zstd_dicts: Option<ZstdDicts>,
}

impl Codec {
    /// Validates `params` for `algorithm` and prepares its dictionary.
    pub fn new(algorithm: Algorithm, params: CodecParams) -> Result<Self, ConfigError> {
        let level = params.level.unwrap_or_else(|| algorithm.default_level());
        if let Some(range) = algorithm.level_range() {
            if !range.contains(&level) {
                return Err(ConfigError::LevelOutOfRange {
                    algorithm,
                    level,
                    min: *range.start(),
                    max: *range.end(),
                });
            }
        }
        let dict = params.dict.as_deref();
        if dict.is_some_and(<[u8]>::is_empty) {
            return Err(ConfigError::EmptyDictionary);
        }
        let zstd_dicts = match (algorithm, dict) {
            (Algorithm::Zstd, Some(dict)) => Some(ZstdDicts::new(dict, level)?),
            _ => None,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                algorithm,
                params,
                level,
                zstd_dicts,
            }),
        })
    }

    /// A new stream: the contexts and buffers for compressing and decompressing pages on one
    /// thread. It allocates everything it will need now, so its calls don't (see
    /// [`Stream`]): zstd's contexts are made and written by compressing and decompressing a
    /// page that uses their entropy tables (`warm.rs`).
    pub fn stream(&self) -> Result<Stream, ConfigError> {
        self.make_stream(true)
    }

    /// A stream for a thread that decompresses this codec's pages but rarely or never
    /// compresses: like [`Codec::stream`]'s, its decompression allocates nothing (its context is
    /// made and written now), but zstd's compression workspace (about 90 KiB) is made at its
    /// first compression, or at [`Stream::warm_compression`].
    pub fn stream_for_reads(&self) -> Result<Stream, ConfigError> {
        self.make_stream(false)
    }

    fn make_stream(&self, compresses: bool) -> Result<Stream, ConfigError> {
        let inner = &*self.inner;
        let state = match inner.algorithm {
            Algorithm::Lz4 => State::Lz4(Lz4Stream::new()),
            Algorithm::Zstd => {
                let dicts = inner.zstd_dicts.as_ref();
                let mut zstd = if compresses {
                    ZstdStream::new(inner.level, dicts)?
                } else {
                    ZstdStream::unwarmed(inner.level)?
                };
                zstd.warm_decompression()?;
                State::Zstd(zstd)
            }
        };
        Ok(Stream {
            codec: self.clone(),
            state,
            scratch: Box::new([0; MAX_COMPRESSED_LEN]),
        })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// The parameters it was built with.
    pub fn params(&self) -> &CodecParams {
        &self.inner.params
    }

    /// The level in effect: the one in [`CodecParams`], or the algorithm's default.
    pub fn level(&self) -> i32 {
        self.inner.level
    }
}

impl fmt::Debug for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Codec")
            .field("algorithm", &self.inner.algorithm)
            .field("level", &self.inner.level)
            .field(
                "dict_len",
                &self.inner.params.dict.as_ref().map(|dict| dict.len()),
            )
            .finish()
    }
}

/// One thread's compression state for a [`Codec`]: zram's `zcomp_strm`.
///
/// `Send`, so it can be made on one thread and used on another, but its calls take `&mut self`:
/// keep one per thread (or behind a lock). After [`Codec::stream`] returns, compressing and
/// decompressing allocate nothing, with one exception: lz4 with a dictionary, where lz4_flex
/// builds a hash table per call (as the kernel reloads an lz4 dictionary per page).
pub struct Stream {
    codec: Codec,
    state: State,
    /// Output for a `dst` shorter than the backend's worst case, see [`Stream::compress`].
    scratch: Box<[u8; MAX_COMPRESSED_LEN]>,
}

enum State {
    Lz4(Lz4Stream),
    Zstd(ZstdStream),
}

impl Stream {
    /// Whether compressing `page` is worth its cost: false for a zstd stream when the page
    /// looks like compressed or encrypted data ([`looks_incompressible`]), whose compression
    /// would cost 20 times the look for a page stored whole anyway. lz4 is its own quick look
    /// (it skips ahead faster the less it finds: 0.57 us on such a page, three times the look),
    /// so an lz4 stream always tries.
    ///
    /// [`looks_incompressible`]: crate::looks_incompressible
    pub fn worth_compressing(&self, page: &[u8; PAGE_SIZE]) -> bool {
        match self.state {
            State::Lz4(_) => true,
            State::Zstd(_) => !crate::looks_incompressible(page),
        }
    }

    /// Compresses one page into `dst`; returns the compressed length.
    ///
    /// `dst` may be of any length: if the compressed page is longer, this returns
    /// [`CodecError::DoesNotFit`], exactly when the page does not fit. The engine detects huge
    /// pages this way: it passes a `dst` just below its huge-page threshold and stores the page
    /// uncompressed when it does not fit. When it fits, `dst[..len]` holds the compressed page;
    /// on any error, `dst` holds garbage.
    ///
    /// A `dst` of at least [`MAX_COMPRESSED_LEN`] bytes is written directly. A shorter one costs
    /// a copy of the output besides: the compressors write into a buffer of the worst-case
    /// length and the output is copied if it fits, because lz4_flex refuses a shorter output
    /// whatever the input, and zstd refuses one that lacks some slack beyond the output.
    pub fn compress(&mut self, src: &[u8; PAGE_SIZE], dst: &mut [u8]) -> Result<usize, CodecError> {
        let inner = &*self.codec.inner;
        let bound = match self.state {
            State::Lz4(_) => backend_lz4::COMPRESS_BOUND,
            State::Zstd(_) => backend_zstd::COMPRESS_BOUND,
        };
        let direct = dst.len() >= bound;
        let out = if direct {
            &mut dst[..]
        } else {
            &mut self.scratch[..]
        };
        let len_bytes = match &mut self.state {
            State::Lz4(lz4) => lz4.compress(inner.params.dict.as_deref(), src, out)?,
            State::Zstd(zstd) => zstd.compress(inner.zstd_dicts.as_ref(), src, out)?,
        };
        if !direct {
            if len_bytes > dst.len() {
                let dst_len = dst.len();
                return Err(CodecError::DoesNotFit {
                    algorithm: inner.algorithm,
                    dst_len,
                });
            }
            dst[..len_bytes].copy_from_slice(&self.scratch[..len_bytes]);
        }
        Ok(len_bytes)
    }

    /// Decompresses `src` into exactly one page.
    ///
    /// `src` must decompress to exactly [`PAGE_SIZE`] bytes: less is
    /// [`CodecError::ShortPage`], more is [`CodecError::Corrupt`]. Corrupt input is an error,
    /// never a panic. On error `dst` is zeroed, so no stale bytes of an earlier page can leak,
    /// but the caller must not use it as data.
    #[inline]
    pub fn decompress(&mut self, src: &[u8], dst: &mut [u8; PAGE_SIZE]) -> Result<(), CodecError> {
        let inner = &*self.codec.inner;
        let result = match &mut self.state {
            State::Lz4(_) => Lz4Stream::decompress(inner.params.dict.as_deref(), src, dst),
            State::Zstd(zstd) => zstd.decompress(inner.zstd_dicts.as_ref(), src, dst),
        };
        if result.is_err() {
            dst.fill(0);
        }
        result
    }

    /// Makes the compression workspace of a stream made by [`Codec::stream_for_reads`] now (and
    /// faults it in), so that its first compression does not: for a thread about to compress
    /// under a slot lock. On a stream that has one, it costs one page's compression.
    pub fn warm_compression(&mut self) -> Result<(), ConfigError> {
        match &mut self.state {
            State::Lz4(_) => Ok(()),
            State::Zstd(zstd) => zstd.warm_compression(self.codec.inner.zstd_dicts.as_ref()),
        }
    }

    /// Bytes its codec's contexts hold (zstd's; lz4's table is part of the stream), for tests
    /// and accounting.
    pub fn context_bytes(&self) -> usize {
        match &self.state {
            State::Lz4(_) => 0,
            State::Zstd(zstd) => zstd.context_bytes(),
        }
    }

    /// The codec this stream belongs to: its algorithm and parameters.
    pub fn codec(&self) -> &Codec {
        &self.codec
    }

    /// The algorithm, as [`Codec::algorithm`].
    pub fn algorithm(&self) -> Algorithm {
        self.codec.algorithm()
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stream")
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    const fn send<T: Send>() {}
    send_sync::<Codec>();
    send::<Stream>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pages::{noise_page, text_page};
    use crate::MAX_COMPRESSED_LEN;
    use proptest::prelude::*;

    fn stream(algorithm: Algorithm, params: CodecParams) -> Stream {
        Codec::new(algorithm, params).unwrap().stream().unwrap()
    }

    fn round_trip(stream: &mut Stream, page: &[u8; PAGE_SIZE]) -> usize {
        let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
        let len = stream.compress(page, &mut compressed).unwrap();
        let mut out = Box::new([0xa5u8; PAGE_SIZE]);
        stream.decompress(&compressed[..len], &mut out).unwrap();
        assert_eq!(out[..], page[..], "{:?}", stream.codec());
        len
    }

    #[test]
    fn every_algorithm_round_trips_text_noise_and_zeros() {
        for &algorithm in Algorithm::ALL {
            let mut stream = stream(algorithm, CodecParams::default());
            assert_eq!(stream.algorithm(), algorithm);
            let text_len = round_trip(&mut stream, &text_page(1));
            assert!(text_len < PAGE_SIZE / 2, "{algorithm}: {text_len}");
            round_trip(&mut stream, &noise_page(2));
            let zeros_len = round_trip(&mut stream, &[0; PAGE_SIZE]);
            assert!(zeros_len < 64, "{algorithm}: {zeros_len}");
        }
    }

    #[test]
    fn zstd_round_trips_at_every_kind_of_level() {
        let range = Algorithm::Zstd.level_range().unwrap();
        for level in [*range.start(), -100, -5, -1, 0, 1, 3, 9, 19, *range.end()] {
            let mut stream = stream(Algorithm::Zstd, CodecParams::default().with_level(level));
            assert_eq!(stream.codec().level(), level);
            round_trip(&mut stream, &text_page(level as u64));
            round_trip(&mut stream, &noise_page(level as u64));
        }
    }

    #[test]
    fn higher_zstd_level_compresses_at_least_as_well() {
        let page = text_page(7);
        let fast = round_trip(
            &mut stream(Algorithm::Zstd, CodecParams::default().with_level(-50)),
            &page,
        );
        let strong = round_trip(
            &mut stream(Algorithm::Zstd, CodecParams::default().with_level(19)),
            &page,
        );
        assert!(strong <= fast, "level 19: {strong}, level -50: {fast}");
    }

    #[test]
    fn zstd_level_out_of_range_is_rejected_with_the_range() {
        let max = *Algorithm::Zstd.level_range().unwrap().end();
        let err =
            Codec::new(Algorithm::Zstd, CodecParams::default().with_level(max + 1)).unwrap_err();
        assert!(matches!(err, ConfigError::LevelOutOfRange { level, .. } if level == max + 1));
        assert!(err
            .to_string()
            .starts_with(&format!("zstd level {} is out of range: use -", max + 1)));
    }

    #[test]
    fn lz4_accepts_and_ignores_any_level() {
        let mut plain = stream(Algorithm::Lz4, CodecParams::default());
        assert_eq!(plain.codec().level(), 1);
        let page = text_page(3);
        let plain_len = round_trip(&mut plain, &page);
        for level in [i32::MIN, 0, 9, 65537, i32::MAX] {
            let mut s = stream(Algorithm::Lz4, CodecParams::default().with_level(level));
            assert_eq!(round_trip(&mut s, &page), plain_len);
        }
    }

    #[test]
    fn default_params_use_the_algorithms_default_level() {
        let codec = Codec::new(Algorithm::Zstd, CodecParams::default()).unwrap();
        assert_eq!(codec.level(), 3);
        assert_eq!(codec.params(), &CodecParams::default());
    }

    #[test]
    fn dictionary_round_trips_and_helps_on_similar_pages() {
        let dict: Arc<[u8]> = text_page(100)[..2048].into();
        let page = text_page(100);
        for &algorithm in Algorithm::ALL {
            let with = round_trip(
                &mut stream(algorithm, CodecParams::default().with_dict(dict.clone())),
                &page,
            );
            let without = round_trip(&mut stream(algorithm, CodecParams::default()), &page);
            assert!(
                with < without,
                "{algorithm}: {with} with dict, {without} without"
            );
        }
    }

    #[test]
    fn page_compressed_with_dictionary_does_not_decompress_without_it() {
        let page = text_page(5);
        for &algorithm in Algorithm::ALL {
            let mut with = stream(algorithm, CodecParams::default().with_dict(&page[..]));
            let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
            let len = with.compress(&page, &mut compressed).unwrap();
            let mut without = stream(algorithm, CodecParams::default());
            let mut out = Box::new([0xa5u8; PAGE_SIZE]);
            match without.decompress(&compressed[..len], &mut out) {
                // A raw-content dictionary leaves no id in a zstd frame, so the frame may decode
                // to something: never to the page.
                Ok(()) => assert_ne!(out[..], page[..], "{algorithm}"),
                Err(_) => assert!(out.iter().all(|&b| b == 0), "{algorithm}: dst not zeroed"),
            }
        }
    }

    #[test]
    fn trained_zstd_dictionary_frames_need_that_dictionary() {
        let samples: Vec<_> = (0..64).map(text_page).collect();
        let dict = crate::train_dictionary(samples.iter().map(|page| &page[..]), 4096).unwrap();
        let mut with = stream(Algorithm::Zstd, CodecParams::default().with_dict(dict));
        let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
        let len = with.compress(&text_page(1000), &mut compressed).unwrap();
        let mut out = Box::new([0u8; PAGE_SIZE]);
        with.decompress(&compressed[..len], &mut out).unwrap();
        assert_eq!(out[..], text_page(1000)[..]);
        let err = stream(Algorithm::Zstd, CodecParams::default())
            .decompress(&compressed[..len], &mut out)
            .unwrap_err();
        assert!(
            matches!(
                err,
                CodecError::Corrupt {
                    algorithm: Algorithm::Zstd,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn empty_dictionary_is_rejected() {
        for &algorithm in Algorithm::ALL {
            let params = CodecParams::default().with_dict(Vec::new());
            assert_eq!(
                Codec::new(algorithm, params).unwrap_err(),
                ConfigError::EmptyDictionary
            );
        }
    }

    #[test]
    fn does_not_fit_is_distinct_and_exact() {
        for &algorithm in Algorithm::ALL {
            let mut stream = stream(algorithm, CodecParams::default());
            let page = text_page(9);
            let mut full = vec![0u8; MAX_COMPRESSED_LEN];
            let len = stream.compress(&page, &mut full).unwrap();
            let mut tight = vec![0u8; len];
            assert_eq!(stream.compress(&page, &mut tight), Ok(len), "{algorithm}");
            assert_eq!(tight[..], full[..len], "{algorithm}");
            assert_eq!(
                stream.compress(&page, &mut tight[..len - 1]),
                Err(CodecError::DoesNotFit {
                    algorithm,
                    dst_len: len - 1
                })
            );
            // Incompressible data does not fit under a huge-page threshold.
            assert_eq!(
                stream.compress(&noise_page(1), &mut full[..3 * PAGE_SIZE / 4]),
                Err(CodecError::DoesNotFit {
                    algorithm,
                    dst_len: 3 * PAGE_SIZE / 4
                })
            );
            // The stream is still fine afterwards.
            round_trip(&mut stream, &page);
        }
    }

    #[test]
    fn short_output_is_an_error_and_zeroes_dst() {
        for &algorithm in Algorithm::ALL {
            let mut stream = stream(algorithm, CodecParams::default());
            let short = match algorithm {
                Algorithm::Lz4 => lz4_flex::block::compress(&[7u8; 4095]),
                _ => zstd::bulk::compress(&[7u8; 4095], 3).unwrap(),
            };
            let mut out = Box::new([0xa5u8; PAGE_SIZE]);
            assert_eq!(
                stream.decompress(&short, &mut out),
                Err(CodecError::ShortPage {
                    algorithm,
                    len_bytes: 4095
                })
            );
            assert!(out.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn long_output_is_corrupt_not_truncated() {
        for &algorithm in Algorithm::ALL {
            let mut stream = stream(algorithm, CodecParams::default());
            let long = match algorithm {
                Algorithm::Lz4 => lz4_flex::block::compress(&[7u8; 4097]),
                _ => zstd::bulk::compress(&[7u8; 4097], 3).unwrap(),
            };
            let mut out = Box::new([0xa5u8; PAGE_SIZE]);
            let err = stream.decompress(&long, &mut out).unwrap_err();
            assert_eq!(
                err,
                CodecError::Corrupt {
                    algorithm,
                    reason: "decompresses to more than one page"
                }
            );
            assert!(out.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn truncated_input_is_an_error_at_every_length() {
        for &algorithm in Algorithm::ALL {
            let mut stream = stream(algorithm, CodecParams::default());
            for page in [text_page(11), noise_page(11)] {
                let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
                let len = stream.compress(&page, &mut compressed).unwrap();
                let mut out = Box::new([0u8; PAGE_SIZE]);
                for cut in 0..len {
                    let result = stream.decompress(&compressed[..cut], &mut out);
                    assert!(
                        result.is_err(),
                        "{algorithm}: truncated to {cut} of {len} decoded"
                    );
                }
            }
        }
    }

    #[test]
    fn flipped_bytes_are_an_error_or_a_full_page_never_a_panic() {
        for &algorithm in Algorithm::ALL {
            let mut stream = stream(algorithm, CodecParams::default());
            let page = text_page(12);
            let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
            let len = stream.compress(&page, &mut compressed).unwrap();
            for i in 0..len {
                for mask in [0x01, 0x80, 0xff] {
                    let mut corrupt = compressed[..len].to_vec();
                    corrupt[i] ^= mask;
                    let mut out = Box::new([0x5au8; PAGE_SIZE]);
                    if stream.decompress(&corrupt, &mut out).is_err() {
                        assert!(out.iter().all(|&b| b == 0));
                    }
                }
            }
            round_trip(&mut stream, &page);
        }
    }

    #[test]
    fn random_garbage_is_an_error_never_a_panic() {
        for &algorithm in Algorithm::ALL {
            let mut stream = stream(algorithm, CodecParams::default());
            for seed in 0..200 {
                let garbage = noise_page(seed);
                let len = (seed as usize * 37) % PAGE_SIZE;
                let mut out = Box::new([0u8; PAGE_SIZE]);
                // Random bytes may happen to be a valid lz4 block; what matters is no panic.
                let _ = stream.decompress(&garbage[..len], &mut out);
            }
        }
    }

    #[test]
    fn streams_of_one_codec_work_on_many_threads() {
        let codec = Codec::new(
            Algorithm::Zstd,
            CodecParams::default().with_dict(&text_page(0)[..]),
        )
        .unwrap();
        std::thread::scope(|scope| {
            for t in 0..4 {
                let codec = codec.clone();
                scope.spawn(move || {
                    let mut stream = codec.stream().unwrap();
                    for i in 0..20 {
                        round_trip(&mut stream, &text_page(t * 100 + i));
                    }
                });
            }
        });
    }

    fn page_strategy() -> impl Strategy<Value = Box<[u8; PAGE_SIZE]>> {
        fn page_from(fill: impl FnMut(usize) -> u8) -> Box<[u8; PAGE_SIZE]> {
            let mut fill = fill;
            let mut page = Box::new([0u8; PAGE_SIZE]);
            for (i, byte) in page.iter_mut().enumerate() {
                *byte = fill(i);
            }
            page
        }
        prop_oneof![
            any::<u8>().prop_map(|b| page_from(|_| b)),
            prop::collection::vec(any::<u8>(), 1..64)
                .prop_map(|pattern| page_from(|i| pattern[i % pattern.len()])),
            prop::collection::vec(any::<u8>(), PAGE_SIZE).prop_map(|bytes| page_from(|i| bytes[i])),
            prop::collection::vec(
                (0..PAGE_SIZE, prop::collection::vec(any::<u8>(), 1..48)),
                0..24
            )
            .prop_map(|edits| {
                let mut page = Box::new([0u8; PAGE_SIZE]);
                for (offset, bytes) in edits {
                    let end = (offset + bytes.len()).min(PAGE_SIZE);
                    page[offset..end].copy_from_slice(&bytes[..end - offset]);
                }
                page
            }),
            (any::<u64>(), 1u64..1 << 20, prop::bool::ANY).prop_map(|(base, stride, wide)| {
                // Counters or pointers: what heaps and page tables look like.
                let mut page = Box::new([0u8; PAGE_SIZE]);
                let width = if wide { 8 } else { 4 };
                for (i, word) in page.chunks_mut(width).enumerate() {
                    let value = base
                        .wrapping_add(stride.wrapping_mul(i as u64))
                        .to_le_bytes();
                    word.copy_from_slice(&value[..width]);
                }
                page
            }),
            "[a-z ]{1,12}( [A-Za-z0-9=:]{1,16}){0,8}\n"
                .prop_map(|line| page_from(|i| line.as_bytes()[i % line.len()])),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_page_round_trips(
            page in page_strategy(),
            algorithm in prop::sample::select(Algorithm::ALL),
            level in prop::option::of(-20i32..=19),
            limit in 0usize..PAGE_SIZE,
        ) {
            let mut stream = stream(algorithm, CodecParams { level, dict: None });
            let len = round_trip(&mut stream, &page);
            let mut limited = vec![0u8; limit];
            match stream.compress(&page, &mut limited) {
                Ok(limited_len) => prop_assert_eq!(limited_len, len),
                Err(err) => {
                    prop_assert_eq!(err, CodecError::DoesNotFit { algorithm, dst_len: limit });
                    prop_assert!(limit < len);
                }
            }
        }
    }
}
