//! Starting a node: the data directory, identity and certificates, Raft, the agent and its
//! loops, the API server; and stopping it (`run`).

use super::*;

/// FNV-1a: a short stable tag for a path.
fn fnv32(text: &str) -> u32 {
    text.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// Job cgroups as the config asks, saying at start what is and is not enforced.
fn job_cgroups(config: &NodeConfig) -> Option<crate::run::cgroup::JobCgroups> {
    let base = match config.cgroup.as_deref().unwrap_or("auto") {
        "off" => {
            warn!("cgroups are off (cgroup = \"off\"): jobs are not confined or limited");
            return None;
        }
        "auto" => {
            match crate::run::cgroup::JobCgroups::default_base(&format!(
                "{}-{:08x}",
                config.name,
                fnv32(&config.data_dir.display().to_string())
            )) {
                Ok(base) => base,
                Err(e) => {
                    warn!(error = format!("{e:#}"), "cgroup v2 is not available: jobs are not confined or limited");
                    return None;
                }
            }
        }
        path => std::path::PathBuf::from(path),
    };
    match crate::run::cgroup::JobCgroups::open(&base) {
        Ok(mut c) => {
            // What cgroup v2 lacks here, from the v1 hierarchies beside it (a hybrid host).
            c.add_v1(&format!("{}-{:08x}", config.name, fnv32(&config.data_dir.display().to_string())));
            if let Err(e) = c.add_device_programs() {
                // Said as a warning by `gpu_device_files` where the node has GPUs to fence.
                debug!(error = %e, "no cgroup v2 device programs here");
            }
            let missing = c.missing();
            if !c.v1.is_empty() {
                info!(v1 = ?c.v1, "cgroup v1 hierarchies used beside v2");
            }
            if missing.is_empty() {
                info!(cgroup = %c.base.display(), controllers = ?c.enforced(), "jobs run in cgroups with cpu, memory and pids limits");
            } else {
                warn!(
                    cgroup = %c.base.display(),
                    missing = ?missing,
                    "jobs run in cgroups (killed whole at their end) but these controllers are not delegated here: those limits are not enforced"
                );
            }
            Some(c)
        }
        Err(e) => {
            warn!(cgroup = %base.display(), error = format!("{e:#}"), "cgroup v2 is not writable: jobs are not confined or limited");
            None
        }
    }
}

fn read_node_id(path: &Path) -> anyhow::Result<Option<NodeId>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().parse().with_context(|| format!("parse node id in {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read node id at {}", path.display())),
    }
}

fn write_node_id(path: &Path, id: NodeId) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{id}\n")).with_context(|| format!("write node id to {}", tmp.display()))?;
    std::fs::File::open(&tmp).and_then(|f| f.sync_all()).with_context(|| format!("sync {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("move node id into {}", path.display()))
}

/// Calls `request` through `link` until it succeeds or `deadline` passes.
async fn call_until(link: &LeaderLink, request: PeerRequest, what: &str, deadline: Duration) -> anyhow::Result<Reply> {
    let started = Instant::now();
    let mut backoff_ms = 100;
    loop {
        match link.call(request.clone(), 0).await {
            Ok(reply) => return Ok(reply),
            Err(LinkError::Api(e @ (ApiError::Denied(_) | ApiError::Invalid(_) | ApiError::Version { .. }))) => {
                bail!("{what}: {e}")
            }
            Err(e) if started.elapsed() > deadline => bail!("{what}: gave up after {} s: {e}", deadline.as_secs()),
            Err(e) => {
                debug!(error = %e, "{what}: retrying");
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(2_000);
            }
        }
    }
}

/// How long a graceful stop waits for the node's jobs to stop and be reported, beyond their
/// `kill_grace_ms`.
pub const STOP_REPORT_MS: u64 = 5_000;
/// How long a graceful stop waits for the leader to commit `NodeStopped` (`declare_stopped`).
pub const STOP_DECLARE_MS: u64 = 1_000;

/// What the daemon is asked to do (`main.rs` turns signals into these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopRequest {
    /// Keep running.
    None,
    /// Stop gracefully (SIGTERM): the node's jobs are stopped and reported, see
    /// [`Agent::shut_down`].
    Stop,
    /// Exit to be replaced (SIGUSR2, a rolling upgrade): the jobs go on, see
    /// [`Agent::hand_over`].
    HandOver,
}

