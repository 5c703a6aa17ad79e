//! The openraft type configuration of the dispatcher and the glue between the journal's
//! generic state machine and `DispatcherState`.

use crate::ids::NodeId;
use crate::state::{ApplyContext, DispatcherState, Outcomes, Proposal};
use serde::{Deserialize, Serialize};
use std::fmt;
// `declare_raft_types!` names `Cursor` unqualified for the default snapshot data type.
use std::io::Cursor;

/// What the cluster knows about a replica: the one address serving both its dispatcher service
/// (for workers and clients) and its Raft peer service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub addr: String,
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.addr)
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
