//! `scontrol`: `show hostnames|hostlist|job|node|partition|config`, `requeue`, the job changes
//! `hold`, `release`, `suspend`, `resume` and `update JobId=`, `update NodeName=
//! State=DRAIN|RESUME|UNDRAIN`, and `create|update|delete PartitionName=`.

use std::collections::BTreeMap;

use proto::{ApiError, ClientRequest, Job, JobState, NodeInfo};

use super::env::DEFAULT_PARTITION;
use super::squeue::{dependency_text, mem_text, reason_shown, run_seconds};
use super::{hostlist, sinfo, time, SlurmError};

pub use slurm_compat::show::final_reason;

pub const PROG: &str = "scontrol";

/// `show hostnames`: one name per line.
pub fn hostnames(list: &str) -> Result<String, SlurmError> {
    let hosts = hostlist::expand(list).map_err(|e| SlurmError::fatal(PROG, e))?;
    Ok(hosts.iter().map(|h| format!("{h}\n")).collect())
}

/// `show hostlist`: the compressed form of a list (names, ranges, or both).
pub fn hostlist_of(list: &str, sorted: bool) -> Result<String, SlurmError> {
    let mut hosts = hostlist::expand(list).map_err(|e| SlurmError::fatal(PROG, e))?;
    if sorted {
        hosts.sort();
    }
    Ok(format!("{}\n", hostlist::compress(&hosts)))
}

fn or_null(v: Option<&String>) -> String {
    v.cloned().unwrap_or_else(|| "(null)".into())
}

fn time_or_unknown(ms: Option<u64>) -> String {
    ms.map_or("Unknown".into(), time::datetime)
}

/// `scontrol show job` for one job, in Slurm's layout (the fields Corral knows).
pub fn job_text(job: &Job, names: &BTreeMap<u64, String>, now_ms: u64) -> String {
    let s = &job.spec;
    let nodes = super::job_node_names(job, names);
    let nodelist = if nodes.is_empty() { "(null)".to_string() } else { hostlist::compress(&nodes) };
    // The nodes it got (a job of `-N MIN-MAX`: some number of its range); a pending one shows
    // its range as Slurm does (`NumNodes=2-4`).
    let node_count = job.node_count();
    let num_nodes = match s.nodes_max() {
        max if job.state == JobState::Pending && max > s.nodes => format!("{}-{max}", s.nodes),
        _ => node_count.to_string(),
    };
    let ntasks: u32 = super::env::tasks_per_node(s, node_count as usize).iter().sum();
    let cpus = slurm_compat::acct::job_cpus(job);
    let mut head = format!("JobId={}", job.id);
    if let Some(a) = &job.array {
        head.push_str(&format!(" ArrayJobId={} ArrayTaskId={}", a.array_job, a.task));
    }
    head.push_str(&format!(" JobName={}", s.name));
    let uid = s.uid.map_or(String::new(), |u| format!("({u})"));
    let gid = s.gid.map_or(String::new(), |g| format!("({g})"));
    // A description is shown as one word, as Slurm does (`Reason=Job's_account_not_...`).
    let reason = if job.state == JobState::Pending { reason_shown(job).replace(' ', "_") } else { final_reason(job).into() };
    let eligible = slurm_compat::show::eligible_ms(job, now_ms);
    let group = s.gid.map_or_else(|| s.user.clone(), |g| super::group_name(g).unwrap_or_else(|| "nobody".into()));
    let pattern = |p: Option<&String>| {
        p.map(|p| {
            let expanded = super::env::output_path(p, job, &nodes, 0);
            if expanded.starts_with('/') {
                expanded
            } else {
                format!("{}/{expanded}", s.workdir.trim_end_matches('/'))
            }
        })
    };
    let stdout = pattern(s.output.as_ref()).unwrap_or_else(|| "(null)".into());
    let stderr = pattern(s.error.as_ref()).unwrap_or_else(|| stdout.clone());
    // In the TRES' own order (cpu, mem, node, billing, then GRES), as slurmctld formats them.
    let mut tres = format!("cpu={cpus},mem={},node={node_count},billing={cpus}", mem_text(s.mem_mib.saturating_mul(u64::from(node_count))));
    let (gres, per_node) = s.gres_per_node();
    if per_node > 0 {
        tres.push_str(&format!(",gres/{gres}={}", per_node * node_count));
    }
    let lines = [
        head,
        format!("UserId={}{uid} GroupId={group}{gid} MCS_label=N/A", s.user),
        format!("Priority=1 Nice=0 Account={} QOS={}", or_null(s.account.as_ref()), s.qos.clone().unwrap_or_else(|| "normal".into())),
        format!("JobState={} Reason={reason} Dependency={}", job.state_name(), dependency_text(job)),
        format!(
            "Requeue={} Restarts={} BatchFlag={} Reboot=0 ExitCode={}",
            u8::from(s.requeue),
            job.restart_count,
            u8::from(s.script.is_some()),
            super::exit_code_text(job)
        ),
        format!(
            "RunTime={} TimeLimit={} TimeMin=N/A",
            time::elapsed(run_seconds(job, now_ms)),
            s.time_limit_ms.map_or("UNLIMITED".into(), |ms| time::elapsed(ms / 1000))
        ),
        format!("SubmitTime={} EligibleTime={}", time::datetime(job.submit_ms), time_or_unknown(eligible)),
        format!("AccrueTime={}", time_or_unknown(eligible)),
        format!(
            "StartTime={} EndTime={} Deadline=N/A",
            time_or_unknown(job.start_ms),
            time_or_unknown(slurm_compat::show::end_ms(job, now_ms))
        ),
        format!(
            "SuspendTime={} SecsPreSuspend={}",
            job.suspension.since_ms.filter(|_| job.suspended()).map_or("None".into(), time::datetime),
            job.suspension.since_ms.filter(|_| job.suspended()).map_or(0, |since| job.run_time_ms_at(since) / 1000)
        ),
        format!("Partition={} AllocNode:Sid={}:0", s.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.into()), s.submit_host),
        format!(
            "ReqNodeList={} ExcNodeList={}",
            if s.nodelist.is_empty() { "(null)".into() } else { hostlist::compress(&s.nodelist) },
            if s.exclude.is_empty() { "(null)".into() } else { hostlist::compress(&s.exclude) }
        ),
        format!("NodeList={nodelist}"),
        format!("NumNodes={num_nodes} NumCPUs={cpus} NumTasks={ntasks} CPUs/Task={} ReqB:S:C:T=0:0:*:*", s.cpus_per_task),
        format!("TRES={tres}"),
        format!("MinCPUsNode={} MinMemoryNode={} MinTmpDiskNode=0", s.cpus_per_task, mem_text(s.mem_mib)),
        format!("Features={} DelayBoot=00:00:00", if s.constraint.is_empty() { "(null)".into() } else { s.constraint.join("&") }),
        // Slurm's optional line, before OverSubscribe (`Reservation=NAME`); empty lines are dropped.
        s.reservation().map_or(String::new(), |r| format!("Reservation={r}")),
        format!("OverSubscribe={} Contiguous=0 Licenses=(null) Network=(null)", if s.exclusive { "NO" } else { "OK" }),
        format!("Command={}", if s.script.is_some() { s.name.clone() } else { s.argv.join(" ") }),
        format!("WorkDir={}", s.workdir),
        // Slurm's optional line after WorkDir, with its trailing blank; one line per repair.
        super::system_comment(job, names).map_or(String::new(), |c| format!("SystemComment={c} ")),
        format!("StdErr={stderr}"),
        "StdIn=/dev/null".to_string(),
        format!("StdOut={stdout}"),
    ];
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate().filter(|(_, l)| !l.is_empty()) {
        out.push_str(if i == 0 { "" } else { "   " });
        out.push_str(l);
        out.push('\n');
    }
    if let Some(g) = &s.gres {
        out.push_str(&format!("   TresPerNode=gres:{g}\n"));
    }
    out.push_str(&spares_text(job, names));
    out.push('\n');
    out
}

