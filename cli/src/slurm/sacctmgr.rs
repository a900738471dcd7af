//! `sacctmgr`: accounts, users, QoS and associations with their limits, kept in the
//! replicated state (`proto::accounts`). `add|create account|user|qos`, `modify|update
//! account|user|qos [where] NAME.. set KEY=VALUE..` (Slurm's `-1` clears a limit), `delete|remove
//! account|user|qos NAME`, `show|list account|user|qos|association [where ...] [format=...]`,
//! with `-i` (no question asked), `-n` (no header), `-p`/`-P` (`|`-separated with or without a
//! closing `|`). Without `-i` a change is committed only when `y` answers Slurm's question.
//!
//! The columns, headers and widths follow Slurm 22.05.8's sacctmgr source (`src/sacctmgr/
//! common.c`, `association_functions.c`, `user_functions.c`, `qos_functions.c`) and its
//! `print_fields` rules (right-aligned to the width, `+` marking a cut value): the Slurm peer in
//! `shared/peers/slurm` has no slurmdbd, so its sacctmgr cannot run to compare outputs.

use std::io::{BufRead, Write};
use std::time::Duration;

use proto::accounts::{Account, Accounts, AccountsEdit, AssocChanges, LimitChanges, QosChanges};
use proto::{ApiError, Limits, QosDef, Reply, Request, SchedulerPolicy};

use super::SlurmError;

pub const PROG: &str = "sacctmgr";

/// How long Slurm waits for the answer to "Would you like to commit changes?".
const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// `-p` ends every field with `|`; `-P` all but the last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Parsable {
    #[default]
    No,
    Ending,
    NoEnding,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub immediate: bool,
    pub header: bool,
    pub parsable: Parsable,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entity {
    Account,
    User,
    Qos,
    Assoc,
}

impl Entity {
    fn parse(word: &str) -> Option<Entity> {
        match word.to_ascii_lowercase().as_str() {
            "account" | "accounts" | "acct" => Some(Entity::Account),
            "user" | "users" => Some(Entity::User),
            "qos" => Some(Entity::Qos),
            "association" | "associations" | "assoc" | "assocs" => Some(Entity::Assoc),
            _ => None,
        }
    }
}

/// Which records `show` prints (empty: all).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub names: Vec<String>,
    pub accounts: Vec<String>,
    pub users: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Edits for the log, and what sacctmgr says it is about to do.
    Edit {
        edits: Vec<AccountsEdit>,
        summary: String,
    },
    Show {
        entity: Entity,
        filter: Filter,
        format: Vec<Column>,
    },
}

fn error(text: impl Into<String>) -> SlurmError {
    SlurmError { text: text.into(), code: 1 }
}

fn unknown_option(key: &str) -> SlurmError {
    error(format!(" Unknown option: {key}\n Use keyword 'where' to modify condition"))
}

/// The options and the command.
pub fn parse(args: &[String]) -> Result<(Options, Action), SlurmError> {
    let mut opts = Options { immediate: false, header: true, parsable: Parsable::No };
    let mut words: Vec<&str> = Vec::new();
    for a in args {
        match a.as_str() {
            "--immediate" => opts.immediate = true,
            "--noheader" => opts.header = false,
            "--parsable" => opts.parsable = Parsable::Ending,
            "--parsable2" => opts.parsable = Parsable::NoEnding,
            // getopt's order: options anywhere (no value of sacctmgr's starts with '-').
            flags if flags.starts_with('-') && flags.len() > 1 && !flags.starts_with("--") => {
                for c in flags[1..].chars() {
                    match c {
                        'i' => opts.immediate = true,
                        'n' => opts.header = false,
                        'p' => opts.parsable = Parsable::Ending,
                        'P' => opts.parsable = Parsable::NoEnding,
                        'Q' => {}
                        other => return Err(SlurmError::getopt(PROG, format!("invalid option -- '{other}'"))),
                    }
                }
            }
            flag if flag.starts_with("--") => return Err(SlurmError::getopt(PROG, format!("unrecognized option '{flag}'"))),
            word => words.push(word),
        }
    }
    let [verb, entity, rest @ ..] = words.as_slice() else {
        return Err(error(" sacctmgr needs a command and an entity: add|modify|delete|show account|user|qos|association"));
    };
    let entity = Entity::parse(entity).ok_or_else(|| error(format!(" Unknown entity: {entity}")))?;
    let action = match verb.to_ascii_lowercase().as_str() {
        "add" | "create" => parse_add(entity, rest)?,
        "modify" | "update" => parse_modify(entity, rest)?,
        "delete" | "remove" => parse_delete(entity, rest)?,
        "show" | "list" => parse_show(entity, rest)?,
        other => return Err(error(format!(" Unknown command: {other}"))),
    };
    Ok((opts, action))
}

/// `KEY=VALUE` split, the key lowercased; a bare word has no value.
fn key_value(word: &str) -> (String, Option<&str>) {
    match word.split_once('=') {
        Some((k, v)) => (k.to_ascii_lowercase(), Some(v)),
        None => (word.to_ascii_lowercase(), None),
    }
}

