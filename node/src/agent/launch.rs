//! Launching a run: the checks before it (claim, ledger, freshness, account), its files, GPUs
//! and `--preflight`, and the start of its process through its shepherd.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use proto::{ApiError, Job, JobId, Reply, RunNo, RunOutcome};
use tracing::{info, info_span, warn, Instrument};

use control::agent::LaunchDecision;

use super::ledger::{LaunchClaim, LedgerEntry};
use super::{lock, Agent, Running, TaskBase};
use crate::run::launcher::{self, StopReason};
use crate::run::shepherd::{self, LaunchRecord, RunRecord, Shepherd};

/// The UUIDs CUDA takes for a run's GPUs among this node's `gpus` (whole and shared GPUs by
/// index, MIG instances by (gpu, start slice)) and the numbers the job sees them as (MIG
/// instances as devices of their own); why not, when the allocation names one it lacks.
fn device_ids(gpus: &[proto::GpuInfo], alloc: &proto::Allocation) -> Result<(Vec<String>, Vec<u32>), String> {
    let gpu = |i: u32| gpus.iter().find(|g| g.index == i);
    let uuid = |slot: u32| match scheduler::decode_slot(slot) {
        scheduler::Slot::Gpu(i) | scheduler::Slot::Shard { gpu: i, .. } => gpu(i).map(|g| g.uuid.clone()).ok_or(format!("gpu {i}")),
        scheduler::Slot::Mig { gpu: i, start_slice } => gpu(i)
            .and_then(|g| g.mig.iter().find(|m| m.start_slice == start_slice))
            .map(|m| m.uuid.clone())
            .ok_or(format!("the MIG instance at slice {start_slice} of gpu {i}")),
    };
    let uuids = alloc
        .gpus
        .iter()
        .map(|&slot| uuid(slot).map_err(|what| format!("{what} is not on this node (gone since the job was placed)")))
        .collect::<Result<Vec<_>, _>>()?;
    let ordinals = crate::gpu::mig::device_ordinals(gpus, &alloc.gpus)
        .ok_or_else(|| format!("the devices of slots {:?} cannot be numbered on this node", alloc.gpus))?;
    Ok((uuids, ordinals))
}

/// The longest a preflight may take, connecting included.
const PREFLIGHT_TIMEOUT_MS: u64 = 60_000;

