//! Utilization, memory, temperature and power of each GPU and of each MIG instance, sampled at
//! each scrape, and the per-job accumulation of those samples (mean utilization, peak memory)
//! for accounting.

use std::collections::{BTreeMap, BTreeSet};

use proto::{GpuInfo, JobId};
use sha2::{Digest, Sha256};

/// Which MIG instance a sample is of: DCGM exporter's `GPU_I_ID` and `GPU_I_PROFILE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigOf {
    pub gpu_instance_id: u32,
    pub profile: String,
    /// First memory slice: with the GPU's index it names the instance in an allocation.
    pub start_slice: u32,
}

/// One GPU, or one MIG instance of a GPU, at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSample {
    pub gpu: u32,
    /// The GPU's UUID; a MIG instance's sample carries its parent's, as DCGM exporter does.
    pub uuid: String,
    pub model: String,
    /// `None` where the device gives none: NVML has no utilization for a MIG instance or for a
    /// GPU in MIG mode.
    pub utilization_pct: Option<u32>,
    /// Percent of the sample period during which device memory was read or written (NVML's
    /// `utilization.memory`); `None` where the device gives none, as for `utilization_pct`.
    pub memory_utilization_pct: Option<u32>,
    pub memory_used_mib: u64,
    pub memory_free_mib: u64,
    /// The GPU's (a MIG instance has no sensor of its own).
    pub temperature_c: u32,
    /// The GPU's.
    pub power_mw: u64,
    /// Set on a MIG instance's sample; a MIG-mode GPU also has its own sample, with `None`.
    pub mig: Option<MigOf>,
}

impl GpuSample {
    /// The `Allocation::gpus` entry of a job holding this device: the GPU's index, or the slot
    /// of its MIG instance (`scheduler::mig_slot`). No job holds a MIG-mode GPU whole.
    pub fn slot(&self) -> u32 {
        match &self.mig {
            Some(m) => scheduler::mig_slot(self.gpu, m.start_slice),
            None => self.gpu,
        }
    }
}

/// A source of samples.
pub trait GpuSampler: Send + Sync {
    /// One sample per GPU in index order, each MIG-mode GPU's followed by one per instance.
    /// `held` are the slots (`GpuSample::slot`) jobs hold on this node: real samplers ignore
    /// it, simulated ones show load on exactly those.
    fn sample(&self, held: &BTreeSet<u32>) -> anyhow::Result<Vec<GpuSample>>;
}

/// No GPUs, no samples.
pub struct NoSampler;

impl GpuSampler for NoSampler {
    fn sample(&self, _held: &BTreeSet<u32>) -> anyhow::Result<Vec<GpuSample>> {
        Ok(Vec::new())
    }
}

/// A number in `0..modulo` fixed by node, device and what is sampled.
fn jitter(node_name: &str, device: &str, what: &str, modulo: u64) -> u64 {
    let d = Sha256::digest(format!("corral-sim-sample/{node_name}/{device}/{what}").as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) % modulo.max(1)
}

