//! The replicated cluster state and the one function that changes it.
//!
//! [`ClusterState::apply`] is deterministic: it reads no clock (time comes from `now_ms` inside the
//! command), draws no random numbers and does no IO, so every replica that applies the same log
//! reaches the same state, byte for byte (see [`ClusterState::digest`]).
//!
//! A job's run is a gang of per-node parts ([`proto::NodeRun`]). A part holds its node's GPUs,
//! CPUs and memory until that node reports the process gone or is declared down; a job whose
//! earlier run still has parts is not placed again, so a job never runs twice at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proto::{
    ArrayTask, Command, CommandResult, GresRequest, InstanceId, Inventory, Job, JobId, JobSpec, JobState, NodeId, NodeRecord, NodeRun,
    NodeState, Placement, RunNo, RunOutcome,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::view;

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
    /// Accounts, users, associations and their limits (`sacctmgr`; QoS and their limits are in
    /// `policy`). See `associations`. Shared with each scheduling pass's view, not copied.
    pub accounts: std::sync::Arc<proto::accounts::Accounts>,
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
            accounts: Default::default(),
            submit_keys: Default::default(),
            holding_parts: BTreeSet::new(),
        }
    }
}

/// The rendezvous ports in use per first node, gathered once per plan (one scan of the jobs,
/// not one per placement) and kept up to date as the plan starts runs: the same lowest free
/// port a scan before each start would give.
#[derive(Default)]
struct MasterPorts {
    used: Option<BTreeMap<NodeId, BTreeSet<u16>>>,
}

impl MasterPorts {
    /// The lowest port free on `node`, now taken.
    fn take(&mut self, state: &ClusterState, node: NodeId) -> Option<u16> {
        let used = self.used.get_or_insert_with(|| {
            let mut used: BTreeMap<NodeId, BTreeSet<u16>> = BTreeMap::new();
            for j in state.jobs.values() {
                if let (Some(p), Some(port)) = (j.parts.first(), j.master_port) {
                    used.entry(p.alloc.node).or_default().insert(port);
                }
            }
            used
        });
        let on_node = used.entry(node).or_default();
        let port = (proto::MASTER_PORT_FIRST..proto::MASTER_PORT_FIRST + proto::MASTER_PORT_COUNT).find(|p| !on_node.contains(p))?;
        on_node.insert(port);
        Some(port)
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
        Command::Requeue { .. } => "Requeue",
        Command::SetPolicy { .. } => "SetPolicy",
        Command::EditPartition { .. } => "EditPartition",
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
    }
}

fn rejected(reason: impl Into<String>) -> CommandResult {
    CommandResult::Rejected(reason.into())
}

/// `PruneAccounting`: the records live in the accounting store, which the store prunes; the
/// state only bounds how many one command names.
fn prune_accounting(jobs: &[JobId]) -> CommandResult {
    if jobs.len() > proto::ARCHIVE_BATCH_MAX {
        rejected(format!("{} records in one prune, more than {}", jobs.len(), proto::ARCHIVE_BATCH_MAX))
    } else {
        CommandResult::Ok
    }
}

/// Adds the GPU time of `part` from the run's start until `now_ms` to the job's account and to
/// its association's usage, decayed to `now_ms` first (`half_life_ms`): GPU-seconds, a MIG
/// instance weighted by its share of the GPU's compute slices (a 3g.71gb instance for 7 s is
/// 3 GPU-seconds).
fn account(usage: &mut BTreeMap<(String, String), proto::accounts::Usage>, half_life_ms: u64, job: &mut Job, part: &NodeRun, now_ms: u64) {
    let Some(start) = job.start_ms else { return };
    let gres_type = job.spec.gres.as_ref().and_then(|g| g.gpu_type.as_deref());
    let slices: u64 = part.alloc.gpus.iter().map(|&g| u64::from(scheduler::mig::slot_compute_slices(g, gres_type))).sum();
    let slice_ms = now_ms.saturating_sub(start).saturating_mul(slices);
    let gpu_ms = slice_ms / u64::from(scheduler::mig::COMPUTE_SLICES);
    job.gpu_seconds = job.gpu_seconds.saturating_add(gpu_ms / 1000);
    if gpu_ms == 0 {
        return;
    }
    let account = job.spec.account.clone().unwrap_or_else(|| proto::accounts::ROOT_ACCOUNT.to_string());
    let key = (account, job.spec.user.clone());
    if !usage.contains_key(&key) && usage.len() >= USAGE_ASSOCS_MAX {
        return;
    }
    let entry = usage.entry(key).or_default();
    *entry = scheduler::fairshare::add_usage(entry, gpu_ms, now_ms, half_life_ms);
}

/// The final state of a run all of whose parts ended, from how each ended: a launch failure
/// first, then a time-out, an OOM kill, a signal, a non-zero exit; then a kill; all zero is COMPLETED. A kill
/// ranks below a failure: a cancelled job is final before its parts report, so a `Killed` here
/// is the cluster stopping the rest of a gang after one part ended, and the part that ended
/// decides.
fn final_state(outcomes: &[(NodeId, RunOutcome)]) -> (JobState, Option<i32>, Option<String>) {
    if let Some((node, RunOutcome::LaunchFailed(msg))) = outcomes.iter().find(|(_, o)| matches!(o, RunOutcome::LaunchFailed(_))) {
        return (JobState::Failed, None, Some(format!("launch failed on node {node}: {msg}")));
    }
    if outcomes.iter().any(|(_, o)| *o == RunOutcome::TimedOut) {
        return (JobState::Timeout, None, Some("time limit reached".into()));
    }
    if let Some((node, RunOutcome::OutOfMemory(why))) = outcomes.iter().find(|(_, o)| matches!(o, RunOutcome::OutOfMemory(_))) {
        return (JobState::OutOfMemory, None, Some(format!("out of memory on node {node}: {why}")));
    }
    if let Some((_, RunOutcome::Signaled(sig))) = outcomes.iter().find(|(_, o)| matches!(o, RunOutcome::Signaled(_))) {
        return (JobState::Failed, Some(sig.saturating_add(128)), Some(format!("killed by signal {sig}")));
    }
    if let Some((_, RunOutcome::Exited(code))) = outcomes.iter().find(|(_, o)| matches!(o, RunOutcome::Exited(c) if *c != 0)) {
        return (JobState::Failed, Some(*code), None);
    }
    if outcomes.iter().any(|(_, o)| *o == RunOutcome::Killed) {
        return (JobState::Cancelled, None, None);
    }
    (JobState::Completed, Some(0), None)
}

impl ClusterState {
    /// The live join token whose secret hashes to `secret_sha256` at `now_ms`, if any.
    pub fn live_join_token(&self, secret_sha256: &str, now_ms: u64) -> Option<&proto::JoinTokenRecord> {
        self.join_tokens.values().find(|t| !t.revoked && t.expires_ms > now_ms && t.secret_sha256 == secret_sha256)
    }

    /// Applies one committed command. Deterministic: the same state and command give the same
    /// result and the same next state on every replica.
    pub fn apply(&mut self, cmd: &Command) -> CommandResult {
        self.apply_archiving(cmd, &mut Vec::new())
    }

    /// [`ClusterState::apply`], handing the jobs an `ArchiveJobs` moved out of the hot state to
    /// `archived` (the store writes them to the accounting store in the same step).
    pub fn apply_archiving(&mut self, cmd: &Command, archived: &mut Vec<Job>) -> CommandResult {
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
            Command::Requeue { job, reason, now_ms } => self.requeue(*job, reason, *now_ms),
            Command::SetPolicy { policy, now_ms: _ } => self.set_policy(policy),
            Command::EditPartition { edit, now_ms: _ } => self.edit_partition(edit),
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
        };
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

