//! `corral restd`: Slurm's REST API (slurmrestd's `openapi/v0.0.38` job and node endpoints) on
//! a node, over HTTPS. Like slurmrestd it is a daemon of its own beside the node's: it runs as
//! root on a node, reaches its `corrald` through the node's local socket, and acts there for the
//! user whose certificate the HTTPS client showed (a certificate of the cluster CA is required:
//! nothing is open, and a revoked certificate is refused). Replies are slurmrestd's, read from a
//! real slurmrestd 22.05 on `../shared/peers/slurm`: the same JSON as `squeue --json` and
//! `sinfo --json`, its error objects and status codes, and a submission's `job` keys taken as
//! the sbatch options of those names (an unknown key is refused, as slurmrestd refuses it).
//!
//! This module is the daemon: the node's files, TLS and connections, who each request is from
//! (a certificate, or a `scontrol token`), the routes of each API version, and slurmrestd's
//! reply shapes; the endpoints are in `jobs`, `nodes` (with `/ping`), `partitions` and
//! `reservations`, the web UI in `ui`.

mod jobs;
mod nodes;
mod partitions;
mod reservations;
mod ui;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::{DefaultBodyLimit, Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use proto::{ApiError, ClientRequest};
use serde_json::{json, Value};
use slurm_compat::openapi::{self, Version};
use tracing::{debug, warn};

use crate::client::Cluster;
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
    ui: ui::UiState,
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
    let api = Arc::new(Api {
        socket: files.socket,
        host: crate::slurm::host_name(),
        token_key: transport::token::key(&files.secret),
        ui: Default::default(),
    });
    let app = router(Arc::clone(&api));
    let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
    println!(
        "corral restd: https://{}/slurm/v0.0.38/ (and v0.0.37, and the web UI at /ui/) for certificates of the cluster CA and tokens",
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
        // Small answers go out at once, not after the peer's delayed ACK (Nagle's algorithm).
        if let Err(e) = tcp.set_nodelay(true) {
            debug!(error = %e, "set TCP_NODELAY");
        }
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
    let check = ClientRequest::CheckCert { fingerprint, common_name: name.clone() };
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

/// The routes of every version served (slurmrestd 22.05 serves v0.0.37 and v0.0.38 side by
/// side; they differ in three keys of a job).
fn router(api: Arc<Api>) -> Router {
    let mut app = Router::new();
    for version in [Version::V0037, Version::V0038] {
        let mut routes = Router::new()
            .route("/ping", get(nodes::ping))
            .route("/jobs", get(jobs::jobs))
            .route("/job/submit", post(jobs::submit))
            .route("/job/{id}", get(jobs::job).delete(jobs::cancel))
            .route("/nodes", get(nodes::nodes))
            .route("/node/{name}", get(nodes::node))
            .route("/reservations", get(reservations::reservations))
            .route("/reservations/", get(reservations::reservations))
            .route("/reservation/{name}", get(reservations::reservation));
        // v0.0.37's partitions differ (and carry bugs v0.0.38 fixed): v0.0.38's alone.
        if version == Version::V0038 {
            routes = routes
                .route("/partitions", get(partitions::partitions))
                .route("/partitions/", get(partitions::partitions))
                .route("/partition/{name}", get(partitions::partition));
        }
        let routes = routes.with_state(Arc::new(Served { api: Arc::clone(&api), version }));
        app = app.nest(&format!("/slurm/{}", version.name()), routes);
    }
    app.merge(ui::routes(Arc::clone(&api)))
        .fallback(|| async { (StatusCode::NOT_FOUND, "Unable find requested URL. Please view /openapi/v3 for API reference.") })
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

#[cfg(test)]
mod tests {
    use super::*;

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
