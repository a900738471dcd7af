//! Heartbeats at the size of a fleet: which member each node heartbeats (`relay_order`), the
//! heartbeat loop that renews the node's `control::agent::Lease` and fences when it says so,
//! and the relay a follower runs to pass the heartbeats it receives to
//! the leader in one `Heartbeats` request per batch (`Relay`).
//!
//! Every node heartbeats a follower voter chosen by its id (the leader only when it has no
//! followers), so the leader handles a few batches per interval instead of one request per
//! node. A relay answers a node only after the leader answered the batch that carried its beat,
//! and a node counts its lease from when it *sent* the heartbeat, which is before the leader
//! received it by any path: the fencing argument in ARCHITECTURE.md holds for any number of
//! hops. The simulated nodes of `corral bench --nodes` use this same code.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use control::agent::{Lease, Tick};
use proto::{ApiError, Beat, ClientRequest, NodeId, NodeRole, PeerRequest, Reply, Response, HEARTBEATS_PER_REQUEST_MAX};
use tokio::sync::{oneshot, Notify};
use tracing::{info, warn};

use crate::link::{LeaderLink, LinkError};

/// Heartbeats a relay holds at most while a batch is in flight; past it, a node is told the
/// relay is unavailable and tries its next member.
pub const RELAY_PENDING_MAX: usize = 4 * HEARTBEATS_PER_REQUEST_MAX;

pub use control::leader::NEVER_VOTER_FEATURE;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The members node `me` heartbeats, in the order to try them: the follower voters starting at
/// `me` modulo their number (so nodes spread evenly over them), then the leader. `members` are
/// the voters as `(id, role, addr)`; agents in it are ignored. Pure and deterministic.
pub fn relay_order(me: NodeId, members: &[(NodeId, NodeRole, String)]) -> Vec<String> {
    let mut followers: Vec<&(NodeId, NodeRole, String)> = members.iter().filter(|m| m.1 == NodeRole::Voter).collect();
    followers.sort_by_key(|m| m.0);
    let mut order = Vec::with_capacity(followers.len() + 1);
    if !followers.is_empty() {
        let start = (me % followers.len() as u64) as usize;
        for i in 0..followers.len() {
            order.push(followers[(start + i) % followers.len()].2.clone());
        }
    }
    order.extend(members.iter().filter(|m| m.1 == NodeRole::Leader).map(|m| m.2.clone()));
    order
}

/// What the heartbeat loop needs of the node it keeps counted alive: the agent, or a simulated
/// node of `corral bench --nodes` (which runs this same loop).
pub trait Heartbeating: Send + Sync + 'static {
    /// The node's `Heartbeat` request as of now.
    fn heartbeat(&self) -> PeerRequest;
    /// Whether anything runs here that fencing would have to stop.
    fn holds_work(&self) -> bool;
    /// Stops every job (the cluster may soon start them elsewhere); how many.
    fn fence(&self) -> usize;
    /// The node's lease (`control::agent::Lease`, on the boot clock): this loop fences and
    /// renews it; it starts as a predecessor handed it over, or unacknowledged.
    fn lease(&self) -> &Mutex<Lease>;
    /// A leader acknowledged a heartbeat (the lease is renewed already).
    fn acknowledged(&self, ack: &Reply);
    /// End of a tick, delivered or not (the agent rewrites the watchdog's lease file).
    fn tick_done(&self) {}
    /// Whether the loop should end (a simulated node silenced on purpose).
    fn silenced(&self) -> bool {
        false
    }
    /// Whether beats go as QUIC datagrams (`transport::datagram`); else each is a stream call,
    /// as before datagrams (the bench's peer).
    fn beats_as_datagrams(&self) -> bool {
        true
    }
}

