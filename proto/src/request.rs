//! Requests between clients and nodes and between nodes: [`Request`], its [`Envelope`], the
//! payloads only requests carry (heartbeats, run reports, job queries) and which need the leader.

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::{limits, ApiError, Command, Reply};
use crate::{
    AccountsEdit, GpuUsage, InstanceId, Inventory, Job, JobId, JobSpec, JobState, LogStream, NodeId, PartitionEdit, PtySize,
    ReservationEdit, RunNo, RunOutcome, SchedulerPolicy, StepEnd, StepSpec, StoreOp,
};

/// Everything a node answers on its QUIC port (and its local socket): a client's request or a
/// node's. One request per bidirectional stream.
// See `Command`: decoded once per stream, never stored in bulk.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Client(ClientRequest),
    Peer(PeerRequest),
}

/// What users and their tools ask of any node (the CLI, the Slurm commands, `corral restd`):
/// who may send each is [`ClientRequest::access`].
// See `Command`: decoded once per stream, never stored in bulk.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientRequest {
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
    /// A job's output from byte `offset` ([`LOG_OFFSET_TAIL`]: its last `max_bytes` bytes).
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
    /// An operator marks a GPU healthy (or unhealthy) again.
    SetGpuHealth {
        node: String,
        gpu: u32,
        healthy: bool,
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
    /// `scontrol suspend` (`suspend: true`) or `scontrol resume` of a running job.
    Suspend {
        job: JobId,
        suspend: bool,
    },
    /// From `srun` inside a batch job, to its own node: start a step on the job's nodes. The
    /// node numbers the step and has each node's agent start its tasks.
    StepLaunch {
        job: JobId,
        spec: StepSpec,
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
    /// `ClusterInfo` without the state digest (`state_digest` empty): the members, roles and
    /// Raft indexes, at a cost independent of the jobs (nodes ask it every few seconds; the
    /// digest encodes the whole hot state). Since heartbeats are relayed, `members` lists the
    /// voters and learners only (not every agent: at thousands of nodes, every node asking for
    /// every node every few seconds was quadratic).
    Members,
    /// Create, change or delete one reservation (admin only).
    EditReservation {
        edit: ReservationEdit,
    },
    /// The reservations that have not ended (`scontrol show reservation`, `sinfo`).
    GetReservations,
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
    /// Who the caller is to the node asked: its user, and whether that user is one of the
    /// node's admins ([`Reply::Caller`]). Answered by the node asked.
    Whoami,
    /// The GPU utilization and memory of `job`'s GPUs on node `node` over its current or
    /// recent run ([`Reply::GpuSeries`]); like `sstat`, any user's (Slurm without PrivateData).
    GpuSeries {
        job: JobId,
        node: String,
    },
    /// The latest sample of each GPU (and MIG instance) a job holds on node `node`
    /// ([`Reply::GpuSamples`]), for the web UI's map; any user's, like DCGM's series.
    GpuSamples {
        node: String,
    },
    /// The web UI's queue, in one read: the live jobs' counts by state, and at most `rows_max`
    /// of them (running ones by id, then the pending ones of `first` in that order, then the
    /// other pending ones by id), brief, pending ones with their reasons ([`Reply::QueueSummary`]).
    /// `user`: only that user's. Answered by any member from its state.
    QueueSummary {
        user: Option<String>,
        first: Vec<JobId>,
        rows_max: u32,
    },
    /// The last node events the replicated state keeps, newest last ([`Reply::NodeEvents`]).
    /// Answered by any member from its state.
    NodeEvents,
    /// When the last scheduling pass expects pending jobs to start: their backfill
    /// reservations ([`Reply::ExpectedStarts`]). Answered by the leader.
    ExpectedStarts,
    /// From `srun`, whose step has tasks on node `lost` of a batch job that lost that node and
    /// moved its rank to a spare (a repair): start those tasks, with their ranks, on the spare
    /// ([`Reply::StepMoved`]). Sent to the node that launched the step, which forwards it;
    /// [`ApiError::Busy`] while the node is not (yet) repaired.
    StepMove {
        job: JobId,
        step: u32,
        lost: String,
    },
}

/// The node-to-node protocol: only a node's certificate may send these (and a machine without
/// one only [`PeerRequest::Enroll`]); a client's requests are forwarded as [`ClientRequest`]s.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerRequest {
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
    /// An agent reports its inventory changed (MIG layout applied).
    ReportInventory {
        node: NodeId,
        inventory: Inventory,
        reason: String,
    },
    /// Leader to agent: signal this node's part of `job`'s run `run`.
    SignalPart {
        job: JobId,
        run: RunNo,
        signal: i32,
        batch_only: bool,
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
    /// which its time limit moves; `change` counts the run's suspends and resumes, so an order
    /// overtaken by a newer one is ignored (`control::agent::suspension_is_newer`).
    SuspendPart {
        job: JobId,
        run: RunNo,
        suspend: bool,
        paused_ms: u64,
        change: u32,
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
    /// Node to node: start this node's tasks of step `step` of `job` run `run`.
    StepStart {
        job: JobId,
        run: RunNo,
        step: u32,
        spec: StepSpec,
    },
    /// Node to node, before any [`PeerRequest::StepStart`] of a step of several nodes: hold this
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
    /// Several runs' ends from one node at once (node only): what `ReportRun` says, for each
    /// (at most [`REPORTS_PER_REQUEST_MAX`]). `Reply::Ok` once every end is committed.
    ReportRuns {
        node: NodeId,
        reports: Vec<RunReport>,
    },
    /// From a relay (a node that is not the leader), to the leader: the heartbeats it received
    /// since its last batch (node only, at most [`HEARTBEATS_PER_REQUEST_MAX`]). The leader
    /// counts each node alive as of its own receipt of the batch, which is after the node sent
    /// its heartbeat; the relay acknowledges each node only once the leader answered
    /// (`Reply::HeartbeatAcks`), so an acknowledgement still means a leader counts it alive.
    Heartbeats {
        relay: NodeId,
        beats: Vec<Beat>,
    },
    /// (node only) This instance of `node` stopped gracefully: every run it had is stopped
    /// and reported, and it launches nothing more (`Command::NodeStopped`). `Reply::Ok` once
    /// committed.
    NodeStopped {
        node: NodeId,
        instance: InstanceId,
    },
    /// Node to leader: an operation on the rendezvous store of `job`'s run `run`, for a process
    /// of that run's part on the node (`Reply::Store`). Writes are answered once committed.
    Store {
        job: JobId,
        run: RunNo,
        op: StoreOp,
        /// (client, sequence number) of a write, as in `Command::Store`.
        write: (u64, u64),
    },
}

/// One node's heartbeat, as a relay passes it to the leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    pub node: NodeId,
    pub instance: InstanceId,
}

/// The `offset` of a [`ClientRequest::Logs`] that asks for the end of the output.
pub const LOG_OFFSET_TAIL: u64 = u64::MAX;

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
        match self {
            Request::Client(request) => request.needs_leader(),
            Request::Peer(request) => request.needs_leader(),
        }
    }
}

