//! Jobs' rendezvous stores (`Command::Store`): torch's `TCPStore` operations on a key-value map
//! per job, kept for the job's current run (the first write of a new run empties it) and
//! dropped with the job. Bounded: [`proto::STORE_KEYS_PER_JOB_MAX`] keys and
//! [`proto::STORE_BYTES_PER_JOB_MAX`] bytes a job, [`proto::STORE_BYTES_MAX`] bytes in all.

use std::collections::BTreeMap;

use proto::{CommandResult, JobId, JobState, RunNo, StoreAnswer, StoreOp};
use serde::{Deserialize, Serialize};

use super::{rejected, ClusterState};

/// One job's store: its run's keys and values.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStore {
    pub run: RunNo,
    pub keys: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Bytes of the keys and values above.
    pub bytes: usize,
    /// The last write of each client (a connection) and its answer, so a write sent again is
    /// not applied twice; at most [`proto::STORE_CLIENTS_PER_JOB_MAX`] clients (the lowest id
    /// is forgotten first).
    pub answered: BTreeMap<u64, (u64, Answered)>,
}

/// What a write answered, as kept to answer it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answered {
    Same(StoreAnswer),
    /// A `compare_set`: the key's value now (what the write answered, unless changed since).
    ValueOf(Vec<u8>),
}

impl JobStore {
    /// Whether setting `pairs` in order fits the bounds, with `others` bytes in other jobs'
    /// stores; why not.
    fn fits(&self, pairs: &[(&[u8], usize)], others: usize) -> Result<(), String> {
        let mut sizes: BTreeMap<&[u8], usize> = BTreeMap::new();
        let (mut keys, mut bytes) = (self.keys.len(), self.bytes);
        for &(key, len) in pairs {
            let before = match sizes.get(key) {
                Some(&len) => Some(len),
                None => self.keys.get(key).map(Vec::len),
            };
            match before {
                Some(old) => bytes = bytes - old + len,
                None => {
                    keys += 1;
                    bytes += key.len() + len;
                }
            }
            sizes.insert(key, len);
        }
        if keys > proto::STORE_KEYS_PER_JOB_MAX {
            return Err(format!("a job's store holds {} keys at most", proto::STORE_KEYS_PER_JOB_MAX));
        }
        if bytes > proto::STORE_BYTES_PER_JOB_MAX {
            return Err(format!("a job's store holds {} bytes at most", proto::STORE_BYTES_PER_JOB_MAX));
        }
        if others + bytes > proto::STORE_BYTES_MAX {
            return Err(format!("the cluster's stores hold {} bytes at most", proto::STORE_BYTES_MAX));
        }
        Ok(())
    }

    fn put(&mut self, key: &[u8], value: Vec<u8>) {
        let len = value.len();
        match self.keys.insert(key.to_vec(), value) {
            Some(old) => self.bytes = self.bytes - old.len() + len,
            None => self.bytes += key.len() + len,
        }
    }

    /// The answer to a read.
    fn read(&self, op: &StoreOp) -> Result<StoreAnswer, String> {
        match op {
            StoreOp::Get { keys } => Ok(StoreAnswer::Values(keys.iter().map(|k| self.keys.get(k).cloned()).collect())),
            StoreOp::Check { keys } => Ok(StoreAnswer::Ready(keys.iter().all(|k| self.keys.contains_key(k)))),
            StoreOp::NumKeys => Ok(StoreAnswer::Number(self.keys.len() as i64)),
            other => Err(format!("{other:?} is not a read")),
        }
    }