impl Agent {
    /// Starts `job`'s current run unless this node already launched it. Answers with this
    /// instance so the leader can commit who runs it.
    pub fn launch(self: &Arc<Self>, job: Job, nodes: &[(String, String)], checked_ack_index: u64) -> Result<Reply, ApiError> {
        let me = self.node_id();
        // The rank comes from the run as planned: parts of nodes that already ended are gone
        // from `parts` by the time a launch is re-sent.
        let (Some(part), Some(rank)) = (job.parts.iter().find(|p| p.run == job.run && p.alloc.node == me), job.rank_of(me)) else {
            return Err(ApiError::Invalid(format!("job {} run {} has no part on node {me}", job.id, job.run)));
        };
        let alloc = part.alloc.clone();
        let gang_size = job.run_nodes().len();
        let ack = Reply::LaunchAck { job: job.id, run: job.run, instance: self.instance };
        // Claimed before the ledger is read: a call that finds no claim finds the ledger entry
        // of any call that held one before it.
        let Some(_claim) = LaunchClaim::take(&self.launching, (job.id, job.run)) else {
            return Err(ApiError::Unavailable(format!("job {} run {} is being launched on {} already", job.id, job.run, self.name)));
        };
        self.may_launch_now(job.id, job.run, checked_ack_index)?;
        let ledger = self.ledger_mark(job.id, job.run);
        let decision = lock(&self.lease).launch(crate::run::procfs::boot_ms(), ledger);
        match decision {
            LaunchDecision::NotInTouch => {
                return Err(ApiError::Unavailable(format!(
                    "node {} has no recent heartbeat acknowledgement; not starting work",
                    self.name
                )));
            }
            LaunchDecision::StoppedBefore => {
                return Err(ApiError::Denied(format!("job {} run {} was stopped before it started", job.id, job.run)));
            }
            LaunchDecision::AckAgain => return Ok(ack),
            LaunchDecision::ReportLost => {
                let agent = Arc::clone(self);
                let (id, run) = (job.id, job.run);
                let why = control::agent::LOST_EARLIER_INSTANCE.to_string();
                let counted = self.count_report();
                tokio::spawn(async move { agent.queue_report(counted, id, run, RunOutcome::Lost(why)).await });
                return Err(ApiError::Denied(format!("job {} run {} was launched by an earlier instance of this node", job.id, job.run)));
            }
            LaunchDecision::Start => {}
        }
        let (uuids, ordinals) = match device_ids(&lock(&self.gpus), &alloc) {
            Ok(ids) => ids,
            // A GPU or MIG instance the plan names is gone (off the bus, relaid since): not the
            // job's fault, and asking again cannot help. The part is lost: repaired on a spare,
            // or the job requeued, as for a node lost.
            Err(why) => return self.refuse(&job, ack, RunOutcome::Lost(why)),
        };
        let run_as = match self.account_of(&job) {
            Ok(account) => account,
            Err(why) => return self.refuse(&job, ack, RunOutcome::LaunchFailed(why)),
        };
        let store = match self.open_store(&job, crate::rdzv::run_uid(run_as.as_ref())) {
            Ok(store) => store,
            Err(e) => return self.refuse(&job, ack, RunOutcome::LaunchFailed(format!("{e:#}"))),
        };
        let ctx = launcher::LaunchContext {
            store: store.as_deref(),
            run_as: run_as.as_ref(),
            node_name: &self.name,
            node_rank: rank,
            nodes,
            gpu_indices: &ordinals,
            gpu_uuids: &uuids,
            jobs_dir: &self.settings.job_files_dir,
            checkpoint_root: &self.settings.checkpoint_root,
            nccl: &self.settings.nccl,
            cluster_name: &self.settings.cluster_name,
            holder: &self.settings.exe,
            local_socket: self.settings.local_socket.as_deref(),
            job_hosts: self.settings.job_hosts.as_deref(),
            job_commands: self.settings.job_commands.as_deref(),
        };
        let spec = launcher::prepare(&job, &ctx).map_err(|e| ApiError::Internal(format!("{e:#}")))?;
        self.record_start(&job, &spec)?;
        self.open_run_dir(job.id, job.run).map_err(|e| ApiError::Internal(format!("{e:#}")))?;
        let span = info_span!("job", job = job.id, run = job.run);
        let (stop_tx, stop_rx) = launcher::stop_channel();
        let preflight = job.spec.preflight.as_ref().filter(|_| gang_size > 1).map(|p| crate::run::preflight::Preflight {
            rank,
            hosts: nodes.iter().map(|(name, _)| name.clone()).collect(),
            master_host: nodes.first().map(|(_, addr)| launcher::host_of(addr)).unwrap_or_default(),
            port: job.master_port.unwrap_or(0),
            bytes: p.bytes,
            min_mbps: p.min_mbps,
            timeout: Duration::from_millis(PREFLIGHT_TIMEOUT_MS),
        });
        self.hold_gpus(&job, &alloc, &spec, nodes, stop_tx);
        let limits = crate::run::cgroup::Limits {
            cpus: job.spec.cpus_per_task.saturating_mul(job.spec.ntasks_per_node),
            memory_mib: job.spec.mem_mib,
        };
        let Some(preflight) = preflight else {
            self.start_process(spec, limits, stop_rx, span);
            return Ok(ack);
        };
        self.preflight_then_start(preflight, spec, limits, stop_rx, span);
        Ok(ack)
    }

    /// Opens the job's rendezvous store on this node if it has one (`JobSpec::corral_store`),
    /// served to user `uid` while this run's part is listed here; its address.
    fn open_store(self: &Arc<Self>, job: &Job, uid: u32) -> anyhow::Result<Option<String>> {
        if !job.spec.corral_store() {
            return Ok(None);
        }
        let alive = self.runs_here(job.id, job.run);
        Ok(Some(self.rdzv.open(job.id, job.run, uid, None, alive)?.to_string()))
    }

