//! `scontrol hold/release/update/requeue`, partitions by `scontrol`, and `scancel --signal`
//! against a live cluster.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use corral_tests::{wait_until, TestCluster};

fn shim(c: &TestCluster, name: &str, args: &[&str]) -> Output {
    c.shim(name, args, &[])
}

/// The cluster's name, as `scontrol show config` gives it (`ClusterName`).
fn sacctmgr_cluster(c: &TestCluster) -> String {
    let config = String::from_utf8_lossy(&shim(c, "scontrol", &["show", "config"]).stdout).into_owned();
    let line = config.lines().find(|l| l.starts_with("ClusterName ")).unwrap_or_else(|| panic!("no ClusterName in {config}"));
    line.split(" = ").nth(1).unwrap_or_default().trim().to_string()
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
    // It left its checkpoint directory empty: gone with it (one per job would pile up for ever).
    assert!(!c.path().join("checkpoints").join(format!("job-{held}")).exists());

    // A CPU-only job holding all 64 CPUs makes the node `alloc`, with its GPU free.
    let cpus = c.submit(&["-c", "64"], &["sleep", "60"]);
    wait_until("the CPU job to run", Duration::from_secs(20), || c.job(cpus)["state"] == "RUNNING");
    let sinfo = shim(&c, "sinfo", &["-h", "-N", "-p", "default", "-o", "%N %t %G"]);
    assert_eq!(String::from_utf8_lossy(&sinfo.stdout), "n1 alloc gpu:h100:1\n");
    assert!(c.corral(&["cancel", &cpus.to_string()]).status.success());

    // Read by a pipe whose reader has gone (`squeue | head`): ended by SIGPIPE, no panic.
    for (program, args) in [("corral", vec!["--cluster", c.path_str(), "cluster"]), ("squeue", vec!["-t", "all"])] {
        let mut command = match program {
            "corral" => Command::new(corral_tests::corral_bin()),
            _ => Command::new(c.path().join("shims").join(program)),
        };
        let mut child = command
            .args(&args)
            .env("CORRAL_CLUSTER", c.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap_or_else(|e| panic!("wait for {program}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "{program} with its reader gone: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{program}: {stderr}");
    }

    // An admin drains and resumes a node the way Slurm's admins do.
    let out = shim(&c, "scontrol", &["update", "NodeName=n1", "State=DRAIN", "Reason=bad fan"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // (The jobs cancelled above may still be ending: drng until they have.)
    let state = || String::from_utf8_lossy(&shim(&c, "sinfo", &["-h", "-N", "-p", "default", "-o", "%N %t"]).stdout).into_owned();
    wait_until("n1 to be drained", Duration::from_secs(20), || state() == "n1 drain\n");
    let shown = String::from_utf8_lossy(&shim(&c, "scontrol", &["show", "node", "n1"]).stdout).into_owned();
    assert!(shown.contains("Reason=bad fan"), "{shown}");
    let out = shim(&c, "scontrol", &["update", "NodeName=n9", "State=DRAIN", "Reason=x"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Invalid node name specified for node n9"));
    let out = shim(&c, "scontrol", &["update", "NodeName=n1", "State=RESUME"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(state(), "n1 idle\n");
    // Every partition its node.toml names, as Slurm shows them.
    let shown = String::from_utf8_lossy(&shim(&c, "scontrol", &["show", "partition", "gpu"]).stdout).into_owned();
    assert!(shown.starts_with("PartitionName=gpu\n") && shown.contains("   Nodes=n1\n") && shown.contains("TRES=gres/gpu=1"), "{shown}");
    let shown = String::from_utf8_lossy(&shim(&c, "scontrol", &["show", "partition"]).stdout).into_owned();
    assert!(shown.contains("PartitionName=default\n") && shown.contains("PartitionName=gpu\n"), "{shown}");

    // ExitCode is code:signal: a job killed by SIGKILL is 0:9, one that exited 137 is 137:0 in
    // scontrol and 9:0 in sacct (its print.c takes 128 off an exit code of 128 or more).
    let killed = c.submit(&[], &["sh", "-c", "kill -9 $$"]);
    let exited = c.submit(&[], &["sh", "-c", "exit 137"]);
    for id in [killed, exited] {
        assert_eq!(c.wait_final(id, Duration::from_secs(20))["state"], "FAILED");
    }
    let sacct = shim(&c, "sacct", &["-X", "-P", "-n", "-j", &format!("{killed},{exited}"), "-o", "JobID,State,ExitCode"]);
    assert_eq!(String::from_utf8_lossy(&sacct.stdout), format!("{killed}|FAILED|0:9\n{exited}|FAILED|9:0\n"));
    let shown = String::from_utf8_lossy(&shim(&c, "scontrol", &["show", "job", &exited.to_string()]).stdout).into_owned();
    assert!(shown.contains("ExitCode=137:0"), "{shown}");
    let shown = String::from_utf8_lossy(&shim(&c, "scontrol", &["show", "job", &killed.to_string()]).stdout).into_owned();
    assert!(shown.contains("ExitCode=0:9"), "{shown}");
}

/// `scontrol requeue` as Slurm 22.05 answers it (checked on `../shared/peers/slurm`): finished
/// batch jobs run again with their restart count up, `requeuehold` holds them, and `srun` jobs,
/// `--no-requeue` jobs, pending and unknown jobs are refused in Slurm's words.
#[test]
fn scontrol_requeue_runs_finished_batch_jobs_again() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:1"]);
    let sbatch = |args: &[&str]| -> u64 {
        let out = shim(&c, "sbatch", args);
        assert!(out.status.success(), "sbatch {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|e| panic!("sbatch --parsable printed no id ({e})"))
    };
    let requeue = |verb: &str, id: u64| shim(&c, "scontrol", &[verb, &id.to_string()]);
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).trim().to_string();

    let done = sbatch(&["--parsable", "--wrap", "echo run ${SLURM_RESTART_COUNT:-0} >> runs.txt"]);
    let failed = sbatch(&["--parsable", "--wrap", "false"]);
    let pinned = sbatch(&["--parsable", "--no-requeue", "--wrap", "true"]);
    assert_eq!(c.wait_final(done, Duration::from_secs(30))["state"], "COMPLETED");
    assert_eq!(c.wait_final(failed, Duration::from_secs(30))["state"], "FAILED");
    assert_eq!(c.wait_final(pinned, Duration::from_secs(30))["state"], "COMPLETED");

    let out = requeue("requeue", done);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until("the requeued job to complete again", Duration::from_secs(30), || {
        let j = c.job(done);
        j["state"] == "COMPLETED" && j["restart_count"] == 1
    });
    assert_eq!(std::fs::read_to_string(c.work.join("runs.txt")).expect("runs.txt"), "run 0\nrun 1\n");

    let out = requeue("requeuehold", failed);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = c.job(failed);
    assert_eq!((job["state"].as_str(), job["restart_count"].as_u64()), (Some("PENDING"), Some(1)), "{job}");
    let shown = String::from_utf8_lossy(&shim(&c, "scontrol", &["show", "job", &failed.to_string()]).stdout).into_owned();
    assert!(shown.contains("JobState=PENDING Reason=JobHeldUser"), "{shown}");
    assert!(shown.contains("Restarts=1"), "{shown}");
    let out = requeue("requeue", failed);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), format!("Job is pending execution for job {failed}")));
    assert!(shim(&c, "scontrol", &["release", &failed.to_string()]).status.success());
    wait_until("the released job to fail again", Duration::from_secs(30), || {
        let j = c.job(failed);
        j["state"] == "FAILED" && j["restart_count"] == 1
    });

    let out = requeue("requeue", pinned);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), format!("Requested operation is presently disabled for job {pinned}")));

    let out = shim(&c, "srun", &["sh", "-c", "echo $SLURM_JOB_ID"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let interactive: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("srun printed its job id");
    c.wait_final(interactive, Duration::from_secs(30));
    let out = requeue("requeue", interactive);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), format!("Only batch jobs are accepted or processed for job {interactive}")));

    let out = requeue("requeue", 99_999);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), "Invalid job id specified for job 99999".to_string()));
}

