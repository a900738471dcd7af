//! A model of Slurm 22.05's scheduling (sched/backfill with select/cons_tres, priority/basic),
//! for side-by-side replays on the same trace and the same leader sequence. Each rule, from
//! Slurm's documentation and source:
//!
//! - Order: `PriorityType=priority/basic` (slurm.conf's default) is first in, first out: by
//!   submission time, then job id.
//! - Main pass (`_schedule()` in src/slurmctld/job_scheduler.c): over at most
//!   `default_queue_depth` jobs (100); a job that cannot start blocks every later job of its
//!   partition for the rest of the pass (they wait with reason `Priority`).
//! - When it runs (src/slurmctld/controller.c `_slurmctld_background`, which wakes on each
//!   whole second): a submitted batch job is not tried at submission (a job submitted to an
//!   idle cluster is still pending a second later, ../shared/peers/slurm/README.md); the
//!   submission counts (`queue_job_scheduler`, `job_sched_cnt`), and the loop runs a pass once
//!   `batch_sched_delay` (3 s) passed since its last one. A job's end counts the same way:
//!   on the real 22.05 peer (scripts/replay-validate.py) the jobs a queue started as others
//!   ended started in groups 3 s apart (59 of 101 gaps between the seconds in which queued
//!   jobs started; 1 s in 5), not at each end. Every `sched_interval` (60 s) the loop runs a
//!   pass over the whole queue.
//! - Backfill (src/plugins/sched/backfill/backfill.c): every `bf_interval` (30 s) over the first
//!   `bf_max_job_test` jobs (500) with `bf_window` (1440 min) and `bf_resolution` (60 s): running
//!   jobs end at their time limits; a job that can start now without delaying an earlier
//!   job's planned start starts; one that cannot is planned at its earliest start and its nodes
//!   are taken out of the plan from then to its end, whole ("for performance reasons", the
//!   backfill docs: `_add_reservation` clears the nodes from the time slots' bitmaps).
//! - Node choice (select/cons_tres `_eval_nodes`): among nodes of equal weight, the best fit,
//!   the fewest idle CPUs first; GPUs are a filter (the first free ones by index).
//! - Shards (`gres/shard`, gres.html "Sharding"): a GPU is given either whole or as shards,
//!   never both; a job's shards on a node come from one GPU (without
//!   `MULTIPLE_SHARING_GRES_PJ`), the first by index with enough free
//!   (`_set_shared_node_bits`, `_pick_shared_gres_topo`). Backfill plans no shard job at a later
//!   time: one starts when it fits now.
//! - MIG layouts are static (not modelled: no MIG here).
//!
//! The tuned variant sets what sites tune: `bf_max_job_test=5000`, `bf_window=10080` (a week,
//! as long as the longest limit of the Philly slices), `bf_busy_nodes` (plans on busy nodes
//! first). `bf_continue` changes only how long backfill holds its locks, which a model has
//! none of. Not modelled: `sched_min_interval` (2 µs), the scheduler's time
//! budgets (`max_sched_time`, `bf_yield_interval`), priority age and fair share, and the
//! time slurmd takes to start and end a job (the replay's run is the trace's duration).

use std::collections::{BTreeMap, BTreeSet};

use engine::Policy;
use proto::{Allocation, JobId, JobState, Placement};
use scheduler::{ClusterView, JobRequest, NodeView, Plan};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlurmConfig {
    pub default_queue_depth: usize,
    pub bf_interval_ms: u64,
    pub bf_max_job_test: usize,
    pub bf_resolution_ms: u64,
    pub bf_window_ms: u64,
    pub bf_busy_nodes: bool,
    /// slurmctld's background loop wakes on each whole second of this clock (0: a pass at
    /// every event, no loop).
    pub loop_ms: u64,
    pub batch_sched_delay_ms: u64,
    pub sched_interval_ms: u64,
}

impl SlurmConfig {
    /// Slurm 22.05's defaults.
    pub fn stock() -> SlurmConfig {
        SlurmConfig {
            default_queue_depth: 100,
            bf_interval_ms: 30_000,
            bf_max_job_test: 500,
            bf_resolution_ms: 60_000,
            bf_window_ms: 1_440 * 60_000,
            bf_busy_nodes: false,
            loop_ms: 1_000,
            batch_sched_delay_ms: 3_000,
            sched_interval_ms: 60_000,
        }
    }

