//! The accounting database's part of the state machine (`ClusterState::accounts`): its edits
//! (`Command::EditAccounts`, refused while live jobs use what an edit deletes), what a
//! submission must pass once an association exists (an association with its account, an
//! allowed QoS, `MaxSubmitJobs`), checked by the node before it proposes and again in `apply`,
//! and the defaults a submission gets (the user's default account and QoS, a time limit of
//! `MaxWall` where it has none). Deterministic: the state alone decides.

use proto::accounts::{Holder, SUBMIT_LIMIT};
use proto::{CommandResult, Job, JobId, JobSpec};

use crate::cluster::ClusterState;

/// Jobs a submission counts for `MaxSubmitJobs`: one, or each task of an array.
fn weight(spec: &JobSpec) -> u64 {
    spec.array.as_ref().map_or(1, |a| a.len() as u64)
}

impl ClusterState {
    /// `EditAccounts`: every edit or none (see [`proto::accounts::Accounts::edit`]).
    pub(crate) fn edit_accounts(&mut self, edits: &[proto::AccountsEdit]) -> CommandResult {
        let jobs = &self.jobs;
        let default_account = |user: &str| self.accounts.default_account(user).map(str::to_string);
        let live_jobs = |holder: Holder<'_>| -> Vec<JobId> {
            jobs.values()
                .filter(|j| !j.state.is_final())
                .filter(|j| {
                    let account = j.spec.account.clone().or_else(|| default_account(&j.spec.user));
                    match holder {
                        Holder::Account(a) => account.as_deref() == Some(a),
                        Holder::User { name, account: None } => j.spec.user == name,
                        Holder::User { name, account: Some(a) } => j.spec.user == name && account.as_deref() == Some(a),
                        Holder::Qos(q) => j.spec.qos.as_deref().unwrap_or(proto::DEFAULT_QOS) == q,
                    }
                })
                .map(|j| j.id)
                .collect()
        };
        let mut accounts = (*self.accounts).clone();
        let mut policy = self.policy.clone();
        match accounts.edit(&mut policy, edits, live_jobs) {
            Ok(()) => {
                self.accounts = std::sync::Arc::new(accounts);
                self.policy = policy;
                CommandResult::Ok
            }
            Err(why) => CommandResult::Rejected(why),
        }
    }

    /// What a submission gets from the database before it is checked: the user's default
    /// account when it names none, the association's default QoS (or the one QoS it allows)
    /// when it names none, and, with
    /// no time limit of its own or its partition's, the lowest `MaxWall` or `GrpWall` that holds
    /// for it (as Slurm sets it). Nothing while no association exists.
    pub fn bind_accounting(&self, spec: &mut JobSpec) {
        let db = &self.accounts;
        if !db.enforced() {
            return;
        }
        if spec.account.is_none() {
            spec.account = db.default_account(&spec.user).map(str::to_string);
        }
        let Some(account) = spec.account.clone() else { return };
        if spec.qos.is_none() {
            spec.qos = db.job_qos(&spec.user, &account);
        }
        let partition = spec.partition.as_deref().unwrap_or(self.policy.default_partition_name());
        let partition_default = self.policy.partitions.iter().find(|p| p.name == partition).and_then(|p| p.default_time_limit_ms);
        if spec.time_limit_ms.is_none() && partition_default.is_none() {
            let qos = spec.qos.as_deref().unwrap_or(proto::DEFAULT_QOS);
            let qos_limits = self.policy.qos.iter().find(|q| q.name == qos).map(|q| &q.limits);
            let qos_wall = qos_limits.and_then(|l| l.max_wall_min);
            let assoc_wall = db.effective_limits(&spec.user, &account).and_then(|l| l.max_wall_min);
            // `GrpWall` bounds it too, as Slurm's `_set_time_limit`: the QoS's, or where it has
            // none the association's and each account's above it (root's never).
            let own_grp = db.assoc(&spec.user, &account).and_then(|a| a.limits.grp_wall_min);
            let lineage = db.lineage(&account);
            let accounts_grp = lineage.iter().filter(|a| a.name != proto::accounts::ROOT_ACCOUNT).filter_map(|a| a.limits.grp_wall_min);
            let grp_wall = match qos_limits.and_then(|l| l.grp_wall_min) {
                Some(min) => Some(min),
                None => own_grp.into_iter().chain(accounts_grp).min(),
            };
            let wall_min = [qos_wall, assoc_wall, grp_wall].into_iter().flatten().min();
            spec.time_limit_ms = wall_min.map(|m| m.saturating_mul(60_000));
        }
    }

    /// Why the database refuses this submission, in Slurm's words (`None`: it may go in): no
    /// association with its account, a QoS the association does not allow, or one job more than
    /// `MaxSubmitJobs` of its association or `MaxSubmitJobsPerUser` of its QoS, or than
    /// `GrpSubmitJobs` of its association, an account above it or its QoS. Counting live
    /// jobs costs one scan of the hot state, made only where such a limit is set.
    pub fn accounting_refusal(&self, spec: &JobSpec) -> Option<String> {
        let db = &self.accounts;
        if let Some(why) = db.submit_refusal(&spec.user, spec.account.as_deref(), spec.qos.as_deref()) {
            return Some(why.to_string());
        }
        let qos = spec.qos.as_deref().unwrap_or(proto::DEFAULT_QOS);
        let job_qos = |j: &Job| j.spec.qos.as_deref().unwrap_or(proto::DEFAULT_QOS) == qos;
        let over = |live: u64, max: u32| live + weight(spec) > u64::from(max);
        if let Some(l) = self.policy.qos.iter().find(|q| q.name == qos).map(|q| &q.limits) {
            if l.max_submit_jobs.is_some_and(|max| over(self.live_weight(|j| j.spec.user == spec.user && job_qos(j)), max)) {
                return Some(SUBMIT_LIMIT.to_string());
            }
            if l.grp_submit_jobs_max.is_some_and(|max| over(self.live_weight(job_qos), max)) {
                return Some(SUBMIT_LIMIT.to_string());
            }
        }
        let account = spec.account.as_deref().or_else(|| db.default_account(&spec.user))?;
        let account_of = |j: &Job| j.spec.account.clone().or_else(|| db.default_account(&j.spec.user).map(str::to_string));
        let in_assoc = |j: &Job| j.spec.user == spec.user && account_of(j).as_deref() == Some(account);
        let limits = db.effective_limits(&spec.user, account)?;
        if limits.max_submit_jobs.is_some_and(|max| over(self.live_weight(in_assoc), max)) {
            return Some(SUBMIT_LIMIT.to_string());
        }
        let own_grp = db.assoc(&spec.user, account).and_then(|a| a.limits.grp_submit_jobs_max);
        if own_grp.is_some_and(|max| over(self.live_weight(in_assoc), max)) {
            return Some(SUBMIT_LIMIT.to_string());
        }
        // GrpSubmitJobs of each account up the tree counts every job under it.
        for a in db.lineage(account) {
            let Some(max) = a.limits.grp_submit_jobs_max else { continue };
            let under = |j: &Job| account_of(j).is_some_and(|acct| db.lineage(&acct).iter().any(|x| x.name == a.name));
            if over(self.live_weight(under), max) {
                return Some(SUBMIT_LIMIT.to_string());
            }
        }
        None
    }

    /// Pending and running jobs matching `which`, an array's tasks not yet started each counted.
    fn live_weight(&self, which: impl Fn(&Job) -> bool) -> u64 {
        self.jobs
            .values()
            .filter(|j| !j.state.is_final() && which(j))
            .map(|j| match (&j.spec.array, &j.array) {
                (Some(a), None) => (a.len() as u64).saturating_sub(self.array_started.get(&j.id).map_or(0, |s| s.len() as u64)),
                _ => 1,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use proto::accounts::{AssocChanges, LimitChanges, QosChanges, INVALID_ACCOUNT, INVALID_QOS};
    use proto::{AccountsEdit, ArraySpec, Command, CommandResult, JobSpec};

    use crate::cluster::ClusterState;

    fn edit(s: &mut ClusterState, edits: Vec<AccountsEdit>) -> CommandResult {
        s.apply(&Command::EditAccounts { edits, now_ms: 5 })
    }

    fn add_account(name: &str) -> AccountsEdit {
        AccountsEdit::AddAccount { name: name.into(), description: Some(format!("{name} dept")), organization: None, parent: None }
    }

    fn add_user(name: &str, account: &str) -> AccountsEdit {
        AccountsEdit::AddUser { name: name.into(), account: account.into(), default_account: None }
    }

    fn modify_user(name: &str, changes: AssocChanges) -> AccountsEdit {
        AccountsEdit::ModifyUser { name: name.into(), account: None, changes, default_account: None }
    }

    fn spec(user: &str, account: Option<&str>) -> JobSpec {
        let mut s = JobSpec::command(vec!["true".into()], "/tmp", user);
        s.account = account.map(str::to_string);
        s
    }

    /// Submits as the node does: defaults bound, then applied.
    fn submit(s: &mut ClusterState, mut spec: JobSpec) -> CommandResult {
        s.bind_accounting(&mut spec);
        s.apply(&Command::Submit { spec, now_ms: 10 })
    }

    fn rejected(why: &str) -> CommandResult {
        CommandResult::Rejected(why.into())
    }

    #[test]
    fn every_edit_goes_through_apply_and_a_refused_one_changes_nothing() {
        let mut s = ClusterState::default();
        assert_eq!(edit(&mut s, vec![add_account("phys"), add_account("chem"), add_user("alice", "phys")]), CommandResult::Ok);
        assert_eq!(edit(&mut s, vec![AccountsEdit::AddQos { name: "high".into(), priority: Some(100) }]), CommandResult::Ok);
        let limits = LimitChanges { max_jobs: Some(Some(2)), grp_gpus_max: Some(Some(8)), ..Default::default() };
        let edits = vec![
            AccountsEdit::ModifyAccount { name: "phys".into(), changes: AssocChanges { limits: limits.clone(), ..Default::default() } },
            modify_user("alice", AssocChanges { qos: Some(vec!["normal".into(), "high".into()]), ..Default::default() }),
            AccountsEdit::ModifyQos { name: "high".into(), changes: QosChanges { limits, priority: Some(50), description: None } },
        ];
        assert_eq!(edit(&mut s, edits), CommandResult::Ok);
        assert_eq!(s.accounts.accounts["phys"].description, "phys dept");
        assert_eq!(s.accounts.accounts["phys"].limits.max_jobs, Some(2));
        assert_eq!(s.accounts.users["alice"].assocs["phys"].qos, vec!["normal".to_string(), "high".to_string()]);
        assert_eq!((s.policy.qos[0].priority, s.policy.qos[0].limits.grp_gpus_max), (50, Some(8)));
        // Replicas that applied the same edits agree; a snapshot's header keeps the database.
        assert_eq!(s.clone_without_jobs().accounts, s.accounts);
        let digest = s.digest();
        // A refused edit in a command leaves the whole command unapplied.
        let bad = vec![add_account("bio"), AccountsEdit::DeleteAccount { name: "nope".into() }];
        assert_eq!(edit(&mut s, bad), rejected("Account 'nope' does not exist"));
        assert!(!s.accounts.accounts.contains_key("bio"));
        assert_eq!(s.digest(), digest);
        let edits = vec![
            AccountsEdit::DeleteUser { name: "alice".into(), account: None },
            AccountsEdit::DeleteAccount { name: "chem".into() },
            AccountsEdit::DeleteQos { name: "high".into() },
        ];
        assert_eq!(edit(&mut s, edits), CommandResult::Ok);
        assert!(s.accounts.users.is_empty() && s.policy.qos.is_empty());
        assert_eq!(s.accounts.accounts.keys().collect::<Vec<_>>(), vec!["phys", "root"]);
    }

    #[test]
    fn deleting_what_live_jobs_use_is_refused_until_they_end() {
        let mut s = ClusterState::default();
        assert_eq!(edit(&mut s, vec![add_account("phys"), add_user("alice", "phys"), add_user("bob", "phys")]), CommandResult::Ok);
        let CommandResult::Submitted { job } = submit(&mut s, spec("alice", None)) else { panic!("alice may submit") };
        assert_eq!(s.jobs[&job].spec.account.as_deref(), Some("phys"), "her default account");
        let delete_alice = || vec![AccountsEdit::DeleteUser { name: "alice".into(), account: None }];
        assert_eq!(edit(&mut s, delete_alice()), rejected(&format!("Job(s) active, cancel job(s) before remove: {job}")));
        assert_eq!(edit(&mut s, vec![AccountsEdit::DeleteUser { name: "bob".into(), account: None }]), CommandResult::Ok);
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 20 }), CommandResult::Ok);
        assert_eq!(edit(&mut s, delete_alice()), CommandResult::Ok);
        assert_eq!(edit(&mut s, vec![AccountsEdit::DeleteAccount { name: "phys".into() }]), CommandResult::Ok);
    }

    #[test]
    fn submissions_are_refused_in_slurms_words_once_an_association_exists() {
        let mut s = ClusterState::default();
        assert_eq!(edit(&mut s, vec![add_account("phys"), add_account("chem")]), CommandResult::Ok);
        assert!(matches!(submit(&mut s, spec("bob", Some("anything"))), CommandResult::Submitted { .. }), "nothing enforced yet");
        assert_eq!(
            edit(&mut s, vec![add_user("alice", "phys"), AccountsEdit::AddQos { name: "high".into(), priority: None }]),
            CommandResult::Ok
        );
        assert_eq!(submit(&mut s, spec("bob", None)), rejected(INVALID_ACCOUNT));
        assert_eq!(submit(&mut s, spec("alice", Some("chem"))), rejected(INVALID_ACCOUNT));
        let mut high = spec("alice", None);
        high.qos = Some("high".into());
        assert_eq!(submit(&mut s, high), rejected(INVALID_QOS));
        // MaxSubmitJobs=2: pending and running jobs count, an array by its tasks.
        let limit = LimitChanges { max_submit_jobs: Some(Some(2)), ..Default::default() };
        assert_eq!(edit(&mut s, vec![modify_user("alice", AssocChanges { limits: limit, ..Default::default() })]), CommandResult::Ok);
        assert!(matches!(submit(&mut s, spec("alice", Some("phys"))), CommandResult::Submitted { .. }));
        let mut array = spec("alice", None);
        array.array = Some(ArraySpec::from_ids(&[1, 2], None));
        assert_eq!(submit(&mut s, array), rejected(proto::accounts::SUBMIT_LIMIT));
        assert!(matches!(submit(&mut s, spec("alice", None)), CommandResult::Submitted { .. }));
        assert_eq!(submit(&mut s, spec("alice", None)), rejected(proto::accounts::SUBMIT_LIMIT));
    }

    #[test]
    fn group_submit_limits_count_every_users_jobs_under_an_account_and_a_qos() {
        let mut s = ClusterState::default();
        let hep = AccountsEdit::AddAccount { name: "hep".into(), description: None, organization: None, parent: Some("phys".into()) };
        assert_eq!(edit(&mut s, vec![add_account("phys"), hep, add_user("alice", "hep"), add_user("bob", "phys")]), CommandResult::Ok);
        // GrpSubmitJobs=2 on phys covers hep's jobs too.
        let limits = LimitChanges { grp_submit_jobs_max: Some(Some(2)), ..Default::default() };
        let changes = AssocChanges { limits, ..Default::default() };
        assert_eq!(edit(&mut s, vec![AccountsEdit::ModifyAccount { name: "phys".into(), changes }]), CommandResult::Ok);
        assert!(matches!(submit(&mut s, spec("alice", None)), CommandResult::Submitted { .. }));
        let CommandResult::Submitted { job } = submit(&mut s, spec("bob", None)) else { panic!("bob's is the second") };
        assert_eq!(submit(&mut s, spec("bob", None)), rejected(proto::accounts::SUBMIT_LIMIT));
        assert_eq!(submit(&mut s, spec("alice", None)), rejected(proto::accounts::SUBMIT_LIMIT), "alice's hep is under phys");
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 20 }), CommandResult::Ok);
        assert!(matches!(submit(&mut s, spec("alice", None)), CommandResult::Submitted { .. }), "a place again");
        // A QoS's GrpSubmitJobs counts all its users.
        let limits = LimitChanges { grp_submit_jobs_max: Some(Some(1)), ..Default::default() };
        let edits = vec![
            AccountsEdit::AddQos { name: "debug".into(), priority: None },
            AccountsEdit::ModifyQos { name: "debug".into(), changes: QosChanges { limits, priority: None, description: None } },
            AccountsEdit::ModifyAccount {
                name: "phys".into(),
                changes: AssocChanges { qos_add: vec!["debug".into()], ..Default::default() },
            },
            AccountsEdit::ModifyAccount {
                name: "phys".into(),
                changes: AssocChanges {
                    limits: LimitChanges { grp_submit_jobs_max: Some(None), ..Default::default() },
                    ..Default::default()
                },
            },
        ];
        assert_eq!(edit(&mut s, edits), CommandResult::Ok);
        let debug = |user: &str| {
            let mut sp = spec(user, None);
            sp.qos = Some("debug".into());
            sp
        };
        assert!(matches!(submit(&mut s, debug("bob")), CommandResult::Submitted { .. }));
        assert_eq!(submit(&mut s, debug("alice")), rejected(proto::accounts::SUBMIT_LIMIT));
    }

    #[test]
    fn a_submission_gets_its_default_account_qos_and_max_wall() {
        let mut s = ClusterState::default();
        let mut plain = spec("alice", None);
        s.bind_accounting(&mut plain);
        assert_eq!(plain, spec("alice", None), "nothing bound while nothing is enforced");
        let wall = LimitChanges { max_wall_min: Some(Some(90)), ..Default::default() };
        let assoc = AssocChanges {
            limits: wall,
            qos: Some(vec!["normal".into(), "high".into()]),
            default_qos: Some(Some("high".into())),
            ..Default::default()
        };
        let edits = vec![add_account("phys"), add_user("alice", "phys"), AccountsEdit::AddQos { name: "high".into(), priority: None }];
        assert_eq!(edit(&mut s, edits), CommandResult::Ok);
        assert_eq!(edit(&mut s, vec![modify_user("alice", assoc)]), CommandResult::Ok);
        let mut bound = spec("alice", None);
        s.bind_accounting(&mut bound);
        assert_eq!((bound.account.as_deref(), bound.qos.as_deref(), bound.time_limit_ms), (Some("phys"), Some("high"), Some(90 * 60_000)));
        // Its own time limit stays (the scheduler holds it if it is over MaxWall).
        let mut own = spec("alice", None);
        own.time_limit_ms = Some(600 * 60_000);
        s.bind_accounting(&mut own);
        assert_eq!(own.time_limit_ms, Some(600 * 60_000));
        // GrpWall bounds it (Slurm: `TimeLimit=00:01:00` under `GrpWall=1`): phys's, and a QoS's
        // in place of the associations' where it has one.
        let grp = |min| AssocChanges { limits: LimitChanges { grp_wall_min: Some(Some(min)), ..Default::default() }, ..Default::default() };
        assert_eq!(edit(&mut s, vec![AccountsEdit::ModifyAccount { name: "phys".into(), changes: grp(1) }]), CommandResult::Ok);
        let mut bound = spec("alice", None);
        s.bind_accounting(&mut bound);
        assert_eq!(bound.time_limit_ms, Some(60_000));
        let qos = proto::accounts::QosChanges { limits: grp(120).limits, ..Default::default() };
        assert_eq!(edit(&mut s, vec![AccountsEdit::ModifyQos { name: "high".into(), changes: qos }]), CommandResult::Ok);
        let mut bound = spec("alice", None);
        s.bind_accounting(&mut bound);
        assert_eq!(bound.time_limit_ms, Some(90 * 60_000), "QOS high's GrpWall (120) holds, not phys's; MaxWall (90) is lower");
    }
}
