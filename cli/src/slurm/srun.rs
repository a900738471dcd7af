//! `srun`. In a batch job (`sbatch`, whose script runs on the job's first node) it starts a job
//! step: the local `corrald` (`$CORRAL_SOCKET`) numbers it and has the agent of each of the
//! step's nodes start its tasks (with `SLURM_STEP_*`, `SLURM_PROCID`, `SLURM_LOCALID`, ...);
//! `srun` prints their output as it comes, passes SIGINT and SIGTERM on to every task, and
//! returns the worst exit status. In a `corral submit` job, where every node runs the command
//! already, it starts only this node's tasks, as child processes. Outside an allocation it asks
//! for one, runs the step in it from here as in an allocation (stdin, `--pty`), and ends it
//! with the step's exit code; with `--output`/`--error` the allocation's script runs the step
//! and srun streams the job's files.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use proto::{LogStream, PtySize, Reply, Request};

use super::opts::{self, opt, Arg, OptDef, Parsed};
use super::{hostlist, SlurmError};

pub const PROG: &str = "srun";

/// How long `srun --jobid` waits for a running job's nodes to start their parts.
const PARTS_STARTED_WAIT_MS: u64 = 10_000;

pub const OPTIONS: &[OptDef] = &[
    opt("account", Some('A'), Arg::Required),
    opt("begin", Some('b'), Arg::Required),
    opt("chdir", Some('D'), Arg::Required),
    opt("comment", None, Arg::Required),
    opt("constraint", Some('C'), Arg::Required),
    opt("cpu-bind", None, Arg::Required),
    opt("cpus-per-gpu", None, Arg::Required),
    opt("cpus-per-task", Some('c'), Arg::Required),
    opt("dependency", Some('d'), Arg::Required),
    opt("distribution", Some('m'), Arg::Required),
    opt("error", Some('e'), Arg::Required),
    opt("exact", None, Arg::No),
    opt("exclude", Some('x'), Arg::Required),
    opt("exclusive", None, Arg::Optional),
    opt("export", None, Arg::Required),
    opt("gpu-bind", None, Arg::Required),
    opt("gpus", Some('G'), Arg::Required),
    opt("gpus-per-node", None, Arg::Required),
    opt("gpus-per-task", None, Arg::Required),
    opt("gres", None, Arg::Required),
    opt("gres-flags", None, Arg::Required),
    opt("help", Some('h'), Arg::No),
    opt("hold", Some('H'), Arg::No),
    opt("immediate", Some('I'), Arg::Optional),
    opt("input", Some('i'), Arg::Required),
    opt("jobid", None, Arg::Required),
    opt("job-name", Some('J'), Arg::Required),
    opt("kill-on-bad-exit", Some('K'), Arg::Optional),
    opt("label", Some('l'), Arg::No),
    opt("mail-type", None, Arg::Required),
    opt("mail-user", None, Arg::Required),
    opt("mem", None, Arg::Required),
    opt("mem-bind", None, Arg::Required),
    opt("mem-per-cpu", None, Arg::Required),
    opt("mem-per-gpu", None, Arg::Required),
    opt("mpi", None, Arg::Required),
    opt("nodelist", Some('w'), Arg::Required),
    opt("nodes", Some('N'), Arg::Required),
    opt("ntasks", Some('n'), Arg::Required),
    opt("ntasks-per-node", None, Arg::Required),
    opt("open-mode", None, Arg::Required),
    opt("output", Some('o'), Arg::Required),
    opt("overcommit", Some('O'), Arg::No),
    opt("overlap", None, Arg::No),
    opt("partition", Some('p'), Arg::Required),
    opt("preserve-env", Some('E'), Arg::No),
    opt("pty", None, Arg::No),
    opt("qos", Some('q'), Arg::Required),
    opt("quiet", Some('Q'), Arg::No),
    opt("requeue", None, Arg::No),
    opt("no-requeue", None, Arg::No),
    opt("signal", None, Arg::Required),
    opt("time", Some('t'), Arg::Required),
    opt("unbuffered", Some('u'), Arg::No),
    opt("usage", None, Arg::No),
    opt("verbose", Some('v'), Arg::No),
    opt("version", Some('V'), Arg::No),
    opt("wait", Some('W'), Arg::Required),
    opt("whole", None, Arg::No),
];

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

/// One task of a local step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskPlan {
    pub rank: u32,
    pub local_id: u32,
    pub env: BTreeMap<String, String>,
}

/// The shape of a step inside an allocation and the tasks this node runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepPlan {
    pub step_id: u32,
    pub nodes: Vec<String>,
    pub tasks_per_node: Vec<u32>,
    /// Index of this node in `nodes`, if it takes part.
    pub node_index: Option<usize>,
    pub tasks: Vec<TaskPlan>,
    /// The step's variables, the same for every task (`SLURM_STEP_*`, `SLURM_NTASKS`, ...).
    pub base: BTreeMap<String, String>,
}

/// Plans the step from the allocation's variables in `env` and srun's options.
pub fn plan_step(p: &Parsed, env: &BTreeMap<String, String>, step_id: u32) -> Result<StepPlan, SlurmError> {
    let (job_nodes, here) = allocation_nodes(env)?;
    let mut nodes = wanted_nodes(p, &job_nodes)?;
    let ntasks_opt = p.last("ntasks").map(|n| super::sbatch::parse_int(PROG, "--ntasks", n)).transpose()?;
    let per_node_opt = p.last("ntasks-per-node").map(|n| super::sbatch::parse_int(PROG, "--ntasks-per-node", n)).transpose()?;
    limit_node_count(p, &mut nodes, ntasks_opt, per_node_opt)?;
    let tasks_per_node = step_tasks_per_node(p, env, &nodes, job_nodes.len(), ntasks_opt, per_node_opt);
    let node_index =
        here.as_ref().and_then(|h| nodes.iter().position(|n| n == h)).or_else(|| (nodes.len() == 1 && here.is_none()).then_some(0));
    let base = step_env(p, env, step_id, &nodes, &tasks_per_node, &job_nodes, here.as_deref())?;
    let tasks = match node_index {
        Some(idx) => local_tasks(p, env, &base, &tasks_per_node, idx),
        None => Vec::new(),
    };
    Ok(StepPlan { step_id, nodes, tasks_per_node, node_index, tasks, base })
}

