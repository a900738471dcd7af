//! MIG profile tables and the layout planner.
//!
//! A MIG-capable GPU has 8 memory slices and 7 compute slices. Each profile takes some of each
//! and may only start at certain memory slices (`nvidia-smi mig -lgipp`). The H200 table is
//! taken from the real fixtures in `node/tests/fixtures/h200/`:
//!
//! ```text
//! GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1   1g.18gb
//! GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1   1g.18gb+me (1 per GPU)
//! GPU  0 Profile ID 15 Placements: {0,2,4,6}:2         1g.35gb
//! GPU  0 Profile ID 14 Placements: {0,2,4}:2           2g.35gb
//! GPU  0 Profile ID  9 Placements: {0,4}:4             3g.71gb
//! GPU  0 Profile ID  5 Placement : {0}:4               4g.71gb
//! GPU  0 Profile ID  0 Placement : {0}:8               7g.141gb
//! ```
//!
//! H100 80GB and A100 40/80GB share the same slice geometry with their own memory sizes.

use std::collections::BTreeMap;
use std::fmt;

/// Memory slices of a MIG-capable GPU.
pub const MEMORY_SLICES: u32 = 8;
/// Compute (GPC) slices of a MIG-capable GPU.
pub const COMPUTE_SLICES: u32 = 7;
/// Bound on instances on one GPU (7 x 1g plus one spare), so every search is bounded.
pub const INSTANCES_PER_GPU_MAX: usize = 8;

/// A GPU model with a known MIG profile table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Model {
    A100Gb40,
    A100Gb80,
    H100Gb80,
    H200Gb141,
}

/// One MIG GPU-instance profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: &'static str,
    pub compute_slices: u32,
    pub memory_slices: u32,
    pub memory_mib: u64,
    /// Memory slices the instance may start at.
    pub starts: &'static [u32],
    /// At most this many instances of the profile on one GPU.
    pub instances_max: u32,
}

const fn p(name: &'static str, compute: u32, memory: u32, memory_mib: u64, starts: &'static [u32], max: u32) -> Profile {
    Profile { name, compute_slices: compute, memory_slices: memory, memory_mib, starts, instances_max: max }
}

const ANY_1: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const EVEN_2: &[u32] = &[0, 2, 4, 6];
const TWO_G: &[u32] = &[0, 2, 4];
const HALF: &[u32] = &[0, 4];
const ZERO: &[u32] = &[0];

static H200: [Profile; 7] = [
    p("1g.18gb", 1, 1, 16384, ANY_1, 7),
    p("1g.18gb+me", 1, 1, 16384, ANY_1, 1),
    p("1g.35gb", 1, 2, 33280, EVEN_2, 4),
    p("2g.35gb", 2, 2, 33280, TWO_G, 3),
    p("3g.71gb", 3, 4, 71424, HALF, 2),
    p("4g.71gb", 4, 4, 71424, ZERO, 1),
    p("7g.141gb", 7, 8, 143360, ZERO, 1),
];
static H100_80: [Profile; 7] = [
    p("1g.10gb", 1, 1, 9856, ANY_1, 7),
    p("1g.10gb+me", 1, 1, 9856, ANY_1, 1),
    p("1g.20gb", 1, 2, 19968, EVEN_2, 4),
    p("2g.20gb", 2, 2, 19968, TWO_G, 3),
    p("3g.40gb", 3, 4, 40192, HALF, 2),
    p("4g.40gb", 4, 4, 40192, ZERO, 1),
    p("7g.80gb", 7, 8, 80384, ZERO, 1),
];
static A100_80: [Profile; 7] = [
    p("1g.10gb", 1, 1, 9728, ANY_1, 7),
    p("1g.10gb+me", 1, 1, 9728, ANY_1, 1),
    p("1g.20gb", 1, 2, 19968, EVEN_2, 4),
    p("2g.20gb", 2, 2, 19968, TWO_G, 3),
    p("3g.40gb", 3, 4, 40192, HALF, 2),
    p("4g.40gb", 4, 4, 40192, ZERO, 1),
    p("7g.80gb", 7, 8, 80384, ZERO, 1),
];
static A100_40: [Profile; 7] = [
    p("1g.5gb", 1, 1, 4864, ANY_1, 7),
    p("1g.5gb+me", 1, 1, 4864, ANY_1, 1),
    p("1g.10gb", 1, 2, 9984, EVEN_2, 4),
    p("2g.10gb", 2, 2, 9984, TWO_G, 3),
    p("3g.20gb", 3, 4, 19968, HALF, 2),
    p("4g.20gb", 4, 4, 19968, ZERO, 1),
    p("7g.40gb", 7, 8, 40192, ZERO, 1),
];

