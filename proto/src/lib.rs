//! Wire and log types only: ids, job and node records, the replicated `Command`, client and peer
//! requests, and the one codec that turns them into bytes. No IO, no clock, no async: serde and a
//! size-checked, versioned postcard encoding, nothing more.

pub mod accounts;
mod array;
pub mod codec;
pub mod fuzzing;
pub mod limits;
mod partition;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use accounts::{AccountsEdit, Limits};
pub use array::{ArraySpec, TaskRun};
pub use codec::{decode, encode, CodecError};
pub use partition::{PartitionChanges, PartitionEdit, PartitionState};

/// Bumped on any incompatible change to a type in this crate. The first byte of every encoded
/// message; a peer speaking another version is refused with a clear error.
pub const PROTOCOL_VERSION: u8 = 12;

pub type NodeId = u64;
pub type JobId = u64;
/// Each start of a job is a run, numbered from 1. Reports from an older run are ignored.
pub type RunNo = u32;
/// A random id chosen by each `corrald` process at start. A job launched by one instance of a
/// node cannot be supervised by a later one.
pub type InstanceId = u64;

// ---------------------------------------------------------------------------------------------
// Nodes and GPUs

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index of the GPU on its node (as `nvidia-smi` numbers them).
    pub index: u32,
    pub uuid: String,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// GRES type used in requests, e.g. `h100`.
    pub gres_type: String,
    pub memory_mib: u64,
    /// e.g. `00000000:19:00.0`.
    pub pci_bus_id: String,
    pub numa_node: Option<u32>,
    /// e.g. `9.0`.
    pub compute_capability: Option<String>,
    pub mig_enabled: bool,
    /// MIG instances that exist now (each is schedulable as its own GRES, e.g. `1g.18gb`).
    pub mig: Vec<MigInstance>,
    /// False once the GPU reported an XID, uncorrectable ECC error or fell off the bus.
    pub healthy: bool,
    pub health_reason: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    pub uuid: String,
    /// Profile name, e.g. `1g.18gb`; also its GRES type.
    pub profile: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// First memory slice and number of slices it occupies.
    pub start_slice: u32,
    pub size_slices: u32,
    pub memory_mib: u64,
}

/// How two GPUs (or a GPU and a NIC) are connected, best first, as `nvidia-smi topo -m` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Link {
    /// The same device.
    X,
    /// NVLink with this many bonded links (`NV18`).
    NvLink(u8),
    /// At most one PCIe switch in between (`PIX`).
    Pix,
    /// Several PCIe switches, no host bridge (`PXB`).
    Pxb,
    /// Through a PCIe host bridge (`PHB`).
    Phb,
    /// Between host bridges of one NUMA node (`NODE`).
    Node,
    /// Across NUMA nodes (`SYS`).
    Sys,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    /// e.g. `mlx5_0` or `eth0`.
    pub name: String,
    pub infiniband: bool,
    pub numa_node: Option<u32>,
    /// Network interface carrying it, for NCCL_SOCKET_IFNAME (`ib0`, `eth0`).
    pub netdev: Option<String>,
}

/// Inside a node: GPU-to-GPU links, NUMA domains and NICs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// `links[i][j]`: link between GPU index i and j; empty when unknown.
    pub gpu_links: Vec<Vec<Link>>,
    /// CPU ids of each NUMA node.
    pub numa_cpus: BTreeMap<u32, Vec<u32>>,
    pub nics: Vec<Nic>,
}

/// Where a node sits in the network, for placing gangs on the fewest switch hops.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NetworkLocation {
    pub block: Option<String>,
    pub rack: Option<String>,
    /// Leaf switch.
    pub switch: Option<String>,
    /// An NVLink domain spanning nodes (e.g. an NVL72 rack).
    pub nvlink_domain: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
    pub cpus: u32,
    pub memory_mib: u64,
    pub topology: Topology,
    pub location: NetworkLocation,
    /// Node features matched by `--constraint`.
    pub features: Vec<String>,
    /// Partitions this node belongs to (empty: the default partition only).
    pub partitions: Vec<String>,
}

/// Whether two MIG layouts hold the same instances, wherever on the GPU each starts (a GPU's
/// driver may place them otherwise than the search that checked the layout).
pub fn same_mig_layout<A: AsRef<str>, B: AsRef<str>>(a: &[A], b: &[B]) -> bool {
    let mut a: Vec<&str> = a.iter().map(AsRef::as_ref).collect();
    let mut b: Vec<&str> = b.iter().map(AsRef::as_ref).collect();
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

impl Inventory {
    /// GPU `gpu`'s MIG layout as it is: its instances' profiles by start slice; `None` for a
    /// GPU this node lacks or one not in MIG mode.
    pub fn mig_layout(&self, gpu: u32) -> Option<Vec<String>> {
        let g = self.gpus.iter().find(|g| g.index == gpu && g.mig_enabled)?;
        let mut instances: Vec<&MigInstance> = g.mig.iter().collect();
        instances.sort_by_key(|m| m.start_slice);
        Some(instances.into_iter().map(|m| m.profile.clone()).collect())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeState {
    Up,
    Down,
    Drained,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "UP",
            NodeState::Down => "DOWN",
            NodeState::Drained => "DRAINED",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRole {
    Leader,
    Voter,
    Agent,
}

impl NodeRole {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeRole::Leader => "leader",
            NodeRole::Voter => "voter",
            NodeRole::Agent => "agent",
        }
    }
}

/// A node as the replicated state knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: NodeId,
    pub name: String,
    /// QUIC address other nodes and clients use, `host:port`.
    pub addr: String,
    /// Shared, so a reader can tell an unchanged inventory by pointer (the leader's cache of
    /// scheduler views): every change replaces it or goes through `Arc::make_mut`.
    pub inventory: std::sync::Arc<Inventory>,
    pub state: NodeState,
    /// Set by `Drain`, cleared by `Resume`; survives DOWN/UP.
    pub drained: bool,
    pub instance: InstanceId,
    pub state_reason: Option<String>,
    pub registered_ms: u64,
    pub state_changed_ms: u64,
    /// SHA-256 of the certificate the node joined with, as the TLS handshake showed it.
    pub cert_fingerprint: String,
    /// MIG layouts an operator set (`corral mig set`), by GPU index: profiles by start slice.
    /// A GPU whose layout differs takes no new work and is re-partitioned once idle; the
    /// demand-driven relayout leaves a pinned GPU alone.
    pub mig_pinned: BTreeMap<u32, Vec<String>>,
}

impl NodeRecord {
    /// The GPUs whose pinned layout is not the one they have: drained until re-partitioned.
    pub fn mig_pins_unapplied(&self) -> impl Iterator<Item = (u32, &[String])> + '_ {
        self.mig_pinned
            .iter()
            .filter(|(gpu, pinned)| self.inventory.mig_layout(**gpu).is_some_and(|now| !same_mig_layout(&now, pinned)))
            .map(|(gpu, pinned)| (*gpu, pinned.as_slice()))
    }
}

/// A join token in the log: only the hash of its secret is kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTokenRecord {
    pub id: u64,
    /// SHA-256 of the secret, lowercase hex.
    pub secret_sha256: String,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub created_by: String,
    pub revoked: bool,
}

/// A node as `corral nodes` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    pub name: String,
    pub addr: String,
    pub state: NodeState,
    pub role: NodeRole,
    pub gpus_total: u32,
    pub gpus_free: u32,
    pub gpu_types: Vec<String>,
    pub cpus_total: u32,
    /// CPUs the jobs running there hold.
    pub cpus_alloc: u32,
    pub memory_mib: u64,
    pub memory_alloc_mib: u64,
    pub reason: Option<String>,
    /// GPUs marked unhealthy, with why.
    pub unhealthy_gpus: Vec<(u32, String)>,
    pub cert_fingerprint: String,
    /// Partitions the node is in (its node.toml's, else the default; a partition with `Nodes=`
    /// in the policy has exactly those): see [`SchedulerPolicy::partitions_of_node`]. Empty:
    /// in none.
    pub partitions: Vec<String>,
    /// Its MIG-mode GPUs: the layout each has and the one an operator pinned, if any.
    pub mig: Vec<MigGpuInfo>,
}

