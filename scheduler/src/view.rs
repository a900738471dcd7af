//! What the scheduler sees: nodes with what they hold, jobs, partitions, usage and config. Built
//! by the caller from the replicated state with [`node_view`], [`NodeView::take`] and
//! [`job_request`].

use std::collections::BTreeMap;
use std::sync::Arc;

use proto::{Allocation, ArraySpec, ArrayTask, Dependency, Inventory, JobId, JobState, Link, NetworkLocation, Nic, NodeId, RunNo};

use crate::mig;
use crate::need::Misfit;

/// Nodes with more GPUs than this are cut to their first 64 (every per-node set is a `u64`).
pub const GPUS_PER_NODE_MAX: usize = 64;

pub use proto::slot::{decode_slot, mig_slot, shard_slot, Slot, MIG_SLOT_BASE, SHARD_SLOT_BASE};

/// One existing MIG instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigSlot {
    pub profile: String,
    pub start_slice: u32,
    pub size_slices: u32,
    pub busy: bool,
}

/// One GPU of a node as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSlot {
    pub index: u32,
    pub gres_type: String,
    pub model: Option<mig::Model>,
    pub numa_node: Option<u32>,
    pub healthy: bool,
    /// In MIG mode: only its instances are schedulable, never the whole GPU.
    pub mig_enabled: bool,
    pub mig: Vec<MigSlot>,
    /// Held by a job (running, or stopping and not yet confirmed gone).
    pub busy: bool,
    /// The MIG layout an operator pinned it to (`corral mig set`), profiles by start slice.
    pub pinned: Option<Vec<String>>,
    /// Its `GpuInfo::shards` (0: not shared), and how many of them jobs hold. A GPU with any
    /// shard held is not free as a whole; a GPU held whole has no shard free.
    pub shards_total: u32,
    pub shards_used: u32,
}

impl GpuSlot {
    /// Pinned to a layout it does not have yet: it takes no new work until it is idle and
    /// re-partitioned.
    pub fn draining(&self) -> bool {
        self.pinned.as_ref().is_some_and(|p| !self.has_layout(p))
    }

    /// Whether it is in MIG mode with the instances `profiles` names, wherever they start.
    pub fn has_layout(&self, profiles: &[String]) -> bool {
        let now: Vec<&str> = self.mig.iter().map(|m| m.profile.as_str()).collect();
        self.mig_enabled && proto::same_mig_layout(&now, profiles)
    }

    /// Free as a whole GPU.
    pub fn free(&self) -> bool {
        !self.busy && self.healthy && !self.mig_enabled && self.shards_used == 0
    }

