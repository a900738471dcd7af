//! Many simulated nodes in one process, for `corral bench --nodes` (`corrald --sim-nodes N`):
//! each has its own name, certificate (issued by the cluster CA), QUIC endpoint and address,
//! instance id and inventory (from the simulated GPU probe, as a real node with `gpus =
//! "h100:8"` builds it), joins with the real `Join`, heartbeats with the agent's own loop
//! (`liveness::heartbeat_loop`: relays, lease, fencing) and answers `Launch` and `Kill` by the
//! real protocol, checking a launch with the same rule as a real node
//! (`control::agent::run_is_current_here`). What it does not do is start processes: a run "ends" after
//! the job's `CORRAL_SIM_RUN_MS` (or when killed, or at its time limit) and is reported with
//! `ReportRuns`. Simulated nodes carry the `never-voter` feature, so none is made a voter.
//!
//! Control on stdin, one command per line: `silence NAME` (the node stops heartbeating and
//! closes its endpoint, as if SIGKILLed; answered `silenced NAME UNIX_MS`), `stats` (answered
//! `stats {json}`). Stdout says `ready N JOIN_MS` once every node joined. EOF ends the process.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{
    ApiError, ClientRequest, Envelope, GpuUsage, InstanceId, Inventory, Job, JobId, NodeId, PeerRequest, Reply, Request, Response, RunNo,
    RunOutcome, RunReport,
};
use tokio::io::AsyncBufReadExt;
use tracing::{debug, warn};
use transport::pki::{PemPair, TlsIdentity};
use transport::{Client, Handler, Peer};

use crate::config::NodeConfig;
use crate::link::{LeaderLink, LinkError};
use crate::liveness::Heartbeating;

/// The job environment variable that says how long a simulated run lasts.
pub const SIM_RUN_MS_ENV: &str = "CORRAL_SIM_RUN_MS";
/// Joins in flight at once (each is a `RegisterNode` entry and a TLS handshake).
const JOINS_IN_FLIGHT_MAX: usize = 32;
/// Simulated nodes one process runs at most.
pub const SIM_NODES_MAX: usize = 20_000;

pub struct SimOptions {
    /// A real node's `node.toml` of the cluster: its join addresses, join token and timings.
    pub node_config: PathBuf,
    /// The cluster CA's certificate and key (`ca.crt`, `ca.key`), to issue each node's own.
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub count: usize,
    /// Names are `PREFIX1`, `PREFIX2`, ...
    pub prefix: String,
    /// Heartbeat the leader directly instead of a relay (each beat is one request to the
    /// leader: how every node heartbeated before relays, for the bench's comparison).
    pub direct_to_leader: bool,
    /// Heartbeat as one stream call each, as nodes did before datagrams (the bench's peer);
    /// always so with `direct_to_leader`.
    pub stream_heartbeats: bool,
}

#[derive(Default, serde::Serialize)]
pub struct SimStats {
    pub heartbeats_acked: AtomicU64,
    pub fences: AtomicU64,
    pub launches: AtomicU64,
    pub launches_refused: AtomicU64,
    pub runs_ended: AtomicU64,
    pub reports_failed: AtomicU64,
}

/// A simulated node's runs: (job, run) → its task and the GPU slots it holds.
type SimRuns = BTreeMap<(JobId, RunNo), (tokio::task::AbortHandle, Vec<u32>)>;

