//! The accounting database's edits, refusals and look-ups.

use super::*;

fn no_jobs(_: Holder<'_>) -> Vec<crate::JobId> {
    Vec::new()
}

fn add_account(name: &str, parent: Option<&str>) -> AccountsEdit {
    AccountsEdit::AddAccount { name: name.into(), description: None, organization: None, parent: parent.map(str::to_string) }
}

fn add_user(name: &str, account: &str) -> AccountsEdit {
    AccountsEdit::AddUser { name: name.into(), account: account.into(), default_account: None }
}

fn set(changes: LimitChanges) -> AssocChanges {
    AssocChanges { limits: changes, ..Default::default() }
}

/// A database with accounts `phys` (under root) and `hep` (under phys), user alice in both.
fn sample() -> (Accounts, SchedulerPolicy) {
    let mut db = Accounts::default();
    let mut policy = SchedulerPolicy::default();
    let edits = [add_account("phys", None), add_account("hep", Some("phys")), add_user("alice", "phys"), add_user("alice", "hep")];
    assert_eq!(db.edit(&mut policy, &edits, no_jobs), Ok(()));
    (db, policy)
}

#[test]
fn an_empty_database_enforces_nothing() {
    let db = Accounts::default();
    assert!(!db.enforced());
    assert_eq!(db.submit_refusal("bob", Some("anything"), Some("whatever")), None);
    assert_eq!(db.accounts.keys().collect::<Vec<_>>(), vec!["root"]);
}

#[test]
fn accounts_and_users_are_added_with_slurms_defaults() {
    let (db, _) = sample();
    assert!(db.enforced());
    let phys = &db.accounts["phys"];
    assert_eq!((phys.description.as_str(), phys.organization.as_str(), phys.parent.as_deref()), ("phys", "phys", Some("root")));
    let hep = &db.accounts["hep"];
    assert_eq!((hep.organization.as_str(), hep.parent.as_deref()), ("phys", Some("phys")), "a child takes its parent's organization");
    assert_eq!(db.default_account("alice"), Some("phys"), "the first account is the default");
    assert_eq!(db.lineage("hep").iter().map(|a| a.name.as_str()).collect::<Vec<_>>(), vec!["hep", "phys", "root"]);
}

#[test]
fn submissions_are_checked_once_an_association_exists() {
    let (db, _) = sample();
    assert_eq!(db.submit_refusal("alice", Some("phys"), None), None);
    assert_eq!(db.submit_refusal("alice", None, None), None, "the default account");
    assert_eq!(db.submit_refusal("alice", Some("root"), None), Some(INVALID_ACCOUNT));
    assert_eq!(db.submit_refusal("alice", Some("nope"), None), Some(INVALID_ACCOUNT));
    assert_eq!(db.submit_refusal("bob", None, None), Some(INVALID_ACCOUNT), "a user with no association");
    assert_eq!(db.submit_refusal("alice", Some("phys"), Some("normal")), None);
    assert_eq!(db.submit_refusal("alice", Some("phys"), Some("high")), Some(INVALID_QOS));
}

