//! `corrald`: the one daemon every node runs. Only wiring: parse flags, load config, run.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(name = "corrald", version, about = "Corral node daemon")]
struct Args {
    /// Node configuration file (TOML).
    #[arg(long, short)]
    config: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn,quinn=warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = corral_node::config::NodeConfig::load(&args.config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start async runtime")?;
    let result = runtime.block_on(corral_node::server::run(config));
    if let Err(e) = &result {
        tracing::error!(error = format!("{e:#}"), "corrald stopped");
    }
    result
}
