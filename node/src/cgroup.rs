//! cgroup v2 confinement of jobs: each run of a job on this node gets its own cgroup, the
//! process enters it before it executes the job (so nothing it forks escapes), limits are
//! written where the controllers are delegated, and the whole cgroup is killed when the run
//! ends (`cgroup.kill`: daemons the job left behind, processes that left its process group).
//!
//! Layout: `BASE/job-ID-RUN`, where `BASE` is `cgroup` from the config or, by default,
//! `corral-NODE-HASH` below the daemon's own cgroup (under systemd, with `Delegate=yes`,
//! corrald first moves itself into the leaf `daemon` beside it). Where there is no
//! cgroup v2 hierarchy, or it cannot be written, the node says so at start and runs jobs
//! unconfined. GPU device files are not fenced by cgroups here: cgroup v2 does that with eBPF
//! device programs, which this build does not load; `CUDA_VISIBLE_DEVICES` selects the GPUs.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use tracing::{debug, warn};

/// The controllers whose limits Corral writes.
pub const CONTROLLERS: [&str; 3] = ["cpu", "memory", "pids"];
/// Most processes one job run may have.
pub const JOB_PIDS_MAX: u32 = 65_536;
/// How long removing a killed job's cgroup is retried while its processes exit.
const REMOVE_WAIT_MS: u64 = 5_000;

/// Where this node puts job cgroups, and which limits it can enforce there.
#[derive(Clone, Debug)]
pub struct JobCgroups {
    pub base: PathBuf,
    /// Of [`CONTROLLERS`], those enabled for the job cgroups.
    pub controllers: Vec<String>,
}

/// A job run's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    pub cpus: u32,
    pub memory_mib: u64,
}

/// The cgroup v2 mount point, from `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        // ... mount-point ... - fstype source options
        let (left, right) = line.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2").then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

/// This process's cgroup v2 path (the `0::` line of `/proc/self/cgroup`), relative to the mount.
pub fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| l.strip_prefix("0::").map(str::to_string))
}

impl JobCgroups {
    /// Sets up `base` (created if missing) with every controller of [`CONTROLLERS`] that its
    /// parent offers enabled for the job cgroups below it. Errors when nothing can be written.
    pub fn open(base: &Path) -> anyhow::Result<JobCgroups> {
        std::fs::create_dir_all(base).with_context(|| format!("create cgroup {}", base.display()))?;
        let offered = std::fs::read_to_string(base.join("cgroup.controllers"))
            .with_context(|| format!("read {}/cgroup.controllers", base.display()))?;
        let offered: Vec<&str> = offered.split_whitespace().collect();
        let mut controllers = Vec::new();
        for c in CONTROLLERS.iter().filter(|c| offered.contains(c)) {
            match std::fs::write(base.join("cgroup.subtree_control"), format!("+{c}")) {
                Ok(()) => controllers.push(c.to_string()),
                Err(e) => warn!(controller = c, cgroup = %base.display(), error = %e, "enable cgroup controller"),
            }
        }
        Ok(JobCgroups { base: base.to_path_buf(), controllers })
    }

    /// The default base, `corral-TAG` below this process's own cgroup (`TAG` names the node and
    /// its data directory, so nodes sharing a host never share job cgroups). Under systemd
    /// (`Delegate=yes`) the unit's cgroup is the daemon's to divide: it first moves itself into
    /// the leaf `daemon` (cgroup v2 keeps processes out of cgroups that delegate controllers)
    /// and enables the controllers for its children.
    pub fn default_base(tag: &str) -> anyhow::Result<PathBuf> {
        let mount = cgroup2_mount().context("no cgroup v2 hierarchy is mounted")?;
        let own = own_cgroup().context("this process has no cgroup v2 path")?;
        let own_dir = mount.join(own.trim_start_matches('/'));
        if own != "/" && std::env::var_os("INVOCATION_ID").is_some() {
            let daemon = own_dir.join("daemon");
            std::fs::create_dir_all(&daemon).with_context(|| format!("create {}", daemon.display()))?;
            std::fs::write(daemon.join("cgroup.procs"), std::process::id().to_string())
                .with_context(|| format!("move corrald into {}", daemon.display()))?;
            for c in CONTROLLERS {
                if let Err(e) = std::fs::write(own_dir.join("cgroup.subtree_control"), format!("+{c}")) {
                    debug!(controller = c, error = %e, "enable controller for the unit's children");
                }
            }
        }
        Ok(own_dir.join(format!("corral-{tag}")))
    }

