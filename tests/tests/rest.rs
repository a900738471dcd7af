//! Issue 18, Slurm's REST API: `corral restd` on a node of a `corral dev up` cluster, driven with
//! curl and with slurm-rest 0.0.37.1 (the Python client generated from slurmrestd's OpenAPI
//! description, installed by `scripts/setup-clients.sh`), over HTTPS with a user certificate of
//! the cluster. Replies are compared with a real slurmrestd 22.05 in restd's unit tests and
//! slurm_compat's JSON tests.

use std::process::Command;
use std::time::Duration;

use corral_tests::{pyenv, wait_until, Restd, TestCluster};
use serde_json::Value;

const CLIENT_PY: &str = include_str!("../fixtures/rest/slurm_rest_client.py");

/// `curl` with `args`: the status code it printed last and the body before it.
fn curl(args: &[&str]) -> (String, String, Option<i32>) {
    let out = Command::new("curl").args(["-s", "-w", "\n%{http_code}"]).args(args).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (body.to_string(), status.to_string(), out.status.code())
}

#[test]
fn slurmrestd_clients_work_against_corral_restd_with_a_user_certificate() {
    let Some(pyenv) = pyenv() else { return };
    let c = TestCluster::up(&["--nodes", "2"]);
    let user_dir = c.path().join("nobody");
    let out = c.raw(&["cluster", "issue-client", "--dir", c.path_str(), "--user", "nobody", "--out", &user_dir.display().to_string()]);
    assert!(out.status.success(), "issue-client: {}", String::from_utf8_lossy(&out.stderr));
    let restd = Restd::start(&c);
    let ca = c.path().join("ca.crt").display().to_string();
    let (crt, key) = (user_dir.join("nobody.crt").display().to_string(), user_dir.join("nobody.key").display().to_string());
    let ping = format!("{}/slurm/v0.0.38/ping", restd.base);

    // Nothing is open: without a certificate or a token, 401; a node's certificate is no user's.
    let (body, status, _) = curl(&["--cacert", &ca, &ping]);
    assert_eq!(status, "401", "{body}");
    assert!(body.contains("Authentication failure"), "{body}");
    let n2 = c.path().join("n2");
    let (body, status, _) = curl(&[
        "--cacert",
        &ca,
        "--cert",
        &n2.join("node.crt").display().to_string(),
        "--key",
        &n2.join("node.key").display().to_string(),
        &ping,
    ]);
    assert_eq!(status, "401", "{body}");
    assert!(body.contains("n2 is not a user's certificate"), "{body}");

    let user = ["--cacert", ca.as_str(), "--cert", crt.as_str(), "--key", key.as_str()];
    let (body, status, _) = curl(&[&user[..], &[ping.as_str()]].concat());
    assert_eq!(status, "200", "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["meta"]["plugin"]["type"], "openapi/v0.0.38", "{v}");
    assert_eq!(v["pings"].as_array().map(Vec::len), Some(2), "{v}");
    let (body, status, _) = curl(&[&user[..], &[&format!("{}/slurm/v0.0.38/nosuch", restd.base)]].concat());
    assert_eq!((status.as_str(), body.as_str()), ("404", "Unable find requested URL. Please view /openapi/v3 for API reference."));

    // A token from `scontrol token`, as slurmrestd takes it (no certificate needed): a user
    // gets their own, only an admin another's.
    let as_nobody = |args: &[&str]| {
        let out = Command::new(c.path().join("shims").join("scontrol"))
            .args(args)
            .env("CORRAL_CLUSTER", &user_dir)
            .output()
            .expect("run scontrol");
        (String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).trim().to_string())
    };
    c.shim("scontrol", &["--version"], &[]); // installs the shims
    let (_, err) = as_nobody(&["token", "username=root"]);
    assert!(err.contains("may not issue tokens for other users"), "{err}");
    let (jwt, err) = as_nobody(&["token", "lifespan=120"]);
    let token = jwt.strip_prefix("SLURM_JWT=").unwrap_or_else(|| panic!("{jwt} {err}")).to_string();
    let with_token = |name: &str, token: &str| {
        let (name, token) = (format!("X-SLURM-USER-NAME: {name}"), format!("X-SLURM-USER-TOKEN: {token}"));
        curl(&["--cacert", &ca, "-H", &name, "-H", &token, &ping])
    };
    let (body, status, _) = with_token("nobody", &token);
    assert_eq!(status, "200", "{body}");
    let (body, status, _) = with_token("root", &token);
    assert_eq!(status, "401", "{body}");
    assert!(body.contains("the token is nobody's, not root's"), "{body}");
    let (body, status, _) = with_token("nobody", &format!("{token}x"));
    assert_eq!(status, "401", "{body}");

    // The published client: ping, submit, follow, list, nodes, cancel, a missing job.
    let script = c.work.join("slurm_rest_client.py");
    std::fs::write(&script, CLIENT_PY).expect("write the client");
    let out = Command::new(pyenv.join("bin/python"))
        .args([&script.display().to_string(), &restd.base, &ca, &crt, &key, &c.work.display().to_string()])
        .output()
        .expect("run the slurm-rest client");
    assert!(out.status.success(), "client: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    let got: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(got["ping"], serde_json::json!(["n1:primary", "n2:backup"]), "{got}");
    assert_eq!((&got["submitted"]["step_id"], &got["final_state"]), (&"BATCH".into(), &"COMPLETED".into()), "{got}");
    let id = got["submitted"]["job_id"].as_u64().unwrap_or_else(|| panic!("{got}"));
    let written = std::fs::read_to_string(c.work.join(format!("python-{id}.out"))).unwrap_or_default();
    assert_eq!(written, "hello from from-python\n", "the job's output");
    assert!(got["listed"].as_array().is_some_and(|l| l.iter().any(|n| n == "from-python")), "{got}");
    assert_eq!(got["nodes"], serde_json::json!(["n1:idle", "n2:idle"]), "{got}");
    assert_eq!(got["held_after_cancel"], "CANCELLED", "{got}");
    assert_eq!(got["missing"], serde_json::json!({"status": 500, "errors": ["Invalid job id specified"]}), "{got}");
    // The jobs are the certificate's user's.
    let job = c.job(id);
    assert_eq!(job["user"], "nobody", "{job}");
    // Another user's job is not theirs to cancel.
    let theirs = c.submit(&[], &["sleep", "60"]);
    wait_until("root's job to run", Duration::from_secs(30), || c.job(theirs)["state"] == "RUNNING");
    let url = format!("{}/slurm/v0.0.38/job/{theirs}", restd.base);
    let (body, status, _) = curl(&[&user[..], &["-X", "DELETE", url.as_str()]].concat());
    assert_eq!(status, "500", "{body}");
    assert!(body.contains("Access/permission denied"), "{body}");
    assert_eq!(c.job(theirs)["state"], "RUNNING", "{}", c.job(theirs));
}

/// An admin's reservation and partition as slurmrestd's `/reservations` and `/partitions` list
/// them, over curl with a user certificate (no Python client needed).
#[test]
fn reservations_and_partitions_as_slurmrestd_lists_them() {
    let c = TestCluster::up(&["--nodes", "2"]);
    let user_dir = c.path().join("nobody");
    let out = c.raw(&["cluster", "issue-client", "--dir", c.path_str(), "--user", "nobody", "--out", &user_dir.display().to_string()]);
    assert!(out.status.success(), "issue-client: {}", String::from_utf8_lossy(&out.stderr));
    let restd = Restd::start(&c);
    let ca = c.path().join("ca.crt").display().to_string();
    let (crt, key) = (user_dir.join("nobody.crt").display().to_string(), user_dir.join("nobody.key").display().to_string());
    let user = ["--cacert", ca.as_str(), "--cert", crt.as_str(), "--key", key.as_str()];

    // An admin's maintenance window, as slurmrestd's `/reservations` lists it.
    let made = c.shim(
        "scontrol",
        &["create", "reservation", "ReservationName=maint", "StartTime=now+1hour", "Duration=60", "Nodes=n2", "Users=root", "Flags=MAINT"],
        &[],
    );
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let (body, status, _) = curl(&[&user[..], &[&format!("{}/slurm/v0.0.38/reservations", restd.base)]].concat());
    assert_eq!(status, "200", "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let r = &v["reservations"][0];
    assert_eq!(
        (&r["name"], &r["node_list"], &r["users"], &r["flags"]),
        (&"maint".into(), &"n2".into(), &"root".into(), &serde_json::json!(["MAINT", "SPEC_NODES"])),
        "{v}"
    );
    assert_eq!(r["end_time"].as_u64().zip(r["start_time"].as_u64()).map(|(e, s)| e - s), Some(3600), "{v}");
    let (body, status, _) = curl(&[&user[..], &[&format!("{}/slurm/v0.0.38/reservation/nope", restd.base)]].concat());
    assert_eq!(status, "500", "{body}");
    assert!(body.contains("\"Requested reservation is invalid\"") && body.contains("2053"), "{body}");

    // A partition an admin made, as slurmrestd's `/partition/NAME` shows it; an unknown one.
    let made = c.shim("scontrol", &["create", "PartitionName=long", "Nodes=n1", "MaxTime=8:00:00", "DefaultTime=1:00:00"], &[]);
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let (body, status, _) = curl(&[&user[..], &[&format!("{}/slurm/v0.0.38/partition/long", restd.base)]].concat());
    assert_eq!(status, "200", "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let p = &v["partitions"][0];
    assert_eq!(
        (&p["name"], &p["nodes"], &p["max_time_limit"], &p["default_time_limit"], &p["state"], &p["allowed_accounts"]),
        (&"long".into(), &"n1".into(), &480.into(), &60.into(), &"UP".into(), &"".into()),
        "{v}"
    );
    let (body, status, _) = curl(&[&user[..], &[&format!("{}/slurm/v0.0.38/partitions", restd.base)]].concat());
    assert_eq!(status, "200", "{body}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let names: Vec<&str> = v["partitions"].as_array().map(|l| l.iter().filter_map(|p| p["name"].as_str()).collect()).unwrap_or_default();
    assert!(names.contains(&"long") && names.len() >= 2, "{v}");
    let (body, status, _) = curl(&[&user[..], &[&format!("{}/slurm/v0.0.38/partition/nope", restd.base)]].concat());
    assert_eq!(status, "500", "{body}");
    assert!(body.contains("\"Invalid partition name specified\"") && body.contains("2000"), "{body}");
}
