//! `srun` outside any allocation, as Slurm's srun: it asks for an allocation (held by a script
//! as `salloc` holds one, and waited for with `salloc`'s words trimmed to srun's), runs the step
//! in it from here as in an allocation (stdin, `--pty`; `--output`/`--error` are the step's),
//! and ends the allocation with the step's exit status.

use proto::PtySize;

use crate::slurm::opts::Parsed;
use crate::slurm::step::PROG;
use crate::slurm::{salloc, sbatch, SlurmError};

use super::in_allocation::run_step_in_job;
use super::STEP_ONLY;

/// Outside an allocation, as Slurm's srun: an allocation first (held as salloc holds one), then
/// the step from here, with this process's stdin (and terminal, with `pty`); the allocation
/// ends with the step's exit status.
pub(super) fn run_in_new_allocation(p: &Parsed, pty: Option<PtySize>) -> Result<i32, SlurmError> {
    let token = salloc::new_token();
    let name = std::path::Path::new(&p.operands[0]).file_name().map_or_else(|| p.operands[0].clone(), |n| n.to_string_lossy().into_owned());
    // The step's own output files are srun's to write, not the holder's.
    let skip: Vec<&str> = STEP_ONLY.iter().copied().chain(["output", "error", "open-mode"]).collect();
    let sub = salloc::holder_allocation(PROG, p, &skip, &token, name)?;
    let quiet = p.has("quiet");
    sbatch::print_warnings(&sub.warnings, quiet);
    // Noted where granted() looks: SIGINT or SIGTERM while pending gives the allocation up.
    salloc::catch_signals();
    let cluster = crate::slurm::connect(PROG)?;
    // srun says only that it waits and when it got its nodes, not salloc's "Granted ..." lines.
    let say = |line: String| {
        if !quiet && line.starts_with("job ") {
            eprintln!("{PROG}: {line}");
        }
    };
    let (job, names) = crate::slurm::block_on(PROG, salloc::granted(PROG, &cluster, &sub, &say))??;
    let ran = run_step_in_job(p, &job.id.to_string(), pty);
    // An allocation whose step could not run ends FAILED (code 1), as the error says.
    salloc::release(PROG, &cluster, &job, &names, &token, *ran.as_ref().unwrap_or(&1));
    ran
}
