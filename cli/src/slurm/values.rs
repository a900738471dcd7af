//! The values of `sbatch`'s options (also `srun`'s and `salloc`'s) as Slurm reads them: GRES
//! and GPU counts, arrays, signals, dependencies, node counts and ranges, numbers, memory sizes
//! and `--switches`. Pure.

use std::collections::BTreeMap;

use proto::{ArraySpec, Dependency, DependencyKind, GresKind, GresRequest, SignalSpec};

use super::{time, SlurmError};

/// `[TYPE:]N` of `--gpus`, `--gpus-per-node`, `--gpus-per-task`.
pub(super) fn parse_gpu_count(text: &str) -> Option<(Option<String>, u32)> {
    let t = text.strip_prefix("gpu:").unwrap_or(text);
    match t.rsplit_once(':') {
        Some((ty, n)) if !ty.is_empty() && !ty.contains(':') => Some((Some(ty.to_string()), n.parse().ok().filter(|&n| n > 0)?)),
        Some(_) => None,
        None => Some((None, t.parse().ok().filter(|&n| n > 0)?)),
    }
}

/// `--constraint`: `a&b` (or `a,b`), every feature; `a|b`, any one on each node (one element
/// `a|b`, [`proto::feature_matches`]). Brackets, counts (`a*2`) and a mix of `&` and `|` are
/// Slurm's too, but not Corral's: `None`, refused.
pub(super) fn parse_constraint(text: &str) -> Option<Vec<String>> {
    if text.contains(['[', ']', '*']) || (text.contains('|') && text.contains(['&', ','])) {
        return None;
    }
    if text.contains('|') {
        let alts: Vec<&str> = text.split('|').map(str::trim).collect();
        return (!alts.iter().any(|a| a.is_empty())).then(|| vec![alts.join("|")]);
    }
    Some(text.split(['&', ',']).map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect())
}

/// `--gres`: `gpu`, `gpu:N`, `gpu:TYPE`, `gpu:TYPE:N` (also `gres/gpu...`), or the same of
/// `shard` (shards of one GPU), comma-separated, one of them. Anything else is refused as Slurm
/// refuses unknown GRES.
pub fn parse_gres(text: &str) -> Result<Option<GresRequest>, String> {
    let bad = || "Batch job submission failed: Invalid generic resource (gres) specification".to_string();
    let mut found: Option<GresRequest> = None;
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let item = item.strip_prefix("gres/").unwrap_or(item);
        let item = item.strip_prefix("gres:").unwrap_or(item);
        if item.eq_ignore_ascii_case("none") {
            continue;
        }
        let parts: Vec<&str> = item.split(':').collect();
        let (kind, rest) = match parts.split_first() {
            Some((&"gpu", rest)) => (GresKind::Gpu, rest),
            Some((&"shard", rest)) => (GresKind::Shard, rest),
            _ => return Err(bad()),
        };
        let (gpu_type, count) = match rest {
            [] => (None, 1),
            [n] if n.bytes().all(|b| b.is_ascii_digit()) => (None, n.parse().map_err(|_| bad())?),
            [t] => (Some((*t).to_string()), 1),
            [t, n] if !t.is_empty() => (Some((*t).to_string()), n.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        if count == 0 || found.is_some() {
            return Err(bad());
        }
        found = Some(GresRequest { gpu_type, count, kind });
    }
    Ok(found)
}

/// Largest array index (Slurm's largest `MaxArraySize` less one).
pub const ARRAY_TASK_ID_MAX: u32 = 4_000_000;

/// `--array`: `1-100`, `0-15:4`, `1,3,7`, any mix, with an optional `%N` throttle.
pub fn parse_array(text: &str) -> Option<ArraySpec> {
    let (list, throttle) = match text.split_once('%') {
        Some((l, t)) => (l, Some(t.parse::<u32>().ok().filter(|&t| t > 0)?)),
        None => (text, None),
    };
    let mut tasks = Vec::new();
    for item in list.split(',') {
        let (range, step) = match item.split_once(':') {
            Some((r, s)) => (r, s.parse::<u32>().ok().filter(|&s| s > 0)?),
            None => (item, 1),
        };
        let (lo, hi) = match range.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?),
            None => {
                let n = range.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if hi < lo || hi > ARRAY_TASK_ID_MAX || tasks.len() + ((hi - lo) / step) as usize >= proto::limits::ARRAY_TASKS_MAX {
            return None;
        }
        tasks.extend((lo..=hi).step_by(step as usize));
    }
    tasks.sort_unstable();
    tasks.dedup();
    let spec = ArraySpec::from_ids(&tasks, throttle);
    spec.validate().is_ok().then_some(spec)
}

/// Signal names and numbers `--signal` and `scancel --signal` accept.
pub fn parse_signal_name(text: &str) -> Option<i32> {
    if let Ok(n) = text.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let upper = text.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    Some(match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "ABRT" => libc::SIGABRT,
        "KILL" => libc::SIGKILL,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "URG" => libc::SIGURG,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "TTIN" => libc::SIGTTIN,
        "TTOU" => libc::SIGTTOU,
        "XCPU" => libc::SIGXCPU,
        _ => return None,
    })
}

/// `--signal=[{R|B}:]SIG[@SECONDS]` (60 s by default).
pub fn parse_signal(text: &str) -> Option<SignalSpec> {
    let (batch_only, rest) = match text.split_once(':') {
        Some(("B", r)) => (true, r),
        Some(("R", r)) | Some(("RB", r)) | Some(("BR", r)) => (text.starts_with('B') || text.starts_with("RB"), r),
        Some(_) => return None,
        None => (false, text),
    };
    let (sig, secs) = match rest.split_once('@') {
        Some((s, t)) => (s, t.parse::<u32>().ok().filter(|&t| t <= 0xffff)?),
        None => (rest, 60),
    };
    Some(SignalSpec { signal: parse_signal_name(sig)?, before_end_s: secs, batch_only })
}

