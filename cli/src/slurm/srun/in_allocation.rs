//! `srun` inside an allocation: in a batch script (through the node's local socket), with
//! `--jobid` from anywhere, or in `salloc`'s command. The step is launched in the job (its first
//! node numbers it and has the agent of each of its nodes start their tasks), then followed:
//! its tasks' output printed as it comes (`--label`, `--output`/`--error`), stdin passed on
//! (`--input`, or the terminal with `--pty`, raw meanwhile, resized on SIGWINCH), SIGINT and
//! SIGTERM passed on to every task, a bad exit under `--kill-on-bad-exit` ending the rest; the
//! worst exit status is returned.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use proto::{ClientRequest, LogStream, PtySize, Reply};

use crate::client::Cluster;
use crate::slurm::opts::Parsed;
use crate::slurm::step::{allocation_of_job, launch_step, prepared_step, PROG, STEP_READ_FAILURES_MAX, STEP_RETRY_MS};
use crate::slurm::step_output::{OutputFiles, Sink, StepNaming};
use crate::slurm::{hostlist, SlurmError};

use super::signal_words;

/// After `--kill-on-bad-exit`'s SIGTERM, how long tasks get before SIGKILL (Slurm's default
/// `KillWait`).
const STEP_KILL_WAIT_MS: u64 = 30_000;
/// How long `srun` asks again for a signal to one node of a step before it reports it lost.
const STEP_SIGNAL_PATIENCE_MS: u64 = 1_000;

/// How long one read of a step's output waits on its node for news.
const STEP_READ_WAIT_MS: u32 = 2_000;

/// What names the output files of step `spec` of the allocation `env` describes (its number
/// comes once it is launched).
fn step_naming(p: &Parsed, env: &BTreeMap<String, String>, spec: &proto::StepSpec) -> StepNaming {
    let number = |key: &str| env.get(key).and_then(|v| v.parse::<u64>().ok());
    let job = number("SLURM_JOB_ID").unwrap_or(0);
    let job_nodes = env.get("SLURM_JOB_NODELIST").and_then(|l| hostlist::expand(l).ok()).unwrap_or_default();
    let mut nodes = vec![(String::new(), 0); spec.nodes.iter().map(|n| n.ranks.len()).sum()];
    for (i, n) in spec.nodes.iter().enumerate() {
        let index = job_nodes.iter().position(|j| *j == n.name).unwrap_or(i);
        for r in &n.ranks {
            if let Some(slot) = nodes.get_mut(*r as usize) {
                *slot = (n.name.clone(), index);
            }
        }
    }
    StepNaming {
        job,
        array_job: number("SLURM_ARRAY_JOB_ID").unwrap_or(job),
        array_task: number("SLURM_ARRAY_TASK_ID").and_then(|t| u32::try_from(t).ok()),
        name: std::env::var("SLURM_JOB_NAME").unwrap_or_default(),
        user: crate::slurm::current_user(),
        step: 0,
        nodes,
        workdir: std::path::PathBuf::from(spec.workdir.clone().unwrap_or_else(|| ".".into())),
        append: p.last("open-mode") == Some("append"),
    }
}

/// Prints output of a step as it comes; with `--label`, whole lines prefixed by the task's
/// rank, a line cut across reads kept until its end arrives.
struct Printer {
    /// Where stdout and stderr go (`--output`, `--error`), and the files they went to.
    sinks: (Sink, Sink),
    files: OutputFiles,
    label: bool,
    /// `--pty`: task 0's output alone (Slurm sends the others' to `/dev/null`).
    only_rank: Option<u32>,
    /// Labels are right-aligned to the width of the highest rank (` 0: ` with 11 or more tasks).
    width: usize,
    partial: BTreeMap<(u32, bool), Vec<u8>>,
}

