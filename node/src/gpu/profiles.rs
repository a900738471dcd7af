//! Simulated GPUs that look like real machines: named hardware profiles (`sxm-h100x8`,
//! `pcie-l40sx8`, `h200-mig`) and the short `TYPE:N` form. The simulated probe holds its machine
//! in memory: MIG layout changes go through the same `mig::apply_layout` flow as on NVML, and
//! faults injected with [`SimulatedProbe::inject`] come out of its health monitor as events.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{bail, Context};
use proto::{GpuInfo, Link, MigInstance, Nic, Topology};
use sha2::{Digest, Sha256};

use super::health::{GpuFault, HealthEvent, HealthMonitor, HealthTracker};
use super::mig::{self, MigBackend, MigProfile, PlannedInstance};
use super::sampler::{simulated_samples, GpuSample, GpuSampler};
use super::{GpuError, GpuInventory, GpuProbe};

/// How the GPUs of a simulated machine connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// SXM boards on NVSwitch: every pair through this many bonded NVLinks.
    Sxm(u8),
    /// PCIe cards, two per switch.
    Pcie,
}

struct Model {
    gres_type: &'static str,
    name: &'static str,
    memory_mib: u64,
    compute_capability: &'static str,
    form: Form,
}

/// GPU models the simulator knows, with the form `TYPE:N` gets.
const MODELS: &[Model] = &[
    Model { gres_type: "h100", name: "NVIDIA H100 80GB HBM3", memory_mib: 81_559, compute_capability: "9.0", form: Form::Sxm(18) },
    Model { gres_type: "h200", name: "NVIDIA H200", memory_mib: 143_771, compute_capability: "9.0", form: Form::Sxm(18) },
    Model { gres_type: "a100", name: "NVIDIA A100-SXM4-80GB", memory_mib: 81_920, compute_capability: "8.0", form: Form::Sxm(12) },
    Model { gres_type: "l40s", name: "NVIDIA L40S", memory_mib: 46_068, compute_capability: "8.9", form: Form::Pcie },
];

/// Named profiles (besides `sxm-TYPExN` and `pcie-TYPExN` for any known type and count).
pub const PROFILE_NAMES: &[&str] = &["sxm-h100x8", "pcie-l40sx8", "h200-mig"];

/// Bus ids of the GPUs of a DGX H100 (SXM) and of a common 8-card PCIe server.
const SXM_BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
const PCIE_BUSES: [u32; 8] = [0x17, 0x18, 0x3a, 0x3b, 0x86, 0x87, 0xaf, 0xb0];

/// Layout of `h200-mig`'s GPU at start.
const H200_MIG_LAYOUT: &[&str] = &["3g.71gb", "2g.35gb", "1g.18gb"];

