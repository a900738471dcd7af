//! [`ApiError`]: why a request was refused, as every client and peer sees it.

use serde::{Deserialize, Serialize};

use crate::NodeId;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApiError {
    #[error("not the leader (leader: {leader_addr:?})")]
    NotLeader { leader: Option<NodeId>, leader_addr: Option<String> },
    #[error("no leader is known right now")]
    NoLeader,
    #[error("not found: {0}")]
    NotFound(String),
    #[error("invalid request: {0}")]
    Invalid(String),
    #[error("refused: {0}")]
    Denied(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// What was asked cannot be had now but will be (a step's GPUs held by other steps): ask
    /// again later, as Slurm's `srun` does ("step creation temporarily disabled").
    #[error("busy: {0}")]
    Busy(String),
    #[error("protocol version mismatch: ours {ours}, theirs {theirs}")]
    Version { ours: u8, theirs: u8 },
    #[error("internal error: {0}")]
    Internal(String),
}
