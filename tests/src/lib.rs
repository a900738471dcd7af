//! End-to-end test harness: real `corrald` processes on 127.0.0.1 driven through the real
//! `corral` binary. Nothing is simulated here but the GPUs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Directory holding the built `corral` and `corrald` (the test executable lives in its `deps/`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("locate the test executable");
    let deps = exe.parent().expect("test executable has a directory");
    let dir = if deps.ends_with("deps") { deps.parent().expect("deps has a parent").to_path_buf() } else { deps.to_path_buf() };
    for bin in ["corral", "corrald"] {
        assert!(dir.join(bin).exists(), "{} is missing: run `cargo build --bins` before the end-to-end tests", dir.join(bin).display());
    }
    dir
}

pub fn corral_bin() -> PathBuf {
    bin_dir().join("corral")
}

/// A local cluster in a temporary directory, stopped when dropped.
pub struct TestCluster {
    pub dir: tempfile::TempDir,
    pub work: PathBuf,
}

impl TestCluster {
    /// `corral dev up` with `extra` options (e.g. `--nodes 3 --gpus h100:8`).
    pub fn up(extra: &[&str]) -> TestCluster {
        let dir = tempfile::Builder::new().prefix("corral-e2e-").tempdir().expect("create temp dir");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).expect("create work dir");
        let c = TestCluster { dir, work };
        let mut args = vec!["dev", "up", "--dir", c.path_str()];
        args.extend_from_slice(extra);
        let out = c.raw(&args);
        assert!(out.status.success(), "dev up failed: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
        c
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn path_str(&self) -> &str {
        self.dir.path().to_str().expect("utf-8 temp path")
    }

    /// Runs `corral ARGS` with no cluster flag added.
    pub fn raw(&self, args: &[&str]) -> Output {
        Command::new(corral_bin())
            .args(args)
            .env("CORRALD", bin_dir().join("corrald"))
            .current_dir(&self.work)
            .output()
            .expect("run corral")
    }

    /// Runs `corral --cluster DIR ARGS`.
    pub fn corral(&self, args: &[&str]) -> Output {
        let mut all = vec!["--cluster", self.path_str()];
        all.extend_from_slice(args);
        self.raw(&all)
    }

    /// Runs `corral --cluster DIR --json ARGS`, asserts success, parses stdout.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.corral(&all);
        assert!(out.status.success(), "corral {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("corral {args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// Submits `-- CMD...` with `opts` before it; returns the job id.
    pub fn submit(&self, opts: &[&str], cmd: &[&str]) -> u64 {
        let mut args = vec!["submit"];
        args.extend_from_slice(opts);
        args.push("--");
        args.extend_from_slice(cmd);
        let v = self.json(&args);
        v["job_id"].as_u64().unwrap_or_else(|| panic!("no job_id in {v}"))
    }

    pub fn job(&self, id: u64) -> Value {
        self.json(&["show", &id.to_string()])
    }

    /// Waits until job `id` reaches a final state; returns its JSON.
    pub fn wait_final(&self, id: u64, patience: Duration) -> Value {
        let mut last = Value::Null;
        wait_until(&format!("job {id} to finish"), patience, || {
            last = self.job(id);
            !matches!(last["state"].as_str(), Some("PENDING" | "RUNNING"))
        });
        last
    }

    pub fn leader(&self) -> String {
        let v = self.json(&["cluster"]);
        v["leader"].as_str().unwrap_or_else(|| panic!("no leader in {v}")).to_string()
    }

    /// The QUIC address of node `name`.
    pub fn addr(&self, name: &str) -> String {
        let v = self.json(&["cluster"]);
        v["members"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["name"] == name))
            .and_then(|m| m["addr"].as_str())
            .unwrap_or_else(|| panic!("no member {name} in {v}"))
            .to_string()
    }

    pub fn signal(&self, node: &str, signal: &str) {
        let out = self.raw(&["dev", "signal", "--dir", self.path_str(), node, signal]);
        assert!(out.status.success(), "signal {node}: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn start(&self, node: &str) {
        let out = self.raw(&["dev", "start", "--dir", self.path_str(), node]);
        assert!(out.status.success(), "start {node}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Runs the Slurm command `name` (a shim: a symlink to `corral` in the cluster's `shims/`)
    /// in the work directory, with the shims first on `PATH` (jobs inherit it, so `srun` in a
    /// batch script is the shim too) and `env` added.
    pub fn shim(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let dir = self.path().join("shims");
        if !dir.exists() {
            let out = self.raw(&["install-slurm-shims", dir.to_str().expect("utf-8 path")]);
            assert!(out.status.success(), "install-slurm-shims: {}", String::from_utf8_lossy(&out.stderr));
        }
        let link = dir.join(name);
        let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
        let mut cmd = Command::new(&link);
        // As at a terminal, SIGHUP at its default: a test run under `nohup` ignores it, and
        // that disposition would pass to the command salloc hangs up at its time limit.
        // SAFETY: signal(2) is async-signal-safe; the closure allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                libc::signal(libc::SIGHUP, libc::SIG_DFL);
                Ok(())
            });
        }
        cmd.args(args)
            .env("CORRAL_CLUSTER", self.path())
            .env("PATH", path)
            .envs(env.iter().copied())
            .env_remove("SLURM_JOB_ID")
            .current_dir(&self.work)
            .output()
            .unwrap_or_else(|e| panic!("run {name}: {e}"))
    }

    /// The tail of every node's log, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(self.path()) {
            let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("corrald.log")).filter(|p| p.exists()).collect();
            paths.sort();
            for p in paths {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                out.push_str(&format!("--- {}\n", p.display()));
                for line in tail.into_iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }
}

impl TestCluster {
    /// Copies every node's whole log beside the temporary directory (which is removed), so a
    /// failure can be read past the tails `logs` prints.
    fn keep_logs(&self) {
        let kept = PathBuf::from(format!("{}-failed", self.dir.path().display()));
        let Ok(entries) = std::fs::read_dir(self.path()) else { return };
        for entry in entries.flatten() {
            let log = entry.path().join("corrald.log");
            if log.exists() {
                let to = kept.join(entry.file_name());
                let copied = std::fs::create_dir_all(&to).and_then(|()| std::fs::copy(&log, to.join("corrald.log")));
                if let Err(e) = copied {
                    eprintln!("cannot keep {}: {e}", log.display());
                    return;
                }
            }
        }
        // The jobs' own output (`slurm-N.out` and what job bodies log) says what the job saw.
        let outputs = std::fs::read_dir(&self.work).into_iter().flatten().flatten().filter(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            (name.ends_with(".out") || name.ends_with(".err") || name.ends_with(".txt") || name.ends_with(".log"))
                && e.metadata().is_ok_and(|m| m.is_file() && m.len() <= 16 << 20)
        });
        for entry in outputs {
            let to = kept.join("work");
            if let Err(e) = std::fs::create_dir_all(&to).and_then(|()| std::fs::copy(entry.path(), to.join(entry.file_name()))) {
                eprintln!("cannot keep {}: {e}", entry.path().display());
            }
        }
        eprintln!("whole node logs and job outputs kept in {}", kept.display());
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("node logs of the failed test:\n{}", self.logs());
            self.keep_logs();
        }
        let _ = self.raw(&["dev", "down", "--dir", self.path_str()]);
    }
}

