//! The agent side of a node: launches the runs the leader committed, at most once per (job,
//! run), supervises them, reports how they ended, and heartbeats the leader.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use proto::{ApiError, GpuInfo, InstanceId, Job, JobId, LogStream, NodeId, Reply, Request, Response, RunNo, RunOutcome};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tracing::{debug, info, info_span, warn, Instrument};

use control::agent::{LaunchDecision, StopDecision};

use crate::launcher::{self, StopReason};
use crate::link::{LeaderLink, LinkError};
use crate::shepherd::{self, ExitRecord, Handover, LaunchRecord, RunRecord, Shepherd};
use crate::step::Step;

/// Reports of ended runs waiting to be committed.
const REPORT_QUEUE_MAX: usize = 4096;
/// Step ends queued for the leader at most (a full queue holds the steps' watchers back).
const STEP_END_QUEUE_MAX: usize = 4096;
/// The longest a preflight may take, connecting included.
const PREFLIGHT_TIMEOUT_MS: u64 = 60_000;
/// How long a starting daemon waits for a run of a dead instance to die once killed.
const ADOPT_KILL_WAIT_MS: u64 = 10_000;
/// Entries of the launch ledger kept in memory (older ones only matter for `corral logs`).
const LEDGER_ENTRIES_MAX: usize = 10_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct LedgerEntry {
    job: JobId,
    run: RunNo,
    instance: InstanceId,
    stdout: PathBuf,
    stderr: PathBuf,
    /// Stopped before its launch arrived: a later launch of this run is refused.
    #[serde(default)]
    refused: bool,
}

/// Every (job, run) this node ever launched, on disk before the process starts, so a run is
/// launched at most once even across restarts of `corrald`.
struct Ledger {
    file: std::fs::File,
    entries: BTreeMap<(JobId, RunNo), LedgerEntry>,
}

impl Ledger {
    fn open(path: PathBuf) -> anyhow::Result<Ledger> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("open launch ledger at {}", path.display()))?;
        let mut text = String::new();
        file.read_to_string(&mut text).with_context(|| format!("read launch ledger at {}", path.display()))?;
        let mut entries = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            match serde_json::from_str::<LedgerEntry>(line) {
                Ok(e) => {
                    entries.insert((e.job, e.run), e);
                }
                // A torn last line after a crash: that launch never started.
                Err(e) => warn!(line = n + 1, error = %e, "skip unreadable launch ledger line"),
            }
        }
        let mut ledger = Ledger { file, entries };
        ledger.trim();
        Ok(ledger)
    }

    fn record(&mut self, entry: LedgerEntry) -> anyhow::Result<()> {
        let mut line = serde_json::to_string(&entry).context("encode ledger entry")?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).context("append to launch ledger")?;
        self.file.sync_data().context("sync launch ledger")?;
        self.entries.insert((entry.job, entry.run), entry);
        self.trim();
        Ok(())
    }

    fn trim(&mut self) {
        while self.entries.len() > LEDGER_ENTRIES_MAX {
            self.entries.pop_first();
        }
    }

    fn latest(&self, job: JobId) -> Option<&LedgerEntry> {
        self.entries.range((job, 0)..=(job, RunNo::MAX)).next_back().map(|(_, e)| e)
    }
}

struct Running {
    run: RunNo,
    /// GPU indices (MIG instances by their GPU) this run holds.
    gpus: Vec<u32>,
    /// Process group (and pid of the batch shell).
    pgid: i32,
    /// The batch shell's start time, so the watchdog never kills a recycled pid.
    start_ticks: u64,
    stop_tx: launcher::StopSender,
    /// The run's suspension as the leader last told it (`scontrol suspend|resume`).
    pause_tx: tokio::sync::watch::Sender<launcher::Pause>,
    /// The user the job belongs to: only they (or an admin) may start and read its steps.
    owner: String,
    /// Only holds resources for steps (a batch job's node other than the first).
    hold: bool,
    /// A batch job (`sbatch`): signals go to its steps, not its script.
    batch: bool,
    /// Name and address of every node of the run, in rank order.
    nodes: Vec<(String, String)>,
    /// What the run's process got, which its step tasks here start from.
    base: Arc<TaskBase>,
    /// The run's cgroup once its process started; step tasks join it.
    cgroup: Option<Arc<crate::cgroup::JobCgroup>>,
    /// Process groups of its step tasks here.
    tasks: Arc<launcher::TaskGroups>,
    /// Its steps with tasks here.
    steps: BTreeMap<u32, Arc<Step>>,
    /// Next step number, on the node that numbers them (the batch script's).
    next_step: u32,
    /// What steps hold of the job's CPUs, memory and GPUs here, by step: from their grant
    /// (a start, or a hold before it) until their tasks here end.
    step_holds: BTreeMap<u32, HeldStep>,
}

/// A step's share of its job on this node ([`scheduler::steps::grant_step`]), held until its
/// tasks here end; one that no start took is dropped after [`proto::limits::STEP_HOLD_MS_MAX`].
struct HeldStep {
    grant: scheduler::steps::StepGrant,
    since: std::time::Instant,
    /// Its tasks here started: it ends with them (or when its step is gone here, read to
    /// its end), not by time.
    started: bool,
    /// What was asked, so that a step number given back and used again is granted anew.
    asked: Asked,
}

/// What a step asks of a node: CPUs per task, memory, GPUs, exact, tasks, overlap, overcommit.
type Asked = (u32, proto::StepMemory, Option<u32>, bool, u32, bool, bool);

impl HeldStep {
    fn asked(spec: &proto::StepSpec, tasks: u32) -> Asked {
        (spec.cpus_per_task, spec.memory, spec.gpus_per_node, spec.exact, tasks, spec.overlap, spec.overcommit)
    }
}

/// Name and address of every node of a run, in rank order.
pub type RunNodes = Vec<(String, String)>;

/// A step numbered on the node of its batch script.
pub struct NumberedStep {
    pub run: RunNo,
    pub step: u32,
    /// The run's nodes (name, address), in rank order.
    pub nodes: RunNodes,
    /// The job's `MASTER_PORT` (reserved for it on its first node).
    pub master_port: Option<u16>,
}

/// The part of a run's launch its step tasks start from.
struct TaskBase {
    env: BTreeMap<String, String>,
    workdir: PathBuf,
    run_as: Option<crate::identity::Account>,
    hosts_file: Option<PathBuf>,
}

