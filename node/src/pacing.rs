//! How many jobs the leader may start in one scheduling pass. Pure: the leader's loop reads
//! its Raft metrics and the state, and carries the number into the scheduler's view.
//!
//! Starting a job costs every node something (a plan entry, a launch, a confirmation, a
//! finish), and under a sweep of trivial jobs the starts are most of the cluster's work. A
//! leader that starts jobs faster than its voters and nodes can take them falls behind: its
//! appends are acknowledged late, it can no longer confirm its leadership within its lease,
//! so it acknowledges no heartbeat, and after `fence_after_ms` every node stops its jobs (the
//! designed outcome of a leader cut off, here brought on by load). Two bounds keep it ahead:
//! - **work in flight**: parts placed and not yet confirmed started by their nodes are at most
//!   `LAUNCHES_UNCONFIRMED_MAX`, so a pass never plans far ahead of what the nodes have started
//!   (and one plan entry holds at most that many placements, however many GPUs are free after
//!   a failover on a large cluster);
//! - **the leader's own lag**: when a quorum last acknowledged its appends later than a Raft
//!   heartbeat plus a quarter of the slack left in its lease, starts are cut to a quarter;
//!   past half the slack, none start until the voters catch up.
//!
//! The leader also has at most `LAUNCH_CALLS_PER_NODE_MAX` launch calls under way to one node.
//! A paced job waits one pass with the reason [`corral_scheduler::PACED`]; nothing else
//! changes (finishes, kills, launches already planned and liveness go on).

use std::sync::atomic::{AtomicU64, Ordering};

/// Parts placed and not yet confirmed started beyond which a pass starts nothing.
pub const LAUNCHES_UNCONFIRMED_MAX: usize = 1_024;
/// Launch calls the leader has under way to one node; the node's other launches wait for one
/// to end (each call prepares a run on the node's blocking pool: directories, cgroups, a
/// process start).
pub const LAUNCH_CALLS_PER_NODE_MAX: usize = 8;

/// What the leader knows of its own load at the start of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaderLoad {
    /// Since a quorum last acknowledged this leader's appends; `None` before the first time
    /// in this term.
    pub quorum_ack_age_ms: Option<u64>,
    /// Whether this leader is the only voter (its own quorum: no lag to measure).
    pub single_voter: bool,
    /// Raft's heartbeat interval: a quorum acknowledgement this old is normal.
    pub raft_heartbeat_ms: u64,
    /// The leader's lease (`election_timeout_min_ms`): past it, it must confirm its leadership
    /// before it acknowledges a heartbeat.
    pub lease_ms: u64,
    /// Parts placed and not yet confirmed started by their nodes.
    pub launches_unconfirmed: usize,
}

/// Why a pass starts fewer jobs than fit, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Paced {
    /// Nothing holds the pass back.
    No,
    /// Launches in flight use part of the room (the number is what is left).
    InFlight,
    /// The voters acknowledge late: starts cut to a quarter.
    Lagging,
    /// The voters are far behind, or have not acknowledged this term yet: no start.
    Stalled,
}

impl Paced {
    /// Its label in `corral_scheduler_passes_paced_total`.
    pub fn label(self) -> &'static str {
        match self {
            Paced::No => "no",
            Paced::InFlight => "in_flight",
            Paced::Lagging => "lagging",
            Paced::Stalled => "stalled",
        }
    }
}

/// Passes held back, by why, since this node started (a counter per [`Paced`] but `No`).
#[derive(Debug, Default)]
pub struct PacedCounts {
    in_flight: AtomicU64,
    lagging: AtomicU64,
    stalled: AtomicU64,
}

