//! A job in the replicated state: its state, runs and their parts on each node, how they ended,
//! its usage, suspensions and step records.

use std::fmt;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::limits;
use crate::{InstanceId, JobId, JobSpec, NodeId, RunNo};

/// How a pending job's reason starts when no amount of waiting lets it run (it asks for more
/// than the cluster has).
pub const REASON_NEVER_PREFIX: &str = "cannot ever run: ";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum JobState {
    Pending,
    Running,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    /// A process of the job was killed for its memory limit.
    OutOfMemory,
}

impl JobState {
    /// Every state, in declaration order.
    pub const ALL: [JobState; 8] = [
        JobState::Pending,
        JobState::Running,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::NodeFail,
        JobState::OutOfMemory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
        }
    }

    pub fn is_final(self) -> bool {
        !matches!(self, JobState::Pending | JobState::Running)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The resources one node gives to a run of a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub node: NodeId,
    pub gpus: Vec<u32>,
    pub cpus: u32,
    pub mem_mib: u64,
}

/// One node's part of one run of a job. It holds its allocation until the node reports the
/// process gone (or the node is declared down), so no GPU is ever handed out twice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRun {
    pub run: RunNo,
    pub alloc: Allocation,
    /// Instance of the node that confirmed it started this part.
    pub launched_by: Option<InstanceId>,
}

/// GPU usage of a job, sampled by its nodes and summed over its runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    /// GPU samples taken (one per GPU per sampling).
    pub samples: u64,
    pub utilization_pct_sum: u64,
    /// Highest memory any one of its GPUs used.
    pub memory_used_peak_mib: u64,
}

impl GpuUsage {
    pub fn mean_utilization_pct(&self) -> u64 {
        self.utilization_pct_sum.checked_div(self.samples).unwrap_or(0)
    }

    pub fn merge(&mut self, other: &GpuUsage) {
        self.samples = self.samples.saturating_add(other.samples);
        self.utilization_pct_sum = self.utilization_pct_sum.saturating_add(other.utilization_pct_sum);
        self.memory_used_peak_mib = self.memory_used_peak_mib.max(other.memory_used_peak_mib);
    }
}

/// A task of a job array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The id of the array (the job that was submitted).
    pub array_job: JobId,
    pub task: u32,
}

/// A job in the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// Shared, not copied, between an array and the tasks it starts (encoded as the spec itself;
    /// `Arc::make_mut` to change one job's).
    pub spec: std::sync::Arc<JobSpec>,
    pub state: JobState,
    pub exit_code: Option<i32>,
    /// The run in progress or the last one; 0 before the first start.
    pub run: RunNo,
    /// Parts that hold resources: those of the current run, and parts of an earlier run (or of
    /// a cancelled or failed one) still stopping. Empty once everything is released.
    pub parts: Vec<NodeRun>,
    /// How each node's part of the current run ended, as reported.
    pub outcomes: Vec<(NodeId, RunOutcome)>,
    /// Nodes and GPUs of the current or last run in rank order, as planned; kept after the
    /// parts are released.
    pub last_nodes: Vec<NodeId>,
    pub last_gpus: Vec<Vec<u32>>,
    pub array: Option<ArrayTask>,
    pub submit_ms: u64,
    pub start_ms: Option<u64>,
    pub end_ms: Option<u64>,
    pub restart_count: u32,
    /// Every reason it is not running now (pending), or why it ended.
    pub reasons: Vec<String>,
    /// Accounting, filled in as runs end: GPU-seconds, a MIG instance counted by its share of
    /// the GPU's compute slices (`scheduler::mig::slot_compute_slices`).
    pub gpu_seconds: u64,
    pub gpu_usage: GpuUsage,
    /// Rendezvous port of the current run on its first node (`MASTER_PORT`), chosen when the
    /// run is placed so that no two jobs on that node share it.
    pub master_port: Option<u16>,
    /// `scontrol suspend|resume` of the current run (reset when a run starts).
    pub suspension: Suspension,
    /// The current run's steps (`srun` in its allocation), oldest first, at most
    /// [`limits::STEP_RECORDS_PER_JOB_MAX`] (reset when a run starts).
    pub steps: Vec<StepRecord>,
    /// Nodes of the current run held as spares (`--spare-nodes`): their parts hold their
    /// resources and start nothing until one takes the place of a lost node (a [`Repair`]).
    pub spares: Vec<NodeId>,
    /// Its repairs over all its runs, oldest first, at most [`REPAIRS_KEPT`].
    pub repairs: Vec<Repair>,
}

