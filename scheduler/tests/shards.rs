//! Shards (`--gres=shard:N`): GPUs shared by several jobs, each asking shards of one GPU, and
//! fragmentation-aware placement of them.

use corral_scheduler::testkit::{alloc, pcie_box, shared, spec, Cluster};
use corral_scheduler::{decode_slot, fits, shard_slot, Misfit, Slot};

const HOUR: u64 = 3_600_000;

fn slots(plan: &corral_scheduler::Plan, job: u64) -> Vec<(u64, Vec<Slot>)> {
    plan.placements
        .iter()
        .filter(|p| p.job == job)
        .flat_map(|p| p.allocs.iter().map(|a| (a.node, a.gpus.iter().map(|&s| decode_slot(s)).collect())))
        .collect()
}

/// The one node and the one slot `job` was placed on.
fn one(plan: &corral_scheduler::Plan, job: u64) -> (u64, Slot) {
    match slots(plan, job).as_slice() {
        [(node, s)] if s.len() == 1 => (*node, s[0]),
        other => panic!("job {job} placed on {other:?}"),
    }
}

#[test]
fn shard_jobs_share_one_gpu_and_a_whole_gpu_job_keeps_off_it() {
    let mut c = Cluster::new();
    c.node(1, "n1", shared(pcie_box("l40s"), 8, 4));
    c.submit(1, spec("shard:3", 1), 0).submit(2, spec("shard:1", 1), 0).submit(3, spec("gpu:1", 1), 0);
    let plan = c.schedule(1000);
    // The whole-GPU job goes first (job size is a priority factor; shards count no GPU).
    let (1, Slot::Gpu(whole)) = one(&plan, 3) else { panic!("job 3 is not on a whole GPU of n1") };
    let (1, Slot::Shard { gpu: shared, shards: 3 }) = one(&plan, 1) else { panic!("job 1 has not 3 shards on n1") };
    // The last shard of that GPU goes to the other job rather than a whole GPU broken for it.
    assert_eq!(one(&plan, 2), (1, Slot::Shard { gpu: shared, shards: 1 }));
    assert_ne!(whole, shared);
    assert!(plan.pending.is_empty());
}

#[test]
fn fits_refuses_shards_past_a_gpus_count_and_a_whole_gpu_while_it_is_shared() {
    let mut c = Cluster::new();
    c.node(1, "n1", shared(pcie_box("l40s"), 2, 4));
    c.running(1, spec("shard:3", 1), vec![alloc(1, &[shard_slot(0, 3)], 1, 1024)], 0);
    c.submit(2, spec("shard:2", 1), 0).submit(3, spec("gpu:1", 1), 0);
    let node = &c.view.nodes[&1];
    let job = |id: u64| c.view.jobs.iter().find(|j| j.id == id).expect("job").clone();
    assert_eq!(fits(node, &job(2), &alloc(1, &[shard_slot(0, 2)], 1, 1024)), Err(Misfit::Shards { gpu: 0, want: 2, free: 1 }));
    assert_eq!(fits(node, &job(2), &alloc(1, &[shard_slot(1, 2)], 1, 1024)), Ok(()));
    assert_eq!(fits(node, &job(2), &alloc(1, &[shard_slot(1, 1)], 1, 1024)), Err(Misfit::WrongShards { want: 2 }));
    assert_eq!(fits(node, &job(3), &alloc(1, &[0], 1, 1024)), Err(Misfit::GpuBusy(0)));
    assert_eq!(fits(node, &job(3), &alloc(1, &[shard_slot(1, 1)], 1, 1024)), Err(Misfit::WrongShards { want: 0 }));
    // The whole-GPU job goes first and takes GPU 1: no GPU is left with 2 shards free.
    let plan = c.schedule(1000);
    assert_eq!(slots(&plan, 3), vec![(1, vec![Slot::Gpu(1)])]);
    assert_eq!(
        plan.pending[&2],
        vec![
            "needs 1x gpu with 2 shards free on one node; largest free: 0 on n1 (1 held by job 3, shards held by job 1)".to_string(),
            "no reservation possible: the jobs holding the nodes it needs have no time limit".to_string()
        ]
    );
}

#[test]
fn a_whole_gpu_job_is_reserved_the_gpu_its_shards_leave() {
    let mut c = Cluster::new();
    c.node(1, "n1", shared(pcie_box("l40s"), 1, 4));
    let mut short = spec("shard:1", 1);
    short.time_limit_ms = Some(HOUR);
    let mut long = spec("shard:1", 1);
    long.time_limit_ms = Some(2 * HOUR);
    c.running(1, short, vec![alloc(1, &[shard_slot(0, 1)], 1, 1024)], 0);
    c.running(2, long, vec![alloc(1, &[shard_slot(0, 1)], 1, 1024)], 0);
    c.submit(3, spec("gpu:1", 1), 0);
    let plan = c.schedule(1000);
    assert!(plan.placements.is_empty());
    // Free as a whole only once both sharers are gone.
    let r = plan.reservation.expect("a reservation");
    assert_eq!((r.job, r.start_ms, r.nodes), (3, 2 * HOUR, vec![1]));
}

#[test]
fn fragmentation_aware_placement_fills_a_shared_gpu_before_breaking_a_whole_one() {
    let mut c = Cluster::new();
    c.node(1, "n1", shared(pcie_box("l40s"), 3, 4)).node(2, "n2", shared(pcie_box("l40s"), 1, 4));
    c.running(1, spec("shard:2", 1), vec![alloc(1, &[shard_slot(0, 2)], 1, 1024)], 0);
    c.submit(2, spec("shard:2", 1), 0);
    let plan = c.schedule(1000);
    assert_eq!(slots(&plan, 2), vec![(1, vec![Slot::Shard { gpu: 0, shards: 2 }])]);
    // Best fit by whole GPUs free takes the node with one free (n1 has two), and breaks it.
    c.view.config.fragmentation_aware = false;
    let plan = c.schedule(1000);
    assert_eq!(slots(&plan, 2), vec![(2, vec![Slot::Shard { gpu: 0, shards: 2 }])]);
}

#[test]
fn a_shard_request_no_gpu_can_hold_never_runs() {
    let mut c = Cluster::new();
    c.node(1, "n1", shared(pcie_box("l40s"), 2, 4)).node(2, "n2", pcie_box("l40s"));
    c.submit(1, spec("shard:5", 1), 0);
    let plan = c.schedule(1000);
    assert!(plan.placements.is_empty());
    assert!(plan.pending[&1][0].starts_with("cannot ever run: needs 1 node(s) with 1x gpu with 5 shards free"), "{:?}", plan.pending[&1]);
    let node_list = [("n1", &shared(pcie_box("l40s"), 2, 4)), ("n2", &pcie_box("l40s"))];
    let why = corral_scheduler::never_holds(node_list.iter().map(|(n, i)| (*n, *i)), "default", &spec("shard:5", 1));
    assert!(why.is_some_and(|w| w.contains("gpu with 5 shards")));
    assert_eq!(corral_scheduler::never_holds(node_list.iter().map(|(n, i)| (*n, *i)), "default", &spec("shard:4", 1)), None);
}
