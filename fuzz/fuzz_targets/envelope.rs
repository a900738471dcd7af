#![no_main]
//! Fuzz target: envelope frames (see proto::fuzzing).
libfuzzer_sys::fuzz_target!(|data: &[u8]| proto::fuzzing::envelope(data));
