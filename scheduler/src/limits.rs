//! The accounting limits of associations, accounts and QoS (`sacctmgr ... set MaxJobs=
//! GrpJobs= GrpTRES=gres/gpu=N MaxWall= MaxTRESPerJob=gres/gpu=N`): what the running jobs hold against
//! them, counted once per pass and kept up to date as the pass starts jobs, and the reasons,
//! with Slurm's codes first, a pending job waits for them.

use std::collections::BTreeMap;

use proto::JobState;

use crate::engine::fmt_duration_ms;
use crate::view::{ClusterView, JobRequest};

/// What running jobs hold against the limits.
#[derive(Default)]
pub(crate) struct LimitUsage {
    /// Running jobs of each (user, account).
    assoc_jobs: BTreeMap<(String, String), u32>,
    /// GPUs of each (user, account)'s running jobs.
    assoc_gpus: BTreeMap<(String, String), u64>,
    /// GPUs and running jobs under each account (its whole subtree).
    account_gpus: BTreeMap<String, u64>,
    account_jobs: BTreeMap<String, u32>,
    /// GPUs and running jobs of each QoS, and running jobs of each (QoS, user).
    qos_gpus: BTreeMap<String, u64>,
    qos_jobs: BTreeMap<String, u32>,
    qos_user_jobs: BTreeMap<(String, String), u32>,
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
    pub(crate) fn new(view: &ClusterView) -> Option<LimitUsage> {
        let qos_limited = view.config.qos.values().any(|q| q.limits != proto::Limits::default());
        if !view.accounts.enforced() && !qos_limited {
            return None;
        }
        let mut usage = LimitUsage::default();
        for j in view.jobs.iter().filter(|j| j.state == JobState::Running) {
            usage.add(view, j);
        }
        Some(usage)
    }

    /// Counts `j` as running (a job of the view, or one the pass starts).
    pub(crate) fn add(&mut self, view: &ClusterView, j: &JobRequest) {
        let gpus = j.total_gpus();
        if let Some(account) = account_of(view, j) {
            let key = (j.user.clone(), account.to_string());
            *self.assoc_jobs.entry(key.clone()).or_default() += 1;
            *self.assoc_gpus.entry(key).or_default() += gpus;
            for a in view.accounts.lineage(account) {
                *self.account_gpus.entry(a.name.clone()).or_default() += gpus;
                *self.account_jobs.entry(a.name.clone()).or_default() += 1;
            }
        }
        let qos = qos_of(j).to_string();
        *self.qos_gpus.entry(qos.clone()).or_default() += gpus;
        *self.qos_jobs.entry(qos.clone()).or_default() += 1;
        *self.qos_user_jobs.entry((qos, j.user.clone())).or_default() += 1;
    }

