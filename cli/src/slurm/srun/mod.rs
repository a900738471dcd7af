//! `srun`: its arguments, and which of its modes runs them. In a batch job (`sbatch`, whose
//! script runs on the job's first node), with `--jobid`, or in `salloc`'s command, it starts a
//! job step in the allocation and follows it (`in_allocation`); in a `corral submit` job,
//! where every node runs the command already, it starts only this node's tasks, as child
//! processes (`local`); outside an allocation it asks for one, runs the step in it from here
//! and ends it with the step's exit code (`new_allocation`). What a step is (its options,
//! plan and spec, and launching it) is [`super::step`]'s, which `salloc` uses too.

mod in_allocation;
mod local;
mod new_allocation;

use proto::PtySize;

use super::opts::{self, Parsed};
use super::SlurmError;

pub use super::step::{launch_step_in_job, plan_step, step_spec, StepPlan, TaskPlan, OPTIONS, PROG};
pub use in_allocation::run_step_in_job;

/// srun-only options: accepted, and without effect on a local step or a submitted job.
const STEP_ONLY: &[&str] = &[
    "cpu-bind",
    "exact",
    "immediate",
    "jobid",
    "kill-on-bad-exit",
    "label",
    "mpi",
    "overlap",
    "preserve-env",
    "pty",
    "quiet",
    "unbuffered",
    "verbose",
    "wait",
    "whole",
    "input",
    "help",
    "usage",
    "version",
];

/// Options a step of a `corral submit` job (whose `srun` starts its node's tasks itself, not
/// through the node's agent) takes without effect, and what the step does instead.
const LOCAL_STEP_WITHOUT_EFFECT: &[(&str, &str)] = &[
    ("cpus-per-task", "it sets SLURM_CPUS_PER_TASK; a `corral submit` job's step holds no CPUs of its own"),
    ("mem", "a `corral submit` job's step shares the job's memory"),
    ("mem-per-cpu", "a `corral submit` job's step shares the job's memory"),
    ("mem-per-gpu", "a `corral submit` job's step shares the job's memory"),
    ("exclusive", "a `corral submit` job's step shares the job's CPUs"),
    ("exact", "a `corral submit` job's step shares the job's CPUs"),
];

/// Options srun takes without effect yet wherever it runs (a step, or the job it makes
/// outside an allocation), and what it does instead.
const SRUN_WITHOUT_EFFECT: &[(&str, &str)] = &[
    ("cpu-bind", "tasks are not bound to CPUs"),
    ("mem-bind", "tasks are not bound to memory"),
    ("gpu-bind", "tasks see the step's GPUs"),
    ("mpi", "no PMI is set up; torchrun and NCCL need none"),
    ("immediate", "srun waits for its resources however long that takes"),
    ("wait", "tasks still running after the first one exits are not killed"),
];

/// Options a step inside an allocation takes without effect yet (Slurm applies them to steps
/// too), and what the step does instead.
const STEP_WITHOUT_EFFECT: &[(&str, &str)] = &[("signal", "the job's own --signal reaches its steps")];

/// One stderr line for each option of `p` that this `srun` takes without effect (never
/// silently): `in_allocation` for a step in an existing allocation, `local_step` for a step
/// of a `corral submit` job, which starts its node's tasks itself. Pure.
pub fn step_warnings(p: &Parsed, in_allocation: bool, local_step: bool) -> Vec<String> {
    let local = LOCAL_STEP_WITHOUT_EFFECT.iter().filter(|_| local_step);
    let step = STEP_WITHOUT_EFFECT.iter().filter(|_| in_allocation);
    local
        .chain(step)
        .chain(SRUN_WITHOUT_EFFECT)
        .filter(|(name, _)| p.has(name) && !(*name == "mpi" && p.last("mpi") == Some("none")))
        .map(|(name, instead)| format!("{PROG}: warning: --{name} has no effect in Corral yet: {instead}"))
        .collect()
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, true)?;
    if p.has("help") || p.has("usage") {
        println!("Usage: srun [OPTIONS(0)... [executable(0) [args(0)...]]]");
        return Ok(0);
    }
    if p.has("version") {
        return Ok(super::print_version());
    }
    if p.operands.is_empty() {
        return Err(SlurmError::fatal(PROG, "No command given to execute."));
    }
    let pty = pty_size(&p)?;
    let env = super::allocation_env(&std::env::vars().collect());
    let job_id = env.get("SLURM_JOB_ID").filter(|j| !j.is_empty());
    let batch = std::env::var(slurm_compat::env::BATCH_ENV).is_ok_and(|v| v == "1");
    let in_salloc = job_id.is_some_and(|id| !batch && env.get(super::salloc::SALLOC_JOB_ENV) == Some(id));
    let local_step = !p.has("jobid") && job_id.is_some() && !batch && !in_salloc;
    if p.has("spare-nodes") && (job_id.is_some() || p.has("jobid")) {
        return Err(SlurmError::fatal(PROG, "--spare-nodes is for a new allocation; a step runs on its job's nodes"));
    }
    super::sbatch::print_warnings(&step_warnings(&p, job_id.is_some() || p.has("jobid"), local_step), p.has("quiet"));
    if let Some(text) = p.last("jobid") {
        run_step_in_job(&p, text, pty)
    } else if let Some(id) = job_id.filter(|_| in_salloc) {
        // In salloc's command, where the allocation's nodes are elsewhere.
        run_step_in_job(&p, id, pty)
    } else if job_id.is_some() {
        if batch {
            in_allocation::run_step(&p, &env, pty)
        } else if pty.is_some() {
            Err(SlurmError::fatal(PROG, "--pty is not supported in a `corral submit` job, whose srun starts its node's tasks itself"))
        } else {
            local::run_local_step(&p, &env)
        }
    } else {
        new_allocation::run_in_new_allocation(&p, pty)
    }
}

/// `--pty`: the size of this terminal, which the step's pseudo-terminal takes; None when not
/// asked for, or when stdin is no terminal: then, as Slurm 22.05 does, it says so and the step
/// runs without one.
fn pty_size(p: &Parsed) -> Result<Option<PtySize>, SlurmError> {
    if !p.has("pty") {
        return Ok(None);
    }
    if ["input", "output", "error"].iter().any(|o| p.has(o)) {
        return Err(SlurmError::fatal(PROG, "--error/--input/--output are incompatible with --pty"));
    }
    match super::terminal::size(libc::STDIN_FILENO) {
        Some(size) => Ok(Some(size)),
        None => {
            let e = std::io::Error::last_os_error();
            let why = e.to_string().split(" (os error").next().unwrap_or_default().to_string();
            eprintln!("{PROG}: error: ioctl(TIOCGWINSZ): {why}");
            eprintln!("{PROG}: error: Not using a pseudo-terminal, disregarding --pty option");
            Ok(None)
        }
    }
}

/// Slurm's words for a task killed by signal `sig` (both modes that see task exits report them).
fn signal_words(sig: i32) -> String {
    match sig {
        libc::SIGKILL => "Killed".into(),
        libc::SIGTERM => "Terminated".into(),
        libc::SIGINT => "Interrupt".into(),
        libc::SIGSEGV => "Segmentation fault".into(),
        libc::SIGABRT => "Aborted".into(),
        other => format!("Killed by signal {other}"),
    }
}
