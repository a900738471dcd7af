//! All of a node's IO: the QUIC server and client, GPU probes, the job launcher, the agent and
//! leader loops, and metrics. Placement decisions come from `scheduler`, state changes only
//! through `consensus` (a committed `Command`); this crate never mutates `ClusterState` itself.

pub mod agent;
pub mod capabilities;
pub mod cgroup;
pub mod cgroup_devices;
pub mod config;
pub mod daemon_record;
pub mod fault;
pub mod gpu;
pub mod identity;
pub mod json_file;
pub mod launcher;
pub mod link;
pub mod liveness;
pub mod metrics;
pub mod nccl;
pub mod pacing;
pub mod preflight;
pub mod probe;
pub mod process;
pub mod procfs;
pub mod pty;
pub mod server;
pub mod shepherd;
pub mod simnodes;
pub mod spawner;
pub mod step;
pub mod step_stdin;
pub mod systemd;
pub mod usage;
pub mod watchdog;
