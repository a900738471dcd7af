//! Reports of ended runs: counted, kept in the run's directory and queued, then sent to the
//! leader (batched where they can be) until it has them; the run is forgotten after.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use proto::{InstanceId, JobId, PeerRequest, RunNo, RunOutcome};
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use super::{lock, Agent};
use crate::link::{LeaderLink, LinkError};
use crate::run::{launcher, procfs, shepherd};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Report {
    pub(super) job: JobId,
    pub(super) run: RunNo,
    outcome: RunOutcome,
    usage: proto::GpuUsage,
}

/// A report kept in its run's directory (`report.json`) until a leader has it, so that a daemon
/// that takes this one's runs over sends it again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct StoredReport {
    pub(super) instance: InstanceId,
    pub(super) report: Report,
}

/// A run end counted in `reports_pending` before its run left `running` (or, for a run that
/// never started, before its launch let go of its claim): a graceful stop that finds neither a
/// run nor a pending report knows nothing is left to report. Spent by `queue_report`.
#[must_use]
pub(super) struct Counted(());

impl Agent {
    /// Counts one report as pending (see [`Counted`]).
    pub(super) fn count_report(&self) -> Counted {
        self.reports_pending.fetch_add(1, Ordering::SeqCst);
        Counted(())
    }

    /// Takes `job`'s run out of `running`, its report counted first.
    pub(super) fn end_run(&self, job: JobId) -> Counted {
        let counted = self.count_report();
        lock(&self.running).remove(&job);
        counted
    }

    pub(super) async fn queue_report(&self, counted: Counted, job: JobId, run: RunNo, outcome: RunOutcome) {
        lock(&self.gpu_series).end(job);
        let usage = lock(&self.accounting)
            .take(job)
            .map(|st| proto::GpuUsage {
                samples: st.samples,
                utilization_pct_sum: st.utilization_pct_sum,
                memory_used_peak_mib: st.memory_used_peak_mib,
            })
            .unwrap_or_default();
        let report = Report { job, run, outcome, usage };
        // Kept until a leader has it: a daemon that takes this one's runs over sends it again.
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, run);
        let stored = StoredReport { instance: self.instance, report: report.clone() };
        if let Err(e) = std::fs::create_dir_all(&dir)
            .map_err(anyhow::Error::from)
            .and_then(|()| shepherd::write_json(&dir.join("report.json"), &stored))
        {
            warn!(job, run, error = format!("{e:#}"), "keep run report");
        }
        self.send_report(counted, report).await;
    }

    pub(super) async fn send_report(&self, _counted: Counted, report: Report) {
        let (job, run) = (report.job, report.run);
        if self.reports_tx.send(report).await.is_err() {
            self.reports_pending.fetch_sub(1, Ordering::SeqCst);
            warn!(job, run, "report queue closed, dropping report");
        }
    }

    /// A leader has the run's report: its directory goes, and the job's script and hostfile
    /// unless another run of the job is here (they are written again for each run).
    fn forget_run(&self, job: JobId, run: RunNo) {
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, run);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(job, run, error = %e, "remove run directory {}", dir.display());
            }
        }
        // Under the claims' lock a launch of the job cannot start preparing its files meanwhile.
        let launching = lock(&self.launching);
        if launching.range((job, 0)..=(job, RunNo::MAX)).next().is_some() || lock(&self.running).contains_key(&job) {
            return;
        }
        let files = launcher::job_files_dir(&self.settings.job_files_dir, job);
        if let Err(e) = std::fs::remove_dir_all(&files) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(job, run, error = %e, "remove job files {}", files.display());
            }
        }
    }

    /// Sends ended runs to the leader, oldest first, until a leader has each: what is queued goes
    /// in one request (the leader commits them together), and a report not taken is sent again
    /// when `control::agent::Outbox` says (50 ms, doubling up to 1 s).
    pub async fn report_loop(self: Arc<Self>, link: Arc<LeaderLink>) {
        let Some(mut rx) = lock(&self.reports_rx).take() else { return };
        let mut outbox = control::agent::Outbox::new();
        let mut open = true;
        loop {
            let now_ms = procfs::boot_ms();
            let due = outbox.due(now_ms, proto::REPORTS_PER_REQUEST_MAX);
            if due.is_empty() {
                let wait_ms = outbox.next_due_ms().map(|t| t.saturating_sub(now_ms));
                if !open && wait_ms.is_none() {
                    return;
                }
                // Nothing queued: only a new report wakes the loop (the sleep's branch is off).
                let wait = Duration::from_millis(wait_ms.unwrap_or(0));
                tokio::select! {
                    got = rx.recv(), if open => match got {
                        Some(report) => self.enqueue(&mut outbox, report),
                        None => open = false,
                    },
                    () = tokio::time::sleep(wait), if wait_ms.is_some() => {}
                }
                while let Ok(report) = rx.try_recv() {
                    self.enqueue(&mut outbox, report);
                }
                continue;
            }
            for (job, run) in self.deliver(&link, due.into_iter().map(|(_, _, r)| r).collect()).await {
                outbox.delivered(job, run);
                self.forget_run(job, run);
                self.reports_pending.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Queues `report`; a second report of a run already queued is dropped (and uncounted).
    fn enqueue(&self, outbox: &mut control::agent::Outbox<Report>, report: Report) {
        let (job, run) = (report.job, report.run);
        if !outbox.push(job, run, report, procfs::boot_ms()) {
            debug!(job, run, "a report of this run is queued already");
            self.reports_pending.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Sends `reports` (more than one in one `ReportRuns`; each alone if the leader refuses the
    /// batch as a whole) and returns the runs a leader took or refused for good. It stops at the
    /// first that did not get through: the rest are due again with it.
    async fn deliver(&self, link: &LeaderLink, reports: Vec<Report>) -> Vec<(JobId, RunNo)> {
        let node = self.node_id();
        if reports.len() > 1 {
            let batch = reports
                .iter()
                .map(|r| proto::RunReport { job: r.job, run: r.run, outcome: r.outcome.clone(), usage: r.usage.clone() })
                .collect();
            match link.call(PeerRequest::ReportRuns { node, reports: batch }, 0).await {
                Ok(_) => return reports.iter().map(|r| (r.job, r.run)).collect(),
                Err(LinkError::Api(e)) => debug!(reports = reports.len(), error = %e, "batched run reports refused, sending each alone"),
                Err(e) => {
                    debug!(reports = reports.len(), error = %e, "run reports not delivered, will send them again");
                    return Vec::new();
                }
            }
        }
        let mut taken = Vec::new();
        for r in reports {
            let req = PeerRequest::ReportRun { job: r.job, run: r.run, node, outcome: r.outcome, usage: r.usage };
            match link.call(req, 0).await {
                Ok(_) => taken.push((r.job, r.run)),
                Err(LinkError::Api(e)) => {
                    // The leader understood and refused: sending it again will not help.
                    warn!(job = r.job, run = r.run, error = %e, "run report refused");
                    taken.push((r.job, r.run));
                }
                Err(e) => {
                    debug!(job = r.job, error = %e, "run report not delivered, will send it again");
                    break;
                }
            }
        }
        taken
    }
}
