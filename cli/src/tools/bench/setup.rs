//! What the benchmarks share about their cluster: cancelling many jobs at once to empty it (the
//! 3-node cluster they measure is `DevOptions::three_nodes`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use proto::ClientRequest;

use crate::client::Cluster;

/// Cancels `jobs` from at most `tasks_max` concurrent tasks, each call patient for `patience`.
pub(crate) async fn cancel_all(cluster: &Arc<Cluster>, jobs: Vec<u64>, tasks_max: usize, patience: Duration) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for chunk in jobs.chunks(jobs.len().div_ceil(tasks_max.max(1)).max(1)) {
        let (cluster, chunk) = (Arc::clone(cluster), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            for job in chunk {
                cluster.call_patiently(ClientRequest::Cancel { job }, patience).await.with_context(|| format!("cancel job {job}"))?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await.context("join canceller")??;
    }
    Ok(())
}