    /// Carries out a write, or changes nothing and says why.
    fn write(&mut self, op: &StoreOp, others: usize) -> Result<StoreAnswer, String> {
        match op {
            StoreOp::Set { key, value } => {
                self.fits(&[(key, value.len())], others)?;
                self.put(key, value.clone());
                Ok(StoreAnswer::Done)
            }
            StoreOp::CompareSet { key, expected, desired } => {
                let swap = match self.keys.get(key) {
                    Some(current) => current == expected,
                    None => expected.is_empty(),
                };
                if !swap {
                    // torch answers the value held, or what the caller expected where none is.
                    return Ok(StoreAnswer::Value(self.keys.get(key).unwrap_or(expected).clone()));
                }
                self.fits(&[(key, desired.len())], others)?;
                self.put(key, desired.clone());
                Ok(StoreAnswer::Value(desired.clone()))
            }
            StoreOp::Add { key, delta } => {
                let current = match self.keys.get(key) {
                    None => 0,
                    Some(v) => std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.trim().parse::<i64>().ok())
                        .ok_or_else(|| "add to a key that holds no number".to_string())?,
                };
                let sum = current.checked_add(*delta).ok_or_else(|| "add overflows".to_string())?;
                let value = sum.to_string().into_bytes();
                self.fits(&[(key, value.len())], others)?;
                self.put(key, value);
                Ok(StoreAnswer::Number(sum))
            }
            StoreOp::Delete { key } => Ok(StoreAnswer::Number(match self.keys.remove(key) {
                Some(old) => {
                    self.bytes -= key.len() + old.len();
                    1
                }
                None => 0,
            })),
            StoreOp::Append { key, value } => {
                let mut joined = self.keys.get(key).cloned().unwrap_or_default();
                joined.extend_from_slice(value);
                if joined.len() > proto::STORE_VALUE_BYTES_MAX {
                    return Err(format!("a store value holds {} bytes at most", proto::STORE_VALUE_BYTES_MAX));
                }
                self.fits(&[(key, joined.len())], others)?;
                self.put(key, joined);
                Ok(StoreAnswer::Done)
            }
            StoreOp::MultiSet { pairs } => {
                let sizes: Vec<(&[u8], usize)> = pairs.iter().map(|(k, v)| (k.as_slice(), v.len())).collect();
                self.fits(&sizes, others)?;
                pairs.iter().for_each(|(k, v)| self.put(k, v.clone()));
                Ok(StoreAnswer::Done)
            }
            read => self.read(read),
        }
    }
}

impl ClusterState {
    /// Whether `job`'s run `run` is running: only its store may be used.
    fn store_usable(&self, job: JobId, run: RunNo) -> Result<(), String> {
        match self.jobs.get(&job) {
            None => Err(format!("unknown job {job}")),
            Some(j) if j.state != JobState::Running || j.run != run => Err(format!("job {job} run {run} is not running")),
            Some(_) => Ok(()),
        }
    }

    /// `Command::Store`: write `(client, seq)` to the store of `job`'s running run `run`.
    pub(super) fn store_write(&mut self, job: JobId, run: RunNo, op: &StoreOp, (client, seq): (u64, u64)) -> CommandResult {
        if let Err(why) = op.validate().and_then(|()| self.store_usable(job, run)) {
            return rejected(why);
        }
        if !op.writes() {
            return rejected("a store read is not a command");
        }
        let others: usize = self.stores.iter().filter(|(j, _)| **j != job).map(|(_, s)| s.bytes).sum();
        let store = self.stores.entry(job).or_default();
        if store.run != run {
            *store = JobStore { run, ..JobStore::default() };
        }
        if let Some((_, answered)) = store.answered.get(&client).filter(|(last, _)| *last == seq) {
            return CommandResult::Store(match answered {
                Answered::Same(answer) => answer.clone(),
                Answered::ValueOf(key) => StoreAnswer::Value(store.keys.get(key).cloned().unwrap_or_default()),
            });
        }
        let result = store.write(op, others);
        if let Ok(answer) = &result {
            let kept = match (op, answer) {
                (StoreOp::CompareSet { key, .. }, _) => Answered::ValueOf(key.clone()),
                (_, answer) => Answered::Same(answer.clone()),
            };
            if !store.answered.contains_key(&client) && store.answered.len() >= proto::STORE_CLIENTS_PER_JOB_MAX {
                store.answered.pop_first();
            }
            store.answered.insert(client, (seq, kept));
        }
        if store.keys.is_empty() && store.answered.is_empty() {
            self.stores.remove(&job);
        }
        match result {
            Ok(answer) => CommandResult::Store(answer),
            Err(why) => rejected(why),
        }
    }

    /// A read of the store of `job`'s running run `run` (the leader answers it from its state).
    pub fn store_read(&self, job: JobId, run: RunNo, op: &StoreOp) -> Result<StoreAnswer, String> {
        op.validate().and_then(|()| self.store_usable(job, run))?;
        match self.stores.get(&job).filter(|s| s.run == run) {
            Some(store) => store.read(op),
            None => JobStore::default().read(op),
        }
    }

