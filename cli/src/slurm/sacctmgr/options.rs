//! The options of `sacctmgr add` and `modify ... set` as Slurm 22.05's sacctmgr matches them
//! (`_set_rec` of `account_functions.c`, `user_functions.c`, `qos_functions.c` and
//! `sacctmgr_set_assoc_rec`): case-insensitive, a key matching the first option in Slurm's order
//! it is a prefix of, at least that option's least length (`MaxW` is `MaxWallDurationPerJob`,
//! `QOS` is `QosLevel`), `KEY+=`/`KEY-=` for lists; names, descriptions and lists lowercased as
//! Slurm stores them. What they give is a [`Settings`], turned into edits by `plan`.

use proto::accounts::{AssocChanges, LimitChanges};

use super::super::SlurmError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entity {
    Account,
    User,
    Qos,
    Assoc,
}

impl Entity {
    pub fn parse(word: &str) -> Option<Entity> {
        match word.to_ascii_lowercase().as_str() {
            "account" | "accounts" | "acct" => Some(Entity::Account),
            "user" | "users" => Some(Entity::User),
            "qos" => Some(Entity::Qos),
            "association" | "associations" | "assoc" | "assocs" => Some(Entity::Assoc),
            _ => None,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Entity::Account => "account",
            Entity::User => "user",
            Entity::Qos => "qos",
            Entity::Assoc => "association",
        }
    }
}

/// Which records `show`, `modify` and `delete` are about (empty: all).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub names: Vec<String>,
    pub accounts: Vec<String>,
    pub users: Vec<String>,
}

/// What `add` or `modify ... set` gives, in Corral's terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub names: Vec<String>,
    /// `Cluster=`: must name this cluster.
    pub clusters: Vec<String>,
    /// `add user ... Account=` (with `DefaultAccount=`'s, as Slurm adds it to the list).
    pub accounts: Vec<String>,
    pub default_account: Option<String>,
    pub description: Option<String>,
    pub organization: Option<String>,
    pub parent: Option<String>,
    /// A QoS's `Priority=`.
    pub priority: Option<u32>,
    /// Limits, QoS list, default QoS and shares of the association (or the QoS's limits).
    pub assoc: AssocChanges,
    /// The QoS list as given (`+`/`-` kept), for what sacctmgr prints.
    pub qos_text: Option<Vec<String>>,
    /// Slurm's `limit_set`: an option of the association (or, adding an account, any but its
    /// names) was given, so `add` prints the settings.
    pub limit_set: bool,
}

/// Which TRES list a single-resource option of Slurm's (`GrpCPUs=`, `MaxNodesPerJob=`) sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TresList {
    Grp,
    PerJob,
    PerUser,
}

/// What an option sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Name,
    Cluster,
    Description,
    Organization,
    Parent,
    Account,
    DefaultAccount,
    AdminLevel,
    DefaultQos,
    Fairshare,
    GrpJobs,
    GrpSubmitJobs,
    GrpTres,
    GrpWall,
    MaxJobs,
    MaxSubmitJobs,
    MaxTresPerJob,
    MaxTresPerUser,
    MaxWall,
    Qos,
    Priority,
    /// One TRES of a list, by its name.
    Tres(TresList, &'static str),
    /// An option of Slurm's Corral has no counterpart for.
    Unsupported,
}

type Table = &'static [(&'static str, usize, Key)];

