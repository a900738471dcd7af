//! One running node: the request handler every peer and client talks to, the leader's control
//! loop, and the startup sequence that wires them together.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use consensus::{MemberNode, Raft, StateHandle};
use proto::{
    ApiError, ClusterInfo, ClusterMember, Command, CommandResult, Envelope, InstanceId, Inventory, Job, JobId, JobState, LogStream, NodeId,
    NodeInfo, NodeRole, NodeState, Reply, Request, Response, RunNo, FORWARD_HOPS_MAX,
};
use tokio::sync::Notify;
use tracing::{debug, error, info, info_span, warn, Instrument};
use transport::{Client, Handler, Peer};

use crate::agent::Agent;
use crate::config::NodeConfig;
use crate::link::{LeaderLink, LinkError};
use crate::liveness;

pub fn now_ms() -> u64 {
    crate::fault::wall_ms()
}

const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a forward waits for a handshake with the leader (a live one answers in well under a
/// millisecond on a LAN; a dead one should cost its clients little).
const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a leader that could not be reached is taken for dead by forwards (an election
/// takes at most the election timeout; past this, it is tried again).
const UNREACHABLE_LEADER_HOLD: Duration = Duration::from_millis(1_000);
/// The longest pause after a leader tick (see `leader_loop`).
const TICK_PAUSE_MAX: Duration = Duration::from_millis(100);
/// How long a step's start waits for a node whose part of the job is still starting.
const STEP_START_PATIENCE_MS: u64 = 30_000;
const STEP_START_RETRY_MS: u64 = 100;
/// How long the leader waits before re-sending a launch or kill that got no answer.
const RESEND_AFTER_MS: u64 = 1_000;
const RESEND_AFTER: Duration = Duration::from_millis(RESEND_AFTER_MS);
/// How often the leader moves finished jobs to the accounting store and prunes old records.
const ARCHIVE_INTERVAL: Duration = Duration::from_millis(1_000);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What only the leader keeps, in memory, for the term it leads. Rebuilt on every election, so
/// a new leader gives every node a fresh grace period.
struct LeaderMemory {
    term: Option<u64>,
    /// The origin of the millisecond clock the pure decisions (`control::leader`) are given.
    epoch: Instant,
    last_seen: HashMap<NodeId, Instant>,
    /// Sends of launches and stops not yet answered through the log, to re-send after
    /// `RESEND_AFTER_MS` (pruned every pass: at most what one period sent).
    launches_sent: control::leader::Resend<(JobId, RunNo, NodeId)>,
    kills_sent: control::leader::Resend<(JobId, RunNo, NodeId)>,
    layouts_sent: HashMap<(NodeId, u32), Instant>,
    /// How many nodes a mass silence holds back from `NodeDown` (`control::leader::nodes_down`), to
    /// say so when it starts and ends.
    held_down: usize,
    /// When this leader declared nodes down, within the last grace period (at most one entry
    /// per node: a node is declared down once until it is back).
    declared_down: std::collections::VecDeque<Instant>,
    /// When finished jobs were last moved to the accounting store (and old records pruned).
    archived_at: Option<Instant>,
    /// Launch calls under way, by node (at most `pacing::LAUNCH_CALLS_PER_NODE_MAX` each).
    launch_calls: HashMap<NodeId, Arc<tokio::sync::Semaphore>>,
    /// How the last pass was paced, to say when pacing starts and ends.
    paced: Option<crate::pacing::Paced>,
}

impl Default for LeaderMemory {
    fn default() -> Self {
        LeaderMemory {
            term: None,
            epoch: Instant::now(),
            last_seen: HashMap::new(),
            launches_sent: control::leader::Resend::new(RESEND_AFTER_MS),
            kills_sent: control::leader::Resend::new(RESEND_AFTER_MS),
            layouts_sent: HashMap::new(),
            held_down: 0,
            declared_down: std::collections::VecDeque::new(),
            archived_at: None,
            launch_calls: HashMap::new(),
            paced: None,
        }
    }
}

impl LeaderMemory {
    /// Milliseconds on this memory's clock (monotonic).
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

pub struct Node {
    pub config: NodeConfig,
    pub id: NodeId,
    pub raft: Raft,
    /// Group commit of this node's proposals while it leads (`consensus::proposer`).
    proposer: consensus::Proposer,
    pub state: StateHandle,
    pub client: Arc<Client>,
    pub agent: Arc<Agent>,
    /// Towards the leader, starting with this node itself.
    pub agent_link: Arc<LeaderLink>,
    /// Towards the leader through other members (used when this node cannot answer).
    pub forward_link: Arc<LeaderLink>,
    /// Where this node's heartbeats go: its relays first (`liveness::relay_order`).
    pub heartbeat_link: Arc<LeaderLink>,
    /// The heartbeats this node passes on to the leader while it is not the leader.
    relay: liveness::Relay,
    memory: Mutex<LeaderMemory>,
    /// The leader a forward last failed to reach, and when (see `forward`).
    unreachable_leader: Mutex<Option<(NodeId, Instant)>>,
    membership_busy: AtomicBool,
    kick: Notify,
    pub inventory: Inventory,
    probe: Arc<dyn crate::gpu::GpuProbe>,
    /// Scheduling passes this node held back while leading (`pacing`).
    pub paced: crate::pacing::PacedCounts,
}

impl Node {
    fn status(&self) -> consensus::RaftStatus {
        consensus::raft_status(&self.raft)
    }

    pub fn is_leader(&self) -> bool {
        consensus::is_leader(&self.raft)
    }

    /// Whether this node holds the replicated state (voter or learner).
    fn is_member(&self) -> bool {
        consensus::is_member(&self.raft)
    }

    fn leader(&self) -> (Option<NodeId>, Option<String>) {
        let s = self.status();
        let addr = s.leader.and_then(|l| s.voters.iter().chain(s.learners.iter()).find(|(id, _)| *id == l).map(|(_, n)| n.addr.clone()));
        (s.leader, addr)
    }

    fn voter_ids(&self) -> BTreeSet<NodeId> {
        self.status().voters.iter().map(|(id, _)| *id).collect()
    }

    /// How long ago the leader last heard each node's heartbeat (empty on other nodes).
    pub fn heartbeat_ages_ms(&self) -> BTreeMap<NodeId, u64> {
        let mem = lock(&self.memory);
        if mem.term.is_none() {
            return BTreeMap::new();
        }
        mem.last_seen.iter().map(|(id, t)| (*id, t.elapsed().as_millis() as u64)).collect()
    }

    /// Commits `cmd` through Raft and returns what applying it answered.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, ApiError> {
        self.proposer.propose(cmd).await.map(|(_, result)| result).map_err(ApiError::from)
    }

    async fn handle(self: Arc<Self>, envelope: Envelope) -> Response {
        let Envelope { hops, request, user } = envelope;
        match request {
            Request::Raft { kind, payload } => consensus::handle_raft_rpc(&self.raft, self.state.snapshot_inbox(), kind, &payload)
                .await
                .map(|payload| Reply::Raft { payload }),
            Request::Launch { job, nodes, issued_index } => self.launch_if_current(*job, nodes, issued_index).await,
            Request::Kill { job, run, checkpoint } => self.agent.kill(job, run, checkpoint),
            Request::ApplyMigLayout { gpu, profiles } => self.apply_mig_layout(gpu, profiles),
            Request::SignalPart { job, run, signal, batch_only } => self.agent.signal(job, run, signal, batch_only),
            Request::Logs { job, stream, offset, max_bytes } => self.logs(hops, job, stream, offset, max_bytes, user).await,
            Request::Enroll { secret, name, csr_pem } => self.enroll(&secret, &name, &csr_pem),
            Request::StepLaunch { job, spec } => self.launch_step(job, spec, user).await,
            Request::StepStart { job, run, step, spec } => self.agent.start_step(job, run, step, &spec, user.as_deref()).await,
            Request::StepRead { job, step, node, offset, exits_seen, wait_ms } => {
                if node == self.config.name {
                    return self.agent.read_step(job, step, offset, exits_seen, wait_ms, user.as_deref()).await;
                }
                let wait = Duration::from_millis(u64::from(wait_ms.min(proto::limits::STEP_READ_WAIT_MS_MAX)));
                let request = Request::StepRead { job, step, node: node.clone(), offset, exits_seen, wait_ms };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT + wait).await
            }
            Request::StepSignal { job, step, node, signal } => {
                if node == self.config.name {
                    return self.agent.signal_step(job, step, signal, user.as_deref());
                }
                let request = Request::StepSignal { job, step, node: node.clone(), signal };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            Request::ListJoinTokens => {
                self.require_admin(user.as_deref(), "list join tokens")?;
                Ok(Reply::JoinTokens(self.state.read(|s| s.join_tokens.values().cloned().collect())))
            }
            Request::Heartbeat { node, instance, running: _ } if !self.is_leader() => {
                self.relay.relay(proto::Beat { node, instance }).await
            }
            request if request.needs_leader() => {
                if self.is_leader() {
                    self.handle_on_leader(request, user).await
                } else {
                    self.forward(hops, request, user).await
                }
            }
            request => {
                if !self.is_member() {
                    return self.forward(hops, request, user).await;
                }
                // A node that knows no leader may be cut off or removed and hold a stale state:
                // let the client ask another node. Cluster info stays local, for diagnosis.
                if self.leader().0.is_none()
                    && !matches!(request, Request::ClusterInfo | Request::Members | Request::GetPolicy | Request::AccountingDigest)
                {
                    return Err(ApiError::NoLeader);
                }
                match self.read(request.clone()) {
                    // A follower may not have applied a job its client just submitted through the
                    // leader: ask the leader rather than deny the job exists.
                    Err(ApiError::NotFound(_)) if !self.is_leader() && matches!(request, Request::GetJob { .. }) => {
                        self.forward(hops, request, user).await
                    }
                    other => other,
                }
            }
        }
    }

    /// Starts a step of `job`, whose batch script runs here, on the nodes it names: numbers it,
    /// has every node start its tasks, and stops them all again if one node cannot.
    async fn launch_step(self: &Arc<Self>, job: JobId, spec: proto::StepSpec, user: Option<String>) -> Response {
        spec.validate().map_err(ApiError::Invalid)?;
        let numbered = self.agent.number_step(job, user.as_deref())?;
        let (run, step) = (numbered.run, numbered.step);
        let mut targets = Vec::new();
        for n in &spec.nodes {
            let Some((_, addr)) = numbered.nodes.iter().find(|(name, _)| *name == n.name) else {
                return Err(ApiError::Invalid(format!("node {} is not in the allocation of job {job}", n.name)));
            };
            targets.push((n.name.clone(), addr.clone()));
        }
        let mut spec = spec;
        self.add_step_rendezvous(&mut spec, job, step, &targets, numbered.master_port);
        let spec = Arc::new(spec);
        // A node whose part is still starting (its preflight) answers "unavailable": ask again
        // for a while.
        let deadline = std::time::Instant::now() + Duration::from_millis(STEP_START_PATIENCE_MS);
        let mut pending = targets;
        let mut started = Vec::new();
        let mut failed = Vec::new();
        while !pending.is_empty() {
            let mut starts = Vec::new();
            for (name, addr) in std::mem::take(&mut pending) {
                let node = Arc::clone(self);
                let spec = Arc::clone(&spec);
                let user = user.clone();
                starts.push(tokio::spawn(async move {
                    let result = if name == node.config.name {
                        node.agent.start_step(job, run, step, &spec, user.as_deref()).await
                    } else {
                        let request = Request::StepStart { job, run, step, spec: (*spec).clone() };
                        let env = Envelope { hops: 0, request, user };
                        node.client
                            .call(&addr, &env, PEER_CALL_TIMEOUT)
                            .await
                            .unwrap_or_else(|e| Err(ApiError::Unavailable(format!("reach {addr}: {e}"))))
                    };
                    (name, addr, result)
                }));
            }
            let retry = std::time::Instant::now() < deadline;
            for s in starts {
                match s.await {
                    Ok((name, _, Ok(_))) => started.push(name),
                    Ok((name, addr, Err(ApiError::Unavailable(_)))) if retry => pending.push((name, addr)),
                    Ok((name, _, Err(e))) => failed.push(format!("{name}: {e}")),
                    Err(e) => failed.push(format!("a start panicked: {e}")),
                }
            }
            if !failed.is_empty() {
                break;
            }
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(STEP_START_RETRY_MS)).await;
            }
        }
        if failed.is_empty() {
            info!(job, run, step, nodes = started.len(), "step launched");
            return Ok(Reply::StepLaunched { step, run });
        }
        warn!(job, run, step, failed = %failed.join("; "), "step not started everywhere: stopping it");
        for name in started {
            let request = Request::StepSignal { job, step, node: name.clone(), signal: libc::SIGKILL };
            if let Err(e) = Box::pin(Arc::clone(self).handle(Envelope { hops: 0, request, user: user.clone() })).await {
                warn!(job, step, node = %name, error = %e, "stop a step that did not start everywhere");
            }
        }
        Err(ApiError::Unavailable(format!("step {job}.{step} could not start on {}", failed.join("; "))))
    }

    /// Gives a step what torchrun's static rendezvous needs (`PET_MASTER_ADDR`,
    /// `PET_MASTER_PORT`, `PET_NNODES`; each node adds its `PET_NODE_RANK`), unless the caller's
    /// environment names them itself: the step's first node, and a port free there. On this
    /// node a port is free when it can be bound now (the first from the step's place in
    /// [`proto::STEP_PORT_FIRST`]'s range, so concurrent steps start apart); another node's free
    /// port is not known here, so a step whose first node is elsewhere gets the job's
    /// `MASTER_PORT`, reserved for the job on the job's first node.
    fn add_step_rendezvous(&self, spec: &mut proto::StepSpec, job: JobId, step: u32, targets: &[(String, String)], job_port: Option<u16>) {
        let Some((first, addr)) = targets.first() else { return };
        let port = if *first == self.config.name {
            let start = (job.wrapping_mul(31).wrapping_add(u64::from(step)) % u64::from(proto::STEP_PORT_COUNT)) as u16;
            let free = (0..proto::STEP_PORT_COUNT)
                .map(|i| proto::STEP_PORT_FIRST + (start + i) % proto::STEP_PORT_COUNT)
                .find(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok());
            if free.is_none() {
                warn!(job, step, "no free port for a step's rendezvous: the job's MASTER_PORT it is");
            }
            free.or(job_port)
        } else {
            job_port
        };
        let Some(port) = port else { return };
        for (k, v) in slurm_compat::env::torchrun_env(&crate::launcher::host_of(addr), port, targets.len()) {
            spec.env.entry(k).or_insert(v);
        }
    }

    /// Sends a step request to node `name` of `job`'s run, whose address this node knows
    /// because the run runs here too.
    async fn to_run_node(&self, hops: u8, job: JobId, name: &str, request: Request, user: Option<String>, timeout: Duration) -> Response {
        if hops >= FORWARD_HOPS_MAX {
            return Err(ApiError::Unavailable(format!("gave up after {hops} forwards")));
        }
        let addr = self
            .agent
            .run_node_addr(job, name)
            .ok_or_else(|| ApiError::NotFound(format!("node {name} in job {job}'s run on this node")))?;
        let env = Envelope { hops: hops + 1, request, user };
        self.client.call(&addr, &env, timeout).await.unwrap_or_else(|e| Err(ApiError::Unavailable(format!("reach {name} at {addr}: {e}"))))
    }

    /// Sends a request this node cannot answer to the leader.
    async fn forward(&self, hops: u8, request: Request, user: Option<String>) -> Response {
        if hops >= FORWARD_HOPS_MAX {
            return Err(ApiError::Unavailable(format!("gave up after {hops} forwards")));
        }
        let (leader, leader_addr) = self.leader();
        match (leader, leader_addr) {
            (Some(l), Some(addr)) if l != self.id => {
                // A leader this node just failed to reach is most likely dead: until an election
                // names another (or a while has passed), say so at once instead of waiting for
                // a handshake each time, so the client's retry finds the new leader promptly.
                if lock(&self.unreachable_leader).is_some_and(|(dead, at)| dead == l && at.elapsed() < UNREACHABLE_LEADER_HOLD) {
                    return Err(ApiError::NoLeader);
                }
                let env = Envelope { hops: hops + 1, request, user };
                let call = self.client.call_connecting_within(&addr, &env, PEER_CALL_TIMEOUT, FORWARD_CONNECT_TIMEOUT);
                // A leader that died with this request in flight never answers; QUIC notices the
                // connection is gone only after its loss timers. An election names the next
                // leader sooner: stop waiting then, and let the client ask again (as after any
                // lost reply, the request may or may not have been applied).
                let outcome = tokio::select! {
                    outcome = call => outcome,
                    () = consensus::leader_changed_from(&self.raft, l) => {
                        return Err(ApiError::Unavailable(format!("leader {l} was replaced while a forwarded request waited")));
                    }
                };
                match outcome {
                    Ok(resp) => resp,
                    Err(e) => {
                        if matches!(e, transport::CallError::Connect(_)) {
                            *lock(&self.unreachable_leader) = Some((l, Instant::now()));
                        }
                        Err(ApiError::Unavailable(format!("forward to leader {addr}: {e}")))
                    }
                }
            }
            _ if self.is_member() => Err(ApiError::NoLeader),
            _ => match self.forward_link.call_as(request, hops + 1, user).await {
                Ok(reply) => Ok(reply),
                Err(LinkError::Api(e)) => Err(e),
                Err(LinkError::Unreachable(e)) => Err(ApiError::Unavailable(e)),
            },
        }
    }

    fn read(&self, request: Request) -> Response {
        match request {
            Request::GetJob { job } => {
                let found = self.state.job(job).map_err(|e| ApiError::Internal(format!("read job {job}: {e}")))?;
                let mut jobs: Vec<Job> = found.into_iter().collect();
                self.explain_pending(&mut jobs);
                jobs.pop().map(|j| Reply::Job(Box::new(j))).ok_or_else(|| ApiError::NotFound(format!("job {job}")))
            }
            Request::ListJobs { include_finished } => {
                // The hot state only (live jobs and those finished in the last `min_job_age_s`);
                // history is paged through `QueryJobs`.
                let mut jobs: Vec<Job> =
                    self.state.read(|s| s.jobs.values().filter(|j| include_finished || !j.state.is_final()).cloned().collect());
                self.explain_pending(&mut jobs);
                Ok(Reply::Jobs(jobs))
            }
            Request::AccountingDigest => {
                let applied_index = self.state.applied_index();
                let hot_jobs = self.state.read(|s| s.jobs.len() as u64);
                let (records, digest) =
                    self.state.accounting_digest().map_err(|e| ApiError::Internal(format!("read the accounting store: {e}")))?;
                let disk_bytes =
                    self.state.accounting_disk_bytes().map_err(|e| ApiError::Internal(format!("read the accounting store: {e}")))?;
                Ok(Reply::AccountingDigest { node: self.config.name.clone(), applied_index, hot_jobs, records, digest, disk_bytes })
            }
            Request::QueryJobs { query } => {
                let (mut jobs, next) = self.state.query_jobs(&query).map_err(|e| ApiError::Internal(format!("query jobs: {e}")))?;
                self.explain_pending(&mut jobs);
                Ok(Reply::JobPage { jobs, next })
            }
            Request::ListNodes => Ok(Reply::Nodes(self.node_infos())),
            Request::ClusterInfo => Ok(Reply::Cluster(self.cluster_info(true))),
            Request::Members => Ok(Reply::Cluster(self.cluster_info(false))),
            Request::GetPolicy => Ok(Reply::Policy(self.state.read(|s| s.policy.clone()))),
            Request::TestSubmit { spec } => self.test_submit(spec),
            other => Err(ApiError::Invalid(format!("not a read request: {other:?}"))),
        }
    }

    /// `sbatch --test-only`: submits `spec` to a copy of the state and asks the scheduler what it
    /// would do with it now; the log is not touched.
    fn test_submit(&self, mut spec: proto::JobSpec) -> Response {
        spec.fill_default_mem();
        spec.validate().map_err(ApiError::Invalid)?;
        let now = now_ms();
        self.state.read(|s| {
            let mut trial = s.clone();
            let job = match trial.apply(&Command::Submit { spec, now_ms: now }) {
                CommandResult::Submitted { job } => job,
                other => return Err(rejected(other)),
            };
            let plan = scheduler::schedule(&trial.scheduler_view(), now);
            let name = |id: &NodeId| trial.nodes.get(id).map_or_else(|| format!("node{id}"), |n| n.name.clone());
            if let Some(p) = plan.placements.iter().find(|p| p.job == job) {
                let nodes = p.allocs.iter().map(|a| name(&a.node)).collect();
                let cpus = p.allocs.iter().map(|a| a.cpus).sum();
                return Ok(Reply::TestSubmitted { job, start_ms: Some(now), nodes, cpus, reasons: Vec::new() });
            }
            let reasons = plan.pending.get(&job).cloned().unwrap_or_default();
            match plan.reservation.filter(|r| r.job == job) {
                Some(r) => {
                    let nodes = r.nodes.iter().map(name).collect();
                    let cpus = trial.jobs.get(&job).map_or(0, |j| j.spec.cpus_per_task * j.spec.ntasks_per_node * j.spec.nodes);
                    Ok(Reply::TestSubmitted { job, start_ms: Some(r.start_ms), nodes, cpus, reasons })
                }
                None => Ok(Reply::TestSubmitted { job, start_ms: None, nodes: Vec::new(), cpus: 0, reasons }),
            }
        })
    }

    /// Applies a MIG layout on this node, starting from its inventory as the log has it.
    fn apply_mig_layout(&self, gpu: u32, profiles: Vec<String>) -> Response {
        let base = self.state.read(|s| s.nodes.get(&self.id).map(|n| n.inventory.clone())).unwrap_or_else(|| self.inventory.clone());
        self.agent.apply_mig_layout(Arc::clone(&self.probe), base, gpu, profiles, Arc::clone(&self.agent_link))
    }

    /// Fills in why each pending job does not start now: the pure scheduler run on this node's
    /// committed state gives the same answer the leader's pass would.
    fn explain_pending(&self, jobs: &mut [Job]) {
        if !jobs.iter().any(|j| j.state == JobState::Pending) {
            return;
        }
        let view = self.scheduler_view();
        let plan = scheduler::schedule(&view, now_ms());
        for job in jobs.iter_mut().filter(|j| j.state == JobState::Pending) {
            if let Some(why) = plan.pending.get(&job.id) {
                job.reasons.extend(why.iter().cloned());
            } else if !job.parts.is_empty() {
                job.reasons.push(format!("waiting for run {} to stop", job.run));
            } else if plan.placements.iter().any(|p| p.job == job.id) {
                job.reasons.push("starting".into());
            }
        }
    }

    fn role_of(&self, id: NodeId, leader: Option<NodeId>, voters: &BTreeSet<NodeId>) -> NodeRole {
        if leader == Some(id) {
            NodeRole::Leader
        } else if voters.contains(&id) {
            NodeRole::Voter
        } else {
            NodeRole::Agent
        }
    }

    pub fn node_infos(&self) -> Vec<NodeInfo> {
        let (leader, _) = self.leader();
        let voters = self.voter_ids();
        self.state.read(|s| {
            let held = s.cpus_and_memory_held();
            s.nodes
                .values()
                .map(|n| {
                    let (cpus_alloc, memory_alloc_mib) = held.get(&n.id).copied().unwrap_or_default();
                    let mut types: Vec<String> = n.inventory.gpus.iter().map(|g| g.gres_type.clone()).collect();
                    types.dedup();
                    NodeInfo {
                        unhealthy_gpus: n
                            .inventory
                            .gpus
                            .iter()
                            .filter(|g| !g.healthy)
                            .map(|g| (g.index, g.health_reason.clone().unwrap_or_default()))
                            .collect(),
                        id: n.id,
                        name: n.name.clone(),
                        addr: n.addr.clone(),
                        state: n.state,
                        role: self.role_of(n.id, leader, &voters),
                        gpus_total: n.inventory.gpus.len() as u32,
                        gpus_free: s.gpus_free(n.id),
                        gpu_types: types,
                        cpus_total: n.inventory.cpus,
                        cpus_alloc,
                        memory_mib: n.inventory.memory_mib,
                        memory_alloc_mib,
                        reason: n.state_reason.clone(),
                        cert_fingerprint: n.cert_fingerprint.clone(),
                        partitions: n.inventory.partitions.clone(),
                    }
                })
                .collect()
        })
    }

    /// Members, roles and Raft indexes; with `digest`, the applied state's digest too (which
    /// encodes the whole hot state: for checks and diagnosis, not for routine polling).
    pub fn cluster_info(&self, digest: bool) -> ClusterInfo {
        let st = self.status();
        let voters: BTreeSet<NodeId> = st.voters.iter().map(|(id, _)| *id).collect();
        let (leader_name, members) = self.state.read(|s| {
            let leader_name = st.leader.and_then(|l| s.nodes.get(&l).map(|n| n.name.clone()));
            // Without the digest (`Members`, which every node asks), the voters and learners
            // only: listing every node for every node was quadratic in the fleet.
            let listed: Box<dyn Iterator<Item = &proto::NodeRecord>> = if digest {
                Box::new(s.nodes.values())
            } else {
                Box::new(st.voters.iter().chain(st.learners.iter()).filter_map(|(id, _)| s.nodes.get(id)))
            };
            let mut members: Vec<ClusterMember> = listed
                .map(|n| ClusterMember {
                    id: n.id,
                    name: n.name.clone(),
                    role: self.role_of(n.id, st.leader, &voters),
                    addr: n.addr.clone(),
                })
                .collect();
            // Voters not (yet) registered as nodes still show up.
            for (id, node) in st.voters.iter().chain(st.learners.iter()) {
                if !s.nodes.contains_key(id) {
                    members.push(ClusterMember {
                        id: *id,
                        name: node.name.clone(),
                        role: self.role_of(*id, st.leader, &voters),
                        addr: node.addr.clone(),
                    });
                }
            }
            (leader_name, members)
        });
        ClusterInfo {
            leader: leader_name,
            leader_id: st.leader,
            term: st.term,
            commit_index: st.commit_index.unwrap_or(0),
            applied_index: st.applied_index.unwrap_or(0),
            snapshot_index: st.snapshot_index,
            purged_index: st.purged_index,
            answered_by: self.config.name.clone(),
            state_digest: if digest { self.state.read(|s| s.digest()) } else { String::new() },
            members,
        }
    }

    async fn logs(&self, hops: u8, job: JobId, stream: LogStream, offset: u64, max_bytes: u32, user: Option<String>) -> Response {
        if self.is_member() {
            // The first node of the job (rank 0) holds the batch script's output; a finished job
            // that left the hot state is read from the accounting store.
            let first = self
                .state
                .job(job)
                .map_err(|e| ApiError::Internal(format!("read job {job}: {e}")))?
                .and_then(|j| j.last_nodes.first().copied());
            let Some((node, node_addr)) = first.map(|node| (node, self.state.read(|s| s.nodes.get(&node).map(|n| n.addr.clone())))) else {
                return Err(ApiError::NotFound(format!("job {job} has not run yet")));
            };
            if node == self.id {
                return self.agent.read_log(job, stream, offset, max_bytes);
            }
            if hops >= FORWARD_HOPS_MAX {
                return Err(ApiError::Unavailable("too many forwards".into()));
            }
            let addr = node_addr.ok_or_else(|| ApiError::NotFound(format!("node {node}")))?;
            let env = Envelope { hops: hops + 1, request: Request::Logs { job, stream, offset, max_bytes }, user };
            return self
                .client
                .call(&addr, &env, PEER_CALL_TIMEOUT)
                .await
                .map_err(|e| ApiError::Unavailable(format!("read output from {addr}: {e}")))?;
        }
        match self.agent.read_log(job, stream, offset, max_bytes) {
            Err(ApiError::NotFound(_)) => self.forward(hops, Request::Logs { job, stream, offset, max_bytes }, user).await,
            other => other,
        }
    }

    /// Whether `user` may act on jobs of other users and on the cluster: an admin, or the node
    /// itself (no user).
    fn is_admin(&self, user: Option<&str>) -> bool {
        user.is_none_or(|u| self.config.admins.iter().any(|a| a == u))
    }

    fn require_admin(&self, user: Option<&str>, what: &str) -> Result<(), ApiError> {
        if self.is_admin(user) {
            return Ok(());
        }
        let who = user.unwrap_or_default();
        warn!(user = %who, action = what, "denied: not an admin");
        Err(ApiError::Denied(format!("user {who} may not {what}: only admins may")))
    }

    /// Users act on their own jobs only; admins on any.
    fn require_owner(&self, user: Option<&str>, job: JobId, what: &str) -> Result<(), ApiError> {
        if self.is_admin(user) {
            return Ok(());
        }
        let who = user.unwrap_or_default();
        let owner = self.state.read(|s| s.jobs.get(&job).map(|j| j.spec.user.clone()));
        match owner {
            None => Err(ApiError::NotFound(format!("job {job}"))),
            Some(owner) if owner == who => Ok(()),
            Some(owner) => {
                warn!(user = %who, job, owner = %owner, action = what, "denied: not the job's owner");
                Err(ApiError::Denied(format!("user {who} may not {what} job {job} of user {owner}")))
            }
        }
    }

    /// Starts a run a leader sent, unless it is stale: a launch composed before the cluster gave
    /// the run up (a `NodeDown`, a requeue) may arrive after it, at a new instance of this node or
    /// once a paused one runs again. First this node's replica applies the log up to what the
    /// launch was read from and what its last acknowledgement named (everything decided before
    /// this node was known alive again); then the run must still be the job's current run with an
    /// unconfirmed part here, or one this instance confirmed.
    async fn launch_if_current(&self, job: proto::Job, nodes: Vec<(String, String)>, issued_index: u64) -> Response {
        let (me, instance) = (self.id, self.agent.instance);
        let is_current = |j: &proto::Job| control::agent::run_is_current_here(j, job.run, me, instance);
        let current = if self.is_member() {
            let wanted = issued_index.max(self.agent.ack_commit_index());
            if !self.state.wait_applied(wanted, Duration::from_millis(LAUNCH_APPLY_WAIT_MS)).await {
                return Err(ApiError::Unavailable(format!(
                    "this node has applied {} of the log, the launch needs {wanted}: not starting yet",
                    self.state.applied_index()
                )));
            }
            self.state.read(|s| s.jobs.get(&job.id).is_some_and(is_current))
        } else {
            // No replica here: ask the leader, whose state holds everything decided so far.
            match self.forward_link.call(Request::GetJob { job: job.id }, 0).await {
                Ok(Reply::Job(j)) => is_current(&j),
                Ok(other) => return Err(ApiError::Internal(format!("unexpected reply {other:?}"))),
                Err(crate::link::LinkError::Api(ApiError::NotFound(_))) => false,
                Err(e) => return Err(ApiError::Unavailable(format!("check the launch with the leader: {e}"))),
            }
        };
        if !current {
            info!(job = job.id, run = job.run, "refused a stale launch: the run is no longer current here");
            return Err(ApiError::Denied(format!("job {} run {} is no longer current on this node", job.id, job.run)));
        }
        self.launch_here(job, nodes).await
    }

    /// Starts this node's part of `job` off the async workers: a launch syncs the ledger and
    /// creates the run's directory and cgroups, and a burst of them (a plan places a whole
    /// node's worth at once) must not hold up Raft's heartbeats on the same workers.
    async fn launch_here(&self, job: Job, nodes: Vec<(String, String)>) -> Response {
        let agent = Arc::clone(&self.agent);
        tokio::task::spawn_blocking(move || agent.launch(job, &nodes))
            .await
            .unwrap_or_else(|e| Err(ApiError::Internal(format!("launch task failed: {e}"))))
    }

    /// Signs a node certificate for `name` from `csr_pem` with the cluster CA: (CA certificate,
    /// new certificate). Only a node configured with the CA key (`ca_key`) can.
    fn sign_with_ca(&self, name: &str, csr_pem: &str) -> Result<(String, String), ApiError> {
        let Some(ca_key) = &self.config.ca_key else {
            return Err(ApiError::Unavailable(format!(
                "node {} does not hold the cluster CA key: ask the node where `corral cluster init` ran",
                self.config.name
            )));
        };
        if csr_pem.len() > CSR_BYTES_MAX {
            return Err(ApiError::Invalid(format!("certificate request longer than {CSR_BYTES_MAX} bytes")));
        }
        let ca_cert_pem = std::fs::read_to_string(&self.config.tls.ca_cert)
            .map_err(|e| ApiError::Internal(format!("read {}: {e}", self.config.tls.ca_cert.display())))?;
        let ca_key_pem = std::fs::read_to_string(ca_key).map_err(|e| ApiError::Internal(format!("read {}: {e}", ca_key.display())))?;
        let ca = transport::pki::PemPair { cert_pem: ca_cert_pem.clone(), key_pem: ca_key_pem };
        let cert_pem = transport::pki::sign_node_csr(&ca, csr_pem, name).map_err(|e| ApiError::Invalid(format!("{e:#}")))?;
        Ok((ca_cert_pem, cert_pem))
    }

    /// Signs the certificate of a machine that presents a live join token from the log, for a
    /// name no member has.
    fn enroll(&self, secret: &str, name: &str, csr_pem: &str) -> Response {
        let hash = sha256_hex(secret.as_bytes());
        let known = self.state.read(|s| s.live_join_token(&hash, now_ms()).map(|t| t.id));
        let Some(token) = known else {
            warn!(node = %name, "enrolment refused: unknown, expired or revoked join token");
            return Err(ApiError::Denied("the join token is unknown, expired or revoked".into()));
        };
        crate::config::validate_node_name(name).map_err(|e| ApiError::Invalid(format!("{e:#}")))?;
        if self.state.read(|s| s.nodes.values().any(|n| n.name == name)) {
            warn!(node = %name, token, "enrolment refused: the name is taken");
            return Err(ApiError::Denied(format!("a node named {name} is already a member: pick another name")));
        }
        let (ca_cert_pem, cert_pem) = self.sign_with_ca(name, csr_pem)?;
        let servers = self.state.read(|s| s.nodes.values().map(|n| n.addr.clone()).collect());
        info!(node = %name, token, "enrolled a node: certificate signed");
        Ok(Reply::Enrolled { ca_cert_pem, cert_pem, join_secret: self.config.join_token.clone(), servers })
    }

    /// Signs a new certificate for node `name` (the name its current certificate proves) from
    /// its request: rotation before expiry.
    fn sign_renewal(&self, name: &str, csr_pem: &str) -> Response {
        let (ca_cert_pem, cert_pem) = self.sign_with_ca(name, csr_pem)?;
        info!(node = %name, "renewed a node certificate");
        Ok(Reply::Enrolled { ca_cert_pem, cert_pem, join_secret: String::new(), servers: Vec::new() })
    }

    async fn handle_on_leader(&self, request: Request, user: Option<String>) -> Response {
        let now = now_ms();
        let who = user.as_deref();
        match &request {
            Request::Cancel { job } => self.require_owner(who, *job, "cancel")?,
            Request::Requeue { job } => self.require_owner(who, *job, "requeue")?,
            Request::UpdateJob { job, .. } => self.require_owner(who, *job, "update")?,
            Request::Signal { job, .. } => self.require_owner(who, *job, "signal")?,
            Request::Drain { .. } => self.require_admin(who, "drain nodes")?,
            Request::Resume { .. } => self.require_admin(who, "resume nodes")?,
            Request::SetPolicy { .. } => self.require_admin(who, "change the scheduling policy")?,
            Request::SetGpuHealth { .. } => self.require_admin(who, "change GPU health")?,
            Request::CreateJoinToken { .. } => self.require_admin(who, "create join tokens")?,
            Request::RevokeJoinToken { .. } => self.require_admin(who, "revoke join tokens")?,
            Request::RevokeCert { .. } => self.require_admin(who, "revoke certificates")?,
            _ => {}
        }
        match request {
            Request::Submit { mut spec } => {
                // The certificate says who submits, not the client's environment.
                if let Some(u) = &user {
                    spec.user = u.clone();
                }
                spec.fill_default_mem();
                spec.validate().map_err(ApiError::Invalid)?;
                if let Some(why) = self.state.read(|s| s.undefined_in_submission(&spec)) {
                    return Err(ApiError::Invalid(why));
                }
                match self.propose(Command::Submit { spec, now_ms: now }).await? {
                    CommandResult::Submitted { job } => {
                        self.kick.notify_one();
                        Ok(Reply::Submitted { job })
                    }
                    other => Err(rejected(other)),
                }
            }
            Request::Cancel { job } => match self.propose(Command::Cancel { job, now_ms: now }).await? {
                CommandResult::Ok => {
                    self.kick.notify_one();
                    Ok(Reply::Ok)
                }
                other => Err(rejected(other)),
            },
            Request::Drain { node, reason } => {
                let id = self.node_id_by_name(&node)?;
                self.propose(Command::Drain { node: id, reason, now_ms: now }).await.and_then(ok_or_rejected)
            }
            Request::Resume { node } => {
                let id = self.node_id_by_name(&node)?;
                self.propose(Command::Resume { node: id, now_ms: now }).await.and_then(ok_or_rejected)
            }
            Request::CreateJoinToken { ttl_ms } => {
                if ttl_ms == 0 || ttl_ms > JOIN_TOKEN_TTL_MS_MAX {
                    return Err(ApiError::Invalid(format!("a join token lives 1..={JOIN_TOKEN_TTL_MS_MAX} ms")));
                }
                let secret = hex::encode(rand::random::<[u8; 32]>());
                let secret_sha256 = sha256_hex(secret.as_bytes());
                let expires_ms = now.saturating_add(ttl_ms);
                let created_by = user.clone().unwrap_or_else(|| "root".into());
                let cmd =
                    Command::AddJoinToken { secret_sha256: secret_sha256.clone(), expires_ms, created_by: created_by.clone(), now_ms: now };
                ok_or_rejected(self.propose(cmd).await?)?;
                let id = self.state.read(|s| s.join_tokens.values().find(|t| t.secret_sha256 == secret_sha256).map(|t| t.id)).unwrap_or(0);
                info!(id, by = %created_by, expires_ms, "join token created");
                Ok(Reply::JoinTokenCreated { id, secret, expires_ms })
            }
            Request::RevokeJoinToken { id } => {
                ok_or_rejected(self.propose(Command::RevokeJoinToken { id, now_ms: now }).await?)?;
                info!(id, by = %who.unwrap_or("root"), "join token revoked");
                Ok(Reply::Ok)
            }
            Request::RevokeCert { node, fingerprint } => {
                let (fingerprint, node, reason) = match (node, fingerprint) {
                    (Some(name), None) => {
                        // The certificate it joined with, and every one of its name after it.
                        let fp = self.state.read(|s| s.nodes.values().find(|n| n.name == name).map(|n| n.cert_fingerprint.clone()));
                        let Some(fp) = fp else { return Err(ApiError::NotFound(format!("node {name}"))) };
                        let reason = format!("node {name} removed by {}", who.unwrap_or("root"));
                        (fp, Some(name), reason)
                    }
                    (None, Some(fp)) if fp.len() == 64 && fp.bytes().all(|b| b.is_ascii_hexdigit()) => {
                        (fp.to_ascii_lowercase(), None, format!("revoked by {}", who.unwrap_or("root")))
                    }
                    _ => return Err(ApiError::Invalid("name a node or a 64-digit certificate fingerprint".into())),
                };
                let cmd = Command::RevokeCert { fingerprint: fingerprint.clone(), node: node.clone(), reason: reason.clone(), now_ms: now };
                ok_or_rejected(self.propose(cmd).await?)?;
                warn!(fingerprint = %fingerprint, node = ?node, reason = %reason, "certificate revoked");
                Ok(Reply::Ok)
            }
            Request::Join { token, name, addr, inventory, instance, cert_fingerprint } => {
                if !constant_time_eq(token.as_bytes(), self.config.join_token.as_bytes()) {
                    warn!(node = %name, "join refused: bad token");
                    return Err(ApiError::Denied("bad join token".into()));
                }
                let cmd = Command::RegisterNode { name: name.clone(), addr, inventory, instance, cert_fingerprint, now_ms: now };
                match self.propose(cmd).await? {
                    CommandResult::NodeRegistered { id } => {
                        lock(&self.memory).last_seen.insert(id, Instant::now());
                        info!(node = %name, id, "node registered");
                        self.kick.notify_one();
                        Ok(Reply::Joined { id, name })
                    }
                    other => Err(rejected(other)),
                }
            }
            Request::Heartbeat { node, instance, running: _ } => {
                let (leader, term, commit_index, refused) = self.accept_heartbeats(&[proto::Beat { node, instance }]).await?;
                match refused.into_iter().next() {
                    Some((_, e)) => Err(e),
                    None => Ok(Reply::HeartbeatAck { leader, term, commit_index }),
                }
            }
            Request::Heartbeats { relay: _, beats } => {
                if beats.len() > proto::HEARTBEATS_PER_REQUEST_MAX {
                    return Err(ApiError::Invalid(format!(
                        "{} heartbeats in one request, more than {}",
                        beats.len(),
                        proto::HEARTBEATS_PER_REQUEST_MAX
                    )));
                }
                let (leader, term, commit_index, refused) = self.accept_heartbeats(&beats).await?;
                Ok(Reply::HeartbeatAcks { leader, term, commit_index, refused })
            }
            Request::ReportRun { job, run, node, outcome, usage } => {
                match self.propose(Command::RunFinished { job, run, node, outcome, usage, now_ms: now }).await? {
                    CommandResult::Rejected(why) => debug!(job, run, why = %why, "run report ignored"),
                    _ => self.kick.notify_one(),
                }
                Ok(Reply::Ok)
            }
            Request::ReportRuns { node, reports } => {
                if reports.len() > proto::REPORTS_PER_REQUEST_MAX {
                    return Err(ApiError::Invalid(format!(
                        "{} reports in one request, more than {}",
                        reports.len(),
                        proto::REPORTS_PER_REQUEST_MAX
                    )));
                }
                // All proposed at once: the proposer puts them in as few entries as fit.
                let proposals = reports.into_iter().map(|r| {
                    let (job, run) = (r.job, r.run);
                    let cmd = Command::RunFinished { job, run, node, outcome: r.outcome, usage: r.usage, now_ms: now };
                    async move { (job, run, self.propose(cmd).await) }
                });
                for (job, run, result) in futures_util::future::join_all(proposals).await {
                    if let CommandResult::Rejected(why) = result? {
                        debug!(job, run, why = %why, "run report ignored");
                    }
                }
                self.kick.notify_one();
                Ok(Reply::Ok)
            }
            Request::ReportGpuHealth { node, gpu, mig_uuid, healthy, reason } => {
                warn!(node, gpu, healthy, reason = %reason, "gpu health reported");
                let cmd = Command::GpuHealth { node, gpu, mig_uuid, healthy, reason, now_ms: now };
                self.propose(cmd).await.and_then(ok_or_rejected)
            }
            Request::SetGpuHealth { node, gpu, healthy, reason } => {
                let id = self.node_id_by_name(&node)?;
                info!(node = %node, gpu, healthy, "operator sets gpu health");
                let cmd = Command::GpuHealth { node: id, gpu, mig_uuid: None, healthy, reason, now_ms: now };
                self.propose(cmd).await.and_then(ok_or_rejected)
            }
            Request::ReportInventory { node, inventory, reason } => {
                self.propose(Command::UpdateInventory { node, inventory, reason, now_ms: now }).await.and_then(ok_or_rejected)
            }
            Request::Requeue { job } => {
                let cmd = Command::Requeue { job, reason: proto::REQUEUED_ON_REQUEST.into(), now_ms: now };
                let result = self.propose(cmd).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            Request::SetPolicy { policy } => {
                policy.validate().map_err(ApiError::Invalid)?;
                let result = self.propose(Command::SetPolicy { policy, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            Request::UpdateJob { job, hold, time_limit_ms, partition } => {
                let cmd = Command::UpdateJob { job, hold, time_limit_ms, partition, now_ms: now };
                let result = self.propose(cmd).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            Request::Signal { job, signal, batch_only } => {
                let parts = self.state.read(|s| {
                    s.jobs.get(&job).filter(|j| j.state == JobState::Running).map(|j| {
                        j.parts
                            .iter()
                            .filter(|p| p.run == j.run)
                            .map(|p| (p.run, p.alloc.node, s.nodes.get(&p.alloc.node).map(|n| n.addr.clone()).unwrap_or_default()))
                            .collect::<Vec<_>>()
                    })
                });
                let parts = parts.ok_or_else(|| ApiError::Invalid(format!("job {job} is not running")))?;
                for (run, target, addr) in parts {
                    let result = if target == self.id {
                        self.agent.signal(job, run, signal, batch_only)
                    } else {
                        let env = Envelope { hops: 0, request: Request::SignalPart { job, run, signal, batch_only }, user: None };
                        self.client.call(&addr, &env, PEER_CALL_TIMEOUT).await.unwrap_or_else(|e| Err(ApiError::Unavailable(e.to_string())))
                    };
                    result?;
                }
                Ok(Reply::Ok)
            }
            other => Err(ApiError::Invalid(format!("not a leader request: {other:?}"))),
        }
    }

    /// Fails unless a quorum acknowledged this leader within the minimum election timeout (no
    /// other leader can have been elected since).
    /// Counts every node of `beats` alive as of now (the leader's receipt, after each node
    /// sent its beat) and brings back those it had declared down or knew as another instance:
    /// (leader, term, commit index, the beats refused with why). An acknowledgement tells a
    /// node a leader still counts it alive; a leader cut off from its quorum must not give one,
    /// or its nodes would never fence.
    async fn accept_heartbeats(&self, beats: &[proto::Beat]) -> Result<(NodeId, u64, u64, Vec<(NodeId, ApiError)>), ApiError> {
        let known: Vec<Option<(NodeState, InstanceId)>> =
            self.state.read(|s| beats.iter().map(|b| s.nodes.get(&b.node).map(|n| (n.state, n.instance))).collect());
        let mut refused = Vec::new();
        let mut back = Vec::new();
        {
            // Seen on receipt, before leadership is confirmed: a later last-seen only delays a
            // `NodeDown` (the node's lease counts from its send, earlier still), and a leader
            // slow to confirm (its quorum lease lapsed under load) must not take its own delay
            // for the nodes' silence.
            let seen_at = Instant::now();
            let mut mem = lock(&self.memory);
            for (beat, known) in beats.iter().zip(known) {
                match known {
                    None => refused.push((beat.node, ApiError::NotFound(format!("node {}", beat.node)))),
                    Some((state, recorded)) => {
                        mem.last_seen.insert(beat.node, seen_at);
                        if state == NodeState::Down || recorded != beat.instance {
                            back.push(*beat);
                        }
                    }
                }
            }
        }
        self.confirm_leadership().await?;
        // Nodes coming back are rare but may come in a crowd (a rack powered on): proposed
        // together, the group commit packs them.
        let now = now_ms();
        let ups = back.iter().map(|b| self.propose(Command::NodeUp { node: b.node, instance: b.instance, now_ms: now }));
        let results = futures_util::future::join_all(ups).await;
        for (beat, result) in back.iter().zip(results) {
            match result {
                Ok(CommandResult::Rejected(why)) => {
                    // A replaced instance (its process should be dead) gets no acknowledgement.
                    warn!(node = beat.node, instance = beat.instance, why = %why, "heartbeat of a replaced instance refused");
                    refused.push((beat.node, ApiError::Denied(why)));
                }
                Ok(_) => {
                    info!(node = beat.node, "node is back");
                    self.kick.notify_one();
                }
                Err(e) => refused.push((beat.node, e)),
            }
        }
        let status = self.status();
        Ok((self.id, status.term, status.commit_index.unwrap_or(0), refused))
    }

    /// Passes the heartbeats this node receives while it is not the leader on to the leader,
    /// a batch at a time (`liveness::Relay`).
    async fn relay_loop(self: Arc<Self>) {
        let node = Arc::clone(&self);
        self.relay.run(move |beats| Arc::clone(&node).relay_batch(beats), relay_linger(&self.config)).await;
    }

    /// Sends one batch to the leader Raft names here, again to the next one if the leader
    /// changes meanwhile (beats are idempotent), within the nodes' call timeout; a node without
    /// a replica sends it through its members.
    async fn relay_batch(self: Arc<Self>, beats: Vec<proto::Beat>) -> Response {
        // Within the time a node gives one member (half its budget for a beat): a relay that
        // cannot get through answers while the node still waits on it, so it tries its next.
        let timeout = heartbeat_call_timeout(&self.config) * 3 / 8;
        let request = Request::Heartbeats { relay: self.id, beats: beats.clone() };
        let answer = if self.is_member() {
            tokio::time::timeout(timeout, self.relay_to_leader(&request, &beats)).await
        } else {
            tokio::time::timeout(timeout, async {
                self.forward_link.call(request.clone(), 1).await.map_err(|e| match e {
                    LinkError::Api(e) => e,
                    other => ApiError::Unavailable(format!("pass heartbeats to the leader: {other}")),
                })
            })
            .await
        };
        let answer = match answer {
            // A leader of an older build does not know batches: pass each beat on by itself.
            Ok(Err(ApiError::Invalid(_))) => self.relay_one_by_one(&beats, timeout).await,
            Ok(other) => other,
            Err(_) => Err(ApiError::Unavailable(format!("the leader did not answer a heartbeat batch within {} ms", timeout.as_millis()))),
        };
        if let Err(e) = &answer {
            // Each node tries its next member; said here once per batch, not once per node.
            warn!(beats = beats.len(), error = %e, "heartbeat batch not passed on");
        }
        answer
    }

    async fn relay_to_leader(&self, request: &Request, beats: &[proto::Beat]) -> Response {
        let envelope = Envelope { hops: 1, request: request.clone(), user: None };
        loop {
            if self.is_leader() {
                let (leader, term, commit_index, refused) = self.accept_heartbeats(beats).await?;
                return Ok(Reply::HeartbeatAcks { leader, term, commit_index, refused });
            }
            let (leader, addr) = self.leader();
            let Some(addr) = addr else {
                consensus::leader_other_than(&self.raft, None).await;
                continue;
            };
            let call = self.client.call_connecting_within(&addr, &envelope, PEER_CALL_TIMEOUT, FORWARD_CONNECT_TIMEOUT);
            tokio::select! {
                answer = call => match answer {
                    Ok(response) => return response,
                    Err(e) => {
                        // The leader may be gone: wait for Raft to name another, then resend.
                        debug!(leader = %addr, error = %e, "heartbeat batch not delivered");
                        consensus::leader_other_than(&self.raft, leader).await;
                    }
                },
                () = consensus::leader_other_than(&self.raft, leader) => {}
            }
        }
    }

    async fn relay_one_by_one(&self, beats: &[proto::Beat], timeout: Duration) -> Response {
        let calls = beats.iter().map(|b| {
            let request = Request::Heartbeat { node: b.node, instance: b.instance, running: Vec::new() };
            tokio::time::timeout(timeout, self.forward_link.call(request, 1))
        });
        let mut acked = None;
        let mut refused = Vec::new();
        for (beat, result) in beats.iter().zip(futures_util::future::join_all(calls).await) {
            match result {
                Ok(Ok(Reply::HeartbeatAck { leader, term, commit_index })) => acked = Some((leader, term, commit_index)),
                Ok(Err(crate::link::LinkError::Api(e))) => refused.push((beat.node, e)),
                other => refused.push((beat.node, ApiError::Unavailable(format!("pass a heartbeat to the leader: {other:?}")))),
            }
        }
        match acked {
            Some((leader, term, commit_index)) => Ok(Reply::HeartbeatAcks { leader, term, commit_index, refused }),
            None => Err(ApiError::Unavailable("the leader acknowledged none of the heartbeats".into())),
        }
    }

    /// Whether this node may still acknowledge a heartbeat it received before this call: no
    /// other leader can have been elected since. Fast: a quorum acknowledged an append this
    /// leader sent within `election_timeout_min_ms` (no voter can have timed out on it yet).
    /// Otherwise (just elected, or a busy follower answered late) a quorum must acknowledge an
    /// append sent after the call (openraft's ReadIndex): any new leader's election came after
    /// that, so after the beat. A leader cut off from its quorum gets neither and refuses.
    async fn confirm_leadership(&self) -> Result<(), ApiError> {
        use openraft::async_runtime::watch::WatchReceiver;
        use openraft::Instant as _;
        if self.voter_ids().iter().all(|v| *v == self.id) {
            return Ok(()); // a single voter is its own quorum
        }
        let lease_ms = self.config.raft.election_timeout_min_ms;
        let since_ms = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.last_quorum_acked.as_ref().map(|at| at.elapsed().as_millis() as u64)
        };
        if since_ms.is_some_and(|ms| ms < lease_ms) {
            return Ok(());
        }
        let wait = heartbeat_call_timeout(&self.config);
        match tokio::time::timeout(wait, self.raft.ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ApiError::Unavailable(format!("not confirmed as leader by a quorum: {e}"))),
            Err(_) => Err(ApiError::Unavailable(format!(
                "leader has no quorum acknowledgement within {lease_ms} ms (last: {since_ms:?} ms ago) and none came within {} ms",
                wait.as_millis()
            ))),
        }
    }

    fn node_id_by_name(&self, name: &str) -> Result<NodeId, ApiError> {
        self.state.read(|s| s.node_by_name(name).map(|n| n.id)).ok_or_else(|| ApiError::NotFound(format!("node '{name}'")))
    }

    // -----------------------------------------------------------------------------------------
    // The leader's control loop

    pub async fn leader_loop(self: Arc<Self>) {
        let interval = Duration::from_millis(self.config.schedule_interval_ms);
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = self.kick.notified() => {}
            }
            let st = self.status();
            if !st.is_leader || st.leader != Some(self.id) {
                lock(&self.memory).term = None;
                continue;
            }
            let span = info_span!("leader", node = self.id, term = st.term);
            let started = Instant::now();
            Arc::clone(&self).leader_tick(st.term).instrument(span).await;
            // Kicks that came during the tick coalesce into the next one; pausing as long as
            // the tick took (at most TICK_PAUSE_MAX) keeps the loop under about half a core
            // when every pass is long (a deep queue under a burst of submissions), and costs
            // nothing when passes are short.
            tokio::time::sleep(started.elapsed().min(TICK_PAUSE_MAX)).await;
        }
    }

    async fn leader_tick(self: Arc<Self>, term: u64) {
        let node_ids: Vec<NodeId> = self.state.read(|s| s.nodes.keys().copied().collect());
        {
            let mut mem = lock(&self.memory);
            if mem.term != Some(term) {
                info!("leading: every node gets a fresh heartbeat grace period");
                *mem = LeaderMemory { term: Some(term), ..LeaderMemory::default() };
                let now = Instant::now();
                for id in &node_ids {
                    mem.last_seen.insert(*id, now);
                }
            }
        }
        self.check_liveness().await;
        self.archive_pass().await;
        self.schedule_pass().await;
        self.drive_launches_and_kills();
        self.manage_voters();
    }

    async fn check_liveness(&self) {
        let down_after_ms = self.config.node_down_after_ms;
        let candidates: Vec<(NodeId, String)> =
            self.state.read(|s| s.nodes.values().filter(|n| n.state != NodeState::Down).map(|n| (n.id, n.name.clone())).collect());
        let (silent_ms, recent_downs) = {
            let mut mem = lock(&self.memory);
            let silent: Vec<(NodeId, u64)> = candidates
                .iter()
                .map(|(id, _)| (*id, mem.last_seen.entry(*id).or_insert_with(Instant::now).elapsed().as_millis() as u64))
                .collect();
            let grace = Duration::from_millis(down_after_ms);
            while mem.declared_down.front().is_some_and(|at| at.elapsed() > grace) {
                mem.declared_down.pop_front();
            }
            (silent, mem.declared_down.len())
        };
        let verdict = control::leader::nodes_down(&silent_ms, down_after_ms, recent_downs);
        self.say_held(verdict.held.len());
        if verdict.down.is_empty() {
            return;
        }
        let silent: HashMap<NodeId, u64> = silent_ms.into_iter().collect();
        let names: HashMap<NodeId, String> = candidates.into_iter().collect();
        // Proposed together, the group commit packs them into a few entries.
        let now = now_ms();
        let downs = verdict.down.iter().map(|id| {
            let reason = format!("no heartbeat for {} ms", silent.get(id).copied().unwrap_or(0));
            self.propose(Command::NodeDown { node: *id, reason, now_ms: now })
        });
        let results = futures_util::future::join_all(downs).await;
        for (id, result) in verdict.down.iter().zip(results) {
            let name = names.get(id).map_or("?", String::as_str);
            let silent_ms = silent.get(id).copied().unwrap_or(0);
            match result {
                Ok(CommandResult::Rejected(why)) => warn!(node = %name, why = %why, "NodeDown refused"),
                Ok(_) => {
                    lock(&self.memory).declared_down.push_back(Instant::now());
                    warn!(node = %name, silent_ms, "node declared down: it missed its heartbeats");
                }
                Err(e) => warn!(node = %name, error = %e, "mark node down"),
            }
        }
    }

    /// Says once when a mass silence starts holding nodes back from `NodeDown`, and when it ends.
    fn say_held(&self, held: usize) {
        let before = std::mem::replace(&mut lock(&self.memory).held_down, held);
        if held > 0 && before == 0 {
            warn!(
                nodes = held,
                "too many nodes unheard at once to believe: declaring them down only after {} grace periods",
                control::leader::MASS_DOWN_GRACES
            );
        } else if held == 0 && before > 0 {
            info!(nodes = before, "the mass silence is over");
        }
    }

    /// The scheduler's input from the committed state; dependencies on jobs that left the hot
    /// state are read from the accounting store.
    fn scheduler_view(&self) -> scheduler::ClusterView {
        let archived = |id: JobId| match self.state.archived_job(id) {
            Ok(job) => job,
            Err(e) => {
                warn!(job = id, error = %e, "read a dependency from the accounting store");
                None
            }
        };
        self.state.read(|s| consensus::view::scheduler_view_with(s, archived))
    }

    /// Moves jobs finished more than `min_job_age_s` ago to the accounting store and prunes
    /// records past `accounting_retention_days`, a bounded batch of each at most once a second.
    async fn archive_pass(&self) {
        {
            let mut mem = lock(&self.memory);
            if mem.archived_at.is_some_and(|t| t.elapsed() < ARCHIVE_INTERVAL) {
                return;
            }
            mem.archived_at = Some(Instant::now());
        }
        let now = now_ms();
        let min_age_ms = self.config.min_job_age_s.saturating_mul(1000);
        let jobs = self.state.read(|s| s.archivable(now, min_age_ms, proto::ARCHIVE_BATCH_MAX));
        if !jobs.is_empty() {
            let count = jobs.len();
            match self.propose(Command::ArchiveJobs { jobs, now_ms: now }).await {
                Ok(_) => debug!(jobs = count, "moved finished jobs to the accounting store"),
                Err(e) => warn!(error = %e, "move finished jobs to the accounting store"),
            }
        }
        let retention_ms = self.config.accounting_retention_days.saturating_mul(86_400_000);
        let pruned = match self.state.accounting_ended_before(now.saturating_sub(retention_ms), proto::ARCHIVE_BATCH_MAX) {
            Ok(ids) => ids,
            Err(e) => {
                warn!(error = %e, "read the accounting store for pruning");
                return;
            }
        };
        if !pruned.is_empty() {
            let count = pruned.len();
            match self.propose(Command::PruneAccounting { jobs: pruned, now_ms: now }).await {
                Ok(_) => info!(records = count, "pruned accounting records past retention"),
                Err(e) => warn!(error = %e, "prune accounting records"),
            }
        }
    }

    async fn schedule_pass(&self) {
        // Nothing pending, nothing to place (MIG demand and preemption come from pending jobs
        // too): the view, one record per node, is not built at all. At 1,000 nodes building it
        // ten times a second was most of an idle leader's CPU.
        if !self.state.read(|s| s.jobs.values().any(|j| j.state == JobState::Pending)) {
            return;
        }
        let (starts_max, paced) = crate::pacing::starts_per_pass_max(&self.leader_load());
        self.say_paced(paced, starts_max);
        if starts_max == 0 {
            // Behind: not even the view is built (the pass would start nothing; preemptions
            // and MIG layouts, both for jobs to start, wait too).
            return;
        }
        let mut view = self.scheduler_view();
        view.config.starts_per_pass_max = starts_max;
        let now = now_ms();
        let started = Instant::now();
        let plan = scheduler::schedule(&view, now);
        let pass_ms = started.elapsed().as_millis() as u64;
        for (job, action) in &plan.preemptions {
            let cmd = match action {
                scheduler::PreemptAction::Requeue => Command::Requeue { job: *job, reason: "preempted".into(), now_ms: now },
                scheduler::PreemptAction::Cancel => Command::Cancel { job: *job, now_ms: now },
            };
            info!(job, action = ?action, "preempting job");
            if let Err(e) = self.propose(cmd).await {
                warn!(job, error = %e, "preempt job");
            }
        }
        self.send_mig_layouts(&plan.mig_layouts);
        if plan.placements.is_empty() {
            return;
        }
        let array_tasks: Vec<(u32, u32)> = plan.array_tasks.iter().map(|a| (a.placement as u32, a.task)).collect();
        let placements = plan.placements.len();
        match self.propose(Command::Plan { placements: plan.placements, array_tasks, now_ms: now }).await {
            Ok(CommandResult::Planned { accepted, rejected }) => {
                debug!(placements, accepted = accepted.len(), rejected = rejected.len(), pass_ms, "plan committed");
                for (job, why) in rejected {
                    debug!(job, why = %why, "placement rejected as stale");
                }
            }
            Ok(other) => warn!(result = ?other, "unexpected plan result"),
            Err(e) => warn!(error = %e, "commit plan"),
        }
    }

    /// What pacing needs to know of this leader's load (`pacing::LeaderLoad`).
    fn leader_load(&self) -> crate::pacing::LeaderLoad {
        use openraft::async_runtime::watch::WatchReceiver;
        use openraft::Instant as _;
        let quorum_ack_age_ms = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.last_quorum_acked.as_ref().map(|at| at.elapsed().as_millis() as u64)
        };
        let single_voter = self.voter_ids().iter().all(|v| *v == self.id);
        let launches_unconfirmed =
            self.state.read(|s| s.jobs.values().filter(|j| !j.parts.is_empty()).map(|j| j.launches_pending().count()).sum());
        crate::pacing::LeaderLoad {
            quorum_ack_age_ms,
            single_voter,
            raft_heartbeat_ms: self.config.raft.heartbeat_interval_ms,
            lease_ms: self.config.raft.election_timeout_min_ms,
            launches_unconfirmed,
        }
    }

    /// Says when the leader starts and stops holding starts back for its own lag (pacing for
    /// launches in flight is routine and said at debug level only).
    fn say_paced(&self, paced: crate::pacing::Paced, starts_max: u32) {
        use crate::pacing::Paced;
        let before = lock(&self.memory).paced.replace(paced);
        let lagging = |p: Option<Paced>| matches!(p, Some(Paced::Lagging | Paced::Stalled));
        if lagging(Some(paced)) && !lagging(before) {
            info!(paced = ?paced, starts_max, "voters acknowledge late: pacing job starts");
        } else if !lagging(Some(paced)) && lagging(before) {
            info!(starts_max, "voters caught up: job starts no longer held back");
        } else if paced != Paced::No {
            debug!(paced = ?paced, starts_max, "job starts paced");
        }
        self.paced.count(paced);
    }

    /// Asks agents to re-partition idle MIG GPUs as the scheduler suggests, each GPU at most
    /// once per ten `RESEND_AFTER` (the new inventory comes back through the log).
    fn send_mig_layouts(&self, layouts: &[(NodeId, u32, Vec<String>)]) {
        for (target, gpu, profiles) in layouts {
            {
                let mut mem = lock(&self.memory);
                let key = (*target, *gpu);
                if mem.layouts_sent.get(&key).is_some_and(|t| t.elapsed() < RESEND_AFTER * 10) {
                    continue;
                }
                mem.layouts_sent.insert(key, Instant::now());
            }
            info!(node = target, gpu, profiles = ?profiles, "asking for a mig layout");
            if *target == self.id {
                if let Err(e) = self.apply_mig_layout(*gpu, profiles.clone()) {
                    warn!(gpu, error = %e, "mig layout");
                }
                continue;
            }
            let Some(addr) = self.state.read(|s| s.nodes.get(target).map(|n| n.addr.clone())) else { continue };
            let client = Arc::clone(&self.client);
            let env = Envelope { hops: 0, request: Request::ApplyMigLayout { gpu: *gpu, profiles: profiles.clone() }, user: None };
            let gpu = *gpu;
            tokio::spawn(async move {
                match client.call(&addr, &env, PEER_CALL_TIMEOUT).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => warn!(gpu, error = %e, "mig layout refused"),
                    Err(e) => warn!(gpu, error = %e, "mig layout not delivered"),
                }
            });
        }
    }

    /// Sends every committed-but-unconfirmed launch of a part to its node, and every stop of a
    /// part that must end (cancelled, failed gang, requeued, earlier run) to its node; re-sends
    /// after `RESEND_AFTER`.
    fn drive_launches_and_kills(self: &Arc<Self>) {
        // Read before the state: the state read below is at least this recent.
        let issued_index = self.state.applied_index();
        let (launches, kills) = self.state.read(|s| {
            let addr_of = |node: NodeId| s.nodes.get(&node).map(|n| n.addr.clone()).unwrap_or_default();
            let mut launches = Vec::new();
            let mut kills = Vec::new();
            // Only jobs with parts have anything to launch or stop (finished ones, most of the
            // hot state under a sweep, have none).
            for j in s.jobs.values().filter(|j| !j.parts.is_empty()) {
                let targets = control::leader::launch_targets(j);
                if !targets.is_empty() {
                    let nodes: Vec<(String, String)> = j
                        .run_nodes()
                        .iter()
                        .map(|n| s.nodes.get(n).map(|r| (r.name.clone(), r.addr.clone())).unwrap_or_default())
                        .collect();
                    for target in targets {
                        launches.push((j.clone(), nodes.clone(), target, addr_of(target)));
                    }
                }
                for stop in control::leader::stops(j) {
                    kills.push((j.id, stop.run, stop.checkpoint, stop.node, addr_of(stop.node)));
                }
            }
            (launches, kills)
        });
        {
            let mut mem = lock(&self.memory);
            let now_ms = mem.now_ms();
            mem.launches_sent.prune(now_ms);
            mem.kills_sent.prune(now_ms);
        }
        for (job, nodes, target, addr) in launches {
            let key = (job.id, job.run, target);
            {
                let mut mem = lock(&self.memory);
                let now_ms = mem.now_ms();
                if !mem.launches_sent.take_due(key, now_ms) {
                    continue;
                }
            }
            let node = Arc::clone(self);
            let span = info_span!("launch", job = key.0, run = key.1, node = target);
            let calls = Arc::clone(
                lock(&self.memory)
                    .launch_calls
                    .entry(target)
                    .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(crate::pacing::LAUNCH_CALLS_PER_NODE_MAX))),
            );
            tokio::spawn(
                async move {
                    // A node has at most so many launch calls under way; the rest wait here.
                    let Ok(_call) = calls.acquire().await else { return };
                    // A re-send counts from when the call starts, not from its wait.
                    {
                        let mut mem = lock(&node.memory);
                        let now_ms = mem.now_ms();
                        mem.launches_sent.sent(key, now_ms);
                    }
                    node.send_launch(job, nodes, target, addr, issued_index).await;
                }
                .instrument(span),
            );
        }
        for (job, run, checkpoint, target, addr) in kills {
            {
                let mut mem = lock(&self.memory);
                let now_ms = mem.now_ms();
                if !mem.kills_sent.take_due((job, run, target), now_ms) {
                    continue;
                }
            }
            let node = Arc::clone(self);
            tokio::spawn(async move {
                let result = if target == node.id {
                    node.agent.kill(job, run, checkpoint)
                } else {
                    let env = Envelope { hops: 0, request: Request::Kill { job, run, checkpoint }, user: None };
                    node.client.call(&addr, &env, PEER_CALL_TIMEOUT).await.unwrap_or_else(|e| Err(ApiError::Unavailable(e.to_string())))
                };
                if let Err(e) = result {
                    debug!(job, run, error = %e, "stop not delivered, will retry");
                }
            });
        }
    }

    async fn send_launch(&self, job: proto::Job, nodes: Vec<(String, String)>, target: NodeId, addr: String, issued_index: u64) {
        let (id, run) = (job.id, job.run);
        let result = if target == self.id {
            self.launch_here(job, nodes).await
        } else {
            let env = Envelope { hops: 0, request: Request::Launch { job: Box::new(job), nodes, issued_index }, user: None };
            match self.client.call(&addr, &env, PEER_CALL_TIMEOUT).await {
                Ok(r) => r,
                Err(e) => Err(ApiError::Unavailable(format!("reach {addr}: {e}"))),
            }
        };
        match result {
            Ok(Reply::LaunchAck { instance, .. }) => {
                let cmd = Command::LaunchConfirmed { job: id, run, node: target, instance, now_ms: now_ms() };
                match self.propose(cmd).await {
                    Ok(CommandResult::Ok) => debug!("launch confirmed"),
                    Ok(other) => debug!(result = ?other, "launch confirmation not applied"),
                    Err(e) => warn!(error = %e, "commit launch confirmation"),
                }
            }
            Ok(other) => warn!(reply = ?other, "unexpected launch reply"),
            Err(e) => warn!(error = %e, "launch not accepted, will retry"),
        }
    }

    /// Keeps `voters_max` voters: promotes a healthy agent when there are fewer, and replaces a
    /// voter that has been DOWN for `voter_replace_after_ms`. One change at a time.
    fn manage_voters(self: &Arc<Self>) {
        if self.membership_busy.load(Ordering::SeqCst) {
            return;
        }
        let voters = self.voter_ids();
        let now = now_ms();
        let fresh_within = Duration::from_millis(self.config.heartbeat_interval_ms * 3);
        let (candidate, dead) = {
            let mem = lock(&self.memory);
            self.state.read(|s| {
                let candidate = s
                    .nodes
                    .values()
                    .filter(|n| n.state == NodeState::Up && !voters.contains(&n.id))
                    .filter(|n| !n.inventory.features.iter().any(|f| f == liveness::NEVER_VOTER_FEATURE))
                    .find(|n| mem.last_seen.get(&n.id).is_some_and(|t| t.elapsed() < fresh_within))
                    .map(|n| (n.id, MemberNode { name: n.name.clone(), addr: n.addr.clone() }));
                let dead: Vec<NodeId> = voters
                    .iter()
                    .copied()
                    .filter(|v| {
                        s.nodes.get(v).is_some_and(|n| {
                            n.state == NodeState::Down && now.saturating_sub(n.state_changed_ms) > self.config.voter_replace_after_ms
                        })
                    })
                    .collect();
                (candidate, dead)
            })
        };
        let Some((new_id, new_node)) = candidate else { return };
        let change = if voters.len() < self.config.voters_max {
            let mut v = voters.clone();
            v.insert(new_id);
            v
        } else if let Some(gone) = dead.first() {
            let mut v = voters.clone();
            v.remove(gone);
            v.insert(new_id);
            v
        } else {
            return;
        };
        self.membership_busy.store(true, Ordering::SeqCst);
        let node = Arc::clone(self);
        tokio::spawn(async move {
            info!(node = %new_node.name, voters = ?change, "promoting node to voter");
            let result = async {
                node.raft.add_learner(new_id, new_node.clone(), true).await.map_err(|e| format!("add learner: {e}"))?;
                // retain: a replaced voter stays a learner, so when it comes back the log tells it
                // it is no longer a voter (a removed node would otherwise campaign for ever and
                // serve a stale state).
                node.raft.change_membership(change.clone(), true).await.map_err(|e| format!("change membership: {e}"))?;
                Ok::<_, String>(())
            }
            .await;
            match result {
                Ok(()) => info!(node = %new_node.name, "voters now {:?}", change),
                Err(e) => warn!(node = %new_node.name, error = %e, "promotion failed"),
            }
            node.membership_busy.store(false, Ordering::SeqCst);
        });
    }

    /// Periodically learns the members' addresses so this node can find the leader.
    async fn learn_members_loop(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(liveness::MEMBERS_CHECK_INTERVAL);
        let mut learned: Option<(u64, Instant)> = None;
        loop {
            ticker.tick().await;
            let term = self.agent.ack_term();
            if !liveness::members_due(learned, term, Instant::now()) {
                continue;
            }
            // A relay answers (any voter does): the leader is asked only when none can.
            let members = match self.heartbeat_link.call(Request::Members, 0).await {
                // A leader of an older build does not know `Members` yet.
                Err(crate::link::LinkError::Api(ApiError::Invalid(_))) => self.heartbeat_link.call(Request::ClusterInfo, 0).await,
                other => other,
            };
            if let Ok(Reply::Cluster(info)) = members {
                let addrs: Vec<String> = info.members.iter().filter(|m| m.role != NodeRole::Agent).map(|m| m.addr.clone()).collect();
                self.forward_link.learn(addrs.iter().filter(|a| **a != self.config.advertise_addr()).cloned());
                self.agent_link.learn(addrs.clone());
                self.heartbeat_link.learn(addrs);
                let voters: Vec<(NodeId, NodeRole, String)> = info.members.iter().map(|m| (m.id, m.role, m.addr.clone())).collect();
                self.heartbeat_link.set_first(liveness::relay_order(self.id, &voters));
                learned = Some((term, Instant::now()));
            }
        }
    }
}

