//! GPU sampling: utilization and memory of the GPUs running jobs hold, for each run's
//! accounting.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proto::JobId;
use tracing::{debug, warn};

use super::{lock, Agent};

impl Agent {
    /// Samples the GPUs of running jobs every `interval` for their accounting (mean utilization,
    /// peak memory), reported with each run's end.
    pub async fn sample_loop(self: Arc<Self>, sampler: Arc<dyn crate::gpu::GpuSampler>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let holders: BTreeMap<u32, JobId> =
                lock(&self.running).iter().flat_map(|(job, r)| r.gpus.iter().map(move |g| (*g, *job))).collect();
            if holders.is_empty() {
                continue;
            }
            let held: std::collections::BTreeSet<u32> = holders.keys().copied().collect();
            let sampler = Arc::clone(&sampler);
            match tokio::task::spawn_blocking(move || sampler.sample(&held)).await {
                Ok(Ok(samples)) => lock(&self.accounting).observe(&holders, &samples),
                Ok(Err(e)) => debug!(error = format!("{e:#}"), "sample gpus"),
                Err(e) => warn!(error = %e, "gpu sampler panicked"),
            }
        }
    }
}
