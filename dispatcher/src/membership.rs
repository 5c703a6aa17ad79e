//! Changing the replica set (`sluice admin add-node` / `remove-node`) through openraft's joint
//! consensus, without losing the quorum.
//!
//! A new replica first joins as a learner, and becomes a voter only once it has caught up: its
//! matched log index reaches the learner's own membership entry and is within
//! [`CATCH_UP_LAG`] entries of the leader's last. A replica that does not catch up within the
//! caller's deadline (nothing listens at its peer address, it was not started with `--join`)
//! never becomes a voter: it is removed as a learner again and the voters stay as they were. An
//! unreachable voter would otherwise count in every quorum from the moment it is added (four
//! voters need three answers), so one more stopped replica would stop all writes.
//!
//! Node ids and peer addresses are checked before anything is proposed: an id that is already
//! a member, or an address that is not `host:port`, is refused and changes nothing. Removing a
//! voter is refused (unless forced) when the voters that answer this leader would be no
//! majority of the voters before or after the change: joint consensus needs both, and a cluster
//! left without a live majority accepts no write.
//!
//! A replica is added by its peer address alone; its client address enters the membership
//! later, through [`set_client_addr`] on the leader (asked by the replica itself, see
//! `client_addr_announcer`). Rewriting a node's entry with `SetNodes` is safe here because only
//! the client address changes: the peer address and the voter set stay as they are. Since
//! those changes happen on their own, a change that meets another in progress waits for it
//! (briefly) instead of failing.

