//! Harness logic of the fuzz targets `codec_roundtrip` and `codec_decompress_corrupt`, kept
//! here so that it builds and is tested on stable; `fuzz/fuzz_targets/codec_*.rs` only call it.
//!
//! Inputs are read front to back, one field after the other, and a field the input is too short
//! for reads as zeros, so every input runs. The layout (also what [`roundtrip_seeds`] and
//! [`decompress_corrupt_seeds`] write):
//!
//! ```text
//! setup:    algorithm (byte, index into Algorithm::ALL)
//!           level     (byte: 0 default, 1 lowest, 2 highest, b: b % 32 - 10)
//!           dict      (byte d: d < 192 none, else (d - 191) * 32 bytes of dictionary follow)
//! page:     kind (byte % 8) and its fields, see `arbitrary_page`
//! roundtrip:        setup, page count (byte % 3 + 1), then per page:
//!                   page, limit delta (byte: dst limit = compressed length + delta - 128),
//!                   sentinel (byte)
//! decompress_corrupt: setup, mode (byte), sentinel (byte), then
//!                   even mode: the rest is the compressed input;
//!                   odd mode:  page, mutation count (byte % 8), per mutation:
//!                              kind (byte % 5), position (u16 le), value (byte)
//! ```

use arbitrary::Unstructured;

use crate::pages::{fill_noise, text_page};

use crate::{
    Algorithm, Codec, CodecError, CodecParams, ConfigError, Stream, MAX_COMPRESSED_LEN, PAGE_SIZE,
};

/// Compresses pages chosen by `data` with a codec chosen by `data` and checks that they
/// decompress to themselves, and that a `dst` limit gives `DoesNotFit` exactly when the
/// compressed page is longer.
pub fn codec_roundtrip(data: &[u8]) {
    run_roundtrip(data);
}

/// Decompresses corrupt input: `data` itself, or a page compressed then truncated, extended or
/// with bytes flipped as `data` says. Checks that this never panics, that an error zeroes `dst`,
/// that a success fills all of `dst` (the same output over two different sentinels), and that
/// the stream still works afterwards.
pub fn codec_decompress_corrupt(data: &[u8]) {
    run_decompress_corrupt(data);
}

/// What one run did, for the tests of the seeds.
#[derive(Debug, Default)]
struct Report {
    algorithm: Option<Algorithm>,
    dict: bool,
    pages: usize,
    fitted: usize,
    did_not_fit: usize,
    decoded: usize,
    rejected: usize,
}

fn run_roundtrip(data: &[u8]) -> Report {
    let mut u = Unstructured::new(data);
    let mut report = Report::default();
    let Some(mut stream) = setup(&mut u, &mut report) else {
        return report;
    };
    let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
    let mut limited = vec![0u8; MAX_COMPRESSED_LEN + 128];
    for _ in 0..byte(&mut u) % 3 + 1 {
        let page = arbitrary_page(&mut u);
        let len = stream
            .compress(&page, &mut compressed)
            .expect("MAX_COMPRESSED_LEN always fits");
        let limit = (len + usize::from(byte(&mut u))).saturating_sub(128);
        match stream.compress(&page, &mut limited[..limit]) {
            Ok(limited_len) => {
                assert_eq!(limited_len, len, "limit {limit} changed the output length");
                assert_eq!(
                    limited[..len],
                    compressed[..len],
                    "limit {limit} changed the output"
                );
                report.fitted += 1;
            }
            Err(CodecError::DoesNotFit { dst_len, .. }) => {
                assert_eq!(dst_len, limit);
                assert!(limit < len, "{len} bytes did not fit in {limit}");
                report.did_not_fit += 1;
            }
            Err(err) => panic!("compressing into {limit} bytes: {err}"),
        }
        let mut out = Box::new([byte(&mut u); PAGE_SIZE]);
        stream
            .decompress(&compressed[..len], &mut out)
            .expect("own output decompresses");
        assert!(out[..] == page[..], "round trip changed the page");
        report.pages += 1;
    }
    report
}

