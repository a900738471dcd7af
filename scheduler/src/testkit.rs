//! Builders for tests and the benchmark (like Nomad's scheduler test harness): typical node
//! inventories, job specs, and a [`Cluster`] that turns them into a [`ClusterView`] the way the
//! state machine does (`node_view`, `take`, `job_request`).

use std::collections::BTreeMap;

use proto::{
    Allocation, ArrayTask, GpuInfo, GresRequest, Inventory, Job, JobId, JobSpec, JobState, Link, MigInstance, NetworkLocation, Nic, NodeId,
    NodeRun, Topology,
};

use crate::engine::{schedule, Plan};
use crate::mig;
use crate::view::{job_request, node_view, ClusterView, Partition};

fn gpu(index: u32, gres: &str, model: &str, memory_mib: u64, numa: u32) -> GpuInfo {
    GpuInfo {
        index,
        uuid: format!("GPU-{index}"),
        model: model.to_string(),
        gres_type: gres.to_string(),
        memory_mib,
        pci_bus_id: format!("00000000:{:02x}:00.0", 0x19 + index),
        numa_node: Some(numa),
        compute_capability: Some("9.0".into()),
        mig_enabled: false,
        mig: Vec::new(),
        healthy: true,
        health_reason: None,
        shards: 0,
    }
}

fn numa_cpus(domains: u32, per_domain: u32) -> BTreeMap<u32, Vec<u32>> {
    (0..domains).map(|d| (d, (d * per_domain..(d + 1) * per_domain).collect())).collect()
}

/// An 8-GPU NVLink box (DGX/HGX): all pairs NV18; GPUs 0-3 on NUMA 0, 4-7 on NUMA 1; 112 CPUs,
/// 2 TiB; one InfiniBand NIC per GPU on the GPU's NUMA node.
pub fn dgx(gres: &str) -> Inventory {
    let model = format!("NVIDIA {}", gres.to_ascii_uppercase());
    let gpus: Vec<GpuInfo> = (0..8).map(|i| gpu(i, gres, &model, 81_559, i / 4)).collect();
    let links = (0..8).map(|i| (0..8).map(|j| if i == j { Link::X } else { Link::NvLink(18) }).collect()).collect();
    let nics = (0..8)
        .map(|i| Nic { name: format!("mlx5_{i}"), infiniband: true, numa_node: Some(i / 4), netdev: Some(format!("ib{i}")) })
        .collect();
    Inventory {
        gpus,
        cpus: 112,
        memory_mib: 2 * 1024 * 1024,
        topology: Topology { gpu_links: links, numa_cpus: numa_cpus(2, 56), nics },
        ..Inventory::default()
    }
}

/// An 8-GPU PCIe box: pairs (0,1) (2,3) on NUMA 0 and (4,5) (6,7) on NUMA 1, each pair under
/// one PCIe switch (PIX), NODE within a NUMA node, SYS across; 64 CPUs, 512 GiB; NIC `mlx5_0`
/// on NUMA 0 and `mlx5_1` on NUMA 1.
pub fn pcie_box(gres: &str) -> Inventory {
    let model = format!("NVIDIA {}", gres.to_ascii_uppercase());
    let gpus: Vec<GpuInfo> = (0..8).map(|i| gpu(i, gres, &model, 46_068, i / 4)).collect();
    let links = (0..8u32)
        .map(|i| {
            (0..8u32)
                .map(|j| {
                    if i == j {
                        Link::X
                    } else if i / 2 == j / 2 {
                        Link::Pix
                    } else if i / 4 == j / 4 {
                        Link::Node
                    } else {
                        Link::Sys
                    }
                })
                .collect()
        })
        .collect();
    let nics =
        (0..2).map(|i| Nic { name: format!("mlx5_{i}"), infiniband: true, numa_node: Some(i), netdev: Some(format!("ib{i}")) }).collect();
    Inventory {
        gpus,
        cpus: 64,
        memory_mib: 512 * 1024,
        topology: Topology { gpu_links: links, numa_cpus: numa_cpus(2, 32), nics },
        ..Inventory::default()
    }
}

/// H200 GPUs in MIG mode, one per entry, each with the given (profile, start slice) instances
/// (the real H200 table gives sizes and memory).
pub fn h200_mig(gpus: &[&[(&str, u32)]]) -> Inventory {
    let model = mig::Model::H200Gb141;
    let infos = gpus
        .iter()
        .enumerate()
        .map(|(i, instances)| {
            let mut g = gpu(i as u32, "h200", "NVIDIA H200", 143_771, 0);
            g.mig_enabled = true;
            g.mig = instances
                .iter()
                .enumerate()
                .map(|(k, &(profile, start))| {
                    let p = model.profile(profile);
                    MigInstance {
                        uuid: format!("MIG-{i}-{k}"),
                        profile: profile.to_string(),
                        gpu_instance_id: k as u32 + 1,
                        compute_instance_id: 0,
                        start_slice: start,
                        size_slices: p.map_or(1, |p| p.memory_slices),
                        memory_mib: p.map_or(0, |p| p.memory_mib),
                    }
                })
                .collect();
            g
        })
        .collect();
    Inventory {
        gpus: infos,
        cpus: 64,
        memory_mib: 1024 * 1024,
        topology: Topology { numa_cpus: numa_cpus(1, 64), ..Topology::default() },
        ..Inventory::default()
    }
}

