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

/// A run the cluster placed on a node whose launch had not arrived when the node was told to
/// stop (SIGTERM): the node refuses the launch and declares itself stopped, so the `--requeue`
/// job is queued again at once, not after `node_down_after_ms` (seen in CI: a rolling restart
/// whose first node was stopped a moment after its job was placed waited 10.8 s for it).
#[test]
fn a_run_placed_on_a_stopping_node_before_its_launch_arrived_is_queued_again_at_once() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--node-down-after-ms", "10000", "--kill-grace-ms", "1000"]);
    let body = format!("{}; trap 'rec end; exit 143' TERM; rec start; sleep 120 & wait; rec end", corral_tests::REC);
    let fill: Vec<u64> = (0..3).map(|_| c.submit(&["--gres", "gpu:8"], &["sh", "-c", &body])).collect();
    wait_until("every node to run a job", Duration::from_secs(30), || fill.iter().all(|id| c.job(*id)["state"] == "RUNNING"));
    // Free a node that does not lead (pausing the leader would elect another).
    let leader = c.leader();
    let freed = *fill.iter().find(|id| c.job(**id)["node"] != leader.as_str()).expect("a job on a follower");
    let target = c.job(freed)["node"].as_str().expect("the job's node").to_string();
    assert!(c.corral(&["cancel", &freed.to_string()]).status.success(), "cancel job {freed}");
    c.wait_final(freed, Duration::from_secs(20));

    // Paused, the target cannot take the launch of the next job, which only fits there.
    c.signal(&target, "STOP");
    let job = c.submit(&["--requeue", "--gres", "gpu:8"], &["sh", "-c", &body]);
    wait_until("the job to be placed on the paused node", Duration::from_secs(10), || {
        let j = c.job(job);
        j["state"] == "RUNNING" && j["node"] == target.as_str()
    });
    let pid = pid_of(&c, &target);
    let stopped = Instant::now();
    // SAFETY: kill(2) on the pid of a corrald this test started; it runs on SIGCONT, its
    // SIGTERM then pending with the launch.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "send SIGTERM");
    c.signal(&target, "CONT");
    wait_until(&format!("{target} to stop"), Duration::from_secs(20), || !chaos::runner::pid_alive(pid));
    wait_until(&format!("job {job} to leave {target}"), Duration::from_secs(20), || {
        let j = c.job(job);
        j["state"] == "PENDING" || j["run"].as_u64() > Some(1)
    });
    let requeue_ms = stopped.elapsed().as_millis() as u64;
    assert!(requeue_ms < 6_000, "queued again {requeue_ms} ms after SIGTERM (node_down_after_ms is 10,000)\n{}", c.logs());
    let log = corral_tests::node_log(&c, &target);
    assert!(log.contains("node declared down: it stopped gracefully"), "{target} declared itself stopped:\n{}", c.logs());
    let nodes = c.json(&["nodes"]);
    let state = nodes.as_array().into_iter().flatten().find(|n| n["name"] == target.as_str()).map(|n| n["state"].clone());
    assert_eq!(state, Some(serde_json::json!("DOWN")), "{nodes}");
    let violations = chaos::check_never_twice(&spans(&c));
    assert!(violations.is_empty(), "{violations:?}");
    println!("a run placed on a stopping node: queued again {requeue_ms} ms after SIGTERM");
}

/// A batch job across two nodes: a step on both that runs through every upgrade (it prints a
/// line when `s-mid` appears, while a node has no daemon, and ends with 3 on `s-go`), then, on
/// `b-go`, a second step started after the upgrades.
const BATCH: &str = r#"#!/bin/sh
#SBATCH -N 2
#SBATCH -o batch.out
echo "batch on $SLURMD_NODENAME pid $$"
srun -l sh -c 'echo "long step on $SLURMD_NODENAME"; while [ ! -e s-mid ]; do sleep 0.1; done; echo "mid on $SLURMD_NODENAME"; while [ ! -e s-go ]; do sleep 0.1; done; echo "after on $SLURMD_NODENAME"; exit 3'
echo "srun long=$?"
while [ ! -e b-go ]; do sleep 0.1; done
srun -l sh -c 'echo "step on $SLURMD_NODENAME"'
echo "srun=$?"
"#;

