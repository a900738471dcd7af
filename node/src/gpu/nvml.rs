//! Real GPUs through NVML (libnvidia-ml.so.1, loaded at run time, so `corrald` starts on hosts
//! without a driver). Discovery, the NVLink/PCIe link matrix, MIG instances, health events and
//! samples; MIG layout changes run `nvidia-smi mig` (create/destroy GPU and compute instances).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor, TopologyLevel};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use nvml_wrapper::{Device, Nvml};
use proto::{GpuInfo, Link, MigInstance, Topology};
use tracing::{debug, info, warn};

use super::health::{GpuFault, HealthEvent, HealthMonitor, HealthTracker};
use super::mig::{self, MigBackend, MigProfile, PlannedInstance};
use super::nics::{self, SYSFS_ROOT};
use super::sampler::{GpuSample, GpuSampler, MigOf};
use super::{gres_type_for_model, parse_bus_id, GpuError, GpuInventory, GpuProbe};

/// NVLinks a GPU may have (NVML_NVLINK_MAX_LINKS).
const NVLINK_MAX_LINKS: u32 = 18;
/// MIG devices a GPU may hold.
const MIG_DEVICES_MAX: u32 = 7;
/// How often the monitor checks ECC counters and whether each GPU still answers.
const HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// NVML, initialized once per process (NVML itself is process-wide).
fn nvml() -> Result<&'static Nvml, GpuError> {
    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();
    NVML.get_or_init(|| Nvml::init().map_err(|e| e.to_string())).as_ref().map_err(|e| GpuError::NvmlUnavailable(e.clone()))
}

/// GPUs through NVML.
pub struct NvmlProbe {
    nvml: &'static Nvml,
    sys_root: PathBuf,
}

impl NvmlProbe {
    /// Loads NVML; a clean `NvmlUnavailable` where libnvidia-ml.so.1 or the driver is missing.
    pub fn new() -> Result<NvmlProbe, GpuError> {
        let nvml = nvml()?;
        let driver = nvml.sys_driver_version().unwrap_or_else(|_| "unknown".into());
        info!(driver = %driver, "nvml loaded");
        Ok(NvmlProbe { nvml, sys_root: PathBuf::from(SYSFS_ROOT) })
    }

    fn devices(&self) -> anyhow::Result<Vec<Device<'static>>> {
        let count = self.nvml.device_count().context("count gpus through nvml")?;
        (0..count).map(|i| self.nvml.device_by_index(i).with_context(|| format!("open gpu {i} through nvml"))).collect()
    }

    fn gpu_info(&self, index: u32, dev: &Device<'static>) -> anyhow::Result<GpuInfo> {
        let model = dev.name().with_context(|| format!("read name of gpu {index}"))?;
        let pci_bus_id = dev.pci_info().with_context(|| format!("read pci info of gpu {index}"))?.bus_id;
        let numa_node = dev.numa_node_id().ok().or_else(|| nics::pci_numa_node(&self.sys_root, &pci_bus_id));
        let mig_enabled = dev.mig_mode().map(|m| m.current == 1).unwrap_or(false);
        Ok(GpuInfo {
            index,
            uuid: dev.uuid().with_context(|| format!("read uuid of gpu {index}"))?,
            gres_type: gres_type_for_model(&model),
            model,
            memory_mib: dev.memory_info().with_context(|| format!("read memory of gpu {index}"))?.total / (1024 * 1024),
            pci_bus_id,
            numa_node,
            compute_capability: dev.cuda_compute_capability().ok().map(|c| format!("{}.{}", c.major, c.minor)),
            mig_enabled,
            mig: if mig_enabled { mig_instances(self.nvml, dev) } else { Vec::new() },
            healthy: true,
            health_reason: None,
            shards: 0,
        })
    }
}

/// MIG devices of `dev` with their GPU/compute instance ids, placement and memory.
fn mig_instances(nvml: &'static Nvml, dev: &Device<'static>) -> Vec<MigInstance> {
    mig_devices(nvml, dev).into_iter().map(|(inst, _)| inst).collect()
}

