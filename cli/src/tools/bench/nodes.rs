//! `corral bench --nodes N[,N...]`: a real 3-voter `dev up` cluster and N simulated nodes
//! (`corrald --sim-nodes`: each its own certificate, QUIC endpoint, inventory and the agent's
//! own heartbeat loop, no processes), measuring what node count costs the control plane: the
//! CPU and RSS of each voter at rest, with one job waiting and while jobs run, how long a silenced
//! node takes to be declared down and its `--requeue` job to run again, and leader failovers
//! (how long until every node has a heartbeat acknowledged by the new leader; nodes wrongly
//! declared down; nodes that fenced). Two peers, each the same cluster at rest: the nodes
//! heartbeating the leader directly, as every node did before relays, and the nodes
//! heartbeating their relays by one stream call each, as they did before heartbeats became
//! datagrams.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{ClientRequest, GresRequest, JobQuery, JobSpec, JobState, NodeState, Reply};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::stats::{percentile, sorted};
use crate::client::Cluster;
use crate::tools::dev::{self, DevOptions};

pub struct NodesBench {
    pub sizes: Vec<usize>,
    pub jobs: usize,
    pub detections: usize,
    pub failovers: usize,
    pub heartbeat_interval_ms: u64,
    pub node_down_after_ms: u64,
    /// Also measure the cluster at rest with every node heartbeating the leader directly.
    pub direct_peer: bool,
    /// Also measure the cluster at rest with relayed heartbeats as stream calls.
    pub stream_peer: bool,
}

/// Each process's (name, % of a core, RSS MiB) over a window.
type Figures = Vec<(String, f64, f64)>;

/// How the simulated nodes heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Beats {
    /// To their relays, as datagrams: what a node does.
    Relayed,
    /// To their relays, one stream call each (before datagrams).
    RelayedStreams,
    /// To the leader, one stream call each (before relays).
    Direct,
}

impl Beats {
    fn name(self) -> &'static str {
        match self {
            Beats::Relayed => "sim",
            Beats::RelayedStreams => "streams",
            Beats::Direct => "direct",
        }
    }

    fn says(self) -> &'static str {
        match self {
            Beats::Relayed => "relayed, as datagrams",
            Beats::RelayedStreams => "relayed, one stream call each",
            Beats::Direct => "every node heartbeating the leader directly",
        }
    }
}

/// The simulated nodes' process and its control lines.
pub(super) struct Sim {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    stdout: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Sim {
    pub(super) async fn start(dir: &Path, count: usize, beats: Beats, patience: Duration) -> anyhow::Result<(Sim, u64)> {
        let log = std::fs::File::create(dir.join(format!("{}.log", beats.name()))).context("create the sim log")?;
        let mut cmd = tokio::process::Command::new(dev::corrald_binary());
        cmd.arg("--sim-nodes")
            .arg(count.to_string())
            .arg("--sim-config")
            .arg(dir.join("n1").join("node.toml"))
            .arg("--sim-ca-dir")
            .arg(dir)
            .arg("--sim-prefix")
            .arg(beats.name());
        match beats {
            Beats::Relayed => {}
            Beats::RelayedStreams => {
                cmd.arg("--sim-stream-heartbeats");
            }
            Beats::Direct => {
                cmd.arg("--sim-direct-to-leader");
            }
        }
        cmd.env("RUST_LOG", "error")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("start corrald --sim-nodes")?;
        let stdin = child.stdin.take().context("sim stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("sim stdout")?).lines();
        let mut sim = Sim { child, stdin, stdout };
        let line = tokio::time::timeout(patience, sim.line()).await.context("simulated nodes did not all join in time")??;
        let join_ms = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["ready", _, ms] => ms.parse().context("parse the join time")?,
            _ => bail!("simulated nodes said {line:?}, not ready"),
        };
        Ok((sim, join_ms))
    }

    async fn line(&mut self) -> anyhow::Result<String> {
        self.stdout.next_line().await.context("read from the simulated nodes")?.context("the simulated nodes exited (see sim.log)")
    }

    async fn ask(&mut self, command: &str) -> anyhow::Result<String> {
        self.stdin.write_all(format!("{command}\n").as_bytes()).await.context("write to the simulated nodes")?;
        self.stdin.flush().await.context("write to the simulated nodes")?;
        self.line().await
    }

