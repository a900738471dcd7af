//! The scheduling pass: order, eligibility, placement with indexes of free capacity, EASY
//! backfill, preemption, array expansion, MIG re-layout and why-pending reasons.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use proto::{Allocation, DependencyKind, JobId, JobState, NodeId, Placement};

use crate::fit::node_matches;
use crate::format::fmt_time_ms;
use crate::frag::{self, FragIndex};
use crate::limits::LimitUsage;
use crate::topo;
use crate::units::{Kinds, ANY};
use crate::view::{cpu_shares, mig_slot, shard_slot, ClusterView, JobRequest, NodeView, PreemptAction};
use crate::windows::{Fence, Windows};

mod backfill;
mod eligibility;
mod explain;
mod gang;
mod index;
mod layouts;
mod preempt;

use index::{array_counts, index_gpu_types, intern_partitions, PartIndex, TypeIndex};

/// What one pass decided. The caller commits `placements` (re-checked with `fits_gang`), creates
/// array tasks for `array_tasks`, sends `preemptions`, reconfigures GPUs per `mig_layouts`, and
/// stores `pending` as each job's reasons.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// One per started job, one allocation per node of its gang. A placement that starts an
    /// array task names the ARRAY job id; see `array_tasks`.
    pub placements: Vec<Placement>,
    /// Every pending job not placed now, with all the reasons, most important first.
    pub pending: BTreeMap<JobId, Vec<String>>,
    /// Running jobs to stop so that a job of a QoS allowed to preempt can start next pass.
    pub preemptions: Vec<(JobId, PreemptAction)>,
    /// Idle MIG-mode GPUs to re-partition: (node, gpu index, profiles by start slice).
    pub mig_layouts: Vec<(NodeId, u32, Vec<String>)>,
    /// Array tasks started: `placements[placement]` (whose `job` is `array`) is task `task`. The
    /// state machine creates the task job (new id, `Job::array` set) and places it there.
    pub array_tasks: Vec<ArrayTaskStart>,
    /// CPU and NIC binding of every allocation of every placement, in placement order.
    pub bindings: Vec<Binding>,
    /// The EASY backfill reservation of the first job that cannot start, if any.
    pub reservation: Option<Reservation>,
    /// Every reservation of the pass: that one, then those of jobs that waited longer than
    /// `SchedulerConfig::reserve_after_wait_ms` (on other nodes).
    pub reservations: Vec<Reservation>,
    /// Pending jobs in the order they were considered, with their priority.
    pub queue: Vec<(JobId, u64)>,
    /// The first time after `now_ms` at which a pending job's chances change with time alone:
    /// a begin time, or the end of a wait for fewer switches. (Slower drifts, such as priority
    /// age, fair-share decay and the backfill windows of jobs past their limits, have no one
    /// time; a caller that skips passes refreshes them on a period.)
    pub wake_ms: Option<u64>,
    /// The most whole GPUs (of any type, MIG instances not counted), CPUs and memory free on
    /// any schedulable node after this pass, each its own maximum: a job asking more of one on
    /// each node than this cannot start until something is freed. `None` when a job waited
    /// for the backfill reservation alone (it would fit otherwise): a new job of higher
    /// priority could move the reservation and let it start.
    pub room: Option<Room>,
}

/// See [`Plan::room`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Room {
    pub gpus: u32,
    /// The most shards free on one GPU.
    pub shards: u32,
    pub cpus: u32,
    pub mem_mib: u64,
}

impl Room {
    /// Whether one node's share of `spec` is more than this room has of GPUs, CPUs or memory:
    /// then no node holds it now. MIG instances are not counted: a MIG request is never
    /// beyond the room.
    pub fn excludes(&self, spec: &proto::JobSpec) -> bool {
        if spec.gres.as_ref().and_then(|g| g.gpu_type.as_deref()).is_some_and(crate::is_mig_profile) {
            return false;
        }
        let need = crate::PerNode::of(spec);
        need.gpus > self.gpus || spec.shards() > self.shards || need.cpus > self.cpus || need.mem_mib > self.mem_mib
    }
}

