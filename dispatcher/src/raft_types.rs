//! The openraft type configuration of the dispatcher and the glue between the journal's
//! generic state machine and `DispatcherState`.

use crate::state::{ApplyContext, DispatcherState, Outcomes, Proposal};
use serde::{Deserialize, Serialize};
use sluice_types::NodeId;
use std::fmt;
// `declare_raft_types!` names `Cursor` unqualified for the default snapshot data type.
use std::io::Cursor;

/// What the cluster knows about a replica: its two listeners.
///
/// `peer_addr` is where the other replicas send Raft traffic; it is known from the start (the
/// peer list, or `add-node`). `addr` is the client API, the address a follower names as the
/// leader hint; it is empty until the replica has put it in the membership itself (see
/// `client_addr_announcer`), and an empty one is never given as a hint.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// The client API (the `Dispatcher` service); empty while unknown.
    pub addr: String,
    /// The Raft peer listener (the `RaftPeer` service).
    pub peer_addr: String,
}

impl NodeInfo {
    /// The client address, if the replica has announced one.
    pub fn client_addr(&self) -> Option<&str> {
        (!self.addr.is_empty()).then_some(self.addr.as_str())
    }
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = self.client_addr().unwrap_or("unknown");
        write!(f, "{addr} (peer {})", self.peer_addr)
    }
}

openraft::declare_raft_types!(
    /// The dispatcher's Raft: a log of [`Proposal`]s answered by [`Outcomes`].
    pub TypeConfig:
        D = Proposal,
        R = Outcomes,
        NodeId = NodeId,
        Node = NodeInfo,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type StateHandle = sluice_journal::StateHandle<TypeConfig, DispatcherState>;

impl sluice_journal::ReplicatedState<TypeConfig> for DispatcherState {
    fn apply(&mut self, log_id: &openraft::LogId<NodeId>, proposal: &Proposal) -> Outcomes {
        let ctx = ApplyContext {
            log_index: log_id.index,
            time_micros: proposal.time_micros,
        };
        Outcomes(
            proposal
                .requests
                .iter()
                .map(|request| DispatcherState::apply(self, ctx, request))
                .collect(),
        )
    }
}
