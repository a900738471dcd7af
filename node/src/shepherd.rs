//! The shepherd: one small process per run between `corrald` and the job (`corrald --shepherd
//! DIR`), so that a run can outlive the daemon that started it when that daemon hands it over
//! (a rolling upgrade), and never otherwise.
//!
//! A run's directory (`JOBS_DIR/runs/JOB.RUN/`) is its durable record on this node:
//! - `launch.json`, written when the launch is accepted: the run and the instance that took it;
//! - `spec.json`, written before the shepherd starts: what to start and how the agent
//!   supervises it ([`RunRecord`]);
//! - `sock`, the shepherd's Unix socket: each connection gets `PID START_TICKS` and stays open
//!   until the job has ended and its status is written, so a supervisor learns of the end by EOF;
//! - `status.json`, written by the shepherd when the job ended ([`ExitRecord`]);
//! - `report.json`, written by the agent when it queues the run's report; the directory is
//!   removed once a leader has the report.
//!
//! The shepherd is the job's parent (the job's parent-death signal is tied to it). It stays only
//! while a `corrald` of its instance is alive, or while that instance is being handed over and
//! the hand-over's deadline (the lease's, see `watchdog`) has not passed: it reads the daemon
//! record (`JOBS_DIR/daemon.json`, [`DaemonRecord`]) whenever the process it trusts is gone.
//! Otherwise it SIGKILLs the job's process group and cgroup within [`POLL_MS`], records how the
//! job ended, and exits.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use proto::{InstanceId, JobId, RunNo};
use serde::{Deserialize, Serialize};

use crate::launcher::LaunchSpec;
use crate::watchdog::{boot_ms, process_alive, start_ticks};

/// The flag that makes `corrald` a shepherd.
pub const SHEPHERD_FLAG: &str = "--shepherd";
/// How often a shepherd checks that the daemon it trusts is alive.
pub const POLL_MS: u64 = 100;
/// Version of the files of a run directory; a shepherd refuses a record of another format.
pub const RECORD_FORMAT: u32 = 1;
/// The most any file of a run directory or the daemon record may hold.
pub const RECORD_BYTES_MAX: u64 = 4 << 20;
/// Connections a shepherd keeps open at once (supervisors; a new one drops the oldest).
const CONNECTIONS_MAX: usize = 16;
/// How long a supervisor waits for a shepherd to say it started the job.
const START_WAIT_MS: u64 = 30_000;

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
    /// The daemon record the shepherd consults (`JOBS_DIR/daemon.json`).
    pub daemon_file: PathBuf,
    /// The user the job belongs to.
    pub owner: String,
    /// Name and address of every node of the run, in rank order.
    pub nodes: Vec<(String, String)>,
    /// GPU indices the run holds here.
    pub gpus: Vec<u32>,
    /// When the shepherd was started, on the boot clock: the time limit counts from here.
    pub started_boot_ms: u64,
}

/// How a job ended, as its shepherd saw it (`status.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitRecord {
    Exited(i32),
    Signaled(i32),
    /// The job could not be started.
    Failed(String),
}

/// Which `corrald` runs this node's jobs now (`JOBS_DIR/daemon.json`), written by each daemon
/// at start and again by one that hands its runs over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonRecord {
    pub pid: i32,
    pub start_ticks: u64,
    pub instance: InstanceId,
    /// Set by a daemon that exits to be replaced: the next daemon takes over its instance and
    /// runs if it starts before `deadline_boot_ms`.
    pub handover: Option<Handover>,
}

/// What a daemon that hands its runs over leaves for the next one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// When a leader last acknowledged this node, on the boot clock.
    pub last_ack_boot_ms: u64,
    /// The leader's commit index in that acknowledgement.
    pub ack_commit_index: u64,
    /// The lease's deadline: past it, every listed job is killed, handed over or not.
    pub deadline_boot_ms: u64,
}

impl DaemonRecord {
    /// This process, as the daemon of `instance`.
    pub fn me(instance: InstanceId) -> DaemonRecord {
        let pid = std::process::id() as i32;
        DaemonRecord { pid, start_ticks: start_ticks(pid).unwrap_or(0), instance, handover: None }
    }

    /// Whether the process it names is alive (the same process, not a recycled pid).
    pub fn alive(&self) -> bool {
        process_alive(self.pid, self.start_ticks)
    }

    /// The hand-over a starting daemon may take: one whose deadline has not passed.
    pub fn open_handover(&self, now_boot_ms: u64) -> Option<Handover> {
        self.handover.filter(|h| now_boot_ms < h.deadline_boot_ms)
    }
}

/// Writes `value` as JSON to `path` atomically (write, then rename). No fsync: these files
/// matter only while this host stays up.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(value).with_context(|| format!("encode {}", path.display()))?;
    std::fs::write(&tmp, bytes).with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename {} to {}", tmp.display(), path.display()))
}