fn list(value: &str) -> Vec<String> {
    value.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()
}

fn parse_add(entity: Entity, words: &[&str]) -> Result<Action, SlurmError> {
    let mut names = Vec::new();
    let (mut description, mut organization, mut parent, mut accounts, mut default_account, mut priority) =
        (None, None, None, Vec::new(), None, None);
    let mut fairshare = None;
    for w in words {
        match key_value(w) {
            (_, None) => names.extend(list(w)),
            (k, Some(v)) => match (entity, k.as_str()) {
                (_, "name" | "names") => names.extend(list(v)),
                (Entity::Account, "description") => description = Some(v.to_string()),
                (Entity::Account, "organization") => organization = Some(v.to_string()),
                (Entity::Account, "parent") => parent = Some(v.to_string()),
                (Entity::User, "account" | "accounts") => accounts.extend(list(v)),
                (Entity::User, "defaultaccount") => default_account = Some(v.to_string()),
                (Entity::Qos, "priority") => priority = Some(number(&k, v)?),
                (Entity::Account | Entity::User, "fairshare" | "shares") => fairshare = Some(shares(v)?),
                _ => return Err(unknown_option(w)),
            },
        }
    }
    if names.is_empty() {
        return Err(error(format!(" Need name of {} to add.", entity_word(entity))));
    }
    let mut summary = String::new();
    let mut edits = Vec::new();
    match entity {
        Entity::Account => {
            summary.push_str(" Adding Account(s)\n");
            for n in &names {
                summary.push_str(&format!("  {n}\n"));
                let (description, organization, parent) = (description.clone(), organization.clone(), parent.clone());
                edits.push(AccountsEdit::AddAccount { name: n.clone(), description, organization, parent });
                if let Some(shares) = fairshare {
                    let changes = AssocChanges { shares: Some(shares), ..Default::default() };
                    edits.push(AccountsEdit::ModifyAccount { name: n.clone(), changes });
                }
            }
            summary.push_str(&format!(" Settings\n  Description     = {}\n", description.as_deref().unwrap_or("Account Name")));
            summary.push_str(&format!("  Organization    = {}\n", organization.as_deref().unwrap_or("Parent/Account Name")));
        }
        Entity::User => {
            if accounts.is_empty() {
                accounts.extend(default_account.clone());
            }
            if accounts.is_empty() {
                return Err(error(" Need name of account to add user to."));
            }
            summary.push_str(" Adding User(s)\n");
            for n in &names {
                summary.push_str(&format!("  {n}\n"));
                for (i, a) in accounts.iter().enumerate() {
                    let default = if i == 0 { default_account.clone() } else { None };
                    edits.push(AccountsEdit::AddUser { name: n.clone(), account: a.clone(), default_account: default });
                    if let Some(shares) = fairshare {
                        let changes = AssocChanges { shares: Some(shares), ..Default::default() };
                        edits.push(AccountsEdit::ModifyUser { name: n.clone(), account: Some(a.clone()), changes, default_account: None });
                    }
                }
            }
            summary.push_str(" Associations =\n");
            for n in &names {
                for a in &accounts {
                    summary.push_str(&format!("  U = {n:<9} A = {a:<10}\n"));
                }
            }
        }
        Entity::Qos => {
            summary.push_str(" Adding QOS(s)\n");
            for n in &names {
                summary.push_str(&format!("  {n}\n"));
                edits.push(AccountsEdit::AddQos { name: n.clone(), priority });
            }
        }
        Entity::Assoc => return Err(error(" Add associations with 'add user NAME Account=ACCOUNT'")),
    }
    Ok(Action::Edit { edits, summary })
}

fn entity_word(entity: Entity) -> &'static str {
    match entity {
        Entity::Account => "account",
        Entity::User => "user",
        Entity::Qos => "qos",
        Entity::Assoc => "association",
    }
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, SlurmError> {
    value.parse().map_err(|_| error(format!(" Bad {key} value: {value}")))
}

/// A count limit: a number, or `-1` to clear it.
fn count_limit(key: &str, value: &str) -> Result<Option<u32>, SlurmError> {
    if value == "-1" {
        return Ok(None);
    }
    number(key, value).map(Some)
}

/// `Fairshare=N`; `-1` sets it back to Slurm's default of 1. `parent` is refused: Corral has no
/// shares inherited from the parent.
fn shares(value: &str) -> Result<Option<u32>, SlurmError> {
    if value == "-1" {
        return Ok(None);
    }
    match value.parse::<u32>() {
        Ok(n) if n <= proto::accounts::SHARES_MAX => Ok(Some(n)),
        _ => Err(error(format!(
            " Invalid Fairshare '{value}': Corral takes a number of shares from 0 to {} or -1 (\"parent\" is not supported)",
            proto::accounts::SHARES_MAX
        ))),
    }
}

/// `MaxWall=`: Slurm's time formats (minutes by default), `-1` or `UNLIMITED` to clear.
fn wall_limit(value: &str) -> Result<Option<u64>, SlurmError> {
    match super::time::parse_limit_s(value) {
        Ok(s) => Ok(s.map(|s| s.div_ceil(60))),
        Err(_) => Err(error(format!(" Bad MaxWall time format: {value}"))),
    }
}

