//! Reservations an admin makes (`scontrol create|update|delete reservation`): nodes set aside
//! for some users or accounts over a window, which no other job may run into (a maintenance
//! window with `Flags=MAINT`). Not the scheduler's backfill reservations, which hold nodes for
//! one blocked job and are made again every pass.

use serde::{Deserialize, Serialize};

/// Reservations a cluster holds at most (ended ones are removed at the next edit).
pub const ADMIN_RESERVATIONS_MAX: usize = 64;
/// Users, accounts or nodes one reservation names at most.
pub const RESERVATION_NAMES_MAX: usize = 10_000;

/// One reservation, its nodes resolved when it was made (`NodeCnt=` picks them then).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdminReservation {
    pub name: String,
    pub start_ms: u64,
    pub end_ms: u64,
    pub nodes: Vec<String>,
    /// Who may run in it: these users, and jobs of these accounts.
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    /// `Flags=MAINT`: the nodes show as `maint`, and it may overlap other reservations.
    pub maint: bool,
    /// `Flags=IGNORE_JOBS`: made though jobs would still run on its nodes when it begins.
    pub ignore_jobs: bool,
    /// Its nodes were named (`Nodes=`), not counted (`NodeCnt=`): Slurm's `SPEC_NODES`.
    pub nodes_named: bool,
    /// `Nodes=ALL`: every node of the cluster, those that join later too (Slurm's
    /// `ALL_NODES`).
    pub all_nodes: bool,
}

impl AdminReservation {
    /// Whether it holds its nodes at `now_ms`.
    pub fn active(&self, now_ms: u64) -> bool {
        self.start_ms <= now_ms && now_ms < self.end_ms
    }

    /// Whether it shares time with `[start_ms, end_ms)`.
    pub fn overlaps(&self, start_ms: u64, end_ms: u64) -> bool {
        self.start_ms < end_ms && start_ms < self.end_ms
    }

    /// Whether a job of `user` and `account` may run in it.
    pub fn admits(&self, user: &str, account: Option<&str>) -> bool {
        self.users.iter().any(|u| u == user) || account.is_some_and(|a| self.accounts.iter().any(|x| x == a))
    }

    /// Its flags by Slurm's names, in Slurm's order (`reservation_flags_string`).
    pub fn flags(&self) -> Vec<&'static str> {
        [(self.maint, "MAINT"), (self.ignore_jobs, "IGNORE_JOBS"), (self.nodes_named, "SPEC_NODES"), (self.all_nodes, "ALL_NODES")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect()
    }

    /// `Flags=` as Slurm shows them.
    pub fn flags_text(&self) -> String {
        let flags = self.flags();
        if flags.is_empty() {
            "(null)".into()
        } else {
            flags.join(",")
        }
    }
}

/// What `scontrol create|update reservation` gives; `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationChanges {
    pub start_ms: Option<u64>,
    pub end_ms: Option<u64>,
    /// `Duration=`: the end is the start plus this.
    pub duration_ms: Option<u64>,
    pub nodes: Option<Vec<String>>,
    /// `Nodes=ALL`: every node (the state resolves them; `nodes` is not given with it).
    #[serde(default)]
    pub all_nodes: bool,
    /// `NodeCnt=`: this many nodes, chosen when it is made.
    pub node_count: Option<u32>,
    pub users: Option<Vec<String>>,
    pub accounts: Option<Vec<String>>,
    pub maint: Option<bool>,
    pub ignore_jobs: Option<bool>,
}

/// One change to the reservations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReservationEdit {
    /// `name`: none gives `USER_N` (or `ACCOUNT_N`), as Slurm names it.
    Create {
        name: Option<String>,
        changes: ReservationChanges,
    },
    Update {
        name: String,
        changes: ReservationChanges,
    },
    Delete {
        name: String,
    },
}