fn run_decompress_corrupt(data: &[u8]) -> Report {
    let mut u = Unstructured::new(data);
    let mut report = Report::default();
    let Some(mut stream) = setup(&mut u, &mut report) else {
        return report;
    };
    let mode = byte(&mut u);
    let sentinel = byte(&mut u);
    if mode % 2 == 0 {
        check_decompress(&mut stream, u.take_rest(), sentinel, &mut report);
    } else {
        let page = arbitrary_page(&mut u);
        let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
        let len = stream
            .compress(&page, &mut compressed)
            .expect("MAX_COMPRESSED_LEN always fits");
        let mut input = compressed[..len].to_vec();
        let mutations = byte(&mut u) % 8;
        for _ in 0..mutations {
            let kind = byte(&mut u) % 5;
            let position = usize::from(u16le(&mut u));
            let value = byte(&mut u);
            mutate(&mut input, kind, position, value);
        }
        let decoded = check_decompress(&mut stream, &input, sentinel, &mut report);
        if mutations == 0 {
            assert!(
                decoded.is_some_and(|out| out[..] == page[..]),
                "unmutated page did not round trip"
            );
        }
    }
    // A failed call leaves the stream usable.
    let page = Box::new(text_page(u64::from(sentinel)));
    let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
    let len = stream
        .compress(&page, &mut compressed)
        .expect("MAX_COMPRESSED_LEN always fits");
    let mut out = Box::new([0u8; PAGE_SIZE]);
    stream
        .decompress(&compressed[..len], &mut out)
        .expect("stream broken by corrupt input");
    assert!(out[..] == page[..], "stream broken by corrupt input");
    report
}

fn mutate(input: &mut Vec<u8>, kind: u8, position: usize, value: u8) {
    let at = |len: usize| if len == 0 { 0 } else { position % len };
    match kind {
        0 => {
            if !input.is_empty() {
                let i = at(input.len());
                input[i] ^= value.max(1);
            }
        }
        1 => input.truncate(at(input.len() + 1)),
        2 => input.insert(at(input.len() + 1), value),
        3 => {
            if !input.is_empty() {
                input.remove(at(input.len()));
            }
        }
        _ => {
            // A large value over a length or offset field.
            let i = at(input.len());
            for byte in input.iter_mut().skip(i).take(2) {
                *byte = value | 0xf0;
            }
        }
    }
}

/// Decompresses `src` twice, over two different sentinels. Returns the page if it decoded.
fn check_decompress(
    stream: &mut Stream,
    src: &[u8],
    sentinel: u8,
    report: &mut Report,
) -> Option<Box<[u8; PAGE_SIZE]>> {
    let mut first = Box::new([sentinel; PAGE_SIZE]);
    let mut second = Box::new([!sentinel; PAGE_SIZE]);
    let first_result = stream.decompress(src, &mut first);
    let second_result = stream.decompress(src, &mut second);
    // Only success must agree: zstd decodes the first frame after switching dictionaries with
    // its prefetching decoder, which may name another error for the same corrupt input.
    assert_eq!(
        first_result.is_ok(),
        second_result.is_ok(),
        "decompression is not deterministic: {first_result:?}, then {second_result:?}"
    );
    match first_result {
        Ok(()) => {
            assert!(
                first[..] == second[..],
                "bytes of dst survived a successful decompression"
            );
            report.decoded += 1;
            Some(first)
        }
        Err(err) => {
            assert!(
                !matches!(
                    err,
                    CodecError::DoesNotFit { .. } | CodecError::Compress { .. }
                ),
                "decompression failed with a compression error: {err}"
            );
            assert!(
                first.iter().chain(second.iter()).all(|&b| b == 0),
                "dst not zeroed after {err}"
            );
            report.rejected += 1;
            None
        }
    }
}

fn setup(u: &mut Unstructured<'_>, report: &mut Report) -> Option<Stream> {
    let algorithm = Algorithm::ALL[usize::from(byte(u)) % Algorithm::ALL.len()];
    let range = algorithm.level_range().unwrap_or(i32::MIN..=i32::MAX);
    let level = match byte(u) {
        0 => None,
        1 => Some(*range.start()),
        2 => Some(*range.end()),
        b => Some(i32::from(b % 32) - 10),
    };
    let dict_len = match byte(u) {
        d @ 192.. => usize::from(d - 191) * 32,
        _ => 0,
    };
    let dict = take(u, dict_len);
    let mut params = CodecParams { level, dict: None };
    if !dict.is_empty() {
        params.dict = Some(dict.into());
    }
    let codec = match Codec::new(algorithm, params) {
        Ok(codec) => codec,
        // Bytes that start with the zstd dictionary magic number but are no dictionary.
        Err(ConfigError::InvalidDictionary { .. }) => return None,
        Err(err) => panic!("{algorithm} with level {level:?}: {err}"),
    };
    report.algorithm = Some(algorithm);
    report.dict = !dict.is_empty();
    Some(codec.stream().expect("stream allocation"))
}

