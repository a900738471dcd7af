//! When the leader moves finished jobs out of the hot state into the accounting store, and
//! which records past retention it prunes: a bounded batch of each, at most once per
//! [`ARCHIVE_INTERVAL_MS`]. Which jobs may leave is the state's rule (`ClusterState::archivable`,
//! checked again when `ArchiveJobs` applies).

use corral_state::ClusterState;
use proto::{Command, JobId};

/// How often the leader archives and prunes.
pub const ARCHIVE_INTERVAL_MS: u64 = 1_000;

/// How long jobs and their records are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// A finished job stays in the hot state this long (Slurm's `MinJobAge`).
    pub min_job_age_ms: u64,
    /// An accounting record is pruned this long after the job ended.
    pub accounting_ms: u64,
}

/// What one archive step asks for: the `ArchiveJobs` command to propose, if any job may leave,
/// and the end time before which accounting records are pruned (the caller reads them from its
/// store, at most `proto::ARCHIVE_BATCH_MAX`, and proposes [`Archiver::prune`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchiveStep {
    pub archive: Option<Command>,
    pub prune_ended_before_ms: u64,
}

/// When the leader last archived, in this term.
#[derive(Clone, Debug, Default)]
pub struct Archiver {
    last_ms: Option<u64>,
}

impl Archiver {
    /// The archive step due at `now_ms` (the state's clock), or `None` within
    /// [`ARCHIVE_INTERVAL_MS`] of the last.
    pub fn due(&mut self, state: &ClusterState, now_ms: u64, retention: Retention) -> Option<ArchiveStep> {
        if self.last_ms.is_some_and(|last| now_ms.saturating_sub(last) < ARCHIVE_INTERVAL_MS) {
            return None;
        }
        self.last_ms = Some(now_ms);
        let jobs = state.archivable(now_ms, retention.min_job_age_ms, proto::ARCHIVE_BATCH_MAX);
        let archive = (!jobs.is_empty()).then_some(Command::ArchiveJobs { jobs, now_ms });
        Some(ArchiveStep { archive, prune_ended_before_ms: now_ms.saturating_sub(retention.accounting_ms) })
    }

    /// The command that prunes `jobs` (read from the accounting store), if there are any.
    pub fn prune(jobs: Vec<JobId>, now_ms: u64) -> Option<Command> {
        (!jobs.is_empty()).then_some(Command::PruneAccounting { jobs, now_ms })
    }
}

#[cfg(test)]
mod tests {
    use proto::{CommandResult, JobSpec};

    use super::*;

    const RETENTION: Retention = Retention { min_job_age_ms: 5_000, accounting_ms: 86_400_000 };

    #[test]
    fn a_job_leaves_once_final_and_old_enough_at_most_once_a_second() {
        let mut state = ClusterState::default();
        let spec = JobSpec::command(vec!["true".into()], "/", "ann");
        let CommandResult::Submitted { job } = state.apply(&Command::Submit { spec, now_ms: 0 }) else { panic!("submit") };
        let mut archiver = Archiver::default();
        let step = archiver.due(&state, 100_000_000, RETENTION).expect("the first step is due");
        assert_eq!(step, ArchiveStep { archive: None, prune_ended_before_ms: 100_000_000 - 86_400_000 }, "a pending job stays");
        state.apply(&Command::Cancel { job, now_ms: 100_000_000 });
        assert_eq!(archiver.due(&state, 100_000_999, RETENTION), None, "within the interval");
        let step = archiver.due(&state, 100_001_000, RETENTION).expect("due");
        assert_eq!(step.archive, None, "ended 1 s ago, kept 5 s");
        let step = archiver.due(&state, 100_005_000, RETENTION).expect("due");
        assert_eq!(step.archive, Some(Command::ArchiveJobs { jobs: vec![job], now_ms: 100_005_000 }));
    }

    #[test]
    fn nothing_to_prune_asks_for_nothing() {
        assert_eq!(Archiver::prune(Vec::new(), 5), None);
        assert_eq!(Archiver::prune(vec![3], 5), Some(Command::PruneAccounting { jobs: vec![3], now_ms: 5 }));
    }
}
