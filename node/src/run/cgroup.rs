//! cgroup v2 confinement of jobs: each run of a job on this node gets its own cgroup, the
//! process enters it before it executes the job (so nothing it forks escapes), limits are
//! written where the controllers are delegated, and the whole cgroup is killed when the run
//! ends (`cgroup.kill`: daemons the job left behind, processes that left its process group).
//!
//! Layout: `BASE/job-ID-RUN`, where `BASE` is `cgroup` from the config or, by default,
//! `corral-NODE-HASH` below the daemon's own cgroup (under systemd, with `Delegate=yes`,
//! corrald first moves itself into the leaf `daemon` beside it). Where there is no
//! cgroup v2 hierarchy, or it cannot be written, the node says so at start and runs jobs
//! unconfined.
//!
//! Hybrid hosts (cgroup v1 controllers mounted beside a v2 hierarchy without them, as systemd
//! sets up by default on many HPC distributions) get the limits v2 lacks from the v1
//! hierarchies (`memory.limit_in_bytes`, `cpu.cfs_quota_us`, `pids.max`), in a cgroup of the
//! same name below the daemon's own in each; the job joins every one before it executes. The
//! v1 `devices` controller, where mounted, fences GPU device files: each run's cgroup denies
//! the device files of the node's GPUs it was not given (`devices.deny`), so a job cannot open
//! another job's GPU whatever `CUDA_VISIBLE_DEVICES` says. On cgroup v2 the same deny list is
//! an eBPF device program attached to the run's cgroup (`crate::run::cgroup_devices`), where the
//! node can load one (root); where both exist both fence. Where neither does, the node says so
//! at start.

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
    /// cgroup v1 hierarchies used beside it: a controller v2 lacks (of [`CONTROLLERS`]), or
    /// `devices`; each with the base of the job cgroups in it.
    pub v1: Vec<(String, PathBuf)>,
    /// Whether each run's v2 cgroup gets an eBPF device program denying the GPUs it was not
    /// given ([`JobCgroups::add_device_programs`] found that it can).
    pub device_programs: bool,
}

/// The v1 hierarchies mounted here: (controller, mount point), from `/proc/self/mountinfo`.
pub fn cgroup1_mounts() -> Vec<(String, PathBuf)> {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let mut r = right.split_whitespace();
        if r.next() != Some("cgroup") {
            continue;
        }
        let options = r.nth(1).unwrap_or("");
        let Some(mount) = left.split_whitespace().nth(4) else { continue };
        for c in CONTROLLERS.iter().chain(["devices"].iter()) {
            if options.split(',').any(|o| o == *c) {
                out.push((c.to_string(), PathBuf::from(mount)));
            }
        }
    }
    out
}

/// This process's cgroup in the v1 hierarchy of `controller` (from `/proc/self/cgroup`).
pub fn own_cgroup_v1(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == controller).then(|| path.to_string())
    })
}

