//! Steps of a run (`srun` within a job): numbering, holding their share of the job, starting
//! their tasks through the run's shepherd, their output, stdin, signals, usage and their ends.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use proto::{ApiError, JobId, LogStream, PeerRequest, Reply, Response, RunNo};
use tracing::{debug, info, warn};

use super::{lock, owner_may, Agent, HeldStep, NumberedStep, Running};
use crate::link::{LeaderLink, LinkError};
use crate::run::launcher;
use crate::run::shepherd;
use crate::run::step::Step;

impl Agent {
    /// Whether this node holds `job` suspended (no step starts in it meanwhile).
    fn suspended_here(r: &Running) -> bool {
        r.pause_tx.borrow().suspended
    }

    /// Whether `job`'s batch script (or its command, without one) runs here: where its steps are
    /// numbered.
    pub fn runs_script_of(&self, job: JobId) -> bool {
        lock(&self.running).get(&job).is_some_and(|r| !r.hold)
    }

    /// Numbers a new step of `job`, which must run here (the batch script's node asks), for
    /// `user` (none: an admin or a node): its run and number, the run's nodes and the job's port.
    pub fn number_step(&self, job: JobId, user: Option<&str>) -> Result<NumberedStep, ApiError> {
        let mut running = lock(&self.running);
        let r = running.get_mut(&job).ok_or_else(|| ApiError::NotFound(format!("job {job} does not run on {}", self.name)))?;
        owner_may(user, &r.owner, job)?;
        if r.hold {
            // Steps are numbered where the script runs; a second counter would reuse numbers.
            return Err(ApiError::Invalid(format!("job {job}'s steps start from its batch script's node, not {}", self.name)));
        }
        let step = r.next_step;
        r.next_step = r.next_step.checked_add(1).ok_or_else(|| ApiError::Unavailable("out of step numbers".into()))?;
        let master_port = r.base.env.get("MASTER_PORT").and_then(|p| p.parse().ok());
        Ok(NumberedStep { run: r.run, step, nodes: r.nodes.clone(), master_port })
    }

    /// Gives back step number `step` of `job` if it is the last one numbered (a step that was
    /// not started, so that one waiting for its GPUs does not use up numbers while it waits).
    pub fn unnumber_step(&self, job: JobId, step: u32) {
        if let Some(r) = lock(&self.running).get_mut(&job) {
            if r.next_step == step.saturating_add(1) {
                r.next_step = step;
            }
        }
    }

