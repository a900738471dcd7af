//! Raft RPCs over an application transport.
//!
//! The client side ([`NetworkFactory`]) encodes each openraft request with `proto::codec` and hands
//! the bytes to a [`RaftTransport`] (QUIC in the node crate). The server side
//! ([`handle_raft_rpc`]) decodes, calls the local [`Raft`], and encodes the reply as
//! `Result<response, String>`: `Err` carries a remote Raft failure (e.g. shutting down), which the
//! client reports to openraft as unreachable so it backs off.

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

use crate::types::{MemberNode, Raft, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, Vote};

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

/// The payload of a `FullSnapshot` RPC.
type FullSnapshotRequest = (Vote, SnapshotMeta, SnapshotData);

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
        PeerClient { id: self.id, target, node: node.clone(), transport: self.transport.clone() }
    }
}

/// Sends Raft RPCs to one peer.
pub struct PeerClient<T> {
    id: NodeId,
    target: NodeId,
    node: MemberNode,
    transport: Arc<T>,
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
        let resp: AppendEntriesResponse<TypeConfig> = self
            .call_encoded(RaftRpcKind::AppendEntries, payload, option.hard_ttl())
            .await
            .map_err(|e| self.rpc_error(RPCTypes::AppendEntries, e))?;
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
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let bytes = snapshot.snapshot.len();
        let request: FullSnapshotRequest = (vote, snapshot.meta, snapshot.snapshot);
        let send = self.call::<_, SnapshotResponse<TypeConfig>>(RaftRpcKind::FullSnapshot, &request, option.hard_ttl());
        tokio::select! {
            closed = cancel => Err(StreamingError::Closed(closed)),
            reply = send => reply.map_err(|e| {
                warn!(target = self.target, bytes, "sending snapshot failed");
                self.streaming_error(e)
            }),
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

/// Serves one Raft RPC that arrived from a peer: decodes `payload`, calls `raft`, and returns the
/// encoded reply for the peer's [`NetworkFactory`]. `Err` only for a payload that does not decode.
pub async fn handle_raft_rpc(raft: &Raft, kind: RaftRpcKind, payload: &[u8]) -> Result<Vec<u8>, ApiError> {
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
            let (vote, meta, data): FullSnapshotRequest = decode_request(kind, payload)?;
            encode_reply(raft.install_full_snapshot(vote, Snapshot { meta, snapshot: data }).await)
        }
        RaftRpcKind::TransferLeader => {
            let req: TransferLeaderRequest<TypeConfig> = decode_request(kind, payload)?;
            encode_reply(raft.handle_transfer_leader(req).await)
        }
    })
}
