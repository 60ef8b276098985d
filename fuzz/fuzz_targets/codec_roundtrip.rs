//! Compress and decompress pages with a codec chosen by the input; see
//! `uzram_codecs::fuzzing::codec_roundtrip`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uzram_codecs::fuzzing::codec_roundtrip(data));