/// Heartbeats through `link` every `interval`, fencing once no heartbeat sent in the last
/// `fence_after_ms` was acknowledged (the node's `control::agent::Lease` decides; the timing
/// argument is in ARCHITECTURE.md). One beat gets
/// `budget` over all the members it tries: a beat that cannot get through is dropped for the
/// next tick's fresh one (walking every member with a full timeout each, a node stayed stuck on
/// one beat for 2.5 s after a leader died). When the leader no longer knows this node (or a new
/// instance of it), `rejoin` registers it again.
pub async fn heartbeat_loop<H: Heartbeating>(
    node: Arc<H>,
    link: Arc<LeaderLink>,
    interval: Duration,
    budget: Duration,
    rejoin: PeerRequest,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut missed = 0u32;
    // A predecessor's last acknowledgement, inherited with its runs.
    let mut inherited = lock(node.lease()).ack_sent_ms();
    loop {
        ticker.tick().await;
        if node.silenced() {
            return;
        }
        let tick = lock(node.lease()).tick(crate::run::procfs::boot_ms(), node.holds_work());
        if let Tick::FenceThenBeat { first, silent_ms } = tick {
            // The leader may declare this node down and start its jobs elsewhere: stop them first.
            let n = node.fence();
            if first {
                warn!(jobs = n, ?silent_ms, "no leader reachable, fencing: stopping every job");
            }
        }
        // The lease counts from the send: the leader hears the beat after this, by any path.
        let sent_ms = crate::run::procfs::boot_ms();
        let call = async {
            if node.beats_as_datagrams() && missed < PATIENT_BEATS {
                // A beat got through lately: a member that answers but finds no leader (an
                // election) is waited on, not walked past (`Carrier::DatagramPatient`).
                link.call_datagram_patient(node.heartbeat(), 0).await
            } else if node.beats_as_datagrams() {
                link.call_datagram(node.heartbeat(), 0).await
            } else {
                link.call(node.heartbeat(), 0).await
            }
        };
        let beat = match tokio::time::timeout(budget, call).await {
            Ok(beat) => beat,
            Err(_) => Err(LinkError::Unreachable(format!("no member acknowledged within {} ms", budget.as_millis()))),
        };
        match beat {
            Ok(reply) => {
                if missed > 0 {
                    info!(missed, "heartbeat delivered again");
                }
                missed = 0;
                if let Some(t) = inherited.take() {
                    // The first since this daemon took its predecessor's runs over: how long the
                    // node was silent, against the lease it had.
                    let silent_ms = crate::run::procfs::boot_ms().saturating_sub(t);
                    info!(silent_ms, "first heartbeat acknowledged since the take-over");
                }
                lock(node.lease()).acknowledged(sent_ms);
                node.acknowledged(&reply);
            }
            Err(LinkError::Api(ApiError::NotFound(_))) => {
                warn!("leader does not know this node, joining again");
                if let Err(e) = link.call(rejoin.clone(), 0).await {
                    warn!(error = %e, "join again");
                }
            }
            Err(e) => {
                // Start from the relays again: a preferred member that died (the old leader)
                // would otherwise take every later beat's whole budget. One that answered (it
                // found no leader) stays first: it is alive, and likely to pass the next beat on.
                if !matches!(e, LinkError::Api(_)) {
                    link.set_preferred(None);
                }
                missed += 1;
                if missed == 1 || missed.is_multiple_of(10) {
                    warn!(missed, error = %e, "heartbeat not delivered");
                }
            }
        }
        node.tick_done();
    }
}

/// Beats a node sends patiently after its last acknowledged one (`LeaderLink::call_datagram_patient`):
/// an election takes a heartbeat interval or two, and a node that walks on from a relay
/// waiting for the new leader dials another member. The beat after them walks on: a relay cut
/// off from the leader costs its nodes that many intervals more before they reach another member.
pub const PATIENT_BEATS: u32 = 2;

/// How often a node checks whether to ask for the members (`MembersSchedule::due`): soon after a new
/// term, so its relays are the new leader's followers within half a second of an election.
pub const MEMBERS_CHECK_INTERVAL: Duration = Duration::from_millis(500);

/// How often a node asks for the members when nothing changed; a heartbeat acknowledgement of
/// a new term (a new leader, maybe new voters) makes it ask at its next tick.
pub const MEMBERS_REFRESH_MAX: Duration = Duration::from_secs(30);