/// `sacctmgr_set_assoc_rec`'s options, in its order.
const ASSOC_REC: Table = &[
    ("defaultqos", 8, Key::DefaultQos),
    ("fairshare", 1, Key::Fairshare),
    ("shares", 1, Key::Fairshare),
    ("grpcpumins", 7, Key::Unsupported),
    ("grpcpurunmins", 7, Key::Unsupported),
    ("grpcpus", 7, Key::Tres(TresList::Grp, "cpu")),
    ("grpjobs", 4, Key::GrpJobs),
    ("grpjobsaccrue", 8, Key::Unsupported),
    ("grpmemory", 4, Key::Tres(TresList::Grp, "mem")),
    ("grpnodes", 4, Key::Tres(TresList::Grp, "node")),
    ("grpsubmitjobs", 4, Key::GrpSubmitJobs),
    ("grptres", 7, Key::GrpTres),
    ("grptresmins", 8, Key::Unsupported),
    ("grptresrunmins", 8, Key::Unsupported),
    ("grpwall", 4, Key::GrpWall),
    ("maxcpuminsperjob", 7, Key::Unsupported),
    ("maxcpurunmins", 7, Key::Unsupported),
    ("maxcpusperjob", 7, Key::Tres(TresList::PerJob, "cpu")),
    ("maxjobs", 4, Key::MaxJobs),
    ("maxjobsaccrue", 8, Key::Unsupported),
    ("maxnodesperjob", 4, Key::Tres(TresList::PerJob, "node")),
    ("minpriothresh", 4, Key::Unsupported),
    ("maxsubmitjobs", 4, Key::MaxSubmitJobs),
    ("maxtresperjob", 7, Key::MaxTresPerJob),
    ("maxtrespernode", 11, Key::Unsupported),
    ("maxtresminsperjob", 8, Key::Unsupported),
    ("maxtresrunmins", 8, Key::Unsupported),
    ("maxwalldurationperjob", 4, Key::MaxWall),
    ("parent", 2, Key::Parent),
    ("priority", 2, Key::Unsupported),
    ("qoslevel", 1, Key::Qos),
];

/// An account's own options (`account_functions.c`), before the association's.
const ACCOUNT_REC: Table = &[
    ("accounts", 1, Key::Name),
    ("names", 1, Key::Name),
    ("acct", 4, Key::Name),
    ("clusters", 1, Key::Cluster),
    ("description", 1, Key::Description),
    ("organization", 1, Key::Organization),
    ("rawusage", 7, Key::Unsupported),
];

/// `add user`'s own options, before the association's.
const USER_ADD: Table = &[
    ("names", 1, Key::Name),
    ("users", 1, Key::Name),
    ("adminlevel", 2, Key::AdminLevel),
    ("defaultaccount", 8, Key::DefaultAccount),
    ("defaultwckey", 8, Key::Unsupported),
    ("wckeys", 1, Key::Unsupported),
];

/// `add user`'s conditions (`sacctmgr_set_assoc_cond`), after the association's options.
const USER_COND: Table = &[
    ("accounts", 2, Key::Account),
    ("acct", 4, Key::Account),
    ("ids", 1, Key::Unsupported),
    ("associations", 2, Key::Unsupported),
    ("clusters", 1, Key::Cluster),
    ("partitions", 3, Key::Unsupported),
    ("users", 1, Key::Name),
];

/// `modify user ... set`'s own options, before the association's.
const USER_SET: Table = &[
    ("adminlevel", 2, Key::AdminLevel),
    ("defaultaccount", 8, Key::DefaultAccount),
    ("defaultwckey", 8, Key::Unsupported),
    ("newname", 1, Key::Unsupported),
    ("rawusage", 7, Key::Unsupported),
];

