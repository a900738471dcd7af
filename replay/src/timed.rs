//! A trace in simulated time: each job submitted at its time, the leader's engine run after
//! every change as corrald's leader runs it after every applied entry, each launch the engine
//! orders started at once, each run ended at its trace duration (or killed at its limit).
//! Time jumps from one event to the next; the leader's once-a-second refresh pass (slow drifts
//! of priority) is not simulated.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::bail;
use corral_state::ClusterState;
use engine::{Leader, Policy};
use proto::{Command, CommandResult, GresRequest, InstanceId, JobId, JobSpec, JobState, NodeId, RunNo, RunOutcome, SchedulerPolicy};

use crate::cluster::{self, NodeSpec};
use crate::log::Log;
use crate::trace::TraceJob;

/// A finished job leaves the replay's hot state at the leader's next archive step
/// (`min_job_age_s` at 0); no accounting store holds it, so nothing is pruned.
const RETENTION: engine::Retention = engine::Retention { min_job_age_ms: 0, accounting_ms: u64::MAX };
/// Ticks at one instant at most while each pass changes something (a start frees nothing, but
/// a preemption's stop does).
const TICKS_PER_INSTANT_MAX: usize = 8;

/// What happened to one job of the trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobRecord {
    pub trace_id: u64,
    pub gpus: u32,
    pub submit_ms: u64,
    pub start_ms: Option<u64>,
    pub end_ms: Option<u64>,
    /// How long it ran (its trace duration, or its limit).
    pub run_ms: u64,
    /// The start the last backfill reservation it held promised, if it held one.
    pub promised_ms: Option<u64>,
    pub refused: Option<String>,
}

/// The cluster after each instant at which anything changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub at_ms: u64,
    pub gpus_busy: u32,
    pub queued: u32,
    /// Whether a queued job asked no more GPUs than were free in the whole cluster.
    pub fits_by_count: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Outcome {
    pub jobs: Vec<JobRecord>,
    pub samples: Vec<Sample>,
    pub gpus_total: u32,
    /// Scheduling passes the engine ran.
    pub passes: u64,
    /// Commands the state machine applied.
    pub commands: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive(usize),
    End(JobId, RunNo),
}

/// The spec a trace job is submitted with.
pub fn spec_of(job: &TraceJob) -> JobSpec {
    JobSpec {
        name: format!("trace-{}", job.id),
        argv: vec!["true".into()],
        gres: (job.gpus_per_node > 0).then_some(GresRequest { gpu_type: None, count: job.gpus_per_node, ..Default::default() }),
        cpus_per_task: job.cpus_per_node.max(1),
        ntasks_per_node: 1,
        mem_mib: job.mem_per_node_mib,
        time_limit_ms: job.limit_ms,
        workdir: "/".into(),
        user: if job.user.is_empty() { "user".into() } else { job.user.clone() },
        nodes: job.nodes.max(1),
        ..JobSpec::command(vec!["true".into()], "/", "user")
    }
}

/// Replays `jobs` (in submission order) on `nodes` under `policy`.
pub fn run(jobs: &[TraceJob], nodes: &[NodeSpec], policy: Box<dyn Policy>) -> anyhow::Result<Outcome> {
    run_with(jobs, nodes, policy, None)
}