    fn pid(&self) -> Option<i32> {
        self.child.id().map(|p| p as i32)
    }

    /// The simulator's transport counters (its nodes' dials).
    async fn transport(&mut self) -> anyhow::Result<transport::Counters> {
        let line = self.ask("transport").await?;
        let json = line.strip_prefix("transport ").context("transport reply")?;
        serde_json::from_str(json).context("parse transport counters")
    }

    async fn fences(&mut self) -> anyhow::Result<u64> {
        let line = self.ask("stats").await?;
        let json = line.strip_prefix("stats ").context("stats reply")?;
        let v: serde_json::Value = serde_json::from_str(json).context("parse stats")?;
        Ok(v.get("fences").and_then(|f| f.as_u64()).unwrap_or(0))
    }
}

/// Connections each member accepted since it started (handshakes it served), from
/// `corral_transport_connections_accepted_total`, for the members whose metrics answer now.
fn voters_accepted(dir: &Path) -> BTreeMap<String, u64> {
    voters_counter(dir, "corral_transport_connections_accepted_total")
}

/// Connections each member refused since it started because too many handshakes were under
/// way (`corral_transport_connections_refused_busy_total`).
fn voters_refused(dir: &Path) -> BTreeMap<String, u64> {
    voters_counter(dir, "corral_transport_connections_refused_busy_total")
}

/// Counter `metric` of each member whose metrics answer now.
fn voters_counter(dir: &Path, metric: &str) -> BTreeMap<String, u64> {
    let prefix = format!("{metric} ");
    let mut counts = BTreeMap::new();
    for (name, url) in dev::metrics_urls(dir).unwrap_or_default() {
        let Some(addr) = url.strip_prefix("http://").and_then(|u| u.strip_suffix("/metrics")) else { continue };
        let text = (|| -> std::io::Result<String> {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(addr)?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
            let mut out = String::new();
            s.take(8 << 20).read_to_string(&mut out)?;
            Ok(out)
        })()
        .unwrap_or_default();
        if let Some(v) = text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.trim().parse::<f64>().ok()) {
            counts.insert(name, v as u64);
        }
    }
    counts
}

/// Handshakes the members served between two [`voters_accepted`] readings: a member that
/// restarted meanwhile (its count went back) counts from zero.
fn accepted_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after.iter().map(|(name, now)| before.get(name).filter(|was| *was <= now).map_or(*now, |was| now - was)).sum()
}

/// What one failover cost in handshakes: the simulated nodes' dials between two readings of
/// their counters, and the connections the members accepted and refused as busy meanwhile.
fn handshakes(before: &transport::Counters, after: &transport::Counters, (accepted, refused): (u64, u64)) -> String {
    format!(
        "handshakes: the nodes dialed {} (failed {}, dropped {}), the members accepted {accepted} and refused {refused} as busy",
        after.dialed.saturating_sub(before.dialed),
        after.dials_failed.saturating_sub(before.dials_failed),
        after.dropped.saturating_sub(before.dropped),
    )
}

pub(super) fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// CPU seconds (user + system) a process used so far, from `/proc/PID/stat`.
fn cpu_seconds(pid: i32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("read /proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').context("parse /proc/PID/stat")?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11).context("utime")?.parse::<u64>()? + fields.get(12).context("stime")?.parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

fn rss_mib(pid: i32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("read /proc/{pid}/status"))?;
    let kib: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).context("VmRSS")?;
    Ok(kib / 1024.0)
}

fn node_pid(dir: &Path, name: &str) -> anyhow::Result<i32> {
    let text = std::fs::read_to_string(dir.join(name).join("corrald.pid")).with_context(|| format!("read {name}/corrald.pid"))?;
    text.trim().parse().context("parse corrald.pid")
}

/// % of a core each process used over `window`, and its RSS at the end: (name, %, MiB).
async fn cpu_over(procs: &[(String, i32)], window: Duration) -> anyhow::Result<Vec<(String, f64, f64)>> {
    let before: Vec<f64> = procs.iter().map(|(_, pid)| cpu_seconds(*pid)).collect::<anyhow::Result<_>>()?;
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let secs = t.elapsed().as_secs_f64();
    let mut out = Vec::new();
    for ((name, pid), b) in procs.iter().zip(before) {
        out.push((name.clone(), (cpu_seconds(*pid)? - b) / secs * 100.0, rss_mib(*pid)?));
    }
    Ok(out)
}

