//! The developer and benchmark commands of `corral`, not the client: `dev up/down/signal/start`
//! (a local cluster of real `corrald` processes on 127.0.0.1, which tests and the others build
//! on), `demo`, `bench` (with the simulated nodes of `corrald --sim-nodes` behind `--nodes`) and
//! `replay` (a job trace through the leader's engine in simulated time). The client and the
//! Slurm shims never depend on this module; it depends on them.

pub mod bench;
pub mod demo;
pub mod dev;
pub mod replay;
