//! The simulated agents: each keeps a `control::agent::Lease` as corrald's agent does (its
//! heartbeat tick fences, then beats; it decides launches and the watchdog's deadline), takes
//! the launch and stop decisions of `control::agent`, keeps a launch ledger, and sends its
//! reports from a `control::agent::Outbox`, as node/src/agent/ carries them out.

use control::agent::{LaunchDecision, StopDecision, Tick};
use proto::{Job, JobId, RunNo, RunOutcome};
use rand::Rng;

use super::{Msg, Mutation, Proc, Sim, ToAgent, ToLeader};
use crate::ProcessSpan;

impl Sim {
    pub(super) fn agent_receive(&mut self, i: usize, msg: ToAgent) {
        match msg {
            ToAgent::Launch { job } => self.agent_launch(i, *job),
            ToAgent::Kill { job, run } => self.agent_stop(i, job, run),
            ToAgent::Suspend { job, order } => self.agent_suspend(i, job, order),
            ToAgent::HeartbeatAck { instance, sent_ms } => {
                if self.nodes[i].instance == instance {
                    self.nodes[i].lease.acknowledged(sent_ms);
                }
            }
            ToAgent::JoinAck { instance } => {
                if self.nodes[i].instance == instance {
                    self.nodes[i].joined = true;
                }
            }
            ToAgent::ReportAck { instance, job, run } => {
                if self.nodes[i].instance == instance {
                    self.nodes[i].outbox.delivered(job, run);
                }
            }
        }
    }

    /// A launch reaches node `i` (node/src/server/runs.rs `launch_if_current`, node/src/agent/launch.rs
    /// `launch`).
    pub(super) fn agent_launch(&mut self, i: usize, job: Job) {
        let now = self.now_ms;
        let node = &self.nodes[i];
        let Some(part) = job.parts.iter().find(|p| p.run == job.run && p.alloc.node == node.id) else { return };
        // The stale-launch check (node/src/server/runs.rs `launch_if_current`) reads the node's
        // replica, at least as new as its last ack; the model reads the newest state:
        // every decision that makes a launch stale, a `NodeDown` above all, precedes the
        // ack that lets the node start work again.
        let (me, instance) = (node.id, node.instance);
        let current = self.state.jobs.get(&job.id).is_some_and(|j| control::agent::run_is_current_here(j, job.run, me, instance));
        if !current && !self.cfg.mutated(Mutation::StaleLaunch) {
            let name = node.name.clone();
            self.log(|| format!("{name} refuses a stale launch of job {} run {}", job.id, job.run));
            return;
        }
        let ledger = node.ledger_mark(job.id, job.run);
        let decision = if self.cfg.mutated(Mutation::LaunchWhenOutOfTouch) {
            control::agent::decide_launch(Some(0), self.cfg.fence_after_ms(), ledger)
        } else {
            node.lease.launch(now, ledger)
        };
        let gpus = part.alloc.gpus.clone();
        let ack = Msg::ToLeader { from: i, msg: ToLeader::LaunchAck { node: node.id, job: job.id, run: job.run, instance } };
        match decision {
            LaunchDecision::NotInTouch | LaunchDecision::StoppedBefore => {}
            LaunchDecision::AckAgain => self.send(ack),
            LaunchDecision::ReportLost => {
                let why = control::agent::LOST_EARLIER_INSTANCE.to_string();
                self.nodes[i].outbox.push(job.id, job.run, RunOutcome::Lost(why), now);
            }
            LaunchDecision::Start => {
                let duration_ms = job.spec.env.get("SIM_MS").and_then(|t| t.parse().ok()).unwrap_or(1_000);
                let exit_code = job.spec.env.get("SIM_EXIT").and_then(|t| t.parse().ok()).unwrap_or(0);
                let span = self.spans.len();
                let name = self.nodes[i].name.clone();
                self.spans.push(ProcessSpan {
                    job: job.id,
                    run: job.run,
                    node: name.clone(),
                    gpus: gpus.iter().map(|g| format!("g{g}")).collect(),
                    start_ms: now,
                    end_ms: None,
                    pid: None,
                });
                self.log(|| format!("{name} starts job {} run {} on gpus {gpus:?}", job.id, job.run));
                let n = &mut self.nodes[i];
                n.ledger.insert((job.id, job.run), (instance, false));
                if let Some(old) = n.procs.insert(
                    job.id,
                    Proc {
                        run: job.run,
                        gpus,
                        ends_at_ms: now + duration_ms,
                        exit_code,
                        stop_at_ms: None,
                        watchdog_killed: false,
                        suspended_since_ms: None,
                        suspend_change: 0,
                        span,
                    },
                ) {
                    // The real agent keys its running jobs by job id as well.
                    let what = format!("{name} started job {} run {} while run {} of it still ran there", job.id, job.run, old.run);
                    self.violation(what);
                }
                self.send(ack);
            }
        }
    }