fn rejected(result: CommandResult) -> ApiError {
    match result {
        CommandResult::Rejected(why) if why.contains("unknown") || why.contains("not found") => ApiError::NotFound(why),
        CommandResult::Rejected(why) => ApiError::Invalid(why),
        other => ApiError::Internal(format!("unexpected result {other:?}")),
    }
}

fn ok_or_rejected(result: CommandResult) -> Response {
    match result {
        CommandResult::Ok => Ok(Reply::Ok),
        other => Err(rejected(other)),
    }
}

/// How long a launch waits for this node's replica to catch up before it is refused (the
/// leader sends it again).
const LAUNCH_APPLY_WAIT_MS: u64 = 2_000;

/// The longest a join token may live.
const JOIN_TOKEN_TTL_MS_MAX: u64 = 30 * 24 * 3600 * 1000;
/// The largest certificate request accepted.
const CSR_BYTES_MAX: usize = 16 * 1024;

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Requests only a node may send (a client's are forwarded by its node, under the node's name).
fn node_only(request: &Request) -> bool {
    matches!(
        request,
        Request::Raft { .. }
            | Request::Join { .. }
            | Request::Heartbeat { .. }
            | Request::ReportRun { .. }
            | Request::ReportRuns { .. }
            | Request::Launch { .. }
            | Request::Kill { .. }
            | Request::ReportGpuHealth { .. }
            | Request::ReportInventory { .. }
            | Request::ApplyMigLayout { .. }
            | Request::SignalPart { .. }
            | Request::StepStart { .. }
    )
}

