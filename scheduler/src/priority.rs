//! Multifactor priority, as integers so every node orders jobs the same way.
//!
//! `priority = round(w_age·age + w_size·size + w_partition·tier + w_qos·qos + w_fair·fair) - nice`
//! (never below 0; `nice` is `--nice`), each factor in [0, 1]:
//! - age: time waited since submit over `age_max_ms`, capped at 1;
//! - size: GPUs of the job over GPUs of the cluster (CPUs when the cluster has no GPUs);
//! - tier: the partition's priority tier over the highest tier;
//! - qos: the QoS priority over the highest QoS priority;
//! - fair: the job's association's Fair Tree factor on usage decayed with the policy's
//!   half-life ([`crate::fairshare`]); 1 for a user without usage when nobody has any.
//!
//! Only +, ·, / and rounding: the same bits on every machine.

use std::collections::BTreeMap;

use proto::JobState;

use crate::fairshare::{fair_tree, FairShares};
use crate::view::ClusterView;

/// The factors of one job's priority, each in [0, 1], its `--nice` and the priority they give.
#[derive(Clone, Debug, PartialEq)]
pub struct Factors {
    pub age: f64,
    pub size: f64,
    pub partition: f64,
    pub qos: f64,
    pub fair_share: f64,
    pub nice: i64,
    pub priority: u64,
}

/// Fair Tree over the view's accounts, its usage decayed to `now_ms` and the users of its live
/// jobs (see [`crate::fairshare`]). A running job's GPU time so far counts too, as of now: the
/// state charges a run when it ends, and a week-long training job must not look idle until then
/// (Slurm charges running jobs every `PriorityCalcPeriod`).
pub fn fair_shares(view: &ClusterView, now_ms: u64) -> FairShares {
    // Jobs of one association sit together in id order: each run of them is passed once.
    let mut last = None;
    let live = view.jobs.iter().filter(|j| !j.state.is_final()).map(|j| (j.account.as_deref(), j.user.as_str())).filter(move |k| {
        let new = last != Some(*k);
        last = Some(*k);
        new
    });
    let running = running_usage(view, now_ms);
    fair_tree(&view.accounts, &view.usage, &running, live, now_ms, view.config.decay_half_life_ms)
}

/// GPU-milliseconds `j`'s running parts used in `elapsed_ms`, as the state will charge them
/// (`corral_state`'s `account`): a MIG instance by its share of the GPU's compute slices, shards
/// by their share of the GPU's.
fn running_gpu_ms(view: &ClusterView, j: &crate::JobRequest, elapsed_ms: u64) -> u64 {
    let (mut slices, mut shard_ms) = (0u64, 0u64);
    for a in &j.running {
        for &slot in &a.gpus {
            match crate::decode_slot(slot) {
                crate::Slot::Shard { gpu, shards } => {
                    let node = view.nodes.get(&a.node);
                    let total = node.and_then(|n| n.gpus.iter().find(|g| g.index == gpu)).map_or(0, |g| g.shards_total);
                    shard_ms = shard_ms.saturating_add(elapsed_ms.saturating_mul(u64::from(shards)) / u64::from(total.max(shards).max(1)));
                }
                _ => slices += u64::from(crate::mig::slot_compute_slices(slot, j.gpu_type.as_deref())),
            }
        }
    }
    elapsed_ms.saturating_mul(slices) / u64::from(crate::mig::COMPUTE_SLICES) + shard_ms
}

