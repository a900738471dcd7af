//! Admins' reservations as one pass sees them: windows of time on some nodes that no other job
//! may run into, and that a job naming one may only run inside. One bit per window, so a job's
//! fence is a mask the pass's cache of failed shapes can key on.

use std::collections::BTreeMap;

use crate::format::fmt_time_ms;
use crate::view::{ClusterView, JobRequest};

/// Windows one pass considers at most (one bit each in [`Fence::windows`]).
pub const WINDOWS_MAX: usize = 64;

struct Window {
    name: String,
    start_ms: u64,
    end_ms: u64,
    maint: bool,
}

/// What fences a job off nodes in one placement attempt: the backfill reservations it would
/// run into (bit k: the pass's k-th), the admins' windows it would run into, and the window it
/// must run in (its `--reservation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fence {
    pub backfill: u32,
    pub windows: u64,
    pub own: Option<u8>,
}

pub struct Windows {
    list: Vec<Window>,
    /// Bit w set on each node (by the pass's node index) that window w holds.
    of_node: Vec<u64>,
}

impl Windows {
    /// The view's reservations not ended at `now_ms`, the first [`WINDOWS_MAX`] by start.
    pub fn new(view: &ClusterView, now_ms: u64, name_ix: &BTreeMap<&str, usize>, nodes: usize) -> Windows {
        let mut live: Vec<&proto::AdminReservation> = view.reservations.iter().filter(|r| r.end_ms > now_ms).collect();
        live.sort_by_key(|r| (r.start_ms, r.name.as_str()));
        live.truncate(WINDOWS_MAX);
        let mut of_node = vec![0u64; nodes];
        for (w, r) in live.iter().enumerate() {
            for n in r.nodes.iter().filter_map(|n| name_ix.get(n.as_str())) {
                of_node[*n] |= 1 << w;
            }
        }
        let list = live.iter().map(|r| Window { name: r.name.clone(), start_ms: r.start_ms, end_ms: r.end_ms, maint: r.maint }).collect();
        Windows { list, of_node }
    }

    /// The window `j` must run in, if it names one that is here.
    pub fn own(&self, j: &JobRequest) -> Option<u8> {
        let name = j.reservation.as_deref()?;
        self.list.iter().position(|w| w.name == name).map(|w| w as u8)
    }

    /// The windows `j`, running from `now_ms` to `end_ms` (`None`: no limit), would run into.
    pub fn in_way(&self, j: &JobRequest, now_ms: u64, end_ms: Option<u64>) -> u64 {
        let own = self.own(j);
        let mut mask = 0;
        for (w, win) in self.list.iter().enumerate() {
            if own != Some(w as u8) && win.end_ms > now_ms && end_ms.is_none_or(|e| e > win.start_ms) {
                mask |= 1 << w;
            }
        }
        mask
    }

    /// Whether node `n` is open to a job behind `fence`.
    pub fn node_ok(&self, n: usize, fence: Fence) -> bool {
        let held = self.of_node.get(n).copied().unwrap_or(0);
        held & fence.windows == 0 && fence.own.is_none_or(|w| held & (1 << w) != 0)
    }

    /// Why `j` may not start yet whatever the nodes: its reservation has not begun, or is gone.
    pub fn eligibility(&self, j: &JobRequest, now_ms: u64) -> Option<String> {
        let name = j.reservation.as_deref()?;
        match self.own(j).map(|w| &self.list[w as usize]) {
            None => Some(format!("ReservationDeleted: reservation {name} does not exist (or ended)")),
            Some(w) if w.start_ms > now_ms => Some(format!("Reservation: reservation {name} begins at {}", fmt_time_ms(w.start_ms))),
            Some(_) => None,
        }
    }

    /// When a window next begins or ends after `now_ms`: the jobs it fences or admits change.
    pub fn next_change_ms(&self, now_ms: u64) -> Option<u64> {
        self.list.iter().flat_map(|w| [w.start_ms, w.end_ms]).filter(|&t| t > now_ms).min()
    }

    /// Why a job that would fit but for the windows in `mask` waits: Slurm's description when
    /// one is a maintenance window.
    pub fn reason(&self, mask: u64) -> String {
        let mut held = self.list.iter().enumerate().filter(|(w, _)| mask & (1 << w) != 0).map(|(_, w)| w);
        match held.clone().find(|w| w.maint) {
            Some(_) => "ReqNodeNotAvail: ReqNodeNotAvail, Reserved for maintenance".into(),
            None => match held.next() {
                Some(w) => format!("Resources: nodes reserved by {} from {}", w.name, fmt_time_ms(w.start_ms)),
                None => "Resources".into(),
            },
        }
    }

