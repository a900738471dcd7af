//! One job step on this node: the tasks an `srun` inside a batch job started here, their output
//! held until that `srun` reads it, and how each task ended. The output held is bounded
//! (`STEP_OUTPUT_BUFFER_BYTES_MAX`): past it the readers stop draining the pipes, so a task
//! whose `srun` reads slowly waits on its writes instead of losing output.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::limits::STEP_OUTPUT_BUFFER_BYTES_MAX;
use proto::{JobId, LogStream, RunNo, StepChunk, TaskExit};
use tokio::io::AsyncReadExt;
use tokio::process::Child;
use tokio::sync::Notify;

use crate::launcher::TaskGroups;

/// Bytes read from a task's pipe at a time (one chunk at most).
const PIPE_READ_BYTES: usize = 64 * 1024;

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
    pipes_open: usize,
    /// Process groups of its tasks.
    pgids: Vec<i32>,
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
        let state = State { tasks, ..State::default() };
        Arc::new(Step { job, run, id, state: Mutex::new(state), news: Notify::new(), room: Notify::new(), looks: Default::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Output of task `rank` that came from this node rather than the task (a failed start).
    pub fn push(&self, rank: u32, stream: LogStream, data: Vec<u8>) {
        if data.is_empty() {
            return;
        }
        {
            let mut st = self.lock();
            st.end += data.len() as u64;
            st.held_bytes += data.len();
            st.chunks.push_back(StepChunk { rank, stream, data });
        }
        self.news.notify_waiters();
    }

    pub fn task_ended(&self, exit: TaskExit) {
        {
            let mut st = self.lock();
            assert!(st.exits.len() < st.tasks, "step {}: more exits than tasks", self.id);
            st.exits.push(exit);
        }
        self.news.notify_waiters();
    }

    /// Whether every task ended and every pipe closed.
    pub fn ended(&self) -> bool {
        let st = self.lock();
        st.exits.len() == st.tasks && st.pipes_open == 0
    }

    /// Sends `signal` to every task's process group that is still alive.
    pub fn signal(&self, signal: i32, groups: &TaskGroups) {
        let pgids = self.lock().pgids.clone();
        for pgid in pgids {
            groups.signal_one(pgid, signal);
        }
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

    /// Drains `child`'s stdout and stderr into the step as task `rank`'s output, and records
    /// how it ended; its process group is forgotten by `groups` once empty.
    pub fn attach(self: &Arc<Self>, rank: u32, mut child: Child, groups: Arc<TaskGroups>) {
        let pipes: Vec<(LogStream, Box<dyn tokio::io::AsyncRead + Send + Unpin>)> = [
            child.stdout.take().map(|p| (LogStream::Stdout, Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>)),
            child.stderr.take().map(|p| (LogStream::Stderr, Box::new(p) as Box<dyn tokio::io::AsyncRead + Send + Unpin>)),
        ]
        .into_iter()
        .flatten()
        .collect();
        self.lock().pipes_open += pipes.len();
        for (stream, mut pipe) in pipes {
            let step = Arc::clone(self);
            tokio::spawn(async move {
                let mut buf = vec![0u8; PIPE_READ_BYTES];
                loop {
                    step.room().await;
                    match pipe.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => step.push(rank, stream, buf[..n].to_vec()),
                    }
                }
                step.lock().pipes_open -= 1;
                step.news.notify_waiters();
            });
        }
        let step = Arc::clone(self);
        let pgid = child.id().map_or(0, |p| p as i32);
        self.lock().pgids.push(pgid);
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => {
                    use std::os::unix::process::ExitStatusExt;
                    TaskExit { rank, code: status.code(), signal: status.signal() }
                }
                Err(_) => TaskExit { rank, code: Some(1), signal: None },
            };
            if pgid > 0 {
                groups.forget_if_empty(pgid);
            }
            step.task_ended(exit);
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
        let done = st.exits.len() == st.tasks && st.pipes_open == 0 && next_offset == st.end;
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
        assert!(end.chunks.is_empty());
        assert_eq!(end.exits.len(), 2);
        assert!(end.done, "no pipes were attached: both exits and all bytes are in");
        assert_eq!(end.exits[1].status(), 137);
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
