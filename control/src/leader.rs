//! The leader's decisions: which silent nodes to declare down ([`nodes_down`]), which nodes to
//! send a job's launches and stops to ([`launch_targets`], [`stops`]), and when a send is due
//! again ([`Resend`], whose memory is bounded by what one re-send period sends); when it
//! promotes an agent to voter ([`voter_change`]); whether it has a scheduling pass to run at all
//! ([`pass_needed`]) and whether one may decide anything new ([`pass_due`]); which nodes a new
//! leader still waits for ([`rejoin_held`]).

use std::collections::{BTreeMap, BTreeSet};

use proto::{InstanceId, Job, JobId, JobState, NodeId, RunNo};

/// A node with this feature is never promoted to voter (the simulated nodes of `corral bench
/// --nodes` hold no replica; an operator may keep a node out of the quorum the same way).
pub const NEVER_VOTER_FEATURE: &str = "never-voter";

/// Nodes due at once past which the leader doubts its own view before the nodes' (see
/// [`nodes_down`]): more than this many, and more than [`MASS_DOWN_PERCENT`] of the nodes.
pub const MASS_DOWN_MIN: usize = 8;
pub const MASS_DOWN_PERCENT: usize = 10;
/// How many grace periods a node of a mass silence must stay silent before it is declared down.
pub const MASS_DOWN_GRACES: u64 = 2;

/// The leader's verdict on silent nodes: those to declare down now, and those it holds back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DownVerdict {
    pub down: Vec<NodeId>,
    pub held: Vec<NodeId>,
}

/// Which nodes the leader declares down now, given every node not yet DOWN with how long it
/// has gone unheard (`silent_ms`) and how many nodes it declared down within the last grace
/// period (`recent_downs`). A node unheard for more than `down_after_ms` is due. When the due
/// and the recently declared together are more than [`MASS_DOWN_MIN`] and
/// [`MASS_DOWN_PERCENT`] of the nodes, the likelier fault is the leader's own or the host's
/// (starved of CPU, cut off, just elected while the nodes still look for it), as Kubernetes'
/// node controller also assumes, and declaring them down feeds it (their jobs are requeued
/// and launched elsewhere): those nodes are declared down only once unheard for
/// [`MASS_DOWN_GRACES`] grace periods. A real mass failure (a rack's power) is then requeued a
/// grace period later; a false one costs nothing more, since a node no leader acknowledged has
/// fenced itself anyway. The order of `silent_ms` is kept.
pub fn nodes_down(silent_ms: &[(NodeId, u64)], down_after_ms: u64, recent_downs: usize) -> DownVerdict {
    let due: Vec<(NodeId, u64)> = silent_ms.iter().copied().filter(|(_, ms)| *ms > down_after_ms).collect();
    let failing = due.len() + recent_downs;
    let mass = failing > MASS_DOWN_MIN && failing * 100 > (silent_ms.len() + recent_downs) * MASS_DOWN_PERCENT;
    if !mass {
        return DownVerdict { down: due.into_iter().map(|(id, _)| id).collect(), held: Vec::new() };
    }
    let (down, held): (Vec<_>, Vec<_>) = due.into_iter().partition(|(_, ms)| *ms > down_after_ms * MASS_DOWN_GRACES);
    DownVerdict { down: down.into_iter().map(|(id, _)| id).collect(), held: held.into_iter().map(|(id, _)| id).collect() }
}

/// How long at most, in grace periods from its start, a leader waits for the nodes still on
/// their way back to it (see [`rejoin_held`]). Only a herd still returning that long is cut
/// short: at 5,000 simulated nodes on a saturated 2-core host some took 19 s (4.2 grace
/// periods of 4.5 s); a failover that ends sooner ends the wait sooner. 27 s at 4.5 s, against
/// Kubernetes' 40 s for any silent node and Nomad's 5 minutes after a failover.
pub const REJOIN_GRACES_MAX: u64 = 6;

/// Whether hearing a node after `silent_ms` of silence is a return (see [`rejoin_held`]): more
/// than half a grace period, counted for a new leader from its start.
pub fn is_return(silent_ms: u64, down_after_ms: u64) -> bool {
    silent_ms > down_after_ms / 2
}

/// Where a leader stands in its nodes' return: how long it has led, and how long since it last
/// heard a node return ([`is_return`]; `quiet_ms` is as long as it has led if none did yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejoin {
    pub leading_for_ms: u64,
    pub quiet_ms: u64,
}