/// A QoS's options (`qos_functions.c`), in its order.
const QOS_REC: Table = &[
    ("name", 1, Key::Name),
    ("description", 1, Key::Description),
    ("flags", 2, Key::Unsupported),
    ("gracetime", 3, Key::Unsupported),
    ("grpcpumins", 7, Key::Unsupported),
    ("grpcpurunmins", 7, Key::Unsupported),
    ("grpcpus", 7, Key::Tres(TresList::Grp, "cpu")),
    ("grpjobs", 4, Key::GrpJobs),
    ("grpjobsaccrue", 8, Key::Unsupported),
    ("grpmemory", 4, Key::Tres(TresList::Grp, "mem")),
    ("grpnodes", 4, Key::Tres(TresList::Grp, "node")),
    ("grpsubmitjobs", 4, Key::GrpSubmitJobs),
    ("grptres", 7, Key::GrpTres),
    ("grptresmins", 8, Key::Unsupported),
    ("grptresrunmins", 8, Key::Unsupported),
    ("grpwall", 4, Key::GrpWall),
    ("limitfactor", 6, Key::Unsupported),
    ("maxcpuminsperjob", 7, Key::Unsupported),
    ("maxcpusperjob", 7, Key::Tres(TresList::PerJob, "cpu")),
    ("maxcpusperuser", 11, Key::Tres(TresList::PerUser, "cpu")),
    ("maxcpuspu", 9, Key::Tres(TresList::PerUser, "cpu")),
    ("maxjobsaccrueperaccount", 17, Key::Unsupported),
    ("maxjobsaccruepa", 15, Key::Unsupported),
    ("maxjobsaccrueperuser", 17, Key::Unsupported),
    ("maxjobsaccruepu", 15, Key::Unsupported),
    ("maxjobsperaccount", 11, Key::Unsupported),
    ("maxjobspa", 9, Key::Unsupported),
    ("maxjobsperuser", 4, Key::MaxJobs),
    ("maxjobspu", 4, Key::MaxJobs),
    ("maxnodesperjob", 4, Key::Tres(TresList::PerJob, "node")),
    ("maxnodesperuser", 8, Key::Tres(TresList::PerUser, "node")),
    ("maxnodespu", 8, Key::Tres(TresList::PerUser, "node")),
    ("maxsubmitjobsperaccount", 17, Key::Unsupported),
    ("maxsubmitjobspa", 15, Key::Unsupported),
    ("maxsubmitjobsperuser", 4, Key::MaxSubmitJobs),
    ("maxsubmitjobspu", 4, Key::MaxSubmitJobs),
    ("maxtresperaccount", 11, Key::Unsupported),
    ("maxtrespa", 9, Key::Unsupported),
    ("maxtresperjob", 7, Key::MaxTresPerJob),
    ("maxtrespernode", 11, Key::Unsupported),
    ("maxtresperuser", 11, Key::MaxTresPerUser),
    ("maxtrespu", 9, Key::MaxTresPerUser),
    ("maxtresminsperjob", 8, Key::Unsupported),
    ("maxtresrunminspa", 16, Key::Unsupported),
    ("maxtresrunminspu", 8, Key::Unsupported),
    ("maxwalldurationperjob", 4, Key::MaxWall),
    ("mincpusperjob", 7, Key::Unsupported),
    ("minpriothresh", 4, Key::Unsupported),
    ("mintresperjob", 7, Key::Unsupported),
    ("preemptmode", 8, Key::Unsupported),
    ("preempt", 7, Key::Unsupported),
    ("preemptexempttime", 8, Key::Unsupported),
    ("priority", 3, Key::Priority),
    ("rawusage", 7, Key::Unsupported),
    ("usagefactor", 6, Key::Unsupported),
    ("usagethreshold", 6, Key::Unsupported),
];

/// The first option of `tables`, in order, `key` (lowercase) names.
fn lookup(tables: &[Table], key: &str) -> Option<Key> {
    tables.iter().flat_map(|t| t.iter()).find(|(full, least, _)| key.len() >= *least && full.starts_with(key)).map(|&(_, _, k)| k)
}

/// `KEY=VALUE`, `KEY+=VALUE` or `KEY-=VALUE` as Slurm's `parse_option_end` splits it: the key
/// lowercased, the operator, the value; `None` for a bare word.
pub fn split_option(word: &str) -> Option<(String, Option<char>, &str)> {
    let bytes = word.as_bytes();
    let at = bytes.iter().enumerate().position(|(i, &b)| b == b'=' || (matches!(b, b'+' | b'-') && bytes.get(i + 1) == Some(&b'=')))?;
    let key = word[..at].to_ascii_lowercase();
    match bytes[at] {
        b'=' => Some((key, None, &word[at + 1..])),
        op => Some((key, Some(char::from(op)), &word[at + 2..])),
    }
}

/// A value as Slurm's `strip_quotes(.., 1)` keeps it: outer quotes off, lowercased.
fn text(value: &str) -> String {
    value.trim_matches(|c| c == '"' || c == '\'').to_lowercase()
}

/// A comma list as `slurm_addto_char_list` keeps it: lowercased, no blanks, no duplicates.
pub fn list(value: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in text(value).split(',').filter(|s| !s.is_empty()) {
        out.retain(|n| n != name);
        out.push(name.to_string());
    }
    out
}

fn error(text: impl Into<String>) -> SlurmError {
    SlurmError { text: text.into(), code: 1 }
}

