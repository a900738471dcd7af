//! The transport refuses strangers and bad frames while it keeps serving everyone else.

use std::time::Duration;

use corral_tests::TestCluster;
use proto::{ApiError, ClientRequest, Envelope, PeerRequest, Reply};
use transport::pki;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
}

#[test]
fn garbage_frames_and_foreign_certificates_are_refused_while_the_node_keeps_serving() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1"]);
    let addr = c.addr("n1");
    let dir = c.path();
    let ours = pki::TlsIdentity::from_pems(
        &std::fs::read_to_string(dir.join("ca.crt")).expect("ca"),
        &std::fs::read_to_string(dir.join("client.crt")).expect("cert"),
        &std::fs::read_to_string(dir.join("client.key")).expect("key"),
    )
    .expect("our identity");
    let other_ca = pki::generate_ca("stranger").expect("ca");
    let stranger = pki::issue_client_cert(&other_ca, "mallory").expect("cert");
    // The stranger trusts our CA (so it can verify the server) but holds a foreign certificate.
    let theirs =
        pki::TlsIdentity::from_pems(&std::fs::read_to_string(dir.join("ca.crt")).expect("ca"), &stranger.cert_pem, &stranger.key_pem)
            .expect("identity");
    runtime().block_on(async {
        let ask = Envelope { hops: 0, request: ClientRequest::ClusterInfo.into(), user: None };
        let foreign = transport::Client::new(transport::endpoint("127.0.0.1:0".parse().expect("addr"), &theirs, false).expect("endpoint"));
        let refused = foreign.call(&addr, &ask, Duration::from_secs(3)).await;
        assert!(refused.is_err(), "a foreign certificate was accepted: {refused:?}");

        let endpoint = transport::endpoint("127.0.0.1:0".parse().expect("addr"), &ours, false).expect("endpoint");
        let target = addr.parse().expect("socket addr");
        let conn = endpoint.connect(target, transport::pki::SERVER_NAME).expect("connect").await.expect("handshake");
        for junk in [vec![proto::PROTOCOL_VERSION, 0xff, 0xff, 0xff, 0xff, 0x0f], vec![99, 1, 2, 3], vec![]] {
            let (mut send, mut recv) = conn.open_bi().await.expect("stream");
            transport::write_frame(&mut send, &junk).await.expect("write junk");
            let _ = send.finish();
            let reply = transport::read_frame(&mut recv, 1 << 20).await.expect("an error reply");
            let response: proto::Response = proto::decode(&reply, 1 << 20).expect("decodable reply");
            assert!(matches!(response, Err(ApiError::Invalid(_) | ApiError::Version { .. })), "{response:?}");
        }
        // An oversized length prefix is refused without reading the body.
        let (mut send, mut recv) = conn.open_bi().await.expect("stream");
        send.write_all(&(u32::MAX).to_be_bytes()).await.expect("write prefix");
        let reply = transport::read_frame(&mut recv, 1 << 20).await;
        assert!(reply.map(|r| proto::decode::<proto::Response>(&r, 1 << 20).map(|r| r.is_err()).unwrap_or(true)).unwrap_or(true));

        // A user's certificate reaches the client API but not the node-to-node protocol.
        let user = transport::Client::new(endpoint.clone());
        let heartbeat = Envelope { hops: 0, request: PeerRequest::Heartbeat { node: 1, instance: 7, running: vec![] }.into(), user: None };
        match user.call(&addr, &heartbeat, Duration::from_secs(3)).await {
            Ok(Err(ApiError::Denied(why))) => assert!(why.contains("nodes only"), "{why}"),
            other => panic!("a user certificate sent a heartbeat: {other:?}"),
        }
        let good = transport::Client::new(endpoint.clone());
        match good.call(&addr, &ask, Duration::from_secs(3)).await {
            Ok(Ok(Reply::Cluster(info))) => assert_eq!(info.answered_by, "n1"),
            other => panic!("the node stopped serving: {other:?}"),
        }
    });
}