/// Splits `silent_ms` (as for [`nodes_down`]) into the nodes to judge now and the due ones
/// held back because nodes are still on their way back to a new leader: while a node returned
/// within the last half grace period, and for at most [`REJOIN_GRACES_MAX`] grace periods of
/// the term, no node is declared down. After a failover every node re-connects at once; on a
/// loaded host the last of thousands arrive after more than one grace period, some heard once
/// (a beat a relay passed on late) and silent again while they look for a member with room for
/// their handshake, and declaring them down would requeue the jobs of live nodes. Once returns
/// stop, every node is judged as usual: a node that died with the old leader is declared down
/// half a grace period after the last return. Holding a `NodeDown` back is always safe (a node
/// no leader acknowledged fences itself); it only delays a requeue.
pub fn rejoin_held(silent_ms: Vec<(NodeId, u64)>, rejoin: Rejoin, down_after_ms: u64) -> (Vec<(NodeId, u64)>, Vec<NodeId>) {
    let returning = rejoin.leading_for_ms <= down_after_ms.saturating_mul(REJOIN_GRACES_MAX) && rejoin.quiet_ms < down_after_ms / 2;
    if !returning {
        return (silent_ms, Vec::new());
    }
    let (held, judged): (Vec<_>, Vec<_>) = silent_ms.into_iter().partition(|(_, ms)| *ms > down_after_ms);
    (judged, held.into_iter().map(|(id, _)| id).collect())
}

/// The nodes a launch of `job`'s current run goes to now: every part not yet confirmed, except
/// that a batch script (the first node's part) starts only once every other node of its job
/// confirmed its share, so its steps can start everywhere at once, as in Slurm.
pub fn launch_targets(job: &Job) -> Vec<NodeId> {
    let pending: Vec<NodeId> = job.launches_pending().map(|p| p.alloc.node).collect();
    let first = job.run_nodes().first().copied();
    let others_pending = job.spec.is_batch() && pending.iter().any(|n| Some(*n) != first);
    pending.into_iter().filter(|n| !(others_pending && Some(*n) == first)).collect()
}

/// One stop the leader sends: part `run` of a job on `node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopOrder {
    pub run: RunNo,
    pub node: NodeId,
    /// Signal the job's `--signal` first so it can write a checkpoint.
    pub checkpoint: bool,
}

/// The stops `job` needs now: every part of an earlier run, and every part once the job ended,
/// was requeued, a part failed or its batch script ended ([`Job::parts_to_stop`]).
///
/// A job requeued by the cluster (its node lost, preempted) gets its `--signal` first, to write
/// a checkpoint. One requeued on request is stopped as Slurm's `scontrol requeue` stops it
/// (SIGTERM, grace, SIGKILL): Lightning and submitit request it from their own `--signal`
/// handler once they checkpointed, and the signal again would run that handler again (a second
/// checkpoint, a second requeue refused, and submitit records the job as failed).
pub fn stops(job: &Job) -> Vec<StopOrder> {
    let checkpoint =
        job.state == JobState::Pending && job.spec.signal.is_some() && !job.reasons.iter().any(|r| r.ends_with(proto::REQUEUED_ON_REQUEST));
    job.parts_to_stop().map(|p| StopOrder { run: p.run, node: p.alloc.node, checkpoint }).collect()
}

/// A send of a launch or stop: (job, run, node).
pub type SendKey = (proto::JobId, RunNo, NodeId);

/// What the leader sends in one pass: the launches (job, node) and stops (job, order) that are
/// due, each counted as sent now in its [`Resend`] (pruned first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Orders {
    pub launches: Vec<(proto::JobId, NodeId)>,
    pub stops: Vec<(proto::JobId, StopOrder)>,
}

/// The launches and stops due now over `jobs` (the committed state's): [`launch_targets`] and
/// [`stops`] of every job that holds parts (finished ones, most of the state under a sweep, hold
/// none), less those sent within the re-send period.
pub fn due_orders<'a>(
    jobs: impl Iterator<Item = &'a Job>,
    launches_sent: &mut Resend<SendKey>,
    stops_sent: &mut Resend<SendKey>,
    now_ms: u64,
) -> Orders {
    launches_sent.prune(now_ms);
    stops_sent.prune(now_ms);
    let mut orders = Orders::default();
    for job in jobs.filter(|j| !j.parts.is_empty()) {
        for node in launch_targets(job) {
            if launches_sent.take_due((job.id, job.run, node), now_ms) {
                orders.launches.push((job.id, node));
            }
        }
        for stop in stops(job) {
            if stops_sent.take_due((job.id, stop.run, stop.node), now_ms) {
                orders.stops.push((job.id, stop));
            }
        }
    }
    orders
}

/// A stop (SIGSTOP) or continue (SIGCONT) of a suspended or resumed job's processes on one
/// node: what the log says of the run's suspension, and the node's instance it is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuspendOrder {
    pub run: RunNo,
    pub node: NodeId,
    pub suspend: bool,
    /// How long the run's ended suspensions lasted: the time limit moves by as much.
    pub paused_ms: u64,
    /// The suspension's change count ([`proto::Suspension::changes`]) this order carries.
    pub change: u32,
    pub instance: InstanceId,
}

