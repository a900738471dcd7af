//! QUIC with mutual TLS and length-prefixed, size-limited frames: every peer proves a certificate
//! from the cluster CA, every frame is checked against its limit before it is read.
//!
//! One request per bidirectional stream: the caller writes one frame holding an encoded
//! [`proto::Envelope`] and finishes its side; the server answers with one frame holding an
//! encoded [`proto::Response`] and finishes its side. A frame is a big-endian `u32` length and
//! that many bytes. A bad stream is answered with an error and closed; its connection and the
//! server go on.

pub mod datagram;
pub mod local;
/// The QUIC implementation, for callers that hold an endpoint.
pub use quinn;
pub mod pki;
pub mod token;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use proto::limits::FRAME_BYTES_MAX;
use proto::{ApiError, CodecError, Envelope, Response};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{IdleTimeout, ReadError, ReadExactError, TransportConfig, VarInt, WriteError};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::CertificateDer;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

pub use pki::{
    ca_fingerprint, generate_ca, issue_client_cert, issue_node_cert, write_pem_pair, PemPair, TlsIdentity, TlsPaths, SERVER_NAME,
};

/// The one application protocol spoken over the QUIC connections.
/// Protocol versions this build speaks, newest first: offered as ALPN `corral/N` in the TLS
/// handshake, which picks the newest both sides speak (a rolling upgrade keeps one version of
/// overlap), or fails the handshake, reported as a version mismatch.
pub const PROTOCOL_VERSIONS: &[u8] = &[proto::PROTOCOL_VERSION];

/// The ALPN name of protocol version `v`.
pub fn alpn(v: u8) -> Vec<u8> {
    format!("corral/{v}").into_bytes()
}

/// TLS alert 120 (no_application_protocol) as QUIC reports it: CRYPTO_ERROR 0x100 + 120.
const QUIC_NO_APPLICATION_PROTOCOL: u64 = 0x100 + 120;

/// Longest wait for a QUIC handshake; far above any healthy round trip.
pub const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// A keep-alive is sent after this much silence, so a healthy idle connection never times out.
pub const KEEP_ALIVE_INTERVAL_MS: u64 = 1_000;
/// A call made with [`Client::call_failing_on_silence`] whose request the peer has not
/// acknowledged this long, on a connection that heard nothing at all since the call began, is
/// given up as sent to a dead peer (a live one acks
/// within QUIC's 25 ms ack delay): without this a call on a cached connection to a peer that
/// was just killed waits for the whole call timeout or the idle timeout.
pub const UNACKED_SILENCE_MS: u64 = 500;
/// A connection that hears nothing from its peer this long is dead.
pub const IDLE_TIMEOUT_MS: u64 = 5_000;
/// Streams a peer may have open on one connection at once.
pub const STREAMS_PER_CONNECTION_MAX: u32 = 256;
/// Connections a server holds at once; more are refused. A relay of a fleet may hold one from
/// every node (its own share, and the nodes of a relay that died): at 4,096 both relays of a
/// 5,000-node cluster refused nodes, which then went silent. An idle connection costs a few KiB.
pub const CONNECTIONS_MAX: usize = 16_384;
/// Handshakes a server runs at once; a connection past them is refused at once (one packet,
/// no crypto), so its peer tries another member or dials again later. Queued instead, a herd
/// of nodes whose relay died (thousands at once) waited past their 1 s connect timeout on a
/// saturated member, which then finished handshakes nobody waited for, and every retry added
/// to the queue.
pub const HANDSHAKES_IN_PROGRESS_MAX: usize = 64;
/// How long a server waits for the whole request frame of a stream.
pub const REQUEST_READ_TIMEOUT_MS: u64 = 60_000;

/// Stream error codes sent with a reset or stop.
const CODE_REFUSED: u32 = 1;
const CODE_TIMEOUT: u32 = 2;

/// The crypto provider of every TLS config made here: ring, passed explicitly, never installed
/// as the process default.
pub(crate) fn crypto_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())).clone()
}

fn transport_config() -> anyhow::Result<Arc<TransportConfig>> {
    let mut config = TransportConfig::default();
    config.keep_alive_interval(Some(Duration::from_millis(KEEP_ALIVE_INTERVAL_MS)));
    let idle = IdleTimeout::try_from(Duration::from_millis(IDLE_TIMEOUT_MS)).context("set idle timeout")?;
    config.max_idle_timeout(Some(idle));
    config.max_concurrent_bidi_streams(VarInt::from_u32(STREAMS_PER_CONNECTION_MAX));
    config.max_concurrent_uni_streams(VarInt::from_u32(0));
    config.datagram_receive_buffer_size(Some(datagram::DATAGRAM_RECEIVE_BUFFER_BYTES));
    config.datagram_send_buffer_size(datagram::DATAGRAM_RECEIVE_BUFFER_BYTES);
    Ok(Arc::new(config))
}

fn roots(id: &TlsIdentity) -> anyhow::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    roots.add(id.ca_der.clone()).context("add cluster CA to the trusted roots")?;
    Ok(Arc::new(roots))
}

fn client_config(id: &TlsIdentity, versions: &[u8]) -> anyhow::Result<quinn::ClientConfig> {
    let provider = crypto_provider();
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots(id)?, provider.clone())
        .build()
        .context("build server certificate verifier")?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("select TLS 1.3")?
        .with_webpki_verifier(verifier)
        .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
        .context("use own certificate for client authentication")?;
    tls.alpn_protocols = versions.iter().map(|v| alpn(*v)).collect();
    let quic = QuicClientConfig::try_from(tls).context("make QUIC client config")?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport_config()?);
    Ok(config)
}

fn chain_with_ca(id: &TlsIdentity) -> Vec<CertificateDer<'static>> {
    let mut chain = id.chain.clone();
    if !chain.contains(&id.ca_der) {
        chain.push(id.ca_der.clone());
    }
    chain
}

