//! The stdin of step tasks. `srun` sends what it reads in chunks (`ClientRequest::StepInput`, each
//! with its offset) to every node of the step; a node writes each chunk once to the tasks there
//! that read stdin (`StepStdin`), through the run's shepherd (`input STEP RANK`: one connection
//! per task, open until the end of the input, which the task then reads as EOF).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use proto::{ApiError, JobId};
use tokio::io::AsyncWriteExt;

use crate::run::shepherd;

/// Steps fed at once on a node; a step past this runs its tasks on `/dev/null`.
pub const FEEDS_MAX: usize = 4_096;
/// How long one chunk may wait for a task to take it.
const WRITE_WAIT_MS: u64 = 30_000;

/// The stdin of one step's tasks on this node.
struct Feed {
    /// The run's shepherd directory.
    dir: PathBuf,
    ranks: Vec<u32>,
    /// Bytes written so far: a chunk's offset is checked against it.
    written: u64,
    /// One per task that still reads, opened before the first byte is written.
    conns: Vec<(u32, tokio::net::UnixStream)>,
    /// Every task's connection was opened (later ones that fail are dropped, not reopened).
    opened: bool,
    closed: bool,
}

/// One feed, locked across its writes (chunks of one step are written one at a time).
type SharedFeed = Arc<tokio::sync::Mutex<Feed>>;

/// The feeds of this node's steps, by (job, step).
#[derive(Default)]
pub struct Feeds {
    map: Mutex<BTreeMap<(JobId, u32), SharedFeed>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Feeds {
    /// Whether the step `step` of `job` may have its tasks `ranks` read stdin here (false
    /// when [`FEEDS_MAX`] steps are fed already); call before its tasks start.
    pub fn open(&self, job: JobId, step: u32, dir: PathBuf, ranks: Vec<u32>) -> bool {
        let mut map = lock(&self.map);
        if map.len() >= FEEDS_MAX && !map.contains_key(&(job, step)) {
            return false;
        }
        let feed = Feed { dir, ranks, written: 0, conns: Vec::new(), opened: false, closed: false };
        map.insert((job, step), Arc::new(tokio::sync::Mutex::new(feed)));
        true
    }

    /// Forgets every feed of `job` (its run ended here).
    pub fn forget_job(&self, job: JobId) {
        lock(&self.map).retain(|(j, _), _| *j != job);
    }

    /// Forgets the feed of one step (read to its end).
    pub fn forget(&self, job: JobId, step: u32) {
        lock(&self.map).remove(&(job, step));
    }

    /// Writes `data`, bytes `offset..` of the step's stdin, to its tasks here; `eof` closes
    /// their stdin. A chunk sent again is written once; a task that closed its stdin gets no
    /// more (its share is dropped, as the pipe would).
    pub async fn feed(&self, job: JobId, step: u32, node_name: &str, offset: u64, data: &[u8], eof: bool) -> Result<(), ApiError> {
        let feed = lock(&self.map).get(&(job, step)).cloned();
        let feed = feed.ok_or_else(|| ApiError::NotFound(format!("step {job}.{step} reads no stdin on {node_name}")))?;
        let mut feed = feed.lock().await;
        if feed.closed {
            return Ok(());
        }
        if offset > feed.written {
            return Err(ApiError::Invalid(format!("stdin of step {job}.{step} at byte {offset}, expected {}", feed.written)));
        }
        let skip = usize::try_from(feed.written - offset).unwrap_or(usize::MAX).min(data.len());
        let fresh = &data[skip..];
        if !feed.opened {
            // Nothing is written before every task's stdin is open: one that fails is asked
            // again with the next try of this first chunk, and misses nothing.
            let missing: Vec<u32> = feed.ranks.iter().copied().filter(|r| !feed.conns.iter().any(|(c, _)| c == r)).collect();
            for rank in missing {
                let conn = shepherd::open_input(&feed.dir, step, rank).await.map_err(|e| {
                    ApiError::Unavailable(format!("open the stdin of task {rank} of step {job}.{step} on {node_name}: {e:#}"))
                })?;
                feed.conns.push((rank, conn));
            }
            feed.opened = true;
        }
        let mut open = Vec::with_capacity(feed.conns.len());
        for (rank, mut c) in feed.conns.drain(..) {
            // A task that reads nothing for this long loses its stdin (it reads EOF after
            // what its pipe holds) rather than stall the step's other tasks and srun.
            match tokio::time::timeout(std::time::Duration::from_millis(WRITE_WAIT_MS), c.write_all(fresh)).await {
                Ok(Ok(())) => open.push((rank, c)),
                Ok(Err(_)) => {}
                Err(_) => tracing::warn!(job, step, rank, "the task read none of its stdin for 30 s: its stdin is closed"),
            }
        }
        feed.conns = open;
        feed.written += fresh.len() as u64;
        if eof {
            feed.closed = true;
            feed.conns.clear();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn written(feeds: &Feeds, job: JobId, step: u32) -> u64 {
        let feed = lock(&feeds.map).get(&(job, step)).cloned().expect("feed");
        let w = feed.lock().await.written;
        w
    }

    /// A chunk sent again (its reply was lost) is written once, a part of one once, a gap is
    /// refused, and after the end nothing more is written.
    #[tokio::test]
    async fn each_byte_is_written_once_whatever_is_sent_again() {
        let feeds = Feeds::default();
        // No task reads here (an empty list): the bookkeeping is the same.
        assert!(feeds.open(7, 0, PathBuf::from("/nonexistent"), vec![]));
        assert!(feeds.feed(7, 0, "n1", 0, b"abc", false).await.is_ok());
        assert!(feeds.feed(7, 0, "n1", 0, b"abc", false).await.is_ok());
        assert_eq!(written(&feeds, 7, 0).await, 3);
        assert!(feeds.feed(7, 0, "n1", 2, b"cde", false).await.is_ok());
        assert_eq!(written(&feeds, 7, 0).await, 5);
        assert!(matches!(feeds.feed(7, 0, "n1", 9, b"x", false).await, Err(ApiError::Invalid(_))));
        assert!(feeds.feed(7, 0, "n1", 5, b"", true).await.is_ok());
        assert!(feeds.feed(7, 0, "n1", 5, b"late", false).await.is_ok());
        assert_eq!(written(&feeds, 7, 0).await, 5, "nothing after the end");
        assert!(matches!(feeds.feed(7, 1, "n1", 0, b"x", false).await, Err(ApiError::NotFound(_))));
        // A task whose shepherd cannot be reached: the first chunk is refused, nothing written.
        assert!(feeds.open(7, 2, PathBuf::from("/nonexistent"), vec![0]));
        assert!(matches!(feeds.feed(7, 2, "n1", 0, b"abc", false).await, Err(ApiError::Unavailable(_))));
        assert_eq!(written(&feeds, 7, 2).await, 0);
        feeds.forget_job(7);
        assert!(lock(&feeds.map).is_empty());
    }
}
