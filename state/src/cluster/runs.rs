//! A placed run's parts: launch confirmations, each part's end and the final state the ends
//! decide, and each part's GPU time charged to its job and association (fair share), the
//! run's wall-clock time once its last part is gone (`wall`).

use proto::slot::{decode_slot, Slot};
use proto::{CommandResult, InstanceId, Job, JobId, JobState, NodeId, NodeRun, RunNo, RunOutcome};

use super::jobs::requeue_job;
use super::wall::Ledger;
use super::{rejected, ClusterState, USAGE_ASSOCS_MAX};

/// Adds the GPU time of `part` from the run's start until `now_ms` to the job's account and to
/// its association's usage, decayed to `now_ms` first: GPU-seconds, a MIG instance weighted by
/// its share of the GPU's compute slices (a 3g.71gb instance for 7 s is 3 GPU-seconds), shards
/// by their share of the GPU's (2 of 4 shards for 8 s is 4 GPU-seconds). The last part of the
/// current run gone, the run's wall-clock time is charged (`GrpWall`).
pub(super) fn account(ledger: &mut Ledger<'_>, job: &mut Job, part: &NodeRun, now_ms: u64) {
    let Some(start) = job.start_ms else { return };
    if part.run == job.run && !job.parts.iter().any(|p| p.run == job.run) {
        ledger.charge_wall(job, now_ms);
    }
    let gres_type = job.spec.gres.as_ref().and_then(|g| g.gpu_type.as_deref());
    let elapsed_ms = now_ms.saturating_sub(start);
    let (mut slices, mut shard_ms) = (0u64, 0u64);
    for &slot in &part.alloc.gpus {
        match decode_slot(slot) {
            Slot::Shard { gpu, shards } => {
                let total = ledger
                    .nodes
                    .get(&part.alloc.node)
                    .and_then(|n| n.inventory.gpus.iter().find(|g| g.index == gpu))
                    .map_or(0, |g| g.shards);
                shard_ms = shard_ms.saturating_add(elapsed_ms.saturating_mul(u64::from(shards)) / u64::from(total.max(shards).max(1)));
            }
            _ => slices += u64::from(scheduler::mig::slot_compute_slices(slot, gres_type)),
        }
    }
    let gpu_ms = elapsed_ms.saturating_mul(slices) / u64::from(scheduler::mig::COMPUTE_SLICES) + shard_ms;
    job.gpu_seconds = job.gpu_seconds.saturating_add(gpu_ms / 1000);
    if gpu_ms == 0 {
        return;
    }
    let account = job.spec.account.clone().unwrap_or_else(|| proto::accounts::ROOT_ACCOUNT.to_string());
    let key = (account, job.spec.user.clone());
    if !ledger.usage.contains_key(&key) && ledger.usage.len() >= USAGE_ASSOCS_MAX {
        return;
    }
    let entry = ledger.usage.entry(key).or_default();
    *entry = scheduler::fairshare::add_usage(entry, gpu_ms, 0, now_ms, ledger.half_life_ms);
}

/// The final state of a run all of whose parts ended, from how each ended: a launch failure
/// first, then a time-out, an OOM kill, a signal, a non-zero exit; then a kill; all zero is COMPLETED. A kill
/// ranks below a failure: a cancelled job is final before its parts report, so a `Killed` here
/// is the cluster stopping the rest of a gang after one part ended, and the part that ended
/// decides.
fn final_state(outcomes: &[(NodeId, RunOutcome)]) -> (JobState, Option<i32>, Option<String>) {
    if let Some((node, RunOutcome::LaunchFailed(msg))) = outcomes.iter().find(|(_, o)| matches!(o, RunOutcome::LaunchFailed(_))) {
        return (JobState::Failed, None, Some(format!("launch failed on node {node}: {msg}")));
    }
    if outcomes.iter().any(|(_, o)| *o == RunOutcome::TimedOut) {
        return (JobState::Timeout, None, Some("time limit reached".into()));
    }
    if let Some((node, RunOutcome::OutOfMemory(why))) = outcomes.iter().find(|(_, o)| matches!(o, RunOutcome::OutOfMemory(_))) {
        return (JobState::OutOfMemory, None, Some(format!("out of memory on node {node}: {why}")));
    }
    if let Some((_, RunOutcome::Signaled(sig))) = outcomes.iter().find(|(_, o)| matches!(o, RunOutcome::Signaled(_))) {
        return (JobState::Failed, Some(sig.saturating_add(128)), Some(format!("killed by signal {sig}")));
    }
    if let Some((_, RunOutcome::Exited(code))) = outcomes.iter().find(|(_, o)| matches!(o, RunOutcome::Exited(c) if *c != 0)) {
        return (JobState::Failed, Some(*code), None);
    }
    if outcomes.iter().any(|(_, o)| *o == RunOutcome::Killed) {
        return (JobState::Cancelled, None, None);
    }
    (JobState::Completed, Some(0), None)
}

