//! The follower's side of a streamed snapshot: its `SnapshotChunk`s appended in order to one
//! file at a time (`SnapshotInbox`), bounded by [`SNAPSHOT_BYTES_MAX`], and handed over whole
//! once the last arrives; `network` installs it in Raft.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::snapshot::{Snapshot, SnapshotData};
use crate::types::{LogId, SnapshotMeta, Vote};

/// Largest snapshot a follower accepts (a bound on the disk a sender can fill).
pub const SNAPSHOT_BYTES_MAX: u64 = 256 * 1024 * 1024 * 1024;

/// The payload of a `SnapshotChunk` RPC: the leader's vote, the snapshot's meta, where the
/// chunk starts, its bytes, and whether it is the last.
pub(crate) type SnapshotChunkRequest = (Vote, SnapshotMeta, u64, Vec<u8>, bool);

/// A snapshot being received: one at a time, its chunks in order, appended to a file.
pub struct SnapshotInbox {
    dir: PathBuf,
    current: tokio::sync::Mutex<Option<Incoming>>,
}

struct Incoming {
    vote: Vote,
    last_log_id: Option<LogId>,
    path: PathBuf,
    file: File,
    received: u64,
}

impl SnapshotInbox {
    /// Receives into files under `dir`.
    pub fn new(dir: PathBuf) -> SnapshotInbox {
        SnapshotInbox { dir, current: tokio::sync::Mutex::new(None) }
    }

    /// Appends one chunk; after the last, the whole snapshot, for the caller to install.
    pub(crate) async fn receive(&self, request: SnapshotChunkRequest) -> Result<Option<Received>, String> {
        let (vote, meta, offset, bytes, last) = request;
        let mut current = self.current.lock().await;
        if offset == 0 {
            if let Some(old) = current.take() {
                let _ = std::fs::remove_file(&old.path);
            }
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let path = self.dir.join(format!("recv-{nanos}.snap"));
            let file = File::create(&path).map_err(|e| format!("create {}: {e}", path.display()))?;
            *current = Some(Incoming { vote, last_log_id: meta.last_log_id, path, file, received: 0 });
        }
        let Some(incoming) = current.as_mut() else {
            return Err(format!("snapshot chunk at {offset} but no snapshot is being received"));
        };
        if incoming.vote != vote || incoming.last_log_id != meta.last_log_id || incoming.received != offset {
            return Err(format!("snapshot chunk at {offset} does not continue the snapshot being received (at {})", incoming.received));
        }
        let received = incoming.received + bytes.len() as u64;
        if received > SNAPSHOT_BYTES_MAX {
            return Err(format!("snapshot larger than {SNAPSHOT_BYTES_MAX} bytes"));
        }
        incoming.file.write_all(&bytes).map_err(|e| format!("write {}: {e}", incoming.path.display()))?;
        incoming.received = received;
        if !last {
            return Ok(None);
        }
        let Some(done) = current.take() else { return Err("snapshot vanished".into()) };
        Ok(Some(Received { meta, incoming: done }))
    }
}

/// A snapshot whose last chunk arrived: its file, to install and then remove.
pub(crate) struct Received {
    meta: SnapshotMeta,
    incoming: Incoming,
}

impl Received {
    pub(crate) fn path(&self) -> &Path {
        &self.incoming.path
    }

    /// The snapshot, its file synced and opened for reading.
    pub(crate) fn into_snapshot(self) -> Result<Snapshot, String> {
        let Received { meta, incoming } = self;
        incoming.file.sync_all().map_err(|e| format!("sync {}: {e}", incoming.path.display()))?;
        let data = SnapshotData::received(incoming.path.clone()).map_err(|e| format!("open {}: {e}", incoming.path.display()))?;
        Ok(Snapshot { meta, snapshot: data })
    }
}
