//! Applying the scheduler's plans: each placement checked against views of the nodes it names,
//! then its run started (an array task's job made first) with a free rendezvous port.

use std::collections::{BTreeMap, BTreeSet};

use proto::{CommandResult, JobId, JobState, NodeId, NodeRun, Placement};

use super::ClusterState;
use crate::view;

/// The rendezvous ports in use per first node, gathered once per plan (one scan of the jobs,
/// not one per placement) and kept up to date as the plan starts runs: the same lowest free
/// port a scan before each start would give.
#[derive(Default)]
struct MasterPorts {
    used: Option<BTreeMap<NodeId, BTreeSet<u16>>>,
}

impl MasterPorts {
    /// The lowest port free on `node`, now taken.
    fn take(&mut self, state: &ClusterState, node: NodeId) -> Option<u16> {
        let used = self.used.get_or_insert_with(|| {
            let mut used: BTreeMap<NodeId, BTreeSet<u16>> = BTreeMap::new();
            for j in state.jobs.values() {
                if let (Some(p), Some(port)) = (j.parts.first(), j.master_port) {
                    used.entry(p.alloc.node).or_default().insert(port);
                }
            }
            used
        });
        let on_node = used.entry(node).or_default();
        let port = (proto::MASTER_PORT_FIRST..proto::MASTER_PORT_FIRST + proto::MASTER_PORT_COUNT).find(|p| !on_node.contains(p))?;
        on_node.insert(port);
        Some(port)
    }
}

impl ClusterState {
    pub(super) fn plan(&mut self, placements: &[Placement], array_tasks: &[(u32, u32)], now_ms: u64) -> CommandResult {
        // One view for the whole plan, updated as placements are accepted, so two placements of
        // one plan can never take the same GPU.
        let named: BTreeSet<NodeId> = placements.iter().flat_map(|p| p.allocs.iter().map(|a| a.node)).collect();
        let mut nodes = view::node_views_among(self, &named);
        let tasks: BTreeMap<usize, u32> = array_tasks.iter().map(|(i, t)| (*i as usize, *t)).collect();
        let mut accepted = Vec::new();
        let mut rejected = Vec::new();
        let mut ports = MasterPorts::default();
        for (i, placement) in placements.iter().enumerate() {
            let task = tasks.get(&i).copied();
            let check = self.check_placement(&nodes, placement, task);
            match check {
                Ok(()) => {
                    for alloc in &placement.allocs {
                        if let Some(v) = nodes.get_mut(&alloc.node) {
                            view::take(v, alloc);
                        }
                    }
                    let id = match task {
                        Some(t) => self.start_array_task(placement.job, t),
                        None => placement.job,
                    };
                    self.start_run(id, placement, now_ms, &mut ports);
                    accepted.push(id);
                }
                Err(reason) => rejected.push((placement.job, reason)),
            }
        }
        CommandResult::Planned { accepted, rejected }
    }

    /// Why `placement` (of array task `task`, if any) cannot start now, if it cannot.
    fn check_placement(
        &self,
        nodes: &BTreeMap<NodeId, scheduler::NodeView>,
        placement: &Placement,
        task: Option<u32>,
    ) -> Result<(), String> {
        let job = self.jobs.get(&placement.job).ok_or_else(|| format!("job {} does not exist", placement.job))?;
        if job.state != JobState::Pending {
            return Err(format!("job {} is {}, not PENDING", job.id, job.state));
        }
        if !job.parts.is_empty() {
            return Err(format!("job {} still has parts of run {} stopping", job.id, job.run));
        }
        let next_run = job.run.saturating_add(1);
        if placement.run != next_run {
            return Err(format!("stale plan: run {} but the next run is {next_run}", placement.run));
        }
        let is_array = job.spec.array.is_some() && job.array.is_none();
        match (is_array, task) {
            (false, Some(t)) => return Err(format!("job {} is not an array, so it has no task {t}", job.id)),
            (true, None) => return Err(format!("job {} is an array: a placement must name a task", job.id)),
            (true, Some(t)) => {
                let spec = job.spec.array.as_ref().ok_or("array without tasks")?;
                if !spec.contains(t) {
                    return Err(format!("array {} has no task {t}", job.id));
                }
                if self.array_started.get(&job.id).is_some_and(|s| s.contains(&t)) {
                    return Err(format!("task {t} of array {} already started", job.id));
                }
                if let Some(limit) = spec.throttle {
                    let running =
                        self.array_task_ids(job.id).filter(|(_, id)| self.jobs.get(id).is_some_and(|j| !j.state.is_final())).count();
                    if running >= limit as usize {
                        return Err(format!("array {} already runs {running} tasks (throttle {limit})", job.id));
                    }
                }
            }
            (false, None) => {}
        }
        view::check_gang(nodes, job, &placement.allocs)
    }

