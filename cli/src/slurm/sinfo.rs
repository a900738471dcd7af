//! `sinfo`: partitions and node states, with GRES, `-N` node rows and `-o` formats.

use proto::{NodeInfo, NodeState};

use super::env::DEFAULT_PARTITION;
use super::opts::{self, opt, Arg, OptDef};
use super::squeue::{parse_format, render, Piece};
use super::{hostlist, SlurmError};

pub use slurm_compat::show::{gres_text, node_state};

pub const PROG: &str = "sinfo";

pub const DEFAULT_FORMAT: &str = "%#P %.5a %.10l %.6D %.6t %N";
pub const NODE_FORMAT: &str = "%#N %.6D %#P %6t";
pub const LONG_FORMAT: &str = "%#P %.5a %.10l %.6D %.11T %.12G %N";
pub const REASON_FORMAT: &str = "%20E %9u %19H %N";
pub const SUMMARY_FORMAT: &str = "%#P %.5a %.10l %.16F  %N";

const OPTIONS: &[OptDef] = &[
    opt("all", Some('a'), Arg::No),
    opt("dead", Some('d'), Arg::No),
    opt("exact", Some('e'), Arg::No),
    opt("format", Some('o'), Arg::Required),
    opt("Format", Some('O'), Arg::Required),
    opt("help", None, Arg::No),
    opt("hide", None, Arg::No),
    opt("iterate", Some('i'), Arg::Required),
    opt("json", None, Arg::No),
    opt("list-reasons", Some('R'), Arg::No),
    opt("long", Some('l'), Arg::No),
    opt("Node", Some('N'), Arg::No),
    opt("noconvert", None, Arg::No),
    opt("noheader", Some('h'), Arg::No),
    opt("nodes", Some('n'), Arg::Required),
    opt("partition", Some('p'), Arg::Required),
    opt("responding", Some('r'), Arg::No),
    opt("states", Some('t'), Arg::Required),
    opt("summarize", Some('s'), Arg::No),
    opt("usage", None, Arg::No),
    opt("verbose", Some('v'), Arg::No),
    opt("version", Some('V'), Arg::No),
];

/// The partitions a node is in, as the cluster lists them (`NodeInfo::partitions`: the
/// default one spelled out; empty, in none).
pub(crate) fn partitions_of(n: &NodeInfo) -> Vec<String> {
    n.partitions.clone()
}

/// What the replicated policy says of partitions: which is the default, and time limits.
#[derive(Clone, Debug, Default)]
pub struct Partitions {
    pub default: Option<String>,
    /// Partition name to its `max_time_limit_ms`.
    pub max_time_limit_ms: std::collections::BTreeMap<String, u64>,
    /// The policy's definitions by name (default time, tier, state).
    pub defs: std::collections::BTreeMap<String, proto::PartitionDef>,
}

impl Partitions {
    pub fn from_policy(policy: &proto::SchedulerPolicy) -> Partitions {
        Partitions {
            default: policy.partitions.iter().find(|p| p.default).map(|p| p.name.clone()),
            max_time_limit_ms: policy.partitions.iter().filter_map(|p| Some((p.name.clone(), p.max_time_limit_ms?))).collect(),
            defs: policy.partitions.iter().map(|p| (p.name.clone(), p.clone())).collect(),
        }
    }

    /// The state of partition `name` (UP unless the policy says otherwise).
    pub fn state(&self, name: &str) -> proto::PartitionState {
        self.defs.get(name).map_or(proto::PartitionState::Up, |d| d.state)
    }

    pub(crate) fn default_name(&self) -> &str {
        self.default.as_deref().unwrap_or(DEFAULT_PARTITION)
    }
}

struct Row {
    partition: String,
    /// `%a`: up, down, drain or inact, as sinfo prints the partition's state.
    avail: &'static str,
    is_default: bool,
    /// Seconds; none is `infinite`.
    time_limit_s: Option<u64>,
    nodes: Vec<NodeInfo>,
}

fn value(row: &Row, code: char) -> String {
    let Some(first) = row.nodes.first() else { return empty_value(row, code) };
    let names: Vec<String> = row.nodes.iter().map(|n| n.name.clone()).collect();
    match code {
        'P' | 'R' | 'a' | 'l' => value_of_partition(row, code),
        'D' => row.nodes.len().to_string(),
        't' => node_state(first).0.into(),
        'T' => node_state(first).1.into(),
        'N' | 'n' => hostlist::compress(&names),
        'G' => gres_text(first),
        'E' => first.reason.clone().unwrap_or_else(|| "none".into()),
        'u' => "root".into(),
        'H' => "Unknown".into(),
        'F' => {
            let (mut a, mut i, mut o) = (0, 0, 0);
            for n in &row.nodes {
                match node_state(n).0 {
                    "alloc" | "mix" | "drng" => a += 1,
                    "idle" => i += 1,
                    _ => o += 1,
                }
            }
            format!("{a}/{i}/{o}/{}", row.nodes.len())
        }
        'c' | 'm' | 'C' | 'e' | 'O' => "N/A".into(),
        'f' => "(null)".into(),
        _ => String::new(),
    }
}

