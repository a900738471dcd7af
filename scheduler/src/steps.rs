//! Steps inside an allocation: what share of its job's CPUs, memory and GPUs on one node a
//! step (`srun` in the job) gets, given what the job's other live steps there hold. Pure; the
//! node holds the result until the step's tasks there end.
//!
//! As Slurm 22.05's step allocation (checked against a real one with `CR_Core_Memory`):
//! - a step holds all of the job's CPUs on the node, unless `--exact`, `--exclusive` or `-c`
//!   asks for only its tasks' (tasks × CPUs per task); more than the job has is refused
//!   ("More processors requested than permitted");
//! - a step holds all of the job's memory there unless `--mem*` says how much; `--mem=0` holds
//!   none and may use all; more than the job has is refused ("Memory required by task is not
//!   available");
//! - `--gres=gpu:N` and friends hold N of the job's GPUs there; without, the step sees all of
//!   them and holds none;
//! - `--overlap` holds nothing and waits for nothing;
//! - a step that finds too little free waits (the caller asks again), as Slurm's "step
//!   creation temporarily disabled".

use proto::{StepMemory, StepSpec};

/// What a job holds on one node, which its steps share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeShare {
    pub cpus: u32,
    /// 0: the job's memory is not counted (then neither is its steps').
    pub memory_mib: u64,
    pub gpus: u32,
}

/// What one step holds on a node until its tasks there end.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepHold {
    pub cpus: u32,
    pub memory_mib: u64,
    /// Positions in the job's GPU list on the node.
    pub gpus: Vec<u32>,
}

/// What a step gets on a node: what it holds, and what its tasks there may use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepGrant {
    pub held: StepHold,
    /// CPUs its tasks may use (`SLURM_CPUS_ON_NODE`, the limit of its cgroup).
    pub cpus: u32,
    /// Memory its tasks may use; 0 where the job's is not counted.
    pub memory_mib: u64,
    /// The positions of the job's GPUs its tasks see; None: all of them.
    pub gpus: Option<Vec<u32>>,
}

/// Why a step does not start on a node now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepRefusal {
    /// It asks more than the job has here: it never will (Slurm's message).
    Invalid(String),
    /// Other steps hold what it needs: it may once they end.
    Busy(String),
}