    fn start_run(&mut self, id: JobId, placement: &Placement, now_ms: u64, ports: &mut MasterPorts) {
        let master_port = placement.allocs.first().and_then(|a| ports.take(self, a.node));
        if let Some(job) = self.jobs.get_mut(&id) {
            job.state = JobState::Running;
            job.run = placement.run;
            job.parts = placement.allocs.iter().map(|a| NodeRun { run: placement.run, alloc: a.clone(), launched_by: None }).collect();
            if !job.parts.is_empty() {
                self.holding_parts.insert(id);
            }
            job.outcomes.clear();
            // The gang's ranks first (as many as the plan gives a job of `-N MIN-MAX`), then its
            // spares (`JobSpec::spare_nodes`).
            let ranks = placement.allocs.len().saturating_sub(job.spec.spare_nodes() as usize).max(1).min(placement.allocs.len());
            let (gang, spares) = placement.allocs.split_at(ranks);
            job.last_nodes = gang.iter().map(|a| a.node).collect();
            job.last_gpus = gang.iter().map(|a| a.gpus.clone()).collect();
            job.spares = spares.iter().map(|a| a.node).collect();
            job.start_ms = Some(now_ms);
            job.end_ms = None;
            job.exit_code = None;
            job.reasons.clear();
            job.master_port = master_port;
            job.suspension = proto::Suspension::default();
            job.steps.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proto::{Command, CommandResult, JobId, JobState, NodeId, Placement};

    use crate::cluster::test_support::{alloc, gang, plan, register, spec, submit};
    use crate::cluster::ClusterState;
    use crate::view;

    #[test]
    fn master_ports_are_never_shared_on_a_first_node() {
        let (mut s, a, _b, first) = gang();
        let second = submit(&mut s, spec(1, 1));
        plan(&mut s, second, 1, vec![alloc(a, &[4])]);
        assert_eq!(s.jobs[&first].master_port, Some(proto::MASTER_PORT_FIRST));
        assert_eq!(s.jobs[&second].master_port, Some(proto::MASTER_PORT_FIRST + 1));
    }

    #[test]
    fn plan_rejects_stale_wrong_shaped_and_double_placements() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let b = register(&mut s, "b", 2);
        let j1 = submit(&mut s, spec(4, 1));
        let j2 = submit(&mut s, spec(4, 1));
        let j3 = submit(&mut s, spec(1, 2));
        let placements = vec![
            Placement { job: j1, run: 1, allocs: vec![alloc(a, &[0, 1, 2, 3])] },
            Placement { job: j2, run: 1, allocs: vec![alloc(a, &[3, 4, 5, 6])] },
            Placement { job: j3, run: 1, allocs: vec![alloc(b, &[0])] },
            Placement { job: 99, run: 1, allocs: vec![alloc(b, &[1])] },
        ];
        let CommandResult::Planned { accepted, rejected } = s.apply(&Command::Plan { placements, array_tasks: vec![], now_ms: 5 }) else {
            panic!("not planned")
        };
        assert_eq!(accepted, vec![j1]);
        let reasons: BTreeMap<JobId, String> = rejected.into_iter().collect();
        assert_eq!(reasons[&99], "job 99 does not exist");
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons[&j2].contains("gpu 3 is busy"), "{}", reasons[&j2]);
        assert!(reasons[&j3].contains('2') && reasons[&j3].contains("node"), "{}", reasons[&j3]);
        assert_eq!(
            plan(&mut s, j2, 2, vec![alloc(b, &[0, 1, 2, 3])]),
            CommandResult::Planned { accepted: vec![], rejected: vec![(j2, "stale plan: run 2 but the next run is 1".into())] }
        );
        assert_eq!(
            plan(&mut s, j3, 1, vec![alloc(b, &[0]), alloc(b, &[1])]),
            CommandResult::Planned { accepted: vec![], rejected: vec![(j3, "node 2 listed twice".into())] }
        );
        assert_eq!(
            plan(&mut s, j1, 2, vec![alloc(b, &[0, 1, 2, 3])]).clone(),
            CommandResult::Planned { accepted: vec![], rejected: vec![(j1, "job 1 is RUNNING, not PENDING".into())] }
        );
    }

