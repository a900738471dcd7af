//! Job steps (`srun` inside an allocation): the step spec and [`StepSpec::validate`], its tasks'
//! output, usage and exits, the end of its tasks on a node, and the ports of its rendezvous.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{limits, JobId, RunNo};
#[cfg(doc)]
use crate::{ApiError, ClientRequest, PeerRequest};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// A job step (`srun` inside a batch job): a command started as tasks on some of the job's
/// nodes by their agents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSpec {
    pub argv: Vec<String>,
    /// Working directory of the tasks; the job's when none.
    pub workdir: Option<String>,
    /// The caller's environment as `--export` selected it, with the step's own variables
    /// (`SLURM_STEP_*`, `SLURM_NTASKS`, ...). Each node puts its own variables over these
    /// (`SLURMD_NODENAME`, `CUDA_VISIBLE_DEVICES`, ...) and each task its rank.
    pub env: BTreeMap<String, String>,
    /// The step's nodes in order, with the global ranks of each one's tasks.
    pub nodes: Vec<StepNode>,
    /// `--gpus-per-task`: each task sees that many of its node's GPUs, by local id.
    pub gpus_per_task: Option<u32>,
    /// Which tasks read `srun`'s stdin (`--input`), fed by [`ClientRequest::StepInput`]; the others
    /// read `/dev/null`.
    pub stdin: StepStdin,
    /// `--gres=gpu:N`, `--gpus-per-node=N` or `--gpus=N` inside an allocation: a step on one
    /// node holds N of the job's GPUs there, which no other such step gets until its tasks
    /// ended; one that finds too few free waits ([`ApiError::Busy`]), as Slurm's does. A step
    /// on several nodes sees the first N of the job's GPUs on each, shared (as with
    /// `overlap`). None: all of them, held by none (Slurm's default for a step).
    pub gpus_per_node: Option<u32>,
    /// `--overlap`: the step's GPUs are the first N of the job's, shared, neither held nor waited for.
    pub overlap: bool,
    /// `salloc`'s own step that hands its command's exit status to the allocation: no step of
    /// the user's, so not recorded for accounting (Slurm has no such step).
    pub unrecorded: bool,
    /// `srun --pty`: task 0 runs on a pseudo-terminal of this size (its stdin, stdout and
    /// stderr, and its session's controlling terminal); it reads `srun`'s stdin
    /// (`StepStdin::Task(0)`) and `srun` shows only its output, as Slurm does.
    pub pty: Option<PtySize>,
    /// `-c/--cpus-per-task`: CPUs of each task (1 when not given).
    pub cpus_per_task: u32,
    /// `--exact`, `--exclusive` or an explicit `-c`: the step holds its tasks' CPUs on each
    /// node, not all of the job's there (Slurm's default for a step).
    pub exact: bool,
    /// `-O/--overcommit`: more tasks than the job has CPUs on a node may share them.
    pub overcommit: bool,
    /// `-J/--job-name` inside an allocation: the step's name in accounting (its program's
    /// name when none).
    pub name: Option<String>,
    /// `-t/--time` inside an allocation: past it each node of the step says so on the step's
    /// stderr, sends its tasks SIGTERM and, after the node's `kill_grace_ms`, SIGKILL.
    pub time_limit_ms: Option<u64>,
    /// `--mem`, `--mem-per-cpu`, `--mem-per-gpu`: how much of the job's memory on each node
    /// the step holds and may use.
    pub memory: StepMemory,
}

/// How much of its job's memory on a node a step holds (and is limited to), as Slurm's
/// `srun --mem*` inside an allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepMemory {
    /// No `--mem`: all of the job's memory there, held (a second such step waits).
    #[default]
    Whole,
    /// `--mem=0`: all of the job's memory there, held by none.
    Shared,
    PerNodeMib(u64),
    PerCpuMib(u64),
    PerGpuMib(u64),
}

