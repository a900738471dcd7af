//! The chaos run on booted hosts (`corral-chaos rig`): the cluster is `scripts/hosts.sh`'s N
//! systemd-nspawn hosts, each with its own systemd and network stack, Corral installed by
//! `deploy/install.sh` and run by systemd. Faults come from outside the daemons, through
//! `hosts.sh fault` (nftables on the bridge, the cgroup freezer, SIGKILL of a host's PID 1,
//! blkio throttles, time namespaces, systemd's own signals). The workload and the checkers are
//! the runner's.
//!
//! Two things differ from a local run and live here:
//! - a job process's pid is its host's (a pid namespace per host): its liveness is looked up
//!   by (host, pid) through each host's pid namespace;
//! - a frozen host's processes exist but run nothing: the time a host was frozen is cut out of
//!   its processes' spans before the checkers see them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::ProcessSpan;

/// One `hosts.sh` call may take this long (booting hosts, a reboot, installing).
const SCRIPT_TIMEOUT_MS: u64 = 180_000;

/// The rig a run drives: where `hosts.sh` is, the rig's directory and its hosts.
#[derive(Clone, Debug)]
pub struct Rig {
    script: PathBuf,
    dir: PathBuf,
    pub hosts: Vec<String>,
    /// Each host's data directory on a disk that can be made to fail (`fail-disk`).
    fault_disk: bool,
}

impl Rig {
    /// The rig of `n` hosts `h1`..`hN` in `dir`, driven by `script` (`scripts/hosts.sh`).
    pub fn new(script: &Path, dir: &Path, n: u32, fault_disk: bool) -> Rig {
        Rig { script: script.to_path_buf(), dir: dir.to_path_buf(), hosts: (1..=n).map(|i| format!("h{i}")).collect(), fault_disk }
    }

    /// Boots the hosts with `hosts.sh up` (the cluster formed, `dir/client.toml` written).
    pub fn up(&self) -> anyhow::Result<()> {
        self.script(&["up", &self.hosts.len().to_string(), &self.dir.display().to_string()]).map(|_| ())
    }

    /// The directory every host mounts at the same path (a cluster's shared file system):
    /// the jobs' working directory, where they record their spans.
    pub fn shared(dir: &Path) -> PathBuf {
        dir.join("shared")
    }

    /// Runs `hosts.sh ARGS` with a deadline; its stderr is the error.
    fn script(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = Command::new(&self.script);
        cmd.args(args).env("CORRAL_RIG_FAULT_DISK", if self.fault_disk { "1" } else { "0" });
        let out = crate::deadline::output_within(&mut cmd, Duration::from_millis(SCRIPT_TIMEOUT_MS))
            .with_context(|| format!("run {}", self.script.display()))?
            .with_context(|| format!("hosts.sh {} gave no answer within {} s", args.join(" "), SCRIPT_TIMEOUT_MS / 1000))?;
        if !out.status.success() {
            bail!("hosts.sh {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `hosts.sh fault DIR KIND ARGS...`.
    pub fn fault(&self, kind: &str, args: &[String]) -> anyhow::Result<()> {
        let dir = self.dir.display().to_string();
        let mut all = vec!["fault", dir.as_str(), kind];
        all.extend(args.iter().map(String::as_str));
        self.script(&all).map(|_| ())
    }

    /// `hosts.sh exec DIR HOST -- CMD...`.
    pub fn exec(&self, host: &str, cmd: &[&str]) -> anyhow::Result<String> {
        let dir = self.dir.display().to_string();
        let mut all = vec!["exec", dir.as_str(), host, "--"];
        all.extend_from_slice(cmd);
        self.script(&all)
    }

    /// Installs the build on `host` again with `deploy/install.sh`.
    pub fn install(&self, host: &str) -> anyhow::Result<()> {
        self.script(&["install", &self.dir.display().to_string(), host]).map(|_| ())
    }

    /// Clears every network and disk fault, thaws and boots every host (`hosts.sh heal`).
    pub fn heal(&self) -> anyhow::Result<()> {
        self.script(&["heal", &self.dir.display().to_string()]).map(|_| ())
    }

    /// Stops every host and removes what the rig set up (`hosts.sh down`).
    pub fn down(&self) -> anyhow::Result<()> {
        self.script(&["down", &self.dir.display().to_string()]).map(|_| ())
    }

    /// Whether `host`'s container runs (its nspawn has a PID 1).
    pub fn host_up(&self, host: &str) -> bool {
        host_pid1(&self.dir, host).is_some()
    }

    /// The pid of `host`'s nspawn: a new one after each reboot.
    pub fn instance(&self, host: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.join("hosts").join(host).join("nspawn.pid")).ok()?.trim().parse().ok()
    }

    /// Waits until `host` runs in an instance other than `old` (none: any), at most `timeout`.
    pub fn wait_up(&self, host: &str, old: Option<i32>, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.host_up(host) && (old.is_none() || self.instance(host) != old) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("{host} did not run again within {} s", timeout.as_secs())
    }

    /// Of `wanted` (host, pid in that host), those that run (not zombies).
    pub fn live(dir: &Path, wanted: &BTreeSet<(String, i32)>) -> BTreeSet<(String, i32)> {
        if wanted.is_empty() {
            return BTreeSet::new();
        }
        // Each host's pid namespace, by the PID 1 of its container.
        let hosts: BTreeSet<&str> = wanted.iter().map(|(h, _)| h.as_str()).collect();
        let mut host_of_ns: BTreeMap<String, &str> = BTreeMap::new();
        for h in hosts {
            if let Some(ns) = host_pid1(dir, h).and_then(|p| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok()) {
                host_of_ns.insert(ns.display().to_string(), h);
            }
        }
        let mut out = BTreeSet::new();
        if host_of_ns.is_empty() {
            return out;
        }
        let Ok(procs) = std::fs::read_dir("/proc") else { return out };
        for e in procs.flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else { continue };
            let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/pid")) else { continue };
            let Some(host) = host_of_ns.get(&ns.display().to_string()) else { continue };
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
            if let Some(inner) = ns_pid(&status) {
                let key = (host.to_string(), inner);
                if wanted.contains(&key) && !status.lines().any(|l| l.starts_with("State:") && l.contains("Z (zombie)")) {
                    out.insert(key);
                }
            }
        }
        out
    }
}

/// The PID 1 of `host`'s container: the child of its nspawn (`hosts.sh` keeps nspawn's pid).
fn host_pid1(dir: &Path, host: &str) -> Option<i32> {
    let nspawn: i32 = std::fs::read_to_string(dir.join("hosts").join(host).join("nspawn.pid")).ok()?.trim().parse().ok()?;
    let tasks = std::fs::read_dir(format!("/proc/{nspawn}/task")).ok()?;
    for t in tasks.flatten() {
        let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        if let Some(c) = children.split_whitespace().next().and_then(|c| c.parse().ok()) {
            return Some(c);
        }
    }
    None
}

/// A process's pid in its innermost pid namespace (the last field of `NSpid:`).
fn ns_pid(status: &str) -> Option<i32> {
    status.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|rest| rest.split_whitespace().last()).and_then(|p| p.parse().ok())
}

