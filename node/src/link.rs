//! Reaching the leader from any node: try the last address that worked, then every known
//! member, following `NotLeader` redirects. Bounded: at most `candidates + 2` calls per try.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::{ApiError, Envelope, Reply, Request};
use tracing::debug;
use transport::Client;

pub struct LeaderLink {
    client: Arc<Client>,
    /// Addresses of members to ask, in order (join addresses first, then learned members).
    candidates: Mutex<Vec<String>>,
    preferred: Mutex<Option<String>>,
    /// Tried before the candidates (after the preferred one): a heartbeat's relays.
    first: Mutex<Vec<String>>,
    /// Members that could not be reached lately, and until when they go last.
    suspects: Mutex<Vec<(String, std::time::Instant)>>,
    call_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("no member answered: {0}")]
    Unreachable(String),
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl LeaderLink {
    pub fn new(client: Arc<Client>, candidates: Vec<String>, call_timeout: Duration) -> LeaderLink {
        LeaderLink {
            client,
            candidates: Mutex::new(candidates),
            preferred: Mutex::new(None),
            first: Mutex::new(Vec::new()),
            suspects: Mutex::new(Vec::new()),
            call_timeout,
        }
    }

    /// The members to try first, in order (`liveness::relay_order`). A preferred member other
    /// than the order's head is forgotten, so nodes move to their new relay when the voters
    /// change, and come back to it from wherever a failure sent them (at each members check:
    /// a node whose first beat went to the leader while its order was being set stayed on the
    /// leader for good, and at 1,000 nodes the leader answered most beats itself).
    /// With `keep_current`, a preferred member still in the order stays preferred (after a new
    /// term: `liveness::MembersSchedule`).
    pub fn set_first(&self, order: Vec<String>, keep_current: bool) {
        let head = order.first().cloned();
        let mut preferred = lock(&self.preferred);
        let kept = keep_current && preferred.as_ref().is_some_and(|p| order.contains(p));
        if preferred.is_some() && *preferred != head && !kept {
            *preferred = None;
        }
        *lock(&self.first) = order;
    }

    /// Adds member addresses learned from the cluster (deduplicated, bounded).
    pub fn learn(&self, addrs: impl IntoIterator<Item = String>) {
        let mut c = lock(&self.candidates);
        for a in addrs {
            if !c.contains(&a) && c.len() < 64 {
                c.push(a);
            }
        }
    }

    pub fn set_preferred(&self, addr: Option<String>) {
        *lock(&self.preferred) = addr;
    }

    /// Sends `request` towards the leader. `hops` is the number of forwards so far.
    pub async fn call(&self, request: impl Into<Request>, hops: u8) -> Result<Reply, LinkError> {
        self.call_as(request.into(), hops, None).await
    }

    /// [`LeaderLink::call`] on behalf of `user` (a client's request this node forwards).
    pub async fn call_as(&self, request: Request, hops: u8, user: Option<String>) -> Result<Reply, LinkError> {
        self.call_with(request, hops, user, Carrier::Stream).await
    }

    /// [`LeaderLink::call_as`] for a client's request: a member that leaves the request
    /// unacknowledged (killed a moment ago) is given up after
    /// [`transport::UNACKED_SILENCE_MS`] and the next one asked, instead of waiting for the
    /// call timeout. Heartbeats never use it ([`LeaderLink::call_datagram`]): a saturated relay
    /// must not lose every node's connection at once.
    pub async fn forward_as(&self, request: Request, hops: u8, user: Option<String>) -> Result<Reply, LinkError> {
        self.call_with(request, hops, user, Carrier::StreamFailingOnSilence).await
    }

    /// [`LeaderLink::call`] as a datagram to each member (`transport::datagram`), sent again
    /// every quarter of the call timeout while unanswered: for a heartbeat, small and
    /// idempotent, sent by every node of a fleet every interval.
    pub async fn call_datagram(&self, request: impl Into<Request>, hops: u8) -> Result<Reply, LinkError> {
        self.call_with(request.into(), hops, None, Carrier::Datagram).await
    }

    /// [`LeaderLink::call_datagram`] that ends at the first member that answers with "no
    /// leader" or "unavailable" (see [`Carrier::DatagramPatient`]).
    pub async fn call_datagram_patient(&self, request: impl Into<Request>, hops: u8) -> Result<Reply, LinkError> {
        self.call_with(request.into(), hops, None, Carrier::DatagramPatient).await
    }

    async fn call_with(&self, request: Request, hops: u8, user: Option<String>, carrier: Carrier) -> Result<Reply, LinkError> {
        let mut order: Vec<String> = Vec::new();
        if let Some(p) = lock(&self.preferred).clone() {
            order.push(p);
        }
        for a in lock(&self.first).iter().chain(lock(&self.candidates).iter()) {
            if !order.contains(a) {
                order.push(a.clone());
            }
        }
        // A member that could not be reached goes last for a while (a dead voter is still a
        // voter, and may be a node's first relay until the voters change).
        {
            let now = std::time::Instant::now();
            let mut suspects = lock(&self.suspects);
            suspects.retain(|(_, until)| *until > now);
            order.sort_by_key(|a| suspects.iter().any(|(s, _)| s == a));
        }
        let envelope = Envelope { hops, request, user };
        let mut last_error = String::from("no member address known");
        let mut redirects = 0;
        let mut i = 0;
        while i < order.len() {
            let addr = order[i].clone();
            i += 1;
            let connect = Duration::from_millis(transport::CONNECT_TIMEOUT_MS);
            let call = match carrier {
                Carrier::Stream => self.client.call(&addr, &envelope, self.call_timeout).await,
                Carrier::StreamFailingOnSilence => self.client.call_failing_on_silence(&addr, &envelope, self.call_timeout, connect).await,
                Carrier::Datagram | Carrier::DatagramPatient => {
                    self.client.call_datagram(&addr, &envelope, self.call_timeout, self.call_timeout / 4).await
                }
            };
            match call {
                Ok(Ok(reply)) => {
                    self.set_preferred(Some(addr));
                    return Ok(reply);
                }
                Ok(Err(ApiError::NotLeader { leader_addr: Some(leader), .. })) if redirects < 2 => {
                    redirects += 1;
                    order.insert(i, leader);
                }
                Ok(Err(e @ (ApiError::NotLeader { .. } | ApiError::NoLeader | ApiError::Unavailable(_)))) => {
                    if carrier == Carrier::DatagramPatient {
                        return Err(LinkError::Api(e));
                    }
                    debug!(member = %addr, error = %e, "member cannot take the call, trying the next");
                    last_error = format!("{addr}: {e}");
                }
                Ok(Err(e)) => return Err(LinkError::Api(e)),
                Err(e) => {
                    // The connection stays unless the transport found it dead (it decides for
                    // every caller): a slow member still answers on it, and a new handshake
                    // costs a loaded member far more than the call did. Dropping it on every
                    // timeout turned slow relays into a storm of handshakes at 5,000 nodes.
                    if lock(&self.preferred).as_deref() == Some(addr.as_str()) {
                        self.set_preferred(None);
                    }
                    let mut suspects = lock(&self.suspects);
                    if suspects.len() < 64 && !suspects.iter().any(|(s, _)| *s == addr) {
                        suspects.push((addr.clone(), std::time::Instant::now() + SUSPECT_FOR));
                    }
                    debug!(member = %addr, error = %e, "member not reached, trying the next");
                    last_error = format!("{addr}: {e}");
                }
            }
        }
        Err(LinkError::Unreachable(last_error))
    }
}

