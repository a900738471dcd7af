//! Unit tests of the Slurm layer: option parsing and Slurm's messages, formats, and the job
//! environment compared with what Slurm 22.05 set (shared/peers/slurm/observed_env.txt).

use std::collections::BTreeMap;
use std::path::PathBuf;

use proto::{
    Allocation, ArraySpec, ArrayTask, Dependency, DependencyKind, GresRequest, Job, JobSpec, JobState, NodeInfo, NodeRole, NodeRun,
    NodeState, SignalSpec, TaskRun,
};

use super::env::{self, extra, slurm_env};
use super::sbatch::{self, Action, Context, ScriptSource, Submission};
use super::*;

fn ctx() -> Context {
    let mut env = BTreeMap::new();
    env.insert("HOME".to_string(), "/home/alice".to_string());
    env.insert("PATH".to_string(), "/usr/bin:/bin".to_string());
    env.insert("FOO".to_string(), "foo".to_string());
    Context { cwd: PathBuf::from("/work/exp"), env, user: "alice".into(), host: "login1".into(), now_s: 1_800_000_000 }
}

fn argv(s: &[&str]) -> Vec<String> {
    s.iter().map(|a| a.to_string()).collect()
}

const SCRIPT: &str = "#!/bin/bash\necho hi\n";

fn submit_with(ctx: &Context, args: &[&str], script: &str) -> Result<Submission, SlurmError> {
    let mut a = argv(args);
    a.push("job.sh".into());
    match sbatch::parse(&a, ctx, ScriptSource::Text(script))? {
        Action::Submit(s) => Ok(*s),
        Action::Print(t) => panic!("unexpected print {t}"),
    }
}

fn spec(args: &[&str]) -> JobSpec {
    submit_with(&ctx(), args, SCRIPT).expect("parses").spec
}

fn err(args: &[&str]) -> String {
    submit_with(&ctx(), args, SCRIPT).expect_err("must fail").text
}

fn script_err(script: &str) -> String {
    submit_with(&ctx(), &[], script).expect_err("must fail").text
}

// ---------------------------------------------------------------------------------------------
// getopt

#[test]
fn getopt_messages_match_glibc() {
    assert_eq!(err(&["--foo"]), "sbatch: unrecognized option '--foo'\nTry \"sbatch --help\" for more information");
    assert_eq!(err(&["--foo=1"]), "sbatch: unrecognized option '--foo=1'\nTry \"sbatch --help\" for more information");
    assert_eq!(err(&["-Z"]), "sbatch: invalid option -- 'Z'\nTry \"sbatch --help\" for more information");
    assert_eq!(err(&["--requeue=yes"]), "sbatch: option '--requeue' doesn't allow an argument\nTry \"sbatch --help\" for more information");
    assert_eq!(
        err(&["--mem-per"]),
        "sbatch: option '--mem-per' is ambiguous; possibilities: '--mem-per-cpu' '--mem-per-gpu'\nTry \"sbatch --help\" for more information"
    );
    let missing = sbatch::parse(&argv(&["--time"]), &ctx(), ScriptSource::Text(SCRIPT)).expect_err("no value");
    assert_eq!(missing.text, "sbatch: option '--time' requires an argument\nTry \"sbatch --help\" for more information");
    let missing = sbatch::parse(&argv(&["-t"]), &ctx(), ScriptSource::Text(SCRIPT)).expect_err("no value");
    assert_eq!(missing.text, "sbatch: option requires an argument -- 't'\nTry \"sbatch --help\" for more information");
}

#[test]
fn getopt_forms_and_prefixes() {
    let s = spec(&["-J", "a", "--part=gpu", "-c8", "-N", "2", "--ntasks-per-node=4"]);
    assert_eq!((s.name.as_str(), s.partition.as_deref(), s.cpus_per_task, s.nodes, s.ntasks_per_node), ("a", Some("gpu"), 8, 2, 4));
    // Options stop at the script; later words are the script's arguments.
    let sub = sbatch::parse(&argv(&["-J", "x", "train.sh", "--lr", "0.1", "-N", "3"]), &ctx(), ScriptSource::Text(SCRIPT)).unwrap();
    let Action::Submit(sub) = sub else { panic!() };
    assert_eq!(sub.spec.argv, argv(&["--lr", "0.1", "-N", "3"]));
    assert_eq!(sub.spec.nodes, 1);
    assert_eq!(sub.spec.name, "x");
}

// ---------------------------------------------------------------------------------------------
// sbatch options into JobSpec

#[test]
fn defaults_of_a_plain_script() {
    let s = spec(&[]);
    assert_eq!(s.name, "job.sh");
    assert_eq!(s.script.as_deref(), Some(SCRIPT));
    assert!(s.argv.is_empty());
    assert_eq!(s.workdir, "/work/exp");
    assert_eq!(s.output.as_deref(), Some("slurm-%j.out"));
    assert_eq!(s.error, None);
    // No memory asked: the cluster gives its default at submit.
    assert_eq!((s.nodes, s.ntasks_per_node, s.cpus_per_task, s.mem_mib), (1, 1, 1, 0));
    assert_eq!(s.default_mem_mib(), 1024);
    assert_eq!(spec(&["--gres=gpu:2"]).default_mem_mib(), 32 * 1024, "DefMemPerGPU");
    for zero in ["--mem=0", "--mem-per-cpu=0", "--mem-per-gpu=0G"] {
        let option = zero.split('=').next().unwrap_or_default();
        assert_eq!(err(&[zero]), format!("sbatch: error: {option}=0 (all of each node's memory) is not supported: ask for a size"));
    }
    assert_eq!(spec(&["-c", "8", "--ntasks-per-node=2"]).default_mem_mib(), 16 * 1024, "DefMemPerCPU");
    assert_eq!(s.user, "alice");
    assert_eq!(s.submit_host, "login1");
    assert_eq!(s.env.get("FOO").map(String::as_str), Some("foo"));
    assert_eq!(s.extra.get(extra::SUBMIT_DIR).map(String::as_str), Some("/work/exp"));
    assert!(!s.requeue && !s.exclusive && !s.hold && !s.open_append);
    assert_eq!(s.time_limit_ms, None);
}

#[test]
fn every_time_format() {
    let t = |v: &str| spec(&["-t", v]).time_limit_ms;
    assert_eq!(t("10"), Some(600_000));
    assert_eq!(t("10:30"), Some(630_000));
    assert_eq!(t("1:02:03"), Some(3_723_000));
    assert_eq!(t("2-3"), Some((2 * 86_400 + 3 * 3600) * 1000));
    assert_eq!(t("2-3:04"), Some((2 * 86_400 + 3 * 3600 + 240) * 1000));
    assert_eq!(t("2-3:04:05"), Some((2 * 86_400 + 3 * 3600 + 245) * 1000));
    assert_eq!(t("UNLIMITED"), None);
    assert_eq!(t("infinite"), None);
    assert_eq!(t("0"), None);
    for bad in ["x", "1:2:3:4", "1-", "-5", "1-2:3:4:5", "1:-2", "", "inf", "10m"] {
        assert_eq!(err(&["--time", bad]), "sbatch: error: Invalid --time specification", "{bad}");
    }
}

#[test]
fn nodes_tasks_cpus() {
    // Corral's own: spare nodes and a rendezvous off the job's nodes, checked with the spec.
    let s = spec(&["-N", "2", "--spare-nodes", "1", "--rdzv-endpoint", "login1:29400"]);
    assert_eq!((s.spare_nodes(), s.rdzv_endpoint()), (1, Some("login1:29400")));
    assert_eq!(
        err(&["-N", "2", "--rdzv-endpoint", "login1"]),
        "sbatch: error: Batch job submission failed: rendezvous endpoint 'login1' is not HOST:PORT of at most 255 bytes"
    );
    let s = spec(&["-N", "2-4"]);
    assert_eq!((s.nodes, s.nodes_max()), (2, 4));
    assert_eq!(s.extra.get(extra::NODES_RANGE).map(String::as_str), Some("2-4"));
    // A range's most is at most the tasks, each node one at least; tasks per node on its least.
    let s = spec(&["-N", "2-4", "-n", "3"]);
    assert_eq!((s.nodes, s.nodes_max(), s.ntasks_per_node), (2, 3, 2));
    assert_eq!((env::tasks_per_node(&s, 2), env::tasks_per_node(&s, 3)), (vec![2, 1], vec![1, 1, 1]));
    assert_eq!(spec(&["-N", "3"]).nodes_max(), 3);
    assert_eq!(
        err(&["-N", "2-4", "--gpus", "8"]),
        "sbatch: error: --gpus=8 cannot be spread over a node range (2-4 nodes); Corral allocates GPUs per node (use --gpus-per-node)"
    );
    let s = spec(&["-n", "8"]);
    assert_eq!((s.nodes, s.ntasks_per_node), (1, 8));
    assert_eq!(s.extra.get(extra::NTASKS).map(String::as_str), Some("8"));
    let s = spec(&["-N", "2", "-n", "3"]);
    assert_eq!((s.nodes, s.ntasks_per_node), (2, 2));
    assert_eq!(env::tasks_per_node(&s, 2), vec![2, 1]);
    let s = spec(&["-N", "4", "-n", "2"]);
    assert_eq!((s.nodes, s.ntasks_per_node), (2, 1));
    assert_eq!(err(&["-N", "x"]), "sbatch: error: \"x\" is not a valid node count");
    assert_eq!(err(&["-N", "4-2"]), "sbatch: error: Maximum node count 2 is less than minimum node count 4");
    assert_eq!(err(&["-c", "abc"]), "sbatch: error: Invalid numeric value \"abc\" for --cpus-per-task.");
    assert_eq!(err(&["-n", "0"]), "sbatch: error: Invalid numeric value \"0\" for --ntasks.");
    assert_eq!(err(&["--ntasks-per-node=-1"]), "sbatch: error: Invalid numeric value \"-1\" for --ntasks-per-node.");
    assert!(spec(&["-c", "4"]).extra.contains_key(extra::CPUS_PER_TASK));
}

#[test]
fn memory_forms() {
    assert_eq!(spec(&["--mem=4G"]).mem_mib, 4096);
    assert_eq!(spec(&["--mem", "500"]).mem_mib, 500);
    let s = spec(&["--mem-per-cpu=2G", "-c", "4", "--ntasks-per-node=2"]);
    assert_eq!(s.mem_mib, 16 * 1024);
    assert_eq!(s.extra.get(extra::MEM_PER_CPU).map(String::as_str), Some("2048"));
    let s = spec(&["--mem-per-gpu=10G", "--gres=gpu:4"]);
    assert_eq!(s.mem_mib, 40 * 1024);
    // The last memory option wins.
    assert_eq!(spec(&["--mem-per-cpu=2G", "--mem=1G"]).mem_mib, 1024);
    assert_eq!(err(&["--mem=4X"]), "sbatch: error: Invalid --mem specification");
    assert_eq!(err(&["--mem-per-cpu=lots"]), "sbatch: error: Invalid --mem-per-cpu specification");
    assert_eq!(err(&["--mem-per-gpu=1Q"]), "sbatch: error: Invalid --mem-per-gpu specification");
    assert_eq!(err(&["--mem-per-gpu=1G"]), "sbatch: error: --mem-per-gpu is set but no GPUs were requested");
}

#[test]
fn gpus_in_every_form() {
    let g = |args: &[&str]| spec(args).gres;
    assert_eq!(g(&["--gres=gpu:h100:8"]), Some(GresRequest { gpu_type: Some("h100".into()), count: 8, ..Default::default() }));
    assert_eq!(g(&["--gres=gpu:2"]), Some(GresRequest { gpu_type: None, count: 2, ..Default::default() }));
    assert_eq!(g(&["--gres=gpu"]), Some(GresRequest { gpu_type: None, count: 1, ..Default::default() }));
    assert_eq!(g(&["--gres=gres/gpu:a100:2"]), Some(GresRequest { gpu_type: Some("a100".into()), count: 2, ..Default::default() }));
    assert_eq!(g(&["--gpus-per-node=h100:4"]), Some(GresRequest { gpu_type: Some("h100".into()), count: 4, ..Default::default() }));
    assert_eq!(g(&["--gpus-per-task=2", "--ntasks-per-node=4"]), Some(GresRequest { gpu_type: None, count: 8, ..Default::default() }));
    let s = spec(&["-G", "16", "-N", "2"]);
    assert_eq!(s.gres, Some(GresRequest { gpu_type: None, count: 8, ..Default::default() }));
    assert_eq!(s.extra.get(extra::GPUS).map(String::as_str), Some("16"));
    assert_eq!(g(&["--gpus=h100:2"]), Some(GresRequest { gpu_type: Some("h100".into()), count: 2, ..Default::default() }));
    assert_eq!(
        err(&["--gpus=3", "-N", "2"]),
        "sbatch: error: --gpus=3 cannot be spread evenly over 2 nodes; Corral allocates GPUs per node (use --gpus-per-node)"
    );
    for bad in ["--gres=nic:1", "--gres=gpu:h100:x", "--gres=gpu:0", "--gpus=x:y:z", "--gpus=0"] {
        assert_eq!(err(&[bad]), "sbatch: error: Batch job submission failed: Invalid generic resource (gres) specification", "{bad}");
    }
    let s = spec(&["--gres=gpu:4", "--cpus-per-gpu=8"]);
    assert_eq!(s.cpus_per_task, 32);
    let s = spec(&["--gres=gpu:1", "--gpu-bind=closest", "--gres-flags=enforce-binding"]);
    assert_eq!(s.extra.get("gpu-bind").map(String::as_str), Some("closest"));
    assert_eq!(s.extra.get("gres-flags").map(String::as_str), Some("enforce-binding"));
}

