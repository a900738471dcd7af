//! `corral bench --history N`: what the control plane costs as its history grows. A local cluster
//! of real `corrald` processes (three voters and an agent) is filled with N finished jobs, each
//! with a 2 KB environment, through the in-process client (submitted held, then cancelled: no
//! process runs, every job goes through the log, the hot state and the accounting store), and the
//! same figures are measured at 0, N/10 and N finished jobs: submit rate and p99 from 16 clients,
//! `sacct -j` and `squeue` as processes, each voter's RSS, bytes on disk per finished job, the
//! last snapshot's build time; then a follower voter is SIGKILLed and the agent that replaces it
//! is timed until its accounting store matches. Ratios are against the empty cluster in the same
//! run. Prints figures; asserts nothing about speed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{ClientRequest, GresRequest, JobQuery, JobSpec, NodeRole, Reply};

use super::stats::{percentile, sorted};
use crate::client::Cluster;
use crate::tools::dev::{self, DevOptions};

/// Concurrent in-process clients.
const CLIENTS: usize = 16;
/// Submissions timed at each level.
const SUBMIT_SAMPLES: usize = 1_600;
const SACCT_SAMPLES: usize = 40;
const SQUEUE_SAMPLES: usize = 20;
const PATIENCE: Duration = Duration::from_secs(30);
/// Jobs submitted (then cancelled) per round of the fill.
const FILL_BATCH: usize = 2_000;

/// A job submitted held (`--hold`: it never starts) with a realistic environment of 2 KB.
fn held_spec(workdir: &str) -> JobSpec {
    let mut spec = JobSpec::command(vec!["true".into()], workdir, "bench");
    spec.name = "bench-history".into();
    spec.gres = Some(GresRequest { gpu_type: None, count: 1, ..Default::default() });
    spec.hold = true;
    spec.mem_mib = 256;
    spec.output = Some("/dev/null".into());
    for i in 0..40 {
        spec.env.insert(format!("BENCH_VAR_{i:02}"), format!("/opt/site/software/pkg-{i:02}/lib:{}", "x".repeat(12)));
    }
    spec
}

/// Figures at one level of history.
struct Level {
    finished: u64,
    submit_per_s: f64,
    submit_p99_ms: f64,
    sacct_p50_ms: f64,
    sacct_p99_ms: f64,
    squeue_p99_ms: f64,
    rss_mib: Vec<(String, f64)>,
    disk_bytes: BTreeMap<String, u64>,
    /// Accounting store files on the leader and its record count.
    accounting_bytes: u64,
    accounting_records: u64,
    snapshot_build_ms: Option<f64>,
}

/// Submits `count` held jobs from [`CLIENTS`] clients, then cancels them; returns their ids, the
/// submit rate and the submit latencies (ms).
async fn submit_and_cancel(cluster: &Arc<Cluster>, workdir: &str, count: usize) -> anyhow::Result<(Vec<u64>, f64, Vec<f64>)> {
    let per = count.div_ceil(CLIENTS);
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let cluster = Arc::clone(cluster);
        let spec = held_spec(workdir);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(per);
            for _ in 0..per {
                let s = Instant::now();
                match cluster.call_patiently(ClientRequest::Submit { spec: spec.clone() }, PATIENCE).await? {
                    Reply::Submitted { job } => out.push((job, s.elapsed().as_secs_f64() * 1000.0)),
                    other => bail!("unexpected reply {other:?}"),
                }
            }
            Ok::<_, anyhow::Error>(out)
        }));
    }
    let mut ids = Vec::new();
    let mut lat = Vec::new();
    for task in tasks {
        for (id, ms) in task.await.context("join submitter")?? {
            ids.push(id);
            lat.push(ms);
        }
    }
    let rate = ids.len() as f64 / t.elapsed().as_secs_f64();
    super::setup::cancel_all(cluster, ids.clone(), CLIENTS, PATIENCE).await?;
    Ok((ids, rate, lat))
}

