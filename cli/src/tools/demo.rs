//! `corral demo`: a 3-node local cluster running a mixed workload of real processes, with the
//! leader killed midway.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{ClientRequest, GresRequest, JobSpec, JobState, Reply};

use crate::client::Cluster;
use crate::tools::dev::{self, DevOptions};

fn job_spec(name: &str, gpus: u32, seconds: u32, workdir: &str) -> JobSpec {
    let script = format!(
        "#!/bin/sh\necho \"job $CORRAL_JOB_ID ({name}) on $CORRAL_NODE with GPUs $CUDA_VISIBLE_DEVICES\"\nsleep {seconds}\necho done\n"
    );
    let mut spec = JobSpec::command(vec![], workdir, &std::env::var("USER").unwrap_or_else(|_| "demo".into()));
    spec.name = name.to_string();
    spec.script = Some(script);
    spec.gres = Some(GresRequest { gpu_type: Some("h100".into()), count: gpus, ..Default::default() });
    spec.time_limit_ms = Some(120_000);
    spec.env = BTreeMap::from([("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string())]);
    spec.output = Some("out/%j.out".into());
    spec
}

async fn submit(cluster: &Cluster, spec: JobSpec) -> anyhow::Result<u64> {
    match cluster.call_patiently(ClientRequest::Submit { spec }, Duration::from_secs(15)).await? {
        Reply::Submitted { job } => Ok(job),
        other => bail!("unexpected reply {other:?}"),
    }
}

async fn leader(cluster: &Cluster) -> anyhow::Result<(String, u64)> {
    match cluster.call_patiently(ClientRequest::ClusterInfo, Duration::from_secs(15)).await? {
        Reply::Cluster(info) => Ok((info.leader.context("no leader")?, info.term)),
        other => bail!("unexpected reply {other:?}"),
    }
}

pub async fn run(dir: Option<PathBuf>) -> anyhow::Result<()> {
    let keep = dir.is_some();
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join(format!("corral-demo-{}", std::process::id())));
    let result = demo(&dir).await;
    if let Err(e) = dev::down(&dir) {
        eprintln!("stop the demo cluster: {e:#}");
    }
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn demo(dir: &std::path::Path) -> anyhow::Result<()> {
    println!("== starting a 3-node cluster (8 simulated H100 each) in {}", dir.display());
    // Voters replaced within the demo's run; a slower stop than the benchmarks' for its jobs.
    let opts = DevOptions { voter_replace_after_ms: 10_000, kill_grace_ms: 2_000, ..DevOptions::three_nodes() };
    let t0 = Instant::now();
    dev::up(dir, &opts).await?;
    println!("   up in {:.1} s", t0.elapsed().as_secs_f64());
    let work = dir.join("work");
    std::fs::create_dir_all(work.join("out")).context("create demo work directory")?;
    let workdir = work.display().to_string();
    let cluster = Cluster::connect(dir, None)?;

    // 24 GPUs in the cluster, 40 GPUs of work: some jobs must queue.
    let sizes = [8, 4, 2, 1, 1, 2, 4, 1, 8, 2, 1, 4, 1, 1];
    let mut jobs = Vec::new();
    for (i, gpus) in sizes.iter().enumerate() {
        let seconds = 2 + (i as u32 % 4);
        jobs.push(submit(&cluster, job_spec(&format!("train-{i}"), *gpus, seconds, &workdir)).await?);
    }
    println!("== submitted {} jobs asking for {} GPUs in all", jobs.len(), sizes.iter().sum::<u32>());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    print_queue(&cluster).await?;

    let (old_leader, old_term) = leader(&cluster).await?;
    println!("== SIGKILL of the leader {old_leader} (term {old_term})");
    dev::signal_node(dir, &old_leader, "KILL")?;
    let killed_at = Instant::now();
    let survivors = Cluster::connect(dir, None)?;
    let probe = submit(&survivors, job_spec("after-failover", 1, 1, &workdir)).await?;
    let failover = killed_at.elapsed();
    let (new_leader, new_term) = leader(&survivors).await?;
    println!("   new leader {new_leader} (term {new_term}) accepted job {probe} {:.0} ms after the kill", failover.as_secs_f64() * 1000.0);
    jobs.push(probe);
    println!("== restarting {old_leader} with its data");
    dev::start_one(dir, &old_leader)?;
    for i in 0..4 {
        jobs.push(submit(&survivors, job_spec(&format!("late-{i}"), 2, 1, &workdir)).await?);
    }

    let deadline = Instant::now() + Duration::from_secs(120);
    let finals = loop {
        let query = proto::JobQuery { ids: jobs.clone(), live: true, finished: true, history: true, brief: true, ..Default::default() };
        let all = survivors.query_jobs(query, Duration::from_secs(15)).await?;
        let ours: Vec<_> = all.into_iter().filter(|j| jobs.contains(&j.id)).collect();
        if ours.iter().all(|j| j.state.is_final()) {
            break ours;
        }
        if Instant::now() > deadline {
            bail!(
                "jobs still not finished after 120 s: {:?}",
                ours.iter().filter(|j| !j.state.is_final()).map(|j| j.id).collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let mut by_state: BTreeMap<JobState, usize> = BTreeMap::new();
    for j in &finals {
        *by_state.entry(j.state).or_default() += 1;
    }
    println!("== every job reached a final state");
    print_queue_all(&survivors, &jobs).await?;
    batch_with_a_step(dir, &survivors, &workdir).await?;
    println!("\nsummary");
    println!("  jobs:                {}", finals.len());
    for (state, n) in &by_state {
        println!("  {:<20} {n}", format!("{}:", state.as_str()));
    }
    println!("  failover:            {:.0} ms from SIGKILL of {old_leader} to a committed submission", failover.as_secs_f64() * 1000.0);
    println!("  leader:              {old_leader} (term {old_term}) -> {new_leader} (term {new_term})");
    if by_state.contains_key(&JobState::NodeFail) {
        println!("  NODE_FAIL jobs were running on {old_leader} when it was killed; their processes died with it.");
        println!("  (requeue from checkpoints is the multi-node/requeue feature; these jobs were not submitted with --requeue)");
    }
    let unexpected: Vec<_> = finals.iter().filter(|j| !matches!(j.state, JobState::Completed | JobState::NodeFail)).collect();
    if !unexpected.is_empty() {
        bail!("jobs ended unexpectedly: {:?}", unexpected.iter().map(|j| (j.id, j.state.as_str())).collect::<Vec<_>>());
    }
    Ok(())
}

/// A Slurm batch job over two nodes: its script runs on the first, and its `srun` step starts a
/// task on each node through their agents. While the step runs, both nodes' daemons are upgraded
/// in turn (each hands its runs over and a new one takes them); then the tasks finish. Prints
/// the job's output.
async fn batch_with_a_step(dir: &std::path::Path, cluster: &Cluster, workdir: &str) -> anyhow::Result<()> {
    let corral = std::env::current_exe().context("find the corral executable")?;
    let mut spec = job_spec("batch-with-step", 2, 0, workdir);
    spec.nodes = 2;
    spec.ntasks_per_node = 2;
    spec.script = Some(format!(
        "#!/bin/sh\necho \"script on $SLURMD_NODENAME\"\n'{}' slurm srun -l sh -c 'echo \"task $SLURM_PROCID of $SLURM_NTASKS on $SLURMD_NODENAME, GPUs $CUDA_VISIBLE_DEVICES, pid $$\"; while [ ! -e upgraded-$SLURM_JOB_ID ]; do sleep 0.1; done; echo \"task $SLURM_PROCID still running after the upgrades, pid $$\"'\n",
        corral.display()
    ));
    spec.set_batch(true);
    println!("== a Slurm batch job on 2 nodes: the script runs on the first, its srun step on both");
    let id = submit(cluster, spec).await?;
    let out_path = std::path::Path::new(workdir).join(format!("out/{id}.out"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let nodes = loop {
        let out = std::fs::read_to_string(&out_path).unwrap_or_default();
        if let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job: id }, Duration::from_secs(15)).await? {
            if out.matches(" pid ").count() >= 4 && j.state == JobState::Running {
                break j.last_nodes.clone();
            }
            if j.state.is_final() {
                bail!("batch job {id} ended before its step ran: {}", j.state.as_str());
            }
        }
        if Instant::now() > deadline {
            bail!("the step of batch job {id} did not start within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let Reply::Nodes(list) = cluster.call_patiently(ClientRequest::ListNodes, Duration::from_secs(15)).await? else {
        bail!("unexpected reply")
    };
    for node in nodes.iter().filter_map(|n| list.iter().find(|x| x.id == *n).map(|x| x.name.clone())) {
        let log_path = dir.join(&node).join("corrald.log");
        let took = |log: &str| log.matches("first heartbeat acknowledged since the take-over").count();
        let seen = took(&std::fs::read_to_string(&log_path).unwrap_or_default());
        let started = Instant::now();
        dev::signal_node(dir, &node, "USR2")?;
        dev::start_one(dir, &node)?;
        while took(&std::fs::read_to_string(&log_path).unwrap_or_default()) == seen {
            if started.elapsed() > Duration::from_secs(30) {
                bail!("{node} did not take its runs over within 30 s (see {})", log_path.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        println!(
            "   rolling upgrade of {node}: its corrald handed its runs over (SIGUSR2) and a new one took them in {:.0} ms",
            started.elapsed().as_secs_f64() * 1000.0
        );
    }
    std::fs::write(std::path::Path::new(workdir).join(format!("upgraded-{id}")), b"").context("write the step's go file")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let job = loop {
        if let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job: id }, Duration::from_secs(15)).await? {
            if j.state.is_final() {
                break j;
            }
        }
        if Instant::now() > deadline {
            bail!("batch job {id} not finished after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let out = std::fs::read_to_string(&out_path).unwrap_or_default();
    println!("   job {id} {} (run {}, restarted {} times):", job.state.as_str(), job.run, job.restart_count);
    for line in out.lines() {
        println!("     {line}");
    }
    if job.state != JobState::Completed || job.run != 1 {
        bail!("batch job {id} should have completed in its first run through the upgrades: {} run {}", job.state.as_str(), job.run);
    }
    Ok(())
}

async fn print_queue(cluster: &Cluster) -> anyhow::Result<()> {
    let jobs = cluster.query_jobs(proto::JobQuery { live: true, brief: true, ..Default::default() }, Duration::from_secs(15)).await?;
    let running = jobs.iter().filter(|j| j.state == JobState::Running).count();
    let pending = jobs.iter().filter(|j| j.state == JobState::Pending).count();
    println!("   queue: {running} running, {pending} pending");
    for j in jobs.iter().filter(|j| j.state == JobState::Pending).take(3) {
        println!("     job {:>3} pending: {}", j.id, j.reasons.join("; "));
    }
    Ok(())
}

async fn print_queue_all(cluster: &Cluster, ids: &[u64]) -> anyhow::Result<()> {
    let query = proto::JobQuery { ids: ids.to_vec(), live: true, finished: true, history: true, brief: true, ..Default::default() };
    let jobs = cluster.query_jobs(query, Duration::from_secs(15)).await?;
    let Reply::Nodes(nodes) = cluster.call_patiently(ClientRequest::ListNodes, Duration::from_secs(15)).await? else {
        bail!("unexpected reply")
    };
    let names: BTreeMap<u64, String> = nodes.into_iter().map(|n| (n.id, n.name)).collect();
    println!("  {:>4} {:<16} {:<10} {:<5} {:<5} {:>7}", "JOB", "NAME", "STATE", "NODE", "GPUS", "RUN(s)");
    for j in jobs.iter().filter(|j| ids.contains(&j.id)) {
        let secs = match (j.start_ms, j.end_ms) {
            (Some(s), Some(e)) => format!("{:.1}", e.saturating_sub(s) as f64 / 1000.0),
            _ => "-".into(),
        };
        let node = j.last_nodes.iter().map(|n| names.get(n).cloned().unwrap_or_default()).collect::<Vec<_>>().join(",");
        println!("  {:>4} {:<16} {:<10} {:<5} {:<5} {:>7}", j.id, j.spec.name, j.state.as_str(), node, j.spec.gpus(), secs);
    }
    Ok(())
}
