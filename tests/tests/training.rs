//! Issue 6 end to end: multi-node gangs with a consistent training environment, requeue from a
//! checkpoint when a node dies, fencing of a partitioned node, and whole-gang requeue.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use corral_tests::{wait_until, TestCluster};
use serde_json::Value;

/// A stand-in `torchrun` that records its arguments and the environment a real one would read.
const TORCHRUN: &str = r#"#!/bin/sh
out="$PWD/torchrun.$CORRAL_NODE.txt"
{
  echo "argv=$*"
  for v in MASTER_ADDR MASTER_PORT WORLD_SIZE NNODES NODE_RANK NPROC_PER_NODE CUDA_VISIBLE_DEVICES NCCL_SOCKET_IFNAME NCCL_IB_DISABLE NCCL_IB_HCA CORRAL_CHECKPOINT_DIR; do
    eval "echo $v=\$$v"
  done
  echo "hostfile=$(tr '\n' ';' < "$CORRAL_HOSTFILE")"
} > "$out"
"#;

/// A job body that records its start and end (also when stopped with SIGTERM) and resumes from
/// `$CORRAL_CHECKPOINT_DIR/ckpt`.
const CHECKPOINTED: &str = r#"
trap 'rec end; exit 143' TERM
rec start
if [ -f "$CORRAL_CHECKPOINT_DIR/ckpt" ]; then
  echo "resumed from $(cat "$CORRAL_CHECKPOINT_DIR/ckpt") at restart $CORRAL_RESTART_COUNT"
  rec end
  exit 0
fi
echo "step-5 of run $CORRAL_RUN" > "$CORRAL_CHECKPOINT_DIR/ckpt"
echo "first run on $CORRAL_NODE"
sleep 60 & wait
"#;

/// The tests whose jobs bind their `MASTER_PORT` (nccl-check, --preflight) take turns: every
/// test cluster on this one host counts ports from the same first one, so two at once collide,
/// which separate hosts never do.
static MASTER_PORT_USERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn write_exe(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write stand-in");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod stand-in");
}

