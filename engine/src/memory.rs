//! What a leader remembers for the term it leads, one value for every step of [`crate::TICK`]:
//! corrald keeps one per term beside its IO state (node/src/server/leader.rs), `corral-chaos
//! sim` one per simulated leader. A new leader starts a new one, so every node gets a fresh
//! grace period and every order is sent again once.

use control::leader::{due_suspends, Resend, SendKey, SuspendAcks, SuspendOrder};
use corral_state::ClusterState;
use proto::{JobId, NodeId};

use crate::{Archiver, Leader, Liveness, WallLimits};

/// The memory of one term: each field serves one step of [`crate::TICK`].
pub struct Memory {
    /// [`crate::Step::Liveness`] and [`crate::Step::Voters`]. Apart from `leader`: heartbeats
    /// are recorded while a pass has the `Leader` out.
    pub liveness: Liveness,
    /// [`crate::Step::WallLimits`].
    pub wall_limits: WallLimits,
    /// [`crate::Step::Archive`].
    pub archiver: Archiver,
    /// [`crate::Step::Schedule`] and [`crate::Step::Orders`].
    pub leader: Leader,
    /// [`crate::Step::Suspensions`].
    pub suspensions: Suspensions,
}

impl Memory {
    /// The memory of a term that began at `since_ms`, in which every node of `nodes` counts as
    /// heard then; orders unanswered after `resend_after_ms` are sent again.
    pub fn new(since_ms: u64, down_after_ms: u64, resend_after_ms: u64, nodes: impl IntoIterator<Item = NodeId>) -> Memory {
        Memory {
            liveness: Liveness::new(since_ms, down_after_ms, nodes),
            wall_limits: WallLimits::default(),
            archiver: Archiver::default(),
            leader: Leader::new(resend_after_ms),
            suspensions: Suspensions::new(resend_after_ms),
        }
    }
}

/// The suspension orders a leader sent, and those the nodes acknowledged.
pub struct Suspensions {
    sent: Resend<SendKey>,
    acked: SuspendAcks,
}

impl Suspensions {
    pub fn new(resend_after_ms: u64) -> Suspensions {
        Suspensions { sent: Resend::new(resend_after_ms), acked: SuspendAcks::new() }
    }

    /// The orders due at `now_ms` (`control::leader::due_suspends`), each counted as sent.
    pub fn due(&mut self, state: &ClusterState, now_ms: u64) -> Vec<(JobId, SuspendOrder)> {
        let instance_of = |n: NodeId| state.nodes.get(&n).map(|r| r.instance);
        due_suspends(state.jobs_holding_parts(), &mut self.acked, &mut self.sent, instance_of, now_ms)
    }

    /// The node of `order` carried it out for `job`: it is not sent again to that instance.
    pub fn acknowledged(&mut self, job: JobId, order: &SuspendOrder) {
        self.acked.insert((job, order.run, order.node), (order.change, order.instance));
    }
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, JobSpec};

    use super::Suspensions;

    #[test]
    fn a_suspension_is_sent_until_the_node_acknowledges_it_and_once_by_a_new_leader() {
        let mut s = corral_state::ClusterState::default();
        crate::testing::node(&mut s);
        let job = crate::testing::running(&mut s, JobSpec::command(vec!["sleep".into()], "/", "u"), 0);
        let mut sus = Suspensions::new(1_000);
        assert!(sus.due(&s, 10).is_empty(), "never suspended");
        assert_eq!(s.apply(&Command::Suspend { job, suspend: true, now_ms: 20 }), CommandResult::Ok);
        let first = sus.due(&s, 30);
        assert_eq!(first.len(), 1);
        let (id, order) = first[0];
        assert_eq!((id, order.node, order.suspend, order.instance), (job, 1, true, crate::testing::INSTANCE));
        assert!(sus.due(&s, 500).is_empty(), "sent within the re-send period");
        assert_eq!(sus.due(&s, 1_030).len(), 1, "unanswered: sent again");
        sus.acknowledged(job, &order);
        assert!(sus.due(&s, 5_000).is_empty(), "acknowledged by this instance");
        let mut next_term = Suspensions::new(1_000);
        assert_eq!(next_term.due(&s, 5_000).len(), 1, "a new leader tells each node once");
    }
}
