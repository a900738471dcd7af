//! The agent's decisions: accept or refuse a launch, what a stop does, when the node fences
//! itself and when its watchdog kills what it left running.
//!
//! The fencing argument (ARCHITECTURE.md): a node counts its lease from when it *sent* the last
//! heartbeat a leader acknowledged; the leader declares it down no sooner than
//! `node_down_after_ms` after it last heard it. The node stops its jobs `fence_after_ms` after
//! that send, which [`fence_after_ms`] keeps inside the leader's grace period, and starts nothing
//! while it is out of touch. So a run is never started elsewhere while it still runs here.

use proto::{JobState, NodeId, RunNo};

mod lease;
mod outbox;
pub use lease::{Lease, Tick};
pub use outbox::{Outbox, REPORT_RETRY_MAX_MS, REPORT_RETRY_MIN_MS};

/// How often the watchdog (a process of its own beside `corrald`) reads its lease.
pub const WATCHDOG_POLL_MS: u64 = 100;

/// What the launch ledger (on disk, it survives restarts) says about one run on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ledger {
    /// This node never launched nor refused the run.
    Absent,
    /// The run was started here, by this instance of the daemon or by an earlier one (which
    /// died, and its processes with it).
    Started { this_instance: bool },
    /// A stop came before the launch: the run is refused here for good.
    Refused { this_instance: bool },
}

impl Ledger {
    /// The ledger's entry for a run, (the instance that wrote it, whether it refused the run),
    /// as read by daemon instance `instance`.
    pub fn of(entry: Option<(proto::InstanceId, bool)>, instance: proto::InstanceId) -> Ledger {
        match entry {
            None => Ledger::Absent,
            Some((by, true)) => Ledger::Refused { this_instance: by == instance },
            Some((by, false)) => Ledger::Started { this_instance: by == instance },
        }
    }
}

/// Why a run this node does not run is reported lost when it is stopped.
pub const LOST_STOPPED_BEFORE_START: &str = "stopped before it started";
pub const LOST_EARLIER_INSTANCE: &str = "started by an earlier instance of this node, which died";

/// What the agent does with a launch of a run the leader's log still holds with a part here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchDecision {
    /// Start nothing now (the leader re-sends): no leader acknowledged this node within
    /// `fence_after_ms`, so it may be declared down, and a new instance is not known alive.
    NotInTouch,
    /// Refused for good: a stop came first.
    StoppedBefore,
    /// This instance started it already (a re-sent launch): acknowledge it again.
    AckAgain,
    /// An earlier instance started it and died with it: never start it twice; report it lost
    /// ([`LOST_EARLIER_INSTANCE`]).
    ReportLost,
    /// Record it in the ledger, start it, acknowledge it.
    Start,
}

/// Whether a node whose last acknowledged heartbeat was sent `ack_age_ms` ago (None: no leader
/// acknowledged this instance yet) is out of touch: it fences its jobs and starts nothing.
pub fn out_of_touch(ack_age_ms: Option<u64>, fence_after_ms: u64) -> bool {
    ack_age_ms.is_none_or(|age_ms| age_ms > fence_after_ms)
}

/// The launch decision, given the node's touch with the leader and its ledger entry for the
/// run. The caller checked first that the run is still current here ([`run_is_current_here`]).
pub fn decide_launch(ack_age_ms: Option<u64>, fence_after_ms: u64, ledger: Ledger) -> LaunchDecision {
    if out_of_touch(ack_age_ms, fence_after_ms) {
        return LaunchDecision::NotInTouch;
    }
    match ledger {
        Ledger::Refused { .. } => LaunchDecision::StoppedBefore,
        Ledger::Started { this_instance: true } => LaunchDecision::AckAgain,
        Ledger::Started { this_instance: false } => LaunchDecision::ReportLost,
        Ledger::Absent => LaunchDecision::Start,
    }
}

/// Whether a suspension order carrying change `order_change` (`proto::Suspension::changes`) is
/// to be carried out on a run whose last one carried out was `applied_change`: not when a newer
/// order overtook it (orders travel apart and are re-sent; one delayed past the next must not
/// stop a resumed run again). The same change again is carried out again: it changes nothing.
pub fn suspension_is_current(applied_change: u32, order_change: u32) -> bool {
    order_change >= applied_change
}

/// What the agent does with a stop of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopDecision {
    /// It runs here: stop it (its end is reported as usual).
    Stop,
    /// It ended here, or was refused here, by this instance: its report is on its way.
    Nothing,
    /// Record the run as refused (a launch still on its way must not start it) and report it
    /// lost for this reason, or its part would hold its resources for ever: nobody else will
    /// report it (it never started here, or the instance that ran it died, maybe before it
    /// reported, and its report queue with it).
    RefuseAndReportLost(&'static str),
}