impl Printer {
    fn print(&mut self, chunk: &proto::StepChunk) {
        if self.only_rank.is_some_and(|r| r != chunk.rank) {
            return;
        }
        let is_err = chunk.stream == LogStream::Stderr;
        if !self.label {
            self.emit(chunk.rank, is_err, &chunk.data);
            return;
        }
        let buf = self.partial.entry((chunk.rank, is_err)).or_default();
        buf.extend_from_slice(&chunk.data);
        let mut out = Vec::new();
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            out.extend_from_slice(format!("{:>w$}: ", chunk.rank, w = self.width).as_bytes());
            out.extend_from_slice(&line);
        }
        self.emit(chunk.rank, is_err, &out);
    }

    /// Sends output of task `rank` where its stream goes (`--output`, `--error`).
    fn emit(&mut self, rank: u32, is_err: bool, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        match if is_err { &self.sinks.1 } else { &self.sinks.0 } {
            Sink::Files(pattern) => self.files.write(pattern, rank, data),
            sink if sink.shows(rank) => write_to(is_err, data),
            _ => {}
        }
    }

    fn finish(&mut self) {
        for ((rank, is_err), rest) in std::mem::take(&mut self.partial) {
            if !rest.is_empty() {
                let mut out = format!("{rank:>w$}: ", w = self.width).into_bytes();
                out.extend_from_slice(&rest);
                out.push(b'\n');
                self.emit(rank, is_err, &out);
            }
        }
    }
}

fn write_to(is_err: bool, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    // A closed stdout/stderr (srun | head) stops nothing: the step still runs to its end.
    if is_err {
        let _ = std::io::stderr().write_all(data);
    } else {
        let mut out = std::io::stdout().lock();
        let _ = out.write_all(data);
        let _ = out.flush();
    }
}

/// Inside a batch job: has the agents of the job's nodes start the step, prints its output,
/// passes SIGINT/SIGTERM on to every task, and returns the worst exit status.
pub(super) fn run_step(p: &Parsed, env: &BTreeMap<String, String>, pty: Option<PtySize>) -> Result<i32, SlurmError> {
    let socket =
        env.get("CORRAL_SOCKET").ok_or_else(|| SlurmError::fatal(PROG, "CORRAL_SOCKET is not set: no local corrald to start the step"))?;
    run_step_through(p, env, Cluster::local(std::path::Path::new(socket)), pty)
}

/// `srun --jobid=ID`: a step in job ID's allocation from anywhere (outside it, or inside
/// another): the allocation's variables are read from the cluster, and any node passes the
/// step to the job's first node, which numbers and starts it.
/// `text` is the job's id (`ID` or `ID.STEP`), from `--jobid` or from `salloc`.
pub fn run_step_in_job(p: &Parsed, text: &str, pty: Option<PtySize>) -> Result<i32, SlurmError> {
    let (cluster, env) = allocation_of_job(text)?;
    run_step_through(p, &env, cluster, pty)
}

