//! The bridge from the replicated state to the pure scheduler: the `ClusterView` it plans on,
//! and the re-check of a committed plan against the state it is applied to.

use std::collections::{BTreeMap, BTreeSet};

use proto::{Allocation, Job, JobState, NodeId, NodeState};
use scheduler::{ClusterView, GpuSlot, JobRequest, NodeView};

use crate::state::ClusterState;

/// Every node with the resources its parts hold marked used.
pub fn node_views(state: &ClusterState) -> BTreeMap<NodeId, NodeView> {
    let mut views: BTreeMap<NodeId, NodeView> = state
        .nodes
        .values()
        .map(|n| {
            let view = NodeView {
                id: n.id,
                name: n.name.clone(),
                schedulable: n.state == NodeState::Up && !n.drained,
                // An unhealthy GPU is never placeable: it counts as busy.
                gpus: n.inventory.gpus.iter().map(|g| GpuSlot { index: g.index, gres_type: g.gres_type.clone(), busy: !g.healthy }).collect(),
                cpus_total: n.inventory.cpus,
                cpus_used: 0,
                mem_total_mib: n.inventory.memory_mib,
                mem_used_mib: 0,
            };
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

/// Marks `alloc`'s resources used on `view`.
pub fn take(view: &mut NodeView, alloc: &Allocation) {
    view.take(alloc);
}

/// What a pending job asks of each of its nodes for its next run.
pub fn job_request(job: &Job) -> JobRequest {
    JobRequest {
        id: job.id,
        run: job.run.saturating_add(1),
        gpus: job.spec.gpus(),
        gpu_type: job.spec.gres.as_ref().and_then(|g| g.gpu_type.clone()),
        cpus: job.spec.cpus_per_task.saturating_mul(job.spec.ntasks_per_node),
        mem_mib: job.spec.mem_mib,
    }
}

/// Whether `allocs` (one per node) can start `job` on the nodes as they are now.
pub fn check_gang(nodes: &BTreeMap<NodeId, NodeView>, job: &Job, allocs: &[Allocation]) -> Result<(), String> {
    if allocs.len() != job.spec.nodes as usize {
        return Err(format!("job {} needs {} nodes, plan gives {}", job.id, job.spec.nodes, allocs.len()));
    }
    let distinct: BTreeSet<NodeId> = allocs.iter().map(|a| a.node).collect();
    if distinct.len() != allocs.len() {
        return Err(format!("job {} placed twice on one node", job.id));
    }
    let request = job_request(job);
    for alloc in allocs {
        let node = nodes.get(&alloc.node).ok_or_else(|| format!("node {} does not exist", alloc.node))?;
        if alloc.cpus != request.cpus || alloc.mem_mib != request.mem_mib {
            return Err(format!(
                "allocation of {} cpus and {} MiB on node {} does not match the request of {} cpus and {} MiB",
                alloc.cpus, alloc.mem_mib, node.name, request.cpus, request.mem_mib
            ));
        }
        scheduler::fits(node, &request, &alloc.gpus).map_err(|m| format!("node {}: {m}", node.name))?;
    }
    Ok(())
}

/// What the scheduler needs: nodes with their free resources and the jobs it may place now
/// (pending, and no part of an earlier run still stopping), in id order.
pub fn scheduler_view(state: &ClusterState) -> ClusterView {
    let pending = state
        .jobs
        .values()
        .filter(|j| j.state == JobState::Pending && j.parts.is_empty() && j.spec.nodes == 1)
        .map(job_request)
        .collect();
    ClusterView { nodes: node_views(state), pending }
}
