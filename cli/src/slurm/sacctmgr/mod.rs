//! `sacctmgr`: accounts, users, QoS and associations with their limits, kept in the
//! replicated state (`proto::accounts`). `add|create account|user|qos NAME.. [OPTION=VALUE..]`
//! (every option `modify` sets, as Slurm's sacctmgr takes them: `options`), `modify|update
//! account|user|qos [where] NAME.. set KEY=VALUE..` (Slurm's `-1` clears a limit), `delete|remove
//! account|user|qos NAME`, `show|list account|user|qos|association [where ...] [format=...]`,
//! with `-i` (no question asked), `-n` (no header), `-p`/`-P` (`|`-separated with or without a
//! closing `|`). Without `-i` a change is committed only when `y` answers Slurm's question.
//!
//! The options, messages, columns, headers and widths follow Slurm 22.05.8's sacctmgr source
//! (`src/sacctmgr/common.c`, `account_functions.c`, `association_functions.c`,
//! `user_functions.c`, `qos_functions.c`): the Slurm peer in `shared/peers/slurm` has no
//! slurmdbd, so its sacctmgr cannot run to compare outputs.

mod options;
mod plan;
mod show;

use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::time::Duration;

use proto::accounts::Accounts;
use proto::{ApiError, ClientRequest, Reply, SchedulerPolicy};

pub use options::{list, Entity, Filter, Settings};
pub use plan::{Db, Plan};
pub use show::{default_format, wall_text, Column, Field, Parsable, Tables};

use super::SlurmError;

pub const PROG: &str = "sacctmgr";

/// How long Slurm waits for each key of the answer to "Would you like to commit changes?".
const COMMIT_WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub immediate: bool,
    pub header: bool,
    pub parsable: Parsable,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Add { entity: Entity, settings: Settings },
    Modify { entity: Entity, filter: Filter, settings: Settings },
    Delete { entity: Entity, filter: Filter },
    Show { entity: Entity, filter: Filter, format: Vec<Column> },
}

fn error(text: impl Into<String>) -> SlurmError {
    SlurmError { text: text.into(), code: 1 }
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
        "add" | "create" => Action::Add { entity, settings: options::parse_settings(entity, true, rest)? },
        "modify" | "update" => parse_modify(entity, rest)?,
        "delete" | "remove" => Action::Delete { entity, filter: parse_where(entity, rest)? },
        "show" | "list" => parse_show(entity, rest)?,
        other => return Err(error(format!(" Unknown command: {other}"))),
    };
    Ok((opts, action))
}

/// `where` conditions: names (bare, `Name=`, `User=` for users) and `Account=` (users).
fn parse_where(entity: Entity, words: &[&str]) -> Result<Filter, SlurmError> {
    let mut f = Filter::default();
    for w in words.iter().filter(|w| !w.eq_ignore_ascii_case("where")) {
        let Some((k, _, v)) = options::split_option(w) else {
            f.names.extend(list(w));
            continue;
        };
        match k.as_str() {
            "name" | "names" => f.names.extend(list(v)),
            "user" | "users" if entity == Entity::User => f.names.extend(list(v)),
            "user" | "users" => f.users.extend(list(v)),
            "account" | "accounts" | "acct" if entity == Entity::Account => f.names.extend(list(v)),
            "account" | "accounts" | "acct" => f.accounts.extend(list(v)),
            "cluster" | "clusters" => {}
            _ => return Err(error(format!(" Unknown condition: {w}\n Use keyword 'set' to modify value"))),
        }
    }
    Ok(f)
}

/// `modify ENTITY [where] CONDITIONS set OPTIONS`, the two parts in either order, as Slurm's.
fn parse_modify(entity: Entity, words: &[&str]) -> Result<Action, SlurmError> {
    let (mut conditions, mut set, mut setting, mut any_set) = (Vec::new(), Vec::new(), false, false);
    for &w in words {
        if w.eq_ignore_ascii_case("set") {
            (setting, any_set) = (true, true);
        } else if w.eq_ignore_ascii_case("where") {
            setting = false;
        } else if setting {
            set.push(w);
        } else {
            conditions.push(w);
        }
    }
    if !any_set || set.is_empty() {
        return Err(error(" You didn't give me anything to set"));
    }
    let filter = parse_where(entity, &conditions)?;
    Ok(Action::Modify { entity, filter, settings: options::parse_settings(entity, false, &set)? })
}

