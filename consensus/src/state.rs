//! The replicated cluster state and the one function that changes it.
//!
//! [`ClusterState::apply`] is deterministic: it reads no clock (time comes from `now_ms` inside the
//! command), draws no random numbers and does no IO, so every replica that applies the same log
//! reaches the same state, byte for byte (see [`ClusterState::digest`]).

use std::collections::{BTreeMap, BTreeSet};

use proto::{
    Allocation, Command, CommandResult, InstanceId, Inventory, Job, JobId, JobSpec, JobState,
    NodeId, NodeRecord, NodeState, Placement, RunNo, RunOutcome,
};
use scheduler::{ClusterView, GpuSlot, JobRequest, NodeView};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Everything the cluster agrees on: nodes, jobs, and the next ids to hand out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    pub jobs: BTreeMap<JobId, Job>,
    pub next_job_id: JobId,
    pub next_node_id: NodeId,
}

impl Default for ClusterState {
    fn default() -> Self {
        ClusterState {
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            next_job_id: 1,
            next_node_id: 1,
        }
    }
}

fn rejected(reason: impl Into<String>) -> CommandResult {
    CommandResult::Rejected(reason.into())
}

/// Ends a running job's current run because its node failed or restarted.
fn fail_on_node(job: &mut Job, reason: &str, now_ms: u64) {
    job.state = JobState::NodeFail;
    job.exit_code = None;
    job.alloc = None;
    job.end_ms.get_or_insert(now_ms);
    job.reason = Some(reason.to_string());
}

impl ClusterState {
    /// Applies one committed command. Deterministic: the same state and command give the same
    /// result and the same next state on every replica.
    pub fn apply(&mut self, cmd: &Command) -> CommandResult {
        let result = match cmd {
            Command::RegisterNode {
                name,
                addr,
                inventory,
                instance,
                now_ms,
            } => self.register_node(name, addr, inventory, *instance, *now_ms),
            Command::NodeUp {
                node,
                instance,
                now_ms,
            } => self.node_up(*node, *instance, *now_ms),
            Command::NodeDown {
                node,
                reason,
                now_ms,
            } => self.node_down(*node, reason, *now_ms),
            Command::Drain {
                node,
                reason,
                now_ms,
            } => self.drain(*node, reason, *now_ms),
            Command::Resume { node, now_ms } => self.resume(*node, *now_ms),
            Command::Submit { spec, now_ms } => self.submit(spec, *now_ms),
            Command::Plan { placements, now_ms } => self.plan(placements, *now_ms),
            Command::LaunchConfirmed {
                job,
                run,
                node,
                instance,
                now_ms,
            } => self.launch_confirmed(*job, *run, *node, *instance, *now_ms),
            Command::RunFinished {
                job,
                run,
                node,
                outcome,
                now_ms,
            } => self.run_finished(*job, *run, *node, outcome, *now_ms),
            Command::Cancel { job, now_ms } => self.cancel(*job, *now_ms),
        };
        self.check_invariants();
        result
    }

    fn register_node(
        &mut self,
        name: &str,
        addr: &str,
        inventory: &Inventory,
        instance: InstanceId,
        now_ms: u64,
    ) -> CommandResult {
        let existing = self.nodes.values().find(|n| n.name == name).map(|n| n.id);
        let Some(id) = existing else {
            let id = self.next_node_id;
            self.next_node_id += 1;
            self.nodes.insert(
                id,
                NodeRecord {
                    id,
                    name: name.to_string(),
                    addr: addr.to_string(),
                    inventory: inventory.clone(),
                    state: NodeState::Up,
                    drained: false,
                    instance,
                    state_reason: None,
                    registered_ms: now_ms,
                    state_changed_ms: now_ms,
                },
            );
            return CommandResult::NodeRegistered { id };
        };
        let instance_changed = self.nodes.get(&id).is_some_and(|n| n.instance != instance);
        if instance_changed {
            // The old process is gone: nothing it started can still be supervised.
            for job in self.jobs.values_mut() {
                if job.alloc.as_ref().is_none_or(|a| a.node != id) {
                    continue;
                }
                if job.state == JobState::Running {
                    fail_on_node(job, "node restarted", now_ms);
                } else {
                    job.alloc = None;
                }
            }
        }
        if let Some(node) = self.nodes.get_mut(&id) {
            node.addr = addr.to_string();
            node.inventory = inventory.clone();
            node.instance = instance;
            let state = if node.drained {
                NodeState::Drained
            } else {
                NodeState::Up
            };
            if node.state != state {
                node.state = state;
                node.state_changed_ms = now_ms;
            }
            if !node.drained {
                node.state_reason = None;
            }
        }
        CommandResult::NodeRegistered { id }
    }

