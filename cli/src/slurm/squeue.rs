//! `squeue`: pending and running jobs in Slurm's columns, with `-o` formats and filters.

use std::collections::BTreeMap;

use proto::{Job, JobState};

use super::env::DEFAULT_PARTITION;
use super::opts::{self, opt, Arg, OptDef};
use super::{hostlist, time, SlurmError};

pub use slurm_compat::show::{dependency_text, reason_code, reason_shown, task_ranges};

pub const PROG: &str = "squeue";

pub const DEFAULT_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";
pub const LONG_FORMAT: &str = "%.18i %.9P %.8j %.8u %.8T %.10M %.9l %.6D %R";

const OPTIONS: &[OptDef] = &[
    opt("account", Some('A'), Arg::Required),
    opt("all", Some('a'), Arg::No),
    opt("array", Some('r'), Arg::No),
    opt("clusters", Some('M'), Arg::Required),
    opt("format", Some('o'), Arg::Required),
    opt("Format", Some('O'), Arg::Required),
    opt("help", None, Arg::No),
    opt("hide", None, Arg::No),
    opt("iterate", Some('i'), Arg::Required),
    opt("json", None, Arg::No),
    opt("jobs", Some('j'), Arg::Optional),
    opt("local", Some('L'), Arg::No),
    opt("long", Some('l'), Arg::No),
    opt("me", None, Arg::No),
    opt("name", Some('n'), Arg::Required),
    opt("noconvert", None, Arg::No),
    opt("noheader", Some('h'), Arg::No),
    opt("nodelist", Some('w'), Arg::Required),
    opt("partition", Some('p'), Arg::Required),
    opt("priority", Some('P'), Arg::No),
    opt("qos", Some('q'), Arg::Required),
    opt("sort", Some('S'), Arg::Required),
    opt("start", None, Arg::No),
    opt("states", Some('t'), Arg::Required),
    opt("steps", Some('s'), Arg::Optional),
    opt("usage", None, Arg::No),
    opt("user", Some('u'), Arg::Required),
    opt("verbose", Some('v'), Arg::No),
    opt("version", Some('V'), Arg::No),
];

/// One piece of a `%[.][width]X` format.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Field { code: char, width: usize, right: bool },
}

/// Splits a Slurm `-o` format into literal text and fields.
pub fn parse_format(format: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut text = String::new();
    let chars: Vec<char> = format.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '%' {
            text.push(chars[i]);
            i += 1;
            continue;
        }
        let mut j = i + 1;
        let right = chars.get(j) == Some(&'.');
        if right {
            j += 1;
        }
        let start = j;
        while j < chars.len() && chars[j].is_ascii_digit() {
            j += 1;
        }
        let width: usize = chars[start..j].iter().collect::<String>().parse().unwrap_or(0);
        match chars.get(j) {
            Some('%') => {
                text.push('%');
                i = j + 1;
            }
            Some(&code) => {
                if !text.is_empty() {
                    out.push(Piece::Text(std::mem::take(&mut text)));
                }
                out.push(Piece::Field { code, width, right });
                i = j + 1;
            }
            None => {
                text.extend(&chars[i..]);
                i = chars.len();
            }
        }
    }
    if !text.is_empty() {
        out.push(Piece::Text(text));
    }
    out
}

/// Pads (or cuts) `value` to `width` as squeue and sinfo do; width 0 prints it as it is.
pub fn pad(value: &str, width: usize, right: bool) -> String {
    pad_as(value, width, right, true)
}

/// [`pad`] as `_print_str` with `cut_output`: a right-justified value is cut to the width only
/// when `cut` (a left-justified one always is: its format is `%.Ns`).
pub fn pad_as(value: &str, width: usize, right: bool, cut: bool) -> String {
    if width == 0 {
        return value.to_string();
    }
    if right && !cut {
        return format!("{value:>width$}");
    }
    let cut: String = value.chars().take(width).collect();
    if right {
        format!("{cut:>width$}")
    } else {
        format!("{cut:<width$}")
    }
}

