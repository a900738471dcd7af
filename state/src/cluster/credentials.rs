//! Join tokens (kept as their secrets' hashes: added, revoked, looked up) and revoked
//! certificates and nodes.

use proto::CommandResult;

use super::{rejected, ClusterState, JOIN_TOKENS_MAX, REVOKED_CERTS_MAX};

impl ClusterState {
    /// The live join token whose secret hashes to `secret_sha256` at `now_ms`, if any.
    pub fn live_join_token(&self, secret_sha256: &str, now_ms: u64) -> Option<&proto::JoinTokenRecord> {
        self.join_tokens.values().find(|t| !t.revoked && t.expires_ms > now_ms && t.secret_sha256 == secret_sha256)
    }

    /// `AddJoinToken`: keeps the token (its secret's SHA-256, lowercased) under the next id,
    /// forgetting the oldest expired or revoked one when `JOIN_TOKENS_MAX` are kept. `Err`, with
    /// why, when it is refused; then nothing changed.
    pub(super) fn add_join_token(&mut self, secret_sha256: &str, expires_ms: u64, created_by: &str, now_ms: u64) -> Result<(), String> {
        if secret_sha256.len() != 64 || !secret_sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("a join token is kept as a 64-digit SHA-256".into());
        }
        if self.join_tokens.len() >= JOIN_TOKENS_MAX {
            // Forget the oldest expired or revoked token; refuse when all are live.
            let Some(old) = self.join_tokens.values().find(|t| t.revoked || t.expires_ms <= now_ms).map(|t| t.id) else {
                return Err(format!("{JOIN_TOKENS_MAX} live join tokens: revoke some first"));
            };
            self.join_tokens.remove(&old);
        }
        let id = self.next_token_id;
        self.next_token_id += 1;
        self.join_tokens.insert(
            id,
            proto::JoinTokenRecord {
                id,
                secret_sha256: secret_sha256.to_ascii_lowercase(),
                created_ms: now_ms,
                expires_ms,
                created_by: created_by.to_string(),
                revoked: false,
            },
        );
        Ok(())
    }

    /// `RevokeJoinToken`: marks token `id` revoked.
    pub(super) fn revoke_join_token(&mut self, id: u64) -> CommandResult {
        match self.join_tokens.get_mut(&id) {
            Some(t) => {
                t.revoked = true;
                CommandResult::Ok
            }
            None => rejected(format!("no join token {id}")),
        }
    }

    /// `RevokeCert`: refuses the certificate with `fingerprint` (if not empty) and every
    /// certificate of `node` (if given), for `reason`. `Err`, with why, when
    /// `REVOKED_CERTS_MAX` are revoked already; then nothing changed.
    pub(super) fn revoke_cert(&mut self, fingerprint: &str, node: Option<&str>, reason: &str) -> Result<(), String> {
        if self.revoked_certs.len() + self.revoked_nodes.len() >= REVOKED_CERTS_MAX && !self.revoked_certs.contains_key(fingerprint) {
            return Err(format!("{REVOKED_CERTS_MAX} certificates are revoked already"));
        }
        if !fingerprint.is_empty() {
            self.revoked_certs.insert(fingerprint.to_ascii_lowercase(), reason.to_string());
        }
        if let Some(name) = node {
            self.revoked_nodes.insert(name.to_string(), reason.to_string());
        }
        Ok(())
    }
}
