//! The bridge from the replicated state to the pure scheduler: the `ClusterView` it plans on,
//! and the re-check of a committed plan against the state it is applied to.

use std::collections::BTreeMap;
use std::sync::Arc;

use proto::{Allocation, Inventory, Job, JobId, JobSpec, JobState, NodeId, NodeRecord, NodeState};
use scheduler::{ClusterView, JobRequest, NodeView};

use crate::cluster::ClusterState;

/// Every node with the resources its parts hold marked used. When a partition of the policy
/// lists its nodes, every node's partitions are spelled out (`partitions_of_node`), and a node
/// in none is not schedulable.
pub fn node_views(state: &ClusterState) -> BTreeMap<NodeId, NodeView> {
    node_views_where(state, |_| true)
}

/// [`node_views`] of the nodes in `only` alone (what applying a plan checks its placements
/// against: at 5,000 nodes, views of them all for a plan that names one cost every replica the
/// build of 5,000 views).
pub fn node_views_among(state: &ClusterState, only: &std::collections::BTreeSet<NodeId>) -> BTreeMap<NodeId, NodeView> {
    node_views_where(state, |id| only.contains(&id))
}

fn node_views_where(state: &ClusterState, wanted: impl Fn(NodeId) -> bool) -> BTreeMap<NodeId, NodeView> {
    let lists = state.policy.lists_nodes();
    let mut views: BTreeMap<NodeId, NodeView> =
        state.nodes.values().filter(|n| wanted(n.id)).map(|n| (n.id, bare_node_view(state, n, lists))).collect();
    for part in state.jobs_holding_parts().flat_map(|j| j.parts.iter()) {
        if let Some(view) = views.get_mut(&part.alloc.node) {
            take(view, &part.alloc);
        }
    }
    views
}

/// A node's view with nothing taken yet: its inventory, pinned MIG layouts and partitions.
fn bare_node_view(state: &ClusterState, n: &NodeRecord, lists: bool) -> NodeView {
    let mut view = scheduler::node_view(n.id, &n.name, &n.inventory, n.state == NodeState::Up && !n.drained);
    for g in view.gpus.iter_mut() {
        g.pinned = n.mig_pinned.get(&g.index).cloned();
    }
    if lists {
        view.partitions = state.policy.partitions_of_node(&n.name, &n.inventory.partitions);
        view.schedulable &= !view.partitions.is_empty();
    }
    view
}

/// The view of one node, and what it was built from: reused as long as these are the same.
struct NodeBuilt {
    id: NodeId,
    /// The record's inventory itself: every change of it is a new `Arc` or an `Arc::make_mut`,
    /// which copies an inventory this cache shares.
    inventory: Arc<Inventory>,
    name: String,
    state: NodeState,
    drained: bool,
    mig_pinned: BTreeMap<u32, Vec<String>>,
    /// The allocations taken on it, in the order of the jobs holding them.
    parts: Vec<Allocation>,
    view: Arc<NodeView>,
}

impl NodeBuilt {
    fn new(n: &NodeRecord, parts: &[(NodeId, &Allocation)], view: NodeView) -> NodeBuilt {
        NodeBuilt {
            id: n.id,
            inventory: Arc::clone(&n.inventory),
            name: n.name.clone(),
            state: n.state,
            drained: n.drained,
            mig_pinned: n.mig_pinned.clone(),
            parts: parts.iter().map(|(_, a)| (*a).clone()).collect(),
            view: Arc::new(view),
        }
    }

    fn current(&self, n: &NodeRecord, parts: &[(NodeId, &Allocation)]) -> bool {
        Arc::ptr_eq(&self.inventory, &n.inventory)
            && self.state == n.state
            && self.drained == n.drained
            && self.name == n.name
            && self.mig_pinned == n.mig_pinned
            && self.parts.len() == parts.len()
            && self.parts.iter().zip(parts).all(|(a, (_, b))| a == *b)
    }
}

/// The node views of the last view built through a [`ViewCache`], ascending by node id, under
/// the policy they were built with (it decides a node's partitions). It holds no more than the
/// nodes of the state it was last built from.
#[derive(Default)]
struct NodeCache {
    policy: Option<proto::SchedulerPolicy>,
    built: Vec<NodeBuilt>,
}

