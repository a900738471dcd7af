//! The replicated cluster state and the one function that changes it.
//!
//! [`ClusterState::apply`] is deterministic: it reads no clock (time comes from `now_ms` inside the
//! command), draws no random numbers and does no IO, so every replica that applies the same log
//! reaches the same state, byte for byte (see [`ClusterState::digest`]).
//!
//! A job's run is a gang of per-node parts ([`proto::NodeRun`]). A part holds its node's GPUs,
//! CPUs and memory until that node reports the process gone or is declared down; a job whose
//! earlier run still has parts is not placed again, so a job never runs twice at once.
//!
//! The state and its dispatcher ([`ClusterState::apply`]) are here; each command is handled with
//! its concern: `admission` (the ordered checks of a submission), `nodes`, `jobs`, `plans` (placing runs), `arrays`, `runs` (launches, ends and
//! usage), `steps`, `stores` (jobs' rendezvous stores), `wall` (wall-clock time charged, `GrpWall` time-outs), `policy` (partitions, QoS,
//! what a submission may name), `credentials` (join
//! tokens, revoked certificates), `archive`, `queries` (read-only questions), `snapshot` (what
//! snapshots need) and `invariants` (checked after every command).

mod admission;
mod archive;
mod arrays;
mod credentials;
mod events;
mod invariants;
mod jobs;
mod nodes;
mod plans;
mod policy;
mod queries;
mod repairs;
mod reservations;
mod runs;
mod snapshot;
mod steps;
mod stores;
#[cfg(test)]
mod test_support;
mod wall;

use std::collections::{BTreeMap, BTreeSet};

use proto::{Command, CommandResult, InstanceId, Job, JobId, NodeId, NodeRecord};
use serde::{Deserialize, Serialize};

pub use self::admission::{Check, Refusal, CHECKS};
use self::archive::prune_accounting;
pub use self::stores::JobStore;

/// Everything the cluster agrees on: nodes, jobs, and the next ids to hand out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    pub jobs: BTreeMap<JobId, Job>,
    pub next_job_id: JobId,
    pub next_node_id: NodeId,
    /// Partitions and QoS the scheduler uses.
    pub policy: proto::SchedulerPolicy,
    /// Join tokens by id (hashes of their secrets).
    pub join_tokens: BTreeMap<u64, proto::JoinTokenRecord>,
    pub next_token_id: u64,
    /// Certificates refused everywhere: SHA-256 fingerprint to why.
    pub revoked_certs: BTreeMap<String, String>,
    /// Node names whose every certificate is refused: name to why.
    pub revoked_nodes: BTreeMap<String, String>,
    /// Instances of each node that a newer one replaced: they never come back (a late heartbeat
    /// of a dead process must not take the node back from the instance that runs its jobs).
    pub retired_instances: BTreeMap<NodeId, Vec<InstanceId>>,
    /// Tasks started so far of each array that has tasks left (their jobs may have finished and
    /// left the hot state): a task is never started twice.
    pub array_started: BTreeMap<JobId, BTreeSet<u32>>,
    /// Decayed GPU usage of each (account, user) association (fair share; `root` for a job
    /// without an account), kept here because finished jobs leave the hot state. At most
    /// [`USAGE_ASSOCS_MAX`] associations: usage of a new one past that is not counted.
    pub usage: BTreeMap<(String, String), proto::accounts::Usage>,
    /// Decayed wall-clock time of each QoS's jobs (`GrpWall`; `wall`), at most
    /// `wall::QOS_USAGE_MAX` QoS.
    pub qos_usage: BTreeMap<String, proto::accounts::Usage>,
    /// Accounts, users, associations and their limits (`sacctmgr`; QoS and their limits are in
    /// `policy`). See `associations`. Shared with each scheduling pass's view, not copied.
    pub accounts: std::sync::Arc<proto::accounts::Accounts>,
    /// Requeues since the cluster began (every run put back in the queue: `scontrol requeue`,
    /// a `--requeue` job's lost node or GPU), never reset: the metric `corral_job_requeues_total`,
    /// the same on every replica.
    pub requeues: u64,
    /// The last [`proto::NODE_EVENTS_MAX`] changes of nodes' states, oldest first (`events`).
    pub node_events: std::collections::VecDeque<proto::NodeEvent>,
    /// Reservations by name (`scontrol create reservation`), at most
    /// [`proto::ADMIN_RESERVATIONS_MAX`]; see `reservations`.
    pub reservations: BTreeMap<String, proto::AdminReservation>,
    /// Each job's rendezvous store (`stores`): torch's c10d rendezvous of its run, served on
    /// its nodes. Only jobs above have one; bounded by [`proto::STORE_BYTES_MAX`].
    pub stores: BTreeMap<JobId, JobStore>,
    /// The jobs above by their submissions' keys: a resend is answered with the job the
    /// first made. Derived from `jobs`, so not encoded: a snapshot's reader builds it again.
    #[serde(skip)]
    pub submit_keys: crate::submit_keys::SubmitKeys,
    /// The jobs above that hold parts (running, or stopping and not yet confirmed gone), so
    /// what walks the parts (the leader's launches, stops and suspensions each tick, the
    /// scheduler's node views, a node's loss) does not walk a deep queue of pending jobs.
    /// Derived from `jobs`, so not encoded: a snapshot's reader builds it again.
    #[serde(skip)]
    pub holding_parts: BTreeSet<JobId>,
}

