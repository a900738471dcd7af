//! Bounds on everything that crosses the wire. Every decoded frame and field is checked against
//! one of these; a value past its bound is an error, never a panic or an unbounded allocation.

/// Largest frame a peer may send (snapshots included).
pub const FRAME_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Largest request a client may send to a node's local socket (`transport::local`). Over QUIC,
/// requests share [`FRAME_BYTES_MAX`] with the peers' Raft traffic: the transport reads a frame
/// before it knows what it holds.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024 * 1024;
pub const JOB_NAME_BYTES_MAX: usize = 256;
pub const ARGV_COUNT_MAX: usize = 4096;
pub const ARGV_BYTES_MAX: usize = 256 * 1024;
pub const SCRIPT_BYTES_MAX: usize = 1024 * 1024;
pub const ENV_BYTES_MAX: usize = 1024 * 1024;
pub const PATH_BYTES_MAX: usize = 4096;
pub const GPUS_PER_JOB_MAX: u32 = 1024;
/// Shards one GPU may be configured with (`shards_per_gpu`), and so that one job may ask on a node:
/// 16 bits of an allocation's slot id (`scheduler::shard_slot`).
pub const SHARDS_PER_GPU_MAX: u32 = 65_535;
pub const CPUS_PER_TASK_MAX: u32 = 4096;
/// Largest chunk of a job's output returned by one `Logs` request.
pub const LOG_CHUNK_BYTES_MAX: u32 = 1024 * 1024;
pub const NODES_PER_JOB_MAX: u32 = 4096;
pub const TASKS_PER_NODE_MAX: u32 = 1024;
/// How long a node keeps a step's hold ([`crate::Request::StepHold`]) that no start took.
pub const STEP_HOLD_MS_MAX: u64 = 30_000;
pub const ARRAY_TASKS_MAX: usize = 100_000;
/// Ranges of task ids in one array's spec (`--array=1,3,7-9` is three).
pub const ARRAY_RUNS_MAX: usize = 4096;
/// Tasks of one job step, over all its nodes.
pub const STEP_TASKS_MAX: usize = 65_536;
/// Output of a step's tasks on one node held for its `srun` before the tasks are made to wait.
pub const STEP_OUTPUT_BUFFER_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Output of a step returned by one `StepRead`.
pub const STEP_READ_BYTES_MAX: usize = 1024 * 1024;
/// Longest a `StepRead` waits for news.
pub const STEP_READ_WAIT_MS_MAX: u32 = 5_000;
/// Bytes of one `StepInput` chunk.
pub const STEP_INPUT_BYTES_MAX: usize = 64 * 1024;
/// Steps of one job alive at once on a node.
pub const STEPS_PER_JOB_MAX: usize = 512;
/// Steps of a job's run its record keeps for accounting (`sacct`'s `ID.N` lines); past it
/// the oldest ended one is dropped.
pub const STEP_RECORDS_PER_JOB_MAX: usize = 512;
/// Bytes of a step's name as recorded.
pub const STEP_NAME_BYTES_MAX: usize = 256;
/// Nodes one partition's `Nodes=` list names at most.
pub const PARTITION_NODES_MAX: usize = 10_000;
