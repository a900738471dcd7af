//! `sacct`: accounting lines for jobs from the cluster's job list (finished ones included),
//! with `--format`, `-P/--parsable2`, `-p`, `-S/-E` windows and filters: a line for each job,
//! then (without `-X`) one for its batch script (`ID.batch`), one for its extern step
//! (`ID.extern`, its allocation on its nodes) and one for each step of its last run (`ID.N`),
//! as the log recorded them. `--json` prints the same jobs as Slurm 22.05's `dbv0.0.38` objects
//! (`slurm_compat::acct`), ignoring the format options as Slurm does.

use std::collections::BTreeMap;

use proto::{Job, JobState};
use slurm_compat::acct::{self, StepKind};

use super::env::DEFAULT_PARTITION;
use super::opts::{self, opt, Arg, OptDef};
use super::squeue::{mem_text, parse_state, run_seconds};
use super::{hostlist, time, SlurmError};

pub const PROG: &str = "sacct";

pub const DEFAULT_FIELDS: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";
pub const BRIEF_FIELDS: &str = "JobID,State,ExitCode";
pub const LONG_FIELDS: &str = "JobID,JobIDRaw,JobName,Partition,User,Account,AllocCPUS,AllocTRES,ReqMem,NNodes,NodeList,State,ExitCode,Submit,Start,End,Elapsed,Timelimit,WorkDir";

const OPTIONS: &[OptDef] = &[
    opt("allocations", Some('X'), Arg::No),
    opt("allusers", Some('a'), Arg::No),
    opt("accounts", Some('A'), Arg::Required),
    opt("brief", Some('b'), Arg::No),
    opt("clusters", Some('M'), Arg::Required),
    opt("duplicates", Some('D'), Arg::No),
    opt("endtime", Some('E'), Arg::Required),
    opt("format", Some('o'), Arg::Required),
    opt("help", Some('h'), Arg::No),
    opt("helpformat", Some('e'), Arg::No),
    opt("jobs", Some('j'), Arg::Required),
    opt("json", None, Arg::No),
    opt("long", Some('l'), Arg::No),
    opt("name", None, Arg::Required),
    opt("noheader", Some('n'), Arg::No),
    opt("nodelist", Some('N'), Arg::Required),
    opt("parsable", Some('p'), Arg::No),
    opt("parsable2", Some('P'), Arg::No),
    opt("partition", Some('r'), Arg::Required),
    opt("qos", Some('q'), Arg::Required),
    opt("starttime", Some('S'), Arg::Required),
    opt("state", Some('s'), Arg::Required),
    opt("units", None, Arg::Required),
    opt("user", Some('u'), Arg::Required),
    opt("usage", None, Arg::No),
    opt("verbose", Some('v'), Arg::No),
    opt("version", Some('V'), Arg::No),
];

/// Field names, default widths (negative: left-justified) as sacct has them.
const FIELDS: &[(&str, i32)] = &[
    ("Account", 10),
    ("AllocCPUS", 10),
    ("AllocNodes", 10),
    ("AllocTRES", 10),
    ("ArrayJobID", 15),
    ("ArrayTaskID", 11),
    ("CPUTime", 10),
    ("CPUTimeRAW", 10),
    ("Elapsed", 10),
    ("ElapsedRaw", 10),
    ("Eligible", 19),
    ("End", 19),
    ("ExitCode", 8),
    ("GPUSeconds", 10),
    ("Group", 9),
    ("JobID", -12),
    ("JobIDRaw", -12),
    ("JobName", 10),
    ("NCPUS", 10),
    ("NNodes", 8),
    ("NodeList", -15),
    ("Partition", 10),
    ("QOS", 10),
    ("Reason", 20),
    ("ReqCPUS", 8),
    ("ReqMem", 10),
    ("ReqNodes", 8),
    ("ReqTRES", 10),
    ("Restarts", 8),
    ("Start", 19),
    ("State", 10),
    ("Submit", 19),
    ("Timelimit", 10),
    ("UID", 6),
    ("User", 9),
    ("WorkDir", 10),
];

/// A requested column: its canonical name and width (negative: left-justified).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: &'static str,
    pub width: i32,
}

