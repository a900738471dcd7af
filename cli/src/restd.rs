//! `corral restd`: Slurm's REST API (slurmrestd's `openapi/v0.0.38` job and node endpoints) on
//! a node, over HTTPS. Like slurmrestd it is a daemon of its own beside the node's: it runs as
//! root on a node, reaches its `corrald` through the node's local socket, and acts there for the
//! user whose certificate the HTTPS client showed (a certificate of the cluster CA is required:
//! nothing is open, and a revoked certificate is refused). Replies are slurmrestd's, read from a
//! real slurmrestd 22.05 on `../shared/peers/slurm`: the same JSON as `squeue --json` and
//! `sinfo --json`, its error objects and status codes, and a submission's `job` keys taken as
//! the sbatch options of those names (an unknown key is refused, as slurmrestd refuses it).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{DefaultBodyLimit, Extension, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use proto::{ApiError, Reply, Request};
use serde_json::{json, Value};
use slurm_compat::openapi::{self, Version};
use tracing::{debug, warn};

use crate::client::Cluster;
use crate::commands::node_names;
use crate::slurm::sbatch::{Builder, Context};
use crate::slurm::PATIENCE;

/// slurmrestd's port.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:6820";
/// Connections served at once; one past it is closed unanswered.
const CONNECTIONS_MAX: usize = 256;
const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
const HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// The largest request body (a submission's script and environment).
const BODY_BYTES_MAX: usize = 1 << 20;

/// What `corral restd` needs of a node's `node.toml`: its certificate and key (which it serves
/// with), the cluster CA (which clients' certificates must chain to), and its local socket.
#[derive(Debug, PartialEq, Eq)]
pub struct NodeFiles {
    pub tls: transport::pki::TlsPaths,
    pub socket: PathBuf,
    /// The cluster's member secret, from which the key of REST API tokens is derived.
    pub secret: String,
}

/// Reads `node.toml` at `path` (relative paths are the config's directory's, as the node reads
/// them; the socket is `socket`, else `DATA_DIR/corral.sock`).
pub fn node_files(path: &Path) -> anyhow::Result<NodeFiles> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let config: toml::Value = toml::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let path_of = |table: Option<&toml::Value>, key: &str| {
        table.and_then(|t| t.get(key)).and_then(toml::Value::as_str).map(|p| {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                dir.join(p)
            }
        })
    };
    let tls = config.get("tls");
    let need = |key: &str| path_of(tls, key).with_context(|| format!("{} has no tls.{key}", path.display()));
    let tls = transport::pki::TlsPaths { ca_cert: need("ca_cert")?, cert: need("cert")?, key: need("key")? };
    let socket = path_of(Some(&config), "socket")
        .or_else(|| path_of(Some(&config), "data_dir").map(|d| d.join("corral.sock")))
        .with_context(|| format!("{} names neither socket nor data_dir", path.display()))?;
    let secret = config.get("join_token").and_then(toml::Value::as_str).unwrap_or_default().to_string();
    anyhow::ensure!(!secret.is_empty(), "{} has no join_token (the member secret tokens are signed with)", path.display());
    Ok(NodeFiles { tls, socket, secret })
}

/// Who is asking: the user their certificate or token names, or why they may not.
#[derive(Clone, Debug)]
struct Caller(Result<String, String>);

/// What a connection's TLS session says of its client: nothing (no certificate: its requests
/// must carry a token), or what its certificate gives.
#[derive(Clone, Debug)]
struct Connection(Option<Caller>);

struct Api {
    socket: PathBuf,
    host: String,
    /// Checks `X-SLURM-USER-TOKEN`s (`scontrol token`).
    token_key: ring::hmac::Key,
}

impl Api {
    /// The cluster, through the node's socket, acting for `user`.
    fn cluster_for(&self, user: &str) -> Cluster {
        Cluster::local_for(&self.socket, user)
    }
}