/// [`run`] with the cluster's scheduling policy (partitions, QoS, fair-share decay) set first,
/// as `corral policy set` sets it.
pub fn run_with(
    jobs: &[TraceJob],
    nodes: &[NodeSpec],
    policy: Box<dyn Policy>,
    cluster_policy: Option<&SchedulerPolicy>,
) -> anyhow::Result<Outcome> {
    if nodes.is_empty() {
        bail!("a replay needs at least one node");
    }
    let mut log = Log::default();
    let instances: BTreeMap<NodeId, InstanceId> = cluster::register(&mut log.state, nodes)?.into_iter().collect();
    if let Some(p) = cluster_policy {
        if let CommandResult::Rejected(why) = log.apply(&Command::SetPolicy { policy: p.clone(), now_ms: 0 }) {
            bail!("the policy file was refused: {why}");
        }
    }
    let mut out = Outcome { gpus_total: nodes.iter().map(|n| n.gpus).sum(), ..Outcome::default() };
    out.jobs = jobs.iter().map(|j| JobRecord { trace_id: j.id, gpus: j.gpus(), submit_ms: j.submit_ms, ..JobRecord::default() }).collect();
    let mut r = Replay {
        jobs,
        log,
        // Agents answer at once: nothing is ever re-sent.
        leader: Leader::with_policy(policy, u64::MAX / 4),
        archiver: engine::Archiver::default(),
        wall_limits: engine::WallLimits::default(),
        instances,
        out,
        events: BTreeMap::new(),
        seq: 0,
        index_of: BTreeMap::new(),
        ends: BTreeSet::new(),
    };
    for (i, j) in jobs.iter().enumerate() {
        r.at(j.submit_ms, Event::Arrive(i));
    }
    r.run();
    r.out.commands = r.log.applied;
    Ok(r.out)
}

struct Replay<'t> {
    jobs: &'t [TraceJob],
    log: Log,
    leader: Leader<Box<dyn Policy>>,
    archiver: engine::Archiver,
    wall_limits: engine::WallLimits,
    instances: BTreeMap<NodeId, InstanceId>,
    out: Outcome,
    events: BTreeMap<(u64, u64), Event>,
    seq: u64,
    index_of: BTreeMap<JobId, usize>,
    /// Runs whose end is scheduled.
    ends: BTreeSet<(JobId, RunNo)>,
}

