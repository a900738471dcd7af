//! Issue 15 end to end: the seed job scripts run unchanged with the real programs users run
//! (torch 2.15's `torchrun` and a gloo program, torch checkpoints, a real `python`), on a
//! `corral dev up` cluster through the `sbatch` shim. The Python environment comes from
//! `scripts/setup-clients.sh` (a venv outside the clone, `CORRAL_PYENV`, default
//! `/var/tmp/corral-pyenv`), which `scripts/test.sh` runs first.
//!
//! `train_fsdp.sbatch` as written (4 nodes of 8 torch workers: 36 torch processes on this
//! host) is `#[ignore]`d in the default suite; `scripts/test-heavy.sh` runs it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use corral_tests::{pyenv, wait_until, TestCluster};
use serde_json::Value;

const TRAIN_FSDP_SBATCH: &str = include_str!("../fixtures/seed/train_fsdp.sbatch");
const REQUEUE_SBATCH: &str = include_str!("../fixtures/seed/requeue.sbatch");
const HPARAM_ARRAY_SBATCH: &str = include_str!("../fixtures/seed/hparam_array.sbatch");
const DEEPSPEED_SBATCH: &str = include_str!("../fixtures/seed/deepspeed_zero3.sbatch");
const TRAIN_FSDP_PY: &str = include_str!("../fixtures/torch/train_fsdp.py");
const TRAIN_PY: &str = include_str!("../fixtures/torch/train.py");
const LIGHTNING_PY: &str = include_str!("../fixtures/torch/lightning_ddp.py");
const SUBMITIT_PY: &str = include_str!("../fixtures/torch/submitit_check.py");
const DASK_PY: &str = include_str!("../fixtures/torch/dask_check.py");

/// One test of this file at a time: each cluster's jobs take rendezvous ports from the same
/// range on this one host (29500 up), and torch processes fill both cores anyway.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A dev cluster whose jobs find the shims and the venv's `python` and `torchrun` on `PATH`.
struct Clients {
    cluster: TestCluster,
    path: String,
    results: PathBuf,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Clients {
    fn up(nodes: &str, pyenv: &Path) -> Clients {
        // A test that failed holding it poisoned it; the next still runs alone.
        let serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let cluster = TestCluster::up(&["--nodes", nodes, "--gpus", "h100:8"]);
        let shims = cluster.path().join("shims");
        let out = cluster.raw(&["install-slurm-shims", shims.to_str().expect("utf-8 path")]);
        assert!(out.status.success(), "install-slurm-shims: {}", String::from_utf8_lossy(&out.stderr));
        let path = format!("{}:{}:{}", shims.display(), pyenv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        let results = cluster.work.join("results");
        std::fs::create_dir_all(&results).expect("create results dir");
        let programs = [
            ("train_fsdp.py", TRAIN_FSDP_PY),
            ("train.py", TRAIN_PY),
            ("lightning_ddp.py", LIGHTNING_PY),
            ("submitit_check.py", SUBMITIT_PY),
            ("dask_check.py", DASK_PY),
        ];
        for (name, text) in programs {
            std::fs::write(cluster.work.join(name), text).expect("write program");
        }
        Clients { cluster, path, results, _serial: serial }
    }

    fn slurm(&self, cmd: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(self.cluster.path().join("shims").join(cmd))
            .args(args)
            .current_dir(&self.cluster.work)
            .env("PATH", &self.path)
            .env("CORRAL_CLUSTER", self.cluster.path())
            .env("RESULT_DIR", &self.results)
            .envs(env.iter().copied())
            .env_remove("SLURM_JOB_ID")
            .output()
            .unwrap_or_else(|e| panic!("run {cmd}: {e}"))
    }

    /// `sbatch --parsable` of `text` saved as `name`: the job id.
    fn sbatch(&self, name: &str, text: &str, env: &[(&str, &str)]) -> u64 {
        std::fs::write(self.cluster.work.join(name), text).expect("write script");
        let out = self.slurm("sbatch", &["--parsable", name], env);
        assert!(out.status.success(), "sbatch {name}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or_else(|_| panic!("sbatch printed {:?}", out.stdout))
    }

    /// Runs `python PROGRAM ARGS` from the venv as a user would, with the shims on `PATH`;
    /// its last line of stdout, parsed as JSON.
    fn python_json(&self, program: &str, args: &[&str], patience: Duration) -> Value {
        let out = Command::new("timeout")
            .arg(patience.as_secs().to_string())
            .arg("python")
            .arg(program)
            .args(args)
            .current_dir(&self.cluster.work)
            .env("PATH", &self.path)
            .env("CORRAL_CLUSTER", self.cluster.path())
            .env_remove("SLURM_JOB_ID")
            .output()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{program}: {:?}\n{stdout}\n{stderr}\n{}", out.status, self.cluster.logs());
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).unwrap_or_else(|e| panic!("{program} printed no JSON ({e}): {stdout}\n{stderr}"))
    }

    /// `sbatch` of `text` (as `name`), then its end, which must be COMPLETED: the job id.
    fn sbatch_completed(&self, name: &str, text: &str, env: &[(&str, &str)], patience: Duration) -> u64 {
        let id = self.sbatch(name, text, env);
        let job = self.cluster.wait_final(id, patience);
        assert_eq!(job["state"], "COMPLETED", "{job}\n{}", self.output_of(id));
        id
    }

    fn output_of(&self, job: u64) -> String {
        std::fs::read_to_string(self.cluster.work.join(format!("slurm-{job}.out"))).unwrap_or_default()
    }

    /// The JSON files in `dir` whose names start with `prefix`, by their `rank` field.
    fn results_by_rank(dir: &Path, prefix: &str) -> BTreeMap<u64, Value> {
        let mut out = BTreeMap::new();
        for e in std::fs::read_dir(dir).expect("read results").flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                let v: Value = serde_json::from_str(&std::fs::read_to_string(e.path()).expect("read result")).expect("parse result");
                out.insert(v["rank"].as_u64().expect("rank"), v);
            }
        }
        out
    }

