//! The invariants a simulated run checks: after every step (no GPU shared, no job live in two
//! runs, suspensions reach the processes) and at the end (every acknowledged job final, nothing left running).

use std::collections::{BTreeMap, BTreeSet};

use proto::{JobId, RunNo};

use super::Sim;

/// How long a suspension or resume may take to reach a process whose node a committing leader
/// reaches: re-sends every second, messages dropped and delayed (a slow network holds them up
/// to 3 s more), with margin.
const SUSPENSION_REACHES_MS: u64 = 10_000;

impl Sim {
    pub(super) fn check_step(&mut self) {
        // No GPU used by two live processes; no job live in two runs at once.
        let mut gpu_user: BTreeMap<(usize, u32), JobId> = BTreeMap::new();
        let mut job_run: BTreeMap<JobId, (RunNo, usize)> = BTreeMap::new();
        let mut found = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !n.alive {
                continue;
            }
            // A process that died (its end is past) but its paused agent has not noticed is not live.
            for (job, p) in n.procs.iter().filter(|(_, p)| self.spans[p.span].end_ms.is_none()) {
                for g in &p.gpus {
                    if let Some(other) = gpu_user.insert((i, *g), *job) {
                        if other != *job {
                            found.push(format!("gpu {g} of {} used by live processes of jobs {other} and {job}", n.name));
                        }
                    }
                }
                if let Some((run, at)) = job_run.insert(*job, (p.run, i)) {
                    if run != p.run {
                        found.push(format!("job {job} live in run {run} on {} and run {} on {}", self.nodes[at].name, p.run, n.name));
                    }
                }
            }
        }
        // The state: a RUNNING job's parts all belong to its current run... no: parts of an
        // earlier run may still be stopping, but then the job cannot have been placed again.
        for j in self.state.jobs.values() {
            let runs: BTreeSet<RunNo> = j.parts.iter().map(|p| p.run).collect();
            if runs.len() > 1 {
                found.push(format!("job {} holds parts of runs {runs:?} at once", j.id));
            }
            if !j.spec.requeue && j.restart_count > 0 {
                found.push(format!("job {} did not ask for requeue but was restarted {} times", j.id, j.restart_count));
            }
        }
        for f in found {
            self.violation(f);
        }
        self.check_suspensions();
    }

    /// Every process of a started part of a running job is stopped while the log says the job
    /// is suspended, and runs while it does not, within [`SUSPENSION_REACHES_MS`] of the node being
    /// reachable from a leader that commits (the leader re-sends each order until acknowledged).
    fn check_suspensions(&mut self) {
        let now = self.now_ms;
        let leader_up = self.leader_up();
        let mut unsettled = BTreeMap::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if !leader_up || !n.reachable(now) {
                continue;
            }
            let known = self.state.nodes.get(&n.id).is_some_and(|r| r.instance == n.instance);
            for (job, p) in n.procs.iter().filter(|(_, p)| p.stop_at_ms.is_none() && self.spans[p.span].end_ms.is_none()) {
                let Some(j) = self.state.jobs.get(job) else { continue };
                let started = j.parts.iter().any(|part| part.run == p.run && part.alloc.node == n.id && part.launched_by.is_some());
                if !known || !started || j.state != proto::JobState::Running || j.run != p.run {
                    continue;
                }
                if j.suspension.since_ms.is_some() != p.suspended_since_ms.is_some() {
                    let since = self.unsettled_pause.get(&(*job, i)).copied().unwrap_or(now);
                    unsettled.insert((*job, i), since);
                }
            }
        }
        let late: Vec<String> = unsettled
            .iter()
            .filter(|(_, since)| now - **since > SUSPENSION_REACHES_MS)
            .map(|((job, i), _)| {
                let suspended = self.state.jobs.get(job).is_some_and(|j| j.suspension.since_ms.is_some());
                format!(
                    "job {job} is {} in the log, but its process on {} has {} for over {SUSPENSION_REACHES_MS} ms",
                    if suspended { "suspended" } else { "resumed" },
                    self.nodes[*i].name,
                    if suspended { "run on" } else { "stayed stopped" },
                )
            })
            .collect();
        self.unsettled_pause = unsettled;
        for f in late {
            self.violation(f);
        }
    }

    pub(super) fn check_end(&mut self) {
        let mut found = Vec::new();
        for id in &self.acked {
            match self.state.jobs.get(id).or_else(|| self.archive.get(id)) {
                None if self.pruned.contains_key(id) => {}
                None => found.push(format!("acknowledged job {id} is missing")),
                Some(j) if !j.state.is_final() => {
                    found.push(format!("job {id} is still {} (run {}, parts {:?}) after everything healed", j.state, j.run, j.parts))
                }
                Some(j) if !j.parts.is_empty() => found.push(format!("final job {id} still holds parts {:?}", j.parts)),
                Some(_) => {}
            }
        }
        for n in &self.nodes {
            for (job, p) in &n.procs {
                found.push(format!("{} still runs job {job} run {} after everything settled", n.name, p.run));
            }
        }
        let mut spans = self.spans.clone();
        for s in spans.iter_mut() {
            s.end_ms.get_or_insert(self.now_ms);
        }
        let ranks = |job: u64| self.state.jobs.get(&job).or_else(|| self.archive.get(&job)).map(|j| j.spec.nodes_max().max(1) as usize);
        let ranks_twice = crate::check_ranks_at_once(&spans, ranks);
        for v in crate::check_exclusive_gpus(&spans).into_iter().chain(crate::check_never_twice(&spans)).chain(ranks_twice) {
            found.push(v.to_string());
        }
        for j in self.state.jobs.values().chain(self.archive.values()) {
            *self.report.final_states.entry(j.state.to_string()).or_default() += 1;
            self.report.requeued_runs += u64::from(j.restart_count);
            self.report.repairs += j.repairs.len() as u64;
        }
        for state in self.pruned.values() {
            *self.report.final_states.entry(state.to_string()).or_default() += 1;
        }
        for f in found {
            self.violation(f);
        }
    }
}
