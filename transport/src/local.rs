//! The node's local socket: the CLI on a node talks to its `corrald` over a Unix socket, and the
//! daemon learns who is calling from the socket's peer credentials (`SO_PEERCRED`), checked by
//! the kernel. This is the trust model of Slurm's munge without a shared key: whoever can run a
//! process as uid U on a cluster node is user U. Frames are the QUIC protocol's: a big-endian
//! u32 length, then the encoded message, each checked against the frame limit before reading.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proto::limits::{FRAME_BYTES_MAX, REQUEST_BYTES_MAX};
use proto::{ApiError, Envelope, Response};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tracing::{debug, warn};

use crate::{CallError, FrameError};

/// At most this many local connections are served at once; more wait in the kernel's backlog.
pub const LOCAL_CONNECTIONS_MAX: usize = 1024;
/// A local caller must send its request within this.
pub const LOCAL_READ_TIMEOUT_MS: u64 = 10_000;

/// Who is on the other end of a local connection, as the kernel says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalPeer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

/// Answers local requests; the node decides what a uid may do.
pub trait LocalHandler: Send + Sync + 'static {
    fn handle_local(
        &self,
        peer: LocalPeer,
        envelope: Envelope,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + 'static>>;
}

/// Writes one frame to any byte stream.
pub async fn write_frame_io<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> Result<(), FrameError> {
    let len = u32::try_from(bytes.len()).map_err(|_| FrameError::TooLarge { len: bytes.len(), max: u32::MAX as usize })?;
    w.write_all(&len.to_be_bytes()).await.map_err(|e| FrameError::Io(e.to_string()))?;
    w.write_all(bytes).await.map_err(|e| FrameError::Io(e.to_string()))?;
    w.flush().await.map_err(|e| FrameError::Io(e.to_string()))
}

/// Reads one frame of at most `max_bytes` from any byte stream; the length is checked before
/// anything is allocated and the buffer grows only as bytes arrive.
pub async fn read_frame_io<R: AsyncRead + Unpin>(r: &mut R, max_bytes: usize) -> Result<Vec<u8>, FrameError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut prefix[got..]).await {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(format!("stream ended after {got} bytes of the length prefix"))),
            Ok(n) => got += n,
            Err(e) => return Err(FrameError::Io(e.to_string())),
        }
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max_bytes {
        return Err(FrameError::TooLarge { len, max: max_bytes });
    }
    let mut buf = Vec::with_capacity(len.min(64 * 1024));
    (&mut *r).take(len as u64).read_to_end(&mut buf).await.map_err(|e| FrameError::Io(e.to_string()))?;
    if buf.len() < len {
        return Err(FrameError::Io(format!("stream ended after {} of {len} bytes", buf.len())));
    }
    Ok(buf)
}

/// Binds the local socket at `path` (replacing a stale one), readable and writable by everyone:
/// the kernel's peer credentials, not file permissions, say who calls.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use anyhow::Context;
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("remove stale socket {}", path.display())),
    }
    let listener = UnixListener::bind(path).with_context(|| format!("bind local socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).with_context(|| format!("chmod {}", path.display()))?;
    Ok(listener)
}

/// Serves local connections until the listener fails: one request per connection.
pub async fn serve_local(listener: UnixListener, handler: Arc<dyn LocalHandler>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(LOCAL_CONNECTIONS_MAX));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else { return };
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                warn!(error = %e, "accept on the local socket");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = serve_one(stream, handler).await {
                debug!(error = %e, "local connection");
            }
        });
    }
}

async fn serve_one(mut stream: UnixStream, handler: Arc<dyn LocalHandler>) -> Result<(), FrameError> {
    let cred = stream.peer_cred().map_err(|e| FrameError::Io(format!("read peer credentials: {e}")))?;
    let peer = LocalPeer { uid: cred.uid(), gid: cred.gid(), pid: cred.pid() };
    // Only clients call here: a request is held to the client bound, not the peers' frame limit.
    let read = tokio::time::timeout(Duration::from_millis(LOCAL_READ_TIMEOUT_MS), read_frame_io(&mut stream, REQUEST_BYTES_MAX)).await;
    let response: Response = match read {
        Err(_) => Err(ApiError::Invalid(format!("no request within {LOCAL_READ_TIMEOUT_MS} ms"))),
        Ok(Err(FrameError::Closed)) => return Ok(()),
        Ok(Err(e)) => Err(ApiError::Invalid(format!("bad frame: {e}"))),
        Ok(Ok(bytes)) => match proto::decode::<Envelope>(&bytes, REQUEST_BYTES_MAX) {
            Ok(envelope) => handler.handle_local(peer, envelope).await,
            Err(e) => Err(ApiError::Invalid(format!("bad request: {e}"))),
        },
    };
    let mut bytes = proto::encode(&response);
    if bytes.len() > FRAME_BYTES_MAX {
        bytes = proto::encode::<Response>(&Err(ApiError::Internal(format!(
            "reply of {} bytes exceeds the frame limit of {FRAME_BYTES_MAX}",
            bytes.len()
        ))));
    }
    write_frame_io(&mut stream, &bytes).await
}