use crate::error::DispatcherError;
use crate::raft_error::raft_error;
use crate::raft_network::PeerNetwork;
use crate::raft_types::{NodeInfo, Raft, TypeConfig};
use crate::state::Rejection;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::raft::ClientWriteResponse;
use openraft::{ChangeMembers, ServerState};
use sluice_types::NodeId;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How long a change waits for another one in progress to finish (replicas record their client
/// addresses by membership changes too, so an admin's change can meet one of theirs).
const IN_PROGRESS_WAIT: Duration = Duration::from_secs(10);
/// Pause before retrying a change that met another one in progress.
const IN_PROGRESS_PAUSE: Duration = Duration::from_millis(20);

/// How far (in log entries) a learner may trail the leader's last entry and count as caught
/// up: a busy leader appends while the learner catches up, so "equal" might never hold.
pub const CATCH_UP_LAG: u64 = 64;

/// How long `add-node` waits for a new replica to catch up when the caller names no deadline.
pub const DEFAULT_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a voter may take to answer `remove-node`'s probe and count as live: generous, since a
/// live voter taken for a dead one makes the removal refused; a stopped one refuses at once.
const LIVE_PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest catch-up deadline a caller may ask for.
pub const MAX_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(3600);

/// What a membership change fails with.
type WriteError = RaftError<NodeId, ClientWriteError<NodeId, NodeInfo>>;

/// Adds replica `node_id`, whose peer listener is at `peer_addr`, as a learner; once it has
/// caught up (within `catch_up`), makes it a voter. Returns the voters afterwards.
pub async fn add_voter(
    raft: &Raft,
    node_id: NodeId,
    peer_addr: String,
    catch_up: Duration,
) -> Result<Vec<NodeId>, DispatcherError> {
    check_node_id(node_id)?;
    check_peer_addr(&peer_addr)?;
    if catch_up.is_zero() || catch_up > MAX_CATCH_UP_TIMEOUT {
        return Err(DispatcherError::InvalidArgument(format!(
            "catch-up timeout {catch_up:?} must be positive and at most {MAX_CATCH_UP_TIMEOUT:?}"
        )));
    }
    // The leader's membership is the current one; a follower sends the caller to it.
    raft.ensure_linearizable().await.map_err(raft_error)?;
    let members = current_members(raft);
    if let Some(refusal) = members.refuse_addition(node_id, &peer_addr) {
        return Err(DispatcherError::InvalidArgument(refusal));
    }
    let node = NodeInfo {
        addr: String::new(),
        peer_addr: peer_addr.clone(),
    };
    let added =
        after_change_in_progress(|| raft.add_learner(node_id, node.clone(), false), raft).await?;
    info!(node = node_id, %peer_addr, "learner added; waiting for it to catch up");
    match wait_caught_up(raft, node_id, added.log_id.index, catch_up).await {
        CatchUp::CaughtUp => {
            change(raft, ChangeMembers::AddVoterIds(BTreeSet::from([node_id]))).await
        }
        CatchUp::NotLeader => Err(DispatcherError::QuorumUnavailable(format!(
            "this replica stopped leading while node {node_id} ({peer_addr}) caught up; it \
             stays a learner: remove it with `sluice admin remove-node --id {node_id}` and add \
             it again"
        ))),
        CatchUp::Behind { matched, last } => {
            let progress = match matched {
                None => "it acknowledged no log entry".to_string(),
                Some(matched) => format!(
                    "it acknowledged entries up to index {matched}, the leader's last is {}",
                    last.unwrap_or_default()
                ),
            };
            let removed = change(raft, ChangeMembers::RemoveNodes(BTreeSet::from([node_id]))).await;
            let outcome = match removed {
                Ok(_) => "it was removed as a learner".to_string(),
                Err(e) => {
                    warn!(node = node_id, error = %e, "removing a learner that did not catch up");
                    format!(
                        "it stays a learner ({e}): remove it with \
                         `sluice admin remove-node --id {node_id}`"
                    )
                }
            };
            Err(Rejection::FailedPrecondition(format!(
                "node {node_id} at peer address {peer_addr} did not catch up within \
                 {catch_up:?} ({progress}); the voters are unchanged ({:?}) and {outcome}; \
                 check that a replica started with --join listens there and that this leader \
                 can reach it",
                members.voters
            ))
            .into())
        }
    }
}

/// Removes member `node_id` (a voter, or a learner left by an `add-node` that did not finish);
/// returns the voters afterwards. A removal that would leave the live voters no majority is
/// refused unless `force`.
pub async fn remove_member(
    raft: &Raft,
    peers: &PeerNetwork,
    node_id: NodeId,
    force: bool,
) -> Result<Vec<NodeId>, DispatcherError> {
    raft.ensure_linearizable().await.map_err(raft_error)?;
    let members = current_members(raft);
    if members.learners.contains(&node_id) {
        return change(raft, ChangeMembers::RemoveNodes(BTreeSet::from([node_id]))).await;
    }
    if !members.voters.contains(&node_id) {
        return Err(Rejection::NotFound(format!(
            "node {node_id} is not a member (voters {:?}, learners {:?})",
            members.voters, members.learners
        ))
        .into());
    }
    let live = live_voters(raft, peers, &members).await;
    if let Some(refusal) = removal_refusal(node_id, &members.voters, &live) {
        if !force || members.voters.len() == 1 {
            return Err(Rejection::FailedPrecondition(refusal).into());
        }
        warn!(node = node_id, %refusal, "removing a voter by force");
    }
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

/// The members as the leader knows them: voters (of every config, in a joint one) and
/// learners, with their peer addresses.
struct Members {
    voters: BTreeSet<NodeId>,
    learners: BTreeSet<NodeId>,
    peer_addrs: BTreeMap<NodeId, String>,
}

impl Members {
    /// Why `node_id` at `peer_addr` cannot be added, if it cannot.
    fn refuse_addition(&self, node_id: NodeId, peer_addr: &str) -> Option<String> {
        if self.voters.contains(&node_id) {
            return Some(format!(
                "node {node_id} is already a voter (voters {:?}); to replace a replica, remove \
                 it first",
                self.voters
            ));
        }
        if self.learners.contains(&node_id) {
            return Some(format!(
                "node {node_id} is already a learner (an add-node that did not finish); remove \
                 it with `sluice admin remove-node --id {node_id}` first"
            ));
        }
        self.peer_addrs
            .iter()
            .find(|(_, addr)| addr.as_str() == peer_addr)
            .map(|(other, _)| {
                format!("peer address {peer_addr} is already node {other}'s; each replica needs its own")
            })
    }
}

fn current_members(raft: &Raft) -> Members {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    let membership = metrics.membership_config.membership();
    Members {
        voters: membership.voter_ids().collect(),
        learners: membership.learner_ids().collect(),
        peer_addrs: membership
            .nodes()
            .map(|(id, node)| (*id, node.peer_addr.clone()))
            .collect(),
    }
}

fn raft_id(raft: &Raft) -> NodeId {
    raft.metrics().borrow().id
}

/// The voters that answer a probe from this leader now (this leader among them). Asked, not
/// remembered: a replica stopped a moment ago must not count as live.
async fn live_voters(raft: &Raft, peers: &PeerNetwork, members: &Members) -> BTreeSet<NodeId> {
    let me = raft_id(raft);
    let probes = members
        .voters
        .iter()
        .filter(|v| **v != me)
        .map(|voter| async move {
            let addr = members.peer_addrs.get(voter).map_or("", String::as_str);
            let answer = peers.probe(*voter, addr, LIVE_PROBE_TIMEOUT).await;
            if let Err(e) = &answer {
                debug!(node = voter, error = %e, "voter did not answer the live probe");
            }
            answer.is_ok().then_some(*voter)
        });
    let mut live: BTreeSet<NodeId> = futures::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .collect();
    live.insert(me);
    live
}

/// Node ids start at 1 (`--id`, and `--id from-hostname` adds one to the pod's ordinal).
fn check_node_id(node_id: NodeId) -> Result<(), DispatcherError> {
    match node_id {
        0 => Err(DispatcherError::InvalidArgument(
            "node id 0 is not valid: replica ids start at 1".into(),
        )),
        _ => Ok(()),
    }
}

/// A peer address is `host:port`: a DNS name or IPv4 address, or a bracketed IPv6 address, and
/// a port from 1 to 65535; nothing else (no scheme, path, spaces or control characters).
pub fn check_peer_addr(peer_addr: &str) -> Result<(), DispatcherError> {
    let refuse = |why: &str| {
        Err(DispatcherError::InvalidArgument(format!(
            "peer address {peer_addr:?} {why}; expected host:port, e.g. 10.0.0.4:5060 or \
             dispatcher-3.example:5060"
        )))
    };
    if peer_addr.is_empty() {
        return refuse("is empty");
    }
    if peer_addr.len() > 260 {
        return refuse("is longer than 260 bytes");
    }
    if let Some(c) = peer_addr.chars().find(|c| c.is_control()) {
        return refuse(&format!("holds the control character {:?}", c));
    }
    if peer_addr.chars().any(char::is_whitespace) {
        return refuse("holds a space");
    }
    let Some((host, port)) = peer_addr.rsplit_once(':') else {
        return refuse("has no port");
    };
    match port.parse::<u16>() {
        Ok(0) => return refuse("has port 0"),
        Ok(_) => {}
        Err(_) => return refuse(&format!("has port {port:?}, not a number from 1 to 65535")),
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return match v6.parse::<std::net::Ipv6Addr>() {
            Ok(_) => Ok(()),
            Err(_) => refuse(&format!("has host [{v6}], not an IPv6 address")),
        };
    }
    let is_name = !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    match is_name {
        true => Ok(()),
        false => refuse(&format!("has host {host:?}, not a host name or IP address")),
    }
}

/// Why removing voter `node` from `voters` could leave the cluster without a quorum, given the
/// voters `live` that answer this leader (the leader among them); `None` if it cannot.
/// Joint consensus commits with a majority of the old voters and of the new ones, and the new
/// voters then carry every write alone.
fn removal_refusal(
    node: NodeId,
    voters: &BTreeSet<NodeId>,
    live: &BTreeSet<NodeId>,
) -> Option<String> {
    let after: BTreeSet<NodeId> = voters.iter().copied().filter(|v| *v != node).collect();
    if after.is_empty() {
        return Some(format!(
            "node {node} is the last voter; removing it would leave no quorum"
        ));
    }
    let majority = |set: &BTreeSet<NodeId>| set.intersection(live).count() * 2 > set.len();
    let live_after: BTreeSet<NodeId> = after.intersection(live).copied().collect();
    if !majority(&after) {
        return Some(format!(
            "removing node {node} would leave voters {after:?}, of which only {live_after:?} \
             answer the leader: no majority, so the cluster could accept no write; start the \
             stopped voters first, or pass --force"
        ));
    }
    if !majority(voters) {
        let live_now: BTreeSet<NodeId> = voters.intersection(live).copied().collect();
        return Some(format!(
            "of voters {voters:?} only {live_now:?} answer the leader: no majority, so the \
             change itself could not commit; start the stopped voters first, or pass --force"
        ));
    }
    None
}

/// How a new learner's catch-up ended.
#[derive(Debug, PartialEq, Eq)]
enum CatchUp {
    CaughtUp,
    /// This replica stopped leading (or shut down) meanwhile.
    NotLeader,
    /// The deadline passed: the learner's matched index and the leader's last, when known.
    Behind {
        matched: Option<u64>,
        last: Option<u64>,
    },
}

/// Whether a learner that has acknowledged entries up to `matched` has caught up with a leader
/// whose last entry is `last`: it holds its own membership entry (`added`) and trails by at
/// most [`CATCH_UP_LAG`] entries.
fn caught_up(matched: Option<u64>, last: Option<u64>, added: u64) -> bool {
    match matched {
        None => false,
        Some(matched) => {
            matched >= added && last.unwrap_or(0).saturating_sub(matched) <= CATCH_UP_LAG
        }
    }
}

/// Waits until learner `node_id` has caught up, this replica stops leading, or `timeout`.
async fn wait_caught_up(raft: &Raft, node_id: NodeId, added: u64, timeout: Duration) -> CatchUp {
    let matched = |m: &openraft::RaftMetrics<NodeId, NodeInfo>| {
        m.replication
            .as_ref()
            .and_then(|r| r.get(&node_id).copied().flatten())
            .map(|log_id| log_id.index)
    };
    let waited = raft
        .wait(Some(timeout))
        .metrics(
            |m| m.state != ServerState::Leader || caught_up(matched(m), m.last_log_index, added),
            "the new learner caught up",
        )
        .await;
    match waited {
        Ok(m) if m.state == ServerState::Leader => CatchUp::CaughtUp,
        Ok(_) => CatchUp::NotLeader,
        Err(openraft::metrics::WaitError::Timeout(..)) => {
            let m = raft.metrics().borrow().clone();
            CatchUp::Behind {
                matched: matched(&m),
                last: m.last_log_index,
            }
        }
        Err(openraft::metrics::WaitError::ShuttingDown) => CatchUp::NotLeader,
    }
}

#[cfg(test)]
#[path = "membership_tests.rs"]
mod tests;