/// Starts a step of the allocation `env` describes through `cluster` (the node's socket inside
/// a batch script, any node for `--jobid`), prints its tasks' output and returns its exit code.
/// With `pty` (`--pty` at a terminal of that size), task 0 runs on a pseudo-terminal that gets
/// this terminal's keys (raw mode meanwhile) and new sizes.
fn run_step_through(p: &Parsed, env: &BTreeMap<String, String>, cluster: Cluster, pty: Option<PtySize>) -> Result<i32, SlurmError> {
    let (mut stdin, mut source) = crate::slurm::stdin::parse(p.last("input"))?;
    if pty.is_some() {
        (stdin, source) = (proto::StepStdin::Task(0), Some(crate::slurm::stdin::Source::Stdin));
    }
    let (job, mut spec) = prepared_step(p, env)?;
    spec.stdin = stdin;
    spec.pty = pty;
    spec.validate().map_err(|e| SlurmError::fatal(PROG, format!("Unable to create step: {e}")))?;
    let nodes: Vec<String> = spec.nodes.iter().map(|n| n.name.clone()).collect();
    let terminal_node = spec.nodes.iter().find(|n| n.ranks.contains(&0)).map(|n| n.name.clone()).unwrap_or_default();
    let readers: Vec<String> = spec.nodes.iter().filter(|n| n.ranks.iter().any(|r| stdin.reaches(*r))).map(|n| n.name.clone()).collect();
    let kill_on_bad_exit = p.has("kill-on-bad-exit");
    let quiet = p.has("quiet");
    let tasks: usize = spec.nodes.iter().map(|n| n.ranks.len()).sum();
    let mut printer = Printer {
        sinks: Sink::pair(p.last("output"), p.last("error")),
        files: OutputFiles::new(step_naming(p, env, &spec)),
        label: p.has("label"),
        only_rank: pty.map(|_| 0),
        width: tasks.saturating_sub(1).to_string().len(),
        partial: BTreeMap::new(),
    };
    crate::slurm::block_on(PROG, async move {
        let cluster = std::sync::Arc::new(cluster);
        let step = launch_step(&cluster, job, spec).await?;
        printer.files.naming.step = step;
        // Raw from the step's start to its end (dropped with this block, before srun's last lines).
        let _raw = match pty {
            Some(_) => Some(
                crate::slurm::terminal::RawMode::enter(libc::STDIN_FILENO)
                    .map_err(|e| SlurmError::fatal(PROG, format!("tcsetattr: {e}")))?,
            ),
            None => None,
        };
        if let Some(source) = source {
            crate::slurm::stdin::start(std::sync::Arc::clone(&cluster), job, step, readers, source);
        }
        let (mut sigint, mut sigterm) = interrupts()?;
        let mut resizes = match pty {
            Some(_) => Some(
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                    .map_err(|e| SlurmError::fatal(PROG, format!("handle SIGWINCH: {e}")))?,
            ),
            None => None,
        };
        let mut follower = StepFollower {
            cursors: nodes.iter().map(|n| (n.clone(), NodeCursor::default())).collect(),
            cluster,
            job,
            step,
            nodes,
            quiet,
            kill_on_bad_exit,
            printer,
            killed: false,
            kill_at: None,
            failures: 0,
            lost: false,
        };
        let mut reads = StepReads::new();
        for node in &follower.nodes {
            follower.read(&mut reads, node.clone(), 0, 0);
        }
        while !reads.is_empty() {
            let kill_wait = sleep_until_or_never(follower.kill_at);
            let joined = tokio::select! {
                j = reads.join_next() => j,
                _ = sigint.recv() => { follower.signal(libc::SIGINT).await; continue; }
                _ = sigterm.recv() => { follower.signal(libc::SIGTERM).await; continue; }
                Some(()) = next_or_never(&mut resizes) => {
                    resize_terminal(&follower.cluster, job, step, &terminal_node).await;
                    continue;
                }
                () = kill_wait => {
                    // --kill-on-bad-exit: what SIGTERM left after Slurm's KillWait.
                    follower.kill_at = None;
                    follower.signal(libc::SIGKILL).await;
                    continue;
                }
            };
            let Some(Ok((node, result))) = joined else { continue };
            follower.on_read(&mut reads, node, result).await?;
        }
        Ok(follower.finish())
    })?
}

/// The reads of a step's output in flight, one per node: each gives the node and its answer.
type StepReads = tokio::task::JoinSet<(String, anyhow::Result<Result<Reply, proto::ApiError>>)>;

/// Where `srun` stands with one node of a step.
#[derive(Default)]
struct NodeCursor {
    /// Offset of the node's output read so far.
    offset: u64,
    /// Exits of the node's tasks seen, by rank.
    exits: BTreeMap<u32, proto::TaskExit>,
    /// No more to read from the node.
    done: bool,
}

/// A started step `srun` follows through the cluster: its nodes' output and exits, and the
/// kill that a bad exit under `--kill-on-bad-exit` starts.
struct StepFollower {
    cluster: std::sync::Arc<Cluster>,
    job: proto::JobId,
    step: u32,
    nodes: Vec<String>,
    quiet: bool,
    kill_on_bad_exit: bool,
    printer: Printer,
    cursors: BTreeMap<String, NodeCursor>,
    /// SIGTERM sent after a bad exit.
    killed: bool,
    /// When SIGKILL follows that SIGTERM.
    kill_at: Option<tokio::time::Instant>,
    /// Failed reads in a row.
    failures: u32,
    /// A node's part of the step was lost (the job ended or the node is gone).
    lost: bool,
}