/// A page of one of the kinds the device sees, from the input.
fn arbitrary_page(u: &mut Unstructured<'_>) -> Box<[u8; PAGE_SIZE]> {
    let mut page = Box::new([0u8; PAGE_SIZE]);
    match byte(u) % 8 {
        // Zero-filled: the engine stores these as SAME, but the codec must handle them.
        0 => {}
        // Same-filled.
        1 => page.fill(byte(u)),
        // A short repeated pattern.
        2 => {
            let len = usize::from(byte(u) % 64) + 1;
            let pattern = take(u, len);
            if !pattern.is_empty() {
                for (i, b) in page.iter_mut().enumerate() {
                    *b = pattern[i % pattern.len()];
                }
            }
        }
        // Raw bytes, zero-padded.
        3 => {
            let len = usize::from(u16le(u)) % (PAGE_SIZE + 1);
            let bytes = take(u, len);
            page[..bytes.len()].copy_from_slice(bytes);
        }
        // Mostly zero with a few short runs of data.
        4 => {
            for _ in 0..byte(u) % 32 {
                let offset = usize::from(u16le(u)) % PAGE_SIZE;
                let len = usize::from(byte(u) % 64);
                let bytes = take(u, len);
                let end = (offset + bytes.len()).min(PAGE_SIZE);
                page[offset..end].copy_from_slice(&bytes[..end - offset]);
            }
        }
        // Counters or pointers, 4 or 8 bytes wide.
        5 => {
            let base = u64le(u);
            let stride = u64le(u) % (1 << 20);
            let width = if byte(u) % 2 == 0 { 4 } else { 8 };
            for (i, word) in page.chunks_mut(width).enumerate() {
                let value = base
                    .wrapping_add(stride.wrapping_mul(i as u64))
                    .to_le_bytes();
                word.copy_from_slice(&value[..width]);
            }
        }
        // Incompressible.
        6 => fill_noise(&mut page[..], u64le(u)),
        // Text.
        _ => *page = text_page(u64le(u)),
    }
    page
}

fn byte(u: &mut Unstructured<'_>) -> u8 {
    u.arbitrary().unwrap_or(0)
}

fn u16le(u: &mut Unstructured<'_>) -> u16 {
    u16::from_le_bytes([byte(u), byte(u)])
}

fn u64le(u: &mut Unstructured<'_>) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.iter_mut().for_each(|b| *b = byte(u));
    u64::from_le_bytes(bytes)
}

/// Up to `len` bytes: fewer if the input ends.
fn take<'a>(u: &mut Unstructured<'a>, len: usize) -> &'a [u8] {
    u.bytes(len.min(u.len())).unwrap_or_default()
}

/// Inputs for `fuzz/corpus/codec_roundtrip`, named for what they exercise.
pub fn roundtrip_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for (index, &algorithm) in Algorithm::ALL.iter().enumerate() {
        let alg = index as u8;
        let text = |seed: u64| [&[7][..], &seed.to_le_bytes()[..]].concat();
        let noise = [&[6][..], &1234u64.to_le_bytes()[..]].concat();
        let mut add = |name: &str, setup: Vec<u8>, pages: &[Vec<u8>]| {
            let mut data = setup;
            data.push(pages.len() as u8 - 1);
            for (i, page) in pages.iter().enumerate() {
                data.extend_from_slice(page);
                // Alternate limits just above and just below the compressed length.
                data.push(if i % 2 == 0 { 130 } else { 127 });
                data.push(0xa5);
            }
            seeds.push((format!("{algorithm}-{name}"), data));
        };
        add("zeros", vec![alg, 0, 0], &[vec![0]]);
        add("text", vec![alg, 0, 0], &[text(1)]);
        add("noise", vec![alg, 0, 0], std::slice::from_ref(&noise));
        add(
            "pattern-pointers-sparse-level-minus5",
            vec![alg, 5, 0],
            &[
                vec![2, 5, b'a', b'b', b'c', 0, 0, 1],
                [
                    &[5][..],
                    &0x7fff_1234_0000u64.to_le_bytes()[..],
                    &64u64.to_le_bytes()[..],
                    &[1][..],
                ]
                .concat(),
                vec![4, 2, 0x10, 0x00, 4, 1, 2, 3, 4, 0x00, 0x0f, 2, 9, 9],
            ],
        );
        add("lowest-level", vec![alg, 1, 0], &[text(2), noise.clone()]);
        add("highest-level", vec![alg, 2, 0], &[text(3)]);
        let dict = text_page(4);
        add(
            "dict",
            [&[alg, 0, 192 + 15][..], &dict[..512]].concat(),
            &[text(4), text(5)],
        );
    }
    seeds
}

