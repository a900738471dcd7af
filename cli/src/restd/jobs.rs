//! The job endpoints of `corral restd`: `GET /jobs` and `GET /job/ID` (as `squeue --json`),
//! `DELETE /job/ID` (as `scancel`), and `POST /job/submit`, whose `job` keys are taken as the
//! sbatch options of those names and parsed as `sbatch` parses them (an unknown key is refused,
//! as slurmrestd refuses it).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Extension, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use proto::{ApiError, ClientRequest, Reply};
use serde_json::{json, Value};
use slurm_compat::openapi::Version;

use crate::commands::node_names;
use crate::slurm::sbatch::{Builder, Context};
use crate::slurm::PATIENCE;

use super::{failed, reply, slurm_error, Caller, Served};

/// Every job the cluster holds (ended ones within MinJobAge too), as `squeue --json`.
pub(super) async fn jobs(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let cluster = api.cluster_for(user);
    let query = proto::JobQuery { live: true, finished: true, brief: true, ..Default::default() };
    let found = async {
        let jobs = cluster.query_jobs(query, PATIENCE).await?;
        let names = node_names(&cluster).await?;
        anyhow::Ok(jobs.iter().map(|j| crate::slurm::openapi_job(version, j, &names)).collect::<Vec<_>>())
    };
    match found.await {
        Ok(jobs) => reply(version, StatusCode::OK, Vec::new(), vec![("jobs", Value::Array(jobs))]),
        Err(e) => {
            let (error, number) = slurm_error(&e);
            failed(version, "slurm_load_jobs", &error, format!("{e:#}"), number, vec![("jobs", json!([]))])
        }
    }
}

pub(super) async fn job(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>, UrlPath(id): UrlPath<String>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let invalid = || {
        failed(version, "slurm_load_job", "Invalid job id specified", format!("Unable to find JobId={id}"), 2017, vec![("jobs", json!([]))])
    };
    let Ok(job_id) = id.parse::<proto::JobId>() else { return invalid() };
    let cluster = api.cluster_for(user);
    let found = async {
        let reply = cluster.call_patiently(ClientRequest::GetJob { job: job_id }, PATIENCE).await?;
        let Reply::Job(job) = reply else { anyhow::bail!("unexpected reply {reply:?}") };
        let names = node_names(&cluster).await?;
        anyhow::Ok(crate::slurm::openapi_job(version, &job, &names))
    };
    match found.await {
        Ok(job) => reply(version, StatusCode::OK, Vec::new(), vec![("jobs", json!([job]))]),
        Err(e) if matches!(e.downcast_ref::<ApiError>(), Some(ApiError::NotFound(_))) => invalid(),
        Err(e) => {
            let (error, number) = slurm_error(&e);
            failed(version, "slurm_load_job", &error, format!("{e:#}"), number, vec![("jobs", json!([]))])
        }
    }
}

/// `DELETE /job/ID[?signal=SIG]`: cancel it, or send it the signal (as `scancel [-s SIG]`).
pub(super) async fn cancel(
    State(served): State<Arc<Served>>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let signal = match query.get("signal") {
        None => None,
        Some(s) => match crate::slurm::sbatch::parse_signal_name(s.trim_start_matches("SIG")) {
            Some(n) => Some(n),
            None => return failed(version, "slurm_kill_job", "Invalid signal", format!("unknown signal {s}"), 2038, Vec::new()),
        },
    };
    let shown = signal.unwrap_or(libc::SIGKILL);
    let invalid = || {
        failed(
            version,
            "slurm_kill_job",
            "Invalid job id specified",
            format!("unable to kill JobId={id} with signal {shown}: Invalid job id specified"),
            2017,
            Vec::new(),
        )
    };
    let Ok(job) = id.parse::<proto::JobId>() else { return invalid() };
    let request = match signal {
        None => ClientRequest::Cancel { job },
        Some(signal) => ClientRequest::Signal { job, signal, batch_only: false },
    };
    match api.cluster_for(user).call_patiently(request, PATIENCE).await {
        Ok(_) => reply(version, StatusCode::OK, Vec::new(), Vec::new()),
        Err(e) if matches!(e.downcast_ref::<ApiError>(), Some(ApiError::NotFound(_))) => invalid(),
        Err(e) => {
            let (error, number) = slurm_error(&e);
            failed(version, "slurm_kill_job", &error, format!("unable to kill JobId={id} with signal {shown}: {e:#}"), number, Vec::new())
        }
    }
}

