//! The simulated leader: its tick runs `engine::TICK` (liveness, wall limits, archive, pass,
//! orders, suspensions, voters) over the simulated log, as corrald's leader (node/src/server/leader.rs) does.

use proto::{Command, CommandResult, Job, JobId, NodeId, RunNo};

use super::{Msg, Sim, SimState, ToAgent, ToLeader};

impl Sim {
    pub(super) fn leader_receive(&mut self, from: usize, msg: ToLeader) {
        match msg {
            ToLeader::Heartbeat { node, instance, sent_ms } => {
                // As corrald's `accept_heartbeats`: a beat refused, or of an instance the log
                // retired, gets no acknowledgement.
                let Some(recorded) = self.state.nodes.get(&node).map(|n| (n.state, n.instance)) else { return };
                match self.mem.liveness.beat(node, instance, recorded, self.now_ms) {
                    engine::Beat::Alive => {}
                    engine::Beat::Refused { .. } => return,
                    engine::Beat::Back => {
                        if let CommandResult::Rejected(_) = self.apply(Command::NodeUp { node, instance, now_ms: self.now_ms }) {
                            return;
                        }
                    }
                }
                self.send(Msg::ToAgent { to: from, msg: ToAgent::HeartbeatAck { instance, sent_ms } });
            }
            ToLeader::Report { node, instance, job, run, outcome } => {
                self.apply(Command::RunFinished { job, run, node, outcome, usage: Default::default(), now_ms: self.now_ms });
                self.send(Msg::ToAgent { to: from, msg: ToAgent::ReportAck { instance, job, run } });
            }
            ToLeader::LaunchAck { node, job, run, instance } => {
                self.apply(Command::LaunchConfirmed { job, run, node, instance, now_ms: self.now_ms });
            }
            ToLeader::Join { node, instance } => self.leader_join(from, node, instance),
            ToLeader::SuspendAck { order, job } => {
                self.mem.suspensions.acknowledged(job, &order);
            }
        }
    }

    /// As corrald's `join`: refused while an instance started later is up (the daemon asks
    /// again), else registered at once, retiring the recorded instance.
    fn leader_join(&mut self, from: usize, node: NodeId, instance: proto::InstanceId) {
        if self.state.newer_instance_up(node, instance).is_some() {
            self.report.registrations_refused += 1;
            return;
        }
        let Some(n) = self.state.nodes.get(&node) else { return };
        let cmd = Command::RegisterNode {
            name: n.name.clone(),
            addr: n.addr.clone(),
            inventory: (*n.inventory).clone(),
            instance,
            cert_fingerprint: String::new(),
            now_ms: self.now_ms,
        };
        if let CommandResult::NodeRegistered { .. } = self.apply(cmd) {
            self.report.registrations += 1;
            self.mem.liveness.heard(node, self.now_ms);
            self.send(Msg::ToAgent { to: from, msg: ToAgent::JoinAck { instance } });
        }
    }

    pub(super) fn leader_tick(&mut self) {
        if !self.leader_up() {
            return;
        }
        // The leader's sequence (`engine::TICK`, as corrald runs it).
        for step in engine::TICK {
            match step {
                engine::Step::Liveness => self.check_liveness(),
                engine::Step::WallLimits => {
                    for cmd in self.mem.wall_limits.due(&self.state, self.now_ms) {
                        self.apply(cmd);
                    }
                }
                engine::Step::Archive => self.archive_step(),
                engine::Step::Schedule => {
                    // Nothing paces a simulated leader.
                    let reader = SimState { state: &self.state, applied: self.applied, last_change_applied: self.last_change_applied };
                    let pass = self.mem.leader.schedule_pass(&reader, self.now_ms, || u32::MAX);
                    for cmd in pass.map(|p| p.commands).unwrap_or_default() {
                        self.apply(cmd);
                    }
                }
                engine::Step::Orders => self.send_orders(),
                engine::Step::Suspensions => self.send_suspensions(),
                engine::Step::Voters => self.change_voters(),
            }
        }
    }

