//! The web UI `corral restd` serves at `/ui/`: one page (HTML, CSS and JavaScript compiled into
//! the binary, nothing loaded from outside the cluster) over a small JSON API at `/ui/api/`.
//! The page's shell is static and holds no data; every `/ui/api/` call is authenticated as the
//! REST API's are (a user certificate, or `X-SLURM-USER-NAME` and `X-SLURM-USER-TOKEN`, which
//! the login form takes from `scontrol token`) and acts on the cluster as that user, so a user
//! sees what the CLI shows them and changes only their own jobs.

mod api;

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use super::{Api, Caller};

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// Rows of the queue one answer holds at most (running jobs first, then pending ones by expected
/// start and id); the counts cover every job.
pub(super) const QUEUE_ROWS_MAX: usize = 500;
/// Bytes of a job's output its page shows (the end of it).
pub(super) const OUTPUT_TAIL_BYTES: u32 = 16 * 1024;
/// Nodes of a job whose GPU series its page fetches at most.
pub(super) const SERIES_NODES_MAX: usize = 16;
/// How long one gathering of the nodes' GPU samples serves every page that asks.
pub(super) const UTILIZATION_CACHE_MS: u64 = 5_000;
/// Nodes asked for their GPU samples at once.
pub(super) const SAMPLE_CALLS_IN_FLIGHT_MAX: usize = 32;

/// What the UI keeps between requests: the last gathering of the GPUs' samples (the same for
/// every caller, as DCGM's series are), so many open pages cost the nodes one call each per
/// [`UTILIZATION_CACHE_MS`].
#[derive(Default)]
pub(super) struct UiState {
    utilization: tokio::sync::Mutex<Option<(std::time::Instant, serde_json::Value)>>,
}

/// The UI's routes, under `/ui/`.
pub(super) fn routes(api: Arc<Api>) -> Router {
    Router::new()
        .route("/ui", get(|| async { axum::response::Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
        .route("/ui/api/me", get(api::me))
        .route("/ui/api/queue", get(api::queue))
        .route("/ui/api/nodes", get(api::nodes))
        .route("/ui/api/utilization", get(api::utilization))
        .route("/ui/api/job/{id}", get(api::job))
        .route("/ui/api/job/{id}/cancel", post(api::cancel))
        .route("/ui/api/shares", get(api::shares))
        .route("/ui/api/cluster", get(api::cluster))
        .with_state(api)
}

/// A file of the page. It may not be framed by another site, and runs no script but its own.
fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
        ],
        body,
    )
        .into_response()
}

/// A refusal or failure as the page reads it: `{"error": why}` with the status.
pub(super) struct UiError(StatusCode, String);

impl IntoResponse for UiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

fn error(status: StatusCode, why: impl Into<String>) -> UiError {
    UiError(status, why.into())
}

impl Caller {
    /// The caller's user, or the 401 the page answers with a login form.
    fn user_or_401(&self) -> Result<&str, UiError> {
        self.user().ok_or_else(|| error(StatusCode::UNAUTHORIZED, self.0.as_ref().err().cloned().unwrap_or_default()))
    }
}
