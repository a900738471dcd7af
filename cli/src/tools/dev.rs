//! A local cluster of real `corrald` processes on 127.0.0.1, for development, tests and the
//! demo. `DIR/` holds the cluster CA and `client.toml`; `DIR/NODE/` holds each node's config,
//! certificate, data, log and `corrald.pid`.

use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{ClientRequest, NodeState, Reply};
use serde::Serialize;
use transport::pki::{self, PemPair, TlsPaths};

use crate::client::{ClientConfig, Cluster};

/// Knobs of a development cluster, written into each new node's `node.toml`.
#[derive(Clone, Debug, clap::Args)]
pub struct DevOptions {
    /// Number of nodes the cluster should have (new ones are added to an existing cluster).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Simulated GPUs per node, e.g. `h100:8`.
    #[arg(long, default_value = "h100:8")]
    pub gpus: String,
    #[arg(long, default_value_t = 3)]
    pub voters_max: usize,
    #[arg(long, default_value_t = 64)]
    pub cpus: u32,
    #[arg(long, default_value_t = 512 * 1024)]
    pub memory_mib: u64,
    #[arg(long, default_value_t = 200)]
    pub heartbeat_interval_ms: u64,
    #[arg(long, default_value_t = 3_000)]
    pub node_down_after_ms: u64,
    #[arg(long, default_value_t = 10_000)]
    pub voter_replace_after_ms: u64,
    #[arg(long, default_value_t = 2_000)]
    pub kill_grace_ms: u64,
    /// Build a Raft snapshot every this many log entries.
    #[arg(long, default_value_t = 1_000)]
    pub snapshot_logs: u64,
    /// How often each node samples its jobs' GPUs for accounting.
    #[arg(long, default_value_t = 1_000)]
    pub gpu_sample_interval_ms: u64,
    /// How long a finished job stays in the replicated hot state before it moves to the
    /// accounting store (Slurm's MinJobAge).
    #[arg(long, default_value_t = 300)]
    pub min_job_age_s: u64,
    /// Root of the per-job checkpoint directories of every node (shared storage in a real
    /// cluster; one directory here so a requeued job finds its checkpoint on any node).
    #[arg(long)]
    pub checkpoint_root: Option<PathBuf>,
    /// Run each job as its submitting user (needs root and the users' accounts on this host);
    /// by default a development cluster runs every job as the user who started it.
    #[arg(long)]
    pub run_as_user: bool,
    /// Wait at most this long for the cluster to be ready.
    #[arg(long, default_value_t = 60)]
    pub wait_s: u64,
    /// Device files standing for the simulated GPUs 0, 1, ... (comma list, e.g.
    /// `/dev/full,/dev/zero`): each job may open only its own GPUs' where the cgroup v1 devices
    /// controller is available.
    #[arg(long, value_delimiter = ',')]
    pub gpu_device_files: Vec<PathBuf>,
    /// Partitions every new node belongs to (`default`, where jobs without `--partition` go,
    /// and `gpu`, which the Slurm seed scripts name).
    #[arg(long, value_delimiter = ',', default_value = "default,gpu")]
    pub partitions: Vec<String>,
    /// Shards of each GPU (`shards_per_gpu`: jobs asking `--gres=shard:N` share a GPU).
    #[arg(long, default_value_t = 0)]
    pub shards_per_gpu: u32,
}

