//! The `corral` command line as a library: the client, the Slurm shims and their parsers, the
//! development cluster, benchmarks. It speaks `proto` over `transport` to any node and never
//! opens the Raft log or RocksDB. `main.rs` only dispatches; the fuzz targets (`fuzz/`) reach
//! the `#SBATCH` parser through here. `corral restd` (the REST API) serves from a node.

pub mod bench;
pub mod bench_history;
pub mod bench_jobs;
pub mod bench_nodes;
pub mod client;
pub mod cluster_admin;
pub mod commands;
pub mod demo;
pub mod dev;
pub mod nccl;
pub mod replay;
pub mod restd;
pub mod slurm;
pub mod units;
