//! The node's configuration file (`corrald --config node.toml`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeConfig {
    /// Unique node name, e.g. `gpu01`.
    pub name: String,
    /// `SLURM_CLUSTER_NAME` of jobs.
    #[serde(default = "default_cluster_name")]
    pub cluster_name: String,
    /// Address to bind the QUIC port to.
    pub listen: SocketAddr,
    /// Address other nodes and clients reach this node at; defaults to `listen`.
    #[serde(default)]
    pub advertise: Option<String>,
    pub data_dir: PathBuf,
    pub tls: transport::pki::TlsPaths,
    /// This node creates the cluster when its data directory is empty.
    #[serde(default)]
    pub bootstrap: bool,
    /// Members to join through (any node of the cluster).
    #[serde(default)]
    pub join: Vec<String>,
    /// Shared secret a joining node presents.
    pub join_token: String,
    /// `h100:8`, `none`, ... (simulated inventory; NVML comes with `auto` in a later issue).
    #[serde(default = "default_gpus")]
    pub gpus: String,
    /// CPUs and memory offered to jobs; default: this machine's.
    #[serde(default)]
    pub cpus: Option<u32>,
    #[serde(default)]
    pub memory_mib: Option<u64>,
    #[serde(default = "default_voters_max")]
    pub voters_max: usize,
    #[serde(default = "default_heartbeat_interval_ms")]
    pub heartbeat_interval_ms: u64,
    /// A node whose heartbeats stop for this long is marked DOWN.
    #[serde(default = "default_node_down_after_ms")]
    pub node_down_after_ms: u64,
    /// A voter DOWN for this long is replaced by a healthy agent.
    #[serde(default = "default_voter_replace_after_ms")]
    pub voter_replace_after_ms: u64,
    /// Time between SIGTERM and SIGKILL when a job is stopped.
    #[serde(default = "default_kill_grace_ms")]
    pub kill_grace_ms: u64,
    #[serde(default = "default_schedule_interval_ms")]
    pub schedule_interval_ms: u64,
    /// A finished job stays in the replicated hot state this long (Slurm's `MinJobAge`), then
    /// moves to the accounting store, where `sacct` still finds it.
    #[serde(default = "default_min_job_age_s")]
    pub min_job_age_s: u64,
    /// Accounting records older than this are pruned (by a committed command).
    #[serde(default = "default_accounting_retention_days")]
    pub accounting_retention_days: u64,
    /// How often GPU utilization and memory are sampled for each job's accounting.
    #[serde(default = "default_gpu_sample_interval_ms")]
    pub gpu_sample_interval_ms: u64,
    #[serde(default)]
    pub raft: RaftConfig,
    /// `host:port` for Prometheus metrics over HTTP; none to disable.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// The local socket for the CLI on this node (peer credentials say who calls). Default
    /// `DATA_DIR/corral.sock`; deployed nodes use `/run/corral/corral.sock`.
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// The cluster CA's key, on the node that signs the certificates of enrolling machines
    /// (`corral cluster init` sets it on the first node). Keep it on as few nodes as possible.
    #[serde(default)]
    pub ca_key: Option<PathBuf>,
    /// Renew this node's certificate when fewer than this many ms are left (default 30 days).
    #[serde(default = "default_cert_renew_before_ms")]
    pub cert_renew_before_ms: u64,
    /// How often the certificate's expiry is checked (default 1 h).
    #[serde(default = "default_cert_check_interval_ms")]
    pub cert_check_interval_ms: u64,
    /// Run each job as the user who submitted it (uid, gid, groups). Needs corrald to run as
    /// root; `false` runs jobs as corrald's own user (development clusters).
    #[serde(default = "default_true")]
    pub run_as_user: bool,
    /// Confine jobs in cgroup v2: `auto` (the default: where a writable cgroup v2 hierarchy
    /// exists), `off`, or the path of the cgroup to create job cgroups under.
    #[serde(default)]
    pub cgroup: Option<String>,
    /// An agent that has not reached a leader for this long stops its jobs itself, so a job
    /// requeued elsewhere cannot still run here. Default: as late as is safe (see
    /// [`NodeConfig::fence_after_ms`]).
    #[serde(default)]
    pub fence_after_ms: Option<u64>,
    /// Time between SIGTERM and SIGKILL when fencing (short: the node may already be replaced).
    #[serde(default = "default_fence_kill_grace_ms")]
    pub fence_kill_grace_ms: u64,
    /// Where each run's records (`shepherd`), the watchdog lease, the daemon record and the
    /// runs' scripts and hostfiles live: files that matter only while this host is up (a reboot
    /// ends every job). About ten are created and removed per run; on a tmpfs that costs no
    /// disk inode allocation (on ext4 inode allocation alone was 16% of a busy host's CPU under a sweep of
    /// trivial jobs). Default `DATA_DIR/jobs`; deployed nodes use `/run/corral/jobs`, and
    /// `corral dev up` a directory under `/dev/shm`.
    #[serde(default)]
    pub runtime_dir: Option<PathBuf>,
    /// Root of the per-job checkpoint directories (`CORRAL_CHECKPOINT_DIR`); meant for shared
    /// storage. Default: `data_dir/checkpoints`.
    #[serde(default)]
    pub checkpoint_root: Option<PathBuf>,
    #[serde(default)]
    pub nccl: NcclConfig,
    /// Where the node sits in the network (block, rack, leaf switch, NVLink domain).
    #[serde(default)]
    pub location: proto::NetworkLocation,
    /// Users who may act on any job and on the cluster (drain, resume, policy, GPU health).
    #[serde(default = "default_admins")]
    pub admins: Vec<String>,
    /// Features `--constraint` matches.
    #[serde(default)]
    pub features: Vec<String>,
    /// Partitions the node belongs to (none: the default partition).
    #[serde(default)]
    pub partitions: Vec<String>,
    /// Shards of each GPU outside MIG mode (Slurm's `gres/shard`): jobs asking
    /// `--gres=shard:N` share a GPU, N of its shards each, while no job holds it whole. 0 (the
    /// default): GPUs are not shared.
    #[serde(default)]
    pub shards_per_gpu: u32,
    /// A hosts file the node's jobs see as `/etc/hosts` (each run in a mount namespace of its
    /// own, with the file bind-mounted there; needs corrald to run as root): for clusters whose
    /// node names no resolver knows, such as `corral dev up`'s. Whole: it replaces the system's
    /// file for the jobs. Unset: the system's `/etc/hosts`.
    #[serde(default)]
    pub job_hosts_file: Option<PathBuf>,
    /// The device file of GPU 0, 1, ... in order, instead of those the probe found (NVML:
    /// `/dev/nvidiaN`). For simulated GPUs, to exercise device fencing on a machine without
    /// GPUs; rarely needed otherwise.
    #[serde(default)]
    pub gpu_device_files: Vec<PathBuf>,
}

