//! The scheduler policy (partitions and QoS): setting it, editing one partition, and what a
//! submission names that the cluster does not define.

use proto::{CommandResult, GresKind, GresRequest, JobSpec};

use super::{rejected, ClusterState};

impl ClusterState {
    /// `SetPolicy`: the scheduler policy from now on, if it is valid.
    pub(super) fn set_policy(&mut self, policy: &proto::SchedulerPolicy) -> CommandResult {
        match policy.validate() {
            Ok(()) => {
                self.policy = policy.clone();
                CommandResult::Ok
            }
            Err(e) => rejected(e),
        }
    }

    /// One partition created, changed or deleted (see [`proto::SchedulerPolicy::edit_partition`]):
    /// a partition exists without a definition when a node's node.toml names it, and is in use
    /// while a pending or running job names it (or, naming none, takes the default).
    pub(super) fn edit_partition(&mut self, edit: &proto::PartitionEdit) -> CommandResult {
        let default = self.policy.default_partition_name().to_string();
        let nodes = &self.nodes;
        let jobs = &self.jobs;
        let named_by_nodes = |p: &str| nodes.values().any(|n| n.inventory.partitions.iter().any(|q| q == p));
        let in_use = |p: &str| jobs.values().any(|j| !j.state.is_final() && j.spec.partition.as_deref().unwrap_or(default.as_str()) == p);
        let is_node = |name: &str| nodes.values().any(|n| n.name == name);
        match self.policy.edit_partition(edit, named_by_nodes, in_use, is_node) {
            Ok(()) => CommandResult::Ok,
            Err(why) => rejected(why),
        }
    }

    /// What a submission names that this cluster does not define, in Slurm's words (`None`:
    /// everything it names exists): a partition that neither the policy nor any node's
    /// `partitions` names (the default partition always exists), a QoS the policy lacks
    /// (`normal`, every job's without one, always exists), MIG instances per node that no
    /// node's MIG-mode GPUs could hold in any valid layout (`scheduler::mig::never_fits`), a gang
    /// whose share per node (GPUs, CPUs, memory) too few of its partition's nodes have, in
    /// whatever state (`scheduler::never_holds`). Slurm
    /// refuses these at submit; a job accepted with one would pend for ever. So is a job for a
    /// partition in state DRAIN or INACTIVE, as in Slurm, and, with `EnforcePartLimits`, one its
    /// partition's time limit or access lists refuse. Accounts are checked apart
    /// ([`ClusterState::accounting_refusal`]).
    pub fn undefined_in_submission(&self, spec: &JobSpec) -> Option<String> {
        if let Some(p) = spec.partition.as_deref() {
            let default = self.policy.default_partition_name();
            let known = p == default
                || self.policy.partitions.iter().any(|d| d.name == p)
                || self.nodes.values().any(|n| n.inventory.partitions.iter().any(|q| q == p));
            if !known {
                return Some("Invalid partition name specified".into());
            }
        }
        let partition = spec.partition.as_deref().unwrap_or(self.policy.default_partition_name());
        if !self.policy.partition_state(partition).takes_submissions() {
            return Some("Required partition not available (inactive or drain)".into());
        }
        if let Some(q) = spec.qos.as_deref() {
            if q != proto::DEFAULT_QOS && !self.policy.qos.iter().any(|d| d.name == q) {
                return Some("Invalid qos specification".into());
            }
        }
        if self.policy.enforce_part_limits {
            if let Some(why) = self.partition_limit_refusal(spec, partition) {
                return Some(why.into());
            }
        }
        // Shards share a whole GPU: a MIG instance has none (Slurm's words for a bad GRES).
        if let Some(GresRequest { gpu_type: Some(t), kind: GresKind::Shard, .. }) = &spec.gres {
            if scheduler::is_mig_profile(t) {
                return Some("Invalid generic resource (gres) specification".into());
            }
        }
        if let Some(GresRequest { gpu_type: Some(profile), count, kind: GresKind::Gpu }) = &spec.gres {
            let nodes = self.nodes.values().map(|n| (n.name.as_str(), n.inventory.gpus.as_slice()));
            if let Some(why) = scheduler::mig::never_fits(nodes, profile, *count) {
                return Some(format!("Requested node configuration is not available: {why}"));
            }
        }
        let nodes = self.nodes.values().map(|n| (n.name.as_str(), &*n.inventory));
        scheduler::never_holds(nodes, self.policy.default_partition_name(), spec)
    }

    /// With `EnforcePartLimits=ALL`: what of partition `partition`'s limits and access lists
    /// `spec` breaks, in the words Slurm refuses the submission with (without it the job pends
    /// with the reason instead).
    fn partition_limit_refusal(&self, spec: &JobSpec, partition: &str) -> Option<&'static str> {
        let def = self.policy.partitions.iter().find(|p| p.name == partition)?;
        if spec.time_limit_ms.zip(def.max_time_limit_ms).is_some_and(|(limit, max)| limit > max) {
            return Some("Requested time limit is invalid (missing or exceeds some limit)");
        }
        if def.access.account_refusal(partition, spec.account.as_deref()).is_some() {
            return Some("Invalid account or account/partition combination specified");
        }
        if def.access.qos_refusal(partition, spec.qos.as_deref().unwrap_or(proto::DEFAULT_QOS)).is_some() {
            return Some("Invalid qos specification");
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, GpuInfo, Inventory, JobSpec};