/// Associations whose usage is kept at most (twice the database's bound: jobs without an
/// account are charged to root).
pub const USAGE_ASSOCS_MAX: usize = 2 * proto::accounts::ASSOCS_MAX;

/// Replaced instances remembered per node.
pub const RETIRED_INSTANCES_MAX: usize = 16;
/// Why a node that stopped gracefully is down (`Command::NodeStopped`).
pub const NODE_STOPPED_REASON: &str = "corrald stopped (graceful stop)";

/// Join tokens and revoked certificates kept at most (the oldest expired tokens go first).
pub const JOIN_TOKENS_MAX: usize = 1024;
pub const REVOKED_CERTS_MAX: usize = 65_536;

impl Default for ClusterState {
    fn default() -> Self {
        ClusterState {
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            next_job_id: 1,
            next_node_id: 1,
            policy: Default::default(),
            join_tokens: BTreeMap::new(),
            next_token_id: 1,
            revoked_certs: BTreeMap::new(),
            revoked_nodes: BTreeMap::new(),
            retired_instances: BTreeMap::new(),
            array_started: BTreeMap::new(),
            usage: BTreeMap::new(),
            qos_usage: BTreeMap::new(),
            accounts: Default::default(),
            requeues: 0,
            node_events: Default::default(),
            reservations: BTreeMap::new(),
            stores: BTreeMap::new(),
            submit_keys: Default::default(),
            holding_parts: BTreeSet::new(),
        }
    }
}

/// The command's kind, for messages.
fn command_name(c: &Command) -> &'static str {
    match c {
        Command::RegisterNode { .. } => "RegisterNode",
        Command::AddJoinToken { .. } => "AddJoinToken",
        Command::RevokeJoinToken { .. } => "RevokeJoinToken",
        Command::RevokeCert { .. } => "RevokeCert",
        Command::NodeUp { .. } => "NodeUp",
        Command::NodeDown { .. } => "NodeDown",
        Command::NodeStopped { .. } => "NodeStopped",
        Command::Drain { .. } => "Drain",
        Command::Resume { .. } => "Resume",
        Command::Submit { .. } => "Submit",
        Command::Plan { .. } => "Plan",
        Command::LaunchConfirmed { .. } => "LaunchConfirmed",
        Command::RunFinished { .. } => "RunFinished",
        Command::Cancel { .. } => "Cancel",
        Command::TimeOut { .. } => "TimeOut",
        Command::Requeue { .. } => "Requeue",
        Command::SetPolicy { .. } => "SetPolicy",
        Command::EditPartition { .. } => "EditPartition",
        Command::EditReservation { .. } => "EditReservation",
        Command::EditAccounts { .. } => "EditAccounts",
        Command::UpdateJob { .. } => "UpdateJob",
        Command::Suspend { .. } => "Suspend",
        Command::StepStarted { .. } => "StepStarted",
        Command::StepEnded { .. } => "StepEnded",
        Command::GpuHealth { .. } => "GpuHealth",
        Command::UpdateInventory { .. } => "UpdateInventory",
        Command::PinMigLayout { .. } => "PinMigLayout",
        Command::ArchiveJobs { .. } => "ArchiveJobs",
        Command::PruneAccounting { .. } => "PruneAccounting",
        Command::Batch { .. } => "Batch",
        Command::Store { .. } => "Store",
    }
}