/// `GrpTRES=`/`MaxTRESPerJob=`: a comma list of `cpu=N`, `mem=SIZE` (MiB when bare, or with
/// K, M, G, T), `node=N` and `gres/gpu=N`, each `-1` to clear; other TRES are refused.
fn tres_limits(key: &str, value: &str, grp: bool, limits: &mut LimitChanges) -> Result<(), SlurmError> {
    let mut any = false;
    for tres in value.split(',').filter(|t| !t.is_empty()) {
        let Some((name, n)) = tres.split_once('=') else {
            return Err(error(format!(" Bad {key} value: {value}")));
        };
        let count = || count_limit(key, n);
        match (name.to_ascii_lowercase().as_str(), grp) {
            ("gres/gpu", true) => limits.grp_gpus_max = Some(count()?),
            ("gres/gpu", false) => limits.gpus_per_job_max = Some(count()?),
            ("cpu", true) => limits.grp_cpus_max = Some(count()?),
            ("cpu", false) => limits.cpus_per_job_max = Some(count()?),
            ("node", true) => limits.grp_nodes_max = Some(count()?),
            ("node", false) => limits.nodes_per_job_max = Some(count()?),
            ("mem", _) => {
                let mib = if n == "-1" {
                    None
                } else {
                    Some(crate::units::parse_mem_mib(n).map_err(|e| error(format!(" Bad {key} value: {e}")))?)
                };
                if grp {
                    limits.grp_mem_mib_max = Some(mib);
                } else {
                    limits.mem_mib_per_job_max = Some(mib);
                }
            }
            _ => {
                return Err(error(format!(
                    " Corral limits cpu, mem, node and gres/gpu: {key}=cpu=N,mem=SIZE,node=N,gres/gpu=N (-1 clears one), not '{tres}'"
                )))
            }
        }
        any = true;
    }
    if any {
        Ok(())
    } else {
        Err(error(format!(" Bad {key} value: {value}")))
    }
}

/// What `set` changes: limits, QoS, and for users the default account, for QoS the priority.
#[derive(Default)]
struct Set {
    assoc: AssocChanges,
    default_account: Option<String>,
    priority: Option<u32>,
    description: Option<String>,
    organization: Option<String>,
}

fn parse_set(entity: Entity, words: &[&str]) -> Result<Set, SlurmError> {
    let mut set = Set::default();
    for w in words {
        let (k, Some(v)) = key_value(w) else { return Err(unknown_option(w)) };
        let qos = entity == Entity::Qos;
        match k.as_str() {
            "maxjobs" | "maxjobsperuser" | "maxjobspu" if qos || k == "maxjobs" => set.assoc.limits.max_jobs = Some(count_limit(&k, v)?),
            "maxsubmitjobs" | "maxsubmit" | "maxsubmitjobsperuser" | "maxsubmitpu" if qos || !k.ends_with("pu") && !k.ends_with("user") => {
                set.assoc.limits.max_submit_jobs = Some(count_limit(&k, v)?)
            }
            "maxwall" | "maxwalldurationperjob" => set.assoc.limits.max_wall_min = Some(wall_limit(v)?),
            "grptres" => tres_limits("GrpTRES", v, true, &mut set.assoc.limits)?,
            "grpjobs" => set.assoc.limits.grp_jobs_max = Some(count_limit(&k, v)?),
            "grpsubmitjobs" | "grpsubmit" => set.assoc.limits.grp_submit_jobs_max = Some(count_limit(&k, v)?),
            "maxtresperjob" | "maxtres" => tres_limits("MaxTRESPerJob", v, false, &mut set.assoc.limits)?,
            "qos" | "qoslevel" if !qos => set.assoc.qos = Some(list(v)),
            "qos+" | "qoslevel+" if !qos => set.assoc.qos_add.extend(list(v)),
            "qos-" | "qoslevel-" if !qos => set.assoc.qos_remove.extend(list(v)),
            "defaultqos" if !qos => set.assoc.default_qos = Some(if v.is_empty() || v == "-1" { None } else { Some(v.to_string()) }),
            "defaultaccount" if entity == Entity::User => set.default_account = Some(v.to_string()),
            "fairshare" | "shares" if !qos => set.assoc.shares = Some(shares(v)?),
            "priority" if qos => set.priority = Some(number(&k, v)?),
            "description" if entity == Entity::Account => set.description = Some(v.to_string()),
            "organization" if entity == Entity::Account => set.organization = Some(v.to_string()),
            _ => return Err(error(format!(" Unknown option: {w}\n Corral's sacctmgr sets MaxJobs, MaxSubmitJobs, MaxWall, GrpJobs, GrpSubmitJobs, GrpTRES and MaxTRESPerJob (cpu, mem, node, gres/gpu), QOS (=, += or -=), DefaultQOS, DefaultAccount (users), Fairshare, Description and Organization (accounts), Priority (QOS)"))),
        }
    }
    Ok(set)
}

