use super::*;
use crate::pages::{fill_text, noise_page, text_page};
use crate::{Codec, CodecParams};

fn stream(algorithm: Algorithm) -> GroupStream {
    GroupStream::new(&Codec::new(algorithm, CodecParams::default()).unwrap()).unwrap()
}

/// A run of `n` pages like a heap's neighbours: text with phrases shared across pages, a noise
/// page among them.
fn run(n: usize, seed: u64) -> Vec<u8> {
    let mut pages = Vec::with_capacity(n * PAGE_SIZE);
    for i in 0..n as u64 {
        if i % 5 == 3 {
            pages.extend_from_slice(&noise_page(seed + i));
        } else {
            pages.extend_from_slice(&text_page(seed + i));
        }
    }
    pages
}

#[test]
fn every_run_length_round_trips_with_each_algorithm() {
    for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
        let mut s = stream(algorithm);
        let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
        for n in 1..=MAX_GROUP_PAGES {
            let pages = run(n, n as u64 * 100);
            let len = s.compress(&pages, &mut frame).unwrap();
            let mut back = vec![0xa5u8; n * PAGE_SIZE];
            s.decompress(&frame[..len], &mut back).unwrap();
            assert!(back == pages, "{algorithm} {n} pages");
        }
    }
}

#[test]
fn a_group_stores_fewer_bytes_than_its_pages_alone() {
    // Pages of the same vocabulary, as a heap's neighbours share their strings.
    for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
        let codec = Codec::new(algorithm, CodecParams::default()).unwrap();
        let mut pages = vec![0u8; MAX_GROUP_LEN];
        for (i, page) in pages.chunks_mut(PAGE_SIZE).enumerate() {
            fill_text(page, 40 + (i as u64 % 3) * 44);
        }
        let mut single = codec.stream().unwrap();
        let mut dst = vec![0u8; crate::MAX_COMPRESSED_LEN];
        let alone: usize = pages
            .chunks(PAGE_SIZE)
            .map(|p| single.compress(p.try_into().unwrap(), &mut dst).unwrap())
            .sum();
        let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
        let grouped = stream(algorithm).compress(&pages, &mut frame).unwrap();
        assert!(
            grouped * 10 < alone * 9,
            "{algorithm}: grouped {grouped}, alone {alone}"
        );
    }
}

#[test]
fn a_run_that_is_not_whole_pages_is_refused_by_length() {
    let mut s = stream(Algorithm::Zstd);
    let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
    for len_bytes in [0, PAGE_SIZE - 1, PAGE_SIZE + 1, MAX_GROUP_LEN + PAGE_SIZE] {
        let pages = vec![7u8; len_bytes];
        assert_eq!(
            s.compress(&pages, &mut frame),
            Err(CodecError::NotARun {
                algorithm: Algorithm::Zstd,
                len_bytes
            })
        );
        let mut dst = vec![0u8; len_bytes];
        assert!(matches!(
            s.decompress(&frame[..16], &mut dst),
            Err(CodecError::NotARun { .. })
        ));
    }
    assert!(matches!(
        s.compress(&run(2, 1), &mut frame[..100]),
        Err(CodecError::DoesNotFit { dst_len: 100, .. })
    ));
}

#[test]
fn a_frame_read_into_the_wrong_run_length_fails_and_zeroes() {
    for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
        let mut s = stream(algorithm);
        let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
        let len = s.compress(&run(4, 9), &mut frame).unwrap();
        for pages in [3, 5] {
            let mut dst = vec![0xffu8; pages * PAGE_SIZE];
            assert!(
                s.decompress(&frame[..len], &mut dst).is_err(),
                "{algorithm}: 4 pages read as {pages}"
            );
            assert!(dst.iter().all(|&b| b == 0), "{algorithm}: not zeroed");
        }
    }
}

#[test]
fn a_damaged_frame_is_an_error_or_other_bytes_never_a_panic() {
    for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
        let mut s = stream(algorithm);
        let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
        let pages = run(8, 77);
        let len = s.compress(&pages, &mut frame).unwrap();
        let mut dst = vec![0u8; pages.len()];
        for cut in [0, 1, len / 2, len - 1] {
            assert!(
                s.decompress(&frame[..cut], &mut dst).is_err(),
                "{algorithm} cut {cut}"
            );
        }
        for at in (0..len).step_by(97) {
            let mut bad = frame[..len].to_vec();
            bad[at] ^= 0x5a;
            // A flipped byte may still decode to other bytes (neither an lz4 block nor these
            // zstd frames carry a checksum): an error or other bytes, never a panic.
            let _ = s.decompress(&bad, &mut dst);
        }
    }
}