/// Parses `--format=JobID,JobName%30,...` (names in any case).
pub fn parse_fields(text: &str) -> Result<Vec<Column>, SlurmError> {
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, width) = match item.split_once('%') {
            Some((n, w)) => (n, Some(w.parse::<i32>().map_err(|_| SlurmError::fatal(PROG, format!("Invalid field width: {item}")))?)),
            None => (item, None),
        };
        let (canon, default) = FIELDS
            .iter()
            .find(|(f, _)| f.eq_ignore_ascii_case(name))
            .copied()
            .ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid field requested: \"{name}\"")))?;
        let width = match width {
            Some(w) if default < 0 => -w.abs(),
            Some(w) => w.abs(),
            None => default,
        };
        out.push(Column { name: canon, width });
    }
    Ok(out)
}

fn alloc_tres(job: &Job) -> String {
    if job.start_ms.is_none() {
        return String::new();
    }
    let s = &job.spec;
    let nodes = u64::from(s.nodes);
    let cpus = u64::from(s.cpus_per_task) * u64::from(s.ntasks_per_node) * nodes;
    let mut parts = vec![format!("billing={cpus}"), format!("cpu={cpus}")];
    if s.gpus() > 0 {
        parts.push(format!("gres/gpu={}", u64::from(s.gpus()) * nodes));
    }
    parts.push(format!("mem={}", mem_text(s.mem_mib.saturating_mul(nodes))));
    parts.push(format!("node={nodes}"));
    parts.join(",")
}

/// One field of one job.
pub fn value(job: &Job, name: &str, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    let s = &job.spec;
    let ran = job.start_ms.is_some();
    let nodes = super::job_node_names(job, names);
    let cpus = u64::from(s.cpus_per_task) * u64::from(s.ntasks_per_node) * u64::from(s.nodes);
    match name {
        "Account" => s.account.clone().unwrap_or_default(),
        "AllocCPUS" | "NCPUS" => {
            if ran {
                cpus.to_string()
            } else {
                "0".into()
            }
        }
        "AllocNodes" => {
            if ran {
                s.nodes.to_string()
            } else {
                "0".into()
            }
        }
        "AllocTRES" => alloc_tres(job),
        "ArrayJobID" => job.array.as_ref().map_or(String::new(), |a| a.array_job.to_string()),
        "ArrayTaskID" => job.array.as_ref().map_or(String::new(), |a| a.task.to_string()),
        "CPUTime" => time::elapsed(run_seconds(job, now_ms) * cpus),
        "CPUTimeRAW" => (run_seconds(job, now_ms) * cpus).to_string(),
        "Elapsed" => time::elapsed(run_seconds(job, now_ms)),
        "ElapsedRaw" => run_seconds(job, now_ms).to_string(),
        "Eligible" => time::datetime(s.begin_ms.unwrap_or(job.submit_ms)),
        "End" => job.end_ms.map_or("Unknown".into(), time::datetime),
        "ExitCode" => super::exit_code_text(job),
        // Corral's: GPU-seconds used, a MIG instance by its share of the GPU (Slurm has no such field).
        "GPUSeconds" => job.gpu_seconds.to_string(),
        "Group" => s.gid.map_or(String::new(), |g| g.to_string()),
        "JobID" => super::display_id(job),
        "JobIDRaw" => job.id.to_string(),
        "JobName" => s.name.clone(),
        "NNodes" => s.nodes.to_string(),
        "NodeList" => {
            if nodes.is_empty() {
                "None assigned".into()
            } else {
                hostlist::compress(&nodes)
            }
        }
        "Partition" => s.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.into()),
        "QOS" => s.qos.clone().unwrap_or_else(|| "normal".into()),
        "Reason" => {
            if job.state == JobState::Pending {
                super::squeue::reason_code(job)
            } else {
                "None".into()
            }
        }
        "ReqCPUS" => cpus.to_string(),
        "ReqMem" => mem_text(s.mem_mib),
        "ReqNodes" => s.nodes.to_string(),
        "ReqTRES" => {
            let mut t = format!("billing={cpus},cpu={cpus}");
            if s.gpus() > 0 {
                t.push_str(&format!(",gres/gpu={}", s.gpus() * s.nodes));
            }
            t.push_str(&format!(",mem={},node={}", mem_text(s.mem_mib.saturating_mul(u64::from(s.nodes))), s.nodes));
            t
        }
        "Restarts" => job.restart_count.to_string(),
        "Start" => job.start_ms.map_or("Unknown".into(), time::datetime),
        "State" => job.state_name().into(),
        "Submit" => time::datetime(job.submit_ms),
        "Timelimit" => s.time_limit_ms.map_or("UNLIMITED".into(), |ms| time::elapsed(ms / 1000)),
        "UID" => s.uid.map_or(String::new(), |u| u.to_string()),
        "User" => s.user.clone(),
        "WorkDir" => s.workdir.clone(),
        _ => String::new(),
    }
}

