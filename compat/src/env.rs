//! The environment Slurm gives a batch job, computed from a Corral [`proto::Job`]. Everything
//! here is a pure function of its arguments: no clock, no IO, no process state.

use crate::hostlist;

use std::collections::BTreeMap;

use proto::{Job, JobSpec};

/// Name of the partition a job without `--partition` runs in (and that nodes without a
/// partition belong to).
pub use proto::DEFAULT_PARTITION;

/// Keys of [`JobSpec::extra`] that `sbatch`/`srun` fill in and this module reads.
pub mod extra {
    /// `-n/--ntasks` as given (the total over all nodes), when it was given.
    pub const NTASKS: &str = "ntasks";
    /// `-N MIN-MAX` as given, when a range was asked for.
    pub const NODES_RANGE: &str = "nodes";
    /// Directory `sbatch` ran in (`SLURM_SUBMIT_DIR`); `-D` only changes the working directory.
    pub const SUBMIT_DIR: &str = "submit-dir";
    /// `-c/--cpus-per-task` was given explicitly (then `SLURM_CPUS_PER_TASK` is set).
    pub const CPUS_PER_TASK: &str = "cpus-per-task";
    /// `--gpus/-G` as given (then `SLURM_GPUS` is set).
    pub const GPUS: &str = "gpus";
    pub const GPUS_PER_NODE: &str = "gpus-per-node";
    pub const GPUS_PER_TASK: &str = "gpus-per-task";
    pub const CPUS_PER_GPU: &str = "cpus-per-gpu";
    /// `--mem-per-cpu` / `--mem-per-gpu` in MiB, as given.
    pub const MEM_PER_CPU: &str = "mem-per-cpu";
    pub const MEM_PER_GPU: &str = "mem-per-gpu";
    /// `--array` text as given (`1-100%4`), for display.
    pub const ARRAY: &str = "array";
}

/// Slurm's stand-in for "no array index" (`NO_VAL`), which `%a` expands to outside arrays.
pub const NO_ARRAY_INDEX: &str = "4294967294";

/// Tasks on each of `nodes` nodes: `ntasks_per_node` each, or `-n N` spread the way Slurm's
/// block distribution does (the first `N % nodes` nodes get one more).
pub fn tasks_per_node(spec: &JobSpec, nodes: usize) -> Vec<u32> {
    let nodes_u32 = u32::try_from(nodes.max(1)).unwrap_or(u32::MAX);
    match spec.extra.get(extra::NTASKS).and_then(|n| n.parse::<u32>().ok()) {
        Some(total) if total >= nodes_u32 => {
            let base = total / nodes_u32;
            let more = (total % nodes_u32) as usize;
            (0..nodes).map(|i| base + u32::from(i < more)).collect()
        }
        _ => vec![spec.ntasks_per_node; nodes],
    }
}

/// CPUs allocated on each node of the current run, in `node_names` order; when the
/// allocation is not known (or does not match: parts that ended are released), what the spec
/// asks for.
fn cpus_per_node(job: &Job, tasks: &[u32]) -> Vec<u32> {
    let parts: Vec<u32> = job.parts.iter().filter(|p| p.run == job.run).map(|p| p.alloc.cpus).collect();
    if parts.len() == tasks.len() && parts.iter().all(|&c| c > 0) {
        parts
    } else {
        tasks.iter().map(|t| t.saturating_mul(job.spec.cpus_per_task)).collect()
    }
}

