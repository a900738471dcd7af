//! The `nvidia-smi` parsers on real output of an H200 machine (`fixtures/h200`, recorded on one): the
//! inventory they give is what the NVML probe reports there.

use std::path::PathBuf;

use corral_node::gpu::mig::{h200_profiles, parse_mig_profiles};
use corral_node::gpu::smi_xml::{inventory_from_smi, parse_smi_xml};
use corral_node::gpu::topo::parse_topo_matrix;
use proto::Link;

fn fixture(name: &str) -> String {
    let dir = std::env::var_os("CORRAL_GPU_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200"));
    let path = dir.join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read fixture {}: {e} (set CORRAL_GPU_FIXTURES)", path.display()))
}

#[test]
fn smi_xml_gives_the_h200() {
    let gpus = parse_smi_xml(&fixture("nvidia-smi-q.xml")).expect("parse xml");
    assert_eq!(gpus.len(), 1);
    let g = &gpus[0];
    assert_eq!(g.info.index, 0);
    assert_eq!(g.info.uuid, "GPU-d3d38aac-4428-df04-30cf-9e39f444427d");
    assert_eq!(g.info.model, "NVIDIA H200");
    assert_eq!(g.info.gres_type, "h200");
    assert_eq!(g.info.pci_bus_id, "00000000:00:06.0");
    assert_eq!(g.info.memory_mib, 143_771);
    assert!(!g.info.mig_enabled);
    assert!(g.info.mig.is_empty());
    assert_eq!(g.info.compute_capability.as_deref(), Some("9.0"));
    assert_eq!(g.memory_used_mib, Some(0));
    assert_eq!(g.memory_free_mib, Some(143_156));
    assert_eq!(g.utilization_pct, Some(0));
    assert_eq!(g.temperature_c, Some(39));
    assert_eq!(g.power_mw, Some(81_800));
    assert_eq!(g.driver_version.as_deref(), Some("580.159.04"));
}

#[test]
fn topo_matrix_of_the_h200() {
    let m = parse_topo_matrix(&fixture("nvidia-smi-topo-m.txt")).expect("parse topo");
    assert_eq!(m.gpu_links, vec![vec![Link::X]]);
    assert_eq!(m.gpu_cpus, vec![(0..16).collect::<Vec<u32>>()]);
    assert_eq!(m.gpu_numa, vec![Some(0)]);
    assert!(m.nics.is_empty());
}

#[test]
fn inventory_from_both_files() {
    let inv = inventory_from_smi(&fixture("nvidia-smi-q.xml"), &fixture("nvidia-smi-topo-m.txt")).expect("inventory");
    assert_eq!(inv.gpus.len(), 1);
    assert_eq!(inv.gpus[0].numa_node, Some(0));
    assert!(inv.gpus[0].healthy);
    assert_eq!(inv.topology.gpu_links, vec![vec![Link::X]]);
    assert_eq!(inv.topology.numa_cpus.get(&0), Some(&(0..16).collect::<Vec<u32>>()));
}

#[test]
fn mig_profile_table_matches_the_builtin_one() {
    let text = fixture("nvidia-smi-mig-profiles.txt");
    // The fixture holds `-lgip` then `-lgipp`; each parser skips the other's lines.
    let table = parse_mig_profiles(&text, &text).expect("parse profiles");
    assert_eq!(table.len(), 1);
    assert_eq!(table[&0], h200_profiles());
    // NVML's own numbers (nvml-gpu-instance-profiles.txt) agree on ids, instances and memory.
    for line in fixture("nvml-gpu-instance-profiles.txt").lines().filter(|l| l.contains(" mem_mb ")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let field = |k: &str| -> u64 { w[w.iter().position(|x| *x == k).expect(k) + 1].parse().expect("number") };
        let p = table[&0].iter().find(|p| u64::from(p.id) == field("id")).expect("profile in table");
        assert_eq!(p.memory_mib, field("mem_mb"), "{}", p.name);
        assert_eq!(u64::from(p.instances_max), field("instances"), "{}", p.name);
        assert_eq!(u64::from(p.sm_count), field("sm"), "{}", p.name);
    }
}
