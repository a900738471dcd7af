//! The control plane's decisions as pure functions of what the caller knows, with time passed
//! in as milliseconds: no IO, no clock, no async, no randomness. `node` (the daemon) carries
//! the decisions out; `chaos sim` drives these very functions under its simulated clock and
//! network, so the simulator's seeded runs check Corral's decisions and not a model of them.
//!
//! - [`agent`]: what a node's agent does with a launch or a stop, given its launch ledger and
//!   when a leader last acknowledged it; when it fences itself; the watchdog's deadline; and
//!   the agent's memory that corrald and the simulator keep: [`agent::Lease`], of its leader,
//!   and [`agent::Outbox`], the run reports no leader has taken yet.
//! - [`leader`]: which silent nodes the leader declares down, which parts it sends launches and
//!   stops to, when it re-sends them, when it promotes an agent to voter, and whether it has
//!   a scheduling pass to run.

pub mod agent;
pub mod leader;
