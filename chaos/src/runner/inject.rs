//! Carrying out the fault plan on a running cluster: the next planned fault injected on a node
//! of its role when its time comes, healed once its hold is over (`FaultSchedule`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::json;

use super::{on_rig, Fault, Harness, PlannedFault};

/// The planned faults as they play out: which comes next, the one in progress, and how many
/// of each (fault, role) were injected.
pub(super) struct FaultSchedule {
    pub(super) plan: Vec<PlannedFault>,
    /// Index in `plan` of the next fault to inject.
    pub(super) next: usize,
    /// (when, what, on which node) heals the fault in progress.
    pub(super) pending_heal: Option<(Instant, PlannedFault, String)>,
    /// Injected faults by `fault:role`.
    pub(super) injected: BTreeMap<String, u32>,
}

impl FaultSchedule {
    /// Heals the fault in progress once its hold is over; then, with none in progress,
    /// injects the next planned fault if `t_ms` (ms since the start) has reached it.
    pub(super) fn step(&mut self, h: &mut Harness, t_ms: u64, rng: &mut StdRng) -> anyhow::Result<()> {
        if let Some((at, f, node)) = self.pending_heal.take() {
            if Instant::now() >= at {
                heal_fault(h, &f, &node)?;
            } else {
                self.pending_heal = Some((at, f, node));
            }
        }
        if self.pending_heal.is_none() && self.next < self.plan.len() && t_ms >= self.plan[self.next].at_ms {
            let f = self.plan[self.next].clone();
            self.next += 1;
            if let Some(node) = inject_fault(h, &f, rng)? {
                *self.injected.entry(format!("{}:{}", f.fault.name(), f.role)).or_default() += 1;
                self.pending_heal = Some((Instant::now() + Duration::from_millis(f.hold_ms), f, node));
            }
        }
        Ok(())
    }

    /// Heals the fault still in progress, if any, whatever its hold.
    pub(super) fn heal_pending(&mut self, h: &mut Harness) -> anyhow::Result<()> {
        if let Some((_, f, node)) = self.pending_heal.take() {
            heal_fault(h, &f, &node)?;
        }
        Ok(())
    }
}

/// Injects planned fault `f` on a node of its role (the rig's host faults through `on_rig`);
/// the node, or none when no node has that role now.
fn inject_fault(h: &mut Harness, f: &PlannedFault, rng: &mut StdRng) -> anyhow::Result<Option<String>> {
    if f.fault == Fault::PowerOff {
        on_rig::power_off(h)?;
        return Ok(Some("all".into()));
    }
    let members = h.members();
    let leader = members.iter().find(|(_, r)| r == "leader").map(|(n, _)| n.clone());
    let voters: Vec<String> = members.iter().filter(|(_, r)| r == "voter" || r == "leader").map(|(n, _)| n.clone()).collect();
    let pick = |names: Vec<String>, rng: &mut StdRng| -> Option<String> {
        if names.is_empty() {
            None
        } else {
            Some(names[rng.gen_range(0..names.len())].clone())
        }
    };
    let target = match f.role {
        "leader" => leader.clone(),
        "voter" => pick(members.iter().filter(|(_, r)| r == "voter").map(|(n, _)| n.clone()).collect(), rng),
        _ => pick(members.iter().filter(|(_, r)| r == "agent").map(|(n, _)| n.clone()).collect(), rng),
    };
    // On the rig, a role no host has (no agent among three voters) falls to any host that runs.
    let target = match target {
        None if h.rig.is_some() => pick(members.iter().map(|(n, _)| n.clone()).filter(|n| !h.down.contains(n)).collect(), rng),
        t => t,
    };
    let Some(node) = target.filter(|n| !h.down.contains(n)) else {
        h.fault_event("skip", "-", json!(format!("no {} to fault ({:?})", f.role, f.fault)));
        return Ok(None);
    };
    if h.rig.is_some() {
        on_rig::inject(h, f, &node, &voters, rng)?;
        return Ok(Some(node));
    }
    match f.fault {
        Fault::Kill => h.signal(&node, "KILL")?,
        Fault::Restart => h.signal(&node, "TERM")?,
        Fault::Upgrade => h.signal(&node, "USR2")?,
        Fault::Pause => h.signal(&node, "STOP")?,
        Fault::Partition => {
            // Either cut the node off from everyone, or (for a voter) only from the other voters.
            let others: Vec<String> = voters.iter().filter(|v| **v != node).cloned().collect();
            let cut = if f.split_voters && voters.contains(&node) { others } else { Vec::new() };
            h.partition(&node, &cut)?;
        }
        Fault::SlowDisk | Fault::ClockSkew => h.set_fault_file(&node, f.fault, f.amount)?,
        other => bail!("{} is a fault of the rig", other.name()),
    }
    Ok(Some(node))
}

/// Heals fault `f` on `node`.
fn heal_fault(h: &mut Harness, f: &PlannedFault, node: &str) -> anyhow::Result<()> {
    if h.rig.is_some() {
        return on_rig::heal(h, f, node);
    }
    match f.fault {
        Fault::Kill | Fault::Restart | Fault::Upgrade => h.start(node),
        Fault::Pause => h.signal(node, "CONT"),
        Fault::Partition => h.heal_partition(node),
        Fault::SlowDisk | Fault::ClockSkew => h.clear_fault_file(node, f.fault),
        other => bail!("{} is a fault of the rig", other.name()),
    }
}