    /// What `train_fsdp.py` wrote for `job` in `dir`, by global rank.
    fn fsdp_results_in(dir: &Path, job: u64) -> BTreeMap<u64, Value> {
        Clients::results_by_rank(dir, &format!("train_fsdp.{job}."))
    }

    /// What `lightning_ddp.py` wrote for run `restart` of `job`, by global rank.
    fn lightning_results(&self, job: u64, restart: u32) -> BTreeMap<u64, Value> {
        Clients::results_by_rank(&self.results, &format!("lightning.{job}.{restart}."))
    }

    fn fsdp_results(&self, job: u64) -> BTreeMap<u64, Value> {
        Clients::fsdp_results_in(&self.results, job)
    }

    fn assert_fsdp_world(&self, job: u64, nodes: usize, per_node: usize) {
        self.assert_fsdp_world_in(&self.results, job, nodes, per_node)
    }

    /// Checks one `train_fsdp.py` run of `job` (results in `dir`): `nodes` nodes of `per_node`
    /// workers each formed one world, every node with its own node rank, on the job's nodes.
    fn assert_fsdp_world_in(&self, dir: &Path, job: u64, nodes: usize, per_node: usize) {
        let world = nodes * per_node;
        let got = Clients::fsdp_results_in(dir, job);
        let dump = format!("{got:?}\n--- job output\n{}\n{}", self.output_of(job), self.cluster.logs());
        assert_eq!(got.len(), world, "one result per worker: {dump}");
        let sum = (world * (world + 1) / 2) as f64;
        let mut node_ranks: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
        for (rank, v) in &got {
            assert_eq!(v["world"].as_u64(), Some(world as u64), "rank {rank}: {dump}");
            assert_eq!(v["sum"].as_f64(), Some(sum), "rank {rank}: all_reduce: {dump}");
            assert_eq!(v["weights_equal"], true, "rank {rank}: DDP replicas differ: {dump}");
            assert_eq!(v["local_rank"].as_u64(), Some(rank % per_node as u64), "{dump}");
            assert_eq!(v["group_rank"].as_u64(), Some(rank / per_node as u64), "{dump}");
            node_ranks.entry(v["group_rank"].as_u64().expect("group rank")).or_default().insert(v["node"].as_str().unwrap_or("").into());
        }
        let masters: BTreeSet<&str> = got.values().filter_map(|v| v["master"].as_str()).collect();
        assert_eq!(masters.len(), 1, "one rendezvous: {dump}");
        // Each node rank ran on one node, and each on its own.
        let names: BTreeSet<String> = node_ranks.values().flatten().cloned().collect();
        assert!(node_ranks.values().all(|n| n.len() == 1), "{dump}");
        assert_eq!(names.len(), nodes, "{dump}");
    }
}

