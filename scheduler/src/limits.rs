//! The accounting limits of associations, accounts and QoS (`sacctmgr ... set MaxJobs=
//! GrpJobs= GrpTRES=cpu=N,mem=M,node=K,gres/gpu=G MaxWall= MaxTRESPerJob=...`, a QoS's
//! `MaxTRESPerUser=`): what the running jobs hold against
//! them, counted once per pass and kept up to date as the pass starts jobs, and the reasons,
//! with Slurm's codes first, a pending job waits for them; `GrpWall=` used up (`crate::wall`).

use std::collections::BTreeMap;

use proto::JobState;

use crate::format::fmt_duration_ms;
use crate::view::{ClusterView, JobRequest};
use crate::wall::{LiveRun, WallUse};

/// What running jobs hold against the limits.
#[derive(Default)]
pub(crate) struct LimitUsage {
    /// Running jobs of each (user, account).
    assoc_jobs: BTreeMap<(String, String), u32>,
    /// What each (user, account)'s running jobs hold.
    assoc_tres: BTreeMap<(String, String), Tres>,
    /// What the running jobs under each account (its whole subtree) hold, and how many.
    account_tres: BTreeMap<String, Tres>,
    account_jobs: BTreeMap<String, u32>,
    /// What each QoS's running jobs hold and how many, and running jobs of each (QoS, user).
    qos_tres: BTreeMap<String, Tres>,
    qos_jobs: BTreeMap<String, u32>,
    qos_user_jobs: BTreeMap<(String, String), u32>,
    /// What each (QoS, user)'s running jobs hold (`MaxTRESPerUser`).
    qos_user_tres: BTreeMap<(String, String), Tres>,
    /// Wall-clock time used against each `GrpWall` as the pass began (`None`: none is set). A
    /// job the pass starts has used none yet.
    wall: Option<WallUse>,
}

/// The trackable resources of a job or a group of running jobs (Slurm's TRES that Corral
/// limits): GPUs, CPUs, memory and nodes.
#[derive(Clone, Copy, Default)]
struct Tres {
    gpus: u64,
    cpus: u64,
    mem_mib: u64,
    nodes: u64,
}

impl Tres {
    fn of(j: &JobRequest) -> Tres {
        Tres::of_nodes(j, j.nodes)
    }

    /// What `j` holds on `nodes` nodes (a node range's job gets some number of its range).
    fn of_nodes(j: &JobRequest, nodes: u32) -> Tres {
        let gpus = u64::from(j.gpus_per_node) * u64::from(nodes);
        let nodes = u64::from(nodes);
        Tres { gpus, cpus: u64::from(j.cpus_per_node) * nodes, mem_mib: j.mem_per_node_mib * nodes, nodes }
    }

    fn add(&mut self, other: Tres) {
        self.gpus += other.gpus;
        self.cpus += other.cpus;
        self.mem_mib += other.mem_mib;
        self.nodes += other.nodes;
    }
}

/// One resource as limits and reasons name it: Slurm's reason code suffixes (`Grp…`, `Max…`
/// after `Assoc`/`QOS`), its TRES name, its words, and its amount in a [`Tres`] and limits.
struct Kind {
    grp_code: &'static str,
    max_code: &'static str,
    max_code_qos: &'static str,
    /// `QOS…` reason of a QoS's `MaxTRESPerUser`.
    per_user_code: &'static str,
    tres: &'static str,
    unit: &'static str,
    amount: fn(&Tres) -> u64,
    grp: fn(&proto::Limits) -> Option<u64>,
    per_job: fn(&proto::Limits) -> Option<u64>,
    per_user: fn(&proto::Limits) -> Option<u64>,
}

