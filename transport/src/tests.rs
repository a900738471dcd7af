//! Round trips, refusals and bad frames through a real server on loopback.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proto::{ApiError, ClientRequest, Envelope, Reply, Request, Response, PROTOCOL_VERSION};

use super::*;

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const LOOPBACK: &str = "127.0.0.1:0";

/// Cancel{job} answers Submitted{job}; ListNodes answers the caller's common name;
/// ClusterInfo never answers; Resume panics.
struct TestHandler {
    calls: AtomicUsize,
}

/// Jobs from this id on are refused with a text of `job - LONG_REFUSAL_JOB` bytes.
const LONG_REFUSAL_JOB: u64 = 1_000_000;

impl Handler for TestHandler {
    fn takes_datagram(&self, envelope: &Envelope) -> bool {
        matches!(
            envelope.request,
            Request::Client(ClientRequest::Cancel { .. })
                | Request::Client(ClientRequest::ListNodes)
                | Request::Client(ClientRequest::ClusterInfo)
        )
    }

    fn handle(&self, peer: Peer, envelope: Envelope) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            match envelope.request {
                Request::Client(ClientRequest::Cancel { job }) if job >= LONG_REFUSAL_JOB => {
                    Err(ApiError::Denied("d".repeat((job - LONG_REFUSAL_JOB) as usize)))
                }
                Request::Client(ClientRequest::Cancel { job }) => Ok(Reply::Submitted { job }),
                Request::Client(ClientRequest::ListNodes) => Ok(Reply::Joined { id: 0, name: peer.common_name }),
                Request::Client(ClientRequest::ClusterInfo) => std::future::pending().await,
                Request::Client(ClientRequest::Resume { node }) => panic!("handler asked to panic for {node}"),
                _ => Err(ApiError::Invalid("not in this test".into())),
            }
        })
    }
}

struct Cluster {
    ca: PemPair,
    server_id: TlsIdentity,
}

impl Cluster {
    fn new() -> Cluster {
        let ca = generate_ca("test").expect("generate CA");
        let node = issue_node_cert(&ca, "node-a", &["127.0.0.1".into()]).expect("issue node cert");
        let server_id = TlsIdentity::from_pems(&ca.cert_pem, &node.cert_pem, &node.key_pem).expect("server identity");
        Cluster { ca, server_id }
    }

    fn user(&self, name: &str) -> TlsIdentity {
        let pair = issue_client_cert(&self.ca, name).expect("issue client cert");
        TlsIdentity::from_pems(&self.ca.cert_pem, &pair.cert_pem, &pair.key_pem).expect("user identity")
    }

    fn client(&self, name: &str) -> Client {
        Client::new(endpoint(LOOPBACK.parse().expect("addr"), &self.user(name), false).expect("client endpoint"))
    }
}

struct Server {
    endpoint: quinn::Endpoint,
    addr: SocketAddr,
    handler: Arc<TestHandler>,
    task: tokio::task::JoinHandle<()>,
}

fn start_server(id: &TlsIdentity, bind: SocketAddr) -> Server {
    let endpoint = endpoint(bind, id, true).expect("server endpoint");
    let addr = endpoint.local_addr().expect("local addr");
    let handler = Arc::new(TestHandler { calls: AtomicUsize::new(0) });
    let task = tokio::spawn(serve(endpoint.clone(), handler.clone()));
    Server { endpoint, addr, handler, task }
}

fn envelope(request: impl Into<Request>) -> Envelope {
    Envelope { hops: 0, request: request.into(), user: None }
}

async fn cancel(client: &Client, addr: &str, job: u64) -> Result<Response, CallError> {
    client.call(addr, &envelope(ClientRequest::Cancel { job }), CALL_TIMEOUT).await
}

/// A raw connection from a good client, for writing frames by hand.
async fn raw_connection(cluster: &Cluster, addr: SocketAddr) -> quinn::Connection {
    let ep = endpoint(LOOPBACK.parse().expect("addr"), &cluster.user("raw"), false).expect("raw endpoint");
    ep.connect(addr, SERVER_NAME).expect("dial").await.expect("handshake")
}

