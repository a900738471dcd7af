//! Wire and log types only: ids, job and node records, the replicated `Command`, client and peer
//! requests, and the one codec that turns them into bytes. No IO, no clock, no async: serde and a
//! size-checked, versioned postcard encoding, nothing more.
//!
//! The modules, each re-exported here (every type is `proto::X`):
//! - `node`: GPUs and MIG instances, a node's topology, inventory, state, role and record, join
//!   tokens, and a node as `corral nodes` shows it.
//! - `spec`: what a submitter asks for ([`JobSpec`] and its parts), its defaults and its
//!   validation.
//! - `job`: a job in the replicated state ([`Job`], [`JobState`]), its runs, their parts and
//!   outcomes, its usage, suspensions and step records.
//! - `step`: job steps ([`StepSpec`] and its validation), their tasks' output, usage and exits.
//! - `policy`: the replicated scheduling policy (partitions, QoS) and its validation.
//! - `partition`: a partition's state and one edit of the policy's partitions.
//! - `accounts`: the accounting database (`sacctmgr`) and its limits.
//! - `array`: a job array's task ids as runs of ranges.
//! - `command`: the replicated log's [`Command`] and [`CommandResult`], and the bounds on batches.
//! - `request`: [`Request`], a client's ([`ClientRequest`]) or a node's ([`PeerRequest`]), its
//!   [`Envelope`], the payloads only requests carry, and which requests need the leader.
//! - `access`: who may send each request.
//! - `reply`: [`Reply`], its payloads, and [`Response`].
//! - `error`: [`ApiError`], why a request was refused.
//! - `limits`: bounds on everything that crosses the wire.
//! - `codec`: the one encoding of every message and log entry.
//! - `fuzzing`: entry points of the fuzz targets.

mod access;
pub mod accounts;
mod array;
pub mod codec;
mod command;
mod error;
pub mod fuzzing;
mod job;
pub mod limits;
mod node;
mod partition;
mod policy;
mod reply;
mod request;
mod reservation;
pub mod slot;
mod spec;
mod step;
mod store;

pub use access::Access;
pub use accounts::{AccountsEdit, Limits};
pub use array::{ArraySpec, TaskRun};
pub use codec::{decode, encode, CodecError};
pub use command::{Command, CommandResult, Placement, ARCHIVE_BATCH_MAX, BATCH_BYTES_MAX, BATCH_COMMANDS_MAX};
pub use error::ApiError;
pub use job::{
    Allocation, ArrayTask, GpuUsage, Job, JobState, NodeRun, Repair, RunOutcome, StepRecord, Suspension, MASTER_PORT_COUNT,
    MASTER_PORT_FIRST, REASON_NEVER_PREFIX, REPAIRS_KEPT, REPAIR_REASON_BYTES_MAX, REQUEUED_ON_REQUEST,
};
pub use node::{
    same_mig_layout, GpuInfo, Inventory, JoinTokenRecord, Link, MigGpuInfo, MigInstance, NetworkLocation, Nic, NodeEvent, NodeInfo,
    NodeRecord, NodeRole, NodeState, Topology, NODE_EVENTS_MAX,
};
pub use partition::{PartitionAccess, PartitionChanges, PartitionEdit, PartitionState, ACCESS_LIST_MAX};
pub use policy::{
    PartitionDef, QosDef, SchedulerPolicy, DECAY_HALF_LIFE_MIN_DEFAULT, DECAY_HALF_LIFE_MIN_MAX, DEFAULT_PARTITION, DEFAULT_QOS,
};
pub use reply::{
    ClusterInfo, ClusterMember, GpuNow, GpuPoint, Reply, Response, EXPECTED_STARTS_MAX, GPU_POINTS_MAX, GPU_SAMPLES_MAX, QUEUE_ROWS_MAX,
};
pub use request::{
    Beat, ClientRequest, Envelope, JobQuery, PeerRequest, RaftRpcKind, Request, RunReport, FORWARD_HOPS_MAX, HEARTBEATS_PER_REQUEST_MAX,
    JOB_PAGE_MAX, JOB_PAGE_SCAN_MAX, LOG_OFFSET_TAIL, REPORTS_PER_REQUEST_MAX,
};
pub use reservation::{AdminReservation, ReservationChanges, ReservationEdit, ADMIN_RESERVATIONS_MAX, RESERVATION_NAMES_MAX};
pub use spec::{
    feature_matches, Dependency, DependencyKind, GresKind, GresRequest, JobSpec, PreflightSpec, SignalSpec, DEF_MEM_PER_CPU_MIB,
    DEF_MEM_PER_GPU_MIB, RDZV_ENDPOINT_CORRAL, SPARE_NODES_MAX, SPEC_EXTRA_BATCH, SPEC_EXTRA_NODES_MAX, SPEC_EXTRA_NO_REQUEUE,
    SPEC_EXTRA_RDZV_ENDPOINT, SPEC_EXTRA_RESERVATION, SPEC_EXTRA_SPARE_NODES, SPEC_EXTRA_SRUN,
};
pub use step::{
    LogStream, PtySize, StepChunk, StepEnd, StepMemory, StepNode, StepSpec, StepStdin, TaskExit, TaskUsage, STEPS_DISABLED_SUSPENDED,
    STEP_ENDS_PER_REQUEST_MAX, STEP_PORT_COUNT, STEP_PORT_FIRST, TASK_USAGES_MAX,
};
pub use store::{
    StoreAnswer, StoreOp, STORE_BYTES_MAX, STORE_BYTES_PER_JOB_MAX, STORE_CLIENTS_PER_JOB_MAX, STORE_KEYS_PER_JOB_MAX,
    STORE_KEYS_PER_OP_MAX, STORE_KEY_BYTES_MAX, STORE_VALUE_BYTES_MAX,
};

/// Bumped on any incompatible change to a type in this crate or to the replicated state
/// (`state::ClusterState`, in snapshots). The first byte of every encoded message; a peer
/// speaking another version is refused with a clear error.
pub const PROTOCOL_VERSION: u8 = 24;

pub type NodeId = u64;
pub type JobId = u64;
/// Each start of a job is a run, numbered from 1. Reports from an older run are ignored.
pub type RunNo = u32;
/// A random id chosen by each `corrald` process at start. A job launched by one instance of a
/// node cannot be supervised by a later one.
pub type InstanceId = u64;