/// A client certificate, when shown, must chain to the cluster CA; a client may show none.
fn optional_client_verifier(
    id: &TlsIdentity,
    provider: &Arc<rustls::crypto::CryptoProvider>,
) -> anyhow::Result<Arc<dyn rustls::server::danger::ClientCertVerifier>> {
    WebPkiClientVerifier::builder_with_provider(roots(id)?, provider.clone())
        .allow_unauthenticated()
        .build()
        .context("build client certificate verifier")
}

fn server_config(id: &TlsIdentity, versions: &[u8]) -> anyhow::Result<quinn::ServerConfig> {
    let provider = crypto_provider();
    // A peer without a certificate may connect, and the handler lets it only enrol.
    let verifier = optional_client_verifier(id, &provider)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .context("select TLS 1.3")?
        .with_client_cert_verifier(verifier)
        // The CA goes with the leaf: an enrolling machine pins it by its fingerprint.
        .with_single_cert(chain_with_ca(id), id.key.clone_key())
        .context("use own certificate for serving")?;
    tls.alpn_protocols = versions.iter().map(|v| alpn(*v)).collect();
    let quic = QuicServerConfig::try_from(tls).context("make QUIC server config")?;
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(quic));
    config.transport_config(transport_config()?);
    Ok(config)
}

/// TLS for an HTTPS server of the cluster (`corral restd`): this identity's certificate, over
/// HTTP/1.1; a client certificate, when shown, must chain to the cluster CA (a client without
/// one must prove itself otherwise, with a token).
pub fn https_server_config(id: &TlsIdentity) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = crypto_provider();
    let verifier = optional_client_verifier(id, &provider)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("select TLS versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain_with_ca(id), id.key.clone_key())
        .context("use own certificate for serving")?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(tls))
}

/// Who a certificate (DER) names, as a QUIC peer is named: its common name, and its hex
/// SHA-256 fingerprint (which revocations name).
pub fn certificate_peer(der: &[u8]) -> (String, String) {
    (pki::peer_name(der), pki::der_fingerprint(der))
}

/// A QUIC endpoint bound to `bind`. With `serve` it accepts connections whose client proves a
/// certificate from the cluster CA (and no others); it can always dial out, proving its own
/// certificate and trusting servers of the cluster CA only. Must be called inside a Tokio
/// runtime.
pub fn endpoint(bind: SocketAddr, id: &TlsIdentity, serve: bool) -> anyhow::Result<quinn::Endpoint> {
    endpoint_speaking(bind, id, serve, PROTOCOL_VERSIONS)
}

/// [`endpoint`] speaking `versions` (newest first): tests use it to stand in for another build.
pub fn endpoint_speaking(bind: SocketAddr, id: &TlsIdentity, serve: bool, versions: &[u8]) -> anyhow::Result<quinn::Endpoint> {
    let server = if serve { Some(server_config(id, versions)?) } else { None };
    let socket =
        std::net::UdpSocket::bind(bind).with_context(|| format!("bind QUIC {} on {bind}", if serve { "server" } else { "client" }))?;
    let (reset, cid_key) = reset_keys(id);
    let mut config = quinn::EndpointConfig::new(reset);
    config.cid_generator(move || Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key)));
    let mut endpoint = quinn::Endpoint::new(config, server, socket, Arc::new(quinn::TokioRuntime))
        .with_context(|| format!("start the QUIC endpoint on {bind}"))?;
    endpoint.set_default_client_config(client_config(id, versions)?);
    Ok(endpoint)
}

/// The keys QUIC derives its stateless reset tokens and checks its connection ids with: the
/// same for every process with this identity (derived from its private key, which they do not
/// reveal), so a member restarted on its address takes its predecessor's connection ids for
/// its own and answers their packets with a reset the peers accept, and they dial anew at once.
/// With random keys per process (quinn's default) the new process dropped those packets as
/// forged, and a peer kept sending into the dead connection until QUIC's idle timeout
/// ([`IDLE_TIMEOUT_MS`]): every heartbeat a node sent its restarted relay meanwhile was lost.
fn reset_keys(id: &TlsIdentity) -> (Arc<dyn quinn::crypto::HmacKey>, u64) {
    let derive = |label: &[u8]| {
        let mut material = label.to_vec();
        material.extend_from_slice(id.key.secret_der());
        ring::digest::digest(&ring::digest::SHA256, &material)
    };
    let reset = derive(b"corral quic stateless reset key v1\0");
    let cid = derive(b"corral quic connection id key v1\0");
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&cid.as_ref()[..8]);
    (Arc::new(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, reset.as_ref())), u64::from_le_bytes(cid_key))
}

/// Swaps the certificate `endpoint` serves for `id`'s (a rotation): new connections get it;
/// connections already open keep theirs until they close. See [`Client::reload_identity`] for
/// the connections it dials.
pub fn reload_server_identity(endpoint: &quinn::Endpoint, id: &TlsIdentity) -> anyhow::Result<()> {
    endpoint.set_server_config(Some(server_config(id, PROTOCOL_VERSIONS)?));
    Ok(())
}

/// Whether a dial failed because the peer refused the connection (too many handshakes under
/// way, or too many connections): it is alive, and busy.
fn is_refusal(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<quinn::ConnectionError>(),
            Some(quinn::ConnectionError::ConnectionClosed(close)) if close.error_code == quinn::TransportErrorCode::CONNECTION_REFUSED
        )
    })
}

/// Whether a failed handshake failed because the two sides share no protocol version.
fn is_version_mismatch(e: &quinn::ConnectionError) -> bool {
    match e {
        quinn::ConnectionError::TransportError(t) => u64::from(t.code) == QUIC_NO_APPLICATION_PROTOCOL,
        quinn::ConnectionError::ConnectionClosed(c) => u64::from(c.error_code) == QUIC_NO_APPLICATION_PROTOCOL,
        _ => false,
    }
}

fn versions_text(versions: &[u8]) -> String {
    versions.iter().map(|v| format!("corral/{v}")).collect::<Vec<_>>().join(", ")
}

// ---------------------------------------------------------------------------------------------
// Frames

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("stream failed: {0}")]
    Io(String),
    #[error("stream closed before a frame")]
    Closed,
}

