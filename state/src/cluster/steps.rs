//! Job steps (`srun` inside a job), recorded for accounting: started on the current run, ended
//! with their last node.

use proto::{CommandResult, JobId, JobState, RunNo};

use super::{rejected, ClusterState};

impl ClusterState {
    /// A step of the running job's current run, recorded for accounting. One created again
    /// under the same number (its first creation was refused by a node) is recorded anew.
    /// Past [`proto::limits::STEP_RECORDS_PER_JOB_MAX`] the oldest ended step is dropped; a
    /// job with that many steps alive at once records no more.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn step_started(
        &mut self,
        id: JobId,
        run: RunNo,
        step: u32,
        name: &str,
        nodes: &[String],
        ntasks: u32,
        now_ms: u64,
    ) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        if job.state != JobState::Running || job.run != run {
            return rejected(format!("job {id} run {run} is not running"));
        }
        if name.len() > proto::limits::STEP_NAME_BYTES_MAX || nodes.len() > job.last_nodes.len().max(1) {
            return rejected(format!("step {id}.{step}: name or node list too long"));
        }
        job.steps.retain(|s| s.step != step);
        if job.steps.len() >= proto::limits::STEP_RECORDS_PER_JOB_MAX {
            let Some(oldest) = job.steps.iter().position(|s| s.end_ms.is_some()) else {
                return rejected(format!("job {id} has {} steps alive", job.steps.len()));
            };
            job.steps.remove(oldest);
        }
        job.steps.push(proto::StepRecord {
            step,
            name: name.to_string(),
            nodes: nodes.to_vec(),
            ntasks,
            start_ms: now_ms,
            end_ms: None,
            ended_on: Vec::new(),
            exit_code: 0,
            signal: None,
        });
        CommandResult::Ok
    }

    /// Every task of a step on `node` ended: its worst exit counts, and the step ends with its
    /// last node. Applied after its job ended too (the tasks' ends come after the run's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn step_ended(
        &mut self,
        id: JobId,
        run: RunNo,
        step: u32,
        node: &str,
        exit_code: i32,
        signal: Option<i32>,
        now_ms: u64,
    ) -> CommandResult {
        let Some(job) = self.jobs.get_mut(&id) else {
            return rejected(format!("unknown job {id}"));
        };
        let Some(record) = job.steps.iter_mut().find(|s| job.run == run && s.step == step) else {
            return rejected(format!("unknown step {id}.{step} of run {run}"));
        };
        if !record.nodes.iter().any(|n| n == node) || record.ended_on.iter().any(|n| n == node) {
            return rejected(format!("step {id}.{step} has no tasks left on {node}"));
        }
        record.ended_on.push(node.to_string());
        record.exit_code = record.exit_code.max(exit_code);
        record.signal = record.signal.or(signal);
        if record.ended_on.len() == record.nodes.len() {
            record.end_ms = Some(now_ms);
        }
        CommandResult::Ok
    }
}

#[cfg(test)]
mod tests {
    use proto::{Command, CommandResult, RunOutcome};

    use crate::cluster::test_support::{finish, gang};
    use crate::cluster::ClusterState;

    #[test]
    fn steps_are_recorded_for_their_run_and_end_with_their_last_node() {
        let (mut s, a, b, job) = gang();
        let names: Vec<String> = vec!["a".into(), "b".into()];
        let start = |s: &mut ClusterState, run, step, nodes: &[String]| {
            s.apply(&Command::StepStarted { job, run, step, name: "python".into(), nodes: nodes.to_vec(), ntasks: 4, now_ms: 6_000 })
        };
        let end = |s: &mut ClusterState, step, node: &str, exit_code, signal| {
            s.apply(&Command::StepEnded { job, run: 1, step, node: node.into(), exit_code, signal, now_ms: 7_000 })
        };
        assert_eq!(start(&mut s, 1, 0, &names), CommandResult::Ok);
        assert!(matches!(start(&mut s, 2, 1, &names), CommandResult::Rejected(_)), "not the current run");
        assert_eq!(end(&mut s, 0, "a", 0, None), CommandResult::Ok);
        assert!(matches!(end(&mut s, 0, "a", 0, None), CommandResult::Rejected(_)), "a second report after a handover");
        assert!(matches!(end(&mut s, 0, "c", 0, None), CommandResult::Rejected(_)), "no tasks there");
        assert_eq!(s.jobs[&job].steps[0].end_ms, None, "b still runs its tasks");
        assert_eq!(s.jobs[&job].steps[0].state_name(&s.jobs[&job]), "RUNNING");
        assert_eq!(end(&mut s, 0, "b", 3, None), CommandResult::Ok);
        let step = &s.jobs[&job].steps[0];
        assert_eq!((step.end_ms, step.exit_code, step.state_name(&s.jobs[&job])), (Some(7_000), 3, "FAILED"));
        // A step alive when the job is cancelled ends with it, in its state.
        assert_eq!(start(&mut s, 1, 1, &names[..1]), CommandResult::Ok);
        s.apply(&Command::Cancel { job, now_ms: 8_000 });
        assert_eq!(s.jobs[&job].steps[1].state_name(&s.jobs[&job]), "CANCELLED");
        finish(&mut s, job, 1, a, RunOutcome::Killed);
        finish(&mut s, job, 1, b, RunOutcome::Killed);
        assert_eq!(end(&mut s, 1, "a", 0, Some(15)), CommandResult::Ok, "its tasks' end comes after the run's");
        assert_eq!(s.jobs[&job].steps.len(), 2);
    }

    #[test]
    fn a_job_keeps_a_bounded_number_of_step_records_dropping_the_oldest_ended() {
        let (mut s, _a, _b, job) = gang();
        let nodes = vec!["a".to_string()];
        let max = proto::limits::STEP_RECORDS_PER_JOB_MAX as u32;
        for step in 0..max {
            s.apply(&Command::StepStarted { job, run: 1, step, name: "x".into(), nodes: nodes.clone(), ntasks: 1, now_ms: 1 });
        }
        let full = s.apply(&Command::StepStarted { job, run: 1, step: max, name: "x".into(), nodes: nodes.clone(), ntasks: 1, now_ms: 2 });
        assert!(matches!(full, CommandResult::Rejected(_)), "all alive: nothing to drop");
        s.apply(&Command::StepEnded { job, run: 1, step: 7, node: "a".into(), exit_code: 0, signal: None, now_ms: 3 });
        let next = s.apply(&Command::StepStarted { job, run: 1, step: max, name: "x".into(), nodes, ntasks: 1, now_ms: 4 });
        assert_eq!(next, CommandResult::Ok);
        let steps = &s.jobs[&job].steps;
        assert_eq!((steps.len(), steps.iter().any(|st| st.step == 7), steps.last().map(|st| st.step)), (max as usize, false, Some(max)));
    }
}
