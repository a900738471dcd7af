//! The leader's sequence for one tick: a scheduling pass when one may decide anything new
//! (`control::leader::pass_needed`, `pass_due`, then the policy's plan and what it asks for),
//! and the launches and stops due to the nodes (`control::leader::due_orders`).

use control::leader::{Applied, IdlePass, Orders, Resend, SendKey};
use corral_state::ClusterState;
use proto::{Command, JobId, NodeId};
use scheduler::{ClusterView, PreemptAction, Reservation};

use crate::layouts::LayoutsAsked;
use crate::policy::{CorralPolicy, Policy};

/// How the engine reads the applied state. `corrald` reads its Raft state machine (each call
/// under its lock), the simulator and the replay their own `ClusterState`.
pub trait StateReader {
    /// The last applied log index, read before the state.
    fn applied_index(&self) -> u64;
    /// Runs `f` over the applied state and the last index of an entry that did more than
    /// submit jobs (`Command::submits_only`), read together.
    fn with_state<R>(&self, f: impl FnOnce(&ClusterState, u64) -> R) -> R;
    /// The scheduler's view of the applied state and the first job id it does not hold.
    fn view(&self) -> (ClusterView, JobId);
}

/// What one scheduling pass asks for, in the order to carry it out: `commands` are proposed one
/// after the other (preemptions, then the plan of the jobs to start, if any), `mig_layouts` are
/// sent to the nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub commands: Vec<Command>,
    /// Idle MIG-mode GPUs to re-partition: (node, gpu index, profiles by start slice).
    pub mig_layouts: Vec<(NodeId, u32, Vec<String>)>,
    /// Jobs the plan starts (placements of the `Plan` command).
    pub starts: usize,
    /// The backfill reservation the pass made, if any.
    pub reservation: Option<Reservation>,
    /// When the pass expects jobs that cannot start now to start: (job, ms), from every
    /// backfill reservation it made, earliest first.
    pub expected_starts: Vec<(JobId, u64)>,
    /// Pending jobs the pass considered.
    pub queued: usize,
}

/// What only the leader keeps, in memory, for the term it leads: a new leader starts a new one.
pub struct Leader<P: Policy = CorralPolicy> {
    policy: P,
    /// The last pass, if it changed nothing (`control::leader::pass_due`).
    idle_pass: Option<IdlePass>,
    /// Sends of launches and stops not yet answered through the log, to re-send after the
    /// re-send period (pruned every tick: at most what one period sent).
    launches_sent: Resend<SendKey>,
    stops_sent: Resend<SendKey>,
    /// MIG layouts asked and not yet in the inventory: those GPUs take no work meanwhile.
    layouts: LayoutsAsked,
}

impl Leader<CorralPolicy> {
    pub fn new(resend_after_ms: u64) -> Leader<CorralPolicy> {
        Leader::with_policy(CorralPolicy, resend_after_ms)
    }
}