/// A terminal's size in characters, as `TIOCGWINSZ` gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// Which tasks of a step read `srun`'s stdin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepStdin {
    /// `--input=none`: every task reads `/dev/null`.
    #[default]
    Nothing,
    /// Slurm's default (`--input=all`): every task reads all of it.
    All,
    /// `--input=N`: task N alone.
    Task(u32),
}

impl StepStdin {
    /// Whether task `rank` reads the step's stdin.
    pub fn reaches(self, rank: u32) -> bool {
        match self {
            StepStdin::Nothing => false,
            StepStdin::All => true,
            StepStdin::Task(r) => r == rank,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepNode {
    pub name: String,
    /// Global ranks of the tasks on this node; the local id is the position here.
    pub ranks: Vec<u32>,
}

impl StepSpec {
    /// Checks sizes and shapes: the spec arrives from a user's `srun`.
    pub fn validate(&self) -> Result<(), String> {
        use limits::*;
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err("a step needs a command".into());
        }
        if self.argv.len() > ARGV_COUNT_MAX || self.argv.iter().map(String::len).sum::<usize>() > ARGV_BYTES_MAX {
            return Err(format!("step arguments past {ARGV_COUNT_MAX} or {ARGV_BYTES_MAX} bytes"));
        }
        if self.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum::<usize>() > ENV_BYTES_MAX {
            return Err(format!("step environment larger than {ENV_BYTES_MAX} bytes"));
        }
        if self.workdir.as_ref().is_some_and(|w| w.len() > PATH_BYTES_MAX || w.contains('\0')) {
            return Err("bad working directory".into());
        }
        if self.nodes.is_empty() || self.nodes.len() > NODES_PER_JOB_MAX as usize {
            return Err(format!("a step runs on 1..={NODES_PER_JOB_MAX} nodes"));
        }
        let tasks: usize = self.nodes.iter().map(|n| n.ranks.len()).sum();
        if tasks == 0 || tasks > STEP_TASKS_MAX || self.nodes.iter().any(|n| n.ranks.len() > TASKS_PER_NODE_MAX as usize) {
            return Err(format!("a step has 1..={STEP_TASKS_MAX} tasks, at most {TASKS_PER_NODE_MAX} per node"));
        }
        let mut ranks: Vec<u32> = self.nodes.iter().flat_map(|n| n.ranks.iter().copied()).collect();
        ranks.sort_unstable();
        if ranks.iter().enumerate().any(|(i, r)| *r as usize != i) {
            return Err("task ranks must be 0..N, each once".into());
        }
        let mut names: Vec<&str> = self.nodes.iter().map(|n| n.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err("a node is listed twice".into());
        }
        if self.gpus_per_task.is_some_and(|g| g == 0 || g > GPUS_PER_JOB_MAX) {
            return Err(format!("gpus per task must be 1..={GPUS_PER_JOB_MAX}"));
        }
        if self.gpus_per_node.is_some_and(|g| g > GPUS_PER_JOB_MAX) {
            return Err(format!("gpus per node must be 0..={GPUS_PER_JOB_MAX}"));
        }
        if self.name.as_ref().is_some_and(|n| n.len() > PATH_BYTES_MAX) {
            return Err(format!("a step's name has at most {PATH_BYTES_MAX} bytes"));
        }
        if self.cpus_per_task == 0 || self.cpus_per_task > CPUS_PER_TASK_MAX {
            return Err(format!("cpus per task must be 1..={CPUS_PER_TASK_MAX}"));
        }
        if matches!(self.stdin, StepStdin::Task(r) if r as usize >= tasks) {
            return Err(format!("stdin goes to a task of 0..{tasks}"));
        }
        if self.pty.is_some() && !matches!(self.stdin, StepStdin::Task(0) | StepStdin::Nothing) {
            return Err("a step with a pseudo-terminal reads stdin in task 0 alone".into());
        }
        Ok(())
    }
}

/// Output of one task of a step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepChunk {
    pub rank: u32,
    pub stream: LogStream,
    pub data: Vec<u8>,
}

/// What one live task of a step (or a batch script) uses on its node, summed over the processes
/// of its session, as `sstat` shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskUsage {
    /// None: the batch script (`ID.batch`).
    pub step: Option<u32>,
    pub rank: u32,
    /// User and system CPU time.
    pub cpu_ms: u64,
    pub rss_kib: u64,
    pub vmsize_kib: u64,
    /// Major page faults.
    pub pages: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// The most task usages one node answers for one job.
pub const TASK_USAGES_MAX: usize = 4_096;

/// How one task of a step ended: its exit code, or the signal that killed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskExit {
    pub rank: u32,
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl TaskExit {
    /// The shell's view: the code, or 128 + the signal.
    pub fn status(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 1,
        }
    }
}

