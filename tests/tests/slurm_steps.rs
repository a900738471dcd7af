//! Issue 5, `srun` inside a batch job: the script runs on the job's first node only, and each
//! `srun` in it is a step that the agents of the job's nodes start, with the per-task Slurm
//! variables, the output forwarded to the script, signals passed on, and the worst exit code.

use std::time::Duration;

use corral_tests::{wait_until, TestCluster};

/// Submits `script` with `sbatch --parsable` through the shims; the job id.
fn sbatch(c: &TestCluster, name: &str, script: &str) -> u64 {
    std::fs::write(c.work.join(name), script).expect("write script");
    let out = c.shim("sbatch", &["--parsable", name], &[]);
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch printed a job id")
}

fn output(c: &TestCluster, id: u64) -> String {
    std::fs::read_to_string(c.work.join(format!("slurm-{id}.out"))).unwrap_or_default()
}

/// Waits up to `secs` for job `id` to end, asserts it COMPLETED, and returns its output.
fn completed_output(c: &TestCluster, id: u64, secs: u64) -> String {
    let job = c.wait_final(id, Duration::from_secs(secs));
    let out = output(c, id);
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}\n{}", c.logs());
    out
}

/// Lines of `out` that start with `prefix`, sorted.
fn lines_with(out: &str, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = out.lines().filter(|l| l.starts_with(prefix)).map(str::to_string).collect();
    v.sort();
    v
}

/// The words of each line of `out`, lines sorted (tasks print in any order).
fn sorted_words(out: &str) -> Vec<Vec<&str>> {
    let mut lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    lines.sort();
    lines
}

const STEPS: &str = r#"#!/bin/sh
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:h100:4
export FROM_SCRIPT=yes
echo "batch on $SLURMD_NODENAME"
srun -l sh -c 'echo "rank=$SLURM_PROCID local=$SLURM_LOCALID node=$SLURMD_NODENAME nodeid=$SLURM_NODEID step=$SLURM_STEP_ID ntasks=$SLURM_NTASKS nodes=$SLURM_STEP_NODELIST from=$FROM_SCRIPT gpus=$(echo $CUDA_VISIBLE_DEVICES | tr , " " | wc -w)"; echo "stderr of $SLURM_PROCID" >&2'
echo "srun=$?"
srun -n 3 sh -c 'exit $SLURM_PROCID'
echo "srun=$?"
srun -N1 -n2 --gpus-per-task=2 sh -c 'echo "share $SLURM_PROCID step=$SLURM_STEP_ID $CUDA_VISIBLE_DEVICES"'
echo "srun=$?"
srun -w nosuch true
echo "srun=$?"
srun --gres=gpu:2 sh -c 'echo "pernode $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"'
"#;

#[test]
fn a_batch_script_runs_once_and_its_steps_run_on_every_node_through_the_agents() {
    let c = TestCluster::up(&["--nodes", "2", "--gpus", "h100:4"]);
    let id = sbatch(&c, "steps.sh", STEPS);
    let out = completed_output(&c, id, 90);
    let batch = lines_with(&out, "batch on ");
    assert_eq!(batch.len(), 1, "the script runs on the first node only:\n{out}");
    let first = batch[0].trim_start_matches("batch on ").to_string();
    let second = if first == "n1" { "n2" } else { "n1" };
    let nodes = "n[1-2]";
    let want: Vec<String> = vec![
        format!("0: rank=0 local=0 node={first} nodeid=0 step=0 ntasks=4 nodes={nodes} from=yes gpus=4"),
        format!("1: rank=1 local=1 node={first} nodeid=0 step=0 ntasks=4 nodes={nodes} from=yes gpus=4"),
        format!("2: rank=2 local=0 node={second} nodeid=1 step=0 ntasks=4 nodes={nodes} from=yes gpus=4"),
        format!("3: rank=3 local=1 node={second} nodeid=1 step=0 ntasks=4 nodes={nodes} from=yes gpus=4"),
    ];
    let mut got: Vec<String> = out.lines().filter(|l| l.contains(": rank=")).map(str::to_string).collect();
    got.sort();
    assert_eq!(got, want, "{out}");
    assert_eq!(lines_with(&out, "").iter().filter(|l| l.contains(": stderr of ")).count(), 4, "stderr is forwarded, labelled:\n{out}");
    let codes = lines_with(&out, "srun=");
    assert_eq!(out.lines().filter(|l| l.starts_with("srun=")).collect::<Vec<_>>(), vec!["srun=0", "srun=2", "srun=0", "srun=1"], "{out}");
    assert_eq!(codes.len(), 4);
    assert!(out.contains(": task 1: Exited with exit code 1") && out.contains(": task 2: Exited with exit code 2"), "{out}");
    let shares = lines_with(&out, "share ");
    assert_eq!(shares.len(), 2, "{out}");
    let gpus: Vec<&str> = shares.iter().flat_map(|l| l.split_whitespace().nth(3).unwrap_or("").split(',')).collect();
    assert_eq!(gpus.len(), 4, "--gpus-per-task=2: two GPUs each: {shares:?}");
    assert_eq!(gpus.iter().collect::<std::collections::BTreeSet<_>>().len(), 4, "no GPU given to two tasks: {shares:?}");
    assert!(shares.iter().all(|l| l.contains(" step=2 ")), "steps are numbered in order: {shares:?}");
    assert!(out.contains("nosuch is not in the allocation"), "{out}");
    // A step of both nodes with its own count sees that many of the job's GPUs on each.
    let pernode = lines_with(&out, "pernode ");
    assert_eq!(pernode.len(), 4, "four tasks: {out}");
    assert!(pernode.iter().all(|l| l.split_whitespace().nth(2).map(|g| g.split(',').count()) == Some(2)), "{pernode:?}");
}

const SIGNALS: &str = r#"#!/bin/sh
#SBATCH -N 2
srun -K -N2 -n2 sh -c 'if [ "$SLURM_PROCID" = 0 ]; then exit 3; fi; sleep 120'
echo "srun=$?"
srun -N2 -n2 sh -c 'trap "echo got TERM on $SLURM_PROCID; exit 0" TERM; touch ready.$SLURM_PROCID; while :; do sleep 1; done' &
pid=$!
i=0
while [ ! -e ready.0 ] || [ ! -e ready.1 ]; do sleep 0.1; i=$((i+1)); [ $i -gt 600 ] && break; done
kill -TERM $pid
wait $pid
echo "srun=$?"
"#;

#[test]
fn kill_on_bad_exit_stops_the_step_and_a_signal_to_srun_reaches_every_task() {
    let c = TestCluster::up(&["--nodes", "2"]);
    let id = sbatch(&c, "signals.sh", SIGNALS);
    // Far less than the 120 s the surviving task would sleep without --kill-on-bad-exit.
    let out = completed_output(&c, id, 60);
    let codes: Vec<&str> = out.lines().filter(|l| l.starts_with("srun=")).collect();
    assert_eq!(codes, vec!["srun=143", "srun=0"], "as Slurm: task 1 terminated by -K's SIGTERM (128 + 15); then a clean stop:\n{out}");
    assert!(out.contains("task 0: Exited with exit code 3") && out.contains("task 1: Terminated"), "{out}");
    assert!(out.contains("srun: Force Terminated StepId="), "{out}");
    assert_eq!(lines_with(&out, "got TERM on "), vec!["got TERM on 0", "got TERM on 1"], "{out}");
}

