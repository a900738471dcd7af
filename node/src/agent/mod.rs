//! The agent side of a node: launches the runs the leader committed, at most once per (job,
//! run), supervises them, reports how they ended, and heartbeats the leader.
//!
//! This file holds the `Agent`, its settings and the state of its runs, with what its parts
//! share; the rest is by concern: the launch ledger (`ledger`), launching a run (`launch`),
//! supervising runs and stopping, signalling or suspending them (`supervise`), reports of
//! ended runs to the leader (`report`), steps (`steps`), the hand-over to the next daemon
//! (`handover`), the lease and fencing (`lease`), output (`logs`), GPU sampling (`sample`)
//! and MIG layouts (`mig`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use proto::{ApiError, GpuInfo, InstanceId, JobId, NodeId, RunNo};
use tokio::sync::mpsc;

use crate::run::launcher;
use crate::run::step::Step;

mod handover;
mod launch;
mod lease;
mod ledger;
mod logs;
mod mig;
mod report;
mod sample;
mod steps;
mod supervise;

use ledger::Ledger;
use report::Report;

/// Reports of ended runs waiting to be committed.
const REPORT_QUEUE_MAX: usize = 4096;
/// Step ends queued for the leader at most (a full queue holds the steps' watchers back).
const STEP_END_QUEUE_MAX: usize = 4096;

struct Running {
    run: RunNo,
    /// GPU indices (MIG instances by their GPU) this run holds.
    gpus: Vec<u32>,
    /// Its allocation's entries: whole GPUs by index, MIG instances by slot (`GpuSample::slot`).
    slots: Vec<u32>,
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
    cgroup: Option<Arc<crate::run::cgroup::JobCgroup>>,
    /// Process groups of its step tasks here.
    tasks: Arc<launcher::TaskGroups>,
    /// Its steps with tasks here.
    steps: BTreeMap<u32, Arc<Step>>,
    /// Next step number, on the node that numbers them (the batch script's).
    next_step: u32,
    /// What steps hold of the job's CPUs, memory and GPUs here, by step: from their grant
    /// (a start, or a hold before it) until their tasks here end.
    step_holds: BTreeMap<u32, HeldStep>,
    /// The steps launched from here (the batch script's node) as they were started, the
    /// newest [`STEPS_LAUNCHED_KEPT`]: a lost node's tasks of one start again from it on a spare
    /// (`ClientRequest::StepMove`). Not kept across a daemon's hand-over.
    launched: BTreeMap<u32, Arc<proto::StepSpec>>,
}

/// Steps of a run whose launched spec the batch script's node keeps (Slurm's own bound on the
/// steps a job keeps).
const STEPS_LAUNCHED_KEPT: usize = proto::limits::STEP_RECORDS_PER_JOB_MAX;

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

/// A run this node supervises, as the metrics show it ([`Agent::running_jobs`]).
pub struct RunningJob {
    pub job: JobId,
    pub user: String,
    /// Its account, empty where it has none.
    pub account: String,
    /// Its allocation's entries here: whole GPUs by index, MIG instances by slot.
    pub slots: Vec<u32>,
    /// Its cgroup once its process started, where the node confines jobs.
    pub cgroup: Option<Arc<crate::run::cgroup::JobCgroup>>,
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
    run_as: Option<crate::run::identity::Account>,
    mounts: crate::run::process::JobMounts,
}

impl TaskBase {
    /// What the step tasks of the run `spec` launches start from.
    fn of(spec: &crate::run::process::LaunchSpec) -> Arc<TaskBase> {
        Arc::new(TaskBase {
            env: spec.env.clone(),
            workdir: spec.workdir.clone(),
            run_as: spec.run_as.clone(),
            mounts: spec.mounts.clone(),
        })
    }
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
    pub cgroups: Option<crate::run::cgroup::JobCgroups>,
    /// This `corrald`'s executable: it holds a batch job's other nodes (`corrald --hold`) and
    /// shepherds runs (`corrald --shepherd`).
    pub exe: PathBuf,
    /// Forks runs' shepherds cheaply (see `spawner`); none: each is exec'd from `exe`.
    pub spawner: Option<Arc<crate::run::spawner::Spawner>>,
    /// The device file of each GPU (by index), denied to runs not given that GPU where the
    /// cgroup v1 devices controller is available.
    pub gpu_device_files: BTreeMap<u32, PathBuf>,
    /// Each run's directory on this node (`shepherd`), `JOBS_DIR/runs`.
    pub runs_dir: PathBuf,
    /// Which daemon runs this node's jobs (`daemon_record::DaemonRecord`), `JOBS_DIR/daemon.json`.
    pub daemon_file: PathBuf,
    /// This node's local socket, named in jobs' `CORRAL_SOCKET`.
    pub local_socket: Option<PathBuf>,
    /// The hosts file jobs see as `/etc/hosts` (`job_hosts_file`; only with a mount namespace per
    /// run: root with CAP_SYS_ADMIN).
    pub job_hosts: Option<PathBuf>,
    /// The `corral` binary runs link as `/job/bin/pdsh` and `ssh` (only with a mount namespace
    /// per run, as `job_hosts`).
    pub job_commands: Option<PathBuf>,
}

