//! What a node answers: [`Reply`] and the payloads only replies carry (cluster membership), and
//! [`Response`], a reply or an [`ApiError`].

use serde::{Deserialize, Serialize};

use crate::{
    accounts, ApiError, InstanceId, Job, JobId, JoinTokenRecord, NodeId, NodeInfo, NodeRole, RunNo, SchedulerPolicy, StepChunk, TaskExit,
    TaskUsage,
};
#[cfg(doc)]
use crate::{ClientRequest, TASK_USAGES_MAX};

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
    /// What an operation on a job's rendezvous store answered (`PeerRequest::Store`).
    Store(crate::StoreAnswer),
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
    Reservations(Vec<crate::AdminReservation>),
    /// `scontrol create reservation`: the name it was made under.
    ReservationMade {
        name: String,
    },
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
    /// Answer to [`ClientRequest::IssueToken`].
    Token(String),
    /// Answer to [`ClientRequest::StepUsage`]: at most [`TASK_USAGES_MAX`].
    StepUsage(Vec<TaskUsage>),
    /// A step's output on one node since the offset asked for; `done` once every task there
    /// ended and all its output was read.
    StepOutput {
        chunks: Vec<StepChunk>,
        next_offset: u64,
        exits: Vec<TaskExit>,
        done: bool,
    },
    /// One page of a [`ClientRequest::QueryJobs`]: `next` is the cursor for the next page (`after`),
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
    /// Answer to [`ClientRequest::Whoami`].
    Caller {
        user: String,
        admin: bool,
    },
    /// Answer to [`ClientRequest::GpuSeries`]: oldest first, at most [`GPU_POINTS_MAX`].
    GpuSeries(Vec<GpuPoint>),
    /// Answer to [`ClientRequest::GpuSamples`]: at most [`GPU_SAMPLES_MAX`].
    GpuSamples(Vec<GpuNow>),
    /// Answer to [`ClientRequest::QueueSummary`]: `counts` by state name over all `total` live jobs;
    /// `jobs` at most [`QUEUE_ROWS_MAX`].
    QueueSummary {
        counts: Vec<(String, u64)>,
        total: u64,
        jobs: Vec<Job>,
    },
    /// Answer to [`ClientRequest::NodeEvents`]: at most [`crate::NODE_EVENTS_MAX`].
    NodeEvents(Vec<crate::NodeEvent>),
    /// Answer to [`ClientRequest::ExpectedStarts`]: (job, epoch ms), at most
    /// [`EXPECTED_STARTS_MAX`].
    ExpectedStarts(Vec<(JobId, u64)>),
    /// Answer to [`ClientRequest::StepMove`]: the lost node's tasks of the step run on `node` now.
    StepMoved {
        node: String,
    },
}

/// One point of a job's GPU series on a node: the mean utilization of its GPUs there and the
/// most memory one of them used, over the samples from `start_ms` to `end_ms` (epoch ms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPoint {
    pub start_ms: u64,
    pub end_ms: u64,
    pub utilization_pct: u32,
    pub memory_used_mib: u64,
}

/// A GPU's (or MIG instance's) latest sample on its node, with when it was taken (epoch ms).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuNow {
    pub gpu: u32,
    /// Set for a MIG instance: its start slice on `gpu`.
    pub mig_start_slice: Option<u32>,
    /// `None` where the device gives none (NVML has none for a MIG instance).
    pub utilization_pct: Option<u32>,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub at_ms: u64,
}

/// Samples in one [`Reply::GpuSamples`] at most (a node's GPUs and their MIG instances).
pub const GPU_SAMPLES_MAX: usize = 1_024;

/// Points in one [`Reply::GpuSeries`] at most: a longer run's points are merged in pairs.
pub const GPU_POINTS_MAX: usize = 240;
/// Rows in one [`Reply::QueueSummary`] at most.
pub const QUEUE_ROWS_MAX: u32 = 1_000;
/// Jobs in one [`Reply::ExpectedStarts`] at most.
pub const EXPECTED_STARTS_MAX: usize = 1_024;

pub type Response = Result<Reply, ApiError>;
