//! Pure placement: no IO, no clock, no randomness, no async. The same `ClusterView` and `now_ms`
//! give the same `Plan` on every node and in every test (ordered maps, stable tie-breaks).
//!
//! The leader calls [`schedule`] and commits the plan; `ClusterState::apply` re-checks every
//! placement with [`fits`] and rejects the stale ones, like Nomad's plan applier.

use std::collections::BTreeMap;

use proto::{Allocation, JobId, NodeId, Placement, RunNo};

/// One GPU of a node as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSlot {
    pub index: u32,
    pub gres_type: String,
    /// Held by a job (running, or stopping and not yet confirmed gone).
    pub busy: bool,
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
}

impl NodeView {
    pub fn gpus_free(&self) -> u32 {
        self.gpus.iter().filter(|g| !g.busy).count() as u32
    }

    /// Marks an allocation's resources used. Callers check [`fits`] first.
    pub fn take(&mut self, alloc: &Allocation) {
        for g in self.gpus.iter_mut().filter(|g| alloc.gpus.contains(&g.index)) {
            assert!(!g.busy, "gpu {} of node {} taken twice", g.index, self.id);
            g.busy = true;
        }
        self.cpus_used += alloc.cpus;
        self.mem_used_mib += alloc.mem_mib;
    }
}

/// What one pending job asks of a single node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRequest {
    pub id: JobId,
    /// The run this placement starts.
    pub run: RunNo,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub cpus: u32,
    pub mem_mib: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub nodes: BTreeMap<NodeId, NodeView>,
    /// Pending jobs in the order they should be considered (priority, then submit order).
    pub pending: Vec<JobRequest>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub placements: Vec<Placement>,
    /// Jobs left pending, with the reason.
    pub pending_reasons: BTreeMap<JobId, String>,
}

/// Why a placement does not fit a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Misfit {
    NodeUnavailable,
    UnknownGpu(u32),
    GpuBusy(u32),
    WrongGpuType { index: u32, want: String, have: String },
    DuplicateGpu(u32),
    WrongGpuCount { want: u32, got: u32 },
    Cpus { want: u32, free: u32 },
    Memory { want_mib: u64, free_mib: u64 },
}

impl std::fmt::Display for Misfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Misfit::NodeUnavailable => write!(f, "node is not up"),
            Misfit::UnknownGpu(i) => write!(f, "gpu {i} does not exist"),
            Misfit::GpuBusy(i) => write!(f, "gpu {i} is busy"),
            Misfit::WrongGpuType { index, want, have } => write!(f, "gpu {index} is {have}, not {want}"),
            Misfit::DuplicateGpu(i) => write!(f, "gpu {i} listed twice"),
            Misfit::WrongGpuCount { want, got } => write!(f, "needs {want} gpus, plan gives {got}"),
            Misfit::Cpus { want, free } => write!(f, "needs {want} cpus, {free} free"),
            Misfit::Memory { want_mib, free_mib } => write!(f, "needs {want_mib} MiB, {free_mib} MiB free"),
        }
    }
}

/// Whether `job` can run on `node` with exactly the GPUs `gpus`, given what the node holds now.
pub fn fits(node: &NodeView, job: &JobRequest, gpus: &[u32]) -> Result<(), Misfit> {
    if !node.schedulable {
        return Err(Misfit::NodeUnavailable);
    }
    if gpus.len() as u32 != job.gpus {
        return Err(Misfit::WrongGpuCount { want: job.gpus, got: gpus.len() as u32 });
    }
    for (i, &index) in gpus.iter().enumerate() {
        if gpus[..i].contains(&index) {
            return Err(Misfit::DuplicateGpu(index));
        }
        let slot = node.gpus.iter().find(|g| g.index == index).ok_or(Misfit::UnknownGpu(index))?;
        if slot.busy {
            return Err(Misfit::GpuBusy(index));
        }
        if let Some(want) = &job.gpu_type {
            if &slot.gres_type != want {
                return Err(Misfit::WrongGpuType { index, want: want.clone(), have: slot.gres_type.clone() });
            }
        }
    }
    let cpus_free = node.cpus_total.saturating_sub(node.cpus_used);
    if job.cpus > cpus_free {
        return Err(Misfit::Cpus { want: job.cpus, free: cpus_free });
    }
    let mem_free_mib = node.mem_total_mib.saturating_sub(node.mem_used_mib);
    if job.mem_mib > mem_free_mib {
        return Err(Misfit::Memory { want_mib: job.mem_mib, free_mib: mem_free_mib });
    }
    Ok(())
}

/// Picks free GPUs of the wanted type on `node`, lowest indices first; `None` when too few.
fn pick_gpus(node: &NodeView, job: &JobRequest) -> Option<Vec<u32>> {
    let picked: Vec<u32> = node
        .gpus
        .iter()
        .filter(|g| !g.busy && job.gpu_type.as_ref().is_none_or(|t| &g.gres_type == t))
        .map(|g| g.index)
        .take(job.gpus as usize)
        .collect();
    (picked.len() as u32 == job.gpus).then_some(picked)
}