/// A MIG-mode GPU as `corral mig show` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigGpuInfo {
    pub gpu: u32,
    /// Its instances' profiles by start slice, as the node last reported them.
    pub layout: Vec<String>,
    /// The layout `corral mig set` pinned it to; `None`: the demand-driven relayout decides.
    pub pinned: Option<Vec<String>>,
}

// ---------------------------------------------------------------------------------------------
// Jobs

/// `gpu[:TYPE]:N`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GresRequest {
    pub gpu_type: Option<String>,
    pub count: u32,
}

impl GresRequest {
    /// Parses `gpu:N` or `gpu:TYPE:N`.
    pub fn parse(text: &str) -> Result<GresRequest, String> {
        let parts: Vec<&str> = text.split(':').collect();
        let bad = || format!("invalid gres '{text}': expected gpu:N or gpu:TYPE:N");
        match parts.as_slice() {
            ["gpu", n] => Ok(GresRequest { gpu_type: None, count: n.parse().map_err(|_| bad())? }),
            ["gpu", t, n] if !t.is_empty() => Ok(GresRequest { gpu_type: Some((*t).to_string()), count: n.parse().map_err(|_| bad())? }),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for GresRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gpu_type {
            Some(t) => write!(f, "gpu:{t}:{}", self.count),
            None => write!(f, "gpu:{}", self.count),
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
    /// Node features all of which a node must have.
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

/// How a pending job's reason starts when no amount of waiting lets it run (it asks for more
/// than the cluster has).
pub const REASON_NEVER_PREFIX: &str = "cannot ever run: ";

/// The key of [`JobSpec::extra`] that marks a batch job (see [`JobSpec::is_batch`]). A flag in
/// `extra` rather than a field: it leaves the encoding of specs already in logs unchanged.
pub const SPEC_EXTRA_BATCH: &str = "corral-batch";
/// The key of [`JobSpec::extra`] that marks an allocation `srun` made for its own step (Slurm's
/// interactive, non-batch job).
pub const SPEC_EXTRA_SRUN: &str = "corral-srun";
/// The key of [`JobSpec::extra`] that marks a job submitted with `--no-requeue` (as opposed to
/// one that did not ask for `--requeue`).
pub const SPEC_EXTRA_NO_REQUEUE: &str = "corral-no-requeue";

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

    /// GPUs per node.
    pub fn gpus(&self) -> u32 {
        self.gres.as_ref().map_or(0, |g| g.count)
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
            if g.count == 0 || g.count > GPUS_PER_JOB_MAX {
                return Err(format!("gpu count must be 1..={GPUS_PER_JOB_MAX}"));
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
        if self.ntasks_per_node == 0 || self.ntasks_per_node > TASKS_PER_NODE_MAX {
            return Err(format!("tasks per node must be 1..={TASKS_PER_NODE_MAX}"));
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    /// A process of the job was killed for its memory limit.
    OutOfMemory,
}

impl JobState {
    /// Every state, in declaration order.
    pub const ALL: [JobState; 8] = [
        JobState::Pending,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::NodeFail,
        JobState::OutOfMemory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
        }
    }

    pub fn is_final(self) -> bool {
        !matches!(self, JobState::Pending | JobState::Running)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resources one node gives to a run of a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub node: NodeId,
    pub gpus: Vec<u32>,
    pub cpus: u32,
    pub mem_mib: u64,
}

/// One node's part of one run of a job. It holds its allocation until the node reports the
/// process gone (or the node is declared down), so no GPU is ever handed out twice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRun {
    pub run: RunNo,
    pub alloc: Allocation,
    /// Instance of the node that confirmed it started this part.
    pub launched_by: Option<InstanceId>,
}

/// GPU usage of a job, sampled by its nodes and summed over its runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    /// GPU samples taken (one per GPU per sampling).
    pub samples: u64,
    pub utilization_pct_sum: u64,
    /// Highest memory any one of its GPUs used.
    pub memory_used_peak_mib: u64,
}

impl GpuUsage {
    pub fn mean_utilization_pct(&self) -> u64 {
        self.utilization_pct_sum.checked_div(self.samples).unwrap_or(0)
    }

    pub fn merge(&mut self, other: &GpuUsage) {
        self.samples = self.samples.saturating_add(other.samples);
        self.utilization_pct_sum = self.utilization_pct_sum.saturating_add(other.utilization_pct_sum);
        self.memory_used_peak_mib = self.memory_used_peak_mib.max(other.memory_used_peak_mib);
    }
}

/// A task of a job array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The id of the array (the job that was submitted).
    pub array_job: JobId,
    pub task: u32,
}

/// A job in the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// Shared, not copied, between an array and the tasks it starts (encoded as the spec itself;
    /// `Arc::make_mut` to change one job's).
    pub spec: std::sync::Arc<JobSpec>,
    pub state: JobState,
    pub exit_code: Option<i32>,
    /// The run in progress or the last one; 0 before the first start.
    pub run: RunNo,
    /// Parts that hold resources: those of the current run, and parts of an earlier run (or of
    /// a cancelled or failed one) still stopping. Empty once everything is released.
    pub parts: Vec<NodeRun>,
    /// How each node's part of the current run ended, as reported.
    pub outcomes: Vec<(NodeId, RunOutcome)>,
    /// Nodes and GPUs of the current or last run in rank order, as planned; kept after the
    /// parts are released.
    pub last_nodes: Vec<NodeId>,
    pub last_gpus: Vec<Vec<u32>>,
    pub array: Option<ArrayTask>,
    pub submit_ms: u64,
    pub start_ms: Option<u64>,
    pub end_ms: Option<u64>,
    pub restart_count: u32,
    /// Every reason it is not running now (pending), or why it ended.
    pub reasons: Vec<String>,
    /// Accounting, filled in as runs end: GPU-seconds, a MIG instance counted by its share of
    /// the GPU's compute slices (`scheduler::mig::slot_compute_slices`).
    pub gpu_seconds: u64,
    pub gpu_usage: GpuUsage,
    /// Rendezvous port of the current run on its first node (`MASTER_PORT`), chosen when the
    /// run is placed so that no two jobs on that node share it.
    pub master_port: Option<u16>,
    /// `scontrol suspend|resume` of the current run (reset when a run starts).
    pub suspension: Suspension,
    /// The current run's steps (`srun` in its allocation), oldest first, at most
    /// [`limits::STEP_RECORDS_PER_JOB_MAX`] (reset when a run starts).
    pub steps: Vec<StepRecord>,
}

/// One step of a job's run as accounting shows it (`sacct`'s `ID.N` line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: u32,
    /// Its command's name (the program, without its directory).
    pub name: String,
    /// Nodes of its tasks, in rank order.
    pub nodes: Vec<String>,
    pub ntasks: u32,
    pub start_ms: u64,
    /// When the last of its nodes reported its tasks ended.
    pub end_ms: Option<u64>,
    /// Nodes whose tasks of it all ended.
    pub ended_on: Vec<String>,
    /// The highest exit code of its tasks so far, and a signal that killed one (Slurm's
    /// ExitCode `code:signal`).
    pub exit_code: i32,
    pub signal: Option<i32>,
}

impl StepRecord {
    /// The step's state as Slurm names it, given its job's.
    pub fn state_name(&self, job: &Job) -> &'static str {
        let job_ended_it = matches!(job.state, JobState::Cancelled | JobState::Timeout | JobState::NodeFail | JobState::OutOfMemory);
        match (self.end_ms, job.state) {
            (None, JobState::Running) if job.suspended() => "SUSPENDED",
            (None, JobState::Running) => "RUNNING",
            (None, state) if job_ended_it => state.as_str(),
            // Its nodes were lost with their reports, or the job ended before they came.
            (None, _) => "CANCELLED",
            (Some(_), state) if self.signal.is_some() && job_ended_it => state.as_str(),
            (Some(_), _) if self.signal.is_some() || self.exit_code != 0 => "FAILED",
            (Some(_), _) => "COMPLETED",
        }
    }
}

/// How the current run of a job was suspended (`scontrol suspend`) and resumed: its processes
/// stopped (SIGSTOP) on every node, its resources still held, its time limit paused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspension {
    /// When it was suspended; `None` while it runs.
    pub since_ms: Option<u64>,
    /// How long the run's earlier suspensions lasted (ended by a resume).
    pub paused_ms: u64,
    /// Suspends and resumes of this run so far. While non-zero the leader sees to it that each
    /// node of the run stopped or continued its processes as the state says.
    pub changes: u32,
}

