//! Fuzz target `preprocess`: arbitrary bytes through `ndpipe_model::fuzzing::preprocess`, which documents what it decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndpipe_model::fuzzing::preprocess(data));
