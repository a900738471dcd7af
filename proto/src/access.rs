//! Who may send each request: one exhaustive match, so a new request does not compile until it
//! is given its class (the server enforces it: `node/src/server/authz.rs` and `api.rs`).

use crate::{JobId, Request};

/// The class of a request, by who may send it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A machine without a certificate of the cluster (it asks for one).
    Anonymous,
    /// Any user; what the answer holds may still depend on the user (steps, logs and tokens
    /// check the job's or the token's owner where they are answered).
    User,
    /// The owner of `job`, or an admin; `verb` says what is done to it.
    Owner { job: JobId, verb: &'static str },
    /// Admins only; `what` completes "user X may not ...".
    Admin { what: &'static str },
    /// Cluster nodes only: the node-to-node protocol. A client's requests are forwarded by its
    /// node under the node's name.
    Node,
}

impl Request {
    /// Who may send this request.
    pub fn access(&self) -> Access {
        match self {
            Request::Enroll { .. } => Access::Anonymous,
            Request::Submit { .. }
            | Request::TestSubmit { .. }
            | Request::GetJob { .. }
            | Request::ListJobs { .. }
            | Request::QueryJobs { .. }
            | Request::ListNodes
            | Request::ClusterInfo
            | Request::Members
            | Request::Logs { .. }
            | Request::GetPolicy
            | Request::GetReservations
            | Request::ShowConfig
            | Request::GetAccounts
            | Request::GetShares
            | Request::GetPriorities { .. }
            | Request::AccountingDigest
            | Request::IssueToken { .. }
            | Request::StepLaunch { .. }
            | Request::StepMove { .. }
            | Request::StepRead { .. }
            | Request::StepInput { .. }
            | Request::StepUsage { .. }
            | Request::StepSignal { .. }
            | Request::StepResize { .. }
            | Request::Whoami
            | Request::GpuSeries { .. }
            | Request::GpuSamples { .. }
            | Request::NodeEvents
            | Request::QueueSummary { .. }
            | Request::ExpectedStarts => Access::User,
            // A node renews its own certificate; `Api::handle` refuses a user's before this.
            Request::RenewCert { .. } => Access::User,
            Request::Cancel { job } => Access::Owner { job: *job, verb: "cancel" },
            Request::Requeue { job } | Request::RequeueHold { job } => Access::Owner { job: *job, verb: "requeue" },
            Request::UpdateJob { job, .. } => Access::Owner { job: *job, verb: "update" },
            Request::Signal { job, .. } => Access::Owner { job: *job, verb: "signal" },
            // Slurm: only an operator or administrator suspends or resumes a job.
            Request::Suspend { .. } => Access::Admin { what: "suspend or resume jobs" },
            Request::Drain { .. } => Access::Admin { what: "drain nodes" },
            Request::Resume { .. } => Access::Admin { what: "resume nodes" },
            Request::SetPolicy { .. } | Request::EditPartition { .. } => Access::Admin { what: "change the scheduling policy" },
            Request::EditAccounts { .. } => Access::Admin { what: "change accounts, users and QOS" },
            Request::EditReservation { .. } => Access::Admin { what: "change reservations" },
            Request::SetGpuHealth { .. } => Access::Admin { what: "change GPU health" },
            Request::SetMigLayout { .. } => Access::Admin { what: "set MIG layouts" },
            Request::CreateJoinToken { .. } => Access::Admin { what: "create join tokens" },
            Request::ListJoinTokens => Access::Admin { what: "list join tokens" },
            Request::RevokeJoinToken { .. } => Access::Admin { what: "revoke join tokens" },
            Request::RevokeCert { .. } => Access::Admin { what: "revoke certificates" },
            Request::CheckCert { .. } => Access::Admin { what: "check certificates" },
            Request::Raft { .. }
            | Request::Join { .. }
            | Request::Heartbeat { .. }
            | Request::Heartbeats { .. }
            | Request::ReportRun { .. }
            | Request::ReportRuns { .. }
            | Request::NodeStopped { .. }
            | Request::Launch { .. }
            | Request::Kill { .. }
            | Request::ReportGpuHealth { .. }
            | Request::ReportInventory { .. }
            | Request::ApplyMigLayout { .. }
            | Request::SignalPart { .. }
            | Request::SuspendPart { .. }
            | Request::RecordStep { .. }
            | Request::ReportStepEnds { .. }
            | Request::StepStart { .. }
            | Request::StepHold { .. } => Access::Node,
        }
    }

    /// Whether only a cluster node may send this request.
    pub fn node_only(&self) -> bool {
        self.access() == Access::Node
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Beat;

    #[test]
    fn the_node_protocol_is_closed_to_users() {
        // A relay's batch of heartbeats keeps nodes alive: a user who could send one could hide
        // a dead node from the leader.
        assert_eq!(Request::Heartbeats { relay: 1, beats: vec![Beat { node: 2, instance: 3 }] }.access(), Access::Node);
        assert_eq!(Request::Kill { job: 1, run: 1, checkpoint: false }.access(), Access::Node);
        assert!(!Request::ListJobs { include_finished: false }.node_only());
    }

    #[test]
    fn admin_and_owner_requests_say_what_they_do() {
        assert_eq!(Request::Cancel { job: 7 }.access(), Access::Owner { job: 7, verb: "cancel" });
        assert_eq!(Request::ListJoinTokens.access(), Access::Admin { what: "list join tokens" });
        assert_eq!(Request::Enroll { secret: String::new(), name: "n1".into(), csr_pem: String::new() }.access(), Access::Anonymous);
    }
}