/// Reads JSON from `path`, at most [`RECORD_BYTES_MAX`]; none when there is no file.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Option<T>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("open {}", path.display())),
    };
    let mut bytes = Vec::new();
    file.take(RECORD_BYTES_MAX + 1).read_to_end(&mut bytes).with_context(|| format!("read {}", path.display()))?;
    anyhow::ensure!(bytes.len() as u64 <= RECORD_BYTES_MAX, "{} exceeds {RECORD_BYTES_MAX} bytes", path.display());
    Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("decode {}", path.display()))?))
}

/// Whether a shepherd (or the watchdog) trusting a daemon of `instance` keeps its jobs now that
/// the process it trusted is gone: yes while a live daemon of that instance holds the record
/// (returned, to trust from now on), or while a hand-over of that instance is open.
pub enum Verdict {
    Trust(DaemonRecord),
    Wait,
    Kill(String),
}

pub fn verdict(daemon_file: &Path, instance: InstanceId, now_boot_ms: u64) -> Verdict {
    match read_json::<DaemonRecord>(daemon_file) {
        Ok(Some(d)) if d.instance != instance => Verdict::Kill(format!("node restarted as instance {} without a hand-over", d.instance)),
        Ok(Some(d)) => match d.handover {
            None if d.alive() => Verdict::Trust(d),
            None => Verdict::Kill("corrald is gone without handing its runs over".into()),
            Some(h) if now_boot_ms < h.deadline_boot_ms => Verdict::Wait,
            Some(_) => Verdict::Kill("the hand-over's deadline passed with no corrald taking over".into()),
        },
        Ok(None) => Verdict::Kill(format!("no daemon record at {}", daemon_file.display())),
        Err(e) => Verdict::Kill(format!("{e:#}")),
    }
}

fn kill_job(pid: i32, cgroup: Option<&Path>) {
    if pid > 1 {
        // SAFETY: kill(2) on the process group of our own child, not yet reaped (so not recycled).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    if let Some(cgroup) = cgroup {
        if let Err(e) = std::fs::write(cgroup.join("cgroup.kill"), b"1") {
            tracing::debug!(cgroup = %cgroup.display(), error = %e, "shepherd: cgroup.kill");
        }
    }
}

