//! The leader's control loop: every tick it declares silent nodes down, moves finished jobs to
//! the accounting store, schedules, sends launches and stops (re-sent until the log shows them
//! done) and manages the voters. The decisions are `control::leader`'s and the scheduler's; this
//! file carries them out.

use super::*;

/// How long the leader waits before re-sending a launch or kill that got no answer.
const RESEND_AFTER_MS: u64 = 1_000;
const RESEND_AFTER: Duration = Duration::from_millis(RESEND_AFTER_MS);

/// What the leader keeps, in memory, for the term it leads: the engine's memory, which
/// `corral-chaos sim` keeps too, and what only corrald's IO needs (its clock, launch calls under
/// way, MIG layouts sent, pacing). Rebuilt on every election, so a new leader gives every node a
/// fresh grace period.
pub(super) struct LeaderMemory {
    pub(super) term: Option<u64>,
    /// The origin of the monotonic millisecond clock the engine's liveness is given.
    pub(super) epoch: Instant,
    /// What the engine remembers for this term, a field per step of `engine::TICK`. Its
    /// `leader` is taken out while a pass runs; heartbeats still reach its `liveness`.
    pub(super) engine: engine::Memory,
    /// Launch calls that started while a pass had the engine out (`schedule_pass`): their
    /// re-send counts from then, recorded in the engine once it is back.
    pub(super) sent_during_pass: Option<Vec<(control::leader::SendKey, u64)>>,
    pub(super) layouts_sent: HashMap<(NodeId, u32), (Instant, Vec<String>)>,
    /// Launch calls under way, by node (at most `pacing::LAUNCH_CALLS_PER_NODE_MAX` each).
    pub(super) launch_calls: HashMap<NodeId, Arc<tokio::sync::Semaphore>>,
    /// How the last pass was paced, to say when pacing starts and ends.
    pub(super) paced: Option<crate::pacing::Paced>,
    /// When the last pass that ran expects jobs that cannot start now to start (its backfill
    /// reservations, `engine::Pass::expected_starts`): `ClientRequest::ExpectedStarts`.
    pub(super) expected_starts: Vec<(JobId, u64)>,
}

impl LeaderMemory {
    /// The memory of term `term` (`None`: not leading), in which every node of `nodes` was
    /// heard at its start.
    pub(super) fn new(term: Option<u64>, down_after_ms: u64, nodes: impl IntoIterator<Item = NodeId>) -> LeaderMemory {
        LeaderMemory {
            term,
            epoch: Instant::now(),
            engine: engine::Memory::new(0, down_after_ms, RESEND_AFTER_MS, nodes),
            sent_during_pass: None,
            layouts_sent: HashMap::new(),
            launch_calls: HashMap::new(),
            paced: None,
            expected_starts: Vec::new(),
        }
    }

    /// A heartbeat of `instance` of node `id`, recorded as `recorded`, was heard at `at`
    /// (`engine::Liveness::beat`).
    pub(super) fn beat_from(&mut self, id: NodeId, instance: InstanceId, recorded: (NodeState, InstanceId), at: Instant) -> engine::Beat {
        let at_ms = at.saturating_duration_since(self.epoch).as_millis() as u64;
        self.engine.liveness.beat(id, instance, recorded, at_ms)
    }

    /// Node `id` was heard at `at` (a registration).
    pub(super) fn heard_from(&mut self, id: NodeId, at: Instant) {
        let at_ms = at.saturating_duration_since(self.epoch).as_millis() as u64;
        self.engine.liveness.heard(id, at_ms);
    }

    /// Milliseconds on this memory's clock (monotonic).
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The time on this memory's clock and on the state's.
    fn now(&self) -> engine::Now {
        engine::Now { mono_ms: self.now_ms(), state_ms: now_ms() }
    }
}

