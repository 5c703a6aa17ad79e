//! `Monitor`: polls every node's `GetStatus` a few times a second and records each change of
//! leader in the history (`process: monitor, f: leader`). The nemesis asks it who leads when a
//! fault aims at "the leader"; the report draws its events.
//!
//! A leader is a node whose own status says `Leader`, the highest term winning (a restarted node
//! may claim an old term for a moment). A paused or partitioned node may still believe it
//! leads; that is why the term decides, and why this view is only a hint, never checked.

use crate::cluster::{leader_of, Cluster};
use crate::history::{History, Kind};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const POLL: Duration = Duration::from_millis(250);

pub struct Monitor {
    leader: watch::Receiver<Option<(u64, u64)>>,
}

impl Monitor {
    pub fn start(cluster: Arc<Cluster>, history: History, cancel: CancellationToken) -> Monitor {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let mut last: Option<(u64, u64)> = None;
            loop {
                let ids: Vec<u64> = cluster.ids().collect();
                let views =
                    futures::future::join_all(ids.iter().map(|&id| cluster.status(id))).await;
                let leader = leader_of(views.into_iter().filter_map(Result::ok));
                if let Some((node, term)) = leader.filter(|_| leader != last) {
                    history.record(
                        "monitor",
                        Kind::Ok,
                        "leader",
                        json!({"node": node, "term": term}),
                    );
                    last = leader;
                }
                let _ = tx.send(leader);
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
            }
        });
        Monitor { leader: rx }
    }

    /// The leader seen by the last poll.
    pub fn leader(&self) -> Option<u64> {
        self.leader.borrow().map(|(node, _)| node)
    }

    /// Waits up to `timeout` for a leader.
    pub async fn wait_leader(&self, timeout: Duration) -> Option<u64> {
        let mut rx = self.leader.clone();
        let found = tokio::time::timeout(timeout, rx.wait_for(|l| l.is_some())).await;
        match found {
            Ok(Ok(l)) => l.map(|(node, _)| node),
            _ => None,
        }
    }
}
