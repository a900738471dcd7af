//! What `add`, `modify` and `delete` change, against the database as it is: the edits for the
//! log (an `add` with options is its add and a modify in one command, so all or nothing goes
//! in) and what Slurm 22.05's sacctmgr prints before it asks (`sacctmgr_add_account`,
//! `sacctmgr_add_user`, `sacctmgr_add_qos` and `sacctmgr_print_assoc_limits`/
//! `sacctmgr_print_qos_limits` in `src/sacctmgr/`): what exists already is left out, and an
//! `add` of nothing new is Slurm's ` Nothing new added.`. Names a change gives are checked
//! here in Slurm's words (unknown cluster, QoS, account), and again where the edit is applied.

use proto::accounts::{Accounts, AccountsEdit, LimitChanges, QosChanges};
use proto::SchedulerPolicy;

use super::super::SlurmError;
use super::options::{Entity, Filter, Settings};
use super::show::{mem_text, wall_text};

/// What a change does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Edits for the log, and what sacctmgr prints before it asks.
    Edits { edits: Vec<AccountsEdit>, summary: String },
    /// Nothing to do: what sacctmgr prints (its exit status is 0).
    Nothing(String),
}

/// The database a change is planned against.
pub struct Db<'a> {
    pub accounts: &'a Accounts,
    pub policy: &'a SchedulerPolicy,
    pub cluster: &'a str,
}

fn error(text: impl Into<String>) -> SlurmError {
    SlurmError { text: text.into(), code: 1 }
}

impl Db<'_> {
    fn qos_exists(&self, name: &str) -> bool {
        name == proto::DEFAULT_QOS || self.policy.qos.iter().any(|q| q.name == name)
    }

    /// Every QoS, as Slurm lists the valid ones.
    fn qos_names(&self) -> String {
        let normal = (!self.policy.qos.iter().any(|q| q.name == proto::DEFAULT_QOS)).then_some(proto::DEFAULT_QOS);
        normal.into_iter().chain(self.policy.qos.iter().map(|q| q.name.as_str())).collect::<Vec<_>>().join(",")
    }

    /// The clusters and QoS `s` names exist, in Slurm's words.
    fn check(&self, s: &Settings) -> Result<(), SlurmError> {
        if let Some(c) = s.clusters.iter().find(|c| !c.eq_ignore_ascii_case(self.cluster)) {
            return Err(error(format!(" This cluster '{c}' doesn't exist.\n        Contact your admin to add it to accounting.")));
        }
        let a = &s.assoc;
        if let Some(q) = a.qos.iter().flatten().chain(&a.qos_add).chain(&a.qos_remove).find(|q| !self.qos_exists(q)) {
            return Err(SlurmError::fatal(super::PROG, format!("You gave a bad qos '{q}'. Valid QOS's are {}", self.qos_names())));
        }
        if let Some(Some(d)) = &a.default_qos {
            if !self.qos_exists(d) {
                return Err(error(format!(" You gave a bad default qos '{d}'.  Use 'list qos' to get complete list.")));
            }
        }
        Ok(())
    }
}

/// `add ENTITY ...`.
pub fn add(db: &Db<'_>, entity: Entity, s: &Settings) -> Result<Plan, SlurmError> {
    if s.names.is_empty() {
        return Err(error(format!(" Need name of {} to add.", entity.word())));
    }
    db.check(s)?;
    match entity {
        Entity::Account => add_accounts(db, s),
        Entity::User => add_users(db, s),
        Entity::Qos => Ok(add_qos(db, s)),
        Entity::Assoc => Err(error(" Add associations with 'add user NAME Account=ACCOUNT'")),
    }
}

fn nothing_new() -> Plan {
    Plan::Nothing(" Nothing new added.\n".into())
}