/// The MIG devices of `dev`, each with what NVML says of it, in the order they start on the GPU.
fn mig_devices(nvml: &'static Nvml, dev: &Device<'static>) -> Vec<(MigInstance, Device<'static>)> {
    let lib = nvml.lib();
    let mut out = Vec::new();
    for i in 0..MIG_DEVICES_MAX {
        let Ok(m) = dev.mig_device_by_index(i) else { continue };
        let Ok(uuid) = m.uuid() else { continue };
        // `NVIDIA H200 MIG 1g.18gb` → `1g.18gb`.
        let profile = m.name().ok().and_then(|n| n.rsplit_once("MIG ").map(|(_, p)| p.trim().to_string())).unwrap_or_default();
        let mut inst = MigInstance { uuid, profile, ..MigInstance::default() };
        // SAFETY: handles come from NVML and live as long as `nvml`; each out-pointer is a
        // valid local; a symbol this driver lacks is skipped, not called.
        unsafe {
            let mh = m.handle();
            if let Ok(f) = lib.nvmlDeviceGetGpuInstanceId.as_ref() {
                f(mh, &mut inst.gpu_instance_id);
            }
            if let Ok(f) = lib.nvmlDeviceGetComputeInstanceId.as_ref() {
                f(mh, &mut inst.compute_instance_id);
            }
            if let Ok(f) = lib.nvmlDeviceGetAttributes_v2.as_ref() {
                let mut attrs: nvml_wrapper_sys::bindings::nvmlDeviceAttributes_t = std::mem::zeroed();
                if f(mh, &mut attrs) == 0 {
                    inst.memory_mib = attrs.memorySizeMB;
                }
            }
            if let (Ok(by_id), Ok(info_of)) = (lib.nvmlDeviceGetGpuInstanceById.as_ref(), lib.nvmlGpuInstanceGetInfo.as_ref()) {
                let mut gi = std::ptr::null_mut();
                if by_id(dev.handle(), inst.gpu_instance_id, &mut gi) == 0 {
                    let mut info: nvml_wrapper_sys::bindings::nvmlGpuInstanceInfo_t = std::mem::zeroed();
                    if info_of(gi, &mut info) == 0 {
                        inst.start_slice = info.placement.start;
                        inst.size_slices = info.placement.size;
                    }
                }
            }
        }
        if inst.memory_mib == 0 {
            inst.memory_mib = m.memory_info().map(|mi| mi.total / (1024 * 1024)).unwrap_or(0);
        }
        out.push((inst, m));
    }
    out.sort_by_key(|(m, _)| (m.start_slice, m.gpu_instance_id, m.compute_instance_id));
    out
}

/// `topology_common_ancestor` levels as `nvidia-smi topo -m` names them.
fn pcie_link(level: TopologyLevel) -> Link {
    match level {
        TopologyLevel::Internal | TopologyLevel::Single => Link::Pix,
        TopologyLevel::Multiple => Link::Pxb,
        TopologyLevel::HostBridge => Link::Phb,
        TopologyLevel::Node => Link::Node,
        TopologyLevel::System => Link::Sys,
    }
}

/// A PCI address: (domain, bus, device, function).
type PciAddr = (u32, u32, u32, u32);

/// Per GPU: active NVLinks to each remote PCI device (another GPU, or an NVSwitch).
fn nvlinks_of(dev: &Device<'static>) -> BTreeMap<PciAddr, u8> {
    let mut links = BTreeMap::new();
    for l in 0..NVLINK_MAX_LINKS {
        let link = dev.link_wrapper_for(l);
        if !link.is_active().unwrap_or(false) {
            continue;
        }
        if let Some(remote) = link.remote_pci_info().ok().and_then(|p| parse_bus_id(&p.bus_id)) {
            *links.entry(remote).or_default() += 1;
        }
    }
    links
}