/// A host frozen from `from_ms` to `to_ms` (none: still frozen when the run ended).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frozen {
    pub host: String,
    pub from_ms: u64,
    pub to_ms: Option<u64>,
}

/// Cuts the time its host was frozen out of each span: a frozen process holds its GPUs but
/// runs nothing, so a span becomes the pieces before and after each freeze. Time after a thaw
/// still counts: a run its host's fence should have stopped and that runs on is caught.
pub fn cut_frozen(spans: Vec<ProcessSpan>, frozen: &[Frozen]) -> Vec<ProcessSpan> {
    let mut out = Vec::with_capacity(spans.len());
    for s in spans {
        let mut pieces = vec![s.clone()];
        for f in frozen.iter().filter(|f| f.host == s.node) {
            let thaw = f.to_ms.unwrap_or(u64::MAX);
            let mut next = Vec::new();
            for p in pieces {
                let end = p.end_ms.unwrap_or(u64::MAX);
                if f.from_ms >= end || thaw <= p.start_ms {
                    next.push(p);
                    continue;
                }
                if f.from_ms > p.start_ms {
                    next.push(ProcessSpan { end_ms: Some(f.from_ms), ..p.clone() });
                }
                if thaw < end {
                    next.push(ProcessSpan { start_ms: thaw, ..p });
                }
            }
            pieces = next;
        }
        out.extend(pieces);
    }
    out
}

/// Within this of its host's thaw, a run its fence had to stop is dead: the watchdog's poll
/// (100 ms) and the death watch's look (40 ms), with room for scanning the hosts' processes.
pub const THAW_KILL_BOUND_MS: u64 = 250;

/// A run that went on after its host's thaw, while its job ran elsewhere, until its fence
/// killed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumed {
    pub job: u64,
    pub run: u32,
    pub node: String,
    pub ran_ms: u64,
}

