#![no_main]
//! Fuzz target: hostlists (see corral_cli::slurm::fuzzing).
libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_cli::slurm::fuzzing::hostlist(data));
