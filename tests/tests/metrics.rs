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

#[test]
fn every_dev_node_serves_metrics_that_prometheus_parses_with_each_gpu_labelled_by_its_job() {
    let Some(py) = pyenv() else { return };
    let opts = ["--nodes", "2", "--gpus", "h100:2"];
    let c = TestCluster::up(&opts);
    let job = c.submit(&["--gres", "gpu:1"], &["sleep", "120"]);
    wait_until("the job to run", Duration::from_secs(20), || c.job(job)["state"] == "RUNNING");
    let job_node = c.job(job)["node"].as_str().unwrap_or_default().to_string();

    // `dev up` of a running cluster starts nothing and prints where each node serves metrics.
    let mut args = vec!["dev", "up", "--dir", c.path_str()];
    args.extend_from_slice(&opts);
    let out = c.raw(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(" metrics: ").map(|(n, u)| (n.to_string(), u.to_string())))
        .collect();
    assert_eq!(printed.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["n1", "n2"], "{}", String::from_utf8_lossy(&out.stdout));
    let client_toml = std::fs::read_to_string(c.path().join("client.toml")).expect("read client.toml");
    for (_, url) in &printed {
        assert!(client_toml.contains(&format!("\"{url}\"")), "client.toml lists {url}:\n{client_toml}");
    }

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
        if *name == job_node {
            let mine = named(&samples, "corral_job_gpu_utilization");
            assert_eq!(mine.iter().map(|s| s["labels"]["job"].clone()).collect::<Vec<_>>(), [Value::from(job_label.clone())], "{name}");
        }
    }
    assert_eq!(leaders, 1, "one node says it leads");
    assert!(c.corral(&["cancel", &job.to_string()]).status.success());
}
