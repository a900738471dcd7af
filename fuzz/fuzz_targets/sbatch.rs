#![no_main]
//! Fuzz target: #SBATCH scripts (see corral_cli::slurm::fuzzing).
libfuzzer_sys::fuzz_target!(|data: &[u8]| corral_cli::slurm::fuzzing::sbatch_script(data));