/// Renders rows with `format`, the header first when asked; `value(code)` gives a field.
pub fn render<T>(pieces: &[Piece], rows: &[T], header: bool, head: impl Fn(char) -> String, value: impl Fn(&T, char) -> String) -> String {
    render_as(pieces, rows, header, head, value, |_, _| true)
}

/// [`render`] where `cut(code, value)` says whether a right-justified value is cut to its width.
pub fn render_as<T>(
    pieces: &[Piece],
    rows: &[T],
    header: bool,
    head: impl Fn(char) -> String,
    value: impl Fn(&T, char) -> String,
    cut: impl Fn(char, &str) -> bool,
) -> String {
    let mut out = String::new();
    let line = |f: &dyn Fn(char) -> String| -> String {
        let mut s = String::new();
        for p in pieces {
            match p {
                Piece::Text(t) => s.push_str(t),
                Piece::Field { code, width, right } => {
                    let v = f(*code);
                    s.push_str(&pad_as(&v, *width, *right, cut(*code, &v)));
                }
            }
        }
        s
    };
    if header {
        out.push_str(&line(&head));
        out.push('\n');
    }
    for r in rows {
        out.push_str(&line(&|c| value(r, c)));
        out.push('\n');
    }
    out
}

/// Whether squeue 22.05 cuts field `code`'s `value` to its width when right-justified
/// (`_print_str`'s `cut_output`): not the durations its `_print_secs` prints (TIME, TIME_LIMIT,
/// TIME_LEFT, but their `UNLIMITED`), node lists, nor the `NODELIST(REASON)` header.
pub fn cut_output(code: char, value: &str) -> bool {
    match code {
        'M' | 'l' | 'L' => value == "UNLIMITED" || value == "NOT_SET" || value == "TIME_LIMIT" || value == "TIME_LEFT" || value == "TIME",
        'N' => false,
        'R' => value.starts_with('(') && value != "NODELIST(REASON)",
        _ => true,
    }
}

/// Slurm's compact state code.
pub fn state_short(state: JobState) -> &'static str {
    match state {
        JobState::Pending => "PD",
        JobState::Running => "R",
        JobState::Completed => "CD",
        JobState::Failed => "F",
        JobState::Cancelled => "CA",
        JobState::Timeout => "TO",
        JobState::NodeFail => "NF",
        JobState::OutOfMemory => "OOM",
    }
}

/// Reads a `-t` state name (short or long, any case).
pub fn parse_state(text: &str) -> Option<Vec<JobState>> {
    use JobState::*;
    Some(match text.to_ascii_uppercase().as_str() {
        "PD" | "PENDING" => vec![Pending],
        // A suspended job is a running one whose processes are stopped ([`suspension_wanted`]).
        "R" | "RUNNING" | "S" | "SUSPENDED" => vec![Running],
        "CD" | "COMPLETED" => vec![Completed],
        "F" | "FAILED" => vec![Failed],
        "CA" | "CANCELLED" => vec![Cancelled],
        "TO" | "TIMEOUT" => vec![Timeout],
        "NF" | "NODE_FAIL" => vec![NodeFail],
        "OOM" | "OUT_OF_MEMORY" => vec![OutOfMemory],
        "CG" | "COMPLETING" | "PR" | "PREEMPTED" | "RQ" | "REQUEUED" | "CF" | "CONFIGURING" => vec![],
        "ALL" => JobState::ALL.to_vec(),
        _ => return None,
    })
}

/// What a `-t` list says of running jobs: only the suspended ones (`S` without `R`), only those
/// not suspended (`R` without `S`), or either (`None`).
pub fn suspension_wanted(names: &[String]) -> Option<bool> {
    let named = |short: &str, long: &str| names.iter().any(|n| n.eq_ignore_ascii_case(short) || n.eq_ignore_ascii_case(long));
    match (named("R", "RUNNING"), named("S", "SUSPENDED"), named("ALL", "ALL")) {
        (false, true, false) => Some(true),
        (true, false, false) => Some(false),
        _ => None,
    }
}