struct SimNode {
    name: String,
    id: OnceLock<NodeId>,
    instance: InstanceId,
    endpoint: transport::quinn::Endpoint,
    /// Towards the leader through the cluster's members (launch checks, reports).
    forward: Arc<LeaderLink>,
    /// Each run here: its task, and the GPUs (slots) it holds.
    runs: Mutex<SimRuns>,
    /// The simulated probe's sampler: load on the GPUs runs hold (`ClientRequest::GpuSamples`).
    sampler: Arc<dyn crate::gpu::GpuSampler>,
    silenced: AtomicBool,
    /// Its lease (`control::agent::Lease`), renewed and read by the heartbeat loop.
    lease: Mutex<control::agent::Lease>,
    /// The term of the last heartbeat acknowledgement.
    ack_term: AtomicU64,
    /// Wall clock (Unix ms) when the last acknowledged heartbeat was sent.
    acked_sent_unix_ms: AtomicU64,
    /// Heartbeats as datagrams (`liveness::Heartbeating::beats_as_datagrams`).
    datagrams: bool,
    stats: Arc<SimStats>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl SimNode {
    fn node_id(&self) -> NodeId {
        self.id.get().copied().unwrap_or(0)
    }

    async fn launch(self: Arc<Self>, job: Job) -> Response {
        let (me, instance, run) = (self.node_id(), self.instance, job.run);
        // The same check a node without a replica makes: the leader's state decides.
        let current = match self.forward.call(ClientRequest::GetJob { job: job.id }, 0).await {
            Ok(Reply::Job(j)) => control::agent::run_is_current_here(&j, run, me, instance),
            Ok(other) => return Err(ApiError::Internal(format!("unexpected reply {other:?}"))),
            Err(LinkError::Api(ApiError::NotFound(_))) => false,
            Err(e) => return Err(ApiError::Unavailable(format!("check the launch with the leader: {e}"))),
        };
        if !current {
            self.stats.launches_refused.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::Denied(format!("job {} run {run} is no longer current on this node", job.id)));
        }
        let mut runs = lock(&self.runs);
        if !runs.contains_key(&(job.id, run)) {
            self.stats.launches.fetch_add(1, Ordering::Relaxed);
            let lasts_ms = job.spec.env.get(SIM_RUN_MS_ENV).and_then(|v| v.parse::<u64>().ok());
            let (outcome, after_ms) = match (lasts_ms, job.spec.time_limit_ms) {
                (Some(ms), Some(limit)) if limit < ms => (RunOutcome::TimedOut, limit),
                (Some(ms), _) => (RunOutcome::Exited(0), ms),
                (None, Some(limit)) => (RunOutcome::TimedOut, limit),
                (None, None) => (RunOutcome::Exited(0), u64::MAX / 4),
            };
            let node = Arc::clone(&self);
            let id = job.id;
            let task = tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                node.end(id, run, outcome).await;
            });
            let gpus = job.parts.iter().filter(|p| p.run == run && p.alloc.node == me).flat_map(|p| p.alloc.gpus.iter().copied()).collect();
            runs.insert((job.id, run), (task.abort_handle(), gpus));
        }
        Ok(Reply::LaunchAck { job: job.id, run, instance })
    }

    /// The simulated probe's samples of the GPUs runs hold here, as a node's agent answers.
    async fn gpu_samples(&self) -> Response {
        let holders: BTreeMap<u32, JobId> =
            lock(&self.runs).iter().flat_map(|((job, _), (_, gpus))| gpus.iter().map(move |g| (*g, *job))).collect();
        let held = holders.keys().copied().collect();
        let sampler = Arc::clone(&self.sampler);
        let samples = tokio::task::spawn_blocking(move || sampler.sample(&held))
            .await
            .map_err(|e| ApiError::Internal(format!("sample gpus: {e}")))?
            .map_err(|e| ApiError::Internal(format!("sample gpus: {e:#}")))?;
        Ok(Reply::GpuSamples(crate::gpu::series::latest(&samples, &holders, crate::server::now_ms())))
    }

    fn kill(self: &Arc<Self>, job: JobId, run: RunNo) -> Response {
        if let Some((task, _)) = lock(&self.runs).remove(&(job, run)) {
            task.abort();
            let node = Arc::clone(self);
            tokio::spawn(async move { node.report(job, run, RunOutcome::Killed).await });
        }
        Ok(Reply::Ok)
    }

    async fn end(&self, job: JobId, run: RunNo, outcome: RunOutcome) {
        if lock(&self.runs).remove(&(job, run)).is_some() {
            self.report(job, run, outcome).await;
        }
    }

    /// Reports a run's end until a leader has it, as the agent does (or until silenced).
    async fn report(&self, job: JobId, run: RunNo, outcome: RunOutcome) {
        self.stats.runs_ended.fetch_add(1, Ordering::Relaxed);
        let reports = vec![RunReport { job, run, outcome, usage: GpuUsage::default() }];
        let request = PeerRequest::ReportRuns { node: self.node_id(), reports };
        let mut backoff_ms = 100;
        while !self.silenced.load(Ordering::SeqCst) {
            match self.forward.call(request.clone(), 0).await {
                Ok(_) | Err(LinkError::Api(_)) => return,
                Err(e) => {
                    self.stats.reports_failed.fetch_add(1, Ordering::Relaxed);
                    debug!(node = %self.name, job, error = %e, "report not delivered, retrying");
                    tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                    backoff_ms = (backoff_ms * 2).min(1_000);
                }
            }
        }
    }

    /// As if the process were SIGKILLed: no heartbeats, no answers, no reports.
    fn silence(&self) {
        self.silenced.store(true, Ordering::SeqCst);
        self.endpoint.close(transport::quinn::VarInt::from_u32(0), b"silenced");
        for (_, (task, _)) in std::mem::take(&mut *lock(&self.runs)) {
            task.abort();
        }
    }
}