/// What each node of `job`'s run acknowledged of its suspension: the change and the node's
/// instance that applied it. A node restarted since (a new instance adopts the run with its
/// processes as they were) is told again.
pub type SuspendAcks = BTreeMap<SendKey, (u32, InstanceId)>;

/// The suspension orders due now over `jobs`: for every part of a running job's current run
/// that started (its launch confirmed) and was suspended or resumed in this run, the state the
/// log says, unless that node's present instance (`instance_of`) acknowledged it or it was sent
/// within the re-send period. A new leader knows no acknowledgement and tells each node once.
/// Acknowledgements of parts no longer in such a run are dropped: `acked` holds one entry per
/// part of a suspended or resumed run at most.
pub fn due_suspends<'a>(
    jobs: impl Iterator<Item = &'a Job>,
    acked: &mut SuspendAcks,
    sent: &mut Resend<SendKey>,
    instance_of: impl Fn(NodeId) -> Option<InstanceId>,
    now_ms: u64,
) -> Vec<(proto::JobId, SuspendOrder)> {
    sent.prune(now_ms);
    let mut live = std::collections::BTreeSet::new();
    let mut orders = Vec::new();
    for job in jobs.filter(|j| j.state == JobState::Running && j.suspension.changes > 0) {
        let (suspend, change, paused_ms) = (job.suspension.since_ms.is_some(), job.suspension.changes, job.suspension.paused_ms);
        for part in job.parts.iter().filter(|p| p.run == job.run && p.launched_by.is_some()) {
            let key = (job.id, job.run, part.alloc.node);
            live.insert(key);
            let Some(instance) = instance_of(part.alloc.node) else { continue };
            if acked.get(&key) == Some(&(change, instance)) || !sent.take_due(key, now_ms) {
                continue;
            }
            orders.push((job.id, SuspendOrder { run: job.run, node: part.alloc.node, suspend, paused_ms, change, instance }));
        }
    }
    acked.retain(|key, _| live.contains(key));
    orders
}

/// Whether the leader has a scheduling pass to run: a pending job that is not held (placement,
/// MIG demand and preemption all come from those), or a MIG layout an operator pinned that a
/// GPU does not have yet. A held job starts nothing, preempts nothing and asks for no layout
/// (its release kicks a pass). Without one, no view is built: at 1,000 nodes building it ten
/// times a second was most of an idle leader's CPU, and at 5,000 simulated nodes one held job
/// cost the leader 7-10 points of a core with the views cached (`corral bench --nodes`).
pub fn pass_needed<'a>(mut jobs: impl Iterator<Item = &'a Job>, mut nodes: impl Iterator<Item = &'a proto::NodeRecord>) -> bool {
    jobs.any(|j| j.state == JobState::Pending && !j.spec.hold) || nodes.any(|n| n.mig_pins_unapplied().next().is_some())
}

/// How often at most the leader skips a pass that would see what the last one saw: time alone
/// changes priorities (age), fair shares (decay) and backfill windows (jobs past their
/// limits) slowly, and a pass once a second follows them. (Slurm's main scheduler runs on
/// events and every `sched_interval`, 60 s by default.)
pub const PASS_REFRESH_MS: u64 = 1_000;

/// A scheduling pass that changed nothing: the applied state it saw (its last log index, and
/// the first job id it did not see), when it ran, when time alone next changes a pending job's
/// chances (`scheduler::Plan::wake_ms`) and the room it left (`scheduler::Plan::room`).
/// [`pass_due`] moves the first two on over submissions that change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdlePass {
    pub applied_index: u64,
    pub next_job_id: JobId,
    pub at_ms: u64,
    pub wake_ms: Option<u64>,
    pub room: Option<scheduler::Room>,
}

/// The applied state now, as [`pass_due`] reads it: the last applied log index (read before
/// the state), the last entry that did more than submit jobs (`Command::submits_only`, read
/// with the state: none after it is in the state) and the next job id (of the state).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub index: u64,
    pub last_change_index: u64,
    pub next_job_id: JobId,
}