/// How a call travels to each member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carrier {
    Stream,
    /// A client's request: given up on a member that leaves it unacknowledged.
    StreamFailingOnSilence,
    /// A heartbeat (`transport::datagram`).
    Datagram,
    /// A heartbeat after one that was acknowledged: a member that answers it but cannot pass
    /// it on (its relay found no leader, as during an election, when every member would say
    /// the same) ends the beat there, and the next beat tries it again. Walking on cost a new
    /// connection to each next member: at every leader kill with 5,000 simulated nodes, the
    /// nodes of a relay whose batch waited out the election scattered over the other members,
    /// thousands of handshakes on a cluster that had just lost a voter.
    DatagramPatient,
}

/// How long a member that could not be reached goes last in the order.
const SUSPECT_FOR: Duration = Duration::from_secs(10);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;

    use proto::{ClientRequest, Envelope, Response};
    use transport::{Handler, Peer, TlsIdentity};

    use super::*;

    /// Answers `Cancel` at once and never answers anything else (a member too loaded to reply).
    struct SlowMember;

    impl Handler for SlowMember {
        fn handle(&self, _peer: Peer, envelope: Envelope) -> Pin<Box<dyn Future<Output = Response> + Send + 'static>> {
            Box::pin(async move {
                match envelope.request {
                    Request::Client(ClientRequest::Cancel { job }) => Ok(Reply::Submitted { job }),
                    _ => std::future::pending().await,
                }
            })
        }
    }

    #[test]
    fn the_relay_order_takes_a_node_back_to_its_first_relay() {
        let client = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
            let ca = transport::generate_ca("test").expect("ca");
            let node = transport::issue_node_cert(&ca, "n9", &["127.0.0.1".into()]).expect("node cert");
            let id = TlsIdentity::from_pems(&ca.cert_pem, &node.cert_pem, &node.key_pem).expect("identity");
            Arc::new(Client::new(transport::endpoint("127.0.0.1:0".parse().expect("addr"), &id, false).expect("endpoint")))
        });
        let link = LeaderLink::new(client, vec!["leader".into()], Duration::from_millis(300));
        let order = vec!["relay-a".to_string(), "relay-b".to_string(), "leader".to_string()];
        // A beat in flight while the order is set lands on the leader afterwards.
        link.set_first(order.clone(), false);
        link.set_preferred(Some("leader".into()));
        // The next members check (the same order) sends it back to its relay.
        link.set_first(order.clone(), false);
        assert_eq!(*lock(&link.preferred), None);
        // A node already on its first relay stays there.
        link.set_preferred(Some("relay-a".into()));
        link.set_first(order, false);
        assert_eq!(lock(&link.preferred).as_deref(), Some("relay-a"));
        // A new order whose head is another relay moves it.
        link.set_first(vec!["relay-b".into(), "leader".into()], false);
        assert_eq!(*lock(&link.preferred), None);
        // After a new term a node stays on the member it beats while that is still a member
        // (its relay, just elected leader), and leaves one that is not.
        link.set_preferred(Some("relay-a".into()));
        link.set_first(vec!["relay-b".into(), "relay-a".into()], true);
        assert_eq!(lock(&link.preferred).as_deref(), Some("relay-a"));
        link.set_first(vec!["relay-b".into(), "leader".into()], true);
        assert_eq!(*lock(&link.preferred), None);
    }

    #[tokio::test]
    async fn a_member_that_answers_late_keeps_its_connection() {
        let ca = transport::generate_ca("test").expect("ca");
        let node = transport::issue_node_cert(&ca, "m1", &["127.0.0.1".into()]).expect("node cert");
        let server_id = TlsIdentity::from_pems(&ca.cert_pem, &node.cert_pem, &node.key_pem).expect("server identity");
        let server = transport::endpoint("127.0.0.1:0".parse().expect("addr"), &server_id, true).expect("server endpoint");
        let addr = server.local_addr().expect("addr").to_string();
        tokio::spawn(transport::serve(server.clone(), Arc::new(SlowMember)));
        let user = transport::issue_client_cert(&ca, "alice").expect("client cert");
        let client_id = TlsIdentity::from_pems(&ca.cert_pem, &user.cert_pem, &user.key_pem).expect("client identity");
        let client = Arc::new(Client::new(transport::endpoint("127.0.0.1:0".parse().expect("addr"), &client_id, false).expect("endpoint")));
        let link = LeaderLink::new(Arc::clone(&client), vec![addr], Duration::from_millis(300));

        assert!(matches!(link.call(ClientRequest::Cancel { job: 1 }, 0).await, Ok(Reply::Submitted { job: 1 })));
        // From now on the member accepts no new connection: only the first one can carry calls.
        server.set_server_config(None);
        let err = link.call(ClientRequest::ClusterInfo, 0).await.expect_err("a member that does not answer");
        assert!(err.to_string().contains("timed out"), "{err}");
        // The same connection carries the next call: no second handshake for a slow member.
        let next = link.call(ClientRequest::Cancel { job: 2 }, 0).await;
        assert!(matches!(next, Ok(Reply::Submitted { job: 2 })), "{next:?}");
    }
}
