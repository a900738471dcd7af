//! One running node: the request handler every peer and client talks to (`handle`, which routes
//! each request), with the rest by concern: who may do what (`authz`), submissions (`submit`),
//! joining and join tokens (`join`), the read-only answers (`reads`), forwarding to the leader
//! (`forward`), what only the leader answers (`on_leader`), steps (`steps`), this node's runs
//! and their output (`runs`), the handlers of the QUIC server and the local socket (`api`), the
//! leader's control loop (`leader`), heartbeats and their relay (`heartbeats`), certificates and
//! enrolment (`enrol`), and the start-up and stop of a node (`start`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use consensus::{MemberNode, Raft, StateHandle};
use proto::{
    ApiError, ClientRequest, Command, CommandResult, Envelope, InstanceId, Inventory, JobId, NodeId, NodeRole, NodeState, PeerRequest,
    Reply, Request, Response,
};
use tokio::sync::Notify;
use tracing::{debug, error, info, info_span, warn, Instrument};
use transport::Client;

use crate::agent::Agent;
use crate::config::NodeConfig;
use crate::link::{LeaderLink, LinkError};
use crate::liveness;

mod api;
mod authz;
mod enrol;
mod forward;
mod heartbeats;
mod join;
mod leader;
mod on_leader;
mod reads;
mod runs;
mod start;
mod step_moves;
mod steps;
mod submit;

pub use api::Api;
use enrol::renew_certificate_loop;
use leader::LeaderMemory;
pub use start::{heartbeat_call_timeout, relay_linger, run, Ended, StopRequest, STOP_DECLARE_MS, STOP_REPORT_MS};

pub fn now_ms() -> u64 {
    crate::fault::wall_ms()
}