/// A `job` key of a submission and the sbatch option it sets (slurmrestd's keys are sbatch's
/// long options with `_`, a few renamed).
const SUBMIT_KEYS: &[(&str, &str)] = &[
    ("account", "account"),
    ("array", "array"),
    ("begin_time", "begin"),
    ("comment", "comment"),
    ("constraints", "constraint"),
    ("cpus_per_gpu", "cpus-per-gpu"),
    ("cpus_per_task", "cpus-per-task"),
    ("current_working_directory", "chdir"),
    ("dependency", "dependency"),
    ("exclude_nodes", "exclude"),
    ("exclusive", "exclusive"),
    ("gpus", "gpus"),
    ("gpus_per_node", "gpus-per-node"),
    ("gpus_per_task", "gpus-per-task"),
    ("gres", "gres"),
    ("hold", "hold"),
    ("memory_per_cpu", "mem-per-cpu"),
    ("memory_per_gpu", "mem-per-gpu"),
    ("memory_per_node", "mem"),
    ("name", "job-name"),
    ("nice", "nice"),
    ("nodes", "nodes"),
    ("ntasks_per_node", "ntasks-per-node"),
    ("partition", "partition"),
    ("qos", "qos"),
    ("requeue", "requeue"),
    ("signal", "signal"),
    ("standard_error", "error"),
    ("standard_output", "output"),
    ("tasks", "ntasks"),
    ("tasks_per_node", "ntasks-per-node"),
    ("time_limit", "time"),
];

/// A submission refused before it reaches the cluster: the status and slurmrestd's errors.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    errors: Vec<Value>,
}

impl Refusal {
    fn respond(self, version: Version) -> Response {
        reply(version, self.status, self.errors, Vec::new())
    }
}

/// A refused submission: 400, the reason, then slurmrestd's "Failure during parsing".
fn unparsable(reason: Value) -> Refusal {
    Refusal { status: StatusCode::BAD_REQUEST, errors: vec![reason, json!({"error_code": 9001, "error": "Failure during parsing"})] }
}

/// The job a submission describes, for `user`: slurmrestd's checks and words, then the same
/// parsing as `sbatch` with each `job` key as its option. Pure.
fn submission(body: &Value, user: &str, host: &str, now_s: i64) -> Result<proto::JobSpec, Refusal> {
    let Some(script) = body.get("script").and_then(Value::as_str) else {
        return Err(Refusal {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            errors: vec![json!({"error_code": 2009, "error": "Job script not specified"})],
        });
    };
    let job = body.get("job").and_then(Value::as_object).cloned().unwrap_or_default();
    let Some(environment) = job.get("environment").and_then(Value::as_object) else {
        return Err(unparsable(json!({"error": "environment must be set", "error_code": 2127})));
    };
    let env: BTreeMap<String, String> =
        environment.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string))).collect();
    let cwd = job.get("current_working_directory").and_then(Value::as_str).unwrap_or("/");
    let ctx = Context { cwd: PathBuf::from(cwd), env, user: user.to_string(), host: host.to_string(), now_s };
    let mut b = Builder::new("sbatch", &ctx);
    for (key, value) in &job {
        if key == "environment" {
            continue;
        }
        let Some((_, option)) = SUBMIT_KEYS.iter().find(|(k, _)| k == key) else {
            return Err(unparsable(json!({"description": format!("Unknown key \"{key}\""), "source": "hsearch_r"})));
        };
        let applied = match (value, *option) {
            (Value::Bool(true), _) => b.apply(option, None),
            (Value::Bool(false), "requeue") => b.apply("no-requeue", None),
            (Value::Bool(false), _) => Ok(()),
            (Value::String(s), _) => b.apply(option, Some(s)),
            (Value::Number(n), _) => b.apply(option, Some(&n.to_string())),
            _ => Err(crate::slurm::SlurmError::fatal("sbatch", format!("{key} must be a string, a number or a boolean"))),
        };
        if let Err(e) = applied {
            let why = e.text.trim_start_matches("sbatch: error: ").to_string();
            return Err(unparsable(
                json!({"description": format!("Unable to process key \"{key}\": {why}"), "error_number": -1, "error": why, "source": "slurm_process_option_data"}),
            ));
        }
    }
    match b.finish(Some(script.to_string()), Vec::new(), "sbatch".into()) {
        Ok(mut sub) => {
            sub.spec.set_batch(true);
            Ok(sub.spec)
        }
        Err(e) => Err(unparsable(
            json!({"description": e.text.trim_start_matches("sbatch: error: "), "error_number": -1, "error": "Unspecified error", "source": "slurm_process_option_data"}),
        )),
    }
}

