//! `srun` in a `corral submit` job, where every node of the job runs the command already: the
//! step's tasks of this node alone, started here as child processes (each leading its own
//! process group) with the step's `SLURM_*` variables; `--label` prefixes their lines with the
//! rank, SIGINT and SIGTERM are passed on to every task, and the worst exit status is returned.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use super::signal_words;
use crate::slurm::opts::Parsed;
use crate::slurm::step::{plan_step, TaskPlan, PROG};
use crate::slurm::SlurmError;

/// The next step id of job `job` on node `node` (a counter kept in the temp directory; every
/// node of a job runs the same script, so each counts the same steps).
fn next_step_id(job: &str, node: &str) -> u32 {
    let dir = std::env::temp_dir();
    for n in 0..100_000u32 {
        let path = dir.join(format!("corral-srun-{job}-{node}-step-{n}"));
        if std::fs::OpenOptions::new().write(true).create_new(true).open(&path).is_ok() {
            return n;
        }
    }
    0
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

fn catch_signals() {
    // SAFETY: the handler only stores into an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

/// Threads copying labelled output; joined before srun exits so no line is lost.
type Copiers = Vec<std::thread::JoinHandle<()>>;

fn spawn_task(argv: &[String], task: &TaskPlan, label: bool, workdir: Option<&str>, copiers: &mut Copiers) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(&task.env).process_group(0).stdin(if task.rank == 0 { Stdio::inherit() } else { Stdio::null() });
    if let Some(d) = workdir {
        cmd.current_dir(d);
    }
    if label {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = cmd.spawn()?;
    if label {
        let rank = task.rank;
        if let Some(out) = child.stdout.take() {
            copiers.push(std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = writeln!(std::io::stdout().lock(), "{rank}: {line}");
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            copiers.push(std::thread::spawn(move || {
                for line in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                    let _ = writeln!(std::io::stderr().lock(), "{rank}: {line}");
                }
            }));
        }
    }
    Ok(child)
}

/// Runs this node's tasks of a step and returns the worst exit code.
pub(super) fn run_local_step(p: &Parsed, env: &BTreeMap<String, String>) -> Result<i32, SlurmError> {
    let job = env.get("SLURM_JOB_ID").cloned().unwrap_or_default();
    let node_name = env.get("SLURMD_NODENAME").cloned().unwrap_or_else(crate::slurm::host_name);
    let plan = plan_step(p, env, next_step_id(&job, &node_name))?;
    if plan.tasks.is_empty() {
        return Ok(0);
    }
    catch_signals();
    let label = p.has("label");
    let kill_on_bad_exit = p.has("kill-on-bad-exit");
    let workdir = p.last("chdir");
    let mut children: Vec<(u32, Option<Child>)> = Vec::new();
    let mut copiers = Copiers::new();
    for t in &plan.tasks {
        match spawn_task(&p.operands, t, label, workdir, &mut copiers) {
            Ok(c) => children.push((t.rank, Some(c))),
            Err(e) => {
                eprintln!("{PROG}: error: {node_name}: task {}: Unable to start {}: {e}", t.rank, p.operands[0]);
                kill_all(&children, libc::SIGKILL);
                reap(&mut children);
                return Ok(if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 });
            }
        }
    }
    let mut worst = 0;
    loop {
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            kill_all(&children, sig);
        }
        let mut running = 0;
        let mut bad_exit = false;
        for (rank, slot) in children.iter_mut() {
            let Some(child) = slot else { continue };
            match child.try_wait() {
                Ok(Some(status)) => {
                    let code = status_code(status);
                    if code != 0 {
                        match std::os::unix::process::ExitStatusExt::signal(&status) {
                            Some(s) => eprintln!("{PROG}: error: {node_name}: task {rank}: {}", signal_words(s)),
                            None => eprintln!("{PROG}: error: {node_name}: task {rank}: Exited with exit code {code}"),
                        }
                        bad_exit = true;
                    }
                    worst = worst.max(code);
                    *slot = None;
                }
                Ok(None) => running += 1,
                Err(_) => *slot = None,
            }
        }
        if bad_exit && kill_on_bad_exit && running > 0 {
            kill_all(&children, libc::SIGKILL);
        }
        if running == 0 {
            for c in copiers {
                let _ = c.join();
            }
            return Ok(worst);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_all(children: &[(u32, Option<Child>)], sig: i32) {
    for (_, c) in children {
        if let Some(c) = c {
            // SAFETY: kill takes plain integers; the child leads its own process group, so
            // -pid reaches it and everything it started.
            unsafe {
                libc::kill(-(c.id() as i32), sig);
            }
        }
    }
}

fn reap(children: &mut [(u32, Option<Child>)]) {
    for (_, c) in children.iter_mut() {
        if let Some(c) = c {
            let _ = c.wait();
        }
    }
}

fn status_code(status: std::process::ExitStatus) -> i32 {
    match (status.code(), std::os::unix::process::ExitStatusExt::signal(&status)) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}
