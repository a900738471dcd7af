//! The invariants asserted after every command (in release builds too): each job's own, and
//! the whole state's (no GPU held twice, derived indexes equal to what the jobs give).

use std::collections::{BTreeMap, BTreeSet};

use proto::{Command, Job, JobState, NodeId, NodeRun, RunNo};
use scheduler::Slot;

use super::ClusterState;

impl ClusterState {
    /// The invariants after `cmd`, asserted in release builds too. Debug builds (the tests and
    /// the simulator) check the whole state after every command; release builds check what the
    /// command touched (its job, the jobs it placed and their nodes), and the whole state after
    /// the rare node-wide commands, so a command's cost does not grow with the hot state.
    pub(super) fn check_after(&self, cmd: &Command) {
        if cfg!(debug_assertions) {
            return self.check_invariants();
        }
        match cmd {
            Command::Submit { .. } | Command::ArchiveJobs { .. } | Command::PruneAccounting { .. } => {
                if let Some(job) = self.jobs.get(&self.next_job_id.saturating_sub(1)) {
                    self.check_job(job);
                }
            }
            Command::LaunchConfirmed { job, .. }
            | Command::RunFinished { job, .. }
            | Command::Cancel { job, .. }
            | Command::TimeOut { job, .. }
            | Command::Requeue { job, .. }
            | Command::UpdateJob { job, .. } => {
                if let Some(job) = self.jobs.get(job) {
                    self.check_job(job);
                }
            }
            Command::Store { job, .. } => self.check_store(*job),
            Command::Plan { placements, .. } => {
                let nodes: BTreeSet<NodeId> = placements.iter().flat_map(|p| p.allocs.iter().map(|a| a.node)).collect();
                let mut held = Holdings::default();
                for job in self.jobs_holding_parts() {
                    if placements.iter().any(|p| p.job == job.id || job.array.as_ref().is_some_and(|a| a.array_job == p.job)) {
                        self.check_job(job);
                    }
                    job.parts.iter().filter(|p| nodes.contains(&p.alloc.node)).for_each(|p| held.add(p));
                }
                self.check_holdings(&held);
            }
            _ => self.check_invariants(),
        }
    }

    /// One job's own invariants.
    fn check_job(&self, job: &Job) {
        assert!(job.id < self.next_job_id, "job {} not below next_job_id {}", job.id, self.next_job_id);
        if job.state == JobState::Running {
            assert!(job.parts.iter().any(|p| p.run == job.run), "running job {} holds no part of run {}", job.id, job.run);
        }
        if job.state == JobState::Pending {
            assert!(job.suspension.since_ms.is_none(), "pending job {} is suspended", job.id);
        }
        let mut nodes_of_run: BTreeSet<(RunNo, NodeId)> = BTreeSet::new();
        for part in &job.parts {
            assert!(part.run <= job.run, "job {} holds a part of future run {}", job.id, part.run);
            assert!(nodes_of_run.insert((part.run, part.alloc.node)), "job {} has two parts on node {}", job.id, part.alloc.node);
            assert!(self.nodes.contains_key(&part.alloc.node), "job {} holds a part on unknown node {}", job.id, part.alloc.node);
        }
    }

    /// Every invariant over the whole state.
    pub(super) fn check_invariants(&self) {
        assert!(self.submit_keys == crate::submit_keys::SubmitKeys::of(&self.jobs), "the submission keys index its jobs");
        assert!(self.holding_parts == Self::holding_parts_of(&self.jobs), "holding_parts names the jobs that hold parts");
        let mut held = Holdings::default();
        for job in self.jobs.values() {
            self.check_job(job);
            job.parts.iter().for_each(|p| held.add(p));
        }
        self.check_holdings(&held);
        self.check_stores();
        for node in self.nodes.values() {
            assert!(node.id < self.next_node_id, "node {} not below next_node_id {}", node.id, self.next_node_id);
        }
    }

    /// No GPU or MIG instance held by two parts, no GPU held whole while it is shared, and no
    /// GPU's shards held past what it is configured with.
    fn check_holdings(&self, held: &Holdings) {
        for (&(node, gpu), &shards) in &held.shards {
            assert!(!held.whole.contains(&(node, gpu)), "gpu {gpu} of node {node} held whole and shared");
            let configured = self.nodes.get(&node).and_then(|n| n.inventory.gpus.iter().find(|g| g.index == gpu)).map_or(0, |g| g.shards);
            assert!(shards <= configured, "gpu {gpu} of node {node} has {shards} shards held of {configured}");
        }
    }
}

/// What parts hold, GPU by GPU: whole GPUs and MIG instances (each at most once) and shards.
#[derive(Default)]
struct Holdings {
    slots: BTreeSet<(NodeId, u32)>,
    whole: BTreeSet<(NodeId, u32)>,
    shards: BTreeMap<(NodeId, u32), u32>,
}

impl Holdings {
    fn add(&mut self, part: &NodeRun) {
        let node = part.alloc.node;
        for &slot in &part.alloc.gpus {
            match scheduler::decode_slot(slot) {
                Slot::Shard { gpu, shards } => *self.shards.entry((node, gpu)).or_default() += shards,
                kind => {
                    assert!(self.slots.insert((node, slot)), "gpu {slot} of node {node} held twice");
                    self.whole.insert((node, kind.gpu()));
                }
            }
        }
    }
}
