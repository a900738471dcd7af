//! How Slurm shows jobs and nodes, where both the CLI (`squeue`, `sinfo`, `scontrol`, `sacct`)
//! and the node (its HTTP API) need it: reason codes, exit codes, node states, GRES text.
//! Pure functions of their arguments.

use std::collections::BTreeMap;

use proto::{Job, JobState, NodeInfo, NodeState};

/// The Slurm release whose commands and formats Corral follows.
pub const SLURM_VERSION: &str = "22.05.8";

/// Slurm's reason codes, which Corral's reasons map onto where one fits.
const SLURM_REASONS: &[&str] = &[
    "None",
    "Priority",
    "Resources",
    "Dependency",
    "DependencyNeverSatisfied",
    "BeginTime",
    "JobHeldUser",
    "JobHeldAdmin",
    "JobArrayTaskLimit",
    "PartitionTimeLimit",
    "PartitionNodeLimit",
    "PartitionDown",
    "PartitionInactive",
    "ReqNodeNotAvail",
    "BadConstraints",
    "NodeDown",
    "Reservation",
    "ReservationDeleted",
    "InvalidAccount",
    "InvalidQOS",
    "AccountNotAllowed",
    "QOSNotAllowed",
    "AssocMaxJobsLimit",
    "AssocGrpJobsLimit",
    "AssocGrpGRES",
    "AssocGrpCpuLimit",
    "AssocGrpMemLimit",
    "AssocGrpNodeLimit",
    "AssocMaxCpuPerJobLimit",
    "AssocMaxMemPerJob",
    "AssocMaxNodePerJobLimit",
    "AssocMaxWallDurationPerJobLimit",
    "AssocMaxGRESPerJob",
    "AssocGrpWallLimit",
    "QOSMaxJobsPerUserLimit",
    "QOSGrpJobsLimit",
    "QOSGrpGRES",
    "QOSGrpCpuLimit",
    "QOSGrpMemLimit",
    "QOSGrpNodeLimit",
    "QOSMaxCpuPerJobLimit",
    "QOSMaxMemoryPerJob",
    "QOSMaxNodePerJobLimit",
    "QOSMaxWallDurationPerJobLimit",
    "QOSMaxGRESPerJob",
    "QOSMaxGRESPerUser",
    "QOSMaxCpuPerUserLimit",
    "QOSMaxMemoryPerUser",
    "QOSMaxNodePerUserLimit",
    "QOSGrpWallLimit",
    "NonZeroExitCode",
    "TimeLimit",
];

/// The reason a pending job waits, as one Slurm reason code (or Corral's own words when no
/// code fits).
pub fn reason_code(job: &Job) -> String {
    if job.spec.hold && job.state == JobState::Pending {
        return "JobHeldUser".into();
    }
    let Some(reason) = job.reason() else {
        return "None".into();
    };
    let first = reason.split_whitespace().next().unwrap_or("");
    if let Some(code) = SLURM_REASONS.iter().find(|c| c.eq_ignore_ascii_case(first.trim_end_matches([':', ',', '.']))) {
        return (*code).to_string();
    }
    let r = reason.to_ascii_lowercase();
    let code = if r.contains("depend") {
        if r.contains("never") || r.contains("cannot") {
            "DependencyNeverSatisfied"
        } else {
            "Dependency"
        }
    } else if r.contains("held") || r.contains("hold") {
        "JobHeldUser"
    } else if r.contains("begin") || r.contains("eligible") {
        "BeginTime"
    } else if r.contains("throttle") || (r.contains("array") && r.contains("limit")) {
        "JobArrayTaskLimit"
    } else if r.contains("priority") || r.contains("behind") || r.contains("queued ahead") {
        "Priority"
    } else if r.contains("partition") {
        "PartitionConfig"
    } else if r.contains("gpu")
        || r.contains("resource")
        || r.contains("free")
        || r.contains("cpu")
        || r.contains("memory")
        || r.contains("node")
    {
        "Resources"
    } else {
        return reason.to_string();
    };
    code.to_string()
}