/// Corral's own line for a job with spare nodes: `SpareNodes=... Repairs=RANK:LOST>SPARE@TIME,...`
/// (nothing for a job without).
fn spares_text(job: &Job, names: &BTreeMap<u64, String>) -> String {
    if job.spec.spare_nodes() == 0 && job.repairs.is_empty() {
        return String::new();
    }
    let name = |n: &u64| names.get(n).cloned().unwrap_or_else(|| n.to_string());
    let spares: Vec<String> = job.spares.iter().map(name).collect();
    let repairs: Vec<String> =
        job.repairs.iter().map(|r| format!("{}:{}>{}@{}", r.rank, name(&r.lost), name(&r.spare), time::datetime(r.at_ms))).collect();
    let or_none = |v: Vec<String>, f: fn(&[String]) -> String| if v.is_empty() { "(null)".to_string() } else { f(&v) };
    format!("   SpareNodes={} Repairs={}\n", or_none(spares, hostlist::compress), or_none(repairs, |r| r.join(",")))
}

/// `scontrol -d show job`'s text: [`job_text`] with the line Slurm adds under `ExitCode`,
/// `DerivedExitCode=CODE:SIGNAL`, the highest exit of the job's steps.
pub fn with_derived_exit_code(text: &str, job: &Job) -> String {
    let line = format!("   DerivedExitCode={}", slurm_compat::acct::status_text(slurm_compat::acct::derived_status(job)));
    let mut out = String::new();
    for l in text.lines() {
        out.push_str(l);
        out.push('\n');
        if l.starts_with("   Requeue=") {
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}

/// `scontrol show node` for one node.
pub fn node_text(n: &NodeInfo) -> String {
    // Its state without the reservation, then Slurm's flags (`IDLE+MAINTENANCE+RESERVED`).
    let (_, long) = sinfo::node_state(&NodeInfo { reserved: false, maint: false, ..n.clone() });
    let flags = match (n.maint, n.reserved) {
        (true, _) => "+MAINTENANCE+RESERVED",
        (false, true) => "+RESERVED",
        (false, false) => "",
    };
    let state = format!("{}{flags}", long.to_ascii_uppercase());
    let used = n.gpus_total.saturating_sub(n.gpus_free);
    let mut out = format!("NodeName={} CoresPerSocket=N/A\n", n.name);
    out.push_str("   AvailableFeatures=(null)\n");
    out.push_str(&format!("   Gres={}\n", sinfo::gres_text(n)));
    out.push_str(&format!("   NodeAddr={} NodeHostName={}\n", n.addr, n.name));
    out.push_str(&format!("   State={state}\n"));
    out.push_str(&format!("   Partitions={}\n", sinfo::partitions_of(n).join(",")));
    out.push_str(&format!("   CfgTRES=gres/gpu={}\n", n.gpus_total));
    out.push_str(&format!("   AllocTRES={}\n", if used > 0 { format!("gres/gpu={used}") } else { String::new() }));
    out.push_str(&format!("   CorralRole={}\n", n.role.as_str()));
    if let Some(r) = &n.reason {
        out.push_str(&format!("   Reason={r}\n"));
    }
    out.push('\n');
    out
}

/// `scontrol show partition [NAME]`: every partition a node is in (its node.toml's, else the
/// policy's default) or the policy defines, in Slurm's layout (the fields Corral knows).
pub fn partitions_text(nodes: &[NodeInfo], parts: &sinfo::Partitions, name: Option<&str>) -> Result<String, SlurmError> {
    let mut members: BTreeMap<String, Vec<&NodeInfo>> = BTreeMap::new();
    for p in parts.defs.keys().chain(parts.default.iter()) {
        members.entry(p.clone()).or_default();
    }
    for n in nodes {
        for p in sinfo::partitions_of(n) {
            members.entry(p).or_default().push(n);
        }
    }
    if let Some(name) = name {
        members.retain(|p, _| p == name);
        if members.is_empty() {
            return Err(SlurmError { text: format!("Partition {name} not found"), code: 1 });
        }
    }
    let mut out = String::new();
    for (p, in_it) in &members {
        let mut names: Vec<String> = in_it.iter().map(|n| n.name.clone()).collect();
        names.sort();
        let gpus: u32 = in_it.iter().map(|n| n.gpus_total).sum();
        // As Slurm's `secs2time_str`: `08:00:00`, `2-00:00:00` (squeue's shorter form is not used here).
        let max_time = parts.max_time_limit_ms.get(p).map_or("UNLIMITED".to_string(), |ms| time::elapsed(ms / 1000));
        let def = parts.defs.get(p);
        let default_time = def.and_then(|d| d.default_time_limit_ms).map_or("NONE".to_string(), |ms| time::elapsed(ms / 1000));
        out.push_str(&format!("PartitionName={p}\n"));
        out.push_str(&format!("   {}\n", def.map(|d| d.access.clone()).unwrap_or_default().show()));
        out.push_str(&format!("   Default={} QoS=N/A\n", if p == parts.default_name() { "YES" } else { "NO" }));
        out.push_str(&format!("   DefaultTime={default_time}\n"));
        out.push_str(&format!("   MaxNodes=UNLIMITED MaxTime={max_time} MinNodes=0\n"));
        out.push_str(&format!("   Nodes={}\n", if names.is_empty() { "(null)".into() } else { hostlist::compress(&names) }));
        out.push_str(&format!("   PriorityTier={}\n", def.map_or(0, |d| d.priority_tier)));
        out.push_str(&format!("   State={} TotalNodes={}\n", parts.state(p).as_str(), names.len()));
        out.push_str(&format!("   TRES=gres/gpu={gpus}\n\n"));
    }
    Ok(out)
}

/// A parsed `scontrol` command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Hostnames(Option<String>),
    Hostlist(String, bool),
    ShowJob(Option<String>),
    ShowNode(Option<String>),
    ShowPartition(Option<String>),
    ShowReservation(Option<String>),
    ShowConfig,
    Requeue(Vec<u64>, bool),
    Hold(Vec<u64>),
    Release(Vec<u64>),
    /// `suspend` (true) or `resume` (false) of running jobs.
    Suspend(Vec<u64>, bool),
    Update {
        job: u64,
        time_limit_ms: Option<Option<u64>>,
        partition: Option<String>,
    },
    /// `update NodeName=LIST State=DRAIN Reason=...` (drain) or `State=RESUME|UNDRAIN`.
    UpdateNodes {
        nodes: Vec<String>,
        drain: Option<String>,
    },
    /// `create|update|delete PartitionName=...`.
    EditPartition(proto::PartitionEdit),
    EditReservation(proto::ReservationEdit),
    /// `token [lifespan=SECONDS] [username=NAME]`: a REST API token.
    Token {
        lifespan_s: Option<u64>,
        user: Option<String>,
    },
    Version,
}

/// `update NodeName=LIST State=... [Reason=...]`, as Slurm takes it for the states Corral has:
/// DRAIN (a reason required, as in Slurm), RESUME and UNDRAIN (the drain cleared). DOWN and
/// the power states are refused with what to use instead.
fn parse_node_update(args: &[String]) -> Result<Command, SlurmError> {
    let (mut nodes, mut state, mut reason) = (None, None, None);
    for kv in args {
        let (k, v) = kv.split_once('=').ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid input: {kv}")))?;
        match k.to_ascii_lowercase().as_str() {
            "nodename" | "nodes" => nodes = Some(hostlist::expand(v).map_err(|e| SlurmError::fatal(PROG, e))?),
            "state" => state = Some(v.to_ascii_uppercase()),
            "reason" => reason = Some(v.to_string()).filter(|r| !r.is_empty()),
            _ => return Err(SlurmError::fatal(PROG, format!("Update of node {k} is not supported; Corral can update State and Reason"))),
        }
    }
    let nodes = nodes.filter(|n| !n.is_empty()).ok_or_else(|| SlurmError::fatal(PROG, "No NodeName given"))?;
    let state = state.ok_or_else(|| SlurmError::fatal(PROG, "No State given: Corral can set State=DRAIN, RESUME or UNDRAIN"))?;
    let drain = match state.as_str() {
        "DRAIN" => Some(
            reason.ok_or_else(|| SlurmError::fatal(PROG, "You must specify a reason when DOWNING or DRAINING a node. Request denied"))?,
        ),
        "RESUME" | "UNDRAIN" | "IDLE" => None,
        "DOWN" | "FAIL" | "FAILING" => {
            return Err(SlurmError::fatal(
                PROG,
                format!(
                    "State={state} is not supported: Corral declares a node down only when it stops heartbeating \
                     (its jobs are then requeued or end NODE_FAIL); use State=DRAIN to take it out of use"
                ),
            ))
        }
        other => {
            return Err(SlurmError::fatal(PROG, format!("State={other} is not supported: Corral can set State=DRAIN, RESUME or UNDRAIN")))
        }
    };
    Ok(Command::UpdateNodes { nodes, drain })
}

/// Whether `args` name a partition (`PartitionName=`), as `update` and `delete` tell it apart.
fn names_partition(args: &[String]) -> bool {
    args.iter().any(|kv| kv.split_once('=').is_some_and(|(k, _)| k.eq_ignore_ascii_case("partitionname")))
}

/// `create|update PartitionName=NAME [Nodes=LIST] [State=] [MaxTime=] [DefaultTime=]
/// [PriorityTier=] [Default=YES|NO] [AllowAccounts=] [DenyAccounts=] [AllowQos=] [DenyQos=]
/// [AllowGroups=]` and `delete PartitionName=NAME`, refusing what Corral cannot do.
fn parse_partition_edit(verb: &str, args: &[String]) -> Result<Command, SlurmError> {
    let mut name = None;
    let mut changes = proto::PartitionChanges::default();
    let time = |k: &str, v: &str| -> Result<Option<u64>, SlurmError> {
        if v.eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        let limit = time::parse_limit_s(v).map_err(|time::NotATime| SlurmError::fatal(PROG, format!("Invalid input: {k}={v}")))?;
        Ok(limit.map(|s| s.saturating_mul(1000)))
    };
    for kv in args {
        let (k, v) = kv.split_once('=').ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid input: {kv}")))?;
        match k.to_ascii_lowercase().as_str() {
            "partitionname" => name = Some(v.to_string()),
            _ if verb == "delete" => return Err(SlurmError::fatal(PROG, format!("Invalid input: {kv}"))),
            "state" => {
                let state = proto::PartitionState::parse(v).ok_or_else(|| {
                    SlurmError::fatal(
                        PROG,
                        format!("Invalid input: {kv}\nscontrol: error: Acceptable State values are UP, DOWN, DRAIN and INACTIVE"),
                    )
                })?;
                changes.state = Some(state);
            }
            "maxtime" => changes.max_time_limit_ms = Some(time(k, v)?),
            "defaulttime" => changes.default_time_limit_ms = Some(time(k, v)?),
            "prioritytier" => {
                let tier = v.parse().map_err(|_| SlurmError::fatal(PROG, format!("Invalid input: {kv}")))?;
                changes.priority_tier = Some(tier);
            }
            "default" => {
                let yes = match v.to_ascii_uppercase().as_str() {
                    "YES" => true,
                    "NO" => false,
                    _ => return Err(SlurmError::fatal(PROG, format!("Invalid input: {kv}"))),
                };
                changes.default = Some(yes);
            }
            "allowaccounts" => changes.allow_accounts = Some(access_list(v, true)),
            "denyaccounts" => changes.deny_accounts = Some(access_list(v, false)),
            "allowqos" => changes.allow_qos = Some(access_list(v, true)),
            "denyqos" => changes.deny_qos = Some(access_list(v, false)),
            "allowgroups" => changes.allow_groups = Some(access_list(v, true)),
            "nodes" => {
                if v.eq_ignore_ascii_case("all") {
                    return Err(SlurmError::fatal(PROG, format!("{kv} is not supported: list the nodes (Nodes=gpu[01-16])")));
                }
                changes.nodes = Some(hostlist::expand(v).map_err(|e| SlurmError::fatal(PROG, e))?);
            }
            _ => return Err(SlurmError::fatal(PROG, format!("Update of this parameter is not supported: {kv}"))),
        }
    }
    let name = name.filter(|n| !n.is_empty()).ok_or_else(|| SlurmError::fatal(PROG, "No PartitionName given"))?;
    Ok(Command::EditPartition(match verb {
        "create" => proto::PartitionEdit::Create { name, changes },
        "update" => proto::PartitionEdit::Update { name, changes },
        _ => proto::PartitionEdit::Delete { name },
    }))
}

/// An access list as `scontrol` takes it: comma-separated names; empty (and, for an allow list,
/// `ALL`) is no list.
fn access_list(value: &str, allow: bool) -> Vec<String> {
    if allow && value.eq_ignore_ascii_case("all") {
        return Vec::new();
    }
    value.split(',').filter(|n| !n.is_empty()).map(str::to_string).collect()
}

/// Sends one partition edit; Slurm's message on refusal.
fn edit_partition(edit: proto::PartitionEdit) -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    super::block_on(PROG, async {
        let name = edit.name().to_string();
        let verb = match &edit {
            proto::PartitionEdit::Create { .. } => "create",
            proto::PartitionEdit::Update { .. } => "update",
            proto::PartitionEdit::Delete { .. } => "delete",
        };
        match cluster.call_patiently(ClientRequest::EditPartition { edit }, super::PATIENCE).await {
            Ok(_) => 0,
            Err(e) => {
                let why = match e.downcast_ref::<ApiError>() {
                    Some(ApiError::Invalid(m) | ApiError::Denied(m)) => m.clone(),
                    _ => super::describe_error(&e),
                };
                match verb {
                    "create" => eprintln!("Error creating the partition: {why}"),
                    "update" => eprintln!("slurm_update error: {why}"),
                    _ => eprintln!("delete_partition PartitionName={name}: {why}"),
                }
                1
            }
        }
    })
}

