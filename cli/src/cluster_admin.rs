//! `corral cluster init|join|issue-node|issue-client|token`: setting up a cluster on real
//! machines. `init` makes the cluster CA, the first node's certificate and `node.toml` (with
//! `bootstrap = true`) and prints a join token; `join` checks a token and a node bundle against
//! each other and against a running node, then writes the joining node's files.
//!
//! A join token is `corral-join:v1:<ca-sha256-hex>:<secret-hex>:<expiry-unix>`. The secret is
//! the cluster's `join_token`; the fingerprint pins the cluster CA, so a joining node trusts
//! nothing but the CA the token names. The expiry is checked by `corral cluster join` only:
//! nodes do not know about tokens yet (see `deploy/README.md`, "Limits").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use proto::{ClientRequest, Envelope, PeerRequest, Reply};
use serde::{Deserialize, Serialize};
use transport::pki::{self, PemPair, TlsIdentity, TlsPaths};

use crate::client::ClientConfig;

/// Prefix and version of a join token.
pub const TOKEN_PREFIX: &str = "corral-join:v1:";
const SECRET_BYTES: usize = 32;

#[derive(Clone, Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// Create a new cluster on this machine: the cluster CA, this node's certificate,
    /// node.toml with bootstrap = true, an admin client certificate and client.toml; prints a
    /// join token.
    Init(InitArgs),
    /// Prepare this machine to join a cluster: check the token, pin the cluster CA it names,
    /// check that the node given with the global --server serves a certificate of that CA, and
    /// write node.toml (bootstrap = false).
    Join(JoinArgs),
    /// Issue a node certificate bundle (CA certificate, node certificate and key) for a machine
    /// that will join; run where the CA key is (the first node).
    IssueNode(IssueNodeArgs),
    /// Issue a user's client certificate and a ready cluster directory (client.toml) for it.
    IssueClient(IssueClientArgs),
    /// Join tokens.
    #[command(subcommand)]
    Token(TokenCmd),
    /// What the node asked (`--server`) holds: jobs in its hot state, records in its accounting
    /// store and their digest (equal on voters that applied the same log).
    Digest,
    /// Refuse a certificate from now on, on every node: a node's (by name) or any by fingerprint.
    Revoke {
        #[arg(long, conflicts_with = "fingerprint", required_unless_present = "fingerprint")]
        node: Option<String>,
        #[arg(long)]
        fingerprint: Option<String>,
    },
}

#[derive(Clone, Debug, clap::Subcommand)]
pub enum TokenCmd {
    /// A new join token in the cluster's log (admins): a machine enrols with it alone
    /// (`corral cluster join --token T --server ADDR`) until it expires or is revoked. With
    /// --offline, the cluster-secret token of `--dir`'s node.toml instead (for --bundle joins).
    Create {
        /// How long the token is good for: 3600, 90s, 30m, 24h, 7d.
        #[arg(long, default_value = "24h")]
        ttl: String,
        #[arg(long)]
        offline: bool,
        /// With --offline: the configuration directory (holds ca.crt and node.toml).
        #[arg(long, default_value = "/etc/corral")]
        dir: PathBuf,
    },
    /// The join tokens in the log (admins): id, creator, expiry, revoked.
    List,
    /// Revoke a join token (admins): no machine enrols with it any more.
    Revoke { id: u64 },
    /// Show what a token holds (CA fingerprint, expiry); the secret is not printed.
    Inspect { token: String },
}

#[derive(Clone, Debug, clap::Args)]
pub struct NodeSettings {
    /// Unique node name, [A-Za-z0-9._-], at most 64 characters.
    #[arg(long)]
    pub name: String,
    /// Address the QUIC port binds to, e.g. 10.0.0.11:7100.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Address other nodes and clients reach this node at (default: --listen; needed when
    /// --listen is 0.0.0.0 or [::]).
    #[arg(long)]
    pub advertise: Option<String>,
    /// More names or addresses for this node's certificate.
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// Raft log, snapshots, job output and the launch ledger.
    #[arg(long, default_value = "/var/lib/corral")]
    pub data_dir: PathBuf,
    /// GPUs of this node: `auto` (NVML), `none`, or a simulated inventory like `h100:8`.
    #[arg(long, default_value = "auto")]
    pub gpus: String,
    #[arg(long, default_value_t = 3)]
    pub voters_max: usize,
    /// Prometheus metrics at http://ADDR/metrics (e.g. 0.0.0.0:9400).
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// User that runs corrald and must read node.key and node.toml, when not root (then set
    /// `run_as_user = false`: jobs run as that user).
    #[arg(long)]
    pub owner: Option<String>,
    /// The local socket for the CLI on this node (deployed nodes: /run/corral/corral.sock;
    /// default DATA_DIR/corral.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Where each run's files go: a tmpfs such as /run/corral/jobs (systemd's
    /// RuntimeDirectory; default DATA_DIR/jobs, on disk).
    #[arg(long)]
    pub runtime_dir: Option<PathBuf>,
    /// Overwrite files left by an earlier init or join.
    #[arg(long)]
    pub force: bool,
}

