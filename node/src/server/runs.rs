//! This node's runs: launches from the leader, checked for staleness before the agent starts
//! them; MIG layouts; and a job's output (`corral logs`), read here or where it ran.

use std::sync::Arc;
use std::time::Duration;

use proto::{ApiError, ClientRequest, Envelope, Job, JobId, LogStream, Reply, Response, FORWARD_HOPS_MAX};
use tracing::info;

use super::{Node, PEER_CALL_TIMEOUT};

/// How long a launch waits for this node's replica to catch up before it is refused (the
/// leader sends it again).
const LAUNCH_APPLY_WAIT_MS: u64 = 2_000;

impl Node {
    /// Applies a MIG layout on this node, starting from its inventory as the log has it.
    pub(super) fn apply_mig_layout(&self, gpu: u32, profiles: Vec<String>) -> Response {
        let base = self.state.read(|s| s.nodes.get(&self.id).map(|n| (*n.inventory).clone())).unwrap_or_else(|| self.inventory.clone());
        self.agent.apply_mig_layout(Arc::clone(&self.probe), base, gpu, profiles, Arc::clone(&self.agent_link))
    }

    pub(super) async fn logs(
        &self,
        hops: u8,
        job: JobId,
        stream: LogStream,
        offset: u64,
        max_bytes: u32,
        user: Option<String>,
    ) -> Response {
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
            let env = Envelope { hops: hops + 1, request: ClientRequest::Logs { job, stream, offset, max_bytes }.into(), user };
            return self
                .client
                .call(&addr, &env, PEER_CALL_TIMEOUT)
                .await
                .map_err(|e| ApiError::Unavailable(format!("read output from {addr}: {e}")))?;
        }
        match self.agent.read_log(job, stream, offset, max_bytes) {
            Err(ApiError::NotFound(_)) => self.forward(hops, ClientRequest::Logs { job, stream, offset, max_bytes }, user).await,
            other => other,
        }
    }

    /// Starts a run a leader sent, unless it is stale: a launch composed before the cluster gave
    /// the run up (a `NodeDown`, a requeue) may arrive after it, at a new instance of this node or
    /// once a paused one runs again. First this node's replica applies the log up to what the
    /// launch was read from and what its last acknowledgement named (everything decided before
    /// this node was known alive again); then the run must still be the job's current run with an
    /// unconfirmed part here, or one this instance confirmed.
    pub(super) async fn launch_if_current(&self, job: proto::Job, nodes: Vec<(String, String)>, issued_index: u64) -> Response {
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
            match self.forward_link.call(ClientRequest::GetJob { job: job.id }, 0).await {
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
    pub(super) async fn launch_here(&self, job: Job, nodes: Vec<(String, String)>, checked_ack_index: u64) -> Response {
        let agent = Arc::clone(&self.agent);
        tokio::task::spawn_blocking(move || agent.launch(job, &nodes, checked_ack_index))
            .await
            .unwrap_or_else(|e| Err(ApiError::Internal(format!("launch task failed: {e}"))))
    }
}
