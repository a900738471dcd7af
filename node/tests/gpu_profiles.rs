//! Simulated hardware profiles: exact link matrices, NUMA and NICs, and MIG layout changes
//! through the same flow the NVML probe uses.

use corral_node::gpu::{probe_from_config, GpuError, SimulatedProbe};
use corral_node::probe::GpuProbe;
use proto::Link;

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn sxm_h100x8_is_a_dgx() {
    let inv = probe_from_config("sxm-h100x8", "n1").discover().expect("discover");
    assert_eq!(inv.gpus.len(), 8);
    for (i, row) in inv.topology.gpu_links.iter().enumerate() {
        let want: Vec<Link> = (0..8).map(|j| if i == j { Link::X } else { Link::NvLink(18) }).collect();
        assert_eq!(row, &want, "row {i}");
    }
    let numa: Vec<Option<u32>> = inv.gpus.iter().map(|g| g.numa_node).collect();
    assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1].map(Some).to_vec());
    assert_eq!(inv.gpus[1].pci_bus_id, "00000000:2A:00.0");
    assert_eq!(inv.gpus[0].compute_capability.as_deref(), Some("9.0"));
    let nics: Vec<(String, bool, Option<u32>)> = inv.topology.nics.iter().map(|n| (n.name.clone(), n.infiniband, n.numa_node)).collect();
    let want: Vec<(String, bool, Option<u32>)> = (0..8).map(|i| (format!("mlx5_{i}"), true, Some(i / 4))).collect();
    assert_eq!(nics, want);
    assert_eq!(inv.topology.numa_cpus.len(), 2);
    assert_eq!(inv.topology.numa_cpus[&0].len(), 112);
    assert!(inv.topology.numa_cpus[&1].contains(&56) && inv.topology.numa_cpus[&1].contains(&223));
    // `h100:8` is the same machine.
    assert_eq!(probe_from_config("h100:8", "n1").discover().expect("h100:8"), inv);
}

#[test]
fn pcie_l40sx8_has_switch_pairs() {
    let inv = probe_from_config("pcie-l40sx8", "n1").discover().expect("discover");
    use Link::{Pix as I, Pxb as B, Sys as S, X};
    let want = vec![
        vec![X, I, B, B, S, S, S, S],
        vec![I, X, B, B, S, S, S, S],
        vec![B, B, X, I, S, S, S, S],
        vec![B, B, I, X, S, S, S, S],
        vec![S, S, S, S, X, I, B, B],
        vec![S, S, S, S, I, X, B, B],
        vec![S, S, S, S, B, B, X, I],
        vec![S, S, S, S, B, B, I, X],
    ];
    assert_eq!(inv.topology.gpu_links, want);
    assert_eq!(inv.gpus[0].gres_type, "l40s");
    assert_eq!(inv.gpus[0].compute_capability.as_deref(), Some("8.9"));
    assert_eq!(inv.topology.nics.len(), 2);
    assert_eq!(probe_from_config("l40s:8", "n1").discover().expect("l40s:8"), inv);
}