#[derive(Clone, Debug, clap::Args)]
pub struct InitArgs {
    /// Configuration directory to write (ca.crt, ca.key, node.crt, node.key, node.toml,
    /// client.crt, client.key, client.toml).
    #[arg(long, default_value = "/etc/corral")]
    pub dir: PathBuf,
    /// Cluster name (`SLURM_CLUSTER_NAME` of jobs, and the CA's name).
    #[arg(long, default_value = "corral")]
    pub cluster_name: String,
    /// User named in the admin client certificate (client.crt).
    #[arg(long, default_value = "root")]
    pub admin_user: String,
    /// How long the printed join token is good for: 3600, 90s, 30m, 24h, 7d.
    #[arg(long, default_value = "24h")]
    pub token_ttl: String,
    #[command(flatten)]
    pub node: NodeSettings,
}

#[derive(Clone, Debug, clap::Args)]
pub struct JoinArgs {
    /// Configuration directory to write (ca.crt, node.crt, node.key, node.toml).
    #[arg(long, default_value = "/etc/corral")]
    pub dir: PathBuf,
    /// The join token printed by `corral cluster init` or `corral cluster token create`.
    #[arg(long, env = "CORRAL_JOIN_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The node bundle made by `corral cluster issue-node` for this machine.
    #[arg(long)]
    pub bundle: Option<PathBuf>,
    /// Cluster name (must match the first node's).
    #[arg(long, default_value = "corral")]
    pub cluster_name: String,
    /// Write the files without asking --server first (e.g. the first node is not up yet).
    #[arg(long)]
    pub no_check: bool,
    #[command(flatten)]
    pub node: NodeSettings,
}

#[derive(Clone, Debug, clap::Args)]
pub struct IssueNodeArgs {
    /// Configuration directory holding ca.crt and ca.key.
    #[arg(long, default_value = "/etc/corral")]
    pub dir: PathBuf,
    /// Name of the node the certificate is for.
    #[arg(long)]
    pub name: String,
    /// Addresses and DNS names of that node (its --listen / --advertise host).
    #[arg(long = "host")]
    pub hosts: Vec<String>,
    /// Bundle file to write (mode 0600); default NAME.bundle in the current directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Clone, Debug, clap::Args)]
pub struct IssueClientArgs {
    /// Configuration directory holding ca.crt, ca.key and client.toml.
    #[arg(long, default_value = "/etc/corral")]
    pub dir: PathBuf,
    /// User the certificate is for (common name `user:USER`).
    #[arg(long)]
    pub user: String,
    /// Directory to write ca.crt, USER.crt, USER.key and client.toml into (made if missing).
    #[arg(long)]
    pub out: PathBuf,
}

/// A parsed join token.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken {
    /// Hex SHA-256 of the cluster CA certificate's DER.
    pub ca_fingerprint: String,
    /// The cluster's join secret (hex).
    pub secret: String,
    /// Unix seconds after which `corral cluster join` refuses the token.
    pub expires_unix: u64,
}

impl std::fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinToken")
            .field("ca_fingerprint", &self.ca_fingerprint)
            .field("secret", &"[elided]")
            .field("expires_unix", &self.expires_unix)
            .finish()
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

impl JoinToken {
    pub fn parse(text: &str) -> anyhow::Result<JoinToken> {
        let text = text.trim();
        let Some(rest) = text.strip_prefix(TOKEN_PREFIX) else {
            bail!("a join token starts with '{TOKEN_PREFIX}'");
        };
        let parts: Vec<&str> = rest.split(':').collect();
        let [fingerprint, secret, expiry] = parts.as_slice() else {
            bail!("a join token is {TOKEN_PREFIX}<ca-fingerprint>:<secret>:<expiry>, found {} fields after the prefix", parts.len());
        };
        if fingerprint.len() != 64 || !is_lower_hex(fingerprint) {
            bail!("the token's CA fingerprint must be 64 lowercase hex digits (SHA-256)");
        }
        if secret.len() < 32 || secret.len() > 256 || !is_lower_hex(secret) {
            bail!("the token's secret must be 32 to 256 lowercase hex digits");
        }
        let expires_unix: u64 = expiry.parse().with_context(|| format!("parse the token's expiry '{expiry}' as Unix seconds"))?;
        Ok(JoinToken { ca_fingerprint: fingerprint.to_string(), secret: secret.to_string(), expires_unix })
    }

    pub fn render(&self) -> String {
        format!("{TOKEN_PREFIX}{}:{}:{}", self.ca_fingerprint, self.secret, self.expires_unix)
    }

    /// Refuses a token whose expiry has passed at `now_unix`.
    pub fn check_fresh(&self, now_unix: u64) -> anyhow::Result<()> {
        if now_unix >= self.expires_unix {
            bail!(
                "the join token expired {} s ago; make a new one with `corral cluster token create` on the first node",
                now_unix - self.expires_unix
            );
        }
        Ok(())
    }