impl Plan {
    /// Whether carrying the plan out changes nothing: no start, preemption or MIG layout.
    pub fn changes_nothing(&self) -> bool {
        self.placements.is_empty() && self.preemptions.is_empty() && self.mig_layouts.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrayTaskStart {
    pub array: JobId,
    pub task: u32,
    /// Index into `Plan::placements`.
    pub placement: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Index into `Plan::placements`.
    pub placement: usize,
    pub node: NodeId,
    /// `Allocation::gpus` of this allocation.
    pub gpus: Vec<u32>,
    /// CPUs per NUMA node: (numa node, cpus), ascending.
    pub numa_cpus: Vec<(u32, u32)>,
    /// Nearest NIC to the GPUs (for NCCL_IB_HCA / NCCL_SOCKET_IFNAME).
    pub nic: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub job: JobId,
    pub start_ms: u64,
    pub nodes: Vec<NodeId>,
}

/// Prefix of a reason that no amount of waiting fixes.
pub const NEVER: &str = proto::REASON_NEVER_PREFIX;
/// Reservations one pass makes at most (one bit each in `ShapeKey::restricted`).
pub const RESERVATIONS_MAX: usize = 16;
/// Bound on nodes one job may try when single-node candidates keep failing their checks.
const SINGLE_NODE_TRIES_MAX: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Spare {
    gpus: u32,
    cpus: u32,
    mem_mib: u64,
}

struct Resv {
    job: JobId,
    start_ms: u64,
    tid: u16,
    spare: BTreeMap<usize, Spare>,
}

/// Nodes of one (partition, type) by free count of that type.
#[derive(Default)]
struct Buckets {
    by_free: Vec<BTreeSet<u32>>,
}

impl Buckets {
    fn insert(&mut self, free: u32, n: u32) {
        let f = free as usize;
        if self.by_free.len() <= f {
            self.by_free.resize_with(f + 1, BTreeSet::new);
        }
        self.by_free[f].insert(n);
    }
    fn remove(&mut self, free: u32, n: u32) {
        if let Some(b) = self.by_free.get_mut(free as usize) {
            b.remove(&n);
        }
    }
    fn count_at_least(&self, k: u32) -> usize {
        self.by_free.iter().skip(k as usize).map(BTreeSet::len).sum()
    }
    fn all(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_free.iter().flat_map(|b| b.iter().copied())
    }
}

/// What one node gives a job.
struct Pick {
    node: usize,
    gpus: Vec<usize>,
    mig: Vec<(usize, usize)>,
    /// The GPU (by index) whose shards a shard job shares.
    shared: Option<u32>,
}

enum Fail {
    Never(String),
    NoNode,
    Gang { have: usize },
    Switches { limit: u32, best: u32, until_ms: u64 },
    Required(String),
}

/// (constraint, nodelist, exclude) of a job, interned for the shape cache.
type NodeLists = (Vec<String>, Vec<String>, Vec<String>);

#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ShapeKey {
    part: u16,
    tid: u16,
    gpus: u32,
    shards: u32,
    cpus: u32,
    mem_mib: u64,
    nodes: u32,
    exclusive: bool,
    lists: u32,
    switch_strict: Option<u32>,
    /// The reservations (the pass's backfill ones and admins' windows) it would run into.
    fence: Fence,
}

struct Pass<'v> {
    view: &'v ClusterView,
    now_ms: u64,
    /// The view's nodes, each copied only when this pass places work on it (at 5,000 nodes a
    /// copy of them all was half of a pass that places one job: `sched-bench one-job`).
    nodes: Vec<Cow<'v, NodeView>>,
    node_ix: BTreeMap<NodeId, usize>,
    name_ix: BTreeMap<&'v str, usize>,
    part_names: Vec<String>,
    part_ix: BTreeMap<String, u16>,
    default_part: u16,
    type_names: Vec<String>,
    type_ix: BTreeMap<String, u16>,
    type_is_mig: Vec<bool>,
    node_parts: Vec<Vec<u16>>,
    node_keys: Vec<Vec<(u16, u16, u32)>>,
    index: BTreeMap<(u16, u16), Buckets>,
    prio: Vec<u64>,
    /// Jobs started in this pass (they count as running for dependencies and singleton).
    started: BTreeSet<JobId>,
    preempted: BTreeSet<JobId>,
    array_active: BTreeMap<JobId, u32>,
    array_created: BTreeMap<JobId, BTreeSet<u32>>,
    lists_ix: BTreeMap<NodeLists, u32>,
    fail_cache: BTreeMap<ShapeKey, Vec<String>>,
    /// A job would have fit but for the backfill reservation (see [`Plan::room`]).
    backfill_held: bool,
    /// Backfill reservations: the first job that cannot start, then jobs that waited past
    /// `SchedulerConfig::reserve_after_wait_ms`, on disjoint nodes, at most [`RESERVATIONS_MAX`].
    resvs: Vec<Resv>,
    /// The reservation holding each reserved node (index into `resvs`).
    resv_of_node: BTreeMap<usize, usize>,
    /// Admins' reservations (`scontrol create reservation`).
    windows: Windows,
    /// (node, end, allocation) of each placement of this pass.
    placed: Vec<(usize, u64, Allocation)>,
    timeline: Option<Vec<Vec<(u64, Allocation)>>>,
    holders: Option<Vec<Vec<(u32, JobId)>>>,
    /// What running jobs and this pass's starts hold against the accounting limits (`None`:
    /// nothing is limited).
    limits: Option<LimitUsage>,
    /// The nodes in classes of nodes alike, with the workload, for fragmentation-aware
    /// placement (made on first use, kept as the pass places work).
    frag: Option<FragIndex>,
    plan: Plan,
}