/// Every `SLURM_*` variable (and `GPU_DEVICE_ORDINAL`) Slurm sets for the batch script of
/// `job` on its `node_index`-th node. `node_names` are the job's nodes in allocation order;
/// `gpu_indices_on_node` the GPUs this node gave it. `CUDA_VISIBLE_DEVICES` is left to the
/// launcher. Differences from Slurm 22.05, on purpose: `SLURM_RESTART_COUNT` is set (0) on the
/// first run, and `SLURM_NTASKS`, `SLURM_NPROCS`, `SLURM_NTASKS_PER_NODE` and
/// `SLURM_MEM_PER_NODE` are always set.
#[allow(dead_code)] // Called by the node crate's launcher; the CLI only tests it.
pub fn slurm_env(
    job: &Job,
    node_names: &[String],
    node_index: usize,
    cluster_name: &str,
    gpu_indices_on_node: &[u32],
) -> BTreeMap<String, String> {
    let spec = &job.spec;
    let mut env = BTreeMap::new();
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    let nnodes = node_names.len().max(1);
    let tasks = tasks_per_node(spec, nnodes);
    let here = node_index.min(nnodes - 1);
    set_job_layout(&mut set, job, node_names, &tasks, here);
    set_job_owner(&mut set, spec, cluster_name);
    set_node_and_ranks(&mut set, job, node_names, &tasks, here);
    if let Some(task) = &job.array {
        set_array_task(&mut set, spec, task);
    }
    set_gpus(&mut set, spec, gpu_indices_on_node);
    set_job_times(&mut set, job);
    env
}

/// The job's ids and name, its nodes, tasks, CPUs and memory (`SLURM_JOB_ID` ..
/// `SLURM_MEM_PER_GPU`); `tasks` per node as [`tasks_per_node`] gives them, `here` this node's
/// index among `node_names`.
fn set_job_layout(set: &mut impl FnMut(&str, String), job: &Job, node_names: &[String], tasks: &[u32], here: usize) {
    let spec = &job.spec;
    let nodelist = hostlist::compress(node_names);
    let nnodes = node_names.len().max(1);
    let ntasks: u32 = tasks.iter().sum();
    let cpus = cpus_per_node(job, tasks);
    set("SLURM_JOB_ID", job.id.to_string());
    set("SLURM_JOBID", job.id.to_string());
    set("SLURM_JOB_NAME", spec.name.clone());
    set("SLURM_JOB_NODELIST", nodelist.clone());
    set("SLURM_NODELIST", nodelist);
    set("SLURM_JOB_NUM_NODES", nnodes.to_string());
    set("SLURM_NNODES", nnodes.to_string());
    set("SLURM_NTASKS", ntasks.to_string());
    set("SLURM_NPROCS", ntasks.to_string());
    set("SLURM_NTASKS_PER_NODE", spec.ntasks_per_node.to_string());
    set("SLURM_TASKS_PER_NODE", hostlist::compress_counts(tasks));
    if spec.extra.contains_key(extra::CPUS_PER_TASK) || spec.cpus_per_task != 1 {
        set("SLURM_CPUS_PER_TASK", spec.cpus_per_task.to_string());
    }
    set("SLURM_CPUS_ON_NODE", cpus[here].to_string());
    set("SLURM_JOB_CPUS_PER_NODE", hostlist::compress_counts(&cpus));
    set("SLURM_MEM_PER_NODE", spec.mem_mib.to_string());
    for (key, var) in [(extra::MEM_PER_CPU, "SLURM_MEM_PER_CPU"), (extra::MEM_PER_GPU, "SLURM_MEM_PER_GPU")] {
        if let Some(v) = spec.extra.get(key) {
            set(var, v.clone());
        }
    }
}

/// Where the job runs and for whom: partition, account, QOS, user, uid and gid, where it was
/// submitted from, and the cluster's name.
fn set_job_owner(set: &mut impl FnMut(&str, String), spec: &JobSpec, cluster_name: &str) {
    set("SLURM_JOB_PARTITION", spec.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.to_string()));
    if let Some(a) = &spec.account {
        set("SLURM_JOB_ACCOUNT", a.clone());
    }
    if let Some(q) = &spec.qos {
        set("SLURM_JOB_QOS", q.clone());
    }
    set("SLURM_JOB_USER", spec.user.clone());
    if let Some(uid) = spec.uid {
        set("SLURM_JOB_UID", uid.to_string());
    }
    if let Some(gid) = spec.gid {
        set("SLURM_JOB_GID", gid.to_string());
    }
    set("SLURM_SUBMIT_DIR", spec.extra.get(extra::SUBMIT_DIR).cloned().unwrap_or_else(|| spec.workdir.clone()));
    set("SLURM_SUBMIT_HOST", spec.submit_host.clone());
    set("SLURM_CLUSTER_NAME", cluster_name.to_string());
}