#[test]
fn users_act_on_their_own_jobs_and_only_admins_on_the_cluster() {
    let c = TestCluster::up(&["--nodes", "1", "--voters-max", "1", "--gpus", "h100:2"]);
    // A second user, with a certificate from the cluster CA and a client.toml of her own.
    let dir = c.path();
    let ca = pki::PemPair {
        cert_pem: std::fs::read_to_string(dir.join("ca.crt")).expect("ca cert"),
        key_pem: std::fs::read_to_string(dir.join("ca.key")).expect("ca key"),
    };
    let alice_dir = dir.join("alice");
    pki::write_pem_pair(&alice_dir, "client", &pki::issue_client_cert(&ca, "alice").expect("alice cert")).expect("write alice cert");
    std::fs::copy(dir.join("ca.crt"), alice_dir.join("ca.crt")).expect("copy ca");
    let servers = std::fs::read_to_string(dir.join("client.toml")).expect("client.toml");
    let servers_line = servers.lines().find(|l| l.starts_with("servers")).expect("servers line");
    std::fs::write(
        alice_dir.join("client.toml"),
        format!("{servers_line}\n[tls]\nca_cert = \"ca.crt\"\ncert = \"client.crt\"\nkey = \"client.key\"\n"),
    )
    .expect("alice client.toml");
    let alice = |args: &[&str]| {
        let mut all = vec!["--cluster", alice_dir.to_str().expect("path")];
        all.extend_from_slice(args);
        c.raw(&all)
    };

    let roots = c.submit(&[], &["sleep", "30"]);
    let out = alice(&["cancel", &roots.to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("user alice may not cancel job") && err.contains("of user root"), "{err}");
    assert_eq!(c.job(roots)["state"], "RUNNING");

    // Her job is hers, whatever $USER her client claims.
    let out = alice(&["--json", "submit", "--", "sleep", "30"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hers = serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")["job_id"].as_u64().expect("id");
    assert_eq!(c.job(hers)["user"], "alice");
    assert!(alice(&["cancel", &hers.to_string()]).status.success());

    let out = alice(&["drain", "n1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("only admins may"), "{}", String::from_utf8_lossy(&out.stderr));
    // The developer who started the dev cluster is an admin: any job, any node.
    assert!(c.corral(&["cancel", &roots.to_string()]).status.success());
    assert!(c.corral(&["drain", "n1"]).status.success());
}

/// A `corrald` started from a node.toml that `corral cluster join` wrote; killed when dropped.
struct Joined(std::process::Child);

impl Drop for Joined {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_machine_enrols_with_a_token_alone_and_revocations_hold() {
    let c = TestCluster::up(&["--nodes", "2", "--gpus", "h100:8"]);
    let n1 = c.addr("n1");
    let created = c.json(&["cluster", "token", "create", "--ttl", "10m"]);
    let token = created["token"].as_str().expect("token").to_string();
    let token_id = created["id"].as_u64().expect("token id");
    let listed = c.json(&["cluster", "token", "list"]);
    assert!(listed.as_array().is_some_and(|l| l.iter().any(|t| t["id"] == token_id && t["revoked"] == false)), "{listed}");

    // A machine with nothing but the token and an address.
    let join = |name: &str, token: &str| {
        let dir = c.path().join(format!("joining-{name}"));
        let dir_text = dir.to_str().expect("utf-8").to_string();
        let port = corral_cli::dev::free_listen_port().expect("free port");
        let listen = format!("127.0.0.1:{port}");
        let data = dir.join("data");
        let args = [
            "--json",
            "--server",
            &n1,
            "cluster",
            "join",
            "--dir",
            &dir_text,
            "--token",
            token,
            "--name",
            name,
            "--listen",
            &listen,
            "--gpus",
            "h100:8",
            "--data-dir",
            data.to_str().expect("utf-8"),
        ];
        let out = c.raw(&args);
        (dir, out)
    };
    let (dir, out) = join("n9", &token);
    assert!(out.status.success(), "join with the token alone: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["enrolled"], true);
    let fingerprint = v["cert_fingerprint"].as_str().expect("fingerprint").to_string();
    let log = std::fs::File::create(dir.join("corrald.log")).expect("log");
    let child = std::process::Command::new(corral_tests::bin_dir().join("corrald"))
        .arg("--config")
        .arg(dir.join("node.toml"))
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start the enrolled node");
    let _n9 = Joined(child);
    corral_tests::wait_until("the enrolled node to be up", Duration::from_secs(60), || {
        c.json(&["nodes"]).as_array().into_iter().flatten().any(|n| n["name"] == "n9" && n["state"] == "UP")
    });

    // A revoked token enrols nobody; neither does a token for another CA, nor a taken name.
    let out = c.corral(&["cluster", "token", "revoke", &token_id.to_string()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, out) = join("n10", &token);
    assert!(!out.status.success(), "enrolled with a revoked token");
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown, expired or revoked"), "{}", String::from_utf8_lossy(&out.stderr));
    let fresh = c.json(&["cluster", "token", "create", "--ttl", "10m"])["token"].as_str().expect("token").to_string();
    let other_ca = pki::ca_fingerprint(&pki::generate_ca("other").expect("ca").cert_pem).expect("fingerprint");
    let parts: Vec<&str> = fresh.split(':').collect();
    let forged = format!("{}:{}:{}:{}:{}", parts[0], parts[1], other_ca, parts[3], parts[4]);
    let (_, out) = join("n11", &forged);
    assert!(!out.status.success(), "enrolled at a server of another CA");
    assert!(String::from_utf8_lossy(&out.stderr).contains("handshake"), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, out) = join("n1", &fresh);
    assert!(String::from_utf8_lossy(&out.stderr).contains("already a member"), "{}", String::from_utf8_lossy(&out.stderr));

    // Revoking n9's certificate: every node refuses it, so n9 is declared down, and a client
    // using that certificate is refused.
    let nodes = c.json(&["nodes"]);
    let recorded = nodes.as_array().and_then(|l| l.iter().find(|n| n["name"] == "n9")).map(|n| n["cert_fingerprint"].clone());
    assert_eq!(recorded, Some(serde_json::Value::String(fingerprint.clone())), "the leader recorded the certificate n9 joined with");
    let out = c.corral(&["cluster", "revoke", "--node", "n9"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    corral_tests::wait_until("the revoked node to be down", Duration::from_secs(30), || {
        c.json(&["nodes"]).as_array().into_iter().flatten().any(|n| n["name"] == "n9" && n["state"] == "DOWN")
    });
    std::fs::write(
        dir.join("client.toml"),
        format!("servers = [\"{n1}\"]\n[tls]\nca_cert = \"ca.crt\"\ncert = \"node.crt\"\nkey = \"node.key\"\n"),
    )
    .expect("client.toml");
    let out = c.raw(&["--cluster", dir.to_str().expect("utf-8"), "queue"]);
    assert!(!out.status.success(), "a revoked certificate was served");
    assert!(String::from_utf8_lossy(&out.stderr).contains("certificate revoked"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_node_renews_its_certificate_without_a_restart() {
    let c = TestCluster::up(&["--nodes", "2", "--gpus", "h100:8"]);
    let dir = c.path().join("n2");
    let fingerprint = || pki::cert_fingerprint(&std::fs::read_to_string(dir.join("node.crt")).expect("node.crt")).expect("fingerprint");
    let before = fingerprint();
    // n2 again, with its renewal due at once (more than its 365 days left) and checked often.
    let pid: i32 = std::fs::read_to_string(dir.join("corrald.pid")).expect("pid").trim().parse().expect("pid");
    c.signal("n2", "TERM");
    corral_tests::wait_until("n2 to stop", Duration::from_secs(20), || !chaos::runner::pid_alive(pid));
    let toml = std::fs::read_to_string(dir.join("node.toml")).expect("node.toml");
    std::fs::write(dir.join("node.toml"), format!("cert_renew_before_ms = 34560000000\ncert_check_interval_ms = 700\n{toml}"))
        .expect("node.toml");
    c.start("n2");
    corral_tests::wait_until("n2 to renew its certificate", Duration::from_secs(30), || fingerprint() != before);
    let renewed = fingerprint();
    corral_tests::wait_until("the renewal in n2's log", Duration::from_secs(10), || {
        corral_tests::node_log(&c, "n2").contains(&format!("new={renewed}")) || fingerprint() != renewed
    });
    assert!(corral_tests::node_log(&c, "n1").contains("renewed a node certificate"), "n1 (the CA-key node) signed it");
    // n2 keeps serving (a new connection gets the rotated certificate) and keeps heartbeating.
    let info = c.json(&["--server", &c.addr("n2"), "cluster"]);
    assert_eq!(info["answered_by"], "n2", "{info}");
    // Several more rotations (every 700 ms), then it is still up: heartbeats crossed them.
    let renewals = |log: &str| log.matches("certificate renewed").count();
    let seen = renewals(&corral_tests::node_log(&c, "n2"));
    corral_tests::wait_until("n2 to rotate twice more", Duration::from_secs(20), || {
        renewals(&corral_tests::node_log(&c, "n2")) >= seen + 2
    });
    let nodes = c.json(&["nodes"]);
    assert!(nodes.as_array().is_some_and(|l| l.iter().any(|n| n["name"] == "n2" && n["state"] == "UP")), "{nodes}");
    // Stopped, it leaves a certificate and key that make a pair (a restart loads them).
    let pid: i32 = std::fs::read_to_string(dir.join("corrald.pid")).expect("pid").trim().parse().expect("pid");
    c.signal("n2", "TERM");
    corral_tests::wait_until("n2 to stop", Duration::from_secs(20), || !chaos::runner::pid_alive(pid));
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).expect("read");
    let ca = std::fs::read_to_string(c.path().join("ca.crt")).expect("ca");
    let id = transport::TlsIdentity::from_pems(&ca, &read("node.crt"), &read("node.key")).expect("node.crt and node.key match");
    assert_eq!(id.common_name(), "n2");
    assert_ne!(id.fingerprint(), before);
}