fn fields(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn spans(c: &TestCluster) -> Vec<chaos::ProcessSpan> {
    chaos::parse_spans(&std::fs::read_to_string(c.work.join("spans.log")).unwrap_or_default())
}

/// Waits until job `id` runs `run` and its process recorded its start; returns the job.
fn wait_run_started(c: &TestCluster, id: u64, run: u64, patience: Duration) -> Value {
    let mut job = Value::Null;
    wait_until(&format!("job {id} run {run} to start"), patience, || {
        job = c.job(id);
        job["run"] == run && spans(c).iter().any(|s| s.job == id && u64::from(s.run) == run)
    });
    job
}

#[test]
fn a_two_node_job_gets_one_consistent_torchrun_environment() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:4"]);
    let bin = c.work.join("bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    write_exe(&bin.join("torchrun"), TORCHRUN);
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let script = c.work.join("train.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\nexport PATH={path}\ntorchrun --nnodes=$NNODES --node_rank=$NODE_RANK --nproc_per_node=$NPROC_PER_NODE --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT train.py\n"),
    )
    .expect("write script");
    let out = c.corral(&["--json", "submit", "-N", "2", "--gres", "gpu:4", script.to_str().expect("path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = serde_json::from_slice::<Value>(&out.stdout).expect("json")["job_id"].as_u64().expect("id");
    let job = c.wait_final(id, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let nodes: Vec<String> = job["nodes"].as_array().expect("nodes").iter().filter_map(|n| n.as_str().map(String::from)).collect();
    assert_eq!(nodes.len(), 2);
    let seen: Vec<_> = nodes
        .iter()
        .map(|n| {
            fields(&std::fs::read_to_string(c.work.join(format!("torchrun.{n}.txt"))).unwrap_or_else(|e| panic!("no record from {n}: {e}")))
        })
        .collect();
    for (rank, f) in seen.iter().enumerate() {
        assert_eq!(f["NODE_RANK"], rank.to_string());
        assert_eq!(f["NNODES"], "2");
        assert_eq!(f["NPROC_PER_NODE"], "4");
        assert_eq!(f["WORLD_SIZE"], "8");
        assert_eq!(f["MASTER_ADDR"], "127.0.0.1");
        assert_eq!(
            f["argv"],
            format!("--nnodes=2 --node_rank={rank} --nproc_per_node=4 --master_addr=127.0.0.1 --master_port={} train.py", f["MASTER_PORT"])
        );
        assert_eq!(f["CUDA_VISIBLE_DEVICES"].split(',').count(), 4);
        assert_eq!(f["NCCL_SOCKET_IFNAME"], "lo");
        assert_eq!(f["hostfile"], format!("{} slots=4;{} slots=4;", nodes[0], nodes[1]));
    }
    assert_eq!(seen[0]["MASTER_PORT"], seen[1]["MASTER_PORT"]);
    assert!(seen[0]["MASTER_PORT"].parse::<u16>().is_ok_and(|p| p >= 29_500));
    // Every node of the job sees the same checkpoint directory (the dev cluster's shared root).
    assert_eq!(seen[0]["CORRAL_CHECKPOINT_DIR"], seen[1]["CORRAL_CHECKPOINT_DIR"]);
    assert!(seen[0]["CORRAL_CHECKPOINT_DIR"].ends_with(&format!("/job-{id}")));
}

#[test]
fn sigkill_of_its_node_restarts_a_requeue_job_elsewhere_from_its_checkpoint() {
    let down_after_ms = 3_000u64;
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--node-down-after-ms", "3000"]);
    let body = format!("{}\n{CHECKPOINTED}", corral_tests::REC);
    let id = c.submit(&["--requeue", "--gres", "gpu:8", "-o", "train-%j.out"], &["sh", "-c", &body]);
    let job = wait_run_started(&c, id, 1, Duration::from_secs(20));
    let victim = job["node"].as_str().expect("node").to_string();
    c.signal(&victim, "KILL");
    let killed = Instant::now();
    let deaths = corral_tests::observe_deaths(&c.work.join("spans.log"), &victim, Duration::from_secs(5));
    let job = c.wait_final(id, Duration::from_secs(30));
    let recovered = killed.elapsed();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    assert_eq!(job["restart_count"], 1);
    assert_eq!(job["run"], 2);
    assert_ne!(job["node"].as_str(), Some(victim.as_str()));
    assert!(recovered < Duration::from_millis(down_after_ms + 5_000), "requeue took {recovered:?}");
    let out = std::fs::read_to_string(c.work.join(format!("train-{id}.out"))).expect("output");
    assert!(out.contains(&format!("first run on {victim}")), "output of run 1 kept: {out}");
    assert!(out.contains("resumed from step-5 of run 1 at restart 1"), "run 2 resumed from the checkpoint: {out}");
    let mut spans = spans(&c);
    corral_tests::close_spans(&mut spans, &deaths);
    let violations = chaos::check_never_twice(&spans);
    assert!(violations.is_empty(), "{violations:?}");
}

#[test]
fn a_partitioned_node_stops_its_job_before_it_starts_elsewhere() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--node-down-after-ms", "3000"]);
    // Three voters first: a leader cut off while it still promotes the third (a joint
    // configuration that needs it) leaves no quorum to elect another, and the test would wait on
    // Raft, not on the fence it checks (seen once in CI).
    wait_until("three voters", Duration::from_secs(30), || {
        c.json(&["cluster"])["members"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "voter" || m["role"] == "leader").count())
            == 3
    });
    let id = c.submit(
        &["--requeue", "--gres", "gpu:8"],
        &["sh", "-c", &format!("{}; trap 'rec end; exit 143' TERM; rec start; sleep 8 & wait; rec end", corral_tests::REC)],
    );
    let job = wait_run_started(&c, id, 1, Duration::from_secs(20));
    let victim = job["node"].as_str().expect("node").to_string();
    std::fs::write(c.path().join(&victim).join("data").join("fault-partition"), "*\n").expect("partition");
    wait_run_started(&c, id, 2, Duration::from_secs(30));
    let spans = spans(&c);
    let first = spans.iter().find(|s| s.job == id && s.run == 1).expect("run 1").clone();
    let second = spans.iter().find(|s| s.job == id && s.run == 2).expect("run 2").clone();
    let stopped = first.end_ms.unwrap_or_else(|| panic!("run 1 on {victim} was never stopped: {spans:?}"));
    assert!(stopped < second.start_ms, "run 1 stopped at {stopped}, run 2 started at {}", second.start_ms);
    assert!(chaos::check_never_twice(&spans).is_empty());
    std::fs::remove_file(c.path().join(&victim).join("data").join("fault-partition")).expect("heal");
    assert_eq!(c.wait_final(id, Duration::from_secs(30))["state"], "COMPLETED");
}

#[test]
fn a_paused_node_has_its_job_killed_by_the_watchdog_before_it_starts_elsewhere() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--node-down-after-ms", "3000"]);
    let body = format!("{}; rec start; if [ \"$CORRAL_RUN\" = 1 ]; then sleep 60 & wait; fi; rec end", corral_tests::REC);
    let id = c.submit(&["--requeue", "--gres", "gpu:8"], &["sh", "-c", &body]);
    let job = wait_run_started(&c, id, 1, Duration::from_secs(20));
    let victim = job["node"].as_str().expect("node").to_string();
    // A paused corrald cannot fence; its watchdog must (SIGKILL: the job cannot record its end).
    c.signal(&victim, "STOP");
    let deaths = corral_tests::observe_deaths(&c.work.join("spans.log"), &victim, Duration::from_secs(10));
    wait_run_started(&c, id, 2, Duration::from_secs(30));
    c.signal(&victim, "CONT");
    let mut spans = spans(&c);
    corral_tests::close_spans(&mut spans, &deaths);
    let first = spans.iter().find(|s| s.job == id && s.run == 1).expect("run 1").clone();
    let second = spans.iter().find(|s| s.job == id && s.run == 2).expect("run 2").clone();
    assert_eq!(first.node, victim);
    let stopped = first.end_ms.unwrap_or_else(|| panic!("run 1 on the paused {victim} was never stopped: {spans:?}"));
    assert!(stopped < second.start_ms, "run 1 stopped at {stopped}, run 2 started at {}", second.start_ms);
    assert!(chaos::check_never_twice(&spans).is_empty());
    let job = c.wait_final(id, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    assert_eq!(job["restart_count"], 1);
    // The resumed node rejoins and is usable again.
    wait_until(&format!("{victim} to be up again"), Duration::from_secs(30), || {
        c.json(&["nodes"]).as_array().into_iter().flatten().any(|n| n["name"] == victim.as_str() && n["state"] == "UP")
    });
}

#[test]
fn a_gang_that_loses_one_node_is_requeued_whole() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--node-down-after-ms", "3000"]);
    let body = format!(
        "{}; trap 'rec end; exit 143' TERM; rec start; if [ \"$CORRAL_RUN\" = 1 ]; then sleep 60 & wait; fi; rec end",
        corral_tests::REC
    );
    let id = c.submit(&["--requeue", "-N", "2", "--gres", "gpu:8"], &["sh", "-c", &body]);
    wait_until("both parts of run 1 started", Duration::from_secs(20), || {
        spans(&c).iter().filter(|s| s.job == id && s.run == 1).count() == 2
    });
    let job = c.job(id);
    let nodes: Vec<String> = job["nodes"].as_array().expect("nodes").iter().filter_map(|n| n.as_str().map(String::from)).collect();
    c.signal(&nodes[1], "KILL");
    let deaths = corral_tests::observe_deaths(&c.work.join("spans.log"), &nodes[1], Duration::from_secs(5));
    let job = c.wait_final(id, Duration::from_secs(40));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    assert_eq!(job["restart_count"], 1);
    let mut spans = spans(&c);
    corral_tests::close_spans(&mut spans, &deaths);
    corral_tests::assert_gang_requeued_whole(&spans, id, &nodes[0]);
}

#[test]
fn nccl_check_measures_every_node_pair_of_an_allocation() {
    let _turn = MASTER_PORT_USERS.lock().unwrap_or_else(|p| p.into_inner());
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8"]);
    let out = c.corral(&["--json", "nccl-check", "--nodes", "3", "--gres", "gpu:8", "--bytes", "33554432"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "nccl-check failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["state"], "COMPLETED");
    let pairs = v["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 2, "rank 0 measured both other nodes: {v}");
    let peers: std::collections::BTreeSet<&str> = pairs.iter().filter_map(|p| p["b"].as_str()).collect();
    assert_eq!(peers.len(), 2, "two distinct peers: {v}\n{}", c.logs());
    assert!(pairs.iter().all(|p| p["mbps"].as_f64().is_some_and(|m| m > 0.0) && p["slow"] == false), "{v}");
    // torch is not installed here: the pairs went over TCP.
    let torch = Command::new("python3").args(["-c", "import torch"]).output().is_ok_and(|o| o.status.success());
    assert_eq!(v["method"], if torch { "torch" } else { "tcp" }, "{v}");
    assert_eq!(v["intra_node"], serde_json::json!([]), "no all_reduce_perf, no intra-node figures: {v}");

    // With nccl-tests' all_reduce_perf on PATH (a stand-in printing its format, a different
    // figure per node), every node's bus bandwidth is reported.
    let bin = c.work.join("nccl-tests-bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    write_exe(
        &bin.join("all_reduce_perf"),
        "#!/bin/sh\necho \"# nThread 1 nGpus $6 minBytes 8388608\"\necho \"$*\" > \"$PWD/arp.$CORRAL_NODE.args\"\necho \"# Avg bus bandwidth    : 1${CORRAL_NODE#n}0.5 \"\n",
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(corral_tests::corral_bin())
        .args([
            "--cluster",
            c.path_str(),
            "--json",
            "nccl-check",
            "--nodes",
            "3",
            "--gres",
            "gpu:8",
            "--bytes",
            "8388608",
            "--method",
            "tcp",
        ])
        .env("PATH", &path)
        .current_dir(&c.work)
        .output()
        .expect("run nccl-check");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "nccl-check failed: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_str(&text).expect("json");
    let intra = v["intra_node"].as_array().expect("intra_node");
    assert_eq!(intra.len(), 3, "{v}");
    for n in intra {
        let node = n["node"].as_str().expect("node");
        let expect: f64 = format!("1{}0.5", node.trim_start_matches('n')).parse().expect("figure");
        assert_eq!(n["busbw_gbps"].as_f64(), Some(expect), "{v}");
        let args = std::fs::read_to_string(c.work.join(format!("arp.{node}.args"))).expect("all_reduce_perf ran on every node");
        assert!(args.contains("-g 8"), "one process drives the node's 8 GPUs: {args}");
    }
}

#[test]
fn a_preflight_runs_before_a_gang_starts_and_a_failed_one_holds_it() {
    let _turn = MASTER_PORT_USERS.lock().unwrap_or_else(|p| p.into_inner());
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8"]);
    let out = |id: u64, rank: u32| std::fs::read_to_string(c.work.join(format!("pf-{id}-{rank}.out"))).unwrap_or_default();

    // Passes: the first node's output opens with the measurement, then the command runs.
    let opts = ["--nodes", "2", "--gres", "gpu:8", "--preflight", "--preflight-bytes", "8388608", "-o", "pf-%j-%n.out"];
    let id = c.submit(&opts, &["sh", "-c", "echo command ran on $CORRAL_NODE"]);
    let job = c.wait_final(id, Duration::from_secs(60));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    let first = out(id, 0);
    let (report, ran) = (first.find("corral preflight: passed on 2 nodes"), first.find("command ran on"));
    assert!(report.is_some() && ran.is_some() && report < ran, "report, then the command: {first}");
    assert!(first.contains(" <- ") && first.contains("Mbit/s"), "{first}");
    assert!(out(id, 1).contains("corral preflight: passed") && out(id, 1).contains("command ran on"), "{}", out(id, 1));

    // Fails (no loopback carries 10^12 Mbit/s): held with the reason, the command never ran,
    // every GPU free again.
    let opts = ["--nodes", "2", "--gres", "gpu:8", "--preflight=1000000000000", "--preflight-bytes", "8388608", "-o", "pf-%j-%n.out"];
    let id = c.submit(&opts, &["sh", "-c", "touch ran-$CORRAL_JOB_ID-$CORRAL_NODE"]);
    let mut job = Value::Null;
    wait_until("the job to be held by its preflight", Duration::from_secs(60), || {
        job = c.job(id);
        job["state"] == "PENDING" && job["reasons"].to_string().contains("preflight failed")
    });
    assert!(job["reasons"].to_string().contains("minimum 1000000000000 Mbit/s"), "{job}");
    assert!(job["reasons"].to_string().contains("job is held"), "{job}");
    assert_eq!(job["restart_count"], 0);
    let ran: Vec<_> =
        std::fs::read_dir(&c.work).expect("work dir").flatten().filter(|e| e.file_name().to_string_lossy().starts_with("ran-")).collect();
    assert!(ran.is_empty(), "the command ran: {ran:?}");
    wait_until("every GPU to be free", Duration::from_secs(20), || {
        c.json(&["nodes"]).as_array().is_some_and(|n| n.iter().all(|n| n["gpus_free"] == 8))
    });
    assert!(out(id, 1).contains("corral preflight: failed"), "{}", out(id, 1));
}