/// This node (the `here`-th of `node_names`): its name, index, the ranks of its tasks
/// (`tasks` per node, ranks counted in node order), and the job's restart count.
fn set_node_and_ranks(set: &mut impl FnMut(&str, String), job: &Job, node_names: &[String], tasks: &[u32], here: usize) {
    let first_rank: u32 = tasks[..here].iter().sum();
    let node_name = node_names.get(here).cloned().unwrap_or_default();
    set("SLURMD_NODENAME", node_name.clone());
    set("SLURM_TOPOLOGY_ADDR", node_name);
    set("SLURM_TOPOLOGY_ADDR_PATTERN", "node".to_string());
    set("SLURM_NODEID", here.to_string());
    set("SLURM_PROCID", first_rank.to_string());
    set("SLURM_LOCALID", "0".to_string());
    set("SLURM_GTIDS", (first_rank..first_rank + tasks[here].max(1)).map(|r| r.to_string()).collect::<Vec<_>>().join(","));
    set("SLURM_RESTART_COUNT", job.restart_count.to_string());
}

/// `SLURM_ARRAY_*` of an array task: its array job, its index, and the array's count, first,
/// last and step (of the job's `--array` ids, else of this task alone).
fn set_array_task(set: &mut impl FnMut(&str, String), spec: &JobSpec, task: &proto::ArrayTask) {
    let ids = spec.array.clone().unwrap_or_else(|| proto::ArraySpec::from_ids(&[task.task], None));
    set("SLURM_ARRAY_JOB_ID", task.array_job.to_string());
    set("SLURM_ARRAY_TASK_ID", task.task.to_string());
    set("SLURM_ARRAY_TASK_COUNT", ids.len().to_string());
    set("SLURM_ARRAY_TASK_MIN", ids.first().unwrap_or(task.task).to_string());
    set("SLURM_ARRAY_TASK_MAX", ids.last().unwrap_or(task.task).to_string());
    set("SLURM_ARRAY_TASK_STEP", ids.step().to_string());
}

/// The GPUs this node gave the job (`gpu_indices_on_node`), and the GPU options as given
/// (`--gpus`, `--gpus-per-node`, `--gpus-per-task`, `--cpus-per-gpu`).
fn set_gpus(set: &mut impl FnMut(&str, String), spec: &JobSpec, gpu_indices_on_node: &[u32]) {
    if spec.shards() > 0 {
        // Shards are not GPUs: Slurm gives the shared GPU as CUDA sees it and the count.
        set("SLURM_SHARDS_ON_NODE", spec.shards().to_string());
        set("GPU_DEVICE_ORDINAL", gpu_indices_on_node.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","));
    } else if !gpu_indices_on_node.is_empty() {
        let list = gpu_indices_on_node.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(",");
        set("SLURM_GPUS_ON_NODE", gpu_indices_on_node.len().to_string());
        set("SLURM_JOB_GPUS", list.clone());
        set("GPU_DEVICE_ORDINAL", list);
    }
    if let Some(g) = spec.extra.get(extra::GPUS) {
        set("SLURM_GPUS", g.clone());
    }
    for (key, var) in [
        (extra::GPUS_PER_NODE, "SLURM_GPUS_PER_NODE"),
        (extra::GPUS_PER_TASK, "SLURM_GPUS_PER_TASK"),
        (extra::CPUS_PER_GPU, "SLURM_CPUS_PER_GPU"),
    ] {
        if let Some(v) = spec.extra.get(key) {
            set(var, v.clone());
        }
    }
}

