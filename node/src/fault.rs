//! Fault injection for tests and the chaos harness. A file `DATA_DIR/fault-partition` cuts the
//! node off from the peers it names: node names (refused when they call in) and addresses (not
//! called), one per line, or `*` for everyone. Removing the file heals the partition.

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