    /// `AddJoinToken`: keeps the token (its secret's SHA-256, lowercased) under the next id,
    /// forgetting the oldest expired or revoked one when `JOIN_TOKENS_MAX` are kept. `Err`, with
    /// why, when it is refused; then nothing changed.
    fn add_join_token(&mut self, secret_sha256: &str, expires_ms: u64, created_by: &str, now_ms: u64) -> Result<(), String> {
        if secret_sha256.len() != 64 || !secret_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("a join token is kept as a 64-digit SHA-256".into());
        }
        if self.join_tokens.len() >= JOIN_TOKENS_MAX {
            // Forget the oldest expired or revoked token; refuse when all are live.
            let Some(old) = self.join_tokens.values().find(|t| t.revoked || t.expires_ms <= now_ms).map(|t| t.id) else {
                return Err(format!("{JOIN_TOKENS_MAX} live join tokens: revoke some first"));
            };
            self.join_tokens.remove(&old);
        }
        let id = self.next_token_id;
        self.next_token_id += 1;
        self.join_tokens.insert(
            id,
            proto::JoinTokenRecord {
                id,
                secret_sha256: secret_sha256.to_ascii_lowercase(),
                created_ms: now_ms,
                expires_ms,
                created_by: created_by.to_string(),
                revoked: false,
            },
        );
        Ok(())
    }

    /// `RevokeJoinToken`: marks token `id` revoked.
    fn revoke_join_token(&mut self, id: u64) -> CommandResult {
        match self.join_tokens.get_mut(&id) {
            Some(t) => {
                t.revoked = true;
                CommandResult::Ok
            }
            None => rejected(format!("no join token {id}")),
        }
    }

    /// `RevokeCert`: refuses the certificate with `fingerprint` (if not empty) and every
    /// certificate of `node` (if given), for `reason`. `Err`, with why, when
    /// `REVOKED_CERTS_MAX` are revoked already; then nothing changed.
    fn revoke_cert(&mut self, fingerprint: &str, node: Option<&str>, reason: &str) -> Result<(), String> {
        if self.revoked_certs.len() + self.revoked_nodes.len() >= REVOKED_CERTS_MAX && !self.revoked_certs.contains_key(fingerprint) {
            return Err(format!("{REVOKED_CERTS_MAX} certificates are revoked already"));
        }
        if !fingerprint.is_empty() {
            self.revoked_certs.insert(fingerprint.to_ascii_lowercase(), reason.to_string());
        }
        if let Some(name) = node {
            self.revoked_nodes.insert(name.to_string(), reason.to_string());
        }
        Ok(())
    }

    /// `SetPolicy`: the scheduler policy from now on, if it is valid.
    fn set_policy(&mut self, policy: &proto::SchedulerPolicy) -> CommandResult {
        match policy.validate() {
            Ok(()) => {
                self.policy = policy.clone();
                CommandResult::Ok
            }
            Err(e) => rejected(e),
        }
    }

    /// Moves every named job that is final and holds nothing out of the hot state, into
    /// `archived`; the others stay (a stale list is harmless).
    fn archive_jobs(&mut self, ids: &[JobId], archived: &mut Vec<Job>) -> CommandResult {
        if ids.len() > proto::ARCHIVE_BATCH_MAX {
            return rejected(format!("{} jobs in one archive, more than {}", ids.len(), proto::ARCHIVE_BATCH_MAX));
        }
        for id in ids {
            let done = self.jobs.get(id).is_some_and(|j| j.state.is_final() && j.parts.is_empty());
            if let Some(job) = done.then(|| self.jobs.remove(id)).flatten() {
                self.submit_keys.remove(&job);
                // A cancelled array starts no more tasks.
                self.array_started.remove(id);
                archived.push(job);
            }
        }
        CommandResult::Ok
    }

    /// Finished jobs that may leave the hot state at `now_ms` when kept `min_age_ms`: final,
    /// holding nothing, ended long enough ago; at most `limit`, in id order.
    pub fn archivable(&self, now_ms: u64, min_age_ms: u64, limit: usize) -> Vec<JobId> {
        self.jobs
            .values()
            .filter(|j| j.state.is_final() && j.parts.is_empty() && j.end_ms.is_some_and(|e| e.saturating_add(min_age_ms) <= now_ms))
            .map(|j| j.id)
            .take(limit)
            .collect()
    }

    fn register_node(&mut self, name: &str, addr: &str, inventory: &Inventory, instance: InstanceId, now_ms: u64) -> CommandResult {
        let existing = self.nodes.values().find(|n| n.name == name).map(|n| n.id);
        let Some(id) = existing else {
            let id = self.next_node_id;
            self.next_node_id += 1;
            self.nodes.insert(
                id,
                NodeRecord {
                    id,
                    name: name.to_string(),
                    addr: addr.to_string(),
                    inventory: Arc::new(inventory.clone()),
                    state: NodeState::Up,
                    drained: false,
                    instance,
                    state_reason: None,
                    registered_ms: now_ms,
                    state_changed_ms: now_ms,
                    cert_fingerprint: String::new(),
                    mig_pinned: BTreeMap::new(),
                },
            );
            return CommandResult::NodeRegistered { id };
        };
        if self.is_retired(id, instance) {
            return rejected(format!("instance {instance} of node {name} was replaced"));
        }
        let old = self.nodes.get(&id).map(|n| n.instance).filter(|old| *old != instance);
        if let Some(old) = old {
            self.retire(id, old);
            self.lose_parts_of_other_instances(id, instance, now_ms);
        }
        if let Some(node) = self.nodes.get_mut(&id) {
            node.addr = addr.to_string();
            node.inventory = Arc::new(inventory.clone());
            node.instance = instance;
            node.set_up(now_ms);
        }
        CommandResult::NodeRegistered { id }
    }

    fn node_up(&mut self, id: NodeId, instance: InstanceId, now_ms: u64) -> CommandResult {
        if self.is_retired(id, instance) {
            return rejected(format!("instance {instance} of node {id} was replaced"));
        }
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        node.set_up(now_ms);
        if node.instance == instance {
            return CommandResult::Ok;
        }
        let old = std::mem::replace(&mut node.instance, instance);
        self.retire(id, old);
        self.lose_parts_of_other_instances(id, instance, now_ms);
        CommandResult::Ok
    }

    fn is_retired(&self, id: NodeId, instance: InstanceId) -> bool {
        self.retired_instances.get(&id).is_some_and(|r| r.contains(&instance))
    }

    fn retire(&mut self, id: NodeId, instance: InstanceId) {
        let retired = self.retired_instances.entry(id).or_default();
        if !retired.contains(&instance) {
            retired.push(instance);
        }
        if retired.len() > RETIRED_INSTANCES_MAX {
            retired.remove(0);
        }
    }

    /// A new instance of `node` is up: parts another instance confirmed died with it (parent
    /// death signal). Unconfirmed parts stay: the new instance either confirms them or, if an
    /// earlier one had started them, reports them lost.
    fn lose_parts_of_other_instances(&mut self, node: NodeId, instance: InstanceId, now_ms: u64) {
        self.lose_parts(|p| p.alloc.node == node && p.launched_by.is_some_and(|i| i != instance), "node restarted", now_ms);
    }

    fn node_down(&mut self, id: NodeId, reason: &str, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        if node.state != NodeState::Down {
            node.state = NodeState::Down;
            node.state_changed_ms = now_ms;
        }
        node.state_reason = Some(reason.to_string());
        let why = format!("node {} down: {reason}", node.name);
        self.lose_node_parts(id, &why, now_ms);
        CommandResult::Ok
    }

    /// A graceful stop of the node's current instance: down at once, that instance retired.
    fn node_stopped(&mut self, id: NodeId, instance: InstanceId, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        if node.instance != instance {
            return rejected(format!("instance {instance} of node {} is not its current one", node.name));
        }
        self.retire(id, instance);
        self.node_down(id, NODE_STOPPED_REASON, now_ms)
    }

    /// Marks one GPU unhealthy (its jobs are lost like on a dead node, and the scheduler stops
    /// placing work there) or healthy again. A node whose GPUs are all unhealthy is drained;
    /// it is resumed when one of them is healthy again.
    fn gpu_health(&mut self, id: NodeId, gpu: u32, mig_uuid: Option<&str>, healthy: bool, reason: &str, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        let Some(info) = Arc::make_mut(&mut node.inventory).gpus.iter_mut().find(|g| g.index == gpu) else {
            return rejected(format!("node {} has no gpu {gpu}", node.name));
        };
        let what = match mig_uuid {
            Some(m) => format!("gpu {gpu} (mig {m})"),
            None => format!("gpu {gpu}"),
        };
        info.healthy = healthy;
        info.health_reason = (!healthy).then(|| reason.to_string());
        let all_bad = node.inventory.gpus.iter().all(|g| !g.healthy);
        const ALL_BAD: &str = "all GPUs unhealthy";
        if all_bad && !node.drained {
            node.drained = true;
            node.state_reason = Some(ALL_BAD.into());
            if node.state == NodeState::Up {
                node.state = NodeState::Drained;
                node.state_changed_ms = now_ms;
            }
        } else if !all_bad && node.drained && node.state_reason.as_deref() == Some(ALL_BAD) {
            node.drained = false;
            node.state_reason = None;
            if node.state == NodeState::Drained {
                node.state = NodeState::Up;
                node.state_changed_ms = now_ms;
            }
        }
        if !healthy {
            let why = format!("{what} on {} unhealthy: {reason}", node.name);
            self.lose_parts(|p| p.alloc.node == id && p.alloc.gpus.contains(&gpu), &why, now_ms);
        }
        CommandResult::Ok
    }

    fn update_inventory(&mut self, id: NodeId, inventory: &Inventory) -> CommandResult {
        let held: BTreeSet<u32> = self.parts_on(id).flat_map(|p| p.alloc.gpus.iter().copied()).collect();
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        if let Some(gone) = held.iter().find(|g| !inventory.gpus.iter().any(|i| i.index == **g)) {
            return rejected(format!("gpu {gone} of node {} is in use and cannot disappear", node.name));
        }
        node.inventory = Arc::new(inventory.clone());
        CommandResult::Ok
    }

    /// Pins GPU `gpu` of `node` to the MIG layout `profiles` (the scheduler drains that GPU
    /// until it is idle, then has it re-partitioned), or unpins it (`None`). A layout the GPU's
    /// model cannot hold is rejected with the hardware's limit; the pin is kept in the order
    /// the instances start on the GPU.
    fn pin_mig_layout(&mut self, id: NodeId, gpu: u32, profiles: Option<&[String]>) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        let Some(g) = node.inventory.gpus.iter().find(|g| g.index == gpu) else {
            return rejected(format!("node {} has no gpu {gpu}", node.name));
        };
        let Some(profiles) = profiles else {
            node.mig_pinned.remove(&gpu);
            return CommandResult::Ok;
        };
        if !g.mig_enabled {
            return rejected(format!(
                "gpu {gpu} of node {} is not in MIG mode (Corral never changes a GPU's MIG mode: an operator enables it on the node)",
                node.name
            ));
        }
        let Some(model) = scheduler::mig::Model::detect(&g.model, g.memory_mib) else {
            return rejected(format!("gpu {gpu} of node {} ({}) has no MIG profile table Corral knows", node.name, g.model));
        };
        match scheduler::mig::placeable(model, profiles) {
            Ok(layout) => {
                node.mig_pinned.insert(gpu, layout.profiles());
                CommandResult::Ok
            }
            Err(e) => rejected(format!("gpu {gpu} of node {}: {e}", node.name)),
        }
    }

    /// Every part on `node` is gone. A running job that lost a part of its current run is
    /// requeued (if it asked for that) or ends NODE_FAIL; its other parts are then stopped.
    fn lose_node_parts(&mut self, node: NodeId, reason: &str, now_ms: u64) {
        self.lose_parts(|p| p.alloc.node == node, reason, now_ms);
    }

    /// Every part matching `lost` is gone (its process died with its node or GPU).
    fn lose_parts(&mut self, lost: impl Fn(&NodeRun) -> bool, reason: &str, now_ms: u64) {
        let holding: Vec<JobId> = self.holding_parts.iter().copied().collect();
        for id in holding {
            let Some(job) = self.jobs.get_mut(&id) else { continue };
            let Some(pos) = job.parts.iter().position(&lost) else { continue };
            let part = job.parts.remove(pos);
            if job.parts.is_empty() {
                self.holding_parts.remove(&id);
            }
            account(&mut self.usage, self.policy.decay_half_life_ms(), job, &part, now_ms);
            if part.run != job.run || job.state != JobState::Running {
                continue;
            }
            if job.spec.requeue {
                requeue_job(job, reason);
            } else {
                job.state = JobState::NodeFail;
                job.exit_code = None;
                job.end_ms = Some(now_ms);
                job.reasons = vec![reason.to_string()];
            }
        }
    }

    fn drain(&mut self, id: NodeId, reason: &str, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        node.drained = true;
        node.state_reason = Some(reason.to_string());
        if node.state == NodeState::Up {
            node.state = NodeState::Drained;
            node.state_changed_ms = now_ms;
        }
        CommandResult::Ok
    }

    fn resume(&mut self, id: NodeId, now_ms: u64) -> CommandResult {
        let Some(node) = self.nodes.get_mut(&id) else {
            return rejected(format!("unknown node {id}"));
        };
        node.drained = false;
        if node.state == NodeState::Drained {
            node.state = NodeState::Up;
            node.state_changed_ms = now_ms;
            node.state_reason = None;
        }
        CommandResult::Ok
    }

    fn submit(&mut self, spec: &JobSpec, now_ms: u64) -> CommandResult {
        if let Err(e) = spec.validate() {
            return rejected(e);
        }
        // A resend first: the job it made may be what fills a `MaxSubmitJobs` now.
        if let Some(job) = spec.submit_key.and_then(|key| self.submit_keys.job(key)) {
            return match self.jobs.get(&job) {
                Some(made) if made.spec.user == spec.user => CommandResult::Submitted { job },
                _ => rejected("this submission's key is another user's".to_string()),
            };
        }
        // The node checked it before proposing; checked again here, where the state is the one
        // it enters (two submissions racing for the last of a `MaxSubmitJobs`).
        if let Some(why) = self.accounting_refusal(spec) {
            return rejected(why);
        }
        let id = self.next_job_id;
        self.next_job_id += 1;
        self.jobs.insert(id, Job::submitted(id, std::sync::Arc::new(spec.clone()), now_ms));
        if let Some(key) = spec.submit_key {
            self.submit_keys.insert(key, id);
        }
        CommandResult::Submitted { job: id }
    }

    fn plan(&mut self, placements: &[Placement], array_tasks: &[(u32, u32)], now_ms: u64) -> CommandResult {
        // One view for the whole plan, updated as placements are accepted, so two placements of
        // one plan can never take the same GPU.
        let named: BTreeSet<NodeId> = placements.iter().flat_map(|p| p.allocs.iter().map(|a| a.node)).collect();
        let mut nodes = view::node_views_among(self, &named);
        let tasks: BTreeMap<usize, u32> = array_tasks.iter().map(|(i, t)| (*i as usize, *t)).collect();
        let mut accepted = Vec::new();
        let mut rejected = Vec::new();
        let mut ports = MasterPorts::default();
        for (i, placement) in placements.iter().enumerate() {
            let task = tasks.get(&i).copied();
            let check = self.check_placement(&nodes, placement, task);
            match check {
                Ok(()) => {
                    for alloc in &placement.allocs {
                        if let Some(v) = nodes.get_mut(&alloc.node) {
                            view::take(v, alloc);
                        }
                    }
                    let id = match task {
                        Some(t) => self.start_array_task(placement.job, t),
                        None => placement.job,
                    };
                    self.start_run(id, placement, now_ms, &mut ports);
                    accepted.push(id);
                }
                Err(reason) => rejected.push((placement.job, reason)),
            }
        }
        CommandResult::Planned { accepted, rejected }
    }

    /// Why `placement` (of array task `task`, if any) cannot start now, if it cannot.
    fn check_placement(
        &self,
        nodes: &BTreeMap<NodeId, scheduler::NodeView>,
        placement: &Placement,
        task: Option<u32>,
    ) -> Result<(), String> {
        let job = self.jobs.get(&placement.job).ok_or_else(|| format!("job {} does not exist", placement.job))?;
        if job.state != JobState::Pending {
            return Err(format!("job {} is {}, not PENDING", job.id, job.state));
        }
        if !job.parts.is_empty() {
            return Err(format!("job {} still has parts of run {} stopping", job.id, job.run));
        }
        let next_run = job.run.saturating_add(1);
        if placement.run != next_run {
            return Err(format!("stale plan: run {} but the next run is {next_run}", placement.run));
        }
        let is_array = job.spec.array.is_some() && job.array.is_none();
        match (is_array, task) {
            (false, Some(t)) => return Err(format!("job {} is not an array, so it has no task {t}", job.id)),
            (true, None) => return Err(format!("job {} is an array: a placement must name a task", job.id)),
            (true, Some(t)) => {
                let spec = job.spec.array.as_ref().ok_or("array without tasks")?;
                if !spec.contains(t) {
                    return Err(format!("array {} has no task {t}", job.id));
                }
                if self.array_started.get(&job.id).is_some_and(|s| s.contains(&t)) {
                    return Err(format!("task {t} of array {} already started", job.id));
                }
                if let Some(limit) = spec.throttle {
                    let running =
                        self.array_task_ids(job.id).filter(|(_, id)| self.jobs.get(id).is_some_and(|j| !j.state.is_final())).count();
                    if running >= limit as usize {
                        return Err(format!("array {} already runs {running} tasks (throttle {limit})", job.id));
                    }
                }
            }
            (false, None) => {}
        }
        view::check_gang(nodes, job, &placement.allocs)
    }

    /// Tasks of array `array` that exist as jobs: (task, job id).
    fn array_task_ids(&self, array: JobId) -> impl Iterator<Item = (u32, JobId)> + '_ {
        self.jobs.values().filter_map(move |j| j.array.as_ref().filter(|a| a.array_job == array).map(|a| (a.task, j.id)))
    }

    /// Creates the job of task `task` of array `array` and returns its id. The last task to
    /// start takes over the array's own record and id, as in Slurm.
    fn start_array_task(&mut self, array: JobId, task: u32) -> JobId {
        let started = self.array_started.entry(array).or_default();
        let Some(parent) = self.jobs.get_mut(&array) else { return array };
        // Every started task is one of the array's (checked at placement), so this counts the
        // tasks not started yet without a scan (tasks are unique).
        let remaining = parent.spec.array.as_ref().map_or(0, |a| a.len().saturating_sub(started.len()));
        if remaining <= 1 {
            self.array_started.remove(&array);
            parent.array = Some(ArrayTask { array_job: array, task });
            return array;
        }
        started.insert(task);
        let mut job = parent.clone();
        job.array = Some(ArrayTask { array_job: array, task });
        let id = self.next_job_id;
        self.next_job_id += 1;
        job.id = id;
        self.jobs.insert(id, job);
        id
    }

    fn start_run(&mut self, id: JobId, placement: &Placement, now_ms: u64, ports: &mut MasterPorts) {
        let master_port = placement.allocs.first().and_then(|a| ports.take(self, a.node));
        if let Some(job) = self.jobs.get_mut(&id) {
            job.state = JobState::Running;
            job.run = placement.run;
            job.parts = placement.allocs.iter().map(|a| NodeRun { run: placement.run, alloc: a.clone(), launched_by: None }).collect();
            if !job.parts.is_empty() {
                self.holding_parts.insert(id);
            }
            job.outcomes.clear();
            job.last_nodes = placement.allocs.iter().map(|a| a.node).collect();
            job.last_gpus = placement.allocs.iter().map(|a| a.gpus.clone()).collect();
            job.start_ms = Some(now_ms);
            job.end_ms = None;
            job.exit_code = None;
            job.reasons.clear();
            job.master_port = master_port;
            job.suspension = proto::Suspension::default();
            job.steps.clear();
        }
    }

    fn launch_confirmed(&mut self, id: JobId, run: RunNo, node: NodeId, instance: InstanceId, now_ms: u64) -> CommandResult {
        // A confirmation from an instance that is no longer the node's came from a process
        // that died: accepting it would pin the part to nothing.
        if self.nodes.get(&node).is_some_and(|n| n.instance != instance) {
            return rejected(format!("launch confirmation for job {id} from a dead instance of node {node}"));
        }
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        let live = job.run == run && job.state == JobState::Running;
        let Some(part) = job.parts.iter_mut().find(|p| live && p.run == run && p.alloc.node == node && p.launched_by.is_none()) else {
            return rejected(format!("stale launch confirmation for job {id} run {run} on node {node}"));
        };
        part.launched_by = Some(instance);
        if job.parts.iter().all(|p| p.run != run || p.launched_by.is_some()) {
            job.start_ms = Some(now_ms);
        }
        CommandResult::Ok
    }

    fn run_finished(&mut self, id: JobId, run: RunNo, node: NodeId, outcome: &RunOutcome, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        let Some(pos) = job.parts.iter().position(|p| p.run == run && p.alloc.node == node) else {
            return rejected("stale run");
        };
        let part = job.parts.remove(pos);
        if job.parts.is_empty() {
            self.holding_parts.remove(&id);
        }
        account(&mut self.usage, self.policy.decay_half_life_ms(), job, &part, now_ms);
        if run != job.run || job.state != JobState::Running {
            // A part of a cancelled, failed or requeued run is gone: only its resources return.
            return CommandResult::Ok;
        }
        if let RunOutcome::PreflightFailed(why) = outcome {
            // The command never started (every node learns the same verdict): hold the job
            // for a person to look at the network, keeping its restart count.
            job.state = JobState::Pending;
            std::sync::Arc::make_mut(&mut job.spec).hold = true;
            job.exit_code = None;
            job.start_ms = None;
            job.end_ms = None;
            job.outcomes.clear();
            job.reasons = vec![format!("preflight failed on node {node}: {why}")];
            return CommandResult::Ok;
        }
        // In a batch job only the script's node (the first) runs the job; the others hold GPUs
        // for its steps. Once the script ended, nothing they report matters.
        let holder = job.spec.is_batch() && job.last_nodes.first() != Some(&node);
        let matters = !(holder && job.batch_ended());
        if let (true, RunOutcome::Lost(why)) = (matters, outcome) {
            let reason = format!("node {node}: {why}");
            if job.spec.requeue {
                requeue_job(job, &reason);
            } else {
                job.state = JobState::NodeFail;
                job.exit_code = None;
                job.end_ms = Some(now_ms);
                job.reasons = vec![reason];
            }
            return CommandResult::Ok;
        }
        // A holder's end decides nothing unless it is a failure of its own (a kill is the
        // cluster stopping it).
        if matters && (!holder || *outcome != RunOutcome::Killed) {
            job.outcomes.push((node, outcome.clone()));
        }
        if job.parts.iter().any(|p| p.run == run) {
            // Other nodes of the gang still run; a failure here makes the leader stop them.
            return CommandResult::Ok;
        }
        let (state, exit_code, reason) = final_state(&job.outcomes);
        job.state = state;
        job.exit_code = exit_code;
        job.reasons = reason.into_iter().collect();
        job.end_ms = Some(now_ms);
        CommandResult::Ok
    }

    fn cancel(&mut self, id: JobId, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        match job.state {
            JobState::Pending | JobState::Running => {
                // Parts keep their resources until each node reports its process gone (or the
                // node is declared down), so no GPU is handed out while it may still run.
                job.state = JobState::Cancelled;
                job.end_ms = Some(now_ms);
                job.reasons = vec!["cancelled".into()];
                CommandResult::Ok
            }
            _ => rejected("already finished"),
        }
    }

    fn requeue(&mut self, id: JobId, reason: &str, _now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        // As Slurm: a running job, or a finished one still in the hot state (within MinJobAge);
        // one that finished with parts still stopping is queued and starts once they are
        // released (`check_placement`). The refusals are Slurm's words.
        match job.state {
            JobState::Running => {}
            JobState::Pending => return rejected("Job is pending execution"),
            _ if job.spec.array.is_some() && job.array.is_none() => {
                return rejected("an array's own record cannot be requeued: requeue its tasks by their ids")
            }
            _ => {}
        }
        requeue_job(job, reason);
        CommandResult::Ok
    }

    /// `scontrol suspend` (`suspend`) or `resume` of a running job, refused in Slurm's words
    /// otherwise. A second suspend changes nothing, as in Slurm; its parts keep their resources
    /// and the leader has each node stop or continue its processes.
    fn suspend(&mut self, id: JobId, suspend: bool, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        match job.state {
            JobState::Running => {}
            JobState::Pending => return rejected("Job is pending execution"),
            _ => return rejected("Job/step already completing or completed"),
        }
        let s = &mut job.suspension;
        match (suspend, s.since_ms) {
            (true, Some(_)) => return CommandResult::Ok,
            (false, None) => return rejected("Job is not suspended"),
            (true, None) => s.since_ms = Some(now_ms),
            (false, Some(since)) => {
                s.paused_ms = s.paused_ms.saturating_add(now_ms.saturating_sub(since));
                s.since_ms = None;
            }
        }
        s.changes = s.changes.saturating_add(1);
        CommandResult::Ok
    }

    /// A step of the running job's current run, recorded for accounting. One created again
    /// under the same number (its first creation was refused by a node) is recorded anew.
    /// Past [`proto::limits::STEP_RECORDS_PER_JOB_MAX`] the oldest ended step is dropped; a
    /// job with that many steps alive at once records no more.
    #[allow(clippy::too_many_arguments)]
    fn step_started(&mut self, id: JobId, run: RunNo, step: u32, name: &str, nodes: &[String], ntasks: u32, now_ms: u64) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        if job.state != JobState::Running || job.run != run {
            return rejected(format!("job {id} run {run} is not running"));
        }
        if name.len() > proto::limits::STEP_NAME_BYTES_MAX || nodes.len() > job.last_nodes.len().max(1) {
            return rejected(format!("step {id}.{step}: name or node list too long"));
        }
        job.steps.retain(|s| s.step != step);
        if job.steps.len() >= proto::limits::STEP_RECORDS_PER_JOB_MAX {
            let Some(oldest) = job.steps.iter().position(|s| s.end_ms.is_some()) else {
                return rejected(format!("job {id} has {} steps alive", job.steps.len()));
            };
            job.steps.remove(oldest);
        }
        job.steps.push(proto::StepRecord {
            step,
            name: name.to_string(),
            nodes: nodes.to_vec(),
            ntasks,
            start_ms: now_ms,
            end_ms: None,
            ended_on: Vec::new(),
            exit_code: 0,
            signal: None,
        });
        CommandResult::Ok
    }

    /// Every task of a step on `node` ended: its worst exit counts, and the step ends with its
    /// last node. Applied after its job ended too (the tasks' ends come after the run's).
    #[allow(clippy::too_many_arguments)]
    fn step_ended(
        &mut self,
        id: JobId,
        run: RunNo,
        step: u32,
        node: &str,
        exit_code: i32,
        signal: Option<i32>,
        now_ms: u64,
    ) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        let Some(record) = job.steps.iter_mut().find(|s| job.run == run && s.step == step) else {
            return rejected(format!("unknown step {id}.{step} of run {run}"));
        };
        if !record.nodes.iter().any(|n| n == node) || record.ended_on.iter().any(|n| n == node) {
            return rejected(format!("step {id}.{step} has no tasks left on {node}"));
        }
        record.ended_on.push(node.to_string());
        record.exit_code = record.exit_code.max(exit_code);
        record.signal = record.signal.or(signal);
        if record.ended_on.len() == record.nodes.len() {
            record.end_ms = Some(now_ms);
        }
        CommandResult::Ok
    }

    /// One partition created, changed or deleted (see [`proto::SchedulerPolicy::edit_partition`]):
    /// a partition exists without a definition when a node's node.toml names it, and is in use
    /// while a pending or running job names it (or, naming none, takes the default).
    fn edit_partition(&mut self, edit: &proto::PartitionEdit) -> CommandResult {
        let default = self.policy.default_partition_name().to_string();
        let nodes = &self.nodes;
        let jobs = &self.jobs;
        let named_by_nodes = |p: &str| nodes.values().any(|n| n.inventory.partitions.iter().any(|q| q == p));
        let in_use = |p: &str| jobs.values().any(|j| !j.state.is_final() && j.spec.partition.as_deref().unwrap_or(default.as_str()) == p);
        let is_node = |name: &str| nodes.values().any(|n| n.name == name);
        match self.policy.edit_partition(edit, named_by_nodes, in_use, is_node) {
            Ok(()) => CommandResult::Ok,
            Err(why) => rejected(why),
        }
    }

    /// The scheduler's input built from this state (see [`view::scheduler_view`]).
    pub fn scheduler_view(&self) -> scheduler::ClusterView {
        view::scheduler_view(self)
    }

    fn update_job(
        &mut self,
        id: JobId,
        hold: Option<bool>,
        time_limit_ms: Option<Option<u64>>,
        partition: Option<Option<String>>,
    ) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        if job.state != JobState::Pending {
            return rejected(format!("job {id} is {}: only a pending job can be held, released or updated", job.state));
        }
        if time_limit_ms == Some(Some(0)) {
            return rejected("time limit must be positive");
        }
        let spec = std::sync::Arc::make_mut(&mut job.spec);
        if let Some(h) = hold {
            spec.hold = h;
        }
        if let Some(t) = time_limit_ms {
            spec.time_limit_ms = t;
        }
        if let Some(p) = partition {
            spec.partition = p;
        }
        CommandResult::Ok
    }

    /// GPUs of `node` that no part holds; 0 for an unknown node.
    pub fn gpus_free(&self, node: NodeId) -> u32 {
        let Some(record) = self.nodes.get(&node) else {
            return 0;
        };
        let busy: BTreeSet<u32> = self.parts_on(node).flat_map(|p| p.alloc.gpus.iter().copied()).collect();
        record.inventory.gpus.iter().filter(|g| g.healthy && !busy.contains(&g.index)).count() as u32
    }

    /// CPUs and memory (MiB) held on each node by the jobs' parts: one pass over the jobs.
    pub fn cpus_and_memory_held(&self) -> BTreeMap<NodeId, (u32, u64)> {
        let mut held: BTreeMap<NodeId, (u32, u64)> = BTreeMap::new();
        for p in self.jobs_holding_parts().flat_map(|j| j.parts.iter()) {
            let h = held.entry(p.alloc.node).or_default();
            *h = (h.0.saturating_add(p.alloc.cpus), h.1.saturating_add(p.alloc.mem_mib));
        }
        held
    }

    fn parts_on(&self, node: NodeId) -> impl Iterator<Item = &NodeRun> {
        self.jobs_holding_parts().flat_map(|j| j.parts.iter()).filter(move |p| p.alloc.node == node)
    }

    /// The jobs that hold parts, ascending by id.
    pub fn jobs_holding_parts(&self) -> impl Iterator<Item = &Job> + '_ {
        self.holding_parts.iter().filter_map(|id| self.jobs.get(id))
    }

    /// [`ClusterState::holding_parts`] built from `jobs`.
    pub fn holding_parts_of(jobs: &BTreeMap<JobId, Job>) -> BTreeSet<JobId> {
        jobs.values().filter(|j| !j.parts.is_empty()).map(|j| j.id).collect()
    }

    /// What a submission names that this cluster does not define, in Slurm's words (`None`:
    /// everything it names exists): a partition that neither the policy nor any node's
    /// `partitions` names (the default partition always exists), a QoS the policy lacks
    /// (`normal`, every job's without one, always exists), MIG instances per node that no
    /// node's MIG-mode GPUs could hold in any valid layout (`scheduler::mig::never_fits`), a gang
    /// whose share per node (GPUs, CPUs, memory) too few of its partition's nodes have, in
    /// whatever state (`scheduler::never_holds`). Slurm
    /// refuses these at submit; a job accepted with one would pend for ever. So is a job for a
    /// partition in state DRAIN or INACTIVE, as in Slurm. Accounts are checked apart
    /// ([`ClusterState::accounting_refusal`]).
    pub fn undefined_in_submission(&self, spec: &JobSpec) -> Option<String> {
        if let Some(p) = spec.partition.as_deref() {
            let default = self.policy.default_partition_name();
            let known = p == default
                || self.policy.partitions.iter().any(|d| d.name == p)
                || self.nodes.values().any(|n| n.inventory.partitions.iter().any(|q| q == p));
            if !known {
                return Some("Invalid partition name specified".into());
            }
        }
        let partition = spec.partition.as_deref().unwrap_or(self.policy.default_partition_name());
        if !self.policy.partition_state(partition).takes_submissions() {
            return Some("Required partition not available (inactive or drain)".into());
        }
        if let Some(q) = spec.qos.as_deref() {
            if q != proto::DEFAULT_QOS && !self.policy.qos.iter().any(|d| d.name == q) {
                return Some("Invalid qos specification".into());
            }
        }
        if let Some(GresRequest { gpu_type: Some(profile), count }) = &spec.gres {
            let nodes = self.nodes.values().map(|n| (n.name.as_str(), n.inventory.gpus.as_slice()));
            if let Some(why) = scheduler::mig::never_fits(nodes, profile, *count) {
                return Some(format!("Requested node configuration is not available: {why}"));
            }
        }
        let nodes = self.nodes.values().map(|n| (n.name.as_str(), &*n.inventory));
        scheduler::never_holds(nodes, self.policy.default_partition_name(), spec)
    }

    pub fn node_by_name(&self, name: &str) -> Option<&NodeRecord> {
        self.nodes.values().find(|n| n.name == name)
    }

    /// Jobs holding resources on `node` (running, or stopping and not yet confirmed gone).
    pub fn running_on(&self, node: NodeId) -> Vec<&Job> {
        self.jobs_holding_parts().filter(|j| j.parts.iter().any(|p| p.alloc.node == node)).collect()
    }

    /// Makes the tasks of each array share one spec again where they have the same (a snapshot
    /// decodes each job's spec on its own): the environment and script are held once per
    /// submission, not per task.
    pub fn share_array_specs(&mut self) {
        let mut first: BTreeMap<JobId, std::sync::Arc<JobSpec>> = BTreeMap::new();
        for job in self.jobs.values_mut() {
            let key = match (&job.array, &job.spec.array) {
                (Some(task), _) => task.array_job,
                (None, Some(_)) => job.id,
                (None, None) => continue,
            };
            match first.get(&key) {
                Some(shared) if **shared == *job.spec => job.spec = shared.clone(),
                Some(_) => {}
                None => {
                    first.insert(key, job.spec.clone());
                }
            }
        }
    }

    /// Everything but the jobs (a snapshot's header; the jobs follow in chunks).
    pub fn clone_without_jobs(&self) -> ClusterState {
        ClusterState {
            nodes: self.nodes.clone(),
            jobs: BTreeMap::new(),
            next_job_id: self.next_job_id,
            next_node_id: self.next_node_id,
            policy: self.policy.clone(),
            join_tokens: self.join_tokens.clone(),
            next_token_id: self.next_token_id,
            revoked_certs: self.revoked_certs.clone(),
            revoked_nodes: self.revoked_nodes.clone(),
            retired_instances: self.retired_instances.clone(),
            array_started: self.array_started.clone(),
            usage: self.usage.clone(),
            accounts: self.accounts.clone(),
            submit_keys: Default::default(),
            holding_parts: BTreeSet::new(),
        }
    }

    /// Hex SHA-256 of the encoded state: equal on every replica that applied the same log.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(proto::encode(self)))
    }

    /// The invariants after `cmd`, asserted in release builds too. Debug builds (the tests and
    /// the simulator) check the whole state after every command; release builds check what the
    /// command touched (its job, the jobs it placed and their nodes), and the whole state after
    /// the rare node-wide commands, so a command's cost does not grow with the hot state.
    fn check_after(&self, cmd: &Command) {
        if cfg!(debug_assertions) {
            return self.check_invariants();
        }
        match cmd {
            Command::Submit { .. } | Command::ArchiveJobs { .. } | Command::PruneAccounting { .. } => {
                if let Some(job) = self.jobs.get(&self.next_job_id.saturating_sub(1)) {
                    self.check_job(job);
                }
            }
            Command::LaunchConfirmed { job, .. }
            | Command::RunFinished { job, .. }
            | Command::Cancel { job, .. }
            | Command::Requeue { job, .. }
            | Command::UpdateJob { job, .. } => {
                if let Some(job) = self.jobs.get(job) {
                    self.check_job(job);
                }
            }
            Command::Plan { placements, .. } => {
                let nodes: BTreeSet<NodeId> = placements.iter().flat_map(|p| p.allocs.iter().map(|a| a.node)).collect();
                let mut held: BTreeSet<(NodeId, u32)> = BTreeSet::new();
                for job in self.jobs_holding_parts() {
                    if placements.iter().any(|p| p.job == job.id || job.array.as_ref().is_some_and(|a| a.array_job == p.job)) {
                        self.check_job(job);
                    }
                    for part in job.parts.iter().filter(|p| nodes.contains(&p.alloc.node)) {
                        for &gpu in &part.alloc.gpus {
                            assert!(held.insert((part.alloc.node, gpu)), "gpu {gpu} of node {} held twice", part.alloc.node);
                        }
                    }
                }
            }
            _ => self.check_invariants(),
        }
    }

    /// One job's own invariants.
    fn check_job(&self, job: &Job) {
        assert!(job.id < self.next_job_id, "job {} not below next_job_id {}", job.id, self.next_job_id);
        if job.state == JobState::Running {
            assert!(job.parts.iter().any(|p| p.run == job.run), "running job {} holds no part of run {}", job.id, job.run);
        }
        if job.state == JobState::Pending {
            assert!(job.suspension.since_ms.is_none(), "pending job {} is suspended", job.id);
        }
        let mut nodes_of_run: BTreeSet<(RunNo, NodeId)> = BTreeSet::new();
        for part in &job.parts {
            assert!(part.run <= job.run, "job {} holds a part of future run {}", job.id, part.run);
            assert!(nodes_of_run.insert((part.run, part.alloc.node)), "job {} has two parts on node {}", job.id, part.alloc.node);
            assert!(self.nodes.contains_key(&part.alloc.node), "job {} holds a part on unknown node {}", job.id, part.alloc.node);
        }
    }

    /// Every invariant over the whole state.
    fn check_invariants(&self) {
        assert!(self.submit_keys == crate::submit_keys::SubmitKeys::of(&self.jobs), "the submission keys index its jobs");
        assert!(self.holding_parts == Self::holding_parts_of(&self.jobs), "holding_parts names the jobs that hold parts");
        let mut held: BTreeSet<(NodeId, u32)> = BTreeSet::new();
        for job in self.jobs.values() {
            self.check_job(job);
            for part in &job.parts {
                for &gpu in &part.alloc.gpus {
                    assert!(held.insert((part.alloc.node, gpu)), "gpu {gpu} of node {} held twice", part.alloc.node);
                }
            }
        }
        for node in self.nodes.values() {
            assert!(node.id < self.next_node_id, "node {} not below next_node_id {}", node.id, self.next_node_id);
        }
    }
}

