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
use crate::run::launcher;
use crate::run::shepherd;

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

    /// Sends ended runs to the leader, in order, retrying until each is committed.
    pub async fn report_loop(self: Arc<Self>, link: Arc<LeaderLink>) {
        let Some(mut rx) = lock(&self.reports_rx).take() else { return };
        while let Some(first) = rx.recv().await {
            // Whatever else is queued goes in the same request (the leader commits them
            // together): a busy node's reports do not wait for one commit each.
            let mut reports = vec![first];
            while reports.len() < proto::REPORTS_PER_REQUEST_MAX {
                match rx.try_recv() {
                    Ok(r) => reports.push(r),
                    Err(_) => break,
                }
            }
            if reports.len() > 1 && self.deliver_reports(&link, &reports).await {
                continue;
            }
            for report in reports {
                self.deliver_report(&link, report).await;
            }
        }
    }

    /// Sends `reports` in one `ReportRuns`, retrying until a leader has them: true. False when
    /// the leader refused the request as a whole (each is then sent alone).
    async fn deliver_reports(&self, link: &LeaderLink, reports: &[Report]) -> bool {
        let req = PeerRequest::ReportRuns {
            node: self.node_id(),
            reports: reports
                .iter()
                .map(|r| proto::RunReport { job: r.job, run: r.run, outcome: r.outcome.clone(), usage: r.usage.clone() })
                .collect(),
        };
        let mut backoff_ms = 50;
        loop {
            match link.call(req.clone(), 0).await {
                Ok(_) => {
                    for r in reports {
                        self.forget_run(r.job, r.run);
                        self.reports_pending.fetch_sub(1, Ordering::SeqCst);
                    }
                    return true;
                }
                Err(LinkError::Api(e)) => {
                    debug!(reports = reports.len(), error = %e, "batched run reports refused, sending each alone");
                    return false;
                }
                Err(e) => {
                    debug!(reports = reports.len(), error = %e, "run reports not delivered, retrying");
                    tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                    backoff_ms = (backoff_ms * 2).min(1_000);
                }
            }
        }
    }

    /// Sends one report, retrying until a leader has it or refuses it.
    async fn deliver_report(&self, link: &LeaderLink, report: Report) {
        let mut backoff_ms = 50;
        loop {
            let req = PeerRequest::ReportRun {
                job: report.job,
                run: report.run,
                node: self.node_id(),
                outcome: report.outcome.clone(),
                usage: report.usage.clone(),
            };
            match link.call(req, 0).await {
                Ok(_) => {
                    self.forget_run(report.job, report.run);
                    self.reports_pending.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                Err(LinkError::Api(e)) => {
                    // The leader understood and refused: retrying will not help.
                    warn!(job = report.job, run = report.run, error = %e, "run report refused");
                    self.forget_run(report.job, report.run);
                    self.reports_pending.fetch_sub(1, Ordering::SeqCst);
                    return;
                }
                Err(e) => {
                    debug!(job = report.job, error = %e, "run report not delivered, retrying");
                    tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                    backoff_ms = (backoff_ms * 2).min(1_000);
                }
            }
        }
    }
}