#[test]
fn a_stream_for_reads_reads_groups_and_refuses_to_compress() {
    for algorithm in [Algorithm::Lz4, Algorithm::Zstd] {
        let codec = Codec::new(algorithm, CodecParams::default()).unwrap();
        let mut full = GroupStream::new(&codec).unwrap();
        let mut reads = GroupStream::for_reads(&codec).unwrap();
        let pages = run(8, 7);
        let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
        let n = full.compress(&pages, &mut frame).unwrap();
        let mut back = vec![1u8; pages.len()];
        reads.decompress(&frame[..n], &mut back).unwrap();
        assert_eq!(back, pages, "{algorithm:?}");
        assert!(matches!(
            reads.compress(&pages, &mut frame),
            Err(CodecError::Compress { .. })
        ));
    }
}

#[test]
fn a_zstd_frame_with_a_flipped_byte_fails_its_checksum() {
    let mut s = stream(Algorithm::Zstd);
    let pages = run(16, 3);
    let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
    let n = s.compress(&pages, &mut frame).unwrap();
    // Literals near the end: a flip there decodes, so only the checksum can tell.
    let mut failed = 0;
    for at in (n / 2..n - 4).step_by(97) {
        let mut bad = frame[..n].to_vec();
        bad[at] ^= 0x20;
        let mut back = vec![0u8; pages.len()];
        match s.decompress(&bad, &mut back) {
            Ok(()) => assert_eq!(back, pages, "a flip at {at} decoded to other bytes"),
            Err(_) => failed += 1,
        }
    }
    assert!(failed > 0);
}

/// Runs of 16 neighbouring pages of the checked-in sample of real process pages.
fn sample_runs(runs: usize) -> Vec<Vec<u8>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/sample.pages.zst");
    let pages = zstd::decode_all(std::fs::File::open(path).unwrap()).unwrap();
    pages
        .chunks_exact(MAX_GROUP_LEN)
        .take(runs)
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn zstd_groups_take_the_cold_level_unless_the_codec_was_given_one() {
    let default = Codec::new(Algorithm::Zstd, CodecParams::default()).unwrap();
    let three = Codec::new(Algorithm::Zstd, CodecParams::default().with_level(3)).unwrap();
    assert_eq!(GroupStream::level(&default), GROUP_ZSTD_LEVEL);
    assert_eq!(GroupStream::level(&three), 3);
    let lz4 = Codec::new(Algorithm::Lz4, CodecParams::default()).unwrap();
    assert_eq!(GroupStream::level(&lz4), lz4.level());
    let (mut cold, mut page_level) = (
        GroupStream::new(&default).unwrap(),
        GroupStream::new(&three).unwrap(),
    );
    let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
    let (mut at_cold, mut at_three) = (0, 0);
    for run in sample_runs(32) {
        let n = cold.compress(&run, &mut frame).unwrap();
        let mut back = vec![0u8; run.len()];
        // Either stream reads the other's frames: the level is the writer's alone.
        page_level.decompress(&frame[..n], &mut back).unwrap();
        assert!(back == run);
        at_cold += n;
        at_three += page_level.compress(&run, &mut frame).unwrap();
    }
    // On real pages the cold level stores clearly fewer bytes (about 7 % on the sample).
    assert!(
        at_cold * 100 < at_three * 97,
        "level {GROUP_ZSTD_LEVEL}: {at_cold} B, level 3: {at_three} B"
    );
}

#[test]
fn default_zstd_groups_keep_a_smaller_context_for_about_the_same_bytes() {
    let default = Codec::new(Algorithm::Zstd, CodecParams::default()).unwrap();
    let nine = Codec::new(
        Algorithm::Zstd,
        CodecParams::default().with_level(GROUP_ZSTD_LEVEL),
    )
    .unwrap();
    let (mut small, mut full) = (
        GroupStream::new(&default).unwrap(),
        GroupStream::new(&nine).unwrap(),
    );
    let mut frame = vec![0u8; GROUP_COMPRESS_BOUND];
    let (mut at_small, mut at_full) = (0, 0);
    for run in sample_runs(80) {
        at_small += small.compress(&run, &mut frame).unwrap();
        at_full += full.compress(&run, &mut frame).unwrap();
    }
    let (kib_small, kib_full) = (small.context_bytes() >> 10, full.context_bytes() >> 10);
    // About 0.5 MiB less held for good by the thread that makes groups.
    assert!(
        kib_small + 400 < kib_full,
        "contexts: {kib_small} KiB with the capped tables, {kib_full} KiB at zstd's own"
    );
    // At most half a percent more bytes (0.13 % on the sample).
    assert!(
        at_small * 1000 <= at_full * 1005,
        "capped tables: {at_small} B, zstd's own: {at_full} B"
    );
}