/// How [`run`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    Stopped,
    /// The runs are handed over: the process must exit now, without stopping anything.
    HandedOver,
}

/// This daemon's instance: the previous daemon's if it handed its runs over (the cluster sees
/// no restart), else a new one (the cluster ends whatever the node ran before). Records it.
fn this_instance(daemon_file: &Path) -> anyhow::Result<(InstanceId, Option<crate::run::daemon_record::Handover>)> {
    let previous = match crate::run::shepherd::read_json::<crate::run::daemon_record::DaemonRecord>(daemon_file) {
        Ok(p) => p,
        Err(e) => {
            warn!(error = format!("{e:#}"), "read the previous daemon's record: starting as a new instance");
            None
        }
    };
    let handover = previous.as_ref().and_then(|p| p.open_handover(crate::run::procfs::boot_ms()));
    if let (Some(p), None) = (&previous, handover) {
        if p.handover.is_some() {
            warn!(instance = p.instance, "the previous daemon's hand-over expired: its jobs were killed, starting as a new instance");
        }
    }
    let instance: u64 = match (&previous, handover) {
        (Some(p), Some(_)) => p.instance,
        _ => control::agent::next_instance(super::now_ms(), previous.as_ref().map(|p| p.instance), rand::random()),
    };
    crate::run::shepherd::write_json(daemon_file, &crate::run::daemon_record::DaemonRecord::me(instance))?;
    Ok((instance, handover))
}

/// The device files of this node's GPUs (configured, else discovered); says at start whether a
/// run can open only its own.
fn gpu_device_files(
    config: &NodeConfig,
    discovered: &crate::gpu::GpuInventory,
    probe_kind: &str,
    cgroups: Option<&crate::run::cgroup::JobCgroups>,
) -> BTreeMap<u32, std::path::PathBuf> {
    let files: BTreeMap<u32, std::path::PathBuf> = if config.gpu_device_files.is_empty() {
        discovered.device_files.clone()
    } else {
        config.gpu_device_files.iter().enumerate().map(|(i, p)| (i as u32, p.clone())).collect()
    };
    let fences = cgroups.map(|c| c.fence_kinds()).unwrap_or_default();
    if !files.is_empty() && !fences.is_empty() {
        info!(files = files.len(), by = ?fences, "each run may open only its own GPUs' device files");
    } else if !discovered.gpus.is_empty() && (probe_kind != "simulated" || !files.is_empty()) {
        // Said at start, as for the cgroup controllers that are missing.
        warn!(
            gpus = discovered.gpus.len(),
            "a job's GPUs are chosen with CUDA_VISIBLE_DEVICES, not fenced: there is no cgroup v1 devices controller here and no cgroup v2 device program could be attached (corrald needs root for that), so a job can open every /dev/nvidia* this node has"
        );
    }
    files
}

