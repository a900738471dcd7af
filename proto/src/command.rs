//! The replicated log: every change to the cluster state is a [`Command`] committed through Raft,
//! answered by a [`CommandResult`]; with the bounds on batches and archive lists.

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use crate::accounts;
use crate::{
    AccountsEdit, Allocation, GpuUsage, InstanceId, Inventory, JobId, JobSpec, NodeId, PartitionEdit, ReservationEdit, RunNo, RunOutcome,
    SchedulerPolicy, StoreAnswer, StoreOp,
};

/// One placement of a plan: job `job`, run `run`, on one allocation per node (a gang).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub job: JobId,
    pub run: RunNo,
    pub allocs: Vec<Allocation>,
}

/// Every change to the cluster state is one of these, committed through Raft. Time travels
/// inside the command (`now_ms`, stamped by the leader) so applying it is deterministic.
// A message decoded once per request or log entry and moved rarely: boxing the large variants
// would buy nothing but indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    RegisterNode {
        name: String,
        addr: String,
        inventory: Inventory,
        instance: InstanceId,
        cert_fingerprint: String,
        now_ms: u64,
    },
    /// A join token that enrols nodes until `expires_ms` unless revoked.
    AddJoinToken {
        secret_sha256: String,
        expires_ms: u64,
        created_by: String,
        now_ms: u64,
    },
    RevokeJoinToken {
        id: u64,
        now_ms: u64,
    },
    /// A certificate no node accepts any more; with `node`, every certificate of that node
    /// name (its renewals too).
    RevokeCert {
        fingerprint: String,
        node: Option<String>,
        reason: String,
        now_ms: u64,
    },
    /// A node heartbeats again, or with a new instance.
    NodeUp {
        node: NodeId,
        instance: InstanceId,
        now_ms: u64,
    },
    NodeDown {
        node: NodeId,
        reason: String,
        now_ms: u64,
    },
    Drain {
        node: NodeId,
        reason: String,
        now_ms: u64,
    },
    Resume {
        node: NodeId,
        now_ms: u64,
    },
    Submit {
        spec: JobSpec,
        now_ms: u64,
    },
    /// Placements chosen by the scheduler; apply re-checks each and rejects the stale ones.
    /// `array_tasks`: (index into `placements`, task id) for placements that start a task of
    /// an array (the placement names the array job).
    Plan {
        placements: Vec<Placement>,
        array_tasks: Vec<(u32, u32)>,
        now_ms: u64,
    },
    LaunchConfirmed {
        job: JobId,
        run: RunNo,
        node: NodeId,
        instance: InstanceId,
        now_ms: u64,
    },
    RunFinished {
        job: JobId,
        run: RunNo,
        node: NodeId,
        outcome: RunOutcome,
        /// GPU usage the node sampled for this part.
        usage: GpuUsage,
        now_ms: u64,
    },
    Cancel {
        job: JobId,
        now_ms: u64,
    },
    /// End a running job TIMEOUT (its parts are then stopped) for `reason`: the leader found
    /// the wall-clock time of its association or QoS used up (`GrpWall`).
    TimeOut {
        job: JobId,
        reason: String,
        now_ms: u64,
    },
    /// Stop a running job and put it back in the queue (keeps its id, counts a restart).
    Requeue {
        job: JobId,
        reason: String,
        now_ms: u64,
    },
    /// Replace the scheduling policy (partitions, QoS).
    SetPolicy {
        policy: SchedulerPolicy,
        now_ms: u64,
    },
    /// Create, change or delete one partition of the policy (`scontrol create|update|delete
    /// PartitionName=`), checked against the state it is applied to.
    EditPartition {
        edit: PartitionEdit,
        now_ms: u64,
    },
    /// Create, change or delete one reservation (`scontrol create|update|delete reservation`),
    /// checked against the state it is applied to.
    EditReservation {
        edit: ReservationEdit,
        now_ms: u64,
    },
    /// Change a pending job: hold or release it, its time limit, its partition.
    UpdateJob {
        job: JobId,
        hold: Option<bool>,
        time_limit_ms: Option<Option<u64>>,
        partition: Option<Option<String>>,
        now_ms: u64,
    },
    /// `sacctmgr add|modify|delete`: changes to the accounts, users, associations and QoS,
    /// applied all or none ([`accounts::Accounts::edit`]).
    EditAccounts {
        edits: Vec<AccountsEdit>,
        now_ms: u64,
    },
    /// `scontrol suspend` (`suspend: true`) or `resume` of a running job.
    Suspend {
        job: JobId,
        suspend: bool,
        now_ms: u64,
    },
    /// A step of a running job's run `run` was created (before its tasks start, as slurmctld
    /// records a step): its record for accounting.
    StepStarted {
        job: JobId,
        run: RunNo,
        step: u32,
        name: String,
        nodes: Vec<String>,
        ntasks: u32,
        now_ms: u64,
    },
    /// Every task of step `step` on node `node` ended, the highest exit code and a killing
    /// signal among them.
    StepEnded {
        job: JobId,
        run: RunNo,
        step: u32,
        node: String,
        exit_code: i32,
        signal: Option<i32>,
        now_ms: u64,
    },
    /// A GPU (or one MIG instance of it) turned unhealthy, or an operator marked it healthy.
    GpuHealth {
        node: NodeId,
        gpu: u32,
        mig_uuid: Option<String>,
        healthy: bool,
        reason: String,
        now_ms: u64,
    },
    /// The node's inventory changed (e.g. a MIG layout was applied to an idle GPU).
    UpdateInventory {
        node: NodeId,
        inventory: Inventory,
        reason: String,
        now_ms: u64,
    },
    /// An operator pins GPU `gpu` of `node` to a MIG layout (profiles by start slice), or with
    /// `None` gives it back to the demand-driven relayout. Checked in apply against the GPU's
    /// model: an impossible layout is rejected with the hardware's limit.
    PinMigLayout {
        node: NodeId,
        gpu: u32,
        profiles: Option<Vec<String>>,
        now_ms: u64,
    },
    /// Move these finished jobs (final, holding nothing) out of the hot state into the
    /// accounting store. The leader names them (older than its `min_job_age_s`); apply skips
    /// any that is not final or still holds a part, so a stale list is harmless.
    ArchiveJobs {
        jobs: Vec<JobId>,
        now_ms: u64,
    },
    /// Delete these records from the accounting store (past `accounting_retention_days`).
    /// Named by the leader, so replaying the command deletes exactly the same records.
    PruneAccounting {
        jobs: Vec<JobId>,
        now_ms: u64,
    },
    /// Several commands in one log entry, applied in order, each as if alone; its result is
    /// `CommandResult::Batch` with one result per command. The leader batches what is queued
    /// when an entry is proposed (group commit: under load one entry, one fsync, one apply
    /// call carry many submissions, launch confirmations and run ends). Only
    /// [`Command::batchable`] commands, at most [`BATCH_COMMANDS_MAX`]; otherwise the whole
    /// batch is rejected and nothing applied.
    Batch {
        commands: Vec<Command>,
    },
    /// Instance `instance` of `node` stopped gracefully (SIGTERM): it stopped and reported
    /// every run it had and refuses launches from now on, so the node is down at once (the
    /// runs the cluster still places there, whose launch had not arrived, are lost and
    /// `--requeue` ones queued again) and the instance is retired (a late heartbeat of it
    /// brings nothing back). Rejected for any other instance.
    NodeStopped {
        node: NodeId,
        instance: InstanceId,
        now_ms: u64,
    },
    /// A write to the rendezvous store of `job`'s run `run` (a [`StoreOp`] that
    /// [`StoreOp::writes`]); rejected unless that run is running. The first write of a new run
    /// empties what an earlier run left. `write`: (client, sequence number) of the write; one
    /// sent again (its answer lost in a failover) is answered as the first and not applied twice.
    Store {
        job: JobId,
        run: RunNo,
        op: StoreOp,
        write: (u64, u64),
        now_ms: u64,
    },
}

