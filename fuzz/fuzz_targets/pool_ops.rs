//! Random pool operations checked against a model of live objects.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| uzram_allocator::fuzzing::pool_ops(data));