    /// Shards that a job may take now (0 when it is held whole, unhealthy or in MIG mode).
    pub fn shards_free(&self) -> u32 {
        if self.busy || !self.healthy || self.mig_enabled {
            return 0;
        }
        self.shards_total.saturating_sub(self.shards_used)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NumaView {
    pub numa: u32,
    pub cpus_total: u32,
    pub cpus_used: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub id: NodeId,
    pub name: String,
    /// UP and not drained.
    pub schedulable: bool,
    pub gpus: Vec<GpuSlot>,
    pub cpus_total: u32,
    pub cpus_used: u32,
    pub mem_total_mib: u64,
    pub mem_used_mib: u64,
    /// CPUs per NUMA node, ascending; one domain 0 holding every CPU when unknown.
    pub numa: Vec<NumaView>,
    /// `gpu_links[i][j]` between GPU indices i and j; empty when unknown.
    pub gpu_links: Vec<Vec<Link>>,
    pub nics: Vec<Nic>,
    pub location: NetworkLocation,
    pub features: Vec<String>,
    /// Partitions named by the node (empty: the default partition).
    pub partitions: Vec<String>,
}

/// A node as placement sees it, from its inventory. Unhealthy GPUs are kept but never handed
/// out; MIG instances come from `GpuInfo::mig`.
pub fn node_view(id: NodeId, name: &str, inventory: &Inventory, schedulable: bool) -> NodeView {
    let gpus: Vec<GpuSlot> = inventory
        .gpus
        .iter()
        .take(GPUS_PER_NODE_MAX)
        .map(|g| GpuSlot {
            index: g.index,
            gres_type: g.gres_type.clone(),
            model: mig::Model::detect(&g.model, g.memory_mib),
            numa_node: g.numa_node,
            healthy: g.healthy,
            mig_enabled: g.mig_enabled,
            mig: g
                .mig
                .iter()
                .map(|m| MigSlot { profile: m.profile.clone(), start_slice: m.start_slice, size_slices: m.size_slices, busy: false })
                .collect(),
            busy: false,
            pinned: None,
            shards_total: if g.mig_enabled || g.index >= proto::slot::SHARD_GPU_INDEX_LIMIT {
                0
            } else {
                g.shards.min(proto::limits::SHARDS_PER_GPU_MAX)
            },
            shards_used: 0,
        })
        .collect();
    let mut numa: Vec<NumaView> =
        inventory.topology.numa_cpus.iter().map(|(&n, cpus)| NumaView { numa: n, cpus_total: cpus.len() as u32, cpus_used: 0 }).collect();
    let numa_cpus: u32 = numa.iter().map(|n| n.cpus_total).sum();
    if numa.is_empty() || numa_cpus != inventory.cpus {
        numa = vec![NumaView { numa: 0, cpus_total: inventory.cpus, cpus_used: 0 }];
    }
    NodeView {
        id,
        name: name.to_string(),
        schedulable,
        gpus,
        cpus_total: inventory.cpus,
        cpus_used: 0,
        mem_total_mib: inventory.memory_mib,
        mem_used_mib: 0,
        numa,
        gpu_links: inventory.topology.gpu_links.clone(),
        nics: inventory.topology.nics.clone(),
        location: inventory.location.clone(),
        features: inventory.features.clone(),
        partitions: inventory.partitions.clone(),
    }
}

impl NodeView {
    /// Free whole GPUs.
    pub fn gpus_free(&self) -> u32 {
        self.gpus.iter().filter(|g| g.free()).count() as u32
    }

    pub fn cpus_free(&self) -> u32 {
        self.cpus_total.saturating_sub(self.cpus_used)
    }

    pub fn mem_free_mib(&self) -> u64 {
        self.mem_total_mib.saturating_sub(self.mem_used_mib)
    }

    /// Nothing on it is held.
    pub fn idle(&self) -> bool {
        self.cpus_used == 0
            && self.mem_used_mib == 0
            && self.gpus.iter().all(|g| !g.busy && g.shards_used == 0 && g.mig.iter().all(|m| !m.busy))
    }

    /// Marks an allocation's resources held. Everything it names is marked, even past an error,
    /// so the view stays conservative; the first problem (a GPU held twice, an unknown GPU or
    /// instance) is returned for the caller to log: it means the state holds a double booking.
    pub fn take(&mut self, alloc: &Allocation) -> Result<(), Misfit> {
        let mut first_err: Option<Misfit> = None;
        let note = |e: Misfit, first: &mut Option<Misfit>| {
            if first.is_none() {
                *first = Some(e);
            }
        };
        for &id in &alloc.gpus {
            match decode_slot(id) {
                Slot::Gpu(index) => match self.gpus.iter_mut().find(|g| g.index == index) {
                    Some(g) => {
                        if g.busy || g.shards_used > 0 {
                            note(Misfit::GpuBusy(index), &mut first_err);
                        }
                        g.busy = true;
                    }
                    None => note(Misfit::UnknownGpu(index), &mut first_err),
                },
                Slot::Shard { gpu, shards } => match self.gpus.iter_mut().find(|g| g.index == gpu) {
                    Some(g) => {
                        if g.busy || g.shards_used.saturating_add(shards) > g.shards_total {
                            note(Misfit::Shards { gpu, want: shards, free: g.shards_total.saturating_sub(g.shards_used) }, &mut first_err);
                        }
                        g.shards_used = g.shards_used.saturating_add(shards);
                    }
                    None => note(Misfit::UnknownGpu(gpu), &mut first_err),
                },
                Slot::Mig { gpu, start_slice } => {
                    let slot =
                        self.gpus.iter_mut().find(|g| g.index == gpu).and_then(|g| g.mig.iter_mut().find(|m| m.start_slice == start_slice));
                    match slot {
                        Some(m) => {
                            if m.busy {
                                note(Misfit::MigBusy { gpu, start_slice }, &mut first_err);
                            }
                            m.busy = true;
                        }
                        None => note(Misfit::UnknownMig { gpu, start_slice }, &mut first_err),
                    }
                }
            }
        }
        let shares = cpu_shares(self, &alloc.gpus, alloc.cpus);
        for (numa, n) in shares {
            if let Some(d) = self.numa.iter_mut().find(|d| d.numa == numa) {
                d.cpus_used += n;
            }
        }
        self.cpus_used = self.cpus_used.saturating_add(alloc.cpus);
        self.mem_used_mib = self.mem_used_mib.saturating_add(alloc.mem_mib);
        match first_err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

impl NodeView {
    /// Frees what `alloc` holds, for counting what the node would have once it ended (the
    /// reverse of [`NodeView::take`] for GPUs, shards, MIG instances, CPUs and memory; the CPUs'
    /// NUMA domains are left as they were).
    pub(crate) fn give_back(&mut self, alloc: &Allocation) {
        for &id in &alloc.gpus {
            let slot = decode_slot(id);
            let Some(g) = self.gpus.iter_mut().find(|g| g.index == slot.gpu()) else { continue };
            match slot {
                Slot::Gpu(_) => g.busy = false,
                Slot::Shard { shards, .. } => g.shards_used = g.shards_used.saturating_sub(shards),
                Slot::Mig { start_slice, .. } => {
                    if let Some(m) = g.mig.iter_mut().find(|m| m.start_slice == start_slice) {
                        m.busy = false;
                    }
                }
            }
        }
        self.cpus_used = self.cpus_used.saturating_sub(alloc.cpus);
        self.mem_used_mib = self.mem_used_mib.saturating_sub(alloc.mem_mib);
    }
}

/// NUMA node of an allocation entry (whole GPU, shards or MIG instance).
pub(crate) fn slot_numa(node: &NodeView, id: u32) -> Option<u32> {
    let index = decode_slot(id).gpu();
    node.gpus.iter().find(|g| g.index == index).and_then(|g| g.numa_node)
}

/// How `cpus` CPUs of an allocation on `gpus` are spread over NUMA nodes: the GPUs' NUMA nodes
/// first (most GPUs first, then lowest id), then the others by id; each takes what it has free.
/// Anything left over is charged to the first domain. The same rule is used when placing and in
/// [`NodeView::take`], so both agree.
pub fn cpu_shares(node: &NodeView, gpus: &[u32], cpus: u32) -> Vec<(u32, u32)> {
    let mut weight: BTreeMap<u32, u32> = BTreeMap::new();
    for &id in gpus {
        if let Some(n) = slot_numa(node, id) {
            *weight.entry(n).or_default() += 1;
        }
    }
    let mut order: Vec<(u32, u32)> = node.numa.iter().map(|d| (d.numa, weight.get(&d.numa).copied().unwrap_or(0))).collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut left = cpus;
    let mut out: Vec<(u32, u32)> = Vec::new();
    for (numa, _) in order {
        if left == 0 {
            break;
        }
        let free = node.numa.iter().find(|d| d.numa == numa).map_or(0, |d| d.cpus_total.saturating_sub(d.cpus_used));
        let n = free.min(left);
        if n > 0 {
            out.push((numa, n));
            left -= n;
        }
    }
    if left > 0 {
        let first = node.numa.first().map_or(0, |d| d.numa);
        match out.iter_mut().find(|(n, _)| *n == first) {
            Some(e) => e.1 += left,
            None => out.push((first, left)),
        }
    }
    out.sort();
    out
}

/// What one job asks, as placement sees it. Built from a `proto::Job` with [`job_request`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRequest {
    pub id: JobId,
    /// Tasks of this array already started whose jobs may have left the view (finished and
    /// archived): they are never started again.
    pub array_started: Vec<u32>,
    /// The run a placement starts (the job's next run while pending, its current one otherwise).
    pub run: RunNo,
    pub state: JobState,
    pub name: String,
    pub user: String,
    pub account: Option<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    /// `--reservation`: it runs only on that reservation's nodes, in its window.
    pub reservation: Option<String>,
    /// `--nice`: subtracted from the job's priority (`JobSpec::nice`).
    pub nice: i64,
    /// Nodes of the gang (at least 1), its spares counted: the least of a node range
    /// (`-N MIN-MAX`) while pending, what its run holds while running.
    pub nodes: u32,
    /// The most nodes a placement may give it (`nodes` without a range), spares counted.
    pub nodes_max: u32,
    /// Whole GPUs, or MIG instances when `gpu_type` is a MIG profile, on each node.
    pub gpus_per_node: u32,
    /// Shards of one GPU on each node (`--gres=shard:N`); `gpus_per_node` is then 0.
    pub shards_per_node: u32,
    /// `h100`, `a100`, ... or a MIG profile (`1g.18gb`); `None`: any whole GPU.
    pub gpu_type: Option<String>,
    pub cpus_per_node: u32,
    pub mem_per_node_mib: u64,
    pub constraint: Vec<String>,
    pub nodelist: Vec<String>,
    pub exclude: Vec<String>,
    pub exclusive: bool,
    /// Set on an array submission: its tasks are started lazily by the scheduler.
    pub array: Option<ArraySpec>,
    /// Set on a task job created from an array.
    pub array_task: Option<ArrayTask>,
    pub dependencies: Vec<Dependency>,
    pub begin_ms: Option<u64>,
    pub hold: bool,
    /// At most this many leaf switches, waiting at most this long (ms) from submit.
    pub switches: Option<(u32, u64)>,
    pub time_limit_ms: Option<u64>,
    pub submit_ms: u64,
    /// When its current run started, its suspensions so far added.
    pub start_ms: Option<u64>,
    /// When it ended (a final job whose parts are still stopping).
    pub end_ms: Option<u64>,
    pub requeue: bool,
    /// Allocations of the current run while it runs (what preempting it frees).
    pub running: Vec<Allocation>,
    /// Every allocation the job holds (current run and parts still stopping).
    pub held: Vec<Allocation>,
}

impl JobRequest {
    pub fn total_gpus(&self) -> u64 {
        u64::from(self.gpus_per_node) * u64::from(self.nodes)
    }

    /// An array submission with tasks still to start.
    pub fn is_array(&self) -> bool {
        self.array.is_some() && self.array_task.is_none()
    }

    /// Wall-clock time of its current run by `now_ms` while the job holds resources (what
    /// `GrpWall` counts before the state charges the run), else 0. A suspension under way
    /// counts: the request does not say when it began.
    pub fn wall_ms_at(&self, now_ms: u64) -> u64 {
        match self.start_ms {
            Some(start) if !self.held.is_empty() => self.end_ms.unwrap_or(now_ms).saturating_sub(start),
            _ => 0,
        }
    }
}

/// The scheduler's view of a job from the replicated state.
pub fn job_request(job: &proto::Job) -> JobRequest {
    let spec = &job.spec;
    let need = crate::need::PerNode::of(spec);
    let (nodes, nodes_max) = nodes_of(job, need.nodes);
    JobRequest {
        id: job.id,
        array_started: Vec::new(),
        run: run_of(job),
        state: job.state,
        name: spec.name.clone(),
        user: spec.user.clone(),
        account: spec.account.clone(),
        partition: spec.partition.clone(),
        qos: spec.qos.clone(),
        reservation: spec.reservation().map(str::to_string),
        nice: spec.nice(),
        nodes,
        nodes_max,
        gpus_per_node: need.gpus,
        shards_per_node: spec.shards(),
        gpu_type: spec.gres.as_ref().and_then(|g| g.gpu_type.clone()),
        cpus_per_node: need.cpus,
        mem_per_node_mib: need.mem_mib,
        constraint: spec.constraint.clone(),
        nodelist: spec.nodelist.clone(),
        exclude: spec.exclude.clone(),
        exclusive: spec.exclusive,
        array: if job.array.is_none() { spec.array.clone() } else { None },
        array_task: job.array.clone(),
        dependencies: spec.dependencies.clone(),
        begin_ms: spec.begin_ms,
        hold: spec.hold,
        switches: spec.switches,
        time_limit_ms: time_limit_of(job),
        submit_ms: job.submit_ms,
        start_ms: start_of(job),
        end_ms: job.end_ms,
        requeue: spec.requeue,
        running: running_of(job).cloned().collect(),
        held: job.parts.iter().map(|p| p.alloc.clone()).collect(),
    }
}

/// Whether `req`, made by [`job_request`] from a job with this very spec (the same `Arc`,
/// which every change of a spec replaces: `Arc::make_mut` while the caller holds a clone), is
/// still what [`job_request`] makes of `job`: it compares every field taken from the job
/// rather than from its spec, without allocating. `array_started` is the caller's to compare.
pub fn job_request_current(req: &JobRequest, job: &proto::Job) -> bool {
    req.id == job.id
        && req.run == run_of(job)
        && req.state == job.state
        && req.array_task == job.array
        && req.time_limit_ms == time_limit_of(job)
        && req.submit_ms == job.submit_ms
        && req.start_ms == start_of(job)
        && req.end_ms == job.end_ms
        && req.running.iter().eq(running_of(job))
        && req.held.iter().eq(job.parts.iter().map(|p| &p.alloc))
}

/// The run a placement starts: the job's next run while pending, its current one otherwise.
fn run_of(job: &proto::Job) -> RunNo {
    if job.state == JobState::Pending {
        job.run.saturating_add(1)
    } else {
        job.run
    }
}

/// The least and most nodes of `job`'s gang (`least` from its spec, spares counted): its range
/// while pending, the nodes its run holds while running.
fn nodes_of(job: &proto::Job, least: u32) -> (u32, u32) {
    let held = u32::try_from(running_of(job).count()).unwrap_or(u32::MAX);
    if held > 0 {
        return (held, held);
    }
    (least, least.saturating_add(job.spec.nodes_max().saturating_sub(job.spec.nodes.max(1))))
}

/// A suspended job frees nothing until someone resumes it: no time limit counts meanwhile.
fn time_limit_of(job: &proto::Job) -> Option<u64> {
    job.spec.time_limit_ms.filter(|_| !job.suspended())
}

/// A resumed job ends later by the time it was suspended.
fn start_of(job: &proto::Job) -> Option<u64> {
    job.start_ms.map(|s| s.saturating_add(job.suspension.paused_ms))
}

/// Allocations of the current run while it runs.
fn running_of(job: &proto::Job) -> impl Iterator<Item = &Allocation> {
    let running = job.state == JobState::Running;
    job.parts.iter().filter(move |p| running && p.run == job.run).map(|p| &p.alloc)
}

/// A partition: time limits and priority tier. Its nodes are those whose inventory names it
/// (`Inventory::partitions`), plus every node naming no partition when it is the default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub default_time_limit_ms: Option<u64>,
    pub max_time_limit_ms: Option<u64>,
    pub priority_tier: u32,
    /// Jobs without `--partition` go here; nodes that name no partition belong here.
    pub default: bool,
    /// DOWN and INACTIVE start nothing (`PartitionState::holds_jobs`).
    pub state: proto::PartitionState,
    /// Accounts and QoS not allowed wait with `AccountNotAllowed`/`QOSNotAllowed`.
    pub access: proto::PartitionAccess,
}

impl Partition {
    /// Why this partition starts none of `j` whatever the resources, Slurm's code first: its
    /// state, its `MaxTime`, its access lists.
    pub fn holds(&self, j: &JobRequest) -> Vec<String> {
        let name = &self.name;
        let mut reasons = Vec::new();
        if let Some(code) = self.state.holds_jobs() {
            reasons.push(format!("{code}: partition {name} is {}", self.state.as_str()));
        }
        if let (Some(limit), Some(max)) = (j.time_limit_ms, self.max_time_limit_ms) {
            if limit > max {
                let (limit, max) = (crate::format::fmt_duration_ms(limit), crate::format::fmt_duration_ms(max));
                reasons.push(format!("PartitionTimeLimit: time limit {limit} exceeds the {max} of partition {name}"));
            }
        }
        // QoS before account, as Slurm's `select_nodes` checks them.
        reasons.extend(self.access.qos_refusal(name, j.qos.as_deref().unwrap_or(proto::DEFAULT_QOS)));
        reasons.extend(self.access.account_refusal(name, j.account.as_deref()));
        reasons
    }
}

/// What happens to a job preempted by a QoS allowed to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PreemptAction {
    Requeue,
    Cancel,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Qos {
    pub priority: u32,
    /// QoS names whose running jobs this QoS may preempt (a job without QoS is `normal`).
    pub preempt: Vec<String>,
    /// What happens to jobs of this QoS when they are preempted. `Requeue` cancels a job
    /// submitted with `requeue: false`, as Slurm does.
    pub preempt_mode: PreemptAction,
    /// Its accounting limits (`max_jobs` per user); jobs over one wait with `QOS...` reasons.
    pub limits: proto::Limits,
}

/// Weights of the multifactor priority; each factor is in [0, 1].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PriorityWeights {
    pub age: u32,
    pub job_size: u32,
    pub partition: u32,
    pub qos: u32,
    pub fair_share: u32,
}

/// See [`SchedulerConfig::reserve_after_wait_ms`].
pub const RESERVE_AFTER_WAIT_MS_DEFAULT: u64 = u64::MAX;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub weights: PriorityWeights,
    /// Age factor reaches 1 after waiting this long.
    pub age_max_ms: u64,
    pub qos: BTreeMap<String, Qos>,
    /// EASY backfill with a reservation for the first job that cannot start.
    pub backfill: bool,
    /// A job that cannot start and has waited this long also gets a backfill reservation (on
    /// nodes no other reservation holds), so a gang of low priority is not starved for ever
    /// by smaller jobs backfilled ahead of it. `u64::MAX`: the first job's alone (EASY).
    pub reserve_after_wait_ms: u64,
    /// How many of the jobs that cannot start, in priority order, get a backfill reservation
    /// (each on nodes no other holds): 1 is EASY backfill; more keep a job that a larger or
    /// more favoured newcomer pushed off the top from being overtaken by backfilled work.
    pub reservation_depth: u32,
    /// Used when no partition is marked default.
    pub default_partition: String,
    /// At most this many MIG re-layouts suggested per pass.
    pub mig_layouts_per_pass_max: u32,
    /// At most this many tasks of one array started per pass (bounds the work of huge arrays).
    pub array_tasks_per_pass_max: u32,
    /// At most this many jobs and array tasks started per pass, in priority order: the leader
    /// lowers it while it is behind (see `corral_node::pacing`); the jobs after wait a pass.
    pub starts_per_pass_max: u32,
    /// Usage halves in this time (`PriorityDecayHalfLife`); 0: it never decays.
    pub decay_half_life_ms: u64,
    /// A job that may not start whatever the resources (held, a later begin time, a dependency)
    /// is still tried against them, so its reasons also say what the resources would (what
    /// `squeue` shows). The leader's own pass, which keeps no reasons, leaves it off: a queue
    /// of held jobs then costs each pass no placement search.
    pub explain_ineligible: bool,
    /// A job of one node goes where it adds the least GPU fragmentation for the shapes of the
    /// jobs the cluster holds (FGD, see `frag`), rather than to the first node of the fewest
    /// free GPUs that holds it (best fit).
    pub fragmentation_aware: bool,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            weights: PriorityWeights { age: 1000, job_size: 1000, partition: 10_000, qos: 10_000, fair_share: 10_000 },
            age_max_ms: 7 * 24 * 3600 * 1000,
            qos: BTreeMap::new(),
            backfill: true,
            reserve_after_wait_ms: RESERVE_AFTER_WAIT_MS_DEFAULT,
            reservation_depth: 1,
            default_partition: "default".to_string(),
            mig_layouts_per_pass_max: 16,
            array_tasks_per_pass_max: 100_000,
            starts_per_pass_max: u32::MAX,
            decay_half_life_ms: proto::DECAY_HALF_LIFE_MIN_DEFAULT * 60_000,
            explain_ineligible: true,
            fragmentation_aware: true,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// Shared: a leader reuses the view of every node whose record and parts did not change
    /// since its last pass (`consensus::view::ViewCache`). A pass copies a node only to place
    /// work on it.
    pub nodes: BTreeMap<NodeId, Arc<NodeView>>,
    /// Pending and running jobs, in id order; also the finished jobs that pending jobs depend on
    /// (a dependency on a job not listed here can never be satisfied). Shared: a leader keeps
    /// the requests of jobs that did not change from one pass to the next.
    pub jobs: Vec<Arc<JobRequest>>,
    pub partitions: BTreeMap<String, Partition>,
    /// Usage by (account, user) association, each decayed to its own time (`root` for a job
    /// without an account); see [`crate::fairshare`].
    pub usage: BTreeMap<(String, String), proto::accounts::Usage>,
    /// Usage by QoS (its wall-clock time: `GrpWall`), each decayed to its own time.
    pub qos_usage: BTreeMap<String, proto::accounts::Usage>,
    pub config: SchedulerConfig,
    /// Accounts, users and associations with their limits (`sacctmgr`); jobs over one wait
    /// with `Assoc...` reasons. With no association, nothing is limited. Shared with the
    /// replicated state (a pass does not copy up to 65,536 users).
    pub accounts: std::sync::Arc<proto::accounts::Accounts>,
    /// Admins' reservations (`scontrol create reservation`); those ended by the pass's time
    /// count for nothing.
    pub reservations: Vec<proto::AdminReservation>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proto::{Allocation, Job, JobSpec, JobState, NodeRun};

