//! Submissions: a job's defaults bound and its spec checked before the log takes it (`submit`),
//! and `sbatch --test-only`, which asks the scheduler without touching the log (`test_submit`).

use proto::{ApiError, Command, CommandResult, NodeId, Reply, Response};

use super::{now_ms, rejected, Node};

impl Node {
    /// `sbatch --test-only`: submits `spec` to a copy of the state and asks the scheduler what it
    /// would do with it now; the log is not touched.
    pub(super) fn test_submit(&self, mut spec: proto::JobSpec) -> Response {
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
    pub(super) async fn submit(&self, mut spec: proto::JobSpec, user: Option<&str>, now: u64) -> Response {
        if let Some(u) = user {
            spec.user = u.to_string();
        }
        spec.fill_default_mem();
        self.bind_defaults(&mut spec);
        let by_admin = self.is_admin(user);
        // Every check, in one order (`ClusterState::admission`); `apply` checks the spec and the
        // accounts again against the state the job enters.
        self.state.read(|s| s.admission(&spec, by_admin)).map_err(|refusal| ApiError::Invalid(refusal.why))?;
        match self.propose(Command::Submit { spec, now_ms: now }).await? {
            CommandResult::Submitted { job } => {
                self.kick.notify_one();
                Ok(Reply::Submitted { job })
            }
            other => Err(rejected(other)),
        }
    }
}