/// Plausible, deterministic samples of simulated GPUs as they are now (`gpus`, MIG instances
/// included): idle devices cool and empty, held ones busy, each one's numbers fixed by node
/// name and device. A MIG-mode GPU's own sample has no utilization and the sum of its
/// instances' memory, as NVML reports it.
pub fn simulated_samples(node_name: &str, gpus: &[GpuInfo], held: &BTreeSet<u32>) -> Vec<GpuSample> {
    let mut out = Vec::with_capacity(gpus.len());
    for g in gpus {
        let index = g.index.to_string();
        let j = |what: &str, modulo: u64| jitter(node_name, &index, what, modulo);
        let instances: Vec<GpuSample> =
            if g.mig_enabled { g.mig.iter().map(|m| simulated_instance(node_name, g, m, held)).collect() } else { Vec::new() };
        let busy = held.contains(&g.index) || instances.iter().any(|s| held.contains(&s.slot()));
        let (utilization_pct, memory_utilization_pct, memory_used_mib) = if g.mig_enabled {
            (None, None, instances.iter().map(|s| s.memory_used_mib).sum())
        } else if busy {
            (Some(60 + j("util", 40) as u32), Some(20 + j("memutil", 50) as u32), g.memory_mib * (40 + j("mem", 50)) / 100)
        } else {
            (Some(0), Some(0), 0)
        };
        let (temperature_c, power_mw) = if busy {
            (55 + j("temp", 20) as u32, 300_000 + j("power", 350) * 1_000)
        } else {
            (30 + j("temp", 8) as u32, 70_000 + j("power", 30) * 1_000)
        };
        out.push(GpuSample {
            gpu: g.index,
            uuid: g.uuid.clone(),
            model: g.model.clone(),
            utilization_pct,
            memory_utilization_pct,
            memory_used_mib,
            memory_free_mib: g.memory_mib.saturating_sub(memory_used_mib),
            temperature_c,
            power_mw,
            mig: None,
        });
        let (temperature_c, power_mw) = (out[out.len() - 1].temperature_c, out[out.len() - 1].power_mw);
        out.extend(instances.into_iter().map(|s| GpuSample { temperature_c, power_mw, ..s }));
    }
    out
}

/// One simulated MIG instance; busy when a job holds its slot. Simulated GPUs report the GR
/// engine and memory activity DCGM would (real NVML gives none per instance).
fn simulated_instance(node_name: &str, g: &GpuInfo, m: &proto::MigInstance, held: &BTreeSet<u32>) -> GpuSample {
    let device = format!("{}/{}", g.index, m.uuid);
    let j = |what: &str, modulo: u64| jitter(node_name, &device, what, modulo);
    let mig = MigOf { gpu_instance_id: m.gpu_instance_id, profile: m.profile.clone(), start_slice: m.start_slice };
    let busy = held.contains(&scheduler::mig_slot(g.index, m.start_slice));
    let (util, mem_util, used) =
        if busy { (60 + j("util", 40) as u32, 20 + j("memutil", 50) as u32, m.memory_mib * (40 + j("mem", 50)) / 100) } else { (0, 0, 0) };
    GpuSample {
        gpu: g.index,
        uuid: g.uuid.clone(),
        model: g.model.clone(),
        utilization_pct: Some(util),
        memory_utilization_pct: Some(mem_util),
        memory_used_mib: used,
        memory_free_mib: m.memory_mib.saturating_sub(used),
        temperature_c: 0,
        power_mw: 0,
        mig: Some(mig),
    }
}

/// One job's GPU use on this node, accumulated sample by sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobGpuStats {
    /// Samples with a utilization reading (one per device per sampling).
    pub samples: u64,
    pub utilization_pct_sum: u64,
    /// Highest memory any one of its GPUs (or MIG instances) used.
    pub memory_used_peak_mib: u64,
    /// Highest memory all of its GPUs on this node used together.
    pub memory_used_total_peak_mib: u64,
}

