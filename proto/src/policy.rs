//! The scheduling policy (partitions, QoS, usage decay), replicated so that every node explains
//! a pending job the same way, and its validation.

use serde::{Deserialize, Serialize};

use crate::{limits, Limits, PartitionAccess, PartitionState};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionDef {
    pub name: String,
    #[serde(default)]
    pub default_time_limit_ms: Option<u64>,
    #[serde(default)]
    pub max_time_limit_ms: Option<u64>,
    #[serde(default)]
    pub priority_tier: u32,
    /// Jobs without `--partition` go here; nodes that name no partition belong here.
    #[serde(default)]
    pub default: bool,
    /// UP, DOWN, DRAIN or INACTIVE (`scontrol update PartitionName=... State=`).
    #[serde(default)]
    pub state: PartitionState,
    /// `Nodes=`: exactly these nodes (by name) are in the partition, whatever their node.toml
    /// says. None: the nodes whose node.toml names it (and, for the default partition, those
    /// that name none).
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
    /// Which accounts, QoS and groups may use it (`AllowAccounts=`, ...).
    #[serde(default)]
    pub access: PartitionAccess,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosDef {
    pub name: String,
    #[serde(default)]
    pub priority: u32,
    /// QoS names whose running jobs this QoS may preempt (a job without QoS is `normal`).
    #[serde(default)]
    pub preempt: Vec<String>,
    /// What happens to jobs of this QoS when they are preempted: `requeue` or `cancel`.
    #[serde(default = "default_preempt_mode")]
    pub preempt_mode: String,
    /// `sacctmgr modify qos ... set MaxJobsPerUser= MaxSubmitJobsPerUser= MaxWall= GrpTRES=
    /// MaxTRESPerJob=`: `max_jobs` and `max_submit_jobs` count one user's jobs of this QoS.
    #[serde(default)]
    pub limits: Limits,
    /// `sacctmgr add|modify qos ... Description=`; `None`: its name, as Slurm's default.
    #[serde(default)]
    pub description: Option<String>,
}

fn default_preempt_mode() -> String {
    "requeue".into()
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerPolicy {
    #[serde(default)]
    pub partitions: Vec<PartitionDef>,
    #[serde(default)]
    pub qos: Vec<QosDef>,
    /// Slurm's `PriorityDecayHalfLife` in minutes: usage counts half after this long. `None`:
    /// Slurm's default, 7 days; `Some(0)`: usage never decays.
    #[serde(default)]
    pub priority_decay_half_life_min: Option<u64>,
    /// Slurm's `EnforcePartLimits=ALL` (true) or `NO`: a submission its partition's limits or
    /// access lists refuse is refused at once, instead of pending with the reason.
    #[serde(default)]
    pub enforce_part_limits: bool,
}

/// Slurm's default `PriorityDecayHalfLife`, 7 days.
pub const DECAY_HALF_LIFE_MIN_DEFAULT: u64 = 7 * 24 * 60;
/// The longest half-life accepted, about 10 years.
pub const DECAY_HALF_LIFE_MIN_MAX: u64 = 10 * 366 * 24 * 60;

impl SchedulerPolicy {
    /// Usage's half-life in milliseconds; 0: no decay.
    pub fn decay_half_life_ms(&self) -> u64 {
        self.priority_decay_half_life_min.unwrap_or(DECAY_HALF_LIFE_MIN_DEFAULT).saturating_mul(60_000)
    }

    pub fn validate(&self) -> Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        for p in &self.partitions {
            if p.name.is_empty() || p.name.len() > 64 || !names.insert(p.name.clone()) {
                return Err(format!("partition names must be unique and 1-64 bytes: '{}'", p.name));
            }
            if let Some(nodes) = &p.nodes {
                if nodes.len() > limits::PARTITION_NODES_MAX || nodes.iter().any(|n| n.is_empty() || n.len() > 64) {
                    return Err(format!("partition {}: at most {} nodes, each name 1-64 bytes", p.name, limits::PARTITION_NODES_MAX));
                }
            }
            p.access.validate().map_err(|e| format!("partition {}: {e}", p.name))?;
            if let (Some(d), Some(m)) = (p.default_time_limit_ms, p.max_time_limit_ms) {
                if d > m {
                    return Err(format!("partition {}: default time limit above its maximum", p.name));
                }
            }
        }
        if self.partitions.iter().filter(|p| p.default).count() > 1 {
            return Err("at most one default partition".into());
        }
        let mut qos_names = std::collections::BTreeSet::new();
        for q in &self.qos {
            if q.name.is_empty() || q.name.len() > 64 || !qos_names.insert(q.name.clone()) {
                return Err(format!("qos names must be unique and 1-64 bytes: '{}'", q.name));
            }
            if q.preempt_mode != "requeue" && q.preempt_mode != "cancel" {
                return Err(format!("qos {}: preempt_mode must be requeue or cancel", q.name));
            }
        }
        if self.priority_decay_half_life_min.is_some_and(|m| m > DECAY_HALF_LIFE_MIN_MAX) {
            return Err(format!("priority_decay_half_life_min: at most {DECAY_HALF_LIFE_MIN_MAX} (about 10 years; 0: no decay)"));
        }
        if self.partitions.len() + self.qos.len() > 1024 {
            return Err("at most 1024 partitions and QoS".into());
        }
        Ok(())
    }
}

/// The partition of jobs and nodes that name none, when the policy marks no partition default.
pub const DEFAULT_PARTITION: &str = "default";
/// The QoS of jobs that name none.
pub const DEFAULT_QOS: &str = "normal";

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(name: &str) -> PartitionDef {
        PartitionDef { name: name.into(), ..PartitionDef::default() }
    }

    fn qos(name: &str) -> QosDef {
        QosDef { name: name.into(), preempt_mode: default_preempt_mode(), ..QosDef::default() }
    }

    fn good() -> SchedulerPolicy {
        let mut gpu = partition("gpu");
        gpu.default = true;
        gpu.default_time_limit_ms = Some(3_600_000);
        gpu.max_time_limit_ms = Some(86_400_000);
        let mut debug = partition("debug");
        debug.nodes = Some(vec!["n1".into(), "n2".into()]);
        let mut high = qos("high");
        high.preempt = vec![DEFAULT_QOS.into()];
        high.preempt_mode = "cancel".into();
        SchedulerPolicy {
            partitions: vec![gpu, debug],
            qos: vec![qos(DEFAULT_QOS), high],
            priority_decay_half_life_min: Some(0),
            enforce_part_limits: false,
        }
    }

    /// Asserts that `policy` is refused with a message holding `expected`.
    fn refused(policy: &SchedulerPolicy, expected: &str) {
        match policy.validate() {
            Ok(()) => panic!("a policy that should be refused ({expected}) passed"),
            Err(e) => assert!(e.contains(expected), "refused with '{e}', expected '{expected}'"),
        }
    }

    #[test]
    fn a_well_formed_policy_and_the_empty_one_pass() {
        assert_eq!(good().validate(), Ok(()));
        assert_eq!(SchedulerPolicy::default().validate(), Ok(()));
    }

    #[test]
    fn partitions_need_unique_short_names_one_default_and_sane_limits() {
        for name in ["", &"p".repeat(65), "gpu"] {
            let mut p = good();
            p.partitions.push(partition(name));
            refused(&p, &format!("partition names must be unique and 1-64 bytes: '{name}'"));
        }
        let mut p = good();
        p.partitions[1].default = true;
        refused(&p, "at most one default partition");
        let mut p = good();
        p.partitions[0].default_time_limit_ms = Some(86_400_001);
        refused(&p, "partition gpu: default time limit above its maximum");
        let mut p = good();
        p.partitions[1].nodes = Some(vec![String::new()]);
        refused(&p, &format!("partition debug: at most {} nodes, each name 1-64 bytes", limits::PARTITION_NODES_MAX));
        p.partitions[1].nodes = Some((0..=limits::PARTITION_NODES_MAX).map(|i| format!("n{i}")).collect());
        refused(&p, &format!("partition debug: at most {} nodes", limits::PARTITION_NODES_MAX));
    }

    #[test]
    fn qos_need_unique_short_names_and_a_known_preempt_mode() {
        for name in ["", &"q".repeat(65), "high"] {
            let mut p = good();
            p.qos.push(qos(name));
            refused(&p, &format!("qos names must be unique and 1-64 bytes: '{name}'"));
        }
        let mut p = good();
        p.qos[1].preempt_mode = "suspend".into();
        refused(&p, "qos high: preempt_mode must be requeue or cancel");
    }

    #[test]
    fn the_half_life_and_the_number_of_definitions_are_bounded() {
        let mut p = good();
        p.priority_decay_half_life_min = Some(DECAY_HALF_LIFE_MIN_MAX);
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.decay_half_life_ms(), DECAY_HALF_LIFE_MIN_MAX * 60_000);
        p.priority_decay_half_life_min = Some(DECAY_HALF_LIFE_MIN_MAX + 1);
        refused(&p, &format!("priority_decay_half_life_min: at most {DECAY_HALF_LIFE_MIN_MAX}"));
        p.priority_decay_half_life_min = None;
        assert_eq!(p.decay_half_life_ms(), DECAY_HALF_LIFE_MIN_DEFAULT * 60_000, "Slurm's default, 7 days");

        let mut p = SchedulerPolicy {
            partitions: (0..600).map(|i| partition(&format!("p{i}"))).collect(),
            qos: (0..424).map(|i| qos(&format!("q{i}"))).collect(),
            priority_decay_half_life_min: None,
            enforce_part_limits: false,
        };
        assert_eq!(p.validate(), Ok(()), "1024 definitions in all pass");
        p.qos.push(qos("one-more"));
        refused(&p, "at most 1024 partitions and QoS");
    }
}