/// GPU-milliseconds each association's running jobs used so far (a MIG instance by its share of
/// the GPU), as the state will charge them when their runs end.
fn running_usage(view: &ClusterView, now_ms: u64) -> BTreeMap<(String, String), u64> {
    // Summed by borrowed keys first (one string pair per association, not per job).
    let mut sums: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut last: Option<((&str, &str), u64)> = None;
    for j in view.jobs.iter().filter(|j| j.state == JobState::Running) {
        let Some(start) = j.start_ms else { continue };
        let gpu_ms = running_gpu_ms(view, j, now_ms.saturating_sub(start));
        if gpu_ms > 0 {
            let key = (j.account.as_deref().unwrap_or(proto::accounts::ROOT_ACCOUNT), j.user.as_str());
            match &mut last {
                Some((k, sum)) if *k == key => *sum = sum.saturating_add(gpu_ms),
                _ => {
                    if let Some((k, sum)) = last.replace((key, gpu_ms)) {
                        let used = sums.entry(k).or_default();
                        *used = used.saturating_add(sum);
                    }
                }
            }
        }
    }
    if let Some((k, sum)) = last {
        let used = sums.entry(k).or_default();
        *used = used.saturating_add(sum);
    }
    sums.into_iter().map(|((a, u), ms)| ((a.to_string(), u.to_string()), ms)).collect()
}

/// Priority of every job of `view.jobs` (same order); 0 for jobs not pending or running, and
/// for running jobs when no QoS may preempt (only preemption compares them).
pub fn priorities(view: &ClusterView, now_ms: u64) -> Vec<u64> {
    let running = view.config.qos.values().any(|q| !q.preempt.is_empty());
    factors_of(view, now_ms, running).into_iter().map(|f| f.map_or(0, |f| f.priority)).collect()
}

/// The factors of every job of `view.jobs` (same order); `None` for jobs not pending or running.
pub fn factors(view: &ClusterView, now_ms: u64) -> Vec<Option<Factors>> {
    factors_of(view, now_ms, true)
}

/// [`factors`], with `None` for running jobs too unless `running`.
fn factors_of(view: &ClusterView, now_ms: u64, running: bool) -> Vec<Option<Factors>> {
    let w = &view.config.weights;
    let gpus_total: u64 = view.nodes.values().map(|n| n.gpus.len() as u64).sum();
    let cpus_total: u64 = view.nodes.values().map(|n| u64::from(n.cpus_total)).sum();
    let tier_max = view.partitions.values().map(|p| p.priority_tier).max().unwrap_or(0).max(1);
    let qos_max = view.config.qos.values().map(|q| q.priority).max().unwrap_or(0).max(1);
    let default_tier = view.partitions.values().find(|p| p.default).map_or(0, |p| p.priority_tier);
    let shares = fair_shares(view, now_ms);
    let age_max = view.config.age_max_ms.max(1) as f64;
    // Each association's factor, looked up once per pass (a lookup builds its key's strings).
    let mut fair: BTreeMap<(Option<&str>, &str), f64> = BTreeMap::new();
    let mut out = Vec::with_capacity(view.jobs.len());
    for j in &view.jobs {
        if j.state.is_final() || (!running && j.state != JobState::Pending) {
            out.push(None);
            continue;
        }
        let age = (now_ms.saturating_sub(j.submit_ms) as f64 / age_max).min(1.0);
        let size = if gpus_total > 0 {
            (j.total_gpus() as f64 / gpus_total as f64).min(1.0)
        } else {
            ((u64::from(j.cpus_per_node) * u64::from(j.nodes)) as f64 / cpus_total.max(1) as f64).min(1.0)
        };
        let tier = j.partition.as_ref().and_then(|p| view.partitions.get(p)).map_or(default_tier, |p| p.priority_tier);
        let partition = f64::from(tier) / f64::from(tier_max);
        let qos = j.qos.as_ref().and_then(|q| view.config.qos.get(q)).map_or(0, |q| q.priority);
        let qos = f64::from(qos) / f64::from(qos_max);
        let fair_share =
            *fair.entry((j.account.as_deref(), j.user.as_str())).or_insert_with(|| shares.factor(j.account.as_deref(), &j.user));
        let p = f64::from(w.age) * age
            + f64::from(w.job_size) * size
            + f64::from(w.partition) * partition
            + f64::from(w.qos) * qos
            + f64::from(w.fair_share) * fair_share;
        // `--nice`, as Slurm: subtracted after the factors, never below 0.
        let priority = (p.round() as i64).saturating_sub(j.nice).max(0) as u64;
        out.push(Some(Factors { age, size, partition, qos, fair_share, nice: j.nice, priority }));
    }
    out
}
