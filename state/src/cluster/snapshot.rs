//! What a snapshot needs beyond serde: the header without the jobs, the derived indexes and
//! shared array specs rebuilt after a decode, and the digest replicas compare.

use std::collections::{BTreeMap, BTreeSet};

use proto::{Job, JobId, JobSpec};
use sha2::{Digest, Sha256};

use super::ClusterState;

impl ClusterState {
    /// [`ClusterState::holding_parts`] built from `jobs`.
    pub fn holding_parts_of(jobs: &BTreeMap<JobId, Job>) -> BTreeSet<JobId> {
        jobs.values().filter(|j| !j.parts.is_empty()).map(|j| j.id).collect()
    }

    /// Makes the tasks of each array share one spec again where they have the same (a snapshot
    /// decodes each job's spec on its own): the environment and script are held once per
    /// submission, not per task.
    pub fn share_array_specs(&mut self) {
        let mut first: BTreeMap<JobId, std::sync::Arc<JobSpec>> = BTreeMap::new();
        for job in self.jobs.values_mut() {
            let key = match (&job.array, &job.spec.array) {
                (Some(task), _) => task.array_job,
                (None, Some(_)) => job.id,
                (None, None) => continue,
            };
            match first.get(&key) {
                Some(shared) if **shared == *job.spec => job.spec = shared.clone(),
                Some(_) => {}
                None => {
                    first.insert(key, job.spec.clone());
                }
            }
        }
    }

    /// Everything but the jobs (a snapshot's header; the jobs follow in chunks).
    pub fn clone_without_jobs(&self) -> ClusterState {
        ClusterState {
            nodes: self.nodes.clone(),
            jobs: BTreeMap::new(),
            next_job_id: self.next_job_id,
            next_node_id: self.next_node_id,
            policy: self.policy.clone(),
            join_tokens: self.join_tokens.clone(),
            next_token_id: self.next_token_id,
            revoked_certs: self.revoked_certs.clone(),
            revoked_nodes: self.revoked_nodes.clone(),
            retired_instances: self.retired_instances.clone(),
            array_started: self.array_started.clone(),
            usage: self.usage.clone(),
            qos_usage: self.qos_usage.clone(),
            accounts: self.accounts.clone(),
            requeues: self.requeues,
            node_events: self.node_events.clone(),
            reservations: self.reservations.clone(),
            stores: self.stores.clone(),
            submit_keys: Default::default(),
            holding_parts: BTreeSet::new(),
        }
    }

    /// Hex SHA-256 of the encoded state: equal on every replica that applied the same log.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(proto::encode(self)))
    }
}

#[cfg(test)]
mod tests {
    use proto::Command;

    use crate::cluster::test_support::gang;

    #[test]
    fn digest_is_stable_and_follows_state() {
        let (s1, _, _, _) = gang();
        let (mut s2, _, _, job) = gang();
        assert_eq!(s1.digest(), s2.digest());
        s2.apply(&Command::Cancel { job, now_ms: 90 });
        assert_ne!(s1.digest(), s2.digest());
    }
}
