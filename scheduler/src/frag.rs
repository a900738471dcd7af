//! Fragmentation-aware choice of a node and of a shared GPU, after FGD (Weng et al., "Beware
//! of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
//! USENIX ATC'23).
//!
//! The cluster's workload is the shapes of the jobs it holds (pending and running), each
//! weighted by how many jobs have it. A node's fragmentation for one shape is the GPU capacity
//! free on it (in thousandths of a GPU: a free GPU is 1000, a shared one its free shards'
//! share) that the shape cannot use: all of it when the node cannot host the shape at all (too
//! few usable GPUs or CPUs), else what sits on GPUs the shape cannot use (a shard job's shards
//! on a GPU with fewer free than it asks; a whole-GPU job's on a GPU held in part). The node's
//! fragmentation is the weighted sum over the shapes, and a job goes where placing it adds the
//! least (the gradient); ties go to keeping whole GPUs whole, then to the tightest node, then
//! to the first node. All integer arithmetic: the same view gives the same choice on every node.
//!
//! Nodes alike (the same GPUs in the same state, the same CPUs free) score alike, so a pass
//! keeps them in classes ([`FragIndex`]) and scores each class once per kind of job: a placement
//! costs a look at each class, not at each node.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::fit::is_mig_profile;
use crate::view::{JobRequest, NodeView};

/// Shapes kept, most frequent first, until they cover this share of the jobs (per mille)...
const COVER_PER_MILLE: u64 = 1000;
/// ...or this many: the cost of one class's fragmentation grows with them. (openb default,
/// seeds 42-45: 95.02% allocated with every shape up to 256, 94.90 with 64, 94.88 with 60%
/// of the jobs' shapes up to 32 (FGD's default cut is 60%), 94.75 with 80% up to 48.)
const SHAPES_MAX: usize = 256;
/// Scores kept per pass (classes times kinds of job); past it they are computed anew.
const SCORES_MAX: usize = 1 << 16;

/// A GPU type, interned by the pass (see `TypeIndex`).
type Ty = u16;

/// One node's share of a job, as fragmentation sees it. `ty` is `None` for any GPU type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Shape {
    ty: Option<Ty>,
    gpus: u32,
    shards: u32,
    cpus: u32,
}

impl Shape {
    /// `j`'s share, its GPU type interned by `ty_of` (`None`: a type no node has).
    fn of(j: &JobRequest, ty_of: &impl Fn(&str) -> Option<Ty>) -> Option<Shape> {
        let ty = match j.gpu_type.as_deref() {
            None => None,
            Some(t) => Some(ty_of(t)?),
        };
        Some(Shape { ty, gpus: j.gpus_per_node, shards: j.shards_per_node, cpus: j.cpus_per_node })
    }
}

/// One GPU as fragmentation sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Gpu {
    ty: Ty,
    /// Free as a whole GPU.
    whole: bool,
    shards_free: u32,
    shards_total: u32,
}

impl Gpu {
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
        s.ty.is_none_or(|t| t == self.ty) && if s.shards > 0 { self.shards_free >= s.shards } else { self.whole }
    }
}

/// What fragmentation sees of a node: its GPUs outside MIG mode (sorted, so nodes alike are
/// equal) and its free CPUs. The key of a class.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct State {
    gpus: Vec<Gpu>,
    cpus_free: u32,
}

impl State {
    fn of(node: &NodeView, ty_of: &impl Fn(&str) -> Option<Ty>) -> State {
        let mut gpus: Vec<Gpu> = node
            .gpus
            .iter()
            .filter(|g| g.healthy && !g.mig_enabled)
            .filter_map(|g| {
                let ty = ty_of(&g.gres_type)?;
                Some(Gpu { ty, whole: g.free(), shards_free: g.shards_free(), shards_total: g.shards_total })
            })
            .collect();
        gpus.sort();
        State { gpus, cpus_free: node.cpus_free() }
    }

