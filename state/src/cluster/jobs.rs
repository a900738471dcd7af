//! A job outside its runs: submission, cancel, requeue, suspend and resume, and hold, release
//! and update of a pending job.

use proto::{CommandResult, Job, JobId, JobSpec, JobState};

use super::wall::Ledger;
use super::{rejected, ClusterState};

impl ClusterState {
    pub(super) fn submit(&mut self, spec: &JobSpec, now_ms: u64) -> CommandResult {
        if let Err(e) = spec.validate() {
            return rejected(e);
        }
        // A resend first: the job it made may be what fills a `MaxSubmitJobs` now.
        if let Some(job) = spec.submit_key.and_then(|key| self.submit_keys.job(key)) {
            return match self.jobs.get(&job) {
                Some(made) if made.spec.user == spec.user => CommandResult::Submitted { job },
                _ => rejected("this submission's key is another user's".to_string()),
            };
        }
        // The node checked it before proposing; checked again here, where the state is the one
        // it enters (two submissions racing for the last of a `MaxSubmitJobs`).
        if let Some(why) = self.accounting_refusal(spec) {
            return rejected(why);
        }
        let id = self.next_job_id;
        self.next_job_id += 1;
        self.jobs.insert(id, Job::submitted(id, std::sync::Arc::new(spec.clone()), now_ms));
        if let Some(key) = spec.submit_key {
            self.submit_keys.insert(key, id);
        }
        CommandResult::Submitted { job: id }
    }

    pub(super) fn cancel(&mut self, id: JobId, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        match job.state {
            JobState::Pending | JobState::Running => {
                // Parts keep their resources until each node reports its process gone (or the
                // node is declared down), so no GPU is handed out while it may still run.
                job.state = JobState::Cancelled;
                job.end_ms = Some(now_ms);
                job.reasons = vec!["cancelled".into()];
                CommandResult::Ok
            }
            _ => rejected("already finished"),
        }
    }

    pub(super) fn requeue(&mut self, id: JobId, reason: &str, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        // As Slurm: a running job, or a finished one still in the hot state (within MinJobAge);
        // one that finished with parts still stopping is queued and starts once they are
        // released (`check_placement`). The refusals are Slurm's words.
        match job.state {
            JobState::Running => {}
            JobState::Pending => return rejected("Job is pending execution"),
            _ if job.spec.array.is_some() && job.array.is_none() => {
                return rejected("an array's own record cannot be requeued: requeue its tasks by their ids")
            }
            _ => {}
        }
        let mut ledger = Ledger {
            usage: &mut self.usage,
            qos_usage: &mut self.qos_usage,
            accounts: &self.accounts,
            half_life_ms: self.policy.decay_half_life_ms(),
            nodes: &self.nodes,
        };
        requeue_job(&mut self.requeues, &mut ledger, job, reason, now_ms);
        CommandResult::Ok
    }

    /// `scontrol suspend` (`suspend`) or `resume` of a running job, refused in Slurm's words
    /// otherwise. A second suspend changes nothing, as in Slurm; its parts keep their resources
    /// and the leader has each node stop or continue its processes.
    pub(super) fn suspend(&mut self, id: JobId, suspend: bool, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        match job.state {
            JobState::Running => {}
            JobState::Pending => return rejected("Job is pending execution"),
            _ => return rejected("Job/step already completing or completed"),
        }
        let s = &mut job.suspension;
        match (suspend, s.since_ms) {
            (true, Some(_)) => return CommandResult::Ok,
            (false, None) => return rejected("Job is not suspended"),
            (true, None) => s.since_ms = Some(now_ms),
            (false, Some(since)) => {
                s.paused_ms = s.paused_ms.saturating_add(now_ms.saturating_sub(since));
                s.since_ms = None;
            }
        }
        s.changes = s.changes.saturating_add(1);
        CommandResult::Ok
    }

    pub(super) fn update_job(
        &mut self,
        id: JobId,
        hold: Option<bool>,
        time_limit_ms: Option<Option<u64>>,
        partition: Option<Option<String>>,
    ) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        if job.state != JobState::Pending {
            return rejected(format!("job {id} is {}: only a pending job can be held, released or updated", job.state));
        }
        if time_limit_ms == Some(Some(0)) {
            return rejected("time limit must be positive");
        }
        let spec = std::sync::Arc::make_mut(&mut job.spec);
        if let Some(h) = hold {
            spec.hold = h;
        }
        if let Some(t) = time_limit_ms {
            spec.time_limit_ms = t;
        }
        if let Some(p) = partition {
            spec.partition = p;
        }
        CommandResult::Ok
    }
}

