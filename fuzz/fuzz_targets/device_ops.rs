//! Random device operations checked against a model of the pages.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uzram_engine::testing::fuzzing::device_ops(data));
