//! The openraft type configuration of the job log.

use std::fmt;

use proto::{Command, CommandResult};
use serde::{Deserialize, Serialize};

/// A voter or learner of the Raft group, as the membership config records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberNode {
    pub name: String,
    /// QUIC address of the node, `host:port`.
    pub addr: String,
}

impl fmt::Display for MemberNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.addr)
    }
}

/// One entry of the replicated log: a [`Command`].
///
/// openraft wants its application data to implement `Display`, which `proto::Command` does not;
/// this wrapper adds it and is serialized exactly as the command itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LogCommand(pub Command);

impl From<Command> for LogCommand {
    fn from(cmd: Command) -> Self {
        LogCommand(cmd)
    }
}

impl fmt::Display for LogCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A short, bounded line: the kind and the ids, never a whole job spec.
        match &self.0 {
            Command::RegisterNode { name, instance, .. } => {
                write!(f, "register_node({name}, instance {instance})")
            }
            Command::NodeUp { node, instance, .. } => {
                write!(f, "node_up({node}, instance {instance})")
            }
            Command::NodeDown { node, .. } => write!(f, "node_down({node})"),
            Command::NodeStopped { node, instance, .. } => write!(f, "node_stopped({node}, instance {instance})"),
            Command::Drain { node, .. } => write!(f, "drain({node})"),
            Command::Resume { node, .. } => write!(f, "resume({node})"),
            Command::Submit { spec, .. } => write!(f, "submit({} gpus)", spec.gpus()),
            Command::Plan { placements, .. } => write!(f, "plan({} placements)", placements.len()),
            Command::LaunchConfirmed { job, run, .. } => write!(f, "launch_confirmed({job}.{run})"),
            Command::RunFinished { job, run, .. } => write!(f, "run_finished({job}.{run})"),
            Command::Cancel { job, .. } => write!(f, "cancel({job})"),
            Command::TimeOut { job, .. } => write!(f, "time_out({job})"),
            Command::Requeue { job, .. } => write!(f, "requeue({job})"),
            Command::UpdateJob { job, .. } => write!(f, "update_job({job})"),
            Command::Suspend { job, suspend, .. } => write!(f, "{}({job})", if *suspend { "suspend" } else { "resume" }),
            Command::StepStarted { job, step, .. } => write!(f, "step_started({job}.{step})"),
            Command::StepEnded { job, step, node, .. } => write!(f, "step_ended({job}.{step} on {node})"),
            Command::SetPolicy { .. } => write!(f, "set_policy"),
            Command::EditPartition { edit, .. } => write!(f, "edit_partition({})", edit.name()),
            Command::EditReservation { edit, .. } => write!(f, "edit_reservation({edit:?})"),
            Command::EditAccounts { edits, .. } => write!(f, "edit_accounts({} changes)", edits.len()),
            Command::GpuHealth { node, gpu, healthy, .. } => write!(f, "gpu_health({node}/{gpu}, healthy {healthy})"),
            Command::UpdateInventory { node, .. } => write!(f, "update_inventory({node})"),
            Command::PinMigLayout { node, gpu, .. } => write!(f, "pin_mig_layout({node}/{gpu})"),
            Command::AddJoinToken { .. } => write!(f, "add_join_token"),
            Command::RevokeJoinToken { id, .. } => write!(f, "revoke_join_token({id})"),
            Command::RevokeCert { fingerprint, .. } => write!(f, "revoke_cert({})", &fingerprint[..fingerprint.len().min(16)]),
            Command::ArchiveJobs { jobs, .. } => write!(f, "archive_jobs({} jobs)", jobs.len()),
            Command::PruneAccounting { jobs, .. } => write!(f, "prune_accounting({} records)", jobs.len()),
            Command::Batch { commands } => write!(f, "batch({} commands)", commands.len()),
            Command::Store { job, run, op, .. } => write!(f, "store({job}.{run}, {} bytes)", op.weight_bytes()),
        }
    }
}

openraft::declare_raft_types!(
    /// The Raft type configuration of Corral's job log.
    pub TypeConfig:
        D = LogCommand,
        R = CommandResult,
        NodeId = u64,
        Node = MemberNode,
);

pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
