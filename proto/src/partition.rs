//! Partitions as `scontrol create|update|delete PartitionName=...` changes them: a partition's
//! state (Slurm's UP, DOWN, DRAIN, INACTIVE) and one edit of the replicated policy, applied by
//! the state machine as one log entry ([`SchedulerPolicy::edit_partition`]), so two admins'
//! edits never overwrite each other the way a read, change and `SetPolicy` would.

use serde::{Deserialize, Serialize};

use crate::{PartitionDef, SchedulerPolicy};

/// A partition's state, as in Slurm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionState {
    /// Takes submissions and starts jobs.
    #[default]
    Up,
    /// Takes submissions; starts nothing (pending reason `PartitionDown`).
    Down,
    /// Refuses submissions; starts the jobs already pending.
    Drain,
    /// Refuses submissions and starts nothing (`PartitionInactive`).
    Inactive,
}

impl PartitionState {
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionState::Up => "UP",
            PartitionState::Down => "DOWN",
            PartitionState::Drain => "DRAIN",
            PartitionState::Inactive => "INACTIVE",
        }
    }

    /// Parses Slurm's `State=` value (any case).
    pub fn parse(text: &str) -> Option<PartitionState> {
        match text.to_ascii_uppercase().as_str() {
            "UP" => Some(PartitionState::Up),
            "DOWN" => Some(PartitionState::Down),
            "DRAIN" => Some(PartitionState::Drain),
            "INACTIVE" => Some(PartitionState::Inactive),
            _ => None,
        }
    }

    pub fn takes_submissions(self) -> bool {
        matches!(self, PartitionState::Up | PartitionState::Down)
    }

    /// Why a pending job of this partition does not start (Slurm's reason first), if it doesn't.
    pub fn holds_jobs(self) -> Option<&'static str> {
        match self {
            PartitionState::Down => Some("PartitionDown"),
            PartitionState::Inactive => Some("PartitionInactive"),
            PartitionState::Up | PartitionState::Drain => None,
        }
    }
}

/// The most names one access list holds.
pub const ACCESS_LIST_MAX: usize = 256;

/// Who may use a partition, as Slurm's `AllowAccounts=`, `DenyAccounts=`, `AllowQos=`,
/// `DenyQos=` and `AllowGroups=`. An empty allow list is Slurm's ALL; a deny list counts only
/// while the allow list beside it is empty, as in Slurm.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionAccess {
    #[serde(default)]
    pub allow_accounts: Vec<String>,
    #[serde(default)]
    pub deny_accounts: Vec<String>,
    #[serde(default)]
    pub allow_qos: Vec<String>,
    #[serde(default)]
    pub deny_qos: Vec<String>,
    /// Unix groups whose members may submit to it (admins always may). Checked at submit, on
    /// the node that takes the submission, against the user's groups there.
    #[serde(default)]
    pub allow_groups: Vec<String>,
}

impl PartitionAccess {
    pub fn validate(&self) -> Result<(), String> {
        let lists = [&self.allow_accounts, &self.deny_accounts, &self.allow_qos, &self.deny_qos, &self.allow_groups];
        if lists.iter().any(|l| l.len() > ACCESS_LIST_MAX || l.iter().any(|n| n.is_empty() || n.len() > 64 || n.contains(','))) {
            return Err(format!("an access list holds at most {ACCESS_LIST_MAX} names, each 1-64 bytes without commas"));
        }
        Ok(())
    }

    /// Why partition `name` does not take a job of `account` (none: the job has no account), in
    /// Slurm's reason code and words; `None`: it does.
    pub fn account_refusal(&self, name: &str, account: Option<&str>) -> Option<String> {
        if !self.allow_accounts.is_empty() {
            let allows = self.allow_accounts.join(",");
            return match account {
                None => {
                    Some(format!("AccountNotAllowed: Job's account not known, so it can't use this partition ({name} allows {allows})"))
                }
                Some(a) if !self.allow_accounts.iter().any(|x| x == a) => {
                    Some(format!("AccountNotAllowed: Job's account not permitted to use this partition ({name} allows {allows} not {a})"))
                }
                Some(_) => None,
            };
        }
        let a = account?;
        self.deny_accounts.iter().any(|x| x == a).then(|| {
            let denies = self.deny_accounts.join(",");
            format!("AccountNotAllowed: Job's account not permitted to use this partition ({name} denies {denies} including {a})")
        })
    }

