//! Each job's GPU utilization and memory over time on this node, for its page in the web UI
//! (`ClientRequest::GpuSeries`): bounded whatever the run's length. A run keeps at most
//! [`proto::GPU_POINTS_MAX`] points (when full, neighbours merge in pairs, so a long run keeps
//! its whole span at a coarser step), and the last [`ENDED_JOBS_KEPT`] ended runs stay readable.

use std::collections::{BTreeMap, VecDeque};

use proto::{GpuPoint, JobId};

use super::GpuSample;

/// Ended runs whose series stay readable (oldest dropped first).
pub const ENDED_JOBS_KEPT: usize = 64;

/// One run's points, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Series {
    points: Vec<GpuPoint>,
    /// Samples each new point spans: doubles each time the points merge.
    samples_per_point: u32,
    /// Samples in the newest point so far, and the sum of their utilizations.
    samples_in_last: u32,
    utilization_sum_in_last: u64,
}

impl Series {
    fn record(&mut self, at_ms: u64, utilization_pct: u32, memory_used_mib: u64) {
        let per_point = self.samples_per_point.max(1);
        match self.points.last_mut() {
            Some(last) if self.samples_in_last < per_point => {
                self.samples_in_last += 1;
                self.utilization_sum_in_last += u64::from(utilization_pct);
                last.utilization_pct = (self.utilization_sum_in_last / u64::from(self.samples_in_last)) as u32;
                last.memory_used_mib = last.memory_used_mib.max(memory_used_mib);
                last.end_ms = at_ms;
            }
            _ => {
                if self.points.len() == proto::GPU_POINTS_MAX {
                    self.merge_pairs();
                }
                self.points.push(GpuPoint { start_ms: at_ms, end_ms: at_ms, utilization_pct, memory_used_mib });
                self.samples_in_last = 1;
                self.utilization_sum_in_last = u64::from(utilization_pct);
            }
        }
    }

    /// Halves the points: each pair becomes one spanning both.
    fn merge_pairs(&mut self) {
        let merged = self
            .points
            .chunks(2)
            .filter_map(|pair| {
                pair.iter().copied().reduce(|a, b| GpuPoint {
                    start_ms: a.start_ms,
                    end_ms: b.end_ms,
                    utilization_pct: (a.utilization_pct + b.utilization_pct) / 2,
                    memory_used_mib: a.memory_used_mib.max(b.memory_used_mib),
                })
            })
            .collect();
        self.points = merged;
        self.samples_per_point = self.samples_per_point.max(1).saturating_mul(2);
        // The last point is whole: the next sample starts a new one.
        self.samples_in_last = self.samples_per_point;
    }
}

/// The series of the jobs running here, and of the last ended ones.
#[derive(Debug, Default)]
pub struct JobGpuSeries {
    running: BTreeMap<JobId, Series>,
    ended: VecDeque<(JobId, Series)>,
}

impl JobGpuSeries {
    /// One sampling at `at_ms` (epoch ms) of the GPUs `holders` (slot → job) names: a point of
    /// each job's mean utilization and its GPUs' most memory used.
    pub fn observe(&mut self, holders: &BTreeMap<u32, JobId>, samples: &[GpuSample], at_ms: u64) {
        let mut by_job: BTreeMap<JobId, (u64, u64, u64)> = BTreeMap::new();
        for s in samples {
            let Some(job) = holders.get(&s.slot()) else { continue };
            let (util_sum, util_n, memory_mib) = by_job.entry(*job).or_default();
            if let Some(u) = s.utilization_pct {
                *util_sum += u64::from(u);
                *util_n += 1;
            }
            *memory_mib = (*memory_mib).max(s.memory_used_mib);
        }
        for (job, (util_sum, util_n, memory_mib)) in by_job {
            if !self.running.contains_key(&job) {
                // A new run of a job that ran here before starts a new series.
                self.ended.retain(|(j, _)| *j != job);
            }
            let utilization_pct = util_sum.checked_div(util_n).unwrap_or(0) as u32;
            self.running.entry(job).or_default().record(at_ms, utilization_pct, memory_mib);
        }
    }