    /// Starts this node's tasks of step `step` of `job` run `run` through the run's shepherd,
    /// each in its own process group in the run's cgroup as the job's user, and follows their
    /// output in the shepherd's log. Idempotent: a step that exists already is left alone.
    pub async fn start_step(self: &Arc<Self>, job: JobId, run: RunNo, step: u32, spec: &proto::StepSpec, user: Option<&str>) -> Response {
        spec.validate().map_err(ApiError::Invalid)?;
        let Some(node_index) = spec.nodes.iter().position(|n| n.name == self.name) else {
            return Err(ApiError::Invalid(format!("step {job}.{step} has no tasks on {}", self.name)));
        };
        self.takes_new_work()?;
        let ranks = &spec.nodes[node_index].ranks;
        let (base, groups, handle, grant, job_gpus, run_cgroup) = {
            let mut running = lock(&self.running);
            let r = self.owned_run(&mut running, job, run, user)?;
            if r.pgid == 0 {
                return Err(ApiError::Unavailable(format!("job {job} has not started on {} yet", self.name)));
            }
            if r.steps.contains_key(&step) {
                return Ok(Reply::Ok);
            }
            if Self::suspended_here(r) {
                return Err(ApiError::Busy(proto::STEPS_DISABLED_SUSPENDED.into()));
            }
            if r.steps.len() >= proto::limits::STEPS_PER_JOB_MAX {
                return Err(ApiError::Unavailable(format!("job {job} has {} steps on {}", r.steps.len(), self.name)));
            }
            let grant = grant_here(r, job, step, spec, ranks.len() as u32, &self.name)?;
            if let Some(held) = r.step_holds.get_mut(&step) {
                held.started = true;
            }
            let handle = Step::new(job, run, step, ranks.len());
            r.steps.insert(step, Arc::clone(&handle));
            (Arc::clone(&r.base), Arc::clone(&r.tasks), handle, grant, r.gpus.clone(), r.cgroup.clone())
        };
        let step_cgroups = self.step_cgroups(job, step, &base.env, &grant, &job_gpus, run_cgroup.as_deref());
        let gpus: Option<Vec<usize>> = grant.gpus.as_ref().map(|g| g.iter().map(|p| *p as usize).collect());
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, run);
        let workdir = spec.workdir.as_ref().map_or_else(|| base.workdir.clone(), PathBuf::from);
        let readers: Vec<u32> = ranks.iter().copied().filter(|r| spec.stdin.reaches(*r)).collect();
        let fed = !readers.is_empty() && self.stdin_feeds.open(job, step, dir.clone(), readers);
        for (local, rank) in ranks.iter().enumerate() {
            let mut env = slurm_compat::env::step_task_env(
                &base.env,
                &spec.env,
                step,
                node_index,
                ranks,
                local,
                slurm_compat::env::TaskGpus { per_task: spec.gpus_per_task, step: gpus.as_deref() },
            );
            // The step's CPUs here, as Slurm's step sees them.
            env.insert("SLURM_CPUS_ON_NODE".into(), grant.cpus.to_string());
            let request = shepherd::TaskRequest {
                step,
                rank: *rank,
                tasks: ranks.len() as u32,
                program: PathBuf::from(&spec.argv[0]),
                args: spec.argv[1..].to_vec(),
                env,
                workdir: workdir.clone(),
                run_as: base.run_as.clone(),
                node: self.name.clone(),
                mounts: base.mounts.clone(),
                stdin: fed && spec.stdin.reaches(*rank),
                pty: spec.pty.filter(|_| *rank == 0),
                cgroups: step_cgroups.clone(),
            };
            match shepherd::spawn_task(&dir, &request).await {
                Ok((pgid, start_ticks)) if pgid > 1 => {
                    if !groups.add(pgid, start_ticks) {
                        info!(job, step, rank, "step task started as its run ended: killed");
                    }
                }
                Ok(_) => warn!(job, step, rank, "step task failed to start (its error is in the step's output)"),
                Err(e) => {
                    // The run's shepherd is gone (the run is ending): the task never started.
                    warn!(job, step, rank, error = format!("{e:#}"), "step task not started");
                    handle.push(
                        *rank,
                        LogStream::Stderr,
                        format!("slurmstepd-{}: error: task {rank} not started: {e:#}\n", self.name).into_bytes(),
                    );
                    handle.task_ended(proto::TaskExit { rank: *rank, code: Some(1), signal: None });
                }
            }
        }
        self.renew_lease();
        match shepherd::tail_step(&dir, step, 0).await {
            Ok(conn) => handle.follow(conn, Arc::clone(&groups)),
            Err(e) => {
                warn!(job, step, error = format!("{e:#}"), "follow the step's output");
                handle.stop_following();
            }
        }
        record_grant(&dir, job, step, &grant);
        self.limit_step_time(&handle, groups, spec.time_limit_ms, ranks.first().copied());
        self.report_step_end(&handle, run_cgroup.zip(step_cgroups));
        info!(job, run, step, tasks = ranks.len(), cpus = grant.cpus, memory_mib = grant.memory_mib, "step started");
        Ok(Reply::Ok)
    }

    /// Step `handle`'s `--time`: once `limit_ms` passed with its tasks here still running, says
    /// so on the step's stderr in slurmstepd's words (as task `rank`'s, its first here), sends
    /// them SIGTERM and, after the node's kill grace, SIGKILL. Nothing without a limit.
    fn limit_step_time(&self, handle: &Arc<Step>, groups: Arc<launcher::TaskGroups>, limit_ms: Option<u64>, rank: Option<u32>) {
        let (Some(limit_ms), Some(rank)) = (limit_ms, rank) else { return };
        let (handle, node, grace_ms) = (Arc::clone(handle), self.name.clone(), self.settings.stop.kill_grace_ms);
        tokio::spawn(async move {
            let ended = handle.exits_when_ended();
            tokio::pin!(ended);
            if tokio::time::timeout(Duration::from_millis(limit_ms), &mut ended).await.is_ok() {
                return;
            }
            let at = local_time_text(crate::fault::wall_ms() / 1000);
            let line = format!(
                "slurmstepd-{node}: error: *** STEP {}.{} ON {node} CANCELLED AT {at} DUE TO TIME LIMIT ***\n",
                handle.job, handle.id
            );
            handle.push(rank, LogStream::Stderr, line.into_bytes());
            info!(job = handle.job, step = handle.id, limit_ms, "step past its time limit: SIGTERM");
            handle.signal(libc::SIGTERM, &groups);
            if tokio::time::timeout(Duration::from_millis(grace_ms), &mut ended).await.is_err() {
                handle.signal(libc::SIGKILL, &groups);
            }
        });
    }

    /// Run `run` of `job` here, which `user` (none: an admin or a node) may start steps of.
    fn owned_run<'a>(
        &self,
        running: &'a mut BTreeMap<JobId, Running>,
        job: JobId,
        run: RunNo,
        user: Option<&str>,
    ) -> Result<&'a mut Running, ApiError> {
        let r = running
            .get_mut(&job)
            .filter(|r| r.run == run)
            .ok_or_else(|| ApiError::Denied(format!("job {job} run {run} does not run on {}", self.name)))?;
        owner_may(user, &r.owner, job)?;
        Ok(r)
    }

    /// Holds this node's share of step `step` of `job` run `run` before its start, or gives
    /// the hold back (`release`, only before the step started here): see [`PeerRequest::StepHold`].
    pub fn hold_step(&self, job: JobId, run: RunNo, step: u32, spec: &proto::StepSpec, release: bool, user: Option<&str>) -> Response {
        spec.validate().map_err(ApiError::Invalid)?;
        let Some(here) = spec.nodes.iter().find(|n| n.name == self.name) else {
            return Err(ApiError::Invalid(format!("step {job}.{step} has no tasks on {}", self.name)));
        };
        let mut running = lock(&self.running);
        let r = self.owned_run(&mut running, job, run, user)?;
        if release {
            if !r.steps.contains_key(&step) {
                r.step_holds.remove(&step);
            }
            return Ok(Reply::Ok);
        }
        if Self::suspended_here(r) {
            return Err(ApiError::Busy(proto::STEPS_DISABLED_SUSPENDED.into()));
        }
        grant_here(r, job, step, spec, here.ranks.len() as u32, &self.name)?;
        Ok(Reply::Ok)
    }

    /// The cgroups of step `step` below its run's, with its CPUs, memory and GPUs as limits
    /// ([`crate::run::cgroup::JobCgroups::create_step`]); none where the run has no cgroup, or
    /// they could not be made (its tasks then join the run's, which still confines them).
    fn step_cgroups(
        &self,
        job: JobId,
        step: u32,
        env: &BTreeMap<String, String>,
        grant: &scheduler::steps::StepGrant,
        job_gpus: &[u32],
        run_cgroup: Option<&crate::run::cgroup::JobCgroup>,
    ) -> Option<Vec<PathBuf>> {
        let (cgroups, run_cgroup) = (self.settings.cgroups.as_ref()?, run_cgroup?);
        // A grant of no memory is a job whose memory is not counted: no limit of the step's own.
        let memory_mib = if grant.memory_mib == 0 { u64::MAX >> 20 } else { grant.memory_mib };
        let limits = crate::run::cgroup::Limits { cpus: grant.cpus, memory_mib };
        // The job's GPUs the step was not given, by their device files.
        let given: Vec<u32> = match &grant.gpus {
            None => job_gpus.to_vec(),
            Some(positions) => {
                let indices: Vec<u32> =
                    env.get("SLURM_JOB_GPUS").map_or(Vec::new(), |v| v.split(',').filter_map(|g| g.trim().parse().ok()).collect());
                positions.iter().filter_map(|p| indices.get(*p as usize).copied()).collect()
            }
        };
        let deny = self.devices_denied(&given);
        match cgroups.create_step(run_cgroup, step, &limits, &deny) {
            Ok(paths) => Some(paths),
            Err(e) => {
                warn!(job, step, error = format!("{e:#}"), "step cgroup not made: its tasks run in the run's");
                None
            }
        }
    }

    /// Once every task of `handle` here ended, queues its end for the leader: the highest exit
    /// code and a killing signal among them (Slurm's step ExitCode).
    pub(super) fn report_step_end(&self, handle: &Arc<Step>, cgroups: Option<(Arc<crate::run::cgroup::JobCgroup>, Vec<PathBuf>)>) {
        let (handle, tx) = (Arc::clone(handle), self.step_ends_tx.clone());
        tokio::spawn(async move {
            let exits = handle.exits_when_ended().await;
            if let Some((run, paths)) = cgroups {
                // As slurmstepd: what the step's tasks left behind ends with the step.
                run.remove_step(&paths).await;
            }
            let exit_code = exits.iter().filter_map(|e| e.code).max().unwrap_or(0);
            let signal = exits.iter().find_map(|e| e.signal);
            let end = proto::StepEnd { job: handle.job, run: handle.run, step: handle.id, exit_code, signal };
            // Bounded: a full queue holds this task until the leader took the ones before.
            if tx.send(end).await.is_err() {
                debug!(job = handle.job, step = handle.id, "step end not queued: the agent is stopping");
            }
        });
    }

    /// Sends the queued step ends to the leader, as many as are queued in one request, until a
    /// leader has them or refuses them.
    pub async fn step_end_loop(self: Arc<Self>, link: Arc<LeaderLink>) {
        let Some(mut rx) = lock(&self.step_ends_rx).take() else { return };
        while let Some(first) = rx.recv().await {
            let mut ends = vec![first];
            while ends.len() < proto::STEP_ENDS_PER_REQUEST_MAX {
                match rx.try_recv() {
                    Ok(e) => ends.push(e),
                    Err(_) => break,
                }
            }
            let req = PeerRequest::ReportStepEnds { node: self.name.clone(), ends };
            let mut backoff_ms = 50;
            loop {
                match link.call(req.clone(), 0).await {
                    Ok(_) => break,
                    Err(LinkError::Api(e)) => {
                        warn!(error = %e, "step ends refused");
                        break;
                    }
                    Err(e) => {
                        debug!(error = %e, "step ends not delivered, retrying");
                        tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                        backoff_ms = (backoff_ms * 2).min(1_000);
                    }
                }
            }
        }
    }

    fn step_of(&self, job: JobId, step: u32, user: Option<&str>) -> Result<(Arc<Step>, Arc<launcher::TaskGroups>), ApiError> {
        let running = lock(&self.running);
        let r = running.get(&job).ok_or_else(|| ApiError::NotFound(format!("job {job} does not run on {}", self.name)))?;
        owner_may(user, &r.owner, job)?;
        let s = r.steps.get(&step).ok_or_else(|| ApiError::NotFound(format!("step {job}.{step} on {}", self.name)))?;
        Ok((Arc::clone(s), Arc::clone(&r.tasks)))
    }

    /// Output and exits of a step here (see [`Step::read`]); a step read to its end is forgotten.
    pub async fn read_step(&self, job: JobId, step: u32, offset: u64, exits_seen: u32, wait_ms: u32, user: Option<&str>) -> Response {
        let (handle, _) = self.step_of(job, step, user)?;
        let wait = Duration::from_millis(u64::from(wait_ms.min(proto::limits::STEP_READ_WAIT_MS_MAX)));
        let out = handle.read(offset, exits_seen as usize, proto::limits::STEP_READ_BYTES_MAX, wait).await;
        if out.done {
            if let Some(r) = lock(&self.running).get_mut(&job) {
                self.stdin_feeds.forget(job, step);
                if r.steps.remove(&step).is_some() {
                    // Read to its end: a daemon that takes the run over need not follow it.
                    let dir = shepherd::step_dir(&shepherd::run_dir(&self.settings.runs_dir, job, r.run), step);
                    if let Err(e) = std::fs::remove_dir_all(&dir) {
                        debug!(job, step, error = %e, "remove step log {}", dir.display());
                    }
                }
            }
        }
        Ok(Reply::StepOutput { chunks: out.chunks, next_offset: out.next_offset, exits: out.exits, done: out.done })
    }

    /// Writes bytes `offset..` of a step's stdin to its tasks here that read it (see
    /// [`crate::run::step_stdin::Feeds::feed`]); `eof` closes their stdin.
    pub async fn step_input(&self, job: JobId, step: u32, offset: u64, data: &[u8], eof: bool, user: Option<&str>) -> Response {
        if data.len() > proto::limits::STEP_INPUT_BYTES_MAX {
            return Err(ApiError::Invalid(format!("a stdin chunk holds at most {} bytes", proto::limits::STEP_INPUT_BYTES_MAX)));
        }
        self.step_of(job, step, user)?;
        self.stdin_feeds.feed(job, step, &self.name, offset, data, eof).await?;
        Ok(Reply::Ok)
    }

    /// What the live tasks of `job`'s steps here, and its batch script if it runs here, use now
    /// (`sstat`), read from `/proc` (off the async workers).
    pub async fn step_usage(&self, job: JobId, user: Option<&str>) -> Response {
        let (script, tasks) = {
            let running = lock(&self.running);
            let r = running.get(&job).ok_or_else(|| ApiError::NotFound(format!("job {job} does not run on {}", self.name)))?;
            owner_may(user, &r.owner, job)?;
            // A batch job's other nodes run a holder, not its script.
            let script = (r.pgid > 0 && !r.hold).then_some(r.pgid);
            let tasks: Vec<(u32, u32, i32)> = r
                .steps
                .values()
                .filter(|s| !s.ended())
                .flat_map(|s| s.task_sessions().into_iter().map(move |(rank, pgid)| (s.id, rank, pgid)))
                .take(proto::TASK_USAGES_MAX)
                .collect();
            (script, tasks)
        };
        let mut wanted: Vec<i32> = tasks.iter().map(|(_, _, pgid)| *pgid).collect();
        wanted.extend(script);
        let found = tokio::task::spawn_blocking(move || crate::run::usage::sessions(std::path::Path::new("/proc"), &wanted))
            .await
            .map_err(|e| ApiError::Unavailable(format!("read /proc: {e}")))?;
        let (tick_ms, page_kib) = (1000 / crate::run::usage::ticks_per_s().max(1), crate::run::usage::page_bytes() / 1024);
        let entry = |step: Option<u32>, rank: u32, pgid: i32| {
            found.get(&pgid).map(|u| proto::TaskUsage {
                step,
                rank,
                cpu_ms: u.cpu_ticks * tick_ms,
                rss_kib: u.rss_pages * page_kib,
                vmsize_kib: u.vmsize_bytes / 1024,
                pages: u.major_faults,
                read_bytes: u.read_bytes,
                write_bytes: u.write_bytes,
            })
        };
        let mut usages: Vec<proto::TaskUsage> = script.and_then(|pgid| entry(None, 0, pgid)).into_iter().collect();
        usages.extend(tasks.iter().filter_map(|(step, rank, pgid)| entry(Some(*step), *rank, *pgid)));
        usages.truncate(proto::TASK_USAGES_MAX);
        Ok(Reply::StepUsage(usages))
    }

    /// Gives the pseudo-terminal of a step's task 0 here (`srun --pty`) the size `size`.
    pub async fn resize_step(&self, job: JobId, step: u32, size: proto::PtySize, user: Option<&str>) -> Response {
        let (handle, _) = self.step_of(job, step, user)?;
        if handle.ended() {
            return Ok(Reply::Ok);
        }
        let dir = shepherd::run_dir(&self.settings.runs_dir, job, handle.run);
        shepherd::resize_pty(&dir, step, 0, size).await.map_err(|e| ApiError::Invalid(format!("step {job}.{step}: {e:#}")))?;
        Ok(Reply::Ok)
    }

    /// Sends `signal` to every task of a step here (each one's whole process group).
    pub fn signal_step(&self, job: JobId, step: u32, signal: i32, user: Option<&str>) -> Response {
        if !(1..=64).contains(&signal) {
            return Err(ApiError::Invalid(format!("signal {signal} out of range")));
        }
        let (handle, groups) = self.step_of(job, step, user)?;
        if !handle.ended() {
            handle.signal(signal, &groups);
        }
        Ok(Reply::Ok)
    }

    /// The address of node `name` of the run of `job` here (steps are read through the node
    /// that launched them).
    /// Keeps step `step` of `job` as it was started from here (the batch script's node), for a
    /// later [`ClientRequest::StepMove`]; the oldest goes past [`super::STEPS_LAUNCHED_KEPT`].
    pub fn note_launched_step(&self, job: JobId, step: u32, spec: Arc<proto::StepSpec>) {
        if let Some(r) = lock(&self.running).get_mut(&job) {
            r.launched.insert(step, spec);
            while r.launched.len() > super::STEPS_LAUNCHED_KEPT {
                r.launched.pop_first();
            }
        }
    }

    /// Step `step` of `job`'s run here as it was started from here, for `user` (its owner or an
    /// admin): its run and spec.
    pub fn launched_step(&self, job: JobId, step: u32, user: Option<&str>) -> Result<(RunNo, Arc<proto::StepSpec>), ApiError> {
        let running = lock(&self.running);
        let r = running.get(&job).ok_or_else(|| ApiError::NotFound(format!("job {job} does not run on {}", self.name)))?;
        owner_may(user, &r.owner, job)?;
        let spec =
            r.launched.get(&step).ok_or_else(|| ApiError::NotFound(format!("step {job}.{step} was not started from {}", self.name)))?;
        Ok((r.run, Arc::clone(spec)))
    }

    pub fn run_node_addr(&self, job: JobId, name: &str) -> Option<String> {
        lock(&self.running).get(&job).and_then(|r| r.nodes.iter().find(|(n, _)| n == name).map(|(_, a)| a.clone()))
    }
}

