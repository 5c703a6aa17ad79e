//! `LeaderWatch`: who this replica believes leads (the leader's client address, none during an
//! election) and its current term, changing only when one of them does.
//!
//! It feeds the `WatchLeader` streams: a caller keeps one open to a replica other than the
//! leader, so that when the leader falls silent (frozen, or cut off) the caller hears of its
//! successor the moment this replica does, without asking. Raft's metrics change on every
//! append and every quorum acknowledgement; thousands of open streams watching them directly
//! would all wake thousands of times a second for nothing. They watch this instead, which one
//! task derives from the metrics.

use crate::cluster_status;
use crate::raft_types::Raft;
use sluice_proto::dispatcher as pb;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
pub struct LeaderWatch {
    view: watch::Receiver<pb::LeaderUpdate>,
}

impl LeaderWatch {
    /// Starts deriving the view from `raft`'s metrics until `shutdown`; then every stream of
    /// the view ends.
    pub fn spawn(raft: &Raft, shutdown: CancellationToken) -> LeaderWatch {
        let mut metrics = raft.metrics();
        let (sender, view) = watch::channel(current(&metrics.borrow_and_update()));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    changed = metrics.changed() => {
                        if changed.is_err() {
                            return;
                        }
                    }
                }
                let now = current(&metrics.borrow_and_update());
                sender.send_if_modified(|view| {
                    let changed = *view != now;
                    *view = now;
                    changed
                });
            }
        });
        LeaderWatch { view }
    }

    /// The view now and at every change, until the replica shuts down.
    pub fn subscribe(&self) -> watch::Receiver<pb::LeaderUpdate> {
        let mut view = self.view.clone();
        view.mark_changed();
        view
    }
}

fn current(
    metrics: &openraft::RaftMetrics<sluice_types::NodeId, crate::raft_types::NodeInfo>,
) -> pb::LeaderUpdate {
    let (leader, term) = cluster_status::leader_of(metrics);
    pb::LeaderUpdate { leader, term }
}