async fn raw_exchange(conn: &quinn::Connection, frame: &[u8], finish: bool) -> Result<Vec<u8>, FrameError> {
    let (mut send, mut recv) = conn.open_bi().await.expect("open stream");
    send.write_all(frame).await.map_err(|e| FrameError::Io(e.to_string()))?;
    if finish {
        send.finish().expect("finish");
    }
    read_frame(&mut recv, FRAME_BYTES_MAX).await
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

#[tokio::test]
async fn request_round_trips_and_names_the_peer() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    let client = cluster.client("alice");

    assert_eq!(cancel(&client, &addr, 7).await.expect("call"), Ok(Reply::Submitted { job: 7 }));
    let named = client.call(&addr, &envelope(ClientRequest::ListNodes), CALL_TIMEOUT).await.expect("call");
    assert_eq!(named, Ok(Reply::Joined { id: 0, name: "user:alice".into() }));
    let refused = client.call(&addr, &envelope(ClientRequest::ListJobs { include_finished: true }), CALL_TIMEOUT).await;
    assert_eq!(refused.expect("call"), Err(ApiError::Invalid("not in this test".into())));

    // A node dialing with its own certificate is named by it.
    let node_client = Client::new(endpoint(LOOPBACK.parse().expect("addr"), &cluster.server_id, false).expect("ep"));
    let named = node_client.call(&addr, &envelope(ClientRequest::ListNodes), CALL_TIMEOUT).await.expect("call");
    assert_eq!(named, Ok(Reply::Joined { id: 0, name: "node-a".into() }));

    // Many calls at once share one connection.
    let calls = (0..64u64).map(|job| {
        let client = client.clone();
        let addr = addr.clone();
        tokio::spawn(async move { cancel(&client, &addr, job).await })
    });
    for (job, call) in calls.enumerate() {
        let reply = call.await.expect("join").expect("call");
        assert_eq!(reply, Ok(Reply::Submitted { job: job as u64 }));
    }
    assert_eq!(client.lock().len(), 1);
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 3 + 1 + 64);

    // "localhost:port" resolves too.
    let by_name = format!("localhost:{}", server.addr.port());
    assert_eq!(cancel(&client, &by_name, 1).await.expect("call by name"), Ok(Reply::Submitted { job: 1 }));
}

#[tokio::test]
async fn client_of_another_ca_is_refused_and_server_goes_on() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();

    // Trusts our CA but proves a certificate from another one: the server refuses it.
    let other_ca = generate_ca("other").expect("other CA");
    let mallory = issue_client_cert(&other_ca, "mallory").expect("issue");
    let id = TlsIdentity::from_pems(&cluster.ca.cert_pem, &mallory.cert_pem, &mallory.key_pem).expect("identity");
    let bad = Client::new(endpoint(LOOPBACK.parse().expect("addr"), &id, false).expect("endpoint"));
    let err = cancel(&bad, &addr, 1).await.expect_err("foreign client must be refused");
    assert!(matches!(err, CallError::Io(_) | CallError::Connect(_)), "{err:?}");

    // Wholly of the other cluster: it does not trust our server either.
    let id = TlsIdentity::from_pems(&other_ca.cert_pem, &mallory.cert_pem, &mallory.key_pem).expect("identity");
    let foreign = Client::new(endpoint(LOOPBACK.parse().expect("addr"), &id, false).expect("endpoint"));
    let err = cancel(&foreign, &addr, 1).await.expect_err("foreign cluster must fail");
    assert!(matches!(err, CallError::Connect(_)), "{err:?}");

    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 0);
    let good = cluster.client("alice");
    assert_eq!(cancel(&good, &addr, 2).await.expect("good call"), Ok(Reply::Submitted { job: 2 }));
}