/// One line of the table: a job (its allocation), or one of its step lines (its batch script,
/// its extern step, or a step).
#[derive(Clone, Copy, Debug)]
pub enum Row<'a> {
    Job(&'a Job),
    Step(&'a Job, StepKind<'a>),
}

/// The lines of `jobs`: each job, then with `steps` its step lines (`ID.batch`, `ID.extern`
/// once it started, `ID.N`; see [`acct::step_kinds`]).
pub fn rows<'a>(jobs: &[&'a Job], steps: bool) -> Vec<Row<'a>> {
    let mut out = Vec::new();
    for j in jobs {
        out.push(Row::Job(j));
        if steps {
            out.extend(acct::step_kinds(j).into_iter().map(|k| Row::Step(j, k)));
        }
    }
    out
}

/// One field of a step line: its own times, nodes, CPUs, state and exit; what belongs to the
/// allocation (partition, user, limits) is left blank, as in Slurm. The extern step's TRES are
/// the job's.
pub fn step_value(row: Row<'_>, name: &str, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    let (job, kind) = match row {
        Row::Job(j) => return value(j, name, names, now_ms),
        Row::Step(j, k) => (j, k),
    };
    let v = acct::step_view(job, kind, names);
    let seconds = v.end_ms.unwrap_or(now_ms).saturating_sub(v.start_ms) / 1000;
    let cpus = v.cpus;
    match name {
        "JobID" => format!("{}.{}", super::display_id(job), v.id),
        "JobIDRaw" => format!("{}.{}", job.id, v.id),
        "JobName" => v.name,
        "Partition" | "User" | "Timelimit" | "QOS" | "Reason" | "Restarts" | "GPUSeconds" | "Eligible" | "ReqNodes" => String::new(),
        "AllocCPUS" | "NCPUS" | "ReqCPUS" => cpus.to_string(),
        "AllocNodes" | "NNodes" => v.nodes.len().to_string(),
        "AllocTRES" if matches!(kind, StepKind::Extern) => alloc_tres(job),
        "AllocTRES" => format!("cpu={cpus},mem={},node={}", mem_text(job.spec.mem_mib.saturating_mul(v.nodes.len() as u64)), v.nodes.len()),
        "NodeList" => hostlist::compress(&v.nodes),
        "Start" | "Submit" => time::datetime(v.start_ms),
        "End" => v.end_ms.map_or("Unknown".into(), time::datetime),
        "Elapsed" => time::elapsed(seconds),
        "ElapsedRaw" => seconds.to_string(),
        "CPUTime" => time::elapsed(seconds * cpus),
        "CPUTimeRAW" => (seconds * cpus).to_string(),
        "State" => v.state.to_string(),
        "ExitCode" => v.exit_code,
        _ => value(job, name, names, now_ms),
    }
}

/// How the table is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Fixed-width columns, each followed by a space, values cut with a trailing `+`.
    Columns,
    /// `-p`: `|` after every field.
    Parsable,
    /// `-P`: `|` between fields.
    Parsable2,
}

/// `value` in a column of `width` characters as Slurm's print functions put it: cut to the
/// width with its last character `+`, right-aligned (negative width: left-aligned).
pub(crate) fn fit(value: &str, width: i32) -> String {
    let w = width.unsigned_abs() as usize;
    let mut v: String = value.to_string();
    if v.chars().count() > w {
        v = v.chars().take(w.saturating_sub(1)).collect::<String>() + "+";
    }
    if width < 0 {
        format!("{v:<w$}")
    } else {
        format!("{v:>w$}")
    }
}

