//! GPUs of this node, real or simulated, behind one model: discovery (GPUs, MIG instances, the
//! GPU link matrix, NUMA domains and NICs), MIG layout changes, health events and utilization
//! samples. Everything after the probe is the same code for NVML, `nvidia-smi` files and the
//! simulated hardware profiles: they all produce the `proto` structs.

pub mod health;
pub mod mig;
pub mod nics;
pub mod nvml;
pub mod profiles;
pub mod sampler;
pub mod series;
pub mod smi_xml;
pub mod topo;

use std::sync::Arc;

use proto::{GpuInfo, Inventory, Topology};
use tracing::{info, warn};

pub use health::{run_health_loop, GpuFault, HealthEvent, HealthMonitor, HEALTH_CHANNEL_CAPACITY};
pub use mig::MigProfile;
pub use profiles::SimulatedProbe;
pub use sampler::{GpuSample, GpuSampler, JobGpuAccounting, JobGpuStats, MigOf};
pub use series::JobGpuSeries;

/// The GPU part of a node's inventory: what a probe discovers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuInventory {
    pub gpus: Vec<GpuInfo>,
    pub topology: Topology,
    /// Each GPU's device file (`/dev/nvidiaN`) by index, for fencing; node-local, never in the
    /// log. Empty for simulated GPUs unless the config names some (`gpu_device_files`).
    pub device_files: std::collections::BTreeMap<u32, std::path::PathBuf>,
}

impl GpuInventory {
    /// Writes the GPUs and topology into `inventory`, leaving CPUs, memory and the rest as they are.
    pub fn fill(&self, inventory: &mut Inventory) {
        inventory.gpus = self.gpus.clone();
        inventory.topology = self.topology.clone();
    }
}

