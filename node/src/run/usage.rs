//! What a job's processes use right now (`sstat`): read from `/proc`, summed per session (a
//! step's task and a batch script each start a session of their own, which their children
//! keep). The parsers are pure; [`sessions`] does the reading.

use std::collections::BTreeMap;
use std::path::Path;

/// What the processes of one session use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu_ticks: u64,
    pub rss_pages: u64,
    pub vmsize_bytes: u64,
    pub major_faults: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

impl Usage {
    fn add(&mut self, other: &Usage) {
        self.cpu_ticks += other.cpu_ticks;
        self.rss_pages += other.rss_pages;
        self.vmsize_bytes += other.vmsize_bytes;
        self.major_faults += other.major_faults;
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
    }
}

/// The session and usage of one process from its `/proc/PID/stat` (the command's name, in
/// parentheses, may hold spaces and parentheses: fields are counted after its last `)`).
pub fn parse_stat(text: &str) -> Option<(i32, Usage)> {
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the name: state(3) ppid pgrp session(6) ... majflt(12) ... utime(14) stime(15) ...
    // vsize(23) rss(24), numbered as proc(5) numbers them from pid = 1.
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let session = fields.get(6 - 3)?.parse::<i32>().ok()?;
    let usage = Usage {
        cpu_ticks: field(14)? + field(15)?,
        rss_pages: field(24)?,
        vmsize_bytes: field(23)?,
        major_faults: field(12)?,
        ..Usage::default()
    };
    Some((session, usage))
}

/// `read_bytes` and `write_bytes` of a `/proc/PID/io` (what reached the storage layer).
pub fn parse_io(text: &str) -> (u64, u64) {
    let value = |key: &str| text.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse::<u64>().ok())).unwrap_or(0);
    (value("read_bytes:"), value("write_bytes:"))
}

/// The usage of each of `wanted` sessions, summed over their processes in `proc_dir` (`/proc`);
/// a session with no process left is absent.
pub fn sessions(proc_dir: &Path, wanted: &[i32]) -> BTreeMap<i32, Usage> {
    let mut out: BTreeMap<i32, Usage> = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(proc_dir) else { return out };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process may end between the listing and the read: it is then not counted.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let Some((session, mut usage)) = parse_stat(&stat) else { continue };
        if !wanted.contains(&session) {
            continue;
        }
        (usage.read_bytes, usage.write_bytes) = std::fs::read_to_string(entry.path().join("io")).map_or((0, 0), |t| parse_io(&t));
        out.entry(session).or_default().add(&usage);
    }
    out
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`; 100 where it cannot say).
pub fn ticks_per_s() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|t| *t > 0).unwrap_or(100)
}

/// Bytes per page.
pub fn page_bytes() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(bytes).ok().filter(|b| *b > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_whatever_the_command_is_called() {
        // A real line of this kernel's, with a name holding ") (" and spaces.
        let line = "4242 (a) (b c) S 1 4242 4242 0 -1 4194560 100 0 7 0 250 50 0 0 20 0 1 0 123 10485760 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0";
        let (session, usage) = parse_stat(line).expect("parses");
        assert_eq!(session, 4242);
        assert_eq!(
            usage,
            Usage { cpu_ticks: 300, rss_pages: 300, vmsize_bytes: 10_485_760, major_faults: 7, read_bytes: 0, write_bytes: 0 }
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1"), None);
        assert_eq!(parse_io("rchar: 5\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n"), (4096, 8192));
    }

    #[test]
    fn this_processs_session_is_found_in_proc() {
        // SAFETY: getsid(0) asks for the caller's own session.
        let me = unsafe { libc::getsid(0) };
        let found = sessions(Path::new("/proc"), &[me]);
        let usage = found.get(&me).expect("this process's session");
        assert!(usage.rss_pages > 0 && usage.vmsize_bytes > 0, "{usage:?}");
        assert!(!sessions(Path::new("/proc"), &[-5]).contains_key(&-5));
    }
}
