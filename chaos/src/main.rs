//! `corral-chaos`: fault injection against a real local cluster (`run`) and a deterministic
//! simulation of the state machine, scheduler and control loops (`sim`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};

use corral_chaos::runner::{self, Fault, RunOptions};
use corral_chaos::sim::{self, SimConfig};

#[derive(Parser)]
#[command(
    name = "corral-chaos",
    about = "Chaos testing for Corral: real processes (run), booted hosts (rig) and a seeded simulation (sim)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a local cluster, drive a workload, inject seeded faults, heal, verify the history.
    Run {
        #[arg(long, default_value_t = 5)]
        nodes: u32,
        #[arg(long, default_value_t = 3)]
        voters: u32,
        /// How long workload and faults go on (e.g. 120s, 2m, 90000ms).
        #[arg(long, default_value = "120s")]
        duration: String,
        /// Seed of the fault schedule and workload; the one line printed on failure repeats it.
        #[arg(long)]
        seed: Option<u64>,
        /// Comma list of kill,restart,partition,pause,slow-disk,clock-skew,upgrade.
        #[arg(long, default_value = "kill,restart,partition,pause,slow-disk,clock-skew,upgrade")]
        faults: String,
        /// Cluster directory (default: a new one under /tmp, kept on failure).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The `corral` binary (default: next to this one, then PATH).
        #[arg(long)]
        corral: Option<PathBuf>,
        /// Leave the cluster directory in place even when the run passes.
        #[arg(long)]
        keep: bool,
    },
    /// The same workload and checkers on booted hosts (`scripts/hosts.sh`: each host its own
    /// systemd and network stack, Corral installed by deploy/install.sh and run by systemd),
    /// with faults from outside the daemons. Needs root and what `scripts/hosts.sh setup`
    /// installs; the build installed is `scripts/hosts.sh`'s (CORRAL_BIN_DIR).
    Rig {
        /// Hosts to boot (h1..hN; the first three are voters).
        #[arg(long, default_value_t = 5)]
        hosts: u32,
        /// How long workload and faults go on (e.g. 30m).
        #[arg(long, default_value = "10m")]
        duration: String,
        /// Seed of the fault schedule and workload; the one line printed on failure repeats it.
        #[arg(long)]
        seed: Option<u64>,
        /// Comma list of the faults to draw from (fail-disk puts every host's data directory on
        /// a FUSE layer for the whole run).
        #[arg(
            long,
            default_value = "kill,restart,partition,pause,slow-disk,clock-skew,upgrade,crash,reboot,isolate,oneway,loss,latency,freeze,poweroff-all,fail-disk"
        )]
        faults: String,
        /// The rig's directory (a new one under the temporary directory if none).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The client run on this machine (`corral` beside this binary if none).
        #[arg(long)]
        corral: Option<PathBuf>,
        /// The rig's script (the source tree's scripts/hosts.sh if none).
        #[arg(long)]
        script: Option<PathBuf>,
        /// Leave the rig's directory in place even when the run passes.
        #[arg(long)]
        keep: bool,
    },
    /// Seeded simulation of ClusterState::apply + scheduler::schedule + leader and agent loops.
    Sim {
        #[arg(long, default_value_t = 2000)]
        runs: u64,
        #[arg(long)]
        seed: Option<u64>,
        /// Simulated seconds of workload and faults per run.
        #[arg(long, default_value_t = 40)]
        fault_phase_s: u64,
        /// Leave out pauses of corrald (SIGSTOP while its jobs keep running).
        #[arg(long)]
        no_pause: bool,
        /// Print the trace of the first failing run.
        #[arg(long)]
        trace: bool,
        /// Plant a bug in one of the product's decisions (it wraps the real function) to see the
        /// simulator catch it: stop-unstarted, launch-when-out-of-touch, stale-launch,
        /// stop-dead-instance, watchdog-never-kills, suspend-ignored, unordered-instances.
        #[arg(long, value_parser = parse_mutation)]
        mutate: Option<sim::Mutation>,
    },
}

/// What `run` and `rig` read alike from their flags.
struct Scenario {
    duration_ms: u64,
    seed: u64,
    faults: Vec<Fault>,
    corral: PathBuf,
}

impl Scenario {
    fn read(duration: &str, seed: Option<u64>, faults: &str, corral: Option<PathBuf>) -> anyhow::Result<Scenario> {
        let corral = match corral {
            Some(p) => p,
            None => runner::find_corral().context("find the corral binary")?,
        };
        Ok(Scenario {
            duration_ms: runner::parse_duration_ms(duration).context("read --duration")?,
            seed: seed.unwrap_or_else(time_seed),
            faults: Fault::parse_list(faults).context("read --faults")?,
            corral,
        })
    }
}