    /// Every limit `j` would pass if it started now, with `time_limit_ms` its time limit
    /// (`None`: unlimited): QoS limits first, then the association's and its accounts', as
    /// Slurm checks them.
    pub(crate) fn reasons(&self, view: &ClusterView, j: &JobRequest, time_limit_ms: Option<u64>) -> Vec<String> {
        let mut out = Vec::new();
        let gpus = j.total_gpus();
        let time = time_limit_ms.map_or_else(|| "UNLIMITED".to_string(), fmt_duration_ms);
        let over_wall = |max_min: u64| time_limit_ms.is_none_or(|t| t > max_min.saturating_mul(60_000));
        let qos = qos_of(j);
        if let Some(l) = view.config.qos.get(qos).map(|q| &q.limits) {
            let running = self.qos_user_jobs.get(&(qos.to_string(), j.user.clone())).copied().unwrap_or(0);
            if let Some(max) = l.max_jobs.filter(|&m| running >= m) {
                out.push(format!("QOSMaxJobsPerUserLimit: user {} has {running} running jobs of QOS {qos} (MaxJobsPerUser={max})", j.user));
            }
            let all = self.qos_jobs.get(qos).copied().unwrap_or(0);
            if let Some(max) = l.grp_jobs_max.filter(|&m| all >= m) {
                out.push(format!("QOSGrpJobsLimit: QOS {qos} has {all} running jobs (GrpJobs={max})"));
            }
            let held = self.qos_gpus.get(qos).copied().unwrap_or(0);
            if let Some(max) = l.grp_gpus_max.filter(|&m| gpus > 0 && held + gpus > u64::from(m)) {
                out.push(format!(
                    "QOSGrpGRES: the running jobs of QOS {qos} hold {held} GPUs, {gpus} more would pass GrpTRES=gres/gpu={max}"
                ));
            }
            if let Some(max) = l.max_wall_min.filter(|&m| over_wall(m)) {
                out.push(format!("QOSMaxWallDurationPerJobLimit: time limit {time} is over MaxWall={} of QOS {qos}", wall_text(max)));
            }
            if let Some(max) = l.gpus_per_job_max.filter(|&m| gpus > u64::from(m)) {
                out.push(format!("QOSMaxGRESPerJob: {gpus} GPUs are over MaxTRESPerJob=gres/gpu={max} of QOS {qos}"));
            }
        }
        let Some(account) = account_of(view, j) else { return out };
        let Some(l) = view.accounts.effective_limits(&j.user, account) else { return out };
        let key = (j.user.clone(), account.to_string());
        let running = self.assoc_jobs.get(&key).copied().unwrap_or(0);
        if let Some(max) = l.max_jobs.filter(|&m| running >= m) {
            out.push(format!("AssocMaxJobsLimit: user {} has {running} running jobs in account {account} (MaxJobs={max})", j.user));
        }
        // GrpJobs of the user's association itself (an account's is below, per account).
        let own_grp_jobs = view.accounts.assoc(&j.user, account).and_then(|a| a.limits.grp_jobs_max);
        if let Some(max) = own_grp_jobs.filter(|&m| running >= m) {
            out.push(format!("AssocGrpJobsLimit: user {} has {running} running jobs in account {account} (GrpJobs={max})", j.user));
        }
        let held = self.assoc_gpus.get(&key).copied().unwrap_or(0);
        if let Some(max) = l.grp_gpus_max.filter(|&m| gpus > 0 && held + gpus > u64::from(m)) {
            out.push(format!(
                "AssocGrpGRES: the running jobs of user {} in account {account} hold {held} GPUs, {gpus} more would pass GrpTRES=gres/gpu={max}",
                j.user
            ));
        }
        for a in view.accounts.lineage(account) {
            let jobs = self.account_jobs.get(&a.name).copied().unwrap_or(0);
            if let Some(max) = a.limits.grp_jobs_max.filter(|&m| jobs >= m) {
                out.push(format!("AssocGrpJobsLimit: account {} has {jobs} running jobs (GrpJobs={max})", a.name));
            }
            let held = self.account_gpus.get(&a.name).copied().unwrap_or(0);
            if let Some(max) = a.limits.grp_gpus_max.filter(|&m| gpus > 0 && held + gpus > u64::from(m)) {
                out.push(format!(
                    "AssocGrpGRES: the running jobs of account {} hold {held} GPUs, {gpus} more would pass GrpTRES=gres/gpu={max}",
                    a.name
                ));
            }
        }
        if let Some(max) = l.max_wall_min.filter(|&m| over_wall(m)) {
            out.push(format!("AssocMaxWallDurationPerJobLimit: time limit {time} is over MaxWall={} of account {account}", wall_text(max)));
        }
        if let Some(max) = l.gpus_per_job_max.filter(|&m| gpus > u64::from(m)) {
            out.push(format!("AssocMaxGRESPerJob: {gpus} GPUs are over MaxTRESPerJob=gres/gpu={max} of account {account}"));
        }
        out
    }
}
