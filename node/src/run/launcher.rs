//! Preparing and stopping one job's run: its environment, files and launch spec (`prepare`), its
//! time limit, signals, suspension and the SIGTERM-grace-SIGKILL sequence. The process itself is
//! started by `process` (a run's in its shepherd, `shepherd`, and it dies with it; a step's task
//! by `corrald`, and it dies with it).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use proto::{Job, JobId, RunOutcome};

use crate::run::process::{ExitRecord, JobMounts, LaunchSpec, JOB_MOUNT};
use crate::run::shepherd::Shepherd;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Removes the checkpoint directory of a single-node run that completed (exit 0) if the job
/// left nothing in it: a sweep of trivial jobs otherwise leaves one empty directory per job
/// for ever. A directory with anything in it is the user's and stays; a later run of the job
/// makes the directory again.
pub fn tidy_checkpoint_dir(spec: &LaunchSpec, outcome: &RunOutcome) -> std::io::Result<bool> {
    let Some(dir) = spec.checkpoint_dir_tidy.as_deref().filter(|_| *outcome == RunOutcome::Exited(0)) else {
        return Ok(false);
    };
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::DirectoryNotEmpty) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Resolves an output file pattern (Slurm's `%j %J %A %a %x %u %N %n %t %%`) for the part on
/// node `node_index` of `node_names`, relative to the job's working directory.
pub fn output_path(pattern: &str, job: &Job, node_names: &[String], node_index: usize) -> PathBuf {
    let path = PathBuf::from(slurm_compat::env::output_path(pattern, job, node_names, node_index));
    if path.is_absolute() {
        path
    } else {
        Path::new(&job.spec.workdir).join(path)
    }
}

/// The files a job's stdout and stderr go to (the same file unless `error` is set).
pub fn output_paths(job: &Job, node_names: &[String], node_index: usize) -> (PathBuf, PathBuf) {
    let stdout = output_path(job.spec.output.as_deref().unwrap_or("corral-%j.out"), job, node_names, node_index);
    let stderr = match &job.spec.error {
        Some(p) => output_path(p, job, node_names, node_index),
        None => stdout.clone(),
    };
    (stdout, stderr)
}

/// NCCL settings derived from this node's hardware (or its config); a job's own env wins.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NcclEnv {
    pub socket_ifname: Option<String>,
    pub ib_hca: Option<String>,
    pub ib_disable: bool,
}

/// Where and with what this node runs its part of a job.
pub struct LaunchContext<'a> {
    /// The job's rendezvous store on this node (`HOST:PORT`, see `crate::rdzv`), if it has one.
    pub store: Option<&'a str>,
    pub node_name: &'a str,
    /// Index of this node among the run's nodes.
    pub node_rank: usize,
    /// Name and address of every node of the run, in rank order.
    pub nodes: &'a [(String, String)],
    pub gpu_indices: &'a [u32],
    pub gpu_uuids: &'a [String],
    pub jobs_dir: &'a Path,
    pub checkpoint_root: &'a Path,
    pub nccl: &'a NcclEnv,
    /// `SLURM_CLUSTER_NAME`.
    pub cluster_name: &'a str,
    pub run_as: Option<&'a crate::run::identity::Account>,
    /// What holds a batch job's node other than its first (`corrald --hold`).
    pub holder: &'a Path,
    /// This node's local socket (`CORRAL_SOCKET` in the job: `srun` starts steps through it).
    pub local_socket: Option<&'a Path>,
    /// The hosts file the job sees as `/etc/hosts` (`job_hosts_file`), if any.
    pub job_hosts: Option<&'a Path>,
    /// The `corral` binary the run's `/job/bin/pdsh` and `ssh` link to; set where runs get
    /// their job directory as [`JOB_MOUNT`] (corrald as root).
    pub job_commands: Option<&'a Path>,
}

/// The host part of `host:port` (`[v6]:port` too).
pub fn host_of(addr: &str) -> String {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest).to_string();
    }
    addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_string()
}

/// The directory of a job's script and hostfile under `jobs_dir`.
pub fn job_files_dir(jobs_dir: &Path, job: JobId) -> PathBuf {
    jobs_dir.join(job.to_string())
}

/// Builds the launch of this node's part of `job`'s current run: the program (a script written
/// under `jobs_dir`, or the job's argv), its environment, hostfile and checkpoint directory.
pub fn prepare(job: &Job, ctx: &LaunchContext<'_>) -> anyhow::Result<LaunchSpec> {
    let dir = create_job_dir(job.id, ctx)?;
    let hold = job.spec.is_batch() && ctx.node_rank > 0;
    let (program, args) = program_and_args(job, ctx, &dir, hold)?;
    let nproc_per_node = job.spec.gpus().max(job.spec.ntasks_per_node).max(1);
    let hostfile = write_hostfile(ctx, &dir, nproc_per_node)?;
    let checkpoint_dir = create_checkpoint_dir(job.id, ctx)?;

    // Hardware-derived defaults first, then the job's environment over them, then what only
    // Corral can know.
    let mut env = nccl_env(ctx.nccl);
    insert_rendezvous_env(&mut env, job, ctx, nproc_per_node);
    env.extend(job.spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    // What Slurm sets for a job overrides anything of that name in the submitter's environment.
    let node_names: Vec<String> = ctx.nodes.iter().map(|(name, _)| name.clone()).collect();
    env.extend(slurm_compat::env::slurm_env(job, &node_names, ctx.node_rank, ctx.cluster_name, ctx.gpu_indices));
    insert_corral_env(&mut env, job, ctx, &hostfile, &checkpoint_dir);
    let job_dir = match ctx.job_commands {
        Some(corral) => Some(link_job_commands(&dir, corral, &mut env)?),
        None => None,
    };
    let (stdout_path, stderr_path) = output_paths(job, &node_names, ctx.node_rank);
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
        signal: job.spec.signal.clone(),
        // Only rank 0 truncates, on the first run: every node of a gang writes the job's output.
        append: job.run > 1 || job.spec.open_append || ctx.node_rank > 0,
        run_as: ctx.run_as.cloned(),
        hold,
        batch: job.spec.is_batch(),
        mounts: JobMounts { hosts_file: ctx.job_hosts.map(Path::to_path_buf), job_dir },
        checkpoint_dir_tidy: (ctx.nodes.len() <= 1).then_some(checkpoint_dir),
    })
}