    fn node_up(&mut self, id: NodeId, instance: InstanceId, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        let state = if node.drained {
            NodeState::Drained
        } else {
            NodeState::Up
        };
        if node.state != state {
            node.state = state;
            node.state_changed_ms = now_ms;
        }
        if !node.drained {
            node.state_reason = None;
        }
        if node.instance == instance {
            return CommandResult::Ok;
        }
        node.instance = instance;
        for job in self.jobs.values_mut() {
            if job.alloc.as_ref().is_none_or(|a| a.node != id) {
                continue;
            }
            // Launches not yet confirmed may still be confirmed by the new instance.
            let launched_elsewhere = job.launched_by.is_some_and(|i| i != instance);
            if !launched_elsewhere {
                continue;
            }
            if job.state == JobState::Running {
                fail_on_node(job, "node restarted", now_ms);
            } else {
                job.alloc = None;
            }
        }
        CommandResult::Ok
    }

    fn node_down(&mut self, id: NodeId, reason: &str, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        if node.state != NodeState::Down {
            node.state = NodeState::Down;
            node.state_changed_ms = now_ms;
        }
        node.state_reason = Some(reason.to_string());
        for job in self.jobs.values_mut() {
            if job.alloc.as_ref().is_none_or(|a| a.node != id) {
                continue;
            }
            if job.state == JobState::Running {
                fail_on_node(job, reason, now_ms);
            } else {
                // Already final (cancelled, awaiting the kill): the node is gone, so is the process.
                job.alloc = None;
            }
        }
        CommandResult::Ok
    }

    fn drain(&mut self, id: NodeId, reason: &str, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        node.drained = true;
        node.state_reason = Some(reason.to_string());
        if node.state == NodeState::Up {
            node.state = NodeState::Drained;
            node.state_changed_ms = now_ms;
        }
        CommandResult::Ok
    }

    fn resume(&mut self, id: NodeId, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        node.drained = false;
        if node.state == NodeState::Drained {
            node.state = NodeState::Up;
            node.state_changed_ms = now_ms;
            node.state_reason = None;
        }
        CommandResult::Ok
    }

    fn submit(&mut self, spec: &JobSpec, now_ms: u64) -> CommandResult {
        if let Err(e) = spec.validate() {
            return rejected(e);
        }
        let id = self.next_job_id;
        self.next_job_id += 1;
        self.jobs.insert(
            id,
            Job {
                id,
                spec: spec.clone(),
                state: JobState::Pending,
                exit_code: None,
                run: 0,
                alloc: None,
                last_node: None,
                last_gpus: Vec::new(),
                launched_by: None,
                submit_ms: now_ms,
                start_ms: None,
                end_ms: None,
                restart_count: 0,
                reason: None,
            },
        );
        CommandResult::Submitted { job: id }
    }

    fn plan(&mut self, placements: &[Placement], now_ms: u64) -> CommandResult {
        // One view for the whole plan, updated as placements are accepted, so two placements of
        // one plan can never take the same GPU.
        let mut nodes = self.node_views();
        let mut accepted = Vec::new();
        let mut rejected = Vec::new();
        for placement in placements {
            match self.check_placement(&nodes, placement) {
                Ok(()) => {
                    if let Some(view) = nodes.get_mut(&placement.alloc.node) {
                        view.take(&placement.alloc);
                    }
                    if let Some(job) = self.jobs.get_mut(&placement.job) {
                        job.state = JobState::Running;
                        job.run = placement.run;
                        job.alloc = Some(placement.alloc.clone());
                        job.last_node = Some(placement.alloc.node);
                        job.last_gpus = placement.alloc.gpus.clone();
                        job.launched_by = None;
                        job.start_ms = Some(now_ms);
                        job.end_ms = None;
                        job.exit_code = None;
                        job.reason = None;
                    }
                    accepted.push(placement.job);
                }
                Err(reason) => {
                    if let Some(job) = self.jobs.get_mut(&placement.job) {
                        if job.state == JobState::Pending {
                            job.reason = Some(reason.clone());
                        }
                    }
                    rejected.push((placement.job, reason));
                }
            }
        }
        CommandResult::Planned { accepted, rejected }
    }