impl<P: Policy> Leader<P> {
    pub fn with_policy(policy: P, resend_after_ms: u64) -> Leader<P> {
        Leader {
            policy,
            idle_pass: None,
            launches_sent: Resend::new(resend_after_ms),
            stops_sent: Resend::new(resend_after_ms),
            layouts: LayoutsAsked::default(),
        }
    }

    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// One scheduling pass at `now_ms`, or `None` when none is due: no pending job that is not
    /// held (the view is not even built), or nothing applied since an idle pass that could change
    /// what it decided, or `starts_max` (asked only for a due pass) allows no start.
    pub fn schedule_pass(&mut self, state: &impl StateReader, now_ms: u64, starts_max: impl FnOnce() -> u32) -> Option<Pass> {
        // Read before the view: a change applied meanwhile only makes the next pass due.
        let index = state.applied_index();
        let policy_wakes = self.policy.wake_ms().is_some_and(|w| now_ms >= w);
        let mut idle = self.idle_pass;
        let due = state.with_state(|s, last_change_index| {
            if !control::leader::pass_needed(s.jobs.values(), s.nodes.values()) {
                return false;
            }
            let applied = Applied { index, last_change_index, next_job_id: s.next_job_id };
            // Evaluated even when the policy wakes: it moves an idle pass on over submissions.
            control::leader::pass_due(idle.as_mut(), applied, &s.jobs, &s.policy, now_ms) || policy_wakes
        });
        self.idle_pass = idle;
        if !due {
            return None;
        }
        let starts_max = starts_max();
        if starts_max == 0 {
            // Behind: not even the view is built (the pass would start nothing; preemptions and
            // MIG layouts, both for jobs to start, wait too).
            return None;
        }
        let (mut view, view_next_job_id) = state.view();
        view.config.starts_per_pass_max = starts_max;
        view.config.explain_ineligible = false;
        self.layouts.hold(&mut view, now_ms);
        let plan = self.policy.schedule(&view, now_ms);
        self.layouts.asked(&plan.mig_layouts, now_ms);
        self.idle_pass = plan.changes_nothing().then_some(IdlePass {
            applied_index: index,
            next_job_id: view_next_job_id,
            at_ms: now_ms,
            wake_ms: plan.wake_ms,
            room: plan.room,
        });
        let mut commands: Vec<Command> = plan
            .preemptions
            .iter()
            .map(|(job, action)| match action {
                PreemptAction::Requeue => Command::Requeue { job: *job, reason: "preempted".into(), now_ms },
                PreemptAction::Cancel => Command::Cancel { job: *job, now_ms },
            })
            .collect();
        let starts = plan.placements.len();
        if starts > 0 {
            let array_tasks: Vec<(u32, u32)> = plan.array_tasks.iter().map(|a| (a.placement as u32, a.task)).collect();
            commands.push(Command::Plan { placements: plan.placements, array_tasks, now_ms });
        }
        let mut expected_starts: Vec<(JobId, u64)> = plan.reservations.iter().map(|r| (r.job, r.start_ms)).collect();
        expected_starts.sort_by_key(|(job, start_ms)| (*start_ms, *job));
        Some(Pass {
            commands,
            mig_layouts: plan.mig_layouts,
            starts,
            reservation: plan.reservation,
            expected_starts,
            queued: plan.queue.len(),
        })
    }

    /// The launches and stops due to the nodes now over the applied state: each part's launch
    /// until the log shows it confirmed, each stop until the log shows the part gone, re-sent
    /// after the re-send period (`control::leader::due_orders`).
    pub fn orders(&mut self, state: &ClusterState, now_ms: u64) -> Orders {
        control::leader::due_orders(state.jobs_holding_parts(), &mut self.launches_sent, &mut self.stops_sent, now_ms)
    }

    /// A launch sent at `now_ms` (its call started later than the order): its re-send counts
    /// from then.
    pub fn launch_sent(&mut self, key: SendKey, now_ms: u64) {
        self.launches_sent.sent(key, now_ms);
    }