/// Renews this node's certificate before it expires, without a restart: every
/// `cert_check_interval_ms`, when fewer than `cert_renew_before_ms` are left, a new key and
/// request go to the members until one holding the CA key signs it; the files are replaced and
/// new connections, served and dialed, use it.
async fn renew_certificate_loop(config: NodeConfig, endpoint: transport::quinn::Endpoint, client: Arc<Client>, node: Arc<Node>) {
    let mut last_error: Option<String> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(config.cert_check_interval_ms)).await;
        match renew_certificate_once(&config, &endpoint, &client, &node).await {
            Ok(None) => last_error = None,
            Ok(Some((old, new, not_after))) => {
                info!(old = %old, new = %new, not_after_unix = not_after, "certificate renewed");
                last_error = None;
            }
            Err(e) => {
                let msg = format!("{e:#}");
                if last_error.as_deref() != Some(&msg) {
                    warn!(error = %msg, "renew the node certificate");
                }
                last_error = Some(msg);
            }
        }
    }
}

/// One check: `Some((old fingerprint, new fingerprint, new expiry))` when renewed.
async fn renew_certificate_once(
    config: &NodeConfig,
    endpoint: &transport::quinn::Endpoint,
    client: &Client,
    node: &Node,
) -> anyhow::Result<Option<(String, String, i64)>> {
    use transport::pki;
    let cert_pem = std::fs::read_to_string(&config.tls.cert).with_context(|| format!("read {}", config.tls.cert.display()))?;
    let not_after = pki::not_after_unix(&cert_pem)?;
    let now_s = (now_ms() / 1000) as i64;
    if not_after.saturating_sub(now_s) > (config.cert_renew_before_ms / 1000) as i64 {
        return Ok(None);
    }
    let request = pki::node_csr(&config.name, &pki::cert_hosts(&cert_pem)?)?;
    let mut members: Vec<String> = node.state.read(|s| s.nodes.values().map(|n| n.addr.clone()).collect());
    let own = config.advertise_addr();
    members.sort_by_key(|a| *a != own);
    let envelope = Envelope { hops: 0, request: Request::RenewCert { csr_pem: request.cert_pem.clone() }, user: None };
    let mut refusals = Vec::new();
    let mut signed = None;
    for addr in &members {
        match client.call(addr, &envelope, PEER_CALL_TIMEOUT).await {
            Ok(Ok(Reply::Enrolled { cert_pem, .. })) => {
                signed = Some(cert_pem);
                break;
            }
            Ok(other) => refusals.push(format!("{addr}: {other:?}")),
            Err(e) => refusals.push(format!("{addr}: {e}")),
        }
    }
    let Some(new_cert) = signed else { bail!("no member signed the renewal: {}", refusals.join("; ")) };
    let ca_pem = std::fs::read_to_string(&config.tls.ca_cert).with_context(|| format!("read {}", config.tls.ca_cert.display()))?;
    let identity = transport::TlsIdentity::from_pems(&ca_pem, &new_cert, &request.key_pem).context("check the renewed certificate")?;
    anyhow::ensure!(identity.common_name() == config.name, "the renewed certificate names {}, not {}", identity.common_name(), config.name);
    // Key first, then certificate, each replaced whole.
    for (path, text, mode) in [(&config.tls.key, &request.key_pem, 0o600), (&config.tls.cert, &new_cert, 0o644)] {
        let tmp = path.with_extension("renewed");
        std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .with_context(|| format!("chmod {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("replace {}", path.display()))?;
    }
    transport::reload_server_identity(endpoint, &identity)?;
    client.reload_identity(&identity)?;
    Ok(Some((pki::cert_fingerprint(&cert_pem)?, identity.fingerprint(), pki::not_after_unix(&new_cert)?)))
}

/// FNV-1a: a short stable tag for a path.
fn fnv32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Job cgroups as the config asks, saying at start what is and is not enforced.
fn job_cgroups(config: &NodeConfig) -> Option<crate::cgroup::JobCgroups> {
    let base = match config.cgroup.as_deref().unwrap_or("auto") {
        "off" => {
            warn!("cgroups are off (cgroup = \"off\"): jobs are not confined or limited");
            return None;
        }
        "auto" => {
            match crate::cgroup::JobCgroups::default_base(&format!("{}-{:08x}", config.name, fnv32(&config.data_dir.display().to_string())))
            {
                Ok(base) => base,
                Err(e) => {
                    warn!(error = format!("{e:#}"), "cgroup v2 is not available: jobs are not confined or limited");
                    return None;
                }
            }
        }
        path => std::path::PathBuf::from(path),
    };
    match crate::cgroup::JobCgroups::open(&base) {
        Ok(mut c) => {
            // What cgroup v2 lacks here, from the v1 hierarchies beside it (a hybrid host).
            c.add_v1(&format!("{}-{:08x}", config.name, fnv32(&config.data_dir.display().to_string())));
            let missing = c.missing();
            if !c.v1.is_empty() {
                info!(v1 = ?c.v1, "cgroup v1 hierarchies used beside v2");
            }
            if missing.is_empty() {
                info!(cgroup = %c.base.display(), controllers = ?c.enforced(), "jobs run in cgroups with cpu, memory and pids limits");
            } else {
                warn!(
                    cgroup = %c.base.display(),
                    missing = ?missing,
                    "jobs run in cgroups (killed whole at their end) but these controllers are not delegated here: those limits are not enforced"
                );
            }
            Some(c)
        }
        Err(e) => {
            warn!(cgroup = %base.display(), error = format!("{e:#}"), "cgroup v2 is not writable: jobs are not confined or limited");
            None
        }
    }
}

/// The handler registered with the QUIC server before the node is fully up: until Raft is
/// open it answers `Unavailable`.
pub struct Api {
    node: OnceLock<Arc<Node>>,
    fault: Arc<crate::fault::FaultSwitch>,
}

impl Handler for Api {
    fn handle(&self, peer: Peer, mut envelope: Envelope) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
        // Who is asking: a user's certificate names them; a node may act for the user whose
        // request it forwards.
        // A machine without a certificate may only enrol.
        if peer.common_name == transport::ANONYMOUS_PEER {
            return match (&envelope.request, self.node.get()) {
                (Request::Enroll { .. }, Some(node)) => {
                    envelope.user = None;
                    envelope.hops = 0;
                    Box::pin(Arc::clone(node).handle(envelope))
                }
                (Request::Enroll { .. }, None) => Box::pin(async { Err(ApiError::Unavailable("node is starting".into())) }),
                _ => {
                    debug!(peer = %peer.remote, "refused a request without a certificate");
                    Box::pin(async { Err(ApiError::Denied("a certificate of the cluster is required".into())) })
                }
            };
        }
        if let Some(node) = self.node.get() {
            let revoked =
                node.state.read(|s| s.revoked_certs.get(&peer.fingerprint).or_else(|| s.revoked_nodes.get(&peer.common_name)).cloned());
            if let Some(why) = revoked {
                warn!(peer = %peer.common_name, fingerprint = %peer.fingerprint, reason = %why, "refused a revoked certificate");
                return Box::pin(async move { Err(ApiError::Denied(format!("certificate revoked: {why}"))) });
            }
        }
        // A node renews its own certificate: the name is the one its current certificate proves.
        if let Request::RenewCert { csr_pem } = &envelope.request {
            if peer.common_name.starts_with(transport::pki::USER_CN_PREFIX) {
                return Box::pin(async { Err(ApiError::Denied("only nodes renew certificates".into())) });
            }
            let answer = match self.node.get() {
                Some(node) => node.sign_renewal(&peer.common_name, csr_pem),
                None => Err(ApiError::Unavailable("node is starting".into())),
            };
            return Box::pin(async move { answer });
        }
        // A joining node's certificate, as this handshake proved it (a forwarded Join keeps what
        // the first node saw).
        if let Request::Join { cert_fingerprint, .. } = &mut envelope.request {
            if envelope.hops == 0 {
                *cert_fingerprint = peer.fingerprint.clone();
            }
        }
        if let Some(name) = peer.common_name.strip_prefix(transport::pki::USER_CN_PREFIX) {
            envelope.user = Some(name.to_string());
            // A remote user's uid is not known here: the node that runs the job looks the name
            // up. Only a node (the local socket's kernel-checked answer) may state one.
            if let Request::Submit { spec } = &mut envelope.request {
                spec.uid = None;
                spec.gid = None;
            }
        }
        if self.fault.refuses(&peer.common_name) {
            return Box::pin(async { Err(ApiError::Unavailable("partitioned (fault injection)".into())) });
        }
        // Only node certificates may speak the node-to-node part of the protocol; a user's
        // certificate (CN `user:NAME`) is limited to the client API.
        if peer.common_name.starts_with(transport::pki::USER_CN_PREFIX) && node_only(&envelope.request) {
            warn!(peer = %peer.common_name, "refused a node-only request from a user certificate");
            return Box::pin(async { Err(ApiError::Denied("this request is for cluster nodes only".into())) });
        }
        match self.node.get() {
            Some(node) => Box::pin(Arc::clone(node).handle(envelope)),
            None => Box::pin(async { Err(ApiError::Unavailable("node is starting".into())) }),
        }
    }
}

impl transport::local::LocalHandler for Api {
    fn handle_local(
        &self,
        peer: transport::local::LocalPeer,
        mut envelope: Envelope,
    ) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
        if node_only(&envelope.request) {
            warn!(uid = peer.uid, "refused a node-only request on the local socket");
            return Box::pin(async { Err(ApiError::Denied("this request is for cluster nodes only".into())) });
        }
        // The kernel names the caller. Root on a node holds the node's key anyway: it acts as
        // the node (an admin); every other uid is the user of that name.
        let Some(account) = crate::identity::by_uid(peer.uid) else {
            warn!(uid = peer.uid, "refused a local caller without a user name");
            return Box::pin(async move { Err(ApiError::Denied(format!("uid {} has no user name on this node", peer.uid))) });
        };
        envelope.user = (peer.uid != 0).then(|| account.name.clone());
        if let Request::Submit { spec } = &mut envelope.request {
            spec.user = account.name.clone();
            spec.uid = Some(peer.uid);
            spec.gid = Some(peer.gid);
        }
        match self.node.get() {
            Some(node) => Box::pin(Arc::clone(node).handle(envelope)),
            None => Box::pin(async { Err(ApiError::Unavailable("node is starting".into())) }),
        }
    }
}