impl Suspension {
    /// How long the run has been suspended in all by `now_ms`.
    pub fn paused_ms_at(&self, now_ms: u64) -> u64 {
        self.paused_ms.saturating_add(self.since_ms.map_or(0, |since| now_ms.saturating_sub(since)))
    }
}

impl Job {
    /// A job as a submit commits it: pending, never run. The one place a `Job` is built field
    /// by field (the state machine's submit and every test's builder start here).
    pub fn submitted(id: JobId, spec: std::sync::Arc<JobSpec>, submit_ms: u64) -> Job {
        Job {
            id,
            spec,
            state: JobState::Pending,
            exit_code: None,
            run: 0,
            parts: Vec::new(),
            outcomes: Vec::new(),
            last_nodes: Vec::new(),
            last_gpus: Vec::new(),
            array: None,
            submit_ms,
            start_ms: None,
            end_ms: None,
            restart_count: 0,
            reasons: Vec::new(),
            gpu_seconds: 0,
            gpu_usage: GpuUsage::default(),
            master_port: None,
            suspension: Suspension::default(),
            steps: Vec::new(),
        }
    }

    /// Whether the job runs but its processes are stopped (`scontrol suspend`).
    pub fn suspended(&self) -> bool {
        self.state == JobState::Running && self.suspension.since_ms.is_some()
    }

    /// The state as Slurm names it: `SUSPENDED` for a suspended running job.
    pub fn state_name(&self) -> &'static str {
        if self.suspended() {
            "SUSPENDED"
        } else {
            self.state.as_str()
        }
    }

    /// How long the current (or last) run ran by `now_ms`, its suspensions not counted (Slurm's
    /// `TimeUsed`); 0 before it started.
    pub fn run_time_ms_at(&self, now_ms: u64) -> u64 {
        let Some(start) = self.start_ms else { return 0 };
        let end = self.end_ms.unwrap_or(now_ms).max(start);
        (end - start).saturating_sub(self.suspension.paused_ms_at(end))
    }

    /// Parts of the current run that were committed but not confirmed started yet.
    pub fn launches_pending(&self) -> impl Iterator<Item = &NodeRun> {
        let run = self.run;
        let live = self.state == JobState::Running;
        self.parts.iter().filter(move |p| live && p.run == run && p.launched_by.is_none())
    }

    /// Parts that must be stopped: any part of an earlier run, and every part once the job
    /// reached a final state or was requeued.
    /// A part that failed stops the whole gang; so does the end of a batch job's script.
    pub fn parts_to_stop(&self) -> impl Iterator<Item = &NodeRun> {
        let run = self.run;
        let failed = self.outcomes.iter().any(|(_, o)| *o != RunOutcome::Exited(0));
        let live = self.state == JobState::Running && !failed && !self.batch_ended();
        self.parts.iter().filter(move |p| !live || p.run != run)
    }

    /// Whether the script of a batch job reported its end (its first node's part): the rest of
    /// the allocation only held resources for its steps.
    pub fn batch_ended(&self) -> bool {
        self.spec.is_batch() && self.last_nodes.first().is_some_and(|first| self.outcomes.iter().any(|(n, _)| n == first))
    }

    /// Every node of the current (or last) run in rank order, as planned: parts that already
    /// ended are released from `parts` but keep their rank here, so a launch re-sent after
    /// some nodes finished still names the whole gang.
    pub fn run_nodes(&self) -> &[NodeId] {
        &self.last_nodes
    }

    /// This node's rank in the current run (its index in [`Job::run_nodes`]).
    pub fn rank_of(&self, node: NodeId) -> Option<usize> {
        self.last_nodes.iter().position(|n| *n == node)
    }

    /// First pending reason, for one-line displays.
    pub fn reason(&self) -> Option<&str> {
        self.reasons.first().map(String::as_str)
    }
}