#[test]
fn arrays() {
    let a = |v: &str| spec(&["--array", v]).array;
    assert_eq!(a("1-5"), Some(ArraySpec::from_ids(&[1, 2, 3, 4, 5], None)));
    assert_eq!(a("1-100000").map(|x| x.runs), Some(vec![TaskRun { first: 1, last: 100_000, step: 1 }]));
    assert_eq!(a("0-15:4"), Some(ArraySpec::from_ids(&[0, 4, 8, 12], None)));
    assert_eq!(a("1,3,7"), Some(ArraySpec::from_ids(&[1, 3, 7], None)));
    assert_eq!(a("1-100%10").map(|x| (x.len(), x.throttle)), Some((100, Some(10))));
    assert_eq!(a("7,1-3"), Some(ArraySpec::from_ids(&[1, 2, 3, 7], None)));
    let s = spec(&["-a", "1-3"]);
    assert_eq!(s.output.as_deref(), Some("slurm-%A_%a.out"));
    assert_eq!(s.extra.get(extra::ARRAY).map(String::as_str), Some("1-3"));
    for bad in ["", "x", "5-1", "1-3%0", "1-3:0", "1-", "1-3%x"] {
        assert_eq!(err(&["--array", bad]), "sbatch: error: invalid --array specification", "{bad:?}");
    }
}

#[test]
fn signals_dependencies_begin() {
    assert_eq!(spec(&["--signal=USR1@90"]).signal, Some(SignalSpec { signal: libc::SIGUSR1, before_end_s: 90, batch_only: false }));
    assert_eq!(spec(&["--signal=B:SIGTERM"]).signal, Some(SignalSpec { signal: libc::SIGTERM, before_end_s: 60, batch_only: true }));
    assert_eq!(spec(&["--signal=R:10@5"]).signal, Some(SignalSpec { signal: 10, before_end_s: 5, batch_only: false }));
    for bad in ["FOO", "USR1@x", "X:USR1", "0"] {
        assert_eq!(err(&["--signal", bad]), "sbatch: error: Invalid --signal specification", "{bad}");
    }
    let d = |v: &str| spec(&["-d", v]).dependencies;
    let dep = |kind, job| Dependency { kind, job: Some(job) };
    assert_eq!(d("afterok:12"), vec![dep(DependencyKind::AfterOk, 12)]);
    assert_eq!(
        d("afterok:12:13,afterany:5"),
        vec![dep(DependencyKind::AfterOk, 12), dep(DependencyKind::AfterOk, 13), dep(DependencyKind::AfterAny, 5)]
    );
    assert_eq!(d("after:3"), vec![dep(DependencyKind::After, 3)]);
    assert_eq!(d("afternotok:4"), vec![dep(DependencyKind::AfterNotOk, 4)]);
    assert_eq!(d("singleton"), vec![Dependency { kind: DependencyKind::Singleton, job: None }]);
    assert_eq!(d("42"), vec![dep(DependencyKind::AfterAny, 42)]);
    for bad in ["afterok", "afterok:x", "aftercorr:1", "afterok:1?afterany:2", "afterok:1_2"] {
        assert_eq!(err(&["-d", bad]), "sbatch: error: Batch job submission failed: Job dependency problem", "{bad}");
    }
    assert_eq!(spec(&["--begin=now+1hour"]).begin_ms, Some((1_800_000_000 + 3600) * 1000));
    assert_eq!(spec(&["--begin=now+90"]).begin_ms, Some((1_800_000_000 + 90) * 1000));
    let at = time::from_local(time::Local { year: 2027, month: 3, day: 4, hour: 5, minute: 6, second: 7 });
    assert_eq!(spec(&["--begin=2027-03-04T05:06:07"]).begin_ms, Some(at as u64 * 1000));
    assert_eq!(err(&["--begin=someday"]), "sbatch: error: Invalid --begin specification");
}

#[test]
fn placement_and_policy_options() {
    let s = spec(&[
        "-A",
        "proj",
        "-q",
        "high",
        "-C",
        "ib&nvlink",
        "-w",
        "gpu[01-02]",
        "-x",
        "gpu07",
        "--exclusive",
        "-p",
        "gpu",
        "--requeue",
        "-H",
        "--open-mode=append",
        "-o",
        "out-%j.txt",
        "-e",
        "err-%j.txt",
        "-D",
        "sub",
        "--switches=2@10:00",
        "--mail-type=END,FAIL",
        "--mail-user=a@b",
        "--comment=hello",
    ]);
    assert_eq!(s.account.as_deref(), Some("proj"));
    assert_eq!(s.qos.as_deref(), Some("high"));
    assert_eq!(s.constraint, argv(&["ib", "nvlink"]));
    assert_eq!(s.nodelist, argv(&["gpu01", "gpu02"]));
    assert_eq!(s.exclude, argv(&["gpu07"]));
    assert!(s.exclusive && s.requeue && s.hold && s.open_append);
    assert_eq!(s.partition.as_deref(), Some("gpu"));
    assert_eq!(s.output.as_deref(), Some("out-%j.txt"));
    assert_eq!(s.error.as_deref(), Some("err-%j.txt"));
    assert_eq!(s.workdir, "/work/exp/sub");
    assert_eq!(s.extra.get(extra::SUBMIT_DIR).map(String::as_str), Some("/work/exp"));
    assert_eq!(s.switches, Some((2, 600_000)));
    assert_eq!(s.extra.get("mail-type").map(String::as_str), Some("END,FAIL"));
    assert_eq!(s.extra.get("mail-user").map(String::as_str), Some("a@b"));
    assert_eq!(s.extra.get("comment").map(String::as_str), Some("hello"));
    assert!(!spec(&["--requeue", "--no-requeue"]).requeue);
    // --no-requeue given, not only --requeue absent: an operator's requeue is refused.
    assert_eq!(spec(&["--requeue", "--no-requeue"]).requeue_refusal(), Some("Requested operation is presently disabled"));
    assert_eq!(spec(&["--no-requeue", "--requeue"]).requeue_refusal(), None);
    assert_eq!(spec(&[]).requeue_refusal(), None);
    assert_eq!(spec(&["-D", "/abs"]).workdir, "/abs");
    assert_eq!(err(&["--open-mode=x"]), "sbatch: error: Invalid --open-mode specification");
    // Matching OR: one element, a node with either.
    assert_eq!(spec(&["-C", "v100m16 | v100m32"]).constraint, argv(&["v100m16|v100m32"]));
    assert_eq!(err(&["-C", "a|b&c"]), "sbatch: error: Batch job submission failed: Invalid feature specification");
    assert_eq!(err(&["-C", "a||b"]), "sbatch: error: Batch job submission failed: Invalid feature specification");
    assert_eq!(err(&["-C", "[a|b]"]), "sbatch: error: Batch job submission failed: Invalid feature specification");
    assert_eq!(err(&["-w", "gpu[01-"]), "sbatch: error: Batch job submission failed: Invalid node name specified");
    assert_eq!(err(&["--exclusive=bogus"]), "sbatch: error: Invalid --exclusive specification");
}

#[test]
fn step_options_without_effect_are_named_on_stderr() {
    let parse = |a: &[&str]| opts::parse("srun", srun::OPTIONS, &argv(a), true).unwrap();
    assert_eq!(
        srun::step_warnings(&parse(&["--mem=4G", "-c", "2", "--gres=gpu:1", "-W", "5", "hostname"]), true, true),
        vec![
            "srun: warning: --cpus-per-task has no effect in Corral yet: it sets SLURM_CPUS_PER_TASK; a `corral submit` job's step holds no CPUs of its own"
                .to_string(),
            "srun: warning: --mem has no effect in Corral yet: a `corral submit` job's step shares the job's memory".to_string(),
            "srun: warning: --wait has no effect in Corral yet: tasks still running after the first one exits are not killed".to_string(),
        ]
    );
    assert!(
        srun::step_warnings(&parse(&["--gres=gpu:1", "-n", "2", "--overlap", "--mpi=none", "-J", "x", "hostname"]), true, true).is_empty()
    );
    assert_eq!(
        srun::step_warnings(&parse(&["-t", "5", "--signal=USR1@60", "--mem=1G", "hostname"]), true, false),
        vec!["srun: warning: --signal has no effect in Corral yet: the job's own --signal reaches its steps".to_string()],
        "in a batch job or an allocation --mem and --time take effect, a step's --signal not yet"
    );
    // In a batch job or an allocation (and outside one, where they size the job's
    // allocation) -c, --mem and --exact take effect: only the binds, --mpi and srun's own are
    // named.
    assert_eq!(
        srun::step_warnings(&parse(&["--mem=4G", "-c", "2", "--exact", "--cpu-bind=cores", "--mpi=pmix", "-I", "hostname"]), false, false),
        vec![
            "srun: warning: --cpu-bind has no effect in Corral yet: tasks are not bound to CPUs".to_string(),
            "srun: warning: --mpi has no effect in Corral yet: no PMI is set up; torchrun and NCCL need none".to_string(),
            "srun: warning: --immediate has no effect in Corral yet: srun waits for its resources however long that takes".to_string(),
        ]
    );
}

#[test]
fn options_without_effect_are_named_on_stderr_and_unknown_licenses_are_refused() {
    let sub = submit_with(&ctx(), &["--mail-type=END", "--comment=hello", "--hint=nomultithread"], SCRIPT).expect("parses");
    // --comment does what Slurm does with it (squeue %k shows it); the others are named.
    assert_eq!(
        sub.warnings,
        vec![
            "sbatch: warning: --mail-type has no effect in Corral; it is kept with the job".to_string(),
            "sbatch: warning: --hint has no effect in Corral; it is kept with the job".to_string(),
        ]
    );
    assert!(submit_with(&ctx(), &["-N", "2", "--comment=x"], SCRIPT).expect("parses").warnings.is_empty());
    // A reservation goes with the job; the cluster checks it exists and admits the job.
    let sub = submit_with(&ctx(), &["--reservation=maint"], SCRIPT).expect("parses");
    assert_eq!(sub.spec.reservation(), Some("maint"));
    assert_eq!(err(&["-L", "matlab:1"]), "sbatch: error: Invalid license specification: matlab:1 (Corral has no licenses)");
    assert!(err(&["--priority=100"]).contains("--nice=N lowers a job's priority"), "{}", err(&["--priority=100"]));
}

#[test]
fn export_forms() {
    let mut c = ctx();
    c.env.insert("SLURM_CONF".into(), "/etc/slurm.conf".into());
    let e = |v: &str| sbatch::export_env(v, &c.env);
    assert_eq!(e("ALL"), c.env);
    assert_eq!(e("NONE").keys().cloned().collect::<Vec<_>>(), argv(&["SLURM_CONF"]));
    assert_eq!(
        e("FOO,BAR=2").into_iter().collect::<Vec<_>>(),
        vec![
            ("BAR".to_string(), "2".to_string()),
            ("FOO".to_string(), "foo".to_string()),
            ("SLURM_CONF".to_string(), "/etc/slurm.conf".to_string())
        ]
    );
    let all_plus = e("ALL,X=1");
    assert_eq!(all_plus.get("X").map(String::as_str), Some("1"));
    assert_eq!(all_plus.get("HOME").map(String::as_str), Some("/home/alice"));
    let s = submit_with(&c, &["--export=NONE"], SCRIPT).unwrap().spec;
    assert!(!s.env.contains_key("HOME"));
}

#[test]
fn flags_of_the_submission() {
    let sub = submit_with(&ctx(), &["--parsable", "--wait", "-Q"], SCRIPT).unwrap();
    assert!(sub.parsable && sub.wait && sub.quiet && !sub.test_only);
    let print = sbatch::parse(&argv(&["--version"]), &ctx(), ScriptSource::Text(SCRIPT)).unwrap();
    assert_eq!(print, Action::Print("slurm 22.05.8\n".into()));
}

// ---------------------------------------------------------------------------------------------
// #SBATCH directives and precedence

#[test]
fn directives_stop_at_the_first_command_and_drop_comments() {
    let script = "#!/bin/bash\n#SBATCH --requeue   # Auto-requeue on node failure\n\n# a comment\n#SBATCH -J 'my job' --time=5\n#SBATCHX --nodes=9\n  #SBATCH --nodes=7\necho start\n#SBATCH --nodes=3\n";
    assert_eq!(sbatch::directives(script, "#SBATCH"), argv(&["--requeue", "-J", "my job", "--time=5"]));
    let s = submit_with(&ctx(), &[], script).unwrap().spec;
    assert!(s.requeue);
    assert_eq!(s.name, "my job");
    assert_eq!(s.nodes, 1);
    assert_eq!(s.time_limit_ms, Some(300_000));
    assert_eq!(sbatch::directives("#!/bin/sh\n#SBATCH --comment=\"a#b\" x\\ y\n", "#SBATCH"), argv(&["--comment=a#b", "x y"]));
}

#[test]
fn command_line_beats_environment_beats_script() {
    let script = "#!/bin/bash\n#SBATCH --partition=script --time=10 --job-name=fromscript --nodes=2\nsrun true\n";
    let mut c = ctx();
    c.env.insert("SBATCH_PARTITION".into(), "env".into());
    c.env.insert("SBATCH_TIMELIMIT".into(), "20".into());
    c.env.insert("SBATCH_REQUEUE".into(), "yes".into());
    c.env.insert("SBATCH_EXCLUSIVE".into(), String::new());
    c.env.insert("SBATCH_WAIT".into(), "0".into());
    let sub = submit_with(&c, &["-t", "30"], script).unwrap();
    assert!(!sub.wait);
    let s = sub.spec;
    assert_eq!(s.partition.as_deref(), Some("env"));
    assert_eq!(s.time_limit_ms, Some(30 * 60_000));
    assert_eq!(s.name, "fromscript");
    assert_eq!(s.nodes, 2);
    assert!(s.requeue);
    assert!(s.exclusive);
    let s = submit_with(&c, &["-p", "cli"], script).unwrap().spec;
    assert_eq!(s.partition.as_deref(), Some("cli"));
    assert_eq!(s.time_limit_ms, Some(20 * 60_000));
}