fn dep_label(kind: DependencyKind) -> &'static str {
    match kind {
        DependencyKind::After => "after",
        DependencyKind::AfterOk => "afterok",
        DependencyKind::AfterNotOk => "afternotok",
        DependencyKind::AfterAny => "afterany",
        DependencyKind::Singleton => "singleton",
    }
}

/// Why a job that may start waits when the pass reached `starts_per_pass_max` (squeue shows
/// `Priority`, as Slurm does for the jobs its main loop did not reach).
pub const PACED: &str = "Priority: the leader paces job starts while it catches up";

/// Decides where jobs run now. Pure: the same view and `now_ms` give the same plan.
pub fn schedule(view: &ClusterView, now_ms: u64) -> Plan {
    let mut pass = Pass::new(view, now_ms);
    pass.run();
    pass.plan
}

impl<'v> Pass<'v> {
    fn new(view: &'v ClusterView, now_ms: u64) -> Pass<'v> {
        let nodes: Vec<Cow<'v, NodeView>> = view.nodes.values().map(|n| Cow::Borrowed(&**n)).collect();
        let node_ix: BTreeMap<NodeId, usize> = view.nodes.keys().enumerate().map(|(i, &id)| (id, i)).collect();
        let name_ix: BTreeMap<&str, usize> = view.nodes.values().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
        let PartIndex { names: part_names, ix: part_ix, default: default_part, node_parts } = intern_partitions(view, &nodes);
        let TypeIndex { names: type_names, ix: type_ix, is_mig: type_is_mig, node_keys, index } = index_gpu_types(&nodes, &node_parts);
        assert!(view.jobs.windows(2).all(|w| w[0].id < w[1].id), "the view's jobs are in id order");
        let (array_active, array_created) = array_counts(view);
        let windows = Windows::new(view, now_ms, &name_ix, nodes.len());
        let mut pass = Pass {
            view,
            now_ms,
            nodes,
            node_ix,
            name_ix,
            part_names,
            part_ix,
            default_part,
            type_names,
            type_ix,
            type_is_mig,
            node_parts,
            node_keys,
            index,
            prio: Vec::new(),
            started: BTreeSet::new(),
            preempted: BTreeSet::new(),
            array_active,
            array_created,
            lists_ix: BTreeMap::new(),
            fail_cache: BTreeMap::new(),
            backfill_held: false,
            resvs: Vec::new(),
            resv_of_node: BTreeMap::new(),
            windows,
            placed: Vec::new(),
            timeline: None,
            holders: None,
            limits: LimitUsage::new(view, now_ms),
            frag: None,
            plan: Plan::default(),
        };
        pass.prio = crate::priority::priorities(view, now_ms);
        pass
    }

    fn run(&mut self) {
        let view = self.view;
        let mut queue: Vec<usize> = (0..view.jobs.len())
            .filter(|&i| {
                let j = &view.jobs[i];
                j.state == JobState::Pending && (!j.is_array() || self.array_tasks_left(j))
            })
            .collect();
        queue.sort_by_key(|&i| (Reverse(self.prio[i]), view.jobs[i].submit_ms, view.jobs[i].id));
        self.plan.queue = queue.iter().map(|&i| (view.jobs[i].id, self.prio[i])).collect();
        let windows_change = self.windows.next_change_ms(self.now_ms).filter(|_| !queue.is_empty());
        self.plan.wake_ms = queue.iter().filter_map(|&i| self.wake_ms(&view.jobs[i])).chain(windows_change).min();
        for &i in &queue {
            if self.starts_left() == 0 {
                self.plan.pending.insert(view.jobs[i].id, vec![PACED.to_string()]);
                continue;
            }
            self.consider(i);
        }
        self.pinned_layouts();
        self.mig_relayout();
        if !self.backfill_held {
            self.plan.room = Some(self.room());
        }
    }

    /// What the schedulable nodes have free now (see [`Plan::room`]).
    fn room(&self) -> Room {
        let mut room = Room::default();
        for node in self.nodes.iter().filter(|n| n.schedulable) {
            let gpus = self.kinds().free(node, ANY);
            let shards = node.gpus.iter().map(|g| g.shards_free()).max().unwrap_or(0);
            room = Room {
                gpus: room.gpus.max(gpus),
                shards: room.shards.max(shards),
                cpus: room.cpus.max(node.cpus_free()),
                mem_mib: room.mem_mib.max(node.mem_free_mib()),
            };
        }
        room
    }

    fn kinds(&self) -> Kinds<'_> {
        Kinds { names: &self.type_names, is_mig: &self.type_is_mig }
    }

