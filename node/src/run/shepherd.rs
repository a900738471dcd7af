//! The shepherd: one small process per run between `corrald` and the job (`corrald --shepherd
//! DIR`), so that a run can outlive the daemon that started it when that daemon hands it over
//! (a rolling upgrade), and never otherwise.
//!
//! A run's directory (`JOBS_DIR/runs/JOB.RUN/`) is its durable record on this node:
//! - `launch.json`, written when the launch is accepted: the run and the instance that took it;
//! - `spec.json`, written before the shepherd starts: what to start and how the agent
//!   supervises it ([`RunRecord`]);
//! - `sock`, the shepherd's Unix socket: each connection gets `PID START_TICKS`, then sends one
//!   request: `watch` (the supervisor's: answered `ended` once the job ended and its status is
//!   written, or closed when the shepherd is gone), `spawn JSON` (start a step task,
//!   [`TaskRequest`]) or `tail STEP OFFSET` (a step's log);
//! - `status.json`, written by the shepherd when the job ended ([`ExitRecord`]);
//! - `report.json`, written by the agent when it queues the run's report; the directory is
//!   removed once a leader has the report;
//! - `steps/STEP/`: the run's step tasks on this node, which the shepherd starts too (so they
//!   outlive a hand-over as well): `tasks` (how many run here) and `output`, an append-only log of
//!   frames (a task started, a chunk of its stdout or stderr, its exit) that the shepherd writes
//!   from the tasks' pipes and that a supervisor tails (`tail STEP OFFSET` on the socket), from
//!   the start after a hand-over. The agent removes it once `srun` has read it to its end.
//!
//! The shepherd is the job's parent (the job's parent-death signal is tied to it). It stays only
//! while a `corrald` of its instance is alive, or while that instance is being handed over and
//! the hand-over's deadline (the lease's, see `watchdog`) has not passed: it reads the daemon
//! record (`JOBS_DIR/daemon.json`, [`DaemonRecord`]) whenever the process it trusts is gone.
//! Otherwise it SIGKILLs the job's process group and cgroup within [`POLL_MS`], records how the
//! job ended, and exits.

use std::io::{BufRead, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::Context;
use proto::{InstanceId, JobId, RunNo};
use serde::{Deserialize, Serialize};

use crate::run::daemon_record::{verdict, Verdict};
use crate::run::process::{ExitRecord, LaunchSpec};
use crate::run::procfs::{boot_ms, process_alive, start_ticks};

/// The flag that makes `corrald` a shepherd.
pub const SHEPHERD_FLAG: &str = "--shepherd";
/// How often a shepherd checks that the daemon it trusts is alive.
pub const POLL_MS: u64 = 100;
/// Version of the files of a run directory; a shepherd refuses a record of another format.
pub const RECORD_FORMAT: u32 = 1;
pub use crate::run::json_file::{read_json, read_json_max, write_json, RECORD_BYTES_MAX};
/// How long a supervisor waits for a shepherd to say it started the job.
const START_WAIT_MS: u64 = 30_000;
/// Connections a shepherd serves at once (each has a thread); more are refused.
const CONNECTION_THREADS_MAX: usize = 256;
/// The longest request line a shepherd reads.
const REQUEST_BYTES_MAX: u64 = 1 << 20;
/// Bytes read from a task's pipe at a time (one frame at most).
const PIPE_READ_BYTES: usize = 64 * 1024;
/// Frame kinds in a step's output log: `[kind u8][rank u32 LE][len u32 LE][data]`.
pub const FRAME_STDOUT: u8 = 0;
pub const FRAME_STDERR: u8 = 1;
/// Data: exit code (i32 LE, `i32::MIN` for none) and signal (i32 LE, 0 for none).
pub const FRAME_EXIT: u8 = 2;
/// Data: the task's pid (i32 LE) and start time (u64 LE): its process group.
pub const FRAME_STARTED: u8 = 3;
/// Header bytes of a frame.
pub const FRAME_HEADER_BYTES: usize = 9;
/// The largest frame body.
pub const FRAME_DATA_BYTES_MAX: u32 = PIPE_READ_BYTES as u32;

/// One task of a step, as the agent asks the run's shepherd to start it (`spawn JSON`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskRequest {
    pub step: u32,
    pub rank: u32,
    /// Tasks of this step on this node.
    pub tasks: u32,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub workdir: PathBuf,
    pub run_as: Option<crate::run::identity::Account>,
    /// This node's name, for Slurm's error line when the task cannot start.
    pub node: String,
    /// What the task sees in a mount namespace of its own (its run's).
    #[serde(flatten)]
    pub mounts: crate::run::process::JobMounts,
    /// Its stdin is a pipe the agent feeds (`input STEP RANK`), not `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// `srun --pty`: it runs on a pseudo-terminal of this size (see [`crate::run::pty`]), whose
    /// master takes its stdin (with `stdin`) and gives its output, as stdout.
    #[serde(default)]
    pub pty: Option<proto::PtySize>,
    /// The step's own cgroups (below the run's, v2 first), which it joins instead of the
    /// run's; none: the run's.
    #[serde(default)]
    pub cgroups: Option<Vec<PathBuf>>,
}

