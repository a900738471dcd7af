//! Slurm's accounting database as Corral replicates it: accounts (a tree under `root`), users
//! with a default account, associations of a user with an account, and the limits `sacctmgr`
//! sets on associations, accounts and QoS. Changed only through the log
//! (`Command::EditAccounts`, applied by [`Accounts::edit`]: every edit of one command or none),
//! bounded like the scheduling policy. A database with no user association enforces nothing,
//! as a Slurm without `AccountingStorageEnforce`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{QosDef, SchedulerPolicy};

/// The account every other descends from; it always exists.
pub const ROOT_ACCOUNT: &str = "root";
/// Accounts at most (root included).
pub const ACCOUNTS_MAX: usize = 4096;
/// Users at most, and associations (user, account) at most over all users.
pub const USERS_MAX: usize = 65_536;
pub const ASSOCS_MAX: usize = 65_536;
/// Bytes of an account, user or QoS name at most.
pub const NAME_BYTES_MAX: usize = 64;
/// Bytes of a description or organization at most.
pub const TEXT_BYTES_MAX: usize = 256;
/// QoS one association or account allows at most.
pub const QOS_PER_ASSOC_MAX: usize = 64;
/// Edits in one command at most.
pub const EDITS_MAX: usize = 256;

// Slurm's words for a submission the database refuses.
pub const INVALID_ACCOUNT: &str = "Invalid account or account/partition combination specified";
pub const INVALID_QOS: &str = "Invalid qos specification";
pub const SUBMIT_LIMIT: &str = "Job violates accounting/QOS policy (job submit limit, user's size and/or time limits)";

/// Limits of an association, an account or a QoS; `None`: none. On a QoS, `max_jobs` and
/// `max_submit_jobs` are per user (`MaxJobsPerUser`, `MaxSubmitJobsPerUser`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// `MaxJobs`: running jobs of one user.
    #[serde(default)]
    pub max_jobs: Option<u32>,
    /// `MaxSubmitJobs`: pending and running jobs of one user (an array counts its tasks).
    #[serde(default)]
    pub max_submit_jobs: Option<u32>,
    /// `MaxWall`: the time limit of one job.
    #[serde(default)]
    pub max_wall_min: Option<u64>,
    /// `GrpTRES=gres/gpu=N`: GPUs held by all running jobs together.
    #[serde(default)]
    pub grp_gpus_max: Option<u32>,
    /// `MaxTRESPerJob=gres/gpu=N`: GPUs of one job.
    #[serde(default)]
    pub gpus_per_job_max: Option<u32>,
    /// `GrpTRES=cpu=N,mem=M,node=K`: CPUs, memory and nodes held by all running jobs together
    /// (a job's nodes counted once per job).
    #[serde(default)]
    pub grp_cpus_max: Option<u32>,
    #[serde(default)]
    pub grp_mem_mib_max: Option<u64>,
    #[serde(default)]
    pub grp_nodes_max: Option<u32>,
    /// `MaxTRESPerJob=cpu=N,mem=M,node=K`: CPUs, memory and nodes of one job.
    #[serde(default)]
    pub cpus_per_job_max: Option<u32>,
    #[serde(default)]
    pub mem_mib_per_job_max: Option<u64>,
    #[serde(default)]
    pub nodes_per_job_max: Option<u32>,
    /// `GrpJobs`: running jobs of everything under it together (an account: its whole
    /// subtree; a QoS: all its users).
    #[serde(default)]
    pub grp_jobs_max: Option<u32>,
    /// `GrpSubmitJobs`: pending and running jobs under it together (an array counts its tasks).
    #[serde(default)]
    pub grp_submit_jobs_max: Option<u32>,
    /// `MaxTRESPerUser=gres/gpu=N,cpu=N,mem=M,node=K` (a QoS's): what one user's running jobs
    /// of it hold together.
    #[serde(default)]
    pub gpus_per_user_max: Option<u32>,
    #[serde(default)]
    pub cpus_per_user_max: Option<u32>,
    #[serde(default)]
    pub mem_mib_per_user_max: Option<u64>,
    #[serde(default)]
    pub nodes_per_user_max: Option<u32>,
    /// `GrpWall`: minutes of wall-clock time all jobs under it together may use, decayed as
    /// fair-share usage is ([`Usage::wall_ms`]): once used up its running jobs end TIMEOUT and
    /// the others wait (`AssocGrpWallLimit`, `QOSGrpWallLimit`). Not inherited: an account's
    /// covers every job under it, a user association's its own jobs.
    #[serde(default)]
    pub grp_wall_min: Option<u64>,
}

