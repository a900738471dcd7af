//! Snapshots as files of bounded frames, never one buffer: the hot state (a header, then jobs in
//! chunks), and, when sent to a follower, the accounting store streamed after it in chunks.
//!
//! A frame on disk and on the wire is a big-endian `u32` length and a `proto::encode`d
//! [`Frame`] of at most [`FRAME_BYTES_MAX`]. A node's own snapshot file holds `Header`,
//! `Jobs`*, `HotEnd`; a snapshot sent to a follower continues with `Accounting`*, `End`, read
//! from the sender's store as it is at send time (see `accounting` for why that is enough).

use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use proto::Job;
use rocksdb::DB;
use serde::{Deserialize, Serialize};

use crate::accounting;
use crate::state::ClusterState;
use crate::types::{LogId, StoredMembership};

/// Largest frame written or read.
pub const FRAME_BYTES_MAX: usize = 64 * 1024 * 1024;
/// A jobs or accounting frame is closed once it holds this many bytes.
const CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// Accounting records read from the store per frame.
const RECORDS_PER_FRAME: usize = 2048;

/// One frame, as read back.
#[derive(Debug, Deserialize)]
pub(crate) enum Frame {
    /// The hot state without its jobs.
    Header {
        last_applied: Option<LogId>,
        membership: StoredMembership,
        state: Box<ClusterState>,
    },
    Jobs(Vec<Job>),
    /// The hot state is complete: `jobs` jobs in all.
    HotEnd {
        jobs: u64,
    },
    Accounting(Vec<Job>),
    /// The stream is complete: `records` accounting records in all.
    End {
        records: u64,
    },
}

/// [`Frame`] as written, borrowing what it writes (the same encoding).
#[derive(Serialize)]
enum FrameRef<'a> {
    Header { last_applied: &'a Option<LogId>, membership: &'a StoredMembership, state: &'a ClusterState },
    Jobs(&'a [&'a Job]),
    HotEnd { jobs: u64 },
    Accounting(&'a [Job]),
    End { records: u64 },
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn framed(frame: &FrameRef<'_>) -> Vec<u8> {
    let body = proto::encode(frame);
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// The hot state at `last_applied` as encoded frames (taken on the state machine task; its cost
/// is proportional to the live jobs, never to history).
pub(crate) fn encode_hot(last_applied: &Option<LogId>, membership: &StoredMembership, state: &ClusterState) -> Vec<Vec<u8>> {
    let header = state.clone_without_jobs();
    let mut frames = vec![framed(&FrameRef::Header { last_applied, membership, state: &header })];
    let mut chunk: Vec<&Job> = Vec::new();
    let mut chunk_bytes = 0usize;
    for job in state.jobs.values() {
        chunk_bytes += job.spec.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
            + job.spec.script.as_ref().map_or(0, String::len)
            + job.spec.argv.iter().map(String::len).sum::<usize>()
            + 512;
        chunk.push(job);
        if chunk_bytes >= CHUNK_BYTES {
            frames.push(framed(&FrameRef::Jobs(&chunk)));
            chunk.clear();
            chunk_bytes = 0;
        }
    }
    if !chunk.is_empty() {
        frames.push(framed(&FrameRef::Jobs(&chunk)));
    }
    frames.push(framed(&FrameRef::HotEnd { jobs: state.jobs.len() as u64 }));
    frames
}

/// Reads one frame; `None` at a clean end of the input.
pub(crate) fn read_frame(r: &mut impl Read) -> io::Result<Option<(Frame, u64)>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > FRAME_BYTES_MAX {
        return Err(invalid(format!("snapshot frame of {len} bytes, more than {FRAME_BYTES_MAX}")));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| invalid(format!("snapshot frame cut short: {e}")))?;
    let frame = proto::decode(&body, FRAME_BYTES_MAX).map_err(|e| invalid(format!("decode snapshot frame: {e}")))?;
    Ok(Some((frame, 4 + len as u64)))
}

/// The hot part of a snapshot read back, and how many bytes of the input it took.
pub(crate) struct HotState {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub state: ClusterState,
    pub bytes: u64,
}

/// Reads `Header`, `Jobs`*, `HotEnd` from `r`.
pub(crate) fn read_hot(r: &mut impl Read) -> io::Result<HotState> {
    let Some((Frame::Header { last_applied, membership, state }, mut bytes)) = read_frame(r)? else {
        return Err(invalid("snapshot does not start with its header"));
    };
    let mut state = *state;
    loop {
        match read_frame(r)? {
            Some((Frame::Jobs(jobs), n)) => {
                bytes += n;
                for job in jobs {
                    state.jobs.insert(job.id, job);
                }
            }
            Some((Frame::HotEnd { jobs }, n)) => {
                bytes += n;
                if jobs != state.jobs.len() as u64 {
                    return Err(invalid(format!("snapshot says {jobs} jobs but holds {}", state.jobs.len())));
                }
                state.share_array_specs();
                state.submit_keys = crate::submit_keys::SubmitKeys::of(&state.jobs);
                state.holding_parts = ClusterState::holding_parts_of(&state.jobs);
                return Ok(HotState { last_applied, membership, state, bytes });
            }
            Some((other, _)) => return Err(invalid(format!("unexpected frame in a snapshot's hot state: {other:?}"))),
            None => return Err(invalid("snapshot ends inside its hot state")),
        }
    }
}

/// Writes `frames` to a new file `path` and syncs it.
pub(crate) fn write_file(path: &Path, frames: &[Vec<u8>]) -> io::Result<()> {
    let file = File::create(path)?;
    let mut w = BufWriter::new(file);
    for f in frames {
        w.write_all(f)?;
    }
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()
}

/// A handle on `file` read from its start (clones share one offset: every reader rewinds).
pub(crate) fn rewound(file: &File) -> io::Result<File> {
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::Start(0))?;
    Ok(f)
}