impl Model {
    pub const ALL: [Model; 4] = [Model::A100Gb40, Model::A100Gb80, Model::H100Gb80, Model::H200Gb141];

    pub fn name(self) -> &'static str {
        match self {
            Model::A100Gb40 => "A100 40GB",
            Model::A100Gb80 => "A100 80GB",
            Model::H100Gb80 => "H100 80GB",
            Model::H200Gb141 => "H200",
        }
    }

    pub fn profiles(self) -> &'static [Profile] {
        match self {
            Model::A100Gb40 => &A100_40,
            Model::A100Gb80 => &A100_80,
            Model::H100Gb80 => &H100_80,
            Model::H200Gb141 => &H200,
        }
    }

    pub fn profile(self, name: &str) -> Option<&'static Profile> {
        self.profiles().iter().find(|p| p.name == name)
    }

    /// The model from `nvidia-smi`'s product name and the GPU's memory (A100 comes in two sizes).
    pub fn detect(product_name: &str, memory_mib: u64) -> Option<Model> {
        let upper = product_name.to_ascii_uppercase();
        if upper.contains("H200") {
            Some(Model::H200Gb141)
        } else if upper.contains("H100") {
            Some(Model::H100Gb80)
        } else if upper.contains("A100") {
            Some(if memory_mib > 48 * 1024 || upper.contains("80GB") { Model::A100Gb80 } else { Model::A100Gb40 })
        } else {
            None
        }
    }
}

impl fmt::Display for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One instance of a layout: a profile at a start slice.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placed {
    pub profile: String,
    pub start_slice: u32,
    pub size_slices: u32,
}

/// A set of instances on one GPU, ordered by start slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub model: Model,
    pub instances: Vec<Placed>,
}

impl Layout {
    pub fn profiles(&self) -> Vec<String> {
        self.instances.iter().map(|i| i.profile.clone()).collect()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigError {
    UnknownProfile {
        model: Model,
        profile: String,
    },
    TooManyInstances {
        model: Model,
        profile: String,
        want: u32,
        max: u32,
    },
    ComputeSlices {
        model: Model,
        profiles: Vec<String>,
        want: u32,
    },
    MemorySlices {
        model: Model,
        profiles: Vec<String>,
        want: u32,
        free: u32,
    },
    /// Enough slices in total, but the start-slice rules leave no arrangement.
    NoArrangement {
        model: Model,
        profiles: Vec<String>,
        taken: Vec<u32>,
        rules: String,
    },
    /// A layout that leaves out an instance a job holds.
    DropsHeld {
        model: Model,
        profile: String,
        start_slice: u32,
    },
}

/// `3g.71gb: slices 0-3 or 4-7`.
fn rule_text(p: &Profile) -> String {
    let spans: Vec<String> =
        p.starts.iter().map(|s| if p.memory_slices == 1 { format!("{s}") } else { format!("{s}-{}", s + p.memory_slices - 1) }).collect();
    let word = if p.memory_slices == 1 { "slice" } else { "slices" };
    format!("{}: {word} {}", p.name, spans.join(" or "))
}

impl fmt::Display for MigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MigError::UnknownProfile { model, profile } => {
                let known: Vec<&str> = model.profiles().iter().map(|p| p.name).collect();
                write!(f, "{model} has no MIG profile {profile} (known: {})", known.join(", "))
            }
            MigError::TooManyInstances { model, profile, want, max } => {
                write!(f, "cannot place {want}x {profile} on one {model}: at most {max} per GPU")
            }
            MigError::ComputeSlices { model, profiles, want } => write!(
                f,
                "cannot place {} on one {model}: they need {want} compute slices, a GPU has {COMPUTE_SLICES}",
                profiles.join(", ")
            ),
            MigError::MemorySlices { model, profiles, want, free } => write!(
                f,
                "cannot place {} on one {model}: they need {want} memory slices, {free} of {MEMORY_SLICES} are free",
                profiles.join(", ")
            ),
            MigError::NoArrangement { model, profiles, taken, rules } => {
                let taken_text = if taken.is_empty() {
                    String::new()
                } else {
                    let t: Vec<String> = taken.iter().map(u32::to_string).collect();
                    format!("; slices {} are taken", t.join(", "))
                };
                write!(f, "cannot place {} on one {model}: {rules}{taken_text}", profiles.join(", "))
            }
            MigError::DropsHeld { model, profile, start_slice } => {
                write!(f, "the layout leaves out the {profile} at slice {start_slice} of this {model}, which a job holds")
            }
        }
    }
}

