//! The `corral` command line as a library: the client (`client`, `commands`, `cluster_admin`,
//! `nccl`), the Slurm shims and their parsers (`slurm`), Slurm's REST API (`restd`, served from
//! a node), and the developer and benchmark commands (`tools`: the development cluster, the
//! demo, benchmarks, trace replay). It speaks `proto` over `transport` to any node and never
//! opens the Raft log or RocksDB. `main.rs` only dispatches; the fuzz targets (`fuzz/`) reach
//! the `#SBATCH` parser through here.

pub mod client;
pub mod cluster_admin;
pub mod commands;
pub mod nccl;
pub mod restd;
pub mod slurm;
pub mod tools;
pub mod units;

/// The development cluster at its former path: the workspace's tests start clusters through
/// `corral_cli::dev` (`free_listen_port`).
pub use tools::dev;
