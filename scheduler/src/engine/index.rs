//! Indexes a pass builds once over the view: partitions and GPU types interned as numbers, and
//! each array's counts of running and started tasks.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use proto::{JobId, JobState};

use super::Buckets;
use crate::units::{Kinds, ANY};
use crate::view::{ClusterView, NodeView};

/// Partitions interned as numbers: their names and numbers, the default partition's, and each
/// node's partitions (sorted, the default for a node that names none).
pub(super) struct PartIndex {
    pub(super) names: Vec<String>,
    pub(super) ix: BTreeMap<String, u16>,
    pub(super) default: u16,
    pub(super) node_parts: Vec<Vec<u16>>,
}

/// The number of partition `name`, interned (added to `names` and `ix`) if new.
pub(super) fn intern_part(name: &str, names: &mut Vec<String>, ix: &mut BTreeMap<String, u16>) -> u16 {
    if let Some(&i) = ix.get(name) {
        return i;
    }
    let i = names.len() as u16;
    names.push(name.to_string());
    ix.insert(name.to_string(), i);
    i
}

/// Interns the default partition first, then the view's partitions, then any only nodes name.
pub(super) fn intern_partitions(view: &ClusterView, nodes: &[Cow<'_, NodeView>]) -> PartIndex {
    let default_name =
        view.partitions.values().find(|p| p.default).map_or_else(|| view.config.default_partition.clone(), |p| p.name.clone());
    let mut names: Vec<String> = Vec::new();
    let mut ix: BTreeMap<String, u16> = BTreeMap::new();
    let default = intern_part(&default_name, &mut names, &mut ix);
    for p in view.partitions.keys() {
        intern_part(p, &mut names, &mut ix);
    }
    let mut node_parts = Vec::with_capacity(nodes.len());
    for n in nodes {
        let mut ps: Vec<u16> = if n.partitions.is_empty() {
            vec![default]
        } else {
            n.partitions.iter().map(|p| intern_part(p, &mut names, &mut ix)).collect()
        };
        ps.sort_unstable();
        ps.dedup();
        node_parts.push(ps);
    }
    PartIndex { names, ix, default, node_parts }
}

/// GPU types (MIG profiles among them) interned as numbers after [`ANY`], whether each is a MIG
/// profile, each node's (partition, type, free GPUs) keys, and the schedulable nodes bucketed by
/// free GPUs per (partition, type).
pub(super) struct TypeIndex {
    pub(super) names: Vec<String>,
    pub(super) ix: BTreeMap<String, u16>,
    pub(super) is_mig: Vec<bool>,
    pub(super) node_keys: Vec<Vec<(u16, u16, u32)>>,
    pub(super) index: BTreeMap<(u16, u16), Buckets>,
}

impl TypeIndex {
    /// The type numbers node `n` offers ([`ANY`] and its GPUs' types or MIG profiles, sorted),
    /// interning the new ones.
    fn intern_node_types(&mut self, n: &NodeView) -> Vec<u16> {
        let mut tids: Vec<u16> = vec![ANY];
        for g in &n.gpus {
            let names: Vec<&str> =
                if g.mig_enabled { g.mig.iter().map(|m| m.profile.as_str()).collect() } else { vec![g.gres_type.as_str()] };
            for t in names {
                let id = match self.ix.get(t) {
                    Some(&id) => id,
                    None => {
                        let id = self.names.len() as u16;
                        self.names.push(t.to_string());
                        self.is_mig.push(g.mig_enabled);
                        self.ix.insert(t.to_string(), id);
                        id
                    }
                };
                tids.push(id);
            }
        }
        tids.sort_unstable();
        tids.dedup();
        tids
    }
}

/// Interns the GPU types of `nodes` in node order and indexes each node under its partitions
/// (`node_parts`) and types.
pub(super) fn index_gpu_types(nodes: &[Cow<'_, NodeView>], node_parts: &[Vec<u16>]) -> TypeIndex {
    let mut types = TypeIndex {
        names: vec![String::new()],
        ix: BTreeMap::new(),
        is_mig: vec![false],
        node_keys: Vec::with_capacity(nodes.len()),
        index: BTreeMap::new(),
    };
    for (ni, n) in nodes.iter().enumerate() {
        let tids = types.intern_node_types(n);
        let mut keys = Vec::new();
        for &p in &node_parts[ni] {
            for &t in &tids {
                let free = Kinds { names: &types.names, is_mig: &types.is_mig }.free(n, t);
                keys.push((p, t, free));
                if n.schedulable {
                    types.index.entry((p, t)).or_default().insert(free, ni as u32);
                }
            }
        }
        types.node_keys.push(keys);
    }
    types
}

/// Per array job, its tasks running now and every task number already created (started).
pub(super) fn array_counts(view: &ClusterView) -> (BTreeMap<JobId, u32>, BTreeMap<JobId, BTreeSet<u32>>) {
    let mut array_active: BTreeMap<JobId, u32> = BTreeMap::new();
    let mut array_created: BTreeMap<JobId, BTreeSet<u32>> = BTreeMap::new();
    for j in &view.jobs {
        if !j.array_started.is_empty() {
            array_created.entry(j.id).or_default().extend(j.array_started.iter().copied());
        }
        if let Some(t) = &j.array_task {
            array_created.entry(t.array_job).or_default().insert(t.task);
            if j.state == JobState::Running {
                *array_active.entry(t.array_job).or_default() += 1;
            }
        }
    }
    (array_active, array_created)
}
