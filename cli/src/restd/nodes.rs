//! The cluster endpoints of `corral restd`: `GET /ping` (the voters, the leader first, as
//! slurmrestd pings its controllers) and `GET /nodes`, `GET /node/NAME` (as `sinfo --json`).

use std::sync::Arc;

use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::Response;
use proto::{ClientRequest, Reply};
use serde_json::{json, Value};
use slurm_compat::openapi;

use super::{failed, reply, slurm_error, Caller, Served};
use crate::slurm::PATIENCE;

pub(super) async fn ping(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    match api.cluster_for(user).call_patiently(ClientRequest::ClusterInfo, PATIENCE).await {
        Ok(Reply::Cluster(info)) => {
            // slurmrestd pings the controllers: here the voters, the leader first.
            let mut voters: Vec<_> = info.members.iter().filter(|m| m.role != proto::NodeRole::Agent).collect();
            voters.sort_by_key(|m| Some(&m.name) != info.leader.as_ref());
            let pings: Vec<Value> = voters
                .iter()
                .map(|m| {
                    let mode = if Some(&m.name) == info.leader.as_ref() { "primary" } else { "backup" };
                    json!({"hostname": m.name, "ping": "UP", "status": 0, "mode": mode})
                })
                .collect();
            reply(version, StatusCode::OK, Vec::new(), vec![("pings", Value::Array(pings))])
        }
        Ok(other) => failed(version, "slurm_ping", "Unspecified error", format!("unexpected reply {other:?}"), -1, Vec::new()),
        Err(e) => failed(version, "slurm_ping", "Unable to contact slurm controller", format!("{e:#}"), 1007, Vec::new()),
    }
}

pub(super) async fn nodes(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>) -> Response {
    nodes_named(&served, &caller, None).await
}

pub(super) async fn node(
    State(served): State<Arc<Served>>,
    Extension(caller): Extension<Caller>,
    UrlPath(name): UrlPath<String>,
) -> Response {
    nodes_named(&served, &caller, Some(name)).await
}

/// Every node (`name`: that one alone), as `sinfo --json`.
async fn nodes_named(served: &Served, caller: &Caller, name: Option<String>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let mut nodes = match api.cluster_for(user).call_patiently(ClientRequest::ListNodes, PATIENCE).await {
        Ok(Reply::Nodes(nodes)) => nodes,
        Ok(other) => {
            return failed(
                version,
                "slurm_load_node",
                "Unspecified error",
                format!("unexpected reply {other:?}"),
                -1,
                vec![("nodes", json!([]))],
            )
        }
        Err(e) => {
            let (error, number) = slurm_error(&e);
            return failed(version, "slurm_load_node", &error, format!("{e:#}"), number, vec![("nodes", json!([]))]);
        }
    };
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(name) = &name {
        nodes.retain(|n| &n.name == name);
        if nodes.is_empty() {
            let error = json!({"error": "Invalid node name specified", "errno": 2018});
            return reply(version, StatusCode::INTERNAL_SERVER_ERROR, vec![error], vec![("nodes", json!([]))]);
        }
    }
    reply(version, StatusCode::OK, Vec::new(), vec![("nodes", Value::Array(nodes.iter().map(openapi::node).collect()))])
}