    /// A stop reaches node `i` (node/src/agent/supervise.rs `kill`).
    pub(super) fn agent_stop(&mut self, i: usize, job: JobId, run: RunNo) {
        let now = self.now_ms;
        let running = self.nodes[i].procs.get(&job).is_some_and(|p| p.run == run);
        let decision = match control::agent::decide_stop(running, self.nodes[i].ledger_mark(job, run)) {
            StopDecision::RefuseAndReportLost(why)
                if why == control::agent::LOST_STOPPED_BEFORE_START && self.cfg.mutated(Mutation::StopUnstarted) =>
            {
                StopDecision::Nothing
            }
            StopDecision::RefuseAndReportLost(why)
                if why == control::agent::LOST_EARLIER_INSTANCE && self.cfg.mutated(Mutation::StopDeadInstance) =>
            {
                StopDecision::Nothing
            }
            decision => decision,
        };
        match decision {
            StopDecision::Stop => {
                let grace = self.rng.gen_range(0..=self.cfg.kill_grace_ms);
                if let Some(p) = self.nodes[i].procs.get_mut(&job).filter(|p| p.stop_at_ms.is_none()) {
                    p.stop_at_ms = Some(now + grace);
                }
            }
            StopDecision::Nothing => {}
            StopDecision::RefuseAndReportLost(why) => {
                let n = &mut self.nodes[i];
                let instance = n.instance;
                n.ledger.insert((job, run), (instance, true));
                n.outbox.push(job, run, RunOutcome::Lost(why.into()), now);
            }
        }
    }

    /// A suspension order reaches node `i` (node/src/agent/supervise.rs `suspend`): its run here
    /// stops or continues, its end moving by the time it stayed stopped, unless a newer order
    /// overtook it. A run not here is not an error (it ended); the order is acknowledged either
    /// way.
    pub(super) fn agent_suspend(&mut self, i: usize, job: JobId, order: control::leader::SuspendOrder) {
        let now = self.now_ms;
        let name = self.nodes[i].name.clone();
        let ignored = self.cfg.mutated(Mutation::SuspendIgnored);
        let current = |p: &Proc| control::agent::suspension_is_current(p.suspend_change, order.change);
        if let Some(p) = self.nodes[i].procs.get_mut(&job).filter(|p| p.run == order.run && !ignored && current(p)) {
            p.suspend_change = order.change;
            match (order.suspend, p.suspended_since_ms) {
                (true, None) => p.suspended_since_ms = Some(now),
                (false, Some(since)) => {
                    p.ends_at_ms += now - since;
                    p.suspended_since_ms = None;
                }
                _ => {}
            }
            self.log(|| format!("{name} job {job} run {}: suspended {}", order.run, order.suspend));
        }
        self.send(Msg::ToLeader { from: i, msg: ToLeader::SuspendAck { order, job } });
    }

    pub(super) fn end_proc(&mut self, i: usize, job: JobId, outcome: RunOutcome) {
        let now = self.now_ms;
        if let Some(p) = self.nodes[i].procs.remove(&job) {
            // It may have died earlier, while its corrald was paused.
            if self.spans[p.span].end_ms.is_none() {
                self.spans[p.span].end_ms = Some(now);
            }
            let name = self.nodes[i].name.clone();
            self.log(|| format!("{name} job {job} run {} ended: {outcome:?}", p.run));
            self.nodes[i].outbox.push(job, p.run, outcome, now);
        }
    }