/// Encodes one frame of a step's output log.
pub fn frame(kind: u8, rank: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER_BYTES + data.len());
    out.push(kind);
    out.extend_from_slice(&rank.to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// The directory of step `step` of the run in `dir`.
pub fn step_dir(dir: &Path, step: u32) -> PathBuf {
    dir.join("steps").join(step.to_string())
}

/// Where a run's directory is.
pub fn run_dir(runs_dir: &Path, job: JobId, run: RunNo) -> PathBuf {
    runs_dir.join(format!("{job}.{run}"))
}

/// What a run's directory says about whom it belongs to (`launch.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRecord {
    pub format: u32,
    pub job: JobId,
    pub run: RunNo,
    pub instance: InstanceId,
}

/// What the shepherd starts, and what a later `corrald` needs to supervise it (`spec.json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    pub format: u32,
    pub instance: InstanceId,
    pub launch: LaunchSpec,
    /// The run's cgroup: the job joins it, and it is killed with the job.
    pub cgroup: Option<PathBuf>,
    /// Its cgroups in the v1 hierarchies used (limits v2 lacks here, device fencing).
    #[serde(default)]
    pub cgroups_v1: Vec<PathBuf>,
    /// The daemon record the shepherd consults (`JOBS_DIR/daemon.json`).
    pub daemon_file: PathBuf,
    /// The user the job belongs to.
    pub owner: String,
    /// Name and address of every node of the run, in rank order.
    pub nodes: Vec<(String, String)>,
    /// GPU indices the run holds here.
    pub gpus: Vec<u32>,
    /// Its `Allocation::gpus` (MIG instances by slot); empty in older records: read as `gpus`.
    #[serde(default)]
    pub slots: Vec<u32>,
    /// When the shepherd was started, on the boot clock: the time limit counts from here.
    pub started_boot_ms: u64,
}

fn kill_job(pid: i32, cgroups: &[PathBuf]) {
    if pid > 1 {
        // SAFETY: kill(2) on the process group of our own child, not yet reaped (so not recycled).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    for cgroup in cgroups {
        crate::run::cgroup::kill_cgroup(cgroup);
    }
}

/// The shepherd process (`corrald --shepherd DIR`): starts the job `DIR/spec.json` describes,
/// says `started PID START_TICKS` (or `failed WHY`) on stdout, serves `DIR/sock`, records how
/// the job ended in `DIR/status.json`, and exits.
pub fn run(dir: &Path) -> anyhow::Result<()> {
    run_trusting(dir, std::os::unix::process::parent_id() as i32)
}

/// The shepherd's work, trusting `daemon` (the `corrald` that asked for it) while it lives:
/// [`run`] for an exec'd shepherd (its parent), or a shepherd forked by the spawner (the
/// spawner's parent, see `spawner`).
pub fn run_trusting(dir: &Path, daemon: i32) -> anyhow::Result<()> {
    ignore_signals();
    let trusted = (daemon, start_ticks(daemon).unwrap_or(0));
    let status_path = dir.join("status.json");
    let fail = |why: String| -> anyhow::Result<()> {
        write_json(&status_path, &ExitRecord::Failed(why.clone()))?;
        println!("failed {}", why.replace('\n', " "));
        Ok(())
    };
    let record = match read_run_record(dir) {
        Ok(r) => r,
        Err(why) => return fail(why),
    };
    let listener = match bind_socket(dir) {
        Ok(l) => l,
        Err(why) => return fail(why),
    };
    let cgroups: Vec<PathBuf> = record.cgroup.iter().chain(record.cgroups_v1.iter()).cloned().collect();
    let mut child = match crate::run::process::start_run_process(&record.launch, &cgroups) {
        Ok(c) => c,
        Err(e) => return fail(format!("{e:#}")),
    };
    let pid = child.id() as i32;
    let ticks = start_ticks(pid).unwrap_or(0);
    println!("started {pid} {ticks}");
    let _ = std::io::stdout().flush();

    let shared = Arc::new(Shared {
        dir: dir.to_path_buf(),
        steps: Mutex::new(std::collections::BTreeMap::new()),
        hello: format!("{pid} {ticks}\n"),
        watchers: Mutex::new(Vec::new()),
        ended: std::sync::atomic::AtomicBool::new(false),
    });
    let spawn_tx = spawn_task_thread(&shared, cgroups.clone());
    serve_connections(&shared, listener, spawn_tx);
    watch_daemon(&shared, trusted, record.daemon_file.clone(), record.instance, pid, cgroups);
    let exit = wait_for_exit(&mut child);
    write_json(&status_path, &exit)?;
    shared.job_ended();
    // The supervisor stops what is left (its stop sequence: SIGTERM, grace, SIGKILL) and the
    // step tasks' ends complete their logs; past the wait, or with nobody to do it, they are
    // killed here. Exiting closes every connection.
    shared.wait_steps_complete(Duration::from_millis(STEPS_COMPLETE_WAIT_MS));
    shared.kill_tasks();
    shared.wait_steps_complete(Duration::from_millis(STEPS_KILLED_WAIT_MS));
    // Whatever the job left in its group goes with it, as when corrald supervised it directly.
    // SAFETY: kill(2) on the job's process group; its leader is reaped, the group id is ours
    // until every member is gone.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    Ok(())
}

/// Ignores hang-up, interrupt, termination, quit, user and broken-pipe signals. Its own session
/// already (the agent's setsid): only signals sent to it by pid arrive.
fn ignore_signals() {
    for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGPIPE] {
        // SAFETY: setting a disposition to "ignore" has no memory effects.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
}