impl ReservationChanges {
    /// The reservation `self` makes of `base` (a new one: the default), or why not in Slurm's
    /// words; its nodes are checked by the caller, which knows them.
    pub fn apply_to(&self, base: &AdminReservation, creating: bool) -> Result<AdminReservation, String> {
        let mut r = base.clone();
        if creating {
            if self.start_ms.is_none() {
                return Err("A start time must be given.  No reservation created.".into());
            }
            if self.end_ms.is_none() && self.duration_ms.is_none() {
                return Err("An end time or duration must be given.  No reservation created.".into());
            }
            if self.users.as_ref().is_none_or(Vec::is_empty) && self.accounts.as_ref().is_none_or(Vec::is_empty) {
                return Err("Either Users/Groups and/or Accounts must be specified.  No reservation created.".into());
            }
            if self.nodes.is_none() && !self.all_nodes && self.node_count.is_none() {
                return Err("Nodes or NodeCnt must be given.  No reservation created.".into());
            }
        }
        let length_ms = r.end_ms.saturating_sub(r.start_ms);
        if let Some(s) = self.start_ms {
            r.start_ms = s;
            // A new start keeps the length unless the end is given too, as in Slurm.
            r.end_ms = s.saturating_add(length_ms);
        }
        if let Some(e) = self.end_ms {
            r.end_ms = e;
        }
        if let Some(d) = self.duration_ms {
            r.end_ms = r.start_ms.saturating_add(d);
        }
        if r.end_ms <= r.start_ms {
            return Err("Invalid time specification (start time after end time)".into());
        }
        if let Some(n) = &self.nodes {
            r.nodes.clone_from(n);
            (r.nodes_named, r.all_nodes) = (true, false);
        } else if self.all_nodes {
            (r.nodes_named, r.all_nodes) = (true, true);
        } else if self.node_count.is_some() {
            (r.nodes_named, r.all_nodes) = (false, false);
        }
        if let Some(u) = &self.users {
            r.users.clone_from(u);
        }
        if let Some(a) = &self.accounts {
            r.accounts.clone_from(a);
        }
        if let Some(m) = self.maint {
            r.maint = m;
        }
        if let Some(i) = self.ignore_jobs {
            r.ignore_jobs = i;
        }
        let too_many = [&r.nodes, &r.users, &r.accounts].iter().any(|l| l.len() > RESERVATION_NAMES_MAX);
        if too_many || [&r.users, &r.accounts].iter().any(|l| l.iter().any(|n| n.is_empty() || n.len() > 64)) {
            return Err(format!("at most {RESERVATION_NAMES_MAX} nodes, users and accounts, each name 1-64 bytes"));
        }
        if r.users.is_empty() && r.accounts.is_empty() {
            return Err("Either Users/Groups and/or Accounts must be specified".into());
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_needs_what_slurm_needs_and_an_update_keeps_the_length() {
        let base = AdminReservation::default();
        let full = ReservationChanges {
            start_ms: Some(1_000),
            duration_ms: Some(600_000),
            nodes: Some(vec!["n1".into()]),
            users: Some(vec!["root".into()]),
            ..Default::default()
        };
        let r = full.apply_to(&base, true).expect("created");
        assert_eq!((r.start_ms, r.end_ms), (1_000, 601_000));
        for (missing, words) in [
            (ReservationChanges { start_ms: None, ..full.clone() }, "A start time must be given."),
            (ReservationChanges { duration_ms: None, ..full.clone() }, "An end time or duration must be given."),
            (ReservationChanges { users: None, ..full.clone() }, "Either Users/Groups and/or Accounts must be specified."),
            (ReservationChanges { nodes: None, ..full.clone() }, "Nodes or NodeCnt must be given."),
        ] {
            assert!(missing.apply_to(&base, true).unwrap_err().starts_with(words), "{words}");
        }
        let later = ReservationChanges { start_ms: Some(5_000), ..Default::default() };
        let moved = later.apply_to(&r, false).expect("moved");
        assert_eq!((moved.start_ms, moved.end_ms), (5_000, 605_000));
        let backwards = ReservationChanges { end_ms: Some(10), ..Default::default() };
        assert!(backwards.apply_to(&r, false).is_err());
        assert!(r.admits("root", None) && !r.admits("bob", Some("phys")));
        assert!(r.overlaps(600_000, 700_000) && !r.overlaps(601_000, 700_000));
        assert_eq!(AdminReservation { maint: true, ..r.clone() }.flags_text(), "MAINT,SPEC_NODES");
        // `Nodes=ALL` makes it: ALL_NODES after SPEC_NODES, as Slurm shows them.
        let all = ReservationChanges { nodes: None, all_nodes: true, ignore_jobs: Some(true), maint: Some(true), ..full.clone() };
        let everything = all.apply_to(&base, true).expect("created");
        assert_eq!(everything.flags_text(), "MAINT,IGNORE_JOBS,SPEC_NODES,ALL_NODES");
        // Named nodes, or a count, after it: no longer all.
        let named = ReservationChanges { nodes: Some(vec!["n1".into()]), ..Default::default() };
        assert_eq!(named.apply_to(&everything, false).expect("updated").flags_text(), "MAINT,IGNORE_JOBS,SPEC_NODES");
        let counted = ReservationChanges { node_count: Some(1), ..Default::default() };
        assert_eq!(counted.apply_to(&everything, false).expect("updated").flags_text(), "MAINT,IGNORE_JOBS");
    }
}
