//! Slurm's commands on top of Corral: `sbatch`, `srun`, `squeue`, `scancel`, `sinfo`,
//! `scontrol`, `sacct` and `sacctmgr`, reached through symlinks to the `corral` binary (see
//! [`install_shims`]). Each takes Slurm's options and prints Slurm's formats and errors, so
//! existing job scripts and wrappers run unchanged.
//!
//! `env.rs` and `hostlist.rs` are self-contained (std + proto only) so the node crate can
//! include them by `#[path]`.

pub mod directives;
pub mod fuzzing;
pub mod opts;
pub mod remote;
pub mod reservation;
pub mod sacct;
pub mod sacct_fields;
pub mod sacctmgr;
pub mod salloc;
pub mod sbatch;
mod sbatch_options;
pub mod scancel;
pub mod scontrol;
pub mod sinfo;
pub mod sprio;
pub mod squeue;
pub mod srun;
pub mod sshare;
pub mod sstat;
pub mod stdin;
pub mod step;
pub mod step_output;
pub mod terminal;
pub mod time;
pub mod values;

#[cfg(test)]
mod sacct_tests;
#[cfg(test)]
mod sacctmgr_tests;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use proto::{ApiError, ClientRequest, Job, JobId, JobState, NodeInfo, Reply};
pub use slurm_compat::{env, hostlist};

use crate::client::Cluster;

/// The names the `corral` binary answers to as Slurm.
pub const COMMANDS: [&str; 12] =
    ["sbatch", "srun", "salloc", "squeue", "scancel", "sinfo", "scontrol", "sacct", "sacctmgr", "sshare", "sprio", "sstat"];

/// The names it answers to inside a job only, linked into the job's `/job/bin` and never
/// installed system-wide (see [`remote`]).
pub const JOB_COMMANDS: [&str; 2] = ["pdsh", "ssh"];

pub use slurm_compat::openapi;
pub use slurm_compat::show::{exit_code_text, job_node_names, SLURM_VERSION};

/// A job's `SystemComment` (a line per repair onto a spare node), its dates as this host's
/// Slurm commands print them; `None` for a job never repaired.
pub fn system_comment(job: &Job, names: &BTreeMap<u64, String>) -> Option<String> {
    slurm_compat::show::system_comment(job, names, &time::datetime)
}

/// One job in the openapi shape ([`openapi::job`]) with its `system_comment`, whose dates are
/// local (the pure builder leaves it empty).
pub fn openapi_job(version: openapi::Version, job: &Job, names: &BTreeMap<u64, String>) -> serde_json::Value {
    let mut value = openapi::job(version, job, names);
    if let (Some(text), Some(object)) = (system_comment(job, names), value.as_object_mut()) {
        object.insert("system_comment".into(), serde_json::Value::String(text));
    }
    value
}

/// An error as a Slurm tool prints it, with the exit code to return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlurmError {
    /// The complete text for stderr (possibly several lines, no trailing newline).
    pub text: String,
    pub code: i32,
}

impl SlurmError {
    /// `PROG: error: MSG`, as Slurm's `error()` prints it.
    pub fn fatal(prog: &str, msg: impl fmt::Display) -> SlurmError {
        SlurmError { text: format!("{prog}: error: {msg}"), code: 1 }
    }

    /// A getopt complaint followed by Slurm's hint.
    pub fn getopt(prog: &str, msg: impl fmt::Display) -> SlurmError {
        SlurmError { text: format!("{prog}: {msg}\nTry \"{prog} --help\" for more information"), code: 1 }
    }

    /// Several `PROG: error: ...` lines.
    pub fn fatal_lines(prog: &str, lines: &[&str]) -> SlurmError {
        let text = lines.iter().map(|l| format!("{prog}: error: {l}")).collect::<Vec<_>>().join("\n");
        SlurmError { text, code: 1 }
    }
}

impl fmt::Display for SlurmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for SlurmError {}

/// Runs Slurm command `name` with `args` (argv without argv\[0\]); returns the exit code.
pub fn main(name: &str, args: Vec<String>) -> i32 {
    let result = match name {
        "sbatch" => sbatch::run(&args),
        "srun" => srun::run(&args),
        "salloc" => salloc::run(&args),
        "squeue" => squeue::run(&args),
        "scancel" => scancel::run(&args),
        "sinfo" => sinfo::run(&args),
        "scontrol" => scontrol::run(&args),
        "sacct" => sacct::run(&args),
        "sacctmgr" => sacctmgr::run(&args),
        "sshare" => sshare::run(&args),
        "sprio" => sprio::run(&args),
        "sstat" => sstat::run(&args),
        "pdsh" => remote::pdsh(&args),
        "ssh" => remote::ssh(&args),
        other => Err(SlurmError { text: format!("corral: '{other}' is not a Slurm command Corral provides"), code: 1 }),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            if !e.text.is_empty() {
                eprintln!("{}", e.text);
            }
            e.code
        }
    }
}