// ---------------------------------------------------------------------------------------------
// Scheduling policy, replicated so that every node explains a pending job the same way

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionDef {
    pub name: String,
    #[serde(default)]
    pub default_time_limit_ms: Option<u64>,
    #[serde(default)]
    pub max_time_limit_ms: Option<u64>,
    #[serde(default)]
    pub priority_tier: u32,
    /// Jobs without `--partition` go here; nodes that name no partition belong here.
    #[serde(default)]
    pub default: bool,
    /// UP, DOWN, DRAIN or INACTIVE (`scontrol update PartitionName=... State=`).
    #[serde(default)]
    pub state: PartitionState,
    /// `Nodes=`: exactly these nodes (by name) are in the partition, whatever their node.toml
    /// says. None: the nodes whose node.toml names it (and, for the default partition, those
    /// that name none).
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosDef {
    pub name: String,
    #[serde(default)]
    pub priority: u32,
    /// QoS names whose running jobs this QoS may preempt (a job without QoS is `normal`).
    #[serde(default)]
    pub preempt: Vec<String>,
    /// What happens to jobs of this QoS when they are preempted: `requeue` or `cancel`.
    #[serde(default = "default_preempt_mode")]
    pub preempt_mode: String,
    /// `sacctmgr modify qos ... set MaxJobsPerUser= MaxSubmitJobsPerUser= MaxWall= GrpTRES=
    /// MaxTRESPerJob=`: `max_jobs` and `max_submit_jobs` count one user's jobs of this QoS.
    #[serde(default)]
    pub limits: Limits,
}

fn default_preempt_mode() -> String {
    "requeue".into()
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerPolicy {
    #[serde(default)]
    pub partitions: Vec<PartitionDef>,
    #[serde(default)]
    pub qos: Vec<QosDef>,
    /// Slurm's `PriorityDecayHalfLife` in minutes: usage counts half after this long. `None`:
    /// Slurm's default, 7 days; `Some(0)`: usage never decays.
    #[serde(default)]
    pub priority_decay_half_life_min: Option<u64>,
}

/// Slurm's default `PriorityDecayHalfLife`, 7 days.
pub const DECAY_HALF_LIFE_MIN_DEFAULT: u64 = 7 * 24 * 60;
/// The longest half-life accepted, about 10 years.
pub const DECAY_HALF_LIFE_MIN_MAX: u64 = 10 * 366 * 24 * 60;

impl SchedulerPolicy {
    /// Usage's half-life in milliseconds; 0: no decay.
    pub fn decay_half_life_ms(&self) -> u64 {
        self.priority_decay_half_life_min.unwrap_or(DECAY_HALF_LIFE_MIN_DEFAULT).saturating_mul(60_000)
    }

    pub fn validate(&self) -> Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        for p in &self.partitions {
            if p.name.is_empty() || p.name.len() > 64 || !names.insert(p.name.clone()) {
                return Err(format!("partition names must be unique and 1-64 bytes: '{}'", p.name));
            }
            if let Some(nodes) = &p.nodes {
                if nodes.len() > limits::PARTITION_NODES_MAX || nodes.iter().any(|n| n.is_empty() || n.len() > 64) {
                    return Err(format!("partition {}: at most {} nodes, each name 1-64 bytes", p.name, limits::PARTITION_NODES_MAX));
                }
            }
            if let (Some(d), Some(m)) = (p.default_time_limit_ms, p.max_time_limit_ms) {
                if d > m {
                    return Err(format!("partition {}: default time limit above its maximum", p.name));
                }
            }
        }
        if self.partitions.iter().filter(|p| p.default).count() > 1 {
            return Err("at most one default partition".into());
        }
        let mut qos_names = std::collections::BTreeSet::new();
        for q in &self.qos {
            if q.name.is_empty() || q.name.len() > 64 || !qos_names.insert(q.name.clone()) {
                return Err(format!("qos names must be unique and 1-64 bytes: '{}'", q.name));
            }
            if q.preempt_mode != "requeue" && q.preempt_mode != "cancel" {
                return Err(format!("qos {}: preempt_mode must be requeue or cancel", q.name));
            }
        }
        if self.priority_decay_half_life_min.is_some_and(|m| m > DECAY_HALF_LIFE_MIN_MAX) {
            return Err(format!("priority_decay_half_life_min: at most {DECAY_HALF_LIFE_MIN_MAX} (about 10 years; 0: no decay)"));
        }
        if self.partitions.len() + self.qos.len() > 1024 {
            return Err("at most 1024 partitions and QoS".into());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The replicated log

/// How a run ended, as the agent saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunOutcome {
    /// The process exited with this code.
    Exited(i32),
    /// The process was killed by this signal (not by us).
    Signaled(i32),
    /// Killed after its time limit.
    TimedOut,
    /// Killed because the job was cancelled.
    Killed,
    /// The process could not be started.
    LaunchFailed(String),
    /// The process died with an earlier instance of its node before the launch was confirmed.
    Lost(String),
    /// The preflight (`--preflight`) failed; the job's command never started.
    PreflightFailed(String),
    /// The run's processes ended after the kernel killed at least one of them for the run's
    /// memory limit (its cgroup's OOM kill count): Slurm's OUT_OF_MEMORY, whatever the exit.
    OutOfMemory(String),
}

/// One placement of a plan: job `job`, run `run`, on one allocation per node (a gang).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub job: JobId,
    pub run: RunNo,
    pub allocs: Vec<Allocation>,
}

/// Every change to the cluster state is one of these, committed through Raft. Time travels
/// inside the command (`now_ms`, stamped by the leader) so applying it is deterministic.
// A message decoded once per request or log entry and moved rarely: boxing the large variants
// would buy nothing but indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    RegisterNode {
        name: String,
        addr: String,
        inventory: Inventory,
        instance: InstanceId,
        cert_fingerprint: String,
        now_ms: u64,
    },
    /// A join token that enrols nodes until `expires_ms` unless revoked.
    AddJoinToken {
        secret_sha256: String,
        expires_ms: u64,
        created_by: String,
        now_ms: u64,
    },
    RevokeJoinToken {
        id: u64,
        now_ms: u64,
    },
    /// A certificate no node accepts any more; with `node`, every certificate of that node
    /// name (its renewals too).
    RevokeCert {
        fingerprint: String,
        node: Option<String>,
        reason: String,
        now_ms: u64,
    },
    /// A node heartbeats again, or with a new instance.
    NodeUp {
        node: NodeId,
        instance: InstanceId,
        now_ms: u64,
    },
    NodeDown {
        node: NodeId,
        reason: String,
        now_ms: u64,
    },
    Drain {
        node: NodeId,
        reason: String,
        now_ms: u64,
    },
    Resume {
        node: NodeId,
        now_ms: u64,
    },
    Submit {
        spec: JobSpec,
        now_ms: u64,
    },
    /// Placements chosen by the scheduler; apply re-checks each and rejects the stale ones.
    /// `array_tasks`: (index into `placements`, task id) for placements that start a task of
    /// an array (the placement names the array job).
    Plan {
        placements: Vec<Placement>,
        array_tasks: Vec<(u32, u32)>,
        now_ms: u64,
    },
    LaunchConfirmed {
        job: JobId,
        run: RunNo,
        node: NodeId,
        instance: InstanceId,
        now_ms: u64,
    },
    RunFinished {
        job: JobId,
        run: RunNo,
        node: NodeId,
        outcome: RunOutcome,
        /// GPU usage the node sampled for this part.
        usage: GpuUsage,
        now_ms: u64,
    },
    Cancel {
        job: JobId,
        now_ms: u64,
    },
    /// Stop a running job and put it back in the queue (keeps its id, counts a restart).
    Requeue {
        job: JobId,
        reason: String,
        now_ms: u64,
    },
    /// Replace the scheduling policy (partitions, QoS).
    SetPolicy {
        policy: SchedulerPolicy,
        now_ms: u64,
    },
    /// Create, change or delete one partition of the policy (`scontrol create|update|delete
    /// PartitionName=`), checked against the state it is applied to.
    EditPartition {
        edit: PartitionEdit,
        now_ms: u64,
    },
    /// Change a pending job: hold or release it, its time limit, its partition.
    UpdateJob {
        job: JobId,
        hold: Option<bool>,
        time_limit_ms: Option<Option<u64>>,
        partition: Option<Option<String>>,
        now_ms: u64,
    },
    /// `sacctmgr add|modify|delete`: changes to the accounts, users, associations and QoS,
    /// applied all or none ([`accounts::Accounts::edit`]).
    EditAccounts {
        edits: Vec<AccountsEdit>,
        now_ms: u64,
    },
    /// `scontrol suspend` (`suspend: true`) or `resume` of a running job.
    Suspend {
        job: JobId,
        suspend: bool,
        now_ms: u64,
    },
    /// A step of a running job's run `run` was created (before its tasks start, as slurmctld
    /// records a step): its record for accounting.
    StepStarted {
        job: JobId,
        run: RunNo,
        step: u32,
        name: String,
        nodes: Vec<String>,
        ntasks: u32,
        now_ms: u64,
    },
    /// Every task of step `step` on node `node` ended, the highest exit code and a killing
    /// signal among them.
    StepEnded {
        job: JobId,
        run: RunNo,
        step: u32,
        node: String,
        exit_code: i32,
        signal: Option<i32>,
        now_ms: u64,
    },
    /// A GPU (or one MIG instance of it) turned unhealthy, or an operator marked it healthy.
    GpuHealth {
        node: NodeId,
        gpu: u32,
        mig_uuid: Option<String>,
        healthy: bool,
        reason: String,
        now_ms: u64,
    },
    /// The node's inventory changed (e.g. a MIG layout was applied to an idle GPU).
    UpdateInventory {
        node: NodeId,
        inventory: Inventory,
        reason: String,
        now_ms: u64,
    },
    /// An operator pins GPU `gpu` of `node` to a MIG layout (profiles by start slice), or with
    /// `None` gives it back to the demand-driven relayout. Checked in apply against the GPU's
    /// model: an impossible layout is rejected with the hardware's limit.
    PinMigLayout {
        node: NodeId,
        gpu: u32,
        profiles: Option<Vec<String>>,
        now_ms: u64,
    },
    /// Move these finished jobs (final, holding nothing) out of the hot state into the
    /// accounting store. The leader names them (older than its `min_job_age_s`); apply skips
    /// any that is not final or still holds a part, so a stale list is harmless.
    ArchiveJobs {
        jobs: Vec<JobId>,
        now_ms: u64,
    },
    /// Delete these records from the accounting store (past `accounting_retention_days`).
    /// Named by the leader, so replaying the command deletes exactly the same records.
    PruneAccounting {
        jobs: Vec<JobId>,
        now_ms: u64,
    },
    /// Several commands in one log entry, applied in order, each as if alone; its result is
    /// `CommandResult::Batch` with one result per command. The leader batches what is queued
    /// when an entry is proposed (group commit: under load one entry, one fsync, one apply
    /// call carry many submissions, launch confirmations and run ends). Only
    /// [`Command::batchable`] commands, at most [`BATCH_COMMANDS_MAX`]; otherwise the whole
    /// batch is rejected and nothing applied.
    Batch {
        commands: Vec<Command>,
    },
    /// Instance `instance` of `node` stopped gracefully (SIGTERM): it stopped and reported
    /// every run it had and refuses launches from now on, so the node is down at once (the
    /// runs the cluster still places there, whose launch had not arrived, are lost and
    /// `--requeue` ones queued again) and the instance is retired (a late heartbeat of it
    /// brings nothing back). Rejected for any other instance.
    NodeStopped {
        node: NodeId,
        instance: InstanceId,
        now_ms: u64,
    },
}

/// Jobs named by one `ArchiveJobs` or `PruneAccounting` command at most.
pub const ARCHIVE_BATCH_MAX: usize = 4096;
/// Commands in one `Command::Batch` at most.
pub const BATCH_COMMANDS_MAX: usize = 512;
/// What the leader puts in one batch at most, by [`Command::weight_bytes`] (a bound on the
/// entry, whatever the specs carry).
pub const BATCH_BYTES_MAX: usize = 4 << 20;

impl Command {
    /// Commands that may go in a `Batch`: those whose effects are the hot state's alone (not
    /// the accounting store's, not the membership's): the per-job ones, and a node found down
    /// or back (a crowd of them is one entry, not one each).
    pub fn batchable(&self) -> bool {
        matches!(
            self,
            Command::Submit { .. }
                | Command::NodeDown { .. }
                | Command::NodeUp { .. }
                | Command::LaunchConfirmed { .. }
                | Command::RunFinished { .. }
                | Command::Cancel { .. }
                | Command::Requeue { .. }
                | Command::UpdateJob { .. }
                | Command::Suspend { .. }
                | Command::StepStarted { .. }
                | Command::StepEnded { .. }
        )
    }

