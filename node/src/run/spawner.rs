//! The spawner: a small helper process `corrald` forks at start, before it has threads, a
//! runtime or a store, that forks each run's shepherd on request.
//!
//! Why: a run's shepherd used to be `fork` + `exec corrald --shepherd DIR` from the daemon. The
//! fork copies the page tables of a daemon holding hundreds of MiB (and every page the daemon
//! then writes is copied again), and the exec'd binary pays the dynamic loader, RocksDB's static
//! initializers and a few hundred page faults: about 3 ms of CPU per run on top of the job,
//! more than everything else a trivial job costs. The spawner is a copy of the daemon as it
//! was at start (a few MiB, one thread): forking it is cheap, and the child runs the shepherd's
//! code directly ([`crate::run::shepherd::run_trusting`]), with no exec.
//!
//! Protocol, over a `SOCK_SEQPACKET` socket pair (one message per request, in order): the daemon
//! sends the run directory's path (at most [`PATH_BYTES_MAX`]) with one file descriptor (the
//! write end of the pipe that becomes the shepherd's stdout) as `SCM_RIGHTS`; the spawner forks
//! and answers the shepherd's pid as an `i32` (negative: `-errno` of a failed fork). The
//! shepherd is the spawner's child in its own session; the spawner reaps it. The spawner dies
//! with the daemon (parent-death signal, and end of file on the socket); its shepherds do not
//! (they decide from the daemon record, as after a hand-over). Where the spawner is gone or
//! broken, the daemon falls back to exec'ing the shepherd (`Shepherd::spawn`).

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context};

/// The longest run directory path a request may carry.
pub const PATH_BYTES_MAX: usize = 4096;
/// How long the daemon waits for the spawner's answer before it gives up on it.
const REPLY_TIMEOUT_MS: i64 = 5_000;
/// How often an idle spawner reaps its ended shepherds.
const REAP_INTERVAL_MS: i32 = 1_000;

/// The daemon's end of the spawner's socket.
pub struct Spawner {
    sock: Mutex<Option<OwnedFd>>,
    pid: i32,
}

fn last_error(what: &str) -> anyhow::Error {
    anyhow::Error::new(std::io::Error::last_os_error()).context(what.to_string())
}

/// What a forked shepherd runs: its run directory and the daemon it trusts
/// (`shepherd::run_trusting`, handed in by `corrald`'s `main`).
pub type RunShepherd = fn(&Path, i32) -> anyhow::Result<()>;

/// Forks the spawner. Call only while the process has one thread (before any runtime).
pub fn start(run_shepherd: RunShepherd) -> anyhow::Result<Spawner> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } < 0 {
        return Err(last_error("create the spawner's socket pair"));
    }
    // SAFETY: both descriptors were just created and are owned here.
    let (ours, theirs) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let daemon = std::process::id() as i32;
    // SAFETY: the caller guarantees one thread, so the child's memory is consistent.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(last_error("fork the spawner"));
    }
    if pid == 0 {
        drop(ours);
        serve(theirs, daemon, run_shepherd);
    }
    drop(theirs);
    let timeout = libc::timeval { tv_sec: REPLY_TIMEOUT_MS / 1000, tv_usec: 0 };
    // SAFETY: setsockopt reads `timeout` for its size.
    let set = unsafe {
        libc::setsockopt(
            ours.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if set < 0 {
        return Err(last_error("set the spawner's reply timeout"));
    }
    Ok(Spawner { sock: Mutex::new(Some(ours)), pid })
}

impl Spawner {
    /// The spawner's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Has the spawner fork a shepherd for `dir`: its pid and the read end of its stdout; none
    /// once the spawner was given up (after any error: the caller then execs the shepherd).
    /// Blocking (one round trip to a process that forks): call off the async runtime.
    pub fn spawn_shepherd(&self, dir: &Path) -> anyhow::Result<Option<(i32, OwnedFd)>> {
        let path = dir.as_os_str().as_bytes();
        if path.is_empty() || path.len() > PATH_BYTES_MAX {
            bail!("run directory path of {} bytes (at most {PATH_BYTES_MAX})", path.len());
        }
        let mut guard = self.sock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sock) = guard.as_ref() else { return Ok(None) };
        let result = request(sock.as_raw_fd(), path);
        if result.is_err() {
            *guard = None;
        }
        result.map(Some)
    }
}