/// Waits until no finished job is left in the hot state (all moved to the accounting store).
async fn wait_archived(cluster: &Cluster, patience: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + patience;
    let query = JobQuery { finished: true, limit: 1, brief: true, ..Default::default() };
    loop {
        match cluster.call_patiently(ClientRequest::QueryJobs { query: query.clone() }, PATIENCE).await? {
            Reply::JobPage { jobs, .. } if jobs.is_empty() => return Ok(()),
            _ if Instant::now() > deadline => bail!("finished jobs still in the hot state after {patience:?}"),
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Wall times (ms) of `samples` runs of the Slurm command `prog` (through its shim) with args
/// from `args(i)`; fails if one fails.
fn time_shim(shims: &Path, dir: &Path, prog: &str, samples: usize, args: impl Fn(usize) -> Vec<String>) -> anyhow::Result<Vec<f64>> {
    let mut out = Vec::with_capacity(samples);
    for i in 0..samples {
        let t = Instant::now();
        let run =
            Command::new(shims.join(prog)).args(args(i)).env("CORRAL_CLUSTER", dir).output().with_context(|| format!("run {prog}"))?;
        out.push(t.elapsed().as_secs_f64() * 1000.0);
        if !run.status.success() {
            bail!("{prog} failed: {}", String::from_utf8_lossy(&run.stderr));
        }
    }
    Ok(sorted(out))
}

/// The Raft term now (a leader change raises it).
async fn term(cluster: &Cluster) -> anyhow::Result<u64> {
    let Reply::Cluster(info) = cluster.call_patiently(ClientRequest::ClusterInfo, PATIENCE).await? else { bail!("unexpected reply") };
    Ok(info.term)
}

/// The voters by name, from the cluster's membership.
async fn voters(cluster: &Cluster) -> anyhow::Result<Vec<(String, String)>> {
    let Reply::Cluster(info) = cluster.call_patiently(ClientRequest::ClusterInfo, PATIENCE).await? else { bail!("unexpected reply") };
    Ok(info.members.into_iter().filter(|m| m.role != NodeRole::Agent).map(|m| (m.name, m.addr)).collect())
}

fn rss_mib(dir: &Path, node: &str) -> anyhow::Result<f64> {
    let pid = std::fs::read_to_string(dir.join(node).join("corrald.pid")).with_context(|| format!("read {node}'s pid"))?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).with_context(|| format!("read {node}'s status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    Ok(kib / 1024.0)
}

fn dir_bytes(path: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(path) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

/// The build time and size of the last snapshot `node` built, from its log.
fn last_snapshot_build_ms(dir: &Path, node: &str) -> Option<f64> {
    let log = std::fs::read_to_string(dir.join(node).join("corrald.log")).ok()?;
    let line = log.lines().rev().find(|l| l.contains("built snapshot"))?;
    line.split_whitespace().find_map(|w| w.strip_prefix("build_ms=")).and_then(|v| v.parse().ok())
}

async fn measure(cluster: &Arc<Cluster>, dir: &Path, shims: &Path, workdir: &str, finished: &[u64]) -> anyhow::Result<(Level, Vec<u64>)> {
    let (ids, submit_per_s, lat) = submit_and_cancel(cluster, workdir, SUBMIT_SAMPLES).await?;
    let lat = sorted(lat);
    wait_archived(cluster, Duration::from_secs(120)).await?;
    let pool: Vec<u64> = finished.iter().chain(ids.iter()).copied().collect();
    let step = (pool.len() / SACCT_SAMPLES).max(1);
    let sacct = time_shim(shims, dir, "sacct", SACCT_SAMPLES, |i| {
        let id = pool[(i * step + step / 2) % pool.len()];
        vec!["-X".into(), "-P".into(), "-n".into(), "-j".into(), id.to_string()]
    })?;
    let squeue = time_shim(shims, dir, "squeue", SQUEUE_SAMPLES, |_| vec!["-h".into()])?;
    let mut rss = Vec::new();
    let mut disk = BTreeMap::new();
    let voters = voters(cluster).await?;
    for (name, _) in &voters {
        rss.push((name.clone(), rss_mib(dir, name)?));
        disk.insert(name.clone(), dir_bytes(&dir.join(name).join("data")));
    }
    let leader = voters.first().map(|v| v.0.clone()).unwrap_or_default();
    let (accounting_records, accounting_bytes) = match cluster.call_patiently(ClientRequest::AccountingDigest, PATIENCE).await? {
        Reply::AccountingDigest { records, disk_bytes, .. } => (records, disk_bytes),
        other => bail!("unexpected reply {other:?}"),
    };
    let level = Level {
        finished: pool.len() as u64,
        submit_per_s,
        submit_p99_ms: percentile(&lat, 0.99),
        sacct_p50_ms: percentile(&sacct, 0.5),
        sacct_p99_ms: percentile(&sacct, 0.99),
        squeue_p99_ms: percentile(&squeue, 0.99),
        rss_mib: rss,
        disk_bytes: disk,
        accounting_bytes,
        accounting_records,
        snapshot_build_ms: last_snapshot_build_ms(dir, &leader),
    };
    Ok((level, ids))
}

/// Fills the cluster with `count` more finished jobs, printing progress.
async fn fill(cluster: &Arc<Cluster>, workdir: &str, count: usize) -> anyhow::Result<Vec<u64>> {
    // Small batches: the hot state never holds more than one batch of pending jobs, so the
    // RSS measured is what history costs, not the peak of a large batch.
    let batch = FILL_BATCH.min(count.max(1));
    let mut ids = Vec::with_capacity(count);
    let t = Instant::now();
    while ids.len() < count {
        let (more, _, _) = submit_and_cancel(cluster, workdir, batch.min(count - ids.len())).await?;
        ids.extend(more);
        if ids.len() % 20_000 < FILL_BATCH || ids.len() == count {
            println!("  filled {} of {count} ({:.0} jobs/s)", ids.len(), ids.len() as f64 / t.elapsed().as_secs_f64());
        }
    }
    wait_archived(cluster, Duration::from_secs(600)).await?;
    Ok(ids)
}

/// The accounting digest of the node at `addr`.
async fn digest_at(dir: &Path, addr: &str) -> anyhow::Result<(String, u64, String)> {
    let c = Cluster::connect(dir, Some(addr))?;
    match c.call(ClientRequest::AccountingDigest).await? {
        Ok(Reply::AccountingDigest { node, records, digest, .. }) => Ok((node, records, digest)),
        Ok(other) => bail!("unexpected reply {other:?}"),
        Err(e) => bail!("{e}"),
    }
}

/// SIGKILLs a follower voter; returns how long the agent promoted in its place took to hold the
/// leader's accounting store, and the record count.
async fn catch_up(cluster: &Cluster, dir: &Path) -> anyhow::Result<(f64, u64)> {
    let Reply::Cluster(info) = cluster.call_patiently(ClientRequest::ClusterInfo, PATIENCE).await? else { bail!("unexpected reply") };
    let leader = info.leader.clone().context("no leader")?;
    let leader_addr = info.members.iter().find(|m| m.name == leader).context("leader's address")?.addr.clone();
    let victim = info.members.iter().find(|m| m.name != leader && m.role == NodeRole::Voter).context("a follower voter")?.name.clone();
    let agent = info.members.iter().find(|m| m.role == NodeRole::Agent).context("an agent")?;
    let (agent_name, agent_addr) = (agent.name.clone(), agent.addr.clone());
    let (_, records, digest) = digest_at(dir, &leader_addr).await?;
    dev::signal_node(dir, &victim, "KILL")?;
    let t = Instant::now();
    let deadline = t + Duration::from_secs(600);
    loop {
        if let Ok((node, r, d)) = digest_at(dir, &agent_addr).await {
            if node == agent_name && r == records && d == digest {
                return Ok((t.elapsed().as_secs_f64(), records));
            }
        }
        if Instant::now() > deadline {
            bail!("{agent_name} did not catch up with {records} records within 600 s of {victim}'s SIGKILL");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn print_table(levels: &[Level]) {
    let base = &levels[0];
    let header: Vec<String> = levels.iter().map(|l| format!("{} done", l.finished)).collect();
    println!("{:<32}{}", "", header.iter().map(|h| format!("{h:>16}")).collect::<String>());
    let row = |name: &str, f: &dyn Fn(&Level) -> f64, ratio: bool| {
        let cells: String = levels
            .iter()
            .map(|l| {
                let v = f(l);
                if ratio && l.finished != base.finished {
                    format!("{:>16}", format!("{v:.1} ({:.2}x)", v / f(base)))
                } else {
                    format!("{v:>16.1}")
                }
            })
            .collect();
        println!("{name:<32}{cells}");
    };
    row("submit, 16 clients (/s)", &|l| l.submit_per_s, true);
    row("submit p99 (ms)", &|l| l.submit_p99_ms, true);
    row("sacct -j p50 (ms, process)", &|l| l.sacct_p50_ms, true);
    row("sacct -j p99 (ms, process)", &|l| l.sacct_p99_ms, true);
    row("squeue p99 (ms, process)", &|l| l.squeue_p99_ms, true);
    row("max voter RSS (MiB)", &|l| l.rss_mib.iter().map(|r| r.1).fold(0.0, f64::max), true);
    row("max voter data dir (MiB)", &|l| l.disk_bytes.values().copied().max().unwrap_or(0) as f64 / 1048576.0, true);
    row("accounting files per record (B)", &|l| l.accounting_bytes as f64 / l.accounting_records.max(1) as f64, false);
    row("last snapshot build (ms)", &|l| l.snapshot_build_ms.unwrap_or(f64::NAN), false);
    for l in levels {
        let rss: Vec<String> = l.rss_mib.iter().map(|(n, r)| format!("{n} {r:.0}")).collect();
        println!("  at {} finished: voter RSS MiB {}", l.finished, rss.join(", "));
    }
}

pub async fn run(history: usize, keep: Option<PathBuf>) -> anyhow::Result<()> {
    let dir = keep.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("corral-bench-history-{}", std::process::id())));
    let result = bench(&dir, history).await;
    if let Err(e) = dev::down(&dir) {
        eprintln!("stop the bench cluster: {e:#}");
    }
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn bench(dir: &Path, history: usize) -> anyhow::Result<()> {
    let opts = DevOptions {
        nodes: 4,
        gpus: "h100:8".into(),
        voters_max: 3,
        cpus: 64,
        memory_mib: 512 * 1024,
        heartbeat_interval_ms: 500,
        node_down_after_ms: 3_000,
        voter_replace_after_ms: 3_000,
        kill_grace_ms: 1_000,
        snapshot_logs: 1_000,
        checkpoint_root: None,
        gpu_sample_interval_ms: 5_000,
        min_job_age_s: 1,
        wait_s: 60,
        run_as_user: false,
        gpu_device_files: Vec::new(),
        partitions: vec!["default".into(), "gpu".into()],
        shards_per_gpu: 0,
    };
    dev::up(dir, &opts).await?;
    let shims = dir.join("shims");
    let corral = std::env::current_exe().context("find the corral executable")?;
    crate::slurm::install_shims(&shims, &corral)?;
    let workdir = dir.display().to_string();
    let cluster = Arc::new(Cluster::connect(dir, None)?);
    println!("history bench: 3 voters and 1 agent on this host; every job has a 2 KB environment; min_job_age_s = 1");
    let term_at_start = term(&cluster).await?;
    let mut empty_rss = Vec::new();
    for (name, _) in voters(&cluster).await? {
        empty_rss.push(format!("{name} {:.0}", rss_mib(dir, &name)?));
    }
    println!("voter RSS MiB before any job: {}", empty_rss.join(", "));
    let mut levels = Vec::new();
    let mut finished: Vec<u64> = Vec::new();
    let targets: Vec<usize> = [0, history / 10, history].into_iter().filter(|t| *t == 0 || *t >= 1_000).collect();
    for (i, target) in targets.iter().enumerate() {
        let have = finished.len();
        if *target > have {
            println!("filling to {target} finished jobs");
            finished.extend(fill(&cluster, &workdir, target - have).await?);
        }
        let (level, ids) = measure(&cluster, dir, &shims, &workdir, &finished).await?;
        finished.extend(ids);
        println!("measured at {} finished jobs ({} of {})", level.finished, i + 1, targets.len());
        levels.push(level);
    }
    let term_at_end = term(&cluster).await?;
    print_table(&levels);
    println!(
        "leader changes while filling and measuring: {} (term {term_at_start} to {term_at_end})",
        term_at_end.saturating_sub(term_at_start)
    );
    if let (Some(first), Some(last)) = (levels.first(), levels.last()) {
        let disk0: u64 = first.disk_bytes.values().copied().max().unwrap_or(0);
        let disk1: u64 = last.disk_bytes.values().copied().max().unwrap_or(0);
        let jobs = last.finished.saturating_sub(first.finished).max(1);
        println!(
            "bytes on disk per finished job (largest voter, growth from the first level): {:.0}",
            disk1.saturating_sub(disk0) as f64 / jobs as f64
        );
    }
    let (secs, records) = catch_up(&cluster, dir).await?;
    println!("a follower voter SIGKILLed: the agent promoted in its place held all {records} accounting records after {secs:.1} s");
    Ok(())
}
