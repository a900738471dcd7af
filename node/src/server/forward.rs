//! Forwarding a request this node cannot answer to the leader, and waiting for the next leader
//! when that one is unreachable or replaced.

use std::time::{Duration, Instant};

use proto::{ApiError, Envelope, NodeId, Request, Response, FORWARD_HOPS_MAX};

use super::{lock, Node, FORWARD_CONNECT_TIMEOUT, PEER_CALL_TIMEOUT};
use crate::link::LinkError;

/// How long a leader that could not be reached is taken for dead by forwards (an election
/// takes at most the election timeout; past this, it is tried again).
const UNREACHABLE_LEADER_HOLD: Duration = Duration::from_millis(1_000);

/// How long a request for a leader found unreachable waits for the next one to be elected
/// (an election takes `election_timeout_max_ms` and a round trip; dev clusters 400 ms).
const NEXT_LEADER_WAIT: Duration = Duration::from_millis(2_000);
/// How soon such a request asks again when the new leader was not ready for it yet.
const NEXT_LEADER_RETRY: Duration = Duration::from_millis(20);

impl Node {
    /// Sends a request this node cannot answer to the leader.
    pub(super) async fn forward(&self, hops: u8, request: impl Into<Request>, user: Option<String>) -> Response {
        let request = request.into();
        if hops >= FORWARD_HOPS_MAX {
            return Err(ApiError::Unavailable(format!("gave up after {hops} forwards")));
        }
        let (leader, leader_addr) = self.leader();
        match (leader, leader_addr) {
            (Some(l), Some(addr)) if l != self.id => {
                // A leader this node just failed to reach is most likely dead: until an election
                // names another (or the hold has passed and it is tried again), the request waits
                // for the next leader instead of a handshake with this one.
                let held = (*lock(&self.unreachable_leader))
                    .filter(|(dead, _)| *dead == l)
                    .map(|(_, at)| UNREACHABLE_LEADER_HOLD.saturating_sub(at.elapsed()))
                    .filter(|left| !left.is_zero());
                if let Some(left) = held {
                    if self.cut_from(l) {
                        return Err(ApiError::Unavailable(format!("leader {addr} is alive but cut off from this node")));
                    }
                    return self.forward_to_next_leader(l, hops, request, user, left, || ApiError::NoLeader).await;
                }
                let env = Envelope { hops: hops + 1, request, user };
                let call = self.client.call_failing_on_silence(&addr, &env, PEER_CALL_TIMEOUT, FORWARD_CONNECT_TIMEOUT);
                // A leader that died with this request in flight never answers; QUIC notices the
                // connection is gone only after its loss timers. An election names the next
                // leader sooner: stop waiting then, and ask that one.
                let outcome = tokio::select! {
                    outcome = call => Some(outcome),
                    () = consensus::leader_changed_from(&self.raft, l) => None,
                };
                let Envelope { request, user, .. } = env;
                match outcome {
                    Some(Ok(resp)) => resp,
                    None => {
                        let replaced = || ApiError::Unavailable(format!("leader {l} was replaced while a forwarded request waited"));
                        self.forward_to_next_leader(l, hops, request, user, NEXT_LEADER_WAIT, replaced).await
                    }
                    Some(Err(e)) => {
                        let failed = || ApiError::Unavailable(format!("forward to leader {addr}: {e}"));
                        // No handshake, or a request it never acknowledged: most likely dead.
                        if !matches!(e, transport::CallError::Connect(_) | transport::CallError::Silent(_)) {
                            return Err(failed());
                        }
                        // Cut off from this leader before, in this term: no election is coming
                        // (the others hear it), so the caller is told at once to ask another
                        // member instead of after the whole wait.
                        if self.cut_from(l) {
                            return Err(failed());
                        }
                        *lock(&self.unreachable_leader) = Some((l, Instant::now()));
                        let term = self.status().term;
                        let response = self.forward_to_next_leader(l, hops, request, user, NEXT_LEADER_WAIT, failed).await;
                        if matches!(response, Err(ApiError::Unavailable(_))) && self.leader().0 == Some(l) && self.status().term == term {
                            *lock(&self.cut_from_leader) = Some((l, term));
                        }
                        response
                    }
                }
            }
            _ if self.is_member() => Err(ApiError::NoLeader),
            _ => match self.forward_link.forward_as(request, hops + 1, user).await {
                Ok(reply) => Ok(reply),
                Err(LinkError::Api(e)) => Err(e),
                Err(LinkError::Unreachable(e)) => Err(ApiError::Unavailable(e)),
            },
        }
    }

    /// Whether this node found leader `l` alive but unreachable (a whole wait for the next
    /// leader passed with no election) in the current term.
    fn cut_from(&self, l: NodeId) -> bool {
        *lock(&self.cut_from_leader) == Some((l, self.status().term))
    }

    /// A request for leader `dead`, which this node found unreachable (no handshake, or the
    /// request went unacknowledged) or which an election replaced while the request waited,
    /// waits for the next leader, at most `wait` ([`NEXT_LEADER_WAIT`], or what is left of the
    /// hold on a leader found unreachable before), and goes there (or is handled here, if this
    /// node was elected). The client, which would only send it again through
    /// another member that may not know yet, gets its answer as soon as an election ends.
    /// Sending it again is what the client did before: as after any lost reply, the request
    /// may or may not have been applied (a submission's key makes a resend answer with the job
    /// the first made, `consensus::submit_keys`). Without a new leader in time, `otherwise`.
    async fn forward_to_next_leader(
        &self,
        dead: NodeId,
        hops: u8,
        request: Request,
        user: Option<String>,
        wait: Duration,
        otherwise: impl FnOnce() -> ApiError,
    ) -> Response {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if tokio::time::timeout(left, consensus::next_leader_ready(&self.raft, dead)).await.is_err() {
                return Err(otherwise());
            }
            let response = if !self.is_leader() {
                Box::pin(self.forward(hops + 1, request.clone(), user.clone())).await
            } else if request.needs_leader() {
                Box::pin(self.handle_on_leader(request.clone(), user.clone())).await
            } else {
                match &request {
                    Request::Client(read) => self.read(read.clone()),
                    Request::Peer(other) => Err(ApiError::Invalid(format!("not a read: {other:?}"))),
                }
            };
            // Just elected, a leader may not lead yet for a moment in its own eyes (its metrics
            // lag the votes its followers saw): ask again shortly, until the deadline.
            match response {
                Err(ApiError::NoLeader | ApiError::Unavailable(_)) if Instant::now() + NEXT_LEADER_RETRY < deadline => {
                    tokio::time::sleep(NEXT_LEADER_RETRY).await;
                }
                other => return other,
            }
        }
    }
}
