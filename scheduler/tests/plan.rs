//! Fixture tests: build a cluster, run one pass, assert the exact plan.

use corral_scheduler::testkit::{alloc, at, dgx, h200_mig, pcie_box, spec, Cluster};
use corral_scheduler::{fits, fits_gang, mig, mig_slot, schedule, Misfit, Partition, PreemptAction, Qos};
use proto::{ArraySpec, Dependency, DependencyKind, JobSpec, JobState};

const MIN: u64 = 60_000;
const HOUR: u64 = 3_600_000;

fn gpus_of(plan: &corral_scheduler::Plan, job: u64) -> Vec<(u64, Vec<u32>)> {
    plan.placements.iter().filter(|p| p.job == job).flat_map(|p| p.allocs.iter().map(|a| (a.node, a.gpus.clone()))).collect()
}

#[test]
fn pcie_pairs_stay_under_one_switch_and_singles_fill_broken_pairs() {
    let mut c = Cluster::new();
    c.node(1, "n1", pcie_box("l40s"));
    c.running(1, spec("gpu:1", 1), vec![alloc(1, &[0], 1, 1024)], 0);
    c.submit(2, spec("gpu:l40s:2", 1), 0).submit(3, spec("gpu:1", 1), 0);
    let plan = c.schedule(1000);
    assert_eq!(gpus_of(&plan, 2), vec![(1, vec![2, 3])]);
    assert_eq!(gpus_of(&plan, 3), vec![(1, vec![1])]);
    assert!(plan.pending.is_empty());
}

#[test]
fn four_gpus_come_from_one_numa_domain_with_its_cpus_and_nic() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    c.running(1, spec("gpu:1", 1), vec![alloc(1, &[5], 1, 1024)], 0);
    let mut s = spec("gpu:h100:4", 1);
    s.cpus_per_task = 8;
    s.ntasks_per_node = 4;
    c.submit(2, s, 0);
    let plan = c.schedule(1000);
    // NUMA 1 is partly used (GPU 5), NUMA 0 is whole: the 4-GPU job takes NUMA 0 entire.
    assert_eq!(gpus_of(&plan, 2), vec![(1, vec![0, 1, 2, 3])]);
    let b = &plan.bindings[0];
    assert_eq!(b.numa_cpus, vec![(0, 32)]);
    assert_eq!(b.nic.as_deref(), Some("mlx5_0"));
}

#[test]
fn cpus_follow_the_gpus_numa_node() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    c.running(1, spec("gpu:4", 1), vec![alloc(1, &[0, 1, 2, 3], 50, 1024)], 0);
    let mut s = spec("gpu:2", 1);
    s.cpus_per_task = 16;
    c.submit(2, s, 0);
    let plan = c.schedule(1000);
    assert_eq!(gpus_of(&plan, 2), vec![(1, vec![4, 5])]);
    assert_eq!(plan.bindings[0].numa_cpus, vec![(1, 16)]);
    assert_eq!(plan.bindings[0].nic.as_deref(), Some("mlx5_4"));
    // Taking the allocation charges the same NUMA node.
    let mut n = (*c.view.nodes[&1]).clone();
    n.take(&plan.placements[0].allocs[0]).unwrap();
    assert_eq!(n.numa[1].cpus_used, 16);
    assert_eq!(n.numa[0].cpus_used, 50);
}

fn leafy_cluster() -> Cluster {
    let mut c = Cluster::new();
    for id in 1..=12u64 {
        let (block, sw) = match id {
            1..=4 => ("b1", "sw1"),
            5..=8 => ("b1", "sw2"),
            _ => ("b2", "sw3"),
        };
        c.node(id, &format!("n{id}"), at(dgx("h100"), block, sw));
    }
    c
}

#[test]
fn gangs_take_the_tightest_leaf_switch() {
    let mut c = leafy_cluster();
    c.running(1, spec("gpu:8", 1), vec![alloc(1, &[0, 1, 2, 3, 4, 5, 6, 7], 8, 1024)], 0);
    c.submit(10, spec("gpu:8", 4), 0).submit(11, spec("gpu:8", 3), 0);
    let plan = c.schedule(1000);
    let nodes = |job| gpus_of(&plan, job).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(nodes(10), vec![5, 6, 7, 8]);
    assert_eq!(nodes(11), vec![2, 3, 4]);
    // A 6-node gang spans the fewest switches of one block when no switch holds it.
    let mut c = leafy_cluster();
    c.submit(12, spec("gpu:8", 6), 0);
    let plan = c.schedule(1000);
    let got: Vec<u64> = gpus_of(&plan, 12).into_iter().map(|(n, _)| n).collect();
    assert_eq!(got, vec![1, 2, 3, 4, 5, 6]);
}

#[test]
fn switches_limit_waits_then_relaxes() {
    let mut c = leafy_cluster();
    for (job, node) in [(1u64, 1u64), (2, 2), (3, 5), (4, 6)] {
        c.running(job, spec("gpu:8", 1), vec![alloc(node, &[0, 1, 2, 3, 4, 5, 6, 7], 8, 1024)], 0);
    }
    for (job, node) in [(5u64, 9u64), (6, 10), (7, 11)] {
        c.running(job, spec("gpu:8", 1), vec![alloc(node, &[0, 1, 2, 3, 4, 5, 6, 7], 8, 1024)], 0);
    }
    let mut s = spec("gpu:8", 4);
    s.switches = Some((1, 10 * MIN));
    c.submit(20, s, 0);
    let plan = c.schedule(MIN);
    assert!(plan.placements.is_empty());
    assert_eq!(
        plan.pending[&20][0],
        "needs 4 nodes on at most 1 leaf switch(es); the best free set spans 2 (waits for that until 1970-01-01 00:10:00 UTC)"
    );
    // The wait's end changes the job's chances with time alone: a caller skipping idle passes
    // runs one then.
    assert_eq!(plan.wake_ms, Some(10 * MIN));
    assert!(plan.changes_nothing());
    let plan = c.schedule(11 * MIN);
    assert_eq!(plan.wake_ms, None);
    let got: Vec<u64> = gpus_of(&plan, 20).into_iter().map(|(n, _)| n).collect();
    assert_eq!(got, vec![3, 4, 7, 8]);
}