impl Node {
    pub async fn leader_loop(self: Arc<Self>) {
        let interval = Duration::from_millis(self.config.schedule_interval_ms);
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = self.kick.notified() => {}
            }
            let st = self.status();
            if !st.is_leader || st.leader != Some(self.id) {
                lock(&self.memory).term = None;
                continue;
            }
            let span = info_span!("leader", node = self.id, term = st.term);
            let started = Instant::now();
            Arc::clone(&self).leader_tick(st.term).instrument(span).await;
            // Kicks that came during the tick coalesce into the next one; pausing as long as
            // the tick took (at most TICK_PAUSE_MAX) keeps the loop under about half a core
            // when every pass is long (a deep queue under a burst of submissions), and costs
            // nothing when passes are short.
            tokio::time::sleep(started.elapsed().min(TICK_PAUSE_MAX)).await;
        }
    }

    async fn leader_tick(self: Arc<Self>, term: u64) {
        {
            let mut mem = lock(&self.memory);
            if mem.term != Some(term) {
                info!("leading: every node gets a fresh heartbeat grace period");
                let nodes: Vec<NodeId> = self.state.read(|s| s.nodes.keys().copied().collect());
                *mem = LeaderMemory::new(Some(term), self.config.node_down_after_ms, nodes);
            }
        }
        for step in engine::TICK {
            match step {
                engine::Step::Liveness => self.check_liveness().await,
                engine::Step::WallLimits => self.enforce_wall_limits().await,
                engine::Step::Archive => self.archive_pass().await,
                engine::Step::Schedule => self.schedule_pass().await,
                engine::Step::Orders => self.drive_launches_and_kills(),
                engine::Step::Suspensions => self.drive_suspensions(),
                engine::Step::Voters => self.manage_voters(),
            }
        }
    }

    async fn check_liveness(&self) {
        let downs = {
            let mut mem = lock(&self.memory);
            let now = mem.now();
            self.state.read(|s| mem.engine.liveness.check(s, now.mono_ms, now.state_ms))
        };
        for held in &downs.held {
            say_held(*held);
        }
        if downs.commands.is_empty() {
            return;
        }
        let names: HashMap<NodeId, String> =
            self.state.read(|s| downs.silent_ms.iter().filter_map(|(id, _)| Some((*id, s.nodes.get(id)?.name.clone()))).collect());
        // Proposed together, the group commit packs them into a few entries.
        let results = futures_util::future::join_all(downs.commands.into_iter().map(|cmd| self.propose(cmd))).await;
        for ((id, silent_ms), result) in downs.silent_ms.iter().zip(results) {
            let name = names.get(id).map_or("?", String::as_str);
            match result {
                Ok(CommandResult::Rejected(why)) => warn!(node = %name, why = %why, "NodeDown refused"),
                Ok(_) => {
                    let mut mem = lock(&self.memory);
                    let now_ms = mem.now_ms();
                    mem.engine.liveness.declared_down(now_ms);
                    warn!(node = %name, silent_ms, "node declared down: it missed its heartbeats");
                }
                Err(e) => warn!(node = %name, error = %e, "mark node down"),
            }
        }
    }

    /// Ends the running jobs whose association's or QoS's `GrpWall` is used up, at most every
    /// `engine::WALL_CHECK_INTERVAL_MS` (`engine::WallLimits`).
    async fn enforce_wall_limits(&self) {
        let now = now_ms();
        let commands = {
            let mut mem = lock(&self.memory);
            self.state.read(|s| mem.engine.wall_limits.due(s, now))
        };
        // Proposed together, the group commit packs them into a few entries.
        let results = futures_util::future::join_all(commands.iter().map(|cmd| self.propose(cmd.clone()))).await;
        for (cmd, result) in commands.iter().zip(results) {
            let Command::TimeOut { job, reason, .. } = cmd else { continue };
            match result {
                Ok(CommandResult::Ok) => info!(job, why = %reason, "job timed out: its group wall limit is used up"),
                Ok(other) => debug!(job, result = ?other, "time-out refused"),
                Err(e) => warn!(job, error = %e, "time out a job past its group wall limit"),
            }
        }
    }

    /// The scheduler's input from the committed state; dependencies on jobs that left the hot
    /// state are read from the accounting store. Requests of jobs unchanged since the last view
    /// are reused (`view_cache`).
    pub(super) fn scheduler_view(&self) -> scheduler::ClusterView {
        self.scheduler_view_seen().0
    }

    /// The scheduler's view, and the first job id it does not hold (read with it).
    fn scheduler_view_seen(&self) -> (scheduler::ClusterView, JobId) {
        let archived = |id: JobId| match self.state.archived_job(id) {
            Ok(job) => job,
            Err(e) => {
                warn!(job = id, error = %e, "read a dependency from the accounting store");
                None
            }
        };
        self.state.read(|s| (consensus::view::scheduler_view_cached(s, &mut lock(&self.view_cache), archived), s.next_job_id))
    }

    /// Moves jobs finished more than `min_job_age_s` ago to the accounting store and prunes
    /// records past `accounting_retention_days`, a bounded batch of each at most once a second
    /// (`engine::Archiver`).
    async fn archive_pass(&self) {
        let now = now_ms();
        let retention = engine::Retention {
            min_job_age_ms: self.config.min_job_age_s.saturating_mul(1000),
            accounting_ms: self.config.accounting_retention_days.saturating_mul(86_400_000),
        };
        let step = {
            let mut mem = lock(&self.memory);
            self.state.read(|s| mem.engine.archiver.due(s, now, retention))
        };
        let Some(step) = step else { return };
        if let Some(cmd) = step.archive {
            match self.propose(cmd).await {
                Ok(_) => debug!("moved finished jobs to the accounting store"),
                Err(e) => warn!(error = %e, "move finished jobs to the accounting store"),
            }
        }
        let pruned = match self.state.accounting_ended_before(step.prune_ended_before_ms, proto::ARCHIVE_BATCH_MAX) {
            Ok(ids) => ids,
            Err(e) => {
                warn!(error = %e, "read the accounting store for pruning");
                return;
            }
        };
        let count = pruned.len();
        if let Some(cmd) = engine::Archiver::prune(pruned, now) {
            match self.propose(cmd).await {
                Ok(_) => info!(records = count, "pruned accounting records past retention"),
                Err(e) => warn!(error = %e, "prune accounting records"),
            }
        }
    }

    async fn schedule_pass(&self) {
        // The engine leaves the memory while the pass runs (the pacing below locks it); the
        // leader loop is the only task that runs passes or starts a new term.
        let mut engine = {
            let mut mem = lock(&self.memory);
            mem.sent_during_pass = Some(Vec::new());
            std::mem::replace(&mut mem.engine.leader, engine::Leader::new(RESEND_AFTER_MS))
        };
        let now = now_ms();
        let started = Instant::now();
        let pass = engine.schedule_pass(&EngineState(self), now, || {
            let (starts_max, paced) = crate::pacing::starts_per_pass_max(&self.leader_load());
            self.say_paced(paced, starts_max);
            starts_max
        });
        let pass_ms = started.elapsed().as_millis() as u64;
        {
            let mut mem = lock(&self.memory);
            for (key, at_ms) in mem.sent_during_pass.take().unwrap_or_default() {
                engine.launch_sent(key, at_ms);
            }
            mem.engine.leader = engine;
        }
        let Some(pass) = pass else { return };
        lock(&self.memory).expected_starts = pass.expected_starts.iter().take(proto::EXPECTED_STARTS_MAX).copied().collect();
        self.send_mig_layouts(&pass.mig_layouts);
        for cmd in pass.commands {
            match cmd {
                Command::Requeue { job, .. } | Command::Cancel { job, .. } => {
                    info!(job, command = ?cmd, "preempting job");
                    if let Err(e) = self.propose(cmd).await {
                        warn!(job, error = %e, "preempt job");
                    }
                }
                Command::Plan { .. } => match self.propose(cmd).await {
                    Ok(CommandResult::Planned { accepted, rejected }) => {
                        debug!(placements = pass.starts, accepted = accepted.len(), rejected = rejected.len(), pass_ms, "plan committed");
                        for (job, why) in rejected {
                            debug!(job, why = %why, "placement rejected as stale");
                        }
                    }
                    Ok(other) => warn!(result = ?other, "unexpected plan result"),
                    Err(e) => warn!(error = %e, "commit plan"),
                },
                other => warn!(command = ?other, "a scheduling pass asked for a command it never gives"),
            }
        }
    }

    /// What pacing needs to know of this leader's load (`pacing::LeaderLoad`).
    fn leader_load(&self) -> crate::pacing::LeaderLoad {
        use openraft::async_runtime::watch::WatchReceiver;
        use openraft::Instant as _;
        let quorum_ack_age_ms = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.last_quorum_acked.as_ref().map(|at| at.elapsed().as_millis() as u64)
        };
        let single_voter = self.voter_ids().iter().all(|v| *v == self.id);
        let launches_unconfirmed = self.state.read(|s| s.jobs_holding_parts().map(|j| j.launches_pending().count()).sum());
        crate::pacing::LeaderLoad {
            quorum_ack_age_ms,
            single_voter,
            raft_heartbeat_ms: self.config.raft.heartbeat_interval_ms,
            lease_ms: self.config.raft.election_timeout_min_ms,
            launches_unconfirmed,
        }
    }

    /// Says when the leader starts and stops holding starts back for its own lag (pacing for
    /// launches in flight is routine and said at debug level only).
    fn say_paced(&self, paced: crate::pacing::Paced, starts_max: u32) {
        use crate::pacing::Paced;
        let before = lock(&self.memory).paced.replace(paced);
        let lagging = |p: Option<Paced>| matches!(p, Some(Paced::Lagging | Paced::Stalled));
        if lagging(Some(paced)) && !lagging(before) {
            info!(paced = ?paced, starts_max, "voters acknowledge late: pacing job starts");
        } else if !lagging(Some(paced)) && lagging(before) {
            info!(starts_max, "voters caught up: job starts no longer held back");
        } else if paced != Paced::No {
            debug!(paced = ?paced, starts_max, "job starts paced");
        }
        self.paced.count(paced);
    }

    /// Asks agents to re-partition MIG GPUs as the scheduler suggests (the new inventory comes
    /// back through the log).
    fn send_mig_layouts(&self, layouts: &[(NodeId, u32, Vec<String>)]) {
        for (target, gpu, profiles) in layouts {
            {
                let mut mem = lock(&self.memory);
                let key = (*target, *gpu);
                // The same layout again only after ten `RESEND_AFTER` (its report may be in
                // flight); another (the GPU re-carved for the next job) after one.
                let wait = |same: bool| if same { RESEND_AFTER * 10 } else { RESEND_AFTER };
                if mem.layouts_sent.get(&key).is_some_and(|(t, sent)| t.elapsed() < wait(sent == profiles)) {
                    continue;
                }
                mem.layouts_sent.insert(key, (Instant::now(), profiles.clone()));
            }
            info!(node = target, gpu, profiles = ?profiles, "asking for a mig layout");
            if *target == self.id {
                if let Err(e) = self.apply_mig_layout(*gpu, profiles.clone()) {
                    warn!(gpu, error = %e, "mig layout");
                }
                continue;
            }
            let Some(addr) = self.state.read(|s| s.nodes.get(target).map(|n| n.addr.clone())) else { continue };
            let client = Arc::clone(&self.client);
            let env =
                Envelope { hops: 0, request: PeerRequest::ApplyMigLayout { gpu: *gpu, profiles: profiles.clone() }.into(), user: None };
            let gpu = *gpu;
            tokio::spawn(async move {
                match client.call(&addr, &env, PEER_CALL_TIMEOUT).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => warn!(gpu, error = %e, "mig layout refused"),
                    Err(e) => warn!(gpu, error = %e, "mig layout not delivered"),
                }
            });
        }
    }

    /// Sends every committed-but-unconfirmed launch of a part to its node, and every stop of a
    /// part that must end (cancelled, failed gang, requeued, earlier run) to its node; re-sends
    /// after `RESEND_AFTER`.
    fn drive_launches_and_kills(self: &Arc<Self>) {
        // Read before the state: the state read below is at least this recent.
        let issued_index = self.state.applied_index();
        // The memory before the state, as everywhere (`manage_voters`).
        let (launches, kills) = {
            let mut mem = lock(&self.memory);
            let now_ms = mem.now_ms();
            self.state.read(|s| {
                let orders = mem.engine.leader.orders(s, now_ms);
                let addr_of = |node: NodeId| s.nodes.get(&node).map(|n| n.addr.clone()).unwrap_or_default();
                let launches: Vec<_> = orders
                    .launches
                    .into_iter()
                    .filter_map(|(id, target)| {
                        let job = s.jobs.get(&id)?;
                        let nodes: Vec<(String, String)> = job
                            .run_nodes()
                            .iter()
                            .map(|n| s.nodes.get(n).map(|r| (r.name.clone(), r.addr.clone())).unwrap_or_default())
                            .collect();
                        Some((job.clone(), nodes, target, addr_of(target)))
                    })
                    .collect();
                let kills: Vec<_> =
                    orders.stops.into_iter().map(|(id, stop)| (id, stop.run, stop.checkpoint, stop.node, addr_of(stop.node))).collect();
                (launches, kills)
            })
        };
        for (job, nodes, target, addr) in launches {
            let key = (job.id, job.run, target);
            let node = Arc::clone(self);
            let span = info_span!("launch", job = key.0, run = key.1, node = target);
            let calls = Arc::clone(
                lock(&self.memory)
                    .launch_calls
                    .entry(target)
                    .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(crate::pacing::LAUNCH_CALLS_PER_NODE_MAX))),
            );
            tokio::spawn(
                async move {
                    // A node has at most so many launch calls under way; the rest wait here.
                    let Ok(_call) = calls.acquire().await else { return };
                    // A re-send counts from when the call starts, not from its wait.
                    {
                        let mut mem = lock(&node.memory);
                        let now_ms = mem.now_ms();
                        match mem.sent_during_pass.as_mut() {
                            Some(during) => during.push((key, now_ms)),
                            None => mem.engine.leader.launch_sent(key, now_ms),
                        }
                    }
                    node.send_launch(job, nodes, target, addr, issued_index).await;
                }
                .instrument(span),
            );
        }
        for (job, run, checkpoint, target, addr) in kills {
            let node = Arc::clone(self);
            tokio::spawn(async move {
                let result = if target == node.id {
                    node.agent.kill(job, run, checkpoint)
                } else {
                    let env = Envelope { hops: 0, request: PeerRequest::Kill { job, run, checkpoint }.into(), user: None };
                    node.client.call(&addr, &env, PEER_CALL_TIMEOUT).await.unwrap_or_else(|e| Err(ApiError::Unavailable(e.to_string())))
                };
                if let Err(e) = result {
                    debug!(job, run, error = %e, "stop not delivered, will retry");
                }
            });
        }
    }

    /// Tells each node of a suspended or resumed job to stop or continue its processes, until
    /// its present instance acknowledges (`engine::Suspensions`).
    fn drive_suspensions(self: &Arc<Self>) {
        let orders = {
            let mut mem = lock(&self.memory);
            let now_ms = mem.now_ms();
            self.state.read(|s| {
                let orders = mem.engine.suspensions.due(s, now_ms);
                let addr_of = |node: NodeId| s.nodes.get(&node).map(|n| n.addr.clone()).unwrap_or_default();
                orders.into_iter().map(|(job, o)| (job, o, addr_of(o.node))).collect::<Vec<_>>()
            })
        };
        for (job, order, addr) in orders {
            let node = Arc::clone(self);
            tokio::spawn(async move {
                let (run, suspend, paused_ms, change) = (order.run, order.suspend, order.paused_ms, order.change);
                let result = if order.node == node.id {
                    node.agent.suspend(job, run, crate::run::launcher::Pause { suspended: suspend, paused_ms, change })
                } else {
                    let request = PeerRequest::SuspendPart { job, run, suspend, paused_ms, change }.into();
                    let env = Envelope { hops: 0, request, user: None };
                    node.client.call(&addr, &env, PEER_CALL_TIMEOUT).await.unwrap_or_else(|e| Err(ApiError::Unavailable(e.to_string())))
                };
                match result {
                    Ok(_) => {
                        lock(&node.memory).engine.suspensions.acknowledged(job, &order);
                    }
                    Err(e) => debug!(job, run, node = order.node, error = %e, "suspension not delivered, will retry"),
                }
            });
        }
    }

    async fn send_launch(&self, job: proto::Job, nodes: Vec<(String, String)>, target: NodeId, addr: String, issued_index: u64) {
        let (id, run) = (job.id, job.run);
        let result = if target == self.id {
            // As a launch from a leader elsewhere: acknowledged anew before it starts, it is not.
            let checked_ack_index = self.agent.ack_commit_index();
            self.launch_here(job, nodes, checked_ack_index).await
        } else {
            let env = Envelope { hops: 0, request: PeerRequest::Launch { job: Box::new(job), nodes, issued_index }.into(), user: None };
            match self.client.call(&addr, &env, PEER_CALL_TIMEOUT).await {
                Ok(r) => r,
                Err(e) => Err(ApiError::Unavailable(format!("reach {addr}: {e}"))),
            }
        };
        match result {
            Ok(Reply::LaunchAck { instance, .. }) => {
                let cmd = Command::LaunchConfirmed { job: id, run, node: target, instance, now_ms: now_ms() };
                match self.propose(cmd).await {
                    Ok(CommandResult::Ok) => debug!("launch confirmed"),
                    Ok(other) => debug!(result = ?other, "launch confirmation not applied"),
                    Err(e) => warn!(error = %e, "commit launch confirmation"),
                }
            }
            Ok(other) => warn!(reply = ?other, "unexpected launch reply"),
            Err(e) => warn!(error = %e, "launch not accepted, will retry"),
        }
    }

    /// Keeps `voters_max` voters: promotes a healthy agent when there are fewer, and replaces a
    /// voter that has been DOWN for `voter_replace_after_ms` under this leader
    /// (`control::leader::voter_change`). One change at a time.
    fn manage_voters(self: &Arc<Self>) {
        if self.membership_busy.load(Ordering::SeqCst) {
            return;
        }
        let voters = self.voter_ids();
        let limits = engine::VoterLimits {
            voters_max: self.config.voters_max,
            fresh_within_ms: self.config.heartbeat_interval_ms * 3,
            replace_after_ms: self.config.voter_replace_after_ms,
        };
        let decided = {
            let mem = lock(&self.memory);
            self.state.read(|s| mem.engine.liveness.voter_change(s, self.id, &voters, limits, mem.now()))
        };
        let Some(control::leader::VoterChange { promote: new_id, voters: change }) = decided else { return };
        let Some(new_node) = self.state.read(|s| s.nodes.get(&new_id).map(|n| MemberNode { name: n.name.clone(), addr: n.addr.clone() }))
        else {
            return;
        };
        self.membership_busy.store(true, Ordering::SeqCst);
        let node = Arc::clone(self);
        tokio::spawn(async move {
            info!(node = %new_node.name, voters = ?change, "promoting node to voter");
            let result = async {
                node.raft.add_learner(new_id, new_node.clone(), true).await.map_err(|e| format!("add learner: {e}"))?;
                // retain: a replaced voter stays a learner, so when it comes back the log tells it
                // it is no longer a voter (a removed node would otherwise campaign for ever and
                // serve a stale state).
                node.raft.change_membership(change.clone(), true).await.map_err(|e| format!("change membership: {e}"))?;
                Ok::<_, String>(())
            }
            .await;
            match result {
                Ok(()) => info!(node = %new_node.name, "voters now {:?}", change),
                Err(e) => warn!(node = %new_node.name, error = %e, "promotion failed"),
            }
            node.membership_busy.store(false, Ordering::SeqCst);
        });
    }

    /// Periodically learns the members' addresses so this node can find the leader.
    pub(super) async fn learn_members_loop(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(liveness::MEMBERS_CHECK_INTERVAL);
        let mut schedule = liveness::MembersSchedule::default();
        loop {
            ticker.tick().await;
            let term = self.agent.ack_term();
            let Some(check) = schedule.due(term, Instant::now()) else { continue };
            if let Ok(Reply::Cluster(info)) = liveness::ask_members(&self.heartbeat_link).await {
                let addrs: Vec<String> = info.members.iter().filter(|m| m.role != NodeRole::Agent).map(|m| m.addr.clone()).collect();
                self.forward_link.learn(addrs.iter().filter(|a| **a != self.config.advertise_addr()).cloned());
                self.agent_link.learn(addrs.clone());
                self.heartbeat_link.learn(addrs);
                let voters: Vec<(NodeId, NodeRole, String)> = info.members.iter().map(|m| (m.id, m.role, m.addr.clone())).collect();
                self.heartbeat_link.set_first(liveness::relay_order(self.id, &voters), liveness::keeps_current(check));
                schedule.learned(self.id, check, term, Instant::now());
            }
        }
    }
}

