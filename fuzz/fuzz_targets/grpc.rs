//! Fuzz target `grpc`: arbitrary bytes through `ndpipe_proto::fuzzing::grpc`, which documents what it decodes.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndpipe_proto::fuzzing::grpc(data));
