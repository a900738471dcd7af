//! The web UI's JSON API (`/ui/api/`): what each page shows, read from the node's local socket
//! as the caller. Shapes are the page's own (`assets/app.js` reads them), not Slurm's.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Extension, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::Json;
use proto::{ApiError, ClientRequest, Job, JobState, LogStream, NodeId, NodeInfo, Reply};
use scheduler::Slot;
use serde_json::{json, Value};

use super::{error, UiError, OUTPUT_TAIL_BYTES, QUEUE_ROWS_MAX, SAMPLE_CALLS_IN_FLIGHT_MAX, SERIES_NODES_MAX, UTILIZATION_CACHE_MS};
use crate::client::Cluster;
use crate::restd::{Api, Caller};
use crate::slurm::PATIENCE;

type Answer = Result<Json<Value>, UiError>;

/// The status and words a page shows for a failed call.
fn failed(e: anyhow::Error) -> UiError {
    let status = match e.downcast_ref::<ApiError>() {
        Some(ApiError::NotFound(_)) => StatusCode::NOT_FOUND,
        Some(ApiError::Denied(_)) => StatusCode::FORBIDDEN,
        Some(ApiError::Invalid(_)) => StatusCode::BAD_REQUEST,
        _ => StatusCode::BAD_GATEWAY,
    };
    error(status, crate::slurm::describe_error(&e))
}

async fn call(cluster: &Cluster, request: ClientRequest) -> Result<Reply, UiError> {
    cluster.call_patiently(request, PATIENCE).await.map_err(failed)
}

/// Who the caller is: `{user, admin}`.
async fn whoami(cluster: &Cluster) -> Result<(String, bool), UiError> {
    match call(cluster, ClientRequest::Whoami).await? {
        Reply::Caller { user, admin } => Ok((user, admin)),
        other => Err(error(StatusCode::BAD_GATEWAY, format!("unexpected reply {other:?}"))),
    }
}

pub(super) async fn me(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>) -> Answer {
    let user = caller.user_or_401()?;
    let (user, admin) = whoami(&api.cluster_for(user)).await?;
    Ok(Json(json!({ "user": user, "admin": admin, "host": api.host })))
}

#[derive(serde::Deserialize)]
pub(super) struct QueueQuery {
    /// Only the caller's jobs.
    #[serde(default)]
    mine: bool,
}

/// The live jobs: counts by state over all of them, and the first [`QUEUE_ROWS_MAX`] rows
/// (running, then pending by expected start and id), each pending one with its reasons and
/// its expected start where the last scheduling pass reserved one.
pub(super) async fn queue(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>, Query(q): Query<QueueQuery>) -> Answer {
    let user = caller.user_or_401()?;
    let cluster = api.cluster_for(user);
    let names = node_names(&cluster).await?;
    // A cluster without a leader still shows its queue, without expected starts.
    let expected: BTreeMap<u64, u64> = match cluster.call_patiently(ClientRequest::ExpectedStarts, PATIENCE).await {
        Ok(Reply::ExpectedStarts(list)) => list.into_iter().collect(),
        _ => BTreeMap::new(),
    };
    let mut first: Vec<(u64, u64)> = expected.iter().map(|(job, at)| (*at, *job)).collect();
    first.sort_unstable();
    let summary = ClientRequest::QueueSummary {
        user: q.mine.then(|| user.to_string()),
        first: first.into_iter().map(|(_, job)| job).collect(),
        rows_max: QUEUE_ROWS_MAX as u32,
    };
    let Reply::QueueSummary { counts, total, jobs } = call(&cluster, summary).await? else {
        return Err(error(StatusCode::BAD_GATEWAY, "unexpected reply to QueueSummary"));
    };
    let counts: BTreeMap<String, u64> = counts.into_iter().collect();
    let rows: Vec<Value> = jobs.iter().map(|j| queue_row(j, &names, expected.get(&j.id).copied())).collect();
    Ok(Json(json!({ "now_ms": now_ms(), "counts": counts, "total": total, "jobs": rows })))
}