/// Why a node asks for the members now (`MembersSchedule::due`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MembersCheck {
    /// Never asked yet (a node that just joined).
    First,
    /// A heartbeat acknowledgement named a new term: a new leader, maybe new voters.
    NewTerm,
    /// The refresh came due (`MEMBERS_REFRESH_MAX`, or sooner after a new term).
    Refresh,
}

/// After a new term, how long a node keeps the member it beats (`LeaderLink::set_first`'s
/// `keep_current`) before it moves to its new relay order's head: between these two, by node
/// id, so a new leader's former nodes move over this span, not all at once.
pub const SETTLE_AFTER_NEW_TERM_MIN: Duration = Duration::from_secs(5);
pub const SETTLE_AFTER_NEW_TERM_SPAN: Duration = Duration::from_secs(20);

/// When a node asks for the members (the voters, their roles, their addresses) and whether it
/// then moves to the head of its relay order. Pure but for the clock it is given.
///
/// A new term moves nobody: a node whose relay was just elected leader goes on beating it
/// directly, and moves to its new relay order's head at a refresh `SETTLE_AFTER_NEW_TERM_MIN`
/// to `+ SETTLE_AFTER_NEW_TERM_SPAN` later, by node id. Moved at once, the half of the fleet
/// that beat the new leader's host dialed the one surviving follower (or the dead voter, a
/// failed dial each) within the new leader's first grace period: at 3,500 simulated nodes up
/// to 6,000 handshakes a failover, the relays saturated, and hundreds of live nodes declared down.
#[derive(Clone, Copy, Debug, Default)]
pub struct MembersSchedule {
    /// The term last learned and when the next refresh is due.
    learned: Option<(u64, Instant)>,
}

impl MembersSchedule {
    /// Whether to ask now, given the term of the last acknowledged heartbeat.
    pub fn due(&self, acked_term: u64, now: Instant) -> Option<MembersCheck> {
        match self.learned {
            None => Some(MembersCheck::First),
            Some((term, _)) if term != acked_term => Some(MembersCheck::NewTerm),
            Some((_, next)) if now >= next => Some(MembersCheck::Refresh),
            Some(_) => None,
        }
    }

    /// The members were learned for `check` at `now`: when the next refresh is due.
    pub fn learned(&mut self, me: NodeId, check: MembersCheck, term: u64, now: Instant) {
        let wait = match check {
            MembersCheck::NewTerm => {
                let span_ms = SETTLE_AFTER_NEW_TERM_SPAN.as_millis() as u64;
                SETTLE_AFTER_NEW_TERM_MIN + Duration::from_millis(me.wrapping_mul(7_919) % span_ms.max(1))
            }
            MembersCheck::First | MembersCheck::Refresh => MEMBERS_REFRESH_MAX,
        };
        self.learned = Some((term, now + wait));
    }
}

/// Asks a member (a relay answers; any voter does) for the members, as a datagram call like a
/// heartbeat: after a new term every node of the fleet asks within half a second, and a stream
/// call that a saturated relay left silent dropped its connection, so each such node dialed
/// again (2,213 dropped connections in one failover at 3,500 simulated nodes). A member of an
/// older build that takes no `Members` by datagram, or knows no `Members`, is asked by stream,
/// then for the whole `ClusterInfo`.
pub async fn ask_members(link: &LeaderLink) -> Result<Reply, LinkError> {
    match link.call_datagram(ClientRequest::Members, 0).await {
        Err(LinkError::Api(ApiError::Invalid(_))) => match link.call(ClientRequest::Members, 0).await {
            Err(LinkError::Api(ApiError::Invalid(_))) => link.call(ClientRequest::ClusterInfo, 0).await,
            other => other,
        },
        other => other,
    }
}

/// Whether a members check keeps the member a node beats now (see [`MembersSchedule`]).
pub fn keeps_current(check: MembersCheck) -> bool {
    check == MembersCheck::NewTerm
}