/// When the run started and, with a time limit, when it must end (Unix seconds), once started.
fn set_job_times(set: &mut impl FnMut(&str, String), job: &Job) {
    if let Some(start_ms) = job.start_ms {
        set("SLURM_JOB_START_TIME", (start_ms / 1000).to_string());
        if let Some(limit_ms) = job.spec.time_limit_ms {
            set("SLURM_JOB_END_TIME", (start_ms.saturating_add(limit_ms) / 1000).to_string());
        }
    }
}

/// Set (to `1`) in a batch job's environment: `srun` there starts steps through the agents of
/// the job's nodes. Without it (`corral submit`, where every node runs the command) `srun`
/// starts only this node's tasks, itself.
pub const BATCH_ENV: &str = "CORRAL_BATCH";

/// Variables each node sets for itself in a step's tasks: what the caller's environment had for
/// them (the batch script's node) is not passed on.
pub const NODE_OWNED: &[&str] = &[
    "SLURMD_NODENAME",
    "SLURM_NODEID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_GTIDS",
    "SLURM_CPUS_ON_NODE",
    "SLURM_GPUS_ON_NODE",
    "SLURM_SHARDS_ON_NODE",
    "SLURM_JOB_GPUS",
    "SLURM_STEP_GPUS",
    "SLURMD_TRES_BIND",
    "SLURM_TOPOLOGY_ADDR",
    "GPU_DEVICE_ORDINAL",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "NODE_RANK",
    "PET_NODE_RANK",
    "CORRAL_NODE",
    "CORRAL_NODE_RANK",
    "CORRAL_GPU_INDICES",
    "CORRAL_SOCKET",
    "HOME",
    "USER",
    "LOGNAME",
];

/// The variables torchrun's static rendezvous takes its defaults from (`PET_MASTER_ADDR`,
/// `PET_MASTER_PORT`, `PET_NNODES`; each node's `PET_NODE_RANK` is set per node). torchrun reads
/// neither `MASTER_ADDR` nor `NODE_RANK`: without these, every node's `torchrun` of a script such
/// as `srun torchrun --nnodes=4 ...` is node rank 0 with its store on 127.0.0.1:29500.
pub fn torchrun_env(master_host: &str, master_port: u16, nnodes: usize) -> [(String, String); 3] {
    [
        ("PET_MASTER_ADDR".to_string(), master_host.to_string()),
        ("PET_MASTER_PORT".to_string(), master_port.to_string()),
        ("PET_NNODES".to_string(), nnodes.to_string()),
    ]
}

/// Which of its node's GPUs of the job a step task sees.
#[derive(Clone, Copy, Debug, Default)]
pub struct TaskGpus<'a> {
    /// `--gpus-per-task`: this many of the step's GPUs, by the task's local id.
    pub per_task: Option<u32>,
    /// The step's own GPUs (`srun --gres=gpu:N` in an allocation): positions in the job's GPU
    /// lists here; None: all of them.
    pub step: Option<&'a [usize]>,
}

