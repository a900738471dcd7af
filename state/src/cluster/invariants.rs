//! The invariants asserted after every command (in release builds too): each job's own, and
//! the whole state's (no GPU held twice, derived indexes equal to what the jobs give).

use std::collections::BTreeSet;

use proto::{Command, Job, JobState, NodeId, RunNo};

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
            | Command::Requeue { job, .. }
            | Command::UpdateJob { job, .. } => {
                if let Some(job) = self.jobs.get(job) {
                    self.check_job(job);
                }
            }
            Command::Plan { placements, .. } => {
                let nodes: BTreeSet<NodeId> = placements.iter().flat_map(|p| p.allocs.iter().map(|a| a.node)).collect();
                let mut held: BTreeSet<(NodeId, u32)> = BTreeSet::new();
                for job in self.jobs_holding_parts() {
                    if placements.iter().any(|p| p.job == job.id || job.array.as_ref().is_some_and(|a| a.array_job == p.job)) {
                        self.check_job(job);
                    }
                    for part in job.parts.iter().filter(|p| nodes.contains(&p.alloc.node)) {
                        for &gpu in &part.alloc.gpus {
                            assert!(held.insert((part.alloc.node, gpu)), "gpu {gpu} of node {} held twice", part.alloc.node);
                        }
                    }
                }
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
        let mut held: BTreeSet<(NodeId, u32)> = BTreeSet::new();
        for job in self.jobs.values() {
            self.check_job(job);
            for part in &job.parts {
                for &gpu in &part.alloc.gpus {
                    assert!(held.insert((part.alloc.node, gpu)), "gpu {gpu} of node {} held twice", part.alloc.node);
                }
            }
        }
        for node in self.nodes.values() {
            assert!(node.id < self.next_node_id, "node {} not below next_node_id {}", node.id, self.next_node_id);
        }
    }
}
