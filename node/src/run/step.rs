//! One job step on this node: the tasks an `srun` inside a batch job started here (through the
//! run's shepherd, which logs their output and exits on disk, `shepherd::StepLog`), their output
//! held until that `srun` reads it, and how each task ended. The output held in memory is
//! bounded (`STEP_OUTPUT_BUFFER_BYTES_MAX`): past it the follower stops reading the shepherd's
//! log, which keeps the rest on disk, so a slow `srun` loses nothing and costs no memory. A
//! daemon that takes a run over follows each step's log from its start again, skipping what the
//! `srun` already read (its first read says how far that is).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::limits::STEP_OUTPUT_BUFFER_BYTES_MAX;
use proto::{JobId, LogStream, RunNo, StepChunk, TaskExit};
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

use crate::run::launcher::TaskGroups;
use crate::run::shepherd;

pub struct Step {
    pub job: JobId,
    pub run: RunNo,
    pub id: u32,
    state: Mutex<State>,
    /// Output, an exit or a closed pipe: news for the reader.
    news: Notify,
    /// Output released: room for the pipes' readers.
    room: Notify,
    /// Times a read looked at the state (a waiting read looks again only on news).
    looks: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct State {
    /// Output not released yet, oldest first; `start` is the offset of its first byte and
    /// `end` the offset after its last.
    chunks: VecDeque<StepChunk>,
    start: u64,
    end: u64,
    held_bytes: usize,
    exits: Vec<TaskExit>,
    tasks: usize,
    /// Whether the shepherd's log is still being followed (more output or exits may come).
    following: bool,
    /// Output before this offset was read already (by an `srun` of a previous daemon): dropped
    /// as it comes instead of held.
    skip_to: u64,
    /// Each started task's rank and process group (which is also its session).
    pgids: Vec<(u32, i32)>,
}

/// What one read returns.
pub struct ReadOut {
    pub chunks: Vec<StepChunk>,
    pub next_offset: u64,
    pub exits: Vec<TaskExit>,
    pub done: bool,
}

impl Step {
    pub fn new(job: JobId, run: RunNo, id: u32, tasks: usize) -> Arc<Step> {
        let state = State { tasks, following: true, ..State::default() };
        Arc::new(Step { job, run, id, state: Mutex::new(state), news: Notify::new(), room: Notify::new(), looks: Default::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Output of task `rank` that came from this node rather than the task (a failed start).
    pub fn push(&self, rank: u32, stream: LogStream, mut data: Vec<u8>) {
        if data.is_empty() {
            return;
        }
        {
            let mut st = self.lock();
            if st.end < st.skip_to {
                // Read already: only what is past the reader's offset is held.
                let skip = ((st.skip_to - st.end) as usize).min(data.len());
                data.drain(..skip);
                st.end += skip as u64;
                st.start = st.end;
                if data.is_empty() {
                    return;
                }
            }
            st.end += data.len() as u64;
            st.held_bytes += data.len();
            st.chunks.push_back(StepChunk { rank, stream, data });
        }
        self.news.notify_waiters();
    }

    pub fn task_ended(&self, exit: TaskExit) {
        {
            let mut st = self.lock();
            if st.exits.len() >= st.tasks || st.exits.iter().any(|e| e.rank == exit.rank) {
                tracing::warn!(step = self.id, rank = exit.rank, "a second exit of a step task ignored");
                return;
            }
            st.exits.push(exit);
        }
        self.news.notify_waiters();
    }

    /// Whether every task ended and all of their output is in.
    pub fn ended(&self) -> bool {
        let st = self.lock();
        st.exits.len() == st.tasks && !st.following
    }

    /// Waits until every task here ended (or nothing more can come from the shepherd's log);
    /// the exits it has then.
    pub async fn exits_when_ended(&self) -> Vec<TaskExit> {
        loop {
            let notified = self.news.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.lock();
                if st.exits.len() >= st.tasks || !st.following {
                    return st.exits.clone();
                }
            }
            notified.await;
        }
    }

    /// Nothing more comes from the shepherd's log.
    pub fn stop_following(&self) {
        self.lock().following = false;
        self.news.notify_waiters();
    }

    /// Sends `signal` to every task's process group that is still alive.
    pub fn signal(&self, signal: i32, groups: &TaskGroups) {
        let pgids = self.lock().pgids.clone();
        for (_, pgid) in pgids {
            groups.signal_one(pgid, signal);
        }
    }

    /// Each started task's rank and session.
    pub fn task_sessions(&self) -> Vec<(u32, i32)> {
        self.lock().pgids.clone()
    }

    /// Waits until the buffer has room for more output.
    async fn room(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().held_bytes < STEP_OUTPUT_BUFFER_BYTES_MAX {
                return;
            }
            notified.await;
        }
    }

    /// Follows the step's log from its shepherd (`conn`, after its `tail` request): output is
    /// held as buffer room allows, exits recorded, and each task's process group added to
    /// `groups`; when the log is complete the shepherd closes `conn`.
    pub fn follow(self: &Arc<Self>, mut conn: tokio::net::UnixStream, groups: Arc<TaskGroups>) {
        let step = Arc::clone(self);
        tokio::spawn(async move {
            let mut header = [0u8; shepherd::FRAME_HEADER_BYTES];
            loop {
                step.room().await;
                if conn.read_exact(&mut header).await.is_err() {
                    break;
                }
                let kind = header[0];
                let rank = u32::from_le_bytes([header[1], header[2], header[3], header[4]]);
                let len = u32::from_le_bytes([header[5], header[6], header[7], header[8]]);
                if len > shepherd::FRAME_DATA_BYTES_MAX {
                    tracing::warn!(step = step.id, len, "step log frame too large: stopped following it");
                    break;
                }
                let mut data = vec![0u8; len as usize];
                if conn.read_exact(&mut data).await.is_err() {
                    break;
                }
                match kind {
                    shepherd::FRAME_STDOUT => step.push(rank, LogStream::Stdout, data),
                    shepherd::FRAME_STDERR => step.push(rank, LogStream::Stderr, data),
                    shepherd::FRAME_EXIT if data.len() == 8 => {
                        let code = i32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                        let signal = i32::from_le_bytes([data[4], data[5], data[6], data[7]]);
                        step.task_ended(TaskExit {
                            rank,
                            code: (code != i32::MIN).then_some(code),
                            signal: (signal != 0).then_some(signal),
                        });
                    }
                    shepherd::FRAME_STARTED if data.len() == 12 => {
                        let pid = i32::from_le_bytes([data[0], data[1], data[2], data[3]]);
                        let mut ticks = [0u8; 8];
                        ticks.copy_from_slice(&data[4..12]);
                        if pid > 1 {
                            step.lock().pgids.push((rank, pid));
                            if !groups.add(pid, u64::from_le_bytes(ticks)) {
                                tracing::info!(step = step.id, rank, "step task started as its run ended: killed");
                            }
                        }
                    }
                    other => {
                        tracing::warn!(step = step.id, kind = other, "unknown step log frame: stopped following it");
                        break;
                    }
                }
            }
            step.stop_following();
        });
    }

    /// The output from `offset` on (releasing everything before it), at most `max_bytes` of it
    /// unless one chunk is larger, and every exit so far; waits up to `wait` while there is no
    /// output, no exit past the `exits_seen` the reader has, and the step is not done.
    pub async fn read(&self, offset: u64, exits_seen: usize, max_bytes: usize, wait: Duration) -> ReadOut {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.news.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let out = self.collect(offset, max_bytes);
            if !out.chunks.is_empty() || out.done || out.exits.len() > exits_seen {
                return out;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.collect(offset, max_bytes);
            }
        }
    }

