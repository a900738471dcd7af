//! `GET /partitions` and `GET /partition/NAME` (v0.0.38), in slurmrestd 22.05's shape (its
//! `openapi/v0.0.38/partitions.c`, compared value for value with a real slurmrestd 22.05.8 in
//! `tests/fixtures/slurm_json/partitions_v0.0.38.json`): every key it writes, its spelling
//! (`min nodes per job`, with spaces, as its code writes it), unset strings as `""`, times in
//! minutes with `-1` for none, `null` for what Slurm leaves unset.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::Response;
use proto::{ClientRequest, NodeInfo, PartitionDef, Reply, SchedulerPolicy};
use serde_json::{json, Value};

use super::{failed, reply, slurm_error, Caller, Served};
use crate::slurm::{hostlist, PATIENCE};

/// Slurm's `ESLURM_INVALID_PARTITION_NAME`.
const INVALID_PARTITION_NAME: i64 = 2000;

pub(super) async fn partitions(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>) -> Response {
    partitions_named(&served, &caller, None).await
}

pub(super) async fn partition(
    State(served): State<Arc<Served>>,
    Extension(caller): Extension<Caller>,
    UrlPath(name): UrlPath<String>,
) -> Response {
    partitions_named(&served, &caller, Some(name)).await
}

async fn partitions_named(served: &Served, caller: &Caller, name: Option<String>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let cluster = api.cluster_for(user);
    let (policy, nodes) = match (
        cluster.call_patiently(ClientRequest::GetPolicy, PATIENCE).await,
        cluster.call_patiently(ClientRequest::ListNodes, PATIENCE).await,
    ) {
        (Ok(Reply::Policy(policy)), Ok(Reply::Nodes(nodes))) => (policy, nodes),
        (Err(e), _) | (_, Err(e)) => {
            let (error, number) = slurm_error(&e);
            return failed(version, "slurm_load_partitions", &error, format!("{e:#}"), number, vec![("partitions", json!([]))]);
        }
        (other, _) => {
            let why = format!("unexpected reply {other:?}");
            return failed(version, "slurm_load_partitions", "Unspecified error", why, -1, vec![("partitions", json!([]))]);
        }
    };
    let shown: Vec<Value> = dump_all(&policy, &nodes)
        .into_iter()
        .filter(|(n, _)| name.as_deref().is_none_or(|want| n.eq_ignore_ascii_case(want)))
        .map(|(_, v)| v)
        .collect();
    if shown.is_empty() {
        let error = json!({"error": "Invalid partition name specified", "errno": INVALID_PARTITION_NAME});
        return reply(version, StatusCode::INTERNAL_SERVER_ERROR, vec![error], vec![("partitions", json!([]))]);
    }
    reply(version, StatusCode::OK, Vec::new(), vec![("partitions", Value::Array(shown))])
}

/// Every partition (the policy's, and any a node names), by name, each as `_dump_part` writes it.
pub(super) fn dump_all(policy: &SchedulerPolicy, nodes: &[NodeInfo]) -> Vec<(String, Value)> {
    let mut members: BTreeMap<String, Vec<&NodeInfo>> = policy.partitions.iter().map(|p| (p.name.clone(), Vec::new())).collect();
    members.entry(policy.default_partition_name().to_string()).or_default();
    for n in nodes {
        for p in &n.partitions {
            members.entry(p.clone()).or_default().push(n);
        }
    }
    let preempts = policy.qos.iter().any(|q| !q.preempt.is_empty());
    members
        .into_iter()
        .map(|(name, in_it)| {
            let def = policy
                .partitions
                .iter()
                .find(|p| p.name == name)
                .cloned()
                .unwrap_or_else(|| PartitionDef { name: name.clone(), ..Default::default() });
            let is_default = name == policy.default_partition_name();
            let v = dump(&def, is_default, preempts, &in_it);
            (name, v)
        })
        .collect()
}

/// A list as Slurm keeps it (`a,b`), `""` for none.
fn list(l: &[String]) -> String {
    l.join(",")
}