fn parse_show(entity: Entity, words: &[&str]) -> Result<Action, SlurmError> {
    let mut format = Vec::new();
    let mut conditions = Vec::new();
    for w in words {
        match options::split_option(w) {
            Some((k, _, v)) if k == "format" => {
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

/// What a change does against the database as it is (`show` changes nothing).
pub fn plan(db: &Db<'_>, action: &Action) -> Result<Plan, SlurmError> {
    match action {
        Action::Add { entity, settings } => plan::add(db, *entity, settings),
        Action::Modify { entity, filter, settings } => plan::modify(db, *entity, filter, settings),
        Action::Delete { entity, filter } => plan::delete(*entity, filter),
        Action::Show { .. } => Ok(Plan::Nothing(String::new())),
    }
}

/// `show ENTITY` as Slurm prints it.
pub fn render(t: &Tables<'_>, entity: Entity, filter: &Filter, format: &[Column], opts: Options) -> String {
    show::render(t, entity, filter, format, opts.header, opts.parsable)
}

// ---------------------------------------------------------------------------------------------
// Running it

/// Slurm's `commit_check`: the question, then `(N/y): ` for each key until one of `y`, `n` or
/// Enter, `Y or N please` after any other; `true` for `y`. A terminal gives each key as it is
/// typed (Slurm's `_nonblock`); 30 s without a key prints `timeout` and is no. At the end of
/// the input (a script's `/dev/null`, cron) it is no: Slurm 22.05 asks again for ever there,
/// a loop its 25.11 ends the same way.
fn commit_check(question: &str) -> bool {
    use std::io::{Read, Write};
    println!("{question} (You have 30 seconds to decide)");
    let _keys = super::terminal::KeyMode::enter(0);
    let (tx, rx) = sync_channel::<Option<u8>>(1);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut byte = [0u8; 1];
        loop {
            let key = match stdin.read(&mut byte) {
                Ok(1) => Some(byte[0]),
                _ => None,
            };
            if tx.send(key).is_err() || key.is_none() {
                return;
            }
        }
    });
    let mut key: Option<u8> = None;
    loop {
        match key {
            Some(b'y' | b'Y') => return true,
            Some(b'n' | b'N' | b'\n') => return false,
            Some(_) => println!("Y or N please"),
            None => {}
        }
        print!("(N/y): ");
        let _ = std::io::stdout().flush();
        match rx.recv_timeout(COMMIT_WAIT) {
            Err(RecvTimeoutError::Timeout) => {
                println!("timeout");
                return false;
            }
            Ok(Some(k)) => {
                println!();
                key = Some(k);
            }
            Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                println!();
                return false;
            }
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

/// The database, the policy and the cluster's name, from any node.
fn fetch(cluster: &crate::client::Cluster) -> Result<(Box<Accounts>, SchedulerPolicy, String), SlurmError> {
    super::block_on(PROG, async {
        let (accounts, policy) = match super::call(PROG, cluster, ClientRequest::GetAccounts).await? {
            Reply::Accounts { accounts, policy } => (accounts, policy),
            other => return Err(SlurmError::fatal(PROG, format!("unexpected reply {other:?}"))),
        };
        let name = match cluster.call_patiently(ClientRequest::ShowConfig, super::PATIENCE).await {
            Ok(Reply::Config(entries)) => entries.into_iter().find(|(k, _)| k == "ClusterName").map(|(_, v)| v),
            _ => None,
        };
        Ok::<_, SlurmError>((accounts, policy, name.unwrap_or_else(|| "cluster".into())))
    })?
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    if args.iter().any(|a| a == "-V" || a == "--version") {
        return Ok(super::print_version());
    }
    let (opts, action) = parse(args)?;
    let cluster = super::connect(PROG)?;
    let (accounts, policy, name) = fetch(&cluster)?;
    if let Action::Show { entity, filter, format } = &action {
        let tables = Tables { accounts: &accounts, policy: &policy, cluster: &name };
        print!("{}", render(&tables, *entity, filter, format, opts));
        return Ok(0);
    }
    let (edits, summary) = match plan(&Db { accounts: &accounts, policy: &policy, cluster: &name }, &action)? {
        // ` Nothing new added.`: exit 1, as Slurm's sacctmgr does.
        Plan::Nothing(text) => {
            print!("{text}");
            return Ok(1);
        }
        Plan::Edits { edits, summary } => (edits, summary),
    };
    print!("{summary}");
    if !opts.immediate && !commit_check("Would you like to commit changes?") {
        println!(" Changes Discarded");
        return Ok(0);
    }
    super::block_on(PROG, async {
        cluster.call_patiently(ClientRequest::EditAccounts { edits }, super::PATIENCE).await.map(|_| 0).map_err(|e| refusal(&e))
    })?
}
