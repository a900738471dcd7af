//! Issue 43, gang repair: a 2-node `corral submit` gang holding one spare node loses a worker
//! node (its `corrald` SIGKILLed: the node's watchdog fences its processes, the leader declares
//! it down). The lost rank starts on the spare with the same rank, and the other part is never
//! restarted; `sacct`'s SystemComment says so, before and after the job leaves the hot state. A
//! second loss, with no spare left, requeues the gang as before, which then runs again with a
//! spare once its nodes are back.

use std::time::Duration;

use corral_tests::{now_ms, wait_until, TestCluster};

/// Each part appends "NODE RANK PID RESTARTS START_MS" to `parts.txt` in the job's directory,
/// then sleeps.
const JOB: &str = "#!/bin/sh
#SBATCH -N 2
#SBATCH --spare-nodes=1
#SBATCH --gres=gpu:1
#SBATCH --requeue
#SBATCH -x LEADER
echo \"$CORRAL_NODE $CORRAL_NODE_RANK $$ $CORRAL_RESTART_COUNT $(date +%s%3N)\" >> parts.txt
exec sleep 600
";

/// The lines of `parts.txt`: (node, rank, pid, restarts, start ms).
fn parts(c: &TestCluster) -> Vec<(String, u32, u32, u32, u64)> {
    let text = std::fs::read_to_string(c.work.join("parts.txt")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.to_string(),
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
                f.get(3)?.parse().ok()?,
                f.get(4)?.parse().ok()?,
            ))
        })
        .collect()
}

