//! Fuzz target `idx`: arbitrary bytes through `ndpipe_util::fuzzing::idx`, which documents what it decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndpipe_util::fuzzing::idx(data));
