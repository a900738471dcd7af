//! Accounting limits in one pass: jobs over an association's, an account's or a QoS's limit
//! stay pending with Slurm's reason and start once the limit allows.

use corral_scheduler::testkit::{alloc, dgx, spec, Cluster};
use corral_scheduler::{PreemptAction, Qos};
use proto::accounts::{AccountsEdit, AssocChanges, Holder, LimitChanges};
use proto::{ArraySpec, JobSpec, Limits, SchedulerPolicy};

const MIN: u64 = 60_000;

/// A DGX node and the database: account `phys` with child `hep`, alice in both (default phys),
/// bob in phys.
fn cluster() -> Cluster {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    let add_account = |name: &str, parent: Option<&str>| AccountsEdit::AddAccount {
        name: name.into(),
        description: None,
        organization: None,
        parent: parent.map(str::to_string),
    };
    let add_user = |name: &str, account: &str| AccountsEdit::AddUser { name: name.into(), account: account.into(), default_account: None };
    let edits = [
        add_account("phys", None),
        add_account("hep", Some("phys")),
        add_user("alice", "phys"),
        add_user("alice", "hep"),
        add_user("bob", "phys"),
    ];
    edit(&mut c, &edits);
    c
}

fn edit(c: &mut Cluster, edits: &[AccountsEdit]) {
    let none = |_: Holder<'_>| Vec::new();
    assert_eq!(std::sync::Arc::make_mut(&mut c.view.accounts).edit(&mut SchedulerPolicy::default(), edits, none), Ok(()));
}

fn limit_user(c: &mut Cluster, user: &str, limits: LimitChanges) {
    let changes = AssocChanges { limits, ..Default::default() };
    edit(c, &[AccountsEdit::ModifyUser { name: user.into(), account: None, changes, default_account: None }]);
}

fn limit_account(c: &mut Cluster, account: &str, limits: LimitChanges) {
    let changes = AssocChanges { limits, ..Default::default() };
    edit(c, &[AccountsEdit::ModifyAccount { name: account.into(), changes }]);
}

fn job(user: &str, account: Option<&str>, gres: &str) -> JobSpec {
    let mut s = spec(gres, 1);
    s.user = user.into();
    s.account = account.map(str::to_string);
    s
}

fn started(plan: &corral_scheduler::Plan) -> Vec<u64> {
    let mut ids: Vec<u64> = plan.placements.iter().map(|p| p.job).collect();
    ids.sort_unstable();
    ids
}

/// The Slurm code of each pending job's first reason.
fn codes(plan: &corral_scheduler::Plan) -> Vec<(u64, String)> {
    plan.pending.iter().map(|(id, r)| (*id, r[0].split(':').next().unwrap_or("").to_string())).collect()
}

#[test]
fn max_jobs_counts_running_jobs_and_this_passs_starts() {
    let mut c = cluster();
    limit_user(&mut c, "alice", LimitChanges { max_jobs: Some(Some(1)), ..Default::default() });
    c.submit(1, job("alice", Some("phys"), "gpu:1"), 0).submit(2, job("alice", None, "gpu:1"), 1).submit(3, job("bob", None, "gpu:1"), 2);
    let plan = c.schedule(1000);
    assert_eq!(started(&plan), vec![1, 3], "bob is not alice");
    assert_eq!(codes(&plan), vec![(2, "AssocMaxJobsLimit".to_string())]);
    assert_eq!(plan.pending[&2][0], "AssocMaxJobsLimit: user alice has 1 running jobs in account phys (MaxJobs=1)");
    // Running, job 1 still holds the limit; alice's hep association is another one.
    let mut c2 = c.clone();
    c2.running(1, job("alice", Some("phys"), "gpu:1"), vec![alloc(1, &[0], 1, 1024)], 0);
    c2.submit(4, job("alice", Some("hep"), "gpu:1"), 3);
    let plan = c2.schedule(1000);
    assert_eq!(started(&plan), vec![3, 4]);
    assert_eq!(codes(&plan), vec![(2, "AssocMaxJobsLimit".to_string())]);
    // Once job 1 is gone, job 2 starts.
    let mut c3 = c.clone();
    c3.finished(1, job("alice", Some("phys"), "gpu:1"), proto::JobState::Completed);
    assert_eq!(started(&c3.schedule(1000)), vec![2, 3]);
}

