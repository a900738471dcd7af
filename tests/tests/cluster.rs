//! Issue 2 end to end: real `corrald` processes on loopback, real RocksDB, QUIC and processes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use corral_tests::{wait_until, TestCluster};
use serde_json::Value;

/// A job body that records its start and end (with its GPUs) in `spans.log` of the work dir.
fn record_cmd(seconds: &str) -> Vec<String> {
    let body = format!("{}; rec start; sleep $1; rec end", corral_tests::REC);
    vec!["sh".into(), "-c".into(), body, "job".into(), seconds.into()]
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn submit_through_a_follower_runs_with_its_gpus_and_reports_exit_codes() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8"]);
    let leader = c.leader();
    let follower = ["n1", "n2", "n3"].into_iter().find(|n| *n != leader).expect("a follower");
    let addr = c.addr(follower);
    let out = c.corral(&[
        "--server",
        &addr,
        "--json",
        "submit",
        "--gres",
        "gpu:h100:2",
        "--name",
        "probe",
        "--",
        "sh",
        "-c",
        "echo CVD=$CUDA_VISIBLE_DEVICES NODE=$CORRAL_NODE JOB=$CORRAL_JOB_ID",
    ]);
    assert!(out.status.success(), "submit through {follower}: {}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<Value>(&out.stdout).expect("json")["job_id"].as_u64().expect("job id");
    let job = c.wait_final(id, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    assert_eq!(job["exit_code"], 0);
    assert_eq!(job["name"], "probe");
    assert_eq!(job["gpus"].as_array().map(Vec::len), Some(2));
    let node = job["node"].as_str().expect("node").to_string();
    let logs = stdout(&c.corral(&["--server", &addr, "logs", &id.to_string()]));
    let line = logs.lines().next().unwrap_or_default().to_string();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let uuids: Vec<&str> = fields[0].trim_start_matches("CVD=").split(',').collect();
    assert_eq!(uuids.len(), 2, "{line}");
    assert!(uuids.iter().all(|u| u.starts_with("GPU-") && u.len() == 40), "{line}");
    assert_ne!(uuids[0], uuids[1]);
    assert_eq!(fields[1], format!("NODE={node}"));
    assert_eq!(fields[2], format!("JOB={id}"));

    // `corral wait` exits with the job's exit code.
    let failing = c.submit(&[], &["sh", "-c", "exit 3"]);
    let out = c.corral(&["wait", &failing.to_string(), "--timeout", "30"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(c.job(failing)["state"], "FAILED");
    let slow = c.submit(&[], &["sleep", "30"]);
    let out = c.corral(&["wait", &slow.to_string(), "--timeout", "0.3"]);
    assert_eq!(out.status.code(), Some(124));
}

#[test]
fn two_jobs_never_share_a_gpu_and_work_queues_when_gpus_run_out() {
    let c = TestCluster::up(&["--nodes", "2", "--gpus", "h100:4", "--voters-max", "1"]);
    let cmd = record_cmd("0.4");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let ids: Vec<u64> = (0..10).map(|_| c.submit(&["--gres", "gpu:3"], &cmd)).collect();
    let queue = c.json(&["queue"]);
    let pending = queue.as_array().expect("array").iter().filter(|j| j["state"] == "PENDING").count();
    assert!(pending > 0, "30 GPUs of work on 8 GPUs must queue: {queue}");
    let why = queue.as_array().expect("array").iter().find(|j| j["state"] == "PENDING").map(|j| j["reason"].clone());
    assert!(why.as_ref().and_then(|r| r.as_str()).is_some_and(|r| r.contains("gpu")), "pending reason: {why:?}");
    for id in &ids {
        assert_eq!(c.wait_final(*id, Duration::from_secs(60))["state"], "COMPLETED");
    }
    let spans = chaos::parse_spans(&std::fs::read_to_string(c.work.join("spans.log")).expect("spans.log"));
    assert_eq!(spans.len(), 10);
    assert!(spans.iter().all(|s| s.end_ms.is_some() && s.gpus.len() == 3));
    let violations = chaos::check_exclusive_gpus(&spans);
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn leader_sigkill_new_leader_takes_submissions_within_2s_and_other_jobs_finish() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--node-down-after-ms", "4000"]);
    let cmd = record_cmd("3");
    let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
    let ids: Vec<u64> = (0..3).map(|_| c.submit(&["--gres", "gpu:8"], &cmd)).collect();
    wait_until("three whole-node jobs running", Duration::from_secs(20), || {
        std::fs::read_to_string(c.work.join("spans.log"))
            .map(|t| t.lines().filter(|l| l.starts_with("start")).count() == 3)
            .unwrap_or(false)
    });
    let leader = c.leader();
    let survivor = ["n1", "n2", "n3"].into_iter().find(|n| *n != leader).expect("survivor");
    let addr = c.addr(survivor);
    c.signal(&leader, "KILL");
    let killed = Instant::now();
    let out = c.corral(&["--server", &addr, "--json", "submit", "--", "true"]);
    let failover = killed.elapsed();
    assert!(out.status.success(), "submit after failover: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    assert!(failover < Duration::from_secs(2), "new leader took {failover:?}");
    let new_leader = c.json(&["--server", &addr, "cluster"])["leader"].as_str().unwrap_or_default().to_string();
    assert_ne!(new_leader, leader);
    for id in ids {
        let job = c.wait_final(id, Duration::from_secs(30));
        if job["node"] == leader.as_str() {
            assert_eq!(job["state"], "NODE_FAIL", "{job}");
        } else {
            assert_eq!(job["state"], "COMPLETED", "{job}");
        }
    }
}

/// A follower whose forward to the leader dies with the leader (unacknowledged, or replaced by
/// an election while it waited) sends the request on to the next leader: one call, with no
/// retry of the client's own, is answered once the election ends.
#[test]
fn a_request_forwarded_to_a_killed_leader_is_answered_by_the_next_one() {
    use corral_cli::client::Cluster;
    use proto::{ClientRequest, Reply};
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8"]);
    // Killed before all three are voters, the leader would take the quorum with it.
    let voters = |c: &TestCluster| {
        c.json(&["cluster"])["members"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "voter" || m["role"] == "leader").count())
    };
    wait_until("three voters", Duration::from_secs(20), || voters(&c) == 3);
    let leader = c.leader();
    let survivor = ["n1", "n2", "n3"].into_iter().find(|n| *n != leader).expect("survivor");
    let addr = c.addr(survivor);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let client = Cluster::connect_to(c.path(), Some(vec![addr.clone()])).expect("client");
        // The survivor has a connection to the leader (this submission went through it).
        let warm = proto::JobSpec::command(vec!["true".into()], "/tmp", "");
        let warm = client.call_patiently(ClientRequest::Submit { spec: warm }, Duration::from_secs(20)).await;
        assert!(matches!(warm, Ok(Reply::Submitted { .. })), "{warm:?}");
        // SIGKILL from here, and the call at once: `corral dev signal` waits for the exit, and
        // an election may be over by then.
        let pid: i32 = std::fs::read_to_string(c.path().join(&leader).join("corrald.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .expect("the leader's pid");
        // SAFETY: kill(2) on the pid of a daemon this test started.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0, "kill the leader");
        let killed = Instant::now();
        let spec = proto::JobSpec::command(vec!["true".into()], "/tmp", "");
        let reply = client.call(ClientRequest::Submit { spec }).await;
        let answered = killed.elapsed();
        assert!(matches!(reply, Ok(Ok(Reply::Submitted { .. }))), "one call through {survivor} after the kill: {reply:?}\n{}", c.logs());
        let after = c.json(&["--server", &addr, "cluster"]);
        assert!(after["term"].as_u64() > Some(1), "a new leader was elected: {after}");
        assert!(answered < Duration::from_secs(3), "answered after {answered:?}");
    });
    assert_ne!(c.json(&["--server", &addr, "cluster"])["leader"].as_str().unwrap_or_default(), leader);
}

/// A client that resends a submission (its reply lost) gets the job the first one made,
/// through any node, and after the log that holds the key was snapshotted and the whole cluster
/// restarted.
#[test]
fn a_resent_submission_gets_its_first_job_through_any_node_and_after_a_restart() {
    use corral_cli::client::Cluster;
    use proto::{ClientRequest, Reply};
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--snapshot-logs", "20"]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let spec = proto::JobSpec {
        submit_key: Some(0x5eed_0000_0000_0000_0000_0000_0000_0001),
        ..proto::JobSpec::command(vec!["sleep".into(), "60".into()], "/tmp", "")
    };
    let submit_through = |node: &str| {
        let (addr, request) = (c.addr(node), ClientRequest::Submit { spec: spec.clone() });
        runtime.block_on(async {
            let client = Cluster::connect_to(c.path(), Some(vec![addr])).expect("client");
            match client.call_patiently(request, Duration::from_secs(20)).await {
                Ok(Reply::Submitted { job }) => job,
                other => panic!("submit through {node}: {other:?}"),
            }
        })
    };
    let first = submit_through("n1");
    assert_eq!(submit_through("n2"), first, "resent through a follower");
    assert_eq!(submit_through("n3"), first, "resent through the other");
    let other = c.submit(&[], &["true"]);
    assert_ne!(other, first, "a submission of its own");
    // Past a snapshot (the log with the key purged), then a restart of every node.
    for _ in 0..30 {
        c.submit(&["--hold"], &["true"]);
    }
    assert!(c.json(&["cluster"])["purged_index"].as_u64().is_some(), "the log was purged after a snapshot");
    assert!(c.raw(&["dev", "down", "--dir", c.path_str()]).status.success());
    let out = c.raw(&["dev", "up", "--dir", c.path_str(), "--nodes", "3"]);
    assert!(out.status.success(), "restart: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    assert_eq!(submit_through("n2"), first, "resent after the restart");
    let sleeps = c.json(&["queue", "--all"]).as_array().expect("jobs").iter().filter(|j| j["name"] == "sleep").count();
    assert_eq!(sleeps, 1, "one job for the four sends");
}

#[test]
fn whole_cluster_restart_keeps_every_acked_job_in_its_state() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8"]);
    let done: Vec<u64> = (0..5).map(|_| c.submit(&["--gres", "gpu:1"], &["true"])).collect();
    let pending: Vec<u64> = (0..5).map(|_| c.submit(&["--hold"], &["true"])).collect();
    for id in &done {
        assert_eq!(c.wait_final(*id, Duration::from_secs(30))["state"], "COMPLETED");
    }
    let before = c.json(&["queue", "--all"]);
    let out = c.raw(&["dev", "down", "--dir", c.path_str()]);
    assert!(out.status.success());
    let out = c.raw(&["dev", "up", "--dir", c.path_str(), "--nodes", "3"]);
    assert!(out.status.success(), "restart: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let after = c.json(&["queue", "--all"]);
    let summary = |v: &Value| -> Vec<(u64, String)> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|j| (j["id"].as_u64().unwrap_or(0), j["state"].as_str().unwrap_or("").to_string()))
            .collect()
    };
    assert_eq!(summary(&before), summary(&after));
    assert_eq!(summary(&after).len(), 10);
    for id in pending {
        assert_eq!(c.job(id)["state"], "PENDING");
    }
    // And the restarted cluster still runs work.
    let id = c.submit(&[], &["true"]);
    assert_eq!(c.wait_final(id, Duration::from_secs(30))["state"], "COMPLETED");
}

#[test]
fn a_late_joiner_catches_up_from_a_snapshot() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--voters-max", "5", "--snapshot-logs", "20"]);
    let ids: Vec<u64> = (0..60).map(|_| c.submit(&["--hold"], &["true"])).collect();
    let leader_view = c.json(&["cluster"]);
    assert!(leader_view["purged_index"].as_u64().is_some(), "the log was purged after a snapshot: {leader_view}");
    let out = c.raw(&["dev", "up", "--dir", c.path_str(), "--nodes", "4", "--voters-max", "5", "--snapshot-logs", "20"]);
    assert!(out.status.success(), "add n4: {}", String::from_utf8_lossy(&out.stderr));
    wait_until("n4 to become a voter", Duration::from_secs(30), || {
        c.json(&["cluster"])["members"].as_array().is_some_and(|m| m.iter().any(|m| m["name"] == "n4" && m["role"] == "voter"))
    });
    let addr = c.addr("n4");
    let mut n4_view = Value::Null;
    wait_until("n4 to hold every job", Duration::from_secs(30), || {
        n4_view = c.json(&["--server", &addr, "cluster"]);
        let jobs = c.json(&["--server", &addr, "queue", "--all"]);
        n4_view["answered_by"] == "n4" && jobs.as_array().map(Vec::len) == Some(ids.len())
    });
    assert!(n4_view["snapshot_index"].as_u64().is_some(), "n4 installed a snapshot: {n4_view}");
    // Same applied index, same state, byte for byte.
    let leader_addr = c.addr(&c.leader());
    wait_until("n4's state digest to equal the leader's", Duration::from_secs(10), || {
        let a = c.json(&["--server", &addr, "cluster"]);
        let b = c.json(&["--server", &leader_addr, "cluster"]);
        a["applied_index"] == b["applied_index"]
            && a["state_digest"] == b["state_digest"]
            && a["state_digest"].as_str().is_some_and(|d| d.len() == 64)
    });
}

#[test]
fn cancel_kills_the_process_group_and_time_limits_end_in_timeout() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:2", "--kill-grace-ms", "500"]);
    let id = c.submit(&[], &["sh", "-c", "sleep 60 & echo $! > child.pid; wait"]);
    let pid_file = c.work.join("child.pid");
    wait_until("the job's child to start", Duration::from_secs(20), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|t| !t.trim().is_empty())
    });
    let child: i32 = std::fs::read_to_string(&pid_file).expect("pid").trim().parse().expect("pid number");
    let out = c.corral(&["cancel", &id.to_string()]);
    assert!(out.status.success());
    assert_eq!(c.wait_final(id, Duration::from_secs(10))["state"], "CANCELLED");
    // SAFETY: signal 0 only checks whether the process exists.
    wait_until("the whole process group to be gone", Duration::from_secs(10), || unsafe { libc::kill(child, 0) } != 0);
    wait_until("the GPUs to be free again", Duration::from_secs(10), || c.json(&["nodes"])[0]["gpus_free"] == 2);

    let started = Instant::now();
    let id = c.submit(&["--time", "0:01"], &["sh", "-c", "trap '' TERM; sleep 60"]);
    let job = c.wait_final(id, Duration::from_secs(20));
    assert_eq!(job["state"], "TIMEOUT", "{job}");
    assert!(started.elapsed() >= Duration::from_secs(1));
}

