//! Many nodes through heartbeat relays, over real processes: simulated nodes (`corrald
//! --sim-nodes`: each with its own certificate and QUIC endpoint, running the agent's own
//! heartbeat loop) join a real 3-voter cluster and heartbeat the followers, which pass the beats
//! on in batches; a silenced one is declared down and its `--requeue` job runs again on another;
//! no node is declared down across a SIGKILL of the leader.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use corral_tests::{bin_dir, wait_until, TestCluster};
use serde_json::Value;

const SIMULATED: usize = 40;

struct Sim {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Sim {
    fn start(c: &TestCluster) -> Sim {
        let log = std::fs::File::create(c.path().join("sim.log")).expect("create sim.log");
        let mut child = Command::new(bin_dir().join("corrald"))
            .args(["--sim-nodes", &SIMULATED.to_string(), "--sim-config"])
            .arg(c.path().join("n2").join("node.toml"))
            .arg("--sim-ca-dir")
            .arg(c.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start corrald --sim-nodes");
        let stdin = child.stdin.take().expect("sim stdin");
        let stdout = BufReader::new(child.stdout.take().expect("sim stdout"));
        let mut sim = Sim { child, stdin, stdout };
        let ready = sim.line();
        assert!(ready.starts_with(&format!("ready {SIMULATED} ")), "simulated nodes said {ready:?}");
        sim
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read from the simulated nodes");
        line.trim().to_string()
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("write to the simulated nodes");
        self.stdin.flush().expect("flush");
        self.line()
    }

    fn stats(&mut self) -> Value {
        let line = self.ask("stats");
        serde_json::from_str(line.strip_prefix("stats ").unwrap_or_else(|| panic!("stats reply {line:?}"))).expect("stats JSON")
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (name, state) of every simulated node.
fn simulated(c: &TestCluster) -> Vec<(String, String)> {
    c.json(&["nodes"])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["name"].as_str()?.to_string(), n["state"].as_str()?.to_string())))
        .filter(|(name, _)| name.starts_with("sim"))
        .collect()
}

#[test]
fn simulated_nodes_stay_up_through_relays_and_a_silenced_one_is_declared_down() {
    let c = TestCluster::up(&[]);
    let mut sim = Sim::start(&c);
    wait_until(&format!("{SIMULATED} simulated nodes UP"), Duration::from_secs(30), || {
        let nodes = simulated(&c);
        nodes.len() == SIMULATED && nodes.iter().all(|(_, s)| s == "UP")
    });
    // A --requeue job on a simulated node; the node goes silent as if SIGKILLed.
    let out = c.shim("sbatch", &["--parsable", "--requeue", "--exclude=n1,n2,n3", "--gres=gpu:1", "--wrap", "sleep 600"], &[]);
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let job: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch --parsable prints the job id");
    let mut first = String::new();
    wait_until("the job to run on a simulated node", Duration::from_secs(20), || {
        let j = c.job(job);
        first = j["node"].as_str().unwrap_or_default().to_string();
        j["state"] == "RUNNING" && first.starts_with("sim")
    });
    let answer = sim.ask(&format!("silence {first}"));
    assert!(answer.starts_with(&format!("silenced {first} ")), "silence answered {answer:?}");
    wait_until("the silenced node DOWN and the job running elsewhere", Duration::from_secs(30), || {
        let j = c.job(job);
        let down = simulated(&c).iter().any(|(n, s)| *n == first && s == "DOWN");
        down && j["state"] == "RUNNING" && j["restart_count"] == 1 && j["node"].as_str().is_some_and(|n| n != first)
    });

    // A leader SIGKILL: every other simulated node stays UP past a full grace period, and none fenced.
    let fences_before = sim.stats()["fences"].as_u64().expect("fences");
    c.signal(&c.leader(), "KILL");
    wait_until("a new leader", Duration::from_secs(20), || {
        let out = c.corral(&["--json", "cluster"]);
        out.status.success() && serde_json::from_slice::<Value>(&out.stdout).is_ok_and(|v| v["leader"].is_string())
    });
    std::thread::sleep(Duration::from_secs(5)); // past node_down_after_ms (3 s) of the new leader's grace
    let down: Vec<String> = simulated(&c).into_iter().filter(|(n, s)| *n != first && s != "UP").map(|(n, _)| n).collect();
    assert!(down.is_empty(), "nodes not UP after the failover: {down:?}");
    // A node whose lease ran out during the election stops its jobs (safe, and counted by
    // `corral bench --nodes`); it is never declared down for it.
    let fences = sim.stats()["fences"].as_u64().expect("fences") - fences_before;
    eprintln!("simulated nodes that fenced during the failover: {fences}");
    assert_eq!(c.job(job)["restart_count"], 1, "the requeued job was not disturbed by the failover");
}