impl Heartbeating for SimNode {
    fn heartbeat(&self) -> PeerRequest {
        let running = lock(&self.runs).keys().copied().collect();
        PeerRequest::Heartbeat { node: self.node_id(), instance: self.instance, running }
    }

    fn holds_work(&self) -> bool {
        !lock(&self.runs).is_empty()
    }

    fn fence(&self) -> usize {
        // Nothing to kill: count it (a fence under load is a failure of liveness the bench
        // reports), and end the runs as a real node's would end.
        self.stats.fences.fetch_add(1, Ordering::Relaxed);
        let runs = std::mem::take(&mut *lock(&self.runs));
        for (task, _) in runs.values() {
            task.abort();
        }
        runs.len()
    }

    fn lease(&self) -> &Mutex<control::agent::Lease> {
        &self.lease
    }

    fn acknowledged(&self, ack: &Reply) {
        if let Reply::HeartbeatAck { term, .. } = ack {
            self.ack_term.store(*term, Ordering::SeqCst);
        }
        let sent_ms = lock(&self.lease).ack_sent_ms().unwrap_or(0);
        let sent_ago_ms = crate::run::procfs::boot_ms().saturating_sub(sent_ms);
        self.acked_sent_unix_ms.store(unix_ms().saturating_sub(sent_ago_ms), Ordering::SeqCst);
        self.stats.heartbeats_acked.fetch_add(1, Ordering::Relaxed);
    }

    fn silenced(&self) -> bool {
        self.silenced.load(Ordering::SeqCst)
    }

    fn beats_as_datagrams(&self) -> bool {
        self.datagrams
    }
}

struct SimHandler {
    node: Arc<SimNode>,
}

impl Handler for SimHandler {
    fn handle(&self, _peer: Peer, envelope: Envelope) -> Pin<Box<dyn std::future::Future<Output = Response> + Send + 'static>> {
        let node = Arc::clone(&self.node);
        Box::pin(async move {
            if node.silenced.load(Ordering::SeqCst) {
                return Err(ApiError::Unavailable("silenced".into()));
            }
            match envelope.request {
                Request::Peer(PeerRequest::Launch { job, .. }) => node.launch(*job).await,
                Request::Peer(PeerRequest::Kill { job, run, .. }) => node.kill(job, run),
                // A simulated run has no process to signal or stop.
                Request::Peer(PeerRequest::SignalPart { .. }) | Request::Peer(PeerRequest::SuspendPart { .. }) => Ok(Reply::Ok),
                Request::Client(ClientRequest::GpuSamples { .. }) => node.gpu_samples().await,
                other => Err(ApiError::Invalid(format!("a simulated node answers launches and kills only, not {other:?}"))),
            }
        })
    }
}