/// A lost node of a running gang replaced by one of its spares: the part of rank `rank` started
/// there, the other parts kept running.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repair {
    pub run: RunNo,
    pub rank: u32,
    pub lost: NodeId,
    pub spare: NodeId,
    pub at_ms: u64,
    pub reason: String,
}

/// Repairs a job keeps at most (the oldest go first).
pub const REPAIRS_KEPT: usize = 32;
/// Bytes of a repair's reason kept at most (a longer one is cut at a character's boundary).
pub const REPAIR_REASON_BYTES_MAX: usize = 256;

/// One step of a job's run as accounting shows it (`sacct`'s `ID.N` line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRecord {
    pub step: u32,
    /// Its command's name (the program, without its directory).
    pub name: String,
    /// Nodes of its tasks, in rank order.
    pub nodes: Vec<String>,
    pub ntasks: u32,
    pub start_ms: u64,
    /// When the last of its nodes reported its tasks ended.
    pub end_ms: Option<u64>,
    /// Nodes whose tasks of it all ended.
    pub ended_on: Vec<String>,
    /// The highest exit code of its tasks so far, and a signal that killed one (Slurm's
    /// ExitCode `code:signal`).
    pub exit_code: i32,
    pub signal: Option<i32>,
}

impl StepRecord {
    /// The step's state as Slurm names it, given its job's.
    pub fn state_name(&self, job: &Job) -> &'static str {
        let job_ended_it = matches!(job.state, JobState::Cancelled | JobState::Timeout | JobState::NodeFail | JobState::OutOfMemory);
        match (self.end_ms, job.state) {
            (None, JobState::Running) if job.suspended() => "SUSPENDED",
            (None, JobState::Running) => "RUNNING",
            (None, state) if job_ended_it => state.as_str(),
            // Its nodes were lost with their reports, or the job ended before they came.
            (None, _) => "CANCELLED",
            (Some(_), state) if self.signal.is_some() && job_ended_it => state.as_str(),
            (Some(_), _) if self.signal.is_some() || self.exit_code != 0 => "FAILED",
            (Some(_), _) => "COMPLETED",
        }
    }
}

/// How the current run of a job was suspended (`scontrol suspend`) and resumed: its processes
/// stopped (SIGSTOP) on every node, its resources still held, its time limit paused.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspension {
    /// When it was suspended; `None` while it runs.
    pub since_ms: Option<u64>,
    /// How long the run's earlier suspensions lasted (ended by a resume).
    pub paused_ms: u64,
    /// Suspends and resumes of this run so far. While non-zero the leader sees to it that each
    /// node of the run stopped or continued its processes as the state says.
    pub changes: u32,
}

impl Suspension {
    /// How long the run has been suspended in all by `now_ms`.
    pub fn paused_ms_at(&self, now_ms: u64) -> u64 {
        self.paused_ms.saturating_add(self.since_ms.map_or(0, |since| now_ms.saturating_sub(since)))
    }
}

impl Job {
    /// A job as a submit commits it: pending, never run. The one place a `Job` is built field
    /// by field (the state machine's submit and every test's builder start here).
    pub fn submitted(id: JobId, spec: std::sync::Arc<JobSpec>, submit_ms: u64) -> Job {
        Job {
            id,
            spec,
            state: JobState::Pending,
            exit_code: None,
            run: 0,
            parts: Vec::new(),
            outcomes: Vec::new(),
            last_nodes: Vec::new(),
            last_gpus: Vec::new(),
            array: None,
            submit_ms,
            start_ms: None,
            end_ms: None,
            restart_count: 0,
            reasons: Vec::new(),
            gpu_seconds: 0,
            gpu_usage: GpuUsage::default(),
            master_port: None,
            suspension: Suspension::default(),
            steps: Vec::new(),
            spares: Vec::new(),
            repairs: Vec::new(),
        }
    }

    /// Whether the job runs but its processes are stopped (`scontrol suspend`).
    pub fn suspended(&self) -> bool {
        self.state == JobState::Running && self.suspension.since_ms.is_some()
    }

