//! Issue 5 end to end: the seed job scripts (shared/seed/*.sbatch, copied verbatim into
//! tests/fixtures/seed/) run unchanged through the `sbatch` shim on a `corral dev up` cluster.
//! Stand-ins for `python`, `torchrun` and `deepspeed` record their arguments and environment
//! into files, which the tests compare with what Slurm would have given them (`clients.rs` runs
//! the same scripts with the real programs).
//!
//! Skips (with a message) only when `corrald` has not been built.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use corral_tests::{wait_until, TestCluster};

const TRAIN_FSDP: &str = include_str!("../fixtures/seed/train_fsdp.sbatch");
const HPARAM_ARRAY: &str = include_str!("../fixtures/seed/hparam_array.sbatch");
const REQUEUE: &str = include_str!("../fixtures/seed/requeue.sbatch");
const DEEPSPEED_ZERO3: &str = include_str!("../fixtures/seed/deepspeed_zero3.sbatch");

/// A stand-in that writes `ARGV ...` and its SLURM/CUDA/NCCL/MASTER variables to a new file
/// in `$SEED_RECORDS`, named after itself, the job, the node and the rank.
const STAND_IN: &str = r#"#!/bin/sh
f="$SEED_RECORDS/$(basename "$0").${SLURM_JOB_ID:-nojob}.${SLURMD_NODENAME:-nonode}.${SLURM_PROCID:-0}.$$"
{
  echo "ARGV $*"
  env | grep -E '^(SLURM|SLURMD|CUDA_VISIBLE_DEVICES|GPU_DEVICE_ORDINAL|NCCL|MASTER_ADDR)' | sort
} > "$f"
"#;

/// The built binaries' directory, as the harness finds it; `None` when `corrald` is missing.
fn built_bins() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    let dir = if deps.ends_with("deps") { deps.parent()?.to_path_buf() } else { deps.to_path_buf() };
    (dir.join("corrald").exists() && dir.join("corral").exists()).then_some(dir)
}

/// The cluster with shims and stand-ins on PATH, or `None` (after saying why) to skip.
struct Seed {
    cluster: TestCluster,
    bin: PathBuf,
    records: PathBuf,
}

impl Seed {
    fn up(nodes: &str) -> Option<Seed> {
        let Some(bins) = built_bins() else {
            eprintln!("SKIPPED: corrald is not built (run `cargo build --workspace --bins` first)");
            return None;
        };
        let cluster = TestCluster::up(&["--nodes", nodes, "--gpus", "h100:8"]);
        let bin = cluster.path().join("slurm-bin");
        let records = cluster.path().join("records");
        std::fs::create_dir_all(&records).expect("create records dir");
        let out = Command::new(bins.join("corral")).args(["install-slurm-shims"]).arg(&bin).output().expect("run corral");
        assert!(out.status.success(), "install-slurm-shims: {}", String::from_utf8_lossy(&out.stderr));
        for name in ["python", "torchrun", "deepspeed"] {
            let path = bin.join(name);
            std::fs::write(&path, STAND_IN).expect("write stand-in");
            let mut perm = std::fs::metadata(&path).expect("stat").permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
            std::fs::set_permissions(&path, perm).expect("chmod stand-in");
        }
        Some(Seed { cluster, bin, records })
    }

    /// Runs a Slurm command through its shim, in the work dir, with the cluster's environment.
    fn slurm(&self, cmd: &str, args: &[&str]) -> Output {
        let path = format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default());
        Command::new(self.bin.join(cmd))
            .args(args)
            .current_dir(&self.cluster.work)
            .env("PATH", path)
            .env("CORRAL_CLUSTER", self.cluster.path())
            .env("SEED_RECORDS", &self.records)
            .env_remove("SLURM_JOB_ID")
            .output()
            .unwrap_or_else(|e| panic!("run {cmd}: {e}"))
    }

    /// `sbatch --parsable SCRIPT`: the job id.
    fn sbatch(&self, name: &str, text: &str) -> u64 {
        let path = self.cluster.work.join(name);
        std::fs::write(&path, text).expect("write script");
        let out = self.slurm("sbatch", &["--parsable", name]);
        assert!(out.status.success(), "sbatch {name}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("sbatch printed {:?}", String::from_utf8_lossy(&out.stdout)))
    }

    /// `sacct -j ID -P -n --format=JobID,State` until every job line is final; those lines.
    fn wait_sacct(&self, id: u64, lines: usize, patience: Duration) -> Vec<(String, String)> {
        let mut last = Vec::new();
        let ids = id.to_string();
        wait_until(&format!("job {id} ({lines} records) to finish"), patience, || {
            let out = self.slurm("sacct", &["-j", &ids, "-P", "-n", "--format=JobID,State"]);
            last = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_once('|').map(|(a, b)| (a.to_string(), b.to_string())))
                // The jobs' own lines (`ID.batch` and `ID.N` are their scripts and steps).
                .filter(|(j, _)| !j.contains('.'))
                .collect();
            last.len() >= lines && last.iter().all(|(_, s)| !matches!(s.as_str(), "PENDING" | "RUNNING"))
        });
        last
    }

    /// Records of stand-in `name` for job `job`: (file name, ARGV line, variables).
    fn records(&self, name: &str) -> Vec<Record> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(&self.records).expect("read records").flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            if !file.starts_with(&format!("{name}.")) {
                continue;
            }
            out.push(Record::read(&e.path()));
        }
        out.sort_by_key(|r| (r.var("SLURM_JOB_ID"), r.var("SLURM_PROCID")));
        out
    }
}