#[test]
fn an_accounts_group_gpus_cover_its_subtree_and_cpu_jobs_pass() {
    let mut c = cluster();
    limit_account(&mut c, "phys", LimitChanges { grp_gpus_max: Some(Some(3)), ..Default::default() });
    c.running(1, job("bob", Some("phys"), "gpu:2"), vec![alloc(1, &[0, 1], 1, 1024)], 0);
    c.submit(2, job("alice", Some("hep"), "gpu:2"), 1).submit(3, job("alice", Some("hep"), "gpu:1"), 2);
    c.submit(4, job("alice", Some("hep"), ""), 3);
    let plan = c.schedule(1000);
    // 2 held + 2 > 3 (the 2-GPU job comes first: job size); then 2 + 1 = 3 fits; the CPU job
    // holds no GPU.
    assert_eq!(started(&plan), vec![3, 4]);
    assert_eq!(codes(&plan), vec![(2, "AssocGrpGRES".to_string())]);
    assert_eq!(plan.pending[&2][0], "AssocGrpGRES: the running jobs of account phys hold 2 GPUs, 2 more would pass GrpTRES=gres/gpu=3");
    // A user's own GrpTRES counts their jobs in that account alone.
    let mut c = cluster();
    limit_user(&mut c, "alice", LimitChanges { grp_gpus_max: Some(Some(1)), ..Default::default() });
    c.submit(1, job("alice", None, "gpu:1"), 0).submit(2, job("alice", None, "gpu:1"), 1).submit(3, job("bob", None, "gpu:4"), 2);
    let plan = c.schedule(1000);
    assert_eq!(started(&plan), vec![1, 3]);
    assert_eq!(codes(&plan), vec![(2, "AssocGrpGRES".to_string())]);
}

#[test]
fn group_jobs_cover_an_accounts_subtree_an_association_and_a_qos() {
    let mut c = cluster();
    limit_account(&mut c, "phys", LimitChanges { grp_jobs_max: Some(Some(2)), ..Default::default() });
    c.running(1, job("bob", Some("phys"), "gpu:1"), vec![alloc(1, &[0], 1, 1024)], 0);
    c.submit(2, job("alice", Some("hep"), "gpu:1"), 1).submit(3, job("alice", Some("phys"), "gpu:1"), 2);
    let plan = c.schedule(1000);
    // bob's running job and the one this pass starts (in hep, under phys) reach phys's GrpJobs=2.
    assert_eq!(started(&plan), vec![2]);
    assert_eq!(plan.pending[&3][0], "AssocGrpJobsLimit: account phys has 2 running jobs (GrpJobs=2)");
    // A user's own GrpJobs counts their jobs in that account.
    let mut c = cluster();
    limit_user(&mut c, "alice", LimitChanges { grp_jobs_max: Some(Some(1)), ..Default::default() });
    c.submit(1, job("alice", None, "gpu:1"), 0).submit(2, job("alice", None, "gpu:1"), 1).submit(3, job("bob", None, "gpu:1"), 2);
    let plan = c.schedule(1000);
    assert_eq!(started(&plan), vec![1, 3]);
    assert_eq!(plan.pending[&2][0], "AssocGrpJobsLimit: user alice has 1 running jobs in account phys (GrpJobs=1)");
    // A QoS's GrpJobs counts every user's jobs of it.
    let mut c = cluster();
    let limits = Limits { grp_jobs_max: Some(1), ..Default::default() };
    c.view.config.qos.insert("normal".into(), Qos { priority: 0, preempt: vec![], preempt_mode: PreemptAction::Requeue, limits });
    c.submit(1, job("alice", None, "gpu:1"), 0).submit(2, job("bob", None, "gpu:1"), 1);
    let plan = c.schedule(1000);
    assert_eq!(started(&plan), vec![1]);
    assert_eq!(codes(&plan), vec![(2, "QOSGrpJobsLimit".to_string())]);
    assert_eq!(plan.pending[&2][0], "QOSGrpJobsLimit: QOS normal has 1 running jobs (GrpJobs=1)");
}

