//! Fault injection and invariant checkers over recorded histories. Checkers are pure functions
//! of a history: they read what processes and clients recorded and report every violation.

mod deadline;
mod outcomes;
pub mod rig;
pub mod runner;
pub mod sim;

use std::collections::BTreeMap;

/// One job process's use of its GPUs, as the process itself recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpan {
    pub job: u64,
    pub run: u32,
    pub node: String,
    pub gpus: Vec<String>,
    pub start_ms: u64,
    /// None: still running (or died without recording its end).
    pub end_ms: Option<u64>,
    /// Process id of the job's shell, to check a span without an end is really gone.
    pub pid: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("gpu {gpu} on {node} held by job {a} and job {b} at once ({overlap_ms} ms overlap)")]
    SharedGpu { node: String, gpu: String, a: u64, b: u64, overlap_ms: u64 },
    #[error("job {job} ran on {node_a} (run {run_a}) and {node_b} (run {run_b}) at once")]
    TwiceAtOnce { job: u64, node_a: String, run_a: u32, node_b: String, run_b: u32 },
    #[error("term {term} had two leaders: {a} and {b}")]
    TwoLeaders { term: u64, a: String, b: String },
    #[error("job {job} ran {parts} parts of run {run} at once with {ranks} ranks: a rank ran twice")]
    RankTwice { job: u64, run: u32, parts: usize, ranks: usize },
}

fn overlap_ms(a: &ProcessSpan, b: &ProcessSpan) -> u64 {
    let a_end = a.end_ms.unwrap_or(u64::MAX);
    let b_end = b.end_ms.unwrap_or(u64::MAX);
    a_end.min(b_end).saturating_sub(a.start_ms.max(b.start_ms))
}

/// No GPU (by node and UUID) was held by two different jobs' processes at the same time.
pub fn check_exclusive_gpus(spans: &[ProcessSpan]) -> Vec<Violation> {
    let mut by_gpu: BTreeMap<(&str, &str), Vec<&ProcessSpan>> = BTreeMap::new();
    for s in spans {
        for g in &s.gpus {
            by_gpu.entry((s.node.as_str(), g.as_str())).or_default().push(s);
        }
    }
    let mut out = Vec::new();
    for ((node, gpu), mut users) in by_gpu {
        users.sort_by_key(|s| (s.start_ms, s.job));
        for (i, a) in users.iter().enumerate() {
            for b in &users[i + 1..] {
                if a.job == b.job {
                    continue;
                }
                let ms = overlap_ms(a, b);
                if ms > 0 {
                    out.push(Violation::SharedGpu { node: node.into(), gpu: gpu.into(), a: a.job, b: b.job, overlap_ms: ms });
                }
            }
        }
    }
    out
}

/// No two runs of one job overlapped in time (a gang's parts of the same run may).
pub fn check_never_twice(spans: &[ProcessSpan]) -> Vec<Violation> {
    let mut by_job: BTreeMap<u64, Vec<&ProcessSpan>> = BTreeMap::new();
    for s in spans {
        by_job.entry(s.job).or_default().push(s);
    }
    let mut out = Vec::new();
    for (job, runs) in by_job {
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                if a.run != b.run && overlap_ms(a, b) > 0 {
                    out.push(Violation::TwiceAtOnce { job, node_a: a.node.clone(), run_a: a.run, node_b: b.node.clone(), run_b: b.run });
                }
            }
        }
    }
    out
}

/// No run of a gang had more parts alive at once than the gang has ranks (`ranks(job)`; none:
/// not checked): the part a repair started on a spare never overlapped the one it replaced.
pub fn check_ranks_at_once(spans: &[ProcessSpan], ranks: impl Fn(u64) -> Option<usize>) -> Vec<Violation> {
    let mut by_run: BTreeMap<(u64, u32), Vec<(u64, i32)>> = BTreeMap::new();
    for s in spans {
        let events = by_run.entry((s.job, s.run)).or_default();
        events.push((s.start_ms, 1));
        events.push((s.end_ms.unwrap_or(u64::MAX), -1));
    }
    let mut out = Vec::new();
    for ((job, run), mut events) in by_run {
        let Some(ranks) = ranks(job) else { continue };
        // An end and a start at the same instant do not overlap.
        events.sort();
        let (mut alive, mut most) = (0i32, 0i32);
        for (_, change) in events {
            alive += change;
            most = most.max(alive);
        }
        if most as usize > ranks {
            out.push(Violation::RankTwice { job, run, parts: most as usize, ranks });
        }
    }
    out
}

/// At most one node claimed leadership of each term.
pub fn check_one_leader_per_term(observations: &[(u64, String)]) -> Vec<Violation> {
    let mut leader_of: BTreeMap<u64, &str> = BTreeMap::new();
    let mut out = Vec::new();
    for (term, leader) in observations {
        match leader_of.get(term) {
            Some(existing) if *existing != leader => {
                out.push(Violation::TwoLeaders { term: *term, a: existing.to_string(), b: leader.clone() })
            }
            _ => {
                leader_of.insert(*term, leader);
            }
        }
    }
    out
}