/// The agent's settings from the node's configuration, refusing what cannot work
/// (`run_as_user` without root) and warning of what may surprise.
fn agent_settings(
    config: &NodeConfig,
    inventory: &Inventory,
    cgroups: Option<crate::run::cgroup::JobCgroups>,
    gpu_device_files: BTreeMap<u32, std::path::PathBuf>,
    spawner: Option<Arc<crate::run::spawner::Spawner>>,
    daemon_file: &Path,
) -> anyhow::Result<crate::agent::AgentSettings> {
    let namespaces = run_namespaces();
    let settings = crate::agent::AgentSettings {
        jobs_dir: config.jobs_dir(),
        job_files_dir: config.job_files_dir(),
        checkpoint_root: config.checkpoint_root(),
        nccl: crate::nccl::derive(&config.nccl, inventory, &config.advertise_addr()),
        stop: crate::run::launcher::StopTimings { kill_grace_ms: config.kill_grace_ms, fence_kill_grace_ms: config.fence_kill_grace_ms },
        fence_after_ms: config.fence_after_ms(),
        cluster_name: config.cluster_name.clone(),
        lease_path: config.lease_path(),
        run_as_user: config.run_as_user,
        cgroups,
        gpu_device_files,
        exe: std::env::current_exe().context("find the corrald executable (it holds batch jobs' other nodes and shepherds runs)")?,
        spawner,
        runs_dir: config.runs_dir(),
        daemon_file: daemon_file.to_path_buf(),
        local_socket: Some(config.socket_path()),
        job_hosts: match (&config.job_hosts_file, namespaces) {
            (Some(file), false) => {
                warn!(file = %file.display(), "job_hosts_file needs a mount namespace per run (root with CAP_SYS_ADMIN): jobs resolve names with the system's /etc/hosts");
                None
            }
            (file, _) => file.clone(),
        },
        job_commands: job_commands(namespaces),
    };
    // SAFETY: geteuid cannot fail.
    if config.run_as_user && unsafe { libc::geteuid() } != 0 {
        bail!("run_as_user needs corrald to run as root (or set run_as_user = false to run every job as this user)");
    }
    info!(nccl = ?settings.nccl, fence_after_ms = settings.fence_after_ms, "agent settings");
    if settings.fence_after_ms < 2 * config.raft.election_timeout_max_ms {
        warn!(
            fence_after_ms = settings.fence_after_ms,
            election_timeout_max_ms = config.raft.election_timeout_max_ms,
            "fence_after_ms is shorter than two elections: a leader failover may stop this node's jobs; raise node_down_after_ms"
        );
    }
    Ok(settings)
}

/// Starts a new cluster of this one node (id 1) and registers it before the API answers anyone,
/// so no joining node can be given its id.
async fn bootstrap(
    raft: &Raft,
    config: &NodeConfig,
    inventory: &Inventory,
    instance: InstanceId,
    fingerprint: String,
) -> anyhow::Result<()> {
    let id: NodeId = 1;
    let advertise = config.advertise_addr();
    info!(node = %config.name, "bootstrapping a new cluster");
    let members = BTreeMap::from([(id, MemberNode { name: config.name.clone(), addr: advertise.clone() })]);
    raft.initialize(members).await.context("initialize the cluster")?;
    // Register this node before the API answers anyone, so no joining node can be given
    // the bootstrap node's id.
    let started = Instant::now();
    while !consensus::raft_status(raft).is_leader {
        if started.elapsed() > Duration::from_secs(30) {
            bail!("bootstrap: this node did not become leader of its own cluster within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cmd = Command::RegisterNode {
        name: config.name.clone(),
        addr: advertise.clone(),
        inventory: inventory.clone(),
        instance,
        cert_fingerprint: fingerprint,
        now_ms: now_ms(),
    };
    match consensus::propose(raft, cmd).await.map_err(|e| anyhow::anyhow!("register the bootstrap node: {e}"))? {
        (_, CommandResult::NodeRegistered { id: assigned }) if assigned == id => {}
        (_, other) => bail!("register the bootstrap node: expected id {id}, got {other:?}"),
    }
    Ok(())
}

/// Creates and locks the data directory, and the run records' directory (only this user may
/// read it: run records hold jobs' environments).
fn prepare_data_dir(config: &NodeConfig) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir).with_context(|| format!("create data directory {}", config.data_dir.display()))?;
    lock_data_dir(&config.data_dir)?;
    std::fs::create_dir_all(config.runs_dir()).with_context(|| format!("create {}", config.runs_dir().display()))?;
    std::fs::set_permissions(config.runs_dir(), std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .with_context(|| format!("chmod {}", config.runs_dir().display()))
}

/// What this node offers: its GPUs, and CPUs and memory as configured or found.
fn inventory_of(config: &NodeConfig, mut gpus: Vec<proto::GpuInfo>, topology: proto::Topology) -> Inventory {
    for g in gpus.iter_mut().filter(|g| !g.mig_enabled) {
        g.shards = config.shards_per_gpu;
    }
    Inventory {
        gpus,
        topology,
        cpus: config.cpus.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32)),
        memory_mib: config.memory_mib.unwrap_or_else(host_memory_mib),
        location: config.location.clone(),
        features: config.features.clone(),
        partitions: config.partitions.clone(),
    }
}