/// One request and its answer on the daemon's end.
fn request(sock: RawFd, path: &[u8]) -> anyhow::Result<(i32, OwnedFd)> {
    let (read, write) = pipe()?;
    send_with_fd(sock, path, write.as_raw_fd()).context("send a request to the spawner")?;
    drop(write);
    let mut reply = [0u8; 4];
    // SAFETY: recv writes at most 4 bytes into `reply`.
    let n = unsafe { libc::recv(sock, reply.as_mut_ptr().cast(), reply.len(), 0) };
    if n < 0 {
        return Err(last_error("read the spawner's answer"));
    }
    if n != 4 {
        bail!("the spawner answered {n} bytes (it is gone)");
    }
    let pid = i32::from_le_bytes(reply);
    if pid <= 0 {
        return Err(anyhow::Error::new(std::io::Error::from_raw_os_error(-pid)).context("the spawner's fork of a shepherd"));
    }
    Ok((pid, read))
}

fn pipe() -> anyhow::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(last_error("create a shepherd's stdout pipe"));
    }
    // SAFETY: both were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for one descriptor's control message (`CMSG_SPACE(sizeof(int))`), aligned.
#[repr(C)]
union ControlBuffer {
    bytes: [u8; 64],
    _align: libc::cmsghdr,
}

/// A message of one buffer and a control buffer of `control_len` bytes.
///
/// # Safety
/// The returned header points into `iov` and `control`: use it only while both live.
unsafe fn message(iov: &mut libc::iovec, control: &mut ControlBuffer, control_len: usize) -> libc::msghdr {
    // SAFETY: a zeroed msghdr is valid; the caller keeps what it points to alive.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov;
    msg.msg_iovlen = 1;
    // SAFETY: writing the union's byte view.
    msg.msg_control = unsafe { control.bytes.as_mut_ptr().cast() };
    msg.msg_controllen = control_len as _;
    msg
}

fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> std::io::Result<()> {
    let mut iov = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
    let mut control = ControlBuffer { bytes: [0; 64] };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the sendmsg call, and
    // the control buffer holds CMSG_SPACE(4) bytes.
    unsafe {
        let msg = message(&mut iov, &mut control, libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize);
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One request as the spawner reads it: the path and the descriptor, if one came.
enum Received {
    Request(PathBuf, Option<OwnedFd>),
    Closed,
}

fn recv_with_fd(sock: RawFd) -> std::io::Result<Received> {
    let mut data = vec![0u8; PATH_BYTES_MAX + 1];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    let mut control = ControlBuffer { bytes: [0; 64] };
    // SAFETY: as in `send_with_fd`; the kernel writes at most the lengths given. Descriptors
    // that arrive are taken into `OwnedFd`s at once, so none leaks, whatever else the message is.
    unsafe {
        let mut msg = message(&mut iov, &mut control, std::mem::size_of::<ControlBuffer>());
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut fds = Vec::new();
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let payload = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..payload / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if n == 0 && fds.is_empty() {
            return Ok(Received::Closed);
        }
        let n = n as usize;
        if n > PATH_BYTES_MAX || msg.msg_flags & libc::MSG_TRUNC != 0 {
            return Ok(Received::Request(PathBuf::new(), None));
        }
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(&data[..n]));
        let one = if fds.len() == 1 { fds.pop() } else { None };
        Ok(Received::Request(path, one))
    }
}

fn reap() {
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own children, without blocking.
        if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } <= 0 {
            return;
        }
    }
}