/// Puts a running job back in the queue. Its parts stay until each is confirmed stopped.
fn requeue_job(job: &mut Job, reason: &str) {
    if job.suspended() {
        // Slurm: a suspended job that is requeued is held (JobHeldAdmin).
        std::sync::Arc::make_mut(&mut job.spec).hold = true;
    }
    job.suspension.since_ms = None;
    job.state = JobState::Pending;
    job.restart_count = job.restart_count.saturating_add(1);
    job.exit_code = None;
    job.start_ms = None;
    job.end_ms = None;
    job.outcomes.clear();
    job.reasons = vec![format!("requeued: {reason}")];
}

trait SetUp {
    fn set_up(&mut self, now_ms: u64);
}

impl SetUp for NodeRecord {
    /// The node answers again: UP, or DRAINED if an operator drained it.
    fn set_up(&mut self, now_ms: u64) {
        let state = if self.drained { NodeState::Drained } else { NodeState::Up };
        if self.state != state {
            self.state = state;
            self.state_changed_ms = now_ms;
        }
        if !self.drained {
            self.state_reason = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use proto::{Allocation, GpuInfo, GresRequest};

    use super::*;

    fn inventory(gpus: u32) -> Inventory {
        Inventory {
            gpus: (0..gpus)
                .map(|i| GpuInfo {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    model: "H100".into(),
                    gres_type: "h100".into(),
                    memory_mib: 81_559,
                    healthy: true,
                    ..GpuInfo::default()
                })
                .collect(),
            cpus: 64,
            memory_mib: 512 * 1024,
            ..Inventory::default()
        }
    }

    fn spec(gpus: u32, nodes: u32) -> JobSpec {
        let mut s = JobSpec::command(vec!["true".into()], "/tmp", "alice");
        s.gres = Some(GresRequest { gpu_type: None, count: gpus });
        s.nodes = nodes;
        s
    }

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

    fn register(s: &mut ClusterState, name: &str, instance: InstanceId) -> NodeId {
        let cmd = Command::RegisterNode {
            name: name.into(),
            addr: format!("{name}:1"),
            inventory: inventory(8),
            instance,
            cert_fingerprint: String::new(),
            now_ms: 1,
        };
        match s.apply(&cmd) {
            CommandResult::NodeRegistered { id } => id,
            other => panic!("register {name}: {other:?}"),
        }
    }

    /// A state with one node, `n1`, of `inventory`.
    fn with_node_n1(inventory: Inventory) -> ClusterState {
        let mut s = ClusterState::default();
        let cmd = Command::RegisterNode {
            name: "n1".into(),
            addr: "a".into(),
            inventory,
            instance: 1,
            cert_fingerprint: String::new(),
            now_ms: 0,
        };
        assert!(matches!(s.apply(&cmd), CommandResult::NodeRegistered { .. }));
        s
    }

    fn submit(s: &mut ClusterState, spec: JobSpec) -> JobId {
        match s.apply(&Command::Submit { spec, now_ms: 10 }) {
            CommandResult::Submitted { job } => job,
            other => panic!("submit: {other:?}"),
        }
    }

    fn alloc(node: NodeId, gpus: &[u32]) -> Allocation {
        Allocation { node, gpus: gpus.to_vec(), cpus: 1, mem_mib: 1024 }
    }

    fn plan(s: &mut ClusterState, job: JobId, run: RunNo, allocs: Vec<Allocation>) -> CommandResult {
        s.apply(&Command::Plan { placements: vec![Placement { job, run, allocs }], array_tasks: vec![], now_ms: 20 })
    }

    fn confirm(s: &mut ClusterState, job: JobId, run: RunNo, node: NodeId, instance: InstanceId) -> CommandResult {
        s.apply(&Command::LaunchConfirmed { job, run, node, instance, now_ms: 30 })
    }

    fn finish(s: &mut ClusterState, job: JobId, run: RunNo, node: NodeId, outcome: RunOutcome) -> CommandResult {
        s.apply(&Command::RunFinished { job, run, node, outcome, usage: Default::default(), now_ms: 5_030 })
    }

    /// Two nodes (instances 100 and 200) and a 2-node job running on both.
    fn gang() -> (ClusterState, NodeId, NodeId, JobId) {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 100);
        let b = register(&mut s, "b", 200);
        let job = submit(&mut s, spec(2, 2));
        assert_eq!(
            plan(&mut s, job, 1, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
        assert_eq!(confirm(&mut s, job, 1, a, 100), CommandResult::Ok);
        assert_eq!(confirm(&mut s, job, 1, b, 200), CommandResult::Ok);
        (s, a, b, job)
    }

    #[test]
    fn a_cached_view_reuses_unchanged_jobs_and_equals_a_fresh_view_after_every_change() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 100);
        let mut cache = view::ViewCache::default();
        let mut step = |s: &ClusterState, reused: usize, made: usize, what: &str| {
            let cached = view::scheduler_view_cached(s, &mut cache, |_| None);
            assert_eq!(cached, view::scheduler_view(s), "{what}: the cached view is the fresh one");
            assert_eq!((cache.reused, cache.made), (reused, made), "{what}: requests reused and made");
        };
        let limited = JobSpec { time_limit_ms: Some(60_000), ..spec(1, 1) };
        let jobs: Vec<JobId> = (0..4).map(|_| submit(&mut s, limited.clone())).collect();
        step(&s, 0, 4, "first view");
        step(&s, 4, 0, "nothing changed");
        submit(&mut s, spec(1, 1));
        step(&s, 4, 1, "a new job");
        plan(&mut s, jobs[0], 1, vec![alloc(a, &[0])]);
        step(&s, 4, 1, "a placement changes the job's parts");
        confirm(&mut s, jobs[0], 1, a, 100);
        step(&s, 4, 1, "a confirmation starts its run");
        s.apply(&Command::UpdateJob { job: jobs[1], hold: Some(true), time_limit_ms: None, partition: None, now_ms: 40 });
        step(&s, 4, 1, "a hold changes the spec");
        s.apply(&Command::Suspend { job: jobs[0], suspend: true, now_ms: 50 });
        step(&s, 4, 1, "a suspension drops the time limit");
        s.apply(&Command::Cancel { job: jobs[2], now_ms: 60 });
        step(&s, 4, 0, "a cancelled job leaves the view");
        finish(&mut s, jobs[0], 1, a, RunOutcome::Exited(0));
        step(&s, 3, 0, "a finished job leaves the view");
    }

    #[test]
    fn a_cached_view_rebuilds_only_the_nodes_that_changed() {
        let mut s = ClusterState::default();
        let (a, b, c) = (register(&mut s, "a", 100), register(&mut s, "b", 200), register(&mut s, "c", 300));
        let mut cache = view::ViewCache::default();
        let mut step = |s: &ClusterState, reused: usize, what: &str| {
            let cached = view::scheduler_view_cached(s, &mut cache, |_| None);
            assert_eq!(cached, view::scheduler_view(s), "{what}: the cached view is the fresh one");
            assert_eq!(cache.nodes_reused, reused, "{what}: node views reused");
        };
        step(&s, 0, "first view");
        step(&s, 3, "nothing changed");
        let job = submit(&mut s, spec(2, 1));
        step(&s, 3, "a pending job takes nothing");
        assert_eq!(plan(&mut s, job, 1, vec![alloc(a, &[0, 1])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        step(&s, 2, "a placement takes GPUs of a");
        confirm(&mut s, job, 1, a, 100);
        step(&s, 3, "a confirmation takes nothing more");
        s.apply(&Command::GpuHealth { node: b, gpu: 3, mig_uuid: None, healthy: false, reason: "xid 79".into(), now_ms: 40 });
        step(&s, 2, "a GPU of b unhealthy (its inventory changed in place)");
        s.apply(&Command::Drain { node: c, reason: "maintenance".into(), now_ms: 50 });
        step(&s, 2, "c drained");
        s.apply(&Command::Resume { node: c, now_ms: 60 });
        step(&s, 2, "c resumed");
        s.apply(&Command::NodeDown { node: b, reason: "silent".into(), now_ms: 70 });
        step(&s, 2, "b down");
        register(&mut s, "b", 201);
        step(&s, 2, "b back with a new instance");
        let mut policy = s.policy.clone();
        policy.partitions.push(proto::PartitionDef { name: "gpu".into(), nodes: Some(vec!["a".into(), "c".into()]), ..Default::default() });
        assert_eq!(s.apply(&Command::SetPolicy { policy, now_ms: 80 }), CommandResult::Ok);
        step(&s, 0, "a new policy (partitions list nodes)");
        finish(&mut s, job, 1, a, RunOutcome::Exited(0));
        step(&s, 2, "a's GPUs free again");
        step(&s, 3, "nothing changed");
    }

    #[test]
    fn register_assigns_ids_and_reregister_keeps_them() {
        let mut s = ClusterState::default();
        assert_eq!(register(&mut s, "a", 1), 1);
        assert_eq!(register(&mut s, "b", 2), 2);
        assert_eq!(register(&mut s, "a", 1), 1);
        assert_eq!(s.nodes.len(), 2);
        assert_eq!(s.node_by_name("b").map(|n| n.id), Some(2));
    }

    #[test]
    fn gang_starts_on_all_nodes_and_completes_when_all_report() {
        let (mut s, a, b, job) = gang();
        assert_eq!(s.jobs[&job].state, JobState::Running);
        assert_eq!(s.jobs[&job].start_ms, Some(30));
        assert_eq!(s.gpus_free(a), 6);
        assert_eq!(finish(&mut s, job, 1, a, RunOutcome::Exited(0)), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Running, "one node still runs");
        assert_eq!(s.jobs[&job].parts_to_stop().count(), 0, "a clean exit stops nothing");
        assert_eq!(s.gpus_free(a), 8);
        assert_eq!(finish(&mut s, job, 1, b, RunOutcome::Exited(0)), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.exit_code, j.end_ms), (JobState::Completed, Some(0), Some(5_030)));
        assert_eq!(j.gpu_seconds, 2 * 5 + 2 * 5);
        assert!(j.parts.is_empty());
    }

    #[test]
    fn a_run_keeps_its_whole_gang_in_rank_order_after_some_parts_ended() {
        // A launch re-sent to the last node after the others finished must still name all of
        // them, and give it its rank: seen as a 1-node SLURM_JOB_NODELIST under load.
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, a, RunOutcome::Exited(0));
        let j = &s.jobs[&job];
        assert_eq!(j.parts.len(), 1);
        assert_eq!(j.run_nodes(), &[a, b]);
        assert_eq!((j.rank_of(a), j.rank_of(b)), (Some(0), Some(1)));
    }

    /// Two nodes and a 2-node batch job (`sbatch`) running on both, `a` first.
    fn batch_gang() -> (ClusterState, NodeId, NodeId, JobId) {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 100);
        let b = register(&mut s, "b", 200);
        let mut batch = spec(2, 2);
        batch.set_batch(true);
        let job = submit(&mut s, batch);
        plan(&mut s, job, 1, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]);
        confirm(&mut s, job, 1, a, 100);
        confirm(&mut s, job, 1, b, 200);
        (s, a, b, job)
    }

