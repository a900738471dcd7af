//! Handing this daemon's runs over to the next one (a rolling upgrade), and taking over, or
//! killing, the runs a previous daemon left.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use proto::{InstanceId, JobId, RunNo, RunOutcome};
use tracing::{info, info_span, warn, Instrument};

use super::ledger::LEDGER_ENTRIES_MAX;
use super::report::StoredReport;
use super::steps::STEP_GRANT_FILE;
use super::supervise::read_pause;
use super::{lock, Agent, HeldStep, Running, TaskBase};
use crate::run::daemon_record::{DaemonRecord, Handover};
use crate::run::launcher;
use crate::run::process::ExitRecord;
use crate::run::shepherd::{self, LaunchRecord, RunRecord, Shepherd};
use crate::run::step::Step;

/// How long a starting daemon waits for a run of a dead instance to die once killed.
const ADOPT_KILL_WAIT_MS: u64 = 10_000;

impl Agent {
    /// Prepares this daemon to exit and be replaced (a rolling upgrade) while its runs go on:
    /// it starts nothing more, records each run's next step number, and writes the hand-over
    /// into the daemon record. The caller exits right after; the runs' shepherds and the
    /// watchdog keep the jobs until the next daemon of this instance takes them over, or until
    /// the lease's deadline. Step tasks, which this daemon started itself, end with it.
    pub fn hand_over(&self) -> anyhow::Result<Handover> {
        let now_ms = crate::run::procfs::boot_ms();
        let lease = *lock(&self.lease);
        let (Some(last_ack_boot_ms), Some(deadline_boot_ms)) = (lease.ack_sent_ms(), lease.watchdog_deadline_ms()) else {
            anyhow::bail!("no leader has acknowledged this node yet: its runs cannot be handed over");
        };
        anyhow::ensure!(now_ms < deadline_boot_ms, "this node is out of touch with the leader: its jobs are being fenced");
        self.handing_over.store(true, Ordering::SeqCst);
        for (job, r) in lock(&self.running).iter() {
            let path = shepherd::run_dir(&self.settings.runs_dir, *job, r.run).join("next_step");
            if let Err(e) = std::fs::write(&path, r.next_step.to_string()) {
                warn!(job, error = %e, "record the next step number in {}", path.display());
            }
        }
        let handover = Handover { last_ack_boot_ms, ack_commit_index: self.ack_commit_index(), deadline_boot_ms };
        let record = DaemonRecord { handover: Some(handover), ..DaemonRecord::me(self.instance) };
        shepherd::write_json(&self.settings.daemon_file, &record)?;
        self.renew_lease();
        info!(runs = lock(&self.running).len(), deadline_in_ms = deadline_boot_ms - now_ms, "runs handed over");
        Ok(handover)
    }

