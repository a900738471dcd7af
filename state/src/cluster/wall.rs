//! Wall-clock time (`GrpWall`): each run's time charged once to its association and its QoS,
//! when the run ends for good (the last of its parts gone, or a requeue), decayed with the
//! fair-share half-life; and [`proto::Command::TimeOut`], by which the leader ends a running
//! job whose association's or QoS's wall time is used up (`engine::WallLimits`).

use std::collections::BTreeMap;

use proto::accounts::{Accounts, Usage, ROOT_ACCOUNT};
use proto::{CommandResult, Job, JobId, JobState};

use super::{rejected, ClusterState, USAGE_ASSOCS_MAX};

/// QoS whose wall time is kept at most (the policy holds at most 1,024 partitions and QoS).
pub const QOS_USAGE_MAX: usize = 1024;

/// Where a run's usage is charged: the associations' and the QoS' decayed usage.
pub(super) struct Ledger<'a> {
    pub usage: &'a mut BTreeMap<(String, String), Usage>,
    pub qos_usage: &'a mut BTreeMap<String, Usage>,
    pub accounts: &'a Accounts,
    pub half_life_ms: u64,
    /// The nodes, for the shards a GPU is configured with (a shard job is charged its share).
    pub nodes: &'a BTreeMap<proto::NodeId, proto::NodeRecord>,
}

impl Ledger<'_> {
    /// Charges the wall-clock time of `job`'s current run by `now_ms` (its end, for a job that
    /// ended) to its QoS and to its association. A job charged to root (no account, or one the
    /// database does not hold) adds nothing to an association: root's limits hold nothing, and
    /// an entry of its own would be a fair-share leaf (`sshare` would show it).
    pub fn charge_wall(&mut self, job: &Job, now_ms: u64) {
        let wall_ms = job.run_time_ms_at(now_ms);
        if wall_ms == 0 {
            return;
        }
        let half_life_ms = self.half_life_ms;
        let add = |u: &mut Usage| *u = scheduler::fairshare::add_usage(u, 0, wall_ms, now_ms, half_life_ms);
        let qos = job.spec.qos.as_deref().unwrap_or(proto::DEFAULT_QOS);
        if let Some(u) = self.qos_usage.get_mut(qos) {
            add(u);
        } else if self.qos_usage.len() < QOS_USAGE_MAX {
            add(self.qos_usage.entry(qos.to_string()).or_default());
        }
        let account = job.spec.account.as_deref().or_else(|| self.accounts.default_account(&job.spec.user));
        let Some(account) = account.filter(|a| *a != ROOT_ACCOUNT && self.accounts.accounts.contains_key(*a)) else { return };
        let key = (account.to_string(), job.spec.user.clone());
        if !self.usage.contains_key(&key) && self.usage.len() >= USAGE_ASSOCS_MAX {
            return;
        }
        add(self.usage.entry(key).or_default());
    }
}

impl ClusterState {
    /// `Command::TimeOut`: the running job ends TIMEOUT, as slurmctld's `job_time_limit` ends a
    /// job past its association's or QoS's `GrpWall`; its parts keep their resources until each
    /// node reports its process gone, as for a cancel.
    pub(super) fn time_out(&mut self, id: JobId, reason: &str, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        match job.state {
            JobState::Running => {}
            JobState::Pending => return rejected("Job is pending execution"),
            _ => return rejected("Job/step already completing or completed"),
        }
        job.state = JobState::Timeout;
        job.exit_code = None;
        job.end_ms = Some(now_ms);
        job.reasons = vec![reason.to_string()];
        CommandResult::Ok
    }
}

#[cfg(test)]
mod tests {
    use proto::accounts::AccountsEdit;
    use proto::{Command, CommandResult, JobSpec, JobState, RunOutcome};

    use crate::cluster::test_support::{alloc, plan, register, submit};
    use crate::cluster::ClusterState;

    /// A cluster of one node (instance 1).
    fn one_node() -> (ClusterState, u64) {
        let mut s = ClusterState::default();
        let node = register(&mut s, "a", 1);
        (s, node)
    }

    /// Adds account `phys` and alice's association with it.
    fn add_phys(s: &mut ClusterState) {
        let edits = vec![
            AccountsEdit::AddAccount { name: "phys".into(), description: None, organization: None, parent: None },
            AccountsEdit::AddUser { name: "alice".into(), account: "phys".into(), default_account: None },
        ];
        assert_eq!(s.apply(&Command::EditAccounts { edits, now_ms: 1 }), CommandResult::Ok);
    }

    fn with_phys() -> (ClusterState, u64) {
        let (mut s, node) = one_node();
        add_phys(&mut s);
        (s, node)
    }

