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
mod log;
pub mod metrics;
pub mod mig;
pub mod placement;
pub mod plot;
pub mod slurm;
pub mod timed;
pub mod trace;

pub use cluster::NodeSpec;
pub use engine::Policy;
pub use metrics::Report;
pub use trace::TraceJob;

/// The policies a replay compares, by the name `--policies` takes: Corral's scheduler as the
/// product runs it; Corral's with one backfill reservation only (EASY) or with reservations for
/// jobs that waited past SECONDS (`corral-reserve-after=SECONDS`) or for the first N jobs that
/// cannot start (`corral-reservations=N`), or placing by best fit on free GPUs rather than by
/// fragmentation (`corral-bestfit`); the Slurm 22.05 models.
pub const POLICIES: &[&str] = &[
    "corral",
    "corral-easy",
    "corral-reserve-after=SECONDS",
    "corral-reservations=N",
    "corral-bestfit",
    "slurm-22.05",
    "slurm-22.05-tuned",
];

/// Corral's scheduler with its settings changed as its function says.
struct CorralWith<F: Fn(&mut scheduler::SchedulerConfig)>(F);

impl<F: Fn(&mut scheduler::SchedulerConfig)> engine::Policy for CorralWith<F> {
    fn schedule(&mut self, view: &scheduler::ClusterView, now_ms: u64) -> scheduler::Plan {
        let mut view = view.clone();
        (self.0)(&mut view.config);
        scheduler::schedule(&view, now_ms)
    }
}

/// Corral's scheduler with MIG layouts kept as they are (never relaid for the demand), as a
/// cluster of static layouts runs.
pub fn corral_static_mig() -> Box<dyn engine::Policy> {
    Box::new(CorralWith(|c: &mut scheduler::SchedulerConfig| c.mig_layouts_per_pass_max = 0))
}

/// The policy named `name` for a placement experiment, which has no clock (each pod placed
/// by a pass of its own, FGD's method): the Slurm models run a pass at each submission, not
/// on slurmctld's background loop.
pub fn placement_policy(name: &str) -> anyhow::Result<Box<dyn engine::Policy>> {
    let timeless = |cfg: slurm::SlurmConfig| slurm::SlurmConfig { loop_ms: 0, ..cfg };
    Ok(match name {
        "slurm-22.05" => Box::new(slurm::SlurmModel::new(timeless(slurm::SlurmConfig::stock()))),
        "slurm-22.05-tuned" => Box::new(slurm::SlurmModel::new(timeless(slurm::SlurmConfig::tuned()))),
        other => policy(other)?,
    })
}

/// The policy named `name` (one of [`POLICIES`]).
pub fn policy(name: &str) -> anyhow::Result<Box<dyn engine::Policy>> {
    if let Some(secs) = name.strip_prefix("corral-reserve-after=") {
        let secs: u64 = secs.parse().map_err(|_| anyhow::anyhow!("corral-reserve-after= takes whole seconds, not '{secs}'"))?;
        let after_ms = secs.saturating_mul(1000);
        return Ok(Box::new(CorralWith(move |c: &mut scheduler::SchedulerConfig| c.reserve_after_wait_ms = after_ms)));
    }
    if let Some(n) = name.strip_prefix("corral-reservations=") {
        let n: u32 = n.parse().map_err(|_| anyhow::anyhow!("corral-reservations= takes a count, not '{n}'"))?;
        return Ok(Box::new(CorralWith(move |c: &mut scheduler::SchedulerConfig| c.reservation_depth = n.max(1))));
    }
    Ok(match name {
        "corral" => Box::new(engine::CorralPolicy),
        "corral-easy" => Box::new(CorralWith(|c: &mut scheduler::SchedulerConfig| {
            c.reserve_after_wait_ms = u64::MAX;
            c.reservation_depth = 1;
        })),
        "corral-bestfit" => Box::new(CorralWith(|c: &mut scheduler::SchedulerConfig| c.fragmentation_aware = false)),
        "slurm-22.05" => Box::new(slurm::SlurmModel::new(slurm::SlurmConfig::stock())),
        "slurm-22.05-tuned" => Box::new(slurm::SlurmModel::new(slurm::SlurmConfig::tuned())),
        other => anyhow::bail!("unknown policy '{other}': the policies are {}", POLICIES.join(", ")),
    })
}