    /// What sites tune (see the module's documentation).
    pub fn tuned() -> SlurmConfig {
        SlurmConfig { bf_max_job_test: 5_000, bf_window_ms: 10_080 * 60_000, bf_busy_nodes: true, ..SlurmConfig::stock() }
    }
}

pub struct SlurmModel {
    cfg: SlurmConfig,
    /// The next time the backfill thread runs (on its `bf_interval` grid).
    next_backfill_ms: u64,
    /// What the last backfill saw (running and pending job ids): the same again at a later
    /// time can start nothing new (time only moves planned starts nearer), so it is skipped.
    last_backfill_seen: Option<(u64, u64, usize)>,
    /// The background loop (`_slurmctld_background`).
    background: Background,
}

/// What slurmctld's background loop keeps between its wakes.
#[derive(Default)]
struct Background {
    /// Jobs pending or running at the last call: a job new to both was submitted, a running
    /// one gone ended.
    pending: BTreeSet<JobId>,
    running: BTreeSet<JobId>,
    /// Submissions and ends since the loop's last pass (`job_sched_cnt`).
    events: usize,
    /// When the loop last ran a pass (`last_sched_time`) and a full one.
    last_pass_ms: Option<u64>,
    last_full_ms: u64,
    now_ms: u64,
}

/// Which pass a call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MainPass {
    None,
    /// To `default_queue_depth`.
    Depth,
    /// The whole queue (`schedule(INFINITE)` every `sched_interval`).
    Full,
}

impl Background {
    /// Notes what happened since the last call (the jobs now pending and running) and says
    /// which main pass runs now.
    fn call(&mut self, cfg: &SlurmConfig, pending: BTreeSet<JobId>, running: BTreeSet<JobId>, now_ms: u64) -> MainPass {
        self.events += pending.iter().filter(|j| !self.pending.contains(j) && !self.running.contains(j)).count();
        self.events += self.running.iter().filter(|j| !running.contains(j)).count();
        (self.pending, self.running, self.now_ms) = (pending, running, now_ms);
        if cfg.loop_ms == 0 {
            return MainPass::Depth;
        }
        let wake = now_ms.is_multiple_of(cfg.loop_ms);
        if wake && now_ms >= self.last_full_ms + cfg.sched_interval_ms {
            (self.last_pass_ms, self.last_full_ms, self.events) = (Some(now_ms), now_ms, 0);
            return MainPass::Full;
        }
        if wake && self.events > 0 && self.last_pass_ms.is_none_or(|t| now_ms >= t + cfg.batch_sched_delay_ms) {
            (self.last_pass_ms, self.events) = (Some(now_ms), 0);
            return MainPass::Depth;
        }
        MainPass::None
    }

    /// The jobs the call's passes started run from now on.
    fn started(&mut self, jobs: &[JobId]) {
        for j in jobs {
            self.pending.remove(j);
            self.running.insert(*j);
        }
    }

    /// The loop's next wake that runs a pass, while events wait for one or jobs pend.
    fn wake_ms(&self, cfg: &SlurmConfig) -> Option<u64> {
        if cfg.loop_ms == 0 || (self.events == 0 && self.pending.is_empty()) {
            return None;
        }
        let full = self.last_full_ms + cfg.sched_interval_ms;
        let due = match self.last_pass_ms {
            Some(t) if self.events > 0 => full.min(t + cfg.batch_sched_delay_ms),
            None if self.events > 0 => 0,
            _ => full,
        };
        Some(round_up(due.max(self.now_ms + 1), cfg.loop_ms))
    }
}

impl SlurmModel {
    pub fn new(cfg: SlurmConfig) -> SlurmModel {
        SlurmModel { cfg, next_backfill_ms: 0, last_backfill_seen: None, background: Background::default() }
    }
}

/// One node as the model plans it.
struct Slot<'v> {
    view: &'v NodeView,
    /// Free GPU indices now (of its type), ascending.
    free_gpus: Vec<u32>,
    /// Shards free on each GPU that has some and is not held whole, by index.
    shards_free: Vec<(u32, u32)>,
    cpus_free: u32,
    mem_free_mib: u64,
    /// (time, GPUs, CPUs, memory) freed when a running job reaches its limit.
    releases: Vec<(u64, u32, u32, u64)>,
    /// Whole-node plans of backfill: [start, end).
    planned: Vec<(u64, u64)>,
}

