//! The real-process chaos run: a local cluster of `corrald` processes driven through the
//! `corral` binary, a seeded workload and fault schedule, a history in `DIR/history.jsonl`, and
//! the checks run on it once everything is healed. Every wait has a deadline.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::outcomes::{check_job_outcomes, Submitted};
use crate::rig::{Frozen, Rig};
use crate::ProcessSpan;

mod deaths;
mod faults;
mod inject;
mod on_rig;

use deaths::{DeathWatch, Liveness};
pub use faults::Fault;
use faults::{plan_faults, PlannedFault};
use inject::FaultSchedule;

/// Settings the cluster is started with (the recovery bounds below depend on them).
const NODE_DOWN_AFTER_MS: u64 = 3_000;
const GPUS_PER_NODE: u32 = 8;
/// One client call may take this long before its outcome is "unknown".
const CALL_TIMEOUT_MS: u64 = 15_000;
/// A cluster sample (`--server ADDR cluster`) gives up sooner: a paused node must not stall the run.
const SAMPLE_TIMEOUT_MS: u64 = 2_000;
/// After healing, a submit must succeed within this.
const RECOVERY_BOUND_MS: u64 = 30_000;
/// After healing, every acknowledged job must be final within this.
const SETTLE_BOUND_MS: u64 = 180_000;
/// Voters must agree on the applied index and the job list within this.
const CONVERGE_BOUND_MS: u64 = 30_000;

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub nodes: u32,
    pub voters: u32,
    pub duration_ms: u64,
    pub seed: u64,
    pub faults: Vec<Fault>,
    pub dir: Option<PathBuf>,
    pub corral: PathBuf,
    pub keep: bool,
    /// On the rig: `scripts/hosts.sh`, which boots `nodes` hosts (every one a voter up to
    /// `voters_max`, 3) and injects the faults; none: a local cluster of processes.
    pub rig: Option<PathBuf>,
}

impl RunOptions {
    /// The one command line that repeats this run.
    pub fn repro(&self) -> String {
        let faults: Vec<&str> = self.faults.iter().map(|f| f.name()).collect();
        if self.rig.is_some() {
            return format!(
                "corral-chaos rig --hosts {} --duration {}ms --faults {} --seed {}",
                self.nodes,
                self.duration_ms,
                faults.join(","),
                self.seed
            );
        }
        format!(
            "corral-chaos run --nodes {} --voters {} --duration {}ms --faults {} --seed {}",
            self.nodes,
            self.voters,
            self.duration_ms,
            faults.join(","),
            self.seed
        )
    }
}

#[derive(Clone, Debug)]
pub struct RunOutcome {
    pub summary: String,
    pub violations: Vec<String>,
    pub dir: PathBuf,
    pub repro: String,
    /// Final state of every acknowledged job, by id.
    pub final_states: BTreeMap<u64, String>,
    pub faults_injected: BTreeMap<String, u32>,
    pub recovery_ms: Option<u64>,
}

/// `120s`, `2m`, `90000ms` or a plain number of seconds.
pub fn parse_duration_ms(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1_000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000)
    } else {
        (t, 1_000)
    };
    let n: u64 = num.trim().parse().with_context(|| format!("parse duration '{text}' (e.g. 120s, 2m, 90000ms)"))?;
    Ok(n.saturating_mul(scale))
}

/// `corral` next to this executable (or its parent, for test executables in `deps/`), else PATH.
pub fn find_corral() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locate this executable")?;
    for dir in exe.ancestors().skip(1).take(2) {
        let p = dir.join("corral");
        if p.exists() {
            return Ok(p);
        }
    }
    Ok(PathBuf::from("corral"))
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Whether `pid` still runs: it exists and is not a zombie (a dead process that its parent, a
/// paused `corrald` say, has not reaped).
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks whether the process exists.
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) != Some("Z")
}

/// The outcome of one client call, as the history records it.
#[derive(Clone, Debug)]
pub enum CallResult {
    Ok(Value),
    Error(String),
    /// Timed out: it may or may not have taken effect.
    Unknown,
}

/// Appends JSON lines to `DIR/history.jsonl`.
struct History {
    file: Mutex<File>,
}

impl History {
    fn record(&self, mut event: Value) {
        if let Some(obj) = event.as_object_mut() {
            obj.insert("t_ms".into(), json!(now_ms()));
        }
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(f, "{event}");
    }
}

struct Harness {
    dir: PathBuf,
    work: PathBuf,
    corral: PathBuf,
    corrald: Option<PathBuf>,
    history: Arc<History>,
    /// Node name -> QUIC address.
    addrs: BTreeMap<String, String>,
    /// Nodes this harness stopped (SIGKILL or SIGTERM) and has not started again.
    down: BTreeSet<String>,
    paused: BTreeSet<String>,
    partitioned: BTreeSet<String>,
    calls: BTreeMap<&'static str, (u32, u32, u32)>,
    /// The booted hosts, on the rig; none for a local cluster.
    rig: Option<Rig>,
    /// When each host was frozen, on the rig.
    frozen: Vec<Frozen>,
}