    /// Whether the command only submits jobs (a `Submit`, or a `Batch` of them): it frees
    /// nothing and changes no job or node already there.
    pub fn submits_only(&self) -> bool {
        match self {
            Command::Submit { .. } => true,
            Command::Batch { commands } => commands.iter().all(|c| matches!(c, Command::Submit { .. })),
            _ => false,
        }
    }

    /// A bound on the command's encoded size, cheap to compute: what a submission carries
    /// (script, environment, arguments) plus a fixed allowance for the rest.
    pub fn weight_bytes(&self) -> usize {
        const FIXED_BYTES: usize = 4096;
        match self {
            Command::Submit { spec, .. } => {
                let env: usize = spec.env.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
                let argv: usize = spec.argv.iter().map(|a| a.len() + 4).sum();
                FIXED_BYTES + spec.script.as_ref().map_or(0, |s| s.len()) + env + argv
            }
            _ => FIXED_BYTES,
        }
    }
}

/// What applying a command answered, returned to the proposer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    Ok,
    NodeRegistered {
        id: NodeId,
    },
    Submitted {
        job: JobId,
    },
    /// Jobs of the plan that were placed, and those rejected with the reason.
    Planned {
        accepted: Vec<JobId>,
        rejected: Vec<(JobId, String)>,
    },
    /// The command was valid on the wire but not in the current state (e.g. cancel of an
    /// unknown job). Nothing changed.
    Rejected(String),
    /// One result per command of a `Command::Batch`, in order.
    Batch(Vec<CommandResult>),
}

// ---------------------------------------------------------------------------------------------
// Requests between clients and nodes, and between nodes

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// A job step (`srun` inside a batch job): a command started as tasks on some of the job's
/// nodes by their agents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSpec {
    pub argv: Vec<String>,
    /// Working directory of the tasks; the job's when none.
    pub workdir: Option<String>,
    /// The caller's environment as `--export` selected it, with the step's own variables
    /// (`SLURM_STEP_*`, `SLURM_NTASKS`, ...). Each node puts its own variables over these
    /// (`SLURMD_NODENAME`, `CUDA_VISIBLE_DEVICES`, ...) and each task its rank.
    pub env: BTreeMap<String, String>,
    /// The step's nodes in order, with the global ranks of each one's tasks.
    pub nodes: Vec<StepNode>,
    /// `--gpus-per-task`: each task sees that many of its node's GPUs, by local id.
    pub gpus_per_task: Option<u32>,
    /// Which tasks read `srun`'s stdin (`--input`), fed by [`Request::StepInput`]; the others
    /// read `/dev/null`.
    pub stdin: StepStdin,
    /// `--gres=gpu:N`, `--gpus-per-node=N` or `--gpus=N` inside an allocation: a step on one
    /// node holds N of the job's GPUs there, which no other such step gets until its tasks
    /// ended; one that finds too few free waits ([`ApiError::Busy`]), as Slurm's does. A step
    /// on several nodes sees the first N of the job's GPUs on each, shared (as with
    /// `overlap`). None: all of them, held by none (Slurm's default for a step).
    pub gpus_per_node: Option<u32>,
    /// `--overlap`: the step's GPUs are the first N of the job's, shared, neither held nor waited for.
    pub overlap: bool,
    /// `salloc`'s own step that hands its command's exit status to the allocation: no step of
    /// the user's, so not recorded for accounting (Slurm has no such step).
    pub unrecorded: bool,
    /// `srun --pty`: task 0 runs on a pseudo-terminal of this size (its stdin, stdout and
    /// stderr, and its session's controlling terminal); it reads `srun`'s stdin
    /// (`StepStdin::Task(0)`) and `srun` shows only its output, as Slurm does.
    pub pty: Option<PtySize>,
    /// `-c/--cpus-per-task`: CPUs of each task (1 when not given).
    pub cpus_per_task: u32,
    /// `--exact`, `--exclusive` or an explicit `-c`: the step holds its tasks' CPUs on each
    /// node, not all of the job's there (Slurm's default for a step).
    pub exact: bool,
    /// `-O/--overcommit`: more tasks than the job has CPUs on a node may share them.
    pub overcommit: bool,
    /// `-J/--job-name` inside an allocation: the step's name in accounting (its program's
    /// name when none).
    pub name: Option<String>,
    /// `-t/--time` inside an allocation: past it each node of the step says so on the step's
    /// stderr, sends its tasks SIGTERM and, after the node's `kill_grace_ms`, SIGKILL.
    pub time_limit_ms: Option<u64>,
    /// `--mem`, `--mem-per-cpu`, `--mem-per-gpu`: how much of the job's memory on each node
    /// the step holds and may use.
    pub memory: StepMemory,
}

/// How much of its job's memory on a node a step holds (and is limited to), as Slurm's
/// `srun --mem*` inside an allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepMemory {
    /// No `--mem`: all of the job's memory there, held (a second such step waits).
    #[default]
    Whole,
    /// `--mem=0`: all of the job's memory there, held by none.
    Shared,
    PerNodeMib(u64),
    PerCpuMib(u64),
    PerGpuMib(u64),
}

/// A terminal's size in characters, as `TIOCGWINSZ` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// Which tasks of a step read `srun`'s stdin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepStdin {
    /// `--input=none`: every task reads `/dev/null`.
    #[default]
    Nothing,
    /// Slurm's default (`--input=all`): every task reads all of it.
    All,
    /// `--input=N`: task N alone.
    Task(u32),
}

impl StepStdin {
    /// Whether task `rank` reads the step's stdin.
    pub fn reaches(self, rank: u32) -> bool {
        match self {
            StepStdin::Nothing => false,
            StepStdin::All => true,
            StepStdin::Task(r) => r == rank,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepNode {
    pub name: String,
    /// Global ranks of the tasks on this node; the local id is the position here.
    pub ranks: Vec<u32>,
}

impl StepSpec {
    /// Checks sizes and shapes: the spec arrives from a user's `srun`.
    pub fn validate(&self) -> Result<(), String> {
        use limits::*;
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err("a step needs a command".into());
        }
        if self.argv.len() > ARGV_COUNT_MAX || self.argv.iter().map(String::len).sum::<usize>() > ARGV_BYTES_MAX {
            return Err(format!("step arguments past {ARGV_COUNT_MAX} or {ARGV_BYTES_MAX} bytes"));
        }
        if self.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>() > ENV_BYTES_MAX {
            return Err(format!("step environment larger than {ENV_BYTES_MAX} bytes"));
        }
        if self.workdir.as_ref().is_some_and(|w| w.len() > PATH_BYTES_MAX || w.contains('\0')) {
            return Err("bad working directory".into());
        }
        if self.nodes.is_empty() || self.nodes.len() > NODES_PER_JOB_MAX as usize {
            return Err(format!("a step runs on 1..={NODES_PER_JOB_MAX} nodes"));
        }
        let tasks: usize = self.nodes.iter().map(|n| n.ranks.len()).sum();
        if tasks == 0 || tasks > STEP_TASKS_MAX || self.nodes.iter().any(|n| n.ranks.len() > TASKS_PER_NODE_MAX as usize) {
            return Err(format!("a step has 1..={STEP_TASKS_MAX} tasks, at most {TASKS_PER_NODE_MAX} per node"));
        }
        let mut ranks: Vec<u32> = self.nodes.iter().flat_map(|n| n.ranks.iter().copied()).collect();
        ranks.sort_unstable();
        if ranks.iter().enumerate().any(|(i, r)| *r as usize != i) {
            return Err("task ranks must be 0..N, each once".into());
        }
        let mut names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err("a node is listed twice".into());
        }
        if self.gpus_per_task.is_some_and(|g| g == 0 || g > GPUS_PER_JOB_MAX) {
            return Err(format!("gpus per task must be 1..={GPUS_PER_JOB_MAX}"));
        }
        if self.gpus_per_node.is_some_and(|g| g > GPUS_PER_JOB_MAX) {
            return Err(format!("gpus per node must be 0..={GPUS_PER_JOB_MAX}"));
        }
        if self.name.as_ref().is_some_and(|n| n.len() > PATH_BYTES_MAX) {
            return Err(format!("a step's name has at most {PATH_BYTES_MAX} bytes"));
        }
        if self.cpus_per_task == 0 || self.cpus_per_task > CPUS_PER_TASK_MAX {
            return Err(format!("cpus per task must be 1..={CPUS_PER_TASK_MAX}"));
        }
        if matches!(self.stdin, StepStdin::Task(r) if r as usize >= tasks) {
            return Err(format!("stdin goes to a task of 0..{tasks}"));
        }
        if self.pty.is_some() && !matches!(self.stdin, StepStdin::Task(0) | StepStdin::Nothing) {
            return Err("a step with a pseudo-terminal reads stdin in task 0 alone".into());
        }
        Ok(())
    }
}

/// Output of one task of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepChunk {
    pub rank: u32,
    pub stream: LogStream,
    pub data: Vec<u8>,
}