/// Takes out of `spans` (already cut by [`cut_frozen`]) each piece that begins at its host's
/// thaw and ends within [`THAW_KILL_BOUND_MS`], of a job that another run (or, repaired onto a
/// spare, the same run on another node) started during that freeze: the runs a host frozen past
/// the fence bound resumed until their fence killed them.
/// Every process of a frozen host, the fence's own included, resumes at once on a thaw: no
/// process-level fence can stop such a run sooner, so these are reported apart from the
/// checkers' violations, with the time they ran. One that ran longer stays in and is a
/// violation.
pub fn resumed_after_thaw(spans: Vec<ProcessSpan>, frozen: &[Frozen]) -> (Vec<ProcessSpan>, Vec<Resumed>) {
    let mut kept = Vec::with_capacity(spans.len());
    let mut resumed = Vec::new();
    for s in &spans {
        let thawed = frozen.iter().find(|f| f.host == s.node && f.to_ms == Some(s.start_ms));
        let ran_ms = s.end_ms.map(|e| e.saturating_sub(s.start_ms));
        let replaced = |o: &ProcessSpan| o.run > s.run || (o.run == s.run && o.node != s.node);
        let restarted =
            |f: &Frozen| spans.iter().any(|o| o.job == s.job && replaced(o) && o.start_ms >= f.from_ms && o.start_ms <= s.start_ms);
        match (thawed, ran_ms) {
            (Some(f), Some(ms)) if ms <= THAW_KILL_BOUND_MS && restarted(f) => {
                resumed.push(Resumed { job: s.job, run: s.run, node: s.node.clone(), ran_ms: ms })
            }
            _ => kept.push(s.clone()),
        }
    }
    (kept, resumed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(node: &str, start_ms: u64, end_ms: Option<u64>) -> ProcessSpan {
        ProcessSpan { job: 1, run: 1, node: node.into(), gpus: vec!["g0".into()], start_ms, end_ms, pid: Some(7) }
    }

    #[test]
    fn a_freeze_is_cut_out_of_the_spans_of_its_host_only() {
        let frozen = [Frozen { host: "h1".into(), from_ms: 100, to_ms: Some(200) }];
        let cut = cut_frozen(vec![span("h1", 50, Some(250)), span("h2", 50, Some(250))], &frozen);
        let times: Vec<(&str, u64, Option<u64>)> = cut.iter().map(|s| (s.node.as_str(), s.start_ms, s.end_ms)).collect();
        assert_eq!(times, vec![("h1", 50, Some(100)), ("h1", 200, Some(250)), ("h2", 50, Some(250))]);
    }

    #[test]
    fn a_span_inside_a_freeze_or_ending_in_one_keeps_only_what_ran() {
        let frozen =
            [Frozen { host: "h1".into(), from_ms: 100, to_ms: Some(200) }, Frozen { host: "h1".into(), from_ms: 300, to_ms: None }];
        let cut = cut_frozen(vec![span("h1", 120, Some(180)), span("h1", 150, Some(260)), span("h1", 250, None)], &frozen);
        let times: Vec<(u64, Option<u64>)> = cut.iter().map(|s| (s.start_ms, s.end_ms)).collect();
        assert_eq!(times, vec![(200, Some(260)), (250, Some(300))]);
    }

    #[test]
    fn a_run_killed_on_thaw_while_its_job_ran_elsewhere_is_reported_apart() {
        let frozen = [Frozen { host: "h2".into(), from_ms: 1_000, to_ms: Some(7_000) }];
        let old =
            |end_ms| ProcessSpan { job: 36, run: 3, node: "h2".into(), gpus: vec![], start_ms: 500, end_ms: Some(end_ms), pid: Some(1) };
        let new = ProcessSpan { job: 36, run: 4, node: "h4".into(), gpus: vec![], start_ms: 6_900, end_ms: Some(9_000), pid: Some(2) };
        // Killed 46 ms after the thaw: reported, not checked.
        let (kept, resumed) = resumed_after_thaw(cut_frozen(vec![old(7_046), new.clone()], &frozen), &frozen);
        assert_eq!(resumed, vec![Resumed { job: 36, run: 3, node: "h2".into(), ran_ms: 46 }]);
        assert_eq!(kept.len(), 2, "the piece before the freeze and the new run stay: {kept:?}");
        assert!(crate::check_never_twice(&kept).is_empty());
        // Ran on for a second: it stays, and the checker finds it.
        let (kept, resumed) = resumed_after_thaw(cut_frozen(vec![old(8_000), new.clone()], &frozen), &frozen);
        assert!(resumed.is_empty());
        assert_eq!(crate::check_never_twice(&kept).len(), 1);
        // Not restarted elsewhere: a run that simply goes on after the thaw is no finding.
        let (kept, resumed) = resumed_after_thaw(cut_frozen(vec![old(7_046)], &frozen), &frozen);
        assert_eq!((kept.len(), resumed.len()), (2, 0));
        // Its rank repaired onto a spare during the freeze (the same run): reported too.
        let spare = ProcessSpan { run: 3, ..new };
        let (kept, resumed) = resumed_after_thaw(cut_frozen(vec![old(7_039), spare], &frozen), &frozen);
        assert_eq!(resumed, vec![Resumed { job: 36, run: 3, node: "h2".into(), ran_ms: 39 }]);
        assert!(crate::check_ranks_at_once(&kept, |_| Some(1)).is_empty(), "{kept:?}");
    }

    #[test]
    fn the_innermost_pid_is_read_from_nspid() {
        assert_eq!(ns_pid("Name:\tsh\nState:\tS (sleeping)\nNSpid:\t48211\t312\n"), Some(312));
        assert_eq!(ns_pid("Name:\tsh\nNSpid:\t900\n"), Some(900));
        assert_eq!(ns_pid("Name:\tsh\n"), None);
    }
}
