#![no_main]
//! Fuzz target: command frames (see proto::fuzzing).
libfuzzer_sys::fuzz_target!(|data: &[u8]| proto::fuzzing::command(data));
