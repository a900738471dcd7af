//! `sacct`: accounting lines for jobs from the cluster's job list (finished ones included),
//! with `--format`, `-P/--parsable2`, `-p`, `-S/-E` windows and filters: a line for each job,
//! then (without `-X`) one for its batch script (`ID.batch`), one for its extern step
//! (`ID.extern`, its allocation on its nodes) and one for each step of its last run (`ID.N`),
//! as the log recorded them. Every field of Slurm 22.05 is accepted (`sacct_fields`); each
//! prints what Corral knows as `src/sacct/print.c` prints it, and what Corral does not record
//! (CPU and energy usage, TRES usage, reservations, wckeys, ...) as Slurm prints a field whose
//! value the database lacks. `--json` prints the same jobs as Slurm 22.05's `dbv0.0.38`
//! objects (`slurm_compat::acct`), ignoring the format options as Slurm does.

use std::collections::BTreeMap;

use proto::{Job, JobState};
use slurm_compat::acct::{self, StepKind};

use super::env::DEFAULT_PARTITION;
use super::opts::{self, opt, Arg, OptDef};
use super::squeue::{parse_state, run_seconds};
use super::{hostlist, time, SlurmError};

use super::sacct_fields::{cell, header, Print};
pub use super::sacct_fields::{parse_fields, Column};

pub const PROG: &str = "sacct";

/// Slurm 22.05's `DEFAULT_FIELDS`, `BRIEF_FIELDS` and `LONG_FIELDS` (`src/sacct/sacct.h`).
pub const DEFAULT_FIELDS: &str = "jobid,jobname,partition,account,alloccpus,state,exitcode";
pub const BRIEF_FIELDS: &str = "jobid,state,exitcode";
pub const LONG_FIELDS: &str = "jobid,jobidraw,jobname,partition,maxvmsize,maxvmsizenode,maxvmsizetask,avevmsize,maxrss,maxrssnode,maxrsstask,averss,maxpages,maxpagesnode,maxpagestask,avepages,mincpu,mincpunode,mincputask,avecpu,ntasks,alloccpus,elapsed,state,exitcode,avecpufreq,reqcpufreqmin,reqcpufreqmax,reqcpufreqgov,reqmem,consumedenergy,maxdiskread,maxdiskreadnode,maxdiskreadtask,avediskread,maxdiskwrite,maxdiskwritenode,maxdiskwritetask,avediskwrite,reqtres,alloctres,tresusageinave,tresusageinmax,tresusageinmaxn,tresusageinmaxt,tresusageinmin,tresusageinminn,tresusageinmint,tresusageintot,tresusageoutmax,tresusageoutmaxn,tresusageoutmaxt,tresusageoutave,tresusageouttot";

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
    opt("noconvert", None, Arg::No),
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

/// How amounts are converted (`--units`, `--noconvert`): Slurm's `params.units` and
/// `params.convert_flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Units {
    /// `--units=K|M|G|T|P`: every amount in that unit (1 for K up to 5 for P, as Slurm numbers them).
    pub unit: Option<u32>,
    /// `--noconvert`: amounts in the unit they are kept in.
    pub no_convert: bool,
}

impl Units {
    /// `--units=X` as `get_unit_type` reads it (one of `KMGTP`, any case).
    pub fn parse_unit(text: &str) -> Result<u32, SlurmError> {
        let c = text.chars().next().unwrap_or('\0');
        match "KMGTP".find(c.to_ascii_uppercase()).filter(|_| c != '\0') {
            Some(i) => Ok(i as u32 + 1),
            None => Err(SlurmError {
                text: format!("{PROG}: error: Invalid unit type '{c}'. Possible options are 'KMGTP'\n{PROG}: fatal: Invalid unit type"),
                code: 1,
            }),
        }
    }

    /// An amount kept in unit `orig` (0 none, 1 K, 2 M, ...) converted to `spec` (`--units`)
    /// as sacct converts it: `convert_num_unit` with `CONVERT_NUM_UNIT_EXACT`, or `_NO` with
    /// `--noconvert`.
    pub fn convert(self, num: u64, orig: u32, spec: Option<u32>) -> String {
        slurm_compat::show::convert_num_unit(num, orig, spec, !self.no_convert)
    }