/// Copies the first `bytes` of `from` into a new synced file `to`.
pub(crate) fn copy_prefix(from: &File, bytes: u64, to: &Path) -> io::Result<()> {
    let mut reader = BufReader::new(rewound(from)?);
    let out = File::create(to)?;
    let mut w = BufWriter::new(out);
    let copied = io::copy(&mut (&mut reader).take(bytes), &mut w)?;
    if copied != bytes {
        return Err(invalid(format!("snapshot of {copied} bytes, expected {bytes}")));
    }
    let out = w.into_inner().map_err(|e| e.into_error())?;
    out.sync_all()
}

/// Where the accounting records of a snapshot come from. Weak: a handle never keeps a closed
/// store's database open.
#[derive(Clone)]
pub(crate) struct AccountingSource {
    pub db: std::sync::Weak<DB>,
    pub gen: Arc<AtomicU32>,
}

impl AccountingSource {
    /// The database, unless the store was closed.
    pub fn db(&self) -> io::Result<Arc<DB>> {
        self.db.upgrade().ok_or_else(|| io::Error::other("the accounting store is closed"))
    }
}

/// A snapshot of the job log: openraft's meta and our [`SnapshotData`].
pub type Snapshot = openraft::type_config::alias::SnapshotOf<crate::types::TypeConfig, SnapshotData>;

/// A snapshot: its file, and, for one this node sends, the store whose accounting records
/// follow the file's frames. A received snapshot has them in the file.
pub struct SnapshotData {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) accounting: Option<AccountingSource>,
}

impl fmt::Debug for SnapshotData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotData").field("path", &self.path).field("streams_accounting", &self.accounting.is_some()).finish()
    }
}

impl SnapshotData {
    /// A snapshot received into `path` (hot state and accounting records both in the file).
    pub fn received(path: PathBuf) -> io::Result<SnapshotData> {
        Ok(SnapshotData { file: File::open(&path)?, path, accounting: None })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole stream a follower receives, `chunk_bytes` at a time, given to `f`: the file,
    /// then the accounting records as the store holds them now, then `End`. Blocking: run it
    /// off the async runtime.
    pub fn stream(&self, chunk_bytes: usize, mut f: impl FnMut(Vec<u8>) -> io::Result<()>) -> io::Result<()> {
        let mut reader = BufReader::new(rewound(&self.file)?);
        let mut buf = Vec::with_capacity(chunk_bytes);
        loop {
            let mut piece = Vec::with_capacity(chunk_bytes);
            let n = (&mut reader).take(chunk_bytes as u64).read_to_end(&mut piece)?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&piece);
            if buf.len() >= chunk_bytes {
                f(std::mem::take(&mut buf))?;
            }
        }
        let records = match &self.accounting {
            Some(source) => {
                let gen = source.gen.load(Ordering::Acquire);
                accounting::for_each_chunk(&*source.db()?, gen, RECORDS_PER_FRAME, |records| {
                    buf.extend_from_slice(&framed(&FrameRef::Accounting(&records)));
                    if buf.len() >= chunk_bytes {
                        f(std::mem::take(&mut buf))?;
                    }
                    Ok(())
                })?
            }
            None => 0,
        };
        buf.extend_from_slice(&framed(&FrameRef::End { records }));
        f(buf)
    }
}