    /// Why `placement` cannot be applied now, if it cannot.
    fn check_placement(
        &self,
        nodes: &BTreeMap<NodeId, NodeView>,
        placement: &Placement,
    ) -> Result<(), String> {
        let job = self
            .jobs
            .get(&placement.job)
            .ok_or_else(|| format!("job {} does not exist", placement.job))?;
        if job.state != JobState::Pending {
            return Err(format!("job {} is {}, not PENDING", job.id, job.state));
        }
        let next_run = job.run.saturating_add(1);
        if placement.run != next_run {
            return Err(format!(
                "stale plan: run {} but the next run is {next_run}",
                placement.run
            ));
        }
        let node = nodes
            .get(&placement.alloc.node)
            .ok_or_else(|| format!("node {} does not exist", placement.alloc.node))?;
        let request = job_request(job);
        if placement.alloc.cpus != request.cpus || placement.alloc.mem_mib != request.mem_mib {
            return Err(format!(
                "allocation of {} cpus and {} MiB does not match the request of {} cpus and {} MiB",
                placement.alloc.cpus, placement.alloc.mem_mib, request.cpus, request.mem_mib
            ));
        }
        scheduler::fits(node, &request, &placement.alloc.gpus).map_err(|m| m.to_string())
    }

    fn launch_confirmed(
        &mut self,
        id: JobId,
        run: RunNo,
        node: NodeId,
        instance: InstanceId,
        now_ms: u64,
    ) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        let current = job.run == run
            && job.state == JobState::Running
            && job.alloc.as_ref().is_some_and(|a| a.node == node)
            && job.launched_by.is_none();
        if !current {
            return rejected(format!("stale launch confirmation for job {id} run {run}"));
        }
        job.launched_by = Some(instance);
        job.start_ms = Some(now_ms);
        CommandResult::Ok
    }

    fn run_finished(
        &mut self,
        id: JobId,
        run: RunNo,
        node: NodeId,
        outcome: &RunOutcome,
        now_ms: u64,
    ) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        if job.run != run || job.alloc.as_ref().is_none_or(|a| a.node != node) {
            return rejected("stale run");
        }
        job.alloc = None;
        if job.state == JobState::Running {
            let (state, exit_code, reason) = match outcome {
                RunOutcome::Exited(0) => (JobState::Completed, Some(0), None),
                RunOutcome::Exited(code) => (JobState::Failed, Some(*code), None),
                RunOutcome::Signaled(signal) => {
                    (JobState::Failed, Some(signal.saturating_add(128)), None)
                }
                RunOutcome::TimedOut => (JobState::Timeout, None, None),
                RunOutcome::Killed => (JobState::Cancelled, None, None),
                RunOutcome::LaunchFailed(msg) => (JobState::Failed, None, Some(msg.clone())),
            };
            job.state = state;
            job.exit_code = exit_code;
            job.reason = reason;
        }
        job.end_ms.get_or_insert(now_ms);
        CommandResult::Ok
    }

    fn cancel(&mut self, id: JobId, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        match job.state {
            JobState::Pending => {
                job.state = JobState::Cancelled;
                job.end_ms = Some(now_ms);
                CommandResult::Ok
            }
            JobState::Running => {
                // The allocation stays until the agent reports the process gone (or the node is
                // declared down), so its GPUs are not handed out while it may still run.
                job.state = JobState::Cancelled;
                job.end_ms = Some(now_ms);
                CommandResult::Ok
            }
            _ => rejected("already finished"),
        }
    }

    /// What the scheduler needs: schedulable nodes with their free resources, and pending jobs in
    /// id (submit) order.
    pub fn scheduler_view(&self) -> ClusterView {
        let pending = self
            .jobs
            .values()
            .filter(|j| j.state == JobState::Pending)
            .map(job_request)
            .collect();
        ClusterView {
            nodes: self.node_views(),
            pending,
        }
    }

    fn node_views(&self) -> BTreeMap<NodeId, NodeView> {
        let mut views: BTreeMap<NodeId, NodeView> = self
            .nodes
            .values()
            .map(|n| {
                let view = NodeView {
                    id: n.id,
                    name: n.name.clone(),
                    schedulable: n.state == NodeState::Up && !n.drained,
                    gpus: n
                        .inventory
                        .gpus
                        .iter()
                        .map(|g| GpuSlot {
                            index: g.index,
                            gres_type: g.gres_type.clone(),
                            busy: false,
                        })
                        .collect(),
                    cpus_total: n.inventory.cpus,
                    cpus_used: 0,
                    mem_total_mib: n.inventory.memory_mib,
                    mem_used_mib: 0,
                };
                (n.id, view)
            })
            .collect();
        for alloc in self.allocs() {
            if let Some(view) = views.get_mut(&alloc.node) {
                for slot in view
                    .gpus
                    .iter_mut()
                    .filter(|g| alloc.gpus.contains(&g.index))
                {
                    slot.busy = true;
                }
                view.cpus_used = view.cpus_used.saturating_add(alloc.cpus);
                view.mem_used_mib = view.mem_used_mib.saturating_add(alloc.mem_mib);
            }
        }
        views
    }

    fn allocs(&self) -> impl Iterator<Item = &Allocation> {
        self.jobs.values().filter_map(|j| j.alloc.as_ref())
    }

    /// GPUs of `node` that no allocation holds; 0 for an unknown node.
    pub fn gpus_free(&self, node: NodeId) -> u32 {
        let Some(record) = self.nodes.get(&node) else {
            return 0;
        };
        let busy: BTreeSet<u32> = self
            .allocs()
            .filter(|a| a.node == node)
            .flat_map(|a| a.gpus.iter().copied())
            .collect();
        record
            .inventory
            .gpus
            .iter()
            .filter(|g| !busy.contains(&g.index))
            .count() as u32
    }

    pub fn node_by_name(&self, name: &str) -> Option<&NodeRecord> {
        self.nodes.values().find(|n| n.name == name)
    }

    /// Jobs holding an allocation on `node` (running, or cancelled and not yet confirmed gone).
    pub fn running_on(&self, node: NodeId) -> Vec<&Job> {
        self.jobs
            .values()
            .filter(|j| j.alloc.as_ref().is_some_and(|a| a.node == node))
            .collect()
    }

    /// Hex SHA-256 of the encoded state: equal on every replica that applied the same log.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(proto::encode(self)))
    }

    /// Cheap checks that hold after every apply, in debug and release builds alike.
    fn check_invariants(&self) {
        let mut held: BTreeSet<(NodeId, u32)> = BTreeSet::new();
        for job in self.jobs.values() {
            assert!(
                job.id < self.next_job_id,
                "job {} not below next_job_id {}",
                job.id,
                self.next_job_id
            );
            match job.state {
                JobState::Pending => assert!(
                    job.alloc.is_none(),
                    "pending job {} holds an allocation",
                    job.id
                ),
                JobState::Running => assert!(
                    job.alloc.is_some(),
                    "running job {} holds no allocation",
                    job.id
                ),
                _ => {}
            }
            if let Some(alloc) = &job.alloc {
                assert!(
                    self.nodes.contains_key(&alloc.node),
                    "job {} allocated on unknown node {}",
                    job.id,
                    alloc.node
                );
                for &gpu in &alloc.gpus {
                    assert!(
                        held.insert((alloc.node, gpu)),
                        "gpu {gpu} of node {} held by two allocations",
                        alloc.node
                    );
                }
            }
        }
        for node in self.nodes.values() {
            assert!(
                node.id < self.next_node_id,
                "node {} not below next_node_id {}",
                node.id,
                self.next_node_id
            );
        }
    }
}

