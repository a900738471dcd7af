//! Prometheus metrics over HTTP (`GET /metrics`), computed from the node's state at each scrape.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use proto::{JobState, NodeRole};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::server::Node;

/// A scrape request larger than this is refused.
const REQUEST_BYTES_MAX: usize = 8 * 1024;

type Labels = Vec<(String, String)>;

/// Renders every metric of `node` in the Prometheus text format.
pub fn render(node: &Node) -> String {
    let mut registry = Registry::with_prefix("corral");
    let info = node.cluster_info();
    let gauge = |registry: &mut Registry, name: &str, help: &str, value: i64| {
        let g: Gauge = Gauge::default();
        g.set(value);
        registry.register(name, help, g);
    };
    gauge(&mut registry, "raft_term", "Current Raft term", info.term as i64);
    gauge(&mut registry, "raft_is_leader", "1 if this node is the leader", i64::from(info.leader_id == Some(node.id)));
    gauge(&mut registry, "raft_commit_index", "Last committed log index", info.commit_index as i64);
    gauge(&mut registry, "raft_applied_index", "Last applied log index", info.applied_index as i64);
    gauge(&mut registry, "agent_running_jobs", "Job processes this node supervises", node.agent.running().len() as i64);
    if node.node_infos().iter().any(|n| n.id == node.id && n.role != NodeRole::Agent) {
        let jobs: Family<Labels, Gauge> = Family::default();
        let counts = node.state.read(|s| {
            let mut c = std::collections::BTreeMap::new();
            for j in s.jobs.values() {
                *c.entry(j.state).or_insert(0i64) += 1;
            }
            c
        });
        for state in [JobState::Pending, JobState::Running, JobState::Completed, JobState::Failed, JobState::Cancelled, JobState::Timeout, JobState::NodeFail] {
            jobs.get_or_create(&vec![("state".into(), state.as_str().into())]).set(counts.get(&state).copied().unwrap_or(0));
        }
        registry.register("jobs", "Jobs by state", jobs);
        let gpus_total: Family<Labels, Gauge> = Family::default();
        let gpus_free: Family<Labels, Gauge> = Family::default();
        let node_up: Family<Labels, Gauge> = Family::default();
        for n in node.node_infos() {
            let l = vec![("node".to_string(), n.name.clone())];
            gpus_total.get_or_create(&l).set(i64::from(n.gpus_total));
            gpus_free.get_or_create(&l).set(i64::from(n.gpus_free));
            node_up.get_or_create(&l).set(i64::from(n.state == proto::NodeState::Up));
        }
        registry.register("node_gpus_total", "GPUs of each node", gpus_total);
        registry.register("node_gpus_free", "Free GPUs of each node", gpus_free);
        registry.register("node_up", "1 if the node is UP", node_up);
    }
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &registry) {
        warn!(error = %e, "encode metrics");
    }
    out
}

pub async fn serve(addr: SocketAddr, node: Arc<Node>) {
    let listener = match TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            warn!(addr = %addr, error = %e, "metrics listener not started");
            return;
        }
    };
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "accept metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let node = Arc::clone(&node);
        tokio::spawn(async move {
            let mut buf = vec![0u8; REQUEST_BYTES_MAX];
            let n = match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
                Ok(Ok(n)) => n,
                _ => return,
            };
            let request = String::from_utf8_lossy(&buf[..n]);
            let (status, body) = if request.starts_with("GET /metrics") {
                ("200 OK", render(&node))
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = stream.write_all(response.as_bytes()).await {
                debug!(peer = %peer, error = %e, "write metrics response");
            }
        });
    }
}
