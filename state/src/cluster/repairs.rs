//! Gang repair: a running gang that holds spare nodes (`--spare-nodes`) and loses one of its
//! nodes is not requeued. The lost rank moves to a spare, whose part (committed with the run,
//! holding its resources, launched by nobody) is launched there with that rank; every other
//! part keeps running.
//!
//! A batch job's running steps (`srun`) that had tasks on the lost node name the spare in
//! their records from then on: `srun` starts those tasks there with their ranks
//! (`ClientRequest::StepMove`), and their ends are reported from there.
//!
//! Only a loss that proves the part dead is repaired: the node declared down (it fenced itself
//! before the leader could commit that: the fencing argument, per node) or restarted (its
//! earlier instance's processes died with it). A GPU fault on a live node, a part that failed,
//! and the loss of rank 0 (the batch script, or a command gang's rendezvous host, unless the
//! gang meets at a `--rdzv-endpoint` off its nodes) still end or requeue the gang.

use std::collections::BTreeMap;

use proto::{Job, JobState, NodeId, NodeRecord, NodeRun, NodeState, Repair};

/// Whether a loss may be repaired: it proves the lost part's processes dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loss {
    /// The node was declared down, or restarted.
    NodeGone,
    /// Its GPU failed: the node (and maybe the part's processes) live on.
    GpuFault,
}

/// Moves the rank `job` lost with `part` to one of its spares on a node of `nodes` that is up;
/// false when it cannot (no spare, rank 0 where the gang meets, not running, a loss that
/// proves nothing), and nothing changed. `met_in_store`: the run's gang met in its Corral
/// store (it holds keys), not on rank 0.
pub(super) fn repair(
    job: &mut Job,
    part: &NodeRun,
    loss: Loss,
    nodes: &BTreeMap<NodeId, NodeRecord>,
    met_in_store: bool,
    reason: &str,
    now_ms: u64,
) -> bool {
    if loss != Loss::NodeGone || job.state != JobState::Running || part.run != job.run || job.suspended() {
        return false;
    }
    // Rank 0 runs a batch job's script, and hosts a command gang's rendezvous unless the gang
    // meets elsewhere (`--rdzv-endpoint`, or the job's store on every node): its loss is
    // repaired only then.
    let rank0_repairable = !job.spec.is_batch() && (job.spec.rdzv_endpoint().is_some() || met_in_store);
    let Some(rank) = job.rank_of(part.alloc.node).filter(|r| *r > 0 || rank0_repairable) else { return false };
    let up = |n: &NodeId| nodes.get(n).is_some_and(|r| r.state == NodeState::Up);
    let spare = job.spares.iter().copied().find(|s| up(s) && job.parts.iter().any(|p| p.run == job.run && p.alloc.node == *s));
    let Some(spare) = spare else { return false };
    let gpus = job.parts.iter().find(|p| p.run == job.run && p.alloc.node == spare).map(|p| p.alloc.gpus.clone()).unwrap_or_default();
    job.last_nodes[rank] = spare;
    if let Some(g) = job.last_gpus.get_mut(rank) {
        *g = gpus;
    }
    job.spares.retain(|s| *s != spare);
    if job.repairs.len() >= proto::REPAIRS_KEPT {
        job.repairs.remove(0);
    }
    let rank = rank as u32;
    job.repairs.push(Repair { run: job.run, rank, lost: part.alloc.node, spare, at_ms: now_ms, reason: bounded(reason) });
    let name = |n: NodeId| nodes.get(&n).map(|r| r.name.clone());
    if let (Some(lost), Some(spare)) = (name(part.alloc.node), name(spare)) {
        move_steps(job, &lost, &spare);
    }
    true
}

/// The running steps of `job` with tasks left on node `lost` have them on `spare` from now on.
fn move_steps(job: &mut Job, lost: &str, spare: &str) {
    for step in job.steps.iter_mut().filter(|s| s.end_ms.is_none() && !s.ended_on.iter().any(|n| n == lost)) {
        for n in step.nodes.iter_mut().filter(|n| *n == lost) {
            *n = spare.to_string();
        }
    }
}

/// `reason` cut to [`proto::REPAIR_REASON_BYTES_MAX`] bytes at a character's boundary, so a
/// job's repairs (its `SystemComment`) stay bounded whatever a node reports.
fn bounded(reason: &str) -> String {
    let mut end = reason.len().min(proto::REPAIR_REASON_BYTES_MAX);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}