#[test]
fn cpu_memory_and_node_limits_hold_jobs_with_slurms_reasons() {
    let sized = |user: &str, cpus: u32, mem_mib: u64, nodes: u32| {
        let mut s = job(user, Some("phys"), "");
        s.cpus_per_task = cpus;
        s.mem_mib = mem_mib;
        s.nodes = nodes;
        s
    };
    // GrpTRES=cpu=8,mem=4096M on phys: bob's running 6 CPUs leave room for 2.
    let mut c = cluster();
    let grp = LimitChanges { grp_cpus_max: Some(Some(8)), grp_mem_mib_max: Some(Some(4096)), ..Default::default() };
    limit_account(&mut c, "phys", grp);
    c.running(1, sized("bob", 6, 1024, 1), vec![alloc(1, &[], 6, 1024)], 0);
    c.submit(2, sized("alice", 4, 1024, 1), 1).submit(3, sized("alice", 2, 4096, 1), 2).submit(4, sized("alice", 2, 1024, 1), 3);
    let plan = c.schedule(1000);
    assert_eq!(started(&plan), vec![4]);
    assert_eq!(plan.pending[&2][0], "AssocGrpCpuLimit: the running jobs of account phys hold 6 CPUs, 4 more would pass GrpTRES=cpu=8");
    assert_eq!(
        plan.pending[&3][0],
        "AssocGrpMemLimit: the running jobs of account phys hold 1024 MiB, 4096 more would pass GrpTRES=mem=4096M"
    );
    // MaxTRESPerJob=cpu=4,node=1 on alice's association, and a QoS's per-job memory.
    let mut c = cluster();
    limit_user(&mut c, "alice", LimitChanges { cpus_per_job_max: Some(Some(4)), nodes_per_job_max: Some(Some(1)), ..Default::default() });
    let limits = Limits { mem_mib_per_job_max: Some(2048), grp_nodes_max: Some(1), ..Default::default() };
    c.view.config.qos.insert("normal".into(), Qos { priority: 0, preempt: vec![], preempt_mode: PreemptAction::Requeue, limits });
    c.submit(1, sized("alice", 8, 1024, 1), 0).submit(2, sized("alice", 1, 1024, 2), 1).submit(3, sized("bob", 1, 8192, 1), 2);
    c.submit(4, sized("bob", 1, 1024, 1), 3).submit(5, sized("bob", 1, 1024, 1), 4);
    let plan = c.schedule(1000);
    assert_eq!(started(&plan), vec![4], "one node at a time for the QoS");
    let expected = vec![
        (1, "AssocMaxCpuPerJobLimit".to_string()),
        (2, "QOSGrpNodeLimit".to_string()),
        (3, "QOSMaxMemoryPerJob".to_string()),
        (5, "QOSGrpNodeLimit".to_string()),
    ];
    assert_eq!(codes(&plan), expected);
    // The QoS's limits come first, as Slurm checks them; the association's follow.
    assert_eq!(plan.pending[&2][1], "AssocMaxNodePerJobLimit: 2 nodes are over MaxTRESPerJob=node=1 of account phys");
    assert_eq!(plan.pending[&1][0], "AssocMaxCpuPerJobLimit: 8 CPUs are over MaxTRESPerJob=cpu=4 of account phys");
}

#[test]
fn max_wall_and_gpus_per_job_hold_a_job_until_it_fits_them() {
    let mut c = cluster();
    limit_account(&mut c, "phys", LimitChanges { max_wall_min: Some(Some(60)), gpus_per_job_max: Some(Some(2)), ..Default::default() });
    let timed = |minutes: Option<u64>, gres: &str| {
        let mut s = job("alice", Some("hep"), gres);
        s.time_limit_ms = minutes.map(|m| m * MIN);
        s
    };
    c.submit(1, timed(Some(120), "gpu:1"), 0).submit(2, timed(None, "gpu:1"), 1).submit(3, timed(Some(30), "gpu:4"), 2);
    c.submit(4, timed(Some(60), "gpu:2"), 3);
    let plan = c.schedule(1000);
    assert_eq!(started(&plan), vec![4]);
    let expected = vec![
        (1, "AssocMaxWallDurationPerJobLimit".to_string()),
        (2, "AssocMaxWallDurationPerJobLimit".to_string()),
        (3, "AssocMaxGRESPerJob".to_string()),
    ];
    assert_eq!(codes(&plan), expected);
    assert_eq!(plan.pending[&1][0], "AssocMaxWallDurationPerJobLimit: time limit 2:00:00 is over MaxWall=1:00:00 of account hep");
    assert!(plan.pending[&2][0].contains("time limit UNLIMITED"), "{:?}", plan.pending[&2]);
    // alice's own association's limit wins over the account's.
    limit_user(&mut c, "alice", LimitChanges { max_wall_min: Some(Some(180)), ..Default::default() });
    assert_eq!(started(&c.schedule(1000)), vec![1, 4]);
}

