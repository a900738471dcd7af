//! The host rig (`scripts/hosts.sh`): three booted Debian hosts, Corral installed on each by
//! `deploy/install.sh` and run by systemd's unit. A job under the shipped unit sees its `/job`
//! (each run's mount namespace, which needs the unit to grant `CAP_SYS_ADMIN`), and a rolling
//! upgrade (`scripts/rig-upgrade.sh`: reinstall, then `systemctl kill --signal=SIGUSR2` host by
//! host) keeps every job's processes and requeues none; `corral-restd` answers before and after.
//! Needs root, cgroup v1's systemd, freezer and blkio hierarchies, systemd-nspawn, debootstrap,
//! nft and curl (`scripts/setup.sh` installs them as root); the hosts' root file system is built
//! once per machine (`scripts/hosts.sh setup`, in `CORRAL_RIG`, /var/tmp/corral-rig by default).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use corral_tests::{bin_dir, wait_until_or_show};
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests crate sits in the workspace").to_path_buf()
}

fn text(out: &Output) -> String {
    format!("status {:?}\nstdout:\n{}\nstderr:\n{}", out.status, String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Why this machine cannot boot hosts, if it cannot.
fn missing() -> Option<String> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (booting hosts with systemd-nspawn needs root)".into());
    }
    if let Some(c) =
        ["systemd", "freezer", "blkio"].into_iter().find(|c| !Path::new("/sys/fs/cgroup").join(c).join("cgroup.procs").exists())
    {
        return Some(format!("no cgroup v1 {c} hierarchy here (hosts.sh gives each host a group in it)"));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = |tool: &str| std::env::split_paths(&path).chain(["/usr/sbin".into(), "/sbin".into()]).any(|d| d.join(tool).is_file());
    let absent: Vec<&str> = ["systemd-nspawn", "debootstrap", "nft", "curl"].into_iter().filter(|t| !found(t)).collect();
    (!absent.is_empty()).then(|| format!("{} missing (scripts/setup.sh installs them as root)", absent.join(", ")))
}

/// One rig at a time on a machine (one bridge, one address range): held while the test runs.
fn machine_lock() -> std::fs::File {
    let path = Path::new("/run/lock/corral-rig-test.lock");
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).expect("open the rig's lock file");
    // SAFETY: flock on a descriptor this function owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "lock {}: {}", path.display(), std::io::Error::last_os_error());
    file
}

/// The machine's rig lock, or none where hosts cannot boot here (the test is skipped and says
/// why).
fn lock_or_skip() -> Option<std::fs::File> {
    if let Some(why) = missing() {
        eprintln!("SKIPPED: {why}; no host was booted");
        return None;
    }
    Some(machine_lock())
}

/// A rig of booted hosts; dropped, it is taken down (`hosts.sh down`), also when the test fails.
struct Rig {
    dir: tempfile::TempDir,
    down: bool,
}

impl Rig {
    fn up(hosts: usize) -> Rig {
        let rig = Rig { dir: tempfile::Builder::new().prefix("corral-rig-").tempdir_in("/var/tmp").expect("tempdir"), down: false };
        let out = rig.script("hosts.sh", &["up", &hosts.to_string(), rig.path()]);
        assert!(out.status.success(), "hosts.sh up failed: {}", text(&out));
        rig
    }

    fn path(&self) -> &str {
        self.dir.path().to_str().expect("temporary directory names are UTF-8")
    }

    fn script(&self, name: &str, args: &[&str]) -> Output {
        Command::new("bash")
            .arg(repo_root().join("scripts").join(name))
            .args(args)
            .env("CORRAL_BIN_DIR", bin_dir())
            .output()
            .unwrap_or_else(|e| panic!("run scripts/{name}: {e}"))
    }

    /// CMD inside HOST; its stdout, asserting it succeeded.
    fn exec(&self, host: &str, cmd: &[&str]) -> String {
        let out = self.script("hosts.sh", &[&["exec", self.path(), host, "--"], cmd].concat());
        assert!(out.status.success(), "{cmd:?} on {host}: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn corral_json(&self, args: &[&str]) -> Value {
        let out =
            Command::new(bin_dir().join("corral")).args(["--cluster", self.path(), "--json"]).args(args).output().expect("run corral");
        assert!(out.status.success(), "corral {args:?}: {}", text(&out));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("corral {args:?} printed no JSON ({e}): {}", text(&out)))
    }

    /// Stops every host and checks that nothing is left (hosts.sh down fails otherwise).
    fn down(mut self) {
        self.down = true;
        let out = self.script("hosts.sh", &["down", self.path()]);
        assert!(out.status.success(), "hosts.sh down: {}", text(&out));
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if !self.down {
            let out = self.script("hosts.sh", &["down", self.path()]);
            if !out.status.success() {
                eprintln!("hosts.sh down after a failure: {}", text(&out));
            }
        }
    }
}

/// The job's record, once it is final.
fn wait_final(rig: &Rig, job: &str) -> Value {
    let ended = |j: &Value| !matches!(j["state"].as_str(), Some("PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING"));
    wait_until_or_show(
        &format!("job {job} to end"),
        Duration::from_secs(30),
        || ended(&rig.corral_json(&["show", job])),
        || format!("{:#}", rig.corral_json(&["show", job])),
    );
    rig.corral_json(&["show", job])
}

