//! All of a node's IO: the QUIC server and client, GPU probes, the job launcher, the agent and
//! leader loops, and metrics. Placement decisions come from `scheduler`, state changes only
//! through `consensus` (a committed `Command`); this crate never mutates `ClusterState` itself.

pub mod agent;
pub mod capabilities;
pub mod config;
pub mod fault;
pub mod gpu;
pub mod link;
pub mod liveness;
pub mod metrics;
pub mod nccl;
pub mod pacing;
pub mod probe;
pub mod rdzv;
pub mod run;
pub mod server;
pub mod simnodes;
pub mod systemd;