/// Where a step's share of its job here is kept, in its directory of the run's.
pub(super) const STEP_GRANT_FILE: &str = "grant.json";

/// `2026-12-05T05:32:28`: a time in this node's local time, as slurmstepd prints it.
fn local_time_text(epoch_s: u64) -> String {
    let t = libc::time_t::try_from(epoch_s).unwrap_or(libc::time_t::MAX);
    // SAFETY: localtime_r writes only into the zeroed tm we own.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&t, &mut tm);
        tm
    };
    let (date, clock) = ((tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday), (tm.tm_hour, tm.tm_min, tm.tm_sec));
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}", date.0, date.1, date.2, clock.0, clock.1, clock.2)
}

/// Keeps step `step`'s share in its directory of run directory `dir`, for a daemon that takes
/// the run over: what the step holds stays held.
fn record_grant(dir: &std::path::Path, job: JobId, step: u32, grant: &scheduler::steps::StepGrant) {
    let file = dir.join("steps").join(step.to_string()).join(STEP_GRANT_FILE);
    let recorded = serde_json::to_vec(grant).map_err(anyhow::Error::from).and_then(|bytes| Ok(std::fs::write(&file, bytes)?));
    if let Err(e) = recorded {
        warn!(job, step, error = format!("{e:#}"), "record the step's share");
    }
}