/// Every node's view, as [`node_views`], reusing each one whose record and parts did not change
/// since the cache's last view: a pass at 5,000 nodes otherwise builds 5,000 views. `probe`
/// names the one reused view checked against a fresh build (every one in debug builds).
fn node_views_cached(state: &ClusterState, cache: &mut NodeCache, probe: u64) -> (BTreeMap<NodeId, Arc<NodeView>>, usize) {
    if cache.policy.as_ref() != Some(&state.policy) {
        cache.built.clear();
        cache.policy = Some(state.policy.clone());
    }
    let lists = state.policy.lists_nodes();
    let mut parts: Vec<(NodeId, &Allocation)> =
        state.jobs_holding_parts().flat_map(|j| j.parts.iter()).map(|p| (p.alloc.node, &p.alloc)).collect();
    // Stable: each node's parts stay in the order of their jobs.
    parts.sort_by_key(|(node, _)| *node);
    let probe = probe as usize % state.nodes.len().max(1);
    let mut old = std::mem::take(&mut cache.built).into_iter().peekable();
    let mut kept = Vec::with_capacity(state.nodes.len());
    let (mut at, mut reused) = (0, 0);
    for (i, n) in state.nodes.values().enumerate() {
        while parts.get(at).is_some_and(|(node, _)| *node < n.id) {
            at += 1;
        }
        let end = at + parts[at..].iter().take_while(|(node, _)| *node == n.id).count();
        let mine = &parts[at..end];
        at = end;
        while old.next_if(|b| b.id < n.id).is_some() {}
        let fresh = || {
            let mut view = bare_node_view(state, n, lists);
            for (_, alloc) in mine {
                take(&mut view, alloc);
            }
            view
        };
        let built = match old.next_if(|b| b.id == n.id) {
            Some(b) if b.current(n, mine) => {
                if cfg!(debug_assertions) || i == probe {
                    assert_eq!(*b.view, fresh(), "view cache: node {} changed without a new inventory or a changed field", n.id);
                }
                reused += 1;
                b
            }
            _ => NodeBuilt::new(n, mine, fresh()),
        };
        kept.push(built);
    }
    let views = kept.iter().map(|b| (b.id, Arc::clone(&b.view))).collect();
    cache.built = kept;
    (views, reused)
}

/// Marks `alloc`'s resources used on `view`. The state never holds a GPU twice (`apply`
/// asserts it after every command), so a misfit here can only be a GPU marked unhealthy or
/// removed while a part holds it; the view stays conservative either way (everything named is
/// marked used).
pub fn take(view: &mut NodeView, alloc: &Allocation) {
    let _conservative = view.take(alloc);
}

/// Whether `allocs` (one per node) can start `job` on the nodes as they are now.
pub fn check_gang(nodes: &BTreeMap<NodeId, NodeView>, job: &Job, allocs: &[Allocation]) -> Result<(), String> {
    let mut request = scheduler::job_request(job);
    // A task of an array is checked as the single job it becomes.
    request.array = None;
    scheduler::fits_gang(nodes, &request, allocs).map_err(|m| m.to_string())
}

/// What the scheduler needs: nodes with their free resources, every job of the hot state
/// (pending and running ones to place or preempt, recently finished ones) and each user's GPU
/// usage. A dependency on a job that left the hot state is unknown here: see
/// [`scheduler_view_with`].
pub fn scheduler_view(state: &ClusterState) -> ClusterView {
    scheduler_view_with(state, |_| None)
}

/// [`scheduler_view`], with the finished jobs pending jobs depend on that are no longer in the
/// hot state read through `archived` (the accounting store), so `afterok:ID` still resolves.
pub fn scheduler_view_with(state: &ClusterState, archived: impl Fn(JobId) -> Option<Job>) -> ClusterView {
    scheduler_view_cached(state, &mut ViewCache::default(), archived)
}

/// The job requests of the last view built through this cache, ascending by id, each with the
/// spec it was made from, and its node views, each with the record and parts it was built
/// from. The next view reuses every request whose job did not change and every node view whose
/// node did not, so a leader's pass over a deep queue on a large cluster builds only what
/// changed since the last pass. It holds no more than the live jobs and the nodes of the hot
/// state it was last built from.
#[derive(Default)]
pub struct ViewCache {
    jobs: Vec<(Arc<JobSpec>, Arc<JobRequest>)>,
    /// Views built through this cache (picks the reused request checked in full each time).
    views: u64,
    /// Of the last view: requests reused, and made anew.
    pub reused: usize,
    pub made: usize,
    nodes: NodeCache,
    /// Of the last view: node views reused.
    pub nodes_reused: usize,
}

