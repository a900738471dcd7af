//! A job's rendezvous store on this node: where the job's torchrun agents meet
//! (`--rdzv_backend=c10d`), served in torch's own `TCPStore` protocol (`wire`) on a loopback
//! port of each of the job's nodes and kept in the replicated state (`Command::Store`), so the
//! rendezvous outlives any node of the job, the first one's too. A part's processes find it in
//! `PET_RDZV_ENDPOINT` (torchrun's `--rdzv_endpoint`) and `CORRAL_RDZV_ENDPOINT`.
//!
//! Every write is a log entry, every read a question to the leader: a rendezvous asks a few
//! times a second per node. `wait` asks again with a growing pause (`WAIT_POLL_MS_*`) until
//! its keys are there or the client cancels it. Unlike torch's own store it answers only the
//! job's user's processes and root's (`peer`: the owner of the connecting socket).

mod peer;
pub mod wire;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{ApiError, JobId, PeerRequest, Reply, RunNo, StoreAnswer, StoreOp};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

use crate::link::{LeaderLink, LinkError};
use wire::Query;

/// Connections one part's store serves at once at most (a torchrun agent holds two or three).
const CONNECTIONS_MAX: usize = 256;
/// How often the endpoint checks that its part still runs here.
const ALIVE_POLL_MS: u64 = 500;
/// How long an endpoint waits for its part to be listed before it gives up on it.
const START_GRACE_MS: u64 = 30_000;
/// The first and the longest pause of a `wait` between two questions to the leader.
const WAIT_POLL_MS_FIRST: u64 = 10;
const WAIT_POLL_MS_MAX: u64 = 100;
/// How long an operation is asked again while no leader answers (a failover).
const CALL_PATIENCE_MS: u64 = 30_000;

/// The uid a run's processes have: its account's, or this daemon's where it runs jobs as itself.
pub fn run_uid(run_as: Option<&crate::run::identity::Account>) -> u32 {
    // SAFETY: geteuid has no preconditions.
    run_as.map_or_else(|| unsafe { libc::geteuid() }, |a| a.uid)
}

/// The endpoints of the parts this node runs, and the link they ask the leader through.
#[derive(Default)]
pub struct Stores {
    link: Arc<OnceLock<Arc<LeaderLink>>>,
}

impl Stores {
    /// The link to the leader, set once at start (runs taken over from the previous daemon may
    /// open their endpoints before: their queries wait for it).
    pub fn set_link(&self, link: Arc<LeaderLink>) {
        let _ = self.link.set(link);
    }

    /// Opens the store endpoint of `job`'s run `run` on this node: a loopback port (`at`, for a
    /// run taken over from the previous daemon, whose processes know its address) served to
    /// processes of user `uid` (and root) until `alive` says the part no longer runs here (or,
    /// if it never did, after a grace).
    pub fn open(
        &self,
        job: JobId,
        run: RunNo,
        uid: u32,
        at: Option<SocketAddr>,
        alive: impl Fn() -> bool + Send + Sync + 'static,
    ) -> anyhow::Result<SocketAddr> {
        let link = Arc::clone(&self.link);
        let at = at.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listener = std::net::TcpListener::bind(at).with_context(|| format!("bind a rendezvous store's port at {at}"))?;
        listener.set_nonblocking(true).context("make a rendezvous store's port non-blocking")?;
        let addr = listener.local_addr().context("read a rendezvous store's port")?;
        let listener = TcpListener::from_std(listener).context("register a rendezvous store's port")?;
        info!(job, run, %addr, "rendezvous store endpoint open");
        tokio::spawn(serve(listener, Part { job, run, uid, link }, alive));
        Ok(addr)
    }
}

/// Whose store an endpoint serves.
#[derive(Clone)]
struct Part {
    job: JobId,
    run: RunNo,
    /// The job's user: only its processes (and root's) are answered.
    uid: u32,
    link: Arc<OnceLock<Arc<LeaderLink>>>,
}

async fn serve(listener: TcpListener, part: Part, alive: impl Fn() -> bool + Send + Sync + 'static) {
    let mut connections = tokio::task::JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(ALIVE_POLL_MS));
    let opened = Instant::now();
    let mut seen = false;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) if connections.len() < CONNECTIONS_MAX => {
                    connections.spawn(connection(stream, peer, part.clone()));
                }
                Ok(_) => warn!(job = part.job, "rendezvous store: {CONNECTIONS_MAX} connections already; one refused"),
                Err(e) => {
                    warn!(job = part.job, error = %e, "rendezvous store: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = tick.tick() => {
                let running = alive();
                seen |= running;
                if !running && (seen || opened.elapsed() > Duration::from_millis(START_GRACE_MS)) {
                    break;
                }
            }
            Some(ended) = connections.join_next(), if !connections.is_empty() => {
                if let Ok(Err(e)) = ended {
                    // The client sees its connection end, without the reason: it is here.
                    warn!(job = part.job, error = format!("{e:#}"), "rendezvous store connection closed");
                }
            }
        }
    }
    debug!(job = part.job, run = part.run, "rendezvous store endpoint closed: the part ended");
}