/// The spawner's loop: never returns.
fn serve(sock: OwnedFd, daemon: i32, run_shepherd: RunShepherd) -> ! {
    // SAFETY: prctl and getppid have no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != daemon {
            libc::_exit(0);
        }
    }
    let fd = sock.as_raw_fd();
    loop {
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: poll on one valid descriptor.
        let ready = unsafe { libc::poll(&mut pfd, 1, REAP_INTERVAL_MS) };
        reap();
        if ready <= 0 {
            continue;
        }
        let (path, pipe) = match recv_with_fd(fd) {
            Ok(Received::Request(path, pipe)) => (path, pipe),
            Ok(Received::Closed) => unsafe { libc::_exit(0) },
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // SAFETY: exiting the helper; the daemon falls back to exec'ing shepherds.
            Err(_) => unsafe { libc::_exit(1) },
        };
        let answer = match pipe {
            Some(pipe) if !path.as_os_str().is_empty() => fork_shepherd(&sock, &path, pipe, daemon, run_shepherd),
            _ => -libc::EINVAL,
        };
        // SAFETY: send reads 4 bytes from `answer`.
        let sent = unsafe { libc::send(fd, answer.to_le_bytes().as_ptr().cast(), 4, libc::MSG_NOSIGNAL) };
        if sent != 4 {
            // SAFETY: the daemon is gone or the socket broke: nothing left to serve.
            unsafe { libc::_exit(0) };
        }
    }
}

/// Forks one shepherd; its pid, or `-errno`.
fn fork_shepherd(sock: &OwnedFd, dir: &Path, stdout: OwnedFd, daemon: i32, run_shepherd: RunShepherd) -> i32 {
    // SAFETY: the spawner has one thread, so the child's memory is consistent.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return -std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
    }
    if pid > 0 {
        return pid;
    }
    // The shepherd: stdout to the daemon's pipe, stdin from /dev/null, its own session, and
    // none of the spawner's descriptors.
    // SAFETY: plain descriptor and session calls in a fresh single-threaded child.
    unsafe {
        libc::close(sock.as_raw_fd());
        libc::dup2(stdout.as_raw_fd(), 1);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::close(null);
        }
        libc::setsid();
    }
    drop(stdout);
    let code = match run_shepherd(dir, daemon) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("shepherd {}: {e:#}", dir.display());
            1
        }
    };
    let _ = std::io::stdout().flush();
    // SAFETY: the shepherd is done; _exit skips the daemon's atexit handlers, which are not ours.
    unsafe { libc::_exit(code) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_and_a_path_cross_the_socket_and_a_bad_message_is_refused() {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: socketpair writes two descriptors.
        assert_eq!(unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) }, 0);
        // SAFETY: just created.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let (read, write) = pipe().expect("pipe");
        send_with_fd(a.as_raw_fd(), b"/var/lib/corral/jobs/runs/7.1", write.as_raw_fd()).expect("send");
        drop(write);
        let Received::Request(path, Some(fd)) = recv_with_fd(b.as_raw_fd()).expect("recv") else { panic!("no request") };
        assert_eq!(path, Path::new("/var/lib/corral/jobs/runs/7.1"));
        let mut w = std::fs::File::from(fd);
        w.write_all(b"started 1 2\n").expect("write through the passed descriptor");
        drop(w);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut got).expect("read");
        assert_eq!(got, "started 1 2\n");
        // Too long a path: refused, not truncated into another path.
        let long = vec![b'a'; PATH_BYTES_MAX + 1];
        let (_r, w) = pipe().expect("pipe");
        send_with_fd(a.as_raw_fd(), &long, w.as_raw_fd()).expect("send");
        let Received::Request(path, None) = recv_with_fd(b.as_raw_fd()).expect("recv") else { panic!("a bad request was accepted") };
        assert!(path.as_os_str().is_empty());
        drop(a);
        assert!(matches!(recv_with_fd(b.as_raw_fd()).expect("recv"), Received::Closed));
    }
}
