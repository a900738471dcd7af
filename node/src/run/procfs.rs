//! What `/proc` and the kernel's clocks say of a process: its start time (which tells a process
//! from a recycled pid), whether it still runs, and the boot clock every process of the host
//! shares.

/// Milliseconds on the boot clock (`CLOCK_BOOTTIME`), the same in every process of this host.
pub fn boot_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
    ts.tv_sec as u64 * 1_000 + ts.tv_nsec as u64 / 1_000_000
}

/// The start time of process `pid` in clock ticks since boot, if it exists.
pub fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 on; the start time is field 22.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether process `pid` runs and is the one that started at `ticks`: not a recycled pid, and
/// not a zombie (a dead process its parent has not reaped yet).
pub fn process_alive(pid: i32, ticks: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return false };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("X");
    // Fields from 3 on: the state is field 3, the start time field 22.
    let started = fields.nth(18).and_then(|t| t.parse::<u64>().ok());
    pid > 1 && started == Some(ticks) && !matches!(state, "Z" | "X" | "x")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn this_process_has_a_start_time() {
        let me = std::process::id() as i32;
        assert!(start_ticks(me).is_some());
        assert!(process_alive(me, start_ticks(me).unwrap_or(0)));
        assert!(!process_alive(me, start_ticks(me).unwrap_or(0) + 1), "another start time: a recycled pid");
        assert_eq!(start_ticks(me), start_ticks(me));
        assert!(boot_ms() > 0);
    }

    #[test]
    fn a_zombie_is_not_alive() {
        let mut child = std::process::Command::new("true").spawn().expect("start true");
        let pid = child.id() as i32;
        let ticks = start_ticks(pid).expect("a child not reaped is in /proc");
        // It exits at once but is not reaped until wait: a zombie, still in /proc.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while process_alive(pid, ticks) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(start_ticks(pid), Some(ticks), "still in /proc");
        assert!(!process_alive(pid, ticks), "but not alive");
        child.wait().expect("reap");
    }
}