impl Harness {
    /// Runs `corral ARGS` with a deadline; never hangs.
    fn exec(&self, args: &[String], timeout_ms: u64) -> CallResult {
        let mut cmd = Command::new(&self.corral);
        cmd.args(args).current_dir(&self.work);
        if let Some(d) = &self.corrald {
            cmd.env("CORRALD", d);
        }
        // An answer as large as a `queue --all` of a few hundred jobs is read while it comes.
        let out = match crate::deadline::output_within(&mut cmd, Duration::from_millis(timeout_ms)) {
            Ok(Some(out)) => out,
            Ok(None) => return CallResult::Unknown,
            Err(e) => return CallResult::Error(format!("run {}: {e}", self.corral.display())),
        };
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
            return CallResult::Error(if err.is_empty() { format!("exit {:?}", out.status.code()) } else { err });
        }
        let text = String::from_utf8_lossy(&out.stdout);
        CallResult::Ok(serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.trim().to_string())))
    }

    /// A recorded client call: `corral --cluster DIR [--server ADDR] --json ARGS`.
    fn call(&mut self, op: &'static str, server: Option<&str>, args: &[String], timeout_ms: u64) -> CallResult {
        let mut all = vec!["--cluster".to_string(), self.dir.display().to_string()];
        if let Some(s) = server {
            all.push("--server".into());
            all.push(s.to_string());
        }
        all.push("--json".into());
        all.extend_from_slice(args);
        let start = now_ms();
        let r = self.exec(&all, timeout_ms);
        let (outcome, detail) = match &r {
            CallResult::Ok(v) => ("ok", v.clone()),
            CallResult::Error(e) => ("error", json!(e)),
            CallResult::Unknown => ("unknown", Value::Null),
        };
        let counts = self.calls.entry(op).or_default();
        match outcome {
            "ok" => counts.0 += 1,
            "error" => counts.1 += 1,
            _ => counts.2 += 1,
        }
        // Samples are many and big: record only their essentials.
        let detail = if op == "sample" || op == "queue" { Value::Null } else { detail };
        self.history.record(
            json!({"kind": "call", "op": op, "server": server, "args": args, "start_ms": start, "outcome": outcome, "answer": detail}),
        );
        r
    }

    fn dev(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        // `corral dev VERB --dir DIR ...`
        all.insert(2.min(all.len()), "--dir".into());
        all.insert(3.min(all.len()), self.dir.display().to_string());
        match self.exec(&all, 120_000) {
            CallResult::Ok(_) => Ok(()),
            CallResult::Error(e) => bail!("corral {}: {e}", args.join(" ")),
            CallResult::Unknown => bail!("corral {}: no answer within 120 s", args.join(" ")),
        }
    }

    fn fault_event(&self, action: &str, node: &str, detail: Value) {
        self.history.record(json!({"kind": "fault", "action": action, "node": node, "detail": detail}));
    }

    fn signal(&mut self, node: &str, sig: &str) -> anyhow::Result<()> {
        self.dev(&["dev", "signal", node, sig]).with_context(|| format!("send SIG{sig} to {node}"))?;
        self.fault_event(&format!("SIG{sig}"), node, Value::Null);
        match sig {
            "KILL" | "TERM" | "USR2" => {
                self.down.insert(node.to_string());
                self.paused.remove(node);
            }
            "STOP" => {
                self.paused.insert(node.to_string());
            }
            "CONT" => {
                self.paused.remove(node);
            }
            _ => {}
        }
        Ok(())
    }

    fn start(&mut self, node: &str) -> anyhow::Result<()> {
        self.dev(&["dev", "start", node]).with_context(|| format!("start {node} again"))?;
        self.fault_event("start", node, Value::Null);
        self.down.remove(node);
        Ok(())
    }

    fn partition_file(&self, node: &str) -> PathBuf {
        self.dir.join(node).join("data").join("fault-partition")
    }

    fn partition(&mut self, node: &str, cut_from: &[String]) -> anyhow::Result<()> {
        let mut text = String::new();
        if cut_from.is_empty() {
            text.push_str("*\n");
        }
        for peer in cut_from {
            text.push_str(peer);
            text.push('\n');
            if let Some(a) = self.addrs.get(peer) {
                text.push_str(a);
                text.push('\n');
            }
        }
        let path = self.partition_file(node);
        std::fs::write(&path, &text).with_context(|| format!("write {}", path.display()))?;
        self.fault_event("partition", node, json!(cut_from));
        self.partitioned.insert(node.to_string());
        Ok(())
    }

    /// Writes `value` into `node`'s fault file for `fault` (slow disk: a WAL sync delay in ms;
    /// clock skew: a signed offset in ms).
    fn set_fault_file(&mut self, node: &str, fault: Fault, value: i64) -> anyhow::Result<()> {
        let Some(name) = fault.file_name() else { bail!("{} has no fault file", fault.name()) };
        let path = self.dir.join(node).join("data").join(name);
        std::fs::write(&path, format!("{value}\n")).with_context(|| format!("write {}", path.display()))?;
        self.fault_event(fault.name(), node, json!(value));
        Ok(())
    }

    fn clear_fault_file(&mut self, node: &str, fault: Fault) -> anyhow::Result<()> {
        let Some(name) = fault.file_name() else { return Ok(()) };
        let path = self.dir.join(node).join("data").join(name);
        if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
            self.fault_event(&format!("heal-{}", fault.name()), node, Value::Null);
        }
        Ok(())
    }

    fn heal_partition(&mut self, node: &str) -> anyhow::Result<()> {
        let path = self.partition_file(node);
        if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
        }
        self.fault_event("heal-partition", node, Value::Null);
        self.partitioned.remove(node);
        Ok(())
    }

    /// Ends every fault: continues paused nodes, removes partitions, starts stopped nodes.
    fn heal_all(&mut self) -> anyhow::Result<()> {
        if self.rig.is_some() {
            return on_rig::heal_all(self);
        }
        for n in self.paused.clone() {
            self.signal(&n, "CONT")?;
        }
        for n in self.addrs.keys().cloned().collect::<Vec<_>>() {
            if self.partition_file(&n).exists() {
                self.heal_partition(&n)?;
            }
            self.clear_fault_file(&n, Fault::SlowDisk)?;
            self.clear_fault_file(&n, Fault::ClockSkew)?;
        }
        for n in self.down.clone() {
            self.start(&n)?;
        }
        Ok(())
    }

    /// (name, role) of every member as the cluster reports it; empty if no node answers.
    fn members(&mut self) -> Vec<(String, String)> {
        match self.call("members", None, &["cluster".into()], CALL_TIMEOUT_MS) {
            CallResult::Ok(v) => v["members"]
                .as_array()
                .map(|m| m.iter().filter_map(|m| Some((m["name"].as_str()?.to_string(), m["role"].as_str()?.to_string()))).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        }
    }
}

