//! Supervising a started run to its end, and what the leader asks of a run meanwhile: stop it,
//! signal it, suspend or resume it (kept in the run's directory).

use std::sync::Arc;

use anyhow::Context;
use proto::{ApiError, JobId, Reply, RunNo, RunOutcome};
use tracing::{debug, info};

use control::agent::StopDecision;

use super::ledger::{ledger_mark, LedgerEntry};
use super::{lock, Agent};
use crate::run::launcher::{self, StopReason};
use crate::run::shepherd::{self, Shepherd};

impl Agent {
    /// Supervises a started run to its end (`elapsed_ms` into it), then reports it.
    pub(super) async fn supervise_run(
        self: Arc<Self>,
        child: Shepherd,
        spec: crate::run::process::LaunchSpec,
        stop_rx: launcher::StopReceiver,
        cgroup: Option<Arc<crate::run::cgroup::JobCgroup>>,
        tasks: Arc<launcher::TaskGroups>,
        elapsed_ms: u64,
    ) {
        let pause_rx = lock(&self.running)
            .get(&spec.job)
            .filter(|r| r.run == spec.run)
            .map_or_else(|| launcher::pause_channel().1, |r| r.pause_tx.subscribe());
        let mut outcome = launcher::supervise(child, &spec, stop_rx, pause_rx, self.settings.stop, &tasks, elapsed_ms).await;
        if let Some(cgroup) = cgroup {
            outcome = launcher::with_oom_kills(outcome, cgroup.oom_kills(), cgroup.memory_limit_mib());
            // Whatever the job left behind, in or out of its process group.
            cgroup.kill_and_remove().await;
        }
        if self.out_of_touch() {
            outcome = launcher::ended_out_of_touch(outcome, &self.name);
        }
        info!(outcome = ?outcome, "job ended");
        if let Err(e) = launcher::tidy_checkpoint_dir(&spec, &outcome) {
            debug!(error = %e, "remove the empty checkpoint directory of a completed job");
        }
        let counted = self.end_run(spec.job);
        self.stdin_feeds.forget_job(spec.job);
        self.renew_lease();
        self.queue_report(counted, spec.job, spec.run, outcome).await;
    }

    /// Stops `job` if this node runs that run of it. Stopping an unknown run is not an error:
    /// it already ended, and its report is on the way.
    pub fn kill(self: &Arc<Self>, job: JobId, run: RunNo, checkpoint: bool) -> Result<Reply, ApiError> {
        {
            let running = lock(&self.running);
            if let Some(r) = running.get(&job).filter(|r| r.run == run) {
                let reason = if checkpoint { StopReason::Checkpoint } else { StopReason::Cancelled };
                r.stop_tx.request(reason);
                return Ok(Reply::Ok);
            }
        }
        // Not running here (a second report of a run is ignored by the log).
        let mut ledger = lock(&self.ledger);
        let mark = ledger_mark(ledger.entries.get(&(job, run)), self.instance);
        let why = match control::agent::decide_stop(false, mark) {
            StopDecision::Stop | StopDecision::Nothing => return Ok(Reply::Ok),
            StopDecision::RefuseAndReportLost(why) => why,
        };
        // Its output, if an earlier instance ran it, stays where `corral logs` finds it.
        let (stdout, stderr) = ledger.entries.get(&(job, run)).map(|e| (e.stdout.clone(), e.stderr.clone())).unwrap_or_default();
        let entry = LedgerEntry { job, run, instance: self.instance, stdout, stderr, refused: true };
        ledger.record(entry).map_err(|e| ApiError::Internal(format!("{e:#}")))?;
        drop(ledger);
        info!(job, run, reason = why, "stopped a run that does not run here");
        let agent = Arc::clone(self);
        let counted = self.count_report();
        tokio::spawn(async move { agent.queue_report(counted, job, run, RunOutcome::Lost(why.into())).await });
        Ok(Reply::Ok)
    }

