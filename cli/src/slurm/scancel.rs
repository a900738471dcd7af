//! `scancel`: cancel jobs by id (`N`, a whole array `N`, one task `N_3`, tasks `N_[1-3]`) or
//! by filters (`-u`, `-n`, `-t`, `-p`, `-A`, `-q`, `-w`).

use std::collections::BTreeMap;

use proto::{ClientRequest, Job, JobState};

use super::opts::{self, opt, Arg, OptDef};
use super::squeue::parse_state;
use super::{hostlist, SlurmError};
use crate::client::Cluster;

pub const PROG: &str = "scancel";

const OPTIONS: &[OptDef] = &[
    opt("account", Some('A'), Arg::Required),
    opt("batch", Some('b'), Arg::No),
    opt("clusters", Some('M'), Arg::Required),
    opt("ctld", None, Arg::No),
    opt("full", Some('f'), Arg::No),
    opt("help", None, Arg::No),
    opt("hurry", Some('H'), Arg::No),
    opt("interactive", Some('i'), Arg::No),
    opt("jobname", None, Arg::Required),
    opt("me", None, Arg::No),
    opt("name", Some('n'), Arg::Required),
    opt("nodelist", Some('w'), Arg::Required),
    opt("partition", Some('p'), Arg::Required),
    opt("qos", Some('q'), Arg::Required),
    opt("quiet", Some('Q'), Arg::No),
    opt("reservation", Some('R'), Arg::Required),
    opt("signal", Some('s'), Arg::Required),
    opt("state", Some('t'), Arg::Required),
    opt("usage", None, Arg::No),
    opt("user", Some('u'), Arg::Required),
    opt("verbose", Some('v'), Arg::No),
    opt("version", Some('V'), Arg::No),
    opt("wckey", None, Arg::Required),
];

/// One job id argument of scancel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `N`: a job, or every task of array `N`.
    Job(u64),
    /// `N_T` / `N_[1-3,5]`: tasks of array `N`.
    Tasks(u64, Vec<u32>),
}

pub fn parse_target(text: &str) -> Option<Target> {
    match text.split_once('_') {
        None => text.parse().ok().map(Target::Job),
        Some((a, t)) => {
            let array: u64 = a.parse().ok()?;
            let inner = t.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(t);
            let spec = super::sbatch::parse_array(inner)?;
            Some(Target::Tasks(array, spec.iter().collect()))
        }
    }
}

/// Jobs a target names (live or not).
pub fn select<'a>(jobs: &'a [Job], target: &Target) -> Vec<&'a Job> {
    match target {
        Target::Job(id) => super::members_of(jobs, *id),
        Target::Tasks(id, tasks) => {
            jobs.iter().filter(|j| j.array.as_ref().is_some_and(|a| a.array_job == *id && tasks.contains(&a.task))).collect()
        }
    }
}