impl std::error::Error for MigError {}

fn mask(start: u32, size: u32) -> u8 {
    debug_assert!(start + size <= MEMORY_SLICES);
    (((1u16 << size) - 1) << start) as u8
}

/// One instance to place on a GPU's memory slices: how many it takes and where it may start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape<'a> {
    pub size_slices: u32,
    pub starts: &'a [u32],
}

/// Start slices for `shapes` on a GPU whose taken slices are the bits of `occupied`, in the
/// order of `shapes`; None when no arrangement exists. The one search both the scheduler
/// ([`placeable_with`]) and a node changing a GPU's layout (`node::gpu::mig::plan_layout`, with
/// the table `nvidia-smi` printed) use, so a layout the leader found placeable is placed the
/// same way on the node. Tries the largest first, then those with the fewest starts (a stable
/// order); bounded: at most [`INSTANCES_PER_GPU_MAX`] levels, 8 branches each.
pub fn arrange(shapes: &[Shape<'_>], occupied: u8) -> Option<Vec<u32>> {
    if shapes.len() > INSTANCES_PER_GPU_MAX || shapes.iter().any(|s| s.size_slices == 0 || s.size_slices > MEMORY_SLICES) {
        return None;
    }
    let mut order: Vec<usize> = (0..shapes.len()).collect();
    order.sort_by(|&a, &b| {
        let (sa, sb) = (shapes[a], shapes[b]);
        sb.size_slices.cmp(&sa.size_slices).then(sa.starts.len().cmp(&sb.starts.len()))
    });
    let sorted: Vec<Shape<'_>> = order.iter().map(|&i| shapes[i]).collect();
    let mut starts_sorted = Vec::with_capacity(sorted.len());
    if !search(&sorted, occupied, &mut starts_sorted) {
        return None;
    }
    let mut starts = vec![0; shapes.len()];
    for (k, &i) in order.iter().enumerate() {
        starts[i] = starts_sorted[k];
    }
    Some(starts)
}

/// Depth-first search over start slices, `items` in search order; `out` holds the starts so
/// far. Bounded by [`arrange`]'s checks.
fn search(items: &[Shape<'_>], occupied: u8, out: &mut Vec<u32>) -> bool {
    let depth = out.len();
    if depth == items.len() {
        return true;
    }
    let p = items[depth];
    for &start in p.starts.iter().filter(|s| **s + p.size_slices <= MEMORY_SLICES) {
        let m = mask(start, p.size_slices);
        if occupied & m != 0 {
            continue;
        }
        // Identical shapes in ascending start order only (prunes symmetric branches).
        if depth > 0 && items[depth - 1] == p && out.last().is_some_and(|&s| s > start) {
            continue;
        }
        out.push(start);
        if search(items, occupied | m, out) {
            return true;
        }
        out.pop();
    }
    false
}

/// Whether `profiles` can all live on one idle GPU of `model`; the layout when they can.
pub fn placeable<S: AsRef<str>>(model: Model, profiles: &[S]) -> Result<Layout, MigError> {
    placeable_with(model, &[], profiles)
}

/// Like [`placeable`] on a GPU that already holds `existing` instances (profile, start slice).
pub fn placeable_with<S: AsRef<str>>(model: Model, existing: &[Placed], profiles: &[S]) -> Result<Layout, MigError> {
    let names: Vec<String> = profiles.iter().map(|s| s.as_ref().to_string()).collect();
    let mut items: Vec<&'static Profile> = Vec::with_capacity(names.len());
    for name in &names {
        let profile = model.profile(name).ok_or_else(|| MigError::UnknownProfile { model, profile: name.clone() })?;
        items.push(profile);
    }
    let mut occupied = 0u8;
    let mut compute = 0u32;
    let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
    for e in existing {
        let profile = model.profile(&e.profile).ok_or_else(|| MigError::UnknownProfile { model, profile: e.profile.clone() })?;
        occupied |= mask(e.start_slice.min(MEMORY_SLICES - 1), e.size_slices.min(MEMORY_SLICES - e.start_slice.min(MEMORY_SLICES - 1)));
        compute += profile.compute_slices;
        *counts.entry(profile.name).or_default() += 1;
    }
    for p in &items {
        *counts.entry(p.name).or_default() += 1;
    }
    for (name, &want) in &counts {
        if let Some(p) = model.profile(name) {
            if want > p.instances_max {
                return Err(MigError::TooManyInstances { model, profile: name.to_string(), want, max: p.instances_max });
            }
        }
    }
    compute += items.iter().map(|p| p.compute_slices).sum::<u32>();
    if compute > COMPUTE_SLICES || items.len() + existing.len() > INSTANCES_PER_GPU_MAX {
        return Err(MigError::ComputeSlices { model, profiles: names, want: compute });
    }
    let memory: u32 = items.iter().map(|p| p.memory_slices).sum();
    let free = MEMORY_SLICES - occupied.count_ones();
    if memory > free {
        return Err(MigError::MemorySlices { model, profiles: names, want: memory, free });
    }
    // Largest first, then fewest start choices, then name: a stable, quick search order.
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| {
        let (pa, pb) = (items[a], items[b]);
        pb.memory_slices.cmp(&pa.memory_slices).then(pa.starts.len().cmp(&pb.starts.len())).then(pa.name.cmp(pb.name))
    });
    let sorted: Vec<&'static Profile> = order.iter().map(|&i| items[i]).collect();
    let shapes: Vec<Shape<'static>> = sorted.iter().map(|p| Shape { size_slices: p.memory_slices, starts: p.starts }).collect();
    let Some(starts) = arrange(&shapes, occupied) else {
        let mut seen: Vec<&str> = Vec::new();
        let mut rules = Vec::new();
        for p in &sorted {
            if !seen.contains(&p.name) {
                seen.push(p.name);
                rules.push(rule_text(p));
            }
        }
        let taken: Vec<u32> = (0..MEMORY_SLICES).filter(|s| occupied & (1 << s) != 0).collect();
        return Err(MigError::NoArrangement { model, profiles: names, taken, rules: rules.join("; ") });
    };
    let mut instances: Vec<Placed> = existing.to_vec();
    for (p, start) in sorted.iter().zip(starts) {
        instances.push(Placed { profile: p.name.to_string(), start_slice: start, size_slices: p.memory_slices });
    }
    instances.sort_by_key(|i| i.start_slice);
    Ok(Layout { model, instances })
}

/// The most instances of `profile` one idle GPU of `model` holds at once (0 where the model has
/// no such profile): `3g.71gb` on an H200 is 2, whatever its table's `instances_max` says.
pub fn instances_per_gpu_max(model: Model, profile: &str) -> u32 {
    let Some(p) = model.profile(profile) else { return 0 };
    (1..=p.instances_max.min(INSTANCES_PER_GPU_MAX as u32))
        .rev()
        .find(|&k| placeable(model, &vec![p.name; k as usize]).is_ok())
        .unwrap_or(0)
}

/// Compute slices (of [`COMPUTE_SLICES`]) one `Allocation::gpus` entry of a job that asked for
/// `gres_type` holds: all of them for a whole GPU, the profile's for a MIG instance (every
/// profile of `gres_type` is the job's, one type per job). A profile no table knows counts by its
/// name's `Ng` (`1g.6gb` is 1); one whose name says nothing counts 1, the least an instance has.
/// GPU-seconds are weighted by this share of [`COMPUTE_SLICES`].
pub fn slot_compute_slices(slot: u32, gres_type: Option<&str>) -> u32 {
    if matches!(crate::decode_slot(slot), crate::Slot::Gpu(_)) {
        return COMPUTE_SLICES;
    }
    let Some(profile) = gres_type else { return 1 };
    if let Some(p) = Model::ALL.iter().find_map(|m| m.profile(profile)) {
        return p.compute_slices;
    }
    profile.split_once('g').and_then(|(n, _)| n.parse::<u32>().ok()).map_or(1, |n| n.clamp(1, COMPUTE_SLICES))
}

/// Why no node could ever hold `count` instances of MIG profile `profile` for one job at once,
/// however its MIG-mode GPUs were laid out: `nodes` are (name, GPUs). `None` when some node
/// could, and when no node has a MIG-mode GPU whose model knows the profile (such a node may
/// join; the job pends until then).
pub fn never_fits<'a>(nodes: impl IntoIterator<Item = (&'a str, &'a [proto::GpuInfo])>, profile: &str, count: u32) -> Option<String> {
    let mut best: Option<(u32, &str)> = None;
    let mut per_gpu: Option<(Model, u32)> = None;
    // One layout search per model, not per GPU: this runs on every MIG submission.
    let mut per_model: BTreeMap<Model, u32> = BTreeMap::new();
    for (name, gpus) in nodes {
        let mut holds = 0u32;
        for g in gpus.iter().filter(|g| g.mig_enabled) {
            let Some(model) = Model::detect(&g.model, g.memory_mib).filter(|m| m.profile(profile).is_some()) else { continue };
            let n = *per_model.entry(model).or_insert_with(|| instances_per_gpu_max(model, profile));
            per_gpu.get_or_insert((model, n));
            holds = holds.saturating_add(n);
        }
        if per_gpu.is_some() && best.is_none_or(|(b, _)| holds > b) {
            best = Some((holds, name));
        }
    }
    let ((most, node), (model, n)) = (best?, per_gpu?);
    (most < count).then(|| {
        format!(
            "no node can ever hold {count}x {profile} at once: one {model} holds at most {n} (MIG slice rules), and the most any node holds is {most} ({node})"
        )
    })
}

