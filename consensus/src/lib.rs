//! The replicated job log: openraft over RocksDB and a deterministic state machine.
//! `ClusterState::apply` has no clock, no randomness, no IO; all IO is in the store and behind the
//! [`RaftTransport`] trait.
//!
//! Start a node with [`open_raft`]; propose commands with [`propose`] (or `raft.client_write`);
//! read the applied state through the [`StateHandle`]; serve peers' RPCs with
//! [`handle_raft_rpc`].

pub mod accounting;
pub mod inbox;
pub mod network;
pub mod proposer;
pub mod snapshot;
pub mod store;
pub mod types;

/// The state machine lives in its own crate, free of RocksDB; these are its old paths.
pub use corral_state::{cluster as state, submit_keys, view};

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use openraft::error::{ClientWriteError, RaftError};
use openraft::SnapshotPolicy;
use proto::{ApiError, Command, CommandResult, NodeId};

pub use corral_state::ClusterState;
pub use inbox::SnapshotInbox;
pub use network::{handle_raft_rpc, NetworkFactory, PeerClient, RaftTransport, TransportError, RAFT_PAYLOAD_BYTES_MAX};
pub use proposer::Proposer;
pub use snapshot::SnapshotData;
pub use store::{open_store, LogStore, Raft, StateHandle, StateMachine};
pub use types::{LogCommand, LogId, MemberNode, TypeConfig};

/// Timing and compaction settings of the Raft group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftTimings {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// A snapshot is built once this many entries were applied since the last one.
    pub snapshot_logs_since_last: u64,
    /// Entries already in a snapshot that are kept in the log (for slightly lagging followers).
    pub max_in_snapshot_log_to_keep: u64,
}

impl Default for RaftTimings {
    /// A leader lost is replaced after about `election_timeout_max_ms` (followers refuse votes
    /// that long after its last heartbeat) plus one election timeout. Measured on booted hosts
    /// (2026-12-07): a committed submission 763 ms after a leader's crash (median), 797 ms with
    /// 50 ms between racks, against 1,340 and 2,046 ms with 100 / 400-800 ms.
    fn default() -> Self {
        RaftTimings {
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 200,
            election_timeout_max_ms: 400,
            snapshot_logs_since_last: 1000,
            max_in_snapshot_log_to_keep: 100,
        }
    }
}

/// Time allowed to send and install a whole snapshot on a follower.
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 30_000;

/// The openraft config for `t` (not yet validated: [`open_raft`] validates it).
pub fn raft_config(t: &RaftTimings) -> openraft::Config {
    openraft::Config {
        cluster_name: "corral".to_string(),
        heartbeat_interval: t.heartbeat_interval_ms,
        election_timeout_min: t.election_timeout_min_ms,
        election_timeout_max: t.election_timeout_max_ms,
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(t.snapshot_logs_since_last),
        max_in_snapshot_log_to_keep: t.max_in_snapshot_log_to_keep,
        // Purge as soon as a snapshot allows it.
        purge_batch_size: 1,
        // A partitioned node that comes back does not depose a healthy leader.
        enable_pre_vote: Some(true),
        ..Default::default()
    }
}

/// Opens the log and state at `dir` and starts Raft node `id` on `transport`.
///
/// A fresh directory gives an uninitialized node: call `raft.initialize(..)` on exactly one node
/// of a new cluster, or have the leader add this node with `add_learner`.
///
/// `wal_sync_delay_ms` is a fault-injection hook (a slow disk): each WAL sync first waits that
/// long; keep it at zero.
pub async fn open_raft<T: RaftTransport>(
    id: NodeId,
    dir: &Path,
    transport: T,
    config: RaftTimings,
    wal_sync_delay_ms: Arc<std::sync::atomic::AtomicU64>,
) -> anyhow::Result<(Raft, StateHandle)> {
    let config = raft_config(&config).validate().context("validate raft timings")?;
    let path = dir.to_path_buf();
    let (log_store, state_machine) = tokio::task::spawn_blocking(move || store::open_store_with(&path, wal_sync_delay_ms))
        .await
        .context("join store opening task")?
        .with_context(|| format!("open raft store at {}", dir.display()))?;
    let handle = state_machine.handle();
    let network = NetworkFactory::new(id, transport);
    let raft = Raft::new(id, Arc::new(config), network, log_store, state_machine).await.with_context(|| format!("start raft node {id}"))?;
    Ok((raft, handle))
}

/// Why a proposal did not produce a result.
#[derive(Debug, thiserror::Error)]
pub enum ProposeError {
    /// This node is not the leader; nothing was appended. Retry at `leader`.
    #[error("not the leader (leader: {leader:?})")]
    NotLeader { leader: Option<NodeId>, leader_node: Option<MemberNode> },
    /// The entry was appended here but discarded on a leader change: it may or may not commit.
    #[error("leadership changed; the command may or may not have been applied (leader: {leader:?})")]
    Unknown { leader: Option<NodeId>, leader_node: Option<MemberNode> },
    /// Raft stopped, or rejected the proposal for another reason.
    #[error("raft failed: {0}")]
    Raft(String),
}

