//! Prometheus metrics over HTTP (`GET /metrics`), computed from the node's state at each scrape:
//! cluster series (`corral_*`: Raft, jobs, requeues, queue depth, GPUs and Slurm state per node)
//! and, for every GPU of this node, DCGM exporter's series (`DCGM_FI_DEV_*`) labelled with the
//! job holding it, per-job GPU utilization and memory, and slurm-job-exporter's per-job series
//! (`slurm_job_*`). A scrape is a [`MetricsSnapshot`] rendered as text.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use proto::{JobId, JobState, NodeInfo, NodeRole};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::gpu::GpuSample;
use crate::server::Node;

/// A scrape request larger than this is refused.
const REQUEST_BYTES_MAX: usize = 8 * 1024;

/// The states `corral_node_state` lists for each node: sinfo's long words (`%T`).
pub const NODE_STATES: [&str; 6] = ["idle", "mixed", "allocated", "draining", "drained", "down"];

type Labels = Vec<(String, String)>;
/// GPU samples, each with the job holding it.
pub type HeldGpus = Vec<(GpuSample, Option<JobId>)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// What one scrape shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// This node's name (DCGM's `Hostname` label).
    pub hostname: String,
    pub raft_term: u64,
    pub raft_is_leader: bool,
    pub raft_commit_index: u64,
    pub raft_applied_index: u64,
    pub agent_running_jobs: u64,
    /// Scheduling passes this node held back while leading, by why (`pacing::Paced`).
    pub passes_paced: Vec<(&'static str, u64)>,
    /// This process's QUIC connections: accepted, dialed, dials failed, dropped.
    pub transport: transport::Counters,
    /// Cluster-wide series; only on members that hold the replicated state.
    pub cluster: Option<ClusterSnapshot>,
    /// This node's GPUs and the job holding each.
    pub gpus: HeldGpus,
    /// The jobs holding those GPUs or running here: whose they are, and their memory.
    pub jobs: BTreeMap<JobId, JobOnNode>,
}

/// A job on this node as slurm-job-exporter labels it, and its memory where it runs in a cgroup.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobOnNode {
    pub user: String,
    /// Empty where the job has no account.
    pub account: String,
    /// Its cgroup's `memory.current` (v1 `memory.usage_in_bytes`); none where the node does
    /// not confine jobs or the run has not started.
    pub memory_used_bytes: Option<u64>,
    /// Its cgroup's `memory.max` (v1 `memory.limit_in_bytes`); none where nothing limits it.
    pub memory_limit_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterSnapshot {
    pub jobs_by_state: BTreeMap<&'static str, u64>,
    /// (partition, `pending` | `held` | `running`) → jobs.
    pub queue_depth: BTreeMap<(String, &'static str), u64>,
    /// Partition → how long its oldest pending (not held) job has waited; 0 for a partition
    /// of any node where none waits.
    pub queue_wait_ms_max: BTreeMap<String, u64>,
    /// Requeues since the cluster began (`ClusterState::requeues`): the same on every member.
    pub requeues: u64,
    /// Jobs' rendezvous stores (`ClusterState::stores`): how many, and their keys' and values'
    /// bytes (bounded by `proto::STORE_BYTES_MAX`).
    pub rendezvous_stores: u64,
    pub rendezvous_store_bytes: u64,
    pub nodes: Vec<NodeSnapshot>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSnapshot {
    pub name: String,
    pub gpus_total: u32,
    pub gpus_free: u32,
    pub up: bool,
    /// Its Slurm state word, one of [`NODE_STATES`] ([`state_word`]).
    pub state: &'static str,
    /// Since the leader last heard from it, where this node knows (the leader does).
    pub heartbeat_age_ms: Option<u64>,
}

/// Slot (`Allocation::gpus` entry: a GPU's index or a MIG instance's slot) → the job holding it
/// on node `node`, from the jobs' parts.
pub fn gpu_holders<'a>(jobs: impl IntoIterator<Item = &'a proto::Job>, node: proto::NodeId) -> BTreeMap<u32, JobId> {
    let mut out = BTreeMap::new();
    for job in jobs {
        for part in job.parts.iter().filter(|p| p.alloc.node == node) {
            for gpu in &part.alloc.gpus {
                out.insert(*gpu, job.id);
            }
        }
    }
    out
}

/// A node's state as `corral_node_state` names it: sinfo's long word (`%T`: idle, mixed,
/// allocated, draining, drained, down), without the `*` of a node that does not respond.
pub fn state_word(n: &NodeInfo) -> &'static str {
    slurm_compat::show::node_state(n).1.trim_end_matches('*')
}

