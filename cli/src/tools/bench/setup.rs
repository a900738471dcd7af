//! What the benchmarks share about their cluster: the 3-node `dev up` cluster they measure, and
//! cancelling many jobs at once to empty it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use proto::Request;

use crate::client::Cluster;
use crate::tools::dev::DevOptions;

/// The 3-node cluster `corral bench` and `corral bench --processes` measure.
pub(crate) fn three_nodes() -> DevOptions {
    DevOptions {
        nodes: 3,
        gpus: "h100:8".into(),
        voters_max: 3,
        cpus: 64,
        memory_mib: 512 * 1024,
        heartbeat_interval_ms: 200,
        node_down_after_ms: 3_000,
        voter_replace_after_ms: 600_000,
        kill_grace_ms: 1_000,
        snapshot_logs: 1_000,
        checkpoint_root: None,
        gpu_sample_interval_ms: 1_000,
        min_job_age_s: 300,
        wait_s: 60,
        run_as_user: false,
        gpu_device_files: Vec::new(),
        partitions: vec!["default".into(), "gpu".into()],
    }
}

/// Cancels `jobs` from at most `tasks_max` concurrent tasks, each call patient for `patience`.
pub(crate) async fn cancel_all(cluster: &Arc<Cluster>, jobs: Vec<u64>, tasks_max: usize, patience: Duration) -> anyhow::Result<()> {
    let mut tasks = Vec::new();
    for chunk in jobs.chunks(jobs.len().div_ceil(tasks_max.max(1)).max(1)) {
        let (cluster, chunk) = (Arc::clone(cluster), chunk.to_vec());
        tasks.push(tokio::spawn(async move {
            for job in chunk {
                cluster.call_patiently(Request::Cancel { job }, patience).await.with_context(|| format!("cancel job {job}"))?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await.context("join canceller")??;
    }
    Ok(())
}