#[test]
fn an_idle_mig_gpu_whose_layout_serves_only_part_of_the_demand_is_relaid_and_a_full_one_is_not() {
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)]]));
    c.submit(1, spec("gpu:3g.71gb:2", 1), 0);
    let plan = c.schedule(1000);
    assert!(plan.placements.is_empty());
    assert_eq!(plan.mig_layouts, vec![(1, 0, vec!["3g.71gb".to_string(), "3g.71gb".to_string()])]);

    // Seven 1g instances serve as much of eight as any layout can: nothing to relay.
    let mut c = Cluster::new();
    let sevens: Vec<(&str, u32)> = (0..7).map(|s| ("1g.18gb", s)).collect();
    c.node(1, "m1", h200_mig(&[&sevens]));
    c.submit(1, spec("gpu:1g.18gb:8", 1), 0);
    let plan = c.schedule(1000);
    assert!(plan.placements.is_empty() && plan.mig_layouts.is_empty(), "{:?}", plan.mig_layouts);
}

#[test]
fn a_busy_mig_gpu_is_recarved_around_the_instance_a_job_holds_before_an_idle_gpu_is() {
    let strings = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<String>>();
    // GPU 0 runs a 4g job and has slices 4-7 free; GPU 1 is idle and empty.
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[("4g.71gb", 0)], &[]]));
    c.running(1, spec("gpu:4g.71gb:1", 1), vec![alloc(1, &[mig_slot(0, 0)], 1, 1024)], 0);
    c.submit(2, spec("gpu:3g.71gb:1", 1), 0);
    let plan = c.schedule(1000);
    assert!(plan.placements.is_empty());
    // The held 4g stays at slice 0; the 3g goes beside it, and GPU 1 stays whole.
    assert_eq!(plan.mig_layouts, vec![(1, 0, strings(&["4g.71gb", "3g.71gb"]))]);

    // A job of two whole-GPU instances gets both on one node, not one GPU on each of two.
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[], &[("7g.141gb", 0)]]));
    c.node(2, "m2", h200_mig(&[&[], &[]]));
    c.running(1, spec("gpu:7g.141gb:1", 1), vec![alloc(1, &[mig_slot(1, 0)], 1, 1024)], 0);
    c.submit(2, spec("gpu:7g.141gb:2", 1), 0);
    let plan = c.schedule(1000);
    assert_eq!(plan.mig_layouts, vec![(2, 0, strings(&["7g.141gb"])), (2, 1, strings(&["7g.141gb"]))]);

    // Two jobs in one pass are not promised the same slices: job 3 (first by priority, the
    // larger) gets the idle GPU, job 2 GPU 0's free half.
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[("4g.71gb", 0)], &[]]));
    c.running(1, spec("gpu:4g.71gb:1", 1), vec![alloc(1, &[mig_slot(0, 0)], 1, 1024)], 0);
    c.submit(2, spec("gpu:3g.71gb:1", 1), 0).submit(3, spec("gpu:3g.71gb:2", 1), 10);
    let plan = c.schedule(1000);
    assert_eq!(plan.mig_layouts, vec![(1, 1, strings(&["3g.71gb", "3g.71gb"])), (1, 0, strings(&["4g.71gb", "3g.71gb"]))]);
}

#[test]
fn a_gpu_pinned_to_another_mig_layout_takes_no_new_work_and_is_relaid_once_idle() {
    let strings = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<String>>();
    // GPU 0 runs a 1g job and is pinned to two 3g; GPU 1 has a free 1g and is not pinned.
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[("1g.18gb", 0), ("1g.18gb", 1)], &[("1g.18gb", 0)]]));
    std::sync::Arc::make_mut(c.view.nodes.get_mut(&1).unwrap()).gpus[0].pinned = Some(strings(&["3g.71gb", "3g.71gb"]));
    c.running(1, spec("gpu:1g.18gb:1", 1), vec![alloc(1, &[mig_slot(0, 0)], 1, 1024)], 0);
    c.submit(2, spec("gpu:1g.18gb:2", 1), 0).submit(3, spec("gpu:1g.18gb:1", 1), 0);
    let plan = c.schedule(1000);
    // Job 2 would fit only with GPU 0's free 1g: it waits, and says why; job 3 takes GPU 1's.
    assert_eq!(gpus_of(&plan, 3), vec![(1, vec![mig_slot(1, 0)])]);
    assert!(gpus_of(&plan, 2).is_empty());
    assert!(plan.pending[&2][0].contains("on a GPU waiting for a new MIG layout"), "{:?}", plan.pending[&2]);
    // Still busy: not relaid yet; the demand-driven relayout leaves the pinned GPU alone.
    assert!(plan.mig_layouts.iter().all(|(_, gpu, _)| *gpu != 0), "{:?}", plan.mig_layouts);
    let n = &c.view.nodes[&1];
    let job2 = c.view.jobs.iter().find(|j| j.id == 2).unwrap().clone();
    assert_eq!(fits(n, &job2, &alloc(1, &[mig_slot(0, 1), mig_slot(1, 0)], 1, 1024)), Err(Misfit::MigRelayout(0)));

    // Idle: relaid into the pinned layout, first, even with nothing pending.
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[("1g.18gb", 0), ("1g.18gb", 1)]]));
    std::sync::Arc::make_mut(c.view.nodes.get_mut(&1).unwrap()).gpus[0].pinned = Some(strings(&["3g.71gb", "3g.71gb"]));
    let plan = c.schedule(1000);
    assert_eq!(plan.mig_layouts, vec![(1, 0, strings(&["3g.71gb", "3g.71gb"]))]);

    // In its pinned layout it takes work again, and nothing is relaid for other demand.
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[("3g.71gb", 0), ("3g.71gb", 4)]]));
    std::sync::Arc::make_mut(c.view.nodes.get_mut(&1).unwrap()).gpus[0].pinned = Some(strings(&["3g.71gb", "3g.71gb"]));
    c.submit(1, spec("gpu:3g.71gb:1", 1), 0).submit(2, spec("gpu:1g.18gb:3", 1), 0);
    let plan = c.schedule(1000);
    assert_eq!(gpus_of(&plan, 1), vec![(1, vec![mig_slot(0, 0)])]);
    assert!(plan.mig_layouts.is_empty(), "{:?}", plan.mig_layouts);
}

