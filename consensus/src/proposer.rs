//! Group commit for the leader's proposals: commands proposed while earlier entries are still
//! committing go out together, as one `Command::Batch` entry.
//!
//! Every proposal of the leader (a submission, a launch confirmation, a run's end, ...) goes
//! through one bounded queue. A single task takes what is queued when an entry can be proposed
//! and proposes it: one command alone as itself, several batchable ones as a `Batch` (at most
//! [`proto::BATCH_COMMANDS_MAX`] commands and [`proto::BATCH_BYTES_MAX`] by weight). At most
//! [`IN_FLIGHT_MAX`] entries are in flight at once, so an idle cluster adds no wait (a command
//! goes at once) and a busy one fills its entries while the previous ones commit. Each caller
//! gets its own command's result, exactly as if it had proposed it alone; "acked" still means
//! the entry that holds it is quorum-committed and applied.

use std::sync::Arc;

use proto::{Command, CommandResult};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::{propose, ProposeError, Raft};

/// Proposals waiting for an entry at most; a caller past it waits for room.
pub const QUEUE_MAX: usize = 4096;
/// Entries of this proposer being committed at once.
pub const IN_FLIGHT_MAX: usize = 4;

type Reply = oneshot::Sender<Result<(u64, CommandResult), ProposeError>>;
/// A command waiting for an entry, with what its caller waits on.
pub type Queued<T> = (Command, T);

/// The leader's proposal queue (see the module doc). Cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<(Command, Reply)>,
}

impl Proposer {
    /// Starts the proposing task for `raft` (it ends when every `Proposer` clone is dropped).
    pub fn start(raft: Raft) -> Proposer {
        let (tx, rx) = mpsc::channel(QUEUE_MAX);
        tokio::spawn(run(raft, rx));
        Proposer { tx }
    }

    /// Proposes `cmd` and waits until the entry holding it is committed and applied: the log
    /// index of that entry and the command's own result.
    pub async fn propose(&self, cmd: Command) -> Result<(u64, CommandResult), ProposeError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((cmd, reply)).await.map_err(|_| ProposeError::Raft("the proposer stopped".into()))?;
        rx.await.map_err(|_| ProposeError::Raft("the proposer dropped the proposal".into()))?
    }
}

/// What the next entry carries: `first`, then whatever `next` yields while it fits. Returns the
/// commands and the one taken that did not fit (it starts the entry after).
pub fn fill<T>(first: (Command, T), mut next: impl FnMut() -> Option<(Command, T)>) -> (Vec<(Command, T)>, Option<Queued<T>>) {
    let mut bytes = first.0.weight_bytes();
    let batchable = first.0.batchable();
    let mut batch = vec![first];
    if !batchable {
        return (batch, None);
    }
    while batch.len() < proto::BATCH_COMMANDS_MAX {
        let Some(item) = next() else { break };
        let weight = item.0.weight_bytes();
        if !item.0.batchable() || bytes + weight > proto::BATCH_BYTES_MAX {
            return (batch, Some(item));
        }
        bytes += weight;
        batch.push(item);
    }
    (batch, None)
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<(Command, Reply)>) {
    let permits = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let mut carried: Option<(Command, Reply)> = None;
    loop {
        let first = match carried.take() {
            Some(item) => item,
            None => match rx.recv().await {
                Some(item) => item,
                None => return,
            },
        };
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else { return };
        let (batch, rest) = fill(first, || rx.try_recv().ok());
        carried = rest;
        let raft = raft.clone();
        tokio::spawn(async move {
            commit(&raft, batch).await;
            drop(permit);
        });
    }
}