/// Creates the job's directory under `jobs_dir` (the job's user's alone, where it runs as one).
fn create_job_dir(job: JobId, ctx: &LaunchContext<'_>) -> anyhow::Result<PathBuf> {
    let dir = job_files_dir(ctx.jobs_dir, job);
    std::fs::create_dir_all(&dir).with_context(|| format!("create job directory {}", dir.display()))?;
    if let Some(a) = ctx.run_as {
        // The job reads its script and hostfile; nobody else may.
        std::os::unix::fs::chown(&dir, Some(a.uid), Some(a.gid)).with_context(|| format!("give {} to {}", dir.display(), a.name))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).with_context(|| format!("chmod {}", dir.display()))?;
    }
    Ok(dir)
}

/// What the run executes: the holder where it `hold`s a batch job's node, else the job's script
/// (written to `dir`, run by `/bin/sh` without a `#!` line) or its argv.
fn program_and_args(job: &Job, ctx: &LaunchContext<'_>, dir: &Path, hold: bool) -> anyhow::Result<(PathBuf, Vec<String>)> {
    Ok(match &job.spec.script {
        _ if hold => (ctx.holder.to_path_buf(), vec![HOLD_FLAG.to_string()]),
        Some(script) => {
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
    })
}

/// Links `pdsh` and `ssh` in `dir/bin` to `corral` (`cli/src/slurm/remote.rs`) and puts
/// `/job/bin` first on the run's `PATH`; returns `dir`, to be seen as [`JOB_MOUNT`].
fn link_job_commands(dir: &Path, corral: &Path, env: &mut BTreeMap<String, String>) -> anyhow::Result<PathBuf> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).with_context(|| format!("create {}", bin.display()))?;
    for name in ["pdsh", "ssh"] {
        let link = bin.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(corral) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(corral, &link).with_context(|| format!("link {} to {}", link.display(), corral.display()))?;
        }
    }
    let path = env.get("PATH").cloned().unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    env.insert("PATH".into(), format!("{JOB_MOUNT}/bin:{path}"));
    Ok(dir.to_path_buf())
}

/// Writes the run's hostfile to `dir` (each node with `nproc_per_node` slots) and returns its path.
fn write_hostfile(ctx: &LaunchContext<'_>, dir: &Path, nproc_per_node: u32) -> anyhow::Result<PathBuf> {
    let hostfile = dir.join("hostfile");
    let lines: String = ctx.nodes.iter().map(|(name, _)| format!("{name} slots={nproc_per_node}\n")).collect();
    std::fs::write(&hostfile, lines).with_context(|| format!("write hostfile {}", hostfile.display()))?;
    Ok(hostfile)
}

/// The job's checkpoint directory under `checkpoint_root`, created (the job's user's) if missing.
fn create_checkpoint_dir(job: JobId, ctx: &LaunchContext<'_>) -> anyhow::Result<PathBuf> {
    let checkpoint_dir = ctx.checkpoint_root.join(format!("job-{job}"));
    if !checkpoint_dir.exists() {
        std::fs::create_dir_all(&checkpoint_dir).with_context(|| format!("create checkpoint directory {}", checkpoint_dir.display()))?;
        if let Some(a) = ctx.run_as {
            std::os::unix::fs::chown(&checkpoint_dir, Some(a.uid), Some(a.gid))
                .with_context(|| format!("give {} to {}", checkpoint_dir.display(), a.name))?;
        }
    }
    Ok(checkpoint_dir)
}

/// The NCCL (and gloo) settings of this node's hardware: the first layer of a job's environment.
fn nccl_env(nccl: &NcclEnv) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    if let Some(ifname) = &nccl.socket_ifname {
        env.insert("NCCL_SOCKET_IFNAME".to_string(), ifname.clone());
        // torch.distributed's gloo backend (CPU tensors) picks its interface by this one.
        env.insert("GLOO_SOCKET_IFNAME".to_string(), ifname.clone());
    }
    if let Some(hca) = &nccl.ib_hca {
        env.insert("NCCL_IB_HCA".to_string(), hca.clone());
    }
    if nccl.ib_disable {
        env.insert("NCCL_IB_DISABLE".to_string(), "1".to_string());
    }
    env
}

/// Set for a gang with spare nodes: torchrun's workers get a store of their own each round.
pub const TORCH_UNSHARED_STORE_ENV: &str = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE";