#[test]
fn mig_instances_are_gres_with_start_slices() {
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[("3g.71gb", 0), ("3g.71gb", 4)], &[("1g.18gb", 0), ("1g.18gb", 1), ("1g.18gb", 2), ("2g.35gb", 4)], &[]]));
    c.running(1, spec("gpu:1g.18gb:1", 1), vec![alloc(1, &[mig_slot(1, 0)], 1, 1024)], 0);
    c.submit(2, spec("gpu:3g.71gb:1", 1), 0).submit(3, spec("gpu:1g.18gb:2", 1), 0).submit(4, spec("gpu:1g.35gb:1", 1), 0);
    let plan = c.schedule(1000);
    assert_eq!(gpus_of(&plan, 2), vec![(1, vec![mig_slot(0, 0)])]);
    assert_eq!(gpus_of(&plan, 3), vec![(1, vec![mig_slot(1, 1), mig_slot(1, 2)])]);
    assert_eq!(plan.pending[&4], vec!["no node in partition default has gpu:1g.35gb".to_string()]);
    // The idle MIG GPU 2 is asked to carve what the pending job needs, no more: GPUs 0 and 1
    // would lose idle instances. The rest of GPU 2 stays free for the next job's profile.
    assert_eq!(plan.mig_layouts, vec![(1, 2, vec!["1g.35gb".to_string()])]);
    // fits: a whole GPU in MIG mode, a busy instance, a wrong profile.
    let n = &c.view.nodes[&1];
    let job = |id| c.view.jobs.iter().find(|j| j.id == id).unwrap().clone();
    assert_eq!(fits(n, &job(2), &alloc(1, &[0], 1, 1024)), Err(Misfit::GpuInMigMode(0)));
    assert_eq!(fits(n, &job(3), &alloc(1, &[mig_slot(1, 0), mig_slot(1, 1)], 1, 1024)), Err(Misfit::MigBusy { gpu: 1, start_slice: 0 }));
    assert_eq!(
        fits(n, &job(2), &alloc(1, &[mig_slot(1, 4)], 1, 1024)),
        Err(Misfit::WrongMigProfile { gpu: 1, start_slice: 4, want: "3g.71gb".into(), have: "2g.35gb".into() })
    );
}

#[test]
fn mig_planner_uses_the_real_h200_table() {
    let layout = mig::placeable(mig::Model::H200Gb141, &["4g.71gb", "3g.71gb"]).unwrap();
    let got: Vec<(String, u32)> = layout.instances.iter().map(|i| (i.profile.clone(), i.start_slice)).collect();
    assert_eq!(got, vec![("4g.71gb".into(), 0), ("3g.71gb".into(), 4)]);
    let err = mig::placeable(mig::Model::H200Gb141, &["7g.141gb", "1g.18gb"]).unwrap_err();
    assert_eq!(err.to_string(), "cannot place 7g.141gb, 1g.18gb on one H200: they need 8 compute slices, a GPU has 7");
    let err = mig::placeable(mig::Model::H200Gb141, &["3g.71gb", "3g.71gb", "1g.35gb"]).unwrap_err();
    assert_eq!(err.to_string(), "cannot place 3g.71gb, 3g.71gb, 1g.35gb on one H200: they need 10 memory slices, 8 of 8 are free");
}

#[test]
fn small_jobs_pack_so_a_whole_node_stays_free() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100")).node(2, "n2", dgx("h100"));
    c.running(1, spec("gpu:2", 1), vec![alloc(2, &[0, 1], 2, 1024)], 0);
    c.submit(10, spec("gpu:1", 1), 0).submit(11, spec("gpu:1", 1), 0).submit(12, spec("gpu:1", 1), 0).submit(13, spec("gpu:8", 1), 0);
    let plan = c.schedule(1000);
    assert_eq!(gpus_of(&plan, 13), vec![(1, (0..8).collect())]);
    assert_eq!(gpus_of(&plan, 10), vec![(2, vec![2])]);
    assert_eq!(gpus_of(&plan, 11), vec![(2, vec![3])]);
    assert_eq!(gpus_of(&plan, 12), vec![(2, vec![4])]);
}

#[test]
fn priority_orders_by_fair_share_qos_and_size() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    c.running(1, spec("gpu:7", 1), vec![alloc(1, &[0, 1, 2, 3, 4, 5, 6], 1, 1024)], 0);
    let mut heavy = spec("gpu:1", 1);
    heavy.user = "alice".into();
    let mut light = spec("gpu:1", 1);
    light.user = "bob".into();
    c.usage("alice", 9_000_000).usage("bob", 1_000_000);
    c.submit(10, heavy, 0).submit(11, light, 0);
    let plan = c.schedule(1000);
    assert_eq!(plan.queue.iter().map(|q| q.0).collect::<Vec<_>>(), vec![11, 10]);
    assert_eq!(gpus_of(&plan, 11), vec![(1, vec![7])]);
    assert_eq!(
        plan.pending[&10],
        vec![
            "needs 1x gpu on one node; largest free: 0 on n1 (7 held by job 1, 1 held by job 11)",
            "no reservation possible: the jobs holding the nodes it needs have no time limit",
        ]
    );
    // QoS outweighs fair share.
    let mut c2 = c.clone();
    c2.view
        .config
        .qos
        .insert("urgent".into(), Qos { priority: 10, preempt: vec![], preempt_mode: PreemptAction::Requeue, limits: Default::default() });
    let mut urgent = spec("gpu:1", 1);
    urgent.user = "alice".into();
    urgent.qos = Some("urgent".into());
    c2.submit(12, urgent, 0);
    let plan = c2.schedule(1000);
    assert_eq!(plan.queue.iter().map(|q| q.0).collect::<Vec<_>>(), vec![12, 11, 10]);

    // `--nice` is taken off the priority (bob's lead over alice is about 3,300): 100,000 puts
    // bob's job behind alice's, at 0, never below; an admin's negative one ahead again.
    let mut c3 = c.clone();
    let niced = |nice: &str| {
        let mut s = spec("gpu:1", 1);
        s.user = "bob".into();
        s.extra.insert("nice".into(), nice.into());
        s
    };
    c3.submit(11, niced("100000"), 0);
    let plan = c3.schedule(1000);
    assert_eq!(plan.queue.iter().map(|q| q.0).collect::<Vec<_>>(), vec![10, 11]);
    assert_eq!(plan.queue.iter().find(|q| q.0 == 11).map(|q| q.1), Some(0));
    c3.submit(11, niced("-1000"), 0);
    let plan = c3.schedule(1000);
    assert_eq!(plan.queue.iter().map(|q| q.0).collect::<Vec<_>>(), vec![11, 10]);
}

