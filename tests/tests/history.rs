//! Job history end to end over real processes: finished jobs leave the replicated hot state after
//! `min_job_age_s` and stay queryable through `sacct` (paged by the node) with the same fields; a
//! voter that replaces a dead one catches up by a streamed snapshot and holds the same
//! accounting store; a whole-cluster restart keeps the history; retention prunes it.

use std::time::Duration;

use corral_tests::{wait_until, TestCluster};
use serde_json::Value;

const JOBS: usize = 30;

/// `sacct` of the given jobs, one parsable line each.
fn sacct(c: &TestCluster, ids: &[u64], env: &[(&str, &str)]) -> String {
    let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let out = c.shim("sacct", &["-X", "-P", "-n", "-a", "-o", "JobID,JobName,User,State,ExitCode,NNodes,Submit,End", "-j", &list], env);
    assert!(out.status.success(), "sacct: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What node `name` holds: (applied index, hot jobs, accounting records, digest).
fn digest(c: &TestCluster, name: &str) -> Option<(u64, u64, u64, String)> {
    let addr = c.addr(name);
    let out = c.corral(&["--json", "--server", &addr, "cluster", "digest"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    if v["node"] != name {
        return None;
    }
    Some((
        v["applied_index"].as_u64()?,
        v["hot_jobs"].as_u64()?,
        v["accounting_records"].as_u64()?,
        v["accounting_digest"].as_str()?.to_string(),
    ))
}

fn voters(c: &TestCluster) -> Vec<String> {
    let v = c.json(&["cluster"]);
    let mut names: Vec<String> = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "voter" || m["role"] == "leader")
        .filter_map(|m| m["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Waits until every voter holds `records` accounting records with one digest; returns it.
fn wait_store_converged(c: &TestCluster, records: u64, patience: Duration) -> String {
    let mut seen = Vec::new();
    let mut last = String::new();
    wait_until(&format!("every voter to hold {records} accounting records alike"), patience, || {
        seen = voters(c).iter().map(|v| digest(c, v)).collect();
        let Some(Some(first)) = seen.first() else { return false };
        last = first.3.clone();
        seen.len() == 3 && seen.iter().all(|d| d.as_ref().is_some_and(|d| d.2 == records && d.3 == first.3))
    });
    last
}

fn node_tomls(c: &TestCluster) -> Vec<std::path::PathBuf> {
    let mut paths: Vec<_> = std::fs::read_dir(c.path())
        .expect("list cluster dir")
        .flatten()
        .map(|e| e.path().join("node.toml"))
        .filter(|p| p.exists())
        .collect();
    paths.sort();
    paths
}

#[test]
fn finished_jobs_leave_the_hot_state_and_stay_queryable_through_replacement_restart_and_pruning() {
    let c = TestCluster::up(&[
        "--nodes",
        "4",
        "--gpus",
        "h100:2",
        "--min-job-age-s",
        "2",
        "--snapshot-logs",
        "25",
        "--node-down-after-ms",
        "1500",
        "--voter-replace-after-ms",
        "1500",
    ]);
    let mut ids = Vec::new();
    for i in 0..JOBS {
        let cmd = if i.is_multiple_of(5) { format!("echo out-{i}; exit 3") } else { format!("echo out-{i}") };
        let out = c.shim("sbatch", &["--parsable", "-J", &format!("hist-{i}"), "--wrap", &cmd], &[]);
        assert!(out.status.success(), "sbatch: {}", String::from_utf8_lossy(&out.stderr));
        let id: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("job id from sbatch --parsable");
        ids.push(id);
    }
    for &id in &ids {
        c.wait_final(id, Duration::from_secs(60));
    }
    let first = sacct(&c, &ids, &[]);

    // Every finished job moves to the store: no voter keeps one in its hot state, squeue (which
    // knows what slurmctld would) no longer lists them, and sacct shows the same lines.
    let digest_before = wait_store_converged(&c, JOBS as u64, Duration::from_secs(30));
    for v in voters(&c) {
        let (_, hot, _, _) = digest(&c, &v).expect("digest");
        assert_eq!(hot, 0, "{v} keeps no finished job in its hot state");
    }
    let squeue = c.shim("squeue", &["-h", "-t", "all", "-o", "%i"], &[]);
    assert!(String::from_utf8_lossy(&squeue.stdout).trim().is_empty(), "squeue -t all: {}", String::from_utf8_lossy(&squeue.stdout));
    let archived = sacct(&c, &ids, &[]);
    assert_eq!(archived, first, "the same fields before and after the move");
    let lines: Vec<&str> = archived.lines().collect();
    assert_eq!(lines.len(), JOBS, "{archived}");
    for (i, line) in lines.iter().enumerate() {
        let fields: Vec<&str> = line.split('|').collect();
        assert_eq!(fields[0], ids[i].to_string(), "{line}");
        assert_eq!(fields[1], format!("hist-{i}"), "{line}");
        let (state, code) = if i.is_multiple_of(5) { ("FAILED", "3:0") } else { ("COMPLETED", "0:0") };
        assert_eq!((fields[3], fields[4]), (state, code), "{line}");
    }
    // Small pages give the same answer; an archived job still shows and its output is still read.
    assert_eq!(sacct(&c, &ids, &[("CORRAL_QUERY_PAGE", "7")]), archived);
    assert_eq!(c.job(ids[1])["state"], "COMPLETED");
    let out = c.corral(&["logs", &ids[1].to_string()]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("out-1"), "logs: {}", String::from_utf8_lossy(&out.stdout));

    // A follower voter dies: the agent that replaces it has no log to replay from (purged), so
    // it catches up by a streamed snapshot, accounting store included.
    let leader = c.leader();
    let before = voters(&c);
    let victim = before.iter().find(|v| **v != leader).expect("a follower voter").clone();
    c.signal(&victim, "KILL");
    wait_until("the dead voter to be replaced", Duration::from_secs(40), || {
        let now = voters(&c);
        now.len() == 3 && !now.contains(&victim)
    });
    let newcomer = voters(&c).into_iter().find(|v| !before.contains(v)).expect("a new voter");
    assert_eq!(wait_store_converged(&c, JOBS as u64, Duration::from_secs(40)), digest_before);
    assert!(digest(&c, &newcomer).is_some_and(|d| d.2 == JOBS as u64 && d.3 == digest_before));
    assert_eq!(sacct(&c, &ids, &[]), archived);

    // The whole cluster stops and starts again with its data: the history is still there, and
    // the voters are the same (a graceful stop declares each node down; the leader that comes
    // back gives them the grace period anew rather than replacing them, or itself).
    let voters_before_restart = voters(&c);
    let out = c.raw(&["dev", "down", "--dir", c.path_str()]);
    assert!(out.status.success(), "dev down: {}", String::from_utf8_lossy(&out.stderr));
    let out = c.raw(&["dev", "up", "--dir", c.path_str(), "--nodes", "4"]);
    assert!(out.status.success(), "dev up again: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    assert_eq!(wait_store_converged(&c, JOBS as u64, Duration::from_secs(40)), digest_before);
    assert_eq!(sacct(&c, &ids, &[]), archived);
    assert_eq!(voters(&c), voters_before_restart, "a whole-cluster restart keeps the voters");

    // With a retention of zero days every record is past it: a committed prune removes them all.
    let out = c.raw(&["dev", "down", "--dir", c.path_str()]);
    assert!(out.status.success(), "dev down: {}", String::from_utf8_lossy(&out.stderr));
    for path in node_tomls(&c) {
        let text = std::fs::read_to_string(&path).expect("read node.toml");
        std::fs::write(&path, format!("accounting_retention_days = 0\n{text}")).expect("write node.toml");
    }
    let out = c.raw(&["dev", "up", "--dir", c.path_str(), "--nodes", "4"]);
    assert!(out.status.success(), "dev up again: {}\n{}", String::from_utf8_lossy(&out.stderr), c.logs());
    wait_store_converged(&c, 0, Duration::from_secs(40));
    assert_eq!(sacct(&c, &ids, &[]), "", "pruned records are gone");
    assert_eq!(voters(&c), voters_before_restart, "a second whole-cluster restart keeps the voters");
}

/// `sacct`'s fields over real jobs, as Slurm 22.05 prints them (issue 45): a batch job that exits
/// 3, and one whose first step exits 2 while the script succeeds (its DerivedExitCode is the
/// step's), with their TRES, elapsed times and limits, the same before and after the jobs move
/// to the accounting store. Elapsed is checked for its form (`HH:MM:SS`), its value depends on
/// the machine.
#[test]
fn sacct_shows_exit_codes_tres_and_limits_as_slurm_does_before_and_after_archiving() {
    let c = TestCluster::up(&["--nodes", "1", "--gpus", "h100:2", "--min-job-age-s", "2"]);
    let sbatch = |args: &[&str]| -> u64 {
        let out = c.shim("sbatch", &[&["--parsable"], args].concat(), &[]);
        assert!(out.status.success(), "sbatch {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("job id from sbatch --parsable")
    };
    let three = sbatch(&["-J", "three", "-c", "2", "--mem=2G", "-t", "30", "--wrap", "exit 3"]);
    let script = "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH -t 1:00:00\n#SBATCH --mem=4G\nsrun sh -c 'exit 2'\nsrun true\nexit 0\n";
    std::fs::write(c.work.join("steps.sh"), script).expect("write script");
    let steps = sbatch(&["steps.sh"]);
    for id in [three, steps] {
        c.wait_final(id, Duration::from_secs(60));
    }
    let jobs = format!("{three},{steps}");
    let fields = "JobID,State,ExitCode,DerivedExitCode,ReqTRES,AllocTRES,Elapsed,Timelimit";
    // The table with each Elapsed checked and replaced by `E`.
    let table = || {
        let out = c.shim("sacct", &["-P", "-j", &jobs, "-o", fields], &[]);
        assert!(out.status.success(), "sacct: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut lines = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let mut cells: Vec<&str> = line.split('|').collect();
            if i > 0 {
                let elapsed = cells[6].as_bytes();
                let form =
                    elapsed.len() == 8 && elapsed.iter().enumerate().all(|(k, b)| if k % 3 == 2 { *b == b':' } else { b.is_ascii_digit() });
                assert!(form && cells[6] < "00:01:00", "Elapsed {:?} in {line}", cells[6]);
                cells[6] = "E";
            }
            lines.push(cells.join("|"));
        }
        lines
    };
    let job_tres = |cpus: u32, gpus: u32, mem: &str| {
        let gres = if gpus > 0 { format!("gres/gpu={gpus},") } else { String::new() };
        format!("billing={cpus},cpu={cpus},{gres}mem={mem},node=1")
    };
    let expected = vec![
        format!("{}", fields.replace(',', "|")),
        format!("{three}|FAILED|3:0|0:0|{t}|{t}|E|00:30:00", t = job_tres(2, 0, "2G")),
        format!("{three}.batch|FAILED|3:0|||cpu=2,mem=2G,node=1|E|"),
        format!("{three}.extern|COMPLETED|0:0|||{}|E|", job_tres(2, 0, "2G")),
        format!("{steps}|COMPLETED|0:0|2:0|{t}|{t}|E|01:00:00", t = job_tres(1, 1, "4G")),
        format!("{steps}.batch|COMPLETED|0:0|||cpu=1,gres/gpu=1,mem=4G,node=1|E|"),
        format!("{steps}.extern|COMPLETED|0:0|||{}|E|", job_tres(1, 1, "4G")),
        format!("{steps}.0|FAILED|2:0|||cpu=1,gres/gpu=1,mem=4G,node=1|E|"),
        format!("{steps}.1|COMPLETED|0:0|||cpu=1,gres/gpu=1,mem=4G,node=1|E|"),
    ];
    assert_eq!(table(), expected);
    // The command, in columns: the widths of Slurm's table (ExitCode 8, DerivedExitCode 15).
    let columns = || {
        let out = c.shim("sacct", &["-X", "-j", &jobs, "-o", "JobID,ExitCode,DerivedExitCode"], &[]);
        assert!(out.status.success(), "sacct: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let expected_columns = format!(
        "JobID        ExitCode DerivedExitCode \n------------ -------- --------------- \n{three:<12}      3:0             0:0 \n{steps:<12}      0:0             2:0 \n"
    );
    assert_eq!(columns(), expected_columns);
    let bad = c.shim("sacct", &["-j", &jobs, "-o", "JobID,Bogus"], &[]);
    assert_eq!(
        (bad.status.code(), String::from_utf8_lossy(&bad.stderr).into_owned()),
        (Some(1), "sacct: error: Invalid field requested: \"Bogus\"\n".to_string())
    );

    // Once they left the hot state (squeue no longer lists them), the store answers the same.
    wait_until("the jobs to move to the accounting store", Duration::from_secs(30), || {
        let squeue = c.shim("squeue", &["-h", "-t", "all", "-o", "%i"], &[]);
        squeue.status.success() && String::from_utf8_lossy(&squeue.stdout).trim().is_empty()
    });
    assert_eq!(table(), expected);
    assert_eq!(columns(), expected_columns);
}
