//! `sstat`: what the running steps of a job use now, as Slurm 22.05 prints it (its fields, their
//! order and widths read from `../shared/peers/slurm`). Each node of the job reads its tasks'
//! processes in `/proc` (`ClientRequest::StepUsage`), summed per task over the task's session; sstat
//! gathers them per step: the task and node with the most (or least) of each, and the average.
//! What Corral does not measure (CPU frequency, energy, TRES usage) prints as Slurm prints it
//! when its gatherer has nothing: `0`, `Unknown` or empty.

use std::collections::BTreeMap;

use proto::{ClientRequest, JobState, Reply, TaskUsage};

use super::opts::{self, opt, Arg, OptDef};
use super::sacct::{fit, Style};
use super::SlurmError;

const PROG: &str = "sstat";

const OPTIONS: &[OptDef] = &[
    opt("allsteps", Some('a'), Arg::No),
    opt("fields", None, Arg::Required),
    opt("format", Some('o'), Arg::Required),
    opt("help", Some('h'), Arg::No),
    opt("jobs", Some('j'), Arg::Required),
    opt("noheader", Some('n'), Arg::No),
    opt("parsable", Some('p'), Arg::No),
    opt("parsable2", Some('P'), Arg::No),
    opt("usage", None, Arg::No),
    opt("verbose", Some('v'), Arg::No),
    opt("version", Some('V'), Arg::No),
];

/// Slurm 22.05's fields, in its default order, with its column widths (from its header).
const FIELDS: &[(&str, usize)] = &[
    ("JobID", 12),
    ("MaxVMSize", 10),
    ("MaxVMSizeNode", 14),
    ("MaxVMSizeTask", 14),
    ("AveVMSize", 10),
    ("MaxRSS", 10),
    ("MaxRSSNode", 10),
    ("MaxRSSTask", 10),
    ("AveRSS", 10),
    ("MaxPages", 8),
    ("MaxPagesNode", 12),
    ("MaxPagesTask", 14),
    ("AvePages", 10),
    ("MinCPU", 10),
    ("MinCPUNode", 10),
    ("MinCPUTask", 10),
    ("AveCPU", 10),
    ("NTasks", 8),
    ("AveCPUFreq", 10),
    ("ReqCPUFreqMin", 13),
    ("ReqCPUFreqMax", 13),
    ("ReqCPUFreqGov", 13),
    ("ConsumedEnergy", 14),
    ("MaxDiskRead", 12),
    ("MaxDiskReadNode", 15),
    ("MaxDiskReadTask", 15),
    ("AveDiskRead", 12),
    ("MaxDiskWrite", 12),
    ("MaxDiskWriteNode", 16),
    ("MaxDiskWriteTask", 16),
    ("AveDiskWrite", 12),
    ("TRESUsageInAve", 14),
    ("TRESUsageInMax", 14),
    ("TRESUsageInMaxNode", 18),
    ("TRESUsageInMaxTask", 18),
    ("TRESUsageInMin", 14),
    ("TRESUsageInMinNode", 18),
    ("TRESUsageInMinTask", 18),
    ("TRESUsageInTot", 14),
    ("TRESUsageOutAve", 15),
    ("TRESUsageOutMax", 15),
    ("TRESUsageOutMaxNode", 19),
    ("TRESUsageOutMaxTask", 19),
    ("TRESUsageOutMin", 15),
    ("TRESUsageOutMinNode", 19),
    ("TRESUsageOutMinTask", 19),
    ("TRESUsageOutTot", 15),
];

/// One task's usage, with its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeTask {
    pub node: String,
    pub usage: TaskUsage,
}

/// `N` as Slurm's `convert_num_unit` prints an amount of `unit` (K for KiB, none for bytes):
/// scaled by 1024 while it is that large, two decimals unless whole.
pub fn amount(value: u64, unit: usize) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let (mut v, mut u) = (value as f64, unit);
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{}{}", v as u64, UNITS[u])
    } else {
        format!("{v:.2}{}", UNITS[u])
    }
}

/// A CPU time as sstat prints MinCPU and AveCPU: `00:MM:SS`, `HH:MM:SS`, `D-HH:MM:SS`.
fn cpu(ms: u64) -> String {
    super::time::elapsed(ms / 1000)
}

