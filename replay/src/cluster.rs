//! The inventory a replay runs on: nodes with GPUs of a model, CPUs and memory, registered in
//! the state machine as real nodes register.

use anyhow::{bail, Context};
use corral_state::ClusterState;
use proto::{Command, CommandResult, GpuInfo, InstanceId, Inventory, NodeId};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub gpus: u32,
    /// The GRES type jobs name (`h100`, `v100m32`).
    pub gres_type: String,
    pub cpus: u32,
    pub mem_mib: u64,
    /// Shards of each GPU (`shards_per_gpu`; 0: no GPU is shared).
    pub shards_per_gpu: u32,
    /// When not empty, one layout per GPU: every GPU is an A100 80GB in MIG mode with these
    /// instances (an empty layout: none yet), as `crate::mig` replays it.
    pub mig_layouts: Vec<Vec<String>>,
}

/// `count` nodes of `gpus` (`TYPE:N`, as `--gpus h100:8`), each with `cpus` and `mem_mib`.
pub fn uniform(count: u32, gpus: &str, cpus: u32, mem_mib: u64) -> anyhow::Result<Vec<NodeSpec>> {
    let Some((gres_type, n)) = gpus.split_once(':') else { bail!("--gpus takes TYPE:N, as h100:8, not '{gpus}'") };
    let n: u32 = n.parse().with_context(|| format!("read the GPU count of '{gpus}'"))?;
    if gres_type.is_empty() || n > scheduler::GPUS_PER_NODE_MAX as u32 {
        bail!("--gpus takes TYPE:N with N at most {}, not '{gpus}'", scheduler::GPUS_PER_NODE_MAX);
    }
    Ok((1..=count)
        .map(|i| NodeSpec {
            name: format!("n{i:04}"),
            gpus: n,
            gres_type: gres_type.to_ascii_lowercase(),
            cpus,
            mem_mib,
            shards_per_gpu: 0,
            mig_layouts: Vec::new(),
        })
        .collect())
}

/// An FGD/openb node list (`sn,cpu_milli,memory_mib,gpu,model`), each GPU with
/// `shards_per_gpu` shards, CPUs in units of `cpu_unit_milli` thousandths of a core (rounded
/// down; 1000: whole cores, as Slurm and Corral count them).
pub fn openb_nodes(text: &str, shards_per_gpu: u32, cpu_unit_milli: u32) -> anyhow::Result<Vec<NodeSpec>> {
    let mut rows = crate::trace::Csv::new(text, &["sn", "cpu_milli", "memory_mib", "gpu", "model"])?;
    let mut nodes = Vec::new();
    while let Some(r) = rows.next_row()? {
        nodes.push(NodeSpec {
            name: r.get(0).to_string(),
            cpus: (r.num(1)? / f64::from(cpu_unit_milli.max(1))) as u32,
            mem_mib: r.num(2)? as u64,
            gpus: r.num(3)? as u32,
            gres_type: r.get(4).to_ascii_lowercase(),
            shards_per_gpu,
            mig_layouts: Vec::new(),
        });
    }
    Ok(nodes)
}

fn inventory(spec: &NodeSpec) -> Inventory {
    if !spec.mig_layouts.is_empty() {
        let gpus = spec.mig_layouts.iter().enumerate().map(|(i, l)| crate::mig::gpu(&spec.name, i as u32, l)).collect();
        return Inventory { gpus, cpus: spec.cpus, memory_mib: spec.mem_mib, ..Inventory::default() };
    }
    Inventory {
        gpus: (0..spec.gpus)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{}-{i}", spec.name),
                model: gpu_model_name(&spec.gres_type).to_string(),
                gres_type: spec.gres_type.clone(),
                memory_mib: if spec.gres_type == "h100" { 81_559 } else { 32_768 },
                healthy: true,
                shards: spec.shards_per_gpu,
                ..GpuInfo::default()
            })
            .collect(),
        cpus: spec.cpus,
        memory_mib: spec.mem_mib,
        // The GPU model as a feature too: a job allowing several asks `--constraint=a|b`.
        features: vec![spec.gres_type.clone()],
        ..Inventory::default()
    }
}

/// The model name a GPU of this GRES type reports (what MIG support is read from).
fn gpu_model_name(gres_type: &str) -> &str {
    match gres_type {
        "h100" => "NVIDIA H100 80GB HBM3",
        "a100" => "NVIDIA A100-SXM4-80GB",
        other => other,
    }
}

/// Registers `nodes` through `Command::RegisterNode`, as each node's first registration does;
/// returns each node's id and instance, in order.
pub fn register(state: &mut ClusterState, nodes: &[NodeSpec]) -> anyhow::Result<Vec<(NodeId, InstanceId)>> {
    let mut ids = Vec::with_capacity(nodes.len());
    for (i, spec) in nodes.iter().enumerate() {
        let instance = i as InstanceId + 1;
        let cmd = Command::RegisterNode {
            name: spec.name.clone(),
            addr: format!("{}:7100", spec.name),
            inventory: inventory(spec),
            instance,
            cert_fingerprint: String::new(),
            now_ms: 0,
        };
        match state.apply(&cmd) {
            CommandResult::NodeRegistered { id } => ids.push((id, instance)),
            other => bail!("register node {}: {other:?}", spec.name),
        }
    }
    Ok(ids)
}