/// The stop decision, given whether this instance runs that run and its ledger entry.
pub fn decide_stop(running_here: bool, ledger: Ledger) -> StopDecision {
    if running_here {
        return StopDecision::Stop;
    }
    match ledger {
        Ledger::Started { this_instance: true } | Ledger::Refused { this_instance: true } => StopDecision::Nothing,
        Ledger::Started { this_instance: false } => StopDecision::RefuseAndReportLost(LOST_EARLIER_INSTANCE),
        Ledger::Refused { this_instance: false } | Ledger::Absent => StopDecision::RefuseAndReportLost(LOST_STOPPED_BEFORE_START),
    }
}

/// Whether run `run` of `job` (as the committed state has it) is still the job's current run
/// with a part on node `me` that no other instance of it confirmed: only then may a launch
/// start it. A launch read from an older state (the run was requeued, the node declared down
/// meanwhile) is stale.
pub fn run_is_current_here(job: &proto::Job, run: RunNo, me: NodeId, instance: proto::InstanceId) -> bool {
    job.run == run
        && job.state == JobState::Running
        && job.parts.iter().any(|p| p.run == run && p.alloc.node == me && p.launched_by.is_none_or(|by| by == instance))
        // A spare starts nothing until a lost rank moves there (`Job::spares`).
        && !job.spares.contains(&me)
}

/// Bits of an instance id below its start time: random, so two daemons started in the same
/// millisecond (a cloned disk, a clock stepped back) still differ.
pub const INSTANCE_RANDOM_BITS: u32 = 20;

/// The id of a new instance of a node's daemon, started at wall-clock `now_ms`: later than
/// `previous` (the last instance this node's record holds), and ordered by start time across
/// records lost. The cluster refuses a registration or heartbeat of an instance older than the
/// one it holds while that one is up (`state`'s `newer_instance_up`): a dead instance's `Join`
/// delayed past its successor's would otherwise retire the live one and free the GPUs of what
/// it runs. Ids of before this order (random) are only ever followed, never compared against a
/// start time, while the record lives; a node whose record and clock both went back waits
/// until its old instance is declared down.
pub fn next_instance(now_ms: u64, previous: Option<proto::InstanceId>, random: u64) -> proto::InstanceId {
    let by_time = (now_ms << INSTANCE_RANDOM_BITS) | (random & ((1 << INSTANCE_RANDOM_BITS) - 1));
    match previous.and_then(|p| p.checked_add(1)) {
        Some(after) => by_time.max(after),
        None => by_time,
    }
}

/// `fence_after_ms` by default: the leader declares a node dead no sooner than
/// `node_down_after_ms` after its last heartbeat; the agent notices the silence up to a
/// heartbeat late, its last ack may trail the heartbeat by a round trip, and stopping takes
/// `fence_kill_grace_ms`. The margin (a tenth of the grace period, at least 200 ms) covers the
/// round trip.
pub fn fence_after_ms(node_down_after_ms: u64, fence_kill_grace_ms: u64, heartbeat_interval_ms: u64) -> u64 {
    let margin_ms = (node_down_after_ms / 10).max(200);
    node_down_after_ms.saturating_sub(fence_kill_grace_ms + 2 * heartbeat_interval_ms + margin_ms)
}