    /// Where job `id` is in the view's jobs (kept in id order).
    fn job_index(&self, id: JobId) -> Option<usize> {
        self.view.jobs.binary_search_by_key(&id, |j| j.id).ok()
    }

    /// Starts this pass may still make under `starts_per_pass_max`.
    fn starts_left(&self) -> usize {
        (self.view.config.starts_per_pass_max as usize).saturating_sub(self.plan.placements.len())
    }

    fn array_tasks_left(&self, j: &JobRequest) -> bool {
        // Every created task is one of the array's (the state checks each placement's task).
        let created = self.array_created.get(&j.id).map_or(0, BTreeSet::len);
        j.array.as_ref().is_some_and(|a| created < a.len())
    }

    fn partition_of(&self, j: &JobRequest) -> Option<u16> {
        match &j.partition {
            None => Some(self.default_part),
            Some(p) => self.part_ix.get(p).copied(),
        }
    }

    fn effective_limit_ms(&self, j: &JobRequest) -> Option<u64> {
        j.time_limit_ms.or_else(|| {
            let name = j.partition.as_deref().unwrap_or(&self.part_names[self.default_part as usize]);
            self.view.partitions.get(name).and_then(|p| p.default_time_limit_ms)
        })
    }

    fn tid_of(&self, j: &JobRequest) -> Option<u16> {
        if j.gpus_per_node == 0 && j.shards_per_node == 0 {
            return Some(ANY);
        }
        match &j.gpu_type {
            None => Some(ANY),
            Some(t) => self.type_ix.get(t).copied(),
        }
    }

    fn kind(&self, j: &JobRequest) -> String {
        let gpu = match &j.gpu_type {
            Some(t) if j.gpus_per_node > 0 || j.shards_per_node > 0 => format!("gpu:{t}"),
            _ => "gpu".to_string(),
        };
        match j.shards_per_node {
            0 => gpu,
            n => format!("{gpu} with {n} shards free"),
        }
    }

    fn consider(&mut self, i: usize) {
        let view = self.view;
        let j = &view.jobs[i];
        let mut reasons = self.eligibility(j);
        let part = self.partition_of(j);
        let tid = self.tid_of(j);
        let end_ms = self.effective_limit_ms(j).map(|l| self.now_ms.saturating_add(l));
        let (Some(part), Some(tid)) = (part, tid) else {
            if let (Some(p), None) = (part, tid) {
                reasons.push(format!("no node in partition {} has {}", self.part_names[p as usize], self.kind(j)));
            }
            self.plan.pending.insert(j.id, reasons);
            return;
        };
        if !reasons.is_empty() {
            // Not eligible: still tell what the resources would say, where reasons are wanted.
            if !view.config.explain_ineligible {
                self.plan.pending.insert(j.id, reasons);
                return;
            }
            if let Err(r) = self.attempt(j, part, tid, end_ms, true) {
                reasons.extend(r);
            }
            self.plan.pending.insert(j.id, reasons);
            return;
        }
        if j.is_array() {
            self.consider_array(j, part, tid, end_ms);
            return;
        }
        match self.attempt(j, part, tid, end_ms, false) {
            Ok(()) => {
                self.started.insert(j.id);
                if let Some(t) = &j.array_task {
                    *self.array_active.entry(t.array_job).or_default() += 1;
                }
            }
            Err(mut r) => {
                self.after_failure(j, i, part, tid, &mut r);
                self.plan.pending.insert(j.id, r);
            }
        }
    }

