//! The one map from openraft's errors to [`DispatcherError`].
//!
//! openraft reports the same few facts through several error types (a write, a linearizable
//! check and a membership change each have their own). They are first reduced to a
//! [`RaftFailure`], which says only what a caller can act on, and [`raft_error`] turns that
//! into the dispatcher's error, so "forward to the leader" becomes `NotLeader` with the
//! leader's address in exactly one place.

use crate::error::DispatcherError;
use crate::raft_types::NodeInfo;
use crate::state::Rejection;
use openraft::error::{CheckIsLeaderError, ClientWriteError, Fatal, RaftError};
use sluice_types::NodeId;
use std::convert::Infallible;

/// What went wrong inside Raft, as far as a caller of the dispatcher cares. Clone-able, so one
/// failed log entry can fail every request batched into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RaftFailure {
    /// This replica is not the leader; the leader, when known.
    ForwardToLeader(Option<NodeInfo>),
    /// The leader could not confirm a quorum.
    QuorumNotEnough(String),
    /// A membership change was refused (another change is in progress, a node is unknown...).
    MembershipRefused(String),
    /// Raft stopped (fatal error or shutdown), or dropped the request.
    Stopped(String),
}

/// Maps every openraft failure to the dispatcher's error; the only place that does.
pub fn raft_error(failure: impl Into<RaftFailure>) -> DispatcherError {
    match failure.into() {
        RaftFailure::ForwardToLeader(leader) => DispatcherError::NotLeader {
            // A leader whose client address is not known yet gives no hint: clients then
            // try their other addresses.
            leader: leader.and_then(|n| n.client_addr().map(str::to_string)),
        },
        RaftFailure::QuorumNotEnough(why) => DispatcherError::QuorumUnavailable(why),
        RaftFailure::MembershipRefused(why) => {
            Rejection::FailedPrecondition(format!("membership change refused: {why}")).into()
        }
        RaftFailure::Stopped(why) => DispatcherError::RaftStopped(why),
    }
}

impl From<ClientWriteError<NodeId, NodeInfo>> for RaftFailure {
    fn from(e: ClientWriteError<NodeId, NodeInfo>) -> Self {
        match e {
            ClientWriteError::ForwardToLeader(f) => RaftFailure::ForwardToLeader(f.leader_node),
            ClientWriteError::ChangeMembershipError(e) => {
                RaftFailure::MembershipRefused(e.to_string())
            }
        }
    }
}

impl From<CheckIsLeaderError<NodeId, NodeInfo>> for RaftFailure {
    fn from(e: CheckIsLeaderError<NodeId, NodeInfo>) -> Self {
        match e {
            CheckIsLeaderError::ForwardToLeader(f) => RaftFailure::ForwardToLeader(f.leader_node),
            CheckIsLeaderError::QuorumNotEnough(q) => RaftFailure::QuorumNotEnough(q.to_string()),
        }
    }
}

impl From<Fatal<NodeId>> for RaftFailure {
    fn from(e: Fatal<NodeId>) -> Self {
        RaftFailure::Stopped(e.to_string())
    }
}

impl From<Infallible> for RaftFailure {
    fn from(e: Infallible) -> Self {
        match e {}
    }
}

impl<E: Into<RaftFailure>> From<RaftError<NodeId, E>> for RaftFailure {
    fn from(e: RaftError<NodeId, E>) -> Self {
        match e {
            RaftError::APIError(e) => e.into(),
            RaftError::Fatal(f) => f.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::error::{ForwardToLeader, QuorumNotEnough};
    use std::collections::BTreeSet;

    fn leader() -> ForwardToLeader<NodeId, NodeInfo> {
        ForwardToLeader::new(
            2,
            NodeInfo {
                addr: "127.0.0.1:7002".into(),
                peer_addr: "127.0.0.1:8002".into(),
            },
        )
    }

    #[test]
    fn forward_to_leader_names_the_leader_from_every_error_type() {
        let expected = "127.0.0.1:7002".to_string();
        let write = raft_error(RaftError::<NodeId, _>::APIError(
            ClientWriteError::ForwardToLeader(leader()),
        ));
        let check = raft_error(RaftError::<NodeId, _>::APIError(
            CheckIsLeaderError::ForwardToLeader(leader()),
        ));
        for err in [write, check] {
            match err {
                DispatcherError::NotLeader { leader } => assert_eq!(leader, Some(expected.clone())),
                other => panic!("expected NotLeader, got {other:?}"),
            }
        }
        let unknown = raft_error(ClientWriteError::<NodeId, NodeInfo>::ForwardToLeader(
            ForwardToLeader::empty(),
        ));
        assert!(matches!(
            unknown,
            DispatcherError::NotLeader { leader: None }
        ));
        // A leader known only by its peer address: its peer port is no hint for a client.
        let unannounced = raft_error(ClientWriteError::<NodeId, NodeInfo>::ForwardToLeader(
            ForwardToLeader::new(
                2,
                NodeInfo {
                    addr: String::new(),
                    peer_addr: "127.0.0.1:8002".into(),
                },
            ),
        ));
        assert!(matches!(
            unannounced,
            DispatcherError::NotLeader { leader: None }
        ));
    }

    #[test]
    fn quorum_membership_and_fatal_errors_keep_their_meaning() {
        let quorum = raft_error(CheckIsLeaderError::<NodeId, NodeInfo>::QuorumNotEnough(
            QuorumNotEnough {
                cluster: "{1,2,3}".into(),
                got: BTreeSet::from([1]),
            },
        ));
        assert!(matches!(quorum, DispatcherError::QuorumUnavailable(_)));
        let fatal = raft_error(RaftError::<NodeId, Infallible>::Fatal(Fatal::Stopped));
        assert!(matches!(fatal, DispatcherError::RaftStopped(_)));
        let refused = raft_error(RaftFailure::MembershipRefused("in progress".into()));
        assert!(
            matches!(refused, DispatcherError::Rejected(Rejection::FailedPrecondition(ref m)) if m == "membership change refused: in progress")
        );
    }
}
