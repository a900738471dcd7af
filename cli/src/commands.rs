//! The client commands of `corral` on jobs, nodes and the policy (`submit`, `queue`, `show`,
//! `wait`, `logs`, `nodes`, `cluster`, `policy`): building a job from the command line or a
//! script, and printing what the cluster answers as text or JSON. `main.rs` only dispatches.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Subcommand;
use proto::{ApiError, ClientRequest, GresRequest, Job, JobSpec, LogStream, NodeInfo, Reply};
use serde_json::json;

use crate::client::Cluster;
use crate::{slurm, units};

// `corral policy show|set FILE` (a plain comment: clap would take a doc comment as help text).
#[derive(Subcommand)]
pub enum PolicyCmd {
    Show,
    Set { file: PathBuf },
}

// `corral mig set|show` (a plain comment: clap would take a doc comment as help text).
#[derive(Subcommand)]
pub enum MigCmd {
    /// Pin a MIG-mode GPU to a layout: PROFILES comma-separated (e.g. 3g.71gb,3g.71gb), checked
    /// against the GPU's slice rules; applied once the GPU is idle, and meanwhile only that GPU
    /// takes no new work. `auto` gives the GPU back to the demand-driven relayout. Never changes
    /// MIG mode itself (admin only).
    Set { node: String, gpu: u32, profiles: String },
    /// MIG-mode GPUs with the layout each has and the one pinned.
    Show { node: Option<String> },
}

