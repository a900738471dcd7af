//! What only the leader answers: each request checked (`authorize`) and turned into commands
//! proposed to the log (`handle_on_leader`, `change_job_on_leader`).

use std::time::Duration;

use proto::{ApiError, ClientRequest, Command, CommandResult, Envelope, JobId, JobState, NodeId, PeerRequest, Reply, Request, Response};
use tracing::{debug, info, warn};

use super::{lock, now_ms, ok_or_rejected, rejected, Node, PEER_CALL_TIMEOUT};

impl Node {
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
                let env = Envelope { hops: 0, request: PeerRequest::SignalPart { job, run, signal, batch_only }.into(), user: None };
                self.client.call(&addr, &env, PEER_CALL_TIMEOUT).await.unwrap_or_else(|e| Err(ApiError::Unavailable(e.to_string())))
            };
            result?;
        }
        Ok(Reply::Ok)
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

    /// A request for the leader, while this node leads. A leader a quorum no longer hears (cut
    /// off, or its packets lost one way while it still hears the others) would hold a write
    /// until its caller, which still hears it, gives up: openraft keeps it leader in its own eyes
    /// and the entry uncommitted. So a request is refused when the quorum does not confirm this
    /// leader (`confirm_leadership`: cheap while the lease holds) before it and while it waits,
    /// and the caller asks the next member, which knows the new leader. A write refused while it
    /// waited may still commit later: as after a lost reply (a submission's key makes a resend
    /// answer with the job the first made). Heartbeats confirm on their own.
    pub(super) async fn handle_on_leader(&self, request: Request, user: Option<String>) -> Response {
        self.authorize(request.access(), user.as_deref())?;
        if matches!(request, Request::Peer(PeerRequest::Heartbeat { .. } | PeerRequest::Heartbeats { .. })) {
            return self.lead(request, user).await;
        }
        self.confirm_leadership().await?;
        let lost = async {
            let every = Duration::from_millis((self.config.raft.election_timeout_min_ms / 2).max(50));
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = self.confirm_leadership().await {
                    return e;
                }
            }
        };
        tokio::select! {
            response = self.lead(request, user) => response,
            e = lost => Err(e),
        }
    }

    async fn lead(&self, request: Request, user: Option<String>) -> Response {
        match request {
            Request::Client(request) => self.lead_client(request, user).await,
            Request::Peer(request) => self.lead_peer(request).await,
        }
    }

    async fn lead_client(&self, request: ClientRequest, user: Option<String>) -> Response {
        let now = now_ms();
        let who = user.as_deref();
        match request {
            ClientRequest::Submit { spec } => self.submit(spec, user.as_deref(), now).await,
            ClientRequest::Cancel { job } => match self.propose(Command::Cancel { job, now_ms: now }).await? {
                CommandResult::Ok => {
                    self.kick.notify_one();
                    Ok(Reply::Ok)
                }
                other => Err(rejected(other)),
            },
            ClientRequest::Drain { node, reason } => {
                let id = self.node_id_by_name(&node)?;
                self.propose(Command::Drain { node: id, reason, now_ms: now }).await.and_then(ok_or_rejected)
            }
            ClientRequest::Resume { node } => {
                let id = self.node_id_by_name(&node)?;
                self.propose(Command::Resume { node: id, now_ms: now }).await.and_then(ok_or_rejected)
            }
            ClientRequest::CreateJoinToken { ttl_ms } => self.create_join_token(ttl_ms, who, now).await,
            ClientRequest::RevokeJoinToken { id } => {
                ok_or_rejected(self.propose(Command::RevokeJoinToken { id, now_ms: now }).await?)?;
                info!(id, by = %who.unwrap_or("root"), "join token revoked");
                Ok(Reply::Ok)
            }
            ClientRequest::RevokeCert { node, fingerprint } => self.revoke_cert(node, fingerprint, who, now).await,
            ClientRequest::SetGpuHealth { node, gpu, healthy, reason } => {
                let id = self.node_id_by_name(&node)?;
                info!(node = %node, gpu, healthy, "operator sets gpu health");
                let cmd = Command::GpuHealth { node: id, gpu, mig_uuid: None, healthy, reason, now_ms: now };
                self.propose(cmd).await.and_then(ok_or_rejected)
            }
            ClientRequest::SetMigLayout { node, gpu, profiles } => {
                let id = self.node_id_by_name(&node)?;
                info!(node = %node, gpu, ?profiles, "operator sets a mig layout");
                let result = self.propose(Command::PinMigLayout { node: id, gpu, profiles, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            ClientRequest::SetPolicy { policy } => {
                policy.validate().map_err(ApiError::Invalid)?;
                let result = self.propose(Command::SetPolicy { policy, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            ClientRequest::EditPartition { edit } => {
                info!(partition = %edit.name(), ?edit, "operator edits a partition");
                let result = self.propose(Command::EditPartition { edit, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            ClientRequest::EditReservation { edit } => self.edit_reservation(edit, who, now).await,
            ClientRequest::ExpectedStarts => Ok(Reply::ExpectedStarts(lock(&self.memory).expected_starts.clone())),
            ClientRequest::EditAccounts { edits } => {
                info!(?edits, by = who.unwrap_or("root"), "operator edits accounts");
                let result = self.propose(Command::EditAccounts { edits, now_ms: now }).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            request => self.change_job_on_leader(request, who, now).await,
        }
    }

    /// What nodes report to the leader: joins, heartbeats, ended runs and steps, GPU health and
    /// inventories.
    async fn lead_peer(&self, request: PeerRequest) -> Response {
        let now = now_ms();
        match request {
            PeerRequest::Join { token, name, addr, inventory, instance, cert_fingerprint } => {
                self.join(token, name, addr, inventory, instance, cert_fingerprint, now).await
            }
            PeerRequest::Heartbeat { node, instance, running: _ } => {
                let (leader, term, commit_index, refused) = self.accept_heartbeats(&[proto::Beat { node, instance }]).await?;
                match refused.into_iter().next() {
                    Some((_, e)) => Err(e),
                    None => Ok(Reply::HeartbeatAck { leader, term, commit_index }),
                }
            }
            PeerRequest::Heartbeats { relay: _, beats } => self.heartbeats(&beats).await,
            PeerRequest::ReportRun { job, run, node, outcome, usage } => {
                match self.propose(Command::RunFinished { job, run, node, outcome, usage, now_ms: now }).await? {
                    CommandResult::Rejected(why) => debug!(job, run, why = %why, "run report ignored"),
                    _ => self.kick.notify_one(),
                }
                Ok(Reply::Ok)
            }
            PeerRequest::ReportRuns { node, reports } => self.report_runs(node, reports, now).await,
            PeerRequest::NodeStopped { node, instance } => {
                info!(node, instance, "node stopped gracefully: down at once");
                let result = self.propose(Command::NodeStopped { node, instance, now_ms: now }).await?;
                self.kick.notify_one();
                ok_or_rejected(result)
            }
            PeerRequest::ReportGpuHealth { node, gpu, mig_uuid, healthy, reason } => {
                warn!(node, gpu, healthy, reason = %reason, "gpu health reported");
                let cmd = Command::GpuHealth { node, gpu, mig_uuid, healthy, reason, now_ms: now };
                self.propose(cmd).await.and_then(ok_or_rejected)
            }
            PeerRequest::ReportInventory { node, inventory, reason } => {
                self.propose(Command::UpdateInventory { node, inventory, reason, now_ms: now }).await.and_then(ok_or_rejected)
            }
            PeerRequest::RecordStep { job, run, step, name, nodes, ntasks } => {
                let cmd = Command::StepStarted { job, run, step, name, nodes, ntasks, now_ms: now };
                self.propose(cmd).await.and_then(ok_or_rejected)
            }
            PeerRequest::ReportStepEnds { node, ends } => self.report_step_ends(node, ends, now).await,
            PeerRequest::Store { job, run, op, write: _ } if !op.writes() => {
                self.state.read(|s| s.store_read(job, run, &op)).map(Reply::Store).map_err(ApiError::Invalid)
            }
            PeerRequest::Store { job, run, op, write } => match self.propose(Command::Store { job, run, op, write, now_ms: now }).await? {
                CommandResult::Store(answer) => Ok(Reply::Store(answer)),
                other => ok_or_rejected(other),
            },
            other => Err(ApiError::Invalid(format!("not a leader request: {other:?}"))),
        }
    }

    /// The leader's part of what changes a job's run: requeues, updates, signals and
    /// suspensions.
    async fn change_job_on_leader(&self, request: ClientRequest, who: Option<&str>, now: u64) -> Response {
        match request {
            ClientRequest::Requeue { job } => self.requeue(job, false, now).await,
            ClientRequest::RequeueHold { job } => self.requeue(job, true, now).await,
            ClientRequest::UpdateJob { job, hold, time_limit_ms, partition } => {
                let cmd = Command::UpdateJob { job, hold, time_limit_ms, partition, now_ms: now };
                let result = self.propose(cmd).await.and_then(ok_or_rejected);
                self.kick.notify_one();
                result
            }
            ClientRequest::Signal { job, signal, batch_only } => self.signal_job(job, signal, batch_only).await,
            ClientRequest::Suspend { job, suspend } => {
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

impl Node {
    /// `scontrol create|update|delete reservation`: one log entry; a pass follows at once (a
    /// reservation may free or fence nodes).
    async fn edit_reservation(&self, edit: proto::ReservationEdit, who: Option<&str>, now: u64) -> Response {
        info!(?edit, by = who.unwrap_or("root"), "operator edits a reservation");
        let result = match self.propose(Command::EditReservation { edit, now_ms: now }).await? {
            CommandResult::ReservationMade { name } => Ok(Reply::ReservationMade { name }),
            other => ok_or_rejected(other),
        };
        self.kick.notify_one();
        result
    }
}
