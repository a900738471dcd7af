//! `corral bench`: its arguments, and which benchmark they pick: by default [`baseline`] (a
//! local 3-node cluster against this machine's fdatasync); `--history` ([`history`]),
//! `--nodes` ([`nodes`], simulated nodes), `--ui` ([`ui`], the web UI's server times) or
//! `--processes` ([`jobs`], against the Slurm peer)
//! instead. Each prints figures and asserts nothing about speed; [`stats`] and [`setup`] hold
//! what they share.

pub mod baseline;
pub mod history;
pub mod jobs;
pub mod nodes;
pub mod setup;
pub mod stats;
pub mod ui;

use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Sequential submissions from one client.
    #[arg(long, default_value_t = 300)]
    pub submits: usize,
    /// Submissions from 16 concurrent clients (in all; 256 clients submit at least 8 each).
    #[arg(long, default_value_t = 800)]
    pub concurrent_submits: usize,
    /// Submit-to-running samples.
    #[arg(long, default_value_t = 30)]
    pub latency_samples: usize,
    /// Leader SIGKILLs for the failover figures.
    #[arg(long, default_value_t = 10)]
    pub failovers: usize,
    /// SIGKILLs of the node of a --requeue job, timing until it runs again elsewhere.
    #[arg(long, default_value_t = 10)]
    pub requeue_kills: usize,
    /// Skip everything but the requeue measurement.
    #[arg(long)]
    pub only_requeue: bool,
    /// `srun` steps timed inside one 2-node batch job.
    #[arg(long, default_value_t = 30)]
    pub steps: usize,
    /// Skip everything but the step measurement.
    #[arg(long)]
    pub only_steps: bool,
    /// Hand-overs (SIGUSR2, then a new daemon) of the node of a running job, timing how long
    /// the node was silent to the leader against the lease it had.
    #[arg(long, default_value_t = 10)]
    pub handovers: usize,
    /// Skip everything but the hand-over measurement.
    #[arg(long)]
    pub only_handover: bool,
    /// Skip everything but the failover measurement.
    #[arg(long)]
    pub only_failover: bool,
    /// Stop after the submission figures (1 client, 16 and 256 concurrent ones).
    #[arg(long)]
    pub only_submits: bool,
    /// Keep the cluster directory here.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Instead of the rest: fill a cluster with this many finished jobs and measure submits,
    /// `sacct`, `squeue`, RSS, disk and a new voter's catch-up at 0, a tenth and all of them.
    #[arg(long)]
    pub history: Option<usize>,
    /// Instead of the rest: this many `sbatch --wrap true` processes, 16 at a time, over QUIC
    /// and over the node's socket, an array and a paced run (submissions/s, jobs completed/s,
    /// submit-to-running, host CPU per job), and the same on the Slurm peer with `--slurm-peer`.
    #[arg(long)]
    pub processes: Option<usize>,
    /// Tasks of the `--processes` bench's `sbatch --array` (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub array_tasks: usize,
    /// The Slurm peer's scripts (`shared/peers/slurm`): `--processes` measures it in the same run.
    #[arg(long)]
    pub slurm_peer: Option<PathBuf>,
    /// SchedulerParameters of the tuned Slurm run.
    #[arg(long, default_value = "batch_sched_delay=0,sched_min_interval=0")]
    pub slurm_tuned: String,
    /// Instead of the rest: a 3-voter cluster with this many simulated nodes (comma list, one
    /// cluster each): voter CPU and RSS at rest and with jobs running, detection and requeue
    /// of a silenced node, leader failovers; and the leader at rest with direct heartbeats.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<usize>,
    /// Jobs running during the `--nodes` busy figures.
    #[arg(long, default_value_t = 1_000)]
    pub nodes_jobs: usize,
    /// Silenced nodes timed per `--nodes` size.
    #[arg(long, default_value_t = 20)]
    pub nodes_detections: usize,
    /// Leader SIGKILLs per `--nodes` size.
    #[arg(long, default_value_t = 10)]
    pub nodes_failovers: usize,
    #[arg(long, default_value_t = 500)]
    pub nodes_heartbeat_interval_ms: u64,
    /// With 500 ms heartbeats, 4 s leaves nodes 2.1 s of lease (`fence_after_ms`): a leader
    /// failover (election and relays finding the new leader) fits in it.
    #[arg(long, default_value_t = 4_000)]
    pub nodes_down_after_ms: u64,
    /// Instead of the rest: the web UI's server times with NODES simulated nodes and JOBS jobs
    /// (`--ui 1000,10000`), against the REST API's jobs and nodes in the same run.
    #[arg(long, value_delimiter = ',', num_args = 1)]
    pub ui: Vec<usize>,
    /// Skip the peer run with direct heartbeats.
    #[arg(long)]
    pub nodes_no_direct_peer: bool,
    /// Also a peer run at rest with relayed heartbeats as one stream call each (as before
    /// datagrams).
    #[arg(long)]
    pub nodes_stream_peer: bool,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if let Some(finished) = args.history {
        return history::run(finished, args.dir.clone()).await;
    }
    if !args.nodes.is_empty() {
        let opts = nodes::NodesBench {
            sizes: args.nodes.clone(),
            jobs: args.nodes_jobs,
            detections: args.nodes_detections,
            failovers: args.nodes_failovers,
            heartbeat_interval_ms: args.nodes_heartbeat_interval_ms,
            node_down_after_ms: args.nodes_down_after_ms,
            direct_peer: !args.nodes_no_direct_peer,
            stream_peer: args.nodes_stream_peer,
        };
        return nodes::run(opts, args.dir.clone()).await;
    }
    if !args.ui.is_empty() {
        let [nodes, jobs] = args.ui[..] else { anyhow::bail!("--ui takes NODES,JOBS, e.g. --ui 1000,10000") };
        return ui::run(ui::UiBench { nodes, jobs }, args.dir.clone()).await;
    }
    if let Some(processes) = args.processes {
        let opts = jobs::JobsBench {
            processes,
            array_tasks: args.array_tasks,
            slurm_peer: args.slurm_peer.clone(),
            slurm_tuned: args.slurm_tuned.clone(),
        };
        return jobs::run(opts, args.dir.clone()).await;
    }
    baseline::run(&args).await
}