/// Why a GPU operation was refused or failed; callers branch on the refusals (busy, MIG off).
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("nvml is not available: {0}")]
    NvmlUnavailable(String),
    #[error("no gpu with index {0}")]
    NoSuchGpu(u32),
    #[error("gpu {gpu} has mig mode off; corral never changes mig mode, turn it on out of band")]
    MigModeOff { gpu: u32 },
    #[error("gpu {gpu} ({model}) has no known mig profiles")]
    MigUnsupported { gpu: u32, model: String },
    #[error("gpu {gpu} is busy: {reason}")]
    Busy { gpu: u32, reason: String },
    #[error("unknown mig profile '{profile}' on gpu {gpu}")]
    UnknownProfile { gpu: u32, profile: String },
    #[error("mig layout {layout:?} leaves out the {profile} at slice {start_slice} of gpu {gpu}, which a job holds")]
    DropsHeld { gpu: u32, layout: Vec<String>, profile: String, start_slice: u32 },
    #[error("mig layout {layout:?} does not fit gpu {gpu}")]
    LayoutDoesNotFit { gpu: u32, layout: Vec<String> },
    #[error("this probe cannot change mig layouts: {0}")]
    NotSupported(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// A source of GPUs. `discover` is called at start and after every layout change.
pub trait GpuProbe: Send + Sync {
    /// `nvml`, `simulated` or `none`: for logs.
    fn kind(&self) -> &'static str;

    /// The GPUs of this node in index order, with their links, NUMA domains and NICs.
    fn discover(&self) -> anyhow::Result<GpuInventory>;

    /// Re-partitions GPU `gpu_index` into `profiles` (e.g. `["3g.71gb", "1g.18gb"]`) and returns
    /// the inventory afterwards, to be sent as `PeerRequest::ReportInventory`. The instances starting
    /// at the slices `held` (jobs of this node hold them) stay as they are and must be among
    /// `profiles`; every other instance must be idle. Only on a GPU whose MIG mode is already
    /// on, one GPU at a time; never changes MIG mode or resets.
    fn apply_layout(&self, gpu_index: u32, profiles: &[String], held: &[u32]) -> Result<GpuInventory, GpuError>;

    /// A monitor of XID events, ECC errors and lost GPUs, to hand to [`run_health_loop`].
    fn health_monitor(&self) -> anyhow::Result<Box<dyn HealthMonitor>>;

    /// Utilization, memory, temperature and power of each GPU.
    fn sampler(&self) -> Arc<dyn GpuSampler>;

    /// Fault injection for tests and the chaos harness: only a simulated probe takes faults.
    fn inject(&self, fault: GpuFault) -> Result<(), String> {
        Err(format!("{} gpus take no injected faults ({fault:?})", self.kind()))
    }
}

/// The probe for a node's `gpus` setting:
/// - `auto`: NVML; where libnvidia-ml cannot be loaded, one warning and no GPUs.
/// - `nvml`: NVML, and discovery fails where it cannot be loaded.
/// - `none` or empty: no GPUs.
/// - a hardware profile (`sxm-h100x8`, `pcie-l40sx8`, `h200-mig`) or `TYPE:N` (`h100:8`): simulated.
pub fn probe_from_config(spec: &str, node_name: &str) -> Box<dyn GpuProbe> {
    let spec = spec.trim();
    match spec {
        "" | "none" => Box::new(NoGpuProbe),
        "auto" => match nvml::NvmlProbe::new() {
            Ok(p) => {
                info!(node = %node_name, "gpus from nvml");
                Box::new(p)
            }
            Err(e) => {
                warn!(node = %node_name, error = %e, "nvml not available, this node offers no gpus");
                Box::new(NoGpuProbe)
            }
        },
        "nvml" => match nvml::NvmlProbe::new() {
            Ok(p) => Box::new(p),
            Err(e) => Box::new(FailedProbe { error: format!("load nvml for gpus = \"nvml\": {e}") }),
        },
        _ => match SimulatedProbe::new(spec, node_name) {
            Ok(p) => Box::new(p),
            Err(e) => Box::new(FailedProbe { error: format!("{e:#}") }),
        },
    }
}

/// A node without GPUs.
pub struct NoGpuProbe;

impl GpuProbe for NoGpuProbe {
    fn kind(&self) -> &'static str {
        "none"
    }
    fn discover(&self) -> anyhow::Result<GpuInventory> {
        Ok(GpuInventory::default())
    }
    fn apply_layout(&self, gpu_index: u32, _profiles: &[String], _held: &[u32]) -> Result<GpuInventory, GpuError> {
        Err(GpuError::NoSuchGpu(gpu_index))
    }
    fn health_monitor(&self) -> anyhow::Result<Box<dyn HealthMonitor>> {
        Ok(Box::new(health::IdleMonitor))
    }
    fn sampler(&self) -> Arc<dyn GpuSampler> {
        Arc::new(sampler::NoSampler)
    }
}

/// A probe whose configuration was invalid: discovery reports why, so the node refuses to start.
struct FailedProbe {
    error: String,
}

impl GpuProbe for FailedProbe {
    fn kind(&self) -> &'static str {
        "failed"
    }
    fn discover(&self) -> anyhow::Result<GpuInventory> {
        Err(anyhow::anyhow!("{}", self.error))
    }
    fn apply_layout(&self, _gpu_index: u32, _profiles: &[String], _held: &[u32]) -> Result<GpuInventory, GpuError> {
        Err(GpuError::NotSupported(self.error.clone()))
    }
    fn health_monitor(&self) -> anyhow::Result<Box<dyn HealthMonitor>> {
        Err(anyhow::anyhow!("{}", self.error))
    }
    fn sampler(&self) -> Arc<dyn GpuSampler> {
        Arc::new(sampler::NoSampler)
    }
}

