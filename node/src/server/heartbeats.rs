//! Heartbeats on their way to the leader: the leader accepts a batch (`accept_heartbeats`); a
//! follower relays the beats it receives in batches (`relay_loop`) and answers each node once
//! the leader answered.

use super::*;

impl Node {
    /// Fails unless a quorum acknowledged this leader within the minimum election timeout (no
    /// other leader can have been elected since).
    /// Counts every node of `beats` alive as of now (the leader's receipt, after each node
    /// sent its beat) and brings back those it had declared down or knew as another instance:
    /// (leader, term, commit index, the beats refused with why). An acknowledgement tells a
    /// node a leader still counts it alive; a leader cut off from its quorum must not give one,
    /// or its nodes would never fence.
    pub(super) async fn accept_heartbeats(&self, beats: &[proto::Beat]) -> Result<(NodeId, u64, u64, Vec<(NodeId, ApiError)>), ApiError> {
        let known: Vec<Option<(NodeState, InstanceId)>> =
            self.state.read(|s| beats.iter().map(|b| s.nodes.get(&b.node).map(|n| (n.state, n.instance))).collect());
        let mut refused = Vec::new();
        let mut back = Vec::new();
        {
            // Seen on receipt, before leadership is confirmed: a later last-seen only delays a
            // `NodeDown` (the node's lease counts from its send, earlier still), and a leader
            // slow to confirm (its quorum lease lapsed under load) must not take its own delay
            // for the nodes' silence.
            let seen_at = Instant::now();
            let mut mem = lock(&self.memory);
            for (beat, known) in beats.iter().zip(known) {
                match known {
                    None => refused.push((beat.node, ApiError::NotFound(format!("node {}", beat.node)))),
                    Some(recorded) => match mem.beat_from(beat.node, beat.instance, recorded, seen_at) {
                        engine::Beat::Alive => {}
                        engine::Beat::Back => back.push(*beat),
                        engine::Beat::Refused { recorded_heard_ms_ago } => {
                            let why = format!(
                                "instance {} of node {}: its instance {} was heard {recorded_heard_ms_ago} ms ago",
                                beat.instance, beat.node, recorded.1
                            );
                            refused.push((beat.node, ApiError::Denied(why)));
                        }
                    },
                }
            }
        }
        self.confirm_leadership().await?;
        // Nodes coming back are rare but may come in a crowd (a rack powered on): proposed
        // together, the group commit packs them.
        let now = now_ms();
        let ups = back.iter().map(|b| self.propose(Command::NodeUp { node: b.node, instance: b.instance, now_ms: now }));
        let results = futures_util::future::join_all(ups).await;
        for (beat, result) in back.iter().zip(results) {
            match result {
                Ok(CommandResult::Rejected(why)) => {
                    // A replaced instance (its process should be dead) gets no acknowledgement.
                    warn!(node = beat.node, instance = beat.instance, why = %why, "heartbeat of a replaced instance refused");
                    refused.push((beat.node, ApiError::Denied(why)));
                }
                Ok(_) => {
                    info!(node = beat.node, "node is back");
                    self.kick.notify_one();
                }
                Err(e) => refused.push((beat.node, e)),
            }
        }
        let status = self.status();
        Ok((self.id, status.term, status.commit_index.unwrap_or(0), refused))
    }

    /// Passes the heartbeats this node receives while it is not the leader on to the leader,
    /// a batch at a time (`liveness::Relay`).
    pub(super) async fn relay_loop(self: Arc<Self>) {
        let node = Arc::clone(&self);
        self.relay.run(move |beats| Arc::clone(&node).relay_batch(beats), relay_linger(&self.config)).await;
    }

    /// Sends one batch to the leader Raft names here, again to the next one if the leader
    /// changes meanwhile (beats are idempotent), within the nodes' call timeout; a node without
    /// a replica sends it through its members.
    async fn relay_batch(self: Arc<Self>, beats: Vec<proto::Beat>) -> Response {
        // Within the time a node gives one member (half its budget for a beat): a relay that
        // cannot get through answers while the node still waits on it, so it tries its next.
        let timeout = heartbeat_call_timeout(&self.config) * 3 / 8;
        let request = PeerRequest::Heartbeats { relay: self.id, beats: beats.clone() };
        let answer = if self.is_member() {
            tokio::time::timeout(timeout, self.relay_to_leader(&request, &beats)).await
        } else {
            tokio::time::timeout(timeout, async {
                self.forward_link.call(request.clone(), 1).await.map_err(|e| match e {
                    LinkError::Api(e) => e,
                    other => ApiError::Unavailable(format!("pass heartbeats to the leader: {other}")),
                })
            })
            .await
        };
        let answer = match answer {
            // A leader of an older build does not know batches: pass each beat on by itself.
            Ok(Err(ApiError::Invalid(_))) => self.relay_one_by_one(&beats, timeout).await,
            Ok(other) => other,
            Err(_) => Err(ApiError::Unavailable(format!("the leader did not answer a heartbeat batch within {} ms", timeout.as_millis()))),
        };
        if let Err(e) = &answer {
            // Each node tries its next member; said here once per batch, not once per node.
            warn!(beats = beats.len(), error = %e, "heartbeat batch not passed on");
        }
        answer
    }

