//! The launch ledger: every (job, run) this node launched, on disk before its process starts,
//! and the claim a `launch` call holds on its run meanwhile.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Context;
use proto::{InstanceId, JobId, RunNo};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{lock, Agent};

/// Entries of the launch ledger kept in memory (older ones only matter for `corral logs`).
pub(super) const LEDGER_ENTRIES_MAX: usize = 10_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct LedgerEntry {
    pub(super) job: JobId,
    pub(super) run: RunNo,
    pub(super) instance: InstanceId,
    pub(super) stdout: PathBuf,
    pub(super) stderr: PathBuf,
    /// Stopped before its launch arrived: a later launch of this run is refused.
    #[serde(default)]
    pub(super) refused: bool,
}

/// Every (job, run) this node ever launched, on disk before the process starts, so a run is
/// launched at most once even across restarts of `corrald`.
pub(super) struct Ledger {
    file: std::fs::File,
    pub(super) entries: BTreeMap<(JobId, RunNo), LedgerEntry>,
}

impl Ledger {
    pub(super) fn open(path: PathBuf) -> anyhow::Result<Ledger> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("create {}", parent.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("open launch ledger at {}", path.display()))?;
        let mut text = String::new();
        file.read_to_string(&mut text).with_context(|| format!("read launch ledger at {}", path.display()))?;
        let mut entries = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            match serde_json::from_str::<LedgerEntry>(line) {
                Ok(e) => {
                    entries.insert((e.job, e.run), e);
                }
                // A torn last line after a crash: that launch never started.
                Err(e) => warn!(line = n + 1, error = %e, "skip unreadable launch ledger line"),
            }
        }
        let mut ledger = Ledger { file, entries };
        ledger.trim();
        Ok(ledger)
    }

    pub(super) fn record(&mut self, entry: LedgerEntry) -> anyhow::Result<()> {
        let mut line = serde_json::to_string(&entry).context("encode ledger entry")?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).context("append to launch ledger")?;
        self.file.sync_data().context("sync launch ledger")?;
        self.entries.insert((entry.job, entry.run), entry);
        self.trim();
        Ok(())
    }

    fn trim(&mut self) {
        while self.entries.len() > LEDGER_ENTRIES_MAX {
            self.entries.pop_first();
        }
    }

    pub(super) fn latest(&self, job: JobId) -> Option<&LedgerEntry> {
        self.entries.range((job, 0)..=(job, RunNo::MAX)).next_back().map(|(_, e)| e)
    }
}

/// One `launch` call's hold on a (job, run) from before it reads the ledger until it returns. A
/// leader re-sends a launch it got no answer to, and launches run on a blocking pool: without
/// this, two calls for one run could both find the ledger without it and both start it (seen:
/// one node started a run twice, 5 ms apart, under a 10,000-task array). A second call while
/// the first holds the claim is answered "unavailable" and re-sent; by then the ledger has it.
pub(super) struct LaunchClaim<'a> {
    claims: &'a Mutex<BTreeSet<(JobId, RunNo)>>,
    key: (JobId, RunNo),
}

impl<'a> LaunchClaim<'a> {
    pub(super) fn take(claims: &'a Mutex<BTreeSet<(JobId, RunNo)>>, key: (JobId, RunNo)) -> Option<LaunchClaim<'a>> {
        // Not `then_some`: it would build (and drop, so release) a claim for a call turned away.
        let claimed = lock(claims).insert(key);
        claimed.then(|| LaunchClaim { claims, key })
    }
}

impl Drop for LaunchClaim<'_> {
    fn drop(&mut self) {
        lock(self.claims).remove(&self.key);
    }
}

/// A ledger entry as `control::agent` reads it, for the daemon instance `instance`.
pub(super) fn ledger_mark(entry: Option<&LedgerEntry>, instance: InstanceId) -> control::agent::Ledger {
    control::agent::Ledger::of(entry.map(|e| (e.instance, e.refused)), instance)
}

impl Agent {
    /// What the launch ledger says about `job`'s run `run` (for `control::agent`'s decisions).
    pub(super) fn ledger_mark(&self, job: JobId, run: RunNo) -> control::agent::Ledger {
        ledger_mark(lock(&self.ledger).entries.get(&(job, run)), self.instance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_claimed_by_one_launch_call_at_a_time() {
        let claims = Mutex::new(BTreeSet::new());
        let first = LaunchClaim::take(&claims, (7, 1)).expect("the first call claims the run");
        assert!(LaunchClaim::take(&claims, (7, 1)).is_none(), "a concurrent call for the same run is turned away");
        let other = LaunchClaim::take(&claims, (7, 2)).expect("another run of the job is another claim");
        drop(first);
        assert!(LaunchClaim::take(&claims, (7, 1)).is_some(), "released when the first call returns");
        drop(other);
        assert!(lock(&claims).is_empty());
    }
}
