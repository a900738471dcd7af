//! The leader's memory of its nodes for the term it leads: when each was last heard, which
//! silent ones it declares down (`control::leader::rejoin_held`, then `nodes_down`), and which
//! agent it promotes to voter (`control::leader::voter_change`).
//!
//! Kept apart from [`crate::Leader`]: heartbeats arrive while a scheduling pass has the
//! leader's sequence out, and must be recorded meanwhile. Time is milliseconds on the caller's
//! monotonic clock (a wall-clock step must not make every node look silent).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use control::leader::{Rejoin, VoterChange, NEVER_VOTER_FEATURE};
use corral_state::ClusterState;
use proto::{Command, InstanceId, NodeId, NodeState};

/// What the leader knows of its nodes' heartbeats in this term. Bounded by the nodes.
#[derive(Clone, Debug)]
pub struct Liveness {
    down_after_ms: u64,
    /// When this term began.
    since_ms: u64,
    last_seen_ms: HashMap<NodeId, u64>,
    /// When a node last returned to this leader (`control::leader::rejoin_held`).
    returned_ms: Option<u64>,
    /// When this leader declared nodes down within the last grace period (one entry per node
    /// declared: a node is declared down once until it is back).
    declared_down_ms: VecDeque<u64>,
    /// How many nodes the last check held back for a mass silence, and for the nodes' return.
    held: usize,
    rejoining: usize,
}

/// What a heartbeat is to the leader, given what the state records of its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beat {
    /// The node's recorded instance, up: counted alive.
    Alive,
    /// Counted alive, and the node is to be brought back (`Command::NodeUp`): it was declared
    /// down, or this is a newer instance and the recorded one has been silent for the grace
    /// period.
    Back,
    /// Another instance, while the recorded one was heard `recorded_heard_ms_ago`, within the
    /// grace period, or an older one (instance ids are ordered by start time) while the node is
    /// not down: a dead instance's beat that came late (a slow network, a relay), or a new
    /// instance whose registration has not come through. Not counted. Adopting it would retire
    /// the recorded instance and free what it runs while that one, maybe alive, has not fenced.
    Refused { recorded_heard_ms_ago: u64 },
}

/// A change in what the leader holds back from `NodeDown`, to say once when it starts and ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// Nodes still return to a new leader: the silent ones are held back meanwhile.
    RejoinStarted {
        nodes: usize,
    },
    RejoinEnded {
        nodes: usize,
    },
    /// Too many nodes unheard at once to believe: they are declared down only after
    /// `control::leader::MASS_DOWN_GRACES` grace periods.
    MassSilenceStarted {
        nodes: usize,
    },
    MassSilenceEnded {
        nodes: usize,
    },
}

/// What one liveness check asks for: the `NodeDown` commands to propose (together: the group
/// commit packs them), with how long each node has been silent, and what changed in what it
/// holds back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Downs {
    pub commands: Vec<Command>,
    pub silent_ms: Vec<(NodeId, u64)>,
    pub held: Vec<Held>,
}

impl Liveness {
    /// A new term at `now_ms`: every node in `nodes` gets a fresh grace period.
    pub fn new(now_ms: u64, down_after_ms: u64, nodes: impl IntoIterator<Item = NodeId>) -> Liveness {
        Liveness {
            down_after_ms,
            since_ms: now_ms,
            last_seen_ms: nodes.into_iter().map(|id| (id, now_ms)).collect(),
            returned_ms: None,
            declared_down_ms: VecDeque::new(),
            held: 0,
            rejoining: 0,
        }
    }

    /// Node `id` was heard at `at_ms` (a heartbeat or a registration). A node not heard yet in
    /// this term counts from the term's start; a long silence ending is a return.
    pub fn heard(&mut self, id: NodeId, at_ms: u64) {
        let since = self.last_seen_ms.insert(id, at_ms).unwrap_or(self.since_ms);
        if control::leader::is_return(at_ms.saturating_sub(since), self.down_after_ms) {
            self.returned_ms = Some(at_ms);
        }
    }