/// A field of a partition with no node, as sinfo 22.05 prints it (`empty up infinite 0 n/a`).
fn empty_value(row: &Row, code: char) -> String {
    match code {
        'P' | 'R' | 'a' | 'l' => value_of_partition(row, code),
        'D' => "0".into(),
        't' | 'T' => "n/a".into(),
        'F' => "0/0/0/0".into(),
        _ => String::new(),
    }
}

/// The fields that describe the partition itself, not its nodes.
fn value_of_partition(row: &Row, code: char) -> String {
    match code {
        'P' if row.is_default => format!("{}*", row.partition),
        'P' | 'R' => row.partition.clone(),
        'a' => row.avail.into(),
        'l' => row.time_limit_s.map_or_else(|| "infinite".into(), super::time::duration),
        _ => String::new(),
    }
}

fn head(code: char) -> String {
    match code {
        'P' | 'R' => "PARTITION",
        'a' => "AVAIL",
        'l' => "TIMELIMIT",
        'D' => "NODES",
        't' | 'T' => "STATE",
        'N' => "NODELIST",
        'n' => "HOSTNAMES",
        'G' => "GRES",
        'E' => "REASON",
        'u' => "USER",
        'H' => "TIMESTAMP",
        'F' => "NODES(A/I/O/T)",
        'c' => "CPUS",
        'm' => "MEMORY",
        'C' => "CPUS(A/I/O/T)",
        'e' => "FREE_MEM",
        'O' => "CPU_LOAD",
        'f' => "AVAIL_FEATURES",
        _ => "",
    }
    .to_string()
}

/// Which nodes to show.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub partitions: Vec<String>,
    /// Short or long state names (`idle`, `alloc`, `mix`, `down`, `drain`, ...).
    pub states: Vec<String>,
    pub nodes: Vec<String>,
    /// `-R`: only nodes that are down or drained.
    pub with_reason: bool,
}

/// A row of partition `p` holding `nodes`.
fn partition_row(parts: &Partitions, p: &str, nodes: Vec<NodeInfo>) -> Row {
    let avail = match parts.state(p) {
        proto::PartitionState::Up => "up",
        proto::PartitionState::Down => "down",
        proto::PartitionState::Drain => "drain",
        proto::PartitionState::Inactive => "inact",
    };
    Row {
        avail,
        is_default: p == parts.default_name(),
        time_limit_s: parts.max_time_limit_ms.get(p).map(|ms| ms / 1000),
        partition: p.to_string(),
        nodes,
    }
}

/// Renders sinfo's table: grouped by partition and every shown field (`-N`: one row per node).
pub fn table(nodes: &[NodeInfo], format: &str, header: bool, node_rows: bool, filter: &Filter) -> String {
    table_with(nodes, &Partitions::default(), format, header, node_rows, filter)
}

