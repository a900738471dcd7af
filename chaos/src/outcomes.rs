//! What a chaos run expects of each job it submitted, from what the job was asked to do:
//! requeue semantics and end states (`check_job_outcomes`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::ProcessSpan;

/// What the workload expects of a job it submitted.
#[derive(Clone, Debug)]
pub(crate) struct Submitted {
    pub(crate) requeue: bool,
    pub(crate) exit_code: i32,
    pub(crate) cancelled: bool,
    pub(crate) time_limited: bool,
    /// A command gang's ranks: no run may have more parts alive at once (a part repaired onto
    /// a spare never overlaps the one it replaced). `None`: not checked (a batch job's steps).
    pub(crate) ranks: Option<usize>,
}

/// Requeue semantics and expected end states, from what each job was asked to do.
pub(crate) fn check_job_outcomes(submitted: &BTreeMap<u64, Submitted>, jobs: &BTreeMap<u64, Value>, spans: &[ProcessSpan]) -> Vec<String> {
    let mut out = Vec::new();
    for (id, s) in submitted {
        let Some(j) = jobs.get(id) else { continue };
        let state = j["state"].as_str().unwrap_or("");
        let restarts = j["restart_count"].as_u64().unwrap_or(0);
        if state == "NODE_FAIL" && s.requeue {
            out.push(format!("job {id} asked for --requeue but ended NODE_FAIL"));
        }
        if restarts > 0 && !s.requeue {
            out.push(format!("job {id} did not ask for --requeue but was restarted {restarts} times"));
        }
        // A run whose process did not record its own end died with (or was fenced off) its node.
        // Spans of more than one run: the job was started again.
        let runs: BTreeSet<u32> = spans.iter().filter(|sp| sp.job == *id).map(|sp| sp.run).collect();
        let ran_again = runs.len() > 1;
        if s.cancelled || s.time_limited {
            continue;
        }
        match state {
            "COMPLETED" if s.exit_code != 0 => out.push(format!("job {id} should exit {} but ended COMPLETED", s.exit_code)),
            "FAILED" if s.exit_code == 0 => out.push(format!("job {id} exits 0 but ended FAILED: {}", j["reason"])),
            "CANCELLED" => {
                out.push(format!("job {id} ended CANCELLED but was never cancelled (a fenced run reported as killed?): {}", j["reason"]))
            }
            "TIMEOUT" => out.push(format!("job {id} ended TIMEOUT without a time limit")),
            _ => {}
        }
        if ran_again && restarts == 0 {
            out.push(format!("job {id} ran more than once but its restart_count is 0"));
        }
        if s.requeue && restarts > 0 && s.exit_code == 0 && state != "COMPLETED" {
            out.push(format!("requeued job {id} ended {state}, not COMPLETED"));
        }
    }
    out
}