    /// Why partition `name` does not take a job of QoS `qos`, as [`Self::account_refusal`].
    pub fn qos_refusal(&self, name: &str, qos: &str) -> Option<String> {
        if !self.allow_qos.is_empty() {
            let allows = self.allow_qos.join(",");
            return (!self.allow_qos.iter().any(|x| x == qos))
                .then(|| format!("QOSNotAllowed: Job's QOS not permitted to use this partition ({name} allows {allows} not {qos})"));
        }
        self.deny_qos.iter().any(|x| x == qos).then(|| {
            let denies = self.deny_qos.join(",");
            format!("QOSNotAllowed: Job's QOS not permitted to use this partition ({name} denies {denies} including {qos})")
        })
    }

    /// Whether a member of `groups` may submit to it.
    pub fn allows_groups(&self, groups: &[String]) -> bool {
        self.allow_groups.is_empty() || self.allow_groups.iter().any(|g| groups.contains(g))
    }

    /// `scontrol show partition`'s second line: `AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL`,
    /// a deny list shown in place of an empty allow list, as Slurm does.
    pub fn show(&self) -> String {
        let list = |l: &[String]| if l.is_empty() { "ALL".to_string() } else { l.join(",") };
        let pair = |what: &str, allow: &[String], deny: &[String]| {
            if allow.is_empty() && !deny.is_empty() {
                format!("Deny{what}={}", deny.join(","))
            } else {
                format!("Allow{what}={}", list(allow))
            }
        };
        format!(
            "AllowGroups={} {} {}",
            list(&self.allow_groups),
            pair("Accounts", &self.allow_accounts, &self.deny_accounts),
            pair("Qos", &self.allow_qos, &self.deny_qos)
        )
    }
}

/// What `scontrol update PartitionName=...` changes; `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionChanges {
    pub state: Option<PartitionState>,
    /// `MaxTime=`: `Some(None)` is UNLIMITED.
    pub max_time_limit_ms: Option<Option<u64>>,
    /// `DefaultTime=`: `Some(None)` is NONE.
    pub default_time_limit_ms: Option<Option<u64>>,
    pub priority_tier: Option<u32>,
    /// `Default=YES|NO`; YES takes the flag from the partition that had it, as in Slurm.
    pub default: Option<bool>,
    /// `Nodes=LIST`: exactly these nodes, each one the cluster has.
    pub nodes: Option<Vec<String>>,
    /// `AllowAccounts=` and the other access lists: `Some(empty)` is ALL (or, denying, none).
    pub allow_accounts: Option<Vec<String>>,
    pub deny_accounts: Option<Vec<String>>,
    pub allow_qos: Option<Vec<String>>,
    pub deny_qos: Option<Vec<String>>,
    pub allow_groups: Option<Vec<String>>,
}

/// One change to the partitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartitionEdit {
    Create { name: String, changes: PartitionChanges },
    Update { name: String, changes: PartitionChanges },
    Delete { name: String },
}

impl PartitionEdit {
    pub fn name(&self) -> &str {
        match self {
            PartitionEdit::Create { name, .. } | PartitionEdit::Update { name, .. } | PartitionEdit::Delete { name } => name,
        }
    }
}

impl PartitionChanges {
    fn apply_to(&self, def: &mut PartitionDef) {
        if let Some(s) = self.state {
            def.state = s;
        }
        if let Some(t) = self.max_time_limit_ms {
            def.max_time_limit_ms = t;
        }
        if let Some(t) = self.default_time_limit_ms {
            def.default_time_limit_ms = t;
        }
        if let Some(p) = self.priority_tier {
            def.priority_tier = p;
        }
        if let Some(d) = self.default {
            def.default = d;
        }
        if let Some(n) = &self.nodes {
            def.nodes = Some(n.clone());
        }
        let access = &mut def.access;
        for (change, list) in [
            (&self.allow_accounts, &mut access.allow_accounts),
            (&self.deny_accounts, &mut access.deny_accounts),
            (&self.allow_qos, &mut access.allow_qos),
            (&self.deny_qos, &mut access.deny_qos),
            (&self.allow_groups, &mut access.allow_groups),
        ] {
            if let Some(names) = change {
                list.clone_from(names);
            }
        }
    }
}