impl From<ClientRequest> for Request {
    fn from(request: ClientRequest) -> Request {
        Request::Client(request)
    }
}

impl From<PeerRequest> for Request {
    fn from(request: PeerRequest) -> Request {
        Request::Peer(request)
    }
}

impl ClientRequest {
    /// Writes (and the last pass's reservations, which only the leader has) must reach the
    /// leader; every other request is a read any member answers from its state, or an
    /// answer of the node asked. Exhaustive, so a new request does not compile unclassified.
    pub fn needs_leader(&self) -> bool {
        use ClientRequest as C;
        match self {
            C::Submit { .. }
            | C::Cancel { .. }
            | C::Drain { .. }
            | C::Resume { .. }
            | C::SetGpuHealth { .. }
            | C::Requeue { .. }
            | C::RequeueHold { .. }
            | C::SetMigLayout { .. }
            | C::EditPartition { .. }
            | C::EditReservation { .. }
            | C::EditAccounts { .. }
            | C::UpdateJob { .. }
            | C::Signal { .. }
            | C::Suspend { .. }
            | C::SetPolicy { .. }
            | C::CreateJoinToken { .. }
            | C::RevokeJoinToken { .. }
            | C::RevokeCert { .. }
            | C::ExpectedStarts => true,
            C::GetJob { .. }
            | C::ListJobs { .. }
            | C::ListNodes
            | C::ClusterInfo
            | C::Logs { .. }
            | C::ListJoinTokens
            | C::GetPolicy
            | C::ShowConfig
            | C::StepLaunch { .. }
            | C::StepRead { .. }
            | C::StepInput { .. }
            | C::StepUsage { .. }
            | C::StepSignal { .. }
            | C::IssueToken { .. }
            | C::CheckCert { .. }
            | C::StepResize { .. }
            | C::TestSubmit { .. }
            | C::QueryJobs { .. }
            | C::AccountingDigest
            | C::Members
            | C::GetReservations
            | C::GetAccounts
            | C::GetShares
            | C::GetPriorities { .. }
            | C::Whoami
            | C::GpuSeries { .. }
            | C::GpuSamples { .. }
            | C::QueueSummary { .. }
            | C::NodeEvents
            | C::StepMove { .. } => false,
        }
    }
}

impl PeerRequest {
    /// What a node reports to the cluster goes to the leader; orders to an agent, steps'
    /// node-to-node calls, Raft and enrolment are answered by the node asked.
    pub fn needs_leader(&self) -> bool {
        use PeerRequest as P;
        match self {
            P::Join { .. }
            | P::Heartbeat { .. }
            | P::Heartbeats { .. }
            | P::ReportRun { .. }
            | P::ReportRuns { .. }
            | P::NodeStopped { .. }
            | P::ReportGpuHealth { .. }
            | P::ReportInventory { .. }
            | P::RecordStep { .. }
            | P::ReportStepEnds { .. }
            | P::Store { .. } => true,
            P::Enroll { .. }
            | P::RenewCert { .. }
            | P::Launch { .. }
            | P::Kill { .. }
            | P::ApplyMigLayout { .. }
            | P::SignalPart { .. }
            | P::SuspendPart { .. }
            | P::StepStart { .. }
            | P::StepHold { .. }
            | P::Raft { .. } => false,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_page_is_capped_at_its_bound() {
        let mut q = JobQuery::default();
        assert_eq!(q.page_limit(), JOB_PAGE_MAX as usize, "0 means the cap");
        q.limit = 10;
        assert_eq!(q.page_limit(), 10);
        q.limit = JOB_PAGE_MAX + 1;
        assert_eq!(q.page_limit(), JOB_PAGE_MAX as usize);
    }

    #[test]
    fn writes_need_the_leader_and_reads_do_not() {
        assert!(Request::from(ClientRequest::Cancel { job: 1 }).needs_leader());
        assert!(Request::from(PeerRequest::Heartbeats { relay: 1, beats: vec![Beat { node: 2, instance: 3 }] }).needs_leader());
        assert!(!Request::from(ClientRequest::GetJob { job: 1 }).needs_leader());
        assert!(!ClientRequest::ListNodes.needs_leader());
        assert!(!ClientRequest::QueryJobs { query: JobQuery::default() }.needs_leader());
        assert!(!PeerRequest::Kill { job: 1, run: 1, checkpoint: false }.needs_leader(), "an order is for the node asked");
    }
}
