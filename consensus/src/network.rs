//! Raft RPCs over an application transport.
//!
//! The client side ([`NetworkFactory`]) encodes each openraft request with `proto::codec` and hands
//! the bytes to a [`RaftTransport`] (QUIC in the node crate). The server side
//! ([`handle_raft_rpc`]) decodes, calls the local [`Raft`], and encodes the reply as
//! `Result<response, String>`: `Err` carries a remote Raft failure (e.g. shutting down), which the
//! client reports to openraft as unreachable so it backs off.
//!
//! A snapshot travels as a stream of `SnapshotChunk` RPCs of at most [`SNAPSHOT_CHUNK_BYTES`]
//! each, in order, read from the sender's file and accounting store off the async runtime and
//! appended by the follower's [`SnapshotInbox`] to a file; the last chunk installs it. Neither
//! side holds the whole snapshot in memory, and its size has no limit but the disk.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::RPCTypes;
use proto::{ApiError, NodeId, RaftRpcKind};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{debug, warn};

use crate::inbox::{SnapshotChunkRequest, SnapshotInbox};
use crate::snapshot::{Snapshot, SnapshotData};
use crate::store::Raft;
use crate::types::{MemberNode, TypeConfig, Vote};

/// The shortest timeout of an append that carries entries (see `append_entries`).
const APPEND_TIMEOUT_MIN: Duration = Duration::from_millis(1_000);

/// Bytes of snapshot one `SnapshotChunk` carries at most.
pub const SNAPSHOT_CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// Time for one chunk to be written, and for the last to be installed.
const SNAPSHOT_CHUNK_TIMEOUT: Duration = Duration::from_secs(15);
const SNAPSHOT_INSTALL_TIMEOUT: Duration = Duration::from_secs(300);

/// Its reply: openraft's response once the last chunk is installed.
type SnapshotChunkReply = Option<SnapshotResponse<TypeConfig>>;

/// Largest encoded Raft payload: a frame, less room for the envelope around it.
pub const RAFT_PAYLOAD_BYTES_MAX: usize = proto::limits::FRAME_BYTES_MAX - 64 * 1024;

/// Carries one encoded Raft RPC to `target` and returns the encoded reply. Implemented by the
/// node crate over QUIC; tests implement it in memory.
pub trait RaftTransport: Send + Sync + 'static {
    fn call(
        &self,
        target: NodeId,
        node: &MemberNode,
        kind: RaftRpcKind,
        payload: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send;

    /// The transport's estimate of the round trip to `node` (QUIC's, on an open connection),
    /// where it has one: a heartbeat that times out is then told apart from a link slower than
    /// the heartbeat interval.
    fn round_trip(&self, _node: &MemberNode) -> Option<Duration> {
        None
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("remote error: {0}")]
    Remote(String),
    #[error("timed out")]
    Timeout,
}

/// The reply payload of every Raft RPC: openraft's response, or why the remote Raft could not
/// handle it.
type RpcReply<T> = Result<T, String>;

/// Creates a [`PeerClient`] per target for openraft.
pub struct NetworkFactory<T> {
    id: NodeId,
    transport: Arc<T>,
}

impl<T: RaftTransport> NetworkFactory<T> {
    /// `id` is this node, named in timeout errors.
    pub fn new(id: NodeId, transport: T) -> Self {
        NetworkFactory { id, transport: Arc::new(transport) }
    }
}

impl<T: RaftTransport> RaftNetworkFactory<TypeConfig> for NetworkFactory<T> {
    type Network = PeerClient<T>;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> PeerClient<T> {
        PeerClient { id: self.id, target, node: node.clone(), transport: self.transport.clone(), slow_link_told: false }
    }
}

/// Sends Raft RPCs to one peer.
pub struct PeerClient<T> {
    id: NodeId,
    target: NodeId,
    node: MemberNode,
    transport: Arc<T>,
    /// Whether this client said the link to its peer is too slow for the heartbeat interval.
    slow_link_told: bool,
}

