//! Reservations an admin makes (`scontrol create|update|delete reservation`): creating,
//! changing and deleting one against the nodes and jobs it would hold (`Nodes=ALL`: every
//! node, those that join later too), and what a submission naming one must meet. Ended
//! reservations are dropped at the next edit.

use proto::{AdminReservation, CommandResult, Job, JobSpec, ReservationChanges, ReservationEdit};

use super::{rejected, ClusterState};

/// Slurm's words when a reservation would hold nodes its window cannot have.
const NODES_BUSY: &str = "Requested nodes are busy";
const INVALID: &str = "Requested reservation is invalid";

impl ClusterState {
    pub(super) fn edit_reservation(&mut self, edit: &ReservationEdit, now_ms: u64) -> CommandResult {
        self.reservations.retain(|_, r| r.end_ms > now_ms);
        match edit {
            ReservationEdit::Create { name, changes } => {
                if self.reservations.len() >= proto::ADMIN_RESERVATIONS_MAX {
                    return rejected(format!("at most {} reservations", proto::ADMIN_RESERVATIONS_MAX));
                }
                let name = match name {
                    Some(n) if n.is_empty() || n.len() > 64 || n.contains([' ', ',']) => return rejected(INVALID.to_string()),
                    Some(n) if self.reservations.contains_key(n) => return rejected("Duplicate reservation name".to_string()),
                    Some(n) => n.clone(),
                    None => self.reservation_name(changes),
                };
                let base = AdminReservation { name: name.clone(), ..Default::default() };
                match self.checked_reservation(&base, changes, true, now_ms) {
                    Ok(r) => {
                        self.reservations.insert(name.clone(), r);
                        CommandResult::ReservationMade { name }
                    }
                    Err(why) => rejected(why),
                }
            }
            ReservationEdit::Update { name, changes } => {
                let Some(base) = self.reservations.get(name).cloned() else { return rejected(INVALID.to_string()) };
                match self.checked_reservation(&base, changes, false, now_ms) {
                    Ok(r) => {
                        self.reservations.insert(name.clone(), r);
                        CommandResult::Ok
                    }
                    Err(why) => rejected(why),
                }
            }
            ReservationEdit::Delete { name } => {
                if !self.reservations.contains_key(name) {
                    return rejected(INVALID.to_string());
                }
                let in_use = self.holding_parts.iter().filter_map(|id| self.jobs.get(id)).any(|j| j.spec.reservation() == Some(name));
                if in_use {
                    return rejected("Requested reservation is in use".to_string());
                }
                self.reservations.remove(name);
                CommandResult::Ok
            }
        }
    }

    /// A node that joined the cluster joins every `Nodes=ALL` reservation (as slurmctld's
    /// `ALL_NODES` ones follow its node table), up to [`proto::RESERVATION_NAMES_MAX`] nodes.
    pub(super) fn node_joined_reservations(&mut self, name: &str) {
        for r in self.reservations.values_mut().filter(|r| r.all_nodes && r.nodes.len() < proto::RESERVATION_NAMES_MAX) {
            if let Err(at) = r.nodes.binary_search_by(|n| n.as_str().cmp(name)) {
                r.nodes.insert(at, name.to_string());
            }
        }
    }

    /// `USER_N` (else `ACCOUNT_N`) with the lowest N free, as Slurm names an unnamed one.
    fn reservation_name(&self, changes: &ReservationChanges) -> String {
        let first = changes.users.iter().chain(changes.accounts.iter()).flatten().next().map_or("resv", String::as_str);
        (1..).map(|n| format!("{first}_{n}")).find(|n| !self.reservations.contains_key(n)).unwrap_or_default()
    }