pub struct Agent {
    pub name: String,
    pub instance: InstanceId,
    node_id: AtomicU64,
    /// This node's GPUs as last discovered: at start, and after each MIG layout applied (a
    /// launch takes its instances' UUIDs from here).
    gpus: Mutex<Vec<GpuInfo>>,
    settings: AgentSettings,
    running: Mutex<BTreeMap<JobId, Running>>,
    ledger: Mutex<Ledger>,
    /// Runs a `launch` call is starting now (see [`LaunchClaim`](ledger::LaunchClaim)).
    launching: Mutex<BTreeSet<(JobId, RunNo)>>,
    reports_tx: mpsc::Sender<Report>,
    reports_rx: Mutex<Option<mpsc::Receiver<Report>>>,
    /// Ends of steps' tasks here, for the leader's accounting (`step_end_loop`).
    step_ends_tx: mpsc::Sender<proto::StepEnd>,
    step_ends_rx: Mutex<Option<mpsc::Receiver<proto::StepEnd>>>,
    /// This node's lease (on the boot clock): when it sent the last heartbeat a leader
    /// acknowledged (none yet for a new instance) and what that lets it do. The heartbeat
    /// loop renews it (`liveness::heartbeat_loop`).
    lease: Mutex<control::agent::Lease>,
    /// The leader's commit index in its last acknowledgement.
    ack_commit_index: AtomicU64,
    /// The term of the last heartbeat acknowledgement (a new one: ask for the members again).
    ack_term: AtomicU64,
    /// GPU utilization and memory of running jobs, sampled.
    accounting: Mutex<crate::gpu::JobGpuAccounting>,
    /// Each job's GPU series here, for its page (`ClientRequest::GpuSeries`).
    gpu_series: Mutex<crate::gpu::JobGpuSeries>,
    /// The latest sampling of the GPUs jobs hold here, for the web UI's map (`ClientRequest::GpuSamples`).
    gpu_latest: Mutex<Vec<proto::GpuNow>>,
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
    stdin_feeds: crate::run::step_stdin::Feeds,
    /// The rendezvous store endpoints of the command gangs' parts here (`rdzv`).
    pub rdzv: crate::rdzv::Stores,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
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
            gpus: Mutex::new(gpus),
            running: Mutex::new(BTreeMap::new()),
            ledger: Mutex::new(ledger),
            launching: Mutex::new(BTreeSet::new()),
            reports_tx,
            reports_rx: Mutex::new(Some(reports_rx)),
            step_ends_tx,
            step_ends_rx: Mutex::new(Some(step_ends_rx)),
            lease: Mutex::new(control::agent::Lease::new(settings.fence_after_ms, settings.stop.fence_kill_grace_ms)),
            ack_commit_index: AtomicU64::new(0),
            ack_term: AtomicU64::new(0),
            accounting: Mutex::new(crate::gpu::JobGpuAccounting::default()),
            gpu_series: Mutex::new(crate::gpu::JobGpuSeries::default()),
            gpu_latest: Mutex::new(Vec::new()),
            lease_write: Mutex::new(()),
            reports_pending: AtomicU64::new(0),
            handing_over: std::sync::atomic::AtomicBool::new(false),
            stopping: std::sync::atomic::AtomicBool::new(false),
            stdin_feeds: crate::run::step_stdin::Feeds::default(),
            rdzv: crate::rdzv::Stores::default(),
            settings,
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

    /// The runs this node supervises, as its metrics show them.
    pub fn running_jobs(&self) -> Vec<RunningJob> {
        let running = lock(&self.running);
        let job = |(id, r): (&JobId, &Running)| RunningJob {
            job: *id,
            user: r.owner.clone(),
            // As slurm-job-exporter reads it: the run's environment (none without an account).
            account: r.base.env.get("SLURM_JOB_ACCOUNT").cloned().unwrap_or_default(),
            slots: r.slots.clone(),
            cgroup: r.cgroup.clone(),
        };
        running.iter().map(job).collect()
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

    /// The device numbers of this node's GPUs not among `given`, which a cgroup denies.
    fn devices_denied(&self, given: &[u32]) -> Vec<(u32, u32)> {
        let files = self.settings.gpu_device_files.iter().filter(|(gpu, _)| !given.contains(gpu));
        files.filter_map(|(_, path)| crate::run::cgroup::char_device(path)).collect()
    }
}