impl From<ProposeError> for ApiError {
    fn from(e: ProposeError) -> ApiError {
        match e {
            ProposeError::NotLeader { leader: None, .. } => ApiError::NoLeader,
            ProposeError::NotLeader { leader, leader_node } => ApiError::NotLeader { leader, leader_addr: leader_node.map(|n| n.addr) },
            ProposeError::Unknown { .. } => ApiError::Unavailable(e.to_string()),
            ProposeError::Raft(msg) => ApiError::Unavailable(msg),
        }
    }
}

/// Appends `cmd` to the log through this node (which must be the leader) and waits until it is
/// committed and applied here. Returns the entry's log index and what applying it answered.
pub async fn propose(raft: &Raft, cmd: Command) -> Result<(u64, CommandResult), ProposeError> {
    match raft.client_write(LogCommand(cmd)).await {
        Ok(resp) => Ok((resp.log_id.index(), resp.data)),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(ProposeError::NotLeader { leader: f.leader_id, leader_node: f.leader_node })
        }
        Err(RaftError::APIError(ClientWriteError::LogEntryDiscarded(f))) => {
            Err(ProposeError::Unknown { leader: f.leader_id, leader_node: f.leader_node })
        }
        Err(e) => Err(ProposeError::Raft(e.to_string())),
    }
}

/// What this node knows about the Raft group right now, from openraft's metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftStatus {
    pub id: NodeId,
    pub is_leader: bool,
    pub leader: Option<NodeId>,
    pub term: u64,
    /// Index of the last entry this node knows committed (openraft's `local_committed`; None
    /// before the first).
    pub commit_index: Option<u64>,
    pub applied_index: Option<u64>,
    /// Last entry covered by the latest snapshot, and last entry removed from the log.
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    /// Voters and learners of the effective membership, in id order.
    pub voters: Vec<(NodeId, MemberNode)>,
    pub learners: Vec<(NodeId, MemberNode)>,
}

/// Returns once `raft` names a leader other than `leader` (or none), from its metrics' watch:
/// no polling. Pending forever if Raft stopped (its metrics sender is gone) while `leader` led.
pub async fn leader_changed_from(raft: &Raft, leader: NodeId) {
    metrics_where(raft, |m| m.current_leader != Some(leader)).await
}

/// Returns once `raft` names a leader, and one other than `leader` if that is given.
pub async fn leader_other_than(raft: &Raft, leader: Option<NodeId>) {
    metrics_where(raft, |m| m.current_leader.is_some() && m.current_leader != leader).await
}

/// Returns once `raft` names a leader other than `dead` that is ready for requests: this node
/// once it leads (it may name itself a moment before), another one at once.
pub async fn next_leader_ready(raft: &Raft, dead: NodeId) {
    metrics_where(raft, |m| m.current_leader.is_some_and(|l| l != dead && (l != m.id || m.state.is_leader()))).await
}

/// Returns, with what stopped it, once `raft`'s core stopped for good: a storage error (the
/// disk failed) or a panic in it. The node can then neither vote nor apply.
pub async fn raft_stopped(raft: &Raft) -> String {
    metrics_where(raft, |m| m.running_state.is_err()).await;
    use openraft::async_runtime::watch::WatchReceiver;
    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    match &m.running_state {
        Err(fatal) => fatal.to_string(),
        Ok(()) => "the Raft core stopped".into(),
    }
}

/// Returns once `done` holds of `raft`'s metrics, woken by their watch (no polling).
async fn metrics_where(raft: &Raft, done: impl Fn(&openraft::RaftMetrics<TypeConfig>) -> bool) {
    use openraft::async_runtime::watch::WatchReceiver;

    let mut metrics = raft.metrics();
    loop {
        if done(&metrics.borrow_watched()) {
            return;
        }
        if metrics.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Whether `raft` leads now (asked on every request: reads the metrics, copies nothing).
pub fn is_leader(raft: &Raft) -> bool {
    use openraft::async_runtime::watch::WatchReceiver;

    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    let (leads, leader, me) = (m.state.is_leader(), m.current_leader, m.id);
    leads && leader == Some(me)
}

/// Whether `raft`'s own node is a voter or learner of its effective membership.
pub fn is_member(raft: &Raft) -> bool {
    use openraft::async_runtime::watch::WatchReceiver;

    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    let me = m.id;
    let member = m.membership_config.membership().nodes().any(|(id, _)| *id == me);
    member
}

/// Reads [`RaftStatus`] from `raft`'s metrics without waiting.
pub fn raft_status(raft: &Raft) -> RaftStatus {
    use openraft::async_runtime::watch::WatchReceiver;

    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    let membership = m.membership_config.membership();
    let voter_ids: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
    let mut voters = Vec::new();
    let mut learners = Vec::new();
    for (id, node) in membership.nodes() {
        let entry = (*id, node.clone());
        if voter_ids.contains(id) {
            voters.push(entry);
        } else {
            learners.push(entry);
        }
    }
    RaftStatus {
        id: m.id,
        is_leader: m.state.is_leader(),
        leader: m.current_leader,
        term: m.current_term,
        commit_index: m.local_committed.map(|l| l.index()),
        applied_index: m.last_applied.map(|l| l.index()),
        snapshot_index: m.snapshot.map(|l| l.index()),
        purged_index: m.purged.map(|l| l.index()),
        voters,
        learners,
    }
}
