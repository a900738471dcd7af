//! `scontrol hold/release/update` and `scancel --signal` against a live cluster.

use std::process::Output;
use std::time::Duration;

use corral_tests::{wait_until, TestCluster};

fn shim(c: &TestCluster, name: &str, args: &[&str]) -> Output {
    c.shim(name, args, &[])
}

#[test]
fn hold_release_update_and_signal_a_job() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:1"]);
    let blocker = c.submit(&["--gres", "gpu:1"], &["sh", "-c", "trap 'echo got USR1 >> usr1.txt' USR1; sleep 30 & wait; sleep 30 & wait"]);
    wait_until("the blocker to run", Duration::from_secs(20), || c.job(blocker)["state"] == "RUNNING");
    let held = c.submit(&["--gres", "gpu:1"], &["true"]);
    let out = shim(&c, "scontrol", &["hold", &held.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = shim(&c, "scontrol", &["update", &format!("JobId={held}"), "TimeLimit=5:00"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let job = c.job(held);
    assert_eq!(job["time_limit_ms"], 300_000);
    assert!(
        job["reasons"].as_array().is_some_and(|r| r.iter().any(|r| r.as_str().is_some_and(|r| r.to_lowercase().contains("held")))),
        "{job}"
    );

    let out = shim(&c, "scancel", &["--signal=USR1", &blocker.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("the job to get SIGUSR1", Duration::from_secs(10), || {
        std::fs::read_to_string(c.work.join("usr1.txt")).is_ok_and(|t| t.contains("got USR1"))
    });
    assert_eq!(c.job(blocker)["state"], "RUNNING", "a signal is not a cancel");

    let out = shim(&c, "scontrol", &["update", &format!("JobId={blocker}"), "TimeLimit=1:00"]);
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), format!("Job is no longer pending execution for job {blocker}"));

    assert!(c.corral(&["cancel", &blocker.to_string()]).status.success());
    let out = shim(&c, "scontrol", &["release", &held.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(c.wait_final(held, Duration::from_secs(20))["state"], "COMPLETED");
}