/// The voters by role (leader first) and the simulated nodes' process.
async fn processes(cluster: &Cluster, dir: &Path, sim: &Sim) -> anyhow::Result<Vec<(String, i32)>> {
    let Reply::Cluster(info) = cluster.call_patiently(ClientRequest::ClusterInfo, Duration::from_secs(20)).await? else {
        bail!("unexpected reply to ClusterInfo")
    };
    let leader = info.leader.context("no leader")?;
    let mut procs = vec![(format!("leader {leader}"), node_pid(dir, &leader)?)];
    for m in info.members.iter().filter(|m| m.role == proto::NodeRole::Voter) {
        procs.push((format!("voter {}", m.name), node_pid(dir, &m.name)?));
    }
    procs.push(("simulated nodes".into(), sim.pid().context("sim pid")?));
    Ok(procs)
}

fn print_cpu(label: &str, figures: &[(String, f64, f64)]) {
    let parts: Vec<String> = figures.iter().map(|(n, cpu, rss)| format!("{n} {cpu:.1}% {rss:.0} MiB")).collect();
    println!("  {label}: {}", parts.join(", "));
}

pub(super) fn sim_spec(workdir: &str, run_ms: u64, requeue: bool) -> JobSpec {
    let mut spec = JobSpec::command(vec!["sleep".into(), "3600".into()], workdir, "bench");
    spec.name = "bench-nodes".into();
    spec.gres = Some(GresRequest { gpu_type: None, count: 1, ..Default::default() });
    spec.mem_mib = 256;
    spec.output = Some("/dev/null".into());
    spec.requeue = requeue;
    // Only on simulated nodes: the real three run no job.
    spec.exclude = vec!["n1".into(), "n2".into(), "n3".into()];
    spec.env.insert("CORRAL_SIM_RUN_MS".into(), run_ms.to_string());
    spec
}

pub(super) async fn submit(cluster: &Cluster, spec: JobSpec) -> anyhow::Result<u64> {
    match cluster.call_patiently(ClientRequest::Submit { spec }, Duration::from_secs(20)).await? {
        Reply::Submitted { job } => Ok(job),
        other => bail!("unexpected reply {other:?}"),
    }
}

async fn running_jobs(cluster: &Cluster) -> anyhow::Result<usize> {
    let query = JobQuery { states: vec![JobState::Running], live: true, brief: true, ..JobQuery::default() };
    Ok(cluster.query_jobs(query, Duration::from_secs(20)).await?.len())
}