/// The environment of one task of a step: this node's environment for the job (`node_env`,
/// what its batch script or holder got), the step's (`step_env`: the caller's environment as
/// `--export` chose it, and the step's variables) over it except [`NODE_OWNED`], then the
/// task's own: `SLURM_STEP_ID` (`step`), `SLURM_NODEID` (`node_index` in the step), `SLURM_PROCID`, `SLURM_LOCALID`,
/// `SLURM_GTIDS` (`ranks_here`: every rank on this node), `PET_NODE_RANK` (`node_index`: the
/// node rank torchrun's static rendezvous reads; the step's `PET_MASTER_*` and `PET_NNODES`
/// come with `step_env`), torch's `RANK`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE` and `WORLD_SIZE` (the
/// step's tasks, from `SLURM_STEP_NUM_TASKS`), and with `gpus_per_task` its share of the node's
/// `CUDA_VISIBLE_DEVICES` by local id, of the step's own GPUs when it has them ([`TaskGpus`]).
pub fn step_task_env(
    node_env: &BTreeMap<String, String>,
    step_env: &BTreeMap<String, String>,
    step: u32,
    node_index: usize,
    ranks_here: &[u32],
    local: usize,
    gpus: TaskGpus<'_>,
) -> BTreeMap<String, String> {
    let TaskGpus { per_task: gpus_per_task, step: step_gpus } = gpus;
    let mut env = node_env.clone();
    // A step with its own GPU count sees only its GPUs of the job's: the node's lists narrowed
    // to those positions (the task share below then splits them).
    let mut node_env = std::borrow::Cow::Borrowed(node_env);
    if let Some(picked) = step_gpus {
        for key in ["SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"] {
            let Some(all) = node_env.get(key).map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>()) else { continue };
            let narrowed: Vec<String> = picked.iter().filter_map(|i| all.get(*i).cloned()).collect();
            let value = narrowed.join(",");
            node_env.to_mut().insert(key.to_string(), value.clone());
            if key != "SLURM_JOB_GPUS" {
                env.insert(key.to_string(), value);
            }
        }
    }
    let node_env: &BTreeMap<String, String> = &node_env;
    env.extend(step_env.iter().filter(|(k, _)| !NODE_OWNED.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())));
    let rank = ranks_here.get(local).copied().unwrap_or_default();
    env.insert("SLURM_STEP_ID".into(), step.to_string());
    env.insert("SLURM_STEPID".into(), step.to_string());
    env.insert("SLURM_NODEID".into(), node_index.to_string());
    env.insert("PET_NODE_RANK".into(), node_index.to_string());
    env.insert("SLURM_PROCID".into(), rank.to_string());
    env.insert("SLURM_LOCALID".into(), local.to_string());
    // torch.distributed's env:// rendezvous (and DeepSpeed's, Accelerate's) reads these; with
    // the job's MASTER_ADDR and MASTER_PORT, `srun python train.py` forms one world as under
    // torchrun. torchrun sets its own workers' over these.
    env.insert("RANK".into(), rank.to_string());
    env.insert("LOCAL_RANK".into(), local.to_string());
    env.insert("LOCAL_WORLD_SIZE".into(), ranks_here.len().to_string());
    if let Some(n) = step_env.get("SLURM_STEP_NUM_TASKS") {
        env.insert("WORLD_SIZE".into(), n.clone());
    }
    env.insert("SLURM_GTIDS".into(), ranks_here.iter().map(u32::to_string).collect::<Vec<_>>().join(","));
    // The step's GPUs on this node, by index: all of the node's, or the task's share.
    let list = |key: &str| -> Vec<&str> { node_env.get(key).map_or(Vec::new(), |v| v.split(',').filter(|s| !s.is_empty()).collect()) };
    let indices = list("SLURM_JOB_GPUS");
    if !indices.is_empty() {
        env.insert("SLURM_STEP_GPUS".into(), indices.join(","));
    }
    if let Some(k) = gpus_per_task.map(|k| k as usize).filter(|k| *k > 0) {
        env.insert("SLURMD_TRES_BIND".into(), format!("gpu:per_task:{k}"));
        let lo = local * k;
        for key in ["CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"] {
            let all = list(key);
            if lo + k <= all.len() {
                env.insert(key.into(), all[lo..lo + k].join(","));
            }
        }
        if lo + k <= indices.len() {
            env.insert("SLURM_STEP_GPUS".into(), indices[lo..lo + k].join(","));
        }
    }
    env
}

/// Expands an `--output`/`--error` pattern the way slurmd does for a batch job: `%j` job id,
/// `%J` job id (the batch step), `%A` array job id (the job id outside arrays), `%a` array task
/// id, `%x` job name, `%u` user, `%N` the first node's name, `%n` node index (0), `%t` task
/// rank (0), `%s` step (`batch`), `%%` a percent sign. A number between `%` and the letter
/// zero-pads numeric fields (`%4a`). The result is relative to the working directory unless
/// absolute; unknown `%` sequences are left as they are.
pub fn output_path(pattern: &str, job: &Job, node_names: &[String], node_index: usize) -> String {
    let fields = PatternFields {
        job: job.id,
        array_job: job.array.as_ref().map_or(job.id, |a| a.array_job),
        array_task: job.array.as_ref().map(|a| a.task),
        name: &job.spec.name,
        user: &job.spec.user,
        node_name: node_names.first().map_or("", String::as_str),
        node_index,
        rank: 0,
        step: None,
    };
    expand_pattern(pattern, &fields)
}

