//! Issue 8: a rolling restart. Every node in turn is stopped with SIGTERM (a graceful stop: its
//! jobs are stopped and reported lost to the node, so `--requeue` jobs are queued again at once)
//! and started again on the same data, while jobs run and more are submitted; no acknowledged job
//! is lost and none runs twice at once.

use std::time::{Duration, Instant};

use corral_tests::{wait_until, TestCluster};

fn spans(c: &TestCluster) -> Vec<chaos::ProcessSpan> {
    chaos::parse_spans(&std::fs::read_to_string(c.work.join("spans.log")).unwrap_or_default())
}

fn pid_of(c: &TestCluster, node: &str) -> i32 {
    std::fs::read_to_string(c.path().join(node).join("corrald.pid")).expect("pid file").trim().parse().expect("pid")
}

#[test]
fn a_rolling_restart_of_every_node_loses_no_job() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--node-down-after-ms", "10000", "--kill-grace-ms", "1000"]);
    // One long `--requeue` job per node: each is on a node when that node restarts.
    let body = format!(
        "{}; trap 'rec end; exit 143' TERM; rec start; if [ \"$CORRAL_RUN\" = 1 ]; then sleep 120 & wait; fi; rec end",
        corral_tests::REC
    );
    let mut ids: Vec<u64> = (0..3).map(|_| c.submit(&["--requeue", "--gres", "gpu:8"], &["sh", "-c", &body])).collect();
    let long = ids.clone();
    wait_until("every long job to run", Duration::from_secs(30), || long.iter().all(|id| c.job(*id)["state"] == "RUNNING"));

    let mut requeue_ms = Vec::new();
    for node in ["n1", "n2", "n3"] {
        ids.push(c.submit(&["--requeue"], &["true"]));
        let on_it: Vec<u64> = long.iter().copied().filter(|id| c.job(*id)["node"] == node && c.job(*id)["state"] == "RUNNING").collect();
        let pid = pid_of(&c, node);
        let stopped = Instant::now();
        c.signal(node, "TERM");
        wait_until(&format!("{node} to stop"), Duration::from_secs(20), || !chaos::runner::pid_alive(pid));
        // The graceful stop reported its job lost: it is queued again before the node could
        // be declared down.
        for id in &on_it {
            wait_until(&format!("job {id} to leave {node}"), Duration::from_secs(20), || {
                let job = c.job(*id);
                job["state"] == "PENDING" || job["run"].as_u64() > Some(1)
            });
            requeue_ms.push(stopped.elapsed().as_millis() as u64);
        }
        let log = corral_tests::node_log(&c, node);
        assert!(log.contains("node stopped: every job stopped and reported"), "{node} stopped gracefully:\n{}", c.logs());
        c.start(node);
        wait_until(&format!("{node} to be up again"), Duration::from_secs(30), || {
            c.json(&["nodes"]).as_array().into_iter().flatten().any(|n| n["name"] == node && n["state"] == "UP")
        });
        ids.push(c.submit(&["--requeue"], &["true"]));
    }
    for id in &ids {
        let job = c.wait_final(*id, Duration::from_secs(60));
        assert_eq!(job["state"], "COMPLETED", "job {id} after the rolling restart: {job}\n{}", c.logs());
    }
    for id in &long {
        assert!(c.job(*id)["restart_count"].as_u64() >= Some(1), "job {id} was on a restarted node");
    }
    // Requeued by the graceful stop, well before node_down_after_ms (10 s) of silence would have.
    assert!(requeue_ms.iter().all(|ms| *ms < 6_000), "requeue after SIGTERM took {requeue_ms:?} ms");
    let violations = chaos::check_never_twice(&spans(&c));
    assert!(violations.is_empty(), "{violations:?}");
    println!("rolling restart: {} jobs, all completed; requeue after SIGTERM {requeue_ms:?} ms", ids.len());
}
