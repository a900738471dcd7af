//! `corral bench` by default: a local 3-node cluster measured against this machine's
//! fdatasync, the floor under any durable commit: submissions from 1, 16 and 256 clients,
//! submit-to-running, leader failovers, `srun` step round trips, hand-overs of a running job's
//! node, and requeues after its node is killed. Prints figures; asserts nothing about speed.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use proto::{ClientRequest, GresRequest, JobSpec, Reply};

use crate::client::Cluster;
use crate::tools::dev;

use super::setup::cancel_all;
use super::stats::{percentile, sorted};
use super::BenchArgs;
use crate::tools::dev::DevOptions;

/// Runs the benchmark on a cluster in `args.dir` (default: a temporary directory, removed at
/// the end), and stops the cluster.
pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let keep = args.dir.is_some();
    let dir = args.dir.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("corral-bench-{}", std::process::id())));
    let result = bench(&dir, args).await;
    if let Err(e) = dev::down(&dir) {
        eprintln!("stop the bench cluster: {e:#}");
    }
    if !keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// fdatasync latency of a 4 KiB append in `dir`, in ms.
fn fdatasync_ms(dir: &std::path::Path, samples: usize) -> anyhow::Result<Vec<f64>> {
    let path = dir.join("fdatasync.probe");
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).with_context(|| format!("open {}", path.display()))?;
    let block = [0u8; 4096];
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        f.write_all(&block).context("write probe block")?;
        let t = Instant::now();
        f.sync_data().context("fdatasync probe file")?;
        out.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let _ = std::fs::remove_file(&path);
    Ok(out)
}

/// A job submitted held (`--hold`): it pends and holds nothing.
fn held_spec(workdir: &str) -> JobSpec {
    let mut spec = JobSpec::command(vec!["true".into()], workdir, "bench");
    spec.name = "bench-held".into();
    spec.gres = Some(GresRequest { gpu_type: None, count: 1, ..Default::default() });
    spec.mem_mib = 256;
    spec.output = Some("/dev/null".into());
    spec.hold = true;
    spec
}

/// A one-GPU job of an hour that waits while [`blocker_spec`] holds every GPU (Slurm's reason
/// `Resources`): every scheduling pass weighs each one.
fn queued_spec(workdir: &str) -> JobSpec {
    JobSpec { name: "bench-queued".into(), hold: false, time_limit_ms: Some(3_600_000), ..held_spec(workdir) }
}

fn run_spec(workdir: &str) -> JobSpec {
    JobSpec { name: "bench-run".into(), hold: false, ..held_spec(workdir) }
}

/// Every GPU of [`DevOptions::three_nodes`] for a day: the queue behind it waits for resources, and the
/// first queued job gets the backfill reservation at its end.
fn blocker_spec(workdir: &str) -> JobSpec {
    let mut spec = JobSpec::command(vec!["sleep".into(), "86400".into()], workdir, "bench");
    spec.name = "bench-blocker".into();
    spec.nodes = 3;
    spec.gres = Some(GresRequest { gpu_type: None, count: 8, ..Default::default() });
    spec.mem_mib = 256;
    spec.time_limit_ms = Some(86_400_000);
    spec.output = Some("/dev/null".into());
    spec
}

