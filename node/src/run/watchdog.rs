//! Fencing that does not depend on `corrald` being scheduled: a small process beside the daemon
//! that kills the node's jobs when the daemon's lease runs out.
//!
//! The agent fences its own jobs when it has not heard from a leader for `fence_after_ms`
//! (ARCHITECTURE.md, "Never twice at once"). A daemon that is paused (SIGSTOP, a debugger, a VM
//! freeze of just that process, a kernel stall in its threads) cannot do that, while the leader
//! will still declare the node down and start its jobs elsewhere. So the agent also writes a
//! *lease file*: a deadline on the boot clock (its last acknowledgement plus `fence_after_ms`
//! plus `fence_kill_grace_ms`) and the process groups it runs, each with its start time. The
//! watchdog, a separate process started by `corrald` (`corrald --watchdog LEASE`), reads the
//! lease every [`POLL_MS`] and, once the deadline has passed, SIGKILLs every listed group whose
//! leader is still the process that was started (the start time guards against a recycled pid).
//! A live agent rewrites the lease at every heartbeat tick, so the watchdog acts only when the
//! agent could not.
//!
//! When the daemon dies (killed, crashed), its jobs' direct children die with it (their
//! parent-death signal), but not what they started: a batch script's `python`, an `srun`, a
//! step task's children. The watchdog notices within [`POLL_MS`] that its parent is gone, kills
//! every group the lease lists and every job cgroup it names (`cgroup.kill`), and exits: a
//! daemon that is killed takes all of its jobs with it. After a graceful stop the lease lists
//! nothing. A daemon that hands its runs over to the next one (`shepherd`, a rolling upgrade)
//! says so in the daemon record beside the lease: then the watchdog keeps enforcing the lease's
//! deadline, and exits once a daemon of the same instance runs (it started its own watchdog).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::run::procfs::{boot_ms, start_ticks};
use serde::{Deserialize, Serialize};

/// How often the watchdog reads the lease. Must stay below `heartbeat_interval_ms` for the
/// timing argument in ARCHITECTURE.md (the config keeps heartbeats at 100 ms or more).
pub const POLL_MS: u64 = control::agent::WATCHDOG_POLL_MS;

/// Names the daemon's pid for the watchdog it starts.
const DAEMON_PID_ENV: &str = "CORRAL_WATCHDOG_DAEMON_PID";

/// The most a lease file may hold; a bigger one is refused, not read.
pub const LEASE_BYTES_MAX: u64 = 1 << 20;

/// One job process group the watchdog may kill.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub pgid: i32,
    /// The group leader's start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start_ticks: u64,
}

/// What the agent promises: nothing listed runs past `deadline_boot_ms` unless renewed, or once
/// the daemon is gone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub deadline_boot_ms: u64,
    pub groups: Vec<Group>,
    /// The running jobs' cgroups, killed whole when the daemon is gone.
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
}

/// Writes the lease atomically (write, then rename). No fsync: the lease matters only while
/// this host is up.
pub fn write_lease(path: &Path, lease: &Lease) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(lease).context("encode lease")?;
    std::fs::write(&tmp, bytes).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))?;
    Ok(())
}

/// Reads the lease; none when there is no file yet.
pub fn read_lease(path: &Path) -> anyhow::Result<Option<Lease>> {
    crate::run::json_file::read_json_max(path, LEASE_BYTES_MAX)
}

/// The groups of an expired lease that are still the processes the agent started.
pub fn due(lease: &Lease, now_boot_ms: u64, start_ticks_of: impl Fn(i32) -> Option<u64>) -> Vec<Group> {
    if now_boot_ms <= lease.deadline_boot_ms {
        return Vec::new();
    }
    lease.groups.iter().filter(|g| g.pgid > 1 && start_ticks_of(g.pgid) == Some(g.start_ticks)).cloned().collect()
}

