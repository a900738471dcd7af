//! MIG layouts: re-partitioning an idle GPU of this node and reporting the new inventory.

use std::sync::Arc;

use proto::{ApiError, PeerRequest, Reply};
use tracing::{info, warn};

use super::{lock, Agent};
use crate::link::LeaderLink;

impl Agent {
    /// Re-partitions MIG GPU `gpu` through the probe (the same code for simulated and real
    /// GPUs) around the instances this node's jobs hold, which stay where they are, and reports
    /// the new inventory; refuses a GPU a job holds whole or by shards.
    pub fn apply_mig_layout(
        self: &Arc<Self>,
        probe: Arc<dyn crate::gpu::GpuProbe>,
        base: proto::Inventory,
        gpu: u32,
        profiles: Vec<String>,
        link: Arc<LeaderLink>,
    ) -> Result<Reply, ApiError> {
        let mut held: Vec<u32> = Vec::new();
        for slot in lock(&self.running).values().flat_map(|r| r.slots.iter()) {
            match proto::slot::decode_slot(*slot) {
                proto::slot::Slot::Mig { gpu: g, start_slice } if g == gpu => held.push(start_slice),
                s if s.gpu() == gpu => {
                    return Err(ApiError::Denied(format!("gpu {gpu} runs a job on the whole GPU; a MIG layout is not applied to it")))
                }
                _ => {}
            }
        }
        let node = self.node_id();
        let agent = Arc::clone(self);
        tokio::spawn(async move {
            let what = format!("mig layout {} on gpu {gpu}", profiles.join(","));
            let applied = tokio::task::spawn_blocking(move || probe.apply_layout(gpu, &profiles, &held)).await;
            match applied {
                Ok(Ok(gpus)) => {
                    *lock(&agent.gpus) = gpus.gpus.clone();
                    let mut inventory = base;
                    gpus.fill(&mut inventory);
                    info!(gpu, "applied {what}");
                    let req = PeerRequest::ReportInventory { node, inventory, reason: what.clone() };
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