    fn consider_array(&mut self, j: &'v JobRequest, part: u16, tid: u16, end_ms: Option<u64>) {
        let Some(spec) = &j.array else { return };
        // Taken out while tasks are placed (nothing below reads it) and put back after: no copy.
        let created = self.array_created.remove(&j.id).unwrap_or_default();
        let mut reasons = Vec::new();
        let mut started = 0u32;
        let active = self.array_active.get(&j.id).copied().unwrap_or(0);
        let room = spec.throttle.map_or(u32::MAX, |t| t.saturating_sub(active));
        for task in spec.iter().filter(|t| !created.contains(t)) {
            if started >= room {
                let t = spec.throttle.unwrap_or(0);
                reasons.push(format!("array throttle %{t} reached ({} tasks running)", active + started));
                break;
            }
            if started >= self.view.config.array_tasks_per_pass_max {
                reasons.push("array task start limit of this pass reached".to_string());
                break;
            }
            if self.starts_left() == 0 {
                reasons.push(PACED.to_string());
                break;
            }
            let over = self.limit_reasons(j);
            if !over.is_empty() {
                reasons.extend(over);
                break;
            }
            let before = self.plan.placements.len();
            match self.attempt(j, part, tid, end_ms, false) {
                Ok(()) => {
                    started += 1;
                    *self.array_active.entry(j.id).or_default() += 1;
                    self.plan.array_tasks.push(ArrayTaskStart { array: j.id, task, placement: before });
                }
                Err(mut r) => {
                    let i = self.job_index(j.id).unwrap_or(0);
                    self.after_failure(j, i, part, tid, &mut r);
                    reasons.extend(r);
                    break;
                }
            }
        }
        let left = spec.len().saturating_sub(created.len() + started as usize);
        if !created.is_empty() {
            self.array_created.insert(j.id, created);
        }
        if left > 0 {
            let mut all = vec![format!("array: {left} of {} tasks not started", spec.len())];
            all.extend(reasons);
            self.plan.pending.insert(j.id, all);
        }
    }

    /// After a failed placement: preempt if the QoS allows, else make the EASY reservation if
    /// none exists yet.
    fn after_failure(&mut self, j: &JobRequest, i: usize, part: u16, tid: u16, reasons: &mut Vec<String>) {
        if reasons.iter().any(|r| r.starts_with("held for backfill")) {
            return;
        }
        if let Some(victims) = self.try_preempt(j, i, part, tid) {
            let ids: Vec<String> = victims.iter().map(|v| v.to_string()).collect();
            reasons.push(format!("waiting for preempted jobs {} to stop", ids.join(", ")));
            return;
        }
        let cfg = &self.view.config;
        let top = self.resvs.is_empty();
        // The first `reservation_depth` jobs that cannot start, then those that waited long.
        let deep = self.resvs.len() < (cfg.reservation_depth as usize).min(RESERVATIONS_MAX);
        let starving = self.resvs.len() < RESERVATIONS_MAX
            && self.now_ms.saturating_sub(j.submit_ms) >= cfg.reserve_after_wait_ms
            && cfg.reserve_after_wait_ms < u64::MAX;
        if cfg.backfill && (top || deep || starving) && !self.type_is_mig[tid as usize] {
            if reasons.first().is_some_and(|r| r.starts_with(NEVER)) {
                return;
            }
            match self.reserve(j, part, tid) {
                Some(r) => {
                    let names: Vec<&str> = r.nodes.iter().filter_map(|n| self.view.nodes.get(n)).map(|n| n.name.as_str()).collect();
                    let why = if top {
                        "top of the queue"
                    } else if deep {
                        "next in the queue"
                    } else {
                        "waited long"
                    };
                    reasons.push(format!("{why}: reserved to start by {} on {}", fmt_time_ms(r.start_ms), names.join(", ")));
                    if top {
                        self.plan.reservation = Some(r.clone());
                    }
                    self.plan.reservations.push(r);
                }
                None if top => reasons.push("no reservation possible: the jobs holding the nodes it needs have no time limit".to_string()),
                None => {}
            }
        }
    }