/// Per-node overrides of the NCCL variables derived from the hardware. A job's own settings win.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NcclConfig {
    pub socket_ifname: Option<String>,
    pub ib_hca: Option<String>,
    pub ib_disable: Option<bool>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftConfig {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub snapshot_logs_since_last: u64,
    pub max_in_snapshot_log_to_keep: u64,
}

impl Default for RaftConfig {
    fn default() -> Self {
        let t = consensus::RaftTimings::default();
        RaftConfig {
            heartbeat_interval_ms: t.heartbeat_interval_ms,
            election_timeout_min_ms: t.election_timeout_min_ms,
            election_timeout_max_ms: t.election_timeout_max_ms,
            snapshot_logs_since_last: t.snapshot_logs_since_last,
            max_in_snapshot_log_to_keep: t.max_in_snapshot_log_to_keep,
        }
    }
}

impl RaftConfig {
    pub fn timings(&self) -> consensus::RaftTimings {
        consensus::RaftTimings {
            heartbeat_interval_ms: self.heartbeat_interval_ms,
            election_timeout_min_ms: self.election_timeout_min_ms,
            election_timeout_max_ms: self.election_timeout_max_ms,
            snapshot_logs_since_last: self.snapshot_logs_since_last,
            max_in_snapshot_log_to_keep: self.max_in_snapshot_log_to_keep,
        }
    }
}