/// Calls waiting on one node's beat in a relay: the same beat again (a resend on another
/// connection, the next tick's beat while this one waits) joins it, up to this many.
pub const WAITERS_PER_BEAT_MAX: usize = 8;

/// The calls that wait on one beat.
type Waiters = Vec<oneshot::Sender<Response>>;

type Waiter = (Beat, Waiters);

/// Collects the heartbeats a non-leader receives and answers each once the leader answered the
/// batch that carried it. One batch is in flight at a time; what arrives meanwhile forms the
/// next one (so an idle relay adds no wait and a busy one sends few, large batches). A node's
/// beat waiting for the next batch is in it once, however often the node sent it meanwhile:
/// an answer to it answers every one of those calls, each sent before the leader received the
/// batch (the lease argument holds). A slow relay that passed on every copy fell further
/// behind with each, as nodes went on sending.
#[derive(Default)]
pub struct Relay {
    /// By (node, instance), so a batch goes in node order and a copy finds its beat.
    pending: Mutex<std::collections::BTreeMap<(NodeId, proto::InstanceId), Waiters>>,
    wake: Notify,
}

impl Relay {
    /// Queues `beat` for the next batch (or joins it there) and waits for the leader's answer.
    pub async fn relay(&self, beat: Beat) -> Response {
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            let len = pending.len();
            match pending.entry((beat.node, beat.instance)) {
                std::collections::btree_map::Entry::Occupied(mut waiting) => {
                    if waiting.get().len() >= WAITERS_PER_BEAT_MAX {
                        return Err(ApiError::Unavailable(format!("{WAITERS_PER_BEAT_MAX} calls already wait on this node's heartbeat")));
                    }
                    waiting.get_mut().push(tx);
                }
                std::collections::btree_map::Entry::Vacant(slot) => {
                    if len >= RELAY_PENDING_MAX {
                        return Err(ApiError::Unavailable(format!("heartbeat relay full ({RELAY_PENDING_MAX} waiting)")));
                    }
                    slot.insert(vec![tx]);
                }
            }
        }
        self.wake.notify_one();
        rx.await.unwrap_or_else(|_| Err(ApiError::Unavailable("heartbeat relay stopped".into())))
    }

    fn take(&self) -> Vec<Waiter> {
        let mut pending = lock(&self.pending);
        let n = pending.len().min(HEARTBEATS_PER_REQUEST_MAX);
        (0..n).filter_map(|_| pending.pop_first()).map(|((node, instance), waiters)| (Beat { node, instance }, waiters)).collect()
    }

    /// Sends batches with `send` for ever (one at a time) and answers their waiters. A batch
    /// waits `linger` after its first beat for others to join it: without it, beats spread over
    /// an interval each went alone and the leader's cost hardly fell.
    pub async fn run<F, Fut>(&self, send: F, linger: Duration)
    where
        F: Fn(Vec<Beat>) -> Fut,
        Fut: std::future::Future<Output = Response>,
    {
        loop {
            self.wake.notified().await;
            tokio::time::sleep(linger).await;
            loop {
                let batch = self.take();
                if batch.is_empty() {
                    break;
                }
                let beats: Vec<Beat> = batch.iter().map(|(b, _)| *b).collect();
                let reply = send(beats).await;
                answer(batch, reply);
            }
        }
    }
}

