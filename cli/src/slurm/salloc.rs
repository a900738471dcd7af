//! `salloc`: an allocation whose command (the user's shell unless one is given) runs here,
//! where `salloc` runs, with the allocation's `SLURM_*` variables; `srun` in it runs steps on
//! the allocation's nodes, as `srun --jobid` does. The allocation is a batch job whose script
//! holds its nodes: when the command exits, `salloc` runs one step on the first node that hands
//! the command's exit status to that script, which exits with it, so the job ends COMPLETED or
//! FAILED with the command's code, as Slurm 22.05 records it. A time limit or `scancel` revokes
//! the allocation: the command gets SIGHUP. Messages are Slurm 22.05's (checked on
//! `../shared/peers/slurm`).

use std::collections::BTreeMap;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use proto::{ClientRequest, Job, JobState, Reply};

use super::opts::{self, opt, Arg, OptDef, Parsed};
use super::sbatch::{Builder, Context, Submission};
use super::SlurmError;

pub const PROG: &str = "salloc";

/// Set in the command's environment to the allocation's id: an `srun` that finds it equal to
/// `SLURM_JOB_ID` (and is not in a batch script) runs its step in that allocation from here.
pub const SALLOC_JOB_ENV: &str = "CORRAL_SALLOC_JOB";

/// How often the command and the allocation are checked while the command runs.
const WATCH_INTERVAL_MS: u64 = 500;
/// A grant within this long of the submission is announced as immediate, as Slurm's is.
const IMMEDIATE_GRANT_MS: u64 = 1_000;

const OPTIONS: &[OptDef] = &[
    opt("account", Some('A'), Arg::Required),
    opt("begin", Some('b'), Arg::Required),
    opt("chdir", Some('D'), Arg::Required),
    opt("comment", None, Arg::Required),
    opt("constraint", Some('C'), Arg::Required),
    opt("cpus-per-gpu", None, Arg::Required),
    opt("cpus-per-task", Some('c'), Arg::Required),
    opt("dependency", Some('d'), Arg::Required),
    opt("exclude", Some('x'), Arg::Required),
    opt("exclusive", None, Arg::Optional),
    opt("gpus", Some('G'), Arg::Required),
    opt("gpus-per-node", None, Arg::Required),
    opt("gpus-per-task", None, Arg::Required),
    opt("gres", None, Arg::Required),
    opt("help", Some('h'), Arg::No),
    opt("hold", Some('H'), Arg::No),
    opt("job-name", Some('J'), Arg::Required),
    opt("mem", None, Arg::Required),
    opt("mem-per-cpu", None, Arg::Required),
    opt("mem-per-gpu", None, Arg::Required),
    opt("nodelist", Some('w'), Arg::Required),
    opt("nodes", Some('N'), Arg::Required),
    opt("ntasks", Some('n'), Arg::Required),
    opt("ntasks-per-node", None, Arg::Required),
    opt("partition", Some('p'), Arg::Required),
    opt("qos", Some('q'), Arg::Required),
    opt("quiet", Some('Q'), Arg::No),
    opt("reservation", None, Arg::Required),
    opt("spare-nodes", None, Arg::Required),
    opt("rdzv-endpoint", None, Arg::Required),
    opt("time", Some('t'), Arg::Required),
    opt("usage", None, Arg::No),
    opt("verbose", Some('v'), Arg::No),
    opt("version", Some('V'), Arg::No),
];