/// Serves the API on `listen` until the process ends.
pub async fn run(node_config: &Path, listen: SocketAddr) -> anyhow::Result<()> {
    // Anyone else would act, on the node's socket, as themselves whoever the client is.
    // SAFETY: geteuid has no preconditions.
    anyhow::ensure!(
        unsafe { libc::geteuid() } == 0,
        "corral restd must run as root: on the node's socket only root may act for its clients' users"
    );
    let files = node_files(node_config)?;
    let identity = files.tls.load().context("load the node's certificate")?;
    let acceptor = tokio_rustls::TlsAcceptor::from(transport::https_server_config(&identity)?);
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listen on {listen}"))?;
    let api = Arc::new(Api { socket: files.socket, host: crate::slurm::host_name(), token_key: transport::token::key(&files.secret) });
    let app = router(Arc::clone(&api));
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    println!(
        "corral restd: https://{}/slurm/v0.0.38/ (and v0.0.37) for certificates of the cluster CA",
        listener.local_addr().context("read the bound address")?
    );
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "accept an HTTPS connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            debug!(%peer, "closed a connection past {CONNECTIONS_MAX}");
            continue;
        };
        let (acceptor, app, api) = (acceptor.clone(), app.clone(), Arc::clone(&api));
        tokio::spawn(async move {
            serve_connection(acceptor, tcp, app, &api).await;
            drop(slot);
        });
    }
}

async fn serve_connection(acceptor: tokio_rustls::TlsAcceptor, tcp: tokio::net::TcpStream, app: Router, api: &Api) {
    let tls = match tokio::time::timeout(Duration::from_millis(HANDSHAKE_TIMEOUT_MS), acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return debug!(error = %e, "TLS handshake failed"),
        Err(_) => return debug!("TLS handshake timed out"),
    };
    let der = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| c.to_vec());
    let connection = match der {
        Some(der) => Connection(Some(caller_of(&der, api).await)),
        None => Connection(None),
    };
    let service = hyper_util::service::TowerToHyperService::new(app.layer(Extension(connection)));
    let served = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(Duration::from_millis(HEADER_READ_TIMEOUT_MS))
        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
        .await;
    if let Err(e) = served {
        debug!(error = %e, "HTTPS connection ended");
    }
}

/// The user a client certificate (DER) names, if the cluster still accepts it.
async fn caller_of(der: &[u8], api: &Api) -> Caller {
    let (name, fingerprint) = transport::certificate_peer(der);
    let Some(user) = name.strip_prefix(transport::pki::USER_CN_PREFIX) else {
        return Caller(Err(format!("{name} is not a user's certificate")));
    };
    let check = Request::CheckCert { fingerprint, common_name: name.clone() };
    match Cluster::local(&api.socket).call_patiently(check, PATIENCE).await {
        Ok(_) => Caller(Ok(user.to_string())),
        Err(e) => Caller(Err(format!("{e:#}"))),
    }
}

/// What one version's routes serve with.
struct Served {
    api: Arc<Api>,
    version: Version,
}

/// The routes of every version served (slurmrestd 22.05 serves v0.0.37 and v0.0.38 side by
/// side; they differ in three keys of a job).
/// Who each request is from: its connection's certificate, else its `X-SLURM-USER-NAME` and
/// `X-SLURM-USER-TOKEN` (a token of this cluster naming that user, not expired), else nobody.
async fn authenticate(
    State(api): State<Arc<Api>>,
    Extension(connection): Extension<Connection>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let caller = connection.0.unwrap_or_else(|| {
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        Caller(match (header("X-SLURM-USER-NAME"), header("X-SLURM-USER-TOKEN")) {
            (Some(user), Some(token)) => {
                let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                match transport::token::verify(&api.token_key, &token, now_s) {
                    Ok(named) if named == user => Ok(user),
                    Ok(named) => Err(format!("the token is {named}'s, not {user}'s")),
                    Err(e) => Err(e.to_string()),
                }
            }
            _ => Err("a user certificate of the cluster, or X-SLURM-USER-NAME and X-SLURM-USER-TOKEN, is required".into()),
        })
    });
    request.extensions_mut().insert(caller);
    next.run(request).await
}

