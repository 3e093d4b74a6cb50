//! Fuzz target `tensor_blob`: arbitrary bytes through `ndpipe_model::fuzzing::tensor_blob`, which documents what it decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndpipe_model::fuzzing::tensor_blob(data));