/// The reason codes whose Corral reason carries, after `CODE: `, the text Slurm keeps as the
/// job's `state_desc` (partition access: `part_policy_valid_acct`/`_qos`; a maintenance
/// reservation in the way: `ReqNodeNotAvail, Reserved for maintenance`).
const DESCRIBED_REASONS: [&str; 3] = ["AccountNotAllowed", "QOSNotAllowed", "ReqNodeNotAvail"];

/// A pending job's reason as `squeue`'s `%r`/`%R` and `scontrol show job` print it: Slurm's
/// description where it keeps one (`Job's account not permitted to use this partition (...)`),
/// else the code ([`reason_code`]).
pub fn reason_shown(job: &Job) -> String {
    state_description(job).unwrap_or_else(|| reason_code(job))
}

/// The description Slurm keeps with a pending job's reason (`state_desc`; the REST API's
/// `state_description`), where it keeps one.
pub fn state_description(job: &Job) -> Option<String> {
    let (code, text) = job.reason()?.split_once(": ")?;
    (DESCRIBED_REASONS.contains(&code) && job.state == JobState::Pending && !job.spec.hold).then(|| text.to_string())
}

/// A pending job's reason as the accounting store shows it (sacct's `Reason`, `sacct --json`):
/// [`reason_code`], except a partition's access lists, which Slurm 22.05.8's slurmdbd recorded
/// as `PartitionConfig` (while squeue showed `AccountNotAllowed`'s description).
pub fn accounting_reason(job: &Job) -> String {
    match reason_code(job).as_str() {
        "AccountNotAllowed" | "QOSNotAllowed" => "PartitionConfig".into(),
        code => code.to_string(),
    }
}

