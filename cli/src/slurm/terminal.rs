//! `srun --pty`'s side of the terminal: the size of the user's terminal, sent to the step's
//! pseudo-terminal at the start and on every SIGWINCH, and raw mode while the step runs (keys go
//! to the remote terminal as typed, Ctrl-C included; output processing stays on, as Slurm keeps
//! it), restored when the guard drops; and `sacctmgr`'s question reading a key at a time.

use proto::PtySize;

/// The size of the terminal on `fd`, if it is one.
pub fn size(fd: i32) -> Option<PtySize> {
    // SAFETY: a zeroed winsize is a valid value of the plain C struct.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize to the pointer; a non-terminal fails with ENOTTY.
    if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } < 0 {
        return None;
    }
    Some(PtySize { rows: ws.ws_row, cols: ws.ws_col })
}

/// The terminal on `fd` in raw mode until dropped, then as it was.
pub struct RawMode {
    fd: i32,
    saved: libc::termios,
}

impl RawMode {
    pub fn enter(fd: i32) -> std::io::Result<RawMode> {
        // SAFETY: a zeroed termios is a valid value of the plain C struct; tcgetattr fills it.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes one termios to the pointer.
        if unsafe { libc::tcgetattr(fd, &mut saved) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw edits the termios it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // Our own messages (srun: error: ...) still end their lines properly.
        raw.c_oflag |= libc::OPOST;
        // SAFETY: tcsetattr reads one termios from the pointer.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: tcsetattr reads the termios saved at entry. Nothing to do if it fails: the
        // terminal may be gone.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// The terminal on `fd` handing over each key as it is typed (canonical mode off, echo kept),
/// as Slurm's sacctmgr reads the answer to its question (`_nonblock`), until dropped.
pub struct KeyMode {
    fd: i32,
    saved: libc::termios,
}

impl KeyMode {
    /// `None` where `fd` is no terminal.
    pub fn enter(fd: i32) -> Option<KeyMode> {
        // SAFETY: a zeroed termios is a valid value of the plain C struct; tcgetattr fills it.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes one termios to the pointer; a non-terminal fails.
        if unsafe { libc::tcgetattr(fd, &mut saved) } < 0 {
            return None;
        }
        let mut keys = saved;
        keys.c_lflag &= !libc::ICANON;
        keys.c_cc[libc::VMIN] = 1;
        // SAFETY: tcsetattr reads one termios from the pointer.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &keys) } < 0 {
            return None;
        }
        Some(KeyMode { fd, saved })
    }
}

impl Drop for KeyMode {
    fn drop(&mut self) {
        // SAFETY: tcsetattr reads the termios saved at entry; nothing to do if it fails.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}
