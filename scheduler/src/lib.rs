//! Pure placement: no IO, no clock, no randomness. No async either. The same `ClusterView` and
//! `now_ms` give the same `Plan` on every node and in every test (ordered maps, stable
//! tie-breaks by id).
//!
//! The leader builds a [`ClusterView`] from its replicated state ([`node_view`] per node,
//! [`NodeView::take`] for every part that holds resources, [`job_request`] per job), calls
//! [`schedule`] and commits the plan; `ClusterState::apply` re-checks every placement with
//! [`fits_gang`] and rejects the stale ones, like Nomad's plan applier.
//!
//! Modules: [`mig`] (profile tables and layout planner), [`topo`] (GPUs, CPUs and NIC inside a
//! node), [`priority`] (multifactor priority), [`fairshare`] (Fair Tree on decayed usage), [`wall`] (`GrpWall`: wall-clock time used against it), [`steps`] (a step's share of its job's resources on a node), [`testkit`] (cluster builders for tests and the
//! benchmark). The pass itself is in `engine`.

mod engine;
pub mod fairshare;
mod fit;
mod format;
mod frag;
mod limits;
pub mod mig;
mod need;
pub mod priority;
pub mod steps;
pub mod testkit;
pub mod topo;
mod units;
mod view;
pub mod wall;
mod windows;

pub use engine::{schedule, ArrayTaskStart, Binding, Plan, Reservation, Room, NEVER, PACED};
pub use fit::{fits, fits_gang, is_mig_profile, never_holds};
pub use format::{fmt_duration_ms, fmt_time_ms};
pub use need::{Misfit, PerNode};
pub use view::{
    cpu_shares, decode_slot, job_request, job_request_current, mig_slot, node_view, shard_slot, ClusterView, GpuSlot, JobRequest, MigSlot,
    NodeView, NumaView, Partition, PreemptAction, PriorityWeights, Qos, SchedulerConfig, Slot, GPUS_PER_NODE_MAX, MIG_SLOT_BASE,
    SHARD_SLOT_BASE,
};
