//! Job traces a replay reads: Microsoft Philly (the whole trace's one-row-per-job CSV, or a
//! slice with job shapes and user-like limits), a cluster's own history as `sacct -P` or
//! `sacct --json` prints it (Corral's or Slurm's), and FGD/openb pod lists.

use anyhow::{anyhow, bail, Context};
use serde_json::Value;

/// One job of a trace, shaped for the replay's nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceJob {
    /// The trace's own id (a row number where it has none).
    pub id: u64,
    pub submit_ms: u64,
    /// How long it ran (ended by itself, or by its limit when shorter).
    pub duration_ms: u64,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub cpus_per_node: u32,
    pub mem_per_node_mib: u64,
    pub limit_ms: Option<u64>,
    pub user: String,
}

impl TraceJob {
    pub fn gpus(&self) -> u32 {
        self.nodes * self.gpus_per_node
    }
}

/// CPUs a job of a trace without CPU counts asks per GPU (and for a job without GPUs).
pub const CPUS_PER_GPU: u32 = 4;

/// A comma- or pipe-separated table whose header names the columns; `wanted` are found by name.
pub(crate) struct Csv<'a> {
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
    sep: char,
    cols: Vec<usize>,
    wanted: Vec<String>,
    fields: Vec<&'a str>,
    line_no: usize,
}

