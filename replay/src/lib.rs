//! `corral replay`: a job trace replayed in simulated time through the leader's own engine
//! (`engine::Leader`: the pass sequence corrald runs), the state machine (`corral_state`) and a
//! scheduling policy: Corral's scheduler, or a model of another scheduler (`slurm`) for a
//! side-by-side on the same trace. Agents start every launch at once and end each run at its
//! trace duration (or its time limit). `placement` replays a pod list FGD's way (no time, no
//! departures) through the same engine.
//!
//! Invariant: deterministic for a trace, an inventory, a policy and a seed; no IO but reading
//! the trace files the caller names; no wall clock inside a replay.

pub mod cluster;
pub mod metrics;
pub mod placement;
pub mod plot;
pub mod slurm;
pub mod timed;
pub mod trace;

pub use cluster::NodeSpec;
pub use metrics::Report;
pub use trace::TraceJob;

/// The policies a replay compares, by the name `--policies` takes: Corral's scheduler as the
/// product runs it; Corral's with one backfill reservation only (EASY) or with reservations for
/// jobs that waited past SECONDS (`corral-reserve-after=SECONDS`); the Slurm 22.05 models.
pub const POLICIES: &[&str] = &["corral", "corral-easy", "corral-reserve-after=SECONDS", "slurm-22.05", "slurm-22.05-tuned"];

/// Corral's scheduler with one setting of the view changed.
struct CorralWith {
    reserve_after_wait_ms: u64,
}

impl engine::Policy for CorralWith {
    fn schedule(&mut self, view: &scheduler::ClusterView, now_ms: u64) -> scheduler::Plan {
        let mut view = view.clone();
        view.config.reserve_after_wait_ms = self.reserve_after_wait_ms;
        scheduler::schedule(&view, now_ms)
    }
}

/// The policy named `name` (one of [`POLICIES`]).
pub fn policy(name: &str) -> anyhow::Result<Box<dyn engine::Policy>> {
    if let Some(secs) = name.strip_prefix("corral-reserve-after=") {
        let secs: u64 = secs.parse().map_err(|_| anyhow::anyhow!("corral-reserve-after= takes whole seconds, not '{secs}'"))?;
        return Ok(Box::new(CorralWith { reserve_after_wait_ms: secs.saturating_mul(1000) }));
    }
    Ok(match name {
        "corral" => Box::new(engine::CorralPolicy),
        "corral-easy" => Box::new(CorralWith { reserve_after_wait_ms: u64::MAX }),
        "slurm-22.05" => Box::new(slurm::SlurmModel::new(slurm::SlurmConfig::stock())),
        "slurm-22.05-tuned" => Box::new(slurm::SlurmModel::new(slurm::SlurmConfig::tuned())),
        other => anyhow::bail!("unknown policy '{other}': the policies are {}", POLICIES.join(", ")),
    })
}
