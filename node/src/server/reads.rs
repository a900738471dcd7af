//! The read-only answers any member gives from its replica: jobs (with why pending ones wait),
//! nodes, members, policy, accounts, shares, priorities and configuration.

use std::collections::{BTreeMap, BTreeSet};

use proto::{ApiError, ClientRequest, ClusterInfo, ClusterMember, Job, JobId, JobState, NodeId, NodeInfo, NodeRole, Reply, Response};

use super::{now_ms, Node};

impl Node {
    pub(super) fn read(&self, request: ClientRequest) -> Response {
        match request {
            ClientRequest::GetJob { job } => {
                let found = self.state.job(job).map_err(|e| ApiError::Internal(format!("read job {job}: {e}")))?;
                let mut jobs: Vec<Job> = found.into_iter().collect();
                self.explain_pending(&mut jobs);
                jobs.pop().map(|j| Reply::Job(Box::new(j))).ok_or_else(|| ApiError::NotFound(format!("job {job}")))
            }
            ClientRequest::ListJobs { include_finished } => {
                // The hot state only (live jobs and those finished in the last `min_job_age_s`);
                // history is paged through `QueryJobs`.
                let mut jobs: Vec<Job> =
                    self.state.read(|s| s.jobs.values().filter(|j| include_finished || !j.state.is_final()).cloned().collect());
                self.explain_pending(&mut jobs);
                Ok(Reply::Jobs(jobs))
            }
            ClientRequest::AccountingDigest => {
                let applied_index = self.state.applied_index();
                let hot_jobs = self.state.read(|s| s.jobs.len() as u64);
                let (records, digest) =
                    self.state.accounting_digest().map_err(|e| ApiError::Internal(format!("read the accounting store: {e}")))?;
                let disk_bytes =
                    self.state.accounting_disk_bytes().map_err(|e| ApiError::Internal(format!("read the accounting store: {e}")))?;
                Ok(Reply::AccountingDigest { node: self.config.name.clone(), applied_index, hot_jobs, records, digest, disk_bytes })
            }
            ClientRequest::QueryJobs { query } => {
                let (mut jobs, next) = self.state.query_jobs(&query).map_err(|e| ApiError::Internal(format!("query jobs: {e}")))?;
                self.explain_pending(&mut jobs);
                Ok(Reply::JobPage { jobs, next })
            }
            ClientRequest::ListNodes => Ok(Reply::Nodes(self.node_infos())),
            ClientRequest::ClusterInfo => Ok(Reply::Cluster(self.cluster_info(true))),
            ClientRequest::Members => Ok(Reply::Cluster(self.cluster_info(false))),
            ClientRequest::GetPolicy => Ok(Reply::Policy(self.state.read(|s| s.policy.clone()))),
            ClientRequest::GetReservations => {
                let now = now_ms();
                Ok(Reply::Reservations(self.state.read(|s| s.reservations.values().filter(|r| r.end_ms > now).cloned().collect())))
            }
            ClientRequest::GetAccounts => {
                let (accounts, policy) = self.state.read(|s| (Box::new((*s.accounts).clone()), s.policy.clone()));
                Ok(Reply::Accounts { accounts, policy })
            }
            ClientRequest::ShowConfig => Ok(Reply::Config(self.show_config())),
            ClientRequest::TestSubmit { spec } => self.test_submit(spec),
            ClientRequest::GetShares => Ok(Reply::Shares(self.shares())),
            ClientRequest::QueueSummary { user, first, rows_max } => Ok(self.queue_summary(user.as_deref(), &first, rows_max)),
            ClientRequest::NodeEvents => Ok(Reply::NodeEvents(self.state.read(|s| s.node_events.iter().cloned().collect()))),
            ClientRequest::GetPriorities { jobs, users } => Ok(self.priorities(&jobs, &users)),
            other => Err(ApiError::Invalid(format!("not a read request: {other:?}"))),
        }
    }

    /// `scontrol show config`: this node's settings, and the priority's from the replicated
    /// policy and the scheduler's weights.
    fn show_config(&self) -> Vec<(String, String)> {
        let mut out = self.config.slurm_config(self.agent.confines_jobs());
        let (half_life_min, enforce_part_limits) =
            self.state.read(|s| (s.policy.decay_half_life_ms() / 60_000, s.policy.enforce_part_limits));
        let (days, rest) = (half_life_min / 1440, half_life_min % 1440);
        let half_life =
            if days > 0 { format!("{days}-{:02}:{:02}:00", rest / 60, rest % 60) } else { format!("{:02}:{:02}:00", rest / 60, rest % 60) };
        let w = scheduler::SchedulerConfig::default().weights;
        out.extend([
            ("EnforcePartLimits".to_string(), if enforce_part_limits { "ALL" } else { "NO" }.to_string()),
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

    /// Fills in why each pending job does not start now: the pure scheduler run on this node's
    /// committed state gives the same answer the leader's pass would.
    /// `ClientRequest::QueueSummary`: one pass over the live jobs, and one scheduling pass to explain
    /// only the pending rows it returns.
    fn queue_summary(&self, user: Option<&str>, first: &[JobId], rows_max: u32) -> Reply {
        let rows_max = rows_max.min(proto::QUEUE_ROWS_MAX) as usize;
        let (counts, total, mut jobs) = self.state.read(|s| {
            let live: Vec<&Job> = s.jobs.values().filter(|j| !j.state.is_final() && user.is_none_or(|u| j.spec.user == u)).collect();
            let mut counts: BTreeMap<String, u64> = BTreeMap::new();
            for j in &live {
                *counts.entry(j.state_name().to_string()).or_default() += 1;
            }
            let rank: BTreeMap<JobId, usize> = first.iter().enumerate().map(|(i, id)| (*id, i)).collect();
            let mut order: Vec<&Job> = live;
            order.sort_by_key(|j| (j.state != JobState::Running, rank.get(&j.id).copied().unwrap_or(usize::MAX), j.id));
            let total = order.len() as u64;
            let rows: Vec<Job> = order.into_iter().take(rows_max).cloned().collect();
            (counts.into_iter().collect::<Vec<_>>(), total, rows)
        });
        for j in &mut jobs {
            let spec = std::sync::Arc::make_mut(&mut j.spec);
            spec.env.clear();
            spec.script = None;
        }
        self.explain_pending(&mut jobs);
        Reply::QueueSummary { counts, total, jobs }
    }

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
        let now = now_ms();
        self.state.read(|s| {
            let held = s.cpus_and_memory_held();
            // (in a reservation now, in a MAINT one) by node name.
            let mut reserved: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
            for r in s.reservations.values().filter(|r| r.active(now)) {
                for n in &r.nodes {
                    let e = reserved.entry(n.as_str()).or_default();
                    *e = (true, e.1 || r.maint);
                }
            }
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
                        reserved: reserved.get(n.name.as_str()).is_some_and(|r| r.0),
                        maint: reserved.get(n.name.as_str()).is_some_and(|r| r.1),
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
}

/// `node`'s MIG-mode GPUs with their layouts, as reported and as pinned.
fn mig_gpus(node: &proto::NodeRecord) -> Vec<proto::MigGpuInfo> {
    node.inventory
        .gpus
        .iter()
        .filter_map(|g| {
            let layout = node.inventory.mig_layout(g.index)?;
            let start_slices = node.inventory.mig_start_slices(g.index)?;
            Some(proto::MigGpuInfo { gpu: g.index, layout, start_slices, pinned: node.mig_pinned.get(&g.index).cloned() })
        })
        .collect()
}