impl<'a> Csv<'a> {
    pub(crate) fn new(text: &'a str, wanted: &[&str]) -> anyhow::Result<Csv<'a>> {
        Csv::with_sep(text, ',', wanted)
    }

    pub(crate) fn with_sep(text: &'a str, sep: char, wanted: &[&str]) -> anyhow::Result<Csv<'a>> {
        let mut lines = text.lines().enumerate();
        let (_, header) = lines.next().ok_or_else(|| anyhow!("the trace is empty"))?;
        let names: Vec<String> = header.split(sep).map(|h| h.trim().to_ascii_lowercase()).collect();
        let cols = wanted
            .iter()
            .map(|w| {
                names
                    .iter()
                    .position(|n| n == &w.to_ascii_lowercase())
                    .ok_or_else(|| anyhow!("the trace has no column '{w}' (it has {header})"))
            })
            .collect::<anyhow::Result<Vec<usize>>>()?;
        Ok(Csv { lines, sep, cols, wanted: wanted.iter().map(|w| w.to_string()).collect(), fields: Vec::new(), line_no: 1 })
    }

    /// The next non-empty row, or `None` at the end.
    pub(crate) fn next_row(&mut self) -> anyhow::Result<Option<&Self>> {
        for (i, line) in self.lines.by_ref() {
            if line.trim().is_empty() {
                continue;
            }
            self.line_no = i + 1;
            self.fields = line.split(self.sep).collect();
            if let Some(&c) = self.cols.iter().find(|&&c| c >= self.fields.len()) {
                bail!("line {}: {} fields, column {} missing", self.line_no, self.fields.len(), c + 1);
            }
            return Ok(Some(self));
        }
        Ok(None)
    }

    /// The `k`-th wanted column of the current row.
    pub(crate) fn get(&self, k: usize) -> &'a str {
        self.fields[self.cols[k]].trim()
    }

    pub(crate) fn num(&self, k: usize) -> anyhow::Result<f64> {
        let text = self.get(k);
        let v: f64 = text.parse().map_err(|_| anyhow!("line {}: column '{}' is not a number: '{text}'", self.line_no, self.wanted[k]))?;
        if !v.is_finite() || v < 0.0 {
            bail!("line {}: column '{}' must be a finite number >= 0, not '{text}'", self.line_no, self.wanted[k]);
        }
        Ok(v)
    }
}

/// Nodes and GPUs per node for `gpus` GPUs on nodes of `per_node_max`: as few nodes as hold
/// them, raised until the count divides evenly (12 on 8-GPU nodes: 2 x 6), as the Philly
/// slices are shaped.
pub fn shape(gpus: u32, per_node_max: u32) -> (u32, u32) {
    if gpus == 0 {
        return (1, 0);
    }
    let per_node_max = per_node_max.max(1);
    let mut nodes = gpus.div_ceil(per_node_max);
    while !gpus.is_multiple_of(nodes) {
        nodes += 1;
    }
    (nodes, gpus / nodes)
}

/// A user-like time limit for a run of `duration_s`: the smallest of 0.5, 1, 4, 12, 24, 72 and
/// 168 hours that covers it, else whole days (the Philly slices' `limit_bucket_s`).
pub fn limit_bucket_s(duration_s: f64) -> f64 {
    const BUCKETS_H: [f64; 7] = [0.5, 1.0, 4.0, 12.0, 24.0, 72.0, 168.0];
    BUCKETS_H.iter().map(|h| h * 3600.0).find(|&b| b >= duration_s).unwrap_or_else(|| (duration_s / 86_400.0).ceil() * 86_400.0)
}

fn ms(seconds: f64) -> u64 {
    (seconds * 1000.0).round() as u64
}

/// A Philly CSV: a slice (`job,submit_s,duration_s,num_gpus,nodes,gpus_per_node,limit_bucket_s,vc`)
/// or the whole trace (`timestamp,duration,num_gpus,gpu_time,cluster`, shaped here for nodes of
/// `per_node_max` GPUs, submissions counted from the first). In submission order.
pub fn philly(text: &str, per_node_max: u32) -> anyhow::Result<Vec<TraceJob>> {
    let header = text.lines().next().unwrap_or_default();
    let mut jobs = Vec::new();
    if header.split(',').any(|h| h.trim() == "submit_s") {
        let mut rows = Csv::new(text, &["job", "submit_s", "duration_s", "num_gpus", "nodes", "gpus_per_node", "limit_bucket_s", "vc"])?;
        while let Some(r) = rows.next_row()? {
            let (nodes, per_node) = (r.num(4)? as u32, r.num(5)? as u32);
            if nodes == 0 || nodes * per_node != r.num(3)? as u32 {
                bail!("line {}: {nodes} nodes x {per_node} GPUs is not num_gpus {}", r.line_no, r.get(3));
            }
            let gpus = nodes * per_node;
            jobs.push(TraceJob {
                id: r.num(0)? as u64,
                submit_ms: ms(r.num(1)?),
                duration_ms: ms(r.num(2)?).max(1),
                nodes,
                gpus_per_node: per_node,
                cpus_per_node: CPUS_PER_GPU * per_node.max(1),
                mem_per_node_mib: 0,
                limit_ms: Some(ms(r.num(6)?)),
                user: r.get(7).to_string(),
            });
            let _ = gpus;
        }
    } else {
        let mut rows = Csv::new(text, &["timestamp", "duration", "num_gpus", "cluster"])?;
        let mut raw = Vec::new();
        while let Some(r) = rows.next_row()? {
            let at = parse_datetime_s(r.get(0)).with_context(|| format!("line {}", r.line_no))?;
            raw.push((at, r.num(1)?, r.num(2)? as u32, r.get(3).to_string()));
        }
        let first = raw.iter().map(|r| r.0).min().unwrap_or(0);
        raw.sort_by_key(|r| r.0);
        for (i, (at, duration_s, gpus, vc)) in raw.into_iter().enumerate() {
            let (nodes, per_node) = shape(gpus, per_node_max);
            let duration_s = duration_s.max(1.0);
            jobs.push(TraceJob {
                id: i as u64,
                submit_ms: (at - first) as u64 * 1000,
                duration_ms: ms(duration_s),
                nodes,
                gpus_per_node: per_node,
                cpus_per_node: CPUS_PER_GPU * per_node.max(1),
                mem_per_node_mib: 0,
                limit_ms: Some(ms(limit_bucket_s(duration_s))),
                user: vc,
            });
        }
    }
    jobs.sort_by_key(|j| (j.submit_ms, j.id));
    Ok(jobs)
}

/// Seconds since 1970 of `YYYY-MM-DD HH:MM:SS` or `YYYY-MM-DDTHH:MM:SS` (UTC).
pub fn parse_datetime_s(text: &str) -> anyhow::Result<i64> {
    let bad = || anyhow!("not a date and time: '{text}'");
    let (date, time) = text.split_once([' ', 'T']).ok_or_else(bad)?;
    let d: Vec<i64> = date.split('-').map(|p| p.parse().map_err(|_| bad())).collect::<anyhow::Result<_>>()?;
    let t: Vec<i64> = time.split(':').map(|p| p.parse().map_err(|_| bad())).collect::<anyhow::Result<_>>()?;
    let ([y, m, day], [hh, mm, ss]) = (d.as_slice(), t.as_slice()) else { return Err(bad()) };
    if !(1..=12).contains(m) || !(1..=31).contains(day) || *hh > 23 || *mm > 59 || *ss > 60 {
        return Err(bad());
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if *m <= 2 { y - 1 } else { *y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Ok(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// `[D-]HH:MM:SS`, `MM:SS` or minutes, as sacct prints elapsed times and limits, in seconds;
/// `None` for `UNLIMITED`, `Partition_Limit`, `INVALID` or empty.
pub fn parse_slurm_duration_s(text: &str) -> anyhow::Result<Option<u64>> {
    let t = text.trim();
    if t.is_empty() || ["UNLIMITED", "Partition_Limit", "INVALID", "NONE"].contains(&t) {
        return Ok(None);
    }
    let bad = || anyhow!("not a duration: '{text}'");
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().map_err(|_| bad())?, r),
        None => (0, t),
    };
    let parts: Vec<u64> = rest.split(':').map(|p| p.parse().map_err(|_| bad())).collect::<anyhow::Result<_>>()?;
    let s = match parts.as_slice() {
        [m] if days == 0 => m * 60,
        [h] => h * 3600,
        [m, s] if days == 0 => m * 60 + s,
        [h, m] => h * 3600 + m * 60,
        [h, m, s] => h * 3600 + m * 60 + s,
        _ => return Err(bad()),
    };
    Ok(Some(days * 86_400 + s))
}

/// GPUs in a TRES list (`cpu=4,gres/gpu=2,gres/gpu:h100=2,node=1`): the untyped count, else the
/// sum of the typed ones.
fn tres_gpus(tres: &str) -> u32 {
    let mut untyped = None;
    let mut typed = 0;
    for kv in tres.split(',') {
        let Some((k, v)) = kv.split_once('=') else { continue };
        let Ok(n) = v.parse::<u32>() else { continue };
        if k == "gres/gpu" {
            untyped = Some(n);
        } else if k.starts_with("gres/gpu:") {
            typed += n;
        }
    }
    untyped.unwrap_or(typed)
}

/// A cluster's history as `sacct -P -o JobID,Submit,Elapsed,Timelimit,NNodes,AllocTRES,User`
/// prints it (any column order, more columns allowed; `ReqTRES` where `AllocTRES` is absent;
/// `|`-separated with its header). Steps (`ID.batch`, `ID.N`) and jobs that never ran are
/// left out; returns the jobs and how many were left out.
pub fn sacct_parsable(text: &str) -> anyhow::Result<(Vec<TraceJob>, usize)> {
    let header = text.lines().next().unwrap_or_default();
    let tres_col = if header.split('|').any(|h| h.eq_ignore_ascii_case("AllocTRES")) { "AllocTRES" } else { "ReqTRES" };
    let mut rows = Csv::with_sep(text, '|', &["JobID", "Submit", "Elapsed", "Timelimit", "NNodes", tres_col, "User"])?;
    let mut jobs = Vec::new();
    let mut skipped = 0;
    while let Some(r) = rows.next_row()? {
        if r.get(0).contains('.') {
            continue;
        }
        let elapsed = parse_slurm_duration_s(r.get(2))?.unwrap_or(0);
        let Ok(submit) = parse_datetime_s(r.get(1)) else {
            skipped += 1;
            continue;
        };
        let nodes: u32 = r.get(4).parse().unwrap_or(0);
        if elapsed == 0 || nodes == 0 {
            skipped += 1;
            continue;
        }
        let gpus = tres_gpus(r.get(5));
        jobs.push(TraceJob {
            id: r.get(0).split(['_', '+']).next().unwrap_or_default().parse().unwrap_or(jobs.len() as u64),
            submit_ms: submit.max(0) as u64 * 1000,
            duration_ms: elapsed * 1000,
            nodes,
            gpus_per_node: gpus / nodes,
            cpus_per_node: CPUS_PER_GPU * (gpus / nodes).max(1),
            mem_per_node_mib: 0,
            limit_ms: parse_slurm_duration_s(r.get(3))?.map(|s| s * 1000),
            user: r.get(6).to_string(),
        });
    }
    Ok((rebase(jobs), skipped))
}

/// A cluster's history as `sacct --json` prints it (`dbv0.0.38` jobs, Corral's or Slurm's).
pub fn sacct_json(text: &str) -> anyhow::Result<(Vec<TraceJob>, usize)> {
    let doc: Value = serde_json::from_str(text).context("read sacct --json output")?;
    let list = doc.get("jobs").and_then(Value::as_array).ok_or_else(|| anyhow!("sacct --json output has no 'jobs' list"))?;
    let mut jobs = Vec::new();
    let mut skipped = 0;
    for j in list {
        let num = |v: Option<&Value>| v.and_then(|v| v.as_u64().or_else(|| v.get("number").and_then(Value::as_u64)));
        let time = j.get("time");
        let elapsed = num(time.and_then(|t| t.get("elapsed"))).unwrap_or(0);
        let nodes = num(j.get("allocation_nodes")).unwrap_or(0) as u32;
        let Some(submit) = num(time.and_then(|t| t.get("submission"))) else {
            skipped += 1;
            continue;
        };
        if elapsed == 0 || nodes == 0 {
            skipped += 1;
            continue;
        }
        let tres = j.get("tres").and_then(|t| t.get("allocated")).and_then(Value::as_array).cloned().unwrap_or_default();
        let gpus: u64 = tres
            .iter()
            .filter(|t| {
                t.get("type").and_then(Value::as_str) == Some("gres")
                    && t.get("name").and_then(Value::as_str).is_some_and(|n| n.starts_with("gpu"))
            })
            .filter_map(|t| t.get("count").and_then(Value::as_u64))
            .max()
            .unwrap_or(0);
        let limit_min = num(time.and_then(|t| t.get("limit")));
        jobs.push(TraceJob {
            id: num(j.get("job_id")).unwrap_or(jobs.len() as u64),
            submit_ms: submit * 1000,
            duration_ms: elapsed * 1000,
            nodes,
            gpus_per_node: gpus as u32 / nodes,
            cpus_per_node: CPUS_PER_GPU * (gpus as u32 / nodes).max(1),
            mem_per_node_mib: 0,
            limit_ms: limit_min.map(|m| m * 60_000),
            user: j.get("user").and_then(Value::as_str).unwrap_or("user").to_string(),
        });
    }
    Ok((rebase(jobs), skipped))
}

/// Submission times from the first, in submission order.
fn rebase(mut jobs: Vec<TraceJob>) -> Vec<TraceJob> {
    let first = jobs.iter().map(|j| j.submit_ms).min().unwrap_or(0);
    for j in &mut jobs {
        j.submit_ms -= first;
    }
    jobs.sort_by_key(|j| (j.submit_ms, j.id));
    jobs
}

/// One task of an FGD/openb pod list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    pub cpus_milli: u32,
    pub mem_mib: u64,
    pub gpus: u32,
    /// Thousandths of one GPU when `gpus` is 1 (1000: the whole GPU).
    pub gpu_milli: u32,
    /// GPU models it may run on (`gpu_spec`), lower case; empty: any.
    pub models: Vec<String>,
}

impl Pod {
    /// What it asks of GPUs, in thousandths (FGD's count of demand and allocation).
    pub fn gpu_milli_total(&self) -> u64 {
        if self.gpus == 1 {
            u64::from(self.gpu_milli.min(1000))
        } else {
            u64::from(self.gpus) * 1000
        }
    }
}

/// An FGD/openb pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,...]`).
pub fn openb_pods(text: &str) -> anyhow::Result<Vec<Pod>> {
    let has_spec = text.lines().next().is_some_and(|h| h.split(',').any(|c| c.trim() == "gpu_spec"));
    let mut wanted = vec!["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"];
    if has_spec {
        wanted.push("gpu_spec");
    }
    let mut rows = Csv::new(text, &wanted)?;
    let mut pods = Vec::new();
    while let Some(r) = rows.next_row()? {
        let models =
            if has_spec { r.get(5).split('|').filter(|m| !m.is_empty()).map(str::to_ascii_lowercase).collect() } else { Vec::new() };
        pods.push(Pod {
            name: r.get(0).to_string(),
            cpus_milli: r.num(1)? as u32,
            mem_mib: r.num(2)? as u64,
            gpus: r.num(3)? as u32,
            gpu_milli: r.num(4)? as u32,
            models,
        });
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_the_slices() {
        assert_eq!(shape(1, 8), (1, 1));
        assert_eq!(shape(8, 8), (1, 8));
        assert_eq!(shape(12, 8), (2, 6));
        assert_eq!(shape(24, 8), (3, 8));
        assert_eq!(shape(32, 8), (4, 8));
    }

    #[test]
    fn limits_are_bucketed() {
        assert_eq!(limit_bucket_s(80.0), 1800.0);
        assert_eq!(limit_bucket_s(10_789.0), 14_400.0);
        assert_eq!(limit_bucket_s(700_000.0), 9.0 * 86_400.0);
    }

    #[test]
    fn dates_and_durations_parse() {
        assert_eq!(parse_datetime_s("1970-01-02 00:00:01").unwrap(), 86_401);
        assert_eq!(parse_datetime_s("2017-10-22T00:01:55").unwrap(), 1_508_630_515);
        assert!(parse_datetime_s("2017-13-22 00:00:00").is_err());
        assert_eq!(parse_slurm_duration_s("1-02:03:04").unwrap(), Some(93_784));
        assert_eq!(parse_slurm_duration_s("00:10:00").unwrap(), Some(600));
        assert_eq!(parse_slurm_duration_s("UNLIMITED").unwrap(), None);
        assert!(parse_slurm_duration_s("ten").is_err());
    }

    #[test]
    fn sacct_parsable_keeps_jobs_that_ran() {
        let text = "JobID|Submit|Elapsed|Timelimit|NNodes|AllocTRES|User\n\
                    7|2026-01-01T00:00:10|00:01:00|00:10:00|2|cpu=8,gres/gpu=4,node=2|ann\n\
                    7.batch|2026-01-01T00:00:10|00:01:00||1||\n\
                    8|2026-01-01T00:00:00|00:00:00|00:10:00|0||bob\n\
                    9|2026-01-01T00:00:00|00:02:00|UNLIMITED|1|gres/gpu:h100=1|bob\n";
        let (jobs, skipped) = sacct_parsable(text).unwrap();
        assert_eq!(skipped, 1);
        assert_eq!(jobs.len(), 2);
        assert_eq!((jobs[0].id, jobs[0].submit_ms, jobs[0].gpus_per_node, jobs[0].limit_ms), (9, 0, 1, None));
        assert_eq!((jobs[1].id, jobs[1].submit_ms, jobs[1].nodes, jobs[1].gpus_per_node), (7, 10_000, 2, 2));
        assert_eq!(jobs[1].limit_ms, Some(600_000));
    }

    #[test]
    fn a_bad_row_is_an_error_with_its_line() {
        let text = "job,submit_s,duration_s,num_gpus,nodes,gpus_per_node,limit_bucket_s,vc\n0,1,2,3,1,3,60,a\n1,x,2,1,1,1,60,a\n";
        let err = philly(text, 8).unwrap_err().to_string();
        assert!(err.contains("line 3") && err.contains("submit_s"), "{err}");
    }
}