/// Adds where the run's ranks meet (`MASTER_ADDR`, `MASTER_PORT`, torchrun's) and its shape
/// (`NNODES`, `NODE_RANK`, `NPROC_PER_NODE`, `WORLD_SIZE`) to `env`.
fn insert_rendezvous_env(env: &mut BTreeMap<String, String>, job: &Job, ctx: &LaunchContext<'_>, nproc_per_node: u32) {
    let nnodes = ctx.nodes.len().max(1);
    let master = ctx.nodes.first().map(|(_, addr)| host_of(addr)).unwrap_or_else(|| "127.0.0.1".into());
    if let Some(port) = job.master_port {
        env.insert("MASTER_PORT".into(), port.to_string());
        // A command run on every node (`corral submit -N2 -- torchrun ...`) rendezvouses on the
        // job's port; a batch job's steps get their own (`srun`, see the server's step launch).
        if !job.spec.is_batch() {
            env.extend(slurm_compat::env::torchrun_env(&master, port, nnodes));
        }
    }
    env.insert("MASTER_ADDR".into(), master);
    if let Some(endpoint) = job.spec.rdzv_endpoint() {
        // `--rdzv-endpoint`: torchrun's agents meet there, on no node of the job.
        env.insert("PET_RDZV_ENDPOINT".into(), endpoint.to_string());
    }
    if let Some(store) = ctx.store {
        // The job's store, served on every node of it: torchrun's defaults meet there with a
        // c10d rendezvous (its own flags win), as a client (the node serves the port).
        env.insert("CORRAL_RDZV_ENDPOINT".into(), store.to_string());
        env.insert("PET_RDZV_ENDPOINT".into(), store.to_string());
        env.insert("PET_RDZV_BACKEND".into(), "c10d".into());
        env.insert("PET_RDZV_CONF".into(), "is_host=0".into());
    }
    if job.spec.spare_nodes() > 0 {
        // A repaired rank's torchrun joins the survivors' rendezvous in a later round. Since 2.4
        // torchrun shares its rendezvous store with the workers, and an agent that was rank 0
        // before keeps that store without publishing its address in the new round, where the
        // joiner waits for it until the store times out (60 s) and the job fails. Without the
        // sharing, rank 0 publishes a fresh address every round, as torch did before 2.4.
        env.insert(TORCH_UNSHARED_STORE_ENV.into(), "1".into());
    }
    env.insert("NNODES".into(), nnodes.to_string());
    env.insert("NODE_RANK".into(), ctx.node_rank.to_string());
    env.insert("NPROC_PER_NODE".into(), nproc_per_node.to_string());
    env.insert("WORLD_SIZE".into(), (nnodes as u32 * nproc_per_node).to_string());
}

/// Adds what only Corral knows to `env`, over everything before: the run's GPUs, the job's and
/// node's identity (`CORRAL_*`), its hostfile and checkpoint directory, and its user's account.
fn insert_corral_env(env: &mut BTreeMap<String, String>, job: &Job, ctx: &LaunchContext<'_>, hostfile: &Path, checkpoint_dir: &Path) {
    let nnodes = ctx.nodes.len().max(1);
    let uuids = ctx.gpu_uuids.join(",");
    env.insert("CUDA_VISIBLE_DEVICES".into(), uuids.clone());
    env.insert("NVIDIA_VISIBLE_DEVICES".into(), uuids);
    env.insert("CORRAL_JOB_ID".into(), job.id.to_string());
    env.insert("CORRAL_JOB_NAME".into(), job.spec.name.clone());
    env.insert("CORRAL_NODE".into(), ctx.node_name.to_string());
    env.insert("CORRAL_RUN".into(), job.run.to_string());
    env.insert("CORRAL_RESTART_COUNT".into(), job.restart_count.to_string());
    env.insert("CORRAL_GPU_INDICES".into(), ctx.gpu_indices.iter().map(|g| g.to_string()).collect::<Vec<_>>().join(","));
    env.insert("CORRAL_NNODES".into(), nnodes.to_string());
    env.insert("CORRAL_NODE_RANK".into(), ctx.node_rank.to_string());
    if !job.spec.is_batch() && job.master_port.is_some() {
        env.insert("PET_NODE_RANK".into(), ctx.node_rank.to_string());
    }
    env.insert("CORRAL_HOSTFILE".into(), hostfile.display().to_string());
    env.insert("CORRAL_CHECKPOINT_DIR".into(), checkpoint_dir.display().to_string());
    if let Some(socket) = ctx.local_socket {
        env.insert("CORRAL_SOCKET".into(), socket.display().to_string());
    }
    if job.spec.is_batch() {
        env.insert(slurm_compat::env::BATCH_ENV.into(), "1".into());
    }
    if let Some(a) = ctx.run_as {
        env.insert("USER".into(), a.name.clone());
        env.insert("LOGNAME".into(), a.name.clone());
        env.insert("HOME".into(), a.home.clone());
    }
}

/// The flag that makes `corrald` a holder: a process that waits, ignoring every signal it can,
/// until it is killed. It keeps a batch job's other nodes' process group (and so the job's
/// lease, time limit and stop sequence) while only steps run there.
pub const HOLD_FLAG: &str = "--hold";

/// The holder's life (`corrald --hold`): ignore what can be ignored and wait to be killed.
pub fn hold_forever() -> ! {
    for sig in 1..32 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP && sig != libc::SIGCHLD {
            // SAFETY: setting a signal's disposition to "ignore" has no memory effects.
            unsafe { libc::signal(sig, libc::SIG_IGN) };
        }
    }
    loop {
        // SAFETY: pause(2) only waits for a signal.
        unsafe { libc::pause() };
    }
}

/// Why the agent stops a running job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Cancelled, or its gang failed: SIGTERM, grace, SIGKILL.
    Cancelled,
    /// Requeued: the job's `--signal` first and the time it asked for, then as cancelled.
    Checkpoint,
    /// This node lost the leader: stop fast, the job may be started elsewhere soon.
    Fenced,
    /// `corrald` is stopping (SIGTERM): SIGTERM, grace, SIGKILL; the run is lost to the node,
    /// so a `--requeue` job goes back to the queue at once.
    NodeStopping,
}