/// Inputs for `fuzz/corpus/codec_decompress_corrupt`, named for what they exercise.
pub fn decompress_corrupt_seeds() -> Vec<(String, Vec<u8>)> {
    let mut seeds = Vec::new();
    for (index, &algorithm) in Algorithm::ALL.iter().enumerate() {
        let alg = index as u8;
        let text = [&[7][..], &9u64.to_le_bytes()[..]].concat();
        let mut add = |name: &str, data: Vec<u8>| seeds.push((format!("{algorithm}-{name}"), data));

        // Even mode: valid compressed pages given as raw input, and garbage.
        let mut stream = Codec::new(algorithm, CodecParams::default())
            .and_then(|codec| codec.stream())
            .expect("default codec");
        let mut compressed = vec![0u8; MAX_COMPRESSED_LEN];
        let len = stream
            .compress(&text_page(9), &mut compressed)
            .expect("fits");
        add(
            "valid-text",
            [&[alg, 0, 0, 0, 0x5a][..], &compressed[..len]].concat(),
        );
        let len = stream
            .compress(&[0; PAGE_SIZE], &mut compressed)
            .expect("fits");
        add(
            "valid-zeros",
            [&[alg, 0, 0, 0, 0x5a][..], &compressed[..len]].concat(),
        );
        add(
            "garbage",
            [&[alg, 0, 0, 0, 0x5a][..], &text_page(10)[..64]].concat(),
        );

        // Odd mode: a compressed page, mutated.
        let mutated = |mutations: &[[u8; 4]]| {
            let mut data = [&[alg, 0, 0, 1, 0x5a][..], &text[..]].concat();
            data.push(mutations.len() as u8);
            mutations.iter().for_each(|m| data.extend_from_slice(m));
            data
        };
        add("intact", mutated(&[]));
        add("flip", mutated(&[[0, 40, 0, 0x04]]));
        add("truncate", mutated(&[[1, 200, 0, 0]]));
        add("insert-remove", mutated(&[[2, 7, 0, 0x41], [3, 90, 0, 0]]));
        add("overwrite-length", mutated(&[[4, 3, 0, 0xff]]));
    }
    seeds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_runs_lz4_on_a_zero_page() {
        let report = run_roundtrip(&[]);
        assert_eq!(report.algorithm, Some(Algorithm::Lz4));
        assert_eq!(report.pages, 1);
        let report = run_decompress_corrupt(&[]);
        assert_eq!(report.rejected, 1);
    }

    #[test]
    fn roundtrip_seeds_cover_every_algorithm_dicts_and_both_limit_outcomes() {
        let reports: Vec<_> = roundtrip_seeds()
            .iter()
            .map(|(_, data)| run_roundtrip(data))
            .collect();
        for &algorithm in Algorithm::ALL {
            let of = |r: &&Report| r.algorithm == Some(algorithm);
            assert!(
                reports.iter().filter(of).any(|r| r.dict),
                "{algorithm}: no seed with a dict"
            );
            assert!(
                reports.iter().filter(of).any(|r| r.fitted > 0),
                "{algorithm}"
            );
            assert!(
                reports.iter().filter(of).any(|r| r.did_not_fit > 0),
                "{algorithm}"
            );
            assert!(
                reports.iter().filter(of).any(|r| r.pages == 3),
                "{algorithm}"
            );
        }
    }

    #[test]
    fn corrupt_seeds_reach_both_decoded_and_rejected() {
        let reports: Vec<_> = decompress_corrupt_seeds()
            .iter()
            .map(|(_, data)| run_decompress_corrupt(data))
            .collect();
        for &algorithm in Algorithm::ALL {
            let of = |r: &&Report| r.algorithm == Some(algorithm);
            assert!(
                reports.iter().filter(of).any(|r| r.decoded > 0),
                "{algorithm}"
            );
            assert!(
                reports.iter().filter(of).any(|r| r.rejected > 0),
                "{algorithm}"
            );
        }
    }

    #[test]
    fn pseudo_random_inputs_pass_both_harnesses() {
        // A few hundred inputs on stable, in lieu of a fuzzer run.
        for seed in 0..300u64 {
            let mut data = vec![0u8; (seed as usize * 13) % 700];
            fill_noise(&mut data, seed);
            if let Some(first) = data.first_mut() {
                *first %= 2;
            }
            codec_roundtrip(&data);
            codec_decompress_corrupt(&data);
        }
    }
}
