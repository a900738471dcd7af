//! Fragmentation-aware choice of a node and of a shared GPU, after FGD (Weng et al., "Beware
//! of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
//! USENIX ATC'23).
//!
//! The cluster's workload is the shapes of the jobs it holds (pending and running), each
//! weighted by how many jobs have it. A node's fragmentation for one shape is the GPU capacity
//! free on it (in thousandths of a GPU: a free GPU is 1000, a shared one its free shards'
//! share) that the shape cannot use: all of it when the node cannot host the shape at all
//! (too few usable GPUs, CPUs or memory), else what sits on GPUs the shape cannot use (a shard
//! job's shards on a GPU with fewer free than it asks; a whole-GPU job's on a GPU held in
//! part). The node's fragmentation is the weighted sum over the shapes, and a job goes where
//! placing it adds the least (the gradient), ties to the tightest node, then the first in the
//! caller's order. All integer arithmetic: the same view gives the same choice on every node.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::fit::is_mig_profile;
use crate::view::{JobRequest, NodeView};

/// Shapes kept, most frequent first, until they cover this share of the jobs (per mille)...
const COVER_PER_MILLE: u64 = 950;
/// ...or this many: the cost of one node's fragmentation grows with them.
const SHAPES_MAX: usize = 32;

/// One node's share of a job, as fragmentation sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Shape<'v> {
    gpu_type: Option<&'v str>,
    gpus: u32,
    shards: u32,
    cpus: u32,
}

impl<'v> Shape<'v> {
    fn of(j: &'v JobRequest) -> Shape<'v> {
        Shape { gpu_type: j.gpu_type.as_deref(), gpus: j.gpus_per_node, shards: j.shards_per_node, cpus: j.cpus_per_node }
    }
}

/// The shapes of the GPU jobs a cluster holds, with how many jobs have each.
#[derive(Debug, Default)]
pub(crate) struct Workload<'v> {
    shapes: Vec<(Shape<'v>, u64)>,
}

impl<'v> Workload<'v> {
    /// The shapes of `jobs` pending or running that ask whole GPUs or shards (not MIG
    /// instances), the most frequent first (ties by shape), cut as [`COVER_PER_MILLE`] and
    /// [`SHAPES_MAX`] say.
    pub fn of(jobs: &'v [Arc<JobRequest>]) -> Workload<'v> {
        let mut counts: BTreeMap<Shape, u64> = BTreeMap::new();
        // Runs of jobs alike (arrays, sweeps) are counted before they are looked up.
        let mut run: Option<(Shape, u64)> = None;
        for j in jobs.iter().filter(|j| !j.state.is_final()) {
            if (j.gpus_per_node == 0 && j.shards_per_node == 0) || j.gpu_type.as_deref().is_some_and(is_mig_profile) {
                continue;
            }
            let shape = Shape::of(j);
            match &mut run {
                Some((s, n)) if *s == shape => *n += 1,
                _ => {
                    if let Some((s, n)) = run.replace((shape, 1)) {
                        *counts.entry(s).or_default() += n;
                    }
                }
            }
        }
        if let Some((s, n)) = run {
            *counts.entry(s).or_default() += n;
        }
        let total: u64 = counts.values().sum();
        let mut shapes: Vec<(Shape, u64)> = counts.into_iter().collect();
        shapes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut covered = 0;
        let keep = shapes
            .iter()
            .take_while(|(_, c)| {
                let more = covered * 1000 < total * COVER_PER_MILLE;
                covered += c;
                more
            })
            .count()
            .min(SHAPES_MAX);
        shapes.truncate(keep);
        Workload { shapes }
    }
}

/// One GPU as fragmentation sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Gpu<'v> {
    gres_type: &'v str,
    /// Free as a whole GPU.
    whole: bool,
    shards_free: u32,
    shards_total: u32,
}

impl Gpu<'_> {
    /// Free capacity in thousandths of a GPU.
    fn milli(&self) -> u64 {
        if self.whole {
            1000
        } else if self.shards_total > 0 {
            u64::from(self.shards_free) * 1000 / u64::from(self.shards_total)
        } else {
            0
        }
    }

    fn serves(&self, s: &Shape) -> bool {
        s.gpu_type.is_none_or(|t| t == self.gres_type) && if s.shards > 0 { self.shards_free >= s.shards } else { self.whole }
    }
}

/// What fragmentation sees of a node: its GPUs outside MIG mode (sorted, so nodes alike are
/// equal) and its free CPUs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct State<'v> {
    gpus: Vec<Gpu<'v>>,
    cpus_free: u32,
}