    /// Refuses a CA certificate that is not the one the token pins.
    pub fn check_ca(&self, ca_cert_pem: &str) -> anyhow::Result<()> {
        let actual = pki::ca_fingerprint(ca_cert_pem).context("fingerprint the CA certificate")?;
        if actual != self.ca_fingerprint {
            bail!("CA certificate fingerprint {actual} is not the one in the join token ({}): refusing to trust it", self.ca_fingerprint);
        }
        Ok(())
    }
}

/// `3600`, `90s`, `30m`, `24h`, `7d`.
pub fn parse_ttl(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let (digits, unit) = match text.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => text.split_at(i),
        None => (text, "s"),
    };
    let n: u64 = digits.parse().with_context(|| format!("parse duration '{text}' (e.g. 3600, 90s, 30m, 24h, 7d)"))?;
    let secs = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3600),
        "d" => n.saturating_mul(86_400),
        other => bail!("unknown unit '{other}' in duration '{text}' (s, m, h, d)"),
    };
    if secs == 0 {
        bail!("a token must be good for at least one second");
    }
    Ok(Duration::from_secs(secs))
}

fn now_unix() -> anyhow::Result<u64> {
    Ok(SystemTime::now().duration_since(UNIX_EPOCH).context("read the clock")?.as_secs())
}

fn new_secret() -> String {
    let bytes: [u8; SECRET_BYTES] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What `node.toml` holds when written by `init` or `join`.
#[derive(Serialize)]
struct NodeToml {
    name: String,
    cluster_name: String,
    listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    advertise: Option<String>,
    data_dir: String,
    bootstrap: bool,
    join: Vec<String>,
    join_token: String,
    gpus: String,
    voters_max: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    metrics_listen: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    socket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_key: Option<String>,
    tls: TlsPaths,
}

/// The part of a `node.toml` that `token create` reads back.
#[derive(Deserialize)]
struct NodeTomlSecret {
    join_token: String,
    #[serde(default)]
    cluster_name: Option<String>,
}

/// A node certificate bundle: what `issue-node` writes and `join --bundle` reads.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeBundle {
    name: String,
    ca_cert: String,
    cert: String,
    key: String,
}

fn read(path: &Path, what: &str) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("read {what} at {}", path.display()))
}

fn write_file(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("open {} for writing", path.display()))?;
    file.set_permissions(std::fs::Permissions::from_mode(mode)).with_context(|| format!("set the mode of {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("write {}", path.display()))?;
    file.sync_all().with_context(|| format!("sync {}", path.display()))
}

fn create_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o750).create(dir).with_context(|| format!("create directory {}", dir.display()))
}

/// uid and gid of `user`, or `None` when there is no such user.
fn lookup_user(user: &str) -> anyhow::Result<Option<(u32, u32)>> {
    let name = std::ffi::CString::new(user).with_context(|| format!("use '{user}' as a user name"))?;
    // SAFETY: getpwnam returns a pointer to static storage or null; it is read at once, and this
    // command has no other thread calling getpwnam.
    let entry = unsafe { libc::getpwnam(name.as_ptr()) };
    if entry.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null pointer from getpwnam, read before any other libc call.
    let (uid, gid) = unsafe { ((*entry).pw_uid, (*entry).pw_gid) };
    Ok(Some((uid, gid)))
}

/// The user that must own node.key and node.toml: `--owner`, else nobody (the files stay with
/// the current user: root, who runs corrald to start jobs as their users).
fn resolve_owner(owner: Option<&str>) -> anyhow::Result<Option<(String, u32, u32)>> {
    match owner {
        None | Some("") => Ok(None),
        Some(user) => match lookup_user(user)? {
            Some((uid, gid)) => Ok(Some((user.to_string(), uid, gid))),
            None => bail!("no user '{user}' on this machine"),
        },
    }
}

fn chown(path: &Path, uid: u32, gid: u32) -> anyhow::Result<()> {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).with_context(|| format!("change the owner of {}", path.display()))
}

/// Refuses to overwrite files of an earlier init or join unless `force`.
fn check_fresh_dir(dir: &Path, names: &[&str], force: bool) -> anyhow::Result<()> {
    if force {
        return Ok(());
    }
    let present: Vec<&str> = names.iter().copied().filter(|n| dir.join(n).exists()).collect();
    if !present.is_empty() {
        bail!(
            "{} already holds {} (pass --force to overwrite; a running node's files should not be replaced)",
            dir.display(),
            present.join(", ")
        );
    }
    Ok(())
}

/// The host part of `host:port` (brackets of an IPv6 address removed).
fn host_of(addr: &str) -> String {
    match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host.trim_start_matches('[').trim_end_matches(']').to_string(),
        _ => addr.to_string(),
    }
}

fn machine_hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_string()).filter(|h| !h.is_empty())
}