/// The links to the leader: the agent's (heartbeats and reports give up on a silent member
/// quickly and try the next: a call stuck on a dead leader must not make this node look dead
/// to the new one), forwards of requests (to the other members), and heartbeats (half a beat's
/// budget per member, so a dead one, maybe this node's first relay, leaves time for the next).
fn leader_links(config: &NodeConfig, client: &Arc<Client>) -> (Arc<LeaderLink>, Arc<LeaderLink>, Arc<LeaderLink>) {
    let advertise = config.advertise_addr();
    let others: Vec<String> = config.join.iter().filter(|a| **a != advertise).cloned().collect();
    let mut agent_candidates = vec![advertise];
    agent_candidates.extend(others.iter().cloned());
    let link_timeout = heartbeat_call_timeout(config);
    let agent_link = Arc::new(LeaderLink::new(Arc::clone(client), agent_candidates.clone(), link_timeout));
    let forward_link = Arc::new(LeaderLink::new(Arc::clone(client), others, PEER_CALL_TIMEOUT));
    let heartbeat_link = Arc::new(LeaderLink::new(Arc::clone(client), agent_candidates, link_timeout / 2));
    (agent_link, forward_link, heartbeat_link)
}

/// Registers this instance (new inventory, new instance id) before it takes work; the cluster
/// must know this node by the id its data directory holds.
async fn register(link: &LeaderLink, join: &PeerRequest, id: NodeId, name: &str) -> anyhow::Result<()> {
    match call_until(link, join.clone(), "register with the cluster", Duration::from_secs(600)).await? {
        Reply::Joined { id: assigned, .. } if assigned == id => Ok(()),
        Reply::Joined { id: assigned, .. } => bail!("cluster knows node '{name}' as id {assigned}, but this data directory says {id}"),
        other => bail!("register with the cluster: unexpected reply {other:?}"),
    }
}

/// This node's id: the one its data directory holds, 1 for a bootstrap node, else the one the
/// cluster gives it for its join token. Recorded in the data directory.
async fn node_id(config: &NodeConfig, forward_link: &LeaderLink, join: &PeerRequest) -> anyhow::Result<NodeId> {
    let id_path = config.data_dir.join("node_id");
    let id = match read_node_id(&id_path)? {
        Some(id) => id,
        None if config.bootstrap => 1,
        None => match call_until(forward_link, join.clone(), "join the cluster", Duration::from_secs(600)).await? {
            Reply::Joined { id, .. } => id,
            other => bail!("join the cluster: unexpected reply {other:?}"),
        },
    };
    write_node_id(&id_path, id)?;
    Ok(id)
}

/// The GPU probe the config names and what it discovered, logged with how long discovery took.
fn discover_gpus(config: &NodeConfig) -> anyhow::Result<(Arc<dyn crate::gpu::GpuProbe>, crate::gpu::GpuInventory)> {
    let probe: Arc<dyn crate::gpu::GpuProbe> = Arc::from(crate::probe::probe_from_config(&config.gpus, &config.name));
    let discover_started = Instant::now();
    let discovered = probe.discover().context("discover gpus")?;
    info!(probe = probe.kind(), gpus = discovered.gpus.len(), took_ms = discover_started.elapsed().as_millis() as u64, "gpus discovered");
    Ok((probe, discovered))
}

