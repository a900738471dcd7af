//! Fault injection for tests and the chaos harness. A file `DATA_DIR/fault-partition` cuts the
//! node off from the peers it names: node names (refused when they call in) and addresses (not
//! called), one per line, or `*` for everyone. Removing the file heals the partition.
//!
//! `DATA_DIR/fault-slow-disk` holds a number of milliseconds every WAL sync of the Raft log waits
//! first (a slow or stalling disk). `DATA_DIR/fault-clock-skew` holds a signed number of
//! milliseconds added to this node's wall clock, the time it writes into the commands it proposes
//! (liveness and fencing use monotonic clocks and are not skewed). Removing either file ends it.
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

/// The injected wall-clock skew, in milliseconds (see [`wall_ms`]).
static CLOCK_SKEW_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// The node's wall clock in milliseconds since the epoch, with any injected skew.
pub fn wall_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    now.saturating_add_signed(CLOCK_SKEW_MS.load(std::sync::atomic::Ordering::Relaxed))
}

/// Reads a fault file holding one integer; none when the file is absent.
fn read_number<T: std::str::FromStr>(file: &std::path::Path) -> Result<Option<T>, String> {
    match std::fs::read_to_string(file) {
        Ok(text) => text.trim().parse::<T>().map(Some).map_err(|_| format!("{}: not a number: '{}'", file.display(), text.trim())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("read {}: {e}", file.display())),
    }
}

/// Follows `DATA_DIR/fault-slow-disk` into `wal_sync_delay_ms` and `DATA_DIR/fault-clock-skew`
/// into [`wall_ms`].
pub async fn watch_disk_and_clock(data_dir: PathBuf, wal_sync_delay_ms: Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::Ordering;
    let (disk_file, skew_file) = (data_dir.join("fault-slow-disk"), data_dir.join("fault-clock-skew"));
    let mut reported: Option<String> = None;
    loop {
        let result = read_number::<u64>(&disk_file).and_then(|delay| Ok((delay, read_number::<i64>(&skew_file)?)));
        match result {
            Ok((delay, skew)) => {
                let (delay, skew) = (delay.unwrap_or(0), skew.unwrap_or(0));
                let old_delay = wal_sync_delay_ms.swap(delay, Ordering::Relaxed);
                let old_skew = CLOCK_SKEW_MS.swap(skew, Ordering::Relaxed);
                if old_delay != delay || old_skew != skew {
                    warn!(wal_sync_delay_ms = delay, clock_skew_ms = skew, "fault injection: disk or clock changed");
                }
                reported = None;
            }
            Err(e) => {
                if reported.as_deref() != Some(&e) {
                    warn!(error = %e, "fault injection file ignored");
                }
                reported = Some(e);
            }
        }
        tokio::time::sleep(POLL_INTERVAL).await;
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