#[test]
fn a_rolling_upgrade_hands_every_run_over_and_no_job_restarts() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:4", "--node-down-after-ms", "10000", "--kill-grace-ms", "1000"]);
    let rec = corral_tests::REC;
    // Long jobs that end when told to (`done`), and one that fails with 7 when told to (`x-go`):
    // it is told while its node has no daemon, so its end is recorded by its shepherd alone.
    let body = format!("{rec}; rec start; while [ ! -e done ]; do sleep 0.1; done; rec end");
    let long: Vec<u64> = (0..3).map(|_| c.submit(&["--gres", "gpu:4"], &["sh", "-c", &body])).collect();
    let x = c.submit(&[], &["sh", "-c", &format!("{rec}; rec start; while [ ! -e x-go ]; do sleep 0.1; done; rec end; exit 7")]);
    std::fs::write(c.work.join("batch.sh"), BATCH).expect("write script");
    let out = c.shim("sbatch", &["--parsable", "batch.sh"], &[]);
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let batch: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch printed a job id");
    let all: Vec<u64> = long.iter().copied().chain([x, batch]).collect();
    wait_until("every job to run", Duration::from_secs(30), || all.iter().all(|id| c.job(*id)["state"] == "RUNNING"));
    let x_node = c.job(x)["node"].as_str().expect("x runs on a node").to_string();
    let batch_out = || std::fs::read_to_string(c.work.join("batch.out")).unwrap_or_default();
    wait_until("the long step to run on both nodes", Duration::from_secs(30), || batch_out().matches("long step on ").count() == 2);

    let mut gaps_ms = Vec::new();
    for node in ["n1", "n2", "n3"] {
        let pid = pid_of(&c, node);
        let handed = Instant::now();
        c.signal(node, "USR2");
        assert!(!chaos::runner::pid_alive(pid), "{node}'s corrald exits after handing its runs over");
        assert!(corral_tests::node_log(&c, node).contains("runs handed over"), "{node}:\n{}", c.logs());
        if node == "n1" {
            // Step output written while this node has no daemon is kept by the shepherds.
            std::fs::write(c.work.join("s-mid"), b"").expect("write s-mid");
        }
        if node == x_node {
            std::fs::write(c.work.join("x-go"), b"").expect("write x-go");
            wait_until("job x to end with no daemon on its node", Duration::from_secs(10), || {
                spans(&c).iter().any(|s| s.job == x && s.end_ms.is_some())
            });
        }
        c.start(node);
        wait_until(&format!("{node} to take its runs over"), Duration::from_secs(30), || {
            corral_tests::node_log(&c, node).contains("took over the previous daemon's instance and runs")
        });
        gaps_ms.push(handed.elapsed().as_millis() as u64);
        for id in &all {
            let job = c.job(*id);
            if *id != x {
                assert_eq!(job["state"], "RUNNING", "job {id} keeps running through {node}'s upgrade: {job}\n{}", c.logs());
            }
            assert_eq!(job["run"], 1, "job {id} was never restarted: {job}");
        }
        let nodes = c.json(&["nodes"]);
        assert!(nodes.as_array().into_iter().flatten().all(|n| n["state"] == "UP"), "no node was declared down: {nodes}");
    }
    let xjob = c.wait_final(x, Duration::from_secs(30));
    assert_eq!(xjob["state"], "FAILED", "its shepherd's record of exit 7 reached the cluster: {xjob}\n{}", c.logs());
    assert_eq!(xjob["exit_code"], 7, "{xjob}");

    std::fs::write(c.work.join("done"), b"").expect("write done");
    std::fs::write(c.work.join("s-go"), b"").expect("write s-go");
    wait_until("the long step to end", Duration::from_secs(30), || batch_out().contains("srun long="));
    std::fs::write(c.work.join("b-go"), b"").expect("write b-go");
    for id in long.iter().chain([&batch]) {
        let job = c.wait_final(*id, Duration::from_secs(60));
        assert_eq!(job["state"], "COMPLETED", "job {id} after the rolling upgrade: {job}\n{}", c.logs());
        assert_eq!(job["restart_count"], 0, "{job}");
    }
    let out = batch_out();
    assert_eq!(out.lines().filter(|l| l.starts_with("batch on ")).count(), 1, "the script ran once:\n{out}");
    // The step that ran through the upgrades lost none of its output and its exit reached srun.
    for what in ["long step on ", "mid on ", "after on "] {
        assert_eq!(out.matches(what).count(), 2, "{what:?} from both of the step's tasks:\n{out}");
    }
    assert!(out.contains("srun long=3"), "the long step's exit code:\n{out}");
    let mut steps: Vec<&str> = out.lines().filter(|l| l.split_once(": ").is_some_and(|(_, rest)| rest.starts_with("step on "))).collect();
    steps.sort();
    assert_eq!(steps.len(), 2, "a step started after every node was upgraded runs on both of the job's nodes:\n{out}");
    assert!(out.contains("srun=0"), "{out}");
    // One process per job, from before the upgrade to its end.
    let spans = spans(&c);
    for id in long.iter().chain([&x]) {
        let mine: Vec<_> = spans.iter().filter(|s| s.job == *id).collect();
        assert_eq!(mine.len(), 1, "job {id} started once: {mine:?}");
        assert!(mine[0].end_ms.is_some(), "job {id} ended by itself: {mine:?}");
    }
    let violations = chaos::check_never_twice(&spans);
    assert!(violations.is_empty(), "{violations:?}");
    println!("rolling upgrade: {} jobs kept running through 3 hand-overs; hand-over to take-over {gaps_ms:?} ms", all.len());
}