/// Runs the scenario and prints its summary, and its violations with the repro; whether it
/// found none.
fn report(opts: &RunOptions) -> anyhow::Result<bool> {
    let outcome = runner::run(opts).context("run the chaos scenario")?;
    println!("{}", outcome.summary);
    if outcome.violations.is_empty() {
        return Ok(true);
    }
    println!("VIOLATIONS ({}):", outcome.violations.len());
    for v in &outcome.violations {
        println!("  {v}");
    }
    println!("cluster dir and history kept in {}", outcome.dir.display());
    println!("reproduce: {}", outcome.repro);
    Ok(false)
}

fn time_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1) % 1_000_000_007
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result: anyhow::Result<bool> = match cli.cmd {
        Cmd::Run { nodes, voters, duration, seed, faults, dir, corral, keep } => (|| -> anyhow::Result<bool> {
            let Scenario { duration_ms, seed, faults, corral } = Scenario::read(&duration, seed, &faults, corral)?;
            report(&RunOptions { nodes, voters, duration_ms, seed, faults, dir, corral, keep, rig: None })
        })(),
        Cmd::Rig { hosts, duration, seed, faults, dir, corral, script, keep } => (|| -> anyhow::Result<bool> {
            let Scenario { duration_ms, seed, faults, corral } = Scenario::read(&duration, seed, &faults, corral)?;
            let script = script.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/hosts.sh"));
            report(&RunOptions { nodes: hosts, voters: hosts.min(3), duration_ms, seed, faults, dir, corral, keep, rig: Some(script) })
        })(),
        Cmd::Sim { runs, seed, fault_phase_s, no_pause, trace, mutate } => {
            {
                let seed = seed.unwrap_or_else(time_seed);
                let cfg =
                    SimConfig { fault_phase_ms: fault_phase_s * 1000, pause_faults: !no_pause, mutation: mutate, ..SimConfig::default() };
                let started = Instant::now();
                let sum = sim::run_many(runs, seed, &cfg, |_| {});
                let secs = started.elapsed().as_secs_f64();
                println!(
                    "sim: {} runs from seed {seed} in {secs:.1} s ({:.0} runs/min)",
                    sum.runs,
                    sum.runs as f64 * 60.0 / secs.max(1e-3)
                );
                println!("  simulated steps     {}", sum.steps);
                println!("  commands applied    {}", sum.commands);
                println!("  jobs acknowledged   {}", sum.jobs);
                println!("  requeued runs       {}", sum.requeued_runs);
                println!("  repairs             {}", sum.repairs);
                println!(
                    "  registrations       {} ({} refused: an instance started later was up)",
                    sum.registrations, sum.registrations_refused
                );
                println!("  suspends, resumes   {}", sum.suspensions);
                println!("  final states        {:?}", sum.final_states);
                println!("  faults              {:?}", sum.faults);
                println!("  failed runs         {}", sum.failed_runs);
                for r in &sum.failures {
                    println!("  seed {}: {}", r.seed, r.violations.join("; "));
                }
                if let (true, Some(first)) = (trace, sum.failures.first()) {
                    // Run the failing seed again with its trace kept; show the events of the jobs
                    // and nodes its first violation names, and every fault.
                    let again = sim::run_one(first.seed, &SimConfig { keep_trace: true, ..cfg.clone() });
                    let words: Vec<String> = again.violations.first().map(|v| sim::trace_keys(v)).unwrap_or_default();
                    println!("events of seed {} about {words:?}:", first.seed);
                    for line in again
                        .trace
                        .iter()
                        .filter(|l| l.contains("fault") || l.contains("VIOLATION") || words.iter().any(|w| l.contains(w.as_str())))
                    {
                        println!("    {line}");
                    }
                }
                if let Some(first) = sum.failures.first() {
                    let p = format!(
                        "{}{}",
                        if no_pause { " --no-pause" } else { "" },
                        mutate.map(|m| format!(" --mutate {}", m.name())).unwrap_or_default()
                    );
                    println!("reproduce: corral-chaos sim --runs 1 --seed {} --fault-phase-s {fault_phase_s}{p} --trace", first.seed);
                }
                Ok(sum.failed_runs == 0)
            }
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("corral-chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn parse_mutation(name: &str) -> Result<sim::Mutation, String> {
    sim::Mutation::parse(name).ok_or_else(|| {
        let names: Vec<&str> = sim::Mutation::ALL.iter().map(|(n, _)| *n).collect();
        format!("unknown mutation {name:?}; one of {}", names.join(", "))
    })
}
