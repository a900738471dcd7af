//! Issue 17, metrics in a dev cluster: every node of `corral dev up` serves Prometheus metrics
//! on a port of its own, which `dev up` prints and `client.toml` lists. Each is scraped over
//! HTTP and parsed by prometheus-client's own parser (`tests/fixtures/metrics/parse.py`, in the
//! venv of `scripts/setup-clients.sh`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use corral_tests::{pyenv, wait_until, TestCluster};
use serde_json::Value;

const PARSE_PY: &str = include_str!("../fixtures/metrics/parse.py");

/// `GET /metrics` over plain HTTP; the body of a 200 answer.
fn scrape(url: &str) -> String {
    let addr = url.strip_prefix("http://").and_then(|r| r.strip_suffix("/metrics")).unwrap_or_else(|| panic!("not a metrics URL: {url}"));
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("set a read timeout");
    // In two writes, as a slow client might: the node answers once the head is whole.
    stream.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n").as_bytes()).expect("send the request line");
    stream.write_all(b"Connection: close\r\n\r\n").expect("send the rest of the head");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP header in {response:?}"));
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    body.to_string()
}

/// The samples of an exposition, as prometheus-client parses it (a parse error fails).
fn parse(py: &Path, text: &str) -> Vec<Value> {
    let mut child = Command::new(py.join("bin/python"))
        .args(["-c", PARSE_PY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python");
    child.stdin.take().expect("python's stdin").write_all(text.as_bytes()).expect("write the exposition");
    let out = child.wait_with_output().expect("wait for python");
    assert!(out.status.success(), "prometheus-client refused the exposition: {}\n{text}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Vec<Value>>(&out.stdout).expect("parse.py prints JSON")
}

fn named<'a>(samples: &'a [Value], name: &str) -> Vec<&'a Value> {
    samples.iter().filter(|s| s["name"] == name).collect()
}

/// (node, metrics URL) as `dev up` of the running cluster prints them (it starts nothing);
/// each is also in `client.toml`.
fn metrics_urls(c: &TestCluster, opts: &[&str]) -> Vec<(String, String)> {
    let mut args = vec!["dev", "up", "--dir", c.path_str()];
    args.extend_from_slice(opts);
    let out = c.raw(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(" metrics: ").map(|(n, u)| (n.to_string(), u.to_string())))
        .collect();
    let client_toml = std::fs::read_to_string(c.path().join("client.toml")).expect("read client.toml");
    for (_, url) in &printed {
        assert!(client_toml.contains(&format!("\"{url}\"")), "client.toml lists {url}:\n{client_toml}");
    }
    printed
}

#[test]
fn every_dev_node_serves_metrics_that_prometheus_parses_with_each_gpu_labelled_by_its_job() {
    let Some(py) = pyenv() else { return };
    let opts = ["--nodes", "2", "--gpus", "h100:2"];
    let c = TestCluster::up(&opts);
    let job = c.submit(&["--gres", "gpu:1"], &["sleep", "120"]);
    wait_until("the job to run", Duration::from_secs(20), || c.job(job)["state"] == "RUNNING");
    let job_node = c.job(job)["node"].as_str().unwrap_or_default().to_string();

    let printed = metrics_urls(&c, &opts);
    assert_eq!(printed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["n1", "n2"], "{printed:?}");

    let job_label = job.to_string();
    let mut leaders = 0;
    for (name, url) in &printed {
        let mut samples = Vec::new();
        // The GPU sampler runs once a second: wait for the job's GPU to carry its label.
        wait_until(&format!("{name}'s GPU rows"), Duration::from_secs(15), || {
            samples = parse(&py, &scrape(url));
            let util = named(&samples, "DCGM_FI_DEV_GPU_UTIL");
            let labelled = util.iter().filter(|s| s["labels"]["job"].as_str() == Some(job_label.as_str())).count();
            util.len() == 2 && labelled == usize::from(*name == job_node)
        });
        for s in named(&samples, "DCGM_FI_DEV_GPU_UTIL") {
            assert_eq!(s["labels"]["Hostname"], name.as_str(), "{s}");
            assert_eq!(s["labels"]["modelName"].as_str().map(|m| m.contains("H100")), Some(true), "{s}");
        }
        assert_eq!(named(&samples, "corral_raft_term").len(), 1, "{name}");
        leaders += named(&samples, "corral_raft_is_leader").iter().filter(|s| s["value"] == 1.0).count();
        // Both nodes are voters: each shows the cluster from its replicated state, every
        // state listed (OUT_OF_MEMORY too) and the running job in it.
        let jobs = named(&samples, "corral_jobs");
        let state = |st: &str| jobs.iter().find(|s| s["labels"]["state"] == st).and_then(|s| s["value"].as_f64());
        assert_eq!(state("RUNNING"), Some(1.0), "{name}: {jobs:?}");
        assert_eq!(state("OUT_OF_MEMORY"), Some(0.0), "{name}: {jobs:?}");
        let up = named(&samples, "corral_node_up");
        assert_eq!(up.iter().filter(|s| s["value"] == 1.0).count(), 2, "{name}: {up:?}");
        // One Slurm state per node: the job's node is mixed (one of two GPUs), the other idle.
        let states: Vec<(String, String)> = named(&samples, "corral_node_state")
            .iter()
            .filter(|s| s["value"] == 1.0)
            .map(|s| (s["labels"]["node"].as_str().unwrap_or_default().into(), s["labels"]["state"].as_str().unwrap_or_default().into()))
            .collect();
        let idle = if job_node == "n1" { "n2" } else { "n1" };
        let want: std::collections::BTreeSet<(String, String)> =
            [(job_node.clone(), "mixed".into()), (idle.into(), "idle".into())].into_iter().collect();
        assert_eq!(states.into_iter().collect::<std::collections::BTreeSet<_>>(), want, "{name}");
        let requeues = named(&samples, "corral_job_requeues_total");
        assert_eq!(requeues.iter().map(|s| s["value"].as_f64()).collect::<Vec<_>>(), [Some(0.0)], "{name}: {requeues:?}");
        let slurm = named(&samples, "slurm_job_utilization_gpu");
        if *name == job_node {
            let mine = named(&samples, "corral_job_gpu_utilization");
            assert_eq!(mine.iter().map(|s| s["labels"]["job"].clone()).collect::<Vec<_>>(), [Value::from(job_label.clone())], "{name}");
            // slurm-job-exporter's series: its labels, the job's user, no account given.
            assert_eq!(slurm.len(), 1, "{name}: {slurm:?}");
            let labels = &slurm[0]["labels"];
            assert_eq!((&labels["slurmjobid"], &labels["user"]), (&Value::from(job_label.clone()), &c.job(job)["user"]), "{labels}");
            let keys: std::collections::BTreeSet<&str> =
                labels.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
            let keys: Vec<&str> = keys.into_iter().collect();
            assert_eq!(keys, ["account", "gpu", "gpu_type", "slurmjobid", "user"], "no labels of ours: {labels}");
        } else {
            assert!(slurm.is_empty(), "{name}: {slurm:?}");
        }
    }
    assert_eq!(leaders, 1, "one node says it leads");
    assert!(c.corral(&["cancel", &job.to_string()]).status.success());
}

/// Issue 17, per-slice truth: two jobs on two MIG instances of one H200 each get their
/// instance's series (DCGM's `GPU_I_ID`/`GPU_I_PROFILE` labels and the job label), and each is
/// accounted by its share of the GPU: a 3g.71gb for 20 s is 8 GPU-seconds, a 1g.18gb 2.
#[test]
fn each_mig_instance_has_series_labelled_with_its_job_and_is_accounted_by_its_share() {
    let Some(py) = pyenv() else { return };
    let opts = ["--nodes", "1", "--gpus", "h200-mig", "--voters-max", "1"];
    let c = TestCluster::up(&opts);
    // The GPU starts as 3g.71gb@0, 2g.35gb@4, 1g.18gb@6.
    let big = c.submit(&["--gres", "gpu:3g.71gb:1"], &["sleep", "20"]);
    let small = c.submit(&["--gres", "gpu:1g.18gb:1"], &["sleep", "20"]);
    wait_until("both jobs to run", Duration::from_secs(20), || [big, small].iter().all(|j| c.job(*j)["state"] == "RUNNING"));
    let url = metrics_urls(&c, &opts).into_iter().next().expect("n1's metrics").1;
    let holder = |s: &Value| s["labels"]["job"].as_str().unwrap_or_default().to_string();
    let mut samples = Vec::new();
    wait_until("each instance's row to carry its job", Duration::from_secs(15), || {
        samples = parse(&py, &scrape(&url));
        let fb = named(&samples, "DCGM_FI_DEV_FB_USED");
        let by_profile: std::collections::BTreeSet<(String, String)> =
            fb.iter().map(|s| (s["labels"]["GPU_I_PROFILE"].as_str().unwrap_or_default().to_string(), holder(s))).collect();
        let want = [("1g.18gb".into(), small.to_string()), ("2g.35gb".into(), String::new()), ("3g.71gb".into(), big.to_string())];
        fb.len() == 3 && by_profile == want.into_iter().collect()
    });
    for s in named(&samples, "DCGM_FI_DEV_FB_USED") {
        assert_eq!((s["labels"]["gpu"].as_str(), s["labels"]["device"].as_str()), (Some("0"), Some("nvidia0")), "{s}");
        assert!(s["labels"]["UUID"].as_str().is_some_and(|u| u.starts_with("GPU-")), "the parent GPU's UUID, as DCGM: {s}");
        assert!(s["labels"]["GPU_I_ID"].as_str().is_some_and(|id| id.parse::<u32>().is_ok()), "{s}");
        let busy = !holder(s).is_empty();
        assert_eq!(s["value"].as_f64().is_some_and(|v| v > 0.0), busy, "memory used only where a job runs: {s}");
    }
    let active = named(&samples, "DCGM_FI_PROF_GR_ENGINE_ACTIVE");
    assert_eq!(active.len(), 3, "{active:?}");
    for s in &active {
        let ratio = s["value"].as_f64().unwrap_or(-1.0);
        assert!(if holder(s).is_empty() { ratio == 0.0 } else { (0.6..1.0).contains(&ratio) }, "{s}");
    }
    assert!(named(&samples, "DCGM_FI_DEV_GPU_UTIL").is_empty(), "a MIG-mode GPU has no utilization of its own");
    let temp = named(&samples, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temp.len(), 1, "temperature is the GPU's: {temp:?}");
    assert!(temp[0]["labels"].get("GPU_I_ID").is_none(), "{temp:?}");
    let mut jobs: Vec<String> = named(&samples, "corral_job_gpu_utilization").iter().map(|s| holder(s)).collect();
    jobs.sort();
    assert_eq!(jobs, [big.to_string(), small.to_string()]);

    for job in [big, small] {
        assert_eq!(c.wait_final(job, Duration::from_secs(40))["state"], "COMPLETED");
    }
    // The jobs' own lines (-X: not their `ID.extern` allocations).
    let out = c.shim("sacct", &["-X", "-j", &format!("{big},{small}"), "--format=JobID,ElapsedRaw,GPUSeconds", "-P", "-n"], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows: Vec<Vec<u64>> = text.lines().map(|l| l.split('|').map(|f| f.parse().unwrap_or(u64::MAX)).collect()).collect();
    assert_eq!(rows.len(), 2, "{text}");
    for (row, sevenths) in rows.iter().zip([3, 1]) {
        let (elapsed_s, gpu_seconds) = (row[1], row[2]);
        assert!((20..=24).contains(&elapsed_s), "{text}");
        // From the run's milliseconds, so within one of the elapsed whole seconds' share.
        let share = elapsed_s * sevenths / 7;
        assert!((share..=share + 1).contains(&gpu_seconds), "{sevenths}/7 of {elapsed_s} s is {share}, sacct says {gpu_seconds}: {text}");
    }
}
