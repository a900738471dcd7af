//! Starting and stopping one job process: its environment, output files, process group, time
//! limit, and the SIGTERM-grace-SIGKILL sequence. The process dies with its `corrald` (parent
//! death signal): a node that can no longer supervise a job must not leave it running.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use proto::{Job, JobId, RunNo, RunOutcome};
use tokio::process::Child;
use tokio::sync::mpsc;
use tracing::{debug, warn};

/// Everything needed to start one run of a job on this node.
#[derive(Clone, Debug)]
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
    /// Later runs append to the output of earlier ones; the first truncates.
    pub append: bool,
}

/// Resolves `%j` (job id), `%x` (job name) and `%%` in an output file pattern, relative to the
/// job's working directory.
pub fn output_path(pattern: &str, job: &Job) -> PathBuf {
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('j') => out.push_str(&job.id.to_string()),
            Some('x') => out.push_str(&job.spec.name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    let path = PathBuf::from(out);
    if path.is_absolute() {
        path
    } else {
        Path::new(&job.spec.workdir).join(path)
    }
}

/// The files a job's stdout and stderr go to (the same file unless `error` is set).
pub fn output_paths(job: &Job) -> (PathBuf, PathBuf) {
    let stdout = output_path(job.spec.output.as_deref().unwrap_or("corral-%j.out"), job);
    let stderr = match &job.spec.error {
        Some(p) => output_path(p, job),
        None => stdout.clone(),
    };
    (stdout, stderr)
}

/// Builds the launch of `job`'s current run: the program (a script written under `jobs_dir`
/// or the job's argv) and its environment.
pub fn prepare(job: &Job, node_name: &str, node_rank: usize, gpu_indices: &[u32], gpu_uuids: &[String], jobs_dir: &Path) -> anyhow::Result<LaunchSpec> {
    let (program, args) = match &job.spec.script {
        Some(script) => {
            let dir = jobs_dir.join(job.id.to_string());
            std::fs::create_dir_all(&dir).with_context(|| format!("create job directory {}", dir.display()))?;
            let path = dir.join("script");
            std::fs::write(&path, script).with_context(|| format!("write job script {}", path.display()))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .with_context(|| format!("make job script {} executable", path.display()))?;
            if script.starts_with("#!") {
                (path, job.spec.argv.clone())
            } else {
                let mut args = vec![path.display().to_string()];
                args.extend(job.spec.argv.iter().cloned());
                (PathBuf::from("/bin/sh"), args)
            }
        }
        None => {
            let (first, rest) = job.spec.argv.split_first().context("job has neither script nor command")?;
            (PathBuf::from(first), rest.to_vec())
        }
    };
    let mut env = job.spec.env.clone();
    let uuids = gpu_uuids.join(",");
    env.insert("CUDA_VISIBLE_DEVICES".into(), uuids.clone());
    env.insert("NVIDIA_VISIBLE_DEVICES".into(), uuids);
    env.insert("CORRAL_JOB_ID".into(), job.id.to_string());
    env.insert("CORRAL_JOB_NAME".into(), job.spec.name.clone());
    env.insert("CORRAL_NODE".into(), node_name.to_string());
    env.insert("CORRAL_RUN".into(), job.run.to_string());
    env.insert("CORRAL_RESTART_COUNT".into(), job.restart_count.to_string());
    env.insert("CORRAL_GPU_INDICES".into(), gpu_indices.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","));
    let nodes = job.nodes_of_current_run();
    env.insert("CORRAL_NNODES".into(), nodes.len().to_string());
    env.insert("CORRAL_NODE_RANK".into(), node_rank.to_string());
    let (stdout_path, stderr_path) = output_paths(job);
    Ok(LaunchSpec {
        job: job.id,
        run: job.run,
        program,
        args,
        env,
        workdir: PathBuf::from(&job.spec.workdir),
        stdout_path,
        stderr_path,
        time_limit_ms: job.spec.time_limit_ms,
        append: job.run > 1 || job.spec.open_append,
    })
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

/// Starts the process in its own session and process group, with a clean environment.
pub fn spawn(spec: &LaunchSpec) -> anyhow::Result<Child> {
    let stdout = open_output(&spec.stdout_path, spec.append)?;
    let stderr = if spec.stderr_path == spec.stdout_path {
        stdout.try_clone().context("duplicate output file handle")?
    } else {
        open_output(&spec.stderr_path, spec.append)?
    };
    let mut cmd = std::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(&spec.env)
        .current_dir(&spec.workdir)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    // SAFETY: only async-signal-safe calls (setsid, prctl) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = tokio::process::Command::from(cmd)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {} in {}", spec.program.display(), spec.workdir.display()))?;
    Ok(child)
}

/// Why the agent stops a running job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    Cancelled,
}

fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: kill(2) on a process group we created; errors (ESRCH: already gone) are harmless.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc != 0 {
        debug!(pgid, signal, error = %std::io::Error::last_os_error(), "signal process group");
    }
}

/// Waits for the run to end, enforcing its time limit and stop requests, and returns how it
/// ended. Whatever is left of the process group afterwards is killed.
pub async fn supervise(mut child: Child, spec: &LaunchSpec, mut stop_rx: mpsc::Receiver<StopReason>, kill_grace_ms: u64) -> RunOutcome {
    let Some(pid) = child.id() else {
        return RunOutcome::LaunchFailed("process exited before it could be supervised".into());
    };
    let pgid = pid as i32;
    let limit = async {
        match spec.time_limit_ms {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => std::future::pending().await,
        }
    };
    let outcome = tokio::select! {
        status = child.wait() => match status {
            Ok(s) => match (s.code(), s.signal()) {
                (Some(code), _) => RunOutcome::Exited(code),
                (None, Some(sig)) => RunOutcome::Signaled(sig),
                (None, None) => RunOutcome::Exited(-1),
            },
            Err(e) => RunOutcome::LaunchFailed(format!("wait for process: {e}")),
        },
        () = limit => {
            warn!(job = spec.job, run = spec.run, "time limit reached, stopping job");
            stop(&mut child, pgid, kill_grace_ms).await;
            RunOutcome::TimedOut
        }
        Some(StopReason::Cancelled) = stop_rx.recv() => {
            stop(&mut child, pgid, kill_grace_ms).await;
            RunOutcome::Killed
        }
    };
    signal_group(pgid, libc::SIGKILL);
    outcome
}

async fn stop(child: &mut Child, pgid: i32, kill_grace_ms: u64) {
    signal_group(pgid, libc::SIGTERM);
    if tokio::time::timeout(Duration::from_millis(kill_grace_ms), child.wait()).await.is_err() {
        signal_group(pgid, libc::SIGKILL);
        if let Err(e) = child.wait().await {
            warn!(pgid, error = %e, "wait for killed process");
        }
    }
}