// `corral submit`'s options (as sbatch's, with `--` before a command; a plain comment, as clap
// would take a doc comment as help text).
#[derive(clap::Args, Clone, Debug)]
pub struct SubmitArgs {
    /// GPUs: gpu:N or gpu:TYPE:N.
    #[arg(long)]
    gres: Option<String>,
    #[arg(long, short = 'c', default_value_t = 1)]
    cpus_per_task: u32,
    /// Memory per node: 4096 (MiB), 512M, 4G. Default: 16 GiB per GPU or 1 GiB per CPU on the
    /// node, whichever is more (the cluster's `DefMemPerGPU`/`DefMemPerCPU`).
    #[arg(long)]
    mem: Option<String>,
    /// Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
    #[arg(long, short = 't')]
    time: Option<String>,
    #[arg(long, short = 'J')]
    name: Option<String>,
    /// Output file (`%j` is the job id); default corral-%j.out in the working directory.
    #[arg(long, short = 'o')]
    output: Option<String>,
    /// Separate file for stderr.
    #[arg(long, short = 'e')]
    error: Option<String>,
    /// Working directory (default: the current one).
    #[arg(long, short = 'D')]
    chdir: Option<PathBuf>,
    /// Put the job back in the queue (same id, restart count + 1) when one of its nodes dies.
    #[arg(long)]
    requeue: bool,
    /// Hold this many spare nodes: one takes the place of a node the gang loses (its part
    /// starts there with the same rank) while the others keep running.
    #[arg(long, default_value_t = 0)]
    spare_nodes: u32,
    /// Where the gang's torchrun agents meet: HOST:PORT of a c10d store or etcd on no node of
    /// the job, or `corral`, the job's own store on its nodes (command gangs); set
    /// as `PET_RDZV_ENDPOINT`; with a spare, the loss of rank 0 is repaired too.
    #[arg(long)]
    rdzv_endpoint: Option<String>,
    #[arg(long, short = 'p')]
    partition: Option<String>,
    #[arg(long, short = 'q')]
    qos: Option<String>,
    /// Submit the job held (as sbatch's `--hold`): it starts after `scontrol release JOBID`.
    #[arg(long, short = 'H')]
    hold: bool,
    /// Nodes the job spans, all started together or none: `N`, or Slurm's `MIN-MAX` (it starts
    /// on as many as it can get then, at least MIN).
    #[arg(long, short = 'N', default_value = "1", value_name = "N|MIN-MAX")]
    nodes: String,
    /// Before a multi-node job starts, measure the network between its nodes (every node
    /// streams to the first on the job's MASTER_PORT); hold the job if a pair is slower than
    /// MIN_MBPS Mbit/s or under half the median.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "0", value_name = "MIN_MBPS")]
    preflight: Option<u64>,
    /// Bytes each node streams in the preflight.
    #[arg(long, default_value_t = proto::PreflightSpec::BYTES_DEFAULT)]
    preflight_bytes: u64,
    /// Slurm's batch model (as `sbatch`): the command runs on the first node only, the other
    /// nodes hold their share for its `srun` steps.
    #[arg(long)]
    batch: bool,
    /// Script file, or the command after `--`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

/// The job as `--json` prints it.
fn job_json(job: &Job, nodes: &BTreeMap<u64, String>) -> serde_json::Value {
    let name = |n: &u64| nodes.get(n).cloned().unwrap_or_else(|| format!("node{n}"));
    let names: Vec<String> = job.last_nodes.iter().map(name).collect();
    let repairs: Vec<serde_json::Value> = job
        .repairs
        .iter()
        .map(
            |r| json!({"run": r.run, "rank": r.rank, "lost": name(&r.lost), "spare": name(&r.spare), "at_ms": r.at_ms, "reason": r.reason}),
        )
        .collect();
    json!({
        "id": job.id,
        "name": job.spec.name,
        "state": job.state_name(),
        "exit_code": job.exit_code,
        "node": names.first(),
        "nodes": names,
        "gpus": job.last_gpus.first().cloned().unwrap_or_default(),
        "gpus_per_node": job.last_gpus,
        "submit_time": job.submit_ms,
        "start_time": job.start_ms,
        "end_time": job.end_ms,
        "restart_count": job.restart_count,
        "spares": job.spares.iter().map(name).collect::<Vec<_>>(),
        "repairs": repairs,
        "run": job.run,
        "user": job.spec.user,
        "gres": job.spec.gres.as_ref().map(|g| g.to_string()),
        "time_limit_ms": job.spec.time_limit_ms,
        // Suspended time of the current or last run that ended with a resume.
        "suspended_ms": job.suspension.paused_ms,
        "reason": job.reason(),
        "reasons": job.reasons,
        "gpu_seconds": job.gpu_seconds,
        "gpu_util_mean_pct": job.gpu_usage.mean_utilization_pct(),
        "gpu_mem_peak_mib": job.gpu_usage.memory_used_peak_mib,
    })
}

fn node_json(n: &NodeInfo) -> serde_json::Value {
    json!({
        "name": n.name,
        "state": n.state.as_str(),
        "role": n.role.as_str(),
        "gpus_total": n.gpus_total,
        "gpus_free": n.gpus_free,
        "gpu_types": n.gpu_types,
        "cpus_total": n.cpus_total,
        "cpus_alloc": n.cpus_alloc,
        "addr": n.addr,
        "reason": n.reason,
        "unhealthy_gpus": n.unhealthy_gpus.iter().map(|(g, why)| json!({"gpu": g, "reason": why})).collect::<Vec<_>>(),
        "cert_fingerprint": n.cert_fingerprint,
    })
}

fn fmt_time(ms: Option<u64>) -> String {
    ms.map_or_else(|| "-".into(), |ms| format!("{:.3}", ms as f64 / 1000.0))
}

pub async fn node_names(cluster: &Cluster) -> anyhow::Result<BTreeMap<u64, String>> {
    match cluster.call_patiently(ClientRequest::ListNodes, crate::slurm::PATIENCE).await? {
        Reply::Nodes(list) => Ok(list.into_iter().map(|n| (n.id, n.name)).collect()),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// The job `corral submit` asks for: a script file (its `#SBATCH` lines, overridden by the
/// options given) or a command.
pub fn build_spec(args: &SubmitArgs) -> anyhow::Result<JobSpec> {
    if args.command.is_empty() {
        bail!("nothing to run: give a script file or `-- COMMAND ARGS...`");
    }
    // The command is taken with its own options, so an option `corral submit` lacks would
    // otherwise become the program to run (`-w h2 -- sleep 9` ran "-w" and failed).
    if let Some(option) = args.command.first().filter(|c| c.starts_with('-')) {
        bail!("`corral submit` has no option {option} (see --help); the command goes after `--`");
    }
    let workdir = match &args.chdir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("read current directory")?,
    };
    let workdir = std::path::absolute(&workdir).with_context(|| format!("resolve {}", workdir.display()))?;
    let first = PathBuf::from(&args.command[0]);
    let as_script = first.is_file() && !is_executable_binary(&first);
    let (argv, script, default_name) = if as_script {
        let text = std::fs::read_to_string(&first).with_context(|| format!("read script {}", first.display()))?;
        let name = first.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "script".into());
        (args.command[1..].to_vec(), Some(text), name)
    } else {
        let name = first.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "job".into());
        (args.command.clone(), None, name)
    };
    let preflight = args.preflight.map(|min_mbps| proto::PreflightSpec { bytes: args.preflight_bytes, min_mbps });
    if let Some(text) = script.as_deref().filter(|t| !slurm::sbatch::directives(t, "#SBATCH").is_empty()) {
        let mut spec =
            slurm::sbatch::spec_from_directives(text, &default_name, argv, &sbatch_overrides(args)).map_err(|e| anyhow::anyhow!("{e}"))?;
        spec.preflight = preflight;
        spec.set_batch(args.batch);
        spec.validate().map_err(anyhow::Error::msg)?;
        return Ok(spec);
    }
    let gres = args.gres.as_deref().map(GresRequest::parse).transpose().map_err(anyhow::Error::msg)?;
    let time_limit_ms = args.time.as_deref().map(units::parse_time_limit_ms).transpose().map_err(anyhow::Error::msg)?;
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let mut spec = JobSpec::command(argv, &workdir.display().to_string(), &std::env::var("USER").unwrap_or_else(|_| "root".into()));
    spec.name = args.name.clone().unwrap_or(default_name);
    spec.script = script;
    spec.gres = gres;
    spec.cpus_per_task = args.cpus_per_task;
    spec.mem_mib = match &args.mem {
        Some(m) => match units::parse_mem_mib(m).map_err(anyhow::Error::msg)? {
            0 => anyhow::bail!("--mem 0 (Slurm's all of each node's memory) is not supported: ask for a size"),
            mib => mib,
        },
        None => 0,
    };
    spec.time_limit_ms = time_limit_ms;
    spec.env = env;
    spec.output = args.output.clone();
    spec.error = args.error.clone();
    spec.requeue = args.requeue;
    let (nodes_min, nodes_max) = slurm::values::parse_nodes(&args.nodes).map_err(anyhow::Error::msg)?;
    spec.nodes = nodes_min;
    spec.set_nodes_max(nodes_max);
    spec.partition = args.partition.clone();
    spec.qos = args.qos.clone();
    spec.hold = args.hold;
    spec.submit_host = hostname();
    spec.preflight = preflight;
    spec.set_batch(args.batch);
    spec.set_spare_nodes(args.spare_nodes);
    if let Some(e) = &args.rdzv_endpoint {
        spec.extra.insert(proto::SPEC_EXTRA_RDZV_ENDPOINT.into(), e.clone());
    }
    spec.validate().map_err(anyhow::Error::msg)?;
    Ok(spec)
}

