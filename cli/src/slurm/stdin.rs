//! What `srun` reads from its stdin (or an `--input` file) goes to the step's tasks that read
//! it (`StepStdin`): in chunks of at most `STEP_INPUT_BYTES_MAX`, each sent with its offset to
//! every node holding such a task, so a chunk sent again after a lost reply is written once,
//! and an end (EOF) the tasks read as theirs. `--input` as Slurm 22.05 takes it: `all` (the
//! default), `none`, a task number, or a file every task reads.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use proto::{ApiError, ClientRequest, JobId, Reply, StepStdin};

use super::SlurmError;
use crate::client::Cluster;

const PROG: &str = "srun";
/// Chunks read ahead of what the nodes took.
const CHUNKS_AHEAD_MAX: usize = 4;
/// Tries of one chunk on one node before the step's stdin is given up.
const SEND_TRIES_MAX: u32 = 20;

/// Where the step's stdin comes from.
pub enum Source {
    Stdin,
    File(std::fs::File),
}

/// `--input` (none given: Slurm's default, every task reads srun's stdin). A stdin that is
/// `/dev/null` is left to the tasks as theirs: nothing is sent.
pub fn parse(input: Option<&str>) -> Result<(StepStdin, Option<Source>), SlurmError> {
    let stdin_source = || if stdin_is_dev_null() { None } else { Some(Source::Stdin) };
    match input {
        None | Some("all") => Ok(stdin_source().map_or((StepStdin::Nothing, None), |s| (StepStdin::All, Some(s)))),
        Some("none") => Ok((StepStdin::Nothing, None)),
        Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            let rank = n.parse().map_err(|_| SlurmError::fatal(PROG, format!("Invalid --input task: {n}")))?;
            Ok(stdin_source().map_or((StepStdin::Nothing, None), |s| (StepStdin::Task(rank), Some(s))))
        }
        Some(pattern) if pattern.contains('%') => {
            Err(SlurmError::fatal(PROG, format!("--input={pattern}: file name patterns are not supported yet")))
        }
        Some(path) => match std::fs::File::open(path) {
            Ok(f) => Ok((StepStdin::All, Some(Source::File(f)))),
            Err(e) => {
                let why = e.to_string().split(" (os error").next().unwrap_or_default().to_string();
                Err(SlurmError::fatal(PROG, format!("Could not open stdin file: {why}")))
            }
        },
    }
}

/// Whether this process's stdin is `/dev/null` (as in a batch script).
fn stdin_is_dev_null() -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(stdin), Ok(null)) = (std::fs::metadata("/dev/stdin"), std::fs::metadata("/dev/null")) else { return false };
    stdin.rdev() == null.rdev() && stdin.dev() == null.dev() && stdin.ino() == null.ino()
}

/// Sends `source` to the tasks of step `step` of `job` on `nodes` until its end, or until the
/// step is gone; runs beside srun's reading of the step's output.
pub fn start(cluster: Arc<Cluster>, job: JobId, step: u32, nodes: Vec<String>, source: Source) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(CHUNKS_AHEAD_MAX);
    std::thread::spawn(move || {
        let mut reader: Box<dyn Read> = match source {
            Source::Stdin => Box::new(std::io::stdin()),
            Source::File(f) => Box::new(f),
        };
        let mut buf = vec![0u8; proto::limits::STEP_INPUT_BYTES_MAX];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => 0,
            };
            // An empty chunk is the end.
            if tx.blocking_send(buf[..n].to_vec()).is_err() || n == 0 {
                return;
            }
        }
    });
    tokio::spawn(async move {
        let mut offset = 0u64;
        while let Some(data) = rx.recv().await {
            let eof = data.is_empty();
            for node in &nodes {
                if !send(&cluster, job, step, node, offset, &data, eof).await {
                    return;
                }
            }
            if eof {
                return;
            }
            offset += data.len() as u64;
        }
    })
}

/// One chunk to one node, tried again while the cluster is busy; false once no more is to be
/// sent: the step is gone there (its tasks ended, nothing to say), or the node refused or never
/// took the chunk (said on stderr: the tasks there read no more).
async fn send(cluster: &Cluster, job: JobId, step: u32, node: &str, offset: u64, data: &[u8], eof: bool) -> bool {
    let mut last = String::new();
    for _ in 0..SEND_TRIES_MAX {
        let request = ClientRequest::StepInput { job, step, node: node.to_string(), offset, data: data.to_vec(), eof };
        match cluster.call(request).await {
            Ok(Ok(Reply::Ok)) => return true,
            Ok(Err(ApiError::NotFound(_))) => return false,
            Ok(Err(e @ (ApiError::Denied(_) | ApiError::Invalid(_)))) => {
                last = e.to_string();
                break;
            }
            Ok(Ok(other)) => {
                last = format!("unexpected reply {other:?}");
                break;
            }
            Ok(Err(e)) => last = e.to_string(),
            Err(e) => last = format!("{e:#}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{PROG}: error: stdin of step {job}.{step} not delivered to {node}: {last}");
    false
}