/// Parses the lines a test job writes: `start MS JOB RUN NODE GPUS PID` and `end MS JOB RUN
/// NODE ...` (GPUS is a comma list, `-` for none; PID is optional).
pub fn parse_spans(text: &str) -> Vec<ProcessSpan> {
    let mut spans: Vec<ProcessSpan> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["start", ms, job, run, node, rest @ ..] => {
                let (Ok(ms), Ok(job), Ok(run)) = (ms.parse(), job.parse(), run.parse()) else { continue };
                let gpus = rest
                    .first()
                    .map(|g| g.split(',').filter(|s| !s.is_empty() && *s != "-").map(String::from).collect())
                    .unwrap_or_default();
                let pid = rest.get(1).and_then(|p| p.parse().ok());
                spans.push(ProcessSpan { job, run, node: node.to_string(), gpus, start_ms: ms, end_ms: None, pid });
            }
            ["end", ms, job, run, node, ..] => {
                let (Ok(ms), Ok(job), Ok(run)) = (ms.parse::<u64>(), job.parse::<u64>(), run.parse::<u32>()) else { continue };
                if let Some(s) = spans.iter_mut().rev().find(|s| s.job == job && s.run == run && s.node == *node && s.end_ms.is_none()) {
                    s.end_ms = Some(ms);
                }
            }
            _ => {}
        }
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(job: u64, run: u32, node: &str, gpus: &[&str], start_ms: u64, end_ms: Option<u64>) -> ProcessSpan {
        ProcessSpan { job, run, node: node.into(), gpus: gpus.iter().map(|g| g.to_string()).collect(), start_ms, end_ms, pid: None }
    }

    #[test]
    fn a_repaired_rank_may_follow_the_part_it_replaces_but_never_overlap_it() {
        let two = |_| Some(2);
        // Rank 1 lost on b at 100, started on the spare c at 100: never three at once.
        let repaired = [span(1, 1, "a", &[], 0, None), span(1, 1, "b", &[], 0, Some(100)), span(1, 1, "c", &[], 100, None)];
        assert!(check_ranks_at_once(&repaired, two).is_empty());
        let early = [span(1, 1, "a", &[], 0, None), span(1, 1, "b", &[], 0, Some(100)), span(1, 1, "c", &[], 99, None)];
        assert_eq!(check_ranks_at_once(&early, two), vec![Violation::RankTwice { job: 1, run: 1, parts: 3, ranks: 2 }]);
        assert!(check_ranks_at_once(&early, |_| None).is_empty(), "a job it cannot size is not checked");
    }

    #[test]
    fn shared_gpu_found_and_back_to_back_allowed() {
        let ok = [span(1, 1, "n1", &["g0"], 0, Some(100)), span(2, 1, "n1", &["g0"], 100, Some(200)), span(3, 1, "n2", &["g0"], 50, None)];
        assert!(check_exclusive_gpus(&ok).is_empty());
        let bad = [span(1, 1, "n1", &["g0", "g1"], 0, Some(100)), span(2, 1, "n1", &["g1"], 60, None)];
        assert_eq!(
            check_exclusive_gpus(&bad),
            vec![Violation::SharedGpu { node: "n1".into(), gpu: "g1".into(), a: 1, b: 2, overlap_ms: 40 }]
        );
    }

    #[test]
    fn runs_of_one_job_never_overlap() {
        let gang = [span(1, 1, "n1", &[], 0, Some(100)), span(1, 1, "n2", &[], 0, Some(100)), span(1, 2, "n3", &[], 100, None)];
        assert!(check_never_twice(&gang).is_empty());
        let twice = [span(1, 1, "n1", &[], 0, None), span(1, 2, "n3", &[], 100, Some(200))];
        assert_eq!(check_never_twice(&twice).len(), 1);
    }

    #[test]
    fn leaders_and_span_parsing() {
        assert!(check_one_leader_per_term(&[(1, "a".into()), (1, "a".into()), (2, "b".into())]).is_empty());
        assert_eq!(check_one_leader_per_term(&[(3, "a".into()), (3, "b".into())]).len(), 1);
        let spans = parse_spans("start 10 7 1 n1 GPU-a,GPU-b 4242\nnoise\nend 20 7 1 n1 GPU-a,GPU-b 4242\nstart 30 8 2 n2 -\n");
        let mut first = span(7, 1, "n1", &["GPU-a", "GPU-b"], 10, Some(20));
        first.pid = Some(4242);
        assert_eq!(spans, vec![first, span(8, 2, "n2", &[], 30, None)]);
    }
}