/// Of the variables a batch script gets, those Slurm's `salloc` gives its command.
const SALLOC_VARS: &[&str] = &[
    "SLURM_CPUS_PER_TASK",
    "SLURM_JOBID",
    "SLURM_JOB_CPUS_PER_NODE",
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_NUM_NODES",
    "SLURM_JOB_PARTITION",
    "SLURM_MEM_PER_CPU",
    "SLURM_MEM_PER_GPU",
    "SLURM_NNODES",
    "SLURM_NODELIST",
    "SLURM_SUBMIT_DIR",
    "SLURM_SUBMIT_HOST",
    "SLURM_TASKS_PER_NODE",
];

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// SIGINT and SIGTERM are noted, not fatal: while pending they give up the allocation, while
/// the command runs SIGINT is the command's (Ctrl-C reaches it too) and SIGTERM releases.
pub(super) fn catch_signals() {
    // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// The FIFO on the first node through which the command's exit status reaches the script.
fn fifo_path(token: &str) -> String {
    format!("/tmp/.corral-salloc-{token}")
}

/// The allocation's script: holds the nodes until a status arrives on its FIFO (made only by
/// it, mode 600, refused if the path exists), then exits with it.
pub fn holder_script(token: &str) -> String {
    let f = fifo_path(token);
    format!(
        "#!/bin/sh\n# salloc's allocation: holds its nodes for steps until salloc hands over its command's exit status.\n\
         f={f}\nmkfifo -m 600 \"$f\" || exit 1\ntrap 'rm -f \"$f\"' EXIT\ntrap 'exit 143' TERM\nread code < \"$f\"\nexit \"${{code:-1}}\"\n"
    )
}

/// The command of the step that releases the allocation with exit status `code`.
pub fn release_command(token: &str, code: i32) -> String {
    format!("f={}; [ -p \"$f\" ] && printf '%s\\n' {code} > \"$f\"", fifo_path(token))
}

fn allocation(p: &Parsed, token: &str) -> Result<Submission, SlurmError> {
    holder_allocation(PROG, p, &["quiet", "verbose"], token, "interactive".into())
}

/// An allocation of `prog`'s options in `p` (but `skip`) whose script holds its nodes until
/// [`release`] (salloc's, and `srun --pty`'s outside an allocation), named `name` unless `-J`.
pub(super) fn holder_allocation(
    prog: &'static str,
    p: &Parsed,
    skip: &[&str],
    token: &str,
    name: String,
) -> Result<Submission, SlurmError> {
    let ctx = Context::current()?;
    let mut b = Builder::new(prog, &ctx);
    for (opt, value) in &p.opts {
        if !skip.contains(opt) {
            b.apply(opt, value.as_deref())?;
        }
    }
    b.apply("output", Some("/dev/null"))?;
    let mut sub = b.finish(Some(holder_script(token)), Vec::new(), name)?;
    sub.spec.set_batch(true);
    // Like srun's allocations, not a batch job to `scontrol requeue`.
    sub.spec.set_srun_allocation(true);
    Ok(sub)
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, true)?;
    if p.has("help") || p.has("usage") {
        println!("Usage: salloc [OPTIONS(0)...] [command(0) [args(0)...]]");
        return Ok(0);
    }
    if p.has("version") {
        return Ok(super::print_version());
    }
    let command = if p.operands.is_empty() {
        vec![std::env::var("SHELL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/sh".into())]
    } else {
        p.operands.clone()
    };
    let token = new_token();
    let sub = allocation(&p, &token)?;
    let quiet = p.has("quiet");
    super::sbatch::print_warnings(&sub.warnings, quiet);
    let say = |line: String| {
        if !quiet {
            eprintln!("{PROG}: {line}");
        }
    };
    catch_signals();
    let cluster = super::connect(PROG)?;
    let (job, names) = super::block_on(PROG, granted(PROG, &cluster, &sub, &say))??;
    let mut child = Command::new(&command[0])
        .args(&command[1..])
        .envs(command_env(&job, &names))
        .spawn()
        .map_err(|e| SlurmError::fatal(PROG, format!("{}: {e}", command[0])))?;
    let (code, revoked) = watch(&cluster, &job, &mut child, &say)?;
    if !revoked {
        say(format!("Relinquishing job allocation {}", job.id));
        release(PROG, &cluster, &job, &names, &token, code);
    }
    Ok(code)
}

/// The secret part of the FIFO's name that the allocation's script and its releasing step share.
pub(super) fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Submits the allocation and waits until it runs: the job and its nodes' names. Pending past
/// [`IMMEDIATE_GRANT_MS`], it says so as Slurm does; SIGINT or SIGTERM meanwhile cancels it.
/// `prog`: `salloc`, or `srun --pty` outside an allocation, which asks for one the same way.
pub(super) async fn granted(
    prog: &str,
    cluster: &crate::client::Cluster,
    sub: &Submission,
    say: &impl Fn(String),
) -> Result<(Job, Vec<String>), SlurmError> {
    // Each program's words for a refused submission (Slurm 22.05's).
    let refused = if prog == PROG { "Job submit/allocate failed" } else { "Unable to allocate resources" };
    let reply = cluster
        .call_patiently(ClientRequest::Submit { spec: sub.spec.clone() }, super::PATIENCE)
        .await
        .map_err(|e| SlurmError::fatal(prog, format!("{refused}: {}", super::describe_error(&e))))?;
    let Reply::Submitted { job: id } = reply else {
        return Err(SlurmError::fatal(prog, format!("unexpected reply {reply:?}")));
    };
    let submitted = Instant::now();
    let mut announced = false;
    loop {
        if SIGNAL.swap(0, Ordering::SeqCst) != 0 {
            if let Err(e) = super::call(prog, cluster, ClientRequest::Cancel { job: id }).await {
                eprintln!("{}", e.text);
            }
            return Err(SlurmError::fatal(prog, format!("Job allocation {id} has been revoked.")));
        }
        let job = match super::call(prog, cluster, ClientRequest::GetJob { job: id }).await? {
            Reply::Job(j) => *j,
            other => return Err(SlurmError::fatal(prog, format!("unexpected reply {other:?}"))),
        };
        // Granted once every node has started its part: a step before that finds no job there.
        if job.state == JobState::Running && super::parts_started(&job) {
            if announced {
                say(format!("job {id} has been allocated resources"));
            }
            say(format!("Granted job allocation {id}"));
            let nodes = super::list_nodes(prog, cluster).await?;
            let names = super::job_node_names(&job, &super::node_names(&nodes));
            return Ok((job, names));
        }
        if job.state.is_final() {
            return Err(SlurmError::fatal(prog, format!("Job allocation {id} has been revoked.")));
        }
        if !announced && submitted.elapsed() >= Duration::from_millis(IMMEDIATE_GRANT_MS) {
            say(format!("Pending job allocation {id}"));
            say(format!("job {id} queued and waiting for resources"));
            announced = true;
        }
        // Quick while a grant may still count as immediate, then at the watch's pace.
        let poll_ms = if announced { WATCH_INTERVAL_MS } else { 100 };
        tokio::time::sleep(Duration::from_millis(poll_ms)).await;
    }
}

