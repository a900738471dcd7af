//! MIG profiles and layouts: the profile table of a GPU (from `nvidia-smi mig -lgip` and
//! `-lgipp`, or built in for simulated models), placing a requested layout on the memory
//! slices, and the one flow every probe uses to change a GPU's layout: refuse unless MIG mode
//! is on and the GPU idle, destroy the old instances, create the new ones, rediscover.

use std::collections::BTreeMap;
use std::sync::Mutex;

use proto::{GpuInfo, MigInstance};
use tracing::info;

use super::{GpuError, GpuInventory};

/// One GPU instance profile as `nvidia-smi mig -lgip` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigProfile {
    /// e.g. `1g.18gb`, `1g.18gb+me`.
    pub name: String,
    /// NVML's GPU instance profile id (`-cgi` takes it).
    pub id: u32,
    pub instances_max: u32,
    pub memory_mib: u64,
    pub sm_count: u32,
    /// Memory slices one instance occupies (`:4` in `-lgipp`).
    pub size_slices: u32,
    /// First slices an instance may start at (`{0,4}` in `-lgipp`).
    pub placements: Vec<u32>,
}

/// Memory slices of a MIG-capable GPU (A100, H100, H200).
pub const MIG_SLICES: u32 = scheduler::mig::MEMORY_SLICES;

/// NVML's GPU instance profile id and SM count of each H200 profile (what `-lgip` adds to the
/// scheduler's table).
const H200_NVML: [(&str, u32, u32); 7] = [
    ("1g.18gb", 19, 16),
    ("1g.18gb+me", 20, 16),
    ("1g.35gb", 15, 26),
    ("2g.35gb", 14, 32),
    ("3g.71gb", 9, 60),
    ("4g.71gb", 5, 64),
    ("7g.141gb", 0, 132),
];

/// The H200's table as `nvidia-smi mig -lgip`/`-lgipp` print it on an H200 (141 GB): the
/// scheduler's table (`scheduler::mig`, one source of truth for names, sizes, starts and
/// counts) with NVML's ids and SM counts (`node/tests/gpu_fixtures.rs` checks it against a real
/// H200's output).
pub fn h200_profiles() -> Vec<MigProfile> {
    scheduler::mig::Model::H200Gb141
        .profiles()
        .iter()
        .filter_map(|p| {
            let (_, id, sm_count) = H200_NVML.iter().find(|(name, _, _)| *name == p.name)?;
            Some(MigProfile {
                name: p.name.to_string(),
                id: *id,
                instances_max: p.instances_max,
                memory_mib: p.memory_mib,
                sm_count: *sm_count,
                size_slices: p.memory_slices,
                placements: p.starts.to_vec(),
            })
        })
        .collect()
}

/// The built-in table for a GRES type, for simulated GPUs.
pub fn builtin_profiles(gres_type: &str) -> Option<Vec<MigProfile>> {
    match gres_type {
        "h200" => Some(h200_profiles()),
        _ => None,
    }
}

fn parse_err(line: usize, what: &str) -> anyhow::Error {
    anyhow::anyhow!("parse mig profiles, line {line}: {what}")
}