/// Drains or resumes each node, printing Slurm's kind of error for each refusal.
fn update_nodes(nodes: Vec<String>, drain: Option<String>) -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    super::block_on(PROG, async {
        let mut failed = false;
        for node in nodes {
            let req = match &drain {
                Some(reason) => ClientRequest::Drain { node: node.clone(), reason: reason.clone() },
                None => ClientRequest::Resume { node: node.clone() },
            };
            if let Err(e) = cluster.call_patiently(req, super::PATIENCE).await {
                let why = match e.downcast_ref::<ApiError>() {
                    Some(ApiError::NotFound(_)) => "Invalid node name specified".to_string(),
                    _ => super::describe_error(&e),
                };
                eprintln!("{why} for node {node}");
                failed = true;
            }
        }
        i32::from(failed)
    })
}

fn job_ids(args: &[String]) -> Result<Vec<u64>, SlurmError> {
    let mut out = Vec::new();
    for a in args.iter().flat_map(|a| a.split(',')).filter(|s| !s.is_empty()) {
        out.push(a.parse().map_err(|_| SlurmError::fatal(PROG, format!("Invalid job id specified: {a}")))?);
    }
    if out.is_empty() {
        return Err(SlurmError::fatal(PROG, "Invalid job id specified"));
    }
    Ok(out)
}

