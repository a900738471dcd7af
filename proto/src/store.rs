//! A job's rendezvous store: the key-value store torch's c10d rendezvous keeps its state in
//! (`TCPStore`'s operations), served by every node of the job and replicated through the log,
//! so a gang meeting there survives the loss of any node. The operations and their answers;
//! their meaning is `corral_state`'s (`cluster/stores.rs`), the wire torch speaks `node`'s.

use serde::{Deserialize, Serialize};

/// Bytes of a key at most.
pub const STORE_KEY_BYTES_MAX: usize = 4096;
/// Bytes of a value at most (torch's rendezvous state of a few thousand nodes fits).
pub const STORE_VALUE_BYTES_MAX: usize = 1024 * 1024;
/// Keys one operation names at most (`multi_get`, `multi_set`, `check`, `wait`).
pub const STORE_KEYS_PER_OP_MAX: usize = 1024;
/// Keys of one job's store at most.
pub const STORE_KEYS_PER_JOB_MAX: usize = 16_384;
/// Bytes of keys and values of one job's store at most.
pub const STORE_BYTES_PER_JOB_MAX: usize = 4 * 1024 * 1024;
/// Clients (connections) whose last write a job's store remembers at most.
pub const STORE_CLIENTS_PER_JOB_MAX: usize = 256;
/// Bytes of keys and values of all jobs' stores at most: what the hot state holds for them
/// (a snapshot's header, one frame of at most [`crate::limits::FRAME_BYTES_MAX`], carries them).
pub const STORE_BYTES_MAX: usize = 32 * 1024 * 1024;

/// One operation on a job's store. The writes go through the log; the reads are answered from
/// the leader's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreOp {
    Set {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    /// Sets `desired` where the key holds `expected` (or is absent and `expected` is empty);
    /// answers the value the key holds after.
    CompareSet {
        key: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    },
    /// Adds `delta` to the decimal number the key holds (0 when absent); answers the sum.
    Add {
        key: Vec<u8>,
        delta: i64,
    },
    /// Answers how many keys it deleted (0 or 1).
    Delete {
        key: Vec<u8>,
    },
    Append {
        key: Vec<u8>,
        value: Vec<u8>,
    },
    MultiSet {
        pairs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// Answers the value of each key, `None` for one absent.
    Get {
        keys: Vec<Vec<u8>>,
    },
    /// Answers whether every key is present.
    Check {
        keys: Vec<Vec<u8>>,
    },
    NumKeys,
}

/// What a [`StoreOp`] answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreAnswer {
    Done,
    Value(Vec<u8>),
    Number(i64),
    Values(Vec<Option<Vec<u8>>>),
    Ready(bool),
}

impl StoreOp {
    /// Whether the operation changes the store (and so goes through the log).
    pub fn writes(&self) -> bool {
        !matches!(self, StoreOp::Get { .. } | StoreOp::Check { .. } | StoreOp::NumKeys)
    }

    /// The keys and values it carries, by bytes: a bound on its encoded size.
    pub fn weight_bytes(&self) -> usize {
        let keys = |keys: &[Vec<u8>]| keys.iter().map(|k| k.len() + 8).sum::<usize>();
        match self {
            StoreOp::Set { key, value } | StoreOp::Append { key, value } => key.len() + value.len(),
            StoreOp::CompareSet { key, expected, desired } => key.len() + expected.len() + desired.len(),
            StoreOp::Add { key, .. } | StoreOp::Delete { key } => key.len(),
            StoreOp::MultiSet { pairs } => pairs.iter().map(|(k, v)| k.len() + v.len() + 16).sum(),
            StoreOp::Get { keys: k } | StoreOp::Check { keys: k } => keys(k),
            StoreOp::NumKeys => 0,
        }
    }

    /// Checks the bounds of every key, value and list; why not.
    pub fn validate(&self) -> Result<(), String> {
        let key = |k: &[u8]| {
            if k.len() > STORE_KEY_BYTES_MAX {
                return Err(format!("a store key of {} bytes, more than {STORE_KEY_BYTES_MAX}", k.len()));
            }
            Ok(())
        };
        let value = |v: &[u8]| {
            if v.len() > STORE_VALUE_BYTES_MAX {
                return Err(format!("a store value of {} bytes, more than {STORE_VALUE_BYTES_MAX}", v.len()));
            }
            Ok(())
        };
        let count = |n: usize| {
            if n > STORE_KEYS_PER_OP_MAX {
                return Err(format!("{n} store keys in one operation, more than {STORE_KEYS_PER_OP_MAX}"));
            }
            Ok(())
        };
        // No operation larger than two stores' worth reaches the log (one could never fit).
        if self.weight_bytes() > 2 * STORE_BYTES_PER_JOB_MAX {
            return Err(format!("a store operation of {} bytes, more than {}", self.weight_bytes(), 2 * STORE_BYTES_PER_JOB_MAX));
        }
        match self {
            StoreOp::Set { key: k, value: v } | StoreOp::Append { key: k, value: v } => key(k).and(value(v)),
            StoreOp::CompareSet { key: k, expected, desired } => key(k).and(value(expected)).and(value(desired)),
            StoreOp::Add { key: k, .. } | StoreOp::Delete { key: k } => key(k),
            StoreOp::MultiSet { pairs } => {
                count(pairs.len())?;
                pairs.iter().try_for_each(|(k, v)| key(k).and(value(v)))
            }
            StoreOp::Get { keys } | StoreOp::Check { keys } => {
                count(keys.len())?;
                keys.iter().try_for_each(|k| key(k))
            }
            StoreOp::NumKeys => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_skip_the_log_and_every_bound_is_checked() {
        assert!(StoreOp::Set { key: b"k".to_vec(), value: vec![] }.writes());
        assert!(StoreOp::Add { key: b"k".to_vec(), delta: 1 }.writes());
        assert!(!StoreOp::Get { keys: vec![b"k".to_vec()] }.writes());
        assert!(!StoreOp::NumKeys.writes());

        let long_key = vec![b'k'; STORE_KEY_BYTES_MAX + 1];
        assert!(StoreOp::Delete { key: long_key.clone() }.validate().is_err());
        assert!(StoreOp::Get { keys: vec![long_key] }.validate().is_err());
        let big = vec![0; STORE_VALUE_BYTES_MAX + 1];
        assert!(StoreOp::CompareSet { key: b"k".to_vec(), expected: vec![], desired: big }.validate().is_err());
        assert!(StoreOp::Check { keys: vec![vec![]; STORE_KEYS_PER_OP_MAX + 1] }.validate().is_err());
        assert_eq!(StoreOp::MultiSet { pairs: vec![(b"a".to_vec(), b"b".to_vec())] }.validate(), Ok(()));
        assert_eq!(StoreOp::Set { key: b"ab".to_vec(), value: b"cde".to_vec() }.weight_bytes(), 5);
    }
}
