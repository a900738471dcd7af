//! `squeue --json`, `sinfo --json` and the HTTP API: Slurm 22.05's JSON, the shape its `openapi/v0.0.38`
//! plugin prints (and slurmrestd serves), read from `../shared/peers/slurm`: every key Slurm
//! prints, with Corral's values where it has them and Slurm's own "not set" (`""`, `0`, `null`)
//! where it has none. Pure functions of their arguments.

use std::collections::BTreeMap;

use proto::{Job, JobState, NodeInfo};
use serde_json::{json, Map, Value};

use crate::env::DEFAULT_PARTITION;
use crate::hostlist;
use crate::show;

/// An OpenAPI version of Slurm 22.05's: its JSON differs only in which keys a job has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V0037,
    V0038,
}

impl Version {
    /// As in the API's paths (`/slurm/v0.0.38/jobs`).
    pub fn name(self) -> &'static str {
        match self {
            Version::V0037 => "v0.0.37",
            Version::V0038 => "v0.0.38",
        }
    }

    /// Keys of a job this version does not have.
    fn job_keys_absent(self) -> &'static [&'static str] {
        match self {
            Version::V0037 => &["container", "group_name", "prefer"],
            Version::V0038 => &[],
        }
    }
}

/// `{"meta": ..., "errors": [], KEY: items}`, as every `--json` output and API reply starts.
pub fn envelope(version: Version, key: &str, items: Vec<Value>) -> Value {
    let (major, minor, micro) = version_parts(show::SLURM_VERSION);
    let mut out = Map::new();
    out.insert(
        "meta".into(),
        json!({
            "plugin": {"type": format!("openapi/{}", version.name()), "name": format!("Slurm OpenAPI {}", version.name())},
            "Slurm": {"version": {"major": major, "micro": micro, "minor": minor}, "release": show::SLURM_VERSION},
        }),
    );
    out.insert("errors".into(), json!([]));
    out.insert(key.into(), Value::Array(items));
    Value::Object(out)
}