/// Kills what the lease lists, whatever its deadline: the daemon is gone. A lease that can no
/// longer be read (its directory removed) is the last one read.
fn kill_all(lease_path: &Path, last: Option<&Lease>) {
    let read = read_lease(lease_path).unwrap_or_else(|e| {
        tracing::warn!(error = format!("{e:#}"), "watchdog: read lease");
        None
    });
    let Some(lease) = read.or_else(|| last.cloned()) else { return };
    let groups = due(&Lease { deadline_boot_ms: 0, ..lease.clone() }, 1, start_ticks);
    for g in &groups {
        // SAFETY: kill(2) on a process group the agent started and listed.
        unsafe { libc::kill(-g.pgid, libc::SIGKILL) };
    }
    for cgroup in &lease.cgroups {
        crate::run::cgroup::kill_cgroup(cgroup);
    }
    tracing::warn!(groups = groups.len(), cgroups = lease.cgroups.len(), "watchdog: corrald is gone, killed its jobs");
}

/// The daemon record (`daemon_record::DaemonRecord`) beside the lease at `lease_path`.
pub fn daemon_file(lease_path: &Path) -> PathBuf {
    lease_path.with_file_name("daemon.json")
}

/// The watchdog process's loop: returns once the parent is gone and its jobs are killed, or
/// once the daemon that took the parent's runs over is running.
pub fn run(lease_path: &Path) -> anyhow::Result<()> {
    // The daemon that started this watchdog, as it named itself: one that died before the
    // watchdog first ran leaves it a child of PID 1 (or of a subreaper), which it must not
    // take for its daemon and wait on for ever (found on booted hosts: a daemon whose disk
    // failed left a watchdog behind at each of systemd's restarts).
    let parent = std::env::var(DAEMON_PID_ENV).ok().and_then(|p| p.parse().ok()).unwrap_or_else(std::os::unix::process::parent_id);
    watch(lease_path, parent)
}