#[test]
fn backfill_never_delays_the_top_jobs_reservation() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    let mut long = spec("gpu:6", 1);
    long.time_limit_ms = Some(HOUR);
    c.running(1, long, vec![alloc(1, &[0, 1, 2, 3, 4, 5], 1, 1024)], 0);
    let mut top = spec("gpu:8", 1);
    top.time_limit_ms = Some(HOUR);
    c.submit(10, top, 0);
    let mut too_long = spec("gpu:2", 1);
    too_long.time_limit_ms = Some(2 * HOUR);
    c.submit(11, too_long, 0);
    let mut short = spec("gpu:2", 1);
    short.time_limit_ms = Some(30 * MIN);
    c.submit(12, short, 0);
    c.submit(13, spec("gpu:1", 1), 0);
    let plan = c.schedule(0);
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![12]);
    assert_eq!(plan.reservation, Some(corral_scheduler::Reservation { job: 10, start_ms: HOUR, nodes: vec![1] }));
    assert_eq!(
        plan.pending[&10],
        vec![
            "needs 8x gpu on one node; largest free: 2 on n1 (6 held by job 1)".to_string(),
            "top of the queue: reserved to start by 1970-01-01 01:00:00 UTC on n1".to_string(),
        ]
    );
    assert_eq!(plan.pending[&11], vec!["held for backfill reservation of job 10 until 1970-01-01 01:00:00 UTC".to_string()]);
    assert_eq!(plan.pending[&13], vec!["needs 1x gpu on one node; largest free: 0 on n1 (6 held by job 1, 2 held by job 12)".to_string()]);
    assert_eq!(plan.room, None, "job 11 waits for the reservation alone: a new job could move it");
}

/// Two 8-GPU jobs wait behind long runs on two nodes; a 2-GPU job of 30 h and one of 1 h come
/// three hours later.
fn two_waiting_gangs(reserve_after_wait_ms: u64) -> corral_scheduler::Plan {
    two_waiting_gangs_with(reserve_after_wait_ms, 1)
}

fn two_waiting_gangs_with(reserve_after_wait_ms: u64, reservation_depth: u32) -> corral_scheduler::Plan {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100")).node(2, "n2", dgx("h100"));
    c.view.config.reserve_after_wait_ms = reserve_after_wait_ms;
    c.view.config.reservation_depth = reservation_depth;
    let limited = |gres: &str, hours: u64| {
        let mut s = spec(gres, 1);
        s.time_limit_ms = Some(hours * HOUR);
        s
    };
    c.running(1, limited("gpu:6", 10), vec![alloc(1, &[0, 1, 2, 3, 4, 5], 1, 1024)], 0);
    c.running(2, limited("gpu:4", 20), vec![alloc(2, &[0, 1, 2, 3], 1, 1024)], 0);
    c.submit(10, limited("gpu:8", 1), 0);
    c.submit(11, limited("gpu:8", 1), 0);
    c.submit(12, limited("gpu:2", 30), 3 * HOUR);
    c.submit(13, limited("gpu:2", 1), 3 * HOUR);
    c.schedule(3 * HOUR)
}

#[test]
fn easy_backfill_reserves_for_the_top_job_alone() {
    let plan = two_waiting_gangs(u64::MAX);
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![12, 13]);
    assert_eq!(plan.reservations.iter().map(|r| (r.job, r.start_ms)).collect::<Vec<_>>(), vec![(10, 10 * HOUR)]);
    assert_eq!(gpus_of(&plan, 12), vec![(2, vec![4, 5])], "job 12 takes n2, where job 11 would start at 20 h");
}

#[test]
fn a_job_that_waited_past_the_bound_gets_a_reservation_of_its_own() {
    let plan = two_waiting_gangs(HOUR);
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![13]);
    assert_eq!(plan.reservation, Some(corral_scheduler::Reservation { job: 10, start_ms: 10 * HOUR, nodes: vec![1] }));
    assert_eq!(
        plan.reservations.iter().map(|r| (r.job, r.start_ms, r.nodes.clone())).collect::<Vec<_>>(),
        vec![(10, 10 * HOUR, vec![1]), (11, 20 * HOUR, vec![2])]
    );
    assert_eq!(plan.pending[&11].last().map(String::as_str), Some("waited long: reserved to start by 1970-01-01 20:00:00 UTC on n2"));
    assert_eq!(plan.pending[&12], vec!["held for backfill reservation of job 10 until 1970-01-01 10:00:00 UTC".to_string()]);
}

#[test]
fn a_reservation_depth_of_two_reserves_for_the_second_job_too() {
    let plan = two_waiting_gangs_with(u64::MAX, 2);
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![13]);
    assert_eq!(plan.reservations.iter().map(|r| (r.job, r.start_ms)).collect::<Vec<_>>(), vec![(10, 10 * HOUR), (11, 20 * HOUR)]);
    assert_eq!(plan.pending[&11].last().map(String::as_str), Some("next in the queue: reserved to start by 1970-01-01 20:00:00 UTC on n2"));
}

#[test]
fn a_pass_tells_the_room_it_leaves_on_any_one_node() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100")).node(2, "n2", dgx("h100"));
    c.running(1, spec("gpu:6", 1), vec![alloc(1, &[0, 1, 2, 3, 4, 5], 100, 1024)], 0);
    c.running(2, spec("gpu:8", 1), vec![alloc(2, &[0, 1, 2, 3, 4, 5, 6, 7], 8, 4096)], 0);
    c.submit(10, spec("gpu:4", 1), 0);
    let plan = c.schedule(0);
    assert!(plan.changes_nothing());
    let room = plan.room.expect("no job waits for a reservation alone");
    assert_eq!(room, corral_scheduler::Room { gpus: 2, shards: 0, cpus: 104, mem_mib: 2 * 1024 * 1024 - 1024 });
    assert!(room.excludes(&spec("gpu:3", 1)) && !room.excludes(&spec("gpu:2", 1)));
    assert!(!room.excludes(&spec("gpu:1g.18gb:7", 1)), "MIG instances are not counted");
    // What it starts is taken from the room.
    c.submit(11, spec("gpu:2", 1), 0);
    let plan = c.schedule(0);
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![11]);
    assert_eq!(plan.room.map(|r| r.gpus), Some(0));
}

