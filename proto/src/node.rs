//! Nodes as the cluster knows them: GPUs and their MIG instances, the topology and network
//! location of a node, its inventory, state and role, its record in the log, and join tokens.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::SchedulerPolicy;
use crate::{InstanceId, NodeId};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index of the GPU on its node (as `nvidia-smi` numbers them).
    pub index: u32,
    pub uuid: String,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    /// GRES type used in requests, e.g. `h100`.
    pub gres_type: String,
    pub memory_mib: u64,
    /// e.g. `00000000:19:00.0`.
    pub pci_bus_id: String,
    pub numa_node: Option<u32>,
    /// e.g. `9.0`.
    pub compute_capability: Option<String>,
    pub mig_enabled: bool,
    /// MIG instances that exist now (each is schedulable as its own GRES, e.g. `1g.18gb`).
    pub mig: Vec<MigInstance>,
    /// False once the GPU reported an XID, uncorrectable ECC error or fell off the bus.
    pub healthy: bool,
    pub health_reason: Option<String>,
    /// Slurm's `gres/shard` count of this GPU (`shards_per_gpu`): that many jobs' shards may
    /// share it while no job holds it whole. 0: not shared; never in MIG mode.
    pub shards: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInstance {
    pub uuid: String,
    /// Profile name, e.g. `1g.18gb`; also its GRES type.
    pub profile: String,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// First memory slice and number of slices it occupies.
    pub start_slice: u32,
    pub size_slices: u32,
    pub memory_mib: u64,
}

/// How two GPUs (or a GPU and a NIC) are connected, best first, as `nvidia-smi topo -m` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Link {
    /// The same device.
    X,
    /// NVLink with this many bonded links (`NV18`).
    NvLink(u8),
    /// At most one PCIe switch in between (`PIX`).
    Pix,
    /// Several PCIe switches, no host bridge (`PXB`).
    Pxb,
    /// Through a PCIe host bridge (`PHB`).
    Phb,
    /// Between host bridges of one NUMA node (`NODE`).
    Node,
    /// Across NUMA nodes (`SYS`).
    Sys,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    /// e.g. `mlx5_0` or `eth0`.
    pub name: String,
    pub infiniband: bool,
    pub numa_node: Option<u32>,
    /// Network interface carrying it, for NCCL_SOCKET_IFNAME (`ib0`, `eth0`).
    pub netdev: Option<String>,
}

/// Inside a node: GPU-to-GPU links, NUMA domains and NICs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// `links[i][j]`: link between GPU index i and j; empty when unknown.
    pub gpu_links: Vec<Vec<Link>>,
    /// CPU ids of each NUMA node.
    pub numa_cpus: BTreeMap<u32, Vec<u32>>,
    pub nics: Vec<Nic>,
}

/// Where a node sits in the network, for placing gangs on the fewest switch hops.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NetworkLocation {
    pub block: Option<String>,
    pub rack: Option<String>,
    /// Leaf switch.
    pub switch: Option<String>,
    /// An NVLink domain spanning nodes (e.g. an NVL72 rack).
    pub nvlink_domain: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
    pub cpus: u32,
    pub memory_mib: u64,
    pub topology: Topology,
    pub location: NetworkLocation,
    /// Node features matched by `--constraint`.
    pub features: Vec<String>,
    /// Partitions this node belongs to (empty: the default partition only).
    pub partitions: Vec<String>,
}