/// Serves the API (its node set once it exists) over QUIC on `endpoint` and on the local socket,
/// with the partition fault switch watched.
fn serve_api(config: &NodeConfig, endpoint: &transport::quinn::Endpoint, client: &Arc<Client>) -> anyhow::Result<Arc<Api>> {
    let fault = Arc::new(crate::fault::FaultSwitch::default());
    tokio::spawn(Arc::clone(&fault).watch(config.data_dir.join("fault-partition"), Arc::clone(client)));
    let api = Arc::new(Api { node: OnceLock::new(), fault });
    tokio::spawn(transport::serve(endpoint.clone(), api.clone()));
    let socket = config.socket_path();
    let listener = transport::local::bind(&socket)?;
    info!(socket = %socket.display(), "local socket open");
    tokio::spawn(transport::local::serve_local(listener, api.clone()));
    Ok(api)
}

/// Opens Raft at `DATA_DIR/raft` over QUIC (the disk and clock fault switches watched), and
/// bootstraps a new cluster where the config asks and this is node 1 of an uninitialized one.
async fn open_consensus(
    config: &NodeConfig,
    id: NodeId,
    client: &Arc<Client>,
    inventory: &Inventory,
    instance: InstanceId,
    identity: &transport::TlsIdentity,
) -> anyhow::Result<(Raft, StateHandle)> {
    let raft_dir = config.data_dir.join("raft");
    let wal_sync_delay_ms = Arc::new(std::sync::atomic::AtomicU64::new(0));
    tokio::spawn(crate::fault::watch_disk_and_clock(config.data_dir.clone(), Arc::clone(&wal_sync_delay_ms)));
    let transport = QuicRaftTransport { client: Arc::clone(client) };
    let (raft, state) = consensus::open_raft(id, &raft_dir, transport, config.raft.timings(), wal_sync_delay_ms)
        .await
        .with_context(|| format!("open raft at {}", raft_dir.display()))?;
    if config.bootstrap && !raft.is_initialized().await.context("read raft initialization")? && id == 1 {
        bootstrap(&raft, config, inventory, instance, identity.fingerprint()).await?;
    }
    Ok((raft, state))
}

/// Starts a registered node's loops: metrics where configured, the agent's reports and GPU
/// samples, GPU health, certificate renewal and the GPU fault switch.
fn spawn_node_loops(
    config: &NodeConfig,
    node: &Arc<Node>,
    agent: &Arc<Agent>,
    agent_link: &Arc<LeaderLink>,
    probe: &Arc<dyn crate::gpu::GpuProbe>,
    endpoint: &transport::quinn::Endpoint,
    client: &Arc<Client>,
) {
    if let Some(addr) = config.metrics_listen {
        tokio::spawn(crate::metrics::serve(addr, Arc::clone(node)));
    }
    tokio::spawn(Arc::clone(agent).report_loop(Arc::clone(agent_link)));
    tokio::spawn(Arc::clone(agent).step_end_loop(Arc::clone(agent_link)));
    tokio::spawn(Arc::clone(agent).sample_loop(probe.sampler(), Duration::from_millis(config.gpu_sample_interval_ms)));
    spawn_gpu_health(probe.as_ref(), node.id, Arc::clone(agent_link));
    tokio::spawn(renew_certificate_loop(config.clone(), endpoint.clone(), Arc::clone(client), Arc::clone(node)));
    tokio::spawn(crate::fault::watch_gpu_faults(config.data_dir.join("fault-gpu"), Arc::clone(probe)));
}

