//! Steps (`srun`): a step started from its batch script's node (numbered, held, recorded, then
//! started on each of its nodes), and requests about a step's tasks passed to their node.

use std::sync::Arc;
use std::time::Duration;

use proto::{ApiError, ClientRequest, Envelope, Job, JobId, PeerRequest, Reply, Request, Response, FORWARD_HOPS_MAX};
use tracing::{debug, info, warn};

use super::{Node, PEER_CALL_TIMEOUT};
use crate::link::LinkError;

/// How long a step's start waits for a node whose part of the job is still starting.
pub(super) const STEP_START_PATIENCE_MS: u64 = 30_000;
const STEP_START_RETRY_MS: u64 = 100;

impl Node {
    /// Starts a step of `job`, whose batch script runs here, on the nodes it names: numbers it,
    /// has every node start its tasks, and stops them all again if one node cannot.
    pub(super) async fn launch_step(self: &Arc<Self>, job: JobId, spec: proto::StepSpec, user: Option<String>) -> Response {
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
        let request = PeerRequest::RecordStep { job, run, step, name, nodes, ntasks };
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
                    let result = node.start_step_on(job, run, step, &spec, &name, &addr, &user).await;
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
            self.agent.note_launched_step(job, step, spec);
            return Ok(Reply::StepLaunched { step, run });
        }
        warn!(job, run, step, failed = %failed.join("; "), "step not started everywhere: stopping it");
        for name in started {
            let request = ClientRequest::StepSignal { job, step, node: name.clone(), signal: libc::SIGKILL };
            if let Err(e) = Box::pin(Arc::clone(self).handle(Envelope { hops: 0, request: request.into(), user: user.clone() })).await {
                warn!(job, step, node = %name, error = %e, "stop a step that did not start everywhere");
            }
        }
        Err(ApiError::Unavailable(format!("step {job}.{step} could not start on {}", failed.join("; "))))
    }

    /// Has every node of a step hold its share of the step's resources
    /// ([`PeerRequest::StepHold`]) before any starts its tasks; where one cannot, gives back the
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

    /// Starts node `name`'s tasks of a step (at `addr`, or by this node's agent when it is this
    /// node) with [`PeerRequest::StepStart`].
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start_step_on(
        self: &Arc<Self>,
        job: JobId,
        run: proto::RunNo,
        step: u32,
        spec: &proto::StepSpec,
        name: &str,
        addr: &str,
        user: &Option<String>,
    ) -> Response {
        if name == self.config.name {
            return self.agent.start_step(job, run, step, spec, user.as_deref()).await;
        }
        let env = Envelope { hops: 0, request: PeerRequest::StepStart { job, run, step, spec: spec.clone() }.into(), user: user.clone() };
        let reply = self.client.call(addr, &env, PEER_CALL_TIMEOUT).await;
        reply.unwrap_or_else(|e| Err(ApiError::Unavailable(format!("reach {addr}: {e}"))))
    }

    /// Asks node `name` at `addr` (this one, directly) to hold, or give back, its share of a step.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn hold_step_on(
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
        let request = PeerRequest::StepHold { job, run, step, spec: spec.clone(), release };
        let env = Envelope { hops: 0, request: request.into(), user: user.clone() };
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
        for (k, v) in slurm_compat::env::torchrun_env(&crate::run::launcher::host_of(addr), port, targets.len()) {
            spec.env.entry(k).or_insert(v);
        }
    }

    /// Sends a step request to node `name` of `job`'s run, whose address this node knows
    /// because the run runs here too.
    pub(super) async fn to_run_node(
        &self,
        hops: u8,
        job: JobId,
        name: &str,
        request: impl Into<Request>,
        user: Option<String>,
        timeout: Duration,
    ) -> Response {
        let request = request.into();
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

    /// `ClientRequest::GpuSamples` of node `node`: this node's agent's, else asked of that node (by
    /// its address in the replicated state, or through the leader from a node without it).
    pub(super) async fn gpu_samples(&self, hops: u8, node: String, user: Option<String>) -> Response {
        if node == self.config.name {
            return Ok(self.agent.gpu_samples());
        }
        if !self.is_member() {
            return self.forward(hops, ClientRequest::GpuSamples { node }, user).await;
        }
        if hops >= FORWARD_HOPS_MAX {
            return Err(ApiError::Unavailable(format!("gave up after {hops} forwards")));
        }
        let addr =
            self.state.read(|s| s.node_by_name(&node).map(|n| n.addr.clone())).ok_or_else(|| ApiError::NotFound(format!("node {node}")))?;
        let env = Envelope { hops: hops + 1, request: ClientRequest::GpuSamples { node: node.clone() }.into(), user };
        self.client
            .call(&addr, &env, PEER_CALL_TIMEOUT)
            .await
            .unwrap_or_else(|e| Err(ApiError::Unavailable(format!("reach {node} at {addr}: {e}"))))
    }

    /// A request about a running step's tasks, or a job's GPUs, on one node: answered by the
    /// agent when it is this node, else passed to that node through the job's run.
    pub(super) async fn step_request(&self, hops: u8, request: ClientRequest, user: Option<String>) -> Response {
        match request {
            ClientRequest::StepRead { job, step, node, offset, exits_seen, wait_ms } => {
                if node == self.config.name {
                    return self.agent.read_step(job, step, offset, exits_seen, wait_ms, user.as_deref()).await;
                }
                let wait = Duration::from_millis(u64::from(wait_ms.min(proto::limits::STEP_READ_WAIT_MS_MAX)));
                let request = ClientRequest::StepRead { job, step, node: node.clone(), offset, exits_seen, wait_ms };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT + wait).await
            }
            ClientRequest::StepInput { job, step, node, offset, data, eof } => {
                if node == self.config.name {
                    return self.agent.step_input(job, step, offset, &data, eof, user.as_deref()).await;
                }
                let request = ClientRequest::StepInput { job, step, node: node.clone(), offset, data, eof };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            ClientRequest::StepSignal { job, step, node, signal } => {
                if node == self.config.name {
                    return self.agent.signal_step(job, step, signal, user.as_deref());
                }
                let request = ClientRequest::StepSignal { job, step, node: node.clone(), signal };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            ClientRequest::StepResize { job, step, node, size } => {
                if node == self.config.name {
                    return self.agent.resize_step(job, step, size, user.as_deref()).await;
                }
                let request = ClientRequest::StepResize { job, step, node: node.clone(), size };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            ClientRequest::StepUsage { job, node } => {
                if node == self.config.name {
                    return self.agent.step_usage(job, user.as_deref()).await;
                }
                let request = ClientRequest::StepUsage { job, node: node.clone() };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            ClientRequest::GpuSeries { job, node } => {
                if node == self.config.name {
                    return Ok(self.agent.gpu_series(job));
                }
                let request = ClientRequest::GpuSeries { job, node: node.clone() };
                self.to_run_node(hops, job, &node, request, user, PEER_CALL_TIMEOUT).await
            }
            other => Err(ApiError::Invalid(format!("not a step request: {other:?}"))),
        }
    }
}
