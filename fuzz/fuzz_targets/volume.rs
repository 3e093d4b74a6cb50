//! Fuzz target `volume`: arbitrary bytes through `ndpipe_store::fuzzing::volume`, which documents what it decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndpipe_store::fuzzing::volume(data));