/// One request over the local socket at `path`.
pub async fn call_local(path: &Path, envelope: &Envelope, timeout: Duration) -> Result<Response, CallError> {
    let exchange = async {
        let mut stream = UnixStream::connect(path).await.map_err(|e| CallError::Connect(format!("{}: {e}", path.display())))?;
        let bytes = proto::encode(envelope);
        if bytes.len() > FRAME_BYTES_MAX {
            return Err(CallError::Codec(format!("request of {} bytes exceeds the frame limit of {FRAME_BYTES_MAX}", bytes.len())));
        }
        write_frame_io(&mut stream, &bytes).await?;
        let reply = read_frame_io(&mut stream, FRAME_BYTES_MAX).await?;
        proto::decode::<Response>(&reply, FRAME_BYTES_MAX).map_err(|e| CallError::Codec(e.to_string()))
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| CallError::Timeout)?
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::{ClientRequest, Reply, Request};

    struct Echo;
    impl LocalHandler for Echo {
        fn handle_local(
            &self,
            peer: LocalPeer,
            envelope: Envelope,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response> + Send + 'static>> {
            Box::pin(async move {
                match envelope.request {
                    Request::Client(ClientRequest::Cancel { job }) => Ok(Reply::Submitted { job: job + u64::from(peer.uid) * 1_000_000 }),
                    _ => Err(ApiError::Invalid("only cancel".into())),
                }
            })
        }
    }

    #[tokio::test]
    async fn the_kernel_names_the_caller_and_bad_frames_get_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("corral.sock");
        let listener = bind(&path).expect("bind");
        tokio::spawn(serve_local(listener, Arc::new(Echo)));
        let env = Envelope { hops: 0, request: ClientRequest::Cancel { job: 7 }.into(), user: None };
        let reply = call_local(&path, &env, Duration::from_secs(5)).await.expect("call");
        // Our uid: the owner of the directory we just created.
        let me = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(dir.path()).expect("stat"));
        assert_eq!(reply, Ok(Reply::Submitted { job: 7 + u64::from(me) * 1_000_000 }));

        // An oversized length prefix: an error reply, nothing allocated, the server keeps serving.
        let mut raw = UnixStream::connect(&path).await.expect("connect");
        raw.write_all(&u32::MAX.to_be_bytes()).await.expect("write");
        let reply = read_frame_io(&mut raw, FRAME_BYTES_MAX).await.expect("reply");
        let reply: Response = proto::decode(&reply, FRAME_BYTES_MAX).expect("decode");
        assert!(matches!(reply, Err(ApiError::Invalid(m)) if m.contains("exceeds")));
        // Past the client request bound (though under the peers' frame limit): refused unread.
        let mut raw = UnixStream::connect(&path).await.expect("connect");
        raw.write_all(&((REQUEST_BYTES_MAX + 1) as u32).to_be_bytes()).await.expect("write");
        let reply: Response =
            proto::decode(&read_frame_io(&mut raw, FRAME_BYTES_MAX).await.expect("reply"), FRAME_BYTES_MAX).expect("decode");
        assert!(matches!(reply, Err(ApiError::Invalid(m)) if m.contains("exceeds")), "{REQUEST_BYTES_MAX}");
        // Garbage that is not a message.
        let mut raw = UnixStream::connect(&path).await.expect("connect");
        write_frame_io(&mut raw, b"\x01garbage").await.expect("write");
        let reply: Response =
            proto::decode(&read_frame_io(&mut raw, FRAME_BYTES_MAX).await.expect("reply"), FRAME_BYTES_MAX).expect("decode");
        assert!(matches!(reply, Err(ApiError::Invalid(_))));
        assert!(call_local(&path, &env, Duration::from_secs(5)).await.is_ok());
        // The socket is open to every local user.
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o666);
    }
}