impl DevOptions {
    /// The 3-node cluster of `corral demo`, `corral bench` and `corral bench --processes`.
    pub(crate) fn three_nodes() -> DevOptions {
        DevOptions {
            nodes: 3,
            gpus: "h100:8".into(),
            voters_max: 3,
            cpus: 64,
            memory_mib: 512 * 1024,
            heartbeat_interval_ms: 200,
            node_down_after_ms: 3_000,
            voter_replace_after_ms: 600_000,
            kill_grace_ms: 1_000,
            snapshot_logs: 1_000,
            checkpoint_root: None,
            gpu_sample_interval_ms: 1_000,
            min_job_age_s: 300,
            wait_s: 60,
            run_as_user: false,
            gpu_device_files: Vec::new(),
            partitions: vec!["default".into(), "gpu".into()],
            shards_per_gpu: 0,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct RaftSection {
    heartbeat_interval_ms: u64,
    election_timeout_min_ms: u64,
    election_timeout_max_ms: u64,
    snapshot_logs_since_last: u64,
    max_in_snapshot_log_to_keep: u64,
}

#[derive(Serialize)]
struct NodeToml {
    name: String,
    listen: String,
    data_dir: String,
    tls: TlsPaths,
    bootstrap: bool,
    join: Vec<String>,
    join_token: String,
    gpus: String,
    cpus: u32,
    memory_mib: u64,
    voters_max: usize,
    heartbeat_interval_ms: u64,
    node_down_after_ms: u64,
    voter_replace_after_ms: u64,
    kill_grace_ms: u64,
    gpu_sample_interval_ms: u64,
    min_job_age_s: u64,
    admins: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    checkpoint_root: Option<String>,
    run_as_user: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_key: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gpu_device_files: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partitions: Vec<String>,
    #[serde(skip_serializing_if = "is_zero")]
    shards_per_gpu: u32,
    /// `DIR/hosts`: the nodes' names, for their jobs (they resolve nowhere else).
    job_hosts_file: String,
    /// Prometheus metrics over HTTP, on a port of its own per node.
    metrics_listen: String,
    /// Per-run files on a tmpfs where there is one (`dev_runtime_root`).
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_dir: Option<String>,
    raft: RaftSection,
}

/// Dev clusters keep their nodes' per-run files (`runtime_dir`) under here when it is a
/// writable tmpfs, in `corral-dev-RANDOM/NODE`; `dev down` removes them.
const DEV_RUNTIME_PARENT: &str = "/dev/shm";
const DEV_RUNTIME_PREFIX: &str = "corral-dev-";

/// A new directory for one dev cluster's runtime files, if `/dev/shm` is a writable tmpfs.
fn dev_runtime_root() -> Option<PathBuf> {
    let parent = Path::new(DEV_RUNTIME_PARENT);
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    let tmpfs = mounts.lines().any(|l| {
        let mut fields = l.split_whitespace();
        let (_, mount, kind) = (fields.next(), fields.next(), fields.next());
        mount == Some(DEV_RUNTIME_PARENT) && kind == Some("tmpfs")
    });
    if !tmpfs {
        return None;
    }
    let suffix: u64 = rand::random();
    let root = parent.join(format!("{DEV_RUNTIME_PREFIX}{suffix:016x}"));
    std::fs::create_dir(&root).ok()?;
    // Traversable, not listable: with `--run-as-user` a job's user reaches its own run's
    // directory (0700, theirs) below, as under the units' /run/corral (0755).
    std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o711)).ok()?;
    Some(root)
}

/// The runtime directory `dev up` gave a node, if it is one of ours to remove.
fn dev_runtime_dir(node_dir: &Path) -> Option<PathBuf> {
    let dir = PathBuf::from(read_node_toml(node_dir, "runtime_dir").ok()??);
    let root = dir.parent()?;
    let ours = root.parent() == Some(Path::new(DEV_RUNTIME_PARENT))
        && root.file_name().is_some_and(|n| n.to_string_lossy().starts_with(DEV_RUNTIME_PREFIX));
    ours.then_some(dir)
}

/// Writes `DIR/hosts`, which every node's jobs see as `/etc/hosts` (`job_hosts_file`): this
/// host's own `/etc/hosts`, then the nodes' names at their listen addresses.
fn write_hosts(dir: &Path, node_dirs: &[PathBuf]) -> anyhow::Result<()> {
    let mut text = std::fs::read_to_string("/etc/hosts").unwrap_or_else(|_| "127.0.0.1 localhost\n".into());
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("# corral dev up: the nodes of this cluster\n");
    for d in node_dirs {
        let name = d.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let listen = read_listen(d)?;
        let host = listen.rsplit_once(':').map_or(listen.as_str(), |(h, _)| h);
        text.push_str(&format!("{host} {name}\n"));
    }
    let path = dir.join("hosts");
    std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))
}

