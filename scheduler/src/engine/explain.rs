//! Why a pending job waits, in words: what it could never fit, what a partition holds, which
//! nodes and jobs hold what it needs (`explain` and its texts).

use std::collections::{BTreeMap, BTreeSet};

use proto::JobId;

use super::{Fail, Pass};
use crate::fit::node_matches;
use crate::format::fmt_time_ms;
use crate::units::{Kinds, ANY};
use crate::view::{decode_slot, mig_slot, JobRequest, Slot};

impl Pass<'_> {
    /// Why `j` could never fit (capacity, features, partition), or a generic text.
    pub(super) fn never_text(&self, j: &JobRequest, part: u16) -> String {
        let pname = &self.part_names[part as usize];
        if !self.index.contains_key(&(part, ANY)) {
            return format!("cannot ever run: partition {pname} has no node up");
        }
        format!("cannot ever run: no node up in partition {pname} has {}", self.kind(j))
    }

    pub(super) fn capacity_text(&self, j: &JobRequest, part: u16, tid: u16) -> Option<String> {
        let pname = &self.part_names[part as usize];
        let b = self.index.get(&(part, tid))?;
        let mut capable = 0usize;
        let mut matching = 0usize;
        let mut best: (u32, u32, u64) = (0, 0, 0);
        for n in b.all() {
            let node = &self.nodes[n as usize];
            if node_matches(node, j).is_err() {
                continue;
            }
            matching += 1;
            let total = self.kinds().units_total(node, j, tid);
            best = best.max((total, node.cpus_total, node.mem_total_mib));
            if total >= Kinds::units_needed(j) && node.cpus_total >= j.cpus_per_node && node.mem_total_mib >= j.mem_per_node_mib {
                capable += 1;
            }
        }
        if matching == 0 {
            return Some(format!("cannot ever run: no node up in partition {pname} matches its constraint and node lists"));
        }
        if capable >= j.nodes as usize {
            return None;
        }
        Some(format!(
            "cannot ever run: needs {} node(s) with {}x {}, {} cpus and {} MiB; partition {pname} has {capable} (largest: {}x, {} cpus, {} MiB)",
            j.nodes,
            Kinds::units_needed(j),
            self.kind(j),
            j.cpus_per_node,
            j.mem_per_node_mib,
            best.0,
            best.1,
            best.2
        ))
    }

    pub(super) fn explain(&mut self, j: &JobRequest, part: u16, tid: u16, fail: Fail) -> Vec<String> {
        if let Fail::Never(s) = fail {
            return vec![s];
        }
        if let Some(s) = self.capacity_text(j, part, tid) {
            return vec![s];
        }
        let kind = self.kind(j);
        match fail {
            Fail::Never(s) => vec![s],
            Fail::Required(name) => vec![format!("required node {name} cannot take it now")],
            Fail::Switches { limit, best, until_ms } => vec![format!(
                "needs {} nodes on at most {limit} leaf switch(es); the best free set spans {best} (waits for that until {})",
                j.nodes,
                fmt_time_ms(until_ms)
            )],
            Fail::Gang { have } => {
                vec![format!("needs {} nodes with {}x {kind} free each; {have} have them now", j.nodes, Kinds::units_needed(j))]
            }
            Fail::NoNode => {
                let largest = self.largest_free(j, part, tid);
                match largest {
                    None => vec![format!("needs {}x {kind} on one node; none is free", Kinds::units_needed(j))],
                    Some((free, n)) if free < Kinds::units_needed(j) => {
                        let held = self.held_text(n, tid);
                        let name = &self.nodes[n].name;
                        vec![format!("needs {}x {kind} on one node; largest free: {free} on {name}{held}", Kinds::units_needed(j))]
                    }
                    Some((_, n)) => {
                        let node = &self.nodes[n];
                        let mut v = vec![format!(
                            "needs {} cpus and {} MiB beside {}x {kind} on one node; {} has {} cpus and {} MiB free",
                            j.cpus_per_node,
                            j.mem_per_node_mib,
                            Kinds::units_needed(j),
                            node.name,
                            node.cpus_free(),
                            node.mem_free_mib()
                        )];
                        if j.exclusive {
                            v.push("needs an idle node (exclusive)".to_string());
                        }
                        v
                    }
                }
            }
        }
    }

    /// The matching node with the most free of the type: (free, node).
    pub(super) fn largest_free(&self, j: &JobRequest, part: u16, tid: u16) -> Option<(u32, usize)> {
        let b = self.index.get(&(part, tid))?;
        if j.shards_per_node > 0 {
            let free = |n: u32| self.kinds().units_free(&self.nodes[n as usize], j, tid);
            let matching = b.all().filter(|&n| node_matches(&self.nodes[n as usize], j).is_ok());
            return matching.max_by_key(|&n| (free(n), std::cmp::Reverse(n))).map(|n| (free(n), n as usize));
        }
        for (free, bucket) in b.by_free.iter().enumerate().rev() {
            if let Some(&n) = bucket.iter().find(|&&n| node_matches(&self.nodes[n as usize], j).is_ok()) {
                return Some((free as u32, n as usize));
            }
        }
        None
    }

    /// ` (2 held by job 41, 1 unhealthy)` for the GPUs of type `tid` on node `n` not free.
    pub(super) fn held_text(&mut self, n: usize, tid: u16) -> String {
        self.ensure_holders();
        let node = &self.nodes[n];
        let mut by_job: BTreeMap<JobId, u32> = BTreeMap::new();
        let (mut unhealthy, mut relaying) = (0, 0);
        let mut sharers: BTreeSet<JobId> = BTreeSet::new();
        let holders = self.holders.as_ref().map(|h| &h[n]);
        for g in &node.gpus {
            if self.type_is_mig[tid as usize] {
                for m in g.mig.iter().filter(|m| m.profile == self.type_names[tid as usize]) {
                    if !m.busy && g.draining() {
                        relaying += 1;
                    } else if m.busy {
                        let slot = mig_slot(g.index, m.start_slice);
                        if let Some(&(_, job)) = holders.and_then(|h| h.iter().find(|(s, _)| *s == slot)) {
                            *by_job.entry(job).or_default() += 1;
                        }
                    }
                }
                continue;
            }
            if g.mig_enabled || !(tid == ANY || g.gres_type == self.type_names[tid as usize]) {
                continue;
            }
            if !g.healthy {
                unhealthy += 1;
            } else if g.busy {
                if let Some(&(_, job)) = holders.and_then(|h| h.iter().find(|(s, _)| *s == g.index)) {
                    *by_job.entry(job).or_default() += 1;
                }
            } else if g.shards_used > 0 {
                let shared = |s: u32| matches!(decode_slot(s), Slot::Shard { gpu, .. } if gpu == g.index);
                sharers.extend(holders.into_iter().flatten().filter(|(s, _)| shared(*s)).map(|&(_, job)| job));
            }
        }
        let mut parts: Vec<String> = by_job.iter().map(|(job, c)| format!("{c} held by job {job}")).collect();
        if !sharers.is_empty() {
            let jobs: Vec<String> = sharers.iter().map(JobId::to_string).collect();
            parts.push(format!("shards held by job {}", jobs.join(", ")));
        }
        if unhealthy > 0 {
            parts.push(format!("{unhealthy} unhealthy"));
        }
        if relaying > 0 {
            parts.push(format!("{relaying} on a GPU waiting for a new MIG layout (an operator's, or one being applied)"));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(" ({})", parts.join(", "))
        }
    }
}
