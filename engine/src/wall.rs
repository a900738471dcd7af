//! `GrpWall` enforced on running jobs: at most every [`WALL_CHECK_INTERVAL_MS`] the leader finds
//! the running jobs whose association's or QoS's wall-clock time is used up
//! (`scheduler::wall`: the time charged so far, decayed, plus what the runs holding resources
//! used since they started) and proposes a `Command::TimeOut` for each, as slurmctld's
//! `job_time_limit` ends them (`acct_policy_job_time_out`). Jobs that wait for the same limit
//! are the scheduler's (`AssocGrpWallLimit`, `QOSGrpWallLimit`).

use corral_state::ClusterState;
use proto::accounts::Accounts;
use proto::{Command, Job, JobState};
use scheduler::wall::{LiveRun, WallUse};

/// How often the leader looks for jobs past a `GrpWall` (slurmctld looks every 30 s).
pub const WALL_CHECK_INTERVAL_MS: u64 = 5_000;

/// When the leader last looked, in this term.
#[derive(Clone, Debug, Default)]
pub struct WallLimits {
    last_ms: Option<u64>,
}

impl WallLimits {
    /// The `TimeOut`s due at `now_ms` (the state's clock); none within
    /// [`WALL_CHECK_INTERVAL_MS`] of the last look.
    pub fn due(&mut self, state: &ClusterState, now_ms: u64) -> Vec<Command> {
        if self.last_ms.is_some_and(|last| now_ms.saturating_sub(last) < WALL_CHECK_INTERVAL_MS) {
            return Vec::new();
        }
        self.last_ms = Some(now_ms);
        time_outs(state, now_ms)
    }
}

/// The account `j` is charged to: its own, else its user's default.
fn account_of<'a>(db: &'a Accounts, j: &'a Job) -> Option<&'a str> {
    j.spec.account.as_deref().or_else(|| db.default_account(&j.spec.user))
}

fn qos_of(j: &Job) -> &str {
    j.spec.qos.as_deref().unwrap_or(proto::DEFAULT_QOS)
}

/// A `TimeOut` for every running job (not suspended) under a `GrpWall` used up at `now_ms`, at
/// most `proto::BATCH_COMMANDS_MAX` (the rest at the next look).
pub fn time_outs(state: &ClusterState, now_ms: u64) -> Vec<Command> {
    let db: &Accounts = &state.accounts;
    let qos_limit_min = state.policy.qos.iter().filter_map(|q| Some((q.name.clone(), q.limits.grp_wall_min?))).collect();
    // The runs not charged yet: those whose current run holds a part (`state`'s `wall`).
    let live = state.jobs_holding_parts().filter(|j| j.start_ms.is_some() && j.parts.iter().any(|p| p.run == j.run)).map(|j| LiveRun {
        account: account_of(db, j),
        user: &j.spec.user,
        qos: qos_of(j),
        wall_ms: j.run_time_ms_at(now_ms),
    });
    let half_life_ms = state.policy.decay_half_life_ms();
    let Some(wall) = WallUse::new(db, qos_limit_min, &state.usage, &state.qos_usage, live, now_ms, half_life_ms) else {
        return Vec::new();
    };
    state
        .jobs_holding_parts()
        .filter(|j| j.state == JobState::Running && !j.suspended())
        .filter_map(|j| {
            let over = wall.over(db, &j.spec.user, account_of(db, j), qos_of(j))?;
            Some(Command::TimeOut { job: j.id, reason: over.words, now_ms })
        })
        .take(proto::BATCH_COMMANDS_MAX)
        .collect()
}

#[cfg(test)]
mod tests {
    use proto::accounts::{AccountsEdit, AssocChanges, LimitChanges, QosChanges};
    use proto::{CommandResult, JobId, JobSpec};

    use super::*;

    fn grp_wall(min: Option<u64>) -> LimitChanges {
        LimitChanges { grp_wall_min: Some(min), ..Default::default() }
    }