/// What the job holds here, which its steps share: its CPUs, memory and GPUs as its
/// environment says (`SLURM_CPUS_ON_NODE`, `SLURM_MEM_PER_NODE`, `SLURM_JOB_GPUS`).
fn node_share(env: &BTreeMap<String, String>) -> scheduler::steps::NodeShare {
    let number = |key: &str| env.get(key).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    let gpus = env.get("SLURM_JOB_GPUS").map_or(0, |v| v.split(',').filter(|s| !s.is_empty()).count());
    scheduler::steps::NodeShare {
        cpus: u32::try_from(number("SLURM_CPUS_ON_NODE")).unwrap_or(u32::MAX).max(1),
        memory_mib: number("SLURM_MEM_PER_NODE"),
        gpus: u32::try_from(gpus).unwrap_or(u32::MAX),
    }
}

/// Step `step`'s share of the job here with `tasks` tasks: the hold it was given before its
/// start, or a new grant (held now). Holds of steps whose tasks here ended, and those no start
/// took in time, are dropped first. Asking more than the job has is refused; finding too
/// little free is [`ApiError::Busy`] (the caller asks again, as Slurm's srun does).
fn grant_here(
    r: &mut Running,
    job: JobId,
    step: u32,
    spec: &proto::StepSpec,
    tasks: u32,
    node: &str,
) -> Result<scheduler::steps::StepGrant, ApiError> {
    use scheduler::steps::StepRefusal;
    let asked = HeldStep::asked(spec, tasks);
    if let Some(held) = r.step_holds.get(&step).filter(|h| h.asked == asked) {
        return Ok(held.grant.clone());
    }
    let now = std::time::Instant::now();
    let steps = &r.steps;
    r.step_holds.retain(|s, h| match steps.get(s) {
        Some(handle) => !handle.ended(),
        None => !h.started && *s != step && now.duration_since(h.since) < Duration::from_millis(proto::limits::STEP_HOLD_MS_MAX),
    });
    let held: Vec<&scheduler::steps::StepHold> = r.step_holds.values().map(|h| &h.grant.held).collect();
    match scheduler::steps::grant_step(node_share(&r.base.env), &held, spec, tasks) {
        Ok(grant) => {
            r.step_holds.insert(step, HeldStep { grant: grant.clone(), since: now, asked, started: false });
            Ok(grant)
        }
        Err(StepRefusal::Invalid(why)) => Err(ApiError::Invalid(why)),
        Err(StepRefusal::Busy(why)) => Err(ApiError::Busy(format!("step {job}.{step} waits on {node}: {why}"))),
    }
}
