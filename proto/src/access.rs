//! Who may send each request: one exhaustive match, so a new request does not compile until it
//! is given its class (the server enforces it: `node/src/server/authz.rs` and `api.rs`).

use crate::{ClientRequest, JobId, PeerRequest, Request};

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
            Request::Client(request) => request.access(),
            Request::Peer(PeerRequest::Enroll { .. }) => Access::Anonymous,
            Request::Peer(_) => Access::Node,
        }
    }

    /// Whether only a cluster node may send this request.
    pub fn node_only(&self) -> bool {
        self.access() == Access::Node
    }
}

impl ClientRequest {
    /// Who may send this request: one exhaustive match, so a new request does not compile until
    /// it is given its class. Never [`Access::Node`]: that class is [`PeerRequest`]'s.
    pub fn access(&self) -> Access {
        use ClientRequest as C;
        match self {
            C::Submit { .. }
            | C::TestSubmit { .. }
            | C::GetJob { .. }
            | C::ListJobs { .. }
            | C::QueryJobs { .. }
            | C::ListNodes
            | C::ClusterInfo
            | C::Members
            | C::Logs { .. }
            | C::GetPolicy
            | C::GetReservations
            | C::ShowConfig
            | C::GetAccounts
            | C::GetShares
            | C::GetPriorities { .. }
            | C::AccountingDigest
            | C::IssueToken { .. }
            | C::StepLaunch { .. }
            | C::StepMove { .. }
            | C::StepRead { .. }
            | C::StepInput { .. }
            | C::StepUsage { .. }
            | C::StepSignal { .. }
            | C::StepResize { .. }
            | C::Whoami
            | C::GpuSeries { .. }
            | C::GpuSamples { .. }
            | C::NodeEvents
            | C::QueueSummary { .. }
            | C::ExpectedStarts => Access::User,
            C::Cancel { job } => Access::Owner { job: *job, verb: "cancel" },
            C::Requeue { job } | C::RequeueHold { job } => Access::Owner { job: *job, verb: "requeue" },
            C::UpdateJob { job, .. } => Access::Owner { job: *job, verb: "update" },
            C::Signal { job, .. } => Access::Owner { job: *job, verb: "signal" },
            // Slurm: only an operator or administrator suspends or resumes a job.
            C::Suspend { .. } => Access::Admin { what: "suspend or resume jobs" },
            C::Drain { .. } => Access::Admin { what: "drain nodes" },
            C::Resume { .. } => Access::Admin { what: "resume nodes" },
            C::SetPolicy { .. } | C::EditPartition { .. } => Access::Admin { what: "change the scheduling policy" },
            C::EditAccounts { .. } => Access::Admin { what: "change accounts, users and QOS" },
            C::EditReservation { .. } => Access::Admin { what: "change reservations" },
            C::SetGpuHealth { .. } => Access::Admin { what: "change GPU health" },
            C::SetMigLayout { .. } => Access::Admin { what: "set MIG layouts" },
            C::CreateJoinToken { .. } => Access::Admin { what: "create join tokens" },
            C::ListJoinTokens => Access::Admin { what: "list join tokens" },
            C::RevokeJoinToken { .. } => Access::Admin { what: "revoke join tokens" },
            C::RevokeCert { .. } => Access::Admin { what: "revoke certificates" },
            C::CheckCert { .. } => Access::Admin { what: "check certificates" },
        }
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
        let beats = PeerRequest::Heartbeats { relay: 1, beats: vec![Beat { node: 2, instance: 3 }] };
        assert_eq!(Request::from(beats).access(), Access::Node);
        assert!(Request::from(PeerRequest::Kill { job: 1, run: 1, checkpoint: false }).node_only());
        // A node renews its own certificate: a user's may not ask.
        assert!(Request::from(PeerRequest::RenewCert { csr_pem: String::new() }).node_only());
        assert!(!Request::from(ClientRequest::ListJobs { include_finished: false }).node_only());
    }

    #[test]
    fn admin_and_owner_requests_say_what_they_do() {
        assert_eq!(ClientRequest::Cancel { job: 7 }.access(), Access::Owner { job: 7, verb: "cancel" });
        assert_eq!(ClientRequest::ListJoinTokens.access(), Access::Admin { what: "list join tokens" });
        let enroll = PeerRequest::Enroll { secret: String::new(), name: "n1".into(), csr_pem: String::new() };
        assert_eq!(Request::from(enroll).access(), Access::Anonymous);
    }
}