/// `token [lifespan=SECONDS|infinite] [username=NAME]`, as Slurm takes it.
fn parse_token(args: &[String]) -> Result<Command, SlurmError> {
    let (mut lifespan_s, mut user) = (None, None);
    for a in args {
        match a.split_once('=') {
            Some((k, v)) if k.eq_ignore_ascii_case("lifespan") => {
                lifespan_s = Some(v.parse().map_err(|_| SlurmError::fatal(PROG, format!("Invalid lifespan value: {v}")))?);
            }
            Some((k, v)) if k.eq_ignore_ascii_case("username") => user = Some(v.to_string()),
            _ => return Err(SlurmError::fatal(PROG, format!("Invalid parameter {a} for token request"))),
        }
    }
    Ok(Command::Token { lifespan_s, user })
}

/// Whether `word` is an abbreviation (at least `min` letters) of `full`.
fn is(word: &str, full: &str, min: usize) -> bool {
    let w = word.to_ascii_lowercase();
    w.len() >= min && full.starts_with(&w)
}

pub fn parse(args: &[String]) -> Result<Command, SlurmError> {
    let args: Vec<String> = args
        .iter()
        .filter(|a| !matches!(a.as_str(), "-o" | "--oneliner" | "-d" | "--details" | "-a" | "--all" | "-Q" | "--quiet"))
        .cloned()
        .collect();
    let Some((verb, rest)) = args.split_first() else {
        return Err(SlurmError::fatal(PROG, "no command given; interactive mode is not supported"));
    };
    if verb == "-V" || verb == "--version" || is(verb, "version", 4) {
        return Ok(Command::Version);
    }
    if is(verb, "show", 3) {
        let Some((what, more)) = rest.split_first() else {
            return Err(SlurmError::fatal(PROG, "too few arguments for keyword:show"));
        };
        let arg = more.first().cloned();
        let w = what.to_ascii_lowercase();
        return match w.as_str() {
            "hostnames" | "hostname" => Ok(Command::Hostnames(arg)),
            "hostlist" | "hostlistsorted" => {
                let list = arg.ok_or_else(|| SlurmError::fatal(PROG, "host list is empty"))?;
                Ok(Command::Hostlist(list, w == "hostlistsorted"))
            }
            _ if is(&w, "jobs", 3) => Ok(Command::ShowJob(arg)),
            _ if is(&w, "nodes", 4) => Ok(Command::ShowNode(arg)),
            _ if is(&w, "partitions", 4) => Ok(Command::ShowPartition(arg)),
            _ if is(&w, "reservations", 3) => Ok(Command::ShowReservation(arg)),
            _ if is(&w, "config", 1) => Ok(Command::ShowConfig),
            _ => Err(SlurmError::fatal(PROG, format!("invalid entity:{what} for keyword:show"))),
        };
    }
    if is(verb, "token", 5) {
        return parse_token(rest);
    }
    if is(verb, "requeue", 3) || is(verb, "requeuehold", 8) {
        return Ok(Command::Requeue(job_ids(rest)?, verb.eq_ignore_ascii_case("requeuehold")));
    }
    if is(verb, "hold", 4) || is(verb, "uhold", 5) {
        return Ok(Command::Hold(job_ids(rest)?));
    }
    if is(verb, "release", 3) {
        return Ok(Command::Release(job_ids(rest)?));
    }
    if is(verb, "suspend", 2) {
        return Ok(Command::Suspend(job_ids(rest)?, true));
    }
    if is(verb, "resume", 3) {
        return Ok(Command::Suspend(job_ids(rest)?, false));
    }
    for edit in ["create", "update", "delete"] {
        if is(verb, edit, if edit == "update" { 1 } else { 2 }) && super::reservation::is_reservation(rest) {
            return Ok(Command::EditReservation(super::reservation::parse(edit, rest, time::now_ms() as i64 / 1000)?));
        }
    }
    if is(verb, "create", 2) {
        return parse_partition_edit("create", rest);
    }
    if is(verb, "delete", 3) {
        if !names_partition(rest) {
            return Err(SlurmError::fatal(PROG, "Corral's scontrol deletes partitions and reservations only: delete PartitionName=NAME"));
        }
        return parse_partition_edit("delete", rest);
    }
    if is(verb, "update", 1) && names_partition(rest) {
        return parse_partition_edit("update", rest);
    }
    if is(verb, "update", 1) {
        if rest
            .iter()
            .any(|kv| kv.split_once('=').is_some_and(|(k, _)| k.eq_ignore_ascii_case("nodename") || k.eq_ignore_ascii_case("nodes")))
        {
            return parse_node_update(rest);
        }
        let mut job = None;
        let mut time_limit_ms = None;
        let mut partition = None;
        for kv in rest {
            let (k, v) = kv.split_once('=').ok_or_else(|| SlurmError::fatal(PROG, format!("Invalid input: {kv}")))?;
            match k.to_ascii_lowercase().as_str() {
                "jobid" | "job" => job = Some(job_ids(&[v.to_string()])?[0]),
                "timelimit" => {
                    let limit = time::parse_limit_s(v)
                        .map_err(|time::NotATime| SlurmError::fatal(PROG, format!("Invalid TimeLimit value: {v}")))?;
                    time_limit_ms = Some(limit.map(|s| s * 1000));
                }
                "partition" => partition = Some(v.to_string()),
                _ => {
                    return Err(SlurmError::fatal(
                        PROG,
                        format!("Update of {k} is not supported yet; Corral can update TimeLimit and Partition"),
                    ))
                }
            }
        }
        let job = job.ok_or_else(|| SlurmError::fatal(PROG, "No JobId given: update needs JobId=N"))?;
        return Ok(Command::Update { job, time_limit_ms, partition });
    }
    Err(SlurmError::fatal(PROG, format!("Invalid keyword: {verb}")))
}

