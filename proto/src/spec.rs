//! What a submitter asks for: the job spec and its parts (GRES, preflight, dependencies,
//! signal), the defaults a submission is given, and [`JobSpec::validate`].

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{limits, ArraySpec, JobId};

/// What a GRES request names: whole GPUs, or shards of one GPU (Slurm's `gres/shard`: a GPU
/// shared by several jobs, each holding some of its configured shards, `GpuInfo::shards`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum GresKind {
    #[default]
    Gpu,
    Shard,
}

impl GresKind {
    pub fn as_str(self) -> &'static str {
        match self {
            GresKind::Gpu => "gpu",
            GresKind::Shard => "shard",
        }
    }
}

/// `gpu[:TYPE]:N` (N whole GPUs per node) or `shard[:TYPE]:N` (N shards of one GPU per node).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GresRequest {
    pub gpu_type: Option<String>,
    pub count: u32,
    pub kind: GresKind,
}

impl GresRequest {
    /// `count` whole GPUs of `gpu_type` (any when `None`).
    pub fn gpus(gpu_type: Option<&str>, count: u32) -> GresRequest {
        GresRequest { gpu_type: gpu_type.map(str::to_string), count, kind: GresKind::Gpu }
    }

    /// `count` shards of one GPU of `gpu_type` (any when `None`).
    pub fn shards(gpu_type: Option<&str>, count: u32) -> GresRequest {
        GresRequest { gpu_type: gpu_type.map(str::to_string), count, kind: GresKind::Shard }
    }

    /// Parses `gpu:N`, `gpu:TYPE:N`, `shard:N` or `shard:TYPE:N`.
    pub fn parse(text: &str) -> Result<GresRequest, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let bad = || format!("invalid gres '{text}': expected gpu:N, gpu:TYPE:N, shard:N or shard:TYPE:N");
        let kind = match parts.first() {
            Some(&"gpu") => GresKind::Gpu,
            Some(&"shard") => GresKind::Shard,
            _ => return Err(bad()),
        };
        match parts.as_slice() {
            [_, n] => Ok(GresRequest { gpu_type: None, count: n.parse().map_err(|_| bad())?, kind }),
            [_, t, n] if !t.is_empty() => Ok(GresRequest { gpu_type: Some((*t).to_string()), count: n.parse().map_err(|_| bad())?, kind }),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for GresRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind.as_str();
        match &self.gpu_type {
            Some(t) => write!(f, "{kind}:{t}:{}", self.count),
            None => write!(f, "{kind}:{}", self.count),
        }
    }
}

/// What the submitter asked for. Validated by [`JobSpec::validate`] before it enters the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    /// argv of the command; when `script` is set this is the interpreter line's arguments
    /// (empty means run the script with `/bin/sh`).
    pub argv: Vec<String>,
    /// Full text of a batch script, run from a file the agent writes.
    pub script: Option<String>,
    pub gres: Option<GresRequest>,
    pub cpus_per_task: u32,
    /// Memory per node. 0: not asked; the node that takes the submission gives it the
    /// cluster's default ([`JobSpec::default_mem_mib`]) before it is committed.
    pub mem_mib: u64,
    pub time_limit_ms: Option<u64>,
    pub workdir: String,
    pub env: BTreeMap<String, String>,
    /// Output file for stdout (and stderr when `error` is none). Relative to `workdir`.
    pub output: Option<String>,
    pub error: Option<String>,
    pub user: String,
    pub requeue: bool,
    /// Nodes the job spans (a gang: all start together or none). At least 1.
    pub nodes: u32,
    /// Tasks per node (for srun steps and `SLURM_NTASKS`); at least 1.
    pub ntasks_per_node: u32,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    /// Node features all of which a node must have; an element `a|b` is had by a node with
    /// either (Slurm's `--constraint`, [`feature_matches`]).
    pub constraint: Vec<String>,
    /// Nodes the job must use / must not use (by name).
    pub nodelist: Vec<String>,
    pub exclude: Vec<String>,
    /// No other job on the job's nodes.
    pub exclusive: bool,
    pub array: Option<ArraySpec>,
    pub dependencies: Vec<Dependency>,
    /// Not eligible before this time.
    pub begin_ms: Option<u64>,
    /// Submitted held: not eligible until released.
    pub hold: bool,
    /// Signal sent this long before the time limit (`--signal=[B:]SIG@SECONDS`).
    pub signal: Option<SignalSpec>,
    /// Append to output files even on the first run (`--open-mode=append`).
    pub open_append: bool,
    /// `--switches=N@wait`: at most N leaf switches, waiting at most this long for them.
    pub switches: Option<(u32, u64)>,
    pub submit_host: String,
    /// Measure the network between the job's nodes before starting it; a job that fails is
    /// held with the reason (`--preflight[=MIN_MBPS]`).
    pub preflight: Option<PreflightSpec>,
    /// uid/gid of the submitter, as the node that took the request learned them.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Options kept for display and compatibility (e.g. `gpu-bind`, `mail-type`).
    pub extra: BTreeMap<String, String>,
    /// Names this submission, not the job: the client (or, for one without, the node that
    /// first took it) picks it at random, once per submission, and every resend of the request
    /// carries it. The log answers a resend with the job the first one made, as long as that
    /// job is in the hot state, so a reply lost in a failover never makes a second job.
    pub submit_key: Option<u128>,
}

