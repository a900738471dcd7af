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
                    let cpus = trial.jobs.get(&job).map_or(0, |j| j.spec.cpus_per_task * j.spec.ntasks_per_node * j.node_count());
                    Ok(Reply::TestSubmitted { job, start_ms: Some(r.start_ms), nodes, cpus, reasons })
                }
                None => Ok(Reply::TestSubmitted { job, start_ms: None, nodes: Vec::new(), cpus: 0, reasons }),
            }
        })
    }

    /// A job that names no partition is the default partition's as of its submission, as in
    /// Slurm: it stays there when an admin makes another partition the default; one without a
    /// time limit gets its partition's `DefaultTime`, kept when that changes. Once accounts are
    /// enforced, one that names no account, QoS or time limit gets its user's defaults
    /// (`ClusterState::bind_accounting`).
    fn bind_defaults(&self, spec: &mut proto::JobSpec) {
        self.state.read(|s| {
            let partition = spec.partition.get_or_insert_with(|| s.policy.default_partition_name().to_string());
            if spec.time_limit_ms.is_none() {
                spec.time_limit_ms = s.policy.partitions.iter().find(|p| &p.name == partition).and_then(|p| p.default_time_limit_ms);
            }
            s.bind_accounting(spec);
        });
    }

    /// `AllowGroups=`: whether the user is in a group the job's partition allows, by this node's
    /// user database (as slurmctld reads its host's); admins may use any partition. Slurm's
    /// words when not.
    fn groups_refusal(&self, spec: &proto::JobSpec, by_admin: bool) -> Option<String> {
        let allowed = self.state.read(|s| {
            let partition = spec.partition.as_deref().unwrap_or(s.policy.default_partition_name());
            s.policy.partitions.iter().find(|p| p.name == partition).map(|p| p.access.allow_groups.clone())
        });
        let allowed = allowed.filter(|groups| !groups.is_empty())?;
        if by_admin {
            return None;
        }
        let groups = crate::run::identity::by_name(&spec.user).map(|a| crate::run::identity::group_names(&a.groups)).unwrap_or_default();
        let access = proto::PartitionAccess { allow_groups: allowed, ..Default::default() };
        (!access.allows_groups(&groups)).then(|| "User's group not permitted to use this partition".to_string())
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
        self.state.read(|s| s.admission(&spec, by_admin, now)).map_err(|refusal| ApiError::Invalid(refusal.why))?;
        if let Some(why) = self.groups_refusal(&spec, by_admin) {
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
}