#[tokio::test]
async fn bad_frames_fail_their_stream_only() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let conn = raw_connection(&cluster, server.addr).await;

    // A valid length and a body of junk.
    let mut junk = vec![PROTOCOL_VERSION];
    junk.extend_from_slice(&[0xff; 40]);
    let reply = raw_exchange(&conn, &framed(&junk), true).await.expect("reply to junk");
    let response: Response = proto::decode(&reply, FRAME_BYTES_MAX).expect("decode reply");
    assert!(matches!(response, Err(ApiError::Invalid(_))), "{response:?}");

    // Another protocol version.
    let mut other_version = proto::encode(&envelope(ClientRequest::Cancel { job: 1 }));
    other_version[0] = PROTOCOL_VERSION.wrapping_add(98);
    let reply = raw_exchange(&conn, &framed(&other_version), true).await.expect("reply to other version");
    let response: Response = proto::decode(&reply, FRAME_BYTES_MAX).expect("decode reply");
    assert_eq!(response, Err(ApiError::Version { ours: PROTOCOL_VERSION, theirs: PROTOCOL_VERSION.wrapping_add(98) }));

    // An empty frame and a stream cut inside its frame: an error reply or a closed stream.
    let reply = raw_exchange(&conn, &framed(&[]), true).await.expect("reply to empty frame");
    let response: Response = proto::decode(&reply, FRAME_BYTES_MAX).expect("decode reply");
    assert!(matches!(response, Err(ApiError::Invalid(_))), "{response:?}");
    let cut = framed(&[PROTOCOL_VERSION; 10]);
    assert!(raw_exchange(&conn, &cut[..8], true).await.is_err());

    // A length past the limit is answered at once, without waiting for (or keeping) a body.
    let huge = ((FRAME_BYTES_MAX + 1) as u32).to_be_bytes();
    let reply = tokio::time::timeout(CALL_TIMEOUT, raw_exchange(&conn, &huge, false))
        .await
        .expect("answered before the body")
        .expect("reply to oversized frame");
    let response: Response = proto::decode(&reply, FRAME_BYTES_MAX).expect("decode reply");
    match response {
        Err(ApiError::Invalid(msg)) => assert!(msg.contains("exceeds the limit"), "{msg}"),
        other => panic!("expected Invalid, got {other:?}"),
    }

    // A panicking handler answers with an internal error.
    let panic_frame = framed(&proto::encode(&envelope(ClientRequest::Resume { node: "x".into() })));
    let reply = raw_exchange(&conn, &panic_frame, true).await.expect("reply to panic");
    let response: Response = proto::decode(&reply, FRAME_BYTES_MAX).expect("decode reply");
    assert!(matches!(response, Err(ApiError::Internal(_))), "{response:?}");

    // The same connection and the server still answer good requests.
    let good = framed(&proto::encode(&envelope(ClientRequest::Cancel { job: 9 })));
    let reply = raw_exchange(&conn, &good, true).await.expect("reply to good frame");
    assert_eq!(proto::decode::<Response>(&reply, FRAME_BYTES_MAX), Ok(Ok(Reply::Submitted { job: 9 })));
    assert!(conn.close_reason().is_none());
    let client = cluster.client("alice");
    assert_eq!(cancel(&client, &server.addr.to_string(), 3).await.expect("call"), Ok(Reply::Submitted { job: 3 }));
}

#[tokio::test]
async fn read_frame_refuses_a_long_length_before_reading() {
    let cluster = Cluster::new();
    // A bare endpoint, no serve loop: this test reads the stream itself.
    let server = endpoint(LOOPBACK.parse().expect("addr"), &cluster.server_id, true).expect("endpoint");
    let server_addr = server.local_addr().expect("addr");
    let accept = tokio::spawn(async move {
        let conn = server.accept().await.expect("incoming").await.expect("handshake");
        let (_send, mut recv) = conn.accept_bi().await.expect("stream");
        let first = read_frame(&mut recv, 1024).await;
        (first, conn, server)
    });
    let conn = raw_connection(&cluster, server_addr).await;
    let (mut send, _recv) = conn.open_bi().await.expect("open");
    // Only the prefix is ever sent: a reader that waited for the body would never return.
    send.write_all(&1_000_000u32.to_be_bytes()).await.expect("write prefix");
    let (first, _conn, _server) = tokio::time::timeout(CALL_TIMEOUT, accept).await.expect("in time").expect("join");
    assert_eq!(first, Err(FrameError::TooLarge { len: 1_000_000, max: 1024 }));
}

#[tokio::test]
async fn frames_round_trip_and_closed_streams_are_told_apart() {
    let cluster = Cluster::new();
    let server = endpoint(LOOPBACK.parse().expect("addr"), &cluster.server_id, true).expect("endpoint");
    let server_addr = server.local_addr().expect("addr");
    let accept = tokio::spawn(async move {
        let conn = server.accept().await.expect("incoming").await.expect("handshake");
        let mut frames = Vec::new();
        for _ in 0..2 {
            let (_send, mut recv) = conn.accept_bi().await.expect("stream");
            let first = read_frame(&mut recv, 1024).await;
            let second = read_frame(&mut recv, 1024).await;
            frames.push((first, second));
        }
        (frames, conn, server)
    });
    let conn = raw_connection(&cluster, server_addr).await;
    let (mut send, _recv) = conn.open_bi().await.expect("open");
    write_frame(&mut send, b"hello").await.expect("write");
    send.finish().expect("finish");
    let (mut send, _recv2) = conn.open_bi().await.expect("open");
    write_frame(&mut send, b"").await.expect("write empty");
    send.write_all(&[0, 0]).await.expect("half a prefix");
    send.finish().expect("finish");
    let (frames, _conn, _server) = tokio::time::timeout(CALL_TIMEOUT, accept).await.expect("in time").expect("join");
    assert_eq!(frames[0], (Ok(b"hello".to_vec()), Err(FrameError::Closed)));
    assert_eq!(frames[1].0, Ok(Vec::new()));
    assert!(matches!(frames[1].1, Err(FrameError::Io(_))), "{:?}", frames[1].1);
}

