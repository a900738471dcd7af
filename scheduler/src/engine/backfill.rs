//! EASY backfill: the timeline of when running jobs free what they hold, and the reservation of
//! the first job that cannot start now (`reserve`), which later jobs must not delay.

use std::collections::BTreeMap;

use proto::{Allocation, NodeId};

use super::{Pass, Reservation, Resv, Spare};
use crate::fit::node_matches;
use crate::units::{Freeing, Kinds};
use crate::view::JobRequest;

impl Pass<'_> {
    pub(super) fn job_end_ms(&self, j: &JobRequest) -> u64 {
        match self.effective_limit_ms(j) {
            Some(l) => j.start_ms.unwrap_or(self.now_ms).saturating_add(l).max(self.now_ms),
            None => u64::MAX,
        }
    }

    pub(super) fn ensure_timeline(&mut self) {
        if self.timeline.is_some() {
            return;
        }
        let mut t: Vec<Vec<(u64, Allocation)>> = vec![Vec::new(); self.nodes.len()];
        for j in &self.view.jobs {
            if j.held.is_empty() {
                continue;
            }
            let end = self.job_end_ms(j);
            for a in &j.held {
                if let Some(&n) = self.node_ix.get(&a.node) {
                    // Parts of an earlier run are stopping: count them free now.
                    let e = if j.running.contains(a) { end } else { self.now_ms };
                    t[n].push((e, a.clone()));
                }
            }
        }
        for (n, end, a) in &self.placed {
            t[*n].push((*end, a.clone()));
        }
        for v in &mut t {
            v.sort_by_key(|e| e.0);
        }
        self.timeline = Some(t);
    }

    /// The EASY reservation for `j`: the earliest time `j.nodes` matching nodes have what it
    /// needs once running jobs end at their time limits, and those nodes.
    pub(super) fn reserve(&mut self, j: &JobRequest, part: u16, tid: u16) -> Option<Reservation> {
        self.ensure_timeline();
        let timeline = self.timeline.as_ref()?;
        let b = self.index.get(&(part, tid))?;
        let (fence, limit_ms) = (self.windows.fence_all(j), self.effective_limit_ms(j));
        let kinds = self.kinds();
        let mut times: Vec<(u64, NodeId, usize)> = Vec::new();
        for n in b.all() {
            let n = n as usize;
            let node = &self.nodes[n];
            // An earlier reservation holds it: reservations never share a node.
            if node_matches(node, j).is_err() || self.resv_of_node.contains_key(&n) {
                continue;
            }
            let mut free = Freeing::new(kinds, node, j, tid);
            let enough = |f: &Freeing, idle: bool| f.enough() && (!j.exclusive || idle);
            let releases = &timeline[n];
            let mut at = if enough(&free, releases.is_empty() && node.idle()) { Some(self.now_ms) } else { None };
            // Sorted by end: releases that never come (no time limit) free nothing to plan on.
            let mut k = if releases.first().is_some_and(|r| r.0 == u64::MAX) { releases.len() } else { 0 };
            while at.is_none() && k < releases.len() {
                let (end, a) = &releases[k];
                free.release(a);
                k += 1;
                let done = k == releases.len() || releases[k].0 > *end;
                if done && enough(&free, k == releases.len()) && *end != u64::MAX {
                    at = Some(*end);
                }
            }
            // Past the admins' windows in its way (or into its own).
            if let Some(t) = at.and_then(|t| self.windows.earliest_ms(n, fence, t, limit_ms)) {
                times.push((t, node.id, n));
            }
        }
        if times.len() < j.nodes as usize {
            return None;
        }
        times.sort_by_key(|e| (e.0, e.1));
        times.truncate(j.nodes as usize);
        let start_ms = times.last().map(|e| e.0)?;
        let mut spare = BTreeMap::new();
        for (_, _, n) in &times {
            let mut f = Freeing::new(kinds, &self.nodes[*n], j, tid);
            timeline[*n].iter().filter(|e| e.0 <= start_ms).for_each(|(_, a)| f.release(a));
            let s = if j.exclusive {
                Spare { gpus: 0, cpus: 0, mem_mib: 0 }
            } else {
                Spare {
                    gpus: f.units.saturating_sub(Kinds::units_needed(j)),
                    cpus: f.cpus.saturating_sub(j.cpus_per_node),
                    mem_mib: f.mem_mib.saturating_sub(j.mem_per_node_mib),
                }
            };
            spare.insert(*n, s);
        }
        let nodes: Vec<NodeId> = times.iter().map(|e| e.1).collect();
        for &n in spare.keys() {
            self.resv_of_node.insert(n, self.resvs.len());
        }
        self.resvs.push(Resv { job: j.id, start_ms, tid, spare });
        Some(Reservation { job: j.id, start_ms, nodes })
    }
}