    fn frag(&self, w: &[(Shape, u64)]) -> u64 {
        let free: u64 = self.gpus.iter().map(Gpu::milli).sum();
        if free == 0 {
            return 0;
        }
        let mut sum = 0;
        for (s, weight) in w {
            let usable = self.gpus.iter().filter(|g| g.serves(s)).count() as u32;
            let hosts = self.cpus_free >= s.cpus && usable >= if s.shards > 0 { 1 } else { s.gpus.max(1) };
            let lost = if hosts { self.gpus.iter().filter(|g| !g.serves(s)).map(Gpu::milli).sum() } else { free };
            sum += weight * lost;
        }
        sum
    }

    /// Whether a node in this state has the GPUs and CPUs one node of `ask` needs.
    fn holds(&self, ask: &Shape) -> bool {
        let usable = self.gpus.iter().filter(|g| g.serves(ask)).count() as u32;
        self.cpus_free >= ask.cpus && usable >= if ask.shards > 0 { 1 } else { ask.gpus }
    }

    /// The states after placing `ask`: one for a whole-GPU or GPU-less job, one per kind of GPU
    /// that can take its shards for a shard job (with the position of that GPU).
    fn after(&self, ask: &Shape) -> Vec<(State, Option<usize>)> {
        let mut base = self.clone();
        base.cpus_free = base.cpus_free.saturating_sub(ask.cpus);
        if ask.shards == 0 {
            let mut left = ask.gpus;
            for g in base.gpus.iter_mut().filter(|g| g.serves(ask)) {
                if left == 0 {
                    break;
                }
                *g = Gpu { whole: false, shards_free: 0, ..*g };
                left -= 1;
            }
            return vec![(base, None)];
        }
        let mut out = Vec::new();
        for (i, g) in self.gpus.iter().enumerate() {
            // GPUs alike give the same state: the first of each is enough.
            if !g.serves(ask) || self.gpus[..i].contains(g) {
                continue;
            }
            let mut s = base.clone();
            s.gpus[i] = Gpu { whole: false, shards_free: g.shards_free - ask.shards, ..*g };
            out.push((s, Some(i)));
        }
        out
    }
}

/// How a placement is ranked, least first: the fragmentation it adds; then whether it breaks a
/// whole GPU for shards (a GPU already shared is filled first, keeping whole ones for whole
/// jobs); then the capacity the node has free (the tightest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank {
    delta: i64,
    broken: bool,
    tight: u64,
}

/// The best placement of a kind of job on a node of a class: its rank and, for shards, the
/// position of the GPU shared in the class's sorted GPUs; `None` where it does not fit.
type Scored = Option<(Rank, Option<usize>)>;

/// The schedulable nodes of a pass in classes of nodes alike, per partition, with the workload
/// and the scores of each class for each kind of job, kept as the pass places work.
pub(crate) struct FragIndex {
    workload: Vec<(Shape, u64)>,
    class_of: Vec<Option<State>>,
    classes: BTreeMap<u16, BTreeMap<State, BTreeSet<u32>>>,
    scores: BTreeMap<(State, Shape), Scored>,
}

impl FragIndex {
    /// Classes of the schedulable `nodes` under their partitions `parts`, and the workload of
    /// `jobs`; GPU types interned by `ty_of`.
    pub fn new(
        jobs: &[Arc<JobRequest>],
        nodes: &[impl std::borrow::Borrow<NodeView>],
        parts: &[Vec<u16>],
        ty_of: &impl Fn(&str) -> Option<Ty>,
    ) -> FragIndex {
        let mut index = FragIndex {
            workload: workload(jobs, ty_of),
            class_of: vec![None; nodes.len()],
            classes: BTreeMap::new(),
            scores: BTreeMap::new(),
        };
        for (n, node) in nodes.iter().enumerate() {
            index.update(n, node.borrow(), &parts[n], ty_of);
        }
        index
    }