/// Bonded NVLinks between GPU `i` and `j`: direct links, plus, where both reach NVSwitches
/// (links to a device that is no GPU of this node), the fewer of their switch links.
fn nvlink_count(links: &[BTreeMap<PciAddr, u8>], gpu_bus: &[Option<PciAddr>], i: usize, j: usize) -> u8 {
    let gpus: BTreeSet<PciAddr> = gpu_bus.iter().flatten().copied().collect();
    let to_switch = |k: usize| -> u8 { links[k].iter().filter(|(b, _)| !gpus.contains(b)).map(|(_, n)| *n).sum() };
    let direct = gpu_bus[j].and_then(|b| links[i].get(&b).copied()).unwrap_or(0);
    direct.saturating_add(to_switch(i).min(to_switch(j)))
}

impl GpuProbe for NvmlProbe {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> anyhow::Result<GpuInventory> {
        let devices = self.devices()?;
        let mut gpus = Vec::with_capacity(devices.len());
        for (i, dev) in devices.iter().enumerate() {
            gpus.push(self.gpu_info(i as u32, dev)?);
        }
        let nvlinks: Vec<_> = devices.iter().map(nvlinks_of).collect();
        let bus: Vec<Option<PciAddr>> = gpus.iter().map(|g| parse_bus_id(&g.pci_bus_id)).collect();
        let n = devices.len();
        let mut gpu_links = vec![vec![Link::X; n]; n];
        for i in 0..n {
            for j in (0..n).filter(|&j| j != i) {
                gpu_links[i][j] = match nvlink_count(&nvlinks, &bus, i, j) {
                    0 => self
                        .nvml
                        .device_by_index(j as u32)
                        .and_then(|dj| devices[i].topology_common_ancestor(dj))
                        .map(pcie_link)
                        .unwrap_or(Link::Sys),
                    links => Link::NvLink(links),
                };
            }
        }
        let topology = Topology { gpu_links, numa_cpus: nics::numa_cpus(&self.sys_root), nics: nics::discover_nics(&self.sys_root) };
        debug!(gpus = gpus.len(), nics = topology.nics.len(), "nvml discovery done");
        let device_files = devices
            .iter()
            .zip(&gpus)
            .filter_map(|(d, g)| d.minor_number().ok().map(|m| (g.index, std::path::PathBuf::from(format!("/dev/nvidia{m}")))))
            .collect();
        Ok(GpuInventory { gpus, topology, device_files })
    }

    fn apply_layout(&self, gpu_index: u32, profiles: &[String], held: &[u32]) -> Result<GpuInventory, GpuError> {
        mig::apply_layout(self, gpu_index, profiles, held)
    }

    fn health_monitor(&self) -> anyhow::Result<Box<dyn HealthMonitor>> {
        Ok(Box::new(NvmlMonitor::new(self.nvml)?))
    }

    fn sampler(&self) -> Arc<dyn GpuSampler> {
        Arc::new(NvmlSampler { nvml: self.nvml })
    }
}