impl SchedulerPolicy {
    /// Applies `edit`, or says why not in Slurm's words and leaves the policy as it was.
    /// `named_by_nodes`: whether some node's `partitions` (node.toml) names a partition, which
    /// makes it exist without a definition (an update then defines it); `in_use`: whether a
    /// pending or running job is in it (Slurm refuses to delete it then); `is_node`: whether
    /// the cluster has a node of that name (`Nodes=` may name no other).
    pub fn edit_partition(
        &mut self,
        edit: &PartitionEdit,
        named_by_nodes: impl Fn(&str) -> bool,
        in_use: impl Fn(&str) -> bool,
        is_node: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let mut next = self.clone();
        let name = edit.name();
        if let PartitionEdit::Create { changes, .. } | PartitionEdit::Update { changes, .. } = edit {
            if changes.nodes.iter().flatten().any(|n| !is_node(n)) {
                return Err("Invalid node name specified".into());
            }
        }
        let defined = next.partitions.iter().position(|p| p.name == name);
        let implicit = named_by_nodes(name) || name == next.default_partition_name();
        match edit {
            PartitionEdit::Create { changes, .. } => {
                if defined.is_some() || implicit {
                    return Err("Invalid partition name specified".into());
                }
                let mut def = PartitionDef { name: name.to_string(), ..Default::default() };
                changes.apply_to(&mut def);
                next.partitions.push(def);
            }
            PartitionEdit::Update { changes, .. } => {
                let at = match defined {
                    Some(at) => at,
                    None if implicit => {
                        let is_default = name == next.default_partition_name();
                        next.partitions.push(PartitionDef { name: name.to_string(), default: is_default, ..Default::default() });
                        next.partitions.len() - 1
                    }
                    None => return Err("Invalid partition name specified".into()),
                };
                changes.apply_to(&mut next.partitions[at]);
            }
            PartitionEdit::Delete { .. } => {
                let Some(at) = defined else {
                    return Err(if implicit {
                        format!("Invalid partition name specified: {name} is defined by the nodes whose node.toml names it")
                    } else {
                        "Invalid partition name specified".into()
                    });
                };
                if in_use(name) {
                    return Err("Partition is in use".into());
                }
                next.partitions.remove(at);
            }
        }
        if let PartitionEdit::Create { changes, .. } | PartitionEdit::Update { changes, .. } = edit {
            if changes.default == Some(true) {
                for p in next.partitions.iter_mut().filter(|p| p.name != name) {
                    p.default = false;
                }
            }
        }
        next.validate()?;
        *self = next;
        Ok(())
    }

    /// The partition of jobs that name none: the policy's default, else
    /// [`crate::DEFAULT_PARTITION`].
    pub fn default_partition_name(&self) -> &str {
        self.partitions.iter().find(|p| p.default).map_or(crate::DEFAULT_PARTITION, |p| p.name.as_str())
    }

    /// The partitions node `node` is in, given those its node.toml names (`declared`): each
    /// declared one (none: the default partition) whose definition has no `Nodes=` list, and
    /// every partition whose `Nodes=` list names it. Empty: in none.
    pub fn partitions_of_node(&self, node: &str, declared: &[String]) -> Vec<String> {
        let default = self.default_partition_name();
        let listed = |p: &str| self.partitions.iter().find(|d| d.name == p).and_then(|d| d.nodes.as_ref());
        let base: Vec<&str> = if declared.is_empty() { vec![default] } else { declared.iter().map(String::as_str).collect() };
        let mut out: Vec<String> = base.into_iter().filter(|p| listed(p).is_none()).map(str::to_string).collect();
        for def in &self.partitions {
            if def.nodes.as_ref().is_some_and(|list| list.iter().any(|n| n == node)) && !out.contains(&def.name) {
                out.push(def.name.clone());
            }
        }
        out
    }

    /// Whether some partition lists its nodes (else every node's partitions are its node.toml's).
    pub fn lists_nodes(&self) -> bool {
        self.partitions.iter().any(|p| p.nodes.is_some())
    }