/// The allocation's nodes (this host alone when `env` names none) and this node's name, if
/// known.
fn allocation_nodes(env: &BTreeMap<String, String>) -> Result<(Vec<String>, Option<String>), SlurmError> {
    let job_nodes = hostlist::expand(env.get("SLURM_JOB_NODELIST").or(env.get("SLURM_NODELIST")).map_or("", String::as_str))
        .map_err(|m| SlurmError::fatal(PROG, m))?;
    let job_nodes =
        if job_nodes.is_empty() { vec![env.get("SLURMD_NODENAME").cloned().unwrap_or_else(super::host_name)] } else { job_nodes };
    let here = env.get("SLURMD_NODENAME").cloned().or_else(|| {
        let id: usize = env.get("SLURM_NODEID")?.parse().ok()?;
        job_nodes.get(id).cloned()
    });
    Ok((job_nodes, here))
}

/// The nodes of `job_nodes` the step may use: `--nodelist` (all in the allocation), less
/// `--exclude`.
fn wanted_nodes(p: &Parsed, job_nodes: &[String]) -> Result<Vec<String>, SlurmError> {
    let fatal = |m: String| SlurmError::fatal(PROG, m);
    let mut nodes = job_nodes.to_vec();
    if let Some(w) = p.last("nodelist") {
        let wanted = hostlist::expand(w).map_err(fatal)?;
        if let Some(bad) = wanted.iter().find(|n| !job_nodes.contains(n)) {
            return Err(fatal(format!("Requested node configuration is not available: {bad} is not in the allocation")));
        }
        nodes = wanted;
    }
    if let Some(x) = p.last("exclude") {
        let excluded = hostlist::expand(x).map_err(fatal)?;
        nodes.retain(|n| !excluded.contains(n));
    }
    Ok(nodes)
}

/// Keeps the first `--nodes` of `nodes` (more than there are is an error), or, with
/// `--ntasks` alone, no more nodes than tasks.
fn limit_node_count(p: &Parsed, nodes: &mut Vec<String>, ntasks_opt: Option<u32>, per_node_opt: Option<u32>) -> Result<(), SlurmError> {
    let fatal = |m: String| SlurmError::fatal(PROG, m);
    if let Some(n) = p.last("nodes") {
        let count =
            n.split('-').next().and_then(|c| c.parse::<usize>().ok()).ok_or_else(|| fatal(format!("\"{n}\" is not a valid node count")))?;
        if count == 0 || count > nodes.len() {
            return Err(fatal(format!("Only allocated {} nodes asked for {count}", nodes.len())));
        }
        nodes.truncate(count);
    } else if let (Some(total), None) = (ntasks_opt, per_node_opt) {
        // Fewer tasks than nodes: one node per task.
        nodes.truncate((total as usize).max(1));
    }
    Ok(())
}

/// Tasks on each of the step's `nodes`: from `--ntasks-per-node` or `--ntasks`, else from the
/// allocation's (`job_node_count` nodes) as `env` tells them.
fn step_tasks_per_node(
    p: &Parsed,
    env: &BTreeMap<String, String>,
    nodes: &[String],
    job_node_count: usize,
    ntasks_opt: Option<u32>,
    per_node_opt: Option<u32>,
) -> Vec<u32> {
    let n = nodes.len().max(1) as u32;
    match (ntasks_opt, per_node_opt) {
        (_, Some(k)) => vec![k; nodes.len()],
        (Some(total), None) => (0..n).map(|i| total / n + u32::from(i < total % n)).collect(),
        (None, None) => {
            let total: Option<u32> = env.get("SLURM_NTASKS").and_then(|t| t.parse().ok());
            let per: Option<u32> = env.get("SLURM_NTASKS_PER_NODE").and_then(|t| t.parse().ok());
            match (per, total) {
                (Some(k), _) if p.last("nodelist").is_some() || nodes.len() != job_node_count => {
                    vec![k; nodes.len()]
                }
                (_, Some(total)) if nodes.len() == job_node_count && total >= n => {
                    (0..n).map(|i| total / n + u32::from(i < total % n)).collect()
                }
                (Some(k), _) => vec![k; nodes.len()],
                _ => vec![1; nodes.len()],
            }
        }
    }
}

/// The step's variables, the same for every task (`SLURM_STEP_*`, `SLURM_NTASKS`, the job's
/// id and nodes, `SLURMD_NODENAME` when `here` is known, `SLURM_CPUS_PER_TASK`).
fn step_env(
    p: &Parsed,
    env: &BTreeMap<String, String>,
    step_id: u32,
    nodes: &[String],
    tasks_per_node: &[u32],
    job_nodes: &[String],
    here: Option<&str>,
) -> Result<BTreeMap<String, String>, SlurmError> {
    let total: u32 = tasks_per_node.iter().sum();
    let nodelist = hostlist::compress(nodes);
    let mut base = BTreeMap::new();
    let job_id = env.get("SLURM_JOB_ID").cloned().unwrap_or_default();
    base.insert("SLURM_STEP_ID".to_string(), step_id.to_string());
    base.insert("SLURM_STEPID".to_string(), step_id.to_string());
    base.insert("SLURM_STEP_NODELIST".to_string(), nodelist.clone());
    base.insert("SLURM_STEP_NUM_NODES".to_string(), nodes.len().to_string());
    base.insert("SLURM_STEP_NUM_TASKS".to_string(), total.to_string());
    base.insert("SLURM_STEP_TASKS_PER_NODE".to_string(), hostlist::compress_counts(tasks_per_node));
    base.insert("SLURM_NTASKS".to_string(), total.to_string());
    base.insert("SLURM_NPROCS".to_string(), total.to_string());
    base.insert("SLURM_NNODES".to_string(), nodes.len().to_string());
    base.insert("SLURM_NODELIST".to_string(), nodelist);
    base.insert("SLURM_TASKS_PER_NODE".to_string(), hostlist::compress_counts(tasks_per_node));
    base.insert("SLURM_JOB_ID".to_string(), job_id.clone());
    base.insert("SLURM_JOBID".to_string(), job_id);
    base.insert("SLURM_JOB_NODELIST".to_string(), hostlist::compress(job_nodes));
    base.insert("SLURM_JOB_NUM_NODES".to_string(), job_nodes.len().to_string());
    if let Some(h) = here {
        base.insert("SLURMD_NODENAME".to_string(), h.to_string());
    }
    if let Some(c) = p.last("cpus-per-task") {
        base.insert("SLURM_CPUS_PER_TASK".to_string(), super::sbatch::parse_int(PROG, "--cpus-per-task", c)?.to_string());
    }
    Ok(base)
}

