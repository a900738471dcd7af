//! `GrpWall`: the wall-clock time the jobs of an association, an account (its whole subtree) or
//! a QoS used, decayed with the fair-share half-life as Slurm's priority/multifactor decays
//! `grp_used_wall`, and which of a job's `GrpWall` limits is used up. The leader times out the
//! running jobs under one (`engine::WallLimits`); a pending job waits (`AssocGrpWallLimit`,
//! `QOSGrpWallLimit`). As in Slurm 22.05's `acct_policy.c`: a job's QoS limit, when it has one,
//! is the only one that holds; otherwise its association's and each account's above it, root's
//! never; used minutes are whole (`grp_used_wall / 60`) and a limit is reached when they are at
//! or over it.

use std::collections::{BTreeMap, BTreeSet};

use proto::accounts::{Accounts, Usage, ROOT_ACCOUNT};

use crate::fairshare::decayed_wall_ms;

/// A run still holding its resources and not charged yet: wall-clock time so far of a job
/// charged to `account` (`None`: root) by `user` in QoS `qos`.
#[derive(Clone, Copy, Debug)]
pub struct LiveRun<'a> {
    pub account: Option<&'a str>,
    pub user: &'a str,
    pub qos: &'a str,
    pub wall_ms: u64,
}

/// A `GrpWall` a job is under that is used up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WallOver {
    /// Slurm's pending reason: `QOSGrpWallLimit` or `AssocGrpWallLimit`.
    pub code: &'static str,
    /// Slurm's words for it (slurmctld's `state_desc` when it times a job out).
    pub words: String,
}

/// The `GrpWall` limits in force and the time used against each, decayed to one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WallUse {
    /// Whether association limits hold (the database is enforced).
    enforced: bool,
    qos_limit_min: BTreeMap<String, u64>,
    /// Used milliseconds of each QoS with a limit, of each (account, user) association with
    /// one of its own, of each account with one (everything under it).
    qos_ms: BTreeMap<String, f64>,
    assoc_ms: BTreeMap<(String, String), f64>,
    account_ms: BTreeMap<String, f64>,
}

/// Minutes as Slurm counts them: whole ones.
fn whole_min(ms: f64) -> u64 {
    (ms / 60_000.0).floor() as u64
}