    /// `base` changed by `changes`, its nodes resolved (`NodeCnt=` picks free ones, in name
    /// order), or why not in Slurm's words: a node it does not know, a window that overlaps
    /// another reservation's on a shared node (unless either is `MAINT`), or, without
    /// `IGNORE_JOBS`, a running job on its nodes that may still run when it begins.
    fn checked_reservation(
        &self,
        base: &AdminReservation,
        changes: &ReservationChanges,
        creating: bool,
        now_ms: u64,
    ) -> Result<AdminReservation, String> {
        let mut r = changes.apply_to(base, creating)?;
        if r.end_ms <= now_ms {
            return Err("Invalid time specification (end time in the past)".into());
        }
        let others: Vec<&AdminReservation> = self.reservations.values().filter(|o| o.name != r.name).collect();
        let clashes = |node: &str, r: &AdminReservation| {
            others.iter().any(|o| !(o.maint || r.maint) && o.overlaps(r.start_ms, r.end_ms) && o.nodes.iter().any(|n| n == node))
        };
        // Checked when where or when it begins is set: a running job may have outgrown an
        // older reservation's window (an update of its users does not fail on that).
        let moved = creating || changes.nodes.is_some() || changes.all_nodes || changes.node_count.is_some() || changes.start_ms.is_some();
        let busy = |node: &str, r: &AdminReservation| moved && !r.ignore_jobs && self.runs_into(node, r.start_ms, Some(&r.name));
        if changes.all_nodes && changes.nodes.is_none() {
            // `Nodes=ALL`: every node the cluster has, whatever its state (Slurm's active
            // bitmap), by name.
            let mut all: Vec<String> = self.nodes.values().map(|n| n.name.clone()).collect();
            all.sort_unstable();
            if all.is_empty() || all.len() > proto::RESERVATION_NAMES_MAX {
                return Err("Invalid node name specified".into());
            }
            r.nodes = all;
        }
        if let Some(count) = changes.node_count.filter(|_| changes.nodes.is_none() && !changes.all_nodes) {
            let mut up: Vec<&str> = self.nodes.values().filter(|n| n.state == proto::NodeState::Up).map(|n| n.name.as_str()).collect();
            up.sort_unstable();
            let free: Vec<String> = up.into_iter().filter(|n| !clashes(n, &r) && !busy(n, &r)).map(str::to_string).collect();
            if free.len() < count as usize || count == 0 {
                return Err(NODES_BUSY.into());
            }
            r.nodes = free.into_iter().take(count as usize).collect();
        }
        if r.nodes.iter().any(|n| !self.nodes.values().any(|rec| &rec.name == n)) {
            return Err("Invalid node name specified".into());
        }
        if r.nodes.iter().any(|n| clashes(n, &r)) {
            return Err("Requested reservation overlaps with another reservation".into());
        }
        if r.nodes.iter().any(|n| busy(n, &r)) {
            return Err(NODES_BUSY.into());
        }
        Ok(r)
    }

    /// Whether a running job (not one of reservation `own`) on node `name` may still run at
    /// `at_ms` by its time limit (one without a limit always may).
    fn runs_into(&self, name: &str, at_ms: u64, own: Option<&str>) -> bool {
        let Some(id) = self.nodes.values().find(|n| n.name == name).map(|n| n.id) else { return false };
        let on_node = |j: &&Job| j.parts.iter().any(|p| p.run == j.run && p.alloc.node == id);
        self.holding_parts.iter().filter_map(|j| self.jobs.get(j)).filter(on_node).any(|j| {
            let end = match (j.start_ms, j.spec.time_limit_ms) {
                (Some(start), Some(limit)) => start.saturating_add(j.suspension.paused_ms).saturating_add(limit),
                _ => u64::MAX,
            };
            end > at_ms && (own.is_none() || j.spec.reservation() != own)
        })
    }

