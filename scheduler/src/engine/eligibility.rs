//! Whether a pending job may start at all now, before any node is looked at: its begin time,
//! hold, dependencies, partition, QoS and accounting limits (`eligibility`).

use proto::{DependencyKind, JobId, JobState};

use super::{dep_label, Pass};
use crate::format::fmt_time_ms;
use crate::view::JobRequest;

impl Pass<'_> {
    /// Reasons a pending job may not start whatever the resources: hold, begin time,
    /// dependencies, partition, array throttle.
    pub(super) fn eligibility(&self, j: &JobRequest) -> Vec<String> {
        let mut reasons = Vec::new();
        if j.hold {
            reasons.push("job is held".to_string());
        }
        if let Some(b) = j.begin_ms {
            if b > self.now_ms {
                reasons.push(format!("begins at {}", fmt_time_ms(b)));
            }
        }
        for d in &j.dependencies {
            if let Some(r) = self.dependency_unmet(j, d.kind, d.job) {
                reasons.push(r);
            }
        }
        match &j.partition {
            Some(p) if !self.part_ix.contains_key(p) => reasons.push(format!("partition {p} does not exist")),
            _ => {}
        }
        let pname = j.partition.as_deref().unwrap_or(&self.part_names[self.default_part as usize]);
        if let Some(part) = self.view.partitions.get(pname) {
            reasons.extend(part.holds(j));
        }
        reasons.extend(self.windows.eligibility(j, self.now_ms));
        reasons.extend(self.limit_reasons(j));
        let array_id = j.array_task.as_ref().map(|t| t.array_job).or(if j.is_array() { Some(j.id) } else { None });
        if let Some(a) = array_id {
            let throttle = if j.is_array() {
                j.array.as_ref().and_then(|s| s.throttle)
            } else {
                self.job_index(a).and_then(|i| self.view.jobs[i].array.as_ref()).and_then(|s| s.throttle)
            };
            if let Some(t) = throttle {
                let active = self.array_active.get(&a).copied().unwrap_or(0);
                if active >= t {
                    reasons.push(format!("array throttle %{t} reached ({active} tasks running)"));
                }
            }
        }
        reasons
    }

    /// The accounting limits (association, account, QoS) `j` would pass if it started now.
    pub(super) fn limit_reasons(&self, j: &JobRequest) -> Vec<String> {
        self.limits.as_ref().map_or_else(Vec::new, |l| l.reasons(self.view, j, self.effective_limit_ms(j)))
    }

    pub(super) fn dependency_unmet(&self, j: &JobRequest, kind: DependencyKind, on: Option<JobId>) -> Option<String> {
        let label = dep_label(kind);
        if kind == DependencyKind::Singleton {
            // Any other unfinished job of the same name and user submitted earlier, or running.
            let other = self.view.jobs.iter().find(|o| {
                o.id != j.id
                    && o.user == j.user
                    && o.name == j.name
                    && !o.state.is_final()
                    && (o.id < j.id || o.state == JobState::Running || self.started.contains(&o.id))
            })?;
            let state = if self.started.contains(&other.id) { JobState::Running } else { other.state };
            return Some(format!("dependency singleton: job {} of the same name and user is {state}", other.id));
        }
        let id = on?;
        let Some(oi) = self.job_index(id) else {
            return Some(format!("dependency {label}:{id} can never be satisfied (job {id} unknown)"));
        };
        let o = &self.view.jobs[oi];
        let state = if self.started.contains(&id) { JobState::Running } else { o.state };
        let ok = match kind {
            DependencyKind::After => state != JobState::Pending,
            DependencyKind::AfterAny => state.is_final(),
            DependencyKind::AfterOk => {
                if state.is_final() && state != JobState::Completed {
                    return Some(format!("dependency {label}:{id} can never be satisfied (job {id} {state})"));
                }
                state == JobState::Completed
            }
            DependencyKind::AfterNotOk => {
                if state == JobState::Completed {
                    return Some(format!("dependency {label}:{id} can never be satisfied (job {id} COMPLETED)"));
                }
                state.is_final()
            }
            DependencyKind::Singleton => true,
        };
        (!ok).then(|| format!("dependency {label}:{id}"))
    }
}