/// Reads everything a scrape shows from `node`.
pub fn snapshot(node: &Node) -> MetricsSnapshot {
    let info = node.cluster_info(false);
    let (gpus, jobs) = gpus_and_jobs(node);
    let node_infos = node.node_infos();
    let member = node_infos.iter().any(|n| n.id == node.id && n.role != NodeRole::Agent);
    MetricsSnapshot {
        hostname: node.config.name.clone(),
        raft_term: info.term,
        raft_is_leader: info.leader_id == Some(node.id),
        raft_commit_index: info.commit_index,
        raft_applied_index: info.applied_index,
        agent_running_jobs: node.agent.running().len() as u64,
        passes_paced: node.paced.read(),
        transport: transport::counters(),
        cluster: member.then(|| cluster_snapshot(node, &node_infos)),
        gpus,
        jobs,
    }
}

/// This node's GPU samples with the job holding each, and the jobs holding them or running
/// here. Holders come from the replicated state's parts (a MIG instance by its slot); a node
/// without that state (an agent) takes them from the runs it supervises.
fn gpus_and_jobs(node: &Node) -> (HeldGpus, BTreeMap<JobId, JobOnNode>) {
    let running = node.agent.running_jobs();
    let (holders, mut jobs) = node.state.read(|s| {
        let holders = gpu_holders(s.jobs.values(), node.id);
        let owner = |j: &proto::Job| JobOnNode {
            user: j.spec.user.clone(),
            account: j.spec.account.clone().unwrap_or_default(),
            ..JobOnNode::default()
        };
        let jobs: BTreeMap<JobId, JobOnNode> = holders.values().filter_map(|id| s.jobs.get(id)).map(|j| (j.id, owner(j))).collect();
        (holders, jobs)
    });
    let mut unknown: BTreeMap<u32, JobId> = BTreeMap::new();
    for r in &running {
        if !jobs.contains_key(&r.job) {
            unknown.extend(r.slots.iter().map(|g| (*g, r.job)));
        }
        let cgroup = r.cgroup.as_deref();
        let job = JobOnNode {
            user: r.user.clone(),
            account: r.account.clone(),
            memory_used_bytes: cgroup.and_then(crate::run::cgroup::JobCgroup::memory_used_bytes),
            memory_limit_bytes: cgroup.and_then(crate::run::cgroup::JobCgroup::memory_limit_bytes),
        };
        jobs.insert(r.job, job);
    }
    let held: BTreeSet<u32> = holders.keys().chain(unknown.keys()).copied().collect();
    let samples = match node.gpu_sampler().sample(&held) {
        Ok(samples) => samples,
        Err(e) => {
            warn!(error = %format!("{e:#}"), "sample gpus");
            Vec::new()
        }
    };
    // A MIG-mode GPU's own sample has its index as slot; no job holds it whole.
    let mig_gpus: BTreeSet<u32> = samples.iter().filter(|s| s.mig.is_some()).map(|s| s.gpu).collect();
    let gpus = samples
        .into_iter()
        .map(|s| {
            let whole = s.mig.is_none() && !mig_gpus.contains(&s.gpu);
            let job = holders.get(&s.slot()).or_else(|| unknown.get(&s.gpu).filter(|_| whole)).copied();
            (s, job)
        })
        .collect();
    (gpus, jobs)
}