/// Places pending single-node jobs in order, best fit: among nodes where the job fits, the one
/// with the fewest free GPUs left afterwards (ties: lowest node id), so small jobs pack and whole
/// nodes stay free for large ones. A job that does not fit now is skipped and later jobs may
/// still start (the real engine with reservations and backfill is its own issue).
pub fn schedule(view: &ClusterView, _now_ms: u64) -> Plan {
    let mut nodes = view.nodes.clone();
    let mut plan = Plan::default();
    for job in &view.pending {
        let mut best: Option<(u32, NodeId, Vec<u32>)> = None;
        for node in nodes.values() {
            let Some(gpus) = pick_gpus(node, job) else { continue };
            if fits(node, job, &gpus).is_err() {
                continue;
            }
            let left = node.gpus_free() - job.gpus;
            if best.as_ref().is_none_or(|(l, _, _)| left < *l) {
                best = Some((left, node.id, gpus));
            }
        }
        match best {
            Some((_, node_id, gpus)) => {
                let alloc = Allocation { node: node_id, gpus, cpus: job.cpus, mem_mib: job.mem_mib };
                if let Some(node) = nodes.get_mut(&node_id) {
                    node.take(&alloc);
                }
                plan.placements.push(Placement { job: job.id, run: job.run, allocs: vec![alloc] });
            }
            None => {
                plan.pending_reasons.insert(job.id, why_pending(&nodes, job));
            }
        }
    }
    plan
}

/// One line that says why `job` fits on no node now.
fn why_pending(nodes: &BTreeMap<NodeId, NodeView>, job: &JobRequest) -> String {
    let kind = job.gpu_type.as_ref().map_or("gpu".to_string(), |t| format!("gpu:{t}"));
    let largest = nodes
        .values()
        .filter(|n| n.schedulable)
        .map(|n| {
            let free = n.gpus.iter().filter(|g| !g.busy && job.gpu_type.as_ref().is_none_or(|t| &g.gres_type == t));
            (free.count(), n.name.as_str())
        })
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)));
    match largest {
        None => "no node is up".to_string(),
        Some((free, name)) if (free as u32) < job.gpus => {
            format!("needs {}x {kind} on one node; largest free: {free} on {name}", job.gpus)
        }
        Some(_) => format!("needs {} cpus and {} MiB on a node with {}x {kind} free", job.cpus, job.mem_mib, job.gpus),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: NodeId, gpus: u32, busy: &[u32]) -> NodeView {
        NodeView {
            id,
            name: format!("n{id}"),
            schedulable: true,
            gpus: (0..gpus).map(|i| GpuSlot { index: i, gres_type: "h100".into(), busy: busy.contains(&i) }).collect(),
            cpus_total: 64,
            cpus_used: 0,
            mem_total_mib: 512 * 1024,
            mem_used_mib: 0,
        }
    }

    fn job(id: JobId, gpus: u32) -> JobRequest {
        JobRequest { id, run: 1, gpus, gpu_type: None, cpus: 1, mem_mib: 1024 }
    }

    fn view(nodes: Vec<NodeView>, pending: Vec<JobRequest>) -> ClusterView {
        ClusterView { nodes: nodes.into_iter().map(|n| (n.id, n)).collect(), pending }
    }

    #[test]
    fn small_jobs_pack_so_a_whole_node_stays_free() {
        let v = view(vec![node(1, 8, &[]), node(2, 8, &[0, 1])], vec![job(10, 1), job(11, 8)]);
        let plan = schedule(&v, 0);
        assert_eq!(plan.placements.len(), 2);
        assert_eq!(plan.placements[0].allocs[0], Allocation { node: 2, gpus: vec![2], cpus: 1, mem_mib: 1024 });
        assert_eq!(plan.placements[1].allocs[0].node, 1);
        assert_eq!(plan.placements[1].allocs[0].gpus, (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn never_hands_out_a_gpu_twice_and_explains_pending() {
        let v = view(vec![node(1, 4, &[])], vec![job(1, 3), job(2, 2), job(3, 1)]);
        let plan = schedule(&v, 0);
        let ids: Vec<JobId> = plan.placements.iter().map(|p| p.job).collect();
        assert_eq!(ids, vec![1, 3]);
        assert_eq!(plan.placements[1].allocs[0].gpus, vec![3]);
        assert_eq!(plan.pending_reasons[&2], "needs 2x gpu on one node; largest free: 1 on n1");
    }

    #[test]
    fn fits_rejects_stale_placements() {
        let n = node(1, 2, &[1]);
        assert_eq!(fits(&n, &job(1, 1), &[1]), Err(Misfit::GpuBusy(1)));
        assert_eq!(fits(&n, &job(1, 1), &[5]), Err(Misfit::UnknownGpu(5)));
        assert_eq!(fits(&n, &job(1, 2), &[0, 0]), Err(Misfit::DuplicateGpu(0)));
        assert_eq!(fits(&n, &job(1, 2), &[0]), Err(Misfit::WrongGpuCount { want: 2, got: 1 }));
        let mut typed = job(1, 1);
        typed.gpu_type = Some("a100".into());
        assert!(matches!(fits(&n, &typed, &[0]), Err(Misfit::WrongGpuType { .. })));
        let mut down = n.clone();
        down.schedulable = false;
        assert_eq!(fits(&down, &job(1, 1), &[0]), Err(Misfit::NodeUnavailable));
        assert_eq!(fits(&n, &job(1, 1), &[0]), Ok(()));
    }
}
