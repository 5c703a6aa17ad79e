//! Changing the replica set (`sluice admin add-node` / `remove-node`) through openraft's joint
//! consensus.
//!
//! A new replica first joins as a learner that catches up, and only then becomes a voter, so
//! the configuration change never waits on a replica that still has the whole log to fetch.

use crate::error::DispatcherError;
use crate::ids::NodeId;
use crate::raft_error::raft_error;
use crate::raft_types::{NodeInfo, Raft};
use openraft::ChangeMembers;
use std::collections::BTreeSet;

/// Adds replica `node_id` at `addr` as a voter; returns the voters afterwards.
pub async fn add_voter(
    raft: &Raft,
    node_id: NodeId,
    addr: String,
) -> Result<Vec<NodeId>, DispatcherError> {
    if addr.is_empty() {
        return Err(DispatcherError::InvalidArgument(
            "`addr` is required".into(),
        ));
    }
    raft.add_learner(node_id, NodeInfo { addr }, true)
        .await
        .map_err(raft_error)?;
    change(raft, ChangeMembers::AddVoterIds(BTreeSet::from([node_id]))).await
}

/// Removes voter `node_id`; returns the voters afterwards.
pub async fn remove_voter(raft: &Raft, node_id: NodeId) -> Result<Vec<NodeId>, DispatcherError> {
    change(raft, ChangeMembers::RemoveVoters(BTreeSet::from([node_id]))).await
}

async fn change(
    raft: &Raft,
    change: ChangeMembers<NodeId, NodeInfo>,
) -> Result<Vec<NodeId>, DispatcherError> {
    let response = raft
        .change_membership(change, false)
        .await
        .map_err(raft_error)?;
    Ok(response
        .membership
        .map(|m| m.voter_ids().collect())
        .unwrap_or_default())
}