const CANCELLED: &str = r#"#!/bin/sh
#SBATCH -N 2
export SECRET=1
srun --export=NONE -N2 sh -c 'echo "secret=${SECRET-unset} job=$SLURM_JOB_ID"'
srun -N2 -n2 sh -c 'echo $$ > pid.$SLURM_PROCID; exec sleep 300'
"#;

#[test]
fn export_none_hides_the_callers_variables_and_a_cancel_ends_every_steps_tasks() {
    let c = TestCluster::up(&["--nodes", "2"]);
    let id = sbatch(&c, "cancelled.sh", CANCELLED);
    let pids: Vec<i32> = {
        let mut pids = Vec::new();
        wait_until("both step tasks to record their pids", Duration::from_secs(60), || {
            pids = (0..2).filter_map(|r| std::fs::read_to_string(c.work.join(format!("pid.{r}"))).ok()?.trim().parse().ok()).collect();
            pids.len() == 2
        });
        pids
    };
    assert!(pids.iter().all(|p| chaos::runner::pid_alive(*p)));
    let out = c.shim("scancel", &[&id.to_string()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(c.wait_final(id, Duration::from_secs(30))["state"], "CANCELLED");
    for pid in pids {
        wait_until(&format!("step task {pid} to be gone"), Duration::from_secs(20), || !chaos::runner::pid_alive(pid));
    }
    let out = output(&c, id);
    assert_eq!(lines_with(&out, "secret="), vec![format!("secret=unset job={id}"), format!("secret=unset job={id}")], "{out}");
}

#[test]
fn srun_outside_an_allocation_gets_one_and_runs_the_step_in_it() {
    let c = TestCluster::up(&["--nodes", "2"]);
    let cmd = "echo out $SLURM_PROCID $SLURMD_NODENAME $SLURM_STEP_ID; echo err $SLURM_PROCID >&2; exit $SLURM_PROCID";
    let out = c.shim("srun", &["-N2", "--ntasks-per-node=2", "-l", "sh", "-c", cmd], &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "the worst task's exit code:\n{stdout}\n{stderr}\n{}", c.logs());
    let lines = sorted_words(&stdout);
    assert_eq!(lines.len(), 4, "{stdout}");
    for (rank, words) in lines.iter().enumerate() {
        assert_eq!(
            (words[0], words[1], words[2], words[4]),
            (format!("{rank}:").as_str(), "out", rank.to_string().as_str(), "0"),
            "{stdout}"
        );
    }
    assert_eq!(lines[0][3], lines[1][3], "ranks 0 and 1 share the first node:\n{stdout}");
    assert_eq!(lines[2][3], lines[3][3]);
    assert_ne!(lines[0][3], lines[2][3]);
    for rank in 0..4 {
        assert!(stderr.contains(&format!("{rank}: err {rank}")), "stderr stays stderr:\n{stderr}");
    }
    assert!(stderr.contains("task 3: Exited with exit code 3"), "{stderr}");
    // As Slurm's srun, it runs the step itself: its stdin reaches every task.
    let (out, err, code) = shell(&c, "printf 'in\\n' | srun -N2 -l cat | sort");
    assert_eq!((out.as_str(), code), ("0: in\n1: in\n", Some(0)), "{err}");
    // With --output the step's output goes into that file (stderr too) and not here.
    let (out, err, code) = shell(&c, "srun -N2 -l --output=two.out sh -c 'echo $SLURMD_NODENAME; echo e >&2'; echo rc=$?; sort two.out");
    assert_eq!((out.as_str(), code), ("rc=0\n0: e\n0: n1\n1: e\n1: n2\n", Some(0)), "{err}");
}

/// `srun --output`/`--error` inside an allocation, in Slurm's forms (its man page's "IO
/// Redirection"): a pattern with `%t` makes a file per task, `%N` per node, `%J` names the
/// step; stderr follows `--output` unless `--error` is given; `none` drops output, a number
/// keeps that task's; `--open-mode=append` appends.
#[test]
fn srun_output_and_error_go_to_files_per_task_node_and_step() {
    let (c, id) = waiting_job();
    let srun = format!("srun --jobid={id}");
    let cmd = "sh -c 'echo out $SLURM_PROCID; echo err $SLURM_PROCID >&2'";
    let ok = |line: &str| {
        let (out, err, code) = shell(&c, line);
        assert_eq!(code, Some(0), "{line}: {err}\n{}", c.logs());
        (out, err)
    };
    let read = |name: &str| std::fs::read_to_string(c.work.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let sorted = |text: String| {
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        lines.join("\n")
    };
    assert_eq!(ok(&format!("{srun} -o task-%t.out {cmd}")), (String::new(), String::new()), "nothing shown");
    for rank in 0..4 {
        assert_eq!(sorted(read(&format!("task-{rank}.out"))), format!("err {rank}\nout {rank}"));
    }
    ok(&format!("{srun} -o all-%J.out -e err-%N.txt {cmd}"));
    let all = std::fs::read_dir(&c.work).expect("work dir").filter_map(Result::ok).map(|e| e.file_name().to_string_lossy().into_owned());
    let step_file = all.filter(|n| n.starts_with(&format!("all-{id}."))).collect::<Vec<_>>();
    assert_eq!(step_file.len(), 1, "one file named by job and step: {step_file:?}");
    assert_eq!(sorted(read(&step_file[0])), "out 0\nout 1\nout 2\nout 3");
    assert_eq!(sorted(read("err-n1.txt") + &read("err-n2.txt")), "err 0\nerr 1\nerr 2\nerr 3");
    assert_eq!(read("err-n1.txt").lines().count(), 2, "two tasks on each node");
    let (out, err) = ok(&format!("{srun} --output=none -l {cmd}"));
    assert_eq!((out.as_str(), err.as_str()), ("", ""));
    let (out, err) = ok(&format!("{srun} --output=2 -l {cmd}"));
    assert_eq!((out.as_str(), err.as_str()), ("2: out 2\n", "2: err 2\n"));
    ok(&format!("{srun} -n1 --open-mode=append -o task-%t.out sh -c 'echo again'"));
    assert_eq!(sorted(read("task-0.out")), "again\nerr 0\nout 0");
    std::fs::write(c.work.join("stop"), "").expect("write stop");
    assert_eq!(c.wait_final(id, Duration::from_secs(30))["state"], "COMPLETED");
}

const WAITING: &str = r#"#!/bin/sh
#SBATCH -N 2
#SBATCH --ntasks-per-node=2
while [ ! -e stop ]; do sleep 0.2; done
"#;

/// A running 2-node batch job of `WAITING` (2 tasks per node) on a new 2-node cluster.
fn waiting_job() -> (TestCluster, u64) {
    let c = TestCluster::up(&["--nodes", "2"]);
    let id = sbatch(&c, "waiting.sh", WAITING);
    wait_until("the job to run", Duration::from_secs(30), || c.job(id)["state"] == "RUNNING");
    (c, id)
}

/// `srun --jobid=ID` from outside the allocation: a step of a running 2-node batch job, started
/// through whichever node the client reaches (the job's first node numbers it), with the
/// allocation's tasks and output; a finished job's allocation takes no step.
#[test]
fn srun_jobid_runs_a_step_in_a_running_allocation_from_outside() {
    let (c, id) = waiting_job();
    let jobid = format!("--jobid={id}");
    let cmd = "echo out $SLURM_JOB_ID $SLURM_PROCID $SLURMD_NODENAME $SLURM_STEP_ID $SLURM_NTASKS";
    // Through each node in turn: the job's first node starts the step itself, the other passes
    // it there.
    let nodes = c.json(&["nodes"]);
    let addrs: Vec<String> = nodes.as_array().expect("nodes").iter().map(|n| n["addr"].as_str().expect("addr").to_string()).collect();
    assert_eq!(addrs.len(), 2, "{nodes}");
    for (step, addr) in addrs.iter().enumerate() {
        let out = c.shim("srun", &[&jobid, "-l", "sh", "-c", cmd], &[("CORRAL_SERVER", addr)]);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}\n{}", c.logs());
        let lines = sorted_words(&stdout);
        assert_eq!(lines.len(), 4, "{stdout}");
        for (rank, words) in lines.iter().enumerate() {
            let want = [format!("{rank}:"), "out".into(), id.to_string(), rank.to_string()];
            assert_eq!(words[..4], want.iter().map(String::as_str).collect::<Vec<_>>()[..], "{stdout}");
            assert_eq!((words[5], words[6]), (step.to_string().as_str(), "4"), "step {step} of 4 tasks: {stdout}");
        }
        assert_eq!(lines[0][4], lines[1][4]);
        assert_ne!(lines[0][4], lines[2][4], "both nodes: {stdout}");
    }
    std::fs::write(c.work.join("stop"), "").expect("write stop");
    assert_eq!(c.wait_final(id, Duration::from_secs(30))["state"], "COMPLETED");
    // Refusals as Slurm 22.05 prints them.
    let check = |job: u64| format!("srun: Check SLURM_JOB_ID environment variable. Expired or invalid job {job}");
    let out = c.shim("srun", &[&jobid, "true"], &[]);
    assert_eq!(
        (out.status.code(), String::from_utf8_lossy(&out.stderr).trim().to_string()),
        (Some(1), format!("srun: error: Slurm job {id} has expired\n{}", check(id)))
    );
    let out = c.shim("sbatch", &["--parsable", "--hold", "--wrap", "true"], &[]);
    let held: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch printed a job id");
    let out = c.shim("srun", &[&format!("--jobid={held}"), "true"], &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!("srun: error: Unable to confirm allocation for job {held}: Job is pending execution\n{}", check(held))
    );
}

const SIGNALLED: &str = r#"#!/bin/sh
#SBATCH -N 2
srun -N2 sh -c 'trap "echo usr1 on $SLURM_PROCID" USR1; touch r.$SLURM_PROCID; while [ ! -e stop ]; do sleep 0.2; done'
echo "srun=$?"
"#;

#[test]
fn scancel_signal_reaches_step_tasks_on_every_node_and_spares_the_holders() {
    let c = TestCluster::up(&["--nodes", "2"]);
    let id = sbatch(&c, "signalled.sh", SIGNALLED);
    wait_until("both tasks to be ready", Duration::from_secs(60), || c.work.join("r.0").exists() && c.work.join("r.1").exists());
    let out = c.shim("scancel", &["--signal=USR1", &id.to_string()], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until("both tasks to report SIGUSR1", Duration::from_secs(20), || lines_with(&output(&c, id), "usr1 on ").len() == 2);
    std::fs::write(c.work.join("stop"), "").expect("write stop");
    let job = c.wait_final(id, Duration::from_secs(30));
    let out = output(&c, id);
    assert_eq!(job["state"], "COMPLETED", "the holder ignored SIGUSR1: {job}\n{out}");
    assert_eq!(lines_with(&out, "usr1 on "), vec!["usr1 on 0", "usr1 on 1"]);
    assert!(out.contains("srun=0"), "{out}");
}

#[test]
fn a_batch_job_losing_a_holder_node_stops_its_steps_everywhere_before_it_runs_again() {
    lose_a_node_of_a_batch_job(1);
}

#[test]
fn a_batch_job_losing_its_script_node_stops_its_steps_everywhere_before_it_runs_again() {
    lose_a_node_of_a_batch_job(0);
}

/// A 2-node `--requeue` batch job whose step runs a task on each node loses node `lost` (0:
/// the script's, 1: a holder) to SIGKILL: the task on the other node is stopped, the job runs
/// again on two nodes, and no two of its runs overlap.
fn lose_a_node_of_a_batch_job(lost: usize) {
    let c = TestCluster::up(&["--nodes", "3", "--gpus", "h100:8", "--node-down-after-ms", "3000"]);
    let task = format!(
        "{}; trap 'rec end; exit 143' TERM; rec start; if [ \"$CORRAL_RUN\" = 1 ]; then sleep 60 & wait; fi; rec end",
        corral_tests::REC
    );
    let script = format!(
        "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --gres=gpu:h100:8\n#SBATCH --requeue\nsrun -N2 sh -c '{}'\n",
        task.replace('\'', "'\\''")
    );
    let id = sbatch(&c, "requeued.sh", &script);
    let spans = || chaos::parse_spans(&std::fs::read_to_string(c.work.join("spans.log")).unwrap_or_default());
    wait_until("both step tasks of run 1 started", Duration::from_secs(30), || {
        spans().iter().filter(|s| s.job == id && s.run == 1).count() == 2
    });
    let job = c.job(id);
    let nodes: Vec<String> = job["nodes"].as_array().expect("nodes").iter().filter_map(|n| n.as_str().map(String::from)).collect();
    let survivor_node = &nodes[1 - lost];
    c.signal(&nodes[lost], "KILL");
    let deaths = corral_tests::observe_deaths(&c.work.join("spans.log"), &nodes[lost], Duration::from_secs(5));
    let job = c.wait_final(id, Duration::from_secs(60));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", output(&c, id));
    assert_eq!(job["restart_count"], 1);
    let mut spans = spans();
    corral_tests::close_spans(&mut spans, &deaths);
    corral_tests::assert_gang_requeued_whole(&spans, id, survivor_node);
}

#[test]
fn a_killed_daemon_takes_every_process_of_its_jobs_with_it() {
    let c = TestCluster::up(&["--nodes", "2"]);
    // On the script's node: a background child of the script, `srun` itself, and a child of the
    // step's task; none of them is a child of corrald, so its parent-death signal misses them.
    let script = "#!/bin/sh\n#SBATCH -N 2\nsleep 300 &\necho $! > bg.pid\nsrun -N2 sh -c 'sleep 300 & echo $! > task-bg.$SLURM_PROCID.pid; wait' &\necho $! > srun.pid\nwait\n";
    let id = sbatch(&c, "orphans.sh", script);
    let pid = |name: &str| -> Option<i32> { std::fs::read_to_string(c.work.join(name)).ok()?.trim().parse().ok() };
    wait_until("the processes to record their pids", Duration::from_secs(60), || {
        ["bg.pid", "srun.pid", "task-bg.0.pid", "task-bg.1.pid"].iter().all(|f| pid(f).is_some())
    });
    let doomed: Vec<i32> = ["bg.pid", "srun.pid", "task-bg.0.pid"].iter().filter_map(|f| pid(f)).collect();
    assert!(doomed.iter().all(|p| chaos::runner::pid_alive(*p)));
    let first = c.job(id)["nodes"][0].as_str().expect("first node").to_string();
    c.signal(&first, "KILL");
    for p in doomed {
        // The watchdog polls its parent every 100 ms.
        wait_until(&format!("process {p} of the killed node's job to be gone"), Duration::from_secs(10), || !chaos::runner::pid_alive(p));
    }
}

/// `salloc` (issue 18): the command runs here with the allocation's variables, its `srun` runs
/// steps on the allocation's nodes, and the job ends with the command's exit status, as Slurm
/// 22.05 records it (FAILED, ExitCode 3:0 for `exit 3`; COMPLETED for 0), with Slurm's
/// messages. A time limit revokes the allocation and hangs up the command.
#[test]
fn salloc_runs_the_command_here_with_steps_on_the_allocation_and_ends_with_its_status() {
    let c = TestCluster::up(&["--nodes", "2"]);
    let script = "echo here $SLURM_JOB_ID $SLURM_NNODES $SLURM_JOB_NAME $SLURM_NTASKS; srun sh -c 'echo task $SLURM_PROCID $SLURMD_NODENAME'; exit 3";
    let out = c.shim("salloc", &["-N2", "-n2", "sh", "-c", script], &[]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}\n{}", c.logs());
    let mut lines: Vec<&str> = stdout.lines().collect();
    let here = lines.remove(0);
    let id: u64 = here.split_whitespace().nth(1).and_then(|w| w.parse().ok()).unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(here, format!("here {id} 2 interactive 2"), "{stdout}");
    lines.sort();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with("task 0 ") && lines[1].starts_with("task 1 "), "{stdout}");
    assert_ne!(lines[0].split_whitespace().last(), lines[1].split_whitespace().last(), "one task per node: {stdout}");
    // The first job of a new cluster may take over a second to place: salloc then says it waits.
    let waited = format!("salloc: Pending job allocation {id}\nsalloc: job {id} queued and waiting for resources\nsalloc: job {id} has been allocated resources\n");
    let stderr = stderr.replace(&waited, "");
    assert_eq!(stderr.trim(), format!("salloc: Granted job allocation {id}\nsalloc: Relinquishing job allocation {id}"), "{stdout}");
    let job = c.wait_final(id, Duration::from_secs(20));
    assert_eq!((job["state"].as_str(), job["exit_code"].as_i64()), (Some("FAILED"), Some(3)), "{job}");
    let out = c.shim("sacct", &["-j", &id.to_string(), "-X", "--format=JobName,State,ExitCode", "-P", "-n"], &[]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "interactive|FAILED|3:0");
    // Its `srun` is its step 0; salloc's own step that hands the status over is no step.
    wait_until("the step's end in sacct", Duration::from_secs(20), || {
        let out = c.shim("sacct", &["-j", &id.to_string(), "--format=JobID,JobName,State,ExitCode", "-P", "-n"], &[]);
        String::from_utf8_lossy(&out.stdout)
            == format!("{id}|interactive|FAILED|3:0\n{id}.extern|extern|COMPLETED|0:0\n{id}.0|sh|COMPLETED|0:0\n")
    });

    // Exit 0 is COMPLETED; a busy cluster makes salloc wait, and say so.
    let blocker = c.submit(&["--nodes", "2", "--gres", "gpu:8"], &["sleep", "3"]);
    wait_until("the blocker to run", Duration::from_secs(20), || c.job(blocker)["state"] == "RUNNING");
    let out = c.shim("salloc", &["-N2", "--gres=gpu:8", "-J", "mine", "true"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let id: u64 =
        stderr.lines().find_map(|l| l.strip_prefix("salloc: Granted job allocation ")).and_then(|n| n.parse().ok()).expect(&stderr);
    let want = ["Pending job allocation {id}", "job {id} queued and waiting for resources", "job {id} has been allocated resources"]
        .iter()
        .chain(&["Granted job allocation {id}", "Relinquishing job allocation {id}"])
        .map(|l| format!("salloc: {}", l.replace("{id}", &id.to_string())))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(stderr.trim(), want);
    let job = c.wait_final(id, Duration::from_secs(20));
    assert_eq!((job["state"].as_str(), job["name"].as_str()), (Some("COMPLETED"), Some("mine")), "{job}");

    // Past its time limit the allocation is revoked and the command hung up.
    let started = std::time::Instant::now();
    let out = c.shim("salloc", &["-N1", "-t", "0:02", "sleep", "60"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(started.elapsed() < Duration::from_secs(30), "{stderr}");
    assert_eq!(out.status.code(), Some(128 + 1), "SIGHUP: {stderr}");
    let id: u64 =
        stderr.lines().find_map(|l| l.strip_prefix("salloc: Granted job allocation ")).and_then(|n| n.parse().ok()).expect(&stderr);
    assert!(
        stderr.trim().ends_with(&format!("salloc: Job {id} has exceeded its time limit and its allocation has been revoked.")),
        "{stderr}"
    );
    assert_eq!(c.wait_final(id, Duration::from_secs(20))["state"], "TIMEOUT");
}

/// Whether a process on this host runs with exactly `argv` (read from `/proc/*/cmdline`).
fn process_with_argv(argv: &[&str]) -> bool {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want))
}

/// A tmux session running one command line at a terminal of its own, killed when dropped.
struct Terminal {
    session: String,
}

impl Terminal {
    fn new(name: &str, line: &str) -> Terminal {
        let t = Terminal { session: format!("corral-{name}-{}", std::process::id()) };
        t.tmux(&["new-session", "-d", "-s", &t.session, "-x", "150", "-y", "40", line]);
        t
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("tmux").args(args).output().expect("run tmux (scripts/setup.sh installs it)");
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `keys` (tmux's key names: `Enter`, `C-c`, or text).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.session];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-t", &self.session, "-p"])
    }

    /// Waits up to 30 s until the screen satisfies `done`: the screen then.
    fn wait_for(&self, what: &str, done: &dyn Fn(&str) -> bool) -> String {
        let mut shown = String::new();
        wait_until(what, Duration::from_secs(30), || {
            shown = self.screen();
            done(&shown)
        });
        shown
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux").args(["kill-session", "-t", &self.session]).status();
    }
}

/// `salloc` at a terminal (tmux): the user's shell runs with the allocation, `srun` in it runs
/// on both nodes, Ctrl-C stops what the shell runs and not salloc, and `exit 4` ends the job
/// FAILED with code 4.
#[test]
fn salloc_gives_an_interactive_shell_at_a_terminal() {
    let c = TestCluster::up(&["--nodes", "2"]);
    c.shim("salloc", &["--version"], &[]); // installs the shims
    let shims = c.path().join("shims");
    let path = format!("{}:{}", shims.display(), std::env::var("PATH").unwrap_or_default());
    let line = format!("env CORRAL_CLUSTER={} SHELL=/bin/sh PS1='$ ' PATH={path} salloc -N2; echo salloc-rc=$?; sleep 60", c.path_str());
    let t = Terminal::new("salloc", &line);
    t.wait_for("the shell", &|s| s.contains("salloc: Granted job allocation") && s.trim_end().ends_with('$'));
    t.keys(&["echo id=$SLURM_JOB_ID nodes=$SLURM_JOB_NODELIST; srun -l hostname | sort", "Enter"]);
    t.wait_for("the step's output", &|s| s.contains("1: ") && s.trim_end().ends_with('$'));
    t.keys(&["sleep 100", "Enter"]);
    // Ctrl-C once the shell runs it (a `sleep 100` process exists), not at the prompt.
    wait_until("the shell to run sleep 100", Duration::from_secs(20), || process_with_argv(&["sleep", "100"]));
    t.keys(&["C-c"]);
    t.keys(&["echo interrupted=$?", "Enter"]);
    t.wait_for("Ctrl-C to stop the sleep", &|s| s.contains("interrupted=130") && s.trim_end().ends_with('$'));
    t.keys(&["exit 4", "Enter"]);
    let shown = t.wait_for("salloc to end", &|s| s.contains("salloc-rc="));
    drop(t);
    let id: u64 = shown
        .lines()
        .find_map(|l| l.trim().strip_prefix("salloc: Granted job allocation "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(shown.contains(&format!("id={id} nodes=n[1-2]")), "{shown}");
    assert!(shown.contains("0: ") && shown.contains("1: "), "{shown}");
    assert!(shown.contains(&format!("salloc: Relinquishing job allocation {id}")), "{shown}");
    assert!(shown.contains("salloc-rc=4"), "{shown}");
    let job = c.wait_final(id, Duration::from_secs(20));
    assert_eq!((job["state"].as_str(), job["exit_code"].as_i64()), (Some("FAILED"), Some(4)), "{job}");
}

/// `srun --pty bash` outside an allocation, at a terminal (tmux), as on Slurm 22.05 (checked on
/// `../shared/peers/slurm`): the shell runs on the chosen node on a pseudo-terminal of the
/// user's terminal's size, which follows a resize; keys reach it as typed (`cat` echoes a line,
/// Ctrl-C interrupts its `sleep` and not srun), and its `exit 5` is srun's status and the job's.
/// Without a terminal, and with `--output`, srun says what Slurm says.
#[test]
fn srun_pty_runs_an_interactive_shell_on_a_node() {
    let c = TestCluster::up(&["--nodes", "2"]);
    let (_, err, code) = shell(&c, "srun --pty -w n2 tty < /dev/null");
    assert_eq!(code, Some(1), "{err}"); // `tty` without one: "not a tty", status 1
    assert!(err.starts_with("srun: error: ioctl(TIOCGWINSZ): Inappropriate ioctl for device\nsrun: error: Not using a pseudo-terminal, disregarding --pty option\n"), "{err}");
    let (_, err, code) = shell(&c, "srun --pty --output=x true");
    assert_eq!((code, err.trim()), (Some(1), "srun: error: --error/--input/--output are incompatible with --pty"));

    let shims = c.path().join("shims");
    let path = format!("{}:{}", shims.display(), std::env::var("PATH").unwrap_or_default());
    let line = format!(
        "env CORRAL_CLUSTER={} PS1='remote> ' PATH={path} srun --pty -w n2 bash --norc --noprofile -i; echo srun-rc=$?; sleep 60",
        c.path_str()
    );
    let t = Terminal::new("srun-pty", &line);
    t.wait_for("the remote shell's prompt", &|s| s.trim_end().ends_with("remote>"));
    t.keys(&["echo node=$SLURMD_NODENAME tty=$(tty) size=$(stty size)", "Enter"]);
    t.wait_for("where the shell runs", &|s| s.contains("node=n2 tty=/dev/pts/") && s.contains("size=40 150"));
    t.tmux(&["resize-window", "-t", &t.session, "-x", "120", "-y", "30"]);
    t.keys(&["clear; echo now=$(stty size)", "Enter"]);
    t.wait_for("the new size", &|s| s.contains("now=30 120"));
    t.keys(&["cat", "Enter"]);
    // Keys typed before cat runs reach no echo: readline has the terminal raw (its own echo
    // off) until it hands the line to bash, and cat would print the line only once.
    wait_until("the remote shell to run cat", Duration::from_secs(20), || process_with_argv(&["cat"]));
    t.keys(&["typed line", "Enter"]);
    t.wait_for("cat to echo the line", &|s| s.matches("typed line").count() == 2);
    t.keys(&["C-d"]);
    t.keys(&["sleep 100", "Enter"]);
    wait_until("the remote shell to run sleep 100", Duration::from_secs(20), || process_with_argv(&["sleep", "100"]));
    t.keys(&["C-c"]);
    t.keys(&["echo interrupted=$?", "Enter"]);
    t.wait_for("Ctrl-C to stop the sleep", &|s| s.contains("interrupted=130") && s.trim_end().ends_with("remote>"));
    t.keys(&["exit 5", "Enter"]);
    let shown = t.wait_for("srun to end", &|s| s.contains("srun-rc="));
    drop(t);
    assert!(shown.contains("srun: error: n2: task 0: Exited with exit code 5\nsrun-rc=5"), "{shown}");
    let (jobs, _, _) = shell(&c, "sacct -X -n -P -o JobID,JobName");
    let id: u64 = jobs.lines().find_map(|l| l.strip_suffix("|bash")).and_then(|id| id.parse().ok()).unwrap_or_else(|| panic!("{jobs}"));
    let job = c.wait_final(id, Duration::from_secs(20));
    assert_eq!((job["state"].as_str(), job["exit_code"].as_i64()), (Some("FAILED"), Some(5)), "{job}");
}

/// `sh -c CMD` in the cluster's work directory with the Slurm shims first on `PATH`: stdout,
/// stderr and exit code.
fn shell(c: &TestCluster, cmd: &str) -> (String, String, Option<i32>) {
    c.shim("srun", &["--version"], &[]); // installs the shims
    let path = format!("{}:{}", c.path().join("shims").display(), std::env::var("PATH").unwrap_or_default());
    let out = std::process::Command::new("sh")
        .args(["-c", cmd])
        .env("CORRAL_CLUSTER", c.path())
        .env("PATH", path)
        .env_remove("SLURM_JOB_ID")
        .current_dir(&c.work)
        .output()
        .expect("run sh");
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned(), out.status.code())
}

/// Stdin of a step (issue 18), as Slurm 22.05 does it (checked on the peer: `echo hi | srun
/// -n2 -l cat` prints `0: hi` and `1: hi`; `--input=1` only `1: hi`; `--input=none` nothing;
/// a missing file "Could not open stdin file"): every task of the 2-node step reads srun's
/// stdin, in order and whole past many chunks.
#[test]
fn srun_sends_its_stdin_to_the_steps_tasks_as_slurm_does() {
    let (c, id) = waiting_job();
    let srun = format!("srun --jobid={id}");
    let ok = |cmd: &str| {
        let (out, err, code) = shell(&c, cmd);
        assert_eq!(code, Some(0), "{cmd}: {err}\n{}", c.logs());
        out
    };
    assert_eq!(ok(&format!("printf 'hi\\n' | {srun} -l cat | sort")), "0: hi\n1: hi\n2: hi\n3: hi\n");
    assert_eq!(ok(&format!("printf 'hi\\n' | {srun} -l --input=2 cat | sort")), "2: hi\n");
    assert_eq!(ok(&format!("printf 'hi\\n' | {srun} -l --input=none cat")), "");
    std::fs::write(c.work.join("in.txt"), "from a file\n").expect("write in.txt");
    assert_eq!(ok(&format!("{srun} -l -i in.txt cat | sort")), "0: from a file\n1: from a file\n2: from a file\n3: from a file\n");
    // About 600 KB, ten chunks: whole and in order on the task.
    let sum = ok("seq 1 100000 | sha256sum");
    assert_eq!(ok(&format!("seq 1 100000 | {srun} -N1 -n1 sha256sum")), sum);
    let (_, err, code) = shell(&c, &format!("{srun} --input=missing.txt cat"));
    assert_eq!((code, err.trim()), (Some(1), "srun: error: Could not open stdin file: No such file or directory"));
    std::fs::write(c.work.join("stop"), "").expect("write stop");
    assert_eq!(c.wait_final(id, Duration::from_secs(30))["state"], "COMPLETED");
}

/// Issue 18's packing: four `srun --exact --gres=gpu:1` steps in a 4-GPU allocation run at
/// once, each on its own GPU, CPU and share of memory (the job's `--mem-per-cpu`, which srun
/// inherits as Slurm's does); a fifth waits (in Slurm's words) until one of them ended, and
/// takes its GPU.
const PACKED: &str = r#"#!/bin/sh
#SBATCH -N 1
#SBATCH -n 4
#SBATCH --mem-per-cpu=64M
#SBATCH --gres=gpu:h100:4
for i in 1 2 3 4; do
  srun -n1 --exact --gres=gpu:1 sh -c 'echo "own $SLURM_STEP_ID $CUDA_VISIBLE_DEVICES"; touch held.$SLURM_STEP_ID; while [ ! -e go ]; do sleep 0.1; done; echo "end $(date +%s%N)"' &
done
i=0; while [ "$(ls held.* 2>/dev/null | wc -l)" -lt 4 ]; do sleep 0.1; i=$((i+1)); [ $i -gt 600 ] && break; done
srun -n1 --exact --gres=gpu:1 sh -c 'echo "fifth $SLURM_STEP_ID $CUDA_VISIBLE_DEVICES $(date +%s%N)"' 2> fifth.err &
fifth=$!
i=0; while ! grep -q "temporarily disabled" fifth.err 2>/dev/null; do sleep 0.1; i=$((i+1)); [ $i -gt 600 ] && break; done
echo "running while the fifth waits: $(ls held.* | wc -l)"
touch go
wait $fifth
echo "fifth=$?"
wait
srun -n1 --gres=gpu:5 true
echo "toomany=$?"
srun -n1 --gres=none sh -c 'echo "none=[$CUDA_VISIBLE_DEVICES]"'
srun -n1 --overlap --gres=gpu:2 sh -c 'echo "overlap $CUDA_VISIBLE_DEVICES"'
"#;

#[test]
fn single_gpu_steps_pack_into_an_allocation_and_a_fifth_waits_for_a_free_gpu() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:4"]);
    let id = sbatch(&c, "packed.sh", PACKED);
    let out = completed_output(&c, id, 120);
    let own = lines_with(&out, "own ");
    let steps: std::collections::BTreeSet<&str> = own.iter().filter_map(|l| l.split_whitespace().nth(1)).collect();
    let gpus: std::collections::BTreeSet<&str> = own.iter().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert_eq!(steps, ["0", "1", "2", "3"].into_iter().collect(), "{out}");
    assert_eq!(gpus.len(), 4, "four steps, four different GPUs: {own:?}");
    assert!(gpus.iter().all(|g| !g.contains(',')), "one GPU each: {own:?}");
    assert!(out.contains("running while the fifth waits: 4"), "{out}");
    let err = std::fs::read_to_string(c.work.join("fifth.err")).unwrap_or_default();
    assert!(err.contains(&format!("srun: Job {id} step creation temporarily disabled, retrying (Requested nodes are busy)")), "{err}");
    assert!(err.contains(&format!("srun: Step created for job {id}")), "{err}");
    let fifth = lines_with(&out, "fifth ");
    let words: Vec<&str> = fifth.first().map(|l| l.split_whitespace().collect()).unwrap_or_default();
    assert_eq!(words.len(), 4, "{out}");
    assert_eq!(words[1], "4", "a waiting step used no numbers up: {out}");
    assert!(gpus.contains(words[2]), "the fifth got one of the job's GPUs: {out}");
    let ends: Vec<u128> = lines_with(&out, "end ").iter().filter_map(|l| l[4..].trim().parse().ok()).collect();
    let started: u128 = words[3].parse().expect("the fifth's start time");
    assert_eq!(ends.len(), 4, "{out}");
    assert!(ends.iter().any(|e| *e <= started), "the fifth started only after a step ended: {ends:?} {started}");
    assert!(out.contains("fifth=0") && out.contains("toomany=1"), "{out}");
    assert!(out.contains("Invalid generic resource (gres) specification"), "{out}");
    assert!(out.contains("none=[]"), "--gres=none: no GPU: {out}");
    let overlap = lines_with(&out, "overlap ");
    assert_eq!(overlap.len(), 1, "{out}");
    assert_eq!(overlap[0].split_whitespace().nth(1).map(|g| g.split(',').count()), Some(2), "{out}");
}

/// Steps with their own CPUs and memory inside an allocation, as Slurm 22.05 with
/// `CR_Core_Memory` gives them (each case checked on the peer): a plain step holds all of the
/// job's CPUs and memory on its node, so the next waits ("step creation temporarily
/// disabled"); `--exact` steps with `--mem` run side by side, each seeing its own CPUs in
/// `SLURM_CPUS_ON_NODE`; asking more than the job has is refused in Slurm's words; and a step's
/// cgroup holds its own memory limit, which the kernel enforces below the job's.
const SHARES: &str = r#"#!/bin/sh
#SBATCH -N 1
#SBATCH -n 2
#SBATCH --mem=256M
upto() { i=0; while ! eval "$1"; do sleep 0.1; i=$((i+1)); [ $i -gt 600 ] && return 1; done; }
srun -n1 sh -c 'touch a.held; while [ ! -e a.go ]; do sleep 0.1; done' &
upto '[ -e a.held ]'
srun -n1 --exact true 2> plain.err &
second=$!
upto 'grep -q "temporarily disabled" plain.err 2>/dev/null'
echo "plain waited: $(grep -c 'temporarily disabled' plain.err)"
touch a.go; wait $second; echo "plain second=$?"; wait
for s in 1 2; do
  srun -n1 --exact --mem=100M sh -c 'echo "packed cpus=$SLURM_CPUS_ON_NODE"; touch b.$SLURM_STEP_ID; i=0; while [ $(ls b.* | wc -l) -lt 2 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo "together=$(ls b.* | wc -l)"' &
done
wait
srun -n3 true; echo "toomanycpus=$?"
srun --mem=300M true; echo "toomuchmem=$?"
srun -n1 -c2 sh -c 'echo "c2 cpus=$SLURM_CPUS_ON_NODE"'
srun -n1 --exact --mem=64M sh -c 'p=$(grep :memory: /proc/self/cgroup | cut -d: -f3); v2=$(grep ^0:: /proc/self/cgroup | cut -d: -f3); echo "limit=$(cat /sys/fs/cgroup/memory$p/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup$v2/memory.max 2>/dev/null || echo none)"'
srun -n1 --exact --mem=32M sh -c 'head -c 200000000 /dev/zero | tail -c 150000000 > /dev/null; echo hog=$?'
srun -n1 -J named true
srun -n1 -t 0:2 sh -c 'trap "echo got TERM; exit 3" TERM; sleep 100 & wait' 2> limit.err; echo "limited=$?"
"#;

#[test]
fn steps_hold_their_own_cpus_and_memory_inside_an_allocation() {
    let c = TestCluster::up(&["--nodes", "1"]);
    let id = sbatch(&c, "shares.sh", SHARES);
    let job = c.wait_final(id, Duration::from_secs(180));
    let out = std::fs::read_to_string(c.work.join(format!("slurm-{id}.out"))).unwrap_or_default();
    assert!(out.contains("plain waited: 1") && out.contains("plain second=0"), "{out}\n{}", c.logs());
    assert_eq!(lines_with(&out, "packed cpus=1").len(), 2, "{out}");
    assert_eq!(lines_with(&out, "together=2").len(), 2, "two --exact steps of 100M ran at once: {out}");
    assert!(
        out.contains("srun: error: Unable to create step for job") && out.contains("More processors requested than permitted"),
        "{out}"
    );
    assert!(out.contains("toomanycpus=1") && out.contains("toomuchmem=1"), "{out}");
    assert!(out.contains("Memory required by task is not available"), "{out}");
    assert!(out.contains("c2 cpus=2"), "{out}");
    // `-t`: past it slurmstepd's words on the step's stderr, then SIGTERM (checked on the peer:
    // `*** STEP 40.0 ON vm CANCELLED AT 2026-12-05T05:32:28 DUE TO TIME LIMIT ***`, then the
    // task's trap, srun's rc the task's).
    assert!(out.contains("got TERM") && out.contains("limited=3"), "{out}");
    let limit_err = std::fs::read_to_string(c.work.join("limit.err")).unwrap_or_default();
    assert!(limit_err.contains("slurmstepd-n1: error: *** STEP ") && limit_err.contains(" ON n1 CANCELLED AT "), "{limit_err}");
    assert!(limit_err.contains(" DUE TO TIME LIMIT ***"), "{limit_err}");
    let names = c.shim("sacct", &["-j", &id.to_string(), "-P", "-n", "-o", "JobName"], &[]);
    assert!(String::from_utf8_lossy(&names.stdout).lines().any(|l| l == "named"), "-J names the step in sacct");
    let log = corral_tests::node_log(&c, "n1");
    if log.contains("missing=") && log.contains("\"memory\"") {
        eprintln!("this host has no memory controller for jobs: step memory limits are not enforced here");
        return;
    }
    assert!(out.contains(&format!("limit={}", 64u64 << 20)), "the step's cgroup has its own limit: {out}");
    assert!(out.contains("hog=137"), "past its step's limit the kernel killed it, within the job's: {out}");
    // A process of the job was OOM-killed: the job says so, as one past its own limit.
    assert_eq!(job["state"], "OUT_OF_MEMORY", "{job}");
}

/// `sacct` shows a batch job's script as `ID.batch`, its allocation as `ID.extern` and each
/// step as `ID.N`, with its command's name, nodes, state and exit code as the log recorded
/// them, from any node; `-X` shows the allocation alone. `sacct --json -j ID` prints the same
/// job and steps as Slurm 22.05's `dbv0.0.38` objects.
#[test]
fn sacct_shows_the_batch_script_and_each_step_with_its_own_state_and_exit_code() {
    let c = TestCluster::up(&["--nodes", "2", "--voters-max", "1", "--gpus", "h100:1"]);
    let id = sbatch(
        &c,
        "steps.sh",
        "#!/bin/sh\n#SBATCH -N2\nsrun -N2 -n2 hostname\nsrun -N1 -n1 sh -c 'exit 3'\nsrun -N1 -n2 -O true\nexit 0\n",
    );
    completed_output(&c, id, 60);
    // The script's node (the job's first) runs the one-node steps.
    let first = c.job(id)["node"].as_str().unwrap_or_default().to_string();
    let sacct = |args: &[&str]| String::from_utf8_lossy(&c.shim("sacct", args, &[]).stdout).into_owned();
    let id_s = id.to_string();
    let expected = format!(
        "{id}|steps.sh|2|n[1-2]|COMPLETED|0:0\n\
         {id}.batch|batch|1|{first}|COMPLETED|0:0\n\
         {id}.extern|extern|2|n[1-2]|COMPLETED|0:0\n\
         {id}.0|hostname|2|n[1-2]|COMPLETED|0:0\n\
         {id}.1|sh|1|{first}|FAILED|3:0\n\
         {id}.2|true|1|{first}|COMPLETED|0:0\n"
    );
    let fields = "JobID,JobName,NNodes,NodeList,State,ExitCode";
    let mut last = String::new();
    // A step's end reaches the log from each of its nodes, after the job's own end at times.
    wait_until("every step's end in sacct", Duration::from_secs(20), || {
        last = sacct(&["-j", &id_s, "-P", "-n", "-o", fields]);
        last == expected
    });
    assert_eq!(last, expected);
    assert_eq!(sacct(&["-j", &id_s, "-X", "-P", "-n", "-o", "JobID,State"]), format!("{id}|COMPLETED\n"));

    // --json: the same job and steps; the format options are ignored, as in Slurm.
    let text = sacct(&["--json", "-j", &id_s, "-o", "JobID"]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("sacct --json: {e}\n{text}"));
    assert_eq!((&v["errors"], &v["meta"]["plugin"]["type"]), (&serde_json::json!([]), &serde_json::json!("openapi/v0.0.38")), "{text}");
    let jobs = v["jobs"].as_array().map(Vec::as_slice).unwrap_or_default();
    assert_eq!(jobs.len(), 1, "{text}");
    let job = &jobs[0];
    assert_eq!(
        (job["job_id"].as_u64(), job["name"].as_str(), job["nodes"].as_str()),
        (Some(id), Some("steps.sh"), Some("n[1-2]")),
        "{job}"
    );
    assert_eq!(job["state"]["current"], "COMPLETED", "{job}");
    assert_eq!(job["exit_code"], serde_json::json!({"status": "SUCCESS", "return_code": 0}), "{job}");
    let steps: Vec<(String, String, String)> = job["steps"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| (s["step"]["id"].to_string().trim_matches('"').to_string(), s["state"].to_string(), s["exit_code"]["status"].to_string()))
        .collect();
    let step = |id: &str, state: &str| (id.to_string(), format!("\"{state}\""), "\"SUCCESS\"".to_string());
    // 22.05 prints any normal exit as SUCCESS (WIFEXITED), step 1's `exit 3` too.
    assert_eq!(
        steps,
        [step("batch", "COMPLETED"), step("extern", "COMPLETED"), step("0", "COMPLETED"), step("1", "FAILED"), step("2", "COMPLETED")],
        "{job}"
    );
    assert_eq!(job["steps"][1]["nodes"]["list"], serde_json::json!(["n1", "n2"]), "{job}");
    // -X: the job alone.
    let v: serde_json::Value = serde_json::from_str(&sacct(&["--json", "-X", "-j", &id_s])).expect("sacct --json -X");
    assert_eq!(v["jobs"][0]["steps"], serde_json::json!([]));
}

/// `sstat` (issue 18): what a running 2-node step's 4 tasks use, read from `/proc` on each node
/// and gathered per step as Slurm 22.05 prints it (fields, order and widths checked against the
/// peer, whose gatherer is `jobacct_gather/none`, so its values are empty there).
#[test]
fn sstat_shows_what_the_running_steps_tasks_use() {
    let c = TestCluster::up(&["--nodes", "2"]);
    // Each task touches 64 MiB, burns 2 s of CPU, then waits for the test.
    let script = "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\nsrun python3 -c \"\nimport os, time\nx = bytearray(64 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\nt = time.process_time()\nwhile time.process_time() - t < 2: pass\nwhile not os.path.exists('stop'): time.sleep(0.1)\"\n";
    let id = sbatch(&c, "usage.sh", script);
    let fields = "-o JobID,NTasks,MaxRSS,MaxRSSNode,MaxRSSTask,MinCPU,AveCPU -P -n";
    let mut shown = String::new();
    wait_until("every task to have burnt its CPU", Duration::from_secs(60), || {
        shown = shell(&c, &format!("sstat -j {id} {fields}")).0;
        shown.trim().split('|').nth(5).is_some_and(|min_cpu| min_cpu >= "00:00:02")
    });
    let cells: Vec<&str> = shown.trim().split('|').collect();
    assert_eq!((cells[0], cells[1]), (format!("{id}.0").as_str(), "4"), "{shown}");
    assert!(cells[2].ends_with('M') && cells[2].trim_end_matches('M').parse::<f64>().is_ok_and(|m| m >= 64.0), "MaxRSS: {shown}");
    assert!(["n1", "n2"].contains(&cells[3]) && ["0", "1", "2", "3"].contains(&cells[4]), "{shown}");
    let (all, _, _) = shell(&c, &format!("sstat -j {id} -a -o JobID,NTasks -P -n"));
    assert_eq!(all, format!("{id}.batch|1\n{id}.0|4\n"));
    let (header, _, _) = shell(&c, &format!("sstat -j {id}"));
    assert!(header.starts_with("JobID         MaxVMSize  MaxVMSizeNode  MaxVMSizeTask  AveVMSize     MaxRSS "), "{header}");
    let (_, err, code) = shell(&c, "sstat -j 999");
    assert_eq!((err.trim(), code), ("sstat: error: couldn't get steps for job 999", Some(1)));
    std::fs::write(c.work.join("stop"), "").expect("write stop");
    completed_output(&c, id, 60);
}

/// A job of a node range prints what it got, then runs a step on every node of it.
const RANGE: &str = r#"#!/bin/sh
#SBATCH -N 2-4
#SBATCH --gres=gpu:8
echo "nnodes=$SLURM_NNODES num=$SLURM_JOB_NUM_NODES list=$SLURM_NODELIST tasks=$SLURM_TASKS_PER_NODE"
srun sh -c 'echo "task $SLURM_PROCID on $SLURMD_NODENAME of $SLURM_STEP_NUM_NODES"'
"#;

#[test]
fn a_node_range_starts_on_the_nodes_free_then_and_every_view_counts_them() {
    let c = TestCluster::up(&["--nodes", "4", "--gpus", "h100:8"]);
    // One GPU of n4 busy: three nodes are whole.
    let out = c.shim("sbatch", &["--parsable", "-w", "n4", "--gres=gpu:1", "--wrap", "sleep 600"], &[]);
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let busy: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("a job id");
    wait_until("the 1-GPU job to run on n4", Duration::from_secs(30), || c.job(busy)["state"] == "RUNNING");
    let id = sbatch(&c, "range.sh", RANGE);
    let out = completed_output(&c, id, 90);
    assert_eq!(lines_with(&out, "nnodes="), vec!["nnodes=3 num=3 list=n[1-3] tasks=1(x3)".to_string()], "{out}");
    let tasks = lines_with(&out, "task ");
    assert_eq!(tasks, vec!["task 0 on n1 of 3", "task 1 on n2 of 3", "task 2 on n3 of 3"], "{out}");
    let sacct = c.shim("sacct", &["-X", "-P", "-n", "-o", "NNodes,ReqNodes,NodeList,AllocTRES", "-j", &id.to_string()], &[]);
    assert_eq!(String::from_utf8_lossy(&sacct.stdout), "3|2|n[1-3]|billing=3,cpu=3,gres/gpu=24,mem=384G,node=3\n");
    let cancel = c.shim("scancel", &[&busy.to_string()], &[]);
    assert!(cancel.status.success());
}