/// Holds, releases or updates pending jobs, printing Slurm's kind of error for each refusal.
fn update_jobs(
    ids: Vec<u64>,
    hold: Option<bool>,
    time_limit_ms: Option<Option<u64>>,
    partition: Option<Option<String>>,
) -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    super::block_on(PROG, async {
        let mut failed = false;
        for job in ids {
            let req = ClientRequest::UpdateJob { job, hold, time_limit_ms, partition: partition.clone() };
            if let Err(e) = cluster.call_patiently(req, super::PATIENCE).await {
                let why = match e.downcast_ref::<ApiError>() {
                    Some(ApiError::NotFound(_)) => "Invalid job id specified".to_string(),
                    Some(ApiError::Invalid(m) | ApiError::Denied(m)) if m.contains("only a pending job") => {
                        "Job is no longer pending execution".to_string()
                    }
                    Some(ApiError::Invalid(m) | ApiError::Denied(m)) => m.clone(),
                    _ => super::describe_error(&e),
                };
                eprintln!("{why} for job {job}");
                failed = true;
            }
        }
        i32::from(failed)
    })
}

/// Suspends or resumes running jobs, printing Slurm's words for each refusal (e.g. "Job is not
/// suspended for job 7").
fn suspend_jobs(ids: Vec<u64>, suspend: bool) -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    super::block_on(PROG, async {
        let mut failed = false;
        for job in ids {
            if let Err(e) = cluster.call_patiently(ClientRequest::Suspend { job, suspend }, super::PATIENCE).await {
                let why = match e.downcast_ref::<ApiError>() {
                    Some(ApiError::NotFound(_)) => "Invalid job id specified".to_string(),
                    Some(ApiError::Denied(_)) => "Access/permission denied".to_string(),
                    Some(ApiError::Invalid(m)) => m.clone(),
                    _ => super::describe_error(&e),
                };
                eprintln!("{why} for job {job}");
                failed = true;
            }
        }
        i32::from(failed)
    })
}