/// `afterok:12,singleton` or `(null)`.
pub fn dependency_text(job: &Job) -> String {
    use proto::DependencyKind::*;
    if job.spec.dependencies.is_empty() {
        return "(null)".into();
    }
    job.spec
        .dependencies
        .iter()
        .map(|d| {
            let kind = match d.kind {
                After => "after",
                AfterOk => "afterok",
                AfterNotOk => "afternotok",
                AfterAny => "afterany",
                Singleton => return "singleton".to_string(),
            };
            format!("{kind}:{}", d.job.unwrap_or(0))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `1,2,3,5` as `1-3,5`.
pub fn task_ranges(tasks: &[u32]) -> String {
    let mut t = tasks.to_vec();
    t.sort_unstable();
    t.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let mut j = i;
        while j + 1 < t.len() && t[j + 1] == t[j] + 1 {
            j += 1;
        }
        out.push(if i == j { t[i].to_string() } else { format!("{}-{}", t[i], t[j]) });
        i = j + 1;
    }
    out.join(",")
}

/// Slurm's `Reason` of a job that left the queue: why it ended where it did not complete.
pub fn final_reason(job: &Job) -> &'static str {
    match (job.state, job.exit_code) {
        (JobState::Timeout, _) => "TimeLimit",
        (JobState::NodeFail, _) => "NodeDown",
        (JobState::OutOfMemory, _) => "OutOfMemory",
        (JobState::Failed, Some(code)) if code != 0 => "NonZeroExitCode",
        (JobState::Failed, _) => "JobLaunchFailure",
        _ => "None",
    }
}

/// A node's state the way sinfo abbreviates it (`idle`, `mix`, `alloc`, `drain`, `drng`,
/// `down*`, `resv`, `maint`) and spells it out (`%T`), from what its jobs hold: `alloc` when all its CPUs, all its
/// memory or all its GPUs are held (Slurm counts CPUs only; a GPU node whose GPUs are all
/// held takes no more GPU work, so Corral says `alloc` there too), `mix` when some of any.
pub fn node_state(n: &NodeInfo) -> (&'static str, &'static str) {
    let gpus_busy = n.gpus_free < n.gpus_total;
    let busy = gpus_busy || n.cpus_alloc > 0 || n.memory_alloc_mib > 0;
    let full = (n.gpus_total > 0 && n.gpus_free == 0)
        || (n.cpus_total > 0 && n.cpus_alloc >= n.cpus_total)
        || (n.memory_mib > 0 && n.memory_alloc_mib >= n.memory_mib);
    match n.state {
        // As Slurm's `node_state_string`: a maintenance reservation shows over all but a drain;
        // another shows only on an idle node.
        NodeState::Up | NodeState::Down if n.maint => ("maint", "maint"),
        NodeState::Up if n.reserved && !busy => ("resv", "reserved"),
        NodeState::Down if n.reason.as_deref().is_some_and(|r| r.contains("drain")) => ("drain*", "drained*"),
        NodeState::Down => ("down*", "down*"),
        NodeState::Drained if busy => ("drng", "draining"),
        NodeState::Drained => ("drain", "drained"),
        NodeState::Up if full => ("alloc", "allocated"),
        NodeState::Up if busy => ("mix", "mixed"),
        NodeState::Up => ("idle", "idle"),
    }
}

/// GRES as sinfo prints it: `gpu:h100:8`, `gpu:8`, `(null)`.
pub fn gres_text(n: &NodeInfo) -> String {
    match (n.gpus_total, n.gpu_types.as_slice()) {
        (0, _) => "(null)".into(),
        (total, [one]) => format!("gpu:{one}:{total}"),
        (total, []) => format!("gpu:{total}"),
        (total, many) => format!("gpu:{}:{total}", many.join("+")),
    }
}

/// Seconds a job has run (so far, or in total), its suspensions not counted (Slurm's TimeUsed).
pub fn run_seconds(job: &Job, now_ms: u64) -> u64 {
    match job.state {
        JobState::Running => job.run_time_ms_at(now_ms) / 1000,
        st if st.is_final() && job.end_ms.is_some() => job.run_time_ms_at(now_ms) / 1000,
        _ => 0,
    }
}

/// When the job became eligible to run (Slurm's `EligibleTime`, sacct's `Eligible`): its
/// `--begin` or its submission, whichever is later. `None` (Slurm's 0, printed `Unknown`) while
/// it cannot run yet: held, before its begin time, or waiting on a dependency; and for a job
/// that ended before that time came.
pub fn eligible_ms(job: &Job, now_ms: u64) -> Option<u64> {
    let at = job.spec.begin_ms.unwrap_or(job.submit_ms).max(job.submit_ms);
    if let Some(start) = job.start_ms {
        return Some(at.min(start));
    }
    match job.state {
        JobState::Pending => {
            let waits = matches!(
                reason_code(job).as_str(),
                "Dependency" | "DependencyNeverSatisfied" | "BeginTime" | "JobHeldUser" | "JobHeldAdmin"
            );
            (at <= now_ms && !waits).then_some(at)
        }
        _ => job.end_ms.filter(|end| at <= *end).map(|_| at),
    }
}

/// When the job ends or ended (Slurm's `EndTime`): a running job's end by its time limit, its
/// suspensions added (`None` without a limit), a finished job's end, `None` before it started.
pub fn end_ms(job: &Job, now_ms: u64) -> Option<u64> {
    match job.state {
        JobState::Running => {
            let start = job.start_ms?;
            let limit = job.spec.time_limit_ms?;
            Some(start.saturating_add(limit).saturating_add(job.suspension.paused_ms_at(now_ms)))
        }
        st if st.is_final() => job.end_ms,
        _ => None,
    }
}

/// Slurm's `convert_num_unit` (divisor 1024) of `num` kept in unit `orig` (0 none, 1 K, 2 M, 3 G,
/// 4 T, 5 P): to unit `spec` when given, else, with `exact`, up while the value stays exact
/// (`CONVERT_NUM_UNIT_EXACT`: half units count, so 1536M is `1.50G`), else not at all
/// (`CONVERT_NUM_UNIT_NO`). Two decimals unless whole; a unit past P is `?`.
pub fn convert_num_unit(num: u64, orig: u32, spec: Option<u32>, exact: bool) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    if num == 0 {
        return "0".into();
    }
    let (mut v, mut unit) = (num as f64, i64::from(orig));
    if let Some(spec) = spec {
        while i64::from(spec) < unit {
            v *= 1024.0;
            unit -= 1;
        }
        while i64::from(spec) > unit {
            v /= 1024.0;
            unit += 1;
        }
    } else if exact {
        while v >= 1024.0 && (v as u64).is_multiple_of(512) {
            v /= 1024.0;
            unit += 1;
        }
    }
    let suffix = usize::try_from(unit).ok().and_then(|u| UNITS.get(u)).copied().unwrap_or("?");
    if (v as u64) as f64 == v {
        format!("{}{suffix}", v as u64)
    } else {
        format!("{v:.2}{suffix}")
    }
}

