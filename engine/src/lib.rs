//! The leader's control engine: which of `control`'s and the scheduler's decisions run, in what
//! order, and what each result asks for, as types fed the applied state and the time and
//! returning commands to propose and orders to send (openraft's `Engine` pattern). `corrald`
//! carries their output out over Raft and QUIC, `corral-chaos sim` under a simulated clock and
//! network, `corral replay` under a trace's clock with agents that start at once: all three run
//! this sequence ([`TICK`]), none keeps a copy of it.
//!
//! Invariant: no IO, no clock, no randomness, no tokio. Time comes in as milliseconds.

pub mod archive;
pub mod layouts;
pub mod leader;
pub mod liveness;
pub mod memory;
pub mod policy;
#[cfg(test)]
mod testing;
pub mod wall;

pub use archive::{ArchiveStep, Archiver, Retention};
pub use layouts::{LayoutsAsked, LAYOUT_WAIT_MS};
pub use leader::{Leader, Pass, StateReader};
pub use liveness::{Beat, Downs, Held, Liveness, Now, VoterLimits};
pub use memory::{Memory, Suspensions};
pub use policy::{CorralPolicy, Policy};
pub use wall::{WallLimits, WALL_CHECK_INTERVAL_MS};

/// One step of a leader's tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Declare silent nodes down ([`Liveness::check`]); their jobs are requeued by the state.
    Liveness,
    /// End the running jobs whose association's or QoS's `GrpWall` is used up
    /// ([`WallLimits::due`]).
    WallLimits,
    /// Move finished jobs to the accounting store and prune old records ([`Archiver::due`]).
    Archive,
    /// A scheduling pass when one is due ([`Leader::schedule_pass`]): preemptions, then the plan.
    Schedule,
    /// Send the launches and stops due ([`Leader::orders`]).
    Orders,
    /// Send the suspensions and resumptions due ([`Suspensions::due`]).
    Suspensions,
    /// Promote or replace a voter ([`Liveness::voter_change`]), one change at a time.
    Voters,
}

/// The steps of one leader tick, in the order every driver runs them:
/// - liveness first, so the jobs of a node declared down are requeued and placed again in the
///   same tick, and no pass places work on a node about to be declared down;
/// - wall limits next, so a job they end is stopped by the same tick's orders;
/// - archiving before the pass, so the pass reads a smaller state;
/// - the pass before the orders, so a plan's launches go out in the tick that made it;
/// - voters last: a membership change is slow and runs beside the next ticks.
pub const TICK: [Step; 7] =
    [Step::Liveness, Step::WallLimits, Step::Archive, Step::Schedule, Step::Orders, Step::Suspensions, Step::Voters];
