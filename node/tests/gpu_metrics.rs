//! A scrape's text parsed back: DCGM names and labels for every GPU with the job holding it,
//! per-job series (ours and slurm-job-exporter's), cluster series.

use std::collections::{BTreeMap, BTreeSet};

use corral_node::gpu::probe_from_config;
use corral_node::metrics::{render_snapshot, ClusterSnapshot, JobOnNode, MetricsSnapshot, NodeSnapshot};

/// (name, labels) → value for every sample line.
fn parse(text: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').expect("value");
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let labels = body
                    .split("\",")
                    .filter(|kv| !kv.is_empty())
                    .map(|kv| {
                        let (k, v) = kv.split_once("=\"").expect("k=\"v\"");
                        (k.to_string(), v.trim_end_matches('"').to_string())
                    })
                    .collect();
                (n.to_string(), labels)
            }
            None => (series.to_string(), BTreeMap::new()),
        };
        out.insert((name, labels), value.parse().expect("number"));
    }
    out
}

#[test]
fn scrape_parses_with_dcgm_names_and_job_labels() {
    let probe = probe_from_config("sxm-h100x8", "gpu-node-1");
    let held: BTreeSet<u32> = [0, 1].into_iter().collect();
    let samples = probe.sampler().sample(&held).expect("sample");
    let gpus = samples.into_iter().map(|s| {
        let job = held.contains(&s.gpu).then_some(42);
        (s, job)
    });
    let snap = MetricsSnapshot {
        hostname: "gpu-node-1".into(),
        raft_term: 3,
        raft_is_leader: true,
        raft_commit_index: 17,
        raft_applied_index: 16,
        agent_running_jobs: 1,
        passes_paced: vec![("in_flight", 4), ("lagging", 2), ("stalled", 1)],
        transport: transport::Counters { accepted: 40, dialed: 7, dials_failed: 2, dropped: 3, refused_busy: 5 },
        cluster: Some(ClusterSnapshot {
            jobs_by_state: [("PENDING", 2), ("RUNNING", 1)].into_iter().collect(),
            queue_depth: [(("default".to_string(), "pending"), 2), (("default".to_string(), "running"), 1)].into_iter().collect(),
            queue_wait_ms_max: [("default".to_string(), 90_500)].into_iter().collect(),
            requeues: 3,
            rendezvous_stores: 2,
            rendezvous_store_bytes: 5_120,
            nodes: vec![NodeSnapshot {
                name: "gpu-node-1".into(),
                gpus_total: 8,
                gpus_free: 6,
                up: true,
                state: "mixed",
                heartbeat_age_ms: Some(1500),
            }],
        }),
        gpus: gpus.collect(),
        jobs: [(42, alice_in_physics())].into_iter().collect(),
    };
    let text = render_snapshot(&snap);
    let m = parse(&text);
    let get = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let want: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        *m.get(&(name.to_string(), want.clone())).unwrap_or_else(|| panic!("{name} {want:?} in\n{text}"))
    };
    assert_eq!(get("corral_raft_term", &[]), 3.0);
    assert_eq!(get("corral_raft_is_leader", &[]), 1.0);
    assert_eq!(get("corral_raft_commit_index", &[]), 17.0);
    assert_eq!(get("corral_jobs", &[("state", "PENDING")]), 2.0);
    assert_eq!(get("corral_queue_depth", &[("partition", "default"), ("state", "pending")]), 2.0);
    assert_eq!(get("corral_node_gpus_free", &[("node", "gpu-node-1")]), 6.0);
    assert_eq!(get("corral_node_heartbeat_age_seconds", &[("node", "gpu-node-1")]), 1.5);
    assert_eq!(get("corral_queue_wait_seconds_max", &[("partition", "default")]), 90.5);
    assert_eq!(get("corral_scheduler_passes_paced_total", &[("why", "lagging")]), 2.0);
    assert_eq!(get("corral_scheduler_passes_paced_total", &[("why", "stalled")]), 1.0);
    assert_eq!(get("corral_transport_connections_accepted_total", &[]), 40.0);
    assert_eq!(get("corral_transport_dials_failed_total", &[]), 2.0);
    assert_eq!(get("corral_transport_connections_refused_busy_total", &[]), 5.0);
    assert_eq!(get("corral_transport_connections_dropped_total", &[]), 3.0);
    assert_eq!(get("corral_job_requeues_total", &[]), 3.0);
    assert_eq!((get("corral_rendezvous_stores", &[]), get("corral_rendezvous_store_bytes", &[])), (2.0, 5120.0));
    for state in corral_node::metrics::NODE_STATES {
        let want = if state == "mixed" { 1.0 } else { 0.0 };
        assert_eq!(get("corral_node_state", &[("node", "gpu-node-1"), ("state", state)]), want, "{state}");
    }

    let inv = probe.discover().expect("discover");
    let mut util_sum = 0.0;
    let mut used_bytes = 0.0;
    for g in &inv.gpus {
        let job = if g.index < 2 { "42" } else { "" };
        let idx = g.index.to_string();
        let dev = format!("nvidia{}", g.index);
        let l = [
            ("gpu", idx.as_str()),
            ("UUID", g.uuid.as_str()),
            ("device", &dev),
            ("modelName", "NVIDIA H100 80GB HBM3"),
            ("Hostname", "gpu-node-1"),
            ("job", job),
        ];
        let util = get("DCGM_FI_DEV_GPU_UTIL", &l);
        let used = get("DCGM_FI_DEV_FB_USED", &l);
        let free = get("DCGM_FI_DEV_FB_FREE", &l);
        assert_eq!(used + free, g.memory_mib as f64, "gpu {}", g.index);
        let temp = get("DCGM_FI_DEV_GPU_TEMP", &l);
        let power = get("DCGM_FI_DEV_POWER_USAGE", &l);
        assert!((20.0..100.0).contains(&temp) && (50.0..700.0).contains(&power), "gpu {}: {temp} C, {power} W", g.index);
        if g.index < 2 {
            assert!(util >= 60.0 && used > 0.0, "a held gpu is busy");
            util_sum += util;
            used_bytes += used * 1024.0 * 1024.0;
            // slurm-job-exporter's series of the same GPU, with its labels only.
            let slurm = [
                ("user", "alice"),
                ("account", "physics"),
                ("slurmjobid", "42"),
                ("gpu", idx.as_str()),
                ("gpu_type", "NVIDIA H100 80GB HBM3"),
            ];
            assert_eq!(get("slurm_job_utilization_gpu", &slurm), util);
            assert_eq!(get("slurm_job_gpu_utilization", &slurm), util, "the guide's name for the same value");
            assert_eq!(get("slurm_job_memory_usage_gpu", &slurm), used * 1024.0 * 1024.0);
            assert_eq!(get("slurm_job_power_gpu", &slurm), power * 1000.0, "milliwatts");
            assert!((20.0..70.0).contains(&get("slurm_job_utilization_gpu_memory", &slurm)), "{text}");
        } else {
            assert_eq!((util, used), (0.0, 0.0), "an idle gpu is idle");
        }
    }
    let job = [("job", "42"), ("node", "gpu-node-1")];
    assert_eq!(get("corral_job_gpu_utilization", &job), util_sum / 2.0);
    assert_eq!(get("corral_job_gpu_memory_used_bytes", &job), used_bytes);
    let owner = [("user", "alice"), ("account", "physics"), ("slurmjobid", "42")];
    assert_eq!(get("slurm_job_memory_usage", &owner), (3u64 << 30) as f64);
    assert_eq!(get("slurm_job_memory_limit", &owner), (8u64 << 30) as f64);
    let slurm_rows = m.keys().filter(|(n, _)| n.starts_with("slurm_job_")).count();
    assert_eq!(slurm_rows, 5 * 2 + 2, "five series per held GPU, two for the job's memory: {text}");
    assert!(text.contains("# TYPE DCGM_FI_DEV_GPU_UTIL gauge"), "{text}");
    assert!(text.contains("# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"), "DCGM exporter's help text: {text}");

    // Every series the Grafana dashboard in deploy/ queries is one a scrape has.
    let dashboard = include_str!("../../deploy/grafana/corral-dashboard.json");
    let json: serde_json::Value = serde_json::from_str(dashboard).expect("the dashboard is JSON");
    let exprs: Vec<&str> = json["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().expect("targets"))
        .filter_map(|t| t["expr"].as_str())
        .collect();
    // A MIG node's scrape has the per-instance series the dashboard shows too.
    let mig = parse(&mig_scrape().0);
    let names: BTreeSet<&str> = m.keys().chain(mig.keys()).map(|(n, _)| n.as_str()).collect();
    let mut queried = BTreeSet::new();
    for expr in &exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("corral_") || word.starts_with("DCGM_") || word.starts_with("slurm_") {
                assert!(names.contains(word), "the dashboard queries {word}, which no scrape has ({expr})");
                queried.insert(word);
            }
        }
    }
    assert!(queried.len() >= 10, "{queried:?}");
}

