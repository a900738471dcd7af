//! Issue 8, jobs confined by cgroups: each run gets its CPU, memory and process limits in its
//! own cgroups (v2, and the v1 hierarchies of a hybrid host for what v2 lacks), and, where the
//! node can fence devices (a cgroup v2 eBPF device program as root, or the v1 devices
//! controller), may open only its own GPUs' device files. Simulated GPUs stand for real devices
//! here (`--gpu-device-files`): the kernel refuses the others. (`node/tests/cgroup_devices.rs`
//! checks the eBPF program alone; on a hybrid host both fence here.)

use std::time::Duration;

use corral_tests::{wait_until, TestCluster};

/// Character devices standing for GPUs 0..3 (not /dev/null: every shell needs it).
const DEVICES: [&str; 4] = ["/dev/full", "/dev/zero", "/dev/random", "/dev/urandom"];

/// Prints `open DEV` or `denied DEV` for each device, the job's GPUs, and its cgroups' limits.
fn body() -> String {
    let probes: String =
        DEVICES.iter().map(|d| format!("if head -c1 {d} > /dev/null 2>&1; then echo open {d}; else echo denied {d}; fi; ")).collect();
    format!(
        "{probes}echo gpus=$CORRAL_GPU_INDICES; \
         limit() {{ p=$(grep \":$1:\" /proc/self/cgroup | cut -d: -f3); cat /sys/fs/cgroup/$1$p/$2 2>/dev/null || echo none; }}; \
         echo memory=$(limit memory memory.limit_in_bytes) cpu=$(limit cpu cpu.cfs_quota_us) pids=$(limit pids pids.max) \
         devices=$(grep ':devices:' /proc/self/cgroup | cut -d: -f3)"
    )
}

#[test]
fn a_run_gets_its_limits_and_may_open_only_its_own_gpus_device_files() {
    let files = DEVICES.join(",");
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:4", "--gpu-device-files", &files]);
    let log = corral_tests::node_log(&c, "n1");
    if !log.contains("each run may open only its own GPUs' device files") {
        // Neither fence on this host: the node must say the GPUs are not fenced.
        assert!(log.contains("a job's GPUs are chosen with CUDA_VISIBLE_DEVICES, not fenced"), "{log}");
        eprintln!("this host has no cgroup v1 devices controller and loads no device programs: device fencing is not available here");
        return;
    }
    let fences: Vec<&str> = log.lines().filter(|l| l.contains("each run may open only its own GPUs' device files")).collect();
    println!("fenced by: {fences:?}");
    let one = c.submit(&["--gres", "gpu:1", "--mem", "96M", "-c", "2", "-o", "one.out"], &["sh", "-c", &body()]);
    let three = c.submit(&["--gres", "gpu:3", "--mem", "128M", "-o", "three.out"], &["sh", "-c", &body()]);
    for id in [one, three] {
        let job = c.wait_final(id, Duration::from_secs(30));
        assert_eq!(job["state"], "COMPLETED", "{job}\n{}", c.logs());
    }
    let read = |name: &str| std::fs::read_to_string(c.work.join(name)).unwrap_or_default();
    let mut opened_by: Vec<Vec<String>> = Vec::new();
    for (name, gpus, memory_mib, cpus) in [("one.out", 1, 96u64, 2u64), ("three.out", 3, 128, 1)] {
        let out = read(name);
        let indices: Vec<usize> =
            out.lines().find_map(|l| l.strip_prefix("gpus=")).unwrap_or("").split(',').filter_map(|i| i.parse().ok()).collect();
        assert_eq!(indices.len(), gpus, "{name}: {out}");
        let opened: Vec<String> = out.lines().filter_map(|l| l.strip_prefix("open ")).map(str::to_string).collect();
        let want: Vec<String> = indices.iter().map(|i| DEVICES[*i].to_string()).collect();
        let mut opened_sorted = opened.clone();
        opened_sorted.sort();
        let mut want_sorted = want.clone();
        want_sorted.sort();
        assert_eq!(opened_sorted, want_sorted, "{name} opens exactly its own GPUs' device files:\n{out}");
        assert_eq!(out.lines().filter(|l| l.starts_with("denied ")).count(), 4 - gpus, "{name}: the kernel refused the others:\n{out}");
        let limits = out.lines().find(|l| l.starts_with("memory=")).unwrap_or("");
        if !limits.contains("memory=none") {
            assert!(limits.contains(&format!("memory={}", memory_mib << 20)), "{name}: {limits}");
        }
        if !limits.contains("cpu=none") {
            assert!(limits.contains(&format!("cpu={}", cpus * 100_000)), "{name}: {limits}");
        }
        if !limits.contains("pids=none") {
            assert!(limits.contains("pids=65536"), "{name}: {limits}");
        }
        assert!(limits.contains("/job-"), "{name} ran in its own devices cgroup: {limits}");
        opened_by.push(opened);
    }
    let all: Vec<&String> = opened_by.iter().flatten().collect();
    assert_eq!(all.len(), 4, "the two jobs opened four different devices between them: {opened_by:?}");
    // The runs' cgroups go with them.
    for name in ["one.out", "three.out"] {
        let out = read(name);
        let path = out.split("devices=").nth(1).unwrap_or("").trim().to_string();
        let dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/devices{path}"));
        wait_until(&format!("{} to be removed", dir.display()), Duration::from_secs(10), || !dir.exists());
    }
    println!("{}\n{}", read("one.out"), read("three.out"));
}