/// Polls `done` every 50 ms until it holds; panics after `patience`.
pub fn wait_until(what: &str, patience: Duration, done: impl FnMut() -> bool) {
    wait_until_or_show(what, patience, done, String::new);
}

/// [`wait_until`], with what `context` says (the state that was waited on) in the panic.
pub fn wait_until_or_show(what: &str, patience: Duration, mut done: impl FnMut() -> bool, context: impl FnOnce() -> String) {
    let deadline = Instant::now() + patience;
    while !done() {
        if Instant::now() >= deadline {
            panic!("timed out after {:.1} s waiting for {what}\n{}", patience.as_secs_f64(), context());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The shell function job bodies use to record their spans for the `chaos` checkers.
pub const REC: &str =
    r#"rec() { echo "$1 $(date +%s%3N) $CORRAL_JOB_ID $CORRAL_RUN $CORRAL_NODE ${CUDA_VISIBLE_DEVICES:--} $$" >> spans.log; }"#;

/// Milliseconds since the Unix epoch, as the job bodies' `date +%s%3N` reports.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Right after `node` was SIGKILLed: its job processes cannot record their end (the parent
/// death signal is SIGKILL too). Waits until each recorded process of `node` without an end is
/// gone and returns when it was first seen gone, an upper bound on when it died, by pid.
pub fn observe_deaths(spans_log: &Path, node: &str, patience: Duration) -> std::collections::BTreeMap<i32, u64> {
    let spans = chaos::parse_spans(&std::fs::read_to_string(spans_log).unwrap_or_default());
    let mut deaths = std::collections::BTreeMap::new();
    for span in spans.iter().filter(|s| s.node == node && s.end_ms.is_none()) {
        let pid = span.pid.unwrap_or_else(|| panic!("span without pid: {span:?}"));
        wait_until(&format!("process {pid} of job {} to be gone", span.job), patience, || !chaos::runner::pid_alive(pid));
        deaths.insert(pid, now_ms());
    }
    deaths
}

/// The whole log of node `name` of `c`.
pub fn node_log(c: &TestCluster, name: &str) -> String {
    std::fs::read_to_string(c.path().join(name).join("corrald.log")).unwrap_or_default()
}

/// After a gang of two lost one node and was requeued: the part of run 1 on `survivor` was
/// stopped (it recorded its end), run 2 ran on two nodes again, and no two runs overlapped.
pub fn assert_gang_requeued_whole(spans: &[chaos::ProcessSpan], job: u64, survivor: &str) {
    let part = spans.iter().find(|s| s.job == job && s.run == 1 && s.node == survivor).expect("run 1 on the surviving node");
    assert!(part.end_ms.is_some(), "the surviving part of run 1 was stopped: {spans:?}");
    assert_eq!(spans.iter().filter(|s| s.job == job && s.run == 2).count(), 2, "run 2 ran on two nodes again: {spans:?}");
    let violations = chaos::check_never_twice(spans);
    assert!(violations.is_empty(), "{violations:?}");
}

/// Closes the spans of killed processes with the death times [`observe_deaths`] saw.
pub fn close_spans(spans: &mut [chaos::ProcessSpan], deaths: &std::collections::BTreeMap<i32, u64>) {
    for span in spans.iter_mut().filter(|s| s.end_ms.is_none()) {
        if let Some(ms) = span.pid.and_then(|p| deaths.get(&p)) {
            span.end_ms = Some(*ms);
        }
    }
}

/// The venv of the real client programs (`scripts/setup-clients.sh`: torch, Lightning,
/// submitit, dask-jobqueue, DeepSpeed, prometheus-client), or `None` (said) when
/// `CORRAL_SKIP_CLIENTS=1`. Missing otherwise is a failure: the tests that use it are part of
/// the suite.
pub fn pyenv() -> Option<PathBuf> {
    if std::env::var("CORRAL_SKIP_CLIENTS").is_ok_and(|v| v == "1") {
        eprintln!("SKIPPED: CORRAL_SKIP_CLIENTS=1");
        return None;
    }
    let dir = PathBuf::from(std::env::var("CORRAL_PYENV").unwrap_or_else(|_| "/var/tmp/corral-pyenv".into()));
    assert!(
        dir.join("bin/torchrun").exists(),
        "{} has no torchrun: run scripts/setup-clients.sh (or set CORRAL_SKIP_CLIENTS=1 to leave these tests out)",
        dir.display()
    );
    Some(dir)
}

/// `corral restd` on node n1, killed when dropped.
pub struct Restd {
    child: std::process::Child,
    /// `https://127.0.0.1:PORT`
    pub base: String,
}

impl Restd {
    pub fn start(c: &TestCluster) -> Restd {
        let config = c.path().join("n1").join("node.toml");
        let mut child = Command::new(corral_bin())
            .args(["restd", "--node-config", &config.display().to_string(), "--listen", "127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start corral restd");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("restd's stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("read restd's first line");
        // "corral restd: https://127.0.0.1:PORT/slurm/v0.0.38/ ..."
        let base = line.split_whitespace().nth(2).and_then(|u| u.split("/slurm/").next()).unwrap_or_else(|| panic!("{line}")).to_string();
        Restd { child, base }
    }
}

impl Drop for Restd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
