//! Fault injection for tests and the chaos harness. A file `DATA_DIR/fault-partition` cuts the
//! node off from the peers it names: node names (refused when they call in) and addresses (not
//! called), one per line, or `*` for everyone. Removing the file heals the partition.
//!
//! `DATA_DIR/fault-gpu` feeds GPU faults to a simulated probe, one per appended line:
//! `xid GPU CODE`, `ecc GPU`, `lost GPU`, `recover GPU`. The probe's health monitor then reports
//! them exactly as it reports real ones.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tracing::warn;
use transport::Client;

/// How often the switch file is read.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

#[derive(Default)]
pub struct FaultSwitch {
    blocked: RwLock<Vec<String>>,
}

impl FaultSwitch {
    /// Whether a caller presenting certificate name `peer` is cut off.
    pub fn refuses(&self, peer: &str) -> bool {
        let blocked = self.blocked.read().unwrap_or_else(|p| p.into_inner());
        blocked.iter().any(|b| b == "*" || b == peer)
    }

    /// Follows `DATA_DIR/fault-partition`, applying it to `client` and to incoming calls.
    pub async fn watch(self: Arc<Self>, file: PathBuf, client: Arc<Client>) {
        let mut current: Vec<String> = Vec::new();
        loop {
            let wanted: Vec<String> = match std::fs::read_to_string(&file) {
                Ok(text) => {
                    let lines: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
                    if lines.is_empty() {
                        vec!["*".to_string()]
                    } else {
                        lines
                    }
                }
                Err(_) => Vec::new(),
            };
            if wanted != current {
                warn!(blocked = ?wanted, "fault injection: partition changed");
                client.set_blocked(wanted.clone());
                *self.blocked.write().unwrap_or_else(|p| p.into_inner()) = wanted.clone();
                current = wanted;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// Parses one `fault-gpu` line.
pub fn parse_gpu_fault(line: &str) -> Result<crate::gpu::GpuFault, String> {
    use crate::gpu::GpuFault;
    let f: Vec<&str> = line.split_whitespace().collect();
    let gpu = |s: &str| s.parse::<u32>().map_err(|_| format!("bad gpu index '{s}' in '{line}'"));
    match f.as_slice() {
        ["xid", g, code] => {
            Ok(GpuFault::Xid { gpu: gpu(g)?, xid: code.parse().map_err(|_| format!("bad xid in '{line}'"))?, mig_uuid: None })
        }
        ["ecc", g] => Ok(GpuFault::EccUncorrectable { gpu: gpu(g)?, count: 1 }),
        ["lost", g] => Ok(GpuFault::FallenOffBus { gpu: gpu(g)? }),
        ["recover", g] => Ok(GpuFault::Recovered { gpu: gpu(g)?, mig_uuid: None }),
        _ => Err(format!("unknown gpu fault '{line}' (xid GPU CODE | ecc GPU | lost GPU | recover GPU)")),
    }
}

/// Follows `DATA_DIR/fault-gpu`, injecting each new line into `probe` once.
pub async fn watch_gpu_faults(file: PathBuf, probe: Arc<dyn crate::gpu::GpuProbe>) {
    let mut done = 0usize;
    loop {
        if let Ok(text) = std::fs::read_to_string(&file) {
            let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
            for line in lines.iter().skip(done) {
                match parse_gpu_fault(line).and_then(|fault| probe.inject(fault)) {
                    Ok(()) => warn!(fault = %line, "fault injection: gpu fault"),
                    Err(e) => warn!(error = %e, "fault injection: gpu fault refused"),
                }
            }
            done = lines.len();
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuFault;

    #[test]
    fn gpu_fault_lines() {
        assert_eq!(parse_gpu_fault("xid 3 79"), Ok(GpuFault::Xid { gpu: 3, xid: 79, mig_uuid: None }));
        assert_eq!(parse_gpu_fault("lost 0"), Ok(GpuFault::FallenOffBus { gpu: 0 }));
        assert_eq!(parse_gpu_fault("recover 1"), Ok(GpuFault::Recovered { gpu: 1, mig_uuid: None }));
        assert!(parse_gpu_fault("melt 1").is_err());
        assert!(parse_gpu_fault("xid x 79").is_err());
    }
}