/// The run record `DIR/spec.json`, or why the shepherd cannot start its job (missing,
/// unreadable, or of another format).
fn read_run_record(dir: &Path) -> Result<RunRecord, String> {
    let record: RunRecord = match read_json(&dir.join("spec.json")) {
        Ok(Some(r)) => r,
        Ok(None) => return Err(format!("no spec.json in {}", dir.display())),
        Err(e) => return Err(format!("{e:#}")),
    };
    if record.format != RECORD_FORMAT {
        return Err(format!("run record format {} (this shepherd reads {RECORD_FORMAT})", record.format));
    }
    Ok(record)
}

/// Binds the shepherd's socket `DIR/sock` afresh (a stale one removed), or says why it cannot.
fn bind_socket(dir: &Path) -> Result<std::os::unix::net::UnixListener, String> {
    let sock_path = dir.join("sock");
    let _ = std::fs::remove_file(&sock_path);
    std::os::unix::net::UnixListener::bind(&sock_path).map_err(|e| format!("bind {}: {e}", sock_path.display()))
}

/// A connection's way to ask for a step task: the request and where to send the answer.
type SpawnSender = std::sync::mpsc::SyncSender<(TaskRequest, std::sync::mpsc::SyncSender<String>)>;

/// Starts the thread that forks step tasks (into `cgroups`), which lives as long as the
/// shepherd: a parent-death signal follows the thread that forked. Returns where to ask it.
fn spawn_task_thread(shared: &Arc<Shared>, cgroups: Vec<PathBuf>) -> SpawnSender {
    let (spawn_tx, spawn_rx) = std::sync::mpsc::sync_channel::<(TaskRequest, std::sync::mpsc::SyncSender<String>)>(64);
    let shared = Arc::clone(shared);
    std::thread::spawn(move || {
        for (request, reply) in spawn_rx {
            let answer = shared.start_task(&request, &cgroups);
            let _ = reply.send(answer);
        }
    });
    spawn_tx
}