/// Whether a pass may decide what the last one did not, so that it is worth running: after a
/// pass that changed something (`last_idle` none), a pending job's wake time,
/// [`PASS_REFRESH_MS`], or an entry applied since, unless every entry since only submitted
/// jobs that change nothing ([`stays_waiting`]). The pass is a pure function of the state and
/// the time, so at rest with a job that cannot start, a leader of 5,000 nodes does not rebuild
/// their view every tick to learn again that it cannot; and under a burst of submissions
/// queued behind busy GPUs, it does not weigh the whole queue again for each entry (with
/// 80,000 such jobs queued, the passes were 40% of the leader's CPU). Over submissions that
/// change nothing, `last_idle` moves on to `now` (the next call looks at newer jobs only).
pub fn pass_due(
    last_idle: Option<&mut IdlePass>,
    now: Applied,
    jobs: &BTreeMap<JobId, Job>,
    policy: &proto::SchedulerPolicy,
    now_ms: u64,
) -> bool {
    let Some(last) = last_idle else { return true };
    if now_ms < last.at_ms || now_ms >= last.at_ms.saturating_add(PASS_REFRESH_MS) || last.wake_ms.is_some_and(|w| now_ms >= w) {
        return true;
    }
    if now.index == last.applied_index {
        return false;
    }
    let Some(room) = last.room else { return true };
    if now.index < last.applied_index || now.last_change_index > last.applied_index {
        return true;
    }
    if !jobs.range(last.next_job_id..).all(|(_, j)| stays_waiting(j, &room, policy)) {
        return true;
    }
    last.applied_index = now.index;
    last.next_job_id = last.next_job_id.max(now.next_job_id);
    false
}

/// Whether a job just submitted can neither start nor change another job's chances in a pass
/// that follows one which started nothing and left `room`, with nothing freed since: it is
/// held, or asks more of one node than `room` has; and it has no begin time (`wake_ms`), asks
/// for no MIG instances (they may relay a GPU out) and has a QoS that preempts nothing. Such a
/// job may take the backfill reservation from a job of lower priority, which matters only to
/// a job that waited for the reservation alone: then the pass left no room.
pub fn stays_waiting(job: &Job, room: &scheduler::Room, policy: &proto::SchedulerPolicy) -> bool {
    let spec = &job.spec;
    if job.state != JobState::Pending || spec.begin_ms.is_some() {
        return false;
    }
    if spec.hold {
        return true;
    }
    let qos = spec.qos.as_deref().unwrap_or(proto::DEFAULT_QOS);
    let preempts = policy.qos.iter().any(|q| q.name == qos && !q.preempt.is_empty());
    !preempts && room.excludes(spec)
}

/// A change of the voters: `promote` joins them, and `voters` is the whole new set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VoterChange {
    pub promote: NodeId,
    pub voters: BTreeSet<NodeId>,
}

/// Whether the leader `me` changes the voters now, one change at a time: it promotes
/// `candidate` (a healthy agent) while there are fewer than `voters_max`, or in place of a
/// voter DOWN for more than `replace_after_ms`. `down_ms` is how long each DOWN voter has been
/// down by the replicated state's clock. Two rules keep a restart from churning the voters:
/// - A voter's down time counts only from when this leader began (`leading_for_ms`), as a new
///   leader gives every node a fresh heartbeat grace period: after a whole-cluster stop every
///   node is DOWN (a graceful stop declares it so) until it registers again, which takes the
///   seconds a restart takes, not a failure.
/// - The leader never replaces itself: whatever its record says (a stop of its previous
///   instance can commit after it is back), it is up.
pub fn voter_change(
    me: NodeId,
    voters: &BTreeSet<NodeId>,
    voters_max: usize,
    candidate: Option<NodeId>,
    down_ms: &[(NodeId, u64)],
    leading_for_ms: u64,
    replace_after_ms: u64,
) -> Option<VoterChange> {
    let promote = candidate.filter(|c| !voters.contains(c))?;
    let mut next = voters.clone();
    if voters.len() < voters_max {
        next.insert(promote);
        return Some(VoterChange { promote, voters: next });
    }
    let (gone, _) =
        down_ms.iter().filter(|(id, _)| *id != me && voters.contains(id)).find(|(_, ms)| (*ms).min(leading_for_ms) > replace_after_ms)?;
    next.remove(gone);
    next.insert(promote);
    Some(VoterChange { promote, voters: next })
}

/// When each launch or stop was last sent, so it is re-sent only after `resend_after_ms`
/// without an answer the log shows. Entries older than that say nothing more than no entry
/// (the send is due either way) and [`Resend::prune`] drops them: the map holds at most what
/// one re-send period sent.
#[derive(Clone, Debug)]
pub struct Resend<K: Ord> {
    resend_after_ms: u64,
    sent_ms: BTreeMap<K, u64>,
}

impl<K: Ord> Resend<K> {
    pub fn new(resend_after_ms: u64) -> Resend<K> {
        Resend { resend_after_ms, sent_ms: BTreeMap::new() }
    }

    /// Whether `key` is due at `now_ms`; if so it counts as sent now.
    pub fn take_due(&mut self, key: K, now_ms: u64) -> bool {
        let due = self.sent_ms.get(&key).is_none_or(|sent| now_ms.saturating_sub(*sent) >= self.resend_after_ms);
        if due {
            self.sent_ms.insert(key, now_ms);
        }
        due
    }

