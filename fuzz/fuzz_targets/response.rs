#![no_main]
//! Fuzz target: response frames (see proto::fuzzing).
libfuzzer_sys::fuzz_target!(|data: &[u8]| proto::fuzzing::response(data));