/// Runs the simulated nodes until stdin closes.
pub fn run(opts: SimOptions) -> anyhow::Result<()> {
    if opts.count == 0 || opts.count > SIM_NODES_MAX {
        bail!("simulate 1..={SIM_NODES_MAX} nodes, not {}", opts.count);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start async runtime")?;
    runtime.block_on(run_async(opts))
}

async fn run_async(opts: SimOptions) -> anyhow::Result<()> {
    let config = NodeConfig::load(&opts.node_config)?;
    let ca = PemPair {
        cert_pem: std::fs::read_to_string(&opts.ca_cert).with_context(|| format!("read {}", opts.ca_cert.display()))?,
        key_pem: std::fs::read_to_string(&opts.ca_key).with_context(|| format!("read {}", opts.ca_key.display()))?,
    };
    let probe = crate::probe::probe_from_config(&config.gpus, &opts.prefix);
    let discovered = probe.discover().context("discover simulated gpus")?;
    let mut features = config.features.clone();
    features.push(crate::liveness::NEVER_VOTER_FEATURE.to_string());
    let inventory = Inventory {
        gpus: discovered.gpus,
        topology: discovered.topology,
        cpus: config.cpus.unwrap_or(64),
        memory_mib: config.memory_mib.unwrap_or(512 * 1024),
        location: config.location.clone(),
        features,
        partitions: config.partitions.clone(),
    };
    let stats = Arc::new(SimStats::default());
    let started = Instant::now();
    let mut nodes: BTreeMap<String, Arc<SimNode>> = BTreeMap::new();
    let joins = Arc::new(tokio::sync::Semaphore::new(JOINS_IN_FLIGHT_MAX));
    let mut joined = tokio::task::JoinSet::new();
    for i in 1..=opts.count {
        let name = format!("{}{i}", opts.prefix);
        let datagrams = !(opts.direct_to_leader || opts.stream_heartbeats);
        let (node, heartbeat_link, join) =
            start_node(&config, &ca, &name, inventory.clone(), datagrams, Arc::clone(&stats), probe.sampler())?;
        nodes.insert(name.clone(), Arc::clone(&node));
        let joins = Arc::clone(&joins);
        let interval = Duration::from_millis(config.heartbeat_interval_ms);
        let direct = opts.direct_to_leader;
        let budget = crate::server::heartbeat_call_timeout(&config);
        joined.spawn(async move {
            let _permit = joins.acquire_owned().await.context("join permits")?;
            let id = join_until(&node.forward, &join, &name).await?;
            let _ = node.id.set(id);
            tokio::spawn(members_loop(Arc::clone(&node), Arc::clone(&heartbeat_link), direct));
            tokio::spawn(crate::liveness::heartbeat_loop(node, heartbeat_link, interval, budget, join));
            anyhow::Ok(())
        });
    }
    while let Some(result) = joined.join_next().await {
        result.context("join task")??;
    }
    println!("ready {} {}", nodes.len(), started.elapsed().as_millis());
    control(&nodes, &stats).await
}

fn start_node(
    config: &NodeConfig,
    ca: &PemPair,
    name: &str,
    inventory: Inventory,
    datagrams: bool,
    stats: Arc<SimStats>,
    sampler: Arc<dyn crate::gpu::GpuSampler>,
) -> anyhow::Result<(Arc<SimNode>, Arc<LeaderLink>, PeerRequest)> {
    let host = config.listen.ip().to_string();
    let cert = transport::pki::issue_node_cert(ca, name, std::slice::from_ref(&host))?;
    let identity = TlsIdentity::from_pems(&ca.cert_pem, &cert.cert_pem, &cert.key_pem)?;
    let bind = std::net::SocketAddr::new(config.listen.ip(), 0);
    let endpoint = transport::endpoint(bind, &identity, true)?;
    let addr = endpoint.local_addr().context("read the simulated node's address")?.to_string();
    let client = Arc::new(Client::new(endpoint.clone()));
    let timeout = crate::server::heartbeat_call_timeout(config);
    // The node whose configuration this is, and every member it joins through.
    let mut members = vec![config.advertise_addr()];
    members.extend(config.join.iter().filter(|a| **a != config.advertise_addr()).cloned());
    let forward = Arc::new(LeaderLink::new(Arc::clone(&client), members.clone(), timeout));
    let heartbeat_link = Arc::new(LeaderLink::new(client, members, timeout / 2));
    let instance: InstanceId = control::agent::next_instance(unix_ms(), None, rand::random());
    let node = Arc::new(SimNode {
        name: name.to_string(),
        id: OnceLock::new(),
        instance,
        endpoint: endpoint.clone(),
        forward,
        runs: Mutex::new(BTreeMap::new()),
        sampler,
        silenced: AtomicBool::new(false),
        lease: Mutex::new(control::agent::Lease::new(config.fence_after_ms(), config.fence_kill_grace_ms)),
        ack_term: AtomicU64::new(0),
        acked_sent_unix_ms: AtomicU64::new(0),
        datagrams,
        stats,
    });
    tokio::spawn(transport::serve(endpoint, Arc::new(SimHandler { node: Arc::clone(&node) })));
    let join = PeerRequest::Join {
        token: config.join_token.clone(),
        name: name.to_string(),
        addr,
        inventory,
        instance,
        cert_fingerprint: String::new(),
    };
    Ok((node, heartbeat_link, join))
}

async fn join_until(link: &LeaderLink, join: &PeerRequest, name: &str) -> anyhow::Result<NodeId> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match link.call(join.clone(), 0).await {
            Ok(Reply::Joined { id, .. }) => return Ok(id),
            Ok(other) => bail!("join {name}: unexpected reply {other:?}"),
            Err(e) if Instant::now() > deadline => bail!("join {name}: {e}"),
            Err(e) => {
                debug!(node = %name, error = %e, "join, retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// What a real node's `learn_members_loop` does: the relays to heartbeat, asked again on a new
/// term or every `MEMBERS_REFRESH_MAX` (`liveness::MembersSchedule`).
async fn members_loop(node: Arc<SimNode>, heartbeat_link: Arc<LeaderLink>, direct_to_leader: bool) {
    let mut ticker = tokio::time::interval(crate::liveness::MEMBERS_CHECK_INTERVAL);
    let mut schedule = crate::liveness::MembersSchedule::default();
    while !node.silenced.load(Ordering::SeqCst) {
        ticker.tick().await;
        let term = node.ack_term.load(Ordering::SeqCst);
        let Some(check) = schedule.due(term, Instant::now()) else { continue };
        if let Ok(Reply::Cluster(info)) = crate::liveness::ask_members(&heartbeat_link).await {
            let voters: Vec<_> = info
                .members
                .iter()
                .filter(|m| !direct_to_leader || m.role == proto::NodeRole::Leader)
                .map(|m| (m.id, m.role, m.addr.clone()))
                .collect();
            // As a real node does: every voter becomes a candidate too, not only the relay order.
            heartbeat_link.learn(voters.iter().map(|(_, _, addr)| addr.clone()).collect::<Vec<_>>());
            heartbeat_link.set_first(crate::liveness::relay_order(node.node_id(), &voters), crate::liveness::keeps_current(check));
            schedule.learned(node.node_id(), check, term, Instant::now());
        }
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

async fn control(nodes: &BTreeMap<String, Arc<SimNode>>, stats: &SimStats) -> anyhow::Result<()> {
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await.context("read a control line")? {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["silence", name] => match nodes.get(*name) {
                Some(node) => {
                    node.silence();
                    println!("silenced {name} {}", unix_ms());
                }
                None => println!("error no simulated node {name}"),
            },
            // How many live nodes had a heartbeat sent at or after UNIX_MS acknowledged.
            ["acked_since", at] => {
                let at: u64 = at.parse().context("acked_since takes Unix milliseconds")?;
                let live: Vec<&Arc<SimNode>> = nodes.values().filter(|n| !n.silenced.load(Ordering::SeqCst)).collect();
                let behind: Vec<&str> =
                    live.iter().filter(|n| n.acked_sent_unix_ms.load(Ordering::SeqCst) < at).map(|n| n.name.as_str()).collect();
                // The first few not yet acknowledged, by name, for diagnosis.
                let names = behind.iter().take(5).copied().collect::<Vec<_>>().join(",");
                println!("acked {} {} {names}", live.len() - behind.len(), live.len());
            }
            ["stats"] => println!("stats {}", serde_json::to_string(stats).context("encode stats")?),
            ["transport"] => println!("transport {}", serde_json::to_string(&transport::counters()).context("encode transport counters")?),
            _ => warn!(line = %line, "unknown control command"),
        }
    }
    Ok(())
}