/// `where` conditions: names (bare, `Name=`, `User=` for users) and `Account=` (users).
fn parse_where(entity: Entity, words: &[&str]) -> Result<Filter, SlurmError> {
    let mut f = Filter::default();
    for w in words.iter().filter(|w| !w.eq_ignore_ascii_case("where")) {
        match key_value(w) {
            (_, None) => f.names.extend(list(w)),
            (k, Some(v)) => match k.as_str() {
                "name" | "names" => f.names.extend(list(v)),
                "user" | "users" if entity == Entity::User => f.names.extend(list(v)),
                "user" | "users" => f.users.extend(list(v)),
                "account" | "accounts" | "acct" if entity == Entity::Account => f.names.extend(list(v)),
                "account" | "accounts" | "acct" => f.accounts.extend(list(v)),
                "cluster" | "clusters" => {}
                _ => return Err(error(format!(" Unknown condition: {w}"))),
            },
        }
    }
    Ok(f)
}

fn parse_modify(entity: Entity, words: &[&str]) -> Result<Action, SlurmError> {
    let at = words.iter().position(|w| w.eq_ignore_ascii_case("set")).ok_or_else(|| error(" You didn't give me anything to set"))?;
    let filter = parse_where(entity, &words[..at])?;
    let set = parse_set(entity, &words[at + 1..])?;
    if filter.names.is_empty() {
        return Err(error(" You didn't give me anything to modify: name the account, user or QOS"));
    }
    if filter.accounts.len() > 1 {
        return Err(error(" Name one account at most"));
    }
    let mut edits = Vec::new();
    let mut summary = format!(" Modified {}...\n", entity_word(entity));
    for name in &filter.names {
        summary.push_str(&format!("  {name}\n"));
        if set.description.is_some() || set.organization.is_some() {
            let (description, organization) = (set.description.clone(), set.organization.clone());
            edits.push(AccountsEdit::DescribeAccount { name: name.clone(), description, organization });
        }
        edits.push(match entity {
            Entity::Account => AccountsEdit::ModifyAccount { name: name.clone(), changes: set.assoc.clone() },
            Entity::User => AccountsEdit::ModifyUser {
                name: name.clone(),
                account: filter.accounts.first().cloned(),
                changes: set.assoc.clone(),
                default_account: set.default_account.clone(),
            },
            Entity::Qos => AccountsEdit::ModifyQos {
                name: name.clone(),
                changes: QosChanges { limits: set.assoc.limits.clone(), priority: set.priority },
            },
            Entity::Assoc => return Err(error(" Modify an association with 'modify user NAME where Account=ACCOUNT set ...'")),
        });
    }
    Ok(Action::Edit { edits, summary })
}

fn parse_delete(entity: Entity, words: &[&str]) -> Result<Action, SlurmError> {
    let filter = parse_where(entity, words)?;
    if filter.names.is_empty() {
        return Err(error(format!(" No {} name given to delete", entity_word(entity))));
    }
    let mut edits = Vec::new();
    let mut summary = format!(" Deleting {}...\n", entity_word(entity));
    for name in &filter.names {
        summary.push_str(&format!("  {name}\n"));
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
    Ok(Action::Edit { edits, summary })
}

fn parse_show(entity: Entity, words: &[&str]) -> Result<Action, SlurmError> {
    let mut format = Vec::new();
    let mut conditions = Vec::new();
    for w in words {
        match key_value(w) {
            (k, Some(v)) if k == "format" => {
                for f in v.split(',').filter(|f| !f.is_empty()) {
                    format.push(Column::parse(f).ok_or_else(|| error(format!("Invalid field requested: \"{f}\"")))?);
                }
            }
            _ => conditions.push(*w),
        }
    }
    let filter = parse_where(entity, &conditions)?;
    if format.is_empty() {
        format = default_format(entity);
    }
    Ok(Action::Show { entity, filter, format })
}

// ---------------------------------------------------------------------------------------------
// Columns

/// What a column shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Account,
    AdminLevel,
    Cluster,
    DefaultAccount,
    DefaultQos,
    Description,
    Flags,
    GraceTime,
    GrpJobs,
    GrpSubmit,
    GrpTres,
    GrpTresMins,
    GrpTresRunMins,
    GrpWall,
    MaxJobs,
    MaxJobsPa,
    MaxJobsPu,
    MaxSubmit,
    MaxSubmitPa,
    MaxSubmitPu,
    MaxTres,
    MaxTresMins,
    MaxTresPa,
    MaxTresPerNode,
    MaxTresPu,
    MaxWall,
    MinTres,
    Name,
    Organization,
    ParentName,
    Partition,
    Preempt,
    PreemptExemptTime,
    PreemptMode,
    Priority,
    Qos,
    Share,
    UsageFactor,
    UsageThreshold,
    User,
}

/// A column: what, its header and its width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Column {
    pub field: Field,
    pub header: &'static str,
    pub width: usize,
}