/// A change to [`Limits`]: `None` leaves a limit, `Some(None)` clears it (Slurm's `-1`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitChanges {
    pub max_jobs: Option<Option<u32>>,
    pub max_submit_jobs: Option<Option<u32>>,
    pub max_wall_min: Option<Option<u64>>,
    pub grp_gpus_max: Option<Option<u32>>,
    pub gpus_per_job_max: Option<Option<u32>>,
    pub grp_jobs_max: Option<Option<u32>>,
    pub grp_submit_jobs_max: Option<Option<u32>>,
    pub grp_cpus_max: Option<Option<u32>>,
    pub grp_mem_mib_max: Option<Option<u64>>,
    pub grp_nodes_max: Option<Option<u32>>,
    pub cpus_per_job_max: Option<Option<u32>>,
    pub mem_mib_per_job_max: Option<Option<u64>>,
    pub nodes_per_job_max: Option<Option<u32>>,
    pub gpus_per_user_max: Option<Option<u32>>,
    pub cpus_per_user_max: Option<Option<u32>>,
    pub mem_mib_per_user_max: Option<Option<u64>>,
    pub nodes_per_user_max: Option<Option<u32>>,
    pub grp_wall_min: Option<Option<u64>>,
}

impl LimitChanges {
    pub fn apply_to(&self, limits: &mut Limits) {
        if let Some(v) = self.max_jobs {
            limits.max_jobs = v;
        }
        if let Some(v) = self.max_submit_jobs {
            limits.max_submit_jobs = v;
        }
        if let Some(v) = self.max_wall_min {
            limits.max_wall_min = v;
        }
        if let Some(v) = self.grp_gpus_max {
            limits.grp_gpus_max = v;
        }
        if let Some(v) = self.gpus_per_job_max {
            limits.gpus_per_job_max = v;
        }
        if let Some(v) = self.grp_jobs_max {
            limits.grp_jobs_max = v;
        }
        if let Some(v) = self.grp_submit_jobs_max {
            limits.grp_submit_jobs_max = v;
        }
        if let Some(v) = self.grp_cpus_max {
            limits.grp_cpus_max = v;
        }
        if let Some(v) = self.grp_mem_mib_max {
            limits.grp_mem_mib_max = v;
        }
        if let Some(v) = self.grp_nodes_max {
            limits.grp_nodes_max = v;
        }
        if let Some(v) = self.cpus_per_job_max {
            limits.cpus_per_job_max = v;
        }
        if let Some(v) = self.mem_mib_per_job_max {
            limits.mem_mib_per_job_max = v;
        }
        if let Some(v) = self.nodes_per_job_max {
            limits.nodes_per_job_max = v;
        }
        if let Some(v) = self.gpus_per_user_max {
            limits.gpus_per_user_max = v;
        }
        if let Some(v) = self.cpus_per_user_max {
            limits.cpus_per_user_max = v;
        }
        if let Some(v) = self.mem_mib_per_user_max {
            limits.mem_mib_per_user_max = v;
        }
        if let Some(v) = self.nodes_per_user_max {
            limits.nodes_per_user_max = v;
        }
        if let Some(v) = self.grp_wall_min {
            limits.grp_wall_min = v;
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == LimitChanges::default()
    }
}

/// An account: its place in the tree and the limits of its association, which its users'
/// associations inherit where they set none (`grp_gpus_max` covers every job under it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub name: String,
    pub description: String,
    pub organization: String,
    /// `None` for root alone.
    pub parent: Option<String>,
    pub limits: Limits,
    /// QoS its users may use where their association names none (empty: the parent's).
    pub qos: Vec<String>,
    pub default_qos: Option<String>,
    /// `Fairshare=N`: its shares among its siblings under its parent account (`None`: 1, as
    /// Slurm's default).
    pub shares: Option<u32>,
}