/// `train_fsdp.sbatch`'s shape on 2 nodes of 2 workers: `srun torchrun` on every node of the
/// allocation, `MASTER_ADDR` from `scontrol show hostnames` (a name only the dev cluster's hosts
/// file knows), torchrun's static rendezvous from the `PET_*` variables Corral gives each task.
const TORCHRUN_2X2: &str = r#"#!/bin/bash
#SBATCH --partition=gpu
#SBATCH --nodes=2
#SBATCH --gres=gpu:h100:2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=4

export NCCL_SOCKET_IFNAME=ib0
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
getent hosts $MASTER_ADDR || { echo "cannot resolve $MASTER_ADDR"; exit 9; }

srun torchrun --nnodes=$SLURM_NNODES --nproc_per_node=2 train_fsdp.py
"#;

/// The variant a careful user writes: a c10d rendezvous on the first node's name.
const TORCHRUN_C10D: &str = r#"#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1

export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
srun torchrun --nnodes=2 --nproc_per_node=1 --rdzv_id=$SLURM_JOB_ID --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29400 train_fsdp.py
"#;

#[test]
fn torchrun_through_srun_forms_one_world_across_nodes() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("2", &py);
    let id = c.sbatch_completed("torchrun.sbatch", TORCHRUN_2X2, &[], Duration::from_secs(180));
    c.assert_fsdp_world(id, 2, 2);
    // The name resolved to the first node's address, as getent printed it.
    let out = c.output_of(id);
    let first = c.fsdp_results(id)[&0]["node"].as_str().expect("node").to_string();
    assert!(out.lines().any(|l| l.split_whitespace().eq(["127.0.0.1", first.as_str()])), "{out}");

    let id = c.sbatch_completed("c10d.sbatch", TORCHRUN_C10D, &[], Duration::from_secs(180));
    c.assert_fsdp_world(id, 2, 1);

    // No torchrun: `srun python` tasks rendezvous through env:// on the job's MASTER_ADDR and
    // MASTER_PORT with the RANK, LOCAL_RANK and WORLD_SIZE each task gets.
    let id = c.sbatch_completed("srun_python.sbatch", SRUN_PYTHON, &[], Duration::from_secs(180));
    c.assert_fsdp_world(id, 2, 2);
}

/// torch.distributed without a launcher: two tasks on each of two nodes.
const SRUN_PYTHON: &str = r#"#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2

srun python train_fsdp.py
"#;

#[test]
fn torchrun_on_every_node_of_a_corral_submit_gang() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("2", &py);
    let torchrun = py.join("bin/torchrun");
    // No rendezvous options: torchrun takes the job's from PET_MASTER_ADDR, PET_MASTER_PORT,
    // PET_NNODES and PET_NODE_RANK. The results go to ./results (the job's working directory).
    // With --preflight the nodes' network is measured on the job's port first, then the same
    // port is torchrun's.
    let id = c.cluster.submit(
        &["-N", "2", "--gres", "gpu:1", "--preflight", "--preflight-bytes", "1048576"],
        &[torchrun.to_str().expect("utf-8"), "--nproc_per_node=2", "train_fsdp.py"],
    );
    let job = c.cluster.wait_final(id, Duration::from_secs(180));
    let out = c.cluster.corral(&["logs", &id.to_string()]);
    let err = c.cluster.corral(&["logs", "--stderr", &id.to_string()]);
    assert_eq!(
        job["state"],
        "COMPLETED",
        "{job}\n--- job output (rank 0's node)\n{}\n--- job stderr\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&err.stdout),
        c.cluster.logs()
    );
    c.assert_fsdp_world(id, 2, 2);
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(log.contains("corral preflight: passed on 2 nodes"), "the report opens the output: {log}");
}

#[test]
fn nccl_check_measures_node_pairs_with_a_real_torch_all_reduce() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("3", &py);
    let out = Command::new(corral_tests::corral_bin())
        .args(["--cluster", c.cluster.path_str(), "--json", "nccl-check", "--nodes", "3", "--method", "torch", "--bytes", "4194304"])
        .current_dir(&c.cluster.work)
        .env("PATH", &c.path)
        .output()
        .expect("run corral nccl-check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}\n{}", String::from_utf8_lossy(&out.stderr), c.cluster.logs());
    let v: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!((v["state"].as_str(), v["method"].as_str()), (Some("COMPLETED"), Some("torch")), "{v}");
    let pairs = v["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 2, "rank 0 with each other node: {v}");
    assert!(pairs.iter().all(|p| p["mbps"].as_f64().is_some_and(|m| m > 0.0)), "{v}");
}

