//! Fuzz target `s3`: arbitrary bytes through `ndpipe_store::fuzzing::s3`, which documents what it decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndpipe_store::fuzzing::s3(data));