    /// Node `n` changed (work was placed on it): it moves to the class of its new state.
    pub fn update(&mut self, n: usize, node: &NodeView, parts: &[u16], ty_of: &impl Fn(&str) -> Option<Ty>) {
        if let Some(old) = self.class_of[n].take() {
            for p in parts {
                if let Some(set) = self.classes.get_mut(p).and_then(|c| c.get_mut(&old)) {
                    set.remove(&(n as u32));
                    if set.is_empty() {
                        self.classes.get_mut(p).map(|c| c.remove(&old));
                    }
                }
            }
        }
        if !node.schedulable {
            return;
        }
        let state = State::of(node, ty_of);
        for &p in parts {
            self.classes.entry(p).or_default().entry(state.clone()).or_default().insert(n as u32);
        }
        self.class_of[n] = Some(state);
    }

    /// Where `j`'s single node's share adds the least fragmentation among the nodes of
    /// partition `part` that `ok` accepts (it checks what classes do not: node lists,
    /// memory, reservations): the node, and for a shard job the index of the GPU to share.
    pub fn choose(
        &mut self,
        nodes: &[impl std::borrow::Borrow<NodeView>],
        j: &JobRequest,
        part: u16,
        ty_of: &impl Fn(&str) -> Option<Ty>,
        mut ok: impl FnMut(usize) -> bool,
    ) -> Option<(usize, Option<u32>)> {
        let ask = Shape::of(j, ty_of)?;
        if self.scores.len() > SCORES_MAX {
            self.scores.clear();
        }
        let mut ranked: Vec<(Rank, u32, &State)> = Vec::new();
        for (state, members) in self.classes.get(&part)? {
            if !state.holds(&ask) {
                continue;
            }
            let key = (state.clone(), ask);
            let workload = &self.workload;
            let scored = *self.scores.entry(key).or_insert_with(|| score(state, &ask, workload));
            if let (Some((rank, _)), Some(&first)) = (scored, members.first()) {
                ranked.push((rank, first, state));
            }
        }
        ranked.sort();
        for (_, _, state) in ranked {
            let Some(n) = self.classes[&part][state].iter().map(|&n| n as usize).find(|&n| ok(n)) else { continue };
            let pos = self.scores.get(&(state.clone(), ask)).copied().flatten().and_then(|(_, g)| g);
            let gpu = pos.map(|p| {
                let want = state.gpus[p];
                let node = nodes[n].borrow();
                node.gpus
                    .iter()
                    .filter(|g| g.healthy && !g.mig_enabled && ty_of(&g.gres_type) == Some(want.ty))
                    .find(|g| g.free() == want.whole && g.shards_free() == want.shards_free && g.shards_total == want.shards_total)
                    .map_or(0, |g| g.index)
            });
            return Some((n, gpu));
        }
        None
    }
}

/// The best placement of `ask` on a node in `state`: its rank and, for shards, the position of
/// the GPU shared (in the state's sorted GPUs).
fn score(state: &State, ask: &Shape, workload: &[(Shape, u64)]) -> Scored {
    let before = state.frag(workload) as i64;
    let tight: u64 = state.gpus.iter().map(Gpu::milli).sum();
    let rank = |s: &State, g: Option<usize>| Rank {
        delta: s.frag(workload) as i64 - before,
        broken: g.is_some_and(|g| state.gpus[g].whole),
        tight,
    };
    state.after(ask).into_iter().map(|(s, g)| (rank(&s, g), g)).min_by_key(|&(r, g)| (r, g))
}

/// The shapes of `jobs` pending or running that ask whole GPUs or shards (not MIG instances),
/// the most frequent first (ties by shape), cut as [`COVER_PER_MILLE`] and [`SHAPES_MAX`] say.
fn workload(jobs: &[Arc<JobRequest>], ty_of: &impl Fn(&str) -> Option<Ty>) -> Vec<(Shape, u64)> {
    let mut counts: BTreeMap<Shape, u64> = BTreeMap::new();
    // Runs of jobs alike (arrays, sweeps) are counted before they are looked up.
    let mut run: Option<(Shape, u64)> = None;
    for j in jobs.iter().filter(|j| !j.state.is_final()) {
        if (j.gpus_per_node == 0 && j.shards_per_node == 0) || j.gpu_type.as_deref().is_some_and(is_mig_profile) {
            continue;
        }
        let Some(shape) = Shape::of(j, ty_of) else { continue };
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
    shapes
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
