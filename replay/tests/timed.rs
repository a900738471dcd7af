//! A replay of a trace written here, through the leader's engine, under Corral's scheduler and
//! the Slurm model: the start of every job is what each policy's rules give.

use replay::{cluster, metrics, timed, TraceJob};

fn job(id: u64, submit_s: u64, nodes: u32, gpus_per_node: u32, duration_s: u64, limit_s: u64) -> TraceJob {
    TraceJob {
        id,
        submit_ms: submit_s * 1000,
        duration_ms: duration_s * 1000,
        nodes,
        gpus_per_node,
        cpus_per_node: 4 * gpus_per_node,
        mem_per_node_mib: 0,
        limit_ms: Some(limit_s * 1000),
        user: "ann".into(),
    }
}

/// A (8 GPUs) holds one of two nodes until 1,000 s; B (both nodes) waits for it; C (one node,
/// limit 600 s) fits before B's start, D (one node, limit 2,000 s) does not.
fn trace() -> Vec<TraceJob> {
    vec![job(0, 0, 1, 8, 1_000, 1_000), job(1, 1, 2, 8, 100, 100), job(2, 2, 1, 8, 500, 600), job(3, 3, 1, 8, 2_000, 2_000)]
}

fn starts_s(policy: &str) -> (Vec<u64>, metrics::Report) {
    let nodes = cluster::uniform(2, "h100:8", 64, 512 * 1024).unwrap();
    let out = timed::run(&trace(), &nodes, replay::policy(policy).unwrap()).unwrap();
    let starts = out.jobs.iter().map(|j| j.start_ms.expect("every job starts") / 1000).collect();
    (starts, metrics::report(policy, &out, 0.0))
}

#[test]
fn corral_backfills_at_once_what_ends_before_the_reservation() {
    let (starts, r) = starts_s("corral");
    assert_eq!(starts, vec![0, 1_000, 2, 1_100]);
    assert_eq!(r.started, 4);
    assert_eq!(r.reservation_slips, 0);
    assert_eq!(r.makespan_s, 3_100.0);
    assert_eq!(r.p99_wait_large_s, 999.0);
}

#[test]
fn the_slurm_model_backfills_on_its_period() {
    // Backfill runs every 30 s: C starts at the first run after it came.
    let (starts, r) = starts_s("slurm-22.05");
    assert_eq!(starts, vec![0, 1_000, 30, 1_100]);
    assert_eq!(r.reservation_slips, 0);
}

#[test]
fn allocation_is_the_time_average_of_gpus_held_while_jobs_arrive() {
    // One node: 8 GPUs from 0 to 100 s, 4 from 100 to 200 s, then idle until the last job comes
    // at 300 s: 1,200 GPU-seconds of 2,400 over the arrivals' window.
    let nodes = cluster::uniform(1, "h100:8", 64, 512 * 1024).unwrap();
    let jobs = vec![job(0, 0, 1, 8, 100, 100), job(1, 0, 1, 4, 100, 100), job(2, 300, 1, 1, 10, 10)];
    let out = timed::run(&jobs, &nodes, replay::policy("corral").unwrap()).unwrap();
    let r = metrics::report("corral", &out, 0.0);
    assert!((r.gpu_alloc_pct - 50.0).abs() < 1e-9, "{}", r.gpu_alloc_pct);
    assert!((r.mean_wait_s - 100.0 / 3.0).abs() < 1e-9, "{}", r.mean_wait_s);
    assert!((r.mean_jct_s - 310.0 / 3.0).abs() < 1e-9, "{}", r.mean_jct_s);
    assert_eq!(r.makespan_s, 310.0);
}

#[test]
fn a_job_no_node_holds_is_refused_and_counted() {
    let nodes = cluster::uniform(1, "h100:8", 64, 512 * 1024).unwrap();
    let jobs = vec![job(0, 0, 2, 8, 10, 10), job(1, 0, 1, 1, 10, 10)];
    let out = timed::run(&jobs, &nodes, replay::policy("corral").unwrap()).unwrap();
    let r = metrics::report("corral", &out, 0.0);
    assert_eq!((r.jobs, r.started, r.refused), (2, 1, 1));
}