/// `22.05.8` as (22, 5, 8).
fn version_parts(release: &str) -> (u64, u64, u64) {
    let mut parts = release.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

fn secs(ms: u64) -> u64 {
    ms / 1000
}

fn or_null<T: Into<Value>>(v: Option<T>) -> Value {
    v.map_or(Value::Null, Into::into)
}

/// The cluster name Corral's JSON gives (Slurm's `ClusterName`).
pub const CLUSTER: &str = "corral";

/// The wait status Slurm keeps as a job's `exit_code` (`code << 8 | signal`), from its
/// `code:signal` text.
pub fn raw_exit_code(job: &Job) -> u64 {
    wait_status(&show::exit_code_text(job))
}

/// The wait status (`code << 8 | signal`) of a `code:signal` text.
pub fn wait_status(text: &str) -> u64 {
    let (code, signal) = text.split_once(':').unwrap_or(("0", "0"));
    (code.parse::<u64>().unwrap_or(0) & 0xff) << 8 | (signal.parse::<u64>().unwrap_or(0) & 0x7f)
}

/// One job as `squeue --json` prints it (`version`'s keys); `names` gives node names by id.
pub fn job(version: Version, job: &Job, names: &BTreeMap<u64, String>) -> Value {
    let mut out = Map::new();
    job_identity(job, &mut out);
    job_request(job, &mut out);
    job_times(job, &mut out);
    job_placement(job, names, &mut out);
    for key in version.job_keys_absent() {
        out.remove(*key);
    }
    Value::Object(out)
}

fn job_identity(job: &Job, out: &mut Map<String, Value>) {
    let spec = &job.spec;
    let array = job.array.as_ref();
    let text = |k: &str, v: String| (k.to_string(), Value::String(v));
    out.extend([
        text("account", spec.account.clone().unwrap_or_default()),
        text("admin_comment", String::new()),
        ("array_job_id".into(), json!(array.map_or(0, |a| a.array_job))),
        ("array_task_id".into(), or_null(array.map(|a| a.task))),
        ("array_max_tasks".into(), json!(spec.array.as_ref().and_then(|a| a.throttle).unwrap_or(0))),
        text("array_task_string", String::new()),
        ("association_id".into(), json!(0)),
        ("batch_flag".into(), json!(spec.is_batch())),
        text("cluster", CLUSTER.into()),
        text("command", if spec.is_batch() { String::new() } else { spec.argv.join(" ") }),
        text("comment", spec.extra.get("comment").cloned().unwrap_or_default()),
        text("container", String::new()),
        ("derived_exit_code".into(), json!(0)),
        ("exit_code".into(), json!(raw_exit_code(job))),
        ("group_id".into(), json!(spec.gid.unwrap_or(0))),
        text("group_name", spec.gid.map_or_else(String::new, |g| g.to_string())),
        ("job_id".into(), json!(job.id)),
        text("job_state", job.state_name().into()),
        text("name", spec.name.clone()),
        ("nice".into(), if spec.nice() == 0 { Value::Null } else { json!(spec.nice()) }),
        text("partition", spec.partition.clone().unwrap_or_else(|| DEFAULT_PARTITION.into())),
        ("priority".into(), json!(0)),
        text("qos", spec.qos.clone().unwrap_or_default()),
        ("requeue".into(), json!(spec.requeue)),
        ("restart_cnt".into(), json!(job.restart_count)),
        ("show_flags".into(), json!(["SHOW_ALL", "SHOW_DETAIL", "SHOW_LOCAL"])),
        text("state_description", show::state_description(job).unwrap_or_default()),
        text("state_reason", if job.state == JobState::Pending { show::reason_code(job) } else { show::final_reason(job).into() }),
        text("standard_error", spec.error.clone().unwrap_or_default()),
        text("standard_input", "/dev/null".into()),
        text("standard_output", spec.output.clone().unwrap_or_default()),
        ("user_id".into(), json!(spec.uid.unwrap_or(0))),
        text("user_name", spec.user.clone()),
        text("current_working_directory", spec.workdir.clone()),
        ("flags".into(), json!([])),
    ]);
    for key in [
        "batch_features",
        "burst_buffer",
        "burst_buffer_state",
        "cluster_features",
        "federation_origin",
        "federation_siblings_active",
        "federation_siblings_viable",
        "het_job_id_set",
        "licenses",
        "mcs_label",
        "prefer",
        "resv_name",
        "system_comment",
        "wckey",
    ] {
        out.insert(key.into(), json!(""));
    }
    for key in ["het_job_id", "het_job_offset"] {
        out.insert(key.into(), json!(0));
    }
}

fn job_request(job: &Job, out: &mut Map<String, Value>) {
    let spec = &job.spec;
    // The nodes it got once it started (a job of `-N MIN-MAX`: some number of its range).
    let nodes = job.node_count();
    let cpus = u64::from(spec.cpus_per_task) * u64::from(spec.ntasks_per_node) * u64::from(nodes);
    let mut req = vec![format!("cpu={cpus}")];
    if spec.mem_mib > 0 {
        req.push(format!("mem={}M", spec.mem_mib * u64::from(nodes)));
    }
    req.push(format!("node={nodes}"));
    req.push(format!("billing={cpus}"));
    if let Some(g) = &spec.gres {
        req.push(format!("gres/{}={}", g.kind.as_str(), u64::from(g.count) * u64::from(nodes)));
    }
    let req = req.join(",");
    let running_or_done = job.start_ms.is_some() && job.state != JobState::Pending;
    out.extend([
        ("billable_tres".to_string(), json!(cpus as f64)),
        ("contiguous".into(), json!(false)),
        ("cpus".into(), json!(cpus)),
        ("cpus_per_task".into(), if spec.cpus_per_task > 1 { json!(spec.cpus_per_task) } else { Value::Null }),
        ("dependency".into(), json!(if spec.dependencies.is_empty() { String::new() } else { show::dependency_text(job) })),
        ("excluded_nodes".into(), json!(hostlist::compress(&spec.exclude))),
        ("features".into(), json!(spec.constraint.join("&"))),
        ("max_cpus".into(), json!(0)),
        ("max_nodes".into(), json!(if spec.nodes_max() > spec.nodes { spec.nodes_max() } else { 0 })),
        ("memory_per_cpu".into(), Value::Null),
        ("memory_per_node".into(), if spec.mem_mib > 0 { json!(spec.mem_mib) } else { Value::Null }),
        ("minimum_cpus_per_node".into(), json!(u64::from(spec.cpus_per_task) * u64::from(spec.ntasks_per_node))),
        ("minimum_tmp_disk_per_node".into(), json!(0)),
        ("node_count".into(), json!(nodes)),
        ("reboot".into(), json!(false)),
        ("required_nodes".into(), json!(hostlist::compress(&spec.nodelist))),
        ("shared".into(), if spec.exclusive { json!("none") } else { Value::Null }),
        ("tasks".into(), json!(u64::from(spec.ntasks_per_node) * u64::from(nodes))),
        ("tasks_per_node".into(), json!(spec.ntasks_per_node)),
        ("tasks_per_board".into(), json!(0)),
        ("time_minimum".into(), json!(0)),
        ("tres_per_node".into(), json!(spec.gres.as_ref().map_or_else(String::new, |g| format!("gres:{g}")))),
        ("tres_req_str".into(), json!(req)),
        ("tres_alloc_str".into(), json!(if running_or_done { req.clone() } else { String::new() })),
        ("sockets_per_board".into(), json!(0)),
        ("delay_boot".into(), json!(0)),
    ]);
    for key in [
        "core_spec",
        "thread_spec",
        "cores_per_socket",
        "cpu_frequency_minimum",
        "cpu_frequency_maximum",
        "cpu_frequency_governor",
        "tasks_per_core",
        "tasks_per_socket",
        "profile",
        "sockets_per_node",
        "threads_per_core",
    ] {
        out.insert(key.into(), Value::Null);
    }
    for key in ["cpus_per_tres", "memory_per_tres", "tres_bind", "tres_freq", "tres_per_job", "tres_per_socket", "tres_per_task"] {
        out.insert(key.into(), json!(""));
    }
}

fn job_times(job: &Job, out: &mut Map<String, Value>) {
    let spec = &job.spec;
    let submit = secs(job.submit_ms);
    let start = job.start_ms.map_or(0, secs);
    // A running job's end is when its time limit would end it, as Slurm shows it.
    let end = match (job.end_ms, job.start_ms, spec.time_limit_ms) {
        (Some(end), _, _) => secs(end),
        (None, Some(start), Some(limit)) if job.state == JobState::Running => secs(start + limit),
        _ => 0,
    };
    out.extend([
        ("accrue_time".to_string(), json!(submit)),
        ("deadline".into(), json!(0)),
        ("eligible_time".into(), json!(secs(spec.begin_ms.unwrap_or(job.submit_ms).max(job.submit_ms)))),
        ("end_time".into(), json!(end)),
        ("last_sched_evaluation".into(), json!(submit)),
        ("preempt_time".into(), json!(0)),
        ("pre_sus_time".into(), json!(0)),
        ("resize_time".into(), json!(0)),
        ("start_time".into(), json!(start)),
        ("submit_time".into(), json!(submit)),
        ("suspend_time".into(), json!(0)),
        ("time_limit".into(), or_null(spec.time_limit_ms.map(|ms| ms / 60_000))),
    ]);
}

fn job_placement(job: &Job, names: &BTreeMap<u64, String>, out: &mut Map<String, Value>) {
    let nodes = show::job_node_names(job, names);
    let nodelist = hostlist::compress(&nodes);
    let spec = &job.spec;
    let placed = !nodes.is_empty() && job.state != JobState::Pending;
    let gres_detail: Vec<String> = match (&spec.gres, placed) {
        (Some(g), true) => {
            (if job.parts.is_empty() { job.last_gpus.clone() } else { job.parts.iter().map(|p| p.alloc.gpus.clone()).collect() })
                .iter()
                .map(|slots| {
                    let kind = g.gpu_type.as_ref().map_or_else(|| g.kind.as_str().to_string(), |t| format!("{}:{t}", g.kind.as_str()));
                    let gpus: Vec<u32> = slots.iter().map(|&s| proto::slot::decode_slot(s).gpu()).collect();
                    let count = if g.kind == proto::GresKind::Shard { g.count as usize } else { gpus.len() };
                    format!("{kind}:{count}(IDX:{})", show::task_ranges(&gpus))
                })
                .collect()
        }
        _ => Vec::new(),
    };
    out.insert("batch_host".into(), json!(if placed && spec.is_batch() { nodes[0].clone() } else { String::new() }));
    out.insert("gres_detail".into(), json!(gres_detail));
    out.insert("nodes".into(), json!(if placed { nodelist.clone() } else { String::new() }));
    if placed {
        let per_node_cpus = u64::from(spec.cpus_per_task) * u64::from(spec.ntasks_per_node);
        let allocated: Vec<Value> =
            nodes.iter().map(|n| json!({"nodename": n, "cpus_used": 0, "memory_used": 0, "memory_allocated": spec.mem_mib})).collect();
        out.insert(
            "job_resources".into(),
            json!({
                "nodes": nodelist,
                "allocated_cores": per_node_cpus * nodes.len() as u64,
                "allocated_hosts": nodes.len(),
                "allocated_nodes": allocated,
            }),
        );
    }
}

/// One node as `sinfo --json` prints it.
pub fn node(n: &NodeInfo) -> Value {
    let (_, long) = show::node_state(n);
    let drained = matches!(n.state, proto::NodeState::Drained);
    // Slurm's base state, with DRAIN as a flag (a drained idle node is "idle" + ["DRAIN"]).
    let base = match long.trim_end_matches('*') {
        "drained" => "idle",
        "draining" => "mixed",
        "down" | "drained*" => "down",
        other => other,
    };
    let host = n.addr.rsplit_once(':').map_or(n.addr.as_str(), |(h, _)| h).to_string();
    let port = n.addr.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).unwrap_or(0);
    let gpus_used = n.gpus_total - n.gpus_free.min(n.gpus_total);
    let gres_used = match n.gpu_types.as_slice() {
        [one] => format!("gpu:{one}:{gpus_used}"),
        _ => format!("gpu:{gpus_used}"),
    };
    let mut tres =
        vec![format!("cpu={}", n.cpus_total), format!("mem={}M", n.memory_mib), "billing=".to_string() + &n.cpus_total.to_string()];
    if n.gpus_total > 0 {
        tres.push(format!("gres/gpu={}", n.gpus_total));
    }
    let mut out = json!({
        "architecture": std::env::consts::ARCH,
        "burstbuffer_network_address": "",
        "boards": 1,
        "boot_time": 0,
        "comment": "",
        "cores": n.cpus_total,
        "cpu_binding": 0,
        "cpu_load": 0,
        "extra": "",
        "free_memory": n.memory_mib.saturating_sub(n.memory_alloc_mib),
        "cpus": n.cpus_total,
        "last_busy": 0,
        "features": "",
        "active_features": "",
        "gres": if n.gpus_total > 0 { show::gres_text(n) } else { String::new() },
        "gres_drained": "N/A",
        "gres_used": if n.gpus_total > 0 { gres_used } else { String::new() },
    });
    let rest = json!({
        "mcs_label": "",
        "name": n.name,
        "next_state_after_reboot": "invalid",
        "address": host,
        "hostname": n.name,
        "state": base,
        "state_flags": if drained || long.starts_with("drained*") { vec!["DRAIN"] } else { Vec::new() },
        "next_state_after_reboot_flags": [],
        "operating_system": "",
        "owner": null,
        "partitions": n.partitions,
        "port": port,
        "real_memory": n.memory_mib,
        "reason": n.reason.clone().unwrap_or_default(),
        "reason_changed_at": 0,
        "reason_set_by_user": null,
        "slurmd_start_time": 0,
        "sockets": 1,
        "threads": 1,
        "temporary_disk": 0,
        "weight": 1,
        "tres": tres.join(","),
        "slurmd_version": show::SLURM_VERSION,
        "alloc_memory": n.memory_alloc_mib,
        "alloc_cpus": n.cpus_alloc,
        "idle_cpus": n.cpus_total.saturating_sub(n.cpus_alloc),
        "tres_used": format!("cpu={}", n.cpus_alloc),
        "tres_weighted": f64::from(n.cpus_alloc),
    });
    if let (Value::Object(out), Value::Object(rest)) = (&mut out, rest) {
        out.extend(rest);
    }
    out
}
