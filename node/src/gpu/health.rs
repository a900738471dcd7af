//! GPU health: XID errors, uncorrectable ECC errors, GPUs fallen off the bus and NVML errors
//! become `HealthEvent`s on a bounded channel. A monitor blocks (NVML's event wait) on a blocking
//! thread; [`run_health_loop`] moves it there and forwards what it finds.

use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, info, warn};

/// Capacity of the channel between a monitor and whoever reports its events.
pub const HEALTH_CHANNEL_CAPACITY: usize = 64;

/// How long one `poll` blocks at most; the loop notices a closed channel this often.
pub const HEALTH_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// A change of a GPU's (or one MIG instance's) health, to report as `PeerRequest::ReportGpuHealth`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthEvent {
    pub gpu: u32,
    pub mig_uuid: Option<String>,
    pub healthy: bool,
    pub reason: String,
}

/// A source of health events.
pub trait HealthMonitor: Send + 'static {
    /// Waits at most `timeout` and returns the events seen (none on a quiet interval).
    fn poll(&mut self, timeout: Duration) -> anyhow::Result<Vec<HealthEvent>>;
}

/// XIDs caused by the application (bad memory access, a killed context, a graphics engine
/// exception from user code) rather than the GPU; the GPU stays healthy. The same list the
/// Kubernetes NVIDIA device plugin skips.
pub const APPLICATION_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

/// Whether XID `xid` makes the GPU unhealthy, and the reason to report.
pub fn classify_xid(xid: u64) -> Option<String> {
    if APPLICATION_XIDS.contains(&xid) {
        return None;
    }
    let what = match xid {
        48 => "double bit ecc error",
        63 | 64 => "ecc page retirement or row remapping",
        74 => "nvlink error",
        79 => "gpu has fallen off the bus",
        92 => "high single bit ecc error rate",
        94 => "contained ecc error",
        95 => "uncontained ecc error",
        119 | 120 => "gsp error",
        _ => "critical error",
    };
    Some(format!("xid {xid}: {what}"))
}

/// Something wrong (or right again) with a GPU, as a monitor sees it. Real and simulated
/// monitors both produce these; [`HealthTracker`] turns them into events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuFault {
    /// An XID event (`mig_uuid` when NVML tied it to one MIG instance).
    Xid { gpu: u32, xid: u64, mig_uuid: Option<String> },
    /// The volatile uncorrectable ECC error count grew by `count`.
    EccUncorrectable { gpu: u32, count: u64 },
    /// NVML answered `GPU is lost`.
    FallenOffBus { gpu: u32 },
    /// Any other NVML failure while watching the GPU.
    NvmlError { gpu: u32, message: String },
    /// The GPU (or MIG instance) works again (an operator fixed it, a simulated test says so).
    Recovered { gpu: u32, mig_uuid: Option<String> },
}

/// Remembers what was reported so a flood of XIDs is one event, and recovery is reported only
/// for what was reported unhealthy.
#[derive(Debug, Default)]
pub struct HealthTracker {
    unhealthy: std::collections::BTreeMap<(u32, Option<String>), String>,
}

impl HealthTracker {
    /// The event `fault` gives, or `None` when it changes nothing.
    pub fn observe(&mut self, fault: GpuFault) -> Option<HealthEvent> {
        let (key, reason) = match fault {
            GpuFault::Xid { gpu, xid, mig_uuid } => ((gpu, mig_uuid), classify_xid(xid)?),
            GpuFault::EccUncorrectable { gpu, count } => ((gpu, None), format!("{count} uncorrectable ecc errors")),
            GpuFault::FallenOffBus { gpu } => ((gpu, None), "gpu has fallen off the bus".to_string()),
            GpuFault::NvmlError { gpu, message } => ((gpu, None), format!("nvml error: {message}")),
            GpuFault::Recovered { gpu, mig_uuid } => {
                let key = (gpu, mig_uuid);
                self.unhealthy.remove(&key)?;
                return Some(HealthEvent { gpu: key.0, mig_uuid: key.1, healthy: true, reason: "recovered".into() });
            }
        };
        if self.unhealthy.contains_key(&key) {
            return None;
        }
        self.unhealthy.insert(key.clone(), reason.clone());
        Some(HealthEvent { gpu: key.0, mig_uuid: key.1, healthy: false, reason })
    }

    /// Whether `gpu` (as a whole) is reported unhealthy.
    pub fn is_unhealthy(&self, gpu: u32) -> bool {
        self.unhealthy.contains_key(&(gpu, None))
    }
}

/// A monitor that never reports (a node without GPUs).
pub struct IdleMonitor;

impl HealthMonitor for IdleMonitor {
    fn poll(&mut self, timeout: Duration) -> anyhow::Result<Vec<HealthEvent>> {
        std::thread::sleep(timeout);
        Ok(Vec::new())
    }
}

/// Runs `monitor` until `tx` is closed, sending every event it finds. A failing poll is logged
/// and retried after a pause; the events wait for room in the bounded channel.
pub async fn run_health_loop(monitor: Box<dyn HealthMonitor>, tx: mpsc::Sender<HealthEvent>) {
    let mut monitor = Some(monitor);
    let mut failures: u32 = 0;
    info!("gpu health monitor started");
    while !tx.is_closed() {
        let Some(mut m) = monitor.take() else { break };
        let polled = tokio::task::spawn_blocking(move || {
            let events = m.poll(HEALTH_POLL_INTERVAL);
            (m, events)
        })
        .await;
        let (m, events) = match polled {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "gpu health monitor panicked, stopping it");
                return;
            }
        };
        monitor = Some(m);
        match events {
            Ok(events) => {
                failures = 0;
                for event in events {
                    debug!(gpu = event.gpu, healthy = event.healthy, reason = %event.reason, "gpu health event");
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                warn!(error = %format!("{e:#}"), failures, "poll gpu health");
                let pause_ms = 200u64.saturating_mul(1 << failures.min(5));
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
            }
        }
    }
    info!("gpu health monitor stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_xids_keep_the_gpu_healthy() {
        assert_eq!(classify_xid(13), None);
        assert_eq!(classify_xid(43), None);
        assert_eq!(classify_xid(79).as_deref(), Some("xid 79: gpu has fallen off the bus"));
        assert_eq!(classify_xid(48).as_deref(), Some("xid 48: double bit ecc error"));
        assert_eq!(classify_xid(999).as_deref(), Some("xid 999: critical error"));
    }
}