/// The lowest port a listener picked here may use.
const LISTEN_PORT_MIN: u16 = 20_000;

/// A port free for both UDP and TCP on 127.0.0.1, outside the kernel's ephemeral range where
/// it can: a port the kernel handed out for `bind(:0)` is released before `corrald` binds it,
/// and any process that binds `:0` meanwhile (every QUIC client does) may get it. Ports below
/// the ephemeral range are handed out only on request, so only another picker like this one
/// could take it, and each pick is random. Picked below the jobs' `MASTER_PORT`s and the
/// steps' rendezvous ports, which are handed out from there (a node's port there made a
/// job's TCPStore fail to bind, and torch abort, when all nodes share one host).
pub fn free_listen_port() -> anyhow::Result<u16> {
    let below = ephemeral_port_min().min(proto::MASTER_PORT_FIRST);
    if below > LISTEN_PORT_MIN + 1_000 {
        for _ in 0..256 {
            let port = rand::Rng::gen_range(&mut rand::thread_rng(), LISTEN_PORT_MIN..below);
            if port_is_free(port) && claim_port(port) {
                return Ok(port);
            }
        }
    }
    // No room below the ephemeral range (or all tried were taken): let the kernel pick.
    for _ in 0..64 {
        let port = UdpSocket::bind("127.0.0.1:0").context("find a free udp port")?.local_addr().context("read bound port")?.port();
        if port_is_free(port) && claim_port(port) {
            return Ok(port);
        }
    }
    bail!("found no port free for both UDP and TCP on 127.0.0.1")
}

/// How long a port handed out here stays claimed: far longer than a `corrald` takes to bind it.
const PORT_CLAIM_TTL: Duration = Duration::from_secs(60);

/// Claims `port` for this pick among every `corral dev up` on this host: a file per port handed
/// out in the last `PORT_CLAIM_TTL`, made with `O_EXCL`. A free port stays free until its
/// `corrald` binds it, so without a claim two clusters started at once (the test suite's two
/// threads), or two nodes of one, could both be handed it (seen: a node exiting at start with
/// "Address already in use"). Where the folder cannot be written, the bind check stands alone.
fn claim_port(port: u16) -> bool {
    let dir = std::env::temp_dir().join("corral-dev-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return true;
    }
    let path = dir.join(port.to_string());
    let create = || std::fs::OpenOptions::new().write(true).create_new(true).open(&path);
    match create() {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let age = path.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
            if age.is_some_and(|age| age < PORT_CLAIM_TTL) {
                return false;
            }
            // A stale claim: the first to remake the file takes the port.
            let _ = std::fs::remove_file(&path);
            create().is_ok()
        }
        Err(_) => true,
    }
}

fn port_is_free(port: u16) -> bool {
    UdpSocket::bind(("127.0.0.1", port)).is_ok() && TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// The first port of `net.ipv4.ip_local_port_range` (Linux's default when unreadable).
fn ephemeral_port_min() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|first| first.parse().ok()))
        .unwrap_or(32_768)
}

fn node_dirs(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    if !dir.exists() {
        return Ok(out);
    }
    for entry in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        let path = entry.with_context(|| format!("list {}", dir.display()))?.path();
        if path.join("node.toml").exists() {
            out.push(path);
        }
    }
    out.sort_by_key(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        (name.len(), name)
    });
    Ok(out)
}

fn read_listen(node_dir: &Path) -> anyhow::Result<String> {
    read_node_toml(node_dir, "listen")?.context("node.toml has no listen address")
}

/// The string `key` of a node's `node.toml`.
fn read_node_toml(node_dir: &Path, key: &str) -> anyhow::Result<Option<String>> {
    let text = std::fs::read_to_string(node_dir.join("node.toml")).with_context(|| format!("read {}/node.toml", node_dir.display()))?;
    let value: toml::Value = toml::from_str(&text).with_context(|| format!("parse {}/node.toml", node_dir.display()))?;
    Ok(value.get(key).and_then(|v| v.as_str()).map(str::to_string))
}

