//! The handlers the QUIC server and the local socket call (`Api`): who is asking (a certificate,
//! or the kernel's uid), what they may send, then the node's `handle`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use proto::{ApiError, ClientRequest, Envelope, PeerRequest, Request, Response};
use tracing::{debug, warn};
use transport::{Handler, Peer};

use super::Node;

/// The handler registered with the QUIC server before the node is fully up: until Raft is
/// open it answers `Unavailable`.
pub struct Api {
    pub(super) node: OnceLock<Arc<Node>>,
    pub(super) fault: Arc<crate::fault::FaultSwitch>,
}

impl Handler for Api {
    /// Heartbeats, and the members a node asks for after every new term: small, idempotent,
    /// sent by every node of a fleet at once, mended by asking again.
    fn takes_datagram(&self, envelope: &Envelope) -> bool {
        matches!(envelope.request, Request::Peer(PeerRequest::Heartbeat { .. }) | Request::Client(ClientRequest::Members))
    }

    fn handle(&self, peer: Peer, mut envelope: Envelope) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
        // Who is asking: a user's certificate names them; a node may act for the user whose
        // request it forwards.
        // A machine without a certificate may only enrol.
        if peer.common_name == transport::ANONYMOUS_PEER {
            return match (&envelope.request, self.node.get()) {
                (Request::Peer(PeerRequest::Enroll { .. }), Some(node)) => {
                    envelope.user = None;
                    envelope.hops = 0;
                    Box::pin(Arc::clone(node).handle(envelope))
                }
                (Request::Peer(PeerRequest::Enroll { .. }), None) => {
                    Box::pin(async { Err(ApiError::Unavailable("node is starting".into())) })
                }
                _ => {
                    debug!(peer = %peer.remote, "refused a request without a certificate");
                    Box::pin(async { Err(ApiError::Denied("a certificate of the cluster is required".into())) })
                }
            };
        }
        if let Some(node) = self.node.get() {
            let revoked =
                node.state.read(|s| s.revoked_certs.get(&peer.fingerprint).or_else(|| s.revoked_nodes.get(&peer.common_name)).cloned());
            if let Some(why) = revoked {
                warn!(peer = %peer.common_name, fingerprint = %peer.fingerprint, reason = %why, "refused a revoked certificate");
                return Box::pin(async move { Err(ApiError::Denied(format!("certificate revoked: {why}"))) });
            }
        }
        // A node renews its own certificate: the name is the one its current certificate proves.
        if let Request::Peer(PeerRequest::RenewCert { csr_pem }) = &envelope.request {
            if peer.common_name.starts_with(transport::pki::USER_CN_PREFIX) {
                return Box::pin(async { Err(ApiError::Denied("only nodes renew certificates".into())) });
            }
            let answer = match self.node.get() {
                Some(node) => node.sign_renewal(&peer.common_name, csr_pem),
                None => Err(ApiError::Unavailable("node is starting".into())),
            };
            return Box::pin(async move { answer });
        }
        // A joining node's certificate, as this handshake proved it (a forwarded Join keeps what
        // the first node saw).
        if let Request::Peer(PeerRequest::Join { cert_fingerprint, .. }) = &mut envelope.request {
            if envelope.hops == 0 {
                *cert_fingerprint = peer.fingerprint.clone();
            }
        }
        if let Some(name) = peer.common_name.strip_prefix(transport::pki::USER_CN_PREFIX) {
            envelope.user = Some(name.to_string());
            // A remote user's uid is not known here: the node that runs the job looks the name
            // up. Only a node (the local socket's kernel-checked answer) may state one.
            if let Request::Client(ClientRequest::Submit { spec }) = &mut envelope.request {
                spec.uid = None;
                spec.gid = None;
            }
        }
        if self.fault.refuses(&peer.common_name) {
            return Box::pin(async { Err(ApiError::Unavailable("partitioned (fault injection)".into())) });
        }
        // Only node certificates may speak the node-to-node part of the protocol; a user's
        // certificate (CN `user:NAME`) is limited to the client API.
        if peer.common_name.starts_with(transport::pki::USER_CN_PREFIX) && envelope.request.node_only() {
            warn!(peer = %peer.common_name, "refused a node-only request from a user certificate");
            return Box::pin(async { Err(ApiError::Denied("this request is for cluster nodes only".into())) });
        }
        match self.node.get() {
            Some(node) => Box::pin(Arc::clone(node).handle(envelope)),
            None => Box::pin(async { Err(ApiError::Unavailable("node is starting".into())) }),
        }
    }
}

impl transport::local::LocalHandler for Api {
    fn handle_local(
        &self,
        peer: transport::local::LocalPeer,
        mut envelope: Envelope,
    ) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
        if envelope.request.node_only() {
            warn!(uid = peer.uid, "refused a node-only request on the local socket");
            return Box::pin(async { Err(ApiError::Denied("this request is for cluster nodes only".into())) });
        }
        // The kernel names the caller. Root on a node holds the node's key anyway: it acts as
        // the node (an admin), and like a node forwarding a request it may act for a user it
        // names (`corral restd` for its HTTPS clients); every other uid is the user of that name.
        let Some(account) = crate::run::identity::by_uid(peer.uid) else {
            warn!(uid = peer.uid, "refused a local caller without a user name");
            return Box::pin(async move { Err(ApiError::Denied(format!("uid {} has no user name on this node", peer.uid))) });
        };
        envelope.user = if peer.uid == 0 { envelope.user.take() } else { Some(account.name.clone()) };
        if let Request::Client(ClientRequest::Submit { spec }) = &mut envelope.request {
            match &envelope.user {
                // As for a user's certificate: the node that runs the job looks the name up.
                Some(user) if peer.uid == 0 => {
                    spec.user = user.clone();
                    spec.uid = None;
                    spec.gid = None;
                }
                _ => {
                    spec.user = account.name.clone();
                    spec.uid = Some(peer.uid);
                    spec.gid = Some(peer.gid);
                }
            }
        }
        match self.node.get() {
            Some(node) => Box::pin(Arc::clone(node).handle(envelope)),
            None => Box::pin(async { Err(ApiError::Unavailable("node is starting".into())) }),
        }
    }
}