/// The options of `corral submit` given explicitly, as sbatch options (they override the
/// script's `#SBATCH` lines; options left at their defaults do not).
fn sbatch_overrides(args: &SubmitArgs) -> Vec<(&'static str, Option<String>)> {
    let mut out = Vec::new();
    let mut put = |name: &'static str, value: Option<String>| out.push((name, value));
    args.gres.clone().into_iter().for_each(|v| put("gres", Some(v)));
    args.time.clone().into_iter().for_each(|v| put("time", Some(v)));
    args.name.clone().into_iter().for_each(|v| put("job-name", Some(v)));
    args.output.clone().into_iter().for_each(|v| put("output", Some(v)));
    args.error.clone().into_iter().for_each(|v| put("error", Some(v)));
    args.chdir.iter().for_each(|d| put("chdir", Some(d.display().to_string())));
    if args.cpus_per_task != 1 {
        put("cpus-per-task", Some(args.cpus_per_task.to_string()));
    }
    args.mem.clone().into_iter().for_each(|v| put("mem", Some(v)));
    if args.nodes != "1" {
        put("nodes", Some(args.nodes.clone()));
    }
    if args.requeue {
        put("requeue", None);
    }
    args.partition.clone().into_iter().for_each(|v| put("partition", Some(v)));
    args.qos.clone().into_iter().for_each(|v| put("qos", Some(v)));
    if args.hold {
        put("hold", None);
    }
    if args.spare_nodes > 0 {
        put("spare-nodes", Some(args.spare_nodes.to_string()));
    }
    args.rdzv_endpoint.clone().into_iter().for_each(|v| put("rdzv-endpoint", Some(v)));
    out
}