impl NodeSettings {
    /// The address others dial: --advertise, else --listen when it names a real address.
    fn advertise_addr(&self) -> anyhow::Result<String> {
        match &self.advertise {
            Some(a) => {
                if !a.contains(':') {
                    bail!("--advertise must be HOST:PORT, not '{a}'");
                }
                Ok(a.clone())
            }
            None if self.listen.ip().is_unspecified() => {
                bail!("--listen {} is a wildcard address: give --advertise HOST:PORT that other machines reach", self.listen)
            }
            None => Ok(self.listen.to_string()),
        }
    }

    /// Names the node's certificate carries: its advertised host, its listen address, its
    /// hostname and every --host.
    fn cert_hosts(&self) -> anyhow::Result<Vec<String>> {
        let mut hosts = vec![host_of(&self.advertise_addr()?)];
        if !self.listen.ip().is_unspecified() {
            hosts.push(self.listen.ip().to_string());
        }
        hosts.extend(machine_hostname());
        hosts.extend(self.hosts.iter().cloned());
        hosts.dedup();
        Ok(hosts)
    }

    fn node_toml(&self, cluster_name: &str, bootstrap: bool, join: Vec<String>, secret: &str) -> anyhow::Result<String> {
        let advertise = self.advertise.clone();
        let config = NodeToml {
            name: self.name.clone(),
            cluster_name: cluster_name.to_string(),
            listen: self.listen.to_string(),
            advertise,
            data_dir: self.data_dir.display().to_string(),
            bootstrap,
            join,
            join_token: secret.to_string(),
            gpus: self.gpus.clone(),
            voters_max: self.voters_max,
            metrics_listen: self.metrics_listen.map(|a| a.to_string()),
            socket: self.socket.as_ref().map(|p| p.display().to_string()),
            runtime_dir: self.runtime_dir.as_ref().map(|p| p.display().to_string()),
            // The first node keeps the CA key and signs the certificates of enrolling machines.
            ca_key: bootstrap.then(|| "ca.key".to_string()),
            tls: TlsPaths { ca_cert: "ca.crt".into(), cert: "node.crt".into(), key: "node.key".into() },
        };
        let body = toml::to_string(&config).context("encode node.toml")?;
        let role = if bootstrap { "first node (bootstrap)" } else { "joining node" };
        Ok(format!(
            "# corrald configuration of node {}, {role}. Written by `corral cluster {}`.\n\
             # Every field is described in deploy/README.md; paths are relative to this file.\n\
             # join_token is the cluster's join secret: keep this file readable by corrald only.\n\n{body}",
            self.name,
            if bootstrap { "init" } else { "join" }
        ))
    }

    fn validate(&self) -> anyhow::Result<()> {
        if self.name.is_empty() || self.name.len() > 64 || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            bail!("node name '{}' must be 1-64 characters of [A-Za-z0-9._-]", self.name);
        }
        if ![1, 3, 5].contains(&self.voters_max) {
            bail!("--voters-max must be 1, 3 or 5, not {}", self.voters_max);
        }
        self.advertise_addr()?;
        Ok(())
    }
}

/// Writes the node's own files (CA certificate, node certificate and key, node.toml) into `dir`
/// and hands the ones corrald reads to `owner`.
fn write_node_files(
    dir: &Path,
    ca_cert_pem: &str,
    node: &PemPair,
    node_toml: &str,
    owner: Option<&(String, u32, u32)>,
) -> anyhow::Result<()> {
    write_file(&dir.join("ca.crt"), ca_cert_pem, 0o644)?;
    pki::write_pem_pair(dir, "node", node)?;
    write_file(&dir.join("node.toml"), node_toml, 0o600)?;
    if let Some((_, uid, gid)) = owner {
        for name in ["node.crt", "node.key", "node.toml"] {
            chown(&dir.join(name), *uid, *gid)?;
        }
    }
    Ok(())
}

fn write_client_dir(out: &Path, ca_cert_pem: &str, stem: &str, pair: &PemPair, servers: Vec<String>) -> anyhow::Result<()> {
    create_dir(out)?;
    write_file(&out.join("ca.crt"), ca_cert_pem, 0o644)?;
    pki::write_pem_pair(out, stem, pair)?;
    let config = ClientConfig {
        servers,
        tls: TlsPaths { ca_cert: "ca.crt".into(), cert: format!("{stem}.crt").into(), key: format!("{stem}.key").into() },
        metrics: Vec::new(),
    };
    let text = toml::to_string(&config).context("encode client.toml")?;
    write_file(&out.join("client.toml"), &format!("# corral client configuration (`corral --cluster {}`).\n{text}", out.display()), 0o644)
}

fn load_ca(dir: &Path) -> anyhow::Result<PemPair> {
    Ok(PemPair {
        cert_pem: read(&dir.join("ca.crt"), "CA certificate")?,
        key_pem: read(&dir.join("ca.key"), "CA key (run this where `corral cluster init` ran)")?,
    })
}

