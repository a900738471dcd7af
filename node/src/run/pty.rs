//! Pseudo-terminals for `srun --pty`: a step's task 0 runs on the slave side (its stdin,
//! stdout, stderr and controlling terminal); the run's shepherd holds the master, copies what
//! the task writes into the step's log and what `srun` reads into the task.

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};

use proto::PtySize;

fn winsize(size: PtySize) -> libc::winsize {
    libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 }
}

/// A new pseudo-terminal of `size`: (master, slave), both close-on-exec (a task gets the slave
/// as its stdio, which exec keeps). With `owner`, the slave belongs to that uid, as `login`
/// makes a user's terminal theirs.
pub fn open(size: PtySize, owner: Option<u32>) -> std::io::Result<(File, File)> {
    let (mut master, mut slave) = (-1, -1);
    let ws = winsize(size);
    // SAFETY: openpty writes two descriptors it opened into the two ints; the name buffer and
    // termios are null (not wanted), the winsize is read.
    if unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &ws) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both are open descriptors that nothing else owns.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&master, &slave] {
        set_cloexec(fd)?;
    }
    if let Some(uid) = owner {
        // SAFETY: fchown on a descriptor we own; gid -1 leaves the group (tty) as it is.
        if unsafe { libc::fchown(std::os::fd::AsRawFd::as_raw_fd(&slave), uid, u32::MAX) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((File::from(master), File::from(slave)))
}

fn set_cloexec(fd: &OwnedFd) -> std::io::Result<()> {
    let raw = std::os::fd::AsRawFd::as_raw_fd(fd);
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFD) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the terminal of `master` a new size: the kernel sends SIGWINCH to its foreground
/// process group.
pub fn resize(master: &File, size: PtySize) -> std::io::Result<()> {
    let ws = winsize(size);
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer.
    if unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(master), libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// The size of the terminal `fd` is, if it is one.
    fn size_of(fd: i32) -> Option<PtySize> {
        let mut ws = winsize(PtySize { rows: 0, cols: 0 });
        // SAFETY: TIOCGWINSZ writes one winsize to the pointer; a non-terminal fails with ENOTTY.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } < 0 {
            return None;
        }
        Some(PtySize { rows: ws.ws_row, cols: ws.ws_col })
    }

    #[test]
    fn a_pty_carries_bytes_both_ways_and_takes_a_new_size() {
        let (mut master, mut slave) = open(PtySize { rows: 24, cols: 80 }, None).expect("openpty");
        assert_eq!(size_of(std::os::fd::AsRawFd::as_raw_fd(&slave)), Some(PtySize { rows: 24, cols: 80 }));
        resize(&master, PtySize { rows: 50, cols: 132 }).expect("resize");
        assert_eq!(size_of(std::os::fd::AsRawFd::as_raw_fd(&slave)), Some(PtySize { rows: 50, cols: 132 }));
        slave.write_all(b"out\n").expect("write slave");
        let mut buf = [0u8; 64];
        let n = master.read(&mut buf).expect("read master");
        // The line discipline turns "\n" into "\r\n" on the way out.
        assert_eq!(&buf[..n], b"out\r\n");
        master.write_all(b"in\n").expect("write master");
        let n = slave.read(&mut buf).expect("read slave");
        assert_eq!(&buf[..n], b"in\n");
        assert_eq!(size_of(-1), None);
    }
}
