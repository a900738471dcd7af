//! FGD's placement experiment with every GPU in MIG mode (`corral replay openb --mig`): each GPU
//! an A100 80GB, a pod asking a share m of a GPU asks the smallest profile of k/7 >= m/1000 (a
//! whole GPU is 7g.80gb), and layouts either chosen by the scheduler from the pending demand
//! (each GPU starts empty; what the leader's pass asks is applied at once, as a node's agent
//! applies it) or sized once from the whole pod list and never changed (static, as Slurm's MIG).

use std::collections::BTreeMap;

use proto::{Command, GpuInfo, GresRequest, MigInstance, NodeId};
use scheduler::mig::{self, Model};

use crate::log::Log;
use crate::trace::Pod;

/// The model every GPU is in the MIG variant.
pub const MODEL: Model = Model::A100Gb80;
/// The GRES type of those GPUs.
pub const GRES_TYPE: &str = "a100";

/// What a pod asks in the MIG variant: the smallest profile holding its share, or a whole GPU
/// (7g.80gb) per GPU asked.
pub fn request(pod: &Pod) -> Option<GresRequest> {
    if pod.gpus == 0 {
        return None;
    }
    if pod.gpus == 1 && pod.gpu_milli < 1000 {
        let k = (u64::from(pod.gpu_milli) * u64::from(mig::COMPUTE_SLICES)).div_ceil(1000).max(1) as u32;
        let profile = MODEL
            .profiles()
            .iter()
            .filter(|p| !p.name.ends_with("+me"))
            .filter(|p| p.compute_slices >= k)
            .min_by_key(|p| (p.compute_slices, p.memory_slices))?;
        return Some(GresRequest::gpus(Some(profile.name), 1));
    }
    Some(GresRequest::gpus(Some("7g.80gb"), pod.gpus))
}

/// GPU `index` of node `node` in MIG mode with `profiles` laid out (empty: no instance yet).
pub fn gpu(node: &str, index: u32, profiles: &[String]) -> GpuInfo {
    let layout = mig::placeable(MODEL, profiles).unwrap_or(mig::Layout { model: MODEL, instances: Vec::new() });
    gpu_with(node, index, &layout)
}

/// GPU `index` of node `node` in MIG mode with the instances of `layout`.
fn gpu_with(node: &str, index: u32, layout: &mig::Layout) -> GpuInfo {
    GpuInfo {
        index,
        uuid: format!("GPU-{node}-{index}"),
        model: "NVIDIA A100-SXM4-80GB".into(),
        gres_type: GRES_TYPE.into(),
        memory_mib: 81_920,
        healthy: true,
        mig_enabled: true,
        mig: instances(node, index, layout),
        ..GpuInfo::default()
    }
}

/// The instances of `layout` on one GPU.
fn instances(node: &str, index: u32, layout: &mig::Layout) -> Vec<MigInstance> {
    layout
        .instances
        .iter()
        .enumerate()
        .map(|(k, i)| MigInstance {
            uuid: format!("MIG-{node}-{index}-{}", i.start_slice),
            profile: i.profile.clone(),
            gpu_instance_id: k as u32 + 1,
            compute_instance_id: 0,
            start_slice: i.start_slice,
            size_slices: i.size_slices,
            memory_mib: MODEL.profile(&i.profile).map_or(0, |p| p.memory_mib),
        })
        .collect()
}

/// Layouts for `gpus` GPUs sized from the MIG demand of the whole `list`: GPU after GPU, each
/// given the layout that serves most of what is left of the demand (largest first, filled as
/// the scheduler fills one); the demand starts over once all of it is served.
pub fn static_layouts(list: &[Pod], gpus: usize) -> Vec<Vec<String>> {
    let mut demand: BTreeMap<String, u32> = BTreeMap::new();
    for req in list.iter().filter_map(request) {
        if let Some(t) = req.gpu_type {
            *demand.entry(t).or_default() += req.count;
        }
    }
    let mut left = demand.clone();
    let mut out = Vec::with_capacity(gpus);
    for _ in 0..gpus {
        if left.values().all(|&n| n == 0) {
            left = demand.clone();
        }
        let layout = mig::plan_layout(MODEL, &left).profiles();
        for p in &layout {
            if let Some(n) = left.get_mut(p) {
                *n = n.saturating_sub(1);
            }
        }
        out.push(layout);
    }
    out
}

/// Applies the layouts a pass asked for, as the nodes' agents do: each GPU re-partitioned
/// around the instances jobs hold ([`mig::relayout`]) and its node's new inventory reported
/// through the log. How many were applied.
pub(crate) fn apply(log: &mut Log, layouts: &[(NodeId, u32, Vec<String>)], now_ms: u64) -> usize {
    let mut applied = 0;
    for (node, index, profiles) in layouts {
        let Some(record) = log.state.nodes.get(node) else { continue };
        let held: Vec<u32> = log
            .state
            .parts_on(*node)
            .flat_map(|p| p.alloc.gpus.iter())
            .filter_map(|&s| match proto::slot::decode_slot(s) {
                proto::slot::Slot::Mig { gpu, start_slice } if gpu == *index => Some(start_slice),
                _ => None,
            })
            .collect();
        let mut inventory = (*record.inventory).clone();
        let name = record.name.clone();
        let Some(g) = inventory.gpus.iter_mut().find(|g| g.index == *index) else { continue };
        let kept: Vec<mig::Placed> = g
            .mig
            .iter()
            .filter(|m| held.contains(&m.start_slice))
            .map(|m| mig::Placed { profile: m.profile.clone(), start_slice: m.start_slice, size_slices: m.size_slices })
            .collect();
        let Ok(layout) = mig::relayout(MODEL, &kept, profiles) else { continue };
        *g = gpu_with(&name, *index, &layout);
        let cmd = Command::UpdateInventory { node: *node, inventory, reason: format!("mig layout {}", profiles.join(",")), now_ms };
        if log.apply(&cmd) == proto::CommandResult::Ok {
            applied += 1;
        }
    }
    applied
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(gpus: u32, gpu_milli: u32) -> Pod {
        Pod { name: "p".into(), cpus_milli: 1000, mem_mib: 1024, gpus, gpu_milli, models: Vec::new() }
    }

    #[test]
    fn a_share_asks_the_smallest_profile_that_holds_it() {
        let name = |p: &Pod| request(p).and_then(|g| g.gpu_type).unwrap_or_default();
        assert_eq!(name(&pod(1, 100)), "1g.10gb");
        assert_eq!(name(&pod(1, 143)), "2g.20gb", "1/7 is 142.9 thousandths");
        assert_eq!(name(&pod(1, 460)), "4g.40gb");
        assert_eq!(name(&pod(1, 600)), "7g.80gb", "no 5g or 6g profile");
        assert_eq!(request(&pod(4, 1000)), Some(GresRequest::gpus(Some("7g.80gb"), 4)));
        assert_eq!(request(&pod(0, 0)), None);
    }

    #[test]
    fn static_layouts_follow_the_demand_and_start_over() {
        let list = [pod(1, 100), pod(1, 100), pod(1, 400), pod(2, 1000)];
        let layouts = static_layouts(&list, 4);
        assert_eq!(layouts[0], vec!["7g.80gb".to_string()]);
        assert_eq!(layouts[1], vec!["7g.80gb".to_string()]);
        // 3g.40gb and two 1g, filled with more 1g (a second 3g does not fit beside them).
        assert_eq!(layouts[2], ["1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "3g.40gb"].map(String::from).to_vec());
        assert_eq!(layouts[3], vec!["7g.80gb".to_string()], "the demand starts over");
    }
}