/// The Raft network over the node's QUIC client.
struct QuicRaftTransport {
    client: Arc<Client>,
}

impl consensus::RaftTransport for QuicRaftTransport {
    fn call(
        &self,
        _target: NodeId,
        node: &MemberNode,
        kind: proto::RaftRpcKind,
        payload: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, consensus::TransportError>> + Send {
        let client = Arc::clone(&self.client);
        let addr = node.addr.clone();
        async move {
            let env = Envelope { hops: 0, request: Request::Raft { kind, payload }, user: None };
            match client.call(&addr, &env, Duration::from_secs(10)).await {
                Ok(Ok(Reply::Raft { payload })) => Ok(payload),
                Ok(Ok(other)) => Err(consensus::TransportError::Remote(format!("unexpected reply {other:?}"))),
                Ok(Err(e)) => Err(consensus::TransportError::Remote(e.to_string())),
                Err(transport::CallError::Timeout) => Err(consensus::TransportError::Timeout),
                Err(e) => Err(consensus::TransportError::Unreachable(e.to_string())),
            }
        }
    }
}

fn read_node_id(path: &Path) -> anyhow::Result<Option<NodeId>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().parse().with_context(|| format!("parse node id in {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read node id at {}", path.display())),
    }
}

fn write_node_id(path: &Path, id: NodeId) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{id}\n")).with_context(|| format!("write node id to {}", tmp.display()))?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).with_context(|| format!("sync {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("move node id into {}", path.display()))
}

