//! Issue 44, the web UI: `corral restd`'s `/ui/` on a node of a `corral dev up` cluster with
//! simulated GPUs, driven in Debian's real chromium (headless, through chromedriver and
//! Selenium from the venv of `scripts/setup-clients.sh`) by `tests/fixtures/web/ui_browser.py`:
//! a user logs in with a token, sees their running job on its node's GPU, its page with a
//! utilization chart, a pending job's reason and expected start, cancels their job and sees it
//! leave the queue, and can neither see nor cancel another user's job. The browser's
//! screenshots are written under the target directory for a reviewer (the path is printed).

use std::process::Command;
use std::time::Duration;

use corral_tests::{pyenv, wait_until, Restd, TestCluster};
use serde_json::Value;

const BROWSER_PY: &str = include_str!("../fixtures/web/ui_browser.py");

#[test]
fn a_user_follows_and_cancels_their_job_in_a_real_browser_and_cannot_touch_anothers() {
    let Some(pyenv) = pyenv() else { return };
    for program in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(std::path::Path::new(program).exists(), "{program} is missing: scripts/setup-clients.sh installs it");
    }
    let c = TestCluster::up(&["--nodes", "2", "--gpus", "h100:2"]);
    let alice_dir = c.path().join("alice");
    let out = c.raw(&["cluster", "issue-client", "--dir", c.path_str(), "--user", "alice", "--out", &alice_dir.display().to_string()]);
    assert!(out.status.success(), "issue-client: {}", String::from_utf8_lossy(&out.stderr));
    let as_alice = [("CORRAL_CLUSTER", alice_dir.to_str().expect("utf-8 path"))];
    let submit = |env: &[(&str, &str)], opts: &[&str]| -> u64 {
        let mut args = vec!["--parsable"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&["--wrap", "sleep 300"]);
        let out = c.shim("sbatch", &args, env);
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().parse().unwrap_or_else(|_| panic!("sbatch {opts:?}: {text} {}", String::from_utf8_lossy(&out.stderr)))
    };
    // alice's job and root's each hold a GPU with a time limit; root's gang needs both nodes
    // whole, so it waits with a reservation: an expected start.
    let mine = submit(&as_alice, &["--gres", "gpu:1", "--time", "10"]);
    let other = submit(&[], &["--gres", "gpu:1", "--time", "20", "-w", "n2"]);
    wait_until("both jobs to run", Duration::from_secs(30), || c.job(mine)["state"] == "RUNNING" && c.job(other)["state"] == "RUNNING");
    let pending = submit(&[], &["--gres", "gpu:2", "-N", "2", "--time", "5"]);
    let out = c.shim("scontrol", &["token", "username=alice", "lifespan=900"], &[]);
    let jwt = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let token = jwt
        .strip_prefix("SLURM_JWT=")
        .unwrap_or_else(|| panic!("scontrol token: {jwt} {}", String::from_utf8_lossy(&out.stderr)))
        .to_string();
    let restd = Restd::start(&c);

    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-ui");
    std::fs::create_dir_all(&shots).expect("create the screenshot directory");
    let script = c.work.join("ui_browser.py");
    std::fs::write(&script, BROWSER_PY).expect("write the browser script");
    let args = [&restd.base, "alice", &token, &mine.to_string(), &other.to_string(), &pending.to_string(), &shots.display().to_string()];
    let out = Command::new(pyenv.join("bin/python")).arg(&script).args(args).output().expect("run the browser script");
    let printed = String::from_utf8_lossy(&out.stdout);
    let seen: Value =
        serde_json::from_str(printed.trim()).unwrap_or_else(|e| panic!("{e}: {printed}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "the browser script failed after {seen}:\n{}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    eprintln!("web UI screenshots: {}", shots.display());

    assert_eq!(seen["login_form"], true, "{seen}");
    assert_eq!(seen["who"], "alice", "{seen}");
    let pending_text = seen["pending_text"].as_str().unwrap_or_default();
    assert!(pending_text.contains("Resources") && pending_text.contains("needs 2 nodes"), "the pending job's reason in words: {seen}");
    assert!(seen["pending_expected"].as_str().is_some_and(|t| t.starts_with("in ") || t.starts_with("now")), "{seen}");
    assert_eq!((&seen["my_row_has_cancel"], &seen["other_row_has_cancel"]), (&true.into(), &false.into()), "{seen}");
    let node = c.job(mine)["nodes"][0].as_str().map(str::to_string).unwrap_or_default();
    assert_eq!(seen["gpu_cell"]["node"], node.as_str(), "alice's job on its node's GPU: {seen}");
    assert!(seen["gpu_cell"]["title"].as_str().is_some_and(|t| t.contains(&format!("job {mine} (alice)"))), "{seen}");
    let util: u32 = seen["gpu_util"].as_str().and_then(|u| u.parse().ok()).unwrap_or(u32::MAX);
    assert!(util <= 100, "the map coloured by the GPU's sampled utilization: {seen}");
    assert!(seen["chart_points"].as_u64().is_some_and(|n| n >= 3), "{seen}");
    assert_eq!(seen["job_state"], "RUNNING", "{seen}");
    assert!(seen["other_job_error"].as_str().is_some_and(|e| e.contains("only its owner or an admin")), "{seen}");
    assert_eq!(seen["other_cancel_status"][0], 403, "{seen}");
    assert_eq!(seen["cancelled_left_queue"], true, "{seen}");
    assert!(seen["shares_rows"].as_u64().is_some_and(|n| n >= 2), "{seen}");
    assert_eq!(seen["leader"], c.leader().as_str(), "{seen}");
    assert!(seen["term"].as_str().and_then(|t| t.parse::<u64>().ok()).is_some_and(|t| t >= 1), "{seen}");
    let events: Vec<&str> = seen["events"].as_array().map(|e| e.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    for node in ["n1", "n2"] {
        assert!(events.iter().any(|e| e.contains(&format!("{node} joined"))), "{node}'s join among the node events: {seen}");
    }
    assert_eq!(seen["console_errors"], serde_json::json!([]), "{seen}");
    // What the browser did, as the cluster saw it.
    assert_eq!(c.job(mine)["state"], "CANCELLED", "{}", c.job(mine));
    assert_eq!(c.job(other)["state"], "RUNNING", "{}", c.job(other));
    for name in
        ["1-login", "2-queue", "3-nodes", "3-nodes-utilization", "4-job", "5-other-job", "6-queue-after-cancel", "7-shares", "8-cluster"]
    {
        let png = std::fs::read(shots.join(format!("{name}.png"))).unwrap_or_default();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "screenshot {name}: {} bytes", png.len());
    }
}