/// A user's association with one account.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assoc {
    pub limits: Limits,
    /// QoS the user may use in this account (empty: the account's).
    pub qos: Vec<String>,
    pub default_qos: Option<String>,
    /// `Fairshare=N`: its shares among the users and accounts under its account (`None`: 1).
    pub shares: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub name: String,
    pub default_account: String,
    /// By account name.
    pub assocs: BTreeMap<String, Assoc>,
}

/// `Fairshare=N` at most (Slurm's shares are 32-bit; this keeps sums of siblings exact).
pub const SHARES_MAX: u32 = 1_000_000;

/// Decayed usage of one association (an account and a user), or of a QoS: what fair share
/// compares, and what `GrpWall` limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// GPU-milliseconds (a MIG slice weighted by its share of the GPU) decayed to `at_ms`.
    pub gpu_ms: u64,
    /// Wall-clock milliseconds of the jobs' runs (one per job, whatever its size), decayed to
    /// `at_ms` (Slurm's `grp_used_wall`).
    pub wall_ms: u64,
    /// When both were last decayed (the time of the command that added to them).
    pub at_ms: u64,
}

/// One line of `sshare`: an account, or a user's association with one. Ratios are in
/// millionths (`sshare` prints six decimals).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareLine {
    pub account: String,
    pub user: Option<String>,
    /// Levels below root.
    pub depth: u32,
    pub raw_shares: u32,
    pub norm_shares_ppm: u64,
    /// Decayed GPU-seconds (an account: everything under it).
    pub usage_gpu_s: u64,
    pub effective_usage_ppm: u64,
    /// `NormShares / EffectvUsage`; `u64::MAX`: infinite (no usage); `None` for root.
    pub level_fs_ppm: Option<u64>,
    /// Users only.
    pub fair_share_ppm: Option<u64>,
}

/// One pending job's priority and its factors (in millionths: age, fair share, job size,
/// partition, QoS) for `sprio`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorityLine {
    pub job: crate::JobId,
    pub user: String,
    pub partition: String,
    pub priority: u64,
    pub factors_ppm: [u64; 5],
    pub nice: i64,
}

/// A ratio in millionths, as `sshare` and `sprio` print them; infinity as `u64::MAX`.
pub fn ppm(ratio: f64) -> u64 {
    if ratio.is_infinite() && ratio > 0.0 {
        u64::MAX
    } else if ratio.is_finite() && ratio > 0.0 {
        (ratio * 1e6).round().min(u64::MAX as f64) as u64
    } else {
        0
    }
}

/// The database.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accounts {
    pub accounts: BTreeMap<String, Account>,
    pub users: BTreeMap<String, User>,
}

impl Default for Accounts {
    fn default() -> Self {
        let root = Account {
            name: ROOT_ACCOUNT.into(),
            description: "default root account".into(),
            organization: "root".into(),
            ..Default::default()
        };
        Accounts { accounts: BTreeMap::from([(ROOT_ACCOUNT.to_string(), root)]), users: BTreeMap::new() }
    }
}

/// What an association's changes set: limits, allowed QoS (`QOS=a,b`), `DefaultQOS`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssocChanges {
    pub limits: LimitChanges,
    pub qos: Option<Vec<String>>,
    /// `QOS+=a,b` and `QOS-=a,b`: added to and taken from the list in effect (the inherited
    /// one where the association has none of its own), after `qos`.
    pub qos_add: Vec<String>,
    pub qos_remove: Vec<String>,
    /// `Some(None)` clears it.
    pub default_qos: Option<Option<String>>,
    /// `Fairshare=N`; `Some(None)` (`Fairshare=-1`) sets it back to 1.
    pub shares: Option<Option<u32>>,
}

/// What `modify qos` sets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosChanges {
    pub limits: LimitChanges,
    pub priority: Option<u32>,
    /// `Description=`.
    pub description: Option<String>,
}

