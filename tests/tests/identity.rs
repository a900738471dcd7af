//! Issue 8 end to end: who is asking (the local socket's peer credentials), what they may do
//! (owners and admins), and jobs that run as their user inside a cgroup that dies with them.
//!
//! Needs root (it creates two local users and runs the CLI as each); elsewhere it says so and
//! checks nothing.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use corral_tests::{wait_until, TestCluster};
use serde_json::Value;

/// A local account made for the test and removed when dropped.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
    home: PathBuf,
}

impl TestUser {
    fn create(name: &str, home: PathBuf) -> TestUser {
        let _ = Command::new("userdel").arg(name).output();
        let out = Command::new("useradd")
            .args(["--user-group", "--no-create-home", "--home-dir"])
            .arg(&home)
            .arg(name)
            .output()
            .expect("run useradd");
        assert!(out.status.success(), "useradd {name}: {}", String::from_utf8_lossy(&out.stderr));
        let id = |flag: &str| -> u32 {
            let out = Command::new("id").arg(flag).arg(name).output().expect("run id");
            String::from_utf8_lossy(&out.stdout).trim().parse().expect("numeric id")
        };
        std::fs::create_dir_all(&home).expect("create home");
        let user = TestUser { name: name.to_string(), uid: id("-u"), gid: id("-g"), home };
        std::os::unix::fs::chown(&user.home, Some(user.uid), Some(user.gid)).expect("chown home");
        user
    }

    /// `corral ARGS` as this user, against the node's local socket, from the user's home.
    fn corral(&self, socket: &Path, args: &[&str]) -> Output {
        Command::new(corral_tests::corral_bin())
            .arg("--socket")
            .arg(socket)
            .args(args)
            .current_dir(&self.home)
            .env("USER", &self.name)
            .env("HOME", &self.home)
            .uid(self.uid)
            .gid(self.gid)
            .output()
            .expect("run corral as a test user")
    }

    /// The Slurm command `name` (the cluster's shim) as this user, against the node's socket.
    fn shim(&self, c: &TestCluster, socket: &Path, name: &str, args: &[&str]) -> Output {
        Command::new(c.path().join("shims").join(name))
            .args(args)
            .current_dir(&self.home)
            .env("CORRAL_SOCKET", socket)
            .env("USER", &self.name)
            .env("HOME", &self.home)
            .uid(self.uid)
            .gid(self.gid)
            .output()
            .expect("run a Slurm command as a test user")
    }