async fn node_names(cluster: &Cluster) -> anyhow::Result<BTreeMap<u64, (String, NodeState)>> {
    match cluster.call_patiently(ClientRequest::ListNodes, Duration::from_secs(20)).await? {
        Reply::Nodes(list) => Ok(list.into_iter().map(|n| (n.id, (n.name, n.state))).collect()),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// Submits `jobs` long simulated jobs, 16 at a time, and waits until all run.
pub(super) async fn run_jobs(cluster: &std::sync::Arc<Cluster>, workdir: &str, jobs: usize) -> anyhow::Result<f64> {
    let t = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..16 {
        let (cluster, spec) = (std::sync::Arc::clone(cluster), sim_spec(workdir, 3_600_000, false));
        let share = jobs / 16 + usize::from(c < jobs % 16);
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                submit(&cluster, spec.clone()).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await.context("join submitter")??;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while running_jobs(cluster).await? < jobs {
        if Instant::now() > deadline {
            bail!("{jobs} jobs not all running after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The cluster at rest but for one pending job that does not start: held (the leader runs no
/// pass for it), then waiting for its start time an hour away (the leader schedules every tick,
/// and with it builds the scheduler's view of every node, for as long as such a job waits).
async fn waiting_job(cluster: &Cluster, workdir: &str, procs: &[(String, i32)], rest: &Figures) -> anyhow::Result<()> {
    for held in [true, false] {
        let mut spec = sim_spec(workdir, 3_600_000, false);
        if held {
            spec.hold = true;
        } else {
            spec.begin_ms = Some(unix_ms() + 3_600_000);
        }
        let job = submit(cluster, spec).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let figures = cpu_over(procs, WINDOW).await?;
        cluster.call_patiently(ClientRequest::Cancel { job }, Duration::from_secs(20)).await?;
        print_cpu(if held { "one job held, nothing else" } else { "one job waiting for its start time, nothing else" }, &figures);
        let ratios: Vec<String> = figures
            .iter()
            .zip(rest)
            .filter(|((name, _, _), _)| !name.starts_with("sim"))
            .map(|((name, cpu, _), (_, idle, _))| format!("{name} {:.2}x", cpu / idle.max(0.01)))
            .collect();
        println!("    CPU against at rest: {}", ratios.join(", "));
    }
    Ok(())
}

/// Silences the node of a running `--requeue` job: (ms to `NodeDown` as the job shows it,
/// ms until it runs again elsewhere), both from the silence.
async fn detection(
    cluster: &Cluster,
    sim: &mut Sim,
    workdir: &str,
    names: &BTreeMap<u64, (String, NodeState)>,
) -> anyhow::Result<(f64, f64)> {
    let id = submit(cluster, sim_spec(workdir, 3_600_000, true)).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let node = loop {
        if let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job: id }, Duration::from_secs(10)).await? {
            if j.state == JobState::Running && j.launches_pending().next().is_none() {
                break j.parts.first().map(|p| p.alloc.node).context("a running job without parts")?;
            }
        }
        if Instant::now() > deadline {
            bail!("job {id} did not start within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let name = names.get(&node).map(|(n, _)| n.clone()).context("the job's node is not simulated")?;
    let answer = sim.ask(&format!("silence {name}")).await?;
    let silenced_ms: u64 = answer.split_whitespace().nth(2).and_then(|t| t.parse().ok()).context("silence reply")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut down_ms = None;
    loop {
        if let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job: id }, Duration::from_secs(10)).await? {
            let now = unix_ms().saturating_sub(silenced_ms) as f64;
            if down_ms.is_none() && (j.restart_count >= 1 || j.run >= 2) {
                down_ms = Some(now);
            }
            if j.run >= 2 && j.state == JobState::Running && j.launches_pending().next().is_none() {
                cluster.call_patiently(ClientRequest::Cancel { job: id }, Duration::from_secs(10)).await?;
                return Ok((down_ms.unwrap_or(now), now));
            }
        }
        if Instant::now() > deadline {
            bail!("job {id} did not run again within 60 s of silencing {name}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The voters' logs (`nN/corrald.log` of the dev cluster) and how long each is now.
fn voter_logs(dir: &Path) -> Vec<(PathBuf, u64)> {
    ["n1", "n2", "n3"]
        .iter()
        .map(|n| dir.join(n).join("corrald.log"))
        .map(|p| {
            let len = std::fs::metadata(&p).map_or(0, |m| m.len());
            (p, len)
        })
        .collect()
}

/// Simulated nodes a leader declared down since `since` (what [`voter_logs`] gave): each
/// committed `NodeDown` is said once, by the leader that committed it, as "node declared down".
fn declared_down_since(since: &[(PathBuf, u64)]) -> anyhow::Result<usize> {
    use std::io::{Read, Seek, SeekFrom};
    let mut count = 0;
    for (path, offset) in since {
        let mut file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
        file.seek(SeekFrom::Start(*offset)).with_context(|| format!("seek in {}", path.display()))?;
        let mut text = String::new();
        file.read_to_string(&mut text).with_context(|| format!("read {}", path.display()))?;
        count += text.lines().filter(|l| l.contains("node declared down") && l.contains("node=sim")).count();
    }
    Ok(count)
}

/// SIGKILLs the leader and measures until every live node had a heartbeat sent after the kill
/// acknowledged; then restarts it.
async fn failover(dir: &Path, cluster: &Cluster, sim: &mut Sim) -> anyhow::Result<(String, f64)> {
    let Reply::Cluster(info) = cluster.call_patiently(ClientRequest::ClusterInfo, Duration::from_secs(20)).await? else {
        bail!("unexpected reply to ClusterInfo")
    };
    let leader = info.leader.context("no leader")?;
    let killed_ms = unix_ms();
    dev::signal_node(dir, &leader, "KILL")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let took = loop {
        let answer = sim.ask(&format!("acked_since {killed_ms}")).await?;
        let counts: Vec<usize> = answer.split_whitespace().skip(1).filter_map(|w| w.parse().ok()).collect();
        if let [acked, all] = counts.as_slice() {
            if acked == all {
                break unix_ms().saturating_sub(killed_ms) as f64;
            }
        }
        if Instant::now() > deadline {
            bail!("not every node was acknowledged within 60 s of killing the leader {leader}: {answer}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    dev::start_one(dir, &leader)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let up = node_names(cluster).await.ok().is_some_and(|m| m.values().any(|(n, s)| *n == leader && *s == NodeState::Up));
        if up {
            break;
        }
        if Instant::now() > deadline {
            bail!("{leader} not back up within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((leader, took))
}

async fn one_size(base: &Path, opts: &NodesBench, count: usize) -> anyhow::Result<()> {
    println!(
        "{count} simulated nodes (heartbeat_interval_ms={}, node_down_after_ms={}):",
        opts.heartbeat_interval_ms, opts.node_down_after_ms
    );
    let dev_opts = DevOptions {
        heartbeat_interval_ms: opts.heartbeat_interval_ms,
        node_down_after_ms: opts.node_down_after_ms,
        ..crate::tools::dev::DevOptions::three_nodes()
    };
    let mut peers = Vec::new();
    for (beats, wanted) in [(Beats::Direct, opts.direct_peer), (Beats::RelayedStreams, opts.stream_peer)] {
        if !wanted {
            continue;
        }
        let dir = base.join(format!("nodes-{count}-{}", beats.name()));
        dev::up(&dir, &dev_opts).await?;
        let result = at_rest_peer(&dir, count, beats).await;
        if let Err(e) = dev::down(&dir) {
            eprintln!("stop the bench cluster: {e:#}");
        }
        peers.push((beats, result?));
    }
    let dir = base.join(format!("nodes-{count}"));
    dev::up(&dir, &dev_opts).await?;
    let result = measure(&dir, opts, count, &peers).await;
    if let Err(e) = dev::down(&dir) {
        eprintln!("stop the bench cluster: {e:#}");
    }
    result
}

/// Past the connections of the join (closed once idle for `CONNECTION_IDLE_CLOSE`).
pub(super) const SETTLE: Duration = Duration::from_secs(15);
const WINDOW: Duration = Duration::from_secs(10);

/// A peer: the same cluster at rest with the nodes heartbeating as `beats` says: % of a core
/// and RSS of the leader, the voters and the simulated nodes.
async fn at_rest_peer(dir: &Path, count: usize, beats: Beats) -> anyhow::Result<Figures> {
    let cluster = Cluster::connect(dir, None)?;
    let (mut sim, join_ms) = Sim::start(dir, count, beats, Duration::from_secs(900)).await?;
    tokio::time::sleep(SETTLE).await;
    let procs = processes(&cluster, dir, &sim).await?;
    let figures = cpu_over(&procs, WINDOW).await?;
    print_cpu(&format!("at rest, {} (joined in {join_ms} ms)", beats.says()), &figures);
    println!("    nodes that fenced: {}", sim.fences().await?);
    Ok(figures)
}

/// The relayed figures against each peer's, process by process in order (leader, voters, the
/// simulated nodes), as ratios.
fn print_ratios(rest: &[(String, f64, f64)], peers: &[(Beats, Figures)]) {
    for (beats, peer) in peers {
        let parts: Vec<String> = rest
            .iter()
            .zip(peer)
            .map(|((name, ours, _), (_, theirs, _))| {
                let role = name.split_whitespace().next().unwrap_or(name);
                format!("{role} {ours:.1}% against {theirs:.1}% (ratio {:.2}x)", theirs / ours.max(0.1))
            })
            .collect();
        println!("    at rest against {}: {}", beats.says(), parts.join(", "));
    }
}

async fn measure(dir: &Path, opts: &NodesBench, count: usize, peers: &[(Beats, Figures)]) -> anyhow::Result<()> {
    let workdir = dir.display().to_string();
    let cluster = std::sync::Arc::new(Cluster::connect(dir, None)?);
    let (mut sim, join_ms) = Sim::start(dir, count, Beats::Relayed, Duration::from_secs(900)).await?;
    tokio::time::sleep(SETTLE).await;
    let procs = processes(&cluster, dir, &sim).await?;
    let rest = cpu_over(&procs, WINDOW).await?;
    print_cpu(&format!("at rest, {} (joined in {join_ms} ms)", Beats::Relayed.says()), &rest);
    print_ratios(&rest, peers);
    waiting_job(&cluster, &workdir, &procs, &rest).await?;
    // At most half the simulated GPUs (8 per node), so each job starts at once.
    let jobs = opts.jobs.min(count * 4);
    let took_s = run_jobs(&cluster, &workdir, jobs).await?;
    let procs = processes(&cluster, dir, &sim).await?;
    let busy = cpu_over(&procs, WINDOW).await?;
    print_cpu(&format!("{jobs} jobs running (all started {took_s:.1} s after the first submission)"), &busy);
    let names: BTreeMap<u64, (String, NodeState)> =
        node_names(&cluster).await?.into_iter().filter(|(_, (n, _))| n.starts_with("sim")).collect();
    let (mut down, mut again) = (Vec::new(), Vec::new());
    for _ in 0..opts.detections {
        let (d, a) = detection(&cluster, &mut sim, &workdir, &names).await?;
        down.push(d);
        again.push(a);
    }
    if !down.is_empty() {
        let (down, again) = (sorted(down), sorted(again));
        println!(
            "  node silenced -> NodeDown seen: p50 {:.0} ms  p99 {:.0} ms; its --requeue job running again: p50 {:.0} ms  p99 {:.0} ms ({} trials; Slurm's defaults: 300 s + 120 s requeue delay, ratio {:.0}x)",
            percentile(&down, 0.5),
            percentile(&down, 0.99),
            percentile(&again, 0.5),
            percentile(&again, 0.99),
            again.len(),
            420_000.0 / percentile(&again, 0.99).max(1.0)
        );
    }
    let fences_before = sim.fences().await?;
    let down_before = node_names(&cluster).await?.values().filter(|(n, s)| n.starts_with("sim") && *s == NodeState::Down).count();
    let (mut rejoin, mut declared) = (Vec::new(), 0);
    for round in 0..opts.failovers {
        let logs = voter_logs(dir);
        let (sim_before, accepted_before, refused_before) = (sim.transport().await?, voters_accepted(dir), voters_refused(dir));
        let served = |dir: &Path| {
            (accepted_between(&accepted_before, &voters_accepted(dir)), accepted_between(&refused_before, &voters_refused(dir)))
        };
        let (leader, ms) = match failover(dir, &cluster, &mut sim).await {
            Ok(done) => done,
            Err(e) => {
                let shakes = handshakes(&sim_before, &sim.transport().await?, served(dir));
                println!("    failover {}: {e:#}; {shakes}; nodes declared down: {}", round + 1, declared_down_since(&logs)?);
                return Err(e);
            }
        };
        // Past the new leader's grace period, any node it gave up on has been declared down.
        tokio::time::sleep(Duration::from_millis(opts.node_down_after_ms + 1_000)).await;
        let downs = declared_down_since(&logs)?;
        declared += downs;
        let shakes = handshakes(&sim_before, &sim.transport().await?, served(dir));
        println!(
            "    failover {}: killed {leader}; every node acknowledged by the new leader {ms:.0} ms after the kill; nodes declared down: {downs}; {shakes}",
            round + 1
        );
        rejoin.push(ms);
    }
    if !rejoin.is_empty() {
        let down_after = node_names(&cluster).await?.values().filter(|(n, s)| n.starts_with("sim") && *s == NodeState::Down).count();
        let fences = sim.fences().await? - fences_before;
        let rejoin = sorted(rejoin);
        println!(
            "  {} leader SIGKILLs: every node acknowledged again p50 {:.0} ms  p99 {:.0} ms after the kill; live nodes declared down: {declared} ({} still DOWN at the end); nodes that fenced: {fences}",
            rejoin.len(),
            percentile(&rejoin, 0.5),
            percentile(&rejoin, 0.99),
            down_after.saturating_sub(down_before)
        );
    }
    Ok(())
}

pub async fn run(opts: NodesBench, dir: Option<PathBuf>) -> anyhow::Result<()> {
    let keep = dir.is_some();
    let base = dir.unwrap_or_else(|| std::env::temp_dir().join(format!("corral-bench-nodes-{}", std::process::id())));
    let mut result = Ok(());
    for &count in &opts.sizes {
        result = one_size(&base, &opts, count).await;
        if result.is_err() {
            break;
        }
    }
    if !keep {
        let _ = std::fs::remove_dir_all(&base);
    }
    result
}