    /// The job's run here ended: its series is kept among the last ended ones.
    pub fn end(&mut self, job: JobId) {
        if let Some(series) = self.running.remove(&job) {
            if self.ended.len() == ENDED_JOBS_KEPT {
                self.ended.pop_front();
            }
            self.ended.push_back((job, series));
        }
    }

    /// The job's points here, oldest first (empty if it has none).
    pub fn points(&self, job: JobId) -> Vec<GpuPoint> {
        self.running
            .get(&job)
            .or_else(|| self.ended.iter().rev().find(|(j, _)| *j == job).map(|(_, s)| s))
            .map(|s| s.points.clone())
            .unwrap_or_default()
    }
}

/// The samples of the devices jobs hold, as the web UI's map shows them.
pub fn latest(samples: &[GpuSample], holders: &BTreeMap<u32, JobId>, at_ms: u64) -> Vec<proto::GpuNow> {
    samples
        .iter()
        .filter(|s| holders.contains_key(&s.slot()))
        .take(proto::GPU_SAMPLES_MAX)
        .map(|s| proto::GpuNow {
            gpu: s.gpu,
            mig_start_slice: s.mig.as_ref().map(|m| m.start_slice),
            utilization_pct: s.utilization_pct,
            memory_used_mib: s.memory_used_mib,
            memory_total_mib: s.memory_used_mib + s.memory_free_mib,
            at_ms,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::gpu::sampler::test_sample as sample;

    #[test]
    fn a_point_is_the_mean_utilization_and_the_most_memory_of_a_jobs_gpus() {
        let mut s = JobGpuSeries::default();
        let holders: BTreeMap<u32, JobId> = [(0, 7), (1, 7), (2, 9)].into_iter().collect();
        s.observe(&holders, &[sample(0, 100, 10), sample(1, 50, 30), sample(2, 10, 5), sample(3, 99, 99)], 1_000);
        assert_eq!(s.points(7), vec![GpuPoint { start_ms: 1_000, end_ms: 1_000, utilization_pct: 75, memory_used_mib: 30 }]);
        assert_eq!(s.points(9).len(), 1);
        assert!(s.points(3).is_empty(), "an unheld GPU is nobody's");
    }

    #[test]
    fn a_long_run_keeps_its_whole_span_in_at_most_the_bound() {
        let mut s = JobGpuSeries::default();
        let holders: BTreeMap<u32, JobId> = [(0, 1)].into_iter().collect();
        let samples = 10 * proto::GPU_POINTS_MAX as u64 + 7;
        for i in 0..samples {
            s.observe(&holders, &[sample(0, (i % 2 * 100) as u32, i)], i * 1_000);
        }
        let points = s.points(1);
        assert!(points.len() <= proto::GPU_POINTS_MAX && points.len() > proto::GPU_POINTS_MAX / 4, "{}", points.len());
        assert_eq!(points[0].start_ms, 0, "the first sample is still covered");
        assert_eq!(points.last().map(|p| p.end_ms), Some((samples - 1) * 1_000), "so is the last");
        assert!(points.windows(2).all(|w| w[0].end_ms < w[1].start_ms), "points are ordered and disjoint");
        assert!(points[..points.len() - 1].iter().all(|p| p.utilization_pct == 50), "{points:?}");
        assert_eq!(points.last().map(|p| p.memory_used_mib), Some(samples - 1), "memory is the peak");
    }

    #[test]
    fn ended_runs_stay_readable_up_to_the_bound_and_a_new_run_starts_afresh() {
        let mut s = JobGpuSeries::default();
        for job in 0..(ENDED_JOBS_KEPT as u64 + 1) {
            let holders: BTreeMap<u32, JobId> = [(0, job)].into_iter().collect();
            s.observe(&holders, &[sample(0, 40, 1)], job);
            s.end(job);
        }
        assert!(s.points(0).is_empty(), "the oldest ended run was dropped");
        assert_eq!(s.points(1).len(), 1);
        let holders: BTreeMap<u32, JobId> = [(0, 1)].into_iter().collect();
        s.observe(&holders, &[sample(0, 90, 1)], 5_000);
        assert_eq!(s.points(1), vec![GpuPoint { start_ms: 5_000, end_ms: 5_000, utilization_pct: 90, memory_used_mib: 1 }]);
    }
}