    /// A heartbeat of `instance` of node `id` heard at `at_ms`, the state recording the node as
    /// `recorded` (its state and instance). Another instance replaces the recorded one only
    /// once the leader could declare that one down: by then it fenced itself (the fencing
    /// argument in ARCHITECTURE.md), whatever the order in which their messages arrive.
    pub fn beat(&mut self, id: NodeId, instance: InstanceId, recorded: (NodeState, InstanceId), at_ms: u64) -> Beat {
        let (state, recorded_instance) = recorded;
        let other = instance != recorded_instance;
        if other && state != NodeState::Down {
            let last_ms = self.last_seen_ms.get(&id).copied().unwrap_or(self.since_ms);
            let ago_ms = at_ms.saturating_sub(last_ms);
            // An older instance waits until the recorded one is declared down (the log refuses
            // it before: `ClusterState::newer_instance_up`); counting its beats would keep the
            // node from ever being declared down.
            if ago_ms < self.down_after_ms || instance < recorded_instance {
                return Beat::Refused { recorded_heard_ms_ago: ago_ms };
            }
        }
        self.heard(id, at_ms);
        if other || state == NodeState::Down {
            Beat::Back
        } else {
            Beat::Alive
        }
    }

    /// How long ago each node was last heard.
    pub fn ages_ms(&self, now_ms: u64) -> BTreeMap<NodeId, u64> {
        self.last_seen_ms.iter().map(|(id, at)| (*id, now_ms.saturating_sub(*at))).collect()
    }

    /// How long this leader has led.
    pub fn leading_for_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.since_ms)
    }

    /// The silent nodes of `state` to declare down at `now_ms`, holding them back while nodes
    /// still return to a new leader and during a mass silence. `now_ms` is also the time the
    /// `NodeDown` commands carry (`command_now_ms`, the state's clock).
    pub fn check(&mut self, state: &ClusterState, now_ms: u64, command_now_ms: u64) -> Downs {
        let silent: Vec<(NodeId, u64)> = state
            .nodes
            .values()
            .filter(|n| n.state != NodeState::Down)
            .map(|n| (n.id, now_ms.saturating_sub(*self.last_seen_ms.entry(n.id).or_insert(now_ms))))
            .collect();
        let leading_for_ms = self.leading_for_ms(now_ms);
        let quiet_ms = self.returned_ms.map_or(leading_for_ms, |at| now_ms.saturating_sub(at));
        let (judged, rejoining) = control::leader::rejoin_held(silent, Rejoin { leading_for_ms, quiet_ms }, self.down_after_ms);
        while self.declared_down_ms.front().is_some_and(|at| now_ms.saturating_sub(*at) > self.down_after_ms) {
            self.declared_down_ms.pop_front();
        }
        let verdict = control::leader::nodes_down(&judged, self.down_after_ms, self.declared_down_ms.len());
        let mut held = Vec::new();
        let (rejoining_before, held_before) = (self.rejoining, self.held);
        (self.rejoining, self.held) = (rejoining.len(), verdict.held.len());
        if self.rejoining > 0 && rejoining_before == 0 {
            held.push(Held::RejoinStarted { nodes: self.rejoining });
        } else if self.rejoining == 0 && rejoining_before > 0 {
            held.push(Held::RejoinEnded { nodes: rejoining_before });
        }
        if self.held > 0 && held_before == 0 {
            held.push(Held::MassSilenceStarted { nodes: self.held });
        } else if self.held == 0 && held_before > 0 {
            held.push(Held::MassSilenceEnded { nodes: held_before });
        }
        let silent_ms: Vec<(NodeId, u64)> = judged.into_iter().filter(|(id, _)| verdict.down.contains(id)).collect();
        let commands = silent_ms
            .iter()
            .map(|(node, ms)| Command::NodeDown { node: *node, reason: format!("no heartbeat for {ms} ms"), now_ms: command_now_ms })
            .collect();
        Downs { commands, silent_ms, held }
    }

    /// A `NodeDown` this leader proposed at `now_ms` was applied (a refused one is not counted).
    pub fn declared_down(&mut self, now_ms: u64) {
        self.declared_down_ms.push_back(now_ms);
    }

    /// The voter change to make at `now_ms`, if any, as `control::leader::voter_change` decides
    /// it: the candidate is an agent that is up, may vote and was heard within
    /// `fresh_within_ms`; a voter DOWN past `replace_after_ms` (by the state's clock,
    /// `state_now_ms`) may be replaced. Returns the change and the node to promote.
    pub fn voter_change(
        &self,
        state: &ClusterState,
        me: NodeId,
        voters: &BTreeSet<NodeId>,
        limits: VoterLimits,
        now: Now,
    ) -> Option<VoterChange> {
        let candidate = state
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Up && !voters.contains(&n.id))
            .filter(|n| !n.inventory.features.iter().any(|f| f == NEVER_VOTER_FEATURE))
            .find(|n| self.last_seen_ms.get(&n.id).is_some_and(|at| now.mono_ms.saturating_sub(*at) < limits.fresh_within_ms))
            .map(|n| n.id);
        let down_ms: Vec<(NodeId, u64)> = voters
            .iter()
            .filter_map(|v| state.nodes.get(v))
            .filter(|n| n.state == NodeState::Down)
            .map(|n| (n.id, now.state_ms.saturating_sub(n.state_changed_ms)))
            .collect();
        control::leader::voter_change(
            me,
            voters,
            limits.voters_max,
            candidate,
            &down_ms,
            self.leading_for_ms(now.mono_ms),
            limits.replace_after_ms,
        )
    }
}

