//! A job step as `srun` asks for one, shared by `srun`'s modes and `salloc` (whose last step
//! hands its command's exit status to the allocation): srun's options, the step's shape from
//! the allocation's variables (`plan_step`: nodes, tasks, `SLURM_STEP_*`), the `StepSpec` the
//! agents start, and launching it in a running job, retried while the node's daemon hands its
//! runs over or the step's GPUs are busy. Its messages are srun's (`PROG`).

use std::collections::BTreeMap;
use std::time::Duration;

use proto::{ClientRequest, Reply};

use super::opts::{opt, Arg, OptDef, Parsed};
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
    opt("reservation", None, Arg::Required),
    opt("spare-nodes", None, Arg::Required),
    opt("rdzv-endpoint", None, Arg::Required),
    opt("time", Some('t'), Arg::Required),
    opt("unbuffered", Some('u'), Arg::No),
    opt("usage", None, Arg::No),
    opt("verbose", Some('v'), Arg::No),
    opt("version", Some('V'), Arg::No),
    opt("wait", Some('W'), Arg::Required),
    opt("whole", None, Arg::No),
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

/// How often `srun` asks again for a step whose GPUs other steps hold.
const STEP_BUSY_RETRY_MS: u64 = 200;

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
pub(super) fn allocation_of_job(text: &str) -> Result<(crate::client::Cluster, BTreeMap<String, String>), SlurmError> {
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
pub(super) fn prepared_step(p: &Parsed, env: &BTreeMap<String, String>) -> Result<(proto::JobId, proto::StepSpec), SlurmError> {
    let job: proto::JobId = env
        .get("SLURM_JOB_ID")
        .and_then(|j| j.parse().ok())
        .ok_or_else(|| SlurmError::fatal(PROG, "SLURM_JOB_ID is not a job id".to_string()))?;
    let mut caller_env: BTreeMap<String, String> = std::env::vars().collect();
    caller_env.insert("SLURM_UMASK".into(), format!("{:04o}", current_umask()));
    let cwd = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| "/".into());
    Ok((job, step_spec(p, env, &caller_env, &cwd)?))
}

/// Asks the cluster to start step `spec` of `job`: its number. The node's daemon may be handing
/// its runs over to the next one (a rolling upgrade): it is back within seconds, so unreachable
/// and unavailable are retried for a while.
pub(super) async fn launch_step(cluster: &crate::client::Cluster, job: proto::JobId, spec: proto::StepSpec) -> Result<u32, SlurmError> {
    let fatal = |m: String| SlurmError::fatal(PROG, m);
    let mut tries = 0u32;
    let mut waited = false;
    let reply = loop {
        match cluster.call(ClientRequest::StepLaunch { job, spec: spec.clone() }).await {
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
pub(super) const STEP_READ_FAILURES_MAX: u32 = 150;
pub(super) const STEP_RETRY_MS: u64 = 200;
