//! What `sacct` shows of a job besides its own line: the lines of its steps (`ID.batch`,
//! `ID.extern`, `ID.N`), and `sacct --json`'s job objects in Slurm 22.05's `dbv0.0.38` shape.
//!
//! The JSON follows Slurm's own source at tag `slurm-22-05-8-1` (unchanged up to 22.05.11):
//! `src/plugins/openapi/dbv0.0.38/parse.c` (`parse_job`, `parse_job_step`, `_foreach_step` and
//! the `_dump_*` functions of each field's type) and `src/sacct/data.c` (`sacct --json` runs that
//! plugin's `/slurmdb/v0.0.38/jobs/` handler in-process and prints its reply). Every key Slurm
//! prints is printed; where Corral keeps no value, the value is the one Slurm's dumper prints for
//! the database's "not set": `null` for a NULL string or a NO_VAL/INFINITE number, `0` for a
//! counter the database left at 0 (CPU times, energy, CPU frequency), `[]` for an empty TRES
//! string. Pure functions of their arguments.

use std::collections::BTreeMap;

use proto::{Job, JobState, StepRecord};
use serde_json::{json, Map, Value};

use crate::env::DEFAULT_PARTITION;
use crate::hostlist;
use crate::openapi;
use crate::show;

/// One of the step lines sacct shows under a job's own line.
#[derive(Clone, Copy, Debug)]
pub enum StepKind<'a> {
    /// `ID.batch`: the batch script, on the job's first node.
    Batch,
    /// `ID.extern`: Slurm (with `PrologFlags=Contain`) keeps this step on each node of a job
    /// from its start to its end, to hold the processes it adopts. In Corral it stands for the
    /// job's allocation on its nodes; no processes are adopted into it. It has the job's nodes,
    /// CPUs, TRES, start and end; its exit code is `0:0`; it is RUNNING while the job runs,
    /// CANCELLED when the job ended by NODE_FAIL, COMPLETED once the job ended otherwise (as
    /// Slurm's extern step, whose only process is its sleeping holder).
    Extern,
    /// `ID.N`: a step (`srun` in the allocation) as the log recorded it.
    Step(&'a StepRecord),
}

/// The step lines of `job`, in sacct's order: its batch script and its extern step once it
/// started (an `srun` or `salloc` allocation has no script of the user's, nor in Slurm), then
/// its steps.
pub fn step_kinds(job: &Job) -> Vec<StepKind<'_>> {
    let mut out = Vec::new();
    if job.start_ms.is_some() {
        if job.spec.is_batch() && !job.spec.is_srun_allocation() {
            out.push(StepKind::Batch);
        }
        out.push(StepKind::Extern);
    }
    out.extend(job.steps.iter().map(StepKind::Step));
    out
}

/// What a step line shows: its own nodes, CPUs, times, state and exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepView {
    /// `batch`, `extern` or the step's number.
    pub id: String,
    pub name: String,
    pub nodes: Vec<String>,
    pub tasks: u64,
    pub cpus: u64,
    pub start_ms: u64,
    pub end_ms: Option<u64>,
    pub state: &'static str,
    /// Slurm's `code:signal`.
    pub exit_code: String,
}

/// The CPUs a job holds (sacct's AllocCPUS of its own line once it started), on the nodes it
/// got ([`Job::node_count`]: a job of `-N MIN-MAX` got some number of its range).
pub fn job_cpus(job: &Job) -> u64 {
    let s = &job.spec;
    u64::from(s.cpus_per_task) * u64::from(s.ntasks_per_node) * u64::from(job.node_count())
}

/// The line of `kind` of `job`; `names` gives node names by id.
pub fn step_view(job: &Job, kind: StepKind<'_>, names: &BTreeMap<u64, String>) -> StepView {
    let spec = &job.spec;
    let start_ms = job.start_ms.unwrap_or(0);
    match kind {
        StepKind::Batch => StepView {
            id: "batch".into(),
            name: "batch".into(),
            nodes: show::job_node_names(job, names).into_iter().take(1).collect(),
            tasks: 1,
            cpus: u64::from(spec.cpus_per_task) * u64::from(spec.ntasks_per_node),
            start_ms,
            end_ms: job.end_ms,
            state: job.state_name(),
            exit_code: show::exit_code_text(job),
        },
        StepKind::Extern => {
            let nodes = show::job_node_names(job, names);
            let ended = job.state.is_final();
            StepView {
                id: "extern".into(),
                name: "extern".into(),
                tasks: nodes.len() as u64,
                nodes,
                cpus: job_cpus(job),
                start_ms,
                end_ms: job.end_ms.filter(|_| ended),
                state: match job.state {
                    JobState::NodeFail => "CANCELLED",
                    _ if ended => "COMPLETED",
                    _ => "RUNNING",
                },
                exit_code: "0:0".into(),
            }
        }
        StepKind::Step(s) => StepView {
            id: s.step.to_string(),
            name: s.name.clone(),
            nodes: s.nodes.clone(),
            tasks: u64::from(s.ntasks),
            cpus: u64::from(spec.cpus_per_task) * u64::from(s.ntasks),
            start_ms: s.start_ms,
            // A step the job's end cut short ends with it.
            end_ms: s.end_ms.or(job.end_ms.filter(|_| job.state.is_final())),
            state: s.state_name(job),
            exit_code: format!("{}:{}", if s.signal.is_some() { 0 } else { s.exit_code.max(0) }, s.signal.unwrap_or(0)),
        },
    }
}

