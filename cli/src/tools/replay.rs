//! `corral replay`: a trace replayed through the leader's engine under each policy named, with
//! the figures side by side and as ratios against the first policy (`replay` crate).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use replay::trace::TraceJob;
use replay::{cluster, metrics, placement, plot, timed, trace};
use serde_json::{json, Map, Value};

#[derive(Subcommand)]
pub enum ReplayCmd {
    /// A Philly CSV: the whole trace (timestamp,duration,num_gpus,...) or a slice
    /// (job,submit_s,duration_s,num_gpus,nodes,gpus_per_node,limit_bucket_s,vc,...).
    Philly {
        file: PathBuf,
        #[command(flatten)]
        timed: TimedArgs,
    },
    /// A cluster's history: `sacct -P -o JobID,Submit,Elapsed,Timelimit,NNodes,AllocTRES,User`
    /// or `sacct --json` output, of Corral or Slurm.
    Sacct {
        file: PathBuf,
        #[command(flatten)]
        timed: TimedArgs,
    },
    /// FGD's placement experiment on an openb pod list: inflated with seeded copies, shuffled,
    /// placed one by one with no departures.
    Openb(OpenbArgs),
}

#[derive(Args)]
pub struct OpenbArgs {
    pods: PathBuf,
    /// The node list (sn,cpu_milli,memory_mib,gpu,model).
    #[arg(long)]
    inventory: PathBuf,
    /// GPUs asked in all, as a share of the cluster's (FGD: 1.3).
    #[arg(long, default_value_t = 1.3)]
    inflate: f64,
    /// Seeds, as FIRST-LAST or a comma list (FGD: 42-51).
    #[arg(long, default_value = "42-51")]
    seeds: String,
    #[arg(long, default_value = "corral,slurm-22.05")]
    policies: String,
    /// FGD's `analysis_allo_discrete.csv`, to print its published figures beside.
    #[arg(long)]
    fgd_results: Option<PathBuf>,
    /// Shards of each GPU (Slurm's `gres/shard`): a pod asking a share of a GPU asks as many
    /// of them; 0 gives such a pod a whole GPU (no sharing).
    #[arg(long, default_value_t = 1000)]
    shards_per_gpu: u32,
    /// The CPU unit, in thousandths of a core: the trace's CPUs are milli-cores (Kubernetes'),
    /// counted here in units of this many, pods' rounded up, nodes' down. 1000: whole cores, as
    /// Slurm and Corral count them; FGD's simulator counts milli-cores.
    #[arg(long, default_value_t = 1000)]
    cpu_unit_milli: u32,
    /// Seeds replayed at once (each on a thread of its own).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Every GPU an A100 80GB in MIG mode, each pod asking the smallest profile that holds its
    /// share: Corral's layouts chosen from the demand (`corral-mig-demand`) against static
    /// layouts sized from the whole pod list (`corral-mig-static`); `--policies` is not read.
    #[arg(long)]
    mig: bool,
}

#[derive(Args)]
pub struct TimedArgs {
    /// Nodes of the cluster, each with --gpus, --cpus and --mem-gib.
    #[arg(long, default_value_t = 96)]
    nodes: u32,
    #[arg(long, default_value = "h100:8")]
    gpus: String,
    #[arg(long, default_value_t = 64)]
    cpus: u32,
    #[arg(long, default_value_t = 512)]
    mem_gib: u64,
    /// Policies to compare (first is the baseline of the ratios).
    #[arg(long, default_value = "corral,slurm-22.05")]
    policies: String,
    /// Write a plot of GPUs allocated, jobs queued and waits (SVG).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// The cluster's scheduling policy (partitions, QoS, fair-share decay), as `corral policy
    /// set FILE` takes it (TOML), to ask "what if" of a change.
    #[arg(long)]
    policy_file: Option<PathBuf>,
    /// Submit every job as this user (the trace's users set aside: no fair share between them).
    #[arg(long)]
    user: Option<String>,
    /// Replay only the first N jobs.
    #[arg(long)]
    limit: Option<usize>,
    /// Write each job's submission, start, end and the start its last backfill reservation
    /// promised (CSV: policy,job,gpus,submit_s,start_s,end_s,promised_s), to compare with a
    /// real cluster's `sacct`.
    #[arg(long)]
    starts: Option<PathBuf>,
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
}