impl StopReason {
    /// How urgent a stop is: a more urgent request replaces a pending or running less urgent
    /// one (a fence during a checkpoint wait must not wait for the checkpoint), never the other
    /// way round (the leader re-sends a requeue's checkpoint stop every second).
    fn urgency(self) -> u8 {
        match self {
            StopReason::Checkpoint => 0,
            StopReason::Cancelled => 1,
            StopReason::NodeStopping => 2,
            StopReason::Fenced => 3,
        }
    }
}

/// Asks a run to stop. Keeps only the most urgent request so far, so it is never full and no
/// request is lost (a one-slot queue dropped a fence while a re-sent checkpoint stop sat in it).
#[derive(Clone, Debug)]
pub struct StopSender(watch::Sender<Option<StopReason>>);

/// The run's side: each [`StopReceiver::next`] is a request more urgent than the one before.
#[derive(Debug)]
pub struct StopReceiver(watch::Receiver<Option<StopReason>>);

pub fn stop_channel() -> (StopSender, StopReceiver) {
    let (tx, rx) = watch::channel(None);
    (StopSender(tx), StopReceiver(rx))
}

impl StopSender {
    /// Requests a stop; a request no more urgent than one already made changes nothing.
    pub fn request(&self, reason: StopReason) {
        self.0.send_if_modified(|current| {
            let more_urgent = current.is_none_or(|c| reason.urgency() > c.urgency());
            if more_urgent {
                *current = Some(reason);
            }
            more_urgent
        });
    }
}

impl StopReceiver {
    /// The next, more urgent, stop request; None once no sender is left.
    pub async fn next(&mut self) -> Option<StopReason> {
        self.0.changed().await.ok()?;
        *self.0.borrow_and_update()
    }
}

/// Longest wait for a job to write its checkpoint after its signal on a requeue.
const CHECKPOINT_WAIT_MS_MAX: u64 = 300_000;

pub(crate) fn signal_group(pgid: i32, signal: i32) {
    if pgid <= 1 {
        // kill(-0) and kill(-1) would reach this daemon's own group or every process.
        return;
    }
    // SAFETY: kill(2) on a process group we created; errors (ESRCH: already gone) are harmless.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc != 0 {
        debug!(pgid, signal, error = %std::io::Error::last_os_error(), "signal process group");
    }
}

/// Process groups of the step tasks a run started on this node (each task leads its own, so a
/// step can be signalled alone): signalled with the run's own group, and killed with it.
#[derive(Debug, Default)]
pub struct TaskGroups {
    /// Process group id and the start time of its leader (see `procfs::start_ticks`).
    groups: std::sync::Mutex<BTreeMap<i32, u64>>,
    /// Set, under the same lock, once the run ended: a task started since is killed at once.
    closed: std::sync::atomic::AtomicBool,
}

impl TaskGroups {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, u64>> {
        self.groups.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records a task's group; false (and the group is killed) when the run already ended, so
    /// a task started while its run stopped cannot outlive it.
    pub fn add(&self, pgid: i32, start_ticks: u64) -> bool {
        let mut groups = self.lock();
        if self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            signal_group(pgid, libc::SIGKILL);
            return false;
        }
        groups.insert(pgid, start_ticks);
        true
    }

    /// The run ended: `signal` every group, and refuse any added later.
    pub fn close(&self, signal: i32) {
        let groups = self.lock();
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        for pgid in groups.keys() {
            signal_group(*pgid, signal);
        }
    }

    /// Forgets the group once nothing is left in it (its leader may have left children).
    pub fn forget_if_empty(&self, pgid: i32) {
        if group_is_empty(pgid) {
            self.lock().remove(&pgid);
        }
    }

    /// Signals every group, forgetting those found empty first (an empty group's id may be
    /// reused by an unrelated process).
    pub fn signal(&self, signal: i32) {
        let mut groups = self.lock();
        groups.retain(|pgid, _| !group_is_empty(*pgid));
        for pgid in groups.keys() {
            signal_group(*pgid, signal);
        }
    }

    /// Signals group `pgid` if it is one of these and not known to be gone (never a recycled
    /// id: a group is forgotten only once empty).
    pub fn signal_one(&self, pgid: i32, signal: i32) {
        let mut groups = self.lock();
        if pgid > 0 && groups.contains_key(&pgid) {
            if group_is_empty(pgid) {
                groups.remove(&pgid);
            } else {
                signal_group(pgid, signal);
            }
        }
    }

    pub fn all_ended(&self) -> bool {
        self.lock().keys().all(|pgid| group_is_empty(*pgid))
    }

    /// The groups with their leaders' start times, for the watchdog's lease.
    pub fn snapshot(&self) -> Vec<(i32, u64)> {
        self.lock().iter().map(|(p, t)| (*p, *t)).collect()
    }
}