/// Starts a node and runs it until `stop` asks it to stop or hand over, or the node fails.
/// Runs the node until it stops. `spawner` forks the runs' shepherds (`spawner::start`, before
/// the runtime); without one they are exec'd.
pub async fn run(
    config: NodeConfig,
    mut stop: tokio::sync::watch::Receiver<StopRequest>,
    spawner: Option<Arc<crate::run::spawner::Spawner>>,
) -> anyhow::Result<Ended> {
    prepare_data_dir(&config)?;
    // The previous daemon may have handed its runs over: then this one keeps its instance (the
    // cluster sees no restart) and takes them over. Otherwise it is a new instance, and the
    // cluster ends whatever the node ran before.
    let daemon_file = config.daemon_file();
    let (instance, handover) = this_instance(&daemon_file)?;
    let identity = config.tls.load().context("load tls identity")?;
    let endpoint =
        transport::endpoint(config.listen, &identity, true).with_context(|| format!("bind quic endpoint on {}", config.listen))?;
    let client = Arc::new(Client::new(endpoint.clone()));
    let (probe, discovered) = discover_gpus(&config)?;
    let cgroups = job_cgroups(&config);
    let gpu_device_files = gpu_device_files(&config, &discovered, probe.kind(), cgroups.as_ref());
    let gpus = discovered.gpus.clone();
    let inventory = inventory_of(&config, gpus.clone(), discovered.topology);
    info!(node = %config.name, gpus = gpus.len(), cpus = inventory.cpus, memory_mib = inventory.memory_mib, "inventory discovered");
    let settings = agent_settings(&config, &inventory, cgroups, gpu_device_files, spawner, &daemon_file)?;
    let agent = Agent::new(config.name.clone(), instance, gpus, settings)?;
    let adopted = agent.recover(handover).await.context("recover the previous daemon's runs")?;
    if handover.is_some() {
        info!(instance, runs = adopted, "took over the previous daemon's instance and runs");
    }
    let api = serve_api(&config, &endpoint, &client)?;

    let advertise = config.advertise_addr();
    let (agent_link, forward_link, heartbeat_link) = leader_links(&config, &client);
    agent.rdzv.set_link(Arc::clone(&agent_link));
    let join = PeerRequest::Join {
        token: config.join_token.clone(),
        name: config.name.clone(),
        addr: advertise.clone(),
        inventory: inventory.clone(),
        instance,
        cert_fingerprint: String::new(),
    };

    let id = node_id(&config, &forward_link, &join).await?;
    agent.set_node_id(id);

    let (raft, state) = open_consensus(&config, id, &client, &inventory, instance, &identity).await?;
    let node = Arc::new(Node {
        config: config.clone(),
        id,
        proposer: consensus::Proposer::start(raft.clone()),
        raft,
        state,
        client: Arc::clone(&client),
        agent: Arc::clone(&agent),
        agent_link: Arc::clone(&agent_link),
        forward_link,
        heartbeat_link: Arc::clone(&heartbeat_link),
        relay: liveness::Relay::default(),
        memory: Mutex::new(LeaderMemory::new(None, config.node_down_after_ms, [])),
        view_cache: Mutex::new(consensus::view::ViewCache::default()),
        unreachable_leader: Mutex::new(None),
        cut_from_leader: Mutex::new(None),
        membership_busy: AtomicBool::new(false),
        kick: Notify::new(),
        inventory,
        probe: Arc::clone(&probe),
        paced: crate::pacing::PacedCounts::default(),
    });
    if api.node.set(Arc::clone(&node)).is_err() {
        bail!("node handler set twice");
    }
    tokio::spawn(Arc::clone(&node).leader_loop());
    tokio::spawn(Arc::clone(&node).learn_members_loop());
    tokio::spawn(Arc::clone(&node).relay_loop());

    register(&agent_link, &join, id, &config.name).await?;
    info!(node = %config.name, id, instance, "node is up");
    crate::systemd::notify(&format!("READY=1\nSTATUS=node {} (id {id}) is up", config.name)); // deploy (issue 8)
    spawn_node_loops(&config, &node, &agent, &agent_link, &probe, &endpoint, &client);
    let heartbeat = Duration::from_millis(config.heartbeat_interval_ms);
    let budget = heartbeat_call_timeout(&config);
    let hb = tokio::spawn(liveness::heartbeat_loop(Arc::clone(&agent), heartbeat_link, heartbeat, budget, join));
    let ended = serve_until_stopped(hb, &mut stop, &node, &agent_link).await;
    if ended.is_err() {
        // Tell every peer and client at once that this node is gone (CONNECTION_CLOSE): a
        // client whose request this node had acknowledged would otherwise wait out the idle
        // timeout before it asks the next member (6 s after a leader's disk failed, on the rig).
        endpoint.close(transport::quinn::VarInt::from_u32(1), b"node stopped");
        let _ = tokio::time::timeout(Duration::from_millis(CLOSE_NOTICE_MS), endpoint.wait_idle()).await;
    }
    ended
}