impl PacedCounts {
    pub fn count(&self, paced: Paced) {
        let counter = match paced {
            Paced::No => return,
            Paced::InFlight => &self.in_flight,
            Paced::Lagging => &self.lagging,
            Paced::Stalled => &self.stalled,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// (label, passes) for every kind of pacing.
    pub fn read(&self) -> Vec<(&'static str, u64)> {
        [(Paced::InFlight, &self.in_flight), (Paced::Lagging, &self.lagging), (Paced::Stalled, &self.stalled)]
            .into_iter()
            .map(|(p, c)| (p.label(), c.load(Ordering::Relaxed)))
            .collect()
    }
}

/// The most jobs and array tasks this pass may start, and why it is not unbounded.
pub fn starts_per_pass_max(load: &LeaderLoad) -> (u32, Paced) {
    let room = LAUNCHES_UNCONFIRMED_MAX.saturating_sub(load.launches_unconfirmed);
    let room = u32::try_from(room).unwrap_or(u32::MAX);
    let lag = if load.single_voter {
        Paced::No
    } else {
        let slack_ms = load.lease_ms.saturating_sub(load.raft_heartbeat_ms);
        match load.quorum_ack_age_ms {
            None => Paced::Stalled,
            Some(age) if age > load.raft_heartbeat_ms + slack_ms / 2 => Paced::Stalled,
            Some(age) if age > load.raft_heartbeat_ms + slack_ms / 4 => Paced::Lagging,
            Some(_) => Paced::No,
        }
    };
    match lag {
        Paced::Stalled => (0, Paced::Stalled),
        Paced::Lagging => ((room / 4).max(u32::from(room > 0)), Paced::Lagging),
        _ if room == 0 || load.launches_unconfirmed > 0 => (room, Paced::InFlight),
        _ => (room, Paced::No),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(age: Option<u64>, unconfirmed: usize) -> LeaderLoad {
        LeaderLoad { quorum_ack_age_ms: age, single_voter: false, raft_heartbeat_ms: 100, lease_ms: 400, launches_unconfirmed: unconfirmed }
    }

    #[test]
    fn a_leader_in_step_with_its_voters_starts_what_the_in_flight_bound_leaves() {
        assert_eq!(starts_per_pass_max(&load(Some(100), 0)), (1_024, Paced::No));
        assert_eq!(starts_per_pass_max(&load(Some(175), 24)), (1_000, Paced::InFlight));
        assert_eq!(starts_per_pass_max(&load(Some(20), 1_024)), (0, Paced::InFlight));
        assert_eq!(starts_per_pass_max(&load(Some(20), 5_000)), (0, Paced::InFlight));
    }

    #[test]
    fn a_leader_behind_its_voters_starts_less_then_nothing() {
        // Heartbeat 100 ms, lease 400 ms: 300 ms of slack; a quarter is 75 ms, half 150 ms.
        assert_eq!(starts_per_pass_max(&load(Some(175), 0)).1, Paced::No);
        assert_eq!(starts_per_pass_max(&load(Some(176), 0)), (256, Paced::Lagging));
        assert_eq!(starts_per_pass_max(&load(Some(250), 1_020)), (1, Paced::Lagging));
        assert_eq!(starts_per_pass_max(&load(Some(250), 1_024)), (0, Paced::Lagging));
        assert_eq!(starts_per_pass_max(&load(Some(251), 0)), (0, Paced::Stalled));
        assert_eq!(starts_per_pass_max(&load(None, 0)), (0, Paced::Stalled));
    }

    #[test]
    fn paced_passes_are_counted_by_why() {
        let counts = PacedCounts::default();
        for p in [Paced::No, Paced::InFlight, Paced::Stalled, Paced::Stalled] {
            counts.count(p);
        }
        assert_eq!(counts.read(), vec![("in_flight", 1), ("lagging", 0), ("stalled", 2)]);
    }

    #[test]
    fn a_single_voter_has_no_lag_to_wait_for() {
        let single = LeaderLoad { single_voter: true, ..load(None, 0) };
        assert_eq!(starts_per_pass_max(&single), (1_024, Paced::No));
        assert_eq!(starts_per_pass_max(&LeaderLoad { launches_unconfirmed: 1_014, ..single }), (10, Paced::InFlight));
    }
}
