//! Raft groups of real nodes (RocksDB in temp dirs) over an in-memory transport.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use consensus::{
    handle_raft_rpc, open_raft, propose, raft_status, MemberNode, Raft, RaftTimings, RaftTransport, StateHandle, TransportError,
};
use corral_consensus as consensus;
use proto::{Command, CommandResult, JobSpec, NodeId, RaftRpcKind};

const WAIT_MS: u64 = 20_000;

/// Delivers each RPC to the target's Raft in this process; a node not in the map is down.
#[derive(Clone, Default)]
struct Router {
    nodes: Arc<Mutex<BTreeMap<NodeId, (Raft, StateHandle)>>>,
}

impl Router {
    fn add(&self, id: NodeId, raft: Raft, handle: &StateHandle) {
        self.nodes.lock().expect("router lock").insert(id, (raft, handle.clone()));
    }

    fn remove(&self, id: NodeId) -> Option<Raft> {
        self.nodes.lock().expect("router lock").remove(&id).map(|(raft, _)| raft)
    }
}

impl RaftTransport for Router {
    fn call(
        &self,
        target: NodeId,
        _node: &MemberNode,
        kind: RaftRpcKind,
        payload: Vec<u8>,
    ) -> impl Future<Output = Result<Vec<u8>, TransportError>> + Send {
        let raft = self.nodes.lock().expect("router lock").get(&target).cloned();
        async move {
            let (raft, handle) = raft.ok_or_else(|| TransportError::Unreachable(format!("node {target} is down")))?;
            handle_raft_rpc(&raft, handle.snapshot_inbox(), kind, &payload).await.map_err(|e| TransportError::Remote(e.to_string()))
        }
    }
}

fn member(id: NodeId) -> MemberNode {
    MemberNode { name: format!("n{id}"), addr: format!("127.0.0.1:{}", 7000 + id) }
}

/// Short enough that a failover takes about a second; long enough that a 2-core CI host running
/// other tests does not stall heartbeats past an election timeout (openraft's leader lease is
/// `election_timeout_max_ms`: past it without quorum acks the leader refuses writes).
fn timings() -> RaftTimings {
    RaftTimings {
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: 800,
        election_timeout_max_ms: 1_200,
        snapshot_logs_since_last: 10,
        max_in_snapshot_log_to_keep: 0,
    }
}

fn spec(n: u32) -> JobSpec {
    let mut spec = JobSpec::command(vec!["sleep".into(), n.to_string()], "/tmp", "tester");
    spec.name = format!("job-{n}");
    spec.mem_mib = 64;
    spec
}

/// Polls `done` every 20 ms until it holds; panics after `WAIT_MS`.
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until one of `rafts` is leader and all of them agree on it; returns its id.
async fn wait_leader(rafts: &BTreeMap<NodeId, Raft>) -> NodeId {
    let mut leader = None;
    wait_until("a leader all nodes agree on", || {
        let statuses: Vec<_> = rafts.values().map(raft_status).collect();
        let Some(l) = statuses.iter().find(|s| s.is_leader).map(|s| s.id) else {
            return false;
        };
        leader = Some(l);
        statuses.iter().all(|s| s.leader == Some(l))
    })
    .await;
    leader.expect("leader")
}

/// Waits until `raft` leads and has committed its term's first entry, which commits the
/// membership `initialize` wrote before it: until then openraft refuses a membership change
/// (`add_learner`) as `InProgress`, and a loaded host can take that long between the two.
async fn wait_leads_with_membership_committed(raft: &Raft) {
    wait_until("node leads and committed its first entry", || {
        let status = raft_status(raft);
        status.is_leader && status.applied_index.is_some_and(|index| index >= 1)
    })
    .await;
}

/// Adds `id` as a learner through `leader`, retrying while openraft refuses the change as
/// `InProgress`: a membership entry not yet committed in the leader's term (a new leader commits
/// its first entry a moment after it wins). Gives up after `WAIT_MS`.
async fn add_learner(leader: &Raft, id: NodeId) {
    use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        match leader.add_learner(id, member(id), true).await {
            Ok(_) => return,
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(ChangeMembershipError::InProgress(_))))
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("add learner {id}: {e:?}"),
        }
    }
}

async fn submit(raft: &Raft, n: u32) -> (u64, u64) {
    match propose(raft, Command::Submit { spec: spec(n), now_ms: 1_000 + u64::from(n) }).await {
        Ok((index, CommandResult::Submitted { job })) => (index, job),
        other => panic!("submit {n} failed: {other:?}"),
    }
}