fn policies(list: &str) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = list.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect();
    if names.is_empty() {
        bail!("--policies names none: the policies are {}", replay::POLICIES.join(", "));
    }
    for n in &names {
        replay::policy(n)?;
    }
    Ok(names)
}

pub fn run(cmd: ReplayCmd, json_out: bool) -> anyhow::Result<()> {
    match cmd {
        ReplayCmd::Philly { file, timed } => {
            policies(&timed.policies)?;
            let per_node = timed.gpus.split_once(':').and_then(|(_, n)| n.parse().ok()).unwrap_or(8);
            let jobs = trace::philly(&read(&file)?, per_node).with_context(|| format!("read the Philly trace {}", file.display()))?;
            run_timed(&file, jobs, 0, timed, json_out)
        }
        ReplayCmd::Sacct { file, timed } => {
            policies(&timed.policies)?;
            let text = read(&file)?;
            let (jobs, skipped) =
                if text.trim_start().starts_with('{') { trace::sacct_json(&text)? } else { trace::sacct_parsable(&text)? };
            run_timed(&file, jobs, skipped, timed, json_out)
        }
        ReplayCmd::Openb(args) => run_openb(&args, json_out),
    }
}

fn run_timed(file: &Path, mut jobs: Vec<TraceJob>, skipped: usize, args: TimedArgs, json_out: bool) -> anyhow::Result<()> {
    if let Some(n) = args.limit {
        jobs.truncate(n);
    }
    if let Some(user) = &args.user {
        for j in &mut jobs {
            j.user.clone_from(user);
        }
    }
    let names = policies(&args.policies)?;
    let nodes = cluster::uniform(args.nodes, &args.gpus, args.cpus, args.mem_gib * 1024)?;
    let cluster_policy = match &args.policy_file {
        Some(path) => {
            let p: proto::SchedulerPolicy = toml::from_str(&read(path)?).with_context(|| format!("parse policy {}", path.display()))?;
            p.validate().map_err(anyhow::Error::msg)?;
            Some(p)
        }
        None => None,
    };
    let mut outcomes = Vec::new();
    let mut reports = Vec::new();
    for name in &names {
        let started = Instant::now();
        let out = timed::run_with(&jobs, &nodes, replay::policy(name)?, cluster_policy.as_ref())
            .with_context(|| format!("replay under {name}"))?;
        reports.push(metrics::report(name, &out, started.elapsed().as_secs_f64()));
        outcomes.push((name.clone(), out));
    }
    if let Some(path) = &args.plot {
        let runs: Vec<(String, &timed::Outcome)> = outcomes.iter().map(|(n, o)| (n.clone(), o)).collect();
        let name = file.file_name().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned());
        let title = format!("{name} on {} nodes x {}", args.nodes, args.gpus);
        std::fs::write(path, plot::svg(&title, &runs)).with_context(|| format!("write the plot {}", path.display()))?;
    }
    if let Some(path) = &args.starts {
        let mut csv = String::from("policy,job,gpus,submit_s,start_s,end_s,promised_s\n");
        let opt = |ms: Option<u64>| ms.map_or(String::new(), |ms| format!("{:.3}", ms as f64 / 1000.0));
        for (name, out) in &outcomes {
            for j in &out.jobs {
                let submit_s = j.submit_ms as f64 / 1000.0;
                let (start, end, promised) = (opt(j.start_ms), opt(j.end_ms), opt(j.promised_ms));
                let _ = writeln!(csv, "{name},{},{},{submit_s:.3},{start},{end},{promised}", j.trace_id, j.gpus);
            }
        }
        std::fs::write(path, csv).with_context(|| format!("write {}", path.display()))?;
    }
    if json_out {
        let mut obj = Map::new();
        for r in &reports {
            obj.insert(r.policy.clone(), serde_json::to_value(r)?);
        }
        println!("{}", Value::Object(obj));
        return Ok(());
    }
    println!("{} jobs of {} on {} nodes x {} ({} left out: never ran)", jobs.len(), file.display(), args.nodes, args.gpus, skipped);
    print!("{}", table(&reports));
    if let Some(path) = &args.plot {
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// How a row of the table reads its figure from a report.
type Figure = fn(&metrics::Report) -> f64;

/// The reports side by side, each figure also as a ratio to the first policy's.
fn table(reports: &[metrics::Report]) -> String {
    let rows: Vec<(&str, Figure)> = vec![
        ("jobs started", |r| r.started as f64),
        ("gpu_alloc_pct", |r| r.gpu_alloc_pct),
        ("gpu_alloc_when_fits_pct", |r| r.gpu_alloc_when_fits_pct),
        ("mean_wait_s", |r| r.mean_wait_s),
        ("p50_wait_s", |r| r.p50_wait_s),
        ("p99_wait_s", |r| r.p99_wait_s),
        ("mean_wait_1gpu_s", |r| r.mean_wait_1gpu_s),
        ("p99_wait_1gpu_s", |r| r.p99_wait_1gpu_s),
        ("mean_wait_2to8_s", |r| r.mean_wait_2to8_s),
        ("p99_wait_2to8_s", |r| r.p99_wait_2to8_s),
        ("mean_wait_large_s", |r| r.mean_wait_large_s),
        ("p99_wait_large_s", |r| r.p99_wait_large_s),
        ("max_wait_large_s", |r| r.max_wait_large_s),
        ("mean_jct_s", |r| r.mean_jct_s),
        ("p99_jct_s", |r| r.p99_jct_s),
        ("mean_bounded_slowdown", |r| r.mean_bounded_slowdown),
        ("makespan_s", |r| r.makespan_s),
        ("reservation_slips", |r| r.reservation_slips as f64),
        ("passes", |r| r.passes as f64),
        ("replay_wall_s", |r| r.replay_wall_s),
    ];
    // Each column as wide as its name; ratios are named by each policy's column number.
    let widths: Vec<usize> = reports.iter().map(|r| r.policy.len().max(12) + 2).collect();
    let mut s = format!("{:<26}", "metric");
    for (k, r) in reports.iter().enumerate() {
        let _ = write!(s, "{:>w$}", r.policy, w = widths[k]);
    }
    for k in 1..reports.len() {
        let _ = write!(s, "{:>10}", format!("[1]/[{}]", k + 1));
    }
    s.push('\n');
    for (name, get) in rows {
        let _ = write!(s, "{name:<26}");
        for (k, r) in reports.iter().enumerate() {
            let _ = write!(s, "{:>w$.2}", get(r), w = widths[k]);
        }
        let base = get(&reports[0]);
        for r in reports.iter().skip(1) {
            let v = get(r);
            let ratio = if v != 0.0 { format!("{:.3}x", base / v) } else { "-".into() };
            let _ = write!(s, "{ratio:>10}");
        }
        s.push('\n');
    }
    s
}

fn parse_seeds(text: &str) -> anyhow::Result<Vec<u64>> {
    let bad = || format!("--seeds takes FIRST-LAST or a comma list, not '{text}'");
    if let Some((a, b)) = text.split_once('-') {
        let (a, b): (u64, u64) = (a.trim().parse().with_context(bad)?, b.trim().parse().with_context(bad)?);
        if b < a || b - a > 1_000 {
            bail!("{}", bad());
        }
        return Ok((a..=b).collect());
    }
    text.split(',').map(|s| s.trim().parse().with_context(bad)).collect()
}

/// FGD's published allocation for `workload` at 100% and 130% of demand: per policy, the mean
/// over its seeds.
fn fgd_published(text: &str, workload: &str) -> anyhow::Result<Vec<(String, f64, f64, usize)>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).with_context(|| format!("FGD results have no column {name}"));
    let (c_work, c_pol, c100, c130) = (col("workload")?, col("sc_policy")?, col("100")?, col("130")?);
    let mut sums: std::collections::BTreeMap<String, (f64, f64, usize)> = Default::default();
    for line in lines {
        let f: Vec<&str> = line.split(',').collect();
        if f.get(c_work) != Some(&workload) {
            continue;
        }
        let (Some(a), Some(b)) = (f.get(c100).and_then(|v| v.parse::<f64>().ok()), f.get(c130).and_then(|v| v.parse::<f64>().ok())) else {
            continue;
        };
        let e = sums.entry(f[c_pol].to_string()).or_default();
        e.0 += a;
        e.1 += b;
        e.2 += 1;
    }
    Ok(sums.into_iter().map(|(p, (a, b, n))| (p, a / n as f64, b / n as f64, n)).collect())
}