/// Creates `DIR/sbatch`, `DIR/srun`, ... as symlinks to `target` (the running `corral`).
/// Existing symlinks are replaced; any other file in the way is an error. Returns the links.
pub fn install_shims(dir: &Path, target: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut made = Vec::new();
    for name in COMMANDS {
        let link = dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => {
                std::fs::remove_file(&link).with_context(|| format!("replace {}", link.display()))?;
            }
            Ok(_) => anyhow::bail!("{} exists and is not a symlink; not replacing it", link.display()),
            Err(_) => {}
        }
        std::os::unix::fs::symlink(target, &link).with_context(|| format!("link {} to {}", link.display(), target.display()))?;
        made.push(link);
    }
    Ok(made)
}

// ---------------------------------------------------------------------------------------------
// Talking to the cluster

/// How long a command keeps retrying while the cluster elects a leader.
pub const PATIENCE: Duration = Duration::from_secs(10);

static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();

/// The one runtime of this process: the client endpoint is bound in it and every call runs on it.
fn runtime(prog: &str) -> Result<&'static tokio::runtime::Runtime, SlurmError> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SlurmError::fatal(prog, format!("start async runtime: {e}")))?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// Runs `fut` to completion on the process's runtime.
pub fn block_on<F: std::future::Future>(prog: &str, fut: F) -> Result<F::Output, SlurmError> {
    Ok(runtime(prog)?.block_on(fut))
}

/// The cluster of `$CORRAL_SOCKET` or `$CORRAL_CLUSTER` (see `Cluster::open`), asking
/// `$CORRAL_SERVER` when set.
pub fn connect(prog: &str) -> Result<Cluster, SlurmError> {
    let _inside = runtime(prog)?.enter();
    let server = std::env::var("CORRAL_SERVER").ok().filter(|s| !s.is_empty());
    Cluster::open(None, server.as_deref(), None)
        .map_err(|e| SlurmError::fatal(prog, format!("Unable to contact slurm controller (connect failure): {e:#}")))
}

/// One request, retried through elections; errors become `PROG: error: ...`.
pub async fn call(prog: &str, cluster: &Cluster, request: ClientRequest) -> Result<Reply, SlurmError> {
    cluster.call_patiently(request, PATIENCE).await.map_err(|e| SlurmError::fatal(prog, describe_error(&e)))
}

/// An error from the cluster in Slurm's words where one fits.
pub fn describe_error(e: &anyhow::Error) -> String {
    match e.downcast_ref::<ApiError>() {
        Some(ApiError::NotFound(_)) => "Invalid job id specified".to_string(),
        Some(ApiError::NoLeader | ApiError::Unavailable(_) | ApiError::NotLeader { .. }) => {
            format!("Unable to contact slurm controller (connect failure): {e}")
        }
        // The cluster's refusals of what a request names are in Slurm's words already.
        Some(ApiError::Invalid(why)) => why.clone(),
        Some(other) => other.to_string(),
        None => format!("Unable to contact slurm controller (connect failure): {e:#}"),
    }
}

/// Every job matching `query`, paged through the node (errors in Slurm's words).
pub async fn query_jobs(prog: &str, cluster: &Cluster, query: proto::JobQuery) -> Result<Vec<Job>, SlurmError> {
    cluster.query_jobs(query, PATIENCE).await.map_err(|e| SlurmError::fatal(prog, describe_error(&e)))
}

/// The job ids named by `N` or `N_T` arguments (the array's id for a task); none if one is not
/// a number (the caller then filters everything itself).
pub fn query_ids(jobs: &[String]) -> Option<Vec<JobId>> {
    jobs.iter().map(|j| j.split_once('_').map_or(j.as_str(), |(a, _)| a).parse().ok()).collect()
}

pub async fn list_nodes(prog: &str, cluster: &Cluster) -> Result<Vec<NodeInfo>, SlurmError> {
    match call(prog, cluster, ClientRequest::ListNodes).await? {
        Reply::Nodes(nodes) => Ok(nodes),
        other => Err(SlurmError::fatal(prog, format!("unexpected reply {other:?}"))),
    }
}

/// The replicated scheduling policy (partitions' defaults and time limits).
pub async fn get_policy(prog: &str, cluster: &Cluster) -> Result<proto::SchedulerPolicy, SlurmError> {
    match call(prog, cluster, ClientRequest::GetPolicy).await? {
        Reply::Policy(policy) => Ok(policy),
        other => Err(SlurmError::fatal(prog, format!("unexpected reply {other:?}"))),
    }
}