#[test]
fn preemption_frees_room_for_a_qos_allowed_to() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    c.view.config.qos.insert(
        "high".into(),
        Qos { priority: 100, preempt: vec!["normal".into()], preempt_mode: PreemptAction::Cancel, limits: Default::default() },
    );
    c.view
        .config
        .qos
        .insert("normal".into(), Qos { priority: 0, preempt: vec![], preempt_mode: PreemptAction::Requeue, limits: Default::default() });
    let mut a = spec("gpu:4", 1);
    a.requeue = true;
    c.running(1, a, vec![alloc(1, &[0, 1, 2, 3], 1, 1024)], 0);
    c.running(2, spec("gpu:4", 1), vec![alloc(1, &[4, 5, 6, 7], 1, 1024)], 1000);
    let mut hi = spec("gpu:4", 1);
    hi.qos = Some("high".into());
    c.submit(3, hi, 2000);
    let plan = c.schedule(3000);
    assert!(plan.placements.is_empty());
    // Job 2 is newer (lower age priority) and not requeueable: it is cancelled.
    assert_eq!(plan.preemptions, vec![(2, PreemptAction::Cancel)]);
    assert_eq!(
        plan.pending[&3],
        vec![
            "needs 4x gpu on one node; largest free: 0 on n1 (4 held by job 1, 4 held by job 2)".to_string(),
            "waiting for preempted jobs 2 to stop".to_string()
        ]
    );
    // A job of a QoS without preempt rights only waits.
    let mut c2 = c.clone();
    c2.view.jobs.retain(|j| j.id != 3);
    c2.submit(4, spec("gpu:4", 1), 2000);
    assert!(c2.schedule(3000).preemptions.is_empty());
}

#[test]
fn arrays_expand_lazily_within_the_throttle() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    let mut s = spec("gpu:1", 1);
    s.array = Some(ArraySpec::from_ids(&[1, 2, 3, 4, 5], Some(2)));
    c.submit(5, s, 0);
    c.array_task(6, 5, 1, vec![alloc(1, &[0], 1, 1024)]);
    let plan = c.schedule(1000);
    assert_eq!(plan.array_tasks, vec![corral_scheduler::ArrayTaskStart { array: 5, task: 2, placement: 0 }]);
    assert_eq!(gpus_of(&plan, 5), vec![(1, vec![1])]);
    assert_eq!(plan.placements[0].run, 1);
    assert_eq!(
        plan.pending[&5],
        vec!["array: 3 of 5 tasks not started".to_string(), "array throttle %2 reached (2 tasks running)".to_string()]
    );
    // Without a throttle every task that fits starts in one pass.
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    let mut s = spec("gpu:2", 1);
    s.array = Some(ArraySpec::from_ids(&(0..16).collect::<Vec<u32>>(), None));
    c.submit(5, s, 0);
    let plan = c.schedule(1000);
    assert_eq!(plan.array_tasks.iter().map(|t| t.task).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    assert_eq!(plan.pending[&5][0], "array: 12 of 16 tasks not started");
}

#[test]
fn every_dependency_kind() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    c.finished(1, spec("gpu:1", 1), JobState::Completed);
    c.finished(2, spec("gpu:1", 1), JobState::Failed);
    c.running(3, spec("gpu:1", 1), vec![alloc(1, &[0], 1, 1024)], 0);
    let mut held = spec("gpu:1", 1);
    held.hold = true;
    c.submit(4, held, 0);
    let dep = |kind, job| {
        let mut s = spec("gpu:1", 1);
        s.dependencies = vec![Dependency { kind, job }];
        s
    };
    use DependencyKind::*;
    c.submit(10, dep(AfterOk, Some(1)), 0);
    c.submit(11, dep(AfterOk, Some(2)), 0);
    c.submit(12, dep(AfterNotOk, Some(2)), 0);
    c.submit(13, dep(AfterNotOk, Some(1)), 0);
    c.submit(14, dep(AfterAny, Some(3)), 0);
    c.submit(15, dep(After, Some(3)), 0);
    c.submit(16, dep(After, Some(4)), 0);
    c.submit(17, dep(AfterOk, Some(99)), 0);
    let mut s18 = dep(Singleton, None);
    s18.name = "solo".into();
    let s19 = s18.clone();
    c.submit(18, s18, 0).submit(19, s19, 0);
    let plan = c.schedule(1000);
    let placed: Vec<u64> = plan.placements.iter().map(|p| p.job).collect();
    assert_eq!(placed, vec![10, 12, 15, 18]);
    let r = |id: u64| plan.pending[&id].clone();
    assert_eq!(r(4), vec!["job is held"]);
    assert_eq!(r(11), vec!["dependency afterok:2 can never be satisfied (job 2 FAILED)"]);
    assert_eq!(r(13), vec!["dependency afternotok:1 can never be satisfied (job 1 COMPLETED)"]);
    assert_eq!(r(14), vec!["dependency afterany:3"]);
    assert_eq!(r(16), vec!["dependency after:4"]);
    assert_eq!(r(17), vec!["dependency afterok:99 can never be satisfied (job 99 unknown)"]);
    assert_eq!(r(19), vec!["dependency singleton: job 18 of the same name and user is RUNNING"]);
}

#[test]
fn a_pending_job_carries_all_its_reasons() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    c.running(3, spec("gpu:2", 1), vec![alloc(1, &[0, 1], 1, 1024)], 0);
    let mut s = spec("gpu:h100:8", 1);
    s.hold = true;
    s.begin_ms = Some(14 * HOUR + 5 * MIN);
    s.dependencies = vec![Dependency { kind: DependencyKind::AfterOk, job: Some(3) }];
    c.submit(7, s, 0);
    let mut never = spec("gpu:16", 1);
    never.partition = Some("gpu".into());
    c.partition(Partition { name: "gpu".into(), max_time_limit_ms: Some(4 * HOUR), default: true, ..Partition::default() });
    never.time_limit_ms = Some(10 * HOUR);
    c.submit(8, never, 0);
    let plan = c.schedule(1000);
    assert_eq!(
        plan.pending[&7],
        vec![
            "job is held",
            "begins at 1970-01-01 14:05:00 UTC",
            "dependency afterok:3",
            "needs 8x gpu:h100 on one node; largest free: 6 on n1 (2 held by job 3)",
        ]
    );
    assert_eq!(
        plan.pending[&8],
        vec![
            "PartitionTimeLimit: time limit 10:00:00 exceeds the 4:00:00 of partition gpu",
            "cannot ever run: needs 1 node(s) with 16x gpu, 1 cpus and 1024 MiB; partition gpu has 0 (largest: 8x, 112 cpus, 2097152 MiB)",
        ]
    );
    // The leader's own pass keeps no reasons: an ineligible job is not tried against the
    // resources, and the pass decides the same.
    c.view.config.explain_ineligible = false;
    let lean = c.schedule(1000);
    assert_eq!(lean.pending[&7], vec!["job is held", "begins at 1970-01-01 14:05:00 UTC", "dependency afterok:3"]);
    assert_eq!(plan.wake_ms, Some(14 * HOUR + 5 * MIN), "the begin time, even of a held job");
    assert!(lean.changes_nothing());
    assert_eq!((lean.placements, lean.preemptions, lean.queue), (plan.placements, plan.preemptions, plan.queue));
}