#[tokio::test]
async fn call_times_out_and_dead_connections_are_replaced() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    let client = cluster.client("alice");

    let slow = client.call(&addr, &envelope(ClientRequest::ClusterInfo), Duration::from_millis(200)).await;
    assert_eq!(slow, Err(CallError::Timeout));
    assert_eq!(cancel(&client, &addr, 1).await.expect("call after timeout"), Ok(Reply::Submitted { job: 1 }));

    // A cached connection that died is replaced by a new one.
    let first = client.lock().get(&addr).map(|c| c.conn.clone()).expect("cached");
    first.close(VarInt::from_u32(0), b"test");
    assert_eq!(cancel(&client, &addr, 2).await.expect("call after close"), Ok(Reply::Submitted { job: 2 }));
    let second = client.lock().get(&addr).map(|c| c.conn.clone()).expect("cached again");
    assert_ne!(first.stable_id(), second.stable_id());

    // forget drops it.
    client.forget(&addr);
    assert!(client.lock().is_empty());
    assert_eq!(cancel(&client, &addr, 3).await.expect("call after forget"), Ok(Reply::Submitted { job: 3 }));

    // The server restarts on the same port: the old connection is closed, the next call dials anew.
    let port_addr = server.addr;
    server.endpoint.close(VarInt::from_u32(0), b"restart");
    let cached = client.lock().get(&addr).map(|c| c.conn.clone()).expect("cached");
    tokio::time::timeout(CALL_TIMEOUT, cached.closed()).await.expect("client sees the close");
    tokio::time::timeout(CALL_TIMEOUT, server.task).await.expect("serve ends").expect("join");
    server.endpoint.wait_idle().await;
    drop(server.endpoint);
    let restarted = rebind(&cluster, port_addr).await;
    assert_eq!(cancel(&client, &addr, 4).await.expect("call after restart"), Ok(Reply::Submitted { job: 4 }));
    assert_eq!(restarted.handler.calls.load(Ordering::SeqCst), 1);

    // Nobody listening: the call fails within its timeout.
    restarted.endpoint.close(VarInt::from_u32(0), b"stop");
    let err = client.call(&addr, &envelope(ClientRequest::Cancel { job: 5 }), Duration::from_millis(500)).await;
    assert!(err.is_err(), "{err:?}");
}

/// Binds a new server on `addr`, waiting for the old socket to be released.
async fn rebind(cluster: &Cluster, addr: SocketAddr) -> Server {
    let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
    loop {
        match endpoint(addr, &cluster.server_id, true) {
            Ok(ep) => {
                let handler = Arc::new(TestHandler { calls: AtomicUsize::new(0) });
                let task = tokio::spawn(serve(ep.clone(), handler.clone()));
                return Server { endpoint: ep, addr, handler, task };
            }
            Err(e) if tokio::time::Instant::now() < deadline => {
                debug!(error = %format!("{e:#}"), "port still held, retrying");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("rebind {addr}: {e:#}"),
        }
    }
}

#[tokio::test]
async fn a_peer_of_another_protocol_version_is_refused_with_a_clear_message() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    // A build that speaks only a future version.
    let future = PROTOCOL_VERSION + 1;
    let ep = endpoint_speaking(LOOPBACK.parse().expect("addr"), &cluster.user("next"), false, &[future]).expect("endpoint");
    let err = Client::new(ep).call(&addr, &envelope(ClientRequest::Cancel { job: 1 }), CALL_TIMEOUT).await.expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("incompatible protocol versions"), "{text}");
    assert!(text.contains(&format!("corral/{PROTOCOL_VERSION}")), "{text}");
    // A build that speaks the next version and still ours negotiates ours.
    let ep = endpoint_speaking(LOOPBACK.parse().expect("addr"), &cluster.user("both"), false, &[future, PROTOCOL_VERSION]).expect("ep");
    let reply = Client::new(ep).call(&addr, &envelope(ClientRequest::Cancel { job: 2 }), CALL_TIMEOUT).await.expect("call");
    assert_eq!(reply, Ok(Reply::Submitted { job: 2 }));
    // The server kept serving this build all along.
    assert_eq!(cancel(&cluster.client("alice"), &addr, 3).await.expect("call"), Ok(Reply::Submitted { job: 3 }));
}

