//! `corral bench --ui NODES,JOBS`: the web UI's server times with a big cluster: a 3-voter
//! `dev up` cluster, NODES simulated nodes (`corrald --sim-nodes`) and JOBS jobs in the queue
//! (one running on each node, the rest pending), `corral restd` on the first node,
//! and every `/ui/api/` call timed with `curl` as a browser makes it (HTTPS, a token) against
//! the REST API's `/slurm/v0.0.38/jobs` and `/nodes` (`squeue --json`, `sinfo --json`) over the
//! same jobs and nodes in the same run. Prints figures; asserts nothing about speed.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use proto::{ClientRequest, Reply};

use super::nodes::{run_jobs, sim_spec, submit, unix_ms, Beats, Sim, SETTLE};
use super::stats::{percentile, sorted};
use crate::client::Cluster;
use crate::tools::dev::{self, DevOptions};

/// Requests timed per endpoint.
const SAMPLES: usize = 20;
/// Submitters of the pending jobs.
const CLIENTS: usize = 16;

pub struct UiBench {
    pub nodes: usize,
    pub jobs: usize,
}

/// `corral restd` on the first node, killed when dropped.
struct Restd {
    child: std::process::Child,
    base: String,
}

impl Drop for Restd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_restd(dir: &Path) -> anyhow::Result<Restd> {
    let exe = std::env::current_exe().context("locate corral")?;
    let mut child = Command::new(exe)
        .args(["restd", "--node-config", &dir.join("n1").join("node.toml").display().to_string(), "--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("start corral restd")?;
    let stdout = child.stdout.take().context("restd's stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).context("read restd's first line")?;
    let base = line.split_whitespace().nth(2).and_then(|u| u.split("/slurm/").next()).with_context(|| format!("restd said {line:?}"))?;
    Ok(Restd { base: base.to_string(), child })
}

/// One timed GET with curl: (seconds to the whole answer, bytes, HTTP status).
fn get(url: &str, token: &str) -> anyhow::Result<(f64, u64, String)> {
    let out = Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{time_total} %{size_download} %{http_code}"])
        .args(["-H", "X-SLURM-USER-NAME: root", "-H", &format!("X-SLURM-USER-TOKEN: {token}"), url])
        .output()
        .context("run curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut parts = text.split_whitespace();
    let seconds: f64 = parts.next().and_then(|s| s.parse().ok()).with_context(|| format!("curl said {text:?}"))?;
    let bytes: u64 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok((seconds, bytes, parts.next().unwrap_or("").to_string()))
}

/// Times `path` [`SAMPLES`] times: (p50 ms, p90 ms, max ms, bytes).
fn time(base: &str, path: &str, token: &str) -> anyhow::Result<(f64, f64, f64, u64)> {
    let mut samples = Vec::new();
    let mut bytes = 0;
    for _ in 0..SAMPLES {
        let (s, b, status) = get(&format!("{base}{path}"), token)?;
        if status != "200" {
            bail!("GET {path} answered {status}");
        }
        samples.push(s * 1000.0);
        bytes = b;
    }
    let s = sorted(samples);
    Ok((percentile(&s, 0.5), percentile(&s, 0.9), percentile(&s, 1.0), bytes))
}

/// Fills the queue: `running` simulated jobs that run, the rest pending (held, and waiting for
/// a begin time an hour away: every pass walks them, none starts).
async fn fill(cluster: &Arc<Cluster>, workdir: &str, running: usize, jobs: usize) -> anyhow::Result<()> {
    let took_s = run_jobs(cluster, workdir, running).await?;
    println!("  {running} jobs running ({took_s:.1} s)");
    let t = Instant::now();
    let pending = jobs.saturating_sub(running);
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let cluster = Arc::clone(cluster);
        let mut spec = sim_spec(workdir, 3_600_000, false);
        spec.begin_ms = Some(unix_ms() + 3_600_000);
        let share = pending / CLIENTS + usize::from(c < pending % CLIENTS);
        tasks.push(tokio::spawn(async move {
            for i in 0..share {
                let mut spec = spec.clone();
                spec.hold = i % 2 == 0;
                submit(&cluster, spec).await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await.context("join submitter")??;
    }
    println!("  {pending} jobs pending ({:.1} s)", t.elapsed().as_secs_f64());
    Ok(())
}

async fn measure(dir: &Path, opts: &UiBench) -> anyhow::Result<()> {
    let workdir = dir.display().to_string();
    let cluster = Arc::new(Cluster::connect(dir, None)?);
    let (_sim, join_ms): (Sim, u64) = Sim::start(dir, opts.nodes, Beats::Relayed, Duration::from_secs(900)).await?;
    println!("  {} simulated nodes joined in {join_ms} ms", opts.nodes);
    tokio::time::sleep(SETTLE).await;
    fill(&cluster, &workdir, opts.jobs.min(opts.nodes), opts.jobs).await?;
    let Reply::Token(token) = cluster
        .call_patiently(ClientRequest::IssueToken { user: Some("root".into()), lifespan_s: Some(3_600) }, Duration::from_secs(20))
        .await?
    else {
        bail!("unexpected reply to IssueToken")
    };
    let restd = start_restd(dir)?;
    // One page of one job (query_jobs would page through all of them).
    let query = proto::JobQuery { live: true, brief: true, limit: 1, states: vec![proto::JobState::Running], ..Default::default() };
    let Reply::JobPage { jobs, .. } = cluster.call_patiently(ClientRequest::QueryJobs { query }, Duration::from_secs(20)).await? else {
        bail!("unexpected reply to QueryJobs")
    };
    let job = jobs.first().map(|j| j.id).context("no running job")?;
    let rows: Vec<(String, &str)> = vec![
        ("/ui/".into(), "the page (HTML)"),
        ("/ui/app.js".into(), "its script"),
        ("/ui/api/me".into(), "who am I"),
        ("/ui/api/queue".into(), "queue (counts, first 500 rows)"),
        ("/ui/api/queue?mine=true".into(), "queue, my jobs"),
        ("/ui/api/nodes".into(), "nodes with their GPUs and holders"),
        ("/ui/api/utilization".into(), "GPU utilization of every busy node (cached 5 s)"),
        (format!("/ui/api/job/{job}"), "a job's page"),
        ("/ui/api/shares".into(), "fair share"),
        ("/ui/api/cluster".into(), "cluster"),
        ("/slurm/v0.0.38/jobs".into(), "peer: REST API jobs (squeue --json)"),
        ("/slurm/v0.0.38/nodes".into(), "peer: REST API nodes (sinfo --json)"),
    ];
    // The first gathering of the GPUs' samples asks every busy node; later ones are cached.
    let (cold_s, _, status) = get(&format!("{}/ui/api/utilization", restd.base), &token)?;
    println!("  utilization, first call (asks every busy node): {:.0} ms (HTTP {status})", cold_s * 1000.0);
    let mut figures = Vec::new();
    for (path, what) in &rows {
        let (p50, p90, max, bytes) = time(&restd.base, path, &token)?;
        println!("  {what:<48} {path:<28} p50 {p50:>7.1} ms  p90 {p90:>7.1} ms  max {max:>7.1} ms  {:>8} KiB", bytes / 1024);
        figures.push((path.clone(), p50));
    }
    let p50 = |p: &str| figures.iter().find(|(q, _)| q == p).map_or(f64::NAN, |(_, v)| *v);
    println!(
        "  ratios (p50): UI queue / REST jobs {:.2}x, UI nodes / REST nodes {:.2}x",
        p50("/ui/api/queue") / p50("/slurm/v0.0.38/jobs"),
        p50("/ui/api/nodes") / p50("/slurm/v0.0.38/nodes")
    );
    Ok(())
}

pub async fn run(opts: UiBench, dir: Option<PathBuf>) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("corral bench --ui starts corral restd, which runs as root");
    }
    println!("web UI with {} simulated nodes and {} jobs:", opts.nodes, opts.jobs);
    let keep = dir.is_some();
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join(format!("corral-bench-ui-{}", std::process::id())));
    dev::up(&dir, &DevOptions::three_nodes()).await?;
    let result = measure(&dir, &opts).await;
    if let Err(e) = dev::down(&dir) {
        eprintln!("stop the bench cluster: {e:#}");
    }
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}