impl JobGpuStats {
    /// Adds one sampling of the job's devices.
    pub fn record(&mut self, samples: &[&GpuSample]) {
        let mut total = 0u64;
        for s in samples {
            if let Some(util) = s.utilization_pct {
                self.samples += 1;
                self.utilization_pct_sum += u64::from(util);
            }
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
    /// `holders`: slot (`GpuSample::slot`) → the job holding it.
    pub fn observe(&mut self, holders: &BTreeMap<u32, JobId>, samples: &[GpuSample]) {
        let mut by_job: BTreeMap<JobId, Vec<&GpuSample>> = BTreeMap::new();
        for s in samples {
            if let Some(job) = holders.get(&s.slot()) {
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

/// A whole GPU's sample for tests: `util` % busy, `used` MiB used.
#[cfg(test)]
pub(crate) fn test_sample(gpu: u32, util: u32, used: u64) -> GpuSample {
    GpuSample {
        gpu,
        uuid: format!("GPU-{gpu}"),
        model: "m".into(),
        utilization_pct: Some(util),
        memory_utilization_pct: None,
        memory_used_mib: used,
        memory_free_mib: 0,
        temperature_c: 0,
        power_mw: 0,
        mig: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_sample as sample;

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
        let held: BTreeSet<u32> = [1].into_iter().collect();
        let a = simulated_samples("n1", &gpus, &held);
        assert_eq!(a, simulated_samples("n1", &gpus, &held));
        assert_eq!(a[0].utilization_pct, Some(0));
        assert_eq!(a[0].memory_free_mib, 80_000);
        assert!(a[1].utilization_pct.is_some_and(|u| (60..100).contains(&u)));
        assert_eq!(a[1].memory_used_mib + a[1].memory_free_mib, 80_000);
        assert!(a[1].power_mw > a[0].power_mw);
    }

    fn mig_gpu() -> GpuInfo {
        let inst = |gi: u32, profile: &str, start_slice: u32, memory_mib: u64| proto::MigInstance {
            uuid: format!("MIG-{gi}"),
            profile: profile.into(),
            gpu_instance_id: gi,
            start_slice,
            memory_mib,
            ..proto::MigInstance::default()
        };
        GpuInfo {
            index: 0,
            uuid: "GPU-0".into(),
            memory_mib: 143_360,
            mig_enabled: true,
            mig: vec![inst(1, "3g.71gb", 0, 71_424), inst(2, "3g.71gb", 4, 71_424)],
            ..GpuInfo::default()
        }
    }

    #[test]
    fn a_mig_gpu_is_sampled_per_instance_and_each_instance_goes_to_the_job_holding_it() {
        let first = scheduler::mig_slot(0, 0);
        let second = scheduler::mig_slot(0, 4);
        let held: BTreeSet<u32> = [second].into_iter().collect();
        let samples = simulated_samples("n1", &[mig_gpu()], &held);
        assert_eq!(samples.len(), 3, "the GPU and its two instances: {samples:?}");
        assert_eq!((samples[0].mig.as_ref(), samples[0].utilization_pct), (None, None), "a MIG-mode GPU has no utilization of its own");
        assert_eq!(samples.iter().map(GpuSample::slot).collect::<Vec<_>>(), vec![0, first, second]);
        let (idle, busy) = (&samples[1], &samples[2]);
        assert_eq!(busy.mig.as_ref().map(|m| (m.gpu_instance_id, m.profile.as_str())), Some((2, "3g.71gb")));
        assert_eq!((idle.utilization_pct, idle.memory_used_mib), (Some(0), 0));
        assert!(busy.utilization_pct.is_some_and(|u| u >= 60) && busy.memory_used_mib > 0);
        assert_eq!(busy.memory_used_mib + busy.memory_free_mib, 71_424);
        assert_eq!(samples[0].memory_used_mib, busy.memory_used_mib);

        // Two jobs on the two instances of one GPU: each sees only its own.
        let holders: BTreeMap<u32, JobId> = [(first, 7), (second, 9)].into_iter().collect();
        let both: BTreeSet<u32> = holders.keys().copied().collect();
        let samples = simulated_samples("n1", &[mig_gpu()], &both);
        let mut acc = JobGpuAccounting::default();
        acc.observe(&holders, &samples);
        for (job, s) in [(7, &samples[1]), (9, &samples[2])] {
            let st = acc.get(job).expect("stats");
            assert_eq!((st.samples, st.memory_used_peak_mib), (1, s.memory_used_mib), "job {job}");
            assert_eq!(st.mean_utilization_pct(), f64::from(s.utilization_pct.expect("util")));
        }
    }

    #[test]
    fn a_sample_without_utilization_counts_for_memory_only() {
        let mut st = JobGpuStats::default();
        let none = GpuSample { utilization_pct: None, ..sample(0, 0, 500) };
        st.record(&[&none, &sample(1, 40, 100)]);
        assert_eq!((st.samples, st.mean_utilization_pct()), (1, 40.0));
        assert_eq!((st.memory_used_peak_mib, st.memory_used_total_peak_mib), (500, 600));
    }
}