/// `scontrol token`: prints `SLURM_JWT=TOKEN`, as Slurm does.
fn token(lifespan_s: Option<u64>, user: Option<String>) -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    match super::block_on(PROG, super::call(PROG, &cluster, proto::ClientRequest::IssueToken { user, lifespan_s }))?? {
        proto::Reply::Token(token) => println!("SLURM_JWT={token}"),
        other => return Err(SlurmError::fatal(PROG, format!("unexpected reply {other:?}"))),
    }
    Ok(0)
}

/// `scontrol [-d] show job [ID]`: each job (or array task) the cluster holds, or job ID's.
fn show_jobs(id: Option<String>, details: bool) -> Result<i32, SlurmError> {
    let id = id.map(|i| job_ids(&[i]).map(|v| v[0])).transpose()?;
    let cluster = super::connect(PROG)?;
    let (jobs, nodes) = super::block_on(PROG, async {
        // slurmctld's view: live jobs and those finished within MinJobAge.
        let ids = id.map(|i| vec![i]).unwrap_or_default();
        let jobs = super::query_jobs(PROG, &cluster, proto::JobQuery { ids, live: true, finished: true, ..Default::default() }).await?;
        Ok::<_, SlurmError>((jobs, super::list_nodes(PROG, &cluster).await?))
    })??;
    let names = super::node_names(&nodes);
    let now_ms = time::now_ms();
    let shown: Vec<&Job> = match id {
        Some(id) => super::members_of(&jobs, id),
        None => jobs.iter().collect(),
    };
    if shown.is_empty() {
        return Err(if id.is_some() {
            SlurmError::fatal(PROG, "Invalid job id specified")
        } else {
            SlurmError { text: "No jobs in the system".into(), code: 0 }
        });
    }
    for j in shown {
        let mut text = job_text(j, &names, now_ms);
        if details {
            text = with_derived_exit_code(&text, j);
        }
        print!("{text}");
    }
    Ok(0)
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let details = args.iter().any(|a| a == "-d" || a == "--details");
    let cmd = parse(args)?;
    match cmd {
        Command::Version => Ok(super::print_version()),
        Command::Token { lifespan_s, user } => token(lifespan_s, user),
        Command::Hostnames(list) => {
            let list = list
                .or_else(|| super::allocation_env(&std::env::vars().collect()).get("SLURM_JOB_NODELIST").cloned())
                .filter(|l| !l.is_empty())
                .ok_or_else(|| SlurmError::fatal(PROG, "host list is empty"))?;
            print!("{}", hostnames(&list)?);
            Ok(0)
        }
        Command::Hostlist(list, sorted) => {
            print!("{}", hostlist_of(&list, sorted)?);
            Ok(0)
        }
        Command::ShowJob(id) => show_jobs(id, details),
        Command::ShowNode(name) => {
            let cluster = super::connect(PROG)?;
            let nodes = super::block_on(PROG, super::list_nodes(PROG, &cluster))??;
            let wanted = match &name {
                Some(n) => Some(hostlist::expand(n).map_err(|e| SlurmError::fatal(PROG, e))?),
                None => None,
            };
            let shown: Vec<&NodeInfo> = nodes.iter().filter(|n| wanted.as_ref().is_none_or(|w| w.contains(&n.name))).collect();
            if shown.is_empty() {
                return Err(SlurmError { text: format!("Node {} not found", name.unwrap_or_default()), code: 1 });
            }
            for n in shown {
                print!("{}", node_text(n));
            }
            Ok(0)
        }
        Command::ShowPartition(name) => {
            let cluster = super::connect(PROG)?;
            let (nodes, policy) = super::block_on(PROG, async {
                Ok::<_, SlurmError>((super::list_nodes(PROG, &cluster).await?, super::get_policy(PROG, &cluster).await?))
            })??;
            print!("{}", partitions_text(&nodes, &sinfo::Partitions::from_policy(&policy), name.as_deref())?);
            Ok(0)
        }
        Command::ShowConfig => show_config(),
        Command::Requeue(ids, hold) => {
            let cluster = super::connect(PROG)?;
            super::block_on(PROG, async {
                let mut failed = false;
                for job in ids {
                    let req = if hold { ClientRequest::RequeueHold { job } } else { ClientRequest::Requeue { job } };
                    if let Err(e) = cluster.call_patiently(req, super::PATIENCE).await {
                        // Slurm's words, e.g. "Requested operation is presently disabled for job 7".
                        let why = match e.downcast_ref::<ApiError>() {
                            Some(ApiError::NotFound(_)) => "Invalid job id specified".to_string(),
                            Some(ApiError::Denied(m) | ApiError::Invalid(m)) => m.clone(),
                            _ => super::describe_error(&e),
                        };
                        eprintln!("{why} for job {job}");
                        failed = true;
                    }
                }
                Ok(i32::from(failed))
            })?
        }
        Command::Hold(ids) => update_jobs(ids, Some(true), None, None),
        Command::Release(ids) => update_jobs(ids, Some(false), None, None),
        Command::Suspend(ids, suspend) => suspend_jobs(ids, suspend),
        Command::Update { job, time_limit_ms, partition } => update_jobs(vec![job], None, time_limit_ms, partition.map(Some)),
        Command::UpdateNodes { nodes, drain } => update_nodes(nodes, drain),
        Command::EditPartition(edit) => edit_partition(edit),
        Command::EditReservation(edit) => super::reservation::send(edit),
        Command::ShowReservation(name) => super::reservation::show(name.as_deref()),
    }
}