/// [`run`]'s loop, for the daemon `parent`.
fn watch(lease_path: &Path, parent: u32) -> anyhow::Result<()> {
    let daemon_file = daemon_file(lease_path);
    // The parent's instance, once its record names it (a hand-over is honoured only for it).
    let mut instance: Option<proto::InstanceId> = None;
    let mut killed: std::collections::BTreeSet<(i32, u64)> = std::collections::BTreeSet::new();
    let mut last_error: Option<String> = None;
    // The last lease read: a lease file gone (its runtime directory removed while jobs still
    // run) must not unfence them.
    let mut last_lease: Option<Lease> = None;
    tracing::info!(lease = %lease_path.display(), parent, "watchdog started");
    loop {
        let orphaned = std::os::unix::process::parent_id() != parent;
        if !orphaned && instance.is_none() {
            if let Ok(Some(d)) = crate::run::json_file::read_json::<crate::run::daemon_record::DaemonRecord>(&daemon_file) {
                instance = (d.pid == parent as i32).then_some(d.instance);
            }
        }
        if orphaned {
            let verdict = match instance {
                Some(i) => crate::run::daemon_record::verdict(&daemon_file, i, boot_ms()),
                None => crate::run::daemon_record::Verdict::Kill("its daemon never named its instance".into()),
            };
            match verdict {
                crate::run::daemon_record::Verdict::Trust(d) => {
                    tracing::info!(daemon = d.pid, "watchdog: the next corrald took the runs over; its own watchdog goes on");
                    return Ok(());
                }
                // Handed over: the lease's deadline still holds, below.
                crate::run::daemon_record::Verdict::Wait => {}
                crate::run::daemon_record::Verdict::Kill(why) => {
                    tracing::debug!(reason = %why, "watchdog: the daemon is gone");
                    kill_all(lease_path, last_lease.as_ref());
                    return Ok(());
                }
            }
        }
        let read = match read_lease(lease_path) {
            Ok(None) => Ok(last_lease.clone()),
            other => other,
        };
        match read {
            Ok(Some(lease)) => {
                last_error = None;
                last_lease = Some(lease.clone());
                for g in due(&lease, boot_ms(), start_ticks) {
                    if !killed.insert((g.pgid, g.start_ticks)) {
                        continue;
                    }
                    // SAFETY: kill(2) on a process group the agent started and listed.
                    let rc = unsafe { libc::kill(-g.pgid, libc::SIGKILL) };
                    let overdue_ms = boot_ms().saturating_sub(lease.deadline_boot_ms);
                    if rc == 0 {
                        tracing::warn!(
                            pgid = g.pgid,
                            overdue_ms,
                            "watchdog: corrald did not renew its lease, killed a job's process group"
                        );
                    } else {
                        tracing::warn!(pgid = g.pgid, error = %std::io::Error::last_os_error(), "watchdog: kill job process group");
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                let msg = format!("{e:#}");
                if last_error.as_deref() != Some(&msg) {
                    tracing::warn!(error = %msg, "watchdog: read lease");
                }
                last_error = Some(msg);
            }
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    }
}

/// Starts the watchdog beside this daemon: `EXE --watchdog LEASE`, in its own session (a signal
/// to the daemon's process group does not reach it). When the daemon dies it kills the jobs'
/// processes and exits (it polls for that; a parent-death signal would kill it first).
pub fn spawn(exe: &Path, lease_path: PathBuf) -> anyhow::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--watchdog").arg(&lease_path).stdin(std::process::Stdio::null()).env(DAEMON_PID_ENV, std::process::id().to_string());
    // SAFETY: only async-signal-safe calls (setsid) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("start watchdog {} --watchdog {}", exe.display(), lease_path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_expired_lease_kills_and_only_the_processes_it_names() {
        let lease = Lease {
            deadline_boot_ms: 1_000,
            groups: vec![Group { pgid: 10, start_ticks: 5 }, Group { pgid: 11, start_ticks: 7 }, Group { pgid: 1, start_ticks: 1 }],
            cgroups: Vec::new(),
        };
        let ticks = |pid: i32| match pid {
            10 => Some(5),
            11 => Some(8), // pid reused by another process
            1 => Some(1),
            _ => None,
        };
        assert!(due(&lease, 1_000, ticks).is_empty());
        assert_eq!(due(&lease, 1_001, ticks), vec![Group { pgid: 10, start_ticks: 5 }]);
    }

    #[test]
    fn lease_round_trips_and_a_huge_or_broken_file_is_an_error() {
        let dir = std::env::temp_dir().join(format!("corral-lease-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create test dir");
        let path = dir.join("lease");
        assert_eq!(read_lease(&path).expect("read missing lease"), None);
        let lease = Lease {
            deadline_boot_ms: 42,
            groups: vec![Group { pgid: 3, start_ticks: 9 }],
            cgroups: vec![PathBuf::from("/sys/fs/cgroup/x")],
        };
        write_lease(&path, &lease).expect("write lease");
        assert_eq!(read_lease(&path).expect("read lease"), Some(lease));
        std::fs::write(&path, b"{not json").expect("write broken lease");
        assert!(read_lease(&path).is_err());
        std::fs::write(&path, vec![b' '; LEASE_BYTES_MAX as usize + 1]).expect("write huge lease");
        assert!(read_lease(&path).unwrap_err().to_string().contains("exceeds"));
        std::fs::remove_dir_all(&dir).expect("remove test dir");
    }

    #[test]
    fn a_watchdog_whose_daemon_died_before_it_ran_exits_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let lease = dir.path().join("watchdog.lease");
        // No process has this pid: the daemon is gone, and this process is not its child.
        std::thread::spawn(move || done_tx.send(watch(&lease, u32::MAX - 1).map_err(|e| e.to_string())));
        let ended = done_rx.recv_timeout(Duration::from_secs(5)).expect("the watchdog exits without waiting on a daemon it never had");
        assert_eq!(ended, Ok(()));
    }
}