/// Proposes one entry and hands each caller its result.
async fn commit(raft: &Raft, mut batch: Vec<(Command, Reply)>) {
    if batch.len() == 1 {
        if let Some((cmd, reply)) = batch.pop() {
            let _ = reply.send(propose(raft, cmd).await);
        }
        return;
    }
    let (commands, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
    let count = commands.len();
    match propose(raft, Command::Batch { commands }).await {
        Ok((index, CommandResult::Batch(results))) if results.len() == count => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(Ok((index, result)));
            }
        }
        Ok((index, other)) => {
            // The batch as a whole was refused (it cannot be, as `fill` builds it): every
            // command gets that answer, and none of them was applied.
            tracing::warn!(result = ?other, commands = count, "a batch was refused as a whole");
            for reply in replies {
                let _ = reply.send(Ok((index, other.clone())));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(duplicate(&e)));
            }
        }
    }
}

/// The same proposal error again, for each caller of a batch.
fn duplicate(e: &ProposeError) -> ProposeError {
    match e {
        ProposeError::NotLeader { leader, leader_node } => ProposeError::NotLeader { leader: *leader, leader_node: leader_node.clone() },
        ProposeError::Unknown { leader, leader_node } => ProposeError::Unknown { leader: *leader, leader_node: leader_node.clone() },
        ProposeError::Raft(why) => ProposeError::Raft(why.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    fn cancel(job: u64) -> (Command, u64) {
        (Command::Cancel { job, now_ms: 1 }, job)
    }

    #[test]
    fn an_entry_takes_what_is_queued_up_to_its_bounds_and_never_an_unbatchable_command() {
        // Alone: nothing queued.
        let (batch, rest) = fill(cancel(1), || None);
        assert_eq!(batch.len(), 1);
        assert!(rest.is_none());

        // Everything queued, up to the count bound; the rest waits in the queue.
        let mut queue: VecDeque<(Command, u64)> = (2..=1000).map(cancel).collect();
        let (batch, rest) = fill(cancel(1), || queue.pop_front());
        assert_eq!(batch.len(), proto::BATCH_COMMANDS_MAX);
        assert!(rest.is_none());
        assert_eq!(queue.len(), 1000 - proto::BATCH_COMMANDS_MAX);
        assert_eq!(batch.iter().map(|(_, j)| *j).collect::<Vec<_>>(), (1..=proto::BATCH_COMMANDS_MAX as u64).collect::<Vec<_>>());

        // A command that may not be batched (an operator's drain) ends the batch and goes in
        // the next entry, alone.
        let down = (Command::Drain { node: 3, reason: "maintenance".into(), now_ms: 1 }, 99);
        let mut queue: VecDeque<(Command, u64)> = vec![cancel(2), down.clone(), cancel(3)].into();
        let (batch, rest) = fill(cancel(1), || queue.pop_front());
        assert_eq!(batch.iter().map(|(_, j)| *j).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(rest.map(|(_, j)| j), Some(99));
        let (batch, rest) = fill(down, || queue.pop_front());
        assert_eq!(batch.len(), 1, "an unbatchable command is never batched");
        assert!(rest.is_none());
        assert_eq!(queue.len(), 1, "nothing taken after it");

        // Big submissions: the byte bound ends the batch before the count does.
        let big = |n: u64| {
            let mut spec = proto::JobSpec::command(vec!["true".into()], "/tmp", "alice");
            spec.script = Some("x".repeat(1 << 20));
            (Command::Submit { spec, now_ms: 1 }, n)
        };
        let mut queue: VecDeque<(Command, u64)> = (2..=10).map(big).collect();
        let (batch, rest) = fill(big(1), || queue.pop_front());
        assert!(batch.len() < 5 && batch.len() > 1, "{} submissions of 1 MiB", batch.len());
        assert!(rest.is_some());

        // Nodes found down and back are batched with the rest (a crowd of them is one entry).
        let node_down = (Command::NodeDown { node: 3, reason: "silent".into(), now_ms: 1 }, 7);
        let node_up = (Command::NodeUp { node: 4, instance: 1, now_ms: 1 }, 8);
        let mut queue: VecDeque<(Command, u64)> = vec![node_down, node_up, cancel(9)].into();
        let (batch, rest) = fill(cancel(6), || queue.pop_front());
        assert_eq!(batch.iter().map(|(_, j)| *j).collect::<Vec<_>>(), vec![6, 7, 8, 9]);
        assert!(rest.is_none());
    }
}