/// Names of the nodes a job runs on (or last ran on), in allocation order.
pub fn job_node_names(job: &Job, names: &BTreeMap<u64, String>) -> Vec<String> {
    job.run_nodes().iter().map(|id| names.get(id).cloned().unwrap_or_else(|| format!("node{id}"))).collect()
}

/// Slurm's `SystemComment` of a job (`sacct -o SystemComment`, `scontrol show job`, the JSON's
/// `comment.system`): one line per repair of a lost rank onto a spare node (`--spare-nodes`),
/// oldest first, joined by newlines as slurmctld appends its system comment's lines, for example
/// `run 1 rank 1 moved from n3 to spare n4 at 2026-12-06T11:32:40 (node n3 down: no heartbeat
/// for 3086 ms)`; `None` for a job never repaired. Bounded: the state keeps a job's last
/// [`proto::REPAIRS_KEPT`] repairs, each reason at most [`proto::REPAIR_REASON_BYTES_MAX`] bytes.
/// `datetime` prints a time as the command prints its dates (local, `SLURM_TIME_FORMAT`).
pub fn system_comment(job: &Job, names: &BTreeMap<u64, String>, datetime: &dyn Fn(u64) -> String) -> Option<String> {
    let name = |id: &u64| names.get(id).cloned().unwrap_or_else(|| format!("node{id}"));
    let lines: Vec<String> = job
        .repairs
        .iter()
        .map(|r| {
            format!(
                "run {} rank {} moved from {} to spare {} at {} ({})",
                r.run,
                r.rank,
                name(&r.lost),
                name(&r.spare),
                datetime(r.at_ms),
                r.reason
            )
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// Slurm's `ExitCode` (`sacct`, `scontrol show job`): `code:signal`. A job stopped for its time
/// or by a cancel shows SIGTERM; one the kernel killed for its memory limit 125 (Slurm's
/// `SIG_OOM`). One whose process a signal killed shows `0:SIGNAL`, as Slurm does (the state
/// keeps the shell's `128 + SIGNAL` as its exit code; the run's outcome says it was a signal).
pub fn exit_code_text(job: &Job) -> String {
    if let Some(signal) = killed_by_signal(job) {
        return format!("0:{signal}");
    }
    match (job.state, job.exit_code) {
        (_, Some(code)) if code >= 0 => format!("{code}:0"),
        (_, Some(code)) => format!("0:{}", code.unsigned_abs()),
        (JobState::Timeout | JobState::Cancelled, None) => "0:15".into(),
        (JobState::OutOfMemory, None) => "0:125".into(),
        _ => "0:0".into(),
    }
}

/// The signal that killed a failed job's process, from its last run's outcomes (or, for a
/// record that kept only its reason, the reason the cluster wrote: "killed by signal N").
fn killed_by_signal(job: &Job) -> Option<i32> {
    if job.state != JobState::Failed {
        return None;
    }
    let signal = job
        .outcomes
        .iter()
        .find_map(|(_, o)| match o {
            proto::RunOutcome::Signaled(sig) => Some(*sig),
            _ => None,
        })
        .or_else(|| job.reasons.iter().find_map(|r| r.strip_prefix("killed by signal ").and_then(|n| n.trim().parse().ok())))?;
    // Only where the cluster recorded it as such (a later non-zero exit is not a signal).
    (job.exit_code == Some(signal.saturating_add(128))).then_some(signal)
}