/// What one live task of a step (or a batch script) uses on its node, summed over the processes
/// of its session, as `sstat` shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskUsage {
    /// None: the batch script (`ID.batch`).
    pub step: Option<u32>,
    pub rank: u32,
    /// User and system CPU time.
    pub cpu_ms: u64,
    pub rss_kib: u64,
    pub vmsize_kib: u64,
    /// Major page faults.
    pub pages: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// The most task usages one node answers for one job.
pub const TASK_USAGES_MAX: usize = 4_096;

/// How one task of a step ended: its exit code, or the signal that killed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskExit {
    pub rank: u32,
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl TaskExit {
    /// The shell's view: the code, or 128 + the signal.
    pub fn status(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 1,
        }
    }
}

/// Everything a node answers on its QUIC port. One request per bidirectional stream.
// See `Command`: decoded once per stream, never stored in bulk.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    // client API
    Submit {
        spec: JobSpec,
    },
    Cancel {
        job: JobId,
    },
    GetJob {
        job: JobId,
    },
    ListJobs {
        include_finished: bool,
    },
    ListNodes,
    ClusterInfo,
    Drain {
        node: String,
        reason: String,
    },
    Resume {
        node: String,
    },
    Logs {
        job: JobId,
        stream: LogStream,
        offset: u64,
        max_bytes: u32,
    },
    /// Admin: a join token good for `ttl_ms`; the reply holds its secret, the log only a hash.
    CreateJoinToken {
        ttl_ms: u64,
    },
    ListJoinTokens,
    RevokeJoinToken {
        id: u64,
    },
    /// Admin: refuse a certificate from now on, by the node that holds it or by fingerprint.
    RevokeCert {
        node: Option<String>,
        fingerprint: Option<String>,
    },
    /// From a node, for a new certificate of its own name (rotation before expiry); a node
    /// holding the cluster CA key answers with `Enrolled`.
    RenewCert {
        csr_pem: String,
    },
    /// From a machine without a certificate (the only request such a peer may make): a join
    /// token's secret and a CSR for node `name`; a node holding the cluster CA key answers.
    Enroll {
        secret: String,
        name: String,
        csr_pem: String,
    },
    // node to node
    Join {
        token: String,
        name: String,
        addr: String,
        inventory: Inventory,
        instance: InstanceId,
        /// Set by the node that took the request from the TLS handshake, never by the caller.
        cert_fingerprint: String,
    },
    Heartbeat {
        node: NodeId,
        instance: InstanceId,
        running: Vec<(JobId, RunNo)>,
    },
    ReportRun {
        job: JobId,
        run: RunNo,
        node: NodeId,
        outcome: RunOutcome,
        usage: GpuUsage,
    },
    /// Start this node's part of `job`'s current run. `nodes`: name and address of every node
    /// of the run, in rank order (rank 0 hosts the rendezvous).
    Launch {
        job: Box<Job>,
        nodes: Vec<(String, String)>,
        /// The leader's applied index when it read the job: the agent applies at least this much
        /// of the log, and what its last heartbeat acknowledgement named, before it starts
        /// anything, and refuses a run that is no longer current there.
        issued_index: u64,
    },
    /// An agent reports a GPU health change (XID, ECC, fell off the bus) for its node.
    ReportGpuHealth {
        node: NodeId,
        gpu: u32,
        mig_uuid: Option<String>,
        healthy: bool,
        reason: String,
    },
    /// An operator marks a GPU healthy (or unhealthy) again.
    SetGpuHealth {
        node: String,
        gpu: u32,
        healthy: bool,
        reason: String,
    },
    /// An agent reports its inventory changed (MIG layout applied).
    ReportInventory {
        node: NodeId,
        inventory: Inventory,
        reason: String,
    },
    /// Stop a running job and queue it again.
    Requeue {
        job: JobId,
    },
    /// Replace the scheduling policy, or read it.
    SetPolicy {
        policy: SchedulerPolicy,
    },
    GetPolicy,
    /// Slurm's configuration keys that Corral has, with the answering node's values
    /// (`scontrol show config`).
    ShowConfig,
    /// Hold or release a pending job, change its time limit or partition.
    UpdateJob {
        job: JobId,
        hold: Option<bool>,
        time_limit_ms: Option<Option<u64>>,
        partition: Option<Option<String>>,
    },
    /// Send a signal to every part of a running job (the batch shell only with `batch_only`).
    Signal {
        job: JobId,
        signal: i32,
        batch_only: bool,
    },
    /// Leader to agent: signal this node's part of `job`'s run `run`.
    SignalPart {
        job: JobId,
        run: RunNo,
        signal: i32,
        batch_only: bool,
    },
    /// `scontrol suspend` (`suspend: true`) or `scontrol resume` of a running job.
    Suspend {
        job: JobId,
        suspend: bool,
    },
    /// Node to leader: a step of `job` run `run` is being created here (the batch script's
    /// node); answered once the log has it ([`Command::StepStarted`]).
    RecordStep {
        job: JobId,
        run: RunNo,
        step: u32,
        name: String,
        nodes: Vec<String>,
        ntasks: u32,
    },
    /// Node to leader: steps whose tasks on node `node` all ended.
    ReportStepEnds {
        node: String,
        ends: Vec<StepEnd>,
    },
    /// Leader to agent: stop (SIGSTOP) or continue (SIGCONT) this node's part of `job`'s run
    /// `run`, as the log says; `paused_ms` is how long the run's ended suspensions lasted, by
    /// which its time limit moves.
    SuspendPart {
        job: JobId,
        run: RunNo,
        suspend: bool,
        paused_ms: u64,
    },
    /// Leader to agent: re-partition idle MIG-mode GPU `gpu` into `profiles` (by start slice),
    /// then report the new inventory.
    ApplyMigLayout {
        gpu: u32,
        profiles: Vec<String>,
    },
    /// Stop a part. `checkpoint`: the job is being requeued, so send its `--signal` first
    /// and give it the time it asked for to write a checkpoint.
    Kill {
        job: JobId,
        run: RunNo,
        checkpoint: bool,
    },
    /// An openraft RPC, encoded by the consensus crate: proto does not know openraft's types.
    Raft {
        kind: RaftRpcKind,
        payload: Vec<u8>,
    },
    /// From `srun` inside a batch job, to its own node: start a step on the job's nodes. The
    /// node numbers the step and has each node's agent start its tasks.
    StepLaunch {
        job: JobId,
        spec: StepSpec,
    },
    /// Node to node: start this node's tasks of step `step` of `job` run `run`.
    StepStart {
        job: JobId,
        run: RunNo,
        step: u32,
        spec: StepSpec,
    },
    /// Node to node, before any [`Request::StepStart`] of a step of several nodes: hold this
    /// node's share of the step's CPUs, memory and GPUs (or, with `release`, give a hold back),
    /// so that the step starts on every node or, while a node's share is busy
    /// ([`ApiError::Busy`]), on none. A hold that no start takes is dropped after
    /// [`limits::STEP_HOLD_MS_MAX`].
    StepHold {
        job: JobId,
        run: RunNo,
        step: u32,
        spec: StepSpec,
        release: bool,
    },
    /// Output and ended tasks of a step on node `node`, from byte `offset` of what that node
    /// has produced; waits up to `wait_ms` for news. Reading from `offset` releases everything
    /// before it. Sent to the node that launched the step, which forwards it.
    StepRead {
        job: JobId,
        step: u32,
        node: String,
        offset: u64,
        /// Exits the reader already has: one more is news, answered at once.
        exits_seen: u32,
        wait_ms: u32,
    },
    /// Bytes for the stdin of a step's tasks on node `node` (those its `StepStdin` reaches),
    /// from byte `offset` of what `srun` read (a chunk sent again is written once); `eof`
    /// closes it.
    StepInput {
        job: JobId,
        step: u32,
        node: String,
        offset: u64,
        data: Vec<u8>,
        eof: bool,
    },
    /// What the live tasks of `job`'s steps and its batch script use on node `node` (`sstat`).
    StepUsage {
        job: JobId,
        node: String,
    },
    /// Signal every task of a step on node `node` (its whole process group).
    StepSignal {
        job: JobId,
        step: u32,
        node: String,
        signal: i32,
    },
    /// `scontrol token`: a token for the REST API (`corral restd`'s `X-SLURM-USER-TOKEN`) naming
    /// `user` (none: the caller; another user's: admins only), good for `lifespan_s` (none:
    /// Slurm's 1800). Answered by the node asked, with [`Reply::Token`].
    IssueToken {
        user: Option<String>,
        lifespan_s: Option<u64>,
    },
    /// Admin: whether the cluster still accepts the certificate of this fingerprint and common
    /// name (`corral restd` asks for each HTTPS client); `Ok`, or `Denied` with the revocation's
    /// reason. Answered by the node asked.
    CheckCert {
        fingerprint: String,
        common_name: String,
    },
    /// `srun --pty`'s terminal changed size: the pseudo-terminal of the step's task 0, on node
    /// `node`, takes it (its foreground processes get SIGWINCH).
    StepResize {
        job: JobId,
        step: u32,
        node: String,
        size: PtySize,
    },
    /// `sbatch --test-only`: when and where the job would start if submitted now; nothing is
    /// written to the log.
    TestSubmit {
        spec: JobSpec,
    },
    /// Jobs matching `query`, live ones from the hot state and finished ones from the
    /// accounting store, one bounded page at a time (answered by any voter; an agent forwards).
    QueryJobs {
        query: JobQuery,
    },
    /// What this node holds: jobs in its hot state, records in its accounting store and their
    /// digest (equal on voters that applied the same log). Answered by the node asked (a voter).
    AccountingDigest,
    /// Several runs' ends from one node at once (node only): what `ReportRun` says, for each
    /// (at most [`REPORTS_PER_REQUEST_MAX`]). `Reply::Ok` once every end is committed.
    ReportRuns {
        node: NodeId,
        reports: Vec<RunReport>,
    },
    /// `ClusterInfo` without the state digest (`state_digest` empty): the members, roles and
    /// Raft indexes, at a cost independent of the jobs (nodes ask it every few seconds; the
    /// digest encodes the whole hot state). Since heartbeats are relayed, `members` lists the
    /// voters and learners only (not every agent: at thousands of nodes, every node asking for
    /// every node every few seconds was quadratic).
    Members,
    /// From a relay (a node that is not the leader), to the leader: the heartbeats it received
    /// since its last batch (node only, at most [`HEARTBEATS_PER_REQUEST_MAX`]). The leader
    /// counts each node alive as of its own receipt of the batch, which is after the node sent
    /// its heartbeat; the relay acknowledges each node only once the leader answered
    /// (`Reply::HeartbeatAcks`), so an acknowledgement still means a leader counts it alive.
    Heartbeats {
        relay: NodeId,
        beats: Vec<Beat>,
    },
    /// Create, change or delete one partition (admin only).
    EditPartition {
        edit: PartitionEdit,
    },
    /// `Requeue`, then held in the same log entry (`scontrol requeuehold`): a finished job
    /// cannot start between the two.
    RequeueHold {
        job: JobId,
    },
    /// `sacctmgr add|modify|delete` (admin only), all or none.
    EditAccounts {
        edits: Vec<AccountsEdit>,
    },
    /// The accounting database (`sacctmgr show`), answered by any node from its state.
    GetAccounts,
    /// Fair share of every association now (`sshare`), answered by any node from its state.
    GetShares,
    /// The priority factors of pending jobs now (`sprio`): those of `jobs` and `users` (empty:
    /// any), answered by any node from its state.
    GetPriorities {
        jobs: Vec<JobId>,
        users: Vec<String>,
    },
    /// `corral mig set NODE GPU PROFILES|auto` (admin only): pin a MIG-mode GPU to a layout,
    /// applied once the GPU is idle (only that GPU is drained meanwhile), or unpin it (`None`).
    SetMigLayout {
        node: String,
        gpu: u32,
        profiles: Option<Vec<String>>,
    },
    /// (node only) This instance of `node` stopped gracefully: every run it had is stopped
    /// and reported, and it launches nothing more (`Command::NodeStopped`). `Reply::Ok` once
    /// committed.
    NodeStopped {
        node: NodeId,
        instance: InstanceId,
    },
}