    /// `key` was (also) sent at `now_ms`: the re-send counts from here.
    pub fn sent(&mut self, key: K, now_ms: u64) {
        let at = self.sent_ms.entry(key).or_insert(now_ms);
        *at = (*at).max(now_ms);
    }

    /// Drops the entries whose re-send is due anyway.
    pub fn prune(&mut self, now_ms: u64) {
        let after_ms = self.resend_after_ms;
        self.sent_ms.retain(|_, sent| now_ms.saturating_sub(*sent) < after_ms);
    }

    pub fn len(&self) -> usize {
        self.sent_ms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sent_ms.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proto::{Allocation, JobSpec, NodeRun};

    pub(crate) fn job_on(nodes: &[NodeId], batch: bool) -> Job {
        job(nodes, batch)
    }

    fn job(nodes: &[NodeId], batch: bool) -> Job {
        let mut spec = JobSpec::command(vec!["true".into()], "/tmp", "u");
        spec.set_batch(batch);
        Job {
            state: JobState::Running,
            run: 1,
            parts: nodes
                .iter()
                .map(|n| NodeRun { run: 1, alloc: Allocation { node: *n, gpus: Vec::new(), cpus: 1, mem_mib: 0 }, launched_by: None })
                .collect(),
            last_nodes: nodes.to_vec(),
            ..Job::submitted(1, std::sync::Arc::new(spec), 0)
        }
    }

    #[test]
    fn a_voter_down_is_replaced_only_once_down_for_the_grace_under_this_leader_and_never_the_leader() {
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        let change = |down: &[(NodeId, u64)], leading_for_ms| voter_change(1, &voters, 3, Some(4), down, leading_for_ms, 1_500);
        // Down long enough, under a leader that has led long enough: 2 gives way to 4.
        assert_eq!(change(&[(2, 1_501)], 60_000), Some(VoterChange { promote: 4, voters: [1, 3, 4].into() }));
        // Not yet down long enough.
        assert_eq!(change(&[(2, 1_500)], 60_000), None);
        // Down for long by the record, but this leader began a second ago (a whole-cluster
        // restart): the voter gets the grace period anew, and is replaced once it is over.
        assert_eq!(change(&[(2, 90_000)], 1_000), None);
        assert_eq!(change(&[(2, 90_000)], 1_501), Some(VoterChange { promote: 4, voters: [1, 3, 4].into() }));
        // The leader's own record says DOWN (its previous instance stopped): it stays.
        assert_eq!(change(&[(1, 90_000)], 60_000), None);
        assert_eq!(change(&[(1, 90_000), (3, 90_000)], 60_000), Some(VoterChange { promote: 4, voters: [1, 2, 4].into() }));
        // No healthy agent, or one that already votes: nothing changes.
        assert_eq!(voter_change(1, &voters, 3, None, &[(2, 90_000)], 60_000, 1_500), None);
        assert_eq!(voter_change(1, &voters, 3, Some(3), &[(2, 90_000)], 60_000, 1_500), None);
    }

    #[test]
    fn a_queue_of_held_jobs_alone_needs_no_pass() {
        let mut held = job(&[], false);
        held.state = JobState::Pending;
        std::sync::Arc::make_mut(&mut held.spec).hold = true;
        let running = job(&[3], false);
        assert!(!pass_needed([&held, &running].into_iter(), std::iter::empty()));
        let mut waiting = held.clone();
        std::sync::Arc::make_mut(&mut waiting.spec).hold = false;
        assert!(pass_needed([&held, &waiting].into_iter(), std::iter::empty()));
        assert!(!pass_needed(std::iter::empty(), std::iter::empty()));
    }

    #[test]
    fn a_pass_that_changed_nothing_runs_again_on_a_change_a_wake_time_or_the_refresh() {
        let (jobs, policy) = (BTreeMap::new(), proto::SchedulerPolicy::default());
        let at = |index: u64, last_change_index: u64| Applied { index, last_change_index, next_job_id: 1 };
        let due = |idle: Option<IdlePass>, now: Applied, now_ms: u64| pass_due(idle.clone().as_mut(), now, &jobs, &policy, now_ms);
        assert!(due(None, at(7, 7), 1_000), "after a pass that changed something");
        let room = Some(scheduler::Room { gpus: 0, shards: 0, cpus: 64, mem_mib: 1 << 20 });
        let idle = Some(IdlePass { applied_index: 7, next_job_id: 1, at_ms: 1_000, wake_ms: Some(1_300), room });
        assert!(!due(idle, at(7, 7), 1_000));
        assert!(!due(idle, at(7, 7), 1_299), "nothing changed yet");
        assert!(due(idle, at(7, 7), 1_300), "a job's begin time");
        assert!(due(idle, at(8, 8), 1_001), "a new entry that did more than submit");
        assert!(!due(idle, at(8, 7), 1_001), "an entry that submitted no job that could start");
        assert!(due(idle, at(6, 6), 1_001), "an older state (a snapshot installed)");
        let idle = idle.map(|i| IdlePass { wake_ms: None, ..i });
        assert!(!due(idle, at(7, 7), 1_000 + PASS_REFRESH_MS - 1));
        assert!(due(idle, at(7, 7), 1_000 + PASS_REFRESH_MS), "time's slow drifts");
        assert!(due(idle, at(7, 7), 999), "a clock stepped back");
        let no_room = idle.map(|i| IdlePass { room: None, ..i });
        assert!(due(no_room, at(8, 7), 1_001), "a job waited for the reservation alone: any submission may move it");
    }

    #[test]
    fn submissions_that_cannot_start_in_the_room_left_run_no_pass() {
        let mut policy = proto::SchedulerPolicy::default();
        policy.qos.push(proto::QosDef { name: "high".into(), preempt: vec!["normal".into()], ..Default::default() });
        let submitted = |id: JobId, gres: &str, edit: &dyn Fn(&mut JobSpec)| {
            let mut spec = JobSpec::command(vec!["true".into()], "/tmp", "u");
            spec.gres = (!gres.is_empty()).then(|| proto::GresRequest::parse(gres).expect("gres"));
            spec.mem_mib = 1024;
            edit(&mut spec);
            (id, Job::submitted(id, std::sync::Arc::new(spec), 5))
        };
        let room = scheduler::Room { gpus: 2, shards: 0, cpus: 64, mem_mib: 1 << 20 };
        let idle = IdlePass { applied_index: 7, next_job_id: 10, at_ms: 1_000, wake_ms: None, room: Some(room) };
        let now = Applied { index: 9, last_change_index: 7, next_job_id: 12 };
        let due_with = |second: (JobId, Job)| {
            let jobs: BTreeMap<JobId, Job> = [submitted(10, "gpu:4", &|_| {}), second].into();
            let mut last = idle;
            let due = pass_due(Some(&mut last), now, &jobs, &policy, 1_100);
            (due, last)
        };
        let (due, moved) = due_with(submitted(11, "gpu:8", &|_| {}));
        assert!(!due, "neither fits the 2 GPUs left");
        assert_eq!((moved.applied_index, moved.next_job_id, moved.at_ms), (9, 12, 1_000), "moved on; the refresh stays due at 2,000");
        assert!(due_with(submitted(11, "gpu:2", &|_| {})).0, "fits the room");
        assert!(!due_with(submitted(11, "gpu:2", &|s| s.hold = true)).0, "held");
        assert!(due_with(submitted(11, "gpu:4", &|s| s.begin_ms = Some(2_000))).0, "a begin time: a new wake time");
        assert!(due_with(submitted(11, "gpu:4", &|s| s.qos = Some("high".into()))).0, "its QoS preempts");
        assert!(due_with(submitted(11, "gpu:1g.18gb:1", &|_| {})).0, "MIG instances: a relayout");
        assert!(!due_with(submitted(11, "", &|s| s.cpus_per_task = 65)).0, "more CPUs than any node has free");
        assert!(due_with(submitted(11, "", &|_| {})).0, "no GPU, and the CPUs and memory are free");
        // Jobs the last call looked at are not looked at again.
        let jobs: BTreeMap<JobId, Job> = [submitted(10, "gpu:1", &|_| {})].into();
        let mut last = IdlePass { next_job_id: 11, ..idle };
        assert!(!pass_due(Some(&mut last), now, &jobs, &policy, 1_100));
    }

    #[test]
    fn due_nodes_wait_while_others_still_return_for_six_grace_periods_at_most() {
        assert!(!is_return(2_250, 4_500) && is_return(2_251, 4_500));
        let silent = [(1, 5_000), (2, 100), (3, 4_000)];
        // A node returned 1 s ago: node 1 (due) waits; the others are not due.
        let returning = Rejoin { leading_for_ms: 5_000, quiet_ms: 1_000 };
        let (judged, held) = rejoin_held(silent.to_vec(), returning, 4_500);
        assert_eq!((judged.clone(), held), (vec![(2, 100), (3, 4_000)], vec![1]));
        assert_eq!(nodes_down(&judged, 4_500, 0), DownVerdict::default());
        // Returns stopped half a grace ago: every node is judged.
        let settled = Rejoin { leading_for_ms: 5_000, quiet_ms: 2_250 };
        assert_eq!(rejoin_held(silent.to_vec(), settled, 4_500), (silent.to_vec(), vec![]));
        assert_eq!(nodes_down(&silent, 4_500, 0).down, vec![1]);
        // Still returning after six grace periods: judged all the same.
        let late = Rejoin { leading_for_ms: 6 * 4_500 + 1, quiet_ms: 0 };
        assert_eq!(rejoin_held(silent.to_vec(), Rejoin { leading_for_ms: 6 * 4_500, ..late }, 4_500).1, vec![1]);
        assert_eq!(rejoin_held(silent.to_vec(), late, 4_500), (silent.to_vec(), vec![]));
    }

    #[test]
    fn fewer_voters_than_the_most_take_a_healthy_agent_at_once() {
        let voters: BTreeSet<NodeId> = [1].into();
        assert_eq!(voter_change(1, &voters, 3, Some(7), &[], 0, 1_500), Some(VoterChange { promote: 7, voters: [1, 7].into() }));
        assert_eq!(voter_change(1, &voters, 1, Some(7), &[], 0, 1_500), None);
    }

    #[test]
    fn a_batch_script_starts_after_every_other_node_holds_its_share() {
        let mut j = job(&[3, 4, 5], true);
        assert_eq!(launch_targets(&j), vec![4, 5]);
        j.parts[1].launched_by = Some(9);
        assert_eq!(launch_targets(&j), vec![5]);
        j.parts[2].launched_by = Some(9);
        assert_eq!(launch_targets(&j), vec![3]);
        // Not a batch script: every node at once.
        assert_eq!(launch_targets(&job(&[3, 4, 5], false)), vec![3, 4, 5]);
    }

    #[test]
    fn a_requeued_job_gets_its_signal_first_unless_it_asked_for_the_requeue() {
        let mut j = job(&[3, 4], false);
        assert!(stops(&j).is_empty());
        j.state = JobState::Pending;
        std::sync::Arc::make_mut(&mut j.spec).signal = Some(proto::SignalSpec { signal: 10, before_end_s: 60, batch_only: false });
        assert_eq!(stops(&j), vec![StopOrder { run: 1, node: 3, checkpoint: true }, StopOrder { run: 1, node: 4, checkpoint: true }]);
        j.reasons.push(format!("by alice: {}", proto::REQUEUED_ON_REQUEST));
        assert!(stops(&j).iter().all(|s| !s.checkpoint));
    }

    #[test]
    fn a_pass_sends_what_is_due_once_per_resend_period() {
        let mut gang = job(&[3, 4], false);
        let mut done = job(&[5], false);
        done.parts.clear();
        let (mut launches, mut stops_sent) = (Resend::new(1_000), Resend::new(1_000));
        let first = due_orders([&gang, &done].into_iter(), &mut launches, &mut stops_sent, 0);
        assert_eq!(first.launches, vec![(1, 3), (1, 4)]);
        assert!(first.stops.is_empty());
        assert_eq!(due_orders([&gang].into_iter(), &mut launches, &mut stops_sent, 999), Orders::default());
        gang.parts[0].launched_by = Some(7);
        assert_eq!(due_orders([&gang].into_iter(), &mut launches, &mut stops_sent, 1_000).launches, vec![(1, 4)]);
        gang.state = JobState::Cancelled;
        let cancelled = due_orders([&gang].into_iter(), &mut launches, &mut stops_sent, 1_001);
        assert!(cancelled.launches.is_empty());
        assert_eq!(cancelled.stops.iter().map(|(_, s)| s.node).collect::<Vec<_>>(), vec![3, 4]);
    }

    #[test]
    fn each_node_of_a_suspended_run_is_told_until_its_present_instance_acknowledges() {
        let mut j = job(&[3, 4], true);
        let (mut acked, mut sent) = (SuspendAcks::new(), Resend::new(1_000));
        let instance = |n: NodeId| Some(n * 10);
        // Never suspended: nothing to say.
        j.parts[0].launched_by = Some(30);
        assert!(due_suspends([&j].into_iter(), &mut acked, &mut sent, instance, 0).is_empty());
        j.suspension = proto::Suspension { since_ms: Some(5), paused_ms: 0, changes: 1 };
        // Only the part that started (node 4's launch is not confirmed yet).
        let first = due_suspends([&j].into_iter(), &mut acked, &mut sent, instance, 0);
        assert_eq!(first, vec![(1, SuspendOrder { run: 1, node: 3, suspend: true, paused_ms: 0, change: 1, instance: 30 })]);
        assert!(due_suspends([&j].into_iter(), &mut acked, &mut sent, instance, 999).is_empty(), "sent within the period");
        j.parts[1].launched_by = Some(40);
        assert_eq!(due_suspends([&j].into_iter(), &mut acked, &mut sent, instance, 999).len(), 1, "node 4 started: told at once");
        acked.insert((1, 1, 3), (1, 30));
        acked.insert((1, 1, 4), (1, 40));
        assert!(due_suspends([&j].into_iter(), &mut acked, &mut sent, instance, 5_000).is_empty());
        // Resumed: a new change for both; node 3 restarted (instance 31): told again.
        j.suspension = proto::Suspension { since_ms: None, paused_ms: 700, changes: 2 };
        let resumed = due_suspends([&j].into_iter(), &mut acked, &mut sent, |n| Some(if n == 3 { 31 } else { n * 10 }), 6_000);
        assert_eq!(
            resumed.iter().map(|(_, o)| (o.node, o.suspend, o.paused_ms, o.instance)).collect::<Vec<_>>(),
            vec![(3, false, 700, 31), (4, false, 700, 40)]
        );
        // The run ended: its acknowledgements go.
        j.state = JobState::Completed;
        assert!(due_suspends([&j].into_iter(), &mut acked, &mut sent, instance, 9_000).is_empty());
        assert!(acked.is_empty());
    }

    #[test]
    fn a_send_is_due_again_after_the_resend_period_and_old_entries_go() {
        let mut resend = Resend::new(1_000);
        assert!(resend.take_due((1, 1), 0));
        assert!(!resend.take_due((1, 1), 999));
        resend.sent((1, 1), 500);
        assert!(!resend.take_due((1, 1), 1_499));
        assert!(resend.take_due((1, 1), 1_500));
        assert!(resend.take_due((2, 1), 1_500));
        resend.prune(2_499);
        assert_eq!(resend.len(), 2);
        resend.prune(2_500);
        assert!(resend.is_empty());
    }

    #[test]
    fn silent_nodes_are_declared_down_after_the_grace_period() {
        let silent = [(1, 3_999), (2, 4_001), (3, 10), (4, 9_000)];
        assert_eq!(nodes_down(&silent, 4_000, 0), DownVerdict { down: vec![2, 4], held: vec![] });
        assert_eq!(nodes_down(&[], 4_000, 0), DownVerdict::default());
        // A small cluster loses a node at once, whatever the share: 1 of 3.
        assert_eq!(nodes_down(&[(1, 5_000), (2, 0), (3, 0)], 4_000, 0).down, vec![1]);
    }

    #[test]
    fn a_mass_silence_waits_for_a_second_grace_period() {
        // 1,000 nodes, 150 unheard past the grace period (a leader starved or just elected):
        // held, except those unheard for two grace periods.
        let mut silent: Vec<(NodeId, u64)> = (1..=1000).map(|n| (n, 100)).collect();
        for (n, ms) in silent.iter_mut().take(150) {
            *ms = if *n <= 5 { 8_001 } else { 4_500 };
        }
        let verdict = nodes_down(&silent, 4_000, 0);
        assert_eq!(verdict.down, vec![1, 2, 3, 4, 5]);
        assert_eq!(verdict.held, (6..=150).collect::<Vec<_>>());
        // At the bound (MASS_DOWN_PERCENT of the nodes, or MASS_DOWN_MIN) it is no mass yet.
        let hundred: Vec<(NodeId, u64)> = (1..=1000).map(|n| (n, if n <= 100 { 4_500 } else { 0 })).collect();
        assert_eq!(nodes_down(&hundred, 4_000, 0).down.len(), 100);
        let eight: Vec<(NodeId, u64)> = (1..=10).map(|n| (n, if n <= 8 { 4_500 } else { 0 })).collect();
        assert_eq!(nodes_down(&eight, 4_000, 0).down.len(), 8);
        let nine: Vec<(NodeId, u64)> = (1..=10).map(|n| (n, if n <= 9 { 4_500 } else { 0 })).collect();
        assert_eq!(nodes_down(&nine, 4_000, 0), DownVerdict { down: vec![], held: (1..=9).collect() });
    }

    #[test]
    fn a_silence_that_spreads_pass_by_pass_is_a_mass_too() {
        // A few nodes at a time, each pass under the bound: the nodes declared down within the
        // grace period count, so the spread stops at the bound instead of taking the fleet.
        let mut recent = 0;
        let mut declared = 0;
        for pass in 0..50u64 {
            let silent: Vec<(NodeId, u64)> =
                (1..=1000u64).filter(|n| *n > declared).map(|n| (n, if n <= declared + 20 { 4_100 + pass } else { 0 })).collect();
            let verdict = nodes_down(&silent, 4_000, recent);
            recent += verdict.down.len();
            declared += verdict.down.len() as u64;
            if !verdict.held.is_empty() {
                break;
            }
        }
        assert_eq!(declared, 100, "declared down before the mass rule held the rest");
    }
}