    /// Sends `signal` to this node's part of `job` run `run`: to its process group, or to the
    /// batch shell only. An unknown run is not an error (it ended).
    pub fn signal(&self, job: JobId, run: RunNo, signal: i32, batch_only: bool) -> Result<Reply, ApiError> {
        if !(1..=64).contains(&signal) {
            return Err(ApiError::Invalid(format!("signal {signal} out of range")));
        }
        let running = lock(&self.running);
        if let Some(r) = running.get(&job).filter(|r| r.run == run && r.pgid > 0) {
            launcher::signal_job(r.pgid, signal, batch_only, r.batch, r.hold, &r.tasks);
        }
        Ok(Reply::Ok)
    }

    /// Stops or continues this node's part of `job` run `run` as the log says of its suspension
    /// (idempotent: the leader re-sends it until acknowledged, and to a new instance). Kept in
    /// the run's directory, so a daemon that takes the run over keeps it stopped. An unknown run
    /// is not an error (it ended), nor is an order a newer one overtook (ignored).
    pub fn suspend(&self, job: JobId, run: RunNo, pause: launcher::Pause) -> Result<Reply, ApiError> {
        let running = lock(&self.running);
        let Some(r) = running.get(&job).filter(|r| r.run == run) else { return Ok(Reply::Ok) };
        let applied = r.pause_tx.borrow().change;
        if !control::agent::suspension_is_current(applied, pause.change) {
            debug!(job, run, applied, overtaken = pause.change, "ignored a suspension order a newer one overtook");
            return Ok(Reply::Ok);
        }
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, run);
        write_pause(&dir, pause).map_err(|e| ApiError::Internal(format!("record the suspension of job {job}: {e:#}")))?;
        if r.pause_tx.send_replace(pause) != pause {
            info!(job, run, suspended = pause.suspended, paused_ms = pause.paused_ms, "suspension changed");
        }
        Ok(Reply::Ok)
    }
}

/// The file in a run's directory that keeps its suspension: "<0|1> <paused_ms> <change>".
const PAUSE_FILE: &str = "pause";

fn write_pause(dir: &std::path::Path, pause: launcher::Pause) -> anyhow::Result<()> {
    let path = dir.join(PAUSE_FILE);
    let tmp = dir.join(format!("{PAUSE_FILE}.tmp"));
    std::fs::write(&tmp, format!("{} {} {}\n", u8::from(pause.suspended), pause.paused_ms, pause.change))
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))
}

/// The run's suspension as its directory keeps it; not suspended when there is none (or it
/// cannot be read: the leader tells the new instance again).
pub(super) fn read_pause(dir: &std::path::Path) -> launcher::Pause {
    let text = std::fs::read_to_string(dir.join(PAUSE_FILE)).unwrap_or_default();
    let mut words = text.split_whitespace();
    // A file an older daemon wrote has no change count: any order counts as newer.
    let change = |w: Option<&str>| w.and_then(|w| w.parse().ok()).unwrap_or(0);
    match (words.next(), words.next().and_then(|w| w.parse().ok())) {
        (Some(flag), Some(paused_ms)) => launcher::Pause { suspended: flag == "1", paused_ms, change: change(words.next()) },
        _ => launcher::Pause::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::{read_pause, write_pause, PAUSE_FILE};
    use crate::run::launcher::Pause;

    #[test]
    fn a_runs_pause_is_kept_with_its_change_and_an_older_file_reads_as_change_0() {
        let dir = std::env::temp_dir().join(format!("corral-pause-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        assert_eq!(read_pause(&dir), Pause::default(), "no file: not suspended");
        let pause = Pause { suspended: true, paused_ms: 1_500, change: 3 };
        write_pause(&dir, pause).expect("write the pause");
        assert_eq!(read_pause(&dir), pause);
        std::fs::write(dir.join(PAUSE_FILE), "1 700\n").expect("write an older daemon's file");
        assert_eq!(read_pause(&dir), Pause { suspended: true, paused_ms: 700, change: 0 });
        std::fs::remove_dir_all(&dir).expect("remove the temporary directory");
    }
}