fn group_is_empty(pgid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the group exists.
    let rc = unsafe { libc::kill(-pgid, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Sends a signal for a job: with `batch_only` (`B:`, `scancel -b`) to the batch shell alone,
/// which a holder does not have; else to a batch job's steps (Slurm spares the script, except
/// from SIGKILL), or to all of any other job's processes.
pub fn signal_job(pgid: i32, signal: i32, batch_only: bool, spec_batch: bool, hold: bool, tasks: &TaskGroups) {
    if batch_only {
        if !hold && pgid > 0 {
            // SAFETY: kill(2) on the batch shell we started.
            unsafe { libc::kill(pgid, signal) };
        }
        return;
    }
    if !spec_batch || signal == libc::SIGKILL {
        signal_group(pgid, signal);
    }
    tasks.signal(signal);
}

fn send_job_signal(pgid: i32, sig: &proto::SignalSpec, spec: &LaunchSpec, tasks: &TaskGroups) {
    signal_job(pgid, sig.signal, sig.batch_only, spec.batch, spec.hold, tasks);
}

/// Waits at most `ms` until the run's process (not a holder: it never ends by itself) and every
/// step task ended; whether they did.
async fn wait_ended(child: &mut Shepherd, hold: bool, tasks: &TaskGroups, ms: u64) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
    if !hold && tokio::time::timeout_at(deadline, child.wait()).await.is_err() {
        return false;
    }
    loop {
        if tasks.all_ended() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(TASKS_POLL_MS)).await;
    }
}

/// How often a stop checks whether the step tasks are gone.
const TASKS_POLL_MS: u64 = 20;

/// Timings of the stop sequences.
#[derive(Clone, Copy, Debug)]
pub struct StopTimings {
    pub kill_grace_ms: u64,
    pub fence_kill_grace_ms: u64,
}

/// What the log says of a run's suspension (`scontrol suspend|resume`), as the leader tells
/// its nodes: whether its processes are stopped, and how long its ended suspensions lasted (its
/// time limit moves by as much).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pause {
    pub suspended: bool,
    pub paused_ms: u64,
    /// The run's suspend-or-resume count this pause carries out (`proto::Suspension::changes`).
    pub change: u32,
}

pub fn pause_channel() -> (watch::Sender<Pause>, watch::Receiver<Pause>) {
    watch::channel(Pause::default())
}

