//! MIG layouts: re-partitioning an idle GPU of this node and reporting the new inventory.

use std::sync::Arc;

use proto::{ApiError, Reply, Request};
use tracing::{info, warn};

use super::{lock, Agent};
use crate::link::LeaderLink;

impl Agent {
    /// Re-partitions idle MIG GPU `gpu` through the probe (the same code for simulated and real
    /// GPUs) and reports the new inventory; refuses a GPU a job of this node holds.
    pub fn apply_mig_layout(
        self: &Arc<Self>,
        probe: Arc<dyn crate::gpu::GpuProbe>,
        base: proto::Inventory,
        gpu: u32,
        profiles: Vec<String>,
        link: Arc<LeaderLink>,
    ) -> Result<Reply, ApiError> {
        if lock(&self.running).values().any(|r| r.gpus.contains(&gpu)) {
            return Err(ApiError::Denied(format!("gpu {gpu} runs a job; a MIG layout is applied only to an idle GPU")));
        }
        let node = self.node_id();
        tokio::spawn(async move {
            let what = format!("mig layout {} on gpu {gpu}", profiles.join(","));
            let applied = tokio::task::spawn_blocking(move || probe.apply_layout(gpu, &profiles)).await;
            match applied {
                Ok(Ok(gpus)) => {
                    let mut inventory = base;
                    gpus.fill(&mut inventory);
                    info!(gpu, "applied {what}");
                    let req = Request::ReportInventory { node, inventory, reason: what.clone() };
                    if let Err(e) = link.call(req, 0).await {
                        warn!(gpu, error = %e, "report inventory after {what}");
                    }
                }
                Ok(Err(e)) => warn!(gpu, error = %e, "{what} refused"),
                Err(e) => warn!(gpu, error = %e, "{what} panicked"),
            }
        });
        Ok(Reply::Ok)
    }
}