/// Reads the accounting part that follows the hot state in `r` (a received snapshot), giving
/// each frame's records to `f`; checks the count in `End`.
pub(crate) fn read_accounting(r: &mut impl Read, mut f: impl FnMut(Vec<Job>) -> io::Result<()>) -> io::Result<u64> {
    let mut count = 0u64;
    loop {
        match read_frame(r)? {
            Some((Frame::Accounting(records), _)) => {
                count += records.len() as u64;
                f(records)?;
            }
            Some((Frame::End { records }, _)) => {
                if records != count {
                    return Err(invalid(format!("snapshot says {records} accounting records but holds {count}")));
                }
                return Ok(count);
            }
            Some((other, _)) => return Err(invalid(format!("unexpected frame in a snapshot's accounting part: {other:?}"))),
            None => return Err(invalid("snapshot ends inside its accounting part")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_state_round_trips_through_frames_and_garbage_is_an_error() {
        let mut state = ClusterState::default();
        for id in 1..=300u64 {
            let mut spec = proto::JobSpec::command(vec!["true".into()], "/tmp", "alice");
            spec.env.insert("BIG".into(), "x".repeat(40_000));
            state.apply(&proto::Command::Submit { spec, now_ms: id });
        }
        let frames = encode_hot(&None, &StoredMembership::default(), &state);
        assert!(frames.len() > 3, "jobs split into several frames: {}", frames.len());
        let bytes: Vec<u8> = frames.concat();
        let hot = read_hot(&mut bytes.as_slice()).expect("read back");
        assert_eq!(hot.state, state);
        assert_eq!(hot.bytes, bytes.len() as u64);
        assert!(read_hot(&mut &bytes[..bytes.len() - 3]).is_err());
        assert!(read_hot(&mut [0xff, 0xff, 0xff, 0xff].as_slice()).is_err());
        assert!(read_hot(&mut [0, 0, 0, 2, 9, 9].as_slice()).is_err());
    }

    #[test]
    fn array_tasks_share_their_spec_in_memory_and_again_after_a_snapshot() {
        let mut state = ClusterState::default();
        let inventory = proto::Inventory {
            gpus: (0..8)
                .map(|i| proto::GpuInfo {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    gres_type: "h100".into(),
                    healthy: true,
                    ..Default::default()
                })
                .collect(),
            cpus: 64,
            memory_mib: 512 * 1024,
            ..Default::default()
        };
        state.apply(&proto::Command::RegisterNode {
            name: "n1".into(),
            addr: "a".into(),
            inventory,
            instance: 1,
            cert_fingerprint: String::new(),
            now_ms: 1,
        });
        let mut spec = proto::JobSpec::command(vec!["true".into()], "/tmp", "alice");
        spec.env.insert("BIG".into(), "x".repeat(10_000));
        spec.gres = Some(proto::GresRequest { gpu_type: None, count: 1, ..Default::default() });
        spec.mem_mib = 1024;
        spec.array = Some(proto::ArraySpec::from_ids(&(1..=6).collect::<Vec<u32>>(), None));
        state.apply(&proto::Command::Submit { spec, now_ms: 2 });
        let plan = scheduler::schedule(&state.scheduler_view(), 3);
        assert_eq!(plan.placements.len(), 6, "{plan:?}");
        let array_tasks: Vec<(u32, u32)> = plan.array_tasks.iter().map(|a| (a.placement as u32, a.task)).collect();
        state.apply(&proto::Command::Plan { placements: plan.placements, array_tasks, now_ms: 3 });
        let shared = |s: &ClusterState| {
            let parent = &s.jobs[&1].spec;
            s.jobs.values().filter(|j| std::sync::Arc::ptr_eq(&j.spec, parent)).count()
        };
        assert_eq!(state.jobs.len(), 6);
        assert_eq!(shared(&state), 6, "every task shares the array's spec");
        let frames = encode_hot(&None, &StoredMembership::default(), &state);
        let back = read_hot(&mut frames.concat().as_slice()).expect("read back").state;
        assert_eq!(back, state);
        assert_eq!(shared(&back), 6, "shared again after a snapshot");
    }
}