/// Calls `request` through `link` until it succeeds or `deadline` passes.
async fn call_until(link: &LeaderLink, request: Request, what: &str, deadline: Duration) -> anyhow::Result<Reply> {
    let started = Instant::now();
    let mut backoff_ms = 100;
    loop {
        match link.call(request.clone(), 0).await {
            Ok(reply) => return Ok(reply),
            Err(LinkError::Api(e @ (ApiError::Denied(_) | ApiError::Invalid(_) | ApiError::Version { .. }))) => {
                bail!("{what}: {e}")
            }
            Err(e) if started.elapsed() > deadline => bail!("{what}: gave up after {} s: {e}", deadline.as_secs()),
            Err(e) => {
                debug!(error = %e, "{what}: retrying");
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(2_000);
            }
        }
    }
}

/// How long a graceful stop waits for the node's jobs to stop and be reported, beyond their
/// `kill_grace_ms`.
pub const STOP_REPORT_MS: u64 = 5_000;

/// What the daemon is asked to do (`main.rs` turns signals into these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopRequest {
    /// Keep running.
    None,
    /// Stop gracefully (SIGTERM): the node's jobs are stopped and reported, see
    /// [`Agent::shut_down`].
    Stop,
    /// Exit to be replaced (SIGUSR2, a rolling upgrade): the jobs go on, see
    /// [`Agent::hand_over`].
    HandOver,
}