impl TaskBase {
    /// What the step tasks of the run `spec` launches start from.
    fn of(spec: &launcher::LaunchSpec) -> Arc<TaskBase> {
        Arc::new(TaskBase {
            env: spec.env.clone(),
            workdir: spec.workdir.clone(),
            run_as: spec.run_as.clone(),
            hosts_file: spec.hosts_file.clone(),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Report {
    job: JobId,
    run: RunNo,
    outcome: RunOutcome,
    usage: proto::GpuUsage,
}

/// A report kept in its run's directory (`report.json`) until a leader has it, so that a daemon
/// that takes this one's runs over sends it again.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StoredReport {
    instance: InstanceId,
    report: Report,
}

/// What the agent needs beyond its identity: where jobs live and how they are stopped.
pub struct AgentSettings {
    /// Where the launch ledger lives (`jobs_dir`).
    pub jobs_dir: PathBuf,
    /// Where each run's script and hostfile go, a directory per job (`job_files_dir`).
    pub job_files_dir: PathBuf,
    pub checkpoint_root: PathBuf,
    pub nccl: launcher::NcclEnv,
    pub stop: launcher::StopTimings,
    /// Stop every job when no leader answered for this long.
    pub fence_after_ms: u64,
    pub cluster_name: String,
    /// The lease the watchdog process enforces (see `watchdog`).
    pub lease_path: PathBuf,
    /// Run each job as its submitting user (needs root); otherwise as this daemon's user.
    pub run_as_user: bool,
    /// Where job cgroups go; none when cgroup v2 is not usable here.
    pub cgroups: Option<crate::cgroup::JobCgroups>,
    /// This `corrald`'s executable: it holds a batch job's other nodes (`corrald --hold`) and
    /// shepherds runs (`corrald --shepherd`).
    pub exe: PathBuf,
    /// Forks runs' shepherds cheaply (see `spawner`); none: each is exec'd from `exe`.
    pub spawner: Option<Arc<crate::spawner::Spawner>>,
    /// The device file of each GPU (by index), denied to runs not given that GPU where the
    /// cgroup v1 devices controller is available.
    pub gpu_device_files: BTreeMap<u32, PathBuf>,
    /// Each run's directory on this node (`shepherd`), `JOBS_DIR/runs`.
    pub runs_dir: PathBuf,
    /// Which daemon runs this node's jobs (`shepherd::DaemonRecord`), `JOBS_DIR/daemon.json`.
    pub daemon_file: PathBuf,
    /// This node's local socket, named in jobs' `CORRAL_SOCKET`.
    pub local_socket: Option<PathBuf>,
    /// The hosts file jobs see as `/etc/hosts` (`job_hosts_file`; only as root).
    pub job_hosts: Option<PathBuf>,
}

pub struct Agent {
    pub name: String,
    pub instance: InstanceId,
    node_id: AtomicU64,
    gpus: Vec<GpuInfo>,
    settings: AgentSettings,
    running: Mutex<BTreeMap<JobId, Running>>,
    ledger: Mutex<Ledger>,
    /// Runs a `launch` call is starting now (see [`LaunchClaim`]).
    launching: Mutex<BTreeSet<(JobId, RunNo)>>,
    reports_tx: mpsc::Sender<Report>,
    reports_rx: Mutex<Option<mpsc::Receiver<Report>>>,
    /// Ends of steps' tasks here, for the leader's accounting (`step_end_loop`).
    step_ends_tx: mpsc::Sender<proto::StepEnd>,
    step_ends_rx: Mutex<Option<mpsc::Receiver<proto::StepEnd>>>,
    /// When a leader last acknowledged a heartbeat; none yet for a new instance.
    last_ack: Mutex<Option<std::time::Instant>>,
    /// The leader's commit index in its last acknowledgement.
    ack_commit_index: AtomicU64,
    /// The term of the last heartbeat acknowledgement (a new one: ask for the members again).
    ack_term: AtomicU64,
    /// GPU utilization and memory of running jobs, sampled.
    accounting: Mutex<crate::gpu::JobGpuAccounting>,
    /// Serializes lease writes.
    lease_write: Mutex<()>,
    /// Reports queued and not yet committed by a leader.
    reports_pending: AtomicU64,
    /// Set once this daemon hands its runs over to the next one: it starts nothing more.
    handing_over: std::sync::atomic::AtomicBool,
    /// Set once a graceful stop begins: it launches nothing more (checked under a launch's
    /// claim, so `shut_down` sees every launch that got past it).
    stopping: std::sync::atomic::AtomicBool,
    /// The stdin of step tasks here that read it.
    stdin_feeds: crate::step_stdin::Feeds,
}

/// One `launch` call's hold on a (job, run) from before it reads the ledger until it returns. A
/// leader re-sends a launch it got no answer to, and launches run on a blocking pool: without
/// this, two calls for one run could both find the ledger without it and both start it (seen:
/// one node started a run twice, 5 ms apart, under a 10,000-task array). A second call while
/// the first holds the claim is answered "unavailable" and re-sent; by then the ledger has it.
struct LaunchClaim<'a> {
    claims: &'a Mutex<BTreeSet<(JobId, RunNo)>>,
    key: (JobId, RunNo),
}

impl<'a> LaunchClaim<'a> {
    fn take(claims: &'a Mutex<BTreeSet<(JobId, RunNo)>>, key: (JobId, RunNo)) -> Option<LaunchClaim<'a>> {
        // Not `then_some`: it would build (and drop, so release) a claim for a call turned away.
        let claimed = lock(claims).insert(key);
        claimed.then(|| LaunchClaim { claims, key })
    }
}

impl Drop for LaunchClaim<'_> {
    fn drop(&mut self) {
        lock(self.claims).remove(&self.key);
    }
}

/// A run end counted in `reports_pending` before its run left `running` (or, for a run that
/// never started, before its launch let go of its claim): a graceful stop that finds neither a
/// run nor a pending report knows nothing is left to report. Spent by `queue_report`.
#[must_use]
struct Counted(());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A ledger entry as `control::agent` reads it, for the daemon instance `instance`.
fn ledger_mark(entry: Option<&LedgerEntry>, instance: InstanceId) -> control::agent::Ledger {
    control::agent::Ledger::of(entry.map(|e| (e.instance, e.refused)), instance)
}

/// `user` (none: root on a node, or a node) may act on the steps of `owner`'s job.
fn owner_may(user: Option<&str>, owner: &str, job: JobId) -> Result<(), ApiError> {
    match user {
        Some(u) if u != owner => Err(ApiError::Denied(format!("user {u} may not use the steps of job {job} of user {owner}"))),
        _ => Ok(()),
    }
}

impl Agent {
    pub fn new(name: String, instance: InstanceId, gpus: Vec<GpuInfo>, settings: AgentSettings) -> anyhow::Result<Arc<Agent>> {
        let ledger = Ledger::open(settings.jobs_dir.join("launched.jsonl"))?;
        let (reports_tx, reports_rx) = mpsc::channel(REPORT_QUEUE_MAX);
        let (step_ends_tx, step_ends_rx) = mpsc::channel(STEP_END_QUEUE_MAX);
        Ok(Arc::new(Agent {
            name,
            instance,
            node_id: AtomicU64::new(0),
            gpus,
            settings,
            running: Mutex::new(BTreeMap::new()),
            ledger: Mutex::new(ledger),
            launching: Mutex::new(BTreeSet::new()),
            reports_tx,
            reports_rx: Mutex::new(Some(reports_rx)),
            step_ends_tx,
            step_ends_rx: Mutex::new(Some(step_ends_rx)),
            last_ack: Mutex::new(None),
            ack_commit_index: AtomicU64::new(0),
            ack_term: AtomicU64::new(0),
            accounting: Mutex::new(crate::gpu::JobGpuAccounting::default()),
            lease_write: Mutex::new(()),
            reports_pending: AtomicU64::new(0),
            handing_over: std::sync::atomic::AtomicBool::new(false),
            stopping: std::sync::atomic::AtomicBool::new(false),
            stdin_feeds: crate::step_stdin::Feeds::default(),
        }))
    }

    /// Whether this node runs jobs in cgroups (its process tracking and task confinement).
    pub fn confines_jobs(&self) -> bool {
        self.settings.cgroups.is_some()
    }

    pub fn set_node_id(&self, id: NodeId) {
        self.node_id.store(id, Ordering::SeqCst);
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id.load(Ordering::SeqCst)
    }

    pub fn running(&self) -> Vec<(JobId, RunNo)> {
        lock(&self.running).iter().map(|(j, r)| (*j, r.run)).collect()
    }

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
        match control::agent::decide_launch(self.ack_age_ms(), self.settings.fence_after_ms, ledger) {
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
        let (uuids, ordinals) = self.device_ids(&job, &alloc)?;
        let run_as = match self.account_of(&job) {
            Ok(account) => account,
            Err(why) => {
                warn!(job = job.id, run = job.run, reason = %why, "launch refused");
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
                tokio::spawn(async move { agent.queue_report(counted, id, run, RunOutcome::LaunchFailed(why)).await });
                return Ok(ack);
            }
        };
        let ctx = launcher::LaunchContext {
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
        };
        let spec = launcher::prepare(&job, &ctx).map_err(|e| ApiError::Internal(format!("{e:#}")))?;
        self.record_start(&job, &spec)?;
        self.open_run_dir(job.id, job.run).map_err(|e| ApiError::Internal(format!("{e:#}")))?;
        let span = info_span!("job", job = job.id, run = job.run);
        let (stop_tx, stop_rx) = launcher::stop_channel();
        let preflight = job.spec.preflight.as_ref().filter(|_| gang_size > 1).map(|p| crate::preflight::Preflight {
            rank,
            hosts: nodes.iter().map(|(name, _)| name.clone()).collect(),
            master_host: nodes.first().map(|(_, addr)| launcher::host_of(addr)).unwrap_or_default(),
            port: job.master_port.unwrap_or(0),
            bytes: p.bytes,
            min_mbps: p.min_mbps,
            timeout: Duration::from_millis(PREFLIGHT_TIMEOUT_MS),
        });
        self.hold_gpus(&job, &alloc, &spec, nodes, stop_tx);
        let limits =
            crate::cgroup::Limits { cpus: job.spec.cpus_per_task.saturating_mul(job.spec.ntasks_per_node), memory_mib: job.spec.mem_mib };
        let Some(preflight) = preflight else {
            self.start_process(spec, limits, stop_rx, span);
            return Ok(ack);
        };
        self.preflight_then_start(preflight, spec, limits, stop_rx, span);
        Ok(ack)
    }

    /// Records in the launch ledger that this instance starts the run, unless a stop that came
    /// while the launch was prepared refused it for good (and reported it gone).
    fn record_start(&self, job: &Job, spec: &launcher::LaunchSpec) -> Result<(), ApiError> {
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
        spec: &launcher::LaunchSpec,
        nodes: &[(String, String)],
        stop_tx: launcher::StopSender,
    ) {
        let gpus: Vec<u32> = alloc
            .gpus
            .iter()
            .map(|slot| match scheduler::decode_slot(*slot) {
                scheduler::Slot::Gpu(i) => i,
                scheduler::Slot::Mig { gpu, .. } => gpu,
            })
            .collect();
        let running = Running {
            run: job.run,
            gpus,
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
        };
        lock(&self.running).insert(job.id, running);
    }

    /// Runs a gang's `--preflight` network check on this node, then starts the run; a failed
    /// check holds the job, a stop during it ends the run.
    fn preflight_then_start(
        self: &Arc<Self>,
        preflight: crate::preflight::Preflight,
        spec: launcher::LaunchSpec,
        limits: crate::cgroup::Limits,
        mut stop_rx: launcher::StopReceiver,
        span: tracing::Span,
    ) {
        let agent = Arc::clone(self);
        tokio::spawn(
            async move {
                info!(rank = preflight.rank, port = preflight.port, "preflight started");
                let verdict = tokio::select! {
                    verdict = crate::preflight::run(&preflight) => verdict,
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
                        if let Err(e) = launcher::write_output_head(&mut spec, report.as_bytes()) {
                            warn!(error = format!("{e:#}"), "write the preflight report");
                        }
                        agent.start_process(spec, limits, stop_rx, tracing::Span::current());
                    }
                    Err(why) => {
                        warn!(reason = %why, "preflight failed: the job is held");
                        let _ = launcher::append_output(&spec, &spec.stderr_path, format!("corral preflight: failed: {why}\n").as_bytes());
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

    /// Refuses new work once this daemon hands its runs over or stops gracefully.
    fn takes_new_work(&self) -> Result<(), ApiError> {
        if self.handing_over.load(Ordering::SeqCst) {
            return Err(ApiError::Unavailable(format!("node {} is handing its runs over to a new corrald", self.name)));
        }
        if self.stopping.load(Ordering::SeqCst) {
            return Err(ApiError::Unavailable(format!("node {} is stopping: it starts nothing more", self.name)));
        }
        Ok(())
    }

    /// The UUIDs CUDA takes for a run's GPUs on this node (whole GPUs by index, MIG instances by
    /// (gpu, start slice)) and the numbers the job sees them as (MIG instances as devices of
    /// their own).
    fn device_ids(&self, job: &Job, alloc: &proto::Allocation) -> Result<(Vec<String>, Vec<u32>), ApiError> {
        let unknown = || ApiError::Invalid(format!("job {} names a gpu or mig instance this node does not have", job.id));
        let uuids: Vec<String> = alloc
            .gpus
            .iter()
            .map(|slot| match scheduler::decode_slot(*slot) {
                scheduler::Slot::Gpu(i) => self.gpus.iter().find(|g| g.index == i).map(|g| g.uuid.clone()),
                scheduler::Slot::Mig { gpu, start_slice } => self
                    .gpus
                    .iter()
                    .find(|g| g.index == gpu)
                    .and_then(|g| g.mig.iter().find(|m| m.start_slice == start_slice))
                    .map(|m| m.uuid.clone()),
            })
            .collect::<Option<_>>()
            .ok_or_else(unknown)?;
        let ordinals = crate::gpu::mig::device_ordinals(&self.gpus, &alloc.gpus).ok_or_else(unknown)?;
        Ok((uuids, ordinals))
    }

    /// Whom the job runs as: the uid the submitting node's kernel named, else the user's name
    /// looked up here (None: the daemon does not switch users). A user without an account on
    /// this node cannot run here: the error says why.
    fn account_of(&self, job: &Job) -> Result<Option<crate::identity::Account>, String> {
        if !self.settings.run_as_user {
            return Ok(None);
        }
        let account = match job.spec.uid {
            Some(uid) => crate::identity::by_uid(uid),
            None => crate::identity::by_name(&job.spec.user),
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
        spec: launcher::LaunchSpec,
        limits: crate::cgroup::Limits,
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
            Some(r) => (r.owner.clone(), r.nodes.clone(), r.gpus.clone()),
            None => (String::new(), Vec::new(), Vec::new()),
        };
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
            started_boot_ms: crate::watchdog::boot_ms(),
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

    /// Supervises a started run to its end (`elapsed_ms` into it), then reports it.
    async fn supervise_run(
        self: Arc<Self>,
        child: Shepherd,
        spec: launcher::LaunchSpec,
        stop_rx: launcher::StopReceiver,
        cgroup: Option<Arc<crate::cgroup::JobCgroup>>,
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

    /// Counts one report as pending (see [`Counted`]).
    fn count_report(&self) -> Counted {
        self.reports_pending.fetch_add(1, Ordering::SeqCst);
        Counted(())
    }

    /// Takes `job`'s run out of `running`, its report counted first.
    fn end_run(&self, job: JobId) -> Counted {
        let counted = self.count_report();
        lock(&self.running).remove(&job);
        counted
    }

    async fn queue_report(&self, counted: Counted, job: JobId, run: RunNo, outcome: RunOutcome) {
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

    async fn send_report(&self, _counted: Counted, report: Report) {
        let (job, run) = (report.job, report.run);
        if self.reports_tx.send(report).await.is_err() {
            self.reports_pending.fetch_sub(1, Ordering::SeqCst);
            warn!(job, run, "report queue closed, dropping report");
        }
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

    /// Re-partitions idle MIG GPU `gpu` through the probe (the same code for simulated and real
    /// GPUs) and reports the new inventory; refuses a GPU a job of this node holds.
    pub fn apply_mig_layout(
        self: &Arc<Self>,
        probe: Arc<dyn crate::gpu::GpuProbe>,
        base: proto::Inventory,
        gpu: u32,
        profiles: Vec<String>,
        link: Arc<LeaderLink>,
    ) -> Result<Reply, ApiError> {
        if lock(&self.running).values().any(|r| r.gpus.contains(&gpu)) {
            return Err(ApiError::Denied(format!("gpu {gpu} runs a job; a MIG layout is applied only to an idle GPU")));
        }
        let node = self.node_id();
        tokio::spawn(async move {
            let what = format!("mig layout {} on gpu {gpu}", profiles.join(","));
            let applied = tokio::task::spawn_blocking(move || probe.apply_layout(gpu, &profiles)).await;
            match applied {
                Ok(Ok(gpus)) => {
                    let mut inventory = base;
                    gpus.fill(&mut inventory);
                    info!(gpu, "applied {what}");
                    let req = Request::ReportInventory { node, inventory, reason: what.clone() };
                    if let Err(e) = link.call(req, 0).await {
                        warn!(gpu, error = %e, "report inventory after {what}");
                    }
                }
                Ok(Err(e)) => warn!(gpu, error = %e, "{what} refused"),
                Err(e) => warn!(gpu, error = %e, "{what} panicked"),
            }
        });
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
    /// is not an error (it ended).
    pub fn suspend(&self, job: JobId, run: RunNo, pause: launcher::Pause) -> Result<Reply, ApiError> {
        let running = lock(&self.running);
        let Some(r) = running.get(&job).filter(|r| r.run == run) else { return Ok(Reply::Ok) };
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, run);
        write_pause(&dir, pause).map_err(|e| ApiError::Internal(format!("record the suspension of job {job}: {e:#}")))?;
        if r.pause_tx.send_replace(pause) != pause {
            info!(job, run, suspended = pause.suspended, paused_ms = pause.paused_ms, "suspension changed");
        }
        Ok(Reply::Ok)
    }

    /// Whether this node holds `job` suspended (no step starts in it meanwhile).
    fn suspended_here(r: &Running) -> bool {
        r.pause_tx.borrow().suspended
    }

    /// Whether `job`'s batch script (or its command, without one) runs here: where its steps are
    /// numbered.
    pub fn runs_script_of(&self, job: JobId) -> bool {
        lock(&self.running).get(&job).is_some_and(|r| !r.hold)
    }

    /// Numbers a new step of `job`, which must run here (the batch script's node asks), for
    /// `user` (none: an admin or a node): its run and number, the run's nodes and the job's port.
    pub fn number_step(&self, job: JobId, user: Option<&str>) -> Result<NumberedStep, ApiError> {
        let mut running = lock(&self.running);
        let r = running.get_mut(&job).ok_or_else(|| ApiError::NotFound(format!("job {job} does not run on {}", self.name)))?;
        owner_may(user, &r.owner, job)?;
        if r.hold {
            // Steps are numbered where the script runs; a second counter would reuse numbers.
            return Err(ApiError::Invalid(format!("job {job}'s steps start from its batch script's node, not {}", self.name)));
        }
        let step = r.next_step;
        r.next_step = r.next_step.checked_add(1).ok_or_else(|| ApiError::Unavailable("out of step numbers".into()))?;
        let master_port = r.base.env.get("MASTER_PORT").and_then(|p| p.parse().ok());
        Ok(NumberedStep { run: r.run, step, nodes: r.nodes.clone(), master_port })
    }

    /// Gives back step number `step` of `job` if it is the last one numbered (a step that was
    /// not started, so that one waiting for its GPUs does not use up numbers while it waits).
    pub fn unnumber_step(&self, job: JobId, step: u32) {
        if let Some(r) = lock(&self.running).get_mut(&job) {
            if r.next_step == step.saturating_add(1) {
                r.next_step = step;
            }
        }
    }

    /// Starts this node's tasks of step `step` of `job` run `run` through the run's shepherd,
    /// each in its own process group in the run's cgroup as the job's user, and follows their
    /// output in the shepherd's log. Idempotent: a step that exists already is left alone.
    pub async fn start_step(self: &Arc<Self>, job: JobId, run: RunNo, step: u32, spec: &proto::StepSpec, user: Option<&str>) -> Response {
        spec.validate().map_err(ApiError::Invalid)?;
        let Some(node_index) = spec.nodes.iter().position(|n| n.name == self.name) else {
            return Err(ApiError::Invalid(format!("step {job}.{step} has no tasks on {}", self.name)));
        };
        self.takes_new_work()?;
        let ranks = &spec.nodes[node_index].ranks;
        let (base, groups, handle, grant, job_gpus, run_cgroup) = {
            let mut running = lock(&self.running);
            let r = self.owned_run(&mut running, job, run, user)?;
            if r.pgid == 0 {
                return Err(ApiError::Unavailable(format!("job {job} has not started on {} yet", self.name)));
            }
            if r.steps.contains_key(&step) {
                return Ok(Reply::Ok);
            }
            if Self::suspended_here(r) {
                return Err(ApiError::Busy(proto::STEPS_DISABLED_SUSPENDED.into()));
            }
            if r.steps.len() >= proto::limits::STEPS_PER_JOB_MAX {
                return Err(ApiError::Unavailable(format!("job {job} has {} steps on {}", r.steps.len(), self.name)));
            }
            let grant = grant_here(r, job, step, spec, ranks.len() as u32, &self.name)?;
            if let Some(held) = r.step_holds.get_mut(&step) {
                held.started = true;
            }
            let handle = Step::new(job, run, step, ranks.len());
            r.steps.insert(step, Arc::clone(&handle));
            (Arc::clone(&r.base), Arc::clone(&r.tasks), handle, grant, r.gpus.clone(), r.cgroup.clone())
        };
        let step_cgroups = self.step_cgroups(job, step, &base.env, &grant, &job_gpus, run_cgroup.as_deref());
        let gpus: Option<Vec<usize>> = grant.gpus.as_ref().map(|g| g.iter().map(|p| *p as usize).collect());
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, run);
        let workdir = spec.workdir.as_ref().map_or_else(|| base.workdir.clone(), PathBuf::from);
        let readers: Vec<u32> = ranks.iter().copied().filter(|r| spec.stdin.reaches(*r)).collect();
        let fed = !readers.is_empty() && self.stdin_feeds.open(job, step, dir.clone(), readers);
        for (local, rank) in ranks.iter().enumerate() {
            let mut env = slurm_compat::env::step_task_env(
                &base.env,
                &spec.env,
                step,
                node_index,
                ranks,
                local,
                slurm_compat::env::TaskGpus { per_task: spec.gpus_per_task, step: gpus.as_deref() },
            );
            // The step's CPUs here, as Slurm's step sees them.
            env.insert("SLURM_CPUS_ON_NODE".into(), grant.cpus.to_string());
            let request = shepherd::TaskRequest {
                step,
                rank: *rank,
                tasks: ranks.len() as u32,
                program: PathBuf::from(&spec.argv[0]),
                args: spec.argv[1..].to_vec(),
                env,
                workdir: workdir.clone(),
                run_as: base.run_as.clone(),
                node: self.name.clone(),
                hosts_file: base.hosts_file.clone(),
                stdin: fed && spec.stdin.reaches(*rank),
                pty: spec.pty.filter(|_| *rank == 0),
                cgroups: step_cgroups.clone(),
            };
            match shepherd::spawn_task(&dir, &request).await {
                Ok((pgid, start_ticks)) if pgid > 1 => {
                    if !groups.add(pgid, start_ticks) {
                        info!(job, step, rank, "step task started as its run ended: killed");
                    }
                }
                Ok(_) => warn!(job, step, rank, "step task failed to start (its error is in the step's output)"),
                Err(e) => {
                    // The run's shepherd is gone (the run is ending): the task never started.
                    warn!(job, step, rank, error = format!("{e:#}"), "step task not started");
                    handle.push(
                        *rank,
                        LogStream::Stderr,
                        format!("slurmstepd-{}: error: task {rank} not started: {e:#}\n", self.name).into_bytes(),
                    );
                    handle.task_ended(proto::TaskExit { rank: *rank, code: Some(1), signal: None });
                }
            }
        }
        self.renew_lease();
        match shepherd::tail_step(&dir, step, 0).await {
            Ok(conn) => handle.follow(conn, Arc::clone(&groups)),
            Err(e) => {
                warn!(job, step, error = format!("{e:#}"), "follow the step's output");
                handle.stop_following();
            }
        }
        record_grant(&dir, job, step, &grant);
        self.limit_step_time(&handle, groups, spec.time_limit_ms, ranks.first().copied());
        self.report_step_end(&handle, run_cgroup.zip(step_cgroups));
        info!(job, run, step, tasks = ranks.len(), cpus = grant.cpus, memory_mib = grant.memory_mib, "step started");
        Ok(Reply::Ok)
    }

    /// Step `handle`'s `--time`: once `limit_ms` passed with its tasks here still running, says
    /// so on the step's stderr in slurmstepd's words (as task `rank`'s, its first here), sends
    /// them SIGTERM and, after the node's kill grace, SIGKILL. Nothing without a limit.
    fn limit_step_time(&self, handle: &Arc<Step>, groups: Arc<launcher::TaskGroups>, limit_ms: Option<u64>, rank: Option<u32>) {
        let (Some(limit_ms), Some(rank)) = (limit_ms, rank) else { return };
        let (handle, node, grace_ms) = (Arc::clone(handle), self.name.clone(), self.settings.stop.kill_grace_ms);
        tokio::spawn(async move {
            let ended = handle.exits_when_ended();
            tokio::pin!(ended);
            if tokio::time::timeout(Duration::from_millis(limit_ms), &mut ended).await.is_ok() {
                return;
            }
            let at = local_time_text(crate::fault::wall_ms() / 1000);
            let line = format!(
                "slurmstepd-{node}: error: *** STEP {}.{} ON {node} CANCELLED AT {at} DUE TO TIME LIMIT ***\n",
                handle.job, handle.id
            );
            handle.push(rank, LogStream::Stderr, line.into_bytes());
            info!(job = handle.job, step = handle.id, limit_ms, "step past its time limit: SIGTERM");
            handle.signal(libc::SIGTERM, &groups);
            if tokio::time::timeout(Duration::from_millis(grace_ms), &mut ended).await.is_err() {
                handle.signal(libc::SIGKILL, &groups);
            }
        });
    }

    /// Run `run` of `job` here, which `user` (none: an admin or a node) may start steps of.
    fn owned_run<'a>(
        &self,
        running: &'a mut BTreeMap<JobId, Running>,
        job: JobId,
        run: RunNo,
        user: Option<&str>,
    ) -> Result<&'a mut Running, ApiError> {
        let r = running
            .get_mut(&job)
            .filter(|r| r.run == run)
            .ok_or_else(|| ApiError::Denied(format!("job {job} run {run} does not run on {}", self.name)))?;
        owner_may(user, &r.owner, job)?;
        Ok(r)
    }

    /// Holds this node's share of step `step` of `job` run `run` before its start, or gives
    /// the hold back (`release`, only before the step started here): see [`Request::StepHold`].
    pub fn hold_step(&self, job: JobId, run: RunNo, step: u32, spec: &proto::StepSpec, release: bool, user: Option<&str>) -> Response {
        spec.validate().map_err(ApiError::Invalid)?;
        let Some(here) = spec.nodes.iter().find(|n| n.name == self.name) else {
            return Err(ApiError::Invalid(format!("step {job}.{step} has no tasks on {}", self.name)));
        };
        let mut running = lock(&self.running);
        let r = self.owned_run(&mut running, job, run, user)?;
        if release {
            if !r.steps.contains_key(&step) {
                r.step_holds.remove(&step);
            }
            return Ok(Reply::Ok);
        }
        if Self::suspended_here(r) {
            return Err(ApiError::Busy(proto::STEPS_DISABLED_SUSPENDED.into()));
        }
        grant_here(r, job, step, spec, here.ranks.len() as u32, &self.name)?;
        Ok(Reply::Ok)
    }

    /// The device numbers of this node's GPUs not among `given`, which a cgroup denies.
    fn devices_denied(&self, given: &[u32]) -> Vec<(u32, u32)> {
        let files = self.settings.gpu_device_files.iter().filter(|(gpu, _)| !given.contains(gpu));
        files.filter_map(|(_, path)| crate::cgroup::char_device(path)).collect()
    }

    /// The cgroups of step `step` below its run's, with its CPUs, memory and GPUs as limits
    /// ([`crate::cgroup::JobCgroups::create_step`]); none where the run has no cgroup, or
    /// they could not be made (its tasks then join the run's, which still confines them).
    fn step_cgroups(
        &self,
        job: JobId,
        step: u32,
        env: &BTreeMap<String, String>,
        grant: &scheduler::steps::StepGrant,
        job_gpus: &[u32],
        run_cgroup: Option<&crate::cgroup::JobCgroup>,
    ) -> Option<Vec<PathBuf>> {
        let (cgroups, run_cgroup) = (self.settings.cgroups.as_ref()?, run_cgroup?);
        // A grant of no memory is a job whose memory is not counted: no limit of the step's own.
        let memory_mib = if grant.memory_mib == 0 { u64::MAX >> 20 } else { grant.memory_mib };
        let limits = crate::cgroup::Limits { cpus: grant.cpus, memory_mib };
        // The job's GPUs the step was not given, by their device files.
        let given: Vec<u32> = match &grant.gpus {
            None => job_gpus.to_vec(),
            Some(positions) => {
                let indices: Vec<u32> =
                    env.get("SLURM_JOB_GPUS").map_or(Vec::new(), |v| v.split(',').filter_map(|g| g.trim().parse().ok()).collect());
                positions.iter().filter_map(|p| indices.get(*p as usize).copied()).collect()
            }
        };
        let deny = self.devices_denied(&given);
        match cgroups.create_step(run_cgroup, step, &limits, &deny) {
            Ok(paths) => Some(paths),
            Err(e) => {
                warn!(job, step, error = format!("{e:#}"), "step cgroup not made: its tasks run in the run's");
                None
            }
        }
    }

    /// Once every task of `handle` here ended, queues its end for the leader: the highest exit
    /// code and a killing signal among them (Slurm's step ExitCode).
    fn report_step_end(&self, handle: &Arc<Step>, cgroups: Option<(Arc<crate::cgroup::JobCgroup>, Vec<PathBuf>)>) {
        let (handle, tx) = (Arc::clone(handle), self.step_ends_tx.clone());
        tokio::spawn(async move {
            let exits = handle.exits_when_ended().await;
            if let Some((run, paths)) = cgroups {
                // As slurmstepd: what the step's tasks left behind ends with the step.
                run.remove_step(&paths).await;
            }
            let exit_code = exits.iter().filter_map(|e| e.code).max().unwrap_or(0);
            let signal = exits.iter().find_map(|e| e.signal);
            let end = proto::StepEnd { job: handle.job, run: handle.run, step: handle.id, exit_code, signal };
            // Bounded: a full queue holds this task until the leader took the ones before.
            if tx.send(end).await.is_err() {
                debug!(job = handle.job, step = handle.id, "step end not queued: the agent is stopping");
            }
        });
    }

    /// Sends the queued step ends to the leader, as many as are queued in one request, until a
    /// leader has them or refuses them.
    pub async fn step_end_loop(self: Arc<Self>, link: Arc<LeaderLink>) {
        let Some(mut rx) = lock(&self.step_ends_rx).take() else { return };
        while let Some(first) = rx.recv().await {
            let mut ends = vec![first];
            while ends.len() < proto::STEP_ENDS_PER_REQUEST_MAX {
                match rx.try_recv() {
                    Ok(e) => ends.push(e),
                    Err(_) => break,
                }
            }
            let req = Request::ReportStepEnds { node: self.name.clone(), ends };
            let mut backoff_ms = 50;
            loop {
                match link.call(req.clone(), 0).await {
                    Ok(_) => break,
                    Err(LinkError::Api(e)) => {
                        warn!(error = %e, "step ends refused");
                        break;
                    }
                    Err(e) => {
                        debug!(error = %e, "step ends not delivered, retrying");
                        tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                        backoff_ms = (backoff_ms * 2).min(1_000);
                    }
                }
            }
        }
    }

    fn step_of(&self, job: JobId, step: u32, user: Option<&str>) -> Result<(Arc<Step>, Arc<launcher::TaskGroups>), ApiError> {
        let running = lock(&self.running);
        let r = running.get(&job).ok_or_else(|| ApiError::NotFound(format!("job {job} does not run on {}", self.name)))?;
        owner_may(user, &r.owner, job)?;
        let s = r.steps.get(&step).ok_or_else(|| ApiError::NotFound(format!("step {job}.{step} on {}", self.name)))?;
        Ok((Arc::clone(s), Arc::clone(&r.tasks)))
    }

    /// Output and exits of a step here (see [`Step::read`]); a step read to its end is forgotten.
    pub async fn read_step(&self, job: JobId, step: u32, offset: u64, exits_seen: u32, wait_ms: u32, user: Option<&str>) -> Response {
        let (handle, _) = self.step_of(job, step, user)?;
        let wait = Duration::from_millis(u64::from(wait_ms.min(proto::limits::STEP_READ_WAIT_MS_MAX)));
        let out = handle.read(offset, exits_seen as usize, proto::limits::STEP_READ_BYTES_MAX, wait).await;
        if out.done {
            if let Some(r) = lock(&self.running).get_mut(&job) {
                self.stdin_feeds.forget(job, step);
                if r.steps.remove(&step).is_some() {
                    // Read to its end: a daemon that takes the run over need not follow it.
                    let dir = shepherd::step_dir(&shepherd::run_dir(&self.settings.runs_dir, job, r.run), step);
                    if let Err(e) = std::fs::remove_dir_all(&dir) {
                        debug!(job, step, error = %e, "remove step log {}", dir.display());
                    }
                }
            }
        }
        Ok(Reply::StepOutput { chunks: out.chunks, next_offset: out.next_offset, exits: out.exits, done: out.done })
    }

    /// Writes bytes `offset..` of a step's stdin to its tasks here that read it (see
    /// [`crate::step_stdin::Feeds::feed`]); `eof` closes their stdin.
    pub async fn step_input(&self, job: JobId, step: u32, offset: u64, data: &[u8], eof: bool, user: Option<&str>) -> Response {
        if data.len() > proto::limits::STEP_INPUT_BYTES_MAX {
            return Err(ApiError::Invalid(format!("a stdin chunk holds at most {} bytes", proto::limits::STEP_INPUT_BYTES_MAX)));
        }
        self.step_of(job, step, user)?;
        self.stdin_feeds.feed(job, step, &self.name, offset, data, eof).await?;
        Ok(Reply::Ok)
    }

    /// What the live tasks of `job`'s steps here, and its batch script if it runs here, use now
    /// (`sstat`), read from `/proc` (off the async workers).
    pub async fn step_usage(&self, job: JobId, user: Option<&str>) -> Response {
        let (script, tasks) = {
            let running = lock(&self.running);
            let r = running.get(&job).ok_or_else(|| ApiError::NotFound(format!("job {job} does not run on {}", self.name)))?;
            owner_may(user, &r.owner, job)?;
            // A batch job's other nodes run a holder, not its script.
            let script = (r.pgid > 0 && !r.hold).then_some(r.pgid);
            let tasks: Vec<(u32, u32, i32)> = r
                .steps
                .values()
                .filter(|s| !s.ended())
                .flat_map(|s| s.task_sessions().into_iter().map(move |(rank, pgid)| (s.id, rank, pgid)))
                .take(proto::TASK_USAGES_MAX)
                .collect();
            (script, tasks)
        };
        let mut wanted: Vec<i32> = tasks.iter().map(|(_, _, pgid)| *pgid).collect();
        wanted.extend(script);
        let found = tokio::task::spawn_blocking(move || crate::usage::sessions(std::path::Path::new("/proc"), &wanted))
            .await
            .map_err(|e| ApiError::Unavailable(format!("read /proc: {e}")))?;
        let (tick_ms, page_kib) = (1000 / crate::usage::ticks_per_s().max(1), crate::usage::page_bytes() / 1024);
        let entry = |step: Option<u32>, rank: u32, pgid: i32| {
            found.get(&pgid).map(|u| proto::TaskUsage {
                step,
                rank,
                cpu_ms: u.cpu_ticks * tick_ms,
                rss_kib: u.rss_pages * page_kib,
                vmsize_kib: u.vmsize_bytes / 1024,
                pages: u.major_faults,
                read_bytes: u.read_bytes,
                write_bytes: u.write_bytes,
            })
        };
        let mut usages: Vec<proto::TaskUsage> = script.and_then(|pgid| entry(None, 0, pgid)).into_iter().collect();
        usages.extend(tasks.iter().filter_map(|(step, rank, pgid)| entry(Some(*step), *rank, *pgid)));
        usages.truncate(proto::TASK_USAGES_MAX);
        Ok(Reply::StepUsage(usages))
    }

    /// Gives the pseudo-terminal of a step's task 0 here (`srun --pty`) the size `size`.
    pub async fn resize_step(&self, job: JobId, step: u32, size: proto::PtySize, user: Option<&str>) -> Response {
        let (handle, _) = self.step_of(job, step, user)?;
        if handle.ended() {
            return Ok(Reply::Ok);
        }
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, handle.run);
        shepherd::resize_pty(&dir, step, 0, size).await.map_err(|e| ApiError::Invalid(format!("step {job}.{step}: {e:#}")))?;
        Ok(Reply::Ok)
    }

    /// Sends `signal` to every task of a step here (each one's whole process group).
    pub fn signal_step(&self, job: JobId, step: u32, signal: i32, user: Option<&str>) -> Response {
        if !(1..=64).contains(&signal) {
            return Err(ApiError::Invalid(format!("signal {signal} out of range")));
        }
        let (handle, groups) = self.step_of(job, step, user)?;
        if !handle.ended() {
            handle.signal(signal, &groups);
        }
        Ok(Reply::Ok)
    }

    /// The address of node `name` of the run of `job` here (steps are read through the node
    /// that launched them).
    pub fn run_node_addr(&self, job: JobId, name: &str) -> Option<String> {
        lock(&self.running).get(&job).and_then(|r| r.nodes.iter().find(|(n, _)| n == name).map(|(_, a)| a.clone()))
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

    /// Prepares this daemon to exit and be replaced (a rolling upgrade) while its runs go on:
    /// it starts nothing more, records each run's next step number, and writes the hand-over
    /// into the daemon record. The caller exits right after; the runs' shepherds and the
    /// watchdog keep the jobs until the next daemon of this instance takes them over, or until
    /// the lease's deadline. Step tasks, which this daemon started itself, end with it.
    pub fn hand_over(&self) -> anyhow::Result<Handover> {
        let now_ms = crate::watchdog::boot_ms();
        let t = (*lock(&self.last_ack)).context("no leader has acknowledged this node yet: its runs cannot be handed over")?;
        let last_ack_boot_ms = now_ms.saturating_sub(t.elapsed().as_millis() as u64);
        let deadline_boot_ms = last_ack_boot_ms + self.settings.fence_after_ms + self.settings.stop.fence_kill_grace_ms;
        anyhow::ensure!(now_ms < deadline_boot_ms, "this node is out of touch with the leader: its jobs are being fenced");
        self.handing_over.store(true, Ordering::SeqCst);
        for (job, r) in lock(&self.running).iter() {
            let path = shepherd::run_dir(&self.settings.runs_dir, *job, r.run).join("next_step");
            if let Err(e) = std::fs::write(&path, r.next_step.to_string()) {
                warn!(job, error = %e, "record the next step number in {}", path.display());
            }
        }
        let handover = Handover { last_ack_boot_ms, ack_commit_index: self.ack_commit_index(), deadline_boot_ms };
        let record = shepherd::DaemonRecord { handover: Some(handover), ..shepherd::DaemonRecord::me(self.instance) };
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
            let now_ms = crate::watchdog::boot_ms();
            let since = Duration::from_millis(now_ms.saturating_sub(h.last_ack_boot_ms));
            *lock(&self.last_ack) = std::time::Instant::now().checked_sub(since);
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
                    crate::cgroup::JobCgroup::existing(v2, v1).kill_and_remove().await;
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
        let cgroup = record.cgroup.map(|p| Arc::new(crate::cgroup::JobCgroup::existing(p, cgroups_v1)));
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
            },
        );
        self.adopt_steps(dir, spec.job, spec.run, &tasks, cgroup.as_ref()).await;
        let elapsed_ms = crate::watchdog::boot_ms().saturating_sub(record.started_boot_ms);
        let span = info_span!("job", job = spec.job, run = spec.run);
        span.in_scope(|| info!(pgid = child.pgid, elapsed_ms, "took the run over from the previous daemon"));
        let agent = Arc::clone(self);
        tokio::spawn(async move { agent.supervise_run(child, spec, stop_rx, cgroup, tasks, elapsed_ms).await }.instrument(span));
        Ok(true)
    }

    /// Follows again, from their start, the logs of the steps a run taken over still has here
    /// (those whose `srun` had not read them to their end).
    async fn adopt_steps(
        &self,
        dir: &std::path::Path,
        job: JobId,
        run: RunNo,
        groups: &Arc<launcher::TaskGroups>,
        cgroup: Option<&Arc<crate::cgroup::JobCgroup>>,
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

    /// The leader's commit index in the last heartbeat acknowledgement.
    pub fn ack_term(&self) -> u64 {
        self.ack_term.load(Ordering::SeqCst)
    }

    pub fn ack_commit_index(&self) -> u64 {
        self.ack_commit_index.load(Ordering::SeqCst)
    }

    /// Whether no leader acknowledged this node for `fence_after_ms`.
    fn out_of_touch(&self) -> bool {
        control::agent::out_of_touch(self.ack_age_ms(), self.settings.fence_after_ms)
    }

    /// How long ago this node sent the last heartbeat a leader acknowledged (None: no leader
    /// acknowledged this instance yet).
    fn ack_age_ms(&self) -> Option<u64> {
        lock(&self.last_ack).map(|t| t.elapsed().as_millis() as u64)
    }

    /// What the launch ledger says about `job`'s run `run` (for `control::agent`'s decisions).
    fn ledger_mark(&self, job: JobId, run: RunNo) -> control::agent::Ledger {
        ledger_mark(lock(&self.ledger).entries.get(&(job, run)), self.instance)
    }

    /// Rewrites the watchdog's lease: the running process groups, and the moment after which
    /// they must be dead unless a leader acknowledges this node again.
    pub fn renew_lease(&self) {
        let now_ms = crate::watchdog::boot_ms();
        let ack_age_ms = self.ack_age_ms();
        let in_ms =
            control::agent::watchdog_deadline_in_ms(ack_age_ms, self.settings.fence_after_ms, self.settings.stop.fence_kill_grace_ms);
        // No leader acknowledged this instance: what it runs (adopted) must not outlive it.
        let deadline_boot_ms = if ack_age_ms.is_some() { now_ms + in_ms } else { 0 };
        let groups = lock(&self.running)
            .values()
            .flat_map(|r| {
                let own = (r.pgid > 0).then_some((r.pgid, r.start_ticks));
                own.into_iter().chain(r.tasks.snapshot())
            })
            .map(|(pgid, start_ticks)| crate::watchdog::Group { pgid, start_ticks })
            .collect();
        let cgroups = lock(&self.running).values().filter_map(|r| r.cgroup.as_ref()).flat_map(|c| c.paths()).collect();
        let lease = crate::watchdog::Lease { deadline_boot_ms, groups, cgroups };
        // One writer at a time: the file is replaced by rename.
        let _guard = lock(&self.lease_write);
        if let Err(e) = crate::watchdog::write_lease(&self.settings.lease_path, &lease) {
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

    /// A chunk of the output of the latest run of `job` on this node.
    pub fn read_log(&self, job: JobId, stream: LogStream, offset: u64, max_bytes: u32) -> Result<Reply, ApiError> {
        let path = {
            let ledger = lock(&self.ledger);
            let entry = ledger.latest(job).ok_or_else(|| ApiError::NotFound(format!("no output of job {job} on {}", self.name)))?;
            match stream {
                LogStream::Stdout => entry.stdout.clone(),
                LogStream::Stderr => entry.stderr.clone(),
            }
        };
        let finished = !lock(&self.running).contains_key(&job);
        let max_bytes = max_bytes.min(proto::limits::LOG_CHUNK_BYTES_MAX) as usize;
        let mut data = Vec::new();
        match std::fs::File::open(&path) {
            Ok(mut f) => {
                f.seek(SeekFrom::Start(offset)).map_err(|e| ApiError::Internal(format!("seek {}: {e}", path.display())))?;
                f.take(max_bytes as u64).read_to_end(&mut data).map_err(|e| ApiError::Internal(format!("read {}: {e}", path.display())))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ApiError::Internal(format!("open {}: {e}", path.display()))),
        }
        let next_offset = offset + data.len() as u64;
        Ok(Reply::LogChunk { data, next_offset, finished })
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
        let req = Request::ReportRuns {
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
            let req = Request::ReportRun {
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

    /// Samples the GPUs of running jobs every `interval` for their accounting (mean utilization,
    /// peak memory), reported with each run's end.
    pub async fn sample_loop(self: Arc<Self>, sampler: Arc<dyn crate::gpu::GpuSampler>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let holders: BTreeMap<u32, JobId> =
                lock(&self.running).iter().flat_map(|(job, r)| r.gpus.iter().map(move |g| (*g, *job))).collect();
            if holders.is_empty() {
                continue;
            }
            let held: std::collections::BTreeSet<u32> = holders.keys().copied().collect();
            let sampler = Arc::clone(&sampler);
            match tokio::task::spawn_blocking(move || sampler.sample(&held)).await {
                Ok(Ok(samples)) => lock(&self.accounting).observe(&holders, &samples),
                Ok(Err(e)) => debug!(error = format!("{e:#}"), "sample gpus"),
                Err(e) => warn!(error = %e, "gpu sampler panicked"),
            }
        }
    }
}

impl crate::liveness::Heartbeating for Agent {
    fn heartbeat(&self) -> Request {
        Request::Heartbeat { node: self.node_id(), instance: self.instance, running: self.running() }
    }

    fn holds_work(&self) -> bool {
        !self.running().is_empty()
    }

    fn fence(&self) -> usize {
        Agent::fence(self)
    }

    fn acknowledged(&self, lease: crate::liveness::Lease, ack: &Reply) {
        if let Reply::HeartbeatAck { commit_index, term, .. } = ack {
            self.ack_commit_index.fetch_max(*commit_index, Ordering::SeqCst);
            self.ack_term.store(*term, Ordering::SeqCst);
        }
        *lock(&self.last_ack) = Some(lease.since());
    }

    fn tick_done(&self) {
        self.renew_lease();
    }

    fn inherited_ack(&self) -> Option<std::time::Instant> {
        *lock(&self.last_ack)
    }

    fn fence_after(&self) -> Duration {
        Duration::from_millis(self.settings.fence_after_ms)
    }
}

/// The file in a run's directory that keeps its suspension: "<0|1> <paused_ms>".
const PAUSE_FILE: &str = "pause";

fn write_pause(dir: &std::path::Path, pause: launcher::Pause) -> anyhow::Result<()> {
    let path = dir.join(PAUSE_FILE);
    let tmp = dir.join(format!("{PAUSE_FILE}.tmp"));
    std::fs::write(&tmp, format!("{} {}\n", u8::from(pause.suspended), pause.paused_ms))
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))
}

/// The run's suspension as its directory keeps it; not suspended when there is none (or it
/// cannot be read: the leader tells the new instance again).
fn read_pause(dir: &std::path::Path) -> launcher::Pause {
    let text = std::fs::read_to_string(dir.join(PAUSE_FILE)).unwrap_or_default();
    let mut words = text.split_whitespace();
    match (words.next(), words.next().and_then(|w| w.parse().ok())) {
        (Some(flag), Some(paused_ms)) => launcher::Pause { suspended: flag == "1", paused_ms },
        _ => launcher::Pause::default(),
    }
}

/// Where a step's share of its job here is kept, in its directory of the run's.
const STEP_GRANT_FILE: &str = "grant.json";

/// `2026-12-05T05:32:28`: a time in this node's local time, as slurmstepd prints it.
fn local_time_text(epoch_s: u64) -> String {
    let t = libc::time_t::try_from(epoch_s).unwrap_or(libc::time_t::MAX);
    // SAFETY: localtime_r writes only into the zeroed tm we own.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    let (date, clock) = ((tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday), (tm.tm_hour, tm.tm_min, tm.tm_sec));
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", date.0, date.1, date.2, clock.0, clock.1, clock.2)
}

/// Keeps step `step`'s share in its directory of run directory `dir`, for a daemon that takes
/// the run over: what the step holds stays held.
fn record_grant(dir: &std::path::Path, job: JobId, step: u32, grant: &scheduler::steps::StepGrant) {
    let file = dir.join("steps").join(step.to_string()).join(STEP_GRANT_FILE);
    let recorded = serde_json::to_vec(grant).map_err(anyhow::Error::from).and_then(|bytes| Ok(std::fs::write(&file, bytes)?));
    if let Err(e) = recorded {
        warn!(job, step, error = format!("{e:#}"), "record the step's share");
    }
}

/// What the job holds here, which its steps share: its CPUs, memory and GPUs as its
/// environment says (`SLURM_CPUS_ON_NODE`, `SLURM_MEM_PER_NODE`, `SLURM_JOB_GPUS`).
fn node_share(env: &BTreeMap<String, String>) -> scheduler::steps::NodeShare {
    let number = |key: &str| env.get(key).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    let gpus = env.get("SLURM_JOB_GPUS").map_or(0, |v| v.split(',').filter(|s| !s.is_empty()).count());
    scheduler::steps::NodeShare {
        cpus: u32::try_from(number("SLURM_CPUS_ON_NODE")).unwrap_or(u32::MAX).max(1),
        memory_mib: number("SLURM_MEM_PER_NODE"),
        gpus: u32::try_from(gpus).unwrap_or(u32::MAX),
    }
}

/// Step `step`'s share of the job here with `tasks` tasks: the hold it was given before its
/// start, or a new grant (held now). Holds of steps whose tasks here ended, and those no start
/// took in time, are dropped first. Asking more than the job has is refused; finding too
/// little free is [`ApiError::Busy`] (the caller asks again, as Slurm's srun does).
fn grant_here(
    r: &mut Running,
    job: JobId,
    step: u32,
    spec: &proto::StepSpec,
    tasks: u32,
    node: &str,
) -> Result<scheduler::steps::StepGrant, ApiError> {
    use scheduler::steps::StepRefusal;
    let asked = HeldStep::asked(spec, tasks);
    if let Some(held) = r.step_holds.get(&step).filter(|h| h.asked == asked) {
        return Ok(held.grant.clone());
    }
    let now = std::time::Instant::now();
    let steps = &r.steps;
    r.step_holds.retain(|s, h| match steps.get(s) {
        Some(handle) => !handle.ended(),
        None => !h.started && *s != step && now.duration_since(h.since) < Duration::from_millis(proto::limits::STEP_HOLD_MS_MAX),
    });
    let held: Vec<&scheduler::steps::StepHold> = r.step_holds.values().map(|h| &h.grant.held).collect();
    match scheduler::steps::grant_step(node_share(&r.base.env), &held, spec, tasks) {
        Ok(grant) => {
            r.step_holds.insert(step, HeldStep { grant: grant.clone(), since: now, asked, started: false });
            Ok(grant)
        }
        Err(StepRefusal::Invalid(why)) => Err(ApiError::Invalid(why)),
        Err(StepRefusal::Busy(why)) => Err(ApiError::Busy(format!("step {job}.{step} waits on {node}: {why}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_claimed_by_one_launch_call_at_a_time() {
        let claims = Mutex::new(BTreeSet::new());
        let first = LaunchClaim::take(&claims, (7, 1)).expect("the first call claims the run");
        assert!(LaunchClaim::take(&claims, (7, 1)).is_none(), "a concurrent call for the same run is turned away");
        let other = LaunchClaim::take(&claims, (7, 2)).expect("another run of the job is another claim");
        drop(first);
        assert!(LaunchClaim::take(&claims, (7, 1)).is_some(), "released when the first call returns");
        drop(other);
        assert!(lock(&claims).is_empty());
    }
}