/// A spare of `job`'s current run lost with `part`: the gang goes on without it (true).
pub(super) fn drop_spare(job: &mut Job, part: &NodeRun) -> bool {
    if part.run != job.run || !job.spares.contains(&part.alloc.node) {
        return false;
    }
    job.spares.retain(|s| *s != part.alloc.node);
    true
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, JobId, JobState, NodeId, RunOutcome};

    use crate::cluster::test_support::{alloc, confirm, finish, plan, register, spec, submit};
    use crate::cluster::ClusterState;

    /// Four nodes and a 3-node job with one spare, running on a, b and c with d spare.
    fn spared(batch: bool) -> (ClusterState, [NodeId; 4], JobId) {
        spared_meeting_at(batch, None)
    }

    /// [`spared`], its gang meeting at `endpoint` (`--rdzv-endpoint`) when given.
    fn spared_meeting_at(batch: bool, endpoint: Option<&str>) -> (ClusterState, [NodeId; 4], JobId) {
        let mut s = ClusterState::default();
        let nodes = [register(&mut s, "a", 100), register(&mut s, "b", 200), register(&mut s, "c", 300), register(&mut s, "d", 400)];
        let mut sp = spec(2, 3);
        sp.set_spare_nodes(1);
        sp.set_batch(batch);
        sp.requeue = true;
        if let Some(e) = endpoint {
            sp.extra.insert(proto::SPEC_EXTRA_RDZV_ENDPOINT.into(), e.into());
        }
        let job = submit(&mut s, sp);
        let allocs = nodes.iter().map(|n| alloc(*n, &[0, 1])).collect();
        assert_eq!(plan(&mut s, job, 1, allocs), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        for (n, instance) in nodes.iter().zip([100, 200, 300]) {
            assert_eq!(confirm(&mut s, job, 1, *n, instance), CommandResult::Ok);
        }
        (s, nodes, job)
    }

    fn launches(s: &ClusterState, job: JobId) -> Vec<NodeId> {
        s.jobs[&job].launches_pending().map(|p| p.alloc.node).collect()
    }

    #[test]
    fn a_spare_holds_its_node_and_starts_nothing_until_a_lost_rank_moves_there() {
        let (mut s, [a, b, c, d], job) = spared(false);
        let j = &s.jobs[&job];
        assert_eq!((j.run_nodes(), j.spares.as_slice(), j.parts.len()), (&[a, b, c][..], &[d][..], 4), "the spare's part holds its GPUs");
        assert!(launches(&s, job).is_empty(), "nothing launches on a spare");
        s.apply(&Command::NodeDown { node: b, reason: "no heartbeat".into(), now_ms: 1_000 });
        let j = &s.jobs[&job];
        assert_eq!(j.state, JobState::Running, "repaired, not requeued: {:?}", j.reasons);
        assert_eq!((j.run_nodes(), j.spares.as_slice(), j.restart_count), (&[a, d, c][..], &[][..], 0));
        assert_eq!((j.repairs.len(), j.repairs[0].rank, j.repairs[0].lost, j.repairs[0].spare), (1, 1, b, d));
        assert_eq!(launches(&s, job), vec![d], "rank 1 starts on the spare; a and c keep running");
        assert!(j.parts_to_stop().next().is_none(), "no survivor is stopped");
        // A second loss without a spare left requeues the gang, as before.
        s.apply(&Command::NodeDown { node: c, reason: "no heartbeat".into(), now_ms: 2_000 });
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.restart_count), (JobState::Pending, 1));
        assert_eq!(j.parts_to_stop().count(), 2, "a and d are stopped");
    }

    #[test]
    fn the_gang_completes_without_its_spare_which_is_then_released() {
        let (mut s, [a, b, c, d], job) = spared(false);
        for n in [a, b, c] {
            finish(&mut s, job, 1, n, RunOutcome::Exited(0));
        }
        let j = &s.jobs[&job];
        assert_eq!(j.state, JobState::Completed, "the spare's part reports nothing: {:?}", j.reasons);
        assert_eq!(j.parts_to_stop().map(|p| p.alloc.node).collect::<Vec<_>>(), vec![d], "the spare is stopped, then released");
        finish(&mut s, job, 1, d, RunOutcome::Lost("stopped before it started".into()));
        assert!(s.jobs[&job].parts.is_empty() && !s.holding_parts.contains(&job));
    }

    #[test]
    fn losing_the_spare_leaves_the_gang_running_and_losing_rank_0_requeues_it() {
        let (mut s, [a, _b, _c, d], job) = spared(true);
        s.apply(&Command::NodeDown { node: d, reason: "no heartbeat".into(), now_ms: 1_000 });
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.spares.len(), j.parts.len()), (JobState::Running, 0, 3));
        let (mut s, [a2, ..], job) = spared(true);
        assert_eq!(a, a2);
        s.apply(&Command::NodeDown { node: a, reason: "no heartbeat".into(), now_ms: 1_000 });
        assert_eq!(s.jobs[&job].state, JobState::Pending, "the batch script's node: the gang is requeued");
    }

    #[test]
    fn rank_0_of_a_command_gang_is_repaired_only_when_it_meets_off_its_nodes() {
        let down = |s: &mut ClusterState, n: NodeId| s.apply(&Command::NodeDown { node: n, reason: "no heartbeat".into(), now_ms: 1_000 });
        // Meeting at MASTER_ADDR (rank 0's node): the rendezvous dies with it, the gang is requeued.
        let (mut s, [a, ..], job) = spared_meeting_at(false, None);
        down(&mut s, a);
        assert_eq!(s.jobs[&job].state, JobState::Pending);
        // Meeting off its nodes: rank 0 moves to the spare, the others keep running.
        let (mut s, [a, b, c, d], job) = spared_meeting_at(false, Some("store:29400"));
        down(&mut s, a);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.run_nodes(), j.repairs[0].rank, j.restart_count), (JobState::Running, &[d, b, c][..], 0, 0));
        assert_eq!(launches(&s, job), vec![d]);
        // A batch job's script is rank 0 whatever the endpoint.
        let (mut s, [a, ..], job) = spared_meeting_at(true, Some("store:29400"));
        down(&mut s, a);
        assert_eq!(s.jobs[&job].state, JobState::Pending);
        // In the job's own store: repaired once the run's store holds keys (the gang met there).
        let store = |s: &mut ClusterState, job: JobId, op| s.apply(&Command::Store { job, run: 1, op, write: (1, 1), now_ms: 500 });
        let (mut s, [a, ..], job) = spared_meeting_at(false, Some(proto::RDZV_ENDPOINT_CORRAL));
        store(&mut s, job, proto::StoreOp::Delete { key: b"k".to_vec() });
        down(&mut s, a);
        assert_eq!(s.jobs[&job].state, JobState::Pending, "asked for the store, but nobody met there");
        let (mut s, [a, _, _, d], job) = spared_meeting_at(false, Some(proto::RDZV_ENDPOINT_CORRAL));
        store(&mut s, job, proto::StoreOp::Set { key: b"/torch.rendezvous.none".to_vec(), value: b"state".to_vec() });
        down(&mut s, a);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.run_nodes()[0], j.restart_count), (JobState::Running, d, 0));
    }

    #[test]
    fn a_gpu_fault_is_not_repaired_but_a_part_the_node_reports_lost_is() {
        let (mut s, [_a, b, _c, d], job) = spared(false);
        s.apply(&Command::GpuHealth { node: b, gpu: 0, mig_uuid: None, healthy: false, reason: "Xid 79".into(), now_ms: 1_000 });
        assert_eq!(s.jobs[&job].state, JobState::Pending, "the part may still run on a live node: requeued");
        let (mut s, [_a, b, _c, d2], job) = spared(false);
        assert_eq!(d, d2);
        finish(&mut s, job, 1, b, RunOutcome::Lost("node restarted".into()));
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.run_nodes()[1]), (JobState::Running, d));
    }

    #[test]
    fn a_batch_jobs_running_steps_name_the_spare_for_the_lost_nodes_tasks() {
        let (mut s, [_a, b, _c, _d], job) = spared(true);
        let step = |s: &mut ClusterState, step: u32, nodes: &[&str]| {
            let nodes = nodes.iter().map(|n| n.to_string()).collect();
            let cmd = Command::StepStarted { job, run: 1, step, name: "x".into(), nodes, ntasks: 3, now_ms: 500 };
            assert_eq!(s.apply(&cmd), CommandResult::Ok);
        };
        step(&mut s, 0, &["a", "b", "c"]);
        step(&mut s, 1, &["a", "c"]);
        step(&mut s, 2, &["a", "b"]);
        let ended = Command::StepEnded { job, run: 1, step: 2, node: "b".into(), exit_code: 0, signal: None, now_ms: 600 };
        assert_eq!(s.apply(&ended), CommandResult::Ok);
        s.apply(&Command::NodeDown { node: b, reason: "no heartbeat".into(), now_ms: 1_000 });
        let nodes: Vec<Vec<String>> = s.jobs[&job].steps.iter().map(|r| r.nodes.clone()).collect();
        let want = [vec!["a", "d", "c"], vec!["a", "c"], vec!["a", "b"]];
        assert_eq!(nodes, want.map(|v| v.iter().map(|n| n.to_string()).collect::<Vec<_>>()), "step 2's tasks on b had ended");
        // The spare reports the moved tasks' end; b could not any more.
        let end = |node: &str| Command::StepEnded { job, run: 1, step: 0, node: node.into(), exit_code: 0, signal: None, now_ms: 2_000 };
        assert_eq!(s.apply(&end("d")), CommandResult::Ok);
        assert!(matches!(s.apply(&end("b")), CommandResult::Rejected(_)));
    }

    #[test]
    fn a_repair_keeps_at_most_a_bounded_reason() {
        let (mut s, [_a, b, _c, _d], job) = spared(false);
        finish(&mut s, job, 1, b, RunOutcome::Lost("é".repeat(proto::REPAIR_REASON_BYTES_MAX)));
        let reason = &s.jobs[&job].repairs[0].reason;
        assert!(reason.starts_with("node ") && reason.ends_with('é'), "{reason}");
        let max = proto::REPAIR_REASON_BYTES_MAX;
        assert!((max - 1..=max).contains(&reason.len()), "cut at a character's boundary: {} bytes", reason.len());
    }
}