fn rejected(reason: impl Into<String>) -> CommandResult {
    CommandResult::Rejected(reason.into())
}

impl ClusterState {
    /// Applies one committed command. Deterministic: the same state and command give the same
    /// result and the same next state on every replica.
    pub fn apply(&mut self, cmd: &Command) -> CommandResult {
        self.apply_archiving(cmd, &mut Vec::new())
    }

    /// [`ClusterState::apply`], handing the jobs an `ArchiveJobs` moved out of the hot state to
    /// `archived` (the store writes them to the accounting store in the same step).
    pub fn apply_archiving(&mut self, cmd: &Command, archived: &mut Vec<Job>) -> CommandResult {
        let node_before = self.node_before(cmd);
        let result = match cmd {
            // Each command of a batch is applied, and checked, as if it were its own entry.
            Command::Batch { commands } => return self.apply_batch(commands, archived),
            Command::ArchiveJobs { jobs, now_ms: _ } => self.archive_jobs(jobs, archived),
            Command::PruneAccounting { jobs, now_ms: _ } => prune_accounting(jobs),
            Command::RegisterNode { name, addr, inventory, instance, cert_fingerprint, now_ms } => {
                let result = self.register_node(name, addr, inventory, *instance, *now_ms);
                if let Some(n) = self.nodes.values_mut().find(|n| n.name == *name) {
                    n.cert_fingerprint = cert_fingerprint.clone();
                }
                result
            }
            // A refused token or certificate changes nothing: no check after it.
            Command::AddJoinToken { secret_sha256, expires_ms, created_by, now_ms } => {
                match self.add_join_token(secret_sha256, *expires_ms, created_by, *now_ms) {
                    Ok(()) => CommandResult::Ok,
                    Err(why) => return rejected(why),
                }
            }
            Command::RevokeJoinToken { id, now_ms: _ } => self.revoke_join_token(*id),
            Command::RevokeCert { fingerprint, node, reason, now_ms: _ } => match self.revoke_cert(fingerprint, node.as_deref(), reason) {
                Ok(()) => CommandResult::Ok,
                Err(why) => return rejected(why),
            },
            Command::NodeUp { node, instance, now_ms } => self.node_up(*node, *instance, *now_ms),
            Command::NodeDown { node, reason, now_ms } => self.node_down(*node, reason, *now_ms),
            Command::NodeStopped { node, instance, now_ms } => self.node_stopped(*node, *instance, *now_ms),
            Command::Drain { node, reason, now_ms } => self.drain(*node, reason, *now_ms),
            Command::Resume { node, now_ms } => self.resume(*node, *now_ms),
            Command::Submit { spec, now_ms } => self.submit(spec, *now_ms),
            Command::Plan { placements, array_tasks, now_ms } => self.plan(placements, array_tasks, *now_ms),
            Command::LaunchConfirmed { job, run, node, instance, now_ms } => self.launch_confirmed(*job, *run, *node, *instance, *now_ms),
            Command::RunFinished { job, run, node, outcome, usage, now_ms } => {
                let result = self.run_finished(*job, *run, *node, outcome, *now_ms);
                if result == CommandResult::Ok {
                    if let Some(j) = self.jobs.get_mut(job) {
                        j.gpu_usage.merge(usage);
                    }
                }
                result
            }
            Command::Cancel { job, now_ms } => self.cancel(*job, *now_ms),
            Command::TimeOut { job, reason, now_ms } => self.time_out(*job, reason, *now_ms),
            Command::Requeue { job, reason, now_ms } => self.requeue(*job, reason, *now_ms),
            Command::SetPolicy { policy, now_ms: _ } => self.set_policy(policy),
            Command::EditPartition { edit, now_ms: _ } => self.edit_partition(edit),
            Command::EditReservation { edit, now_ms } => self.edit_reservation(edit, *now_ms),
            Command::EditAccounts { edits, now_ms: _ } => self.edit_accounts(edits),
            Command::UpdateJob { job, hold, time_limit_ms, partition, now_ms: _ } => {
                self.update_job(*job, *hold, *time_limit_ms, partition.clone())
            }
            Command::Suspend { job, suspend, now_ms } => self.suspend(*job, *suspend, *now_ms),
            Command::StepStarted { job, run, step, name, nodes, ntasks, now_ms } => {
                self.step_started(*job, *run, *step, name, nodes, *ntasks, *now_ms)
            }
            Command::StepEnded { job, run, step, node, exit_code, signal, now_ms } => {
                self.step_ended(*job, *run, *step, node, *exit_code, *signal, *now_ms)
            }
            Command::GpuHealth { node, gpu, mig_uuid, healthy, reason, now_ms } => {
                self.gpu_health(*node, *gpu, mig_uuid.as_deref(), *healthy, reason, *now_ms)
            }
            Command::UpdateInventory { node, inventory, reason: _, now_ms: _ } => self.update_inventory(*node, inventory),
            Command::PinMigLayout { node, gpu, profiles, now_ms: _ } => self.pin_mig_layout(*node, *gpu, profiles.as_deref()),
            Command::Store { job, run, op, write, now_ms: _ } => self.store_write(*job, *run, op, *write),
        };
        if !matches!(result, CommandResult::Rejected(_)) {
            self.note_node_event(cmd, node_before);
        }
        self.check_after(cmd);
        result
    }