/// The bounds of [`Liveness::voter_change`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VoterLimits {
    pub voters_max: usize,
    /// How recently a candidate must have been heard.
    pub fresh_within_ms: u64,
    /// How long a voter stays DOWN before it is replaced.
    pub replace_after_ms: u64,
}

/// The time on the two clocks the leader reads: its monotonic clock (`mono_ms`, the clock of
/// [`Liveness`]) and the state's (`state_ms`, the wall-clock milliseconds commands carry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    pub mono_ms: u64,
    pub state_ms: u64,
}

impl Now {
    /// One clock for both (the simulator and the replay).
    pub fn at(ms: u64) -> Now {
        Now { mono_ms: ms, state_ms: ms }
    }
}

#[cfg(test)]
mod tests {
    use proto::{CommandResult, Inventory};

    use super::*;

    #[test]
    fn another_instances_beat_replaces_the_recorded_one_only_once_that_one_could_be_declared_down() {
        let mut live = Liveness::new(0, 3_000, [1]);
        let (up, down) = ((NodeState::Up, 7), (NodeState::Down, 7));
        assert_eq!(live.beat(1, 7, up, 1_000), Beat::Alive);
        // A dead instance's beat, late, while the recorded one is heard: refused, not counted.
        assert_eq!(live.beat(1, 6, up, 2_000), Beat::Refused { recorded_heard_ms_ago: 1_000 });
        assert_eq!(live.ages_ms(2_000)[&1], 1_000, "a refused beat is not heard");
        assert_eq!(live.beat(1, 6, up, 3_999), Beat::Refused { recorded_heard_ms_ago: 2_999 });
        // The recorded instance silent for the grace period: the other one is taken.
        assert_eq!(live.beat(1, 8, up, 4_000), Beat::Back);
        assert_eq!(live.ages_ms(4_000)[&1], 0);
        // An older instance waits until the recorded one is declared down, however long it is
        // silent: its beats never count, so the silence ends in a `NodeDown`.
        assert_eq!(live.beat(1, 6, up, 9_000), Beat::Refused { recorded_heard_ms_ago: 5_000 });
        assert_eq!(live.ages_ms(9_000)[&1], 5_000);
        // A node declared down comes back at once, as the same instance or another.
        assert_eq!(live.beat(1, 7, down, 4_100), Beat::Back);
        assert_eq!(live.beat(1, 9, down, 4_200), Beat::Back);
    }

    fn cluster(nodes: u32) -> ClusterState {
        let mut state = ClusterState::default();
        for i in 1..=nodes {
            let name = format!("n{i}");
            let cmd = Command::RegisterNode {
                name: name.clone(),
                addr: format!("{name}:7100"),
                inventory: Inventory { cpus: 8, memory_mib: 1024, ..Inventory::default() },
                instance: 1,
                cert_fingerprint: String::new(),
                now_ms: 0,
            };
            assert!(matches!(state.apply(&cmd), CommandResult::NodeRegistered { .. }));
        }
        state
    }

