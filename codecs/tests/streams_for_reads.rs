//! Streams made for reads: their decompression ready, zstd's compression workspace made only at
//! their first compression or `warm_compression`, and every page they handle exact.

use uzram_codecs::pages::{noise_page, text_page};
use uzram_codecs::{Algorithm, Codec, CodecParams, PAGE_SIZE};

#[test]
fn a_stream_for_reads_holds_no_compression_workspace_until_it_compresses() {
    let dict: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 97) as u8).collect();
    for params in [
        CodecParams::default(),
        CodecParams::default().with_level(9),
        CodecParams::default().with_dict(dict),
    ] {
        let codec = Codec::new(Algorithm::Zstd, params.clone()).unwrap();
        let mut full = codec.stream().unwrap();
        let mut reads = codec.stream_for_reads().unwrap();
        // zstd's workspace for one page is tens of KiB; a stream for reads has none yet.
        assert!(
            reads.context_bytes() + (32 << 10) < full.context_bytes(),
            "{params:?}: {} for reads, {} in full",
            reads.context_bytes(),
            full.context_bytes()
        );
        // It reads what the full stream wrote.
        let mut frame = vec![0u8; 2 * PAGE_SIZE];
        let mut back = [0u8; PAGE_SIZE];
        for i in 0..8 {
            let page = if i % 2 == 0 {
                text_page(i)
            } else {
                noise_page(i)
            };
            let n = full.compress(&page, &mut frame).unwrap();
            reads.decompress(&frame[..n], &mut back).unwrap();
            assert_eq!(back, page);
        }
        // Warmed, it holds what a full stream holds, and writes what it writes.
        reads.warm_compression().unwrap();
        assert_eq!(reads.context_bytes(), full.context_bytes(), "{params:?}");
        let page = text_page(99);
        let n = reads.compress(&page, &mut frame).unwrap();
        full.decompress(&frame[..n], &mut back).unwrap();
        assert_eq!(back, page);
    }
    // lz4 has no workspace to make: both kinds are the same.
    let lz4 = Codec::new(Algorithm::Lz4, CodecParams::default()).unwrap();
    let mut reads = lz4.stream_for_reads().unwrap();
    let mut frame = vec![0u8; 2 * PAGE_SIZE];
    let n = reads.compress(&text_page(1), &mut frame).unwrap();
    let mut back = [0u8; PAGE_SIZE];
    lz4.stream()
        .unwrap()
        .decompress(&frame[..n], &mut back)
        .unwrap();
    assert_eq!(back, text_page(1));
}