/// Slurm's fields as `_get_print_field` (common.c) matches them, in its order: (name, least
/// prefix, field, header, width). Aliases follow their field.
const FIELDS: &[(&str, usize, Field, &str, usize)] = &[
    ("account", 3, Field::Account, "Account", 10),
    ("acct", 4, Field::Account, "Account", 10),
    ("adminlevel", 2, Field::AdminLevel, "Admin", 9),
    ("clusters", 2, Field::Cluster, "Cluster", 10),
    ("defaultaccount", 8, Field::DefaultAccount, "Def Acct", 10),
    ("defaultqos", 8, Field::DefaultQos, "Def QOS", 9),
    ("description", 3, Field::Description, "Descr", 20),
    ("flags", 2, Field::Flags, "Flags", 20),
    ("gracetime", 3, Field::GraceTime, "GraceTime", 10),
    ("grptres", 7, Field::GrpTres, "GrpTRES", 13),
    ("grptresmins", 8, Field::GrpTresMins, "GrpTRESMins", 13),
    ("grptresrunmins", 8, Field::GrpTresRunMins, "GrpTRESRunMins", 13),
    ("grpjobs", 4, Field::GrpJobs, "GrpJobs", 7),
    ("grpsubmitjobs", 4, Field::GrpSubmit, "GrpSubmit", 9),
    ("grpwall", 4, Field::GrpWall, "GrpWall", 11),
    ("maxtresperjob", 7, Field::MaxTres, "MaxTRES", 13),
    ("maxtrespernode", 11, Field::MaxTresPerNode, "MaxTRESPerNode", 14),
    ("maxtresminsperjob", 8, Field::MaxTresMins, "MaxTRESMins", 13),
    ("maxtrespa", 9, Field::MaxTresPa, "MaxTRESPA", 13),
    ("maxtresperaccount", 11, Field::MaxTresPa, "MaxTRESPA", 13),
    ("maxtresperacct", 11, Field::MaxTresPa, "MaxTRESPA", 13),
    ("maxtrespu", 9, Field::MaxTresPu, "MaxTRESPU", 13),
    ("maxtresperuser", 11, Field::MaxTresPu, "MaxTRESPU", 13),
    ("maxtres", 7, Field::MaxTres, "MaxTRES", 13),
    ("maxjobspa", 9, Field::MaxJobsPa, "MaxJobsPA", 9),
    ("maxjobsperaccount", 11, Field::MaxJobsPa, "MaxJobsPA", 9),
    ("maxjobsperacct", 11, Field::MaxJobsPa, "MaxJobsPA", 9),
    ("maxjobspu", 9, Field::MaxJobsPu, "MaxJobsPU", 9),
    ("maxjobsperuser", 11, Field::MaxJobsPu, "MaxJobsPU", 9),
    ("maxjobs", 4, Field::MaxJobs, "MaxJobs", 7),
    ("maxsubmitpa", 11, Field::MaxSubmitPa, "MaxSubmitPA", 11),
    ("maxsubmitjobsperaccount", 17, Field::MaxSubmitPa, "MaxSubmitPA", 11),
    ("maxsubmitjobsperacct", 17, Field::MaxSubmitPa, "MaxSubmitPA", 11),
    ("maxsubmitpu", 11, Field::MaxSubmitPu, "MaxSubmitPU", 11),
    ("maxsubmitjobsperuser", 17, Field::MaxSubmitPu, "MaxSubmitPU", 11),
    ("maxsubmitjobs", 4, Field::MaxSubmit, "MaxSubmit", 9),
    ("maxwalldurationperjob", 4, Field::MaxWall, "MaxWall", 11),
    ("mintresperjob", 7, Field::MinTres, "MinTRES", 13),
    ("name", 2, Field::Name, "Name", 10),
    ("organization", 1, Field::Organization, "Org", 20),
    ("parentname", 7, Field::ParentName, "ParentName", 10),
    ("partition", 4, Field::Partition, "Partition", 10),
    ("preemptmode", 8, Field::PreemptMode, "PreemptMode", 11),
    ("preemptexempttime", 8, Field::PreemptExemptTime, "PreemptExemptTime", 19),
    ("preempt", 7, Field::Preempt, "Preempt", 10),
    ("priority", 3, Field::Priority, "Priority", 10),
    ("qoslevel", 3, Field::Qos, "QOS", 20),
    ("share", 1, Field::Share, "Share", 9),
    ("fairshare", 2, Field::Share, "Share", 9),
    ("usagefactor", 6, Field::UsageFactor, "UsageFactor", 11),
    ("usagethreshold", 6, Field::UsageThreshold, "UsageThres", 10),
    ("user", 1, Field::User, "User", 10),
];

impl Column {
    /// `NAME[%WIDTH]` as Slurm matches it: the first field `NAME` is a prefix of, at least as
    /// long as that field's least prefix.
    pub fn parse(text: &str) -> Option<Column> {
        let (name, width) = match text.split_once('%') {
            Some((n, w)) => (n, Some(w.parse::<usize>().ok()?)),
            None => (text, None),
        };
        let lower = name.to_ascii_lowercase();
        let &(_, _, field, header, default_width) =
            FIELDS.iter().find(|(full, least, ..)| lower.len() >= *least && full.starts_with(lower.as_str()))?;
        Some(Column { field, header, width: width.unwrap_or(default_width).clamp(1, 1024) })
    }
}

