//! Talking to a cluster: which nodes to ask and with which certificate, and one call that
//! tries each node until one answers.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use proto::{ApiError, ClientRequest, Envelope, Reply, Request};
use serde::{Deserialize, Serialize};
use transport::pki::TlsPaths;
use transport::Client;

/// `client.toml`: written by `corral dev up` (and by an operator for a real cluster).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientConfig {
    pub servers: Vec<String>,
    pub tls: TlsPaths,
    /// Where the nodes serve Prometheus metrics (`http://ADDR/metrics`), for scrapers and
    /// people; `corral dev up` fills it in. The CLI itself does not read it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<String>,
}

impl ClientConfig {
    pub fn load(path: &Path) -> anyhow::Result<ClientConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read client config at {}", path.display()))?;
        let mut c: ClientConfig = toml::from_str(&text).with_context(|| format!("parse client config at {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        for p in [&mut c.tls.ca_cert, &mut c.tls.cert, &mut c.tls.key] {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
        Ok(c)
    }
}

pub struct Cluster {
    /// The user requests are made for ([`Cluster::local_for`]).
    act_for: Option<String>,
    /// The node's local socket, when the CLI talks to its own node (peer credentials say who).
    local: Option<PathBuf>,
    client: Option<Client>,
    /// The cluster CA's fingerprint, when a client certificate names it.
    ca_fingerprint: Option<String>,
    servers: Vec<String>,
    /// Index of the server that answered last; tried first.
    preferred: std::sync::atomic::AtomicUsize,
    /// Servers whose handshake failed, tried last until one answers again.
    suspects: std::sync::Mutex<std::collections::BTreeSet<usize>>,
    pub call_timeout: Duration,
}

impl Cluster {
    /// `--cluster DIR` (its `client.toml`), optionally with `--server` naming the node to ask.
    pub fn connect(cluster_dir: &Path, server: Option<&str>) -> anyhow::Result<Cluster> {
        Cluster::connect_to(cluster_dir, server.map(|s| vec![s.to_string()]))
    }

    /// Like [`Cluster::connect`], asking `servers` in this order (none: those of `client.toml`).
    pub fn connect_to(cluster_dir: &Path, servers: Option<Vec<String>>) -> anyhow::Result<Cluster> {
        let config = ClientConfig::load(&cluster_dir.join("client.toml"))?;
        let identity = config.tls.load().context("load client certificate")?;
        let endpoint =
            transport::endpoint("0.0.0.0:0".parse().context("parse bind address")?, &identity, false).context("open client endpoint")?;
        let servers = servers.unwrap_or(config.servers);
        if servers.is_empty() {
            bail!("no server address in {}", cluster_dir.display());
        }
        Ok(Cluster {
            act_for: None,
            local: None,
            client: Some(Client::new(endpoint)),
            ca_fingerprint: Some(identity.ca_fingerprint()),
            servers,
            preferred: Default::default(),
            suspects: Default::default(),
            call_timeout: Duration::from_secs(10),
        })
    }

    /// The local node over its Unix socket: no certificate, the kernel tells the node who we are.
    pub fn local(socket: &Path) -> Cluster {
        Cluster {
            act_for: None,
            local: Some(socket.to_path_buf()),
            client: None,
            ca_fingerprint: None,
            servers: vec![socket.display().to_string()],
            preferred: Default::default(),
            suspects: Default::default(),
            call_timeout: Duration::from_secs(10),
        }
    }

    /// The local node over its Unix socket, acting for `user`: a node takes the user that root
    /// on it names, as it takes a forwarding node's (`corral restd`, run as root on a node, acts
    /// for the user its HTTPS client's certificate names); anyone else is who the kernel says.
    pub fn local_for(socket: &Path, user: &str) -> Cluster {
        Cluster { act_for: Some(user.to_string()), ..Cluster::local(socket) }
    }

