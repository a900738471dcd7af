//! Output of runs: `corral logs` reads the latest run of a job here, where the ledger says its
//! output went.

use std::io::{Read, Seek, SeekFrom};

use proto::{ApiError, JobId, LogStream, Reply};

use super::{lock, Agent};

impl Agent {
    /// A chunk of the output of the latest run of `job` on this node.
    pub fn read_log(&self, job: JobId, stream: LogStream, offset: u64, max_bytes: u32) -> Result<Reply, ApiError> {
        let path = {
            let ledger = lock(&self.ledger);
            let entry = ledger.latest(job).ok_or_else(|| ApiError::NotFound(format!("no output of job {job} on {}", self.name)))?;
            match stream {
                LogStream::Stdout => entry.stdout.clone(),
                LogStream::Stderr => entry.stderr.clone(),
            }
        };
        let finished = !lock(&self.running).contains_key(&job);
        let max_bytes = max_bytes.min(proto::limits::LOG_CHUNK_BYTES_MAX) as usize;
        let mut data = Vec::new();
        let mut start = offset;
        match std::fs::File::open(&path) {
            Ok(mut f) => {
                start = if offset == proto::LOG_OFFSET_TAIL {
                    let len = f.metadata().map_err(|e| ApiError::Internal(format!("stat {}: {e}", path.display())))?.len();
                    len.saturating_sub(max_bytes as u64)
                } else {
                    offset
                };
                f.seek(SeekFrom::Start(start)).map_err(|e| ApiError::Internal(format!("seek {}: {e}", path.display())))?;
                f.take(max_bytes as u64).read_to_end(&mut data).map_err(|e| ApiError::Internal(format!("read {}: {e}", path.display())))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && offset == proto::LOG_OFFSET_TAIL => start = 0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ApiError::Internal(format!("open {}: {e}", path.display()))),
        }
        let next_offset = start.saturating_add(data.len() as u64);
        Ok(Reply::LogChunk { data, next_offset, finished })
    }
}