impl<'v> State<'v> {
    fn of(node: &'v NodeView) -> State<'v> {
        let mut gpus: Vec<Gpu> = node
            .gpus
            .iter()
            .filter(|g| g.healthy && !g.mig_enabled)
            .map(|g| Gpu { gres_type: &g.gres_type, whole: g.free(), shards_free: g.shards_free(), shards_total: g.shards_total })
            .collect();
        gpus.sort();
        State { gpus, cpus_free: node.cpus_free() }
    }

    fn frag(&self, w: &Workload) -> u64 {
        let free: u64 = self.gpus.iter().map(Gpu::milli).sum();
        if free == 0 {
            return 0;
        }
        let mut sum = 0;
        for (s, weight) in &w.shapes {
            let usable = self.gpus.iter().filter(|g| g.serves(s)).count() as u32;
            let hosts = self.cpus_free >= s.cpus && usable >= if s.shards > 0 { 1 } else { s.gpus.max(1) };
            let lost = if hosts { self.gpus.iter().filter(|g| !g.serves(s)).map(Gpu::milli).sum() } else { free };
            sum += weight * lost;
        }
        sum
    }

    /// The states after placing `j`'s share: one for a whole-GPU or GPU-less job, one per kind
    /// of GPU that can take its shards for a shard job (with the position of that GPU).
    fn after(&self, j: &JobRequest) -> Vec<(State<'v>, Option<usize>)> {
        let mut base = self.clone();
        base.cpus_free = base.cpus_free.saturating_sub(j.cpus_per_node);
        let shape = Shape::of(j);
        if j.shards_per_node == 0 {
            let mut left = j.gpus_per_node;
            for g in base.gpus.iter_mut().filter(|g| g.serves(&shape)) {
                if left == 0 {
                    break;
                }
                *g = Gpu { whole: false, shards_free: 0, ..g.clone() };
                left -= 1;
            }
            return vec![(base, None)];
        }
        let mut out: Vec<(State<'v>, Option<usize>)> = Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            // GPUs alike give the same state: the first of each is enough.
            if !g.serves(&shape) || self.gpus[..i].contains(g) {
                continue;
            }
            let mut s = base.clone();
            s.gpus[i] = Gpu { whole: false, shards_free: g.shards_free - j.shards_per_node, ..g.clone() };
            out.push((s, Some(i)));
        }
        out
    }
}

/// How a placement is ranked, least first: the fragmentation it adds; then whether it breaks a
/// whole GPU for shards (a GPU already shared is filled first, keeping whole ones for whole
/// jobs); then the capacity the node has free (the tightest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    delta: i64,
    broken: bool,
    tight: u64,
}

/// Where `j`'s single node's share adds the least fragmentation: among `cands` (node
/// positions in the caller's order, each already able to hold it), the node, and for a shard
/// job the index of the GPU to share. `None` when no candidate can.
pub(crate) fn choose(
    nodes: &[impl std::borrow::Borrow<NodeView>],
    cands: impl Iterator<Item = usize>,
    w: &Workload,
    j: &JobRequest,
) -> Option<(usize, Option<u32>)> {
    // Nodes in the same state score the same: each state is scored once.
    let mut memo: BTreeMap<State, Option<(Key, Option<usize>)>> = BTreeMap::new();
    let mut best: Option<(Key, usize, Option<usize>)> = None;
    for n in cands {
        let node = nodes[n].borrow();
        let state = State::of(node);
        let scored = *memo.entry(state.clone()).or_insert_with(|| {
            let before = state.frag(w) as i64;
            let tight: u64 = state.gpus.iter().map(Gpu::milli).sum();
            let key = |s: &State, g: Option<usize>| Key {
                delta: s.frag(w) as i64 - before,
                broken: g.is_some_and(|g| state.gpus[g].whole),
                tight,
            };
            state.after(j).into_iter().map(|(s, g)| (key(&s, g), g)).min_by_key(|&(k, g)| (k, g))
        });
        let Some((key, gpu)) = scored else { continue };
        if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
            best = Some((key, n, gpu));
        }
    }
    let (_, n, pos) = best?;
    // The position is in the sorted state of the node: find a GPU of the node in that state.
    let index = pos.map(|p| {
        let want = &State::of(nodes[n].borrow()).gpus[p];
        nodes[n]
            .borrow()
            .gpus
            .iter()
            .filter(|g| g.healthy && !g.mig_enabled)
            .find(|g| {
                g.gres_type == want.gres_type
                    && g.free() == want.whole
                    && g.shards_free() == want.shards_free
                    && g.shards_total == want.shards_total
            })
            .map_or(0, |g| g.index)
    });
    Some((n, index))
}

/// For a shard job without fragmentation scoring: the GPU of `node` of its type with the fewest
/// free shards that still hold its ask, then the lowest index (best fit).
pub(crate) fn tightest_shared(node: &NodeView, j: &JobRequest) -> Option<u32> {
    node.gpus
        .iter()
        .filter(|g| j.gpu_type.as_ref().is_none_or(|t| &g.gres_type == t) && g.shards_free() >= j.shards_per_node)
        .min_by_key(|g| (g.shards_free(), g.index))
        .map(|g| g.index)
}