/// Says once when a mass silence or a new leader's wait for its nodes starts holding nodes
/// back from `NodeDown`, and when it ends.
fn say_held(held: engine::Held) {
    match held {
        engine::Held::RejoinStarted { nodes } => {
            info!(nodes, "nodes still return to this new leader: holding the silent ones back from NodeDown meanwhile")
        }
        engine::Held::RejoinEnded { nodes } => info!(nodes, "the nodes' return is over: silent nodes are judged again"),
        engine::Held::MassSilenceStarted { nodes } => warn!(
            nodes,
            "too many nodes unheard at once to believe: declaring them down only after {} grace periods",
            control::leader::MASS_DOWN_GRACES
        ),
        engine::Held::MassSilenceEnded { nodes } => info!(nodes, "the mass silence is over"),
    }
}

/// The node's applied state as the engine reads it.
struct EngineState<'a>(&'a Node);

impl engine::StateReader for EngineState<'_> {
    fn applied_index(&self) -> u64 {
        self.0.state.applied_index()
    }

    fn with_state<R>(&self, f: impl FnOnce(&consensus::ClusterState, u64) -> R) -> R {
        // Read with the state: an entry that freed something and is in it is counted.
        self.0.state.read(|s| f(s, self.0.state.last_change_index()))
    }

    fn view(&self) -> (scheduler::ClusterView, JobId) {
        self.0.scheduler_view_seen()
    }
}