/// Serves one client's queries in order until it disconnects, if it is the job's user's.
async fn connection(stream: TcpStream, peer: SocketAddr, part: Part) -> anyhow::Result<()> {
    let ours = stream.local_addr().context("read the store's own address")?;
    let uid = tokio::task::spawn_blocking(move || peer::uid_of(peer, ours)).await.context("look up a store client's user")?;
    if uid != Some(part.uid) && uid != Some(0) {
        bail!("refused a connection from {peer}: uid {uid:?}, not the job's user ({})", part.uid);
    }
    stream.set_nodelay(true).context("set TCP_NODELAY")?;
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = Vec::new();
    // This connection's writes, numbered: one asked again is not applied twice.
    let (client, mut seq) = (rand::random::<u64>(), 0u64);
    loop {
        let Some(query) = next_query(&mut rd, &mut buf).await? else { return Ok(()) };
        let mut out = Vec::new();
        match query {
            Query::Validate(magic) if magic == wire::VALIDATION_MAGIC => {}
            Query::Validate(magic) => bail!("a client that is not torch's TCPStore (magic {magic:#x})"),
            Query::Ping(nonce) => out.extend_from_slice(&nonce.to_le_bytes()),
            // Answered whether or not a wait was on: torch reads it either way.
            Query::CancelWait => out.push(wire::WAIT_CANCELED),
            Query::Get(key) => {
                let values = part.values(vec![key]).await?;
                wire::vector(&mut out, values.first().and_then(Option::as_deref).unwrap_or_default());
            }
            Query::MultiGet(keys) => {
                for value in part.values(keys).await? {
                    wire::vector(&mut out, value.as_deref().unwrap_or_default());
                }
            }
            Query::Wait(keys) => out.push(part.wait(keys, &mut rd, &mut buf).await?),
            Query::Op(op) => {
                seq += 1;
                answer(&mut out, &op, part.ask(op.clone(), (client, seq)).await?)?
            }
        }
        wr.write_all(&out).await.context("answer a store client")?;
    }
}

/// The next whole query from the client; `None` when it closed the connection.
async fn next_query(rd: &mut OwnedReadHalf, buf: &mut Vec<u8>) -> anyhow::Result<Option<Query>> {
    loop {
        if let Some((query, used)) = wire::parse(buf)? {
            buf.drain(..used);
            return Ok(Some(query));
        }
        if buf.len() > wire::QUERY_BYTES_MAX {
            bail!("a query of more than {} bytes", wire::QUERY_BYTES_MAX);
        }
        if rd.read_buf(buf).await.context("read a store query")? == 0 {
            return Ok(None);
        }
    }
}

/// Writes what torch reads back for `op`.
fn answer(out: &mut Vec<u8>, op: &StoreOp, answer: StoreAnswer) -> anyhow::Result<()> {
    match (op, answer) {
        (StoreOp::Set { .. } | StoreOp::Append { .. } | StoreOp::MultiSet { .. }, StoreAnswer::Done) => {}
        (StoreOp::CompareSet { .. }, StoreAnswer::Value(v)) => wire::vector(out, &v),
        (StoreOp::Add { .. } | StoreOp::Delete { .. } | StoreOp::NumKeys, StoreAnswer::Number(n)) => wire::number(out, n),
        (StoreOp::Check { .. }, StoreAnswer::Ready(ready)) => out.push(if ready { wire::CHECK_READY } else { wire::CHECK_NOT_READY }),
        (op, answer) => bail!("the leader answered {answer:?} to {op:?}"),
    }
    Ok(())
}

impl Part {
    /// Asks the leader, again while it cannot be reached or is being elected; `write` numbers
    /// a write (a read ignores it).
    async fn ask(&self, op: StoreOp, write: (u64, u64)) -> anyhow::Result<StoreAnswer> {
        let deadline = Instant::now() + Duration::from_millis(CALL_PATIENCE_MS);
        loop {
            let request = PeerRequest::Store { job: self.job, run: self.run, op: op.clone(), write };
            let Some(link) = self.link.get() else {
                if Instant::now() >= deadline {
                    bail!("this node has no link to the leader yet");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            match link.call(request, 0).await {
                Ok(Reply::Store(answer)) => return Ok(answer),
                Ok(other) => bail!("the leader answered {other:?} to a store operation"),
                Err(
                    LinkError::Unreachable(_) | LinkError::Api(ApiError::NoLeader | ApiError::NotLeader { .. } | ApiError::Unavailable(_)),
                ) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("ask the leader for job {}'s store", self.job)),
            }
        }
    }

    async fn values(&self, keys: Vec<Vec<u8>>) -> anyhow::Result<Vec<Option<Vec<u8>>>> {
        match self.ask(StoreOp::Get { keys }, (0, 0)).await? {
            StoreAnswer::Values(values) => Ok(values),
            other => bail!("the leader answered {other:?} to a get"),
        }
    }

    /// Waits until every key is there (`WAIT_STOP`) or the client cancels (`WAIT_CANCELED`).
    async fn wait(&self, keys: Vec<Vec<u8>>, rd: &mut OwnedReadHalf, buf: &mut Vec<u8>) -> anyhow::Result<u8> {
        let mut pause_ms = WAIT_POLL_MS_FIRST;
        loop {
            if self.ask(StoreOp::Check { keys: keys.clone() }, (0, 0)).await? == StoreAnswer::Ready(true) {
                return Ok(wire::WAIT_STOP);
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(pause_ms)) => pause_ms = (pause_ms * 2).min(WAIT_POLL_MS_MAX),
                read = rd.read_buf(buf) => {
                    if read.context("read a store query")? == 0 {
                        bail!("the client left while waiting");
                    }
                    match wire::parse(buf)? {
                        Some((Query::CancelWait, used)) => {
                            buf.drain(..used);
                            return Ok(wire::WAIT_CANCELED);
                        }
                        Some((other, _)) => bail!("{other:?} while a wait is on"),
                        None if buf.len() > wire::QUERY_BYTES_MAX => bail!("a query of more than {} bytes", wire::QUERY_BYTES_MAX),
                        None => {}
                    }
                }
            }
        }
    }
}