    fn collect(&self, offset: u64, max_bytes: usize) -> ReadOut {
        self.looks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let out = self.collect_locked(offset, max_bytes);
        // What the reader has is released: the pipes' readers may go on.
        self.room.notify_waiters();
        out
    }

    fn collect_locked(&self, offset: u64, max_bytes: usize) -> ReadOut {
        let mut st = self.lock();
        if offset > st.end {
            // The reader is past what this daemon has followed so far (it read it from the
            // previous one): drop everything held, and what comes up to its offset.
            st.skip_to = st.skip_to.max(offset);
            st.chunks.clear();
            st.held_bytes = 0;
            st.start = st.end;
            return ReadOut { chunks: Vec::new(), next_offset: offset, exits: st.exits.clone(), done: false };
        }
        let offset = offset.clamp(st.start, st.end);
        // Release what the reader has.
        while let Some(front) = st.chunks.front() {
            let len = front.data.len() as u64;
            if st.start + len > offset {
                break;
            }
            st.start += len;
            st.held_bytes -= len as usize;
            st.chunks.pop_front();
        }
        if offset > st.start {
            let cut = (offset - st.start) as usize;
            if let Some(front) = st.chunks.front_mut() {
                front.data.drain(..cut);
            }
            st.start = offset;
            st.held_bytes -= cut;
        }
        let mut chunks = Vec::new();
        let mut bytes = 0usize;
        for c in &st.chunks {
            if !chunks.is_empty() && bytes + c.data.len() > max_bytes {
                break;
            }
            bytes += c.data.len();
            chunks.push(c.clone());
        }
        let next_offset = offset + bytes as u64;
        let done = st.exits.len() == st.tasks && !st.following && next_offset == st.end;
        ReadOut { chunks, next_offset, exits: st.exits.clone(), done }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_is_released_as_read_and_done_after_the_last_exit_and_byte() {
        let step = Step::new(1, 1, 0, 2);
        step.push(0, LogStream::Stdout, b"hello ".to_vec());
        step.push(1, LogStream::Stderr, b"world".to_vec());
        let out = step.read(0, 0, 1 << 20, Duration::ZERO).await;
        assert_eq!(out.chunks.len(), 2);
        assert_eq!((out.next_offset, out.done), (11, false));
        // Reading again from 0 still has it (not released until a read from past it).
        assert_eq!(step.read(0, 0, 1 << 20, Duration::ZERO).await.chunks.len(), 2);
        // A small budget returns whole chunks, at least one.
        let small = step.read(0, 0, 3, Duration::ZERO).await;
        assert_eq!((small.chunks.len(), small.next_offset), (1, 6));
        // From the middle of a chunk: the rest of it.
        let mid = step.read(8, 0, 1 << 20, Duration::ZERO).await;
        assert_eq!(mid.chunks, vec![StepChunk { rank: 1, stream: LogStream::Stderr, data: b"rld".to_vec() }]);
        step.task_ended(TaskExit { rank: 0, code: Some(0), signal: None });
        step.task_ended(TaskExit { rank: 1, code: None, signal: Some(9) });
        let end = step.read(11, 0, 1 << 20, Duration::ZERO).await;
        assert!(!end.done, "the shepherd's log may still bring output");
        step.stop_following();
        let end = step.read(11, 0, 1 << 20, Duration::ZERO).await;
        assert!(end.chunks.is_empty());
        assert_eq!(end.exits.len(), 2);
        assert!(end.done, "the log is complete: both exits and all bytes are in");
        assert_eq!(end.exits[1].status(), 137);
    }

    #[tokio::test]
    async fn a_step_followed_again_from_its_start_skips_what_its_reader_had() {
        // A new daemon follows the log from its start; the srun already read 8 bytes of it.
        let step = Step::new(1, 1, 0, 1);
        step.push(0, LogStream::Stdout, b"hello ".to_vec());
        let first = step.read(8, 0, 1 << 20, Duration::ZERO).await;
        assert!(first.chunks.is_empty() && first.next_offset == 8, "nothing held past the reader yet");
        step.push(0, LogStream::Stdout, b"world".to_vec());
        let out = step.read(8, 0, 1 << 20, Duration::ZERO).await;
        assert_eq!(out.chunks, vec![StepChunk { rank: 0, stream: LogStream::Stdout, data: b"rld".to_vec() }]);
        assert_eq!(out.next_offset, 11);
        step.push(0, LogStream::Stderr, b"!".to_vec());
        let out = step.read(11, 0, 1 << 20, Duration::ZERO).await;
        assert_eq!(out.chunks, vec![StepChunk { rank: 0, stream: LogStream::Stderr, data: b"!".to_vec() }]);
        assert_eq!(out.next_offset, 12);
    }

    #[tokio::test]
    async fn a_read_waits_for_news_and_a_full_buffer_holds_the_pipe() {
        let step = Step::new(1, 1, 0, 1);
        let waiting = {
            let step = Arc::clone(&step);
            tokio::spawn(async move { step.read(0, 0, 1 << 20, Duration::from_secs(10)).await })
        };
        tokio::task::yield_now().await;
        step.push(0, LogStream::Stdout, b"late".to_vec());
        let out = waiting.await.expect("reader");
        assert_eq!(out.chunks.len(), 1);
        // A read with nothing new waits without looking again (no spinning to its deadline).
        let before = step.looks.load(std::sync::atomic::Ordering::Relaxed);
        let idle = step.read(4, 0, 1 << 20, Duration::from_millis(200)).await;
        assert!(idle.chunks.is_empty() && !idle.done);
        assert_eq!(step.looks.load(std::sync::atomic::Ordering::Relaxed) - before, 2, "one look, the wait, one last look");
        // Fill the buffer: room() blocks until a read releases some.
        step.push(0, LogStream::Stdout, vec![b'x'; STEP_OUTPUT_BUFFER_BYTES_MAX]);
        let blocked = {
            let step = Arc::clone(&step);
            tokio::spawn(async move { step.room().await })
        };
        tokio::task::yield_now().await;
        assert!(!blocked.is_finished());
        let _ = step.read(4 + STEP_OUTPUT_BUFFER_BYTES_MAX as u64, 0, 1 << 20, Duration::ZERO).await;
        tokio::time::timeout(Duration::from_secs(5), blocked).await.expect("room after the read").expect("join");
    }
}