/// A wait status (`code << 8 | signal`) as `code:signal`, as sacct and scontrol print one:
/// `0:SIGNAL` when a signal ended it (`WIFSIGNALED` is tested first), else `CODE:0`.
pub fn status_text(status: u64) -> String {
    let signal = status & 0x7f;
    if signal != 0 && signal != 0x7f {
        format!("0:{signal}")
    } else {
        format!("{}:0", (status >> 8) & 0xff)
    }
}

/// The job's derived exit code as a wait status: the highest of its steps' (the `srun`s in it,
/// not its batch script or its extern step), as slurmctld keeps it (`step_mgr.c`:
/// "Derived exit code is the highest exit code of srun steps"); 0 without steps.
pub fn derived_status(job: &Job) -> u64 {
    let none = BTreeMap::new();
    job.steps.iter().map(|s| openapi::wait_status(&step_view(job, StepKind::Step(s), &none).exit_code)).max().unwrap_or(0)
}

/// `sacct --json`'s reply: the `meta`/`errors` envelope of every `--json` output around `jobs`.
pub fn db_jobs(jobs: Vec<Value>) -> Value {
    openapi::envelope(openapi::Version::V0038, "jobs", jobs)
}

/// `{"status": ..., "return_code": ...}` from a wait status, as `_dump_job_exit_code` writes it.
/// Slurm 22.05 tests `WIFEXITED` first, which holds for every normal exit whatever its code,
/// so an exit of 3 prints `SUCCESS` with `return_code` 0 there too; a signal prints `SIGNALED`,
/// a `null` return code and the signal's number and `strsignal` name.
pub fn exit_code_json(status: u64) -> Value {
    let signal = status & 0x7f;
    if signal == 0 {
        json!({"status": "SUCCESS", "return_code": 0})
    } else {
        json!({"status": "SIGNALED", "return_code": null, "signal": {"signal_id": signal, "name": signal_name(signal)}})
    }
}

/// glibc's `strsignal` text of Linux's signals.
fn signal_name(signal: u64) -> String {
    let known = match signal {
        1 => "Hangup",
        2 => "Interrupt",
        3 => "Quit",
        4 => "Illegal instruction",
        5 => "Trace/breakpoint trap",
        6 => "Aborted",
        7 => "Bus error",
        8 => "Floating point exception",
        9 => "Killed",
        10 => "User defined signal 1",
        11 => "Segmentation fault",
        12 => "User defined signal 2",
        13 => "Broken pipe",
        14 => "Alarm clock",
        15 => "Terminated",
        24 => "CPU time limit exceeded",
        25 => "File size limit exceeded",
        _ => return format!("Unknown signal {signal}"),
    };
    known.to_string()
}

/// TRES ids as slurmdbd numbers them (`TRES_CPU` = 1, `TRES_MEM`, `TRES_ENERGY`, `TRES_NODE`,
/// `TRES_BILLING` in `src/common/slurmdb_defs.h`); `gres/gpu` gets the first id of the TRES it
/// adds (`TRES_OFFSET` + 1).
const TRES_CPU: u64 = 1;
const TRES_MEM: u64 = 2;
const TRES_NODE: u64 = 4;
const TRES_BILLING: u64 = 5;
const TRES_GRES_GPU: u64 = 1001;
/// `gres/shard`'s id where it is tracked after `gres/gpu` (`AccountingStorageTRES=gres/gpu,gres/shard`).
const TRES_GRES_SHARD: u64 = 1002;