    pub(super) fn agents_tick(&mut self) {
        let now = self.now_ms;
        for i in 0..self.nodes.len() {
            // Job processes run on while corrald is paused (they are in their own process
            // groups), until the watchdog, which is not paused, finds the lease run out.
            // (`node/src/run/watchdog.rs`, beside every `corrald`: once a paused daemon's lease, last
            // ack + `fence_after_ms` + `fence_kill_grace_ms`, has run out, it kills the node's jobs.)
            if self.nodes[i].alive && !self.nodes[i].running(now) && self.nodes[i].paused_until_ms.is_some() {
                // It notices within its poll interval that the lease's deadline passed.
                let lets_run_ms = self.nodes[i].lease.watchdog_deadline_in_ms(now.saturating_sub(control::agent::WATCHDOG_POLL_MS));
                if lets_run_ms == 0 && !self.cfg.mutated(Mutation::WatchdogNeverKills) {
                    for p in self.nodes[i].procs.values_mut() {
                        if p.stop_at_ms.is_none_or(|t| t > now) && p.exits_at_ms().is_none_or(|t| t > now) {
                            p.stop_at_ms = Some(now);
                            p.watchdog_killed = true;
                        }
                    }
                }
            }
            if self.nodes[i].alive {
                let done: Vec<(JobId, RunOutcome)> = self.nodes[i]
                    .procs
                    .iter()
                    .filter_map(|(id, p)| match p.stop_at_ms {
                        Some(t) if t <= now && p.watchdog_killed => Some((*id, RunOutcome::Lost("killed by the watchdog".into()))),
                        Some(t) if t <= now => Some((*id, RunOutcome::Killed)),
                        _ if p.exits_at_ms().is_some_and(|t| t <= now) => Some((*id, RunOutcome::Exited(p.exit_code))),
                        _ => None,
                    })
                    .collect();
                for (job, outcome) in done {
                    // A paused corrald notices the exit only once it runs again.
                    if self.nodes[i].running(now) {
                        self.end_proc(i, job, outcome);
                    } else if let Some(p) = self.nodes[i].procs.get(&job) {
                        let span = p.span;
                        if self.spans[span].end_ms.is_none() {
                            self.spans[span].end_ms = Some(now);
                        }
                    }
                }
            }
            if !self.nodes[i].running(now) {
                continue;
            }
            // Heartbeats and fencing.
            if now >= self.nodes[i].next_heartbeat_ms {
                self.nodes[i].next_heartbeat_ms = now + self.cfg.heartbeat_interval_ms;
                let holds_work = !self.nodes[i].procs.is_empty();
                if let Tick::FenceThenBeat { silent_ms, .. } = self.nodes[i].lease.tick(now, holds_work) {
                    let silent_ms = silent_ms.unwrap_or(now);
                    let grace = self.cfg.fence_kill_grace_ms;
                    let name = self.nodes[i].name.clone();
                    let mut fenced = 0;
                    for p in self.nodes[i].procs.values_mut() {
                        if p.stop_at_ms.is_none() {
                            p.stop_at_ms = Some(now + grace);
                            fenced += 1;
                        }
                    }
                    if fenced > 0 {
                        self.log(|| format!("{name} fences {fenced} jobs after {silent_ms} ms without a heartbeat ack"));
                    }
                }
                let (id, instance) = (self.nodes[i].id, self.nodes[i].instance);
                if self.nodes[i].partitioned_until_ms.is_none_or(|t| t <= now) {
                    // A new instance registers first, asking again until acknowledged (corrald's
                    // `register`), then beats.
                    let msg = if self.nodes[i].joined {
                        ToLeader::Heartbeat { node: id, instance, sent_ms: now }
                    } else {
                        ToLeader::Join { node: id, instance }
                    };
                    self.send(Msg::ToLeader { from: i, msg });
                }
            }
            // Reports, sent again until acknowledged (`control::agent::Outbox`).
            let (node, instance) = (self.nodes[i].id, self.nodes[i].instance);
            let cut = self.nodes[i].partitioned_until_ms.is_some_and(|t| t > now);
            let due = self.nodes[i].outbox.due(now, proto::REPORTS_PER_REQUEST_MAX);
            if !cut {
                for (job, run, outcome) in due {
                    self.send(Msg::ToLeader { from: i, msg: ToLeader::Report { node, instance, job, run, outcome } });
                }
            }
        }
    }
}