/// The cluster-wide series, from the replicated state of a member.
fn cluster_snapshot(node: &Node, node_infos: &[NodeInfo]) -> ClusterSnapshot {
    let now_ms = crate::server::now_ms();
    let (jobs_by_state, queue_depth, mut queue_wait_ms_max, requeues, stores) = node.state.read(|s| {
        // Every state is listed, even with no job in it.
        let mut by_state: BTreeMap<&'static str, u64> = JobState::ALL.iter().map(|st| (st.as_str(), 0)).collect();
        let mut queue: BTreeMap<(String, &'static str), u64> = BTreeMap::new();
        let mut wait: BTreeMap<String, u64> = BTreeMap::new();
        for j in s.jobs.values() {
            *by_state.entry(j.state.as_str()).or_default() += 1;
            let kind = match j.state {
                JobState::Pending if j.spec.hold => "held",
                JobState::Pending => "pending",
                JobState::Running => "running",
                _ => continue,
            };
            let partition = j.spec.partition.clone().unwrap_or_else(|| proto::DEFAULT_PARTITION.into());
            if kind == "pending" {
                let waited_ms = now_ms.saturating_sub(j.submit_ms);
                let longest = wait.entry(partition.clone()).or_default();
                *longest = (*longest).max(waited_ms);
            }
            *queue.entry((partition, kind)).or_default() += 1;
        }
        let stores = (s.stores.len() as u64, s.stores.values().map(|st| st.bytes as u64).sum::<u64>());
        (by_state, queue, wait, s.requeues, stores)
    });
    for partition in node_infos.iter().flat_map(|n| &n.partitions) {
        queue_wait_ms_max.entry(partition.clone()).or_default();
    }
    let ages = node.heartbeat_ages_ms();
    let nodes = node_infos
        .iter()
        .map(|n| NodeSnapshot {
            name: n.name.clone(),
            gpus_total: n.gpus_total,
            gpus_free: n.gpus_free,
            up: n.state == proto::NodeState::Up,
            state: state_word(n),
            heartbeat_age_ms: ages.get(&n.id).copied(),
        })
        .collect();
    ClusterSnapshot {
        jobs_by_state,
        queue_depth,
        queue_wait_ms_max,
        requeues,
        rendezvous_stores: stores.0,
        rendezvous_store_bytes: stores.1,
        nodes,
    }
}

/// Renders every metric of `node` in the Prometheus text format.
pub fn render(node: &Node) -> String {
    render_snapshot(&snapshot(node))
}

fn int_gauge(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let g: Gauge = Gauge::default();
    g.set(i64::try_from(value).unwrap_or(i64::MAX));
    registry.register(name, help, g);
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The text of a scrape.
pub fn render_snapshot(snap: &MetricsSnapshot) -> String {
    let mut root = Registry::default();
    {
        let corral = root.sub_registry_with_prefix("corral");
        int_gauge(corral, "raft_term", "Current Raft term", snap.raft_term);
        int_gauge(corral, "raft_is_leader", "1 if this node is the leader", u64::from(snap.raft_is_leader));
        int_gauge(corral, "raft_commit_index", "Last committed log index", snap.raft_commit_index);
        int_gauge(corral, "raft_applied_index", "Last applied log index", snap.raft_applied_index);
        int_gauge(corral, "agent_running_jobs", "Job processes this node supervises", snap.agent_running_jobs);
        let paced: Family<Labels, Counter> = Family::default();
        for (why, passes) in &snap.passes_paced {
            paced.get_or_create(&labels(&[("why", why)])).inc_by(*passes);
        }
        corral.register(
            "scheduler_passes_paced",
            "Scheduling passes that started fewer jobs than fit: launches in flight, voters lagging or stalled",
            paced,
        );
        register_transport(corral, &snap.transport);
        if let Some(c) = &snap.cluster {
            register_cluster(corral, c);
        }
        register_job_gpu(corral, snap);
    }
    register_dcgm(&mut root, snap);
    register_slurm_job(&mut root, snap);
    let mut out = String::new();
    if let Err(e) = encode(&mut out, &root) {
        warn!(error = %e, "encode metrics");
    }
    out
}

fn register_transport(corral: &mut Registry, t: &transport::Counters) {
    for (name, help, value) in [
        ("transport_connections_accepted", "QUIC connections this node accepted (handshakes served)", t.accepted),
        ("transport_connections_dialed", "QUIC connections this node dialed", t.dialed),
        ("transport_dials_failed", "Dials that got no handshake (peer dead, refused, timed out)", t.dials_failed),
        ("transport_connections_dropped", "Cached connections dropped after a call failed on them or heard nothing", t.dropped),
        ("transport_connections_refused_busy", "Connections refused because too many handshakes were under way", t.refused_busy),
    ] {
        let c: Counter = Counter::default();
        c.inc_by(value);
        corral.register(name, help, c);
    }
}

fn register_cluster(corral: &mut Registry, c: &ClusterSnapshot) {
    let jobs: Family<Labels, Gauge> = Family::default();
    for (state, n) in &c.jobs_by_state {
        jobs.get_or_create(&labels(&[("state", state)])).set(*n as i64);
    }
    corral.register("jobs", "Jobs by state", jobs);
    let queue: Family<Labels, Gauge> = Family::default();
    for ((partition, state), n) in &c.queue_depth {
        queue.get_or_create(&labels(&[("partition", partition), ("state", state)])).set(*n as i64);
    }
    corral.register("queue_depth", "Unfinished jobs by partition and state (pending, held, running)", queue);
    let wait: Family<Labels, FloatGauge> = Family::default();
    for (partition, ms) in &c.queue_wait_ms_max {
        wait.get_or_create(&labels(&[("partition", partition)])).set(*ms as f64 / 1000.0);
    }
    corral.register("queue_wait_seconds_max", "How long the oldest pending job of each partition has waited", wait);
    let requeues: Counter = Counter::default();
    requeues.inc_by(c.requeues);
    corral.register(
        "job_requeues",
        "Jobs put back in the queue since the cluster began (scontrol requeue, --requeue jobs of a lost node or GPU)",
        requeues,
    );
    int_gauge(corral, "rendezvous_stores", "Jobs whose rendezvous store holds anything (--rdzv-endpoint=corral)", c.rendezvous_stores);
    int_gauge(corral, "rendezvous_store_bytes", "Bytes of keys and values in the jobs' rendezvous stores", c.rendezvous_store_bytes);
    register_nodes(corral, &c.nodes);
}

fn register_nodes(corral: &mut Registry, nodes: &[NodeSnapshot]) {
    let gpus_total: Family<Labels, Gauge> = Family::default();
    let gpus_free: Family<Labels, Gauge> = Family::default();
    let node_up: Family<Labels, Gauge> = Family::default();
    let heartbeat_age: Family<Labels, FloatGauge> = Family::default();
    let node_state: Family<Labels, Gauge> = Family::default();
    for n in nodes {
        let l = labels(&[("node", &n.name)]);
        gpus_total.get_or_create(&l).set(i64::from(n.gpus_total));
        gpus_free.get_or_create(&l).set(i64::from(n.gpus_free));
        node_up.get_or_create(&l).set(i64::from(n.up));
        if let Some(age_ms) = n.heartbeat_age_ms {
            heartbeat_age.get_or_create(&l).set(age_ms as f64 / 1000.0);
        }
        // Every state listed, 1 for the node's: a state it left reads 0, not a stale 1.
        for state in NODE_STATES {
            node_state.get_or_create(&labels(&[("node", &n.name), ("state", state)])).set(i64::from(n.state == state));
        }
    }
    corral.register("node_gpus_total", "GPUs of each node", gpus_total);
    corral.register("node_gpus_free", "Free GPUs of each node", gpus_free);
    corral.register("node_up", "1 if the node is UP", node_up);
    corral.register(
        "node_state",
        "1 for the node's Slurm state (idle, mixed, allocated, draining, drained, down), 0 for the others",
        node_state,
    );
    if nodes.iter().any(|n| n.heartbeat_age_ms.is_some()) {
        corral.register("node_heartbeat_age_seconds", "Seconds since the leader last heard from each node", heartbeat_age);
    }
}

fn register_job_gpu(corral: &mut Registry, snap: &MetricsSnapshot) {
    let mut by_job: BTreeMap<JobId, Vec<&GpuSample>> = BTreeMap::new();
    for (s, job) in &snap.gpus {
        if let Some(job) = job {
            by_job.entry(*job).or_default().push(s);
        }
    }
    if by_job.is_empty() {
        return;
    }
    let util: Family<Labels, FloatGauge> = Family::default();
    let mem: Family<Labels, Gauge> = Family::default();
    for (job, samples) in by_job {
        let l = labels(&[("job", &job.to_string()), ("node", &snap.hostname)]);
        let utils: Vec<f64> = samples.iter().filter_map(|s| s.utilization_pct).map(f64::from).collect();
        if !utils.is_empty() {
            util.get_or_create(&l).set(utils.iter().sum::<f64>() / utils.len() as f64);
        }
        let used_bytes: u64 = samples.iter().map(|s| s.memory_used_mib.saturating_mul(1024 * 1024)).sum();
        mem.get_or_create(&l).set(i64::try_from(used_bytes).unwrap_or(i64::MAX));
    }
    corral.register("job_gpu_utilization", "Mean GPU utilization (%) of a job's GPUs on this node", util);
    corral.register("job_gpu_memory_used_bytes", "GPU memory a job uses on this node", mem);
}

/// DCGM exporter's names, units and labels, so existing dashboards work unchanged. A MIG
/// instance's series carry `GPU_I_ID` and `GPU_I_PROFILE` and the job holding that instance; its
/// GPU's own series are the device-wide ones (temperature, power), so memory is not counted
/// twice. Utilization is `DCGM_FI_DEV_GPU_UTIL` for a whole GPU and, as DCGM gives it for MIG,
/// `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio) for an instance; neither is shown where the device
/// gives no reading.
fn register_dcgm(root: &mut Registry, snap: &MetricsSnapshot) {
    if snap.gpus.is_empty() {
        return;
    }
    let util: Family<Labels, Gauge> = Family::default();
    let gr_active: Family<Labels, FloatGauge> = Family::default();
    let fb_used: Family<Labels, Gauge> = Family::default();
    let fb_free: Family<Labels, Gauge> = Family::default();
    let temp: Family<Labels, Gauge> = Family::default();
    let power: Family<Labels, FloatGauge> = Family::default();
    let mig_gpus: BTreeSet<u32> = snap.gpus.iter().filter(|(s, _)| s.mig.is_some()).map(|(s, _)| s.gpu).collect();
    for (s, job) in &snap.gpus {
        let l = dcgm_labels(s, *job, &snap.hostname);
        let mib = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        if s.mig.is_some() {
            if let Some(u) = s.utilization_pct {
                gr_active.get_or_create(&l).set(f64::from(u) / 100.0);
            }
            fb_used.get_or_create(&l).set(mib(s.memory_used_mib));
            fb_free.get_or_create(&l).set(mib(s.memory_free_mib));
            continue;
        }
        if !mig_gpus.contains(&s.gpu) {
            if let Some(u) = s.utilization_pct {
                util.get_or_create(&l).set(i64::from(u));
            }
            fb_used.get_or_create(&l).set(mib(s.memory_used_mib));
            fb_free.get_or_create(&l).set(mib(s.memory_free_mib));
        }
        temp.get_or_create(&l).set(i64::from(s.temperature_c));
        power.get_or_create(&l).set(s.power_mw as f64 / 1000.0);
    }
    root.register("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)", util);
    root.register("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active", gr_active);
    root.register("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)", fb_used);
    root.register("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)", fb_free);
    root.register("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)", temp);
    root.register("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)", power);
}

/// DCGM exporter's labels of one GPU or MIG instance, and the job holding it.
fn dcgm_labels(s: &GpuSample, job: Option<JobId>, hostname: &str) -> Labels {
    let gpu = s.gpu.to_string();
    let device = format!("nvidia{}", s.gpu);
    let job = job.map(|j| j.to_string()).unwrap_or_default();
    let mut pairs = vec![("gpu", gpu.as_str()), ("UUID", &s.uuid), ("device", &device), ("modelName", &s.model)];
    let gi_id = s.mig.as_ref().map(|m| m.gpu_instance_id.to_string());
    if let (Some(m), Some(id)) = (&s.mig, &gi_id) {
        pairs.push(("GPU_I_PROFILE", &m.profile));
        pairs.push(("GPU_I_ID", id));
    }
    pairs.push(("Hostname", hostname));
    pairs.push(("job", &job));
    labels(&pairs)
}

/// One job's use of one GPU: its samples there (a whole GPU, or its MIG instances of it).
#[derive(Default)]
struct JobOnGpu {
    utilization_pct: Vec<u32>,
    memory_utilization_pct: Vec<u32>,
    memory_used_bytes: u64,
    /// The GPU's (a MIG instance reports its GPU's).
    power_mw: u64,
}

fn mean_pct(values: &[u32]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().map(|v| f64::from(*v)).sum::<f64>() / values.len() as f64)
}

/// slurm-job-exporter's per-job series (github.com/guilbaults/slurm-job-exporter, as it reads
/// NVML), with its names, units and labels: `user`, `account`, `slurmjobid`, `gpu` (the GPU's
/// index; a MIG instance's parent's, as that exporter has no MIG label) and `gpu_type` (the
/// model), and none of this node's own, so queries written for that exporter work unchanged.
/// A job's instances of one GPU make one series (memory summed, utilization averaged).
/// `slurm_job_gpu_utilization` is `slurm_job_utilization_gpu` under the name Slurm GPU guides
/// query. Jobs in cgroups also get `slurm_job_memory_usage` and `slurm_job_memory_limit`.
fn register_slurm_job(root: &mut Registry, snap: &MetricsSnapshot) {
    let mut per_gpu: BTreeMap<(JobId, u32, &str), JobOnGpu> = BTreeMap::new();
    for (s, job) in &snap.gpus {
        let Some(job) = job else { continue };
        let g = per_gpu.entry((*job, s.gpu, s.model.as_str())).or_default();
        g.utilization_pct.extend(s.utilization_pct);
        g.memory_utilization_pct.extend(s.memory_utilization_pct);
        g.memory_used_bytes = g.memory_used_bytes.saturating_add(s.memory_used_mib.saturating_mul(1024 * 1024));
        g.power_mw = g.power_mw.max(s.power_mw);
    }
    let int = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let owner = |job: &JobId| snap.jobs.get(job).cloned().unwrap_or_default();
    let util: Family<Labels, FloatGauge> = Family::default();
    let mem_util: Family<Labels, FloatGauge> = Family::default();
    let mem: Family<Labels, Gauge> = Family::default();
    let power: Family<Labels, Gauge> = Family::default();
    for ((job, gpu, model), g) in &per_gpu {
        let o = owner(job);
        let (id, index) = (job.to_string(), gpu.to_string());
        let l = labels(&[("user", &o.user), ("account", &o.account), ("slurmjobid", &id), ("gpu", &index), ("gpu_type", model)]);
        if let Some(pct) = mean_pct(&g.utilization_pct) {
            util.get_or_create(&l).set(pct);
        }
        if let Some(pct) = mean_pct(&g.memory_utilization_pct) {
            mem_util.get_or_create(&l).set(pct);
        }
        mem.get_or_create(&l).set(int(g.memory_used_bytes));
        power.get_or_create(&l).set(int(g.power_mw));
    }
    if !per_gpu.is_empty() {
        let kernels = "Percent of time over the past sample period during which one or more kernels was executing on the GPU";
        root.register("slurm_job_utilization_gpu", kernels, util.clone());
        root.register(
            "slurm_job_utilization_gpu_memory",
            "Percent of time over the past sample period during which global (device) memory was being read or written",
            mem_util,
        );
        root.register("slurm_job_memory_usage_gpu", "Memory used by a job on a GPU", mem);
        root.register("slurm_job_power_gpu", "Power used by a job on a GPU in mW", power);
        root.register(
            "slurm_job_gpu_utilization",
            "GPU utilization of a job (%): slurm_job_utilization_gpu, as Slurm GPU guides name it",
            util,
        );
    }
    let used: Family<Labels, Gauge> = Family::default();
    let limit: Family<Labels, Gauge> = Family::default();
    for (job, o) in snap.jobs.iter().filter(|(_, o)| o.memory_used_bytes.is_some()) {
        let l = labels(&[("user", &o.user), ("account", &o.account), ("slurmjobid", &job.to_string())]);
        used.get_or_create(&l).set(int(o.memory_used_bytes.unwrap_or_default()));
        if let Some(bytes) = o.memory_limit_bytes {
            limit.get_or_create(&l).set(int(bytes));
        }
    }
    if snap.jobs.values().any(|o| o.memory_used_bytes.is_some()) {
        root.register("slurm_job_memory_usage", "Memory used by a job", used);
        root.register("slurm_job_memory_limit", "Memory limit of a job", limit);
    }
}

/// The request line and headers (up to the blank line; a client may send them in several
/// writes), at most [`REQUEST_BYTES_MAX`] within 5 s; `None` when the client sent less.
async fn read_request_head(stream: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= REQUEST_BYTES_MAX {
            return None;
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    Some(head)
}

pub async fn serve(addr: SocketAddr, node: Arc<Node>) {
    let listener = match TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            warn!(addr = %addr, error = %e, "metrics listener not started");
            return;
        }
    };
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "accept metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let node = Arc::clone(&node);
        tokio::spawn(async move {
            let Some(head) = read_request_head(&mut stream).await else { return };
            let request = String::from_utf8_lossy(&head);
            let (status, body) = if request.starts_with("GET /metrics") {
                // NVML sampling blocks for a few milliseconds per GPU.
                let node = Arc::clone(&node);
                match tokio::task::spawn_blocking(move || render(&node)).await {
                    Ok(body) => ("200 OK", body),
                    Err(e) => {
                        warn!(error = %e, "render metrics");
                        ("500 Internal Server Error", "render failed\n".to_string())
                    }
                }
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = stream.write_all(response.as_bytes()).await {
                debug!(peer = %peer, error = %e, "write metrics response");
            }
        });
    }
}