    /// How the CLI reaches the cluster: `--socket`/`$CORRAL_SOCKET` (the local node); else
    /// `--cluster DIR`/`$CORRAL_CLUSTER` (a client certificate); else, on a node, its socket at
    /// [`DEFAULT_SOCKET`]; else `/etc/corral/client.toml`.
    pub fn open(cluster: Option<&PathBuf>, server: Option<&str>, socket: Option<&PathBuf>) -> anyhow::Result<Cluster> {
        if let Some(path) = socket.cloned().or_else(|| std::env::var_os("CORRAL_SOCKET").map(PathBuf::from)) {
            return Ok(Cluster::local(&path));
        }
        let explicit = cluster.is_some() || std::env::var_os("CORRAL_CLUSTER").is_some();
        let dir = cluster_dir(cluster);
        if !explicit && server.is_none() && !dir.join("client.toml").exists() && Path::new(DEFAULT_SOCKET).exists() {
            return Ok(Cluster::local(Path::new(DEFAULT_SOCKET)));
        }
        Cluster::connect(&dir, server)
    }

    /// The fingerprint of the cluster CA this client trusts (for join tokens).
    pub fn ca_fingerprint(&self) -> anyhow::Result<String> {
        match &self.ca_fingerprint {
            Some(fp) => Ok(fp.clone()),
            None => {
                let ca = std::fs::read_to_string("/etc/corral/ca.crt").context("read /etc/corral/ca.crt (or use --cluster DIR)")?;
                transport::pki::ca_fingerprint(&ca)
            }
        }
    }

    /// Sends `request` to the first node that answers. Errors the cluster returned come back as
    /// `ApiError`; only when no node answers at all is the error a transport one.
    pub async fn call(&self, request: ClientRequest) -> anyhow::Result<Result<Reply, ApiError>> {
        let envelope = Envelope { hops: 0, request: Request::Client(with_submit_key(request)), user: self.act_for.clone() };
        let client = match (&self.local, &self.client) {
            (Some(path), _) => {
                return transport::local::call_local(path, &envelope, self.call_timeout)
                    .await
                    .with_context(|| format!("ask the local node at {}", path.display()));
            }
            (None, Some(client)) => client,
            (None, None) => bail!("no way to reach the cluster"),
        };
        let mut errors = Vec::new();
        let first = self.preferred.load(std::sync::atomic::Ordering::Relaxed);
        let n = self.servers.len();
        // A first pass gives each node's handshake a short while; the nodes whose handshake did
        // not finish get the full timeout after.
        let full = Duration::from_millis(transport::CONNECT_TIMEOUT_MS);
        let brief = if n > 1 { Duration::from_millis(FIRST_PASS_CONNECT_MS) } else { full };
        // Nodes whose handshake failed before go last: a retry does not wait on a dead one.
        let suspects = lock_suspects(&self.suspects).clone();
        let order: Vec<usize> = (0..n).map(|k| (first + k) % n).filter(|i| !suspects.contains(i)).chain(suspects.iter().copied()).collect();
        let (reply, mut slow, answered) = self.first_pass(client, &order, &suspects, &envelope, brief, &mut errors).await;
        if let Some(resp) = reply {
            return Ok(resp);
        }
        // A node that answered (no leader yet, say) shows the cluster is reachable: the caller
        // retries soon, and a node slow to shake hands gets the full timeout only otherwise.
        if answered || brief >= full {
            slow.clear();
        }
        for i in slow {
            if let Attempt::Answered(resp) = self.try_server(client, i, &envelope, full, &mut errors).await {
                return Ok(resp);
            }
        }
        bail!("no node answered: {}", errors.join("; "))
    }