fn run_smi(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("nvidia-smi").args(args).output().with_context(|| format!("run nvidia-smi {}", args.join(" ")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        anyhow::bail!(
            "nvidia-smi {} failed ({}): {} {}",
            args.join(" "),
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(stdout)
}

impl MigBackend for NvmlProbe {
    fn discover(&self) -> anyhow::Result<GpuInventory> {
        GpuProbe::discover(self)
    }

    fn profiles(&self, gpu: &GpuInfo) -> Result<Vec<MigProfile>, GpuError> {
        let i = gpu.index.to_string();
        let lgip = run_smi(&["mig", "-i", &i, "-lgip"])?;
        let lgipp = run_smi(&["mig", "-i", &i, "-lgipp"])?;
        let mut table = mig::parse_mig_profiles(&lgip, &lgipp)?;
        table
            .remove(&gpu.index)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| GpuError::MigUnsupported { gpu: gpu.index, model: gpu.model.clone() })
    }

    fn busy_reason(&self, gpu: &GpuInfo, kept: &[MigInstance]) -> anyhow::Result<Option<String>> {
        let dev = self.nvml.device_by_index(gpu.index).with_context(|| format!("open gpu {}", gpu.index))?;
        // The whole device's processes include those of the kept instances: asked only when
        // nothing is kept.
        let mut pids: BTreeSet<u32> = if kept.is_empty() {
            dev.running_compute_processes().unwrap_or_default().iter().map(|p| p.pid).collect()
        } else {
            BTreeSet::new()
        };
        for (inst, m) in mig_devices(self.nvml, &dev) {
            if !kept.iter().any(|k| k.start_slice == inst.start_slice) {
                pids.extend(m.running_compute_processes().unwrap_or_default().iter().map(|p| p.pid));
            }
        }
        Ok((!pids.is_empty()).then(|| format!("processes {pids:?} are running on it")))
    }

    fn destroy(&self, gpu: &GpuInfo, instances: &[MigInstance]) -> anyhow::Result<()> {
        if instances.is_empty() {
            return Ok(());
        }
        let i = gpu.index.to_string();
        let ids: Vec<String> = instances.iter().map(|m| m.gpu_instance_id.to_string()).collect();
        let gi = ids.join(",");
        run_smi(&["mig", "-i", &i, "-gi", &gi, "-dci"]).context("destroy compute instances")?;
        run_smi(&["mig", "-i", &i, "-gi", &gi, "-dgi"]).context("destroy gpu instances")?;
        Ok(())
    }

    fn create(&self, gpu: &GpuInfo, planned: &[PlannedInstance]) -> anyhow::Result<()> {
        if planned.is_empty() {
            return Ok(());
        }
        let spec: Vec<String> = planned.iter().map(|p| format!("{}:{}", p.profile.id, p.start_slice)).collect();
        let i = gpu.index.to_string();
        run_smi(&["mig", "-i", &i, "-cgi", &spec.join(","), "-C"]).context("create gpu and compute instances")?;
        Ok(())
    }
}

/// Samples through NVML; a GPU that fails to answer is left out of the scrape.
struct NvmlSampler {
    nvml: &'static Nvml,
}

impl GpuSampler for NvmlSampler {
    fn sample(&self, _held: &BTreeSet<u32>) -> anyhow::Result<Vec<GpuSample>> {
        const MIB: u64 = 1024 * 1024;
        let count = self.nvml.device_count().context("count gpus through nvml")?;
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..count {
            let Ok(dev) = self.nvml.device_by_index(i) else { continue };
            let (Ok(uuid), Ok(mem)) = (dev.uuid(), dev.memory_info()) else { continue };
            let mig_mode = dev.mig_mode().map(|m| m.current == 1).unwrap_or(false);
            // In MIG mode NVML has none (NOT_SUPPORTED), for the GPU as for its instances.
            let rates = if mig_mode { None } else { dev.utilization_rates().ok() };
            let gpu = GpuSample {
                gpu: i,
                uuid,
                model: dev.name().unwrap_or_default(),
                utilization_pct: rates.as_ref().map(|u| u.gpu),
                memory_utilization_pct: rates.as_ref().map(|u| u.memory),
                memory_used_mib: mem.used / MIB,
                memory_free_mib: mem.free / MIB,
                temperature_c: dev.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                power_mw: u64::from(dev.power_usage().unwrap_or(0)),
                mig: None,
            };
            let instances: Vec<GpuSample> = if mig_mode {
                mig_devices(self.nvml, &dev)
                    .into_iter()
                    .filter_map(|(inst, m)| {
                        let mem = m.memory_info().ok()?;
                        let mig = MigOf { gpu_instance_id: inst.gpu_instance_id, profile: inst.profile, start_slice: inst.start_slice };
                        Some(GpuSample { memory_used_mib: mem.used / MIB, memory_free_mib: mem.free / MIB, mig: Some(mig), ..gpu.clone() })
                    })
                    .collect()
            } else {
                Vec::new()
            };
            out.push(gpu);
            out.extend(instances);
        }
        Ok(out)
    }
}

/// XID events through an NVML event set, and every [`HEALTH_CHECK_INTERVAL`] the volatile
/// uncorrectable ECC count and whether each GPU still answers.
struct NvmlMonitor {
    nvml: &'static Nvml,
    events: Option<EventSet<'static>>,
    ecc_seen: BTreeMap<u32, u64>,
    last_check: Option<Instant>,
    tracker: HealthTracker,
}

impl NvmlMonitor {
    fn new(nvml: &'static Nvml) -> anyhow::Result<NvmlMonitor> {
        let count = nvml.device_count().context("count gpus through nvml")?;
        let mut set = Some(nvml.create_event_set().context("create nvml event set")?);
        for i in 0..count {
            let dev = nvml.device_by_index(i).with_context(|| format!("open gpu {i}"))?;
            let Some(s) = set.take() else { break };
            let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
            match dev.register_events(wanted, s) {
                Ok(s) => set = Some(s),
                Err(e) => {
                    // The set is gone with the error; start another for the remaining GPUs.
                    warn!(gpu = i, error = %e.error, "register xid events, watching ecc counters only");
                    set = nvml.create_event_set().ok();
                }
            }
        }
        Ok(NvmlMonitor { nvml, events: set, ecc_seen: BTreeMap::new(), last_check: None, tracker: HealthTracker::default() })
    }

    fn index_of(&self, dev: &Device<'static>) -> Option<u32> {
        dev.index().ok()
    }

    fn check_devices(&mut self, faults: &mut Vec<GpuFault>) {
        let count = match self.nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "count gpus through nvml");
                return;
            }
        };
        for i in 0..count {
            let dev = match self.nvml.device_by_index(i) {
                Ok(d) => d,
                Err(NvmlError::GpuLost) => {
                    faults.push(GpuFault::FallenOffBus { gpu: i });
                    continue;
                }
                Err(e) => {
                    faults.push(GpuFault::NvmlError { gpu: i, message: e.to_string() });
                    continue;
                }
            };
            match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
                Ok(n) => {
                    let seen = self.ecc_seen.insert(i, n).unwrap_or(n);
                    if n > seen {
                        faults.push(GpuFault::EccUncorrectable { gpu: i, count: n - seen });
                    }
                }
                Err(NvmlError::GpuLost) => faults.push(GpuFault::FallenOffBus { gpu: i }),
                Err(NvmlError::NotSupported) => {}
                Err(e) => faults.push(GpuFault::NvmlError { gpu: i, message: e.to_string() }),
            }
        }
    }
}