/// The tasks node `idx` of the step runs: `base` with each task's ranks, and with
/// `--gpus-per-task` its share of the node's `CUDA_VISIBLE_DEVICES`.
fn local_tasks(
    p: &Parsed,
    env: &BTreeMap<String, String>,
    base: &BTreeMap<String, String>,
    tasks_per_node: &[u32],
    idx: usize,
) -> Vec<TaskPlan> {
    let first: u32 = tasks_per_node[..idx].iter().sum();
    let here_count = tasks_per_node[idx];
    let gtids = (first..first + here_count).map(|r| r.to_string()).collect::<Vec<_>>().join(",");
    let gpus_per_task = p.last("gpus-per-task").and_then(|g| g.rsplit(':').next()?.parse::<usize>().ok());
    let visible: Vec<String> =
        env.get("CUDA_VISIBLE_DEVICES").map(|v| v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()).unwrap_or_default();
    let mut tasks = Vec::new();
    for local in 0..here_count {
        let mut e = base.clone();
        e.insert("SLURM_NODEID".to_string(), idx.to_string());
        e.insert("SLURM_PROCID".to_string(), (first + local).to_string());
        e.insert("SLURM_LOCALID".to_string(), local.to_string());
        e.insert("SLURM_GTIDS".to_string(), gtids.clone());
        if let Some(k) = gpus_per_task {
            let lo = local as usize * k;
            if k > 0 && lo + k <= visible.len() {
                e.insert("CUDA_VISIBLE_DEVICES".to_string(), visible[lo..lo + k].join(","));
            }
        }
        tasks.push(TaskPlan { rank: first + local, local_id: local, env: e });
    }
    tasks
}