fn line(values: &[String], columns: &[Column], style: Style) -> String {
    match style {
        Style::Columns => values.iter().zip(columns).map(|(v, c)| fit(v, c.width) + " ").collect(),
        Style::Parsable => values.iter().map(|v| format!("{v}|")).collect(),
        Style::Parsable2 => values.join("|"),
    }
}

/// The whole table of job lines alone (`-X`).
pub fn table(jobs: &[&Job], columns: &[Column], style: Style, header: bool, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    table_rows(&rows(jobs, false), columns, style, header, names, now_ms)
}

/// The whole table of `rows`.
pub fn table_rows(rows: &[Row<'_>], columns: &[Column], style: Style, header: bool, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    let mut out = String::new();
    if header {
        let heads: Vec<String> = columns.iter().map(|c| c.name.to_string()).collect();
        out.push_str(&line(&heads, columns, style));
        out.push('\n');
        if style == Style::Columns {
            let dashes: Vec<String> = columns.iter().map(|c| "-".repeat(c.width.unsigned_abs() as usize)).collect();
            out.push_str(&line(&dashes, columns, style));
            out.push('\n');
        }
    }
    for r in rows {
        let values: Vec<String> = columns.iter().map(|c| step_value(*r, c.name, names, now_ms)).collect();
        out.push_str(&line(&values, columns, style));
        out.push('\n');
    }
    out
}

/// Which jobs to list.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// `N` (a job or a whole array) or `N_T`.
    pub jobs: Vec<String>,
    pub users: Vec<String>,
    pub states: Option<Vec<JobState>>,
    /// Running jobs by their suspension (see `squeue::suspension_wanted`).
    pub suspension: Option<bool>,
    pub partitions: Vec<String>,
    pub names: Vec<String>,
    pub accounts: Vec<String>,
    pub nodes: Vec<String>,
    /// Window in ms: jobs that were pending or running at some point of it.
    pub start_ms: Option<u64>,
    pub end_ms: Option<u64>,
}

impl Filter {
    /// What the node can filter with its indexes; [`Filter::matches`] then applies the rest
    /// (tasks, nodes, the window's start for live jobs).
    pub fn query(&self) -> proto::JobQuery {
        proto::JobQuery {
            ids: super::query_ids(&self.jobs).unwrap_or_default(),
            users: self.users.clone(),
            accounts: self.accounts.clone(),
            names: self.names.clone(),
            states: self.states.clone().unwrap_or_default(),
            partitions: self.partitions.clone(),
            live: true,
            finished: true,
            history: true,
            ended_after_ms: self.start_ms,
            submitted_before_ms: self.end_ms,
            brief: true,
            ..Default::default()
        }
    }

    pub fn matches(&self, j: &Job, names: &BTreeMap<u64, String>) -> bool {
        let partition = j.spec.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.into());
        let id_ok = self.jobs.is_empty()
            || self.jobs.iter().any(|x| match x.split_once('_') {
                Some((a, t)) => j.array.as_ref().is_some_and(|ar| ar.array_job.to_string() == a && ar.task.to_string() == t),
                None => j.id.to_string() == *x || j.array.as_ref().is_some_and(|ar| ar.array_job.to_string() == *x),
            });
        let began = j.start_ms.unwrap_or(j.submit_ms);
        let window_ok = self.end_ms.is_none_or(|e| began <= e) && self.start_ms.is_none_or(|s| j.end_ms.is_none_or(|end| end >= s));
        id_ok
            && window_ok
            && (self.users.is_empty() || self.users.contains(&j.spec.user))
            && self.states.as_ref().is_none_or(|s| s.contains(&j.state))
            && super::squeue::suspension_ok(self.suspension, j)
            && (self.partitions.is_empty() || self.partitions.contains(&partition))
            && (self.names.is_empty() || self.names.contains(&j.spec.name))
            && (self.accounts.is_empty() || j.spec.account.as_ref().is_some_and(|a| self.accounts.contains(a)))
            && (self.nodes.is_empty() || super::job_node_names(j, names).iter().any(|n| self.nodes.contains(n)))
    }
}