/// Minutes of a time limit, `-1` for none (Slurm's `INFINITE`).
fn minutes(ms: Option<u64>) -> Value {
    ms.map_or(json!(-1), |ms| json!(ms / 60_000))
}

/// Memory as Slurm's TRES strings write it: in the largest unit it is a whole number of.
fn mem_text(mib: u64) -> String {
    match mib {
        0 => "0".into(),
        m if m % (1 << 20) == 0 => format!("{}T", m >> 20),
        m if m % (1 << 10) == 0 => format!("{}G", m >> 10),
        m => format!("{m}M"),
    }
}

/// One partition with its member nodes `in_it`, as slurmrestd's `_dump_part`. What Corral has
/// no counterpart for is what Slurm shows unset: no memory defaults or maxima, no per-node CPU
/// or per-job node bounds (`-1`), no grace or over time, no partition QoS; `preemption_mode`
/// is `requeue` where a QoS preempts (the default mode of Corral's QoS), else `disabled`.
fn dump(def: &PartitionDef, is_default: bool, preempts: bool, in_it: &[&NodeInfo]) -> Value {
    let mut names: Vec<String> = in_it.iter().map(|n| n.name.clone()).collect();
    names.sort();
    let cpus: u64 = in_it.iter().map(|n| u64::from(n.cpus_total)).sum();
    let mem_mib: u64 = in_it.iter().map(|n| n.memory_mib).sum();
    let gpus: u64 = in_it.iter().map(|n| u64::from(n.gpus_total)).sum();
    let tres = if in_it.is_empty() {
        String::new()
    } else {
        let gres = if gpus > 0 { format!(",gres/gpu={gpus}") } else { String::new() };
        format!("cpu={cpus},mem={},node={},billing={cpus}{gres}", mem_text(mem_mib), names.len())
    };
    let flags: Vec<&str> = if is_default { vec!["default"] } else { Vec::new() };
    let a = &def.access;
    json!({
        "flags": flags,
        "preemption_mode": [if preempts { "requeue" } else { "disabled" }],
        "allowed_allocation_nodes": "",
        "allowed_accounts": list(&a.allow_accounts),
        "allowed_groups": list(&a.allow_groups),
        "allowed_qos": list(&a.allow_qos),
        "alternative": "",
        "billing_weights": "",
        "default_memory_per_cpu": null,
        "default_memory_per_node": null,
        "default_time_limit": def.default_time_limit_ms.map(|ms| ms / 60_000),
        "denied_accounts": list(&a.deny_accounts),
        "denied_qos": list(&a.deny_qos),
        "preemption_grace_time": 0,
        "maximum_cpus_per_node": -1,
        "maximum_memory_per_cpu": null,
        "maximum_memory_per_node": null,
        "maximum_nodes_per_job": -1,
        "max_time_limit": minutes(def.max_time_limit_ms),
        "min nodes per job": 0,
        "name": def.name,
        "nodes": if names.is_empty() { String::new() } else { hostlist::compress(&names) },
        "over_time_limit": null,
        "priority_job_factor": 1,
        "priority_tier": def.priority_tier,
        "qos": "",
        "state": def.state.as_str(),
        "total_cpus": cpus,
        "total_nodes": names.len(),
        "tres": tres,
    })
}

#[cfg(test)]
mod tests {
    use proto::{PartitionAccess, PartitionState};

    use super::*;

    fn minutes_ms(m: u64) -> Option<u64> {
        Some(m * 60_000)
    }

    fn node(name: &str, cpus: u32, memory_mib: u64, partitions: &[&str]) -> NodeInfo {
        NodeInfo {
            id: 1,
            name: name.into(),
            addr: String::new(),
            state: proto::NodeState::Up,
            role: proto::NodeRole::Voter,
            gpus_total: 0,
            gpus_free: 0,
            gpu_types: Vec::new(),
            cpus_total: cpus,
            cpus_alloc: 0,
            memory_mib,
            memory_alloc_mib: 0,
            reason: None,
            unhealthy_gpus: Vec::new(),
            cert_fingerprint: String::new(),
            partitions: partitions.iter().map(|p| p.to_string()).collect(),
            mig: Vec::new(),
            reserved: false,
            maint: false,
        }
    }