#[test]
fn requeue_script_resumes_real_torch_checkpoint_after_its_node_dies() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("3", &py);
    // The same training uninterrupted, for the loss curve a resumed run must reproduce.
    let reference_dir = c.cluster.work.join("reference");
    std::fs::create_dir_all(&reference_dir).expect("create reference dir");
    let out = Command::new(py.join("bin/python"))
        .arg(c.cluster.work.join("train.py"))
        .arg("--from-scratch")
        .current_dir(&reference_dir)
        .env("TRAIN_EPOCH_S", "0")
        .output()
        .expect("run the reference training");
    assert!(out.status.success(), "reference: {}", String::from_utf8_lossy(&out.stderr));
    let reference = losses(&reference_dir.join("losses.txt"));
    assert_eq!(reference.len(), 12);

    let id = c.sbatch("requeue.sbatch", REQUEUE_SBATCH, &[("TRAIN_EPOCH_S", "0.5")]);
    let losses_path = c.cluster.work.join("losses.txt");
    wait_until("three epochs", Duration::from_secs(120), || losses(&losses_path).len() >= 3);
    let node = c.cluster.job(id)["node"].as_str().expect("running job has a node").to_string();
    c.cluster.signal(&node, "KILL");
    let job = c.cluster.wait_final(id, Duration::from_secs(120));
    let dump = format!("{job}\n{}\n{}", c.output_of(id), c.cluster.logs());
    assert_eq!(job["state"], "COMPLETED", "{dump}");
    assert_eq!(job["restart_count"], 1, "{dump}");
    assert_ne!(job["node"].as_str(), Some(node.as_str()), "{dump}");
    // Every epoch once in the curve (the last write of each), equal to the reference bit for bit;
    // the second run started from a checkpoint, not from scratch.
    let lines = std::fs::read_to_string(&losses_path).expect("read losses");
    let resumed_from = lines.lines().find(|l| l.ends_with(" 1")).and_then(|l| l.split(' ').next()).and_then(|e| e.parse::<u32>().ok());
    assert!(resumed_from.is_some_and(|e| e >= 3), "the requeued run resumed at epoch {resumed_from:?}:\n{lines}");
    assert_eq!(losses(&losses_path), reference, "{lines}");
}

/// Epoch to loss, as written (the last line of each epoch wins).
fn losses(path: &Path) -> BTreeMap<u32, String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            Some((f.next()?.parse().ok()?, f.next()?.to_string()))
        })
        .collect()
}

#[test]
fn hparam_array_runs_100_real_python_tasks() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("2", &py);
    for t in 1..=100 {
        let cfg = format!("{{\"lr\": {}, \"steps\": 50}}", 0.001 * t as f64);
        std::fs::write(c.cluster.work.join(format!("hparams_{t}.json")), cfg).expect("write hparams");
    }
    let id = c.sbatch("hparam_array.sbatch", HPARAM_ARRAY_SBATCH, &[]);
    wait_until("100 results", Duration::from_secs(300), || {
        std::fs::read_dir(c.cluster.work.join("results"))
            .map_or(0, |d| d.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".json")).count())
            >= 100
    });
    let mut tasks = BTreeSet::new();
    for t in 1..=100u32 {
        let text = std::fs::read_to_string(c.cluster.work.join(format!("results/{t}.json"))).expect("read result");
        let v: Value = serde_json::from_str(&text).expect("parse result");
        assert_eq!(v["task"].as_u64(), Some(t as u64));
        assert!((v["lr"].as_f64().expect("lr") - 0.001 * t as f64).abs() < 1e-12, "task {t} read another task's config: {v}");
        assert_eq!(v["gpus"].as_str().map(|g| g.split(',').count()), Some(1), "{v}");
        // Plain gradient descent on y = 3x: large enough rates get close.
        if t >= 10 {
            assert!((v["w"].as_f64().expect("w") - 3.0).abs() < 0.05, "task {t}: {v}");
        }
        tasks.insert(t);
    }
    assert_eq!(tasks.len(), 100);
    wait_until("sacct to show 100 COMPLETED tasks", Duration::from_secs(60), || {
        let out = c.slurm("sacct", &["-j", &id.to_string(), "-P", "-n", "--format=JobID,State"], &[]);
        // The tasks' own lines, not their scripts' (`ID_T.batch`).
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.contains('.') && l.ends_with("|COMPLETED")).count() == 100
    });
}