/// `scontrol show config`: the answering node's values, and its controllers.
fn show_config() -> Result<i32, SlurmError> {
    let cluster = super::connect(PROG)?;
    let (entries, nodes) = super::block_on(PROG, async {
        let entries = match cluster.call_patiently(ClientRequest::ShowConfig, super::PATIENCE).await {
            Ok(proto::Reply::Config(e)) => e,
            Ok(other) => return Err(SlurmError::fatal(PROG, format!("unexpected reply {other:?}"))),
            Err(e) => return Err(SlurmError::fatal(PROG, super::describe_error(&e))),
        };
        Ok((entries, super::list_nodes(PROG, &cluster).await?))
    })??;
    print!("{}", config_text(entries, &nodes, time::now_ms()));
    Ok(0)
}

/// `scontrol show config` as Slurm 22.05 prints it: a dated head, `Key = value` lines (the key
/// padded to 23), with `SLURM_VERSION` and a `SlurmctldHost[N]` per voter (the leader first),
/// then whether each controller is up: the leader as primary, the other voters as backups.
pub fn config_text(mut entries: Vec<(String, String)>, nodes: &[NodeInfo], now_ms: u64) -> String {
    let mut voters: Vec<&NodeInfo> = nodes.iter().filter(|n| n.role != proto::NodeRole::Agent).collect();
    voters.sort_by_key(|n| (n.role != proto::NodeRole::Leader, n.name.clone()));
    for (i, v) in voters.iter().enumerate() {
        entries.push((format!("SlurmctldHost[{i}]"), format!("{}({})", v.name, host_of(&v.addr))));
    }
    entries.push(("SLURM_VERSION".into(), super::SLURM_VERSION.into()));
    entries.sort_by_key(|(k, _)| k.to_ascii_lowercase());
    let mut out = format!("Configuration data as of {}\n", time::datetime(now_ms));
    for (k, v) in &entries {
        out.push_str(&format!("{k:<23} = {v}\n"));
    }
    out.push('\n');
    for (i, v) in voters.iter().enumerate() {
        let role = if v.role == proto::NodeRole::Leader { "primary".to_string() } else { format!("backup{i}") };
        let up = if v.state == proto::NodeState::Down { "DOWN" } else { "UP" };
        out.push_str(&format!("Slurmctld({role}) at {} is {up}\n", v.name));
    }
    out
}

/// The host of `host:port` (`[v6]:port` too).
fn host_of(addr: &str) -> &str {
    match addr.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => addr.rsplit_once(':').map_or(addr, |(h, _)| h),
    }
}