/// Whether a heartbeat given `timeout` cannot be answered in time over a link of round trip
/// `round_trip`: three quarters of the interval leave the peer too little to answer.
fn link_outruns_heartbeat(round_trip: Duration, timeout: Duration) -> bool {
    round_trip.saturating_mul(4) >= timeout.saturating_mul(3)
}

/// Why one call failed, before it is turned into the error type of the openraft method.
enum CallError {
    Timeout(Duration),
    Unreachable(String),
    Network(String),
}

impl<T: RaftTransport> PeerClient<T> {
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        kind: RaftRpcKind,
        request: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        self.call_encoded(kind, proto::encode(request), timeout).await
    }

    async fn call_encoded<Resp: DeserializeOwned>(
        &self,
        kind: RaftRpcKind,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        if payload.len() > RAFT_PAYLOAD_BYTES_MAX {
            return Err(CallError::Network(format!(
                "{kind:?} payload of {} bytes exceeds the limit of {RAFT_PAYLOAD_BYTES_MAX}",
                payload.len()
            )));
        }
        let call = self.transport.call(self.target, &self.node, kind, payload);
        let bytes = match tokio::time::timeout(timeout, call).await {
            Err(_) | Ok(Err(TransportError::Timeout)) => return Err(CallError::Timeout(timeout)),
            Ok(Err(TransportError::Unreachable(e))) => return Err(CallError::Unreachable(e)),
            Ok(Err(TransportError::Remote(e))) => return Err(CallError::Network(e)),
            Ok(Ok(bytes)) => bytes,
        };
        let reply: RpcReply<Resp> =
            proto::decode(&bytes, proto::limits::FRAME_BYTES_MAX).map_err(|e| CallError::Network(format!("decode {kind:?} reply: {e}")))?;
        reply.map_err(|e| CallError::Unreachable(format!("raft on node {} failed: {e}", self.target)))
    }

    /// openraft counts a heartbeat only if it is answered within one interval, and only counted
    /// answers renew the leader's lease, without which it refuses writes. Over a link slower
    /// than that, a leader whose quorum needs this peer stalls for good (found on the rig with
    /// racks 100 ms apart and 50 ms heartbeats): say so once, with the figures.
    fn heartbeat_timed_out(&mut self, timeout: Duration) {
        if self.slow_link_told {
            return;
        }
        let Some(round_trip) = self.transport.round_trip(&self.node) else { return };
        if link_outruns_heartbeat(round_trip, timeout) {
            self.slow_link_told = true;
            warn!(
                voter = self.target,
                round_trip_ms = round_trip.as_millis() as u64,
                heartbeat_interval_ms = timeout.as_millis() as u64,
                "raft heartbeats to this voter cannot be answered in time: while the leader's quorum needs it, the leader \
                 loses its lease and refuses writes; set [raft] heartbeat_interval_ms (and the election timeouts) above \
                 the round trip between voters"
            );
        }
    }

    fn rpc_error(&self, action: RPCTypes, e: CallError) -> RPCError<TypeConfig> {
        match e {
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout { action, id: self.id, target: self.target, timeout }),
            CallError::Unreachable(e) => RPCError::Unreachable(Unreachable::from_string(e)),
            CallError::Network(e) => RPCError::Network(NetworkError::from_string(e)),
        }
    }

    fn streaming_error(&self, e: CallError) -> StreamingError<TypeConfig> {
        match e {
            CallError::Timeout(timeout) => {
                StreamingError::Timeout(Timeout { action: RPCTypes::InstallSnapshot, id: self.id, target: self.target, timeout })
            }
            CallError::Unreachable(e) => StreamingError::Unreachable(Unreachable::from_string(e)),
            CallError::Network(e) => StreamingError::Network(NetworkError::from_string(e)),
        }
    }
}

