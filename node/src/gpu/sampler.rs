//! Utilization, memory, temperature and power of each GPU, sampled at each scrape, and the
//! per-job accumulation of those samples (mean utilization, peak memory) for accounting.

use std::collections::{BTreeMap, BTreeSet};

use proto::{GpuInfo, JobId};
use sha2::{Digest, Sha256};

/// One GPU at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSample {
    pub gpu: u32,
    pub uuid: String,
    pub model: String,
    pub utilization_pct: u32,
    pub memory_used_mib: u64,
    pub memory_free_mib: u64,
    pub temperature_c: u32,
    pub power_mw: u64,
}

/// A source of samples.
pub trait GpuSampler: Send + Sync {
    /// One sample per GPU in index order. `held` are the GPUs a job holds on this node: real
    /// samplers ignore it, simulated ones show load on exactly those.
    fn sample(&self, held: &BTreeSet<u32>) -> anyhow::Result<Vec<GpuSample>>;
}

/// No GPUs, no samples.
pub struct NoSampler;

impl GpuSampler for NoSampler {
    fn sample(&self, _held: &BTreeSet<u32>) -> anyhow::Result<Vec<GpuSample>> {
        Ok(Vec::new())
    }
}

/// Plausible, deterministic values for simulated GPUs: idle ones cool and empty, held ones
/// busy, each GPU's numbers fixed by node name and index.
pub struct SimulatedSampler {
    pub node_name: String,
    pub gpus: Vec<GpuInfo>,
}

impl SimulatedSampler {
    fn jitter(&self, index: u32, what: &str, modulo: u64) -> u64 {
        let d = Sha256::digest(format!("corral-sim-sample/{}/{index}/{what}", self.node_name).as_bytes());
        u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) % modulo.max(1)
    }
}

impl GpuSampler for SimulatedSampler {
    fn sample(&self, held: &BTreeSet<u32>) -> anyhow::Result<Vec<GpuSample>> {
        Ok(self
            .gpus
            .iter()
            .map(|g| {
                let busy = held.contains(&g.index);
                let (utilization_pct, memory_used_mib, temperature_c, power_mw) = if busy {
                    let util = 60 + self.jitter(g.index, "util", 40) as u32;
                    let used = g.memory_mib * (40 + self.jitter(g.index, "mem", 50)) / 100;
                    (util, used, 55 + self.jitter(g.index, "temp", 20) as u32, 300_000 + self.jitter(g.index, "power", 350) * 1_000)
                } else {
                    (0, 0, 30 + self.jitter(g.index, "temp", 8) as u32, 70_000 + self.jitter(g.index, "power", 30) * 1_000)
                };
                GpuSample {
                    gpu: g.index,
                    uuid: g.uuid.clone(),
                    model: g.model.clone(),
                    utilization_pct,
                    memory_used_mib,
                    memory_free_mib: g.memory_mib.saturating_sub(memory_used_mib),
                    temperature_c,
                    power_mw,
                }
            })
            .collect())
    }
}

/// One job's GPU use on this node, accumulated sample by sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobGpuStats {
    /// GPU samples taken (one per GPU per sampling).
    pub samples: u64,
    pub utilization_pct_sum: u64,
    /// Highest memory any one of its GPUs used.
    pub memory_used_peak_mib: u64,
    /// Highest memory all of its GPUs on this node used together.
    pub memory_used_total_peak_mib: u64,
}

impl JobGpuStats {
    /// Adds one sampling of the job's GPUs.
    pub fn record(&mut self, samples: &[&GpuSample]) {
        let mut total = 0u64;
        for s in samples {
            self.samples += 1;
            self.utilization_pct_sum += u64::from(s.utilization_pct);
            self.memory_used_peak_mib = self.memory_used_peak_mib.max(s.memory_used_mib);
            total += s.memory_used_mib;
        }
        self.memory_used_total_peak_mib = self.memory_used_total_peak_mib.max(total);
    }