fn add_accounts(db: &Db<'_>, s: &Settings) -> Result<Plan, SlurmError> {
    let parent = s.parent.as_deref().unwrap_or(proto::accounts::ROOT_ACCOUNT);
    if !db.accounts.accounts.contains_key(parent) {
        return Err(error(format!(
            " Parent account '{parent}' doesn't exist on cluster {}\n        Contact your admin to add this account.",
            db.cluster
        )));
    }
    let new: Vec<&String> = s.names.iter().filter(|n| !db.accounts.accounts.contains_key(*n)).collect();
    if new.is_empty() {
        return Ok(nothing_new());
    }
    let mut edits = Vec::new();
    let mut text = String::from(" Adding Account(s)\n");
    for name in &new {
        text.push_str(&format!("  {name}\n"));
        let (description, organization) = (s.description.clone(), s.organization.clone());
        edits.push(AccountsEdit::AddAccount { name: name.to_string(), description, organization, parent: s.parent.clone() });
        if s.assoc != Default::default() {
            edits.push(AccountsEdit::ModifyAccount { name: name.to_string(), changes: s.assoc.clone() });
        }
    }
    text.push_str(&format!(" Settings\n  Description     = {}\n", s.description.as_deref().unwrap_or("Account Name")));
    text.push_str(&format!("  Organization    = {}\n", s.organization.as_deref().unwrap_or("Parent/Account Name")));
    text.push_str(" Associations\n");
    for name in &new {
        text.push_str(&format!("  A = {:<10} C = {:<10}\n", cut(name, 10), cut(db.cluster, 10)));
    }
    if s.limit_set {
        text.push_str(" Settings\n");
        text.push_str(&assoc_limits(s, Some(parent)));
    }
    Ok(Plan::Edits { edits, summary: text })
}

fn add_users(db: &Db<'_>, s: &Settings) -> Result<Plan, SlurmError> {
    if s.accounts.is_empty() {
        return Err(error(" Need name of account to add user to."));
    }
    if let Some(a) = s.accounts.iter().find(|a| !db.accounts.accounts.contains_key(*a)) {
        return Err(error(format!(" This account '{a}' doesn't exist.\n        Contact your admin to add this account.")));
    }
    let (mut edits, mut users, mut assocs) = (Vec::new(), String::new(), String::new());
    for name in &s.names {
        let user = db.accounts.users.get(name);
        if user.is_none() {
            users.push_str(&format!("  {name}\n"));
        }
        for account in s.accounts.iter().filter(|a| user.is_none_or(|u| !u.assocs.contains_key(*a))) {
            let default_account = s.default_account.clone().filter(|d| d == account);
            edits.push(AccountsEdit::AddUser { name: name.clone(), account: account.clone(), default_account });
            if s.assoc != Default::default() {
                let changes = s.assoc.clone();
                edits.push(AccountsEdit::ModifyUser { name: name.clone(), account: Some(account.clone()), changes, default_account: None });
            }
            assocs.push_str(&format!("  U = {:<9} A = {:<10} C = {:<10}\n", cut(name, 9), cut(account, 10), cut(db.cluster, 10)));
        }
    }
    if edits.is_empty() {
        return Ok(nothing_new());
    }
    let mut text = String::new();
    if !users.is_empty() {
        text.push_str(&format!(" Adding User(s)\n{users}"));
        if let Some(d) = &s.default_account {
            text.push_str(&format!(" Settings =\n  Default Account = {d}\n"));
        }
    }
    text.push_str(&format!(" Associations =\n{assocs}"));
    if s.limit_set {
        text.push_str(" Non Default Settings\n");
        text.push_str(&assoc_limits(s, s.parent.as_deref()));
    }
    Ok(Plan::Edits { edits, summary: text })
}

fn add_qos(db: &Db<'_>, s: &Settings) -> Plan {
    let new: Vec<&String> = s.names.iter().filter(|n| !db.qos_exists(n)).collect();
    let Some(last) = new.last() else { return nothing_new() };
    let mut edits = Vec::new();
    let mut text = String::from(" Adding QOS(s)\n");
    for name in &new {
        text.push_str(&format!("  {name}\n"));
        edits.push(AccountsEdit::AddQos { name: name.to_string(), priority: s.priority });
        let changes = QosChanges { limits: s.assoc.limits.clone(), priority: None, description: s.description.clone() };
        if changes != QosChanges::default() {
            edits.push(AccountsEdit::ModifyQos { name: name.to_string(), changes });
        }
    }
    // Slurm prints the description of the last QoS it adds: the one given, else its name.
    text.push_str(&format!(" Settings\n  Description    = {}\n", s.description.as_deref().unwrap_or(last)));
    text.push_str(&qos_limits(s));
    Plan::Edits { edits, summary: text }
}