#[test]
fn a_down_or_inactive_partition_starts_nothing_and_a_draining_one_still_does() {
    for (state, expected) in [
        (proto::PartitionState::Down, Some("PartitionDown: partition gpu is DOWN")),
        (proto::PartitionState::Inactive, Some("PartitionInactive: partition gpu is INACTIVE")),
        (proto::PartitionState::Drain, None),
        (proto::PartitionState::Up, None),
    ] {
        let mut c = Cluster::new();
        c.node(1, "n1", dgx("h100"));
        c.partition(Partition { name: "gpu".into(), default: true, state, ..Partition::default() });
        c.submit(7, spec("gpu:1", 1), 0);
        let plan = c.schedule(1000);
        match expected {
            Some(reason) => {
                assert!(plan.placements.is_empty(), "{state:?}: {plan:?}");
                assert_eq!(plan.pending[&7].first().map(String::as_str), Some(reason), "{state:?}");
            }
            None => assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![7], "{state:?}"),
        }
    }
}

#[test]
fn a_partition_starts_only_the_accounts_and_qos_it_allows() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    let access = proto::PartitionAccess { allow_accounts: vec!["phys".into()], deny_qos: vec!["low".into()], ..Default::default() };
    c.partition(Partition { name: "gpu".into(), default: true, access, ..Partition::default() });
    for (id, account, qos) in [(7, Some("phys"), None), (8, Some("bio"), None), (9, None, None), (10, Some("phys"), Some("low"))] {
        let mut s = spec("gpu:1", 1);
        s.account = account.map(str::to_string);
        s.qos = qos.map(str::to_string);
        c.submit(id, s, 0);
    }
    let plan = c.schedule(1000);
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![7]);
    let first = |id: u64| plan.pending[&id].first().cloned().unwrap_or_default();
    assert_eq!(first(8), "AccountNotAllowed: Job's account not permitted to use this partition (gpu allows phys not bio)");
    assert_eq!(first(9), "AccountNotAllowed: Job's account not known, so it can't use this partition (gpu allows phys)");
    assert_eq!(first(10), "QOSNotAllowed: Job's QOS not permitted to use this partition (gpu denies low including low)");
}

/// Issue 45: a maintenance window on n1 from 2 h to 3 h. A job that would still run then
/// waits with Slurm's words and is planned after the window; one that ends before it starts;
/// a job of the window waits for it to begin and then runs only on its node.
#[test]
fn no_job_runs_into_an_admins_window_and_its_own_jobs_run_only_inside() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100")).node(2, "n2", dgx("h100"));
    c.view.reservations.push(proto::AdminReservation {
        name: "maint".into(),
        start_ms: 2 * HOUR,
        end_ms: 3 * HOUR,
        nodes: vec!["n1".into()],
        users: vec!["root".into()],
        maint: true,
        ..Default::default()
    });
    c.running(1, spec("gpu:8", 1), vec![alloc(2, &[0, 1, 2, 3, 4, 5, 6, 7], 8, 1024)], 0);
    let limited = |gres: &str, hours: u64| {
        let mut s = spec(gres, 1);
        s.time_limit_ms = Some(hours * HOUR);
        s
    };
    c.submit(10, limited("gpu:8", 3), 0);
    c.submit(11, limited("gpu:1", 1), 0);
    let mut own = limited("gpu:1", 1);
    own.set_reservation(Some("maint"));
    c.submit(12, own, 0);
    let plan = c.schedule(HOUR);
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![11], "ends at 2 h, as the window begins");
    assert_eq!(
        plan.pending[&10],
        vec![
            "ReqNodeNotAvail: ReqNodeNotAvail, Reserved for maintenance",
            "top of the queue: reserved to start by 1970-01-01 03:00:00 UTC on n1"
        ]
    );
    assert_eq!(plan.reservation.as_ref().map(|r| (r.job, r.start_ms)), Some((10, 3 * HOUR)), "planned past the window");
    assert!(plan.pending[&12][0].starts_with("Reservation: reservation maint begins at "), "{:?}", plan.pending[&12]);
    assert_eq!(plan.wake_ms, Some(2 * HOUR), "a pass when the window begins");
    // In the window: its job runs on n1 alone; after it, job 10 may have n1.
    let inside = c.schedule(2 * HOUR);
    let placed: Vec<(u64, u64)> = inside.placements.iter().map(|p| (p.job, p.allocs[0].node)).collect();
    assert!(placed.contains(&(12, 1)), "{placed:?}");
    assert!(!placed.iter().any(|p| p.0 == 10), "{placed:?}");
    assert!(c.schedule(3 * HOUR).placements.iter().any(|p| p.job == 10 && p.allocs[0].node == 1));
}

#[test]
fn constraints_lists_and_exclusive() {
    let mut c = Cluster::new();
    let mut ib = dgx("h100");
    ib.features = vec!["ib".into()];
    c.node(1, "n1", dgx("h100")).node(2, "n2", ib.clone()).node(3, "n3", ib);
    c.running(1, spec("gpu:1", 1), vec![alloc(3, &[0], 1, 1024)], 0);
    let mut feat = spec("gpu:1", 1);
    feat.constraint = vec!["ib".into()];
    feat.exclude = vec!["n3".into()];
    c.submit(10, feat, 0);
    let mut listed = spec("gpu:1", 1);
    listed.nodelist = vec!["n1".into()];
    c.submit(11, listed, 0);
    let mut excl = spec("gpu:1", 1);
    excl.exclusive = true;
    c.submit(12, excl, 0);
    let plan = c.schedule(1000);
    assert_eq!(gpus_of(&plan, 10), vec![(2, vec![0])]);
    assert_eq!(gpus_of(&plan, 11), vec![(1, vec![0])]);
    // Exclusive: n1 and n2 are now used, n3 was: nothing idle is left.
    assert!(gpus_of(&plan, 12).is_empty());
    assert_eq!(
        plan.pending[&12],
        vec![
            "needs 1 cpus and 1024 MiB beside 1x gpu on one node; n1 has 111 cpus and 2096128 MiB free".to_string(),
            "needs an idle node (exclusive)".to_string(),
            "no reservation possible: the jobs holding the nodes it needs have no time limit".to_string(),
        ]
    );
}

