//! Nodes: registration and instances, up, down and graceful stops, drain and resume, GPU
//! health, inventory changes and MIG layout pins, and the parts a lost node or GPU takes with it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proto::slot::decode_slot;
use proto::{CommandResult, InstanceId, Inventory, JobId, JobState, NodeId, NodeRecord, NodeRun, NodeState};

use super::jobs::requeue_job;
use super::repairs::{self, Loss};
use super::runs::account;
use super::wall::Ledger;
use super::{rejected, ClusterState, NODE_STOPPED_REASON, RETIRED_INSTANCES_MAX};

impl ClusterState {
    pub(super) fn register_node(
        &mut self,
        name: &str,
        addr: &str,
        inventory: &Inventory,
        instance: InstanceId,
        now_ms: u64,
    ) -> CommandResult {
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
            self.node_joined_reservations(name);
            return CommandResult::NodeRegistered { id };
        };
        if self.is_retired(id, instance) {
            return rejected(format!("instance {instance} of node {name} was replaced"));
        }
        if let Some(newer) = self.newer_instance_up(id, instance) {
            return rejected(older_instance(instance, name, newer));
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

    pub(super) fn node_up(&mut self, id: NodeId, instance: InstanceId, now_ms: u64) -> CommandResult {
        if self.is_retired(id, instance) {
            return rejected(format!("instance {instance} of node {id} was replaced"));
        }
        if let Some(newer) = self.newer_instance_up(id, instance) {
            return rejected(older_instance(instance, &id.to_string(), newer));
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

    /// The instance of node `id` the log holds, when it started after `instance` (instance ids
    /// are ordered by start time, `control::agent::next_instance`) and the node is not down: a
    /// registration or heartbeat of `instance` then comes from a daemon that died before the
    /// recorded one started (delayed on the way), or from one whose clock and record both went
    /// back, which waits until the recorded instance is declared down.
    pub fn newer_instance_up(&self, id: NodeId, instance: InstanceId) -> Option<InstanceId> {
        self.nodes.get(&id).filter(|n| n.state != NodeState::Down && n.instance > instance).map(|n| n.instance)
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
        self.lose_parts(|p| p.alloc.node == node && p.launched_by.is_some_and(|i| i != instance), "node restarted", Loss::NodeGone, now_ms);
    }

    pub(super) fn node_down(&mut self, id: NodeId, reason: &str, now_ms: u64) -> CommandResult {
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
    pub(super) fn node_stopped(&mut self, id: NodeId, instance: InstanceId, now_ms: u64) -> CommandResult {
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
    pub(super) fn gpu_health(
        &mut self,
        id: NodeId,
        gpu: u32,
        mig_uuid: Option<&str>,
        healthy: bool,
        reason: &str,
        now_ms: u64,
    ) -> CommandResult {
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
            // Every part on the GPU: whole, shards of it, or its MIG instances (slots name GPUs).
            let on_gpu = |p: &NodeRun| p.alloc.node == id && p.alloc.gpus.iter().any(|&s| decode_slot(s).gpu() == gpu);
            self.lose_parts(on_gpu, &why, Loss::GpuFault, now_ms);
        }
        CommandResult::Ok
    }

    pub(super) fn update_inventory(&mut self, id: NodeId, inventory: &Inventory) -> CommandResult {
        // GPU indices: a part's slots name MIG instances and shards by their GPU.
        let held: BTreeSet<u32> = self.parts_on(id).flat_map(|p| p.alloc.gpus.iter().map(|&s| decode_slot(s).gpu())).collect();
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
    pub(super) fn pin_mig_layout(&mut self, id: NodeId, gpu: u32, profiles: Option<&[String]>) -> CommandResult {
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
    /// repaired with a spare (`repairs`), else requeued (if it asked for that) or ends
    /// NODE_FAIL; its other parts are then stopped.
    fn lose_node_parts(&mut self, node: NodeId, reason: &str, now_ms: u64) {
        self.lose_parts(|p| p.alloc.node == node, reason, Loss::NodeGone, now_ms);
    }

    /// Every part matching `lost` is gone (its process died with its node or GPU).
    fn lose_parts(&mut self, lost: impl Fn(&NodeRun) -> bool, reason: &str, loss: Loss, now_ms: u64) {
        let holding: Vec<JobId> = self.holding_parts.iter().copied().collect();
        for id in holding {
            let Some(job) = self.jobs.get_mut(&id) else { continue };
            let Some(pos) = job.parts.iter().position(&lost) else { continue };
            let part = job.parts.remove(pos);
            if job.parts.is_empty() {
                self.holding_parts.remove(&id);
            }
            let mut ledger = Ledger {
                usage: &mut self.usage,
                qos_usage: &mut self.qos_usage,
                accounts: &self.accounts,
                half_life_ms: self.policy.decay_half_life_ms(),
                nodes: &self.nodes,
            };
            account(&mut ledger, job, &part, now_ms);
            if part.run != job.run || job.state != JobState::Running {
                continue;
            }
            let met_in_store = self.stores.get(&id).is_some_and(|s| s.run == job.run && !s.keys.is_empty());
            if repairs::drop_spare(job, &part) || repairs::repair(job, &part, loss, &self.nodes, met_in_store, reason, now_ms) {
                continue;
            }
            if job.spec.requeue {
                requeue_job(&mut self.requeues, &mut ledger, job, reason, now_ms);
            } else {
                job.state = JobState::NodeFail;
                job.exit_code = None;
                job.end_ms = Some(now_ms);
                job.reasons = vec![reason.to_string()];
            }
        }
    }

    pub(super) fn drain(&mut self, id: NodeId, reason: &str, now_ms: u64) -> CommandResult {
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

    pub(super) fn resume(&mut self, id: NodeId, now_ms: u64) -> CommandResult {
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

/// Why a registration or heartbeat of an older instance is refused.
fn older_instance(instance: InstanceId, node: &str, newer: InstanceId) -> String {
    format!("instance {instance} of node {node} started before instance {newer}, which is up: refused until that one is declared down")
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, GpuInfo, JobState, NodeState, RunOutcome};

    use crate::cluster::test_support::{
        alloc, confirm, finish, gang, inventory, plan, register, register_again, spec, submit, with_node_n1,
    };
    use crate::cluster::{ClusterState, NODE_STOPPED_REASON};
    use crate::view;

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
    fn an_older_instance_never_takes_a_node_from_a_newer_one_that_is_up() {
        let (mut s, a, _b, job) = gang();
        confirm(&mut s, job, 1, a, 100);
        register_again(&mut s, "a", 300);
        // Instance 200 died before 300 started; its registration and beat come late.
        register_again(&mut s, "a", 200);
        assert_eq!(s.nodes[&a].instance, 300);
        let late = s.apply(&Command::NodeUp { node: a, instance: 200, now_ms: 80 });
        assert!(matches!(late, CommandResult::Rejected(_)), "{late:?}");
        assert_eq!(s.nodes[&a].instance, 300);
        // Once 300 is declared down, an older instance may take the node (its record and
        // clock went back): nothing of 300 can still run by then.
        assert_eq!(s.apply(&Command::NodeDown { node: a, reason: "silent".into(), now_ms: 90 }), CommandResult::Ok);
        register_again(&mut s, "a", 250);
        assert_eq!((s.nodes[&a].state, s.nodes[&a].instance), (NodeState::Up, 250));
        s.check_invariants();
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
    fn a_fault_of_a_shared_gpu_loses_its_sharers_and_inventory_updates_see_gpus_not_slots() {
        let mut inv = inventory(2);
        inv.gpus.iter_mut().for_each(|g| g.shards = 4);
        let mut s = with_node_n1(inv.clone());
        let n1 = s.node_by_name("n1").map(|n| n.id).expect("n1");
        let mut shards = spec(0, 1);
        shards.gres = Some(proto::GresRequest::shards(None, 2));
        let (x, y, whole) = (submit(&mut s, shards.clone()), submit(&mut s, shards), submit(&mut s, spec(1, 1)));
        for (job, slots) in [(x, vec![proto::slot::shard_slot(0, 2)]), (y, vec![proto::slot::shard_slot(0, 2)]), (whole, vec![1])] {
            assert_eq!(plan(&mut s, job, 1, vec![alloc(n1, &slots)]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        }
        // GPU 0 is shared: it may not be held whole now.
        let more = submit(&mut s, spec(1, 1));
        let CommandResult::Planned { accepted, rejected } = plan(&mut s, more, 1, vec![alloc(n1, &[0])]) else { panic!("not planned") };
        assert!(accepted.is_empty() && rejected.len() == 1 && rejected[0].1.contains("gpu 0 is busy"), "{rejected:?}");
        // The node reports its inventory again (a MIG layout elsewhere, say): its GPUs are held
        // through slots naming them, and none of them is gone.
        let update = Command::UpdateInventory { node: n1, inventory: inv, reason: "relaid".into(), now_ms: 35 };
        assert_eq!(s.apply(&update), CommandResult::Ok);
        let fault = Command::GpuHealth { node: n1, gpu: 0, mig_uuid: None, healthy: false, reason: "xid 79".into(), now_ms: 40 };
        assert_eq!(s.apply(&fault), CommandResult::Ok);
        for job in [x, y] {
            assert_eq!(s.jobs[&job].state, JobState::NodeFail, "job {job} shared the faulty GPU");
        }
        assert_eq!(s.jobs[&whole].state, JobState::Running, "the job on GPU 1 runs on");
        s.check_invariants();
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
}