/// The MIG variant's rows: layouts chosen from the demand, and static ones.
const MIG_DEMAND: &str = "corral-mig-demand";
const MIG_STATIC: &str = "corral-mig-static";

/// The nodes and policy of one openb row: as read, or in MIG mode for the MIG rows (every GPU
/// with no instance yet, or with the layouts `tasks` size).
fn openb_setup(
    name: &str,
    nodes: &[cluster::NodeSpec],
    tasks: &[trace::Pod],
) -> anyhow::Result<(Vec<cluster::NodeSpec>, Box<dyn replay::Policy>)> {
    let in_mig = |layouts: &mut dyn Iterator<Item = Vec<String>>| -> Vec<cluster::NodeSpec> {
        let mut out = nodes.to_vec();
        for n in &mut out {
            n.mig_layouts = (0..n.gpus).map(|_| layouts.next().unwrap_or_default()).collect();
        }
        out
    };
    Ok(match name {
        MIG_DEMAND => (in_mig(&mut std::iter::repeat(Vec::new())), replay::policy("corral")?),
        MIG_STATIC => {
            let gpus: u32 = nodes.iter().map(|n| n.gpus).sum();
            (in_mig(&mut replay::mig::static_layouts(tasks, gpus as usize).into_iter()), replay::corral_static_mig())
        }
        _ => (nodes.to_vec(), replay::placement_policy(name)?),
    })
}