    /// The stores' invariants: each of a job in the hot state, its byte count true, the bounds
    /// kept.
    pub(super) fn check_stores(&self) {
        self.stores.keys().for_each(|&job| self.check_store(job));
        let total: usize = self.stores.values().map(|s| s.bytes).sum();
        assert!(total <= proto::STORE_BYTES_MAX, "the stores within their bytes");
    }

    /// One job's store's invariants (none there holds them).
    pub(super) fn check_store(&self, job: JobId) {
        let Some(store) = self.stores.get(&job) else { return };
        assert!(self.jobs.contains_key(&job), "the store of job {job}, which is gone");
        let bytes: usize = store.keys.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(bytes, store.bytes, "job {job}'s store counts its bytes");
        assert!(!store.keys.is_empty() || !store.answered.is_empty(), "job {job}'s store holds something");
        assert!(store.keys.len() <= proto::STORE_KEYS_PER_JOB_MAX, "job {job}'s store within its keys");
        assert!(store.answered.len() <= proto::STORE_CLIENTS_PER_JOB_MAX, "job {job}'s store within its clients");
        assert!(bytes <= proto::STORE_BYTES_PER_JOB_MAX, "job {job}'s store within its bytes");
    }
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, StoreAnswer, StoreOp};

    use crate::cluster::test_support::gang;

    /// Applies `op` as a new write of client 1.
    fn op(s: &mut crate::ClusterState, job: u64, run: u32, op: StoreOp) -> CommandResult {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        s.apply(&Command::Store { job, run, op, write: (1, seq), now_ms: 100 })
    }

    #[test]
    fn a_write_sent_again_is_answered_as_the_first_and_not_applied_twice() {
        let (mut s, _, _, job) = gang();
        let run = s.jobs[&job].run;
        let write =
            |s: &mut crate::ClusterState, client, seq, op| s.apply(&Command::Store { job, run, op, write: (client, seq), now_ms: 100 });
        let add = StoreOp::Add { key: k("n"), delta: 5 };
        assert_eq!(write(&mut s, 9, 1, add.clone()), CommandResult::Store(StoreAnswer::Number(5)));
        assert_eq!(write(&mut s, 9, 1, add.clone()), CommandResult::Store(StoreAnswer::Number(5)), "the same write");
        assert_eq!(write(&mut s, 9, 2, add.clone()), CommandResult::Store(StoreAnswer::Number(10)), "the next one");
        assert_eq!(write(&mut s, 8, 2, add), CommandResult::Store(StoreAnswer::Number(15)), "another client's");
        let cas = StoreOp::CompareSet { key: k("x"), expected: vec![], desired: k("mine") };
        assert_eq!(write(&mut s, 9, 3, cas.clone()), CommandResult::Store(StoreAnswer::Value(k("mine"))));
        assert_eq!(write(&mut s, 9, 3, cas), CommandResult::Store(StoreAnswer::Value(k("mine"))), "its value, not a refusal");
        // Clients past the bound: the lowest is forgotten.
        for client in 100..100 + proto::STORE_CLIENTS_PER_JOB_MAX as u64 {
            write(&mut s, client, 1, StoreOp::Set { key: k("c"), value: vec![] });
        }
        assert_eq!(s.stores[&job].answered.len(), proto::STORE_CLIENTS_PER_JOB_MAX);
        assert!(!s.stores[&job].answered.contains_key(&8));
    }

    fn k(s: &str) -> Vec<u8> {
        s.as_bytes().to_vec()
    }

    #[test]
    fn a_running_jobs_store_answers_as_torchs_tcpstore_and_dies_with_its_run() {
        let (mut s, _, _, job) = gang();
        let run = s.jobs[&job].run;
        let answer = |r| match r {
            CommandResult::Store(a) => a,
            other => panic!("not a store answer: {other:?}"),
        };
        // compare_set on an absent key: set where nothing was expected, else the expected back.
        assert_eq!(
            answer(op(&mut s, job, run, StoreOp::CompareSet { key: k("x"), expected: k("a"), desired: k("b") })),
            StoreAnswer::Value(k("a"))
        );
        assert_eq!(s.store_read(job, run, &StoreOp::NumKeys), Ok(StoreAnswer::Number(0)));
        assert_eq!(
            answer(op(&mut s, job, run, StoreOp::CompareSet { key: k("x"), expected: vec![], desired: k("b") })),
            StoreAnswer::Value(k("b"))
        );
        assert_eq!(
            answer(op(&mut s, job, run, StoreOp::CompareSet { key: k("x"), expected: k("z"), desired: k("c") })),
            StoreAnswer::Value(k("b"))
        );
        assert_eq!(
            answer(op(&mut s, job, run, StoreOp::CompareSet { key: k("x"), expected: k("b"), desired: k("c") })),
            StoreAnswer::Value(k("c"))
        );
        // add keeps a decimal number, as torch's store does.
        assert_eq!(answer(op(&mut s, job, run, StoreOp::Add { key: k("n"), delta: 2 })), StoreAnswer::Number(2));
        assert_eq!(answer(op(&mut s, job, run, StoreOp::Add { key: k("n"), delta: -5 })), StoreAnswer::Number(-3));
        assert!(matches!(op(&mut s, job, run, StoreOp::Add { key: k("x"), delta: 1 }), CommandResult::Rejected(_)), "not a number");
        op(&mut s, job, run, StoreOp::Append { key: k("a"), value: k("12") });
        op(&mut s, job, run, StoreOp::Append { key: k("a"), value: k("3") });
        op(&mut s, job, run, StoreOp::MultiSet { pairs: vec![(k("m1"), k("1")), (k("m2"), k("2"))] });
        let get = StoreOp::Get { keys: vec![k("a"), k("n"), k("m2"), k("none")] };
        assert_eq!(s.store_read(job, run, &get), Ok(StoreAnswer::Values(vec![Some(k("123")), Some(k("-3")), Some(k("2")), None])));
        assert_eq!(s.store_read(job, run, &StoreOp::Check { keys: vec![k("a"), k("m1")] }), Ok(StoreAnswer::Ready(true)));
        assert_eq!(s.store_read(job, run, &StoreOp::Check { keys: vec![k("a"), k("none")] }), Ok(StoreAnswer::Ready(false)));
        assert_eq!(answer(op(&mut s, job, run, StoreOp::Delete { key: k("m1") })), StoreAnswer::Number(1));
        assert_eq!(answer(op(&mut s, job, run, StoreOp::Delete { key: k("m1") })), StoreAnswer::Number(0));
        assert_eq!(s.store_read(job, run, &StoreOp::NumKeys), Ok(StoreAnswer::Number(4)));

        // Another run's or a job's not running: refused, and nothing read.
        assert!(matches!(op(&mut s, job, run + 1, StoreOp::Set { key: k("y"), value: vec![] }), CommandResult::Rejected(_)));
        assert!(s.store_read(job, run + 1, &StoreOp::NumKeys).is_err());
        assert!(matches!(op(&mut s, job + 99, 1, StoreOp::NumKeys), CommandResult::Rejected(_)));
        // A read is no command.
        assert!(matches!(op(&mut s, job, run, StoreOp::NumKeys), CommandResult::Rejected(_)));

        // Past the job's bound nothing changes.
        let before = s.stores.clone();
        let big = vec![0u8; proto::STORE_VALUE_BYTES_MAX];
        let pairs: Vec<_> =
            (0..proto::STORE_BYTES_PER_JOB_MAX / proto::STORE_VALUE_BYTES_MAX).map(|i| (k(&format!("b{i}")), big.clone())).collect();
        assert!(matches!(op(&mut s, job, run, StoreOp::MultiSet { pairs }), CommandResult::Rejected(_)));
        assert_eq!(s.stores, before);

        // Cancelled, the job's store is no longer usable; archived, it is gone.
        s.apply(&Command::Cancel { job, now_ms: 200 });
        assert!(s.store_read(job, run, &StoreOp::NumKeys).is_err());
        for part in s.jobs[&job].parts.clone() {
            let outcome = proto::RunOutcome::Exited(0);
            s.apply(&Command::RunFinished { job, run, node: part.alloc.node, outcome, usage: Default::default(), now_ms: 300 });
        }
        s.apply(&Command::ArchiveJobs { jobs: vec![job], now_ms: 400 });
        assert!(!s.stores.contains_key(&job));
    }
}
