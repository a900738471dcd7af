//! Re-checking a placement against the current state: [`fits`] per node, [`fits_gang`] for all
//! nodes of a job. `ClusterState::apply` uses them to reject stale plans.

use std::collections::BTreeMap;

use proto::{Allocation, GpuInfo, Inventory, JobSpec, NodeId};

use crate::mig;
use crate::need::{Misfit, PerNode};
use crate::view::{decode_slot, JobRequest, NodeView, Slot};

/// Whether `gres_type` names a MIG profile of some known model.
pub fn is_mig_profile(gres_type: &str) -> bool {
    mig::Model::ALL.iter().any(|m| m.profile(gres_type).is_some())
}

/// Why no node of the cluster, whatever its state and load, could ever hold one node's share of
/// a job of `spec`: fewer nodes than its gang of the job's partition (a node naming none is in
/// `default_partition` only) have its constraint's features, are not excluded (and are listed,
/// where the node list names the whole gang), and have as many GPUs of its whole-GPU type, CPUs
/// and MiB as it asks per node. Counts the hardware, healthy or not, in MIG mode or not. Slurm
/// refuses such a job at submit, in the words this returns; accepted, it would pend for ever
/// (a gang larger than its partition: `Node count specification invalid`). `None` when enough
/// nodes could, when the partition has no node yet or none with a GPU of the kind asked (one
/// may join; the job pends until then: GPU nodes often join after the first voters); MIG
/// profiles are [`mig::never_fits`]'s. Stops at the first `nodes` that could: a job that fits
/// costs a look at a few nodes.
pub fn never_holds<'a>(
    nodes: impl IntoIterator<Item = (&'a str, &'a Inventory)>,
    default_partition: &str,
    spec: &JobSpec,
) -> Option<String> {
    let mut need = PerNode::of(spec);
    let partition = spec.partition.as_deref().unwrap_or(default_partition);
    let gpu_type = spec.gres.as_ref().and_then(|g| g.gpu_type.as_deref());
    // A shard job needs one GPU configured with at least its shards.
    let shards = spec.shards();
    if shards > 0 {
        need.gpus = 1;
    }
    let whole = |g: &&GpuInfo| gpu_type.is_none_or(|t| g.gres_type == t) && g.shards >= shards;
    // Whether an eligible node has a GPU of the kind asked at all (none asked: yes).
    let (mut members, mut capable, mut has_kind) = (0usize, 0usize, need.gpus == 0);
    let mut largest = PerNode { nodes: 0, gpus: 0, cpus: 0, mem_mib: 0 };
    for (name, inv) in nodes {
        let member = if inv.partitions.is_empty() { partition == default_partition } else { inv.partitions.iter().any(|p| p == partition) };
        let listed = spec.nodelist.len() < need.nodes as usize || spec.nodelist.iter().any(|n| n == name);
        if !member
            || !listed
            || spec.exclude.iter().any(|n| n == name)
            || !spec.constraint.iter().all(|c| proto::feature_matches(&inv.features, c))
        {
            members += usize::from(member);
            continue;
        }
        members += 1;
        let gpus = inv.gpus.iter().filter(whole).count() as u32;
        has_kind |= inv.gpus.iter().any(|g| gpu_type.is_none_or(|t| g.gres_type == t));
        largest = largest.max(PerNode { nodes: 1, gpus, cpus: inv.cpus, mem_mib: inv.memory_mib });
        if gpus >= need.gpus && inv.cpus >= need.cpus && inv.memory_mib >= need.mem_mib {
            capable += 1;
            if capable >= need.nodes as usize {
                return None;
            }
        }
    }
    if members == 0 || !has_kind {
        return None;
    }
    if members < need.nodes as usize {
        return Some(format!("Node count specification invalid: needs {} nodes; partition {partition} has {members}", need.nodes));
    }
    let kind = match (gpu_type, shards) {
        (t, 0) => t.map_or_else(|| "gpu".to_string(), |t| format!("gpu:{t}")),
        (t, n) => format!("{} with {n} shards", t.map_or_else(|| "gpu".to_string(), |t| format!("gpu:{t}"))),
    };
    Some(format!(
        "Requested node configuration is not available: needs {} node(s) with {}x {kind}, {} cpus and {} MiB each; \
         partition {partition} has {capable} (largest: {}x {kind}, {} cpus, {} MiB)",
        need.nodes, need.gpus, need.cpus, need.mem_mib, largest.gpus, largest.cpus, largest.mem_mib
    ))
}