/// `modify ENTITY [where] NAMES set ...`.
pub fn modify(db: &Db<'_>, entity: Entity, filter: &Filter, s: &Settings) -> Result<Plan, SlurmError> {
    if filter.names.is_empty() {
        return Err(error(" You didn't give me anything to modify: name the account, user or QOS"));
    }
    if filter.accounts.len() > 1 {
        return Err(error(" Name one account at most"));
    }
    db.check(s)?;
    let mut edits = Vec::new();
    let mut text = format!(" Modified {}...\n", entity.word());
    for name in &filter.names {
        text.push_str(&format!("  {name}\n"));
        if entity == Entity::Account && (s.description.is_some() || s.organization.is_some()) {
            let (description, organization) = (s.description.clone(), s.organization.clone());
            edits.push(AccountsEdit::DescribeAccount { name: name.clone(), description, organization });
        }
        edits.push(match entity {
            Entity::Account => AccountsEdit::ModifyAccount { name: name.clone(), changes: s.assoc.clone() },
            Entity::User => AccountsEdit::ModifyUser {
                name: name.clone(),
                account: filter.accounts.first().cloned(),
                changes: s.assoc.clone(),
                default_account: s.default_account.clone(),
            },
            Entity::Qos => AccountsEdit::ModifyQos {
                name: name.clone(),
                changes: QosChanges { limits: s.assoc.limits.clone(), priority: s.priority, description: s.description.clone() },
            },
            Entity::Assoc => return Err(error(" Modify an association with 'modify user NAME where Account=ACCOUNT set ...'")),
        });
    }
    Ok(Plan::Edits { edits, summary: text })
}

/// `delete ENTITY [where] NAMES`.
pub fn delete(entity: Entity, filter: &Filter) -> Result<Plan, SlurmError> {
    if filter.names.is_empty() {
        return Err(error(format!(" No {} name given to delete", entity.word())));
    }
    let mut edits = Vec::new();
    let mut text = format!(" Deleting {}...\n", entity.word());
    for name in &filter.names {
        text.push_str(&format!("  {name}\n"));
        let name = name.clone();
        match entity {
            Entity::Account => edits.push(AccountsEdit::DeleteAccount { name }),
            Entity::Qos => edits.push(AccountsEdit::DeleteQos { name }),
            Entity::User if filter.accounts.is_empty() => edits.push(AccountsEdit::DeleteUser { name, account: None }),
            Entity::User => {
                edits.extend(filter.accounts.iter().map(|a| AccountsEdit::DeleteUser { name: name.clone(), account: Some(a.clone()) }))
            }
            Entity::Assoc => return Err(error(" Delete an association with 'delete user NAME where Account=ACCOUNT'")),
        }
    }
    Ok(Plan::Edits { edits, summary: text })
}

/// `text` cut to `width` characters, as `%-W.Ws` prints it.
fn cut(text: &str, width: usize) -> String {
    text.chars().take(width).collect()
}

/// A count or time limit as sacctmgr prints a change: the value, or `NONE` when cleared.
fn shown<T>(v: Option<T>, text: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "NONE".into(), text)
}