#[test]
fn a_constraint_of_alternatives_takes_a_node_with_any_of_them() {
    let mut c = Cluster::new();
    let (mut v16, mut v32, mut t4) = (dgx("h100"), dgx("h100"), dgx("h100"));
    v16.features = vec!["v100m16".into()];
    v32.features = vec!["v100m32".into()];
    t4.features = vec!["t4".into()];
    c.node(1, "n1", t4).node(2, "n2", v16).node(3, "n3", v32);
    // Every GPU of n2 busy: of the job's two models, only n3 has one free.
    let all: Vec<u32> = (0..8).collect();
    c.running(1, spec("gpu:8", 1), vec![alloc(2, &all, 1, 1024)], 0);
    let mut either = spec("gpu:1", 1);
    either.constraint = vec!["v100m16|v100m32".into()];
    c.submit(10, either, 0);
    let mut neither = spec("gpu:1", 1);
    neither.constraint = vec!["a100|p100".into()];
    c.submit(11, neither, 0);
    let plan = c.schedule(1000);
    assert_eq!(gpus_of(&plan, 10), vec![(3, vec![0])]);
    assert!(gpus_of(&plan, 11).is_empty());
}

#[test]
fn fits_rejects_stale_and_wrong_allocations() {
    let mut c = Cluster::new();
    let mut ib = dgx("h100");
    ib.features = vec!["ib".into()];
    c.node(1, "n1", ib).node(2, "n2", dgx("a100"));
    c.running(1, spec("gpu:1", 1), vec![alloc(1, &[1], 1, 1024)], 0);
    c.submit(2, spec("gpu:h100:1", 1), 0);
    let job = c.view.jobs.iter().find(|j| j.id == 2).map(|j| (**j).clone()).unwrap();
    let n1 = &c.view.nodes[&1];
    assert_eq!(fits(n1, &job, &alloc(1, &[0], 1, 1024)), Ok(()));
    assert_eq!(fits(n1, &job, &alloc(1, &[1], 1, 1024)), Err(Misfit::GpuBusy(1)));
    assert_eq!(fits(n1, &job, &alloc(1, &[9], 1, 1024)), Err(Misfit::UnknownGpu(9)));
    assert_eq!(fits(n1, &job, &alloc(1, &[0], 200, 1024)), Err(Misfit::Cpus { want: 200, free: 111 }));
    assert_eq!(fits(n1, &job, &alloc(1, &[0], 1, 1 << 30)), Err(Misfit::Memory { want_mib: 1 << 30, free_mib: 2 * 1024 * 1024 - 1024 }));
    assert_eq!(fits(n1, &job, &alloc(1, &[0, 2], 1, 1024)), Err(Misfit::WrongGpuCount { want: 1, got: 2 }));
    let n2 = &c.view.nodes[&2];
    assert_eq!(fits(n2, &job, &alloc(2, &[0], 1, 1024)), Err(Misfit::WrongGpuType { index: 0, want: "h100".into(), have: "a100".into() }));
    let mut down = (**n1).clone();
    down.schedulable = false;
    assert_eq!(fits(&down, &job, &alloc(1, &[0], 1, 1024)), Err(Misfit::NodeUnavailable));
    let mut constrained = job.clone();
    constrained.constraint = vec!["nvme".into()];
    assert_eq!(fits(n1, &constrained, &alloc(1, &[0], 1, 1024)), Err(Misfit::MissingFeature("nvme".into())));
    let mut excluded = job.clone();
    excluded.exclude = vec!["n1".into()];
    assert_eq!(fits(n1, &excluded, &alloc(1, &[0], 1, 1024)), Err(Misfit::Excluded("n1".into())));
    let mut gang = job.clone();
    gang.nodes = 2;
    gang.gpu_type = None;
    assert_eq!(fits_gang(&c.view.nodes, &gang, &[alloc(1, &[0], 1, 1024)]), Err(Misfit::WrongNodeCount { want: 2, want_max: 2, got: 1 }));
    assert_eq!(fits_gang(&c.view.nodes, &gang, &[alloc(1, &[0], 1, 1024), alloc(1, &[2], 1, 1024)]), Err(Misfit::DuplicateNode(1)));
    assert_eq!(fits_gang(&c.view.nodes, &gang, &[alloc(1, &[0], 1, 1024), alloc(2, &[0], 1, 1024)]), Ok(()));
    let err = fits_gang(&c.view.nodes, &gang, &[alloc(1, &[1], 1, 1024), alloc(2, &[0], 1, 1024)]).unwrap_err();
    assert_eq!(err.to_string(), "node 1: gpu 1 is busy");
}

#[test]
fn every_plan_passes_fits_and_is_deterministic() {
    let mut c = leafy_cluster();
    c.running(1, spec("gpu:3", 1), vec![alloc(2, &[0, 1, 2], 3, 1024)], 0);
    for id in 10..60u64 {
        let g = [1, 2, 4, 8][(id % 4) as usize];
        let nodes = if id % 7 == 0 { 2 } else { 1 };
        c.submit(id, spec(&format!("gpu:{g}"), nodes), id);
    }
    let plan = c.schedule(1000);
    assert_eq!(plan, c.schedule(1000));
    let mut nodes = c.view.nodes.clone();
    for p in &plan.placements {
        let job = c.view.jobs.iter().find(|j| j.id == p.job).unwrap();
        fits_gang(&nodes, job, &p.allocs).unwrap();
        for a in &p.allocs {
            std::sync::Arc::make_mut(nodes.get_mut(&a.node).unwrap()).take(a).unwrap();
        }
    }
    assert_eq!(plan.placements.len() + plan.pending.len(), 50);
    let _ = schedule;
}