impl StepFollower {
    /// Starts reading `node`'s output from `offset`, with `exits_seen` of its exits known.
    fn read(&self, reads: &mut StepReads, node: String, offset: u64, exits_seen: u32) {
        let cluster = std::sync::Arc::clone(&self.cluster);
        let (job, step) = (self.job, self.step);
        reads.spawn(async move {
            let r = cluster
                .call(ClientRequest::StepRead { job, step, node: node.clone(), offset, exits_seen, wait_ms: STEP_READ_WAIT_MS })
                .await;
            (node, r)
        });
    }

    /// Sends `sig` to every task of the step.
    async fn signal(&self, sig: i32) {
        signal_step(&self.cluster, self.job, self.step, &self.nodes, sig).await;
    }

    /// Takes in one read of `node`'s output (prints it, notes exits, starts the kill after a
    /// bad one) and reads again unless the node is done; an unexpected reply, or the local
    /// corrald out of reach for too long, is an error.
    async fn on_read(
        &mut self,
        reads: &mut StepReads,
        node: String,
        result: anyhow::Result<Result<Reply, proto::ApiError>>,
    ) -> Result<(), SlurmError> {
        let fatal = |m: String| SlurmError::fatal(PROG, m);
        let (job, step) = (self.job, self.step);
        if matches!(result, Ok(Err(proto::ApiError::Unavailable(_)))) && self.failures < STEP_READ_FAILURES_MAX {
            // A node of the step is out of reach for now (its daemon may be handing its runs
            // over, or it is lost and its rank moved to a spare): follow its tasks to the
            // spare, or read it again.
            self.failures += 1;
            if let Some(spare) = self.moved_to_spare(&node).await {
                self.read(reads, spare, 0, 0);
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(STEP_RETRY_MS)).await;
            if let Some(c) = self.cursors.get(&node) {
                self.read(reads, node, c.offset, c.exits.len() as u32);
            }
            return Ok(());
        }
        let Some(cursor) = self.cursors.get_mut(&node) else { return Ok(()) };
        match result {
            Ok(Ok(Reply::StepOutput { chunks, next_offset, exits, done })) => {
                self.failures = 0;
                for c in &chunks {
                    self.printer.print(c);
                }
                cursor.offset = next_offset;
                if note_exits(&mut cursor.exits, exits, &node, self.quiet) && self.kill_on_bad_exit && !self.killed {
                    // As Slurm: SIGTERM to every task now, SIGKILL after KillWait.
                    self.killed = true;
                    eprintln!("{PROG}: launch/slurm: _step_signal: Terminating StepId={job}.{step}");
                    signal_step(&self.cluster, job, step, &self.nodes, libc::SIGTERM).await;
                    self.kill_at = Some(tokio::time::Instant::now() + Duration::from_millis(STEP_KILL_WAIT_MS));
                }
                cursor.done = done;
            }
            Ok(Ok(other)) => return Err(fatal(format!("unexpected reply {other:?}"))),
            Ok(Err(e)) => {
                // The job ended (its steps with it) or the node is gone.
                eprintln!("{PROG}: error: {node}: step {job}.{step}: {e}");
                cursor.done = true;
                self.lost = true;
            }
            Err(e) => {
                self.failures += 1;
                if self.failures > STEP_READ_FAILURES_MAX {
                    return Err(fatal(format!("lost the local corrald: {e:#}")));
                }
                tokio::time::sleep(Duration::from_millis(STEP_RETRY_MS)).await;
            }
        }
        if !cursor.done {
            let (offset, seen) = (cursor.offset, cursor.exits.len() as u32);
            self.read(reads, node, offset, seen);
        }
        Ok(())
    }

    /// Where the tasks `lost` had now run, when the job lost that node and repaired it onto a
    /// spare (`--spare-nodes`): the node that launched the step starts them there with their
    /// ranks, and the step is followed there from then on. `None` while it is not repaired.
    async fn moved_to_spare(&mut self, lost: &str) -> Option<String> {
        let request = ClientRequest::StepMove { job: self.job, step: self.step, lost: lost.to_string() };
        let Ok(Ok(Reply::StepMoved { node: spare })) = self.cluster.call(request).await else { return None };
        if !self.quiet {
            eprintln!("{PROG}: {lost} was lost: its tasks of step {}.{} run on {spare} now", self.job, self.step);
        }
        self.cursors.remove(lost);
        self.cursors.insert(spare.clone(), NodeCursor::default());
        for n in self.nodes.iter_mut().filter(|n| *n == lost) {
            *n = spare.clone();
        }
        Some(spare)
    }