    async fn relay_to_leader(&self, request: &PeerRequest, beats: &[proto::Beat]) -> Response {
        let envelope = Envelope { hops: 1, request: request.clone().into(), user: None };
        loop {
            if self.is_leader() {
                let (leader, term, commit_index, refused) = self.accept_heartbeats(beats).await?;
                return Ok(Reply::HeartbeatAcks { leader, term, commit_index, refused });
            }
            let (leader, addr) = self.leader();
            let Some(addr) = addr else {
                consensus::leader_other_than(&self.raft, None).await;
                continue;
            };
            let call = self.client.call_connecting_within(&addr, &envelope, PEER_CALL_TIMEOUT, FORWARD_CONNECT_TIMEOUT);
            tokio::select! {
                answer = call => match answer {
                    Ok(response) => return response,
                    Err(e) => {
                        // The leader may be gone: wait for Raft to name another, then resend.
                        debug!(leader = %addr, error = %e, "heartbeat batch not delivered");
                        consensus::leader_other_than(&self.raft, leader).await;
                    }
                },
                () = consensus::leader_other_than(&self.raft, leader) => {}
            }
        }
    }

    async fn relay_one_by_one(&self, beats: &[proto::Beat], timeout: Duration) -> Response {
        let calls = beats.iter().map(|b| {
            let request = PeerRequest::Heartbeat { node: b.node, instance: b.instance, running: Vec::new() };
            tokio::time::timeout(timeout, self.forward_link.call(request, 1))
        });
        let mut acked = None;
        let mut refused = Vec::new();
        for (beat, result) in beats.iter().zip(futures_util::future::join_all(calls).await) {
            match result {
                Ok(Ok(Reply::HeartbeatAck { leader, term, commit_index })) => acked = Some((leader, term, commit_index)),
                Ok(Err(crate::link::LinkError::Api(e))) => refused.push((beat.node, e)),
                other => refused.push((beat.node, ApiError::Unavailable(format!("pass a heartbeat to the leader: {other:?}")))),
            }
        }
        match acked {
            Some((leader, term, commit_index)) => Ok(Reply::HeartbeatAcks { leader, term, commit_index, refused }),
            None => Err(ApiError::Unavailable("the leader acknowledged none of the heartbeats".into())),
        }
    }

    /// Whether this node may still acknowledge a heartbeat it received before this call: no
    /// other leader can have been elected since. Fast: a quorum acknowledged an append this
    /// leader sent within `election_timeout_min_ms` (no voter can have timed out on it yet).
    /// Otherwise (just elected, or a busy follower answered late) a quorum must acknowledge an
    /// append sent after the call (openraft's ReadIndex): any new leader's election came after
    /// that, so after the beat. A leader cut off from its quorum gets neither and refuses.
    pub(super) async fn confirm_leadership(&self) -> Result<(), ApiError> {
        use openraft::async_runtime::watch::WatchReceiver;
        use openraft::Instant as _;
        // The lease first: it is read from the metrics alone, while the membership below is
        // copied out (every request to the leader asks this).
        let lease_ms = self.config.raft.election_timeout_min_ms;
        let since_ms = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.last_quorum_acked.as_ref().map(|at| at.elapsed().as_millis() as u64)
        };
        if since_ms.is_some_and(|ms| ms < lease_ms) {
            return Ok(());
        }
        if self.voter_ids().iter().all(|v| *v == self.id) {
            return Ok(()); // a single voter is its own quorum
        }
        let wait = heartbeat_call_timeout(&self.config);
        match tokio::time::timeout(wait, self.raft.ensure_linearizable(openraft::raft::ReadPolicy::ReadIndex)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ApiError::Unavailable(format!("not confirmed as leader by a quorum: {e}"))),
            Err(_) => Err(ApiError::Unavailable(format!(
                "leader has no quorum acknowledgement within {lease_ms} ms (last: {since_ms:?} ms ago) and none came within {} ms",
                wait.as_millis()
            ))),
        }
    }

    pub(super) fn node_id_by_name(&self, name: &str) -> Result<NodeId, ApiError> {
        self.state.read(|s| s.node_by_name(name).map(|n| n.id)).ok_or_else(|| ApiError::NotFound(format!("node '{name}'")))
    }

    // -----------------------------------------------------------------------------------------
    // The leader's control loop
}