impl Replay<'_> {
    fn at(&mut self, at_ms: u64, event: Event) {
        self.events.insert((at_ms, self.seq), event);
        self.seq += 1;
    }

    fn run(&mut self) {
        let mut now_ms = 0u64;
        loop {
            let next_event = self.events.first_key_value().map(|(k, _)| k.0);
            let wake = self.leader.wake_ms().filter(|&w| w > now_ms);
            now_ms = match (next_event, wake) {
                (Some(e), Some(w)) => e.min(w),
                (Some(e), None) => e,
                (None, Some(w)) if self.log.state.jobs.values().any(|j| j.state == JobState::Pending) => w,
                _ => break,
            };
            while let Some(entry) = self.events.first_entry().filter(|e| e.key().0 <= now_ms) {
                match entry.remove() {
                    Event::Arrive(i) => self.arrive(i, now_ms),
                    Event::End(job, run) => self.end(job, run, now_ms),
                }
            }
            for _ in 0..TICKS_PER_INSTANT_MAX {
                if !self.tick(now_ms) {
                    break;
                }
            }
            self.out.samples.push(sample(&self.log.state, now_ms));
        }
    }

    /// One tick of the leader's sequence (`engine::TICK`) at `now_ms`; whether its pass asked
    /// for anything.
    fn tick(&mut self, now_ms: u64) -> bool {
        let mut changed = false;
        for step in engine::TICK {
            match step {
                // No node goes silent, suspends a job or changes the voters in a replay.
                engine::Step::Liveness | engine::Step::Suspensions | engine::Step::Voters => {}
                // A trace's jobs have no account; a policy's QoS may have a `GrpWall`.
                engine::Step::WallLimits => {
                    for cmd in self.wall_limits.due(&self.log.state, now_ms) {
                        self.log.apply(&cmd);
                    }
                }
                engine::Step::Archive => {
                    if let Some(cmd) = self.archiver.due(&self.log.state, now_ms, RETENTION).and_then(|step| step.archive) {
                        self.log.apply(&cmd);
                    }
                }
                engine::Step::Schedule => {
                    let Some(pass) = self.leader.schedule_pass(&self.log, now_ms, || u32::MAX) else { continue };
                    self.out.passes += 1;
                    if let Some(r) = &pass.reservation {
                        if let Some(&i) = self.index_of.get(&r.job) {
                            self.out.jobs[i].promised_ms = Some(r.start_ms);
                        }
                    }
                    for cmd in &pass.commands {
                        self.log.apply(cmd);
                    }
                    changed = !pass.commands.is_empty();
                }
                engine::Step::Orders => self.carry_out_orders(now_ms),
            }
        }
        changed
    }

    fn arrive(&mut self, i: usize, now_ms: u64) {
        let spec = spec_of(&self.jobs[i]);
        // What a node refuses before it proposes (Slurm refuses the same at submit); the
        // trace's jobs were all taken once, as an admin's.
        if let Err(refusal) = self.log.state.admission(&spec, true, now_ms) {
            self.out.jobs[i].refused = Some(refusal.why);
            return;
        }
        match self.log.apply(&Command::Submit { spec, now_ms }) {
            CommandResult::Submitted { job } => {
                self.index_of.insert(job, i);
            }
            CommandResult::Rejected(why) => self.out.jobs[i].refused = Some(why),
            other => self.out.jobs[i].refused = Some(format!("{other:?}")),
        }
    }

    fn end(&mut self, job: JobId, run: RunNo, now_ms: u64) {
        let parts: Vec<NodeId> = self
            .log
            .state
            .jobs
            .get(&job)
            .map(|j| j.parts.iter().filter(|p| p.run == run).map(|p| p.alloc.node).collect())
            .unwrap_or_default();
        let Some(&i) = self.index_of.get(&job) else { return };
        let t = &self.jobs[i];
        let outcome = if t.limit_ms.is_some_and(|l| l < t.duration_ms) { RunOutcome::TimedOut } else { RunOutcome::Exited(0) };
        for node in parts {
            let cmd = Command::RunFinished { job, run, node, outcome: outcome.clone(), usage: Default::default(), now_ms };
            self.log.apply(&cmd);
        }
        if self.log.state.jobs.get(&job).is_none_or(|j| j.state.is_final()) {
            self.out.jobs[i].end_ms = Some(now_ms);
        }
    }

    /// Carries out the engine's orders as agents that answer at once: a launch starts
    /// (confirmed through the log) and its run's end is scheduled; a stop ends the part now.
    fn carry_out_orders(&mut self, now_ms: u64) {
        let orders = self.leader.orders(&self.log.state, now_ms);
        for (job, node) in orders.launches {
            let Some(run) = self.log.state.jobs.get(&job).map(|j| j.run) else { continue };
            let instance = self.instances.get(&node).copied().unwrap_or_default();
            self.log.apply(&Command::LaunchConfirmed { job, run, node, instance, now_ms });
            let Some(&i) = self.index_of.get(&job) else { continue };
            if !self.ends.insert((job, run)) {
                continue;
            }
            let record = &mut self.out.jobs[i];
            record.start_ms = Some(now_ms);
            let t = &self.jobs[i];
            record.run_ms = t.limit_ms.map_or(t.duration_ms, |l| t.duration_ms.min(l)).max(1);
            let end = now_ms + record.run_ms;
            self.at(end, Event::End(job, run));
        }
        for (job, stop) in orders.stops {
            let cmd = Command::RunFinished {
                job,
                run: stop.run,
                node: stop.node,
                outcome: RunOutcome::Killed,
                usage: Default::default(),
                now_ms,
            };
            self.log.apply(&cmd);
            self.ends.remove(&(job, stop.run));
        }
    }
}

fn sample(state: &ClusterState, at_ms: u64) -> Sample {
    let gpus_busy: u32 = state.jobs_holding_parts().flat_map(|j| j.parts.iter()).map(|p| p.alloc.gpus.len() as u32).sum();
    let gpus_total: u32 = state.nodes.values().map(|n| n.inventory.gpus.len() as u32).sum();
    let free = gpus_total.saturating_sub(gpus_busy);
    let mut queued = 0;
    let mut fits_by_count = false;
    for j in state.jobs.values().filter(|j| j.state == JobState::Pending) {
        queued += 1;
        fits_by_count |= j.spec.gpus() * j.spec.nodes.max(1) <= free;
    }
    Sample { at_ms, gpus_busy, queued, fits_by_count }
}