/// The share of `share` that a step of `spec` with `tasks` tasks on this node gets, given
/// `held`, what the job's other live steps here hold.
pub fn grant_step(share: NodeShare, held: &[&StepHold], spec: &StepSpec, tasks: u32) -> Result<StepGrant, StepRefusal> {
    let mut task_cpus = tasks.saturating_mul(spec.cpus_per_task.max(1));
    if task_cpus > share.cpus && !spec.overcommit {
        return Err(StepRefusal::Invalid("More processors requested than permitted".into()));
    }
    // Overcommitted: its tasks share what the job has here.
    task_cpus = task_cpus.min(share.cpus);
    let cpus = if spec.exact { task_cpus } else { share.cpus };
    let gpus_wanted = spec.gpus_per_node.unwrap_or(share.gpus);
    if gpus_wanted > share.gpus {
        return Err(StepRefusal::Invalid("Invalid generic resource (gres) specification".into()));
    }
    let memory_mib = match spec.memory {
        StepMemory::Whole | StepMemory::Shared => share.memory_mib,
        StepMemory::PerNodeMib(m) => m,
        StepMemory::PerCpuMib(m) => m.saturating_mul(u64::from(cpus)),
        StepMemory::PerGpuMib(m) => m.saturating_mul(u64::from(gpus_wanted)),
    };
    // A size of 0 (`--mem=0`, or a per-CPU or per-GPU 0) is all of it, shared.
    let shared = spec.memory == StepMemory::Shared || memory_mib == 0;
    let memory_mib = if share.memory_mib == 0 {
        0
    } else if shared {
        share.memory_mib
    } else {
        memory_mib
    };
    if memory_mib > share.memory_mib {
        return Err(StepRefusal::Invalid("Memory required by task is not available".into()));
    }
    // Shared: sees the first GPUs it asked for (or all), holds nothing.
    let shared_gpus = spec.gpus_per_node.map(|n| (0..n).collect());
    if spec.overlap || spec.unrecorded {
        return Ok(StepGrant { held: StepHold::default(), cpus, memory_mib, gpus: shared_gpus });
    }
    let held_cpus: u32 = held.iter().map(|h| h.cpus).sum();
    let held_memory_mib: u64 = held.iter().map(|h| h.memory_mib).sum();
    let held_gpus: std::collections::BTreeSet<u32> = held.iter().flat_map(|h| h.gpus.iter().copied()).collect();
    let free_gpus: Vec<u32> = (0..share.gpus).filter(|g| !held_gpus.contains(g)).collect();
    let hold_memory_mib = if shared { 0 } else { memory_mib };
    let mut short = Vec::new();
    if held_cpus.saturating_add(cpus) > share.cpus {
        short.push(format!("{cpus} CPUs ({held_cpus} of {} held)", share.cpus));
    }
    if held_memory_mib.saturating_add(hold_memory_mib) > share.memory_mib {
        short.push(format!("{hold_memory_mib} MiB ({held_memory_mib} of {} held)", share.memory_mib));
    }
    let gpus = spec.gpus_per_node.map(|n| free_gpus.iter().copied().take(n as usize).collect::<Vec<u32>>());
    if let Some(want) = spec.gpus_per_node.filter(|n| free_gpus.len() < *n as usize) {
        short.push(format!("{want} GPUs ({} of {} held)", held_gpus.len(), share.gpus));
    }
    if !short.is_empty() {
        return Err(StepRefusal::Busy(format!("it needs {} held by other steps", short.join(", "))));
    }
    let held = StepHold { cpus, memory_mib: hold_memory_mib, gpus: gpus.clone().unwrap_or_default() };
    Ok(StepGrant { held, cpus, memory_mib, gpus })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{StepNode, StepStdin};

    const SHARE: NodeShare = NodeShare { cpus: 4, memory_mib: 1000, gpus: 4 };

    fn spec(f: impl FnOnce(&mut StepSpec)) -> StepSpec {
        let mut s = StepSpec {
            argv: vec!["true".into()],
            workdir: None,
            env: Default::default(),
            nodes: vec![StepNode { name: "n1".into(), ranks: vec![0] }],
            gpus_per_task: None,
            stdin: StepStdin::Nothing,
            gpus_per_node: None,
            overlap: false,
            unrecorded: false,
            pty: None,
            cpus_per_task: 1,
            exact: false,
            overcommit: false,
            name: None,
            time_limit_ms: None,
            memory: StepMemory::Whole,
        };
        f(&mut s);
        s
    }

    fn busy(r: Result<StepGrant, StepRefusal>) -> bool {
        matches!(r, Err(StepRefusal::Busy(_)))
    }

    #[test]
    fn a_plain_step_holds_the_whole_share_and_the_next_waits() {
        let first = grant_step(SHARE, &[], &spec(|_| {}), 1).expect("fits");
        assert_eq!(first.held, StepHold { cpus: 4, memory_mib: 1000, gpus: vec![] });
        assert_eq!((first.cpus, first.memory_mib, first.gpus), (4, 1000, None));
        assert!(busy(grant_step(SHARE, &[&first.held], &spec(|_| {}), 1)));
        // Even an exact one: the memory is all held (Slurm's gotcha, kept).
        assert!(busy(grant_step(SHARE, &[&first.held], &spec(|s| s.exact = true), 1)));
    }

    #[test]
    fn exact_steps_with_their_memory_pack_side_by_side() {
        let one = spec(|s| {
            s.exact = true;
            s.memory = StepMemory::PerNodeMib(250);
            s.gpus_per_node = Some(1);
        });
        let mut holds = Vec::new();
        for expected_gpu in 0..4 {
            let refs: Vec<&StepHold> = holds.iter().collect();
            let g = grant_step(SHARE, &refs, &one, 1).expect("a fifth of nothing is free yet");
            assert_eq!(g.held, StepHold { cpus: 1, memory_mib: 250, gpus: vec![expected_gpu] });
            assert_eq!(g.gpus, Some(vec![expected_gpu]));
            holds.push(g.held);
        }
        let refs: Vec<&StepHold> = holds.iter().collect();
        let Err(StepRefusal::Busy(why)) = grant_step(SHARE, &refs, &one, 1) else { panic!("the fifth waits") };
        assert!(why.contains("1 CPUs (4 of 4 held)") && why.contains("1 GPUs (4 of 4 held)"), "{why}");
        // One ends: its GPU is the next one's.
        holds.remove(2);
        let refs: Vec<&StepHold> = holds.iter().collect();
        assert_eq!(grant_step(SHARE, &refs, &one, 1).expect("fits again").gpus, Some(vec![2]));
    }

    #[test]
    fn more_than_the_job_has_is_refused_not_waited_for() {
        let refused = |s: StepSpec, tasks| match grant_step(SHARE, &[], &s, tasks) {
            Err(StepRefusal::Invalid(why)) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(refused(spec(|s| s.cpus_per_task = 5), 1), "More processors requested than permitted");
        assert_eq!(refused(spec(|s| s.exact = true), 5), "More processors requested than permitted");
        let over = spec(|s| {
            s.exact = true;
            s.overcommit = true;
        });
        assert_eq!(grant_step(SHARE, &[], &over, 5).map(|g| g.cpus), Ok(4), "-O: five tasks share the four CPUs");
        assert_eq!(refused(spec(|s| s.memory = StepMemory::PerNodeMib(1001)), 1), "Memory required by task is not available");
        assert_eq!(refused(spec(|s| s.memory = StepMemory::PerCpuMib(300)), 1), "Memory required by task is not available");
        assert_eq!(refused(spec(|s| s.gpus_per_node = Some(5)), 1), "Invalid generic resource (gres) specification");
    }

    #[test]
    fn memory_per_cpu_and_per_gpu_count_what_the_step_gets() {
        let per_cpu = spec(|s| {
            s.exact = true;
            s.cpus_per_task = 2;
            s.memory = StepMemory::PerCpuMib(100);
        });
        assert_eq!(grant_step(SHARE, &[], &per_cpu, 1).map(|g| g.memory_mib), Ok(200));
        let per_gpu = spec(|s| {
            s.memory = StepMemory::PerGpuMib(100);
            s.gpus_per_node = Some(3);
        });
        assert_eq!(grant_step(SHARE, &[], &per_gpu, 1).map(|g| g.memory_mib), Ok(300));
        let zero = grant_step(SHARE, &[], &spec(|s| s.memory = StepMemory::PerCpuMib(0)), 1).expect("fits");
        assert_eq!((zero.memory_mib, zero.held.memory_mib), (1000, 0), "a size of 0 is all of it, shared");
    }

    #[test]
    fn overlap_and_mem_zero_hold_nothing_they_share() {
        let whole = grant_step(SHARE, &[], &spec(|_| {}), 1).expect("fits").held;
        let overlap = grant_step(SHARE, &[&whole], &spec(|s| s.overlap = true), 1).expect("overlap never waits");
        assert_eq!((overlap.held, overlap.cpus, overlap.memory_mib), (StepHold::default(), 4, 1000));
        let exact = spec(|s| {
            s.exact = true;
            s.memory = StepMemory::Shared;
        });
        let a = grant_step(SHARE, &[], &exact, 2).expect("fits");
        assert_eq!((a.held.memory_mib, a.memory_mib, a.cpus), (0, 1000, 2));
        let b = grant_step(SHARE, &[&a.held], &exact, 2).expect("its memory is shared, the CPUs are free");
        assert!(busy(grant_step(SHARE, &[&a.held, &b.held], &exact, 1)));
    }

    #[test]
    fn a_job_without_counted_memory_counts_none_for_its_steps() {
        let share = NodeShare { memory_mib: 0, ..SHARE };
        let g = grant_step(share, &[], &spec(|s| s.memory = StepMemory::PerNodeMib(1 << 20)), 1).expect("not counted");
        assert_eq!((g.memory_mib, g.held.memory_mib), (0, 0));
    }
}
