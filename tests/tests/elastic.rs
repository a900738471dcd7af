//! Issue 43: elastic torchrun (`--nnodes=2:2 --rdzv_backend=c10d`, real torch 2.15 on CPU with
//! gloo) across the loss of a worker node, with a spare node and, in the same run, without one
//! (the gang requeued whole); and across the loss of rank 0 with a spare, the gang meeting at a
//! c10d store off its nodes (`--rdzv-endpoint`: rank 0 hosts no rendezvous, so it is repaired),
//! and in the job's own store, which its nodes serve (`--rdzv-endpoint=corral`). A node's
//! `corrald` and its job processes are SIGKILLed mid-training. Measured: the time from the kill
//! to the spare's part starting and to the first training step after it, and the steps lost.
//! Asserted: with the spare, the survivor's torchrun is never restarted by Corral; both ways,
//! the final weights equal an uninterrupted run's (the training script is deterministic, its
//! gradient averaged over the world).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use corral_tests::{corral_bin, now_ms, pyenv, wait_until_or_show, TestCluster};
use serde_json::Value;

const TRAIN: &str = include_str!("../fixtures/torch/elastic_train.py");
const STORE_OPS: &str = include_str!("../fixtures/torch/store_ops.py");
const STEPS: u64 = 60;

/// A 2-node command gang: each node appends "NODE RANK PID START_MS" to `parts.txt`, then
/// becomes the node's torchrun agent; `OPTIONS` are more `#SBATCH` lines. The dev nodes share one
/// host, where every node would take `MASTER_ADDR` for its own and the first to bind would host
/// the rendezvous store: rank 0's node is told it is the host (`is_host`), as on real machines.
/// torch ranks agents by (address, pid); on one host the pid decides, so rank 1 starts its agent
/// a second later, as a child: the survivor is always torch's rank 0, the case where a joiner
/// waited for a store address torch never published (`launcher::TORCH_UNSHARED_STORE_ENV`).
const JOB: &str = "#!/bin/sh
#SBATCH -N 2
#SBATCH --gres=gpu:1
#SBATCH -x LEADER
OPTIONS
echo \"$CORRAL_NODE $CORRAL_NODE_RANK $$ $(date +%s%3N)\" >> parts.txt
if [ \"$CORRAL_NODE_RANK\" = 0 ]; then host=1; else host=0; sleep 1; fi
torchrun --nnodes=2:2 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT \\
  --rdzv_conf=is_host=$host --rdzv_id=$CORRAL_JOB_ID --max_restarts=5 elastic_train.py &
wait $!
";

/// A 2-node command gang with a spare whose torchrun agents meet at a c10d store off the job's
/// nodes (`--rdzv-endpoint`, read by torchrun as `PET_RDZV_ENDPOINT`; no agent hosts it).
const JOB_OFF_NODES: &str = "#!/bin/sh
#SBATCH -N 2
#SBATCH --gres=gpu:1
#SBATCH -x LEADER
#SBATCH --spare-nodes=1
OPTIONS
echo \"$CORRAL_NODE $CORRAL_NODE_RANK $$ $(date +%s%3N)\" >> parts.txt
torchrun --nnodes=2:2 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_conf=is_host=0 --rdzv_id=$CORRAL_JOB_ID \\
  --max_restarts=5 elastic_train.py &
wait $!
";

/// A 2-node command gang with a spare and torchrun's defaults alone: its agents meet in the
/// job's store, which every node of the job serves (`--rdzv-endpoint=corral`: torchrun reads
/// `PET_RDZV_ENDPOINT`, `PET_RDZV_BACKEND`).
const JOB_IN_CORRAL: &str = "#!/bin/sh
#SBATCH -N 2
#SBATCH --gres=gpu:1
#SBATCH -x LEADER
#SBATCH --spare-nodes=1
#SBATCH --rdzv-endpoint=corral
OPTIONS
echo \"$CORRAL_NODE $CORRAL_NODE_RANK $$ $(date +%s%3N)\" >> parts.txt
torchrun --nnodes=2:2 --nproc_per_node=1 --max_restarts=5 elastic_train.py &
wait $!
";

/// A c10d store (torch's `TCPStore`) in a process of its own on this host, as on a login node:
/// the rendezvous of a gang that meets off its nodes. Killed when dropped.
struct Store {
    child: std::process::Child,
    port: u16,
}

impl Store {
    fn start(py: &Path) -> Store {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
        let code = "import sys, time\nfrom datetime import timedelta\nfrom torch.distributed import TCPStore\n\
            s = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, multi_tenant=True, wait_for_workers=False, timeout=timedelta(seconds=600))\n\
            print('up', flush=True)\nwhile True: time.sleep(3600)\n";
        let mut child = Command::new(py.join("bin/python"))
            .args(["-c", code, &port.to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the store");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("the store's stdout");
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).expect("read the store's first line");
        assert_eq!(line.trim(), "up", "the store started");
        Store { child, port }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Elastic {
    c: TestCluster,
    path: String,
    leader: String,
}

/// What one loss cost.
#[derive(Debug)]
struct Loss {
    job: Value,
    /// From the kill to the part started on another node (the spare, or the requeued gang).
    restarted_ms: u64,
    /// From the kill to the first training step completed after it.
    stepping_ms: u64,
    steps_lost: u64,
    final_weights: Value,
    /// (node, pid) of each part start.
    parts: Vec<(String, u32, u64)>,
}

impl Elastic {
    /// A 4-node cluster of one GPU each with the training script written, and the weights an
    /// uninterrupted run ends with.
    fn up(py: &Path) -> (Elastic, Value) {
        let c = TestCluster::up(&["--nodes", "4", "--gpus", "h100:1"]);
        let path = format!("{}:{}", py.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        std::fs::write(c.work.join("elastic_train.py"), TRAIN).expect("write the training script");
        let leader = c.leader();
        let e = Elastic { c, path, leader };
        let expected = reference(py, &e.c.work);
        (e, expected)
    }

    fn submit(&self, name: &str, options: &str) -> u64 {
        self.submit_job(name, JOB, options)
    }

    fn submit_job(&self, name: &str, template: &str, options: &str) -> u64 {
        let script = template.replace("LEADER", &self.leader).replace("OPTIONS", options);
        std::fs::write(self.c.work.join(name), script).expect("write the job");
        let out = Command::new(corral_bin())
            .args(["--cluster", self.c.path_str(), "submit", name])
            .current_dir(&self.c.work)
            .env("PATH", &self.path)
            .env("ELASTIC_STEPS", STEPS.to_string())
            .output()
            .expect("run corral submit");
        assert!(out.status.success(), "submit: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).split_whitespace().last().and_then(|w| w.parse().ok()).expect("a job id")
    }

    /// Waits for `done`; on a timeout, fails with the job's output and the parts started.
    fn wait(&self, job: u64, what: &str, patience: Duration, done: impl FnMut() -> bool) {
        wait_until_or_show(what, patience, done, || {
            let out = std::fs::read_to_string(self.c.work.join(format!("slurm-{job}.out"))).unwrap_or_default();
            let tail: Vec<&str> = out.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
            let steps: Vec<_> = self.steps(job).into_iter().rev().take(6).collect();
            format!("{}\nparts: {:?}\nsteps: {steps:?}\n{}", tail.join("\n"), self.parts(0), self.c.job(job))
        });
    }

    fn checkpoints(&self, job: u64) -> PathBuf {
        self.c.path().join("checkpoints").join(format!("job-{job}"))
    }

    /// (step, world, unix ms) of every step each rank logged.
    fn steps(&self, job: u64) -> Vec<(u64, u64, u64)> {
        let text = std::fs::read_to_string(self.checkpoints(job).join("steps.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((f.first()?.parse().ok()?, f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
            })
            .collect()
    }

    fn parts(&self, since_ms: u64) -> Vec<(String, u32, u64)> {
        let text = std::fs::read_to_string(self.c.work.join("parts.txt")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                Some((f.first()?.to_string(), f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
            })
            .filter(|p| p.2 >= since_ms)
            .collect()
    }

    /// Runs `job` until it trained 10 steps, SIGKILLs its rank-1 node's corrald and job
    /// processes, and follows it to its end.
    fn lose_a_worker(&self, job: u64, submitted_ms: u64) -> Loss {
        self.lose_rank(job, submitted_ms, 1)
    }

    /// [`Elastic::lose_a_worker`], of the node of `rank`.
    fn lose_rank(&self, job: u64, submitted_ms: u64, rank: usize) -> Loss {
        self.wait(job, "10 training steps", Duration::from_secs(120), || self.steps(job).iter().any(|s| s.0 >= 10));
        let worker = self.c.job(job)["nodes"][rank].as_str().map(str::to_string).expect("the rank's node");
        let killed_ms = now_ms();
        self.c.signal(&worker, "KILL");
        kill_job_processes(&self.checkpoints(job), &worker);
        let before = self.steps(job).iter().filter(|s| s.2 <= killed_ms).map(|s| s.0).max().unwrap_or(0);
        self.wait(job, "a part to start elsewhere", Duration::from_secs(60), || self.parts(killed_ms).iter().any(|p| p.0 != worker));
        let restarted_ms = self.parts(killed_ms).iter().map(|p| p.2).min().unwrap_or(killed_ms) - killed_ms;
        self.wait(job, "training to step again", Duration::from_secs(120), || self.steps(job).iter().any(|s| s.2 > killed_ms));
        let after: Vec<(u64, u64, u64)> = self.steps(job).into_iter().filter(|s| s.2 > killed_ms).collect();
        let first = after.iter().min_by_key(|s| s.2).copied().expect("a step after the kill");
        let final_state = self.c.wait_final(job, Duration::from_secs(180));
        assert_eq!(final_state["state"], "COMPLETED", "{final_state}");
        let text = std::fs::read_to_string(self.checkpoints(job).join("final.json")).expect("final.json");
        let final_json: Value = serde_json::from_str(&text).expect("parse final.json");
        Loss {
            job: final_state,
            restarted_ms,
            stepping_ms: first.2 - killed_ms,
            steps_lost: before.saturating_sub(first.0.saturating_sub(1)),
            final_weights: final_json["weights"].clone(),
            parts: self.parts(submitted_ms),
        }
    }
}

/// SIGKILLs every process of a job that runs as part of it on `node` (as the node's power
/// would): those whose environment names both the job's checkpoint directory (its cluster's own:
/// another test's cluster on this host has jobs of the same ids on nodes of the same names) and
/// the node.
fn kill_job_processes(checkpoints: &Path, node: &str) {
    let (want_job, want_node) = (format!("CORRAL_CHECKPOINT_DIR={}", checkpoints.display()), format!("CORRAL_NODE={node}"));
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        if vars.contains(&want_job.as_bytes()) && vars.contains(&want_node.as_bytes()) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The final weights of the same steps in one uninterrupted process.
fn reference(py: &Path, dir: &Path) -> Value {
    let out = Command::new(py.join("bin/python"))
        .args([&dir.join("elastic_train.py").display().to_string(), "--reference", &dir.display().to_string()])
        .env("ELASTIC_STEPS", STEPS.to_string())
        .output()
        .expect("run the reference");
    assert!(out.status.success(), "reference: {}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(dir.join("final.json")).expect("reference final.json");
    serde_json::from_str::<Value>(&text).expect("parse")["weights"].clone()
}

#[test]
fn elastic_torchrun_survives_a_worker_node_loss_on_a_spare_and_ends_as_an_uninterrupted_run() {
    let Some(py) = pyenv() else { return };
    let (e, expected) = Elastic::up(&py);

    let t0 = now_ms();
    let spared = e.submit("spare.sh", "#SBATCH --spare-nodes=1");
    let with_spare = e.lose_a_worker(spared, t0);
    let survivor = with_spare.job["nodes"][0].as_str().unwrap_or_default().to_string();
    assert_eq!(
        (with_spare.job["restart_count"].as_u64(), with_spare.job["repairs"].as_array().map(Vec::len)),
        (Some(0), Some(1)),
        "{with_spare:?}"
    );
    assert_eq!(
        with_spare.parts.iter().filter(|p| p.0 == survivor).count(),
        1,
        "Corral never restarted the survivor's torchrun: {with_spare:?}"
    );
    assert!(with_spare.steps_lost <= 1, "{with_spare:?}");
    assert_eq!(with_spare.final_weights, expected, "the repaired run ends as an uninterrupted one");

    // The same loss without a spare: the gang is requeued whole (the lost node is brought back
    // first, so two nodes besides the leader remain after the next kill).
    let lost = with_spare.job["repairs"][0]["lost"].as_str().unwrap_or_default().to_string();
    e.c.start(&lost);
    let t1 = now_ms();
    let requeued = e.submit("requeue.sh", "#SBATCH --requeue");
    let without = e.lose_a_worker(requeued, t1);
    assert_eq!(without.job["restart_count"].as_u64(), Some(1), "{without:?}");
    assert!(without.steps_lost <= 1, "{without:?}");
    assert_eq!(without.final_weights, expected, "the requeued run resumes from its checkpoint to the same end");
    eprintln!(
        "worker node lost at step >= 10 of {STEPS}: with a spare, rank 1 started on it {} ms after the kill, training stepped again after {} ms, {} steps lost, survivor never restarted; requeued whole, the gang started again after {} ms, training stepped again after {} ms, {} steps lost",
        with_spare.restarted_ms, with_spare.stepping_ms, with_spare.steps_lost, without.restarted_ms, without.stepping_ms, without.steps_lost
    );
}

#[test]
fn elastic_torchrun_meeting_off_its_nodes_survives_losing_rank_0_on_a_spare() {
    let Some(py) = pyenv() else { return };
    let store = Store::start(&py);
    let options = format!("#SBATCH --rdzv-endpoint=127.0.0.1:{}", store.port);
    lose_rank_0_on_a_spare(&py, JOB_OFF_NODES, &options, "at a store off its nodes");
}

#[test]
fn elastic_torchrun_meeting_in_the_jobs_corral_store_survives_losing_rank_0_on_a_spare() {
    let Some(py) = pyenv() else { return };
    lose_rank_0_on_a_spare(&py, JOB_IN_CORRAL, "", "in its Corral store");
}

/// Runs `template` (a gang with a spare that meets `where_`) until it trained 10 steps, kills
/// rank 0's node, and checks that rank 0 moved to the spare while the survivor kept running, and
/// that the run ended as an uninterrupted one.
fn lose_rank_0_on_a_spare(py: &Path, template: &str, options: &str, where_: &str) {
    let (e, expected) = Elastic::up(py);
    let t0 = now_ms();
    let job = e.submit_job("rank0.sh", template, options);
    e.wait(job, "10 training steps", Duration::from_secs(120), || e.steps(job).iter().any(|s| s.0 >= 10));
    let nodes = e.c.job(job)["nodes"].clone();
    let loss = e.lose_rank(job, t0, 0);
    let survivor = nodes[1].as_str().unwrap_or_default().to_string();
    let repair = &loss.job["repairs"][0];
    assert_eq!((loss.job["restart_count"].as_u64(), repair["rank"].as_u64()), (Some(0), Some(0)), "{loss:?}");
    assert_eq!(loss.job["nodes"][1].as_str(), Some(survivor.as_str()), "{loss:?}");
    assert_eq!(loss.parts.iter().filter(|p| p.0 == survivor).count(), 1, "Corral never restarted the survivor's torchrun: {loss:?}");
    assert!(loss.steps_lost <= 1, "{loss:?}");
    assert_eq!(loss.final_weights, expected, "the run repaired at rank 0 ends as an uninterrupted one");
    eprintln!(
        "rank 0 lost at step >= 10 of {STEPS}, the gang meeting {where_}: rank 0 started on the spare {} ms after the kill, training stepped again after {} ms, {} steps lost, survivor never restarted",
        loss.restarted_ms, loss.stepping_ms, loss.steps_lost
    );
}

/// torch's own `TCPStore` client, on both nodes of a job, against the job's store (every
/// operation torch has, a wait for another node's write and a wait cancelled on its timeout).
#[test]
fn torchs_store_client_gets_torchs_answers_from_the_jobs_store_across_its_nodes() {
    let Some(py) = pyenv() else { return };
    let (e, _) = Elastic::up(&py);
    std::fs::write(e.c.work.join("store_ops.py"), STORE_OPS).expect("write the store script");
    let template = "#!/bin/sh\n#SBATCH -N 2\n#SBATCH --rdzv-endpoint=corral\nOPTIONS\nexec python store_ops.py\n";
    let job = e.submit_job("ops.sh", template, "");
    let end = e.c.wait_final(job, Duration::from_secs(120));
    let out = std::fs::read_to_string(e.c.work.join(format!("slurm-{job}.out"))).unwrap_or_default();
    assert_eq!(end["state"], "COMPLETED", "{end}\n{out}");
    let seen = |rank: u32| -> Value {
        let text = std::fs::read_to_string(e.c.work.join(format!("store-{rank}.json"))).expect("what a rank saw");
        serde_json::from_str(&text).expect("parse it")
    };
    let (first, second) = (seen(0), seen(1));
    assert_eq!(
        (&first["cas_absent"], &first["cas_new"], &first["cas_refused"], &first["deleted"], &first["deleted_again"]),
        (&Value::from("x"), &Value::from("y"), &Value::from("y"), &Value::from(true), &Value::from(false)),
        "{first}"
    );
    assert_eq!(
        (&second["greeting"], &second["log"], &second["multi"], &second["check"]),
        (&Value::from("hello"), &Value::from("ab"), &serde_json::json!(["hello", "1"]), &serde_json::json!([true, false])),
        "{second}"
    );
    assert_eq!((&second["wait_timed_out"], &second["after_cancel"]), (&Value::from(true), &Value::from("hello")), "{second}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(second["stranger"], "refused", "another user's process gets no answer: {second}");
    }
    let added: Vec<u64> = [&first, &second].iter().filter_map(|s| s["added"].as_u64()).collect();
    assert!(added == [1, 3] || added == [3, 2], "each add answers the sum so far: {added:?}");
    for s in [&first, &second] {
        // greeting, cas, log, m1, ready0, counter, done0, done1
        assert_eq!((s["counter"].as_u64(), s["num_keys"].as_u64()), (Some(3), Some(8)), "{s}");
    }
    for (rank, s) in [&first, &second].iter().enumerate() {
        let ms = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
        eprintln!(
            "rank {rank}: add {:.2} ms, get {:.2} ms in the job's store (debug corrald, through the leader); {:.3} / {:.3} ms in torch's own (ratio {:.0}x / {:.0}x)",
            ms("corral_add_ms"),
            ms("corral_get_ms"),
            ms("torch_add_ms"),
            ms("torch_get_ms"),
            ms("corral_add_ms") / ms("torch_add_ms"),
            ms("corral_get_ms") / ms("torch_get_ms")
        );
    }
}