#[test]
fn a_handover_nobody_takes_in_time_kills_the_jobs_before_the_cluster_restarts_them() {
    // Three voters, so that the cluster keeps a quorum while one node has no daemon.
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:4", "--node-down-after-ms", "4000", "--kill-grace-ms", "1000"]);
    let rec = corral_tests::REC;
    let body = format!("{rec}; rec start; if [ \"$CORRAL_RUN\" = 1 ]; then sleep 600; fi; rec end");
    // One job per node; the one on a node that does not lead is handed over and never taken.
    let ids: Vec<u64> = (0..3).map(|_| c.submit(&["--requeue", "--gres", "gpu:4"], &["sh", "-c", &body])).collect();
    wait_until("every job to run", Duration::from_secs(30), || ids.iter().all(|id| c.job(*id)["state"] == "RUNNING"));
    let leader = c.leader();
    let (id, node) = ids
        .iter()
        .map(|id| (*id, c.job(*id)["node"].as_str().expect("node").to_string()))
        .find(|(_, node)| *node != leader)
        .expect("a job on a node that does not lead");
    check_expired_handover(&c, id, &node);
}

fn check_expired_handover(c: &TestCluster, id: u64, node: &str) {
    wait_until("the job to record its start", Duration::from_secs(10), || spans(c).iter().any(|s| s.job == id));
    let pid = spans(c).iter().find(|s| s.job == id).and_then(|s| s.pid).expect("job pid");
    c.signal(node, "USR2");
    // Nobody takes the runs over: the lease runs out and the job is killed on its node (by its
    // shepherd and the watchdog) before the leader declares the node down and requeues it.
    wait_until("the handed-over job to be killed", Duration::from_secs(10), || !chaos::runner::pid_alive(pid));
    let killed_at = corral_tests::now_ms();
    // Every GPU is taken, so it waits in the queue for the node to come back.
    wait_until("the node to be declared down and the job requeued", Duration::from_secs(30), || {
        let job = c.job(id);
        job["state"] == "PENDING" && job["restart_count"] == 1
    });
    c.start(node);
    wait_until(&format!("{node} to be up again"), Duration::from_secs(30), || {
        c.json(&["nodes"]).as_array().into_iter().flatten().any(|n| n["name"] == node && n["state"] == "UP")
    });
    let log = corral_tests::node_log(c, node);
    assert!(log.contains("hand-over expired"), "{node} came back as a new instance:\n{log}");
    let job = c.wait_final(id, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    // Run 1 was SIGKILLed and could not record its end: it ended by the time it was seen dead.
    let mut spans = spans(c);
    corral_tests::close_spans(&mut spans, &std::collections::BTreeMap::from([(pid, killed_at)]));
    let violations = chaos::check_never_twice(&spans);
    assert!(violations.is_empty(), "run 2 started only after run 1 was dead: {violations:?}");
}