impl ClusterState {
    pub(super) fn launch_confirmed(&mut self, id: JobId, run: RunNo, node: NodeId, instance: InstanceId, now_ms: u64) -> CommandResult {
        // A confirmation from an instance that is no longer the node's came from a process
        // that died: accepting it would pin the part to nothing.
        if self.nodes.get(&node).is_some_and(|n| n.instance != instance) {
            return rejected(format!("launch confirmation for job {id} from a dead instance of node {node}"));
        }
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        let live = job.run == run && job.state == JobState::Running;
        let Some(part) = job.parts.iter_mut().find(|p| live && p.run == run && p.alloc.node == node && p.launched_by.is_none()) else {
            return rejected(format!("stale launch confirmation for job {id} run {run} on node {node}"));
        };
        part.launched_by = Some(instance);
        if job.parts.iter().all(|p| p.run != run || p.launched_by.is_some()) {
            job.start_ms = Some(now_ms);
        }
        CommandResult::Ok
    }

    pub(super) fn run_finished(&mut self, id: JobId, run: RunNo, node: NodeId, outcome: &RunOutcome, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        let Some(pos) = job.parts.iter().position(|p| p.run == run && p.alloc.node == node) else {
            return rejected("stale run");
        };
        let part = job.parts.remove(pos);
        if job.parts.is_empty() {
            self.holding_parts.remove(&id);
        }
        let mut ledger = Ledger {
            usage: &mut self.usage,
            qos_usage: &mut self.qos_usage,
            accounts: &self.accounts,
            half_life_ms: self.policy.decay_half_life_ms(),
            nodes: &self.nodes,
        };
        account(&mut ledger, job, &part, now_ms);
        if run != job.run || job.state != JobState::Running || super::repairs::drop_spare(job, &part) {
            // A part of a cancelled, failed or requeued run, or a spare, is gone: only its
            // resources return.
            return CommandResult::Ok;
        }
        if let RunOutcome::PreflightFailed(why) = outcome {
            // The command never started (every node learns the same verdict): hold the job
            // for a person to look at the network, keeping its restart count.
            job.state = JobState::Pending;
            std::sync::Arc::make_mut(&mut job.spec).hold = true;
            job.exit_code = None;
            job.start_ms = None;
            job.end_ms = None;
            job.outcomes.clear();
            job.reasons = vec![format!("preflight failed on node {node}: {why}")];
            return CommandResult::Ok;
        }
        // In a batch job only the script's node (the first) runs the job; the others hold GPUs
        // for its steps. Once the script ended, nothing they report matters.
        let holder = job.spec.is_batch() && job.last_nodes.first() != Some(&node);
        let matters = !(holder && job.batch_ended());
        if let (true, RunOutcome::Lost(why)) = (matters, outcome) {
            let reason = format!("node {node}: {why}");
            // The node says the part does not run there (and refuses it from now on).
            let met_in_store = self.stores.get(&job.id).is_some_and(|s| s.run == job.run && !s.keys.is_empty());
            if super::repairs::repair(job, &part, super::repairs::Loss::NodeGone, &self.nodes, met_in_store, &reason, now_ms) {
                return CommandResult::Ok;
            }
            if job.spec.requeue {
                requeue_job(&mut self.requeues, &mut ledger, job, &reason, now_ms);
            } else {
                job.state = JobState::NodeFail;
                job.exit_code = None;
                job.end_ms = Some(now_ms);
                job.reasons = vec![reason];
            }
            return CommandResult::Ok;
        }
        // A holder's end decides nothing unless it is a failure of its own (a kill is the
        // cluster stopping it).
        if matters && (!holder || *outcome != RunOutcome::Killed) {
            job.outcomes.push((node, outcome.clone()));
        }
        if job.parts.iter().any(|p| p.run == run && !job.spares.contains(&p.alloc.node)) {
            // Other nodes of the gang still run; a failure here makes the leader stop them.
            return CommandResult::Ok;
        }
        let (state, exit_code, reason) = final_state(&job.outcomes);
        job.state = state;
        job.exit_code = exit_code;
        job.reasons = reason.into_iter().collect();
        job.end_ms = Some(now_ms);
        CommandResult::Ok
    }
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, GresRequest, JobId, JobState, NodeId, RunOutcome};

    use crate::cluster::test_support::{
        alloc, confirm, finish, gang, inventory, plan, register, register_again, spec, submit, with_node_n1,
    };
    use crate::cluster::ClusterState;

    /// Two nodes and a 2-node batch job (`sbatch`) running on both, `a` first.
    fn batch_gang() -> (ClusterState, NodeId, NodeId, JobId) {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 100);
        let b = register(&mut s, "b", 200);
        let mut batch = spec(2, 2);
        batch.set_batch(true);
        let job = submit(&mut s, batch);
        plan(&mut s, job, 1, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]);
        confirm(&mut s, job, 1, a, 100);
        confirm(&mut s, job, 1, b, 200);
        (s, a, b, job)
    }

    #[test]
    fn gang_starts_on_all_nodes_and_completes_when_all_report() {
        let (mut s, a, b, job) = gang();
        assert_eq!(s.jobs[&job].state, JobState::Running);
        assert_eq!(s.jobs[&job].start_ms, Some(30));
        assert_eq!(s.gpus_free(a), 6);
        assert_eq!(finish(&mut s, job, 1, a, RunOutcome::Exited(0)), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Running, "one node still runs");
        assert_eq!(s.jobs[&job].parts_to_stop().count(), 0, "a clean exit stops nothing");
        assert_eq!(s.gpus_free(a), 8);
        assert_eq!(finish(&mut s, job, 1, b, RunOutcome::Exited(0)), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.exit_code, j.end_ms), (JobState::Completed, Some(0), Some(5_030)));
        assert_eq!(j.gpu_seconds, 2 * 5 + 2 * 5);
        assert!(j.parts.is_empty());
    }

    #[test]
    fn a_run_keeps_its_whole_gang_in_rank_order_after_some_parts_ended() {
        // A launch re-sent to the last node after the others finished must still name all of
        // them, and give it its rank: seen as a 1-node SLURM_JOB_NODELIST under load.
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, a, RunOutcome::Exited(0));
        let j = &s.jobs[&job];
        assert_eq!(j.parts.len(), 1);
        assert_eq!(j.run_nodes(), &[a, b]);
        assert_eq!((j.rank_of(a), j.rank_of(b)), (Some(0), Some(1)));
    }

    #[test]
    fn a_batch_job_ends_with_its_script_and_the_script_decides_its_state() {
        let (mut s, a, b, job) = batch_gang();
        finish(&mut s, job, 1, a, RunOutcome::Exited(0));
        let stop: Vec<NodeId> = s.jobs[&job].parts_to_stop().map(|p| p.alloc.node).collect();
        assert_eq!(stop, vec![b], "the script ended: the node holding GPUs for steps is released");
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        assert_eq!((s.jobs[&job].state, s.jobs[&job].exit_code), (JobState::Completed, Some(0)), "the holder's kill decides nothing");

        let (mut s, a, b, job) = batch_gang();
        finish(&mut s, job, 1, a, RunOutcome::Exited(2));
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        assert_eq!((s.jobs[&job].state, s.jobs[&job].exit_code), (JobState::Failed, Some(2)));

        // A holder that fails on its own before the script ends stops the job and fails it.
        let (mut s, a, b, job) = batch_gang();
        finish(&mut s, job, 1, b, RunOutcome::LaunchFailed("no account".into()));
        assert_eq!(s.jobs[&job].parts_to_stop().map(|p| p.alloc.node).collect::<Vec<_>>(), vec![a]);
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        assert_eq!(s.jobs[&job].state, JobState::Failed);

        // While the script runs, nothing is stopped.
        let (s, _a, _b, job) = batch_gang();
        assert_eq!(s.jobs[&job].parts_to_stop().count(), 0);

        // A holder stopped before its launch arrived, after the script ended: not a node failure.
        let (mut s, a, b, job) = batch_gang();
        finish(&mut s, job, 1, a, RunOutcome::Exited(0));
        finish(&mut s, job, 1, b, RunOutcome::Lost("stopped before it started".into()));
        assert_eq!(s.jobs[&job].state, JobState::Completed);
    }

    #[test]
    fn a_failed_part_stops_the_gang_and_decides_the_state() {
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, b, RunOutcome::Exited(3));
        let stop: Vec<NodeId> = s.jobs[&job].parts_to_stop().map(|p| p.alloc.node).collect();
        assert_eq!(stop, vec![a]);
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.exit_code), (JobState::Failed, Some(3)), "the part that failed decides, not the kill that stopped the rest");
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, a, RunOutcome::TimedOut);
        finish(&mut s, job, 1, b, RunOutcome::TimedOut);
        assert_eq!(s.jobs[&job].state, JobState::Timeout);
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, a, RunOutcome::Signaled(9));
        finish(&mut s, job, 1, b, RunOutcome::Exited(0));
        assert_eq!((s.jobs[&job].state, s.jobs[&job].exit_code), (JobState::Failed, Some(137)));
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, a, RunOutcome::OutOfMemory("the kernel killed 1 process".into()));
        finish(&mut s, job, 1, b, RunOutcome::Signaled(9));
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.exit_code), (JobState::OutOfMemory, None), "an OOM kill ranks above a signal");
        assert!(
            j.reason().is_some_and(|r| r.contains("out of memory on node") && r.contains("the kernel killed 1 process")),
            "{:?}",
            j.reason()
        );
    }

    #[test]
    fn launch_confirmation_only_for_the_current_run_and_node() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let job = submit(&mut s, spec(1, 1));
        plan(&mut s, job, 1, vec![alloc(a, &[0])]);
        assert!(matches!(confirm(&mut s, job, 2, a, 1), CommandResult::Rejected(_)));
        assert!(matches!(confirm(&mut s, job, 1, 7, 1), CommandResult::Rejected(_)));
        assert_eq!(s.jobs[&job].launches_pending().count(), 1);
        assert_eq!(confirm(&mut s, job, 1, a, 1), CommandResult::Ok);
        assert!(matches!(confirm(&mut s, job, 1, a, 1), CommandResult::Rejected(_)), "confirmed once");
        assert_eq!(s.jobs[&job].launches_pending().count(), 0);
    }

    #[test]
    fn stale_run_reports_are_ignored() {
        let (mut s, a, _b, job) = gang();
        assert_eq!(finish(&mut s, job, 7, a, RunOutcome::Exited(0)), CommandResult::Rejected("stale run".into()));
        assert_eq!(s.jobs[&job].state, JobState::Running);
    }

    #[test]
    fn only_the_current_instance_may_confirm_a_launch() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 100);
        let job = submit(&mut s, spec(1, 1));
        plan(&mut s, job, 1, vec![alloc(a, &[0])]);
        // An agent starts work only after a leader acknowledged its heartbeat, and the leader
        // commits a new instance before it acknowledges: a confirmation from any other instance
        // comes from a process that is gone.
        assert!(matches!(confirm(&mut s, job, 1, a, 101), CommandResult::Rejected(_)));
        register_again(&mut s, "a", 101);
        assert_eq!(s.jobs[&job].state, JobState::Running, "an unconfirmed part waits for the new instance");
        assert_eq!(confirm(&mut s, job, 1, a, 101), CommandResult::Ok);
        let other = submit(&mut s, spec(1, 1));
        plan(&mut s, other, 1, vec![alloc(a, &[1])]);
        register_again(&mut s, "a", 102);
        assert_eq!(s.jobs[&job].state, JobState::NodeFail, "confirmed by 101, gone with it");
        assert_eq!(s.jobs[&other].state, JobState::Running, "unconfirmed: 102 decides");
        assert_eq!(finish(&mut s, other, 1, a, RunOutcome::Lost("stopped before it started".into())), CommandResult::Ok);
        assert_eq!(s.jobs[&other].state, JobState::NodeFail);
        assert_eq!(s.jobs[&other].reasons, vec!["node 1: stopped before it started".to_string()]);
    }

    #[test]
    fn a_failed_preflight_holds_the_job_and_frees_every_part() {
        let (mut s, a, b, job) = gang();
        let why = "n1-n2 12 Mbit/s (minimum 1000 Mbit/s, median 12)".to_string();
        assert_eq!(finish(&mut s, job, 1, b, RunOutcome::PreflightFailed(why.clone())), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.spec.hold, j.restart_count), (JobState::Pending, true, 0));
        assert_eq!(j.reasons, vec![format!("preflight failed on node {b}: {why}")]);
        // The other node learned the same verdict; its part returns its GPUs.
        assert_eq!(finish(&mut s, job, 1, a, RunOutcome::PreflightFailed(why)), CommandResult::Ok);
        assert_eq!((s.gpus_free(a), s.gpus_free(b)), (8, 8));
        assert_eq!(s.jobs[&job].state, JobState::Pending);
        s.check_invariants();
    }

    #[test]
    fn shards_are_accounted_by_their_share_of_the_gpu() {
        let mut inv = inventory(1);
        inv.gpus[0].shards = 4;
        let mut s = with_node_n1(inv);
        let id = s.nodes.values().map(|n| n.id).next().expect("n1");
        let mut sp = spec(0, 1);
        sp.gres = Some(GresRequest::shards(None, 2));
        sp.account = Some("physics".into());
        let job = submit(&mut s, sp);
        let slot = proto::slot::shard_slot(0, 2);
        assert_eq!(plan(&mut s, job, 1, vec![alloc(id, &[slot])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        assert_eq!(confirm(&mut s, job, 1, id, 1), CommandResult::Ok);
        // Eight seconds (started at 30) of two of the GPU's four shards: four GPU-seconds.
        let end = Command::RunFinished { job, run: 1, node: id, outcome: RunOutcome::Exited(0), usage: Default::default(), now_ms: 8_030 };
        assert_eq!(s.apply(&end), CommandResult::Ok);
        assert_eq!(s.jobs[&job].gpu_seconds, 4);
        let usage = s.usage.get(&("physics".to_string(), "alice".to_string())).map(|u| u.gpu_ms);
        assert_eq!(usage, Some(4_000));
    }

    #[test]
    fn a_mig_instance_is_accounted_by_its_share_of_the_gpus_compute() {
        let inv = scheduler::testkit::h200_mig(&[&[("3g.71gb", 0), ("1g.18gb", 6)]]);
        let mut s = with_node_n1(inv);
        let id = s.nodes.values().map(|n| n.id).next().expect("n1");
        let mig = |profile: &str| {
            let mut sp = spec(1, 1);
            sp.gres = Some(GresRequest { gpu_type: Some(profile.into()), count: 1, ..Default::default() });
            sp.account = Some("physics".into());
            sp
        };
        let mut ran = Vec::new();
        for (sp, slot) in [(mig("3g.71gb"), scheduler::mig_slot(0, 0)), (mig("1g.18gb"), scheduler::mig_slot(0, 6))] {
            let job = submit(&mut s, sp);
            assert_eq!(plan(&mut s, job, 1, vec![alloc(id, &[slot])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
            assert_eq!(confirm(&mut s, job, 1, id, 1), CommandResult::Ok);
            ran.push(job);
        }
        // Seven seconds each (started at 30): 3/7 and 1/7 of a GPU.
        for job in &ran {
            let end = Command::RunFinished {
                job: *job,
                run: 1,
                node: id,
                outcome: RunOutcome::Exited(0),
                usage: Default::default(),
                now_ms: 7_030,
            };
            assert_eq!(s.apply(&end), CommandResult::Ok);
        }
        assert_eq!(ran.iter().map(|j| s.jobs[j].gpu_seconds).collect::<Vec<_>>(), vec![3, 1]);
        let usage = s.usage.get(&("physics".to_string(), "alice".to_string()));
        assert_eq!(usage, Some(&proto::accounts::Usage { gpu_ms: 4_000, wall_ms: 0, at_ms: 7_030 }), "{:?}", s.usage);
        // With a one-minute half-life, a run ending a minute later finds that usage halved.
        s.policy.priority_decay_half_life_min = Some(1);
        let job = submit(&mut s, mig("1g.18gb"));
        let slot = scheduler::mig_slot(0, 6);
        assert_eq!(plan(&mut s, job, 1, vec![alloc(id, &[slot])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        assert_eq!(confirm(&mut s, job, 1, id, 1), CommandResult::Ok);
        let end = Command::RunFinished { job, run: 1, node: id, outcome: RunOutcome::Exited(0), usage: Default::default(), now_ms: 67_030 };
        assert_eq!(s.apply(&end), CommandResult::Ok);
        // 2,000 left of 4,000, plus 67 s of 1/7 of a GPU.
        let usage = s.usage.get(&("physics".to_string(), "alice".to_string()));
        assert_eq!(usage, Some(&proto::accounts::Usage { gpu_ms: 2_000 + 67_000 / 7, wall_ms: 0, at_ms: 67_030 }), "{:?}", s.usage);
        // A whole GPU counts whole, and a profile no table knows by its name.
        assert_eq!(scheduler::mig::slot_compute_slices(3, Some("h200")), 7);
        assert_eq!(scheduler::mig::slot_compute_slices(scheduler::mig_slot(0, 0), Some("2g.12gb")), 2);
        assert_eq!(scheduler::mig::slot_compute_slices(scheduler::mig_slot(0, 0), Some("mystery")), 1);
    }
}