    fn downed(downs: &Downs) -> Vec<NodeId> {
        downs
            .commands
            .iter()
            .map(|c| match c {
                Command::NodeDown { node, .. } => *node,
                other => panic!("a liveness check asked for {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_node_silent_past_the_grace_period_is_declared_down_once() {
        let mut state = cluster(3);
        let mut live = Liveness::new(0, 3_000, state.nodes.keys().copied());
        for at in (0..=4_000).step_by(500) {
            live.heard(1, at);
            live.heard(2, at);
        }
        assert_eq!(downed(&live.check(&state, 3_000, 3_000)), Vec::<NodeId>::new(), "at the grace period, not past it");
        let downs = live.check(&state, 4_000, 77);
        assert_eq!(downed(&downs), vec![3]);
        assert_eq!(downs.silent_ms, vec![(3, 4_000)]);
        assert!(matches!(&downs.commands[0], Command::NodeDown { now_ms: 77, reason, .. } if reason == "no heartbeat for 4000 ms"));
        for cmd in &downs.commands {
            state.apply(cmd);
        }
        live.declared_down(4_000);
        assert_eq!(downed(&live.check(&state, 5_000, 5_000)), Vec::<NodeId>::new(), "a DOWN node is not judged again");
    }

    #[test]
    fn a_new_leader_holds_silent_nodes_back_while_others_still_return() {
        let state = cluster(3);
        // Nodes 1 and 2 were heard late in the term; node 3 never.
        let mut live = Liveness::new(0, 3_000, state.nodes.keys().copied());
        live.heard(1, 3_000);
        live.heard(2, 3_800);
        let downs = live.check(&state, 4_000, 4_000);
        assert_eq!(downed(&downs), Vec::<NodeId>::new(), "node 2 returned within half a grace period");
        assert_eq!(downs.held, vec![Held::RejoinStarted { nodes: 1 }]);
        let downs = live.check(&state, 5_400, 5_400);
        assert_eq!(downed(&downs), vec![3]);
        assert_eq!(downs.held, vec![Held::RejoinEnded { nodes: 1 }]);
    }

    #[test]
    fn a_mass_silence_waits_two_grace_periods() {
        let state = cluster(10);
        let mut live = Liveness::new(0, 1_000, state.nodes.keys().copied());
        // Only node 1 is heard: nine of ten go silent at once.
        for at in (0..=2_500).step_by(250) {
            live.heard(1, at);
        }
        let downs = live.check(&state, 1_500, 1_500);
        assert_eq!(downed(&downs), Vec::<NodeId>::new());
        assert_eq!(downs.held, vec![Held::MassSilenceStarted { nodes: 9 }]);
        let downs = live.check(&state, 2_500, 2_500);
        assert_eq!(downed(&downs), (2..=10).collect::<Vec<_>>());
        assert_eq!(downs.held, vec![Held::MassSilenceEnded { nodes: 9 }]);
    }

    #[test]
    fn a_fresh_agent_is_promoted_and_a_long_down_voter_replaced() {
        let mut state = cluster(4);
        let mut live = Liveness::new(0, 3_000, state.nodes.keys().copied());
        let limits = VoterLimits { voters_max: 3, fresh_within_ms: 1_500, replace_after_ms: 10_000 };
        let voters: BTreeSet<NodeId> = [1, 2].into();
        live.heard(4, 1_000);
        assert_eq!(live.voter_change(&state, 1, &voters, limits, Now::at(3_000)), None, "node 3 and 4 are not fresh");
        let change = live.voter_change(&state, 1, &voters, limits, Now::at(2_000)).expect("a voter is missing");
        assert_eq!((change.promote, change.voters), (4, [1, 2, 4].into()));
        // Three voters, node 2 DOWN since 5,000 on the state's clock.
        let voters: BTreeSet<NodeId> = [1, 2, 3].into();
        state.apply(&Command::NodeDown { node: 2, reason: "test".into(), now_ms: 5_000 });
        live.heard(4, 20_000);
        let at = |state_ms| Now { mono_ms: 20_500, state_ms };
        assert_eq!(live.voter_change(&state, 1, &voters, limits, at(15_000)), None, "down 10 s, not past it");
        let change = live.voter_change(&state, 1, &voters, limits, at(15_001)).expect("replaced");
        assert_eq!((change.promote, change.voters), (4, [1, 3, 4].into()));
    }
}