const KINDS: [Kind; 4] = [
    Kind {
        grp_code: "GrpGRES",
        max_code: "MaxGRESPerJob",
        max_code_qos: "MaxGRESPerJob",
        per_user_code: "MaxGRESPerUser",
        tres: "gres/gpu",
        unit: "GPUs",
        amount: |t| t.gpus,
        grp: |l| l.grp_gpus_max.map(u64::from),
        per_job: |l| l.gpus_per_job_max.map(u64::from),
        per_user: |l| l.gpus_per_user_max.map(u64::from),
    },
    Kind {
        grp_code: "GrpCpuLimit",
        max_code: "MaxCpuPerJobLimit",
        max_code_qos: "MaxCpuPerJobLimit",
        per_user_code: "MaxCpuPerUserLimit",
        tres: "cpu",
        unit: "CPUs",
        amount: |t| t.cpus,
        grp: |l| l.grp_cpus_max.map(u64::from),
        per_job: |l| l.cpus_per_job_max.map(u64::from),
        per_user: |l| l.cpus_per_user_max.map(u64::from),
    },
    Kind {
        grp_code: "GrpMemLimit",
        max_code: "MaxMemPerJob",
        max_code_qos: "MaxMemoryPerJob",
        per_user_code: "MaxMemoryPerUser",
        tres: "mem",
        unit: "MiB",
        amount: |t| t.mem_mib,
        grp: |l| l.grp_mem_mib_max,
        per_job: |l| l.mem_mib_per_job_max,
        per_user: |l| l.mem_mib_per_user_max,
    },
    Kind {
        grp_code: "GrpNodeLimit",
        max_code: "MaxNodePerJobLimit",
        max_code_qos: "MaxNodePerJobLimit",
        per_user_code: "MaxNodePerUserLimit",
        tres: "node",
        unit: "nodes",
        amount: |t| t.nodes,
        grp: |l| l.grp_nodes_max.map(u64::from),
        per_job: |l| l.nodes_per_job_max.map(u64::from),
        per_user: |l| l.nodes_per_user_max.map(u64::from),
    },
];

/// A limit's value as `GrpTRES`/`MaxTRESPerJob` print it (`mem` in MiB with Slurm's `M`).
fn tres_value(kind: &Kind, max: u64) -> String {
    if kind.tres == "mem" {
        format!("{max}M")
    } else {
        max.to_string()
    }
}

/// `prefix` (`Assoc`/`QOS`) group-limit reasons of `held` plus `job` against `limits`, for the
/// running jobs `whose` (words for the reason).
fn grp_reasons(out: &mut Vec<String>, prefix: &str, whose: &str, held: Tres, job: Tres, limits: &proto::Limits) {
    for k in &KINDS {
        let (have, more) = ((k.amount)(&held), (k.amount)(&job));
        if let Some(max) = (k.grp)(limits).filter(|&m| more > 0 && have + more > m) {
            out.push(format!(
                "{prefix}{}: the running jobs of {whose} hold {have} {}, {more} more would pass GrpTRES={}={}",
                k.grp_code,
                k.unit,
                k.tres,
                tres_value(k, max)
            ));
        }
    }
}

/// `prefix` per-job reasons of `job` against `limits`, of `whose` (`account X`, `QOS Y`).
fn per_job_reasons(out: &mut Vec<String>, prefix: &str, whose: &str, job: Tres, limits: &proto::Limits) {
    for k in &KINDS {
        let amount = (k.amount)(&job);
        if let Some(max) = (k.per_job)(limits).filter(|&m| amount > m) {
            let code = if prefix == "QOS" { k.max_code_qos } else { k.max_code };
            out.push(format!("{prefix}{code}: {amount} {} are over MaxTRESPerJob={}={} of {whose}", k.unit, k.tres, tres_value(k, max)));
        }
    }
}

/// A QoS's `MaxTRESPerUser` reasons: what `user`'s running jobs of it hold plus `job`.
fn per_user_reasons(out: &mut Vec<String>, qos: &str, user: &str, held: Tres, job: Tres, limits: &proto::Limits) {
    for k in &KINDS {
        let (have, more) = ((k.amount)(&held), (k.amount)(&job));
        if let Some(max) = (k.per_user)(limits).filter(|&m| more > 0 && have + more > m) {
            out.push(format!(
                "QOS{}: the running jobs of user {user} in QOS {qos} hold {have} {}, {more} more would pass MaxTRESPerUser={}={}",
                k.per_user_code,
                k.unit,
                k.tres,
                tres_value(k, max)
            ));
        }
    }
}

/// The account a job is charged to: its own, else its user's default.
fn account_of<'a>(view: &'a ClusterView, j: &'a JobRequest) -> Option<&'a str> {
    j.account.as_deref().or_else(|| view.accounts.default_account(&j.user))
}