/// Gives each waiter of a batch its own answer from the leader's reply to the batch.
fn answer(batch: Vec<Waiter>, reply: Response) {
    match reply {
        Ok(Reply::HeartbeatAcks { leader, term, commit_index, refused }) => {
            for (beat, waiters) in batch {
                let own = match refused.iter().find(|(n, _)| *n == beat.node) {
                    Some((_, e)) => Err(e.clone()),
                    None => Ok(Reply::HeartbeatAck { leader, term, commit_index }),
                };
                for tx in waiters {
                    let _ = tx.send(own.clone()); // a waiter that gave up needs no answer
                }
            }
        }
        other => {
            // The batch as a whole failed: each node tries its next member.
            let why = match other {
                Ok(r) => format!("unexpected reply to a heartbeat batch: {r:?}"),
                Err(e) => format!("relay could not reach the leader: {e}"),
            };
            for tx in batch.into_iter().flat_map(|(_, waiters)| waiters) {
                let _ = tx.send(Err(ApiError::Unavailable(why.clone())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members() -> Vec<(NodeId, NodeRole, String)> {
        vec![
            (3, NodeRole::Voter, "c".into()),
            (1, NodeRole::Leader, "a".into()),
            (2, NodeRole::Voter, "b".into()),
            (9, NodeRole::Agent, "z".into()),
        ]
    }

    #[test]
    fn nodes_spread_over_the_followers_and_fall_back_to_the_leader() {
        assert_eq!(relay_order(4, &members()), vec!["b", "c", "a"]);
        assert_eq!(relay_order(5, &members()), vec!["c", "b", "a"]);
        let counts = (1..=1000u64).fold([0usize; 2], |mut c, n| {
            c[usize::from(relay_order(n, &members())[0] == "c")] += 1;
            c
        });
        assert_eq!(counts, [500, 500]);
    }

    #[test]
    fn a_cluster_without_followers_heartbeats_its_leader() {
        assert_eq!(relay_order(7, &[(1, NodeRole::Leader, "a".into())]), vec!["a"]);
        assert!(relay_order(7, &[]).is_empty());
    }

    #[tokio::test]
    async fn a_relay_batches_waiting_beats_and_answers_each_with_its_own_verdict() {
        let relay = Arc::new(Relay::default());
        let batches = Arc::new(Mutex::new(Vec::<Vec<NodeId>>::new()));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let runner = {
            let (relay, batches, gate) = (Arc::clone(&relay), Arc::clone(&batches), Arc::clone(&gate));
            tokio::spawn(async move {
                relay
                    .run(
                        |beats| {
                            let (batches, gate) = (Arc::clone(&batches), Arc::clone(&gate));
                            async move {
                                batches.lock().unwrap().push(beats.iter().map(|b| b.node).collect());
                                gate.acquire().await.unwrap().forget();
                                Ok(Reply::HeartbeatAcks {
                                    leader: 1,
                                    term: 2,
                                    commit_index: 3,
                                    refused: vec![(12, ApiError::NotFound("node 12".into()))],
                                })
                            }
                        },
                        Duration::ZERO,
                    )
                    .await
            })
        };
        let first = tokio::spawn({
            let relay = Arc::clone(&relay);
            async move { relay.relay(Beat { node: 10, instance: 1 }).await }
        });
        while batches.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        // While the first batch is in flight, two more beats queue and go as one batch.
        let later: Vec<_> = [11, 12]
            .into_iter()
            .map(|node| {
                let relay = Arc::clone(&relay);
                tokio::spawn(async move { relay.relay(Beat { node, instance: 1 }).await })
            })
            .collect();
        while lock(&relay.pending).len() < 2 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(2);
        assert_eq!(first.await.unwrap(), Ok(Reply::HeartbeatAck { leader: 1, term: 2, commit_index: 3 }));
        let mut answers = Vec::new();
        for h in later {
            answers.push(h.await.unwrap());
        }
        assert_eq!(answers[0], Ok(Reply::HeartbeatAck { leader: 1, term: 2, commit_index: 3 }));
        assert_eq!(answers[1], Err(ApiError::NotFound("node 12".into())));
        assert_eq!(*batches.lock().unwrap(), vec![vec![10], vec![11, 12]]);
        runner.abort();
    }

    #[tokio::test]
    async fn copies_of_a_waiting_beat_go_once_and_each_call_gets_the_answer() {
        let relay = Arc::new(Relay::default());
        let batches = Arc::new(Mutex::new(Vec::<Vec<NodeId>>::new()));
        let calls: Vec<_> = [(7, 1), (7, 1), (7, 1), (8, 1), (7, 2)]
            .into_iter()
            .map(|(node, instance)| {
                let relay = Arc::clone(&relay);
                tokio::spawn(async move { relay.relay(Beat { node, instance }).await })
            })
            .collect();
        // Every call waits before the relay runs: node 7's three copies are one beat.
        while lock(&relay.pending).values().map(Vec::len).sum::<usize>() < 5 {
            tokio::task::yield_now().await;
        }
        assert_eq!(lock(&relay.pending).len(), 3, "(7, 1), (8, 1) and node 7's new instance");
        let runner = {
            let (relay, batches) = (Arc::clone(&relay), Arc::clone(&batches));
            tokio::spawn(async move {
                relay
                    .run(
                        |beats| {
                            let batches = Arc::clone(&batches);
                            async move {
                                batches.lock().unwrap().push(beats.iter().map(|b| b.node).collect());
                                Ok(Reply::HeartbeatAcks { leader: 1, term: 2, commit_index: 3, refused: Vec::new() })
                            }
                        },
                        Duration::ZERO,
                    )
                    .await
            })
        };
        relay.wake.notify_one();
        for call in calls {
            assert_eq!(call.await.unwrap(), Ok(Reply::HeartbeatAck { leader: 1, term: 2, commit_index: 3 }));
        }
        assert_eq!(*batches.lock().unwrap(), vec![vec![7, 7, 8]]);
        // Past WAITERS_PER_BEAT_MAX copies of one waiting beat, the next is refused.
        for _ in 0..WAITERS_PER_BEAT_MAX {
            let (tx, _rx) = oneshot::channel();
            lock(&relay.pending).entry((9, 1)).or_default().push(tx);
        }
        let over = relay.relay(Beat { node: 9, instance: 1 }).await;
        assert!(matches!(over, Err(ApiError::Unavailable(_))), "{over:?}");
        runner.abort();
    }

    #[test]
    fn members_are_asked_again_on_a_new_term_or_after_a_while() {
        let t0 = Instant::now();
        let mut schedule = MembersSchedule::default();
        assert_eq!(schedule.due(1, t0), Some(MembersCheck::First));
        schedule.learned(7, MembersCheck::First, 3, t0);
        assert_eq!(schedule.due(3, t0 + Duration::from_secs(29)), None);
        assert_eq!(schedule.due(4, t0 + Duration::from_secs(1)), Some(MembersCheck::NewTerm));
        assert_eq!(schedule.due(3, t0 + MEMBERS_REFRESH_MAX), Some(MembersCheck::Refresh));
        // After a new term the refresh that moves a node comes sooner, spread by node id.
        let settles: Vec<Duration> = (0..1_000u64)
            .map(|me| {
                let mut s = MembersSchedule::default();
                s.learned(me, MembersCheck::NewTerm, 4, t0);
                let Some((_, next)) = s.learned else { panic!("learned") };
                assert_eq!(s.due(4, next - Duration::from_millis(1)), None);
                assert_eq!(s.due(4, next), Some(MembersCheck::Refresh));
                next - t0
            })
            .collect();
        let (min, max) = (settles.iter().min().copied(), settles.iter().max().copied());
        assert!(min >= Some(SETTLE_AFTER_NEW_TERM_MIN) && max < Some(SETTLE_AFTER_NEW_TERM_MIN + SETTLE_AFTER_NEW_TERM_SPAN));
        let in_first_second = settles.iter().filter(|d| **d < SETTLE_AFTER_NEW_TERM_MIN + Duration::from_secs(1)).count();
        assert!(in_first_second < 100, "{in_first_second} of 1,000 nodes move in the same second");
        assert!(keeps_current(MembersCheck::NewTerm) && !keeps_current(MembersCheck::Refresh) && !keeps_current(MembersCheck::First));
    }

    #[test]
    fn a_failed_batch_sends_every_node_to_its_next_member() {
        let (tx, rx) = oneshot::channel();
        answer(vec![(Beat { node: 1, instance: 1 }, vec![tx])], Err(ApiError::NoLeader));
        assert!(matches!(rx.blocking_recv().unwrap(), Err(ApiError::Unavailable(_))));
    }
}