/// One node's heartbeat, as a relay passes it to the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    pub node: NodeId,
    pub instance: InstanceId,
}

/// Heartbeats in one `Heartbeats` at most.
pub const HEARTBEATS_PER_REQUEST_MAX: usize = 8_192;

/// How one run ended on a node, as reported to the leader.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunReport {
    pub job: JobId,
    pub run: RunNo,
    pub outcome: RunOutcome,
    pub usage: GpuUsage,
}

/// Reports in one `ReportRuns` at most.
pub const REPORTS_PER_REQUEST_MAX: usize = 256;

/// A server-side job query (`squeue`, `sacct`, `corral queue`): every non-empty list must match
/// (any of its values), pages are in job id order after `after`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobQuery {
    /// Job ids; an array's id matches its tasks too.
    pub ids: Vec<JobId>,
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    pub names: Vec<String>,
    pub states: Vec<JobState>,
    pub partitions: Vec<String>,
    /// Include pending and running jobs.
    pub live: bool,
    /// Include finished jobs still in the hot state (the last `min_job_age_s`, as `squeue`).
    pub finished: bool,
    /// Include finished jobs from the accounting store too (as `sacct`); needs `finished`.
    pub history: bool,
    /// Finished jobs that ended before this are left out.
    pub ended_after_ms: Option<u64>,
    /// Jobs submitted after this are left out.
    pub submitted_before_ms: Option<u64>,
    /// Page cursor: only ids above this.
    pub after: JobId,
    /// Jobs in one page at most (capped at [`JOB_PAGE_MAX`]; 0 means the cap).
    pub limit: u32,
    /// Leave out each job's environment and script (what listings never show).
    pub brief: bool,
}

/// Jobs in one reply page at most.
pub const JOB_PAGE_MAX: u32 = 1000;
/// Finished-job records one query page reads at most before it answers with what it has.
pub const JOB_PAGE_SCAN_MAX: u32 = 50_000;

impl JobQuery {
    /// Whether `job` passes every filter except the cursor and the page size.
    pub fn matches(&self, job: &Job) -> bool {
        let final_ = job.state.is_final();
        if (final_ && !self.finished) || (!final_ && !self.live) {
            return false;
        }
        let id_ok = self.ids.is_empty() || self.ids.iter().any(|&i| i == job.id || job.array.as_ref().is_some_and(|a| a.array_job == i));
        let user_ok = self.users.is_empty() || self.users.contains(&job.spec.user);
        let account_ok = self.accounts.is_empty() || job.spec.account.as_ref().is_some_and(|a| self.accounts.contains(a));
        let name_ok = self.names.is_empty() || self.names.contains(&job.spec.name);
        let state_ok = self.states.is_empty() || self.states.contains(&job.state);
        let partition = job.spec.partition.as_deref().unwrap_or("default");
        let partition_ok = self.partitions.is_empty() || self.partitions.iter().any(|p| p == partition);
        let ended_ok = match (self.ended_after_ms, job.end_ms) {
            (Some(after), Some(end)) if final_ => end >= after,
            _ => true,
        };
        let submitted_ok = self.submitted_before_ms.is_none_or(|b| job.submit_ms <= b);
        id_ok && user_ok && account_ok && name_ok && state_ok && partition_ok && ended_ok && submitted_ok
    }

    /// The page size this query gets.
    pub fn page_limit(&self) -> usize {
        (if self.limit == 0 { JOB_PAGE_MAX } else { self.limit.min(JOB_PAGE_MAX) }) as usize
    }
}