#[test]
fn a_paced_pass_starts_at_most_its_budget_in_priority_order() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    for id in 1..=4 {
        c.submit(id, spec("gpu:1", 1), id * 10);
    }
    let mut s = spec("gpu:1", 1);
    s.array = Some(ArraySpec::from_ids(&(0..8).collect::<Vec<u32>>(), None));
    c.submit(5, s, 100);
    c.view.config.starts_per_pass_max = 3;
    let plan = c.schedule(1000);
    // The oldest three start; the rest wait a pass, saying why (squeue: Priority).
    assert_eq!(plan.placements.iter().map(|p| p.job).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert_eq!(plan.pending[&4], vec![corral_scheduler::PACED.to_string()]);
    assert_eq!(plan.pending[&5], vec![corral_scheduler::PACED.to_string()]);
    // An array stops at the budget too, mid-array.
    c.view.config.starts_per_pass_max = 6;
    let plan = c.schedule(1000);
    assert_eq!(plan.array_tasks.iter().map(|t| t.task).collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(plan.pending[&5], vec!["array: 6 of 8 tasks not started".to_string(), corral_scheduler::PACED.to_string()]);
    // A budget of nothing starts nothing; the default starts all that fit.
    c.view.config.starts_per_pass_max = 0;
    assert!(c.schedule(1000).placements.is_empty());
    c.view.config.starts_per_pass_max = u32::MAX;
    assert_eq!(c.schedule(1000).placements.len(), 8);
}

#[test]
fn nice_is_read_as_slurm_reads_it() {
    let mut s = spec("gpu:1", 1);
    assert_eq!(s.nice(), 0);
    // A bare --nice is 100; a value that is no number 0 (Slurm's atoi); clamped to ±2147483645.
    for (given, nice) in [("", 100), ("7", 7), ("-3", -3), ("abc", 0), ("99999999999", 2_147_483_645)] {
        s.extra.insert("nice".into(), given.into());
        assert_eq!(s.nice(), nice, "--nice={given}");
    }
}

#[test]
fn a_running_jobs_gpu_time_counts_in_fair_share_before_it_ends() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    let user = |mut s: JobSpec, name: &str| {
        s.user = name.into();
        s
    };
    c.running(1, user(spec("gpu:7", 1), "alice"), vec![alloc(1, &[0, 1, 2, 3, 4, 5, 6], 1, 1024)], 0);
    c.submit(10, user(spec("gpu:1", 1), "alice"), 0).submit(11, user(spec("gpu:1", 1), "bob"), 0);
    // When her job starts alice has used nothing: the ids decide.
    assert_eq!(c.schedule(0).queue.iter().map(|q| q.0).collect::<Vec<_>>(), vec![10, 11]);
    // An hour in, her running job's 7 GPU-hours put bob first, though nothing was charged yet.
    assert!(c.view.usage.is_empty());
    assert_eq!(c.schedule(3_600_000).queue.iter().map(|q| q.0).collect::<Vec<_>>(), vec![11, 10]);
}

/// A job of `-N least-most` asking `gres` on each node.
fn ranged(gres: &str, least: u32, most: u32) -> JobSpec {
    let mut s = spec(gres, least);
    s.set_nodes_max(most);
    s
}

#[test]
fn a_node_range_starts_on_its_least_and_takes_the_free_nodes_of_its_range() {
    // Four 8-GPU nodes, one GPU of n4 busy: -N 2-4 --gres=gpu:8 gets the three whole ones.
    let mut c = Cluster::new();
    for id in 1..=4u64 {
        c.node(id, &format!("n{id}"), dgx("h100"));
    }
    c.running(1, spec("gpu:1", 1), vec![alloc(4, &[0], 1, 1024)], 0);
    c.submit(2, ranged("gpu:8", 2, 4), 0);
    let plan = c.schedule(1000);
    let nodes: Vec<u64> = gpus_of(&plan, 2).into_iter().map(|(n, _)| n).collect();
    assert_eq!(nodes, vec![1, 2, 3]);
    let job = c.view.jobs.iter().find(|j| j.id == 2).unwrap();
    assert_eq!((job.nodes, job.nodes_max), (2, 4));
    fits_gang(&c.view.nodes, job, &plan.placements[0].allocs).unwrap();
    // Any count of the range passes the plan's re-check; one outside it does not.
    let two = &plan.placements[0].allocs[..2];
    assert_eq!(fits_gang(&c.view.nodes, job, two), Ok(()));
    let one = &plan.placements[0].allocs[..1];
    assert_eq!(fits_gang(&c.view.nodes, job, one), Err(Misfit::WrongNodeCount { want: 2, want_max: 4, got: 1 }));
    assert_eq!(fits_gang(&c.view.nodes, job, one).unwrap_err().to_string(), "needs 2-4 nodes, plan gives 1");
    // Only n1 whole: it waits for its least, as a 2-node job would.
    let mut c = Cluster::new();
    for id in 1..=4u64 {
        c.node(id, &format!("n{id}"), dgx("h100"));
    }
    for n in 2..=4u64 {
        c.running(n, spec("gpu:1", 1), vec![alloc(n, &[0], 1, 1024)], 0);
    }
    c.submit(9, ranged("gpu:8", 2, 4), 0);
    let plan = c.schedule(1000);
    assert!(gpus_of(&plan, 9).is_empty() && plan.pending.contains_key(&9), "{plan:?}");
    // A range of a single node's least takes the gang's path: 1-3 on two free nodes gets both.
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100")).node(2, "n2", dgx("h100"));
    c.submit(3, ranged("gpu:8", 1, 3), 0);
    assert_eq!(gpus_of(&c.schedule(1000), 3).len(), 2);
}

/// A job whose GPU is waiting for the layout asked for it (the engine shows that GPU pinned to
/// it) gets no second GPU carved in the passes before the layout is applied.
#[test]
fn a_job_waiting_for_its_mig_layout_is_not_carved_a_second_gpu() {
    let strings = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<String>>();
    let mut c = Cluster::new();
    c.node(1, "m1", h200_mig(&[&[("1g.18gb", 0)], &[]]));
    std::sync::Arc::make_mut(c.view.nodes.get_mut(&1).unwrap()).gpus[0].pinned = Some(strings(&["3g.71gb", "3g.71gb"]));
    c.submit(1, spec("gpu:3g.71gb:1", 1), 0);
    let plan = c.schedule(1000);
    assert!(plan.placements.is_empty());
    assert_eq!(plan.mig_layouts, vec![(1, 0, strings(&["3g.71gb", "3g.71gb"]))], "GPU 1 is left whole");
}