impl Slot<'_> {
    fn fits_type(&self, j: &JobRequest) -> bool {
        self.view.schedulable
            && ((j.gpus_per_node == 0 && j.shards_per_node == 0)
                || j.gpu_type.as_ref().is_none_or(|t| self.view.gpus.first().is_some_and(|g| &g.gres_type == t)))
            && (!j.exclusive || self.view.idle())
            // `--constraint` (sbatch.html "-C"): every feature; `a|b`, either on each node.
            && j.constraint.iter().all(|c| proto::feature_matches(&self.view.features, c))
            && (j.partition.is_none()
                || self.view.partitions.is_empty()
                || self.view.partitions.iter().any(|p| Some(p) == j.partition.as_ref()))
    }

    fn fits_now(&self, j: &JobRequest) -> bool {
        let gpus = match j.shards_per_node {
            0 => self.free_gpus.len() as u32 >= j.gpus_per_node,
            n => self.shards_free.iter().any(|&(_, f)| f >= n),
        };
        gpus && self.cpus_free >= j.cpus_per_node && self.mem_free_mib >= j.mem_per_node_mib
    }

    /// The earliest time from `now_ms` at which this node holds `j` for `len_ms` without running
    /// into a whole-node plan, within `horizon_ms`.
    fn earliest(&self, j: &JobRequest, now_ms: u64, len_ms: u64, horizon_ms: u64) -> Option<u64> {
        if j.shards_per_node > 0 {
            return self.fits_now(j).then_some(now_ms);
        }
        let (mut gpus, mut cpus, mut mem) = (self.free_gpus.len() as u32, self.cpus_free, self.mem_free_mib);
        let mut t = now_ms;
        let mut k = 0;
        loop {
            while k < self.releases.len() && self.releases[k].0 <= t {
                gpus += self.releases[k].1;
                cpus += self.releases[k].2;
                mem += self.releases[k].3;
                k += 1;
            }
            if gpus >= j.gpus_per_node && cpus >= j.cpus_per_node && mem >= j.mem_per_node_mib {
                match self.planned.iter().filter(|(s, e)| *s < t.saturating_add(len_ms) && *e > t).map(|p| p.1).max() {
                    None => return Some(t),
                    Some(end) => t = end,
                }
            } else if k < self.releases.len() {
                t = self.releases[k].0;
            } else {
                return None;
            }
            if t > horizon_ms {
                return None;
            }
        }
    }

    fn take(&mut self, j: &JobRequest) -> Allocation {
        let gpus: Vec<u32> = match j.shards_per_node {
            0 => self.free_gpus.drain(..j.gpus_per_node as usize).collect(),
            n => match self.shards_free.iter_mut().find(|(_, f)| *f >= n) {
                Some((index, free)) => {
                    *free -= n;
                    let index = *index;
                    self.free_gpus.retain(|&g| g != index);
                    vec![scheduler::shard_slot(index, n)]
                }
                None => Vec::new(),
            },
        };
        self.shards_free.retain(|(g, _)| !gpus.contains(g));
        self.cpus_free -= j.cpus_per_node;
        self.mem_free_mib -= j.mem_per_node_mib;
        Allocation { node: self.view.id, gpus, cpus: j.cpus_per_node, mem_mib: j.mem_per_node_mib }
    }
}

fn round_up(ms: u64, resolution_ms: u64) -> u64 {
    ms.div_ceil(resolution_ms.max(1)).saturating_mul(resolution_ms.max(1))
}

fn limit_of(cfg: &SlurmConfig, j: &JobRequest) -> u64 {
    // A job without a limit runs past any window.
    j.time_limit_ms.unwrap_or(cfg.bf_window_ms.saturating_mul(2))
}

/// select/cons_tres's choice among nodes that hold `j` now: the fewest idle CPUs first.
fn best_fit(slots: &[Slot], j: &JobRequest) -> Option<Vec<usize>> {
    let mut fit: Vec<usize> = (0..slots.len()).filter(|&i| slots[i].fits_type(j) && slots[i].fits_now(j)).collect();
    if fit.len() < j.nodes as usize {
        return None;
    }
    fit.sort_by_key(|&i| (slots[i].cpus_free, i));
    fit.truncate(j.nodes as usize);
    Some(fit)
}

