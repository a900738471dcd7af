//! The hot state's jobs by the key their submission carried (`JobSpec::submit_key`): a resend
//! of a submission (its reply lost as its leader died, or retried by the node that forwarded it
//! to the next leader) is answered with the job the first one made, never a second job.
//!
//! Derived from the jobs, never encoded: every replica keeps it as it applies the log, and a
//! replica that reads a snapshot builds it again from the snapshot's jobs ([`SubmitKeys::of`]),
//! so a resend is answered alike by every leader after a failover, and the index costs the
//! snapshots nothing. A key is known while its job is in the hot state: until
//! `min_job_age_s` after the job ended (archived jobs leave it), far beyond any client's
//! resend.

use std::collections::BTreeMap;

use proto::{Job, JobId};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubmitKeys {
    by_key: BTreeMap<u128, JobId>,
}

impl SubmitKeys {
    /// The index of `jobs`: each keyed submission's job (an array's own job, not its tasks,
    /// which share its spec).
    pub fn of(jobs: &BTreeMap<JobId, Job>) -> SubmitKeys {
        let by_key = jobs.values().filter(|j| made_by_submission(j)).filter_map(|j| Some((j.spec.submit_key?, j.id))).collect();
        SubmitKeys { by_key }
    }

    /// The job the submission with `key` made, if it is in the hot state.
    pub fn job(&self, key: u128) -> Option<JobId> {
        self.by_key.get(&key).copied()
    }

    /// `job` (just submitted) was made by `key`.
    pub fn insert(&mut self, key: u128, job: JobId) {
        let earlier = self.by_key.insert(key, job);
        assert!(earlier.is_none(), "key of job {job} already made job {earlier:?}");
    }

    /// `job` left the hot state.
    pub fn remove(&mut self, job: &Job) {
        if let Some(key) = job.spec.submit_key.filter(|_| made_by_submission(job)) {
            self.by_key.remove(&key);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

/// Whether `job` is the one its submission made: a task of an array is a copy of the array's
/// job under an id of its own, except the last, which is the array's job itself.
fn made_by_submission(job: &Job) -> bool {
    job.array.as_ref().is_none_or(|t| t.array_job == job.id)
}
