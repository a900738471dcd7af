//! `nvidia-smi -q -x`: each GPU's identity, memory, MIG mode and MIG devices, and (with the
//! text of `nvidia-smi topo -m`) the same `GpuInventory` the NVML probe gives on that machine.
//! For hosts where only the tool's output is at hand (support bundles, tests).

use std::collections::BTreeMap;

use anyhow::Context;
use proto::{GpuInfo, MigInstance, Topology};
use roxmltree::{Document, Node, ParsingOptions};

use super::topo::{parse_topo_matrix, TopoMatrix};
use super::{compute_capability_for, gres_type_for_model, GpuInventory};

/// What one `<gpu>` element holds beyond `GpuInfo`: sampled values for metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SmiGpu {
    pub info: GpuInfo,
    pub memory_used_mib: Option<u64>,
    pub memory_free_mib: Option<u64>,
    pub utilization_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_mw: Option<u64>,
    pub driver_version: Option<String>,
}

fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children().find(|c| c.has_tag_name(name))
}

fn text_at(node: Node<'_, '_>, path: &[&str]) -> Option<String> {
    let mut n = node;
    for p in path {
        n = child(n, p)?;
    }
    let t = n.text()?.trim();
    (!t.is_empty() && t != "N/A").then(|| t.to_string())
}

/// `143771 MiB` → 143771; `39 C` → 39; `0 %` → 0.
fn leading_number(text: &str) -> Option<f64> {
    text.split_whitespace().next()?.parse().ok()
}

fn number_at(node: Node<'_, '_>, path: &[&str]) -> Option<f64> {
    leading_number(&text_at(node, path)?)
}

/// Parses the XML of `nvidia-smi -q -x`.
pub fn parse_smi_xml(xml: &str) -> anyhow::Result<Vec<SmiGpu>> {
    let options = ParsingOptions { allow_dtd: true, ..ParsingOptions::default() };
    let doc = Document::parse_with_options(xml, options).context("parse nvidia-smi xml")?;
    let root = doc.root_element();
    anyhow::ensure!(
        root.has_tag_name("nvidia_smi_log"),
        "parse nvidia-smi xml: root is <{}>, not <nvidia_smi_log>",
        root.tag_name().name()
    );
    let driver_version = text_at(root, &["driver_version"]);
    let mut gpus = Vec::new();
    for (position, gpu) in root.children().filter(|c| c.has_tag_name("gpu")).enumerate() {
        let model = text_at(gpu, &["product_name"]).unwrap_or_default();
        let gres_type = gres_type_for_model(&model);
        let index = number_at(gpu, &["minor_number"]).map_or(position as u32, |n| n as u32);
        let uuid = text_at(gpu, &["uuid"]).with_context(|| format!("read uuid of gpu {position}"))?;
        let pci_bus_id = text_at(gpu, &["pci", "pci_bus_id"]).or_else(|| gpu.attribute("id").map(str::to_string)).unwrap_or_default();
        let memory_mib = number_at(gpu, &["fb_memory_usage", "total"]).map_or(0, |n| n as u64);
        let mig_enabled = text_at(gpu, &["mig_mode", "current_mig"]).is_some_and(|m| m.eq_ignore_ascii_case("enabled"));
        let compute_capability = text_at(gpu, &["compute_cap"]).or_else(|| compute_capability_for(&gres_type).map(str::to_string));
        let mig = match child(gpu, "mig_devices") {
            Some(devices) => devices.children().filter(|c| c.has_tag_name("mig_device")).map(parse_mig_device).collect(),
            None => Vec::new(),
        };
        gpus.push(SmiGpu {
            info: GpuInfo {
                index,
                uuid,
                model,
                gres_type,
                memory_mib,
                pci_bus_id,
                numa_node: None,
                compute_capability,
                mig_enabled,
                mig,
                healthy: true,
                health_reason: None,
                shards: 0,
            },
            memory_used_mib: number_at(gpu, &["fb_memory_usage", "used"]).map(|n| n as u64),
            memory_free_mib: number_at(gpu, &["fb_memory_usage", "free"]).map(|n| n as u64),
            utilization_pct: number_at(gpu, &["utilization", "gpu_util"]).map(|n| n as u32),
            temperature_c: number_at(gpu, &["temperature", "gpu_temp"]).map(|n| n as u32),
            power_mw: number_at(gpu, &["gpu_power_readings", "instant_power_draw"])
                .or_else(|| number_at(gpu, &["gpu_power_readings", "power_draw"]))
                .or_else(|| number_at(gpu, &["power_readings", "power_draw"]))
                .map(|w| (w * 1000.0).round() as u64),
            driver_version: driver_version.clone(),
        });
    }
    gpus.sort_by_key(|g| g.info.index);
    Ok(gpus)
}

/// One `<mig_device>`. The XML names neither profile nor UUID nor placement: those stay empty
/// (NVML fills them in); ids and memory are read.
fn parse_mig_device(dev: Node<'_, '_>) -> MigInstance {
    MigInstance {
        uuid: text_at(dev, &["uuid"]).unwrap_or_default(),
        profile: text_at(dev, &["profile"]).unwrap_or_default(),
        gpu_instance_id: number_at(dev, &["gpu_instance_id"]).map_or(0, |n| n as u32),
        compute_instance_id: number_at(dev, &["compute_instance_id"]).map_or(0, |n| n as u32),
        start_slice: 0,
        size_slices: 0,
        memory_mib: number_at(dev, &["fb_memory_usage", "total"]).map_or(0, |n| n as u64),
    }
}

/// The inventory from `nvidia-smi -q -x` and `nvidia-smi topo -m`: GPUs with their NUMA node,
/// the link matrix and NUMA CPUs. NICs come from sysfs (`nics::discover_nics`), not from here.
pub fn inventory_from_smi(xml: &str, topo_text: &str) -> anyhow::Result<GpuInventory> {
    let mut gpus: Vec<GpuInfo> = parse_smi_xml(xml)?.into_iter().map(|g| g.info).collect();
    let topo: TopoMatrix = parse_topo_matrix(topo_text).context("parse nvidia-smi topo -m")?;
    anyhow::ensure!(topo.gpu_links.len() == gpus.len(), "topo -m names {} gpus but -q -x names {}", topo.gpu_links.len(), gpus.len());
    for g in &mut gpus {
        g.numa_node = topo.gpu_numa.get(g.index as usize).copied().flatten();
    }
    let numa_cpus: BTreeMap<u32, Vec<u32>> = topo.numa_cpus();
    // `minor_number` is the index, and /dev/nvidiaN's minor.
    let device_files = gpus.iter().map(|g: &GpuInfo| (g.index, std::path::PathBuf::from(format!("/dev/nvidia{}", g.index)))).collect();
    Ok(GpuInventory { gpus, topology: Topology { gpu_links: topo.gpu_links, numa_cpus, nics: Vec::new() }, device_files })
}