/// A TRES list of a change, in Slurm's TRES order (cpu, mem, node, gres/gpu), `NONE` where a
/// TRES is cleared; `None` when the change sets none.
fn tres(cpu: Option<Option<u32>>, mem: Option<Option<u64>>, node: Option<Option<u32>>, gpu: Option<Option<u32>>) -> Option<String> {
    let parts: Vec<String> = [
        cpu.map(|v| format!("cpu={}", shown(v, |n| n.to_string()))),
        mem.map(|v| format!("mem={}", shown(v, mem_text))),
        node.map(|v| format!("node={}", shown(v, |n| n.to_string()))),
        gpu.map(|v| format!("gres/gpu={}", shown(v, |n| n.to_string()))),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

fn grp_tres(l: &LimitChanges) -> Option<String> {
    tres(l.grp_cpus_max, l.grp_mem_mib_max, l.grp_nodes_max, l.grp_gpus_max)
}

fn max_tres(l: &LimitChanges) -> Option<String> {
    tres(l.cpus_per_job_max, l.mem_mib_per_job_max, l.nodes_per_job_max, l.gpus_per_job_max)
}

/// `sacctmgr_print_assoc_limits`: the settings given, in its order and labels (`parent` is the
/// parent account an added account gets, which Slurm fills in before it prints).
fn assoc_limits(s: &Settings, parent: Option<&str>) -> String {
    let l = &s.assoc.limits;
    let count = |v: Option<u32>| shown(v, |n| n.to_string());
    let wall = |v: Option<u64>| shown(v, wall_text);
    let lines = [
        s.assoc.shares.map(|v| format!("  Fairshare     = {}", count(v))),
        l.grp_jobs_max.map(|v| format!("  GrpJobs       = {}", count(v))),
        l.grp_submit_jobs_max.map(|v| format!("  GrpSubmitJobs = {}", count(v))),
        grp_tres(l).map(|t| format!("  GrpTRES       = {t}")),
        l.grp_wall_min.map(|v| format!("  GrpWall       = {}", wall(v))),
        l.max_jobs.map(|v| format!("  MaxJobs       = {}", count(v))),
        l.max_submit_jobs.map(|v| format!("  MaxSubmitJobs = {}", count(v))),
        max_tres(l).map(|t| format!("  MaxTRES       = {t}")),
        l.max_wall_min.map(|v| format!("  MaxWall       = {}", wall(v))),
        parent.map(|p| format!("  Parent        = {p}")),
        // Sorted by name, as Slurm's `slurm_char_list_to_xstr` prints a list.
        s.qos_text.as_ref().map(|q| {
            let mut names = q.clone();
            names.sort();
            format!("  QOS           = {}", names.join(","))
        }),
        // A cleared default is Slurm's id -1, which it prints as no name.
        s.assoc.default_qos.as_ref().map(|d| format!("  DefQOS        = {}", d.as_deref().unwrap_or("(null)"))),
    ];
    lines.into_iter().flatten().map(|l| l + "\n").collect()
}

/// `sacctmgr_print_qos_limits`: the limits given, in its order and labels.
fn qos_limits(s: &Settings) -> String {
    let l = &s.assoc.limits;
    let count = |v: Option<u32>| shown(v, |n| n.to_string());
    let wall = |v: Option<u64>| shown(v, wall_text);
    let lines = [
        l.grp_jobs_max.map(|v| format!("  GrpJobs                  = {}", count(v))),
        l.grp_submit_jobs_max.map(|v| format!("  GrpSubmitJobs            = {}", count(v))),
        grp_tres(l).map(|t| format!("  GrpTRES                  = {t}")),
        l.grp_wall_min.map(|v| format!("  GrpWall                  = {}", wall(v))),
        l.max_jobs.map(|v| format!("  MaxJobsPerUser = {}", count(v))),
        l.max_submit_jobs.map(|v| format!("  MaxSubmitJobsPerUser     = {}", count(v))),
        max_tres(l).map(|t| format!("  MaxTRESPerJob            = {t}")),
        tres(l.cpus_per_user_max, l.mem_mib_per_user_max, l.nodes_per_user_max, l.gpus_per_user_max)
            .map(|t| format!("  MaxTRESPerUser           = {t}")),
        l.max_wall_min.map(|v| format!("  MaxWall                  = {}", wall(v))),
        s.priority.map(|p| format!("  Priority                 = {p}")),
    ];
    lines.into_iter().flatten().map(|l| l + "\n").collect()
}