#[tokio::test]
async fn a_machine_without_a_certificate_reaches_only_a_server_of_the_pinned_ca() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    let fingerprint = cluster.server_id.ca_fingerprint();
    // The right CA: the server answers, and names the caller anonymous.
    let named = call_pinned(&addr, &fingerprint, &envelope(ClientRequest::ListNodes), CALL_TIMEOUT).await.expect("call");
    assert_eq!(named, Ok(Reply::Joined { id: 0, name: ANONYMOUS_PEER.into() }));
    // Another CA's fingerprint: the handshake fails before anything is sent.
    let calls = server.handler.calls.load(Ordering::SeqCst);
    let other = generate_ca("other").expect("other CA");
    let wrong = ca_fingerprint(&other.cert_pem).expect("fingerprint");
    let err = call_pinned(&addr, &wrong, &envelope(ClientRequest::ListNodes), CALL_TIMEOUT).await.expect_err("refused");
    assert!(err.to_string().contains("handshake"), "{err}");
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), calls, "the request never reached the server");
}

#[tokio::test]
async fn a_connection_idle_past_the_limit_is_closed_and_the_next_call_dials_anew() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    let client = Client::with_idle_close(
        endpoint(LOOPBACK.parse().expect("addr"), &cluster.user("alice"), false).expect("client endpoint"),
        Duration::from_millis(100),
    );
    assert_eq!(cancel(&client, &addr, 1).await.expect("first call"), Ok(Reply::Submitted { job: 1 }));
    let first = client.lock().get(&addr).map(|c| c.conn.clone()).expect("cached");
    // Past the idle limit and the sweep interval, the next call closes it and dials a new one.
    tokio::time::sleep(CONNECTION_SWEEP_INTERVAL + Duration::from_millis(200)).await;
    assert_eq!(cancel(&client, &addr, 2).await.expect("call after idling"), Ok(Reply::Submitted { job: 2 }));
    assert!(first.close_reason().is_some(), "the idle connection was not closed");
    let second = client.lock().get(&addr).map(|c| c.conn.clone()).expect("cached again");
    assert_ne!(first.stable_id(), second.stable_id());
    // A connection with a call on it is kept, however long the call: a call made past the
    // idle limit while another waits reuses the same connection.
    let waiting = {
        let (client, addr) = (client.clone(), addr.clone());
        tokio::spawn(async move { client.call(&addr, &envelope(ClientRequest::ClusterInfo), Duration::from_secs(5)).await })
    };
    tokio::time::sleep(CONNECTION_SWEEP_INTERVAL + Duration::from_millis(200)).await;
    assert_eq!(cancel(&client, &addr, 3).await.expect("call while another waits"), Ok(Reply::Submitted { job: 3 }));
    assert!(second.close_reason().is_none(), "a connection with a call on it was closed");
    let third = client.lock().get(&addr).map(|c| c.conn.clone()).expect("cached");
    assert_eq!(second.stable_id(), third.stable_id());
    waiting.abort();
}

/// `Cancel` for jobs 0..`jobs` to `addr`, all at once, each giving a new connection's
/// handshake `connect`.
fn cancels_at_once(client: &Client, addr: &str, jobs: u64, connect: Duration) -> Vec<tokio::task::JoinHandle<Result<Response, CallError>>> {
    (0..jobs)
        .map(|job| {
            let (client, addr) = (client.clone(), addr.to_string());
            tokio::spawn(async move {
                client.call_connecting_within(&addr, &envelope(ClientRequest::Cancel { job }), CALL_TIMEOUT, connect).await
            })
        })
        .collect()
}

#[tokio::test]
async fn concurrent_first_calls_to_a_peer_share_one_handshake() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    let client = cluster.client("alice");
    let calls = cancels_at_once(&client, &addr, 16, Duration::from_millis(CONNECT_TIMEOUT_MS));
    for (job, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.expect("join").expect("call"), Ok(Reply::Submitted { job: job as u64 }));
    }
    assert_eq!(server.endpoint.open_connections(), 1, "one connection for sixteen concurrent calls");
    assert_eq!(client.endpoint().open_connections(), 1);
    assert!(client.lock_dialing().is_empty(), "no dial entry outlives its calls");
}