/// `--dependency`: `after|afterok|afternotok|afterany:ID[:ID...]` and `singleton`, joined by
/// `,` (all must hold). A bare id means `afterany`.
pub fn parse_dependencies(text: &str) -> Option<Vec<Dependency>> {
    if text.contains('?') {
        return None;
    }
    let mut out = Vec::new();
    for item in text.split(',').filter(|s| !s.is_empty()) {
        if item.eq_ignore_ascii_case("singleton") {
            out.push(Dependency { kind: DependencyKind::Singleton, job: None });
            continue;
        }
        let mut parts = item.split(':');
        let first = parts.next()?;
        let (kind, ids): (DependencyKind, Vec<&str>) = match first.to_ascii_lowercase().as_str() {
            "after" => (DependencyKind::After, parts.collect()),
            "afterok" => (DependencyKind::AfterOk, parts.collect()),
            "afternotok" => (DependencyKind::AfterNotOk, parts.collect()),
            "afterany" => (DependencyKind::AfterAny, parts.collect()),
            _ if first.bytes().all(|b| b.is_ascii_digit()) => (DependencyKind::AfterAny, std::iter::once(first).chain(parts).collect()),
            _ => return None,
        };
        if ids.is_empty() {
            return None;
        }
        for id in ids {
            let id: u64 = id.parse().ok().filter(|&n| n > 0)?;
            out.push(Dependency { kind, job: Some(id) });
        }
    }
    (!out.is_empty()).then_some(out)
}

/// `--nodes`: `N` or `MIN-MAX`.
pub(crate) fn parse_nodes(text: &str) -> Result<(u32, u32), String> {
    let one = |s: &str| -> Result<u32, String> {
        let t = s.trim();
        let (digits, mult) = match t.strip_suffix(['k', 'K']) {
            Some(d) => (d, 1024),
            None => (t, 1),
        };
        digits.parse::<u32>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(|| format!("\"{s}\" is not a valid node count"))
    };
    let (min, max) = match text.split_once('-') {
        Some((lo, hi)) => (one(lo)?.max(1), one(hi)?),
        None => {
            let n = one(text)?;
            (n, n)
        }
    };
    if max < min {
        return Err(format!("Maximum node count {max} is less than minimum node count {min}"));
    }
    Ok((min, max))
}

/// Slurm's `parse_int`: a positive integer.
pub fn parse_int(prog: &str, name: &str, text: &str) -> Result<u32, SlurmError> {
    match text.trim().parse::<i64>() {
        Ok(n) if n > 0 && n <= i64::from(i32::MAX) => Ok(n as u32),
        Ok(n) if n > i64::from(i32::MAX) => Err(SlurmError::fatal(prog, format!("Numeric argument ({n}) too large for {name}."))),
        _ => Err(SlurmError::fatal(prog, format!("Invalid numeric value \"{text}\" for {name}."))),
    }
}

/// Memory sizes: a number with an optional K, M, G or T suffix; MiB when bare.
pub fn parse_mem_mib(text: &str) -> Option<u64> {
    crate::units::parse_mem_mib(text).ok()
}

/// `--switches=COUNT[@WAIT]`: the count and the longest wait for it in milliseconds (0 when
/// not given); `None` when either part is not valid.
pub(super) fn parse_switches(text: &str) -> Option<(u32, u64)> {
    let (count, wait) = match text.split_once('@') {
        Some((c, w)) => (c, Some(w)),
        None => (text, None),
    };
    let count: u32 = count.parse().ok()?;
    let wait_s = match wait {
        Some(w) => time::parse_limit_s(w).ok()?.unwrap_or(0),
        None => 0,
    };
    Some((count, wait_s.saturating_mul(1000)))
}

/// The least and most nodes of `--nodes` (`(least, most)`, equal without a range) and the tasks
/// per node, given `--ntasks` and `--ntasks-per-node`, as Slurm counts them: fewer tasks than
/// the least lower it ("can't run N processes on M nodes, setting nnodes to N"), a range's most
/// is at most the tasks (each node runs one at least), and tasks per node are counted on the
/// least.
pub(super) fn node_and_task_counts(nodes: (u32, u32), ntasks: Option<u32>, ntasks_per_node: Option<u32>) -> (u32, u32, u32) {
    let (mut least, most) = (nodes.0.max(1), nodes.1);
    let per_node = match (ntasks_per_node, ntasks) {
        (Some(n), _) => n,
        (None, Some(total)) => {
            least = least.min(total);
            total.div_ceil(least)
        }
        (None, None) => 1,
    };
    (least, most.min(ntasks.unwrap_or(u32::MAX)).max(least), per_node)
}

/// Corral's own options of `sbatch`, `salloc` and `srun` (and `#SBATCH`), kept in the job's
/// `extra`: `--spare-nodes=N` (`JobSpec::spare_nodes`) and `--rdzv-endpoint=HOST:PORT|corral`
/// (`JobSpec::rdzv_endpoint`, `JobSpec::corral_store`, checked with the spec); false for any
/// other option.
pub(super) fn corral_option(prog: &str, name: &str, value: &str, extra: &mut BTreeMap<String, String>) -> Result<bool, SlurmError> {
    match name {
        "spare-nodes" => {
            let n = parse_int(prog, "--spare-nodes", value)?;
            extra.insert(proto::SPEC_EXTRA_SPARE_NODES.into(), n.to_string());
        }
        "rdzv-endpoint" => {
            extra.insert(proto::SPEC_EXTRA_RDZV_ENDPOINT.into(), value.to_string());
        }
        _ => return Ok(false),
    }
    Ok(true)
}
