//! Multifactor priority, as integers so every node orders jobs the same way.
//!
//! `priority = round(w_age·age + w_size·size + w_partition·tier + w_qos·qos + w_fair·fair) - nice`
//! (never below 0; `nice` is `--nice`), each factor in [0, 1]:
//! - age: time waited since submit over `age_max_ms`, capped at 1;
//! - size: GPUs of the job over GPUs of the cluster (CPUs when the cluster has no GPUs);
//! - tier: the partition's priority tier over the highest tier;
//! - qos: the QoS priority over the highest QoS priority;
//! - fair: `M / (M + U)` where U is the user's (account's) decayed GPU-seconds and M the mean
//!   over the users (accounts) in `usage`; 1 without usage. With an account, the mean of the
//!   user and account factors. Only +, ·, / and rounding: the same bits on every machine.

use std::collections::BTreeMap;

use crate::view::{usage_key_account, usage_key_user, ClusterView, JobRequest};

fn mean_of(usage: &BTreeMap<String, f64>, prefix: &str) -> f64 {
    let (mut sum, mut n) = (0.0f64, 0u32);
    for (k, &v) in usage.range(prefix.to_string()..) {
        if !k.starts_with(prefix) {
            break;
        }
        if v.is_finite() && v > 0.0 {
            sum += v;
        }
        n += 1;
    }
    if n == 0 {
        0.0
    } else {
        sum / f64::from(n)
    }
}

fn share(usage: &BTreeMap<String, f64>, key: &str, mean: f64) -> f64 {
    let u = usage.get(key).copied().filter(|v| v.is_finite() && *v > 0.0).unwrap_or(0.0);
    if mean <= 0.0 {
        1.0
    } else {
        mean / (mean + u)
    }
}

/// Fair-share factor of a job in [0, 1].
pub fn fair_share(view: &ClusterView, job: &JobRequest) -> f64 {
    let user_mean = mean_of(&view.usage, "user:");
    let user = share(&view.usage, &usage_key_user(&job.user), user_mean);
    match &job.account {
        None => user,
        Some(a) => {
            let acc_mean = mean_of(&view.usage, "account:");
            (user + share(&view.usage, &usage_key_account(a), acc_mean)) / 2.0
        }
    }
}

/// Priority of every job of `view.jobs` (same order); 0 for jobs not pending or running.
pub fn priorities(view: &ClusterView, now_ms: u64) -> Vec<u64> {
    let w = &view.config.weights;
    let gpus_total: u64 = view.nodes.values().map(|n| n.gpus.len() as u64).sum();
    let cpus_total: u64 = view.nodes.values().map(|n| u64::from(n.cpus_total)).sum();
    let tier_max = view.partitions.values().map(|p| p.priority_tier).max().unwrap_or(0).max(1);
    let qos_max = view.config.qos.values().map(|q| q.priority).max().unwrap_or(0).max(1);
    let user_mean = mean_of(&view.usage, "user:");
    let acc_mean = mean_of(&view.usage, "account:");
    let default_tier = view.partitions.values().find(|p| p.default).map_or(0, |p| p.priority_tier);
    // Users repeat: cache their shares.
    let mut user_share: BTreeMap<&str, f64> = BTreeMap::new();
    let mut acc_share: BTreeMap<&str, f64> = BTreeMap::new();
    let age_max = view.config.age_max_ms.max(1) as f64;
    let mut out = Vec::with_capacity(view.jobs.len());
    for j in &view.jobs {
        if j.state.is_final() {
            out.push(0);
            continue;
        }
        let age = (now_ms.saturating_sub(j.submit_ms) as f64 / age_max).min(1.0);
        let size = if gpus_total > 0 {
            (j.total_gpus() as f64 / gpus_total as f64).min(1.0)
        } else {
            ((u64::from(j.cpus_per_node) * u64::from(j.nodes)) as f64 / cpus_total.max(1) as f64).min(1.0)
        };
        let tier = j.partition.as_ref().and_then(|p| view.partitions.get(p)).map_or(default_tier, |p| p.priority_tier);
        let tier = f64::from(tier) / f64::from(tier_max);
        let qos = j.qos.as_ref().and_then(|q| view.config.qos.get(q)).map_or(0, |q| q.priority);
        let qos = f64::from(qos) / f64::from(qos_max);
        let user = *user_share.entry(j.user.as_str()).or_insert_with(|| share(&view.usage, &usage_key_user(&j.user), user_mean));
        let fair = match &j.account {
            None => user,
            Some(a) => {
                let acc = *acc_share.entry(a.as_str()).or_insert_with(|| share(&view.usage, &usage_key_account(a), acc_mean));
                (user + acc) / 2.0
            }
        };
        let p = f64::from(w.age) * age
            + f64::from(w.job_size) * size
            + f64::from(w.partition) * tier
            + f64::from(w.qos) * qos
            + f64::from(w.fair_share) * fair;
        // `--nice`, as Slurm: subtracted after the factors, never below 0.
        out.push((p.round() as i64).saturating_sub(j.nice).max(0) as u64);
    }
    out
}