/// A quantity sstat shows as `Max{name}` (or `Min{name}`), with its `Node` and `Task`, and
/// `Ave{name}`: what of a task's usage it reads, and how an amount of it prints.
struct Measure {
    name: &'static str,
    of: fn(&TaskUsage) -> u64,
    show: fn(u64) -> String,
}

const MEASURES: [Measure; 6] = [
    Measure { name: "VMSize", of: |u| u.vmsize_kib, show: |v| amount(v, 1) },
    Measure { name: "RSS", of: |u| u.rss_kib, show: |v| amount(v, 1) },
    Measure { name: "Pages", of: |u| u.pages, show: |v| v.to_string() },
    Measure { name: "CPU", of: |u| u.cpu_ms, show: cpu },
    Measure { name: "DiskRead", of: |u| u.read_bytes, show: |v| amount(v, 0) },
    Measure { name: "DiskWrite", of: |u| u.write_bytes, show: |v| amount(v, 0) },
];

/// The value of field `name` for the step `id` (`14.0`, `14.batch`) over its `tasks`. Pure.
pub fn value(name: &str, id: &str, tasks: &[NodeTask]) -> String {
    match name {
        "JobID" => return id.to_string(),
        "NTasks" => return tasks.len().to_string(),
        "AveCPUFreq" | "ConsumedEnergy" => return "0".into(),
        "ReqCPUFreqMin" | "ReqCPUFreqMax" | "ReqCPUFreqGov" => return "Unknown".into(),
        _ => {}
    }
    // `Max|Min|Ave` + a measure + `Node|Task|` (TRES usage and the like match none: empty).
    let Some((stat, rest)) = ["Max", "Min", "Ave"].into_iter().find_map(|p| name.strip_prefix(p).map(|r| (p, r))) else {
        return String::new();
    };
    let Some((m, part)) = MEASURES.iter().find_map(|m| rest.strip_prefix(m.name).map(|part| (m, part))) else {
        return String::new();
    };
    if stat == "Ave" {
        let sum: u64 = tasks.iter().map(|t| (m.of)(&t.usage)).sum();
        return (m.show)(sum.checked_div(tasks.len() as u64).unwrap_or(0));
    }
    let chosen = if stat == "Max" { tasks.iter().max_by_key(|t| (m.of)(&t.usage)) } else { tasks.iter().min_by_key(|t| (m.of)(&t.usage)) };
    match (chosen, part) {
        (None, _) => String::new(),
        (Some(t), "Node") => t.node.clone(),
        (Some(t), "Task") => t.usage.rank.to_string(),
        (Some(t), _) => (m.show)((m.of)(&t.usage)),
    }
}

/// The table of `steps` (id and tasks) in `fields`.
pub fn table(steps: &[(String, Vec<NodeTask>)], fields: &[(&'static str, usize)], style: Style, header: bool) -> String {
    let line = |cells: Vec<String>| -> String {
        match style {
            // JobID is left-aligned, the rest right-aligned, as Slurm prints them.
            Style::Columns => {
                cells.iter().zip(fields).map(|(c, (n, w))| fit(c, if *n == "JobID" { -(*w as i32) } else { *w as i32 }) + " ").collect()
            }
            Style::Parsable => cells.iter().map(|c| format!("{c}|")).collect(),
            Style::Parsable2 => cells.join("|"),
        }
    };
    let mut out = String::new();
    if header {
        out += &line(fields.iter().map(|(n, _)| n.to_string()).collect());
        out.push('\n');
        if style == Style::Columns {
            out += &line(fields.iter().map(|(_, w)| "-".repeat(*w)).collect());
            out.push('\n');
        }
    }
    for (id, tasks) in steps {
        out += &line(fields.iter().map(|(n, _)| value(n, id, tasks)).collect());
        out.push('\n');
    }
    out
}

/// `--format=JobID,MaxRSS%20,...` (names in any case).
fn parse_fields(text: &str) -> Result<Vec<(&'static str, usize)>, SlurmError> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, width) = item.split_once('%').map_or((item, None), |(n, w)| (n, w.parse::<usize>().ok()));
        let (canon, default) = FIELDS
            .iter()
            .find(|(f, _)| f.eq_ignore_ascii_case(name))
            .copied()
            .ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid field requested: \"{name}\"")))?;
        out.push((canon, width.unwrap_or(default)));
    }
    Ok(out)
}

