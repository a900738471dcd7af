//! What a replay measured, as the README defines each figure.
//!
//! - `gpu_alloc_pct`: GPUs held by jobs, time-averaged from the first submission to the last
//!   (the window the trace offers its load in; the tail of long jobs after it is in the
//!   makespan), in % of the cluster's; `gpu_alloc_when_fits_pct`: the same over the time a queued job
//!   asked no more GPUs than were free in the whole cluster (what fragmentation and
//!   reservations cost).
//! - waits (`start - submit`) by class: 1 GPU, 2-8, over 8; JCT (`end - submit`); bounded
//!   slowdown `max(1, (wait + run) / max(run, 10 s))`; makespan (last end - first submit);
//!   `reservation_slips`: jobs that started later than the last backfill reservation they held
//!   promised (plus 1 s).

use serde::Serialize;

use crate::timed::Outcome;

/// Runs shorter than this count as this long in the bounded slowdown.
const SLOWDOWN_BOUND_MS: u64 = 10_000;
const SLIP_TOLERANCE_MS: u64 = 1_000;

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    pub policy: String,
    pub jobs: usize,
    pub started: usize,
    pub refused: usize,
    pub gpu_alloc_pct: f64,
    pub gpu_alloc_when_fits_pct: f64,
    pub mean_wait_s: f64,
    pub p50_wait_s: f64,
    pub p99_wait_s: f64,
    pub mean_wait_1gpu_s: f64,
    pub p99_wait_1gpu_s: f64,
    pub mean_wait_2to8_s: f64,
    pub p99_wait_2to8_s: f64,
    pub mean_wait_large_s: f64,
    pub p99_wait_large_s: f64,
    pub max_wait_large_s: f64,
    pub mean_jct_s: f64,
    pub p99_jct_s: f64,
    pub mean_bounded_slowdown: f64,
    pub makespan_s: f64,
    pub reservation_slips: usize,
    pub passes: u64,
    pub replay_wall_s: f64,
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// The value below which `q` of `sorted` lies (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

pub fn report(policy: &str, out: &Outcome, replay_wall_s: f64) -> Report {
    let ran: Vec<_> = out.jobs.iter().filter(|j| j.start_ms.is_some() && j.end_ms.is_some()).collect();
    let wait = |j: &crate::timed::JobRecord| seconds(j.start_ms.unwrap_or(0).saturating_sub(j.submit_ms));
    let waits_of = |keep: &dyn Fn(u32) -> bool| sorted(ran.iter().filter(|j| keep(j.gpus)).map(|j| wait(j)).collect());
    let all = waits_of(&|_| true);
    let one = waits_of(&|g| g <= 1);
    let mid = waits_of(&|g| (2..=8).contains(&g));
    let large = waits_of(&|g| g > 8);
    let jct = sorted(ran.iter().map(|j| seconds(j.end_ms.unwrap_or(0).saturating_sub(j.submit_ms))).collect());
    let slowdown: Vec<f64> = ran
        .iter()
        .map(|j| {
            let total = j.end_ms.unwrap_or(0).saturating_sub(j.submit_ms) as f64;
            (total / j.run_ms.max(SLOWDOWN_BOUND_MS) as f64).max(1.0)
        })
        .collect();
    let first = out.jobs.iter().map(|j| j.submit_ms).min().unwrap_or(0);
    let last = out.jobs.iter().filter_map(|j| j.end_ms).max().unwrap_or(first);
    let last_submit = out.jobs.iter().map(|j| j.submit_ms).max().unwrap_or(first);
    let (mut busy, mut span, mut busy_fits, mut span_fits) = (0f64, 0f64, 0f64, 0f64);
    for w in out.samples.windows(2) {
        let (a, b) = (w[0], w[1]);
        if a.at_ms < first || a.at_ms >= last_submit {
            continue;
        }
        let dt = (b.at_ms.min(last_submit) - a.at_ms) as f64;
        busy += dt * f64::from(a.gpus_busy);
        span += dt;
        if a.fits_by_count {
            busy_fits += dt * f64::from(a.gpus_busy);
            span_fits += dt;
        }
    }
    let total = f64::from(out.gpus_total.max(1));
    let pct = |b: f64, s: f64| if s > 0.0 { 100.0 * b / (s * total) } else { 0.0 };
    Report {
        policy: policy.to_string(),
        jobs: out.jobs.len(),
        started: out.jobs.iter().filter(|j| j.start_ms.is_some()).count(),
        refused: out.jobs.iter().filter(|j| j.refused.is_some()).count(),
        gpu_alloc_pct: pct(busy, span),
        gpu_alloc_when_fits_pct: pct(busy_fits, span_fits),
        mean_wait_s: mean(&all),
        p50_wait_s: quantile(&all, 0.5),
        p99_wait_s: quantile(&all, 0.99),
        mean_wait_1gpu_s: mean(&one),
        p99_wait_1gpu_s: quantile(&one, 0.99),
        mean_wait_2to8_s: mean(&mid),
        p99_wait_2to8_s: quantile(&mid, 0.99),
        mean_wait_large_s: mean(&large),
        p99_wait_large_s: quantile(&large, 0.99),
        max_wait_large_s: large.last().copied().unwrap_or(0.0),
        mean_jct_s: mean(&jct),
        p99_jct_s: quantile(&jct, 0.99),
        mean_bounded_slowdown: mean(&slowdown),
        makespan_s: seconds(last.saturating_sub(first)),
        reservation_slips: out
            .jobs
            .iter()
            .filter(|j| matches!((j.promised_ms, j.start_ms), (Some(p), Some(s)) if s > p + SLIP_TOLERANCE_MS))
            .count(),
        passes: out.passes,
        replay_wall_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.0);
        assert_eq!(quantile(&v, 0.99), 4.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