/// The seed scripts here are the shared ones, byte for byte, where `../shared/seed` is at hand.
#[test]
fn seed_fixtures_are_the_shared_scripts_verbatim() {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/seed");
    if !shared.exists() {
        eprintln!("SKIPPED: {} is not beside this clone", shared.display());
        return;
    }
    let scripts = [
        ("train_fsdp.sbatch", TRAIN_FSDP_SBATCH),
        ("requeue.sbatch", REQUEUE_SBATCH),
        ("hparam_array.sbatch", HPARAM_ARRAY_SBATCH),
        ("deepspeed_zero3.sbatch", DEEPSPEED_SBATCH),
    ];
    for (name, text) in scripts {
        assert_eq!(std::fs::read_to_string(shared.join(name)).expect("read shared seed script"), text, "{name}");
    }
}

/// 2-node Lightning DDP through `srun python`, then its SIGUSR1 auto-requeue: an HPC checkpoint,
/// `scontrol requeue` from inside the job, and the requeued job restoring from it.
const LIGHTNING_SBATCH: &str = r#"#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --signal=SIGUSR1@90

srun python lightning_ddp.py
"#;

#[test]
fn lightning_ddp_on_two_nodes_and_its_sigusr1_auto_requeue() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("2", &py);
    let id = c.sbatch_completed("lightning.sbatch", LIGHTNING_SBATCH, &[], Duration::from_secs(240));
    let ranks = c.lightning_results(id, 0);
    assert_eq!(ranks.len(), 2, "{ranks:?}\n{}", c.output_of(id));
    let nodes: BTreeSet<&str> = ranks.values().filter_map(|v| v["node"].as_str()).collect();
    assert_eq!(nodes.len(), 2, "one rank per node: {ranks:?}");
    assert!(ranks.values().all(|v| v["world"] == 2 && v["epochs"] == 3 && v["weight"] == ranks[&0]["weight"]), "{ranks:?}");

    // Slow epochs; SIGUSR1 to the job's tasks (what Slurm sends at --signal's time) once two are done.
    let id = c.sbatch("lightning.sbatch", LIGHTNING_SBATCH, &[("LIGHTNING_EPOCHS", "12"), ("LIGHTNING_EPOCH_S", "1")]);
    let epochs = c.results.join(format!("lightning.{id}.epochs"));
    wait_until("two epochs", Duration::from_secs(180), || std::fs::read_to_string(&epochs).map_or(0, |t| t.lines().count()) >= 2);
    let out = c.slurm("scancel", &["--signal=USR1", &id.to_string()], &[]);
    assert!(out.status.success(), "scancel: {}", String::from_utf8_lossy(&out.stderr));
    let job = c.cluster.wait_final(id, Duration::from_secs(300));
    let dump = format!("{job}\n{}\n{}", c.output_of(id), std::fs::read_to_string(&epochs).unwrap_or_default());
    assert_eq!(job["state"], "COMPLETED", "{dump}");
    assert_eq!(job["restart_count"], 1, "{dump}");
    let resumed = c.lightning_results(id, 1);
    assert_eq!(resumed.len(), 2, "{dump}");
    assert!(
        resumed.values().all(|v| v["start_epoch"].as_u64().is_some_and(|e| e >= 2) && v["epochs"] == 12),
        "restored from the HPC checkpoint: {resumed:?}\n{dump}"
    );
    assert!(
        c.cluster.work.read_dir().expect("read work dir").flatten().any(|e| e.file_name().to_string_lossy().starts_with("hpc_ckpt_")),
        "{dump}"
    );
}