    #[test]
    fn a_batch_job_ends_with_its_script_and_the_script_decides_its_state() {
        let (mut s, a, b, job) = batch_gang();
        finish(&mut s, job, 1, a, RunOutcome::Exited(0));
        let stop: Vec<NodeId> = s.jobs[&job].parts_to_stop().map(|p| p.alloc.node).collect();
        assert_eq!(stop, vec![b], "the script ended: the node holding GPUs for steps is released");
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        assert_eq!((s.jobs[&job].state, s.jobs[&job].exit_code), (JobState::Completed, Some(0)), "the holder's kill decides nothing");

        let (mut s, a, b, job) = batch_gang();
        finish(&mut s, job, 1, a, RunOutcome::Exited(2));
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        assert_eq!((s.jobs[&job].state, s.jobs[&job].exit_code), (JobState::Failed, Some(2)));

        // A holder that fails on its own before the script ends stops the job and fails it.
        let (mut s, a, b, job) = batch_gang();
        finish(&mut s, job, 1, b, RunOutcome::LaunchFailed("no account".into()));
        assert_eq!(s.jobs[&job].parts_to_stop().map(|p| p.alloc.node).collect::<Vec<_>>(), vec![a]);
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        assert_eq!(s.jobs[&job].state, JobState::Failed);

        // While the script runs, nothing is stopped.
        let (s, _a, _b, job) = batch_gang();
        assert_eq!(s.jobs[&job].parts_to_stop().count(), 0);

        // A holder stopped before its launch arrived, after the script ended: not a node failure.
        let (mut s, a, b, job) = batch_gang();
        finish(&mut s, job, 1, a, RunOutcome::Exited(0));
        finish(&mut s, job, 1, b, RunOutcome::Lost("stopped before it started".into()));
        assert_eq!(s.jobs[&job].state, JobState::Completed);
    }

