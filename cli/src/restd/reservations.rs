//! `GET /reservations` and `GET /reservation/NAME`, in slurmrestd 22.05's shape (its
//! `openapi/v0.0.38/reservations.c`: one object per reservation, flags as a list of names).

use std::sync::Arc;

use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::Response;
use proto::{AdminReservation, ClientRequest, NodeInfo, Reply};
use serde_json::{json, Value};

use super::{failed, reply, Caller, Served};
use crate::slurm::{hostlist, PATIENCE};

/// Slurm's `ESLURM_RESERVATION_INVALID`.
const RESERVATION_INVALID: i64 = 2053;
/// What Slurm keeps for power a reservation was not given (`NO_VAL`).
const WATTS_NO_VAL: u64 = 0xffff_fffe;

pub(super) async fn reservations(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>) -> Response {
    reservations_named(&served, &caller, None).await
}

pub(super) async fn reservation(
    State(served): State<Arc<Served>>,
    Extension(caller): Extension<Caller>,
    UrlPath(name): UrlPath<String>,
) -> Response {
    reservations_named(&served, &caller, Some(name)).await
}

async fn reservations_named(served: &Served, caller: &Caller, name: Option<String>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let cluster = api.cluster_for(user);
    let (list, nodes) = match (
        cluster.call_patiently(ClientRequest::GetReservations, PATIENCE).await,
        cluster.call_patiently(ClientRequest::ListNodes, PATIENCE).await,
    ) {
        (Ok(Reply::Reservations(list)), Ok(Reply::Nodes(nodes))) => (list, nodes),
        (Err(e), _) | (_, Err(e)) => {
            return failed(version, "slurm_load_reservations", "Unable to contact slurm controller", format!("{e:#}"), 1007, Vec::new())
        }
        (other, _) => {
            let why = format!("unexpected reply {other:?}");
            return failed(version, "slurm_load_reservations", "Unspecified error", why, -1, Vec::new());
        }
    };
    let shown: Vec<Value> =
        list.iter().filter(|r| name.as_deref().is_none_or(|n| r.name.eq_ignore_ascii_case(n))).map(|r| dump(r, &nodes)).collect();
    if name.is_some() && shown.is_empty() {
        let error = json!({"error": "Requested reservation is invalid", "errno": RESERVATION_INVALID});
        return reply(version, StatusCode::INTERNAL_SERVER_ERROR, vec![error], vec![("reservations", json!([]))]);
    }
    reply(version, StatusCode::OK, Vec::new(), vec![("reservations", Value::Array(shown))])
}

/// One reservation as slurmrestd's `_dump_res` writes it.
pub(super) fn dump(r: &AdminReservation, nodes: &[NodeInfo]) -> Value {
    let cores: u32 = nodes.iter().filter(|n| r.nodes.contains(&n.name)).map(|n| n.cpus_total).sum();
    let list = |l: &[String]| if l.is_empty() { Value::Null } else { json!(l.join(",")) };
    json!({
        "flags": r.flags(),
        "accounts": list(&r.accounts),
        "burst_buffer": null,
        "core_count": cores,
        "core_spec_cnt": 0,
        "end_time": r.end_ms / 1000,
        "features": null,
        "groups": null,
        "licenses": null,
        "max_start_delay": 0,
        "name": r.name,
        "node_count": r.nodes.len(),
        "node_list": if r.nodes.is_empty() { Value::Null } else { json!(hostlist::compress(&r.nodes)) },
        "partition": null,
        "start_time": r.start_ms / 1000,
        "watts": WATTS_NO_VAL,
        "tres": format!("cpu={cores}"),
        "users": list(&r.users),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_has_slurmrestds_keys_and_values() {
        let r = AdminReservation {
            name: "maint".into(),
            start_ms: 1_800_000_000_000,
            end_ms: 1_800_003_600_000,
            nodes: vec!["n1".into(), "n2".into()],
            users: vec!["root".into()],
            maint: true,
            nodes_named: true,
            ..Default::default()
        };
        let v = dump(&r, &[]);
        let mut keys: Vec<&str> = v.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        keys.sort_unstable();
        let mut expected = vec![
            "flags",
            "accounts",
            "burst_buffer",
            "core_count",
            "core_spec_cnt",
            "end_time",
            "features",
            "groups",
            "licenses",
            "max_start_delay",
            "name",
            "node_count",
            "node_list",
            "partition",
            "start_time",
            "watts",
            "tres",
            "users",
        ];
        expected.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!((v["flags"].clone(), v["node_list"].clone()), (json!(["MAINT", "SPEC_NODES"]), json!("n[1-2]")));
        assert_eq!((v["start_time"].as_u64(), v["users"].as_str(), v["accounts"].is_null()), (Some(1_800_000_000), Some("root"), true));
        // `Nodes=ALL`, as the peer's slurmrestd lists it.
        let all = dump(&AdminReservation { ignore_jobs: true, all_nodes: true, ..r }, &[]);
        assert_eq!(all["flags"], json!(["MAINT", "IGNORE_JOBS", "SPEC_NODES", "ALL_NODES"]));
    }
}
