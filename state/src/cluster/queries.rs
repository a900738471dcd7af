//! Read-only questions about the state: the scheduler's view, free GPUs and held CPUs and
//! memory per node, the jobs that hold parts, nodes by name.

use std::collections::{BTreeMap, BTreeSet};

use proto::{Job, NodeId, NodeRecord, NodeRun};

use super::ClusterState;
use crate::view;

impl ClusterState {
    /// The scheduler's input built from this state (see [`view::scheduler_view`]).
    pub fn scheduler_view(&self) -> scheduler::ClusterView {
        view::scheduler_view(self)
    }

    /// GPUs of `node` that no part holds; 0 for an unknown node.
    pub fn gpus_free(&self, node: NodeId) -> u32 {
        let Some(record) = self.nodes.get(&node) else {
            return 0;
        };
        let busy: BTreeSet<u32> = self.parts_on(node).flat_map(|p| p.alloc.gpus.iter().copied()).collect();
        record.inventory.gpus.iter().filter(|g| g.healthy && !busy.contains(&g.index)).count() as u32
    }

    /// CPUs and memory (MiB) held on each node by the jobs' parts: one pass over the jobs.
    pub fn cpus_and_memory_held(&self) -> BTreeMap<NodeId, (u32, u64)> {
        let mut held: BTreeMap<NodeId, (u32, u64)> = BTreeMap::new();
        for p in self.jobs_holding_parts().flat_map(|j| j.parts.iter()) {
            let h = held.entry(p.alloc.node).or_default();
            *h = (h.0.saturating_add(p.alloc.cpus), h.1.saturating_add(p.alloc.mem_mib));
        }
        held
    }

    /// The parts that node `node` holds (running, or stopping and not yet confirmed gone).
    pub fn parts_on(&self, node: NodeId) -> impl Iterator<Item = &NodeRun> {
        self.jobs_holding_parts().flat_map(|j| j.parts.iter()).filter(move |p| p.alloc.node == node)
    }

    /// The jobs that hold parts, ascending by id.
    pub fn jobs_holding_parts(&self) -> impl Iterator<Item = &Job> + '_ {
        self.holding_parts.iter().filter_map(|id| self.jobs.get(id))
    }

    pub fn node_by_name(&self, name: &str) -> Option<&NodeRecord> {
        self.nodes.values().find(|n| n.name == name)
    }

    /// Jobs holding resources on `node` (running, or stopping and not yet confirmed gone).
    pub fn running_on(&self, node: NodeId) -> Vec<&Job> {
        self.jobs_holding_parts().filter(|j| j.parts.iter().any(|p| p.alloc.node == node)).collect()
    }
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, JobId, JobSpec, RunOutcome};

    use crate::cluster::test_support::{alloc, confirm, finish, plan, register, spec, submit};
    use crate::cluster::ClusterState;
    use crate::view;

    #[test]
    fn a_cached_view_reuses_unchanged_jobs_and_equals_a_fresh_view_after_every_change() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 100);
        let mut cache = view::ViewCache::default();
        let mut step = |s: &ClusterState, reused: usize, made: usize, what: &str| {
            let cached = view::scheduler_view_cached(s, &mut cache, |_| None);
            assert_eq!(cached, view::scheduler_view(s), "{what}: the cached view is the fresh one");
            assert_eq!((cache.reused, cache.made), (reused, made), "{what}: requests reused and made");
        };
        let limited = JobSpec { time_limit_ms: Some(60_000), ..spec(1, 1) };
        let jobs: Vec<JobId> = (0..4).map(|_| submit(&mut s, limited.clone())).collect();
        step(&s, 0, 4, "first view");
        step(&s, 4, 0, "nothing changed");
        submit(&mut s, spec(1, 1));
        step(&s, 4, 1, "a new job");
        plan(&mut s, jobs[0], 1, vec![alloc(a, &[0])]);
        step(&s, 4, 1, "a placement changes the job's parts");
        confirm(&mut s, jobs[0], 1, a, 100);
        step(&s, 4, 1, "a confirmation starts its run");
        s.apply(&Command::UpdateJob { job: jobs[1], hold: Some(true), time_limit_ms: None, partition: None, now_ms: 40 });
        step(&s, 4, 1, "a hold changes the spec");
        s.apply(&Command::Suspend { job: jobs[0], suspend: true, now_ms: 50 });
        step(&s, 4, 1, "a suspension drops the time limit");
        s.apply(&Command::Cancel { job: jobs[2], now_ms: 60 });
        step(&s, 4, 0, "a cancelled job leaves the view");
        finish(&mut s, jobs[0], 1, a, RunOutcome::Exited(0));
        step(&s, 3, 0, "a finished job leaves the view");
    }

    #[test]
    fn a_cached_view_rebuilds_only_the_nodes_that_changed() {
        let mut s = ClusterState::default();
        let (a, b, c) = (register(&mut s, "a", 100), register(&mut s, "b", 200), register(&mut s, "c", 300));
        let mut cache = view::ViewCache::default();
        let mut step = |s: &ClusterState, reused: usize, what: &str| {
            let cached = view::scheduler_view_cached(s, &mut cache, |_| None);
            assert_eq!(cached, view::scheduler_view(s), "{what}: the cached view is the fresh one");
            assert_eq!(cache.nodes_reused, reused, "{what}: node views reused");
        };
        step(&s, 0, "first view");
        step(&s, 3, "nothing changed");
        let job = submit(&mut s, spec(2, 1));
        step(&s, 3, "a pending job takes nothing");
        assert_eq!(plan(&mut s, job, 1, vec![alloc(a, &[0, 1])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        step(&s, 2, "a placement takes GPUs of a");
        confirm(&mut s, job, 1, a, 100);
        step(&s, 3, "a confirmation takes nothing more");
        s.apply(&Command::GpuHealth { node: b, gpu: 3, mig_uuid: None, healthy: false, reason: "xid 79".into(), now_ms: 40 });
        step(&s, 2, "a GPU of b unhealthy (its inventory changed in place)");
        s.apply(&Command::Drain { node: c, reason: "maintenance".into(), now_ms: 50 });
        step(&s, 2, "c drained");
        s.apply(&Command::Resume { node: c, now_ms: 60 });
        step(&s, 2, "c resumed");
        s.apply(&Command::NodeDown { node: b, reason: "silent".into(), now_ms: 70 });
        step(&s, 2, "b down");
        register(&mut s, "b", 201);
        step(&s, 2, "b back with a new instance");
        let mut policy = s.policy.clone();
        policy.partitions.push(proto::PartitionDef { name: "gpu".into(), nodes: Some(vec!["a".into(), "c".into()]), ..Default::default() });
        assert_eq!(s.apply(&Command::SetPolicy { policy, now_ms: 80 }), CommandResult::Ok);
        step(&s, 0, "a new policy (partitions list nodes)");
        finish(&mut s, job, 1, a, RunOutcome::Exited(0));
        step(&s, 2, "a's GPUs free again");
        step(&s, 3, "nothing changed");
    }
}