fn split_list(values: Vec<&str>) -> Vec<String> {
    values.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

/// The filters of `-u`/`--me`, `-n`, `-p`, `-A`, `-q`, `-w` and `-t`: a job is chosen when it
/// matches every filter given.
struct Filters {
    users: Vec<String>,
    names: Vec<String>,
    partitions: Vec<String>,
    accounts: Vec<String>,
    qos: Vec<String>,
    nodes: Vec<String>,
    states: Option<Vec<JobState>>,
    suspension: Option<bool>,
}

impl Filters {
    /// The filters of the command line; a bad host list or state is an error.
    fn parse(p: &opts::Parsed) -> Result<Filters, SlurmError> {
        let mut users = split_list(p.all("user"));
        if p.has("me") {
            users.push(super::current_user());
        }
        let names: Vec<String> = split_list(p.all("name")).into_iter().chain(split_list(p.all("jobname"))).collect();
        let partitions = split_list(p.all("partition"));
        let accounts = split_list(p.all("account"));
        let qos = split_list(p.all("qos"));
        let mut nodes = Vec::new();
        for n in p.all("nodelist") {
            nodes.extend(hostlist::expand(n).map_err(|e| SlurmError::fatal(PROG, e))?);
        }
        let mut states: Option<Vec<JobState>> = None;
        let named = split_list(p.all("state"));
        for s in &named {
            let st = parse_state(s).ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid job state specified: {s}")))?;
            states.get_or_insert_with(Vec::new).extend(st);
        }
        let suspension = super::squeue::suspension_wanted(&named);
        Ok(Filters { users, names, partitions, accounts, qos, nodes, states, suspension })
    }

    /// Whether any filter was given.
    fn any(&self) -> bool {
        !self.users.is_empty()
            || !self.names.is_empty()
            || !self.partitions.is_empty()
            || !self.accounts.is_empty()
            || !self.qos.is_empty()
            || !self.nodes.is_empty()
            || self.states.is_some()
    }

    /// Whether job `j` matches every filter given (`node_names`: node ids to names, for `-w`).
    fn matches(&self, j: &Job, node_names: &BTreeMap<u64, String>) -> bool {
        let partition = j.spec.partition.clone().unwrap_or_else(|| super::env::DEFAULT_PARTITION.into());
        (self.users.is_empty() || self.users.contains(&j.spec.user))
            && (self.names.is_empty() || self.names.contains(&j.spec.name))
            && (self.partitions.is_empty() || self.partitions.contains(&partition))
            && (self.accounts.is_empty() || j.spec.account.as_ref().is_some_and(|a| self.accounts.contains(a)))
            && (self.qos.is_empty() || j.spec.qos.as_ref().is_some_and(|q| self.qos.contains(q)))
            && (self.nodes.is_empty() || super::job_node_names(j, node_names).iter().any(|n| self.nodes.contains(n)))
            && self.states.as_ref().is_none_or(|s| s.contains(&j.state))
            && super::squeue::suspension_ok(self.suspension, j)
    }
}

/// What to do with each chosen job: cancel it, or (`--signal`) signal it.
struct Action {
    signal: Option<i32>,
    /// `--batch`: the signal reaches the batch shell only.
    batch_only: bool,
    /// `--full`: the batch shell too, besides the steps a signal reaches by default.
    full: bool,
    quiet: bool,
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, false)?;
    if p.has("help") || p.has("usage") {
        println!("Usage: scancel [-A account] [--batch] [--interactive] [-n job_name] [-p partition] [-Q] [-q qos] [-R reservation] [-s signal | integer] [-t PENDING | RUNNING | SUSPENDED] [--usage] [-u user_name] [-V] [-v] [-w hosts...] [--wckey=wckey] [job_id[_array_id][.step_id]]");
        return Ok(0);
    }
    if p.has("version") {
        return Ok(super::print_version());
    }
    let signal = match p.last("signal") {
        Some(sig) => {
            Some(super::sbatch::parse_signal_name(sig).ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid job signal: {sig}")))?)
        }
        None => None,
    };
    let batch_only = p.has("batch");
    let full = p.has("full") && !batch_only;
    let targets = parse_targets(&p)?;
    let filters = Filters::parse(&p)?;
    if targets.is_empty() && !filters.any() {
        return Err(SlurmError::fatal(PROG, "No job identification provided"));
    }
    let action = Action { signal, batch_only, full, quiet: p.has("quiet") };
    let cluster = super::connect(PROG)?;
    super::block_on(PROG, async {
        // Only live jobs can be cancelled; a finished one named by id is told apart below.
        let jobs =
            super::query_jobs(PROG, &cluster, proto::JobQuery { live: true, finished: true, brief: true, ..Default::default() }).await?;
        let node_names =
            if filters.nodes.is_empty() { Default::default() } else { super::node_names(&super::list_nodes(PROG, &cluster).await?) };
        let matches_filters = |j: &Job| filters.matches(j, &node_names);
        let mut errors = 0;
        let mut chosen: Vec<&Job> = if targets.is_empty() {
            jobs.iter().filter(|j| !j.state.is_final() && matches_filters(j)).collect()
        } else {
            choose_targets(&jobs, &targets, &matches_filters, action.quiet, &mut errors)
        };
        chosen.sort_by_key(|j| j.id);
        chosen.dedup_by_key(|j| j.id);
        errors += cancel_or_signal(&cluster, &chosen, &action).await;
        Ok(if errors > 0 { 1 } else { 0 })
    })?
}

/// The job ids of the command line (comma-separated lists too); steps are refused.
fn parse_targets(p: &opts::Parsed) -> Result<Vec<Target>, SlurmError> {
    let mut targets = Vec::new();
    for t in p.operands.iter().flat_map(|o| o.split(',')).filter(|s| !s.is_empty()) {
        if t.contains('.') {
            return Err(SlurmError::fatal(PROG, format!("Invalid job id {t}: job steps are not supported yet")));
        }
        targets.push(parse_target(t).ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid job id {t}")))?);
    }
    Ok(targets)
}

/// The live jobs `targets` name that also match the filters, reporting (and counting in
/// `errors`) a target that names no job, or (unless `quiet`) only finished ones.
fn choose_targets<'a>(
    jobs: &'a [Job],
    targets: &[Target],
    matches_filters: &dyn Fn(&Job) -> bool,
    quiet: bool,
    errors: &mut usize,
) -> Vec<&'a Job> {
    let mut chosen: Vec<&Job> = Vec::new();
    for t in targets {
        let found = select(jobs, t);
        let label = match t {
            Target::Job(id) => id.to_string(),
            Target::Tasks(id, tasks) => {
                format!("{id}_{}", super::squeue::task_ranges(tasks))
            }
        };
        if found.is_empty() {
            eprintln!("{PROG}: error: Kill job error on job id {label}: Invalid job id specified");
            *errors += 1;
            continue;
        }
        let live: Vec<&Job> = found.into_iter().filter(|j| matches_filters(j)).collect();
        if !live.is_empty() && live.iter().all(|j| j.state.is_final()) && !quiet {
            eprintln!("{PROG}: error: Kill job error on job id {label}: Job/step already completing or completed");
            *errors += 1;
        }
        chosen.extend(live.into_iter().filter(|j| !j.state.is_final()));
    }
    chosen
}

/// Cancels each of `chosen` (or, with a signal, signals the running ones), reporting each
/// refusal unless quiet: how many were refused.
async fn cancel_or_signal(cluster: &Cluster, chosen: &[&Job], action: &Action) -> usize {
    let mut errors = 0;
    for j in chosen {
        // With --signal, scancel signals the job instead of cancelling it (running jobs only).
        let requests = match action.signal {
            Some(signal) if j.state == proto::JobState::Running => {
                let mut r = vec![ClientRequest::Signal { job: j.id, signal, batch_only: action.batch_only }];
                if action.full {
                    r.push(ClientRequest::Signal { job: j.id, signal, batch_only: true });
                }
                r
            }
            Some(_) => continue,
            None => vec![ClientRequest::Cancel { job: j.id }],
        };
        for request in requests {
            let Err(e) = super::call(PROG, cluster, request).await else { continue };
            if !action.quiet {
                eprintln!(
                    "{PROG}: error: Kill job error on job id {}: {}",
                    super::display_id(j),
                    e.text.trim_start_matches("scancel: error: ")
                );
            }
            errors += 1;
            break;
        }
    }
    errors
}