/// Parses `nvidia-smi mig -lgip` and `nvidia-smi mig -lgipp` into each GPU's profiles, in the
/// order `-lgip` lists them.
pub fn parse_mig_profiles(lgip: &str, lgipp: &str) -> anyhow::Result<BTreeMap<u32, Vec<MigProfile>>> {
    let mut out: BTreeMap<u32, Vec<MigProfile>> = BTreeMap::new();
    for (n, line) in lgip.lines().enumerate() {
        let cells: Vec<&str> = line.trim().trim_matches('|').split_whitespace().collect();
        // |   0  MIG 1g.18gb   19   7/7   16.00   No   16   1   0   |
        if cells.len() < 9 || cells[1] != "MIG" {
            continue;
        }
        let gpu: u32 = cells[0].parse().map_err(|_| parse_err(n + 1, "gpu index"))?;
        let id: u32 = cells[3].parse().map_err(|_| parse_err(n + 1, "profile id"))?;
        let instances_max: u32 =
            cells[4].split_once('/').and_then(|(_, total)| total.parse().ok()).ok_or_else(|| parse_err(n + 1, "instances free/total"))?;
        let memory_gib: f64 = cells[5].parse().map_err(|_| parse_err(n + 1, "memory GiB"))?;
        let sm_count: u32 = cells[7].parse().map_err(|_| parse_err(n + 1, "SM count"))?;
        out.entry(gpu).or_default().push(MigProfile {
            name: cells[2].to_string(),
            id,
            instances_max,
            memory_mib: (memory_gib * 1024.0).round() as u64,
            sm_count,
            size_slices: 0,
            placements: Vec::new(),
        });
    }
    for (n, line) in lgipp.lines().enumerate() {
        // GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
        let Some(rest) = line.trim().strip_prefix("GPU") else { continue };
        let (gpu_part, rest) = rest.split_once("Profile ID").ok_or_else(|| parse_err(n + 1, "no 'Profile ID'"))?;
        let (id_part, rest) = rest.split_once(':').ok_or_else(|| parse_err(n + 1, "no ':' after placements"))?;
        let gpu: u32 = gpu_part.trim().parse().map_err(|_| parse_err(n + 1, "gpu index"))?;
        let id: u32 = id_part.split_whitespace().next().and_then(|t| t.parse().ok()).ok_or_else(|| parse_err(n + 1, "profile id"))?;
        let (set, size) = rest.trim().rsplit_once(':').ok_or_else(|| parse_err(n + 1, "no ':SIZE'"))?;
        let size: u32 = size.trim().parse().map_err(|_| parse_err(n + 1, "placement size"))?;
        let starts: Vec<u32> = set
            .trim()
            .trim_start_matches('{')
            .trim_end_matches('}')
            .split(',')
            .map(|s| s.trim().parse().map_err(|_| parse_err(n + 1, "placement start")))
            .collect::<anyhow::Result<_>>()?;
        let profile = out
            .get_mut(&gpu)
            .and_then(|ps| ps.iter_mut().find(|p| p.id == id))
            .ok_or_else(|| parse_err(n + 1, &format!("placements for gpu {gpu} profile {id} not in -lgip")))?;
        profile.size_slices = size;
        profile.placements = starts;
    }
    Ok(out)
}

/// One instance of a planned layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedInstance {
    pub profile: MigProfile,
    pub start_slice: u32,
}

/// Places `layout` on an empty GPU with the table this GPU reported: [`plan_layout_around`]
/// with nothing kept.
pub fn plan_layout(gpu: u32, table: &[MigProfile], layout: &[String]) -> Result<Vec<PlannedInstance>, GpuError> {
    plan_layout_around(gpu, table, &[], layout)
}

/// Places `layout` on GPU `gpu` whose instances `kept` stay where they are, with the table this
/// GPU reported: each kept instance must be in `layout`, the rest is placed around them by the
/// scheduler's search (`scheduler::mig::arrange`), so a layout the leader found placeable is
/// placed where the leader expects, not refused by a different rule here. Returns the new
/// instances in slice order.
pub fn plan_layout_around(
    gpu: u32,
    table: &[MigProfile],
    kept: &[MigInstance],
    layout: &[String],
) -> Result<Vec<PlannedInstance>, GpuError> {
    let wanted: Vec<&MigProfile> = layout
        .iter()
        .map(|name| table.iter().find(|p| p.name == *name).ok_or_else(|| GpuError::UnknownProfile { gpu, profile: name.clone() }))
        .collect::<Result<_, _>>()?;
    let does_not_fit = || GpuError::LayoutDoesNotFit { gpu, layout: layout.to_vec() };
    for p in &wanted {
        if wanted.iter().filter(|q| q.id == p.id).count() as u32 > p.instances_max {
            return Err(does_not_fit());
        }
    }
    let mut rest = wanted;
    let mut occupied = 0u8;
    for k in kept {
        let Some(i) = rest.iter().position(|p| p.name == k.profile) else {
            return Err(GpuError::DropsHeld { gpu, layout: layout.to_vec(), profile: k.profile.clone(), start_slice: k.start_slice });
        };
        rest.remove(i);
        let (start, size) = (k.start_slice.min(MIG_SLICES), k.size_slices.min(MIG_SLICES - k.start_slice.min(MIG_SLICES)));
        occupied |= ((((1u16 << size) - 1) << start) & 0xff) as u8;
    }
    let shapes: Vec<scheduler::mig::Shape<'_>> =
        rest.iter().map(|p| scheduler::mig::Shape { size_slices: p.size_slices, starts: &p.placements }).collect();
    let starts = scheduler::mig::arrange(&shapes, occupied).ok_or_else(does_not_fit)?;
    let mut planned: Vec<PlannedInstance> =
        rest.iter().zip(starts).map(|(p, start_slice)| PlannedInstance { profile: (*p).clone(), start_slice }).collect();
    planned.sort_by_key(|q| q.start_slice);
    Ok(planned)
}

