//! How long this node may run jobs without a leader: heartbeat acknowledgements, the
//! watchdog's lease, fencing, and a graceful stop of every job.

use std::sync::atomic::Ordering;
use std::time::Duration;

use proto::{PeerRequest, Reply};
use tracing::{info, warn};

use super::{lock, Agent};
use crate::run::launcher::StopReason;

impl Agent {
    /// The leader's commit index in the last heartbeat acknowledgement.
    pub fn ack_term(&self) -> u64 {
        self.ack_term.load(Ordering::SeqCst)
    }

    pub fn ack_commit_index(&self) -> u64 {
        self.ack_commit_index.load(Ordering::SeqCst)
    }

    /// Whether no leader acknowledged this node for `fence_after_ms`.
    pub(super) fn out_of_touch(&self) -> bool {
        lock(&self.lease).out_of_touch(crate::run::procfs::boot_ms())
    }

    /// Rewrites the watchdog's lease: the running process groups, and the moment after which
    /// they must be dead unless a leader acknowledges this node again (0: no leader
    /// acknowledged this instance, so what it runs, adopted, must not outlive it).
    pub fn renew_lease(&self) {
        let deadline_boot_ms = lock(&self.lease).watchdog_deadline_ms().unwrap_or(0);
        let groups = lock(&self.running)
            .values()
            .flat_map(|r| {
                let own = (r.pgid > 0).then_some((r.pgid, r.start_ticks));
                own.into_iter().chain(r.tasks.snapshot())
            })
            .map(|(pgid, start_ticks)| crate::run::watchdog::Group { pgid, start_ticks })
            .collect();
        let cgroups = lock(&self.running).values().filter_map(|r| r.cgroup.as_ref()).flat_map(|c| c.paths()).collect();
        let lease = crate::run::watchdog::Lease { deadline_boot_ms, groups, cgroups };
        // One writer at a time: the file is replaced by rename.
        let _guard = lock(&self.lease_write);
        if let Err(e) = crate::run::watchdog::write_lease(&self.settings.lease_path, &lease) {
            warn!(error = format!("{e:#}"), "renew watchdog lease");
        }
    }

    /// A graceful stop of this node: launches nothing more, stops every job (SIGTERM, grace,
    /// SIGKILL), reports each as lost to the node (a `--requeue` job goes back to the queue at
    /// once, without waiting for the node to be declared down) and waits, at most `patience`,
    /// until the leader has them. Returns the jobs still launching, running or unreported when
    /// it gave up: none means nothing runs here any more, nor will.
    pub async fn shut_down(&self, patience: Duration) -> usize {
        self.stopping.store(true, Ordering::SeqCst);
        info!(jobs = lock(&self.running).len(), "node stopping: stopping its jobs");
        let deadline = std::time::Instant::now() + patience;
        loop {
            // Launching is read before running: a launch that got its claim before the stop
            // holds it until its run is in `running`. Asked again each round for such a run
            // (a request already made changes nothing).
            let launching = lock(&self.launching).len();
            let running = {
                let running = lock(&self.running);
                for r in running.values() {
                    r.stop_tx.request(StopReason::NodeStopping);
                }
                running.len()
            };
            let left = launching + running + self.reports_pending.load(Ordering::SeqCst) as usize;
            if left == 0 || std::time::Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops every job: this node lost the leader and may already be replaced.
    fn fence(&self) -> usize {
        let running = lock(&self.running);
        for r in running.values() {
            r.stop_tx.request(StopReason::Fenced);
        }
        running.len()
    }
}

impl crate::liveness::Heartbeating for Agent {
    fn heartbeat(&self) -> PeerRequest {
        PeerRequest::Heartbeat { node: self.node_id(), instance: self.instance, running: self.running() }
    }

    fn holds_work(&self) -> bool {
        !self.running().is_empty()
    }

    fn fence(&self) -> usize {
        Agent::fence(self)
    }

    fn lease(&self) -> &std::sync::Mutex<control::agent::Lease> {
        &self.lease
    }

    fn acknowledged(&self, ack: &Reply) {
        if let Reply::HeartbeatAck { commit_index, term, .. } = ack {
            self.ack_commit_index.fetch_max(*commit_index, Ordering::SeqCst);
            self.ack_term.store(*term, Ordering::SeqCst);
        }
    }

    fn tick_done(&self) {
        self.renew_lease();
    }
}
