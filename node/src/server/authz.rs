//! Who may do what: admins act on the cluster and on any job, users on their own jobs
//! (`authorize`); and the REST API tokens that name a user (`issue_token`).

use proto::{ApiError, JobId, Reply, Response};
use tracing::{info, warn};

use super::Node;

/// A REST API token's life unless asked otherwise (Slurm's `scontrol token` default).
const TOKEN_LIFESPAN_S_DEFAULT: u64 = 1_800;
/// The longest life a token may be given.
const TOKEN_LIFESPAN_S_MAX: u64 = 365 * 86_400;

impl Node {
    /// Whether `user` may act on jobs of other users and on the cluster: an admin, or the node
    /// itself (no user).
    pub(super) fn is_admin(&self, user: Option<&str>) -> bool {
        user.is_none_or(|u| self.config.admins.iter().any(|a| a == u))
    }

    /// A REST API token (`scontrol token`) for `wanted` (none: the caller; root for an admin
    /// acting as the node), signed with the key every node derives from the member secret.
    pub(super) fn issue_token(&self, caller: Option<&str>, wanted: Option<String>, lifespan_s: Option<u64>) -> Response {
        let who = caller.unwrap_or("root");
        let user = wanted.unwrap_or_else(|| who.to_string());
        if user != who {
            self.require_admin(caller, "issue tokens for other users")?;
        }
        if user.is_empty() || user.len() > 64 || !user.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return Err(ApiError::Invalid(format!("invalid user name {user:?}")));
        }
        let lifespan_s = lifespan_s.unwrap_or(TOKEN_LIFESPAN_S_DEFAULT);
        if lifespan_s == 0 || lifespan_s > TOKEN_LIFESPAN_S_MAX {
            return Err(ApiError::Invalid(format!("lifespan must be 1..={TOKEN_LIFESPAN_S_MAX} seconds")));
        }
        let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let key = transport::token::key(&self.config.join_token);
        info!(user = %user, by = %who, lifespan_s, "issued a REST API token");
        Ok(Reply::Token(transport::token::sign(&key, &user, now_s, now_s + lifespan_s)))
    }

    fn require_admin(&self, user: Option<&str>, what: &str) -> Result<(), ApiError> {
        if self.is_admin(user) {
            return Ok(());
        }
        let who = user.unwrap_or_default();
        warn!(user = %who, action = what, "denied: not an admin");
        Err(ApiError::Denied(format!("user {who} may not {what}: only admins may")))
    }

    /// Users act on their own jobs only; admins on any.
    fn require_owner(&self, user: Option<&str>, job: JobId, what: &str) -> Result<(), ApiError> {
        if self.is_admin(user) {
            return Ok(());
        }
        let who = user.unwrap_or_default();
        let owner = self.state.read(|s| s.jobs.get(&job).map(|j| j.spec.user.clone()));
        match owner {
            None => Err(ApiError::NotFound(format!("job {job}"))),
            Some(owner) if owner == who => Ok(()),
            Some(owner) => {
                warn!(user = %who, job, owner = %owner, action = what, "denied: not the job's owner");
                Err(ApiError::Denied(format!("user {who} may not {what} job {job} of user {owner}")))
            }
        }
    }

    /// Whether `who` may send a request of class `access` (`Request::access`): the owner of a
    /// job (or an admin) changes it, an admin the cluster. Node-only requests are refused to
    /// users where they arrive (`Api`).
    pub(super) fn authorize(&self, access: proto::Access, who: Option<&str>) -> Result<(), ApiError> {
        match access {
            proto::Access::Owner { job, verb } => self.require_owner(who, job, verb),
            proto::Access::Admin { what } => self.require_admin(who, what),
            proto::Access::Anonymous | proto::Access::User | proto::Access::Node => Ok(()),
        }
    }
}
