//! Job arrays: their tasks that exist as jobs, and starting a task (the last to start takes
//! over the array's own record).

use proto::{ArrayTask, JobId};

use super::ClusterState;

impl ClusterState {
    /// Tasks of array `array` that exist as jobs: (task, job id).
    pub(super) fn array_task_ids(&self, array: JobId) -> impl Iterator<Item = (u32, JobId)> + '_ {
        self.jobs.values().filter_map(move |j| j.array.as_ref().filter(|a| a.array_job == array).map(|a| (a.task, j.id)))
    }

    /// Creates the job of task `task` of array `array` and returns its id. The last task to
    /// start takes over the array's own record and id, as in Slurm.
    pub(super) fn start_array_task(&mut self, array: JobId, task: u32) -> JobId {
        let started = self.array_started.entry(array).or_default();
        let Some(parent) = self.jobs.get_mut(&array) else { return array };
        // Every started task is one of the array's (checked at placement), so this counts the
        // tasks not started yet without a scan (tasks are unique).
        let remaining = parent.spec.array.as_ref().map_or(0, |a| a.len().saturating_sub(started.len()));
        if remaining <= 1 {
            self.array_started.remove(&array);
            parent.array = Some(ArrayTask { array_job: array, task });
            return array;
        }
        started.insert(task);
        let mut job = parent.clone();
        job.array = Some(ArrayTask { array_job: array, task });
        let id = self.next_job_id;
        self.next_job_id += 1;
        job.id = id;
        self.jobs.insert(id, job);
        id
    }
}
