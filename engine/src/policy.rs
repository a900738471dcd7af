//! What decides placements in a pass: Corral's scheduler in the product; `corral replay` also
//! plugs in models of other schedulers to compare them on the same trace and the same sequence.

use scheduler::{ClusterView, Plan};

/// A scheduling policy: one pass over the view at `now_ms`. It may keep memory between passes
/// (a model of a scheduler with periodic passes does), never a clock of its own.
pub trait Policy {
    fn schedule(&mut self, view: &ClusterView, now_ms: u64) -> Plan;

    /// When time alone next gives this policy something to do that the last pass did not
    /// (a periodic pass of its own), beyond what its plans' `wake_ms` say.
    fn wake_ms(&self) -> Option<u64> {
        None
    }
}

/// Corral's own scheduler (`scheduler::schedule`), stateless.
#[derive(Clone, Copy, Debug, Default)]
pub struct CorralPolicy;

impl Policy for CorralPolicy {
    fn schedule(&mut self, view: &ClusterView, now_ms: u64) -> Plan {
        scheduler::schedule(view, now_ms)
    }
}

impl Policy for Box<dyn Policy> {
    fn schedule(&mut self, view: &ClusterView, now_ms: u64) -> Plan {
        (**self).schedule(view, now_ms)
    }

    fn wake_ms(&self) -> Option<u64> {
        (**self).wake_ms()
    }
}
