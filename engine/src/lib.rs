//! The leader's control engine: which of `control`'s and the scheduler's decisions run, in what
//! order, and what each result asks for, as one type fed the applied state and the time and
//! returning commands to propose and orders to send (openraft's `Engine` pattern). `corrald`
//! carries its output out over Raft and QUIC, `corral-chaos sim` under a simulated clock and
//! network, `corral replay` under a trace's clock with agents that start at once: all three run
//! this sequence, none keeps a copy of it.
//!
//! Invariant: no IO, no clock, no randomness, no tokio. Time comes in as milliseconds.

pub mod leader;
pub mod policy;

pub use leader::{Leader, Pass, StateReader};
pub use policy::{CorralPolicy, Policy};