pub async fn run(
    cmd: ClusterCmd,
    server: Option<&str>,
    json: bool,
    connect: &dyn Fn() -> anyhow::Result<crate::client::Cluster>,
) -> anyhow::Result<()> {
    let patience = Duration::from_secs(10);
    match cmd {
        ClusterCmd::Init(args) => init(&args, json),
        ClusterCmd::Join(args) => join(&args, server, json).await,
        ClusterCmd::IssueNode(args) => issue_node(&args),
        ClusterCmd::IssueClient(args) => issue_client(&args),
        ClusterCmd::Token(TokenCmd::Create { ttl, offline: true, dir }) => {
            let token = token_for(&dir, parse_ttl(&ttl)?)?;
            print_token(&token, json);
            Ok(())
        }
        ClusterCmd::Token(TokenCmd::Create { ttl, offline: false, .. }) => create_token(&connect()?, &ttl, json, patience).await,
        ClusterCmd::Token(TokenCmd::List) => {
            let Reply::JoinTokens(tokens) = connect()?.call_patiently(ClientRequest::ListJoinTokens, patience).await? else {
                bail!("unexpected reply to the token list");
            };
            print_token_list(&tokens, json)
        }
        ClusterCmd::Token(TokenCmd::Revoke { id }) => {
            connect()?.call_patiently(ClientRequest::RevokeJoinToken { id }, patience).await?;
            eprintln!("join token {id} revoked");
            Ok(())
        }
        ClusterCmd::Digest => {
            let reply = connect()?.call_patiently(ClientRequest::AccountingDigest, patience).await?;
            print_digest(reply, json)
        }
        ClusterCmd::Revoke { node, fingerprint } => {
            let what = node.clone().map(|n| format!("node {n}")).or_else(|| fingerprint.clone()).unwrap_or_default();
            connect()?.call_patiently(ClientRequest::RevokeCert { node, fingerprint }, patience).await?;
            eprintln!("certificate of {what} revoked: every node refuses it from now on");
            Ok(())
        }
        ClusterCmd::Token(TokenCmd::Inspect { token }) => inspect_token(&token, json),
    }
}

/// `corral cluster token create` (not `--offline`): a new join token in the cluster's log,
/// valid for `ttl`; prints it (and, without `json`, how to use it).
async fn create_token(cluster: &crate::client::Cluster, ttl: &str, json: bool, patience: Duration) -> anyhow::Result<()> {
    let ttl_ms = parse_ttl(ttl)?.as_millis() as u64;
    let Reply::JoinTokenCreated { id, secret, expires_ms } =
        cluster.call_patiently(ClientRequest::CreateJoinToken { ttl_ms }, patience).await?
    else {
        bail!("unexpected reply to the token request");
    };
    let token = JoinToken { ca_fingerprint: cluster.ca_fingerprint()?, secret, expires_unix: expires_ms / 1000 };
    if json {
        println!(
            "{}",
            serde_json::json!({"id": id, "token": token.render(), "ca_fingerprint": token.ca_fingerprint, "expires_unix": token.expires_unix})
        );
    } else {
        println!("{}", token.render());
        eprintln!("join token {id}; on a new machine: corral cluster join --token TOKEN --server ADDR --name NAME --listen ADDR:7100");
    }
    Ok(())
}

/// Prints the cluster's join tokens: a JSON array, or a table with each one's state (live,
/// expired, revoked).
fn print_token_list(tokens: &[proto::JoinTokenRecord], json: bool) -> anyhow::Result<()> {
    if json {
        let list: Vec<_> = tokens
            .iter()
            .map(|t| serde_json::json!({"id": t.id, "created_by": t.created_by, "created_ms": t.created_ms, "expires_ms": t.expires_ms, "revoked": t.revoked}))
            .collect();
        println!("{}", serde_json::Value::Array(list));
    } else {
        println!("{:>4}  {:<12} {:>15}  STATE", "ID", "CREATED BY", "EXPIRES (UNIX)");
        let now_ms = now_unix()? * 1000;
        for t in tokens {
            let state = if t.revoked {
                "revoked"
            } else if t.expires_ms <= now_ms {
                "expired"
            } else {
                "live"
            };
            println!("{:>4}  {:<12} {:>15}  {state}", t.id, t.created_by, t.expires_ms / 1000);
        }
    }
    Ok(())
}

/// Prints a node's answer to `cluster digest` (its hot state and accounting store).
fn print_digest(reply: Reply, json: bool) -> anyhow::Result<()> {
    let Reply::AccountingDigest { node, applied_index, hot_jobs, records, digest, disk_bytes } = reply else {
        bail!("unexpected reply {reply:?}")
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"node": node, "applied_index": applied_index, "hot_jobs": hot_jobs, "accounting_records": records, "accounting_digest": digest, "accounting_disk_bytes": disk_bytes})
        );
    } else {
        println!(
            "{node}: applied {applied_index}, {hot_jobs} jobs in the hot state, {records} accounting records ({disk_bytes} bytes on disk), digest {digest}"
        );
    }
    Ok(())
}