fn read_error(e: ReadError) -> FrameError {
    match e {
        ReadError::ClosedStream => FrameError::Closed,
        other => FrameError::Io(other.to_string()),
    }
}

fn write_error(e: WriteError) -> FrameError {
    match e {
        WriteError::ClosedStream => FrameError::Closed,
        other => FrameError::Io(other.to_string()),
    }
}

/// Writes one frame: the length as a big-endian `u32`, then the bytes.
pub async fn write_frame(send: &mut quinn::SendStream, bytes: &[u8]) -> Result<(), FrameError> {
    let len = u32::try_from(bytes.len()).map_err(|_| FrameError::TooLarge { len: bytes.len(), max: u32::MAX as usize })?;
    send.write_all(&len.to_be_bytes()).await.map_err(write_error)?;
    send.write_all(bytes).await.map_err(write_error)
}

/// Reads one frame of at most `max_bytes`. The length is checked before anything is allocated,
/// and the buffer then grows only as bytes arrive. A stream that ends before the first byte of
/// the length is [`FrameError::Closed`].
pub async fn read_frame(recv: &mut quinn::RecvStream, max_bytes: usize) -> Result<Vec<u8>, FrameError> {
    /// Most memory reserved ahead of the bytes that fill it.
    const RESERVE_BYTES_MAX: usize = 64 * 1024;
    let mut prefix = [0u8; 4];
    match recv.read_exact(&mut prefix).await {
        Ok(()) => {}
        Err(ReadExactError::FinishedEarly(0)) => return Err(FrameError::Closed),
        Err(ReadExactError::FinishedEarly(n)) => {
            return Err(FrameError::Io(format!("stream finished after {n} bytes of the length prefix")))
        }
        Err(ReadExactError::ReadError(e)) => return Err(read_error(e)),
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max_bytes {
        return Err(FrameError::TooLarge { len, max: max_bytes });
    }
    let mut buf = Vec::with_capacity(len.min(RESERVE_BYTES_MAX));
    while buf.len() < len {
        match recv.read_chunk(len - buf.len(), true).await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
            Ok(None) => {
                return Err(FrameError::Io(format!("stream finished after {} of {len} frame bytes", buf.len())));
            }
            Err(e) => return Err(read_error(e)),
        }
    }
    Ok(buf)
}

// ---------------------------------------------------------------------------------------------
// Server

/// Who is on the other end of a connection, as its certificate says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub remote: SocketAddr,
    /// The common name of the peer's certificate: a node's name, or `user:<name>` for a user.
    /// A certificate without one is named `sha256:<hex fingerprint>`; a peer without a
    /// certificate is [`ANONYMOUS_PEER`].
    pub common_name: String,
    /// Hex SHA-256 of the peer's certificate; empty for an anonymous peer.
    pub fingerprint: String,
}

/// How a peer without a certificate is named. Such a peer may only enrol (the handler decides).
pub const ANONYMOUS_PEER: &str = "anonymous:";

/// Answers requests. Called once per stream, concurrently; the future must not borrow `self`.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, peer: Peer, envelope: Envelope) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>>;

    /// Whether `envelope` may come as a datagram ([`datagram`]): small, idempotent requests
    /// whose loss the caller mends by itself. Others are refused that way.
    fn takes_datagram(&self, _envelope: &Envelope) -> bool {
        false
    }
}

fn peer_of(conn: &quinn::Connection) -> Peer {
    let leaf =
        conn.peer_identity().and_then(|id| id.downcast::<Vec<CertificateDer<'static>>>().ok()).and_then(|chain| chain.first().cloned());
    match leaf {
        Some(leaf) => Peer { remote: conn.remote_address(), common_name: pki::peer_name(&leaf), fingerprint: pki::der_fingerprint(&leaf) },
        None => Peer { remote: conn.remote_address(), common_name: ANONYMOUS_PEER.to_string(), fingerprint: String::new() },
    }
}

/// What this process's transport did since it started, for metrics and benches: handshakes
/// are what a loaded member pays most for, so a rise in them is the first sign of a herd.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counters {
    /// Connections accepted (handshake completed) by `serve`.
    pub accepted: u64,
    /// Connections this process dialed, and dials that failed (no answer, refused).
    pub dialed: u64,
    pub dials_failed: u64,
    /// Cached connections dropped after a call failed on them or heard nothing from the peer.
    pub dropped: u64,
    /// Connections `serve` refused because [`HANDSHAKES_IN_PROGRESS_MAX`] were under way.
    #[serde(default)]
    pub refused_busy: u64,
}

static ACCEPTED: AtomicU64 = AtomicU64::new(0);
static DIALED: AtomicU64 = AtomicU64::new(0);
static DIALS_FAILED: AtomicU64 = AtomicU64::new(0);
static DROPPED: AtomicU64 = AtomicU64::new(0);
static REFUSED_BUSY: AtomicU64 = AtomicU64::new(0);

/// The process's [`Counters`] now.
pub fn counters() -> Counters {
    Counters {
        accepted: ACCEPTED.load(Ordering::Relaxed),
        dialed: DIALED.load(Ordering::Relaxed),
        dials_failed: DIALS_FAILED.load(Ordering::Relaxed),
        dropped: DROPPED.load(Ordering::Relaxed),
        refused_busy: REFUSED_BUSY.load(Ordering::Relaxed),
    }
}

/// Accepts connections on `endpoint` until it is closed, answering every request with
/// `handler`. A connection that fails its handshake (a certificate not from the cluster CA, no
/// certificate at all) is refused and logged; the server goes on.
pub async fn serve(endpoint: quinn::Endpoint, handler: Arc<dyn Handler>) {
    serve_limited(endpoint, handler, HANDSHAKES_IN_PROGRESS_MAX).await
}

