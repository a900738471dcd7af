//! Node events: each change of a node's state a committed command makes (joined, up, down,
//! stopped, drained, resumed, a GPU's health), kept in the replicated state, the last
//! [`proto::NODE_EVENTS_MAX`] only, so every member answers `ClientRequest::NodeEvents` alike.

use proto::{Command, InstanceId, NodeEvent, NodeId, NodeState};

use super::ClusterState;

/// A node as it was before a command: whether it existed, its state and its instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct NodeBefore(Option<(NodeState, InstanceId)>);

impl ClusterState {
    /// The node `cmd` is about, as it is now (before `cmd` applies).
    pub(super) fn node_before(&self, cmd: &Command) -> NodeBefore {
        let id = match cmd {
            Command::RegisterNode { name, .. } => self.node_by_name(name).map(|n| n.id),
            other => node_of(other),
        };
        NodeBefore(id.and_then(|id| self.nodes.get(&id)).map(|n| (n.state, n.instance)))
    }

    /// Remembers the change `cmd` (applied without a rejection) made to its node, if any.
    pub(super) fn note_node_event(&mut self, cmd: &Command, before: NodeBefore) {
        let NodeBefore(before) = before;
        let (id, what, reason, at_ms) = match cmd {
            Command::RegisterNode { name, instance, now_ms, .. } => {
                let Some(id) = self.node_by_name(name).map(|n| n.id) else { return };
                match before {
                    None => (id, "joined", String::new(), *now_ms),
                    Some((_, was)) if was != *instance => (id, "up", "registered again: a new instance".into(), *now_ms),
                    Some(_) => return,
                }
            }
            Command::NodeUp { node, instance, now_ms } => match before {
                Some((NodeState::Up, was)) if was == *instance => return,
                Some((_, was)) if was != *instance => (*node, "up", "a new instance".into(), *now_ms),
                _ => (*node, "up", String::new(), *now_ms),
            },
            Command::NodeDown { node, reason, now_ms } => match before {
                Some((NodeState::Down, _)) => return,
                _ => (*node, "down", reason.clone(), *now_ms),
            },
            Command::NodeStopped { node, now_ms, .. } => (*node, "stopped", String::new(), *now_ms),
            Command::Drain { node, reason, now_ms } => (*node, "drained", reason.clone(), *now_ms),
            Command::Resume { node, now_ms } => (*node, "resumed", String::new(), *now_ms),
            Command::GpuHealth { node, gpu, mig_uuid, healthy, reason, now_ms } => {
                let device = match mig_uuid {
                    Some(m) => format!("gpu {gpu} (mig {m})"),
                    None => format!("gpu {gpu}"),
                };
                let (what, why) = if *healthy { ("gpu healthy", device) } else { ("gpu unhealthy", format!("{device}: {reason}")) };
                (*node, what, why, *now_ms)
            }
            _ => return,
        };
        let Some(node) = self.nodes.get(&id).map(|n| n.name.clone()) else { return };
        if self.node_events.len() >= proto::NODE_EVENTS_MAX {
            self.node_events.pop_front();
        }
        self.node_events.push_back(NodeEvent { at_ms, node, what: what.to_string(), reason });
    }
}

/// The node a command other than `RegisterNode` changes.
fn node_of(cmd: &Command) -> Option<NodeId> {
    match cmd {
        Command::NodeUp { node, .. }
        | Command::NodeDown { node, .. }
        | Command::NodeStopped { node, .. }
        | Command::Drain { node, .. }
        | Command::Resume { node, .. }
        | Command::GpuHealth { node, .. } => Some(*node),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proto::Command;

    use crate::cluster::test_support::register;
    use crate::cluster::ClusterState;

    fn events(s: &ClusterState) -> Vec<(String, String, String)> {
        s.node_events.iter().map(|e| (e.node.clone(), e.what.clone(), e.reason.clone())).collect()
    }

    #[test]
    fn each_change_of_a_node_is_remembered_once_and_repeats_are_not() {
        let mut s = ClusterState::default();
        let id = register(&mut s, "a", 1);
        let instance = 1;
        for cmd in [
            Command::NodeDown { node: id, reason: "no heartbeat".into(), now_ms: 10 },
            Command::NodeDown { node: id, reason: "no heartbeat".into(), now_ms: 11 },
            Command::NodeUp { node: id, instance, now_ms: 12 },
            Command::NodeUp { node: id, instance, now_ms: 13 },
            Command::Drain { node: id, reason: "maintenance".into(), now_ms: 14 },
            Command::Resume { node: id, now_ms: 15 },
            Command::GpuHealth { node: id, gpu: 0, mig_uuid: None, healthy: false, reason: "Xid 79".into(), now_ms: 16 },
            Command::NodeUp { node: 99, instance, now_ms: 17 },
        ] {
            s.apply(&cmd);
        }
        let e = |w: &str, r: &str| ("a".to_string(), w.to_string(), r.to_string());
        assert_eq!(
            events(&s),
            vec![
                e("joined", ""),
                e("down", "no heartbeat"),
                e("up", ""),
                e("drained", "maintenance"),
                e("resumed", ""),
                e("gpu unhealthy", "gpu 0: Xid 79")
            ]
        );
        assert_eq!(s.node_events.iter().map(|e| e.at_ms).skip(1).collect::<Vec<_>>(), vec![10, 12, 14, 15, 16]);
    }

    #[test]
    fn only_the_last_events_are_kept() {
        let mut s = ClusterState::default();
        let id = register(&mut s, "a", 1);
        for i in 0..proto::NODE_EVENTS_MAX as u64 {
            s.apply(&Command::Drain { node: id, reason: format!("r{i}"), now_ms: i });
        }
        assert_eq!(s.node_events.len(), proto::NODE_EVENTS_MAX);
        assert_eq!(s.node_events.front().map(|e| e.reason.as_str()), Some("r0"));
        s.apply(&Command::Resume { node: id, now_ms: 1_000 });
        assert_eq!(s.node_events.len(), proto::NODE_EVENTS_MAX);
        assert_eq!(s.node_events.front().map(|e| e.reason.as_str()), Some("r1"), "the oldest went first");
        assert_eq!(s.node_events.back().map(|e| e.what.as_str()), Some("resumed"));
    }
}