impl<T: RaftTransport> RaftNetworkV2<TypeConfig> for PeerClient<T> {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        // Send a prefix that fits in one frame and report it as a partial success; openraft
        // sends the rest next.
        let mut payload = proto::encode(&rpc);
        let mut truncated = false;
        while rpc.entries.len() > 1 && payload.len() > RAFT_PAYLOAD_BYTES_MAX {
            let keep = rpc.entries.len() / 2;
            rpc.entries.truncate(keep);
            // The follower may only learn commits it has matched.
            rpc.leader_commit = rpc.leader_commit.min(rpc.entries.last().map(|e| e.log_id));
            payload = proto::encode(&rpc);
            truncated = true;
        }
        let last_sent = rpc.entries.last().map(|e| e.log_id);
        if truncated {
            debug!(target = self.target, entries = rpc.entries.len(), "append entries split to fit a frame");
        }
        // openraft gives every append the heartbeat interval (tens of ms) as its timeout. A loaded
        // follower that fsyncs a batch slower than that still appends it, but the leader gave up
        // and sends it again: on a busy 2-core host three voters spiralled into resends and
        // leader changes. Entries get at least `APPEND_TIMEOUT_MIN`; heartbeats keep theirs.
        let heartbeat = rpc.entries.is_empty();
        let timeout = if heartbeat { option.hard_ttl() } else { option.hard_ttl().max(APPEND_TIMEOUT_MIN) };
        let result = self.call_encoded(RaftRpcKind::AppendEntries, payload, timeout).await;
        if heartbeat && matches!(result, Err(CallError::Timeout(_))) {
            self.heartbeat_timed_out(timeout);
        }
        let resp: AppendEntriesResponse<TypeConfig> = result.map_err(|e| self.rpc_error(RPCTypes::AppendEntries, e))?;
        Ok(match resp {
            AppendEntriesResponse::Success if truncated => AppendEntriesResponse::PartialSuccess(last_sent),
            other => other,
        })
    }

    async fn vote(&mut self, rpc: VoteRequest<TypeConfig>, option: RPCOption) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RaftRpcKind::Vote, &rpc, option.hard_ttl()).await.map_err(|e| self.rpc_error(RPCTypes::Vote, e))
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RaftRpcKind::PreVote, &rpc, option.hard_ttl()).await.map_err(|e| self.rpc_error(RPCTypes::Vote, e))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let meta = snapshot.meta;
        let data = snapshot.snapshot;
        // The file and the store are read on a blocking thread, two chunks ahead at most.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, String>>(2);
        let producer = tokio::task::spawn_blocking(move || {
            let streamed = data.stream(SNAPSHOT_CHUNK_BYTES, |chunk| {
                tx.blocking_send(Ok(chunk)).map_err(|_| std::io::Error::other("snapshot send stopped"))
            });
            if let Err(e) = streamed {
                let _ = tx.blocking_send(Err(format!("read snapshot: {e}")));
            }
        });
        let send = async {
            let mut offset = 0u64;
            let mut current = rx.recv().await;
            loop {
                let chunk = match current {
                    Some(Ok(chunk)) => chunk,
                    Some(Err(e)) => return Err(CallError::Network(e)),
                    None => return Err(CallError::Network("snapshot stream ended early".into())),
                };
                let next = rx.recv().await;
                let last = next.is_none();
                let len = chunk.len() as u64;
                let request: SnapshotChunkRequest = (vote, meta.clone(), offset, chunk, last);
                let timeout = if last { SNAPSHOT_INSTALL_TIMEOUT } else { SNAPSHOT_CHUNK_TIMEOUT };
                let reply: SnapshotChunkReply = self.call(RaftRpcKind::SnapshotChunk, &request, timeout).await?;
                offset += len;
                match (reply, last) {
                    (Some(resp), true) => return Ok((resp, offset)),
                    (None, false) => {}
                    (_, true) => return Err(CallError::Network("the follower did not install the snapshot".into())),
                    (Some(_), false) => return Err(CallError::Network("the follower answered before the last chunk".into())),
                }
                current = next;
            }
        };
        let result = tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            reply = send => reply.map_err(|e| self.streaming_error(e)),
        };
        producer.abort();
        match result {
            Ok((resp, bytes)) => {
                debug!(target = self.target, bytes, "sent snapshot");
                Ok(resp)
            }
            Err(e) => {
                warn!(target = self.target, error = %e, "sending snapshot failed");
                Err(e)
            }
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.call(RaftRpcKind::TransferLeader, &req, option.hard_ttl()).await.map_err(|e| self.rpc_error(RPCTypes::TransferLeader, e))
    }
}

