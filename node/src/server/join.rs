//! Joining the cluster: registering a node that presents the join token (`join`), creating join
//! tokens, and revoking certificates.

use std::time::Instant;

use proto::{ApiError, Command, CommandResult, InstanceId, Inventory, Reply, Response};
use tracing::{info, warn};

use super::enrol::{constant_time_eq, sha256_hex, JOIN_TOKEN_TTL_MS_MAX};
use super::{lock, ok_or_rejected, rejected, Node};

impl Node {
    /// Creates a join token: only its hash is replicated; the secret is in the reply alone.
    pub(super) async fn create_join_token(&self, ttl_ms: u64, who: Option<&str>, now: u64) -> Response {
        if ttl_ms == 0 || ttl_ms > JOIN_TOKEN_TTL_MS_MAX {
            return Err(ApiError::Invalid(format!("a join token lives 1..={JOIN_TOKEN_TTL_MS_MAX} ms")));
        }
        let secret = hex::encode(rand::random::<[u8; 32]>());
        let secret_sha256 = sha256_hex(secret.as_bytes());
        let expires_ms = now.saturating_add(ttl_ms);
        let created_by = who.unwrap_or("root").to_string();
        let cmd = Command::AddJoinToken { secret_sha256: secret_sha256.clone(), expires_ms, created_by: created_by.clone(), now_ms: now };
        ok_or_rejected(self.propose(cmd).await?)?;
        let id = self.state.read(|s| s.join_tokens.values().find(|t| t.secret_sha256 == secret_sha256).map(|t| t.id)).unwrap_or(0);
        info!(id, by = %created_by, expires_ms, "join token created");
        Ok(Reply::JoinTokenCreated { id, secret, expires_ms })
    }

    /// Revokes a node's certificates (the one it joined with and every later one of its name)
    /// or one certificate by fingerprint.
    pub(super) async fn revoke_cert(&self, node: Option<String>, fingerprint: Option<String>, who: Option<&str>, now: u64) -> Response {
        let (fingerprint, node, reason) = match (node, fingerprint) {
            (Some(name), None) => {
                // The certificate it joined with, and every one of its name after it.
                let fp = self.state.read(|s| s.nodes.values().find(|n| n.name == name).map(|n| n.cert_fingerprint.clone()));
                let Some(fp) = fp else { return Err(ApiError::NotFound(format!("node {name}"))) };
                let reason = format!("node {name} removed by {}", who.unwrap_or("root"));
                (fp, Some(name), reason)
            }
            (None, Some(fp)) if fp.len() == 64 && fp.bytes().all(|b| b.is_ascii_hexdigit()) => {
                (fp.to_ascii_lowercase(), None, format!("revoked by {}", who.unwrap_or("root")))
            }
            _ => return Err(ApiError::Invalid("name a node or a 64-digit certificate fingerprint".into())),
        };
        let cmd = Command::RevokeCert { fingerprint: fingerprint.clone(), node: node.clone(), reason: reason.clone(), now_ms: now };
        ok_or_rejected(self.propose(cmd).await?)?;
        warn!(fingerprint = %fingerprint, node = ?node, reason = %reason, "certificate revoked");
        Ok(Reply::Ok)
    }

    /// Registers a node that presents the cluster's join token (a new node, or a node's new
    /// instance), with a fresh heartbeat grace period.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn join(
        &self,
        token: String,
        name: String,
        addr: String,
        inventory: Inventory,
        instance: InstanceId,
        cert_fingerprint: String,
        now: u64,
    ) -> Response {
        if !constant_time_eq(token.as_bytes(), self.config.join_token.as_bytes()) {
            warn!(node = %name, "join refused: bad token");
            return Err(ApiError::Denied("bad join token".into()));
        }
        // An older instance than the one the log holds, which is up: the log would refuse it.
        // Busy: its daemon asks again, and is registered once the recorded one is declared down
        // (a node whose clock and record both went back); a dead one never asks again.
        if let Some(newer) = self.state.read(|s| s.node_by_name(&name).and_then(|n| s.newer_instance_up(n.id, instance))) {
            warn!(node = %name, instance, newer, "join refused: an instance started later is up");
            return Err(ApiError::Busy(format!(
                "instance {instance} of node {name} started before instance {newer}, which is up: asked again until that one is declared down"
            )));
        }
        let cmd = Command::RegisterNode { name: name.clone(), addr, inventory, instance, cert_fingerprint, now_ms: now };
        match self.propose(cmd).await? {
            CommandResult::NodeRegistered { id } => {
                lock(&self.memory).heard_from(id, Instant::now());
                info!(node = %name, id, "node registered");
                self.kick.notify_one();
                Ok(Reply::Joined { id, name })
            }
            other => Err(rejected(other)),
        }
    }
}