    /// Why a submission naming a reservation is refused, in Slurm's words: one that does not
    /// exist (or ended), or that does not admit the job's user or account.
    pub fn reservation_refusal(&self, spec: &JobSpec, now_ms: u64) -> Option<&'static str> {
        let name = spec.reservation()?;
        match self.reservations.get(name).filter(|r| r.end_ms > now_ms) {
            None => Some(INVALID),
            Some(r) if !r.admits(&spec.user, spec.account.as_deref()) => Some("Access denied to requested reservation"),
            Some(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, ReservationChanges, ReservationEdit};

    use crate::cluster::test_support::{alloc, inventory, plan, register, spec, submit, with_node_n1};
    use crate::cluster::ClusterState;

    const HOUR: u64 = 3_600_000;

    fn edit(s: &mut ClusterState, edit: ReservationEdit, now_ms: u64) -> CommandResult {
        s.apply(&Command::EditReservation { edit, now_ms })
    }

    fn window(start_ms: u64, nodes: &[&str], maint: bool) -> ReservationChanges {
        ReservationChanges {
            start_ms: Some(start_ms),
            duration_ms: Some(HOUR),
            nodes: Some(nodes.iter().map(|n| n.to_string()).collect()),
            users: Some(vec!["root".into()]),
            maint: Some(maint),
            ..Default::default()
        }
    }

    #[test]
    fn create_update_delete_answer_as_slurm_does() {
        let mut s = with_node_n1(inventory(8));
        let create = |name: Option<&str>, c: ReservationChanges| ReservationEdit::Create { name: name.map(str::to_string), changes: c };
        assert_eq!(edit(&mut s, create(None, window(HOUR, &["n1"], true)), 0), CommandResult::ReservationMade { name: "root_1".into() });
        // A MAINT one may overlap; two plain ones may not.
        assert_eq!(edit(&mut s, create(None, window(HOUR, &["n1"], false)), 0), CommandResult::ReservationMade { name: "root_2".into() });
        assert_eq!(
            edit(&mut s, create(Some("x"), window(HOUR, &["n1"], false)), 0),
            CommandResult::Rejected("Requested reservation overlaps with another reservation".into())
        );
        assert_eq!(
            edit(&mut s, create(Some("root_1"), window(5 * HOUR, &["n1"], false)), 0),
            CommandResult::Rejected("Duplicate reservation name".into())
        );
        assert_eq!(
            edit(&mut s, create(Some("y"), window(5 * HOUR, &["n9"], false)), 0),
            CommandResult::Rejected("Invalid node name specified".into())
        );
        let counted = ReservationChanges { nodes: None, node_count: Some(1), ..window(5 * HOUR, &[], false) };
        assert_eq!(edit(&mut s, create(Some("c"), counted), 0), CommandResult::ReservationMade { name: "c".into() });
        assert_eq!(s.reservations["c"].nodes, vec!["n1".to_string()]);
        // A running job without a time limit is in the way of a window; IGNORE_JOBS makes it anyway.
        let job = submit(&mut s, spec(1, 1));
        assert_eq!(plan(&mut s, job, 1, vec![alloc(1, &[0])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        assert_eq!(
            edit(&mut s, create(Some("z"), window(9 * HOUR, &["n1"], false)), 0),
            CommandResult::Rejected("Requested nodes are busy".into())
        );
        let ignoring = ReservationChanges { ignore_jobs: Some(true), ..window(9 * HOUR, &["n1"], false) };
        assert_eq!(edit(&mut s, create(Some("z"), ignoring), 0), CommandResult::ReservationMade { name: "z".into() });
        // Update keeps the length; delete; ended ones are dropped at the next edit.
        let later = ReservationChanges { start_ms: Some(20 * HOUR), ..Default::default() };
        assert_eq!(edit(&mut s, ReservationEdit::Update { name: "z".into(), changes: later }, 0), CommandResult::Ok);
        assert_eq!((s.reservations["z"].start_ms, s.reservations["z"].end_ms), (20 * HOUR, 21 * HOUR));
        assert_eq!(edit(&mut s, ReservationEdit::Delete { name: "z".into() }, 0), CommandResult::Ok);
        assert_eq!(
            edit(&mut s, ReservationEdit::Delete { name: "z".into() }, 0),
            CommandResult::Rejected("Requested reservation is invalid".into())
        );
        let later = ReservationChanges { users: Some(vec!["root".into(), "alice".into()]), ..Default::default() };
        assert_eq!(edit(&mut s, ReservationEdit::Update { name: "c".into(), changes: later }, 3 * HOUR), CommandResult::Ok);
        assert_eq!(s.reservations.keys().collect::<Vec<_>>(), ["c"], "root_1 and root_2 ended at 2 h");
        // A submission naming one.
        let mut job = spec(1, 1);
        job.set_reservation(Some("c"));
        job.user = "bob".into();
        assert_eq!(s.reservation_refusal(&job, 0), Some("Access denied to requested reservation"));
        job.user = "alice".into();
        assert_eq!(s.reservation_refusal(&job, 0), None);
        job.set_reservation(Some("nope"));
        assert_eq!(s.reservation_refusal(&job, 0), Some("Requested reservation is invalid"));
    }

    #[test]
    fn nodes_all_covers_every_node_and_those_that_join() {
        let mut s = with_node_n1(inventory(8));
        register(&mut s, "n2", 2);
        let all = |maint: bool, ignore_jobs: bool| ReservationChanges {
            nodes: None,
            all_nodes: true,
            ignore_jobs: Some(ignore_jobs),
            ..window(HOUR, &[], maint)
        };
        let create = |name: &str, c: ReservationChanges| ReservationEdit::Create { name: Some(name.into()), changes: c };
        // A job running on n2 without a time limit is in the way, unless IGNORE_JOBS.
        let job = submit(&mut s, spec(1, 1));
        assert_eq!(plan(&mut s, job, 1, vec![alloc(2, &[0])]), CommandResult::Planned { accepted: vec![job], rejected: vec![] });
        assert_eq!(edit(&mut s, create("busy", all(true, false)), 0), CommandResult::Rejected("Requested nodes are busy".into()));
        assert_eq!(edit(&mut s, create("maint", all(true, true)), 0), CommandResult::ReservationMade { name: "maint".into() });
        let r = &s.reservations["maint"];
        assert_eq!(
            (r.nodes.clone(), r.flags_text()),
            (vec!["n1".to_string(), "n2".to_string()], "MAINT,IGNORE_JOBS,SPEC_NODES,ALL_NODES".into())
        );
        // A node that joins is in it.
        register(&mut s, "n0", 3);
        assert_eq!(s.reservations["maint"].nodes, ["n0", "n1", "n2"]);
        // Named nodes after it: no longer every node, and a node that joins then is not in it.
        let named = ReservationChanges { nodes: Some(vec!["n1".into()]), ..Default::default() };
        assert_eq!(edit(&mut s, ReservationEdit::Update { name: "maint".into(), changes: named }, 0), CommandResult::Ok);
        register(&mut s, "n3", 4);
        let r = &s.reservations["maint"];
        assert_eq!((r.nodes.clone(), r.flags_text()), (vec!["n1".to_string()], "MAINT,IGNORE_JOBS,SPEC_NODES".into()));
    }
}