/// One pass's working set: the nodes as planned, the plan, the jobs it started.
struct Pass<'v> {
    cfg: SlurmConfig,
    now_ms: u64,
    slots: Vec<Slot<'v>>,
    plan: Plan,
    started: Vec<JobId>,
}

impl<'v> Pass<'v> {
    fn new(cfg: SlurmConfig, view: &'v ClusterView, now_ms: u64) -> Pass<'v> {
        let mut slots: Vec<Slot> = view
            .nodes
            .values()
            .map(|n| Slot {
                view: n,
                free_gpus: n.gpus.iter().filter(|g| g.free()).map(|g| g.index).collect(),
                shards_free: n.gpus.iter().filter(|g| g.shards_free() > 0).map(|g| (g.index, g.shards_free())).collect(),
                cpus_free: n.cpus_free(),
                mem_free_mib: n.mem_free_mib(),
                releases: Vec::new(),
                planned: Vec::new(),
            })
            .collect();
        let slot_of: BTreeMap<proto::NodeId, usize> = slots.iter().enumerate().map(|(i, s)| (s.view.id, i)).collect();
        for j in view.jobs.iter().filter(|j| !j.running.is_empty() || !j.held.is_empty()) {
            let end = round_up(j.start_ms.unwrap_or(now_ms).saturating_add(limit_of(&cfg, j)), cfg.bf_resolution_ms);
            for a in j.running.iter().chain(&j.held) {
                if let Some(&i) = slot_of.get(&a.node) {
                    slots[i].releases.push((end, a.gpus.len() as u32, a.cpus, a.mem_mib));
                }
            }
        }
        for s in &mut slots {
            s.releases.sort_by_key(|r| r.0);
        }
        Pass { cfg, now_ms, slots, plan: Plan::default(), started: Vec::new() }
    }

    fn start(&mut self, j: &JobRequest, picks: Vec<usize>) {
        let end = round_up(self.now_ms.saturating_add(limit_of(&self.cfg, j)), self.cfg.bf_resolution_ms);
        let mut allocs = Vec::with_capacity(picks.len());
        for i in picks {
            let a = self.slots[i].take(j);
            self.slots[i].releases.push((end, a.gpus.len() as u32, a.cpus, a.mem_mib));
            self.slots[i].releases.sort_by_key(|r| r.0);
            allocs.push(a);
        }
        self.plan.placements.push(Placement { job: j.id, run: j.run, allocs });
        self.started.push(j.id);
    }

    /// The main scheduler: in order, to `depth`; a job that cannot start blocks its partition.
    fn main(&mut self, pending: &[&JobRequest], depth: usize) {
        let mut blocked: Vec<Option<&String>> = Vec::new();
        for j in pending.iter().take(depth) {
            if blocked.contains(&j.partition.as_ref()) {
                continue;
            }
            match best_fit(&self.slots, j) {
                Some(picks) => self.start(j, picks),
                None => blocked.push(j.partition.as_ref()),
            }
        }
    }

    /// Backfill: each of the first `bf_max_job_test` jobs starts now if it delays no earlier
    /// job's planned start, else its earliest start within the window is planned on whole nodes.
    fn backfill(&mut self, pending: &[&JobRequest]) {
        let (cfg, now_ms) = (self.cfg, self.now_ms);
        let horizon = now_ms.saturating_add(cfg.bf_window_ms);
        let tested: Vec<&JobRequest> =
            pending.iter().filter(|j| !self.started.contains(&j.id)).take(cfg.bf_max_job_test).copied().collect();
        for j in tested {
            let len = round_up(limit_of(&cfg, j), cfg.bf_resolution_ms);
            let slots = &self.slots;
            let mut times: Vec<(u64, usize)> = (0..slots.len())
                .filter(|&i| slots[i].fits_type(j))
                .filter_map(|i| Some((slots[i].earliest(j, now_ms, len, horizon)?, i)))
                .collect();
            if times.len() < j.nodes as usize {
                continue;
            }
            if cfg.bf_busy_nodes {
                times.sort_by_key(|&(t, i)| (t, slots[i].free_gpus.len(), i));
            } else {
                times.sort_by_key(|&(t, i)| (t, slots[i].cpus_free, i));
            }
            times.truncate(j.nodes as usize);
            let at = times.iter().map(|t| t.0).max().unwrap_or(now_ms);
            // Each node must hold it from the gang's start, not only from its own.
            if !times.iter().all(|&(_, i)| slots[i].earliest(j, at, len, horizon) == Some(at)) {
                continue;
            }
            if at == now_ms && times.iter().all(|&(_, i)| slots[i].fits_now(j)) {
                self.start(j, times.iter().map(|t| t.1).collect());
            } else {
                for &(_, i) in &times {
                    self.slots[i].planned.push((at, at.saturating_add(len)));
                }
            }
        }
    }
}

impl Policy for SlurmModel {
    fn schedule(&mut self, view: &ClusterView, now_ms: u64) -> Plan {
        let mut pending: Vec<&JobRequest> = view
            .jobs
            .iter()
            .filter(|j| j.state == JobState::Pending && !j.hold && !j.is_array() && j.begin_ms.is_none_or(|b| b <= now_ms))
            .map(|j| &**j)
            .collect();
        pending.sort_by_key(|j| (j.submit_ms, j.id));
        let mut pass = Pass::new(self.cfg, view, now_ms);
        let in_state = |state: JobState| view.jobs.iter().filter(|j| j.state == state).map(|j| j.id).collect();
        match self.background.call(&self.cfg, in_state(JobState::Pending), in_state(JobState::Running), now_ms) {
            MainPass::None => {}
            MainPass::Depth => pass.main(&pending, self.cfg.default_queue_depth),
            MainPass::Full => pass.main(&pending, usize::MAX),
        }
        if now_ms >= self.next_backfill_ms {
            self.next_backfill_ms = now_ms - now_ms % self.cfg.bf_interval_ms + self.cfg.bf_interval_ms;
            let seen = (
                view.jobs.iter().filter(|j| j.state == JobState::Running).map(|j| j.id).sum::<u64>(),
                pending.iter().map(|j| j.id).sum::<u64>(),
                pending.len(),
            );
            if self.last_backfill_seen != Some(seen) || !pass.started.is_empty() {
                self.last_backfill_seen = Some(seen);
                pass.backfill(&pending);
            }
        }
        self.background.started(&pass.started);
        pass.plan
    }