/// Submits the blocker and waits until it runs; returns its id.
async fn start_blocker(cluster: &Cluster, workdir: &str) -> anyhow::Result<u64> {
    let id = submit(cluster, blocker_spec(workdir)).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job: id }, Duration::from_secs(10)).await? {
            if j.state == proto::JobState::Running {
                return Ok(id);
            }
            anyhow::ensure!(!j.state.is_final(), "the blocker job {id} ended {:?} before running", j.state);
        }
        anyhow::ensure!(Instant::now() < deadline, "the blocker job {id} did not run within 30 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// committed, for a client asking a surviving voter and, at the same time, for a fresh client
/// (a new `corral` process would be one) that tries the dead node first. Both sorted.
async fn failovers(dir: &std::path::Path, workdir: &str, rounds: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut survivor_ms = Vec::new();
    let mut fresh_ms = Vec::new();
    // A kill that missed the leader (leadership moved between the query and the kill) measures
    // nothing and is not counted; the rounds are bounded all the same.
    for round in 0..rounds.saturating_mul(2) {
        if survivor_ms.len() == rounds {
            break;
        }
        let info = voters_caught_up(dir, 3, Duration::from_secs(20)).await?;
        let leader = info.leader.clone().context("no leader")?;
        let dead = info.members.iter().find(|m| m.name == leader).context("the leader's address")?.addr.clone();
        let survivor =
            info.members.iter().find(|m| m.name != leader && m.role != proto::NodeRole::Agent).context("a surviving voter")?.addr.clone();
        let mut dead_first = vec![dead.clone()];
        dead_first.extend(info.members.iter().filter(|m| m.name != leader).map(|m| m.addr.clone()));
        let (via_survivor, fresh) = (Cluster::connect(dir, Some(&survivor))?, Cluster::connect_to(dir, Some(dead_first))?);
        // Both clients have a connection to their first node before the kill, as a client
        // that just submitted would.
        let before = via_survivor.call_patiently(ClientRequest::ClusterInfo, Duration::from_secs(20)).await?;
        let Reply::Cluster(before) = before else { bail!("unexpected reply {before:?}") };
        if before.leader.as_deref() != Some(leader.as_str()) {
            // Leadership moved since the voters were asked: ask again.
            continue;
        }
        let before_term = before.term;
        dev::signal_node(dir, &leader, "KILL")?;
        let t = Instant::now();
        let (a, b) = tokio::join!(async { submit(&via_survivor, held_spec(workdir)).await.map(|_| t.elapsed()) }, async {
            submit(&fresh, held_spec(workdir)).await.map(|_| t.elapsed())
        });
        let (a, b) = (a?.as_secs_f64() * 1000.0, b?.as_secs_f64() * 1000.0);
        let after = via_survivor.call_patiently(ClientRequest::ClusterInfo, Duration::from_secs(20)).await?;
        if !matches!(&after, Reply::Cluster(c) if c.term > before_term) {
            println!("  round {}: {leader} no longer led at the kill (no new term after term {before_term}): not counted", round + 1);
        } else {
            survivor_ms.push(a);
            fresh_ms.push(b);
            println!("  failover {}: killed {leader}, a submission through a survivor committed after {a:.0} ms, a fresh client's (dead node first) after {b:.0} ms", survivor_ms.len());
        }
        dev::start_one(dir, &leader)?;
        dev::wait_ready(dir, 3, Duration::from_secs(60)).await?;
    }
    Ok((sorted(survivor_ms), sorted(fresh_ms)))
}

/// Waits until the cluster has `voters` voters and each has applied the log up to the leader's
/// commit index: a failover measured on a steady cluster. Right after `dev up` or a restart the
/// last voter may not be promoted yet (killing the leader of two voters leaves no quorum), or
/// may hold no log yet (killing the leader then also measures its catching up).
async fn voters_caught_up(dir: &std::path::Path, voters: usize, patience: Duration) -> anyhow::Result<proto::ClusterInfo> {
    let (cluster, started) = (Cluster::connect(dir, None)?, Instant::now());
    loop {
        let Reply::Cluster(info) = cluster.call_patiently(ClientRequest::ClusterInfo, patience).await? else { bail!("unexpected reply") };
        let members: Vec<&proto::ClusterMember> = info.members.iter().filter(|m| m.role != proto::NodeRole::Agent).collect();
        let mut behind = Vec::new();
        if members.len() == voters && info.leader.is_some() {
            for member in members {
                let one = Cluster::connect(dir, Some(&member.addr))?;
                let Reply::Cluster(seen) = one.call_patiently(ClientRequest::ClusterInfo, patience).await? else {
                    bail!("unexpected reply")
                };
                if seen.applied_index < info.commit_index {
                    behind.push(format!("{} applied {} of {}", member.name, seen.applied_index, info.commit_index));
                }
            }
            if behind.is_empty() {
                return Ok(info);
            }
        } else {
            behind.push(format!("{} of {voters} voters", members.len()));
        }
        anyhow::ensure!(started.elapsed() < patience, "the cluster is not steady after {} s: {}", patience.as_secs(), behind.join(", "));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn print_failovers(failovers: &[f64], client_view: &[f64]) {
    println!(
        "failover ({} SIGKILLs of the leader): p50 {:.0} ms  p99 {:.0} ms",
        failovers.len(),
        percentile(failovers, 0.5),
        percentile(failovers, 0.99)
    );
    println!(
        "  a fresh client trying the dead node first, from the kill: p50 {:.0} ms  p99 {:.0} ms",
        percentile(client_view, 0.5),
        percentile(client_view, 0.99)
    );
}

/// Submissions/s of `total` queued jobs from `clients` concurrent tasks, and their ids.
async fn concurrent_submits(cluster: &Arc<Cluster>, workdir: &str, clients: usize, total: usize) -> anyhow::Result<(f64, Vec<u64>)> {
    let t = Instant::now();
    let per = total.div_ceil(clients);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let cluster = Arc::clone(cluster);
        let spec = queued_spec(workdir);
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::with_capacity(per);
            for _ in 0..per {
                ids.push(submit(&cluster, spec.clone()).await?);
            }
            Ok::<_, anyhow::Error>(ids)
        }));
    }
    let mut ids = Vec::with_capacity(per * clients);
    for task in tasks {
        ids.extend(task.await.context("join submitter")??);
    }
    Ok((ids.len() as f64 / t.elapsed().as_secs_f64(), ids))
}