    pub(super) fn send_orders(&mut self) {
        let now = self.now_ms;
        let orders = self.mem.leader.orders(&self.state, now);
        let launches: Vec<(Job, NodeId)> =
            orders.launches.into_iter().filter_map(|(id, node)| Some((self.state.jobs.get(&id)?.clone(), node))).collect();
        let kills: Vec<(JobId, RunNo, NodeId)> = orders.stops.into_iter().map(|(id, stop)| (id, stop.run, stop.node)).collect();
        for (job, node) in launches {
            if let Some(to) = self.node_index(node) {
                self.send(Msg::ToAgent { to, msg: ToAgent::Launch { job: Box::new(job) } });
            }
        }
        for (job, run, node) in kills {
            if let Some(to) = self.node_index(node) {
                self.send(Msg::ToAgent { to, msg: ToAgent::Kill { job, run } });
            }
        }
    }

    /// Tells each node of a suspended or resumed job to stop or continue its processes, until
    /// its present instance acknowledges (`control::leader::due_suspends`).
    pub(super) fn send_suspensions(&mut self) {
        let orders = self.mem.suspensions.due(&self.state, self.now_ms);
        for (job, order) in orders {
            if let Some(to) = self.node_index(order.node) {
                self.send(Msg::ToAgent { to, msg: ToAgent::Suspend { job, order } });
            }
        }
    }

    /// Declares silent nodes down (`engine::Liveness`).
    pub(super) fn check_liveness(&mut self) {
        let now = self.now_ms;
        let downs = self.mem.liveness.check(&self.state, now, now);
        for cmd in downs.commands {
            if !matches!(self.apply(cmd), CommandResult::Rejected(_)) {
                self.mem.liveness.declared_down(now);
            }
        }
    }

    /// Moves finished jobs to the accounting store and prunes it (`engine::Archiver`).
    pub(super) fn archive_step(&mut self) {
        let retention = engine::Retention { min_job_age_ms: self.cfg.min_job_age_ms, accounting_ms: self.cfg.accounting_retention_ms };
        let Some(step) = self.mem.archiver.due(&self.state, self.now_ms, retention) else { return };
        if let Some(cmd) = step.archive {
            self.apply(cmd);
        }
        let ended: Vec<JobId> = self
            .archive
            .values()
            .filter(|j| j.end_ms.is_some_and(|e| e < step.prune_ended_before_ms))
            .map(|j| j.id)
            .take(proto::ARCHIVE_BATCH_MAX)
            .collect();
        if let Some(cmd) = engine::Archiver::prune(ended, self.now_ms) {
            self.apply(cmd);
        }
    }

    /// A job the state moved out to the accounting store: it must be over everywhere, since no
    /// leader sends it a stop again.
    pub(super) fn archived(&mut self, job: Job) {
        let mut found = Vec::new();
        if !job.state.is_final() || !job.parts.is_empty() {
            found.push(format!("job {} archived while {} holding parts {:?}", job.id, job.state, job.parts));
        }
        for n in self.nodes.iter().filter(|n| n.alive) {
            if let Some(p) = n.procs.get(&job.id).filter(|p| self.spans[p.span].end_ms.is_none()) {
                found.push(format!("job {} archived while run {} still runs on {}", job.id, p.run, n.name));
            }
        }
        for f in found {
            self.violation(f);
        }
        self.archive.insert(job.id, job);
    }

    /// Promotes an agent or replaces a long-DOWN voter (`engine::Liveness::voter_change`);
    /// the simulated leader is none of the nodes.
    pub(super) fn change_voters(&mut self) {
        let limits = engine::VoterLimits {
            voters_max: self.cfg.voters_max,
            fresh_within_ms: self.cfg.heartbeat_interval_ms * 3,
            replace_after_ms: self.cfg.voter_replace_after_ms,
        };
        let Some(change) = self.mem.liveness.voter_change(&self.state, 0, &self.voters, limits, engine::Now::at(self.now_ms)) else {
            return;
        };
        let promoted = self.state.nodes.get(&change.promote).map(|n| n.state);
        let before = format!("{:?}", self.voters);
        self.log(|| format!("voters {before} -> {:?}", change.voters));
        if promoted != Some(proto::NodeState::Up) || change.voters.len() > self.cfg.voters_max {
            self.violation(format!("voter change to {:?} promotes node {} ({promoted:?})", change.voters, change.promote));
        }
        self.voters = change.voters;
    }
}