/// `corral cluster token inspect`: what a join token says (the CA it pins, when it expires).
fn inspect_token(token: &str, json: bool) -> anyhow::Result<()> {
    let token = JoinToken::parse(token)?;
    let now = now_unix()?;
    if json {
        println!(
            "{}",
            serde_json::json!({"ca_fingerprint": token.ca_fingerprint, "expires_unix": token.expires_unix, "expired": now >= token.expires_unix})
        );
    } else {
        println!("ca fingerprint: {}", token.ca_fingerprint);
        let left = token.expires_unix.saturating_sub(now);
        println!("expires:        {} (Unix; {})", token.expires_unix, if left == 0 { "expired".into() } else { format!("in {left} s") });
    }
    Ok(())
}

fn print_token(token: &JoinToken, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::json!({"token": token.render(), "ca_fingerprint": token.ca_fingerprint, "expires_unix": token.expires_unix})
        );
    } else {
        println!("{}", token.render());
    }
}

/// A new token for the cluster configured in `dir` (its CA and join secret).
fn token_for(dir: &Path, ttl: Duration) -> anyhow::Result<JoinToken> {
    let ca = read(&dir.join("ca.crt"), "CA certificate")?;
    let node_toml = dir.join("node.toml");
    let parsed: NodeTomlSecret =
        toml::from_str(&read(&node_toml, "node config")?).with_context(|| format!("read join_token from {}", node_toml.display()))?;
    let _ = parsed.cluster_name;
    if parsed.join_token.len() < 32 || !is_lower_hex(&parsed.join_token) {
        bail!(
            "the join_token in {} is not 32+ lowercase hex digits, so it cannot go in a v1 token; set one (on every node) or re-run init",
            node_toml.display()
        );
    }
    Ok(JoinToken {
        ca_fingerprint: pki::ca_fingerprint(&ca).context("fingerprint the cluster CA")?,
        secret: parsed.join_token,
        expires_unix: now_unix()?.saturating_add(ttl.as_secs()),
    })
}

fn init(args: &InitArgs, json: bool) -> anyhow::Result<()> {
    let node = &args.node;
    node.validate()?;
    let ttl = parse_ttl(&args.token_ttl)?;
    let owner = resolve_owner(node.owner.as_deref())?;
    let dir = &args.dir;
    check_fresh_dir(dir, &["ca.key", "ca.crt", "node.toml", "node.key", "client.toml"], node.force)?;
    create_dir(dir)?;

    let ca = pki::generate_ca(&args.cluster_name).context("generate the cluster CA")?;
    pki::write_pem_pair(dir, "ca", &ca)?;
    let cert = pki::issue_node_cert(&ca, &node.name, &node.cert_hosts()?).context("issue this node's certificate")?;
    let secret = new_secret();
    let node_toml = node.node_toml(&args.cluster_name, true, Vec::new(), &secret)?;
    write_node_files(dir, &ca.cert_pem, &cert, &node_toml, owner.as_ref())?;
    let admin = pki::issue_client_cert(&ca, &args.admin_user).context("issue the admin client certificate")?;
    write_client_dir(dir, &ca.cert_pem, "client", &admin, vec![node.advertise_addr()?])?;

    let token = JoinToken {
        ca_fingerprint: pki::ca_fingerprint(&ca.cert_pem).context("fingerprint the cluster CA")?,
        secret,
        expires_unix: now_unix()?.saturating_add(ttl.as_secs()),
    };
    if json {
        println!(
            "{}",
            serde_json::json!({
                "dir": dir.display().to_string(),
                "node": node.name,
                "advertise": node.advertise_addr()?,
                "ca_fingerprint": token.ca_fingerprint,
                "token": token.render(),
                "expires_unix": token.expires_unix,
                "owner": owner.as_ref().map(|o| o.0.clone()),
            })
        );
    } else {
        eprintln!(
            "created cluster '{}' in {}: CA, node {} (bootstrap), admin client '{}'",
            args.cluster_name,
            dir.display(),
            node.name,
            args.admin_user
        );
        eprintln!("CA fingerprint: {}", token.ca_fingerprint);
        if let Some((user, _, _)) = &owner {
            eprintln!("node.key and node.toml belong to '{user}'");
        }
        eprintln!("start it: systemctl enable --now corrald");
        eprintln!("then, for each machine to join with a token alone: corral cluster token create --ttl 1h");
        eprintln!("offline join token, with a bundle from `corral cluster issue-node` (good for {} s):", ttl.as_secs());
        println!("{}", token.render());
    }
    Ok(())
}

fn issue_node(args: &IssueNodeArgs) -> anyhow::Result<()> {
    let ca = load_ca(&args.dir)?;
    let mut hosts = args.hosts.clone();
    if hosts.is_empty() {
        eprintln!("note: no --host given: the certificate names only '{}' and {}", args.name, pki::SERVER_NAME);
    }
    hosts.dedup();
    let cert = pki::issue_node_cert(&ca, &args.name, &hosts).with_context(|| format!("issue a certificate for node {}", args.name))?;
    let bundle = NodeBundle { name: args.name.clone(), ca_cert: ca.cert_pem.clone(), cert: cert.cert_pem, key: cert.key_pem };
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from(format!("{}.bundle", args.name)));
    let text = toml::to_string(&bundle).context("encode node bundle")?;
    write_file(
        &out,
        &format!(
            "# corral node bundle for {}: holds a private key, copy it securely and delete it after `corral cluster join`.\n{text}",
            args.name
        ),
        0o600,
    )?;
    eprintln!(
        "wrote {} (mode 0600); on node {}: corral cluster join --bundle {} --token TOKEN ...",
        out.display(),
        args.name,
        out.display()
    );
    Ok(())
}