    use super::{job_request, job_request_current};

    #[test]
    fn a_request_is_current_until_a_field_it_takes_from_the_job_changes() {
        let spec = JobSpec { time_limit_ms: Some(60_000), ..JobSpec::command(vec!["true".into()], "/tmp", "alice") };
        let pending = Job::submitted(7, Arc::new(spec), 10);
        let alloc = Allocation { node: 1, gpus: vec![0], cpus: 1, mem_mib: 1024 };
        let mut running = pending.clone();
        running.state = JobState::Running;
        running.run = 1;
        running.start_ms = Some(20);
        running.parts = vec![NodeRun { run: 1, alloc: alloc.clone(), launched_by: Some(1) }];
        let req = job_request(&running);
        assert!(job_request_current(&req, &running));
        assert!(!job_request_current(&job_request(&pending), &running), "state, run and parts");
        type Change = (&'static str, fn(&mut Job));
        let changes: [Change; 7] = [
            ("state", |j| j.state = JobState::Cancelled),
            ("run", |j| j.run = 2),
            ("parts", |j| j.parts[0].alloc.gpus = vec![1]),
            ("suspended", |j| j.suspension.since_ms = Some(30)),
            ("paused", |j| j.suspension.paused_ms = 5),
            ("start", |j| j.start_ms = Some(21)),
            ("end", |j| j.end_ms = Some(22)),
        ];
        for (what, change) in changes {
            let mut changed = running.clone();
            change(&mut changed);
            assert_ne!(job_request(&changed), req, "{what}: the request differs");
            assert!(!job_request_current(&req, &changed), "{what}: seen as changed");
        }
    }
}