/// What a probe does to a GPU's MIG instances. The checks around it are [`apply_layout`]'s.
pub trait MigBackend {
    fn discover(&self) -> anyhow::Result<GpuInventory>;
    /// The profile table of GPU `gpu`.
    fn profiles(&self, gpu: &GpuInfo) -> Result<Vec<MigProfile>, GpuError>;
    /// Why GPU `gpu` is not idle but for its instances `kept` (processes on it or on its other
    /// instances), or `None`.
    fn busy_reason(&self, gpu: &GpuInfo, kept: &[MigInstance]) -> anyhow::Result<Option<String>>;
    /// Destroys the compute and GPU instances `instances` of `gpu`.
    fn destroy(&self, gpu: &GpuInfo, instances: &[MigInstance]) -> anyhow::Result<()>;
    /// Creates each planned GPU instance with one compute instance spanning it.
    fn create(&self, gpu: &GpuInfo, planned: &[PlannedInstance]) -> anyhow::Result<()>;
}

/// One layout change at a time on this node.
static LAYOUT_LOCK: Mutex<()> = Mutex::new(());

/// Changes GPU `gpu_index` to `layout` through `backend`, keeping the instances that start at
/// the slices `held` (and idle ones `layout` still has, where it can), and returns the
/// inventory afterwards.
pub fn apply_layout(backend: &dyn MigBackend, gpu_index: u32, layout: &[String], held: &[u32]) -> Result<GpuInventory, GpuError> {
    let _one_at_a_time = LAYOUT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let before = backend.discover()?;
    let gpu = before.gpus.iter().find(|g| g.index == gpu_index).ok_or(GpuError::NoSuchGpu(gpu_index))?;
    if !gpu.mig_enabled {
        return Err(GpuError::MigModeOff { gpu: gpu_index });
    }
    let table = backend.profiles(gpu)?;
    let (held, idle): (Vec<MigInstance>, Vec<MigInstance>) = gpu.mig.iter().cloned().partition(|m| held.contains(&m.start_slice));
    // Idle instances `layout` still has stay too, each where the rest can still be placed
    // around it: a job the leader placed on one may not have reached this node yet, and fewer
    // instances change UUID. The held ones alone are what the leader planned around.
    let mut planned = plan_layout_around(gpu_index, &table, &held, layout)?;
    let mut kept = held;
    for m in idle.iter().filter(|m| layout.contains(&m.profile)) {
        let mut with = kept.clone();
        with.push(m.clone());
        if let Ok(p) = plan_layout_around(gpu_index, &table, &with, layout) {
            (kept, planned) = (with, p);
        }
    }
    let gone: Vec<MigInstance> = gpu.mig.iter().filter(|m| !kept.iter().any(|k| k.start_slice == m.start_slice)).cloned().collect();
    if let Some(reason) = backend.busy_reason(gpu, &kept)? {
        return Err(GpuError::Busy { gpu: gpu_index, reason });
    }
    let old: Vec<&str> = gpu.mig.iter().map(|m| m.profile.as_str()).collect();
    let kept_names: Vec<&str> = kept.iter().map(|m| m.profile.as_str()).collect();
    info!(gpu = gpu_index, old = ?old, new = ?layout, kept = ?kept_names, "changing mig layout");
    backend.destroy(gpu, &gone)?;
    backend.create(gpu, &planned)?;
    Ok(backend.discover()?)
}