    /// When time alone next makes a pass due that the last idle pass did not run: a pending
    /// job's begin time, or the policy's own period (the once-a-second refresh aside).
    pub fn wake_ms(&self) -> Option<u64> {
        let idle = self.idle_pass.and_then(|p| p.wake_ms);
        match (idle, self.policy.wake_ms()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends of launches and stops awaiting an answer through the log.
    pub fn sends_unanswered(&self) -> usize {
        self.launches_sent.len() + self.stops_sent.len()
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use proto::{CommandResult, GpuInfo, GresRequest, Inventory, JobSpec};

    use super::*;

    /// A log of the commands applied, as the engine reads it.
    struct Log {
        state: ClusterState,
        applied: u64,
        last_change: u64,
        views: Cell<u32>,
    }

    impl Log {
        fn new(gpus: u32) -> Log {
            let mut state = ClusterState::default();
            let inventory = Inventory {
                gpus: (0..gpus)
                    .map(|i| GpuInfo { index: i, gres_type: "h100".into(), model: "H100".into(), healthy: true, ..GpuInfo::default() })
                    .collect(),
                cpus: 64,
                memory_mib: 1 << 20,
                ..Inventory::default()
            };
            let cmd = Command::RegisterNode {
                name: "n1".into(),
                addr: "n1:7100".into(),
                inventory,
                instance: 7,
                cert_fingerprint: String::new(),
                now_ms: 0,
            };
            assert!(matches!(state.apply(&cmd), CommandResult::NodeRegistered { id: 1 }));
            Log { state, applied: 1, last_change: 1, views: Cell::new(0) }
        }

        fn apply(&mut self, cmd: &Command) -> CommandResult {
            self.applied += 1;
            if !cmd.submits_only() {
                self.last_change = self.applied;
            }
            self.state.apply(cmd)
        }

        fn submit(&mut self, gpus: u32, now_ms: u64) -> JobId {
            let mut spec = JobSpec::command(vec!["true".into()], "/", "ann");
            spec.gres = Some(GresRequest { gpu_type: None, count: gpus, ..Default::default() });
            match self.apply(&Command::Submit { spec, now_ms }) {
                CommandResult::Submitted { job } => job,
                other => panic!("submit: {other:?}"),
            }
        }
    }

    impl StateReader for Log {
        fn applied_index(&self) -> u64 {
            self.applied
        }

        fn with_state<R>(&self, f: impl FnOnce(&ClusterState, u64) -> R) -> R {
            f(&self.state, self.last_change)
        }

        fn view(&self) -> (ClusterView, JobId) {
            self.views.set(self.views.get() + 1);
            (self.state.scheduler_view(), self.state.next_job_id)
        }
    }

    fn planned(pass: &Pass) -> Vec<JobId> {
        pass.commands
            .iter()
            .flat_map(|c| match c {
                Command::Plan { placements, .. } => placements.iter().map(|p| p.job).collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn without_a_pending_job_no_view_is_built() {
        let log = Log::new(8);
        let mut leader = Leader::new(1_000);
        assert_eq!(leader.schedule_pass(&log, 10, || panic!("pacing asked for a pass that is not due")), None);
        assert_eq!(log.views.get(), 0);
    }

    #[test]
    fn a_job_that_fits_is_planned_then_launched_once_per_resend_period() {
        let mut log = Log::new(8);
        let job = log.submit(2, 10);
        let mut leader = Leader::new(1_000);
        let pass = leader.schedule_pass(&log, 20, || u32::MAX).expect("a pass is due");
        assert_eq!((planned(&pass), pass.starts), (vec![job], 1));
        for cmd in &pass.commands {
            assert!(matches!(log.apply(cmd), CommandResult::Planned { .. }));
        }
        assert_eq!(leader.orders(&log.state, 20).launches, vec![(job, 1)]);
        assert_eq!(leader.orders(&log.state, 500).launches, vec![], "sent within the re-send period");
        assert_eq!(leader.orders(&log.state, 1_020).launches, vec![(job, 1)], "re-sent after it");
        let run = log.state.jobs[&job].run;
        log.apply(&Command::LaunchConfirmed { job, run, node: 1, instance: 7, now_ms: 1_030 });
        assert_eq!(leader.orders(&log.state, 5_000).launches, vec![], "confirmed through the log");
    }

    #[test]
    fn paced_to_nothing_the_pass_builds_no_view() {
        let mut log = Log::new(8);
        log.submit(1, 10);
        let mut leader = Leader::new(1_000);
        assert_eq!(leader.schedule_pass(&log, 20, || 0), None);
        assert_eq!(log.views.get(), 0);
    }

    #[test]
    fn submissions_that_cannot_start_run_no_pass_until_something_is_freed() {
        let mut log = Log::new(8);
        let big = log.submit(8, 10);
        let mut leader = Leader::new(1_000);
        let pass = leader.schedule_pass(&log, 20, || u32::MAX).expect("due");
        for cmd in &pass.commands {
            log.apply(cmd);
        }
        // Every GPU is held: a pass over the next submission decides nothing and is idle.
        log.submit(1, 30);
        let idle = leader.schedule_pass(&log, 40, || u32::MAX).expect("due after a plan");
        assert!(idle.commands.is_empty());
        let views = log.views.get();
        log.submit(4, 50);
        assert_eq!(leader.schedule_pass(&log, 60, || u32::MAX), None, "a submission the room excludes");
        assert_eq!(log.views.get(), views);
        // The big job ends: the next pass starts the queued ones.
        let run = log.state.jobs[&big].run;
        log.apply(&Command::LaunchConfirmed { job: big, run, node: 1, instance: 7, now_ms: 70 });
        let outcome = proto::RunOutcome::Exited(0);
        log.apply(&Command::RunFinished { job: big, run, node: 1, outcome, usage: Default::default(), now_ms: 80 });
        let pass = leader.schedule_pass(&log, 90, || u32::MAX).expect("due after a release");
        // The larger first: the job-size factor of its priority.
        assert_eq!(planned(&pass), vec![big + 2, big + 1]);
    }
}
