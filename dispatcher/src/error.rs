//! `DispatcherError`, the dispatcher crate's one error type, and its one mapping to gRPC status.
//!
//! Every `tonic::Status` the crate sends is built here (the dispatcher service and the Raft
//! peer service alike): the match has no catch-all arm, so a new variant must choose its code.

use crate::state::Rejection;
use sluice_proto::LEADER_METADATA_KEY;

#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    /// This replica is not the leader; `leader` is the leader's address when known.
    #[error("this dispatcher is not the leader{}", leader.as_ref().map(|l| format!("; the leader is {l}")).unwrap_or_else(|| "; no leader is known yet".into()))]
    NotLeader { leader: Option<String> },
    /// The leader could not reach a quorum (or stepped down) while serving the request.
    #[error("dispatcher quorum unavailable: {0}")]
    QuorumUnavailable(String),
    /// The replicated state refused the request (same answer on every replica).
    #[error(transparent)]
    Rejected(#[from] Rejection),
    /// The request itself is malformed; names the field.
    #[error("{0}")]
    InvalidArgument(String),
    /// A files source names a file outside this dispatcher's data roots (or it has none), or
    /// one that is not a regular file; names the path and the roots.
    #[error("{0}")]
    FileRefused(String),
    /// The journal failed (disk); the node cannot serve.
    #[error("journal: {0}")]
    Journal(#[from] sluice_journal::JournalError),
    /// Raft stopped on a fatal error or shutdown.
    #[error("raft stopped: {0}")]
    RaftStopped(String),
    /// Starting the node failed (bind, config).
    #[error("{0}")]
    Startup(String),
    /// `apply` answered an update with an outcome of another kind: a bug, not a condition a
    /// caller can handle.
    #[error("update {update} got the outcome of another kind: {outcome}")]
    UnexpectedOutcome {
        update: &'static str,
        outcome: String,
    },
}

impl DispatcherError {
    /// Whether the caller should retry (possibly on another replica).
    pub fn is_retryable(&self) -> bool {
        match self {
            DispatcherError::NotLeader { .. } => true,
            DispatcherError::QuorumUnavailable(_) => true,
            DispatcherError::RaftStopped(_) => true,
            DispatcherError::Rejected(_) => false,
            DispatcherError::InvalidArgument(_) => false,
            DispatcherError::FileRefused(_) => false,
            DispatcherError::Journal(_) => false,
            DispatcherError::Startup(_) => false,
            DispatcherError::UnexpectedOutcome { .. } => false,
        }
    }
}

impl From<DispatcherError> for tonic::Status {
    fn from(err: DispatcherError) -> tonic::Status {
        let message = err.to_string();
        match err {
            DispatcherError::NotLeader { leader } => {
                let mut status = tonic::Status::unavailable(message);
                if let Some(value) = leader.and_then(|l| l.parse().ok()) {
                    status.metadata_mut().insert(LEADER_METADATA_KEY, value);
                }
                status
            }
            DispatcherError::QuorumUnavailable(_) => tonic::Status::unavailable(message),
            DispatcherError::RaftStopped(_) => tonic::Status::unavailable(message),
            DispatcherError::Rejected(Rejection::NotFound(_)) => tonic::Status::not_found(message),
            DispatcherError::Rejected(Rejection::InvalidArgument(_)) => {
                tonic::Status::invalid_argument(message)
            }
            DispatcherError::Rejected(Rejection::FailedPrecondition(_)) => {
                tonic::Status::failed_precondition(message)
            }
            DispatcherError::Rejected(Rejection::PermissionDenied(_)) => {
                tonic::Status::permission_denied(message)
            }
            DispatcherError::Rejected(Rejection::ResourceExhausted(_)) => {
                sluice_rpc::refuse_retry(tonic::Status::resource_exhausted(message))
            }
            DispatcherError::Rejected(Rejection::Busy(_)) => {
                tonic::Status::resource_exhausted(message)
            }
            DispatcherError::InvalidArgument(_) => tonic::Status::invalid_argument(message),
            DispatcherError::FileRefused(_) => tonic::Status::permission_denied(message),
            DispatcherError::Journal(_) => tonic::Status::internal(message),
            DispatcherError::Startup(_) => tonic::Status::internal(message),
            DispatcherError::UnexpectedOutcome { .. } => tonic::Status::internal(message),
        }
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