fn router(api: Arc<Api>) -> Router {
    let mut app = Router::new();
    for version in [Version::V0037, Version::V0038] {
        let routes = Router::new()
            .route("/ping", get(ping))
            .route("/jobs", get(jobs))
            .route("/job/submit", post(submit))
            .route("/job/{id}", get(job).delete(cancel))
            .route("/nodes", get(nodes))
            .route("/node/{name}", get(node))
            .with_state(Arc::new(Served { api: Arc::clone(&api), version }));
        app = app.nest(&format!("/slurm/{}", version.name()), routes);
    }
    app.fallback(|| async { (StatusCode::NOT_FOUND, "Unable find requested URL. Please view /openapi/v3 for API reference.") })
        .layer(axum::middleware::from_fn_with_state(api, authenticate))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
}

/// slurmrestd's reply: `meta`, `errors`, then `fields`.
fn reply(version: Version, status: StatusCode, errors: Vec<Value>, fields: Vec<(&str, Value)>) -> Response {
    let mut body = openapi::envelope(version, "errors", errors);
    if let Value::Object(map) = &mut body {
        map.extend(fields.into_iter().map(|(k, v)| (k.to_string(), v)));
    }
    (status, Json(body)).into_response()
}

/// A refused caller: 401, with why.
fn unauthorized(version: Version, why: &str) -> Response {
    reply(version, StatusCode::UNAUTHORIZED, vec![json!({"error": "Authentication failure", "description": why})], Vec::new())
}

/// A failure of the call named `source`, as slurmrestd reports one: 500.
fn failed(version: Version, source: &str, error: &str, description: String, number: i64, fields: Vec<(&str, Value)>) -> Response {
    let error = json!({"description": description, "error_number": number, "error": error, "source": source});
    reply(version, StatusCode::INTERNAL_SERVER_ERROR, vec![error], fields)
}

/// Slurm's words and number for an error of the cluster's.
fn slurm_error(e: &anyhow::Error) -> (String, i64) {
    match e.downcast_ref::<ApiError>() {
        Some(ApiError::NotFound(_)) => ("Invalid job id specified".into(), 2017),
        Some(ApiError::Denied(_)) => ("Access/permission denied".into(), 2002),
        // `apply`'s refusal of a cancel of an ended job (consensus `Command::Cancel`).
        Some(ApiError::Invalid(why)) if why.contains("already finished") => ("Job/step already completing or completed".into(), 2021),
        _ => (crate::slurm::describe_error(e), -1),
    }
}

impl Caller {
    fn user(&self) -> Option<&str> {
        self.0.as_deref().ok()
    }

    /// The 401 for a caller refused.
    fn refusal(&self, version: Version) -> Response {
        unauthorized(version, self.0.as_ref().err().map_or("", String::as_str))
    }
}

async fn ping(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    match api.cluster_for(user).call_patiently(Request::ClusterInfo, PATIENCE).await {
        Ok(Reply::Cluster(info)) => {
            // slurmrestd pings the controllers: here the voters, the leader first.
            let mut voters: Vec<_> = info.members.iter().filter(|m| m.role != proto::NodeRole::Agent).collect();
            voters.sort_by_key(|m| Some(&m.name) != info.leader.as_ref());
            let pings: Vec<Value> = voters
                .iter()
                .map(|m| {
                    let mode = if Some(&m.name) == info.leader.as_ref() { "primary" } else { "backup" };
                    json!({"hostname": m.name, "ping": "UP", "status": 0, "mode": mode})
                })
                .collect();
            reply(version, StatusCode::OK, Vec::new(), vec![("pings", Value::Array(pings))])
        }
        Ok(other) => failed(version, "slurm_ping", "Unspecified error", format!("unexpected reply {other:?}"), -1, Vec::new()),
        Err(e) => failed(version, "slurm_ping", "Unable to contact slurm controller", format!("{e:#}"), 1007, Vec::new()),
    }
}