#[test]
fn jobs_run_under_the_unit_and_a_rolling_upgrade_keeps_them() {
    let Some(_lock) = lock_or_skip() else { return };
    let rig = Rig::up(3);

    // Under the shipped unit, a job starts in a mount namespace of its own and reads its /job.
    let sbatch = "/usr/local/libexec/corral/slurm/sbatch";
    let job = rig.exec("h3", &[sbatch, "--parsable", "-w", "h2", "--mem", "64M", "-o", "/tmp/job-%j.out", "--wrap", "cat /job/hostfile"]);
    let job = job.trim();
    let done = wait_final(&rig, job);
    assert_eq!((done["state"].as_str(), done["exit_code"].as_i64()), (Some("COMPLETED"), Some(0)), "{done:#}");
    assert_eq!(rig.exec("h2", &["cat", &format!("/tmp/job-{job}.out")]), "h2 slots=1\n");
    let journal = rig.exec("h2", &["journalctl", "-u", "corrald", "--no-pager"]);
    assert!(!journal.contains("CAP_SYS_ADMIN is not in"), "corrald lacks CAP_SYS_ADMIN under the unit:\n{journal}");

    // The upgrade, one job per host.
    let out = rig.script("rig-upgrade.sh", &[rig.path(), "3"]);
    assert!(out.status.success(), "rig-upgrade.sh: {}", text(&out));
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    let lines = std::fs::read_to_string(rig.dir.path().join("upgrade.jsonl")).expect("read upgrade.jsonl");
    let hosts: Vec<Value> = lines.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}"))).collect();
    let names: Vec<&str> = hosts.iter().filter_map(|h| h["host"].as_str()).collect();
    assert_eq!(names, ["h1", "h2", "h3"], "{lines}");
    for h in &hosts {
        assert_eq!((h["kept"].as_u64(), h["requeued"].as_u64()), (Some(3), Some(0)), "jobs lost their processes: {h}");
        let (active_ms, up_ms) = (h["active_ms"].as_u64().unwrap_or(0), h["up_ms"].as_u64().unwrap_or(0));
        // Within the lease (fence_after_ms, 3 s by default), or the runs would have been killed.
        assert!(active_ms > 0 && active_ms <= up_ms && up_ms < 3_000, "{h}");
        assert!(h["restd_first_ms"].as_u64().is_some_and(|ms| ms < 20_000), "{h}");
    }
    // restd answered again after h1's hand-over: the pings' log ends with answers.
    let pings = std::fs::read_to_string(rig.dir.path().join("pings.log")).expect("read pings.log");
    assert!(pings.lines().rev().take(5).all(|l| l.ends_with(" 200")), "restd did not answer after h1's hand-over:\n{pings}");

    // Seen by the cluster: each job's one run, never restarted, cancelled at the end.
    let all = rig.corral_json(&["queue", "--all"]);
    let upgraded: Vec<&Value> = all.as_array().expect("queue is a list").iter().filter(|j| j["id"].as_u64() != job.parse().ok()).collect();
    assert_eq!(upgraded.len(), 3, "{all:#}");
    for j in upgraded {
        assert_eq!((j["run"].as_u64(), j["restart_count"].as_u64()), (Some(1), Some(0)), "{j:#}");
    }
    rig.down();
}

/// The chaos runner's workload and checkers on four booted hosts, with faults from outside the
/// daemons (`corral-chaos rig`): a short run on a fixed seed. The long one is its own command
/// (`corral-chaos rig --hosts 5 --duration 30m`, see README.md).
#[test]
fn a_short_chaos_run_on_booted_hosts_keeps_every_invariant() {
    use chaos::runner::{self, Fault, RunOptions};
    let Some(_lock) = lock_or_skip() else { return };
    // This seed draws each of them: freeze, reboot, freeze, oneway, poweroff-all, upgrade of the
    // leader, fail-disk (reads too) and crash. The hosts' data directories are then FUSE layers.
    let faults = Fault::parse_list("upgrade,crash,reboot,oneway,freeze,poweroff-all,fail-disk").expect("fault list");
    let opts = RunOptions {
        nodes: 4,
        voters: 3,
        duration_ms: 90_000,
        seed: 20_261_243,
        faults,
        dir: None,
        corral: bin_dir().join("corral"),
        keep: false,
        rig: Some(repo_root().join("scripts/hosts.sh")),
    };
    println!("chaos run on the rig: {}", opts.repro());
    let outcome =
        runner::run(&opts).unwrap_or_else(|e| panic!("chaos run on the rig did not complete: {e:#}\nreproduce: {}", opts.repro()));
    println!("{}", outcome.summary);
    assert!(outcome.violations.is_empty(), "violations: {:#?}\nreproduce: {}", outcome.violations, outcome.repro);
    assert!(outcome.final_states.len() >= 20, "too few jobs acknowledged to check anything: {}", outcome.summary);
    assert!(outcome.faults_injected.values().sum::<u32>() >= 5, "too few faults injected: {}", outcome.summary);
}