/// Node id to name.
pub fn node_names(nodes: &[NodeInfo]) -> BTreeMap<u64, String> {
    nodes.iter().map(|n| (n.id, n.name.clone())).collect()
}

/// Jobs that belong to submitted job `id`: the job itself and, for an array, its tasks.
pub fn members_of(jobs: &[Job], id: JobId) -> Vec<&Job> {
    jobs.iter().filter(|j| j.id == id || j.array.as_ref().is_some_and(|a| a.array_job == id)).collect()
}

/// Slurm's display id: `123`, or `100_7` for task 7 of array 100.
pub fn display_id(job: &Job) -> String {
    match &job.array {
        Some(a) => format!("{}_{}", a.array_job, a.task),
        None => job.id.to_string(),
    }
}

/// The exit code `sbatch --wait` and `srun` return for a finished job.
pub fn exit_code_of(job: &Job) -> i32 {
    match (job.state, job.exit_code) {
        (JobState::Completed, _) => 0,
        (_, Some(code)) if code != 0 => code.clamp(1, 255),
        _ => 1,
    }
}

/// Whether every node of the job's current run confirmed it started its part (a step sent to a
/// node before that finds no job there).
pub fn parts_started(job: &Job) -> bool {
    job.parts.iter().filter(|p| p.run == job.run).all(|p| p.launched_by.is_some())
}

/// Waits until the job `id` (and every task, for an array) is final; returns the worst exit
/// code among them.
pub async fn wait_for(prog: &str, cluster: &Cluster, id: JobId) -> Result<i32, SlurmError> {
    let query = proto::JobQuery { ids: vec![id], live: true, finished: true, history: true, brief: true, ..Default::default() };
    loop {
        let jobs = query_jobs(prog, cluster, query.clone()).await?;
        let members = members_of(&jobs, id);
        if !members.is_empty() && members.iter().all(|j| j.state.is_final()) {
            return Ok(members.iter().map(|j| exit_code_of(j)).max().unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The name of group `gid` (Slurm's `getgrgid`), `None` when the system has none.
pub fn group_name(gid: u32) -> Option<String> {
    // SAFETY: a zeroed `group` (null pointers, zero gid) is a valid value for getgrgid_r to fill.
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: getgrgid_r fills `group` with pointers into `buf`, which outlives their use here;
    // `result` is null or points at `group`.
    let rc = unsafe { libc::getgrgid_r(gid, &mut group, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() || group.gr_name.is_null() {
        return None;
    }
    // SAFETY: gr_name is a NUL-terminated string in `buf`.
    Some(unsafe { std::ffi::CStr::from_ptr(group.gr_name) }.to_string_lossy().into_owned())
}

/// The user running this command.
pub fn current_user() -> String {
    if let Ok(u) = std::env::var("USER") {
        if !u.is_empty() {
            return u;
        }
    }
    // SAFETY: getpwuid returns a pointer to static storage or null; we copy the name at once.
    unsafe {
        let pw = libc::getpwuid(libc::getuid());
        if !pw.is_null() && !(*pw).pw_name.is_null() {
            return std::ffi::CStr::from_ptr((*pw).pw_name).to_string_lossy().into_owned();
        }
    }
    "root".to_string()
}

/// This machine's host name.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we stop at the first NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return "localhost".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Prints Slurm's version line.
pub fn print_version() -> i32 {
    println!("slurm {SLURM_VERSION}");
    0
}

/// The allocation's variables, with Corral's own (`CORRAL_JOB_ID`, `CORRAL_NODE`,
/// `CORRAL_NODE_RANK`, `CORRAL_HOSTFILE`) standing in for `SLURM_*` ones the launcher did not
/// set, so `srun` and `scontrol` inside any Corral job know they are in an allocation.
pub fn allocation_env(env: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut out = env.clone();
    let mut fill = |k: &str, v: Option<String>| {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.entry(k.to_string()).or_insert(v);
        }
    };
    fill("SLURM_JOB_ID", env.get("CORRAL_JOB_ID").cloned());
    fill("SLURMD_NODENAME", env.get("CORRAL_NODE").cloned());
    fill("SLURM_NODEID", env.get("CORRAL_NODE_RANK").cloned());
    fill("SLURM_NNODES", env.get("CORRAL_NNODES").cloned());
    let hosts: Option<Vec<String>> = env
        .get("CORRAL_HOSTFILE")
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|text| text.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_string).collect());
    fill("SLURM_JOB_NODELIST", hosts.map(|h| hostlist::compress(&h)));
    out
}