fn qos_of(j: &JobRequest) -> &str {
    j.qos.as_deref().unwrap_or(proto::DEFAULT_QOS)
}

/// `MaxWall=` (minutes) as `H:MM:SS`, like the partitions' limits in reasons.
fn wall_text(min: u64) -> String {
    fmt_duration_ms(min.saturating_mul(60_000))
}

impl LimitUsage {
    /// `None` when nothing is limited: no association exists and no QoS has a limit.
    pub(crate) fn new(view: &ClusterView, now_ms: u64) -> Option<LimitUsage> {
        let qos_limited = view.config.qos.values().any(|q| q.limits != proto::Limits::default());
        if !view.accounts.enforced() && !qos_limited {
            return None;
        }
        let mut usage = LimitUsage::default();
        for j in view.jobs.iter().filter(|j| j.state == JobState::Running) {
            usage.add(view, j);
        }
        let qos_limit_min = view.config.qos.iter().filter_map(|(name, q)| Some((name.clone(), q.limits.grp_wall_min?))).collect();
        let live = view.jobs.iter().filter(|j| j.wall_ms_at(now_ms) > 0).map(|j| LiveRun {
            account: account_of(view, j),
            user: &j.user,
            qos: qos_of(j),
            wall_ms: j.wall_ms_at(now_ms),
        });
        let half_life_ms = view.config.decay_half_life_ms;
        usage.wall = WallUse::new(&view.accounts, qos_limit_min, &view.usage, &view.qos_usage, live, now_ms, half_life_ms);
        Some(usage)
    }

    /// Counts `j` as running (a job of the view, or one the pass starts).
    pub(crate) fn add(&mut self, view: &ClusterView, j: &JobRequest) {
        self.add_nodes(view, j, j.nodes);
    }

    /// Counts `j` as running on `nodes` nodes (a job of a node range the pass starts).
    pub(crate) fn add_nodes(&mut self, view: &ClusterView, j: &JobRequest, nodes: u32) {
        let tres = Tres::of_nodes(j, nodes);
        if let Some(account) = account_of(view, j) {
            let key = (j.user.clone(), account.to_string());
            *self.assoc_jobs.entry(key.clone()).or_default() += 1;
            self.assoc_tres.entry(key).or_default().add(tres);
            for a in view.accounts.lineage(account) {
                self.account_tres.entry(a.name.clone()).or_default().add(tres);
                *self.account_jobs.entry(a.name.clone()).or_default() += 1;
            }
        }
        let qos = qos_of(j).to_string();
        self.qos_tres.entry(qos.clone()).or_default().add(tres);
        *self.qos_jobs.entry(qos.clone()).or_default() += 1;
        self.qos_user_tres.entry((qos.clone(), j.user.clone())).or_default().add(tres);
        *self.qos_user_jobs.entry((qos, j.user.clone())).or_default() += 1;
    }

    /// Every limit `j` would pass if it started now, with `time_limit_ms` its time limit
    /// (`None`: unlimited): QoS limits first, then the association's and its accounts', as
    /// Slurm checks them.
    pub(crate) fn reasons(&self, view: &ClusterView, j: &JobRequest, time_limit_ms: Option<u64>) -> Vec<String> {
        self.reasons_as(view, j, Tres::of(j), time_limit_ms)
    }

    /// The most nodes of its range (`nodes..=nodes_max`) `j` may hold with `time_limit_ms`: no
    /// more limits would hold it than on its least, as Slurm's `acct_policy_get_max_nodes`
    /// lowers a job's most nodes to what the limits leave.
    pub(crate) fn nodes_allowed(&self, view: &ClusterView, j: &JobRequest, time_limit_ms: Option<u64>) -> u32 {
        let on_least = self.reasons_as(view, j, Tres::of(j), time_limit_ms).len();
        (j.nodes..=j.nodes_max)
            .rev()
            .find(|&n| self.reasons_as(view, j, Tres::of_nodes(j, n), time_limit_ms).len() <= on_least)
            .unwrap_or(j.nodes)
    }

