//! `sacctmgr`: its arguments as Slurm's sacctmgr takes them, what `add` prints, and its tables
//! as Slurm 22.05 prints them (options, messages, headers, widths and default columns from its
//! source; the peer has no slurmdbd to run).

use proto::accounts::{Accounts, AccountsEdit, AssocChanges, Holder, LimitChanges, QosChanges};
use proto::SchedulerPolicy;

use super::sacctmgr::{self, parse, render, Action, Column, Db, Entity, Options, Parsable, Plan, Tables};

fn argv(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

/// Accounts phys (hep under it) and QoS high and low; no user.
fn world() -> (Accounts, SchedulerPolicy) {
    let (mut db, mut policy) = (Accounts::default(), SchedulerPolicy::default());
    for args in ["add account phys", "add account hep parent=phys", "add qos high,low"] {
        apply(&mut db, &mut policy, args);
    }
    (db, policy)
}

/// What `args` plans against `db` and `policy`.
fn plan_in(db: &Accounts, policy: &SchedulerPolicy, args: &str) -> Result<Plan, String> {
    let (_, action) = parse(&argv(args)).map_err(|e| e.text)?;
    sacctmgr::plan(&Db { accounts: db, policy, cluster: "corral" }, &action).map_err(|e| e.text)
}

/// Plans `args` against `db` and applies its edits, as the cluster does; what it printed.
fn apply(db: &mut Accounts, policy: &mut SchedulerPolicy, args: &str) -> String {
    match plan_in(db, policy, args) {
        Ok(Plan::Edits { edits, summary }) => {
            assert_eq!(db.edit(policy, &edits, |_: Holder<'_>| Vec::new()), Ok(()), "{args}");
            summary
        }
        other => panic!("{args}: {other:?}"),
    }
}

/// The edits `args` makes in [`world`].
fn edits(args: &str) -> Vec<AccountsEdit> {
    let (db, policy) = world();
    match plan_in(&db, &policy, args) {
        Ok(Plan::Edits { edits, .. }) => edits,
        other => panic!("{args}: {other:?}"),
    }
}

/// What `args` prints before it asks, in [`world`].
fn summary(args: &str) -> String {
    let (db, policy) = world();
    match plan_in(&db, &policy, args) {
        Ok(Plan::Edits { summary, .. }) => summary,
        other => panic!("{args}: {other:?}"),
    }
}

fn refusal(args: &str) -> String {
    let (db, policy) = world();
    match plan_in(&db, &policy, args) {
        Err(e) => e,
        Ok(other) => panic!("{args} was taken: {other:?}"),
    }
}

#[test]
fn options_and_add_commands() {
    let (opts, _) = parse(&argv("-i -nP show assoc")).expect("valid");
    assert_eq!(opts, Options { immediate: true, header: false, parsable: Parsable::NoEnding });
    let (opts, _) = parse(&argv("list qos --parsable --noheader")).expect("valid");
    assert_eq!((opts.parsable, opts.header, opts.immediate), (Parsable::Ending, false, false));
    // Slurm lowercases names, descriptions and organizations (`strip_quotes(.., 1)`).
    assert_eq!(
        edits("add account Bio Description=Biology Organization=SCI"),
        vec![AccountsEdit::AddAccount {
            name: "bio".into(),
            description: Some("biology".into()),
            organization: Some("sci".into()),
            parent: None
        }]
    );
    assert_eq!(
        edits("create account hep,nuc,gen parent=phys"),
        ["nuc", "gen"]
            .iter()
            .map(|n| AccountsEdit::AddAccount { name: n.to_string(), description: None, organization: None, parent: Some("phys".into()) })
            .collect::<Vec<_>>()
    );
    assert_eq!(
        edits("add user alice Account=phys,hep DefaultAccount=hep"),
        vec![
            AccountsEdit::AddUser { name: "alice".into(), account: "phys".into(), default_account: None },
            AccountsEdit::AddUser { name: "alice".into(), account: "hep".into(), default_account: Some("hep".into()) },
        ]
    );
    assert_eq!(edits("add qos gold Priority=100"), vec![AccountsEdit::AddQos { name: "gold".into(), priority: Some(100) }]);
    assert_eq!(refusal("add user alice"), " Need name of account to add user to.");
    assert_eq!(refusal("add account"), " Need name of account to add.");
    assert_eq!(refusal("add account x Bogus=1"), " Unknown option: Bogus=1\n Use keyword 'where' to modify condition");
    assert_eq!(refusal("add user x account=phys Bogus=1"), " Unknown option: Bogus=1");
    assert!(refusal("-x show qos").contains("invalid option -- 'x'"));
    assert_eq!(refusal("frob account x"), " Unknown command: frob");
    assert_eq!(refusal("add user x account=nope"), " This account 'nope' doesn't exist.\n        Contact your admin to add this account.");
    assert_eq!(
        refusal("add account x parent=nope"),
        " Parent account 'nope' doesn't exist on cluster corral\n        Contact your admin to add this account."
    );
    assert_eq!(
        refusal("add account x cluster=other"),
        " This cluster 'other' doesn't exist.\n        Contact your admin to add it to accounting."
    );
    assert_eq!(edits("add account x Cluster=CORRAL").len(), 1, "this cluster");
    // What exists already is not added again: nothing new is no error, as in Slurm.
    let (db, policy) = world();
    assert_eq!(plan_in(&db, &policy, "add account phys,hep"), Ok(Plan::Nothing(" Nothing new added.\n".into())));
    assert_eq!(plan_in(&db, &policy, "add qos high"), Ok(Plan::Nothing(" Nothing new added.\n".into())));
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
        AccountsEdit::DescribeAccount { name: "phys".into(), description: Some("physics".into()), organization: None }
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
        vec![AccountsEdit::ModifyQos {
            name: "normal".into(),
            changes: QosChanges { limits: per_user, priority: Some(7), description: None }
        }]
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
        vec![AccountsEdit::ModifyQos { name: "high".into(), changes: QosChanges { limits: per_job, priority: None, description: None } }]
    );
    assert!(refusal("modify user alice set GrpTRES=billing=4").contains("Corral limits cpu, mem, node and gres/gpu"));
    assert!(refusal("modify user alice set GrpTRES=mem=lots").contains("invalid memory size"));
    assert_eq!(refusal("modify user alice set MaxWall=soon"), " Bad MaxWall time format: MaxWall=soon");
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
    let (mut db, mut policy) = (Accounts::default(), SchedulerPolicy::default());
    for args in [
        "add account phys Description=Physics Organization=sci",
        "add account hep Parent=phys",
        "add user alice Account=phys,hep",
        "add qos high Priority=10",
        "modify user alice where account=phys set MaxJobs=1 GrpTRES=gres/gpu=2 QOS=normal,high",
        "modify account phys set MaxWall=60",
        "modify qos high set MaxJobsPerUser=2 GrpTRES=gres/gpu=8",
    ] {
        apply(&mut db, &mut policy, args);
    }
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
         \x20     phys              physics                  sci \n\
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

/// The lines of issue 45 that were refused: each is an add with its options in one command,
/// printed as Slurm's sacctmgr prints it.
#[test]
fn add_takes_limits_qos_lists_and_defaults_as_slurm_does() {
    assert_eq!(
        edits("add qos name=short maxwall=1"),
        vec![
            AccountsEdit::AddQos { name: "short".into(), priority: None },
            AccountsEdit::ModifyQos {
                name: "short".into(),
                changes: QosChanges {
                    limits: LimitChanges { max_wall_min: Some(Some(1)), ..Default::default() },
                    priority: None,
                    description: None
                }
            },
        ]
    );
    assert_eq!(
        summary("add qos name=short maxwall=1"),
        " Adding QOS(s)\n  short\n Settings\n  Description    = short\n  MaxWall                  = 00:01:00\n"
    );
    let gpucap = edits("add qos name=gpucap maxtresperuser=gres/gpu=2");
    let AccountsEdit::ModifyQos { changes, .. } = &gpucap[1] else { panic!("{gpucap:?}") };
    assert_eq!(changes.limits, LimitChanges { gpus_per_user_max: Some(Some(2)), ..Default::default() });
    assert_eq!(
        summary("add qos gpucap MaxTRESPU=cpu=8,gres/gpu=2 MaxJobsPU=4 Priority=5 Description=capped"),
        " Adding QOS(s)\n  gpucap\n Settings\n  Description    = capped\n  MaxJobsPerUser = 4\n  \
         MaxTRESPerUser           = cpu=8,gres/gpu=2\n  Priority                 = 5\n"
    );
    assert_eq!(
        edits("add account name=physics description=Physics organization=sciences grptres=cpu=16"),
        vec![
            AccountsEdit::AddAccount {
                name: "physics".into(),
                description: Some("physics".into()),
                organization: Some("sciences".into()),
                parent: None
            },
            AccountsEdit::ModifyAccount {
                name: "physics".into(),
                changes: AssocChanges { limits: LimitChanges { grp_cpus_max: Some(Some(16)), ..Default::default() }, ..Default::default() }
            },
        ]
    );
    assert_eq!(
        summary("add account name=physics description=Physics organization=sciences grptres=cpu=16"),
        " Adding Account(s)\n  physics\n Settings\n  Description     = physics\n  Organization    = sciences\n \
         Associations\n  A = physics    C = corral    \n Settings\n  GrpTRES       = cpu=16\n  Parent        = root\n"
    );
    // An account added with nothing but its name prints no second Settings.
    assert_eq!(
        summary("add account bio"),
        " Adding Account(s)\n  bio\n Settings\n  Description     = Account Name\n  Organization    = Parent/Account Name\n \
         Associations\n  A = bio        C = corral    \n"
    );
    assert_eq!(
        edits("add user name=alice account=phys maxjobs=1"),
        vec![
            AccountsEdit::AddUser { name: "alice".into(), account: "phys".into(), default_account: None },
            AccountsEdit::ModifyUser {
                name: "alice".into(),
                account: Some("phys".into()),
                changes: AssocChanges { limits: LimitChanges { max_jobs: Some(Some(1)), ..Default::default() }, ..Default::default() },
                default_account: None
            },
        ]
    );
    assert_eq!(
        summary("add user name=alice account=phys maxjobs=1"),
        " Adding User(s)\n  alice\n Associations =\n  U = alice     A = phys       C = corral    \n Non Default Settings\n  \
         MaxJobs       = 1\n"
    );
    let (mut db, mut policy) = world();
    let printed = apply(&mut db, &mut policy, "add user name=bob account=phys qos=high,low defaultqos=high DefaultAccount=phys");
    assert_eq!(
        printed,
        " Adding User(s)\n  bob\n Settings =\n  Default Account = phys\n Associations =\n  U = bob       A = phys       C = corral    \n \
         Non Default Settings\n  QOS           = high,low\n  DefQOS        = high\n"
    );
    assert_eq!(db.users["bob"].assocs["phys"].qos, vec!["high".to_string(), "low".to_string()]);
    assert_eq!(db.job_qos("bob", "phys").as_deref(), Some("high"));
    // Adding bob to hep too adds that association alone (Slurm's `limit_set` is Account='s, so
    // it prints the heading of no settings); again, nothing.
    assert_eq!(
        apply(&mut db, &mut policy, "add user bob account=phys,hep"),
        " Associations =\n  U = bob       A = hep        C = corral    \n Non Default Settings\n"
    );
    assert_eq!(plan_in(&db, &policy, "add user bob account=hep"), Ok(Plan::Nothing(" Nothing new added.\n".into())));
}

#[test]
fn options_match_as_slurm_matches_them() {
    let limits = |args: &str| match &edits(args)[1] {
        AccountsEdit::ModifyQos { changes, .. } => changes.limits.clone(),
        AccountsEdit::ModifyAccount { changes, .. } | AccountsEdit::ModifyUser { changes, .. } => changes.limits.clone(),
        other => panic!("{other:?}"),
    };
    // Any case, any prefix at least as long as Slurm's least one, first match in Slurm's order.
    assert_eq!(limits("ADD QOS Name=X MAXWALL=2:00:00").max_wall_min, Some(Some(120)));
    assert_eq!(limits("add qos x MaxW=1-00:00:00").max_wall_min, Some(Some(1440)));
    assert_eq!(limits("add qos x maxwall=90:30").max_wall_min, Some(Some(91)), "M:S, rounded up to minutes");
    assert_eq!(limits("add qos x maxwall=2-12").max_wall_min, Some(Some(3600)), "D-H");
    assert_eq!(limits("add qos x maxwall=0").max_wall_min, Some(Some(0)), "0 is a limit; -1 clears");
    assert_eq!(limits("add qos x maxwall=UNLIMITED").max_wall_min, Some(None));
    assert_eq!(limits("add qos x MaxJobs=3").max_jobs, Some(Some(3)), "MaxJobsPerUser on a QoS");
    assert_eq!(limits("add qos x MaxSubmit=3").max_submit_jobs, Some(Some(3)));
    assert_eq!(limits("add qos x MaxCPUsPerUser=8").cpus_per_user_max, Some(Some(8)));
    assert_eq!(limits("add qos x MaxTRES=gres/gpu=1").gpus_per_job_max, Some(Some(1)), "MaxTRES is MaxTRESPerJob");
    assert_eq!(limits("add qos x GrpTRES=mem=2T").grp_mem_mib_max, Some(Some(2 * 1024 * 1024)));
    assert_eq!(limits("add account x GrpWall=1-00:00:00").grp_wall_min, Some(Some(1440)));
    assert_eq!(limits("add account x GrpCPUs=4").grp_cpus_max, Some(Some(4)), "Slurm's older single-TRES options");
    assert_eq!(limits("add account x MaxNodesPerJob=2").nodes_per_job_max, Some(Some(2)));
    assert_eq!(limits("add user x account=phys MaxSubmitJobs=-1").max_submit_jobs, Some(None));
    assert_eq!(limits("add user x account=phys GrpJ=2").grp_jobs_max, Some(Some(2)));
    assert_eq!(refusal("add qos x Max=1"), " Unknown option: Max=1\n Use keyword 'where' to modify condition", "too short");
    assert_eq!(refusal("add user x account=phys MaxTRESPerUser=cpu=1"), " Unknown option: MaxTRESPerUser=cpu=1", "a QoS's alone");
    assert_eq!(refusal("add qos x MaxWall=soon"), " Bad MaxWall time format: MaxWall=soon");
    assert_eq!(refusal("add account x MaxJobs=many"), "sacctmgr: error: Invalid value for MaxJobs (many)");
    assert!(refusal("add qos x Flags=DenyOnLimit").starts_with(" Flags: Corral's sacctmgr does not support this option"));
    assert!(refusal("add account x GrpTRESMins=cpu=10").starts_with(" GrpTRESMins: Corral's sacctmgr does not support"));
    assert!(refusal("add user x account=phys Partition=gpu").starts_with(" Partition: Corral's sacctmgr does not support"));
    assert!(refusal("add user x account=phys AdminLevel=Admin").contains("Corral has no admin levels"));
    assert_eq!(edits("add user x account=phys AdminLevel=None").len(), 1);
    // QoS lists: `=`, `+=`, `-=`, and signs on the names; unknown ones in Slurm's words.
    let qos = |args: &str| match &edits(args)[..] {
        [AccountsEdit::ModifyUser { changes, .. } | AccountsEdit::ModifyAccount { changes, .. }] => changes.clone(),
        other => panic!("{other:?}"),
    };
    let c = qos("modify user alice set QOS+=high QosLevel-=low");
    assert_eq!((c.qos, c.qos_add, c.qos_remove), (None, vec!["high".to_string()], vec!["low".to_string()]));
    let c = qos("modify account phys set qos=+high,-normal");
    assert_eq!((c.qos, c.qos_add, c.qos_remove), (None, vec!["high".to_string()], vec!["normal".to_string()]));
    assert_eq!(qos("modify account phys set QOS=").qos, Some(vec![]), "back to what it inherits");
    assert_eq!(
        refusal("modify account phys set qos=high,+low"),
        "sacctmgr: error: You can't set qos equal to something and then add or subtract from it in the same line"
    );
    assert_eq!(refusal("add user x account=phys qos=gold"), "sacctmgr: error: You gave a bad qos 'gold'. Valid QOS's are normal,high,low");
    assert_eq!(
        refusal("add user x account=phys defaultqos=gold"),
        " You gave a bad default qos 'gold'.  Use 'list qos' to get complete list."
    );
    // `set` and `where` in either order.
    assert_eq!(edits("modify user set maxjobs=2 where name=alice"), edits("modify user where name=alice set maxjobs=2"));
}

#[test]
fn new_limits_show_in_slurms_columns() {
    let (mut db, mut policy) = sample();
    apply(&mut db, &mut policy, "add qos gpucap MaxTRESPerUser=gres/gpu=2,cpu=16 MaxWall=8:00:00 GrpWall=2-00:00:00 Description=Capped");
    apply(&mut db, &mut policy, "modify account phys set GrpWall=90");
    assert_eq!(
        show(&db, &policy, "-nP show qos where name=gpucap format=Name,Descr,MaxTRESPU,MaxWall,GrpWall"),
        "gpucap|capped|cpu=16,gres/gpu=2|08:00:00|2-00:00:00\n"
    );
    assert_eq!(show(&db, &policy, "-nP show assoc where account=phys format=Account,User,GrpWall"), "phys||01:30:00\nphys|alice|\n");
}