    fn lists_id(&mut self, j: &JobRequest) -> u32 {
        if j.constraint.is_empty() && j.nodelist.is_empty() && j.exclude.is_empty() {
            return 0;
        }
        let key = (j.constraint.clone(), j.nodelist.clone(), j.exclude.clone());
        let next = self.lists_ix.len() as u32 + 1;
        *self.lists_ix.entry(key).or_insert(next)
    }

    /// When `j`'s chances change with time alone, if after now (see `Plan::wake_ms`).
    fn wake_ms(&self, j: &JobRequest) -> Option<u64> {
        let begin = j.begin_ms.filter(|&b| b > self.now_ms);
        let switches = j.switches.map(|(_, wait_ms)| j.submit_ms.saturating_add(wait_ms)).filter(|&t| t > self.now_ms);
        begin.into_iter().chain(switches).min()
    }

    fn switch_strict(&self, j: &JobRequest) -> Option<u32> {
        let (limit, wait_ms) = j.switches?;
        (self.now_ms < j.submit_ms.saturating_add(wait_ms)).then_some(limit)
    }

    /// The reservations `j`, ending at `end_ms`, would run into: bit k for `resvs[k]`, and the
    /// admins' windows.
    fn fence(&self, j: &JobRequest, end_ms: Option<u64>) -> Fence {
        let mut mask = 0;
        for (k, r) in self.resvs.iter().enumerate() {
            if r.job != j.id && end_ms.is_none_or(|e| e > r.start_ms) {
                mask |= 1 << k;
            }
        }
        Fence { backfill: mask, windows: self.windows.in_way(j, self.now_ms, end_ms), own: self.windows.own(j) }
    }

    /// The reservation on node `n` that `restricted` says `j` runs into, if any.
    fn resv_in_way(&self, n: usize, restricted: u32) -> Option<&Resv> {
        let k = *self.resv_of_node.get(&n)?;
        (restricted & (1 << k) != 0).then(|| &self.resvs[k])
    }

    /// Places `j` now (or, with `dry`, only checks); on failure, every resource reason.
    fn attempt(&mut self, j: &JobRequest, part: u16, tid: u16, end_ms: Option<u64>, dry: bool) -> Result<(), Vec<String>> {
        let fence = self.fence(j, end_ms);
        let key = ShapeKey {
            part,
            tid,
            gpus: j.gpus_per_node,
            shards: j.shards_per_node,
            cpus: j.cpus_per_node,
            mem_mib: j.mem_per_node_mib,
            nodes: j.nodes,
            exclusive: j.exclusive,
            lists: self.lists_id(j),
            switch_strict: self.switch_strict(j),
            fence,
        };
        if let Some(r) = self.fail_cache.get(&key) {
            return Err(r.clone());
        }
        match self.find(j, part, tid, fence) {
            Ok(picks) => {
                if !dry {
                    self.commit(j, picks, end_ms);
                }
                Ok(())
            }
            Err(fail) => {
                let mut reasons = self.explain(j, part, tid, fail);
                if fence.backfill != 0 && self.find(j, part, tid, Fence { backfill: 0, ..fence }).is_ok() {
                    self.backfill_held = true;
                    if let Some(r) = self.resvs.iter().enumerate().find(|(k, _)| fence.backfill & (1 << k) != 0).map(|(_, r)| r) {
                        reasons = vec![format!("held for backfill reservation of job {} until {}", r.job, fmt_time_ms(r.start_ms))];
                    }
                } else if fence.windows != 0 && self.find(j, part, tid, Fence { backfill: 0, windows: 0, ..fence }).is_ok() {
                    reasons = vec![self.windows.reason(fence.windows)];
                }
                self.fail_cache.insert(key, reasons.clone());
                Err(reasons)
            }
        }
    }

    fn node_ok(&self, n: usize, j: &JobRequest, tid: u16, fence: Fence) -> bool {
        let node = &self.nodes[n];
        if node_matches(node, j).is_err() || !self.windows.node_ok(n, fence) {
            return false;
        }
        if j.exclusive && !node.idle() {
            return false;
        }
        if node.cpus_free() < j.cpus_per_node || node.mem_free_mib() < j.mem_per_node_mib {
            return false;
        }
        if let Some(r) = self.resv_in_way(n, fence.backfill) {
            if let Some(s) = r.spare.get(&n) {
                if j.exclusive {
                    return false;
                }
                let conflict = r.tid == ANY || tid == ANY || r.tid == tid;
                if (conflict && Kinds::units_needed(j) > s.gpus) || j.cpus_per_node > s.cpus || j.mem_per_node_mib > s.mem_mib {
                    return false;
                }
            }
        }
        true
    }