struct Record {
    argv: String,
    env: BTreeMap<String, String>,
}

impl Record {
    fn read(path: &Path) -> Record {
        let text = std::fs::read_to_string(path).expect("read record");
        let mut lines = text.lines();
        let argv = lines.next().unwrap_or_default().trim_start_matches("ARGV ").to_string();
        let env = lines.filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Record { argv, env }
    }

    fn var(&self, k: &str) -> String {
        self.env.get(k).cloned().unwrap_or_else(|| "<unset>".into())
    }
}

#[test]
fn train_fsdp_runs_torchrun_once_per_node_with_slurm_variables() {
    // `corral dev up` defines the `gpu` partition the script names.
    let Some(s) = Seed::up("4") else { return };
    let id = s.sbatch("train_fsdp.sbatch", TRAIN_FSDP);
    let job = s.cluster.wait_final(id, Duration::from_secs(90));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", s.cluster.logs());
    let recs = s.records("torchrun");
    let dump: Vec<String> = recs.iter().map(|r| format!("{} {:?}", r.argv, r.env)).collect();
    let dump = format!("{}\n{}", dump.join("\n"), s.cluster.logs());
    assert_eq!(recs.len(), 4, "one torchrun per node (srun, --ntasks-per-node=1)");
    let nodelist = recs[0].var("SLURM_JOB_NODELIST");
    let nodes = {
        let out = s.slurm("scontrol", &["show", "hostnames", &nodelist]);
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect::<Vec<_>>()
    };
    assert_eq!(nodes.len(), 4, "{nodelist}\n{dump}");
    for (rank, r) in recs.iter().enumerate() {
        assert_eq!(r.argv, "--nnodes=4 --nproc_per_node=8 train_fsdp.py", "{dump}");
        let got: Vec<(&str, String)> = [
            "SLURM_JOB_ID",
            "SLURM_NNODES",
            "SLURM_JOB_NUM_NODES",
            "SLURM_PROCID",
            "SLURM_NODEID",
            "SLURM_LOCALID",
            "SLURM_STEP_NUM_TASKS",
            "SLURM_STEP_NUM_NODES",
            "SLURM_CPUS_PER_TASK",
            "SLURM_JOB_PARTITION",
            "SLURM_GPUS_ON_NODE",
            "SLURM_TASKS_PER_NODE",
            "MASTER_ADDR",
            "NCCL_SOCKET_IFNAME",
            "SLURMD_NODENAME",
        ]
        .iter()
        .map(|k| (*k, r.var(k)))
        .collect();
        let want: Vec<(&str, String)> = vec![
            ("SLURM_JOB_ID", id.to_string()),
            ("SLURM_NNODES", "4".into()),
            ("SLURM_JOB_NUM_NODES", "4".into()),
            ("SLURM_PROCID", rank.to_string()),
            ("SLURM_NODEID", rank.to_string()),
            ("SLURM_LOCALID", "0".into()),
            ("SLURM_STEP_NUM_TASKS", "4".into()),
            ("SLURM_STEP_NUM_NODES", "4".into()),
            ("SLURM_CPUS_PER_TASK", "64".into()),
            ("SLURM_JOB_PARTITION", "gpu".into()),
            ("SLURM_GPUS_ON_NODE", "8".into()),
            ("SLURM_TASKS_PER_NODE", "1(x4)".into()),
            ("MASTER_ADDR", nodes[0].clone()),
            ("NCCL_SOCKET_IFNAME", "ib0".into()),
            ("SLURMD_NODENAME", nodes[rank].clone()),
        ];
        assert_eq!(got, want, "rank {rank}");
        assert_eq!(r.var("CUDA_VISIBLE_DEVICES").split(',').count(), 8);
    }
}