    use crate::cluster::test_support::{submit, with_node_n1};
    use crate::cluster::ClusterState;

    #[test]
    fn a_submission_naming_an_undefined_partition_or_qos_is_refused_in_slurms_words() {
        let mut inv = scheduler::testkit::dgx("gpu:h100:8");
        inv.partitions = vec!["gpu".into()];
        let mut s = with_node_n1(inv);
        let with = |s: &ClusterState, partition: Option<&str>, qos: Option<&str>| {
            let mut spec = scheduler::testkit::spec("gpu:1", 1);
            spec.partition = partition.map(str::to_string);
            spec.qos = qos.map(str::to_string);
            s.undefined_in_submission(&spec)
        };
        assert_eq!(with(&s, None, None), None);
        assert_eq!(with(&s, Some("gpu"), None), None, "a node names it");
        assert_eq!(with(&s, Some(proto::DEFAULT_PARTITION), None), None, "the default partition always exists");
        assert_eq!(with(&s, Some("long"), None).as_deref(), Some("Invalid partition name specified"));
        assert_eq!(with(&s, None, Some(proto::DEFAULT_QOS)), None);
        assert_eq!(with(&s, None, Some("high")).as_deref(), Some("Invalid qos specification"));
        s.policy.partitions.push(proto::PartitionDef { name: "long".into(), default: true, ..Default::default() });
        s.policy.qos.push(proto::QosDef {
            name: "high".into(),
            priority: 10,
            preempt: vec![],
            preempt_mode: "requeue".into(),
            limits: Default::default(),
            description: None,
        });
        assert_eq!(with(&s, Some("long"), Some("high")), None, "the policy defines both");
        assert_eq!(
            with(&s, Some(proto::DEFAULT_PARTITION), None).as_deref(),
            Some("Invalid partition name specified"),
            "`long` is the default now"
        );
    }

    #[test]
    fn with_enforce_part_limits_a_submission_the_partition_refuses_is_refused_in_slurms_words() {
        let mut s = with_node_n1(scheduler::testkit::dgx("gpu:h100:8"));
        let access = proto::PartitionAccess { allow_accounts: vec!["phys".into()], deny_qos: vec!["normal".into()], ..Default::default() };
        let gpu =
            proto::PartitionDef { name: "gpu".into(), default: true, max_time_limit_ms: Some(3_600_000), access, ..Default::default() };
        s.policy.partitions.push(gpu);
        let with = |s: &ClusterState, account: &str, qos: Option<&str>, limit_ms: u64| {
            let mut spec = scheduler::testkit::spec("gpu:1", 1);
            (spec.account, spec.qos, spec.time_limit_ms) = (Some(account.into()), qos.map(str::to_string), Some(limit_ms));
            s.undefined_in_submission(&spec)
        };
        assert_eq!(with(&s, "bio", None, 7_200_000), None, "EnforcePartLimits=NO: the job pends with the reason");
        s.policy.enforce_part_limits = true;
        s.policy.qos.push(proto::QosDef { name: "high".into(), preempt_mode: "requeue".into(), ..Default::default() });
        assert_eq!(with(&s, "phys", Some("high"), 3_600_000), None);
        assert_eq!(
            with(&s, "phys", Some("high"), 7_200_000).as_deref(),
            Some("Requested time limit is invalid (missing or exceeds some limit)")
        );
        assert_eq!(with(&s, "bio", Some("high"), 60_000).as_deref(), Some("Invalid account or account/partition combination specified"));
        assert_eq!(with(&s, "phys", None, 60_000).as_deref(), Some("Invalid qos specification"), "no QoS is normal, denied here");
    }

