//! Finished jobs leaving the hot state (`ArchiveJobs`, and which jobs may go), and the bound on
//! a `PruneAccounting`.

use proto::{CommandResult, Job, JobId};

use super::{rejected, ClusterState};

/// `PruneAccounting`: the records live in the accounting store, which the store prunes; the
/// state only bounds how many one command names.
pub(super) fn prune_accounting(jobs: &[JobId]) -> CommandResult {
    if jobs.len() > proto::ARCHIVE_BATCH_MAX {
        rejected(format!("{} records in one prune, more than {}", jobs.len(), proto::ARCHIVE_BATCH_MAX))
    } else {
        CommandResult::Ok
    }
}

impl ClusterState {
    /// Moves every named job that is final and holds nothing out of the hot state, into
    /// `archived`; the others stay (a stale list is harmless).
    pub(super) fn archive_jobs(&mut self, ids: &[JobId], archived: &mut Vec<Job>) -> CommandResult {
        if ids.len() > proto::ARCHIVE_BATCH_MAX {
            return rejected(format!("{} jobs in one archive, more than {}", ids.len(), proto::ARCHIVE_BATCH_MAX));
        }
        for id in ids {
            let done = self.jobs.get(id).is_some_and(|j| j.state.is_final() && j.parts.is_empty());
            if let Some(job) = done.then(|| self.jobs.remove(id)).flatten() {
                self.submit_keys.remove(&job);
                // A cancelled array starts no more tasks.
                self.array_started.remove(id);
                self.stores.remove(id);
                archived.push(job);
            }
        }
        CommandResult::Ok
    }

    /// Finished jobs that may leave the hot state at `now_ms` when kept `min_age_ms`: final,
    /// holding nothing, ended long enough ago; at most `limit`, in id order.
    pub fn archivable(&self, now_ms: u64, min_age_ms: u64, limit: usize) -> Vec<JobId> {
        self.jobs
            .values()
            .filter(|j| j.state.is_final() && j.parts.is_empty() && j.end_ms.is_some_and(|e| e.saturating_add(min_age_ms) <= now_ms))
            .map(|j| j.id)
            .take(limit)
            .collect()
    }
}