/// Stops (SIGSTOP) or continues (SIGCONT) every process of a run here: its group (not a
/// holder's: it runs nothing of the job) and its steps' tasks. Slurm's `scontrol suspend` does
/// the same; a job must stop on SIGSTOP and go on after SIGCONT.
pub fn pause_processes(pgid: i32, hold: bool, tasks: &TaskGroups, suspend: bool) {
    let signal = if suspend { libc::SIGSTOP } else { libc::SIGCONT };
    if !hold {
        signal_group(pgid, signal);
    }
    tasks.signal(signal);
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for the run to end, enforcing its time limit (with the early `--signal`), its
/// suspensions (`pause_rx`: the processes stopped, the limit paused and moved by the time they
/// were suspended) and stop requests, and returns how it ended. Whatever is left of the process
/// group is killed. `elapsed_ms`: how long the run has been running already (one adopted after
/// a restart), its suspensions included.
pub async fn supervise(
    mut child: Shepherd,
    spec: &LaunchSpec,
    mut stop_rx: StopReceiver,
    mut pause_rx: watch::Receiver<Pause>,
    timings: StopTimings,
    tasks: &TaskGroups,
    elapsed_ms: u64,
) -> RunOutcome {
    let pgid = child.pgid;
    let origin = tokio::time::Instant::now();
    // Deadlines on the run's own clock (ms since it started), moved by its suspensions.
    let limit_ms = spec.time_limit_ms;
    let warn = spec
        .time_limit_ms
        .zip(spec.signal.clone())
        .map(|(limit_ms, sig)| (limit_ms.saturating_sub(u64::from(sig.before_end_s) * 1000), sig))
        .filter(|(at_ms, _)| *at_ms >= elapsed_ms);
    let at = |run_ms: u64, paused_ms: u64| origin + Duration::from_millis(run_ms.saturating_add(paused_ms).saturating_sub(elapsed_ms));
    let hold = spec.hold;
    let mut warned = false;
    let mut pause = *pause_rx.borrow_and_update();
    if pause.suspended {
        pause_processes(pgid, hold, tasks, true);
    }
    let outcome = loop {
        let running = !pause.suspended;
        let limit_at = limit_ms.filter(|_| running).map(|ms| at(ms, pause.paused_ms));
        let warn_at = warn.as_ref().filter(|_| running && !warned).map(|(ms, _)| at(*ms, pause.paused_ms));
        tokio::select! {
            status = child.wait() => break match status {
                ExitRecord::Exited(code) => RunOutcome::Exited(code),
                ExitRecord::Signaled(sig) => RunOutcome::Signaled(sig),
                ExitRecord::Failed(why) => RunOutcome::Lost(why),
            },
            () = sleep_until(warn_at) => {
                warned = true;
                if let Some((_, sig)) = &warn {
                    info!(job = spec.job, signal = sig.signal, before_end_s = sig.before_end_s, "signalling job before its time limit");
                    send_job_signal(pgid, sig, spec, tasks);
                }
            }
            () = sleep_until(limit_at) => {
                warn!(job = spec.job, run = spec.run, "time limit reached, stopping job");
                stop(&mut child, pgid, timings.kill_grace_ms, hold, tasks).await;
                break RunOutcome::TimedOut;
            }
            Ok(()) = pause_rx.changed() => {
                let next = *pause_rx.borrow_and_update();
                if next.suspended != pause.suspended {
                    info!(job = spec.job, run = spec.run, suspended = next.suspended, "job suspended or resumed");
                    pause_processes(pgid, hold, tasks, next.suspended);
                }
                pause = next;
            }
            Some(reason) = stop_rx.next() => {
                if pause.suspended {
                    // A stopped process acts on no signal but SIGKILL: it goes on to stop.
                    pause_processes(pgid, hold, tasks, false);
                }
                // A checkpoint wait ends early on a more urgent stop, which then runs instead.
                let reason = match (reason, &spec.signal) {
                    (StopReason::Checkpoint, Some(sig)) => {
                        send_job_signal(pgid, sig, spec, tasks);
                        let wait_ms = (u64::from(sig.before_end_s) * 1000).min(CHECKPOINT_WAIT_MS_MAX);
                        let urgent = tokio::select! {
                            ended = wait_ended(&mut child, hold, tasks, wait_ms) => if ended { None } else { Some(StopReason::Cancelled) },
                            Some(urgent) = stop_rx.next() => Some(urgent),
                        };
                        match urgent {
                            Some(reason) => reason,
                            None => break RunOutcome::Killed,
                        }
                    }
                    (reason, _) => reason,
                };
                break stop_for(reason, &mut child, pgid, timings, hold, tasks).await;
            }
        }
    };
    // Whatever is left: of the run's group, and of its steps (a batch script that ended while
    // a step ran ends the step).
    signal_group(pgid, libc::SIGKILL);
    tasks.close(libc::SIGKILL);
    outcome
}

/// Stops a run for `reason` (a checkpoint without a `--signal`, or whose wait ran out, stops as
/// a cancel) and says how to report it.
async fn stop_for(reason: StopReason, child: &mut Shepherd, pgid: i32, timings: StopTimings, hold: bool, tasks: &TaskGroups) -> RunOutcome {
    match reason {
        StopReason::Cancelled | StopReason::Checkpoint => {
            stop(child, pgid, timings.kill_grace_ms, hold, tasks).await;
            RunOutcome::Killed
        }
        StopReason::NodeStopping => {
            stop(child, pgid, timings.kill_grace_ms, hold, tasks).await;
            RunOutcome::Lost("its node stopped (corrald shut down)".into())
        }
        StopReason::Fenced => {
            stop(child, pgid, timings.fence_kill_grace_ms, hold, tasks).await;
            // Not a cancel: the node lost the cluster, so the job is requeued or ends
            // NODE_FAIL like on a dead node.
            RunOutcome::Lost("stopped by fencing: the node lost contact with the leader".into())
        }
    }
}

/// What to report of a run that ended while no leader could hear from its node. Killed by a
/// signal, it may have been the watchdog fencing the node: reported lost, so the leader
/// requeues it or ends it NODE_FAIL. Anything else is how it really ended (an exit code is no
/// fencing kill) and is reported as it is: if the leader meanwhile declared the node down and
/// restarted or failed the job, the report names a part the leader no longer has and is
/// ignored; if not, the job ended as it did. (Reporting every such end as lost turned jobs
/// that exited 0 into NODE_FAIL, and would run a `--requeue` job that had completed again,
/// whenever a busy host delayed heartbeats past `fence_after_ms`.)
pub fn ended_out_of_touch(outcome: RunOutcome, node: &str) -> RunOutcome {
    match outcome {
        RunOutcome::Signaled(_) => RunOutcome::Lost(format!("ended while {node} was out of touch with the leader ({outcome:?})")),
        other => other,
    }
}

/// How a run ended, given the processes its cgroup's memory limit got killed (`oom_kills`): a
/// run that ended by itself after one is OUT_OF_MEMORY, as in Slurm, whatever its exit (a shell
/// often goes on after its child was killed). A run stopped for its time, a cancel or its node
/// keeps that outcome.
pub fn with_oom_kills(outcome: RunOutcome, oom_kills: u64, limit_mib: Option<u64>) -> RunOutcome {
    if oom_kills == 0 || !matches!(outcome, RunOutcome::Exited(_) | RunOutcome::Signaled(_)) {
        return outcome;
    }
    let processes = if oom_kills == 1 { "process" } else { "processes" };
    let limit = limit_mib.map(|m| format!(" of {m} MiB")).unwrap_or_default();
    RunOutcome::OutOfMemory(format!("the kernel killed {oom_kills} {processes} for the job's memory limit{limit} ({outcome:?})"))
}

/// SIGTERM to the run's group and its step tasks, the grace, then SIGKILL to all of them.
async fn stop(child: &mut Shepherd, pgid: i32, kill_grace_ms: u64, hold: bool, tasks: &TaskGroups) {
    signal_group(pgid, libc::SIGTERM);
    tasks.signal(libc::SIGTERM);
    if !wait_ended(child, hold, tasks, kill_grace_ms).await {
        debug!(pgid, "grace over: killing");
    }
    signal_group(pgid, libc::SIGKILL);
    tasks.signal(libc::SIGKILL);
    child.wait().await;
}

#[cfg(test)]
mod tests {
    use std::process::Stdio;

    use super::*;
    use crate::run::process::{command, Process};

    /// The leader re-sends a requeue's checkpoint stop every second while the job writes its
    /// checkpoint; a fence that comes meanwhile must reach the run at once (a one-slot queue
    /// holding a re-sent checkpoint stop dropped it, and only the watchdog was left).
    #[tokio::test]
    async fn a_fence_during_a_checkpoint_wait_is_never_lost_and_a_resent_checkpoint_changes_nothing() {
        let (tx, mut rx) = stop_channel();
        tx.request(StopReason::Checkpoint);
        assert_eq!(rx.next().await, Some(StopReason::Checkpoint));
        tx.request(StopReason::Checkpoint);
        tx.request(StopReason::Checkpoint);
        let quiet = tokio::time::timeout(Duration::from_millis(50), rx.next()).await;
        assert!(quiet.is_err(), "a re-sent checkpoint stop woke the run: {quiet:?}");
        tx.request(StopReason::Checkpoint);
        tx.request(StopReason::Fenced);
        tx.request(StopReason::Cancelled);
        assert_eq!(rx.next().await, Some(StopReason::Fenced));
        drop(tx);
        assert_eq!(rx.next().await, None);
    }

    #[test]
    fn only_a_signal_while_out_of_touch_is_reported_lost() {
        let lost = ended_out_of_touch(RunOutcome::Signaled(9), "n1");
        assert_eq!(lost, RunOutcome::Lost("ended while n1 was out of touch with the leader (Signaled(9))".into()));
        for kept in
            [RunOutcome::Exited(0), RunOutcome::Exited(3), RunOutcome::TimedOut, RunOutcome::Killed, RunOutcome::OutOfMemory("x".into())]
        {
            assert_eq!(ended_out_of_touch(kept.clone(), "n1"), kept);
        }
    }

    #[test]
    fn a_run_that_ended_after_an_oom_kill_is_out_of_memory_and_others_keep_their_outcome() {
        let oom = with_oom_kills(RunOutcome::Exited(0), 1, Some(32));
        assert_eq!(oom, RunOutcome::OutOfMemory("the kernel killed 1 process for the job's memory limit of 32 MiB (Exited(0))".into()));
        assert!(
            matches!(with_oom_kills(RunOutcome::Signaled(9), 2, None), RunOutcome::OutOfMemory(why) if why.starts_with("the kernel killed 2 processes for the job's memory limit ("))
        );
        for kept in [RunOutcome::TimedOut, RunOutcome::Killed, RunOutcome::Lost("fenced".into())] {
            assert_eq!(with_oom_kills(kept.clone(), 3, Some(32)), kept);
        }
        assert_eq!(with_oom_kills(RunOutcome::Exited(3), 0, Some(32)), RunOutcome::Exited(3));
    }

    #[test]
    fn a_task_group_added_after_its_run_closed_is_killed_at_once() {
        use std::os::unix::process::CommandExt;
        let groups = TaskGroups::default();
        let mut early = std::process::Command::new("sleep").arg("30").process_group(0).spawn().expect("start sleep");
        assert!(groups.add(early.id() as i32, 0));
        groups.close(libc::SIGKILL);
        let mut late = std::process::Command::new("sleep").arg("30").process_group(0).spawn().expect("start sleep");
        assert!(!groups.add(late.id() as i32, 0), "the run ended: refused");
        for child in [&mut early, &mut late] {
            let status = child.wait().expect("wait");
            assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
        }
    }

    /// Job 7's run on two nodes (rendezvous port 29_501), as node `rank` prepares it.
    fn prepared(batch: bool, rank: usize, hosts: Option<&Path>, env: &[(&str, &str)]) -> LaunchSpec {
        let dir = tempfile::tempdir().expect("temp dir");
        prepared_in(dir.path(), batch, rank, hosts, env, None)
    }

    fn prepared_in(dir: &Path, batch: bool, rank: usize, hosts: Option<&Path>, env: &[(&str, &str)], corral: Option<&Path>) -> LaunchSpec {
        let mut spec = proto::JobSpec::command(vec!["/bin/true".into()], "/tmp", "alice");
        spec.nodes = 2;
        spec.set_batch(batch);
        if batch {
            spec.script = Some("#!/bin/sh\ntrue\n".into());
        }
        spec.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        prepared_spec(dir, spec, rank, hosts, corral)
    }

    fn prepared_spec(dir: &Path, spec: proto::JobSpec, rank: usize, hosts: Option<&Path>, corral: Option<&Path>) -> LaunchSpec {
        let mut job = scheduler::testkit::Cluster::new().submit(7, spec, 1).jobs[&7].clone();
        job.run = 1;
        job.master_port = Some(29_501);
        let nodes = vec![("n1".to_string(), "10.0.0.1:7100".to_string()), ("n2".to_string(), "10.0.0.2:7100".to_string())];
        let nccl = NcclEnv { socket_ifname: Some("eth0".into()), ib_hca: None, ib_disable: true };
        let ctx = LaunchContext {
            store: None,
            node_name: &nodes[rank].0,
            node_rank: rank,
            nodes: &nodes,
            gpu_indices: &[],
            gpu_uuids: &[],
            jobs_dir: dir,
            checkpoint_root: dir,
            nccl: &nccl,
            cluster_name: "c",
            run_as: None,
            holder: Path::new("/bin/false"),
            local_socket: None,
            job_hosts: hosts,
            job_commands: corral,
        };
        prepare(&job, &ctx).expect("prepare")
    }

    #[test]
    fn a_completed_single_node_run_removes_its_checkpoint_directory_only_when_empty() {
        let mut spec = prepared(false, 0, None, &[]);
        assert_eq!(spec.checkpoint_dir_tidy, None, "a gang's peer may still write into a shared directory");
        let root = tempfile::tempdir().expect("temp dir");
        let dir = root.path().join("job-7");
        std::fs::create_dir(&dir).expect("make dir");
        spec.checkpoint_dir_tidy = Some(dir.clone());
        for failed in [RunOutcome::Exited(1), RunOutcome::Signaled(9), RunOutcome::Killed] {
            assert!(!tidy_checkpoint_dir(&spec, &failed).expect("tidy"), "{failed:?}: may be requeued and resume");
            assert!(dir.is_dir());
        }
        std::fs::write(dir.join("ckpt"), "step 5").expect("write ckpt");
        assert!(!tidy_checkpoint_dir(&spec, &RunOutcome::Exited(0)).expect("tidy"));
        assert!(dir.join("ckpt").exists(), "a checkpoint is the user's");
        std::fs::remove_file(dir.join("ckpt")).expect("remove ckpt");
        assert!(tidy_checkpoint_dir(&spec, &RunOutcome::Exited(0)).expect("tidy"));
        assert!(!dir.exists());
        assert!(!tidy_checkpoint_dir(&spec, &RunOutcome::Exited(0)).expect("tidy gone"), "already gone");
    }

    #[test]
    fn a_command_on_every_node_gets_torchruns_static_rendezvous() {
        for rank in 0..2 {
            let env = prepared(false, rank, None, &[]).env;
            let got: Vec<Option<&str>> = ["PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "GLOO_SOCKET_IFNAME"]
                .iter()
                .map(|k| env.get(*k).map(String::as_str))
                .collect();
            let rank = rank.to_string();
            assert_eq!(got, [Some("10.0.0.1"), Some("29501"), Some("2"), Some(rank.as_str()), Some("eth0")]);
        }
        // The job's own choice wins; its node rank is each node's own.
        let env = prepared(false, 1, None, &[("PET_MASTER_PORT", "4000"), ("PET_NODE_RANK", "0")]).env;
        assert_eq!((env["PET_MASTER_PORT"].as_str(), env["PET_NODE_RANK"].as_str()), ("4000", "1"));
        // A batch script gets none: its steps get their own (`srun torchrun`).
        let env = prepared(true, 0, None, &[]).env;
        assert!(!env.keys().any(|k| k.starts_with("PET_")), "{env:?}");
    }

    #[test]
    fn a_gang_with_spares_gives_torchruns_workers_a_store_per_round_unless_it_chose() {
        let dir = tempfile::tempdir().expect("temp dir");
        let gang = |spares: u32, env: &[(&str, &str)]| {
            let mut spec = proto::JobSpec::command(vec!["/bin/true".into()], "/tmp", "alice");
            spec.nodes = 2;
            spec.set_spare_nodes(spares);
            spec.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            prepared_spec(dir.path(), spec, 1, None, None).env.get(TORCH_UNSHARED_STORE_ENV).cloned()
        };
        assert_eq!(gang(0, &[]), None, "nothing rejoins a gang without spares: torch's default");
        assert_eq!(gang(1, &[]).as_deref(), Some("1"));
        assert_eq!(gang(1, &[(TORCH_UNSHARED_STORE_ENV, "0")]).as_deref(), Some("0"), "the job's own choice wins");
    }

    #[test]
    fn a_run_resolves_names_with_the_nodes_hosts_file() {
        let spec = prepared(false, 0, Some(Path::new("/c/hosts")), &[]);
        assert_eq!(spec.mounts.hosts_file.as_deref(), Some(Path::new("/c/hosts")));
        assert_eq!(prepared(false, 0, None, &[]).mounts, JobMounts::default(), "nothing to mount, no namespace");
        // As root, the process reads the file as /etc/hosts, and nothing changes outside.
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: the mount namespace needs root");
            return;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "127.0.0.1 localhost\n127.0.0.9 corral-test-node\n").expect("write hosts");
        let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        let args = ["hosts".to_string(), "corral-test-node".to_string()];
        let mounts = JobMounts { hosts_file: Some(hosts.clone()), job_dir: None };
        let proc = Process { program: Path::new("getent"), args: &args, env: &env, workdir: dir.path(), run_as: None, mounts: &mounts };
        let out = command(&proc, Vec::new(), Stdio::piped(), Stdio::piped(), false).output().expect("run getent");
        assert_eq!(String::from_utf8_lossy(&out.stdout).split_whitespace().collect::<Vec<_>>(), ["127.0.0.9", "corral-test-node"]);
        let outside = std::process::Command::new("getent").args(&args).output().expect("run getent");
        assert!(!outside.status.success(), "the host's /etc/hosts is unchanged");
    }

    #[test]
    fn a_run_sees_its_job_directory_as_job_with_pdsh_and_ssh_first_on_its_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let corral = Path::new("/opt/corral/bin/corral");
        let spec = prepared_in(dir.path(), true, 0, None, &[("PATH", "/usr/bin:/bin")], Some(corral));
        let job_dir = job_files_dir(dir.path(), 7);
        assert_eq!(spec.mounts.job_dir.as_deref(), Some(job_dir.as_path()));
        assert_eq!(spec.env["PATH"], "/job/bin:/usr/bin:/bin");
        for name in ["pdsh", "ssh"] {
            assert_eq!(std::fs::read_link(job_dir.join("bin").join(name)).ok().as_deref(), Some(corral), "{name}");
        }
        assert_eq!(prepared(true, 0, None, &[]).mounts.job_dir, None, "without the commands, no /job");
        // As root, the process reads the job's hostfile as /job/hostfile; the host's /job is
        // untouched.
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: the mount namespace needs root");
            return;
        }
        std::fs::create_dir_all(JOB_MOUNT).expect("create /job");
        let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
        let args = ["/job/hostfile".to_string()];
        let proc = Process { program: Path::new("cat"), args: &args, env: &env, workdir: dir.path(), run_as: None, mounts: &spec.mounts };
        let out = command(&proc, Vec::new(), Stdio::piped(), Stdio::piped(), false).output().expect("run cat");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "n1 slots=1\nn2 slots=1\n", "{}", String::from_utf8_lossy(&out.stderr));
        assert!(!Path::new("/job/hostfile").exists(), "the host's /job is unchanged");
    }

    #[test]
    fn host_of_strips_ports() {
        assert_eq!(host_of("10.0.0.1:7100"), "10.0.0.1");
        assert_eq!(host_of("[::1]:7100"), "::1");
        assert_eq!(host_of("gpu01:7100"), "gpu01");
        assert_eq!(host_of("gpu01"), "gpu01");
    }
}
