//! `corral cluster init` makes a configuration `corrald` starts with (it tells systemd READY=1
//! once up), `corral cluster join` pins the token's CA and adds a second node, and SIGTERM
//! makes `corrald` say STOPPING=1 and exit cleanly.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use corral_tests::{bin_dir, corral_bin};
use serde_json::Value;

fn corral(args: &[&str]) -> Output {
    Command::new(corral_bin()).args(args).env_remove("CORRAL_CLUSTER").output().expect("run corral")
}

fn text(out: &Output) -> String {
    format!("status {:?}\nstdout:\n{}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn json_ok(args: &[&str]) -> Value {
    let out = corral(args);
    assert!(out.status.success(), "corral {args:?} failed: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("corral {args:?} printed no JSON ({e}): {}", text(&out)))
}

fn free_port() -> u16 {
    corral_cli::dev::free_listen_port().expect("free port")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display())).permissions().mode() & 0o777
}

/// A `corrald` with its own notify socket, standing in for systemd. Killed when dropped.
struct Daemon {
    child: Child,
    notify: UnixDatagram,
    log: PathBuf,
}

impl Daemon {
    fn start(config: &Path, dir: &Path) -> Daemon {
        let socket = dir.join("notify.sock");
        let _ = std::fs::remove_file(&socket);
        let notify = UnixDatagram::bind(&socket).expect("bind notify socket");
        notify.set_read_timeout(Some(Duration::from_millis(200))).expect("set read timeout");
        let log = dir.join("corrald.log");
        let out = std::fs::File::create(&log).expect("create log");
        let child = Command::new(bin_dir().join("corrald"))
            .arg("--config")
            .arg(config)
            .env("NOTIFY_SOCKET", &socket)
            .env("RUST_LOG", "info,openraft=warn,quinn=warn")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup log"))
            .stderr(out)
            .spawn()
            .expect("start corrald");
        Daemon { child, notify, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for a notification containing `what`; returns the whole message.
    fn expect_notify(&mut self, what: &str, patience: Duration) -> String {
        let deadline = Instant::now() + patience;
        let mut buf = [0u8; 4096];
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            match self.notify.recv(&mut buf) {
                Ok(n) => {
                    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                    if msg.lines().any(|l| l == what) {
                        return msg;
                    }
                    seen.push(msg);
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("read notify socket: {e}"),
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("corrald exited ({status}) before sending {what}; got {seen:?}\n{}", self.log());
            }
        }
        panic!("no {what} from corrald within {patience:?}; got {seen:?}\n{}", self.log());
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) }, 0, "send SIGTERM");
        self.expect_notify("STOPPING=1", Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("wait for corrald") {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("corrald did not exit within 15 s of SIGTERM\n{}", self.log());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `corral ARGS` until `done` accepts its JSON.
fn wait_for(args: &[&str], patience: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + patience;
    let mut last = String::new();
    while Instant::now() < deadline {
        let out = corral(args);
        if out.status.success() {
            if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) {
                if done(&v) {
                    return v;
                }
                last = v.to_string();
            }
        } else {
            last = String::from_utf8_lossy(&out.stderr).into_owned();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("corral {args:?} did not get there within {patience:?}; last: {last}");
}

/// Replaces one field of a `corral-join:v1:FP:SECRET:EXPIRY` token.
fn with_field(token: &str, index: usize, value: &str) -> String {
    let mut parts: Vec<String> = token.split(':').map(str::to_string).collect();
    parts[index] = value.to_string();
    parts.join(":")
}

#[test]
fn init_bootstraps_a_node_and_join_adds_another() {
    let tmp = tempfile::Builder::new().prefix("corral-deploy-").tempdir().expect("tempdir");
    let root = tmp.path();
    let (d1, d2) = (root.join("n1"), root.join("n2"));
    let (a1, a2) = (format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port()));
    let s = |p: &Path| p.to_str().expect("utf-8 path").to_string();

    // --- init on the first node
    let init = json_ok(&[
        "--json",
        "cluster",
        "init",
        "--dir",
        &s(&d1),
        "--name",
        "n1",
        "--listen",
        &a1,
        "--data-dir",
        &s(&d1.join("data")),
        "--gpus",
        "h100:2",
        "--owner",
        "",
        "--token-ttl",
        "1h",
        "--runtime-dir",
        &s(&root.join("run-n1").join("jobs")),
    ]);
    let token = init["token"].as_str().expect("init prints a token").to_string();
    let fingerprint = init["ca_fingerprint"].as_str().expect("init prints the CA fingerprint").to_string();
    assert!(token.starts_with(&format!("corral-join:v1:{fingerprint}:")), "{token}");
    for (file, want) in [("ca.key", 0o600), ("node.key", 0o600), ("node.toml", 0o600), ("client.key", 0o600), ("ca.crt", 0o644)] {
        assert_eq!(mode(&d1.join(file)), want, "{file}");
    }
    let node_toml = std::fs::read_to_string(d1.join("node.toml")).expect("read node.toml");
    assert!(node_toml.contains("bootstrap = true") && node_toml.contains("name = \"n1\""), "{node_toml}");
    assert!(node_toml.contains(&format!("runtime_dir = \"{}\"", s(&root.join("run-n1").join("jobs")))), "{node_toml}");
    let inspected = json_ok(&["--json", "cluster", "token", "inspect", &token]);
    assert_eq!(inspected["ca_fingerprint"].as_str(), Some(fingerprint.as_str()));
    assert_eq!(inspected["expired"].as_bool(), Some(false));
    // A second init over the first is refused.
    let again = corral(&["cluster", "init", "--dir", &s(&d1), "--name", "n1", "--listen", &a1, "--owner", ""]);
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("--force"), "{}", text(&again));

    // --- corrald starts with that configuration and tells "systemd" it is ready
    let mut n1 = Daemon::start(&d1.join("node.toml"), &d1);
    let ready = n1.expect_notify("READY=1", Duration::from_secs(60));
    assert!(ready.contains("STATUS=node n1"), "{ready}");
    let info = wait_for(&["--cluster", &s(&d1), "--server", &a1, "--json", "cluster"], Duration::from_secs(30), |v| {
        v["leader"].as_str() == Some("n1")
    });
    assert_eq!(info["answered_by"].as_str(), Some("n1"));

    // --- a bundle for n2, then join checks
    let bundle = root.join("n2.bundle");
    let out = corral(&["cluster", "issue-node", "--dir", &s(&d1), "--name", "n2", "--host", "127.0.0.1", "--out", &s(&bundle)]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(mode(&bundle), 0o600);
    let join = |token: &str, bundle: &Path, dir: &Path| {
        corral(&[
            "--server",
            &a1,
            "--json",
            "cluster",
            "join",
            "--dir",
            &s(dir),
            "--token",
            token,
            "--bundle",
            &s(bundle),
            "--name",
            "n2",
            "--listen",
            &a2,
            "--data-dir",
            &s(&dir.join("data")),
            "--gpus",
            "h100:2",
            "--owner",
            "",
        ])
    };
    let refused = |out: Output, why: &str| {
        assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains(why), "expected '{why}': {}", text(&out));
    };
    let scratch = root.join("scratch");
    refused(join(&with_field(&token, 4, "1"), &bundle, &scratch), "expired");
    refused(join(&with_field(&token, 2, &"0".repeat(64)), &bundle, &scratch), "not the one in the join token");
    // A consistent token and bundle of another cluster: the CA is pinned, so n1 (of this
    // cluster's CA) is not trusted.
    let other = root.join("other");
    let other_init = json_ok(&["--json", "cluster", "init", "--dir", &s(&other), "--name", "x1", "--listen", "127.0.0.1:1", "--owner", ""]);
    let other_bundle = root.join("other.bundle");
    let out = corral(&["cluster", "issue-node", "--dir", &s(&other), "--name", "n2", "--out", &s(&other_bundle)]);
    assert!(out.status.success(), "{}", text(&out));
    refused(join(other_init["token"].as_str().expect("token"), &other_bundle, &scratch), "with the pinned CA");
    assert!(!scratch.join("node.toml").exists(), "a refused join wrote a configuration");
    // Without a bundle the machine enrols, which takes a token from the log (`token create`),
    // not the offline one `init` printed: refused before anything is written.
    let out = corral(&["--server", &a1, "cluster", "join", "--dir", &s(&scratch), "--token", &token, "--name", "n2", "--listen", &a2]);
    refused(out, "unknown, expired or revoked");
    assert!(!scratch.join("node.toml").exists(), "a refused enrolment wrote a configuration");

    // --- join for real and start n2
    let out = join(&token, &bundle, &d2);
    assert!(out.status.success(), "join failed: {}", text(&out));
    let joined: Value = serde_json::from_slice(&out.stdout).expect("join prints JSON");
    assert_eq!(joined["answered_by"].as_str(), Some("n1"));
    assert_eq!(joined["leader"].as_str(), Some("n1"));
    let node_toml = std::fs::read_to_string(d2.join("node.toml")).expect("read n2 node.toml");
    assert!(node_toml.contains("bootstrap = false") && node_toml.contains(&format!("join = [\"{a1}\"]")), "{node_toml}");
    let mut n2 = Daemon::start(&d2.join("node.toml"), &d2);
    n2.expect_notify("READY=1", Duration::from_secs(60));
    wait_for(&["--cluster", &s(&d1), "--json", "nodes"], Duration::from_secs(30), |v| {
        let up = |name: &str| v.as_array().is_some_and(|a| a.iter().any(|n| n["name"] == name && n["state"] == "UP"));
        up("n1") && up("n2")
    });
    // Each run's files and the watchdog's lease are under runtime_dir, the ledger under data_dir.
    assert!(root.join("run-n1/jobs/watchdog.lease").exists() && root.join("run-n1/jobs/runs").is_dir());
    assert!(d1.join("data/jobs/launched.jsonl").exists() && !d1.join("data/jobs/watchdog.lease").exists());

    // --- a user's cluster directory works against the same cluster
    let alice = root.join("alice");
    let out = corral(&["cluster", "issue-client", "--dir", &s(&d1), "--user", "alice", "--out", &s(&alice)]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(mode(&alice.join("alice.key")), 0o600);
    let nodes = json_ok(&["--cluster", &s(&alice), "--json", "nodes"]);
    assert_eq!(nodes.as_array().map(Vec::len), Some(2), "{nodes}");

    // --- SIGTERM: STOPPING=1 and a clean exit, as `systemctl stop` expects
    for node in [&mut n2, &mut n1] {
        let status = node.terminate();
        assert!(status.success(), "corrald exited with {status} on SIGTERM\n{}", node.log());
    }
}
