//! Fuzz target `head_file`: arbitrary bytes through `ndpipe_model::fuzzing::head_file`, which documents what it decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndpipe_model::fuzzing::head_file(data));