/// The layout a GPU of `model` takes when it is re-partitioned into `target` while jobs hold its
/// instances `kept`: they stay where they are (each must be in `target`), the rest of `target`
/// is placed around them. The one rule the leader plans with and a node applies.
pub fn relayout<S: AsRef<str>>(model: Model, kept: &[Placed], target: &[S]) -> Result<Layout, MigError> {
    let mut rest: Vec<&str> = target.iter().map(AsRef::as_ref).collect();
    for k in kept {
        let Some(i) = rest.iter().position(|p| *p == k.profile) else {
            return Err(MigError::DropsHeld { model, profile: k.profile.clone(), start_slice: k.start_slice });
        };
        rest.remove(i);
    }
    placeable_with(model, kept, &rest)
}

/// The layout an idle GPU of `model` should take to serve as much of `demand` (profile ->
/// instances wanted) as one GPU can: largest profiles first, each added while it still fits;
/// then the rest filled with more of the demanded profiles (largest first), then with the
/// model's smallest, so no slice is left without an instance (a static layout, sized once).
/// Unknown profiles are ignored; empty demand gives an empty layout.
pub fn plan_layout(model: Model, demand: &BTreeMap<String, u32>) -> Layout {
    let mut wanted: Vec<(&'static Profile, u32)> =
        demand.iter().filter_map(|(name, &n)| model.profile(name).map(|p| (p, n.min(COMPUTE_SLICES)))).collect();
    wanted.sort_by(|a, b| b.0.compute_slices.cmp(&a.0.compute_slices).then(a.0.name.cmp(b.0.name)));
    let mut chosen: Vec<&str> = Vec::new();
    let mut best = Layout { model, instances: Vec::new() };
    let mut add_while_it_fits = |profile: &'static Profile, count: u32, chosen: &mut Vec<&str>| {
        for _ in 0..count {
            chosen.push(profile.name);
            match placeable(model, chosen) {
                Ok(layout) => best = layout,
                Err(_) => {
                    chosen.pop();
                    break;
                }
            }
        }
    };
    for &(profile, count) in &wanted {
        add_while_it_fits(profile, count, &mut chosen);
    }
    if !chosen.is_empty() {
        let smallest = model.profiles().iter().filter(|p| !p.name.ends_with("+me")).min_by_key(|p| (p.compute_slices, p.memory_slices));
        let fillers = wanted.iter().map(|&(p, _)| p).chain(smallest);
        for profile in fillers {
            add_while_it_fits(profile, COMPUTE_SLICES, &mut chosen);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h200_three_g_starts_only_at_zero_or_four() {
        let l = placeable(Model::H200Gb141, &["3g.71gb", "3g.71gb"]).unwrap();
        let starts: Vec<u32> = l.instances.iter().map(|i| i.start_slice).collect();
        assert_eq!(starts, vec![0, 4]);
        let existing = [Placed { profile: "1g.18gb".into(), start_slice: 1, size_slices: 1 }];
        let l = placeable_with(Model::H200Gb141, &existing, &["3g.71gb"]).unwrap();
        assert_eq!(l.instances[1], Placed { profile: "3g.71gb".into(), start_slice: 4, size_slices: 4 });
    }

    #[test]
    fn start_rules_make_a_fitting_total_impossible() {
        let existing = [
            Placed { profile: "1g.18gb".into(), start_slice: 1, size_slices: 1 },
            Placed { profile: "1g.18gb".into(), start_slice: 5, size_slices: 1 },
        ];
        let err = placeable_with(Model::H200Gb141, &existing, &["3g.71gb"]).unwrap_err();
        assert_eq!(err.to_string(), "cannot place 3g.71gb on one H200: 3g.71gb: slices 0-3 or 4-7; slices 1, 5 are taken");
    }

    #[test]
    fn impossible_sets_name_profiles_and_slices() {
        let err = placeable(Model::H200Gb141, &["3g.71gb", "3g.71gb", "1g.18gb"]).unwrap_err();
        assert_eq!(err.to_string(), "cannot place 3g.71gb, 3g.71gb, 1g.18gb on one H200: they need 9 memory slices, 8 of 8 are free");
        let err = placeable(Model::H200Gb141, &["4g.71gb", "4g.71gb"]).unwrap_err();
        assert_eq!(err.to_string(), "cannot place 2x 4g.71gb on one H200: at most 1 per GPU");
        let err = placeable(Model::H200Gb141, &["4g.71gb", "2g.35gb", "2g.35gb"]).unwrap_err();
        assert_eq!(err.to_string(), "cannot place 4g.71gb, 2g.35gb, 2g.35gb on one H200: they need 8 compute slices, a GPU has 7");
        let err = placeable(Model::H200Gb141, &["5g.90gb"]).unwrap_err();
        assert!(err.to_string().starts_with("H200 has no MIG profile 5g.90gb"));
    }

    #[test]
    fn mixed_layouts_use_the_allowed_starts() {
        let l = placeable(Model::H200Gb141, &["3g.71gb", "2g.35gb", "2g.35gb"]).unwrap();
        let got: Vec<(String, u32)> = l.instances.iter().map(|i| (i.profile.clone(), i.start_slice)).collect();
        assert_eq!(got, vec![("2g.35gb".into(), 0), ("2g.35gb".into(), 2), ("3g.71gb".into(), 4)]);
        let l = placeable(Model::H200Gb141, &["1g.18gb"; 7]).unwrap();
        assert_eq!(l.instances.iter().map(|i| i.start_slice).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
        assert!(placeable(Model::H200Gb141, &["1g.18gb"; 8]).is_err());
    }

    #[test]
    fn plan_layout_serves_demand_largest_first() {
        let demand: BTreeMap<String, u32> = [("3g.71gb".to_string(), 1), ("1g.18gb".to_string(), 10)].into();
        let l = plan_layout(Model::H200Gb141, &demand);
        assert_eq!(l.profiles(), vec!["1g.18gb", "1g.18gb", "1g.18gb", "1g.18gb", "3g.71gb"]);
        let l = plan_layout(Model::A100Gb40, &[("3g.20gb".to_string(), 3)].into());
        assert_eq!(l.profiles(), vec!["3g.20gb", "3g.20gb"]);
    }

    #[test]
    fn a_planned_layout_fills_the_gpu_with_the_demanded_profiles_then_the_smallest() {
        let one = |p: &str| -> BTreeMap<String, u32> { [(p.to_string(), 1)].into() };
        assert_eq!(plan_layout(Model::A100Gb80, &one("1g.10gb")).profiles(), vec!["1g.10gb"; 7]);
        let l = plan_layout(Model::A100Gb80, &one("4g.40gb"));
        assert_eq!(l.profiles(), vec!["4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb"]);
        assert_eq!(plan_layout(Model::A100Gb80, &one("7g.80gb")).profiles(), vec!["7g.80gb"]);
        assert!(plan_layout(Model::A100Gb80, &BTreeMap::new()).instances.is_empty());
    }

    #[test]
    fn a_relayout_keeps_held_instances_where_they_are() {
        let held = |profile: &str, start_slice: u32, size_slices: u32| Placed { profile: profile.into(), start_slice, size_slices };
        // A held 4g at 0: a 3g goes beside it.
        let l = relayout(Model::H200Gb141, &[held("4g.71gb", 0, 4)], &["4g.71gb", "3g.71gb"]).unwrap();
        let got: Vec<(String, u32)> = l.instances.iter().map(|i| (i.profile.clone(), i.start_slice)).collect();
        assert_eq!(got, vec![("4g.71gb".into(), 0), ("3g.71gb".into(), 4)]);
        // A held 1g at slice 5 stays; two 2g go around it.
        let l = relayout(Model::H200Gb141, &[held("1g.18gb", 5, 1)], &["1g.18gb", "2g.35gb", "2g.35gb"]).unwrap();
        assert!(l.instances.contains(&held("1g.18gb", 5, 1)), "{l:?}");
        assert_eq!(l.instances.len(), 3);
        assert!(matches!(
            relayout(Model::H200Gb141, &[held("1g.18gb", 5, 1)], &["3g.71gb"]),
            Err(MigError::DropsHeld { start_slice: 5, .. })
        ));
        let two = [held("1g.18gb", 1, 1), held("1g.18gb", 5, 1)];
        assert!(relayout(Model::H200Gb141, &two, &["1g.18gb", "1g.18gb", "3g.71gb"]).is_err(), "3g needs slices 0-3 or 4-7");
    }

    #[test]
    fn instances_per_gpu_follow_the_slice_rules() {
        let h200 = Model::H200Gb141;
        let got: Vec<(&str, u32)> = h200.profiles().iter().map(|p| (p.name, instances_per_gpu_max(h200, p.name))).collect();
        assert_eq!(
            got,
            [("1g.18gb", 7), ("1g.18gb+me", 1), ("1g.35gb", 4), ("2g.35gb", 3), ("3g.71gb", 2), ("4g.71gb", 1), ("7g.141gb", 1)]
        );
        assert_eq!(instances_per_gpu_max(h200, "1g.10gb"), 0);
    }

    fn gpu(model: &str, memory_mib: u64, mig_enabled: bool) -> proto::GpuInfo {
        proto::GpuInfo { model: model.into(), memory_mib, mig_enabled, ..Default::default() }
    }

    #[test]
    fn a_request_no_node_can_hold_says_the_hardware_limit() {
        let one = [gpu("NVIDIA H200", 143_771, true)];
        let two = [gpu("NVIDIA H200", 143_771, true), gpu("NVIDIA H200", 143_771, true)];
        let nodes = [("n1", &one[..]), ("n2", &two[..])];
        assert_eq!(
            never_fits(nodes, "3g.71gb", 7).as_deref(),
            Some("no node can ever hold 7x 3g.71gb at once: one H200 holds at most 2 (MIG slice rules), and the most any node holds is 4 (n2)")
        );
        assert_eq!(never_fits(nodes, "3g.71gb", 4), None);
        assert_eq!(never_fits(nodes, "1g.18gb", 14), None);
        assert!(never_fits(nodes, "1g.18gb", 15).is_some());
        // No MIG-mode GPU of a model that knows the profile: not refused (one may join).
        let plain = [gpu("NVIDIA H200", 143_771, false)];
        assert_eq!(never_fits([("n1", &plain[..])], "3g.71gb", 7), None);
        assert_eq!(never_fits(nodes, "1g.10gb", 50), None);
    }

    #[test]
    fn detects_models() {
        assert_eq!(Model::detect("NVIDIA H200", 143771), Some(Model::H200Gb141));
        assert_eq!(Model::detect("NVIDIA A100-SXM4-40GB", 40960), Some(Model::A100Gb40));
        assert_eq!(Model::detect("NVIDIA A100-SXM4-80GB", 81920), Some(Model::A100Gb80));
        assert_eq!(Model::detect("NVIDIA L40S", 46068), None);
    }
}