#[test]
fn qos_lists_and_defaults_are_inherited_and_checked() {
    let (mut db, mut policy) = sample();
    let qos = AccountsEdit::AddQos { name: "high".into(), priority: Some(10) };
    assert_eq!(db.edit(&mut policy, std::slice::from_ref(&qos), no_jobs), Ok(()));
    assert_eq!(policy.qos[0].priority, 10);
    assert_eq!(db.edit(&mut policy, &[qos], no_jobs), Err("QOS 'high' already exists".into()));
    let allow =
        AssocChanges { qos: Some(vec!["normal".into(), "high".into()]), default_qos: Some(Some("high".into())), ..Default::default() };
    assert_eq!(db.edit(&mut policy, &[AccountsEdit::ModifyAccount { name: "phys".into(), changes: allow }], no_jobs), Ok(()));
    // hep and alice's associations set none: phys's list and default hold for both.
    assert_eq!(db.allowed_qos("alice", "hep"), vec!["normal".to_string(), "high".to_string()]);
    assert_eq!(db.default_qos("alice", "hep").as_deref(), Some("high"));
    assert_eq!(db.submit_refusal("alice", Some("hep"), Some("high")), None);
    // A QoS that does not exist, or a default outside the list, is refused whole.
    let before = (db.clone(), policy.clone());
    let bad = AssocChanges { qos: Some(vec!["nope".into()]), ..Default::default() };
    let edit = AccountsEdit::ModifyUser { name: "alice".into(), account: None, changes: bad, default_account: None };
    assert_eq!(db.edit(&mut policy, &[edit], no_jobs), Err("Invalid qos 'nope'".into()));
    let outside = AssocChanges { qos: Some(vec!["normal".into()]), default_qos: Some(Some("high".into())), ..Default::default() };
    let edit = AccountsEdit::ModifyUser { name: "alice".into(), account: Some("hep".into()), changes: outside, default_account: None };
    assert!(db.edit(&mut policy, &[edit], no_jobs).is_err());
    let unknown_default = AssocChanges { default_qos: Some(Some("gold".into())), ..Default::default() };
    let edit = AccountsEdit::ModifyAccount { name: "hep".into(), changes: unknown_default };
    assert_eq!(db.edit(&mut policy, &[edit], no_jobs), Err("Invalid qos 'gold'".into()));
    assert_eq!((db.clone(), policy.clone()), before);
    // A QoS the policy dropped since (`corral policy set`) blocks no later edit.
    let mut dropped = policy.clone();
    dropped.qos.clear();
    assert_eq!(db.clone().edit(&mut dropped, &[add_account("bio", None)], no_jobs), Ok(()));
    // QOS+= and QOS-= start from the list in effect: hep's own list is empty, phys's holds.
    let plus = AssocChanges { qos_add: vec!["high".into()], qos_remove: vec!["normal".into()], ..Default::default() };
    assert_eq!(db.edit(&mut policy, &[AccountsEdit::ModifyAccount { name: "hep".into(), changes: plus }], no_jobs), Ok(()));
    assert_eq!(db.accounts["hep"].qos, vec!["high".to_string()]);
    let minus = AssocChanges { qos_remove: vec!["normal".into()], ..Default::default() };
    let edit = AccountsEdit::ModifyUser { name: "alice".into(), account: Some("phys".into()), changes: minus, default_account: None };
    assert_eq!(db.edit(&mut policy, &[edit], no_jobs), Ok(()));
    assert_eq!(db.allowed_qos("alice", "phys"), vec!["high".to_string()]);
    let unknown = AssocChanges { qos_add: vec!["gold".into()], ..Default::default() };
    let edit = AccountsEdit::ModifyAccount { name: "hep".into(), changes: unknown };
    assert_eq!(db.edit(&mut policy, &[edit], no_jobs), Err("Invalid qos 'gold'".into()));
    // Deleting the QoS takes it out of every list.
    assert_eq!(db.edit(&mut policy, &[AccountsEdit::DeleteQos { name: "high".into() }], no_jobs), Ok(()));
    assert_eq!(db.accounts["phys"].qos, vec!["normal".to_string()]);
    assert_eq!(db.accounts["phys"].default_qos, None);
    assert!(db.accounts["hep"].qos.is_empty() && db.users["alice"].assocs["phys"].qos.is_empty(), "back to what they inherit");
    assert!(policy.qos.is_empty());
    let normal = AccountsEdit::DeleteQos { name: "normal".into() };
    assert_eq!(db.edit(&mut policy, &[normal], no_jobs), Err("The 'normal' QOS cannot be deleted".into()));
}