/// `scontrol create|update|delete PartitionName=` through the log, with Slurm 22.05's answers
/// (checked on `../shared/peers/slurm`): `Nodes=` decides membership, DOWN keeps jobs pending as
/// `PartitionDown`, DRAIN refuses submissions, and a partition in use is not deleted.
#[test]
fn scontrol_creates_updates_and_deletes_partitions() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:1"]);
    let scontrol = |args: &[&str]| {
        let out = shim(&c, "scontrol", args);
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).trim().to_string())
    };
    let ok = |args: &[&str]| {
        let (code, _, err) = scontrol(args);
        assert_eq!(code, Some(0), "scontrol {args:?}: {err}");
    };

    ok(&["create", "PartitionName=short", "MaxTime=10", "DefaultTime=5", "PriorityTier=3"]);
    let (_, shown, _) = scontrol(&["show", "partition", "short"]);
    for field in ["PartitionName=short\n", "Default=NO", "DefaultTime=00:05:00", "MaxTime=00:10:00", "PriorityTier=3", "State=UP"] {
        assert!(shown.contains(field), "{field} in {shown}");
    }
    assert_eq!(scontrol(&["create", "PartitionName=gpu"]).2, "Error creating the partition: Invalid partition name specified");
    // Nodes= names the partition's nodes, whatever their node.toml says.
    assert_eq!(scontrol(&["update", "PartitionName=short", "Nodes=n[1,9]"]).2, "slurm_update error: Invalid node name specified");
    ok(&["create", "PartitionName=solo", "Nodes=n1"]);
    assert!(scontrol(&["show", "partition", "solo"]).1.contains("   Nodes=n1\n"));
    assert!(scontrol(&["show", "node", "n1"]).1.contains("solo"));
    let out = shim(&c, "sbatch", &["--parsable", "-p", "solo", "--wrap", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let solo: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("job id");
    assert_eq!(c.wait_final(solo, Duration::from_secs(30))["state"], "COMPLETED");
    ok(&["delete", "PartitionName=solo"]);
    assert!(!scontrol(&["show", "node", "n1"]).1.contains("solo"));
    let (code, _, err) = scontrol(&["update", "PartitionName=gpu", "State=BOGUS"]);
    assert!(code == Some(1) && err.contains("Acceptable State values are UP, DOWN, DRAIN and INACTIVE"), "{err}");

    // DOWN: taken, not started, Slurm's reason; UP again: it runs.
    ok(&["update", "PartitionName=gpu", "State=DOWN"]);
    let out = shim(&c, "sbatch", &["--parsable", "-p", "gpu", "--wrap", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let reason = || String::from_utf8_lossy(&shim(&c, "squeue", &["-h", "-j", &id, "-o", "%T %r"]).stdout).trim().to_string();
    wait_until("the job to pend as PartitionDown", Duration::from_secs(20), || reason() == "PENDING PartitionDown");
    let avail = String::from_utf8_lossy(&shim(&c, "sinfo", &["-h", "-p", "gpu", "-o", "%P %a"]).stdout).into_owned();
    assert_eq!(avail, "gpu down\n");
    assert!(scontrol(&["show", "partition", "gpu"]).1.contains("State=DOWN"));
    ok(&["update", "PartitionName=gpu", "State=UP"]);
    assert_eq!(c.wait_final(id.parse().expect("job id"), Duration::from_secs(30))["state"], "COMPLETED");

    // DRAIN and INACTIVE refuse submissions.
    for state in ["DRAIN", "INACTIVE"] {
        ok(&["update", "PartitionName=gpu", &format!("State={state}")]);
        let out = shim(&c, "sbatch", &["-p", "gpu", "--wrap", "true"]);
        assert_eq!(
            (out.status.code(), String::from_utf8_lossy(&out.stderr).trim()),
            (Some(1), "sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)"),
            "{state}"
        );
    }
    ok(&["update", "PartitionName=gpu", "State=UP"]);

    // Default=YES moves the default; a pending job keeps its partition in use.
    ok(&["update", "PartitionName=short", "Default=YES"]);
    assert!(scontrol(&["show", "partition", "short"]).1.contains("Default=YES"));
    let sinfo = String::from_utf8_lossy(&shim(&c, "sinfo", &["-h", "-o", "%P"]).stdout).into_owned();
    // The default moved to short, which has no node: its row is sinfo's `0 n/a`.
    assert_eq!(sinfo, "default\ngpu\nshort*\n");
    let row = String::from_utf8_lossy(&shim(&c, "sinfo", &["-h", "-p", "short"]).stdout).into_owned();
    assert_eq!(row, "short*       up      10:00      0    n/a \n");
    let out = shim(&c, "sbatch", &["--parsable", "--hold", "--wrap", "true"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let held = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Its time limit is the partition's DefaultTime at submit, kept when that changes (as the
    // peer showed: TimeLimit=00:05:00 both times).
    ok(&["update", "PartitionName=short", "DefaultTime=7"]);
    assert!(scontrol(&["show", "job", &held]).1.contains(" TimeLimit=00:05:00 "), "{}", scontrol(&["show", "job", &held]).1);
    assert_eq!(scontrol(&["delete", "PartitionName=short"]).2, "delete_partition PartitionName=short: Partition is in use");
    // As in Slurm, a job that named no partition has the default of its submission: it stays in
    // short when the default moves back.
    ok(&["update", "PartitionName=gpu", "Default=YES"]);
    let partition = String::from_utf8_lossy(&shim(&c, "squeue", &["-h", "-j", &held, "-o", "%P"]).stdout).into_owned();
    assert_eq!(partition.trim(), "short");
    assert_eq!(scontrol(&["delete", "PartitionName=short"]).2, "delete_partition PartitionName=short: Partition is in use");
    assert!(c.corral(&["cancel", &held]).status.success());
    ok(&["delete", "PartitionName=short"]);
    assert_eq!(scontrol(&["delete", "PartitionName=short"]).2, "delete_partition PartitionName=short: Invalid partition name specified");
}

#[test]
fn sbatch_test_only_says_when_and_where_without_submitting() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:8"]);
    let out = shim(&c, "sbatch", &["--test-only", "--gres=gpu:h100:2", "-c", "4", "--wrap", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.starts_with("sbatch: Job 1 to start at ")
            && stderr.trim_end().ends_with(" using 4 processors on nodes n1 in partition default"),
        "{stderr}"
    );
    let out = shim(&c, "sbatch", &["--test-only", "--gres=gpu:h100:16", "--wrap", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .starts_with("sbatch: error: Batch job submission failed: Requested node configuration is not available"));
    // Submitted for real, as Slurm does: refused, with what the largest node has.
    for (args, needs) in [
        (&["--gres=gpu:h100:16"][..], "Requested node configuration is not available: needs 1 node(s) with 16x gpu:h100"),
        (&["-N", "2", "--gres=gpu:1"][..], "Node count specification invalid: needs 2 nodes"),
    ] {
        let out = shim(&c, "sbatch", &[args, &["--wrap", "true"]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.starts_with(&format!("sbatch: error: Batch job submission failed: {needs}"))
                && stderr.contains("; partition default has "),
            "{stderr}"
        );
    }
    let squeue = shim(&c, "squeue", &["-h"]);
    assert_eq!(String::from_utf8_lossy(&squeue.stdout), "", "nothing was submitted");
    // Every GPU busy for at most 5 minutes: the job would start when that ends, on n1.
    let blocker = c.submit(&["--gres", "gpu:8", "--time", "5"], &["sleep", "300"]);
    assert_eq!(blocker, 1, "the test-only jobs took no id");
    wait_until("the blocker to run", Duration::from_secs(20), || c.job(blocker)["state"] == "RUNNING");
    let out = shim(&c, "sbatch", &["--test-only", "--gres=gpu:h100:8", "--wrap", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let start = c.job(blocker)["start_time"].as_u64().expect("start time");
    let at = stderr.split(" to start at ").nth(1).and_then(|r| r.split(' ').next()).expect("a start time");
    let expected = chrono_free_local(start + 300_000);
    assert!(at == expected.0 || at == expected.1, "starts when the blocker's 5 minutes end ({expected:?}): {stderr}");
    assert!(stderr.contains("on nodes n1"), "{stderr}");
}

/// `start_ms` in Slurm's local `YYYY-MM-DDTHH:MM:SS`, and one second later (the reservation
/// may round up), as `date` prints them.
fn chrono_free_local(start_ms: u64) -> (String, String) {
    let fmt = |ms: u64| {
        let out =
            std::process::Command::new("date").args(["-d", &format!("@{}", ms / 1000), "+%Y-%m-%dT%H:%M:%S"]).output().expect("run date");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    (fmt(start_ms), fmt(start_ms + 1000))
}

/// `--nice` lowers a job's priority, as in Slurm (`squeue %y` shows it; a bare `--nice` is
/// 100): of two jobs waiting for one GPU, the niced one submitted first starts second.
#[test]
fn nice_puts_a_job_behind_one_submitted_after_it() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:1"]);
    let blocker = c.submit(&["--gres", "gpu:1"], &["sleep", "3"]);
    wait_until("the blocker to run", Duration::from_secs(20), || c.job(blocker)["state"] == "RUNNING");
    let sbatch = |args: &[&str]| -> String {
        let out = shim(&c, "sbatch", args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let niced = sbatch(&["--parsable", "--gres=gpu:1", "--nice", "--wrap", "sleep 1"]);
    let plain = sbatch(&["--parsable", "--gres=gpu:1", "--wrap", "sleep 1"]);
    let shown = String::from_utf8_lossy(&shim(&c, "squeue", &["-h", "-j", &format!("{niced},{plain}"), "-o", "%i %y"]).stdout).into_owned();
    let mut rows: Vec<&str> = shown.lines().collect();
    rows.sort();
    assert_eq!(rows, [format!("{niced} 100"), format!("{plain} 0")]);
    let start = |id: &str| c.wait_final(id.parse().expect("job id"), Duration::from_secs(40))["start_time"].as_u64().expect("started");
    let (niced_start, plain_start) = (start(&niced), start(&plain));
    assert!(plain_start < niced_start, "the plain job first: {plain_start} vs {niced_start}");
}

/// `scontrol suspend|resume` of a 2-node batch job, with Slurm 22.05's answers (checked on
/// `../shared/peers/slurm`): every task on both nodes really stops (state `T`) and its output
/// stops growing, the job shows `S`/`SUSPENDED` and keeps its GPUs, the time it was suspended
/// does not count against its time limit, and once resumed it finishes. A suspended job that is
/// cancelled ends at once (its processes are continued to take the SIGTERM).
#[test]
fn scontrol_suspend_stops_every_task_of_a_two_node_job_and_resume_lets_it_finish() {
    let c = TestCluster::up(&["--nodes", "2", "--voters-max", "1", "--gpus", "h100:1"]);
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).trim().to_string();
    let scontrol = |verb: &str, id: u64| shim(&c, "scontrol", &[verb, &id.to_string()]);
    // 30 ticks of 0.2 s on each node (about 6 s of work), under a 15 s limit.
    let marker = format!("suspendtick{}", std::process::id());
    let script = format!(
        "#!/bin/sh\nsrun -N2 -n2 sh -c 'i=0; while [ $i -lt 30 ]; do echo $i >> {marker}.$SLURM_PROCID; i=$((i+1)); sleep 0.2; done'\n"
    );
    std::fs::write(c.work.join("ticks.sh"), script).expect("write the job script");
    let out = shim(&c, "sbatch", &["--parsable", "-N2", "--gres=gpu:1", "--time=0:15", "ticks.sh"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch --parsable printed the id");
    let ticks = |rank: u32| std::fs::read_to_string(c.work.join(format!("{marker}.{rank}"))).map_or(0, |t| t.lines().count());
    wait_until("both tasks to tick", Duration::from_secs(30), || ticks(0) >= 3 && ticks(1) >= 3);

    let out = scontrol("resume", job);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), format!("Job is not suspended for job {job}")));
    let out = scontrol("suspend", job);
    assert!(out.status.success(), "{}", stderr(&out));
    // Every process of the step (the loops and their sleeps, on both nodes) stopped.
    let states = || -> Vec<String> {
        let ps = Command::new("ps").args(["-eo", "stat=,args="]).output().expect("run ps");
        String::from_utf8_lossy(&ps.stdout).lines().filter(|l| l.contains(&marker) && !l.contains("ps -eo")).map(str::to_string).collect()
    };
    wait_until("every task to stop", Duration::from_secs(10), || {
        let s = states();
        s.len() >= 2 && s.iter().all(|l| l.starts_with('T'))
    });
    let (t0, t1) = (ticks(0), ticks(1));
    let shown = String::from_utf8_lossy(&shim(&c, "squeue", &["-h", "-t", "S", "-o", "%i %t %T"]).stdout).into_owned();
    assert_eq!(shown, format!("{job} S SUSPENDED\n"));
    assert_eq!(String::from_utf8_lossy(&shim(&c, "squeue", &["-h", "-t", "R"]).stdout), "", "a suspended job is not R");
    let shown = String::from_utf8_lossy(&scontrol_show(&c, job)).into_owned();
    assert!(shown.contains("JobState=SUSPENDED Reason=None"), "{shown}");
    assert!(!shown.contains("SuspendTime=None"), "{shown}");
    // A second suspend is answered as Slurm answers it: nothing changes, no error.
    assert!(scontrol("suspend", job).status.success());
    // Held for longer than its limit leaves it: 16 s, its run paused all along.
    std::thread::sleep(Duration::from_secs(16));
    assert_eq!((ticks(0), ticks(1)), (t0, t1), "a suspended task wrote output");
    assert_eq!(c.job(job)["state"], "SUSPENDED");
    let sinfo = shim(&c, "sinfo", &["-h", "-N", "-p", "default", "-o", "%N %t"]);
    assert_eq!(String::from_utf8_lossy(&sinfo.stdout), "n1 alloc\nn2 alloc\n", "its GPUs stay held");

    let out = scontrol("resume", job);
    assert!(out.status.success(), "{}", stderr(&out));
    let end = c.wait_final(job, Duration::from_secs(60));
    assert_eq!(end["state"], "COMPLETED", "{end}");
    assert_eq!((ticks(0), ticks(1)), (30, 30));
    // It ran past its 15 s limit on the clock, and within it less its suspension.
    let (start, finish) = (end["start_time"].as_u64().unwrap_or(0), end["end_time"].as_u64().unwrap_or(0));
    assert_eq!(end["time_limit_ms"], 15_000);
    assert!(finish.saturating_sub(start) > 16_000, "{end}");
    assert!(end["suspended_ms"].as_u64().is_some_and(|ms| ms >= 16_000), "{end}");
    let out = scontrol("suspend", job);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), format!("Job/step already completing or completed for job {job}")));

    // Suspended, then cancelled: it ends without waiting for its time limit.
    let held = c.submit(&["--gres", "gpu:1", "--time", "10"], &["sleep", "300"]);
    wait_until("the sleeper to run", Duration::from_secs(20), || c.job(held)["state"] == "RUNNING");
    assert!(scontrol("suspend", held).status.success());
    wait_until("the sleeper to show suspended", Duration::from_secs(10), || c.job(held)["state"] == "SUSPENDED");
    assert!(c.corral(&["cancel", &held.to_string()]).status.success());
    assert_eq!(c.wait_final(held, Duration::from_secs(20))["state"], "CANCELLED");
    let out = shim(&c, "sbatch", &["--parsable", "--hold", "--wrap", "true"]);
    let pending: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch --parsable printed the id");
    let out = scontrol("suspend", pending);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), format!("Job is pending execution for job {pending}")));
    let out = scontrol("suspend", 99_999);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), "Invalid job id specified for job 99999".to_string()));

    // `scontrol show config` in Slurm 22.05's layout (checked on ../shared/peers/slurm), with
    // the cluster's own values: its one voter is the primary controller.
    let out = shim(&c, "scontrol", &["show", "config"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("Configuration data as of 20"), "{text}");
    let leader = c.leader();
    for want in [
        "SLURM_VERSION           = 22.05.8".to_string(),
        "SelectType              = select/cons_tres".to_string(),
        "SchedulerType           = sched/backfill".to_string(),
        format!("SlurmctldHost[0]        = {leader}(127.0.0.1)"),
    ] {
        assert!(lines.contains(&want.as_str()), "no {want:?} in\n{text}");
    }
    let value = |key: &str| lines.iter().find_map(|l| l.strip_prefix(&format!("{key:<23} = "))).unwrap_or_default().to_string();
    assert!(!value("ClusterName").is_empty(), "{text}");
    assert!(value("MinJobAge").strip_suffix(" sec").is_some_and(|s| s.parse::<u64>().is_ok()), "{text}");
    assert!(value("SlurmdTimeout").ends_with(" sec"), "{text}");
    assert_eq!(lines.last().copied(), Some(format!("Slurmctld(primary) at {leader} is UP").as_str()), "{text}");
}

fn scontrol_show(c: &TestCluster, job: u64) -> Vec<u8> {
    shim(c, "scontrol", &["show", "job", &job.to_string()]).stdout
}

/// A suspended job's node keeps it stopped while the leader that suspended it is killed; the
/// new leader, which knows no node's acknowledgement, tells the node again, and resumes it
/// when asked: it finishes its work once, on its node, never restarted.
#[test]
fn a_suspended_job_stays_stopped_through_a_leader_kill_and_the_new_leader_resumes_it() {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:1"]);
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).trim().to_string();
    let leader = c.leader();
    let node = ["n1", "n2", "n3"].into_iter().find(|n| *n != leader).expect("a node that does not lead");
    let marker = format!("failovertick{}", std::process::id());
    // Run by a shell whose arguments name the marker, so `ps` finds it.
    let wrap = format!("sh -c 'i=0; while [ $i -lt 30 ]; do echo $i >> {marker}; i=$((i+1)); sleep 0.2; done'");
    let out = shim(&c, "sbatch", &["--parsable", "-w", node, "--wrap", &wrap]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch --parsable printed the id");
    let ticks = || std::fs::read_to_string(c.work.join(&marker)).map_or(0, |t| t.lines().count());
    let stopped = || {
        let ps = Command::new("ps").args(["-eo", "stat=,args="]).output().expect("run ps");
        let text = String::from_utf8_lossy(&ps.stdout).into_owned();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(&marker) && !l.contains("ps -eo")).collect();
        !lines.is_empty() && lines.iter().all(|l| l.starts_with('T'))
    };
    wait_until("the job to tick", Duration::from_secs(30), || ticks() >= 3);
    let out = shim(&c, "scontrol", &["suspend", &job.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_until("the job to stop", Duration::from_secs(10), stopped);
    let before = ticks();

    c.signal(&leader, "KILL");
    let addr = c.addr(node);
    wait_until("a new leader", Duration::from_secs(20), || {
        let out = c.corral(&["--server", &addr, "--json", "cluster"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        out.status.success() && v["leader"].as_str().is_some_and(|l| !l.is_empty() && l != leader)
    });
    let shown = c.json(&["--server", &addr, "show", &job.to_string()]);
    assert_eq!(shown["state"], "SUSPENDED", "{shown}");
    assert!(stopped(), "the job went on without a resume");
    assert_eq!(ticks(), before);

    let out = shim(&c, "scontrol", &["resume", &job.to_string()]);
    assert!(out.status.success(), "{}\n{}", stderr(&out), c.logs());
    let end = c.wait_final(job, Duration::from_secs(60));
    assert_eq!(
        (end["state"].as_str(), end["restart_count"].as_u64(), end["node"].as_str()),
        (Some("COMPLETED"), Some(0), Some(node)),
        "{end}"
    );
    assert_eq!(ticks(), 30, "the work ran once, whole");
}

/// Accounts through `sacctmgr` (Slurm's words and `-n -P` output; the Slurm peer has no slurmdbd
/// to compare with): once a user has an association, a submission to another account is
/// refused, a job with no `--account` is charged to the default account, `MaxJobs=1`, then
/// `GrpTRES=gres/gpu=1`, then `GrpJobs=1`, then `GrpTRES=cpu=1` keep a second job pending with
/// Slurm's reason until the first ends.
#[test]
fn sacctmgr_accounts_and_limits_hold_jobs_with_slurms_reasons() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:2"]);
    let probe = c.submit(&[], &["true"]);
    let user = c.wait_final(probe, Duration::from_secs(30))["user"].as_str().expect("a job has a user").to_string();
    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).trim().to_string();
    let sacctmgr = |args: &[&str]| {
        let out = shim(&c, "sacctmgr", args);
        assert!(out.status.success(), "sacctmgr {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    sacctmgr(&["-i", "add", "account", "phys", "Description=Physics"]);
    sacctmgr(&["-i", "add", "account", "chem"]);
    sacctmgr(&["-i", "add", "user", &user, "Account=phys"]);
    // Without -i and with nothing on stdin, nothing is committed.
    let out = sacctmgr(&["add", "account", "bio"]);
    assert!(out.ends_with("(N/y): \n Changes Discarded\n"), "{out}");

    let out = shim(&c, "sbatch", &["--account=chem", "--wrap", "true"]);
    assert_eq!(
        (out.status.code(), stderr(&out)),
        (Some(1), "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified".to_string())
    );
    let sbatch = |args: &[&str]| -> u64 {
        let out = shim(&c, "sbatch", args);
        assert!(out.status.success(), "sbatch {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|e| panic!("sbatch --parsable printed no id ({e})"))
    };
    let state =
        |id: u64| String::from_utf8_lossy(&shim(&c, "squeue", &["-h", "-j", &id.to_string(), "-o", "%T %r %a"]).stdout).trim().to_string();
    // One job pending behind another by a limit, running once the first is cancelled.
    let held_by = |set: &[&str], reason: &str, job: &[&str]| {
        let mut args = vec!["-i", "modify", "user", "where"];
        let name = format!("name={user}");
        args.extend([name.as_str(), "set"]);
        args.extend_from_slice(set);
        sacctmgr(&args);
        let mut submit = vec!["--parsable"];
        submit.extend_from_slice(job);
        submit.extend(["--wrap", "sleep 60"]);
        let first = sbatch(&submit);
        let second = sbatch(&submit);
        wait_until("the first job to run", Duration::from_secs(30), || state(first).starts_with("RUNNING"));
        wait_until(&format!("the second job to wait for {reason}"), Duration::from_secs(30), || {
            state(second) == format!("PENDING {reason} phys")
        });
        assert!(shim(&c, "scancel", &[&first.to_string()]).status.success());
        wait_until("the second job to run once the first ended", Duration::from_secs(30), || state(second).starts_with("RUNNING"));
        assert!(shim(&c, "scancel", &[&second.to_string()]).status.success());
    };
    // No --account: the user's default account, phys.
    held_by(&["MaxJobs=1"], "AssocMaxJobsLimit", &[]);
    held_by(&["MaxJobs=-1", "GrpTRES=gres/gpu=1"], "AssocGrpGRES", &["--gres=gpu:1"]);
    held_by(&["GrpTRES=gres/gpu=-1", "GrpJobs=1"], "AssocGrpJobsLimit", &[]);
    held_by(&["GrpJobs=-1", "GrpTRES=cpu=1"], "AssocGrpCpuLimit", &[]);

    let out = shim(&c, "sacctmgr", &["-i", "delete", "account", "phys"]);
    assert_eq!((out.status.code(), stderr(&out)), (Some(1), format!("Account 'phys' has users ({user}): delete their associations first")));
    let config = String::from_utf8_lossy(&shim(&c, "scontrol", &["show", "config"]).stdout).into_owned();
    let cluster = config.lines().find_map(|l| l.strip_prefix("ClusterName")).and_then(|l| l.split('=').nth(1)).expect("ClusterName").trim();
    assert_eq!(
        sacctmgr(&["-n", "-P", "show", "assoc"]),
        format!(
            "{cluster}|root|||1|||||||||||||normal||\n\
             {cluster}|chem|||1|||||||||||||normal||\n\
             {cluster}|phys|||1|||||||||||||normal||\n\
             {cluster}|phys|{user}||1|||cpu=1||||||||||normal||\n"
        )
    );
}

/// Fair share by shares (issue 19): one user in two accounts, `phys` with 1 share and `chem`
/// with 9, uses the same GPU time in each; `sshare` shows the shares, the usage and Fair Tree's
/// factors (the association in the under-served `chem` ranks first), `sprio` shows them weighted,
/// and of two jobs waiting for the same GPUs the `chem` one starts first though submitted
/// second. `scontrol show config` shows the replicated half-life, and a policy changes it.
#[test]
fn fair_share_ranks_associations_by_shares_and_usage_in_sshare_sprio_and_the_queue() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:2"]);
    let probe = c.submit(&[], &["true"]);
    let user = c.wait_final(probe, Duration::from_secs(30))["user"].as_str().expect("a job has a user").to_string();
    let run = |name: &str, args: &[&str]| {
        let out = shim(&c, name, args);
        assert!(out.status.success(), "{name} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    run("sacctmgr", &["-i", "add", "account", "phys", "Fairshare=1"]);
    run("sacctmgr", &["-i", "add", "account", "chem", "Fairshare=9"]);
    run("sacctmgr", &["-i", "add", "user", &user, "Account=phys,chem"]);
    let sbatch = |args: &[&str]| -> u64 {
        let mut all = vec!["--parsable"];
        all.extend_from_slice(args);
        run("sbatch", &all).trim().parse().expect("sbatch --parsable prints the id")
    };
    // The same GPU time in each account: both GPUs for 3 s.
    for account in ["phys", "chem"] {
        let job = sbatch(&[&format!("--account={account}"), "--gres=gpu:2", "--wrap", "sleep 3"]);
        assert_eq!(c.wait_final(job, Duration::from_secs(60))["state"], "COMPLETED");
    }
    let shares = run("sshare", &["-a", "-n", "-P"]);
    let rows: Vec<Vec<&str>> = shares.lines().map(|l| l.split('|').collect()).collect();
    let names: Vec<(&str, &str, &str, &str)> = rows.iter().map(|r| (r[0], r[1], r[2], r[3])).collect();
    assert_eq!(
        names,
        vec![
            ("root", "", "", "1.000000"),
            ("chem", "", "9", "0.900000"),
            ("chem", user.as_str(), "1", "1.000000"),
            ("phys", "", "1", "0.100000"),
            ("phys", user.as_str(), "1", "1.000000"),
        ],
        "{shares}"
    );
    let usage = |row: usize| rows[row][4].parse::<u64>().unwrap_or_else(|e| panic!("RawUsage of {:?}: {e}", rows[row]));
    // 6 GPU-seconds each, and more on a loaded host where a run's end is reported late.
    assert!((5..=30).contains(&usage(2)) && (5..=30).contains(&usage(4)), "about 6 GPU-seconds each:\n{shares}");
    assert_eq!(usage(0), usage(1) + usage(3), "root holds everything:\n{shares}");
    assert_eq!((rows[2][6], rows[4][6]), ("1.000000", "0.500000"), "FairShare of the chem and phys associations:\n{shares}");

    // Both GPUs held; then a phys job and a chem job wait for them.
    let blocker = sbatch(&["--account=phys", "--gres=gpu:2", "--wrap", "sleep 120"]);
    let phys = sbatch(&["--account=phys", "--gres=gpu:2", "--wrap", "sleep 120"]);
    let chem = sbatch(&["--account=chem", "--gres=gpu:2", "--wrap", "sleep 120"]);
    let state = |id: u64| run("squeue", &["-h", "-j", &id.to_string(), "-o", "%T"]).trim().to_string();
    wait_until("the blocker to run", Duration::from_secs(30), || state(blocker) == "RUNNING");
    let prio = run("sprio", &["-h", "-l"]);
    let fairshare: Vec<(u64, String)> = prio
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].parse().expect("job id"), w[6].to_string())
        })
        .collect();
    assert_eq!(fairshare, vec![(phys, "5000".to_string()), (chem, "10000".to_string())], "{prio}");
    let out = shim(&c, "sprio", &["-j", &blocker.to_string()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "Unable to find jobs matching user/id(s) specified");
    run("scancel", &[&blocker.to_string()]);
    wait_until("the chem job to start first", Duration::from_secs(30), || state(chem) == "RUNNING");
    assert_eq!(state(phys), "PENDING");
    run("scancel", &[&phys.to_string(), &chem.to_string()]);

    let half_life = || {
        let config = run("scontrol", &["show", "config"]);
        let line = config.lines().find(|l| l.starts_with("PriorityDecayHalfLife")).map(str::to_string);
        line.and_then(|l| l.split('=').nth(1).map(|v| v.trim().to_string())).expect("PriorityDecayHalfLife")
    };
    assert_eq!(half_life(), "7-00:00:00");
    let policy = c.work.join("policy.toml");
    std::fs::write(&policy, "priority_decay_half_life_min = 90\n").expect("write policy");
    let out = c.corral(&["policy", "set", policy.to_str().expect("path")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(half_life(), "01:30:00");
}

/// `squeue --json` and `sinfo --json` through the shims print the cluster's jobs and nodes in
/// Slurm 22.05's openapi/v0.0.38 shape (its keys and types are checked against the peer's output
/// in the cli's unit tests); as Slurm's, they ignore the other options and show every job the
/// cluster still holds, ended ones too.
#[test]
fn squeue_and_sinfo_print_slurms_json() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:2"]);
    let sbatch = |args: &[&str]| -> u64 {
        let out = shim(&c, "sbatch", args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch --parsable printed a job id")
    };
    let done = sbatch(&["--parsable", "-J", "three", "--wrap", "exit 3"]);
    c.wait_final(done, Duration::from_secs(30));
    let running = sbatch(&["--parsable", "-J", "gpus", "--gres=gpu:h100:2", "-t", "10", "--wrap", "sleep 300"]);
    wait_until("the GPU job to run", Duration::from_secs(30), || c.job(running)["state"] == "RUNNING");
    let held = sbatch(&["--parsable", "-J", "held", "-H", "--wrap", "true"]);
    let json = |name: &str, args: &[&str]| -> serde_json::Value {
        let out = shim(&c, name, args);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{name} printed no JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
    };
    let queue = json("squeue", &["--json", "-u", "nobody"]);
    assert_eq!(queue["meta"]["plugin"]["type"], "openapi/v0.0.38", "{queue}");
    let jobs = queue["jobs"].as_array().unwrap_or_else(|| panic!("{queue}"));
    let by_id = |id: u64| jobs.iter().find(|j| j["job_id"] == id).unwrap_or_else(|| panic!("no job {id} in {queue}"));
    let (r, h, d) = (by_id(running), by_id(held), by_id(done));
    assert_eq!(
        (&r["job_state"], &r["nodes"], &r["gres_detail"][0], &r["time_limit"]),
        (&"RUNNING".into(), &"n1".into(), &"gpu:h100:2(IDX:0-1)".into(), &10.into()),
        "{r}"
    );
    assert_eq!((&h["job_state"], &h["state_reason"], &h["name"]), (&"PENDING".into(), &"JobHeldUser".into(), &"held".into()), "{h}");
    assert_eq!((&d["job_state"], &d["exit_code"], &d["state_reason"]), (&"FAILED".into(), &768.into(), &"NonZeroExitCode".into()), "{d}");
    let nodes = json("sinfo", &["--json", "-n", "nosuch"]);
    let n = &nodes["nodes"][0];
    assert_eq!(
        (&n["name"], &n["state"], &n["gres"], &n["gres_used"]),
        (&"n1".into(), &"allocated".into(), &"gpu:h100:2".into(), &"gpu:h100:2".into()),
        "{nodes}"
    );
    c.corral(&["cancel", &running.to_string()]);
}

/// A site's provisioning script of the usual shape (issue 45) runs unchanged through the shims:
/// QoS with `MaxWall` and `MaxTRESPerUser`, accounts with descriptions and `GrpTRES`, the user
/// in two accounts with QoS lists and a `DefaultQOS`, every limit given to `add` (keys in any
/// case); run again, it adds nothing and still succeeds. Then a job with no `--qos` gets its
/// association's default QoS, the second such job waits with Slurm's `QOSMaxGRESPerUser` and
/// starts when the first ends, a QoS outside the user's list is refused in Slurm's words, and in
/// the account allowing one QoS a job gets it, and its `MaxWall` as time limit. The script's
/// partition for one account and its maintenance window in ten days hold a job of another
/// account, and one that would still run then, each with Slurm's words.
#[test]
fn a_provisioning_script_runs_unchanged_and_its_qos_limits_hold_jobs() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:2"]);
    let probe = c.submit(&[], &["true"]);
    let user = c.wait_final(probe, Duration::from_secs(30))["user"].as_str().expect("a job has a user").to_string();
    let script = c.work.join("provision.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nset -e\n\
         sacctmgr -i add qos name=short maxwall=1\n\
         sacctmgr -i add qos name=gpucap MaxTRESPerUser=gres/gpu=1 MaxWall=8:00:00 Priority=10\n\
         sacctmgr -i add account name=physics description=\"Physics Department\" organization=sciences grptres=cpu=16\n\
         sacctmgr -i add account name=chem Description=Chemistry Organization=sciences Fairshare=2\n\
         sacctmgr -i add user name=$SITE_USER account=physics qos=normal,gpucap defaultqos=gpucap MaxJobs=4\n\
         sacctmgr -i add user name=$SITE_USER account=chem QOS=short\n\
         scontrol show partition physonly >/dev/null 2>&1 || scontrol create PartitionName=physonly Nodes=n1 AllowAccounts=physics\n\
         scontrol show reservation maint >/dev/null 2>&1 ||\n\
           scontrol create reservation ReservationName=maint StartTime=now+10days Duration=4:00:00 Nodes=n1 Users=root Flags=MAINT\n",
    )
    .expect("write the script");
    let provision = || {
        let shims = c.path().join("shims");
        // (Running a shim once installs them.)
        shim(&c, "sacctmgr", &["-V"]);
        Command::new("sh")
            .arg(&script)
            .env("PATH", format!("{}:{}", shims.display(), std::env::var("PATH").unwrap_or_default()))
            .env("CORRAL_CLUSTER", c.path())
            .env("SITE_USER", &user)
            .current_dir(&c.work)
            .output()
            .expect("run the script")
    };
    let out = provision();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // What Slurm 22.05.8 with slurmdbd printed for the sacctmgr lines (the peer, user salice,
    // cluster peer): the same, line for line, with this cluster's names in its padded fields.
    let cluster = sacctmgr_cluster(&c);
    let ours = stdout
        .replace(&format!(" Adding User(s)\n  {user}\n"), " Adding User(s)\n  salice\n")
        .replace(&format!("U = {user:<9.9} "), "U = salice    ")
        .replace(&format!("C = {cluster:<10.10}"), "C = peer      ");
    let slurm = include_str!("../fixtures/slurm_sacctmgr/provision_first_run.out");
    assert_eq!(ours.strip_suffix("Reservation created: maint\n"), Some(slurm), "ours:\n{ours}\nSlurm's:\n{slurm}");
    // Run again, Slurm's sacctmgr adds nothing and exits 1 at once, which stops a `set -e`
    // script at its first line (the peer did the same).
    let again = provision();
    assert_eq!((again.status.code(), String::from_utf8_lossy(&again.stdout).as_ref()), (Some(1), " Nothing new added.\n"));

    let sacctmgr = |args: &[&str]| String::from_utf8_lossy(&shim(&c, "sacctmgr", args).stdout).into_owned();
    assert_eq!(
        sacctmgr(&["-nP", "show", "qos", "format=Name,Priority,MaxWall,MaxTRESPU"]),
        "normal|0||\nshort|0|00:01:00|\ngpucap|10|08:00:00|gres/gpu=1\n"
    );
    assert_eq!(
        sacctmgr(&["-nP", "show", "assoc", "where", &format!("user={user}"), "format=Account,MaxJobs,QOS,DefaultQOS"]),
        "chem||short|\nphysics|4|gpucap,normal|gpucap\n"
    );
    assert_eq!(sacctmgr(&["-nP", "show", "account", "where", "name=physics"]), "physics|physics department|sciences\n");

    let stderr = |out: &Output| String::from_utf8_lossy(&out.stderr).trim().to_string();
    let sbatch = |args: &[&str]| -> u64 {
        let mut all = vec!["--parsable"];
        all.extend_from_slice(args);
        let out = shim(&c, "sbatch", &all);
        assert!(out.status.success(), "sbatch {args:?}: {}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|e| panic!("sbatch --parsable printed no id ({e})"))
    };
    let state = |id: u64| {
        let out = shim(&c, "squeue", &["-h", "-j", &id.to_string(), "-o", "%T %r %a %q %l"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // No --qos: the default QoS of the user's default account; one GPU each at most.
    let first = sbatch(&["--gres=gpu:1", "--wrap", "sleep 120"]);
    let second = sbatch(&["--gres=gpu:1", "--wrap", "sleep 120"]);
    wait_until("the first job to run", Duration::from_secs(30), || state(first).starts_with("RUNNING"));
    wait_until("the second to wait for MaxTRESPerUser", Duration::from_secs(30), || {
        state(second) == "PENDING QOSMaxGRESPerUser physics gpucap 8:00:00"
    });
    assert!(shim(&c, "scancel", &[&first.to_string()]).status.success());
    wait_until("the second job to run once the first ended", Duration::from_secs(30), || state(second).starts_with("RUNNING"));
    // A QoS outside the user's list of physics.
    let out = shim(&c, "sbatch", &["--qos=short", "--wrap", "true"]);
    assert_eq!(
        (out.status.code(), stderr(&out)),
        (Some(1), "sbatch: error: Batch job submission failed: Invalid qos specification".to_string())
    );
    // chem allows one QoS: a job naming none gets it, and its MaxWall of one minute.
    let chem = sbatch(&["-A", "chem", "--wrap", "sleep 30"]);
    wait_until("the chem job to run", Duration::from_secs(30), || state(chem) == "RUNNING None chem short 1:00");
    assert!(shim(&c, "scancel", &[&second.to_string(), &chem.to_string()]).status.success());

    // The script's partition takes physics alone; its maintenance window holds what would
    // still run in ten days. Each waits with what Slurm prints there.
    assert!(stdout.ends_with("Reservation created: maint\n"), "{stdout}");
    let reason =
        |id: u64| String::from_utf8_lossy(&shim(&c, "squeue", &["-h", "-j", &id.to_string(), "-o", "%T|%r"]).stdout).trim().to_string();
    let physics = sbatch(&["-p", "physonly", "-A", "physics", "-o", "/dev/null", "--wrap", "true"]);
    assert_eq!(c.wait_final(physics, Duration::from_secs(30))["state"], "COMPLETED");
    let other = sbatch(&["-p", "physonly", "-A", "chem", "--wrap", "true"]);
    wait_until("the chem job to wait for its partition", Duration::from_secs(30), || {
        reason(other) == "PENDING|Job's account not permitted to use this partition (physonly allows physics not chem)"
    });
    let long = sbatch(&["--qos=normal", "-t", "11-00:00:00", "--wrap", "true"]);
    wait_until("the long job to wait for the window", Duration::from_secs(30), || {
        reason(long) == "PENDING|ReqNodeNotAvail, Reserved for maintenance"
    });
    assert!(shim(&c, "scancel", &[&other.to_string(), &long.to_string()]).status.success());
}

/// Issue 45: an operator declares a maintenance window and a team's reservation with
/// `scontrol create reservation`, as on Slurm (each answer checked on the peer first): a job
/// that would still run when the window begins waits with Slurm's words while one that ends
/// before it runs; a reservation's nodes show as `resv` (`maint` for a maintenance one) in
/// sinfo, take only its jobs, and free up when it is deleted.
#[test]
fn reservations_hold_their_nodes_for_their_jobs_and_windows() {
    let c = TestCluster::up(&["--nodes", "2", "--voters-max", "1", "--gpus", "h100:1"]);
    let run = |name: &str, args: &[&str]| {
        let out = shim(&c, name, args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        )
    };
    let ok = |name: &str, args: &[&str]| {
        let (code, out, err) = run(name, args);
        assert_eq!(code, Some(0), "{name} {args:?}: {err}");
        out
    };
    let sbatch = |args: &[&str]| -> u64 {
        let mut all = vec!["--parsable", "-o", "/dev/null"];
        all.extend_from_slice(args);
        ok("sbatch", &all).parse().expect("a job id")
    };
    let reason = |id: u64| ok("squeue", &["-h", "-j", &id.to_string(), "-o", "%T|%r"]);
    // One row per partition the node is in, each with its state.
    let sinfo_state = |node: &str| {
        let mut states: Vec<String> = ok("sinfo", &["-h", "-N", "-n", node, "-o", "%t"]).lines().map(str::to_string).collect();
        states.dedup();
        states.join(",")
    };

    // A maintenance window on n1 in two minutes.
    let created = ok(
        "scontrol",
        &[
            "create",
            "reservation",
            "ReservationName=maint",
            "StartTime=now+2minutes",
            "Duration=60",
            "Nodes=n1",
            "Users=root",
            "Flags=MAINT",
        ],
    );
    assert_eq!(created, "Reservation created: maint");
    let shown = ok("scontrol", &["show", "reservation", "maint"]);
    for field in [
        "Duration=01:00:00\n",
        "   Nodes=n1 NodeCnt=1 ",
        "Flags=MAINT,SPEC_NODES\n",
        "   Users=root Groups=(null) Accounts=(null) ",
        "State=INACTIVE",
    ] {
        assert!(shown.contains(field), "{field} in {shown}");
    }
    assert_eq!(sinfo_state("n1"), "idle", "not begun");
    let long = sbatch(&["-w", "n1", "-t", "10", "--wrap", "true"]);
    let short = sbatch(&["-w", "n1", "-t", "1", "--wrap", "true"]);
    assert_eq!(c.wait_final(short, Duration::from_secs(30))["state"], "COMPLETED", "ends before the window");
    wait_until("the long job to wait for the window", Duration::from_secs(20), || {
        reason(long) == "PENDING|ReqNodeNotAvail, Reserved for maintenance"
    });

    // A team's reservation on n2 from now: only its jobs run there.
    ok("scontrol", &["create", "reservation", "ReservationName=team", "StartTime=now", "Duration=30", "Nodes=n2", "Users=root"]);
    assert_eq!(sinfo_state("n2"), "resv");
    let (code, _, err) = run("scontrol", &["create", "reservation", "StartTime=now", "Duration=30", "Nodes=n2", "Users=root"]);
    assert_eq!((code, err.as_str()), (Some(1), "Error creating the reservation: Requested reservation overlaps with another reservation"));
    let (code, _, err) = run("scontrol", &["create", "reservation", "StartTime=now", "Duration=30", "Nodes=n2"]);
    assert_eq!(
        (code, err.as_str()),
        (Some(1), "scontrol: error: Either Users/Groups and/or Accounts must be specified.  No reservation created.")
    );
    let outside = sbatch(&["-w", "n2", "-t", "1", "--wrap", "true"]);
    let inside = sbatch(&["--reservation=team", "-t", "1", "--wrap", "true"]);
    let job = c.wait_final(inside, Duration::from_secs(30));
    assert_eq!((job["state"].as_str(), job["nodes"][0].as_str()), (Some("COMPLETED"), Some("n2")), "{job}");
    // As the peer shows a job of a reservation and a reserved node.
    assert!(ok("scontrol", &["show", "job", &inside.to_string()]).contains("\n   Reservation=team\n"));
    assert_eq!(ok("squeue", &["-h", "-t", "all", "-j", &inside.to_string(), "-o", "%v"]), "team");
    assert!(ok("scontrol", &["show", "node", "n2"]).contains("\n   State=IDLE+RESERVED\n"));
    wait_until("the job outside it to wait", Duration::from_secs(20), || reason(outside) == "PENDING|Resources");
    let (code, _, err) = run("sbatch", &["--reservation=nope", "--wrap", "true"]);
    assert_eq!((code, err.as_str()), (Some(1), "sbatch: error: Batch job submission failed: Requested reservation is invalid"));
    assert_eq!(ok("scontrol", &["delete", "ReservationName=team"]), "");
    assert_eq!(c.wait_final(outside, Duration::from_secs(30))["state"], "COMPLETED", "n2 is free again");
    let (code, _, err) = run("scontrol", &["delete", "ReservationName=team"]);
    assert_eq!((code, err.as_str()), (Some(1), "delete_reservation ReservationName=team: Requested reservation is invalid"));

    // The window begins now: n1 shows maint; once it is deleted the long job runs.
    assert_eq!(ok("scontrol", &["update", "ReservationName=maint", "StartTime=now"]), "Reservation updated.");
    assert!(ok("scontrol", &["show", "reservation"]).contains("State=ACTIVE"));
    assert_eq!(sinfo_state("n1"), "maint");
    assert!(ok("scontrol", &["show", "node", "n1"]).contains("\n   State=IDLE+MAINTENANCE+RESERVED\n"));
    assert_eq!(reason(long), "PENDING|ReqNodeNotAvail, Reserved for maintenance");
    ok("scontrol", &["delete", "ReservationName=maint"]);
    assert_eq!(c.wait_final(long, Duration::from_secs(30))["state"], "COMPLETED");
    assert_eq!(run("scontrol", &["show", "reservation"]).2, "No reservations in the system");

    // Every node, as an operator declares a whole-cluster maintenance; shown as the peer shows it.
    let busy = sbatch(&["-w", "n2", "--wrap", "sleep 300"]);
    wait_until("a job without a time limit to run on n2", Duration::from_secs(30), || reason(busy).starts_with("RUNNING|"));
    let (code, _, err) = run("scontrol", &["create", "reservation", "StartTime=now+1hour", "Duration=60", "Nodes=ALL", "Users=root"]);
    assert_eq!((code, err.as_str()), (Some(1), "Error creating the reservation: Requested nodes are busy"));
    let created = ok(
        "scontrol",
        &[
            "create",
            "reservation",
            "ReservationName=all",
            "StartTime=now+1hour",
            "Duration=60",
            "Nodes=ALL",
            "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        ],
    );
    assert_eq!(created, "Reservation created: all");
    let shown = ok("scontrol", &["show", "reservation", "all"]);
    assert!(shown.contains("\n   Nodes=n[1-2] NodeCnt=2 ") && shown.contains(" Flags=MAINT,IGNORE_JOBS,SPEC_NODES,ALL_NODES\n"), "{shown}");
    ok("scancel", &[&busy.to_string()]);
    assert_eq!(ok("scontrol", &["delete", "ReservationName=all"]), "");
}

/// `GrpWall` (issue 45), as Slurm 22.05 with slurmdbd and priority/multifactor showed it: two
/// `sleep` jobs of an account with `GrpWall=1` get that minute as their time limit (neither
/// gives `--time`), and both end TIMEOUT once their wall-clock time adds up to a minute (about
/// 30 s each, the leader looking every 5 s); a third waits with `AssocGrpWallLimit` (Slurm's
/// words in Corral's reasons) and starts at once when the limit is lifted.
#[test]
fn grp_wall_times_out_an_accounts_jobs_and_holds_the_next_until_lifted() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1"]);
    let probe = c.submit(&[], &["true"]);
    let user = c.wait_final(probe, Duration::from_secs(30))["user"].as_str().expect("a job has a user").to_string();
    let ok = |name: &str, args: &[&str]| {
        let out = shim(&c, name, args);
        assert!(out.status.success(), "{name} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    ok("sacctmgr", &["-i", "add", "account", "phys", "GrpWall=1"]);
    ok("sacctmgr", &["-i", "add", "user", &user, "Account=phys"]);
    let sbatch = || -> u64 { ok("sbatch", &["--parsable", "-o", "/dev/null", "--wrap", "sleep 300"]).parse().expect("a job id") };
    let state = |id: u64| ok("squeue", &["-h", "-t", "all", "-j", &id.to_string(), "-o", "%T|%r"]);
    let jobs = [sbatch(), sbatch()];
    for id in jobs {
        wait_until(&format!("job {id} to run"), Duration::from_secs(30), || state(id).starts_with("RUNNING|"));
        assert!(ok("scontrol", &["show", "job", &id.to_string()]).contains(" TimeLimit=00:01:00 "), "GrpWall=1 bounds the limit");
    }
    let words = "Job is at or exceeds association (acc=phys/user=(null)/part=(null)) group wall limit 1 with 1";
    let mut times_ms = Vec::new();
    for id in jobs {
        let job = c.wait_final(id, Duration::from_secs(60));
        assert_eq!((job["state"].as_str(), job["reasons"][0].as_str()), (Some("TIMEOUT"), Some(words)), "{job}");
        let shown = ok("scontrol", &["show", "job", &id.to_string()]);
        assert!(shown.contains("JobState=TIMEOUT Reason=TimeLimit ") && shown.contains(" ExitCode=0:15"), "{shown}");
        times_ms.push((job["start_time"].as_u64().expect("started"), job["end_time"].as_u64().expect("ended")));
    }
    // The minute is used up when the two runs' time adds up to 60 s; their own limit (a
    // minute each) would end them 30 s later.
    let reached_ms = (times_ms[0].0 + times_ms[1].0 + 60_000) / 2;
    let after_ms: Vec<i64> = times_ms.iter().map(|t| t.1 as i64 - reached_ms as i64).collect();
    assert!(after_ms.iter().all(|&ms| (0..15_000).contains(&ms)), "TIMEOUT {after_ms:?} ms after the limit was reached");
    eprintln!("GrpWall=1 used up by two jobs: TIMEOUT {after_ms:?} ms after it was reached");

    let third = sbatch();
    wait_until("the third job to wait for the group's wall time", Duration::from_secs(30), || state(third) == "PENDING|AssocGrpWallLimit");
    let reasons = c.job(third)["reasons"].clone();
    assert_eq!(reasons[0].as_str(), Some(format!("AssocGrpWallLimit: {words}").as_str()), "{reasons}");
    let lifted = std::time::Instant::now();
    ok("sacctmgr", &["-i", "modify", "account", "phys", "set", "GrpWall=-1"]);
    wait_until("the third job to run once the limit is lifted", Duration::from_secs(30), || state(third).starts_with("RUNNING|"));
    eprintln!("GrpWall lifted: the held job ran {:.2} s later", lifted.elapsed().as_secs_f64());
    ok("scancel", &[&third.to_string()]);
}