    /// Mean utilization over every sample of every GPU, 0 before the first.
    pub fn mean_utilization_pct(&self) -> f64 {
        if self.samples == 0 {
            0.0
        } else {
            self.utilization_pct_sum as f64 / self.samples as f64
        }
    }

    /// Adds another node's (or an earlier interval's) stats of the same job.
    pub fn merge(&mut self, other: &JobGpuStats) {
        self.samples += other.samples;
        self.utilization_pct_sum += other.utilization_pct_sum;
        self.memory_used_peak_mib = self.memory_used_peak_mib.max(other.memory_used_peak_mib);
        self.memory_used_total_peak_mib = self.memory_used_total_peak_mib.max(other.memory_used_total_peak_mib);
    }
}

/// Stats of every job on this node: feed it each sampling with who holds which GPU, take a
/// job's stats when it ends.
#[derive(Debug, Default)]
pub struct JobGpuAccounting {
    jobs: BTreeMap<JobId, JobGpuStats>,
}

impl JobGpuAccounting {
    pub fn observe(&mut self, holders: &BTreeMap<u32, JobId>, samples: &[GpuSample]) {
        let mut by_job: BTreeMap<JobId, Vec<&GpuSample>> = BTreeMap::new();
        for s in samples {
            if let Some(job) = holders.get(&s.gpu) {
                by_job.entry(*job).or_default().push(s);
            }
        }
        for (job, samples) in by_job {
            self.jobs.entry(job).or_default().record(&samples);
        }
    }

    pub fn get(&self, job: JobId) -> Option<&JobGpuStats> {
        self.jobs.get(&job)
    }

    /// Removes and returns the job's stats (when it ends).
    pub fn take(&mut self, job: JobId) -> Option<JobGpuStats> {
        self.jobs.remove(&job)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(gpu: u32, util: u32, used: u64) -> GpuSample {
        GpuSample {
            gpu,
            uuid: format!("GPU-{gpu}"),
            model: "m".into(),
            utilization_pct: util,
            memory_used_mib: used,
            memory_free_mib: 0,
            temperature_c: 0,
            power_mw: 0,
        }
    }

    #[test]
    fn accounting_means_and_peaks() {
        let mut acc = JobGpuAccounting::default();
        let holders: BTreeMap<u32, JobId> = [(0, 7), (1, 7), (2, 9)].into_iter().collect();
        acc.observe(&holders, &[sample(0, 100, 10), sample(1, 50, 30), sample(2, 10, 5), sample(3, 99, 99)]);
        acc.observe(&holders, &[sample(0, 0, 20), sample(1, 50, 5), sample(2, 30, 1)]);
        let s7 = acc.take(7).expect("job 7");
        assert_eq!(s7.samples, 4);
        assert!((s7.mean_utilization_pct() - 50.0).abs() < 1e-9);
        assert_eq!(s7.memory_used_peak_mib, 30);
        assert_eq!(s7.memory_used_total_peak_mib, 40);
        assert!(acc.take(7).is_none());
        assert_eq!(acc.get(9).map(|s| s.mean_utilization_pct()), Some(20.0));
    }

    #[test]
    fn simulated_samples_are_deterministic_and_plausible() {
        let gpus: Vec<GpuInfo> = (0..2).map(|i| GpuInfo { index: i, memory_mib: 80_000, ..GpuInfo::default() }).collect();
        let s = SimulatedSampler { node_name: "n1".into(), gpus };
        let held: BTreeSet<u32> = [1].into_iter().collect();
        let a = s.sample(&held).expect("sample");
        assert_eq!(a, s.sample(&held).expect("again"));
        assert_eq!(a[0].utilization_pct, 0);
        assert_eq!(a[0].memory_free_mib, 80_000);
        assert!((60..100).contains(&a[1].utilization_pct));
        assert_eq!(a[1].memory_used_mib + a[1].memory_free_mib, 80_000);
        assert!(a[1].power_mw > a[0].power_mw);
    }
}