#[test]
fn a_run_past_its_memory_limit_is_killed_by_the_kernel() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:1"]);
    let log = corral_tests::node_log(&c, "n1");
    if log.contains("missing=") && log.contains("\"memory\"") {
        // Neither v2 nor v1 gives a memory controller here: the node says the limit is not enforced.
        assert!(log.contains("those limits are not enforced"), "{log}");
        eprintln!("this host has no memory controller for jobs: memory limits are not enforced here");
        return;
    }
    // `tail -c` holds what it keeps in memory: 150 MB, in a job limited to 32 MiB, and 8 MB in
    // one limited to 64 MiB.
    let hog = "head -c 200000000 /dev/zero | tail -c 150000000 > /dev/null; echo tail=$?";
    let small = "head -c 20000000 /dev/zero | tail -c 8000000 | wc -c; echo rc=$?";
    let over = c.submit(&["--mem", "32M", "-o", "over.out"], &["sh", "-c", hog]);
    let under = c.submit(&["--mem", "64M", "-o", "under.out"], &["sh", "-c", small]);
    let (over_job, under_job) = (c.wait_final(over, Duration::from_secs(60)), c.wait_final(under, Duration::from_secs(60)));
    let read = |name: &str| std::fs::read_to_string(c.work.join(name)).unwrap_or_default();
    let (over_out, under_out) = (read("over.out"), read("under.out"));
    assert!(under_out.contains("8000000") && under_out.contains("rc=0"), "within its limit it runs:\n{under_out}");
    assert_eq!(under_job["state"], "COMPLETED", "{under_job}");
    assert!(over_out.contains("tail=137"), "past its limit the kernel killed it (SIGKILL):\n{over_out}");
    // The shell went on and exited 0, but a process of the job was OOM-killed: Slurm's
    // OUT_OF_MEMORY, with the cgroup's event as the reason and ExitCode 0:125.
    assert_eq!(over_job["state"], "OUT_OF_MEMORY", "{over_job}");
    let reason = over_job["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("the kernel killed 1 process for the job's memory limit of 32 MiB"), "{over_job}");
    let sacct = c.shim("sacct", &["-X", "-P", "-n", "-j", &format!("{over},{under}"), "-o", "JobID,State,ExitCode"], &[]);
    assert_eq!(String::from_utf8_lossy(&sacct.stdout), format!("{over}|OUT_OF_MEMORY|0:125\n{under}|COMPLETED|0:0\n"));
    let squeue = c.shim("squeue", &["-h", "-t", "OOM", "-o", "%i %t"], &[]);
    assert_eq!(String::from_utf8_lossy(&squeue.stdout), format!("{over} OOM\n"));
    let shown = String::from_utf8_lossy(&c.shim("scontrol", &["show", "job", &over.to_string()], &[]).stdout).into_owned();
    assert!(shown.contains("JobState=OUT_OF_MEMORY Reason=OutOfMemory ") && shown.contains("ExitCode=0:125"), "{shown}");
    println!("over the limit ({reason}):\n{over_out}\nwithin it:\n{under_out}");
}
