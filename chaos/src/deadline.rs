//! Running a program with a deadline: both its pipes drained while it runs (an answer larger
//! than a pipe's buffer would otherwise hold it until the deadline), killed once it passes.

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// How often the child is looked at: std has no wait with a timeout.
const POLL_MS: u64 = 10;

/// Runs `cmd` (stdin closed, stdout and stderr captured) for at most `timeout`: its output, or
/// `None` if it had to be killed at the deadline.
pub(crate) fn output_within(cmd: &mut Command, timeout: Duration) -> std::io::Result<Option<Output>> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(POLL_MS));
    };
    Ok(Some(Output { status, stdout: stdout.join().unwrap_or_default(), stderr: stderr.join().unwrap_or_default() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_answer_is_read_and_a_slow_program_is_killed_at_the_deadline() {
        let big = output_within(Command::new("sh").args(["-c", "head -c 300000 /dev/zero"]), Duration::from_secs(10))
            .expect("run sh")
            .expect("done before the deadline");
        assert_eq!(big.stdout.len(), 300_000);
        let started = Instant::now();
        let slow = output_within(Command::new("sleep").arg("30"), Duration::from_millis(200)).expect("run sleep");
        assert!(slow.is_none() && started.elapsed() < Duration::from_secs(5));
    }
}