fn default_admins() -> Vec<String> {
    vec!["root".into()]
}
fn default_cluster_name() -> String {
    "corral".into()
}
fn default_gpus() -> String {
    "none".into()
}
fn default_voters_max() -> usize {
    3
}
fn default_cert_renew_before_ms() -> u64 {
    30 * 24 * 3600 * 1000
}
fn default_cert_check_interval_ms() -> u64 {
    3600 * 1000
}
fn default_true() -> bool {
    true
}
/// 250 ms beats and a 3.5 s grace: a dead or cut-off node's jobs run again elsewhere within 5 s,
/// its leader's host's too (an election comes first), and a node keeps 2.15 s of lease
/// (`fence_after_ms`), over twice the time a failover takes. A fleet of a thousand nodes or more
/// raises both (docs/manual/configuration.md).
fn default_heartbeat_interval_ms() -> u64 {
    250
}
fn default_node_down_after_ms() -> u64 {
    3_500
}
fn default_voter_replace_after_ms() -> u64 {
    15_000
}
fn default_kill_grace_ms() -> u64 {
    5_000
}
fn default_fence_kill_grace_ms() -> u64 {
    500
}
fn default_gpu_sample_interval_ms() -> u64 {
    5_000
}
fn default_schedule_interval_ms() -> u64 {
    100
}
fn default_min_job_age_s() -> u64 {
    300
}
fn default_accounting_retention_days() -> u64 {
    365
}

/// A node name: 1-64 characters of `[A-Za-z0-9._-]`.
pub fn validate_node_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        bail!("node name '{name}' must be 1-64 characters of [A-Za-z0-9._-]");
    }
    Ok(())
}