/// How long from now the watchdog lets this node's jobs run unless a leader acknowledges it
/// again: the fence deadline plus the grace the agent's own stop takes. Zero when no leader
/// acknowledged this instance (its jobs, adopted from a predecessor, must not outlive it).
pub fn watchdog_deadline_in_ms(ack_age_ms: Option<u64>, fence_after_ms: u64, fence_kill_grace_ms: u64) -> u64 {
    ack_age_ms.map_or(0, |age_ms| (fence_after_ms + fence_kill_grace_ms).saturating_sub(age_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_instance_is_later_than_the_previous_and_ordered_by_start_time() {
        let a = next_instance(1_000, None, 7);
        let b = next_instance(2_000, Some(a), 3);
        assert!(b > a);
        // The clock stepped back: still after the recorded one.
        let c = next_instance(500, Some(b), 9);
        assert_eq!(c, b + 1);
        // An id from before the order (random, large) is followed while the record lives.
        let legacy = u64::MAX - 5;
        assert_eq!(next_instance(3_000, Some(legacy), 0), legacy + 1);
        assert_eq!(next_instance(3_000, Some(u64::MAX), 0), 3_000 << INSTANCE_RANDOM_BITS);
        // Two daemons started in the same millisecond differ by their random bits.
        assert_ne!(next_instance(4_000, None, 1), next_instance(4_000, None, 2));
    }

    #[test]
    fn a_node_out_of_touch_starts_nothing_whatever_its_ledger_says() {
        for ledger in [Ledger::Absent, Ledger::Started { this_instance: true }, Ledger::Refused { this_instance: false }] {
            assert_eq!(decide_launch(None, 1_000, ledger), LaunchDecision::NotInTouch);
            assert_eq!(decide_launch(Some(1_001), 1_000, ledger), LaunchDecision::NotInTouch);
        }
        assert_eq!(decide_launch(Some(1_000), 1_000, Ledger::Absent), LaunchDecision::Start);
    }

    #[test]
    fn a_run_starts_once_per_node_and_never_after_a_stop_or_a_dead_instance() {
        let launch = |ledger| decide_launch(Some(10), 1_000, ledger);
        assert_eq!(launch(Ledger::Absent), LaunchDecision::Start);
        assert_eq!(launch(Ledger::Started { this_instance: true }), LaunchDecision::AckAgain);
        assert_eq!(launch(Ledger::Started { this_instance: false }), LaunchDecision::ReportLost);
        assert_eq!(launch(Ledger::Refused { this_instance: true }), LaunchDecision::StoppedBefore);
        assert_eq!(launch(Ledger::Refused { this_instance: false }), LaunchDecision::StoppedBefore);
    }

    #[test]
    fn a_ledger_entry_is_read_against_this_instance() {
        assert_eq!(Ledger::of(None, 7), Ledger::Absent);
        assert_eq!(Ledger::of(Some((7, false)), 7), Ledger::Started { this_instance: true });
        assert_eq!(Ledger::of(Some((6, false)), 7), Ledger::Started { this_instance: false });
        assert_eq!(Ledger::of(Some((6, true)), 7), Ledger::Refused { this_instance: false });
    }

    #[test]
    fn a_stop_of_a_run_nobody_will_report_reports_it_lost() {
        assert_eq!(decide_stop(true, Ledger::Started { this_instance: true }), StopDecision::Stop);
        assert_eq!(decide_stop(false, Ledger::Started { this_instance: true }), StopDecision::Nothing);
        assert_eq!(decide_stop(false, Ledger::Refused { this_instance: true }), StopDecision::Nothing);
        assert_eq!(decide_stop(false, Ledger::Absent), StopDecision::RefuseAndReportLost(LOST_STOPPED_BEFORE_START));
        assert_eq!(decide_stop(false, Ledger::Started { this_instance: false }), StopDecision::RefuseAndReportLost(LOST_EARLIER_INSTANCE));
        // Refused by an instance that died before its report left: the new one reports it.
        assert_eq!(
            decide_stop(false, Ledger::Refused { this_instance: false }),
            StopDecision::RefuseAndReportLost(LOST_STOPPED_BEFORE_START)
        );
    }

    #[test]
    fn a_launch_is_current_only_for_the_jobs_running_run_unconfirmed_or_confirmed_by_this_instance() {
        let mut job = crate::leader::tests::job_on(&[3, 4], false);
        assert!(run_is_current_here(&job, 1, 3, 7));
        assert!(!run_is_current_here(&job, 2, 3, 7), "another run");
        assert!(!run_is_current_here(&job, 1, 5, 7), "no part on this node");
        job.parts[0].launched_by = Some(7);
        assert!(run_is_current_here(&job, 1, 3, 7));
        assert!(!run_is_current_here(&job, 1, 3, 8), "confirmed by another instance of this node");
        job.state = JobState::Pending;
        assert!(!run_is_current_here(&job, 1, 4, 7), "requeued");
    }

    #[test]
    fn a_suspension_order_overtaken_by_a_newer_one_is_ignored() {
        assert!(suspension_is_current(0, 1));
        assert!(suspension_is_current(2, 2), "the same order again");
        assert!(!suspension_is_current(2, 1), "a suspend delayed past its resume");
    }

    #[test]
    fn the_fence_falls_inside_the_leaders_grace_period() {
        // The defaults: 5 s grace, 1 s heartbeats, 2 s kill grace.
        let fence = fence_after_ms(5_000, 2_000, 1_000);
        assert_eq!(fence, 5_000 - 2_000 - 2 * 1_000 - 500);
        assert!(fence + 2_000 + 2 * 1_000 < 5_000);
        // A grace period too short for the margins fences at once rather than never.
        assert_eq!(fence_after_ms(1_000, 2_000, 1_000), 0);
        assert_eq!(watchdog_deadline_in_ms(Some(300), fence, 2_000), fence + 2_000 - 300);
        assert_eq!(watchdog_deadline_in_ms(Some(u64::MAX), fence, 2_000), 0);
        assert_eq!(watchdog_deadline_in_ms(None, fence, 2_000), 0);
    }
}