fn decode_request<T: DeserializeOwned>(kind: RaftRpcKind, payload: &[u8]) -> Result<T, ApiError> {
    proto::decode(payload, proto::limits::FRAME_BYTES_MAX).map_err(|e| ApiError::Invalid(format!("decode {kind:?} request: {e}")))
}

fn encode_reply<T: Serialize, E: std::fmt::Display>(reply: Result<T, E>) -> Vec<u8> {
    let reply: RpcReply<T> = reply.map_err(|e| e.to_string());
    proto::encode(&reply)
}

/// Serves one Raft RPC that arrived from a peer: decodes `payload`, calls `raft` (snapshot chunks
/// go through `inbox`), and returns the encoded reply for the peer's [`NetworkFactory`]. `Err`
/// only for a payload that does not decode.
pub async fn handle_raft_rpc(raft: &Raft, inbox: &SnapshotInbox, kind: RaftRpcKind, payload: &[u8]) -> Result<Vec<u8>, ApiError> {
    Ok(match kind {
        RaftRpcKind::AppendEntries => {
            let req: AppendEntriesRequest<TypeConfig> = decode_request(kind, payload)?;
            encode_reply(raft.append_entries(req).await)
        }
        RaftRpcKind::Vote => {
            let req: VoteRequest<TypeConfig> = decode_request(kind, payload)?;
            encode_reply(raft.vote(req).await)
        }
        RaftRpcKind::PreVote => {
            let req: VoteRequest<TypeConfig> = decode_request(kind, payload)?;
            encode_reply(raft.pre_vote(req).await)
        }
        RaftRpcKind::FullSnapshot => {
            return Err(ApiError::Invalid("whole-snapshot RPCs are gone: snapshots are streamed in chunks".into()));
        }
        RaftRpcKind::SnapshotChunk => {
            let request: SnapshotChunkRequest = decode_request(kind, payload)?;
            let reply = receive_chunk(raft, inbox, request).await;
            if let Err(e) = &reply {
                warn!(error = %e, "receiving a snapshot failed");
            }
            encode_reply(reply)
        }
        RaftRpcKind::TransferLeader => {
            let req: TransferLeaderRequest<TypeConfig> = decode_request(kind, payload)?;
            encode_reply(raft.handle_transfer_leader(req).await)
        }
    })
}

/// Appends one chunk to `inbox`; after the last, installs the snapshot in `raft` and removes its
/// file.
async fn receive_chunk(raft: &Raft, inbox: &SnapshotInbox, request: SnapshotChunkRequest) -> Result<SnapshotChunkReply, String> {
    let vote = request.0;
    let Some(done) = inbox.receive(request).await? else { return Ok(None) };
    let path = done.path().to_path_buf();
    let installed = match done.into_snapshot() {
        Ok(snapshot) => raft.install_full_snapshot(vote, snapshot).await.map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_file(&path);
    installed.map(Some)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::link_outruns_heartbeat;

    #[test]
    fn a_link_near_the_heartbeat_interval_is_too_slow_for_it() {
        let ms = Duration::from_millis;
        // The rig's racks: 101-106 ms round trips against the default 50 ms heartbeat.
        assert!(link_outruns_heartbeat(ms(101), ms(50)));
        assert!(link_outruns_heartbeat(ms(38), ms(50)));
        // A data centre's links, and the heartbeats raised above the racks' round trip.
        assert!(!link_outruns_heartbeat(ms(1), ms(50)));
        assert!(!link_outruns_heartbeat(ms(106), ms(150)));
    }
}