#[test]
fn script_errors() {
    assert_eq!(
        script_err("#!/bin/bash\n#SBATCH --foo\n"),
        "sbatch: unrecognized option '--foo'\nTry \"sbatch --help\" for more information"
    );
    assert_eq!(
        script_err("#!/bin/bash\n#SBATCH --mail-user=<your e-mail>\n"),
        "sbatch: error: Invalid directive found in batch script: e-mail>"
    );
    assert_eq!(script_err("#!/bin/bash\n#SBATCH --time=abc\n"), "sbatch: error: Invalid --time specification");
    // A bad directive is an error even when the command line overrides it (as in Slurm).
    assert_eq!(
        submit_with(&ctx(), &["-t", "5"], "#!/bin/bash\n#SBATCH --time=abc\n").unwrap_err().text,
        "sbatch: error: Invalid --time specification"
    );
    assert_eq!(
        script_err("echo no shebang\n"),
        "sbatch: error: This does not look like a batch script.  The first\nsbatch: error: line must start with #! followed by the path to an interpreter.\nsbatch: error: For instance: #!/bin/sh"
    );
    assert_eq!(script_err("#!/bin/sh\r\necho\r\n"), "sbatch: error: Batch script contains DOS line breaks (\\r\\n)");
}

#[test]
fn wrap_and_missing_files() {
    let Action::Submit(sub) = sbatch::parse(&argv(&["--wrap", "echo hi"]), &ctx(), ScriptSource::File).unwrap() else { panic!() };
    assert_eq!(sub.spec.name, "wrap");
    assert_eq!(sub.spec.script.as_deref(), Some("#!/bin/sh\n# This script was created by sbatch --wrap.\n\necho hi\n"));
    let e = sbatch::parse(&argv(&["/nonexistent/x.sh"]), &ctx(), ScriptSource::File).unwrap_err();
    assert_eq!(e.text, "sbatch: error: Unable to open file /nonexistent/x.sh");
}