    /// The state as Slurm names it: `SUSPENDED` for a suspended running job.
    pub fn state_name(&self) -> &'static str {
        if self.suspended() {
            "SUSPENDED"
        } else {
            self.state.as_str()
        }
    }

    /// How long the current (or last) run ran by `now_ms`, its suspensions not counted (Slurm's
    /// `TimeUsed`); 0 before it started.
    pub fn run_time_ms_at(&self, now_ms: u64) -> u64 {
        let Some(start) = self.start_ms else { return 0 };
        let end = self.end_ms.unwrap_or(now_ms).max(start);
        (end - start).saturating_sub(self.suspension.paused_ms_at(end))
    }

    /// Parts of the current run that were committed but not confirmed started yet (a spare's
    /// part starts nothing).
    pub fn launches_pending(&self) -> impl Iterator<Item = &NodeRun> {
        let run = self.run;
        let live = self.state == JobState::Running;
        self.parts.iter().filter(move |p| live && p.run == run && p.launched_by.is_none() && !self.spares.contains(&p.alloc.node))
    }

    /// Parts that must be stopped: any part of an earlier run, and every part once the job
    /// reached a final state or was requeued.
    /// A part that failed stops the whole gang; so does the end of a batch job's script.
    pub fn parts_to_stop(&self) -> impl Iterator<Item = &NodeRun> {
        let run = self.run;
        let failed = self.outcomes.iter().any(|(_, o)| *o != RunOutcome::Exited(0));
        let live = self.state == JobState::Running && !failed && !self.batch_ended();
        self.parts.iter().filter(move |p| !live || p.run != run)
    }

    /// Whether the script of a batch job reported its end (its first node's part): the rest of
    /// the allocation only held resources for its steps.
    pub fn batch_ended(&self) -> bool {
        self.spec.is_batch() && self.last_nodes.first().is_some_and(|first| self.outcomes.iter().any(|(n, _)| n == first))
    }

    /// Every node of the current (or last) run in rank order, as planned: parts that already
    /// ended are released from `parts` but keep their rank here, so a launch re-sent after
    /// some nodes finished still names the whole gang.
    pub fn run_nodes(&self) -> &[NodeId] {
        &self.last_nodes
    }

    /// Nodes of its gang: those of its current or last run once it started (spares not
    /// counted; a job of `-N MIN-MAX` got some number of its range), else the least it asks.
    pub fn node_count(&self) -> u32 {
        if self.start_ms.is_some() && !self.last_nodes.is_empty() {
            u32::try_from(self.last_nodes.len()).unwrap_or(u32::MAX)
        } else {
            self.spec.nodes.max(1)
        }
    }

    /// This node's rank in the current run (its index in [`Job::run_nodes`]).
    pub fn rank_of(&self, node: NodeId) -> Option<usize> {
        self.last_nodes.iter().position(|n| *n == node)
    }

    /// First pending reason, for one-line displays.
    pub fn reason(&self) -> Option<&str> {
        self.reasons.first().map(String::as_str)
    }
}

/// How a run ended, as the agent saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunOutcome {
    /// The process exited with this code.
    Exited(i32),
    /// The process was killed by this signal (not by us).
    Signaled(i32),
    /// Killed after its time limit.
    TimedOut,
    /// Killed because the job was cancelled.
    Killed,
    /// The process could not be started.
    LaunchFailed(String),
    /// The process died with an earlier instance of its node before the launch was confirmed.
    Lost(String),
    /// The preflight (`--preflight`) failed; the job's command never started.
    PreflightFailed(String),
    /// The run's processes ended after the kernel killed at least one of them for the run's
    /// memory limit (its cgroup's OOM kill count): Slurm's OUT_OF_MEMORY, whatever the exit.
    OutOfMemory(String),
}

/// Why a job asked to be requeued (`corral requeue`, `scontrol requeue`) was: in its reasons
/// (`requeued: ...`), so the leader stops it as Slurm does, without its `--signal`.
pub const REQUEUED_ON_REQUEST: &str = "requeued on request";

/// Ports handed out as `MASTER_PORT`, one per job per first node.
pub const MASTER_PORT_FIRST: u16 = 29_500;
pub const MASTER_PORT_COUNT: u16 = 1_000;