/// How [`run`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Stopped,
    /// The runs are handed over: the process must exit now, without stopping anything.
    HandedOver,
}

/// Starts a node and runs it until `stop` asks it to stop or hand over, or the node fails.
/// Runs the node until it stops. `spawner` forks the runs' shepherds (`spawner::start`, before
/// the runtime); without one they are exec'd.
pub async fn run(
    config: NodeConfig,
    mut stop: tokio::sync::watch::Receiver<StopRequest>,
    spawner: Option<Arc<crate::spawner::Spawner>>,
) -> anyhow::Result<Ended> {
    std::fs::create_dir_all(&config.data_dir).with_context(|| format!("create data directory {}", config.data_dir.display()))?;
    lock_data_dir(&config.data_dir)?;
    std::fs::create_dir_all(config.runs_dir()).with_context(|| format!("create {}", config.runs_dir().display()))?;
    // Run records hold jobs' environments.
    std::fs::set_permissions(config.runs_dir(), std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .with_context(|| format!("chmod {}", config.runs_dir().display()))?;
    // The previous daemon may have handed its runs over: then this one keeps its instance (the
    // cluster sees no restart) and takes them over. Otherwise it is a new instance, and the
    // cluster ends whatever the node ran before.
    let daemon_file = config.daemon_file();
    let previous = match crate::shepherd::read_json::<crate::shepherd::DaemonRecord>(&daemon_file) {
        Ok(p) => p,
        Err(e) => {
            warn!(error = format!("{e:#}"), "read the previous daemon's record: starting as a new instance");
            None
        }
    };
    let handover = previous.as_ref().and_then(|p| p.open_handover(crate::watchdog::boot_ms()));
    if let (Some(p), None) = (&previous, handover) {
        if p.handover.is_some() {
            warn!(instance = p.instance, "the previous daemon's hand-over expired: its jobs were killed, starting as a new instance");
        }
    }
    let instance: u64 = match (&previous, handover) {
        (Some(p), Some(_)) => p.instance,
        _ => rand::random(),
    };
    crate::shepherd::write_json(&daemon_file, &crate::shepherd::DaemonRecord::me(instance))?;
    let identity = config.tls.load().context("load tls identity")?;
    let endpoint =
        transport::endpoint(config.listen, &identity, true).with_context(|| format!("bind quic endpoint on {}", config.listen))?;
    let client = Arc::new(Client::new(endpoint.clone()));
    let probe: Arc<dyn crate::gpu::GpuProbe> = Arc::from(crate::probe::probe_from_config(&config.gpus, &config.name));
    let discover_started = Instant::now();
    let discovered = probe.discover().context("discover gpus")?;
    info!(probe = probe.kind(), gpus = discovered.gpus.len(), took_ms = discover_started.elapsed().as_millis() as u64, "gpus discovered");
    let cgroups = job_cgroups(&config);
    let gpu_device_files: BTreeMap<u32, std::path::PathBuf> = if config.gpu_device_files.is_empty() {
        discovered.device_files.clone()
    } else {
        config.gpu_device_files.iter().enumerate().map(|(i, p)| (i as u32, p.clone())).collect()
    };
    let fenced = cgroups.as_ref().is_some_and(|c| c.fences_devices());
    if !gpu_device_files.is_empty() && fenced {
        info!(files = gpu_device_files.len(), "each run may open only its own GPUs' device files (cgroup v1 devices controller)");
    } else if !discovered.gpus.is_empty() && (probe.kind() != "simulated" || !gpu_device_files.is_empty()) {
        // Said at start, as for the cgroup controllers that are missing.
        warn!(
            gpus = discovered.gpus.len(),
            "a job's GPUs are chosen with CUDA_VISIBLE_DEVICES, not fenced: there is no cgroup v1 devices controller here, and cgroup v2 device control (a BPF program) is not implemented, so a job can open every /dev/nvidia* this node has"
        );
    }
    let gpus = discovered.gpus.clone();
    let inventory = Inventory {
        gpus: gpus.clone(),
        topology: discovered.topology,
        cpus: config.cpus.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32)),
        memory_mib: config.memory_mib.unwrap_or_else(host_memory_mib),
        location: config.location.clone(),
        features: config.features.clone(),
        partitions: config.partitions.clone(),
    };
    info!(node = %config.name, gpus = gpus.len(), cpus = inventory.cpus, memory_mib = inventory.memory_mib, "inventory discovered");
    let settings = crate::agent::AgentSettings {
        jobs_dir: config.jobs_dir(),
        job_files_dir: config.job_files_dir(),
        checkpoint_root: config.checkpoint_root(),
        nccl: crate::nccl::derive(&config.nccl, &inventory, &config.advertise_addr()),
        stop: crate::launcher::StopTimings { kill_grace_ms: config.kill_grace_ms, fence_kill_grace_ms: config.fence_kill_grace_ms },
        fence_after_ms: config.fence_after_ms(),
        cluster_name: config.cluster_name.clone(),
        lease_path: config.lease_path(),
        run_as_user: config.run_as_user,
        cgroups,
        gpu_device_files,
        exe: std::env::current_exe().context("find the corrald executable (it holds batch jobs' other nodes and shepherds runs)")?,
        spawner,
        runs_dir: config.runs_dir(),
        daemon_file: daemon_file.clone(),
        local_socket: Some(config.socket_path()),
        // SAFETY: geteuid cannot fail.
        job_hosts: match (&config.job_hosts_file, unsafe { libc::geteuid() } == 0) {
            (Some(file), false) => {
                warn!(file = %file.display(), "job_hosts_file needs corrald to run as root (a mount namespace per run): jobs resolve names with the system's /etc/hosts");
                None
            }
            (file, _) => file.clone(),
        },
    };
    // SAFETY: geteuid cannot fail.
    if config.run_as_user && unsafe { libc::geteuid() } != 0 {
        bail!("run_as_user needs corrald to run as root (or set run_as_user = false to run every job as this user)");
    }
    info!(nccl = ?settings.nccl, fence_after_ms = settings.fence_after_ms, "agent settings");
    if settings.fence_after_ms < 2 * config.raft.election_timeout_max_ms {
        warn!(
            fence_after_ms = settings.fence_after_ms,
            election_timeout_max_ms = config.raft.election_timeout_max_ms,
            "fence_after_ms is shorter than two elections: a leader failover may stop this node's jobs; raise node_down_after_ms"
        );
    }
    let agent = Agent::new(config.name.clone(), instance, gpus, settings)?;
    let adopted = agent.recover(handover).await.context("recover the previous daemon's runs")?;
    if handover.is_some() {
        info!(instance, runs = adopted, "took over the previous daemon's instance and runs");
    }
    let fault = Arc::new(crate::fault::FaultSwitch::default());
    tokio::spawn(Arc::clone(&fault).watch(config.data_dir.join("fault-partition"), Arc::clone(&client)));
    let api = Arc::new(Api { node: OnceLock::new(), fault });
    tokio::spawn(transport::serve(endpoint.clone(), api.clone()));
    let socket = config.socket_path();
    let listener = transport::local::bind(&socket)?;
    info!(socket = %socket.display(), "local socket open");
    tokio::spawn(transport::local::serve_local(listener, api.clone()));

    let advertise = config.advertise_addr();
    let others: Vec<String> = config.join.iter().filter(|a| **a != advertise).cloned().collect();
    let mut agent_candidates = vec![advertise.clone()];
    agent_candidates.extend(others.iter().cloned());
    // Heartbeats and reports give up on a silent member quickly and try the next one: a call
    // stuck on a dead leader must not make this node look dead to the new one.
    let link_timeout = heartbeat_call_timeout(&config);
    let agent_link = Arc::new(LeaderLink::new(Arc::clone(&client), agent_candidates.clone(), link_timeout));
    let forward_link = Arc::new(LeaderLink::new(Arc::clone(&client), others, PEER_CALL_TIMEOUT));
    // Each member gets half a beat's budget, so a dead one (a killed voter is still a voter,
    // maybe this node's first relay) leaves time for the next.
    let heartbeat_link = Arc::new(LeaderLink::new(Arc::clone(&client), agent_candidates, link_timeout / 2));
    let join = Request::Join {
        token: config.join_token.clone(),
        name: config.name.clone(),
        addr: advertise.clone(),
        inventory: inventory.clone(),
        instance,
        cert_fingerprint: String::new(),
    };

    let id_path = config.data_dir.join("node_id");
    let id = match read_node_id(&id_path)? {
        Some(id) => id,
        None if config.bootstrap => 1,
        None => match call_until(&forward_link, join.clone(), "join the cluster", Duration::from_secs(600)).await? {
            Reply::Joined { id, .. } => id,
            other => bail!("join the cluster: unexpected reply {other:?}"),
        },
    };
    write_node_id(&id_path, id)?;
    agent.set_node_id(id);

    let raft_dir = config.data_dir.join("raft");
    let wal_sync_delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
    tokio::spawn(crate::fault::watch_disk_and_clock(config.data_dir.clone(), Arc::clone(&wal_sync_delay_ms)));
    let transport = QuicRaftTransport { client: Arc::clone(&client) };
    let (raft, state) = consensus::open_raft(id, &raft_dir, transport, config.raft.timings(), wal_sync_delay_ms)
        .await
        .with_context(|| format!("open raft at {}", raft_dir.display()))?;
    if config.bootstrap && !raft.is_initialized().await.context("read raft initialization")? && id == 1 {
        info!(node = %config.name, "bootstrapping a new cluster");
        let members = BTreeMap::from([(id, MemberNode { name: config.name.clone(), addr: advertise.clone() })]);
        raft.initialize(members).await.context("initialize the cluster")?;
        // Register this node before the API answers anyone, so no joining node can be given
        // the bootstrap node's id.
        let started = Instant::now();
        while !consensus::raft_status(&raft).is_leader {
            if started.elapsed() > Duration::from_secs(30) {
                bail!("bootstrap: this node did not become leader of its own cluster within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let cmd = Command::RegisterNode {
            name: config.name.clone(),
            addr: advertise.clone(),
            inventory: inventory.clone(),
            instance,
            cert_fingerprint: identity.fingerprint(),
            now_ms: now_ms(),
        };
        match consensus::propose(&raft, cmd).await.map_err(|e| anyhow::anyhow!("register the bootstrap node: {e}"))? {
            (_, CommandResult::NodeRegistered { id: assigned }) if assigned == id => {}
            (_, other) => bail!("register the bootstrap node: expected id {id}, got {other:?}"),
        }
    }
    let node = Arc::new(Node {
        config: config.clone(),
        id,
        proposer: consensus::Proposer::start(raft.clone()),
        raft,
        state,
        client: Arc::clone(&client),
        agent: Arc::clone(&agent),
        agent_link: Arc::clone(&agent_link),
        forward_link,
        heartbeat_link: Arc::clone(&heartbeat_link),
        relay: liveness::Relay::default(),
        memory: Mutex::new(LeaderMemory::default()),
        unreachable_leader: Mutex::new(None),
        membership_busy: AtomicBool::new(false),
        kick: Notify::new(),
        inventory,
        probe: Arc::clone(&probe),
        paced: crate::pacing::PacedCounts::default(),
    });
    if api.node.set(Arc::clone(&node)).is_err() {
        bail!("node handler set twice");
    }
    tokio::spawn(Arc::clone(&node).leader_loop());
    tokio::spawn(Arc::clone(&node).learn_members_loop());
    tokio::spawn(Arc::clone(&node).relay_loop());

    // Register this instance (new inventory, new instance id) before taking work.
    match call_until(&agent_link, join.clone(), "register with the cluster", Duration::from_secs(600)).await? {
        Reply::Joined { id: assigned, .. } if assigned == id => {}
        Reply::Joined { id: assigned, .. } => {
            bail!("cluster knows node '{}' as id {assigned}, but this data directory says {id}", config.name)
        }
        other => bail!("register with the cluster: unexpected reply {other:?}"),
    }
    info!(node = %config.name, id, instance, "node is up");
    crate::systemd::notify(&format!("READY=1\nSTATUS=node {} (id {id}) is up", config.name)); // deploy (issue 8)
    if let Some(addr) = config.metrics_listen {
        tokio::spawn(crate::metrics::serve(addr, Arc::clone(&node)));
    }
    tokio::spawn(Arc::clone(&agent).report_loop(Arc::clone(&agent_link)));
    tokio::spawn(Arc::clone(&agent).sample_loop(probe.sampler(), Duration::from_millis(config.gpu_sample_interval_ms)));
    spawn_gpu_health(probe.as_ref(), id, Arc::clone(&agent_link));
    tokio::spawn(renew_certificate_loop(config.clone(), endpoint.clone(), Arc::clone(&client), Arc::clone(&node)));
    tokio::spawn(crate::fault::watch_gpu_faults(config.data_dir.join("fault-gpu"), Arc::clone(&probe)));
    let heartbeat = Duration::from_millis(config.heartbeat_interval_ms);
    let budget = heartbeat_call_timeout(&config);
    let hb = tokio::spawn(liveness::heartbeat_loop(Arc::clone(&agent), heartbeat_link, heartbeat, budget, join));
    tokio::select! {
        ended = hb => match ended {
            Ok(()) => Ok(Ended::Stopped),
            Err(e) => {
                error!(error = %e, "heartbeat loop ended");
                bail!("heartbeat loop ended: {e}")
            }
        },
        request = stop.wait_for(|stop| *stop != StopRequest::None) => {
            if request.is_ok_and(|r| *r == StopRequest::HandOver) {
                match agent.hand_over() {
                    Ok(_) => return Ok(Ended::HandedOver),
                    Err(e) => warn!(error = format!("{e:#}"), "cannot hand the runs over: stopping them instead"),
                }
            }
            let left = agent.shut_down(Duration::from_millis(config.kill_grace_ms + STOP_REPORT_MS)).await;
            if left > 0 {
                warn!(left, "node stopped with jobs not yet stopped or reported; the cluster ends them when it declares the node down");
            } else {
                info!("node stopped: every job stopped and reported");
            }
            Ok(Ended::Stopped)
        }
    }
}

/// How long a relay's batch waits for more heartbeats after its first: a tenth of the heartbeat
/// interval, at most 50 ms (well inside the node's call timeout of twice the interval).
pub fn relay_linger(config: &NodeConfig) -> Duration {
    Duration::from_millis((config.heartbeat_interval_ms / 10).min(50))
}

/// How long a heartbeat (or report) waits on one member before it tries the next: twice the
/// heartbeat interval, within 300 ms to 2 s.
pub fn heartbeat_call_timeout(config: &NodeConfig) -> Duration {
    Duration::from_millis((config.heartbeat_interval_ms * 2).clamp(300, 2_000))
}

/// Takes `DATA_DIR/corrald.lock` for the life of this process: a second daemon on the same data
/// directory would take the node's runs for those of a dead instance and kill them.
fn lock_data_dir(data_dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let path = data_dir.join("corrald.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!("lock {}: {e} (another corrald runs on this data directory)", path.display());
    }
    // Held until the process exits (the descriptor is close-on-exec: no child keeps it).
    std::mem::forget(file);
    Ok(())
}

/// Forwards GPU health events from the probe to the leader, which commits them.
fn spawn_gpu_health(probe: &dyn crate::gpu::GpuProbe, node: NodeId, link: Arc<LeaderLink>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(crate::gpu::HEALTH_CHANNEL_CAPACITY);
    match probe.health_monitor() {
        Ok(monitor) => {
            tokio::spawn(crate::gpu::run_health_loop(monitor, tx));
        }
        Err(e) => {
            warn!(error = format!("{e:#}"), "gpu health monitor not started");
            return;
        }
    }
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let req = Request::ReportGpuHealth {
                node,
                gpu: ev.gpu,
                mig_uuid: ev.mig_uuid.clone(),
                healthy: ev.healthy,
                reason: ev.reason.clone(),
            };
            // Retry until committed: a lost health event would leave work on a broken GPU.
            let mut backoff_ms = 100;
            while let Err(e) = link.call(req.clone(), 0).await {
                warn!(gpu = ev.gpu, error = %e, "report gpu health, retrying");
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(5_000);
            }
        }
    });
}

fn host_memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or(1024, |kib| kib / 1024)
}