/// The key of [`JobSpec::extra`] that marks a batch job (see [`JobSpec::is_batch`]). A flag in
/// `extra` rather than a field: it leaves the encoding of specs already in logs unchanged.
pub const SPEC_EXTRA_BATCH: &str = "corral-batch";
/// The key of [`JobSpec::extra`] that marks an allocation `srun` made for its own step (Slurm's
/// interactive, non-batch job).
pub const SPEC_EXTRA_SRUN: &str = "corral-srun";
/// The key of [`JobSpec::extra`] that marks a job submitted with `--no-requeue` (as opposed to
/// one that did not ask for `--requeue`).
pub const SPEC_EXTRA_NO_REQUEUE: &str = "corral-no-requeue";
/// The key of [`JobSpec::extra`] that holds `--spare-nodes=N` (see [`JobSpec::spare_nodes`]).
pub const SPEC_EXTRA_SPARE_NODES: &str = "spare-nodes";
/// Spare nodes one job may hold at most.
pub const SPARE_NODES_MAX: u32 = 64;
/// The key of [`JobSpec::extra`] that holds `--rdzv-endpoint=HOST:PORT` (see
/// [`JobSpec::rdzv_endpoint`]).
pub const SPEC_EXTRA_RDZV_ENDPOINT: &str = "rdzv-endpoint";
/// Bytes of a `--rdzv-endpoint` at most.
pub const RDZV_ENDPOINT_BYTES_MAX: usize = 255;
/// `--rdzv-endpoint=corral`: the job's rendezvous store, served by its nodes
/// ([`JobSpec::corral_store`]).
pub const RDZV_ENDPOINT_CORRAL: &str = "corral";
/// The key of [`JobSpec::extra`] that holds the most nodes of `-N MIN-MAX` (see
/// [`JobSpec::nodes_max`]); `nodes` holds MIN. In `extra`, so specs already in logs decode.
pub const SPEC_EXTRA_NODES_MAX: &str = "nodes-max";
/// `--reservation=NAME`: the reservation the job runs in.
pub const SPEC_EXTRA_RESERVATION: &str = "reservation";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightSpec {
    /// Bytes each node streams to the first.
    pub bytes: u64,
    /// A pair slower than this fails (besides any pair under half the median).
    pub min_mbps: u64,
}