    /// The first pass over the nodes in `order`: their handshakes are raced, the next one
    /// started every [`HANDSHAKE_STAGGER_MS`] while none has finished (so a dead node first in
    /// the list costs that, not a handshake timeout), each given `brief`; the request goes to
    /// one node at a time, in the order their handshakes finished, so it is never sent to two
    /// at once. Once a node has answered with a refusal worth retrying (no leader yet), the
    /// `suspects` (nodes whose handshake failed before) are left out: the caller retries soon,
    /// and a retry while an election runs should not wait on a dead node each time. Returns the
    /// answer if one came, the nodes whose handshake did not finish, and whether some node
    /// answered with such a refusal.
    async fn first_pass(
        &self,
        client: &Client,
        order: &[usize],
        suspects: &std::collections::BTreeSet<usize>,
        envelope: &Envelope,
        brief: Duration,
        errors: &mut Vec<String>,
    ) -> (Option<Result<Reply, ApiError>>, Vec<usize>, bool) {
        let (mut slow, mut answered) = (Vec::new(), false);
        let mut racing: tokio::task::JoinSet<(usize, Result<(), transport::CallError>)> = tokio::task::JoinSet::new();
        // Suspects come last in `order`; dialing, the nodes whose handshakes are under way.
        let (mut queue, mut dialing) = (order.iter().copied().peekable(), std::collections::BTreeSet::new());
        let dial = |racing: &mut tokio::task::JoinSet<_>, dialing: &mut std::collections::BTreeSet<usize>, i: usize| {
            let (client, addr) = (client.clone(), self.servers[i].clone());
            dialing.insert(i);
            racing.spawn(async move { (i, client.connect_within(&addr, brief).await) });
        };
        loop {
            if answered && queue.peek().is_none_or(|i| suspects.contains(i)) && dialing.is_subset(suspects) {
                break;
            }
            if racing.is_empty() {
                match queue.next() {
                    Some(i) => dial(&mut racing, &mut dialing, i),
                    None => break,
                }
            }
            let stagger = tokio::time::sleep(Duration::from_millis(HANDSHAKE_STAGGER_MS));
            tokio::select! {
                joined = racing.join_next() => {
                    // A dial task cannot panic or be aborted while the set is alive; either
                    // would only mean this node did not shake hands.
                    let Some(Ok((i, dialed))) = joined else { continue };
                    dialing.remove(&i);
                    let attempt = match dialed {
                        Ok(()) => self.try_server(client, i, envelope, brief, errors).await,
                        Err(e) => self.note_call_error(i, e, errors),
                    };
                    match attempt {
                        Attempt::Answered(resp) => return (Some(resp), slow, answered),
                        Attempt::NoHandshake => slow.push(i),
                        Attempt::Failed => answered = true,
                    }
                }
                _ = stagger => {
                    if let Some(i) = queue.next() {
                        dial(&mut racing, &mut dialing, i);
                    }
                }
            }
        }
        (None, slow, answered)
    }

    async fn try_server(&self, client: &Client, i: usize, envelope: &Envelope, connect: Duration, errors: &mut Vec<String>) -> Attempt {
        let addr = &self.servers[i];
        match client.call_failing_on_silence(addr, envelope, self.call_timeout, connect).await {
            Ok(Err(e @ (ApiError::NoLeader | ApiError::Unavailable(_)))) if self.servers.len() > 1 => {
                errors.push(format!("{addr}: {e}"));
                Attempt::Failed
            }
            Ok(resp) => {
                self.preferred.store(i, std::sync::atomic::Ordering::Relaxed);
                lock_suspects(&self.suspects).remove(&i);
                Attempt::Answered(resp)
            }
            Err(e) => self.note_call_error(i, e, errors),
        }
    }

    /// A call to node `i` that got no answer: a failed handshake, or a request the node never
    /// acknowledged (it died), puts the node last for later calls.
    fn note_call_error(&self, i: usize, e: transport::CallError, errors: &mut Vec<String>) -> Attempt {
        errors.push(format!("{}: {e}", self.servers[i]));
        match e {
            transport::CallError::Connect(_) => {
                lock_suspects(&self.suspects).insert(i);
                Attempt::NoHandshake
            }
            transport::CallError::Silent(_) => {
                lock_suspects(&self.suspects).insert(i);
                Attempt::Failed
            }
            _ => Attempt::Failed,
        }
    }