/// [`serve`] with at most `handshakes_max` handshakes under way.
async fn serve_limited(endpoint: quinn::Endpoint, handler: Arc<dyn Handler>, handshakes_max: usize) {
    let connections = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let handshakes = Arc::new(Semaphore::new(handshakes_max));
    while let Some(incoming) = endpoint.accept().await {
        let remote = incoming.remote_address();
        let Ok(handshake) = handshakes.clone().try_acquire_owned() else {
            // A herd: refusing costs one packet; the peer tries elsewhere or again later.
            REFUSED_BUSY.fetch_add(1, Ordering::Relaxed);
            debug!(peer = %remote, limit = handshakes_max, "connection refused: too many handshakes under way");
            incoming.refuse();
            continue;
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            warn!(peer = %remote, limit = CONNECTIONS_MAX, "connection refused: too many connections");
            incoming.refuse();
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let accepted = incoming.await;
            drop(handshake);
            let conn = match accepted {
                Ok(conn) => conn,
                Err(e) if is_version_mismatch(&e) => {
                    warn!(peer = %remote, ours = %versions_text(PROTOCOL_VERSIONS), "connection refused: the peer speaks no protocol version of ours");
                    return;
                }
                Err(e) => {
                    debug!(peer = %remote, error = %e, "connection refused");
                    return;
                }
            };
            ACCEPTED.fetch_add(1, Ordering::Relaxed);
            let peer = peer_of(&conn);
            debug!(peer = %remote, name = %peer.common_name, "connection accepted");
            serve_connection(conn, peer, handler).await;
        });
    }
    debug!("endpoint closed, serve loop ends");
}

async fn serve_connection(conn: quinn::Connection, peer: Peer, handler: Arc<dyn Handler>) {
    tokio::spawn(datagram::serve_datagrams(conn.clone(), peer.clone(), Arc::clone(&handler)));
    let streams = Arc::new(Semaphore::new(STREAMS_PER_CONNECTION_MAX as usize));
    loop {
        let Ok(permit) = streams.clone().acquire_owned().await else {
            return;
        };
        let (send, recv) = match conn.accept_bi().await {
            Ok(pair) => pair,
            Err(e) => {
                debug!(peer = %peer.remote, name = %peer.common_name, error = %e, "connection closed");
                return;
            }
        };
        let peer = peer.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            let _permit = permit;
            serve_stream(send, recv, peer, handler).await;
        });
    }
}

pub(crate) fn codec_error(e: CodecError) -> ApiError {
    match e {
        CodecError::Version { ours, theirs } => ApiError::Version { ours, theirs },
        other => ApiError::Invalid(other.to_string()),
    }
}

async fn serve_stream(mut send: quinn::SendStream, mut recv: quinn::RecvStream, peer: Peer, handler: Arc<dyn Handler>) {
    let read = tokio::time::timeout(Duration::from_millis(REQUEST_READ_TIMEOUT_MS), read_frame(&mut recv, FRAME_BYTES_MAX)).await;
    let response: Response = match read {
        Err(_elapsed) => {
            debug!(peer = %peer.remote, name = %peer.common_name, timeout_ms = REQUEST_READ_TIMEOUT_MS, "stream refused: request too slow");
            let _ = recv.stop(VarInt::from_u32(CODE_TIMEOUT));
            let _ = send.reset(VarInt::from_u32(CODE_TIMEOUT));
            return;
        }
        Ok(Err(FrameError::Closed)) => {
            debug!(peer = %peer.remote, name = %peer.common_name, "stream closed without a request");
            let _ = send.finish();
            return;
        }
        Ok(Err(FrameError::Io(e))) => {
            debug!(peer = %peer.remote, name = %peer.common_name, error = %e, "stream failed");
            let _ = send.reset(VarInt::from_u32(CODE_REFUSED));
            return;
        }
        Ok(Err(e @ FrameError::TooLarge { .. })) => {
            debug!(peer = %peer.remote, name = %peer.common_name, error = %e, "stream refused");
            // Tell the peer to stop sending the body we will not read.
            let _ = recv.stop(VarInt::from_u32(CODE_REFUSED));
            Err(ApiError::Invalid(e.to_string()))
        }
        Ok(Ok(bytes)) => match proto::decode::<Envelope>(&bytes, FRAME_BYTES_MAX) {
            Err(e) => {
                debug!(peer = %peer.remote, name = %peer.common_name, error = %e, "stream refused");
                Err(codec_error(e))
            }
            Ok(envelope) => {
                // The handler runs in its own task, so that a panic in it answers this stream
                // with an error, and so that a caller who gives up (stops the stream, or loses
                // the connection) frees the stream at once. The handler is never cancelled
                // half-way: it runs to its end, and its answer is then dropped.
                let task = tokio::spawn(handler.handle(peer.clone(), envelope));
                tokio::select! {
                    joined = task => match joined {
                        Ok(response) => response,
                        Err(e) => {
                            warn!(peer = %peer.remote, name = %peer.common_name, error = %e, "handler failed");
                            Err(ApiError::Internal("the request handler failed".into()))
                        }
                    },
                    _ = send.stopped() => {
                        debug!(peer = %peer.remote, name = %peer.common_name, "caller gone before the reply");
                        return;
                    }
                }
            }
        },
    };
    let mut bytes = proto::encode(&response);
    if bytes.len() > FRAME_BYTES_MAX {
        warn!(peer = %peer.remote, name = %peer.common_name, len = bytes.len(), max = FRAME_BYTES_MAX, "reply too large");
        bytes = proto::encode::<Response>(&Err(ApiError::Internal(format!(
            "reply of {} bytes exceeds the frame limit of {FRAME_BYTES_MAX}",
            bytes.len()
        ))));
    }
    if let Err(e) = write_frame(&mut send, &bytes).await {
        debug!(peer = %peer.remote, name = %peer.common_name, error = %e, "reply not sent");
        return;
    }
    let _ = send.finish();
    // Keep the stream until the peer has the reply or goes away, so nothing is cut short.
    let _ = send.stopped().await;
}

// ---------------------------------------------------------------------------------------------
// Client

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("connect failed: {0}")]
    Connect(String),
    #[error("call timed out")]
    Timeout,
    /// The request went out and nothing at all came back within [`UNACKED_SILENCE_MS`]: the
    /// peer is most likely dead. It may still have received the request.
    #[error("the peer acknowledged nothing within {0} ms")]
    Silent(u64),
    #[error("stream failed: {0}")]
    Io(String),
    #[error("bad message: {0}")]
    Codec(String),
}