#[tokio::test]
async fn concurrent_calls_to_a_silent_peer_pay_one_handshake_timeout() {
    // A bound socket that never answers: every handshake to it times out.
    let silent = std::net::UdpSocket::bind(LOOPBACK).expect("bind");
    let addr = silent.local_addr().expect("addr").to_string();
    let client = Cluster::new().client("alice");
    let connect = Duration::from_millis(300);
    let started = std::time::Instant::now();
    for call in cancels_at_once(&client, &addr, 8, connect) {
        let err = call.await.expect("join").expect_err("a silent peer");
        assert!(matches!(err, CallError::Connect(_)), "{err}");
    }
    // Serialized, eight dials would take eight timeouts.
    assert!(started.elapsed() < connect * 3, "took {:?}", started.elapsed());
    assert!(client.lock_dialing().is_empty(), "no dial entry outlives its calls");
}

#[tokio::test]
async fn a_call_to_a_peer_that_died_silently_fails_within_the_unacked_silence() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    let client = cluster.client("alice");
    assert_eq!(cancel(&client, &addr, 1).await.expect("first call"), Ok(Reply::Submitted { job: 1 }));

    // A live peer that is slow to answer acknowledges the request: the call runs to its own
    // timeout, past the silence bound, and keeps its connection.
    let silence = Duration::from_millis(UNACKED_SILENCE_MS);
    let connect = Duration::from_millis(CONNECT_TIMEOUT_MS);
    let slow = client.call_failing_on_silence(&addr, &envelope(ClientRequest::ClusterInfo), silence * 3, connect).await;
    assert_eq!(slow, Err(CallError::Timeout));
    assert!(client.lock().contains_key(&addr), "a slow peer keeps its connection");

    // The peer dies without a word (its socket gone, as when SIGKILLed): the cached
    // connection's next call gives up once the request went unacknowledged.
    let spare = std::net::UdpSocket::bind(LOOPBACK).expect("bind a spare socket");
    server.endpoint.rebind(spare).expect("move the server off its port");
    let started = std::time::Instant::now();
    let dead = client.call_failing_on_silence(&addr, &envelope(ClientRequest::Cancel { job: 2 }), CALL_TIMEOUT, connect).await;
    assert_eq!(dead, Err(CallError::Silent(UNACKED_SILENCE_MS)));
    assert!(started.elapsed() < silence * 2, "took {:?} with a {CALL_TIMEOUT:?} call timeout", started.elapsed());
    assert!(!client.lock().contains_key(&addr), "the dead peer's connection is dropped");
}

#[tokio::test]
async fn a_datagram_call_round_trips_and_goes_by_stream_when_it_does_not_fit() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    let client = cluster.client("alice");
    let resend = Duration::from_secs(5);
    let call = |e: Envelope| {
        let (client, addr) = (client.clone(), addr.clone());
        async move { client.call_datagram(&addr, &e, CALL_TIMEOUT, resend).await.expect("datagram call") }
    };

    assert_eq!(call(envelope(ClientRequest::Cancel { job: 7 })).await, Ok(Reply::Submitted { job: 7 }));
    assert_eq!(call(envelope(ClientRequest::ListNodes)).await, Ok(Reply::Joined { id: 0, name: "user:alice".into() }));
    let conn = client.lock().get(&addr).map(|c| c.conn.clone()).expect("cached");
    let streams_before = conn.stats().frame_tx.stream;
    // Many at once, each answered with its own reply on the one connection, and no stream.
    let calls: Vec<_> = (0..64u64).map(|job| tokio::spawn(call(envelope(ClientRequest::Cancel { job })))).collect();
    for (job, c) in calls.into_iter().enumerate() {
        assert_eq!(c.await.expect("join"), Ok(Reply::Submitted { job: job as u64 }));
    }
    assert_eq!(conn.stats().frame_tx.stream, streams_before, "datagram calls opened streams");
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 2 + 64);

    // Only what the handler takes as a datagram.
    let refused = call(envelope(ClientRequest::ListJobs { include_finished: true })).await;
    assert_eq!(refused, Err(ApiError::Invalid("this request is not taken as a datagram".into())));
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 2 + 64);

    // A request too large for a datagram goes by stream.
    let big =
        Envelope { hops: 0, request: ClientRequest::Cancel { job: 9 }.into(), user: Some("u".repeat(2 * datagram::DATAGRAM_BYTES_MAX)) };
    assert_eq!(call(big).await, Ok(Reply::Submitted { job: 9 }));
    assert!(conn.stats().frame_tx.stream > streams_before);
    // A reply too large for one is asked for again by stream: the handler runs twice.
    let calls_before = server.handler.calls.load(Ordering::SeqCst);
    let long = call(envelope(ClientRequest::Cancel { job: LONG_REFUSAL_JOB + 3_000 })).await;
    assert_eq!(long, Err(ApiError::Denied("d".repeat(3_000))));
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), calls_before + 2);
    // A short refusal comes back as it is.
    let short = call(envelope(ClientRequest::Cancel { job: LONG_REFUSAL_JOB + 10 })).await;
    assert_eq!(short, Err(ApiError::Denied("d".repeat(10))));
}