    #[test]
    fn partitions_edited_through_the_log_take_or_refuse_submissions_by_their_state() {
        let mut inv = scheduler::testkit::dgx("gpu:h100:8");
        inv.partitions = vec!["gpu".into()];
        let mut s = with_node_n1(inv);
        let edit = |s: &mut ClusterState, edit: proto::PartitionEdit| s.apply(&Command::EditPartition { edit, now_ms: 1 });
        let state = |st| proto::PartitionChanges { state: Some(st), ..Default::default() };
        let submit_to = |s: &ClusterState, p: &str| {
            let mut spec = scheduler::testkit::spec("gpu:1", 1);
            spec.partition = Some(p.into());
            s.undefined_in_submission(&spec)
        };
        let refused = Some("Required partition not available (inactive or drain)".to_string());
        // `gpu` exists through node.toml; an update defines it in the policy.
        for (st, answer) in [
            (proto::PartitionState::Drain, refused.clone()),
            (proto::PartitionState::Inactive, refused.clone()),
            (proto::PartitionState::Down, None),
            (proto::PartitionState::Up, None),
        ] {
            assert_eq!(edit(&mut s, proto::PartitionEdit::Update { name: "gpu".into(), changes: state(st) }), CommandResult::Ok);
            assert_eq!(submit_to(&s, "gpu"), answer, "{st:?}");
        }
        assert_eq!(s.scheduler_view().partitions["gpu"].state, proto::PartitionState::Up);
        // A partition a pending job names is in use.
        let created = proto::PartitionEdit::Create { name: "short".into(), changes: Default::default() };
        assert_eq!(edit(&mut s, created.clone()), CommandResult::Ok);
        assert_eq!(edit(&mut s, created), CommandResult::Rejected("Invalid partition name specified".into()));
        let mut spec = scheduler::testkit::spec("gpu:1", 1);
        spec.partition = Some("short".into());
        let job = submit(&mut s, spec);
        let delete = proto::PartitionEdit::Delete { name: "short".into() };
        assert_eq!(edit(&mut s, delete.clone()), CommandResult::Rejected("Partition is in use".into()));
        assert_eq!(s.apply(&Command::Cancel { job, now_ms: 2 }), CommandResult::Ok);
        assert_eq!(edit(&mut s, delete), CommandResult::Ok);
        assert_eq!(submit_to(&s, "short").as_deref(), Some("Invalid partition name specified"));
    }

    #[test]
    fn a_mig_request_no_node_could_ever_hold_is_refused_with_the_hardware_limit() {
        let mut inv = scheduler::testkit::dgx("gpu:h100:8");
        inv.gpus = vec![GpuInfo { model: "NVIDIA H200".into(), memory_mib: 143_771, mig_enabled: true, ..Default::default() }];
        let s = with_node_n1(inv);
        let asking = |gres: &str| s.undefined_in_submission(&scheduler::testkit::spec(gres, 1));
        assert_eq!(
            asking("gpu:3g.71gb:7").as_deref(),
            Some("Requested node configuration is not available: no node can ever hold 7x 3g.71gb at once: one H200 holds at most 2 (MIG slice rules), and the most any node holds is 2 (n1)")
        );
        assert_eq!(asking("gpu:3g.71gb:2"), None);
        assert_eq!(asking("gpu:1g.18gb:7"), None);
    }

    #[test]
    fn a_gang_no_node_could_ever_hold_is_refused_at_submit_whatever_the_nodes_state() {
        let mut s = with_node_n1(scheduler::testkit::dgx("h100"));
        let asking = |s: &ClusterState, gres: &str, nodes: u32, edit: &dyn Fn(&mut JobSpec)| {
            let mut spec = scheduler::testkit::spec(gres, nodes);
            spec.mem_mib = 1024;
            edit(&mut spec);
            s.undefined_in_submission(&spec)
        };
        let same = |_: &mut JobSpec| {};
        assert_eq!(
            asking(&s, "gpu:9", 1, &same).as_deref(),
            Some(
                "Requested node configuration is not available: needs 1 node(s) with 9x gpu, 1 cpus and 1024 MiB each; \
                 partition default has 0 (largest: 8x gpu, 112 cpus, 2097152 MiB)"
            )
        );
        assert_eq!(asking(&s, "gpu:8", 1, &same), None);
        assert!(asking(&s, "gpu:h100:9", 1, &same).is_some_and(|w| w.contains("with 9x gpu:h100")));
        assert_eq!(asking(&s, "gpu:a100:9", 1, &same), None, "no node has the type: one may join");
        assert_eq!(
            asking(&s, "gpu:1", 2, &same).as_deref(),
            Some("Node count specification invalid: needs 2 nodes; partition default has 1")
        );
        assert!(asking(&s, "", 1, &|x| x.cpus_per_task = 113).is_some());
        assert!(asking(&s, "", 1, &|x| x.mem_mib = 3 * 1024 * 1024).is_some());
        assert!(asking(&s, "", 1, &|x| x.constraint = vec!["ib".into()]).is_some(), "no node has the feature");
        assert!(asking(&s, "", 1, &|x| x.exclude = vec!["n1".into()]).is_some());
        s.policy.partitions.push(proto::PartitionDef { name: "gpu".into(), ..Default::default() });
        assert_eq!(asking(&s, "", 1, &|x| x.partition = Some("gpu".into())), None, "no node of `gpu` yet: one may join");
        let cpu_only = with_node_n1(Inventory { gpus: Vec::new(), ..scheduler::testkit::dgx("h100") });
        assert_eq!(asking(&cpu_only, "gpu:1", 1, &same), None, "no node with a GPU yet: one may join");
        assert!(asking(&cpu_only, "", 1, &|x| x.cpus_per_task = 113).is_some());
        // Down or drained, the node still counts: it may come back.
        let id = s.nodes.values().map(|n| n.id).next().expect("n1");
        s.apply(&Command::NodeDown { node: id, reason: "test".into(), now_ms: 1 });
        assert_eq!(asking(&s, "gpu:8", 1, &same), None);
        assert!(asking(&s, "gpu:9", 1, &same).is_some());
    }
}
