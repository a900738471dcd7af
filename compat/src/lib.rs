//! Slurm compatibility that both the CLI and the node need: hostlist syntax and the environment
//! Slurm gives a job. Pure functions of their arguments: no clock, no IO, no process state.

pub mod acct;
pub mod env;
pub mod hostlist;
pub mod openapi;
pub mod show;