/// A TRES list as `_dump_tres_list` prints one, in id order as the database's TRES strings
/// are: built-in TRES have no name (`null`), GRES are `gres` named by kind. A zero count is
/// left out, as in Slurm's TRES strings.
fn tres_list(cpus: u64, mem_mib: u64, nodes: u64, billing: Option<u64>, gres: (&str, u64)) -> Value {
    let item = |kind: &str, name: Option<&str>, id: u64, count: u64| json!({"type": kind, "name": name, "id": id, "count": count});
    let mut out = vec![item("cpu", None, TRES_CPU, cpus)];
    if mem_mib > 0 {
        out.push(item("mem", None, TRES_MEM, mem_mib));
    }
    out.push(item("node", None, TRES_NODE, nodes));
    if let Some(b) = billing {
        out.push(item("billing", None, TRES_BILLING, b));
    }
    if gres.1 > 0 {
        let id = if gres.0 == "shard" { TRES_GRES_SHARD } else { TRES_GRES_GPU };
        out.push(item("gres", Some(gres.0), id, gres.1));
    }
    Value::Array(out)
}

/// The job's TRES: what it asked for, which is what it holds once it started.
fn job_tres(job: &Job) -> Value {
    let s = &job.spec;
    let nodes = u64::from(job.node_count());
    let cpus = job_cpus(job);
    tres_list(cpus, s.mem_mib.saturating_mul(nodes), nodes, Some(cpus), step_gres(job, nodes))
}

/// The GRES (its TRES name and count) a step line counts on its `nodes` nodes: the job's
/// there, as slurmctld gives a batch script the GRES of its node and a step that asks none all
/// of the job's on its nodes (Corral keeps no step's own GPU count, as it keeps none of its
/// memory: its memory is the job's there too).
pub fn step_gres(job: &Job, nodes: u64) -> (&'static str, u64) {
    let (gres, per_node) = job.spec.gres_per_node();
    (gres, u64::from(per_node).saturating_mul(nodes))
}

/// `{"seconds": 0, "microseconds": 0}`: CPU time Corral does not record (Slurm's database
/// columns default to 0).
fn cpu_time_unknown() -> Value {
    json!({"seconds": 0, "microseconds": 0})
}

fn secs(ms: u64) -> u64 {
    ms / 1000
}

/// One job as `sacct --json` prints it (`dbv0.0.38_job`), with its steps unless `with_steps`
/// is false (`-X`, the query's `skip_steps`). `now_ms` is the time a running job's elapsed
/// time is counted to.
///
/// Corral keeps no value, and the JSON has Slurm's "not set", for: the comments but the job's
/// own (`null`), `flags` (`[]`: Corral does not record Slurm's STARTED_ON_* ways of starting),
/// `het` (`job_id` 0, `job_offset` NO_VAL so `null`), `kill_request_user` (`null`), `mcs`
/// (`""`), `priority` (0), `reservation` (0: Slurm dumps the name's pointer as a number, 0 when
/// there is none), `wckey` (`""`), the CPU times
/// `time.system`, `time.user` and `time.total` (0) and `state.reason` of a job that ended
/// normally (`None`).
pub fn db_job(job: &Job, names: &BTreeMap<u64, String>, now_ms: u64, with_steps: bool) -> Value {
    let spec = &job.spec;
    let started = job.start_ms.is_some();
    let nodes = show::job_node_names(job, names);
    let array = job.array.as_ref();
    let end = job.end_ms.filter(|_| job.state.is_final()).map_or(0, secs);
    let mut out = Map::new();
    let mut put = |k: &str, v: Value| {
        out.insert(k.to_string(), v);
    };
    put("account", json!(spec.account.clone().unwrap_or_default()));
    put("comment", json!({"administrator": null, "job": spec.extra.get("comment"), "system": null}));
    put("allocation_nodes", json!(if started { nodes.len() } else { 0 }));
    put(
        "array",
        json!({
            "job_id": array.map_or(0, |a| a.array_job),
            "limits": {"max": {"running": {"tasks": spec.array.as_ref().and_then(|a| a.throttle).unwrap_or(0)}}},
            "task": null,
            "task_id": array.map(|a| a.task),
        }),
    );
    put(
        "time",
        json!({
            "elapsed": show::run_seconds(job, now_ms),
            "eligible": show::eligible_ms(job, now_ms).map_or(0, secs),
            "end": end,
            "start": job.start_ms.map_or(0, secs),
            "submission": secs(job.submit_ms),
            "suspended": secs(job.suspension.paused_ms_at(job.end_ms.unwrap_or(now_ms))),
            "system": cpu_time_unknown(),
            "total": cpu_time_unknown(),
            "user": cpu_time_unknown(),
            "limit": spec.time_limit_ms.map(|ms| ms / 60_000),
        }),
    );
    put(
        "association",
        json!({"account": spec.account.clone().unwrap_or_default(), "cluster": openapi::CLUSTER, "partition": null, "user": spec.user}),
    );
    put("cluster", json!(openapi::CLUSTER));
    put("constraints", json!(spec.constraint.join("&")));
    put("container", json!(""));
    put("derived_exit_code", exit_code_json(derived_status(job)));
    put("exit_code", exit_code_json(openapi::raw_exit_code(job)));
    put("flags", json!([]));
    put("group", json!(spec.gid.map(|g| g.to_string())));
    put("het", json!({"job_id": 0, "job_offset": null}));
    put("job_id", json!(job.id));
    put("name", json!(spec.name));
    put("mcs", json!({"label": ""}));
    put("nodes", json!(if nodes.is_empty() { "None assigned".to_string() } else { hostlist::compress(&nodes) }));
    put("partition", json!(spec.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.into())));
    put("priority", json!(0));
    put("qos", json!(spec.qos.clone().unwrap_or_else(|| "normal".into())));
    put("required", json!({"CPUs": job_cpus(job), "memory": spec.mem_mib}));
    put("kill_request_user", Value::Null);
    put("reservation", json!({"id": 0, "name": 0}));
    let reason = if job.state == JobState::Pending { show::accounting_reason(job) } else { show::final_reason(job).to_string() };
    put("state", json!({"current": job.state_name(), "reason": reason}));
    let steps: Vec<Value> =
        if with_steps { step_kinds(job).into_iter().map(|k| db_step(job, k, names, now_ms)).collect() } else { Vec::new() };
    put("steps", Value::Array(steps));
    put("tres", json!({"allocated": if started { job_tres(job) } else { json!([]) }, "requested": job_tres(job)}));
    put("user", json!(spec.user));
    put("wckey", json!({"wckey": "", "flags": []}));
    put("working_directory", json!(spec.workdir));
    Value::Object(out)
}