    /// Whether run `run` of `job` is listed here, asked later (the agent may be gone by then).
    pub(super) fn runs_here(self: &Arc<Self>, job: JobId, run: RunNo) -> impl Fn() -> bool + Send + Sync + 'static {
        let agent = Arc::downgrade(self);
        move || agent.upgrade().is_some_and(|a| lock(&a.running).get(&job).is_some_and(|r| r.run == run))
    }

    /// Records in the launch ledger that this instance starts the run, unless a stop that came
    /// while the launch was prepared refused it for good (and reported it gone).
    fn record_start(&self, job: &Job, spec: &crate::run::process::LaunchSpec) -> Result<(), ApiError> {
        let mut ledger = lock(&self.ledger);
        if ledger.entries.contains_key(&(job.id, job.run)) {
            return Err(ApiError::Denied(format!("job {} run {} was stopped before it started", job.id, job.run)));
        }
        let entry = LedgerEntry {
            job: job.id,
            run: job.run,
            instance: self.instance,
            stdout: spec.stdout_path.clone(),
            stderr: spec.stderr_path.clone(),
            refused: false,
        };
        ledger.record(entry).map_err(|e| ApiError::Internal(format!("{e:#}")))
    }

    /// Lists the run as running here: until its process starts it holds its GPUs with no
    /// process group (pgid 0).
    fn hold_gpus(
        &self,
        job: &Job,
        alloc: &proto::Allocation,
        spec: &crate::run::process::LaunchSpec,
        nodes: &[(String, String)],
        stop_tx: launcher::StopSender,
    ) {
        let gpus: Vec<u32> = alloc.gpus.iter().map(|slot| scheduler::decode_slot(*slot).gpu()).collect();
        let running = Running {
            run: job.run,
            gpus,
            slots: alloc.gpus.clone(),
            pgid: 0,
            start_ticks: 0,
            stop_tx,
            pause_tx: launcher::pause_channel().0,
            owner: job.spec.user.clone(),
            hold: spec.hold,
            batch: spec.batch,
            nodes: nodes.to_vec(),
            base: TaskBase::of(spec),
            cgroup: None,
            tasks: Arc::new(launcher::TaskGroups::default()),
            steps: BTreeMap::new(),
            step_holds: BTreeMap::new(),
            next_step: 0,
            launched: BTreeMap::new(),
        };
        lock(&self.running).insert(job.id, running);
    }

    /// Runs a gang's `--preflight` network check on this node, then starts the run; a failed
    /// check holds the job, a stop during it ends the run.
    fn preflight_then_start(
        self: &Arc<Self>,
        preflight: crate::run::preflight::Preflight,
        spec: crate::run::process::LaunchSpec,
        limits: crate::run::cgroup::Limits,
        mut stop_rx: launcher::StopReceiver,
        span: tracing::Span,
    ) {
        let agent = Arc::clone(self);
        tokio::spawn(
            async move {
                info!(rank = preflight.rank, port = preflight.port, "preflight started");
                let verdict = tokio::select! {
                    verdict = crate::run::preflight::run(&preflight) => verdict,
                    reason = stop_rx.next() => {
                        let counted = agent.end_run(spec.job);
                        let outcome = if reason == Some(StopReason::NodeStopping) {
                            RunOutcome::Lost("its node stopped (corrald shut down) in its preflight".into())
                        } else if agent.out_of_touch() {
                            RunOutcome::Lost(format!("stopped in its preflight while {} was out of touch", agent.name))
                        } else {
                            RunOutcome::Killed
                        };
                        agent.queue_report(counted, spec.job, spec.run, outcome).await;
                        return;
                    }
                };
                match verdict {
                    Ok(report) => {
                        info!("preflight passed");
                        let mut spec = spec;
                        if let Err(e) = crate::run::process::write_output_head(&mut spec, report.as_bytes()) {
                            warn!(error = format!("{e:#}"), "write the preflight report");
                        }
                        agent.start_process(spec, limits, stop_rx, tracing::Span::current());
                    }
                    Err(why) => {
                        warn!(reason = %why, "preflight failed: the job is held");
                        let _ = crate::run::process::append_output(
                            &spec,
                            &spec.stderr_path,
                            format!("corral preflight: failed: {why}\n").as_bytes(),
                        );
                        let counted = agent.end_run(spec.job);
                        agent.queue_report(counted, spec.job, spec.run, RunOutcome::PreflightFailed(why)).await;
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Whether a launch holding its claim may go on: not once a hand-over or a graceful stop
    /// began (checked under the claim, so a stop that found no claim and no run finds none
    /// later), nor once
    /// this node was acknowledged anew since the run was found current (found by a chaos run: a
    /// node paused between the check and here, declared down meanwhile and its run started
    /// elsewhere, was acknowledged again on waking and started the stale run too). The leader
    /// sends the launch again, checked against what the cluster decided since.
    fn may_launch_now(&self, job: JobId, run: RunNo, checked_ack_index: u64) -> Result<(), ApiError> {
        self.takes_new_work()?;
        if self.ack_commit_index() > checked_ack_index {
            return Err(ApiError::Unavailable(format!(
                "job {job} run {run}: the cluster moved on since the launch was checked; not starting it on this check"
            )));
        }
        Ok(())
    }

    /// Records the run as taken by this instance (a launch sent again is acknowledged, never
    /// started) and reports it ended with `outcome`, without starting anything.
    fn refuse(self: &Arc<Self>, job: &Job, ack: Reply, outcome: RunOutcome) -> Result<Reply, ApiError> {
        warn!(job = job.id, run = job.run, outcome = ?outcome, "launch refused");
        let entry = LedgerEntry {
            job: job.id,
            run: job.run,
            instance: self.instance,
            stdout: PathBuf::new(),
            stderr: PathBuf::new(),
            refused: false,
        };
        lock(&self.ledger).record(entry).map_err(|e| ApiError::Internal(format!("{e:#}")))?;
        let agent = Arc::clone(self);
        let (id, run) = (job.id, job.run);
        let counted = self.count_report();
        tokio::spawn(async move { agent.queue_report(counted, id, run, outcome).await });
        Ok(ack)
    }

    /// Whom the job runs as: the uid the submitting node's kernel named, else the user's name
    /// looked up here (None: the daemon does not switch users). A user without an account on
    /// this node cannot run here: the error says why.
    fn account_of(&self, job: &Job) -> Result<Option<crate::run::identity::Account>, String> {
        if !self.settings.run_as_user {
            return Ok(None);
        }
        let account = match job.spec.uid {
            Some(uid) => crate::run::identity::by_uid(uid),
            None => crate::run::identity::by_name(&job.spec.user),
        };
        match (account, job.spec.uid) {
            (Some(a), _) if a.name == job.spec.user => Ok(Some(a)),
            (_, Some(uid)) => Err(format!("no account named {} with uid {uid} on node {}", job.spec.user, self.name)),
            (_, None) => Err(format!("no account named {} on node {}", job.spec.user, self.name)),
        }
    }

    /// Creates the run's directory, which says that this instance took the run (`shepherd`).
    fn open_run_dir(&self, job: JobId, run: RunNo) -> anyhow::Result<()> {
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, run);
        std::fs::create_dir_all(&dir).with_context(|| format!("create run directory {}", dir.display()))?;
        shepherd::write_json(&dir.join("launch.json"), &LaunchRecord { format: shepherd::RECORD_FORMAT, job, run, instance: self.instance })
    }

    /// Starts the run's process through its shepherd (its `Running` entry is in place) and
    /// supervises it to its end.
    fn start_process(
        self: &Arc<Self>,
        spec: crate::run::process::LaunchSpec,
        limits: crate::run::cgroup::Limits,
        stop_rx: launcher::StopReceiver,
        span: tracing::Span,
    ) {
        // The device files of this node's GPUs the run was not given (fenced where the devices
        // controller is available).
        let given: Vec<u32> = lock(&self.running).get(&spec.job).filter(|r| r.run == spec.run).map(|r| r.gpus.clone()).unwrap_or_default();
        let deny = self.devices_denied(&given);
        let cgroup = match self.settings.cgroups.as_ref().map(|c| c.create(spec.job, spec.run, &limits, &deny)).transpose() {
            Ok(c) => c.map(Arc::new),
            Err(e) => {
                span.in_scope(|| warn!(error = format!("{e:#}"), "job cgroup"));
                let counted = self.end_run(spec.job);
                let agent = Arc::clone(self);
                tokio::spawn(async move {
                    agent
                        .queue_report(counted, spec.job, spec.run, RunOutcome::LaunchFailed(format!("create the job's cgroup: {e:#}")))
                        .await
                });
                return;
            }
        };
        let (owner, nodes, gpus) = match lock(&self.running).get(&spec.job).filter(|r| r.run == spec.run) {
            Some(r) => (r.owner.clone(), r.nodes.clone(), (r.gpus.clone(), r.slots.clone())),
            None => (String::new(), Vec::new(), (Vec::new(), Vec::new())),
        };
        let (gpus, slots) = gpus;
        let record = RunRecord {
            format: shepherd::RECORD_FORMAT,
            instance: self.instance,
            launch: spec.clone(),
            cgroup: cgroup.as_ref().map(|c| c.path.clone()),
            cgroups_v1: cgroup.as_ref().map(|c| c.v1.clone()).unwrap_or_default(),
            daemon_file: self.settings.daemon_file.clone(),
            owner,
            nodes,
            gpus,
            slots,
            started_boot_ms: crate::run::procfs::boot_ms(),
        };
        let agent = Arc::clone(self);
        tokio::spawn(
            async move {
                let dir = shepherd::run_dir(&agent.settings.runs_dir, spec.job, spec.run);
                match Shepherd::spawn(&agent.settings.exe, agent.settings.spawner.as_ref(), &dir, &record).await {
                    Ok(child) => {
                        let (pgid, start_ticks) = (child.pgid, child.start_ticks);
                        let tasks = {
                            let mut running = lock(&agent.running);
                            match running.get_mut(&spec.job).filter(|r| r.run == spec.run) {
                                Some(r) => {
                                    r.pgid = pgid;
                                    r.start_ticks = start_ticks;
                                    r.cgroup = cgroup.clone();
                                    Arc::clone(&r.tasks)
                                }
                                None => Arc::new(launcher::TaskGroups::default()),
                            }
                        };
                        agent.renew_lease();
                        info!(pgid, hold = spec.hold, "job started");
                        agent.supervise_run(child, spec, stop_rx, cgroup, tasks, 0).await;
                    }
                    Err(e) => {
                        warn!(error = format!("{e:#}"), "job failed to start");
                        if let Some(cgroup) = cgroup {
                            cgroup.kill_and_remove().await;
                        }
                        let counted = agent.end_run(spec.job);
                        agent.queue_report(counted, spec.job, spec.run, RunOutcome::LaunchFailed(format!("{e:#}"))).await;
                    }
                }
            }
            .instrument(span),
        );
    }
}

#[cfg(test)]
mod tests {
    use proto::{Allocation, GpuInfo, MigInstance};

    use super::device_ids;

    fn gpu(index: u32, mig: Vec<MigInstance>) -> GpuInfo {
        GpuInfo { index, uuid: format!("GPU-{index}"), mig_enabled: !mig.is_empty(), mig, ..GpuInfo::default() }
    }

    fn alloc(gpus: Vec<u32>) -> Allocation {
        Allocation { node: 1, gpus, cpus: 1, mem_mib: 0 }
    }

    #[test]
    fn a_gpu_or_mig_instance_gone_since_placement_is_named_not_started() {
        let instance =
            MigInstance { uuid: "MIG-a".into(), profile: "3g.40gb".into(), start_slice: 4, size_slices: 4, ..MigInstance::default() };
        let gpus = vec![gpu(0, Vec::new()), gpu(1, vec![instance])];
        assert_eq!(device_ids(&gpus, &alloc(vec![0])), Ok((vec!["GPU-0".to_string()], vec![0])));
        assert_eq!(device_ids(&gpus, &alloc(vec![proto::slot::mig_slot(1, 4)])), Ok((vec!["MIG-a".to_string()], vec![1])));
        let gone = device_ids(&gpus, &alloc(vec![0, 2])).expect_err("gpu 2 is gone");
        assert!(gone.contains("gpu 2 is not on this node"), "{gone}");
        let relaid = device_ids(&gpus, &alloc(vec![proto::slot::mig_slot(1, 0)])).expect_err("the instance at slice 0 is gone");
        assert!(relaid.contains("the MIG instance at slice 0 of gpu 1"), "{relaid}");
    }
}