/// Whether `job` is as [`suspension_wanted`] asks.
pub fn suspension_ok(wanted: Option<bool>, job: &Job) -> bool {
    wanted.is_none_or(|w| job.state != JobState::Running || job.suspended() == w)
}

/// What squeue needs besides the job: node names, the time, and a collapsed array's id.
pub struct Row<'a> {
    pub job: &'a Job,
    /// `100_[1-5%2]` for pending array tasks shown as one line.
    pub id_override: Option<String>,
}

pub fn header(code: char) -> String {
    match code {
        'i' | 'A' => "JOBID",
        'F' => "ARRAY_JOB_ID",
        'K' => "ARRAY_TASK_ID",
        'P' => "PARTITION",
        'j' => "NAME",
        'u' => "USER",
        't' => "ST",
        'T' => "STATE",
        'M' => "TIME",
        'l' => "TIME_LIMIT",
        'L' => "TIME_LEFT",
        'D' => "NODES",
        'R' => "NODELIST(REASON)",
        'N' => "NODELIST",
        'r' => "REASON",
        'C' => "CPUS",
        'b' => "TRES_PER_NODE",
        'S' => "START_TIME",
        'e' => "END_TIME",
        'V' => "SUBMIT_TIME",
        'q' => "QOS",
        'v' => "RESERVATION",
        'a' => "ACCOUNT",
        'm' => "MIN_MEMORY",
        'Z' => "WORK_DIR",
        'E' => "DEPENDENCY",
        'o' => "COMMAND",
        'f' => "FEATURES",
        'n' => "REQ_NODES",
        'x' => "EXC_NODES",
        'U' => "UID",
        'k' => "COMMENT",
        'y' => "NICE",
        'p' | 'Q' => "PRIORITY",
        _ => "",
    }
    .to_string()
}

/// Memory as Slurm prints it: `1G`, `512M`.
pub fn mem_text(mib: u64) -> String {
    slurm_compat::show::convert_num_unit(mib, 2, None, true)
}

pub use slurm_compat::show::run_seconds;

pub fn field(row: &Row<'_>, code: char, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    let job = row.job;
    let spec = &job.spec;
    let nodes = super::job_node_names(job, names);
    let nodelist = hostlist::compress(&nodes);
    match code {
        'i' => row.id_override.clone().unwrap_or_else(|| super::display_id(job)),
        'A' => job.id.to_string(),
        'F' => job.array.as_ref().map_or(job.id, |a| a.array_job).to_string(),
        'K' => job.array.as_ref().map_or("N/A".to_string(), |a| a.task.to_string()),
        'P' => spec.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.into()),
        'j' | 'o' => spec.name.clone(),
        'u' => spec.user.clone(),
        't' => if job.suspended() { "S" } else { state_short(job.state) }.into(),
        'T' => job.state_name().into(),
        'M' => time::squeue_duration(run_seconds(job, now_ms) as i64),
        'l' => spec.time_limit_ms.map_or("UNLIMITED".into(), |ms| time::squeue_duration((ms / 1000) as i64)),
        // Past its limit (its kill on the way) a job has a negative time left: `INVALID`.
        'L' => {
            spec.time_limit_ms.map_or("UNLIMITED".into(), |ms| time::squeue_duration((ms / 1000) as i64 - run_seconds(job, now_ms) as i64))
        }
        'D' => {
            if job.state == JobState::Pending || nodes.is_empty() {
                spec.nodes.to_string()
            } else {
                nodes.len().to_string()
            }
        }
        'R' => match job.state {
            JobState::Pending => format!("({})", reason_shown(job)),
            _ if !nodelist.is_empty() => nodelist,
            _ => format!("({})", reason_code(job)),
        },
        'N' => nodelist,
        'r' => reason_shown(job),
        'C' => slurm_compat::acct::job_cpus(job).to_string(),
        'b' => spec.gres.as_ref().map_or("N/A".into(), |g| format!("gres:{g}")),
        'S' => job.start_ms.map_or("N/A".into(), time::datetime),
        // A running job ends by its limit; without one, `NONE` (slurmctld's end a year on).
        'e' if job.state == JobState::Running && spec.time_limit_ms.is_none() => "NONE".into(),
        'e' => slurm_compat::show::end_ms(job, now_ms).map_or("N/A".into(), time::datetime),
        'V' => time::datetime(job.submit_ms),
        'q' => spec.qos.clone().unwrap_or_else(|| "normal".into()),
        'v' => spec.reservation().unwrap_or("(null)").to_string(),
        'a' => spec.account.clone().unwrap_or_else(|| "(null)".into()),
        'm' => mem_text(spec.mem_mib),
        'Z' => spec.workdir.clone(),
        'E' => dependency_text(job),
        'f' => {
            if spec.constraint.is_empty() {
                "(null)".into()
            } else {
                spec.constraint.join("&")
            }
        }
        'n' => hostlist::compress(&spec.nodelist),
        'x' => hostlist::compress(&spec.exclude),
        'U' => spec.uid.map_or("N/A".into(), |u| u.to_string()),
        'k' => spec.extra.get("comment").cloned().unwrap_or_else(|| "(null)".into()),
        'y' => spec.nice().to_string(),
        'p' | 'Q' => "N/A".into(),
        _ => String::new(),
    }
}