impl PreflightSpec {
    pub const BYTES_DEFAULT: u64 = 64 << 20;
    pub const BYTES_MAX: u64 = 16 << 30;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DependencyKind {
    After,
    AfterOk,
    AfterNotOk,
    AfterAny,
    Singleton,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub kind: DependencyKind,
    /// The job depended on (none for `singleton`).
    pub job: Option<JobId>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalSpec {
    pub signal: i32,
    pub before_end_s: u32,
    /// `B:`: signal only the batch shell, not every process of the job.
    pub batch_only: bool,
}

/// Whether a node with `features` meets one element of a job's `constraint`: the feature, or
/// one of the alternatives of `a|b` (Slurm's "matching OR": each node has at least one).
pub fn feature_matches(features: &[String], constraint: &str) -> bool {
    constraint.split('|').any(|alt| features.iter().any(|f| f == alt))
}

impl JobSpec {
    /// A single-node job with defaults for everything but the command.
    pub fn command(argv: Vec<String>, workdir: &str, user: &str) -> JobSpec {
        JobSpec {
            name: argv.first().cloned().unwrap_or_default(),
            argv,
            script: None,
            gres: None,
            cpus_per_task: 1,
            mem_mib: 1024,
            time_limit_ms: None,
            workdir: workdir.to_string(),
            env: BTreeMap::new(),
            output: None,
            error: None,
            user: user.to_string(),
            requeue: false,
            nodes: 1,
            ntasks_per_node: 1,
            partition: None,
            account: None,
            qos: None,
            constraint: Vec::new(),
            nodelist: Vec::new(),
            exclude: Vec::new(),
            exclusive: false,
            array: None,
            dependencies: Vec::new(),
            begin_ms: None,
            hold: false,
            signal: None,
            open_append: false,
            switches: None,
            submit_host: String::new(),
            preflight: None,
            uid: None,
            gid: None,
            extra: BTreeMap::new(),
            submit_key: None,
        }
    }

    /// `--nice` as Slurm takes it: the adjustment subtracted from the job's priority; a bare
    /// `--nice` is 100, a value that is no number 0 (Slurm reads it with `atoi`), clamped to
    /// ±2147483645. Negative only for admins (checked where a submission is taken).
    pub fn nice(&self) -> i64 {
        const NICE_MAX: i64 = 2_147_483_645;
        match self.extra.get("nice").map(|v| v.trim()) {
            None => 0,
            Some("") => 100,
            Some(v) => v.parse::<i64>().unwrap_or(0).clamp(-NICE_MAX, NICE_MAX),
        }
    }

    /// Whole GPUs per node.
    pub fn gpus(&self) -> u32 {
        self.gres.as_ref().filter(|g| g.kind == GresKind::Gpu).map_or(0, |g| g.count)
    }

    /// The GRES each node gives the job, by its TRES name (`gpu`, `shard`), and how many.
    pub fn gres_per_node(&self) -> (&'static str, u32) {
        self.gres.as_ref().map_or(("gpu", 0), |g| (g.kind.as_str(), g.count))
    }

    /// Shards of one GPU per node (`--gres=shard:N`).
    pub fn shards(&self) -> u32 {
        self.gres.as_ref().filter(|g| g.kind == GresKind::Shard).map_or(0, |g| g.count)
    }

    /// Gives a job that asked no memory (`mem_mib` 0) the default ([`JobSpec::default_mem_mib`]),
    /// as the node that takes a submission does before anything else reads it.
    pub fn fill_default_mem(&mut self) {
        if self.mem_mib == 0 {
            self.mem_mib = self.default_mem_mib();
        }
    }

    /// The memory per node of a job that asked none, as Slurm's `DefMemPerGPU` and
    /// `DefMemPerCPU` give it: [`DEF_MEM_PER_GPU_MIB`] per GPU or [`DEF_MEM_PER_CPU_MIB`] per CPU
    /// on the node, whichever is more. A flat default (1 GiB was Corral's) kills the worker
    /// processes of real training jobs at their cgroup's limit: torch alone holds ~800 MiB.
    pub fn default_mem_mib(&self) -> u64 {
        let cpus = u64::from(self.cpus_per_task).saturating_mul(u64::from(self.ntasks_per_node.max(1)));
        let by_cpu = cpus.saturating_mul(DEF_MEM_PER_CPU_MIB);
        let by_gpu = u64::from(self.gpus()).saturating_mul(DEF_MEM_PER_GPU_MIB);
        by_cpu.max(by_gpu).max(DEF_MEM_PER_CPU_MIB)
    }

    /// A Slurm batch job (`sbatch`): its script runs on the first node only, and the other
    /// nodes hold their share of the allocation for the job's steps (`srun`). Otherwise (`corral
    /// submit`) the command runs on every node of the gang.
    pub fn is_batch(&self) -> bool {
        self.extra.get(SPEC_EXTRA_BATCH).is_some_and(|v| v == "1")
    }

    pub fn set_batch(&mut self, batch: bool) {
        self.set_extra_flag(SPEC_EXTRA_BATCH, batch);
    }

    /// An allocation `srun` or `salloc` made (not a batch script of the user's).
    pub fn is_srun_allocation(&self) -> bool {
        self.extra.get(SPEC_EXTRA_SRUN).is_some_and(|v| v == "1")
    }

    /// Marks the allocation `srun` makes for its step outside any allocation.
    pub fn set_srun_allocation(&mut self, srun: bool) {
        self.set_extra_flag(SPEC_EXTRA_SRUN, srun);
    }

    /// Marks a job submitted with `--no-requeue`.
    pub fn set_no_requeue(&mut self, no_requeue: bool) {
        self.set_extra_flag(SPEC_EXTRA_NO_REQUEUE, no_requeue);
    }

    /// `--spare-nodes=N`: nodes the job holds beside its `nodes`, idle, to take the place of one
    /// it loses (its part started there with the same rank) instead of requeueing the gang.
    pub fn spare_nodes(&self) -> u32 {
        self.extra.get(SPEC_EXTRA_SPARE_NODES).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    pub fn set_spare_nodes(&mut self, spares: u32) {
        if spares == 0 {
            self.extra.remove(SPEC_EXTRA_SPARE_NODES);
        } else {
            self.extra.insert(SPEC_EXTRA_SPARE_NODES.into(), spares.to_string());
        }
    }

    /// `-N MIN-MAX`: the most nodes the job takes (`nodes` is the least). It starts once `nodes`
    /// can hold it and then gets as many more as are free then, up to this; `nodes` without a
    /// range.
    pub fn nodes_max(&self) -> u32 {
        self.extra.get(SPEC_EXTRA_NODES_MAX).and_then(|v| v.parse::<u32>().ok()).map_or(self.nodes, |m| m.max(self.nodes))
    }

    /// Sets the most nodes of a range; `max` at most `nodes` clears it.
    pub fn set_nodes_max(&mut self, max: u32) {
        if max <= self.nodes {
            self.extra.remove(SPEC_EXTRA_NODES_MAX);
        } else {
            self.extra.insert(SPEC_EXTRA_NODES_MAX.into(), max.to_string());
        }
    }

    /// `--rdzv-endpoint=HOST:PORT`: where the gang's torchrun agents meet (a c10d store, etcd)
    /// on no node of the job. Its nodes get it as `PET_RDZV_ENDPOINT`, and since the rendezvous
    /// does not die with rank 0, a command gang with a spare repairs the loss of rank 0 too.
    pub fn rdzv_endpoint(&self) -> Option<&str> {
        self.extra.get(SPEC_EXTRA_RDZV_ENDPOINT).map(String::as_str).filter(|e| *e != RDZV_ENDPOINT_CORRAL)
    }

    /// Whether the job's nodes serve its rendezvous store (`node::rdzv`, as
    /// `PET_RDZV_ENDPOINT`): asked with `--rdzv-endpoint=corral`, by command gangs only (a batch
    /// job's steps meet on its first node, which runs its script). Not a default: a daemon
    /// handed over in a rolling upgrade closes its parts' store connections, and torch's client
    /// does not connect again.
    pub fn corral_store(&self) -> bool {
        self.extra.get(SPEC_EXTRA_RDZV_ENDPOINT).is_some_and(|e| e == RDZV_ENDPOINT_CORRAL) && !self.is_batch()
    }

    /// `--reservation=NAME`: the job runs only in that reservation, on its nodes in its window.
    pub fn reservation(&self) -> Option<&str> {
        self.extra.get(SPEC_EXTRA_RESERVATION).map(String::as_str)
    }

    pub fn set_reservation(&mut self, name: Option<&str>) {
        match name {
            Some(n) => self.extra.insert(SPEC_EXTRA_RESERVATION.into(), n.to_string()),
            None => self.extra.remove(SPEC_EXTRA_RESERVATION),
        };
    }

    /// Why an operator's requeue (`scontrol requeue`) of this job is refused, in Slurm's words:
    /// an `srun` allocation is not a batch job, and `--no-requeue` disables it.
    pub fn requeue_refusal(&self) -> Option<&'static str> {
        let flag = |key: &str| self.extra.get(key).is_some_and(|v| v == "1");
        if flag(SPEC_EXTRA_SRUN) {
            Some("Only batch jobs are accepted or processed")
        } else if flag(SPEC_EXTRA_NO_REQUEUE) {
            Some("Requested operation is presently disabled")
        } else {
            None
        }
    }

    fn set_extra_flag(&mut self, key: &str, on: bool) {
        if on {
            self.extra.insert(key.to_string(), "1".to_string());
        } else {
            self.extra.remove(key);
        }
    }

    /// Checks sizes and shapes; every field that arrives over the wire passes through here.
    pub fn validate(&self) -> Result<(), String> {
        use limits::*;
        if self.name.len() > JOB_NAME_BYTES_MAX {
            return Err(format!("job name longer than {JOB_NAME_BYTES_MAX} bytes"));
        }
        if self.argv.is_empty() && self.script.is_none() {
            return Err("a job needs a command or a script".into());
        }
        if self.argv.len() > ARGV_COUNT_MAX {
            return Err(format!("more than {ARGV_COUNT_MAX} arguments"));
        }
        let argv_bytes: usize = self.argv.iter().map(|a| a.len()).sum();
        if argv_bytes > ARGV_BYTES_MAX {
            return Err(format!("arguments longer than {ARGV_BYTES_MAX} bytes"));
        }
        if self.script.as_ref().is_some_and(|s| s.len() > SCRIPT_BYTES_MAX) {
            return Err(format!("script longer than {SCRIPT_BYTES_MAX} bytes"));
        }
        let env_bytes: usize = self.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
        if env_bytes > ENV_BYTES_MAX {
            return Err(format!("environment larger than {ENV_BYTES_MAX} bytes"));
        }
        if self.env.keys().any(|k| k.is_empty() || k.contains('=') || k.contains('\0')) {
            return Err("environment names must be non-empty and hold no '=' or NUL".into());
        }
        for path in [Some(&self.workdir), self.output.as_ref(), self.error.as_ref()].into_iter().flatten() {
            if path.len() > PATH_BYTES_MAX || path.contains('\0') {
                return Err(format!("path '{path}' is too long or holds NUL"));
            }
        }
        if !self.workdir.starts_with('/') {
            return Err(format!("working directory '{}' must be absolute", self.workdir));
        }
        if let Some(g) = &self.gres {
            match g.kind {
                GresKind::Gpu if g.count == 0 || g.count > GPUS_PER_JOB_MAX => {
                    return Err(format!("gpu count must be 1..={GPUS_PER_JOB_MAX}"));
                }
                GresKind::Shard if g.count == 0 || g.count > SHARDS_PER_GPU_MAX => {
                    return Err(format!("shard count must be 1..={SHARDS_PER_GPU_MAX}"));
                }
                _ => {}
            }
        }
        if self.cpus_per_task == 0 || self.cpus_per_task > CPUS_PER_TASK_MAX {
            return Err(format!("cpus per task must be 1..={CPUS_PER_TASK_MAX}"));
        }
        if self.time_limit_ms == Some(0) {
            return Err("time limit must be positive".into());
        }
        if self.user.is_empty() || self.user.len() > 64 {
            return Err("user name must be 1..=64 bytes".into());
        }
        if self.nodes == 0 || self.nodes > NODES_PER_JOB_MAX {
            return Err(format!("node count must be 1..={NODES_PER_JOB_MAX}"));
        }
        let max = self.extra.get(SPEC_EXTRA_NODES_MAX);
        if max.is_some_and(|m| m.parse::<u32>().map_or(true, |m| m <= self.nodes || m > NODES_PER_JOB_MAX)) {
            return Err(format!("the most nodes of a range must be {}..={NODES_PER_JOB_MAX}", self.nodes.saturating_add(1)));
        }
        if self.ntasks_per_node == 0 || self.ntasks_per_node > TASKS_PER_NODE_MAX {
            return Err(format!("tasks per node must be 1..={TASKS_PER_NODE_MAX}"));
        }
        let spares = self.extra.get(SPEC_EXTRA_SPARE_NODES);
        if spares.is_some_and(|s| s.parse::<u32>().map_or(true, |n| n == 0 || n > SPARE_NODES_MAX)) {
            return Err(format!("spare nodes must be 1..={SPARE_NODES_MAX}"));
        }
        if self.spare_nodes() > 0 && (self.nodes < 2 || self.array.is_some()) {
            return Err("spare nodes are for jobs of two or more nodes, not arrays".into());
        }
        if self.is_batch() && self.extra.get(SPEC_EXTRA_RDZV_ENDPOINT).is_some_and(|e| e == RDZV_ENDPOINT_CORRAL) {
            return Err("--rdzv-endpoint=corral is for commands run on every node (corral submit -N), not batch scripts".into());
        }
        if let Some(e) = self.rdzv_endpoint() {
            let port_ok = e.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
            if !port_ok || e.len() > RDZV_ENDPOINT_BYTES_MAX || e.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!("rendezvous endpoint '{e}' is not HOST:PORT of at most {RDZV_ENDPOINT_BYTES_MAX} bytes"));
            }
        }
        if let Some(p) = &self.preflight {
            if p.bytes == 0 || p.bytes > PreflightSpec::BYTES_MAX {
                return Err(format!("preflight bytes must be 1..={}", PreflightSpec::BYTES_MAX));
            }
        }
        if let Some(a) = &self.array {
            a.validate()?;
        }
        let list_bytes: usize = self.constraint.iter().chain(&self.nodelist).chain(&self.exclude).map(|s| s.len() + 1).sum();
        if list_bytes > PATH_BYTES_MAX || self.dependencies.len() > 1024 {
            return Err("constraint, node lists or dependencies too long".into());
        }
        let extra_bytes: usize = self.extra.iter().map(|(k, v)| k.len() + v.len()).sum();
        if extra_bytes > ENV_BYTES_MAX {
            return Err("extra options too large".into());
        }
        Ok(())
    }
}

