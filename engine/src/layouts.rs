//! MIG layouts the leader asked for and the agents have not yet reported: until a GPU's
//! committed inventory has the layout (or [`LAYOUT_WAIT_MS`] passed), passes place no work on
//! it and ask nothing new of it, so no job is handed an instance its agent is about to destroy.

use std::collections::BTreeMap;
use std::sync::Arc;

use proto::NodeId;
use scheduler::ClusterView;

/// How long a GPU waits for a layout asked of it before the leader stops waiting (the agent
/// refused it, or its report was lost): then it takes work as its inventory says.
pub const LAYOUT_WAIT_MS: u64 = 10_000;

/// The layouts in flight, by (node, GPU): the profiles asked and when. At most one per GPU.
#[derive(Debug, Default)]
pub struct LayoutsAsked {
    asked: BTreeMap<(NodeId, u32), (Vec<String>, u64)>,
}

impl LayoutsAsked {
    /// Forgets the layouts `view`'s inventories have, and those asked [`LAYOUT_WAIT_MS`] ago;
    /// marks each GPU still waiting as pinned to its layout for this pass (`GpuSlot::draining`:
    /// no new work, no other layout), unless an operator pinned it.
    pub fn hold(&mut self, view: &mut ClusterView, now_ms: u64) {
        self.asked.retain(|(node, gpu), (profiles, at_ms)| {
            let applied = view.nodes.get(node).and_then(|n| n.gpus.iter().find(|g| g.index == *gpu)).is_none_or(|g| g.has_layout(profiles));
            !applied && now_ms < at_ms.saturating_add(LAYOUT_WAIT_MS)
        });
        for ((node, gpu), (profiles, _)) in &self.asked {
            let Some(n) = view.nodes.get_mut(node) else { continue };
            if let Some(g) = Arc::make_mut(n).gpus.iter_mut().find(|g| g.index == *gpu && g.pinned.is_none()) {
                g.pinned = Some(profiles.clone());
            }
        }
    }

    /// Remembers the layouts a pass asked for at `now_ms`; asking a GPU the layout it already
    /// waits for again keeps the first time, so a refused layout is not waited for forever.
    pub fn asked(&mut self, layouts: &[(NodeId, u32, Vec<String>)], now_ms: u64) {
        for (node, gpu, profiles) in layouts {
            match self.asked.get(&(*node, *gpu)) {
                Some((same, _)) if same == profiles => {}
                _ => {
                    self.asked.insert((*node, *gpu), (profiles.clone(), now_ms));
                }
            }
        }
    }

    /// GPUs waiting for a layout.
    pub fn len(&self) -> usize {
        self.asked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.asked.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use scheduler::testkit::{h200_mig, spec, Cluster};

    use super::*;

    fn two_3g() -> Vec<String> {
        vec!["3g.71gb".to_string(), "3g.71gb".to_string()]
    }

    /// A GPU asked for a layout takes no job until its inventory has it; then it does.
    #[test]
    fn a_gpu_waiting_for_its_layout_takes_no_job_until_the_inventory_has_it() {
        let mut c = Cluster::new();
        c.node(1, "m1", h200_mig(&[&[("3g.71gb", 0), ("2g.35gb", 4), ("1g.18gb", 6)]]));
        c.submit(1, spec("gpu:3g.71gb:2", 1), 0).submit(2, spec("gpu:1g.18gb:1", 1), 0);
        let mut asked = LayoutsAsked::default();
        asked.asked(&[(1, 0, two_3g())], 100);
        let mut view = c.view.clone();
        asked.hold(&mut view, 200);
        let plan = scheduler::schedule(&view, 200);
        assert!(plan.placements.is_empty(), "the 1g about to be destroyed is not handed out: {:?}", plan.placements);
        assert!(plan.mig_layouts.iter().all(|(_, _, p)| *p == two_3g()), "nothing else is asked of it: {:?}", plan.mig_layouts);
        assert_eq!(asked.len(), 1);

        // The layout applied: the wait ends and the 3g pair starts.
        let mut c = Cluster::new();
        c.node(1, "m1", h200_mig(&[&[("3g.71gb", 0), ("3g.71gb", 4)]]));
        c.submit(1, spec("gpu:3g.71gb:2", 1), 0);
        let mut view = c.view.clone();
        asked.hold(&mut view, 300);
        assert!(asked.is_empty());
        assert_eq!(scheduler::schedule(&view, 300).placements.len(), 1);
    }

    /// A layout the agent never applies is waited for [`LAYOUT_WAIT_MS`], however often the
    /// same layout is asked again.
    #[test]
    fn a_refused_layout_is_waited_for_a_bounded_time() {
        let mut c = Cluster::new();
        c.node(1, "m1", h200_mig(&[&[("1g.18gb", 0)]]));
        let mut asked = LayoutsAsked::default();
        asked.asked(&[(1, 0, two_3g())], 0);
        asked.asked(&[(1, 0, two_3g())], LAYOUT_WAIT_MS - 1);
        let mut view = c.view.clone();
        asked.hold(&mut view, LAYOUT_WAIT_MS - 1);
        assert_eq!(view.nodes[&1].gpus[0].pinned, Some(two_3g()));
        let mut view = c.view.clone();
        asked.hold(&mut view, LAYOUT_WAIT_MS);
        assert!(asked.is_empty());
        assert_eq!(view.nodes[&1].gpus[0].pinned, None);
    }
}