    fn reasons_as(&self, view: &ClusterView, j: &JobRequest, job: Tres, time_limit_ms: Option<u64>) -> Vec<String> {
        let mut out = Vec::new();
        let time = time_limit_ms.map_or_else(|| "UNLIMITED".to_string(), fmt_duration_ms);
        let over_wall = |max_min: u64| time_limit_ms.is_none_or(|t| t > max_min.saturating_mul(60_000));
        let qos = qos_of(j);
        let wall_over = self.wall.as_ref().and_then(|w| w.over(&view.accounts, &j.user, account_of(view, j), qos));
        if let Some(l) = view.config.qos.get(qos).map(|q| &q.limits) {
            let running = self.qos_user_jobs.get(&(qos.to_string(), j.user.clone())).copied().unwrap_or(0);
            if let Some(max) = l.max_jobs.filter(|&m| running >= m) {
                out.push(format!("QOSMaxJobsPerUserLimit: user {} has {running} running jobs of QOS {qos} (MaxJobsPerUser={max})", j.user));
            }
            let all = self.qos_jobs.get(qos).copied().unwrap_or(0);
            if let Some(max) = l.grp_jobs_max.filter(|&m| all >= m) {
                out.push(format!("QOSGrpJobsLimit: QOS {qos} has {all} running jobs (GrpJobs={max})"));
            }
            if let Some(over) = wall_over.as_ref().filter(|o| o.code.starts_with("QOS")) {
                out.push(format!("{}: {}", over.code, over.words));
            }
            let held = self.qos_tres.get(qos).copied().unwrap_or_default();
            grp_reasons(&mut out, "QOS", &format!("QOS {qos}"), held, job, l);
            let user_held = self.qos_user_tres.get(&(qos.to_string(), j.user.clone())).copied().unwrap_or_default();
            per_user_reasons(&mut out, qos, &j.user, user_held, job, l);
            if let Some(max) = l.max_wall_min.filter(|&m| over_wall(m)) {
                out.push(format!("QOSMaxWallDurationPerJobLimit: time limit {time} is over MaxWall={} of QOS {qos}", wall_text(max)));
            }
            per_job_reasons(&mut out, "QOS", &format!("QOS {qos}"), job, l);
        }
        let Some(account) = account_of(view, j) else { return out };
        let Some(l) = view.accounts.effective_limits(&j.user, account) else { return out };
        let key = (j.user.clone(), account.to_string());
        let running = self.assoc_jobs.get(&key).copied().unwrap_or(0);
        if let Some(max) = l.max_jobs.filter(|&m| running >= m) {
            out.push(format!("AssocMaxJobsLimit: user {} has {running} running jobs in account {account} (MaxJobs={max})", j.user));
        }
        // The group limits of the user's association itself (an account's are below, per account).
        let own = view.accounts.assoc(&j.user, account).map(|a| a.limits.clone()).unwrap_or_default();
        if let Some(max) = own.grp_jobs_max.filter(|&m| running >= m) {
            out.push(format!("AssocGrpJobsLimit: user {} has {running} running jobs in account {account} (GrpJobs={max})", j.user));
        }
        if let Some(over) = wall_over.filter(|o| o.code.starts_with("Assoc")) {
            out.push(format!("{}: {}", over.code, over.words));
        }
        let held = self.assoc_tres.get(&key).copied().unwrap_or_default();
        grp_reasons(&mut out, "Assoc", &format!("user {} in account {account}", j.user), held, job, &own);
        for a in view.accounts.lineage(account) {
            let jobs = self.account_jobs.get(&a.name).copied().unwrap_or(0);
            if let Some(max) = a.limits.grp_jobs_max.filter(|&m| jobs >= m) {
                out.push(format!("AssocGrpJobsLimit: account {} has {jobs} running jobs (GrpJobs={max})", a.name));
            }
            let held = self.account_tres.get(&a.name).copied().unwrap_or_default();
            grp_reasons(&mut out, "Assoc", &format!("account {}", a.name), held, job, &a.limits);
        }
        if let Some(max) = l.max_wall_min.filter(|&m| over_wall(m)) {
            out.push(format!("AssocMaxWallDurationPerJobLimit: time limit {time} is over MaxWall={} of account {account}", wall_text(max)));
        }
        per_job_reasons(&mut out, "Assoc", &format!("account {account}"), job, &l);
        out
    }
}