/// Memory per GPU on its node of a job that asks none (Slurm's `DefMemPerGPU`).
pub const DEF_MEM_PER_GPU_MIB: u64 = 16 * 1024;
/// Memory per CPU on its node of a job that asks none (Slurm's `DefMemPerCPU`).
pub const DEF_MEM_PER_CPU_MIB: u64 = 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::*;
    use crate::TaskRun;

    fn good() -> JobSpec {
        JobSpec::command(vec!["/bin/true".to_string()], "/home/alice", "alice")
    }

    /// Asserts that `spec` is refused with a message holding `expected`.
    fn refused(spec: &JobSpec, expected: &str) {
        match spec.validate() {
            Ok(()) => panic!("a spec that should be refused ({expected}) passed"),
            Err(e) => assert!(e.contains(expected), "refused with '{e}', expected '{expected}'"),
        }
    }

    #[test]
    fn a_command_or_a_script_passes_and_neither_is_refused() {
        assert_eq!(good().validate(), Ok(()));
        let mut script = good();
        script.argv.clear();
        script.script = Some("#!/bin/sh\necho hi\n".into());
        assert_eq!(script.validate(), Ok(()));
        let mut neither = good();
        neither.argv.clear();
        refused(&neither, "a job needs a command or a script");
    }

    #[test]
    fn names_arguments_scripts_and_environments_past_their_bounds_are_refused() {
        let mut s = good();
        s.name = "n".repeat(JOB_NAME_BYTES_MAX);
        assert_eq!(s.validate(), Ok(()), "a name of exactly the bound passes");
        s.name.push('n');
        refused(&s, &format!("job name longer than {JOB_NAME_BYTES_MAX} bytes"));

        let mut s = good();
        s.argv = vec!["a".to_string(); ARGV_COUNT_MAX + 1];
        refused(&s, &format!("more than {ARGV_COUNT_MAX} arguments"));
        s.argv = vec!["/bin/echo".to_string(), "x".repeat(ARGV_BYTES_MAX)];
        refused(&s, &format!("arguments longer than {ARGV_BYTES_MAX} bytes"));

        let mut s = good();
        s.script = Some("#".repeat(SCRIPT_BYTES_MAX + 1));
        refused(&s, &format!("script longer than {SCRIPT_BYTES_MAX} bytes"));

        let mut s = good();
        s.env.insert("BIG".into(), "v".repeat(ENV_BYTES_MAX));
        refused(&s, &format!("environment larger than {ENV_BYTES_MAX} bytes"));
        for bad in ["", "A=B", "A\0B"] {
            let mut s = good();
            s.env.insert(bad.into(), "1".into());
            refused(&s, "environment names must be non-empty and hold no '=' or NUL");
        }

        let mut s = good();
        s.extra.insert("comment".into(), "c".repeat(ENV_BYTES_MAX + 1));
        refused(&s, "extra options too large");
    }

    #[test]
    fn paths_must_be_absolute_short_and_free_of_nul() {
        let mut s = good();
        s.workdir = "relative/dir".into();
        refused(&s, "working directory 'relative/dir' must be absolute");
        s.workdir = format!("/{}", "d".repeat(PATH_BYTES_MAX));
        refused(&s, "is too long or holds NUL");
        let mut s = good();
        s.output = Some("out\0.txt".into());
        refused(&s, "is too long or holds NUL");
        let mut s = good();
        s.error = Some("err.txt".into());
        s.output = Some("out.txt".into());
        assert_eq!(s.validate(), Ok(()), "relative output files are fine");
    }

    #[test]
    fn counts_outside_their_ranges_are_refused() {
        let mut s = good();
        s.gres = Some(GresRequest { gpu_type: Some("h100".into()), count: GPUS_PER_JOB_MAX, ..Default::default() });
        assert_eq!(s.validate(), Ok(()));
        for count in [0, GPUS_PER_JOB_MAX + 1] {
            s.gres = Some(GresRequest { gpu_type: None, count, ..Default::default() });
            refused(&s, &format!("gpu count must be 1..={GPUS_PER_JOB_MAX}"));
        }
        for cpus in [0, CPUS_PER_TASK_MAX + 1] {
            let mut s = good();
            s.cpus_per_task = cpus;
            refused(&s, &format!("cpus per task must be 1..={CPUS_PER_TASK_MAX}"));
        }
        for nodes in [0, NODES_PER_JOB_MAX + 1] {
            let mut s = good();
            s.nodes = nodes;
            refused(&s, &format!("node count must be 1..={NODES_PER_JOB_MAX}"));
        }
        let mut s = good();
        s.nodes = NODES_PER_JOB_MAX;
        assert_eq!(s.validate(), Ok(()));
        // A rendezvous endpoint off the job's nodes: HOST:PORT.
        let mut s = good();
        s.extra.insert(SPEC_EXTRA_RDZV_ENDPOINT.into(), "store.example:29400".into());
        assert_eq!((s.validate(), s.rdzv_endpoint()), (Ok(()), Some("store.example:29400")));
        assert!(!s.corral_store(), "a store of its own");
        s.extra.insert(SPEC_EXTRA_RDZV_ENDPOINT.into(), RDZV_ENDPOINT_CORRAL.into());
        assert_eq!((s.validate(), s.rdzv_endpoint(), s.corral_store()), (Ok(()), None, true));
        for bad in ["store", ":29400", "store:0", "store:x", "a b:1"] {
            s.extra.insert(SPEC_EXTRA_RDZV_ENDPOINT.into(), bad.into());
            refused(&s, "is not HOST:PORT");
        }
        // A node range: its most is above its least and within the bound.
        let mut s = good();
        s.nodes = 2;
        s.set_nodes_max(4);
        assert_eq!((s.validate(), s.nodes_max()), (Ok(()), 4));
        s.set_nodes_max(2);
        assert_eq!((s.extra.get(SPEC_EXTRA_NODES_MAX), s.nodes_max()), (None, 2), "no range");
        for max in ["2", "1", "x", &(NODES_PER_JOB_MAX + 1).to_string()] {
            s.extra.insert(SPEC_EXTRA_NODES_MAX.into(), max.into());
            refused(&s, &format!("the most nodes of a range must be 3..={NODES_PER_JOB_MAX}"));
        }
        for tasks in [0, TASKS_PER_NODE_MAX + 1] {
            let mut s = good();
            s.ntasks_per_node = tasks;
            refused(&s, &format!("tasks per node must be 1..={TASKS_PER_NODE_MAX}"));
        }
        let mut s = good();
        s.time_limit_ms = Some(0);
        refused(&s, "time limit must be positive");
        s.time_limit_ms = Some(60_000);
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn users_preflights_arrays_and_lists_are_checked() {
        for user in [String::new(), "u".repeat(65)] {
            let mut s = good();
            s.user = user;
            refused(&s, "user name must be 1..=64 bytes");
        }
        let mut s = good();
        s.preflight = Some(PreflightSpec { bytes: PreflightSpec::BYTES_DEFAULT, min_mbps: 1000 });
        assert_eq!(s.validate(), Ok(()));
        for bytes in [0, PreflightSpec::BYTES_MAX + 1] {
            s.preflight = Some(PreflightSpec { bytes, min_mbps: 1000 });
            refused(&s, &format!("preflight bytes must be 1..={}", PreflightSpec::BYTES_MAX));
        }
        let mut s = good();
        s.array = Some(ArraySpec { runs: vec![TaskRun { first: 0, last: 9, step: 1 }], throttle: Some(2) });
        assert_eq!(s.validate(), Ok(()));
        s.array = Some(ArraySpec { runs: vec![TaskRun { first: 9, last: 0, step: 1 }], throttle: None });
        refused(&s, "an array's task range is malformed");
        let mut s = good();
        s.exclude = vec!["n".repeat(PATH_BYTES_MAX)];
        refused(&s, "constraint, node lists or dependencies too long");
        let mut s = good();
        s.dependencies = vec![Dependency { kind: DependencyKind::AfterOk, job: Some(1) }; 1025];
        refused(&s, "constraint, node lists or dependencies too long");
    }

    #[test]
    fn gres_requests_parse_and_print_back() {
        assert_eq!(GresRequest::parse("gpu:4"), Ok(GresRequest { gpu_type: None, count: 4, ..Default::default() }));
        let typed = GresRequest::parse("gpu:h100:8").unwrap();
        assert_eq!(typed, GresRequest { gpu_type: Some("h100".into()), count: 8, ..Default::default() });
        assert_eq!(typed.to_string(), "gpu:h100:8");
        let shards = GresRequest::parse("shard:t4:250").unwrap();
        assert_eq!(shards, GresRequest::shards(Some("t4"), 250));
        assert_eq!(shards.to_string(), "shard:t4:250");
        assert_eq!(GresRequest::parse("shard:3").map(|g| g.to_string()), Ok("shard:3".to_string()));
        for bad in ["gpu", "gpu::2", "gpu:h100:x", "tpu:2", "gpu:a:b:2", "shard", "shard::2"] {
            let e = GresRequest::parse(bad).unwrap_err();
            assert_eq!(e, format!("invalid gres '{bad}': expected gpu:N, gpu:TYPE:N, shard:N or shard:TYPE:N"));
        }
    }

    #[test]
    fn a_shard_request_asks_shards_and_no_whole_gpu() {
        let mut s = good();
        s.gres = Some(GresRequest::shards(None, 4));
        assert_eq!((s.gpus(), s.shards()), (0, 4));
        assert_eq!(s.validate(), Ok(()));
        s.gres = Some(GresRequest::shards(None, SHARDS_PER_GPU_MAX + 1));
        refused(&s, &format!("shard count must be 1..={SHARDS_PER_GPU_MAX}"));
        s.gres = Some(GresRequest::gpus(None, 2));
        assert_eq!((s.gpus(), s.shards()), (2, 0));
    }

    #[test]
    fn a_job_without_memory_gets_the_larger_of_the_per_gpu_and_per_cpu_defaults() {
        let mut s = good();
        s.mem_mib = 0;
        s.cpus_per_task = 4;
        s.ntasks_per_node = 2;
        assert_eq!(s.default_mem_mib(), 8 * DEF_MEM_PER_CPU_MIB);
        s.gres = Some(GresRequest { gpu_type: None, count: 2, ..Default::default() });
        assert_eq!(s.default_mem_mib(), 2 * DEF_MEM_PER_GPU_MIB);
        s.fill_default_mem();
        assert_eq!(s.mem_mib, 2 * DEF_MEM_PER_GPU_MIB);
        s.mem_mib = 500;
        s.fill_default_mem();
        assert_eq!(s.mem_mib, 500, "memory asked for is kept");
    }
}