/// The device number (major, minor) of a character device file.
pub fn char_device(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    if !meta.file_type().is_char_device() {
        return None;
    }
    let rdev = meta.rdev();
    Some((libc::major(rdev), libc::minor(rdev)))
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
        Ok(JobCgroups { base: base.to_path_buf(), controllers, v1: Vec::new(), device_programs: false })
    }

    /// Adds the v1 hierarchies that give what v2 lacks here: the missing limits, and device
    /// fencing. `tag` names the base in each (`corral-TAG` below the daemon's own cgroup).
    pub fn add_v1(&mut self, tag: &str) {
        for (controller, mount) in cgroup1_mounts() {
            if controller != "devices" && self.controllers.contains(&controller) {
                continue;
            }
            if self.v1.iter().any(|(c, _)| *c == controller) {
                continue;
            }
            let own = own_cgroup_v1(&controller).unwrap_or_else(|| "/".into());
            let base = mount.join(own.trim_start_matches('/')).join(format!("corral-{tag}"));
            match std::fs::create_dir_all(&base) {
                Ok(()) => self.v1.push((controller, base)),
                Err(e) => warn!(controller = %controller, cgroup = %base.display(), error = %e, "cgroup v1 hierarchy not writable"),
            }
        }
    }

    /// Fences GPU device files with eBPF device programs where they can be loaded and attached
    /// below the base here; otherwise says why not (the caller logs it where it matters).
    pub fn add_device_programs(&mut self) -> Result<(), crate::run::cgroup_devices::FenceError> {
        crate::run::cgroup_devices::probe(&self.base)?;
        self.device_programs = true;
        Ok(())
    }

    /// Whether GPU device files are fenced per run (the v1 `devices` controller, or v2 device
    /// programs).
    pub fn fences_devices(&self) -> bool {
        self.device_programs || self.v1.iter().any(|(c, _)| c == "devices")
    }

    /// How GPU device files are fenced, for the log at start.
    pub fn fence_kinds(&self) -> Vec<&'static str> {
        let mut kinds = Vec::new();
        if self.device_programs {
            kinds.push("cgroup v2 eBPF device program");
        }
        if self.v1.iter().any(|(c, _)| c == "devices") {
            kinds.push("cgroup v1 devices controller");
        }
        kinds
    }

    /// Controllers enforced, by v2 or v1.
    pub fn enforced(&self) -> Vec<String> {
        let mut all: Vec<String> = self.controllers.clone();
        all.extend(self.v1.iter().filter(|(c, _)| c != "devices").map(|(c, _)| c.clone()));
        all.sort();
        all
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
        let enforced = self.enforced();
        CONTROLLERS.iter().copied().filter(|c| !enforced.iter().any(|have| have == c)).collect()
    }

    /// Creates the cgroup of one job run with its limits (and in each v1 hierarchy used, with
    /// `deny` the device numbers the run may not open), and opens their `cgroup.procs` for the
    /// launcher to join before the job executes.
    pub fn create(&self, job: u64, run: u32, limits: &Limits, deny: &[(u32, u32)]) -> anyhow::Result<JobCgroup> {
        let name = format!("job-{job}-{run}");
        let path = self.base.join(&name);
        make_dir(&path)?;
        for (file, value) in limit_files(limits, &self.controllers) {
            std::fs::write(path.join(file), &value).with_context(|| format!("write {value} to {}/{file}", path.display()))?;
        }
        if !self.controllers.is_empty() {
            // Before any process joins: the controllers for the steps' cgroups, and the leaf
            // for the run's own processes.
            let enable: Vec<String> = self.controllers.iter().map(|c| format!("+{c}")).collect();
            std::fs::write(path.join("cgroup.subtree_control"), enable.join(" "))
                .with_context(|| format!("enable {} for the steps of {}", enable.join(" "), path.display()))?;
            make_dir(&path.join(RUN_LEAF))?;
        }
        if self.device_programs && !deny.is_empty() {
            // Before any process joins: the run never holds a GPU it was not given.
            crate::run::cgroup_devices::attach(&path, deny).with_context(|| format!("fence the GPUs of job {job} run {run}"))?;
        }
        let mut v1 = Vec::new();
        for (controller, base) in &self.v1 {
            let dir = base.join(&name);
            make_dir(&dir)?;
            for (file, value) in limit_files_v1(controller, limits, deny) {
                std::fs::write(dir.join(file), &value).with_context(|| format!("write {value} to {}/{file}", dir.display()))?;
            }
            v1.push(dir);
        }
        let cgroup = JobCgroup::existing(path, v1);
        anyhow::ensure!(cgroup.procs.len() == 1 + cgroup.v1.len(), "open cgroup.procs of the cgroups of job {job} run {run}");
        Ok(cgroup)
    }
}

/// The leaf of a v2 run cgroup that holds the run's own processes (its script and the
/// tasks of steps without a cgroup of their own): v2 keeps processes out of a cgroup whose
/// children get controllers, and each step's cgroup is such a child.
pub const RUN_LEAF: &str = "run";

