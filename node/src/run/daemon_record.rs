//! Which `corrald` runs this node's jobs (`JOBS_DIR/daemon.json`, [`DaemonRecord`]), written by
//! each daemon at start and by one that hands its runs over to the next; and what a shepherd or
//! the watchdog that trusted a daemon does once that process is gone ([`verdict`]).

use std::path::Path;

use proto::InstanceId;
use serde::{Deserialize, Serialize};

use crate::run::json_file::read_json;
use crate::run::procfs::{process_alive, start_ticks};

/// Which `corrald` runs this node's jobs now (`JOBS_DIR/daemon.json`), written by each daemon
/// at start and again by one that hands its runs over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonRecord {
    pub pid: i32,
    pub start_ticks: u64,
    pub instance: InstanceId,
    /// Set by a daemon that exits to be replaced: the next daemon takes over its instance and
    /// runs if it starts before `deadline_boot_ms`.
    pub handover: Option<Handover>,
}

/// What a daemon that hands its runs over leaves for the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// When a leader last acknowledged this node, on the boot clock.
    pub last_ack_boot_ms: u64,
    /// The leader's commit index in that acknowledgement.
    pub ack_commit_index: u64,
    /// The lease's deadline: past it, every listed job is killed, handed over or not.
    pub deadline_boot_ms: u64,
}

impl DaemonRecord {
    /// This process, as the daemon of `instance`.
    pub fn me(instance: InstanceId) -> DaemonRecord {
        let pid = std::process::id() as i32;
        DaemonRecord { pid, start_ticks: start_ticks(pid).unwrap_or(0), instance, handover: None }
    }

    /// Whether the process it names is alive (the same process, not a recycled pid).
    pub fn alive(&self) -> bool {
        process_alive(self.pid, self.start_ticks)
    }

    /// The hand-over a starting daemon may take: one whose deadline has not passed.
    pub fn open_handover(&self, now_boot_ms: u64) -> Option<Handover> {
        self.handover.filter(|h| now_boot_ms < h.deadline_boot_ms)
    }
}

/// What a shepherd (or the watchdog) does once the daemon it trusted is gone.
pub enum Verdict {
    /// A live daemon of its instance holds the record: trust it from now on.
    Trust(DaemonRecord),
    /// A hand-over of its instance is open: keep the jobs, look again.
    Wait,
    /// Nobody vouches for the jobs (why): kill them.
    Kill(String),
}

/// Whether a shepherd (or the watchdog) trusting a daemon of `instance` keeps its jobs now that
/// the process it trusted is gone: yes while a live daemon of that instance holds the record,
/// or while a hand-over of that instance is open (before its deadline).
pub fn verdict(daemon_file: &Path, instance: InstanceId, now_boot_ms: u64) -> Verdict {
    match read_json::<DaemonRecord>(daemon_file) {
        Ok(Some(d)) if d.instance != instance => Verdict::Kill(format!("node restarted as instance {} without a hand-over", d.instance)),
        Ok(Some(d)) => match d.handover {
            None if d.alive() => Verdict::Trust(d),
            None => Verdict::Kill("corrald is gone without handing its runs over".into()),
            Some(h) if now_boot_ms < h.deadline_boot_ms => Verdict::Wait,
            Some(_) => Verdict::Kill("the hand-over's deadline passed with no corrald taking over".into()),
        },
        Ok(None) => Verdict::Kill(format!("no daemon record at {}", daemon_file.display())),
        Err(e) => Verdict::Kill(format!("{e:#}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::json_file::write_json;

    #[test]
    fn a_shepherd_keeps_its_job_only_for_a_live_daemon_or_an_open_handover_of_its_instance() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("daemon.json");
        assert!(matches!(verdict(&file, 7, 100), Verdict::Kill(_)), "no record: nobody vouches for the job");
        write_json(&file, &DaemonRecord::me(7)).expect("write record");
        assert!(matches!(verdict(&file, 7, 100), Verdict::Trust(d) if d.pid == std::process::id() as i32));
        assert!(matches!(verdict(&file, 8, 100), Verdict::Kill(_)), "another instance took the node");
        let handover = Handover { last_ack_boot_ms: 50, ack_commit_index: 3, deadline_boot_ms: 1_000 };
        let dead = DaemonRecord { pid: i32::MAX - 1, start_ticks: 1, instance: 7, handover: Some(handover) };
        write_json(&file, &dead).expect("write record");
        assert!(matches!(verdict(&file, 7, 999), Verdict::Wait));
        assert!(matches!(verdict(&file, 7, 1_000), Verdict::Kill(_)), "the hand-over's deadline passed");
        assert_eq!(dead.open_handover(999), Some(handover));
        assert_eq!(dead.open_handover(1_000), None);
        write_json(&file, &DaemonRecord { handover: None, ..dead }).expect("write record");
        assert!(matches!(verdict(&file, 7, 10), Verdict::Kill(_)), "its daemon died without a hand-over");
        std::fs::write(&file, b"{broken").expect("write broken record");
        assert!(matches!(verdict(&file, 7, 10), Verdict::Kill(_)), "an unreadable record vouches for nothing");
    }
}
