//! Fixtures the engine's unit tests share: a node registered, a job running on it.

use corral_state::ClusterState;
use proto::{Allocation, Command, CommandResult, Inventory, JobId, JobSpec, Placement};

/// The instance of the node [`node`] registers.
pub(crate) const INSTANCE: proto::InstanceId = 7;

/// Registers node 1, "n1", with 64 CPUs and no GPU.
pub(crate) fn node(s: &mut ClusterState) {
    let inventory = Inventory { cpus: 64, memory_mib: 1 << 20, ..Inventory::default() };
    let node = Command::RegisterNode {
        name: "n1".into(),
        addr: "n1:1".into(),
        inventory,
        instance: INSTANCE,
        cert_fingerprint: String::new(),
        now_ms: 0,
    };
    assert!(matches!(s.apply(&node), CommandResult::NodeRegistered { id: 1 }));
}

/// Submits `spec` at `start_ms` and starts its first run on node 1, launch confirmed.
pub(crate) fn running(s: &mut ClusterState, spec: JobSpec, start_ms: u64) -> JobId {
    let CommandResult::Submitted { job } = s.apply(&Command::Submit { spec, now_ms: start_ms }) else { panic!("submit") };
    let alloc = Allocation { node: 1, gpus: vec![], cpus: 1, mem_mib: 1024 };
    let plan = Command::Plan { placements: vec![Placement { job, run: 1, allocs: vec![alloc] }], array_tasks: vec![], now_ms: start_ms };
    assert!(matches!(s.apply(&plan), CommandResult::Planned { .. }));
    let confirmed = Command::LaunchConfirmed { job, run: 1, node: 1, instance: INSTANCE, now_ms: start_ms };
    assert_eq!(s.apply(&confirmed), CommandResult::Ok);
    job
}
