//! Small idempotent requests as QUIC datagrams on the same mutually authenticated connections:
//! one datagram out, one back, no stream. A heartbeat is the case: a fleet sends thousands a
//! second, each a few dozen bytes, and the next one supersedes it, so a lost one costs nothing
//! that a resend of the same bytes or the next tick does not mend. Over a stream each also paid
//! for opening and closing the stream (frames, acknowledgements, flow-control updates) and two
//! tasks on the server.
//!
//! A datagram is an 8-byte big-endian call id, then an encoded [`proto::Envelope`] (a reply: an
//! encoded [`proto::Response`]) of at most [`DATAGRAM_BYTES_MAX`] in all. The server answers
//! with the id it was sent; the handler decides which requests it takes this way
//! ([`Handler::takes_datagram`]); any other is answered `Invalid`. A request or reply that does
//! not fit goes over a stream instead ([`Client::call_datagram`] falls back by itself).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use proto::{ApiError, Envelope, Response};
use tokio::sync::{oneshot, Semaphore};
use tracing::debug;

use crate::{CallError, Client, Handler, Peer};

/// Largest datagram either side sends or takes, call id included: inside QUIC's smallest path
/// MTU (1,200 bytes less its headers), so one never needs path MTU discovery to get through.
pub const DATAGRAM_BYTES_MAX: usize = 1_100;
/// Datagram requests one connection may have in its handler at once; past it the connection's
/// datagrams wait in QUIC's receive buffer, which drops the oldest when full (the sender
/// resends, or goes to its next member).
pub const DATAGRAM_CALLS_PER_CONNECTION_MAX: usize = 64;
/// Bytes of received datagrams QUIC buffers per connection before dropping the oldest.
pub const DATAGRAM_RECEIVE_BUFFER_BYTES: usize = 64 * 1024;
const ID_BYTES: usize = 8;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `id` then `body`, as one datagram.
fn with_id(id: u64, body: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(ID_BYTES + body.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(body);
    Bytes::from(out)
}

/// The call id and the body of a datagram; `None` when it is too short to hold an id.
fn split_id(datagram: &[u8]) -> Option<(u64, &[u8])> {
    let (id, body) = datagram.split_at_checked(ID_BYTES)?;
    Some((u64::from_be_bytes(id.try_into().ok()?), body))
}

/// The encoded reply to send back for call `id`: `response`, or a short refusal when it does
/// not fit one datagram (a long error text; the caller asks again over a stream).
fn reply_datagram(id: u64, response: &Response, room: usize) -> Bytes {
    let bytes = proto::encode(response);
    if ID_BYTES + bytes.len() <= room {
        return with_id(id, &bytes);
    }
    with_id(id, &proto::encode::<Response>(&Err(ApiError::Unavailable(REPLY_TOO_LARGE.into()))))
}

/// What a server answers when its reply does not fit a datagram.
pub const REPLY_TOO_LARGE: &str = "reply too large for a datagram";

/// Reads the datagrams of one accepted connection until it closes and answers each through
/// `handler`, at most [`DATAGRAM_CALLS_PER_CONNECTION_MAX`] at a time. A resend of a call still
/// being handled is dropped: the one reply answers it (a loaded server that took every resend
/// as new work fell further behind with each, the resends multiplying as it slowed).
pub(crate) async fn serve_datagrams(conn: quinn::Connection, peer: Peer, handler: Arc<dyn Handler>) {
    let calls = Arc::new(Semaphore::new(DATAGRAM_CALLS_PER_CONNECTION_MAX));
    // Ids of the calls in the handler: at most DATAGRAM_CALLS_PER_CONNECTION_MAX (one permit each).
    let handling: Arc<Mutex<std::collections::HashSet<u64>>> = Arc::default();
    loop {
        let Ok(permit) = Arc::clone(&calls).acquire_owned().await else { return };
        let Ok(datagram) = conn.read_datagram().await else { return };
        let Some((id, body)) = split_id(&datagram) else {
            debug!(peer = %peer.remote, len = datagram.len(), "datagram without a call id dropped");
            continue;
        };
        if datagram.len() > DATAGRAM_BYTES_MAX {
            debug!(peer = %peer.remote, len = datagram.len(), "datagram over the limit dropped");
            continue;
        }
        let room = conn.max_datagram_size().unwrap_or(0).min(DATAGRAM_BYTES_MAX);
        let answer: Result<Envelope, Response> = match proto::decode::<Envelope>(body, DATAGRAM_BYTES_MAX) {
            Err(e) => Err(Err(crate::codec_error(e))),
            Ok(envelope) if !handler.takes_datagram(&envelope) => {
                Err(Err(ApiError::Invalid("this request is not taken as a datagram".into())))
            }
            Ok(envelope) => Ok(envelope),
        };
        let conn = conn.clone();
        match answer {
            Err(refusal) => {
                let _ = conn.send_datagram(reply_datagram(id, &refusal, room));
            }
            Ok(envelope) => {
                if !lock(&handling).insert(id) {
                    continue; // a resend of a call in the handler: its reply answers both
                }
                let future = handler.handle(peer.clone(), envelope);
                let handling = Arc::clone(&handling);
                tokio::spawn(async move {
                    let _permit = permit;
                    let response = future.await;
                    // A connection that closed meanwhile takes no reply: the caller gave up.
                    let _ = conn.send_datagram(reply_datagram(id, &response, room));
                    lock(&handling).remove(&id);
                });
            }
        }
    }
}

/// The calls a client waits on, by connection and call id, and which connections have a
/// reader routing their replies.
#[derive(Default)]
pub(crate) struct DatagramCalls {
    next_id: AtomicU64,
    waiting: Mutex<HashMap<(usize, u64), oneshot::Sender<Bytes>>>,
    readers: Mutex<std::collections::HashSet<usize>>,
}

/// A call's place among the waiters; removed when the call ends, however it ends.
struct Waiting<'a> {
    calls: &'a DatagramCalls,
    key: (usize, u64),
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.calls.waiting).remove(&self.key);
    }
}