    /// A job of alice without GPUs (`account`: none).
    fn cpu_job() -> JobSpec {
        JobSpec::command(vec!["true".into()], "/tmp", "alice")
    }

    fn phys() -> JobSpec {
        JobSpec { account: Some("phys".into()), ..cpu_job() }
    }

    /// Runs a job of `spec` on `node`, started at `start_ms`.
    fn run(s: &mut ClusterState, node: u64, spec: JobSpec, start_ms: u64) -> u64 {
        let job = submit(s, spec);
        assert_eq!(plan(s, job, 1, vec![alloc(node, &[])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        assert_eq!(s.apply(&Command::LaunchConfirmed { job, run: 1, node, instance: 1, now_ms: start_ms }), CommandResult::Ok);
        job
    }

    fn end(s: &mut ClusterState, job: u64, node: u64, outcome: RunOutcome, now_ms: u64) -> CommandResult {
        s.apply(&Command::RunFinished { job, run: 1, node, outcome, usage: Default::default(), now_ms })
    }

    fn alice() -> (String, String) {
        ("phys".to_string(), "alice".to_string())
    }

    #[test]
    fn a_run_is_charged_once_to_its_association_and_qos_and_root_gets_nothing() {
        let (mut s, node) = one_node();
        // A job without an account (the end-to-end tests' probes): its QoS's time only.
        let probe = run(&mut s, node, cpu_job(), 1_000);
        assert_eq!(end(&mut s, probe, node, RunOutcome::Exited(0), 6_000), CommandResult::Ok);
        assert!(s.usage.is_empty(), "no root entry: {:?}", s.usage);
        assert_eq!(s.qos_usage.get("normal").map(|u| u.wall_ms), Some(5_000));
        add_phys(&mut s);
        let job = run(&mut s, node, phys(), 10_000);
        assert_eq!(end(&mut s, job, node, RunOutcome::Exited(0), 40_000), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Completed);
        assert_eq!(s.usage.get(&alice()).map(|u| (u.gpu_ms, u.wall_ms)), Some((0, 30_000)));
        assert_eq!(s.qos_usage["normal"].wall_ms, 35_000);
    }

    #[test]
    fn a_time_out_ends_a_running_job_whose_part_then_stops_and_a_requeue_charges_its_run() {
        let (mut s, node) = with_phys();
        s.policy.priority_decay_half_life_min = Some(0);
        let job = run(&mut s, node, phys(), 1_000);
        let pending = submit(&mut s, phys());
        let cmd = |job| Command::TimeOut { job, reason: "GrpWall".into(), now_ms: 61_000 };
        assert_eq!(s.apply(&cmd(pending)), CommandResult::Rejected("Job is pending execution".into()));
        assert_eq!(s.apply(&cmd(job)), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.end_ms, j.exit_code, j.reason()), (JobState::Timeout, Some(61_000), None, Some("GrpWall")));
        assert_eq!(j.parts_to_stop().count(), 1, "its part is stopped");
        assert!(s.usage.is_empty(), "charged when the part is gone");
        assert_eq!(s.apply(&cmd(job)), CommandResult::Rejected("Job/step already completing or completed".into()));
        // The kill is reported later: the run is charged until its end, not the report.
        assert_eq!(end(&mut s, job, node, RunOutcome::Killed, 70_000), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Timeout);
        assert_eq!(s.usage[&alice()].wall_ms, 60_000);
        // A requeued run is charged at the requeue; the report of its part adds nothing.
        let again = run(&mut s, node, JobSpec { requeue: true, ..phys() }, 100_000);
        assert_eq!(s.apply(&Command::Requeue { job: again, reason: "admin".into(), now_ms: 110_000 }), CommandResult::Ok);
        let charged = s.usage[&alice()];
        assert_eq!(charged.wall_ms, 70_000);
        assert_eq!(end(&mut s, again, node, RunOutcome::Killed, 115_000), CommandResult::Ok);
        assert_eq!(s.usage[&alice()], charged);
    }

    #[test]
    fn wall_usage_decays_with_the_half_life() {
        let (mut s, node) = with_phys();
        s.policy.priority_decay_half_life_min = Some(1);
        let first = run(&mut s, node, phys(), 0);
        assert_eq!(end(&mut s, first, node, RunOutcome::Exited(0), 60_000), CommandResult::Ok);
        let second = run(&mut s, node, phys(), 110_000);
        assert_eq!(end(&mut s, second, node, RunOutcome::Exited(0), 120_000), CommandResult::Ok);
        // 60 s halved a minute later, plus 10 s.
        assert_eq!(s.usage[&alice()].wall_ms, 40_000);
        assert_eq!(s.qos_usage["normal"].wall_ms, 40_000);
    }
}