/// Each node's name and the address of its Prometheus metrics (`http://ADDR/metrics`), for
/// the nodes that serve them.
pub fn metrics_urls(dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for nd in node_dirs(dir)? {
        if let Some(addr) = read_node_toml(&nd, "metrics_listen")? {
            let name = nd.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            out.push((name, format!("http://{addr}/metrics")));
        }
    }
    Ok(out)
}

fn read_pid(node_dir: &Path) -> Option<i32> {
    std::fs::read_to_string(node_dir.join("corrald.pid")).ok()?.trim().parse().ok()
}

/// Whether process `pid` runs: a zombie does not (it exited; its parent, often PID 1 in a
/// container, has not reaped it yet: seen here for over a second after each corrald's exit).
/// `chaos::runner::pid_alive` reads it the same way; the CLI does not link `chaos` (RocksDB).
fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if pid <= 0 || unsafe { libc::kill(pid, 0) } != 0 {
        return false;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the command name, which may itself hold ')'.
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()) != Some("Z")
}

/// The `corrald` binary: `$CORRALD`, next to this executable, or on PATH.
pub fn corrald_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("CORRALD") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let candidate = dir.join("corrald");
            if candidate.exists() {
                return candidate;
            }
        }
    }
    PathBuf::from("corrald")
}

