//! Array task ids as runs of ranges (`--array=1-100000` is one run): what every copy of an
//! array task's spec carries instead of the list of its ids.

use serde::{Deserialize, Serialize};

use crate::limits;

/// An array's task ids as ascending, disjoint runs `first..=last` by `step`: `--array=1-100000`
/// is one run whatever its size, so every copy of a task's spec (log entry, snapshot, launch,
/// query page, `spec.json`) stays small. Built from ids by [`ArraySpec::from_ids`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    pub runs: Vec<TaskRun>,
    /// At most this many tasks run at once (`%N`).
    pub throttle: Option<u32>,
}

/// `first, first + step, ..., last` (`last - first` is a multiple of `step`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRun {
    pub first: u32,
    pub last: u32,
    pub step: u32,
}

impl TaskRun {
    /// Tasks in the run (0 for a malformed one, which [`ArraySpec::validate`] refuses).
    pub fn len(&self) -> usize {
        match self.last.checked_sub(self.first) {
            Some(span) if self.step > 0 => (span / self.step) as usize + 1,
            _ => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = u32> {
        (self.first..=self.last).step_by(self.step.max(1) as usize)
    }
}

impl ArraySpec {
    /// Runs that hold `ids` (ascending and unique), each taken as far as its step goes: an
    /// evenly spaced list is one run.
    pub fn from_ids(ids: &[u32], throttle: Option<u32>) -> ArraySpec {
        let mut runs: Vec<TaskRun> = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let first = ids[i];
            let step = ids.get(i + 1).map_or(1, |&n| n.saturating_sub(first).max(1));
            let mut last = first;
            while ids.get(i + 1).is_some_and(|&n| n > last && n - last == step) {
                i += 1;
                last = ids[i];
            }
            runs.push(TaskRun { first, last, step: if last == first { 1 } else { step } });
            i += 1;
        }
        ArraySpec { runs, throttle }
    }

    /// How many tasks the array has.
    pub fn len(&self) -> usize {
        self.runs.iter().map(TaskRun::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn contains(&self, task: u32) -> bool {
        let i = self.runs.partition_point(|r| r.last < task);
        self.runs.get(i).is_some_and(|r| r.first <= task && (task - r.first).is_multiple_of(r.step.max(1)))
    }

    /// Every task id, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.runs.iter().flat_map(TaskRun::iter)
    }

    pub fn first(&self) -> Option<u32> {
        self.runs.first().map(|r| r.first)
    }

    pub fn last(&self) -> Option<u32> {
        self.runs.last().map(|r| r.last)
    }

    /// The one step between every two neighbouring ids (Slurm's `SLURM_ARRAY_TASK_STEP`), or 1
    /// when they differ or there is one id.
    pub fn step(&self) -> u32 {
        let inner = self.runs.iter().filter(|r| r.first != r.last).map(|r| r.step);
        let between = self.runs.windows(2).map(|w| w[1].first.saturating_sub(w[0].last));
        let mut gaps = inner.chain(between);
        match gaps.next() {
            Some(g) if gaps.all(|x| x == g) => g,
            _ => 1,
        }
    }

    /// Runs well formed, ascending and disjoint; 1..=[`limits::ARRAY_TASKS_MAX`] tasks in at
    /// most [`limits::ARRAY_RUNS_MAX`] runs.
    pub fn validate(&self) -> Result<(), String> {
        use limits::{ARRAY_RUNS_MAX, ARRAY_TASKS_MAX};
        if self.runs.is_empty() || self.runs.len() > ARRAY_RUNS_MAX {
            return Err(format!("an array's task ids must form 1..={ARRAY_RUNS_MAX} ranges"));
        }
        if self.runs.iter().any(|r| r.step == 0 || r.last < r.first || !(r.last - r.first).is_multiple_of(r.step)) {
            return Err("an array's task range is malformed".into());
        }
        if self.runs.windows(2).any(|w| w[0].last >= w[1].first) {
            return Err("array task ids must be ascending and unique".into());
        }
        if self.len() > ARRAY_TASKS_MAX {
            return Err(format!("an array holds 1..={ARRAY_TASKS_MAX} tasks"));
        }
        if self.throttle == Some(0) {
            return Err("array throttle must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u32, last: u32, step: u32) -> TaskRun {
        TaskRun { first, last, step }
    }

    #[test]
    fn ids_become_runs_as_long_as_their_steps_go_and_come_back_unchanged() {
        let cases: [(&[u32], Vec<TaskRun>); 5] = [
            (&[1, 2, 3, 4, 5], vec![run(1, 5, 1)]),
            (&[0, 4, 8, 12], vec![run(0, 12, 4)]),
            (&[1, 3, 7], vec![run(1, 3, 2), run(7, 7, 1)]),
            (&[1, 2, 3, 7], vec![run(1, 3, 1), run(7, 7, 1)]),
            (&[5], vec![run(5, 5, 1)]),
        ];
        for (ids, runs) in cases {
            let a = ArraySpec::from_ids(ids, None);
            assert_eq!(a.runs, runs, "{ids:?}");
            assert_eq!(a.iter().collect::<Vec<_>>(), ids);
            assert_eq!((a.len(), a.first(), a.last()), (ids.len(), ids.first().copied(), ids.last().copied()));
            assert_eq!(a.validate(), Ok(()));
        }
        let big: Vec<u32> = (1..=100_000).collect();
        let a = ArraySpec::from_ids(&big, Some(50));
        assert_eq!((a.runs.len(), a.len()), (1, 100_000));
        assert!(crate::encode(&a).len() < 16, "a 100,000-task array encodes in a few bytes");
    }

    #[test]
    fn contains_exactly_the_ids() {
        let ids = [0, 4, 8, 12, 13, 14, 100];
        let a = ArraySpec::from_ids(&ids, None);
        for t in 0..=120 {
            assert_eq!(a.contains(t), ids.contains(&t), "{t}");
        }
    }

    #[test]
    fn step_is_the_common_gap_else_one() {
        assert_eq!(ArraySpec::from_ids(&[0, 4, 8], None).step(), 4);
        assert_eq!(ArraySpec::from_ids(&[7], None).step(), 1);
        assert_eq!(ArraySpec::from_ids(&[1, 3, 7], None).step(), 1);
        // Split runs with the one gap between them still have that step.
        assert_eq!(ArraySpec { runs: vec![run(0, 4, 2), run(6, 10, 2)], throttle: None }.step(), 2);
    }

    #[test]
    fn malformed_overlapping_or_oversized_arrays_are_refused() {
        let refused = |runs: Vec<TaskRun>, throttle| ArraySpec { runs, throttle }.validate().is_err();
        assert!(refused(vec![], None));
        assert!(refused(vec![run(5, 1, 1)], None));
        assert!(refused(vec![run(1, 5, 0)], None));
        assert!(refused(vec![run(1, 6, 2)], None));
        assert!(refused(vec![run(1, 5, 1), run(5, 9, 1)], None));
        assert!(refused(vec![run(6, 9, 1), run(1, 5, 1)], None));
        assert!(refused(vec![run(0, 100_000, 1)], None));
        assert!(refused(vec![run(1, 5, 1)], Some(0)));
        assert!(refused((0..=limits::ARRAY_RUNS_MAX as u32).map(|i| run(i * 2, i * 2, 1)).collect(), None));
        // A malformed run neither panics nor loops.
        let bad = ArraySpec { runs: vec![run(5, 1, 0)], throttle: None };
        assert_eq!((bad.len(), bad.contains(5), bad.iter().count()), (0, false, 0));
    }
}
