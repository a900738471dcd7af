//! `corral`: the command-line client. It speaks to any node over QUIC with a client
//! certificate; it never opens the Raft log or RocksDB.

use corral_cli::commands::{self, MigCmd, PolicyCmd, SubmitArgs};
use corral_cli::tools::{bench, demo, dev, replay};
use corral_cli::{client, cluster_admin, nccl, restd, slurm};

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use proto::{ClientRequest, Reply};
use serde_json::json;

use crate::client::Cluster;

#[derive(Parser)]
#[command(name = "corral", version, about = "Corral GPU cluster scheduler")]
struct Cli {
    /// Cluster directory holding client.toml (default $CORRAL_CLUSTER or /etc/corral).
    #[arg(long, global = true)]
    cluster: Option<PathBuf>,
    /// Ask this node (HOST:PORT) instead of those in client.toml.
    #[arg(long, global = true)]
    server: Option<String>,
    /// Ask the local node over its Unix socket (default $CORRAL_SOCKET; used on a node that has
    /// /run/corral/corral.sock and no client.toml): the node learns who you are from the kernel.
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// Print JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Submit a job: a script file, or a command after `--`.
    Submit(SubmitArgs),
    /// Jobs that are pending or running (`--all` for finished ones too).
    Queue {
        #[arg(long)]
        all: bool,
    },
    /// One job in full.
    Show { job: u64 },
    /// Cancel a job; a running job is killed (SIGTERM, then SIGKILL).
    Cancel { job: u64 },
    /// Wait for a job to end and exit with its exit code (124 on timeout).
    Wait {
        job: u64,
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// A job's output, from whichever node ran it.
    Logs {
        job: u64,
        #[arg(short, long)]
        follow: bool,
        #[arg(long)]
        stderr: bool,
    },
    /// Nodes with their state, role and GPUs.
    Nodes,
    /// Members, roles, leader, term and last committed index; with a subcommand, set up a
    /// cluster on real machines (init, join, issue-node, issue-client, token).
    Cluster {
        #[command(subcommand)]
        admin: Option<cluster_admin::ClusterCmd>,
    },
    /// The scheduling policy: partitions (time limits, priority tiers) and QoS (priority,
    /// preemption). `show` prints it as TOML; `set FILE` replaces it.
    Policy {
        #[command(subcommand)]
        action: PolicyCmd,
    },
    /// MIG layouts: `set NODE GPU PROFILES|auto` pins a GPU's (admin), `show [NODE]` lists them.
    Mig {
        #[command(subcommand)]
        action: MigCmd,
    },
    /// Mark a GPU healthy again (after a repair), or unhealthy by hand.
    GpuHealth {
        node: String,
        gpu: u32,
        #[arg(long, conflicts_with = "unhealthy")]
        healthy: bool,
        #[arg(long)]
        unhealthy: bool,
        #[arg(long, default_value = "set by operator")]
        reason: String,
    },
    /// Bandwidth test across an N-node allocation; flags node pairs far below the rest.
    NcclCheck {
        #[arg(long, default_value_t = 2)]
        nodes: u32,
        #[arg(long)]
        gres: Option<String>,
        /// Bytes each rank streams to rank 0.
        #[arg(long, default_value_t = 256 << 20)]
        bytes: u64,
        /// How node pairs are measured: torch when it imports (auto), torch, or tcp.
        #[arg(long, value_enum, default_value_t = nccl::Method::Auto)]
        method: nccl::Method,
    },
    /// Inside an nccl-check job: stream to or measure from rank 0.
    #[command(hide = true)]
    NcclProbe {
        #[arg(long)]
        bytes: u64,
        #[arg(long, value_enum, default_value_t = nccl::Method::Auto)]
        method: nccl::Method,
    },
    /// Queue a job again, as `scontrol requeue` does: a running one is stopped first (SIGTERM,
    /// then SIGKILL after kill_grace_ms; a job requeued by the cluster gets its --signal first
    /// instead); a finished one not yet aged into history (min_job_age_s) runs again.
    Requeue { job: u64 },
    /// Stop placing new jobs on a node.
    Drain {
        node: String,
        #[arg(long, default_value = "drained by operator")]
        reason: String,
    },
    /// Place jobs on a drained node again.
    Resume { node: String },
    /// A local cluster of corrald processes for development.
    #[command(subcommand)]
    Dev(DevCmd),
    /// Start a 3-node cluster, run real jobs, kill the leader midway, show that nothing was lost.
    Demo {
        /// Keep the cluster directory (default: a temporary one, removed at the end).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Benchmark a local 3-node cluster: submit throughput, submit-to-running latency, failover.
    Bench(bench::BenchArgs),
    /// Replay a job trace in simulated time through the leader's own engine under each policy
    /// (Corral's scheduler, a Slurm 22.05 model) and print scheduling-quality figures.
    #[command(subcommand)]
    Replay(replay::ReplayCmd),
    /// Create sbatch, srun, salloc, squeue, scancel, sinfo, scontrol, sacct, sacctmgr, sshare, sprio and sstat in DIR as symlinks to
    /// this binary, which then behaves as those Slurm commands.
    InstallSlurmShims { dir: PathBuf },
    /// Serve Slurm's REST API (slurmrestd's openapi/v0.0.38 job and node endpoints) over HTTPS
    /// from this node, as root: clients show a user certificate of the cluster CA and act as that
    /// user; the node is reached through its local socket.
    Restd {
        /// The node's node.toml (its certificate, key, CA and socket).
        #[arg(long, default_value = "/etc/corral/node.toml")]
        node_config: PathBuf,
        #[arg(long, default_value = restd::DEFAULT_LISTEN)]
        listen: std::net::SocketAddr,
    },
}

#[derive(Subcommand)]
enum DevCmd {
    /// Start N nodes on 127.0.0.1 (or restart a stopped cluster, or add nodes to it).
    Up {
        #[arg(long)]
        dir: PathBuf,
        #[command(flatten)]
        opts: dev::DevOptions,
    },
    /// Stop every node of the cluster.
    Down {
        #[arg(long)]
        dir: PathBuf,
    },
    /// Send a signal (KILL, TERM, STOP, CONT, or USR2: hand the runs over and exit) to one node's corrald.
    Signal {
        #[arg(long)]
        dir: PathBuf,
        node: String,
        #[arg(default_value = "KILL")]
        signal: String,
    },
    /// Start one stopped node again.
    Start {
        #[arg(long)]
        dir: PathBuf,
        node: String,
    },
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let connect = || Cluster::open(cli.cluster.as_ref(), cli.server.as_deref(), cli.socket.as_ref());
    let patience = Duration::from_secs(10);
    match cli.command {
        Cmd::Submit(args) => {
            let spec = commands::build_spec(&args)?;
            let cluster = connect()?;
            match cluster.call_patiently(ClientRequest::Submit { spec }, patience).await? {
                Reply::Submitted { job } => {
                    if cli.json {
                        println!("{}", json!({ "job_id": job }));
                    } else {
                        println!("{job}");
                    }
                }
                other => bail!("unexpected reply {other:?}"),
            }
        }
        Cmd::Queue { all } => {
            let cluster = connect()?;
            let names = commands::node_names(&cluster).await?;
            // --all pages through the accounting store too.
            let query = proto::JobQuery { live: true, finished: all, history: all, brief: true, ..Default::default() };
            let jobs = cluster.query_jobs(query, patience).await?;
            commands::print_queue(&jobs, &names, cli.json);
        }
        Cmd::Show { job } => {
            let cluster = connect()?;
            let names = commands::node_names(&cluster).await?;
            let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job }, patience).await? else { bail!("unexpected reply") };
            commands::print_job(&j, &names, cli.json);
        }
        Cmd::Cancel { job } => {
            connect()?.call_patiently(ClientRequest::Cancel { job }, patience).await?;
            if cli.json {
                println!("{}", json!({ "job_id": job, "cancelled": true }));
            }
        }
        Cmd::Wait { job, timeout } => return commands::wait_exit_code(&connect()?, job, timeout, cli.json).await,
        Cmd::Logs { job, follow, stderr } => {
            let cluster = connect()?;
            commands::follow_logs(&cluster, job, stderr, follow, patience).await?;
        }
        Cmd::Nodes => commands::nodes(&connect()?, cli.json, patience).await?,
        // deploy (issue 8): cluster set-up subcommands.
        Cmd::Cluster { admin: Some(admin) } => cluster_admin::run(admin, cli.server.as_deref(), cli.json, &connect).await?,
        Cmd::Cluster { admin: None } => commands::cluster_info(&connect()?, cli.json, patience).await?,
        Cmd::Policy { action } => commands::policy(&connect()?, action, cli.json, patience).await?,
        Cmd::Mig { action } => commands::mig(&connect()?, action, cli.json, patience).await?,
        Cmd::GpuHealth { node, gpu, healthy, unhealthy, reason } => {
            if healthy == unhealthy {
                bail!("say --healthy or --unhealthy");
            }
            connect()?.call_patiently(ClientRequest::SetGpuHealth { node, gpu, healthy, reason }, patience).await?;
        }
        Cmd::NcclCheck { nodes, gres, bytes, method } => {
            let cluster = connect()?;
            return nccl::check(&cluster, nodes, gres, bytes, method, cli.json).await;
        }
        Cmd::NcclProbe { bytes, method } => {
            tokio::task::spawn_blocking(move || nccl::probe(bytes, method)).await.context("run the probe")??;
        }
        Cmd::Requeue { job } => {
            connect()?.call_patiently(ClientRequest::Requeue { job }, patience).await?;
        }
        Cmd::Drain { node, reason } => {
            connect()?.call_patiently(ClientRequest::Drain { node, reason }, patience).await?;
        }
        Cmd::Resume { node } => {
            connect()?.call_patiently(ClientRequest::Resume { node }, patience).await?;
        }
        Cmd::Dev(DevCmd::Up { dir, opts }) => {
            dev::up(&dir, &opts).await?;
            println!("cluster of {} nodes is up in {}; use --cluster {}", opts.nodes, dir.display(), dir.display());
            for (name, url) in dev::metrics_urls(&dir)? {
                println!("{name} metrics: {url}");
            }
        }
        Cmd::Dev(DevCmd::Down { dir }) => dev::down(&dir)?,
        Cmd::Dev(DevCmd::Signal { dir, node, signal }) => dev::signal_node(&dir, &node, &signal)?,
        Cmd::Dev(DevCmd::Start { dir, node }) => {
            dev::start_one(&dir, &node)?;
        }
        Cmd::Demo { dir } => demo::run(dir).await?,
        Cmd::Bench(args) => bench::run(args).await?,
        Cmd::Replay(cmd) => replay::run(cmd, cli.json)?,
        Cmd::Restd { node_config, listen } => restd::run(&node_config, listen).await?,
        Cmd::InstallSlurmShims { dir } => {
            let exe = std::env::current_exe().context("find the corral binary")?;
            for link in slurm::install_shims(&dir, &exe)? {
                println!("{} -> {}", link.display(), exe.display());
            }
        }
    }
    Ok(0)
}

fn main() {
    // A closed stdout (`corral cluster | head`, `squeue | head -1`) ends the process quietly, as
    // it ends `ls` or Slurm's own commands: Rust ignores SIGPIPE, so each print would panic.
    // SAFETY: no other thread exists yet; this restores the signal's default disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    // Called as sbatch, srun, ... (a symlink made by `install-slurm-shims`): behave as Slurm.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = std::path::Path::new(&argv0).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if slurm::COMMANDS.contains(&name.as_str()) || slurm::JOB_COMMANDS.contains(&name.as_str()) {
        let args = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
        std::process::exit(slurm::main(&name, args));
    }
    // `corral slurm srun ...`: the same, without a link named after the command.
    let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    if let [first, command, rest @ ..] = args.as_slice() {
        if first == "slurm" && slurm::COMMANDS.contains(&command.as_str()) {
            std::process::exit(slurm::main(command, rest.to_vec()));
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("CORRAL_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("corral: start async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("corral: {e:#}");
            1
        }
    };
    std::process::exit(code);
}
