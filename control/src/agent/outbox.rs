//! The agent's run reports that no leader has taken yet, in the order the runs ended, and when
//! each is due to be sent again. corrald's report loop (node/src/agent/report.rs) and
//! `corral-chaos sim`'s agents keep one each and send what [`Outbox::due`] returns.

use std::collections::VecDeque;

use proto::{JobId, RunNo};

/// A report not taken is sent again after this long at first, then twice as long each time up
/// to [`REPORT_RETRY_MAX_MS`]: a leader back from an election hears it within a second, and a
/// node does not flood one that is slow.
pub const REPORT_RETRY_MIN_MS: u64 = 50;
pub const REPORT_RETRY_MAX_MS: u64 = 1_000;

/// Reports of ended runs, one per run, oldest first. Bounded by the runs a node holds: a report
/// stays until a leader takes it (or refuses it for good), since nobody else will report the run.
#[derive(Clone, Debug, Default)]
pub struct Outbox<R> {
    entries: VecDeque<Entry<R>>,
}

#[derive(Clone, Debug)]
struct Entry<R> {
    job: JobId,
    run: RunNo,
    report: R,
    next_send_ms: u64,
    retry_ms: u64,
}

impl<R: Clone> Outbox<R> {
    pub fn new() -> Outbox<R> {
        Outbox { entries: VecDeque::new() }
    }

    /// Run `run` of `job` ended at `now_ms`: its report is due at once. False when that run's
    /// report is queued already (the first one stays).
    pub fn push(&mut self, job: JobId, run: RunNo, report: R, now_ms: u64) -> bool {
        if self.entries.iter().any(|e| e.job == job && e.run == run) {
            return false;
        }
        self.entries.push_back(Entry { job, run, report, next_send_ms: now_ms, retry_ms: REPORT_RETRY_MIN_MS });
        true
    }

    /// The reports due at `now_ms`, oldest first, at most `max`: each counts as sent now and is
    /// due again after its retry period, which doubles.
    pub fn due(&mut self, now_ms: u64, max: usize) -> Vec<(JobId, RunNo, R)> {
        let mut due = Vec::new();
        for e in self.entries.iter_mut().filter(|e| e.next_send_ms <= now_ms).take(max) {
            e.next_send_ms = now_ms + e.retry_ms;
            e.retry_ms = (e.retry_ms * 2).min(REPORT_RETRY_MAX_MS);
            due.push((e.job, e.run, e.report.clone()));
        }
        due
    }

    /// A leader took the report of run `run` of `job`, or refused it for good: it is gone.
    pub fn delivered(&mut self, job: JobId, run: RunNo) -> Option<R> {
        let at = self.entries.iter().position(|e| e.job == job && e.run == run)?;
        self.entries.remove(at).map(|e| e.report)
    }

    /// When the next report is due (None: nothing queued).
    pub fn next_due_ms(&self) -> Option<u64> {
        self.entries.iter().map(|e| e.next_send_ms).min()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Everything is forgotten: the daemon died, and its queue with it.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::{Outbox, REPORT_RETRY_MAX_MS};

    #[test]
    fn reports_go_oldest_first_in_batches_and_again_until_taken() {
        let mut out = Outbox::new();
        assert!(out.push(1, 1, "a", 0));
        assert!(out.push(2, 1, "b", 0));
        assert!(out.push(3, 1, "c", 5));
        assert!(!out.push(1, 1, "a again", 5), "one report per run");
        assert_eq!(out.due(5, 2), vec![(1, 1, "a"), (2, 1, "b")]);
        assert_eq!(out.due(5, 2), vec![(3, 1, "c")], "the rest of what is due");
        assert!(out.due(54, 10).is_empty(), "nothing due before its retry");
        assert_eq!(out.next_due_ms(), Some(55));
        assert_eq!(out.delivered(2, 1), Some("b"));
        assert_eq!(out.delivered(2, 1), None);
        assert_eq!(out.due(55, 10), vec![(1, 1, "a"), (3, 1, "c")]);
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn a_report_nobody_takes_is_sent_again_ever_more_slowly_up_to_the_cap() {
        let mut out = Outbox::new();
        out.push(1, 1, (), 0);
        let mut sends = Vec::new();
        let mut now = 0;
        while now <= 5_000 {
            if !out.due(now, 1).is_empty() {
                sends.push(now);
            }
            now += 1;
        }
        assert_eq!(&sends[..7], &[0, 50, 150, 350, 750, 1_550, 2_550]);
        assert!(sends.windows(2).all(|w| w[1] - w[0] <= REPORT_RETRY_MAX_MS));
        out.clear();
        assert!(out.is_empty() && out.next_due_ms().is_none());
    }
}