/// The next step id of job `job` on node `node` (a counter kept in the temp directory; every
/// node of a job runs the same script, so each counts the same steps).
fn next_step_id(job: &str, node: &str) -> u32 {
    let dir = std::env::temp_dir();
    for n in 0..100_000u32 {
        let path = dir.join(format!("corral-srun-{job}-{node}-step-{n}"));
        if std::fs::OpenOptions::new().write(true).create_new(true).open(&path).is_ok() {
            return n;
        }
    }
    0
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

fn catch_signals() {
    // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Threads copying labelled output; joined before srun exits so no line is lost.
type Copiers = Vec<std::thread::JoinHandle<()>>;

fn spawn_task(argv: &[String], task: &TaskPlan, label: bool, workdir: Option<&str>, copiers: &mut Copiers) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(&task.env).process_group(0).stdin(if task.rank == 0 { Stdio::inherit() } else { Stdio::null() });
    if let Some(d) = workdir {
        cmd.current_dir(d);
    }
    if label {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = cmd.spawn()?;
    if label {
        let rank = task.rank;
        if let Some(out) = child.stdout.take() {
            copiers.push(std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = writeln!(std::io::stdout().lock(), "{rank}: {line}");
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            copiers.push(std::thread::spawn(move || {
                for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                    let _ = writeln!(std::io::stderr().lock(), "{rank}: {line}");
                }
            }));
        }
    }
    Ok(child)
}

/// Runs this node's tasks of a step and returns the worst exit code.
fn run_local_step(p: &Parsed, env: &BTreeMap<String, String>) -> Result<i32, SlurmError> {
    let job = env.get("SLURM_JOB_ID").cloned().unwrap_or_default();
    let node_name = env.get("SLURMD_NODENAME").cloned().unwrap_or_else(super::host_name);
    let plan = plan_step(p, env, next_step_id(&job, &node_name))?;
    if plan.tasks.is_empty() {
        return Ok(0);
    }
    catch_signals();
    let label = p.has("label");
    let kill_on_bad_exit = p.has("kill-on-bad-exit");
    let workdir = p.last("chdir");
    let mut children: Vec<(u32, Option<Child>)> = Vec::new();
    let mut copiers = Copiers::new();
    for t in &plan.tasks {
        match spawn_task(&p.operands, t, label, workdir, &mut copiers) {
            Ok(c) => children.push((t.rank, Some(c))),
            Err(e) => {
                eprintln!("{PROG}: error: {node_name}: task {}: Unable to start {}: {e}", t.rank, p.operands[0]);
                kill_all(&children, libc::SIGKILL);
                reap(&mut children);
                return Ok(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 });
            }
        }
    }
    let mut worst = 0;
    loop {
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            kill_all(&children, sig);
        }
        let mut running = 0;
        let mut bad_exit = false;
        for (rank, slot) in children.iter_mut() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    let code = status_code(status);
                    if code != 0 {
                        match std::os::unix::process::ExitStatusExt::signal(&status) {
                            Some(s) => eprintln!("{PROG}: error: {node_name}: task {rank}: {}", signal_words(s)),
                            None => eprintln!("{PROG}: error: {node_name}: task {rank}: Exited with exit code {code}"),
                        }
                        bad_exit = true;
                    }
                    worst = worst.max(code);
                    *slot = None;
                }
                Ok(None) => running += 1,
                Err(_) => *slot = None,
            }
        }
        if bad_exit && kill_on_bad_exit && running > 0 {
            kill_all(&children, libc::SIGKILL);
        }
        if running == 0 {
            for c in copiers {
                let _ = c.join();
            }
            return Ok(worst);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_all(children: &[(u32, Option<Child>)], sig: i32) {
    for (_, c) in children {
        if let Some(c) = c {
            // SAFETY: kill takes plain integers; the child leads its own process group, so
            // -pid reaches it and everything it started.
            unsafe {
                libc::kill(-(c.id() as i32), sig);
            }
        }
    }
}

fn reap(children: &mut [(u32, Option<Child>)]) {
    for (_, c) in children.iter_mut() {
        if let Some(c) = c {
            let _ = c.wait();
        }
    }
}

fn status_code(status: std::process::ExitStatus) -> i32 {
    match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

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

/// After `--kill-on-bad-exit`'s SIGTERM, how long tasks get before SIGKILL (Slurm's default
/// `KillWait`).
const STEP_KILL_WAIT_MS: u64 = 30_000;
/// How long `srun` asks again for a signal to one node of a step before it reports it lost.
const STEP_SIGNAL_PATIENCE_MS: u64 = 1_000;

/// How often `srun` asks again for a step whose GPUs other steps hold.
const STEP_BUSY_RETRY_MS: u64 = 200;

/// How long one read of a step's output waits on its node for news.
const STEP_READ_WAIT_MS: u32 = 2_000;

/// The step `srun` asks for in a batch job, for the agents to start: the command, the
/// caller's environment as `--export` selects it with the step's variables, and each node's
/// task ranks.
pub fn step_spec(
    p: &Parsed,
    env: &BTreeMap<String, String>,
    caller_env: &BTreeMap<String, String>,
    cwd: &str,
) -> Result<proto::StepSpec, SlurmError> {
    let plan = plan_step(p, env, 0)?;
    let mut step_env = super::sbatch::export_env(p.last("export").unwrap_or("ALL"), caller_env);
    step_env.extend(plan.base.iter().map(|(k, v)| (k.clone(), v.clone())));
    // Slurm's default distribution: block when nodes get more than one task, else cyclic.
    let total: u32 = plan.tasks_per_node.iter().sum();
    let distribution = match p.last("distribution") {
        Some(d) => d.split([':', ',']).next().unwrap_or("block").to_string(),
        None if total as usize > plan.nodes.len() => "block".into(),
        None => "cyclic".into(),
    };
    step_env.insert("SLURM_DISTRIBUTION".into(), distribution);
    let mut first = 0u32;
    let mut nodes = Vec::new();
    for (name, count) in plan.nodes.iter().zip(&plan.tasks_per_node) {
        nodes.push(proto::StepNode { name: name.clone(), ranks: (first..first + count).collect() });
        first += count;
    }
    let gpus_per_task = match p.last("gpus-per-task") {
        Some(g) => Some(
            g.rsplit(':')
                .next()
                .and_then(|n| n.parse::<u32>().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid --gpus-per-task specification: {g}")))?,
        ),
        None => None,
    };
    let gpus_per_node = step_gpus_per_node(p, env, nodes.len())?;
    let cpus_per_task = match p.last("cpus-per-task") {
        Some(c) => super::sbatch::parse_int(PROG, "--cpus-per-task", c)?,
        None => 1,
    };
    let spec = proto::StepSpec {
        argv: p.operands.clone(),
        workdir: Some(p.last("chdir").map_or_else(|| cwd.to_string(), str::to_string)),
        env: step_env,
        nodes,
        gpus_per_task,
        stdin: proto::StepStdin::Nothing,
        gpus_per_node,
        overlap: p.has("overlap"),
        unrecorded: false,
        pty: None,
        cpus_per_task,
        // Slurm: `-c` implies `--exact`, as does `--exclusive` for a step; `--whole` undoes it.
        exact: (p.has("exact") || p.has("exclusive") || p.has("cpus-per-task")) && !p.has("whole"),
        overcommit: p.has("overcommit"),
        name: p.last("job-name").map(str::to_string),
        time_limit_ms: match p.last("time") {
            Some(t) => super::time::parse_limit_s(t)
                .map_err(|_| SlurmError::fatal(PROG, "Invalid --time specification"))?
                .map(|s| s.saturating_mul(1000)),
            None => None,
        },
        memory: step_memory(p, env)?,
    };
    spec.validate().map_err(|e| SlurmError::fatal(PROG, format!("Unable to create step: {e}")))?;
    Ok(spec)
}

/// What a step inside an allocation holds of its job's memory on each node: `--mem`
/// (`--mem=0`: all of it, shared), `--mem-per-cpu` or `--mem-per-gpu`; without them, as
/// Slurm's srun, the allocation's `SLURM_MEM_PER_CPU` or `SLURM_MEM_PER_GPU` (a job that asked
/// memory per CPU packs steps by their CPUs); else all of it.
fn step_memory(p: &Parsed, env: &BTreeMap<String, String>) -> Result<proto::StepMemory, SlurmError> {
    let inherited = |key: &str| env.get(key).and_then(|v| super::sbatch::parse_mem_mib(v)).filter(|m| *m > 0);
    let size = |option: &str| -> Result<Option<u64>, SlurmError> {
        let Some(text) = p.last(option) else { return Ok(None) };
        let mib = super::sbatch::parse_mem_mib(text).ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid --{option} specification")))?;
        Ok(Some(mib))
    };
    let asked = match (size("mem")?, size("mem-per-cpu")?, size("mem-per-gpu")?) {
        (None, None, None) => (None, inherited("SLURM_MEM_PER_CPU"), inherited("SLURM_MEM_PER_GPU")),
        asked => asked,
    };
    Ok(match asked {
        (Some(0), _, _) => proto::StepMemory::Shared,
        (Some(m), _, _) => proto::StepMemory::PerNodeMib(m),
        (None, Some(m), _) if m > 0 => proto::StepMemory::PerCpuMib(m),
        (None, _, Some(m)) if m > 0 => proto::StepMemory::PerGpuMib(m),
        (None, _, _) => proto::StepMemory::Whole,
    })
}

/// The GPUs a step inside an allocation asks for on its node: `--gres=gpu[:TYPE]:N`
/// (`--gres=none`: 0), `--gpus-per-node=N`, or `--gpus=N` (the step's total, split over its
/// nodes, which must divide it); none of them: None, the step sees all of the job's GPUs. A job's GPUs on a node are
/// of one type, which a `TYPE` here is not checked against.
fn step_gpus_per_node(p: &Parsed, env: &BTreeMap<String, String>, nodes: usize) -> Result<Option<u32>, SlurmError> {
    let job = env.get("SLURM_JOB_ID").map_or("?", String::as_str);
    let invalid = || SlurmError::fatal(PROG, format!("Unable to create step for job {job}: Invalid generic resource (gres) specification"));
    let count = |text: &str| -> Result<u32, SlurmError> { text.rsplit(':').next().and_then(|n| n.parse::<u32>().ok()).ok_or_else(invalid) };
    let asked = if let Some(g) = p.last("gres") {
        match super::sbatch::parse_gres(g).map_err(|_| invalid())? {
            Some(req) => Some(req.count),
            None if g.trim().eq_ignore_ascii_case("none") => Some(0),
            None => None,
        }
    } else if let Some(g) = p.last("gpus-per-node") {
        Some(count(g)?)
    } else if let Some(g) = p.last("gpus") {
        let total = count(g)?;
        if !(total as usize).is_multiple_of(nodes.max(1)) {
            return Err(SlurmError::fatal(
                PROG,
                format!("Unable to create step for job {job}: --gpus={total} does not split evenly over the step's {nodes} nodes"),
            ));
        }
        Some(total / nodes.max(1) as u32)
    } else {
        None
    };
    Ok(asked)
}

/// What names the output files of step `spec` of the allocation `env` describes (its number
/// comes once it is launched).
fn step_naming(p: &Parsed, env: &BTreeMap<String, String>, spec: &proto::StepSpec) -> super::step_output::StepNaming {
    let number = |key: &str| env.get(key).and_then(|v| v.parse::<u64>().ok());
    let job = number("SLURM_JOB_ID").unwrap_or(0);
    let job_nodes = env.get("SLURM_JOB_NODELIST").and_then(|l| hostlist::expand(l).ok()).unwrap_or_default();
    let mut nodes = vec![(String::new(), 0); spec.nodes.iter().map(|n| n.ranks.len()).sum()];
    for (i, n) in spec.nodes.iter().enumerate() {
        let index = job_nodes.iter().position(|j| *j == n.name).unwrap_or(i);
        for r in &n.ranks {
            if let Some(slot) = nodes.get_mut(*r as usize) {
                *slot = (n.name.clone(), index);
            }
        }
    }
    super::step_output::StepNaming {
        job,
        array_job: number("SLURM_ARRAY_JOB_ID").unwrap_or(job),
        array_task: number("SLURM_ARRAY_TASK_ID").and_then(|t| u32::try_from(t).ok()),
        name: std::env::var("SLURM_JOB_NAME").unwrap_or_default(),
        user: super::current_user(),
        step: 0,
        nodes,
        workdir: std::path::PathBuf::from(spec.workdir.clone().unwrap_or_else(|| ".".into())),
        append: p.last("open-mode") == Some("append"),
    }
}

/// Prints output of a step as it comes; with `--label`, whole lines prefixed by the task's
/// rank, a line cut across reads kept until its end arrives.
struct Printer {
    /// Where stdout and stderr go (`--output`, `--error`), and the files they went to.
    sinks: (super::step_output::Sink, super::step_output::Sink),
    files: super::step_output::OutputFiles,
    label: bool,
    /// `--pty`: task 0's output alone (Slurm sends the others' to `/dev/null`).
    only_rank: Option<u32>,
    /// Labels are right-aligned to the width of the highest rank (` 0: ` with 11 or more tasks).
    width: usize,
    partial: BTreeMap<(u32, bool), Vec<u8>>,
}

impl Printer {
    fn print(&mut self, chunk: &proto::StepChunk) {
        if self.only_rank.is_some_and(|r| r != chunk.rank) {
            return;
        }
        let is_err = chunk.stream == LogStream::Stderr;
        if !self.label {
            self.emit(chunk.rank, is_err, &chunk.data);
            return;
        }
        let buf = self.partial.entry((chunk.rank, is_err)).or_default();
        buf.extend_from_slice(&chunk.data);
        let mut out = Vec::new();
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            out.extend_from_slice(format!("{:>w$}: ", chunk.rank, w = self.width).as_bytes());
            out.extend_from_slice(&line);
        }
        self.emit(chunk.rank, is_err, &out);
    }

    /// Sends output of task `rank` where its stream goes (`--output`, `--error`).
    fn emit(&mut self, rank: u32, is_err: bool, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        match if is_err { &self.sinks.1 } else { &self.sinks.0 } {
            super::step_output::Sink::Files(pattern) => self.files.write(pattern, rank, data),
            sink if sink.shows(rank) => write_to(is_err, data),
            _ => {}
        }
    }

    fn finish(&mut self) {
        for ((rank, is_err), rest) in std::mem::take(&mut self.partial) {
            if !rest.is_empty() {
                let mut out = format!("{rank:>w$}: ", w = self.width).into_bytes();
                out.extend_from_slice(&rest);
                out.push(b'\n');
                self.emit(rank, is_err, &out);
            }
        }
    }
}

fn write_to(is_err: bool, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    // A closed stdout/stderr (srun | head) stops nothing: the step still runs to its end.
    if is_err {
        let _ = std::io::stderr().write_all(data);
    } else {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(data);
        let _ = out.flush();
    }
}

/// Inside a batch job: has the agents of the job's nodes start the step, prints its output,
/// passes SIGINT/SIGTERM on to every task, and returns the worst exit status.
fn run_step(p: &Parsed, env: &BTreeMap<String, String>, pty: Option<PtySize>) -> Result<i32, SlurmError> {
    let socket =
        env.get("CORRAL_SOCKET").ok_or_else(|| SlurmError::fatal(PROG, "CORRAL_SOCKET is not set: no local corrald to start the step"))?;
    run_step_through(p, env, crate::client::Cluster::local(std::path::Path::new(socket)), pty)
}

/// `srun --jobid=ID`: a step in job ID's allocation from anywhere (outside it, or inside
/// another): the allocation's variables are read from the cluster, and any node passes the
/// step to the job's first node, which numbers and starts it.
/// `text` is the job's id (`ID` or `ID.STEP`), from `--jobid` or from `salloc`.
pub fn run_step_in_job(p: &Parsed, text: &str, pty: Option<PtySize>) -> Result<i32, SlurmError> {
    let (cluster, env) = allocation_of_job(text)?;
    run_step_through(p, &env, cluster, pty)
}

/// Starts a step of `p` in job `text`'s allocation and returns once it is launched, without
/// following it (`salloc`'s last step, which ends the job itself: `unrecorded`, see
/// `StepSpec::unrecorded`).
pub fn launch_step_in_job(p: &Parsed, text: &str, unrecorded: bool) -> Result<(), SlurmError> {
    let (cluster, env) = allocation_of_job(text)?;
    let (job, mut spec) = prepared_step(p, &env)?;
    spec.unrecorded = unrecorded;
    super::block_on(PROG, launch_step(&cluster, job, spec))?.map(|_| ())
}

/// The cluster and the allocation's variables of running job `text`, refused in Slurm's words
/// when it is not running.
fn allocation_of_job(text: &str) -> Result<(crate::client::Cluster, BTreeMap<String, String>), SlurmError> {
    let fatal = |m: String| SlurmError::fatal(PROG, m);
    let id: proto::JobId = text.split('.').next().and_then(|j| j.parse().ok()).ok_or_else(|| fatal(format!("Invalid job id: {text}")))?;
    let cluster = super::connect(PROG)?;
    let (jobs, nodes) = super::block_on(PROG, async {
        let query = proto::JobQuery { ids: vec![id], live: true, finished: true, ..Default::default() };
        // A job placed a moment ago may not run on all its nodes yet: a step there would find none.
        let deadline = tokio::time::Instant::now() + Duration::from_millis(PARTS_STARTED_WAIT_MS);
        loop {
            let jobs = super::query_jobs(PROG, &cluster, query.clone()).await?;
            let starting = jobs.iter().any(|j| j.id == id && j.state == proto::JobState::Running && !super::parts_started(j));
            if !starting || tokio::time::Instant::now() >= deadline {
                return Ok::<_, SlurmError>((jobs, super::list_nodes(PROG, &cluster).await?));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })??;
    // Slurm 22.05's words (checked on ../shared/peers/slurm).
    let refused = |why: String| SlurmError {
        text: format!("{PROG}: error: {why}\n{PROG}: Check SLURM_JOB_ID environment variable. Expired or invalid job {id}"),
        code: 1,
    };
    let job = jobs
        .iter()
        .find(|j| j.id == id)
        .ok_or_else(|| refused(format!("Unable to confirm allocation for job {id}: Invalid job id specified")))?;
    match job.state {
        proto::JobState::Running => {}
        proto::JobState::Pending => return Err(refused(format!("Unable to confirm allocation for job {id}: Job is pending execution"))),
        _ => return Err(refused(format!("Slurm job {id} has expired"))),
    }
    let names = super::job_node_names(job, &super::node_names(&nodes));
    let per_node = slurm_compat::env::tasks_per_node(&job.spec, names.len());
    let mut env = BTreeMap::new();
    env.insert("SLURM_JOB_ID".to_string(), id.to_string());
    env.insert("SLURM_JOB_NODELIST".to_string(), hostlist::compress(&names));
    env.insert("SLURM_NTASKS".to_string(), per_node.iter().sum::<u32>().to_string());
    env.insert("SLURM_NTASKS_PER_NODE".to_string(), job.spec.ntasks_per_node.to_string());
    Ok((cluster, env))
}

/// The job of the allocation `env` describes and the step `p` asks for in it.
fn prepared_step(p: &Parsed, env: &BTreeMap<String, String>) -> Result<(proto::JobId, proto::StepSpec), SlurmError> {
    let job: proto::JobId = env
        .get("SLURM_JOB_ID")
        .and_then(|j| j.parse().ok())
        .ok_or_else(|| SlurmError::fatal(PROG, "SLURM_JOB_ID is not a job id".to_string()))?;
    let mut caller_env: BTreeMap<String, String> = std::env::vars().collect();
    caller_env.insert("SLURM_UMASK".into(), format!("{:04o}", current_umask()));
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| "/".into());
    Ok((job, step_spec(p, env, &caller_env, &cwd)?))
}

/// Starts a step of the allocation `env` describes through `cluster` (the node's socket inside
/// a batch script, any node for `--jobid`), prints its tasks' output and returns its exit code.
/// With `pty` (`--pty` at a terminal of that size), task 0 runs on a pseudo-terminal that gets
/// this terminal's keys (raw mode meanwhile) and new sizes.
fn run_step_through(
    p: &Parsed,
    env: &BTreeMap<String, String>,
    cluster: crate::client::Cluster,
    pty: Option<PtySize>,
) -> Result<i32, SlurmError> {
    let (mut stdin, mut source) = super::stdin::parse(p.last("input"))?;
    if pty.is_some() {
        (stdin, source) = (proto::StepStdin::Task(0), Some(super::stdin::Source::Stdin));
    }
    let (job, mut spec) = prepared_step(p, env)?;
    spec.stdin = stdin;
    spec.pty = pty;
    spec.validate().map_err(|e| SlurmError::fatal(PROG, format!("Unable to create step: {e}")))?;
    let nodes: Vec<String> = spec.nodes.iter().map(|n| n.name.clone()).collect();
    let terminal_node = spec.nodes.iter().find(|n| n.ranks.contains(&0)).map(|n| n.name.clone()).unwrap_or_default();
    let readers: Vec<String> = spec.nodes.iter().filter(|n| n.ranks.iter().any(|r| stdin.reaches(*r))).map(|n| n.name.clone()).collect();
    let kill_on_bad_exit = p.has("kill-on-bad-exit");
    let quiet = p.has("quiet");
    let tasks: usize = spec.nodes.iter().map(|n| n.ranks.len()).sum();
    let mut printer = Printer {
        sinks: super::step_output::Sink::pair(p.last("output"), p.last("error")),
        files: super::step_output::OutputFiles::new(step_naming(p, env, &spec)),
        label: p.has("label"),
        only_rank: pty.map(|_| 0),
        width: tasks.saturating_sub(1).to_string().len(),
        partial: BTreeMap::new(),
    };
    super::block_on(PROG, async move {
        let cluster = std::sync::Arc::new(cluster);
        let step = launch_step(&cluster, job, spec).await?;
        printer.files.naming.step = step;
        // Raw from the step's start to its end (dropped with this block, before srun's last lines).
        let _raw = match pty {
            Some(_) => {
                Some(super::terminal::RawMode::enter(libc::STDIN_FILENO).map_err(|e| SlurmError::fatal(PROG, format!("tcsetattr: {e}")))?)
            }
            None => None,
        };
        if let Some(source) = source {
            super::stdin::start(std::sync::Arc::clone(&cluster), job, step, readers, source);
        }
        let (mut sigint, mut sigterm) = interrupts()?;
        let mut resizes = match pty {
            Some(_) => Some(
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                    .map_err(|e| SlurmError::fatal(PROG, format!("handle SIGWINCH: {e}")))?,
            ),
            None => None,
        };
        let mut follower = StepFollower {
            cursors: nodes.iter().map(|n| (n.clone(), NodeCursor::default())).collect(),
            cluster,
            job,
            step,
            nodes,
            quiet,
            kill_on_bad_exit,
            printer,
            killed: false,
            kill_at: None,
            failures: 0,
            lost: false,
        };
        let mut reads = StepReads::new();
        for node in &follower.nodes {
            follower.read(&mut reads, node.clone(), 0, 0);
        }
        while !reads.is_empty() {
            let kill_wait = sleep_until_or_never(follower.kill_at);
            let joined = tokio::select! {
                j = reads.join_next() => j,
                _ = sigint.recv() => { follower.signal(libc::SIGINT).await; continue; }
                _ = sigterm.recv() => { follower.signal(libc::SIGTERM).await; continue; }
                Some(()) = next_or_never(&mut resizes) => {
                    resize_terminal(&follower.cluster, job, step, &terminal_node).await;
                    continue;
                }
                () = kill_wait => {
                    // --kill-on-bad-exit: what SIGTERM left after Slurm's KillWait.
                    follower.kill_at = None;
                    follower.signal(libc::SIGKILL).await;
                    continue;
                }
            };
            let Some(Ok((node, result))) = joined else { continue };
            follower.on_read(&mut reads, node, result).await?;
        }
        Ok(follower.finish())
    })?
}

/// The reads of a step's output in flight, one per node: each gives the node and its answer.
type StepReads = tokio::task::JoinSet<(String, anyhow::Result<Result<Reply, proto::ApiError>>)>;

/// Where `srun` stands with one node of a step.
#[derive(Default)]
struct NodeCursor {
    /// Offset of the node's output read so far.
    offset: u64,
    /// Exits of the node's tasks seen, by rank.
    exits: BTreeMap<u32, proto::TaskExit>,
    /// No more to read from the node.
    done: bool,
}

/// A started step `srun` follows through the cluster: its nodes' output and exits, and the
/// kill that a bad exit under `--kill-on-bad-exit` starts.
struct StepFollower {
    cluster: std::sync::Arc<crate::client::Cluster>,
    job: proto::JobId,
    step: u32,
    nodes: Vec<String>,
    quiet: bool,
    kill_on_bad_exit: bool,
    printer: Printer,
    cursors: BTreeMap<String, NodeCursor>,
    /// SIGTERM sent after a bad exit.
    killed: bool,
    /// When SIGKILL follows that SIGTERM.
    kill_at: Option<tokio::time::Instant>,
    /// Failed reads in a row.
    failures: u32,
    /// A node's part of the step was lost (the job ended or the node is gone).
    lost: bool,
}

impl StepFollower {
    /// Starts reading `node`'s output from `offset`, with `exits_seen` of its exits known.
    fn read(&self, reads: &mut StepReads, node: String, offset: u64, exits_seen: u32) {
        let cluster = std::sync::Arc::clone(&self.cluster);
        let (job, step) = (self.job, self.step);
        reads.spawn(async move {
            let r = cluster.call(Request::StepRead { job, step, node: node.clone(), offset, exits_seen, wait_ms: STEP_READ_WAIT_MS }).await;
            (node, r)
        });
    }

    /// Sends `sig` to every task of the step.
    async fn signal(&self, sig: i32) {
        signal_step(&self.cluster, self.job, self.step, &self.nodes, sig).await;
    }

    /// Takes in one read of `node`'s output (prints it, notes exits, starts the kill after a
    /// bad one) and reads again unless the node is done; an unexpected reply, or the local
    /// corrald out of reach for too long, is an error.
    async fn on_read(
        &mut self,
        reads: &mut StepReads,
        node: String,
        result: anyhow::Result<Result<Reply, proto::ApiError>>,
    ) -> Result<(), SlurmError> {
        let fatal = |m: String| SlurmError::fatal(PROG, m);
        let (job, step) = (self.job, self.step);
        let Some(cursor) = self.cursors.get_mut(&node) else { return Ok(()) };
        match result {
            Ok(Ok(Reply::StepOutput { chunks, next_offset, exits, done })) => {
                self.failures = 0;
                for c in &chunks {
                    self.printer.print(c);
                }
                cursor.offset = next_offset;
                if note_exits(&mut cursor.exits, exits, &node, self.quiet) && self.kill_on_bad_exit && !self.killed {
                    // As Slurm: SIGTERM to every task now, SIGKILL after KillWait.
                    self.killed = true;
                    eprintln!("{PROG}: launch/slurm: _step_signal: Terminating StepId={job}.{step}");
                    signal_step(&self.cluster, job, step, &self.nodes, libc::SIGTERM).await;
                    self.kill_at = Some(tokio::time::Instant::now() + Duration::from_millis(STEP_KILL_WAIT_MS));
                }
                cursor.done = done;
            }
            Ok(Ok(other)) => return Err(fatal(format!("unexpected reply {other:?}"))),
            Ok(Err(proto::ApiError::Unavailable(_))) if self.failures < STEP_READ_FAILURES_MAX => {
                // A node of the step is out of reach for now (its daemon may be handing
                // its runs over): read it again.
                self.failures += 1;
                tokio::time::sleep(Duration::from_millis(STEP_RETRY_MS)).await;
            }
            Ok(Err(e)) => {
                // The job ended (its steps with it) or the node is gone.
                eprintln!("{PROG}: error: {node}: step {job}.{step}: {e}");
                cursor.done = true;
                self.lost = true;
            }
            Err(e) => {
                self.failures += 1;
                if self.failures > STEP_READ_FAILURES_MAX {
                    return Err(fatal(format!("lost the local corrald: {e:#}")));
                }
                tokio::time::sleep(Duration::from_millis(STEP_RETRY_MS)).await;
            }
        }
        if !cursor.done {
            let (offset, seen) = (cursor.offset, cursor.exits.len() as u32);
            self.read(reads, node, offset, seen);
        }
        Ok(())
    }

    /// Once every node is done: prints what is left of the output, and gives the worst exit
    /// status (at least 1 when a node's part was lost).
    fn finish(mut self) -> i32 {
        self.printer.finish();
        if self.killed {
            eprintln!("{PROG}: Force Terminated StepId={}.{}", self.job, self.step);
        }
        let worst = self.cursors.values().flat_map(|c| c.exits.values().map(proto::TaskExit::status)).max().unwrap_or(0);
        if self.lost {
            worst.max(1)
        } else {
            worst
        }
    }
}

/// The next signal of `stream`, or never without one.
async fn next_or_never(stream: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match stream {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Gives the step's pseudo-terminal (task 0's, on `node`) this terminal's size, after a SIGWINCH.
async fn resize_terminal(cluster: &crate::client::Cluster, job: proto::JobId, step: u32, node: &str) {
    let Some(size) = super::terminal::size(libc::STDIN_FILENO) else { return };
    let request = Request::StepResize { job, step, node: node.to_string(), size };
    match cluster.call(request).await {
        Ok(Ok(_)) | Ok(Err(proto::ApiError::NotFound(_))) => {}
        Ok(Err(e)) => eprintln!("{PROG}: error: resize the terminal of step {job}.{step}: {e}"),
        Err(e) => eprintln!("{PROG}: error: resize the terminal of step {job}.{step}: {e:#}"),
    }
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// SIGINT and SIGTERM to this process, as streams (srun passes them on to the step's tasks).
fn interrupts() -> Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal), SlurmError> {
    use tokio::signal::unix::{signal, SignalKind};
    let sigint = signal(SignalKind::interrupt()).map_err(|e| SlurmError::fatal(PROG, format!("handle SIGINT: {e}")))?;
    let sigterm = signal(SignalKind::terminate()).map_err(|e| SlurmError::fatal(PROG, format!("handle SIGTERM: {e}")))?;
    Ok((sigint, sigterm))
}

/// Asks the cluster to start step `spec` of `job`: its number. The node's daemon may be handing
/// its runs over to the next one (a rolling upgrade): it is back within seconds, so unreachable
/// and unavailable are retried for a while.
async fn launch_step(cluster: &crate::client::Cluster, job: proto::JobId, spec: proto::StepSpec) -> Result<u32, SlurmError> {
    let fatal = |m: String| SlurmError::fatal(PROG, m);
    let mut tries = 0u32;
    let mut waited = false;
    let reply = loop {
        match cluster.call(Request::StepLaunch { job, spec: spec.clone() }).await {
            Ok(Err(proto::ApiError::Unavailable(_))) | Err(_) if tries < STEP_READ_FAILURES_MAX => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(STEP_RETRY_MS)).await;
            }
            // The step's GPUs are held by other steps, or the job is suspended: wait as Slurm's
            // srun does.
            Ok(Err(proto::ApiError::Busy(why))) => {
                if !waited {
                    let why = if why == proto::STEPS_DISABLED_SUSPENDED { why.as_str() } else { "Requested nodes are busy" };
                    eprintln!("{PROG}: Job {job} step creation temporarily disabled, retrying ({why})");
                    waited = true;
                }
                tries = 0;
                tokio::time::sleep(Duration::from_millis(STEP_BUSY_RETRY_MS)).await;
            }
            Ok(r) => {
                if waited && r.is_ok() {
                    eprintln!("{PROG}: Step created for job {job}");
                }
                break r;
            }
            Err(e) => return Err(fatal(format!("Unable to create step for job {job}: {e:#}"))),
        }
    };
    match reply {
        Ok(Reply::StepLaunched { step, .. }) => Ok(step),
        Ok(other) => Err(fatal(format!("unexpected reply {other:?}"))),
        // Slurm's own words for a step that asks more than its job has.
        Err(proto::ApiError::Invalid(why)) => Err(fatal(format!("Unable to create step for job {job}: {why}"))),
        Err(e) => Err(fatal(format!("Unable to create step for job {job}: {e}"))),
    }
}

/// Sends `signal` to step `job.step`'s tasks on each of `nodes`; a node where it has ended
/// already is not an error.
async fn signal_step(cluster: &crate::client::Cluster, job: proto::JobId, step: u32, nodes: &[String], signal: i32) {
    for node in nodes {
        let request = Request::StepSignal { job, step, node: node.clone(), signal };
        // Asked again while the call is lost on a loaded cluster or the node briefly out of
        // reach: a lost SIGTERM would leave the task to -K's SIGKILL 30 s later.
        if let Err(e) = cluster.call_patiently(request, Duration::from_millis(STEP_SIGNAL_PATIENCE_MS)).await {
            if !matches!(e.downcast_ref::<proto::ApiError>(), Some(proto::ApiError::NotFound(_))) {
                eprintln!("{PROG}: error: {node}: signal step {job}.{step}: {e:#}");
            }
        }
    }
}

/// Records `exits` of `node`'s tasks in `seen` and reports each new bad one as Slurm does
/// (unless `quiet`): whether there was one.
fn note_exits(seen: &mut BTreeMap<u32, proto::TaskExit>, exits: Vec<proto::TaskExit>, node: &str, quiet: bool) -> bool {
    let mut bad = false;
    for e in exits {
        if seen.insert(e.rank, e).is_none() && e.status() != 0 {
            bad = true;
            if !quiet {
                match e.signal {
                    Some(s) => eprintln!("{PROG}: error: {node}: task {}: {}", e.rank, signal_words(s)),
                    None => eprintln!("{PROG}: error: {node}: task {}: Exited with exit code {}", e.rank, e.status()),
                }
            }
        }
    }
    bad
}

/// This process's file mode creation mask (Slurm passes it to the tasks as `SLURM_UMASK`).
fn current_umask() -> u32 {
    // SAFETY: umask(2) cannot fail; it is set back at once.
    unsafe {
        let mask = libc::umask(0o022);
        libc::umask(mask);
        mask as u32
    }
}

/// Calls in a row that fail to reach a node of the step (or the local corrald) before `srun`
/// gives up on it: 30 s at `STEP_RETRY_MS`, well beyond a daemon handing its runs over to the
/// next one (a rolling upgrade, about 2 s).
const STEP_READ_FAILURES_MAX: u32 = 150;
const STEP_RETRY_MS: u64 = 200;

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
    super::sbatch::print_warnings(&step_warnings(&p, job_id.is_some() || p.has("jobid"), local_step), p.has("quiet"));
    if let Some(text) = p.last("jobid") {
        run_step_in_job(&p, text, pty)
    } else if let Some(id) = job_id.filter(|_| in_salloc) {
        // In salloc's command, where the allocation's nodes are elsewhere.
        run_step_in_job(&p, id, pty)
    } else if job_id.is_some() {
        if batch {
            run_step(&p, &env, pty)
        } else if pty.is_some() {
            Err(SlurmError::fatal(PROG, "--pty is not supported in a `corral submit` job, whose srun starts its node's tasks itself"))
        } else {
            run_local_step(&p, &env)
        }
    } else {
        run_in_new_allocation(&p, pty)
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

/// Outside an allocation, as Slurm's srun: an allocation first (held as salloc holds one), then
/// the step from here, with this process's stdin (and terminal, with `pty`); the allocation
/// ends with the step's exit status.
fn run_in_new_allocation(p: &Parsed, pty: Option<PtySize>) -> Result<i32, SlurmError> {
    let token = super::salloc::new_token();
    let name = std::path::Path::new(&p.operands[0]).file_name().map_or_else(|| p.operands[0].clone(), |n| n.to_string_lossy().into_owned());
    // The step's own output files are srun's to write, not the holder's.
    let skip: Vec<&str> = STEP_ONLY.iter().copied().chain(["output", "error", "open-mode"]).collect();
    let sub = super::salloc::holder_allocation(PROG, p, &skip, &token, name)?;
    let quiet = p.has("quiet");
    super::sbatch::print_warnings(&sub.warnings, quiet);
    // Noted where granted() looks: SIGINT or SIGTERM while pending gives the allocation up.
    super::salloc::catch_signals();
    let cluster = super::connect(PROG)?;
    // srun says only that it waits and when it got its nodes, not salloc's "Granted ..." lines.
    let say = |line: String| {
        if !quiet && line.starts_with("job ") {
            eprintln!("{PROG}: {line}");
        }
    };
    let (job, names) = super::block_on(PROG, super::salloc::granted(PROG, &cluster, &sub, &say))??;
    let ran = run_step_in_job(p, &job.id.to_string(), pty);
    // An allocation whose step could not run ends FAILED (code 1), as the error says.
    super::salloc::release(PROG, &cluster, &job, &names, &token, *ran.as_ref().unwrap_or(&1));
    ran
}