fn columns(names: &str) -> Vec<Column> {
    names.split(',').filter_map(Column::parse).collect()
}

/// Slurm 22.05's default columns of `show ENTITY`.
pub fn default_format(entity: Entity) -> Vec<Column> {
    match entity {
        Entity::Account => columns("Acc,Des,O"),
        Entity::User => columns("U,DefaultA,Ad"),
        Entity::Qos => columns(
            "Name,Prio,GraceT,Preempt,PreemptE,PreemptM,Flags%40,UsageThres,UsageFactor,GrpTRES,GrpTRESMins,GrpTRESRunMins,\
             GrpJ,GrpS,GrpW,MaxTRES,MaxTRESPerN,MaxTRESMins,MaxW,MaxTRESPerUser,MaxJobsPerUser,MaxSubmitJobsPerUser,\
             MaxTRESPerAcct,MaxJobsPerAcct,MaxSubmitJobsPerAcct,MinTRES",
        ),
        Entity::Assoc => columns(
            "Cluster,Account,User,Part,Share,Priority,GrpJ,GrpTRES,GrpS,GrpWall,GrpTRESMins,MaxJ,MaxTRES,MaxTRESPerN,MaxS,MaxW,\
             MaxTRESMins,QOS,DefaultQOS,GrpTRESRunMins",
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Rows

/// One line of `show`.
enum Row<'a> {
    Account(&'a Account),
    User(&'a proto::accounts::User),
    Qos(&'a QosDef),
    /// An account's association (`user` none) or a user's with that account.
    Assoc {
        account: &'a Account,
        user: Option<&'a str>,
    },
}

/// What `show` needs besides the rows.
pub struct Tables<'a> {
    pub accounts: &'a Accounts,
    pub policy: &'a SchedulerPolicy,
    pub cluster: &'a str,
}

/// A TRES list as sacctmgr prints it, in Slurm's TRES order (cpu, mem, node, gres/gpu); `None`
/// when nothing is set.
fn tres(cpus: Option<u32>, mem_mib: Option<u64>, nodes: Option<u32>, gpus: Option<u32>) -> Option<String> {
    let mem = mem_mib.map(|m| if m > 0 && m % 1024 == 0 { format!("mem={}G", m / 1024) } else { format!("mem={m}M") });
    let parts: Vec<String> =
        [cpus.map(|n| format!("cpu={n}")), mem, nodes.map(|n| format!("node={n}")), gpus.map(|n| format!("gres/gpu={n}"))]
            .into_iter()
            .flatten()
            .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

fn grp_tres(l: &Limits) -> Option<String> {
    tres(l.grp_cpus_max, l.grp_mem_mib_max, l.grp_nodes_max, l.grp_gpus_max)
}

fn max_tres(l: &Limits) -> Option<String> {
    tres(l.cpus_per_job_max, l.mem_mib_per_job_max, l.nodes_per_job_max, l.gpus_per_job_max)
}

/// `MaxWall` as Slurm prints minutes: `HH:MM:SS`, `D-HH:MM:SS` from a day.
pub fn wall_text(min: u64) -> String {
    super::time::elapsed(min.saturating_mul(60))
}

/// The limits a row shows: its own, with what a user's association inherits from its accounts.
fn row_limits(t: &Tables<'_>, row: &Row<'_>) -> Limits {
    match row {
        Row::Assoc { account, user: Some(u) } => {
            // Per-user and per-job limits as inherited; the group ones are the association's own.
            t.accounts.effective_limits(u, &account.name).unwrap_or_default()
        }
        Row::Assoc { account, user: None } => {
            let mut l = account.limits.clone();
            for a in t.accounts.lineage(&account.name).into_iter().skip(1) {
                l.max_jobs = l.max_jobs.or(a.limits.max_jobs);
                l.max_submit_jobs = l.max_submit_jobs.or(a.limits.max_submit_jobs);
                l.max_wall_min = l.max_wall_min.or(a.limits.max_wall_min);
                l.gpus_per_job_max = l.gpus_per_job_max.or(a.limits.gpus_per_job_max);
                l.cpus_per_job_max = l.cpus_per_job_max.or(a.limits.cpus_per_job_max);
                l.mem_mib_per_job_max = l.mem_mib_per_job_max.or(a.limits.mem_mib_per_job_max);
                l.nodes_per_job_max = l.nodes_per_job_max.or(a.limits.nodes_per_job_max);
            }
            l
        }
        Row::Qos(q) => q.limits.clone(),
        _ => Limits::default(),
    }
}

fn value(t: &Tables<'_>, row: &Row<'_>, field: Field) -> Option<String> {
    let limits = row_limits(t, row);
    match (row, field) {
        (Row::Account(a), Field::Account | Field::Name) => Some(a.name.clone()),
        (Row::Account(a), Field::Description) => Some(a.description.clone()),
        (Row::Account(a), Field::Organization) => Some(a.organization.clone()),
        (Row::Account(a), Field::ParentName) => a.parent.clone(),
        (Row::User(u), Field::User | Field::Name) => Some(u.name.clone()),
        (Row::User(u), Field::DefaultAccount) => Some(u.default_account.clone()),
        (Row::User(_), Field::AdminLevel) => Some("None".into()),
        (Row::Qos(q), Field::Name) => Some(q.name.clone()),
        (Row::Qos(q), Field::Priority) => Some(q.priority.to_string()),
        (Row::Qos(_), Field::GraceTime) => Some("00:00:00".into()),
        (Row::Qos(q), Field::Preempt) => Some(q.preempt.join(",")).filter(|p| !p.is_empty()),
        (Row::Qos(_), Field::PreemptMode) => Some("cluster".into()),
        (Row::Qos(_), Field::UsageFactor) => Some("1.000000".into()),
        (Row::Qos(_), Field::GrpTres) => grp_tres(&limits),
        (Row::Qos(_) | Row::Assoc { .. }, Field::GrpJobs) => limits.grp_jobs_max.map(|n| n.to_string()),
        (Row::Qos(_) | Row::Assoc { .. }, Field::GrpSubmit) => limits.grp_submit_jobs_max.map(|n| n.to_string()),
        (Row::Qos(_), Field::MaxTres) => max_tres(&limits),
        (Row::Qos(_), Field::MaxWall) => limits.max_wall_min.map(wall_text),
        (Row::Qos(_), Field::MaxJobsPu) => limits.max_jobs.map(|n| n.to_string()),
        (Row::Qos(_), Field::MaxSubmitPu) => limits.max_submit_jobs.map(|n| n.to_string()),
        (Row::Assoc { .. }, Field::Cluster) => Some(t.cluster.to_string()),
        (Row::Assoc { account, .. }, Field::Account) => Some(account.name.clone()),
        (Row::Assoc { account, user: None }, Field::ParentName) => account.parent.clone(),
        (Row::Assoc { user, .. }, Field::User) => user.map(str::to_string),
        (Row::Assoc { account, user: None }, Field::Share) => Some(account.shares.unwrap_or(1).to_string()),
        (Row::Assoc { account, user: Some(u) }, Field::Share) => {
            Some(t.accounts.assoc(u, &account.name).and_then(|a| a.shares).unwrap_or(1).to_string())
        }
        (Row::Assoc { .. }, Field::GrpTres) => grp_tres(&limits),
        (Row::Assoc { .. }, Field::MaxTres) => max_tres(&limits),
        (Row::Assoc { .. }, Field::MaxWall) => limits.max_wall_min.map(wall_text),
        (Row::Assoc { .. }, Field::MaxJobs) => limits.max_jobs.map(|n| n.to_string()),
        (Row::Assoc { .. }, Field::MaxSubmit) => limits.max_submit_jobs.map(|n| n.to_string()),
        (Row::Assoc { account, user }, Field::Qos) => Some(match user {
            Some(u) => t.accounts.allowed_qos(u, &account.name),
            None => t.accounts.account_qos(&account.name),
        })
        .map(|mut q| {
            q.sort();
            q.join(",")
        }),
        (Row::Assoc { account, user: Some(u) }, Field::DefaultQos) => t.accounts.default_qos(u, &account.name),
        (Row::Assoc { account, user: None }, Field::DefaultQos) => {
            t.accounts.lineage(&account.name).into_iter().find_map(|a| a.default_qos.clone())
        }
        _ => None,
    }
}

/// Every association in Slurm's tree order: an account, its users, then its sub-accounts.
fn assoc_rows<'a>(db: &'a Accounts, account: &'a Account, out: &mut Vec<Row<'a>>, depth: usize) {
    out.push(Row::Assoc { account, user: None });
    for u in db.users.values().filter(|u| u.assocs.contains_key(&account.name)) {
        out.push(Row::Assoc { account, user: Some(u.name.as_str()) });
    }
    if depth >= proto::accounts::ACCOUNTS_MAX {
        return;
    }
    for child in db.accounts.values().filter(|a| a.parent.as_deref() == Some(account.name.as_str())) {
        assoc_rows(db, child, out, depth + 1);
    }
}

fn selected(filter: &[String], name: &str) -> bool {
    filter.is_empty() || filter.iter().any(|f| f == name)
}

/// The rows `show ENTITY` prints, filtered.
fn rows<'a>(t: &Tables<'a>, entity: Entity, filter: &Filter) -> Vec<Row<'a>> {
    match entity {
        Entity::Account => t.accounts.accounts.values().filter(|a| selected(&filter.names, &a.name)).map(Row::Account).collect(),
        Entity::User => t.accounts.users.values().filter(|u| selected(&filter.names, &u.name)).map(Row::User).collect(),
        Entity::Qos => {
            let normal = (!t.policy.qos.iter().any(|q| q.name == proto::DEFAULT_QOS)).then(|| &*NORMAL_QOS);
            normal.into_iter().chain(t.policy.qos.iter()).filter(|q| selected(&filter.names, &q.name)).map(Row::Qos).collect()
        }
        Entity::Assoc => {
            let mut out = Vec::new();
            if let Some(root) = t.accounts.accounts.get(proto::accounts::ROOT_ACCOUNT) {
                assoc_rows(t.accounts, root, &mut out, 0);
            }
            out.retain(|r| match r {
                Row::Assoc { account, user } => {
                    selected(&filter.accounts, &account.name)
                        && (filter.users.is_empty() || user.is_some_and(|u| selected(&filter.users, u)))
                }
                _ => false,
            });
            out
        }
    }
}

/// `normal`, which always exists, as shown where the policy does not define it.
static NORMAL_QOS: std::sync::LazyLock<QosDef> =
    std::sync::LazyLock::new(|| QosDef { name: proto::DEFAULT_QOS.into(), preempt_mode: "requeue".into(), ..Default::default() });

/// One cell as Slurm's `print_fields_str` prints it: right-aligned to the width (a value
/// longer than it cut, its last character `+`), or the value and `|` when parsable.
fn cell(out: &mut String, value: Option<&str>, width: usize, parsable: Parsable, last: bool) {
    match parsable {
        Parsable::NoEnding if last => out.push_str(value.unwrap_or("")),
        Parsable::Ending | Parsable::NoEnding => {
            out.push_str(value.unwrap_or(""));
            out.push('|');
        }
        Parsable::No => {
            out.push_str(&super::sacct::fit(value.unwrap_or(" "), i32::try_from(width).unwrap_or(i32::MAX)));
            out.push(' ');
        }
    }
}

/// `show ENTITY` as Slurm prints it.
pub fn render(t: &Tables<'_>, entity: Entity, filter: &Filter, format: &[Column], opts: Options) -> String {
    let mut out = String::new();
    let n = format.len();
    if opts.header {
        for (i, c) in format.iter().enumerate() {
            cell(&mut out, Some(c.header), c.width, opts.parsable, i + 1 == n);
        }
        out.push('\n');
        if opts.parsable == Parsable::No {
            for c in format {
                out.push_str(&"-".repeat(c.width));
                out.push(' ');
            }
            out.push('\n');
        }
    }
    for row in rows(t, entity, filter) {
        for (i, c) in format.iter().enumerate() {
            cell(&mut out, value(t, &row, c.field).as_deref(), c.width, opts.parsable, i + 1 == n);
        }
        out.push('\n');
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Running it

/// Slurm's question before a change; `true` only for an answer starting with `y` within 30 s
/// (end of input, anything else or no answer is no).
fn commit_check() -> bool {
    println!("Would you like to commit changes? (You have 30 seconds to decide)");
    print!("(N/y): ");
    let _ = std::io::stdout().flush();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let read = std::io::stdin().lock().read_line(&mut line);
        let _ = tx.send(read.map(|n| n > 0 && line.trim_start().starts_with(['y', 'Y'])).unwrap_or(false));
    });
    let answer = rx.recv_timeout(COMMIT_WAIT);
    println!();
    match answer {
        Ok(yes) => yes,
        Err(_) => {
            println!("timeout");
            false
        }
    }
}

/// An edit refused by the cluster, in sacctmgr's words.
fn refusal(e: &anyhow::Error) -> SlurmError {
    match e.downcast_ref::<ApiError>() {
        Some(ApiError::Invalid(why) | ApiError::NotFound(why)) => error(format!(" {why}")),
        Some(ApiError::Denied(why)) => error(format!(" Error with request: {why}")),
        _ => SlurmError::fatal(PROG, super::describe_error(e)),
    }
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    if args.iter().any(|a| a == "-V" || a == "--version") {
        return Ok(super::print_version());
    }
    let (opts, action) = parse(args)?;
    let cluster = super::connect(PROG)?;
    match action {
        Action::Edit { edits, summary } => {
            print!("{summary}");
            if !opts.immediate && !commit_check() {
                println!(" Changes Discarded");
                return Ok(0);
            }
            super::block_on(PROG, async {
                cluster.call_patiently(Request::EditAccounts { edits }, super::PATIENCE).await.map(|_| 0).map_err(|e| refusal(&e))
            })?
        }
        Action::Show { entity, filter, format } => {
            let (accounts, policy, name) = super::block_on(PROG, async {
                let (accounts, policy) = match super::call(PROG, &cluster, Request::GetAccounts).await? {
                    Reply::Accounts { accounts, policy } => (accounts, policy),
                    other => return Err(SlurmError::fatal(PROG, format!("unexpected reply {other:?}"))),
                };
                let name = match cluster.call_patiently(Request::ShowConfig, super::PATIENCE).await {
                    Ok(Reply::Config(entries)) => entries.into_iter().find(|(k, _)| k == "ClusterName").map(|(_, v)| v),
                    _ => None,
                };
                Ok((accounts, policy, name.unwrap_or_else(|| "cluster".into())))
            })??;
            let tables = Tables { accounts: &accounts, policy: &policy, cluster: &name };
            print!("{}", render(&tables, entity, &filter, &format, opts));
            Ok(0)
        }
    }
}