#[test]
fn hparam_array_runs_100_tasks_each_with_its_config() {
    let Some(s) = Seed::up("2") else { return };
    let id = s.sbatch("hparam_array.sbatch", HPARAM_ARRAY);
    let lines = s.wait_sacct(id, 100, Duration::from_secs(240));
    let tasks: BTreeSet<String> = lines.iter().map(|(j, _)| j.clone()).collect();
    let want: BTreeSet<String> = (1..=100).map(|t| format!("{id}_{t}")).collect();
    assert_eq!(tasks, want);
    assert!(lines.iter().all(|(_, st)| st == "COMPLETED"), "{lines:?}");
    let recs = s.records("python");
    assert_eq!(recs.len(), 100);
    let mut seen = BTreeSet::new();
    for r in &recs {
        let task: u32 = r.var("SLURM_ARRAY_TASK_ID").parse().expect("task id");
        assert_eq!(r.argv, format!("train.py --config hparams_{task}.json"));
        assert_eq!(
            (
                r.var("SLURM_ARRAY_JOB_ID"),
                r.var("SLURM_ARRAY_TASK_COUNT"),
                r.var("SLURM_ARRAY_TASK_MIN"),
                r.var("SLURM_ARRAY_TASK_MAX"),
                r.var("SLURM_ARRAY_TASK_STEP")
            ),
            (id.to_string(), "100".into(), "1".into(), "100".into(), "1".into())
        );
        assert_eq!(r.var("SLURM_GPUS_ON_NODE"), "1");
        assert_eq!(r.var("CUDA_VISIBLE_DEVICES").split(',').count(), 1);
        seen.insert(task);
    }
    assert_eq!(seen, (1..=100).collect());
    // Nothing of the array is left to run: squeue -j (every state) lists each task as CD, and
    // the default squeue (pending and running only) lists none.
    let out = s.slurm("squeue", &["-h", "-j", &id.to_string()]);
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(listed.lines().count(), 100, "{listed}");
    assert!(listed.lines().all(|l| l.split_whitespace().nth(4) == Some("CD")), "{listed}");
    let out = s.slurm("squeue", &["-h"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
}

#[test]
fn requeue_script_starts_from_scratch_and_is_requeueable() {
    let Some(s) = Seed::up("1") else { return };
    let id = s.sbatch("requeue.sbatch", REQUEUE);
    let job = s.cluster.wait_final(id, Duration::from_secs(60));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let recs = s.records("python");
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].argv, "train.py --from-scratch");
    assert_eq!(recs[0].var("SLURM_RESTART_COUNT"), "0");
    let out = s.slurm("scontrol", &["show", "job", &id.to_string()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.trim_start().starts_with("Requeue=1 Restarts=0 ")), "{text}");
    // With a checkpoint present, the same script resumes.
    std::fs::write(s.cluster.work.join("checkpoint_latest.pt"), b"x").expect("write checkpoint");
    let id2 = s.sbatch("requeue.sbatch", REQUEUE);
    assert_eq!(s.cluster.wait_final(id2, Duration::from_secs(60))["state"], "COMPLETED");
    let resumed: Vec<String> =
        s.records("python").iter().filter(|r| r.var("SLURM_JOB_ID") == id2.to_string()).map(|r| r.argv.clone()).collect();
    assert_eq!(resumed, vec!["train.py --resume checkpoint_latest.pt".to_string()]);
}

#[test]
fn deepspeed_script_sees_two_nodes() {
    let Some(s) = Seed::up("2") else { return };
    let id = s.sbatch("deepspeed_zero3.sbatch", DEEPSPEED_ZERO3);
    let job = s.cluster.wait_final(id, Duration::from_secs(60));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let recs = s.records("deepspeed");
    // Slurm runs a batch script on the first node only (deepspeed's launcher reaches the others).
    assert_eq!(recs.len(), 1, "the script ran once");
    let first = recs.iter().find(|r| r.var("SLURM_NODEID") == "0").expect("deepspeed ran on the first node");
    assert_eq!(first.argv, "--num_nodes=2 --num_gpus=8 train.py --deepspeed ds_config_zero3.json");
    assert_eq!(
        (first.var("SLURM_NNODES"), first.var("SLURM_GPUS_ON_NODE"), first.var("SLURM_JOB_ID")),
        ("2".into(), "8".into(), id.to_string())
    );
    let hosts = s.slurm("scontrol", &["show", "hostnames", &first.var("SLURM_JOB_NODELIST")]);
    assert_eq!(String::from_utf8_lossy(&hosts.stdout).lines().count(), 2);
}

#[test]
fn slurm_errors_reach_the_user_unchanged() {
    let Some(s) = Seed::up("1") else { return };
    let out = s.slurm("sbatch", &["--foo", "x.sh"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "sbatch: unrecognized option '--foo'\nTry \"sbatch --help\" for more information\n");
    std::fs::write(s.cluster.work.join("bad.sh"), "#!/bin/sh\n#SBATCH --time=soon\ntrue\n").expect("write");
    let out = s.slurm("sbatch", &["bad.sh"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "sbatch: error: Invalid --time specification\n");
    let out = s.slurm("sbatch", &["--wrap", "exit 3", "--wait"]);
    assert_eq!(out.status.code(), Some(3), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Submitted batch job "));
    // A partition or QoS the cluster does not define is refused at submit, in Slurm's words.
    let out = s.slurm("sbatch", &["-p", "nosuch", "--wrap", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "sbatch: error: Batch job submission failed: Invalid partition name specified\n");
    let out = s.slurm("sbatch", &["--qos", "nosuch", "--wrap", "true"]);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "sbatch: error: Batch job submission failed: Invalid qos specification\n");
    let out = s.slurm("srun", &["-p", "nosuch", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "srun: error: Unable to allocate resources: Invalid partition name specified\n");
    for p in ["gpu", "default"] {
        let out = s.slurm("sbatch", &["-p", p, "--wrap", "true", "--wait"]);
        assert_eq!(out.status.code(), Some(0), "partition {p}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let out = s.slurm("squeue", &[]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n"
    );
}
