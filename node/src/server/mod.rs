//! One running node: the request handler every peer and client talks to (routing, reads,
//! authorization, forwarding to the leader, what only the leader answers), with the rest by
//! concern: the leader's control loop (`leader`), heartbeats and their relay (`heartbeats`),
//! certificates and enrolment (`enrol`), and the start-up and stop of a node (`start`).

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
    NodeInfo, NodeRole, NodeState, Reply, Request, Response, FORWARD_HOPS_MAX,
};
use tokio::sync::Notify;
use tracing::{debug, error, info, info_span, warn, Instrument};
use transport::{Client, Handler, Peer};

use crate::agent::Agent;
use crate::config::NodeConfig;
use crate::link::{LeaderLink, LinkError};
use crate::liveness;

mod enrol;
mod heartbeats;
mod leader;
mod start;

use enrol::{constant_time_eq, renew_certificate_loop, sha256_hex, JOIN_TOKEN_TTL_MS_MAX};
use leader::LeaderMemory;
pub use start::{heartbeat_call_timeout, relay_linger, run, Ended, StopRequest, STOP_DECLARE_MS, STOP_REPORT_MS};

pub fn now_ms() -> u64 {
    crate::fault::wall_ms()
}

const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// A REST API token's life unless asked otherwise (Slurm's `scontrol token` default).
const TOKEN_LIFESPAN_S_DEFAULT: u64 = 1_800;
/// The longest life a token may be given.
const TOKEN_LIFESPAN_S_MAX: u64 = 365 * 86_400;
/// How long a forward waits for a handshake with the leader (a live one answers in well under a
/// millisecond on a LAN; a dead one should cost its clients little).
const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// How long a leader that could not be reached is taken for dead by forwards (an election
/// takes at most the election timeout; past this, it is tried again).
const UNREACHABLE_LEADER_HOLD: Duration = Duration::from_millis(1_000);

