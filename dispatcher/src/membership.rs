//! Changing the replica set (`sluice admin add-node` / `remove-node`) through openraft's joint
//! consensus.
//!
//! A new replica first joins as a learner that catches up, and only then becomes a voter, so
//! the configuration change never waits on a replica that still has the whole log to fetch.
//!
//! A replica is added by its peer address alone; its client address enters the membership
//! later, through [`set_client_addr`] on the leader (asked by the replica itself, see
//! `client_addr_announcer`). Rewriting a node's entry with `SetNodes` is safe here because only
//! the client address changes: the peer address and the voter set stay as they are. Since
//! those changes happen on their own, a change that meets another in progress waits for it
//! (briefly) instead of failing.

use crate::error::DispatcherError;
use crate::raft_error::raft_error;
use crate::raft_types::{NodeInfo, Raft, TypeConfig};
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::raft::ClientWriteResponse;
use openraft::ChangeMembers;
use sluice_types::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tracing::debug;

/// How long a change waits for another one in progress to finish (replicas record their client
/// addresses by membership changes too, so an admin's change can meet one of theirs).
const IN_PROGRESS_WAIT: Duration = Duration::from_secs(10);
/// Pause before retrying a change that met another one in progress.
const IN_PROGRESS_PAUSE: Duration = Duration::from_millis(20);

/// What a membership change fails with.
type WriteError = RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>;

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
    after_change_in_progress(|| raft.add_learner(node_id, node.clone(), true), raft).await?;
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
    let response =
        after_change_in_progress(|| raft.change_membership(change.clone(), false), raft).await?;
    Ok(response
        .membership
        .map(|m| m.voter_ids().collect())
        .unwrap_or_default())
}

/// Runs a membership change `attempt`; while it meets another change in progress, waits for
/// that one and tries again, up to `IN_PROGRESS_WAIT`.
async fn after_change_in_progress<F, Fut>(
    mut attempt: F,
    raft: &Raft,
) -> Result<ClientWriteResponse<TypeConfig>, DispatcherError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<ClientWriteResponse<TypeConfig>, WriteError>>,
{
    let deadline = Instant::now() + IN_PROGRESS_WAIT;
    loop {
        match attempt().await {
            Ok(response) => return Ok(response),
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::InProgress(in_progress),
            ))) if Instant::now() < deadline => {
                debug!(%in_progress, "membership change waits for the one in progress");
                wait_applied_membership(raft, deadline).await;
            }
            Err(e) => return Err(raft_error(e)),
        }
    }
}

/// Waits until this replica has applied its latest membership (the change in progress is
/// committed), then a moment more: a joint change proposes its second step only after its
/// first is committed, and retrying in between would find it in progress again.
async fn wait_applied_membership(raft: &Raft, deadline: Instant) {
    let _ = raft
        .wait(Some(deadline.saturating_duration_since(Instant::now())))
        .metrics(
            |m| m.membership_config.log_id() <= &m.last_applied,
            "the membership in progress is applied",
        )
        .await;
    tokio::time::sleep(IN_PROGRESS_PAUSE).await;
}