/// One change `sacctmgr` asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccountsEdit {
    AddAccount {
        name: String,
        description: Option<String>,
        organization: Option<String>,
        parent: Option<String>,
    },
    /// A user's association with `account`; creates the user (default account `account`
    /// unless `default_account`).
    AddUser {
        name: String,
        account: String,
        default_account: Option<String>,
    },
    AddQos {
        name: String,
        priority: Option<u32>,
    },
    ModifyAccount {
        name: String,
        changes: AssocChanges,
    },
    /// `modify account NAME set Description= Organization=`.
    DescribeAccount {
        name: String,
        description: Option<String>,
        organization: Option<String>,
    },
    /// Every association of the user (or the one with `account`), and its default account.
    ModifyUser {
        name: String,
        account: Option<String>,
        changes: AssocChanges,
        default_account: Option<String>,
    },
    ModifyQos {
        name: String,
        changes: QosChanges,
    },
    DeleteAccount {
        name: String,
    },
    /// The user (or only its association with `account`).
    DeleteUser {
        name: String,
        account: Option<String>,
    },
    DeleteQos {
        name: String,
    },
}

/// Who a question about live jobs is about, for refusing to delete what they use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder<'a> {
    Account(&'a str),
    User { name: &'a str, account: Option<&'a str> },
    Qos(&'a str),
}

/// Whether `name` may name an account, user or QoS: 1-64 printable bytes without spaces or the
/// characters sacctmgr's syntax uses (`,` `=` `|` quotes).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_graphic() && !matches!(b, b',' | b'=' | b'|' | b'\'' | b'"'))
}

fn check_name(kind: &str, name: &str) -> Result<(), String> {
    if valid_name(name) {
        Ok(())
    } else {
        Err(format!("Invalid {kind} name '{name}': 1-{NAME_BYTES_MAX} characters, none of space , = | or quotes"))
    }
}

fn check_shares(shares: Option<u32>) -> Result<Option<u32>, String> {
    match shares {
        Some(n) if n > SHARES_MAX => Err(format!("Fairshare={n}: at most {SHARES_MAX}")),
        other => Ok(other),
    }
}

fn check_text(kind: &str, text: &str) -> Result<(), String> {
    if text.len() <= TEXT_BYTES_MAX && !text.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(format!("{kind} is at most {TEXT_BYTES_MAX} bytes, without control characters"))
    }
}

impl Accounts {
    /// Whether submissions are checked: some user has an association.
    pub fn enforced(&self) -> bool {
        self.users.values().any(|u| !u.assocs.is_empty())
    }

    pub fn assoc(&self, user: &str, account: &str) -> Option<&Assoc> {
        self.users.get(user)?.assocs.get(account)
    }

    /// `account` and its ancestors up to root, nearest first (cut at [`ACCOUNTS_MAX`] links).
    pub fn lineage(&self, account: &str) -> Vec<&Account> {
        let mut out = Vec::new();
        let mut at = self.accounts.get(account);
        while let Some(a) = at {
            if out.len() >= ACCOUNTS_MAX {
                break;
            }
            out.push(a);
            at = a.parent.as_deref().and_then(|p| self.accounts.get(p));
        }
        out
    }

    /// The per-user limits that hold for `user` in `account`: the association's, else the
    /// nearest account's up the tree, limit by limit. The `grp_*` limits are the association's own
    /// (each account's covers its whole subtree: see [`Accounts::lineage`]).
    pub fn effective_limits(&self, user: &str, account: &str) -> Option<Limits> {
        let assoc = self.assoc(user, account)?;
        let mut limits = assoc.limits.clone();
        for a in self.lineage(account) {
            let l = &a.limits;
            limits.max_jobs = limits.max_jobs.or(l.max_jobs);
            limits.max_submit_jobs = limits.max_submit_jobs.or(l.max_submit_jobs);
            limits.max_wall_min = limits.max_wall_min.or(l.max_wall_min);
            limits.gpus_per_job_max = limits.gpus_per_job_max.or(l.gpus_per_job_max);
            limits.cpus_per_job_max = limits.cpus_per_job_max.or(l.cpus_per_job_max);
            limits.mem_mib_per_job_max = limits.mem_mib_per_job_max.or(l.mem_mib_per_job_max);
            limits.nodes_per_job_max = limits.nodes_per_job_max.or(l.nodes_per_job_max);
        }
        Some(limits)
    }

    /// QoS `user` may use in `account`: the association's list, else the nearest account's,
    /// else `normal` alone (Slurm's root association allows `normal`).
    pub fn allowed_qos(&self, user: &str, account: &str) -> Vec<String> {
        let own = self.assoc(user, account).map(|a| a.qos.clone()).filter(|q| !q.is_empty());
        own.unwrap_or_else(|| self.account_qos(account))
    }