fn slurm_error(msg: impl std::fmt::Display) -> SlurmError {
    SlurmError::fatal(super::PROG, msg)
}

fn unknown(word: &str, hint: bool) -> SlurmError {
    let hint = if hint { "\n Use keyword 'where' to modify condition" } else { "" };
    error(format!(" Unknown option: {word}{hint}"))
}

/// The options Corral takes, for the refusal of one it does not.
fn supported(entity: Entity) -> &'static str {
    match entity {
        Entity::Qos => {
            "Name, Description, Priority, MaxJobsPerUser, MaxSubmitJobsPerUser, MaxWall, MaxTRESPerJob, MaxTRESPerUser, \
             GrpJobs, GrpSubmitJobs, GrpTRES (TRES cpu, mem, node, gres/gpu) and GrpWall"
        }
        _ => {
            "Name, Account, DefaultAccount, Cluster, Parent, Description, Organization, Fairshare, QOS (=, += or -=), DefaultQOS, \
             MaxJobs, MaxSubmitJobs, MaxWall, MaxTRESPerJob, GrpJobs, GrpSubmitJobs, GrpTRES (TRES cpu, mem, node, gres/gpu) \
             and GrpWall"
        }
    }
}

/// `get_uint`: a number (`strtol`'s leading digits), negative clears (`None`).
fn count(kind: &str, value: &str) -> Result<Option<u32>, SlurmError> {
    let v = text(value);
    let digits_at = usize::from(v.starts_with(['-', '+']));
    let digits: String = v[digits_at..].chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() && !v.is_empty() {
        return Err(slurm_error(format!("Invalid value for {kind} ({v})")));
    }
    if v.starts_with('-') && digits.bytes().any(|b| b != b'0') {
        return Ok(None);
    }
    let n: u64 = if digits.is_empty() { 0 } else { digits.parse().map_err(|_| slurm_error(format!("Invalid value for {kind} ({v})")))? };
    u32::try_from(n).map(Some).map_err(|_| slurm_error(format!("Invalid value for {kind} ({v})")))
}

/// `time_str2mins`: minutes, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S` rounded up to minutes;
/// `-1`, `UNLIMITED` and `INFINITE` clear.
fn wall(kind: &str, word: &str, value: &str) -> Result<Option<u64>, SlurmError> {
    let bad = || error(format!(" Bad {kind} time format: {word}"));
    let v = value.trim();
    let cleared = v == "-1" || v.eq_ignore_ascii_case("unlimited") || v.eq_ignore_ascii_case("infinite");
    match super::super::time::parse_limit_s(v) {
        Ok(Some(s)) => Ok(Some(s.div_ceil(60))),
        Ok(None) if cleared => Ok(None),
        Ok(None) => Ok(Some(0)),
        Err(_) => Err(bad()),
    }
}

/// `Fairshare=N`; `-1` sets it back to Slurm's default of 1. `parent` is refused: Corral has no
/// shares inherited from the parent.
fn shares(value: &str) -> Result<Option<u32>, SlurmError> {
    if value.trim().starts_with('-') {
        return Ok(None);
    }
    match value.trim().parse::<u32>() {
        Ok(n) if n <= proto::accounts::SHARES_MAX => Ok(Some(n)),
        _ => Err(error(format!(
            " Invalid Fairshare '{value}': Corral takes a number of shares from 0 to {} or -1 (\"parent\" is not supported)",
            proto::accounts::SHARES_MAX
        ))),
    }
}

