//! Issue 3 through the CLI: placement on a real cluster packs small jobs and explains waits.

use std::collections::BTreeSet;
use std::time::Duration;

use corral_tests::{wait_until, TestCluster};

#[test]
fn one_gpu_jobs_pack_so_a_whole_node_job_starts_at_once_and_waits_are_explained() {
    let c = TestCluster::up(&["--nodes", "2", "--gpus", "h100:8", "--voters-max", "1"]);
    let small: Vec<u64> = (0..4).map(|_| c.submit(&["--gres", "gpu:h100:1"], &["sleep", "30"])).collect();
    wait_until("the 1-GPU jobs to run", Duration::from_secs(20), || small.iter().all(|id| c.job(*id)["state"] == "RUNNING"));
    let nodes: BTreeSet<String> = small.iter().map(|id| c.job(*id)["node"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(nodes.len(), 1, "1-GPU jobs packed onto one node: {nodes:?}");
    let big = c.submit(&["--gres", "gpu:h100:8"], &["sleep", "30"]);
    wait_until("the 8-GPU job to start", Duration::from_secs(10), || c.job(big)["state"] == "RUNNING");
    assert!(!nodes.contains(c.job(big)["node"].as_str().unwrap_or_default()));

    let waiting = c.submit(&["--gres", "gpu:h100:8"], &["true"]);
    let mut reasons = Vec::new();
    wait_until("a pending reason", Duration::from_secs(10), || {
        let job = c.job(waiting);
        reasons = job["reasons"].as_array().cloned().unwrap_or_default();
        job["state"] == "PENDING" && !reasons.is_empty()
    });
    let text = reasons.iter().filter_map(|r| r.as_str()).collect::<Vec<_>>().join("; ");
    assert!(text.contains("8") && text.contains("gpu"), "reasons name the request: {text}");
    let shown = String::from_utf8_lossy(&c.corral(&["show", &waiting.to_string()]).stdout).into_owned();
    assert!(shown.contains("PENDING") && shown.contains("gpu"), "corral show explains: {shown}");
    let out = c.corral(&["cancel", &big.to_string()]);
    assert!(out.status.success());
    wait_until("the waiting job to start in the freed node", Duration::from_secs(20), || c.job(waiting)["state"] != "PENDING");
}

#[test]
fn mig_instances_are_gres_and_an_idle_gpu_is_repartitioned_for_pending_demand() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h200-mig", "--voters-max", "1"]);
    // The GPU starts as 3g.71gb@0, 2g.35gb@4, 1g.18gb@6: the 1g instance is the node's third
    // GPU device, which is what Slurm's variables number.
    let show = "echo CVD=$CUDA_VISIBLE_DEVICES JG=$SLURM_JOB_GPUS GDO=$GPU_DEVICE_ORDINAL";
    let existing = c.submit(&["--gres", "gpu:1g.18gb:1"], &["sh", "-c", show]);
    let job = c.wait_final(existing, Duration::from_secs(20));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    let out = String::from_utf8_lossy(&c.corral(&["logs", &existing.to_string()]).stdout).into_owned();
    assert!(out.trim().starts_with("CVD=MIG-"), "a MIG instance's UUID: {out}");
    assert!(out.trim().ends_with(" JG=2 GDO=2"), "device ordinals, not slot numbers: {out}");

    // Seven 3g.71gb on one node: an H200 holds two, and this node has one. Refused at submit
    // with the hardware's limit, and nothing is relaid for it.
    let refused = c.shim("sbatch", &["--gres=gpu:3g.71gb:7", "--wrap", "true"], &[]);
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        "sbatch: error: Batch job submission failed: Requested node configuration is not available: no node can ever hold 7x \
         3g.71gb at once: one H200 holds at most 2 (MIG slice rules), and the most any node holds is 2 (n1)"
    );

    // Two 3g.71gb: the layout holds one, so the idle GPU is relaid as two and the job runs.
    let pair = c.submit(&["--gres", "gpu:3g.71gb:2"], &["sh", "-c", show]);
    let job = c.wait_final(pair, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    let out = String::from_utf8_lossy(&c.corral(&["logs", &pair.to_string()]).stdout).into_owned();
    assert_eq!(out.matches("MIG-").count(), 2, "{out}");
    assert!(out.trim().ends_with(" JG=0,1 GDO=0,1"), "{out}");

    // No GPU has a 7g.141gb instance: the scheduler asks for a layout on an idle GPU, the agent
    // applies it through the probe, the new inventory is committed and the job runs.
    let whole = c.submit(&["--gres", "gpu:7g.141gb:1"], &["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"]);
    let job = c.wait_final(whole, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    let out = String::from_utf8_lossy(&c.corral(&["logs", &whole.to_string()]).stdout).into_owned();
    assert!(out.trim().starts_with("CVD=MIG-"), "{out}");
}

/// A GPU whose 3g instance runs a job is re-carved around it for a job of two 1g instances:
/// the running job keeps its instance (same UUID) and goes on; the new job runs beside it.
#[test]
fn a_busy_mig_gpu_is_recarved_around_the_running_instance() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h200-mig", "--voters-max", "1"]);
    // The GPU starts as 3g.71gb@0, 2g.35gb@4, 1g.18gb@6.
    let long = c.submit(&["--gres", "gpu:3g.71gb:1"], &["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES; sleep 120"]);
    wait_until("the 3g job to run", Duration::from_secs(20), || c.job(long)["state"] == "RUNNING");
    let before = c.json(&["mig", "show", "n1"]);
    // Two 1g.18gb: one idle 1g exists; the GPU is re-carved around the running 3g.
    let pair = c.submit(&["--gres", "gpu:1g.18gb:2"], &["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"]);
    let job = c.wait_final(pair, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    assert_eq!(c.job(long)["state"], "RUNNING", "the running job is not disturbed");
    let after = c.json(&["mig", "show", "n1"]);
    assert_eq!(after[0]["layout"], serde_json::json!(["3g.71gb", "1g.18gb", "1g.18gb"]), "before: {before}\nafter: {after}");
    let out = String::from_utf8_lossy(&c.corral(&["logs", &pair.to_string()]).stdout).into_owned();
    assert_eq!(out.matches("MIG-").count(), 2, "{out}");
    let long_out = String::from_utf8_lossy(&c.corral(&["logs", &long.to_string()]).stdout).into_owned();
    let uuid = long_out.trim().trim_start_matches("CVD=").to_string();
    assert!(c.corral(&["cancel", &long.to_string()]).status.success());
    // The next 3g job gets the very instance (a re-created one has a new UUID).
    let next = c.submit(&["--gres", "gpu:3g.71gb:1"], &["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"]);
    let job = c.wait_final(next, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    let next_out = String::from_utf8_lossy(&c.corral(&["logs", &next.to_string()]).stdout).into_owned();
    assert!(uuid.starts_with("MIG-") && next_out.trim() == format!("CVD={uuid}"), "{uuid} vs {next_out}");
}

#[test]
fn an_operator_pins_a_mig_layout_that_is_applied_once_the_gpu_is_idle() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h200-mig", "--voters-max", "1"]);
    let text = |out: &std::process::Output| {
        (String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).trim().to_string())
    };
    // Three 3g.71gb, as `nvidia-smi mig -cgi 9,9,9` would try: refused with the hardware's limit.
    let (_, err) = text(&c.corral(&["mig", "set", "n1", "0", "3g.71gb,3g.71gb,3g.71gb"]));
    assert!(err.ends_with("gpu 0 of node n1: cannot place 3x 3g.71gb on one H200: at most 2 per GPU"), "{err}");
    let (_, err) = text(&c.corral(&["mig", "set", "n1", "0", "5g.71gb"]));
    assert!(err.contains("H200 has no MIG profile 5g.71gb"), "{err}");

    // The GPU (3g.71gb@0, 2g.35gb@4, 1g.18gb@6) runs a 1g job when the pin comes.
    let running = c.submit(&["--gres", "gpu:1g.18gb:1"], &["sleep", "300"]);
    wait_until("the 1g job to run", Duration::from_secs(20), || c.job(running)["state"] == "RUNNING");
    let (out, err) = text(&c.corral(&["mig", "set", "n1", "0", "3g.71gb,3g.71gb"]));
    assert_eq!(out, "n1 gpu 0: pinned to 3g.71gb,3g.71gb; applied once the GPU is idle", "{err}");
    let shown = c.json(&["mig", "show"]);
    assert_eq!(shown[0]["layout"], serde_json::json!(["3g.71gb", "2g.35gb", "1g.18gb"]), "{shown}");
    assert_eq!(shown[0]["pinned"], serde_json::json!(["3g.71gb", "3g.71gb"]), "{shown}");
    // Meanwhile that GPU takes no new work: its free 2g instance is not given out.
    let waiting = c.submit(&["--gres", "gpu:2g.35gb:1"], &["true"]);
    let mut reasons = String::new();
    wait_until("the 2g job to wait for the relayout", Duration::from_secs(20), || {
        reasons = c.job(waiting)["reasons"].to_string();
        reasons.contains("waiting for a new MIG layout")
    });
    assert_eq!(c.job(waiting)["state"], "PENDING", "{reasons}");
    assert_eq!(c.job(running)["state"], "RUNNING", "the pin stops nothing that runs");

    // Idle: relaid into the pinned layout, and jobs that fit it run.
    assert!(c.corral(&["cancel", &running.to_string()]).status.success());
    assert!(c.corral(&["cancel", &waiting.to_string()]).status.success());
    wait_until("the pinned layout to be applied", Duration::from_secs(30), || {
        c.json(&["mig", "show", "n1"])[0]["layout"] == serde_json::json!(["3g.71gb", "3g.71gb"])
    });
    let pair = c.submit(&["--gres", "gpu:3g.71gb:2"], &["sh", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"]);
    let job = c.wait_final(pair, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    let (table, _) = text(&c.corral(&["mig", "show"]));
    assert!(table.lines().nth(1).is_some_and(|l| l.contains("3g.71gb,3g.71gb") && l.ends_with(" 3g.71gb,3g.71gb")), "{table}");

    // `auto` hands the GPU back to the demand: a 7g job gets the GPU relaid for it.
    let (out, _) = text(&c.corral(&["mig", "set", "n1", "0", "auto"]));
    assert_eq!(out, "n1 gpu 0: its layout follows the queue's demand again");
    let whole = c.submit(&["--gres", "gpu:7g.141gb:1"], &["true"]);
    let job = c.wait_final(whole, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    assert_eq!(c.json(&["mig", "show"])[0]["pinned"], serde_json::Value::Null);
}

#[test]
fn the_replicated_policy_limits_partitions_and_lets_a_qos_preempt() {
    // The node names no partition, so it is in whichever the policy makes the default.
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:2", "--voters-max", "1", "--partitions", ""]);
    let policy = c.work.join("policy.toml");
    std::fs::write(
        &policy,
        r#"
[[partitions]]
name = "short"
max_time_limit_ms = 60000
default = true

[[qos]]
name = "high"
priority = 100
preempt = ["normal"]
"#,
    )
    .expect("write policy");
    let out = c.corral(&["policy", "set", policy.to_str().expect("path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(c.json(&["policy", "show"])["qos"][0]["name"], "high");

    let too_long = c.submit(&["--time", "5:00", "--gres", "gpu:1"], &["true"]);
    let mut reasons = String::new();
    wait_until("a time-limit reason", Duration::from_secs(10), || {
        reasons = c.job(too_long)["reasons"].to_string();
        reasons.contains("limit")
    });
    assert_eq!(c.job(too_long)["state"], "PENDING", "{reasons}");

    let low = c.submit(&["--requeue", "--gres", "gpu:2"], &["sleep", "60"]);
    wait_until("the low job to run", Duration::from_secs(10), || c.job(low)["state"] == "RUNNING");
    let high = c.submit(&["--qos", "high", "--gres", "gpu:2"], &["true"]);
    assert_eq!(c.wait_final(high, Duration::from_secs(30))["state"], "COMPLETED");
    let job = c.job(low);
    assert_eq!(job["restart_count"], 1, "the low job was preempted and requeued: {job}");
}

#[test]
fn gpu_faults_requeue_or_fail_their_jobs_and_a_node_with_no_healthy_gpu_is_drained() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:2", "--voters-max", "1"]);
    let faults = c.path().join("n1").join("data").join("fault-gpu");
    let requeued = c.submit(&["--requeue", "--gres", "gpu:1"], &["sleep", "60"]);
    let failed = c.submit(&["--gres", "gpu:1"], &["sleep", "60"]);
    wait_until("both jobs to run", Duration::from_secs(20), || [requeued, failed].iter().all(|j| c.job(*j)["state"] == "RUNNING"));
    let gpu_of = |job: u64| c.job(job)["gpus"][0].as_u64().expect("gpu index");
    let (g_requeued, g_failed) = (gpu_of(requeued), gpu_of(failed));

    std::fs::write(&faults, format!("xid {g_requeued} 79\n")).expect("inject xid");
    wait_until("the requeue job to be requeued", Duration::from_secs(10), || c.job(requeued)["restart_count"] == 1);
    assert_eq!(c.job(failed)["state"], "RUNNING", "a fault on another GPU leaves it alone");
    let nodes = c.json(&["nodes"]);
    assert_eq!(nodes[0]["state"], "UP", "one bad GPU does not drain the node");
    assert_eq!(nodes[0]["unhealthy_gpus"][0]["gpu"], g_requeued);
    assert!(nodes[0]["unhealthy_gpus"][0]["reason"].as_str().is_some_and(|r| r.contains("79")), "{nodes}");

    std::fs::write(&faults, format!("xid {g_requeued} 79\nlost {g_failed}\n")).expect("inject lost");
    wait_until("the other job to end NODE_FAIL", Duration::from_secs(10), || c.job(failed)["state"] == "NODE_FAIL");
    wait_until("the node to be drained", Duration::from_secs(10), || c.json(&["nodes"])[0]["state"] == "DRAINED");
    assert_eq!(c.json(&["nodes"])[0]["reason"], "all GPUs unhealthy");
    assert_eq!(c.job(requeued)["state"], "PENDING");

    let out = c.corral(&["gpu-health", "n1", &g_requeued.to_string(), "--healthy"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("the node back up and the requeued job running again", Duration::from_secs(20), || {
        c.json(&["nodes"])[0]["state"] == "UP" && c.job(requeued)["state"] == "RUNNING"
    });
}

#[test]
fn a_finished_job_carries_its_gpu_utilization_and_peak_memory() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:2", "--voters-max", "1", "--gpu-sample-interval-ms", "200"]);
    let id = c.submit(&["--gres", "gpu:2"], &["sleep", "2"]);
    let job = c.wait_final(id, Duration::from_secs(20));
    assert_eq!(job["state"], "COMPLETED");
    assert!(job["gpu_util_mean_pct"].as_u64().is_some_and(|u| u > 0 && u <= 100), "{job}");
    assert!(job["gpu_mem_peak_mib"].as_u64().is_some_and(|m| m > 0 && m <= 81_559), "{job}");
    assert!(job["gpu_seconds"].as_u64().is_some_and(|s| s >= 2), "{job}");
}

#[test]
fn shard_jobs_share_a_gpu_through_sbatch_and_a_whole_gpu_job_waits_for_it() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:2", "--voters-max", "1", "--shards-per-gpu", "4"]);
    let show = "echo CVD=$CUDA_VISIBLE_DEVICES SH=${SLURM_SHARDS_ON_NODE:-none} JG=${SLURM_JOB_GPUS:-none}; sleep 60";
    let sbatch = |gres: &str, name: &str| -> u64 {
        let out_file = c.work.join(format!("{name}.out"));
        let args = [&format!("--gres={gres}"), "-o", out_file.to_str().expect("path"), "--wrap", show];
        let out = c.shim("sbatch", &args, &[]);
        assert!(out.status.success(), "sbatch --gres={gres}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.trim().trim_start_matches("Submitted batch job ").parse().expect("a job id")
    };
    let (a, b, whole) = (sbatch("shard:2", "a"), sbatch("shard:2", "b"), sbatch("gpu:1", "whole"));
    wait_until("the shard jobs and the whole-GPU job to run", Duration::from_secs(20), || {
        [a, b, whole].iter().all(|id| c.job(*id)["state"] == "RUNNING")
    });
    let line = |name: &str| {
        let mut text = String::new();
        wait_until("the job's line", Duration::from_secs(20), || {
            text = std::fs::read_to_string(c.work.join(format!("{name}.out"))).unwrap_or_default();
            text.ends_with('\n')
        });
        text.trim().to_string()
    };
    let (la, lb, lw) = (line("a"), line("b"), line("whole"));
    // Both shard jobs see the same GPU (by UUID), with their shard count and no GPU list.
    assert!(la.starts_with("CVD=GPU-") && la.ends_with(" SH=2 JG=none"), "{la}");
    assert_eq!(la, lb, "one GPU shared by both");
    let shared = la.split(' ').next().unwrap_or_default();
    assert!(lw.ends_with(" SH=none JG=1") || lw.ends_with(" SH=none JG=0"), "{lw}");
    assert_ne!(lw.split(' ').next(), Some(shared), "the whole-GPU job is on the other GPU: {lw}");
    let tres = String::from_utf8_lossy(&c.shim("scontrol", &["show", "job", &a.to_string()], &[]).stdout).into_owned();
    assert!(tres.contains(",gres/shard=2") && tres.contains("TresPerNode=gres:shard:2"), "{tres}");

    // Both GPUs are taken (one shared, one whole): another whole-GPU job waits, naming them.
    let waiting = c.submit(&["--gres", "gpu:1"], &["true"]);
    let mut reasons = String::new();
    wait_until("a pending reason", Duration::from_secs(10), || {
        reasons = c.job(waiting)["reasons"].to_string();
        reasons.contains("shards held by job")
    });
    assert!(reasons.contains(&format!("shards held by job {a}, {b}")), "{reasons}");
    for id in [a, b] {
        assert!(c.corral(&["cancel", &id.to_string()]).status.success());
    }
    assert_eq!(c.wait_final(waiting, Duration::from_secs(30))["state"], "COMPLETED", "the GPU is whole again once its sharers end");
}
