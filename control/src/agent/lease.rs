//! The agent's memory of its leader and the order of its decisions on it: when it last sent a
//! heartbeat a leader acknowledged, whether a tick fences before it beats, whether a launch
//! starts, and when the watchdog kills. corrald's heartbeat loop (node/src/liveness.rs, also
//! the simulated nodes of `corral bench --nodes`) and `corral-chaos sim`'s agents each keep one
//! and carry out what it returns.
//!
//! Times are milliseconds on a clock the caller picks, monotonic and shared with whatever
//! reads the lease after this process (corrald: the boot clock, which its successor and its
//! watchdog read too; the simulator: its own clock).

use super::{decide_launch, out_of_touch, watchdog_deadline_in_ms, LaunchDecision, Ledger};

/// A node's lease on being counted alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// When the last heartbeat a leader acknowledged was *sent* (not when the answer came
    /// back): the leader heard it later, by any path, so the lease never outlasts the leader's
    /// own view of the node. None: no leader acknowledged this instance yet.
    ack_sent_ms: Option<u64>,
    fence_after_ms: u64,
    fence_kill_grace_ms: u64,
    /// Whether the last tick fenced, so that a fence is said once.
    fencing: bool,
}

/// What a heartbeat tick does before it beats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tick {
    /// Beat (the lease counts from this tick's time if the beat is acknowledged).
    Beat,
    /// Stop every job first, then beat: the leader may declare this node down and start its
    /// jobs elsewhere. `first`: the first tick of this silence to fence; `silent_ms`: since the
    /// last acknowledged send (None: never acknowledged).
    FenceThenBeat { first: bool, silent_ms: Option<u64> },
}

impl Lease {
    /// A lease no leader has acknowledged yet: out of touch until one does.
    pub fn new(fence_after_ms: u64, fence_kill_grace_ms: u64) -> Lease {
        Lease { ack_sent_ms: None, fence_after_ms, fence_kill_grace_ms, fencing: false }
    }

    /// The lease a predecessor of this instance handed over: its last acknowledged send.
    pub fn inherited(mut self, ack_sent_ms: u64) -> Lease {
        self.ack_sent_ms = Some(ack_sent_ms);
        self
    }

    /// A heartbeat sent at `sent_ms` was acknowledged. Answers may come out of order: the
    /// lease keeps the latest send.
    pub fn acknowledged(&mut self, sent_ms: u64) {
        self.ack_sent_ms = self.ack_sent_ms.max(Some(sent_ms));
        self.fencing = false;
    }

    /// When the last acknowledged heartbeat was sent.
    pub fn ack_sent_ms(&self) -> Option<u64> {
        self.ack_sent_ms
    }

    /// How long ago the last acknowledged heartbeat was sent.
    pub fn ack_age_ms(&self, now_ms: u64) -> Option<u64> {
        self.ack_sent_ms.map(|sent_ms| now_ms.saturating_sub(sent_ms))
    }

    /// Whether the node must start nothing and stop what it runs (`super::out_of_touch`).
    pub fn out_of_touch(&self, now_ms: u64) -> bool {
        out_of_touch(self.ack_age_ms(now_ms), self.fence_after_ms)
    }

    /// A heartbeat tick at `now_ms`, on a node that holds work or not: fence first when out of
    /// touch, then beat. The beat's send time is `now_ms`.
    pub fn tick(&mut self, now_ms: u64, holds_work: bool) -> Tick {
        if !(holds_work && self.out_of_touch(now_ms)) {
            return Tick::Beat;
        }
        let first = !self.fencing;
        self.fencing = true;
        Tick::FenceThenBeat { first, silent_ms: self.ack_age_ms(now_ms) }
    }

    /// What to do at `now_ms` with a launch the caller found current (`super::run_is_current_here`,
    /// checked first: a stale launch is refused whatever the lease and ledger say), given the
    /// run's ledger entry (`super::decide_launch`).
    pub fn launch(&self, now_ms: u64, ledger: Ledger) -> LaunchDecision {
        decide_launch(self.ack_age_ms(now_ms), self.fence_after_ms, ledger)
    }

    /// How long from `now_ms` the watchdog lets this node's jobs run unless a leader
    /// acknowledges it again (`super::watchdog_deadline_in_ms`).
    pub fn watchdog_deadline_in_ms(&self, now_ms: u64) -> u64 {
        watchdog_deadline_in_ms(self.ack_age_ms(now_ms), self.fence_after_ms, self.fence_kill_grace_ms)
    }

    /// The moment the watchdog kills this node's jobs unless a leader acknowledges it again;
    /// None: no leader acknowledged this instance, so they must not outlive it.
    pub fn watchdog_deadline_ms(&self) -> Option<u64> {
        self.ack_sent_ms.map(|sent_ms| sent_ms + self.fence_after_ms + self.fence_kill_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::{Lease, Tick};
    use crate::agent::{LaunchDecision, Ledger};

    #[test]
    fn a_tick_fences_before_it_beats_once_the_lease_ran_out_and_says_so_once() {
        let mut lease = Lease::new(1_000, 500);
        assert_eq!(lease.tick(0, true), Tick::FenceThenBeat { first: true, silent_ms: None }, "never acknowledged");
        lease.acknowledged(100);
        assert_eq!(lease.tick(1_100, true), Tick::Beat, "at the fence bound");
        assert_eq!(lease.tick(1_101, false), Tick::Beat, "nothing to stop");
        assert_eq!(lease.tick(1_101, true), Tick::FenceThenBeat { first: true, silent_ms: Some(1_001) });
        assert_eq!(lease.tick(1_200, true), Tick::FenceThenBeat { first: false, silent_ms: Some(1_100) });
        lease.acknowledged(1_200);
        assert_eq!(lease.tick(1_300, true), Tick::Beat);
        assert_eq!(lease.tick(2_201, true), Tick::FenceThenBeat { first: true, silent_ms: Some(1_001) });
    }

    #[test]
    fn the_lease_counts_from_the_latest_acknowledged_send() {
        let mut lease = Lease::new(1_000, 500);
        lease.acknowledged(300);
        lease.acknowledged(200);
        assert_eq!(lease.ack_sent_ms(), Some(300), "an older answer arriving late");
        assert_eq!(lease.ack_age_ms(900), Some(600));
        assert_eq!(lease.watchdog_deadline_ms(), Some(1_800));
        assert_eq!(lease.watchdog_deadline_in_ms(900), 900);
        assert_eq!(lease.watchdog_deadline_in_ms(5_000), 0);
        assert_eq!(Lease::new(1_000, 500).watchdog_deadline_in_ms(0), 0, "never acknowledged");
        assert_eq!(Lease::new(1_000, 500).inherited(40).ack_sent_ms(), Some(40));
    }

    #[test]
    fn a_launch_starts_only_while_in_touch() {
        let mut lease = Lease::new(1_000, 500);
        assert_eq!(lease.launch(0, Ledger::Absent), LaunchDecision::NotInTouch);
        lease.acknowledged(0);
        assert_eq!(lease.launch(1_000, Ledger::Absent), LaunchDecision::Start);
        assert_eq!(lease.launch(1_000, Ledger::Started { this_instance: true }), LaunchDecision::AckAgain);
        assert_eq!(lease.launch(1_001, Ledger::Absent), LaunchDecision::NotInTouch);
    }
}