/// The node-wide device ordinals Slurm gives a job's GPUs (`SLURM_JOB_GPUS`,
/// `GPU_DEVICE_ORDINAL`): the node's GPU devices in order, a whole GPU one device and each MIG
/// instance of a MIG-mode GPU one device (by GPU index, then start slice), as Slurm's NVML
/// autodetection numbers them; shards are their GPU's. `slots` are the scheduler's allocation slots; `None` when one
/// names a GPU or instance the node does not have.
pub fn device_ordinals(gpus: &[GpuInfo], slots: &[u32]) -> Option<Vec<u32>> {
    let mut sorted: Vec<&GpuInfo> = gpus.iter().collect();
    sorted.sort_by_key(|g| g.index);
    let mut ordinal_of: BTreeMap<scheduler::Slot, u32> = BTreeMap::new();
    let mut next = 0u32;
    for g in sorted {
        if g.mig_enabled {
            let mut instances: Vec<u32> = g.mig.iter().map(|m| m.start_slice).collect();
            instances.sort_unstable();
            for start_slice in instances {
                ordinal_of.insert(scheduler::Slot::Mig { gpu: g.index, start_slice }, next);
                next += 1;
            }
        } else {
            ordinal_of.insert(scheduler::Slot::Gpu(g.index), next);
            next += 1;
        }
    }
    let whole = |s: scheduler::Slot| match s {
        scheduler::Slot::Shard { gpu, .. } => scheduler::Slot::Gpu(gpu),
        other => other,
    };
    slots.iter().map(|s| ordinal_of.get(&whole(scheduler::decode_slot(*s))).copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plans_biggest_first_on_allowed_starts() {
        let t = h200_profiles();
        let plan = plan_layout(0, &t, &names(&["1g.18gb", "3g.71gb", "2g.35gb"])).expect("fits");
        let got: Vec<(&str, u32)> = plan.iter().map(|p| (p.profile.name.as_str(), p.start_slice)).collect();
        assert_eq!(got, vec![("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)]);
        let seven = plan_layout(0, &t, &names(&["1g.18gb"; 7])).expect("seven 1g");
        assert_eq!(seven.iter().map(|p| p.start_slice).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5, 6]);
        assert!(matches!(plan_layout(0, &t, &names(&["1g.18gb"; 8])), Err(GpuError::LayoutDoesNotFit { .. })));
        assert!(matches!(plan_layout(0, &t, &names(&["7g.141gb", "1g.18gb"])), Err(GpuError::LayoutDoesNotFit { .. })));
        assert!(matches!(plan_layout(0, &t, &names(&["4g.71gb", "4g.71gb"])), Err(GpuError::LayoutDoesNotFit { .. })));
        assert!(matches!(plan_layout(0, &t, &names(&["9g.1tb"])), Err(GpuError::UnknownProfile { .. })));
        assert!(plan_layout(0, &t, &[]).expect("empty layout").is_empty());
    }

    /// A greedy rule here (biggest first, each at its first free start) placed `3g.71gb` at 0 and
    /// then found no room for `4g.71gb`, which only starts at 0: the leader, whose search found
    /// the layout placeable, had it refused by the node.
    #[test]
    fn a_layout_the_scheduler_finds_placeable_is_placed_in_any_order() {
        let t = h200_profiles();
        for layout in [["3g.71gb", "4g.71gb"], ["4g.71gb", "3g.71gb"]] {
            assert!(scheduler::mig::placeable(scheduler::mig::Model::H200Gb141, &layout).is_ok());
            let plan = plan_layout(0, &t, &names(&layout)).expect("fits");
            let got: Vec<(&str, u32)> = plan.iter().map(|p| (p.profile.name.as_str(), p.start_slice)).collect();
            assert_eq!(got, vec![("4g.71gb", 0), ("3g.71gb", 4)]);
        }
    }

    #[test]
    fn device_ordinals_count_each_mig_instance_as_a_device() {
        let mig = |start_slice| proto::MigInstance { start_slice, ..Default::default() };
        let gpus = [
            GpuInfo { index: 0, ..Default::default() },
            GpuInfo { index: 1, mig_enabled: true, mig: vec![mig(4), mig(0)], ..Default::default() },
            GpuInfo { index: 2, ..Default::default() },
        ];
        let slots = [scheduler::mig_slot(1, 4), scheduler::mig_slot(1, 0), 2, 0];
        assert_eq!(device_ordinals(&gpus, &slots), Some(vec![2, 1, 3, 0]));
        assert_eq!(device_ordinals(&gpus, &[1]), None, "GPU 1 is in MIG mode: its whole GPU is no device");
        assert_eq!(device_ordinals(&gpus, &[scheduler::mig_slot(1, 2)]), None);
    }
}