/// [`table`] with the partitions the policy defines.
pub fn table_with(nodes: &[NodeInfo], parts: &Partitions, format: &str, header: bool, node_rows: bool, filter: &Filter) -> String {
    let mut rows: Vec<Row> = Vec::new();
    let pieces_raw = parse_format(format);
    let group_codes: Vec<char> = pieces_raw
        .iter()
        .filter_map(|p| match p {
            Piece::Field { code, .. } if !matches!(code, 'N' | 'n' | 'D' | 'F') => Some(*code),
            _ => None,
        })
        .collect();
    for n in nodes {
        let (short, long) = node_state(n);
        if !filter.states.is_empty()
            && !filter.states.iter().any(|s| {
                let s = s.to_ascii_lowercase();
                let base = short.trim_end_matches('*');
                s == base
                    || s == long.trim_end_matches('*')
                    || (s == "allocated" && base == "alloc")
                    || (s == "mixed" && base == "mix")
                    || (s == "drained" && base == "drain")
                    || (s == "draining" && base == "drng")
            })
        {
            continue;
        }
        if !filter.nodes.is_empty() && !filter.nodes.contains(&n.name) {
            continue;
        }
        if filter.with_reason && n.state == NodeState::Up {
            continue;
        }
        for p in partitions_of(n) {
            if !filter.partitions.is_empty() && !filter.partitions.contains(&p) {
                continue;
            }
            let candidate = partition_row(parts, &p, vec![n.clone()]);
            let key: Vec<String> = group_codes.iter().map(|c| value(&candidate, *c)).collect();
            let existing = if node_rows {
                None
            } else {
                rows.iter_mut().find(|r| r.partition == p && group_codes.iter().map(|c| value(r, *c)).collect::<Vec<_>>() == key)
            };
            match existing {
                Some(r) => r.nodes.push(n.clone()),
                None => rows.push(candidate),
            }
        }
    }
    // A partition the policy defines with no node in it still has its row (sinfo's `0 n/a`),
    // unless the rows are per node or chosen by node.
    let by_node = node_rows || !filter.states.is_empty() || !filter.nodes.is_empty() || filter.with_reason;
    if !by_node {
        for name in parts.defs.keys() {
            let wanted = filter.partitions.is_empty() || filter.partitions.contains(name);
            if wanted && !rows.iter().any(|r| &r.partition == name) {
                rows.push(partition_row(parts, name, Vec::new()));
            }
        }
    }
    // `%#X`: as wide as the widest value or header.
    let format = widen(format, &rows);
    let pieces = parse_format(&format);
    render(&pieces, &rows, header, head, value)
}

fn widen(format: &str, rows: &[Row]) -> String {
    let mut out = format.to_string();
    for code in ['P', 'N', 'R', 'n'] {
        let pat = format!("%#{code}");
        if out.contains(&pat) {
            let w = rows.iter().map(|r| value(r, code).chars().count()).chain(std::iter::once(head(code).len())).max().unwrap_or(0);
            out = out.replace(&pat, &format!("%{w}{code}"));
        }
    }
    out
}

fn split_list(values: Vec<&str>) -> Vec<String> {
    values.iter().flat_map(|v| v.split(',')).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

pub fn run(args: &[String]) -> Result<i32, SlurmError> {
    let p = opts::parse(PROG, OPTIONS, args, false)?;
    if p.has("help") || p.has("usage") {
        println!("Usage: sinfo [-adelNRrsTv] [-i seconds] [-t states] [-p partition] [-n nodes] [-S fields] [-o format] [-O Format]");
        return Ok(0);
    }
    if p.has("version") {
        return Ok(super::print_version());
    }
    if p.has("Format") || p.has("iterate") {
        return Err(SlurmError::fatal(PROG, "--Format and --iterate are not supported yet; use -o"));
    }
    if p.has("json") {
        // As Slurm 22.05's: every node, whatever the filters, in the openapi/v0.0.38 shape.
        let cluster = super::connect(PROG)?;
        let mut nodes = super::block_on(PROG, super::list_nodes(PROG, &cluster))??;
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let items = nodes.iter().map(super::openapi::node).collect();
        let text = serde_json::to_string_pretty(&super::openapi::envelope(super::openapi::Version::V0038, "nodes", items))
            .map_err(|e| SlurmError::fatal(PROG, e))?;
        println!("{text}");
        return Ok(0);
    }
    let mut filter = Filter { partitions: split_list(p.all("partition")), states: split_list(p.all("states")), ..Filter::default() };
    for n in p.all("nodes") {
        filter.nodes.extend(hostlist::expand(n).map_err(|e| SlurmError::fatal(PROG, e))?);
    }
    if p.has("dead") {
        filter.states.extend(["down".to_string(), "drain".to_string()]);
    }
    filter.with_reason = p.has("list-reasons");
    let node_rows = p.has("Node");
    let format = if let Some(f) = p.last("format") {
        f.to_string()
    } else if filter.with_reason {
        REASON_FORMAT.to_string()
    } else if p.has("summarize") {
        SUMMARY_FORMAT.to_string()
    } else if node_rows {
        if p.has("long") {
            "%#N %.6D %#P %.11T %.12G %20E".to_string()
        } else {
            NODE_FORMAT.to_string()
        }
    } else if p.has("long") {
        LONG_FORMAT.to_string()
    } else {
        std::env::var("SINFO_FORMAT").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| DEFAULT_FORMAT.to_string())
    };
    let cluster = super::connect(PROG)?;
    let nodes = super::block_on(PROG, super::list_nodes(PROG, &cluster))??;
    let policy = super::block_on(PROG, super::get_policy(PROG, &cluster))??;
    let mut nodes = nodes;
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    print!("{}", table_with(&nodes, &Partitions::from_policy(&policy), &format, !p.has("noheader"), node_rows, &filter));
    Ok(0)
}