    fn json(&self, socket: &Path, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.corral(socket, &all);
        assert!(out.status.success(), "corral {args:?} as {}: {}", self.name, String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("json output")
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn pid_alive(pid: i32) -> bool {
    chaos::runner::pid_alive(pid)
}

#[test]
fn jobs_run_as_their_user_in_a_cgroup_and_only_owners_may_touch_them() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to create users and run jobs as them; nothing was checked");
        return;
    }
    let c = TestCluster::up(&["--nodes", "2", "--gpus", "h100:8", "--run-as-user"]);
    // Test users must reach the node's socket under the (0700) temporary directory.
    for dir in [c.path().to_path_buf(), c.path().join("n1"), c.path().join("n1").join("data")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("open the path to the socket");
    }
    let socket = c.path().join("n1").join("data").join("corral.sock");
    let pid = std::process::id();
    let alice = TestUser::create(&format!("calice{pid}"), c.path().join("home-alice"));
    let bob = TestUser::create(&format!("cbob{pid}"), c.path().join("home-bob"));

    // Alice's job runs as her, in her directory, in its own cgroup.
    let body = "id -u; id -g; echo user=$USER home=$HOME; pwd; grep '^0::' /proc/self/cgroup";
    let v = alice.json(&socket, &["submit", "--gres", "gpu:1", "-o", "who-%j.out", "--", "sh", "-c", body]);
    let id = v["job_id"].as_u64().expect("job id");
    let job = c.wait_final(id, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    assert_eq!(job["user"], alice.name.as_str());
    let out_path = alice.home.join(format!("who-{id}.out"));
    let out = std::fs::read_to_string(&out_path).expect("output in alice's home");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], alice.uid.to_string(), "{out}");
    assert_eq!(lines[1], alice.gid.to_string(), "{out}");
    assert_eq!(lines[2], format!("user={} home={}", alice.name, alice.home.display()), "{out}");
    assert_eq!(lines[3], alice.home.display().to_string(), "{out}");
    let cgroups_on = corral_tests::node_log(&c, "n1").contains("jobs run in cgroups");
    if cgroups_on {
        assert!(lines[4].contains(&format!("/job-{id}-1")), "the job ran in its own cgroup: {out}");
    }
    let meta = std::fs::metadata(&out_path).expect("stat output");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), alice.uid, "the output file is alice's");

    // A file alice may not write stays untouched: output is opened as her.
    let secret = c.path().join("root-only");
    std::fs::write(&secret, "secret\n").expect("write root-only file");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let v = alice.json(&socket, &["submit", "-o", secret.to_str().expect("utf-8"), "--", "true"]);
    let job = c.wait_final(v["job_id"].as_u64().expect("job id"), Duration::from_secs(30));
    assert_eq!(job["state"], "FAILED", "{job}");
    assert!(job["reasons"].to_string().contains("Permission denied"), "{job}");
    assert_eq!(std::fs::read_to_string(&secret).expect("read"), "secret\n");

    // A job that leaves a daemon outside its process group; bob may not cancel it, alice may,
    // and the cancel kills the daemon too (the whole cgroup).
    let body = "setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' < /dev/null > /dev/null 2>&1 & sleep 300";
    let v = alice.json(&socket, &["submit", "--", "sh", "-c", body]);
    let id = v["job_id"].as_u64().expect("job id");
    let pid_file = alice.home.join("daemon.pid");
    wait_until("the job's daemon to start", Duration::from_secs(30), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|t| t.trim().parse::<i32>().is_ok())
    });
    let daemon: i32 = std::fs::read_to_string(&pid_file).expect("pid").trim().parse().expect("pid");
    let refused = bob.corral(&socket, &["cancel", &id.to_string()]);
    assert!(!refused.status.success(), "bob cancelled alice's job");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains(&format!("user {} may not cancel job {id} of user {}", bob.name, alice.name)), "{err}");
    assert!(
        corral_tests::node_log(&c, "n1").contains("denied: not the job's owner")
            || corral_tests::node_log(&c, "n2").contains("denied: not the job's owner")
    );
    assert_eq!(c.job(id)["state"], "RUNNING");
    let ok = alice.corral(&socket, &["cancel", &id.to_string()]);
    assert!(ok.status.success(), "alice cancels her job: {}", String::from_utf8_lossy(&ok.stderr));
    c.wait_final(id, Duration::from_secs(30));
    if cgroups_on {
        wait_until("the job's daemon to die with its cgroup", Duration::from_secs(10), || !pid_alive(daemon));
    } else {
        // SAFETY: killing the test's own stray process.
        unsafe { libc::kill(daemon, libc::SIGKILL) };
    }

    // Draining a node is for admins.
    let out = bob.corral(&socket, &["drain", "n2"]);
    assert!(!out.status.success(), "bob drained a node");
    assert!(String::from_utf8_lossy(&out.stderr).contains("only admins may"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A local group made for the test and removed when dropped.
struct TestGroup(String);

impl Drop for TestGroup {
    fn drop(&mut self) {
        let _ = Command::new("groupdel").arg(&self.0).output();
    }
}

/// Issue 45: partition access as an operator sets it with `scontrol`, and as users meet it
/// through `sbatch`: a user outside `AllowGroups` is refused at submit, an account outside
/// `AllowAccounts` pends with `AccountNotAllowed` (Slurm's `EnforcePartLimits=NO`) or, with
/// `EnforcePartLimits=ALL`, is refused at submit; opening the partition starts the pending job.
#[test]
fn partition_access_lists_refuse_or_hold_jobs_in_slurms_words() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to create users and groups; nothing was checked");
        return;
    }
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:8", "--run-as-user"]);
    let admin = |args: &[&str]| {
        let out = c.shim("scontrol", args, &[]);
        assert!(out.status.success(), "scontrol {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let shims = c.path().join("shims");
    admin(&["show", "config"]);
    for dir in [c.path().to_path_buf(), c.path().join("n1"), c.path().join("n1").join("data"), shims] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("open the path to the socket");
    }
    let socket = c.path().join("n1").join("data").join("corral.sock");
    let pid = std::process::id();
    let group = TestGroup(format!("cgpu{pid}"));
    let _ = Command::new("groupdel").arg(&group.0).output();
    assert!(Command::new("groupadd").arg(&group.0).status().expect("run groupadd").success());
    let alice = TestUser::create(&format!("palice{pid}"), c.path().join("home-alice"));
    let bob = TestUser::create(&format!("pbob{pid}"), c.path().join("home-bob"));
    assert!(Command::new("usermod").args(["-a", "-G", &group.0, &alice.name]).status().expect("run usermod").success());

    admin(&["create", "PartitionName=phys", "Nodes=n1", &format!("AllowGroups={}", group.0), "AllowAccounts=phys", "DenyQos=low"]);
    let shown = admin(&["show", "partition", "phys"]);
    assert!(shown.contains(&format!("\n   AllowGroups={} AllowAccounts=phys DenyQos=low\n", group.0)), "{shown}");

    let sbatch = |user: &TestUser, account: &str| user.shim(&c, &socket, "sbatch", &["-p", "phys", "-A", account, "--wrap", "true"]);
    let refused = sbatch(&bob, "phys");
    assert!(!refused.status.success());
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        "sbatch: error: Batch job submission failed: User's group not permitted to use this partition"
    );
    let job_id = |out: &Output| -> u64 {
        assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).split_whitespace().last().and_then(|w| w.parse().ok()).expect("a job id")
    };
    let allowed = job_id(&sbatch(&alice, "phys"));
    let job = c.wait_final(allowed, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let held = job_id(&sbatch(&alice, "bio"));
    let reason = || {
        let out = c.shim("squeue", &["-h", "-o", "%T %r", "-j", &held.to_string()], &[]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // As Slurm 22.05.8 with slurmdbd showed it: the description in squeue and scontrol,
    // `PartitionConfig` in sacct.
    let described = "Job's account not permitted to use this partition (phys allows phys not bio)";
    corral_tests::wait_until_or_show(
        "the job to pend for its account",
        Duration::from_secs(20),
        || reason() == format!("PENDING {described}"),
        || format!("squeue: {}\njob: {}", reason(), c.job(held)),
    );
    let shown = admin(&["show", "job", &held.to_string()]);
    assert!(shown.contains(&format!(" Reason={} ", described.replace(' ', "_"))), "{shown}");
    let sacct = c.shim("sacct", &["-n", "-X", "-P", "-o", "State,Reason", "-j", &held.to_string()], &[]);
    assert_eq!(String::from_utf8_lossy(&sacct.stdout).trim(), "PENDING|PartitionConfig");

    // EnforcePartLimits=ALL: the same submission is refused at once.
    let policy = c.corral(&["policy", "show"]);
    let text = String::from_utf8_lossy(&policy.stdout).replace("enforce_part_limits = false", "enforce_part_limits = true");
    assert!(text.contains("enforce_part_limits = true"), "{text}");
    let file = c.path().join("policy.toml");
    std::fs::write(&file, text).expect("write the policy");
    let set = c.corral(&["policy", "set", file.to_str().expect("utf-8")]);
    assert!(set.status.success(), "policy set: {}", String::from_utf8_lossy(&set.stderr));
    assert!(admin(&["show", "config"]).lines().any(|l| l.starts_with("EnforcePartLimits") && l.ends_with("= ALL")));
    let refused = sbatch(&alice, "bio");
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr).trim(),
        "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified"
    );

    // Opening the partition to every account starts the job that waited.
    admin(&["update", "PartitionName=phys", "AllowAccounts=ALL"]);
    assert_eq!(c.wait_final(held, Duration::from_secs(30))["state"], "COMPLETED");
}
