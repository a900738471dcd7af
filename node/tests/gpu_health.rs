//! Injected faults on the simulated probe come out of the health loop as events, on a bounded
//! channel, and mark the simulated GPUs.

use std::time::Duration;

use corral_node::gpu::{run_health_loop, GpuFault, HealthEvent, SimulatedProbe, HEALTH_CHANNEL_CAPACITY};
use corral_node::probe::GpuProbe;
use tokio::sync::mpsc;

async fn next(rx: &mut mpsc::Receiver<HealthEvent>) -> HealthEvent {
    tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("an event within 5 s").expect("channel open")
}

#[tokio::test]
async fn injected_faults_become_events() {
    let probe = SimulatedProbe::new("sxm-h100x8", "n1").expect("profile");
    let (tx, mut rx) = mpsc::channel(HEALTH_CHANNEL_CAPACITY);
    let monitor = probe.health_monitor().expect("monitor");
    let task = tokio::spawn(run_health_loop(monitor, tx));

    probe.inject(GpuFault::Xid { gpu: 3, xid: 13, mig_uuid: None }); // the application's fault: nothing
    probe.inject(GpuFault::Xid { gpu: 3, xid: 79, mig_uuid: None });
    probe.inject(GpuFault::Xid { gpu: 3, xid: 48, mig_uuid: None }); // already unhealthy: nothing
    assert_eq!(
        next(&mut rx).await,
        HealthEvent { gpu: 3, mig_uuid: None, healthy: false, reason: "xid 79: gpu has fallen off the bus".into() }
    );

    probe.inject(GpuFault::EccUncorrectable { gpu: 5, count: 2 });
    assert_eq!(next(&mut rx).await, HealthEvent { gpu: 5, mig_uuid: None, healthy: false, reason: "2 uncorrectable ecc errors".into() });

    probe.inject(GpuFault::FallenOffBus { gpu: 6 });
    probe.inject(GpuFault::NvmlError { gpu: 7, message: "Unknown Error".into() });
    assert_eq!(next(&mut rx).await.reason, "gpu has fallen off the bus");
    assert_eq!(next(&mut rx).await, HealthEvent { gpu: 7, mig_uuid: None, healthy: false, reason: "nvml error: Unknown Error".into() });

    probe.inject(GpuFault::Xid { gpu: 0, xid: 94, mig_uuid: Some("MIG-x".into()) });
    assert_eq!(
        next(&mut rx).await,
        HealthEvent { gpu: 0, mig_uuid: Some("MIG-x".into()), healthy: false, reason: "xid 94: contained ecc error".into() }
    );

    let inv = probe.discover().expect("discover");
    assert!(!inv.gpus[3].healthy);
    assert_eq!(inv.gpus[3].health_reason.as_deref(), Some("xid 79: gpu has fallen off the bus"));
    assert!(inv.gpus[0].healthy, "a MIG instance's fault leaves the GPU healthy");

    probe.inject(GpuFault::Recovered { gpu: 1, mig_uuid: None }); // never unhealthy: nothing
    probe.inject(GpuFault::Recovered { gpu: 3, mig_uuid: None });
    assert_eq!(next(&mut rx).await, HealthEvent { gpu: 3, mig_uuid: None, healthy: true, reason: "recovered".into() });
    assert!(probe.discover().expect("discover").gpus[3].healthy);
    assert!(rx.try_recv().is_err(), "no other event");

    drop(rx);
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("loop ends once the receiver is gone").expect("no panic");
}