async fn submit(cluster: &Cluster, spec: JobSpec) -> anyhow::Result<u64> {
    match cluster.call_patiently(ClientRequest::Submit { spec }, Duration::from_secs(20)).await? {
        Reply::Submitted { job } => Ok(job),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// Submissions behind the blocker: one client in sequence (its rate, and its latency p50
/// against `sync_p50`), then 16 and 256 concurrent clients; returns the sequential rate, its
/// latency p50 and every job queued.
async fn submission_rates(cluster: &Arc<Cluster>, workdir: &str, args: &BenchArgs, sync_p50: f64) -> anyhow::Result<(f64, f64, Vec<u64>)> {
    let mut queued = Vec::new();
    // One client, sequential.
    let mut lat = Vec::with_capacity(args.submits);
    let t = Instant::now();
    for _ in 0..args.submits {
        let s = Instant::now();
        queued.push(submit(cluster, queued_spec(workdir)).await?);
        lat.push(s.elapsed().as_secs_f64() * 1000.0);
    }
    let seq_rate = args.submits as f64 / t.elapsed().as_secs_f64();
    let lat = sorted(lat);
    let p50 = percentile(&lat, 0.5);
    println!(
        "submit, 1 client: {} in {:.2} s = {:.0}/s; latency p50 {:.2} ms p99 {:.2} ms; p50 / fdatasync p50 = {:.2}x",
        args.submits,
        t.elapsed().as_secs_f64(),
        seq_rate,
        p50,
        percentile(&lat, 0.99),
        p50 / sync_p50
    );
    // 16 and 256 concurrent in-process clients (tasks sharing one connection, as one
    // program's threads would).
    for clients in [16usize, 256] {
        let total = args.concurrent_submits.max(clients * 8);
        let (rate, ids) = concurrent_submits(cluster, workdir, clients, total).await?;
        println!("submit, {clients} concurrent clients: {total} = {rate:.0}/s ({} jobs queued before)", queued.len());
        queued.extend(ids);
    }
    if let Some(&last) = queued.last() {
        match cluster.call_patiently(ClientRequest::GetJob { job: last }, Duration::from_secs(20)).await? {
            Reply::Job(j) => println!("the last queued job: {:?}, {}", j.state, j.reason().unwrap_or("no reason")),
            other => bail!("unexpected reply {other:?}"),
        }
    }
    Ok((seq_rate, p50, queued))
}

async fn bench(dir: &std::path::Path, args: &BenchArgs) -> anyhow::Result<()> {
    let opts = DevOptions::three_nodes();
    dev::up(dir, &opts).await?;
    let workdir = dir.display().to_string();
    if args.only_requeue {
        return requeue_after_kill(dir, &workdir, args.requeue_kills, opts.node_down_after_ms).await;
    }
    if args.only_steps {
        return step_round_trips(dir, &workdir, args.steps).await;
    }
    if args.only_handover {
        return handovers(dir, &workdir, args.handovers).await;
    }
    if args.only_failover {
        let (failovers, client_view) = failovers(dir, &workdir, args.failovers).await?;
        print_failovers(&failovers, &client_view);
        return Ok(());
    }
    let sync = sorted(fdatasync_ms(dir, 200)?);
    let sync_p50 = percentile(&sync, 0.5);
    println!("fdatasync (4 KiB, {} samples): p50 {:.3} ms  p99 {:.3} ms", sync.len(), sync_p50, percentile(&sync, 0.99));

    let cluster = Arc::new(Cluster::connect(dir, None)?);
    // Every submission below waits for a GPU behind the blocker, as in a busy cluster.
    let blocker = start_blocker(&cluster, &workdir).await?;
    let (seq_rate, p50, queued) = submission_rates(&cluster, &workdir, args, sync_p50).await?;
    if args.only_submits {
        return Ok(());
    }
    let t = Instant::now();
    let count = queued.len();
    cancel_all(&cluster, queued, 64, Duration::from_secs(20)).await?;
    cancel_all(&cluster, vec![blocker], 1, Duration::from_secs(20)).await?;
    println!("cancelled the {count} queued jobs and the blocker in {:.1} s", t.elapsed().as_secs_f64());

    // Submit to RUNNING (launch confirmed by the agent), from the leader's own timestamps.
    let mut starts = Vec::new();
    for _ in 0..args.latency_samples {
        let id = submit(&cluster, run_spec(&workdir)).await?;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job: id }, Duration::from_secs(10)).await? {
                if (j.state == proto::JobState::Running && j.launches_pending().count() == 0) || j.state.is_final() {
                    if let Some(start) = j.start_ms {
                        starts.push(start.saturating_sub(j.submit_ms) as f64);
                    }
                    break;
                }
            }
            if Instant::now() > deadline {
                bail!("job {id} did not start within 20 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let starts = sorted(starts);
    println!(
        "submit to RUNNING ({} samples): p50 {:.0} ms  p99 {:.0} ms",
        starts.len(),
        percentile(&starts, 0.5),
        percentile(&starts, 0.99)
    );

    let (failovers, client_view) = failovers(dir, &workdir, args.failovers).await?;
    print_failovers(&failovers, &client_view);
    requeue_after_kill(dir, &workdir, args.requeue_kills, opts.node_down_after_ms).await?;
    step_round_trips(dir, &workdir, args.steps).await?;
    handovers(dir, &workdir, args.handovers).await?;
    println!(
        "SUMMARY fdatasync_p50_ms={sync_p50:.3} submit_seq_per_s={seq_rate:.0} submit_p50_ms={p50:.2} submit_p50_over_fdatasync={:.2} submit_to_running_p50_ms={:.0} failover_p50_ms={:.0} failover_p99_ms={:.0}",
        p50 / sync_p50,
        percentile(&starts, 0.5),
        percentile(&failovers, 0.5),
        percentile(&failovers, 0.99)
    );
    Ok(())
}

/// `srun -N2 true` inside a 2-node batch job, timed by the script `samples` times, against the
/// peers measured by the same script in the same run: `true` started by the shell (a process
/// start, the floor) and the `srun` binary alone (`--version`: its own start-up).
async fn step_round_trips(dir: &std::path::Path, workdir: &str, samples: usize) -> anyhow::Result<()> {
    let cluster = Cluster::connect(dir, None)?;
    let corral = std::env::current_exe().context("find the corral executable")?;
    let corral = corral.display();
    let script = format!(
        "#!/bin/sh\ni=0\nwhile [ $i -lt {samples} ]; do\n\
         a=$(date +%s%N); sh -c true; b=$(date +%s%N); echo \"local $((b-a))\"\n\
         a=$(date +%s%N); '{corral}' slurm srun --version >/dev/null; b=$(date +%s%N); echo \"startup $((b-a))\"\n\
         a=$(date +%s%N); '{corral}' slurm srun -N2 true; b=$(date +%s%N); echo \"step $((b-a)) $?\"\n\
         i=$((i+1))\ndone\n"
    );
    let mut spec = JobSpec::command(Vec::new(), workdir, "bench");
    spec.name = "bench-steps".into();
    spec.script = Some(script);
    spec.nodes = 2;
    // Where the memory limit is enforced (cgroup v1 here), 1 MiB kills the holder at once.
    spec.mem_mib = 256;
    spec.output = Some("bench-steps-%j.out".into());
    spec.set_batch(true);
    let job = submit(&cluster, spec).await?;
    let deadline = Instant::now() + Duration::from_secs(60 + 10 * samples as u64);
    let state = loop {
        if let Reply::Job(j) = cluster.call_patiently(ClientRequest::GetJob { job }, Duration::from_secs(10)).await? {
            if j.state.is_final() {
                break j.state;
            }
        }
        if Instant::now() > deadline {
            bail!("the step benchmark job {job} did not finish");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let out_path = std::path::Path::new(workdir).join(format!("bench-steps-{job}.out"));
    let out = std::fs::read_to_string(&out_path).with_context(|| format!("read {}", out_path.display()))?;
    if state != proto::JobState::Completed || out.lines().any(|l| l.starts_with("step ") && !l.ends_with(" 0")) {
        bail!("the step benchmark job {job} ended {state:?}:\n{out}");
    }
    let series = |kind: &str| {
        sorted(
            out.lines().filter_map(|l| l.strip_prefix(kind)?.split_whitespace().next()?.parse::<f64>().ok()).map(|ns| ns / 1e6).collect(),
        )
    };
    let (local, startup, step) = (series("local "), series("startup "), series("step "));
    let (lp, sp, tp) = (percentile(&local, 0.5), percentile(&startup, 0.5), percentile(&step, 0.5));
    println!("srun step on 2 nodes ({} samples, inside a batch job): p50 {tp:.1} ms  p99 {:.1} ms", step.len(), percentile(&step, 0.99));
    println!("  peers in the same script: a process start p50 {lp:.1} ms; the srun binary alone p50 {sp:.1} ms");
    println!("SUMMARY step_p50_ms={tp:.1} step_over_process_start={:.1} step_minus_srun_startup_p50_ms={:.1}", tp / lp, tp - sp);
    Ok(())
}

/// Whether `job` runs `run` with every part confirmed started.
async fn running_confirmed(cluster: &Cluster, job: u64, run: u32) -> anyhow::Result<Option<proto::Job>> {
    match cluster.call_patiently(ClientRequest::GetJob { job }, Duration::from_secs(10)).await? {
        Reply::Job(j) if j.run == run && j.state == proto::JobState::Running && j.launches_pending().next().is_none() => Ok(Some(*j)),
        _ => Ok(None),
    }
}

/// Submits a job holding a whole node (8 GPUs) that runs `argv`, waits until it runs (every part
/// confirmed), and returns it with its node's name.
async fn start_whole_node_job(
    cluster: &Cluster,
    workdir: &str,
    name: &str,
    argv: &[&str],
    requeue: bool,
) -> anyhow::Result<(proto::Job, String)> {
    let mut spec = run_spec(workdir);
    spec.name = name.into();
    spec.argv = argv.iter().map(|a| a.to_string()).collect();
    spec.requeue = requeue;
    spec.gres = Some(GresRequest { gpu_type: None, count: 8, ..Default::default() });
    let id = submit(cluster, spec).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let job = loop {
        if let Some(j) = running_confirmed(cluster, id, 1).await? {
            break j;
        }
        if Instant::now() > deadline {
            bail!("job {id} did not start");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let Reply::Nodes(nodes) = cluster.call_patiently(ClientRequest::ListNodes, Duration::from_secs(10)).await? else {
        bail!("unexpected reply")
    };
    let node = job.last_nodes.first().and_then(|n| nodes.iter().find(|x| x.id == *n)).map(|n| n.name.clone()).context("job node")?;
    Ok((job, node))
}

/// Hands the runs of a running job's node over `rounds` times (SIGUSR2, then the daemon started
/// again, as systemd does): the job must keep its run, and the new daemon's log says how long the
/// node was silent to the leader (its first acknowledgement after the take-over) against
/// `fence_after_ms`, past which the jobs would have been killed.
async fn handovers(dir: &std::path::Path, workdir: &str, rounds: usize) -> anyhow::Result<()> {
    let cluster = Cluster::connect(dir, None)?;
    let (job, node) = start_whole_node_job(&cluster, workdir, "bench-handover", &["sleep", "3600"], false).await?;
    let id = job.id;
    let log_path = dir.join(&node).join("corrald.log");
    let mut silent = Vec::new();
    let mut fence_after_ms = 0;
    for round in 0..rounds {
        let seen =
            std::fs::read_to_string(&log_path).unwrap_or_default().matches("first heartbeat acknowledged since the take-over").count();
        let started = Instant::now();
        dev::signal_node(dir, &node, "USR2")?;
        dev::start_one(dir, &node)?;
        let line = loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(line) = log.lines().filter(|l| l.contains("first heartbeat acknowledged since the take-over")).nth(seen) {
                break line.to_string();
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("{node} did not take its runs over within 30 s (see {})", log_path.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let cycle_ms = started.elapsed().as_secs_f64() * 1000.0;
        let field = |name: &str| -> Option<u64> { line.split_whitespace().find_map(|w| w.strip_prefix(name)?.parse().ok()) };
        let ms = field("silent_ms=").context("no silent_ms in the take-over line")?;
        fence_after_ms = field("fence_after_ms=").unwrap_or(0);
        let j = running_confirmed(&cluster, id, 1)
            .await?
            .with_context(|| format!("job {id} did not keep its run through hand-over {}", round + 1))?;
        println!(
            "  hand-over {}: {node} silent {ms} ms, job {id} still run {} (SIGUSR2 to the new daemon's first acknowledgement {cycle_ms:.0} ms)",
            round + 1,
            j.run
        );
        silent.push(ms as f64);
    }
    cluster.call_patiently(ClientRequest::Cancel { job: id }, Duration::from_secs(10)).await?;
    let silent = sorted(silent);
    println!(
        "hand-over of a node's runs to a new daemon ({} rounds): silent to the leader p50 {:.0} ms  p99 {:.0} ms  against a lease of fence_after_ms={fence_after_ms} (ratio {:.2}); the job never restarted",
        silent.len(),
        percentile(&silent, 0.5),
        percentile(&silent, 0.99),
        percentile(&silent, 0.99) / fence_after_ms.max(1) as f64
    );
    Ok(())
}

/// SIGKILL the node of a `--requeue` job, time until the job runs again (all parts confirmed
/// started) on another node; `kills` times. Slurm's defaults for the same: 300 s to notice the
/// node plus a 120 s requeue delay.
async fn requeue_after_kill(dir: &std::path::Path, workdir: &str, kills: usize, node_down_after_ms: u64) -> anyhow::Result<()> {
    let cluster = Cluster::connect(dir, None)?;
    let mut took = Vec::new();
    for round in 0..kills {
        let (job, victim) = start_whole_node_job(&cluster, workdir, "bench-requeue", &["sleep", "600"], true).await?;
        let id = job.id;
        dev::signal_node(dir, &victim, "KILL")?;
        let killed = Instant::now();
        let fresh = Cluster::connect(dir, None)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if running_confirmed(&fresh, id, 2).await?.is_some() {
                break;
            }
            if Instant::now() > deadline {
                bail!("job {id} did not run again within 60 s of killing {victim}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let ms = killed.elapsed().as_secs_f64() * 1000.0;
        println!("  requeue {}: killed {victim}, job {id} running again elsewhere after {ms:.0} ms", round + 1);
        took.push(ms);
        fresh.call_patiently(ClientRequest::Cancel { job: id }, Duration::from_secs(10)).await?;
        dev::start_one(dir, &victim)?;
        dev::wait_ready(dir, 3, Duration::from_secs(60)).await?;
    }
    let took = sorted(took);
    println!(
        "requeue after SIGKILL of the node ({} kills, node_down_after_ms={node_down_after_ms}): p50 {:.0} ms  p99 {:.0} ms  (Slurm defaults: 300 s to notice + 120 s requeue delay = 420000 ms; ratio {:.0}x)",
        took.len(),
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        420_000.0 / percentile(&took, 0.5)
    );
    Ok(())
}