/// `CPU.governor` of a step that asked for none: Slurm stores NO_VAL there and its flag dumper
/// tests each governor's bits against it, so every governor is listed.
const GOVERNORS_OF_NO_VAL: [&str; 5] = ["Conservative", "Performance", "PowerSave", "OnDemand", "UserSpace"];

/// One step as `sacct --json` prints it (`dbv0.0.38_job_step`, with `nodes.list` that
/// `_foreach_step` adds). Corral records no usage of a step once it ended, so `tres.requested`
/// and `tres.consumed` are empty lists, the CPU times, `statistics.CPU.actual_frequency` and
/// `statistics.energy.consumed` 0, as Slurm's database has them with no gatherer; the
/// requested CPU frequency is NO_VAL (`null`), `pid` and `kill_request_user` `null`.
pub fn db_step(job: &Job, kind: StepKind<'_>, names: &BTreeMap<u64, String>, now_ms: u64) -> Value {
    let v = step_view(job, kind, names);
    let end = v.end_ms.map_or(0, secs);
    let elapsed = secs(v.end_ms.unwrap_or(now_ms).saturating_sub(v.start_ms));
    let nnodes = v.nodes.len() as u64;
    let tres = match kind {
        StepKind::Extern => job_tres(job),
        _ => tres_list(v.cpus, job.spec.mem_mib.saturating_mul(nnodes), nnodes, None, step_gres(job, nnodes)),
    };
    let usage = json!({"average": [], "max": [], "min": [], "total": []});
    let step_id = match kind {
        StepKind::Step(s) => json!(s.step),
        _ => json!(v.id),
    };
    let mut nodes = json!({"count": nnodes, "range": hostlist::compress(&v.nodes)});
    if !v.nodes.is_empty() {
        nodes["list"] = json!(v.nodes);
    }
    json!({
        "time": {
            "elapsed": elapsed,
            "end": end,
            "start": secs(v.start_ms),
            "suspended": 0,
            "system": cpu_time_unknown(),
            "total": cpu_time_unknown(),
            "user": cpu_time_unknown(),
        },
        "exit_code": exit_code_json(openapi::wait_status(&v.exit_code)),
        "nodes": nodes,
        "tasks": {"count": v.tasks},
        "pid": null,
        "CPU": {"requested_frequency": {"min": null, "max": null}, "governor": GOVERNORS_OF_NO_VAL},
        "kill_request_user": null,
        "state": v.state,
        "statistics": {"CPU": {"actual_frequency": 0}, "energy": {"consumed": 0}},
        "step": {"job_id": job.id, "het": {"component": null}, "id": step_id, "name": v.name},
        "task": {"distribution": step_distribution(kind, v.tasks, v.nodes.len() as u64)},
        "tres": {"requested": usage.clone(), "consumed": usage, "allocated": tres},
    })
}

/// A step's task distribution as sacct shows it: srun's default, cyclic while there are no
/// more tasks than nodes, else block; `Unknown` for the batch and extern steps.
pub fn step_distribution(kind: StepKind<'_>, tasks: u64, nodes: u64) -> &'static str {
    match kind {
        StepKind::Step(_) if tasks > nodes => "Block",
        StepKind::Step(_) => "Cyclic",
        _ => "Unknown",
    }
}
