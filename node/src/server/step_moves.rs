//! A batch job's step that had tasks on a node the job lost and repaired onto a spare (issue
//! 43): its `srun` asks the node that launched the step (`ClientRequest::StepMove`), which starts the
//! lost node's tasks on the spare with their ranks and the step's environment as first started
//! (its rendezvous on the script's node, which lives); the other nodes' tasks keep running.
//! The replicated state already names the spare in the step's record (`state::repairs`); the
//! lost node fenced its tasks before it was declared down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::{ApiError, ClientRequest, JobId, JobState, Reply, Response};
use tracing::info;

use super::steps::STEP_START_PATIENCE_MS;
use super::{Node, PEER_CALL_TIMEOUT};

/// How often a move asks again while the spare's part is still starting.
const STEP_MOVE_RETRY_MS: u64 = 200;

impl Node {
    /// Starts the tasks step `step` of `job` had on node `lost` on the spare that took `lost`'s
    /// rank: [`ApiError::Busy`] while no repair moved it (the caller asks again); idempotent.
    pub(super) async fn move_step(self: &Arc<Self>, job: JobId, step: u32, lost: String, user: Option<String>) -> Response {
        let (run, spec) = self.agent.launched_step(job, step, user.as_deref())?;
        let spare = self.state.read(|s| {
            let j = s.jobs.get(&job).filter(|j| j.state == JobState::Running && j.run == run)?;
            let lost_id = s.node_by_name(&lost)?.id;
            let repair = j.repairs.iter().rev().find(|r| r.run == run && r.lost == lost_id)?;
            s.nodes.get(&repair.spare).map(|n| (n.name.clone(), n.addr.clone()))
        });
        let Some((spare, addr)) = spare else {
            return Err(ApiError::Busy(format!("node {lost} of job {job} run {run} is not repaired")));
        };
        if !spec.nodes.iter().any(|n| n.name == lost) {
            return match spec.nodes.iter().any(|n| n.name == spare) {
                true => Ok(Reply::StepMoved { node: spare }),
                false => Err(ApiError::Invalid(format!("step {job}.{step} has no tasks on {lost}"))),
            };
        }
        let mut moved = (*spec).clone();
        for n in moved.nodes.iter_mut().filter(|n| n.name == lost) {
            n.name = spare.clone();
        }
        if !moved.overlap && !moved.unrecorded {
            self.hold_step_on(job, run, step, &moved, &spare, &addr, false, &user).await?;
        }
        self.start_moved(job, run, step, &moved, &spare, &addr, &user).await?;
        info!(job, run, step, lost = %lost, spare = %spare, "step's tasks of a lost node started on its spare");
        self.agent.note_launched_step(job, step, Arc::new(moved));
        Ok(Reply::StepMoved { node: spare })
    }

    /// Starts `spec`'s tasks on `spare` at `addr`, asking again while its part of the run is
    /// still starting (a repaired rank's part starts as the step is moved).
    #[allow(clippy::too_many_arguments)]
    async fn start_moved(
        self: &Arc<Self>,
        job: JobId,
        run: proto::RunNo,
        step: u32,
        spec: &proto::StepSpec,
        spare: &str,
        addr: &str,
        user: &Option<String>,
    ) -> Result<(), ApiError> {
        let deadline = Instant::now() + Duration::from_millis(STEP_START_PATIENCE_MS);
        loop {
            match self.start_step_on(job, run, step, spec, spare, addr, user).await {
                Err(ApiError::Unavailable(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(STEP_MOVE_RETRY_MS)).await;
                }
                other => return other.map(drop),
            }
        }
    }

    /// Sends `request` about `job` to the node its batch script runs on (its first), which
    /// launched its steps.
    pub(super) async fn to_script_node(&self, hops: u8, job: JobId, request: ClientRequest, user: Option<String>) -> Response {
        let first = self.state.read(|s| {
            let j = s.jobs.get(&job).filter(|j| j.state == JobState::Running)?;
            s.nodes.get(j.run_nodes().first()?).map(|n| n.name.clone())
        });
        let first = first.ok_or_else(|| ApiError::NotFound(format!("job {job} is not running")))?;
        let timeout = PEER_CALL_TIMEOUT + Duration::from_millis(STEP_START_PATIENCE_MS);
        self.to_run_node(hops, job, &first, request, user, timeout).await
    }
}