/// A job body that records its start and end (see `ProcessSpan`), sleeps `$1` s and exits `$2`.
const JOB_BODY: &str = r#"rec() { echo "$1 $(date +%s%3N) $CORRAL_JOB_ID $CORRAL_RUN $CORRAL_NODE ${CUDA_VISIBLE_DEVICES:--} $$" >> spans.log; }; trap 'rec end; exit 143' TERM; rec start; sleep $1 & wait $!; rec end; exit $2"#;

fn job_cmd(seconds: u32, exit_code: i32) -> Vec<String> {
    vec!["sh".into(), "-c".into(), JOB_BODY.into(), "job".into(), seconds.to_string(), exit_code.to_string()]
}

/// A Slurm batch script (`corral submit --batch`): on the first node it runs the job body on
/// every node as an `srun` step, then exits `$2` whatever the step did (a step cut short by a
/// fault must not change the outcome the checker expects).
fn batch_script(corral: &std::path::Path) -> String {
    let quoted = JOB_BODY.replace('\'', "'\\''");
    format!("#!/bin/sh\n'{}' slurm srun -N2 sh -c '{quoted}' job \"$1\" 0\nexit \"$2\"\n", corral.display())
}

/// Runs the whole scenario: start, workload with faults, heal, settle, verify.
pub fn run(opts: &RunOptions) -> anyhow::Result<RunOutcome> {
    if opts.voters > opts.nodes || !matches!(opts.voters, 1 | 3 | 5) {
        bail!("--voters must be 1, 3 or 5 and at most --nodes (got {} of {})", opts.voters, opts.nodes);
    }
    let dir = match &opts.dir {
        Some(d) => d.clone(),
        // The rig's slow disk throttles a block device: not a tmpfs.
        None if opts.rig.is_some() => PathBuf::from("/var/tmp").join(format!("corral-chaos-rig-{}-{}", opts.seed, now_ms())),
        None => std::env::temp_dir().join(format!("corral-chaos-{}-{}", opts.seed, now_ms())),
    };
    if dir.join("client.toml").exists() {
        bail!("{} already holds a cluster: pass a new --dir", dir.display());
    }
    if let Some(f) = opts.faults.iter().find(|f| f.rig_only() && opts.rig.is_none()) {
        bail!("fault '{}' is of a whole host: only `corral-chaos rig` injects it", f.name());
    }
    // On the rig, jobs run in the hosts: their working directory is the one every host mounts.
    let work = match opts.rig {
        Some(_) => Rig::shared(&dir).join("work"),
        None => dir.join("work"),
    };
    std::fs::create_dir_all(&work).with_context(|| format!("create {}", work.display()))?;
    let history_path = dir.join("history.jsonl");
    let file = File::create(&history_path).with_context(|| format!("create {}", history_path.display()))?;
    let history = Arc::new(History { file: Mutex::new(file) });
    let corrald = opts.corral.parent().map(|p| p.join("corrald")).filter(|p| p.exists());
    let mut h = Harness {
        dir: dir.clone(),
        work: work.clone(),
        corral: opts.corral.clone(),
        corrald,
        history,
        addrs: BTreeMap::new(),
        down: BTreeSet::new(),
        paused: BTreeSet::new(),
        partitioned: BTreeSet::new(),
        calls: BTreeMap::new(),
        rig: None,
        frozen: Vec::new(),
    };
    h.history.record(json!({"kind": "run", "seed": opts.seed, "repro": opts.repro(), "nodes": opts.nodes, "voters": opts.voters}));
    if let Some(script) = &opts.rig {
        return on_rig::run(h, script, opts);
    }
    let nodes = opts.nodes.to_string();
    let voters = opts.voters.to_string();
    let down_after = NODE_DOWN_AFTER_MS.to_string();
    let gpus = format!("h100:{GPUS_PER_NODE}");
    let ckpt = dir.join("ckpt").display().to_string();
    h.dev(&[
        "dev",
        "up",
        "--nodes",
        &nodes,
        "--voters-max",
        &voters,
        "--gpus",
        &gpus,
        "--node-down-after-ms",
        &down_after,
        "--checkpoint-root",
        &ckpt,
        // Finished jobs move to the accounting store within the run, so the checkers find
        // acknowledged jobs there too.
        "--min-job-age-s",
        "20",
    ])
    .context("start the cluster")?;

    let result = drive_and_check(&mut h, opts);
    // Always heal and stop the cluster, whatever happened.
    let _ = h.heal_all();
    let down = h.dev(&["dev", "down"]);
    finish(result, down, opts, &dir)
}

