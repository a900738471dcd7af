//! FGD's placement experiment (Weng et al., ATC'23): the pod list plus seeded random copies
//! until the GPUs asked reach `inflate` times the cluster's, shuffled, placed one at a time
//! through the leader's engine with no departures; a pod no node holds is dropped (cancelled)
//! and the next one comes. Allocation counts what placed pods asked (whole GPUs, or
//! `gpu_milli` of a share), as FGD counts it.

use std::collections::BTreeMap;

use engine::{Leader, Policy};
use proto::{Command, CommandResult, GresRequest, InstanceId, JobSpec, JobState, NodeId};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::cluster::{self, NodeSpec};
use crate::log::Log;
use crate::trace::Pod;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PlacementReport {
    pub policy: String,
    pub seed: u64,
    pub pods: usize,
    pub placed: usize,
    /// GPU share asked by placed pods, in % of the cluster's GPUs, once the pods that arrived
    /// asked 100% of them, and at the end (`inflate`).
    pub gpu_alloc_at_100_pct: f64,
    pub gpu_alloc_pct: f64,
    /// Pods that asked a share of a GPU (`gpu_milli` < 1000) placed on a whole GPU: Corral and
    /// Slurm without sharing give them one.
    pub shares_on_whole_gpus: usize,
}

/// The FGD task list for `seed`: `pods` and random copies of them until the GPUs they ask reach
/// `inflate` x `capacity_milli`, shuffled.
pub fn inflated(pods: &[Pod], capacity_milli: u64, inflate: f64, seed: u64) -> Vec<Pod> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut list: Vec<Pod> = pods.to_vec();
    let target = (capacity_milli as f64 * inflate) as u64;
    let mut asked: u64 = list.iter().map(Pod::gpu_milli_total).sum();
    let gpu_pods: Vec<&Pod> = pods.iter().filter(|p| p.gpu_milli_total() > 0).collect();
    let mut copy = 0;
    while asked < target && !gpu_pods.is_empty() {
        let p = pods[rng.gen_range(0..pods.len())].clone();
        asked += p.gpu_milli_total();
        copy += 1;
        list.push(Pod { name: format!("{}-copy{copy}", p.name), ..p });
    }
    list.shuffle(&mut rng);
    list
}

/// The job a pod is: whole GPUs, or a share of one GPU as shards when the GPUs have
/// `shards_per_gpu` (a share `gpu_milli` of 1000 asks as many shards, rounded up), or a whole
/// GPU when they have none (Slurm without `gres/shard`); its CPUs in units of `cpu_unit_milli`
/// thousandths of a core, rounded up (the nodes' are counted in the same units).
fn spec_of(pod: &Pod, shards_per_gpu: u32, cpu_unit_milli: u32, mig: bool) -> JobSpec {
    let gpu_type = if pod.models.len() == 1 { Some(pod.models[0].as_str()) } else { None };
    let share = pod.gpus == 1 && pod.gpu_milli < 1000 && shards_per_gpu > 0;
    let gres = match pod.gpus {
        _ if mig => crate::mig::request(pod),
        0 => None,
        _ if share => {
            Some(GresRequest::shards(gpu_type, (u64::from(pod.gpu_milli) * u64::from(shards_per_gpu)).div_ceil(1000).max(1) as u32))
        }
        n => Some(GresRequest::gpus(gpu_type, n)),
    };
    JobSpec {
        name: pod.name.clone(),
        argv: vec!["true".into()],
        gres,
        cpus_per_task: pod.cpus_milli.div_ceil(cpu_unit_milli.max(1)).max(1),
        ntasks_per_node: 1,
        mem_mib: pod.mem_mib,
        workdir: "/".into(),
        user: "pod".into(),
        nodes: 1,
        // Several models allowed: any of them, as `--constraint=a|b` of the nodes' models
        // (each node's feature; MIG mode makes every GPU one model).
        constraint: if pod.models.len() > 1 && !mig { vec![pod.models.join("|")] } else { Vec::new() },
        ..JobSpec::command(vec!["true".into()], "/", "user")
    }
}

/// Places `list` (from [`inflated`]) on `nodes` (their CPUs counted in units of
/// `cpu_unit_milli`, as [`crate::cluster::openb_nodes`] gives them) one pod at a time under
/// `policy`.
pub fn run(
    list: &[Pod],
    nodes: &[NodeSpec],
    cpu_unit_milli: u32,
    policy: Box<dyn Policy>,
    policy_name: &str,
    seed: u64,
) -> anyhow::Result<PlacementReport> {
    let mut log = Log::default();
    let instances: BTreeMap<NodeId, InstanceId> = cluster::register(&mut log.state, nodes)?.into_iter().collect();
    let capacity_milli: u64 = nodes.iter().map(|n| u64::from(n.gpus) * 1000).sum();
    let shards_per_gpu = nodes.iter().map(|n| n.shards_per_gpu).max().unwrap_or(0);
    let mig = nodes.iter().any(|n| !n.mig_layouts.is_empty());
    let mut leader = Leader::with_policy(policy, u64::MAX / 4);
    let mut report = PlacementReport { policy: policy_name.to_string(), seed, pods: list.len(), ..PlacementReport::default() };
    let (mut arrived, mut allocated) = (0u64, 0u64);
    let mut at_100 = None;
    // Each pod at its own millisecond: the engine sees time move as it would.
    for (k, pod) in list.iter().enumerate() {
        let now_ms = k as u64 + 1;
        let spec = spec_of(pod, shards_per_gpu, cpu_unit_milli, mig);
        arrived += pod.gpu_milli_total();
        if log.state.admission(&spec, true, now_ms).is_err() {
            continue;
        }
        let CommandResult::Submitted { job } = log.apply(&Command::Submit { spec, now_ms }) else {
            continue;
        };
        // A pass; where it asked for MIG layouts (the pod's), they are applied and it runs again.
        for _ in 0..3 {
            let Some(pass) = leader.schedule_pass(&log, now_ms, || u32::MAX) else { break };
            for cmd in &pass.commands {
                log.apply(cmd);
            }
            if pass.starts > 0 || crate::mig::apply(&mut log, &pass.mig_layouts, now_ms) == 0 {
                break;
            }
        }
        let orders = leader.orders(&log.state, now_ms);
        for (id, node) in orders.launches {
            let Some(run) = log.state.jobs.get(&id).map(|j| j.run) else { continue };
            let instance = instances.get(&node).copied().unwrap_or_default();
            log.apply(&Command::LaunchConfirmed { job: id, run, node, instance, now_ms });
        }
        if log.state.jobs.get(&job).is_some_and(|j| j.state == JobState::Pending) {
            // Dropped, and out of the hot state at once (it holds nothing).
            log.apply(&Command::Cancel { job, now_ms });
            log.apply(&Command::ArchiveJobs { jobs: vec![job], now_ms });
        } else {
            report.placed += 1;
            allocated += pod.gpu_milli_total();
            report.shares_on_whole_gpus += usize::from(pod.gpus == 1 && pod.gpu_milli < 1000 && shards_per_gpu == 0);
        }
        if at_100.is_none() && arrived >= capacity_milli {
            at_100 = Some(allocated);
        }
    }
    let pct = |m: u64| 100.0 * m as f64 / capacity_milli.max(1) as f64;
    report.gpu_alloc_at_100_pct = pct(at_100.unwrap_or(allocated));
    report.gpu_alloc_pct = pct(allocated);
    Ok(report)
}