    /// Goes through the run directories a previous daemon left, before this one registers:
    /// with a hand-over (`handover`, this daemon kept its instance), it takes over the runs
    /// that still run and re-sends the reports of those that ended; any run of another
    /// instance is killed (its shepherd's job, if still alive) and forgotten. Returns the runs
    /// taken over.
    pub async fn recover(self: &Arc<Self>, handover: Option<Handover>) -> anyhow::Result<usize> {
        if let Some(h) = handover {
            let mut lease = lock(&self.lease);
            *lease = lease.inherited(h.last_ack_boot_ms);
            drop(lease);
            self.ack_commit_index.fetch_max(h.ack_commit_index, Ordering::SeqCst);
        }
        let entries = match std::fs::read_dir(&self.settings.runs_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e).with_context(|| format!("read {}", self.settings.runs_dir.display())),
        };
        let mut adopted = 0;
        for entry in entries.take(LEDGER_ENTRIES_MAX) {
            let dir = entry.context("read a run directory")?.path();
            if let Err(e) = self.recover_run(&dir, handover.is_some()).await.map(|a| adopted += usize::from(a)) {
                warn!(dir = %dir.display(), error = format!("{e:#}"), "recover run directory: forgetting it");
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
        self.renew_lease();
        Ok(adopted)
    }

    /// One run directory of a previous daemon (see [`Agent::recover`]); whether it was taken over.
    async fn recover_run(self: &Arc<Self>, dir: &std::path::Path, handed_over: bool) -> anyhow::Result<bool> {
        let mine = |instance: InstanceId| handed_over && instance == self.instance;
        if let Some(stored) = shepherd::read_json::<StoredReport>(&dir.join("report.json"))? {
            if mine(stored.instance) {
                info!(job = stored.report.job, run = stored.report.run, "re-sending a run report of the previous daemon");
                self.send_report(self.count_report(), stored.report).await;
            } else {
                std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
            }
            return Ok(false);
        }
        let launch = shepherd::read_json::<LaunchRecord>(&dir.join("launch.json"))?
            .with_context(|| format!("no launch.json in {}", dir.display()))?;
        let record = shepherd::read_json::<RunRecord>(&dir.join("spec.json"))?;
        let child = Shepherd::adopt(dir).await?;
        if !mine(launch.instance) {
            // Its instance is gone: the cluster ends its parts when this node registers, so its
            // job must be dead first.
            if let Some(mut child) = child {
                warn!(job = launch.job, run = launch.run, pgid = child.pgid, "killing a run a previous daemon left without a hand-over");
                launcher::signal_group(child.pgid, libc::SIGKILL);
                if let Some((v2, v1)) = record.as_ref().and_then(|r| r.cgroup.clone().map(|v2| (v2, r.cgroups_v1.clone()))) {
                    crate::run::cgroup::JobCgroup::existing(v2, v1).kill_and_remove().await;
                }
                if tokio::time::timeout(Duration::from_millis(ADOPT_KILL_WAIT_MS), child.wait()).await.is_err() {
                    warn!(job = launch.job, run = launch.run, "a killed run of a previous daemon has not ended yet");
                }
            }
            std::fs::remove_dir_all(dir).with_context(|| format!("remove {}", dir.display()))?;
            return Ok(false);
        }
        let (Some(child), Some(record)) = (child, record) else {
            let outcome = match shepherd::read_json::<ExitRecord>(&dir.join("status.json"))? {
                Some(ExitRecord::Exited(code)) => RunOutcome::Exited(code),
                Some(ExitRecord::Signaled(sig)) => RunOutcome::Signaled(sig),
                Some(ExitRecord::Failed(why)) => RunOutcome::LaunchFailed(why),
                None => RunOutcome::Lost("the daemon that started it was replaced before it started".into()),
            };
            info!(job = launch.job, run = launch.run, outcome = ?outcome, "a run ended while its daemon was replaced");
            self.queue_report(self.count_report(), launch.job, launch.run, outcome).await;
            return Ok(false);
        };
        let spec = record.launch;
        let next_step = std::fs::read_to_string(dir.join("next_step")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
        let cgroups_v1 = record.cgroups_v1;
        let cgroup = record.cgroup.map(|p| Arc::new(crate::run::cgroup::JobCgroup::existing(p, cgroups_v1)));
        let tasks = Arc::new(launcher::TaskGroups::default());
        let (stop_tx, stop_rx) = launcher::stop_channel();
        let (pause_tx, _) = launcher::pause_channel();
        // Stopped by the daemon before, it stays stopped, its time limit paused, until the
        // leader says otherwise.
        pause_tx.send_replace(read_pause(dir));
        let base = TaskBase::of(&spec);
        lock(&self.running).insert(
            spec.job,
            Running {
                run: spec.run,
                slots: if record.slots.is_empty() { record.gpus.clone() } else { record.slots },
                gpus: record.gpus,
                pgid: child.pgid,
                start_ticks: child.start_ticks,
                stop_tx,
                pause_tx,
                owner: record.owner,
                hold: spec.hold,
                batch: spec.batch,
                nodes: record.nodes,
                base,
                cgroup: cgroup.clone(),
                tasks: Arc::clone(&tasks),
                steps: BTreeMap::new(),
                step_holds: BTreeMap::new(),
                next_step,
                launched: BTreeMap::new(),
            },
        );
        self.adopt_steps(dir, spec.job, spec.run, &tasks, cgroup.as_ref()).await;
        self.reopen_store(&spec);
        let elapsed_ms = crate::run::procfs::boot_ms().saturating_sub(record.started_boot_ms);
        let span = info_span!("job", job = spec.job, run = spec.run);
        span.in_scope(|| info!(pgid = child.pgid, elapsed_ms, "took the run over from the previous daemon"));
        let agent = Arc::clone(self);
        tokio::spawn(async move { agent.supervise_run(child, spec, stop_rx, cgroup, tasks, elapsed_ms).await }.instrument(span));
        Ok(true)
    }

    /// Serves again, on the same port, the rendezvous store of a run taken over: its processes
    /// know that address. A port taken since leaves them without it (logged).
    fn reopen_store(self: &Arc<Self>, spec: &crate::run::process::LaunchSpec) {
        let Some(at) = spec.env.get("CORRAL_RDZV_ENDPOINT").and_then(|a| a.parse().ok()) else { return };
        let uid = crate::rdzv::run_uid(spec.run_as.as_ref());
        if let Err(e) = self.rdzv.open(spec.job, spec.run, uid, Some(at), self.runs_here(spec.job, spec.run)) {
            warn!(job = spec.job, run = spec.run, error = format!("{e:#}"), "the rendezvous store of a run taken over is not served again");
        }
    }

    /// Follows again, from their start, the logs of the steps a run taken over still has here
    /// (those whose `srun` had not read them to their end).
    async fn adopt_steps(
        &self,
        dir: &std::path::Path,
        job: JobId,
        run: RunNo,
        groups: &Arc<launcher::TaskGroups>,
        cgroup: Option<&Arc<crate::run::cgroup::JobCgroup>>,
    ) {
        let Ok(entries) = std::fs::read_dir(dir.join("steps")) else { return };
        for entry in entries.flatten().take(proto::limits::STEPS_PER_JOB_MAX) {
            let Some(step) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let tasks: usize = std::fs::read_to_string(entry.path().join("tasks")).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0);
            let handle = Step::new(job, run, step, tasks);
            match shepherd::tail_step(dir, step, 0).await {
                Ok(conn) => handle.follow(conn, Arc::clone(groups)),
                Err(e) => {
                    warn!(job, step, error = format!("{e:#}"), "follow the step's output");
                    handle.stop_following();
                }
            }
            // Its cgroups, where it has its own.
            let cgroups = cgroup.and_then(|run| {
                let paths: Vec<PathBuf> = run.paths().iter().map(|p| p.join(format!("step-{step}"))).collect();
                paths.iter().all(|p| p.is_dir()).then(|| (Arc::clone(run), paths))
            });
            // One that ended before the handover is reported again: the log keeps the first.
            self.report_step_end(&handle, cgroups);
            let grant: Option<scheduler::steps::StepGrant> = shepherd::read_json(&entry.path().join(STEP_GRANT_FILE)).ok().flatten();
            if let Some(r) = lock(&self.running).get_mut(&job) {
                if let Some(grant) = grant {
                    // What it holds stays held until it ends.
                    r.step_holds
                        .insert(step, HeldStep { grant, since: std::time::Instant::now(), asked: Default::default(), started: true });
                }
                r.steps.insert(step, handle);
            }
            info!(job, step, tasks, "took the step over");
        }
    }
}
