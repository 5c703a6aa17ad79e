//! `ClientAddrAnnouncer`: keeps this replica's client address in the membership.
//!
//! A replica enters the membership by its peer address alone (the peer list, or `add-node`):
//! nobody else knows where its client API listens. So each replica puts it there itself. The
//! leader records its own with a membership change; a follower or learner asks the leader to
//! record its own with the peer RPC `Announce`. Until then its entry's client address is empty,
//! and a follower gives no leader hint for it (clients try their other addresses).
//!
//! [`next_step`] is the pure decision; [`ClientAddrAnnouncer::run`] re-decides whenever the Raft
//! metrics change (a new leader, a new membership), and after a failed attempt waits
//! [`RETRY_AFTER`] before trying again, so an unreachable leader is not flooded.

use crate::membership;
use crate::raft_network::PeerNetwork;
use crate::raft_types::{NodeInfo, Raft};
use openraft::Membership;
use sluice_types::NodeId;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

/// Pause after a failed attempt (no quorum, a membership change in progress, leader down).
pub const RETRY_AFTER: Duration = Duration::from_millis(250);

/// What a replica does about its own entry in the membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The entry is right, or nobody can record it now (no leader, not a member yet).
    Nothing,
    /// This replica leads: it records its client address itself.
    Record,
    /// Ask `leader`, at `node`, to record it.
    Announce { leader: NodeId, node: NodeInfo },
}

/// The step for replica `id` serving clients at `addr`, given who it thinks leads and whether
/// it is that leader (`leads`), under `membership`.
pub fn next_step(
    id: NodeId,
    addr: &str,
    leader: Option<NodeId>,
    leads: bool,
    membership: &Membership<NodeId, NodeInfo>,
) -> Step {
    match membership.get_node(&id) {
        Some(own) if own.addr != addr => {}
        _ => return Step::Nothing,
    }
    match leader {
        Some(leader) if leader == id => match leads {
            true => Step::Record,
            false => Step::Nothing,
        },
        Some(leader) => match membership.get_node(&leader) {
            Some(node) => Step::Announce {
                leader,
                node: node.clone(),
            },
            None => Step::Nothing,
        },
        None => Step::Nothing,
    }
}

/// The replica's announcer task.
pub struct ClientAddrAnnouncer {
    pub id: NodeId,
    /// The client address to record (advertised, or the bound client address).
    pub addr: String,
    pub raft: Raft,
    pub network: PeerNetwork,
}

impl ClientAddrAnnouncer {
    pub async fn run(self, stop: CancellationToken) {
        let mut metrics = self.raft.metrics();
        loop {
            let step = {
                let m = metrics.borrow_and_update();
                let leads = m.state.is_leader() && m.current_leader == Some(self.id);
                let membership = m.membership_config.membership();
                next_step(self.id, &self.addr, m.current_leader, leads, membership)
            };
            let attempt = match &step {
                Step::Nothing => Ok(()),
                Step::Record => membership::set_client_addr(&self.raft, self.id, self.addr.clone())
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Step::Announce { leader, node } => {
                    self.network
                        .announce(*leader, node, self.addr.clone())
                        .await
                }
            };
            match attempt {
                Ok(()) if step != Step::Nothing => {
                    info!(node = self.id, addr = %self.addr, ?step, "client address recorded");
                }
                Ok(()) => {}
                Err(error) => {
                    debug!(node = self.id, %error, ?step, "client address not recorded yet");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(RETRY_AFTER) => {}
                    }
                    continue;
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = metrics.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn node(addr: &str, peer_addr: &str) -> NodeInfo {
        NodeInfo {
            addr: addr.into(),
            peer_addr: peer_addr.into(),
        }
    }

    /// Voters 1 and 2; 1 has recorded its client address, 2 has not; 3 is not a member.
    fn membership() -> Membership<NodeId, NodeInfo> {
        Membership::new(
            vec![BTreeSet::from([1, 2])],
            BTreeMap::from([(1, node("c:1", "p:1")), (2, node("", "p:2"))]),
        )
    }

    #[test]
    fn each_replica_records_or_announces_its_own_client_address() {
        let announce_to_1 = Step::Announce {
            leader: 1,
            node: node("c:1", "p:1"),
        };
        let announce_to_2 = Step::Announce {
            leader: 2,
            node: node("", "p:2"),
        };
        // (id, addr, leader, leads, step)
        let cases: &[(NodeId, &str, Option<NodeId>, bool, Step)] = &[
            (1, "c:1", Some(1), true, Step::Nothing),
            (1, "c:9", Some(1), true, Step::Record),
            (1, "c:9", Some(1), false, Step::Nothing),
            (2, "c:2", Some(1), false, announce_to_1),
            (2, "c:2", None, false, Step::Nothing),
            (2, "c:2", Some(2), true, Step::Record),
            (1, "c:9", Some(2), false, announce_to_2),
            (1, "c:9", Some(7), false, Step::Nothing),
            (3, "c:3", Some(1), false, Step::Nothing),
        ];
        for (id, addr, leader, leads, want) in cases {
            let got = next_step(*id, addr, *leader, *leads, &membership());
            assert_eq!(
                &got, want,
                "node {id} at {addr}, leader {leader:?}, leads {leads}"
            );
        }
    }
}