/// `sacct`'s SystemComment of job `id` (`-P`, no header: the comment's lines as they are), and
/// `sacct --json`'s `comment.system`.
fn system_comment(c: &TestCluster, id: u64) -> (String, serde_json::Value) {
    let id = id.to_string();
    let out = c.shim("sacct", &["-X", "-P", "-n", "-a", "-o", "SystemComment", "-j", &id], &[]);
    assert!(out.status.success(), "sacct: {}", String::from_utf8_lossy(&out.stderr));
    let json = c.shim("sacct", &["--json", "-j", &id], &[]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap_or_default();
    (String::from_utf8_lossy(&out.stdout).trim_end().to_string(), json["jobs"][0]["comment"]["system"].clone())
}

/// Checks that `comment` is one line saying rank 1 moved from `lost` to `spare`, at a time
/// in Slurm's format, because `lost` went down without heartbeats.
fn assert_one_repair(comment: &str, lost: &str, spare: &str) {
    let head = format!("run 1 rank 1 moved from {lost} to spare {spare} at ");
    let rest = comment.strip_prefix(&head).unwrap_or_else(|| panic!("SystemComment {comment:?} starts with {head:?}"));
    let (when, cause) = rest.split_at(rest.find(" (").unwrap_or(0));
    assert!(when.len() == 19 && when.as_bytes()[10] == b'T', "a time as Slurm prints one: {when:?}");
    assert!(cause.starts_with(&format!(" (node {lost} down: no heartbeat for ")) && cause.ends_with(" ms)"), "{comment:?}");
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn a_gang_with_a_spare_loses_a_worker_node_and_goes_on_without_restarting_its_other_part() {
    // Finished jobs leave the hot state after 2 s, so the end sees its record in the store.
    let c = TestCluster::up(&["--nodes", "4", "--gpus", "h100:1", "--min-job-age-s", "2"]);
    let leader = c.leader();
    std::fs::write(c.work.join("job.sh"), JOB.replace("LEADER", &leader)).expect("write the job");
    let out = c.corral(&["submit", "job.sh"]);
    assert!(out.status.success(), "submit: {}", String::from_utf8_lossy(&out.stderr));
    let id: u64 = String::from_utf8_lossy(&out.stdout).split_whitespace().last().and_then(|w| w.parse().ok()).expect("a job id");
    wait_until("both parts to start", Duration::from_secs(30), || parts(&c).len() == 2);
    let job = c.job(id);
    let nodes: Vec<String> =
        job["nodes"].as_array().map(|a| a.iter().filter_map(|n| n.as_str().map(str::to_string)).collect()).unwrap_or_default();
    let spares = job["spares"].as_array().cloned().unwrap_or_default();
    assert_eq!((nodes.len(), spares.len(), job["state"].as_str()), (2, 1, Some("RUNNING")), "{job}");
    let spare = spares[0].as_str().unwrap_or_default().to_string();
    assert!(!nodes.contains(&spare) && !nodes.contains(&leader) && spare != leader, "{job}");
    let (survivor, worker) = (nodes[0].clone(), nodes[1].clone());
    let before = parts(&c);
    let survivor_pid = before.iter().find(|p| p.0 == survivor).map(|p| p.2).expect("the survivor's part");
    let worker_pid = before.iter().find(|p| p.0 == worker).map(|p| p.2).expect("the worker's part");
    assert!(before.iter().all(|p| p.0 != spare), "nothing ran on the spare: {before:?}");

    // The worker's daemon dies: its watchdog fences its part, the leader declares it down,
    // and rank 1 starts on the spare.
    let killed_ms = now_ms();
    c.signal(&worker, "KILL");
    wait_until("rank 1 to start on the spare", Duration::from_secs(60), || parts(&c).iter().any(|p| p.0 == spare));
    let after = parts(&c);
    let started_ms = after.iter().find(|p| p.0 == spare).map_or(0, |p| p.4);
    eprintln!("rank 1 started on the spare {} ms after its node's corrald was SIGKILLed", started_ms.saturating_sub(killed_ms));
    assert_eq!(after.iter().find(|p| p.0 == spare).map(|p| (p.1, p.3)), Some((1, 0)), "the same rank, no restart: {after:?}");
    assert_eq!(after.iter().filter(|p| p.0 == survivor).count(), 1, "the survivor never started again: {after:?}");
    assert!(alive(survivor_pid), "the survivor's process still runs");
    assert!(!alive(worker_pid), "the lost node's part was fenced");
    let job = c.job(id);
    assert_eq!((job["state"].as_str(), job["restart_count"].as_u64()), (Some("RUNNING"), Some(0)), "{job}");
    assert_eq!(job["nodes"], serde_json::json!([survivor, spare]), "{job}");
    let repair = &job["repairs"][0];
    assert_eq!(
        (repair["rank"].as_u64(), repair["lost"].as_str(), repair["spare"].as_str()),
        (Some(1), Some(worker.as_str()), Some(spare.as_str())),
        "{job}"
    );
    // sacct and scontrol show it as Slurm shows a job's system comment.
    let (comment, json) = system_comment(&c, id);
    assert_one_repair(&comment, &worker, &spare);
    eprintln!("sacct SystemComment: {comment}");
    assert_eq!(json.as_str(), Some(comment.as_str()), "sacct --json's comment.system");
    let show = c.shim("scontrol", &["show", "job", &id.to_string()], &[]);
    assert!(String::from_utf8_lossy(&show.stdout).contains(&format!("   SystemComment={comment} \n")), "scontrol show job");

    // No spare left: losing the spare's node now requeues the gang, as without spares.
    c.signal(&spare, "KILL");
    wait_until("the gang to be requeued", Duration::from_secs(60), || c.job(id)["restart_count"].as_u64() == Some(1));
    wait_until("the survivor to be stopped", Duration::from_secs(30), || !alive(survivor_pid));
    // Its nodes back, it runs again from the start: both ranks, a spare again.
    c.start(&worker);
    c.start(&spare);
    wait_until("the requeued gang to run again", Duration::from_secs(90), || parts(&c).iter().filter(|p| p.3 == 1).count() == 2);
    let job = c.job(id);
    assert_eq!((job["state"].as_str(), job["spares"].as_array().map(Vec::len)), (Some("RUNNING"), Some(1)), "{job}");

    // Ended, it leaves the hot state for the accounting store with its system comment: the
    // one repair (a requeue is none).
    let cancel = c.shim("scancel", &[&id.to_string()], &[]);
    assert!(cancel.status.success(), "scancel: {}", String::from_utf8_lossy(&cancel.stderr));
    wait_until("the job to leave the hot state", Duration::from_secs(60), || {
        let squeue = c.shim("squeue", &["-h", "-t", "all", "-o", "%i"], &[]);
        squeue.status.success() && !String::from_utf8_lossy(&squeue.stdout).split_whitespace().any(|w| w == id.to_string())
    });
    let (archived, json) = system_comment(&c, id);
    assert_eq!(archived, comment, "the same SystemComment from the accounting store");
    assert_eq!(json.as_str(), Some(comment.as_str()), "sacct --json's comment.system from the store");
}

/// A batch job with a spare whose `srun` step has a task on each node: each task notes
/// "start RANK NODE PID" in `steps.txt`, waits for `release`, then prints "end RANK NODE".
const BATCH: &str = "#!/bin/sh
#SBATCH -N 2
#SBATCH --spare-nodes=1
#SBATCH --gres=gpu:1
#SBATCH -x LEADER
srun sh -c 'echo \"start $SLURM_PROCID $SLURMD_NODENAME $$\" >> steps.txt; while [ ! -e release ]; do sleep 0.2; done; echo \"end $SLURM_PROCID $SLURMD_NODENAME\"'
echo \"srun=$?\"
";

/// The "start" lines of `steps.txt`: (rank, node, pid).
fn step_starts(c: &TestCluster) -> Vec<(u32, String, u32)> {
    let text = std::fs::read_to_string(c.work.join("steps.txt")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.get(1)?.parse().ok()?, f.get(2)?.to_string(), f.get(3)?.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_batch_jobs_step_moves_its_lost_nodes_task_to_the_spare_while_srun_waits() {
    let c = TestCluster::up(&["--nodes", "4", "--gpus", "h100:1"]);
    let leader = c.leader();
    std::fs::write(c.work.join("batch.sh"), BATCH.replace("LEADER", &leader)).expect("write the job");
    let out = c.shim("sbatch", &["--parsable", "batch.sh"], &[]);
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("a job id");
    wait_until("both tasks of the step to start", Duration::from_secs(30), || step_starts(&c).len() == 2);
    let job = c.job(id);
    let nodes: Vec<String> =
        job["nodes"].as_array().map(|a| a.iter().filter_map(|n| n.as_str().map(str::to_string)).collect()).unwrap_or_default();
    let spare = job["spares"][0].as_str().unwrap_or_default().to_string();
    let (script, worker) = (nodes[0].clone(), nodes[1].clone());
    // Tasks take their ranks in the order of the node list's names, not the job's ranks.
    let before = step_starts(&c);
    let (lost_rank, survivor_pid) = match (before.iter().find(|t| t.1 == worker), before.iter().find(|t| t.1 == script)) {
        (Some(w), Some(s)) => (w.0, s.2),
        _ => panic!("a task on {worker} and one on {script}: {before:?}"),
    };
    let kept_rank = 1 - lost_rank;

    // The worker's daemon dies: its watchdog fences its task, the leader moves its rank of the
    // job to the spare, and srun has the node that launched the step start the task there.
    let killed_ms = now_ms();
    c.signal(&worker, "KILL");
    wait_until("the task to start on the spare", Duration::from_secs(60), || step_starts(&c).iter().any(|t| t.1 == spare));
    eprintln!("the lost task of the step started on the spare {} ms after its node's corrald was SIGKILLed", now_ms() - killed_ms);
    let after = step_starts(&c);
    assert_eq!(after.iter().filter(|t| t.0 == kept_rank).count(), 1, "the other task never started again: {after:?}");
    assert_eq!(after.iter().find(|t| t.1 == spare).map(|t| t.0), Some(lost_rank), "the same rank: {after:?}");
    assert!(alive(survivor_pid), "the other task still runs");
    let steps = c.shim("sacct", &["-P", "-n", "-o", "JobID,NodeList,State", "-j", &id.to_string()], &[]);
    let steps = String::from_utf8_lossy(&steps.stdout).to_string();
    let mut both = [script.clone(), spare.clone()];
    both.sort();
    assert!(steps.lines().any(|l| l.starts_with(&format!("{id}.0|")) && l.contains("RUNNING")), "{steps}");
    assert!(!steps.lines().any(|l| l.starts_with(&format!("{id}.0|")) && l.contains(&worker)), "step 0 is on {both:?} now: {steps}");

    // Released, both tasks end well: srun waited for the moved one and exits 0.
    std::fs::write(c.work.join("release"), "").expect("release the tasks");
    let job = c.wait_final(id, Duration::from_secs(60));
    let output = std::fs::read_to_string(c.work.join(format!("slurm-{id}.out"))).unwrap_or_default();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{output}");
    for line in [format!("end {kept_rank} {script}"), format!("end {lost_rank} {spare}"), "srun=0".to_string()] {
        assert!(output.lines().any(|l| l == line), "{line:?} in\n{output}");
    }
    assert!(output.contains(&format!("{worker} was lost: its tasks of step {id}.0 run on {spare} now")), "{output}");
    let steps = c.shim("sacct", &["-P", "-n", "-o", "JobID,State,ExitCode", "-j", &id.to_string()], &[]);
    let steps = String::from_utf8_lossy(&steps.stdout).to_string();
    assert!(steps.lines().any(|l| l == format!("{id}.0|COMPLETED|0:0")), "{steps}");
}
