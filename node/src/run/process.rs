//! Starting one job process: a run's (in its shepherd) or a step task's, in its own session and
//! process group, in the job's cgroups, as the job's user, in the job's mount namespace, with its
//! output files opened as that user; what starts a run ([`LaunchSpec`]) and how its process ended
//! ([`ExitRecord`]). `launcher` prepares the spec, `shepherd` starts and watches the process.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use proto::{JobId, RunNo};
use serde::{Deserialize, Serialize};

/// Everything needed to start one run of a job on this node.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LaunchSpec {
    pub job: JobId,
    pub run: RunNo,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: PathBuf,
    pub stdout_path: PathBuf,
    pub stderr_path: PathBuf,
    pub time_limit_ms: Option<u64>,
    /// `--signal=SIG@SECONDS`: sent that long before the time limit, and first on a requeue.
    pub signal: Option<proto::SignalSpec>,
    /// Later runs append to the output of earlier ones; the first truncates.
    pub append: bool,
    /// The account the job runs as; none runs it as the daemon's own user (dev clusters).
    pub run_as: Option<crate::run::identity::Account>,
    /// The part only holds the node's share of a batch job for its steps: the process is a
    /// holder (`corrald --hold`), with no output.
    pub hold: bool,
    /// A batch job (`sbatch`): signals without `B:` go to its steps, not its script (Slurm).
    pub batch: bool,
    /// What its processes see in a mount namespace of their own (`hosts_file`, `job_dir`).
    #[serde(flatten)]
    pub mounts: JobMounts,
    /// The job's checkpoint directory, where the run may remove it once it completed and left
    /// nothing there (`launcher::tidy_checkpoint_dir`): only for a job on one node, whose completion
    /// ends it (a gang's peer may still write into a shared directory).
    #[serde(default)]
    pub checkpoint_dir_tidy: Option<PathBuf>,
}

/// What a run's processes (and its steps' tasks) see in a mount namespace of their own (needs
/// root); nothing set, no namespace. Flattened into the records that carry it, whose
/// `hosts_file` key it had before `job_dir`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobMounts {
    /// Seen as `/etc/hosts` (`job_hosts_file`).
    #[serde(default)]
    pub hosts_file: Option<PathBuf>,
    /// Seen as `/job`: the job's directory, with DeepSpeed's `/job/hostfile` and `/job/bin`
    /// (`pdsh` and `ssh` that reach the job's nodes through its steps).
    #[serde(default)]
    pub job_dir: Option<PathBuf>,
}

/// Where a run's job directory is seen (DeepSpeed's launcher reads `/job/hostfile`).
pub const JOB_MOUNT: &str = "/job";

/// How a job ended, as its shepherd saw it (`status.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitRecord {
    Exited(i32),
    Signaled(i32),
    /// The job could not be started.
    Failed(String),
}

fn open_output(path: &Path, append: bool) -> anyhow::Result<std::fs::File> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("create output directory {}", parent.display()))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.create(true);
    if append {
        options.append(true);
    } else {
        options.write(true).truncate(true);
    }
    options.open(path).with_context(|| format!("open output file {}", path.display()))
}

/// Runs `f` with this thread's file-system identity switched to `account` (Linux `setfsuid`,
/// per thread), so files are opened with the user's permissions: a job cannot make the daemon
/// write where its user could not.
fn as_user<T>(account: Option<&crate::run::identity::Account>, f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let Some(a) = account else { return f() };
    // SAFETY: setfsuid/setfsgid change only this thread's file-system ids; restored below.
    let (old_gid, old_uid) = unsafe { (libc::setfsgid(a.gid), libc::setfsuid(a.uid)) };
    let result = f();
    // SAFETY: as above.
    unsafe {
        libc::setfsuid(old_uid as libc::uid_t);
        libc::setfsgid(old_gid as libc::gid_t);
    }
    result
}

/// Writes `text` at the start of the run's output (the preflight report) the way the process
/// would have: truncating on a first run unless `--open-mode=append`. The process then appends.
pub fn write_output_head(spec: &mut LaunchSpec, text: &[u8]) -> anyhow::Result<()> {
    let mut out = as_user(spec.run_as.as_ref(), || open_output(&spec.stdout_path, spec.append))?;
    if spec.stderr_path != spec.stdout_path {
        as_user(spec.run_as.as_ref(), || open_output(&spec.stderr_path, spec.append))?;
    }
    std::io::Write::write_all(&mut out, text).with_context(|| format!("write {}", spec.stdout_path.display()))?;
    spec.append = true;
    Ok(())
}

/// Appends `text` to an output file.
pub fn append_output(spec: &LaunchSpec, path: &Path, text: &[u8]) -> anyhow::Result<()> {
    let mut out = as_user(spec.run_as.as_ref(), || open_output(path, true))?;
    std::io::Write::write_all(&mut out, text).with_context(|| format!("write {}", path.display()))
}

/// Starts a run's process (in the shepherd) in its own session and process group, with a clean
/// environment: in the job's cgroups (`cgroups`, their directories: v2 and v1), as the job's
/// user (groups, gid, uid), with its output opened as that user. It dies with the calling
/// process.
pub fn start_run_process(spec: &LaunchSpec, cgroups: &[PathBuf]) -> anyhow::Result<std::process::Child> {
    let run_as = spec.run_as.as_ref();
    let (stdout, stderr) = if spec.hold {
        (Stdio::null(), Stdio::null())
    } else {
        let stdout = as_user(run_as, || open_output(&spec.stdout_path, spec.append))?;
        let stderr = if spec.stderr_path == spec.stdout_path {
            stdout.try_clone().context("duplicate output file handle")?
        } else {
            as_user(run_as, || open_output(&spec.stderr_path, spec.append))?
        };
        (Stdio::from(stdout), Stdio::from(stderr))
    };
    let procs = open_procs(cgroups)?;
    let procs_fds: Vec<i32> = procs.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
    let proc = Process { program: &spec.program, args: &spec.args, env: &spec.env, workdir: &spec.workdir, run_as, mounts: &spec.mounts };
    let mut cmd = command(&proc, procs_fds, stdout, stderr, false);
    cmd.spawn().with_context(|| format!("start {} in {}", proc.program.display(), proc.workdir.display()))
}