/// Which jobs to show.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub users: Vec<String>,
    /// `N` (a job or a whole array) or `N_T` (one task).
    pub jobs: Vec<String>,
    pub partitions: Vec<String>,
    pub states: Option<Vec<JobState>>,
    /// Running jobs by their suspension (see [`suspension_wanted`]).
    pub suspension: Option<bool>,
    pub names: Vec<String>,
    pub accounts: Vec<String>,
    pub qos: Vec<String>,
    pub nodes: Vec<String>,
}

impl Filter {
    pub fn matches(&self, job: &Job, names: &BTreeMap<u64, String>) -> bool {
        let spec = &job.spec;
        let states_ok = match &self.states {
            Some(s) => s.contains(&job.state),
            None => !job.state.is_final(),
        };
        let id_ok = self.jobs.is_empty()
            || self.jobs.iter().any(|j| match j.split_once('_') {
                Some((a, t)) => job.array.as_ref().is_some_and(|x| x.array_job.to_string() == a && x.task.to_string() == t),
                None => job.id.to_string() == *j || job.array.as_ref().is_some_and(|x| x.array_job.to_string() == *j),
            });
        let partition = spec.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.into());
        states_ok
            && suspension_ok(self.suspension, job)
            && id_ok
            && (self.users.is_empty() || self.users.contains(&spec.user))
            && (self.partitions.is_empty() || self.partitions.contains(&partition))
            && (self.names.is_empty() || self.names.contains(&spec.name))
            && (self.accounts.is_empty() || spec.account.as_ref().is_some_and(|a| self.accounts.contains(a)))
            && (self.qos.is_empty() || spec.qos.as_ref().is_some_and(|q| self.qos.contains(q)))
            && (self.nodes.is_empty() || super::job_node_names(job, names).iter().any(|n| self.nodes.contains(n)))
    }
}

