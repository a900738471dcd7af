//! Issue 44, the dashboard's queries on a real Prometheus: Debian's `prometheus` scrapes every
//! node of a dev cluster each second (with `honor_labels`, as deploy/README.md configures it),
//! and every `expr` of every panel of `deploy/grafana/corral-dashboard.json` (read when the test
//! runs, so a new panel is covered) must return series. Then what the cluster did must show:
//! the running job's GPU series carry its id and owner (ours and slurm-job-exporter's), one
//! instance leads, the term is past 0, the requeue is counted and the drained node is drained.
//! Skipped where `/usr/bin/prometheus` is missing (`scripts/setup-clients.sh` installs it).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_tests::{wait_until, TestCluster};
use serde_json::Value;

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A Prometheus server scraping the given targets every second, stopped when dropped.
struct Prometheus {
    child: Child,
    base: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[String]) -> Prometheus {
        let dir = tempfile::Builder::new().prefix("corral-prometheus-").tempdir().expect("create a temp dir");
        let port = corral_cli::dev::free_listen_port().expect("find a free port");
        let quoted: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: corral\n    honor_labels: true\n    \
             static_configs:\n      - targets: [{}]\n",
            quoted.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("create prometheus.log");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("share the log file"))
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let mut p = Prometheus { child, base: format!("http://127.0.0.1:{port}"), dir };
        wait_until("prometheus to be ready", Duration::from_secs(30), || {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", p.log());
            }
            curl(&[&format!("{}/-/ready", p.base)]).0 == "200"
        });
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/PATH` with `args` URL-encoded; the `data` of a successful answer.
    fn api(&self, path: &str, args: &[(&str, &str)]) -> Value {
        let url = format!("{}/api/v1/{path}", self.base);
        let mut argv = vec!["-G".to_string(), url];
        for (k, v) in args {
            argv.push("--data-urlencode".into());
            argv.push(format!("{k}={v}"));
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let (status, body) = curl(&argv);
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path} {args:?}: {status} {e}: {body}"));
        assert_eq!((status.as_str(), &v["status"]), ("200", &Value::from("success")), "{path} {args:?}: {body}");
        v["data"].clone()
    }

    /// The series an instant query returns.
    fn query(&self, expr: &str) -> Vec<Value> {
        self.api("query", &[("query", expr)])["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `curl -s URL...`: the HTTP status and the body.
fn curl(args: &[&str]) -> (String, String) {
    let out = Command::new("curl").args(["-s", "-w", "\n%{http_code}"]).args(args).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (status.to_string(), body.to_string())
}

/// Every `expr` of every panel of the dashboard in `deploy/grafana/`.
fn dashboard_exprs() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/corral-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let json: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let panels = json["panels"].as_array().expect("the dashboard has panels");
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect()
}

fn label<'a>(series: &'a Value, name: &str) -> &'a str {
    series["metric"][name].as_str().unwrap_or_default()
}

fn value(series: &Value) -> f64 {
    series["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// The node a running job runs on (waiting for it to run).
fn running_on(c: &TestCluster, job: u64) -> String {
    let mut node = String::new();
    wait_until(&format!("job {job} to run"), Duration::from_secs(20), || {
        let j = c.job(job);
        node = j["node"].as_str().unwrap_or_default().to_string();
        j["state"] == "RUNNING"
    });
    node
}

/// What must hold once Prometheus has scraped the cluster after the jobs, the requeue and the
/// drain; `Err` says what does not yet.
fn check(p: &Prometheus, exprs: &[String], want: &Want) -> Result<(), String> {
    let results: BTreeMap<&str, Vec<Value>> = exprs.iter().map(|e| (e.as_str(), p.query(e))).collect();
    let empty: Vec<&&str> = results.iter().filter(|(_, r)| r.is_empty()).map(|(e, _)| e).collect();
    if !empty.is_empty() {
        return Err(format!("no series for {empty:?}"));
    }
    let job = want.job.to_string();
    let slurm = p.query(&format!("slurm_job_utilization_gpu{{slurmjobid=\"{job}\"}}"));
    let owned = |s: &Value| label(s, "user") == want.user && label(s, "account") == "physics" && label(s, "gpu_type").contains("H100");
    if slurm.len() != 1 || !slurm.iter().all(owned) || !(60.0..100.0).contains(&value(&slurm[0])) {
        return Err(format!("slurm_job_utilization_gpu of job {job} by {} in physics: {slurm:?}", want.user));
    }
    for name in ["slurm_job_gpu_utilization", "slurm_job_memory_usage_gpu", "slurm_job_power_gpu", "slurm_job_utilization_gpu_memory"] {
        if p.query(&format!("{name}{{slurmjobid=\"{job}\",user=\"{}\"}}", want.user)).len() != 1 {
            return Err(format!("{name} of job {job}"));
        }
    }
    // Its memory, where its node runs jobs in cgroups with the memory controller.
    let memory = p.query(&format!("slurm_job_memory_usage{{slurmjobid=\"{job}\",account=\"physics\"}}"));
    if want.confined && (memory.len() != 1 || value(&memory[0]) <= 0.0) {
        return Err(format!("slurm_job_memory_usage of job {job}: {memory:?}"));
    }
    for name in ["corral_job_gpu_utilization", "DCGM_FI_DEV_GPU_UTIL"] {
        let ours = p.query(&format!("{name}{{job=\"{job}\"}}"));
        if ours.len() != 1 || label(&ours[0], "node") != want.job_node && label(&ours[0], "Hostname") != want.job_node {
            return Err(format!("{name} labelled job {job} on {}: {ours:?}", want.job_node));
        }
    }
    let leaders = &results["max by (instance) (corral_raft_is_leader) == 1"];
    if leaders.len() != 1 || !want.targets.iter().any(|t| t == label(&leaders[0], "instance")) {
        return Err(format!("one leader among {:?}: {leaders:?}", want.targets));
    }
    let term = value(&results["max(corral_raft_term)"][0]);
    let requeues = value(&results["max(corral_job_requeues_total)"][0]);
    let lately = value(&results["max(increase(corral_job_requeues_total[5m]))"][0]);
    if !(term > 0.0 && requeues >= 1.0 && lately > 0.0) {
        return Err(format!("term {term}, requeues {requeues}, of which {lately} in 5 min"));
    }
    let states = &results["max by (node, state) (corral_node_state) == 1"];
    let drained = states.iter().any(|s| label(s, "node") == want.drained.0 && label(s, "state") == want.drained.1);
    if !drained || states.len() != want.targets.len() {
        return Err(format!("{} {} and one state per node: {states:?}", want.drained.0, want.drained.1));
    }
    Ok(())
}

/// What [`check`] looks for.
struct Want {
    job: u64,
    job_node: String,
    user: String,
    /// Its node confines jobs in cgroups with a memory controller.
    confined: bool,
    targets: Vec<String>,
    /// The drained node and the state it must be in.
    drained: (String, &'static str),
}

#[test]
fn every_dashboard_query_returns_series_from_a_real_prometheus() {
    if !Path::new(PROMETHEUS).exists() {
        eprintln!("SKIPPED: {PROMETHEUS} is missing (scripts/setup-clients.sh installs Debian's prometheus)");
        return;
    }
    let started = Instant::now();
    // Two H100 nodes, and a third with a MIG-mode H200 for the dashboard's MIG series.
    let c = TestCluster::up(&["--nodes", "2", "--gpus", "h100:2"]);
    let out = c.raw(&["dev", "up", "--dir", c.path_str(), "--nodes", "3", "--gpus", "h200-mig"]);
    assert!(out.status.success(), "add n3: {}", String::from_utf8_lossy(&out.stderr));
    let urls = corral_cli::dev::metrics_urls(c.path()).expect("read the nodes' metrics addresses");
    let targets: Vec<String> =
        urls.iter().filter_map(|(_, u)| u.strip_prefix("http://")?.strip_suffix("/metrics").map(str::to_string)).collect();
    assert_eq!(targets.len(), 3, "{urls:?}");
    let p = Prometheus::start(&targets);
    wait_until("every target up", Duration::from_secs(20), || {
        let active = p.api("targets", &[])["activeTargets"].as_array().cloned().unwrap_or_default();
        active.len() == 3 && active.iter().all(|t| t["health"] == "up")
    });

    // A job with an account, on one GPU; a second job on another GPU, requeued once Prometheus
    // has seen the counter before it, so its increase shows.
    let out = c.shim("sbatch", &["--parsable", "-A", "physics", "--gres=gpu:h100:1", "--wrap", "sleep 300"], &[]);
    assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
    let job: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("sbatch --parsable prints the job id");
    let requeued = c.submit(&["--gres", "gpu:h100:1"], &["sleep", "300"]);
    let job_node = running_on(&c, job);
    running_on(&c, requeued);
    wait_until("prometheus to scrape the requeue counter", Duration::from_secs(20), || !p.query("corral_job_requeues_total").is_empty());
    let out = c.corral(&["requeue", &requeued.to_string()]);
    assert!(out.status.success(), "requeue: {}", String::from_utf8_lossy(&out.stderr));
    wait_until("the requeued job to run again", Duration::from_secs(30), || {
        let j = c.job(requeued);
        j["state"] == "RUNNING" && j["restart_count"] == 1
    });
    // Drain the node the first job does not run on: drained, or draining where the requeued
    // job runs.
    let other = if job_node == "n1" { "n2" } else { "n1" };
    let out = c.corral(&["drain", other, "--reason", "prometheus test"]);
    assert!(out.status.success(), "drain: {}", String::from_utf8_lossy(&out.stderr));
    let busy = c.job(requeued)["node"] == other;
    let confined = corral_tests::node_log(&c, &job_node).lines().any(|l| l.contains("jobs run in cgroups with") && l.contains("memory"));
    let want = Want {
        job,
        job_node,
        user: c.job(job)["user"].as_str().unwrap_or_default().to_string(),
        confined,
        targets,
        drained: (other.to_string(), if busy { "draining" } else { "drained" }),
    };

    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 20, "{exprs:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut verdict = check(&p, &exprs, &want);
    while verdict.is_err() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        verdict = check(&p, &exprs, &want);
    }
    if let Err(why) = verdict {
        panic!("after 30 s of scrapes: {why}\nprometheus log:\n{}", p.log());
    }
    eprintln!("{} dashboard queries answered with series; {:.1} s in all", exprs.len(), started.elapsed().as_secs_f64());
    for id in [job, requeued] {
        assert!(c.corral(&["cancel", &id.to_string()]).status.success());
    }
}
