//! Issue 7 in CI: a short real-process chaos run on a fixed seed and one on a fresh seed (printed,
//! so a failure can be repeated), and a batch of the deterministic simulation.
//!
//! Longer runs: `CORRAL_CHAOS_LONG=1 cargo test --workspace --test chaos_short -- --nocapture`
//! runs 10 minutes of faults; or run the binary: `corral-chaos run --duration 10m --seed S`.

use std::time::Duration;

use chaos::runner::{self, Fault, RunOptions};
use chaos::sim::{self, SimConfig};

fn options(seed: u64, duration_ms: u64) -> RunOptions {
    let corral = corral_tests::corral_bin();
    RunOptions {
        nodes: 5,
        voters: 3,
        duration_ms,
        seed,
        faults: vec![Fault::Kill, Fault::Restart, Fault::Partition, Fault::Pause, Fault::SlowDisk, Fault::ClockSkew],
        dir: None,
        corral,
        keep: false,
        rig: None,
    }
}

fn run_and_report(opts: &RunOptions) -> runner::RunOutcome {
    println!("chaos run: {}", opts.repro());
    let outcome = runner::run(opts).unwrap_or_else(|e| panic!("chaos run did not complete: {e:#}\nreproduce: {}", opts.repro()));
    println!("{}", outcome.summary);
    outcome
}

/// Fails on any violation, printing the one line that repeats the run.
fn assert_clean(outcome: &runner::RunOutcome) {
    let new: Vec<&String> = outcome.violations.iter().collect();
    assert!(
        new.is_empty(),
        "{} violations:\n{}\nreproduce: {}",
        new.len(),
        new.iter().map(|v| v.as_str()).collect::<Vec<_>>().join("\n"),
        outcome.repro
    );
    assert!(outcome.final_states.len() > 10, "the workload ran: {:?}", outcome.final_states);
    assert!(outcome.final_states.values().all(|s| !matches!(s.as_str(), "PENDING" | "RUNNING" | "MISSING")), "{:?}", outcome.final_states);
    assert!(outcome.recovery_ms.is_some_and(|ms| ms < 30_000), "recovery: {:?}", outcome.recovery_ms);
}

#[test]
fn short_real_cluster_runs_keep_every_invariant() {
    let long = std::env::var("CORRAL_CHAOS_LONG").is_ok();
    let duration_ms = if long { 600_000 } else { 45_000 };
    let fixed = run_and_report(&options(20_241, duration_ms));
    assert!(!fixed.faults_injected.is_empty(), "faults were injected: {}", fixed.summary);
    assert_clean(&fixed);
    let fresh_seed = runner::now_ms() % 1_000_000_007;
    println!("fresh seed for this run: {fresh_seed}");
    let fresh = run_and_report(&options(fresh_seed, if long { duration_ms } else { 30_000 }));
    assert_clean(&fresh);
}

#[test]
fn simulated_runs_keep_every_invariant() {
    // The product's own decisions (`control`) under the simulated faults.
    let cfg = SimConfig { fault_phase_ms: 20_000, ..SimConfig::default() };
    let started = std::time::Instant::now();
    let sum = sim::run_many(100, 77, &cfg, |_| {});
    println!("sim: {} runs, {} jobs, {:?} faults in {:?}", sum.runs, sum.jobs, sum.faults, started.elapsed());
    assert_eq!(sum.runs, 100);
    assert!(sum.jobs > 500, "{sum:?}");
    let failures: Vec<String> = sum
        .failures
        .iter()
        .map(|r| format!("corral-chaos sim --runs 1 --seed {} --fault-phase-s 20 --trace: {:?}", r.seed, r.violations))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(started.elapsed() < Duration::from_secs(120));
}