/// Jobs in display order, pending tasks of one array folded into one row unless `expand_arrays`.
pub fn rows<'a>(jobs: &'a [Job], expand_arrays: bool) -> Vec<Row<'a>> {
    let mut sorted: Vec<&Job> = jobs.iter().collect();
    sorted.sort_by_key(|j| (j.array.as_ref().map_or(j.id, |a| a.array_job), j.array.as_ref().map_or(0, |a| a.task), j.id));
    let mut out: Vec<Row<'a>> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let job = sorted[i];
        if let (false, Some(a), JobState::Pending) = (expand_arrays, &job.array, job.state) {
            let mut tasks = vec![a.task];
            let mut j = i + 1;
            while j < sorted.len()
                && sorted[j].state == JobState::Pending
                && sorted[j].array.as_ref().is_some_and(|b| b.array_job == a.array_job)
            {
                tasks.push(sorted[j].array.as_ref().map_or(0, |b| b.task));
                j += 1;
            }
            if tasks.len() > 1 || job.spec.array.as_ref().is_some_and(|s| s.throttle.is_some()) {
                let throttle = job.spec.array.as_ref().and_then(|s| s.throttle).map(|t| format!("%{t}")).unwrap_or_default();
                let ranges = task_ranges(&tasks);
                out.push(Row { job, id_override: Some(format!("{}_[{ranges}{throttle}]", a.array_job)) });
                i = j;
                continue;
            }
        }
        out.push(Row { job, id_override: None });
        i += 1;
    }
    out
}

/// `-O field[:[.]size],...` as a `-o` format (fields 20 wide unless given).
pub fn long_format_to_format(text: &str) -> Result<String, String> {
    let mut out = String::new();
    for item in text.split(',').filter(|s| !s.is_empty()) {
        let (name, size) = match item.split_once(':') {
            Some((n, s)) => (n, s),
            None => (item, "20"),
        };
        let code = match name.to_ascii_lowercase().as_str() {
            "jobid" | "jobarrayid" => 'i',
            "arrayjobid" => 'F',
            "arraytaskid" => 'K',
            "name" => 'j',
            "username" | "userid" => 'u',
            "state" => 'T',
            "statecompact" => 't',
            "timeused" => 'M',
            "timelimit" => 'l',
            "timeleft" => 'L',
            "numnodes" => 'D',
            "nodelist" => 'N',
            "reasonlist" => 'R',
            "reason" => 'r',
            "partition" => 'P',
            "tres-per-node" => 'b',
            "starttime" => 'S',
            "endtime" => 'e',
            "submittime" => 'V',
            "account" => 'a',
            "qos" => 'q',
            "reservation" => 'v',
            "workdir" => 'Z',
            "numcpus" => 'C',
            "minmemory" => 'm',
            "dependency" => 'E',
            "feature" => 'f',
            "command" => 'o',
            "comment" => 'k',
            _ => return Err(format!("Invalid job format specification: {name}")),
        };
        let (right, digits) = match size.strip_prefix('.') {
            Some(d) => (".", d),
            None => ("", size),
        };
        out.push_str(&format!("%{right}{digits}{code}"));
    }
    Ok(out)
}