/// One TRES of a list into `limits`: `cpu`, `mem` (MiB when bare, or K, M, G, T), `node` and
/// `gres/gpu`, `-1` clearing it; other TRES are refused.
fn tres_one(kind: &str, list: TresList, name: &str, n: &str, limits: &mut LimitChanges) -> Result<(), SlurmError> {
    let count = || count(kind, n);
    let mem = || -> Result<Option<u64>, SlurmError> {
        if n.trim().starts_with('-') {
            return Ok(None);
        }
        crate::units::parse_mem_mib(n).map(Some).map_err(|e| error(format!(" Bad {kind} value: {e}")))
    };
    match (name.to_ascii_lowercase().as_str(), list) {
        ("gres/gpu", TresList::Grp) => limits.grp_gpus_max = Some(count()?),
        ("gres/gpu", TresList::PerJob) => limits.gpus_per_job_max = Some(count()?),
        ("gres/gpu", TresList::PerUser) => limits.gpus_per_user_max = Some(count()?),
        ("cpu", TresList::Grp) => limits.grp_cpus_max = Some(count()?),
        ("cpu", TresList::PerJob) => limits.cpus_per_job_max = Some(count()?),
        ("cpu", TresList::PerUser) => limits.cpus_per_user_max = Some(count()?),
        ("node", TresList::Grp) => limits.grp_nodes_max = Some(count()?),
        ("node", TresList::PerJob) => limits.nodes_per_job_max = Some(count()?),
        ("node", TresList::PerUser) => limits.nodes_per_user_max = Some(count()?),
        ("mem", TresList::Grp) => limits.grp_mem_mib_max = Some(mem()?),
        ("mem", TresList::PerJob) => limits.mem_mib_per_job_max = Some(mem()?),
        ("mem", TresList::PerUser) => limits.mem_mib_per_user_max = Some(mem()?),
        _ => {
            return Err(error(format!(
                " Corral limits cpu, mem, node and gres/gpu: {kind}=cpu=N,mem=SIZE,node=N,gres/gpu=N (-1 clears one), not '{name}={n}'"
            )))
        }
    }
    Ok(())
}

/// `GrpTRES=`, `MaxTRESPerJob=`, `MaxTRESPerUser=`: a comma list of `TRES=N`.
fn tres(kind: &str, list: TresList, value: &str, limits: &mut LimitChanges) -> Result<(), SlurmError> {
    let mut any = false;
    for one in value.split(',').filter(|t| !t.is_empty()) {
        let Some((name, n)) = one.split_once('=') else {
            return Err(error(format!(" Bad {kind} value: {value}")));
        };
        tres_one(kind, list, name, n, limits)?;
        any = true;
    }
    if any {
        Ok(())
    } else {
        Err(error(format!(" Bad {kind} value: {value}")))
    }
}

/// `QOS=a,b`, `QOS+=c`, `QOS-=d`, `QOS=+c,-d`: into the changes and the text sacctmgr prints.
fn qos_list(op: Option<char>, value: &str, s: &mut Settings) -> Result<(), SlurmError> {
    let mixed = || slurm_error("You can't set qos equal to something and then add or subtract from it in the same line");
    let items = list(value);
    let mut equal = Vec::new();
    let shown = s.qos_text.get_or_insert_with(Vec::new);
    for item in &items {
        let (sign, name) = match item.strip_prefix(['+', '-']) {
            Some(name) => (item.chars().next(), name.to_string()),
            None => (op, item.clone()),
        };
        match sign {
            Some('+') => s.assoc.qos_add.push(name.clone()),
            Some(_) => s.assoc.qos_remove.push(name.clone()),
            None => equal.push(name.clone()),
        }
        shown.push(sign.map_or_else(|| name.clone(), |c| format!("{c}{name}")));
    }
    if !equal.is_empty() && (equal.len() != items.len()) {
        return Err(mixed());
    }
    if equal.len() == items.len() && op.is_none() {
        s.assoc.qos = Some(equal);
    }
    Ok(())
}

/// The tables of options `entity` takes in `add` (`add`) or after `set`.
fn tables(entity: Entity, add: bool) -> Vec<Table> {
    match (entity, add) {
        (Entity::Account, _) => vec![ACCOUNT_REC, ASSOC_REC],
        (Entity::User, true) => vec![USER_ADD, ASSOC_REC, USER_COND],
        (Entity::User, false) => vec![USER_SET, ASSOC_REC],
        (Entity::Qos | Entity::Assoc, _) => vec![QOS_REC],
    }
}