    fn apply_batch(&mut self, commands: &[Command], archived: &mut Vec<Job>) -> CommandResult {
        if commands.len() > proto::BATCH_COMMANDS_MAX {
            return rejected(format!("{} commands in one batch, more than {}", commands.len(), proto::BATCH_COMMANDS_MAX));
        }
        if let Some(c) = commands.iter().find(|c| !c.batchable()) {
            return rejected(format!("a batch may not carry {}", command_name(c)));
        }
        CommandResult::Batch(commands.iter().map(|c| self.apply_archiving(c, archived)).collect())
    }
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, NodeState};

    use crate::cluster::test_support::{register, spec};
    use crate::cluster::ClusterState;

    #[test]
    fn a_batch_applies_each_command_as_if_alone_and_a_bad_batch_applies_nothing() {
        let mut one = ClusterState::default();
        let mut batched = ClusterState::default();
        for s in [&mut one, &mut batched] {
            register(s, "a", 1);
        }
        let commands = vec![
            Command::Submit { spec: spec(1, 1), now_ms: 10 },
            Command::Submit { spec: spec(2, 1), now_ms: 10 },
            Command::Cancel { job: 1, now_ms: 11 },
            Command::Cancel { job: 99, now_ms: 11 },
            // A node found down and back (liveness proposes a crowd of them together).
            Command::NodeDown { node: 1, reason: "no heartbeat".into(), now_ms: 11 },
            Command::NodeUp { node: 1, instance: 1, now_ms: 12 },
            Command::NodeUp { node: 7, instance: 1, now_ms: 12 },
        ];
        let alone: Vec<CommandResult> = commands.iter().map(|c| one.apply(c)).collect();
        let result = batched.apply(&Command::Batch { commands: commands.clone() });
        assert_eq!(result, CommandResult::Batch(alone.clone()));
        assert!(matches!(alone[3], CommandResult::Rejected(_)), "a refused command refuses only itself");
        assert_eq!(one, batched);

        assert!(matches!(alone[6], CommandResult::Rejected(_)), "an unknown node refuses only itself");
        assert_eq!(one.nodes.values().next().map(|n| n.state), Some(NodeState::Up));

        // Administrative node commands and nested batches are not batchable: nothing applies.
        let before = batched.clone();
        let bad = Command::Batch {
            commands: vec![Command::Submit { spec: spec(1, 1), now_ms: 12 }, Command::Drain { node: 1, reason: "x".into(), now_ms: 12 }],
        };
        assert!(matches!(batched.apply(&bad), CommandResult::Rejected(_)));
        let nested = Command::Batch { commands: vec![Command::Batch { commands: vec![] }] };
        assert!(matches!(batched.apply(&nested), CommandResult::Rejected(_)));
        let too_many = Command::Batch { commands: vec![Command::Cancel { job: 1, now_ms: 13 }; proto::BATCH_COMMANDS_MAX + 1] };
        assert!(matches!(batched.apply(&too_many), CommandResult::Rejected(_)));
        assert_eq!(batched, before);
    }
}