#[test]
fn submitit_runs_single_array_multinode_and_cancels() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("2", &py);
    let v = c.python_json("submitit_check.py", &["submitit-logs"], Duration::from_secs(420));
    assert_eq!(v["cluster"], "slurm", "{v}");
    assert_eq!((v["single"].as_i64(), v["single_state"].as_str()), (Some(5), Some("COMPLETED")), "{v}");
    assert_eq!(v["array"], serde_json::json!([0, 1, 4, 9, 16]), "{v}");
    let multi = v["multi"].as_array().expect("multi");
    assert_eq!(multi.len(), 2, "{v}");
    assert_eq!((multi[0][0].as_i64(), multi[1][0].as_i64(), multi[0][2].as_i64()), (Some(0), Some(1), Some(2)), "{v}");
    assert_ne!(multi[0][1], multi[1][1], "two nodes: {v}");
    assert_eq!(v["before_cancel"], "RUNNING", "{v}");
    assert!(v["after_cancel"].as_str().is_some_and(|s| s.starts_with("CANCELLED")), "{v}");
    // Checkpointed at its limit's signal and requeued once: the second run started from the
    // first one's count, not from zero.
    let ck = &v["checkpointed"];
    assert_eq!(ck["count"], 45, "{v}");
    let runs = ck["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2, "{v}");
    assert_eq!((runs[0][0].as_str(), runs[0][1].as_u64()), (Some("0"), Some(0)), "{v}");
    assert_eq!(runs[1][0].as_str(), Some("1"), "{v}");
    assert!(runs[1][1].as_u64().is_some_and(|c| (20..45).contains(&c)), "resumed from the checkpoint: {v}");
}

/// torch.distributed across four nodes, with torchrun and without (one task per node).
const FOUR_NODES: &str = r#"#!/bin/bash
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1

set -e
mkdir -p results/torchrun results/python
RESULT_DIR=results/torchrun srun torchrun --nnodes=$SLURM_NNODES --nproc_per_node=1 train_fsdp.py
RESULT_DIR=results/python srun python train_fsdp.py
"#;

#[test]
fn torch_forms_one_world_on_four_nodes_with_and_without_torchrun() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("4", &py);
    let id = c.sbatch_completed("four.sbatch", FOUR_NODES, &[], Duration::from_secs(300));
    for step in ["torchrun", "python"] {
        c.assert_fsdp_world_in(&c.results.join(step), id, 4, 1);
    }
}

#[test]
fn dask_jobqueue_scales_up_and_down() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("2", &py);
    let v = c.python_json("dask_check.py", &[], Duration::from_secs(300));
    assert_eq!(v["sum"], 285, "{v}");
    assert_eq!(v["jobs"].as_array().map(Vec::len), Some(2), "two workers, each its own job: {v}");
    assert_eq!(v["workers_after_scale_down"], 0, "{v}");
    // Scaling down cancelled the worker jobs.
    for j in v["jobs"].as_array().expect("jobs") {
        let id: u64 = j.as_str().and_then(|s| s.parse().ok()).expect("job id");
        let job = c.cluster.wait_final(id, Duration::from_secs(60));
        assert_eq!(job["state"], "CANCELLED", "{job}");
    }
}

/// ZeRO stage 3 on CPU: the optimizer DeepSpeed tests with ZeRO, torch's own Adam.
const DS_CONFIG: &str = r#"{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": true}},
 "zero_optimization": {"stage": 3}}
"#;

/// `deepspeed_zero3.sbatch` with DeepSpeed's Slurm launcher (`srun`) instead of pdsh: the
/// allocation's hostfile (`CORRAL_HOSTFILE`), no ssh check, and the rendezvous address.
// Its launcher runs `srun -n 4 --nodes 2`: the job holds two tasks' CPUs on each node, or the
// step asks more than the job has ("More processors requested than permitted", as in Slurm).
const DEEPSPEED_VIA_SRUN: &str = r#"#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --gres=gpu:h100:2

export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)
deepspeed --hostfile=$CORRAL_HOSTFILE --launcher=slurm --no_ssh_check --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT \
  --num_nodes=$SLURM_NNODES --num_gpus=2 train.py --deepspeed ds_config_zero3.json
"#;