const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a forward waits for a handshake with the leader (a live one answers in well under a
/// millisecond on a LAN; a dead one should cost its clients little).
const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// The longest pause after a leader tick (see `leader_loop`).
const TICK_PAUSE_MAX: Duration = Duration::from_millis(100);

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
    /// A leader (and its term) this node could not reach through a whole wait for the next
    /// leader while no election replaced it: alive, but cut off from here (`forward`).
    cut_from_leader: Mutex<Option<(NodeId, u64)>>,
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
        let now_ms = mem.now_ms();
        mem.engine.liveness.ages_ms(now_ms)
    }

    /// Commits `cmd` through Raft and returns what applying it answered.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, ApiError> {
        self.proposer.propose(cmd).await.map(|(_, result)| result).map_err(ApiError::from)
    }

    async fn handle(self: Arc<Self>, envelope: Envelope) -> Response {
        let Envelope { hops, request, user } = envelope;
        match request {
            Request::Client(request) => self.handle_client(hops, request, user).await,
            Request::Peer(request) => self.handle_peer(hops, request, user).await,
        }
    }

    /// A node's request (`Api` let only nodes, and a machine enrolling, send one): orders to
    /// this node's agent and steps are answered here, reports go to the leader.
    async fn handle_peer(&self, hops: u8, request: PeerRequest, user: Option<String>) -> Response {
        match request {
            PeerRequest::Raft { kind, payload } => consensus::handle_raft_rpc(&self.raft, self.state.snapshot_inbox(), kind, &payload)
                .await
                .map(|payload| Reply::Raft { payload }),
            PeerRequest::Launch { job, nodes, issued_index } => self.launch_if_current(*job, nodes, issued_index).await,
            PeerRequest::Kill { job, run, checkpoint } => self.agent.kill(job, run, checkpoint),
            PeerRequest::ApplyMigLayout { gpu, profiles } => self.apply_mig_layout(gpu, profiles),
            PeerRequest::SignalPart { job, run, signal, batch_only } => self.agent.signal(job, run, signal, batch_only),
            PeerRequest::SuspendPart { job, run, suspend, paused_ms, change } => {
                self.agent.suspend(job, run, crate::run::launcher::Pause { suspended: suspend, paused_ms, change })
            }
            PeerRequest::Enroll { secret, name, csr_pem } => self.enroll(&secret, &name, &csr_pem),
            PeerRequest::StepStart { job, run, step, spec } => self.agent.start_step(job, run, step, &spec, user.as_deref()).await,
            PeerRequest::StepHold { job, run, step, spec, release } => {
                self.agent.hold_step(job, run, step, &spec, release, user.as_deref())
            }
            PeerRequest::Heartbeat { node, instance, running: _ } if !self.is_leader() => {
                self.relay.relay(proto::Beat { node, instance }).await
            }
            // `Api` answers a renewal itself, with the name the caller's certificate proves.
            PeerRequest::RenewCert { .. } => Err(ApiError::Invalid("a certificate renewal is answered where it arrives".into())),
            request @ (PeerRequest::Join { .. }
            | PeerRequest::Heartbeat { .. }
            | PeerRequest::Heartbeats { .. }
            | PeerRequest::ReportRun { .. }
            | PeerRequest::ReportRuns { .. }
            | PeerRequest::NodeStopped { .. }
            | PeerRequest::ReportGpuHealth { .. }
            | PeerRequest::ReportInventory { .. }
            | PeerRequest::RecordStep { .. }
            | PeerRequest::ReportStepEnds { .. }
            | PeerRequest::Store { .. }) => self.to_leader(hops, request.into(), user).await,
        }
    }

    /// A user's request (or one a node forwards for a user): steps and output from the nodes
    /// that run them, writes on the leader, reads from this member's state.
    async fn handle_client(self: &Arc<Self>, hops: u8, mut request: ClientRequest, user: Option<String>) -> Response {
        if let (0, ClientRequest::Submit { spec }) = (hops, &mut request) {
            // From a client that named none: every forward of it (to the next leader after a
            // failover too) is then the same submission to the log.
            spec.submit_key.get_or_insert_with(rand::random);
        }
        let access = request.access();
        match request {
            ClientRequest::Logs { job, stream, offset, max_bytes } => self.logs(hops, job, stream, offset, max_bytes, user).await,
            ClientRequest::StepLaunch { job, spec } if !self.agent.runs_script_of(job) => {
                // `srun --jobid` from another node: the job's first node numbers and starts it.
                self.to_script_node(hops, job, ClientRequest::StepLaunch { job, spec }, user).await
            }
            ClientRequest::StepLaunch { job, spec } => self.launch_step(job, spec, user).await,
            ClientRequest::StepMove { job, step, lost } if !self.agent.runs_script_of(job) => {
                let request = ClientRequest::StepMove { job, step, lost };
                self.to_script_node(hops, job, request, user).await
            }
            ClientRequest::StepMove { job, step, lost } => self.move_step(job, step, lost, user).await,
            request @ (ClientRequest::StepRead { .. }
            | ClientRequest::StepInput { .. }
            | ClientRequest::StepSignal { .. }
            | ClientRequest::StepResize { .. }
            | ClientRequest::StepUsage { .. }
            | ClientRequest::GpuSeries { .. }) => self.step_request(hops, request, user).await,
            ClientRequest::GpuSamples { node } => self.gpu_samples(hops, node, user).await,
            ClientRequest::Whoami => {
                let admin = self.is_admin(user.as_deref());
                Ok(Reply::Caller { user: user.unwrap_or_else(|| "root".into()), admin })
            }
            ClientRequest::IssueToken { user: wanted, lifespan_s } => self.issue_token(user.as_deref(), wanted, lifespan_s),
            ClientRequest::CheckCert { fingerprint, common_name } => {
                self.authorize(access, user.as_deref())?;
                let revoked = self.state.read(|s| s.revoked_certs.get(&fingerprint).or_else(|| s.revoked_nodes.get(&common_name)).cloned());
                match revoked {
                    Some(why) => Err(ApiError::Denied(format!("certificate revoked: {why}"))),
                    None => Ok(Reply::Ok),
                }
            }
            ClientRequest::ListJoinTokens => {
                self.authorize(access, user.as_deref())?;
                Ok(Reply::JoinTokens(self.state.read(|s| s.join_tokens.values().cloned().collect())))
            }
            request if request.needs_leader() => self.to_leader(hops, request.into(), user).await,
            request => {
                if !self.is_member() {
                    return self.forward(hops, request, user).await;
                }
                // A node that knows no leader may be cut off or removed and hold a stale state:
                // let the client ask another node. Cluster info stays local, for diagnosis.
                if self.leader().0.is_none()
                    && !matches!(
                        request,
                        ClientRequest::ClusterInfo
                            | ClientRequest::Members
                            | ClientRequest::GetPolicy
                            | ClientRequest::GetAccounts
                            | ClientRequest::GetShares
                            | ClientRequest::NodeEvents
                            | ClientRequest::QueueSummary { .. }
                            | ClientRequest::GetPriorities { .. }
                            | ClientRequest::ShowConfig
                            | ClientRequest::AccountingDigest
                    )
                {
                    return Err(ApiError::NoLeader);
                }
                match self.read(request.clone()) {
                    // A follower may not have applied a job its client just submitted through the
                    // leader: ask the leader rather than deny the job exists.
                    Err(ApiError::NotFound(_)) if !self.is_leader() && matches!(request, ClientRequest::GetJob { .. }) => {
                        self.forward(hops, request, user).await
                    }
                    other => other,
                }
            }
        }
    }

    /// A write: carried out here on the leader, else forwarded to it.
    async fn to_leader(&self, hops: u8, request: Request, user: Option<String>) -> Response {
        if self.is_leader() {
            self.handle_on_leader(request, user).await
        } else {
            self.forward(hops, request, user).await
        }
    }

    /// This node's GPU sampler (its probe's: a simulated machine is sampled as it is now).
    pub fn gpu_sampler(&self) -> Arc<dyn crate::gpu::GpuSampler> {
        self.probe.sampler()
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
            let env = Envelope { hops: 0, request: PeerRequest::Raft { kind, payload }.into(), user: None };
            match client.call(&addr, &env, Duration::from_secs(10)).await {
                Ok(Ok(Reply::Raft { payload })) => Ok(payload),
                Ok(Ok(other)) => Err(consensus::TransportError::Remote(format!("unexpected reply {other:?}"))),
                Ok(Err(e)) => Err(consensus::TransportError::Remote(e.to_string())),
                Err(transport::CallError::Timeout | transport::CallError::Silent(_)) => Err(consensus::TransportError::Timeout),
                Err(e) => Err(consensus::TransportError::Unreachable(e.to_string())),
            }
        }
    }

    fn round_trip(&self, node: &MemberNode) -> Option<Duration> {
        self.client.round_trip(&node.addr)
    }
}