/// Job 42's owner, as the node's agent knows it, in a cgroup using 3 GiB of its 8 GiB.
fn alice_in_physics() -> JobOnNode {
    JobOnNode { user: "alice".into(), account: "physics".into(), memory_used_bytes: Some(3 << 30), memory_limit_bytes: Some(8 << 30) }
}

/// The scrape of an `h200-mig` node (3g.71gb@0, 2g.35gb@4, 1g.18gb@6) whose 1g instance job 7
/// holds, and that instance's slot.
fn mig_scrape() -> (String, u32) {
    let probe = probe_from_config("h200-mig", "mig-node");
    let slot = scheduler::mig_slot(0, 6);
    let held: BTreeSet<u32> = [slot].into_iter().collect();
    let samples = probe.sampler().sample(&held).expect("sample");
    let gpus = samples.into_iter().map(|s| {
        let job = held.contains(&s.slot()).then_some(7);
        (s, job)
    });
    (render_snapshot(&MetricsSnapshot { hostname: "mig-node".into(), gpus: gpus.collect(), ..MetricsSnapshot::default() }), slot)
}

#[test]
fn a_mig_gpu_has_series_per_instance_labelled_as_dcgm_does() {
    let (text, _) = mig_scrape();
    let m = parse(&text);
    let rows = |name: &str| -> Vec<(BTreeMap<String, String>, f64)> {
        m.iter().filter(|((n, _), _)| n == name).map(|((_, l), v)| (l.clone(), *v)).collect()
    };
    let fb = rows("DCGM_FI_DEV_FB_USED");
    let by_profile: BTreeMap<&str, (&str, &str, f64)> =
        fb.iter().map(|(l, v)| (l["GPU_I_PROFILE"].as_str(), (l["GPU_I_ID"].as_str(), l["job"].as_str(), *v))).collect();
    assert_eq!(by_profile.keys().copied().collect::<Vec<_>>(), ["1g.18gb", "2g.35gb", "3g.71gb"], "{text}");
    let (_, job, used) = by_profile["1g.18gb"];
    assert_eq!(job, "7", "the held instance carries its job: {text}");
    assert!(used > 0.0 && by_profile["3g.71gb"].2 == 0.0, "{text}");
    for (l, _) in &fb {
        assert_eq!((l["gpu"].as_str(), l["device"].as_str(), l["Hostname"].as_str()), ("0", "nvidia0", "mig-node"));
        assert!(l["UUID"].starts_with("GPU-"), "the parent's UUID: {l:?}");
    }
    let active = rows("DCGM_FI_PROF_GR_ENGINE_ACTIVE");
    assert_eq!(active.len(), 3, "{text}");
    assert!(active.iter().all(|(l, v)| if l["job"] == "7" { (0.6..1.0).contains(v) } else { *v == 0.0 }), "{text}");
    assert!(rows("DCGM_FI_DEV_GPU_UTIL").is_empty(), "no utilization of the MIG-mode GPU itself: {text}");
    let temp = rows("DCGM_FI_DEV_GPU_TEMP");
    assert!(temp.len() == 1 && !temp[0].0.contains_key("GPU_I_ID"), "{text}");
    assert_eq!(rows("corral_job_gpu_utilization").len(), 1, "{text}");
    // slurm-job-exporter has no MIG label: the instance's series is its job's on GPU 0.
    let slurm = rows("slurm_job_utilization_gpu");
    assert_eq!(slurm.len(), 1, "{text}");
    assert_eq!((slurm[0].0["slurmjobid"].as_str(), slurm[0].0["gpu"].as_str()), ("7", "0"), "{text}");
    assert!(!slurm[0].0.contains_key("GPU_I_ID") && !slurm[0].0.contains_key("job"), "{text}");
    assert!(rows("slurm_job_memory_usage").is_empty(), "no cgroup, no job memory: {text}");
}

#[test]
fn a_node_without_gpus_has_no_dcgm_series() {
    let text = render_snapshot(&MetricsSnapshot { hostname: "cpu-node".into(), ..MetricsSnapshot::default() });
    assert!(!text.contains("DCGM_") && !text.contains("slurm_job_"), "{text}");
    assert!(text.contains("corral_raft_term 0"), "{text}");
}