#[test]
fn qos_limits_count_per_user_and_per_qos() {
    let mut c = cluster();
    let limits = Limits { max_jobs: Some(1), grp_gpus_max: Some(3), max_wall_min: Some(10), ..Default::default() };
    c.view.config.qos.insert("normal".into(), Qos { priority: 0, preempt: vec![], preempt_mode: PreemptAction::Requeue, limits });
    let timed = |user: &str, gres: &str, minutes: u64| {
        let mut s = job(user, None, gres);
        s.time_limit_ms = Some(minutes * MIN);
        s
    };
    c.submit(1, timed("alice", "gpu:2", 5), 0).submit(2, timed("alice", "gpu:1", 5), 1).submit(3, timed("bob", "gpu:2", 5), 2);
    c.submit(4, timed("bob", "gpu:1", 20), 3).submit(5, timed("carol", "", 5), 4);
    let plan = c.schedule(1000);
    // carol has no association but the QoS limits everyone.
    assert_eq!(started(&plan), vec![1, 5]);
    let expected =
        vec![(2, "QOSMaxJobsPerUserLimit".to_string()), (3, "QOSGrpGRES".to_string()), (4, "QOSMaxWallDurationPerJobLimit".to_string())];
    assert_eq!(codes(&plan), expected);
}

#[test]
fn array_tasks_start_up_to_the_limit() {
    let mut c = cluster();
    limit_user(&mut c, "alice", LimitChanges { max_jobs: Some(Some(2)), ..Default::default() });
    let mut s = job("alice", None, "gpu:1");
    s.array = Some(ArraySpec::from_ids(&[0, 1, 2, 3], None));
    c.submit(1, s, 0);
    let plan = c.schedule(1000);
    assert_eq!(plan.array_tasks.len(), 2);
    assert_eq!(
        plan.pending[&1],
        vec![
            "array: 2 of 4 tasks not started".to_string(),
            "AssocMaxJobsLimit: user alice has 2 running jobs in account phys (MaxJobs=2)".to_string()
        ]
    );
}

#[test]
fn without_associations_or_qos_limits_nothing_is_limited() {
    let mut c = Cluster::new();
    c.node(1, "n1", dgx("h100"));
    for id in 1..=4 {
        c.submit(id, job("alice", Some("anything"), "gpu:2"), id);
    }
    let plan = c.schedule(1000);
    assert_eq!(started(&plan), vec![1, 2, 3, 4]);
    assert!(plan.pending.is_empty());
}

#[test]
fn a_qos_max_tres_per_user_counts_each_users_running_jobs_of_it() {
    let mut c = cluster();
    let limits = Limits { gpus_per_user_max: Some(2), cpus_per_user_max: Some(64), ..Default::default() };
    c.view.config.qos.insert("gpucap".into(), Qos { priority: 0, preempt: vec![], preempt_mode: PreemptAction::Requeue, limits });
    let capped = |user: &str, gres: &str| {
        let mut s = job(user, None, gres);
        s.qos = Some("gpucap".into());
        s
    };
    c.running(1, capped("alice", "gpu:1"), vec![alloc(1, &[0], 1, 1024)], 0);
    c.submit(2, capped("alice", "gpu:2"), 1).submit(3, capped("alice", "gpu:1"), 2).submit(4, capped("bob", "gpu:2"), 3);
    c.submit(5, job("alice", None, "gpu:2"), 4);
    let plan = c.schedule(1000);
    // alice holds 1 GPU of gpucap: 2 more pass MaxTRESPerUser=gres/gpu=2, 1 more does not; bob
    // is another user, and alice's job in `normal` is not of the QoS.
    assert_eq!(started(&plan), vec![3, 4, 5]);
    assert_eq!(codes(&plan), vec![(2, "QOSMaxGRESPerUser".to_string())]);
    assert_eq!(
        plan.pending[&2][0],
        "QOSMaxGRESPerUser: the running jobs of user alice in QOS gpucap hold 1 GPUs, 2 more would pass MaxTRESPerUser=gres/gpu=2"
    );
}