fn model(kind: &str) -> anyhow::Result<&'static Model> {
    MODELS.iter().find(|m| m.gres_type == kind).with_context(|| {
        let known: Vec<&str> = MODELS.iter().map(|m| m.gres_type).collect();
        format!("unknown gpu type '{kind}' (known: {})", known.join(", "))
    })
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` derived from `seed`.
fn uuid_from(prefix: &str, seed: &str) -> String {
    let digest = Sha256::digest(seed.as_bytes());
    let h = hex::encode(&digest[..16]);
    format!("{prefix}-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// The UUID of simulated GPU `index` of node `node`: stable across restarts, unique per node.
pub fn stable_uuid(node: &str, index: u32) -> String {
    uuid_from("GPU", &format!("corral-sim/{node}/{index}"))
}

fn cpus(ranges: &[std::ops::Range<u32>]) -> Vec<u32> {
    ranges.iter().flat_map(|r| r.clone()).collect()
}

/// A machine of `count` GPUs of `model` in `form`: GPUs split evenly over two NUMA nodes
/// (first half on 0), CPUs and NICs to match.
fn build_machine(node_name: &str, model: &Model, count: u32, form: Form) -> GpuInventory {
    let numa_nodes: u32 = if count >= 2 { 2 } else { 1 };
    let numa_of = |i: u32| i * numa_nodes / count.max(1);
    let buses: &[u32; 8] = if matches!(form, Form::Sxm(_)) { &SXM_BUSES } else { &PCIE_BUSES };
    let gpus: Vec<GpuInfo> = (0..count)
        .map(|i| GpuInfo {
            index: i,
            uuid: stable_uuid(node_name, i),
            model: model.name.to_string(),
            gres_type: model.gres_type.to_string(),
            memory_mib: model.memory_mib,
            pci_bus_id: format!("00000000:{:02X}:00.0", buses.get(i as usize).copied().unwrap_or(0xc0 + i)),
            numa_node: Some(numa_of(i)),
            compute_capability: Some(model.compute_capability.to_string()),
            healthy: true,
            ..GpuInfo::default()
        })
        .collect();
    let link = |i: u32, j: u32| match form {
        _ if i == j => Link::X,
        Form::Sxm(n) => Link::NvLink(n),
        Form::Pcie if numa_of(i) != numa_of(j) => Link::Sys,
        Form::Pcie if i / 2 == j / 2 => Link::Pix,
        Form::Pcie => Link::Pxb,
    };
    let gpu_links = (0..count).map(|i| (0..count).map(|j| link(i, j)).collect()).collect();
    // Two sockets with hyperthreads: a DGX H100's 2 x 56 cores, a PCIe server's 2 x 32.
    let cores: u32 = if matches!(form, Form::Sxm(_)) { 56 } else { 32 };
    let total = cores * numa_nodes;
    let numa_cpus: BTreeMap<u32, Vec<u32>> =
        (0..numa_nodes).map(|n| (n, cpus(&[n * cores..(n + 1) * cores, total + n * cores..total + (n + 1) * cores]))).collect();
    let nics: Vec<Nic> = match form {
        Form::Sxm(_) => (0..count)
            .map(|i| Nic { name: format!("mlx5_{i}"), infiniband: true, numa_node: Some(numa_of(i)), netdev: Some(format!("ib{i}")) })
            .collect(),
        Form::Pcie => (0..numa_nodes)
            .map(|n| Nic {
                name: format!("mlx5_{n}"),
                infiniband: true,
                numa_node: Some(n),
                netdev: Some(format!("ens{}f0np0", 1 + 5 * n)),
            })
            .collect(),
    };
    GpuInventory { gpus, topology: Topology { gpu_links, numa_cpus, nics }, device_files: Default::default() }
}

/// The machine a spec names.
fn machine_for(spec: &str, node_name: &str) -> anyhow::Result<(GpuInventory, Option<Vec<String>>)> {
    if spec == "h200-mig" {
        // The machine of node/tests/fixtures/h200: one H200 in a 16-CPU VM, MIG on.
        let m = model("h200")?;
        let mut inv = build_machine(node_name, m, 1, Form::Sxm(18));
        inv.gpus[0].pci_bus_id = "00000000:00:06.0".into();
        inv.gpus[0].mig_enabled = true;
        inv.topology.numa_cpus = [(0, (0..16).collect())].into_iter().collect();
        inv.topology.nics.clear();
        return Ok((inv, Some(H200_MIG_LAYOUT.iter().map(|s| s.to_string()).collect())));
    }
    let named = |prefix: &str| -> Option<anyhow::Result<(&'static Model, u32)>> {
        let rest = spec.strip_prefix(prefix)?;
        let (kind, count) = rest.rsplit_once('x')?;
        Some(model(kind).and_then(|m| Ok((m, count.parse().with_context(|| format!("parse gpu count in '{spec}'"))?))))
    };
    let (m, count, form) = if let Some(parsed) = named("sxm-") {
        let (m, count) = parsed?;
        let Form::Sxm(_) = m.form else { bail!("{} has no sxm form; try pcie-{}x{count}", m.gres_type, m.gres_type) };
        (m, count, m.form)
    } else if let Some(parsed) = named("pcie-") {
        let (m, count) = parsed?;
        (m, count, Form::Pcie)
    } else {
        let (kind, count) = spec.split_once(':').with_context(|| {
            format!("parse gpus '{spec}': expected auto, nvml, none, TYPE:N or a profile ({})", PROFILE_NAMES.join(", "))
        })?;
        let count: u32 = count.parse().with_context(|| format!("parse gpu count in '{spec}'"))?;
        let m = model(kind)?;
        (m, count, m.form)
    };
    if count > 64 {
        bail!("a simulated node holds at most 64 gpus, not {count}");
    }
    Ok((build_machine(node_name, m, count, form), None))
}

struct SimMachine {
    inv: GpuInventory,
    busy: BTreeSet<u32>,
    /// Bumped at each instance creation so recreated instances get new UUIDs, as on hardware.
    generation: u64,
}

struct SimState {
    machine: Mutex<SimMachine>,
    faults: Mutex<VecDeque<GpuFault>>,
    wake: Condvar,
}

/// Simulated GPUs for `gpus = "h100:8"`, `"sxm-h100x8"`, `"pcie-l40sx8"`, `"h200-mig"`.
/// Clones share the machine: inject into one, the monitor of another sees it.
#[derive(Clone)]
pub struct SimulatedProbe {
    node_name: String,
    state: Arc<SimState>,
}

/// Faults waiting for a monitor; more are dropped (oldest first) past this.
const SIM_FAULTS_MAX: usize = 1024;

impl SimulatedProbe {
    pub fn new(spec: &str, node_name: &str) -> anyhow::Result<SimulatedProbe> {
        let (inv, layout) = machine_for(spec.trim(), node_name)?;
        let probe = SimulatedProbe {
            node_name: node_name.to_string(),
            state: Arc::new(SimState {
                machine: Mutex::new(SimMachine { inv, busy: BTreeSet::new(), generation: 0 }),
                faults: Mutex::new(VecDeque::new()),
                wake: Condvar::new(),
            }),
        };
        if let Some(layout) = layout {
            let gpus: Vec<u32> = probe.machine().inv.gpus.iter().map(|g| g.index).collect();
            for gpu in gpus {
                mig::apply_layout(&probe, gpu, &layout, &[]).map_err(|e| anyhow::anyhow!("create the initial mig layout: {e}"))?;
            }
        }
        Ok(probe)
    }

    fn machine(&self) -> MutexGuard<'_, SimMachine> {
        self.state.machine.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a fault for the health monitor (as if NVML had reported it).
    pub fn inject(&self, fault: GpuFault) {
        let mut q = self.state.faults.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() >= SIM_FAULTS_MAX {
            q.pop_front();
        }
        q.push_back(fault);
        self.state.wake.notify_all();
    }

    /// Marks GPU `gpu` as running processes (MIG layout changes are refused) or idle.
    pub fn set_busy(&self, gpu: u32, busy: bool) {
        let mut m = self.machine();
        if busy {
            m.busy.insert(gpu);
        } else {
            m.busy.remove(&gpu);
        }
    }
}

impl MigBackend for SimulatedProbe {
    fn discover(&self) -> anyhow::Result<GpuInventory> {
        Ok(self.machine().inv.clone())
    }

    fn profiles(&self, gpu: &GpuInfo) -> Result<Vec<MigProfile>, GpuError> {
        mig::builtin_profiles(&gpu.gres_type).ok_or_else(|| GpuError::MigUnsupported { gpu: gpu.index, model: gpu.model.clone() })
    }

    /// A simulated GPU marked busy ([`SimulatedProbe::set_busy`]) runs processes outside
    /// every instance: busy whatever is kept.
    fn busy_reason(&self, gpu: &GpuInfo, _kept: &[MigInstance]) -> anyhow::Result<Option<String>> {
        Ok(self.machine().busy.contains(&gpu.index).then(|| "simulated processes are running on it".to_string()))
    }

    fn destroy(&self, gpu: &GpuInfo, instances: &[MigInstance]) -> anyhow::Result<()> {
        let mut m = self.machine();
        let g = m.inv.gpus.iter_mut().find(|g| g.index == gpu.index).with_context(|| format!("find simulated gpu {}", gpu.index))?;
        g.mig.retain(|x| !instances.iter().any(|d| d.start_slice == x.start_slice));
        Ok(())
    }

    fn create(&self, gpu: &GpuInfo, planned: &[PlannedInstance]) -> anyhow::Result<()> {
        let node = self.node_name.clone();
        let mut m = self.machine();
        m.generation += 1;
        let generation = m.generation;
        let g = m.inv.gpus.iter_mut().find(|g| g.index == gpu.index).with_context(|| format!("find simulated gpu {}", gpu.index))?;
        for p in planned {
            // A full-GPU instance is id 0 on hardware; the others take the least id free from 1.
            let gpu_instance_id = if p.profile.size_slices == mig::MIG_SLICES {
                0
            } else {
                (1..).find(|id| !g.mig.iter().any(|m| m.gpu_instance_id == *id)).unwrap_or(0)
            };
            g.mig.push(MigInstance {
                uuid: uuid_from("MIG", &format!("corral-sim/{node}/{}/{generation}/{gpu_instance_id}", g.index)),
                profile: p.profile.name.clone(),
                gpu_instance_id,
                compute_instance_id: 0,
                start_slice: p.start_slice,
                size_slices: p.profile.size_slices,
                memory_mib: p.profile.memory_mib,
            });
        }
        g.mig.sort_by_key(|m| m.start_slice);
        Ok(())
    }
}

impl GpuProbe for SimulatedProbe {
    fn inject(&self, fault: GpuFault) -> Result<(), String> {
        SimulatedProbe::inject(self, fault);
        Ok(())
    }

    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn discover(&self) -> anyhow::Result<GpuInventory> {
        MigBackend::discover(self)
    }

    fn apply_layout(&self, gpu_index: u32, profiles: &[String], held: &[u32]) -> Result<GpuInventory, GpuError> {
        mig::apply_layout(self, gpu_index, profiles, held)
    }

    fn health_monitor(&self) -> anyhow::Result<Box<dyn HealthMonitor>> {
        Ok(Box::new(SimulatedMonitor { probe: self.clone(), tracker: HealthTracker::default() }))
    }

    fn sampler(&self) -> Arc<dyn GpuSampler> {
        Arc::new(self.clone())
    }
}

/// Samples of the machine as it is now: MIG instances relaid since start-up are sampled as
/// they now are.
impl GpuSampler for SimulatedProbe {
    fn sample(&self, held: &BTreeSet<u32>) -> anyhow::Result<Vec<GpuSample>> {
        let gpus = self.machine().inv.gpus.clone();
        Ok(simulated_samples(&self.node_name, &gpus, held))
    }
}

/// Turns injected faults into events, and marks the simulated GPUs as the events say.
struct SimulatedMonitor {
    probe: SimulatedProbe,
    tracker: HealthTracker,
}

impl HealthMonitor for SimulatedMonitor {
    fn poll(&mut self, timeout: Duration) -> anyhow::Result<Vec<HealthEvent>> {
        let state = &self.probe.state;
        let q = state.faults.lock().unwrap_or_else(|p| p.into_inner());
        let (mut q, _) = state.wake.wait_timeout_while(q, timeout, |q| q.is_empty()).unwrap_or_else(|p| p.into_inner());
        let faults: Vec<GpuFault> = q.drain(..).collect();
        drop(q);
        let events: Vec<HealthEvent> = faults.into_iter().filter_map(|f| self.tracker.observe(f)).collect();
        let mut m = self.probe.machine();
        for e in events.iter().filter(|e| e.mig_uuid.is_none()) {
            if let Some(g) = m.inv.gpus.iter_mut().find(|g| g.index == e.gpu) {
                g.healthy = e.healthy;
                g.health_reason = (!e.healthy).then(|| e.reason.clone());
            }
        }
        Ok(events)
    }
}