    /// Like [`Cluster::call`], retrying while there is no leader (an election is under way) for
    /// up to `patience`.
    pub async fn call_patiently(&self, request: ClientRequest, patience: Duration) -> anyhow::Result<Reply> {
        // One key for every try: a submission whose reply was lost is not made twice.
        let request = with_submit_key(request);
        let started = std::time::Instant::now();
        loop {
            let result = self.call(request.clone()).await;
            match result {
                Ok(Ok(reply)) => return Ok(reply),
                Ok(Err(e @ (ApiError::NoLeader | ApiError::Unavailable(_) | ApiError::NotLeader { .. })))
                    if started.elapsed() < patience =>
                {
                    tracing::debug!(error = %e, "retrying");
                }
                Ok(Err(e)) => return Err(e.into()),
                Err(e) if started.elapsed() < patience => tracing::debug!(error = %e, "retrying"),
                Err(e) => return Err(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A submission without a key gets one (`JobSpec::submit_key`), drawn once for it: the
/// cluster answers a resend of the same request with the job the first one made.
pub fn with_submit_key(mut request: ClientRequest) -> ClientRequest {
    if let ClientRequest::Submit { spec } = &mut request {
        spec.submit_key.get_or_insert_with(rand::random);
    }
    request
}

fn lock_suspects(m: &std::sync::Mutex<std::collections::BTreeSet<usize>>) -> std::sync::MutexGuard<'_, std::collections::BTreeSet<usize>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What asking one node gave.
enum Attempt {
    Answered(Result<Reply, ApiError>),
    /// No handshake within the time given: maybe dead, maybe slow.
    NoHandshake,
    Failed,
}

/// How long the first pass over the nodes waits for each handshake (healthy nodes answer in
/// well under a millisecond on a LAN; a slow one gets the full timeout in the second pass).
const FIRST_PASS_CONNECT_MS: u64 = 250;

/// While no handshake of the first pass has finished, another node's starts this often (as
/// Happy Eyeballs races addresses): a dead node first in the list delays a call by this much.
const HANDSHAKE_STAGGER_MS: u64 = 50;

/// Jobs one listing gathers at most, page by page (a bound on the client's memory).
pub const QUERY_JOBS_MAX: usize = 10_000_000;

impl Cluster {
    /// Every job matching `query`, page by page (`ClientRequest::QueryJobs`): the node filters, the
    /// client never downloads the whole history.
    /// `CORRAL_QUERY_PAGE` sets the page size (at most the node's cap; tests use small pages).
    pub async fn query_jobs(&self, mut query: proto::JobQuery, patience: Duration) -> anyhow::Result<Vec<proto::Job>> {
        if let Some(page) = std::env::var("CORRAL_QUERY_PAGE").ok().and_then(|v| v.parse().ok()) {
            query.limit = page;
        }
        let mut jobs = Vec::new();
        loop {
            let reply = self.call_patiently(ClientRequest::QueryJobs { query: query.clone() }, patience).await?;
            let Reply::JobPage { jobs: page, next } = reply else { bail!("unexpected reply {reply:?} to a job query") };
            jobs.extend(page);
            match next {
                Some(after) if jobs.len() < QUERY_JOBS_MAX => {
                    anyhow::ensure!(after > query.after, "a job query page did not advance past job {}", query.after);
                    query.after = after;
                }
                _ => return Ok(jobs),
            }
        }
    }
}

/// Where a node's local socket is when deployed (node.toml `socket`; systemd's RuntimeDirectory).
pub const DEFAULT_SOCKET: &str = "/run/corral/corral.sock";

/// The directory named by `--cluster`, `$CORRAL_CLUSTER`, or `/etc/corral`.
pub fn cluster_dir(flag: Option<&PathBuf>) -> PathBuf {
    flag.cloned().or_else(|| std::env::var_os("CORRAL_CLUSTER").map(PathBuf::from)).unwrap_or_else(|| PathBuf::from("/etc/corral"))
}

#[cfg(test)]
mod tests {
    //! `Cluster::call` against real QUIC servers on loopback and a silent socket (a dead node).

    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use proto::{ApiError, Envelope, Reply, Request, Response};
    use transport::pki::{generate_ca, issue_client_cert, issue_node_cert, TlsIdentity};

    use super::*;

    /// Counts requests; answers `Cancel` with `Submitted`, or with `NoLeader` if `leaderless`.
    struct Counting {
        calls: AtomicUsize,
        leaderless: bool,
    }

    impl transport::Handler for Counting {
        fn handle(&self, _peer: transport::Peer, envelope: Envelope) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let answer = match (envelope.request, self.leaderless) {
                (_, true) => Err(ApiError::NoLeader),
                (Request::Client(ClientRequest::Cancel { job }), false) => Ok(Reply::Submitted { job }),
                _ => Err(ApiError::Invalid("not in this test".into())),
            };
            Box::pin(async move { answer })
        }
    }

    struct Fixture {
        ca: transport::pki::PemPair,
        node: TlsIdentity,
    }

    impl Fixture {
        fn new() -> Fixture {
            let ca = generate_ca("test").expect("generate CA");
            let pair = issue_node_cert(&ca, "n1", &["127.0.0.1".into()]).expect("issue node cert");
            let node = TlsIdentity::from_pems(&ca.cert_pem, &pair.cert_pem, &pair.key_pem).expect("node identity");
            Fixture { ca, node }
        }

        fn serve(&self, leaderless: bool) -> (String, Arc<Counting>) {
            let endpoint = transport::endpoint("127.0.0.1:0".parse().expect("addr"), &self.node, true).expect("server endpoint");
            let addr = endpoint.local_addr().expect("local addr").to_string();
            let handler = Arc::new(Counting { calls: AtomicUsize::new(0), leaderless });
            tokio::spawn(transport::serve(endpoint, handler.clone()));
            (addr, handler)
        }

        fn cluster(&self, servers: Vec<String>) -> Cluster {
            let pair = issue_client_cert(&self.ca, "alice").expect("issue client cert");
            let id = TlsIdentity::from_pems(&self.ca.cert_pem, &pair.cert_pem, &pair.key_pem).expect("client identity");
            let endpoint = transport::endpoint("127.0.0.1:0".parse().expect("addr"), &id, false).expect("client endpoint");
            Cluster {
                act_for: None,
                local: None,
                client: Some(Client::new(endpoint)),
                ca_fingerprint: None,
                servers,
                preferred: Default::default(),
                suspects: Default::default(),
                call_timeout: Duration::from_secs(10),
            }
        }
    }

    /// A bound UDP socket that never answers: every handshake to it times out.
    fn silent() -> (std::net::UdpSocket, String) {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        socket.set_nonblocking(true).expect("nonblocking");
        let addr = socket.local_addr().expect("addr").to_string();
        (socket, addr)
    }

    /// The dials that reached `socket` since the last look: the destination connection ids of
    /// the QUIC long-header packets (each dial picks a new one; a dial given up may still send
    /// its close under the same id).
    fn dials(socket: &std::net::UdpSocket) -> std::collections::BTreeSet<Vec<u8>> {
        let mut buf = [0u8; 2048];
        let mut found = std::collections::BTreeSet::new();
        while let Ok(n) = socket.recv(&mut buf) {
            let packet = &buf[..n];
            let long_header = packet.first().is_some_and(|b| b & 0x80 != 0);
            let dcid = packet.get(5).and_then(|len| packet.get(6..6 + usize::from(*len)));
            if let (true, Some(dcid)) = (long_header, dcid) {
                found.insert(dcid.to_vec());
            }
        }
        found
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_first_node_is_raced_past_and_the_request_is_sent_once() {
        let fixture = Fixture::new();
        let (dead, dead_addr) = silent();
        let (live_addr, live) = fixture.serve(false);
        let cluster = fixture.cluster(vec![dead_addr, live_addr]);
        let reply = cluster.call(ClientRequest::Cancel { job: 7 }).await.expect("a node answered");
        assert_eq!(reply, Ok(Reply::Submitted { job: 7 }));
        assert_eq!(live.calls.load(Ordering::SeqCst), 1, "the request reached the live node once");
        assert!(!dials(&dead).is_empty(), "the first node in the list was dialed first");
        // The live node answered, so the next call asks it first and the dead node not at all.
        assert_eq!(cluster.call(ClientRequest::Cancel { job: 8 }).await.expect("answered"), Ok(Reply::Submitted { job: 8 }));
        assert_eq!(live.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn while_live_nodes_say_no_leader_a_retry_does_not_dial_a_node_that_failed_its_handshake() {
        let fixture = Fixture::new();
        let (dead, dead_addr) = silent();
        let (a, a_calls) = fixture.serve(true);
        let (b, b_calls) = fixture.serve(true);
        let cluster = fixture.cluster(vec![dead_addr, a, b]);
        let first = cluster.call(ClientRequest::Cancel { job: 1 }).await;
        assert!(first.is_err(), "no node can answer yet: {first:?}");
        let tried = dials(&dead);
        assert_eq!(tried.len(), 1, "the dead node was dialed once on the first call");
        assert!(lock_suspects(&cluster.suspects).contains(&0), "its handshake failed, so it is a suspect");
        // An election is under way: the retries go to the nodes that answered, never again
        // to the suspect, until one of them answers.
        for _ in 0..3 {
            assert!(cluster.call(ClientRequest::Cancel { job: 1 }).await.is_err());
        }
        let again = dials(&dead);
        assert!(again.is_subset(&tried), "a retry dialed the suspect while live nodes answered: {again:?}");
        assert_eq!(a_calls.calls.load(Ordering::SeqCst), 4);
        assert_eq!(b_calls.calls.load(Ordering::SeqCst), 4);
    }
}