/// Every job the cluster holds (ended ones within MinJobAge too), as `squeue --json`.
async fn jobs(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let cluster = api.cluster_for(user);
    let query = proto::JobQuery { live: true, finished: true, brief: true, ..Default::default() };
    let found = async {
        let jobs = cluster.query_jobs(query, PATIENCE).await?;
        let names = node_names(&cluster).await?;
        anyhow::Ok(jobs.iter().map(|j| openapi::job(version, j, &names)).collect::<Vec<_>>())
    };
    match found.await {
        Ok(jobs) => reply(version, StatusCode::OK, Vec::new(), vec![("jobs", Value::Array(jobs))]),
        Err(e) => {
            let (error, number) = slurm_error(&e);
            failed(version, "slurm_load_jobs", &error, format!("{e:#}"), number, vec![("jobs", json!([]))])
        }
    }
}

async fn job(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>, UrlPath(id): UrlPath<String>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let invalid = || {
        failed(version, "slurm_load_job", "Invalid job id specified", format!("Unable to find JobId={id}"), 2017, vec![("jobs", json!([]))])
    };
    let Ok(job_id) = id.parse::<proto::JobId>() else { return invalid() };
    let cluster = api.cluster_for(user);
    let found = async {
        let reply = cluster.call_patiently(Request::GetJob { job: job_id }, PATIENCE).await?;
        let Reply::Job(job) = reply else { anyhow::bail!("unexpected reply {reply:?}") };
        let names = node_names(&cluster).await?;
        anyhow::Ok(openapi::job(version, &job, &names))
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
async fn cancel(
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
        None => Request::Cancel { job },
        Some(signal) => Request::Signal { job, signal, batch_only: false },
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

async fn submit(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>, body: axum::body::Bytes) -> Response {
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
    match api.cluster_for(user).call_patiently(Request::Submit { spec }, PATIENCE).await {
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

async fn nodes(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>) -> Response {
    nodes_named(&served, &caller, None).await
}

async fn node(State(served): State<Arc<Served>>, Extension(caller): Extension<Caller>, UrlPath(name): UrlPath<String>) -> Response {
    nodes_named(&served, &caller, Some(name)).await
}

/// Every node (`name`: that one alone), as `sinfo --json`.
async fn nodes_named(served: &Served, caller: &Caller, name: Option<String>) -> Response {
    let (api, version) = (&served.api, served.version);
    let Some(user) = caller.user() else { return caller.refusal(version) };
    let mut nodes = match api.cluster_for(user).call_patiently(Request::ListNodes, PATIENCE).await {
        Ok(Reply::Nodes(nodes)) => nodes,
        Ok(other) => {
            return failed(
                version,
                "slurm_load_node",
                "Unspecified error",
                format!("unexpected reply {other:?}"),
                -1,
                vec![("nodes", json!([]))],
            )
        }
        Err(e) => {
            let (error, number) = slurm_error(&e);
            return failed(version, "slurm_load_node", &error, format!("{e:#}"), number, vec![("nodes", json!([]))]);
        }
    };
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(name) = &name {
        nodes.retain(|n| &n.name == name);
        if nodes.is_empty() {
            let error = json!({"error": "Invalid node name specified", "errno": 2018});
            return reply(version, StatusCode::INTERNAL_SERVER_ERROR, vec![error], vec![("nodes", json!([]))]);
        }
    }
    reply(version, StatusCode::OK, Vec::new(), vec![("nodes", Value::Array(nodes.iter().map(openapi::node).collect()))])
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

    #[test]
    fn node_files_resolve_as_the_node_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("node.toml");
        std::fs::write(
            &path,
            "name = \"n1\"\ndata_dir = \"data\"\njoin_token = \"s\"\n[tls]\nca_cert = \"../ca.crt\"\ncert = \"node.crt\"\nkey = \"/k/node.key\"\n",
        )
        .expect("write");
        let files = node_files(&path).expect("read");
        assert_eq!(files.socket, dir.path().join("data/corral.sock"));
        assert_eq!(
            (files.tls.ca_cert, files.tls.cert, files.tls.key),
            (dir.path().join("../ca.crt"), dir.path().join("node.crt"), PathBuf::from("/k/node.key"))
        );
        std::fs::write(&path, "socket = \"/run/corral/corral.sock\"\n").expect("write");
        assert!(node_files(&path).is_err(), "no tls table");
    }
}
