//! Builders the cluster tests share: inventories, specs, nodes registered, jobs submitted, placed,
//! confirmed and finished, and a running two-node gang.

use proto::{
    Allocation, Command, CommandResult, GpuInfo, GresRequest, InstanceId, Inventory, JobId, JobSpec, NodeId, Placement, RunNo, RunOutcome,
};

use super::ClusterState;

pub(super) fn inventory(gpus: u32) -> Inventory {
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

pub(super) fn spec(gpus: u32, nodes: u32) -> JobSpec {
    let mut s = JobSpec::command(vec!["true".into()], "/tmp", "alice");
    s.gres = Some(GresRequest { gpu_type: None, count: gpus, ..Default::default() });
    s.nodes = nodes;
    s
}

pub(super) fn register(s: &mut ClusterState, name: &str, instance: InstanceId) -> NodeId {
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
pub(super) fn with_node_n1(inventory: Inventory) -> ClusterState {
    let mut s = ClusterState::default();
    let cmd =
        Command::RegisterNode { name: "n1".into(), addr: "a".into(), inventory, instance: 1, cert_fingerprint: String::new(), now_ms: 0 };
    assert!(matches!(s.apply(&cmd), CommandResult::NodeRegistered { .. }));
    s
}

pub(super) fn submit(s: &mut ClusterState, spec: JobSpec) -> JobId {
    match s.apply(&Command::Submit { spec, now_ms: 10 }) {
        CommandResult::Submitted { job } => job,
        other => panic!("submit: {other:?}"),
    }
}

pub(super) fn alloc(node: NodeId, gpus: &[u32]) -> Allocation {
    Allocation { node, gpus: gpus.to_vec(), cpus: 1, mem_mib: 1024 }
}

pub(super) fn plan(s: &mut ClusterState, job: JobId, run: RunNo, allocs: Vec<Allocation>) -> CommandResult {
    s.apply(&Command::Plan { placements: vec![Placement { job, run, allocs }], array_tasks: vec![], now_ms: 20 })
}

pub(super) fn confirm(s: &mut ClusterState, job: JobId, run: RunNo, node: NodeId, instance: InstanceId) -> CommandResult {
    s.apply(&Command::LaunchConfirmed { job, run, node, instance, now_ms: 30 })
}

pub(super) fn finish(s: &mut ClusterState, job: JobId, run: RunNo, node: NodeId, outcome: RunOutcome) -> CommandResult {
    s.apply(&Command::RunFinished { job, run, node, outcome, usage: Default::default(), now_ms: 5_030 })
}

/// Two nodes (instances 100 and 200) and a 2-node job running on both.
pub(super) fn gang() -> (ClusterState, NodeId, NodeId, JobId) {
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

pub(super) fn register_again(s: &mut ClusterState, name: &str, instance: InstanceId) {
    s.apply(&Command::RegisterNode {
        name: name.into(),
        addr: format!("{name}:1"),
        inventory: inventory(8),
        instance,
        cert_fingerprint: String::new(),
        now_ms: 70,
    });
}