impl WallUse {
    /// What the associations (`usage`, by (account, user)), the QoS (`qos_usage`) and the
    /// runs not charged yet (`live`) used, decayed to `now_ms`, against `accounts`' limits and
    /// `qos_limit_min` (QoS name to its `GrpWall`). `None` when no limit is set anywhere (the
    /// usage is not even read).
    pub fn new<'a>(
        accounts: &Accounts,
        qos_limit_min: BTreeMap<String, u64>,
        usage: &BTreeMap<(String, String), Usage>,
        qos_usage: &BTreeMap<String, Usage>,
        live: impl IntoIterator<Item = LiveRun<'a>>,
        now_ms: u64,
        half_life_ms: u64,
    ) -> Option<WallUse> {
        // Association limits hold once the database is enforced (some user has an
        // association), as every other association limit; a QoS's always.
        let enforced = accounts.enforced();
        let limited_accounts: BTreeSet<&str> = accounts
            .accounts
            .values()
            .filter(|a| enforced && a.name != ROOT_ACCOUNT && a.limits.grp_wall_min.is_some())
            .map(|a| a.name.as_str())
            .collect();
        let limited_assocs: BTreeSet<(&str, &str)> = accounts
            .users
            .values()
            .flat_map(|u| {
                u.assocs
                    .iter()
                    .filter(|(a, assoc)| *a != ROOT_ACCOUNT && assoc.limits.grp_wall_min.is_some())
                    .map(|(a, _)| (a.as_str(), u.name.as_str()))
            })
            .collect();
        if qos_limit_min.is_empty() && limited_accounts.is_empty() && limited_assocs.is_empty() {
            return None;
        }
        let mut out = WallUse { enforced, qos_limit_min, ..Default::default() };
        let mut charge = |account: &str, user: &str, ms: f64| {
            if account == ROOT_ACCOUNT || ms <= 0.0 {
                return;
            }
            if limited_assocs.contains(&(account, user)) {
                *out.assoc_ms.entry((account.to_string(), user.to_string())).or_default() += ms;
            }
            if !limited_accounts.is_empty() {
                for a in accounts.lineage(account).into_iter().filter(|a| limited_accounts.contains(a.name.as_str())) {
                    *out.account_ms.entry(a.name.clone()).or_default() += ms;
                }
            }
        };
        for ((account, user), u) in usage.iter().filter(|(_, u)| u.wall_ms > 0) {
            charge(account, user, decayed_wall_ms(u, now_ms, half_life_ms));
        }
        let mut live_qos: Vec<(&str, u64)> = Vec::new();
        for run in live {
            charge(run.account.unwrap_or(ROOT_ACCOUNT), run.user, run.wall_ms as f64);
            live_qos.push((run.qos, run.wall_ms));
        }
        for (qos, u) in qos_usage.iter().filter(|(q, _)| out.qos_limit_min.contains_key(q.as_str())) {
            *out.qos_ms.entry(qos.clone()).or_default() += decayed_wall_ms(u, now_ms, half_life_ms);
        }
        for (qos, ms) in live_qos.into_iter().filter(|(q, _)| out.qos_limit_min.contains_key(*q)) {
            *out.qos_ms.entry(qos.to_string()).or_default() += ms as f64;
        }
        Some(out)
    }

    /// The `GrpWall` used up that holds a job of `user` charged to `account` (`None`: root) in
    /// QoS `qos`, if any: its QoS's when that has one, else its association's, else the first
    /// account's up the tree (root's never).
    pub fn over(&self, accounts: &Accounts, user: &str, account: Option<&str>, qos: &str) -> Option<WallOver> {
        if let Some(&limit) = self.qos_limit_min.get(qos) {
            let used = whole_min(self.qos_ms.get(qos).copied().unwrap_or(0.0));
            return (used >= limit).then(|| WallOver {
                code: "QOSGrpWallLimit",
                words: format!("Job is at or exceeds QOS {qos}'s group wall limit of {limit} with {used}"),
            });
        }
        let account = account.filter(|a| self.enforced && *a != ROOT_ACCOUNT)?;
        let assoc = |acc: &str, who: &str, limit: u64, ms: f64| {
            let used = whole_min(ms);
            (used >= limit).then(|| WallOver {
                code: "AssocGrpWallLimit",
                words: format!("Job is at or exceeds association (acc={acc}/user={who}/part=(null)) group wall limit {limit} with {used}"),
            })
        };
        if let Some(limit) = accounts.assoc(user, account).and_then(|a| a.limits.grp_wall_min) {
            let ms = self.assoc_ms.get(&(account.to_string(), user.to_string())).copied().unwrap_or(0.0);
            if let Some(over) = assoc(account, user, limit, ms) {
                return Some(over);
            }
        }
        accounts.lineage(account).into_iter().filter(|a| a.name != ROOT_ACCOUNT).find_map(|a| {
            let limit = a.limits.grp_wall_min?;
            assoc(&a.name, "(null)", limit, self.account_ms.get(&a.name).copied().unwrap_or(0.0))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::accounts::{Account, Assoc, User};

    /// root ── phys (GrpWall=2) ── theory ── alice (GrpWall=5); bob in phys, no limit of his own.
    fn db() -> Accounts {
        let mut db = Accounts::default();
        let mut phys = Account { name: "phys".into(), parent: Some("root".into()), ..Default::default() };
        phys.limits.grp_wall_min = Some(2);
        db.accounts.insert("phys".into(), phys);
        db.accounts.insert("theory".into(), Account { name: "theory".into(), parent: Some("phys".into()), ..Default::default() });
        let mut alice = Assoc::default();
        alice.limits.grp_wall_min = Some(5);
        db.users.insert(
            "alice".into(),
            User { name: "alice".into(), default_account: "theory".into(), assocs: [("theory".to_string(), alice)].into() },
        );
        db.users.insert(
            "bob".into(),
            User { name: "bob".into(), default_account: "phys".into(), assocs: [("phys".to_string(), Assoc::default())].into() },
        );
        db
    }

    fn wall(ms: u64, at_ms: u64) -> Usage {
        Usage { wall_ms: ms, at_ms, ..Default::default() }
    }

    #[test]
    fn nothing_limited_reads_nothing() {
        let used = BTreeMap::from([(("phys".to_string(), "bob".to_string()), wall(600_000, 0))]);
        assert_eq!(WallUse::new(&Accounts::default(), BTreeMap::new(), &used, &BTreeMap::new(), [], 0, 0), None);
    }

    #[test]
    fn an_account_covers_its_subtree_in_whole_minutes_with_running_jobs_counted() {
        let db = db();
        // alice (under theory, under phys) used 59 s; bob's running job 60 s: 1 min 59 s of 2.
        let used = BTreeMap::from([(("theory".to_string(), "alice".to_string()), wall(59_000, 0))]);
        let running = LiveRun { account: Some("phys"), user: "bob", qos: "normal", wall_ms: 60_000 };
        let w = WallUse::new(&db, BTreeMap::new(), &used, &BTreeMap::new(), [running], 0, 0).expect("limits set");
        assert_eq!(w.over(&db, "bob", Some("phys"), "normal"), None, "1 whole minute of 2");
        let w = WallUse::new(&db, BTreeMap::new(), &used, &BTreeMap::new(), [LiveRun { wall_ms: 61_000, ..running }], 0, 0).expect("set");
        let over = WallOver {
            code: "AssocGrpWallLimit",
            words: "Job is at or exceeds association (acc=phys/user=(null)/part=(null)) group wall limit 2 with 2".into(),
        };
        assert_eq!(w.over(&db, "bob", Some("phys"), "normal"), Some(over.clone()));
        // alice's own limit (5) is not reached; the account above her is.
        assert_eq!(w.over(&db, "alice", Some("theory"), "normal"), Some(over));
        // Root holds nothing; a job without an account has no association limit.
        assert_eq!(w.over(&db, "carol", None, "normal"), None);
        // Usage decays: a half-life later alice's 59 s count 29.5 s.
        let w = WallUse::new(&db, BTreeMap::new(), &used, &BTreeMap::new(), [LiveRun { wall_ms: 61_000, ..running }], 1_000, 1_000)
            .expect("set");
        assert_eq!(w.over(&db, "bob", Some("phys"), "normal"), None);
    }

    #[test]
    fn a_user_association_limits_its_own_jobs() {
        let mut db = db();
        db.accounts.get_mut("phys").expect("phys").limits.grp_wall_min = None;
        let used = BTreeMap::from([(("theory".to_string(), "alice".to_string()), wall(300_000, 0))]);
        let w = WallUse::new(&db, BTreeMap::new(), &used, &BTreeMap::new(), [], 0, 0).expect("alice's limit");
        let over = w.over(&db, "alice", Some("theory"), "normal").expect("5 of 5");
        assert_eq!(over.words, "Job is at or exceeds association (acc=theory/user=alice/part=(null)) group wall limit 5 with 5");
        assert_eq!(w.over(&db, "bob", Some("phys"), "normal"), None, "bob is not alice");
    }

    #[test]
    fn a_qos_limit_counts_every_job_of_it_and_overrides_the_associations() {
        let db = db();
        let limits = BTreeMap::from([("short".to_string(), 1)]);
        let used = BTreeMap::from([(("phys".to_string(), "bob".to_string()), wall(600_000, 0))]);
        let qos_used = BTreeMap::from([("short".to_string(), wall(30_000, 0))]);
        // A job without an account (root's) counts for its QoS.
        let root_run = LiveRun { account: None, user: "carol", qos: "short", wall_ms: 29_000 };
        let w = WallUse::new(&db, limits.clone(), &used, &qos_used, [root_run], 0, 0).expect("set");
        assert_eq!(w.over(&db, "bob", Some("phys"), "short"), None, "59 s of QOS short; phys's own limit does not hold");
        let w = WallUse::new(&db, limits, &used, &qos_used, [LiveRun { wall_ms: 30_000, ..root_run }], 0, 0).expect("set");
        let over = w.over(&db, "bob", Some("phys"), "short").expect("1 of 1");
        assert_eq!((over.code, over.words.as_str()), ("QOSGrpWallLimit", "Job is at or exceeds QOS short's group wall limit of 1 with 1"));
        assert_eq!(w.over(&db, "bob", Some("phys"), "normal").map(|o| o.code), Some("AssocGrpWallLimit"), "another QoS: phys's limit");
    }
}