    /// What the controllers that are missing mean, for the log at start.
    pub fn missing(&self) -> Vec<&'static str> {
        CONTROLLERS.iter().copied().filter(|c| !self.controllers.iter().any(|have| have == c)).collect()
    }

    /// Creates the cgroup of one job run with its limits, and opens its `cgroup.procs` for
    /// the launcher to join before the job executes.
    pub fn create(&self, job: u64, run: u32, limits: &Limits) -> anyhow::Result<JobCgroup> {
        let path = self.base.join(format!("job-{job}-{run}"));
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("create cgroup {}", path.display())),
        }
        for (file, value) in limit_files(limits, &self.controllers) {
            std::fs::write(path.join(file), &value).with_context(|| format!("write {value} to {}/{file}", path.display()))?;
        }
        let procs = std::fs::OpenOptions::new()
            .write(true)
            .open(path.join("cgroup.procs"))
            .with_context(|| format!("open {}/cgroup.procs", path.display()))?;
        Ok(JobCgroup { path, procs: Some(procs) })
    }
}

/// The limit files written for `limits`, for the controllers enabled.
pub fn limit_files(limits: &Limits, controllers: &[String]) -> Vec<(&'static str, String)> {
    let has = |c: &str| controllers.iter().any(|have| have == c);
    let mut out = Vec::new();
    if has("cpu") {
        // `cpu.max`: quota and period in microseconds; `cpus` full CPUs.
        out.push(("cpu.max", format!("{} 100000", u64::from(limits.cpus.max(1)) * 100_000)));
    }
    if has("memory") {
        out.push(("memory.max", (limits.memory_mib.max(1) * 1024 * 1024).to_string()));
        out.push(("memory.swap.max", "0".to_string()));
    }
    if has("pids") {
        out.push(("pids.max", JOB_PIDS_MAX.to_string()));
    }
    out
}

/// One job run's cgroup.
#[derive(Debug)]
pub struct JobCgroup {
    pub path: PathBuf,
    /// `cgroup.procs`, opened before the fork: the child writes its pid there.
    procs: Option<std::fs::File>,
}

impl JobCgroup {
    /// A run's cgroup that exists already (a run taken over from a previous daemon).
    pub fn existing(path: PathBuf) -> JobCgroup {
        let procs = std::fs::OpenOptions::new().write(true).open(path.join("cgroup.procs")).ok();
        JobCgroup { path, procs }
    }

    /// The raw descriptor of `cgroup.procs` for the child to write its pid into.
    pub fn procs_fd(&self) -> Option<i32> {
        self.procs.as_ref().map(std::os::fd::AsRawFd::as_raw_fd)
    }

    /// Kills every process in the cgroup and removes it, waiting briefly for them to exit.
    /// (`cgroup.procs` stays open until the last holder of this handle drops it; a task started
    /// after the removal fails to join and does not start.)
    pub async fn kill_and_remove(&self) {
        let kill = self.path.join("cgroup.kill");
        if let Err(e) = std::fs::OpenOptions::new().write(true).open(&kill).and_then(|mut f| f.write_all(b"1")) {
            debug!(cgroup = %self.path.display(), error = %e, "cgroup.kill");
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(REMOVE_WAIT_MS);
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if std::time::Instant::now() >= deadline => {
                    warn!(cgroup = %self.path.display(), error = %e, "remove job cgroup");
                    return;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}

/// In the forked child, before exec: writes this process's pid into the cgroup's `procs` file.
/// Only async-signal-safe calls (getpid, write) and no allocation.
pub fn join_in_child(procs_fd: i32) -> std::io::Result<()> {
    // SAFETY: getpid cannot fail.
    let mut pid = unsafe { libc::getpid() } as u32;
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    let bytes = &digits[start..];
    // SAFETY: writes from a live buffer to a descriptor the parent opened.
    let n = unsafe { libc::write(procs_fd, bytes.as_ptr().cast(), bytes.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_written_only_for_enabled_controllers() {
        let limits = Limits { cpus: 4, memory_mib: 2048 };
        assert!(limit_files(&limits, &[]).is_empty());
        let all: Vec<String> = CONTROLLERS.iter().map(|c| c.to_string()).collect();
        let files = limit_files(&limits, &all);
        assert!(files.contains(&("cpu.max", "400000 100000".to_string())));
        assert!(files.contains(&("memory.max", (2048u64 << 20).to_string())));
        assert!(files.contains(&("pids.max", JOB_PIDS_MAX.to_string())));
        let mem_only = limit_files(&limits, &["memory".to_string()]);
        assert_eq!(mem_only.iter().map(|(f, _)| *f).collect::<Vec<_>>(), vec!["memory.max", "memory.swap.max"]);
    }

    #[test]
    fn mountinfo_and_own_cgroup_parse_here() {
        // Every Linux this runs on has /proc; a cgroup v2 mount may be absent (then none).
        if let Some(m) = cgroup2_mount() {
            assert!(m.is_absolute());
            assert!(own_cgroup().is_some_and(|c| c.starts_with('/')));
        }
    }
}