/// Whether two MIG layouts hold the same instances, wherever on the GPU each starts (a GPU's
/// driver may place them otherwise than the search that checked the layout).
pub fn same_mig_layout<A: AsRef<str>, B: AsRef<str>>(a: &[A], b: &[B]) -> bool {
    let mut a: Vec<&str> = a.iter().map(AsRef::as_ref).collect();
    let mut b: Vec<&str> = b.iter().map(AsRef::as_ref).collect();
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

impl Inventory {
    /// GPU `gpu`'s MIG layout as it is: its instances' profiles by start slice; `None` for a
    /// GPU this node lacks or one not in MIG mode.
    /// The start slices of `mig_layout(gpu)`'s instances.
    pub fn mig_start_slices(&self, gpu: u32) -> Option<Vec<u32>> {
        let g = self.gpus.iter().find(|g| g.index == gpu && g.mig_enabled)?;
        let mut starts: Vec<u32> = g.mig.iter().map(|m| m.start_slice).collect();
        starts.sort_unstable();
        Some(starts)
    }

    pub fn mig_layout(&self, gpu: u32) -> Option<Vec<String>> {
        let g = self.gpus.iter().find(|g| g.index == gpu && g.mig_enabled)?;
        let mut instances: Vec<&MigInstance> = g.mig.iter().collect();
        instances.sort_by_key(|m| m.start_slice);
        Some(instances.into_iter().map(|m| m.profile.clone()).collect())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeState {
    Up,
    Down,
    Drained,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "UP",
            NodeState::Down => "DOWN",
            NodeState::Drained => "DRAINED",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRole {
    Leader,
    Voter,
    Agent,
}

impl NodeRole {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeRole::Leader => "leader",
            NodeRole::Voter => "voter",
            NodeRole::Agent => "agent",
        }
    }
}

/// A change of a node's state, as the replicated state remembers the last
/// [`NODE_EVENTS_MAX`] of them (the web UI's cluster view).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEvent {
    pub at_ms: u64,
    pub node: String,
    /// `joined`, `up`, `down`, `stopped`, `drained`, `resumed`, `gpu unhealthy`, `gpu healthy`.
    pub what: String,
    pub reason: String,
}

/// Node events the replicated state keeps (oldest dropped first).
pub const NODE_EVENTS_MAX: usize = 256;

/// A node as the replicated state knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: NodeId,
    pub name: String,
    /// QUIC address other nodes and clients use, `host:port`.
    pub addr: String,
    /// Shared, so a reader can tell an unchanged inventory by pointer (the leader's cache of
    /// scheduler views): every change replaces it or goes through `Arc::make_mut`.
    pub inventory: std::sync::Arc<Inventory>,
    pub state: NodeState,
    /// Set by `Drain`, cleared by `Resume`; survives DOWN/UP.
    pub drained: bool,
    pub instance: InstanceId,
    pub state_reason: Option<String>,
    pub registered_ms: u64,
    pub state_changed_ms: u64,
    /// SHA-256 of the certificate the node joined with, as the TLS handshake showed it.
    pub cert_fingerprint: String,
    /// MIG layouts an operator set (`corral mig set`), by GPU index: profiles by start slice.
    /// A GPU whose layout differs takes no new work and is re-partitioned once idle; the
    /// demand-driven relayout leaves a pinned GPU alone.
    pub mig_pinned: BTreeMap<u32, Vec<String>>,
}

impl NodeRecord {
    /// The GPUs whose pinned layout is not the one they have: drained until re-partitioned.
    pub fn mig_pins_unapplied(&self) -> impl Iterator<Item = (u32, &[String])> + '_ {
        self.mig_pinned
            .iter()
            .filter(|(gpu, pinned)| self.inventory.mig_layout(**gpu).is_some_and(|now| !same_mig_layout(&now, pinned)))
            .map(|(gpu, pinned)| (*gpu, pinned.as_slice()))
    }
}

/// A join token in the log: only the hash of its secret is kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTokenRecord {
    pub id: u64,
    /// SHA-256 of the secret, lowercase hex.
    pub secret_sha256: String,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub created_by: String,
    pub revoked: bool,
}

/// A node as `corral nodes` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    pub name: String,
    pub addr: String,
    pub state: NodeState,
    pub role: NodeRole,
    pub gpus_total: u32,
    pub gpus_free: u32,
    pub gpu_types: Vec<String>,
    pub cpus_total: u32,
    /// CPUs the jobs running there hold.
    pub cpus_alloc: u32,
    pub memory_mib: u64,
    pub memory_alloc_mib: u64,
    pub reason: Option<String>,
    /// GPUs marked unhealthy, with why.
    pub unhealthy_gpus: Vec<(u32, String)>,
    pub cert_fingerprint: String,
    /// Partitions the node is in (its node.toml's, else the default; a partition with `Nodes=`
    /// in the policy has exactly those): see [`SchedulerPolicy::partitions_of_node`]. Empty:
    /// in none.
    pub partitions: Vec<String>,
    /// Its MIG-mode GPUs: the layout each has and the one an operator pinned, if any.
    pub mig: Vec<MigGpuInfo>,
    /// In an admin's reservation now (`resv` in sinfo); `maint`: one with `Flags=MAINT`.
    pub reserved: bool,
    pub maint: bool,
}

/// A MIG-mode GPU as `corral mig show` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigGpuInfo {
    pub gpu: u32,
    /// Its instances' profiles by start slice, as the node last reported them.
    pub layout: Vec<String>,
    /// The start slice of each instance of `layout`.
    pub start_slices: Vec<u32>,
    /// The layout `corral mig set` pinned it to; `None`: the demand-driven relayout decides.
    pub pinned: Option<Vec<String>>,
}