/// GRES type of a marketing name: `NVIDIA H100 80GB HBM3` → `h100`, `NVIDIA A100-SXM4-80GB` →
/// `a100`, `NVIDIA GH200 480GB` → `gh200`. Unknown names give their first model-like token.
pub fn gres_type_for_model(model: &str) -> String {
    const KNOWN: &[&str] = &[
        "gb200", "gh200", "b200", "b100", "h200", "h100", "h800", "h20", "a100", "a800", "a40", "a30", "a16", "a10g", "a10", "a2", "l40s",
        "l40", "l20", "l4", "v100", "t4", "p100",
    ];
    let tokens: Vec<String> =
        model.to_ascii_lowercase().split(|c: char| !c.is_ascii_alphanumeric()).filter(|t| !t.is_empty()).map(str::to_string).collect();
    if let Some(t) = tokens.iter().find(|t| KNOWN.contains(&t.as_str())) {
        return t.clone();
    }
    const VENDOR: &[&str] = &["nvidia", "tesla", "geforce", "quadro", "rtx"];
    tokens
        .iter()
        .find(|t| !VENDOR.contains(&t.as_str()) && t.chars().any(|c| c.is_ascii_digit()))
        .or_else(|| tokens.iter().find(|t| !VENDOR.contains(&t.as_str())))
        .cloned()
        .unwrap_or_else(|| "gpu".to_string())
}

/// Compute capability of a GRES type where the source (e.g. `nvidia-smi -q -x`) does not say.
pub fn compute_capability_for(gres_type: &str) -> Option<&'static str> {
    Some(match gres_type {
        "gb200" | "b200" | "b100" => "10.0",
        "gh200" | "h200" | "h100" | "h800" | "h20" => "9.0",
        "l40s" | "l40" | "l20" | "l4" => "8.9",
        "a40" | "a16" | "a10g" | "a10" | "a2" => "8.6",
        "a100" | "a800" | "a30" => "8.0",
        "t4" => "7.5",
        "v100" => "7.0",
        "p100" => "6.0",
        _ => return None,
    })
}

/// `00000000:18:00.0` and `0000:18:00.0` name the same device: (domain, bus, device, function).
pub fn parse_bus_id(text: &str) -> Option<(u32, u32, u32, u32)> {
    let text = text.trim();
    let (rest, function) = text.rsplit_once('.')?;
    let mut parts = rest.split(':');
    let (domain, bus, device) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(d), Some(b), Some(v), None) => (d, b, v),
        (Some(b), Some(v), None, None) => ("0", b, v),
        _ => return None,
    };
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u32::from_str_radix(bus, 16).ok()?,
        u32::from_str_radix(device, 16).ok()?,
        u32::from_str_radix(function, 16).ok()?,
    ))
}

/// The sysfs name of a PCI device (`0000:18:00.0`) from any bus id spelling.
pub fn sysfs_pci_name(bus_id: &str) -> Option<String> {
    let (d, b, v, f) = parse_bus_id(bus_id)?;
    Some(format!("{d:04x}:{b:02x}:{v:02x}.{f:x}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_map_to_gres_types() {
        for (model, gres) in [
            ("NVIDIA H100 80GB HBM3", "h100"),
            ("NVIDIA H200", "h200"),
            ("NVIDIA GH200 480GB", "gh200"),
            ("NVIDIA A100-SXM4-80GB", "a100"),
            ("NVIDIA A100 80GB PCIe", "a100"),
            ("NVIDIA L40S", "l40s"),
            ("NVIDIA L4", "l4"),
            ("Tesla T4", "t4"),
            ("NVIDIA H100 NVL", "h100"),
            ("NVIDIA RTX 6000 Ada Generation", "6000"),
        ] {
            assert_eq!(gres_type_for_model(model), gres, "{model}");
        }
    }

    #[test]
    fn bus_ids_compare_across_spellings() {
        assert_eq!(parse_bus_id("00000000:2A:00.0"), Some((0, 0x2a, 0, 0)));
        assert_eq!(parse_bus_id("0000:2a:00.0"), parse_bus_id("00000000:2A:00.0"));
        assert_eq!(sysfs_pci_name("00000000:2A:00.0").as_deref(), Some("0000:2a:00.0"));
        assert_eq!(parse_bus_id("garbage"), None);
    }

    #[test]
    fn spec_none_and_bad_specs() {
        assert!(probe_from_config("none", "n").discover().expect("none").gpus.is_empty());
        let err = probe_from_config("x999:2", "n").discover().expect_err("unknown type");
        assert!(format!("{err:#}").contains("unknown gpu type"), "{err:#}");
    }
}