/// Creates the cluster CA, a client certificate and `client.toml` on first use.
fn ensure_ca(dir: &Path) -> anyhow::Result<PemPair> {
    let ca_crt = dir.join("ca.crt");
    if ca_crt.exists() {
        return Ok(PemPair {
            cert_pem: std::fs::read_to_string(&ca_crt).with_context(|| format!("read {}", ca_crt.display()))?,
            key_pem: std::fs::read_to_string(dir.join("ca.key")).with_context(|| format!("read {}/ca.key", dir.display()))?,
        });
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create cluster directory {}", dir.display()))?;
    let ca = pki::generate_ca("corral-dev")?;
    pki::write_pem_pair(dir, "ca", &ca)?;
    let user = std::env::var("USER").unwrap_or_else(|_| "root".into());
    let client = pki::issue_client_cert(&ca, &user)?;
    pki::write_pem_pair(dir, "client", &client)?;
    Ok(ca)
}

fn write_client_toml(dir: &Path) -> anyhow::Result<()> {
    let mut servers = Vec::new();
    for nd in node_dirs(dir)? {
        servers.push(read_listen(&nd)?);
    }
    let metrics = metrics_urls(dir)?.into_iter().map(|(_, url)| url).collect();
    let config =
        ClientConfig { servers, tls: TlsPaths { ca_cert: "ca.crt".into(), cert: "client.crt".into(), key: "client.key".into() }, metrics };
    let text = toml::to_string(&config).context("encode client.toml")?;
    std::fs::write(dir.join("client.toml"), text).with_context(|| format!("write {}/client.toml", dir.display()))
}

fn start_node(node_dir: &Path) -> anyhow::Result<i32> {
    if let Some(pid) = read_pid(node_dir) {
        if alive(pid) {
            return Ok(pid);
        }
    }
    let log_path = node_dir.join("corrald.log");
    let log =
        std::fs::OpenOptions::new().create(true).append(true).open(&log_path).with_context(|| format!("open {}", log_path.display()))?;
    let log2 = log.try_clone().context("duplicate log handle")?;
    let mut cmd = std::process::Command::new(corrald_binary());
    cmd.arg("--config").arg(node_dir.join("node.toml")).stdin(Stdio::null()).stdout(log).stderr(log2);
    if std::env::var_os("RUST_LOG").is_none() {
        cmd.env("RUST_LOG", "info,openraft=warn,quinn=warn");
    }
    // SAFETY: setsid between fork and exec, so the daemon outlives this command.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("start {} (set CORRALD to its path)", corrald_binary().display()))?;
    let pid = child.id() as i32;
    std::fs::write(node_dir.join("corrald.pid"), format!("{pid}\n"))
        .with_context(|| format!("write {}/corrald.pid", node_dir.display()))?;
    Ok(pid)
}

/// `corral dev up`: starts (or restarts) the cluster in `dir` and waits until every node is UP
/// and a leader is elected.
pub async fn up(dir: &Path, opts: &DevOptions) -> anyhow::Result<()> {
    let ca = ensure_ca(dir)?;
    let mut existing = node_dirs(dir)?;
    let token = match existing.first() {
        Some(first) => {
            let text = std::fs::read_to_string(first.join("node.toml")).context("read first node.toml")?;
            let value: toml::Value = toml::from_str(&text).context("parse first node.toml")?;
            value.get("join_token").and_then(|v| v.as_str()).context("node.toml has no join_token")?.to_string()
        }
        None => {
            let bytes: [u8; 16] = rand::random();
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        }
    };
    let mut addrs: Vec<String> = existing.iter().map(|d| read_listen(d)).collect::<anyhow::Result<_>>()?;
    // New nodes join the cluster's runtime root (made with its first node), else get one.
    let mut runtime_root = existing.iter().find_map(|d| dev_runtime_dir(d)).and_then(|d| d.parent().map(Path::to_path_buf));
    for i in existing.len()..opts.nodes {
        if runtime_root.is_none() && i == existing.len() {
            runtime_root = dev_runtime_root();
        }
        let name = format!("n{}", i + 1);
        let node_dir = dir.join(&name);
        std::fs::create_dir_all(&node_dir).with_context(|| format!("create {}", node_dir.display()))?;
        let cert = pki::issue_node_cert(&ca, &name, &["127.0.0.1".to_string(), "localhost".to_string()])?;
        pki::write_pem_pair(&node_dir, "node", &cert)?;
        let listen = format!("127.0.0.1:{}", free_listen_port()?);
        let mut join = addrs.clone();
        join.truncate(5);
        let config = NodeToml {
            name: name.clone(),
            listen: listen.clone(),
            data_dir: "data".into(),
            tls: TlsPaths { ca_cert: "../ca.crt".into(), cert: "node.crt".into(), key: "node.key".into() },
            bootstrap: i == 0,
            join,
            join_token: token.clone(),
            gpus: opts.gpus.clone(),
            cpus: opts.cpus,
            memory_mib: opts.memory_mib,
            voters_max: opts.voters_max,
            heartbeat_interval_ms: opts.heartbeat_interval_ms,
            node_down_after_ms: opts.node_down_after_ms,
            voter_replace_after_ms: opts.voter_replace_after_ms,
            kill_grace_ms: opts.kill_grace_ms,
            gpu_sample_interval_ms: opts.gpu_sample_interval_ms,
            min_job_age_s: opts.min_job_age_s,
            // The developer who started the cluster administers it.
            admins: {
                let mut admins = vec!["root".to_string()];
                if let Ok(me) = std::env::var("USER") {
                    if !admins.contains(&me) {
                        admins.push(me);
                    }
                }
                admins
            },
            checkpoint_root: Some(match &opts.checkpoint_root {
                Some(root) => std::path::absolute(root).with_context(|| format!("resolve {}", root.display()))?.display().to_string(),
                None => dir.join("checkpoints").display().to_string(),
            }),
            run_as_user: opts.run_as_user,
            // The first node signs the certificates of machines that enrol with a join token.
            ca_key: (i == 0).then(|| "../ca.key".to_string()),
            gpu_device_files: opts.gpu_device_files.iter().map(|p| p.display().to_string()).collect(),
            partitions: opts.partitions.iter().filter(|p| !p.is_empty()).cloned().collect(),
            shards_per_gpu: opts.shards_per_gpu,
            job_hosts_file: "../hosts".into(),
            metrics_listen: format!("127.0.0.1:{}", free_listen_port()?),
            runtime_dir: runtime_root.as_ref().map(|root| root.join(&name).display().to_string()),
            raft: RaftSection {
                heartbeat_interval_ms: 50,
                election_timeout_min_ms: 200,
                election_timeout_max_ms: 400,
                snapshot_logs_since_last: opts.snapshot_logs,
                max_in_snapshot_log_to_keep: opts.snapshot_logs.min(100),
            },
        };
        let text = toml::to_string(&config).context("encode node.toml")?;
        std::fs::write(node_dir.join("node.toml"), text).with_context(|| format!("write {}/node.toml", node_dir.display()))?;
        addrs.push(listen);
        existing.push(node_dir);
    }
    write_client_toml(dir)?;
    write_hosts(dir, &existing)?;
    for node_dir in &existing {
        start_node(node_dir)?;
    }
    wait_ready(dir, existing.len(), Duration::from_secs(opts.wait_s)).await
}

/// Waits until a leader answers and `nodes` nodes are registered and UP.
pub async fn wait_ready(dir: &Path, nodes: usize, patience: Duration) -> anyhow::Result<()> {
    let cluster = Cluster::connect(dir, None)?;
    let started = Instant::now();
    let mut last = String::from("no answer yet");
    while started.elapsed() < patience {
        for node_dir in node_dirs(dir)? {
            if let Some(pid) = read_pid(&node_dir) {
                // Reap it if it is our child; harmless otherwise.
                // SAFETY: waitpid with WNOHANG on a pid we started.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
                if !alive(pid) {
                    let log = std::fs::read_to_string(node_dir.join("corrald.log")).unwrap_or_default();
                    bail!("corrald in {} exited during start:\n{}", node_dir.display(), why_it_exited(&log));
                }
            }
        }
        match cluster.call(ClientRequest::ListNodes).await {
            Ok(Ok(Reply::Nodes(list))) => {
                let up = list.iter().filter(|n| n.state == NodeState::Up).count();
                if up >= nodes && list.iter().any(|n| n.role == proto::NodeRole::Leader) {
                    return Ok(());
                }
                last = format!("{up} of {nodes} nodes up");
            }
            Ok(other) => last = format!("{other:?}"),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("cluster in {} not ready after {} s: {last} (see */corrald.log)", dir.display(), patience.as_secs())
}

/// What a node's log says of why it stopped: its error lines and panics (a backtrace follows
/// them and would hide them in a plain tail), else its last lines.
fn why_it_exited(log: &str) -> String {
    const LINES_MAX: usize = 8;
    let lines: Vec<&str> = log.lines().collect();
    let causes: Vec<&str> =
        lines.iter().copied().filter(|l| l.contains(" ERROR ") || l.starts_with("Error:") || l.contains("panicked at")).collect();
    let shown =
        if causes.is_empty() { &lines[lines.len().saturating_sub(LINES_MAX)..] } else { &causes[causes.len().saturating_sub(LINES_MAX)..] };
    shown.join("\n")
}

/// Sends `signal` to one node's `corrald` (`KILL`, `TERM`, `STOP`, `CONT`, or `USR2`: hand
/// the runs over and exit, as in a rolling upgrade; `corral dev start` is then the restart).
pub fn signal_node(dir: &Path, name: &str, signal: &str) -> anyhow::Result<()> {
    let node_dir = dir.join(name);
    let pid = read_pid(&node_dir).with_context(|| format!("no corrald.pid for node {name}"))?;
    let sig = match signal.trim_start_matches("SIG") {
        "KILL" => libc::SIGKILL,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "CONT" => libc::SIGCONT,
        "USR2" => libc::SIGUSR2,
        other => bail!("unknown signal '{other}' (KILL, TERM, STOP, CONT, USR2)"),
    };
    // SAFETY: kill(2) on a pid we started.
    if unsafe { libc::kill(pid, sig) } != 0 {
        bail!("signal node {name} (pid {pid}): {}", std::io::Error::last_os_error());
    }
    if sig == libc::SIGKILL || sig == libc::SIGTERM || sig == libc::SIGUSR2 {
        wait_exit(pid, Duration::from_secs(10));
    }
    Ok(())
}

/// Starts one stopped node of the cluster again.
pub fn start_one(dir: &Path, name: &str) -> anyhow::Result<i32> {
    let node_dir = dir.join(name);
    if !node_dir.join("node.toml").exists() {
        bail!("no node {name} in {}", dir.display());
    }
    start_node(&node_dir)
}

fn wait_exit(pid: i32, patience: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < patience {
        // Reap it if it is our child (dev up in the same process); harmless otherwise.
        // SAFETY: waitpid with WNOHANG on a pid; no memory is shared.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// `corral dev down`: stops every node (SIGTERM, then SIGKILL after 10 s), the last started
/// first: agents, then voters, so each node that declares itself stopped finds a quorum but
/// the last voters'.
pub fn down(dir: &Path) -> anyhow::Result<()> {
    for node_dir in node_dirs(dir)?.into_iter().rev() {
        let Some(pid) = read_pid(&node_dir) else { continue };
        if alive(pid) {
            // SAFETY: kill(2) on a pid this tool started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            if !wait_exit(pid, Duration::from_secs(10)) {
                // SAFETY: as above.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                wait_exit(pid, Duration::from_secs(5));
            }
        }
        let _ = std::fs::remove_file(node_dir.join("corrald.pid"));
        // Its runs ended with it (a node that had to be killed leaves them to its watchdog,
        // which keeps the last lease it read).
        if let Some(runtime) = dev_runtime_dir(&node_dir) {
            let _ = std::fs::remove_dir_all(&runtime);
            if let Some(root) = runtime.parent() {
                let _ = std::fs::remove_dir(root); // once its last node's directory is gone
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listen_port_is_below_the_ephemeral_and_job_ranges() {
        let ephemeral_min = ephemeral_port_min();
        let jobs = proto::MASTER_PORT_FIRST..proto::STEP_PORT_FIRST + proto::STEP_PORT_COUNT;
        for _ in 0..64 {
            // (Whether it is still free a moment later depends on every other test picking
            // ports on this host at the same time: not asserted.)
            let port = free_listen_port().expect("free port");
            assert!(!jobs.contains(&port), "port {port} is one jobs and steps get as MASTER_PORT");
            if ephemeral_min > LISTEN_PORT_MIN + 1_000 {
                assert!((LISTEN_PORT_MIN..ephemeral_min).contains(&port), "port {port} is in the ephemeral range from {ephemeral_min}");
            }
        }
    }

    #[test]
    fn a_port_handed_out_is_not_handed_out_again_within_its_claim() {
        let picked: Vec<u16> = (0..32).map(|_| free_listen_port().expect("free port")).collect();
        let distinct: std::collections::BTreeSet<u16> = picked.iter().copied().collect();
        assert_eq!(distinct.len(), picked.len(), "a port was handed out twice: {picked:?}");
        assert!(!claim_port(picked[0]), "port {} claimed again within {PORT_CLAIM_TTL:?}", picked[0]);
    }

    #[test]
    fn a_node_that_stopped_is_explained_by_its_error_not_its_backtrace() {
        let log = "2026-12-02T10:03:52Z  INFO corral_node::server: gpus discovered\n\
                   2026-12-02T10:03:52Z ERROR corrald: corrald stopped error=\"bind 127.0.0.1:4000: Address in use\"\n\
                   Error: bind 127.0.0.1:4000\n\nStack backtrace:\n   0: main\n   1: _start\n";
        let why = why_it_exited(log);
        assert!(why.contains("Address in use") && why.contains("Error: bind"), "{why}");
        assert!(!why.contains("_start") && !why.contains("gpus discovered"), "{why}");
        let quiet = (0..20).map(|i| format!("line {i}")).collect::<Vec<_>>().join("\n");
        assert_eq!(why_it_exited(&quiet), (12..20).map(|i| format!("line {i}")).collect::<Vec<_>>().join("\n"));
    }
}