fn split_list(values: Vec<&str>) -> Vec<String> {
    values.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// Renders the squeue table for `jobs` (already filtered).
pub fn table(jobs: &[Job], names: &BTreeMap<u64, String>, format: &str, header: bool, expand_arrays: bool, now_ms: u64) -> String {
    let pieces = parse_format(format);
    let rows = rows(jobs, expand_arrays);
    render_as(&pieces, &rows, header, header_for, |r, c| field(r, c, names, now_ms), cut_output)
}

fn header_for(code: char) -> String {
    header(code)
}

/// The jobs `query` finds, and node names by id.
fn jobs_and_names(query: proto::JobQuery) -> Result<(Vec<Job>, BTreeMap<u64, String>), SlurmError> {
    let cluster = super::connect(PROG)?;
    super::block_on(PROG, async {
        let jobs = super::query_jobs(PROG, &cluster, query).await?;
        let nodes = super::list_nodes(PROG, &cluster).await?;
        Ok::<_, SlurmError>((jobs, super::node_names(&nodes)))
    })?
}

/// `squeue --json`: as Slurm 22.05's, every job the cluster still holds (live ones and those
/// ended within MinJobAge), whatever the filters, in the openapi/v0.0.38 shape.
fn print_json() -> Result<i32, SlurmError> {
    let query = proto::JobQuery { live: true, finished: true, brief: true, ..Default::default() };
    let (jobs, names) = jobs_and_names(query)?;
    let items = jobs.iter().map(|j| super::openapi_job(super::openapi::Version::V0038, j, &names)).collect();
    let text = serde_json::to_string_pretty(&super::openapi::envelope(super::openapi::Version::V0038, "jobs", items))
        .map_err(|e| SlurmError::fatal(PROG, e))?;
    println!("{text}");
    Ok(0)
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, false)?;
    if p.has("help") || p.has("usage") {
        println!("Usage: squeue [-A account] [--clusters names] [-i seconds] [--job jobid] [-n name] [-o format] [-p partitions] [--qos qos] [--reservation reservation] [--sort fields] [--start] [--step step_id] [-t states] [-u user_name] [--usage] [-L licenses] [-w nodes] [--federation] [--local] [--sibling] [-ahjlrsv]");
        return Ok(0);
    }
    if p.has("version") {
        return Ok(super::print_version());
    }
    if p.has("iterate") {
        return Err(SlurmError::fatal(PROG, "--iterate is not supported yet"));
    }
    if p.has("json") {
        return print_json();
    }
    let mut filter = Filter {
        users: split_list(p.all("user")),
        jobs: split_list(p.all("jobs")),
        partitions: split_list(p.all("partition")),
        names: split_list(p.all("name")),
        accounts: split_list(p.all("account")),
        qos: split_list(p.all("qos")),
        ..Filter::default()
    };
    filter.jobs.extend(p.operands.iter().flat_map(|o| o.split(',')).map(str::to_string));
    if p.has("me") {
        filter.users.push(super::current_user());
    }
    for n in p.all("nodelist") {
        filter.nodes.extend(hostlist::expand(n).map_err(|e| SlurmError::fatal(PROG, e))?);
    }
    let states = split_list(p.all("states"));
    if !states.is_empty() {
        let mut all = Vec::new();
        for s in &states {
            all.extend(parse_state(s).ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid job state specified: {s}")))?);
        }
        filter.states = Some(all);
        filter.suspension = suspension_wanted(&states);
    } else if !filter.jobs.is_empty() {
        // squeue -j shows the named jobs in any state it still knows.
        filter.states = Some(parse_state("all").unwrap_or_default());
    }
    let format = if let Some(f) = p.last("Format") {
        long_format_to_format(f).map_err(|e| SlurmError::fatal(PROG, e))?
    } else if let Some(f) = p.last("format") {
        f.to_string()
    } else if p.has("long") {
        LONG_FORMAT.to_string()
    } else {
        std::env::var("SQUEUE_FORMAT").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| DEFAULT_FORMAT.to_string())
    };
    let include_finished = filter.states.as_ref().is_some_and(|s| s.iter().any(|st| st.is_final()));
    // As slurmctld, squeue knows finished jobs only for MinJobAge (the hot state), never the
    // accounting store.
    let query = proto::JobQuery {
        ids: super::query_ids(&filter.jobs).unwrap_or_default(),
        users: filter.users.clone(),
        accounts: filter.accounts.clone(),
        names: filter.names.clone(),
        states: filter.states.clone().unwrap_or_default(),
        partitions: filter.partitions.clone(),
        live: true,
        finished: include_finished,
        brief: true,
        ..Default::default()
    };
    let (jobs, names) = jobs_and_names(query)?;
    if let Some(missing) = filter.jobs.iter().find(|j| {
        !jobs.iter().any(|job| {
            job.id.to_string() == **j || super::display_id(job) == **j || job.array.as_ref().is_some_and(|a| a.array_job.to_string() == **j)
        })
    }) {
        if filter.jobs.len() == 1 {
            return Err(SlurmError::fatal(PROG, format!("Invalid job id specified: {missing}")));
        }
    }
    let shown: Vec<Job> = jobs.into_iter().filter(|j| filter.matches(j, &names)).collect();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    print!("{}", table(&shown, &names, &format, !p.has("noheader"), p.has("array"), now_ms));
    Ok(0)
}
