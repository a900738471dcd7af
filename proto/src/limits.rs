//! Bounds on everything that crosses the wire. Every decoded frame and field is checked against
//! one of these; a value past its bound is an error, never a panic or an unbounded allocation.

/// Largest frame a peer may send (snapshots included).
pub const FRAME_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Largest frame a client request may use.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024 * 1024;
pub const JOB_NAME_BYTES_MAX: usize = 256;
pub const ARGV_COUNT_MAX: usize = 4096;
pub const ARGV_BYTES_MAX: usize = 256 * 1024;
pub const SCRIPT_BYTES_MAX: usize = 1024 * 1024;
pub const ENV_BYTES_MAX: usize = 1024 * 1024;
pub const PATH_BYTES_MAX: usize = 4096;
pub const GPUS_PER_JOB_MAX: u32 = 1024;
pub const CPUS_PER_TASK_MAX: u32 = 4096;
/// Largest chunk of a job's output returned by one `Logs` request.
pub const LOG_CHUNK_BYTES_MAX: u32 = 1024 * 1024;
pub const NODES_PER_JOB_MAX: u32 = 4096;
pub const TASKS_PER_NODE_MAX: u32 = 1024;
pub const ARRAY_TASKS_MAX: usize = 100_000;