    /// One node, account `phys` with alice's association, QoS `short`.
    fn cluster() -> ClusterState {
        let mut s = ClusterState::default();
        crate::testing::node(&mut s);
        let edits = vec![
            AccountsEdit::AddAccount { name: "phys".into(), description: None, organization: None, parent: None },
            AccountsEdit::AddUser { name: "alice".into(), account: "phys".into(), default_account: None },
            AccountsEdit::AddQos { name: "short".into(), priority: None },
            AccountsEdit::ModifyUser {
                name: "alice".into(),
                account: None,
                changes: AssocChanges { qos: Some(vec!["normal".into(), "short".into()]), ..Default::default() },
                default_account: None,
            },
        ];
        assert_eq!(s.apply(&Command::EditAccounts { edits, now_ms: 0 }), CommandResult::Ok);
        s
    }

    fn edit(s: &mut ClusterState, edit: AccountsEdit, now_ms: u64) {
        assert_eq!(s.apply(&Command::EditAccounts { edits: vec![edit], now_ms }), CommandResult::Ok);
    }

    /// A job of alice (in `qos`) running from `start_ms`.
    fn running(s: &mut ClusterState, qos: Option<&str>, start_ms: u64) -> JobId {
        let spec = JobSpec { qos: qos.map(str::to_string), ..JobSpec::command(vec!["sleep".into(), "60".into()], "/", "alice") };
        crate::testing::running(s, spec, start_ms)
    }

    #[test]
    fn two_jobs_of_an_account_with_grp_wall_1_both_time_out_once_a_minute_is_used() {
        let mut s = cluster();
        let changes = AssocChanges { limits: grp_wall(Some(1)), ..Default::default() };
        edit(&mut s, AccountsEdit::ModifyAccount { name: "phys".into(), changes }, 0);
        let (a, b) = (running(&mut s, None, 1_000), running(&mut s, None, 1_000));
        let mut limits = WallLimits::default();
        assert_eq!(limits.due(&s, 30_999), vec![], "59.998 s used: no whole minute");
        assert_eq!(limits.due(&s, 31_000), vec![], "within 5 s of the last look");
        let words = "Job is at or exceeds association (acc=phys/user=(null)/part=(null)) group wall limit 1 with 1";
        let time_out = |job, now_ms| Command::TimeOut { job, reason: words.into(), now_ms };
        assert_eq!(limits.due(&s, 36_000), vec![time_out(a, 36_000), time_out(b, 36_000)]);
        for cmd in limits.due(&s, 41_000) {
            assert_eq!(s.apply(&cmd), CommandResult::Ok);
        }
        assert_eq!(s.jobs[&a].state, JobState::Timeout);
        assert_eq!(time_outs(&s, 50_000), vec![], "no running job left to time out");
        // Lifted: a new job runs on.
        let changes = AssocChanges { limits: grp_wall(None), ..Default::default() };
        edit(&mut s, AccountsEdit::ModifyAccount { name: "phys".into(), changes }, 50_000);
        running(&mut s, None, 50_000);
        assert_eq!(time_outs(&s, 200_000), vec![]);
    }

    #[test]
    fn a_qos_limit_times_out_its_jobs_only_and_a_suspended_job_waits() {
        let mut s = cluster();
        edit(
            &mut s,
            AccountsEdit::ModifyQos { name: "short".into(), changes: QosChanges { limits: grp_wall(Some(1)), ..Default::default() } },
            0,
        );
        let short = running(&mut s, Some("short"), 0);
        let normal = running(&mut s, None, 0);
        let paused = running(&mut s, Some("short"), 0);
        assert_eq!(s.apply(&Command::Suspend { job: paused, suspend: true, now_ms: 10_000 }), CommandResult::Ok);
        let cmds = time_outs(&s, 60_000);
        let reason = "Job is at or exceeds QOS short's group wall limit of 1 with 1";
        assert_eq!(cmds, vec![Command::TimeOut { job: short, reason: reason.into(), now_ms: 60_000 }], "not {normal}, not {paused}");
        // No limit anywhere: nothing is read.
        let mut free = cluster();
        running(&mut free, None, 0);
        assert_eq!(time_outs(&free, 10_000_000), vec![]);
    }
}