/// The options of `add ENTITY ...` (`add`) or of `modify ENTITY ... set ...`.
pub fn parse_settings(entity: Entity, add: bool, words: &[&str]) -> Result<Settings, SlurmError> {
    let mut s = Settings::default();
    let tables = tables(entity, add);
    for &w in words {
        let Some((key, op, value)) = split_option(w) else {
            match (entity, add) {
                (_, true) if w.eq_ignore_ascii_case("where") || w.eq_ignore_ascii_case("set") => {}
                (_, true) => s.names.extend(list(w)),
                (Entity::User, false) => return Err(error(format!(" Bad format on {w}: End your option with an '=' sign"))),
                (Entity::Account, false) => return Err(error(" Can't modify the name of an account")),
                // Slurm's modify qos passes no name list: a bare word is dropped.
                _ => {}
            }
            continue;
        };
        let Some(k) = lookup(&tables, &key) else {
            return Err(unknown(w, !(add && entity == Entity::User)));
        };
        set_one(entity, add, k, w, op, value, &mut s)?;
    }
    Ok(s)
}

/// One option into `s`.
fn set_one(entity: Entity, add: bool, k: Key, w: &str, op: Option<char>, v: &str, s: &mut Settings) -> Result<(), SlurmError> {
    let qos = entity == Entity::Qos;
    let own_option = matches!(k, Key::Name | Key::Cluster | Key::DefaultAccount | Key::AdminLevel);
    match k {
        Key::Name if !add && entity == Entity::Account => return Err(error(" Can't modify the name of an account")),
        Key::Name if add => s.names.extend(list(v)),
        Key::Name => {}
        Key::Cluster if !add => return Err(error(" Can't modify the cluster of an account")),
        Key::Cluster => s.clusters.extend(list(v)),
        Key::Description => s.description = Some(text(v)),
        Key::Organization => s.organization = Some(text(v)),
        Key::Parent if !add => return Err(error(" Corral moves no account: Parent= is taken when the account is added")),
        Key::Parent => s.parent = Some(text(v)),
        Key::Account => s.accounts.extend(list(v)),
        Key::DefaultAccount => {
            let d = text(v);
            if add {
                s.accounts.retain(|a| *a != d);
                s.accounts.push(d.clone());
            }
            s.default_account = Some(d);
        }
        Key::AdminLevel if text(v) == "none" => {}
        Key::AdminLevel => {
            return Err(error(format!(" {w}: Corral has no admin levels (AdminLevel=None only): its admins are the cluster's `admins`")))
        }
        Key::DefaultQos => s.assoc.default_qos = Some(if v.trim().starts_with("-1") || v.is_empty() { None } else { Some(text(v)) }),
        Key::Fairshare => s.assoc.shares = Some(shares(v)?),
        Key::GrpJobs => s.assoc.limits.grp_jobs_max = Some(count("GrpJobs", v)?),
        Key::GrpSubmitJobs => s.assoc.limits.grp_submit_jobs_max = Some(count("GrpSubmitJobs", v)?),
        Key::MaxJobs => s.assoc.limits.max_jobs = Some(count(if qos { "MaxJobsPU" } else { "MaxJobs" }, v)?),
        Key::MaxSubmitJobs => s.assoc.limits.max_submit_jobs = Some(count(if qos { "MaxSubmitJobsPU" } else { "MaxSubmitJobs" }, v)?),
        Key::GrpTres => tres("GrpTRES", TresList::Grp, v, &mut s.assoc.limits)?,
        Key::MaxTresPerJob => tres("MaxTRESPerJob", TresList::PerJob, v, &mut s.assoc.limits)?,
        Key::MaxTresPerUser => tres("MaxTRESPerUser", TresList::PerUser, v, &mut s.assoc.limits)?,
        Key::Tres(list, name) => tres_one(w.split('=').next().unwrap_or(w), list, name, v, &mut s.assoc.limits)?,
        Key::MaxWall => s.assoc.limits.max_wall_min = Some(wall("MaxWall", w, v)?),
        Key::GrpWall => s.assoc.limits.grp_wall_min = Some(wall("GrpWall", w, v)?),
        Key::Qos => qos_list(op, v, s)?,
        Key::Priority => s.priority = Some(count("Priority", v)?.unwrap_or(0)),
        Key::Unsupported => {
            let name = w.split(['=', '+', '-']).next().unwrap_or(w);
            return Err(error(format!(" {name}: Corral's sacctmgr does not support this option; it takes {}", supported(entity))));
        }
    }
    if !own_option {
        s.limit_set = true;
    }
    Ok(())
}