    /// Memory kept in MiB (Slurm's `UNIT_MEGA`), in `--units` when given.
    fn mem(self, mib: u64) -> String {
        self.convert(mib, 2, self.unit)
    }
}

/// What every value needs besides its job: node names by id, the time running jobs are counted
/// to, and the units.
#[derive(Clone, Copy, Debug)]
pub struct Ctx<'a> {
    pub names: &'a BTreeMap<u64, String>,
    pub now_ms: u64,
    pub units: Units,
}

/// A TRES string as sacct prints one (`slurmdb_make_tres_string_from_simple`): `key=value`
/// items, memory converted, zero counts left out, sorted as strings (`billing=8,cpu=8,
/// gres/gpu=2,mem=16G,node=1`).
fn tres_text(units: Units, billing: Option<u64>, cpus: u64, gres: (&str, u64), mem_mib: u64, nodes: u64) -> String {
    let mut items: Vec<String> = Vec::new();
    let mut count = |key: &str, n: u64| {
        if n > 0 {
            items.push(format!("{key}={n}"));
        }
    };
    count("billing", billing.unwrap_or(0));
    count("cpu", cpus);
    count(&format!("gres/{}", gres.0), gres.1);
    count("node", nodes);
    if mem_mib > 0 {
        items.push(format!("mem={}", units.mem(mem_mib)));
    }
    items.sort();
    items.join(",")
}

/// The job's TRES (what it asks, which is what it holds once it started): billing as its CPUs,
/// as Slurm without `TRESBillingWeights`.
fn job_tres(job: &Job, units: Units) -> String {
    let s = &job.spec;
    let nodes = u64::from(job.node_count());
    let cpus = acct::job_cpus(job);
    let (gres, per_node) = s.gres_per_node();
    tres_text(units, Some(cpus), cpus, (gres, u64::from(per_node) * nodes), s.mem_mib.saturating_mul(nodes), nodes)
}

/// ExitCode as sacct prints it: `code:signal`, an exit code of 128 or more less 128 (print.c
/// does so, so an exit of 130 prints `2:0`).
fn sacct_exit_code(text: &str) -> String {
    match text.split_once(':').map(|(c, s)| (c.parse::<u32>(), s)) {
        Some((Ok(code), signal)) if code >= 128 => format!("{}:{signal}", code - 128),
        _ => text.to_string(),
    }
}

/// Seconds between two times; Slurm's `time_t` difference, negative when `to` is earlier.
fn secs_between(from_ms: u64, to_ms: u64) -> i64 {
    (to_ms / 1000) as i64 - (from_ms / 1000) as i64
}

/// What a job's own line shows of the job itself: who, where, how it ended. `None`: not one of
/// these fields.
fn job_identity(job: &Job, name: &str) -> Option<String> {
    let s = &job.spec;
    Some(match name {
        "Account" => s.account.clone().unwrap_or_default(),
        "ArrayJobID" => job.array.as_ref().map_or(String::new(), |a| a.array_job.to_string()),
        "ArrayTaskID" => job.array.as_ref().map_or(String::new(), |a| a.task.to_string()),
        "Cluster" => super::openapi::CLUSTER.into(),
        // The job's --comment, as Slurm with `AccountingStoreFlags=job_comment` keeps it.
        "Comment" => s.extra.get("comment").cloned().unwrap_or_default(),
        "Constraints" => s.constraint.join("&"),
        "DerivedExitCode" => acct::status_text(acct::derived_status(job)),
        "ExitCode" => sacct_exit_code(&super::exit_code_text(job)),
        "GID" => s.gid.map_or(String::new(), |g| g.to_string()),
        "GPUSeconds" => job.gpu_seconds.to_string(),
        "Group" => s.gid.and_then(super::group_name).unwrap_or_default(),
        "JobID" => super::display_id(job),
        "JobIDRaw" => job.id.to_string(),
        "JobName" => s.name.clone(),
        "Partition" => s.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.into()),
        // Corral keeps no priority with a job (as `sacct --json`'s `priority`).
        "Priority" => "0".into(),
        "QOS" => s.qos.clone().unwrap_or_else(|| "normal".into()),
        "Reason" if job.state == JobState::Pending => slurm_compat::show::accounting_reason(job),
        "Reason" => "None".into(),
        "Restarts" => job.restart_count.to_string(),
        "State" => job.state_name().into(),
        "UID" => s.uid.map_or(String::new(), |u| u.to_string()),
        "User" => s.user.clone(),
        "WCKeyID" => "0".into(),
        "WorkDir" => s.workdir.clone(),
        _ => return None,
    })
}

