//! `sacctmgr`: its arguments as Slurm's sacctmgr takes them and its tables as Slurm 22.05 prints
//! them (headers, widths and default columns from its source; the peer has no slurmdbd to run).

use proto::accounts::{Accounts, AccountsEdit, AssocChanges, Holder, LimitChanges, QosChanges};
use proto::SchedulerPolicy;

use super::sacctmgr::{self, parse, render, Action, Column, Entity, Options, Parsable, Tables};

fn argv(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn edits(args: &str) -> Vec<AccountsEdit> {
    match parse(&argv(args)) {
        Ok((_, Action::Edit { edits, .. })) => edits,
        other => panic!("{args}: {other:?}"),
    }
}

fn refusal(args: &str) -> String {
    match parse(&argv(args)) {
        Err(e) => e.text,
        Ok(other) => panic!("{args} was taken: {other:?}"),
    }
}

#[test]
fn options_and_add_commands() {
    let (opts, _) = parse(&argv("-i -nP show assoc")).expect("valid");
    assert_eq!(opts, Options { immediate: true, header: false, parsable: Parsable::NoEnding });
    let (opts, _) = parse(&argv("list qos --parsable --noheader")).expect("valid");
    assert_eq!((opts.parsable, opts.header, opts.immediate), (Parsable::Ending, false, false));
    assert_eq!(
        edits("add account phys Description=Physics Organization=sci"),
        vec![AccountsEdit::AddAccount {
            name: "phys".into(),
            description: Some("Physics".into()),
            organization: Some("sci".into()),
            parent: None
        }]
    );
    assert_eq!(
        edits("create account hep,nuc parent=phys"),
        ["hep", "nuc"]
            .iter()
            .map(|n| AccountsEdit::AddAccount { name: n.to_string(), description: None, organization: None, parent: Some("phys".into()) })
            .collect::<Vec<_>>()
    );
    assert_eq!(
        edits("add user alice Account=phys,hep DefaultAccount=hep"),
        vec![
            AccountsEdit::AddUser { name: "alice".into(), account: "phys".into(), default_account: Some("hep".into()) },
            AccountsEdit::AddUser { name: "alice".into(), account: "hep".into(), default_account: None },
        ]
    );
    assert_eq!(edits("add qos high Priority=100"), vec![AccountsEdit::AddQos { name: "high".into(), priority: Some(100) }]);
    assert_eq!(refusal("add user alice"), " Need name of account to add user to.");
    assert_eq!(refusal("add account"), " Need name of account to add.");
    assert!(refusal("add account x Bogus=1").starts_with(" Unknown option: Bogus=1"));
    assert!(refusal("-x show qos").contains("invalid option -- 'x'"));
    assert_eq!(refusal("frob account x"), " Unknown command: frob");
}

#[test]
fn modify_sets_limits_and_minus_one_clears() {
    let limits = LimitChanges {
        max_jobs: Some(Some(2)),
        max_submit_jobs: Some(None),
        max_wall_min: Some(Some(90)),
        grp_gpus_max: Some(Some(4)),
        gpus_per_job_max: Some(None),
        ..Default::default()
    };
    let changes = AssocChanges {
        limits: limits.clone(),
        qos: Some(vec!["normal".into(), "high".into()]),
        default_qos: Some(Some("high".into())),
        ..Default::default()
    };
    assert_eq!(
        edits("modify user where name=alice account=phys set MaxJobs=2 MaxSubmitJobs=-1 MaxWall=1:30:00 GrpTRES=gres/gpu=4 MaxTRESPerJob=gres/gpu=-1 QOS=normal,high DefaultQOS=high"),
        vec![AccountsEdit::ModifyUser { name: "alice".into(), account: Some("phys".into()), changes, default_account: None }]
    );
    let grp = LimitChanges { grp_jobs_max: Some(Some(3)), grp_submit_jobs_max: Some(None), ..Default::default() };
    assert_eq!(
        edits("modify account phys set GrpJobs=3 GrpSubmitJobs=-1"),
        vec![AccountsEdit::ModifyAccount { name: "phys".into(), changes: AssocChanges { limits: grp, ..Default::default() } }]
    );
    let shares = |n: Option<u32>| AssocChanges { shares: Some(n), ..Default::default() };
    assert_eq!(
        edits("modify account phys set Fairshare=9"),
        vec![AccountsEdit::ModifyAccount { name: "phys".into(), changes: shares(Some(9)) }]
    );
    assert_eq!(
        edits("modify user alice set fairshare=-1"),
        vec![AccountsEdit::ModifyUser { name: "alice".into(), account: None, changes: shares(None), default_account: None }]
    );
    assert_eq!(edits("add account chem Fairshare=3")[1], AccountsEdit::ModifyAccount { name: "chem".into(), changes: shares(Some(3)) });
    assert!(refusal("modify account phys set Fairshare=parent").contains("\"parent\" is not supported"));
    let plus = AssocChanges { qos_add: vec!["high".into()], qos_remove: vec!["low".into()], ..Default::default() };
    assert_eq!(
        edits("modify account phys set QOS+=high QOS-=low"),
        vec![AccountsEdit::ModifyAccount { name: "phys".into(), changes: plus }]
    );
    assert_eq!(
        edits("modify account phys set Description=Physics")[0],
        AccountsEdit::DescribeAccount { name: "phys".into(), description: Some("Physics".into()), organization: None }
    );
    let wall = LimitChanges { max_wall_min: Some(Some(2 * 1440)), ..Default::default() };
    assert_eq!(
        edits("update account phys set MaxWall=2-00:00:00"),
        vec![AccountsEdit::ModifyAccount { name: "phys".into(), changes: AssocChanges { limits: wall, ..Default::default() } }]
    );
    // On a QoS, MaxJobs is MaxJobsPerUser, as in Slurm.
    let per_user =
        LimitChanges { max_jobs: Some(Some(1)), max_submit_jobs: Some(Some(5)), max_wall_min: Some(Some(10)), ..Default::default() };
    assert_eq!(
        edits("modify qos normal set MaxJobsPerUser=1 MaxSubmitJobsPerUser=5 MaxWall=10 Priority=7"),
        vec![AccountsEdit::ModifyQos { name: "normal".into(), changes: QosChanges { limits: per_user, priority: Some(7) } }]
    );
    assert_eq!(edits("modify qos high set MaxJobs=3").len(), 1);
    assert!(refusal("modify user alice set MaxJobsPerUser=1").starts_with(" Unknown option: MaxJobsPerUser=1"));
    let tres = LimitChanges {
        grp_cpus_max: Some(Some(64)),
        grp_mem_mib_max: Some(Some(256 * 1024)),
        grp_nodes_max: Some(None),
        grp_gpus_max: Some(Some(8)),
        ..Default::default()
    };
    assert_eq!(
        edits("modify account phys set GrpTRES=cpu=64,mem=256G,node=-1,gres/gpu=8"),
        vec![AccountsEdit::ModifyAccount { name: "phys".into(), changes: AssocChanges { limits: tres, ..Default::default() } }]
    );
    let per_job = LimitChanges {
        cpus_per_job_max: Some(Some(16)),
        mem_mib_per_job_max: Some(Some(512)),
        nodes_per_job_max: Some(Some(2)),
        ..Default::default()
    };
    assert_eq!(
        edits("modify qos high set MaxTRESPerJob=cpu=16,mem=512,node=2"),
        vec![AccountsEdit::ModifyQos { name: "high".into(), changes: QosChanges { limits: per_job, priority: None } }]
    );
    assert!(refusal("modify user alice set GrpTRES=billing=4").contains("Corral limits cpu, mem, node and gres/gpu"));
    assert!(refusal("modify user alice set GrpTRES=mem=lots").contains("invalid memory size"));
    assert_eq!(refusal("modify user alice set MaxWall=soon"), " Bad MaxWall time format: soon");
    assert_eq!(refusal("modify user alice MaxJobs=1"), " You didn't give me anything to set");
}

#[test]
fn delete_names_what_goes() {
    assert_eq!(edits("delete account phys"), vec![AccountsEdit::DeleteAccount { name: "phys".into() }]);
    assert_eq!(edits("remove qos where name=high"), vec![AccountsEdit::DeleteQos { name: "high".into() }]);
    assert_eq!(
        edits("delete user alice where account=hep"),
        vec![AccountsEdit::DeleteUser { name: "alice".into(), account: Some("hep".into()) }]
    );
    assert_eq!(edits("delete user bob"), vec![AccountsEdit::DeleteUser { name: "bob".into(), account: None }]);
    assert_eq!(refusal("delete account"), " No account name given to delete");
}

#[test]
fn columns_match_slurms_names_prefixes_and_widths() {
    let col = |s: &str| Column::parse(s).map(|c| (c.header, c.width));
    assert_eq!(col("Account"), Some(("Account", 10)));
    assert_eq!(col("acc"), Some(("Account", 10)));
    assert_eq!(col("GrpTRES"), Some(("GrpTRES", 13)));
    assert_eq!(col("MaxS"), Some(("MaxSubmit", 9)));
    assert_eq!(col("MaxTRESPerJob"), Some(("MaxTRES", 13)));
    assert_eq!(col("MaxJobsPerUser"), Some(("MaxJobsPU", 9)));
    assert_eq!(col("DefaultQOS"), Some(("Def QOS", 9)));
    assert_eq!(col("User%20"), Some(("User", 20)));
    assert_eq!(col("Bogus"), None);
    match parse(&argv("show assoc format=Account,Bogus")) {
        Err(e) => assert_eq!(e.text, "Invalid field requested: \"Bogus\""),
        Ok(other) => panic!("{other:?}"),
    }
    let headers = |e: Entity| sacctmgr::default_format(e).iter().map(|c| c.header).collect::<Vec<_>>().join(",");
    assert_eq!(headers(Entity::Account), "Account,Descr,Org");
    assert_eq!(headers(Entity::User), "User,Def Acct,Admin");
    assert_eq!(
        headers(Entity::Assoc),
        "Cluster,Account,User,Partition,Share,Priority,GrpJobs,GrpTRES,GrpSubmit,GrpWall,GrpTRESMins,MaxJobs,MaxTRES,\
         MaxTRESPerNode,MaxSubmit,MaxWall,MaxTRESMins,QOS,Def QOS,GrpTRESRunMins"
    );
    assert_eq!(sacctmgr::default_format(Entity::Qos).len(), 26);
}

/// root, phys (alice, MaxJobs=1, GrpTRES=gres/gpu=2) and hep under phys (alice again).
fn sample() -> (Accounts, SchedulerPolicy) {
    let mut db = Accounts::default();
    let mut policy = SchedulerPolicy::default();
    let mut all = edits("add account phys Description=Physics Organization=sci");
    all.extend(edits("add account hep Parent=phys"));
    all.extend(edits("add user alice Account=phys,hep"));
    all.extend(edits("add qos high Priority=10"));
    all.extend(edits("modify user alice where account=phys set MaxJobs=1 GrpTRES=gres/gpu=2 QOS=normal,high"));
    all.extend(edits("modify account phys set MaxWall=60"));
    all.extend(edits("modify qos high set MaxJobsPerUser=2 GrpTRES=gres/gpu=8"));
    assert_eq!(db.edit(&mut policy, &all, |_: Holder<'_>| Vec::new()), Ok(()));
    (db, policy)
}

fn show(db: &Accounts, policy: &SchedulerPolicy, args: &str) -> String {
    let (opts, action) = parse(&argv(args)).expect("valid");
    let Action::Show { entity, filter, format } = action else { panic!("{args} is not a show") };
    render(&Tables { accounts: db, policy, cluster: "corral" }, entity, &filter, &format, opts)
}

#[test]
fn tres_limits_print_in_slurms_order_and_per_job_ones_are_inherited() {
    let (mut db, mut policy) = sample();
    let more = edits("modify account phys set GrpTRES=cpu=64,mem=256G MaxTRESPerJob=node=2");
    assert_eq!(db.edit(&mut policy, &more, |_: Holder<'_>| Vec::new()), Ok(()));
    assert_eq!(
        show(&db, &policy, "-n -P show assoc format=Account,User,GrpTRES,MaxTRES"),
        "root|||\nphys||cpu=64,mem=256G|node=2\nphys|alice|gres/gpu=2|node=2\nhep|||node=2\nhep|alice||node=2\n"
    );
}

#[test]
fn tables_as_slurm_prints_them() {
    let (db, policy) = sample();
    assert_eq!(
        show(&db, &policy, "show account"),
        "   Account                Descr                  Org \n\
         ---------- -------------------- -------------------- \n\
         \x20      hep                  hep                  sci \n\
         \x20     phys              Physics                  sci \n\
         \x20     root default root account                 root \n"
    );
    assert_eq!(show(&db, &policy, "-n -p list user"), "alice|phys|None|\n");
    // Users inherit MaxWall from phys; GrpTRES is the association's own; QoS from the account
    // where the association names none.
    assert_eq!(
        show(&db, &policy, "-n -P show assoc"),
        "corral|root|||1|||||||||||||normal||\n\
         corral|phys|||1|||||||||||01:00:00||normal||\n\
         corral|phys|alice||1|||gres/gpu=2||||1||||01:00:00||high,normal||\n\
         corral|hep|||1|||||||||||01:00:00||normal||\n\
         corral|hep|alice||1|||||||||||01:00:00||normal||\n"
    );
    assert_eq!(
        show(&db, &policy, "-P show assoc where user=alice account=hep format=Account,User,MaxWall"),
        "Account|User|MaxWall\nhep|alice|01:00:00\n"
    );
    assert_eq!(
        show(&db, &policy, "-nP show qos format=Name,Priority,MaxJobsPerUser,GrpTRES,MaxWall"),
        "normal|0|||\nhigh|10|2|gres/gpu=8|\n"
    );
    // A value wider than its column is cut, its last character '+'.
    assert_eq!(show(&db, &policy, "-n show account where name=root format=Descr%8"), "default+ \n");
}

#[test]
fn a_policy_file_carries_qos_limits() {
    let text = "[[qos]]\nname = \"high\"\npriority = 100\nlimits = { max_jobs = 2, grp_gpus_max = 16 }\n";
    let policy: SchedulerPolicy = toml::from_str(text).expect("the README's policy form parses");
    assert_eq!((policy.qos[0].limits.max_jobs, policy.qos[0].limits.grp_gpus_max), (Some(2), Some(16)));
    assert!(toml::from_str::<SchedulerPolicy>("[[qos]]\nname = \"x\"\nlimits = { max_gpus = 1 }\n").is_err(), "unknown limits are refused");
}