    /// The state of partition `name` (UP when the policy does not define it).
    pub fn partition_state(&self, name: &str) -> PartitionState {
        self.partitions.iter().find(|p| p.name == name).map_or(PartitionState::Up, |p| p.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes() -> PartitionChanges {
        PartitionChanges::default()
    }

    #[test]
    fn create_update_delete_as_slurm_answers() {
        let mut policy = SchedulerPolicy::default();
        let gpu_named = |p: &str| p == "gpu";
        let unused = |_: &str| false;
        let known = |n: &str| n == "n1" || n == "n2";
        let create = |name: &str, c: PartitionChanges| PartitionEdit::Create { name: name.into(), changes: c };
        let update = |name: &str, c: PartitionChanges| PartitionEdit::Update { name: name.into(), changes: c };

        let long = PartitionChanges { max_time_limit_ms: Some(Some(600_000)), default_time_limit_ms: Some(Some(300_000)), ..changes() };
        assert_eq!(policy.edit_partition(&create("long", long), gpu_named, unused, known), Ok(()));
        assert_eq!(policy.partitions[0].max_time_limit_ms, Some(600_000));
        // A name the policy, a node or the default already has.
        for taken in ["long", "gpu", crate::DEFAULT_PARTITION] {
            assert_eq!(
                policy.edit_partition(&create(taken, changes()), gpu_named, unused, known),
                Err("Invalid partition name specified".into())
            );
        }
        // Updating a partition only node.toml names defines it.
        let down = PartitionChanges { state: Some(PartitionState::Down), ..changes() };
        assert_eq!(policy.edit_partition(&update("gpu", down.clone()), gpu_named, unused, known), Ok(()));
        assert_eq!(policy.partition_state("gpu"), PartitionState::Down);
        assert_eq!(policy.edit_partition(&update("nope", down), gpu_named, unused, known), Err("Invalid partition name specified".into()));
        // Default=YES moves the flag.
        let default = PartitionChanges { default: Some(true), ..changes() };
        assert_eq!(policy.edit_partition(&update("long", default.clone()), gpu_named, unused, known), Ok(()));
        assert_eq!(policy.default_partition_name(), "long");
        assert_eq!(policy.edit_partition(&update("gpu", default), gpu_named, unused, known), Ok(()));
        assert_eq!(policy.default_partition_name(), "gpu");
        assert_eq!(policy.partitions.iter().filter(|p| p.default).count(), 1);
        // A default time above the maximum is refused whole.
        let before = policy.clone();
        let bad = PartitionChanges { default_time_limit_ms: Some(Some(3_600_000)), ..changes() };
        assert!(policy.edit_partition(&update("long", bad), gpu_named, unused, known).is_err());
        assert_eq!(policy, before);
        // Delete: refused while in use, and for what the policy does not define.
        let delete = PartitionEdit::Delete { name: "long".into() };
        assert_eq!(policy.edit_partition(&delete, gpu_named, |p| p == "long", known), Err("Partition is in use".into()));
        assert_eq!(policy.edit_partition(&delete, gpu_named, unused, known), Ok(()));
        assert_eq!(policy.edit_partition(&delete, gpu_named, unused, known), Err("Invalid partition name specified".into()));
    }

    #[test]
    fn a_nodes_list_decides_its_partition_alone() {
        let mut policy = SchedulerPolicy::default();
        let known = |n: &str| n == "n1" || n == "n2";
        let edit = |policy: &mut SchedulerPolicy, e: PartitionEdit| policy.edit_partition(&e, |p| p == "gpu", |_| false, known);
        let gpu = vec!["gpu".to_string()];
        // Without lists: node.toml's partitions, else the default.
        assert_eq!(policy.partitions_of_node("n1", &gpu), gpu);
        assert_eq!(policy.partitions_of_node("n2", &[]), vec![crate::DEFAULT_PARTITION.to_string()]);
        let list = |nodes: &[&str]| PartitionChanges { nodes: Some(nodes.iter().map(|n| n.to_string()).collect()), ..Default::default() };
        assert_eq!(
            edit(&mut policy, PartitionEdit::Create { name: "big".into(), changes: list(&["n1", "n9"]) }),
            Err("Invalid node name specified".into())
        );
        assert_eq!(edit(&mut policy, PartitionEdit::Create { name: "big".into(), changes: list(&["n2"]) }), Ok(()));
        assert_eq!(policy.partitions_of_node("n2", &[]), vec![crate::DEFAULT_PARTITION.to_string(), "big".to_string()]);
        // A list on `gpu` takes n1 out though its node.toml names it; n1 is then in none.
        assert_eq!(edit(&mut policy, PartitionEdit::Update { name: "gpu".into(), changes: list(&["n2"]) }), Ok(()));
        assert!(policy.partitions_of_node("n1", &gpu).is_empty());
        assert_eq!(policy.partitions_of_node("n2", &gpu), vec!["big".to_string(), "gpu".to_string()]);
        assert!(policy.lists_nodes());
    }

    #[test]
    fn access_lists_refuse_in_slurms_words_and_an_allow_list_overrides_a_deny_list() {
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut access = PartitionAccess::default();
        assert_eq!((access.account_refusal("p", None), access.qos_refusal("p", "normal")), (None, None), "ALL");
        assert_eq!(access.show(), "AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL");
        access.deny_accounts = names(&["bio"]);
        access.deny_qos = names(&["low"]);
        assert_eq!(access.account_refusal("p", None), None, "an unknown account is not denied");
        assert_eq!(
            access.account_refusal("p", Some("bio")).as_deref(),
            Some("AccountNotAllowed: Job's account not permitted to use this partition (p denies bio including bio)")
        );
        assert_eq!(
            access.qos_refusal("p", "low").as_deref(),
            Some("QOSNotAllowed: Job's QOS not permitted to use this partition (p denies low including low)")
        );
        assert_eq!(access.show(), "AllowGroups=ALL DenyAccounts=bio DenyQos=low");
        access.allow_accounts = names(&["phys", "chem"]);
        access.allow_qos = names(&["high"]);
        assert_eq!(access.account_refusal("p", Some("phys")), None);
        assert_eq!(
            access.account_refusal("p", Some("bio")).as_deref(),
            Some("AccountNotAllowed: Job's account not permitted to use this partition (p allows phys,chem not bio)")
        );
        assert_eq!(
            access.account_refusal("p", None).as_deref(),
            Some("AccountNotAllowed: Job's account not known, so it can't use this partition (p allows phys,chem)")
        );
        assert_eq!(
            access.qos_refusal("p", "normal").as_deref(),
            Some("QOSNotAllowed: Job's QOS not permitted to use this partition (p allows high not normal)")
        );
        assert_eq!(access.show(), "AllowGroups=ALL AllowAccounts=phys,chem AllowQos=high");
        access.allow_groups = names(&["gpu"]);
        assert!(access.allows_groups(&names(&["users", "gpu"])));
        assert!(!access.allows_groups(&names(&["users"])));
        access.allow_groups = names(&["a,b"]);
        assert!(access.validate().is_err());
    }

    #[test]
    fn an_edit_sets_or_clears_an_access_list() {
        let mut policy = SchedulerPolicy::default();
        let edit = |policy: &mut SchedulerPolicy, e: PartitionEdit| policy.edit_partition(&e, |_| false, |_| false, |_| true);
        let allow = PartitionChanges { allow_accounts: Some(vec!["phys".into()]), deny_qos: Some(vec!["low".into()]), ..changes() };
        assert_eq!(edit(&mut policy, PartitionEdit::Create { name: "p".into(), changes: allow }), Ok(()));
        assert_eq!(policy.partitions[0].access.allow_accounts, vec!["phys".to_string()]);
        let all = PartitionChanges { allow_accounts: Some(Vec::new()), ..changes() };
        assert_eq!(edit(&mut policy, PartitionEdit::Update { name: "p".into(), changes: all }), Ok(()));
        assert_eq!(policy.partitions[0].access, PartitionAccess { deny_qos: vec!["low".into()], ..Default::default() });
    }

    #[test]
    fn states_take_submissions_and_start_jobs_as_in_slurm() {
        let table: Vec<(bool, Option<&str>)> = [PartitionState::Up, PartitionState::Down, PartitionState::Drain, PartitionState::Inactive]
            .iter()
            .map(|s| (s.takes_submissions(), s.holds_jobs()))
            .collect();
        assert_eq!(table, vec![(true, None), (true, Some("PartitionDown")), (false, None), (false, Some("PartitionInactive"))]);
        assert_eq!(PartitionState::parse("drain"), Some(PartitionState::Drain));
        assert_eq!(PartitionState::parse("bogus"), None);
    }
}