/// Submits job `n` through the group's leader, as a client does: a `NotLeader` reply means
/// openraft refused the write before appending it (no leader known, or the leader's lease
/// lapsed because a loaded host delayed the quorum's acks), so it waits for a leader again and
/// retries. Gives up after `WAIT_MS`.
async fn submit_to_leader(rafts: &BTreeMap<NodeId, Raft>, n: u32) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS);
    loop {
        let leader = wait_leader(rafts).await;
        match propose(&rafts[&leader], Command::Submit { spec: spec(n), now_ms: 1_000 + u64::from(n) }).await {
            Ok((index, CommandResult::Submitted { job })) => return (index, job),
            Err(consensus::ProposeError::NotLeader { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("submit {n} through leader {leader} failed: {other:?}"),
        }
    }
}

/// Waits until every handle applied `index` and all digests are equal; returns the digest.
async fn wait_converged(handles: &[&StateHandle], index: u64) -> String {
    for h in handles {
        assert!(h.wait_applied(index, Duration::from_millis(WAIT_MS)).await, "apply of {index} timed out");
    }
    let mut digest = String::new();
    wait_until("equal digests", || {
        let digests: BTreeSet<String> = handles.iter().map(|h| h.read(|s| s.digest())).collect();
        digest = digests.iter().next().cloned().unwrap_or_default();
        digests.len() == 1
    })
    .await;
    digest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_replicate_fail_over_and_a_late_node_catches_up_by_snapshot() {
    let router = Router::default();
    let dirs: BTreeMap<NodeId, tempfile::TempDir> = (1..=4).map(|id| (id, tempfile::tempdir().expect("tempdir"))).collect();
    let mut rafts = BTreeMap::new();
    let mut handles = BTreeMap::new();
    for id in 1..=3 {
        let (raft, handle) = open_raft(id, dirs[&id].path(), router.clone(), timings(), Default::default()).await.expect("open raft");
        router.add(id, raft.clone(), &handle);
        rafts.insert(id, raft);
        handles.insert(id, handle);
    }

    rafts[&1].initialize(BTreeMap::from([(1, member(1))])).await.expect("initialize");
    wait_leads_with_membership_committed(&rafts[&1]).await;
    for id in [2, 3] {
        add_learner(&rafts[&1], id).await;
    }
    rafts[&1].change_membership(BTreeSet::from([1, 2, 3]), false).await.expect("change membership");
    let status = raft_status(&rafts[&1]);
    assert_eq!(status.voters.iter().map(|v| v.0).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(status.learners.is_empty());

    let mut last_index = 0;
    for n in 0..15 {
        let (index, job) = submit_to_leader(&rafts, n).await;
        assert_eq!(job, u64::from(n) + 1);
        last_index = index;
    }
    let all: Vec<&StateHandle> = handles.values().collect();
    let digest = wait_converged(&all, last_index).await;
    assert_eq!(handles[&2].read(|s| s.jobs.len()), 15);

    // A follower refuses writes and names the leader.
    match propose(&rafts[&2], Command::Cancel { job: 1, now_ms: 0 }).await {
        Err(consensus::ProposeError::NotLeader { leader: Some(1), leader_node: Some(node) }) => {
            assert_eq!(node, member(1))
        }
        other => panic!("expected NotLeader, got {other:?}"),
    }

    // Kill the leader: the other two elect a new one and keep accepting writes.
    let old = router.remove(1).expect("node 1");
    old.shutdown().await.expect("shutdown node 1");
    rafts.remove(&1);
    handles.remove(&1);
    let leader = wait_leader(&rafts).await;
    assert_ne!(leader, 1);
    for n in 15..40 {
        let (index, job) = submit_to_leader(&rafts, n).await;
        assert_eq!(job, u64::from(n) + 1);
        last_index = index;
    }
    let alive: Vec<&StateHandle> = handles.values().collect();
    let digest_after = wait_converged(&alive, last_index).await;
    assert_ne!(digest_after, digest);

    // Snapshots were built and the log purged, so a new node can only catch up by snapshot.
    wait_until("leader purged its log", || raft_status(&rafts[&leader]).purged_index.is_some()).await;
    let (raft4, handle4) = open_raft(4, dirs[&4].path(), router.clone(), timings(), Default::default()).await.expect("open raft 4");
    router.add(4, raft4.clone(), &handle4);
    let leader = wait_leader(&rafts).await;
    add_learner(&rafts[&leader], 4).await;
    let (index, _) = submit_to_leader(&rafts, 40).await;
    let alive: Vec<&StateHandle> = handles.values().chain([&handle4]).collect();
    let digest4 = wait_converged(&alive, index).await;
    assert_eq!(handle4.read(|s| s.jobs.len()), 41);
    assert_eq!(handle4.read(|s| s.digest()), digest4);
    assert!(raft_status(&raft4).snapshot_index.is_some(), "node 4 installed a snapshot");

    for raft in rafts.values().chain([&raft4]) {
        raft.shutdown().await.expect("shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_keeps_its_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let router = Router::default();
    // Few logs per snapshot so the restart goes through snapshot + re-applied log.
    let timings = RaftTimings { snapshot_logs_since_last: 7, max_in_snapshot_log_to_keep: 2, ..timings() };
    let (raft, handle) = open_raft(1, dir.path(), router.clone(), timings.clone(), Default::default()).await.expect("open raft");
    router.add(1, raft.clone(), &handle);
    raft.initialize(BTreeMap::from([(1, member(1))])).await.expect("initialize");
    wait_leads_with_membership_committed(&raft).await;
    let mut last_index = 0;
    for n in 0..20 {
        last_index = submit(&raft, n).await.0;
    }
    assert!(handle.wait_applied(last_index, Duration::from_millis(WAIT_MS)).await);
    let digest = handle.read(|s| s.digest());
    assert_eq!(handle.read(|s| s.jobs.len()), 20);
    router.remove(1);
    raft.shutdown().await.expect("shutdown");
    drop(raft);

    let (raft, handle) = open_raft(1, dir.path(), router.clone(), timings, Default::default()).await.expect("reopen raft");
    router.add(1, raft.clone(), &handle);
    assert!(handle.wait_applied(last_index, Duration::from_millis(WAIT_MS)).await, "re-applied after restart");
    assert_eq!(handle.read(|s| s.digest()), digest);
    wait_until("node 1 leads again", || raft_status(&raft).is_leader).await;
    let (_, job) = submit(&raft, 99).await;
    assert_eq!(job, 21);
    // A peer's garbage is refused, not a panic.
    let garbage = handle_raft_rpc(&raft, handle.snapshot_inbox(), RaftRpcKind::AppendEntries, &[proto::PROTOCOL_VERSION, 0xff]).await;
    assert!(matches!(garbage, Err(proto::ApiError::Invalid(_))), "{garbage:?}");
    raft.shutdown().await.expect("shutdown");
}

/// A job spec whose accounting record is about 20 KB (its argument list), so a few hundred of
/// them make a snapshot of several chunks.
fn big_spec(n: u32) -> JobSpec {
    let mut spec = spec(n);
    spec.argv = vec!["echo".into(), "x".repeat(20_000)];
    spec.user = if n.is_multiple_of(2) { "alice".into() } else { "bob".into() };
    spec
}

async fn commit(raft: &Raft, cmd: Command) -> u64 {
    match propose(raft, cmd).await {
        Ok((index, CommandResult::Ok)) => index,
        other => panic!("command failed: {other:?}"),
    }
}

/// Waits until every handle applied `index` and all accounting digests are equal; returns the
/// record count.
async fn wait_accounting_converged(handles: &[&StateHandle], index: u64) -> u64 {
    for h in handles {
        assert!(h.wait_applied(index, Duration::from_millis(WAIT_MS)).await, "apply of {index} timed out");
    }
    let mut count = 0;
    wait_until("equal accounting digests", || {
        let digests: BTreeSet<(u64, String)> = handles.iter().map(|h| h.accounting_digest().expect("accounting digest")).collect();
        count = digests.iter().next().map_or(0, |d| d.0);
        digests.len() == 1
    })
    .await;
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finished_jobs_leave_the_hot_state_and_a_new_voter_gets_them_by_a_streamed_snapshot() {
    let router = Router::default();
    let dirs: BTreeMap<NodeId, tempfile::TempDir> = (1..=3).map(|id| (id, tempfile::tempdir().expect("tempdir"))).collect();
    let mut rafts = BTreeMap::new();
    let mut handles = BTreeMap::new();
    for id in 1..=2 {
        let (raft, handle) = open_raft(id, dirs[&id].path(), router.clone(), timings(), Default::default()).await.expect("open raft");
        router.add(id, raft.clone(), &handle);
        rafts.insert(id, raft);
        handles.insert(id, handle);
    }
    rafts[&1].initialize(BTreeMap::from([(1, member(1))])).await.expect("initialize");
    wait_leads_with_membership_committed(&rafts[&1]).await;
    add_learner(&rafts[&1], 2).await;
    rafts[&1].change_membership(BTreeSet::from([1, 2]), false).await.expect("change membership");

    let jobs = 300u32;
    for n in 0..jobs {
        submit_spec(&rafts[&1], big_spec(n)).await;
    }
    // 250 end (cancelled while pending: final, holding nothing) and move to the store.
    for job in 1..=250 {
        commit(&rafts[&1], Command::Cancel { job, now_ms: 5_000 }).await;
    }
    let archivable = handles[&1].read(|s| s.archivable(5_000 + 300_000, 300_000, proto::ARCHIVE_BATCH_MAX));
    assert_eq!(archivable, (1..=250).collect::<Vec<u64>>());
    assert!(handles[&1].read(|s| s.archivable(5_000 + 299_999, 300_000, 10)).is_empty(), "younger than min_job_age");
    // A stale list is harmless: pending job 300 is not archived.
    let mut ids = archivable.clone();
    ids.push(300);
    let index = commit(&rafts[&1], Command::ArchiveJobs { jobs: ids, now_ms: 305_000 }).await;
    let all: Vec<&StateHandle> = handles.values().collect();
    assert_eq!(wait_accounting_converged(&all, index).await, 250);
    for h in &all {
        assert_eq!(h.read(|s| s.jobs.len()), 50, "the hot state keeps the live jobs only");
    }

    // Queries page through both in id order; a finished job is found by id without its script
    // and environment; user filters use the index.
    let h = &handles[&2];
    let record = h.job(7).expect("read job 7").expect("job 7 archived");
    assert_eq!(record.state, proto::JobState::Cancelled);
    assert_eq!(record.spec.name, "job-6");
    let mut seen = Vec::new();
    let mut query =
        proto::JobQuery { users: vec!["alice".into()], live: true, finished: true, history: true, limit: 40, ..Default::default() };
    loop {
        let (page, next) = h.query_jobs(&query).expect("query");
        assert!(page.len() <= 40);
        seen.extend(page.iter().map(|j| j.id));
        match next {
            Some(after) => query.after = after,
            None => break,
        }
    }
    let alice: Vec<u64> = (1..=u64::from(jobs)).filter(|id| id % 2 == 1).collect();
    assert_eq!(seen, alice, "alice's jobs (odd ids), live and finished, each once");
    let only_finished = proto::JobQuery { ids: vec![260, 5], finished: true, history: true, ..Default::default() };
    assert_eq!(h.query_jobs(&only_finished).expect("query").0.iter().map(|j| j.id).collect::<Vec<_>>(), vec![5]);

    // The log is purged past the archive, so a new voter catches up by a snapshot that streams
    // the 250 records (about 5 MB, several chunks) after the hot state.
    for n in 0..12 {
        submit_spec(&rafts[&1], spec(1000 + n)).await;
    }
    wait_until("leader purged its log", || raft_status(&rafts[&1]).purged_index.is_some_and(|p| p > index)).await;
    let (raft3, handle3) = open_raft(3, dirs[&3].path(), router.clone(), timings(), Default::default()).await.expect("open raft 3");
    router.add(3, raft3.clone(), &handle3);
    add_learner(&rafts[&1], 3).await;
    rafts[&1].change_membership(BTreeSet::from([1, 2, 3]), false).await.expect("promote 3");
    let (index, _) = submit_spec(&rafts[&1], spec(2000)).await;
    let all: Vec<&StateHandle> = handles.values().chain([&handle3]).collect();
    assert_eq!(wait_accounting_converged(&all, index).await, 250);
    wait_converged(&all, index).await;
    assert!(raft_status(&raft3).snapshot_index.is_some(), "node 3 installed a snapshot");
    assert_eq!(handle3.job(7).expect("read job 7").map(|j| j.state), Some(proto::JobState::Cancelled));

    // Pruning deletes the named records everywhere; the new voter keeps them across a restart.
    let prune: Vec<u64> = (1..=100).collect();
    let index = commit(&rafts[&1], Command::PruneAccounting { jobs: prune, now_ms: 400_000 }).await;
    assert_eq!(wait_accounting_converged(&all, index).await, 150);
    router.remove(3);
    raft3.shutdown().await.expect("shutdown 3");
    drop(raft3);
    drop(handle3);
    let (raft3, handle3) = open_raft(3, dirs[&3].path(), router.clone(), timings(), Default::default()).await.expect("reopen raft 3");
    router.add(3, raft3.clone(), &handle3);
    let (index, _) = submit_spec(&rafts[&1], spec(3000)).await;
    let all: Vec<&StateHandle> = handles.values().chain([&handle3]).collect();
    assert_eq!(wait_accounting_converged(&all, index).await, 150);
    wait_converged(&all, index).await;
    assert!(handle3.job(50).expect("read").is_none(), "pruned");
    for raft in rafts.values().chain([&raft3]) {
        raft.shutdown().await.expect("shutdown");
    }
}

async fn submit_spec(raft: &Raft, spec: JobSpec) -> (u64, u64) {
    match propose(raft, Command::Submit { spec, now_ms: 1_000 }).await {
        Ok((index, CommandResult::Submitted { job })) => (index, job),
        other => panic!("submit failed: {other:?}"),
    }
}