/// Jobs named by one `ArchiveJobs` or `PruneAccounting` command at most.
pub const ARCHIVE_BATCH_MAX: usize = 4096;
/// Commands in one `Command::Batch` at most.
pub const BATCH_COMMANDS_MAX: usize = 512;
/// What the leader puts in one batch at most, by [`Command::weight_bytes`] (a bound on the
/// entry, whatever the specs carry).
pub const BATCH_BYTES_MAX: usize = 4 << 20;

impl Command {
    /// Commands that may go in a `Batch`: those whose effects are the hot state's alone (not
    /// the accounting store's, not the membership's): the per-job ones, and a node found down
    /// or back (a crowd of them is one entry, not one each).
    pub fn batchable(&self) -> bool {
        matches!(
            self,
            Command::Submit { .. }
                | Command::NodeDown { .. }
                | Command::NodeUp { .. }
                | Command::LaunchConfirmed { .. }
                | Command::RunFinished { .. }
                | Command::Cancel { .. }
                | Command::TimeOut { .. }
                | Command::Requeue { .. }
                | Command::UpdateJob { .. }
                | Command::Suspend { .. }
                | Command::StepStarted { .. }
                | Command::StepEnded { .. }
                | Command::Store { .. }
        )
    }

    /// Whether the command only submits jobs (a `Submit`, or a `Batch` of them): it frees
    /// nothing and changes no job or node already there.
    pub fn submits_only(&self) -> bool {
        match self {
            Command::Submit { .. } => true,
            Command::Batch { commands } => commands.iter().all(|c| matches!(c, Command::Submit { .. })),
            _ => false,
        }
    }