impl HealthMonitor for NvmlMonitor {
    fn poll(&mut self, timeout: Duration) -> anyhow::Result<Vec<HealthEvent>> {
        let mut faults = Vec::new();
        let started = Instant::now();
        match &self.events {
            Some(set) => match set.wait(timeout.as_millis().min(u128::from(u32::MAX)) as u32) {
                Ok(ev) => {
                    let gpu = self.index_of(&ev.device).unwrap_or(u32::MAX);
                    if ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        let xid = match ev.event_data {
                            Some(nvml_wrapper::enums::event::XidError::Value(x)) => x,
                            _ => 0,
                        };
                        faults.push(GpuFault::Xid { gpu, xid, mig_uuid: None });
                    }
                    if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                        faults.push(GpuFault::EccUncorrectable { gpu, count: 1 });
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(NvmlError::GpuLost) => debug!("an event wait found a lost gpu; the device check names it"),
                Err(e) => return Err(anyhow::anyhow!(e).context("wait for nvml events")),
            },
            None => std::thread::sleep(timeout),
        }
        if self.last_check.is_none_or(|t| t.elapsed() >= HEALTH_CHECK_INTERVAL) {
            self.last_check = Some(Instant::now());
            self.check_devices(&mut faults);
        }
        debug!(elapsed_ms = started.elapsed().as_millis() as u64, faults = faults.len(), "nvml health poll");
        Ok(faults.into_iter().filter_map(|f| self.tracker.observe(f)).collect())
    }
}