/// The outcome, with a failed tear-down as a violation; the directory removed after a clean
/// run that asked for none.
fn finish(
    result: anyhow::Result<RunOutcome>,
    down: anyhow::Result<()>,
    opts: &RunOptions,
    dir: &std::path::Path,
) -> anyhow::Result<RunOutcome> {
    let mut outcome = result?;
    if let Err(e) = down {
        outcome.violations.push(format!("stopping the cluster failed: {e:#}"));
    }
    if outcome.violations.is_empty() && !opts.keep && opts.dir.is_none() {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(outcome)
}

fn drive_and_check(h: &mut Harness, opts: &RunOptions) -> anyhow::Result<RunOutcome> {
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let plan = plan_faults(&mut rng, &opts.faults, opts.duration_ms, opts.rig.is_some());
    h.history.record(json!({"kind": "fault-plan", "plan": format!("{plan:?}")}));
    learn_addresses(h, opts.nodes)?;
    let liveness = match &h.rig {
        Some(_) => Liveness::Rig(h.dir.clone()),
        None => Liveness::Local,
    };
    let watch = DeathWatch::start(h.work.join("spans.log"), liveness.clone());
    let mut faults = FaultSchedule { plan, next: 0, pending_heal: None, injected: BTreeMap::new() };
    let window = (now_ms(), now_ms() + opts.duration_ms);
    let mut workload = drive_workload(h, opts, &mut faults, &mut rng)?;
    h.history.record(json!({"kind": "phase", "phase": "heal"}));
    faults.heal_pending(h)?;
    h.heal_all().context("heal every fault")?;
    let mut violations: Vec<String> = Vec::new();

    let recovery_ms = probe_recovery_ms(h, &mut workload.submitted);
    if recovery_ms.is_none() {
        violations.push(format!("no submit succeeded within {RECOVERY_BOUND_MS} ms after the last fault was healed"));
    }
    let jobs = settle_jobs(h, &workload.submitted, &mut violations);
    // Voters converge: same applied index and the same (id, state, run) list.
    let converged = check_voters(h, &mut violations);
    let spans = collect_spans(h, watch, &liveness, &workload.submitted, &mut violations);
    let (spans, resumed) = crate::rig::resumed_after_thaw(spans, &h.frozen);
    for r in &resumed {
        h.history.record(json!({"kind": "resumed-after-thaw", "job": r.job, "run": r.run, "node": r.node, "ran_ms": r.ran_ms}));
    }
    violations.extend(crate::check_exclusive_gpus(&spans).iter().map(|v| v.to_string()));
    violations.extend(crate::check_never_twice(&spans).iter().map(|v| v.to_string()));
    let ranks = |job: u64| workload.submitted.get(&job).and_then(|s| s.ranks);
    violations.extend(crate::check_ranks_at_once(&spans, ranks).iter().map(|v| v.to_string()));
    violations.extend(crate::check_one_leader_per_term(&workload.leader_claims).iter().map(|v| v.to_string()));
    violations.extend(check_job_outcomes(&workload.submitted, &jobs, &spans));

    let final_states: BTreeMap<u64, String> = workload
        .submitted
        .keys()
        .map(|id| (*id, jobs.get(id).and_then(|j| j["state"].as_str()).unwrap_or("MISSING").to_string()))
        .collect();
    let load = load_pct(h, &spans, window);
    let findings = Findings { jobs, final_states, spans_count: spans.len(), load, resumed, recovery_ms, converged, violations };
    let summary = summarize(h, opts, &workload, &faults.injected, &findings);
    let Findings { final_states, violations, .. } = findings;
    h.history.record(json!({"kind": "verdict", "violations": violations, "recovery_ms": recovery_ms}));
    let faults_injected = faults.injected;
    Ok(RunOutcome { summary, violations, dir: h.dir.clone(), repro: opts.repro(), final_states, faults_injected, recovery_ms })
}

/// Asks the cluster for its members until it lists all `nodes` of them, and keeps each
/// node's address; gives up after 30 s.
fn learn_addresses(h: &mut Harness, nodes: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.addrs.len() < nodes as usize {
        if Instant::now() > deadline {
            bail!("the cluster did not list all {} members within 30 s", nodes);
        }
        if let CallResult::Ok(v) = h.call("members", None, &["cluster".into()], CALL_TIMEOUT_MS) {
            for m in v["members"].as_array().into_iter().flatten() {
                if let (Some(n), Some(a)) = (m["name"].as_str(), m["addr"].as_str()) {
                    h.addrs.insert(n.to_string(), a.to_string());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// What the workload did: the jobs acknowledged and what is expected of them, and the
/// (term, leader) claims sampled.
struct Workload {
    submitted: BTreeMap<u64, Submitted>,
    leader_claims: Vec<(u64, String)>,
}

/// Runs the workload for the whole run: faults on schedule, submits and cancels at random,
/// a leader sample every 1.5 s.
fn drive_workload(h: &mut Harness, opts: &RunOptions, faults: &mut FaultSchedule, rng: &mut StdRng) -> anyhow::Result<Workload> {
    let mut w = Workload { submitted: BTreeMap::new(), leader_claims: Vec::new() };
    // Jobs keep coming for the whole run (about one per 1.5 s), bounded.
    let submits_max = (opts.duration_ms / 1_500).clamp(100, 5_000) as usize;
    // The rig's jobs run in its hosts, with the hosts' CPUs: more of them keep it about half busy.
    let (submit_pct, submits_max) = if h.rig.is_some() { (60, submits_max * 3 / 2) } else { (45, submits_max) };
    let started = Instant::now();
    let mut last_sample = Instant::now() - Duration::from_secs(10);
    let run_for = Duration::from_millis(opts.duration_ms);
    while started.elapsed() < run_for {
        let t_ms = started.elapsed().as_millis() as u64;
        faults.step(h, t_ms, rng)?;
        // Workload.
        let roll = rng.gen_range(0..100);
        if roll < submit_pct && w.submitted.len() < submits_max {
            submit_one(h, rng, &mut w.submitted);
        } else if roll < submit_pct + 5 && !w.submitted.is_empty() {
            cancel_one(h, rng, &mut w.submitted);
        }
        // Leader samples from every node.
        if last_sample.elapsed() >= Duration::from_millis(1_500) {
            last_sample = Instant::now();
            sample_leaders(h, &mut w.leader_claims);
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(100..400)));
    }
    Ok(w)
}

/// Cancels one acknowledged job picked at random, and marks it cancelled unless the cluster
/// refused because it had already ended.
fn cancel_one(h: &mut Harness, rng: &mut StdRng, submitted: &mut BTreeMap<u64, Submitted>) {
    let ids: Vec<u64> = submitted.keys().copied().collect();
    let id = ids[rng.gen_range(0..ids.len())];
    // An error or a time-out may still have committed the cancel: count every attempt
    // but the ones the cluster refused because the job had already ended.
    let r = h.call("cancel", None, &["cancel".into(), id.to_string()], CALL_TIMEOUT_MS);
    let refused = matches!(&r, CallResult::Error(e) if e.contains("already finished"));
    if let (false, Some(s)) = (refused, submitted.get_mut(&id)) {
        s.cancelled = true;
    }
}

/// Recovery: submits a probe job until one succeeds, within `RECOVERY_BOUND_MS` of now (just
/// healed); the ms it took, or `None`. The probe joins `submitted`.
fn probe_recovery_ms(h: &mut Harness, submitted: &mut BTreeMap<u64, Submitted>) -> Option<u64> {
    let healed = Instant::now();
    while healed.elapsed() < Duration::from_millis(RECOVERY_BOUND_MS) {
        let args: Vec<String> = ["submit", "--", "true"].iter().map(|s| s.to_string()).collect();
        if let CallResult::Ok(v) = h.call("probe", None, &args, 5_000) {
            if let Some(id) = v["job_id"].as_u64() {
                let recovery_ms = healed.elapsed().as_millis() as u64;
                submitted.insert(id, Submitted { requeue: false, exit_code: 0, cancelled: false, time_limited: false, ranks: Some(1) });
                return Some(recovery_ms);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Settle: polls the queue until every acknowledged job is final or `SETTLE_BOUND_MS` passed;
/// records a violation for each one missing or not final, and returns the last queue by id.
fn settle_jobs(h: &mut Harness, submitted: &BTreeMap<u64, Submitted>, violations: &mut Vec<String>) -> BTreeMap<u64, Value> {
    let mut jobs: BTreeMap<u64, Value> = BTreeMap::new();
    let settle_deadline = Instant::now() + Duration::from_millis(SETTLE_BOUND_MS);
    loop {
        if let CallResult::Ok(v) = h.call("queue", None, &["queue".into(), "--all".into()], CALL_TIMEOUT_MS) {
            jobs = v.as_array().into_iter().flatten().filter_map(|j| Some((j["id"].as_u64()?, j.clone()))).collect();
            let open = submitted
                .keys()
                .filter(|id| jobs.get(id).is_none_or(|j| matches!(j["state"].as_str(), Some("PENDING" | "RUNNING"))))
                .count();
            if open == 0 {
                break;
            }
        }
        if Instant::now() > settle_deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1_000));
    }
    for id in submitted.keys() {
        match jobs.get(id).and_then(|j| j["state"].as_str()) {
            None => violations.push(format!("acknowledged job {id} is missing from the queue")),
            Some(s @ ("PENDING" | "RUNNING")) => violations.push(format!("job {id} still {s} {SETTLE_BOUND_MS} ms after healing")),
            Some(_) => {}
        }
    }
    jobs
}

/// Process spans: stops the death watch, reads the spans log, ends each open span at its
/// process's observed death (a violation where the process still runs), and records the spans.
fn collect_spans(
    h: &mut Harness,
    watch: DeathWatch,
    liveness: &Liveness,
    submitted: &BTreeMap<u64, Submitted>,
    violations: &mut Vec<String>,
) -> Vec<ProcessSpan> {
    std::thread::sleep(Duration::from_millis(300));
    let deaths = watch.finish();
    // Every job records its start there: a file that cannot be read (or none, with jobs
    // acknowledged) would leave the checkers below an empty history that always passes.
    let spans_log = h.work.join("spans.log");
    let text = match std::fs::read_to_string(&spans_log) {
        Ok(text) => text,
        Err(e) if !submitted.is_empty() => {
            violations.push(format!("cannot read the process spans at {}: {e}; the process checks did not run", spans_log.display()));
            String::new()
        }
        Err(_) => String::new(),
    };
    let mut spans = crate::parse_spans(&text);
    let open: BTreeSet<(String, i32)> =
        spans.iter().filter(|s| s.end_ms.is_none()).filter_map(|s| Some((s.node.clone(), s.pid?))).collect();
    let alive = liveness.live(&open);
    for s in spans.iter_mut().filter(|s| s.end_ms.is_none()) {
        let Some(key) = s.pid.map(|p| (s.node.clone(), p)) else { continue };
        if let Some(ms) = deaths.get(&key) {
            s.end_ms = Some(*ms);
        } else if alive.contains(&key) {
            violations.push(format!("process {:?} of job {} run {} on {} still runs after its job is final", s.pid, s.job, s.run, s.node));
        }
    }
    // A frozen host's processes ran nothing while it was frozen.
    let spans = crate::rig::cut_frozen(spans, &h.frozen);
    for s in &spans {
        h.history.record(json!({"kind": "span", "job": s.job, "run": s.run, "node": s.node, "gpus": s.gpus, "start_ms": s.start_ms, "end_ms": s.end_ms, "pid": s.pid}));
    }
    spans
}

/// What the checks after the workload found, for the summary and the outcome.
struct Findings {
    /// The last queue, by job id.
    jobs: BTreeMap<u64, Value>,
    /// Final state of every acknowledged job, by id.
    final_states: BTreeMap<u64, String>,
    spans_count: usize,
    /// The share of the cluster's CPUs and GPUs that job processes held while the workload ran.
    load: Option<(f64, f64)>,
    /// Runs a frozen host resumed on its thaw until their fence killed them.
    resumed: Vec<crate::rig::Resumed>,
    recovery_ms: Option<u64>,
    converged: bool,
    violations: Vec<String>,
}

/// The share (percent) of the cluster's CPUs and GPUs that job processes held within `window`
/// (ms since the epoch), each job process counted as one CPU; none if the cluster's size is
/// unknown.
fn load_pct(h: &mut Harness, spans: &[ProcessSpan], window: (u64, u64)) -> Option<(f64, f64)> {
    let CallResult::Ok(nodes) = h.call("nodes", None, &["nodes".into()], CALL_TIMEOUT_MS) else { return None };
    let total = |key: &str| nodes.as_array().map(|a| a.iter().filter_map(|n| n[key].as_u64()).sum::<u64>()).unwrap_or(0);
    let (cpus, gpus) = (total("cpus_total"), total("gpus_total"));
    let span_ms = window.1.saturating_sub(window.0);
    if cpus == 0 || gpus == 0 || span_ms == 0 {
        return None;
    }
    let held = |s: &ProcessSpan| s.end_ms.unwrap_or(window.1).min(window.1).saturating_sub(s.start_ms.max(window.0));
    let cpu_ms: u64 = spans.iter().map(held).sum();
    let gpu_ms: u64 = spans.iter().map(|s| held(s) * s.gpus.len() as u64).sum();
    Some((100.0 * cpu_ms as f64 / (cpus * span_ms) as f64, 100.0 * gpu_ms as f64 / (gpus * span_ms) as f64))
}

/// The run's summary, one `name value` line per figure.
fn summarize(h: &Harness, opts: &RunOptions, w: &Workload, injected: &BTreeMap<String, u32>, f: &Findings) -> String {
    let mut by_state: BTreeMap<&str, u32> = BTreeMap::new();
    for s in f.final_states.values() {
        *by_state.entry(s.as_str()).or_default() += 1;
    }
    let terms: BTreeSet<u64> = w.leader_claims.iter().map(|(t, _)| *t).collect();
    let mut summary = String::new();
    summary.push_str(&format!(
        "corral-chaos run, seed {}, {} nodes ({} voters), {} ms\n",
        opts.seed, opts.nodes, opts.voters, opts.duration_ms
    ));
    summary.push_str(&format!("  {:<28}{}\n", "cluster dir", h.dir.display()));
    summary.push_str(&format!("  {:<28}{}\n", "jobs acknowledged", w.submitted.len()));
    for (s, n) in &by_state {
        summary.push_str(&format!("  {:<28}{n}\n", format!("  {s}")));
    }
    summary.push_str(&format!("  {:<28}{}\n", "requeued runs", f.jobs.values().filter_map(|j| j["restart_count"].as_u64()).sum::<u64>()));
    let repairs: usize = f.jobs.values().filter_map(|j| j["repairs"].as_array().map(Vec::len)).sum();
    summary.push_str(&format!("  {:<28}{repairs}\n", "ranks repaired onto spares"));
    for (op, (ok, err, unk)) in &h.calls {
        summary.push_str(&format!("  {:<28}ok {ok}, error {err}, unknown {unk}\n", format!("calls {op}")));
    }
    let injected: Vec<String> = injected.iter().map(|(fault, n)| format!("{fault} x{n}")).collect();
    summary.push_str(&format!("  {:<28}{}\n", "faults injected", if injected.is_empty() { "none".into() } else { injected.join(", ") }));
    summary.push_str(&format!("  {:<28}{} terms, {} samples\n", "leaders observed", terms.len(), w.leader_claims.len()));
    summary.push_str(&format!("  {:<28}{}\n", "process spans", f.spans_count));
    if h.rig.is_some() {
        let max_ms = f.resumed.iter().map(|r| r.ran_ms).max().unwrap_or(0);
        let line = format!("{}, killed at most {max_ms} ms after the thaw", f.resumed.len());
        summary.push_str(&format!("  {:<28}{line}\n", "runs resumed by a thaw"));
    }
    if let Some((cpus, gpus)) = f.load {
        summary.push_str(&format!("  {:<28}CPUs {cpus:.1}%, GPUs {gpus:.1}% (while the workload ran)\n", "held by job processes"));
    }
    summary.push_str(&format!("  {:<28}{}\n", "recovery after heal", f.recovery_ms.map_or("NONE".into(), |ms| format!("{ms} ms"))));
    summary.push_str(&format!("  {:<28}{}\n", "voters converged", if f.converged { "yes" } else { "NO" }));
    summary.push_str(&format!("  {:<28}{}\n", "violations", f.violations.len()));
    summary.push_str(&format!("  {:<28}{}", "history", h.dir.join("history.jsonl").display()));
    summary
}

fn submit_one(h: &mut Harness, rng: &mut StdRng, submitted: &mut BTreeMap<u64, Submitted>) {
    let long = rng.gen_bool(0.3);
    let seconds: u32 = if long { rng.gen_range(12..30) } else { rng.gen_range(1..5) };
    let exit_code = if rng.gen_range(0..10) == 0 { 3 } else { 0 };
    let requeue = rng.gen_bool(0.5);
    let gang = rng.gen_range(0..6) == 0;
    let gpus = if gang { rng.gen_range(1..=GPUS_PER_NODE) } else { rng.gen_range(1..=4) };
    let time_limited = long && rng.gen_range(0..4) == 0;
    let batch = gang && rng.gen_bool(0.5);
    // Half the command gangs hold a spare: a lost rank 1 is repaired onto it, not requeued.
    let spare = gang && !batch && rng.gen_bool(0.5);
    let mut args: Vec<String> = vec!["submit".into(), "--gres".into(), format!("gpu:{gpus}")];
    if gang {
        args.extend(["-N".into(), "2".into()]);
    }
    if spare {
        args.extend(["--spare-nodes".into(), "1".into()]);
    }
    if batch {
        args.push("--batch".into());
    }
    if requeue {
        args.push("--requeue".into());
    }
    if time_limited {
        args.extend(["--time".into(), "0:08".into()]);
    }
    if h.rig.is_some() {
        // The rig's hosts have this machine's memory, not a GPU server's: the default of
        // 16 GiB a GPU would leave room for one job a host.
        args.extend(["--mem".into(), "256M".into()]);
    }
    if batch {
        let script = h.work.join("batch.sh");
        if !script.exists() {
            // On the rig, the hosts' own `corral` (deploy/install.sh puts it there).
            let corral = if h.rig.is_some() { PathBuf::from("/usr/local/bin/corral") } else { h.corral.clone() };
            if let Err(e) = std::fs::write(&script, batch_script(&corral)) {
                eprintln!("write {}: {e}", script.display());
                return;
            }
        }
        args.extend([script.display().to_string(), seconds.to_string(), exit_code.to_string()]);
    } else {
        args.push("--".into());
        args.extend(job_cmd(seconds, exit_code));
    }
    if let CallResult::Ok(v) = h.call("submit", None, &args, CALL_TIMEOUT_MS) {
        if let Some(id) = v["job_id"].as_u64() {
            let ranks = match (batch, gang) {
                (true, _) => None,
                (false, true) => Some(2),
                (false, false) => Some(1),
            };
            submitted.insert(id, Submitted { requeue, exit_code, cancelled: false, time_limited, ranks });
        }
    }
}

/// Asks every reachable node who leads; records (term, node) when a node says it leads itself.
fn sample_leaders(h: &mut Harness, claims: &mut Vec<(u64, String)>) {
    let targets: Vec<(String, String)> =
        h.addrs.iter().filter(|(n, _)| !h.down.contains(*n) && !h.paused.contains(*n)).map(|(n, a)| (n.clone(), a.clone())).collect();
    for (name, addr) in targets {
        if let CallResult::Ok(v) = h.call("sample", Some(&addr), &["cluster".into()], SAMPLE_TIMEOUT_MS) {
            let (Some(term), Some(leader)) = (v["term"].as_u64(), v["leader"].as_str()) else { continue };
            let by = v["answered_by"].as_str().unwrap_or(&name).to_string();
            h.history.record(json!({"kind": "leader-sample", "node": by, "term": term, "leader": leader}));
            if by == leader {
                claims.push((term, leader.to_string()));
            }
        }
    }
}

/// What one voter reports: its applied index and its sorted (id, state, run) job list.
type VoterView = (u64, Vec<(u64, String, u64)>);

/// Every voter reports the same applied index and the same jobs; waits up to the bound.
fn check_voters(h: &mut Harness, violations: &mut Vec<String>) -> bool {
    let deadline = Instant::now() + Duration::from_millis(CONVERGE_BOUND_MS);
    let mut last;
    loop {
        let members = h.members();
        let voters: Vec<(String, String)> = members
            .iter()
            .filter(|(_, r)| r == "voter" || r == "leader")
            .filter_map(|(n, _)| h.addrs.get(n).map(|a| (n.clone(), a.clone())))
            .collect();
        let mut views: BTreeMap<String, VoterView> = BTreeMap::new();
        for (name, addr) in &voters {
            let applied = match h.call("converge", Some(addr), &["cluster".into()], CALL_TIMEOUT_MS) {
                CallResult::Ok(v) => v["applied_index"].as_u64(),
                _ => None,
            };
            let jobs = match h.call("queue", Some(addr), &["queue".into(), "--all".into()], CALL_TIMEOUT_MS) {
                CallResult::Ok(v) => v.as_array().map(|a| {
                    let mut l: Vec<(u64, String, u64)> = a
                        .iter()
                        .map(|j| {
                            (j["id"].as_u64().unwrap_or(0), j["state"].as_str().unwrap_or("").to_string(), j["run"].as_u64().unwrap_or(0))
                        })
                        .collect();
                    l.sort();
                    l
                }),
                _ => None,
            };
            if let (Some(a), Some(j)) = (applied, jobs) {
                views.insert(name.clone(), (a, j));
            }
        }
        let distinct: BTreeSet<&VoterView> = views.values().collect();
        if views.len() == voters.len() && !voters.is_empty() && distinct.len() == 1 {
            return true;
        }
        last = format!(
            "{} of {} voters answered; applied indexes {:?}",
            views.len(),
            voters.len(),
            views.iter().map(|(n, v)| (n, v.0)).collect::<Vec<_>>()
        );
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    violations.push(format!("voters did not converge within {CONVERGE_BOUND_MS} ms: {last}"));
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_ms("120s").ok(), Some(120_000));
        assert_eq!(parse_duration_ms("2m").ok(), Some(120_000));
        assert_eq!(parse_duration_ms("1500ms").ok(), Some(1_500));
        assert_eq!(parse_duration_ms("45").ok(), Some(45_000));
        assert!(parse_duration_ms("soon").is_err());
    }
}