/// Opens `cgroup.procs` of each cgroup, for a child to join them all.
pub(crate) fn open_procs(cgroups: &[PathBuf]) -> anyhow::Result<Vec<std::fs::File>> {
    cgroups
        .iter()
        .map(|c| crate::run::cgroup::open_procs(c).with_context(|| format!("open {}", crate::run::cgroup::procs_file(c).display())))
        .collect()
}

/// One process to start for a job: a run's batch script or command, or a task of a step.
pub struct Process<'a> {
    pub program: &'a Path,
    pub args: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub workdir: &'a Path,
    pub run_as: Option<&'a crate::run::identity::Account>,
    /// What it sees in a mount namespace of its own (needs root).
    pub mounts: &'a JobMounts,
}

/// The command that starts a step's task (in its run's shepherd): like a run's process (own
/// session and process group, the job's cgroup and user, parent-death signal), its output piped
/// to the shepherd, or with `pty_slave` (`srun --pty`) the pseudo-terminal as its stdin, stdout,
/// stderr and its session's controlling terminal.
pub(crate) fn task_command(
    proc: &Process<'_>,
    procs_fds: Vec<i32>,
    pty_slave: Option<&std::fs::File>,
) -> std::io::Result<std::process::Command> {
    let Some(slave) = pty_slave else { return Ok(command(proc, procs_fds, Stdio::piped(), Stdio::piped(), false)) };
    let mut cmd = command(proc, procs_fds, Stdio::from(slave.try_clone()?), Stdio::from(slave.try_clone()?), true);
    cmd.stdin(Stdio::from(slave.try_clone()?));
    Ok(cmd)
}

/// The command that starts `proc`: own session and process group, in the cgroup whose
/// `cgroup.procs` files are open as `procs_fds` (it joins each), as its user, with a
/// parent-death signal; `stdin_is_its_terminal`: its stdin (a terminal) becomes its session's
/// controlling terminal.
pub(crate) fn command(
    proc: &Process<'_>,
    procs_fds: Vec<i32>,
    stdout: Stdio,
    stderr: Stdio,
    stdin_is_its_terminal: bool,
) -> std::process::Command {
    let mut cmd = std::process::Command::new(proc.program);
    cmd.args(proc.args).env_clear().envs(proc.env).current_dir(proc.workdir).stdin(Stdio::null()).stdout(stdout).stderr(stderr);
    let ids = proc.run_as.map(|a| (a.uid, a.gid, a.groups.clone()));
    // Made before the fork: the child may not allocate. A path with a NUL byte cannot be
    // mounted; the child then fails to start with EINVAL.
    let c_path = |p: &PathBuf| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).ok();
    let mounts = (proc.mounts != &JobMounts::default())
        .then(|| (proc.mounts.hosts_file.as_ref().map(c_path), proc.mounts.job_dir.as_ref().map(c_path)));
    // SAFETY: only async-signal-safe calls (signal, sigprocmask, setsid, ioctl, write, unshare, mount,
    // setgroups, setgid, setuid, prctl) between fork and exec; nothing allocates.
    unsafe {
        cmd.pre_exec(move || {
            // Ignored signals stay ignored across exec, and a shell cannot trap a signal
            // ignored on entry: a job gets every disposition and the mask at their defaults
            // (its shepherd ignores SIGTERM and the like).
            for sig in 1..32 {
                if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The stdio descriptors are in place before this runs.
            if stdin_is_its_terminal && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for fd in &procs_fds {
                crate::run::cgroup::join_in_child(*fd)?;
            }
            if let Some((hosts, job_dir)) = &mounts {
                let invalid = || std::io::Error::from_raw_os_error(libc::EINVAL);
                let hosts = hosts.as_ref().map(|h| h.as_deref().ok_or_else(invalid)).transpose()?;
                let job_dir = job_dir.as_ref().map(|d| d.as_deref().ok_or_else(invalid)).transpose()?;
                mount_private(hosts, job_dir)?;
            }
            if let Some((uid, gid, groups)) = &ids {
                if libc::setgroups(groups.len(), groups.as_ptr()) < 0 || libc::setgid(*gid) < 0 || libc::setuid(*uid) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            // After setuid, which clears it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// In a child before exec: a mount namespace of its own in which `hosts` is bind-mounted on
/// `/etc/hosts`, so the system's resolver (glibc's `files`, for every address family and flag)
/// knows the names in it, and `job_dir` on [`JOB_MOUNT`]. Nothing it mounts is seen outside.
/// Needs `CAP_SYS_ADMIN`.
///
/// # Safety
/// Only async-signal-safe calls; for use between fork and exec.
unsafe fn mount_private(hosts: Option<&std::ffi::CStr>, job_dir: Option<&std::ffi::CStr>) -> std::io::Result<()> {
    if libc::unshare(libc::CLONE_NEWNS) < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Private first: a bind under a shared root would propagate back to the host.
    if libc::mount(c"none".as_ptr(), c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) < 0 {
        return Err(std::io::Error::last_os_error());
    }
    for (from, to) in [(hosts, c"/etc/hosts"), (job_dir, c"/job")] {
        if let Some(from) = from {
            if libc::mount(from.as_ptr(), to.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}
