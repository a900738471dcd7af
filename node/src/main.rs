//! `corrald`: the one daemon every node runs. Only wiring: parse flags, load config, run.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(name = "corrald", version, about = "Corral node daemon")]
struct Args {
    /// Node configuration file (TOML).
    #[arg(long, short, required_unless_present_any = ["watchdog", "hold", "shepherd", "sim_nodes"])]
    config: Option<PathBuf>,
    /// Run as the node's watchdog over this lease file (started by corrald itself).
    #[arg(long, hide = true)]
    watchdog: Option<PathBuf>,
    /// Hold a batch job's node for its steps until killed (started by corrald itself).
    #[arg(long, hide = true)]
    hold: bool,
    /// Shepherd the run whose directory this is (started by corrald itself).
    #[arg(long, hide = true)]
    shepherd: Option<PathBuf>,
    /// Run this many simulated nodes (no processes) against the cluster of the node whose
    /// `node.toml` is `--sim-config`, with certificates from the CA in `--sim-ca-dir`
    /// (`ca.crt`, `ca.key`): the load generator of `corral bench --nodes`.
    #[arg(long, hide = true, requires_all = ["sim_config", "sim_ca_dir"])]
    sim_nodes: Option<usize>,
    #[arg(long, hide = true)]
    sim_config: Option<PathBuf>,
    #[arg(long, hide = true)]
    sim_ca_dir: Option<PathBuf>,
    /// Names of the simulated nodes: PREFIX1, PREFIX2, ...
    #[arg(long, hide = true, default_value = "sim")]
    sim_prefix: String,
    /// Simulated nodes heartbeat the leader directly (no relay), for comparison.
    #[arg(long, hide = true)]
    sim_direct_to_leader: bool,
    /// Simulated nodes heartbeat by stream calls, not datagrams, for comparison.
    #[arg(long, hide = true)]
    sim_stream_heartbeats: bool,
}

/// The exit status of a daemon that handed its runs over (EX_TEMPFAIL): systemd restarts it
/// (`RestartForceExitStatus=75` in the unit), and the new daemon takes the runs over.
const HANDED_OVER_EXIT: i32 = 75;

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some(corral_node::run::launcher::HOLD_FLAG) {
        corral_node::run::launcher::hold_forever();
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn,quinn=warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(lease) = &args.watchdog {
        return corral_node::run::watchdog::run(lease);
    }
    if let Some(dir) = &args.shepherd {
        return corral_node::run::shepherd::run(dir);
    }
    if let (Some(count), Some(config), Some(ca)) = (args.sim_nodes, &args.sim_config, &args.sim_ca_dir) {
        return corral_node::simnodes::run(corral_node::simnodes::SimOptions {
            node_config: config.clone(),
            ca_cert: ca.join("ca.crt"),
            ca_key: ca.join("ca.key"),
            count,
            prefix: args.sim_prefix.clone(),
            direct_to_leader: args.sim_direct_to_leader,
            stream_heartbeats: args.sim_stream_heartbeats,
        });
    }
    let config_path = args.config.context("--config is required")?;
    let config = corral_node::config::NodeConfig::load(&config_path)?;
    // The watchdog kills the jobs' processes when this process dies (it polls for its parent).
    for dir in [config.jobs_dir(), config.runtime_dir()] {
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let exe = std::env::current_exe().context("find the corrald executable")?;
    let _watchdog = corral_node::run::watchdog::spawn(&exe, config.lease_path())?;
    // Forked now, while this process is small and has one thread: it forks each run's shepherd.
    let spawner = match corral_node::run::spawner::start(corral_node::run::shepherd::run_trusting) {
        Ok(s) => Some(std::sync::Arc::new(s)),
        Err(e) => {
            tracing::warn!(error = format!("{e:#}"), "no spawner: each run's shepherd is exec'd");
            None
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start async runtime")?;
    // SIGTERM (`systemctl stop`) tells systemd STOPPING=1 and stops the node gracefully: its jobs
    // get SIGTERM, their grace and SIGKILL, and are reported lost to the node (a `--requeue` job
    // is queued again at once). A second SIGTERM, or the deadline, ends it at once; the jobs then
    // die with it (their shepherds and the watchdog kill them) and the cluster ends them when the
    // node is declared down.
    // SIGUSR2 (a rolling upgrade) hands the runs over and exits with HANDED_OVER_EXIT at once:
    // the jobs go on, and the next daemon started before the lease runs out takes them over.
    use corral_node::server::{Ended, StopRequest};
    let deadline = std::time::Duration::from_millis(
        config.kill_grace_ms + corral_node::server::STOP_REPORT_MS + corral_node::server::STOP_DECLARE_MS + 1_000,
    );
    let result = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("handle SIGTERM")?;
        let mut usr2 = signal(SignalKind::user_defined2()).context("handle SIGUSR2")?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(StopRequest::None);
        let node = corral_node::server::run(config, stop_rx, spawner);
        tokio::pin!(node);
        tokio::select! {
            result = &mut node => return result,
            _ = term.recv() => {
                tracing::info!("SIGTERM: stopping");
                corral_node::systemd::notify("STOPPING=1");
                let _ = stop_tx.send(StopRequest::Stop);
            }
            _ = usr2.recv() => {
                tracing::info!("SIGUSR2: handing the runs over to the next corrald");
                let _ = stop_tx.send(StopRequest::HandOver);
            }
        }
        tokio::select! {
            result = &mut node => result,
            _ = term.recv() => {
                tracing::warn!("second SIGTERM: stopping now");
                Ok(Ended::Stopped)
            }
            _ = tokio::time::sleep(deadline) => {
                tracing::warn!(deadline_ms = deadline.as_millis() as u64, "graceful stop took too long: stopping now");
                Ok(Ended::Stopped)
            }
        }
    });
    if let Ok(Ended::HandedOver) = result {
        tracing::info!(exit = HANDED_OVER_EXIT, "runs handed over: exiting for the next corrald");
        // Nothing more may run here: no destructor, no runtime shutdown that could stop a job.
        std::process::exit(HANDED_OVER_EXIT);
    }
    let result = result.map(|_| ());
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    if let Err(e) = &result {
        tracing::error!(error = format!("{e:#}"), "corrald stopped");
    }
    result
}
