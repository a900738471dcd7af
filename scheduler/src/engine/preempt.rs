//! Preemption: the running jobs of lower QoS whose stop lets a job of a QoS allowed to preempt
//! them start next pass (`try_preempt`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use proto::{JobId, JobState, NodeId};

use super::Pass;
use crate::fit::node_matches;
use crate::units::Freeing;
use crate::view::{JobRequest, PreemptAction};

impl Pass<'_> {
    /// Chooses running jobs to preempt so `j` fits next pass; `None` when its QoS may not
    /// preempt or preempting cannot make room.
    pub(super) fn try_preempt(&mut self, j: &JobRequest, i: usize, part: u16, tid: u16) -> Option<Vec<JobId>> {
        let view = self.view;
        let qos = view.config.qos.get(j.qos.as_deref().unwrap_or("normal"))?;
        if qos.preempt.is_empty() {
            return None;
        }
        let my_prio = self.prio[i];
        let b = self.index.get(&(part, tid))?;
        // Running jobs of a preemptible QoS, by node.
        let mut victims_on: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (vi, v) in view.jobs.iter().enumerate() {
            if v.state != JobState::Running || v.running.is_empty() || self.preempted.contains(&v.id) || v.id == j.id {
                continue;
            }
            if !qos.preempt.iter().any(|q| q == v.qos.as_deref().unwrap_or("normal")) {
                continue;
            }
            for a in &v.running {
                if let Some(&n) = self.node_ix.get(&a.node) {
                    victims_on.entry(n).or_default().push(vi);
                }
            }
        }
        let mut options: Vec<(usize, u32, NodeId, usize, Vec<usize>)> = Vec::new();
        for n in b.all() {
            let n = n as usize;
            let node = &self.nodes[n];
            if node_matches(node, j).is_err() {
                continue;
            }
            let mut vs = victims_on.get(&n).cloned().unwrap_or_default();
            vs.sort_by_key(|&vi| (self.prio[vi], Reverse(view.jobs[vi].start_ms), view.jobs[vi].id));
            vs.dedup();
            let mut free = Freeing::new(self.kinds(), node, j, tid);
            let mut chosen = Vec::new();
            let mut gpus_taken = 0;
            for &vi in &vs {
                if free.enough() && !j.exclusive {
                    break;
                }
                if self.prio[vi] >= my_prio {
                    break;
                }
                for a in view.jobs[vi].running.iter().filter(|a| a.node == node.id) {
                    gpus_taken += self.kinds().freed(node, a, tid);
                    free.release(a);
                }
                chosen.push(vi);
            }
            let idle_after = !j.exclusive || (free.cpus == node.cpus_total && free.mem_mib == node.mem_total_mib);
            if free.enough() && idle_after {
                options.push((chosen.len(), gpus_taken, node.id, n, chosen));
            }
        }
        if options.len() < j.nodes as usize {
            return None;
        }
        options.sort_by_key(|o| (o.0, o.1, o.2));
        let mut victims: BTreeSet<usize> = BTreeSet::new();
        for o in options.iter().take(j.nodes as usize) {
            victims.extend(o.4.iter().copied());
        }
        if victims.is_empty() {
            return None;
        }
        let mut ids = Vec::new();
        for vi in victims {
            let v = &view.jobs[vi];
            let mode = view.config.qos.get(v.qos.as_deref().unwrap_or("normal")).map_or(PreemptAction::Requeue, |q| q.preempt_mode);
            let action = if mode == PreemptAction::Requeue && !v.requeue { PreemptAction::Cancel } else { mode };
            self.preempted.insert(v.id);
            self.plan.preemptions.push((v.id, action));
            ids.push(v.id);
        }
        ids.sort_unstable();
        Some(ids)
    }
}