    /// Once every node is done: prints what is left of the output, and gives the worst exit
    /// status (at least 1 when a node's part was lost).
    fn finish(mut self) -> i32 {
        self.printer.finish();
        if self.killed {
            eprintln!("{PROG}: Force Terminated StepId={}.{}", self.job, self.step);
        }
        let worst = self.cursors.values().flat_map(|c| c.exits.values().map(proto::TaskExit::status)).max().unwrap_or(0);
        if self.lost {
            worst.max(1)
        } else {
            worst
        }
    }
}

/// The next signal of `stream`, or never without one.
async fn next_or_never(stream: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match stream {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Gives the step's pseudo-terminal (task 0's, on `node`) this terminal's size, after a SIGWINCH.
async fn resize_terminal(cluster: &Cluster, job: proto::JobId, step: u32, node: &str) {
    let Some(size) = crate::slurm::terminal::size(libc::STDIN_FILENO) else { return };
    let request = ClientRequest::StepResize { job, step, node: node.to_string(), size };
    match cluster.call(request).await {
        Ok(Ok(_)) | Ok(Err(proto::ApiError::NotFound(_))) => {}
        Ok(Err(e)) => eprintln!("{PROG}: error: resize the terminal of step {job}.{step}: {e}"),
        Err(e) => eprintln!("{PROG}: error: resize the terminal of step {job}.{step}: {e:#}"),
    }
}

/// Sleeps until `at`, or for ever without one.
async fn sleep_until_or_never(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// SIGINT and SIGTERM to this process, as streams (srun passes them on to the step's tasks).
fn interrupts() -> Result<(tokio::signal::unix::Signal, tokio::signal::unix::Signal), SlurmError> {
    use tokio::signal::unix::{signal, SignalKind};
    let sigint = signal(SignalKind::interrupt()).map_err(|e| SlurmError::fatal(PROG, format!("handle SIGINT: {e}")))?;
    let sigterm = signal(SignalKind::terminate()).map_err(|e| SlurmError::fatal(PROG, format!("handle SIGTERM: {e}")))?;
    Ok((sigint, sigterm))
}

/// Sends `signal` to step `job.step`'s tasks on each of `nodes`; a node where it has ended
/// already is not an error.
async fn signal_step(cluster: &Cluster, job: proto::JobId, step: u32, nodes: &[String], signal: i32) {
    for node in nodes {
        let request = ClientRequest::StepSignal { job, step, node: node.clone(), signal };
        // Asked again while the call is lost on a loaded cluster or the node briefly out of
        // reach: a lost SIGTERM would leave the task to -K's SIGKILL 30 s later.
        if let Err(e) = cluster.call_patiently(request, Duration::from_millis(STEP_SIGNAL_PATIENCE_MS)).await {
            if !matches!(e.downcast_ref::<proto::ApiError>(), Some(proto::ApiError::NotFound(_))) {
                eprintln!("{PROG}: error: {node}: signal step {job}.{step}: {e:#}");
            }
        }
    }
}

/// Records `exits` of `node`'s tasks in `seen` and reports each new bad one as Slurm does
/// (unless `quiet`): whether there was one.
fn note_exits(seen: &mut BTreeMap<u32, proto::TaskExit>, exits: Vec<proto::TaskExit>, node: &str, quiet: bool) -> bool {
    let mut bad = false;
    for e in exits {
        if seen.insert(e.rank, e).is_none() && e.status() != 0 {
            bad = true;
            if !quiet {
                match e.signal {
                    Some(s) => eprintln!("{PROG}: error: {node}: task {}: {}", e.rank, signal_words(s)),
                    None => eprintln!("{PROG}: error: {node}: task {}: Exited with exit code {}", e.rank, e.status()),
                }
            }
        }
    }
    bad
}