    #[test]
    fn a_node_range_runs_on_any_count_of_its_range_its_spares_last() {
        let mut s = ClusterState::default();
        let n: Vec<NodeId> = ["a", "b", "c", "d", "e"].iter().zip(1..).map(|(name, i)| register(&mut s, name, i)).collect();
        let mut sp = spec(8, 2);
        sp.set_nodes_max(3);
        let job = submit(&mut s, sp.clone());
        let all = |k: usize| n[..k].iter().map(|&node| alloc(node, &[0, 1, 2, 3, 4, 5, 6, 7])).collect::<Vec<_>>();
        let CommandResult::Planned { rejected, .. } = plan(&mut s, job, 1, all(4)) else { panic!("not planned") };
        assert_eq!(rejected, vec![(job, "needs 2-3 nodes, plan gives 4".to_string())]);
        assert_eq!(plan(&mut s, job, 1, all(3)), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        let j = &s.jobs[&job];
        assert_eq!((j.run_nodes(), j.node_count(), j.spares.len()), (&n[..3], 3, 0));
        // With a spare: the ranks it got, then the spare.
        let mut s2 = ClusterState::default();
        let n2: Vec<NodeId> = ["a", "b", "c", "d"].iter().zip(1..).map(|(name, i)| register(&mut s2, name, i)).collect();
        sp.set_spare_nodes(1);
        let job = submit(&mut s2, sp);
        let allocs = n2.iter().map(|&node| alloc(node, &[0, 1, 2, 3, 4, 5, 6, 7])).collect::<Vec<_>>();
        assert_eq!(plan(&mut s2, job, 1, allocs), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        let j = &s2.jobs[&job];
        assert_eq!((j.run_nodes(), j.spares.as_slice()), (&n2[..3], &n2[3..]));
    }

    #[test]
    fn a_plan_is_checked_against_views_of_the_nodes_it_names_alone() {
        let (mut s, a, b, _) = gang();
        let c = register(&mut s, "c", 300);
        let named: BTreeSet<NodeId> = [b, c].into();
        let among = view::node_views_among(&s, &named);
        let all = view::node_views(&s);
        assert_eq!(among.keys().copied().collect::<Vec<_>>(), vec![b, c]);
        assert!(among.iter().all(|(id, v)| all[id] == *v), "the same views, parts taken");
        assert!(all.contains_key(&a) && !among.contains_key(&a));
    }

    #[test]
    fn schedule_then_apply_never_grants_a_gpu_twice() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        for _ in 0..12 {
            submit(&mut s, spec(1, 1));
        }
        let p1 = scheduler::schedule(&s.scheduler_view(), 0);
        // The same stale plan applied twice: the second time every placement is rejected.
        s.apply(&Command::Plan { placements: p1.placements.clone(), array_tasks: vec![], now_ms: 1 });
        let CommandResult::Planned { accepted, .. } = s.apply(&Command::Plan { placements: p1.placements, array_tasks: vec![], now_ms: 2 })
        else {
            panic!()
        };
        assert!(accepted.is_empty());
        assert_eq!(s.gpus_free(a), 0);
        assert_eq!(s.jobs.values().filter(|j| j.state == JobState::Running).count(), 8);
    }
}