impl Clients {
    /// `nodes` x `per_node` DeepSpeed ranks of `job` wrote ZeRO-3 results over the whole world,
    /// the first `per_node` on one node, the next on another, and so on.
    fn assert_deepspeed_world(&self, job: u64, nodes: u64, per_node: u64, out: &str) {
        let world = nodes * per_node;
        let mut by_node: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for rank in 0..world {
            let path = self.results.join(format!("deepspeed.{job}.{rank}.json"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}\n{out}", path.display()));
            let v: Value = serde_json::from_str(&text).expect("parse result");
            let sum = (world * (world + 1) / 2) as f64;
            assert_eq!((v["world"].as_u64(), v["sum"].as_f64(), v["stage"].as_u64()), (Some(world), Some(sum), Some(3)), "{v}\n{out}");
            by_node.entry(v["node"].as_str().unwrap_or_default().to_string()).or_default().push(rank);
        }
        let blocks: Vec<Vec<u64>> = (0..nodes).map(|n| (n * per_node..(n + 1) * per_node).collect()).collect();
        let mut got: Vec<Vec<u64>> = by_node.into_values().collect();
        got.sort();
        assert_eq!(got, blocks, "{per_node} ranks on each node, in blocks");
    }
}

/// `deepspeed_zero3.sbatch` as written but for its GPU count (2 of each node's 8, so 4 torch
/// processes, not 16: the unchanged script is in the heavy suite).
fn deepspeed_seed_with_gpus(gpus: u32) -> String {
    DEEPSPEED_SBATCH.replace("gpu:h100:8", &format!("gpu:h100:{gpus}")).replace("--num_gpus=8", &format!("--num_gpus={gpus}"))
}

/// DeepSpeed's own launcher as the seed script calls it: it reads `/job/hostfile`, checks
/// `ssh FIRST_HOST hostname`, asks `ssh FIRST_HOST hostname -I` for the rendezvous address and
/// starts each node's ranks with `pdsh -S -w HOSTS` (`--node_rank=%n`): the `/job/bin` pdsh and
/// ssh run each as a step on its node. Then its Slurm launcher (`srun`), as before.
#[test]
fn deepspeed_zero3_runs_across_nodes_as_written_and_through_srun() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("2", &py);
    std::fs::write(c.cluster.work.join("ds_config_zero3.json"), DS_CONFIG).expect("write ds config");
    let script = deepspeed_seed_with_gpus(2);
    assert!(!script.contains("launcher") && script.contains("deepspeed --num_nodes=$SLURM_NNODES --num_gpus=2 train.py"), "{script}");
    let id = c.sbatch("deepspeed_zero3.sbatch", &script, &[]);
    let job = c.cluster.wait_final(id, Duration::from_secs(300));
    let out = c.output_of(id);
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}");
    assert!(out.contains("cmd = pdsh -S -f 1024 -w "), "DeepSpeed's pdsh runner: {out}");
    c.assert_deepspeed_world(id, 2, 2, &out);
    // pdsh's lines carry their host; the ranks of the second node ran on it.
    let second = c.cluster.job(id)["nodes"][1].as_str().map(str::to_string).unwrap_or_default();
    assert!(out.lines().any(|l| l.starts_with(&format!("{second}: ")) && l.contains("node_rank=1")), "{out}");

    let id = c.sbatch("deepspeed_srun.sbatch", DEEPSPEED_VIA_SRUN, &[]);
    let job = c.cluster.wait_final(id, Duration::from_secs(300));
    let out = c.output_of(id);
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}");
    c.assert_deepspeed_world(id, 2, 2, &out);
}

#[test]
#[ignore = "16 DeepSpeed processes (about 6 GB, 2 minutes here): scripts/test-heavy.sh runs it"]
fn deepspeed_zero3_seed_script_unchanged_on_2_nodes_of_8_gpus() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("2", &py);
    std::fs::write(c.cluster.work.join("ds_config_zero3.json"), DS_CONFIG).expect("write ds config");
    let id = c.sbatch("deepspeed_zero3.sbatch", DEEPSPEED_SBATCH, &[]);
    let job = c.cluster.wait_final(id, Duration::from_secs(900));
    let out = c.output_of(id);
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}");
    c.assert_deepspeed_world(id, 2, 8, &out);
}

#[test]
#[ignore = "36 torch processes (about 14 GB, 3 minutes here): scripts/test-heavy.sh runs it"]
fn train_fsdp_seed_script_unchanged_on_4_nodes_of_8_workers() {
    let Some(py) = pyenv() else { return };
    let c = Clients::up("4", &py);
    let id = c.sbatch_completed("train_fsdp.sbatch", TRAIN_FSDP_SBATCH, &[], Duration::from_secs(600));
    c.assert_fsdp_world(id, 4, 8);
}