#[test]
fn seed_scripts_parse_unchanged() {
    let seeds: &[(&str, &str)] = &[
        ("train_fsdp.sbatch", "#!/bin/bash\n#SBATCH --partition=gpu\n#SBATCH --nodes=4\n#SBATCH --gres=gpu:h100:8\n#SBATCH --ntasks-per-node=1\n#SBATCH --cpus-per-task=64\n\nexport NCCL_SOCKET_IFNAME=ib0\nexport MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)\n\nsrun torchrun --nnodes=$SLURM_NNODES --nproc_per_node=8 train_fsdp.py\n"),
        ("hparam_array.sbatch", "#!/bin/bash\n#SBATCH --array=1-100\n#SBATCH --gres=gpu:h100:1\n\nHPARAMS=\"hparams_${SLURM_ARRAY_TASK_ID}.json\"\npython train.py --config ${HPARAMS}\n"),
        ("requeue.sbatch", "#!/bin/bash\n#SBATCH --requeue   # Auto-requeue on node failure\n\nif [ -f \"checkpoint_latest.pt\" ]; then\n    python train.py --resume checkpoint_latest.pt\nelse\n    python train.py --from-scratch\nfi\n"),
        ("deepspeed_zero3.sbatch", "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gres=gpu:h100:8\n\ndeepspeed --num_nodes=$SLURM_NNODES --num_gpus=8 train.py \\\n  --deepspeed ds_config_zero3.json\n"),
    ];
    let h100 = |n| Some(GresRequest { gpu_type: Some("h100".into()), count: n, ..Default::default() });
    for (name, text) in seeds {
        let Action::Submit(sub) = sbatch::parse(&argv(&[name]), &ctx(), ScriptSource::Text(text)).unwrap() else { panic!() };
        let s = sub.spec;
        assert_eq!(s.name, *name);
        match *name {
            "train_fsdp.sbatch" => {
                assert_eq!((s.partition.as_deref(), s.nodes, s.ntasks_per_node, s.cpus_per_task), (Some("gpu"), 4, 1, 64));
                assert_eq!(s.gres, h100(8));
            }
            "hparam_array.sbatch" => {
                assert_eq!(s.array.as_ref().map(|a| a.len()), Some(100));
                assert_eq!(s.gres, h100(1));
            }
            "requeue.sbatch" => assert!(s.requeue),
            _ => {
                assert_eq!(s.nodes, 2);
                assert_eq!(s.gres, h100(8));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The job environment

/// The job `spec` becomes once committed: memory not asked for is the cluster's default (the
/// leader fills it in at submit).
fn job_of(mut spec: JobSpec, id: u64) -> Job {
    spec.fill_default_mem();
    Job { state: JobState::Running, run: 1, start_ms: Some(1_800_000_010_000), ..Job::submitted(id, spec.into(), 1_800_000_000_000) }
}

/// Section 1 of shared/peers/slurm/observed_env.txt: `sbatch --gres=gpu:h100:4 --wrap ...`
/// on Slurm 22.05.8 (job 3204 on node `vm`, cluster `peer`, submitted from /tmp/slurmpeer/verify).
const OBSERVED_BATCH_ENV: &str = "GPU_DEVICE_ORDINAL=0,1,2,3
SLURMD_NODENAME=vm
SLURM_CLUSTER_NAME=peer
SLURM_CONF=/tmp/slurmpeer/etc/slurm.conf
SLURM_CPUS_ON_NODE=1
SLURM_GPUS_ON_NODE=4
SLURM_GTIDS=0
SLURM_JOBID=3204
SLURM_JOB_CPUS_PER_NODE=1
SLURM_JOB_GID=0
SLURM_JOB_GPUS=0,1,2,3
SLURM_JOB_ID=3204
SLURM_JOB_NAME=wrap
SLURM_JOB_NODELIST=vm
SLURM_JOB_NUM_NODES=1
SLURM_JOB_PARTITION=gpu
SLURM_JOB_UID=0
SLURM_JOB_USER=root
SLURM_LOCALID=0
SLURM_NNODES=1
SLURM_NODEID=0
SLURM_NODELIST=vm
SLURM_NODE_ALIASES=(null)
SLURM_PRIO_PROCESS=0
SLURM_PROCID=0
SLURM_SUBMIT_DIR=/tmp/slurmpeer/verify
SLURM_SUBMIT_HOST=vm
SLURM_TASKS_PER_NODE=1
SLURM_TASK_PID=15811
SLURM_TOPOLOGY_ADDR=vm
SLURM_TOPOLOGY_ADDR_PATTERN=node
SLURM_WORKING_CLUSTER=peer:127.0.0.1:6817:9728:109";

/// Variables of the observed environment Corral's function does not produce, and why.
const NOT_FROM_SLURM_ENV: &[&str] = &[
    "SLURM_CONF",            // Slurm's config file; Corral has none.
    "SLURM_NODE_ALIASES",    // cloud-node aliases, always (null) here.
    "SLURM_PRIO_PROCESS",    // the submitter's nice value.
    "SLURM_TASK_PID",        // the launcher knows the pid, not this pure function.
    "SLURM_WORKING_CLUSTER", // slurmctld's address for cross-cluster calls.
];

fn observed_batch_job() -> Job {
    let ctx =
        Context { cwd: PathBuf::from("/tmp/slurmpeer/verify"), env: BTreeMap::new(), user: "root".into(), host: "vm".into(), now_s: 0 };
    let Action::Submit(sub) = sbatch::parse(&argv(&["--gres=gpu:h100:4", "-p", "gpu", "--wrap", "env"]), &ctx, ScriptSource::File).unwrap()
    else {
        panic!()
    };
    let mut spec = sub.spec;
    spec.uid = Some(0);
    spec.gid = Some(0);
    let mut job = job_of(spec, 3204);
    job.parts =
        vec![NodeRun { run: 1, alloc: Allocation { node: 7, gpus: vec![0, 1, 2, 3], cpus: 1, mem_mib: 1024 }, launched_by: Some(1) }];
    job
}

#[test]
fn batch_env_matches_slurm_field_by_field() {
    let job = observed_batch_job();
    let ours = slurm_env(&job, &["vm".to_string()], 0, "peer", &[0, 1, 2, 3]);
    for line in OBSERVED_BATCH_ENV.lines() {
        let (k, v) = line.split_once('=').unwrap();
        if NOT_FROM_SLURM_ENV.contains(&k) {
            assert!(!ours.contains_key(k), "{k} is documented as not produced");
            continue;
        }
        assert_eq!(ours.get(k).map(String::as_str), Some(v), "{k}");
    }
    // What Corral adds on purpose (the issue asks for them), with their values.
    let observed: Vec<&str> = OBSERVED_BATCH_ENV.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
    let added: BTreeMap<&str, &str> =
        ours.iter().filter(|(k, _)| !observed.contains(&k.as_str())).map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let expected: BTreeMap<&str, &str> = [
        ("SLURM_JOB_START_TIME", "1800000010"),
        // 4 GPUs at 16 GiB each (the default per GPU: the job asked no memory).
        ("SLURM_MEM_PER_NODE", "65536"),
        ("SLURM_NPROCS", "1"),
        ("SLURM_NTASKS", "1"),
        ("SLURM_NTASKS_PER_NODE", "1"),
        ("SLURM_RESTART_COUNT", "0"),
    ]
    .into_iter()
    .collect();
    assert_eq!(added, expected);
}

#[test]
fn array_task_env_matches_slurm() {
    // observed: JOB_ID=3212 ARRAY_JOB_ID=3211 TASK=1 COUNT=5 MIN=1 MAX=5 STEP=1
    let mut job = observed_batch_job();
    job.id = 3212;
    std::sync::Arc::make_mut(&mut job.spec).array = Some(ArraySpec::from_ids(&[1, 2, 3, 4, 5], None));
    job.array = Some(ArrayTask { array_job: 3211, task: 1 });
    let e = slurm_env(&job, &["vm".to_string()], 0, "peer", &[0]);
    let got: Vec<(&str, &str)> = [
        "SLURM_JOB_ID",
        "SLURM_ARRAY_JOB_ID",
        "SLURM_ARRAY_TASK_ID",
        "SLURM_ARRAY_TASK_COUNT",
        "SLURM_ARRAY_TASK_MIN",
        "SLURM_ARRAY_TASK_MAX",
        "SLURM_ARRAY_TASK_STEP",
        "SLURM_JOB_GPUS",
        "GPU_DEVICE_ORDINAL",
        "SLURM_GPUS_ON_NODE",
    ]
    .iter()
    .map(|k| (*k, e.get(*k).map_or("<unset>", String::as_str)))
    .collect();
    assert_eq!(
        got,
        vec![
            ("SLURM_JOB_ID", "3212"),
            ("SLURM_ARRAY_JOB_ID", "3211"),
            ("SLURM_ARRAY_TASK_ID", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "5"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_MAX", "5"),
            ("SLURM_ARRAY_TASK_STEP", "1"),
            ("SLURM_JOB_GPUS", "0"),
            ("GPU_DEVICE_ORDINAL", "0"),
            ("SLURM_GPUS_ON_NODE", "1"),
        ]
    );
    std::sync::Arc::make_mut(&mut job.spec).array = Some(ArraySpec::from_ids(&[0, 4, 8, 12], None));
    job.array = Some(ArrayTask { array_job: 3211, task: 8 });
    let e = slurm_env(&job, &["vm".to_string()], 0, "peer", &[0]);
    assert_eq!(e.get("SLURM_ARRAY_TASK_STEP").map(String::as_str), Some("4"));
    assert_eq!(e.get("SLURM_ARRAY_TASK_MAX").map(String::as_str), Some("12"));
    // Requeued runs count restarts.
    job.restart_count = 2;
    assert_eq!(slurm_env(&job, &["vm".to_string()], 0, "peer", &[]).get("SLURM_RESTART_COUNT").map(String::as_str), Some("2"));
}

#[test]
fn multi_node_env() {
    let mut s = spec(&["-N", "4", "--ntasks-per-node=2", "-c", "16", "--gres=gpu:h100:8", "-p", "gpu", "-A", "proj", "-t", "1:00:00"]);
    s.partition = Some("gpu".into());
    let mut job = job_of(s, 77);
    job.parts = (0..4)
        .map(|i| NodeRun { run: 1, alloc: Allocation { node: i, gpus: (0..8).collect(), cpus: 32, mem_mib: 1024 }, launched_by: None })
        .collect();
    let names: Vec<String> = ["gpu01", "gpu02", "gpu03", "gpu04"].iter().map(|s| s.to_string()).collect();
    let e = slurm_env(&job, &names, 2, "corral", &(0..8).collect::<Vec<_>>());
    let pick = |k: &str| e.get(k).cloned().unwrap_or_else(|| "<unset>".into());
    assert_eq!(pick("SLURM_JOB_NODELIST"), "gpu[01-04]");
    assert_eq!(pick("SLURM_NNODES"), "4");
    assert_eq!(pick("SLURM_NTASKS"), "8");
    assert_eq!(pick("SLURM_TASKS_PER_NODE"), "2(x4)");
    assert_eq!(pick("SLURM_JOB_CPUS_PER_NODE"), "32(x4)");
    assert_eq!(pick("SLURM_CPUS_ON_NODE"), "32");
    assert_eq!(pick("SLURM_CPUS_PER_TASK"), "16");
    assert_eq!(pick("SLURMD_NODENAME"), "gpu03");
    assert_eq!(pick("SLURM_NODEID"), "2");
    assert_eq!(pick("SLURM_PROCID"), "4");
    assert_eq!(pick("SLURM_GTIDS"), "4,5");
    assert_eq!(pick("SLURM_JOB_ACCOUNT"), "proj");
    assert_eq!(pick("SLURM_JOB_PARTITION"), "gpu");
    assert_eq!(pick("SLURM_GPUS_ON_NODE"), "8");
    assert_eq!(pick("SLURM_JOB_END_TIME"), (1_800_000_010 + 3600).to_string());
    assert_eq!(pick("SLURM_SUBMIT_DIR"), "/work/exp");
}

#[test]
fn output_patterns() {
    let mut job = observed_batch_job();
    std::sync::Arc::make_mut(&mut job.spec).name = "train".into();
    let names = vec!["gpu01".to_string(), "gpu02".to_string()];
    assert_eq!(env::output_path("slurm-%j.out", &job, &names, 0), "slurm-3204.out");
    assert_eq!(env::output_path("%x-%u-%N-%n-%t-%J-%%-%A_%a", &job, &names, 1), "train-root-gpu01-1-0-3204-%-3204_4294967294");
    job.array = Some(ArrayTask { array_job: 3211, task: 7 });
    assert_eq!(env::output_path("slurm-%A_%a.out", &job, &names, 0), "slurm-3211_7.out");
    assert_eq!(env::output_path("t%3a-%q", &job, &names, 0), "t007-%q");
}

// ---------------------------------------------------------------------------------------------
// squeue, sacct, sinfo, scontrol

fn listed(id: u64, name: &str, state: JobState) -> Job {
    let mut s = JobSpec::command(vec!["x".into()], "/w", "alice");
    s.name = name.into();
    let mut j = job_of(s, id);
    j.state = state;
    j
}

fn names_map() -> BTreeMap<u64, String> {
    [(1, "gpu01".to_string()), (2, "gpu02".to_string())].into_iter().collect()
}

#[test]
fn squeue_default_columns() {
    let mut running = listed(12, "train", JobState::Running);
    std::sync::Arc::make_mut(&mut running.spec).partition = Some("gpu".into());
    running.parts = vec![
        NodeRun { run: 1, alloc: Allocation { node: 1, gpus: vec![], cpus: 1, mem_mib: 1 }, launched_by: Some(1) },
        NodeRun { run: 1, alloc: Allocation { node: 2, gpus: vec![], cpus: 1, mem_mib: 1 }, launched_by: Some(1) },
    ];
    running.last_nodes = vec![1, 2];
    running.start_ms = Some(1_000_000);
    let mut pending = listed(13, "averyverylongname", JobState::Pending);
    pending.start_ms = None;
    pending.reasons = vec!["waiting for 8 free GPUs".into()];
    let mut held = listed(14, "h", JobState::Pending);
    std::sync::Arc::make_mut(&mut held.spec).hold = true;
    held.start_ms = None;
    let out = squeue::table(&[running, pending, held], &names_map(), squeue::DEFAULT_FORMAT, true, false, 1_000_000 + 3_723_000);
    assert_eq!(
        out,
        "             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n\
         \x20               12       gpu    train    alice  R    1:02:03      2 gpu[01-02]\n\
         \x20               13   default averyver    alice PD       0:00      1 (Resources)\n\
         \x20               14   default        h    alice PD       0:00      1 (JobHeldUser)\n"
    );
}

#[test]
fn squeue_arrays_formats_and_reasons() {
    let mut jobs = Vec::new();
    for t in 1..=5 {
        let mut j = listed(100 + u64::from(t), "arr", JobState::Pending);
        j.array = Some(ArrayTask { array_job: 100, task: t });
        std::sync::Arc::make_mut(&mut j.spec).array = Some(ArraySpec::from_ids(&(1..=5).collect::<Vec<u32>>(), Some(2)));
        j.reasons = vec!["Priority".into()];
        j.start_ms = None;
        jobs.push(j);
    }
    let out = squeue::table(&jobs, &names_map(), "%i %t %r", false, false, 0);
    assert_eq!(out, "100_[1-5%2] PD Priority\n");
    let out = squeue::table(&jobs[..2], &names_map(), "%.10i|%4t|%K|%F", true, true, 0);
    assert_eq!(out, "     JOBID|ST  |ARRAY_TASK_ID|ARRAY_JOB_ID\n     100_1|PD  |1|100\n     100_2|PD  |2|100\n");
    let mut j = listed(5, "x", JobState::Pending);
    for (reason, code) in [
        ("Dependency", "Dependency"),
        ("waiting on dependency afterok:4", "Dependency"),
        ("begin time not reached", "BeginTime"),
        ("queued behind higher priority jobs", "Priority"),
        ("BeginTime", "BeginTime"),
        ("something else entirely", "something else entirely"),
    ] {
        j.reasons = vec![reason.into()];
        assert_eq!(squeue::reason_code(&j), code, "{reason}");
    }
    // Partition access, as the peer with slurmdbd printed it: the code in the REST API,
    // `PartitionConfig` in sacct, Slurm's description in squeue and scontrol.
    j.reasons = vec!["AccountNotAllowed: Job's account not permitted to use this partition (phys allows phys not bio)".into()];
    assert_eq!(squeue::reason_code(&j), "AccountNotAllowed");
    assert_eq!(slurm_compat::show::accounting_reason(&j), "PartitionConfig");
    let expected = "Job's account not permitted to use this partition (phys allows phys not bio)";
    assert_eq!(slurm_compat::show::state_description(&j).as_deref(), Some(expected), "squeue --json's state_description");
    let out = squeue::table(std::slice::from_ref(&j), &names_map(), "%r|%R", false, false, 0);
    assert_eq!(
        out,
        "Job's account not permitted to use this partition (phys allows phys not bio)|(Job's account not permitted to use this partition (phys allows phys not bio))\n"
    );
    let text = scontrol::job_text(&j, &names_map(), 1_800_000_070_000);
    assert!(text.contains(" Reason=Job's_account_not_permitted_to_use_this_partition_(phys_allows_phys_not_bio) "), "{text}");
    j.reasons = vec!["PartitionTimeLimit: time limit 10:00:00 exceeds the 04:00:00 of partition gpu".into()];
    assert_eq!(squeue::table(std::slice::from_ref(&j), &names_map(), "%r", false, false, 0), "PartitionTimeLimit\n");
    assert_eq!(squeue::long_format_to_format("JobID:10,Name,State:.8").unwrap(), "%10i%20j%.8T");
}

#[test]
fn squeue_filters() {
    let mut a = listed(1, "a", JobState::Running);
    std::sync::Arc::make_mut(&mut a.spec).user = "bob".into();
    let b = listed(2, "b", JobState::Completed);
    let c = listed(3, "c", JobState::Pending);
    let f = squeue::Filter { users: vec!["alice".into()], ..Default::default() };
    let shown: Vec<u64> = [&a, &b, &c].iter().filter(|j| f.matches(j, &names_map())).map(|j| j.id).collect();
    assert_eq!(shown, vec![3]);
    let f = squeue::Filter { states: squeue::parse_state("CD"), ..Default::default() };
    assert!(f.matches(&b, &names_map()) && !f.matches(&c, &names_map()));
    assert_eq!(squeue::parse_state("bogus"), None);
}

#[test]
fn sacct_columns_and_parsable() {
    let mut done = listed(42, "train_model_long", JobState::Completed);
    std::sync::Arc::make_mut(&mut done.spec).gres = Some(GresRequest { gpu_type: Some("h100".into()), count: 4, ..Default::default() });
    std::sync::Arc::make_mut(&mut done.spec).partition = Some("gpu".into());
    std::sync::Arc::make_mut(&mut done.spec).cpus_per_task = 8;
    done.exit_code = Some(0);
    done.start_ms = Some(2_000_000);
    done.end_ms = Some(2_000_000 + 65_000);
    done.last_nodes = vec![1];
    let mut failed = listed(43, "f", JobState::Failed);
    failed.exit_code = Some(3);
    failed.start_ms = Some(1_000);
    failed.end_ms = Some(6_000);
    failed.last_nodes = vec![2];
    let mut cancelled = listed(44, "c", JobState::Cancelled);
    cancelled.start_ms = None;
    let jobs = [&done, &failed, &cancelled];
    let cols = sacct::parse_fields(sacct::DEFAULT_FIELDS).unwrap();
    assert_eq!(
        sacct::table(&jobs, &cols, sacct::Style::Columns, true, &names_map(), 0),
        "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode \n\
         ------------ ---------- ---------- ---------- ---------- ---------- -------- \n\
         42           train_mod+        gpu                     8  COMPLETED      0:0 \n\
         43                    f    default                     1     FAILED      3:0 \n\
         44                    c    default                     1  CANCELLED     0:15 \n"
    );
    let cols = sacct::parse_fields("JobID,JobName,State,Elapsed,AllocTRES,ExitCode,NodeList").unwrap();
    assert_eq!(
        sacct::table(&jobs, &cols, sacct::Style::Parsable2, true, &names_map(), 0),
        "JobID|JobName|State|Elapsed|AllocTRES|ExitCode|NodeList\n\
         42|train_model_long|COMPLETED|00:01:05|billing=8,cpu=8,gres/gpu=4,mem=1G,node=1|0:0|gpu01\n\
         43|f|FAILED|00:00:05|billing=1,cpu=1,mem=1G,node=1|3:0|gpu02\n\
         44|c|CANCELLED|00:00:00||0:15|None assigned\n"
    );
    let cols = sacct::parse_fields("jobid,state").unwrap();
    assert_eq!(sacct::table(&jobs[..1], &cols, sacct::Style::Parsable, false, &names_map(), 0), "42|COMPLETED|\n");
    // Without -X: the batch script's line and each step's, with their own nodes, times and exits.
    let mut batch = done.clone();
    std::sync::Arc::make_mut(&mut batch.spec).set_batch(true);
    batch.last_nodes = vec![1, 2];
    let step = |step, name: &str, nodes: &[&str], exit_code, signal, end_ms| proto::StepRecord {
        step,
        name: name.into(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        ntasks: 2,
        start_ms: 2_001_000,
        end_ms,
        ended_on: Vec::new(),
        exit_code,
        signal,
    };
    batch.steps = vec![
        step(0, "python", &["gpu01", "gpu02"], 0, None, Some(2_031_000)),
        step(1, "hostname", &["gpu02"], 3, None, Some(2_002_000)),
        step(2, "sleep", &["gpu01"], 0, Some(9), Some(2_003_000)),
        step(3, "stuck", &["gpu01"], 0, None, None),
    ];
    let cols = sacct::parse_fields("JobID,JobName,Partition,AllocCPUS,NNodes,NodeList,State,ExitCode,Elapsed").unwrap();
    assert_eq!(
        sacct::table_rows(&sacct::rows(&[&batch], true), &cols, sacct::Style::Parsable2, false, &names_map(), 0),
        "42|train_model_long|gpu|16|2|gpu[01-02]|COMPLETED|0:0|00:01:05\n\
         42.batch|batch||8|1|gpu01|COMPLETED|0:0|00:01:05\n\
         42.extern|extern||16|2|gpu[01-02]|COMPLETED|0:0|00:01:05\n\
         42.0|python||16|2|gpu[01-02]|COMPLETED|0:0|00:00:30\n\
         42.1|hostname||16|1|gpu02|FAILED|3:0|00:00:01\n\
         42.2|sleep||16|1|gpu01|FAILED|0:9|00:00:02\n\
         42.3|stuck||16|1|gpu01|CANCELLED|0:0|00:01:04\n"
    );
    let cols = sacct::parse_fields("JobName%20,JobID%5").unwrap();
    // A width replaces the default's sign too, as sacct's `fields[i].len = newlen`: JobID%5 is right-justified.
    assert_eq!(cols, vec![sacct::Column { name: "JobName", width: 20 }, sacct::Column { name: "JobID", width: 5 }]);
    assert_eq!(sacct::parse_fields("Bogus").unwrap_err().text, "sacct: error: Invalid field requested: \"Bogus\"");
    let mut arr = listed(50, "a", JobState::Completed);
    arr.array = Some(ArrayTask { array_job: 49, task: 3 });
    assert_eq!(sacct::value(&arr, "JobID", &names_map(), 0), "49_3");
    let f = sacct::Filter { jobs: vec!["49".into()], ..Default::default() };
    assert!(f.matches(&arr, &names_map()));
    let f = sacct::Filter { start_ms: Some(10_000_000), ..Default::default() };
    assert!(!f.matches(&failed, &names_map()));
    assert!(f.matches(&cancelled, &names_map()) || cancelled.end_ms.is_some());
}

/// `ID.extern` (Slurm's step with `PrologFlags=Contain`; in Corral the job's allocation on its
/// nodes): after `ID.batch`, before `ID.0`, once the job started; the job's nodes, CPUs, TRES,
/// start and end; RUNNING while the job runs, COMPLETED once it ended, CANCELLED after a
/// NODE_FAIL; exit 0:0 whatever the job's.
#[test]
fn sacct_shows_the_extern_step_of_every_job_that_started() {
    let mut job = listed(60, "ext", JobState::Running);
    std::sync::Arc::make_mut(&mut job.spec).set_batch(true);
    std::sync::Arc::make_mut(&mut job.spec).nodes = 2;
    std::sync::Arc::make_mut(&mut job.spec).cpus_per_task = 4;
    std::sync::Arc::make_mut(&mut job.spec).gres = Some(GresRequest { gpu_type: None, count: 2, ..Default::default() });
    job.start_ms = Some(3_000_000);
    job.last_nodes = vec![1, 2];
    job.steps = vec![proto::StepRecord {
        step: 0,
        name: "python".into(),
        nodes: vec!["gpu02".into()],
        ntasks: 1,
        start_ms: 3_001_000,
        end_ms: Some(3_002_000),
        ended_on: vec!["gpu02".into()],
        exit_code: 0,
        signal: None,
    }];
    let cols = sacct::parse_fields("JobID,JobName,AllocCPUS,NNodes,NodeList,State,ExitCode,Start,End,AllocTRES").unwrap();
    let table = |j: &Job| sacct::table_rows(&sacct::rows(&[j], true), &cols, sacct::Style::Parsable2, false, &names_map(), 3_010_000);
    let start = time::datetime(3_000_000);
    let tres = "billing=8,cpu=8,gres/gpu=4,mem=2G,node=2";
    assert_eq!(
        table(&job),
        format!(
            "60|ext|8|2|gpu[01-02]|RUNNING|0:0|{start}|Unknown|{tres}\n\
             60.batch|batch|4|1|gpu01|RUNNING|0:0|{start}|Unknown|cpu=4,gres/gpu=2,mem=1G,node=1\n\
             60.extern|extern|8|2|gpu[01-02]|RUNNING|0:0|{start}|Unknown|{tres}\n\
             60.0|python|4|1|gpu02|COMPLETED|0:0|{}|{}|cpu=4,gres/gpu=2,mem=1G,node=1\n",
            time::datetime(3_001_000),
            time::datetime(3_002_000)
        )
    );
    // Ended: COMPLETED with the job's end, whatever the job's own exit.
    job.state = JobState::Failed;
    job.exit_code = Some(3);
    job.end_ms = Some(3_600_000);
    let end = time::datetime(3_600_000);
    let extern_line = |j: &Job| table(j).lines().find(|l| l.starts_with("60.extern|")).map(str::to_string);
    assert_eq!(extern_line(&job), Some(format!("60.extern|extern|8|2|gpu[01-02]|COMPLETED|0:0|{start}|{end}|{tres}")));
    job.state = JobState::NodeFail;
    job.exit_code = None;
    assert_eq!(extern_line(&job), Some(format!("60.extern|extern|8|2|gpu[01-02]|CANCELLED|0:0|{start}|{end}|{tres}")));
    // An srun allocation has no batch script but an extern step; a job that never ran has neither.
    let mut srun_alloc = listed(61, "x", JobState::Completed);
    srun_alloc.end_ms = Some(1_800_000_020_000);
    srun_alloc.last_nodes = vec![1];
    let ids = |j: &Job| sacct::rows(&[j], true).iter().map(|r| sacct::step_value(*r, "JobID", &names_map(), 0)).collect::<Vec<_>>();
    assert_eq!(ids(&srun_alloc), ["61", "61.extern"]);
    let mut never = listed(62, "n", JobState::Cancelled);
    never.start_ms = None;
    assert_eq!(ids(&never), ["62"]);
}

/// Every key of `schema` (resolving `$ref`s in `schemas`) in `value` with the schema's JSON
/// type, under `path`; `problems` collects what differs.
fn check_against_schema(
    value: &serde_json::Value,
    schema: &serde_json::Value,
    schemas: &serde_json::Value,
    path: &str,
    problems: &mut Vec<String>,
) {
    use serde_json::Value;
    let schema = match schema["$ref"].as_str() {
        Some(r) => &schemas[r.trim_start_matches("#/components/schemas/")],
        None => schema,
    };
    // Where Slurm 22.05's dumper (src/plugins/openapi/dbv0.0.38/parse.c) prints another type
    // than its own openapi.json says: `allocation_nodes` is dumped as UINT32, a numbered step's
    // `step.id` by `_dump_step_id` as an integer, `task` as `task/distribution`.
    let dumped_as = match path {
        "job.allocation_nodes" => Some("integer"),
        "step.step.id" if value.is_number() => Some("integer"),
        "step.task" => Some("object"),
        _ => None,
    };
    // Values Slurm dumps as null where the database has none (a NULL string, NO_VAL), which
    // Corral has none of either.
    const NULLS: &[&str] = &[
        "job.comment.administrator",
        "job.comment.job",
        "job.comment.system",
        "job.group",
        "job.time.limit",
        "job.array.task",
        "job.array.task_id",
        "job.het.job_offset",
        "job.kill_request_user",
        "job.association.partition",
        "step.pid",
        "step.kill_request_user",
        "step.CPU.requested_frequency.min",
        "step.CPU.requested_frequency.max",
        "step.step.het.component",
        "tres.name",
    ];
    let want = dumped_as.unwrap_or_else(|| schema["type"].as_str().unwrap_or("object"));
    let got = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    if got == "null" && (NULLS.contains(&path) || (path.ends_with("exit_code.return_code") && want == "integer")) {
        return;
    }
    if got != want {
        problems.push(format!("{path}: {got}, the schema's is {want}: {value}"));
        return;
    }
    if dumped_as.is_some() {
        return;
    }
    let item_path = |p: &str| match schema["items"]["$ref"].as_str() {
        Some(r) if r.ends_with("dbv0.0.38_job_step") => "step".to_string(),
        _ if schema["items"]["properties"].get("count").is_some() => "tres".to_string(),
        _ => format!("{p}[]"),
    };
    match value {
        Value::Array(items) => {
            for item in items {
                check_against_schema(item, &schema["items"], schemas, &item_path(path), problems);
            }
        }
        Value::Object(map) => {
            let props = schema["properties"].as_object().cloned().unwrap_or_default();
            for (key, sub) in &props {
                match map.get(key) {
                    Some(v) => check_against_schema(v, sub, schemas, &format!("{path}.{key}"), problems),
                    // `signal` is there only for a signaled exit (`_dump_job_exit_code`).
                    None if key == "signal" && map.get("status") != Some(&serde_json::json!("SIGNALED")) => {}
                    None => problems.push(format!("{path}.{key}: missing")),
                }
            }
            for key in map.keys().filter(|k| !props.contains_key(*k)) {
                // `_foreach_step` adds each step's `nodes.list`, which the schema leaves out.
                if format!("{path}.{key}") != "step.nodes.list" {
                    problems.push(format!("{path}.{key}: not in the schema"));
                }
            }
        }
        _ => {}
    }
}

/// `sacct --json`'s job objects have every key of Slurm 22.05's `dbv0.0.38_job` and
/// `dbv0.0.38_job_step` schemas with their types. The reference is Slurm's source at tag
/// `slurm-22-05-8-1` (the Slurm 22.05 here has no slurmdbd, so it cannot print them):
/// `src/plugins/openapi/dbv0.0.38/openapi.json` (the fixture is its schemas verbatim),
/// `src/plugins/openapi/dbv0.0.38/parse.c` (what is dumped, and how) and `src/sacct/data.c`.
#[test]
fn sacct_json_has_every_key_of_slurm_22_05_dbv0_0_38_jobs_with_its_type() {
    use serde_json::json;
    use slurm_compat::acct;
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../../../tests/fixtures/slurm_json/sacct_dbv0.0.38_schema.json")).expect("fixture");
    let schemas = &fixture["schemas"];
    let mut job = listed(70, "train", JobState::Failed);
    std::sync::Arc::make_mut(&mut job.spec).set_batch(true);
    std::sync::Arc::make_mut(&mut job.spec).nodes = 2;
    std::sync::Arc::make_mut(&mut job.spec).gres = Some(GresRequest { gpu_type: Some("h100".into()), count: 1, ..Default::default() });
    std::sync::Arc::make_mut(&mut job.spec).time_limit_ms = Some(600_000);
    std::sync::Arc::make_mut(&mut job.spec).gid = Some(100);
    job.start_ms = Some(1_800_000_010_000);
    job.end_ms = Some(1_800_000_070_000);
    job.exit_code = Some(3);
    job.last_nodes = vec![1, 2];
    job.steps = vec![proto::StepRecord {
        step: 0,
        name: "python".into(),
        nodes: vec!["gpu01".into(), "gpu02".into()],
        ntasks: 2,
        start_ms: 1_800_000_020_000,
        end_ms: Some(1_800_000_050_000),
        ended_on: vec!["gpu01".into(), "gpu02".into()],
        exit_code: 0,
        signal: Some(9),
    }];
    let names = names_map();
    let ours = acct::db_job(&job, &names, 1_800_000_100_000, true);
    let mut problems = Vec::new();
    check_against_schema(&ours, &schemas["dbv0.0.38_job"], schemas, "job", &mut problems);
    assert!(problems.is_empty(), "{problems:#?}\n{ours:#}");
    // The check sees a key missing, a type changed, a step's key missing.
    let mut broken = ours.clone();
    broken.as_object_mut().map(|o| o.remove("user"));
    broken["job_id"] = json!("70");
    broken["steps"][2]["tasks"] = json!({});
    let mut problems = Vec::new();
    check_against_schema(&broken, &schemas["dbv0.0.38_job"], schemas, "job", &mut problems);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(
        problems[0].starts_with("job.job_id: string") && problems[1] == "step.tasks.count: missing" && problems[2] == "job.user: missing",
        "{problems:#?}"
    );

    // The values are the job's, as its text lines show them.
    assert_eq!(
        (&ours["job_id"], &ours["name"], &ours["user"], &ours["nodes"]),
        (&json!(70), &json!("train"), &json!("alice"), &json!("gpu[01-02]"))
    );
    assert_eq!(ours["state"], json!({"current": "FAILED", "reason": "NonZeroExitCode"}));
    // 22.05 tests WIFEXITED first: any normal exit is SUCCESS (wait status 768 here).
    assert_eq!(ours["exit_code"], json!({"status": "SUCCESS", "return_code": 0}));
    assert_eq!(
        (&ours["time"]["start"], &ours["time"]["end"], &ours["time"]["elapsed"], &ours["time"]["limit"]),
        (&json!(1_800_000_010), &json!(1_800_000_070), &json!(60), &json!(10))
    );
    assert_eq!((&ours["allocation_nodes"], &ours["required"]["CPUs"], &ours["group"]), (&json!(2), &json!(2), &json!("100")));
    let tres = |v: &serde_json::Value| {
        v.as_array()
            .map(|a| a.iter().map(|t| format!("{}={}", t["type"].as_str().unwrap_or("?"), t["count"])).collect::<Vec<_>>().join(","))
    };
    assert_eq!(tres(&ours["tres"]["allocated"]).as_deref(), Some("cpu=2,mem=2048,node=2,billing=2,gres=2"));
    let steps = ours["steps"].as_array().expect("steps");
    let ids: Vec<&serde_json::Value> = steps.iter().map(|s| &s["step"]["id"]).collect();
    assert_eq!(ids, [&json!("batch"), &json!("extern"), &json!(0)]);
    let states: Vec<&str> = steps.iter().filter_map(|s| s["state"].as_str()).collect();
    assert_eq!(states, ["FAILED", "COMPLETED", "FAILED"]);
    assert_eq!(steps[1]["nodes"], json!({"count": 2, "range": "gpu[01-02]", "list": ["gpu01", "gpu02"]}));
    assert_eq!(steps[1]["exit_code"], json!({"status": "SUCCESS", "return_code": 0}));
    assert_eq!(steps[0]["nodes"]["list"], json!(["gpu01"]));
    assert_eq!(steps[2]["exit_code"], json!({"status": "SIGNALED", "return_code": null, "signal": {"signal_id": 9, "name": "Killed"}}));
    assert_eq!(
        (&steps[2]["time"]["elapsed"], &steps[2]["tasks"]["count"], &steps[2]["step"]["name"]),
        (&json!(30), &json!(2), &json!("python"))
    );
    // -X: no steps; the envelope is every --json output's.
    assert_eq!(acct::db_job(&job, &names, 0, false)["steps"], json!([]));
    let all = acct::db_jobs(vec![ours.clone()]);
    assert_eq!((&all["errors"], &all["meta"]["plugin"]["type"]), (&json!([]), &json!("openapi/v0.0.38")));
    // A job that never started: no allocation, no steps, its request all the same.
    let mut pending = listed(71, "wait", JobState::Pending);
    pending.start_ms = None;
    let ours = acct::db_job(&pending, &names, 0, true);
    let mut problems = Vec::new();
    check_against_schema(&ours, &schemas["dbv0.0.38_job"], schemas, "job", &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!((&ours["nodes"], &ours["steps"], &ours["tres"]["allocated"]), (&json!("None assigned"), &json!([]), &json!([])));
    assert_eq!(tres(&ours["tres"]["requested"]).as_deref(), Some("cpu=1,mem=1024,node=1,billing=1"));
}

fn node(id: u64, name: &str, state: NodeState, total: u32, free: u32) -> NodeInfo {
    NodeInfo {
        id,
        name: name.into(),
        addr: format!("127.0.0.1:{}", 7000 + id),
        state,
        role: NodeRole::Agent,
        gpus_total: total,
        gpus_free: free,
        gpu_types: vec!["h100".into()],
        cpus_total: 64,
        cpus_alloc: 0,
        memory_mib: 512 * 1024,
        memory_alloc_mib: 0,
        reason: None,
        unhealthy_gpus: vec![],
        cert_fingerprint: String::new(),
        // As the cluster sends it: a node that names no partition is in the default one.
        partitions: vec![proto::DEFAULT_PARTITION.into()],
        mig: vec![],
        reserved: false,
        maint: false,
    }
}

#[test]
fn sinfo_node_states_count_cpus_and_memory_too() {
    let with = |gpus_free: u32, cpus_alloc: u32, memory_alloc_mib: u64| {
        let mut n = node(1, "n1", NodeState::Up, 8, gpus_free);
        (n.cpus_alloc, n.memory_alloc_mib) = (cpus_alloc, memory_alloc_mib);
        sinfo::node_state(&n).0
    };
    assert_eq!(with(8, 0, 0), "idle");
    assert_eq!(with(8, 64, 1024), "alloc", "every CPU held by CPU-only jobs");
    assert_eq!(with(8, 1, 1024), "mix", "a CPU-only job on a GPU node");
    assert_eq!(with(8, 4, 512 * 1024), "alloc", "all its memory held");
    assert_eq!(with(0, 8, 1024), "alloc", "all its GPUs held");
    assert_eq!(with(4, 8, 1024), "mix");
    let mut drained = node(1, "n1", NodeState::Drained, 8, 8);
    drained.cpus_alloc = 2;
    assert_eq!(sinfo::node_state(&drained).0, "drng", "a drained node still running a CPU job is draining");
}

#[test]
fn sinfo_partitions_and_nodes() {
    let nodes = vec![
        node(1, "gpu01", NodeState::Up, 8, 8),
        node(2, "gpu02", NodeState::Up, 8, 8),
        node(3, "gpu03", NodeState::Up, 8, 4),
        node(4, "gpu04", NodeState::Up, 8, 0),
        node(5, "gpu05", NodeState::Down, 8, 8),
        node(6, "gpu06", NodeState::Drained, 8, 8),
    ];
    let f = sinfo::Filter::default();
    assert_eq!(
        sinfo::table(&nodes, sinfo::DEFAULT_FORMAT, true, false, &f),
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n\
         default*     up   infinite      2   idle gpu[01-02]\n\
         default*     up   infinite      1    mix gpu03\n\
         default*     up   infinite      1  alloc gpu04\n\
         default*     up   infinite      1  down* gpu05\n\
         default*     up   infinite      1  drain gpu06\n"
    );
    assert_eq!(
        sinfo::table(&nodes[..2], sinfo::NODE_FORMAT, true, true, &f),
        "NODELIST  NODES PARTITION STATE \ngpu01         1 default*  idle  \ngpu02         1 default*  idle  \n"
    );
    assert_eq!(sinfo::table(&nodes[..3], "%N %G", false, false, &f), "gpu[01-03] gpu:h100:8\n");
    let f = sinfo::Filter { states: vec!["idle".into()], ..Default::default() };
    assert_eq!(sinfo::table(&nodes, "%D %N", false, false, &f), "2 gpu[01-02]\n");

    // Partitions from the nodes' configs and the replicated policy (default, time limits).
    let mut nodes = nodes[..3].to_vec();
    nodes[2].partitions = vec!["long".into(), "debug".into()];
    let policy = proto::SchedulerPolicy {
        partitions: vec![
            proto::PartitionDef { name: "batch".into(), default: true, max_time_limit_ms: Some(2 * 86_400_000), ..Default::default() },
            proto::PartitionDef { name: "long".into(), ..Default::default() },
            proto::PartitionDef { name: "debug".into(), max_time_limit_ms: Some(1_800_000), ..Default::default() },
        ],
        ..Default::default()
    };
    for n in &mut nodes[..2] {
        // Naming none, they are in the policy's default, as the cluster lists them.
        n.partitions = policy.partitions_of_node(&n.name, &[]);
    }
    let parts = sinfo::Partitions::from_policy(&policy);
    assert_eq!(
        sinfo::table_with(&nodes, &parts, sinfo::DEFAULT_FORMAT, true, false, &sinfo::Filter::default()),
        "PARTITION AVAIL  TIMELIMIT  NODES  STATE NODELIST\n\
         batch*       up 2-00:00:00      2   idle gpu[01-02]\n\
         long         up   infinite      1    mix gpu03\n\
         debug        up      30:00      1    mix gpu03\n"
    );

    // A partition with no node has its row, as sinfo 22.05 prints it (checked on the peer after
    // `scontrol create PartitionName=empty`), but not among rows per node or chosen by state.
    let mut policy = policy;
    policy.partitions.push(proto::PartitionDef { name: "empty".into(), nodes: Some(vec![]), ..Default::default() });
    let parts = sinfo::Partitions::from_policy(&policy);
    let all = sinfo::Filter::default();
    let table = sinfo::table_with(&nodes, &parts, sinfo::DEFAULT_FORMAT, true, false, &all);
    assert!(table.ends_with("debug        up      30:00      1    mix gpu03\nempty        up   infinite      0    n/a \n"), "{table}");
    assert_eq!(sinfo::table_with(&nodes, &parts, "%P %a %D %t %N", false, false, &all).lines().last(), Some("empty up 0 n/a "));
    assert_eq!(sinfo::table_with(&nodes, &parts, "%P %F", false, false, &all).lines().last(), Some("empty 0/0/0/0"));
    let idle = sinfo::Filter { states: vec!["idle".into()], ..Default::default() };
    assert!(!sinfo::table_with(&nodes, &parts, "%P", false, false, &idle).contains("empty"));
    assert!(!sinfo::table_with(&nodes, &parts, sinfo::NODE_FORMAT, true, true, &all).contains("empty"));
}

#[test]
fn scontrol_commands() {
    assert_eq!(scontrol::hostnames("gpu[01-02],login").unwrap(), "gpu01\ngpu02\nlogin\n");
    assert_eq!(scontrol::hostnames("vm").unwrap(), "vm\n");
    assert_eq!(scontrol::hostlist_of("n3,n1,n2", false).unwrap(), "n[1-3]\n");
    assert_eq!(scontrol::hostlist_of("gpu01,gpu02,gpu03,gpu04,gpu07", false).unwrap(), "gpu[01-04,07]\n");
    assert_eq!(scontrol::hostnames("n[1-").unwrap_err().text, "scontrol: error: invalid hostlist 'n[1-': unbalanced '['");
    use scontrol::Command as C;
    let p = |a: &[&str]| scontrol::parse(&argv(a));
    assert_eq!(p(&["show", "hostnames", "n[1-2]"]), Ok(C::Hostnames(Some("n[1-2]".into()))));
    assert_eq!(p(&["show", "hostnames"]), Ok(C::Hostnames(None)));
    assert_eq!(p(&["show", "job", "5"]), Ok(C::ShowJob(Some("5".into()))));
    assert_eq!(p(&["-o", "show", "node", "gpu01"]), Ok(C::ShowNode(Some("gpu01".into()))));
    assert_eq!(p(&["requeue", "5,6"]), Ok(C::Requeue(vec![5, 6], false)));
    assert_eq!(p(&["hold", "5"]), Ok(C::Hold(vec![5])));
    assert_eq!(p(&["release", "5"]), Ok(C::Release(vec![5])));
    assert_eq!(
        p(&["update", "JobId=5", "TimeLimit=1:00:00", "Partition=gpu"]),
        Ok(C::Update { job: 5, time_limit_ms: Some(Some(3_600_000)), partition: Some("gpu".into()) })
    );
    assert_eq!(p(&["update", "JobId=5", "TimeLimit=soon"]).unwrap_err().text, "scontrol: error: Invalid TimeLimit value: soon");
    assert_eq!(p(&["requeue", "x"]).unwrap_err().text, "scontrol: error: Invalid job id specified: x");
    assert_eq!(p(&["frobnicate"]).unwrap_err().text, "scontrol: error: Invalid keyword: frobnicate");
    // Nodes: DRAIN needs a reason (Slurm's words), RESUME and UNDRAIN clear it, DOWN is refused.
    assert_eq!(
        p(&["update", "NodeName=gpu[01-02]", "State=drain", "Reason=bad fan"]),
        Ok(C::UpdateNodes { nodes: vec!["gpu01".into(), "gpu02".into()], drain: Some("bad fan".into()) })
    );
    assert_eq!(p(&["update", "nodename=gpu01", "State=RESUME"]), Ok(C::UpdateNodes { nodes: vec!["gpu01".into()], drain: None }));
    assert_eq!(p(&["update", "NodeName=gpu01", "State=UNDRAIN"]), Ok(C::UpdateNodes { nodes: vec!["gpu01".into()], drain: None }));
    assert_eq!(
        p(&["update", "NodeName=gpu01", "State=DRAIN"]).unwrap_err().text,
        "scontrol: error: You must specify a reason when DOWNING or DRAINING a node. Request denied"
    );
    let down = p(&["update", "NodeName=gpu01", "State=DOWN", "Reason=x"]).unwrap_err().text;
    assert!(down.contains("State=DOWN is not supported") && down.contains("State=DRAIN"), "{down}");
    assert!(p(&["update", "NodeName=gpu01", "Weight=5"]).unwrap_err().text.contains("Update of node Weight is not supported"));
    // Partition access lists: names, `ALL` or empty for none, keys in any case.
    let access = p(&["update", "PartitionName=gpu", "AllowAccounts=phys,chem", "denyqos=low", "AllowGroups=ALL", "DenyAccounts="]);
    let C::EditPartition(proto::PartitionEdit::Update { name, changes }) = access.expect("parse") else { panic!("an update") };
    assert_eq!(name, "gpu");
    let names = |l: &[&str]| Some(l.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    assert_eq!(
        (changes.allow_accounts, changes.deny_qos, changes.allow_groups, changes.deny_accounts, changes.allow_qos),
        (names(&["phys", "chem"]), names(&["low"]), names(&[]), names(&[]), None)
    );
    // Hold is a real request now: with no cluster configured it fails to reach one.
    let err = scontrol::run(&argv(&["hold", "5"])).unwrap_err().text;
    assert!(err.starts_with("scontrol: error: Unable to contact slurm controller"), "{err}");
}

#[test]
fn scontrol_show_job_layout() {
    let mut j = listed(9, "train", JobState::Running);
    std::sync::Arc::make_mut(&mut j.spec).gres = Some(GresRequest { gpu_type: Some("h100".into()), count: 8, ..Default::default() });
    std::sync::Arc::make_mut(&mut j.spec).output = Some("slurm-%j.out".into());
    j.parts = vec![NodeRun { run: 1, alloc: Allocation { node: 1, gpus: vec![], cpus: 1, mem_mib: 1 }, launched_by: Some(1) }];
    j.last_nodes = vec![1];
    let text = scontrol::job_text(&j, &names_map(), 1_800_000_070_000);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "JobId=9 JobName=train");
    assert_eq!(lines[3], "   JobState=RUNNING Reason=None Dependency=(null)");
    assert_eq!(lines[5], "   RunTime=00:01:00 TimeLimit=UNLIMITED TimeMin=N/A");
    assert!(lines.contains(&"   NodeList=gpu01"));
    assert!(lines.contains(&"   StdOut=/w/slurm-9.out"));
    assert!(lines.contains(&"   TresPerNode=gres:gpu:h100:8"));
    assert!(!text.contains("SpareNodes="), "only a job with spares has the line");
    // A job with spares: those left, and its repairs.
    let mut spared = j.clone();
    std::sync::Arc::make_mut(&mut spared.spec).set_spare_nodes(2);
    spared.spares = vec![2];
    spared.repairs = vec![proto::Repair { run: 1, rank: 1, lost: 3, spare: 1, at_ms: 1_800_000_000_000, reason: "node down".into() }];
    let text = scontrol::job_text(&spared, &names_map(), 1_800_000_070_000);
    let line = text.lines().find(|l| l.contains("SpareNodes=")).unwrap_or_default();
    assert!(line.starts_with("   SpareNodes=gpu02 Repairs=1:3>gpu01@"), "{line}");
    // Slurm's SystemComment line after WorkDir, with its trailing blank: a line per repair.
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| l.starts_with("   WorkDir=")).expect("WorkDir");
    let when = super::time::datetime(1_800_000_000_000);
    assert_eq!(lines[at + 1], format!("   SystemComment=run 1 rank 1 moved from node3 to spare gpu01 at {when} (node down) "));
    assert!(!scontrol::job_text(&j, &names_map(), 0).contains("SystemComment="), "a job never repaired has none");
    // A job that left the queue shows why, as Slurm does.
    for (state, exit_code, reason, code) in [
        (JobState::Timeout, None, "TimeLimit", "0:15"),
        (JobState::NodeFail, None, "NodeDown", "0:0"),
        (JobState::OutOfMemory, None, "OutOfMemory", "0:125"),
        (JobState::Failed, Some(3), "NonZeroExitCode", "3:0"),
        (JobState::Failed, None, "JobLaunchFailure", "0:0"),
        (JobState::Completed, Some(0), "None", "0:0"),
        (JobState::Cancelled, None, "None", "0:15"),
    ] {
        let mut done = j.clone();
        (done.state, done.exit_code) = (state, exit_code);
        let text = scontrol::job_text(&done, &names_map(), 1_800_000_070_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[3], format!("   JobState={state} Reason={reason} Dependency=(null)"));
        assert!(lines[4].ends_with(&format!("ExitCode={code}")), "{}", lines[4]);
    }
    // Killed by a signal: Slurm's code:signal is 0:9; a script that exited 137 itself is 137:0.
    let mut killed = j.clone();
    (killed.state, killed.exit_code) = (JobState::Failed, Some(137));
    killed.outcomes = vec![(1, proto::RunOutcome::Signaled(9))];
    assert_eq!(super::exit_code_text(&killed), "0:9");
    killed.outcomes.clear();
    killed.reasons = vec!["killed by signal 9".into()];
    assert_eq!(super::exit_code_text(&killed), "0:9", "an archived record keeps only the reason");
    killed.reasons.clear();
    killed.outcomes = vec![(1, proto::RunOutcome::Exited(137))];
    assert_eq!(super::exit_code_text(&killed), "137:0");
}

/// Durations as each Slurm command prints them, from its source: `secs2time_str` (sacct's
/// Elapsed and Timelimit, scontrol's RunTime, TimeLimit, MaxTime), squeue's `_print_secs` (TIME,
/// TIME_LIMIT, TIME_LEFT: `INVALID` below 0 or past a year), sinfo's (TIMELIMIT, no such check).
#[test]
fn durations_as_each_command_prints_them() {
    for (secs, full, short) in [
        (0, "00:00:00", "0:00"),
        (5, "00:00:05", "0:05"),
        (1_800, "00:30:00", "30:00"),
        (3_723, "01:02:03", "1:02:03"),
        (8 * 3_600, "08:00:00", "8:00:00"),
        (2 * 86_400, "2-00:00:00", "2-00:00:00"),
        (86_400 + 3_723, "1-01:02:03", "1-01:02:03"),
    ] {
        assert_eq!(time::elapsed(secs), full);
        assert_eq!(time::elapsed_signed(secs as i64), full);
        assert_eq!(time::squeue_duration(secs as i64), short);
        assert_eq!(time::duration(secs), short);
    }
    assert_eq!(time::elapsed_signed(-1), "INVALID");
    assert_eq!(time::squeue_duration(-5), "INVALID");
    assert_eq!(time::squeue_duration(365 * 86_400), "365-00:00:00");
    assert_eq!(time::squeue_duration(365 * 86_400 + 1), "INVALID");
    assert_eq!(time::duration(400 * 86_400), "400-00:00:00");
}

/// Dates as `slurm_make_time_str` prints them: `%FT%T` by default, or as `SLURM_TIME_FORMAT`
/// asks (`relative`, a strftime format; one without `%` or of 32 bytes or more is refused).
#[test]
fn dates_follow_slurm_time_format() {
    use time::DateFormat;
    for standard in [None, Some(""), Some("standard")] {
        assert_eq!(DateFormat::from_value(standard), Ok(DateFormat::Standard));
    }
    assert_eq!(DateFormat::from_value(Some("relative")), Ok(DateFormat::Relative));
    assert_eq!(DateFormat::from_value(Some("%s")), Ok(DateFormat::Custom("%s".into())));
    assert_eq!(DateFormat::from_value(Some("iso")), Err("iso".to_string()));
    assert!(DateFormat::from_value(Some(&format!("%F{}", "x".repeat(30)))).is_err());
    let at_ms = 1_800_000_000_000;
    let standard = time::datetime_as(at_ms, &DateFormat::Standard, 0);
    assert_eq!(standard.len(), 19);
    assert_eq!(&standard[10..11], "T");
    assert_eq!(time::datetime_as(at_ms, &DateFormat::Custom("%s".into()), 0), "1800000000");
    let relative = |now_s: i64| time::datetime_as(at_ms, &DateFormat::Relative, now_s);
    let day_s = 86_400;
    assert_eq!(relative(1_800_000_000), &standard[11..]);
    assert_eq!(relative(1_800_000_000 + day_s), format!("Ystday {}", &standard[11..16]));
    assert_eq!(relative(1_800_000_000 - day_s), format!("Tomorr {}", &standard[11..16]));
    assert!(relative(1_800_000_000 - 3 * day_s).ends_with(&standard[11..16]), "a weekday and the time");
    assert!(relative(1_800_000_000 + 400 * day_s).ends_with(&standard[..4]), "far away: day, month, year");
}

/// squeue's TIME_LEFT of a job past its limit is `INVALID`; its durations are not cut to a
/// right-justified width (`squeue -l`'s `%.9l` prints `2-00:00:00` whole), a left-justified one
/// is; END_TIME of a running job is its start plus its limit, `NONE` without one.
#[test]
fn squeue_times_as_slurm_prints_them() {
    let mut j = listed(31, "t", JobState::Running);
    j.last_nodes = vec![1];
    let start_ms = 1_800_000_010_000;
    std::sync::Arc::make_mut(&mut j.spec).time_limit_ms = Some(2 * 86_400_000);
    let table = |j: &Job, format: &str, now_ms| squeue::table(std::slice::from_ref(j), &names_map(), format, false, false, now_ms);
    assert_eq!(table(&j, "%.9l|%9l|%.4M|%.5L", start_ms + 65_000), "2-00:00:00|2-00:00:0|1:05|1-23:58:55\n");
    assert_eq!(table(&j, "%e", start_ms), format!("{}\n", time::datetime(start_ms + 2 * 86_400_000)));
    std::sync::Arc::make_mut(&mut j.spec).time_limit_ms = Some(60_000);
    assert_eq!(table(&j, "%L|%l", start_ms + 90_000), "INVALID|1:00\n");
    std::sync::Arc::make_mut(&mut j.spec).time_limit_ms = None;
    assert_eq!(table(&j, "%e|%.5l|%L", start_ms), "NONE|UNLIM|UNLIMITED\n");
    // A node list is not cut either.
    assert_eq!(table(&j, "%.3N|%.3R|%3N", start_ms), "gpu01|gpu01|gpu\n");
}

/// scontrol show job's times: `EligibleTime` and `AccrueTime` `Unknown` while the job cannot
/// run (held here), `TimeLimit` as `secs2time_str`, `EndTime` of a running job its start plus
/// its limit; TRES in Slurm's order with billing.
#[test]
fn scontrol_show_job_times() {
    let mut held = listed(32, "h", JobState::Pending);
    std::sync::Arc::make_mut(&mut held.spec).hold = true;
    held.start_ms = None;
    let text = scontrol::job_text(&held, &names_map(), 1_800_000_070_000);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[5], "   RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A");
    assert_eq!(lines[6], format!("   SubmitTime={} EligibleTime=Unknown", time::datetime(1_800_000_000_000)));
    assert_eq!(lines[7], "   AccrueTime=Unknown");
    assert_eq!(lines[8], "   StartTime=Unknown EndTime=Unknown Deadline=N/A");
    let mut running = listed(33, "r", JobState::Running);
    std::sync::Arc::make_mut(&mut running.spec).time_limit_ms = Some(8 * 3_600_000);
    running.last_nodes = vec![1];
    let text = scontrol::job_text(&running, &names_map(), 1_800_000_070_000);
    let lines: Vec<&str> = text.lines().collect();
    let (submit, start) = (time::datetime(1_800_000_000_000), time::datetime(1_800_000_010_000));
    assert_eq!(lines[5], "   RunTime=00:01:00 TimeLimit=08:00:00 TimeMin=N/A");
    assert_eq!(lines[6], format!("   SubmitTime={submit} EligibleTime={submit}"));
    assert_eq!(lines[7], format!("   AccrueTime={submit}"));
    assert_eq!(lines[8], format!("   StartTime={start} EndTime={} Deadline=N/A", time::datetime(1_800_000_010_000 + 8 * 3_600_000)));
    assert!(lines.contains(&"   TRES=cpu=1,mem=1G,node=1,billing=1"), "{text}");
}

#[test]
fn scancel_targets() {
    use scancel::Target;
    assert_eq!(scancel::parse_target("12"), Some(Target::Job(12)));
    assert_eq!(scancel::parse_target("12_3"), Some(Target::Tasks(12, vec![3])));
    assert_eq!(scancel::parse_target("12_[1-3,7]"), Some(Target::Tasks(12, vec![1, 2, 3, 7])));
    assert_eq!(scancel::parse_target("x"), None);
    let mut jobs = vec![listed(12, "a", JobState::Pending), listed(20, "b", JobState::Running)];
    for t in 1..=3 {
        let mut j = listed(12 + u64::from(t), "a", JobState::Pending);
        j.array = Some(ArrayTask { array_job: 12, task: t });
        jobs.push(j);
    }
    let ids = |t: Target| scancel::select(&jobs, &t).iter().map(|j| j.id).collect::<Vec<_>>();
    assert_eq!(ids(Target::Job(12)), vec![12, 13, 14, 15]);
    assert_eq!(ids(Target::Tasks(12, vec![2])), vec![14]);
    assert_eq!(ids(Target::Job(20)), vec![20]);
    assert!(ids(Target::Job(99)).is_empty());
}

#[test]
fn srun_step_plan() {
    let mut env = BTreeMap::new();
    for (k, v) in [
        ("SLURM_JOB_ID", "7"),
        ("SLURM_JOB_NODELIST", "gpu[01-04]"),
        ("SLURMD_NODENAME", "gpu02"),
        ("SLURM_NODEID", "1"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_NTASKS_PER_NODE", "1"),
        ("CUDA_VISIBLE_DEVICES", "0,1,2,3"),
    ] {
        env.insert(k.to_string(), v.to_string());
    }
    let parse = |a: &[&str]| opts::parse("srun", srun::OPTIONS, &argv(a), true).unwrap();
    // `srun torchrun ...` in a 4-node job with one task per node: this node runs rank 1.
    let plan = srun::plan_step(&parse(&["torchrun", "--nnodes=4"]), &env, 0).unwrap();
    assert_eq!(plan.nodes.len(), 4);
    assert_eq!(plan.tasks_per_node, vec![1, 1, 1, 1]);
    assert_eq!(plan.node_index, Some(1));
    assert_eq!(plan.tasks.len(), 1);
    let t = &plan.tasks[0];
    let pick = |k: &str| t.env.get(k).map(String::as_str);
    assert_eq!((t.rank, t.local_id), (1, 0));
    assert_eq!(pick("SLURM_PROCID"), Some("1"));
    assert_eq!(pick("SLURM_STEP_NODELIST"), Some("gpu[01-04]"));
    assert_eq!(pick("SLURM_STEP_NUM_NODES"), Some("4"));
    assert_eq!(pick("SLURM_STEP_NUM_TASKS"), Some("4"));
    assert_eq!(pick("SLURM_STEP_ID"), Some("0"));
    assert_eq!(pick("SLURM_NODEID"), Some("1"));
    // -n 8 --ntasks-per-node=2 with a GPU each: ranks 2 and 3 here.
    let plan = srun::plan_step(&parse(&["-n", "8", "--ntasks-per-node=2", "--gpus-per-task=2", "python", "x.py"]), &env, 3).unwrap();
    let ranks: Vec<(u32, u32, Option<&str>)> =
        plan.tasks.iter().map(|t| (t.rank, t.local_id, t.env.get("CUDA_VISIBLE_DEVICES").map(String::as_str))).collect();
    assert_eq!(ranks, vec![(2, 0, Some("0,1")), (3, 1, Some("2,3"))]);
    // -N 1: only the first node takes part, so this node runs nothing.
    let plan = srun::plan_step(&parse(&["-N", "1", "hostname"]), &env, 1).unwrap();
    assert_eq!((plan.node_index, plan.tasks.len()), (None, 0));
    assert_eq!(
        srun::plan_step(&parse(&["-w", "other", "hostname"]), &env, 1).unwrap_err().text,
        "srun: error: Requested node configuration is not available: other is not in the allocation"
    );
}

#[test]
fn srun_step_spec_for_the_agents_and_the_script_of_an_allocation() {
    let env: BTreeMap<String, String> = [
        ("SLURM_JOB_ID", "7"),
        ("SLURM_JOB_NODELIST", "gpu[01-02]"),
        ("SLURMD_NODENAME", "gpu01"),
        ("SLURM_NTASKS", "4"),
        ("SLURM_NTASKS_PER_NODE", "2"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut caller = env.clone();
    caller.insert("FOO".into(), "1".into());
    let parse = |a: &[&str]| opts::parse("srun", srun::OPTIONS, &argv(a), true).unwrap();
    let spec = srun::step_spec(&parse(&["-l", "--gpus-per-task=gpu:2", "python", "x.py"]), &env, &caller, "/work").unwrap();
    assert_eq!(spec.argv, vec!["python", "x.py"]);
    assert_eq!(spec.workdir.as_deref(), Some("/work"), "tasks start where srun ran");
    let nodes: Vec<(&str, Vec<u32>)> = spec.nodes.iter().map(|n| (n.name.as_str(), n.ranks.clone())).collect();
    assert_eq!(nodes, vec![("gpu01", vec![0, 1]), ("gpu02", vec![2, 3])]);
    assert_eq!(spec.gpus_per_task, Some(2));
    assert_eq!(spec.env.get("FOO").map(String::as_str), Some("1"), "--export=ALL by default");
    assert_eq!(spec.env.get("SLURM_STEP_NUM_TASKS").map(String::as_str), Some("4"));
    assert_eq!(spec.env.get("SLURM_STEP_TASKS_PER_NODE").map(String::as_str), Some("2(x2)"));
    let none = srun::step_spec(&parse(&["--export=NONE", "-N1", "true"]), &env, &caller, "/work").unwrap();
    assert!(!none.env.contains_key("FOO"));
    assert_eq!(none.env.get("SLURM_JOB_ID").map(String::as_str), Some("7"), "SLURM_* pass in any case");
    assert_eq!(none.nodes.len(), 1);
    assert_eq!(
        srun::step_spec(&parse(&["--gpus-per-task=x", "true"]), &env, &caller, "/").unwrap_err().text,
        "srun: error: Invalid --gpus-per-task specification: x"
    );
    // Steps hold their tasks' CPUs with -c (which implies --exact) and memory by --mem*.
    let c2 = srun::step_spec(&parse(&["-n1", "-c2", "--mem=1G", "true"]), &env, &caller, "/").unwrap();
    assert_eq!((c2.cpus_per_task, c2.exact, c2.memory), (2, true, proto::StepMemory::PerNodeMib(1024)));
    let whole = srun::step_spec(&parse(&["-n1", "--exact", "--whole", "--mem=0", "true"]), &env, &caller, "/").unwrap();
    assert_eq!((whole.exact, whole.memory), (false, proto::StepMemory::Shared));
    let mut per_cpu = env.clone();
    per_cpu.insert("SLURM_MEM_PER_CPU".into(), "512".into());
    let inherited = srun::step_spec(&parse(&["-n1", "--exclusive", "true"]), &per_cpu, &caller, "/").unwrap();
    assert_eq!((inherited.exact, inherited.memory), (true, proto::StepMemory::PerCpuMib(512)), "the job's --mem-per-cpu, as Slurm's srun");
    let plain = srun::step_spec(&parse(&["true"]), &env, &caller, "/").unwrap();
    assert_eq!((plain.cpus_per_task, plain.exact, plain.memory), (1, false, proto::StepMemory::Whole));
}

/// The environment a real Slurm 22.05 gave the tasks of `srun` steps (captured on this host by
/// `shared/peers/slurm`, see the file's header), compared field by field with what `srun`
/// (`step_spec`) and the agent (`step_task_env`) compute from the same batch environment.
#[test]
fn srun_task_environment_matches_a_real_slurm_field_by_field() {
    let fixture = include_str!("../../../tests/fixtures/slurm_step_env.txt");
    let env_of = |file: &str| -> BTreeMap<String, String> {
        let prefix = format!("{file}: ");
        fixture
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    // Set by srun's own protocol (ports, hosts, pids, pack groups), or by srun from its process
    // (SLURM_UMASK, passed in `run_step`): not compared.
    const NOT_COMPARED: &[&str] = &[
        "SLURM_SRUN_COMM_PORT",
        "SLURM_STEP_LAUNCHER_PORT",
        "SLURM_SRUN_COMM_HOST",
        "SLURM_LAUNCH_NODE_IPADDR",
        "SLURM_TASK_PID",
        "SLURM_JOB_CPUS_PER_NODE_PACK_GROUP_0",
        "SLURM_UMASK",
    ];
    let parse = |a: &[&str]| opts::parse("srun", srun::OPTIONS, &argv(a), true).unwrap();
    // (job of the batch env, case, srun's arguments, step id, ranks)
    type Case<'a> = (&'a str, &'a str, &'a [&'a str], u32, &'a [&'a str]);
    let cases: [Case; 4] = [
        ("case1", "case1", &["bash"], 0, &["0", "1"]),
        ("case1", "case2", &["-n", "1", "bash"], 1, &["0"]),
        ("case3", "case3", &["--gpus-per-task=2", "-n", "2", "bash"], 0, &["0", "1"]),
        ("case4b", "case4b", &["--export=NONE", "-n", "1", "/bin/bash"], 0, &["0"]),
    ];
    for (batch, case, args, step, ranks) in cases {
        let caller = env_of(&format!("{batch}.batch.env"));
        assert!(!caller.is_empty(), "{batch}.batch.env in the fixture");
        // The node's own job environment: what the launcher sets (Slurm's and the GPUs), not
        // what the script exported.
        let node: BTreeMap<String, String> = caller
            .iter()
            .filter(|(k, _)| k.starts_with("SLURM") || k.starts_with("CUDA") || k.starts_with("GPU_"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let spec = srun::step_spec(&parse(args), &super::allocation_env(&caller), &caller, "/tmp").unwrap();
        assert_eq!(spec.nodes.len(), 1);
        let here = &spec.nodes[0];
        for (local, rank) in ranks.iter().enumerate() {
            let want = env_of(&format!("{case}.{rank}.env"));
            assert!(!want.is_empty(), "{case}.{rank}.env in the fixture");
            let got = slurm_compat::env::step_task_env(
                &node,
                &spec.env,
                step,
                0,
                &here.ranks,
                local,
                slurm_compat::env::TaskGpus { per_task: spec.gpus_per_task, step: None },
            );
            for (k, v) in &want {
                if NOT_COMPARED.contains(&k.as_str()) {
                    continue;
                }
                assert_eq!(got.get(k), Some(v), "{case} task {rank}: {k}");
            }
            for k in got.keys().filter(|k| k.starts_with("SLURM") || k.starts_with("CUDA") || k.starts_with("GPU_") || *k == "FOO") {
                assert!(want.contains_key(k), "{case} task {rank}: {k}={} is set but Slurm does not set it", got[k]);
            }
        }
    }
}

#[test]
fn time_formats() {
    assert_eq!(time::duration(0), "0:00");
    assert_eq!(time::duration(65), "1:05");
    assert_eq!(time::duration(3723), "1:02:03");
    assert_eq!(time::duration(2 * 86_400 + 3723), "2-01:02:03");
    assert_eq!(time::elapsed(65), "00:01:05");
    assert_eq!(time::elapsed(86_400 + 65), "1-00:01:05");
    let now = 1_800_000_000;
    assert_eq!(time::parse_point("now", now), Some(now));
    assert_eq!(time::parse_point("now-2days", now), Some(now - 2 * 86_400));
    assert_eq!(time::parse_point("now+3weeks", now), Some(now + 3 * 604_800));
    let l = time::to_local(now);
    assert_eq!(time::parse_point("today", now), Some(time::from_local(time::Local { hour: 0, minute: 0, second: 0, ..l })));
    assert_eq!(
        time::parse_point("2027-01-02", now),
        Some(time::from_local(time::Local { year: 2027, month: 1, day: 2, hour: 0, minute: 0, second: 0 }))
    );
    assert_eq!(time::parse_point("01/02/27", now), time::parse_point("2027-01-02", now));
    assert_eq!(time::parse_point("010227", now), time::parse_point("2027-01-02", now));
    assert!(time::parse_point("teatime", now).is_some_and(|t| t > now && t - now <= 86_400));
    assert!(time::parse_point("25:00", now).is_none());
    assert!(time::parse_point("2027-13-01", now).is_none());
}

#[test]
fn shims_are_symlinks_to_the_binary() {
    let dir = std::env::temp_dir().join(format!("corral-shims-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let target = PathBuf::from("/usr/local/bin/corral");
    let made = install_shims(&dir, &target).unwrap();
    assert_eq!(made.len(), 12);
    for name in COMMANDS {
        assert_eq!(std::fs::read_link(dir.join(name)).unwrap(), target);
    }
    // Again: replaced, not an error.
    install_shims(&dir, &target).unwrap();
    std::fs::remove_file(dir.join("sinfo")).unwrap();
    std::fs::write(dir.join("sinfo"), "not a link").unwrap();
    assert!(install_shims(&dir, &target).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn corral_variables_stand_in_for_missing_slurm_ones() {
    let dir = std::env::temp_dir().join(format!("corral-alloc-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hostfile = dir.join("hostfile");
    std::fs::write(&hostfile, "n1 slots=8\nn2 slots=8\n").unwrap();
    let mut env = BTreeMap::new();
    for (k, v) in [("CORRAL_JOB_ID", "9"), ("CORRAL_NODE", "n2"), ("CORRAL_NODE_RANK", "1"), ("CORRAL_NNODES", "2")] {
        env.insert(k.to_string(), v.to_string());
    }
    env.insert("CORRAL_HOSTFILE".to_string(), hostfile.display().to_string());
    env.insert("SLURM_NNODES".to_string(), "7".to_string());
    let e = allocation_env(&env);
    let pick = |k: &str| e.get(k).map(String::as_str);
    assert_eq!(
        (pick("SLURM_JOB_ID"), pick("SLURMD_NODENAME"), pick("SLURM_NODEID"), pick("SLURM_JOB_NODELIST"), pick("SLURM_NNODES")),
        (Some("9"), Some("n2"), Some("1"), Some("n[1-2]"), Some("7"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn scontrol_show_partition_lists_what_nodes_and_the_policy_define() {
    let mut a = node(1, "gpu01", NodeState::Up, 8, 8);
    a.partitions = vec!["batch".into(), "gpu".into()];
    let mut b = node(2, "gpu02", NodeState::Up, 8, 8);
    b.partitions = vec!["gpu".into()];
    let mut plain = node(3, "cpu01", NodeState::Up, 0, 0);
    let policy = proto::SchedulerPolicy {
        partitions: vec![
            proto::PartitionDef { name: "batch".into(), default: true, max_time_limit_ms: Some(2 * 86_400_000), ..Default::default() },
            proto::PartitionDef { name: "empty".into(), max_time_limit_ms: Some(1_800_000), ..Default::default() },
        ],
        ..Default::default()
    };
    plain.partitions = policy.partitions_of_node("cpu01", &[]);
    let parts = sinfo::Partitions::from_policy(&policy);
    let nodes = [a, b, plain];
    let all = scontrol::partitions_text(&nodes, &parts, None).expect("all");
    let names: Vec<&str> = all.lines().filter_map(|l| l.strip_prefix("PartitionName=")).collect();
    assert_eq!(names, ["batch", "empty", "gpu"]);
    // A node naming no partition is in the default one (here the policy's `batch`).
    let batch = scontrol::partitions_text(&nodes, &parts, Some("batch")).expect("batch");
    assert!(batch.contains("   Default=YES QoS=N/A\n") && batch.contains("MaxTime=2-00:00:00"), "{batch}");
    assert!(batch.contains("   Nodes=cpu01,gpu01\n") && batch.contains("TotalNodes=2\n") && batch.contains("gres/gpu=8\n"), "{batch}");
    let gpu = scontrol::partitions_text(&nodes, &parts, Some("gpu")).expect("gpu");
    assert!(gpu.contains("Default=NO") && gpu.contains("MaxTime=UNLIMITED") && gpu.contains("Nodes=gpu[01-02]"), "{gpu}");
    let empty = scontrol::partitions_text(&nodes, &parts, Some("empty")).expect("empty");
    // Two-digit hours, as Slurm 22.05 prints them.
    assert!(empty.contains("Nodes=(null)") && empty.contains("MaxTime=00:30:00 ") && empty.contains("DefaultTime=NONE\n"), "{empty}");
    assert_eq!(scontrol::partitions_text(&nodes, &parts, Some("nope")).unwrap_err().text, "Partition nope not found");
    assert!(batch.contains("\n   AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL\n"), "{batch}");
    let mut guarded = policy.clone();
    guarded.partitions[1].access = proto::PartitionAccess {
        allow_groups: vec!["gpu".into()],
        deny_accounts: vec!["bio".into()],
        allow_qos: vec!["high".into(), "normal".into()],
        ..Default::default()
    };
    let text = scontrol::partitions_text(&nodes, &sinfo::Partitions::from_policy(&guarded), Some("empty")).expect("empty");
    assert!(text.contains("\n   AllowGroups=gpu DenyAccounts=bio AllowQos=high,normal\n"), "{text}");
    assert!(scontrol::node_text(&nodes[0]).contains("   Partitions=batch,gpu\n"));
}

// ---------------------------------------------------------------------------------------------
// --json (the openapi/v0.0.38 shape, compared with what Slurm 22.05 printed on the peer)

/// Keys and JSON types of an object.
fn json_shape(v: &serde_json::Value) -> BTreeMap<String, &'static str> {
    use serde_json::Value;
    let kind = |v: &Value| match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    v.as_object().map(|o| o.iter().map(|(k, v)| (k.clone(), kind(v))).collect()).unwrap_or_default()
}

/// The same keys, and where both have a value, the same types.
fn assert_same_json_shape(slurm: &serde_json::Value, ours: &serde_json::Value, what: &str) {
    let (theirs, mine) = (json_shape(slurm), json_shape(ours));
    assert_eq!(theirs.keys().collect::<Vec<_>>(), mine.keys().collect::<Vec<_>>(), "{what}: keys");
    for (k, t) in &theirs {
        let m = mine[k];
        assert!(*t == m || *t == "null" || m == "null", "{what}: {k} is {t} in Slurm's and {m} in ours");
    }
}

#[test]
fn squeue_and_sinfo_json_have_the_keys_and_types_slurm_22_05_prints() {
    use serde_json::json;
    let slurm: serde_json::Value =
        serde_json::from_str(include_str!("../../../tests/fixtures/slurm_json/squeue_running_and_held.json")).expect("fixture");
    let jobs = slurm["jobs"].as_array().expect("jobs");
    let (running, pending) = (&jobs[0], &jobs[1]);
    assert_eq!((&running["job_state"], &pending["job_state"]), (&json!("RUNNING"), &json!("PENDING")));
    let names: BTreeMap<u64, String> = [(7, "n7".to_string())].into();
    let mut job = job_of(spec(&["-J", "jtest", "--gres=gpu:h100:2", "-t", "10"]), 7);
    job.start_ms = Some(1_796_433_492_000);
    job.parts = vec![NodeRun { run: 1, alloc: Allocation { node: 7, gpus: vec![0, 1], cpus: 1, mem_mib: 1024 }, launched_by: Some(1) }];
    job.last_nodes = vec![7];
    let ours = openapi::job(openapi::Version::V0038, &job, &names);
    assert_same_json_shape(running, &ours, "running job");
    assert_eq!(ours["gres_detail"], json!(["gpu:h100:2(IDX:0-1)"]));
    assert_eq!((ours["end_time"].as_u64(), ours["time_limit"].as_u64()), (Some(1_796_434_092), Some(10)));
    assert_eq!((&ours["nodes"], &ours["batch_host"], &ours["job_state"]), (&json!("n7"), &json!("n7"), &json!("RUNNING")));
    assert_eq!((&ours["job_id"], &ours["name"], &ours["user_name"]), (&json!(7), &json!("jtest"), &json!("alice")));

    let held = Job::submitted(8, spec(&["-J", "held", "-H"]).into(), 1_796_433_492_000);
    let ours = openapi::job(openapi::Version::V0038, &held, &names);
    assert_same_json_shape(pending, &ours, "pending job");
    assert_eq!((&ours["state_reason"], &ours["nodes"], &ours["time_limit"]), (&json!("JobHeldUser"), &json!(""), &serde_json::Value::Null));

    let slurm: serde_json::Value = serde_json::from_str(include_str!("../../../tests/fixtures/slurm_json/sinfo.json")).expect("fixture");
    assert_eq!(openapi::envelope(openapi::Version::V0038, "nodes", Vec::new())["meta"], slurm["meta"]);
    let mut n = node(1, "n1", NodeState::Up, 8, 6);
    n.cpus_alloc = 1;
    let ours = openapi::node(&n);
    assert_same_json_shape(&slurm["nodes"][0], &ours, "node");
    assert_eq!((&ours["state"], &ours["gres_used"], &ours["port"]), (&json!("mixed"), &json!("gpu:h100:2"), &json!(7001)));
    n.state = NodeState::Drained;
    n.gpus_free = 8;
    n.cpus_alloc = 0;
    let ours = openapi::node(&n);
    // As Slurm shows a drained idle node.
    assert_eq!((&ours["state"], &ours["state_flags"]), (&json!("idle"), &json!(["DRAIN"])));
}

#[test]
fn json_exit_codes_are_wait_statuses_as_slurm_keeps_them() {
    // Slurm printed 768 for `exit 3` and 9 for a job killed by SIGKILL.
    let mut job = job_of(spec(&[]), 9);
    job.state = JobState::Failed;
    job.exit_code = Some(3);
    assert_eq!(openapi::raw_exit_code(&job), 768);
}

#[test]
fn scontrol_token_takes_slurms_lifespan_and_username() {
    let p = |a: &[&str]| scontrol::parse(&argv(a));
    assert!(matches!(p(&["token"]), Ok(scontrol::Command::Token { lifespan_s: None, user: None })));
    let parsed = p(&["token", "lifespan=60", "username=alice"]);
    assert!(matches!(&parsed, Ok(scontrol::Command::Token { lifespan_s: Some(60), user: Some(u) }) if u == "alice"), "{parsed:?}");
    assert_eq!(p(&["token", "lifespan=soon"]).map(|_| ()).map_err(|e| e.text), Err("scontrol: error: Invalid lifespan value: soon".into()));
    assert_eq!(
        p(&["token", "user=x"]).map(|_| ()).map_err(|e| e.text),
        Err("scontrol: error: Invalid parameter user=x for token request".into())
    );
}

#[test]
fn sstat_gathers_a_steps_tasks_per_field() {
    use super::sstat::{value, NodeTask};
    let task = |node: &str, rank: u32, rss_kib: u64, cpu_ms: u64| NodeTask {
        node: node.into(),
        usage: proto::TaskUsage {
            step: Some(0),
            rank,
            cpu_ms,
            rss_kib,
            vmsize_kib: 2 * rss_kib,
            pages: u64::from(rank),
            ..Default::default()
        },
    };
    let tasks = [task("n1", 0, 1024, 5_000), task("n2", 1, 3072, 2_000)];
    let v = |name: &str| value(name, "7.0", &tasks);
    assert_eq!((v("JobID"), v("NTasks")), ("7.0".to_string(), "2".to_string()));
    assert_eq!((v("MaxRSS"), v("MaxRSSNode"), v("MaxRSSTask"), v("AveRSS")), ("3M".into(), "n2".into(), "1".into(), "2M".into()));
    assert_eq!((v("MaxVMSize"), v("AveVMSize"), v("MaxPages"), v("AvePages")), ("6M".into(), "4M".into(), "1".into(), "0".into()));
    assert_eq!(
        (v("MinCPU"), v("MinCPUNode"), v("MinCPUTask"), v("AveCPU")),
        ("00:00:02".into(), "n2".into(), "1".into(), "00:00:03".into())
    );
    assert_eq!((v("AveCPUFreq"), v("ReqCPUFreqGov"), v("TRESUsageInMax")), ("0".into(), "Unknown".into(), String::new()));
    assert_eq!((value("MaxRSS", "7.0", &[]), value("AveRSS", "7.0", &[])), (String::new(), "0K".into()));
    assert_eq!(super::sstat::amount(1536, 1), "1.50M");
}