    /// The peer's partitions as Corral holds them: `gpu` (slurm.conf's default, node `vm`),
    /// and what `scontrol create PartitionName=long Nodes=vm MaxTime=8:00:00
    /// DefaultTime=1:00:00 AllowAccounts=phys,chem DenyQos=low AllowGroups=root PriorityTier=3
    /// State=DOWN`, `... empty` and `... guarded Nodes=vm DenyAccounts=bio
    /// AllowQos=normal,high MaxTime=2-00:00:00` made there.
    fn peer() -> (SchedulerPolicy, Vec<NodeInfo>) {
        let part = |name: &str| PartitionDef { name: name.into(), priority_tier: 1, ..Default::default() };
        let long = PartitionDef {
            max_time_limit_ms: minutes_ms(480),
            default_time_limit_ms: minutes_ms(60),
            priority_tier: 3,
            state: PartitionState::Down,
            access: PartitionAccess {
                allow_accounts: vec!["phys".into(), "chem".into()],
                deny_qos: vec!["low".into()],
                allow_groups: vec!["root".into()],
                ..Default::default()
            },
            ..part("long")
        };
        let guarded = PartitionDef {
            max_time_limit_ms: minutes_ms(2880),
            access: PartitionAccess {
                deny_accounts: vec!["bio".into()],
                allow_qos: vec!["normal".into(), "high".into()],
                ..Default::default()
            },
            ..part("guarded")
        };
        let policy = SchedulerPolicy {
            partitions: vec![PartitionDef { default: true, ..part("gpu") }, long, part("empty"), guarded],
            ..Default::default()
        };
        (policy, vec![node("vm", 2, 24105, &["gpu", "long", "guarded"])])
    }

    #[test]
    fn partitions_match_slurmrestds_value_for_value() {
        let slurm: Value =
            serde_json::from_str(include_str!("../../../tests/fixtures/slurm_json/partitions_v0.0.38.json")).expect("fixture");
        let slurm: BTreeMap<String, Value> = slurm["partitions"]
            .as_array()
            .expect("partitions")
            .iter()
            .map(|p| (p["name"].as_str().unwrap_or_default().to_string(), p.clone()))
            .collect();
        let (policy, nodes) = peer();
        let ours: BTreeMap<String, Value> = dump_all(&policy, &nodes).into_iter().collect();
        assert_eq!(ours.keys().collect::<Vec<_>>(), slurm.keys().collect::<Vec<_>>());
        for (name, theirs) in &slurm {
            let mine = &ours[name];
            let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
            assert_eq!(keys(mine), keys(theirs), "{name}: the keys");
            for (key, want) in theirs.as_object().into_iter().flatten() {
                // Slurm's `scontrol create` makes a partition with MinNodes=1 (slurm.conf's
                // default partition has 0); Corral's have no minimum.
                let want = if key == "min nodes per job" { &json!(0) } else { want };
                assert_eq!(&mine[key], want, "{name}: {key}");
            }
        }
    }

    #[test]
    fn gpus_join_the_tres_and_a_preempting_qos_shows_requeue() {
        let (mut policy, mut nodes) = peer();
        nodes[0].gpus_total = 8;
        nodes[0].memory_mib = 2 << 20;
        nodes.push(node("vm2", 2, 0, &["gpu"]));
        policy.qos.push(proto::QosDef { name: "high".into(), preempt: vec!["normal".into()], ..Default::default() });
        let ours: BTreeMap<String, Value> = dump_all(&policy, &nodes).into_iter().collect();
        assert_eq!(ours["gpu"]["tres"], "cpu=4,mem=2T,node=2,billing=4,gres/gpu=8");
        assert_eq!(ours["gpu"]["nodes"], "vm,vm2");
        assert_eq!(ours["gpu"]["preemption_mode"], json!(["requeue"]));
        assert_eq!(mem_text(24105), "24105M");
        assert_eq!(mem_text(3072), "3G");
    }
}