fn run_openb(args: &OpenbArgs, json_out: bool) -> anyhow::Result<()> {
    let OpenbArgs { pods, inventory, inflate, seeds, policies: list, fgd_results: fgd, shards_per_gpu, cpu_unit_milli, threads, mig } =
        args;
    let (inflate, shards_per_gpu, cpu_unit_milli) = (*inflate, *shards_per_gpu, *cpu_unit_milli);
    if shards_per_gpu > proto::limits::SHARDS_PER_GPU_MAX {
        bail!("--shards-per-gpu takes at most {}, not {shards_per_gpu}", proto::limits::SHARDS_PER_GPU_MAX);
    }
    if !(1..=1000).contains(&cpu_unit_milli) {
        bail!("--cpu-unit-milli takes 1 to 1000, not {cpu_unit_milli}");
    }
    if !(0.1..=10.0).contains(&inflate) {
        bail!("--inflate takes a share between 0.1 and 10, not {inflate}");
    }
    let pod_list = trace::openb_pods(&read(pods)?).with_context(|| format!("read the pod list {}", pods.display()))?;
    let nodes = cluster::openb_nodes(&read(inventory)?, shards_per_gpu, cpu_unit_milli)
        .with_context(|| format!("read the node list {}", inventory.display()))?;
    let nodes: Vec<_> = nodes.into_iter().filter(|n| n.gpus > 0 || n.cpus > 0).collect();
    let capacity_milli: u64 = nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum();
    let seeds = parse_seeds(seeds)?;
    let names = if *mig { vec![MIG_DEMAND.to_string(), MIG_STATIC.to_string()] } else { policies(list)? };
    let mut out = Map::new();
    let mut lines = Vec::new();
    for name in &names {
        let started = Instant::now();
        let run = |seed: u64| {
            let tasks = placement::inflated(&pod_list, capacity_milli, inflate, seed);
            let (nodes, policy) = openb_setup(name, &nodes, &tasks)?;
            placement::run(&tasks, &nodes, cpu_unit_milli, policy, name, seed)
        };
        let mut runs = Vec::new();
        for batch in seeds.chunks((*threads).max(1)) {
            let done: Vec<anyhow::Result<placement::PlacementReport>> = std::thread::scope(|scope| {
                let handles: Vec<_> = batch.iter().map(|&seed| scope.spawn(move || run(seed))).collect();
                handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a replay thread panicked")))).collect()
            });
            for r in done {
                runs.push(r?);
            }
        }
        let n = runs.len().max(1) as f64;
        let mean = |f: fn(&placement::PlacementReport) -> f64| runs.iter().map(f).sum::<f64>() / n;
        let (alloc, alloc100, placed) = (mean(|r| r.gpu_alloc_pct), mean(|r| r.gpu_alloc_at_100_pct), mean(|r| r.placed as f64));
        lines.push(format!(
            "{name:<20} gpu_alloc_pct {alloc:6.2} (at 100% of demand {alloc100:6.2})  placed {placed:8.0}  shares on whole GPUs {:6.0}  ({:.1} s)",
            mean(|r| r.shares_on_whole_gpus as f64),
            started.elapsed().as_secs_f64()
        ));
        out.insert(name.clone(), json!({"gpu_alloc_pct": alloc, "gpu_alloc_at_100_pct": alloc100, "placed": placed, "seeds": runs}));
    }
    let workload = pods.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
    let published = match fgd {
        Some(path) => fgd_published(&read(path)?, &workload)?,
        None => Vec::new(),
    };
    if json_out {
        if !published.is_empty() {
            let fgd: Map<String, Value> = published
                .iter()
                .map(|(p, a, b, n)| (p.clone(), json!({"gpu_alloc_at_100_pct": a, "gpu_alloc_pct": b, "seeds": n})))
                .collect();
            out.insert("fgd_published".into(), Value::Object(fgd));
        }
        println!("{}", Value::Object(out));
        return Ok(());
    }
    println!(
        "{} pods of {} inflated to {:.0}% of {} GPUs on {} nodes, seeds {:?}",
        pod_list.len(),
        workload,
        inflate * 100.0,
        capacity_milli / 1000,
        nodes.len(),
        seeds
    );
    for l in lines {
        println!("{l}");
    }
    for (p, a, b, n) in published {
        println!("FGD published {p:<16} gpu_alloc_pct {b:6.2} (at 100% of demand {a:6.2}), mean of {n} seeds");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_as_ranges_and_lists() {
        assert_eq!(parse_seeds("42-45").unwrap(), vec![42, 43, 44, 45]);
        assert_eq!(parse_seeds("1,5").unwrap(), vec![1, 5]);
        assert!(parse_seeds("5-1").is_err());
        assert!(parse_seeds("x").is_err());
    }

    #[test]
    fn fgd_results_are_averaged_per_policy() {
        let text = "workload,sc_policy,tune,seed,total_gpus,99,100,130\nw,06-FGD,1.3,42,8,1,90,95\nw,06-FGD,1.3,43,8,1,92,97\nv,06-FGD,1.3,42,8,1,1,1\n";
        assert_eq!(fgd_published(text, "w").unwrap(), vec![("06-FGD".to_string(), 91.0, 96.0, 2)]);
    }
}