/// A text file (a script) rather than a compiled program: ELF files are run as commands.
fn is_executable_binary(path: &std::path::Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok() && &magic == b"\x7fELF"
}

async fn wait_job(cluster: &Cluster, job: u64, timeout: Option<Duration>) -> anyhow::Result<Option<Job>> {
    let started = Instant::now();
    loop {
        match cluster.call(ClientRequest::GetJob { job }).await {
            Ok(Ok(Reply::Job(j))) if j.state.is_final() => return Ok(Some(*j)),
            Ok(Ok(_)) => {}
            Ok(Err(e @ ApiError::NotFound(_))) => return Err(e.into()),
            Ok(Err(e)) => tracing::debug!(error = %e, "job not readable yet"),
            Err(e) => tracing::debug!(error = %e, "no node answered"),
        }
        if timeout.is_some_and(|t| started.elapsed() >= t) {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `corral queue`: one line per job, or JSON.
pub fn print_queue(jobs: &[proto::Job], names: &BTreeMap<proto::NodeId, String>, as_json: bool) {
    if as_json {
        println!("{}", serde_json::Value::Array(jobs.iter().map(|j| job_json(j, names)).collect()));
    } else {
        println!("{:>8} {:<20} {:<10} {:<8} {:<10} {:<6} REASON", "JOBID", "NAME", "STATE", "USER", "NODE", "GPUS");
        for j in jobs {
            let node = j.last_nodes.iter().map(|n| names.get(n).cloned().unwrap_or_default()).collect::<Vec<_>>().join(",");
            println!(
                "{:>8} {:<20} {:<10} {:<8} {:<10} {:<6} {}",
                j.id,
                truncate(&j.spec.name, 20),
                j.state_name(),
                truncate(&j.spec.user, 8),
                node,
                j.spec.gpus(),
                if j.state == proto::JobState::Pending { j.reasons.join("; ") } else { String::new() }
            );
        }
    }
}

/// `corral show`: a job's fields, or JSON.
pub fn print_job(j: &proto::Job, names: &BTreeMap<proto::NodeId, String>, as_json: bool) {
    let v = job_json(j, names);
    if as_json {
        println!("{v}");
    } else {
        for (k, val) in v.as_object().into_iter().flatten() {
            println!("{k:>14}: {}", if val.is_string() { val.as_str().unwrap_or_default().to_string() } else { val.to_string() });
        }
        println!("{:>14}: {}", "workdir", j.spec.workdir);
        println!("{:>14}: {} / {}", "submit/start", fmt_time(Some(j.submit_ms)), fmt_time(j.start_ms));
    }
}

/// `corral logs`: a job's output from the node that ran it, until it ends with `follow`.
pub async fn follow_logs(cluster: &Cluster, job: proto::JobId, stderr: bool, follow: bool, patience: Duration) -> anyhow::Result<()> {
    let stream = if stderr { LogStream::Stderr } else { LogStream::Stdout };
    let mut offset = 0u64;
    let mut out = std::io::stdout();
    loop {
        let req = ClientRequest::Logs { job, stream, offset, max_bytes: proto::limits::LOG_CHUNK_BYTES_MAX };
        let Reply::LogChunk { data, next_offset, finished } = cluster.call_patiently(req, patience).await? else {
            bail!("unexpected reply");
        };
        out.write_all(&data).context("write output")?;
        out.flush().context("flush output")?;
        offset = next_offset;
        if !data.is_empty() {
            continue;
        }
        if !follow || finished {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// `corral nodes`: one line per node (and its unhealthy GPUs), or JSON.
/// `corral nodes`.
pub async fn nodes(cluster: &Cluster, as_json: bool, patience: Duration) -> anyhow::Result<()> {
    let Reply::Nodes(list) = cluster.call_patiently(ClientRequest::ListNodes, patience).await? else { bail!("unexpected reply") };
    print_nodes(&list, as_json);
    Ok(())
}

/// `corral cluster`.
pub async fn cluster_info(cluster: &Cluster, as_json: bool, patience: Duration) -> anyhow::Result<()> {
    let Reply::Cluster(info) = cluster.call_patiently(ClientRequest::ClusterInfo, patience).await? else { bail!("unexpected reply") };
    print_cluster(&info, as_json);
    Ok(())
}

fn print_nodes(list: &[proto::NodeInfo], as_json: bool) {
    if as_json {
        println!("{}", serde_json::Value::Array(list.iter().map(node_json).collect()));
    } else {
        println!("{:<10} {:<8} {:<7} {:>5} {:>5} {:<8} {:<22} REASON", "NAME", "STATE", "ROLE", "GPUS", "FREE", "TYPES", "ADDR");
        for n in list {
            println!(
                "{:<10} {:<8} {:<7} {:>5} {:>5} {:<8} {:<22} {}",
                n.name,
                n.state.as_str(),
                n.role.as_str(),
                n.gpus_total,
                n.gpus_free,
                n.gpu_types.join(","),
                n.addr,
                n.reason.clone().unwrap_or_default()
            );
            for (gpu, why) in &n.unhealthy_gpus {
                println!("{:<10}   gpu {gpu} unhealthy: {why}", "");
            }
        }
    }
}

/// `corral cluster`: the leader, term, indexes and members, or JSON.
fn print_cluster(info: &proto::ClusterInfo, as_json: bool) {
    if as_json {
        let members: Vec<_> = info.members.iter().map(|m| json!({"name": m.name, "role": m.role.as_str(), "addr": m.addr})).collect();
        println!(
            "{}",
            json!({"leader": info.leader, "term": info.term, "commit_index": info.commit_index, "applied_index": info.applied_index, "snapshot_index": info.snapshot_index, "purged_index": info.purged_index, "answered_by": info.answered_by, "state_digest": info.state_digest, "members": members})
        );
    } else {
        println!(
            "leader: {}  term: {}  commit index: {}  (answered by {})",
            info.leader.as_deref().unwrap_or("-"),
            info.term,
            info.commit_index,
            info.answered_by
        );
        for m in &info.members {
            println!("  {:<10} {:<7} {}", m.name, m.role.as_str(), m.addr);
        }
    }
}

/// `corral wait`: waits for a job to end; exits 0 if it completed, with its exit code (or 1) if
/// not, 124 if it did not end within `timeout`.
pub async fn wait_exit_code(cluster: &Cluster, job: proto::JobId, timeout: Option<f64>, as_json: bool) -> anyhow::Result<i32> {
    let timeout = timeout.map(Duration::from_secs_f64);
    match wait_job(cluster, job, timeout).await? {
        None => {
            eprintln!("job {job}: still not finished after {:.1} s", timeout.map_or(0.0, |t| t.as_secs_f64()));
            Ok(124)
        }
        Some(j) => {
            if as_json {
                println!("{}", job_json(&j, &node_names(cluster).await.unwrap_or_default()));
            }
            Ok(match (j.state, j.exit_code) {
                (proto::JobState::Completed, _) => 0,
                (_, Some(code)) if code != 0 => code.clamp(1, 255),
                _ => 1,
            })
        }
    }
}

/// `corral policy show|set FILE`: the scheduling policy as TOML (or JSON), or replaced by a
/// validated file.
pub async fn policy(cluster: &Cluster, action: PolicyCmd, as_json: bool, patience: Duration) -> anyhow::Result<()> {
    match action {
        PolicyCmd::Show => {
            let Reply::Policy(policy) = cluster.call_patiently(ClientRequest::GetPolicy, patience).await? else {
                bail!("unexpected reply")
            };
            if as_json {
                println!("{}", serde_json::to_string(&policy).context("encode policy")?);
            } else {
                print!("{}", toml::to_string(&policy).context("encode policy")?);
            }
        }
        PolicyCmd::Set { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("read policy {}", file.display()))?;
            let policy: proto::SchedulerPolicy = toml::from_str(&text).with_context(|| format!("parse policy {}", file.display()))?;
            policy.validate().map_err(anyhow::Error::msg)?;
            cluster.call_patiently(ClientRequest::SetPolicy { policy }, patience).await?;
        }
    }
    Ok(())
}

/// This host's name, as the job's submit host.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "localhost".into())
}

/// `s` cut to `n` characters, the last one `+` when cut.
fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(std::iter::once('+')).collect()
    }
}

/// `corral mig set NODE GPU PROFILES|auto` and `corral mig show [NODE]`.
pub async fn mig(cluster: &Cluster, action: MigCmd, as_json: bool, patience: Duration) -> anyhow::Result<()> {
    match action {
        MigCmd::Set { node, gpu, profiles } => {
            let profiles: Option<Vec<String>> = match profiles.trim() {
                "auto" => None,
                list => Some(list.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_string).collect()),
            };
            if profiles.as_ref().is_some_and(Vec::is_empty) {
                bail!("no MIG profile named: give PROFILE[,PROFILE...] or auto");
            }
            let req = ClientRequest::SetMigLayout { node: node.clone(), gpu, profiles: profiles.clone() };
            cluster.call_patiently(req, patience).await?;
            match (as_json, profiles) {
                (true, p) => println!("{}", json!({ "node": node, "gpu": gpu, "pinned": p })),
                (false, Some(p)) => println!("{node} gpu {gpu}: pinned to {}; applied once the GPU is idle", p.join(",")),
                (false, None) => println!("{node} gpu {gpu}: its layout follows the queue's demand again"),
            }
        }
        MigCmd::Show { node } => {
            let Reply::Nodes(list) = cluster.call_patiently(ClientRequest::ListNodes, patience).await? else { bail!("unexpected reply") };
            let list: Vec<&NodeInfo> = list.iter().filter(|n| node.as_ref().is_none_or(|want| &n.name == want)).collect();
            if let (Some(want), true) = (&node, list.is_empty()) {
                bail!("no node named {want}");
            }
            print_mig(&list, as_json);
        }
    }
    Ok(())
}

/// `corral mig show`: one line per MIG-mode GPU, or JSON.
fn print_mig(nodes: &[&NodeInfo], as_json: bool) {
    let rows = nodes.iter().flat_map(|n| n.mig.iter().map(move |g| (n.name.as_str(), g)));
    if as_json {
        let out: Vec<_> = rows.map(|(n, g)| json!({"node": n, "gpu": g.gpu, "layout": g.layout, "pinned": g.pinned})).collect();
        println!("{}", serde_json::Value::Array(out));
        return;
    }
    println!("{:<10} {:>3} {:<40} PINNED", "NODE", "GPU", "LAYOUT");
    for (name, g) in rows {
        let pinned = match &g.pinned {
            None => "-".to_string(),
            Some(p) if proto::same_mig_layout(p, &g.layout) => p.join(","),
            Some(p) => format!("{} (waits for the GPU to be idle)", p.join(",")),
        };
        println!("{:<10} {:>3} {:<40} {pinned}", name, g.gpu, g.layout.join(","));
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Submit {
        #[command(flatten)]
        args: SubmitArgs,
    }

    fn spec(argv: &[&str]) -> anyhow::Result<JobSpec> {
        let parsed = Submit::try_parse_from(std::iter::once("submit").chain(argv.iter().copied())).map_err(anyhow::Error::msg)?;
        build_spec(&parsed.args)
    }

    #[test]
    fn an_option_submit_lacks_is_refused_not_run_as_the_command() {
        let err = spec(&["-w", "h2", "--mem", "64M", "--", "sleep", "9"]).expect_err("-w is not an option of corral submit");
        assert!(err.to_string().contains("has no option -w"), "{err}");
        let ok = spec(&["--mem", "64M", "--", "sleep", "9"]).expect("a command after --");
        assert_eq!(ok.argv, ["sleep", "9"]);
        assert_eq!(spec(&["--", "sh", "-c", "exit 3"]).expect("options of the command").argv, ["sh", "-c", "exit 3"]);
    }

    #[test]
    fn nodes_take_a_count_or_slurms_range() {
        let one = spec(&["--", "true"]).expect("the default");
        assert_eq!((one.nodes, one.nodes_max()), (1, 1));
        let range = spec(&["-N", "2-4", "--", "true"]).expect("a range");
        assert_eq!((range.nodes, range.nodes_max()), (2, 4));
        let count = spec(&["--nodes", "3", "--", "true"]).expect("a count");
        assert_eq!((count.nodes, count.nodes_max()), (3, 3));
        let err = spec(&["-N", "4-2", "--", "true"]).expect_err("a range upside down");
        assert!(err.to_string().contains("Maximum node count 2 is less than minimum node count 4"), "{err}");
    }
}