    /// QoS the association of `account` allows: its list, else its nearest ancestor's, else
    /// `normal` alone.
    pub fn account_qos(&self, account: &str) -> Vec<String> {
        self.lineage(account)
            .into_iter()
            .map(|a| a.qos.clone())
            .find(|q| !q.is_empty())
            .unwrap_or_else(|| vec![crate::DEFAULT_QOS.to_string()])
    }

    /// The QoS a job of `user` in `account` without `--qos` gets, if one is set.
    pub fn default_qos(&self, user: &str, account: &str) -> Option<String> {
        let own = self.assoc(user, account).and_then(|a| a.default_qos.clone());
        own.or_else(|| self.lineage(account).into_iter().find_map(|a| a.default_qos.clone()))
    }

    /// The QoS a job of `user` in `account` without `--qos` runs under, as Slurm's
    /// `assoc_mgr_get_default_qos_info` picks it: the association's `DefaultQOS` (its own, else
    /// an account's up the tree), else the one QoS it allows when it allows one, else `normal`
    /// (`None`).
    pub fn job_qos(&self, user: &str, account: &str) -> Option<String> {
        self.default_qos(user, account).or_else(|| match self.allowed_qos(user, account).as_slice() {
            [only] if only != crate::DEFAULT_QOS => Some(only.clone()),
            _ => None,
        })
    }

    /// The account a job of `user` that names none is charged to.
    pub fn default_account(&self, user: &str) -> Option<&str> {
        self.users.get(user).map(|u| u.default_account.as_str())
    }