/// The end of one step's tasks on one node ([`PeerRequest::ReportStepEnds`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepEnd {
    pub job: JobId,
    pub run: RunNo,
    pub step: u32,
    pub exit_code: i32,
    pub signal: Option<i32>,
}

/// Step ends in one `ReportStepEnds` at most.
pub const STEP_ENDS_PER_REQUEST_MAX: usize = 512;

/// Why a step of a suspended job waits ([`ApiError::Busy`]): Slurm's words, which its `srun`
/// prints while it retries.
pub const STEPS_DISABLED_SUSPENDED: &str = "Requested operation is presently disabled";

/// Ports a step's rendezvous (`PET_MASTER_PORT` of an `srun`) is chosen from, on the node that
/// numbers it: after the jobs' range and below Linux's ephemeral ports (32768 up), so no
/// outgoing connection takes one between the choice and the bind.
pub const STEP_PORT_FIRST: u16 = 30_500;
pub const STEP_PORT_COUNT: u16 = 2_000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::*;

    /// Two nodes of two tasks each, ranks 0-1 and 2-3.
    fn good() -> StepSpec {
        StepSpec {
            argv: vec!["python".into(), "train.py".into()],
            workdir: None,
            env: BTreeMap::new(),
            nodes: vec![StepNode { name: "n1".into(), ranks: vec![0, 1] }, StepNode { name: "n2".into(), ranks: vec![2, 3] }],
            gpus_per_task: None,
            stdin: StepStdin::All,
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
        }
    }

    /// Asserts that `spec` is refused with a message holding `expected`.
    fn refused(spec: &StepSpec, expected: &str) {
        match spec.validate() {
            Ok(()) => panic!("a step that should be refused ({expected}) passed"),
            Err(e) => assert!(e.contains(expected), "refused with '{e}', expected '{expected}'"),
        }
    }

    #[test]
    fn a_well_formed_step_passes() {
        assert_eq!(good().validate(), Ok(()));
        let mut s = good();
        s.pty = Some(PtySize { rows: 24, cols: 80 });
        s.stdin = StepStdin::Task(0);
        s.gpus_per_task = Some(1);
        s.gpus_per_node = Some(0);
        s.workdir = Some("/scratch".into());
        s.name = Some("train".into());
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn a_step_without_a_command_or_with_oversized_input_is_refused() {
        let mut s = good();
        s.argv.clear();
        refused(&s, "a step needs a command");
        s.argv = vec![String::new(), "x".into()];
        refused(&s, "a step needs a command");
        s.argv = vec!["a".into(); ARGV_COUNT_MAX + 1];
        refused(&s, &format!("step arguments past {ARGV_COUNT_MAX} or {ARGV_BYTES_MAX} bytes"));
        s.argv = vec!["/bin/echo".into(), "x".repeat(ARGV_BYTES_MAX)];
        refused(&s, &format!("step arguments past {ARGV_COUNT_MAX} or {ARGV_BYTES_MAX} bytes"));

        let mut s = good();
        s.env.insert("BIG".into(), "v".repeat(ENV_BYTES_MAX));
        refused(&s, &format!("step environment larger than {ENV_BYTES_MAX} bytes"));
        let mut s = good();
        s.workdir = Some("/a\0b".into());
        refused(&s, "bad working directory");
        s.workdir = Some(format!("/{}", "d".repeat(PATH_BYTES_MAX)));
        refused(&s, "bad working directory");
        let mut s = good();
        s.name = Some("n".repeat(PATH_BYTES_MAX + 1));
        refused(&s, &format!("a step's name has at most {PATH_BYTES_MAX} bytes"));
    }

    #[test]
    fn nodes_and_tasks_are_bounded() {
        let mut s = good();
        s.nodes.clear();
        refused(&s, &format!("a step runs on 1..={NODES_PER_JOB_MAX} nodes"));
        s.nodes = (0..=NODES_PER_JOB_MAX).map(|i| StepNode { name: format!("n{i}"), ranks: vec![i] }).collect();
        refused(&s, &format!("a step runs on 1..={NODES_PER_JOB_MAX} nodes"));

        let tasks_refusal = format!("a step has 1..={STEP_TASKS_MAX} tasks, at most {TASKS_PER_NODE_MAX} per node");
        let mut s = good();
        s.nodes = vec![StepNode { name: "n1".into(), ranks: vec![] }];
        refused(&s, &tasks_refusal);
        s.nodes = vec![StepNode { name: "n1".into(), ranks: (0..=TASKS_PER_NODE_MAX).collect() }];
        refused(&s, &tasks_refusal);
        s.nodes = vec![StepNode { name: "n1".into(), ranks: (0..TASKS_PER_NODE_MAX).collect() }];
        assert_eq!(s.validate(), Ok(()), "exactly the most tasks a node may have");
    }

    #[test]
    fn ranks_are_each_of_0_to_n_once_and_nodes_are_listed_once() {
        let mut s = good();
        s.nodes[1].ranks = vec![2, 4];
        refused(&s, "task ranks must be 0..N, each once");
        s.nodes[1].ranks = vec![1, 2];
        refused(&s, "task ranks must be 0..N, each once");
        let mut s = good();
        s.nodes[1].name = "n1".into();
        refused(&s, "a node is listed twice");
    }

    #[test]
    fn gpus_cpus_and_stdin_must_fit_the_step() {
        let mut s = good();
        for g in [0, GPUS_PER_JOB_MAX + 1] {
            s.gpus_per_task = Some(g);
            refused(&s, &format!("gpus per task must be 1..={GPUS_PER_JOB_MAX}"));
        }
        let mut s = good();
        s.gpus_per_node = Some(GPUS_PER_JOB_MAX + 1);
        refused(&s, &format!("gpus per node must be 0..={GPUS_PER_JOB_MAX}"));
        for cpus in [0, CPUS_PER_TASK_MAX + 1] {
            let mut s = good();
            s.cpus_per_task = cpus;
            refused(&s, &format!("cpus per task must be 1..={CPUS_PER_TASK_MAX}"));
        }
        let mut s = good();
        s.stdin = StepStdin::Task(3);
        assert_eq!(s.validate(), Ok(()));
        s.stdin = StepStdin::Task(4);
        refused(&s, "stdin goes to a task of 0..4");
        let mut s = good();
        s.pty = Some(PtySize { rows: 24, cols: 80 });
        s.stdin = StepStdin::Nothing;
        assert_eq!(s.validate(), Ok(()));
        for stdin in [StepStdin::All, StepStdin::Task(1)] {
            s.stdin = stdin;
            refused(&s, "a step with a pseudo-terminal reads stdin in task 0 alone");
        }
    }

    #[test]
    fn stdin_reaches_the_tasks_it_names_and_exits_read_as_a_shell_would() {
        assert!(!StepStdin::Nothing.reaches(0));
        assert!(StepStdin::All.reaches(7));
        assert!(StepStdin::Task(2).reaches(2));
        assert!(!StepStdin::Task(2).reaches(0));
        assert_eq!(TaskExit { rank: 0, code: Some(3), signal: None }.status(), 3);
        assert_eq!(TaskExit { rank: 0, code: None, signal: Some(9) }.status(), 137);
        assert_eq!(TaskExit { rank: 0, code: None, signal: None }.status(), 1);
    }
}