#[tokio::test]
async fn an_unanswered_datagram_call_is_resent_then_times_out_and_a_live_peer_keeps_its_connection() {
    let cluster = Cluster::new();
    let server = start_server(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = server.addr.to_string();
    let client = cluster.client("alice");
    assert_eq!(
        client.call_datagram(&addr, &envelope(ClientRequest::Cancel { job: 1 }), CALL_TIMEOUT, CALL_TIMEOUT).await.expect("call"),
        Ok(Reply::Submitted { job: 1 })
    );
    let conn = client.lock().get(&addr).map(|c| c.conn.clone()).expect("cached");

    // ClusterInfo is never answered: sent every 100 ms until the 450 ms are up.
    let started = std::time::Instant::now();
    let sent_before = conn.stats().frame_tx.datagram;
    let slow =
        client.call_datagram(&addr, &envelope(ClientRequest::ClusterInfo), Duration::from_millis(450), Duration::from_millis(100)).await;
    assert_eq!(slow, Err(CallError::Timeout));
    assert!(started.elapsed() < Duration::from_millis(1_000), "{:?}", started.elapsed());
    // The first send and four resends went out.
    assert_eq!(conn.stats().frame_tx.datagram - sent_before, 5);
    // The peer acknowledged the datagrams: alive, so its connection stays for the next call.
    assert_eq!(client.lock().get(&addr).map(|c| c.conn.stable_id()), Some(conn.stable_id()));
    assert_eq!(
        client.call_datagram(&addr, &envelope(ClientRequest::Cancel { job: 2 }), CALL_TIMEOUT, CALL_TIMEOUT).await.expect("call"),
        Ok(Reply::Submitted { job: 2 })
    );
    // The server reads a connection's datagrams in turn, so it read every resend before job 2:
    // its handler took the unanswered call once (a resend of a call in the handler is dropped;
    // taken anew, a loaded server's resends multiplied its work as it slowed).
    assert_eq!(server.handler.calls.load(Ordering::SeqCst), 3, "job 1, the unanswered call once, job 2");

    // A server that went away: the call fails within its time.
    server.endpoint.close(VarInt::from_u32(0), b"stop");
    let gone = client
        .call_datagram(&addr, &envelope(ClientRequest::Cancel { job: 3 }), Duration::from_millis(500), Duration::from_millis(100))
        .await;
    assert!(gone.is_err(), "{gone:?}");
    // Blocked addresses are refused at once, as for a call.
    client.set_blocked(vec!["*".into()]);
    let blocked = client.call_datagram(&addr, &envelope(ClientRequest::Cancel { job: 4 }), CALL_TIMEOUT, CALL_TIMEOUT).await;
    assert!(matches!(blocked, Err(CallError::Connect(_))), "{blocked:?}");
}

/// A server of this identity on its own runtime, which `crash` stops without a word to its
/// peers (no CONNECTION_CLOSE), as a SIGKILL does, freeing its port.
struct CrashableServer {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
}

impl CrashableServer {
    fn start(id: &TlsIdentity, bind: SocketAddr) -> CrashableServer {
        let id = id.clone();
        // Built and entered on a thread of its own: a test's runtime cannot block on another.
        let (runtime, addr) = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
            let addr = runtime.block_on(async {
                let server = start_server(&id, bind);
                let addr = server.addr;
                // Held by a task that never ends: dropped with the runtime's tasks, whose
                // driver is not polled again to send anything.
                tokio::spawn(async move {
                    let _held = server;
                    std::future::pending::<()>().await
                });
                addr
            });
            (runtime, addr)
        })
        .join()
        .expect("start the server");
        CrashableServer { runtime: Some(runtime), addr }
    }

    fn crash(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[tokio::test]
async fn a_peer_restarted_on_its_address_resets_the_old_connections_and_the_next_call_dials() {
    let cluster = Cluster::new();
    let mut first = CrashableServer::start(&cluster.server_id, LOOPBACK.parse().expect("addr"));
    let addr = first.addr;
    let client = cluster.client("alice");
    let call = |job| {
        let client = client.clone();
        let addr = addr.to_string();
        async move {
            client
                .call_datagram(&addr, &envelope(ClientRequest::Cancel { job }), Duration::from_millis(500), Duration::from_millis(100))
                .await
        }
    };
    assert_eq!(call(1).await.expect("call"), Ok(Reply::Submitted { job: 1 }));
    first.crash();
    // The same identity on the same address, as a restarted member: the old connection's next
    // packets are answered with a stateless reset the client accepts (same reset key), so it
    // dials anew at once instead of waiting out the idle timeout (IDLE_TIMEOUT_MS).
    let mut second = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while second.is_none() && std::time::Instant::now() < deadline {
        match std::net::UdpSocket::bind(addr) {
            Ok(probe) => {
                drop(probe);
                second = Some(start_server(&cluster.server_id, addr));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let _second = second.expect("the crashed server's port came free");
    let restarted = std::time::Instant::now();
    let mut answered = None;
    for job in 2..10 {
        if let Ok(Ok(reply)) = call(job).await {
            answered = Some(reply);
            break;
        }
    }
    let took = restarted.elapsed();
    assert!(answered.is_some(), "no call got through the restarted server");
    assert!(took < Duration::from_millis(IDLE_TIMEOUT_MS / 2), "the old connection lingered {took:?}, as if never reset");
}

/// A server with `handshakes_max` handshakes under way at most refuses the next connection at
/// once (no wait for the connect timeout), counts it, and takes connections again once its
/// handshakes completed; the refused client leaves it alone for a moment before dialing again.
#[tokio::test]
async fn a_server_busy_with_handshakes_refuses_at_once_and_counts_it() {
    let cluster = Cluster::new();
    let serve_with = |handshakes_max: usize| {
        let endpoint = endpoint(LOOPBACK.parse().expect("addr"), &cluster.server_id, true).expect("server endpoint");
        let addr = endpoint.local_addr().expect("local addr").to_string();
        let handler = Arc::new(TestHandler { calls: AtomicUsize::new(0) });
        (endpoint.clone(), addr, tokio::spawn(crate::serve_limited(endpoint, handler, handshakes_max)))
    };
    // None allowed: every dial is refused in far less than the connect timeout.
    let (full, addr, task) = serve_with(0);
    let before = crate::counters().refused_busy;
    let client = cluster.client("c1");
    let started = std::time::Instant::now();
    let refused = client.call_failing_on_silence(&addr, &envelope(ClientRequest::Cancel { job: 1 }), CALL_TIMEOUT, CALL_TIMEOUT).await;
    assert!(matches!(refused, Err(CallError::Connect(_))), "{refused:?}");
    assert!(started.elapsed() < CALL_TIMEOUT / 2, "refused in {:?}, not timed out", started.elapsed());
    assert!(crate::counters().refused_busy > before);
    // Refused, the client leaves the peer alone for 200-600 ms: calls fail without a dial.
    let again = client.call_failing_on_silence(&addr, &envelope(ClientRequest::Cancel { job: 2 }), CALL_TIMEOUT, CALL_TIMEOUT).await;
    assert!(matches!(&again, Err(CallError::Connect(why)) if why.contains("not dialed again")), "{again:?}");
    tokio::time::sleep(Duration::from_millis(650)).await;
    let later = client.call_failing_on_silence(&addr, &envelope(ClientRequest::Cancel { job: 3 }), CALL_TIMEOUT, CALL_TIMEOUT).await;
    assert!(matches!(&later, Err(CallError::Connect(why)) if !why.contains("not dialed again")), "dialed again: {later:?}");
    full.close(0u32.into(), b"done");
    task.abort();
    // One at a time: each handshake gives its place back, so dials one after another all connect.
    let (one, addr, task) = serve_with(1);
    for n in 0..5 {
        let client = cluster.client(&format!("c{n}"));
        assert_eq!(cancel(&client, &addr, n).await.expect("call"), Ok(Reply::Submitted { job: n }), "dial {n}");
    }
    one.close(0u32.into(), b"done");
    task.abort();
}
