//! Certificates: a node configured with the cluster CA signs a new node's certificate request
//! for a join token (`enroll`) and renewals; every node renews its own certificate before it
//! expires (`renew_certificate_loop`).

use super::*;

impl Node {
    /// Signs a node certificate for `name` from `csr_pem` with the cluster CA: (CA certificate,
    /// new certificate). Only a node configured with the CA key (`ca_key`) can.
    fn sign_with_ca(&self, name: &str, csr_pem: &str) -> Result<(String, String), ApiError> {
        let Some(ca_key) = &self.config.ca_key else {
            return Err(ApiError::Unavailable(format!(
                "node {} does not hold the cluster CA key: ask the node where `corral cluster init` ran",
                self.config.name
            )));
        };
        if csr_pem.len() > CSR_BYTES_MAX {
            return Err(ApiError::Invalid(format!("certificate request longer than {CSR_BYTES_MAX} bytes")));
        }
        let ca_cert_pem = std::fs::read_to_string(&self.config.tls.ca_cert)
            .map_err(|e| ApiError::Internal(format!("read {}: {e}", self.config.tls.ca_cert.display())))?;
        let ca_key_pem = std::fs::read_to_string(ca_key).map_err(|e| ApiError::Internal(format!("read {}: {e}", ca_key.display())))?;
        let ca = transport::pki::PemPair { cert_pem: ca_cert_pem.clone(), key_pem: ca_key_pem };
        let cert_pem = transport::pki::sign_node_csr(&ca, csr_pem, name).map_err(|e| ApiError::Invalid(format!("{e:#}")))?;
        Ok((ca_cert_pem, cert_pem))
    }

    /// Signs the certificate of a machine that presents a live join token from the log, for a
    /// name no member has.
    pub(super) fn enroll(&self, secret: &str, name: &str, csr_pem: &str) -> Response {
        let hash = sha256_hex(secret.as_bytes());
        let known = self.state.read(|s| s.live_join_token(&hash, now_ms()).map(|t| t.id));
        let Some(token) = known else {
            warn!(node = %name, "enrolment refused: unknown, expired or revoked join token");
            return Err(ApiError::Denied("the join token is unknown, expired or revoked".into()));
        };
        crate::config::validate_node_name(name).map_err(|e| ApiError::Invalid(format!("{e:#}")))?;
        if self.state.read(|s| s.nodes.values().any(|n| n.name == name)) {
            warn!(node = %name, token, "enrolment refused: the name is taken");
            return Err(ApiError::Denied(format!("a node named {name} is already a member: pick another name")));
        }
        let (ca_cert_pem, cert_pem) = self.sign_with_ca(name, csr_pem)?;
        let servers = self.state.read(|s| s.nodes.values().map(|n| n.addr.clone()).collect());
        info!(node = %name, token, "enrolled a node: certificate signed");
        Ok(Reply::Enrolled { ca_cert_pem, cert_pem, join_secret: self.config.join_token.clone(), servers })
    }

    /// Signs a new certificate for node `name` (the name its current certificate proves) from
    /// its request: rotation before expiry.
    pub(super) fn sign_renewal(&self, name: &str, csr_pem: &str) -> Response {
        let (ca_cert_pem, cert_pem) = self.sign_with_ca(name, csr_pem)?;
        info!(node = %name, "renewed a node certificate");
        Ok(Reply::Enrolled { ca_cert_pem, cert_pem, join_secret: String::new(), servers: Vec::new() })
    }
}

/// The longest a join token may live.
pub(super) const JOIN_TOKEN_TTL_MS_MAX: u64 = 30 * 24 * 3600 * 1000;
/// The largest certificate request accepted.
const CSR_BYTES_MAX: usize = 16 * 1024;

pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Renews this node's certificate before it expires, without a restart: every
/// `cert_check_interval_ms`, when fewer than `cert_renew_before_ms` are left, a new key and
/// request go to the members until one holding the CA key signs it; the files are replaced and
/// new connections, served and dialed, use it.
pub(super) async fn renew_certificate_loop(config: NodeConfig, endpoint: transport::quinn::Endpoint, client: Arc<Client>, node: Arc<Node>) {
    let mut last_error: Option<String> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(config.cert_check_interval_ms)).await;
        match renew_certificate_once(&config, &endpoint, &client, &node).await {
            Ok(None) => last_error = None,
            Ok(Some((old, new, not_after))) => {
                info!(old = %old, new = %new, not_after_unix = not_after, "certificate renewed");
                last_error = None;
            }
            Err(e) => {
                let msg = format!("{e:#}");
                if last_error.as_deref() != Some(&msg) {
                    warn!(error = %msg, "renew the node certificate");
                }
                last_error = Some(msg);
            }
        }
    }
}

/// One check: `Some((old fingerprint, new fingerprint, new expiry))` when renewed.
async fn renew_certificate_once(
    config: &NodeConfig,
    endpoint: &transport::quinn::Endpoint,
    client: &Client,
    node: &Node,
) -> anyhow::Result<Option<(String, String, i64)>> {
    use transport::pki;
    let cert_pem = std::fs::read_to_string(&config.tls.cert).with_context(|| format!("read {}", config.tls.cert.display()))?;
    let not_after = pki::not_after_unix(&cert_pem)?;
    let now_s = (now_ms() / 1000) as i64;
    if not_after.saturating_sub(now_s) > (config.cert_renew_before_ms / 1000) as i64 {
        return Ok(None);
    }
    let request = pki::node_csr(&config.name, &pki::cert_hosts(&cert_pem)?)?;
    let mut members: Vec<String> = node.state.read(|s| s.nodes.values().map(|n| n.addr.clone()).collect());
    let own = config.advertise_addr();
    members.sort_by_key(|a| *a != own);
    let envelope = Envelope { hops: 0, request: PeerRequest::RenewCert { csr_pem: request.cert_pem.clone() }.into(), user: None };
    let mut refusals = Vec::new();
    let mut signed = None;
    for addr in &members {
        match client.call(addr, &envelope, PEER_CALL_TIMEOUT).await {
            Ok(Ok(Reply::Enrolled { cert_pem, .. })) => {
                signed = Some(cert_pem);
                break;
            }
            Ok(other) => refusals.push(format!("{addr}: {other:?}")),
            Err(e) => refusals.push(format!("{addr}: {e}")),
        }
    }
    let Some(new_cert) = signed else { bail!("no member signed the renewal: {}", refusals.join("; ")) };
    let ca_pem = std::fs::read_to_string(&config.tls.ca_cert).with_context(|| format!("read {}", config.tls.ca_cert.display()))?;
    let identity = transport::TlsIdentity::from_pems(&ca_pem, &new_cert, &request.key_pem).context("check the renewed certificate")?;
    anyhow::ensure!(identity.common_name() == config.name, "the renewed certificate names {}, not {}", identity.common_name(), config.name);
    // Key first, then certificate, each replaced whole.
    for (path, text, mode) in [(&config.tls.key, &request.key_pem, 0o600), (&config.tls.cert, &new_cert, 0o644)] {
        let tmp = path.with_extension("renewed");
        std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .with_context(|| format!("chmod {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("replace {}", path.display()))?;
    }
    transport::reload_server_identity(endpoint, &identity)?;
    client.reload_identity(&identity)?;
    Ok(Some((pki::cert_fingerprint(&cert_pem)?, identity.fingerprint(), pki::not_after_unix(&new_cert)?)))
}