    /// A bound on the command's encoded size, cheap to compute: what a submission carries
    /// (script, environment, arguments) plus a fixed allowance for the rest.
    pub fn weight_bytes(&self) -> usize {
        const FIXED_BYTES: usize = 4096;
        match self {
            Command::Submit { spec, .. } => {
                let env: usize = spec.env.iter().map(|(k, v)| k.len() + v.len() + 8).sum();
                let argv: usize = spec.argv.iter().map(|a| a.len() + 4).sum();
                FIXED_BYTES + spec.script.as_ref().map_or(0, |s| s.len()) + env + argv
            }
            Command::Store { op, .. } => FIXED_BYTES + op.weight_bytes(),
            _ => FIXED_BYTES,
        }
    }
}

/// What applying a command answered, returned to the proposer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    Ok,
    NodeRegistered {
        id: NodeId,
    },
    Submitted {
        job: JobId,
    },
    /// Jobs of the plan that were placed, and those rejected with the reason.
    Planned {
        accepted: Vec<JobId>,
        rejected: Vec<(JobId, String)>,
    },
    /// The command was valid on the wire but not in the current state (e.g. cancel of an
    /// unknown job). Nothing changed.
    Rejected(String),
    /// A reservation was made under this name.
    ReservationMade {
        name: String,
    },
    /// One result per command of a `Command::Batch`, in order.
    Batch(Vec<CommandResult>),
    /// What a `Command::Store` answered.
    Store(StoreAnswer),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submit(script_bytes: usize) -> Command {
        let mut spec = JobSpec::command(vec!["/bin/true".into()], "/tmp", "alice");
        spec.script = Some("#".repeat(script_bytes));
        Command::Submit { spec, now_ms: 1 }
    }

    #[test]
    fn only_hot_state_commands_batch_and_a_batch_of_submits_submits_only() {
        assert!(submit(0).batchable());
        assert!(Command::NodeDown { node: 1, reason: "gone".into(), now_ms: 1 }.batchable());
        assert!(!Command::ArchiveJobs { jobs: vec![1], now_ms: 1 }.batchable(), "the accounting store's");
        assert!(!Command::Batch { commands: vec![] }.batchable(), "batches do not nest");
        assert!(!Command::SetPolicy { policy: SchedulerPolicy::default(), now_ms: 1 }.batchable());

        assert!(submit(0).submits_only());
        assert!(Command::Batch { commands: vec![submit(0), submit(1)] }.submits_only());
        assert!(!Command::Batch { commands: vec![submit(0), Command::Cancel { job: 1, now_ms: 1 }] }.submits_only());
        assert!(!Command::Cancel { job: 1, now_ms: 1 }.submits_only());
    }

    #[test]
    fn a_submission_weighs_what_it_carries_and_the_batch_bounds_hold_many() {
        let base = submit(0).weight_bytes();
        assert_eq!(Command::Cancel { job: 1, now_ms: 1 }.weight_bytes(), 4096, "the fixed allowance");
        assert_eq!(submit(10_000).weight_bytes(), base + 10_000);
        // A batch by bytes holds at least as many small submissions as a batch may have commands.
        assert!(BATCH_COMMANDS_MAX * base <= BATCH_BYTES_MAX);
        // One submission of the largest script still fits in a batch.
        assert!(submit(crate::limits::SCRIPT_BYTES_MAX).weight_bytes() < BATCH_BYTES_MAX);
    }
}
