//! `sacctmgr show|list`: Slurm 22.05's columns (`_get_print_field` of `src/sacctmgr/common.c`:
//! names, least prefixes, headers and widths), each entity's default columns, the rows in
//! Slurm's order, and `print_fields`' rules (right-aligned to the width, `+` marking a cut
//! value, `-p`/`-P` separated by `|`).

use proto::accounts::{Account, Accounts};
use proto::{Limits, QosDef, SchedulerPolicy};

use super::options::{Entity, Filter};

/// `-p` ends every field with `|`; `-P` all but the last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Parsable {
    #[default]
    No,
    Ending,
    NoEnding,
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
    let mem = mem_mib.map(|m| format!("mem={}", mem_text(m)));
    let parts: Vec<String> =
        [cpus.map(|n| format!("cpu={n}")), mem, nodes.map(|n| format!("node={n}")), gpus.map(|n| format!("gres/gpu={n}"))]
            .into_iter()
            .flatten()
            .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

/// Memory as Slurm's `convert_num_unit` prints MiB exactly: `G` when whole, else `M`.
pub fn mem_text(mib: u64) -> String {
    if mib > 0 && mib.is_multiple_of(1024) {
        format!("{}G", mib / 1024)
    } else {
        format!("{mib}M")
    }
}

fn grp_tres(l: &Limits) -> Option<String> {
    tres(l.grp_cpus_max, l.grp_mem_mib_max, l.grp_nodes_max, l.grp_gpus_max)
}

fn max_tres(l: &Limits) -> Option<String> {
    tres(l.cpus_per_job_max, l.mem_mib_per_job_max, l.nodes_per_job_max, l.gpus_per_job_max)
}

fn max_tres_per_user(l: &Limits) -> Option<String> {
    tres(l.cpus_per_user_max, l.mem_mib_per_user_max, l.nodes_per_user_max, l.gpus_per_user_max)
}

/// `MaxWall` as Slurm prints minutes: `HH:MM:SS`, `D-HH:MM:SS` from a day.
pub fn wall_text(min: u64) -> String {
    super::super::time::elapsed(min.saturating_mul(60))
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
        (Row::Qos(q), Field::Description) => Some(q.description.clone().unwrap_or_else(|| q.name.clone())),
        (Row::Qos(_), Field::MaxTresPu) => max_tres_per_user(&limits),
        (Row::Qos(_) | Row::Assoc { .. }, Field::GrpWall) => limits.grp_wall_min.map(wall_text),
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
            out.push_str(&super::super::sacct::fit(value.unwrap_or(" "), i32::try_from(width).unwrap_or(i32::MAX)));
            out.push(' ');
        }
    }
}

/// `show ENTITY` as Slurm prints it.
pub fn render(t: &Tables<'_>, entity: Entity, filter: &Filter, format: &[Column], header: bool, parsable: Parsable) -> String {
    let mut out = String::new();
    let n = format.len();
    if header {
        for (i, c) in format.iter().enumerate() {
            cell(&mut out, Some(c.header), c.width, parsable, i + 1 == n);
        }
        out.push('\n');
        if parsable == Parsable::No {
            for c in format {
                out.push_str(&"-".repeat(c.width));
                out.push(' ');
            }
            out.push('\n');
        }
    }
    for row in rows(t, entity, filter) {
        for (i, c) in format.iter().enumerate() {
            cell(&mut out, value(t, &row, c.field).as_deref(), c.width, parsable, i + 1 == n);
        }
        out.push('\n');
    }
    out
}