/// What a job's own line shows of its times.
fn job_times(job: &Job, name: &str, ctx: &Ctx<'_>) -> Option<String> {
    let s = &job.spec;
    let elapsed = run_seconds(job, ctx.now_ms);
    let cpus = acct::job_cpus(job);
    let eligible = slurm_compat::show::eligible_ms(job, ctx.now_ms);
    // `Reserved`: how long it waited once eligible (0 when it never was), in seconds.
    let reserved = eligible.map_or(0, |e| secs_between(e, job.start_ms.unwrap_or(ctx.now_ms)));
    Some(match name {
        "CPUTime" => time::elapsed(elapsed * cpus),
        "CPUTimeRAW" => (elapsed * cpus).to_string(),
        "Elapsed" => time::elapsed(elapsed),
        "ElapsedRaw" => elapsed.to_string(),
        "Eligible" => eligible.map_or("Unknown".into(), time::datetime),
        "End" => job.end_ms.filter(|_| job.state.is_final()).map_or("Unknown".into(), time::datetime),
        "Reserved" => time::elapsed_signed(reserved),
        "ResvCPU" => time::elapsed_signed(reserved * cpus as i64),
        // An `int` through print_fields_uint: a negative one wraps.
        "ResvCPURAW" => ((reserved * cpus as i64) as i32 as u32).to_string(),
        "Start" => job.start_ms.map_or("Unknown".into(), time::datetime),
        "Submit" => time::datetime(job.submit_ms),
        "Suspended" => time::elapsed(job.suspension.paused_ms_at(job.end_ms.unwrap_or(ctx.now_ms)) / 1000),
        "Timelimit" => s.time_limit_ms.map_or("UNLIMITED".into(), |ms| time::elapsed(ms / 1000)),
        // Minutes, as Slurm keeps limits (a limit of seconds rounds up, as `time_str2mins`).
        "TimelimitRaw" => s.time_limit_ms.map_or("UNLIMITED".into(), |ms| ms.div_ceil(60_000).to_string()),
        _ => return None,
    })
}

/// What a job's own line shows of its resources: what it asked (`Req*`) and, once it started,
/// holds (`Alloc*`); a job that never started shows its request where Slurm reads the CPUs and
/// nodes from the requested TRES.
fn job_resources(job: &Job, name: &str, ctx: &Ctx<'_>) -> Option<String> {
    let s = &job.spec;
    let started = job.start_ms.is_some();
    let nodes: Vec<String> = super::job_node_names(job, ctx.names);
    Some(match name {
        "AllocCPUS" | "NCPUS" | "ReqCPUS" => acct::job_cpus(job).to_string(),
        "AllocNodes" => ctx.units.convert(if started { u64::from(job.node_count()) } else { 0 }, 0, None),
        "AllocTRES" if started => job_tres(job, ctx.units),
        "AllocTRES" => String::new(),
        // The nodes it got (a job of `-N MIN-MAX`: some number of its range); ReqNodes its least.
        "NNodes" => job.node_count().to_string(),
        "NodeList" if nodes.is_empty() => "None assigned".into(),
        "NodeList" => hostlist::compress(&nodes),
        "ReqMem" => ctx.units.mem(s.mem_mib.saturating_mul(u64::from(job.node_count()))),
        "ReqNodes" => ctx.units.convert(u64::from(s.nodes), 0, ctx.units.unit),
        "ReqTRES" => job_tres(job, ctx.units),
        _ => return None,
    })
}

