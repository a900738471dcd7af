//! `corral replay` as users run it: a Philly-form trace and a `sacct -P` history written here,
//! replayed under Corral's scheduler and the Slurm model; the JSON has each policy's figures
//! and the plot is an SVG. The figures on the public traces come from `scripts/replay.sh`.

use std::process::Command;

use corral_tests::corral_bin;
use serde_json::Value;

fn replay(args: &[&str]) -> Value {
    let out = Command::new(corral_bin()).arg("replay").args(args).output().expect("run corral replay");
    assert!(out.status.success(), "corral replay {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("corral replay --json printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn a_philly_slice_replays_under_both_policies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let trace = dir.path().join("slice.csv");
    // One 8-GPU job holds one of two nodes until 1,000 s; a 16-GPU gang waits for it; a short
    // job fits before the gang's start, a long one does not.
    std::fs::write(
        &trace,
        "job,submit_s,duration_s,num_gpus,nodes,gpus_per_node,limit_bucket_s,vc,orig_timestamp,orig_duration_s\n\
         0,0,1000,8,1,8,1000,a,x,1\n1,1,100,16,2,8,100,a,x,1\n2,2,500,8,1,8,600,a,x,1\n3,3,2000,8,1,8,2000,a,x,1\n",
    )
    .expect("write trace");
    let plot = dir.path().join("plot.svg");
    let t = trace.to_str().expect("utf-8 path");
    let p = plot.to_str().expect("utf-8 path");
    let out = replay(&["philly", t, "--nodes", "2", "--gpus", "h100:8", "--policies", "corral,slurm-22.05", "--plot", p, "--json"]);
    let (corral, slurm) = (&out["corral"], &out["slurm-22.05"]);
    for r in [corral, slurm] {
        assert_eq!(r["jobs"], 4);
        assert_eq!(r["started"], 4);
        assert_eq!(r["reservation_slips"], 0);
        assert_eq!(r["makespan_s"], 3100.0);
        assert_eq!(r["p99_wait_large_s"], 999.0);
    }
    // Corral backfills the short job at once; Slurm's backfill runs every 30 s.
    assert_eq!(corral["mean_wait_s"], (999.0 + 0.0 + 1097.0) / 4.0);
    assert_eq!(slurm["mean_wait_s"], (999.0 + 28.0 + 1097.0) / 4.0);
    let svg = std::fs::read_to_string(&plot).expect("read plot");
    assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("slurm-22.05"), "{svg}");
}

#[test]
fn a_sacct_history_replays() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("sacct.txt");
    std::fs::write(
        &history,
        "JobID|Submit|Elapsed|Timelimit|NNodes|AllocTRES|User\n\
         11|2026-01-01T00:00:00|00:10:00|01:00:00|1|cpu=4,gres/gpu=8,node=1|ann\n\
         11.batch|2026-01-01T00:00:00|00:10:00||1|cpu=4,gres/gpu=8,node=1|\n\
         12|2026-01-01T00:01:00|00:05:00|00:30:00|1|cpu=4,gres/gpu=8,node=1|bob\n",
    )
    .expect("write history");
    let h = history.to_str().expect("utf-8 path");
    let out = replay(&["sacct", h, "--nodes", "1", "--gpus", "h100:8", "--policies", "corral", "--json"]);
    let r = &out["corral"];
    assert_eq!(r["jobs"], 2);
    // The second job waits for the first: 540 s.
    assert_eq!(r["mean_wait_s"], 270.0);
    assert_eq!(r["makespan_s"], 900.0);
}

#[test]
fn an_unknown_policy_is_refused_with_the_list() {
    let out =
        Command::new(corral_bin()).args(["replay", "philly", "/nonexistent", "--policies", "fifo"]).output().expect("run corral replay");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "unknown policy 'fifo': the policies are corral, corral-easy, corral-reserve-after=SECONDS, corral-reservations=N, corral-bestfit, slurm-22.05, slurm-22.05-tuned"
        ),
        "{err}"
    );
}