#[test]
fn limits_are_set_cleared_and_inherited_limit_by_limit() {
    let (mut db, mut policy) = sample();
    let on_phys = LimitChanges { max_jobs: Some(Some(4)), max_wall_min: Some(Some(60)), grp_gpus_max: Some(Some(8)), ..Default::default() };
    let on_alice = LimitChanges { max_jobs: Some(Some(1)), ..Default::default() };
    let edits = [
        AccountsEdit::ModifyAccount { name: "phys".into(), changes: set(on_phys) },
        AccountsEdit::ModifyUser { name: "alice".into(), account: Some("hep".into()), changes: set(on_alice), default_account: None },
    ];
    assert_eq!(db.edit(&mut policy, &edits, no_jobs), Ok(()));
    let describe = AccountsEdit::DescribeAccount { name: "hep".into(), description: Some("High energy".into()), organization: None };
    assert_eq!(db.edit(&mut policy, &[describe], no_jobs), Ok(()));
    assert_eq!((db.accounts["hep"].description.as_str(), db.accounts["hep"].organization.as_str()), ("High energy", "phys"));
    let hep = db.effective_limits("alice", "hep").expect("alice is in hep");
    assert_eq!((hep.max_jobs, hep.max_wall_min, hep.grp_gpus_max), (Some(1), Some(60), None), "the group limit is not inherited");
    assert_eq!(db.effective_limits("alice", "phys").and_then(|l| l.max_jobs), Some(4));
    assert_eq!(db.effective_limits("bob", "phys"), None);
    // -1 clears.
    let clear = LimitChanges { max_jobs: Some(None), ..Default::default() };
    let edit = AccountsEdit::ModifyUser { name: "alice".into(), account: None, changes: set(clear), default_account: None };
    assert_eq!(db.edit(&mut policy, &[edit], no_jobs), Ok(()));
    assert_eq!(db.effective_limits("alice", "hep").and_then(|l| l.max_jobs), Some(4), "phys's again");
    // QoS limits live in the policy; `normal` is defined by its first change.
    let qos = QosChanges { limits: LimitChanges { max_jobs: Some(Some(2)), ..Default::default() }, priority: None, description: None };
    assert_eq!(db.edit(&mut policy, &[AccountsEdit::ModifyQos { name: "normal".into(), changes: qos.clone() }], no_jobs), Ok(()));
    assert_eq!(policy.qos[0].limits.max_jobs, Some(2));
    let missing = AccountsEdit::ModifyQos { name: "gold".into(), changes: qos };
    assert_eq!(db.edit(&mut policy, &[missing], no_jobs), Err("QOS 'gold' does not exist".into()));
}

#[test]
fn deletions_refuse_what_is_in_use() {
    let (mut db, mut policy) = sample();
    let delete = |name: &str| AccountsEdit::DeleteAccount { name: name.into() };
    assert_eq!(db.edit(&mut policy, &[delete("root")], no_jobs), Err("The root account cannot be deleted".into()));
    assert_eq!(db.edit(&mut policy, &[delete("phys")], no_jobs), Err("Account 'phys' has child accounts (hep): delete them first".into()));
    assert_eq!(
        db.edit(&mut policy, &[delete("hep")], no_jobs),
        Err("Account 'hep' has users (alice): delete their associations first".into())
    );
    // alice's default is phys: her hep association may go, while a job of hers runs there not.
    let hep_assoc = AccountsEdit::DeleteUser { name: "alice".into(), account: Some("hep".into()) };
    let busy = |h: Holder<'_>| if h == (Holder::User { name: "alice", account: Some("hep") }) { vec![7] } else { vec![] };
    assert_eq!(db.edit(&mut policy, std::slice::from_ref(&hep_assoc), busy), Err("Job(s) active, cancel job(s) before remove: 7".into()));
    let phys_assoc = AccountsEdit::DeleteUser { name: "alice".into(), account: Some("phys".into()) };
    assert!(db.edit(&mut policy, &[phys_assoc], no_jobs).is_err_and(|e| e.contains("default account")));
    assert_eq!(db.edit(&mut policy, &[hep_assoc, delete("hep")], no_jobs), Ok(()));
    assert!(!db.accounts.contains_key("hep"));
    let busy_account = |h: Holder<'_>| if h == Holder::Account("phys") { vec![3, 4] } else { vec![] };
    let all = [AccountsEdit::DeleteUser { name: "alice".into(), account: None }, delete("phys")];
    assert_eq!(db.edit(&mut policy, &all, busy_account), Err("Job(s) active, cancel job(s) before remove: 3,4".into()));
    assert_eq!(db.edit(&mut policy, &all, no_jobs), Ok(()));
    assert!(!db.enforced());
}