/// How long a node that stops on an error waits for its closing notices to leave.
const CLOSE_NOTICE_MS: u64 = 200;

/// Runs until the heartbeat loop ends or a stop is asked: a hand-over leaves the runs to the
/// next daemon, a stop stops and reports them, then declares the node stopped.
async fn serve_until_stopped(
    mut hb: tokio::task::JoinHandle<()>,
    stop: &mut tokio::sync::watch::Receiver<StopRequest>,
    node: &Node,
    link: &LeaderLink,
) -> anyhow::Result<Ended> {
    let (agent, config) = (&node.agent, &node.config);
    tokio::select! {
        // Crash-only: a replica that can no longer write its log (a failed disk) or apply
        // exits, so systemd starts it again and, until it can, the cluster sees it down and its
        // watchdog stops its runs.
        why = consensus::raft_stopped(&node.raft) => {
            error!(error = %why, "the Raft core stopped: exiting");
            bail!("the Raft core stopped: {why}")
        }
        ended = &mut hb => match ended {
            Ok(()) => Ok(Ended::Stopped),
            Err(e) => {
                error!(error = %e, "heartbeat loop ended");
                bail!("heartbeat loop ended: {e}")
            }
        },
        request = stop.wait_for(|stop| *stop != StopRequest::None) => {
            if request.is_ok_and(|r| *r == StopRequest::HandOver) {
                match agent.hand_over() {
                    Ok(_) => return Ok(Ended::HandedOver),
                    Err(e) => warn!(error = format!("{e:#}"), "cannot hand the runs over: stopping them instead"),
                }
            }
            let left = agent.shut_down(Duration::from_millis(config.kill_grace_ms + STOP_REPORT_MS)).await;
            if left > 0 {
                warn!(left, "node stopped with jobs not yet stopped or reported; the cluster ends them when it declares the node down");
            } else {
                info!("node stopped: every job stopped and reported");
                // No beat of this instance may bring the node back up after it is declared down.
                hb.abort();
                declare_stopped(node, link).await;
            }
            Ok(Ended::Stopped)
        }
    }
}

/// Tells the leader this instance stopped gracefully (`PeerRequest::NodeStopped`), so the node is
/// down at once: a run the cluster placed here whose launch had not arrived (refused since the
/// stop began) is lost now, and a `--requeue` job queued again, not after `node_down_after_ms`
/// of silence. Asked even when this node's replica places nothing here: a replica that lags
/// (the node was paused) does not know of the run whose launch it just refused.
async fn declare_stopped(node: &Node, link: &LeaderLink) {
    let request = PeerRequest::NodeStopped { node: node.id, instance: node.agent.instance };
    match tokio::time::timeout(Duration::from_millis(STOP_DECLARE_MS), link.call(request, 0)).await {
        Ok(Ok(_)) => info!("node declared down: it stopped gracefully"),
        Ok(Err(e)) => warn!(error = %e, "node not declared stopped: the cluster ends its runs when it declares the node down"),
        Err(_) => warn!(
            patience_ms = STOP_DECLARE_MS,
            "node not declared stopped in time: the cluster ends its runs when it declares the node down"
        ),
    }
}

/// How long a relay's batch waits for more heartbeats after its first: a tenth of the heartbeat
/// interval, at most 50 ms (well inside the node's call timeout of twice the interval).
pub fn relay_linger(config: &NodeConfig) -> Duration {
    Duration::from_millis((config.heartbeat_interval_ms / 10).min(50))
}

/// How long a heartbeat (or report) waits on one member before it tries the next: twice the
/// heartbeat interval, within 300 ms to 2 s.
pub fn heartbeat_call_timeout(config: &NodeConfig) -> Duration {
    Duration::from_millis((config.heartbeat_interval_ms * 2).clamp(300, 2_000))
}