#[test]
fn a_grp_wall_used_up_holds_jobs_with_slurms_reasons_and_running_jobs_count() {
    let mut c = cluster();
    limit_account(&mut c, "phys", LimitChanges { grp_wall_min: Some(Some(1)), ..Default::default() });
    c.view.config.decay_half_life_ms = 0;
    // 40 s charged to alice in hep (under phys), and bob's job running for 20 s by the pass.
    let used = proto::accounts::Usage { wall_ms: 40_000, ..Default::default() };
    c.view.usage.insert(("hep".into(), "alice".into()), used);
    c.running(1, job("bob", Some("phys"), "gpu:1"), vec![alloc(1, &[0], 1, 1024)], 0);
    c.submit(2, job("alice", None, "gpu:1"), 1).submit(3, job("carol", None, "gpu:1"), 2);
    let plan = c.schedule(19_999);
    assert_eq!(started(&plan), vec![2, 3], "59.999 s: no whole minute used");
    let plan = c.schedule(20_000);
    // carol has no association (charged to root): phys's limit is not hers.
    assert_eq!(started(&plan), vec![3]);
    assert_eq!(codes(&plan), vec![(2, "AssocGrpWallLimit".to_string())]);
    assert_eq!(
        plan.pending[&2][0],
        "AssocGrpWallLimit: Job is at or exceeds association (acc=phys/user=(null)/part=(null)) group wall limit 1 with 1"
    );
    // A QoS's GrpWall counts every job of it and replaces the association's.
    let limits = Limits { grp_wall_min: Some(2), ..Default::default() };
    c.view.config.qos.insert("normal".into(), Qos { priority: 0, preempt: vec![], preempt_mode: PreemptAction::Requeue, limits });
    c.view.qos_usage.insert("normal".into(), proto::accounts::Usage { wall_ms: 60_000, ..Default::default() });
    assert_eq!(started(&c.schedule(20_000)), vec![2, 3], "80 s of QOS normal's 2 minutes; phys's limit does not hold");
    let plan = c.schedule(60_000);
    assert_eq!(started(&plan), Vec::<u64>::new());
    assert_eq!(plan.pending[&3][0], "QOSGrpWallLimit: Job is at or exceeds QOS normal's group wall limit of 2 with 2");
    // Lifted: both start.
    c.view.config.qos.clear();
    limit_account(&mut c, "phys", LimitChanges { grp_wall_min: Some(None), ..Default::default() });
    assert_eq!(started(&c.schedule(60_000)), vec![2, 3]);
}

#[test]
fn a_node_range_gets_no_more_nodes_than_the_limits_leave() {
    // Four DGX nodes; alice may hold 24 GPUs: -N 2-4 --gres=gpu:8 gets three nodes, as Slurm's
    // acct_policy_get_max_nodes lowers a job's most nodes, and a running one counts them all.
    let mut c = cluster();
    for id in 2..=4u64 {
        c.node(id, &format!("n{id}"), dgx("h100"));
    }
    limit_user(&mut c, "alice", LimitChanges { grp_gpus_max: Some(Some(24)), ..Default::default() });
    let mut s = job("alice", None, "gpu:8");
    s.nodes = 2;
    s.set_nodes_max(4);
    c.submit(1, s.clone(), 0);
    let plan = c.schedule(1000);
    assert_eq!(plan.placements.iter().map(|p| p.allocs.len()).collect::<Vec<_>>(), vec![3]);
    // Running on three, it holds 24 GPUs: a 1-GPU job of alice's waits, bob's does not.
    let mut c2 = cluster();
    for id in 2..=4u64 {
        c2.node(id, &format!("n{id}"), dgx("h100"));
    }
    limit_user(&mut c2, "alice", LimitChanges { grp_gpus_max: Some(Some(24)), ..Default::default() });
    c2.running(1, s, plan.placements[0].allocs.clone(), 0);
    c2.submit(2, job("alice", None, "gpu:1"), 1).submit(3, job("bob", None, "gpu:1"), 2);
    let plan = c2.schedule(2000);
    assert_eq!(started(&plan), vec![3]);
    assert_eq!(codes(&plan), vec![(2, "AssocGrpGRES".to_string())]);
}