fn issue_client(args: &IssueClientArgs) -> anyhow::Result<()> {
    let ca = load_ca(&args.dir)?;
    let servers = match ClientConfig::load(&args.dir.join("client.toml")) {
        Ok(c) => c.servers,
        Err(e) => bail!("{e:#}: issue-client copies the server list from the admin client.toml"),
    };
    let pair = pki::issue_client_cert(&ca, &args.user).with_context(|| format!("issue a client certificate for {}", args.user))?;
    write_client_dir(&args.out, &ca.cert_pem, &args.user, &pair, servers)?;
    eprintln!("wrote {}: corral --cluster {} queue", args.out.display(), args.out.display());
    Ok(())
}

/// Joins with the token alone: a key and a certificate request made here, signed by the node at
/// `server`, which must prove the CA the token names before the token's secret is sent.
async fn enroll(args: &JoinArgs, token: &JoinToken, server: &str, json: bool) -> anyhow::Result<()> {
    let node = &args.node;
    let owner = resolve_owner(node.owner.as_deref())?;
    let dir = &args.dir;
    check_fresh_dir(dir, &["node.toml", "node.key"], node.force)?;
    let request = pki::node_csr(&node.name, &node.cert_hosts()?).context("make a key and a certificate request")?;
    let envelope = Envelope {
        hops: 0,
        request: PeerRequest::Enroll { secret: token.secret.clone(), name: node.name.clone(), csr_pem: request.cert_pem.clone() }.into(),
        user: None,
    };
    let reply = transport::call_pinned(server, &token.ca_fingerprint, &envelope, Duration::from_secs(20))
        .await
        .with_context(|| format!("enrol at {server}"))?;
    let Reply::Enrolled { ca_cert_pem, cert_pem, join_secret, servers } = reply.map_err(|e| anyhow::anyhow!("enrol at {server}: {e}"))?
    else {
        bail!("enrol at {server}: unexpected reply");
    };
    token.check_ca(&ca_cert_pem)?;
    TlsIdentity::from_pems(&ca_cert_pem, &cert_pem, &request.key_pem).context("check the signed certificate against this machine's key")?;
    create_dir(dir)?;
    let mut join: Vec<String> = vec![server.to_string()];
    join.extend(servers.into_iter().filter(|s| s != server && *s != node.advertise_addr().unwrap_or_default()));
    let node_toml = node.node_toml(&args.cluster_name, false, join, &join_secret)?;
    let pair = PemPair { cert_pem: cert_pem.clone(), key_pem: request.key_pem };
    write_node_files(dir, &ca_cert_pem, &pair, &node_toml, owner.as_ref())?;
    let fingerprint = pki::cert_fingerprint(&cert_pem)?;
    if json {
        println!(
            "{}",
            serde_json::json!({"dir": dir.display().to_string(), "node": node.name, "server": server, "ca_fingerprint": token.ca_fingerprint, "cert_fingerprint": fingerprint, "enrolled": true})
        );
    } else {
        eprintln!(
            "enrolled at {server} (CA {}): certificate {fingerprint}; wrote {}/node.toml for node {}; start it: systemctl enable --now corrald",
            token.ca_fingerprint,
            dir.display(),
            node.name
        );
    }
    Ok(())
}

async fn join(args: &JoinArgs, server: Option<&str>, json: bool) -> anyhow::Result<()> {
    let node = &args.node;
    node.validate()?;
    let token = JoinToken::parse(&args.token).context("read the join token")?;
    token.check_fresh(now_unix()?)?;
    let Some(server) = server else {
        bail!("give the address of a cluster node with --server HOST:PORT");
    };
    let Some(bundle_path) = &args.bundle else {
        return enroll(args, &token, server, json).await;
    };
    let bundle: NodeBundle =
        toml::from_str(&read(bundle_path, "node bundle")?).with_context(|| format!("parse node bundle {}", bundle_path.display()))?;
    token.check_ca(&bundle.ca_cert)?;
    let identity = TlsIdentity::from_pems(&bundle.ca_cert, &bundle.cert, &bundle.key)
        .with_context(|| format!("load the bundle {}", bundle_path.display()))?;
    if identity.common_name() != node.name {
        bail!("the bundle is for node '{}', not '{}'", identity.common_name(), node.name);
    }
    let owner = resolve_owner(node.owner.as_deref())?;
    let dir = &args.dir;
    check_fresh_dir(dir, &["node.toml", "node.key"], node.force)?;

    let answer = if args.no_check { None } else { Some(check_server(&identity, server).await?) };

    create_dir(dir)?;
    let pair = PemPair { cert_pem: bundle.cert.clone(), key_pem: bundle.key.clone() };
    let node_toml = node.node_toml(&args.cluster_name, false, vec![server.to_string()], &token.secret)?;
    write_node_files(dir, &bundle.ca_cert, &pair, &node_toml, owner.as_ref())?;
    if json {
        println!(
            "{}",
            serde_json::json!({
                "dir": dir.display().to_string(),
                "node": node.name,
                "server": server,
                "ca_fingerprint": token.ca_fingerprint,
                "leader": answer.as_ref().and_then(|a| a.0.clone()),
                "answered_by": answer.as_ref().map(|a| a.1.clone()),
            })
        );
    } else {
        if let Some((leader, answered_by)) = &answer {
            eprintln!(
                "{server} is node '{answered_by}' of the cluster CA {} (leader: {})",
                token.ca_fingerprint,
                leader.as_deref().unwrap_or("none yet")
            );
        }
        eprintln!("wrote {}/node.toml for node {}; start it: systemctl enable --now corrald", dir.display(), node.name);
    }
    Ok(())
}

