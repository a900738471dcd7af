//! Running jobs on this node, below the agent's decisions: a run's launcher, the shepherd that
//! holds its processes and the spawner that forks shepherds, starting one process (`process`,
//! `procfs`), cgroups and device fencing, steps and their stdin and ptys, usage, the preflight,
//! user accounts, the watchdog that kills what a silent daemon left running, and the records a
//! run keeps on disk (`daemon_record`, `json_file`). The agent (`crate::agent`) decides; this
//! folder starts, watches and stops processes.

pub mod cgroup;
pub mod cgroup_devices;
pub mod daemon_record;
pub mod identity;
pub mod json_file;
pub mod launcher;
pub mod preflight;
pub mod process;
pub mod procfs;
pub mod pty;
pub mod shepherd;
pub mod spawner;
pub mod step;
pub mod step_stdin;
pub mod usage;
pub mod watchdog;