/// This process's environment with the allocation's variables and [`SALLOC_JOB_ENV`].
fn command_env(job: &Job, names: &[String]) -> BTreeMap<String, String> {
    let all = slurm_compat::env::slurm_env(job, names, 0, "", &[]);
    let mut env: BTreeMap<String, String> = all.into_iter().filter(|(k, v)| SALLOC_VARS.contains(&k.as_str()) && !v.is_empty()).collect();
    if job.spec.extra.contains_key(slurm_compat::env::extra::NTASKS) {
        let ntasks: u32 = slurm_compat::env::tasks_per_node(&job.spec, names.len()).iter().sum();
        env.insert("SLURM_NTASKS".into(), ntasks.to_string());
        env.insert("SLURM_NPROCS".into(), ntasks.to_string());
    }
    env.insert(SALLOC_JOB_ENV.into(), job.id.to_string());
    env
}

/// Waits for the command while watching the allocation: its exit code, and whether the
/// allocation was revoked (time limit, `scancel`) first, in which case the command got SIGHUP.
/// SIGTERM to salloc sends the command SIGHUP and releases the allocation once it exits.
fn watch(cluster: &crate::client::Cluster, job: &Job, child: &mut Child, say: &impl Fn(String)) -> Result<(i32, bool), SlurmError> {
    let hang_up = |child: &Child| {
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) on the child's pid, which is ours until it is waited for.
            unsafe { libc::kill(pid, libc::SIGHUP) };
        }
    };
    let mut revoked = false;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok((status_code(status), revoked)),
            Ok(None) => {}
            Err(e) => return Err(SlurmError::fatal(PROG, format!("wait for the command: {e}"))),
        }
        if SIGNAL.swap(0, Ordering::SeqCst) == libc::SIGTERM {
            hang_up(child);
        }
        if !revoked {
            // A failed read (an election) is tried again at the next tick.
            let now = super::block_on(PROG, cluster.call(ClientRequest::GetJob { job: job.id }))?;
            if let Ok(Ok(Reply::Job(j))) = now {
                if j.state.is_final() {
                    if j.state == JobState::Timeout {
                        say(format!("Job {} has exceeded its time limit and its allocation has been revoked.", job.id));
                    } else {
                        say(format!("Job allocation {} has been revoked.", job.id));
                    }
                    revoked = true;
                    hang_up(child);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(WATCH_INTERVAL_MS));
    }
}

fn status_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// How long the allocation may take to end once its status is handed over.
const RELEASE_WAIT_MS: u64 = 30_000;

/// Ends the allocation with the command's exit status `code`: a step on its first node hands the
/// status to the allocation's script, which exits with it. If that step cannot start, or the job
/// has not ended [`RELEASE_WAIT_MS`] later, the allocation is cancelled.
pub(super) fn release(prog: &str, cluster: &crate::client::Cluster, job: &Job, names: &[String], token: &str, code: i32) {
    let first = names.first().cloned().unwrap_or_default();
    let args: Vec<String> =
        ["--quiet", "-N1", "-n1", "-w", &first, "sh", "-c", &release_command(token, code)].iter().map(|s| s.to_string()).collect();
    let id = job.id;
    let launched = opts::parse(super::step::PROG, super::step::OPTIONS, &args, true)
        .and_then(|p| super::step::launch_step_in_job(&p, &id.to_string(), true));
    let ended = launched.and_then(|()| {
        let wait = async { tokio::time::timeout(Duration::from_millis(RELEASE_WAIT_MS), super::wait_for(prog, cluster, id)).await };
        match super::block_on(prog, wait)? {
            Ok(ended) => ended.map(|_| ()),
            Err(_) => Err(SlurmError::fatal(prog, format!("job {id} had not ended {RELEASE_WAIT_MS} ms after its status"))),
        }
    });
    if let Err(e) = ended {
        eprintln!("{}", e.text);
        eprintln!("{prog}: error: could not hand the exit status to job {id}; cancelling it");
        if let Err(e) = super::block_on(prog, super::call(prog, cluster, ClientRequest::Cancel { job: id })).and_then(|r| r) {
            eprintln!("{}", e.text);
        }
    }
}