impl DatagramCalls {
    /// Starts the task that hands `conn`'s reply datagrams to their calls, unless one runs.
    fn read_replies(self: &Arc<Self>, conn: &quinn::Connection) {
        let key = conn.stable_id();
        if !lock(&self.readers).insert(key) {
            return;
        }
        let (calls, conn) = (Arc::clone(self), conn.clone());
        tokio::spawn(async move {
            while let Ok(datagram) = conn.read_datagram().await {
                let Some((id, _)) = split_id(&datagram) else { continue };
                // A reply nobody waits for (a resent request's second answer) is dropped.
                if let Some(tx) = lock(&calls.waiting).remove(&(key, id)) {
                    let _ = tx.send(datagram);
                }
            }
            lock(&calls.readers).remove(&key);
            // Calls still waiting on this connection hear nothing more: they time out.
        });
    }
}

impl Client {
    /// Sends `envelope` to `addr` as a datagram and waits for the reply datagram, sending the
    /// same bytes again every `resend_after` until `timeout` (the request must be idempotent:
    /// the server may get it more than once). Falls back to [`Client::call`] when the request
    /// is too large for a datagram, the peer takes no datagrams, or its reply did not fit one.
    /// A call that timed out keeps its connection: QUIC's idle timeout closes a dead peer's.
    pub async fn call_datagram(
        &self,
        addr: &str,
        envelope: &Envelope,
        timeout: Duration,
        resend_after: Duration,
    ) -> Result<Response, CallError> {
        if self.is_blocked(addr) {
            return Err(CallError::Connect(format!("{addr} is cut off (fault injection)")));
        }
        let body = proto::encode(envelope);
        if ID_BYTES + body.len() > DATAGRAM_BYTES_MAX {
            return self.call(addr, envelope, timeout).await;
        }
        let started = std::time::Instant::now();
        let connect = Duration::from_millis(crate::CONNECT_TIMEOUT_MS).min(timeout);
        let (conn, _fresh, _in_flight) =
            tokio::time::timeout(timeout, self.connection(addr, connect)).await.map_err(|_| CallError::Timeout)??;
        if conn.max_datagram_size().is_none_or(|room| room < ID_BYTES + body.len()) {
            return self.call(addr, envelope, timeout.saturating_sub(started.elapsed())).await;
        }
        let calls = &self.inner.datagrams;
        calls.read_replies(&conn);
        let id = calls.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        let key = (conn.stable_id(), id);
        lock(&calls.waiting).insert(key, tx);
        let _waiting = Waiting { calls, key };
        let datagram = with_id(id, &body);
        let deadline = tokio::time::Instant::from_std(started) + timeout;
        let reply = loop {
            if let Err(e) = conn.send_datagram(datagram.clone()) {
                self.drop_cached(addr, &conn);
                return Err(CallError::Io(format!("send a datagram to {addr}: {e}")));
            }
            let resend_at = (tokio::time::Instant::now() + resend_after).min(deadline);
            tokio::select! {
                reply = &mut rx => break reply.map_err(|_| CallError::Io(format!("connection to {addr} closed")))?,
                () = tokio::time::sleep_until(resend_at) => {
                    if resend_at >= deadline {
                        // The connection stays, heard from or not: QUIC's keep-alives and idle
                        // timeout decide whether the peer is gone (a dead one's connection closes
                        // within IDLE_TIMEOUT_MS, and the next call dials). Dropped on every
                        // silent call, a member starved of CPU for a call's length lost its nodes'
                        // connections, and their new handshakes starved it longer: after a leader
                        // kill at 5,000 simulated nodes the nodes dialed 31,885 times in a minute.
                        return Err(CallError::Timeout);
                    }
                }
            }
        };
        let body = split_id(&reply).map(|(_, body)| body).unwrap_or_default();
        let response = proto::decode::<Response>(body, DATAGRAM_BYTES_MAX).map_err(|e| CallError::Codec(e.to_string()))?;
        match response {
            Err(ApiError::Unavailable(why)) if why == REPLY_TOO_LARGE => {
                self.call(addr, envelope, timeout.saturating_sub(started.elapsed())).await
            }
            other => Ok(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::Reply;

    #[test]
    fn ids_frame_and_unframe() {
        let d = with_id(0x0102_0304_0506_0708, b"body");
        assert_eq!(split_id(&d), Some((0x0102_0304_0506_0708, &b"body"[..])));
        assert_eq!(split_id(b"short"), None);
        assert_eq!(split_id(&with_id(7, b"")), Some((7, &b""[..])));
    }

    #[test]
    fn a_reply_that_does_not_fit_becomes_a_short_refusal() {
        let long: Response = Err(ApiError::Denied("x".repeat(5_000)));
        let d = reply_datagram(9, &long, DATAGRAM_BYTES_MAX);
        assert!(d.len() <= DATAGRAM_BYTES_MAX);
        let (id, body) = split_id(&d).unwrap();
        assert_eq!(id, 9);
        assert_eq!(proto::decode::<Response>(body, DATAGRAM_BYTES_MAX).unwrap(), Err(ApiError::Unavailable(REPLY_TOO_LARGE.into())));
        let short: Response = Ok(Reply::HeartbeatAck { leader: 1, term: 2, commit_index: 3 });
        let d = reply_datagram(9, &short, DATAGRAM_BYTES_MAX);
        let (_, body) = split_id(&d).unwrap();
        assert_eq!(proto::decode::<Response>(body, DATAGRAM_BYTES_MAX).unwrap(), short);
    }
}