/// Starts the thread that accepts connections on `listener`, each served on a thread of its
/// own (at most [`CONNECTION_THREADS_MAX`] at once; past that a connection is dropped).
fn serve_connections(shared: &Arc<Shared>, listener: std::os::unix::net::UnixListener, spawn_tx: SpawnSender) {
    let shared = Arc::clone(shared);
    std::thread::spawn(move || {
        let threads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for conn in listener.incoming().flatten() {
            if threads.load(std::sync::atomic::Ordering::SeqCst) >= CONNECTION_THREADS_MAX {
                continue;
            }
            threads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (shared, threads, spawn_tx) = (Arc::clone(&shared), Arc::clone(&threads), spawn_tx.clone());
            std::thread::spawn(move || {
                shared.serve(conn, &spawn_tx);
                threads.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
}

/// Starts the thread that checks every [`POLL_MS`] that the `trusted` daemon (pid, start ticks)
/// lives; once it is gone, the daemon record (`daemon_file`, for `instance`) names the next one
/// to trust, says to wait, or has it kill the job `pid` (its step tasks and `cgroups` too).
fn watch_daemon(shared: &Arc<Shared>, trusted: (i32, u64), daemon_file: PathBuf, instance: InstanceId, pid: i32, cgroups: Vec<PathBuf>) {
    let shared = Arc::clone(shared);
    std::thread::spawn(move || {
        let mut trusted = trusted;
        loop {
            std::thread::sleep(Duration::from_millis(POLL_MS));
            if process_alive(trusted.0, trusted.1) {
                continue;
            }
            match verdict(&daemon_file, instance, boot_ms()) {
                Verdict::Trust(d) => trusted = (d.pid, d.start_ticks),
                Verdict::Wait => {}
                Verdict::Kill(why) => {
                    tracing::warn!(pid, reason = %why, "shepherd: killing its job");
                    shared.kill_tasks();
                    kill_job(pid, &cgroups);
                    return;
                }
            }
        }
    });
}

/// Waits for the job to end and says how it did.
fn wait_for_exit(child: &mut std::process::Child) -> ExitRecord {
    match child.wait() {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => ExitRecord::Exited(code),
                (None, Some(sig)) => ExitRecord::Signaled(sig),
                (None, None) => ExitRecord::Exited(-1),
            }
        }
        Err(e) => ExitRecord::Failed(format!("wait for the job: {e}")),
    }
}

/// How long a shepherd whose job ended waits for its supervisor to stop the step tasks left
/// (its stop sequence is at most `kill_grace_ms`), before it kills them itself.
const STEPS_COMPLETE_WAIT_MS: u64 = 120_000;
/// How long it then waits for the killed tasks' logs to be complete.
const STEPS_KILLED_WAIT_MS: u64 = 2_000;

/// What a shepherd's threads share.
struct Shared {
    dir: PathBuf,
    steps: Mutex<std::collections::BTreeMap<u32, Arc<StepLog>>>,
    hello: String,
    /// Supervisors' connections (`watch`), told `ended` when the job ended.
    watchers: Mutex<Vec<std::os::unix::net::UnixStream>>,
    /// The job ended and its status is written.
    ended: std::sync::atomic::AtomicBool,
}

/// One step's output log, as its shepherd writes it.
struct StepLog {
    path: PathBuf,
    state: Mutex<StepLogState>,
    grew: Condvar,
}

struct StepLogState {
    file: std::fs::File,
    len: u64,
    tasks: u32,
    exits: u32,
    /// Process groups of its tasks.
    pgids: Vec<i32>,
    /// Stdin pipes (or pseudo-terminal masters) of its tasks that read one, until an `input`
    /// connection takes each.
    inputs: std::collections::BTreeMap<u32, std::fs::File>,
    /// Pseudo-terminal masters of its tasks on one, until they exit (`winsize` resizes them).
    ptys: std::collections::BTreeMap<u32, std::fs::File>,
}

impl StepLogState {
    fn complete(&self) -> bool {
        self.exits >= self.tasks
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl StepLog {
    /// Appends one frame (whole, under the lock) and wakes the tails.
    fn append(&self, kind: u8, rank: u32, data: &[u8]) {
        let bytes = frame(kind, rank, data);
        let mut st = lock(&self.state);
        match st.file.write_all(&bytes) {
            Ok(()) => st.len += bytes.len() as u64,
            Err(e) => tracing::warn!(path = %self.path.display(), error = %e, "shepherd: append to step log"),
        }
        if kind == FRAME_EXIT {
            st.exits += 1;
        }
        drop(st);
        self.grew.notify_all();
    }

    fn exit(&self, rank: u32, code: Option<i32>, signal: Option<i32>) {
        let mut data = code.unwrap_or(i32::MIN).to_le_bytes().to_vec();
        data.extend_from_slice(&signal.unwrap_or(0).to_le_bytes());
        self.append(FRAME_EXIT, rank, &data);
    }
}

impl Shared {
    /// One connection: the hello line, then at most one request (`spawn JSON`, `tail STEP
    /// OFFSET`); a connection that sends none is held open until the shepherd exits.
    fn serve(
        &self,
        conn: std::os::unix::net::UnixStream,
        spawn_tx: &std::sync::mpsc::SyncSender<(TaskRequest, std::sync::mpsc::SyncSender<String>)>,
    ) {
        let mut writer = match conn.try_clone() {
            Ok(w) => w,
            Err(_) => return,
        };
        if writer.write_all(self.hello.as_bytes()).is_err() {
            return;
        }
        let mut line = String::new();
        let mut reader = std::io::BufReader::new((&conn).take(REQUEST_BYTES_MAX));
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line == "watch" {
            let mut watchers = lock(&self.watchers);
            if self.ended.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = writer.write_all(b"ended\n");
            } else if watchers.len() < CONNECTION_THREADS_MAX {
                // Held open until told or until the shepherd exits.
                watchers.push(writer);
            }
        } else if let Some(json) = line.strip_prefix("spawn ") {
            let answer = match serde_json::from_str::<TaskRequest>(json) {
                Ok(request) => {
                    let (reply_tx, reply_rx) = std::sync::mpsc::sync_channel(1);
                    match spawn_tx.send((request, reply_tx)) {
                        Ok(()) => reply_rx.recv().unwrap_or_else(|_| "err the shepherd's spawner is gone".into()),
                        Err(_) => "err the shepherd's spawner is gone".into(),
                    }
                }
                Err(e) => format!("err bad task request: {e}"),
            };
            let _ = writer.write_all(format!("{answer}\n").as_bytes());
        } else if let Some(args) = line.strip_prefix("input ") {
            let mut words = args.split_whitespace();
            let (Some(step), Some(rank)) = (words.next().and_then(|w| w.parse().ok()), words.next().and_then(|w| w.parse().ok())) else {
                return;
            };
            let early = reader.buffer().to_vec();
            self.feed_input(step, rank, &early, &conn);
        } else if let Some(args) = line.strip_prefix("winsize ") {
            let answer = match parse_winsize(args) {
                Some((step, rank, size)) => self.resize(step, rank, size),
                None => format!("err bad winsize request: {args}"),
            };
            let _ = writer.write_all(format!("{answer}\n").as_bytes());
        } else if let Some(args) = line.strip_prefix("tail ") {
            let mut words = args.split_whitespace();
            let (Some(step), Some(offset)) = (words.next().and_then(|w| w.parse().ok()), words.next().and_then(|w| w.parse().ok())) else {
                return;
            };
            self.tail(step, offset, &mut writer);
        }
    }

    /// Copies what comes on `conn` (after `early`, read with the request line) to the stdin of
    /// task `rank` of step `step`, until the agent closes it (then the task reads EOF) or the
    /// task closes its end. One connection takes a task's stdin: a second finds none.
    fn feed_input(&self, step: u32, rank: u32, early: &[u8], mut conn: &std::os::unix::net::UnixStream) {
        let Some(log) = lock(&self.steps).get(&step).cloned() else { return };
        let Some(mut stdin) = lock(&log.state).inputs.remove(&rank) else { return };
        if stdin.write_all(early).is_ok() {
            // An error is the task closing its stdin (EPIPE) or the agent going: either ends it.
            let _ = std::io::copy(&mut conn, &mut stdin);
        }
    }

    /// Gives task `rank` of step `step`'s pseudo-terminal the size `size`: `ok`, or `err WHY`.
    fn resize(&self, step: u32, rank: u32, size: proto::PtySize) -> String {
        let Some(log) = lock(&self.steps).get(&step).cloned() else { return format!("err no step {step}") };
        let st = lock(&log.state);
        let Some(master) = st.ptys.get(&rank) else { return format!("err task {rank} of step {step} has no terminal") };
        match crate::run::pty::resize(master, size) {
            Ok(()) => "ok".into(),
            Err(e) => format!("err resize the terminal: {e}"),
        }
    }

    /// The log of step `step`, made when its first task is asked for.
    fn step_log(&self, step: u32, tasks: u32) -> anyhow::Result<Arc<StepLog>> {
        let mut steps = lock(&self.steps);
        if let Some(log) = steps.get(&step) {
            return Ok(Arc::clone(log));
        }
        let dir = step_dir(&self.dir, step);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        std::fs::write(dir.join("tasks"), tasks.to_string()).with_context(|| format!("write {}/tasks", dir.display()))?;
        let path = dir.join("output");
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).with_context(|| format!("open {}", path.display()))?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let log = Arc::new(StepLog {
            path,
            state: Mutex::new(StepLogState {
                file,
                len,
                tasks,
                exits: 0,
                pgids: Vec::new(),
                inputs: Default::default(),
                ptys: Default::default(),
            }),
            grew: Condvar::new(),
        });
        steps.insert(step, Arc::clone(&log));
        Ok(log)
    }

    /// Starts one task (on the spawner thread): its pipes go into the step's log, and its exit
    /// after them. Answers `ok PID TICKS`, or `err WHY` when the step's log cannot be made (a
    /// task that cannot start is recorded in the log, as Slurm reports it, and answered `ok 0 0`).
    fn start_task(&self, request: &TaskRequest, cgroups: &[PathBuf]) -> String {
        let log = match self.step_log(request.step, request.tasks) {
            Ok(l) => l,
            Err(e) => return format!("err {}", format!("{e:#}").replace('\n', " ")),
        };
        // A cgroup gone (the run is ending) fails the join, and so the task: it never runs
        // outside its run's cgroups (their limits and the fencing kill would miss it).
        let cgroups = match &request.cgroups {
            // Never outside the run's: a step's cgroups are below them, one in each.
            Some(own) if own.len() == cgroups.len() && own.iter().zip(cgroups).all(|(o, run)| o.starts_with(run) && o != run) => {
                own.as_slice()
            }
            _ => cgroups,
        };
        let procs = match open_cgroup_procs(cgroups) {
            Ok(procs) => procs,
            Err((why, errno)) => {
                // As an exec failure: the error on the task's stderr, errno as its exit code.
                let line = format!("slurmstepd-{}: error: {}: {why}\n", request.node, request.program.display());
                log.append(FRAME_STDERR, request.rank, line.as_bytes());
                log.exit(request.rank, Some(errno), None);
                return "ok 0 0".into();
            }
        };
        let procs_fds: Vec<i32> = procs.iter().map(std::os::fd::AsRawFd::as_raw_fd).collect();
        let proc = crate::run::process::Process {
            program: &request.program,
            args: &request.args,
            env: &request.env,
            workdir: &request.workdir,
            run_as: request.run_as.as_ref(),
            mounts: &request.mounts,
        };
        let rank = request.rank;
        // As an exec failure: the error on the task's stderr, errno as its exit code.
        let failed = |what: &str, e: std::io::Error| {
            let why = e.to_string().split(" (os error").next().unwrap_or_default().to_string();
            let line = format!("slurmstepd-{}: error: {what}: {}: {why}\n", request.node, request.program.display());
            log.append(FRAME_STDERR, rank, line.as_bytes());
            log.exit(rank, Some(e.raw_os_error().unwrap_or(1)), None);
            "ok 0 0".to_string()
        };
        let pty = match request.pty.map(|size| crate::run::pty::open(size, request.run_as.as_ref().map(|a| a.uid))).transpose() {
            Ok(pty) => pty,
            Err(e) => return failed("openpty()", e),
        };
        let command = crate::run::process::task_command(&proc, procs_fds, pty.as_ref().map(|(_, slave)| slave));
        let mut command = match command {
            Ok(c) => c,
            Err(e) => return failed("dup()", e),
        };
        if request.stdin && pty.is_none() {
            command.stdin(std::process::Stdio::piped());
        }
        let spawned = command.spawn();
        // The slave's copies in `command` close here: only the task holds the terminal, so the
        // master reads EIO once the task and its children are gone.
        drop(command);
        let mut child = match spawned {
            Ok(c) => c,
            // As slurmstepd.
            Err(e) => return failed("execve()", e),
        };
        let pid = child.id() as i32;
        let ticks = start_ticks(pid).unwrap_or(0);
        let mut started = pid.to_le_bytes().to_vec();
        started.extend_from_slice(&ticks.to_le_bytes());
        let mut terminal = None;
        {
            let mut state = lock(&log.state);
            state.pgids.push(pid);
            if let Some(stdin) = child.stdin.take() {
                state.inputs.insert(rank, std::fs::File::from(std::os::fd::OwnedFd::from(stdin)));
            }
            if let Some((master, _)) = pty {
                // Failed clones leave the task without input or resizes, never without output.
                if request.stdin {
                    if let Ok(input) = master.try_clone() {
                        state.inputs.insert(rank, input);
                    }
                }
                if let Ok(sizer) = master.try_clone() {
                    state.ptys.insert(rank, sizer);
                }
                terminal = Some(master);
            }
        }
        log.append(FRAME_STARTED, rank, &started);
        follow_task(log, rank, child, terminal);
        format!("ok {pid} {ticks}")
    }

    /// Streams step `step`'s log from `offset` to `out` as it grows, until it is complete and
    /// all sent (or the reader goes away).
    fn tail(&self, step: u32, offset: u64, out: &mut std::os::unix::net::UnixStream) {
        let log = {
            let steps = lock(&self.steps);
            match steps.get(&step) {
                Some(l) => Arc::clone(l),
                None => return,
            }
        };
        let Ok(mut file) = std::fs::File::open(&log.path) else { return };
        if file.seek(std::io::SeekFrom::Start(offset)).is_err() {
            return;
        }
        let mut pos = offset;
        let mut buf = vec![0u8; PIPE_READ_BYTES + FRAME_HEADER_BYTES];
        loop {
            let len = {
                let st = lock(&log.state);
                if pos >= st.len {
                    if st.complete() {
                        return;
                    }
                    let (st, _) = log.grew.wait_timeout(st, Duration::from_secs(1)).unwrap_or_else(|p| p.into_inner());
                    st.len
                } else {
                    st.len
                }
            };
            while pos < len {
                let want = ((len - pos) as usize).min(buf.len());
                match file.read(&mut buf[..want]) {
                    Ok(0) => break,
                    Ok(n) => {
                        if out.write_all(&buf[..n]).is_err() {
                            return;
                        }
                        pos += n as u64;
                    }
                    Err(_) => return,
                }
            }
        }
    }

    /// The job ended and its status is written: tell the supervisors.
    fn job_ended(&self) {
        let mut watchers = lock(&self.watchers);
        self.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        for w in watchers.iter_mut() {
            let _ = w.write_all(b"ended\n");
        }
        watchers.clear();
    }

    /// SIGKILLs every step task's process group.
    fn kill_tasks(&self) {
        for log in lock(&self.steps).values() {
            for pgid in &lock(&log.state).pgids {
                if *pgid > 1 {
                    // SAFETY: kill(2) on the group of a task this shepherd started.
                    unsafe { libc::kill(-*pgid, libc::SIGKILL) };
                }
            }
        }
    }

    fn wait_steps_complete(&self, patience: Duration) {
        let deadline = std::time::Instant::now() + patience;
        let logs: Vec<Arc<StepLog>> = lock(&self.steps).values().cloned().collect();
        for log in logs {
            let mut st = lock(&log.state);
            while !st.complete() {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                st = log.grew.wait_timeout(st, left).unwrap_or_else(|p| p.into_inner()).0;
            }
        }
    }
}

/// A supervisor's handle on a run's shepherd.
pub struct Shepherd {
    pub pgid: i32,
    pub start_ticks: u64,
    dir: PathBuf,
    conn: Option<tokio::net::UnixStream>,
    ended: Option<ExitRecord>,
}

impl Shepherd {
    /// Writes `record` into `dir` and starts its shepherd in its own session, forked by the
    /// spawner when there is one that works (see `spawner`), else `exe --shepherd DIR`; returns
    /// once the job started, or with why it did not.
    pub async fn spawn(
        exe: &Path,
        spawner: Option<&Arc<crate::run::spawner::Spawner>>,
        dir: &Path,
        record: &RunRecord,
    ) -> anyhow::Result<Shepherd> {
        std::fs::create_dir_all(dir).with_context(|| format!("create run directory {}", dir.display()))?;
        write_json(&dir.join("spec.json"), record)?;
        let forked = match spawner {
            Some(spawner) => {
                let (spawner, dir) = (Arc::clone(spawner), dir.to_path_buf());
                match tokio::task::spawn_blocking(move || spawner.spawn_shepherd(&dir)).await {
                    Ok(Ok(forked)) => forked.map(|(_, stdout)| stdout),
                    Ok(Err(e)) => {
                        tracing::warn!(error = format!("{e:#}"), "the spawner failed; shepherds are exec'd from now on");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the spawner's call failed; shepherds are exec'd from now on");
                        None
                    }
                }
            }
            None => None,
        };
        let stdout: Box<dyn tokio::io::AsyncRead + Unpin + Send> = match forked {
            Some(fd) => Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(fd).context("watch the shepherd's stdout")?),
            None => Box::new(exec_shepherd(exe, dir)?),
        };
        let mut line = String::new();
        let mut reader = tokio::io::BufReader::new(tokio::io::AsyncReadExt::take(stdout, 4096));
        let read =
            tokio::time::timeout(Duration::from_millis(START_WAIT_MS), tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line))
                .await
                .context("the shepherd did not start the job within 30 s")?;
        read.context("read the shepherd's first line")?;
        let line = line.trim_end();
        if let Some(why) = line.strip_prefix("failed ") {
            anyhow::bail!("{why}");
        }
        let (pgid, start_ticks) = parse_started(line.strip_prefix("started ").unwrap_or(line))
            .with_context(|| format!("the shepherd said {line:?} instead of starting the job"))?;
        let mut shepherd = Shepherd { pgid, start_ticks, dir: dir.to_path_buf(), conn: None, ended: None };
        shepherd.conn = connect(dir).await.ok().flatten().map(|(_, _, c)| c);
        Ok(shepherd)
    }

    /// Takes over a run whose shepherd a previous daemon started; none when it has ended (its
    /// status, if any, is then in [`Shepherd::status`]).
    pub async fn adopt(dir: &Path) -> anyhow::Result<Option<Shepherd>> {
        Ok(connect(dir).await?.map(|(pgid, start_ticks, conn)| Shepherd {
            pgid,
            start_ticks,
            dir: dir.to_path_buf(),
            conn: Some(conn),
            ended: None,
        }))
    }

    /// Waits until the job has ended, and how. Cancel-safe.
    pub async fn wait(&mut self) -> ExitRecord {
        if let Some(e) = &self.ended {
            return e.clone();
        }
        if let Some(conn) = &mut self.conn {
            // `ended` (the job ended and its status is written), or EOF (the shepherd is gone).
            let mut buf = [0u8; 64];
            let _ = tokio::io::AsyncReadExt::read(conn, &mut buf).await;
        } else {
            // No connection (it ended before we connected, or the socket failed): watch the pid.
            while process_alive(self.pgid, self.start_ticks) {
                tokio::time::sleep(Duration::from_millis(POLL_MS)).await;
            }
            // The shepherd writes the status right after the job's end.
            for _ in 0..50 {
                if self.dir.join("status.json").exists() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let ended = status(&self.dir);
        self.ended = Some(ended.clone());
        ended
    }
}

/// Starts `exe --shepherd DIR` in its own session (no spawner): its stdout.
fn exec_shepherd(exe: &Path, dir: &Path) -> anyhow::Result<tokio::process::ChildStdout> {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(SHEPHERD_FLAG).arg(dir).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped());
    // SAFETY: only async-signal-safe calls (setsid) between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = tokio::process::Command::from(cmd)
        .kill_on_drop(false)
        .spawn()
        .with_context(|| format!("start shepherd {} {SHEPHERD_FLAG} {}", exe.display(), dir.display()))?;
    let stdout = child.stdout.take().context("shepherd stdout")?;
    // Reap it whenever it ends (after a hand-over, init does).
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(stdout)
}

/// How the run in `dir` ended, from its shepherd's record.
pub fn status(dir: &Path) -> ExitRecord {
    match read_json::<ExitRecord>(&dir.join("status.json")) {
        Ok(Some(e)) => e,
        Ok(None) => ExitRecord::Failed("its shepherd ended without recording how the job ended".into()),
        Err(e) => ExitRecord::Failed(format!("{e:#}")),
    }
}

/// Copies task `rank`'s output (its pipes, or its terminal's master) into the step's log, and
/// then its exit, once it and every copy ended.
fn follow_task(log: Arc<StepLog>, rank: u32, mut child: std::process::Child, terminal: Option<std::fs::File>) {
    let mut readers = Vec::new();
    let pipes: [(u8, Option<Box<dyn Read + Send>>); 2] = [
        (
            FRAME_STDOUT,
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>)
                .or_else(|| terminal.map(|m| Box::new(m) as Box<dyn Read + Send>)),
        ),
        (FRAME_STDERR, child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>)),
    ];
    for (kind, pipe) in pipes {
        let Some(mut pipe) = pipe else { continue };
        let log = Arc::clone(&log);
        readers.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; PIPE_READ_BYTES];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => log.append(kind, rank, &buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // A terminal's master reads EIO once no process holds its slave.
                    Err(_) => break,
                }
            }
        }));
    }
    std::thread::spawn(move || {
        use std::os::unix::process::ExitStatusExt;
        let status = child.wait();
        for r in readers {
            let _ = r.join();
        }
        lock(&log.state).ptys.remove(&rank);
        match status {
            Ok(s) => log.exit(rank, s.code(), s.signal()),
            Err(_) => log.exit(rank, Some(1), None),
        }
    });
}

