//! The admission of a submission: the one ordered list of checks a job passes before it is
//! proposed, each refusal in Slurm's words.

use proto::JobSpec;

use super::ClusterState;

/// One check of [`ClusterState::admission`], in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The spec on its own: bounds, names, paths (`JobSpec::validate`).
    Spec,
    /// A negative `--nice` raises the priority: admins only, as in Slurm 22.05.
    Nice,
    /// What the job names exists and could ever hold it: partition and its state, QoS, MIG
    /// profiles, a gang's share per node (`ClusterState::undefined_in_submission`).
    Defined,
    /// The reservation it names exists and admits it (`ClusterState::reservation_refusal`).
    Reservation,
    /// The accounts database: association, allowed QoS, submit limits
    /// (`ClusterState::accounting_refusal`). Checked again when `Submit` applies, against the
    /// state the job enters.
    Accounting,
}

/// The checks, in order: a cheap check of the spec alone before any that reads the state.
pub const CHECKS: [Check; 5] = [Check::Spec, Check::Nice, Check::Defined, Check::Reservation, Check::Accounting];

/// Why a submission is refused, and which check refused it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub check: Check,
    pub why: String,
}

impl ClusterState {
    /// Whether `spec` (its defaults already bound) may be submitted at `now_ms` by a user
    /// (`by_admin`: an admin), running [`CHECKS`] in order and stopping at the first refusal.
    pub fn admission(&self, spec: &JobSpec, by_admin: bool, now_ms: u64) -> Result<(), Refusal> {
        for check in CHECKS {
            let refused = match check {
                Check::Spec => spec.validate().err(),
                Check::Nice => (spec.nice() < 0 && !by_admin).then(|| "Invalid --nice value".to_string()),
                Check::Defined => self.undefined_in_submission(spec),
                Check::Reservation => self.reservation_refusal(spec, now_ms).map(str::to_string),
                Check::Accounting => self.accounting_refusal(spec),
            };
            if let Some(why) = refused {
                return Err(Refusal { check, why });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::test_support::{inventory, spec, with_node_n1};

    fn refused_by(s: &ClusterState, spec: &JobSpec, by_admin: bool) -> Option<Check> {
        s.admission(spec, by_admin, 0).err().map(|r| r.check)
    }

    #[test]
    fn each_check_refuses_in_slurms_words_and_the_first_refusal_wins() {
        let s = with_node_n1(inventory(8));
        assert_eq!(s.admission(&spec(2, 1), false, 0), Ok(()));
        let mut bad = spec(2, 1);
        bad.argv.clear();
        assert_eq!(refused_by(&s, &bad, false), Some(Check::Spec));
        let mut nice = spec(2, 1);
        nice.extra.insert("nice".into(), "-5".into());
        assert_eq!(s.admission(&nice, false, 0), Err(Refusal { check: Check::Nice, why: "Invalid --nice value".into() }));
        assert_eq!(s.admission(&nice, true, 0), Ok(()), "an admin may raise a priority");
        let mut nowhere = spec(2, 1);
        nowhere.partition = Some("nowhere".into());
        assert_eq!(s.admission(&nowhere, false, 0), Err(Refusal { check: Check::Defined, why: "Invalid partition name specified".into() }));
        // Both a negative nice and an unknown partition: the earlier check answers.
        nowhere.extra.insert("nice".into(), "-5".into());
        assert_eq!(refused_by(&s, &nowhere, false), Some(Check::Nice));
        let mut too_big = spec(9, 1);
        too_big.partition = None;
        assert_eq!(refused_by(&s, &too_big, false), Some(Check::Defined), "no node holds 9 GPUs");
    }
}
