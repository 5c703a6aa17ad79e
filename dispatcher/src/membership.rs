//! Changing the replica set (`sluice admin add-node` / `remove-node`) through openraft's joint
//! consensus.
//!
//! A new replica first joins as a learner that catches up, and only then becomes a voter, so
//! the configuration change never waits on a replica that still has the whole log to fetch.
//!
//! A replica is added by its peer address alone; its client address enters the membership
//! later, through [`set_client_addr`] on the leader (asked by the replica itself, see
//! `client_addr_announcer`). Rewriting a node's entry with `SetNodes` is safe here because only
//! the client address changes: the peer address and the voter set stay as they are.

use crate::error::DispatcherError;
use crate::ids::NodeId;
use crate::raft_error::raft_error;
use crate::raft_types::{NodeInfo, Raft};
use openraft::ChangeMembers;
use std::collections::{BTreeMap, BTreeSet};

/// Adds replica `node_id`, whose peer listener is at `peer_addr`, as a voter; returns the voters
/// afterwards.
pub async fn add_voter(
    raft: &Raft,
    node_id: NodeId,
    peer_addr: String,
) -> Result<Vec<NodeId>, DispatcherError> {
    if peer_addr.is_empty() {
        return Err(DispatcherError::InvalidArgument(
            "`peer_addr` is required".into(),
        ));
    }
    let node = NodeInfo {
        addr: String::new(),
        peer_addr,
    };
    raft.add_learner(node_id, node, true)
        .await
        .map_err(raft_error)?;
    change(raft, ChangeMembers::AddVoterIds(BTreeSet::from([node_id]))).await
}

/// Removes voter `node_id`; returns the voters afterwards.
pub async fn remove_voter(raft: &Raft, node_id: NodeId) -> Result<Vec<NodeId>, DispatcherError> {
    change(raft, ChangeMembers::RemoveVoters(BTreeSet::from([node_id]))).await
}

/// Records `addr` as member `node_id`'s client address (the leader does this). Returns whether
/// the membership changed; an address already recorded changes nothing.
pub async fn set_client_addr(
    raft: &Raft,
    node_id: NodeId,
    addr: String,
) -> Result<bool, DispatcherError> {
    if addr.is_empty() {
        return Err(DispatcherError::InvalidArgument(
            "`addr` is required".into(),
        ));
    }
    let known = {
        let metrics = raft.metrics();
        let metrics = metrics.borrow();
        metrics
            .membership_config
            .membership()
            .get_node(&node_id)
            .cloned()
    };
    let Some(node) = known else {
        return Err(DispatcherError::InvalidArgument(format!(
            "node {node_id} is not a member"
        )));
    };
    if node.addr == addr {
        return Ok(false);
    }
    let updated = NodeInfo { addr, ..node };
    change(
        raft,
        ChangeMembers::SetNodes(BTreeMap::from([(node_id, updated)])),
    )
    .await?;
    Ok(true)
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