    /// Whether `user` may submit to `account` with `qos` (`None`: the default), in Slurm's
    /// words. Everything is allowed while the database is not [`Accounts::enforced`].
    pub fn submit_refusal(&self, user: &str, account: Option<&str>, qos: Option<&str>) -> Option<&'static str> {
        if !self.enforced() {
            return None;
        }
        let Some(account) = account.or_else(|| self.default_account(user)) else {
            return Some(INVALID_ACCOUNT);
        };
        if self.assoc(user, account).is_none() {
            return Some(INVALID_ACCOUNT);
        }
        let qos = qos.unwrap_or(crate::DEFAULT_QOS);
        if !self.allowed_qos(user, account).iter().any(|q| q == qos) {
            return Some(INVALID_QOS);
        }
        None
    }

    /// Associations over all users.
    pub fn assoc_count(&self) -> usize {
        self.users.values().map(|u| u.assocs.len()).sum()
    }

    /// Applies every edit of `edits` to the database and `policy` (QoS live in the policy), or
    /// none: `Err` says why in sacctmgr's words and leaves both as they were. `live_jobs` names
    /// the pending or running jobs a holder has (deleting what they use is refused).
    pub fn edit(
        &mut self,
        policy: &mut SchedulerPolicy,
        edits: &[AccountsEdit],
        live_jobs: impl Fn(Holder<'_>) -> Vec<crate::JobId>,
    ) -> Result<(), String> {
        if edits.is_empty() || edits.len() > EDITS_MAX {
            return Err(format!("1 to {EDITS_MAX} changes at once"));
        }
        let mut db = self.clone();
        let mut pol = policy.clone();
        for e in edits {
            db.edit_one(&mut pol, e, &live_jobs)?;
        }
        db.validate()?;
        pol.validate()?;
        *self = db;
        *policy = pol;
        Ok(())
    }

    fn edit_one(
        &mut self,
        policy: &mut SchedulerPolicy,
        edit: &AccountsEdit,
        live_jobs: &dyn Fn(Holder<'_>) -> Vec<crate::JobId>,
    ) -> Result<(), String> {
        match edit {
            AccountsEdit::AddAccount { name, description, organization, parent } => {
                self.add_account(name, description.as_deref(), organization.as_deref(), parent.as_deref())
            }
            AccountsEdit::AddUser { name, account, default_account } => self.add_user(name, account, default_account.as_deref()),
            AccountsEdit::AddQos { name, priority } => add_qos(policy, name, *priority),
            AccountsEdit::ModifyAccount { name, changes } => {
                let parent = self.accounts.get(name).and_then(|a| a.parent.clone());
                let inherited = parent.map_or_else(|| vec![crate::DEFAULT_QOS.to_string()], |p| self.account_qos(&p));
                let a = self.accounts.get_mut(name).ok_or_else(|| format!("Account '{name}' does not exist"))?;
                changes.limits.apply_to(&mut a.limits);
                if let Some(shares) = changes.shares {
                    a.shares = check_shares(shares)?;
                }
                apply_qos_changes(changes, &mut a.qos, &mut a.default_qos, &inherited, policy)
            }
            AccountsEdit::DescribeAccount { name, description, organization } => {
                let a = self.accounts.get_mut(name).ok_or_else(|| format!("Account '{name}' does not exist"))?;
                if let Some(d) = description {
                    check_text("Description", d)?;
                    a.description = d.clone();
                }
                if let Some(o) = organization {
                    check_text("Organization", o)?;
                    a.organization = o.clone();
                }
                Ok(())
            }
            AccountsEdit::ModifyUser { name, account, changes, default_account } => {
                self.modify_user(policy, name, account.as_deref(), changes, default_account.as_deref())
            }
            AccountsEdit::ModifyQos { name, changes } => modify_qos(policy, name, changes),
            AccountsEdit::DeleteAccount { name } => self.delete_account(name, live_jobs),
            AccountsEdit::DeleteUser { name, account } => self.delete_user(name, account.as_deref(), live_jobs),
            AccountsEdit::DeleteQos { name } => self.delete_qos(policy, name, live_jobs),
        }
    }

    fn add_account(
        &mut self,
        name: &str,
        description: Option<&str>,
        organization: Option<&str>,
        parent: Option<&str>,
    ) -> Result<(), String> {
        check_name("account", name)?;
        if self.accounts.contains_key(name) {
            return Err(format!("Account '{name}' already exists"));
        }
        let parent = parent.unwrap_or(ROOT_ACCOUNT);
        if !self.accounts.contains_key(parent) {
            return Err(format!("Parent account '{parent}' does not exist"));
        }
        // Slurm's defaults: the description is the name, the organization the parent's (root's
        // children: the name).
        let inherited = if parent == ROOT_ACCOUNT { name.to_string() } else { self.accounts[parent].organization.clone() };
        let account = Account {
            name: name.to_string(),
            description: description.unwrap_or(name).to_string(),
            organization: organization.map_or(inherited, str::to_string),
            parent: Some(parent.to_string()),
            ..Default::default()
        };
        check_text("Description", &account.description)?;
        check_text("Organization", &account.organization)?;
        self.accounts.insert(name.to_string(), account);
        Ok(())
    }

    fn add_user(&mut self, name: &str, account: &str, default_account: Option<&str>) -> Result<(), String> {
        check_name("user", name)?;
        if !self.accounts.contains_key(account) {
            return Err(format!("Account '{account}' does not exist"));
        }
        let user = self.users.entry(name.to_string()).or_insert_with(|| User {
            name: name.to_string(),
            default_account: account.to_string(),
            assocs: BTreeMap::new(),
        });
        if user.assocs.contains_key(account) && default_account.is_none() {
            return Err(format!("Nothing new added: user '{name}' is associated with account '{account}' already"));
        }
        user.assocs.entry(account.to_string()).or_default();
        if let Some(d) = default_account {
            user.default_account = d.to_string();
        }
        Ok(())
    }

    fn modify_user(
        &mut self,
        policy: &SchedulerPolicy,
        name: &str,
        account: Option<&str>,
        changes: &AssocChanges,
        default_account: Option<&str>,
    ) -> Result<(), String> {
        let accounts: Vec<String> = self.users.get(name).map(|u| u.assocs.keys().cloned().collect()).unwrap_or_default();
        let inherited: BTreeMap<String, Vec<String>> = accounts.into_iter().map(|a| (a.clone(), self.account_qos(&a))).collect();
        let user = self.users.get_mut(name).ok_or_else(|| format!("User '{name}' does not exist"))?;
        if let Some(a) = account {
            if !user.assocs.contains_key(a) {
                return Err(format!("User '{name}' has no association with account '{a}'"));
            }
        }
        for (acct, assoc) in user.assocs.iter_mut() {
            if account.is_some_and(|a| a != acct.as_str()) {
                continue;
            }
            changes.limits.apply_to(&mut assoc.limits);
            if let Some(shares) = changes.shares {
                assoc.shares = check_shares(shares)?;
            }
            let from = inherited.get(acct).map_or(&[][..], Vec::as_slice);
            apply_qos_changes(changes, &mut assoc.qos, &mut assoc.default_qos, from, policy)?;
        }
        if let Some(d) = default_account {
            user.default_account = d.to_string();
        }
        Ok(())
    }

    fn delete_account(&mut self, name: &str, live_jobs: &dyn Fn(Holder<'_>) -> Vec<crate::JobId>) -> Result<(), String> {
        if name == ROOT_ACCOUNT {
            return Err("The root account cannot be deleted".into());
        }
        if !self.accounts.contains_key(name) {
            return Err(format!("Account '{name}' does not exist"));
        }
        let children: Vec<&str> = self.accounts.values().filter(|a| a.parent.as_deref() == Some(name)).map(|a| a.name.as_str()).collect();
        if !children.is_empty() {
            return Err(format!("Account '{name}' has child accounts ({}): delete them first", children.join(",")));
        }
        let users: Vec<&str> = self.users.values().filter(|u| u.assocs.contains_key(name)).map(|u| u.name.as_str()).collect();
        if !users.is_empty() {
            return Err(format!("Account '{name}' has users ({}): delete their associations first", users.join(",")));
        }
        refuse_if_active(live_jobs(Holder::Account(name)))?;
        self.accounts.remove(name);
        Ok(())
    }

    fn delete_user(
        &mut self,
        name: &str,
        account: Option<&str>,
        live_jobs: &dyn Fn(Holder<'_>) -> Vec<crate::JobId>,
    ) -> Result<(), String> {
        let user = self.users.get(name).ok_or_else(|| format!("User '{name}' does not exist"))?;
        if let Some(a) = account {
            if !user.assocs.contains_key(a) {
                return Err(format!("User '{name}' has no association with account '{a}'"));
            }
            if user.default_account == a && user.assocs.len() > 1 {
                return Err(format!("Account '{a}' is the default account of user '{name}': set another DefaultAccount first"));
            }
        }
        refuse_if_active(live_jobs(Holder::User { name, account }))?;
        let user = self.users.get_mut(name).ok_or_else(|| format!("User '{name}' does not exist"))?;
        match account {
            Some(a) if user.assocs.len() > 1 => {
                user.assocs.remove(a);
            }
            _ => {
                self.users.remove(name);
            }
        }
        Ok(())
    }

    fn delete_qos(
        &mut self,
        policy: &mut SchedulerPolicy,
        name: &str,
        live_jobs: &dyn Fn(Holder<'_>) -> Vec<crate::JobId>,
    ) -> Result<(), String> {
        if name == crate::DEFAULT_QOS {
            return Err(format!("The '{}' QOS cannot be deleted", crate::DEFAULT_QOS));
        }
        let Some(at) = policy.qos.iter().position(|q| q.name == name) else {
            return Err(format!("QOS '{name}' does not exist"));
        };
        refuse_if_active(live_jobs(Holder::Qos(name)))?;
        policy.qos.remove(at);
        for q in policy.qos.iter_mut() {
            q.preempt.retain(|p| p != name);
        }
        // As Slurm does, the QoS leaves every association and account that allowed it.
        let forget = |qos: &mut Vec<String>, default: &mut Option<String>| {
            qos.retain(|q| q != name);
            if default.as_deref() == Some(name) {
                *default = None;
            }
        };
        for a in self.accounts.values_mut() {
            forget(&mut a.qos, &mut a.default_qos);
        }
        for assoc in self.users.values_mut().flat_map(|u| u.assocs.values_mut()) {
            forget(&mut assoc.qos, &mut assoc.default_qos);
        }
        Ok(())
    }

    /// Bounds, and that every name points at something that exists.
    fn validate(&self) -> Result<(), String> {
        if self.accounts.len() > ACCOUNTS_MAX {
            return Err(format!("at most {ACCOUNTS_MAX} accounts"));
        }
        if self.users.len() > USERS_MAX || self.assoc_count() > ASSOCS_MAX {
            return Err(format!("at most {USERS_MAX} users and {ASSOCS_MAX} associations"));
        }
        for u in self.users.values() {
            if !u.assocs.is_empty() && !u.assocs.contains_key(&u.default_account) {
                return Err(format!("User '{}' has no association with its default account '{}'", u.name, u.default_account));
            }
        }
        // The QoS an edit names are checked as it is applied (`apply_qos_changes`): a QoS that
        // a policy replacement dropped since must not block every later edit.
        let mut lists = self.accounts.values().map(|a| &a.qos).chain(self.users.values().flat_map(|u| u.assocs.values().map(|a| &a.qos)));
        if lists.any(|q| q.len() > QOS_PER_ASSOC_MAX) {
            return Err(format!("at most {QOS_PER_ASSOC_MAX} QOS per association"));
        }
        Ok(())
    }
}

fn refuse_if_active(jobs: Vec<crate::JobId>) -> Result<(), String> {
    if jobs.is_empty() {
        return Ok(());
    }
    let ids: Vec<String> = jobs.iter().take(16).map(|j| j.to_string()).collect();
    let more = if jobs.len() > 16 { ",..." } else { "" };
    Err(format!("Job(s) active, cancel job(s) before remove: {}{more}", ids.join(",")))
}

/// `changes`' QoS list, additions, removals and default on an association whose list is
/// `qos` (empty: `inherited` holds).
fn apply_qos_changes(
    changes: &AssocChanges,
    qos: &mut Vec<String>,
    default: &mut Option<String>,
    inherited: &[String],
    policy: &SchedulerPolicy,
) -> Result<(), String> {
    let exists = |q: &str| q == crate::DEFAULT_QOS || policy.qos.iter().any(|d| d.name == q);
    if let Some(q) = changes.qos.iter().flatten().chain(&changes.qos_add).find(|q| !exists(q)) {
        return Err(format!("Invalid qos '{q}'"));
    }
    if let Some(list) = &changes.qos {
        *qos = list.clone();
    }
    if !changes.qos_add.is_empty() || !changes.qos_remove.is_empty() {
        let mut list = if qos.is_empty() { inherited.to_vec() } else { qos.clone() };
        for q in &changes.qos_add {
            if !list.contains(q) {
                list.push(q.clone());
            }
        }
        list.retain(|q| !changes.qos_remove.contains(q));
        *qos = list;
    }
    if let Some(d) = &changes.default_qos {
        if let Some(q) = d.as_deref().filter(|q| !exists(q)) {
            return Err(format!("Invalid qos '{q}'"));
        }
        *default = d.clone();
    }
    // Slurm refuses a default QoS the association may not use.
    if let Some(d) = default.as_deref() {
        if !qos.is_empty() && !qos.iter().any(|q| q == d) {
            return Err(format!("Default QOS '{d}' is not in the association's QOS list"));
        }
    }
    Ok(())
}

fn add_qos(policy: &mut SchedulerPolicy, name: &str, priority: Option<u32>) -> Result<(), String> {
    check_name("qos", name)?;
    if name == crate::DEFAULT_QOS || policy.qos.iter().any(|q| q.name == name) {
        return Err(format!("QOS '{name}' already exists"));
    }
    policy.qos.push(QosDef {
        name: name.to_string(),
        priority: priority.unwrap_or(0),
        preempt: Vec::new(),
        preempt_mode: "requeue".into(),
        limits: Limits::default(),
        description: None,
    });
    Ok(())
}

fn modify_qos(policy: &mut SchedulerPolicy, name: &str, changes: &QosChanges) -> Result<(), String> {
    let at = match policy.qos.iter().position(|q| q.name == name) {
        Some(at) => at,
        // `normal` exists without a definition: changing it defines it.
        None if name == crate::DEFAULT_QOS => {
            policy.qos.push(QosDef { name: name.to_string(), preempt_mode: "requeue".into(), ..Default::default() });
            policy.qos.len() - 1
        }
        None => return Err(format!("QOS '{name}' does not exist")),
    };
    let q = &mut policy.qos[at];
    changes.limits.apply_to(&mut q.limits);
    if let Some(p) = changes.priority {
        q.priority = p;
    }
    if let Some(d) = &changes.description {
        check_text("Description", d)?;
        q.description = Some(d.clone());
    }
    Ok(())
}

#[cfg(test)]
#[path = "accounts_tests.rs"]
mod tests;