    fn wake_ms(&self) -> Option<u64> {
        Some(self.background.wake_ms(&self.cfg).map_or(self.next_backfill_ms, |w| w.min(self.next_backfill_ms)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Background {
        fn call_at(&mut self, cfg: &SlurmConfig, jobs: (BTreeSet<JobId>, BTreeSet<JobId>), now_ms: u64) -> MainPass {
            self.call(cfg, jobs.0, jobs.1, now_ms)
        }
    }

    #[test]
    fn the_background_loop_runs_a_pass_on_a_whole_second_at_most_every_batch_sched_delay() {
        let cfg = SlurmConfig::stock();
        let mut bg = Background::default();
        let view = |pending: &[JobId], running: &[JobId]| (pending.iter().copied().collect(), running.iter().copied().collect());
        // A submission between wakes waits for the next whole second.
        assert_eq!(bg.call_at(&cfg, view(&[1], &[]), 500), MainPass::None);
        assert_eq!(bg.wake_ms(&cfg), Some(1_000));
        assert_eq!(bg.call_at(&cfg, view(&[1], &[]), 1_000), MainPass::Depth);
        bg.started(&[1]);
        // The next one waits until 3 s after that pass.
        assert_eq!(bg.call_at(&cfg, view(&[2], &[1]), 1_200), MainPass::None);
        assert_eq!(bg.wake_ms(&cfg), Some(4_000));
        assert_eq!(bg.call_at(&cfg, view(&[2], &[1]), 2_000), MainPass::None);
        // An end counts as a submission does: the pass is still the loop's, at 4 s.
        assert_eq!(bg.call_at(&cfg, view(&[2], &[]), 2_345), MainPass::None);
        assert_eq!(bg.call_at(&cfg, view(&[2], &[]), 4_000), MainPass::Depth);
        bg.started(&[2]);
        // Every 60 s, a pass over the whole queue.
        assert_eq!(bg.call_at(&cfg, view(&[3], &[2]), 60_000), MainPass::Full);
    }

    #[test]
    fn release_times_round_up_to_the_resolution() {
        assert_eq!(round_up(1, 60_000), 60_000);
        assert_eq!(round_up(60_000, 60_000), 60_000);
        assert_eq!(round_up(0, 60_000), 0);
    }
}