impl NodeConfig {
    /// Slurm's `scontrol show config` keys that Corral has a counterpart for, with this node's
    /// values in Slurm's formats, sorted by key as Slurm lists them. What Corral has no
    /// counterpart for (slurmdbd, munge, plugins it does not load) is not listed. `cgroups`:
    /// whether this node confines its jobs in cgroups.
    pub fn slurm_config(&self, cgroups: bool) -> Vec<(String, String)> {
        let secs = |ms: u64| format!("{} sec", ms.div_ceil(1000));
        let pick = |on: bool, yes: &str, no: &str| if on { yes } else { no }.to_string();
        let mut out: Vec<(String, String)> = [
            ("ClusterName", self.cluster_name.clone()),
            ("FirstJobId", "1".to_string()),
            ("GresTypes", "gpu".to_string()),
            ("KillWait", secs(self.kill_grace_ms)),
            ("MaxArraySize", proto::limits::ARRAY_TASKS_MAX.to_string()),
            ("MinJobAge", format!("{} sec", self.min_job_age_s)),
            ("MpiDefault", "none".to_string()),
            ("PriorityType", "priority/multifactor".to_string()),
            ("ProctrackType", pick(cgroups, "proctrack/cgroup", "proctrack/pgid")),
            // A DOWN node that heartbeats again is UP at once.
            ("ReturnToService", "2".to_string()),
            ("SchedulerType", "sched/backfill".to_string()),
            ("SelectType", "select/cons_tres".to_string()),
            // The longest a leader may be gone before the voters elect another.
            ("SlurmctldTimeout", secs(self.raft.election_timeout_max_ms)),
            ("SlurmdTimeout", secs(self.node_down_after_ms)),
            ("StateSaveLocation", self.data_dir.display().to_string()),
            ("TaskPlugin", pick(cgroups, "task/cgroup", "task/none")),
            ("TmpFS", "/tmp".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        out.sort_by_key(|(k, _)| k.to_ascii_lowercase());
        out
    }

    pub fn load(path: &Path) -> anyhow::Result<NodeConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read node config at {}", path.display()))?;
        let mut config: NodeConfig = toml::from_str(&text).with_context(|| format!("parse node config at {}", path.display()))?;
        config.resolve_relative(path.parent().unwrap_or(Path::new(".")));
        config.validate()?;
        Ok(config)
    }

    /// Paths in the file are relative to the file's directory.
    fn resolve_relative(&mut self, base: &Path) {
        for p in [&mut self.data_dir, &mut self.tls.ca_cert, &mut self.tls.cert, &mut self.tls.key] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        for p in [
            self.checkpoint_root.as_mut(),
            self.ca_key.as_mut(),
            self.socket.as_mut(),
            self.job_hosts_file.as_mut(),
            self.runtime_dir.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        validate_node_name(&self.name)?;
        if self.shards_per_gpu > proto::limits::SHARDS_PER_GPU_MAX {
            bail!("shards_per_gpu must be at most {}, not {}", proto::limits::SHARDS_PER_GPU_MAX, self.shards_per_gpu);
        }
        if !(self.voters_max == 1 || self.voters_max == 3 || self.voters_max == 5) {
            bail!("voters_max must be 1, 3 or 5, not {}", self.voters_max);
        }
        if !self.bootstrap && self.join.is_empty() {
            bail!("a node that does not bootstrap needs at least one `join` address");
        }
        if self.node_down_after_ms <= 2 * self.heartbeat_interval_ms {
            bail!("node_down_after_ms must be more than twice heartbeat_interval_ms");
        }
        if self.heartbeat_interval_ms < crate::run::watchdog::POLL_MS {
            bail!("heartbeat_interval_ms must be at least {} ms (the watchdog's poll interval)", crate::run::watchdog::POLL_MS);
        }
        let fence = self.fence_after_ms();
        if fence < self.heartbeat_interval_ms
            || fence + self.fence_kill_grace_ms + 2 * self.heartbeat_interval_ms >= self.node_down_after_ms
        {
            bail!(
                "fence_after_ms ({fence}) + fence_kill_grace_ms ({}) + 2 x heartbeat_interval_ms must stay below node_down_after_ms ({}): \
                 a partitioned node must stop its jobs before they can be started elsewhere",
                self.fence_kill_grace_ms,
                self.node_down_after_ms
            );
        }
        if self.raft.election_timeout_min_ms >= self.raft.election_timeout_max_ms
            || self.raft.heartbeat_interval_ms >= self.raft.election_timeout_min_ms
        {
            bail!("raft timings must satisfy heartbeat < election_timeout_min < election_timeout_max");
        }
        Ok(())
    }

    pub fn advertise_addr(&self) -> String {
        self.advertise.clone().unwrap_or_else(|| self.listen.to_string())
    }

    /// As late as is safe: a leader (a new one restarts every node's clock) declares this node
    /// dead no sooner than `node_down_after_ms` after its last heartbeat; the agent notices the
    /// silence up to a heartbeat late, its last ack may trail the heartbeat by a round trip, and
    /// stopping takes `fence_kill_grace_ms`. The margin covers the round trip.
    pub fn fence_after_ms(&self) -> u64 {
        self.fence_after_ms.unwrap_or_else(|| {
            control::agent::fence_after_ms(self.node_down_after_ms, self.fence_kill_grace_ms, self.heartbeat_interval_ms)
        })
    }

    pub fn checkpoint_root(&self) -> PathBuf {
        self.checkpoint_root.clone().unwrap_or_else(|| self.data_dir.join("checkpoints"))
    }

    /// The local socket the CLI on this node uses (`socket`, default `DATA_DIR/corral.sock`).
    pub fn socket_path(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(|| self.data_dir.join("corral.sock"))
    }

    /// The lease the watchdog process enforces (`watchdog`).
    pub fn lease_path(&self) -> PathBuf {
        self.runtime_dir().join("watchdog.lease")
    }

    /// Where the launch ledger lives (synced: it must outlive the host's crash).
    pub fn jobs_dir(&self) -> PathBuf {
        self.data_dir.join("jobs")
    }

    /// Where what matters only while the host is up lives (`runtime_dir`, default `jobs_dir`).
    pub fn runtime_dir(&self) -> PathBuf {
        self.runtime_dir.clone().unwrap_or_else(|| self.jobs_dir())
    }

    /// Each run's directory (`shepherd`).
    pub fn runs_dir(&self) -> PathBuf {
        self.runtime_dir().join("runs")
    }

    /// Each run's script and hostfile, in a directory per job.
    pub fn job_files_dir(&self) -> PathBuf {
        self.runtime_dir()
    }

    /// Which daemon runs this node's jobs (`daemon_record::DaemonRecord`); beside the lease, where
    /// the watchdog finds it.
    pub fn daemon_file(&self) -> PathBuf {
        crate::run::watchdog::daemon_file(&self.lease_path())
    }
}
