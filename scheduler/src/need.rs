//! What a job needs of each node of its gang ([`PerNode`]), and why a placement does not fit
//! ([`Misfit`]): the words `view` and `fit` both speak.

use std::fmt;

use proto::{JobSpec, NodeId};

/// Why a placement does not fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Misfit {
    NodeUnavailable,
    WrongNode {
        want: NodeId,
        got: NodeId,
    },
    NotInPartition(String),
    MissingFeature(String),
    Excluded(String),
    NotInNodelist(String),
    /// An exclusive job needs a node nothing else holds.
    NotIdle,
    UnknownGpu(u32),
    GpuBusy(u32),
    /// Fewer shards of the GPU free than asked, or the GPU held whole.
    Shards {
        gpu: u32,
        want: u32,
        free: u32,
    },
    /// A shard job is given shards of exactly one GPU per node.
    WrongShards {
        want: u32,
    },
    GpuUnhealthy(u32),
    /// Pinned to a MIG layout it does not have yet (`corral mig set`): drained until relaid.
    MigRelayout(u32),
    /// A GPU in MIG mode is handed out by instance only.
    GpuInMigMode(u32),
    WrongGpuType {
        index: u32,
        want: String,
        have: String,
    },
    DuplicateGpu(u32),
    WrongGpuCount {
        want: u32,
        got: u32,
    },
    UnknownMig {
        gpu: u32,
        start_slice: u32,
    },
    MigBusy {
        gpu: u32,
        start_slice: u32,
    },
    WrongMigProfile {
        gpu: u32,
        start_slice: u32,
        want: String,
        have: String,
    },
    /// The allocation gives fewer CPUs or less memory than the job asks.
    Short {
        cpus: u32,
        mem_mib: u64,
    },
    Cpus {
        want: u32,
        free: u32,
    },
    Memory {
        want_mib: u64,
        free_mib: u64,
    },
    /// A node count outside the job's range (`want..=want_max`; one number without a range).
    WrongNodeCount {
        want: u32,
        want_max: u32,
        got: u32,
    },
    DuplicateNode(NodeId),
    UnknownNode(NodeId),
    MissingRequiredNode(String),
    OnNode {
        node: NodeId,
        misfit: Box<Misfit>,
    },
}

impl fmt::Display for Misfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Misfit::NodeUnavailable => write!(f, "node is not up"),
            Misfit::WrongNode { want, got } => write!(f, "allocation names node {got}, checked against node {want}"),
            Misfit::NotInPartition(p) => write!(f, "node is not in partition {p}"),
            Misfit::MissingFeature(feat) => write!(f, "node lacks feature {feat}"),
            Misfit::Excluded(n) => write!(f, "node {n} is excluded"),
            Misfit::NotInNodelist(n) => write!(f, "node {n} is not in the node list"),
            Misfit::NotIdle => write!(f, "exclusive job needs an idle node"),
            Misfit::UnknownGpu(i) => write!(f, "gpu {i} does not exist"),
            Misfit::GpuBusy(i) => write!(f, "gpu {i} is busy"),
            Misfit::Shards { gpu, want, free } => write!(f, "needs {want} shards of gpu {gpu}, {free} free"),
            Misfit::WrongShards { want: 0 } => write!(f, "asks no shards, plan gives some"),
            Misfit::WrongShards { want } => write!(f, "needs {want} shards of one gpu"),
            Misfit::GpuUnhealthy(i) => write!(f, "gpu {i} is unhealthy"),
            Misfit::MigRelayout(i) => {
                write!(f, "gpu {i} waits to be re-partitioned into a new MIG layout (an operator's, or one being applied)")
            }
            Misfit::GpuInMigMode(i) => write!(f, "gpu {i} is in MIG mode"),
            Misfit::WrongGpuType { index, want, have } => write!(f, "gpu {index} is {have}, not {want}"),
            Misfit::DuplicateGpu(i) => write!(f, "gpu {i} listed twice"),
            Misfit::WrongGpuCount { want, got } => write!(f, "needs {want} gpus, plan gives {got}"),
            Misfit::UnknownMig { gpu, start_slice } => write!(f, "gpu {gpu} has no MIG instance at slice {start_slice}"),
            Misfit::MigBusy { gpu, start_slice } => write!(f, "MIG instance at slice {start_slice} of gpu {gpu} is busy"),
            Misfit::WrongMigProfile { gpu, start_slice, want, have } => {
                write!(f, "MIG instance at slice {start_slice} of gpu {gpu} is {have}, not {want}")
            }
            Misfit::Short { cpus, mem_mib } => write!(f, "allocation gives less than the job asks ({cpus} cpus, {mem_mib} MiB)"),
            Misfit::Cpus { want, free } => write!(f, "needs {want} cpus, {free} free"),
            Misfit::Memory { want_mib, free_mib } => write!(f, "needs {want_mib} MiB, {free_mib} MiB free"),
            Misfit::WrongNodeCount { want, want_max, got } if want_max > want => {
                write!(f, "needs {want}-{want_max} nodes, plan gives {got}")
            }
            Misfit::WrongNodeCount { want, got, .. } => write!(f, "needs {want} nodes, plan gives {got}"),
            Misfit::DuplicateNode(n) => write!(f, "node {n} listed twice"),
            Misfit::UnknownNode(n) => write!(f, "node {n} does not exist"),
            Misfit::MissingRequiredNode(n) => write!(f, "required node {n} is not in the plan"),
            Misfit::OnNode { node, misfit } => write!(f, "node {node}: {misfit}"),
        }
    }
}

impl std::error::Error for Misfit {}

/// What each node of a job's gang holds for it, from its spec (as [`crate::job_request`] takes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PerNode {
    pub nodes: u32,
    pub gpus: u32,
    pub cpus: u32,
    pub mem_mib: u64,
}

impl PerNode {
    pub fn of(spec: &JobSpec) -> PerNode {
        PerNode {
            // Spares are held as the gang's own nodes (`JobSpec::spare_nodes`).
            nodes: spec.nodes.max(1).saturating_add(spec.spare_nodes()),
            gpus: spec.gpus(),
            cpus: spec.cpus_per_task.saturating_mul(spec.ntasks_per_node.max(1)),
            mem_mib: spec.mem_mib,
        }
    }
}