fn queue_row(j: &Job, names: &BTreeMap<NodeId, String>, expected_start_ms: Option<u64>) -> Value {
    let nodes: Vec<&str> = j.run_nodes().iter().filter_map(|n| names.get(n).map(String::as_str)).collect();
    json!({
        "id": j.id,
        "name": j.spec.name,
        "user": j.spec.user,
        "account": j.spec.account,
        "partition": j.spec.partition,
        "state": j.state_name(),
        "reason": slurm_compat::show::reason_code(j),
        "reasons": j.reasons,
        "expected_start_ms": expected_start_ms,
        "submit_ms": j.submit_ms,
        "start_ms": j.start_ms,
        "time_limit_ms": j.spec.time_limit_ms,
        "nodes": nodes,
        "node_count": j.node_count(),
        "gpus_per_node": j.spec.gpus(),
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

async fn node_names(cluster: &Cluster) -> Result<BTreeMap<NodeId, String>, UiError> {
    crate::commands::node_names(cluster).await.map_err(failed)
}

/// Every node with its GPUs and MIG instances, each with the job holding it (and its user) and
/// its health.
pub(super) async fn nodes(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>) -> Answer {
    let user = caller.user_or_401()?;
    let cluster = api.cluster_for(user);
    let Reply::Nodes(nodes) = call(&cluster, ClientRequest::ListNodes).await? else {
        return Err(error(StatusCode::BAD_GATEWAY, "unexpected reply to ListNodes"));
    };
    let query = proto::JobQuery { live: true, brief: true, states: vec![JobState::Running], ..Default::default() };
    let running = cluster.query_jobs(query, PATIENCE).await.map_err(failed)?;
    // (node, slot) → (job, user); shards by (node, gpu) → every (job, user, shards) sharing it
    let mut holders = Holders::new();
    let mut sharers = Sharers::new();
    for j in &running {
        for part in j.parts.iter().filter(|p| p.run == j.run) {
            for slot in &part.alloc.gpus {
                match scheduler::decode_slot(*slot) {
                    Slot::Shard { gpu, shards } => sharers.entry((part.alloc.node, gpu)).or_default().push((j.id, &j.spec.user, shards)),
                    _ => _ = holders.insert((part.alloc.node, *slot), (j.id, j.spec.user.as_str())),
                }
            }
        }
    }
    let rows: Vec<Value> = nodes.iter().map(|n| node_row(n, &holders, &sharers)).collect();
    Ok(Json(json!({ "nodes": rows, "running_jobs": running.len() })))
}

/// The job (and its user) holding each (node, slot).
type Holders<'a> = BTreeMap<(NodeId, u32), (u64, &'a str)>;
/// The jobs (with their users and shards) sharing each (node, gpu).
type Sharers<'a> = BTreeMap<(NodeId, u32), Vec<(u64, &'a str, u32)>>;

fn node_row(n: &NodeInfo, holders: &Holders, sharers: &Sharers) -> Value {
    let holder = |slot: u32| holders.get(&(n.id, slot)).map(|(job, user)| json!({ "job": job, "user": user }));
    let shared = |gpu: u32| -> Vec<Value> {
        let of = sharers.get(&(n.id, gpu)).map(Vec::as_slice).unwrap_or_default();
        of.iter().map(|(job, user, shards)| json!({ "job": job, "user": user, "shards": shards })).collect()
    };
    let mut gpus = Vec::new();
    for index in 0..n.gpus_total {
        let health = n.unhealthy_gpus.iter().find(|(g, _)| *g == index).map(|(_, why)| why.clone());
        let model = n.gpu_types.get(index as usize).or(n.gpu_types.first()).cloned().unwrap_or_default();
        let mig: Vec<Value> = n
            .mig
            .iter()
            .filter(|m| m.gpu == index)
            .flat_map(|m| m.layout.iter().zip(&m.start_slices))
            .map(|(profile, start)| {
                let slot = scheduler::mig_slot(index.min((1 << 20) - 1), (*start).min(255));
                json!({ "profile": profile, "start_slice": start, "holder": holder(slot) })
            })
            .collect();
        gpus.push(
            json!({ "index": index, "model": model, "holder": holder(index), "shared": shared(index), "unhealthy": health, "mig": mig }),
        );
    }
    let (short, state) = slurm_compat::show::node_state(n);
    json!({
        "name": n.name,
        "state": state,
        "state_short": short,
        "role": format!("{:?}", n.role).to_lowercase(),
        "reason": n.reason,
        "partitions": n.partitions,
        "cpus": [n.cpus_alloc, n.cpus_total],
        "memory_mib": [n.memory_alloc_mib, n.memory_mib],
        "gpus": gpus,
    })
}

/// The latest sample of every GPU a job holds, by node: `{"at_ms", "nodes": {NODE: [[gpu,
/// start slice or null, utilization % or null, memory used MiB, memory MiB]]}}`. Gathered
/// from the nodes at most once per [`UTILIZATION_CACHE_MS`] for every caller; a node that does
/// not answer is left out.
pub(super) async fn utilization(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>) -> Answer {
    let user = caller.user_or_401()?;
    let mut cached = api.ui.utilization.lock().await;
    if let Some((at, value)) = cached.as_ref() {
        if at.elapsed().as_millis() < u128::from(UTILIZATION_CACHE_MS) {
            return Ok(Json(value.clone()));
        }
    }
    let cluster = api.cluster_for(user);
    let Reply::Nodes(nodes) = call(&cluster, ClientRequest::ListNodes).await? else {
        return Err(error(StatusCode::BAD_GATEWAY, "unexpected reply to ListNodes"));
    };
    // The nodes where running jobs hold GPUs or MIG instances.
    let query = proto::JobQuery { live: true, brief: true, states: vec![JobState::Running], ..Default::default() };
    let running = cluster.query_jobs(query, PATIENCE).await.map_err(failed)?;
    let held: std::collections::BTreeSet<NodeId> = running
        .iter()
        .flat_map(|j| j.parts.iter().filter(move |p| p.run == j.run && !p.alloc.gpus.is_empty()).map(|p| p.alloc.node))
        .collect();
    let busy: Vec<String> =
        nodes.into_iter().filter(|n| n.state != proto::NodeState::Down && held.contains(&n.id)).map(|n| n.name).collect();
    let mut gathered = serde_json::Map::new();
    let mut calls = tokio::task::JoinSet::new();
    let mut pending = busy.into_iter();
    loop {
        while calls.len() < SAMPLE_CALLS_IN_FLIGHT_MAX {
            let Some(node) = pending.next() else { break };
            let cluster = api.cluster_for(user);
            calls.spawn(async move {
                let reply =
                    cluster.call_patiently(ClientRequest::GpuSamples { node: node.clone() }, std::time::Duration::from_secs(2)).await;
                (node, reply)
            });
        }
        let Some(done) = calls.join_next().await else { break };
        if let Ok((node, Ok(Reply::GpuSamples(samples)))) = done {
            let rows: Vec<Value> = samples
                .iter()
                .map(|s| json!([s.gpu, s.mig_start_slice, s.utilization_pct, s.memory_used_mib, s.memory_total_mib]))
                .collect();
            gathered.insert(node, Value::Array(rows));
        }
    }
    let value = json!({ "at_ms": now_ms(), "nodes": gathered });
    *cached = Some((std::time::Instant::now(), value.clone()));
    Ok(Json(value))
}

/// One job's page: the job, its steps, nodes and GPUs, its GPU series on each node, the tail of
/// its output. Only its owner or an admin sees it.
pub(super) async fn job(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>, UrlPath(id): UrlPath<String>) -> Answer {
    let user = caller.user_or_401()?;
    let Ok(job_id) = id.parse::<proto::JobId>() else { return Err(error(StatusCode::NOT_FOUND, format!("no job {id}"))) };
    let cluster = api.cluster_for(user);
    let Reply::Job(job) = call(&cluster, ClientRequest::GetJob { job: job_id }).await? else {
        return Err(error(StatusCode::BAD_GATEWAY, "unexpected reply to GetJob"));
    };
    let (_, admin) = whoami(&cluster).await?;
    if job.spec.user != user && !admin {
        return Err(error(StatusCode::FORBIDDEN, format!("job {job_id} is {}'s: only its owner or an admin may see it", job.spec.user)));
    }
    let names = node_names(&cluster).await?;
    let nodes: Vec<String> = job.last_nodes.iter().map(|n| names.get(n).cloned().unwrap_or_else(|| n.to_string())).collect();
    let mut series = Vec::new();
    for node in nodes.iter().take(SERIES_NODES_MAX) {
        let points = match cluster.call_patiently(ClientRequest::GpuSeries { job: job_id, node: node.clone() }, PATIENCE).await {
            Ok(Reply::GpuSeries(points)) => points,
            // A node gone or never sampled: no points from it.
            _ => Vec::new(),
        };
        series.push(json!({ "node": node, "points": points.iter().map(|p| json!([p.end_ms, p.utilization_pct, p.memory_used_mib])).collect::<Vec<_>>() }));
    }
    let output = match cluster
        .call_patiently(
            ClientRequest::Logs { job: job_id, stream: LogStream::Stdout, offset: proto::LOG_OFFSET_TAIL, max_bytes: OUTPUT_TAIL_BYTES },
            PATIENCE,
        )
        .await
    {
        Ok(Reply::LogChunk { data, .. }) => String::from_utf8_lossy(&data).into_owned(),
        Ok(_) | Err(_) => String::new(),
    };
    Ok(Json(job_page(&job, &names, &nodes, series, output)))
}

fn job_page(job: &Job, names: &BTreeMap<NodeId, String>, nodes: &[String], series: Vec<Value>, output: String) -> Value {
    let node_name = |id: NodeId| names.get(&id).cloned().unwrap_or_else(|| id.to_string());
    let gpus: Vec<Value> = nodes
        .iter()
        .zip(&job.last_gpus)
        .map(|(node, slots)| {
            let named: Vec<String> = slots
                .iter()
                .map(|s| match scheduler::decode_slot(*s) {
                    Slot::Gpu(g) => g.to_string(),
                    Slot::Mig { gpu, start_slice } => format!("{gpu}/mig@{start_slice}"),
                    Slot::Shard { gpu, shards } => format!("{gpu}/shard:{shards}"),
                })
                .collect();
            json!({ "node": node, "gpus": named })
        })
        .collect();
    let steps: Vec<Value> = job
        .steps
        .iter()
        .map(|s| json!({ "step": s.step, "name": s.name, "nodes": s.nodes, "ntasks": s.ntasks, "state": s.state_name(job), "start_ms": s.start_ms, "end_ms": s.end_ms, "exit_code": s.exit_code, "signal": s.signal }))
        .collect();
    json!({
        "id": job.id,
        "name": job.spec.name,
        "user": job.spec.user,
        "account": job.spec.account,
        "partition": job.spec.partition,
        "state": job.state_name(),
        "exit_code": job.exit_code,
        "reasons": job.reasons,
        "submit_ms": job.submit_ms,
        "start_ms": job.start_ms,
        "end_ms": job.end_ms,
        "time_limit_ms": job.spec.time_limit_ms,
        "run": job.run,
        "requeues": job.restart_count,
        "repairs": job.repairs.iter().map(|r| json!({ "run": r.run, "rank": r.rank, "lost": node_name(r.lost), "spare": node_name(r.spare), "at_ms": r.at_ms, "reason": r.reason })).collect::<Vec<_>>(),
        "spares": job.spares.iter().map(|n| node_name(*n)).collect::<Vec<_>>(),
        "nodes": nodes,
        "gpus": gpus,
        "gpu_seconds": job.gpu_seconds,
        "gpu_utilization_mean_pct": job.gpu_usage.mean_utilization_pct(),
        "gpu_memory_peak_mib": job.gpu_usage.memory_used_peak_mib,
        "steps": steps,
        "series": series,
        "output_tail": output,
    })
}

/// Cancels a job (its owner or an admin: the cluster checks).
pub(super) async fn cancel(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>, UrlPath(id): UrlPath<String>) -> Answer {
    let user = caller.user_or_401()?;
    let Ok(job) = id.parse::<proto::JobId>() else { return Err(error(StatusCode::NOT_FOUND, format!("no job {id}"))) };
    call(&api.cluster_for(user), ClientRequest::Cancel { job }).await?;
    Ok(Json(json!({ "cancelled": job })))
}

/// Fair share and usage of every association (as `sshare -a`).
pub(super) async fn shares(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>) -> Answer {
    let user = caller.user_or_401()?;
    let Reply::Shares(lines) = call(&api.cluster_for(user), ClientRequest::GetShares).await? else {
        return Err(error(StatusCode::BAD_GATEWAY, "unexpected reply to GetShares"));
    };
    let ppm = |v: u64| v as f64 / 1e6;
    let rows: Vec<Value> = lines
        .iter()
        .map(|l| {
            json!({
                "account": l.account,
                "user": l.user,
                "depth": l.depth,
                "raw_shares": l.raw_shares,
                "norm_shares": ppm(l.norm_shares_ppm),
                "usage_gpu_s": l.usage_gpu_s,
                "effective_usage": ppm(l.effective_usage_ppm),
                "fair_share": l.fair_share_ppm.map(ppm),
            })
        })
        .collect();
    Ok(Json(json!({ "shares": rows })))
}

/// Node events the cluster view shows, newest first.
const NODE_EVENTS_SHOWN: usize = 50;

/// The cluster: its leader, term and members, the nodes that are not up (with why), and the
/// last node events.
pub(super) async fn cluster(State(api): State<Arc<Api>>, Extension(caller): Extension<Caller>) -> Answer {
    let user = caller.user_or_401()?;
    let cluster = api.cluster_for(user);
    let Reply::Cluster(info) = call(&cluster, ClientRequest::ClusterInfo).await? else {
        return Err(error(StatusCode::BAD_GATEWAY, "unexpected reply to ClusterInfo"));
    };
    let Reply::Nodes(nodes) = call(&cluster, ClientRequest::ListNodes).await? else {
        return Err(error(StatusCode::BAD_GATEWAY, "unexpected reply to ListNodes"));
    };
    let events = match call(&cluster, ClientRequest::NodeEvents).await? {
        Reply::NodeEvents(events) => events,
        _ => Vec::new(),
    };
    let events: Vec<Value> = events
        .iter()
        .rev()
        .take(NODE_EVENTS_SHOWN)
        .map(|e| json!({ "at_ms": e.at_ms, "node": e.node, "what": e.what, "reason": e.reason }))
        .collect();
    let members: Vec<Value> =
        info.members.iter().map(|m| json!({ "name": m.name, "role": format!("{:?}", m.role).to_lowercase(), "addr": m.addr })).collect();
    let troubled: Vec<Value> = nodes
        .iter()
        .filter(|n| n.state != proto::NodeState::Up || !n.unhealthy_gpus.is_empty())
        .map(|n| json!({ "name": n.name, "state": slurm_compat::show::node_state(n).1, "reason": n.reason, "unhealthy_gpus": n.unhealthy_gpus }))
        .collect();
    Ok(Json(json!({
        "leader": info.leader,
        "term": info.term,
        "commit_index": info.commit_index,
        "answered_by": info.answered_by,
        "members": members,
        "nodes_total": nodes.len(),
        "nodes_up": nodes.iter().filter(|n| n.state == proto::NodeState::Up).count(),
        "troubled": troubled,
        "events": events,
    })))
}

#[cfg(test)]
mod tests {
    use proto::{NodeInfo, NodeRole, NodeState};
    use serde_json::json;

    use super::{node_row, Holders, Sharers};

    #[test]
    fn a_gpu_shared_by_shard_jobs_lists_them_and_a_held_one_its_holder() {
        let node = NodeInfo {
            id: 1,
            name: "n1".into(),
            addr: "n1:1".into(),
            state: NodeState::Up,
            role: NodeRole::Agent,
            gpus_total: 2,
            gpus_free: 0,
            gpu_types: vec!["h100".into(); 2],
            cpus_total: 8,
            cpus_alloc: 3,
            memory_mib: 1024,
            memory_alloc_mib: 0,
            reason: None,
            unhealthy_gpus: Vec::new(),
            cert_fingerprint: String::new(),
            partitions: Vec::new(),
            mig: Vec::new(),
            reserved: false,
            maint: false,
        };
        let holders: Holders = [((1, 1), (7, "bob"))].into();
        let sharers: Sharers = [((1, 0), vec![(5, "alice", 2), (6, "carol", 1)])].into();
        let row = node_row(&node, &holders, &sharers);
        assert_eq!(row["gpus"][0]["holder"], json!(null));
        assert_eq!(row["gpus"][0]["shared"], json!([{"job": 5, "user": "alice", "shards": 2}, {"job": 6, "user": "carol", "shards": 1}]));
        assert_eq!(row["gpus"][1]["holder"], json!({"job": 7, "user": "bob"}));
        assert_eq!(row["gpus"][1]["shared"], json!([]));
    }
}