impl From<FrameError> for CallError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::TooLarge { .. } => CallError::Codec(e.to_string()),
            FrameError::Io(_) | FrameError::Closed => CallError::Io(e.to_string()),
        }
    }
}

/// A cached connection: when a call last started on it and how many calls are on it now.
struct Cached {
    conn: quinn::Connection,
    used: std::time::Instant,
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

/// Counts a call on a cached connection while it lasts.
struct InFlight(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A cached connection no call used for this long is closed (at the next call's sweep): QUIC
/// keep-alives cost both ends packets every second for as long as a connection is open, and a
/// leader that every node of a fleet once called would otherwise pay that for each of them.
pub const CONNECTION_IDLE_CLOSE: Duration = Duration::from_secs(10);
/// How long a client leaves a peer that refused its handshake (busy, or full) before dialing it
/// again: 200 to 600 ms, spread per dial so a refused herd does not come back at once. Calls
/// meanwhile fail at once, and a caller with several members asks the next.
const REFUSED_BACKOFF_MS_MIN: u64 = 200;
const REFUSED_BACKOFF_SPAN_MS: u64 = 400;
/// Peers a client remembers as refusing at once, at most.
const REFUSED_PEERS_MAX: usize = 1024;

/// How often a client looks for idle connections (on a call; never between calls).
const CONNECTION_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// A call's hold on the dial to one address; the last one out removes the address's entry
/// (also when the call is cancelled while it waits).
struct DialGate<'a> {
    client: &'a Client,
    addr: &'a str,
    gate: Arc<DialState>,
}

/// The dial to one address: held while dialing; the last failure and when it happened.
type DialState = tokio::sync::Mutex<Option<(std::time::Instant, String)>>;

impl Drop for DialGate<'_> {
    fn drop(&mut self) {
        let mut dialing = self.client.lock_dialing();
        // Ours and the map's: nobody else waits on this gate.
        if Arc::strong_count(&self.gate) <= 2 {
            dialing.remove(self.addr);
        }
    }
}

struct ClientInner {
    endpoint: quinn::Endpoint,
    /// One connection per address as given to [`Client::call`].
    connections: Mutex<HashMap<String, Cached>>,
    /// One dial per address at a time: calls that find a dial under way wait for its
    /// connection instead of each paying a handshake of their own (a leader launching eight
    /// jobs on a node it never called dialed it eight times). An entry lives while its dial
    /// has callers.
    dialing: Mutex<HashMap<String, Arc<DialState>>>,
    /// Peers that refused a handshake, and until when they are not dialed again.
    refused: Mutex<HashMap<String, std::time::Instant>>,
    swept: Mutex<std::time::Instant>,
    idle_close: Duration,
    /// Fault injection: addresses this client cannot reach (`*` for all), as if partitioned.
    blocked: std::sync::RwLock<Vec<String>>,
    /// After a certificate rotation: the configuration new connections dial with.
    rotated: std::sync::RwLock<Option<quinn::ClientConfig>>,
    /// Calls made as datagrams, waiting for their replies.
    datagrams: Arc<datagram::DatagramCalls>,
}

/// Calls peers over one endpoint, keeping one connection per address. Clones share the
/// endpoint and the connections.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("local_addr", &self.inner.endpoint.local_addr().ok()).finish()
    }
}

impl Client {
    /// A client dialing from `endpoint`, which must have a default client config (as
    /// [`endpoint`] gives it).
    pub fn new(endpoint: quinn::Endpoint) -> Client {
        Client::with_idle_close(endpoint, CONNECTION_IDLE_CLOSE)
    }

    /// [`Client::new`], closing connections idle for `idle_close` instead of
    /// [`CONNECTION_IDLE_CLOSE`].
    pub fn with_idle_close(endpoint: quinn::Endpoint, idle_close: Duration) -> Client {
        Client {
            inner: Arc::new(ClientInner {
                endpoint,
                connections: Mutex::new(HashMap::new()),
                dialing: Mutex::new(HashMap::new()),
                refused: Mutex::new(HashMap::new()),
                swept: Mutex::new(std::time::Instant::now()),
                idle_close,
                blocked: std::sync::RwLock::new(Vec::new()),
                rotated: std::sync::RwLock::new(None),
                datagrams: Arc::default(),
            }),
        }
    }

    /// New connections prove `id` (a rotated certificate); open ones keep theirs.
    pub fn reload_identity(&self, id: &TlsIdentity) -> anyhow::Result<()> {
        let config = client_config(id, PROTOCOL_VERSIONS)?;
        *self.inner.rotated.write().unwrap_or_else(|p| p.into_inner()) = Some(config);
        Ok(())
    }

    /// Fault injection for tests and the chaos harness: calls to these addresses (`*`: every
    /// address) fail at once as unreachable, and their cached connections are dropped.
    pub fn set_blocked(&self, addrs: Vec<String>) {
        let all = addrs.iter().any(|a| a == "*");
        {
            let mut map = self.lock();
            map.retain(|addr, _| !(all || addrs.contains(addr)));
        }
        *self.inner.blocked.write().unwrap_or_else(|p| p.into_inner()) = addrs;
    }

    fn is_blocked(&self, addr: &str) -> bool {
        let blocked = self.inner.blocked.read().unwrap_or_else(|p| p.into_inner());
        blocked.iter().any(|b| b == "*" || b == addr)
    }

    pub fn endpoint(&self) -> &quinn::Endpoint {
        &self.inner.endpoint
    }

    /// QUIC's estimate of the round trip to `addr`, on the connection open to it (none: no
    /// connection, or a closed one).
    pub fn round_trip(&self, addr: &str) -> Option<Duration> {
        self.lock().get(addr).filter(|cached| cached.conn.close_reason().is_none()).map(|cached| cached.conn.rtt())
    }