pub(super) async fn submit(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>, body: axum::body::Bytes) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return unparsable(json!({"description": format!("Unable to parse the request: {e}"), "source": "serializer/json"}))
                .respond(version)
        }
    };
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let spec = match submission(&body, user, &api.host, now_s) {
        Ok(spec) => spec,
        Err(r) => return r.respond(version),
    };
    match api.cluster_for(user).call_patiently(ClientRequest::Submit { spec }, PATIENCE).await {
        Ok(Reply::Submitted { job }) => reply(
            version,
            StatusCode::OK,
            Vec::new(),
            vec![("job_id", json!(job)), ("step_id", json!("BATCH")), ("job_submit_user_msg", json!(""))],
        ),
        Ok(other) => failed(version, "slurm_submit_batch_job", "Unspecified error", format!("unexpected reply {other:?}"), -1, Vec::new()),
        Err(e) => {
            let (error, number) = slurm_error(&e);
            failed(version, "slurm_submit_batch_job", &error, format!("{e:#}"), number, Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(r: Refusal) -> (StatusCode, String) {
        (r.status, Value::Array(r.errors).to_string())
    }

    #[test]
    fn a_submission_is_sbatchs_options_by_slurmrestds_keys() {
        let body = json!({"script": "#!/bin/sh\ntrue\n", "job": {
            "name": "rest1", "current_working_directory": "/tmp", "environment": {"PATH": "/bin", "N": 3},
            "time_limit": 5, "nodes": 2, "tasks_per_node": 2, "gres": "gpu:h100:1", "partition": "gpu",
            "hold": true, "requeue": false, "standard_output": "/tmp/o-%j.out"}});
        let spec = submission(&body, "alice", "login1", 1_800_000_000).unwrap_or_else(|_| panic!("refused"));
        assert_eq!((spec.name.as_str(), spec.user.as_str(), spec.workdir.as_str()), ("rest1", "alice", "/tmp"));
        assert_eq!((spec.time_limit_ms, spec.nodes, spec.ntasks_per_node), (Some(300_000), 2, 2));
        assert_eq!(
            (spec.partition.as_deref(), spec.hold, spec.requeue, spec.output.as_deref()),
            (Some("gpu"), true, false, Some("/tmp/o-%j.out"))
        );
        assert_eq!(spec.gres.as_ref().map(|g| g.count), Some(1));
        assert_eq!((spec.env.get("PATH").map(String::as_str), spec.env.get("N").map(String::as_str)), (Some("/bin"), Some("3")));
        assert!(spec.is_batch() && spec.script.as_deref() == Some("#!/bin/sh\ntrue\n"));
    }

    #[test]
    fn submissions_slurmrestd_refuses_are_refused_in_its_words() {
        let job = |extra: Value| {
            let mut j = json!({"name": "x", "current_working_directory": "/tmp", "environment": {"PATH": "/bin"}});
            if let (Value::Object(j), Value::Object(e)) = (&mut j, extra) {
                j.extend(e);
            }
            json!({"script": "#!/bin/sh\ntrue\n", "job": j})
        };
        let refused = |body: Value| refusal(submission(&body, "alice", "h", 0).expect_err("refused"));
        let (status, text) = refused(job(json!({"bogus_field": 3})));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            text,
            r#"[{"description":"Unknown key \"bogus_field\"","source":"hsearch_r"},{"error":"Failure during parsing","error_code":9001}]"#
        );
        let (status, text) = refused(json!({"job": {"name": "x"}}));
        assert_eq!(
            (status, text.as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, r#"[{"error":"Job script not specified","error_code":2009}]"#)
        );
        let (status, text) = refused(json!({"script": "#!/bin/sh\n", "job": {"name": "x"}}));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.starts_with(r#"[{"error":"environment must be set","error_code":2127}"#), "{text}");
        let (status, text) = refused(job(json!({"time_limit": "soon"})));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(text.contains(r#"Unable to process key \"time_limit\": Invalid --time specification"#), "{text}");
    }
}