/// What an `--output`/`--error` file name pattern names.
pub struct PatternFields<'a> {
    pub job: u64,
    /// `%A`: the array's job id (the job's own outside arrays).
    pub array_job: u64,
    /// `%a`: the array task id; none outside arrays.
    pub array_task: Option<u32>,
    pub name: &'a str,
    pub user: &'a str,
    /// `%N`, `%n`: the node of the task, and its place among the job's nodes.
    pub node_name: &'a str,
    pub node_index: usize,
    /// `%t`: the task's rank.
    pub rank: u32,
    /// `%s` (and `%J`'s `.N`): the step; none for the batch script (`batch`, and `%J` is
    /// the job id alone).
    pub step: Option<u32>,
}

/// Expands file name pattern `pattern` for `f`, as [`output_path`] says; `\\` anywhere turns
/// the expansion off, as Slurm's.
pub fn expand_pattern(pattern: &str, f: &PatternFields) -> String {
    if pattern.contains("\\\\") {
        return pattern.replace("\\\\", "");
    }
    let mut out = String::with_capacity(pattern.len() + 16);
    let chars: Vec<char> = pattern.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '%' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < chars.len() && chars[j].is_ascii_digit() {
            j += 1;
        }
        let width: usize = chars[i + 1..j].iter().collect::<String>().parse().unwrap_or(0).min(10);
        let numeric = |n: String| {
            if n.len() < width {
                format!("{n:0>width$}")
            } else {
                n
            }
        };
        let expansion = match chars.get(j) {
            Some('%') if j == i + 1 => Some("%".to_string()),
            Some('j') => Some(numeric(f.job.to_string())),
            Some('J') => Some(match f.step {
                Some(step) => format!("{}.{step}", numeric(f.job.to_string())),
                None => numeric(f.job.to_string()),
            }),
            Some('A') => Some(numeric(f.array_job.to_string())),
            Some('a') => Some(numeric(f.array_task.map_or(NO_ARRAY_INDEX.to_string(), |t| t.to_string()))),
            Some('x') => Some(f.name.to_string()),
            Some('u') => Some(f.user.to_string()),
            Some('N') => Some(f.node_name.to_string()),
            Some('n') => Some(numeric(f.node_index.to_string())),
            Some('t') => Some(numeric(f.rank.to_string())),
            Some('s') => Some(f.step.map_or_else(|| "batch".to_string(), |s| numeric(s.to_string()))),
            _ => None,
        };
        match expansion {
            Some(text) => {
                out.push_str(&text);
                i = j + 1;
            }
            None => {
                out.push('%');
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_step_task_gets_torchruns_rendezvous_with_its_own_node_rank() {
        let mut step = map(&[("PET_NODE_RANK", "0"), ("PATH", "/usr/bin")]);
        step.extend(torchrun_env("10.0.0.1", 41_234, 4));
        for node_index in 0..4 {
            let env =
                step_task_env(&BTreeMap::new(), &step, 0, node_index, &[node_index as u32], 0, TaskGpus { per_task: None, step: None });
            let got: Vec<&str> =
                ["PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK"].iter().map(|k| env[*k].as_str()).collect();
            assert_eq!(got, ["10.0.0.1", "41234", "4", node_index.to_string().as_str()]);
        }
    }

    #[test]
    fn a_step_task_gets_torchs_env_rendezvous_ranks() {
        let node = map(&[("WORLD_SIZE", "16"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "29500")]);
        let step = map(&[("SLURM_STEP_NUM_TASKS", "6"), ("RANK", "0")]);
        for (local, rank) in [3u32, 4, 5].iter().enumerate() {
            let env = step_task_env(&node, &step, 0, 1, &[3, 4, 5], local, TaskGpus { per_task: None, step: None });
            let got: Vec<&str> =
                ["RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_PORT"].iter().map(|k| env[*k].as_str()).collect();
            assert_eq!(got, [rank.to_string().as_str(), local.to_string().as_str(), "3", "6", "29500"]);
        }
    }

    #[test]
    fn a_step_task_keeps_its_node_own_variables_and_takes_the_callers_others() {
        let node = map(&[
            ("SLURMD_NODENAME", "gpu02"),
            ("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b,GPU-c,GPU-d"),
            ("GPU_DEVICE_ORDINAL", "0,1,2,3"),
            ("SLURM_JOB_GPUS", "0,1,2,3"),
            ("SLURM_JOB_ID", "7"),
            ("PATH", "/usr/bin"),
        ]);
        let step = map(&[
            ("SLURMD_NODENAME", "gpu01"),
            ("CUDA_VISIBLE_DEVICES", "GPU-x"),
            ("MASTER_ADDR", "gpu01"),
            ("PATH", "/opt/venv/bin:/usr/bin"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "0"),
        ]);
        let env = step_task_env(&node, &step, 4, 1, &[2, 3], 1, TaskGpus { per_task: Some(2), step: None });
        let pick = |k: &str| env.get(k).cloned().unwrap_or_default();
        assert_eq!(pick("SLURMD_NODENAME"), "gpu02", "the node's own name, not the caller's");
        assert_eq!(pick("MASTER_ADDR"), "gpu01", "what the script exported reaches every task");
        assert_eq!(pick("PATH"), "/opt/venv/bin:/usr/bin");
        assert_eq!(pick("SLURM_STEP_ID"), "4", "the step's number as its node knows it");
        assert_eq!(
            (pick("SLURM_NODEID"), pick("SLURM_PROCID"), pick("SLURM_LOCALID"), pick("SLURM_GTIDS")),
            ("1".into(), "3".into(), "1".into(), "2,3".into())
        );
        assert_eq!(pick("CUDA_VISIBLE_DEVICES"), "GPU-c,GPU-d", "--gpus-per-task=2, local id 1");
        assert_eq!(pick("GPU_DEVICE_ORDINAL"), "2,3");
        let whole = step_task_env(&node, &step, 4, 1, &[2, 3], 0, TaskGpus { per_task: None, step: None });
        assert_eq!(whole["CUDA_VISIBLE_DEVICES"], "GPU-a,GPU-b,GPU-c,GPU-d");
        let too_many = step_task_env(&node, &step, 4, 1, &[2, 3], 1, TaskGpus { per_task: Some(3), step: None });
        assert_eq!(too_many["CUDA_VISIBLE_DEVICES"], "GPU-a,GPU-b,GPU-c,GPU-d", "no share that does not exist");
        // A step holding the job's GPUs at positions 1 and 3 (`srun --gres=gpu:2`).
        let own = step_task_env(&node, &step, 4, 1, &[2, 3], 0, TaskGpus { per_task: None, step: Some(&[1, 3]) });
        assert_eq!(own["CUDA_VISIBLE_DEVICES"], "GPU-b,GPU-d");
        assert_eq!(own["GPU_DEVICE_ORDINAL"], "1,3");
        assert_eq!((own["SLURM_STEP_GPUS"].as_str(), own["SLURM_JOB_GPUS"].as_str()), ("1,3", "0,1,2,3"), "the job keeps its list");
        let shared = step_task_env(&node, &step, 4, 1, &[2, 3], 1, TaskGpus { per_task: Some(1), step: Some(&[1, 3]) });
        assert_eq!(shared["CUDA_VISIBLE_DEVICES"], "GPU-d", "--gpus-per-task splits the step's own GPUs");
        let none = step_task_env(&node, &step, 4, 1, &[2, 3], 0, TaskGpus { per_task: None, step: Some(&[]) });
        assert_eq!(none["CUDA_VISIBLE_DEVICES"], "", "--gres=none: no GPU");
    }
}