/// The `cgroup.procs` file a process joining cgroup `dir` writes to: that of its
/// [`RUN_LEAF`] where it has one.
pub fn procs_file(dir: &Path) -> PathBuf {
    let leaf = dir.join(RUN_LEAF);
    if leaf.is_dir() {
        leaf.join("cgroup.procs")
    } else {
        dir.join("cgroup.procs")
    }
}

impl JobCgroups {
    /// Creates the cgroups of step `step` of a run below the run's (`step-N` in each), with
    /// `limits` and, where devices are fenced, `deny` the job's GPUs the step was not given;
    /// returns their paths (v2 first), which the step's tasks join instead of the run's.
    pub fn create_step(&self, run: &JobCgroup, step: u32, limits: &Limits, deny: &[(u32, u32)]) -> anyhow::Result<Vec<PathBuf>> {
        let name = format!("step-{step}");
        let path = run.path.join(&name);
        make_dir(&path)?;
        let mut paths = vec![path.clone()];
        for (file, value) in limit_files(limits, &self.controllers) {
            std::fs::write(path.join(file), &value).with_context(|| format!("write {value} to {}/{file}", path.display()))?;
        }
        if self.device_programs && !deny.is_empty() {
            crate::run::cgroup_devices::attach(&path, deny).with_context(|| format!("fence the GPUs of step {step}"))?;
        }
        for v1 in &run.v1 {
            let controller = self.v1.iter().find(|(_, base)| v1.starts_with(base)).map_or("", |(c, _)| c.as_str());
            let dir = v1.join(&name);
            make_dir(&dir)?;
            for (file, value) in limit_files_v1(controller, limits, deny) {
                std::fs::write(dir.join(file), &value).with_context(|| format!("write {value} to {}/{file}", dir.display()))?;
            }
            paths.push(dir);
        }
        Ok(paths)
    }
}

/// Opens the `cgroup.procs` of cgroup `dir` ([`procs_file`]) for writing: a process joins
/// the cgroup by writing its pid there (a run's process and each step task, from the child
/// before it runs its program). The one way every join starts.
pub fn open_procs(dir: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().write(true).open(procs_file(dir))
}

fn make_dir(path: &Path) -> anyhow::Result<()> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("create cgroup {}", path.display())),
    }
}