/// The inventory placed at (block, switch), optionally in an NVLink domain.
pub fn at(mut inv: Inventory, block: &str, switch: &str) -> Inventory {
    inv.location = NetworkLocation { block: Some(block.into()), rack: None, switch: Some(switch.into()), nvlink_domain: None };
    inv
}

/// The inventory with only its first `gpus` GPUs, each configured with `shards` shards
/// (Slurm's `gres/shard`; 0: not shared).
pub fn shared(mut inv: Inventory, gpus: usize, shards: u32) -> Inventory {
    inv.gpus.truncate(gpus);
    inv.gpus.iter_mut().for_each(|g| g.shards = shards);
    inv
}

/// A job spec asking `gres` (`gpu:N`, `gpu:TYPE:N`, `shard:N` or empty for none) on each of
/// `nodes` nodes.
pub fn spec(gres: &str, nodes: u32) -> JobSpec {
    let mut s = JobSpec::command(vec!["train".into()], "/home/u", "alice");
    s.gres = if gres.is_empty() { None } else { GresRequest::parse(gres).ok() };
    s.nodes = nodes;
    s
}

/// A cluster under construction.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    pub view: ClusterView,
    /// The proto jobs, by id (kept so tests can inspect them).
    pub jobs: BTreeMap<JobId, Job>,
}

impl Cluster {
    pub fn new() -> Cluster {
        Cluster::default()
    }

    pub fn node(&mut self, id: NodeId, name: &str, inventory: Inventory) -> &mut Cluster {
        self.view.nodes.insert(id, std::sync::Arc::new(node_view(id, name, &inventory, true)));
        self
    }

    pub fn partition(&mut self, p: Partition) -> &mut Cluster {
        self.view.partitions.insert(p.name.clone(), p);
        self
    }

    fn put(&mut self, job: Job) {
        for part in &job.parts {
            if let Some(n) = self.view.nodes.get_mut(&part.alloc.node) {
                let taken = std::sync::Arc::make_mut(n).take(&part.alloc);
                assert!(taken.is_ok(), "testkit: job {} double-books node {}: {taken:?}", job.id, part.alloc.node);
            }
        }
        let req = std::sync::Arc::new(job_request(&job));
        match self.view.jobs.binary_search_by_key(&job.id, |j| j.id) {
            Ok(i) => self.view.jobs[i] = req,
            Err(i) => self.view.jobs.insert(i, req),
        }
        self.jobs.insert(job.id, job);
    }

    fn base(id: JobId, spec: JobSpec, state: JobState, submit_ms: u64) -> Job {
        Job { state, ..Job::submitted(id, std::sync::Arc::new(spec), submit_ms) }
    }

    /// A pending job.
    pub fn submit(&mut self, id: JobId, spec: JobSpec, submit_ms: u64) -> &mut Cluster {
        self.put(Cluster::base(id, spec, JobState::Pending, submit_ms));
        self
    }

    /// A running job holding `allocs` since `start_ms`.
    pub fn running(&mut self, id: JobId, spec: JobSpec, allocs: Vec<Allocation>, start_ms: u64) -> &mut Cluster {
        let mut job = Cluster::base(id, spec, JobState::Running, start_ms);
        job.run = 1;
        job.start_ms = Some(start_ms);
        job.parts = allocs.into_iter().map(|alloc| NodeRun { run: 1, alloc, launched_by: Some(1) }).collect();
        self.put(job);
        self
    }

    /// A task job of array `array` (pending, or running on `allocs`).
    pub fn array_task(&mut self, id: JobId, array: JobId, task: u32, allocs: Vec<Allocation>) -> &mut Cluster {
        let spec = self.jobs.get(&array).map(|j| (*j.spec).clone()).unwrap_or_else(|| spec("gpu:1", 1));
        let mut job = Cluster::base(id, spec, if allocs.is_empty() { JobState::Pending } else { JobState::Running }, 0);
        job.array = Some(ArrayTask { array_job: array, task });
        if !allocs.is_empty() {
            job.run = 1;
            job.start_ms = Some(0);
            job.parts = allocs.into_iter().map(|alloc| NodeRun { run: 1, alloc, launched_by: Some(1) }).collect();
        }
        self.put(job);
        self
    }

    /// A finished job.
    pub fn finished(&mut self, id: JobId, spec: JobSpec, state: JobState) -> &mut Cluster {
        assert!(state.is_final());
        self.put(Cluster::base(id, spec, state, 0));
        self
    }

    /// `gpu_seconds` used by `user` without an account (charged to root), at time 0.
    pub fn usage(&mut self, user: &str, gpu_seconds: u64) -> &mut Cluster {
        let usage = proto::accounts::Usage { gpu_ms: gpu_seconds * 1000, ..Default::default() };
        self.view.usage.insert((proto::accounts::ROOT_ACCOUNT.to_string(), user.to_string()), usage);
        self
    }

    pub fn schedule(&self, now_ms: u64) -> Plan {
        schedule(&self.view, now_ms)
    }
}

/// `Allocation` shorthand.
pub fn alloc(node: NodeId, gpus: &[u32], cpus: u32, mem_mib: u64) -> Allocation {
    Allocation { node, gpus: gpus.to_vec(), cpus, mem_mib }
}
