//! The submissions the log made recently, by the key their client gave them
//! (`JobSpec::submit_key`): a resend of one (its reply lost as its leader died, or retried by
//! the node that forwarded it) is answered with the job the first one made, never a second.
//!
//! Part of the replicated state, so every replica, and every leader after a failover, answers a
//! resend alike. Bounded by age ([`proto::SUBMIT_KEY_TTL_MS`], by the submitting commands'
//! `now_ms`, so replay decides the same) and by count ([`proto::SUBMIT_KEYS_MAX`]).

use std::collections::{BTreeMap, VecDeque};

use proto::JobId;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubmitKeys {
    by_key: BTreeMap<u128, Made>,
    /// Keys in the order they were made, with when: the oldest are forgotten first.
    order: VecDeque<(u64, u128)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Made {
    job: JobId,
    user: String,
    at_ms: u64,
}

/// What a submission's key says about it.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not made within the window: a new submission.
    New,
    /// A resend: this job is what it made.
    Made(JobId),
    /// The key names another user's submission (only a client that chose it could).
    OtherUser,
}

impl SubmitKeys {
    /// What `key` of `user`'s submission at `now_ms` is.
    pub fn seen(&self, key: u128, user: &str, now_ms: u64) -> Seen {
        match self.by_key.get(&key) {
            Some(made) if now_ms.saturating_sub(made.at_ms) < proto::SUBMIT_KEY_TTL_MS => {
                if made.user == user {
                    Seen::Made(made.job)
                } else {
                    Seen::OtherUser
                }
            }
            _ => Seen::New,
        }
    }

    /// Records that `key` made `job` at `now_ms`, forgetting what is too old or too many.
    pub fn record(&mut self, key: u128, job: JobId, user: &str, now_ms: u64) {
        while let Some(&(at_ms, oldest)) = self.order.front() {
            let stale = now_ms.saturating_sub(at_ms) >= proto::SUBMIT_KEY_TTL_MS;
            if !stale && self.order.len() < proto::SUBMIT_KEYS_MAX {
                break;
            }
            self.order.pop_front();
            self.by_key.remove(&oldest);
        }
        // A key reused after it expired: its old place in `order` must not forget it early.
        if self.by_key.insert(key, Made { job, user: user.to_string(), at_ms: now_ms }).is_some() {
            self.order.retain(|(_, k)| *k != key);
        }
        self.order.push_back((now_ms, key));
        assert!(self.order.len() <= proto::SUBMIT_KEYS_MAX && self.order.len() == self.by_key.len());
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_gets_the_job_the_first_made_until_its_key_is_forgotten() {
        let mut keys = SubmitKeys::default();
        assert_eq!(keys.seen(7, "alice", 1_000), Seen::New);
        keys.record(7, 41, "alice", 1_000);
        assert_eq!(keys.seen(7, "alice", 2_000), Seen::Made(41));
        assert_eq!(keys.seen(7, "bob", 2_000), Seen::OtherUser);
        assert_eq!(keys.seen(8, "alice", 2_000), Seen::New);
        let later = 1_000 + proto::SUBMIT_KEY_TTL_MS;
        assert_eq!(keys.seen(7, "alice", later), Seen::New, "past the window");
        keys.record(9, 42, "alice", later);
        assert_eq!(keys.len(), 1, "the expired key is forgotten when the next is recorded");
        // Reused after it expired, a key makes a new job and counts from then.
        keys.record(7, 43, "alice", later + 1);
        assert_eq!(keys.seen(7, "alice", later + 2), Seen::Made(43));
        assert_eq!(keys.len(), 2);
    }

    #[test]
    fn the_oldest_keys_go_first_past_the_bound() {
        let mut keys = SubmitKeys::default();
        let n = proto::SUBMIT_KEYS_MAX as u128;
        for k in 0..n + 3 {
            keys.record(k, k as JobId, "u", 5);
        }
        assert_eq!(keys.len(), proto::SUBMIT_KEYS_MAX);
        assert_eq!(keys.seen(2, "u", 5), Seen::New);
        assert_eq!(keys.seen(3, "u", 5), Seen::Made(3));
        assert_eq!(keys.seen(n + 2, "u", 5), Seen::Made((n + 2) as JobId));
    }
}