/// The files written in a run's cgroup of the v1 hierarchy of `controller`, in order.
pub fn limit_files_v1(controller: &str, limits: &Limits, deny: &[(u32, u32)]) -> Vec<(&'static str, String)> {
    match controller {
        // A new cgroup's period is the kernel's default, 100 ms: writing it again would cost a
        // second bandwidth update per run.
        "cpu" => vec![("cpu.cfs_quota_us", (u64::from(limits.cpus.max(1)) * 100_000).to_string())],
        "memory" => vec![("memory.limit_in_bytes", (limits.memory_mib.max(1) * 1024 * 1024).to_string())],
        "pids" => vec![("pids.max", JOB_PIDS_MAX.to_string())],
        "devices" => deny.iter().map(|(major, minor)| ("devices.deny", format!("c {major}:{minor} rwm"))).collect(),
        _ => Vec::new(),
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

/// One job run's cgroup (v2), and its cgroups in the v1 hierarchies used.
#[derive(Debug)]
pub struct JobCgroup {
    pub path: PathBuf,
    pub v1: Vec<PathBuf>,
    /// Their `cgroup.procs`, opened before the fork: the child writes its pid in each.
    procs: Vec<std::fs::File>,
    /// OOM kills in the cgroups of its steps that are removed already.
    step_oom_kills: std::sync::atomic::AtomicU64,
}

/// Kills every process of the cgroup at `path`: `cgroup.kill` where the kernel has it (v2),
/// else SIGKILL to each process it lists.
pub fn kill_cgroup(path: &Path) {
    if std::fs::OpenOptions::new().write(true).open(path.join("cgroup.kill")).and_then(|mut f| f.write_all(b"1")).is_ok() {
        return;
    }
    for child in child_cgroups(path) {
        kill_cgroup(&child);
    }
    let Ok(text) = std::fs::read_to_string(path.join("cgroup.procs")) else { return };
    for pid in text.lines().filter_map(|l| l.trim().parse::<i32>().ok()).filter(|p| *p > 1) {
        // SAFETY: kill(2) on a process of a job's cgroup.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}

/// The cgroups directly below `path` (a run's [`RUN_LEAF`] and its steps').
fn child_cgroups(path: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(path) else { return Vec::new() };
    entries.filter_map(Result::ok).filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect()
}

/// Kills every process in cgroup `path` and below, and removes them, bottom up, retrying
/// until `deadline` while the processes exit; says whether it is gone.
pub async fn kill_and_remove_tree(path: &Path, deadline: std::time::Instant) -> bool {
    // Most runs leave their cgroup empty, without steps' cgroups below: then removing it is
    // one call, without listing it (a busy one refuses, EBUSY).
    match std::fs::remove_dir(path) {
        Ok(()) => return true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
        Err(_) => {}
    }
    for child in child_cgroups(path) {
        Box::pin(kill_and_remove_tree(&child, deadline)).await;
    }
    loop {
        kill_cgroup(path);
        match std::fs::remove_dir(path) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            Err(e) if std::time::Instant::now() >= deadline => {
                warn!(cgroup = %path.display(), error = %e, "remove job cgroup");
                return false;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

impl JobCgroup {
    /// A run's cgroups that exist already (created, or a run taken over from a previous daemon).
    pub fn existing(path: PathBuf, v1: Vec<PathBuf>) -> JobCgroup {
        let procs = std::iter::once(&path).chain(v1.iter()).filter_map(|p| open_procs(p).ok()).collect();
        JobCgroup { path, v1, procs, step_oom_kills: Default::default() }
    }

    /// The raw descriptors of the `cgroup.procs` files for the child to write its pid into.
    pub fn procs_fds(&self) -> Vec<i32> {
        self.procs.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect()
    }

    /// Every path of the run's cgroups (v2 first).
    pub fn paths(&self) -> Vec<PathBuf> {
        std::iter::once(self.path.clone()).chain(self.v1.iter().cloned()).collect()
    }

    /// Processes the kernel killed for the run's memory limit so far: `oom_kill` of v2's
    /// `memory.events` and of v1's `memory.oom_control` (kernel 4.13 and later), wherever the
    /// run has a memory controller. Read before the cgroups are removed.
    pub fn oom_kills(&self) -> u64 {
        // v2's `memory.events` counts the steps' kills too; v1 counts a kill only where the
        // limit was hit, a live step's cgroup too, and only the memory hierarchy has the file
        // (the others are not listed: a run's end reads what it must and no more).
        let mut kills = oom_kills_of(&[self.path.join("memory.events")]);
        for dir in &self.v1 {
            if let Some(run) = oom_kills_in(&dir.join("memory.oom_control")) {
                let steps: Vec<PathBuf> = child_cgroups(dir).into_iter().map(|c| c.join("memory.oom_control")).collect();
                kills += run + oom_kills_of(&steps);
            }
        }
        kills + self.step_oom_kills.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The run's memory limit in MiB, as its cgroups hold it (v2 `memory.max`, else v1
    /// `memory.limit_in_bytes`); none where no memory controller limits it.
    pub fn memory_limit_mib(&self) -> Option<u64> {
        self.memory_limit_bytes().map(|bytes| bytes >> 20)
    }

    /// The run's memory limit in bytes (as [`JobCgroup::memory_limit_mib`]).
    pub fn memory_limit_bytes(&self) -> Option<u64> {
        self.first_number("memory.max", "memory.limit_in_bytes")
    }

    /// Memory the run's processes use now, in bytes (v2 `memory.current`, else v1
    /// `memory.usage_in_bytes`); none where no memory controller accounts for it.
    pub fn memory_used_bytes(&self) -> Option<u64> {
        self.first_number("memory.current", "memory.usage_in_bytes")
    }

    /// The number in the run's v2 file `v2`, else in the first of its v1 hierarchies that has
    /// `v1` (a missing file, or `max`, is none).
    fn first_number(&self, v2: &str, v1: &str) -> Option<u64> {
        let mut files = std::iter::once(self.path.join(v2)).chain(self.v1.iter().map(|p| p.join(v1)));
        files.find_map(|f| std::fs::read_to_string(f).ok()?.trim().parse::<u64>().ok())
    }

    /// Kills every process in the cgroups and removes them, waiting briefly for them to exit.
    /// (`cgroup.procs` stays open until the last holder of this handle drops it; a task started
    /// after the removal fails to join and does not start.)
    pub async fn kill_and_remove(&self) {
        let deadline = std::time::Instant::now() + Duration::from_millis(REMOVE_WAIT_MS);
        for path in self.paths() {
            kill_and_remove_tree(&path, deadline).await;
        }
    }

    /// Kills what is left of a step's processes in its cgroups `paths` (below this run's) and
    /// removes them, keeping their OOM kills in the run's count.
    pub async fn remove_step(&self, paths: &[PathBuf]) {
        let deadline = std::time::Instant::now() + Duration::from_millis(REMOVE_WAIT_MS);
        // v2's (the first) counts in the run's `memory.events` already.
        let files: Vec<PathBuf> = paths.get(1..).unwrap_or_default().iter().map(|p| p.join("memory.oom_control")).collect();
        let kills = oom_kills_of(&files);
        self.step_oom_kills.fetch_add(kills, std::sync::atomic::Ordering::Relaxed);
        for path in paths.iter().filter(|p| self.paths().iter().any(|run| p.starts_with(run))) {
            kill_and_remove_tree(path, deadline).await;
        }
    }
}

/// The OOM kills `files` count (`memory.events` or `memory.oom_control`); a missing one counts 0.
fn oom_kills_of(files: &[PathBuf]) -> u64 {
    files.iter().filter_map(|file| oom_kills_in(file)).sum()
}

/// The OOM kills `file` counts; `None` where it is missing (a cgroup without the memory
/// controller) or unreadable (logged).
fn oom_kills_in(file: &Path) -> Option<u64> {
    match std::fs::read_to_string(file) {
        Ok(text) => Some(oom_kill_count(&text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            warn!(file = %file.display(), error = %e, "read an OOM kill count");
            None
        }
    }
}

/// The `oom_kill N` line of a `memory.events` or `memory.oom_control` file (0 without one).
pub fn oom_kill_count(text: &str) -> u64 {
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
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
    fn v1_files_limit_and_deny_the_devices_given() {
        let limits = Limits { cpus: 2, memory_mib: 64 };
        assert_eq!(limit_files_v1("memory", &limits, &[]), vec![("memory.limit_in_bytes", (64u64 << 20).to_string())]);
        assert_eq!(limit_files_v1("cpu", &limits, &[]), vec![("cpu.cfs_quota_us", "200000".to_string())], "the period left at 100 ms");
        assert_eq!(
            limit_files_v1("devices", &limits, &[(195, 1), (195, 3)]),
            vec![("devices.deny", "c 195:1 rwm".to_string()), ("devices.deny", "c 195:3 rwm".to_string())]
        );
        assert_eq!(char_device(Path::new("/dev/null")), Some((1, 3)));
        assert_eq!(char_device(Path::new("/")), None);
    }

    #[test]
    fn mountinfo_and_own_cgroup_parse_here() {
        for (controller, mount) in cgroup1_mounts() {
            assert!(mount.is_absolute(), "{controller}");
        }
        // Every Linux this runs on has /proc; a cgroup v2 mount may be absent (then none).
        if let Some(m) = cgroup2_mount() {
            assert!(m.is_absolute());
            assert!(own_cgroup().is_some_and(|c| c.starts_with('/')));
        }
    }

    #[test]
    fn the_oom_kill_count_is_read_from_v2_events_and_v1_oom_control() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\noom_group_kill 0\n";
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n";
        assert_eq!((oom_kill_count(v2), oom_kill_count(v1), oom_kill_count("oom_kill_disable 0\n")), (2, 1, 0));
    }
}
