//! Decompress corrupt input; see `uzram_codecs::fuzzing::codec_decompress_corrupt`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uzram_codecs::fuzzing::codec_decompress_corrupt(data));