    #[test]
    fn a_submission_naming_an_undefined_partition_or_qos_is_refused_in_slurms_words() {
        let mut inv = scheduler::testkit::dgx("gpu:h100:8");
        inv.partitions = vec!["gpu".into()];
        let mut s = with_node_n1(inv);
        let with = |s: &ClusterState, partition: Option<&str>, qos: Option<&str>| {
            let mut spec = scheduler::testkit::spec("gpu:1", 1);
            spec.partition = partition.map(str::to_string);
            spec.qos = qos.map(str::to_string);
            s.undefined_in_submission(&spec)
        };
        assert_eq!(with(&s, None, None), None);
        assert_eq!(with(&s, Some("gpu"), None), None, "a node names it");
        assert_eq!(with(&s, Some(proto::DEFAULT_PARTITION), None), None, "the default partition always exists");
        assert_eq!(with(&s, Some("long"), None).as_deref(), Some("Invalid partition name specified"));
        assert_eq!(with(&s, None, Some(proto::DEFAULT_QOS)), None);
        assert_eq!(with(&s, None, Some("high")).as_deref(), Some("Invalid qos specification"));
        s.policy.partitions.push(proto::PartitionDef { name: "long".into(), default: true, ..Default::default() });
        s.policy.qos.push(proto::QosDef {
            name: "high".into(),
            priority: 10,
            preempt: vec![],
            preempt_mode: "requeue".into(),
            limits: Default::default(),
        });
        assert_eq!(with(&s, Some("long"), Some("high")), None, "the policy defines both");
        assert_eq!(
            with(&s, Some(proto::DEFAULT_PARTITION), None).as_deref(),
            Some("Invalid partition name specified"),
            "`long` is the default now"
        );
    }