/// What a pending job asks for its next run.
fn job_request(job: &Job) -> JobRequest {
    JobRequest {
        id: job.id,
        run: job.run.saturating_add(1),
        gpus: job.spec.gpus(),
        gpu_type: job.spec.gres.as_ref().and_then(|g| g.gpu_type.clone()),
        cpus: job.spec.cpus_per_task,
        mem_mib: job.spec.mem_mib,
    }
}

#[cfg(test)]
mod tests {
    use proto::{GpuInfo, GresRequest};

    use super::*;

    fn inventory(gpus: u32) -> Inventory {
        Inventory {
            gpus: (0..gpus)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    model: "NVIDIA H100 80GB HBM3".into(),
                    gres_type: "h100".into(),
                    memory_mib: 80 * 1024,
                })
                .collect(),
            cpus: 64,
            memory_mib: 512 * 1024,
        }
    }

    fn spec(gpus: u32) -> JobSpec {
        JobSpec {
            name: "train".into(),
            argv: vec!["python".into(), "train.py".into()],
            script: None,
            gres: (gpus > 0).then_some(GresRequest {
                gpu_type: None,
                count: gpus,
            }),
            cpus_per_task: 4,
            mem_mib: 1024,
            time_limit_ms: None,
            workdir: "/home/u".into(),
            env: BTreeMap::new(),
            output: None,
            error: None,
            user: "u".into(),
            requeue: false,
        }
    }

    fn register(s: &mut ClusterState, name: &str, gpus: u32, instance: InstanceId) -> NodeId {
        let cmd = Command::RegisterNode {
            name: name.into(),
            addr: format!("{name}:7000"),
            inventory: inventory(gpus),
            instance,
            now_ms: 10,
        };
        match s.apply(&cmd) {
            CommandResult::NodeRegistered { id } => id,
            other => panic!("register failed: {other:?}"),
        }
    }

    fn submit(s: &mut ClusterState, gpus: u32) -> JobId {
        match s.apply(&Command::Submit {
            spec: spec(gpus),
            now_ms: 20,
        }) {
            CommandResult::Submitted { job } => job,
            other => panic!("submit failed: {other:?}"),
        }
    }

    fn placement(job: JobId, run: RunNo, node: NodeId, gpus: &[u32]) -> Placement {
        Placement {
            job,
            run,
            alloc: Allocation {
                node,
                gpus: gpus.to_vec(),
                cpus: 4,
                mem_mib: 1024,
            },
        }
    }

    fn plan(
        s: &mut ClusterState,
        placements: Vec<Placement>,
    ) -> (Vec<JobId>, Vec<(JobId, String)>) {
        match s.apply(&Command::Plan {
            placements,
            now_ms: 30,
        }) {
            CommandResult::Planned { accepted, rejected } => (accepted, rejected),
            other => panic!("plan failed: {other:?}"),
        }
    }

    /// A cluster with one 4-GPU node and one job running on GPUs 0 and 1, launched by instance 7.
    fn running_job() -> (ClusterState, NodeId, JobId) {
        let mut s = ClusterState::default();
        let node = register(&mut s, "n1", 4, 7);
        let job = submit(&mut s, 2);
        assert_eq!(
            plan(&mut s, vec![placement(job, 1, node, &[0, 1])]).0,
            vec![job]
        );
        let confirm = Command::LaunchConfirmed {
            job,
            run: 1,
            node,
            instance: 7,
            now_ms: 35,
        };
        assert_eq!(s.apply(&confirm), CommandResult::Ok);
        (s, node, job)
    }

    #[test]
    fn register_assigns_ids_and_reregister_keeps_them() {
        let mut s = ClusterState::default();
        assert_eq!(register(&mut s, "a", 2, 1), 1);
        assert_eq!(register(&mut s, "b", 2, 1), 2);
        assert_eq!(register(&mut s, "a", 4, 1), 1);
        assert_eq!(s.nodes.len(), 2);
        assert_eq!(s.nodes[&1].inventory.gpus.len(), 4);
        assert_eq!(s.next_node_id, 3);
        assert_eq!(s.node_by_name("b").map(|n| n.id), Some(2));
        assert!(s.node_by_name("c").is_none());
    }

    #[test]
    fn reregister_with_a_new_instance_fails_running_jobs() {
        let (mut s, node, job) = running_job();
        s.apply(&Command::Drain {
            node,
            reason: "maint".into(),
            now_ms: 40,
        });
        register(&mut s, "n1", 4, 8);
        let j = &s.jobs[&job];
        assert_eq!(j.state, JobState::NodeFail);
        assert_eq!(j.alloc, None);
        assert_eq!(j.end_ms, Some(10));
        assert_eq!(j.reason.as_deref(), Some("node restarted"));
        assert_eq!(s.nodes[&node].instance, 8);
        assert_eq!(s.nodes[&node].state, NodeState::Drained);
        assert_eq!(s.gpus_free(node), 4);
    }

    #[test]
    fn reregister_with_the_same_instance_keeps_jobs() {
        let (mut s, node, job) = running_job();
        register(&mut s, "n1", 4, 7);
        assert_eq!(s.jobs[&job].state, JobState::Running);
        assert_eq!(s.gpus_free(node), 2);
    }

    #[test]
    fn node_up_with_new_instance_fails_jobs_of_the_old_one_only() {
        let (mut s, node, job) = running_job();
        // A second job placed but not yet confirmed: the new instance may still launch it.
        let pending_launch = submit(&mut s, 1);
        assert_eq!(
            plan(&mut s, vec![placement(pending_launch, 1, node, &[2])]).0,
            vec![pending_launch]
        );
        assert_eq!(
            s.apply(&Command::NodeUp {
                node,
                instance: 7,
                now_ms: 50
            }),
            CommandResult::Ok
        );
        assert_eq!(s.jobs[&job].state, JobState::Running);
        assert_eq!(
            s.apply(&Command::NodeUp {
                node,
                instance: 9,
                now_ms: 60
            }),
            CommandResult::Ok
        );
        assert_eq!(s.jobs[&job].state, JobState::NodeFail);
        assert_eq!(s.jobs[&job].end_ms, Some(60));
        assert_eq!(s.jobs[&pending_launch].state, JobState::Running);
        assert!(s.jobs[&pending_launch].launch_pending());
        assert_eq!(s.nodes[&node].instance, 9);
        assert!(matches!(
            s.apply(&Command::NodeUp {
                node: 99,
                instance: 1,
                now_ms: 0
            }),
            CommandResult::Rejected(_)
        ));
    }

    #[test]
    fn node_down_fails_running_jobs_and_releases_cancelled_ones() {
        let (mut s, node, job) = running_job();
        let cancelled = submit(&mut s, 1);
        plan(&mut s, vec![placement(cancelled, 1, node, &[3])]);
        s.apply(&Command::Cancel {
            job: cancelled,
            now_ms: 70,
        });
        assert_eq!(s.gpus_free(node), 1);
        let down = Command::NodeDown {
            node,
            reason: "heartbeat lost".into(),
            now_ms: 80,
        };
        assert_eq!(s.apply(&down), CommandResult::Ok);
        assert_eq!(s.nodes[&node].state, NodeState::Down);
        assert_eq!(
            s.nodes[&node].state_reason.as_deref(),
            Some("heartbeat lost")
        );
        let j = &s.jobs[&job];
        assert_eq!(
            (j.state, j.exit_code, j.end_ms, j.alloc.clone()),
            (JobState::NodeFail, None, Some(80), None)
        );
        assert_eq!(j.reason.as_deref(), Some("heartbeat lost"));
        let c = &s.jobs[&cancelled];
        assert_eq!(
            (c.state, c.end_ms, c.alloc.clone()),
            (JobState::Cancelled, Some(70), None)
        );
        assert!(s.running_on(node).is_empty());
        assert!(!s.scheduler_view().nodes[&node].schedulable);
    }

    #[test]
    fn drain_and_resume() {
        let (mut s, node, job) = running_job();
        assert_eq!(
            s.apply(&Command::Drain {
                node,
                reason: "maint".into(),
                now_ms: 1
            }),
            CommandResult::Ok
        );
        assert_eq!(s.nodes[&node].state, NodeState::Drained);
        assert!(s.nodes[&node].drained);
        assert_eq!(s.jobs[&job].state, JobState::Running);
        assert!(!s.scheduler_view().nodes[&node].schedulable);
        s.apply(&Command::NodeUp {
            node,
            instance: 7,
            now_ms: 2,
        });
        assert_eq!(s.nodes[&node].state, NodeState::Drained);
        assert_eq!(
            s.apply(&Command::Resume { node, now_ms: 3 }),
            CommandResult::Ok
        );
        assert_eq!(s.nodes[&node].state, NodeState::Up);
        assert!(s.scheduler_view().nodes[&node].schedulable);
        // Down stays down on resume, but the drain is cleared.
        s.apply(&Command::Drain {
            node,
            reason: "maint".into(),
            now_ms: 4,
        });
        s.apply(&Command::NodeDown {
            node,
            reason: "gone".into(),
            now_ms: 5,
        });
        s.apply(&Command::Resume { node, now_ms: 6 });
        assert_eq!(s.nodes[&node].state, NodeState::Down);
        assert!(!s.nodes[&node].drained);
        assert!(matches!(
            s.apply(&Command::Resume {
                node: 42,
                now_ms: 0
            }),
            CommandResult::Rejected(_)
        ));
        assert!(matches!(
            s.apply(&Command::Drain {
                node: 42,
                reason: String::new(),
                now_ms: 0
            }),
            CommandResult::Rejected(_)
        ));
    }

    #[test]
    fn submit_validates_and_numbers_jobs() {
        let mut s = ClusterState::default();
        assert_eq!(submit(&mut s, 1), 1);
        assert_eq!(submit(&mut s, 0), 2);
        let mut bad = spec(1);
        bad.workdir = "relative".into();
        assert!(matches!(
            s.apply(&Command::Submit {
                spec: bad,
                now_ms: 0
            }),
            CommandResult::Rejected(_)
        ));
        assert_eq!(s.next_job_id, 3);
        let j = &s.jobs[&1];
        assert_eq!((j.state, j.run, j.submit_ms), (JobState::Pending, 0, 20));
        let view = s.scheduler_view();
        assert_eq!(
            view.pending
                .iter()
                .map(|r| (r.id, r.run, r.gpus))
                .collect::<Vec<_>>(),
            vec![(1, 1, 1), (2, 1, 0)]
        );
    }

    #[test]
    fn plan_rejects_stale_and_double_placements() {
        let mut s = ClusterState::default();
        let node = register(&mut s, "n1", 2, 1);
        let a = submit(&mut s, 1);
        let b = submit(&mut s, 1);
        let c = submit(&mut s, 1);
        // Same GPU twice in one plan: only the first wins.
        let (accepted, rejected) = plan(
            &mut s,
            vec![
                placement(a, 1, node, &[0]),
                placement(b, 1, node, &[0]),
                placement(c, 2, node, &[1]),
            ],
        );
        assert_eq!(accepted, vec![a]);
        assert_eq!(rejected.iter().map(|r| r.0).collect::<Vec<_>>(), vec![b, c]);
        assert_eq!(rejected[0].1, "gpu 0 is busy");
        assert!(rejected[1].1.starts_with("stale plan"), "{}", rejected[1].1);
        assert_eq!(s.jobs[&b].state, JobState::Pending);
        assert_eq!(s.jobs[&b].reason.as_deref(), Some("gpu 0 is busy"));
        // A plan computed before `a` started is stale now.
        let (accepted, rejected) = plan(&mut s, vec![placement(a, 1, node, &[1])]);
        assert!(accepted.is_empty());
        assert!(rejected[0].1.contains("not PENDING"), "{}", rejected[0].1);
        // Unknown job and node, wrong sizes.
        let (_, rejected) = plan(
            &mut s,
            vec![placement(99, 1, node, &[1]), placement(b, 1, 42, &[1])],
        );
        assert_eq!(rejected.len(), 2);
        let mut greedy = placement(b, 1, node, &[1]);
        greedy.alloc.cpus = 1;
        assert_eq!(plan(&mut s, vec![greedy]).1.len(), 1);
        // A good placement of b still works afterwards.
        assert_eq!(plan(&mut s, vec![placement(b, 1, node, &[1])]).0, vec![b]);
        let j = &s.jobs[&b];
        assert_eq!(
            (j.state, j.run, j.start_ms, j.last_node, j.reason.clone()),
            (JobState::Running, 1, Some(30), Some(node), None)
        );
        assert_eq!(s.gpus_free(node), 0);
        let view = s.scheduler_view();
        assert_eq!(view.nodes[&node].cpus_used, 8);
        assert_eq!(view.nodes[&node].mem_used_mib, 2048);
        assert!(view.nodes[&node].gpus.iter().all(|g| g.busy));
        assert_eq!(
            view.pending.iter().map(|p| p.id).collect::<Vec<_>>(),
            vec![c]
        );
        // Nothing fits on a down node.
        s.apply(&Command::NodeDown {
            node,
            reason: "x".into(),
            now_ms: 40,
        });
        let (_, rejected) = plan(&mut s, vec![placement(c, 1, node, &[0])]);
        assert_eq!(rejected[0].1, "node is not up");
    }

    #[test]
    fn launch_confirmation_only_for_the_current_run() {
        let mut s = ClusterState::default();
        let node = register(&mut s, "n1", 2, 1);
        let job = submit(&mut s, 1);
        let confirm = |run, node, instance| Command::LaunchConfirmed {
            job,
            run,
            node,
            instance,
            now_ms: 50,
        };
        assert!(
            matches!(s.apply(&confirm(1, node, 1)), CommandResult::Rejected(_)),
            "pending job"
        );
        plan(&mut s, vec![placement(job, 1, node, &[0])]);
        assert!(
            matches!(s.apply(&confirm(2, node, 1)), CommandResult::Rejected(_)),
            "wrong run"
        );
        assert!(
            matches!(
                s.apply(&confirm(1, node + 1, 1)),
                CommandResult::Rejected(_)
            ),
            "wrong node"
        );
        assert_eq!(s.apply(&confirm(1, node, 1)), CommandResult::Ok);
        assert_eq!(s.jobs[&job].launched_by, Some(1));
        assert_eq!(s.jobs[&job].start_ms, Some(50));
        assert!(
            matches!(s.apply(&confirm(1, node, 1)), CommandResult::Rejected(_)),
            "twice"
        );
    }

    #[test]
    fn run_outcomes_map_to_final_states() {
        let cases = [
            (RunOutcome::Exited(0), JobState::Completed, Some(0), None),
            (RunOutcome::Exited(3), JobState::Failed, Some(3), None),
            (RunOutcome::Signaled(9), JobState::Failed, Some(137), None),
            (RunOutcome::TimedOut, JobState::Timeout, None, None),
            (RunOutcome::Killed, JobState::Cancelled, None, None),
            (
                RunOutcome::LaunchFailed("no such file".into()),
                JobState::Failed,
                None,
                Some("no such file"),
            ),
        ];
        for (outcome, state, exit_code, reason) in cases {
            let (mut s, node, job) = running_job();
            let done = Command::RunFinished {
                job,
                run: 1,
                node,
                outcome: outcome.clone(),
                now_ms: 90,
            };
            assert_eq!(s.apply(&done), CommandResult::Ok);
            let j = &s.jobs[&job];
            assert_eq!(
                (j.state, j.exit_code, j.reason.as_deref()),
                (state, exit_code, reason),
                "{outcome:?}"
            );
            assert_eq!(
                (j.alloc.clone(), j.end_ms, j.last_gpus.clone()),
                (None, Some(90), vec![0, 1])
            );
            assert_eq!(s.gpus_free(node), 4);
        }
    }

    #[test]
    fn stale_run_reports_are_ignored() {
        let (mut s, node, job) = running_job();
        let report = |run, node| Command::RunFinished {
            job,
            run,
            node,
            outcome: RunOutcome::Exited(0),
            now_ms: 90,
        };
        assert_eq!(
            s.apply(&report(0, node)),
            CommandResult::Rejected("stale run".into())
        );
        assert_eq!(
            s.apply(&report(1, node + 1)),
            CommandResult::Rejected("stale run".into())
        );
        assert_eq!(s.jobs[&job].state, JobState::Running);
        assert_eq!(s.apply(&report(1, node)), CommandResult::Ok);
        // A second report of the same run finds no allocation.
        assert_eq!(
            s.apply(&report(1, node)),
            CommandResult::Rejected("stale run".into())
        );
        assert_eq!(s.jobs[&job].state, JobState::Completed);
        assert!(matches!(s.apply(&report(1, 9)), CommandResult::Rejected(_)));
    }

    #[test]
    fn cancel_of_a_running_job_keeps_its_gpus_until_it_is_gone() {
        let (mut s, node, job) = running_job();
        assert_eq!(
            s.apply(&Command::Cancel { job, now_ms: 100 }),
            CommandResult::Ok
        );
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.end_ms), (JobState::Cancelled, Some(100)));
        assert!(j.alloc.is_some());
        assert_eq!(s.gpus_free(node), 2);
        assert_eq!(s.running_on(node).len(), 1);
        // Its GPUs cannot be planned for another job meanwhile.
        let other = submit(&mut s, 4);
        let (accepted, rejected) = plan(&mut s, vec![placement(other, 1, node, &[0, 1, 2, 3])]);
        assert!(accepted.is_empty());
        assert_eq!(rejected[0].1, "gpu 0 is busy");
        assert_eq!(
            s.apply(&Command::Cancel { job, now_ms: 101 }),
            CommandResult::Rejected("already finished".into())
        );
        let killed = Command::RunFinished {
            job,
            run: 1,
            node,
            outcome: RunOutcome::Exited(0),
            now_ms: 110,
        };
        assert_eq!(s.apply(&killed), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!(
            (j.state, j.end_ms, j.alloc.clone()),
            (JobState::Cancelled, Some(100), None)
        );
        assert_eq!(s.gpus_free(node), 4);
        assert_eq!(
            plan(&mut s, vec![placement(other, 1, node, &[0, 1, 2, 3])]).0,
            vec![other]
        );
    }

    #[test]
    fn cancel_of_pending_and_unknown_jobs() {
        let mut s = ClusterState::default();
        let job = submit(&mut s, 1);
        assert_eq!(
            s.apply(&Command::Cancel { job, now_ms: 5 }),
            CommandResult::Ok
        );
        assert_eq!(s.jobs[&job].state, JobState::Cancelled);
        assert_eq!(s.jobs[&job].end_ms, Some(5));
        assert!(s.scheduler_view().pending.is_empty());
        assert!(matches!(
            s.apply(&Command::Cancel { job: 77, now_ms: 5 }),
            CommandResult::Rejected(_)
        ));
    }

    #[test]
    fn schedule_then_apply_never_grants_a_gpu_twice() {
        let mut s = ClusterState::default();
        let n1 = register(&mut s, "n1", 4, 1);
        let n2 = register(&mut s, "n2", 8, 1);
        for gpus in [3, 2, 4, 1, 8, 2, 1] {
            submit(&mut s, gpus);
        }
        // Two plans computed from the same view: the second is fully stale.
        let view = s.scheduler_view();
        let first = scheduler::schedule(&view, 0);
        let second = scheduler::schedule(&view, 0);
        assert!(!first.placements.is_empty());
        let (accepted, _) = plan(&mut s, first.placements.clone());
        assert_eq!(accepted.len(), first.placements.len());
        let (accepted, rejected) = plan(&mut s, second.placements.clone());
        assert!(accepted.is_empty());
        assert_eq!(rejected.len(), second.placements.len());
        assert_eq!(
            s.gpus_free(n1) + s.gpus_free(n2),
            12 - first
                .placements
                .iter()
                .map(|p| p.alloc.gpus.len() as u32)
                .sum::<u32>()
        );
    }

    #[test]
    fn digest_is_stable_and_follows_state() {
        let (s, _, _) = running_job();
        let (t, _, _) = running_job();
        assert_eq!(s.digest(), t.digest());
        assert_eq!(s.digest().len(), 64);
        let mut u = t.clone();
        submit(&mut u, 1);
        assert_ne!(s.digest(), u.digest());
        let bytes = proto::encode(&s);
        let back: ClusterState = proto::decode(&bytes, usize::MAX).expect("decode state");
        assert_eq!(back, s);
    }
}