/// Takes `DATA_DIR/corrald.lock` for the life of this process: a second daemon on the same data
/// directory would take the node's runs for those of a dead instance and kill them.
fn lock_data_dir(data_dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let path = data_dir.join("corrald.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!("lock {}: {e} (another corrald runs on this data directory)", path.display());
    }
    // Held until the process exits (the descriptor is close-on-exec: no child keeps it).
    std::mem::forget(file);
    Ok(())
}

/// Forwards GPU health events from the probe to the leader, which commits them.
fn spawn_gpu_health(probe: &dyn crate::gpu::GpuProbe, node: NodeId, link: Arc<LeaderLink>) {
    let (tx, mut rx) = tokio::sync::mpsc::channel(crate::gpu::HEALTH_CHANNEL_CAPACITY);
    match probe.health_monitor() {
        Ok(monitor) => {
            tokio::spawn(crate::gpu::run_health_loop(monitor, tx));
        }
        Err(e) => {
            warn!(error = format!("{e:#}"), "gpu health monitor not started");
            return;
        }
    }
    tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            let req = PeerRequest::ReportGpuHealth {
                node,
                gpu: ev.gpu,
                mig_uuid: ev.mig_uuid.clone(),
                healthy: ev.healthy,
                reason: ev.reason.clone(),
            };
            // Retry until committed: a lost health event would leave work on a broken GPU.
            let mut backoff_ms = 100;
            while let Err(e) = link.call(req.clone(), 0).await {
                warn!(gpu = ev.gpu, error = %e, "report gpu health, retrying");
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(5_000);
            }
        }
    });
}

fn host_memory_mib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| t.lines().find(|l| l.starts_with("MemTotal:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or(1024, |kib| kib / 1024)
}

/// Whether each run can get a mount namespace of its own (its job directory as `/job`,
/// `job_hosts_file` as `/etc/hosts`): corrald runs as root with `CAP_SYS_ADMIN` in effect,
/// which a unit's `CapabilityBoundingSet` may take away. Says once at start why not: without
/// it, runs start with neither instead of every job failing "Operation not permitted".
fn run_namespaces() -> bool {
    use crate::capabilities::{Capabilities, CAP_SYS_ADMIN};
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        info!("not root: runs get no mount namespace, so no /job (DeepSpeed's hostfile, pdsh and ssh through steps)");
        return false;
    }
    match Capabilities::of_this_process() {
        Ok(caps) if caps.has(CAP_SYS_ADMIN) => true,
        Ok(_) => {
            warn!(
                "CAP_SYS_ADMIN is not in corrald's effective capabilities (a unit's CapabilityBoundingSet?): runs get no mount \
                 namespace, so no /job (DeepSpeed's hostfile, pdsh and ssh through steps) and no job_hosts_file; jobs still run"
            );
            false
        }
        Err(e) => {
            warn!(error = format!("{e:#}"), "read corrald's capabilities: runs get no mount namespace (no /job, no job_hosts_file)");
            false
        }
    }
}

/// The `corral` binary beside this `corrald`, which runs link as `/job/bin/pdsh` and `ssh`,
/// where runs can see their job directory as `/job`: runs get a mount namespace
/// ([`run_namespaces`]) and `/job` exists or can be made. Otherwise runs get neither (said once).
fn job_commands(namespaces: bool) -> Option<std::path::PathBuf> {
    if !namespaces {
        return None;
    }
    let corral = std::env::current_exe().ok()?.with_file_name("corral");
    if !corral.is_file() {
        warn!(missing = %corral.display(), "no corral beside corrald: runs get no /job/bin/pdsh or ssh");
        return None;
    }
    if let Err(e) = std::fs::create_dir_all(crate::run::process::JOB_MOUNT) {
        warn!(error = %e, "create /job (where runs see their job directory): runs get no /job");
        return None;
    }
    Some(corral)
}