/// The shepherd process (`corrald --shepherd DIR`): starts the job `DIR/spec.json` describes,
/// says `started PID START_TICKS` (or `failed WHY`) on stdout, serves `DIR/sock`, records how
/// the job ended in `DIR/status.json`, and exits.
pub fn run(dir: &Path) -> anyhow::Result<()> {
    // Its own session already (the agent's setsid): only signals sent to it by pid arrive.
    for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2, libc::SIGPIPE] {
        // SAFETY: setting a disposition to "ignore" has no memory effects.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let parent = std::os::unix::process::parent_id() as i32;
    let trusted = (parent, start_ticks(parent).unwrap_or(0));
    let status_path = dir.join("status.json");
    let fail = |why: String| -> anyhow::Result<()> {
        write_json(&status_path, &ExitRecord::Failed(why.clone()))?;
        println!("failed {}", why.replace('\n', " "));
        Ok(())
    };
    let record: RunRecord = match read_json(&dir.join("spec.json")) {
        Ok(Some(r)) => r,
        Ok(None) => return fail(format!("no spec.json in {}", dir.display())),
        Err(e) => return fail(format!("{e:#}")),
    };
    if record.format != RECORD_FORMAT {
        return fail(format!("run record format {} (this shepherd reads {RECORD_FORMAT})", record.format));
    }
    let sock_path = dir.join("sock");
    let _ = std::fs::remove_file(&sock_path);
    let listener = match std::os::unix::net::UnixListener::bind(&sock_path) {
        Ok(l) => l,
        Err(e) => return fail(format!("bind {}: {e}", sock_path.display())),
    };
    let mut child = match crate::launcher::start_run_process(&record.launch, record.cgroup.as_deref()) {
        Ok(c) => c,
        Err(e) => return fail(format!("{e:#}")),
    };
    let pid = child.id() as i32;
    let ticks = start_ticks(pid).unwrap_or(0);
    println!("started {pid} {ticks}");
    let _ = std::io::stdout().flush();

    let hello = format!("{pid} {ticks}\n");
    std::thread::spawn(move || {
        let mut open: std::collections::VecDeque<std::os::unix::net::UnixStream> = std::collections::VecDeque::new();
        for mut conn in listener.incoming().flatten() {
            if conn.write_all(hello.as_bytes()).is_ok() {
                if open.len() >= CONNECTIONS_MAX {
                    open.pop_front();
                }
                open.push_back(conn);
            }
        }
    });
    let cgroup = record.cgroup.clone();
    let (daemon_file, instance) = (record.daemon_file.clone(), record.instance);
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
                    kill_job(pid, cgroup.as_deref());
                    return;
                }
            }
        }
    });
    let exit = match child.wait() {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => ExitRecord::Exited(code),
                (None, Some(sig)) => ExitRecord::Signaled(sig),
                (None, None) => ExitRecord::Exited(-1),
            }
        }
        Err(e) => ExitRecord::Failed(format!("wait for the job: {e}")),
    };
    // Whatever the job left in its group goes with it, as when corrald supervised it directly.
    // SAFETY: kill(2) on the job's process group; its leader is reaped, the group id is ours
    // until every member is gone.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    write_json(&status_path, &exit)?;
    // Exiting closes every supervisor's connection: that is how they learn the job ended.
    std::process::exit(0);
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
    /// Writes `record` into `dir` and starts its shepherd (`exe --shepherd DIR`, own session);
    /// returns once the job started, or with why it did not.
    pub async fn spawn(exe: &Path, dir: &Path, record: &RunRecord) -> anyhow::Result<Shepherd> {
        std::fs::create_dir_all(dir).with_context(|| format!("create run directory {}", dir.display()))?;
        write_json(&dir.join("spec.json"), record)?;
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
            let mut buf = [0u8; 256];
            loop {
                match tokio::io::AsyncReadExt::read(conn, &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
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

/// How the run in `dir` ended, from its shepherd's record.
pub fn status(dir: &Path) -> ExitRecord {
    match read_json::<ExitRecord>(&dir.join("status.json")) {
        Ok(Some(e)) => e,
        Ok(None) => ExitRecord::Failed("its shepherd ended without recording how the job ended".into()),
        Err(e) => ExitRecord::Failed(format!("{e:#}")),
    }
}

fn parse_started(text: &str) -> Option<(i32, u64)> {
    let mut words = text.split_whitespace();
    let pid = words.next()?.parse().ok()?;
    let ticks = words.next()?.parse().ok()?;
    Some((pid, ticks))
}

/// Connects to the shepherd in `dir`: its job's pid and start time and the open connection, or
/// none when no shepherd serves there any more.
async fn connect(dir: &Path) -> anyhow::Result<Option<(i32, u64, tokio::net::UnixStream)>> {
    let sock = dir.join("sock");
    let conn = match tokio::net::UnixStream::connect(&sock).await {
        Ok(c) => c,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("connect to shepherd {}", sock.display())),
    };
    let mut reader = tokio::io::BufReader::new(conn);
    let mut line = String::new();
    let read =
        tokio::time::timeout(Duration::from_millis(START_WAIT_MS), tokio::io::AsyncBufReadExt::read_line(&mut reader, &mut line)).await;
    match read {
        Ok(Ok(0)) => Ok(None),
        Ok(Ok(_)) => {
            let (pid, ticks) = parse_started(&line).with_context(|| format!("shepherd {} said {line:?}", sock.display()))?;
            Ok(Some((pid, ticks, reader.into_inner())))
        }
        Ok(Err(e)) => Err(e).with_context(|| format!("read from shepherd {}", sock.display())),
        Err(_) => anyhow::bail!("shepherd {} did not answer within 30 s", sock.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shepherd_keeps_its_job_only_for_a_live_daemon_or_an_open_handover_of_its_instance() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("daemon.json");
        assert!(matches!(verdict(&file, 7, 100), Verdict::Kill(_)), "no record: nobody vouches for the job");
        write_json(&file, &DaemonRecord::me(7)).expect("write record");
        assert!(matches!(verdict(&file, 7, 100), Verdict::Trust(d) if d.pid == std::process::id() as i32));
        assert!(matches!(verdict(&file, 8, 100), Verdict::Kill(_)), "another instance took the node");
        let handover = Handover { last_ack_boot_ms: 50, ack_commit_index: 3, deadline_boot_ms: 1_000 };
        let dead = DaemonRecord { pid: i32::MAX - 1, start_ticks: 1, instance: 7, handover: Some(handover) };
        write_json(&file, &dead).expect("write record");
        assert!(matches!(verdict(&file, 7, 999), Verdict::Wait));
        assert!(matches!(verdict(&file, 7, 1_000), Verdict::Kill(_)), "the hand-over's deadline passed");
        assert_eq!(dead.open_handover(999), Some(handover));
        assert_eq!(dead.open_handover(1_000), None);
        write_json(&file, &DaemonRecord { handover: None, ..dead }).expect("write record");
        assert!(matches!(verdict(&file, 7, 10), Verdict::Kill(_)), "its daemon died without a hand-over");
        std::fs::write(&file, b"{broken").expect("write broken record");
        assert!(matches!(verdict(&file, 7, 10), Verdict::Kill(_)), "an unreadable record vouches for nothing");
    }

    #[test]
    fn started_lines_parse_and_garbage_does_not() {
        assert_eq!(parse_started("123 456"), Some((123, 456)));
        assert_eq!(parse_started("123"), None);
        assert_eq!(parse_started("x y"), None);
    }
}