impl Request {
    /// Writes must reach the leader; a follower or agent forwards them.
    pub fn needs_leader(&self) -> bool {
        matches!(
            self,
            Request::Submit { .. }
                | Request::Cancel { .. }
                | Request::Drain { .. }
                | Request::Resume { .. }
                | Request::Join { .. }
                | Request::Heartbeat { .. }
                | Request::Heartbeats { .. }
                | Request::ReportRun { .. }
                | Request::ReportRuns { .. }
                | Request::NodeStopped { .. }
                | Request::ReportGpuHealth { .. }
                | Request::SetGpuHealth { .. }
                | Request::ReportInventory { .. }
                | Request::Requeue { .. }
                | Request::RequeueHold { .. }
                | Request::SetMigLayout { .. }
                | Request::EditPartition { .. }
                | Request::EditAccounts { .. }
                | Request::UpdateJob { .. }
                | Request::Signal { .. }
                | Request::Suspend { .. }
                | Request::RecordStep { .. }
                | Request::ReportStepEnds { .. }
                | Request::SetPolicy { .. }
                | Request::CreateJoinToken { .. }
                | Request::RevokeJoinToken { .. }
                | Request::RevokeCert { .. }
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRpcKind {
    AppendEntries,
    Vote,
    PreVote,
    FullSnapshot,
    TransferLeader,
    /// One chunk of a snapshot streamed to a follower (see `consensus::network`).
    SnapshotChunk,
}

/// A request with its routing: `hops` counts forwards, so a misrouted request cannot loop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub hops: u8,
    pub request: Request,
    /// The user a node acts for when it forwards a client's request. Set by the first node
    /// from the caller's certificate; a user's own certificate always wins over this field.
    pub user: Option<String>,
}

pub const FORWARD_HOPS_MAX: u8 = 3;

/// The partition of jobs and nodes that name none, when the policy marks no partition default.
pub const DEFAULT_PARTITION: &str = "default";
/// The QoS of jobs that name none.
pub const DEFAULT_QOS: &str = "normal";

/// Why a job asked to be requeued (`corral requeue`, `scontrol requeue`) was: in its reasons
/// (`requeued: ...`), so the leader stops it as Slurm does, without its `--signal`.
pub const REQUEUED_ON_REQUEST: &str = "requeued on request";

/// The end of one step's tasks on one node ([`Request::ReportStepEnds`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEnd {
    pub job: JobId,
    pub run: RunNo,
    pub step: u32,
    pub exit_code: i32,
    pub signal: Option<i32>,
}

/// Step ends in one `ReportStepEnds` at most.
pub const STEP_ENDS_PER_REQUEST_MAX: usize = 512;

/// Why a step of a suspended job waits ([`ApiError::Busy`]): Slurm's words, which its `srun`
/// prints while it retries.
pub const STEPS_DISABLED_SUSPENDED: &str = "Requested operation is presently disabled";

/// Memory per GPU on its node of a job that asks none (Slurm's `DefMemPerGPU`).
pub const DEF_MEM_PER_GPU_MIB: u64 = 16 * 1024;
/// Memory per CPU on its node of a job that asks none (Slurm's `DefMemPerCPU`).
pub const DEF_MEM_PER_CPU_MIB: u64 = 1024;

/// Ports handed out as `MASTER_PORT`, one per job per first node.
pub const MASTER_PORT_FIRST: u16 = 29_500;
pub const MASTER_PORT_COUNT: u16 = 1_000;
/// Ports a step's rendezvous (`PET_MASTER_PORT` of an `srun`) is chosen from, on the node that
/// numbers it: after the jobs' range and below Linux's ephemeral ports (32768 up), so no
/// outgoing connection takes one between the choice and the bind.
pub const STEP_PORT_FIRST: u16 = 30_500;
pub const STEP_PORT_COUNT: u16 = 2_000;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMember {
    pub id: NodeId,
    pub name: String,
    pub role: NodeRole,
    pub addr: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub leader: Option<String>,
    pub leader_id: Option<NodeId>,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// Last log index covered by this node's latest snapshot, and last index purged from its log.
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    pub answered_by: String,
    /// Hex SHA-256 of this node's applied state (equal on voters at the same applied index).
    pub state_digest: String,
    pub members: Vec<ClusterMember>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    Submitted {
        job: JobId,
    },
    Job(Box<Job>),
    Jobs(Vec<Job>),
    Nodes(Vec<NodeInfo>),
    Cluster(ClusterInfo),
    LogChunk {
        data: Vec<u8>,
        next_offset: u64,
        finished: bool,
    },
    Joined {
        id: NodeId,
        name: String,
    },
    HeartbeatAck {
        leader: NodeId,
        term: u64,
        /// The leader's commit index when it acknowledged: everything the cluster decided before
        /// the acknowledgement (a `NodeDown`, a requeue) is at or below it.
        commit_index: u64,
    },
    LaunchAck {
        job: JobId,
        run: RunNo,
        instance: InstanceId,
    },
    Raft {
        payload: Vec<u8>,
    },
    Policy(SchedulerPolicy),
    /// `sshare`'s lines, depth-first from root.
    Shares(Vec<accounts::ShareLine>),
    /// `sprio`: the weights (age, fair share, job size, partition, QoS) and each pending job's
    /// factors.
    Priorities {
        weights: [u32; 5],
        jobs: Vec<accounts::PriorityLine>,
    },
    /// The accounting database and the policy (whose QoS it names), for `sacctmgr show`.
    Accounts {
        accounts: Box<accounts::Accounts>,
        policy: SchedulerPolicy,
    },
    /// (key, value) in Slurm's words and formats, sorted by key.
    Config(Vec<(String, String)>),
    JoinTokenCreated {
        id: u64,
        secret: String,
        expires_ms: u64,
    },
    JoinTokens(Vec<JoinTokenRecord>),
    /// A signed node certificate, the CA, the cluster's member secret for `Join`, and where
    /// the cluster's nodes are.
    Enrolled {
        ca_cert_pem: String,
        cert_pem: String,
        join_secret: String,
        servers: Vec<String>,
    },
    StepLaunched {
        step: u32,
        run: RunNo,
    },
    /// What the scheduler would do with a job submitted now: the id it would get; when and
    /// where it would start (now, or at its backfill reservation), or why not.
    TestSubmitted {
        job: JobId,
        start_ms: Option<u64>,
        nodes: Vec<String>,
        cpus: u32,
        reasons: Vec<String>,
    },
    /// Answer to [`Request::IssueToken`].
    Token(String),
    /// Answer to [`Request::StepUsage`]: at most [`TASK_USAGES_MAX`].
    StepUsage(Vec<TaskUsage>),
    /// A step's output on one node since the offset asked for; `done` once every task there
    /// ended and all its output was read.
    StepOutput {
        chunks: Vec<StepChunk>,
        next_offset: u64,
        exits: Vec<TaskExit>,
        done: bool,
    },
    /// One page of a [`Request::QueryJobs`]: `next` is the cursor for the next page (`after`),
    /// none once everything matching was returned.
    JobPage {
        jobs: Vec<Job>,
        next: Option<JobId>,
    },
    AccountingDigest {
        node: String,
        applied_index: u64,
        hot_jobs: u64,
        records: u64,
        digest: String,
        /// Bytes of the store's files on disk.
        disk_bytes: u64,
    },
    /// The leader's answer to a relay's `Heartbeats`: what a `HeartbeatAck` says, for every
    /// beat but the `refused` ones (each with the error the node gets).
    HeartbeatAcks {
        leader: NodeId,
        term: u64,
        commit_index: u64,
        refused: Vec<(NodeId, ApiError)>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApiError {
    #[error("not the leader (leader: {leader_addr:?})")]
    NotLeader { leader: Option<NodeId>, leader_addr: Option<String> },
    #[error("no leader is known right now")]
    NoLeader,
    #[error("not found: {0}")]
    NotFound(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("refused: {0}")]
    Denied(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// What was asked cannot be had now but will be (a step's GPUs held by other steps): ask
    /// again later, as Slurm's `srun` does ("step creation temporarily disabled").
    #[error("busy: {0}")]
    Busy(String),
    #[error("protocol version mismatch: ours {ours}, theirs {theirs}")]
    Version { ours: u8, theirs: u8 },
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Response = Result<Reply, ApiError>;