/// `STEP RANK ROWS COLS` of a `winsize` request.
fn parse_winsize(args: &str) -> Option<(u32, u32, proto::PtySize)> {
    let mut words = args.split_whitespace();
    let step = words.next()?.parse().ok()?;
    let rank = words.next()?.parse().ok()?;
    let rows = words.next()?.parse().ok()?;
    let cols = words.next()?.parse().ok()?;
    Some((step, rank, proto::PtySize { rows, cols }))
}

fn parse_started(text: &str) -> Option<(i32, u64)> {
    let mut words = text.split_whitespace();
    let pid = words.next()?.parse().ok()?;
    let ticks = words.next()?.parse().ok()?;
    Some((pid, ticks))
}

/// Reads one short line from `conn` byte by byte (nothing past it is consumed).
async fn read_short_line(conn: &mut tokio::net::UnixStream, max: usize) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while line.len() < max {
        if tokio::io::AsyncReadExt::read(conn, &mut byte).await? == 0 {
            break;
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Opens a connection to the shepherd in `dir` and sends `request` after its hello.
async fn open_request(dir: &Path, request: &str) -> anyhow::Result<tokio::net::UnixStream> {
    let sock = dir.join("sock");
    let mut conn = tokio::net::UnixStream::connect(&sock).await.with_context(|| format!("connect to shepherd {}", sock.display()))?;
    let hello = tokio::time::timeout(Duration::from_millis(START_WAIT_MS), read_short_line(&mut conn, 64))
        .await
        .with_context(|| format!("shepherd {} did not answer", sock.display()))??;
    anyhow::ensure!(parse_started(&hello).is_some(), "shepherd {} said {hello:?}", sock.display());
    tokio::io::AsyncWriteExt::write_all(&mut conn, format!("{request}\n").as_bytes())
        .await
        .with_context(|| format!("write to shepherd {}", sock.display()))?;
    Ok(conn)
}

/// Asks the shepherd in `dir` to start a step's task: its pid and start time (0 for a task
/// that could not start; its error is in the step's log).
pub async fn spawn_task(dir: &Path, request: &TaskRequest) -> anyhow::Result<(i32, u64)> {
    let json = serde_json::to_string(request).context("encode task request")?;
    let mut conn = open_request(dir, &format!("spawn {json}")).await?;
    let answer = tokio::time::timeout(Duration::from_millis(START_WAIT_MS), read_short_line(&mut conn, 4096))
        .await
        .context("the shepherd did not answer within 30 s")??;
    if let Some(why) = answer.strip_prefix("err ") {
        anyhow::bail!("{why}");
    }
    answer.strip_prefix("ok ").and_then(parse_started).with_context(|| format!("the shepherd answered {answer:?}"))
}

/// Gives the pseudo-terminal of task `rank` of step `step` in the shepherd of `dir` the size
/// `size` (`srun --pty`'s terminal was resized).
pub async fn resize_pty(dir: &Path, step: u32, rank: u32, size: proto::PtySize) -> anyhow::Result<()> {
    let mut conn = open_request(dir, &format!("winsize {step} {rank} {} {}", size.rows, size.cols)).await?;
    let answer = tokio::time::timeout(Duration::from_millis(START_WAIT_MS), read_short_line(&mut conn, 4096))
        .await
        .context("the shepherd did not answer within 30 s")??;
    match answer.strip_prefix("err ") {
        Some(why) => anyhow::bail!("{why}"),
        None if answer == "ok" => Ok(()),
        None => anyhow::bail!("the shepherd answered {answer:?}"),
    }
}

/// Opens the stdin of task `rank` of step `step` in the shepherd of `dir`: what is written to
/// the connection reaches the task; closing it closes the task's stdin.
pub async fn open_input(dir: &Path, step: u32, rank: u32) -> anyhow::Result<tokio::net::UnixStream> {
    open_request(dir, &format!("input {step} {rank}")).await
}

/// Follows step `step`'s log in the shepherd of `dir` from `offset`: the connection the frames
/// come on.
pub async fn tail_step(dir: &Path, step: u32, offset: u64) -> anyhow::Result<tokio::net::UnixStream> {
    open_request(dir, &format!("tail {step} {offset}")).await
}

/// Connects to the shepherd in `dir`: its job's pid and start time and the open connection, or
/// none when no shepherd serves there any more.
async fn connect(dir: &Path) -> anyhow::Result<Option<(i32, u64, tokio::net::UnixStream)>> {
    let sock = dir.join("sock");
    let mut conn = match tokio::net::UnixStream::connect(&sock).await {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("connect to shepherd {}", sock.display())),
    };
    let line = match tokio::time::timeout(Duration::from_millis(START_WAIT_MS), read_short_line(&mut conn, 64)).await {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => return Err(e).with_context(|| format!("read from shepherd {}", sock.display())),
        Err(_) => anyhow::bail!("shepherd {} did not answer within 30 s", sock.display()),
    };
    if line.is_empty() {
        return Ok(None);
    }
    let (pid, ticks) = parse_started(&line).with_context(|| format!("shepherd {} said {line:?}", sock.display()))?;
    if tokio::io::AsyncWriteExt::write_all(&mut conn, b"watch\n").await.is_err() {
        return Ok(None);
    }
    Ok(Some((pid, ticks, conn)))
}

/// Opens `cgroup.procs` of each of a run's cgroups for a task to join (its pid is written to
/// each before it runs); an error names the cgroup that could not be opened, with its errno.
fn open_cgroup_procs(cgroups: &[PathBuf]) -> Result<Vec<std::fs::File>, (String, i32)> {
    cgroups
        .iter()
        .map(|c| {
            crate::run::cgroup::open_procs(c).map_err(|e| {
                (format!("join cgroup {}: {e}", crate::run::cgroup::procs_file(c).display()), e.raw_os_error().unwrap_or(libc::EIO))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task joins every cgroup of its run or does not start (a cgroup it could not open was
    /// skipped, and the task ran outside its run's limits).
    #[test]
    fn a_task_that_cannot_join_one_of_its_cgroups_does_not_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let here = dir.path().join("memory");
        std::fs::create_dir(&here).expect("mkdir");
        std::fs::write(here.join("cgroup.procs"), "").expect("write");
        assert_eq!(open_cgroup_procs(std::slice::from_ref(&here)).map(|f| f.len()), Ok(1));
        let gone = dir.path().join("pids");
        let (why, errno) = open_cgroup_procs(&[here, gone.clone()]).expect_err("a gone cgroup fails the join");
        assert!(why.contains(&gone.join("cgroup.procs").display().to_string()), "{why}");
        assert_eq!(errno, libc::ENOENT);
    }

    #[test]
    fn winsize_requests_parse_and_garbage_does_not() {
        assert_eq!(parse_winsize("3 0 50 132"), Some((3, 0, proto::PtySize { rows: 50, cols: 132 })));
        assert_eq!(parse_winsize("3 0 50"), None);
        assert_eq!(parse_winsize("3 0 70000 80"), None);
        assert_eq!(parse_winsize("x 0 5 5"), None);
    }

    #[test]
    fn started_lines_parse_and_garbage_does_not() {
        assert_eq!(parse_started("123 456"), Some((123, 456)));
        assert_eq!(parse_started("123"), None);
        assert_eq!(parse_started("x y"), None);
    }
}