    #[test]
    fn partitions_edited_through_the_log_take_or_refuse_submissions_by_their_state() {
        let mut inv = scheduler::testkit::dgx("gpu:h100:8");
        inv.partitions = vec!["gpu".into()];
        let mut s = with_node_n1(inv);
        let edit = |s: &mut ClusterState, edit: proto::PartitionEdit| s.apply(&Command::EditPartition { edit, now_ms: 1 });
        let state = |st| proto::PartitionChanges { state: Some(st), ..Default::default() };
        let submit_to = |s: &ClusterState, p: &str| {
            let mut spec = scheduler::testkit::spec("gpu:1", 1);
            spec.partition = Some(p.into());
            s.undefined_in_submission(&spec)
        };
        let refused = Some("Required partition not available (inactive or drain)".to_string());
        // `gpu` exists through node.toml; an update defines it in the policy.
        for (st, answer) in [
            (proto::PartitionState::Drain, refused.clone()),
            (proto::PartitionState::Inactive, refused.clone()),
            (proto::PartitionState::Down, None),
            (proto::PartitionState::Up, None),
        ] {
            assert_eq!(edit(&mut s, proto::PartitionEdit::Update { name: "gpu".into(), changes: state(st) }), CommandResult::Ok);
            assert_eq!(submit_to(&s, "gpu"), answer, "{st:?}");
        }
        assert_eq!(s.scheduler_view().partitions["gpu"].state, proto::PartitionState::Up);
        // A partition a pending job names is in use.
        let created = proto::PartitionEdit::Create { name: "short".into(), changes: Default::default() };
        assert_eq!(edit(&mut s, created.clone()), CommandResult::Ok);
        assert_eq!(edit(&mut s, created), CommandResult::Rejected("Invalid partition name specified".into()));
        let mut spec = scheduler::testkit::spec("gpu:1", 1);
        spec.partition = Some("short".into());
        let job = submit(&mut s, spec);
        let delete = proto::PartitionEdit::Delete { name: "short".into() };
        assert_eq!(edit(&mut s, delete.clone()), CommandResult::Rejected("Partition is in use".into()));
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 2 }), CommandResult::Ok);
        assert_eq!(edit(&mut s, delete), CommandResult::Ok);
        assert_eq!(submit_to(&s, "short").as_deref(), Some("Invalid partition name specified"));
    }

    #[test]
    fn a_mig_request_no_node_could_ever_hold_is_refused_with_the_hardware_limit() {
        let mut inv = scheduler::testkit::dgx("gpu:h100:8");
        inv.gpus = vec![GpuInfo { model: "NVIDIA H200".into(), memory_mib: 143_771, mig_enabled: true, ..Default::default() }];
        let s = with_node_n1(inv);
        let asking = |gres: &str| s.undefined_in_submission(&scheduler::testkit::spec(gres, 1));
        assert_eq!(
            asking("gpu:3g.71gb:7").as_deref(),
            Some("Requested node configuration is not available: no node can ever hold 7x 3g.71gb at once: one H200 holds at most 2 (MIG slice rules), and the most any node holds is 2 (n1)")
        );
        assert_eq!(asking("gpu:3g.71gb:2"), None);
        assert_eq!(asking("gpu:1g.18gb:7"), None);
    }

    #[test]
    fn a_gang_no_node_could_ever_hold_is_refused_at_submit_whatever_the_nodes_state() {
        let mut s = with_node_n1(scheduler::testkit::dgx("h100"));
        let asking = |s: &ClusterState, gres: &str, nodes: u32, edit: &dyn Fn(&mut JobSpec)| {
            let mut spec = scheduler::testkit::spec(gres, nodes);
            spec.mem_mib = 1024;
            edit(&mut spec);
            s.undefined_in_submission(&spec)
        };
        let same = |_: &mut JobSpec| {};
        assert_eq!(
            asking(&s, "gpu:9", 1, &same).as_deref(),
            Some(
                "Requested node configuration is not available: needs 1 node(s) with 9x gpu, 1 cpus and 1024 MiB each; \
                 partition default has 0 (largest: 8x gpu, 112 cpus, 2097152 MiB)"
            )
        );
        assert_eq!(asking(&s, "gpu:8", 1, &same), None);
        assert!(asking(&s, "gpu:h100:9", 1, &same).is_some_and(|w| w.contains("with 9x gpu:h100")));
        assert_eq!(asking(&s, "gpu:a100:9", 1, &same), None, "no node has the type: one may join");
        assert_eq!(
            asking(&s, "gpu:1", 2, &same).as_deref(),
            Some("Node count specification invalid: needs 2 nodes; partition default has 1")
        );
        assert!(asking(&s, "", 1, &|x| x.cpus_per_task = 113).is_some());
        assert!(asking(&s, "", 1, &|x| x.mem_mib = 3 * 1024 * 1024).is_some());
        assert!(asking(&s, "", 1, &|x| x.constraint = vec!["ib".into()]).is_some(), "no node has the feature");
        assert!(asking(&s, "", 1, &|x| x.exclude = vec!["n1".into()]).is_some());
        s.policy.partitions.push(proto::PartitionDef { name: "gpu".into(), ..Default::default() });
        assert_eq!(asking(&s, "", 1, &|x| x.partition = Some("gpu".into())), None, "no node of `gpu` yet: one may join");
        let cpu_only = with_node_n1(Inventory { gpus: Vec::new(), ..scheduler::testkit::dgx("h100") });
        assert_eq!(asking(&cpu_only, "gpu:1", 1, &same), None, "no node with a GPU yet: one may join");
        assert!(asking(&cpu_only, "", 1, &|x| x.cpus_per_task = 113).is_some());
        // Down or drained, the node still counts: it may come back.
        let id = s.nodes.values().map(|n| n.id).next().expect("n1");
        s.apply(&Command::NodeDown { node: id, reason: "test".into(), now_ms: 1 });
        assert_eq!(asking(&s, "gpu:8", 1, &same), None);
        assert!(asking(&s, "gpu:9", 1, &same).is_some());
    }

    #[test]
    fn a_mig_layout_is_pinned_only_if_the_gpu_can_hold_it() {
        let mut inv = scheduler::testkit::h200_mig(&[&[("1g.18gb", 0)]]);
        inv.gpus.push(GpuInfo { index: 1, model: "NVIDIA H200".into(), memory_mib: 143_771, ..Default::default() });
        let mut s = with_node_n1(inv);
        let id = s.nodes.values().map(|n| n.id).next().expect("n1");
        let mut pin = |gpu: u32, profiles: Option<&[&str]>| {
            let profiles = profiles.map(|p| p.iter().map(|x| x.to_string()).collect());
            s.apply(&Command::PinMigLayout { node: id, gpu, profiles, now_ms: 1 })
        };
        // As `nvidia-smi mig -cgi 9,9,9` on an H200 would refuse it.
        assert_eq!(
            pin(0, Some(&["3g.71gb", "3g.71gb", "3g.71gb"])),
            CommandResult::Rejected("gpu 0 of node n1: cannot place 3x 3g.71gb on one H200: at most 2 per GPU".into())
        );
        assert_eq!(
            pin(1, Some(&["1g.18gb"])),
            CommandResult::Rejected(
                "gpu 1 of node n1 is not in MIG mode (Corral never changes a GPU's MIG mode: an operator enables it on the node)".into()
            )
        );
        assert_eq!(pin(2, None), CommandResult::Rejected("node n1 has no gpu 2".into()));
        // Kept in the order the instances start on the GPU.
        assert_eq!(pin(0, Some(&["1g.18gb", "4g.71gb", "2g.35gb"])), CommandResult::Ok);
        let record = &s.nodes[&id];
        assert_eq!(record.mig_pinned[&0], vec!["4g.71gb", "2g.35gb", "1g.18gb"]);
        let unapplied: Vec<u32> = record.mig_pins_unapplied().map(|(gpu, _)| gpu).collect();
        assert_eq!(unapplied, vec![0]);
        assert!(view::node_views(&s)[&id].gpus[0].draining());
        assert_eq!(s.apply(&Command::PinMigLayout { node: id, gpu: 0, profiles: None, now_ms: 2 }), CommandResult::Ok);
        assert!(s.nodes[&id].mig_pinned.is_empty());
    }

    #[test]
    fn a_mig_instance_is_accounted_by_its_share_of_the_gpus_compute() {
        let inv = scheduler::testkit::h200_mig(&[&[("3g.71gb", 0), ("1g.18gb", 6)]]);
        let mut s = with_node_n1(inv);
        let id = s.nodes.values().map(|n| n.id).next().expect("n1");
        let mig = |profile: &str| {
            let mut sp = spec(1, 1);
            sp.gres = Some(GresRequest { gpu_type: Some(profile.into()), count: 1 });
            sp.account = Some("physics".into());
            sp
        };
        let mut ran = Vec::new();
        for (sp, slot) in [(mig("3g.71gb"), scheduler::mig_slot(0, 0)), (mig("1g.18gb"), scheduler::mig_slot(0, 6))] {
            let job = submit(&mut s, sp);
            assert_eq!(plan(&mut s, job, 1, vec![alloc(id, &[slot])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
            assert_eq!(confirm(&mut s, job, 1, id, 1), CommandResult::Ok);
            ran.push(job);
        }
        // Seven seconds each (started at 30): 3/7 and 1/7 of a GPU.
        for job in &ran {
            let end = Command::RunFinished {
                job: *job,
                run: 1,
                node: id,
                outcome: RunOutcome::Exited(0),
                usage: Default::default(),
                now_ms: 7_030,
            };
            assert_eq!(s.apply(&end), CommandResult::Ok);
        }
        assert_eq!(ran.iter().map(|j| s.jobs[j].gpu_seconds).collect::<Vec<_>>(), vec![3, 1]);
        let usage = s.usage.get(&("physics".to_string(), "alice".to_string()));
        assert_eq!(usage, Some(&proto::accounts::Usage { gpu_ms: 4_000, at_ms: 7_030 }), "{:?}", s.usage);
        // With a one-minute half-life, a run ending a minute later finds that usage halved.
        s.policy.priority_decay_half_life_min = Some(1);
        let job = submit(&mut s, mig("1g.18gb"));
        let slot = scheduler::mig_slot(0, 6);
        assert_eq!(plan(&mut s, job, 1, vec![alloc(id, &[slot])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        assert_eq!(confirm(&mut s, job, 1, id, 1), CommandResult::Ok);
        let end = Command::RunFinished { job, run: 1, node: id, outcome: RunOutcome::Exited(0), usage: Default::default(), now_ms: 67_030 };
        assert_eq!(s.apply(&end), CommandResult::Ok);
        // 2,000 left of 4,000, plus 67 s of 1/7 of a GPU.
        let usage = s.usage.get(&("physics".to_string(), "alice".to_string()));
        assert_eq!(usage, Some(&proto::accounts::Usage { gpu_ms: 2_000 + 67_000 / 7, at_ms: 67_030 }), "{:?}", s.usage);
        // A whole GPU counts whole, and a profile no table knows by its name.
        assert_eq!(scheduler::mig::slot_compute_slices(3, Some("h200")), 7);
        assert_eq!(scheduler::mig::slot_compute_slices(scheduler::mig_slot(0, 0), Some("2g.12gb")), 2);
        assert_eq!(scheduler::mig::slot_compute_slices(scheduler::mig_slot(0, 0), Some("mystery")), 1);
    }

    #[test]
    fn master_ports_are_never_shared_on_a_first_node() {
        let (mut s, a, _b, first) = gang();
        let second = submit(&mut s, spec(1, 1));
        plan(&mut s, second, 1, vec![alloc(a, &[4])]);
        assert_eq!(s.jobs[&first].master_port, Some(proto::MASTER_PORT_FIRST));
        assert_eq!(s.jobs[&second].master_port, Some(proto::MASTER_PORT_FIRST + 1));
    }

    #[test]
    fn a_failed_part_stops_the_gang_and_decides_the_state() {
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, b, RunOutcome::Exited(3));
        let stop: Vec<NodeId> = s.jobs[&job].parts_to_stop().map(|p| p.alloc.node).collect();
        assert_eq!(stop, vec![a]);
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.exit_code), (JobState::Failed, Some(3)), "the part that failed decides, not the kill that stopped the rest");
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, a, RunOutcome::TimedOut);
        finish(&mut s, job, 1, b, RunOutcome::TimedOut);
        assert_eq!(s.jobs[&job].state, JobState::Timeout);
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, a, RunOutcome::Signaled(9));
        finish(&mut s, job, 1, b, RunOutcome::Exited(0));
        assert_eq!((s.jobs[&job].state, s.jobs[&job].exit_code), (JobState::Failed, Some(137)));
        let (mut s, a, b, job) = gang();
        finish(&mut s, job, 1, a, RunOutcome::OutOfMemory("the kernel killed 1 process".into()));
        finish(&mut s, job, 1, b, RunOutcome::Signaled(9));
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.exit_code), (JobState::OutOfMemory, None), "an OOM kill ranks above a signal");
        assert!(
            j.reason().is_some_and(|r| r.contains("out of memory on node") && r.contains("the kernel killed 1 process")),
            "{:?}",
            j.reason()
        );
    }

    #[test]
    fn plan_rejects_stale_wrong_shaped_and_double_placements() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let b = register(&mut s, "b", 2);
        let j1 = submit(&mut s, spec(4, 1));
        let j2 = submit(&mut s, spec(4, 1));
        let j3 = submit(&mut s, spec(1, 2));
        let placements = vec![
            Placement { job: j1, run: 1, allocs: vec![alloc(a, &[0, 1, 2, 3])] },
            Placement { job: j2, run: 1, allocs: vec![alloc(a, &[3, 4, 5, 6])] },
            Placement { job: j3, run: 1, allocs: vec![alloc(b, &[0])] },
            Placement { job: 99, run: 1, allocs: vec![alloc(b, &[1])] },
        ];
        let CommandResult::Planned { accepted, rejected } = s.apply(&Command::Plan { placements, array_tasks: vec![], now_ms: 5 }) else {
            panic!("not planned")
        };
        assert_eq!(accepted, vec![j1]);
        let reasons: BTreeMap<JobId, String> = rejected.into_iter().collect();
        assert_eq!(reasons[&99], "job 99 does not exist");
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert!(reasons[&j2].contains("gpu 3 is busy"), "{}", reasons[&j2]);
        assert!(reasons[&j3].contains('2') && reasons[&j3].contains("node"), "{}", reasons[&j3]);
        assert_eq!(
            plan(&mut s, j2, 2, vec![alloc(b, &[0, 1, 2, 3])]),
            CommandResult::Planned { accepted: vec![], rejected: vec![(j2, "stale plan: run 2 but the next run is 1".into())] }
        );
        assert_eq!(
            plan(&mut s, j3, 1, vec![alloc(b, &[0]), alloc(b, &[1])]),
            CommandResult::Planned { accepted: vec![], rejected: vec![(j3, "node 2 listed twice".into())] }
        );
        assert_eq!(
            plan(&mut s, j1, 2, vec![alloc(b, &[0, 1, 2, 3])]).clone(),
            CommandResult::Planned { accepted: vec![], rejected: vec![(j1, "job 1 is RUNNING, not PENDING".into())] }
        );
    }

    #[test]
    fn launch_confirmation_only_for_the_current_run_and_node() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let job = submit(&mut s, spec(1, 1));
        plan(&mut s, job, 1, vec![alloc(a, &[0])]);
        assert!(matches!(confirm(&mut s, job, 2, a, 1), CommandResult::Rejected(_)));
        assert!(matches!(confirm(&mut s, job, 1, 7, 1), CommandResult::Rejected(_)));
        assert_eq!(s.jobs[&job].launches_pending().count(), 1);
        assert_eq!(confirm(&mut s, job, 1, a, 1), CommandResult::Ok);
        assert!(matches!(confirm(&mut s, job, 1, a, 1), CommandResult::Rejected(_)), "confirmed once");
        assert_eq!(s.jobs[&job].launches_pending().count(), 0);
    }

    #[test]
    fn stale_run_reports_are_ignored() {
        let (mut s, a, _b, job) = gang();
        assert_eq!(finish(&mut s, job, 7, a, RunOutcome::Exited(0)), CommandResult::Rejected("stale run".into()));
        assert_eq!(s.jobs[&job].state, JobState::Running);
    }

    #[test]
    fn node_down_fails_the_gang_and_the_other_part_is_stopped() {
        let (mut s, a, b, job) = gang();
        s.apply(&Command::NodeDown { node: b, reason: "no heartbeat".into(), now_ms: 4_030 });
        let j = &s.jobs[&job];
        assert_eq!(j.state, JobState::NodeFail);
        assert_eq!(j.reasons, vec!["node b down: no heartbeat".to_string()]);
        assert_eq!(j.parts_to_stop().map(|p| p.alloc.node).collect::<Vec<_>>(), vec![a]);
        assert_eq!(s.gpus_free(b), 8);
        assert_eq!(s.gpus_free(a), 6, "the surviving part holds its GPUs until it is gone");
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        assert_eq!(s.jobs[&job].state, JobState::NodeFail);
        assert_eq!(s.gpus_free(a), 8);
    }

    #[test]
    fn requeue_waits_for_the_old_run_to_stop_before_a_new_start() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let b = register(&mut s, "b", 2);
        let mut sp = spec(2, 2);
        sp.requeue = true;
        let job = submit(&mut s, sp);
        plan(&mut s, job, 1, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]);
        confirm(&mut s, job, 1, a, 1);
        confirm(&mut s, job, 1, b, 2);
        s.apply(&Command::NodeDown { node: b, reason: "no heartbeat".into(), now_ms: 40 });
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.restart_count, j.run), (JobState::Pending, 1, 1));
        assert_eq!(j.reasons, vec!["requeued: node b down: no heartbeat".to_string()]);
        assert!(!view::placeable(&s.jobs[&job]), "not placeable while run 1 still runs on a");
        assert!(scheduler::schedule(&s.scheduler_view(), 50).placements.is_empty());
        let c = register(&mut s, "c", 3);
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(c, &[0, 1]), alloc(a, &[2, 3])]),
            CommandResult::Planned { accepted: vec![], rejected: vec![(job, "job 1 still has parts of run 1 stopping".into())] }
        );
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        assert_eq!(s.jobs[&job].state, JobState::Pending, "a report of the old run does not end the job");
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(c, &[0, 1]), alloc(a, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
        assert_eq!(s.jobs[&job].run, 2);
    }

    #[test]
    fn a_resent_submission_gets_the_job_the_first_made_and_makes_none() {
        let mut s = ClusterState::default();
        register(&mut s, "a", 1);
        let keyed = |user: &str, key| JobSpec { submit_key: Some(key), ..JobSpec::command(vec!["true".into()], "/tmp", user) };
        let first = submit(&mut s, keyed("alice", 7));
        let jobs = s.jobs.len();
        // Resent after a failover: in one batch with a new submission, as the group commit may.
        let batch = Command::Batch {
            commands: vec![
                Command::Submit { spec: keyed("alice", 7), now_ms: 20 },
                Command::Submit { spec: keyed("alice", 8), now_ms: 20 },
            ],
        };
        let CommandResult::Batch(results) = s.apply(&batch) else { panic!("a batch answers a batch") };
        assert_eq!(results[0], CommandResult::Submitted { job: first });
        assert_eq!(results[1], CommandResult::Submitted { job: first + 1 });
        assert_eq!(s.jobs.len(), jobs + 1, "only the new submission made a job");
        assert!(matches!(s.apply(&Command::Submit { spec: keyed("bob", 7), now_ms: 30 }), CommandResult::Rejected(_)));
        // Its job ended and still in the hot state: still the answer; archived: a new job.
        s.apply(&Command::Cancel { job: first, now_ms: 40 });
        assert_eq!(s.apply(&Command::Submit { spec: keyed("alice", 7), now_ms: 50 }), CommandResult::Submitted { job: first });
        s.apply(&Command::ArchiveJobs { jobs: vec![first], now_ms: 60 });
        assert_eq!(s.apply(&Command::Submit { spec: keyed("alice", 7), now_ms: 70 }), CommandResult::Submitted { job: first + 2 });
        // A submission without a key is always new.
        let plain = JobSpec::command(vec!["true".into()], "/tmp", "alice");
        assert_ne!(submit(&mut s, plain.clone()), submit(&mut s, plain));
        // The index is not encoded: a replica that reads the state builds it from the jobs.
        let read: ClusterState = proto::decode(&proto::encode(&s), usize::MAX).expect("decode");
        assert!(read.submit_keys.is_empty());
        assert_eq!(crate::submit_keys::SubmitKeys::of(&read.jobs), s.submit_keys);
    }

    #[test]
    fn a_plan_is_checked_against_views_of_the_nodes_it_names_alone() {
        let (mut s, a, b, _) = gang();
        let c = register(&mut s, "c", 300);
        let named: BTreeSet<NodeId> = [b, c].into();
        let among = view::node_views_among(&s, &named);
        let all = view::node_views(&s);
        assert_eq!(among.keys().copied().collect::<Vec<_>>(), vec![b, c]);
        assert!(among.iter().all(|(id, v)| all[id] == *v), "the same views, parts taken");
        assert!(all.contains_key(&a) && !among.contains_key(&a));
    }

    #[test]
    fn a_node_stopped_gracefully_is_down_at_once_and_its_instance_cannot_come_back() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let mut sp = spec(2, 1);
        sp.requeue = true;
        let job = submit(&mut s, sp);
        // Placed on a, its launch not yet arrived when a stopped: no report will come.
        assert_eq!(plan(&mut s, job, 1, vec![alloc(a, &[0, 1])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        assert!(s.parts_on(a).next().is_some());
        let stopped = |instance| Command::NodeStopped { node: a, instance, now_ms: 30 };
        assert!(matches!(s.apply(&stopped(9)), CommandResult::Rejected(_)), "not a's current instance");
        assert_eq!(s.nodes[&a].state, NodeState::Up);
        assert_eq!(s.apply(&stopped(1)), CommandResult::Ok);
        assert_eq!(s.nodes[&a].state, NodeState::Down);
        assert_eq!(s.nodes[&a].state_reason.as_deref(), Some(NODE_STOPPED_REASON));
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.restart_count), (JobState::Pending, 1), "queued again at once");
        assert!(s.parts_on(a).next().is_none());
        // A beat the stopped instance sent before it stopped brings nothing back; its next
        // instance does.
        assert!(matches!(s.apply(&Command::NodeUp { node: a, instance: 1, now_ms: 40 }), CommandResult::Rejected(_)));
        assert_eq!(s.nodes[&a].state, NodeState::Down);
        assert_eq!(s.apply(&Command::NodeUp { node: a, instance: 2, now_ms: 50 }), CommandResult::Ok);
        assert_eq!((s.nodes[&a].state, s.nodes[&a].instance), (NodeState::Up, 2));
    }

    #[test]
    fn operator_requeue_of_running_jobs_not_pending_ones() {
        let (mut s, _a, _b, job) = gang();
        assert_eq!(s.apply(&Command::Requeue { job, reason: "by user".into(), now_ms: 50 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].parts_to_stop().count(), 2);
        assert_eq!(
            s.apply(&Command::Requeue { job, reason: "again".into(), now_ms: 51 }),
            CommandResult::Rejected("Job is pending execution".into())
        );
    }

    #[test]
    fn a_finished_job_requeued_runs_again_as_its_next_run() {
        let (mut s, a, b, job) = gang();
        assert_eq!(finish(&mut s, job, 1, a, RunOutcome::Exited(1)), CommandResult::Ok);
        assert_eq!(finish(&mut s, job, 1, b, RunOutcome::Exited(0)), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Failed);
        assert!(s.jobs[&job].parts.is_empty());
        assert_eq!(s.apply(&Command::Requeue { job, reason: proto::REQUEUED_ON_REQUEST.into(), now_ms: 6_000 }), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.restart_count, j.exit_code, j.end_ms), (JobState::Pending, 1, None, None));
        assert!(s.archivable(u64::MAX, 0, 10).is_empty(), "a requeued job is live again, not history");
        // A placement of the old run is stale; the next run starts.
        assert!(
            matches!(plan(&mut s, job, 1, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]), CommandResult::Planned { accepted, .. } if accepted.is_empty())
        );
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
        assert_eq!(s.jobs[&job].state, JobState::Running);
    }

    #[test]
    fn a_job_cancelled_while_its_parts_stop_is_requeued_behind_them() {
        let (mut s, a, b, job) = gang();
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 40 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Cancelled);
        assert_eq!(s.apply(&Command::Requeue { job, reason: proto::REQUEUED_ON_REQUEST.into(), now_ms: 41 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Pending);
        // Not placed while run 1's parts still hold the GPUs.
        assert!(
            matches!(plan(&mut s, job, 2, vec![alloc(a, &[2, 3]), alloc(b, &[2, 3])]), CommandResult::Planned { accepted, .. } if accepted.is_empty())
        );
        assert_eq!(finish(&mut s, job, 1, a, RunOutcome::Killed), CommandResult::Ok);
        assert_eq!(finish(&mut s, job, 1, b, RunOutcome::Killed), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Pending, "the old run's end does not end the requeued job");
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
    }

    #[test]
    fn restart_of_a_node_loses_its_parts_and_same_instance_keeps_them() {
        let (mut s, a, _b, job) = gang();
        register_again(&mut s, "a", 100);
        assert_eq!(s.jobs[&job].state, JobState::Running);
        register_again(&mut s, "a", 101);
        assert_eq!(s.jobs[&job].state, JobState::NodeFail);
        assert_eq!(s.jobs[&job].reasons, vec!["node restarted".to_string()]);
        assert_eq!(s.gpus_free(a), 8);
        let (mut s, a, _b, job) = gang();
        assert_eq!(s.apply(&Command::NodeUp { node: a, instance: 100, now_ms: 60 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Running);
        s.apply(&Command::NodeUp { node: a, instance: 102, now_ms: 61 });
        assert_eq!(s.jobs[&job].state, JobState::NodeFail);
    }

    #[test]
    fn only_the_current_instance_may_confirm_a_launch() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 100);
        let job = submit(&mut s, spec(1, 1));
        plan(&mut s, job, 1, vec![alloc(a, &[0])]);
        // An agent starts work only after a leader acknowledged its heartbeat, and the leader
        // commits a new instance before it acknowledges: a confirmation from any other instance
        // comes from a process that is gone.
        assert!(matches!(confirm(&mut s, job, 1, a, 101), CommandResult::Rejected(_)));
        register_again(&mut s, "a", 101);
        assert_eq!(s.jobs[&job].state, JobState::Running, "an unconfirmed part waits for the new instance");
        assert_eq!(confirm(&mut s, job, 1, a, 101), CommandResult::Ok);
        let other = submit(&mut s, spec(1, 1));
        plan(&mut s, other, 1, vec![alloc(a, &[1])]);
        register_again(&mut s, "a", 102);
        assert_eq!(s.jobs[&job].state, JobState::NodeFail, "confirmed by 101, gone with it");
        assert_eq!(s.jobs[&other].state, JobState::Running, "unconfirmed: 102 decides");
        assert_eq!(finish(&mut s, other, 1, a, RunOutcome::Lost("stopped before it started".into())), CommandResult::Ok);
        assert_eq!(s.jobs[&other].state, JobState::NodeFail);
        assert_eq!(s.jobs[&other].reasons, vec!["node 1: stopped before it started".to_string()]);
    }

    fn register_again(s: &mut ClusterState, name: &str, instance: InstanceId) {
        s.apply(&Command::RegisterNode {
            name: name.into(),
            addr: format!("{name}:1"),
            inventory: inventory(8),
            instance,
            cert_fingerprint: String::new(),
            now_ms: 70,
        });
    }

    #[test]
    fn a_replaced_instance_never_takes_its_node_back() {
        let (mut s, a, _b, job) = gang();
        confirm(&mut s, job, 1, a, 100);
        register_again(&mut s, "a", 101);
        assert_eq!(s.nodes[&a].instance, 101);
        // A late heartbeat of the dead instance 100 must not flip the node back to it.
        let late = s.apply(&Command::NodeUp { node: a, instance: 100, now_ms: 80 });
        assert!(matches!(late, CommandResult::Rejected(_)), "{late:?}");
        assert_eq!(s.nodes[&a].instance, 101);
        let again = Command::RegisterNode {
            name: "a".into(),
            addr: "a:1".into(),
            inventory: inventory(8),
            instance: 100,
            cert_fingerprint: String::new(),
            now_ms: 81,
        };
        assert!(matches!(s.apply(&again), CommandResult::Rejected(_)));
        assert_eq!(s.nodes[&a].instance, 101);
        s.check_invariants();
    }

    #[test]
    fn a_failed_preflight_holds_the_job_and_frees_every_part() {
        let (mut s, a, b, job) = gang();
        let why = "n1-n2 12 Mbit/s (minimum 1000 Mbit/s, median 12)".to_string();
        assert_eq!(finish(&mut s, job, 1, b, RunOutcome::PreflightFailed(why.clone())), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.spec.hold, j.restart_count), (JobState::Pending, true, 0));
        assert_eq!(j.reasons, vec![format!("preflight failed on node {b}: {why}")]);
        // The other node learned the same verdict; its part returns its GPUs.
        assert_eq!(finish(&mut s, job, 1, a, RunOutcome::PreflightFailed(why)), CommandResult::Ok);
        assert_eq!((s.gpus_free(a), s.gpus_free(b)), (8, 8));
        assert_eq!(s.jobs[&job].state, JobState::Pending);
        s.check_invariants();
    }

    #[test]
    fn cancel_keeps_resources_until_every_part_is_gone() {
        let (mut s, a, b, job) = gang();
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 80 }), CommandResult::Ok);
        assert_eq!(s.jobs[&job].state, JobState::Cancelled);
        assert_eq!(s.jobs[&job].parts_to_stop().count(), 2);
        assert_eq!(s.gpus_free(a), 6);
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        assert_eq!((s.gpus_free(a), s.gpus_free(b)), (8, 8));
        assert_eq!(s.jobs[&job].state, JobState::Cancelled);
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 81 }), CommandResult::Rejected("already finished".into()));
        assert_eq!(s.apply(&Command::Cancel { job: 42, now_ms: 81 }), CommandResult::Rejected("unknown job 42".into()));
        let pending = submit(&mut s, spec(1, 1));
        s.apply(&Command::Cancel { job: pending, now_ms: 82 });
        assert_eq!(s.jobs[&pending].state, JobState::Cancelled);
    }

    #[test]
    fn a_suspended_job_keeps_its_gpus_and_its_suspensions_are_not_run_time() {
        let (mut s, a, _b, job) = gang();
        let start = s.jobs[&job].start_ms.unwrap_or(0);
        let suspend = |s: &mut ClusterState, suspend, now_ms| s.apply(&Command::Suspend { job, suspend, now_ms });
        assert_eq!(suspend(&mut s, false, start + 10), CommandResult::Rejected("Job is not suspended".into()));
        assert_eq!(suspend(&mut s, true, start + 1_000), CommandResult::Ok);
        assert!(s.jobs[&job].suspended());
        assert_eq!(s.jobs[&job].state_name(), "SUSPENDED");
        // A second suspend changes nothing (Slurm answers it without an error).
        assert_eq!(suspend(&mut s, true, start + 2_000), CommandResult::Ok);
        assert_eq!(s.jobs[&job].suspension, proto::Suspension { since_ms: Some(start + 1_000), paused_ms: 0, changes: 1 });
        assert_eq!(s.gpus_free(a), 6, "its GPUs stay held");
        assert_eq!(s.jobs[&job].run_time_ms_at(start + 4_000), 1_000);
        assert_eq!(suspend(&mut s, false, start + 4_000), CommandResult::Ok);
        assert_eq!(s.jobs[&job].suspension, proto::Suspension { since_ms: None, paused_ms: 3_000, changes: 2 });
        assert_eq!(s.jobs[&job].run_time_ms_at(start + 5_000), 2_000);
        assert_eq!(s.jobs[&job].state_name(), "RUNNING");
        // Slurm's refusals for jobs that do not run.
        let pending = submit(&mut s, spec(1, 1));
        let refused = s.apply(&Command::Suspend { job: pending, suspend: true, now_ms: 1 });
        assert_eq!(refused, CommandResult::Rejected("Job is pending execution".into()));
        s.apply(&Command::Cancel { job, now_ms: start + 6_000 });
        let refused = suspend(&mut s, true, start + 7_000);
        assert_eq!(refused, CommandResult::Rejected("Job/step already completing or completed".into()));
    }

    #[test]
    fn steps_are_recorded_for_their_run_and_end_with_their_last_node() {
        let (mut s, a, b, job) = gang();
        let names: Vec<String> = vec!["a".into(), "b".into()];
        let start = |s: &mut ClusterState, run, step, nodes: &[String]| {
            s.apply(&Command::StepStarted { job, run, step, name: "python".into(), nodes: nodes.to_vec(), ntasks: 4, now_ms: 6_000 })
        };
        let end = |s: &mut ClusterState, step, node: &str, exit_code, signal| {
            s.apply(&Command::StepEnded { job, run: 1, step, node: node.into(), exit_code, signal, now_ms: 7_000 })
        };
        assert_eq!(start(&mut s, 1, 0, &names), CommandResult::Ok);
        assert!(matches!(start(&mut s, 2, 1, &names), CommandResult::Rejected(_)), "not the current run");
        assert_eq!(end(&mut s, 0, "a", 0, None), CommandResult::Ok);
        assert!(matches!(end(&mut s, 0, "a", 0, None), CommandResult::Rejected(_)), "a second report after a handover");
        assert!(matches!(end(&mut s, 0, "c", 0, None), CommandResult::Rejected(_)), "no tasks there");
        assert_eq!(s.jobs[&job].steps[0].end_ms, None, "b still runs its tasks");
        assert_eq!(s.jobs[&job].steps[0].state_name(&s.jobs[&job]), "RUNNING");
        assert_eq!(end(&mut s, 0, "b", 3, None), CommandResult::Ok);
        let step = &s.jobs[&job].steps[0];
        assert_eq!((step.end_ms, step.exit_code, step.state_name(&s.jobs[&job])), (Some(7_000), 3, "FAILED"));
        // A step alive when the job is cancelled ends with it, in its state.
        assert_eq!(start(&mut s, 1, 1, &names[..1]), CommandResult::Ok);
        s.apply(&Command::Cancel { job, now_ms: 8_000 });
        assert_eq!(s.jobs[&job].steps[1].state_name(&s.jobs[&job]), "CANCELLED");
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        assert_eq!(end(&mut s, 1, "a", 0, Some(15)), CommandResult::Ok, "its tasks' end comes after the run's");
        assert_eq!(s.jobs[&job].steps.len(), 2);
    }

    #[test]
    fn a_job_keeps_a_bounded_number_of_step_records_dropping_the_oldest_ended() {
        let (mut s, _a, _b, job) = gang();
        let nodes = vec!["a".to_string()];
        let max = proto::limits::STEP_RECORDS_PER_JOB_MAX as u32;
        for step in 0..max {
            s.apply(&Command::StepStarted { job, run: 1, step, name: "x".into(), nodes: nodes.clone(), ntasks: 1, now_ms: 1 });
        }
        let full = s.apply(&Command::StepStarted { job, run: 1, step: max, name: "x".into(), nodes: nodes.clone(), ntasks: 1, now_ms: 2 });
        assert!(matches!(full, CommandResult::Rejected(_)), "all alive: nothing to drop");
        s.apply(&Command::StepEnded { job, run: 1, step: 7, node: "a".into(), exit_code: 0, signal: None, now_ms: 3 });
        let next = s.apply(&Command::StepStarted { job, run: 1, step: max, name: "x".into(), nodes, ntasks: 1, now_ms: 4 });
        assert_eq!(next, CommandResult::Ok);
        let steps = &s.jobs[&job].steps;
        assert_eq!((steps.len(), steps.iter().any(|st| st.step == 7), steps.last().map(|st| st.step)), (max as usize, false, Some(max)));
    }

    #[test]
    fn a_suspended_job_requeued_is_held_and_its_next_run_starts_unsuspended() {
        let (mut s, a, b, job) = gang();
        s.apply(&Command::Suspend { job, suspend: true, now_ms: 6_000 });
        assert_eq!(s.apply(&Command::Requeue { job, reason: "operator".into(), now_ms: 6_500 }), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.state, j.spec.hold, j.suspended(), j.suspension.since_ms), (JobState::Pending, true, false, None));
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        s.apply(&Command::UpdateJob { job, hold: Some(false), time_limit_ms: None, partition: None, now_ms: 7_000 });
        assert_eq!(
            plan(&mut s, job, 2, vec![alloc(a, &[0, 1]), alloc(b, &[0, 1])]),
            CommandResult::Planned { accepted: vec![job], rejected: vec![] }
        );
        assert_eq!(s.jobs[&job].suspension, proto::Suspension::default());
    }

    #[test]
    fn unhealthy_gpu_loses_its_job_and_all_bad_drains_the_node() {
        let (mut s, a, b, job) = gang();
        assert_eq!(
            s.apply(&Command::GpuHealth { node: a, gpu: 5, mig_uuid: None, healthy: false, reason: "xid 79".into(), now_ms: 40 }),
            CommandResult::Ok
        );
        assert_eq!(s.jobs[&job].state, JobState::Running, "gpu 5 held no part");
        assert!(s.scheduler_view().nodes[&a].gpus.iter().any(|g| g.index == 5 && !g.free()), "unhealthy gpu is not placeable");
        s.apply(&Command::GpuHealth { node: b, gpu: 1, mig_uuid: None, healthy: false, reason: "uncorrectable ecc".into(), now_ms: 41 });
        assert_eq!(s.jobs[&job].state, JobState::NodeFail);
        assert_eq!(s.jobs[&job].reasons, vec!["gpu 1 on b unhealthy: uncorrectable ecc".to_string()]);
        assert_eq!(s.nodes[&b].state, NodeState::Up, "one bad gpu does not drain the node");
        for g in 0..8 {
            s.apply(&Command::GpuHealth { node: b, gpu: g, mig_uuid: None, healthy: false, reason: "fell off the bus".into(), now_ms: 42 });
        }
        assert_eq!((s.nodes[&b].state, s.nodes[&b].state_reason.as_deref()), (NodeState::Drained, Some("all GPUs unhealthy")));
        s.apply(&Command::GpuHealth { node: b, gpu: 0, mig_uuid: None, healthy: true, reason: "operator".into(), now_ms: 43 });
        assert_eq!(s.nodes[&b].state, NodeState::Up);
        assert!(matches!(
            s.apply(&Command::GpuHealth { node: b, gpu: 99, mig_uuid: None, healthy: true, reason: String::new(), now_ms: 44 }),
            CommandResult::Rejected(_)
        ));
    }

    #[test]
    fn hold_release_and_update_only_pending_jobs() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        let job = submit(&mut s, spec(1, 1));
        let update = |hold, time_limit_ms, partition| Command::UpdateJob { job, hold, time_limit_ms, partition, now_ms: 5 };
        assert_eq!(s.apply(&update(Some(true), Some(Some(60_000)), Some(Some("long".into())))), CommandResult::Ok);
        let j = &s.jobs[&job];
        assert_eq!((j.spec.hold, j.spec.time_limit_ms, j.spec.partition.as_deref()), (true, Some(60_000), Some("long")));
        assert!(matches!(s.apply(&update(None, Some(Some(0)), None)), CommandResult::Rejected(_)));
        s.apply(&update(Some(false), None, Some(None)));
        plan(&mut s, job, 1, vec![alloc(a, &[0])]);
        assert_eq!(
            s.apply(&update(Some(true), None, None)),
            CommandResult::Rejected("job 1 is RUNNING: only a pending job can be held, released or updated".into())
        );
    }

    #[test]
    fn drain_and_resume() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        s.apply(&Command::Drain { node: a, reason: "maintenance".into(), now_ms: 5 });
        assert_eq!(s.nodes[&a].state, NodeState::Drained);
        assert!(!s.scheduler_view().nodes[&a].schedulable);
        s.apply(&Command::NodeDown { node: a, reason: "x".into(), now_ms: 6 });
        s.apply(&Command::NodeUp { node: a, instance: 1, now_ms: 7 });
        assert_eq!(s.nodes[&a].state, NodeState::Drained, "a drained node stays drained when it comes back");
        s.apply(&Command::Resume { node: a, now_ms: 8 });
        assert_eq!(s.nodes[&a].state, NodeState::Up);
        assert!(s.scheduler_view().nodes[&a].schedulable);
    }

    #[test]
    fn submit_validates() {
        let mut s = ClusterState::default();
        let mut bad = spec(1, 1);
        bad.workdir = "relative".into();
        assert!(matches!(s.apply(&Command::Submit { spec: bad, now_ms: 1 }), CommandResult::Rejected(_)));
        assert_eq!(submit(&mut s, spec(1, 1)), 1);
        assert_eq!(submit(&mut s, spec(1, 1)), 2);
    }

    #[test]
    fn schedule_then_apply_never_grants_a_gpu_twice() {
        let mut s = ClusterState::default();
        let a = register(&mut s, "a", 1);
        for _ in 0..12 {
            submit(&mut s, spec(1, 1));
        }
        let p1 = scheduler::schedule(&s.scheduler_view(), 0);
        // The same stale plan applied twice: the second time every placement is rejected.
        s.apply(&Command::Plan { placements: p1.placements.clone(), array_tasks: vec![], now_ms: 1 });
        let CommandResult::Planned { accepted, .. } = s.apply(&Command::Plan { placements: p1.placements, array_tasks: vec![], now_ms: 2 })
        else {
            panic!()
        };
        assert!(accepted.is_empty());
        assert_eq!(s.gpus_free(a), 0);
        assert_eq!(s.jobs.values().filter(|j| j.state == JobState::Running).count(), 8);
    }

    #[test]
    fn digest_is_stable_and_follows_state() {
        let (s1, _, _, _) = gang();
        let (mut s2, _, _, job) = gang();
        assert_eq!(s1.digest(), s2.digest());
        s2.apply(&Command::Cancel { job, now_ms: 90 });
        assert_ne!(s1.digest(), s2.digest());
    }
}