/// How long a request for a leader found unreachable waits for the next one to be elected
/// (an election takes `election_timeout_max_ms` and a round trip; dev clusters 400 ms).
const NEXT_LEADER_WAIT: Duration = Duration::from_millis(2_000);
/// How soon such a request asks again when the new leader was not ready for it yet.
const NEXT_LEADER_RETRY: Duration = Duration::from_millis(20);
/// The longest pause after a leader tick (see `leader_loop`).
const TICK_PAUSE_MAX: Duration = Duration::from_millis(100);
/// How long a step's start waits for a node whose part of the job is still starting.
const STEP_START_PATIENCE_MS: u64 = 30_000;
const STEP_START_RETRY_MS: u64 = 100;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
    /// The job requests of the last scheduler view, reused by the next (`view::ViewCache`).
    view_cache: Mutex<consensus::view::ViewCache>,
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
        let Envelope { hops, mut request, user } = envelope;
        if let (0, Request::Submit { spec }) = (hops, &mut request) {
            // From a client that named none: every forward of it (to the next leader after a
            // failover too) is then the same submission to the log.
            spec.submit_key.get_or_insert_with(rand::random);
        }
        match request {
            Request::Raft { kind, payload } => consensus::handle_raft_rpc(&self.raft, self.state.snapshot_inbox(), kind, &payload)
                .await
                .map(|payload| Reply::Raft { payload }),
            Request::Launch { job, nodes, issued_index } => self.launch_if_current(*job, nodes, issued_index).await,
            Request::Kill { job, run, checkpoint } => self.agent.kill(job, run, checkpoint),
            Request::ApplyMigLayout { gpu, profiles } => self.apply_mig_layout(gpu, profiles),
            Request::SignalPart { job, run, signal, batch_only } => self.agent.signal(job, run, signal, batch_only),
            Request::SuspendPart { job, run, suspend, paused_ms } => {
                self.agent.suspend(job, run, crate::launcher::Pause { suspended: suspend, paused_ms })
            }
            Request::Logs { job, stream, offset, max_bytes } => self.logs(hops, job, stream, offset, max_bytes, user).await,
            Request::Enroll { secret, name, csr_pem } => self.enroll(&secret, &name, &csr_pem),
            Request::StepLaunch { job, spec } if !self.agent.runs_script_of(job) => {
                // `srun --jobid` from another node: the job's first node numbers and starts it.
                let first = self.state.read(|s| {
                    let j = s.jobs.get(&job).filter(|j| j.state == JobState::Running)?;
                    s.nodes.get(j.run_nodes().first()?).map(|n| n.name.clone())
                });
                let first = first.ok_or_else(|| ApiError::NotFound(format!("job {job} is not running")))?;
                let timeout = PEER_CALL_TIMEOUT + Duration::from_millis(STEP_START_PATIENCE_MS);
                self.to_run_node(hops, job, &first, Request::StepLaunch { job, spec }, user, timeout).await
            }
            Request::StepLaunch { job, spec } => self.launch_step(job, spec, user).await,
            Request::StepStart { job, run, step, spec } => self.agent.start_step(job, run, step, &spec, user.as_deref()).await,
            Request::StepHold { job, run, step, spec, release } => self.agent.hold_step(job, run, step, &spec, release, user.as_deref()),
            request @ (Request::StepRead { .. }
            | Request::StepInput { .. }
            | Request::StepSignal { .. }
            | Request::StepResize { .. }
            | Request::StepUsage { .. }) => self.step_request(hops, request, user).await,
            Request::IssueToken { user: wanted, lifespan_s } => self.issue_token(user.as_deref(), wanted, lifespan_s),
            Request::CheckCert { fingerprint, common_name } => {
                self.require_admin(user.as_deref(), "check certificates")?;
                let revoked = self.state.read(|s| s.revoked_certs.get(&fingerprint).or_else(|| s.revoked_nodes.get(&common_name)).cloned());
                match revoked {
                    Some(why) => Err(ApiError::Denied(format!("certificate revoked: {why}"))),
                    None => Ok(Reply::Ok),
                }
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
                    && !matches!(
                        request,
                        Request::ClusterInfo
                            | Request::Members
                            | Request::GetPolicy
                            | Request::GetAccounts
                            | Request::GetShares
                            | Request::GetPriorities { .. }
                            | Request::ShowConfig
                            | Request::AccountingDigest
                    )
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
        if self.state.read(|s| s.jobs.get(&job).is_some_and(Job::suspended)) {
            // Slurm's srun waits for the job's resumption.
            return Err(ApiError::Busy(proto::STEPS_DISABLED_SUSPENDED.into()));
        }
        let numbered = self.agent.number_step(job, user.as_deref())?;
        let step = numbered.step;
        let result = self.hold_record_and_launch(job, spec, user, numbered).await;
        if matches!(result, Err(ApiError::Busy(_) | ApiError::Invalid(_) | ApiError::Unavailable(_) | ApiError::NoLeader)) {
            // Not started anywhere (it waits for its share of the job, asks more than the job
            // has, or the log could not take its record): its number is given back, so a step
            // that waits or is asked for again does not use numbers up.
            self.agent.unnumber_step(job, step);
        }
        result
    }

    /// Holds the share of numbered step `spec` on each of its nodes (unless it holds nothing),
    /// then has the log record it, then starts it: a step that does not fit is never recorded.
    async fn hold_record_and_launch(
        self: &Arc<Self>,
        job: JobId,
        spec: proto::StepSpec,
        user: Option<String>,
        numbered: crate::agent::NumberedStep,
    ) -> Response {
        let mut targets = Vec::new();
        for n in &spec.nodes {
            let Some((_, addr)) = numbered.nodes.iter().find(|(name, _)| *name == n.name) else {
                return Err(ApiError::Invalid(format!("node {} is not in the allocation of job {job}", n.name)));
            };
            targets.push((n.name.clone(), addr.clone()));
        }
        if !spec.overlap && !spec.unrecorded {
            self.hold_step_everywhere(job, numbered.run, numbered.step, &spec, &targets, &user).await?;
        }
        if !spec.unrecorded {
            self.record_step(job, numbered.run, numbered.step, &spec).await?;
        }
        self.launch_numbered_step(job, spec, user, numbered, targets).await
    }

    /// Has the log record step `step` before its tasks start, as slurmctld records a step
    /// before any task runs (`sacct`'s `ID.N` line): the step is not started without it.
    async fn record_step(&self, job: JobId, run: proto::RunNo, step: u32, spec: &proto::StepSpec) -> Result<(), ApiError> {
        let program = spec.argv.first().map_or("", String::as_str);
        let mut name = spec.name.clone().unwrap_or_else(|| program.rsplit('/').next().unwrap_or(program).to_string());
        if name.len() > proto::limits::STEP_NAME_BYTES_MAX {
            let mut cut = proto::limits::STEP_NAME_BYTES_MAX;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name.truncate(cut);
        }
        let nodes: Vec<String> = spec.nodes.iter().map(|n| n.name.clone()).collect();
        let ntasks = spec.nodes.iter().map(|n| n.ranks.len() as u32).sum();
        let request = Request::RecordStep { job, run, step, name, nodes, ntasks };
        match self.agent_link.call(request, 0).await {
            Ok(_) => Ok(()),
            Err(LinkError::Api(e)) => Err(e),
            Err(LinkError::Unreachable(e)) => Err(ApiError::Unavailable(format!("record step {job}.{step}: {e}"))),
        }
    }

    async fn launch_numbered_step(
        self: &Arc<Self>,
        job: JobId,
        spec: proto::StepSpec,
        user: Option<String>,
        numbered: crate::agent::NumberedStep,
        targets: Vec<(String, String)>,
    ) -> Response {
        let (run, step) = (numbered.run, numbered.step);
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
                    // Its share was held by other steps (its hold had lapsed): the caller asks
                    // again; or it asks more than the job has (a one-node step).
                    Ok((_, _, Err(e @ (ApiError::Busy(_) | ApiError::Invalid(_))))) if spec.nodes.len() == 1 => return Err(e),
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

    /// Has every node of a step hold its share of the step's resources
    /// ([`Request::StepHold`]) before any starts its tasks; where one cannot, gives back the
    /// holds the others took and answers why (busy: the caller asks again).
    async fn hold_step_everywhere(
        self: &Arc<Self>,
        job: JobId,
        run: proto::RunNo,
        step: u32,
        spec: &proto::StepSpec,
        targets: &[(String, String)],
        user: &Option<String>,
    ) -> Result<(), ApiError> {
        let holds = targets.iter().map(|(name, addr)| self.hold_step_on(job, run, step, spec, name, addr, false, user));
        let results = futures_util::future::join_all(holds).await;
        if results.iter().all(Result::is_ok) {
            return Ok(());
        }
        let held = targets.iter().zip(&results).filter(|(_, r)| r.is_ok());
        let releases = held.map(|((name, addr), _)| self.hold_step_on(job, run, step, spec, name, addr, true, user));
        for (r, (name, _)) in futures_util::future::join_all(releases).await.into_iter().zip(targets) {
            if let Err(e) = r {
                // Dropped there once no start took it in time.
                debug!(job, step, node = %name, error = %e, "give a step's hold back");
            }
        }
        debug!(job, step, results = ?results, "a step hold refused");
        // One that never fits says so first; then one that waits.
        let mut errors: Vec<ApiError> = results.into_iter().filter_map(Result::err).collect();
        errors.sort_by_key(|e| match e {
            ApiError::Invalid(_) => 0,
            ApiError::Busy(_) => 1,
            _ => 2,
        });
        Err(errors.into_iter().next().unwrap_or_else(|| ApiError::Internal("a hold failed without an error".into())))
    }

    /// Asks node `name` at `addr` (this one, directly) to hold, or give back, its share of a step.
    #[allow(clippy::too_many_arguments)]
    async fn hold_step_on(
        &self,
        job: JobId,
        run: proto::RunNo,
        step: u32,
        spec: &proto::StepSpec,
        name: &str,
        addr: &str,
        release: bool,
        user: &Option<String>,
    ) -> Result<(), ApiError> {
        if name == self.config.name {
            return self.agent.hold_step(job, run, step, spec, release, user.as_deref()).map(drop);
        }
        let request = Request::StepHold { job, run, step, spec: spec.clone(), release };
        let env = Envelope { hops: 0, request, user: user.clone() };
        let reply = self.client.call(addr, &env, PEER_CALL_TIMEOUT).await;
        reply.unwrap_or_else(|e| Err(ApiError::Unavailable(format!("reach {addr}: {e}")))).map(drop)
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
        // A node of the run knows its peers; any other (a step started by `srun --jobid` from
        // outside the allocation) reads the address from the replicated state.
        let addr = self
            .agent
            .run_node_addr(job, name)
            .or_else(|| self.state.read(|s| s.node_by_name(name).map(|n| n.addr.clone())))
            .ok_or_else(|| ApiError::NotFound(format!("node {name} in job {job}'s run")))?;
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
                // names another (or the hold has passed and it is tried again), the request waits
                // for the next leader instead of a handshake with this one.
                let held = (*lock(&self.unreachable_leader))
                    .filter(|(dead, _)| *dead == l)
                    .map(|(_, at)| UNREACHABLE_LEADER_HOLD.saturating_sub(at.elapsed()))
                    .filter(|left| !left.is_zero());
                if let Some(left) = held {
                    return self.forward_to_next_leader(l, hops, request, user, left, || ApiError::NoLeader).await;
                }
                let env = Envelope { hops: hops + 1, request, user };
                let call = self.client.call_failing_on_silence(&addr, &env, PEER_CALL_TIMEOUT, FORWARD_CONNECT_TIMEOUT);
                // A leader that died with this request in flight never answers; QUIC notices the
                // connection is gone only after its loss timers. An election names the next
                // leader sooner: stop waiting then, and ask that one.
                let outcome = tokio::select! {
                    outcome = call => Some(outcome),
                    () = consensus::leader_changed_from(&self.raft, l) => None,
                };
                let Envelope { request, user, .. } = env;
                match outcome {
                    Some(Ok(resp)) => resp,
                    None => {
                        let replaced = || ApiError::Unavailable(format!("leader {l} was replaced while a forwarded request waited"));
                        self.forward_to_next_leader(l, hops, request, user, NEXT_LEADER_WAIT, replaced).await
                    }
                    Some(Err(e)) => {
                        let failed = || ApiError::Unavailable(format!("forward to leader {addr}: {e}"));
                        // No handshake, or a request it never acknowledged: most likely dead.
                        if !matches!(e, transport::CallError::Connect(_) | transport::CallError::Silent(_)) {
                            return Err(failed());
                        }
                        *lock(&self.unreachable_leader) = Some((l, Instant::now()));
                        self.forward_to_next_leader(l, hops, request, user, NEXT_LEADER_WAIT, failed).await
                    }
                }
            }
            _ if self.is_member() => Err(ApiError::NoLeader),
            _ => match self.forward_link.forward_as(request, hops + 1, user).await {
                Ok(reply) => Ok(reply),
                Err(LinkError::Api(e)) => Err(e),
                Err(LinkError::Unreachable(e)) => Err(ApiError::Unavailable(e)),
            },
        }
    }

    /// A request for leader `dead`, which this node found unreachable (no handshake, or the
    /// request went unacknowledged) or which an election replaced while the request waited,
    /// waits for the next leader, at most `wait` ([`NEXT_LEADER_WAIT`], or what is left of the
    /// hold on a leader found unreachable before), and goes there (or is handled here, if this
    /// node was elected). The client, which would only send it again through
    /// another member that may not know yet, gets its answer as soon as an election ends.
    /// Sending it again is what the client did before: as after any lost reply, the request
    /// may or may not have been applied (a submission's key makes a resend answer with the job
    /// the first made, `consensus::submit_keys`). Without a new leader in time, `otherwise`.
    async fn forward_to_next_leader(
        &self,
        dead: NodeId,
        hops: u8,
        request: Request,
        user: Option<String>,
        wait: Duration,
        otherwise: impl FnOnce() -> ApiError,
    ) -> Response {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, consensus::next_leader_ready(&self.raft, dead)).await.is_err() {
                return Err(otherwise());
            }
            let response = if !self.is_leader() {
                Box::pin(self.forward(hops + 1, request.clone(), user.clone())).await
            } else if request.needs_leader() {
                Box::pin(self.handle_on_leader(request.clone(), user.clone())).await
            } else {
                self.read(request.clone())
            };
            // Just elected, a leader may not lead yet for a moment in its own eyes (its metrics
            // lag the votes its followers saw): ask again shortly, until the deadline.
            match response {
                Err(ApiError::NoLeader | ApiError::Unavailable(_)) if Instant::now() + NEXT_LEADER_RETRY < deadline => {
                    tokio::time::sleep(NEXT_LEADER_RETRY).await;
                }
                other => return other,
            }
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
            Request::GetAccounts => {
                let (accounts, policy) = self.state.read(|s| (Box::new((*s.accounts).clone()), s.policy.clone()));
                Ok(Reply::Accounts { accounts, policy })
            }
            Request::ShowConfig => Ok(Reply::Config(self.show_config())),
            Request::TestSubmit { spec } => self.test_submit(spec),
            Request::GetShares => Ok(Reply::Shares(self.shares())),
            Request::GetPriorities { jobs, users } => Ok(self.priorities(&jobs, &users)),
            other => Err(ApiError::Invalid(format!("not a read request: {other:?}"))),
        }
    }

    /// `scontrol show config`: this node's settings, and the priority's from the replicated
    /// policy and the scheduler's weights.
    fn show_config(&self) -> Vec<(String, String)> {
        let mut out = self.config.slurm_config(self.agent.confines_jobs());
        let half_life_min = self.state.read(|s| s.policy.decay_half_life_ms() / 60_000);
        let (days, rest) = (half_life_min / 1440, half_life_min % 1440);
        let half_life =
            if days > 0 { format!("{days}-{:02}:{:02}:00", rest / 60, rest % 60) } else { format!("{:02}:{:02}:00", rest / 60, rest % 60) };
        let w = scheduler::SchedulerConfig::default().weights;
        out.extend([
            ("PriorityDecayHalfLife".to_string(), half_life),
            ("PriorityWeightAge".to_string(), w.age.to_string()),
            ("PriorityWeightFairShare".to_string(), w.fair_share.to_string()),
            ("PriorityWeightJobSize".to_string(), w.job_size.to_string()),
            ("PriorityWeightPartition".to_string(), w.partition.to_string()),
            ("PriorityWeightQOS".to_string(), w.qos.to_string()),
        ]);
        out.sort_by_key(|(k, _)| k.to_ascii_lowercase());
        out
    }

    /// `sshare`: Fair Tree over this node's state, usage decayed to now.
    fn shares(&self) -> Vec<proto::accounts::ShareLine> {
        use proto::accounts::ppm;
        let view = self.scheduler_view();
        let shares = scheduler::priority::fair_shares(&view, now_ms());
        shares
            .rows
            .into_iter()
            .map(|r| proto::accounts::ShareLine {
                account: r.account,
                user: r.user,
                depth: r.depth,
                raw_shares: r.raw_shares,
                norm_shares_ppm: ppm(r.norm_shares),
                usage_gpu_s: (r.usage_gpu_ms / 1000.0).round() as u64,
                effective_usage_ppm: ppm(r.effective_usage),
                level_fs_ppm: r.level_fs.map(ppm),
                fair_share_ppm: r.fair_share.map(ppm),
            })
            .collect()
    }

    /// `sprio`: the priority factors of the pending jobs of `jobs` and `users` (empty: any).
    fn priorities(&self, jobs: &[JobId], users: &[String]) -> Reply {
        use proto::accounts::ppm;
        let view = self.scheduler_view();
        let factors = scheduler::priority::factors(&view, now_ms());
        let w = &view.config.weights;
        let weights = [w.age, w.fair_share, w.job_size, w.partition, w.qos];
        let default_partition =
            view.partitions.values().find(|p| p.default).map_or(view.config.default_partition.as_str(), |p| p.name.as_str());
        let lines = view
            .jobs
            .iter()
            .zip(factors)
            .filter(|(j, _)| j.state == proto::JobState::Pending)
            .filter(|(j, _)| jobs.is_empty() || jobs.contains(&j.id))
            .filter(|(j, _)| users.is_empty() || users.contains(&j.user))
            .filter_map(|(j, f)| {
                let f = f?;
                Some(proto::accounts::PriorityLine {
                    job: j.id,
                    user: j.user.clone(),
                    partition: j.partition.clone().unwrap_or_else(|| default_partition.to_string()),
                    priority: f.priority,
                    factors_ppm: [ppm(f.age), ppm(f.fair_share), ppm(f.size), ppm(f.partition), ppm(f.qos)],
                    nice: f.nice,
                })
            })
            .collect();
        Reply::Priorities { weights, jobs: lines }
    }

    /// `sbatch --test-only`: submits `spec` to a copy of the state and asks the scheduler what it
    /// would do with it now; the log is not touched.
    fn test_submit(&self, mut spec: proto::JobSpec) -> Response {
        spec.fill_default_mem();
        self.bind_defaults(&mut spec);
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
        let base = self.state.read(|s| s.nodes.get(&self.id).map(|n| (*n.inventory).clone())).unwrap_or_else(|| self.inventory.clone());
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
                        partitions: s.policy.partitions_of_node(&n.name, &n.inventory.partitions),
                        mig: mig_gpus(n),
                    }
                })
                .collect()
        })
    }

    /// This node's GPU sampler (its probe's: a simulated machine is sampled as it is now).
    pub fn gpu_sampler(&self) -> Arc<dyn crate::gpu::GpuSampler> {
        self.probe.sampler()
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

    /// A request about a running step's tasks on one node: answered by the agent when it is
    /// this node, else passed to that node through the job's run.
    async fn step_request(&self, hops: u8, request: Request, user: Option<String>) -> Response {
        match request {
            Request::StepRead { job, step, node, offset, exits_seen, wait_ms } => {
                if node == self.config.name {
                    return self.agent.read_step(job, step, offset, exits_seen, wait_ms, user.as_deref()).await;
                }
                let wait = Duration::from_millis(u64::from(wait_ms.min(proto::limits::STEP_READ_WAIT_MS_MAX)));
                let request = Request::StepRead { job, step, node: node.clone(), offset, exits_seen, wait_ms };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT + wait).await
            }
            Request::StepInput { job, step, node, offset, data, eof } => {
                if node == self.config.name {
                    return self.agent.step_input(job, step, offset, &data, eof, user.as_deref()).await;
                }
                let request = Request::StepInput { job, step, node: node.clone(), offset, data, eof };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            Request::StepSignal { job, step, node, signal } => {
                if node == self.config.name {
                    return self.agent.signal_step(job, step, signal, user.as_deref());
                }
                let request = Request::StepSignal { job, step, node: node.clone(), signal };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            Request::StepResize { job, step, node, size } => {
                if node == self.config.name {
                    return self.agent.resize_step(job, step, size, user.as_deref()).await;
                }
                let request = Request::StepResize { job, step, node: node.clone(), size };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            Request::StepUsage { job, node } => {
                if node == self.config.name {
                    return self.agent.step_usage(job, user.as_deref()).await;
                }
                let request = Request::StepUsage { job, node: node.clone() };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            other => Err(ApiError::Invalid(format!("not a step request: {other:?}"))),
        }
    }

    /// A REST API token (`scontrol token`) for `wanted` (none: the caller; root for an admin
    /// acting as the node), signed with the key every node derives from the member secret.
    fn issue_token(&self, caller: Option<&str>, wanted: Option<String>, lifespan_s: Option<u64>) -> Response {
        let who = caller.unwrap_or("root");
        let user = wanted.unwrap_or_else(|| who.to_string());
        if user != who {
            self.require_admin(caller, "issue tokens for other users")?;
        }
        if user.is_empty() || user.len() > 64 || !user.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return Err(ApiError::Invalid(format!("invalid user name {user:?}")));
        }
        let lifespan_s = lifespan_s.unwrap_or(TOKEN_LIFESPAN_S_DEFAULT);
        if lifespan_s == 0 || lifespan_s > TOKEN_LIFESPAN_S_MAX {
            return Err(ApiError::Invalid(format!("lifespan must be 1..={TOKEN_LIFESPAN_S_MAX} seconds")));
        }
        let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let key = transport::token::key(&self.config.join_token);
        info!(user = %user, by = %who, lifespan_s, "issued a REST API token");
        Ok(Reply::Token(transport::token::sign(&key, &user, now_s, now_s + lifespan_s)))
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
        // What the cluster had decided when this node last heard from it, as of the check: a
        // newer acknowledgement (this node paused or cut off meanwhile, and back) may carry a
        // decision that makes the run stale, so the launch is checked again (`Agent::launch`).
        let checked_ack_index = self.agent.ack_commit_index();
        let current = if self.is_member() {
            let wanted = issued_index.max(checked_ack_index);
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
        self.launch_here(job, nodes, checked_ack_index).await
    }

    /// Starts this node's part of `job` off the async workers: a launch syncs the ledger and
    /// creates the run's directory and cgroups, and a burst of them (a plan places a whole
    /// node's worth at once) must not hold up Raft's heartbeats on the same workers.
    async fn launch_here(&self, job: Job, nodes: Vec<(String, String)>, checked_ack_index: u64) -> Response {
        let agent = Arc::clone(&self.agent);
        tokio::task::spawn_blocking(move || agent.launch(job, &nodes, checked_ack_index))
            .await
            .unwrap_or_else(|e| Err(ApiError::Internal(format!("launch task failed: {e}"))))
    }

    /// An operator's requeue of `job` (then held when `hold`), refused in Slurm's words for the
    /// jobs Slurm refuses; the state machine refuses pending jobs.
    async fn requeue(&self, job: JobId, hold: bool, now: u64) -> Response {
        // A job's spec never changes its requeue flags; its state may (the log decides).
        let read = self.state.read(|s| s.jobs.get(&job).map(|j| (j.spec.requeue_refusal(), j.state == proto::JobState::Pending)));
        match read {
            None => return Err(ApiError::NotFound(format!("job {job}"))),
            Some((Some(why), _)) => return Err(ApiError::Invalid(why.into())),
            Some((None, true)) if hold => return Err(ApiError::Invalid("Job is pending execution".into())),
            Some((None, _)) => {}
        }
        let requeue = Command::Requeue { job, reason: proto::REQUEUED_ON_REQUEST.into(), now_ms: now };
        let result = if hold {
            let held = Command::UpdateJob { job, hold: Some(true), time_limit_ms: None, partition: None, now_ms: now };
            // One entry, so a finished job cannot start between the two. A job that was pending
            // is refused above; one that became pending since (requeued by another request or
            // the cluster) fails the requeue here and is held, as asked.
            match self.propose(Command::Batch { commands: vec![requeue, held] }).await? {
                CommandResult::Batch(results) => {
                    results.into_iter().find(|r| *r != CommandResult::Ok).map_or(Ok(Reply::Ok), |r| Err(rejected(r)))
                }
                other => Err(rejected(other)),
            }
        } else {
            self.propose(requeue).await.and_then(ok_or_rejected)
        };
        self.kick.notify_one();
        result
    }

    /// Who may ask the leader what: the owner of a job (or an admin) changes it, an admin the
    /// cluster.
    fn authorize_on_leader(&self, request: &Request, who: Option<&str>) -> Result<(), ApiError> {
        match request {
            Request::Cancel { job } => self.require_owner(who, *job, "cancel")?,
            Request::Requeue { job } | Request::RequeueHold { job } => self.require_owner(who, *job, "requeue")?,
            Request::UpdateJob { job, .. } => self.require_owner(who, *job, "update")?,
            Request::Signal { job, .. } => self.require_owner(who, *job, "signal")?,
            // Slurm: only an operator or administrator suspends or resumes a job.
            Request::Suspend { .. } => self.require_admin(who, "suspend or resume jobs")?,
            Request::Drain { .. } => self.require_admin(who, "drain nodes")?,
            Request::Resume { .. } => self.require_admin(who, "resume nodes")?,
            Request::SetPolicy { .. } | Request::EditPartition { .. } => self.require_admin(who, "change the scheduling policy")?,
            Request::EditAccounts { .. } => self.require_admin(who, "change accounts, users and QOS")?,
            Request::SetGpuHealth { .. } => self.require_admin(who, "change GPU health")?,
            Request::SetMigLayout { .. } => self.require_admin(who, "set MIG layouts")?,
            Request::CreateJoinToken { .. } => self.require_admin(who, "create join tokens")?,
            Request::RevokeJoinToken { .. } => self.require_admin(who, "revoke join tokens")?,
            Request::RevokeCert { .. } => self.require_admin(who, "revoke certificates")?,
            _ => {}
        }
        Ok(())
    }

    /// A job that names no partition is the default partition's as of its submission, as in
    /// Slurm: it stays there when an admin makes another partition the default. Once accounts
    /// are enforced, one that names no account, QoS or time limit gets its user's defaults
    /// (`ClusterState::bind_accounting`).
    fn bind_defaults(&self, spec: &mut proto::JobSpec) {
        self.state.read(|s| {
            if spec.partition.is_none() {
                spec.partition = Some(s.policy.default_partition_name().to_string());
            }
            s.bind_accounting(spec);
        });
    }

    /// Submits a job: its user is the one the certificate names, not the client's environment.
    async fn submit(&self, mut spec: proto::JobSpec, user: Option<&str>, now: u64) -> Response {
        if let Some(u) = user {
            spec.user = u.to_string();
        }
        spec.fill_default_mem();
        self.bind_defaults(&mut spec);
        spec.validate().map_err(ApiError::Invalid)?;
        if spec.nice() < 0 && !self.is_admin(user) {
            // Slurm 22.05's answer to a user's negative --nice (an admin's raises the priority).
            return Err(ApiError::Invalid("Invalid --nice value".into()));
        }
        if let Some(why) = self.state.read(|s| s.undefined_in_submission(&spec).or_else(|| s.accounting_refusal(&spec))) {
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

    /// Creates a join token: only its hash is replicated; the secret is in the reply alone.
    async fn create_join_token(&self, ttl_ms: u64, who: Option<&str>, now: u64) -> Response {
        if ttl_ms == 0 || ttl_ms > JOIN_TOKEN_TTL_MS_MAX {
            return Err(ApiError::Invalid(format!("a join token lives 1..={JOIN_TOKEN_TTL_MS_MAX} ms")));
        }
        let secret = hex::encode(rand::random::<[u8; 32]>());
        let secret_sha256 = sha256_hex(secret.as_bytes());
        let expires_ms = now.saturating_add(ttl_ms);
        let created_by = who.unwrap_or("root").to_string();
        let cmd = Command::AddJoinToken { secret_sha256: secret_sha256.clone(), expires_ms, created_by: created_by.clone(), now_ms: now };
        ok_or_rejected(self.propose(cmd).await?)?;
        let id = self.state.read(|s| s.join_tokens.values().find(|t| t.secret_sha256 == secret_sha256).map(|t| t.id)).unwrap_or(0);
        info!(id, by = %created_by, expires_ms, "join token created");
        Ok(Reply::JoinTokenCreated { id, secret, expires_ms })
    }

    /// Revokes a node's certificates (the one it joined with and every later one of its name)
    /// or one certificate by fingerprint.
    async fn revoke_cert(&self, node: Option<String>, fingerprint: Option<String>, who: Option<&str>, now: u64) -> Response {
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

    /// A node's batch of run reports, proposed at once (the proposer packs them into as few
    /// entries as fit).
    async fn report_runs(&self, node: NodeId, reports: Vec<proto::RunReport>, now: u64) -> Response {
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

    /// A node's step ends, proposed at once (the proposer packs them into as few entries as
    /// fit); one the log refuses (a second report after a handover) is ignored.
    async fn report_step_ends(&self, node: String, ends: Vec<proto::StepEnd>, now: u64) -> Response {
        if ends.len() > proto::STEP_ENDS_PER_REQUEST_MAX {
            return Err(ApiError::Invalid(format!(
                "{} step ends in one request, more than {}",
                ends.len(),
                proto::STEP_ENDS_PER_REQUEST_MAX
            )));
        }
        let proposals = ends.into_iter().map(|e| {
            let (job, step) = (e.job, e.step);
            let cmd =
                Command::StepEnded { job, run: e.run, step, node: node.clone(), exit_code: e.exit_code, signal: e.signal, now_ms: now };
            async move { (job, step, self.propose(cmd).await) }
        });
        for (job, step, result) in futures_util::future::join_all(proposals).await {
            if let CommandResult::Rejected(why) = result? {
                debug!(job, step, why = %why, "step end ignored");
            }
        }
        Ok(Reply::Ok)
    }

    /// Signals every part of a running job's current run, on whichever nodes they are.
    async fn signal_job(&self, job: JobId, signal: i32, batch_only: bool) -> Response {
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

    /// Registers a node that presents the cluster's join token (a new node, or a node's new
    /// instance), with a fresh heartbeat grace period.
    #[allow(clippy::too_many_arguments)]
    async fn join(
        &self,
        token: String,
        name: String,
        addr: String,
        inventory: Inventory,
        instance: InstanceId,
        cert_fingerprint: String,
        now: u64,
    ) -> Response {
        if !constant_time_eq(token.as_bytes(), self.config.join_token.as_bytes()) {
            warn!(node = %name, "join refused: bad token");
            return Err(ApiError::Denied("bad join token".into()));
        }
        let cmd = Command::RegisterNode { name: name.clone(), addr, inventory, instance, cert_fingerprint, now_ms: now };
        match self.propose(cmd).await? {
            CommandResult::NodeRegistered { id } => {
                lock(&self.memory).heard_from(id, Instant::now(), self.config.node_down_after_ms);
                info!(node = %name, id, "node registered");
                self.kick.notify_one();
                Ok(Reply::Joined { id, name })
            }
            other => Err(rejected(other)),
        }
    }

    /// A relay's batch of heartbeats.
    async fn heartbeats(&self, beats: &[proto::Beat]) -> Response {
        if beats.len() > proto::HEARTBEATS_PER_REQUEST_MAX {
            return Err(ApiError::Invalid(format!(
                "{} heartbeats in one request, more than {}",
                beats.len(),
                proto::HEARTBEATS_PER_REQUEST_MAX
            )));
        }
        let (leader, term, commit_index, refused) = self.accept_heartbeats(beats).await?;
        Ok(Reply::HeartbeatAcks { leader, term, commit_index, refused })
    }

    async fn handle_on_leader(&self, request: Request, user: Option<String>) -> Response {
        let now = now_ms();
        let who = user.as_deref();
        self.authorize_on_leader(&request, who)?;
        match request {
            Request::Submit { spec } => self.submit(spec, user.as_deref(), now).await,
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
            Request::CreateJoinToken { ttl_ms } => self.create_join_token(ttl_ms, who, now).await,
            Request::RevokeJoinToken { id } => {
                ok_or_rejected(self.propose(Command::RevokeJoinToken { id, now_ms: now }).await?)?;
                info!(id, by = %who.unwrap_or("root"), "join token revoked");
                Ok(Reply::Ok)
            }
            Request::RevokeCert { node, fingerprint } => self.revoke_cert(node, fingerprint, who, now).await,
            Request::Join { token, name, addr, inventory, instance, cert_fingerprint } => {
                self.join(token, name, addr, inventory, instance, cert_fingerprint, now).await
            }
            Request::Heartbeat { node, instance, running: _ } => {
                let (leader, term, commit_index, refused) = self.accept_heartbeats(&[proto::Beat { node, instance }]).await?;
                match refused.into_iter().next() {
                    Some((_, e)) => Err(e),
                    None => Ok(Reply::HeartbeatAck { leader, term, commit_index }),
                }
            }
            Request::Heartbeats { relay: _, beats } => self.heartbeats(&beats).await,
            Request::ReportRun { job, run, node, outcome, usage } => {
                match self.propose(Command::RunFinished { job, run, node, outcome, usage, now_ms: now }).await? {
                    CommandResult::Rejected(why) => debug!(job, run, why = %why, "run report ignored"),
                    _ => self.kick.notify_one(),
                }
                Ok(Reply::Ok)
            }
            Request::ReportRuns { node, reports } => self.report_runs(node, reports, now).await,
            Request::NodeStopped { node, instance } => {
                info!(node, instance, "node stopped gracefully: down at once");
                let result = self.propose(Command::NodeStopped { node, instance, now_ms: now }).await?;
                self.kick.notify_one();
                ok_or_rejected(result)
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
            Request::SetMigLayout { node, gpu, profiles } => {
                let id = self.node_id_by_name(&node)?;
                info!(node = %node, gpu, ?profiles, "operator sets a mig layout");
                let result = self.propose(Command::PinMigLayout { node: id, gpu, profiles, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            Request::ReportInventory { node, inventory, reason } => {
                self.propose(Command::UpdateInventory { node, inventory, reason, now_ms: now }).await.and_then(ok_or_rejected)
            }
            Request::SetPolicy { policy } => {
                policy.validate().map_err(ApiError::Invalid)?;
                let result = self.propose(Command::SetPolicy { policy, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            Request::EditPartition { edit } => {
                info!(partition = %edit.name(), ?edit, "operator edits a partition");
                let result = self.propose(Command::EditPartition { edit, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            Request::EditAccounts { edits } => {
                info!(?edits, by = who.unwrap_or("root"), "operator edits accounts");
                let result = self.propose(Command::EditAccounts { edits, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            request => self.change_job_on_leader(request, who, now).await,
        }
    }

    /// The leader's part of what changes a job's run: requeues, updates, signals, suspensions
    /// and its steps' records.
    async fn change_job_on_leader(&self, request: Request, who: Option<&str>, now: u64) -> Response {
        match request {
            Request::Requeue { job } => self.requeue(job, false, now).await,
            Request::RequeueHold { job } => self.requeue(job, true, now).await,
            Request::UpdateJob { job, hold, time_limit_ms, partition } => {
                let cmd = Command::UpdateJob { job, hold, time_limit_ms, partition, now_ms: now };
                let result = self.propose(cmd).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            Request::Signal { job, signal, batch_only } => self.signal_job(job, signal, batch_only).await,
            Request::RecordStep { job, run, step, name, nodes, ntasks } => {
                let cmd = Command::StepStarted { job, run, step, name, nodes, ntasks, now_ms: now };
                self.propose(cmd).await.and_then(ok_or_rejected)
            }
            Request::ReportStepEnds { node, ends } => self.report_step_ends(node, ends, now).await,
            Request::Suspend { job, suspend } => {
                info!(job, suspend, by = %who.unwrap_or("root"), "operator suspends or resumes a job");
                let result = self.propose(Command::Suspend { job, suspend, now_ms: now }).await.and_then(ok_or_rejected);
                // Its nodes are told on the next pass.
                self.kick.notify_one();
                result
            }
            other => Err(ApiError::Invalid(format!("not a leader request: {other:?}"))),
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

/// `node`'s MIG-mode GPUs with their layouts, as reported and as pinned.
fn mig_gpus(node: &proto::NodeRecord) -> Vec<proto::MigGpuInfo> {
    node.inventory
        .gpus
        .iter()
        .filter_map(|g| {
            let layout = node.inventory.mig_layout(g.index)?;
            Some(proto::MigGpuInfo { gpu: g.index, layout, pinned: node.mig_pinned.get(&g.index).cloned() })
        })
        .collect()
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

/// Requests only a node may send (a client's are forwarded by its node, under the node's name).
fn node_only(request: &Request) -> bool {
    matches!(
        request,
        Request::Raft { .. }
            | Request::Join { .. }
            | Request::Heartbeat { .. }
            | Request::ReportRun { .. }
            | Request::ReportRuns { .. }
            | Request::NodeStopped { .. }
            | Request::Launch { .. }
            | Request::Kill { .. }
            | Request::ReportGpuHealth { .. }
            | Request::ReportInventory { .. }
            | Request::ApplyMigLayout { .. }
            | Request::SignalPart { .. }
            | Request::SuspendPart { .. }
            | Request::RecordStep { .. }
            | Request::ReportStepEnds { .. }
            | Request::StepStart { .. }
            | Request::StepHold { .. }
    )
}

/// The handler registered with the QUIC server before the node is fully up: until Raft is
/// open it answers `Unavailable`.
pub struct Api {
    node: OnceLock<Arc<Node>>,
    fault: Arc<crate::fault::FaultSwitch>,
}

impl Handler for Api {
    /// Heartbeats, and the members a node asks for after every new term: small, idempotent,
    /// sent by every node of a fleet at once, mended by asking again.
    fn takes_datagram(&self, envelope: &Envelope) -> bool {
        matches!(envelope.request, Request::Heartbeat { .. } | Request::Members)
    }

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
        // the node (an admin), and like a node forwarding a request it may act for a user it
        // names (`corral restd` for its HTTPS clients); every other uid is the user of that name.
        let Some(account) = crate::identity::by_uid(peer.uid) else {
            warn!(uid = peer.uid, "refused a local caller without a user name");
            return Box::pin(async move { Err(ApiError::Denied(format!("uid {} has no user name on this node", peer.uid))) });
        };
        envelope.user = if peer.uid == 0 { envelope.user.take() } else { Some(account.name.clone()) };
        if let Request::Submit { spec } = &mut envelope.request {
            match &envelope.user {
                // As for a user's certificate: the node that runs the job looks the name up.
                Some(user) if peer.uid == 0 => {
                    spec.user = user.clone();
                    spec.uid = None;
                    spec.gid = None;
                }
                _ => {
                    spec.user = account.name.clone();
                    spec.uid = Some(peer.uid);
                    spec.gid = Some(peer.gid);
                }
            }
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
                Err(transport::CallError::Timeout | transport::CallError::Silent(_)) => Err(consensus::TransportError::Timeout),
                Err(e) => Err(consensus::TransportError::Unreachable(e.to_string())),
            }
        }
    }
}