#[test]
fn h200_mig_starts_with_a_layout_and_changes_it() {
    let probe = SimulatedProbe::new("h200-mig", "n1").expect("profile");
    let inv = probe.discover().expect("discover");
    let g = &inv.gpus[0];
    assert!(g.mig_enabled);
    assert_eq!(g.pci_bus_id, "00000000:00:06.0");
    assert_eq!(g.memory_mib, 143_771);
    let layout: Vec<(&str, u32, u32, u64)> =
        g.mig.iter().map(|m| (m.profile.as_str(), m.start_slice, m.size_slices, m.memory_mib)).collect();
    assert_eq!(layout, vec![("3g.71gb", 0, 4, 71_424), ("2g.35gb", 4, 2, 33_280), ("1g.18gb", 6, 1, 16_384)]);
    assert!(g.mig.iter().all(|m| m.uuid.starts_with("MIG-") && m.uuid.len() == 40));

    let after = probe.apply_layout(0, &names(&["1g.18gb"; 7]), &[]).expect("seven 1g");
    assert_eq!(after.gpus[0].mig.len(), 7);
    assert!(after.gpus[0].mig.iter().all(|m| m.profile == "1g.18gb"));
    // The idle 1g at slice 6 is still in the layout: it stays, the six others are new.
    let kept: Vec<u32> = after.gpus[0].mig.iter().filter(|m| g.mig.iter().any(|old| old.uuid == m.uuid)).map(|m| m.start_slice).collect();
    assert_eq!(kept, vec![6], "new instances, new uuids, but for the one kept");
    assert_eq!(probe.discover().expect("again"), after);

    probe.set_busy(0, true);
    assert!(matches!(probe.apply_layout(0, &names(&["7g.141gb"]), &[]), Err(GpuError::Busy { gpu: 0, .. })));
    probe.set_busy(0, false);
    assert!(matches!(probe.apply_layout(0, &names(&["7g.141gb", "1g.18gb"]), &[]), Err(GpuError::LayoutDoesNotFit { .. })));
    assert!(matches!(probe.apply_layout(0, &names(&["2g.20gb"]), &[]), Err(GpuError::UnknownProfile { .. })));
    assert!(matches!(probe.apply_layout(3, &names(&["1g.18gb"]), &[]), Err(GpuError::NoSuchGpu(3))));
    assert_eq!(probe.discover().expect("unchanged by refusals"), after);
    let full = probe.apply_layout(0, &names(&["7g.141gb"]), &[]).expect("whole gpu");
    assert_eq!(full.gpus[0].mig.len(), 1);
    assert_eq!(full.gpus[0].mig[0].gpu_instance_id, 0);
}

/// A GPU re-carved while a job holds one of its instances: that instance keeps its place and
/// uuid, the others are laid out around it; a layout without it is refused, the GPU unchanged.
#[test]
fn a_held_instance_stays_while_the_rest_is_recarved() {
    let probe = SimulatedProbe::new("h200-mig", "n1").expect("profile");
    let before = probe.discover().expect("discover").gpus[0].mig.clone();
    // 3g.71gb at 0 (held), 2g.35gb at 4 and 1g.18gb at 6 (idle): the idle two become one 3g.
    let after = probe.apply_layout(0, &names(&["3g.71gb", "3g.71gb"]), &[0]).expect("around the held 3g");
    let got: Vec<(&str, u32)> = after.gpus[0].mig.iter().map(|m| (m.profile.as_str(), m.start_slice)).collect();
    assert_eq!(got, vec![("3g.71gb", 0), ("3g.71gb", 4)]);
    assert_eq!(after.gpus[0].mig[0].uuid, before[0].uuid, "the held instance is the same instance");
    assert_ne!(after.gpus[0].mig[1].gpu_instance_id, after.gpus[0].mig[0].gpu_instance_id);
    let refused = probe.apply_layout(0, &names(&["1g.18gb"; 7]), &[0]);
    assert!(matches!(refused, Err(GpuError::DropsHeld { gpu: 0, start_slice: 0, .. })), "{refused:?}");
    let refused = probe.apply_layout(0, &names(&["3g.71gb", "4g.71gb"]), &[0]);
    assert!(matches!(refused, Err(GpuError::LayoutDoesNotFit { .. })), "4g starts only at 0, where the held 3g is: {refused:?}");
    assert_eq!(probe.discover().expect("unchanged by refusals"), after);

    // Nothing held: the idle 3g at 4 is kept where the layout still has a 3g (a job placed on
    // it may be on its way), the one at 0 gives way to the 4g that can only start there.
    let mixed = probe.apply_layout(0, &names(&["4g.71gb", "3g.71gb"]), &[]).expect("4g beside the kept 3g");
    let got: Vec<(&str, u32)> = mixed.gpus[0].mig.iter().map(|m| (m.profile.as_str(), m.start_slice)).collect();
    assert_eq!(got, vec![("4g.71gb", 0), ("3g.71gb", 4)]);
    assert_eq!(mixed.gpus[0].mig[1].uuid, after.gpus[0].mig[1].uuid);
}

#[test]
fn mig_mode_off_is_never_changed() {
    let probe = probe_from_config("h200:2", "n1");
    assert!(matches!(probe.apply_layout(0, &names(&["1g.18gb"]), &[]), Err(GpuError::MigModeOff { gpu: 0 })));
    assert!(!probe.discover().expect("discover").gpus[0].mig_enabled);
}