/// Which steps of a job `-j` names: one (`Some`), `batch`, or the job's (`None`).
enum Wanted {
    Step(u32),
    Batch,
    Default,
}

fn parse_target(text: &str) -> Result<(proto::JobId, Wanted), SlurmError> {
    let bad = || SlurmError::fatal(PROG, format!("Invalid job id: {text}"));
    let (job, step) = text.split_once('.').map_or((text, None), |(j, s)| (j, Some(s)));
    let job = job.parse().map_err(|_| bad())?;
    let wanted = match step {
        None => Wanted::Default,
        Some("batch") => Wanted::Batch,
        Some(s) => Wanted::Step(s.parse().map_err(|_| bad())?),
    };
    Ok((job, wanted))
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, false)?;
    if p.has("help") || p.has("usage") {
        println!("Usage: sstat [options] -j <job(.stepid)>");
        return Ok(0);
    }
    if p.has("version") {
        return Ok(super::print_version());
    }
    let targets: Vec<&str> = p
        .all("jobs")
        .into_iter()
        .chain(p.operands.iter().map(String::as_str))
        .flat_map(|v| v.split(','))
        .filter(|s| !s.is_empty())
        .collect();
    if targets.is_empty() {
        return Err(SlurmError::fatal(PROG, "You didn't give me any jobs to stat."));
    }
    let fields = match p.last("format").or(p.last("fields")) {
        Some(f) => parse_fields(f)?,
        None => FIELDS.to_vec(),
    };
    let style = if p.has("parsable2") {
        Style::Parsable2
    } else if p.has("parsable") {
        Style::Parsable
    } else {
        Style::Columns
    };
    let cluster = super::connect(PROG)?;
    let mut steps = Vec::new();
    for text in targets {
        let (job, wanted) = parse_target(text)?;
        steps.extend(super::block_on(PROG, job_steps(&cluster, job, wanted, p.has("allsteps")))??);
    }
    print!("{}", table(&steps, &fields, style, !p.has("noheader")));
    Ok(0)
}

/// The chosen steps of running `job`, each with its tasks' usage on every node.
async fn job_steps(
    cluster: &crate::client::Cluster,
    job: proto::JobId,
    wanted: Wanted,
    all: bool,
) -> Result<Vec<(String, Vec<NodeTask>)>, SlurmError> {
    let none = || SlurmError::fatal(PROG, format!("couldn't get steps for job {job}"));
    let found = match cluster.call_patiently(ClientRequest::GetJob { job }, super::PATIENCE).await {
        Ok(Reply::Job(j)) if j.state == JobState::Running => *j,
        _ => return Err(none()),
    };
    let names = super::node_names(&super::list_nodes(PROG, cluster).await?);
    let mut by_step: BTreeMap<Option<u32>, Vec<NodeTask>> = BTreeMap::new();
    for node in super::job_node_names(&found, &names) {
        let usages = match super::call(PROG, cluster, ClientRequest::StepUsage { job, node: node.clone() }).await? {
            Reply::StepUsage(u) => u,
            other => return Err(SlurmError::fatal(PROG, format!("unexpected reply {other:?}"))),
        };
        for usage in usages {
            by_step.entry(usage.step).or_default().push(NodeTask { node: node.clone(), usage });
        }
    }
    let id = |step: Option<u32>| step.map_or_else(|| format!("{job}.batch"), |s| format!("{job}.{s}"));
    let chosen: Vec<Option<u32>> = match wanted {
        Wanted::Step(s) => vec![Some(s)],
        Wanted::Batch => vec![None],
        // Slurm's: the lowest-numbered running step (not the batch script), or all with -a.
        Wanted::Default if all => by_step.keys().copied().collect(),
        Wanted::Default => by_step.keys().copied().find(Option::is_some).into_iter().collect(),
    };
    let steps: Vec<(String, Vec<NodeTask>)> = chosen.into_iter().filter_map(|s| by_step.remove(&s).map(|t| (id(s), t))).collect();
    if steps.is_empty() {
        return Err(none());
    }
    Ok(steps)
}