/// Puts a running job back in the queue, counting it in `requeues`. Its parts stay until each
/// is confirmed stopped; the run's wall-clock time is charged now if any part of it is left
/// (the last one gone charged it already), as its start is forgotten.
pub(super) fn requeue_job(requeues: &mut u64, ledger: &mut Ledger<'_>, job: &mut Job, reason: &str, now_ms: u64) {
    *requeues = requeues.saturating_add(1);
    if job.parts.iter().any(|p| p.run == job.run) {
        ledger.charge_wall(job, now_ms);
    }
    if job.suspended() {
        // Slurm: a suspended job that is requeued is held (JobHeldAdmin).
        std::sync::Arc::make_mut(&mut job.spec).hold = true;
    }
    job.suspension.since_ms = None;
    job.state = JobState::Pending;
    job.restart_count = job.restart_count.saturating_add(1);
    job.exit_code = None;
    job.start_ms = None;
    job.end_ms = None;
    job.outcomes.clear();
    job.spares.clear();
    job.reasons = vec![format!("requeued: {reason}")];
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, JobSpec, JobState, RunOutcome};

    use crate::cluster::test_support::{alloc, confirm, finish, gang, plan, register, spec, submit};
    use crate::cluster::ClusterState;
    use crate::view;

    #[test]
    fn submit_validates() {
        let mut s = ClusterState::default();
        let mut bad = spec(1, 1);
        bad.workdir = "relative".into();
        assert!(matches!(s.apply(&Command::Submit { spec: bad, now_ms: 1 }), CommandResult::Rejected(_)));
        assert_eq!(submit(&mut s, spec(1, 1)), 1);
        assert_eq!(submit(&mut s, spec(1, 1)), 2);
    }

    #[test]
    fn a_resent_submission_gets_the_job_the_first_made_and_makes_none() {
        let mut s = ClusterState::default();
        register(&mut s, "a", 1);
        let keyed = |user: &str, key| JobSpec { submit_key: Some(key), ..JobSpec::command(vec!["true".into()], "/tmp", user) };
        let first = submit(&mut s, keyed("alice", 7));
        let jobs = s.jobs.len();
        // Resent after a failover: in one batch with a new submission, as the group commit may.
        let batch = Command::Batch {
            commands: vec![
                Command::Submit { spec: keyed("alice", 7), now_ms: 20 },
                Command::Submit { spec: keyed("alice", 8), now_ms: 20 },
            ],
        };
        let CommandResult::Batch(results) = s.apply(&batch) else { panic!("a batch answers a batch") };
        assert_eq!(results[0], CommandResult::Submitted { job: first });
        assert_eq!(results[1], CommandResult::Submitted { job: first + 1 });
        assert_eq!(s.jobs.len(), jobs + 1, "only the new submission made a job");
        assert!(matches!(s.apply(&Command::Submit { spec: keyed("bob", 7), now_ms: 30 }), CommandResult::Rejected(_)));
        // Its job ended and still in the hot state: still the answer; archived: a new job.
        s.apply(&Command::Cancel { job: first, now_ms: 40 });
        assert_eq!(s.apply(&Command::Submit { spec: keyed("alice", 7), now_ms: 50 }), CommandResult::Submitted { job: first });
        s.apply(&Command::ArchiveJobs { jobs: vec![first], now_ms: 60 });
        assert_eq!(s.apply(&Command::Submit { spec: keyed("alice", 7), now_ms: 70 }), CommandResult::Submitted { job: first + 2 });
        // A submission without a key is always new.
        let plain = JobSpec::command(vec!["true".into()], "/tmp", "alice");
        assert_ne!(submit(&mut s, plain.clone()), submit(&mut s, plain));
        // The index is not encoded: a replica that reads the state builds it from the jobs.
        let read: ClusterState = proto::decode(&proto::encode(&s), usize::MAX).expect("decode");
        assert!(read.submit_keys.is_empty());
        assert_eq!(crate::submit_keys::SubmitKeys::of(&read.jobs), s.submit_keys);
    }

    #[test]
    fn cancel_keeps_resources_until_every_part_is_gone() {
        let (mut s, a, b, job) = gang();
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 80 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Cancelled);
        assert_eq!(s.jobs[&job].parts_to_stop().count(), 2);
        assert_eq!(s.gpus_free(a), 6);
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        assert_eq!((s.gpus_free(a), s.gpus_free(b)), (8, 8));
        assert_eq!(s.jobs[&job].state, JobState::Cancelled);
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 81 }), CommandResult::Rejected("already finished".into()));
        assert_eq!(s.apply(&Command::Cancel { job: 42, now_ms: 81 }), CommandResult::Rejected("unknown job 42".into()));
        let pending = submit(&mut s, spec(1, 1));
        s.apply(&Command::Cancel { job: pending, now_ms: 82 });
        assert_eq!(s.jobs[&pending].state, JobState::Cancelled);
    }

    #[test]
    fn operator_requeue_of_running_jobs_not_pending_ones() {
        let (mut s, _a, _b, job) = gang();
        assert_eq!(s.apply(&Command::Requeue { job, reason: "by user".into(), now_ms: 50 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].parts_to_stop().count(), 2);
        assert_eq!(
            s.apply(&Command::Requeue { job, reason: "again".into(), now_ms: 51 }),
            CommandResult::Rejected("Job is pending execution".into())
        );
    }

    #[test]
    fn requeue_waits_for_the_old_run_to_stop_before_a_new_start() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let b = register(&mut s, "b", 2);
        let mut sp = spec(2, 2);
        sp.requeue = true;
        let job = submit(&mut s, sp);
        plan(&mut s, job, 1, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]);
        confirm(&mut s, job, 1, a, 1);
        confirm(&mut s, job, 1, b, 2);
        s.apply(&Command::NodeDown { node: b, reason: "no heartbeat".into(), now_ms: 40 });
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.restart_count, j.run), (JobState::Pending, 1, 1));
        assert_eq!(j.reasons, vec!["requeued: node b down: no heartbeat".to_string()]);
        assert_eq!(s.requeues, 1, "the cluster's requeue counter counts it");
        assert!(!view::placeable(&s.jobs[&job]), "not placeable while run 1 still runs on a");
        assert!(scheduler::schedule(&s.scheduler_view(), 50).placements.is_empty());
        let c = register(&mut s, "c", 3);
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(c, &[0, 1]), alloc(a, &[2, 3])]),
            CommandResult::Planned { accepted: vec![], rejected: vec![(job, "job 1 still has parts of run 1 stopping".into())] }
        );
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        assert_eq!(s.jobs[&job].state, JobState::Pending, "a report of the old run does not end the job");
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(c, &[0, 1]), alloc(a, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
        assert_eq!(s.jobs[&job].run, 2);
    }

    #[test]
    fn a_finished_job_requeued_runs_again_as_its_next_run() {
        let (mut s, a, b, job) = gang();
        assert_eq!(finish(&mut s, job, 1, a, RunOutcome::Exited(1)), CommandResult::Ok);
        assert_eq!(finish(&mut s, job, 1, b, RunOutcome::Exited(0)), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Failed);
        assert!(s.jobs[&job].parts.is_empty());
        assert_eq!(s.apply(&Command::Requeue { job, reason: proto::REQUEUED_ON_REQUEST.into(), now_ms: 6_000 }), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.restart_count, j.exit_code, j.end_ms), (JobState::Pending, 1, None, None));
        assert_eq!(s.requeues, 1);
        assert_eq!(s.clone_without_jobs().requeues, 1, "a snapshot's header keeps the counter");
        assert!(s.archivable(u64::MAX, 0, 10).is_empty(), "a requeued job is live again, not history");
        // A placement of the old run is stale; the next run starts.
        assert!(
            matches!(plan(&mut s, job, 1, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]), CommandResult::Planned { accepted, .. } if accepted.is_empty())
        );
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
        assert_eq!(s.jobs[&job].state, JobState::Running);
    }

    #[test]
    fn a_job_cancelled_while_its_parts_stop_is_requeued_behind_them() {
        let (mut s, a, b, job) = gang();
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 40 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Cancelled);
        assert_eq!(s.apply(&Command::Requeue { job, reason: proto::REQUEUED_ON_REQUEST.into(), now_ms: 41 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Pending);
        // Not placed while run 1's parts still hold the GPUs.
        assert!(
            matches!(plan(&mut s, job, 2, vec![alloc(a, &[2, 3]), alloc(b, &[2, 3])]), CommandResult::Planned { accepted, .. } if accepted.is_empty())
        );
        assert_eq!(finish(&mut s, job, 1, a, RunOutcome::Killed), CommandResult::Ok);
        assert_eq!(finish(&mut s, job, 1, b, RunOutcome::Killed), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Pending, "the old run's end does not end the requeued job");
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
    }

    #[test]
    fn a_suspended_job_keeps_its_gpus_and_its_suspensions_are_not_run_time() {
        let (mut s, a, _b, job) = gang();
        let start = s.jobs[&job].start_ms.unwrap_or(0);
        let suspend = |s: &mut ClusterState, suspend, now_ms| s.apply(&Command::Suspend { job, suspend, now_ms });
        assert_eq!(suspend(&mut s, false, start + 10), CommandResult::Rejected("Job is not suspended".into()));
        assert_eq!(suspend(&mut s, true, start + 1_000), CommandResult::Ok);
        assert!(s.jobs[&job].suspended());
        assert_eq!(s.jobs[&job].state_name(), "SUSPENDED");
        // A second suspend changes nothing (Slurm answers it without an error).
        assert_eq!(suspend(&mut s, true, start + 2_000), CommandResult::Ok);
        assert_eq!(s.jobs[&job].suspension, proto::Suspension { since_ms: Some(start + 1_000), paused_ms: 0, changes: 1 });
        assert_eq!(s.gpus_free(a), 6, "its GPUs stay held");
        assert_eq!(s.jobs[&job].run_time_ms_at(start + 4_000), 1_000);
        assert_eq!(suspend(&mut s, false, start + 4_000), CommandResult::Ok);
        assert_eq!(s.jobs[&job].suspension, proto::Suspension { since_ms: None, paused_ms: 3_000, changes: 2 });
        assert_eq!(s.jobs[&job].run_time_ms_at(start + 5_000), 2_000);
        assert_eq!(s.jobs[&job].state_name(), "RUNNING");
        // Slurm's refusals for jobs that do not run.
        let pending = submit(&mut s, spec(1, 1));
        let refused = s.apply(&Command::Suspend { job: pending, suspend: true, now_ms: 1 });
        assert_eq!(refused, CommandResult::Rejected("Job is pending execution".into()));
        s.apply(&Command::Cancel { job, now_ms: start + 6_000 });
        let refused = suspend(&mut s, true, start + 7_000);
        assert_eq!(refused, CommandResult::Rejected("Job/step already completing or completed".into()));
    }

    #[test]
    fn a_suspended_job_requeued_is_held_and_its_next_run_starts_unsuspended() {
        let (mut s, a, b, job) = gang();
        s.apply(&Command::Suspend { job, suspend: true, now_ms: 6_000 });
        assert_eq!(s.apply(&Command::Requeue { job, reason: "operator".into(), now_ms: 6_500 }), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.spec.hold, j.suspended(), j.suspension.since_ms), (JobState::Pending, true, false, None));
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        s.apply(&Command::UpdateJob { job, hold: Some(false), time_limit_ms: None, partition: None, now_ms: 7_000 });
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
        assert_eq!(s.jobs[&job].suspension, proto::Suspension::default());
    }

    #[test]
    fn hold_release_and_update_only_pending_jobs() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let job = submit(&mut s, spec(1, 1));
        let update = |hold, time_limit_ms, partition| Command::UpdateJob { job, hold, time_limit_ms, partition, now_ms: 5 };
        assert_eq!(s.apply(&update(Some(true), Some(Some(60_000)), Some(Some("long".into())))), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.spec.hold, j.spec.time_limit_ms, j.spec.partition.as_deref()), (true, Some(60_000), Some("long")));
        assert!(matches!(s.apply(&update(None, Some(Some(0)), None)), CommandResult::Rejected(_)));
        s.apply(&update(Some(false), None, Some(None)));
        plan(&mut s, job, 1, vec![alloc(a, &[0])]);
        assert_eq!(
            s.apply(&update(Some(true), None, None)),
            CommandResult::Rejected("job 1 is RUNNING: only a pending job can be held, released or updated".into())
        );
    }
}