    /// `j` fenced off every window but its own, whenever it ran (backfill planning).
    pub fn fence_all(&self, j: &JobRequest) -> Fence {
        let own = self.own(j);
        Fence { backfill: 0, windows: !own.map_or(0, |w| 1u64 << w), own }
    }

    /// The earliest time from `at_ms` at which node `n` may hold a job behind `fence` for
    /// `limit_ms` (`None`: no limit), past every window in its way; `None` if never.
    pub fn earliest_ms(&self, n: usize, fence: Fence, mut at_ms: u64, limit_ms: Option<u64>) -> Option<u64> {
        let held = self.of_node.get(n).copied().unwrap_or(0);
        if let Some(w) = fence.own {
            if held & (1 << w) == 0 {
                return None;
            }
            at_ms = at_ms.max(self.list[w as usize].start_ms);
        }
        // Windows are in start order: one pass pushes the start past each in turn.
        for (w, win) in self.list.iter().enumerate() {
            let runs_into = at_ms < win.end_ms && limit_ms.is_none_or(|l| at_ms.saturating_add(l) > win.start_ms);
            if held & fence.windows & (1 << w) != 0 && runs_into {
                at_ms = win.end_ms;
            }
        }
        Some(at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: u64 = 3_600_000;

    fn windows() -> Windows {
        let resv = |name: &str, start_ms: u64, nodes: &[&str], maint: bool| proto::AdminReservation {
            name: name.into(),
            start_ms,
            end_ms: start_ms + HOUR,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            users: vec!["root".into()],
            maint,
            ..Default::default()
        };
        let view = ClusterView {
            reservations: vec![
                resv("late", 4 * HOUR, &["n2"], false),
                resv("maint", 2 * HOUR, &["n1", "n2"], true),
                resv("old", 0, &["n1"], false),
            ],
            ..Default::default()
        };
        let names = BTreeMap::from([("n1", 0), ("n2", 1)]);
        Windows::new(&view, HOUR + 1, &names, 2)
    }

    #[test]
    fn a_job_is_fenced_off_the_windows_it_would_run_into_and_into_its_own() {
        let w = windows();
        let mut j = crate::view::job_request(&proto::Job::submitted(1, std::sync::Arc::new(crate::testkit::spec("gpu:1", 1)), 0));
        assert_eq!(w.in_way(&j, HOUR + 1, Some(2 * HOUR)), 0, "ends as maint begins; old ended");
        let maint = w.in_way(&j, HOUR + 1, Some(2 * HOUR + 1));
        assert_eq!(maint, 0b01);
        assert_eq!(w.in_way(&j, HOUR + 1, None), 0b11, "no limit: every window ahead");
        let fence = Fence { windows: maint, ..Fence::default() };
        assert!(!w.node_ok(0, fence) && !w.node_ok(1, fence));
        assert_eq!(w.reason(maint), "ReqNodeNotAvail: ReqNodeNotAvail, Reserved for maintenance");
        assert!(w.reason(0b10).starts_with("Resources: nodes reserved by late from "));
        // Past every window in the way: n1 after maint; n2 after late too, for a long job.
        assert_eq!(w.earliest_ms(0, Fence { windows: 0b11, ..fence }, HOUR, Some(2 * HOUR)), Some(3 * HOUR));
        assert_eq!(w.earliest_ms(1, Fence { windows: 0b11, ..fence }, HOUR, Some(2 * HOUR)), Some(5 * HOUR));
        assert_eq!(w.next_change_ms(HOUR + 1), Some(2 * HOUR));
        // A job of `late` waits for it to begin, and runs only on its node.
        j.reservation = Some("late".into());
        assert!(w.eligibility(&j, HOUR).is_some_and(|r| r.starts_with("Reservation: reservation late begins at ")));
        let own = Fence { own: w.own(&j), windows: w.in_way(&j, 4 * HOUR, Some(4 * HOUR + 60_000)), ..Fence::default() };
        assert_eq!(own.windows, 0, "its own window is not in its way");
        assert!(w.node_ok(1, own) && !w.node_ok(0, own));
        assert_eq!(w.earliest_ms(1, own, HOUR, Some(60_000)), Some(4 * HOUR));
        j.reservation = Some("gone".into());
        assert!(w.eligibility(&j, HOUR).is_some_and(|r| r.starts_with("ReservationDeleted: ")));
    }
}
