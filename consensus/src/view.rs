//! The bridge from the replicated state to the pure scheduler: the `ClusterView` it plans on,
//! and the re-check of a committed plan against the state it is applied to.

use std::collections::BTreeMap;

use proto::{Allocation, Job, JobId, JobState, NodeId, NodeState};
use scheduler::{ClusterView, NodeView};

use crate::state::ClusterState;

/// Every node with the resources its parts hold marked used. When a partition of the policy
/// lists its nodes, every node's partitions are spelled out (`partitions_of_node`), and a node
/// in none is not schedulable.
pub fn node_views(state: &ClusterState) -> BTreeMap<NodeId, NodeView> {
    let lists = state.policy.lists_nodes();
    let mut views: BTreeMap<NodeId, NodeView> = state
        .nodes
        .values()
        .map(|n| {
            let mut view = scheduler::node_view(n.id, &n.name, &n.inventory, n.state == NodeState::Up && !n.drained);
            for g in view.gpus.iter_mut() {
                g.pinned = n.mig_pinned.get(&g.index).cloned();
            }
            if lists {
                view.partitions = state.policy.partitions_of_node(&n.name, &n.inventory.partitions);
                view.schedulable &= !view.partitions.is_empty();
            }
            (n.id, view)
        })
        .collect();
    for part in state.jobs.values().flat_map(|j| j.parts.iter()) {
        if let Some(view) = views.get_mut(&part.alloc.node) {
            take(view, &part.alloc);
        }
    }
    views
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
    let mut jobs: Vec<scheduler::JobRequest> = state.jobs.values().filter(|j| is_live(j)).map(request).collect();
    let targets: std::collections::BTreeSet<JobId> = state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending)
        .flat_map(|j| j.spec.dependencies.iter().filter_map(|d| d.job))
        .filter(|id| !state.jobs.get(id).is_some_and(is_live))
        .collect();
    if !targets.is_empty() {
        jobs.extend(targets.into_iter().filter_map(|id| match state.jobs.get(&id) {
            Some(j) => Some(request(j)),
            None => archived(id).map(|j| scheduler::job_request(&j)),
        }));
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
    ClusterView { nodes: node_views(state), jobs, partitions, usage: state.usage.clone(), config, accounts: state.accounts.clone() }
}

/// A job the scheduler must see whatever depends on it: not final, or holding a part.
pub fn is_live(job: &Job) -> bool {
    !job.state.is_final() || !job.parts.is_empty()
}

/// Jobs the scheduler may place now: pending, with no part of an earlier run still stopping.
pub fn placeable(job: &Job) -> bool {
    job.state == JobState::Pending && job.parts.is_empty()
}
