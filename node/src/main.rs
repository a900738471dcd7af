//! `corrald`: the one daemon every node runs. Only wiring: parse flags, load config, run.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(name = "corrald", version, about = "Corral node daemon")]
struct Args {
    /// Node configuration file (TOML).
    #[arg(long, short, required_unless_present = "watchdog")]
    config: Option<PathBuf>,
    /// Run as the node's watchdog over this lease file (started by corrald itself).
    #[arg(long, hide = true)]
    watchdog: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn,quinn=warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Some(lease) = &args.watchdog {
        return corral_node::watchdog::run(lease);
    }
    let config_path = args.config.context("--config is required")?;
    let config = corral_node::config::NodeConfig::load(&config_path)?;
    // From the main thread, which lives as long as the process: the watchdog's parent-death
    // signal follows the thread that started it.
    std::fs::create_dir_all(config.jobs_dir()).with_context(|| format!("create {}", config.jobs_dir().display()))?;
    let exe = std::env::current_exe().context("find the corrald executable")?;
    let _watchdog = corral_node::watchdog::spawn(&exe, config.lease_path())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start async runtime")?;
    // deploy (issue 8): SIGTERM (`systemctl stop`) tells systemd STOPPING=1 and ends the node
    // like a crash would: its jobs die with it (parent-death signal) and the cluster ends their
    // parts when it notices. Everything committed is already on disk.
    let result = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).context("handle SIGTERM")?;
        tokio::select! {
            result = corral_node::server::run(config) => result,
            _ = term.recv() => {
                tracing::info!("SIGTERM: stopping");
                corral_node::systemd::notify("STOPPING=1");
                Ok(())
            }
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    if let Err(e) = &result {
        tracing::error!(error = format!("{e:#}"), "corrald stopped");
    }
    result
}