fn split_list(values: Vec<&str>) -> Vec<String> {
    values.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, false)?;
    if p.has("help") || p.has("usage") {
        println!("Usage: sacct [-a] [-b] [-E time] [-j jobs] [--json] [-l] [-n] [-o fields] [-p|-P] [-r partitions] [-S time] [-s states] [-u users] [-X]");
        return Ok(0);
    }
    if p.has("version") {
        return Ok(super::print_version());
    }
    if p.has("helpformat") {
        let names: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).collect();
        for chunk in names.chunks(4) {
            println!("{}", chunk.iter().map(|n| format!("{n:<20}")).collect::<String>().trim_end());
        }
        return Ok(0);
    }
    let fields = if let Some(f) = p.last("format") {
        f.to_string()
    } else if p.has("brief") {
        BRIEF_FIELDS.to_string()
    } else if p.has("long") {
        LONG_FIELDS.to_string()
    } else {
        std::env::var("SACCT_FORMAT").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| DEFAULT_FIELDS.to_string())
    };
    let columns = parse_fields(&fields)?;
    let style = if p.has("parsable2") {
        Style::Parsable2
    } else if p.has("parsable") {
        Style::Parsable
    } else {
        Style::Columns
    };
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let point = |flag: &str, text: &str| -> Result<u64, SlurmError> {
        time::parse_point(text, now_s)
            .map(|s| (s.max(0) as u64) * 1000)
            .ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid time specification for {flag}: {text}")))
    };
    let mut filter = Filter {
        jobs: split_list(p.all("jobs")),
        users: split_list(p.all("user")),
        partitions: split_list(p.all("partition")),
        names: split_list(p.all("name")),
        accounts: split_list(p.all("accounts")),
        ..Filter::default()
    };
    for n in p.all("nodelist") {
        filter.nodes.extend(hostlist::expand(n).map_err(|e| SlurmError::fatal(PROG, e))?);
    }
    let named = split_list(p.all("state"));
    for s in &named {
        let st = parse_state(s).ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid state specified: {s}")))?;
        filter.states.get_or_insert_with(Vec::new).extend(st);
    }
    filter.suspension = super::squeue::suspension_wanted(&named);
    filter.start_ms = match p.last("starttime") {
        Some(t) => Some(point("--starttime", t)?),
        // Without -j, sacct starts at midnight today.
        None if filter.jobs.is_empty() => Some(point("--starttime", "today")?),
        None => None,
    };
    filter.end_ms = p.last("endtime").map(|t| point("--endtime", t)).transpose()?;
    let json = p.has("json");
    if json {
        // Slurm 22.05's `sacct --json` hands the plugin's query every selection but the users
        // (src/sacct/data.c: no `userid_list`), so it lists every user's jobs, `-u` or not.
        filter.users.clear();
    } else if filter.users.is_empty() && !p.has("allusers") && filter.jobs.is_empty() {
        let me = super::current_user();
        if me != "root" {
            filter.users.push(me);
        }
    }
    let cluster = super::connect(PROG)?;
    let (jobs, nodes) = super::block_on(PROG, async {
        let jobs = super::query_jobs(PROG, &cluster, filter.query()).await?;
        Ok::<_, SlurmError>((jobs, super::list_nodes(PROG, &cluster).await?))
    })??;
    let names = super::node_names(&nodes);
    let mut shown: Vec<&Job> = jobs.iter().filter(|j| filter.matches(j, &names)).collect();
    shown.sort_by_key(|j| (j.array.as_ref().map_or(j.id, |a| a.array_job), j.array.as_ref().map_or(0, |a| a.task)));
    let now_ms = (now_s as u64) * 1000;
    if json {
        let items = shown.iter().map(|j| acct::db_job(j, &names, now_ms, !p.has("allocations"))).collect();
        let text = serde_json::to_string_pretty(&acct::db_jobs(items)).map_err(|e| SlurmError::fatal(PROG, e))?;
        println!("{text}");
        return Ok(0);
    }
    let lines = rows(&shown, !p.has("allocations"));
    print!("{}", table_rows(&lines, &columns, style, !p.has("noheader"), &names, now_ms));
    Ok(0)
}