    /// Drops the cached connection to `addr`, if any; the next call dials anew.
    pub fn forget(&self, addr: &str) {
        if let Some(cached) = self.lock().remove(addr) {
            cached.conn.close(VarInt::from_u32(0), b"forgotten");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        // The map holds no invariant a panicking holder could break.
        self.inner.connections.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drops `conn` from the cache if it is still the one cached for `addr`.
    fn drop_cached(&self, addr: &str, conn: &quinn::Connection) {
        let mut map = self.lock();
        if map.get(addr).is_some_and(|c| c.conn.stable_id() == conn.stable_id()) {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            map.remove(addr);
        }
    }

    /// Sends `envelope` to `addr` (`host:port`) and waits for its response, all within
    /// `timeout`. A remote refusal is `Ok(Err(ApiError))`; a failure to reach the peer or to
    /// read its answer is a [`CallError`].
    ///
    /// A cached connection found dead, or on which no stream can be opened, is replaced once by
    /// a new one. A request that may have reached the peer is never sent twice.
    pub async fn call(&self, addr: &str, envelope: &Envelope, timeout: Duration) -> Result<Response, CallError> {
        self.call_connecting_within(addr, envelope, timeout, Duration::from_millis(CONNECT_TIMEOUT_MS)).await
    }

    /// [`Client::call`], giving up on a new connection's handshake after `connect_timeout`
    /// (a caller with other members to try asks each briefly first, so a dead one costs little).
    pub async fn call_connecting_within(
        &self,
        addr: &str,
        envelope: &Envelope,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Response, CallError> {
        self.call_with(addr, envelope, timeout, connect_timeout, false).await
    }

    /// [`Client::call_connecting_within`] that also gives up as [`CallError::Silent`] once the
    /// request went [`UNACKED_SILENCE_MS`] unacknowledged on a connection silent since the call
    /// began: for a caller with somewhere else to go (a client or a forward looking for the
    /// leader through a failover). Not for node-to-node traffic at a fleet's scale: a relay or
    /// a node saturated for half a second would lose its connections and pay new handshakes,
    /// which at 5,000 nodes fed a storm of false `NodeDown`s.
    pub async fn call_failing_on_silence(
        &self,
        addr: &str,
        envelope: &Envelope,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Response, CallError> {
        self.call_with(addr, envelope, timeout, connect_timeout, true).await
    }

    async fn call_with(
        &self,
        addr: &str,
        envelope: &Envelope,
        timeout: Duration,
        connect_timeout: Duration,
        fail_on_silence: bool,
    ) -> Result<Response, CallError> {
        if self.is_blocked(addr) {
            return Err(CallError::Connect(format!("{addr} is cut off (fault injection)")));
        }
        let request = proto::encode(envelope);
        if request.len() > FRAME_BYTES_MAX {
            return Err(CallError::Codec(format!("request of {} bytes exceeds the frame limit of {FRAME_BYTES_MAX}", request.len())));
        }
        let used: Mutex<Option<(quinn::Connection, u64)>> = Mutex::new(None);
        match tokio::time::timeout(timeout, self.call_inner(addr, &request, connect_timeout, &used, fail_on_silence)).await {
            Ok(result) => result,
            Err(_elapsed) => {
                // A peer that is alive but slow still acknowledges our packets and sends its
                // keep-alives: its connection is kept (a new handshake would cost it far more).
                // Nothing at all arrived during the call: the peer is likely gone (killed, or
                // restarted on the same port, which does not know the connection), so the next
                // call dials anew instead of waiting for QUIC's idle timeout.
                let used = used.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some((conn, rx_before)) = used {
                    if conn.stats().udp_rx.datagrams == rx_before {
                        self.drop_cached(addr, &conn);
                    }
                }
                Err(CallError::Timeout)
            }
        }
    }

    /// Dials `addr` without sending anything (a cached live connection will do), giving up on
    /// the handshake after `connect_timeout`; the connection is then cached for the next call.
    /// A caller with several members races their handshakes this way and sends its request to
    /// one member at a time, so a request is never sent to two.
    pub async fn connect_within(&self, addr: &str, connect_timeout: Duration) -> Result<(), CallError> {
        if self.is_blocked(addr) {
            return Err(CallError::Connect(format!("{addr} is cut off (fault injection)")));
        }
        let (_conn, _fresh, _in_flight) = self.connection(addr, connect_timeout).await?;
        Ok(())
    }

    async fn call_inner(
        &self,
        addr: &str,
        request: &[u8],
        connect_timeout: Duration,
        used: &Mutex<Option<(quinn::Connection, u64)>>,
        fail_on_silence: bool,
    ) -> Result<Response, CallError> {
        let (first, fresh, in_flight) = self.connection(addr, connect_timeout).await?;
        // The connection the request goes out on (a dead cached one is replaced once): what the
        // timeout and silence rules look at, and what a failure drops.
        let (conn, streams, _in_flight) = match first.open_bi().await {
            Ok(streams) => (first, streams, in_flight),
            Err(e) => {
                self.drop_cached(addr, &first);
                if fresh {
                    return Err(CallError::Io(format!("open stream to {addr}: {e}")));
                }
                debug!(peer = %addr, error = %e, "cached connection dead, reconnecting");
                let (conn, _, in_flight) = self.connection(addr, connect_timeout).await?;
                match conn.open_bi().await {
                    Ok(streams) => (conn, streams, in_flight),
                    Err(e) => {
                        self.drop_cached(addr, &conn);
                        return Err(CallError::Io(format!("open stream to {addr}: {e}")));
                    }
                }
            }
        };
        let rx_before = conn.stats().udp_rx.datagrams;
        *used.lock().unwrap_or_else(|p| p.into_inner()) = Some((conn.clone(), rx_before));
        let result = exchange(streams, request, fail_on_silence.then_some((&conn, rx_before))).await;
        if matches!(result, Err(CallError::Silent(_))) {
            debug!(peer = %addr, "request not acknowledged: dropping the connection");
            self.drop_cached(addr, &conn);
        }
        if result.is_err() {
            if let Some(reason) = conn.close_reason() {
                debug!(peer = %addr, reason = %reason, "connection lost");
                self.drop_cached(addr, &conn);
            }
        }
        result
    }

    /// The cached connection to `addr` when it is alive, else a new one; `true` when new. A
    /// call that waited on another's dial to `addr` takes its connection, or its failure: one
    /// handshake per burst of calls, even to a peer that does not answer.
    async fn connection(&self, addr: &str, connect_timeout: Duration) -> Result<(quinn::Connection, bool, InFlight), CallError> {
        self.sweep_idle();
        if let Some(found) = self.cached(addr) {
            return Ok(found);
        }
        if let Some(left) = self.refused_for(addr) {
            return Err(CallError::Connect(format!("{addr} refused a handshake: not dialed again for {} ms", left.as_millis())));
        }
        let gate = DialGate { client: self, addr, gate: Arc::clone(self.lock_dialing().entry(addr.to_string()).or_default()) };
        self.dial_through(addr, &gate.gate, connect_timeout).await
    }

    /// How long `addr` is still left alone after it refused a handshake.
    fn refused_for(&self, addr: &str) -> Option<Duration> {
        let refused = self.inner.refused.lock().unwrap_or_else(|p| p.into_inner());
        refused.get(addr).and_then(|until| until.checked_duration_since(std::time::Instant::now()))
    }

    /// Leaves `addr` alone for a spread back-off after it refused a handshake.
    fn back_off_refused(&self, addr: &str) {
        let now = std::time::Instant::now();
        let mut refused = self.inner.refused.lock().unwrap_or_else(|p| p.into_inner());
        refused.retain(|_, until| *until > now);
        if refused.len() >= REFUSED_PEERS_MAX {
            return;
        }
        // Spread by the clock's low bits: peers refused together come back apart.
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let spread_ms = u64::from(nanos / 1_000) % (REFUSED_BACKOFF_SPAN_MS + 1);
        refused.insert(addr.to_string(), now + Duration::from_millis(REFUSED_BACKOFF_MS_MIN + spread_ms));
    }

    async fn dial_through(
        &self,
        addr: &str,
        gate: &DialState,
        connect_timeout: Duration,
    ) -> Result<(quinn::Connection, bool, InFlight), CallError> {
        let started = std::time::Instant::now();
        let mut failed = match gate.try_lock() {
            Ok(guard) => guard,
            Err(_) => gate.lock().await,
        };
        if let Some(found) = self.cached(addr) {
            return Ok(found);
        }
        // A dial that failed while this call waited is this call's failure too; one that was
        // given up (its caller's own timeout ran out) left nothing, and this call dials.
        if let Some((at, why)) = failed.as_ref() {
            if *at >= started {
                return Err(CallError::Connect(format!("{why} (a concurrent call's dial)")));
            }
        }
        let conn = match self.dial(addr, connect_timeout).await {
            Ok(conn) => {
                DIALED.fetch_add(1, Ordering::Relaxed);
                conn
            }
            Err(e) => {
                DIALS_FAILED.fetch_add(1, Ordering::Relaxed);
                if is_refusal(&e) {
                    self.back_off_refused(addr);
                }
                let why = format!("{e:#}");
                *failed = Some((std::time::Instant::now(), why.clone()));
                return Err(CallError::Connect(why));
            }
        };
        *failed = None;
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(1));
        let cached = Cached { conn: conn.clone(), used: std::time::Instant::now(), in_flight: Arc::clone(&in_flight) };
        self.lock().insert(addr.to_string(), cached);
        Ok((conn, true, InFlight(in_flight)))
    }

    /// The cached connection to `addr` if it is alive (a dead one is dropped), counted in use.
    fn cached(&self, addr: &str) -> Option<(quinn::Connection, bool, InFlight)> {
        let mut map = self.lock();
        let cached = map.get_mut(addr)?;
        if cached.conn.close_reason().is_some() {
            map.remove(addr);
            return None;
        }
        cached.used = std::time::Instant::now();
        cached.in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Some((cached.conn.clone(), false, InFlight(Arc::clone(&cached.in_flight))))
    }

    fn lock_dialing(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<DialState>>> {
        // The map holds no invariant a panicking holder could break.
        self.inner.dialing.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Closes the cached connections no call used for their idle limit, at most once
    /// per [`CONNECTION_SWEEP_INTERVAL`].
    fn sweep_idle(&self) {
        {
            let mut swept = self.inner.swept.lock().unwrap_or_else(|p| p.into_inner());
            if swept.elapsed() < CONNECTION_SWEEP_INTERVAL {
                return;
            }
            *swept = std::time::Instant::now();
        }
        self.lock().retain(|addr, c| {
            let keep = c.in_flight.load(std::sync::atomic::Ordering::SeqCst) > 0 || c.used.elapsed() < self.inner.idle_close;
            if !keep {
                debug!(peer = %addr, "closing an idle connection");
                c.conn.close(VarInt::from_u32(0), b"idle");
            }
            keep
        });
    }

    async fn dial(&self, addr: &str, connect_timeout: Duration) -> anyhow::Result<quinn::Connection> {
        let target = resolve(addr, self.inner.endpoint.local_addr().ok()).await?;
        let rotated = self.inner.rotated.read().unwrap_or_else(|p| p.into_inner()).clone();
        let connecting = match rotated {
            Some(config) => self.inner.endpoint.connect_with(config, target, SERVER_NAME),
            None => self.inner.endpoint.connect(target, SERVER_NAME),
        }
        .with_context(|| format!("dial {addr}"))?;
        // A dead peer never answers a handshake: give up early, before anything was sent, so
        // the caller can try another member at once.
        let conn = match tokio::time::timeout(connect_timeout, connecting).await {
            Err(_) => bail!("handshake with {addr}: no answer within {} ms", connect_timeout.as_millis()),
            Ok(Err(e)) if is_version_mismatch(&e) => bail!(
                "handshake with {addr}: incompatible protocol versions: this build speaks {} and {addr} none of them; \
                 run builds with a protocol version in common (a rolling upgrade moves one version at a time)",
                versions_text(PROTOCOL_VERSIONS)
            ),
            Ok(Err(e)) => return Err(e).with_context(|| format!("handshake with {addr}")),
            Ok(Ok(conn)) => conn,
        };
        debug!(peer = %addr, remote = %target, "connected");
        Ok(conn)
    }
}

/// The first address `addr` resolves to, preferring the family of the local socket.
async fn resolve(addr: &str, local: Option<SocketAddr>) -> anyhow::Result<SocketAddr> {
    let candidates: Vec<SocketAddr> = tokio::net::lookup_host(addr).await.with_context(|| format!("resolve {addr}"))?.collect();
    let want_v4 = local.is_some_and(|l| l.is_ipv4());
    candidates
        .iter()
        .find(|a| !want_v4 || a.is_ipv4())
        .or_else(|| candidates.first())
        .copied()
        .ok_or_else(|| anyhow!("resolve {addr}: no addresses"))
}

/// `silence`: the connection and its received-datagram count before the request, when the call
/// gives up on a silent peer ([`Client::call_failing_on_silence`]).
async fn exchange(
    (mut send, mut recv): (quinn::SendStream, quinn::RecvStream),
    request: &[u8],
    silence: Option<(&quinn::Connection, u64)>,
) -> Result<Response, CallError> {
    write_frame(&mut send, request).await?;
    // Finishing only fails on a stream already closed, which the read below reports.
    let _ = send.finish();
    let reply = match silence {
        Some((conn, rx_before)) => tokio::select! {
            reply = read_frame(&mut recv, FRAME_BYTES_MAX) => reply?,
            () = unacked_silence(&mut send, conn, rx_before) => return Err(CallError::Silent(UNACKED_SILENCE_MS)),
        },
        None => read_frame(&mut recv, FRAME_BYTES_MAX).await?,
    };
    proto::decode::<Response>(&reply, FRAME_BYTES_MAX).map_err(|e| CallError::Codec(e.to_string()))
}

/// Returns if the peer neither acknowledged the finished request `send` within
/// [`UNACKED_SILENCE_MS`] nor sent anything at all on `conn` since `rx_before` was read; else
/// never (the reply, or the call's own timeout, ends the call).
async fn unacked_silence(send: &mut quinn::SendStream, conn: &quinn::Connection, rx_before: u64) {
    let acked = tokio::time::timeout(Duration::from_millis(UNACKED_SILENCE_MS), send.stopped()).await;
    if acked.is_ok() || conn.stats().udp_rx.datagrams != rx_before {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests;

// ---------------------------------------------------------------------------------------------
// Enrolment: a machine without a certificate, pinning the cluster CA by its fingerprint

/// Accepts a server whose chain carries a CA with the pinned fingerprint and whose leaf that CA
/// signed for `corral.cluster`; nothing else.
#[derive(Debug)]
struct PinnedCa {
    fingerprint: String,
    provider: Arc<CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let ca = intermediates
            .iter()
            .find(|c| pki::der_fingerprint(c) == self.fingerprint)
            .ok_or_else(|| rustls::Error::General(format!("the server's chain holds no CA with fingerprint {}", self.fingerprint)))?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned()).map_err(|e| rustls::Error::General(format!("use the pinned CA: {e}")))?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(format!("build the pinned verifier: {e}")))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// One request from a machine without a certificate (enrolment) to the node at `addr`, whose
/// cluster CA must have fingerprint `ca_fingerprint` (from the join token): the request, and the
/// secret in it, go only to a server that proves that CA signed it.
pub async fn call_pinned(addr: &str, ca_fingerprint: &str, envelope: &Envelope, timeout: Duration) -> Result<Response, CallError> {
    let provider = crypto_provider();
    let verifier = Arc::new(PinnedCa { fingerprint: ca_fingerprint.to_ascii_lowercase(), provider: provider.clone() });
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| CallError::Connect(format!("select TLS 1.3: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = PROTOCOL_VERSIONS.iter().map(|v| alpn(*v)).collect();
    let quic = QuicClientConfig::try_from(tls).map_err(|e| CallError::Connect(format!("make QUIC client config: {e}")))?;
    let mut config = quinn::ClientConfig::new(Arc::new(quic));
    config.transport_config(transport_config().map_err(|e| CallError::Connect(format!("{e:#}")))?);
    let bind: SocketAddr =
        if addr.starts_with('[') { "[::]:0" } else { "0.0.0.0:0" }.parse().map_err(|e| CallError::Connect(format!("{e}")))?;
    let endpoint = quinn::Endpoint::client(bind).map_err(|e| CallError::Connect(format!("bind QUIC client: {e}")))?;
    let exchange = async {
        let target = resolve(addr, endpoint.local_addr().ok()).await.map_err(|e| CallError::Connect(format!("{e:#}")))?;
        let connecting = endpoint.connect_with(config, target, SERVER_NAME).map_err(|e| CallError::Connect(format!("dial {addr}: {e}")))?;
        let conn = match connecting.await {
            Ok(c) => c,
            Err(e) if is_version_mismatch(&e) => {
                return Err(CallError::Connect(format!(
                    "handshake with {addr}: incompatible protocol versions ({})",
                    versions_text(PROTOCOL_VERSIONS)
                )))
            }
            Err(e) => return Err(CallError::Connect(format!("handshake with {addr} (is its CA the token's {ca_fingerprint}?): {e}"))),
        };
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| CallError::Io(e.to_string()))?;
        write_frame(&mut send, &proto::encode(envelope)).await?;
        let _ = send.finish();
        let reply = read_frame(&mut recv, FRAME_BYTES_MAX).await?;
        conn.close(VarInt::from_u32(0), b"done");
        proto::decode::<Response>(&reply, FRAME_BYTES_MAX).map_err(|e| CallError::Codec(e.to_string()))
    };
    let result = tokio::time::timeout(timeout, exchange).await.map_err(|_| CallError::Timeout)?;
    endpoint.wait_idle().await;
    result
}