    fn pick(&self, n: usize, j: &JobRequest, tid: u16) -> Option<Pick> {
        let node = &self.nodes[n];
        let k = j.gpus_per_node as usize;
        if self.type_is_mig[tid as usize] {
            let name = &self.type_names[tid as usize];
            let free: Vec<(usize, usize)> = node
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, g)| g.healthy && g.mig_enabled && !g.draining())
                .flat_map(|(gi, g)| g.mig.iter().enumerate().filter(|(_, m)| !m.busy && &m.profile == name).map(move |(mi, _)| (gi, mi)))
                .collect();
            let mig = topo::pick_mig(node, &free, k)?;
            return Some(Pick { node: n, gpus: Vec::new(), mig, shared: None });
        }
        if j.shards_per_node > 0 {
            let shared = Some(frag::tightest_shared(node, j)?);
            return Some(Pick { node: n, gpus: Vec::new(), mig: Vec::new(), shared });
        }
        let free: Vec<usize> = node
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| g.free() && (tid == ANY || g.gres_type == self.type_names[tid as usize]))
            .map(|(i, _)| i)
            .collect();
        let gpus = topo::pick_gpus(node, &free, k, j.cpus_per_node)?;
        Some(Pick { node: n, gpus, mig: Vec::new(), shared: None })
    }

    /// A single node for `j` among the nodes of partition `part` that may hold it, where it
    /// adds the least fragmentation ([`FragIndex::choose`]); the GPU to share is the one it chose.
    fn find_unfragmented(&mut self, j: &JobRequest, part: u16, tid: u16, fence: Fence) -> Result<Vec<Pick>, Fail> {
        let type_ix = &self.type_ix;
        let ty_of = |t: &str| type_ix.get(t).copied();
        let mut frag = self.frag.take().unwrap_or_else(|| FragIndex::new(&self.view.jobs, &self.nodes, &self.node_parts, &ty_of));
        let chosen = frag.choose(&self.nodes, j, part, &ty_of, |n| self.node_ok(n, j, tid, fence));
        self.frag = Some(frag);
        let (n, shared) = chosen.ok_or(Fail::NoNode)?;
        let mut pick = self.pick(n, j, tid).ok_or(Fail::NoNode)?;
        if shared.is_some() {
            pick.shared = shared;
        }
        Ok(vec![pick])
    }

    fn find(&mut self, j: &JobRequest, part: u16, tid: u16, fence: Fence) -> Result<Vec<Pick>, Fail> {
        // A shard job may share a GPU whatever the whole GPUs free: every bucket.
        let need = if j.shards_per_node > 0 { 0 } else { j.gpus_per_node };
        let Some(b) = self.index.get(&(part, tid)) else {
            return Err(Fail::Never(self.never_text(j, part)));
        };
        // MIG instances are placed by their own rules (`topo::pick_mig`), not by fragmentation.
        if j.nodes_max == 1
            && j.nodelist.is_empty()
            && self.view.config.fragmentation_aware
            && !j.exclusive
            && !self.type_is_mig[tid as usize]
        {
            return self.find_unfragmented(j, part, tid, fence);
        }
        if j.nodes_max == 1 {
            if !j.nodelist.is_empty() {
                for name in &j.nodelist {
                    let Some(&n) = self.name_ix.get(name.as_str()) else { continue };
                    if !self.node_parts[n].contains(&part) || !self.nodes[n].schedulable {
                        continue;
                    }
                    if self.node_ok(n, j, tid, fence) {
                        if let Some(p) = self.pick(n, j, tid) {
                            return Ok(vec![p]);
                        }
                    }
                }
                return Err(Fail::NoNode);
            }
            let mut tries = 0usize;
            for bucket in b.by_free.iter().skip(need as usize) {
                for &n in bucket {
                    tries += 1;
                    if tries > SINGLE_NODE_TRIES_MAX {
                        return Err(Fail::NoNode);
                    }
                    let n = n as usize;
                    if self.node_ok(n, j, tid, fence) {
                        if let Some(p) = self.pick(n, j, tid) {
                            return Ok(vec![p]);
                        }
                    }
                }
            }
            return Err(Fail::NoNode);
        }
        self.find_gang(j, part, tid, fence, need)
    }

    fn ensure_holders(&mut self) {
        if self.holders.is_some() {
            return;
        }
        let mut h: Vec<Vec<(u32, JobId)>> = vec![Vec::new(); self.nodes.len()];
        for j in &self.view.jobs {
            for a in &j.held {
                if let Some(&n) = self.node_ix.get(&a.node) {
                    h[n].extend(a.gpus.iter().map(|&s| (s, j.id)));
                }
            }
        }
        for p in &self.plan.placements {
            for a in &p.allocs {
                if let Some(&n) = self.node_ix.get(&a.node) {
                    h[n].extend(a.gpus.iter().map(|&s| (s, p.job)));
                }
            }
        }
        self.holders = Some(h);
    }

    fn commit(&mut self, j: &JobRequest, picks: Vec<Pick>, end_ms: Option<u64>) {
        let placement = self.plan.placements.len();
        let mut allocs = Vec::with_capacity(picks.len());
        let restricted = self.fence(j, end_ms).backfill;
        for pick in picks {
            let n = pick.node;
            let node = &self.nodes[n];
            let mut gpus: Vec<u32> = pick.gpus.iter().map(|&p| node.gpus[p].index).collect();
            gpus.extend(pick.mig.iter().map(|&(g, m)| mig_slot(node.gpus[g].index, node.gpus[g].mig[m].start_slice)));
            gpus.extend(pick.shared.map(|g| shard_slot(g, j.shards_per_node)));
            gpus.sort_unstable();
            let (cpus, mem_mib) = if j.exclusive { (node.cpus_free(), node.mem_free_mib()) } else { (j.cpus_per_node, j.mem_per_node_mib) };
            let alloc = Allocation { node: node.id, gpus, cpus, mem_mib };
            let numa_cpus = cpu_shares(node, &alloc.gpus, cpus);
            let mut positions = pick.gpus.clone();
            positions.extend(pick.mig.iter().map(|&(g, _)| g));
            positions.extend(pick.shared.and_then(|i| node.gpus.iter().position(|g| g.index == i)));
            let nic = topo::nearest_nic(node, &positions);
            self.plan.bindings.push(Binding { placement, node: node.id, gpus: alloc.gpus.clone(), numa_cpus, nic });
            let taken = self.nodes[n].to_mut().take(&alloc);
            assert!(taken.is_ok(), "scheduler handed out a held resource on node {}: {taken:?}", alloc.node);
            self.reindex(n);
            if let Some(&k) = self.resv_of_node.get(&n).filter(|&&k| restricted & (1 << k) != 0) {
                if let Some(s) = self.resvs[k].spare.get_mut(&n) {
                    s.gpus = s.gpus.saturating_sub(alloc.gpus.len() as u32);
                    s.cpus = s.cpus.saturating_sub(cpus);
                    s.mem_mib = s.mem_mib.saturating_sub(mem_mib);
                }
            }
            let end = end_ms.unwrap_or(u64::MAX);
            if let Some(t) = &mut self.timeline {
                t[n].push((end, alloc.clone()));
                t[n].sort_by_key(|e| e.0);
            }
            if let Some(h) = &mut self.holders {
                h[n].extend(alloc.gpus.iter().map(|&s| (s, j.id)));
            }
            self.placed.push((n, end, alloc.clone()));
            allocs.push(alloc);
        }
        self.plan.placements.push(Placement { job: j.id, run: if j.is_array() { 1 } else { j.run }, allocs });
        if let Some(l) = &mut self.limits {
            l.add_nodes(self.view, j, self.plan.placements.last().map_or(j.nodes, |p| p.allocs.len() as u32));
        }
    }

    fn reindex(&mut self, n: usize) {
        let node = &self.nodes[n];
        if !node.schedulable {
            return;
        }
        if let Some(frag) = &mut self.frag {
            let type_ix = &self.type_ix;
            frag.update(n, node, &self.node_parts[n], &|t: &str| type_ix.get(t).copied());
        }
        for k in 0..self.node_keys[n].len() {
            let (p, t, old) = self.node_keys[n][k];
            let new = self.kinds().free(node, t);
            if new != old {
                if let Some(b) = self.index.get_mut(&(p, t)) {
                    b.remove(old, n as u32);
                    b.insert(new, n as u32);
                }
                self.node_keys[n][k].2 = new;
            }
        }
    }
}