/// What Slurm prints for a field whose value the database does not have, on a job's line or a
/// step's (`step`): the CPU frequencies asked `Unknown` (NO_VAL has the range flag's bit), a
/// step's energy `0` (a job's is empty), CPU times `00:00:00`, a step's CPU frequency `0`;
/// anything else empty (as Slurm 22.05.8 with slurmdbd printed them).
fn absent(name: &str, step: bool) -> String {
    match name {
        "ReqCPUFreq" | "ReqCPUFreqGov" | "ReqCPUFreqMax" | "ReqCPUFreqMin" => "Unknown".into(),
        "ConsumedEnergy" | "ConsumedEnergyRaw" if step => "0".into(),
        "SystemCPU" | "UserCPU" | "TotalCPU" => "00:00:00".into(),
        "AveCPUFreq" if step => "0".into(),
        _ => String::new(),
    }
}

/// One field of a job's own line, as sacct prints it.
pub fn value(job: &Job, name: &str, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    job_value(job, name, &Ctx { names, now_ms, units: Units::default() })
}

fn job_value(job: &Job, name: &str, ctx: &Ctx<'_>) -> String {
    if name == "SystemComment" {
        return super::system_comment(job, ctx.names).unwrap_or_default();
    }
    job_identity(job, name)
        .or_else(|| job_times(job, name, ctx))
        .or_else(|| job_resources(job, name, ctx))
        .unwrap_or_else(|| absent(name, false))
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

/// One field of a line (see [`cell_value`]), with sacct's default units.
pub fn step_value(row: Row<'_>, name: &str, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    cell_value(row, name, &Ctx { names, now_ms, units: Units::default() })
}

/// One field of a line. A step's line has its own times, nodes, CPUs, TRES, tasks, state and
/// exit, and its job's account and cluster; what belongs to the job alone (partition, user,
/// limits, what it asked, its derived exit code) is empty, as `print.c` leaves it for a step.
pub fn cell_value(row: Row<'_>, name: &str, ctx: &Ctx<'_>) -> String {
    let (job, kind) = match row {
        Row::Job(j) => return job_value(j, name, ctx),
        Row::Step(j, k) => (j, k),
    };
    let v = acct::step_view(job, kind, ctx.names);
    let seconds = v.end_ms.unwrap_or(ctx.now_ms).saturating_sub(v.start_ms) / 1000;
    let cpus = v.cpus;
    let nnodes = v.nodes.len() as u64;
    match name {
        "Account" | "Cluster" => job_value(job, name, ctx),
        "JobID" => format!("{}.{}", super::display_id(job), v.id),
        "JobIDRaw" => format!("{}.{}", job.id, v.id),
        "JobName" => v.name,
        "AllocCPUS" | "NCPUS" | "ReqCPUS" => cpus.to_string(),
        "NNodes" => nnodes.to_string(),
        "AllocNodes" => ctx.units.convert(nnodes, 0, None),
        "ReqNodes" => ctx.units.convert(nnodes, 0, ctx.units.unit),
        "NTasks" => v.tasks.to_string(),
        "AllocTRES" if matches!(kind, StepKind::Extern) => job_tres(job, ctx.units),
        "AllocTRES" => tres_text(ctx.units, None, cpus, acct::step_gres(job, nnodes), job.spec.mem_mib.saturating_mul(nnodes), nnodes),
        // srun's default distribution: cyclic while there are no more tasks than nodes.
        "Layout" if matches!(kind, StepKind::Step(_)) => acct::step_distribution(kind, v.tasks, nnodes).into(),
        // The batch step asks no CPU frequency: 0, where srun steps say Unknown.
        "ReqCPUFreq" | "ReqCPUFreqGov" | "ReqCPUFreqMax" | "ReqCPUFreqMin" if matches!(kind, StepKind::Batch) => "0".into(),
        "Layout" => "Unknown".into(),
        "NodeList" => hostlist::compress(&v.nodes),
        "Start" | "Submit" | "Eligible" => time::datetime(v.start_ms),
        "End" => v.end_ms.map_or("Unknown".into(), time::datetime),
        "Elapsed" => time::elapsed(seconds),
        "ElapsedRaw" => seconds.to_string(),
        "CPUTime" => time::elapsed(seconds * cpus),
        "CPUTimeRAW" => (seconds * cpus).to_string(),
        "Suspended" => time::elapsed(0),
        "State" => v.state.to_string(),
        "ExitCode" => sacct_exit_code(&v.exit_code),
        _ => absent(name, true),
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

/// `value` in a column of `width` characters as Slurm's `print_fields_str` puts it: cut to the
/// width with its last character `+`, right-aligned (negative width: left-aligned).
pub(crate) fn fit(value: &str, width: i32) -> String {
    cell(value, width, Print::Str)
}

fn line(values: &[String], style: Style) -> String {
    match style {
        Style::Columns => values.iter().map(|v| format!("{v} ")).collect(),
        Style::Parsable => values.iter().map(|v| format!("{v}|")).collect(),
        Style::Parsable2 => values.join("|"),
    }
}

/// The whole table of job lines alone (`-X`).
pub fn table(jobs: &[&Job], columns: &[Column], style: Style, header: bool, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    table_rows(&rows(jobs, false), columns, style, header, names, now_ms)
}

/// The whole table of `rows`, with sacct's default units.
pub fn table_rows(rows: &[Row<'_>], columns: &[Column], style: Style, header: bool, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    table_in(rows, columns, style, header, &Ctx { names, now_ms, units: Units::default() })
}

/// The whole table of `rows`: the header (names cut to their widths, then dashes, in columns;
/// the names alone when parsable), then a line per row.
pub fn table_in(rows: &[Row<'_>], columns: &[Column], style: Style, with_header: bool, ctx: &Ctx<'_>) -> String {
    let columns_style = style == Style::Columns;
    let mut out = String::new();
    if with_header {
        let heads: Vec<String> = columns.iter().map(|c| if columns_style { header(c) } else { c.name.to_string() }).collect();
        out.push_str(&line(&heads, style));
        out.push('\n');
        if columns_style {
            let dashes: Vec<String> = columns.iter().map(|c| "-".repeat(c.width.unsigned_abs() as usize)).collect();
            out.push_str(&line(&dashes, style));
            out.push('\n');
        }
    }
    for r in rows {
        let values: Vec<String> = columns
            .iter()
            .map(|c| {
                let v = cell_value(*r, c.name, ctx);
                if columns_style {
                    cell(&v, c.width, c.print())
                } else {
                    v
                }
            })
            .collect();
        out.push_str(&line(&values, style));
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

/// The fields asked, as sacct 22.05 gathers them: every `-o` in order, then `-b`'s and `-l`'s
/// fields; without any, `SACCT_FORMAT` or the default.
pub fn field_list(formats: &[&str], brief: bool, long: bool, env_format: Option<String>) -> String {
    let mut list: Vec<&str> = formats.to_vec();
    if brief {
        list.push(BRIEF_FIELDS);
    }
    if long {
        list.push(LONG_FIELDS);
    }
    if list.is_empty() {
        return env_format.filter(|f| !f.is_empty()).unwrap_or_else(|| DEFAULT_FIELDS.to_string());
    }
    list.join(",")
}

fn split_list(values: Vec<&str>) -> Vec<String> {
    values.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// One job as `sacct --json` prints it ([`acct::db_job`]) with its `comment.system`, whose
/// dates are local (the pure builder leaves it `null`).
pub fn db_job(job: &Job, names: &BTreeMap<u64, String>, now_ms: u64, with_steps: bool) -> serde_json::Value {
    let mut value = acct::db_job(job, names, now_ms, with_steps);
    if let Some(text) = super::system_comment(job, names) {
        value["comment"]["system"] = serde_json::Value::String(text);
    }
    value
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
        print!("{}", super::sacct_fields::helpformat());
        return Ok(0);
    }
    let columns = parse_fields(&field_list(&p.all("format"), p.has("brief"), p.has("long"), std::env::var("SACCT_FORMAT").ok()))?;
    let units = Units { unit: p.last("units").map(Units::parse_unit).transpose()?, no_convert: p.has("noconvert") };
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
        let items = shown.iter().map(|j| db_job(j, &names, now_ms, !p.has("allocations"))).collect();
        let text = serde_json::to_string_pretty(&acct::db_jobs(items)).map_err(|e| SlurmError::fatal(PROG, e))?;
        println!("{text}");
        return Ok(0);
    }
    let lines = rows(&shown, !p.has("allocations"));
    print!("{}", table_in(&lines, &columns, style, !p.has("noheader"), &Ctx { names: &names, now_ms, units }));
    Ok(0)
}