/// Static checks: everything but free resources (partition by the node's own list only).
pub(crate) fn node_matches(node: &NodeView, job: &JobRequest) -> Result<(), Misfit> {
    if !node.schedulable {
        return Err(Misfit::NodeUnavailable);
    }
    if let Some(p) = &job.partition {
        if !node.partitions.is_empty() && !node.partitions.contains(p) {
            return Err(Misfit::NotInPartition(p.clone()));
        }
    }
    if let Some(feat) = job.constraint.iter().find(|c| !proto::feature_matches(&node.features, c)) {
        return Err(Misfit::MissingFeature(feat.clone()));
    }
    if job.exclude.contains(&node.name) {
        return Err(Misfit::Excluded(node.name.clone()));
    }
    // A node list at least as long as the gang names every node; a shorter one names the
    // required nodes and the rest are free to choose (checked in `fits_gang`).
    if !job.nodelist.is_empty() && job.nodelist.len() >= job.nodes as usize && !job.nodelist.contains(&node.name) {
        return Err(Misfit::NotInNodelist(node.name.clone()));
    }
    Ok(())
}

/// Whether `job` can run on `node` with exactly `alloc`, given what the node holds now.
pub fn fits(node: &NodeView, job: &JobRequest, alloc: &Allocation) -> Result<(), Misfit> {
    if alloc.node != node.id {
        return Err(Misfit::WrongNode { want: node.id, got: alloc.node });
    }
    node_matches(node, job)?;
    if job.exclusive && !node.idle() {
        return Err(Misfit::NotIdle);
    }
    if job.shards_per_node > 0 {
        fits_shards(node, job, alloc)?;
        return fits_cpus_mem(node, job, alloc);
    }
    let got = alloc.gpus.len() as u32;
    if got != job.gpus_per_node {
        return Err(Misfit::WrongGpuCount { want: job.gpus_per_node, got });
    }
    let want_mig = job.gpu_type.as_deref().filter(|t| is_mig_profile(t));
    for (i, &id) in alloc.gpus.iter().enumerate() {
        if alloc.gpus[..i].contains(&id) {
            return Err(Misfit::DuplicateGpu(id));
        }
        match decode_slot(id) {
            Slot::Gpu(index) => {
                let slot = node.gpus.iter().find(|g| g.index == index).ok_or(Misfit::UnknownGpu(index))?;
                if !slot.healthy {
                    return Err(Misfit::GpuUnhealthy(index));
                }
                if slot.mig_enabled {
                    return Err(Misfit::GpuInMigMode(index));
                }
                if slot.busy || slot.shards_used > 0 {
                    return Err(Misfit::GpuBusy(index));
                }
                if let Some(want) = &job.gpu_type {
                    if &slot.gres_type != want {
                        return Err(Misfit::WrongGpuType { index, want: want.clone(), have: slot.gres_type.clone() });
                    }
                }
            }
            Slot::Mig { gpu, start_slice } => {
                let g = node.gpus.iter().find(|g| g.index == gpu).ok_or(Misfit::UnknownGpu(gpu))?;
                let m = g.mig.iter().find(|m| m.start_slice == start_slice).ok_or(Misfit::UnknownMig { gpu, start_slice })?;
                if !g.healthy {
                    return Err(Misfit::GpuUnhealthy(gpu));
                }
                if g.draining() {
                    return Err(Misfit::MigRelayout(gpu));
                }
                if m.busy {
                    return Err(Misfit::MigBusy { gpu, start_slice });
                }
                match want_mig {
                    Some(want) if want == m.profile => {}
                    _ => {
                        let want = job.gpu_type.clone().unwrap_or_else(|| "a whole gpu".to_string());
                        return Err(Misfit::WrongMigProfile { gpu, start_slice, want, have: m.profile.clone() });
                    }
                }
            }
            Slot::Shard { .. } => return Err(Misfit::WrongShards { want: 0 }),
        }
    }
    fits_cpus_mem(node, job, alloc)
}