/// Asks `server` who it is over mutual TLS that trusts only the pinned CA; returns the leader
/// and the answering node's name.
async fn check_server(identity: &TlsIdentity, server: &str) -> anyhow::Result<(Option<String>, String)> {
    let endpoint =
        transport::endpoint("0.0.0.0:0".parse().context("parse bind address")?, identity, false).context("open client endpoint")?;
    let client = transport::Client::new(endpoint);
    let ask = Envelope { hops: 0, request: ClientRequest::ClusterInfo.into(), user: None };
    match client.call(server, &ask, Duration::from_secs(10)).await {
        Ok(Ok(Reply::Cluster(info))) => Ok((info.leader, info.answered_by)),
        Ok(Ok(other)) => bail!("{server} answered cluster info with {other:?}"),
        Ok(Err(e)) => bail!("{server} refused: {e}"),
        Err(e) => bail!(
            "reach {server} with the pinned CA: {e} (is corrald running there, is UDP open, does it serve a certificate of the token's CA?)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_bad_ones_are_refused() {
        let token = JoinToken { ca_fingerprint: "ab".repeat(32), secret: "0f".repeat(32), expires_unix: 1_900_000_000 };
        let text = token.render();
        assert!(text.starts_with("corral-join:v1:"));
        assert_eq!(JoinToken::parse(&text).expect("parse"), token);
        assert_eq!(JoinToken::parse(&format!("  {text}\n")).expect("parse padded"), token);
        assert!(!format!("{token:?}").contains(&token.secret), "Debug must not show the secret");

        for bad in [
            String::new(),
            text.replace("v1", "v2"),
            format!("corral-join:v1:{}:{}", "ab".repeat(32), "0f".repeat(32)),
            format!("corral-join:v1:{}:{}:1:2", "ab".repeat(32), "0f".repeat(32)),
            format!("corral-join:v1:{}:{}:1", "AB".repeat(32), "0f".repeat(32)),
            format!("corral-join:v1:{}:{}:1", "ab".repeat(31), "0f".repeat(32)),
            format!("corral-join:v1:{}:{}:1", "ab".repeat(32), "0f".repeat(8)),
            format!("corral-join:v1:{}:{}:soon", "ab".repeat(32), "0f".repeat(32)),
        ] {
            assert!(JoinToken::parse(&bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn expiry_and_ca_pinning_are_checked() {
        let ca = pki::generate_ca("pin").expect("ca");
        let other = pki::generate_ca("pin").expect("other ca");
        let token =
            JoinToken { ca_fingerprint: pki::ca_fingerprint(&ca.cert_pem).expect("fp"), secret: "0f".repeat(32), expires_unix: 1000 };
        token.check_fresh(999).expect("fresh before expiry");
        let err = format!("{:#}", token.check_fresh(1000).expect_err("expired"));
        assert!(err.contains("expired"), "{err}");
        token.check_ca(&ca.cert_pem).expect("the pinned CA");
        let err = format!("{:#}", token.check_ca(&other.cert_pem).expect_err("another CA"));
        assert!(err.contains("not the one in the join token"), "{err}");
    }

    #[test]
    fn ttls_parse() {
        assert_eq!(parse_ttl("3600").expect("plain"), Duration::from_secs(3600));
        assert_eq!(parse_ttl("90s").expect("s"), Duration::from_secs(90));
        assert_eq!(parse_ttl("30m").expect("m"), Duration::from_secs(1800));
        assert_eq!(parse_ttl("24h").expect("h"), Duration::from_secs(86_400));
        assert_eq!(parse_ttl("7d").expect("d"), Duration::from_secs(604_800));
        for bad in ["", "0", "h", "5w", "-1h"] {
            assert!(parse_ttl(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn host_of_strips_ports_and_brackets() {
        assert_eq!(host_of("10.0.0.1:7100"), "10.0.0.1");
        assert_eq!(host_of("[::1]:7100"), "::1");
        assert_eq!(host_of("gpu01.lan:7100"), "gpu01.lan");
    }
}