#[test]
fn bad_names_and_unknown_parents_are_refused_whole() {
    let (mut db, mut policy) = sample();
    let before = db.clone();
    for bad in ["", "a b", "a,b", "a=b", "a|b", &"x".repeat(65)] {
        assert!(db.edit(&mut policy, &[add_account(bad, None)], no_jobs).is_err(), "{bad:?}");
    }
    let edits = [add_account("ok", None), add_account("orphan", Some("nope"))];
    assert_eq!(db.edit(&mut policy, &edits, no_jobs), Err("Parent account 'nope' does not exist".into()));
    assert_eq!(db.edit(&mut policy, &[add_user("bob", "nope")], no_jobs), Err("Account 'nope' does not exist".into()));
    assert!(db.edit(&mut policy, &[add_user("alice", "phys")], no_jobs).is_err_and(|e| e.starts_with("Nothing new added")));
    assert_eq!(db.edit(&mut policy, &[], no_jobs), Err(format!("1 to {EDITS_MAX} changes at once")));
    let long = AccountsEdit::AddAccount { name: "d".into(), description: Some("x".repeat(300)), organization: None, parent: None };
    assert!(db.edit(&mut policy, &[long], no_jobs).is_err());
    assert_eq!(db, before);
}

#[test]
fn a_job_without_qos_gets_the_default_else_the_only_qos_allowed() {
    let (mut db, mut policy) = sample();
    let edits = [
        AccountsEdit::AddQos { name: "a".into(), priority: None },
        AccountsEdit::AddQos { name: "b".into(), priority: None },
        AccountsEdit::ModifyQos {
            name: "a".into(),
            changes: QosChanges {
                limits: LimitChanges { gpus_per_user_max: Some(Some(2)), grp_wall_min: Some(Some(90)), ..Default::default() },
                priority: None,
                description: Some("short jobs".into()),
            },
        },
    ];
    assert_eq!(db.edit(&mut policy, &edits, no_jobs), Ok(()));
    assert_eq!((policy.qos[0].limits.gpus_per_user_max, policy.qos[0].limits.grp_wall_min), (Some(2), Some(90)));
    assert_eq!(policy.qos[0].description.as_deref(), Some("short jobs"));
    assert_eq!(db.job_qos("alice", "phys"), None, "normal, the one QoS root allows");
    let only_b = AssocChanges { qos: Some(vec!["b".into()]), ..Default::default() };
    let edit = AccountsEdit::ModifyUser { name: "alice".into(), account: Some("phys".into()), changes: only_b, default_account: None };
    assert_eq!(db.edit(&mut policy, &[edit], no_jobs), Ok(()));
    assert_eq!(db.job_qos("alice", "phys").as_deref(), Some("b"), "the one QoS allowed");
    let both = AssocChanges { qos: Some(vec!["a".into(), "b".into()]), default_qos: Some(Some("a".into())), ..Default::default() };
    let edit = AccountsEdit::ModifyUser { name: "alice".into(), account: Some("phys".into()), changes: both, default_account: None };
    assert_eq!(db.edit(&mut policy, &[edit], no_jobs), Ok(()));
    assert_eq!(db.job_qos("alice", "phys").as_deref(), Some("a"), "its DefaultQOS");
    assert_eq!(db.submit_refusal("alice", Some("phys"), Some("normal")), Some(INVALID_QOS), "normal is not in its list");
}
