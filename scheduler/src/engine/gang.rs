//! The nodes of a gang (a job of two or more nodes, or of a node range `-N MIN-MAX`): which of
//! the nodes that may hold it now it gets, topology first ([`topo::choose_gang`]), and how many.
//! A job of a range starts as soon as its least can hold it, as Slurm's does, and then gets as
//! many nodes of its range as hold it now, as many as its accounting limits allow (Slurm's
//! `acct_policy_get_max_nodes`); within a `--switches` limit that its least meets.

use super::{Fail, Pass, Pick};
use crate::frag;
use crate::topo;
use crate::view::JobRequest;
use crate::windows::Fence;

impl Pass<'_> {
    /// A gang's picks for `j` in partition `part` of GPU type `tid`, each node with `need` free
    /// units at least.
    pub(super) fn find_gang(&mut self, j: &JobRequest, part: u16, tid: u16, fence: Fence, need: u32) -> Result<Vec<Pick>, Fail> {
        let Some(b) = self.index.get(&(part, tid)) else { return Err(Fail::NoNode) };
        let possible = b.count_at_least(need);
        if possible < j.nodes as usize {
            return Err(Fail::Gang { have: possible });
        }
        let cands: Vec<usize> = b
            .by_free
            .iter()
            .skip(need as usize)
            .flat_map(|s| s.iter().map(|&n| n as usize))
            .filter(|&n| self.node_ok(n, j, tid, fence) && (j.shards_per_node == 0 || frag::tightest_shared(&self.nodes[n], j).is_some()))
            .collect();
        let mut required = Vec::new();
        if j.nodelist.len() < j.nodes as usize {
            for name in &j.nodelist {
                match self.name_ix.get(name.as_str()) {
                    Some(&n) if cands.contains(&n) => required.push(n),
                    _ => return Err(Fail::Required(name.clone())),
                }
            }
        }
        if cands.len() < j.nodes as usize {
            return Err(Fail::Gang { have: cands.len() });
        }
        let least = j.nodes as usize;
        let most = cands.len().min(self.nodes_allowed(j) as usize).max(least);
        let mut chosen = topo::choose_gang(&self.nodes, &cands, most, &required);
        if most > least && self.over_switches(j, &chosen).is_some() {
            // More nodes span more switches: the least of the range, within the limit if it can.
            chosen = topo::choose_gang(&self.nodes, &cands, least, &required);
        }
        if let Some(fail) = self.over_switches(j, &chosen) {
            return Err(fail);
        }
        let mut picks = Vec::with_capacity(chosen.len());
        for n in chosen {
            match self.pick(n, j, tid) {
                Some(p) => picks.push(p),
                // A node of a range's more is left out; its least must all be picked.
                None if most > least => {}
                None => return Err(Fail::Gang { have: cands.len() }),
            }
        }
        if picks.len() < least {
            return Err(Fail::Gang { have: cands.len() });
        }
        Ok(picks)
    }

    /// The most nodes `j` may get: its range's most, lowered to what the accounting limits let
    /// it hold beside what their running jobs hold (its least without a range).
    fn nodes_allowed(&self, j: &JobRequest) -> u32 {
        if j.nodes_max <= j.nodes {
            return j.nodes;
        }
        match &self.limits {
            Some(l) => l.nodes_allowed(self.view, j, self.effective_limit_ms(j)),
            None => j.nodes_max,
        }
    }

    /// The failure of `chosen` for `j`'s strict `--switches` limit, if they span more switches.
    fn over_switches(&self, j: &JobRequest, chosen: &[usize]) -> Option<Fail> {
        let limit = self.switch_strict(j)?;
        let mut sw: Vec<Option<&str>> = chosen.iter().map(|&n| self.nodes[n].location.switch.as_deref()).collect();
        sw.sort_unstable();
        sw.dedup();
        let best = sw.len() as u32;
        let until_ms = j.submit_ms.saturating_add(j.switches.map_or(0, |s| s.1));
        (best > limit).then_some(Fail::Switches { limit, best, until_ms })
    }
}