/// [`scheduler_view_with`], reusing the requests `cache` kept of jobs that did not change.
///
/// A request is reused when its job still has the very spec it was made from (every change of
/// a spec is an `Arc::make_mut`, which copies a spec the cache shares) and
/// [`scheduler::job_request_current`] finds the job's own fields unchanged. Each view checks
/// one reused request against a fresh one in full (every one of them in debug builds).
pub fn scheduler_view_cached(state: &ClusterState, cache: &mut ViewCache, archived: impl Fn(JobId) -> Option<Job>) -> ClusterView {
    // Only live work (pending, running, or still holding a part) and the finished jobs that
    // pending jobs depend on: finished jobs are most of the hot state under a sweep, and the
    // scheduler needs nothing else of them (`array_started` keeps which tasks ran).
    let request = |j: &Job| {
        let mut request = scheduler::job_request(j);
        if let Some(started) = state.array_started.get(&j.id) {
            request.array_started = started.iter().copied().collect();
        }
        request
    };
    let probe = cache.views as usize % cache.jobs.len().max(1);
    cache.views = cache.views.wrapping_add(1);
    let mut old = std::mem::take(&mut cache.jobs).into_iter().enumerate().peekable();
    let mut kept = Vec::with_capacity(old.len());
    let mut jobs: Vec<Arc<JobRequest>> = Vec::with_capacity(old.len());
    let (mut reused, mut made) = (0, 0);
    for j in state.jobs.values().filter(|j| is_live(j)) {
        while old.next_if(|(_, (_, r))| r.id < j.id).is_some() {}
        let same = |spec: &Arc<JobSpec>, r: &JobRequest| {
            Arc::ptr_eq(spec, &j.spec)
                && scheduler::job_request_current(r, j)
                && r.array_started.iter().eq(state.array_started.get(&j.id).into_iter().flatten())
        };
        let req = match old.next_if(|(_, (_, r))| r.id == j.id) {
            Some((i, (spec, r))) if same(&spec, &r) => {
                if cfg!(debug_assertions) || i == probe {
                    assert_eq!(*r, request(j), "view cache: job {} changed without a new spec or a changed field", j.id);
                }
                reused += 1;
                r
            }
            _ => {
                made += 1;
                Arc::new(request(j))
            }
        };
        kept.push((Arc::clone(&j.spec), Arc::clone(&req)));
        jobs.push(req);
    }
    cache.jobs = kept;
    cache.reused = reused;
    cache.made = made;
    let targets: std::collections::BTreeSet<JobId> = state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending)
        .flat_map(|j| j.spec.dependencies.iter().filter_map(|d| d.job))
        .filter(|id| !state.jobs.get(id).is_some_and(is_live))
        .collect();
    if !targets.is_empty() {
        jobs.extend(
            targets
                .into_iter()
                .filter_map(|id| match state.jobs.get(&id) {
                    Some(j) => Some(request(j)),
                    None => archived(id).map(|j| scheduler::job_request(&j)),
                })
                .map(Arc::new),
        );
        jobs.sort_by_key(|j| j.id);
    }
    let partitions = state
        .policy
        .partitions
        .iter()
        .map(|p| {
            let def = scheduler::Partition {
                name: p.name.clone(),
                default_time_limit_ms: p.default_time_limit_ms,
                max_time_limit_ms: p.max_time_limit_ms,
                priority_tier: p.priority_tier,
                default: p.default,
                state: p.state,
                access: p.access.clone(),
            };
            (p.name.clone(), def)
        })
        .collect();
    let mut config = scheduler::SchedulerConfig { decay_half_life_ms: state.policy.decay_half_life_ms(), ..Default::default() };
    for q in &state.policy.qos {
        let mode = if q.preempt_mode == "cancel" { scheduler::PreemptAction::Cancel } else { scheduler::PreemptAction::Requeue };
        config.qos.insert(
            q.name.clone(),
            scheduler::Qos { priority: q.priority, preempt: q.preempt.clone(), preempt_mode: mode, limits: q.limits.clone() },
        );
    }
    let (nodes, nodes_reused) = node_views_cached(state, &mut cache.nodes, cache.views);
    cache.nodes_reused = nodes_reused;
    let reservations = state.reservations.values().cloned().collect();
    ClusterView {
        nodes,
        jobs,
        partitions,
        usage: state.usage.clone(),
        qos_usage: state.qos_usage.clone(),
        config,
        accounts: state.accounts.clone(),
        reservations,
    }
}

/// A job the scheduler must see whatever depends on it: not final, or holding a part.
pub fn is_live(job: &Job) -> bool {
    !job.state.is_final() || !job.parts.is_empty()
}

/// Jobs the scheduler may place now: pending, with no part of an earlier run still stopping.
pub fn placeable(job: &Job) -> bool {
    job.state == JobState::Pending && job.parts.is_empty()
}
