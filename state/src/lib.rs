//! The replicated cluster state and the one function that changes it, with no IO: the state
//! machine every voter applies (`cluster`), what the accounting database allows a submission
//! (`associations`), the hot state's jobs by submission key (`submit_keys`) and the scheduler's
//! input built from it (`view`). No storage, no clock, no randomness: `consensus` persists it,
//! `corral-chaos sim` and `corral replay` drive it under simulated time.

mod associations;
pub mod cluster;
pub mod submit_keys;
pub mod view;

pub use cluster::ClusterState;
