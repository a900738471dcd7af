//! GPU sampling: utilization and memory of the GPUs running jobs hold, for each run's
//! accounting and each job's series (`ClientRequest::GpuSeries`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proto::JobId;
use tracing::{debug, warn};

use super::{lock, Agent};

impl Agent {
    /// Samples the GPUs of running jobs every `interval` for their accounting (mean utilization,
    /// peak memory), reported with each run's end. Devices are matched by slot, so each MIG
    /// instance counts for the job holding it, not for every job on its GPU.
    pub async fn sample_loop(self: Arc<Self>, sampler: Arc<dyn crate::gpu::GpuSampler>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let holders: BTreeMap<u32, JobId> =
                lock(&self.running).iter().flat_map(|(job, r)| r.slots.iter().map(move |g| (*g, *job))).collect();
            if holders.is_empty() {
                lock(&self.gpu_latest).clear();
                continue;
            }
            let held: std::collections::BTreeSet<u32> = holders.keys().copied().collect();
            let sampler = Arc::clone(&sampler);
            match tokio::task::spawn_blocking(move || sampler.sample(&held)).await {
                Ok(Ok(samples)) => {
                    lock(&self.accounting).observe(&holders, &samples);
                    let now_ms = crate::server::now_ms();
                    lock(&self.gpu_series).observe(&holders, &samples, now_ms);
                    *lock(&self.gpu_latest) = crate::gpu::series::latest(&samples, &holders, now_ms);
                }
                Ok(Err(e)) => debug!(error = format!("{e:#}"), "sample gpus"),
                Err(e) => warn!(error = %e, "gpu sampler panicked"),
            }
        }
    }
}

impl Agent {
    /// The latest sample of each GPU jobs hold here (`ClientRequest::GpuSamples`).
    pub fn gpu_samples(&self) -> proto::Reply {
        proto::Reply::GpuSamples(lock(&self.gpu_latest).clone())
    }

    /// `job`'s GPU series on this node (`ClientRequest::GpuSeries`).
    pub fn gpu_series(&self, job: JobId) -> proto::Reply {
        proto::Reply::GpuSeries(lock(&self.gpu_series).points(job))
    }
}