/// A shard job's allocation: `shards_per_node` shards of one GPU of its type that has them free.
fn fits_shards(node: &NodeView, job: &JobRequest, alloc: &Allocation) -> Result<(), Misfit> {
    let want = job.shards_per_node;
    let [id] = alloc.gpus.as_slice() else { return Err(Misfit::WrongShards { want }) };
    let Slot::Shard { gpu, shards } = decode_slot(*id) else { return Err(Misfit::WrongShards { want }) };
    if shards != want {
        return Err(Misfit::WrongShards { want });
    }
    let slot = node.gpus.iter().find(|g| g.index == gpu).ok_or(Misfit::UnknownGpu(gpu))?;
    if !slot.healthy {
        return Err(Misfit::GpuUnhealthy(gpu));
    }
    if slot.mig_enabled {
        return Err(Misfit::GpuInMigMode(gpu));
    }
    if let Some(t) = &job.gpu_type {
        if &slot.gres_type != t {
            return Err(Misfit::WrongGpuType { index: gpu, want: t.clone(), have: slot.gres_type.clone() });
        }
    }
    if slot.shards_free() < want {
        return Err(Misfit::Shards { gpu, want, free: slot.shards_free() });
    }
    Ok(())
}

/// The CPUs and memory of an allocation: at least what the job asks, at most what is free.
fn fits_cpus_mem(node: &NodeView, job: &JobRequest, alloc: &Allocation) -> Result<(), Misfit> {
    if alloc.cpus < job.cpus_per_node || alloc.mem_mib < job.mem_per_node_mib {
        return Err(Misfit::Short { cpus: alloc.cpus, mem_mib: alloc.mem_mib });
    }
    if alloc.cpus > node.cpus_free() {
        return Err(Misfit::Cpus { want: alloc.cpus, free: node.cpus_free() });
    }
    if alloc.mem_mib > node.mem_free_mib() {
        return Err(Misfit::Memory { want_mib: alloc.mem_mib, free_mib: node.mem_free_mib() });
    }
    Ok(())
}

/// Whether every allocation of a gang fits: one per node, distinct nodes, a node count of the
/// job's range (`nodes..=nodes_max`: any, for `-N MIN-MAX`), every required node of
/// `--nodelist` present. `view_nodes` holds views or shared views.
pub fn fits_gang<N: std::borrow::Borrow<NodeView>>(
    view_nodes: &BTreeMap<NodeId, N>,
    job: &JobRequest,
    allocs: &[Allocation],
) -> Result<(), Misfit> {
    let got = allocs.len() as u32;
    if got < job.nodes || got > job.nodes_max.max(job.nodes) {
        return Err(Misfit::WrongNodeCount { want: job.nodes, want_max: job.nodes_max.max(job.nodes), got });
    }
    for (i, a) in allocs.iter().enumerate() {
        if allocs[..i].iter().any(|b| b.node == a.node) {
            return Err(Misfit::DuplicateNode(a.node));
        }
        let node = view_nodes.get(&a.node).ok_or(Misfit::UnknownNode(a.node))?.borrow();
        fits(node, job, a).map_err(|m| Misfit::OnNode { node: a.node, misfit: Box::new(m) })?;
    }
    for name in &job.nodelist {
        if !allocs.iter().any(|a| view_nodes.get(&a.node).is_some_and(|n| &n.borrow().name == name)) {
            return Err(Misfit::MissingRequiredNode(name.clone()));
        }
    }
    Ok(())
}
