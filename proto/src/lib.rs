//! Wire and log types only: ids, job and node records, the replicated `Command`, client and peer
//! requests, and the one codec that turns them into bytes. No IO, no clock, no async: serde and a
//! size-checked, versioned postcard encoding, nothing more.

pub mod codec;
pub mod limits;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use codec::{decode, encode, CodecError};

/// Bumped on any incompatible change to a type in this crate. The first byte of every encoded
/// message; a peer speaking another version is refused with a clear error.
pub const PROTOCOL_VERSION: u8 = 1;

pub type NodeId = u64;
pub type JobId = u64;
/// Each start of a job is a run, numbered from 1. Reports from an older run are ignored.
pub type RunNo = u32;
/// A random id chosen by each `corrald` process at start. A job launched by one instance of a
/// node cannot be supervised by a later one.
pub type InstanceId = u64;

// ---------------------------------------------------------------------------------------------
// Nodes and GPUs

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index of the GPU on its node (as `nvidia-smi` numbers them).
    pub index: u32,
    pub uuid: String,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// GRES type used in requests, e.g. `h100`.
    pub gres_type: String,
    pub memory_mib: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
    pub cpus: u32,
    pub memory_mib: u64,
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
    pub inventory: Inventory,
    pub state: NodeState,
    /// Set by `Drain`, cleared by `Resume`; survives DOWN/UP.
    pub drained: bool,
    pub instance: InstanceId,
    pub state_reason: Option<String>,
    pub registered_ms: u64,
    pub state_changed_ms: u64,
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
    pub reason: Option<String>,
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
            ["gpu", t, n] if !t.is_empty() => Ok(GresRequest {
                gpu_type: Some((*t).to_string()),
                count: n.parse().map_err(|_| bad())?,
            }),
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
    pub mem_mib: u64,
    pub time_limit_ms: Option<u64>,
    pub workdir: String,
    pub env: BTreeMap<String, String>,
    /// Output file for stdout (and stderr when `error` is none). Relative to `workdir`.
    pub output: Option<String>,
    pub error: Option<String>,
    pub user: String,
    pub requeue: bool,
}

impl JobSpec {
    pub fn gpus(&self) -> u32 {
        self.gres.as_ref().map_or(0, |g| g.count)
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
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::NodeFail => "NODE_FAIL",
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

/// Where a run of a job was placed: one node, the GPU indices on it, and the CPUs and memory
/// counted against it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub node: NodeId,
    pub gpus: Vec<u32>,
    pub cpus: u32,
    pub mem_mib: u64,
}

/// A job in the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub spec: JobSpec,
    pub state: JobState,
    pub exit_code: Option<i32>,
    /// The run in progress or the last one; 0 before the first start.
    pub run: RunNo,
    /// Resources held by the current run. Kept until the agent reports the process gone (or its
    /// node is declared down), also after a cancel, so no GPU is handed out twice.
    pub alloc: Option<Allocation>,
    /// Node and GPUs of the last run, kept for display after the allocation is released.
    pub last_node: Option<NodeId>,
    pub last_gpus: Vec<u32>,
    /// Instance of the node that confirmed the launch of the current run.
    pub launched_by: Option<InstanceId>,
    pub submit_ms: u64,
    pub start_ms: Option<u64>,
    pub end_ms: Option<u64>,
    pub restart_count: u32,
    pub reason: Option<String>,
}

impl Job {
    /// The current run was committed but no agent confirmed it started yet.
    pub fn launch_pending(&self) -> bool {
        self.state == JobState::Running && self.alloc.is_some() && self.launched_by.is_none()
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
}

/// One placement of a plan: job `job`, run `run`, on `alloc`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub job: JobId,
    pub run: RunNo,
    pub alloc: Allocation,
}

/// Every change to the cluster state is one of these, committed through Raft. Time travels
/// inside the command (`now_ms`, stamped by the leader) so applying it is deterministic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    RegisterNode { name: String, addr: String, inventory: Inventory, instance: InstanceId, now_ms: u64 },
    /// A node heartbeats again, or with a new instance.
    NodeUp { node: NodeId, instance: InstanceId, now_ms: u64 },
    NodeDown { node: NodeId, reason: String, now_ms: u64 },
    Drain { node: NodeId, reason: String, now_ms: u64 },
    Resume { node: NodeId, now_ms: u64 },
    Submit { spec: JobSpec, now_ms: u64 },
    /// Placements chosen by the scheduler; apply re-checks each and rejects the stale ones.
    Plan { placements: Vec<Placement>, now_ms: u64 },
    LaunchConfirmed { job: JobId, run: RunNo, node: NodeId, instance: InstanceId, now_ms: u64 },
    RunFinished { job: JobId, run: RunNo, node: NodeId, outcome: RunOutcome, now_ms: u64 },
    Cancel { job: JobId, now_ms: u64 },
}

/// What applying a command answered, returned to the proposer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    Ok,
    NodeRegistered { id: NodeId },
    Submitted { job: JobId },
    /// Jobs of the plan that were placed, and those rejected with the reason.
    Planned { accepted: Vec<JobId>, rejected: Vec<(JobId, String)> },
    /// The command was valid on the wire but not in the current state (e.g. cancel of an
    /// unknown job). Nothing changed.
    Rejected(String),
}

// ---------------------------------------------------------------------------------------------
// Requests between clients and nodes, and between nodes

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// Everything a node answers on its QUIC port. One request per bidirectional stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    // client API
    Submit { spec: JobSpec },
    Cancel { job: JobId },
    GetJob { job: JobId },
    ListJobs { include_finished: bool },
    ListNodes,
    ClusterInfo,
    Drain { node: String, reason: String },
    Resume { node: String },
    Logs { job: JobId, stream: LogStream, offset: u64, max_bytes: u32 },
    // node to node
    Join { token: String, name: String, addr: String, inventory: Inventory, instance: InstanceId },
    Heartbeat { node: NodeId, instance: InstanceId, running: Vec<(JobId, RunNo)> },
    ReportRun { job: JobId, run: RunNo, node: NodeId, outcome: RunOutcome },
    Launch { job: Box<Job> },
    Kill { job: JobId, run: RunNo },
    /// An openraft RPC, encoded by the consensus crate: proto does not know openraft's types.
    Raft { kind: RaftRpcKind, payload: Vec<u8> },
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
                | Request::ReportRun { .. }
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
}

/// A request with its routing: `hops` counts forwards, so a misrouted request cannot loop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    pub hops: u8,
    pub request: Request,
}

pub const FORWARD_HOPS_MAX: u8 = 3;

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
    pub answered_by: String,
    pub members: Vec<ClusterMember>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Ok,
    Submitted { job: JobId },
    Job(Box<Job>),
    Jobs(Vec<Job>),
    Nodes(Vec<NodeInfo>),
    Cluster(ClusterInfo),
    LogChunk { data: Vec<u8>, next_offset: u64, finished: bool },
    Joined { id: NodeId, name: String },
    HeartbeatAck { leader: NodeId, term: u64 },
    LaunchAck { job: JobId, run: RunNo, instance: InstanceId },
    Raft { payload: Vec<u8> },
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
    #[error("protocol version mismatch: ours {ours}, theirs {theirs}")]
    Version { ours: u8, theirs: u8 },
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Response = Result<Reply, ApiError>;