#[test]
fn a_dead_voter_is_replaced_by_a_healthy_agent() {
    let c = TestCluster::up(&["--nodes", "4", "--gpus", "h100:1", "--node-down-after-ms", "1500", "--voter-replace-after-ms", "1500"]);
    let voters = |c: &TestCluster| -> BTreeSet<String> {
        c.json(&["cluster"])["members"]
            .as_array()
            .map(|m| {
                m.iter()
                    .filter(|m| m["role"] == "voter" || m["role"] == "leader")
                    .filter_map(|m| m["name"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    wait_until("three voters", Duration::from_secs(20), || voters(&c).len() == 3);
    let before = voters(&c);
    let leader = c.leader();
    let victim = before.iter().find(|v| **v != leader).expect("a follower voter").clone();
    c.signal(&victim, "KILL");
    wait_until("the dead voter to be replaced", Duration::from_secs(30), || {
        let now = voters(&c);
        now.len() == 3 && !now.contains(&victim)
    });
    let after = voters(&c);
    assert!(after.contains("n4") || before.contains("n4"), "{before:?} -> {after:?}");
    let nodes = c.json(&["nodes"]);
    let dead = nodes.as_array().and_then(|n| n.iter().find(|n| n["name"] == victim.as_str())).cloned().unwrap_or_default();
    assert_eq!(dead["state"], "DOWN");

    // The replaced voter comes back: it learns from the log that it is no longer a voter (it
    // stays a learner), follows the current leader and holds the same state, never a stale one.
    c.start(&victim);
    let victim_addr = c.addr(&victim);
    let leader = c.leader();
    let leader_addr = c.addr(&leader);
    wait_until("the old voter to follow the leader with the same state", Duration::from_secs(30), || {
        let mine = c.json(&["--server", &victim_addr, "cluster"]);
        let theirs = c.json(&["--server", &leader_addr, "cluster"]);
        mine["leader"] == leader.as_str()
            && mine["applied_index"] == theirs["applied_index"]
            && mine["state_digest"] == theirs["state_digest"]
    });
    assert!(!voters(&c).contains(&victim), "it did not take its vote back");
    let id = c.submit(&[], &["true"]);
    let out = c.corral(&["--server", &victim_addr, "--json", "show", &id.to_string()]);
    assert!(out.status.success(), "reads through the old voter work: {}", String::from_utf8_lossy(&out.stderr));
}
